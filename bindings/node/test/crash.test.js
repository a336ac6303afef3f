// Crashes: a harness process using the binding is killed by SIGKILL at each
// crash point of the library (IDEM_CRASH_AT, SPEC §11) and inside the tool,
// then resumed by a fresh process making the same call: the provider's
// ledger holds the refund exactly once, and the call then replays.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { tmpLog } from './helpers.js';

const CHILD = fileURLToPath(new URL('crash_child.js', import.meta.url));
const POINTS = ['after_pending_commit', 'after_downstream_return',
  'before_outcome_commit', 'after_outcome_commit'];

function child(log, ledger, crashAt, ...extra) {
  const env = { ...process.env };
  delete env.IDEM_CRASH_AT;
  if (crashAt) env.IDEM_CRASH_AT = crashAt;
  return spawnSync(process.execPath, [CHILD, log, ledger, 'toolu_1',
    ...extra], { env, encoding: 'utf8', timeout: 60000 });
}

const count = (ledger) => (fs.existsSync(ledger)
  ? fs.readFileSync(ledger, 'utf8').split('\n').filter(Boolean).length : 0);

for (const point of [...POINTS, 'in the tool']) {
  test(`killed ${point}, then resumed: one refund`, () => {
    const { dir, url } = tmpLog('crash');
    const ledger = path.join(dir, 'ledger');
    const inTool = point === 'in the tool';
    let r = inTool ? child(url, ledger, null, 'crash_in_tool')
      : child(url, ledger, point);
    assert.equal(r.signal, 'SIGKILL', `not killed: ${r.stdout} ${r.stderr}`);
    assert.equal(r.stdout, '', 'it died before answering');
    r = child(url, ledger);
    assert.equal(r.status, 0, r.stderr);
    const env = JSON.parse(r.stdout);
    assert.equal(env.status, 'succeeded', r.stdout);
    assert.equal(count(ledger), 1, 'refunds in the ledger');
    r = child(url, ledger);
    assert.equal(JSON.parse(r.stdout).replayed, true);
    assert.equal(count(ledger), 1);
    fs.rmSync(dir, { recursive: true, force: true });
  });
}
