// The refund story of SPEC 10 through `idem mcp` over MCP Streamable HTTP,
// on both sides: the official SDK's StreamableHTTPClientTransport in front
// of `idem mcp --listen 127.0.0.1:0`, and behind it the payments provider
// over HTTP (http_payments_server.mjs, the SDK's
// StreamableHTTPServerTransport) that wants a bearer token.  The provider
// does not dedupe (LEDGER.nodedupe): every send that reaches it shows in
// its ledger, which is counted every time.
//
//   node http_story_test.mjs PATH/TO/idem
//
//  0. the peers, straight: the SDK client lists and refunds with the token;
//     without it the provider answers 401
//  a. a repeat (the same _meta io.idem/call_id) is replayed; the client's
//     Authorization reached the provider unchanged
//  b. without _meta, the call id is the JSON-RPC id scoped to the client's
//     MCP session: the same id again in the same Mcp-Session-Id is a replay,
//     the same id in another session is another call
//  c. the provider applies and never answers (LEDGER.stall): reconciled by
//     the status tool, succeeded; the repeat replays
//  d. the gateway's client to the provider gives up at timeout_ms while the
//     refund lands later (LEDGER.late): outcome_unknown, the re-issue (new
//     call id, same args) fenced, and once it landed already_applied
//  e. a client that disconnects mid-call - the SDK client closed, a raw
//     fetch aborted - one refund; the same call id later gets the result
//  f. _meta claudecode/toolUseId retried under a new JSON-RPC id: replayed;
//     so is a key given with --call-id-meta
//  g. no token, a wrong token: the provider's 401 and its WWW-Authenticate
//     reach the client unchanged (the SDK client throws its 401)
//  h. a stdio client, the gateway with its own credential (--header
//     'Authorization: Bearer {$env:UPSTREAM_KEY}'): one refund, a replay;
//     the key is in none of idem's command line, stderr, log; a wrong key
//     gets the provider's 401, and its value shows nowhere either
//  i. the HTTP front with its own credential: clients authenticate with
//     $IDEM_MCP_TOKEN (else, on loopback, not at all); the provider gets the
//     gateway's key, never the client's token
//  j. SIGKILL of the gateway mid-call, restarted on the same --log: the same
//     call id is reconciled or replayed, never refunded twice
//  k. a stateless provider answering JSON (enableJsonResponse): replay and
//     reconciliation as above
import fs from "node:fs";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { tmpdir, ledgerOf, connect, body, call } from "./lib.mjs";
import { here, check, sanitizerSaid, sleep, until, bounded, statusOf, watchdog, finish, section, startUpstream,
         startGateway, httpClient, tryPost, initializeMsg, rawSession, bytesOf, showRecord } from "./http_peers.mjs";

watchdog(280000);
const dir = tmpdir("httpstory");
const ledger = `${dir}/ledger`;
const logFile = `${dir}/log.db`;
const log = `sqlite:${logFile}`;
const policy = path.join(here, "policy.json"); // refund_payment: timeout_ms 1500, status get_refund_status
const TOK = "tok_client_" + Math.random().toString(36).slice(2);
const KEY = "sk_upstream_" + Math.random().toString(36).slice(2) + Math.random().toString(36).slice(2);
const ITOK = "idem_front_" + Math.random().toString(36).slice(2);
const S = "story"; // the _meta io.idem/session of the call-id cases
fs.writeFileSync(`${ledger}.nodedupe`, "");

const refunds = (order) => ledgerOf(ledger).filter((e) => e.order_id === order).length;
const show = (session, callId) => showRecord(log, session, callId);
const T = { timeout: 20000 };
const refund = (client, order, amount, meta, opts = {}) =>
  call(client, "refund_payment", { order_id: order, amount_cents: amount }, meta, { ...T, ...opts });
const replayed = (r) => !r.isError && r._meta?.["io.idem/replayed"] === true;
const notRun = (r) => r.isError === true && r.structuredContent?.status === "outcome_unknown" &&
  !/safe to call|did not take effect/i.test(r.structuredContent.message ?? "");
