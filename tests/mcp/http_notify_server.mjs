// An SDK server over Streamable HTTP whose tool list changes while a
// client is connected (for http_notify_test.mjs): calling `grow` registers
// a new tool a moment after it answers, and the SDK then sends
// notifications/tools/list_changed on the session's GET stream - a
// message about no request.  Prints its URL.
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";
import { serveSessions } from "./sdk_http.mjs";

let grown = 0;
serveSessions(() => {
  const s = new McpServer({ name: "notify", version: "1.0.0" });
  s.registerTool("grow", { inputSchema: { n: z.number() }, annotations: { readOnlyHint: true } },
    async ({ n }) => {
      setTimeout(() => s.registerTool(`grown_${n}_${++grown}`, { annotations: { readOnlyHint: true } },
                                      async () => ({ content: [{ type: "text", text: "hi" }] })), 200);
      return { content: [{ type: "text", text: "growing" }] };
    });
  return s;
});
