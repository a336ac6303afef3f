// One harness process for crash.test.js: guard one refund whose provider
// appends the idempotency key to a ledger file (no deduplication), with a
// status function that looks the key up there; print the envelope.
//
//   node crash_child.js LOG LEDGER CALL_ID [crash_in_tool]
//
// Run with IDEM_CRASH_AT=POINT it is killed by SIGKILL at that point.
import fs from 'node:fs';
import { Guard } from '../src/index.js';

const [log, ledger, callId, inTool] = process.argv.slice(2);
const keys = () => (fs.existsSync(ledger)
  ? fs.readFileSync(ledger, 'utf8').split('\n').filter(Boolean) : []);
// the refund is a local write, done when its process dies: settle_ms 0
const guard = new Guard(log, { policy: { tools: {
  refund_payment: { class: 'guarded', timeout_ms: 5000, retries: 1,
    backoff_ms: 1, wait_ms: 5000, settle_ms: 0,
    status: { tool: 'get_refund_status',
      arguments: { order_id: '{order_id}' } } },
  get_refund_status: { class: 'read_only' } } } });
const t = guard.tool('refund_payment', async (args, { key }) => {
  const fd = fs.openSync(ledger, 'a');
  fs.writeSync(fd, `${key}\n`);
  fs.fsyncSync(fd);
  fs.closeSync(fd);
  if (inTool) process.kill(process.pid, 'SIGKILL');
  return { refund_id: `re_${key.slice(-4)}`, order_id: args.order_id };
}, { status: (args, { key }) => (keys().includes(key)
  ? { applied: true, key } : null) });
const env = await t.call({ session: 'sess', callId },
  '{"order_id":"ord_1","amount_cents":6000}');
process.stdout.write(`${env.text}\n`);
await guard.close();