// the same call again while the gateway still waits for it: in_progress; ask until it is not (bounded)
async function settled(f, ms = 10000) {
  const t = Date.now();
  for (;;) {
    const r = await f();
    if (statusOf(r) !== "in_progress" || Date.now() - t > ms) return r;
    await sleep(200);
  }
}
const gateways = [];
const gateway = async (o) => { const g = await startGateway({ policy, log, ...o }); gateways.push(g); return g; };
const rm = (f) => fs.rmSync(f, { force: true });

// ---- 0: the peers, straight
const up = await startUpstream(dir, ledger, ["--token", TOK]);
let directTools;
await section("0", async () => {
  const d = await httpClient(up.url, { token: TOK });
  directTools = await d.client.listTools();
  const r = await refund(d.client, "o-direct", 1, undefined);
  check(!r.isError && body(r).order_id === "o-direct" && refunds("o-direct") === 1,
        "0: the provider, straight, with the token: a refund (ledger 1)", r);
  await d.close();
  let err;
  try { await httpClient(up.url, {}); } catch (e) { err = e; }
  check(err?.code === 401, "0: the provider, straight, without the token: 401", String(err));
});

let g1 = await gateway({ upstream: up.url });
console.log(`     gateway at ${g1.url}, provider at ${up.url}`);
const cA = await httpClient(g1.url, { token: TOK });

// ---- a: replay
await section("a", async () => {
  const tools = await cA.client.listTools();
  check(JSON.stringify(tools) === JSON.stringify(directTools), "a: tools/list passes through unchanged", tools, directTools);
  const m = { "io.idem/session": S, "io.idem/call_id": "toolu_1" };
  const r = await refund(cA.client, "o1", 6000, m);
  check(!r.isError && body(r).refund_id && body(r).order_id === "o1" && refunds("o1") === 1,
        `a: a refund goes through (ledger ${refunds("o1")})`, r);
  const r2 = await refund(cA.client, "o1", 6000, m);
  check(replayed(r2) && body(r2).refund_id === body(r).refund_id && refunds("o1") === 1,
        `a: its repeat is replayed with io.idem/replayed (ledger ${refunds("o1")})`, r2);
  const sent = up.calls().filter((c) => c.tool === "refund_payment" && c.meta?.["io.idem/key"] && JSON.stringify(c).includes("toolu_1"));
  check(sent.length === 1 && sent[0].auth === "token#0",
        "a: the provider got it once, under the client's own Authorization", up.calls().slice(-3));
});

// ---- b: the JSON-RPC id, scoped to the client's MCP session
await section("b", async () => {
  const rs = await rawSession(g1.url, { token: TOK });
  check(!!rs.session, "b: the gateway gives the raw client an Mcp-Session-Id", rs.session);
  const args = { order_id: "o-rpc", amount_cents: 700 };
  const x1 = await rs.call(7, "refund_payment", args);
  const r1 = x1.answer(7)?.result;
  check(x1.status === 200 && r1 && !r1.isError && body(r1).order_id === "o-rpc" && refunds("o-rpc") === 1,
        `b: tools/call id 7 without _meta: refunded (ledger ${refunds("o-rpc")})`, x1.status, x1.text);
  const x2 = await rs.call(7, "refund_payment", args);
  const r2 = x2.answer(7)?.result;
  check(r2 && replayed(r2) && body(r2).refund_id === body(r1).refund_id && refunds("o-rpc") === 1,
        `b: id 7 again in the same Mcp-Session-Id is a replay (ledger ${refunds("o-rpc")})`, x2.status, x2.text);
  const rs2 = await rawSession(g1.url, { token: TOK });
  const x3 = await rs2.call(7, "refund_payment", { order_id: "o-rpc2", amount_cents: 800 });
  const r3 = x3.answer(7)?.result;
  check(rs2.session !== rs.session && r3 && !r3.isError && body(r3).order_id === "o-rpc2" && refunds("o-rpc2") === 1,
        "b: id 7 in another Mcp-Session-Id with other arguments is another call, no conflict", x3.status, x3.text);
});

