// Attempts still in flight (SPEC 6a) through `idem mcp`, with the SDK's own
// client: a refund that lands 1.5 s after its request, behind a gateway
// whose deadline (timeout_ms) is 300 ms.  Every case counts the refunds in
// the provider's ledger.
//
//   node inflight_test.mjs PATH/TO/idem
//
// Reproduction 3 of the issue, without idem: a server that applies 1.5 s
// after the request and does not dedupe made 3 refunds, the model was told
// "failed ... safe to call again", and its re-issue made a 4th.  Here:
//  a. a server that does not dedupe, and a status tool: the deadline answers
//     outcome_unknown (never "failed", never "safe to call again"); the same
//     call id and a new one, re-issued during the hang, are not run; after
//     the landing the new call id is already_applied and the first call
//     succeeded.  One refund.
//  b. the same with a server that dedupes on the key.
//  c. the same without a status tool: only the server's own (late) answer
//     can settle it.
//  In a-c the gateway does not cancel the request at its deadline, so the
//  SDK server's answer, sent when the refund lands, is recorded (resolution
//  late) - had the server been sent notifications/cancelled, the SDK would
//  have dropped it.
//  d. settle_ms 500 in the policy: within deadline + settle_ms a re-issue is
//     not run; past it, "not applied" lets the guard run the call again with
//     its key (SPEC 6a: settle_ms is the policy's word that nothing lands
//     later) - a second refund when the provider does not dedupe, none when
//     it does.
//  e. kill -9 of the gateway during the hang, a new gateway at once: the
//     re-issued call is not run while the old server's process group lives.
//     A server that finishes its work on SIGTERM: once it is gone the
//     status tool finds the refund.  The SDK server, which SIGTERM ends
//     before the refund lands: its death ENDED the attempt but is no
//     verdict (SPEC 6a as amended: a server may have handed the refund to a
//     provider that applies it later), so under the default policy c1 and a
//     re-issue stay outcome_unknown; under settle_ms 0 - this server's
//     effects end with its process group, it applies them itself - the
//     gone group finishes the attempt, and c1 runs once.  One refund.
import fs from "node:fs";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { idem, here, check, done, tmpdir, ledgerOf, connect, body, call, sanitizerSaid } from "./lib.mjs";

const dir = tmpdir("inflight");
const log = `sqlite:${dir}/log.db`;
const TIMEOUT = 300; // the gateway's deadline
const LATE = 1500; // the refund lands this long after its request
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const show = (session, callId) =>
  JSON.parse(execFileSync(idem, ["show", "--log", log, "--json", session, callId], { encoding: "utf8" }));
