// The console inside the gateway (`idem mcp --console 127.0.0.1:0`): its
// /metrics count the gateway's own calls, exactly.  The official SDK client
// makes, through the gateway in front of the payments server:
//   c1        a refund that runs                  succeeded
//   c1 again  its replay                          succeeded, replayed
//   c2        the same refund, same turn          already_applied (coalesced)
//   c3        another order, next turn            succeeded
//   c4        a refund of c1's order, bad amount  a second decision: runs
// and /metrics must say: answers {succeeded: 4, already_applied: 1},
// replays 1, fenced 1, coalesced 1, attempts 3, and a latency histogram
// whose count is the 5 answers; the log's gauges agree with the ledger.
//
//   node console_test.mjs PATH/TO/idem
import path from "node:path";
import { here, check, done, tmpdir, ledgerOf, connect, payments, call, sanitizerSaid }
  from "./lib.mjs";

const dir = tmpdir("console");
const ledger = `${dir}/ledger`;
const gw = await connect({ log: `sqlite:${dir}/log.db`, server: payments(ledger),
                           extra: ["--console", "127.0.0.1:0"] });
// (a call that ran passes the server's answer through: no status of ours)
const status = (r) => r._meta?.["io.idem/status"] ?? (r.isError ? "error" : "ran");
const replayed = (r) => r._meta?.["io.idem/replayed"];

// the console's address, announced on stderr
let url = null;
for (let i = 0; i < 100 && !url; i++) {
  const m = /idem serve: (http:\/\/\S+\/)/.exec(gw.stderr());
  if (m) url = m[1];
  else await new Promise((r) => setTimeout(r, 50));
}
check(url, "the console's URL on stderr", gw.stderr());

async function metrics() {
  const text = await (await fetch(url + "metrics")).text();
  const v = {};
  for (const l of text.split("\n")) {
    const m = /^([a-z_]+(?:\{[^}]*\})?) (\S+)$/.exec(l);
    if (m) v[m[1]] = Number(m[2]);
  }
  return v;
}

const refund = (order, cents) => ({ order_id: order, amount_cents: cents });
const meta = (id, turn) => ({ "io.idem/call_id": id, "io.idem/turn": turn });
const rs = [];
rs.push(await call(gw.client, "refund_payment", refund("o1", 500), meta("c1", "t1")));
rs.push(await call(gw.client, "refund_payment", refund("o1", 500), meta("c1", "t1")));
rs.push(await call(gw.client, "refund_payment", refund("o1", 500), meta("c2", "t1")));
rs.push(await call(gw.client, "refund_payment", refund("o2", 700), meta("c3", "t2")));
rs.push(await call(gw.client, "refund_payment", refund("o1", 900), meta("c4", "t2")));
check(JSON.stringify(rs.map(status)) === JSON.stringify(
  ["ran", "succeeded", "already_applied", "ran", "ran"]),
"the answers", rs.map(status));
check(replayed(rs[1]) === true, "c1 again: replayed", rs[1]._meta);
check(ledgerOf(ledger).length === 3, "three refunds applied", ledgerOf(ledger));

const v = await metrics();
const want = {
  'idem_process_answers_total{answer="succeeded"}': 4,
  'idem_process_answers_total{answer="already_applied"}': 1,
  'idem_process_answers_total{answer="outcome_unknown"}': 0,
  'idem_process_answers_total{answer="failed"}': 0,
  "idem_process_replays_total": 1,
  "idem_process_fenced_total": 1,
  "idem_process_coalesced_total": 1,
  "idem_process_attempts_total": 3,
  "idem_process_late_results_total": 0,
  "idem_guard_latency_seconds_count": 5,
  'idem_guard_latency_seconds_bucket{le="+Inf"}': 5,
  'idem_actions{tool="refund_payment",state="succeeded",resolution="executed"}': 3,
  'idem_actions{tool="refund_payment",state="deduplicated",resolution="replayed"}': 1,
  'idem_log_attempts{tool="refund_payment"}': 3,
  'idem_log_deduplicated{tool="refund_payment"}': 1,
  "idem_in_doubt": 0,
};
for (const [k, n] of Object.entries(want)) check(v[k] === n, `${k} ${n}`, `got ${v[k]}`);
check(v.idem_guard_latency_seconds_sum > 0, "the latency's sum", v.idem_guard_latency_seconds_sum);

const { code } = await gw.close();
check(code === 0, "the gateway exits 0", code);
check(!sanitizerSaid(gw.stderr()), "no sanitizer report", gw.stderr());
done();
