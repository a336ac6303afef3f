// An MCP server of the official SDK over Streamable HTTP with stateful
// sessions, for the small test servers that need nothing more: one
// McpServer per session (makeServer()), at /mcp on 127.0.0.1, a port of
// the kernel's; prints its URL on stdout.
import http from "node:http";
import { randomUUID } from "node:crypto";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";

export function serveSessions(makeServer, { json = false } = {}) {
  const transports = new Map();
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
      t = new StreamableHTTPServerTransport({ sessionIdGenerator: () => randomUUID(), enableJsonResponse: json,
                                              onsessioninitialized: (id) => transports.set(id, t) });
      t.onclose = () => t.sessionId && transports.delete(t.sessionId);
      await makeServer().connect(t);
    }
    await t.handleRequest(req, res, body);
  });
  h.keepAliveTimeout = 60000;
  h.listen(0, "127.0.0.1", () => console.log(`http://127.0.0.1:${h.address().port}/mcp`));
  return h;
}
