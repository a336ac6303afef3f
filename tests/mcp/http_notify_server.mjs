// An SDK server over Streamable HTTP whose tool list changes while a
// client is connected (for http_notify_test.mjs): calling `grow` registers
// a new tool a moment after it answers, and the SDK then sends
// notifications/tools/list_changed on the session's GET stream - a
// message about no request.  Prints its URL.
import http from "node:http";
import { randomUUID } from "node:crypto";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { z } from "zod";

const transports = new Map();
let grown = 0;
function server() {
  const s = new McpServer({ name: "notify", version: "1.0.0" });
  s.registerTool("grow", { inputSchema: { n: z.number() }, annotations: { readOnlyHint: true } },
    async ({ n }) => {
      setTimeout(() => s.registerTool(`grown_${n}_${++grown}`, { annotations: { readOnlyHint: true } },
                                      async () => ({ content: [{ type: "text", text: "hi" }] })), 200);
      return { content: [{ type: "text", text: "growing" }] };
    });
  return s;
}
const h = http.createServer(async (req, res) => {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
  const sid = req.headers["mcp-session-id"];
  let t = sid && transports.get(sid);
  if (!t) {
    if (sid || req.method !== "POST" || body?.method !== "initialize") { res.writeHead(404).end(); return; }
    t = new StreamableHTTPServerTransport({ sessionIdGenerator: () => randomUUID(),
                                            onsessioninitialized: (id) => transports.set(id, t) });
    t.onclose = () => t.sessionId && transports.delete(t.sessionId);
    await server().connect(t);
  }
  await t.handleRequest(req, res, body);
});
h.listen(0, "127.0.0.1", () => console.log(`http://127.0.0.1:${h.address().port}/mcp`));