// ---- c: applied, never answered: reconciled
await section("c", async () => {
  fs.writeFileSync(`${ledger}.stall`, "");
  const m = { "io.idem/session": S, "io.idem/call_id": "toolu_2" };
  const t0 = Date.now();
  const r = await refund(cA.client, "o2", 2500, m);
  rm(`${ledger}.stall`);
  check(!r.isError && statusOf(r) === "succeeded" && Date.now() - t0 >= 1400 && body(r).order_id === "o2",
        `c: applied but unanswered within timeout_ms: reconciled by the status tool, succeeded (${Date.now() - t0} ms)`,
        r, show(S, "toolu_2"));
  const r2 = await refund(cA.client, "o2", 2500, m);
  check(replayed(r2) && refunds("o2") === 1, `c: its repeat is replayed (ledger ${refunds("o2")})`, r2);
});

// ---- d: the gateway's client gives up, the refund lands later
await section("d", async () => {
  const LATE = 2600;
  fs.writeFileSync(`${ledger}.late`, String(LATE));
  const c = (id) => refund(cA.client, "o3", 3300, { "io.idem/session": S, "io.idem/call_id": id });
  const t0 = Date.now();
  const first = await c("d1");
  check(notRun(first) && refunds("o3") === 0,
        `d: at the deadline (${Date.now() - t0} ms) the refund is outcome_unknown, nothing landed yet`, first,
        show(S, "d1"));
  const again = await c("d2");
  check(notRun(again) && again.structuredContent?.duplicate_of === "d1" && refunds("o3") === 0,
        `d: the model's re-issue at once (new call id, same args) is fenced, duplicate_of d1 (${Date.now() - t0} ms)`, again);
  await until("the late refund to land", () => refunds("o3") > 0, LATE + 3000);
  rm(`${ledger}.late`);
  await sleep(400); // its answer, when the gateway still reads it
  const later = await c("d3");
  check(!later.isError && statusOf(later) === "already_applied" && later._meta?.["io.idem/duplicate_of"] === "d1",
        "d: once it landed, the re-issue is already_applied (duplicate_of d1)", later, show(S, "d1"));
  const end = await settled(() => c("d1"));
  check(!end.isError && statusOf(end) === "succeeded" && body(end)?.order_id === "o3",
        "d: d1 again: succeeded", end, show(S, "d1"));
  await sleep(300);
  check(refunds("o3") === 1, `d: one refund in the ledger (${refunds("o3")})`, ledgerOf(ledger).filter((e) => e.order_id === "o3"));
});

