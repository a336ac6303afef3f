// An MCP server in front of an HTTP payment provider (idem-paysim), written
// with the official SDK the way many real ones are: its handler calls the
// provider with fetch() and gives up after 300 ms (AbortSignal.timeout).
// The SDK turns the handler's exception into a result with isError: true -
// while the provider may still apply the refund it was handed (issue 26).
//
//   node fetch_server.mjs PROVIDER_URL [SENT [MODE]]
//
// refund_payment {order_id, amount_cents, idempotency_key}: POST
//   PROVIDER_URL/v1/refunds, the key in the Idempotency-Key header; a 2xx
//   answer's body is the result; anything else - the abort, a 5xx - throws.
// get_refund_status {idempotency_key}: GET
//   PROVIDER_URL/v1/refunds?idempotency_key=K, the provider's list as is
//   (a refund names the key it was applied under; an empty list names none).
// SENT, when given, gets a line with the key of each POST, before it is sent,
// and "?KEY" for each status query.
//
// MODE (issue 27: what a JSON-RPC error proves):
//   bad-result  refund_payment declares an outputSchema and hands back
//               whatever the provider answered (a refund, or its 504) as
//               structuredContent - and as a text item without
//               JSON.stringify, so the SDK's check of the result, AFTER the
//               handler ran (and the POST went out), answers -32602
//   bad-output  refund_payment's structuredContent (the provider's refund)
//               fails its outputSchema: SDK 1.15 answered -32602, this one
//               (package.json) isError - after the handler ran, either way
//   no-tools    no tools at all: the SDK answers every tools/call -32601
import fs from "node:fs";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { z } from "zod";

const [url, sent, mode = ""] = process.argv.slice(2);
if (!url || !["", "bad-result", "bad-output", "no-tools"].includes(mode)) {
  console.error("usage: fetch_server.mjs PROVIDER_URL [SENT [bad-result|bad-output|no-tools]]");
  process.exit(2);
}
const FETCH_TIMEOUT_MS = 300;

const server = new McpServer({ name: "payments-over-http", version: "1.0.0" });
const outputSchema = {
  "bad-result": { id: z.string().optional(), status: z.string().optional() },
  "bad-output": { refund_id: z.string(), amount_cents: z.number() }, // paysim's refund has "id"
}[mode];
if (mode !== "no-tools") server.registerTool(
  "refund_payment",
  {
    description: "Refund an order (money moves).",
    inputSchema: { order_id: z.string(), amount_cents: z.number().int(), idempotency_key: z.string().optional() },
    ...(outputSchema ? { outputSchema } : {}),
  },
  async ({ order_id, amount_cents, idempotency_key }) => {
    if (sent) fs.appendFileSync(sent, `${idempotency_key ?? ""}\n`);
    const r = await fetch(`${url}/v1/refunds`, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...(idempotency_key ? { "Idempotency-Key": idempotency_key } : {}) },
      body: JSON.stringify({ order_id, amount_cents }),
      signal: AbortSignal.timeout(FETCH_TIMEOUT_MS),
    });
    const body = await r.text();
    if (mode === "bad-result") {
      const answer = JSON.parse(body);
      return { structuredContent: answer, content: [{ type: "text", text: answer }] };
    }
    if (!r.ok) throw new Error(`the provider answered ${r.status}: ${body}`);
    if (mode === "bad-output") return { structuredContent: JSON.parse(body), content: [{ type: "text", text: body }] };
    return { content: [{ type: "text", text: body }] };
  },
);
if (mode !== "no-tools") server.registerTool(
  "get_refund_status",
  {
    description: "The refunds applied under an idempotency key.",
    inputSchema: { idempotency_key: z.string() },
    annotations: { readOnlyHint: true },
  },
  async ({ idempotency_key }) => {
    if (sent) fs.appendFileSync(sent, `?${idempotency_key}\n`);
    const r = await fetch(`${url}/v1/refunds?idempotency_key=${encodeURIComponent(idempotency_key)}`,
                          { signal: AbortSignal.timeout(2000) });
    const body = await r.text();
    if (!r.ok) throw new Error(`the provider answered ${r.status}: ${body}`);
    return { content: [{ type: "text", text: body }] };
  },
);

await server.connect(new StdioServerTransport());
