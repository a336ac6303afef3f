// One model turn, one refund (SPEC §6.4) through `idem mcp`: the official SDK
// client sends 16 identical tools/call requests at once, distinct call ids,
// one turn (_meta io.idem/turn), to a server whose refund is fast: one
// application in the payments ledger and 15 already_applied naming the call
// that ran, run after run.  The next turn's repeat runs; without a turn id
// the calls that arrive together (within coalesce_ms) are one turn.
//
//   node turns_test.mjs PATH/TO/idem
import path from "node:path";
import { here, check, done, tmpdir, ledgerOf, connect, payments, call, sanitizerSaid } from "./lib.mjs";

const RUNS = 20, N = 16;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const dir = tmpdir("turns");
const ledger = `${dir}/ledger`;
const gw = await connect({ policy: path.join(here, "turns_policy.json"), log: `sqlite:${dir}/log.db`,
                           server: payments(ledger) });
const status = (r) => r._meta?.["io.idem/status"];
const applied = (order) => ledgerOf(ledger).filter((e) => e.order_id === order).length;

async function burst(order, turn) {
  const args = { order_id: order, amount_cents: 500 };
  return Promise.all([...Array(N).keys()].map((i) =>
    call(gw.client, "refund_payment", args,
         { "io.idem/call_id": `${order}_c${i}`, ...(turn ? { "io.idem/turn": turn } : {}) })));
}
function oneRan(rs, what) {
  const ran = rs.filter((r) => !r.isError && status(r) !== "already_applied");
  const first = ran.length === 1 ? ran[0] : null;
  const callOf = (r) => rs.indexOf(r);
  const dups = rs.filter((r) => status(r) === "already_applied" &&
                                r._meta?.["io.idem/duplicate_of"] === `${what}_c${callOf(first)}`);
  return { ok: ran.length === 1 && dups.length === N - 1, ran: ran.length, dups: dups.length, sample: rs[1] };
}

let bad = 0, sample;
for (let run = 0; run < RUNS; run++) {
  const order = `o${run}`;
  const rs = await burst(order, "turn_1");
  const o = oneRan(rs, order);
  if (!o.ok || applied(order) !== 1) { bad++; sample = { run, ...o, applied: applied(order) }; }
}
check(bad === 0, `${RUNS} runs of ${N} concurrent calls of one turn: one refund each, ${N - 1} already_applied naming it`, sample);
const one = (await burst("words", "turn_1"))[3];
check(/already made in this turn/.test(one._meta?.["io.idem/message"] ?? ""), "the coalesced call's words say so", one);

// the model was told: its next turn is a new decision
let r = await call(gw.client, "refund_payment", { order_id: "o0", amount_cents: 500 },
                   { "io.idem/call_id": "o0_next", "io.idem/turn": "turn_2" });
check(!r.isError && status(r) === undefined && applied("o0") === 2, "the next turn's repeat is a second refund", r);

// no turn id: the calls that arrive together coalesce; one after the window runs
bad = 0;
for (let run = 0; run < 5; run++) {
  const order = `w${run}`;
  const o = oneRan(await burst(order, null), order);
  if (!o.ok || applied(order) !== 1) { bad++; sample = { run, ...o }; }
}
check(bad === 0, "without a turn id, concurrent identical calls apply once (coalesce_ms)", sample);
await sleep(400);
r = await call(gw.client, "refund_payment", { order_id: "w0", amount_cents: 500 }, { "io.idem/call_id": "w0_later" });
check(!r.isError && applied("w0") === 2, "after coalesce_ms, the repeat is a new decision", r);

// an empty turn id is refused
r = await call(gw.client, "refund_payment", { order_id: "e", amount_cents: 1 },
               { "io.idem/call_id": "e1", "io.idem/turn": "" }).catch((e) => e);
check(/io\.idem\/turn" is empty/.test(String(r?.message ?? "")) && applied("e") === 0,
      "an empty _meta io.idem/turn is refused, nothing runs", String(r?.message ?? r));

const ex = await gw.close();
check(!sanitizerSaid(gw.stderr()), "the gateway's stderr holds no sanitizer report", gw.stderr().slice(-2000));
check(ex.code === 0, "the gateway exits 0", ex);
done();