// ---- e: the client goes away mid-call
await section("e", async () => {
  fs.writeFileSync(`${ledger}.late`, "1200");
  // e1: the SDK client closed (its fetch aborted, its transport gone)
  const m = { "io.idem/session": S, "io.idem/call_id": "toolu_dc" };
  const cX = await httpClient(g1.url, { token: TOK });
  const p = refund(cX.client, "o4", 400, m).then((v) => ({ answered: v }), (e) => ({ rejected: String(e) }));
  await sleep(300);
  await cX.close();
  const gone = await bounded(p, 5000, "the closed client's call to end");
  check(gone.rejected, "e1: the client closed mid-call gets no answer", gone);
  await until("the refund to land", () => refunds("o4") > 0, 5000);
  await sleep(300);
  const cY = await httpClient(g1.url, { token: TOK });
  const r = await settled(() => refund(cY.client, "o4", 400, m));
  check(!r.isError && statusOf(r) === "succeeded" && body(r)?.order_id === "o4" && refunds("o4") === 1,
        `e1: a new connection, the same call id: the result (ledger ${refunds("o4")})`, r, show(S, "toolu_dc"));
  await cY.close();

  // e2: a raw client's fetch aborted mid-call; the same JSON-RPC id again in its Mcp-Session-Id
  const rs = await rawSession(g1.url, { token: TOK });
  const ac = new AbortController();
  const q = rs.call(9, "refund_payment", { order_id: "o5", amount_cents: 500 }, undefined, { signal: ac.signal })
    .then((v) => ({ answered: v.text }), (e) => ({ rejected: String(e) }));
  await sleep(300);
  ac.abort();
  const q1 = await bounded(q, 5000, "the aborted fetch to end");
  check(q1.rejected, "e2: the raw client aborts its fetch mid-call", q1);
  await until("the refund to land", () => refunds("o5") > 0, 5000);
  await sleep(300);
  let x;
  const t = Date.now();
  do {
    x = await rs.call(9, "refund_payment", { order_id: "o5", amount_cents: 500 });
    if (statusOf(x.answer(9)?.result) !== "in_progress") break;
    await sleep(200);
  } while (Date.now() - t < 10000);
  const r2 = x.answer(9)?.result;
  check(r2 && !r2.isError && statusOf(r2) === "succeeded" && body(r2)?.order_id === "o5" && refunds("o5") === 1,
        `e2: the same JSON-RPC id in the same Mcp-Session-Id later gets the result (ledger ${refunds("o5")})`,
        x.status, x.text);
  rm(`${ledger}.late`);
});

// ---- f: claudecode/toolUseId
await section("f", async () => {
  const m = { "claudecode/toolUseId": "toolu_01ClaudeCode" };
  const r = await refund(cA.client, "o6", 600, m);
  const r2 = await refund(cA.client, "o6", 600, m); // the SDK gives it a new JSON-RPC id
  check(!r.isError && replayed(r2) && body(r2).refund_id === body(r).refund_id && refunds("o6") === 1,
        `f: _meta claudecode/toolUseId names the call: its retry under a new JSON-RPC id is replayed (ledger ${refunds("o6")})`,
        r, r2);
});

// ---- f2: --call-id-meta KEY: a harness's own tool-call id
await section("f2", async () => {
  const g = await gateway({ upstream: up.url, extra: ["--call-id-meta", "my.harness/tool_call"] });
  const c = await httpClient(g.url, { token: TOK });
  const m = { "my.harness/tool_call": "call_77" };
  const r = await refund(c.client, "o7", 700, m);
  const r2 = await refund(c.client, "o7", 700, m);
  check(!r.isError && replayed(r2) && body(r2).refund_id === body(r).refund_id && refunds("o7") === 1,
        `f2: --call-id-meta my.harness/tool_call names the call: its retry is replayed (ledger ${refunds("o7")})`, r, r2);
  await c.close();
  await g.stop();
});

// ---- g: the provider's 401 reaches the client unchanged
await section("g", async () => {
  const n0 = up.requests().length;
  let err;
  try { await httpClient(g1.url, {}); } catch (e) { err = e; }
  console.log(`     (the SDK client says: ${String(err).slice(0, 300)})`);
  check(err && (err.code === 401 || /401|unauthori/i.test(err.message)),
        "g: the SDK client without a token: its connect fails with the provider's 401", String(err), err?.code);
  const init = initializeMsg();
  const x = await tryPost(g1.url, init, { ms: 8000 });
  check(x.status === 401 && x.headers.get("www-authenticate") === 'Bearer realm="payments"',
        "g: raw, no Authorization: 401 with the provider's WWW-Authenticate, unchanged", x.status,
        x.headers.get("www-authenticate"), x.text);
  const y = await tryPost(g1.url, init, { token: "wrong", ms: 8000 });
  check(y.status === 401 && y.headers.get("www-authenticate") === 'Bearer realm="payments", error="invalid_token"',
        "g: raw, a wrong token: 401 with the provider's WWW-Authenticate, unchanged", y.status,
        y.headers.get("www-authenticate"), y.text);
  const seen = up.requests().slice(n0);
  check(seen.some((l) => l.auth === "none" && l.status === 401) && seen.some((l) => l.auth === "bad" && l.status === 401),
        "g: ... the 401s are the provider's (it saw both requests)", seen);
});

