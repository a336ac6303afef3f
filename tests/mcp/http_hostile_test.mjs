// The HTTP front of `idem mcp --listen` under hostile requests: raw HTTP
// (node:http, node:net) against the gateway, in front of the payments
// provider over Streamable HTTP.
//
//   node http_hostile_test.mjs PATH/TO/idem
//
// Each bad request gets a clear error (status, and a JSON-RPC error body
// where there is one): bodies over --max-message 413, not JSON 400 (-32700),
// a batch 400 (batches are not supported), an unknown MCP-Protocol-Version
// 400, a foreign Origin 403 (loopback origins allowed), a Host that does not
// name the listening address 403, an unknown or another caller's
// Mcp-Session-Id 404, GET/DELETE per the Streamable HTTP spec, other methods
// 405.  Nothing reaches the provider unguarded (its ledger stays empty
// through the bad requests; a tools/call in a batch never reaches it); a
// client trickling bytes does not hold up a normal client, and is timed
// out; 300 connections at once do not bring the gateway down; after it all
// the gateway still answers a normal call, and its stderr holds no
// sanitizer report.
import http from "node:http";
import net from "node:net";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { here, tmpdir, ledgerOf, call } from "./lib.mjs";
import { check, finish, sleep, startUpstream, startGateway, httpClient, sanitizerSaid, watchdog } from "./http_peers.mjs";

watchdog(870000); // (CTest's TIMEOUT is 900 s)

const PV = "2025-06-18";
// a gateway's address, and whether it is gone
function where(g) {
  const u = new URL(g.url);
  Object.assign(g, { host: u.hostname, port: Number(u.port), hostHeader: `${u.hostname}:${u.port}` });
  Object.defineProperty(g, "gone", { get: () => g.proc.exitCode !== null || g.proc.signalCode !== null });
  return g;
}
const statusOf = (r) => r?._meta?.["io.idem/status"] ?? (r?.isError ? "failed" : "succeeded");
const dir = tmpdir("httphostile");
const up = await startUpstream(dir, `${dir}/ledger`);
const gw = where(await startGateway({ policy: path.join(here, "policy.json"), log: `sqlite:${dir}/log.db`,
                                      upstream: up.url,
                                      extra: ["--session", "hostile", "--request-timeout", "5"] }));
console.log(`gateway at ${gw.url}, upstream ${path.basename(up.script)} at ${up.url}`);
const ledger = () => ledgerOf(up.ledger);

// ---- raw HTTP --------------------------------------------------------------------------

// One request on a fresh connection.  headers: null drops a default one.
// Resolves {status, headers, text, json, messages} or {error} (the
// connection failed or was closed without an answer).  headersOnly: resolve
// at the status line and drop the connection (an SSE stream that stays open).
function request(method, { to = gw, path: p = "/mcp", headers = {}, body, timeout = 10000, headersOnly = false } = {}) {
  const h = { host: to.hostHeader, ...(method === "POST" ? { "content-type": "application/json",
                                                             accept: "application/json, text/event-stream" } : {}),
              ...headers };
  for (const k of Object.keys(h)) if (h[k] === null || h[k] === undefined) delete h[k];
  return new Promise((resolve) => {
    let settled = false;
    const finish = (v) => { if (!settled) { settled = true; clearTimeout(timer); resolve(v); } };
    const req = http.request({ host: to.host, port: to.port, method, path: p, headers: h, agent: false,
                               setHost: false }, (res) => {
      if (headersOnly) {
        finish({ status: res.statusCode, headers: res.headers, text: "" });
        res.destroy();
        return;
      }
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d) => { text += d; });
      res.on("end", () => finish(parsed(res.statusCode, res.headers, text)));
      res.on("error", (e) => finish({ ...parsed(res.statusCode, res.headers, text), error: e.message }));
    });
    const timer = setTimeout(() => { finish({ error: `no answer within ${timeout} ms`, messages: [] }); req.destroy(); }, timeout);
    req.on("error", (e) => finish({ error: e.message, messages: [] }));
    if (body !== undefined) req.write(body);
    req.end();
  });
}

