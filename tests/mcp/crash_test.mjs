// The gateway killed mid-call (SIGKILL) and restarted: each refund is
// applied once, checked against the provider's ledger.
//
//   node crash_test.mjs PATH/TO/idem
//
// 1. SIGKILL from outside while the server has applied the refund and not
//    answered: the restarted gateway finds the action pending under a dead
//    owner and reconciles it with the status tool.
// 2. SIGKILL from inside at each crash point of SPEC 11 (IDEM_CRASH_AT):
//    whatever the point, the call re-issued once the server has followed
//    its gateway ends succeeded with one refund.  A gateway that died after
//    recording the attempt and before any answer (after_pending_commit)
//    ended it without a verdict (SPEC 6a): under the default policy the
//    re-issue is outcome_unknown - never failed - and nothing is applied;
//    under settle_ms 0 (this server applies its refunds itself: its effects
//    end with its process group) it runs once.
import fs from "node:fs";
import { execFileSync } from "node:child_process";
import { idem, check, done, tmpdir, ledgerOf, connect, payments, body, call, sanitizerSaid } from "./lib.mjs";

const dir = tmpdir("crash");
const ledger = `${dir}/ledger`;
const log = `sqlite:${dir}/log.db`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const show = (s, c) => JSON.parse(execFileSync(idem, ["show", "--log", log, "--json", s, c], { encoding: "utf8" }));
const alive = (pid) => { try { process.kill(pid, 0); return true; } catch { return false; } };
async function until(what, f, ms = 15000) {
  const t = Date.now();
  while (!f()) {
    if (Date.now() - t > ms) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

// ---- 1. killed from outside after the provider applied the refund
{
  fs.writeFileSync(`${ledger}.stall`, "");
  const gw = await connect({ log, server: payments(ledger) });
  await gw.client.listTools();
  const args = { order_id: "o9", amount_cents: 900 };
  const pending = call(gw.client, "refund_payment", args, { "io.idem/call_id": "toolu_9" }).catch((e) => e);
  await until("the refund in the ledger", () => ledgerOf(ledger).some((e) => e.order_id === "o9"));
  const server = Number(fs.readFileSync(`${ledger}.pid`, "utf8"));
  process.kill(gw.pid, "SIGKILL");
  const exit = await gw.exited;
  check(exit.sig === "SIGKILL", "the gateway was killed mid-call", exit);
  await pending;
  await until("the server to follow its gateway", () => !alive(server));
  check(show("sess_1", "toolu_9").state === "pending", "the action is left pending", show("sess_1", "toolu_9"));
  fs.unlinkSync(`${ledger}.stall`);

  const gw2 = await connect({ log, server: payments(ledger) });
  const r = await call(gw2.client, "refund_payment", args, { "io.idem/call_id": "toolu_9" });
  const rec = show("sess_1", "toolu_9");
  check(!r.isError && rec.state === "succeeded" && rec.resolution === "reconciled",
        "the restarted gateway reconciles it: succeeded", r, rec);
  check(ledgerOf(ledger).filter((e) => e.order_id === "o9").length === 1, "one refund for o9 in the ledger",
        ledgerOf(ledger));
  await gw2.close();
  check(!sanitizerSaid(gw2.stderr()), "nothing from the sanitizers", gw2.stderr());
}

// ---- 2. killed at each crash point
// the same policy, with settle_ms 0 for the refund
const local = `${dir}/local.policy.json`;
{
  const p = JSON.parse(fs.readFileSync(new URL("./policy.json", import.meta.url), "utf8"));
  p.tools.refund_payment.settle_ms = 0;
  fs.writeFileSync(local, JSON.stringify(p));
}
for (const point of ["after_pending_commit", "after_downstream_return", "before_outcome_commit",
                     "after_outcome_commit"]) {
  const order = `o-${point}`, callId = `call-${point}`;
  const args = { order_id: order, amount_cents: 100 };
  const gw = await connect({ log, server: payments(ledger), env: { IDEM_CRASH_AT: point } });
  const first = await call(gw.client, "refund_payment", args, { "io.idem/call_id": callId }).catch((e) => e);
  const exit = await gw.exited;
  check(first instanceof Error && exit.sig === "SIGKILL", `${point}: the gateway died there`, exit, String(first));
  // SPEC 6a: until the server (its process group) has followed its gateway,
  // an attempt may still land, and a resume would be told outcome_unknown
  const server = Number(fs.readFileSync(`${ledger}.pid`, "utf8"));
  await until("the server to follow its gateway", () => !alive(server));
  const refunds = () => ledgerOf(ledger).filter((e) => e.order_id === order).length;
  let gw2 = await connect({ log, server: payments(ledger) });
  let r = await call(gw2.client, "refund_payment", args, { "io.idem/call_id": callId });
  if (point === "after_pending_commit") {
    // the log cannot tell whether the dead gateway sent the call: its
    // death is no verdict, and by default the attempt may still land
    const env = r.structuredContent;
    check(r.isError && env?.status === "outcome_unknown" && !/safe to call|did not take effect/i.test(env.message) &&
          refunds() === 0,
          `${point}: under the default policy the re-issued call is outcome_unknown, nothing applied`, r,
          show("sess_1", callId));
    await gw2.close();
    check(!sanitizerSaid(gw2.stderr()), "nothing from the sanitizers", gw2.stderr());
    gw2 = await connect({ policy: local, log, server: payments(ledger) });
    r = await call(gw2.client, "refund_payment", args, { "io.idem/call_id": callId });
  }
  const n = refunds();
  check(!r.isError && body(r).order_id === order && n === 1,
        `${point}: the re-issued call succeeds${point === "after_pending_commit" ? " under settle_ms 0" : ""}, ` +
        `one refund in the ledger`, r, n, show("sess_1", callId));
  await gw2.close();
  check(!sanitizerSaid(gw2.stderr()), "nothing from the sanitizers", gw2.stderr());
}

fs.rmSync(dir, { recursive: true, force: true });
done();
