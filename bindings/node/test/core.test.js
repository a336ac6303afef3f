// The Guard and Tool API on the step driver: envelopes, replay, conflict,
// one turn's identical calls, the deadline and a late result, the caller's
// AbortSignal, a failed call's text, a missing library.
import test from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { Guard, currentKey, Rejected, StoreError, IdemError,
  MisuseError, processMetrics } from '../src/index.js';
import { guardOn, ledger, refundPolicy, tmpLog, plainEnv } from './helpers.js';

const SRC = fileURLToPath(new URL('../src/index.js', import.meta.url));

test('replay, conflict, and one turn\'s identical calls: one refund',
  async () => {
    const { guard } = guardOn('basic');
    const l = ledger();
    const keys = [];
    const t = guard.tool('refund', async (a) => {
      keys.push(currentKey());
      return l.refund(a, 5);
    });
    const ids = { session: 'run1', callId: 'c1' };
    const e1 = await t.call(ids, '{"order": "o1", "amount": 5}');
    assert.equal(e1.status, 'succeeded');
    assert.equal(e1.replayed, false);
    assert.equal(keys[0], e1.idempotency_key);
    const e2 = await t.call(ids, { amount: 5, order: 'o1' });
    assert.equal(e2.status, 'succeeded');
    assert.equal(e2.replayed, true);
    assert.equal(String(e2), e2.text);
    const e3 = await t.call(ids, { order: 'o1', amount: 6 });
    assert.equal(e3.status, 'conflict');
    const three = await Promise.all(['p1', 'p2', 'p3'].map((c) =>
      t.call({ session: 'run1', callId: c, turn: 'resp_1' },
        { order: 'o2', amount: 7 })));
    assert.deepEqual(three.map((e) => e.status).sort(),
      ['already_applied', 'already_applied', 'succeeded']);
    assert.equal(l.applied.length, 2, 'one refund per order');
    await guard.close();
  });

test('processMetrics: this process\'s answers, replays, attempts and ' +
  'latency', async () => {
  const { guard } = guardOn('metrics');
  const l = ledger();
  const t = guard.tool('refund', async (a) => l.refund(a, 5));
  const before = processMetrics();
  const ids = { session: 'm1', callId: 'c1' };
  assert.equal((await t.call(ids, { order: 'om', amount: 5 })).status,
    'succeeded');
  assert.equal((await t.call(ids, { order: 'om', amount: 5 })).replayed,
    true);
  const after = processMetrics();
  assert.equal(after.answers.succeeded - before.answers.succeeded, 2);
  assert.equal(after.replays - before.replays, 1);
  assert.equal(after.attempts - before.attempts, 1);
  assert.equal(after.latency.count - before.latency.count, 2);
  assert.ok(after.latency.sumSeconds > before.latency.sumSeconds);
  const counts = after.latency.buckets.map(([, n]) => n);
  assert.equal(counts.length, 16);
  assert.deepEqual(counts, [...counts].sort((a, b) => a - b), 'cumulative');
  assert.ok(counts[15] <= after.latency.count);
  assert.deepEqual(Object.keys(after.checks),
    ['applied', 'rejected', 'not_applied', 'unknown']);
  await guard.close();
});

test('refused and invalid arguments are answers, not throws', async () => {
  const { guard } = guardOn('answers');
  const other = guard.tool('wire', async () => 1);
  assert.equal((await other.call({ session: 's', callId: 'c' }, {})).status,
    'refused');
  const t = guard.tool('refund', async () => 1);
  assert.equal((await t.call({ session: 's', callId: 'c' }, '[1]')).status,
    'invalid_arguments');
  await assert.rejects(t.call({ session: '', callId: 'c' }, {}), MisuseError);
  await guard.close();
});

test('past the deadline: outcome_unknown, the late result recorded, ' +
  're-issue fenced then already_applied', async () => {
  const { guard } = guardOn('late',
    refundPolicy({ timeout_ms: 100, coalesce_ms: 0 }));
  const l = ledger();
  const t = guard.tool('refund', (a) => l.refund(a, 400));
  const e = await t.call({ session: 's', callId: 'c1', turn: 't1' },
    { order: 'o1', amount: 5 });
  assert.equal(e.status, 'outcome_unknown');
  assert.equal(l.applied.length, 0);
  // the next turn's re-issue while the first may still land: fenced
  const r1 = await t.call({ session: 's', callId: 'c2', turn: 't2' },
    { order: 'o1', amount: 5 });
  assert.notEqual(r1.status, 'succeeded');
  await new Promise((r) => setTimeout(r, 600));
  assert.equal(l.applied.length, 1);
  const r2 = await t.call({ session: 's', callId: 'c3', turn: 't3' },
    { order: 'o1', amount: 5 });
  assert.equal(r2.status, 'already_applied');
  // the first call's own replay holds the late result
  const r3 = await t.call({ session: 's', callId: 'c1', turn: 't1' },
    { order: 'o1', amount: 5 });
  assert.equal(r3.status, 'succeeded');
  assert.equal(r3.result.refund_id, 'rf_1');
  assert.equal(l.applied.length, 1, 'one refund');
  await guard.close();
});

