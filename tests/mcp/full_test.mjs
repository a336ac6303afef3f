// The disk fills while a guarded call runs through `idem mcp`
// (docs/FAILURES.md): the provider applies the refund, the gateway cannot
// record the outcome.  The client gets a tool result that says what is
// known - outcome_unknown, the call ran, the log could not record it -
// never a bare JSON-RPC error; once the disk is freed the re-issue is
// answered within its deadline and applies nothing again.  Every case
// counts the provider's ledger.
//
//   node full_test.mjs PATH/TO/idem
//
// IDEM_FULL_WHILE=FILE (store/vfs.c): the gateway's log fails its writes
// as on a full disk while FILE exists; the server creates FILE right after
// applying (payments_server.mjs, LEDGER.fill).
//  a. refund_payment (a status tool): outcome_unknown, then the re-issue
//     is checked and succeeds.  One refund.
//  b. charge_card (no status tool): outcome_unknown, and the re-issue
//     outcome_unknown, answered at once.  One charge.
//  c. a lone call waiting for an action another live process holds (a
//     WAIT polled on the gateway's loop): in_progress after wait_ms.
import fs from "node:fs";
import path from "node:path";
import { spawn, execFileSync } from "node:child_process";
import { idem, here, check, done, tmpdir, ledgerOf, connect, payments, call, body, sanitizerSaid } from "./lib.mjs";

const dir = tmpdir("full");
const ledger = `${dir}/ledger`;
const full = `${dir}/full`;
const log = `sqlite:${dir}/log.db`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const show = (s, c) => {
  try {
    return JSON.parse(execFileSync(idem, ["show", "--log", log, "--json", s, c], { encoding: "utf8",
                                                                                  stdio: "pipe" }));
  } catch { return null; }
};
const count = (kind, order) => ledgerOf(ledger).filter((e) => e.kind === kind && e.order_id === order).length;
const gw = await connect({ log, server: payments(ledger), env: { IDEM_FULL_WHILE: full } });
const ask = (tool, order, id) =>
  call(gw.client, tool, { order_id: order, amount_cents: 700 }, { "io.idem/call_id": id }, { timeout: 15000 })
    .catch((e) => ({ code: e.code, message: e.message }));
const status = (r) => r._meta?.["io.idem/status"] ?? body(r)?.status;
const text = (r) => r.content?.[0]?.text ?? r.message ?? "";

for (const [tag, tool, kind, again] of [["a", "refund_payment", "refund", "succeeded"],
                                         ["b", "charge_card", "charge", "outcome_unknown"]]) {
  const order = `o_${tag}`;
  fs.writeFileSync(`${ledger}.fill`, full);
  const first = await ask(tool, order, `${tag}1`);
  fs.rmSync(`${ledger}.fill`);
  check(first.isError === true && status(first) === "outcome_unknown",
        `${tag}: full disk: the client gets an outcome_unknown tool result, not a JSON-RPC error`, first);
  check(/ran and its executor reported that it took effect/.test(text(first)) &&
        /could not record/.test(text(first)) && /disk is full/.test(text(first)) &&
        !/safe to call/.test(text(first)), `${tag}: the words: it ran, it could not be recorded, not "safe"`,
        text(first));
  check(count(kind, order) === 1, `${tag}: applied once`, ledgerOf(ledger));
  fs.rmSync(full);
  const t0 = Date.now();
  const second = await ask(tool, order, `${tag}1`);
  check(status(second) === again && Date.now() - t0 < 10000,
        `${tag}: disk freed: the re-issue is answered ${again} (${Date.now() - t0} ms)`, second);
  check(count(kind, order) === 1, `${tag}: still applied once`, ledgerOf(ledger));
}

// c: a WAIT on the loop, re-armed by its poll, fires again
{
  const args = { order_id: "o_c", amount_cents: 700 };
  const holder = spawn(idem, ["exec", "--policy", path.join(here, "policy.json"), "--log", log,
                              "--session", "sess_1", "--call", "c1", "--tool", "charge_card",
                              "--timeout", "20000", "--args", JSON.stringify(args), "--", "sleep", "6"],
                       { stdio: "ignore" });
  const held = new Promise((r) => holder.on("exit", r));
  const t = Date.now();
  while (show("sess_1", "c1")?.pgid == null && Date.now() - t < 10000) await sleep(20);
  const t0 = Date.now();
  const r = await ask("charge_card", "o_c", "c1");
  check(status(r) === "in_progress" && Date.now() - t0 < 10000,
        `c: the call waiting for another live process is answered in_progress (${Date.now() - t0} ms)`, r);
  await held;
}

await gw.close();
check(!sanitizerSaid(gw.stderr()), "nothing from the sanitizers", gw.stderr());
done();
