// The upstream of tests/mcp/bench_http.mjs: an MCP server on the official
// SDK over Streamable HTTP (stateful sessions, JSON answers), with a
// read-only tool and one the bench's policy guards.  Prints its URL.
//
//   node bench_http_server.mjs
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";
import { serveSessions } from "./sdk_http.mjs";

serveSessions(() => {
  const s = new McpServer({ name: "bench", version: "1.0.0" });
  s.registerTool("echo", { inputSchema: { message: z.string() }, annotations: { readOnlyHint: true } },
                 async ({ message }) => ({ content: [{ type: "text", text: message }] }));
  s.registerTool("add", { inputSchema: { a: z.number(), b: z.number() } },
                 async ({ a, b }) => ({ content: [{ type: "text", text: String(a + b) }] }));
  return s;
}, { json: true });