test('an aborted caller: the attempt goes on, recorded, not delivered, so ' +
  'a re-issue is fenced', async () => {
  const { guard } = guardOn('abort',
    refundPolicy({ timeout_ms: 2000, coalesce_ms: 0 }));
  const l = ledger();
  const t = guard.tool('refund', (a) => l.refund(a, 150));
  const ac = new AbortController();
  const p = t.call({ session: 's', callId: 'c1', turn: 't1' },
    { order: 'o1', amount: 5 }, { signal: ac.signal });
  setTimeout(() => ac.abort(), 30);
  await assert.rejects(p, { name: 'AbortError' });
  assert.equal(l.applied.length, 0, 'the abort came before the refund');
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(l.applied.length, 1, 'the attempt went on');
  // the model was never told: the next turn's re-issue is fenced
  const r = await t.call({ session: 's', callId: 'c2', turn: 't2' },
    { order: 'o1', amount: 5 });
  assert.equal(r.status, 'already_applied');
  const again = await t.call({ session: 's', callId: 'c1', turn: 't1' },
    { order: 'o1', amount: 5 });
  assert.equal(again.status, 'succeeded');
  assert.equal(again.replayed, true);
  assert.equal(l.applied.length, 1, 'one refund');
  await guard.close();
});

test('close() waits for a late result, with a bound', async () => {
  const { log, guard } = guardOn('closewait', refundPolicy({ timeout_ms: 50 }));
  const l = ledger();
  const t = guard.tool('refund', (a) => l.refund(a, 200));
  const e = await t.call({ session: 's', callId: 'c1' }, { amount: 1 });
  assert.equal(e.status, 'outcome_unknown');
  await guard.close();
  assert.equal(l.applied.length, 1);
  const g = new Guard(log.url, { policy: refundPolicy({}) });
  const t2 = g.tool('refund', (a) => l.refund(a));
  const r = await t2.call({ session: 's', callId: 'c1' }, { amount: 1 });
  assert.equal(r.status, 'succeeded');
  assert.equal(r.replayed, true, 'the late result was recorded');
  assert.equal(l.applied.length, 1);
  await g.close();
});

test('a failed call\'s error text reaches JS', async () => {
  const { log, guard } = guardOn('errtext');
  const t = guard.tool('refund', async () => 1);
  assert.equal((await t.call({ session: 's', callId: 'c0' }, {})).status,
    'succeeded');
  // the log's table goes from under the open guard
  const r = spawnSync('python3', ['-c', 'import sqlite3, sys; ' +
    'sqlite3.connect(sys.argv[1]).execute("DROP TABLE attempts")',
  log.file], { env: plainEnv() });
  assert.equal(r.status, 0, String(r.stderr));
  const err = await t.call({ session: 's', callId: 'c1' }, {}).then(
    () => null, (e) => e);
  assert.ok(err instanceof IdemError, `got ${err}`);
  assert.ok(err instanceof StoreError, `got ${err.constructor.name}`);
  assert.match(err.message, /attempt log: .*no such table: attempts/);
  await guard.close();
});

test('a missing library names where it looked', () => {
  const r = spawnSync(process.execPath, ['--input-type=module', '-e',
    `import {Guard} from ${JSON.stringify(SRC)};
     try { new Guard('sqlite:/tmp/x.db'); } catch (e) {
       console.log(e.constructor.name + '|' + e.message); }`],
  { env: { ...process.env, IDEM_LIBRARY: '/nonexistent/libidem.so' },
    encoding: 'utf8' });
  assert.match(r.stdout, new RegExp('^LibraryNotFound\\|idem: cannot load ' +
    'libidem; tried /nonexistent/libidem\\.so \\(no such file\\)'));
  assert.match(r.stdout, /IDEM_LIBRARY/);
});

test('a tool that rejects: failed, and the error is the model\'s', async () => {
  const { guard } = guardOn('reject');
  const t = guard.tool('refund', async () => {
    throw new Rejected('card expired');
  });
  const e = await t.call({ session: 's', callId: 'c1' }, {});
  assert.equal(e.status, 'failed');
  assert.match(e.text, /card expired/);
  await guard.close();
});

