// The gateway does not cancel a guarded call's request at its deadline
// (SPEC 10): the official SDK's servers drop the answer of a cancelled
// request even when the handler went on to apply the action, and that late
// answer is what settles it.  Behind `idem mcp`, with the SDK's own client
// and server (payments_server.mjs: each charge lands 1.2 s after its
// request, and nothing is deduped):
//  a. charge_card, deadline 300 ms, no status tool: the call answers
//     outcome_unknown at the deadline; the server gets no
//     notifications/cancelled; its answer 1.2 s in is recorded (succeeded,
//     resolution late, listed by idem ls); then a new call id is
//     already_applied, the same call id replays the charge; one charge.
//  b. the client's own cancellation of a guarded call (MCP.md): the call
//     goes on and is recorded, the client gets no answer, the server no
//     cancellation; the repeat replays; one charge.
//
//   node late_test.mjs PATH/TO/idem
import fs from "node:fs";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { idem, check, done, tmpdir, ledgerOf, connect, body, call, payments, sanitizerSaid } from "./lib.mjs";

const dir = tmpdir("late");
const log = `sqlite:${dir}/log.db`;
const ledger = `${dir}/ledger`;
const LATE = 1200; // the charge lands, and is answered, this long after its request
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const show = (callId) =>
  JSON.parse(execFileSync(idem, ["show", "--log", log, "--json", "late", callId], { encoding: "utf8" }));
const lines = (f) => (fs.existsSync(f) ? fs.readFileSync(f, "utf8").split("\n").filter(Boolean) : []);
async function until(f, ms) {
  for (const t = Date.now(); !f() && Date.now() - t < ms;) await sleep(20);
}

const policy = `${dir}/policy.json`;
fs.writeFileSync(policy, JSON.stringify({
  unknown_tools: "refuse",
  tools: {
    charge_card: { class: "guarded", timeout_ms: 300, key_arg: "idempotency_key" },
    refund_payment: { class: "guarded", timeout_ms: 5000, key_arg: "idempotency_key" },
  },
}));
fs.writeFileSync(`${ledger}.late`, String(LATE));
fs.writeFileSync(`${ledger}.nodedupe`, "");
const gw = await connect({ policy, log, session: "late", server: payments(ledger) });
const charges = (order) => ledgerOf(ledger).filter((e) => e.order_id === order).length;

// ---- a: the answer after the deadline settles the action
{
  const args = { order_id: "o-late", amount_cents: 1500 };
  const c = (id) => call(gw.client, "charge_card", args, { "io.idem/call_id": id });
  const t0 = Date.now();
  const first = await c("c1");
  const t = Date.now() - t0;
  check(first.isError && first.structuredContent?.status === "outcome_unknown" && t < LATE && charges("o-late") === 0,
        `a: at the deadline (${t} ms) the call is outcome_unknown, nothing charged yet`, first);
  await until(() => charges("o-late") > 0 && show("c1").state !== "in_doubt", 5000);
  const rec = show("c1");
  check(rec.state === "succeeded" && rec.resolution === "late" && body(rec.result)?.refund_id === "re_1",
        "a: the server's answer after the deadline is recorded: succeeded, resolution late", rec);
  check(lines(`${ledger}.cancelled`).length === 0, "a: ... the server got no notifications/cancelled",
        lines(`${ledger}.cancelled`));
  const ls = execFileSync(idem, ["ls", "--log", log, "--session", "late", "--json"], { encoding: "utf8" })
    .split("\n").filter(Boolean).map((l) => JSON.parse(l));
  check(ls.some((r) => r.call_id === "c1" && r.state === "succeeded"), "a: ... idem ls lists c1 succeeded", ls);
  // the model re-issues it (the late outcome was never told: the fence
  // answers it), then repeats the first call
  const other = await c("c2");
  check(!other.isError && other._meta?.["io.idem/status"] === "already_applied" &&
        other._meta["io.idem/duplicate_of"] === "c1", "a: a new call id with the same arguments is already_applied",
        other);
  const again = await c("c1");
  check(!again.isError && again._meta?.["io.idem/status"] === "succeeded" && again._meta["io.idem/replayed"] === true &&
        body(again)?.refund_id === "re_1", "a: the same call id replays the charge the late answer recorded", again);
  await sleep(LATE + 200); // time for a charge that was sent again to land
  check(charges("o-late") === 1, `a: one charge in the ledger (${charges("o-late")})`, ledgerOf(ledger));
}

// ---- b: the client cancels a guarded call itself
{
  const args = { order_id: "o-cancel", amount_cents: 700 };
  const ac = new AbortController();
  const p = call(gw.client, "refund_payment", args, { "io.idem/call_id": "k1" }, { signal: ac.signal });
  await sleep(100);
  ac.abort("the user changed their mind");
  const r = await p.then((v) => ({ answered: v }), (e) => ({ rejected: String(e) }));
  check(r.rejected, "b: the client's cancelled call gets no answer", r);
  await until(() => charges("o-cancel") > 0 && show("k1").state !== "pending", 5000);
  const rec = show("k1");
  check(rec.state === "succeeded" && !lines(`${ledger}.cancelled`).includes(rec.key),
        "b: ... the call went on and is recorded succeeded; the server got no cancellation", rec,
        lines(`${ledger}.cancelled`));
  const again = await call(gw.client, "refund_payment", args, { "io.idem/call_id": "k1" });
  check(!again.isError && again._meta?.["io.idem/replayed"] === true && charges("o-cancel") === 1,
        `b: ... its repeat replays; one refund (${charges("o-cancel")})`, again, ledgerOf(ledger));
}

const exit = await gw.close();
check(exit.code === 0 && !sanitizerSaid(gw.stderr()), "the gateway exits 0, nothing from the sanitizers", exit,
      gw.stderr());
done();