// A response's JSON-RPC messages: a JSON body, or the data of SSE events.
function parsed(status, headers, text) {
  const r = { status, headers, text, messages: [] };
  try { r.json = JSON.parse(text); } catch {}
  if (r.json !== undefined) r.messages = Array.isArray(r.json) ? r.json : [r.json];
  else if (/text\/event-stream/.test(headers["content-type"] ?? "")) {
    for (const ev of text.split(/\r\n\r\n|\n\n|\r\r/)) {
      const data = ev.split(/\r\n|\n|\r/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, ""));
      if (data.length) { try { r.messages.push(JSON.parse(data.join("\n"))); } catch {} }
    }
  }
  return r;
}
const rpcError = (r) => r.messages?.find((m) => m && m.error)?.error;
const brief = (r) => ({ status: r.status, error: r.error, body: (r.text ?? "").slice(0, 300) });

// Raw bytes on a socket; resolves with what came back when the server closes
// (or after ms): {text, closed, ms}.
function rawSocket(bytes, ms = 5000) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const s = net.connect(gw.port, gw.host);
    let text = "", over = false;
    const end = (closed) => { if (!over) { over = true; clearTimeout(timer); s.destroy(); resolve({ text, closed, ms: performance.now() - t0 }); } };
    const timer = setTimeout(() => end(false), ms);
    s.on("connect", () => s.write(bytes));
    s.on("data", (d) => { text += d.toString("latin1"); });
    s.on("end", () => end(true));
    s.on("close", () => end(true));
    s.on("error", () => end(true));
  });
}
const statusLine = (text) => Number(/^HTTP\/1\.[01] (\d{3})/.exec(text)?.[1] ?? 0);

let nextId = 100;
const rpc = (method, params, id = nextId++) => JSON.stringify({ jsonrpc: "2.0", id, method, ...(params ? { params } : {}) });
const refundCall = (order, extra = {}) => ({ name: "refund_payment", arguments: { order_id: order, amount_cents: 1 }, ...extra });

// A session of our own, opened by hand.
async function openSession() {
  const r = await request("POST", { body: rpc("initialize", { protocolVersion: PV, capabilities: {},
                                                               clientInfo: { name: "raw", version: "1" } }, 0) });
  const sid = r.headers?.["mcp-session-id"];
  const n = await request("POST", { headers: { "mcp-session-id": sid, "mcp-protocol-version": PV },
                                    body: JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }) });
  return { sid, init: r, initialized: n };
}
const withSession = (sid, more = {}) => ({ "mcp-session-id": sid, "mcp-protocol-version": PV, ...more });

// The gateway must live through every case: when it is gone, say after
// which case (the repro) and stop.
async function alive(after) {
  if (!gw.gone) return;
  const ex = await gw.exited;
  check(false, `the gateway died after: ${after} (exit ${JSON.stringify(ex)})`, gw.stderr().slice(-3000));
  await finish(dir);
}

// ---- a normal client, timed --------------------------------------------------------------
async function normalCall(tag) {
  const t0 = performance.now();
  try {
    const c = await httpClient(gw.url, { ms: 15000 });
    await c.client.listTools(undefined, { timeout: 15000 });
    const r = await call(c.client, "get_refund_status", { order_id: "none" }, undefined, { timeout: 15000 });
    await c.close();
    let b;
    try { b = JSON.parse(r.content?.[0]?.text ?? "null"); } catch {}
    return { ok: Array.isArray(b?.refunds), ms: performance.now() - t0, r };
  } catch (e) {
    return { ok: false, ms: performance.now() - t0, error: `${tag}: ${e.message ?? e}` };
  }
}

// ---- 0. a session by hand, and a normal client ------------------------------------------
const A = await openSession();
check(A.init.status === 200 && typeof A.sid === "string" && A.sid.length > 0 &&
      A.init.messages.some((m) => m.id === 0 && m.result?.protocolVersion),
      "0: initialize by hand: 200, an Mcp-Session-Id, the initialize result", brief(A.init), A.init.headers);
check(A.initialized.status === 202, "0: notifications/initialized: 202 Accepted", brief(A.initialized));
let r = await request("POST", { headers: withSession(A.sid), body: rpc("ping", undefined, 1) });
check(r.status === 200 && r.messages.some((m) => m.id === 1 && m.result), "0: a ping in that session: 200 and its result", brief(r));
const baseline = await normalCall("baseline");
check(baseline.ok, `0: a normal SDK client lists the tools and calls get_refund_status (${baseline.ms.toFixed(0)} ms)`,
      baseline.error ?? baseline.r);

