#!/usr/bin/env node
// Guarded calls from Node against the C API's 32 sessions, in one run
// (docs/PERFORMANCE.md, "The Node binding").
//
//   node bindings/node/bench.mjs [--idem build/idem] [--rounds 3]
//        [--per-task 40] [--replays 300] [--dir DIR]
//
// Each round runs `idem bench --only guard --dir DIR` (the C figures:
// guard_32, 32 sessions on threads calling idem_guard_call; replay, a
// recorded call answered again in process), then, in this process, on a
// SQLite log in the same DIR:
//   node_32  32 concurrent sessions in one event loop, each making
//            --per-task guarded calls (distinct refunds, the C bench's
//            arguments) through Tool.call of an async tool: calls/s;
//   replay   a recorded call again, one at a time: the median in µs.
// One JSON object per figure, and a summary with each side's best round
// and the ratios.  Not a test: nothing asserts a time.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { parseArgs } from 'node:util';
import { Guard } from './src/index.js';

const { values: o } = parseArgs({ options: {
  idem: { type: 'string', default: 'build/idem' },
  rounds: { type: 'string', default: '3' },
  'per-task': { type: 'string', default: '40' },
  replays: { type: 'string', default: '300' },
  dir: { type: 'string' },
} });

const SESSIONS = 32;
const refundArgs = (id) => `{"order_id":"ord_${id}","amount_cents":6000,` +
  '"currency":"usd","reason":"late delivery"}';
const dir = o.dir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'idem-nbench-'));

function fresh(p) {
  for (const ext of ['', '-wal', '-shm', '-journal'])
    fs.rmSync(p + ext, { force: true });
}

function cFigures() {
  const out = {};
  for (const line of execFileSync(o.idem, ['bench', '--only', 'guard',
    '--dir', dir], { encoding: 'utf8', timeout: 600000 }).split('\n'))
    if (line.startsWith('{')) {
      const j = JSON.parse(line);
      out[j.bench] = j;
    }
  return out;
}

async function node32(tag, per) {
  const p = path.join(dir, `node_${tag}.db`);
  fresh(p);
  const g = new Guard(`sqlite:${p}`);
  const t = g.tool('refund_payment', async () => ({ refund_id: 're_1' }));
  const session = async (s, n) => {
    for (let i = 0; i < n; i++) {
      const e = await t.call({ session: s, callId: `call_${i}` },
        refundArgs(`${s}_call_${i}`));
      if (e.status !== 'succeeded') throw new Error(`${s}: ${e.text}`);
    }
  };
  await Promise.all(Array.from({ length: SESSIONS }, (_, i) =>
    session(`warm_${i}`, 2)));
  const t0 = performance.now();
  await Promise.all(Array.from({ length: SESSIONS }, (_, i) =>
    session(`bench_s${i}`, per)));
  const rate = SESSIONS * per / ((performance.now() - t0) / 1000);
  await g.close();
  fresh(p);
  return rate;
}

async function replay(n) {
  const p = path.join(dir, 'node_replay.db');
  fresh(p);
  const g = new Guard(`sqlite:${p}`);
  const t = g.tool('refund_payment', async () => ({ refund_id: 're_1' }));
  const ids = { session: 's', callId: 'c' };
  await t.call(ids, refundArgs('r'));
  const us = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const e = await t.call(ids, refundArgs('r'));
    us.push((performance.now() - t0) * 1000);
    if (!e.replayed) throw new Error(e.text);
  }
  await g.close();
  fresh(p);
  us.sort((a, b) => a - b);
  return us[us.length >> 1];
}

const best = { guard_32: 0, node_32: 0, c_replay: Infinity,
  node_replay: Infinity };
for (let r = 0; r < Number(o.rounds); r++) {
  const c = cFigures();
  const g32 = c.guard_32.calls_per_s ?? c.guard_32.ops_per_s;
  const crep = c.replay.median_us ?? c.replay.us_median;
  const n32 = await node32(`r${r}`, Number(o['per-task']));
  const nrep = await replay(Number(o.replays));
  for (const [k, v] of Object.entries({ guard_32: g32, node_32: n32 }))
    best[k] = Math.max(best[k], v);
  best.c_replay = Math.min(best.c_replay, crep);
  best.node_replay = Math.min(best.node_replay, nrep);
  console.log(JSON.stringify({ round: r, guard_32: g32, node_32: n32,
    c_replay_us: crep, node_replay_us: nrep, c: c.guard_32 }));
}
console.log(JSON.stringify({ summary: true, ...best,
  node_32_over_guard_32: +(best.node_32 / best.guard_32).toFixed(2),
  replay_over_c: +(best.node_replay / best.c_replay).toFixed(1) }));
if (!o.dir) fs.rmSync(dir, { recursive: true, force: true });