// ---- h: a stdio client; the gateway's own credential
const up2 = await startUpstream(dir, ledger, ["--token", KEY]);
await section("h", async () => {
  const gw = await connect({ log, session: "stdio", server: [up2.url],
                             extra: ["--header", "Authorization: Bearer {$env:UPSTREAM_KEY}"], env: { UPSTREAM_KEY: KEY } });
  const m = { "io.idem/call_id": "s1" };
  const r = await refund(gw.client, "o-stdio", 900, m);
  const r2 = await refund(gw.client, "o-stdio", 900, m);
  check(!r.isError && body(r).order_id === "o-stdio" && replayed(r2) && body(r2).refund_id === body(r).refund_id &&
        refunds("o-stdio") === 1, `h: stdio client, HTTP provider: one refund, the repeat replayed (ledger ${refunds("o-stdio")})`,
        r, r2, gw.stderr());
  check(up2.calls().filter((c) => c.tool === "refund_payment").every((c) => c.auth === "token#0") &&
        up2.calls().some((c) => c.tool === "refund_payment"),
        "h: the provider got the call under the gateway's own key", up2.calls());
  const cmdline = fs.readFileSync(`/proc/${gw.pid}/cmdline`, "utf8");
  const ps = execFileSync("ps", ["-ww", "-o", "args=", "-p", String(gw.pid)], { encoding: "utf8" });
  check(!cmdline.includes(KEY) && !ps.includes(KEY),
        "h: the key is not in idem's command line (/proc/PID/cmdline, ps)", ps);
  const exit = await gw.close();
  check(!gw.stderr().includes(KEY), "h: ... nor in its stderr", gw.stderr());
  check(!bytesOf(logFile).includes(KEY), "h: ... nor in the log's bytes (log.db, -wal, -shm)");
  check(exit.code === 0 && !sanitizerSaid(gw.stderr()), "h: the gateway exits 0 when the client closes", exit, gw.stderr());
});

// ---- h2: a wrong own credential: the provider's 401, and the value nowhere
await section("h2", async () => {
  const WRONG = "sk_wrong_" + Math.random().toString(36).slice(2);
  let gw, said = "", stderr = "";
  try {
    gw = await connect({ log, session: "stdio", server: [up2.url],
                         extra: ["--header", "Authorization: Bearer {$env:UPSTREAM_KEY}"], env: { UPSTREAM_KEY: WRONG } });
    const r = await refund(gw.client, "o-wrong", 1, { "io.idem/call_id": "w1" });
    said = JSON.stringify(r);
  } catch (e) {
    said = String(e?.stack ?? e);
  }
  if (gw) { stderr = gw.stderr(); await bounded(gw.close(), 10000, "the gateway to exit").catch(() => {}); stderr = gw.stderr(); }
  console.log(`     (told: ${said.slice(0, 200)})`);
  check(refunds("o-wrong") === 0 && !said.includes(WRONG) && !stderr.includes(WRONG) && !bytesOf(logFile).includes(WRONG),
        "h2: a wrong key: nothing refunded, and its value is in no answer, no stderr, no log", said.slice(0, 600), stderr);
});