// ---- slow clients: started now, trickling while everything else runs ------------------
function trickle(prefix, rest, every = 200) {
  // prefix at once, then one byte of rest every `every` ms, until the server
  // closes the connection or rest runs out
  const t0 = performance.now();
  const s = net.connect(gw.port, gw.host);
  const st = { closedAfter: null, sent: 0, answer: "" };
  let i = 0, iv;
  s.on("connect", () => {
    s.write(prefix);
    iv = setInterval(() => {
      if (i >= rest.length) return clearInterval(iv);
      s.write(rest[i++]);
      st.sent = i;
    }, every);
  });
  const closed = () => { if (st.closedAfter === null) { st.closedAfter = performance.now() - t0; clearInterval(iv); } };
  s.on("data", (d) => { st.answer += d.toString("latin1"); });
  s.on("close", closed);
  s.on("error", closed);
  st.stop = () => { clearInterval(iv); s.destroy(); };
  return st;
}
const slowBody = rpc("tools/call", refundCall("slow_body"));
const slowHeaders = trickle("", `POST /mcp HTTP/1.1\r\nHost: ${gw.hostHeader}\r\nContent-Type: application/json\r\n` +
                                `Accept: application/json, text/event-stream\r\nX-Padding: ${"a".repeat(2000)}\r\n\r\n`);
const slowBodyConn = trickle(`POST /mcp HTTP/1.1\r\nHost: ${gw.hostHeader}\r\nContent-Type: application/json\r\n` +
                             `Accept: application/json, text/event-stream\r\nMcp-Session-Id: ${A.sid}\r\n` +
                             `MCP-Protocol-Version: ${PV}\r\nContent-Length: ${slowBody.length + 2000}\r\n\r\n`,
                             slowBody + " ".repeat(2000));
await sleep(1000);
const during = await normalCall("while two clients trickle");
check(during.ok && during.ms < Math.max(3000, baseline.ms * 3 + 1000),
      `slow: a normal client's call is not held up by two clients trickling a byte per 200 ms ` +
      `(${during.ms.toFixed(0)} ms, ${baseline.ms.toFixed(0)} ms before)`, during.error ?? "");

