// The upstream of tests/mcp/bench_http.mjs: an MCP server on the official
// SDK over Streamable HTTP (stateful sessions, JSON answers), with a
// read-only tool and one the bench's policy guards.  Prints its URL.
//
//   node bench_http_server.mjs
import http from "node:http";
import { randomUUID } from "node:crypto";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { z } from "zod";

const transports = new Map();
function server() {
  const s = new McpServer({ name: "bench", version: "1.0.0" });
  s.registerTool("echo", { inputSchema: { message: z.string() }, annotations: { readOnlyHint: true } },
                 async ({ message }) => ({ content: [{ type: "text", text: message }] }));
  s.registerTool("add", { inputSchema: { a: z.number(), b: z.number() } },
                 async ({ a, b }) => ({ content: [{ type: "text", text: String(a + b) }] }));
  return s;
}

const h = http.createServer(async (req, res) => {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
  const sid = req.headers["mcp-session-id"];
  let t = sid && transports.get(sid);
  if (!t) {
    if (sid || req.method !== "POST" || body?.method !== "initialize") {
      res.writeHead(404).end();
      return;
    }
    t = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(), enableJsonResponse: true,
      onsessioninitialized: (id) => transports.set(id, t),
    });
    t.onclose = () => t.sessionId && transports.delete(t.sessionId);
    await server().connect(t);
  }
  await t.handleRequest(req, res, body);
});
h.keepAliveTimeout = 60000;
h.listen(0, "127.0.0.1", () => console.log(`http://127.0.0.1:${h.address().port}/mcp`));
