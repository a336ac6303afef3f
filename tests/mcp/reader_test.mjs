// "Told" means the answer was written to a client that is still there
// (SPEC §10).  A client that goes away while its refund is in flight never
// reads the answer, so the outcome is not recorded as delivered: the model's
// re-issue under a new call id (the resumed harness) is fenced and answered
// already_applied with the first call's result - never a second refund.
//
//   node reader_test.mjs PATH/TO/idem
//
// Each refund takes 1.5 s at the provider (payments_server.mjs, LEDGER.late)
// and the provider does not dedupe (LEDGER.nodedupe): a second application
// shows in the ledger.  The client, a raw one, leaves 0.5 s into the call:
//   gone      it dies: its ends of the gateway's stdin and stdout close;
//   half      it closes its output (the gateway's stdin is at EOF) and
//             still reads: the answer comes, but is not counted as told;
//   deaf      it stops reading (closes the gateway's stdout) and keeps its
//             output open.
import fs from "node:fs";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { idem, here, check, done, tmpdir, ledgerOf, connect, payments, call, sanitizerSaid, rawGateway, req }
  from "./lib.mjs";

const dir = tmpdir("reader");
const ledger = `${dir}/ledger`;
const log = `sqlite:${dir}/log.db`;
const policy = `${dir}/policy.json`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const show = (c) => JSON.parse(execFileSync(idem, ["show", "--log", log, "--json", "sess_1", c], { encoding: "utf8" }));
{
  const p = JSON.parse(fs.readFileSync(path.join(here, "policy.json"), "utf8"));
  p.tools.refund_payment.timeout_ms = 20000; // the refund finishes: succeeded
  fs.writeFileSync(policy, JSON.stringify(p));
}
fs.writeFileSync(`${ledger}.late`, "1500");
fs.writeFileSync(`${ledger}.nodedupe`, "");
const init = req(0, "initialize", { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "1" } });
const refunds = (order) => ledgerOf(ledger).filter((e) => e.order_id === order).length;

for (const how of ["gone", "half", "deaf"]) {
  const order = `o-${how}`, args = { order_id: order, amount_cents: 700 };
  const g = rawGateway({ policy, log, session: "sess_1", server: payments(ledger) });
  g.send(init);
  await g.byId(0);
  g.send(JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }) + "\n");
  g.send(req(1, "tools/call", { name: "refund_payment", arguments: args,
                                _meta: { "io.idem/call_id": `${how}_1` } }));
  await sleep(500);
  if (how !== "deaf") g.p.stdin.end();
  if (how !== "half") g.p.stdout.destroy();
  if (how === "half") {
    const a = await g.byId(1, 15000).catch(() => null);
    check(a?.result && !a.result.isError, `${how}: the client that still reads gets the answer`, a);
  } else {
    // the answer is written to nobody; then a deaf client leaves too
    for (let i = 0; i < 400 && show(`${how}_1`).state !== "succeeded"; i++) await sleep(50);
    await sleep(300);
    g.p.stdin.end();
  }
  const exit = await g.exited;
  check(exit.sig === null, `${how}: the gateway did not die of a signal (SIGPIPE)`, exit);
  const rec = show(`${how}_1`);
  check(rec.state === "succeeded" && rec.delivered === 0,
        `${how}: the refund succeeded, and is not recorded as told`, rec);
  check(!sanitizerSaid(g.stderr), `${how}: nothing from the sanitizers`, g.stderr);

  // the resumed harness: the model asks again under a new call id
  const gw = await connect({ policy, log, server: payments(ledger) });
  const r = await call(gw.client, "refund_payment", args, { "io.idem/call_id": `${how}_2` });
  check(!r.isError && r._meta?.["io.idem/status"] === "already_applied" &&
        r._meta["io.idem/duplicate_of"] === `${how}_1`,
        `${how}: the re-issue is fenced: already_applied, duplicate of ${how}_1`, r);
  check(refunds(order) === 1, `${how}: one refund in the ledger`, ledgerOf(ledger));
  check(show(`${how}_1`).delivered > 0 && show(`${how}_2`).delivered > 0,
        `${how}: now the model has been told (both records)`, show(`${how}_1`), show(`${how}_2`));
  await gw.close();
  check(!sanitizerSaid(gw.stderr()), `${how}: nothing from the sanitizers (second gateway)`, gw.stderr());
}
fs.rmSync(dir, { recursive: true, force: true });
done();