// ---- 1. bodies over --max-message: 413 ----------------------------------------------------
{
  const MAX = 4 * 1024 * 1024;
  const big = rpc("tools/call", refundCall("big1", { arguments: { order_id: "big1", amount_cents: 1, pad: "x".repeat(MAX) } }));
  r = await request("POST", { headers: withSession(A.sid), body: big, timeout: 20000 });
  check(r.status === 413, `1: a ${big.length}-byte body (Content-Length) is refused 413`, brief(r));
  // a client that waits for leave to send (Expect: 100-continue) is told
  // at once: the Content-Length alone says it
  const head = await rawSocket(`POST /mcp HTTP/1.1\r\nHost: ${gw.hostHeader}\r\nContent-Type: application/json\r\n` +
                               `Accept: application/json, text/event-stream\r\nMcp-Session-Id: ${A.sid}\r\n` +
                               `Expect: 100-continue\r\n` +
                               `MCP-Protocol-Version: ${PV}\r\nContent-Length: ${MAX + 1}\r\n\r\n`, 5000);
  check(statusLine(head.text) === 413, "1: Content-Length over the limit with Expect: 100-continue is refused 413 before the body comes", head.text.slice(0, 300));
  // chunked, no length: refused once the limit is passed (411 would be honest too)
  const chunks = await new Promise((resolve) => {
    const req = http.request({ host: gw.host, port: gw.port, method: "POST", path: "/mcp", agent: false,
                               headers: { host: gw.hostHeader, "content-type": "application/json",
                                          accept: "application/json, text/event-stream", ...withSession(A.sid),
                                          "transfer-encoding": "chunked" } }, (res) => {
      let text = ""; res.on("data", (d) => { text += d; }); res.on("end", () => resolve({ status: res.statusCode, text }));
      res.on("error", () => resolve({ status: res.statusCode, text }));
    });
    req.on("error", (e) => resolve({ error: e.message }));
    const piece = "x".repeat(64 * 1024);
    req.write(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"refund_payment","arguments":{"order_id":"big2","amount_cents":1,"pad":"`);
    let n = 0;
    const more = () => { while (n < 80) { n++; if (!req.write(piece)) return req.once("drain", more); } req.end(`"}}}`); };
    req.on("error", () => {});
    more();
    setTimeout(() => resolve({ error: "no answer within 20 s" }), 20000);
  });
  check(chunks.status === 413 || chunks.status === 411, "1: a chunked body past the limit is refused (413, or 411)", chunks);
  // the limit is --max-message's: a smaller one on a second gateway
  const small = where(await startGateway({ policy: path.join(here, "policy.json"), log: `sqlite:${dir}/log2.db`,
                                           upstream: up.url, extra: ["--session", "hostile2", "--max-message", "2000"] }));
  const sr = await request("POST", { to: small, body: rpc("initialize", { protocolVersion: PV, capabilities: {},
                                       clientInfo: { name: "raw", version: "1" }, pad: "y".repeat(3000) }, 0) });
  check(sr.status === 413, "1: --max-message 2000: a 3 KB body is refused 413", brief(sr));
  await small.kill("SIGTERM");
  check(!sanitizerSaid(small.stderr()), "1: ... and that gateway's stderr has no sanitizer report", small.stderr().slice(-2000));
}

await alive('1. bodies over --max-message');
// ---- 2. not JSON: 400 with a JSON-RPC parse error ---------------------------------------
for (const [what, body] of [["a cut-off object", '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":'],
                            ["plain text", "refund order 1 please"],
                            ["invalid UTF-8", Buffer.from([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x3a, 0x31, 0x7d])],
                            ["a duplicate member", '{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}'],
                            ["an empty body", ""]]) {
  r = await request("POST", { headers: withSession(A.sid), body });
  const e = rpcError(r);
  check(r.status === 400 && e?.code === -32700 && r.messages[0]?.id === null,
        `2: ${what}: 400 with a JSON-RPC parse error (-32700, id null)`, brief(r));
  await alive(`2: ${what}`);
}
r = await request("POST", { body: "not json at all" });
check(r.status === 400, "2: not JSON without a session: 400", brief(r));
r = await request("POST", { headers: withSession(A.sid), body: JSON.stringify({ hello: "world" }) });
check(r.status === 400 && rpcError(r)?.code === -32600, "2: JSON that is not JSON-RPC: 400, -32600", brief(r));

await alive('2. not JSON: 400 with a JSON-RPC parse error');
// ---- 3. batches: refused, and nothing in them reaches the provider -----------------------
{
  const batch = JSON.stringify([JSON.parse(rpc("tools/call", refundCall("batch1"), 31)),
                                JSON.parse(rpc("tools/call", refundCall("batch2", { _meta: { "io.idem/call_id": "b2" } }), 32))]);
  r = await request("POST", { headers: withSession(A.sid), body: batch });
  const e = rpcError(r);
  check(r.status === 400 && e && /batch/i.test(e.message ?? ""), "3: a batch of two tools/call: 400, an error that says batches are refused",
        brief(r));
  check(!r.messages.some((m) => m?.result), "3: ... and no result for any of its calls", brief(r));
  r = await request("POST", { headers: withSession(A.sid), body: "[]" });
  check(r.status === 400, "3: an empty batch: 400", brief(r));
  r = await request("POST", { body: JSON.stringify([JSON.parse(rpc("initialize", { protocolVersion: PV, capabilities: {},
                                clientInfo: { name: "raw", version: "1" } }, 0))]) });
  check(r.status === 400 && !r.headers?.["mcp-session-id"], "3: initialize inside a batch: 400, no session issued", brief(r));
  r = await request("POST", { headers: withSession(A.sid),
                              body: JSON.stringify([{ jsonrpc: "2.0", method: "tools/call", params: refundCall("batch3") }]) });
  check(r.status === 400, "3: a batch of one tools/call notification: 400", brief(r));
}

await alive('3. batches: refused, and nothing in them reaches the provider');
// ---- 4. MCP-Protocol-Version ---------------------------------------------------------------
for (const v of ["1999-01-01", "2025-13-45", "latest", "2025-06-18, 2025-03-26"]) {
  r = await request("POST", { headers: withSession(A.sid, { "mcp-protocol-version": v }), body: rpc("tools/call", refundCall("pv1")) });
  check(r.status === 400, `4: MCP-Protocol-Version ${JSON.stringify(v)}: 400`, brief(r));
}
r = await request("POST", { headers: withSession(A.sid, { "mcp-protocol-version": PV }), body: rpc("ping") });
check(r.status === 200, `4: MCP-Protocol-Version ${PV} (known): 200`, brief(r));

await alive('4. MCP-Protocol-Version');
// ---- 5. Origin ----------------------------------------------------------------------------------
for (const o of ["http://evil.example", "https://evil.example:443", "null", "http://localhost.evil.example",
                 "http://127.0.0.1.evil.example:8080", "http://evil.example/http://localhost:1"]) {
  r = await request("POST", { headers: withSession(A.sid, { origin: o }), body: rpc("tools/call", refundCall("origin1")) });
  check(r.status === 403, `5: Origin ${o}: 403`, brief(r));
  r = await request("POST", { headers: { origin: o }, body: rpc("initialize", { protocolVersion: PV, capabilities: {},
                                                                                clientInfo: { name: "raw", version: "1" } }, 0) });
  check(r.status === 403 && !r.headers?.["mcp-session-id"], `5: Origin ${o} on initialize: 403, no session issued`, brief(r));
}
for (const o of ["http://localhost:3000", "http://127.0.0.1:9999", `http://127.0.0.1:${gw.port}`]) {
  r = await request("POST", { headers: withSession(A.sid, { origin: o }), body: rpc("ping") });
  check(r.status === 200, `5: Origin ${o} (loopback): allowed`, brief(r));
}

await alive('5. Origin');
// ---- 6. Host (DNS rebinding) ------------------------------------------------------------------
for (const h of ["evil.example", `evil.example:${gw.port}`, `127.0.0.1.evil.example:${gw.port}`, `attacker.test:${gw.port}`]) {
  r = await request("POST", { headers: withSession(A.sid, { host: h }), body: rpc("tools/call", refundCall("host1")) });
  check(r.status === 403, `6: Host ${h}: 403`, brief(r));
}
r = await request("POST", { headers: withSession(A.sid, { host: gw.hostHeader }), body: rpc("ping") });
check(r.status === 200, `6: Host ${gw.hostHeader}: 200`, brief(r));
{
  const noHost = await rawSocket(`POST /mcp HTTP/1.1\r\nContent-Type: application/json\r\n` +
                                 `Accept: application/json, text/event-stream\r\nMcp-Session-Id: ${A.sid}\r\n` +
                                 `MCP-Protocol-Version: ${PV}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`);
  check(statusLine(noHost.text) >= 400 && statusLine(noHost.text) < 500, "6: no Host header: a 4xx", noHost.text.slice(0, 200));
  const twoHosts = await rawSocket(`POST /mcp HTTP/1.1\r\nHost: ${gw.hostHeader}\r\nHost: evil.example\r\n` +
                                   `Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n` +
                                   `Mcp-Session-Id: ${A.sid}\r\nMCP-Protocol-Version: ${PV}\r\nContent-Length: 2\r\n` +
                                   `Connection: close\r\n\r\n{}`);
  check(statusLine(twoHosts.text) >= 400 && statusLine(twoHosts.text) < 500, "6: two Host headers: a 4xx", twoHosts.text.slice(0, 200));
}

await alive('6. Host (DNS rebinding)');
// ---- 7. Mcp-Session-Id ------------------------------------------------------------------------
{
  const B = await openSession();
  check(B.sid && B.sid !== A.sid, "7: a second session gets an id of its own", B.sid, A.sid);
  const unknown = ["00000000-0000-4000-8000-000000000000", A.sid.slice(0, -1) + (A.sid.endsWith("0") ? "1" : "0"),
                   A.sid + "x", "x".repeat(4000)];
  // the provider's sessions with idem are no client's
  const ups = [...new Set(up.requests().map((q) => q.session).filter(Boolean))];
  for (const s of ups.slice(0, 2)) unknown.push(s);
  for (const s of unknown) {
    r = await request("POST", { headers: withSession(s), body: rpc("tools/call", refundCall("sess1")) });
    check(r.status === 404, `7: an unknown Mcp-Session-Id (${s.length > 40 ? s.slice(0, 12) + "…" + s.length : s}): 404`, brief(r));
  }
  // without Mcp-Session-Id: refused (400), or (the 2026-07-28 revision has
  // no sessions) a session of its own - then two such callers that both
  // number their call 9 are two calls, each answered for its own refund
  {
    const [n1, n2] = await Promise.all(["nosessA", "nosessB"].map((o) =>
      request("POST", { headers: { "mcp-protocol-version": PV }, body: rpc("tools/call", refundCall(o), 9), timeout: 20000 })));
    const own = (x, o) => { const m = x.messages.find((mm) => mm.id === 9); try { return JSON.parse(m.result.content[0].text).order_id === o && !m.result.isError; } catch { return false; } };
    check((n1.status === 400 && n2.status === 400) || (own(n1, "nosessA") && own(n2, "nosessB")),
          "7: two tools/call without Mcp-Session-Id, both id 9: refused 400, or each a call of its own that succeeds with its own refund",
          brief(n1), brief(n2));
  }
  // another caller's session: a session is bound to the credential that opened it
  {
    const initBody = rpc("initialize", { protocolVersion: PV, capabilities: {}, clientInfo: { name: "raw", version: "1" } }, 0);
    const c = await request("POST", { headers: { authorization: "Bearer alice-token" }, body: initBody });
    const sid = c.headers?.["mcp-session-id"];
    check(c.status === 200 && sid, "7: a session opened with Authorization: Bearer alice-token", brief(c));
    for (const [who, auth] of [["another bearer token", "Bearer mallory-token"], ["no credential", null]]) {
      r = await request("POST", { headers: withSession(sid, { authorization: auth }), body: rpc("tools/call", refundCall("stolen1")) });
      check(r.status === 404, `7: that session used with ${who}: 404`, brief(r));
    }
    r = await request("POST", { headers: withSession(sid, { authorization: "Bearer alice-token" }), body: rpc("ping") });
    check(r.status === 200, "7: ... and by its own caller: 200", brief(r));
  }

  // JSON-RPC ids are scoped by the session: the same id 7 in A and B, both
  // in flight at once, are two calls, each answered with its own
  const [ra, rb] = await Promise.all([
    request("POST", { headers: withSession(A.sid), body: rpc("tools/call", refundCall("scopeA"), 7) }),
    request("POST", { headers: withSession(B.sid), body: rpc("tools/call", refundCall("scopeB"), 7) }),
  ]);
  const got = (x) => { const m = x.messages.find((mm) => mm.id === 7); try { return JSON.parse(m.result.content[0].text).order_id; } catch { return m; } };
  check(ra.status === 200 && rb.status === 200 && got(ra) === "scopeA" && got(rb) === "scopeB",
        "7: id 7 in session A and id 7 in session B are two calls, each answered with its own refund",
        brief(ra), brief(rb));

  // DELETE ends a session (or 405: the server does not let clients end them)
  r = await request("DELETE", { headers: withSession(B.sid) });
  check([200, 202, 204, 405].includes(r.status), "7: DELETE with a session: 200/204 (or 405)", brief(r));
  if (r.status !== 405) {
    r = await request("POST", { headers: withSession(B.sid), body: rpc("tools/call", refundCall("sess3")) });
    check(r.status === 404, "7: a session ended by DELETE: 404 after", brief(r));
    r = await request("DELETE", { headers: withSession(B.sid) });
    check(r.status === 404, "7: DELETE of the ended session again: 404", brief(r));
  }
  r = await request("DELETE", { headers: withSession("00000000-0000-4000-8000-000000000000") });
  check([404, 405].includes(r.status), "7: DELETE with an unknown session: 404 (or 405)", brief(r));
}

await alive('7. Mcp-Session-Id');
// ---- 8. GET, other methods, other paths -------------------------------------------------------
{
  r = await request("GET", { headers: withSession(A.sid, { accept: "text/event-stream" }), headersOnly: true });
  check((r.status === 200 && /text\/event-stream/.test(r.headers["content-type"] ?? "")) || r.status === 405,
        "8: GET with a session and Accept: text/event-stream: an SSE stream (or 405)", brief(r), r.headers);
  r = await request("GET", { headers: { accept: "text/event-stream" }, headersOnly: true });
  check(r.status >= 400 && r.status < 500, "8: GET without a session: a 4xx", brief(r));
  r = await request("GET", { headers: withSession("00000000-0000-4000-8000-000000000000", { accept: "text/event-stream" }),
                             headersOnly: true });
  check([404, 405].includes(r.status), "8: GET with an unknown session: 404 (or 405)", brief(r));
  for (const m of ["PUT", "PATCH"]) {
    r = await request(m, { headers: withSession(A.sid), body: rpc("tools/call", refundCall("method1")) });
    check(r.status === 405, `8: ${m} with a tools/call body: 405`, brief(r));
  }
  for (const m of ["TRACE", "PROPFIND"]) {
    r = await request(m, { headers: withSession(A.sid) });
    check(r.status === 405 || r.status === 501, `8: ${m}: 405 (or 501, a method it does not know)`, brief(r));
  }
  r = await request("POST", { path: "/other", headers: withSession(A.sid), body: rpc("tools/call", refundCall("path1")) });
  check(r.status === 404, "8: POST to /other: 404", brief(r));
  r = await request("POST", { path: "/mcp/../mcp2", headers: withSession(A.sid), body: rpc("tools/call", refundCall("path2")) });
  check(r.status >= 400 && r.status < 500, "8: POST to /mcp/../mcp2: a 4xx", brief(r));
}

await alive('8. GET, other methods, other paths');
// ---- 9. a tools/call notification over HTTP: answered nothing, runs nothing ---------------
r = await request("POST", { headers: withSession(A.sid),
                            body: JSON.stringify({ jsonrpc: "2.0", method: "tools/call", params: refundCall("notif1") }) });
check(r.status === 202 || (r.status >= 400 && r.status < 500), "9: a tools/call without an id: 202 (dropped) or a 4xx", brief(r));

await alive('9. a tools/call notification over HTTP: answered nothing, runs nothing');
// ---- 10. HTTP framing ---------------------------------------------------------------------------
{
  const hdr = `Host: ${gw.hostHeader}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n` +
              `Mcp-Session-Id: ${A.sid}\r\nMCP-Protocol-Version: ${PV}\r\n`;
  const body = rpc("tools/call", refundCall("smuggle1"));
  const cases = [
    ["garbage request line", "GARBAGE\r\n\r\n"],
    ["a request line with no version", "POST /mcp\r\n\r\n"],
    ["Content-Length and Transfer-Encoding both", `POST /mcp HTTP/1.1\r\n${hdr}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n` +
                                                  `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`],
    ["two different Content-Lengths", `POST /mcp HTTP/1.1\r\n${hdr}Content-Length: 2\r\nContent-Length: ${body.length}\r\n\r\n${body}`],
    ["a negative Content-Length", `POST /mcp HTTP/1.1\r\n${hdr}Content-Length: -1\r\n\r\n${body}`],
    ["a Content-Length that is not a number", `POST /mcp HTTP/1.1\r\n${hdr}Content-Length: 12abc\r\n\r\n${body}`],
    ["a Content-Length of 2^64", `POST /mcp HTTP/1.1\r\n${hdr}Content-Length: 18446744073709551616\r\n\r\n${body}`],
    ["a bad chunk size", `POST /mcp HTTP/1.1\r\n${hdr}Transfer-Encoding: chunked\r\n\r\nzz\r\n${body}\r\n0\r\n\r\n`],
    ["a header line without a colon", `POST /mcp HTTP/1.1\r\n${hdr}Nonsense\r\nContent-Length: ${body.length}\r\n\r\n${body}`],
    ["64 KiB of headers", `POST /mcp HTTP/1.1\r\n${hdr}X-Big: ${"h".repeat(64 * 1024)}\r\nContent-Length: ${body.length}\r\n\r\n${body}`],
    // libmicrohttpd keeps a header's value up to a NUL: what idem checks is
    // what comes before it, so an allowed value hidden after one counts for
    // nothing (a browser, the client DNS rebinding abuses, sends no NUL)
    ["a NUL in Host, the gateway's name after it", `POST /mcp HTTP/1.1\r\nHost: evil.example\u0000${gw.hostHeader}\r\n` +
                      hdr.replace(/^Host: [^\r]*\r\n/, "") + `Content-Length: ${body.length}\r\n\r\n${body}`],
    ["a NUL in Origin, a loopback origin after it", `POST /mcp HTTP/1.1\r\n${hdr}Origin: http://evil.example\u0000http://localhost:3000\r\n` +
                        `Content-Length: ${body.length}\r\n\r\n${body}`],
    ["a NUL in Mcp-Session-Id, the session after it", `POST /mcp HTTP/1.1\r\n${hdr.replace(/Mcp-Session-Id: [^\r]*/, `Mcp-Session-Id: x\u0000${A.sid}`)}` +
                                `Content-Length: ${body.length}\r\n\r\n${body}`],
  ];
  for (const [what, bytes] of cases) {
    const res = await rawSocket(bytes, 3000);
    const st = statusLine(res.text);
    // RFC 9112 6.3: with both Content-Length and Transfer-Encoding a server
    // may go by the latter, but must close the connection after answering
    check((st >= 400 && st < 500) || (st === 0 && res.closed) || (/both/.test(what) && st === 200 && res.closed),
          `10: ${what}: a 4xx, or the connection closed${/both/.test(what) ? " (or answered by Transfer-Encoding, then closed)" : ""}`,
          { status: st, closed: res.closed, text: res.text.slice(0, 200) });
    await sleep(20);
    await alive(`10: ${what}`);
  }
  // two pings pipelined on one connection: both answered, or the first and a close
  const ping = (id) => { const b = rpc("ping", undefined, id); return `POST /mcp HTTP/1.1\r\n${hdr}Content-Length: ${b.length}\r\n\r\n${b}`; };
  const res = await rawSocket(ping("pp1") + ping("pp2"), 3000);
  check(statusLine(res.text) === 200 && /pp1/.test(res.text), "10: two pipelined requests: the first answered (the second answered or the connection closed)",
        res.text.slice(0, 400));
}

await alive('10. HTTP framing');
// ---- nothing reached the provider unguarded ------------------------------------------------
{
  // refused cases: none of their orders may have been applied
  const refused = ["big1", "big2", "batch1", "batch2", "batch3", "pv1", "origin1", "host1", "sess1", "sess3", "stolen1",
                   "method1", "path1", "path2", "notif1"];
  const applied = ledger();
  check(!applied.some((e) => refused.includes(e.order_id)),
        "ledger: no refund from a refused request (oversized, batch, bad version, Origin, Host, session, method, path, notification)",
        applied.filter((e) => refused.includes(e.order_id)));
  check(applied.every((e) => e.meta_key), "ledger: every refund applied came through the guard (io.idem/key)", applied);
  check(applied.filter((e) => e.order_id === "scopeA").length === 1 && applied.filter((e) => e.order_id === "scopeB").length === 1,
        "ledger: the scoping case's two refunds, once each", applied);
  const calls = up.requests().flatMap((q) => q.rpc ?? []).filter((m) => m.method === "tools/call");
  check(calls.filter((m) => m.tool === "refund_payment").every((m) => m.meta?.["io.idem/key"]),
        "provider: every refund_payment it was sent came through the guard (io.idem/key)", calls);
}

await alive('11. 300 connections at once');
// ---- slow clients, again: timed out by now, or soon ------------------------------------------
{
  const t0 = performance.now();
  while ((slowHeaders.closedAfter === null || slowBodyConn.closedAfter === null) && performance.now() - t0 < 60000) await sleep(250);
  check(slowHeaders.closedAfter !== null, `slow: a client trickling its headers is cut off ` +
        `(after ${slowHeaders.closedAfter?.toFixed(0)} ms, ${slowHeaders.sent} bytes trickled)`, slowHeaders.answer.slice(0, 200));
  check(slowBodyConn.closedAfter !== null, `slow: a client trickling its body is cut off ` +
        `(after ${slowBodyConn.closedAfter?.toFixed(0)} ms, ${slowBodyConn.sent} bytes trickled)`, slowBodyConn.answer.slice(0, 200));
  slowHeaders.stop(); slowBodyConn.stop();
  check(!ledger().some((e) => e.order_id === "slow_body"), "slow: the trickled tools/call was not run");
}

await alive('slow clients, again: timed out by now, or soon');
// ---- after it all: a normal call, a clean exit ------------------------------------------------
{
  const c = await httpClient(gw.url, { ms: 15000 });
  const res = await call(c.client, "refund_payment", { order_id: "final1", amount_cents: 500 },
                         { "io.idem/call_id": "final_call_1" }, { timeout: 15000 });
  const again = await call(c.client, "refund_payment", { order_id: "final1", amount_cents: 500 },
                           { "io.idem/call_id": "final_call_1" }, { timeout: 15000 });
  const final = ledger().filter((e) => e.order_id === "final1");
  check(statusOf(res) === "succeeded" && final.length === 1 && final[0].meta_key,
        "after it all, the gateway still answers a normal guarded call: succeeded, one refund", res, final);
  check(again._meta?.["io.idem/replayed"] === true && ledger().filter((e) => e.order_id === "final1").length === 1,
        "... and its repeat is replayed, still one refund", again);
  await c.close();
  check(!gw.gone, "the gateway never died");
  const ex = await gw.kill("SIGTERM");
  check(!sanitizerSaid(gw.stderr()), "the gateway's stderr holds no sanitizer report", gw.stderr().slice(-3000));
  console.log(`     gateway exit on SIGTERM: ${JSON.stringify(ex)}`);
}
await finish(dir);
