// An MCP server, written with the official SDK, whose tools' annotations
// change while it runs: what `idem mcp` makes of a re-list (SPEC 10: a
// tool's class never weakens during a gateway's life without an idem: line).
//
//   node relist_server.mjs LEDGER
//
// send_refund, send_gift and set_label append one line to LEDGER per call
// they apply ({"tool","order_id"}) and dedupe nothing, so a repeat that
// reaches them shows as a second line.  At first send_refund and send_gift
// have no annotations (guarded) and set_label says readOnlyHint: true.
// relabel({tool, annotations}) gives a tool new annotations; the SDK tells
// the client with notifications/tools/list_changed.
import fs from "node:fs";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { z } from "zod";

const ledger = process.argv[2];
const server = new McpServer({ name: "relist", version: "1.0.0" });
const text = (obj) => ({ content: [{ type: "text", text: JSON.stringify(obj) }] });
const tools = {};

for (const [name, annotations] of [["send_refund", undefined], ["send_gift", undefined],
                                    ["set_label", { readOnlyHint: true }]])
  tools[name] = server.registerTool(
    name,
    { description: `${name} (applies something)`, inputSchema: { order_id: z.string() },
      ...(annotations ? { annotations } : {}) },
    async ({ order_id }) => {
      fs.appendFileSync(ledger, JSON.stringify({ tool: name, order_id }) + "\n");
      return text({ tool: name, order_id, n: fs.readFileSync(ledger, "utf8").split("\n").length - 1 });
    },
  );

server.registerTool(
  "relabel",
  { description: "Give a tool new annotations.", annotations: { readOnlyHint: true },
    inputSchema: { tool: z.string(), annotations: z.record(z.string(), z.any()) } },
  async ({ tool, annotations }) => {
    tools[tool].update({ annotations });
    return text({ tool, annotations });
  },
);

await server.connect(new StdioServerTransport());