// ---- i: the HTTP front with the gateway's own credential
await section("i", async () => {
  const own = ["--header", "Authorization: Bearer {$env:UPSTREAM_KEY}"];
  const g = await gateway({ upstream: up2.url, extra: own, env: { UPSTREAM_KEY: KEY, IDEM_MCP_TOKEN: ITOK } });
  const n0 = up2.requests().length;
  for (const [what, token] of [["no token", undefined], ["the provider's own key", KEY], ["a wrong token", "nope"]]) {
    let err;
    try { await httpClient(g.url, { token }); } catch (e) { err = e; }
    check(err && (err.code === 401 || /401|unauthori/i.test(err.message)),
          `i: $IDEM_MCP_TOKEN set, a client with ${what} is refused (401)`, String(err));
  }
  check(up2.requests().length === n0, "i: ... and nothing reached the provider", up2.requests().slice(n0));
  const c = await httpClient(g.url, { token: ITOK });
  const m = { "io.idem/session": S, "io.idem/call_id": "front_1" };
  const r = await refund(c.client, "o-front", 1100, m);
  const r2 = await refund(c.client, "o-front", 1100, m);
  check(!r.isError && replayed(r2) && refunds("o-front") === 1,
        `i: with Bearer $IDEM_MCP_TOKEN: one refund, the repeat replayed (ledger ${refunds("o-front")})`, r, r2);
  const seen = up2.requests().slice(n0);
  check(seen.length > 0 && seen.every((l) => l.auth === "token#0"),
        "i: the provider got every request under the gateway's key, never the client's token", seen);
  await c.close();
  const cmdline = fs.readFileSync(`/proc/${g.pid}/cmdline`, "utf8");
  check(!cmdline.includes(KEY) && !cmdline.includes(ITOK) && !g.stderr().includes(KEY) && !g.stderr().includes(ITOK),
        "i: neither secret is in idem's command line or stderr", cmdline, g.stderr());
  await g.stop();

  const g2 = await gateway({ upstream: up2.url, extra: own, env: { UPSTREAM_KEY: KEY, IDEM_MCP_TOKEN: undefined } });
  const n1 = up2.requests().length;
  const c2 = await httpClient(g2.url, {});
  const r3 = await refund(c2.client, "o-loop", 1200, { "io.idem/session": S, "io.idem/call_id": "loop_1" });
  check(!r3.isError && refunds("o-loop") === 1, "i: no $IDEM_MCP_TOKEN, on loopback: a client without a token is served", r3);
  await c2.close();
  const c3 = await httpClient(g2.url, { token: "whatever-the-client-has" });
  await c3.client.listTools();
  await c3.close();
  const seen2 = up2.requests().slice(n1);
  check(seen2.length > 0 && seen2.every((l) => l.auth === "token#0"),
        "i: ... and whatever the client presents, the provider gets the gateway's key", seen2);
  await g2.stop();
});

