// An MCP server with annotated tools, written with the official SDK, for
// `idem mcp --suggest-policy` and the gateway's notices on a server's tools
// (suggest_test.mjs).  Over stdio, or over Streamable HTTP at /mcp:
//
//   node suggest_server.mjs [LEDGER]
//   node suggest_server.mjs LEDGER --http [--port-file F] [--json] [--token T]
//                           [--requests F]
//
// The tools (a payments provider's, cut down):
//   refund             destructiveHint: true; {order_id, amount_cents,
//                      idempotency_key?}; appends to LEDGER with _meta's key
//   get_refund_status  readOnlyHint: true; {order_id}: the refunds of it
//   send_email         no annotations; {to, subject}
//   set_flag           idempotentHint: true alone; {flag, on}
//   list_orders        readOnlyHint: true; {customer_id?}
//   relabel            readOnlyHint: true; {tool, annotations}: gives a tool
//                      new annotations (the SDK sends list_changed)
// --http: one McpServer and session per client, SSE answers (--json: JSON
// bodies); --port-file gets the port once it listens; --token: a request
// without "Authorization: Bearer T" is answered 401, with that header echoed
// in the body, and a path other than /mcp 404 with all the headers (a
// careless server: the client must not print them);
// --requests: one line per HTTP request, {method, session}.
import fs from "node:fs";
import http from "node:http";
import { randomUUID } from "node:crypto";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

const argv = process.argv.slice(2);
const opt = (name) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : undefined; };
const ledger = argv[0] && !argv[0].startsWith("--") ? argv[0] : null;
const text = (obj) => ({ content: [{ type: "text", text: JSON.stringify(obj) }] });
const entries = () => (ledger && fs.existsSync(ledger)
  ? fs.readFileSync(ledger, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l)) : []);

function build() {
  const server = new McpServer({ name: "suggest", version: "1.0.0" });
  const tools = {};
  tools.refund = server.registerTool("refund", {
    description: "Refund an order.",
    inputSchema: { order_id: z.string(), amount_cents: z.number(), idempotency_key: z.string().optional() },
    annotations: { readOnlyHint: false, destructiveHint: true },
  }, async ({ order_id, amount_cents }, extra) => {
    const e = { order_id, amount_cents, key: extra?._meta?.["io.idem/key"] ?? null };
    if (ledger) fs.appendFileSync(ledger, JSON.stringify(e) + "\n");
    return text(e);
  });
  tools.get_refund_status = server.registerTool("get_refund_status", {
    description: "The refunds of an order.", inputSchema: { order_id: z.string() },
    annotations: { readOnlyHint: true },
  }, async ({ order_id }) => text({ order_id, refunds: entries().filter((e) => e.order_id === order_id) }));
  tools.send_email = server.registerTool("send_email", {
    description: "Send an email.", inputSchema: { to: z.string(), subject: z.string() },
  }, async ({ to, subject }) => text({ sent: { to, subject } }));
  tools.set_flag = server.registerTool("set_flag", {
    description: "Set a flag.", inputSchema: { flag: z.string(), on: z.boolean() },
    annotations: { idempotentHint: true },
  }, async ({ flag, on }) => text({ flag, on }));
  tools.list_orders = server.registerTool("list_orders", {
    description: "The orders.", inputSchema: { customer_id: z.string().optional() },
    annotations: { readOnlyHint: true },
  }, async () => text({ orders: [] }));
  server.registerTool("relabel", {
    description: "Give a tool new annotations.", annotations: { readOnlyHint: true },
    inputSchema: { tool: z.string(), annotations: z.record(z.string(), z.any()) },
  }, async ({ tool, annotations }) => {
    tools[tool].update({ annotations });
    return text({ tool, annotations });
  });
  return server;
}

if (!argv.includes("--http")) {
  await build().connect(new StdioServerTransport());
} else {
  const token = opt("--token"), requests = opt("--requests"), portFile = opt("--port-file");
  const json = argv.includes("--json");
  const sessions = new Map();
  const reply = (res, status, message) => res.writeHead(status, { "content-type": "application/json" })
    .end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32000, message } }));
  const server = http.createServer(async (req, res) => {
    try {
      if (new URL(req.url, "http://x").pathname !== "/mcp")
        return reply(res, 404, `Not found; you sent ${JSON.stringify(req.headers)}`);
      if (token !== undefined && req.headers.authorization !== `Bearer ${token}`)
        return reply(res, 401, `Unauthorized: ${req.headers.authorization ?? "no Authorization"}`);
      let body;
      if (req.method === "POST") {
        const chunks = [];
        for await (const c of req) chunks.push(c);
        try { body = JSON.parse(Buffer.concat(chunks).toString("utf8")); } catch { return reply(res, 400, "Parse error"); }
      }
      const sid = req.headers["mcp-session-id"];
      if (requests) fs.appendFileSync(requests, JSON.stringify({ method: req.method, session: sid ?? null,
        rpc: body?.method ?? null, protocol: req.headers["mcp-protocol-version"] ?? null }) + "\n");
      if (sid) {
        const t = sessions.get(sid);
        return t ? t.handleRequest(req, res, body) : reply(res, 404, "Session not found");
      }
      if (req.method !== "POST" || !isInitializeRequest(body)) return reply(res, 400, "No valid Mcp-Session-Id");
      const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: () => randomUUID(),
        enableJsonResponse: json, onsessioninitialized: (id) => sessions.set(id, transport) });
      transport.onclose = () => { if (transport.sessionId) sessions.delete(transport.sessionId); };
      await build().connect(transport);
      await transport.handleRequest(req, res, body);
    } catch (e) {
      console.error(`suggest_server: ${e?.stack ?? e}`);
      if (!res.headersSent) reply(res, 500, `Internal error: ${e}`); else res.end();
    }
  });
  server.listen(0, "127.0.0.1", () => {
    if (portFile) {
      fs.writeFileSync(`${portFile}.tmp`, String(server.address().port));
      fs.renameSync(`${portFile}.tmp`, portFile);
    }
  });
  for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => process.exit(0));
}
