// What a JSON-RPC error proves (SPEC §10 as amended; issue 27, item 2):
// only -32700, -32600 and -32601 prove a tools/call was not processed.
// Through `idem mcp`, with the SDK's own client in front and an SDK
// McpServer behind (fetch_server.mjs) whose refund handler POSTs to an HTTP
// payment provider (idem-paysim, which does not dedupe).  Every case counts
// the refunds in the provider's ledger.
//
//   node rpcerror_test.mjs PATH/TO/idem PATH/TO/idem-paysim
//
//  a. the handler applies the refund and hands back a result the SDK's own
//     check (after the handler ran) refuses: -32602.  No verdict: the
//     status tool is asked and finds the refund, so the call succeeded
//     (never failed), and the model's re-issue is already_applied.
//  b. the same, while the provider queues the refund (a 504 at once, the
//     refund applied 1 s later): the status tool says "not yet", so the
//     call is outcome_unknown, not sent again, the re-issue fenced; 1.6 s
//     on, the re-issue is already_applied.  One refund.
//  c. structuredContent that fails the tool's outputSchema: SDK 1.15
//     answered -32602, the SDK pinned here answers isError - after the
//     handler ran either way: never failed, the status tool finds it.
//  d. a server without the tool's method (-32601): nothing was processed -
//     a verdict: the client gets the server's error as it is, no status
//     check, and a re-issue is sent again (not fenced).
import path from "node:path";
import { here, check, tmpdir, connect, call } from "./lib.mjs";
import { sleep, startPaysim, refundPolicy, show as showIn, sentLines, statusOf, notRun, closed,
         finish } from "./paysim.mjs";

const dir = tmpdir("rpcerror");
const log = `sqlite:${dir}/log.db`;
const sent = `${dir}/sent`;
const show = (session, callId) => showIn(log, session, callId);
const sim = await startPaysim(dir);
const policy = refundPolicy(dir, "base");
const server = (mode) => ["node", path.join(here, "fetch_server.mjs"), sim.url, sent, mode];
const told = []; // every answer the model got
const refundOf = (order) => ({ order_id: order, amount_cents: 2700 });
// The model's call id of order: the tool result (kept in told), or the
// JSON-RPC error it was answered with ({code, message}).
const ask = (gw, id, order) =>
  call(gw.client, "refund_payment", refundOf(order), { "io.idem/call_id": id })
    .then((r) => { told.push(r); return r; }, (e) => ({ code: e.code, message: e.message.slice(0, 300) }));
const applied = (r) => r.content && !r.isError && statusOf(r) !== "outcome_unknown";
const alreadyApplied = (r, of) =>
  applied(r) && statusOf(r) === "already_applied" && r._meta["io.idem/duplicate_of"] === of;
const oneRefund = (tag, order, key) =>
  check(sim.refunds(order) === 1 && sentLines(sent, key) === 1, `${tag}: one refund in the provider's ledger, one POST`,
        sim.ledger());

// ---- a: -32602 after the handler applied the refund
{
  const tag = "a";
  const gw = await connect({ policy, log, session: tag, server: server("bad-result") });
  const c = (id) => ask(gw, id, "o27a");
  const first = await c("a1");
  const key = show(tag, "a1").key;
  check(applied(first) && statusOf(first) === "succeeded" && sentLines(sent, `?${key}`) === 1,
        `${tag}: the SDK's -32602 after the handler ran is no verdict: the status tool is asked, finds the refund: ` +
        `succeeded`, first, show(tag, "a1"));
  const again = await c("a2");
  check(alreadyApplied(again, "a1"), `${tag}: the model's re-issue is already_applied (duplicate_of a1)`, again);
  oneRefund(tag, "o27a", key);
  await closed(tag, gw);
}

// ---- b: -32602, and the provider applies the refund a second later
{
  const tag = "b";
  const gw = await connect({ policy, log, session: tag, server: server("bad-result") });
  const c = (id) => ask(gw, id, "o27b");
  await sim.mode({ mode: "queued", count: 1, stall_ms: 1000 });
  const t0 = Date.now();
  const first = await c("b1");
  const key = show(tag, "b1").key;
  check(notRun(first) && /-32602/.test(first.structuredContent.message) && sentLines(sent, `?${key}`) >= 1,
        `${tag}: -32602 with the refund still queued: outcome_unknown after a status check, in the server's words`,
        first);
  const rec = show(tag, "b1");
  check(rec.state === "in_doubt" && rec.attempts === 1, `${tag}: b1 is in doubt after one attempt`, rec);
  const again = await c("b2");
  check(notRun(again) && again.structuredContent.duplicate_of === "b1" && Date.now() - t0 < 1000 &&
        sim.refunds("o27b") === 0,
        `${tag}: the model's re-issue at once is fenced (outcome_unknown, duplicate_of b1) while the refund is queued`,
        again, sim.ledger());
  await sleep(1600 - (Date.now() - t0));
  const later = await c("b3");
  check(alreadyApplied(later, "b1"), `${tag}: the re-issue 1.6 s after the first call is already_applied ` +
        `(duplicate_of b1)`, later);
  oneRefund(tag, "o27b", key);
  await closed(tag, gw);
}

// ---- c: structuredContent that fails the outputSchema
{
  const tag = "c";
  const gw = await connect({ policy, log, session: tag, server: server("bad-output") });
  const c = (id) => ask(gw, id, "o27c");
  const first = await c("c1");
  const again = await c("c2");
  check(statusOf(first) === "succeeded" && statusOf(again) === "already_applied" && sim.refunds("o27c") === 1,
        `${tag}: output that fails the outputSchema (the handler ran): the status tool finds it; the re-issue ` +
        `already_applied; one refund`, first, again, sim.ledger());
  await closed(tag, gw);
}

// ---- d: -32601, the server has no such method: a verdict
{
  const tag = "d";
  const gw = await connect({ policy, log, session: tag, server: server("no-tools") });
  const c = (id) => ask(gw, id, "o27d");
  const first = await c("d1");
  const rec = show(tag, "d1");
  check(first.code === -32601 && rec.state === "failed" && rec.attempts === 1,
        `${tag}: -32601 proves nothing was processed: failed after one attempt, the server's error as it is`,
        first, rec);
  const again = await c("d2");
  check(again.code === -32601 && show(tag, "d2").attempts === 1,
        `${tag}: a re-issue is not fenced: it is sent, and the server answers it -32601 again`, again, show(tag, "d2"));
  await closed(tag, gw);
}

await finish(told, sim, dir, ", for a refund the handler sent");
