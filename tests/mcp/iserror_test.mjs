// isError is not a verdict (SPEC 6a as amended; issue 26) through `idem
// mcp`, with the SDK's own client in front and an SDK server behind
// (fetch_server.mjs) whose refund handler calls an HTTP payment provider
// (idem-paysim, which does not dedupe) and gives up after 300 ms.  Every
// case counts the refunds in the provider's ledger.
//
//   node iserror_test.mjs PATH/TO/idem PATH/TO/idem-paysim
//
//  a. the provider holds the refund 1 s, then applies it (paysim late): the
//     handler's fetch aborts at 300 ms and the SDK answers isError.  Under
//     the default on_is_error that ENDED the attempt without a verdict: the
//     status tool (by key) says "not applied" - not YET - so the call is
//     outcome_unknown (never failed, never "safe to call again") and never
//     sent again; the model's re-issue at once is fenced; 1.6 s after the
//     first call the re-issue is already_applied.  One refund.
//  b. settle_ms 500, and a provider that never applies (a 503): within
//     settle_ms the re-issue is fenced; after it, it runs once.
//  c. on_is_error "not_applied" (the policy's word that this server's
//     isError means nothing was applied): a verdict, so the call is retried
//     with its key at once (here against a 503 that did apply nothing).
import fs from "node:fs";
import path from "node:path";
import { spawn, execFileSync } from "node:child_process";
import { idem, here, check, done, tmpdir, ledgerOf, connect, call, sanitizerSaid } from "./lib.mjs";

const paysim = process.argv[3];
if (!paysim) {
  console.error(`usage: node ${process.argv[1]} PATH/TO/idem PATH/TO/idem-paysim`);
  process.exit(2);
}
const dir = tmpdir("iserror");
const log = `sqlite:${dir}/log.db`;
const ledger = `${dir}/ledger.jsonl`;
const sent = `${dir}/sent`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const show = (session, callId) =>
  JSON.parse(execFileSync(idem, ["show", "--log", log, "--json", session, callId], { encoding: "utf8" }));