test('the event loop is never blocked: a 1 ms heartbeat while 32 calls ' +
  'wait on a log another process holds', async () => {
  const { log, guard } = guardOn('heartbeat');
  const l = ledger();
  const t = guard.tool('refund', (a) => l.refund(a));
  await t.call({ session: 's', callId: 'warm' }, { order: 'w' });
  // python3's sqlite3 holds the log's write lock until its stdin ends
  const holder = spawn('python3', ['-c', 'import sqlite3, sys; ' +
    'c = sqlite3.connect(sys.argv[1], isolation_level=None); ' +
    'c.execute("BEGIN EXCLUSIVE"); print("held", flush=True); ' +
    'sys.stdin.read(); c.execute("COMMIT")', log.file],
  { stdio: ['pipe', 'pipe', 'inherit'], env: plainEnv() });
  await new Promise((res) => holder.stdout.once('data', res));
  let last = performance.now();
  let gap = 0;
  const beat = setInterval(() => {
    const now = performance.now();
    gap = Math.max(gap, now - last);
    last = now;
  }, 1);
  const t0 = performance.now();
  const calls = Promise.allSettled(Array.from({ length: 32 }, (_, i) =>
    t.call({ session: 's', callId: `c${i}` }, { order: `o${i}` })));
  setTimeout(() => holder.stdin.end(), 300);
  const rs = await calls;
  const took = performance.now() - t0;
  clearInterval(beat);
  assert.ok(took >= 250, `the calls waited for the lock (${took} ms)`);
  // blocked, the loop would miss its beat for the whole 300 ms the lock is
  // held; a busy machine (a sanitizer build, the other tests) delays a beat
  // by tens of ms, which is no blocking: half the hold tells them apart
  assert.ok(gap < 150, `largest gap ${gap.toFixed(1)} ms`);
  const ok = rs.filter((r) => r.status === 'fulfilled' &&
    r.value.status === 'succeeded').length;
  assert.equal(ok, 32, JSON.stringify(rs.find((r) => r.status !==
    'fulfilled' || r.value.status !== 'succeeded')));
  assert.equal(l.applied.length, 33);
  await guard.close();
});

test('a process that ends without close() still records a late result',
  () => {
    const { url } = tmpLog('exitlate');
    const policy = JSON.stringify(refundPolicy({ timeout_ms: 50 }));
    const script = (body) => spawnSync(process.execPath, ['--input-type=module',
      '-e', `import {Guard} from ${JSON.stringify(SRC)};
       const g = new Guard(${JSON.stringify(url)}, {policy: ${policy}});
       const t = g.tool('refund', (a) => new Promise((r) =>
         setTimeout(() => r({refund_id: 'rf_late'}), 200)));
       ${body}`], { encoding: 'utf8', timeout: 20000 });
    // answers outcome_unknown at 50 ms and simply ends: no close()
    let r = script(`const e = await t.call({session: 's', callId: 'c1'}, {});
       console.log(e.status);`);
    assert.equal(r.stdout.trim(), 'outcome_unknown', r.stderr);
    r = script(`const e = await t.call({session: 's', callId: 'c1'}, {});
       console.log(e.status, e.replayed, e.result.refund_id);
       await g.close();`);
    assert.equal(r.stdout.trim(), 'succeeded true rf_late', r.stderr);
  });

test('an operator\'s verdict settles an action in doubt', async () => {
  const { guard } = guardOn('resolve', refundPolicy({ timeout_ms: 50 }));
  // ends only when the guard, closed, aborts what still runs
  const t = guard.tool('refund', (a, { signal }) => new Promise((_, no) =>
    signal.addEventListener('abort', () => no(signal.reason))));
  const e = await t.call({ session: 's', callId: 'c1' }, { order: 'o1' });
  assert.equal(e.status, 'outcome_unknown');
  assert.throws(() => guard.resolve('s', 'c1', { applied: false }),
    MisuseError);
  guard.resolve('s', 'c1', { applied: true, result: { refund_id: 'rf_op' },
    by: 'ops@example' });
  const r = await t.call({ session: 's', callId: 'c1' }, { order: 'o1' });
  assert.equal(r.status, 'succeeded');
  assert.equal(r.result.refund_id, 'rf_op');
  assert.throws(() => guard.resolve('s', 'nope', { applied: true }),
    { name: 'NotFoundError' });
  await guard.close({ lateMs: 10 });
});
