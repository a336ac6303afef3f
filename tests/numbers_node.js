#!/usr/bin/env node
// numbers_node.js - number literals through `idem canon --lines`, against
// JavaScript's own JSON.parse + JSON.stringify (what RFC 8785 prescribes).
//
//   node tests/numbers_node.js IDEM_BINARY [COUNT] [SEED]
//
// Makes COUNT literals from a seeded generator, in every layout the JSON
// grammar allows: integers of 1-23 digits (past 2^53 too), fractions with
// runs of leading zeros (which the reader skips eight at a time) and up to
// 30 fraction digits (more than the 19 it keeps), exponents up to 330 in
// either direction, both signs.  A third of the literals have at most 15
// significant digits (most of them read by Clinger's fast path), written
// with trailing and leading zeros at times, and placed anywhere from 1e-340
// to 1e340, so that subnormals, underflow and overflow are crossed by
// short literals too.  Each line's answer must be the one
// JSON.stringify gives, or an empty line (a rejection) exactly where RFC
// 8785 / SPEC §4 refuse the literal: infinite, a non-zero that underflows
// to 0, or an integer literal beyond 2^53.
'use strict';

const { spawnSync } = require('child_process');

const idem = process.argv[2];
const count = Number(process.argv[3] || 300000);
let seed = Number(process.argv[4] || 7) >>> 0;

function rand() { // xorshift32: the same literals on every run
  seed ^= seed << 13; seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5; seed >>>= 0;
  return seed / 4294967296;
}
const digits = (n) => { let s = ''; for (let i = 0; i < n; i++) s += Math.floor(rand() * 10); return s; };
const pick = (a) => a[Math.floor(rand() * a.length)];

const lines = [];
// At most 15 significant digits, the point anywhere, the value near 10^n.
function shortDecimal() {
  const k = 1 + Math.floor(rand() * 15);
  const sig = String(1 + Math.floor(rand() * 9)) + digits(k - 1) + '0'.repeat(pick([0, 0, 1, 4]));
  const cut = Math.floor(rand() * (sig.length + 1));
  let s = rand() < 0.4 ? '-' : '';
  s += cut === 0 ? '0.' + '0'.repeat(pick([0, 2])) + sig : sig.slice(0, cut) + (cut < sig.length ? '.' + sig.slice(cut) : '');
  const n = Math.floor(rand() * 681) - 340; // the value is about 10^n
  const e = n - (cut === 0 ? 0 : cut);
  return s + pick(['e', 'E']) + (e < 0 ? '-' : pick(['', '+'])) + Math.abs(e);
}

for (let i = 0; i < count; i++) {
  if (rand() < 0.33) {
    lines.push(shortDecimal());
    continue;
  }
  let s = rand() < 0.3 ? '-' : '';
  s += rand() < 0.2 ? '0' : String(1 + Math.floor(rand() * 9)) + digits(Math.floor(rand() * 23));
  if (rand() < 0.7) s += '.' + '0'.repeat(pick([0, 0, 0, 1, 3, 8, 12, 20])) + digits(1 + Math.floor(rand() * 30));
  if (rand() < 0.4) s += pick(['e', 'E']) + pick(['', '+', '-']) + Math.floor(rand() * 331);
  lines.push(s);
}

function expected(text) {
  const v = JSON.parse(text);
  const mantissa = text.split(/[eE]/)[0];
  if (!Number.isFinite(v)) return ''; // overflow
  if (v === 0 && /[1-9]/.test(mantissa)) return ''; // underflow
  if (!/[.eE]/.test(text) && Math.abs(v) > 2 ** 53) return ''; // beyond 2^53
  // exactly 2^53 as an integer literal is allowed only when it is written so
  if (!/[.eE]/.test(text) && Math.abs(v) === 2 ** 53 && text.replace('-', '') !== '9007199254740992') return '';
  return JSON.stringify(v);
}

// Each literal goes in twice: alone on its line (so its digits run to the
// end of the text, and the reader's byte-at-a-time tail is what reads them)
// and inside an array with a long string after it (so the reader's
// eight-bytes-at-a-time path meets the end of every literal).
const pad = ',"--------"]';
let failed = 0;
let rejected = 0;
for (const [open, close] of [['', ''], ['[', pad]]) {
  const r = spawnSync(idem, ['canon', '--lines'], {
    input: lines.map((l) => open + l + close).join('\n') + '\n', maxBuffer: 1 << 30, encoding: 'utf8',
  });
  if (r.error) { console.log(`cannot run ${idem}: ${r.error.message}`); process.exit(1); }
  const got = r.stdout.split('\n');
  got.pop();
  if (got.length !== lines.length) {
    console.log(`${got.length} output lines for ${lines.length} literals`);
    failed++;
  }
  let refused = 0;
  for (let i = 0; i < lines.length && i < got.length; i++) {
    let want = expected(lines[i]);
    if (want === '') refused++;
    else want = open + want + close;
    if (got[i] !== want) {
      if (failed < 20) console.log(`text ${open}${lines[i]}${close}: idem "${got[i]}", JavaScript "${want}"`);
      failed++;
    }
  }
  const errs = r.stderr.split('\n').filter((l) => l !== '').length;
  if (errs !== refused) {
    console.log(`${errs} errors on stderr for ${refused} refused literals`);
    failed++;
  }
  if (r.status !== (refused ? 65 : 0)) {
    console.log(`exit ${r.status}, want ${refused ? 65 : 0}`);
    failed++;
  }
  rejected += refused;
}
console.log(`${2 * lines.length - failed} passed, ${failed} failed (${rejected} refused as RFC 8785 asks)`);
process.exit(failed ? 1 : 0);
