#!/usr/bin/env node
// es6_numbers_node.js - check tests/data/rfc8785/numbers-es6-100k.txt, the
// data of the dtoa_es6_100k test, independently of idem.
//
//   node tests/es6_numbers_node.js tests/data/rfc8785/numbers-es6-100k.txt
//
// The file must be, byte for byte, the first 100,000 lines of the RFC 8785
// reference's number test file (tests/data/README.md):
//
//   - exactly 100,000 lines "HEX,TEXT\n", 4,031,728 bytes, and the SHA-256
//     the reference publishes for its first 100,000 lines;
//   - TEXT is what this Node prints for the double whose IEEE-754 bits are
//     HEX (Number::toString, which JSON.stringify and RFC 8785 use), so the
//     expectations are checked against an oracle other than idem;
//   - the lines after the reference's hand-picked values follow its
//     generator: 2,000 doubles counting up from the smallest normal
//     (bits 0x0010000000000000), then the doubles read from a SHA-256 chain
//     (32 zero bytes hashed, the digest hashed again, and so on; each digest
//     is four little-endian doubles, zeros and non-finite ones left out).
//
// Exit 0 when all of it holds, else 1 with what differs.
'use strict';

const crypto = require('crypto');
const fs = require('fs');

const LINES = 100000;
const BYTES = 4031728;
const SHA256 = '22776e6d4b49fa294a0d0f349268e5c28808fe7e0cb2bcbe28f63894e494d4c7';
const HAND_PICKED = 168; // the reference's list of edge cases comes first
const SERIAL = 2000;

const path = process.argv[2];
if (!path) {
  console.error('usage: node es6_numbers_node.js FILE');
  process.exit(2);
}
const data = fs.readFileSync(path);
let bad = 0;
function fail(msg) {
  if (bad++ < 20) console.log(msg);
}

const sha = crypto.createHash('sha256').update(data).digest('hex');
if (data.length !== BYTES) fail(`${path}: ${data.length} bytes, not ${BYTES}`);
if (sha !== SHA256) fail(`${path}: SHA-256 ${sha}, not ${SHA256}`);

const lines = data.toString('latin1').split('\n');
if (lines[lines.length - 1] !== '') fail(`${path}: the last line has no newline`);
else lines.pop();
if (lines.length !== LINES) fail(`${path}: ${lines.length} lines, not ${LINES}`);

// The generator's doubles after the hand-picked ones, as bit patterns.
function* generated() {
  for (let i = 0; i < SERIAL; i++) yield 0x0010000000000000n + BigInt(i);
  let block = Buffer.alloc(32);
  for (;;) {
    block = crypto.createHash('sha256').update(block).digest();
    for (let o = 0; o < 32; o += 8) {
      const x = block.readDoubleLE(o);
      if (x !== 0 && Number.isFinite(x)) yield block.readBigUInt64LE(o);
    }
  }
}

const view = new DataView(new ArrayBuffer(8));
const gen = generated();
let checked = 0;
lines.forEach((line, i) => {
  const m = /^([0-9a-f]{1,16}),(.+)$/.exec(line);
  if (!m) {
    fail(`line ${i + 1}: malformed: ${line}`);
    return;
  }
  const bits = BigInt('0x' + m[1]);
  if (m[1] !== bits.toString(16)) fail(`line ${i + 1}: hex not in lowest terms: ${m[1]}`);
  view.setBigUint64(0, bits);
  const want = String(view.getFloat64(0));
  if (m[2] !== want) fail(`line ${i + 1}: ${m[1]}: file says ${m[2]}, node says ${want}`);
  if (i >= HAND_PICKED) {
    const g = gen.next().value;
    if (g !== bits) fail(`line ${i + 1}: ${m[1]}, the generator gives ${g.toString(16)}`);
  }
  checked++;
});

console.log(`${checked} lines checked against node ${process.versions.node}, ${bad} problems`);
process.exitCode = bad || checked !== LINES ? 1 : 0;