// A process that can still do something: it exists and is not a zombie
// (dead, waiting to be reaped; the guard counts it as gone too).
function alive(pid) {
  let stat;
  try { stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8"); } catch { return false; }
  return !/^[ZX]$/.test(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0]);
}
const lines = (f) => (fs.existsSync(f) ? fs.readFileSync(f, "utf8").split("\n").filter(Boolean) : []);
async function until(what, f, ms = 15000) {
  const t = Date.now();
  while (!f()) {
    if (Date.now() - t > ms) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

function policy(name, extra = {}) {
  const file = `${dir}/${name}.policy.json`;
  fs.writeFileSync(file, JSON.stringify({
    unknown_tools: "refuse",
    tools: {
      refund_payment: {
        class: "guarded", timeout_ms: TIMEOUT, reconcile_timeout_ms: 5000, key_arg: "idempotency_key",
        status: { tool: "get_refund_status", arguments: { order_id: "{order_id}" }, applied_when: "key_present" },
        ...extra,
      },
      charge_card: { class: "guarded", timeout_ms: TIMEOUT, key_arg: "idempotency_key", ...extra },
      get_refund_status: { class: "read_only" },
    },
  }));
  return file;
}

// The payments server with the switches of inflight_server.mjs; LEDGER.late
// makes each refund land `late` ms after its request.
function provider(tag, { late = LATE, dedupe = false } = {}) {
  const ledger = `${dir}/${tag}.ledger`;
  fs.writeFileSync(`${ledger}.late`, String(late));
  if (!dedupe) fs.writeFileSync(`${ledger}.nodedupe`, "");
  return { ledger, server: ["node", path.join(here, "inflight_server.mjs"), ledger] };
}

const statusOf = (r) => r.structuredContent?.status ?? r._meta?.["io.idem/status"];
// An answer that ran nothing and says so honestly: an error result whose
// text is the envelope's message, never "failed", never "safe to call again".
function notRun(r, allowed = ["outcome_unknown", "in_progress"]) {
  const env = r.structuredContent;
  return r.isError === true && allowed.includes(env?.status) && r.content?.[0]?.text === env.message &&
    !/safe to call|failed/i.test(env.message);
}
// The words the gateway adds to a success a status check found (SPEC 7).
const WENT_THROUGH = /^The refund_payment call went through \(a status check with get_refund_status found it applied\); the check's result is included\. Do not call refund_payment again/;
const wentThrough = (r) => r.content?.length >= 2 && WENT_THROUGH.test(r.content.at(-1).text) &&
  r._meta?.["io.idem/message"] === r.content.at(-1).text;

async function closed(tag, gw) {
  const exit = await gw.close();
  check(exit.code === 0 && !sanitizerSaid(gw.stderr()), `${tag}: the gateway exits 0, nothing from the sanitizers`,
        exit, gw.stderr());
}

// ---- a, b, c: the refund lands after the deadline
async function landsLate({ tag, tool, dedupe }) {
  const { ledger, server } = provider(tag, { dedupe });
  const hasStatus = tool === "refund_payment";
  const gw = await connect({ policy: policy("base"), log, session: tag, server });
  const args = { order_id: `o-${tag}`, amount_cents: 100 };
  const c = (id) => call(gw.client, tool, args, { "io.idem/call_id": id });
  const n = () => ledgerOf(ledger).length;

  const t0 = Date.now();
  const first = await c("c1");
  check(notRun(first, ["outcome_unknown"]) &&
        (hasStatus ? first.structuredContent.check_with?.tool === "get_refund_status" : !first.structuredContent.check_with),
        `${tag}: at the deadline the call is outcome_unknown (isError; not failed, not "safe to call again")`, first);
  const same = await c("c1");
  check(notRun(same), `${tag}: the same call id re-issued during the hang is not run (${statusOf(same)})`, same);
  const other = await c("c2");
  check(notRun(other, ["outcome_unknown"]) && other.structuredContent.duplicate_of === "c1",
        `${tag}: a new call id re-issued during the hang is not run, duplicate_of c1`, other);
  const t = Date.now() - t0;
  check(n() === 0 && t < LATE, `${tag}: ... all during the hang (${t} ms, nothing applied yet)`, ledgerOf(ledger));
  const rec = show(tag, "c1");
  check(rec.state === "in_doubt" && rec.attempts === 1, `${tag}: c1 is in doubt after one attempt`, rec);

  // the landing: the server's answer, not cancelled, is recorded
  await until("the refund to land", () => n() > 0);
  await until("the late answer recorded", () => show(tag, "c1").state !== "in_doubt", 5000);
  const late = show(tag, "c1");
  check(late.state === "succeeded" && late.resolution === "late" && body(late.result)?.refund_id === "re_1" &&
        !lines(`${ledger}.cancelled`).includes(rec.key),
        `${tag}: the server got no notifications/cancelled, and its late answer is recorded (resolution late)`,
        late, lines(`${ledger}.cancelled`));

  // the model's re-issue with a new call id, then the first call again
  const later = await c("c3");
  check(!later.isError && later._meta?.["io.idem/status"] === "already_applied" &&
        later._meta["io.idem/duplicate_of"] === "c1" && later._meta["io.idem/replayed"] === true &&
        later.content?.length > 0,
        `${tag}: after the landing a new call id with the same arguments is already_applied (duplicate_of c1)`, later);
  const again = await c("c1");
  check(!again.isError && again._meta?.["io.idem/status"] === "succeeded" && again._meta["io.idem/replayed"] === true &&
        body(again).refund_id === "re_1", `${tag}: ... and c1 replays succeeded (${show(tag, "c1").resolution})`, again);
  check(n() === 1, `${tag}: the ledger shows exactly one refund`, ledgerOf(ledger));
  await closed(tag, gw);
}

await landsLate({ tag: "a-nodedupe", tool: "refund_payment", dedupe: false });
await landsLate({ tag: "b-dedupe", tool: "refund_payment", dedupe: true });
await landsLate({ tag: "c-nostatus", tool: "charge_card", dedupe: false });

// ---- d: settle_ms 500 - the policy's word that nothing lands later
async function settles({ tag, dedupe }) {
  const SETTLE = 500, LANDS = 2500; // the re-issue at 1100 ms falls between
  const { ledger, server } = provider(tag, { late: LANDS, dedupe });
  const gw = await connect({ policy: policy("settle", { settle_ms: SETTLE }), log, session: tag, server });
  const args = { order_id: `o-${tag}`, amount_cents: 100 };
  const c = (id) => call(gw.client, "refund_payment", args, { "io.idem/call_id": id });
  const n = () => ledgerOf(ledger).length;

  const t0 = Date.now();
  const first = await c("c1");
  const soon = await c("c1");
  const tSoon = Date.now() - t0;
  check(notRun(first, ["outcome_unknown"]) && notRun(soon) && show(tag, "c1").attempts === 1 &&
        tSoon < TIMEOUT + SETTLE,
        `${tag}: within deadline + settle_ms (${tSoon} ms) the re-issue is not run`, first, soon, show(tag, "c1"));
  await sleep(1100 - (Date.now() - t0));
  const past = await c("c1");
  const tPast = Date.now() - t0, rec = show(tag, "c1");
  check(rec.attempts === 2 && rec.key === show(tag, "c1").key && notRun(past) && n() === 0 && tPast < LANDS,
        `${tag}: past deadline + settle_ms and before the landing (${tPast} ms), "not applied" runs c1 again ` +
        `with its key (SPEC 6a); that attempt is in doubt too`, past, rec);
  if (dedupe) {
    await sleep(LANDS + 1500 - (Date.now() - t0));
    check(n() === 1, `${tag}: the provider dedupes on the key: one refund`, ledgerOf(ledger));
  } else {
    await until("the second refund", () => n() === 2);
    check(n() === 2 && ledgerOf(ledger).every((e) => e.idempotency_key === rec.key),
          `${tag}: the provider does not dedupe: two refunds under one key - the price of a settle_ms shorter ` +
          `than the provider can land`, ledgerOf(ledger));
  }
  const end = await c("c1"), how = show(tag, "c1").resolution;
  check(!end.isError && end._meta?.["io.idem/status"] === "succeeded" &&
        (how === "late" ? body(end).refund_id === "re_1" : wentThrough(end)),
        `${tag}: after the landing c1 is succeeded: a late answer recorded, or the status check found it, said in ` +
        `words (${how})`, end);
  await closed(tag, gw);
}

await settles({ tag: "d-settle-nodedupe", dedupe: false });
await settles({ tag: "d-settle-dedupe", dedupe: true });

// ---- e: kill -9 of the gateway during the hang
async function gatewayKilled({ tag, drain }) {
  const { ledger, server } = provider(tag);
  const env = { INFLIGHT_DRAIN: drain ? "1" : "0" };
  const args = { order_id: `o-${tag}`, amount_cents: 100 };
  const n = () => ledgerOf(ledger).length;

  const gw1 = await connect({ policy: policy("base"), log, session: tag, server, env });
  const first = await call(gw1.client, "refund_payment", args, { "io.idem/call_id": "c1" });
  check(notRun(first, ["outcome_unknown"]), `${tag}: at the deadline the call is outcome_unknown`, first);
  const old = Number(fs.readFileSync(`${ledger}.pid`, "utf8"));
  const rec = show(tag, "c1");
  check(rec.state === "in_doubt" && rec.pgid === -old && rec.executor?.split(":")[1] === String(gw1.pid),
        `${tag}: the record names the gateway as executor and the server's process group (pgid ${rec.pgid})`, rec, old);
  process.kill(gw1.pid, "SIGKILL");
  const exit = await gw1.exited;
  check(exit.sig === "SIGKILL" && !sanitizerSaid(gw1.stderr()), `${tag}: the gateway is killed during the hang`, exit);
  fs.unlinkSync(`${ledger}.late`); // a new attempt applies at once

  const gw2 = await connect({ policy: policy("base"), log, session: tag, server, env });
  const c = (id) => call(gw2.client, "refund_payment", args, { "io.idem/call_id": id });
  const before = alive(old), r = await c("c1"), after = alive(old);
  if (after) {
    check(notRun(r) && n() === 0, `${tag}: re-issued at once, while the old server's group lives, c1 is not run ` +
          `(${statusOf(r)})`, r, ledgerOf(ledger));
  } else {
    // the server's death is no verdict: without settle_ms it may still land
    check(notRun(r, ["outcome_unknown"]) && n() === 0,
          `${tag}: re-issued ${before ? "while" : "after"} the old server went, c1 is not run (its death is no verdict)`,
          r, ledgerOf(ledger));
  }
  if (drain) {
    // this server outlives its gateway until its refund has landed
    const other = await c("c2");
    check(after && alive(old) && notRun(other, ["outcome_unknown"]) && other.structuredContent.duplicate_of === "c1" &&
          n() === 0, `${tag}: a new call id meanwhile is not run either, duplicate_of c1`, other);
  }
  await until("the old server to exit", () => !alive(old));
  check(n() === (drain ? 1 : 0),
        drain ? `${tag}: the server ignored SIGTERM and finished the refund before it exited`
              : `${tag}: the gateway's death reached the server as SIGTERM, which ended it before the refund landed`,
        ledgerOf(ledger));
  if (drain) {
    const end = await c("c1");
    check(!end.isError && end._meta?.["io.idem/status"] === "succeeded" && wentThrough(end),
          `${tag}: once the old server is gone the status tool finds the refund: succeeded, said in words`,
          end, show(tag, "c1"));
    check(n() === 1, `${tag}: the ledger shows exactly one refund`, ledgerOf(ledger));
    await closed(tag, gw2);
    return;
  }
  // the server died before its refund landed - but its death ENDED the
  // attempt without a verdict: by default it may still land (SPEC 6a)
  const still = await c("c1"), other = await c("c2");
  check(notRun(still, ["outcome_unknown"]) && notRun(other, ["outcome_unknown"]) &&
        other.structuredContent.duplicate_of === "c1" && n() === 0,
        `${tag}: once the old server is gone, c1 and a new call id are still not run under the default policy ` +
        `(outcome_unknown; not failed, not "safe to call again")`, still, other, show(tag, "c1"));
  await closed(tag, gw2);
  // this server applies its refunds itself: its effects end with its
  // process group (settle_ms 0), and the gone group finishes the attempt
  const gw3 = await connect({ policy: policy("local", { settle_ms: 0 }), log, session: tag, server, env });
  const end = await call(gw3.client, "refund_payment", args, { "io.idem/call_id": "c1" });
  const rec2 = show(tag, "c1");
  check(!end.isError && rec2.state === "succeeded" && rec2.resolution === "executed" && rec2.attempts === 2,
        `${tag}: under settle_ms 0 the gone server's attempt has finished: c1 runs once more, succeeded`,
        end, show(tag, "c1"));
  check(n() === 1, `${tag}: the ledger shows exactly one refund`, ledgerOf(ledger));
  await closed(tag, gw3);
}

await gatewayKilled({ tag: "e-kill-sdk", drain: false });
await gatewayKilled({ tag: "e-kill-drain", drain: true });

fs.rmSync(dir, { recursive: true, force: true });
done();