const refunds = (order) => ledgerOf(ledger).filter((e) => e.order_id === order).length;
const posts = (key) => (fs.existsSync(sent) ? fs.readFileSync(sent, "utf8").split("\n") : []).filter((k) => k === key).length;
async function until(what, f, ms = 15000) {
  const t = Date.now();
  while (!f()) {
    if (Date.now() - t > ms) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

// the provider, without dedupe: a second POST with a key is a second refund
const portFile = `${dir}/port`;
const sim = spawn(paysim, ["--ledger", ledger, "--port", "0", "--port-file", portFile, "--no-dedupe"],
                  { stdio: ["ignore", "ignore", fs.openSync(`${dir}/paysim.log`, "w")] });
const simExit = new Promise((r) => sim.once("exit", (code, sig) => r({ code, sig })));
await until("the provider's port", () => fs.existsSync(portFile));
const provider = `http://127.0.0.1:${Number(fs.readFileSync(portFile, "utf8"))}`;
async function mode(m) {
  const r = await fetch(`${provider}/_mode`, { method: "POST", body: JSON.stringify(m) });
  if (r.status !== 200) throw new Error(`cannot set mode ${JSON.stringify(m)}: ${r.status}`);
}

function policy(name, extra = {}) {
  const file = `${dir}/${name}.policy.json`;
  fs.writeFileSync(file, JSON.stringify({
    unknown_tools: "refuse",
    tools: {
      refund_payment: {
        class: "guarded", timeout_ms: 5000, key_arg: "idempotency_key", fence: ["order_id"],
        status: { tool: "get_refund_status", arguments: { idempotency_key: "{$key}" }, applied_when: "key_present" },
        ...extra,
      },
      get_refund_status: { class: "read_only" },
    },
  }));
  return file;
}

const server = ["node", path.join(here, "fetch_server.mjs"), provider, sent];
const told = []; // every answer the model got
const statusOf = (r) => r.structuredContent?.status ?? r._meta?.["io.idem/status"];
// An answer that ran nothing and says so honestly (SPEC 6a): an error
// result whose text is the envelope's message, outcome_unknown - never
// failed, never "safe to call again" (the server's own words it quotes
// may say "failed": paysim's 503 does).
function notRun(r) {
  const env = r.structuredContent;
  return r.isError === true && env?.status === "outcome_unknown" && r.content?.[0]?.text === env.message &&
    !/safe to call|did not take effect/i.test(env.message);
}
async function closed(tag, gw) {
  const exit = await gw.close();
  check(exit.code === 0 && !sanitizerSaid(gw.stderr()), `${tag}: the gateway exits 0, nothing from the sanitizers`,
        exit, gw.stderr());
}

// ---- a: the handler's fetch gives up, the provider applies 1 s later
{
  const tag = "a";
  const gw = await connect({ policy: policy("base"), log, session: tag, server });
  const args = { order_id: "o26", amount_cents: 2600 };
  const c = async (id) => { const r = await call(gw.client, "refund_payment", args, { "io.idem/call_id": id }); told.push(r); return r; };
  await mode({ mode: "late", count: 1, stall_ms: 1000 });

  const t0 = Date.now();
  const first = await c("c1");
  const key = show(tag, "c1").key;
  check(notRun(first) && /isError/.test(first.structuredContent.message) &&
        first.structuredContent.check_with?.tool === "get_refund_status",
        `${tag}: the SDK's isError (its fetch gave up) is outcome_unknown, in its words; not failed, not "safe to call ` +
        `again"`, first);
  const rec = show(tag, "c1");
  check(rec.state === "in_doubt" && rec.attempts === 1 && posts(key) === 1,
        `${tag}: c1 is in doubt after one attempt, sent once (the status check's "not applied" is not yet)`, rec, posts(key));
  const again = await c("c2"); // the model re-issues it at once
  check(notRun(again) && again.structuredContent.duplicate_of === "c1",
        `${tag}: the model's re-issue at once is fenced (outcome_unknown, duplicate_of c1)`, again);
  const t = Date.now() - t0;
  check(refunds("o26") === 0 && t < 1000, `${tag}: ... all while the provider held it (${t} ms, nothing applied yet)`,
        ledgerOf(ledger));

  await sleep(1600 - (Date.now() - t0)); // the refund lands meanwhile
  check(refunds("o26") === 1, `${tag}: the provider applied the refund the handler gave up on`, ledgerOf(ledger));
  const later = await c("c3");
  check(!later.isError && later._meta?.["io.idem/status"] === "already_applied" &&
        later._meta["io.idem/duplicate_of"] === "c1",
        `${tag}: the re-issue 1.6 s after the first call is already_applied (duplicate_of c1)`, later);
  const end = await c("c1");
  check(!end.isError && end._meta?.["io.idem/status"] === "succeeded", `${tag}: c1 again: succeeded`, end, show(tag, "c1"));
  check(refunds("o26") === 1 && posts(key) === 1, `${tag}: one refund in the provider's ledger, one POST`,
        ledgerOf(ledger), posts(key));
  await closed(tag, gw);
}

// ---- b: settle_ms 500, and a provider that never applies
{
  const tag = "b";
  const gw = await connect({ policy: policy("settle", { settle_ms: 500 }), log, session: tag, server });
  const args = { order_id: "o26s", amount_cents: 2600 };
  const c = async (id) => { const r = await call(gw.client, "refund_payment", args, { "io.idem/call_id": id }); told.push(r); return r; };
  await mode({ mode: "fail", count: 1 });
  const t0 = Date.now();
  const first = await c("s1");
  const soon = await c("s2");
  const t = Date.now() - t0;
  check(notRun(first) && notRun(soon) && soon.structuredContent.duplicate_of === "s1" && t < 500,
        `${tag}: a 503 behind isError is outcome_unknown, and within settle_ms (${t} ms) the re-issue is fenced`,
        first, soon);
  await sleep(700 - (Date.now() - t0));
  const past = await c("s3");
  check(!past.isError && statusOf(past) !== "outcome_unknown" && refunds("o26s") === 1,
        `${tag}: past settle_ms the re-issue runs, once`, past, ledgerOf(ledger));
  await closed(tag, gw);
}

// ---- c: on_is_error "not_applied": the server's isError is a verdict
{
  const tag = "c";
  const gw = await connect({ policy: policy("notapplied", { on_is_error: "not_applied", retries: 1, backoff_ms: 10 }),
                             log, session: tag, server });
  const args = { order_id: "o26n", amount_cents: 2600 };
  await mode({ mode: "fail", count: 1 });
  const r = await call(gw.client, "refund_payment", args, { "io.idem/call_id": "n1" });
  const key = show(tag, "n1").key;
  check(!r.isError && posts(key) === 2 && show(tag, "n1").attempts === 2 && refunds("o26n") === 1,
        `${tag}: under on_is_error "not_applied" the isError is a verdict: retried at once with its key, one refund`,
        r, show(tag, "n1"));
  await closed(tag, gw);
}

check(told.every((r) => statusOf(r) !== "failed" && !/safe to call|did not take effect/i.test(JSON.stringify(r))),
      "the model was never told failed, nor safe to call again");
sim.kill("SIGTERM");
const exit = await simExit;
check(exit.code === 0, "the provider stops cleanly", exit);
fs.rmSync(dir, { recursive: true, force: true });
done();
