// The payments provider of payments_server.mjs (the same tools, ledger and
// switch files: payments_tools.mjs) served over MCP Streamable HTTP with the
// official SDK's StreamableHTTPServerTransport, at /mcp.
//
//   node http_payments_server.mjs LEDGER [--host 127.0.0.1] [--port 0] [--port-file FILE]
//        [--stateless] [--json] [--token T]... [--tokens T1,T2,...]
//        [--oauth --resource URL --issuer URL] [--requests FILE]
//
//   --port 0        pick a free port; it is written to --port-file once the
//                   server listens (and said on stderr)
//   --stateless     no Mcp-Session-Id: a new server and transport for every
//                   POST (sessionIdGenerator undefined); GET and DELETE 405
//                   Default: stateful sessions, one McpServer per session.
//   --json          enableJsonResponse: a request is answered with one
//                   application/json body instead of an SSE stream
//   --token T       every request to /mcp needs "Authorization: Bearer T"
//                   (given twice, or --tokens a,b: any of them); else 401
//                   with WWW-Authenticate: Bearer realm="payments" (and
//                   error="invalid_token" when a wrong one was presented)
//   --oauth         a protected resource (RFC 9728): --resource URL is its
//                   resource identifier, --issuer URL its authorization
//                   server (oauth_server.mjs).  Serves its metadata at
//                   /.well-known/oauth-protected-resource<resource path>
//                   (and at /.well-known/oauth-protected-resource); answers
//                   401 with WWW-Authenticate: Bearer resource_metadata=
//                   "<resource origin>/.well-known/oauth-protected-resource
//                   <resource path>"; accepts only a token that issuer's
//                   introspection endpoint calls active, whose audience is
//                   --resource.
//   --requests FILE one JSON line per HTTP request that reached the server:
//                   {method, path, session, auth, rpc: [{method, id, tool,
//                   meta}]}, auth being "none", "token#I" (the I-th --token),
//                   "bad", or "oauth:CLIENT_ID"; status too when the server
//                   refused it itself (401, 404, a parse error).  Tests read
//                   it to see what a gateway forwarded, and as whom.
//
// LEDGER.pid gets this process's pid.  SIGTERM / SIGINT end it.
import fs from "node:fs";
import http from "node:http";
import { randomUUID } from "node:crypto";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { paymentsTools } from "./payments_tools.mjs";

const argv = process.argv.slice(2);
const ledger = argv[0];
if (!ledger || ledger.startsWith("--")) {
  console.error("usage: http_payments_server.mjs LEDGER [--port N] [--port-file F] [--stateless] [--json] " +
                "[--token T]... [--tokens A,B] [--oauth --resource URL --issuer URL] [--requests F]");
  process.exit(2);
}
const flags = new Set();
const opts = {};
const tokens = [];
for (let i = 1; i < argv.length; i++) {
  const a = argv[i];
  if (["--stateless", "--json", "--oauth"].includes(a)) flags.add(a);
  else if (a === "--token") tokens.push(argv[++i]);
  else if (a === "--tokens") tokens.push(...argv[++i].split(",").filter(Boolean));
  else if (["--host", "--port", "--port-file", "--resource", "--issuer", "--requests"].includes(a)) opts[a] = argv[++i];
  else { console.error(`http_payments_server: unknown argument ${a}`); process.exit(2); }
}
const stateless = flags.has("--stateless");
const enableJsonResponse = flags.has("--json");
const oauth = flags.has("--oauth");
if (oauth && (!opts["--resource"] || !opts["--issuer"])) {
  console.error("http_payments_server: --oauth needs --resource URL and --issuer URL");
  process.exit(2);
}
const host = opts["--host"] ?? "127.0.0.1";
fs.writeFileSync(ledger + ".pid", String(process.pid));

const pay = paymentsTools(ledger);
const makeServer = () => pay.register(new McpServer({ name: "payments", version: "1.0.0" }));

// ---- who is asking
const resource = oauth ? new URL(opts["--resource"]) : null;
const prmPath = resource ? "/.well-known/oauth-protected-resource" + resource.pathname.replace(/\/$/, "") : null;
const prmUrl = resource ? resource.origin + prmPath : null;

