// idem mcp's HTTP upstream against a server that does exactly what each
// case needs (a raw node:http MCP server, below), driven over the
// gateway's stdio with raw JSON-RPC lines; and the HTTP front in front of
// a stdio server (payments_server.mjs) with Codex's turn id (SPEC §10b).
//
//   node http_upstream_test.mjs PATH/TO/idem
//
// Cases, each counted in the upstream's own ledger:
//   forget   the server forgets the MCP session (404): idem initializes it
//            again, as it was, and sends the call once more - one refund
//   resume   the call's SSE stream ends after a priming event with an id:
//            idem resumes it with GET and Last-Event-ID and gets the answer
//   503      applied, then HTTP 503: no verdict - outcome_unknown, and the
//            status check settles it (one refund, never two)
//   429      not applied, HTTP 429: no verdict either (a 429 proves nothing)
//   400      HTTP 400 before anything ran: a verdict, failed, nothing ran
//   down     nothing listens: failed, "nothing was sent"
//   DELETE   the session is deleted when the client leaves
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import readline from "node:readline";
import { spawn } from "node:child_process";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { idem, here, tmpdir, check, done, sanitizerSaid, ledgerOf } from "./lib.mjs";

const dir = tmpdir("httpup");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- the upstream: a raw MCP server over Streamable HTTP ------------------------
const ledger = [];           // {order, key}
const seen = { initialize: 0, deletes: [], lastEventIds: [] };
const sessions = new Set();
let nextSession = 1;
const parked = new Map();    // event id -> the answer a resumed stream gives
const forgot = new Set();    // orders whose first call found its session forgotten

function json(res, status, body, headers = {}) {
  res.writeHead(status, { "Content-Type": "application/json", ...headers });
  res.end(body === undefined ? "" : JSON.stringify(body));
}
const result = (id, obj) => ({ jsonrpc: "2.0", id, result: { content: [{ type: "text", text: JSON.stringify(obj) }] } });

