// The gateway killed at random moments, Streamable HTTP on both sides:
// `idem mcp --listen 127.0.0.1:0 -- http://…/mcp` in front of the payments
// provider over HTTP, an SDK client (StreamableHTTPClientTransport) in front.
//
//   node http_crash_test.mjs PATH/TO/idem [TRIALS]
//
// TRIALS defaults to $IDEM_HTTP_CRASH_TRIALS, else 200; $IDEM_HTTP_CRASH_JOBS
// trials run at once (default 2).  One provider serves every trial (fresh
// order ids per trial); it does NOT dedupe on the key (LEDGER.nodedupe), so
// every send that reaches it shows in its ledger, and it applies each refund
// after a random delay (LEDGER.late, 0-LATE_MAX ms) whether or not the
// caller is still there.
//
// Each trial: start the gateway, the client calls refund_payment with a
// fresh _meta io.idem/call_id, and the gateway is SIGKILLed at a random
// moment - before the call is sent, while the provider holds it, or after
// the answer.  The gateway is restarted on the same --log and the same call
// id re-issued (at once, or once the late apply has landed) until the answer
// is definite: succeeded, already_applied or failed (outcome_unknown and
// in_progress are asked again, a bounded number of times).  Then, once every
// apply could have landed, the provider's ledger: at most one refund per
// order (else "double"), and exactly one when idem said succeeded or
// already_applied (else "lost"); none when it said failed.
import fs from "node:fs";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { idem, here, tmpdir, ledgerOf, call } from "./lib.mjs";
import { check, finish, sleep, startUpstream, startGateway, httpClient, sanitizerSaid, watchdog } from "./http_peers.mjs";

watchdog(870000); // (CTest's TIMEOUT is 900 s)

const trials = Number(process.argv[3] ?? process.env.IDEM_HTTP_CRASH_TRIALS ?? 200);
const jobs = Math.max(1, Number(process.env.IDEM_HTTP_CRASH_JOBS ?? 2));
const LATE_MAX = 250;          // the provider applies 0-250 ms after the call arrives
const SETTLE_MS = 1000;        // the policy's bound on a late landing (>> LATE_MAX)
const REISSUE_MAX = 80;        // answers outcome_unknown / in_progress before we give up
const REISSUE_GAP = 75;        // ms between them

const dir = tmpdir("httpcrash");
const log = `sqlite:${dir}/log.db`;
const session = `hc_${process.pid}`;
const policy = `${dir}/policy.json`;
{
  const p = JSON.parse(fs.readFileSync(path.join(here, "policy.json"), "utf8"));
  Object.assign(p.tools.refund_payment, { timeout_ms: 1000, reconcile_timeout_ms: 1500, settle_ms: SETTLE_MS });
  fs.writeFileSync(policy, JSON.stringify(p));
}
const up = await startUpstream(dir, `${dir}/ledger`);
fs.writeFileSync(`${up.ledger}.nodedupe`, "");
console.log(`upstream ${path.basename(up.script)} at ${up.url}; ${trials} trials, ${jobs} at a time`);

const connectTimes = [];
const estConnect = () => (connectTimes.length ? connectTimes.reduce((a, b) => a + b, 0) / connectTimes.length : 60);
const results = [];
const sanitizer = [];
const statusCount = {};
const phaseCount = { before: 0, during: 0, after: 0 };
const modeCount = { at_once: 0, after_landing: 0 };
const seenCount = {};  // every answer to a re-issue, the intermediate ones too
let askedMore = 0;     // trials that needed more than one re-issue
let gatewayErrors = 0;
const t00 = performance.now();

// The status a guarded answer carries; a plain result (executed now) is
// "succeeded", a plain isError result the server's own failure.
function statusOf(result) {
  const s = result?._meta?.["io.idem/status"];
  if (typeof s === "string") return s;
  return result?.isError ? "failed" : "succeeded";
}