// ---- j: SIGKILL of the gateway, restarted on the same log
await section("j", async () => {
  // j1: the provider applied and never answers; the gateway dies
  fs.writeFileSync(`${ledger}.stall`, "");
  const c = await httpClient(g1.url, { token: TOK });
  const m1 = { "io.idem/session": S, "io.idem/call_id": "kill_1" };
  const p = refund(c.client, "o-k1", 1300, m1).then((v) => ({ answered: v }), (e) => ({ rejected: String(e) }));
  await until("the refund to land", () => refunds("o-k1") > 0, 5000);
  check(!sanitizerSaid(g1.stderr()), "j: nothing from the sanitizers before the kill", g1.stderr());
  const exit = await g1.kill("SIGKILL");
  check(exit.sig === "SIGKILL", "j1: the gateway is SIGKILLed mid-call", exit);
  await bounded(p, 10000, "the killed gateway's call to end");
  await c.close();
  rm(`${ledger}.stall`);
  g1 = await gateway({ upstream: up.url });
  const c2 = await httpClient(g1.url, { token: TOK });
  const r = await settled(() => refund(c2.client, "o-k1", 1300, m1));
  check(!r.isError && statusOf(r) === "succeeded" && refunds("o-k1") === 1,
        `j1: restarted on the same log, the same call id is reconciled: succeeded (ledger ${refunds("o-k1")})`, r,
        show(S, "kill_1"));
  const again = await refund(c2.client, "o1", 6000, { "io.idem/session": S, "io.idem/call_id": "toolu_1" });
  check(replayed(again) && refunds("o1") === 1, "j1: ... and toolu_1 of before the kill replays", again);

  // j2: killed before the provider applied it (LEDGER.late); restarted at once
  fs.writeFileSync(`${ledger}.late`, "1800");
  const m2 = { "io.idem/session": S, "io.idem/call_id": "kill_2" };
  const q = refund(c2.client, "o-k2", 1400, m2).then((v) => ({ answered: v }), (e) => ({ rejected: String(e) }));
  await sleep(300);
  await g1.kill("SIGKILL");
  await bounded(q, 10000, "the killed gateway's call to end");
  await c2.close();
  g1 = await gateway({ upstream: up.url });
  const c3 = await httpClient(g1.url, { token: TOK });
  const early = await refund(c3.client, "o-k2", 1400, m2);
  check(refunds("o-k2") <= 1 && ["outcome_unknown", "in_progress", "succeeded"].includes(statusOf(early)),
        `j2: restarted at once, the same call id is not sent again while the first may land: ${statusOf(early)}`, early,
        show(S, "kill_2"));
  await until("the late refund to land", () => refunds("o-k2") > 0, 5000);
  rm(`${ledger}.late`);
  await sleep(300);
  // the model re-issues it before it was told the outcome: fenced; then the first call id gets it
  const other = await refund(c3.client, "o-k2", 1400, { "io.idem/session": S, "io.idem/call_id": "kill_2b" });
  check(!other.isError && statusOf(other) === "already_applied" && other._meta?.["io.idem/duplicate_of"] === "kill_2",
        "j2: once it landed, a re-issue under a new call id: already_applied (duplicate_of kill_2)", other,
        show(S, "kill_2"));
  const late = await settled(() => refund(c3.client, "o-k2", 1400, m2));
  check(!late.isError && statusOf(late) === "succeeded", "j2: ... and the same call id: succeeded", late,
        show(S, "kill_2"));
  await sleep(2000); // anything sent twice would have landed by now
  check(refunds("o-k1") === 1 && refunds("o-k2") === 1,
        `j: one refund each (o-k1 ${refunds("o-k1")}, o-k2 ${refunds("o-k2")})`, ledgerOf(ledger));
  await c3.close();
});

// ---- k: a stateless provider answering JSON
await section("k", async () => {
  const up3 = await startUpstream(dir, ledger, ["--token", TOK, "--stateless", "--json"]);
  const g = await gateway({ upstream: up3.url });
  const c = await httpClient(g.url, { token: TOK });
  const m = { "io.idem/session": S, "io.idem/call_id": "sl_1" };
  const r = await refund(c.client, "o-sl", 1500, m);
  const r2 = await refund(c.client, "o-sl", 1500, m);
  check(!r.isError && replayed(r2) && refunds("o-sl") === 1,
        `k: stateless JSON provider: one refund, the repeat replayed (ledger ${refunds("o-sl")})`, r, r2);
  fs.writeFileSync(`${ledger}.stall`, "");
  const s = await refund(c.client, "o-sl2", 1600, { "io.idem/session": S, "io.idem/call_id": "sl_2" });
  rm(`${ledger}.stall`);
  check(!s.isError && statusOf(s) === "succeeded" && refunds("o-sl2") === 1,
        `k: applied, unanswered: reconciled, succeeded (ledger ${refunds("o-sl2")})`, s, show(S, "sl_2"));
  await c.close();
  const e = await g.stop();
  check(e.sig !== "SIGKILL" && !sanitizerSaid(g.stderr()), "k: the gateway stops on SIGTERM, nothing from the sanitizers",
        e, g.stderr());
  await up3.stop();
});

await cA.close();
const e1 = await g1.stop();
check(e1.sig !== "SIGKILL" && !sanitizerSaid(g1.stderr()), "the gateway stops on SIGTERM, nothing from the sanitizers",
      e1, g1.stderr());
check(gateways.every((g) => !g.stderr().includes(KEY) && !g.stderr().includes(ITOK)),
      "no gateway's stderr holds a secret it was given");
check(!bytesOf(logFile).includes(KEY) && !bytesOf(logFile).includes(ITOK), "the log's bytes hold neither secret");
await finish(dir);
