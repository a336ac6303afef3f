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
import path from "node:path";
import { here, check, tmpdir, connect, call } from "./lib.mjs";
import { sleep, startPaysim, refundPolicy, show as showIn, sentLines, statusOf, notRun, closed,
         finish } from "./paysim.mjs";

const dir = tmpdir("iserror");
const log = `sqlite:${dir}/log.db`;
const sent = `${dir}/sent`;
const show = (session, callId) => showIn(log, session, callId);
const posts = (key) => sentLines(sent, key);
const sim = await startPaysim(dir);
const { refunds, mode } = sim;
const ledger = sim.ledger;
const policy = (name, extra) => refundPolicy(dir, name, extra);

const server = ["node", path.join(here, "fetch_server.mjs"), sim.url, sent];
const told = []; // every answer the model got

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
        ledger());

  await sleep(1600 - (Date.now() - t0)); // the refund lands meanwhile
  check(refunds("o26") === 1, `${tag}: the provider applied the refund the handler gave up on`, ledger());
  const later = await c("c3");
  check(!later.isError && later._meta?.["io.idem/status"] === "already_applied" &&
        later._meta["io.idem/duplicate_of"] === "c1",
        `${tag}: the re-issue 1.6 s after the first call is already_applied (duplicate_of c1)`, later);
  const end = await c("c1");
  check(!end.isError && end._meta?.["io.idem/status"] === "succeeded", `${tag}: c1 again: succeeded`, end, show(tag, "c1"));
  check(refunds("o26") === 1 && posts(key) === 1, `${tag}: one refund in the provider's ledger, one POST`,
        ledger(), posts(key));
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
        `${tag}: past settle_ms the re-issue runs, once`, past, ledger());
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

await finish(told, sim, dir);