// "none", "token#I", "oauth:CLIENT" or "bad"
async function whoIs(req) {
  const h = req.headers.authorization;
  if (!h) return "none";
  const m = /^Bearer ([^\s]+)$/i.exec(h.trim());
  if (!m) return "bad";
  if (oauth) {
    try {
      const r = await fetch(new URL("/introspect", opts["--issuer"]), {
        method: "POST",
        headers: { "content-type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams({ token: m[1] }),
        signal: AbortSignal.timeout(5000),
      });
      const t = await r.json();
      const aud = Array.isArray(t.aud) ? t.aud : [t.aud];
      if (t.active === true && aud.includes(opts["--resource"])) return `oauth:${t.client_id}`;
      if (t.active === true) console.error(`http_payments_server: a token for ${t.aud}, not ${opts["--resource"]}`);
    } catch (e) {
      console.error(`http_payments_server: introspection failed: ${e}`);
    }
    return "bad";
  }
  const i = tokens.indexOf(m[1]);
  return i >= 0 ? `token#${i}` : "bad";
}
const needsAuth = oauth || tokens.length > 0;

function unauthorized(res, who) {
  const err = who === "none" ? "" : ', error="invalid_token"';
  const www = oauth ? `Bearer resource_metadata="${prmUrl}"${err}` : `Bearer realm="payments"${err}`;
  res.writeHead(401, { "content-type": "application/json", "www-authenticate": www });
  res.end(JSON.stringify({ jsonrpc: "2.0", id: null,
                           error: { code: -32001, message: `Unauthorized: ${who === "none" ? "a bearer token is required" : "invalid token"}` } }));
}

function rpcError(res, status, message, code = -32000) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code, message } }));
}

const note = (o) => { if (opts["--requests"]) fs.appendFileSync(opts["--requests"], JSON.stringify(o) + "\n"); };
const rpcSummary = (body) =>
  (Array.isArray(body) ? body : body ? [body] : []).map((m) => ({
    method: m?.method, id: m?.id, ...(m?.params?.name !== undefined ? { tool: m.params.name } : {}),
    ...(m?.params?._meta ? { meta: m.params._meta } : {}),
    ...(m?.method === undefined ? { response: true } : {}),
  }));

// ---- sessions (stateful mode)
const sessions = new Map(); // Mcp-Session-Id -> transport

async function handleMcp(req, res, body) {
  if (stateless) {
    if (req.method !== "POST") return rpcError(res, 405, "Method not allowed (stateless server)");
    const server = makeServer();
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse });
    res.on("close", () => { transport.close(); server.close(); });
    await server.connect(transport);
    return transport.handleRequest(req, res, body);
  }
  const sid = req.headers["mcp-session-id"];
  if (sid) {
    const t = sessions.get(sid);
    if (!t) return rpcError(res, 404, "Session not found", -32001);
    return t.handleRequest(req, res, body);
  }
  if (req.method === "POST" && isInitializeRequest(body)) {
    const server = makeServer();
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      enableJsonResponse,
      onsessioninitialized: (id) => sessions.set(id, transport),
    });
    transport.onclose = () => { if (transport.sessionId) sessions.delete(transport.sessionId); };
    await server.connect(transport);
    return transport.handleRequest(req, res, body);
  }
  return rpcError(res, 400, "Bad Request: no valid Mcp-Session-Id");
}

const httpServer = http.createServer(async (req, res) => {
  const url = new URL(req.url, "http://localhost");
  try {
    if (oauth && req.method === "GET" &&
        (url.pathname === prmPath || url.pathname === "/.well-known/oauth-protected-resource")) {
      note({ method: req.method, path: url.pathname, status: 200 });
      res.writeHead(200, { "content-type": "application/json" });
      return res.end(JSON.stringify({ resource: opts["--resource"], authorization_servers: [opts["--issuer"]],
                                      bearer_methods_supported: ["header"], resource_name: "payments" }));
    }
    if (url.pathname !== "/mcp") {
      note({ method: req.method, path: url.pathname, status: 404 });
      return rpcError(res, 404, `Not found: ${url.pathname}`);
    }
    let body;
    if (req.method === "POST") {
      const chunks = [];
      for await (const c of req) chunks.push(c);
      try {
        body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      } catch {
        note({ method: req.method, path: url.pathname, status: 400, parse_error: true });
        return rpcError(res, 400, "Parse error", -32700);
      }
    }
    const who = await whoIs(req);
    const line = { method: req.method, path: url.pathname, session: req.headers["mcp-session-id"] ?? null,
                   auth: who, rpc: rpcSummary(body) };
    if (needsAuth && (who === "none" || who === "bad")) {
      note({ ...line, status: 401 });
      return unauthorized(res, who);
    }
    note(line);
    await handleMcp(req, res, body);
  } catch (e) {
    console.error(`http_payments_server: ${e?.stack ?? e}`);
    if (!res.headersSent) rpcError(res, 500, `Internal error: ${e}`, -32603);
    else res.end();
  }
});

httpServer.listen(Number(opts["--port"] ?? 0), host, () => {
  const port = httpServer.address().port;
  if (opts["--port-file"]) {
    fs.writeFileSync(opts["--port-file"] + ".tmp", String(port));
    fs.renameSync(opts["--port-file"] + ".tmp", opts["--port-file"]);
  }
  console.error(`http_payments_server: listening on http://${host}:${port}/mcp` +
                `${stateless ? " (stateless)" : ""}${enableJsonResponse ? " (json)" : ""}`);
});
for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => process.exit(0));