async function trial(i) {
  const order = `hord_${process.pid}_${i}`;
  const callId = `hcall_${process.pid}_${i}`;
  const late = Math.floor(Math.random() * (LATE_MAX + 1));
  fs.writeFileSync(`${up.ledger}.late`, String(late)); // (another job may overwrite it: any value will do)
  const args = { order_id: order, amount_cents: 100 + i };
  const meta = { "io.idem/call_id": callId, "io.idem/session": session };
  const r = { i, order, callId, late, answers: [] };

  // ---- the first gateway, killed at a random moment
  const gw = await startGateway({ policy, log, upstream: up.url, extra: ["--session", session] });
  const t0 = performance.now();
  const killAt = Math.random() * (estConnect() + late + 150);
  let killedAt = null, sentAt = null, answeredAt = null;
  const abort = new AbortController();
  const killer = sleep(killAt).then(async () => {
    killedAt = performance.now() - t0;
    await gw.kill("SIGKILL");
    abort.abort();
  });
  let c;
  try {
    c = await httpClient(gw.url, { ms: 5000 });
    connectTimes.push(performance.now() - t0);
    if (killedAt === null) {
      sentAt = performance.now() - t0;
      const first = await call(c.client, "refund_payment", args, meta, { timeout: 8000, signal: abort.signal });
      answeredAt = performance.now() - t0;
      r.first = statusOf(first);
    }
  } catch (e) {
    r.first = `error: ${e.message ?? e}`;
  }
  await killer;
  try { await c?.client.close(); } catch {}
  if (sanitizerSaid(gw.stderr())) sanitizer.push(gw.stderr());
  r.phase = sentAt === null || killedAt < sentAt ? "before" : answeredAt !== null && answeredAt <= killedAt ? "after" : "during";
  phaseCount[r.phase]++;

  // ---- restarted on the same log; the same call id until a definite answer
  r.mode = Math.random() < 0.5 ? "at_once" : "after_landing";
  modeCount[r.mode]++;
  if (r.mode === "after_landing" && r.phase !== "before") { // (nothing sent: nothing to land)
    const t = performance.now();
    while (performance.now() - t < LATE_MAX + 400 && !ledgerOf(up.ledger).some((e) => e.order_id === order))
      await sleep(20);
  }
  const gw2 = await startGateway({ policy, log, upstream: up.url, extra: ["--session", session] });
  let c2;
  try {
    c2 = await httpClient(gw2.url, { ms: 5000 });
    for (let n = 0; n < REISSUE_MAX; n++) {
      let s;
      try {
        const res = await call(c2.client, "refund_payment", args, meta, { timeout: 8000 });
        s = statusOf(res);
        if (r.answers.length < 4) r.answers.push(res);
      } catch (e) {
        s = `error: ${e.message ?? e}`;
        if (r.answers.length < 4) r.answers.push(s);
      }
      r.final = s;
      seenCount[s.startsWith("error: ") ? "error" : s] = (seenCount[s.startsWith("error: ") ? "error" : s] ?? 0) + 1;
      r.asked = n + 1;
      if (!["outcome_unknown", "in_progress"].includes(s) && !s.startsWith("error: ")) break;
      await sleep(REISSUE_GAP);
    }
  } catch (e) {
    r.final = `error: ${e.message ?? e}`;
    gatewayErrors++;
  }
  if (r.asked > 1) askedMore++;
  try { await c2?.close(); } catch {}
  await gw2.kill("SIGTERM");
  if (sanitizerSaid(gw2.stderr())) sanitizer.push(gw2.stderr());
  statusCount[r.final] = (statusCount[r.final] ?? 0) + 1;
  results.push(r);
}