const server = http.createServer(async (req, res) => {
  const sid = req.headers["mcp-session-id"];
  if (req.method === "DELETE") {
    seen.deletes.push(sid);
    sessions.delete(sid);
    return json(res, 200);
  }
  if (req.method === "GET") {
    const last = req.headers["last-event-id"];
    if (!last) return json(res, 405); // no stream of the server's own
    seen.lastEventIds.push(last);
    const answer = parked.get(last);
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    if (answer) res.write(`id: ${last}-2\ndata: ${JSON.stringify(answer)}\n\n`);
    return res.end();
  }
  const chunks = [];
  for await (const c of req) chunks.push(c);
  const m = JSON.parse(Buffer.concat(chunks).toString());
  if (m.method === "initialize") {
    seen.initialize++;
    const s = `s${nextSession++}`;
    sessions.add(s);
    return json(res, 200, { jsonrpc: "2.0", id: m.id, result: { protocolVersion: "2025-06-18",
      capabilities: { tools: {} }, serverInfo: { name: "raw", version: "1" } } }, { "Mcp-Session-Id": s });
  }
  if (!sessions.has(sid)) return json(res, 404, { jsonrpc: "2.0", id: null, error: { code: -32001, message: "Session not found" } });
  if (m.id === undefined) return json(res, 202);
  if (m.method === "tools/list")
    return json(res, 200, { jsonrpc: "2.0", id: m.id, result: { tools: [
      { name: "refund", inputSchema: { type: "object" } },
      { name: "get_status", inputSchema: { type: "object" }, annotations: { readOnlyHint: true } }] } });
  if (m.method !== "tools/call") return json(res, 200, { jsonrpc: "2.0", id: m.id, result: {} });
  const a = m.params.arguments ?? {};
  if (m.params.name === "get_status")
    return json(res, 200, result(m.id, { refunds: ledger.filter((e) => e.order === a.order) }));
  const apply = () => ledger.push({ order: a.order, key: a.key });
  switch (a.mode) {
    case "forget":
      if (!forgot.has(a.order)) { // once: the session is gone, the call not taken
        forgot.add(a.order);
        sessions.delete(sid);
        return json(res, 404, { jsonrpc: "2.0", id: null, error: { code: -32001, message: "Session not found" } });
      }
      apply();
      return json(res, 200, result(m.id, { applied: a.order }));
    case "resume": {
      apply();
      const id = `e-${a.order}`;
      parked.set(id, result(m.id, { applied: a.order }));
      res.writeHead(200, { "Content-Type": "text/event-stream" });
      res.write(`id: ${id}\ndata: \n\n`);
      return res.end(); // the stream drops before the answer
    }
    case "503": apply(); return json(res, 503, { error: "upstream overloaded" });
    case "429": return json(res, 429, { error: "slow down" });
    case "400": return json(res, 400, { error: "bad request" });
    default: apply(); return json(res, 200, result(m.id, { applied: a.order }));
  }
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const url = `http://127.0.0.1:${server.address().port}/mcp`;
const refunds = (order) => ledger.filter((e) => e.order === order).length;

// ---- idem over stdio, raw lines -------------------------------------------------
const policy = `${dir}/policy.json`;
fs.writeFileSync(policy, JSON.stringify({ unknown_tools: "refuse", tools: {
  refund: { class: "guarded", timeout_ms: 3000, key_arg: "key",
            status: { tool: "get_status", arguments: { order: "{order}" }, applied_when: "key_present" } },
  get_status: { class: "read_only" } } }));

function gateway(upstream) {
  const p = spawn(idem, ["mcp", "--policy", policy, "--log", `sqlite:${dir}/log.db`, "--session", "up", "--", upstream],
                  { stdio: ["pipe", "pipe", "pipe"] });
  let stderr = "";
  p.stderr.on("data", (d) => { stderr += d; });
  const waiting = new Map();
  readline.createInterface({ input: p.stdout }).on("line", (l) => {
    const m = JSON.parse(l);
    waiting.get(m.id)?.(m);
    waiting.delete(m.id);
  });
  let n = 0;
  const send = (method, params) => new Promise((resolve, reject) => {
    const id = ++n;
    waiting.set(id, resolve);
    p.stdin.write(JSON.stringify({ jsonrpc: "2.0", id, method, params }) + "\n");
    setTimeout(() => reject(new Error(`no answer to ${method} in 20 s; stderr: ${stderr}`)), 20000).unref();
  });
  const exited = new Promise((r) => p.once("exit", (code, sig) => r({ code, sig })));
  return { p, send, exited, stderr: () => stderr,
           notify: (method) => p.stdin.write(JSON.stringify({ jsonrpc: "2.0", method }) + "\n") };
}
// a fresh success is the server's own answer, unchanged; anything else is
// marked with its envelope's status
const statusOf = (m) => m.result?._meta?.["io.idem/status"] ??
  (m.error ? `error ${m.error.code}` : m.result && !m.result.isError ? "succeeded" : "?");
const call = (g, order, mode, callId) =>
  g.send("tools/call", { name: "refund", arguments: { order, amount: 1, mode }, _meta: { "io.idem/call_id": callId } });

try {
  const g = gateway(url);
  const init = await g.send("initialize", { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "t", version: "1" } });
  check(init.result?.serverInfo?.name === "raw", "initialize through the HTTP upstream", init);
  g.notify("notifications/initialized");
  const sessionAtStart = [...sessions][0];

  let r = await call(g, "o-ok", "ok", "c-ok");
  check(statusOf(r) === "succeeded" && refunds("o-ok") === 1, `ok: succeeded, one refund (${statusOf(r)}, ${refunds("o-ok")})`, r);
  r = await call(g, "o-ok", "ok", "c-ok");
  check(r.result?._meta?.["io.idem/replayed"] === true && refunds("o-ok") === 1, "ok: the repeat is replayed", r);

  const inits = seen.initialize;
  r = await call(g, "o-forget", "forget", "c-forget");
  check(statusOf(r) === "succeeded" && refunds("o-forget") === 1,
        `forget: the session initialized again and the call sent once more: succeeded, one refund (${statusOf(r)}, ${refunds("o-forget")})`, r);
  check(seen.initialize === inits + 1, `forget: one initialize more (${seen.initialize - inits})`);
  check(/initialized again/.test(g.stderr()), "forget: said on stderr", g.stderr());

  r = await call(g, "o-resume", "resume", "c-resume");
  check(statusOf(r) === "succeeded" && refunds("o-resume") === 1,
        `resume: the dropped stream resumed, the answer read: succeeded, one refund (${statusOf(r)})`, r);
  check(seen.lastEventIds.includes("e-o-resume"), "resume: GET with Last-Event-ID e-o-resume", seen.lastEventIds);

  r = await call(g, "o-503", "503", "c-503");
  check(statusOf(r) !== "failed" && refunds("o-503") === 1,
        `503 after applying: no verdict of failure (${statusOf(r)}), one refund`, r);
  r = await call(g, "o-503", "503", "c-503");
  check(["succeeded", "already_applied"].includes(statusOf(r)) && refunds("o-503") === 1,
        `503: the repeat is settled by the status check, never sent twice (${statusOf(r)}, ledger ${refunds("o-503")})`, r);

  r = await call(g, "o-429", "429", "c-429");
  check(statusOf(r) !== "failed" && refunds("o-429") === 0, `429: no verdict (${statusOf(r)}), nothing applied`, r);

  r = await call(g, "o-400", "400", "c-400");
  const said400 = JSON.stringify(r);
  check(refunds("o-400") === 0 && (statusOf(r) === "failed" || /HTTP 400/.test(said400)),
        `400: a verdict that nothing ran (${statusOf(r)})`, r);

  g.p.stdin.end();
  const ex = await g.exited;
  check(ex.code === 0, `the gateway exits 0 when its client leaves (${JSON.stringify(ex)})`, g.stderr());
  check(seen.deletes.includes(sessionAtStart) || seen.deletes.length > 0,
        `the upstream session is deleted at the end (${seen.deletes.join(",")})`, seen.deletes);
  check(!sanitizerSaid(g.stderr()), "nothing from the sanitizers", g.stderr());

  // nothing listens there
  const dead = http.createServer();
  await new Promise((r2) => dead.listen(0, "127.0.0.1", r2));
  const deadUrl = `http://127.0.0.1:${dead.address().port}/mcp`;
  await new Promise((r2) => dead.close(r2));
  const d = gateway(deadUrl);
  const di = await d.send("initialize", { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "t", version: "1" } });
  check(di.error && /could not be reached/.test(di.error.message), "down: initialize answered with an error saying so", di);
  r = await call(d, "o-down", "ok", "c-down");
  check((statusOf(r) === "failed" || r.error) && /nothing was sent|could not be reached/.test(JSON.stringify(r)),
        `down: a verdict, nothing was sent (${statusOf(r)})`, r);
  d.p.stdin.end();
  check((await d.exited).code !== null, "down: the gateway exits");
  check(!sanitizerSaid(d.stderr()), "down: nothing from the sanitizers", d.stderr());
} catch (e) {
  check(false, "the upstream cases ran to their end", String(e?.stack ?? e));
}