let next = 0;
async function worker() {
  while (next < trials) {
    const i = next++;
    try {
      await trial(i);
    } catch (e) {
      gatewayErrors++;
      results.push({ i, order: `hord_${process.pid}_${i}`, final: `error: ${e.message ?? e}`, answers: [] });
      statusCount.harness_error = (statusCount.harness_error ?? 0) + 1;
    }
    if ((i + 1) % 50 === 0) console.log(`  ${i + 1} trials, ${((performance.now() - t00) / 1000).toFixed(1)} s`);
  }
}
await Promise.all(Array.from({ length: jobs }, worker));

// every send that reached the provider has landed by now
await sleep(LATE_MAX + 500);
const byOrder = new Map();
for (const e of ledgerOf(up.ledger)) byOrder.set(e.order_id, [...(byOrder.get(e.order_id) ?? []), e]);
let double = 0, lost = 0, falseFailed = 0, undecided = 0, unguarded = 0;
const bad = [];
for (const r of results) {
  const refunds = byOrder.get(r.order) ?? [];
  unguarded += refunds.filter((e) => !e.meta_key).length;
  const said = r.final;
  let what = null;
  if (refunds.length > 1) { double++; what = "double"; }
  else if ((said === "succeeded" || said === "already_applied") && refunds.length !== 1) { lost++; what = "lost"; }
  else if (said === "failed" && refunds.length !== 0) { falseFailed++; what = "failed, yet applied"; }
  else if (!["succeeded", "already_applied", "failed"].includes(said)) { undecided++; what = "no definite answer"; }
  if (what) bad.push({ what, trial: r.i, phase: r.phase, mode: r.mode, late: r.late, first: r.first, final: said, asked: r.asked,
                       refunds, answers: r.answers });
}
const secs = ((performance.now() - t00) / 1000).toFixed(1);
console.log(`totals: ${results.length} trials in ${secs} s; double ${double}, lost ${lost}, ` +
            `failed-yet-applied ${falseFailed}, no definite answer ${undecided}, unguarded sends ${unguarded}`);
console.log(`  killed: ${JSON.stringify(phaseCount)}; re-issued: ${JSON.stringify(modeCount)}; ` +
            `final answers: ${JSON.stringify(statusCount)}; mean connect ${estConnect().toFixed(0)} ms`);
console.log(`  all answers to re-issues: ${JSON.stringify(seenCount)}; ${askedMore} trials needed more than one`);
for (const b of bad.slice(0, 5)) console.log("  " + JSON.stringify(b).slice(0, 1500));
if (bad.length) {
  console.log(`  repro: one provider (${path.basename(up.script)} LEDGER --port 0 --port-file F, touch ` +
              `LEDGER.nodedupe, echo LATE > LEDGER.late), ${idem} mcp --policy P --log L --session S ` +
              `--listen 127.0.0.1:0 -- URL with P = policy.json + refund_payment {timeout_ms:1000, settle_ms:${SETTLE_MS}}; ` +
              `call refund_payment with _meta io.idem/call_id, SIGKILL the gateway at the phase above, restart, re-issue`);
}

check(results.length === trials && gatewayErrors === 0, `all ${trials} trials ran (gateway start/connect errors: ${gatewayErrors})`,
      results.filter((r) => r.final?.startsWith("error")).slice(0, 3).map((r) => r.final));
check(double === 0, `no order refunded twice (${double} double)`);
check(lost === 0, `every succeeded / already_applied has its one refund (${lost} lost)`);
check(falseFailed === 0, `no failed answer for a refund that was applied (${falseFailed})`);
check(undecided === 0, `every trial ends with a definite answer within ${REISSUE_MAX} re-issues (${undecided} not)`);
check(unguarded === 0, `every refund the provider applied came through the guard (meta_key set; ${unguarded} not)`);
check(trials < 20 || (phaseCount.before > 0 && phaseCount.during > 0 && phaseCount.after > 0),
      "the kills cover before the call, during it and after the answer", phaseCount);
check(sanitizer.length === 0, "no sanitizer report on any gateway's stderr", sanitizer[0]?.slice(-2000));
await finish(dir); // (kept, with the log, ledger and policy, when a check failed)