// ---- the HTTP front in front of a stdio server, with Codex's turn id ----------------
try {
  const ledgerFile = `${dir}/payments.jsonl`;
  const gw = spawn(idem, ["mcp", "--policy", path.join(here, "policy.json"), "--log", `sqlite:${dir}/front.db`,
                          "--listen", "127.0.0.1:0", "--", "node", path.join(here, "payments_server.mjs"), ledgerFile],
                   { stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  gw.stderr.on("data", (x) => { err += x; });
  const exited = new Promise((r2) => gw.once("exit", (code, sig) => r2({ code, sig })));
  for (let i = 0; i < 150 && !/listening on http/.test(err); i++) await sleep(100);
  const front = new URL(err.match(/listening on (http:\S+)/)[1]);
  const c = new Client({ name: "codex-like", version: "1" });
  await c.connect(new StreamableHTTPClientTransport(front));
  const turn = { "x-codex-turn-metadata": { turn_id: "turn-7" } };
  const args = { order_id: "o-turn", amount_cents: 700 };
  const a = await c.callTool({ name: "refund_payment", arguments: args, _meta: { ...turn } });
  const b = await c.callTool({ name: "refund_payment", arguments: args, _meta: { ...turn } });
  const n = ledgerOf(ledgerFile).filter((e) => e.order_id === "o-turn").length;
  const st = (x) => x._meta?.["io.idem/status"] ?? (x.isError ? "?" : "succeeded");
  check(st(a) === "succeeded" && st(b) === "already_applied" && n === 1,
        `HTTP front, stdio server: two identical calls of one Codex turn (x-codex-turn-metadata) run once ` +
        `(${st(a)}, ${st(b)}, ledger ${n})`, a, b);
  const other = await c.callTool({ name: "refund_payment", arguments: args,
                                    _meta: { "x-codex-turn-metadata": JSON.stringify({ turn_id: "turn-8" }) } });
  const n2 = ledgerOf(ledgerFile).filter((e) => e.order_id === "o-turn").length;
  check(st(other) === "succeeded" && n2 === 2,
        `... the same call in the next turn (its metadata as JSON text) is a new decision (${st(other)}, ledger ${n2})`, other);
  await c.close();
  gw.kill("SIGTERM");
  const ex = await exited;
  check(ex.code === 0 || ex.code === 143 || ex.sig === "SIGTERM", `the front gateway stops on SIGTERM (${JSON.stringify(ex)})`, err);
  check(!sanitizerSaid(err), "nothing from the sanitizers (front)", err);
} catch (e) {
  check(false, "the front case ran to its end", String(e?.stack ?? e));
}

server.close();
server.closeAllConnections?.();
fs.rmSync(dir, { recursive: true, force: true });
done();
