// A hand-written MCP server (JSON lines, no SDK) that lists its tools badly
// on purpose, for `idem mcp --suggest-policy` and the gateway's learning of
// tools/list (suggest_test.mjs).
//
//   node suggest_raw_server.mjs MODE [DIR]
//
//   junk      one page of malformed entries among real tools: names that are
//             not strings or are empty, a name listed twice, annotations and
//             schemas of the wrong types, a name of 20000 bytes, names and
//             arguments that look like placeholders ("$key", "{$env:X}")
//   pages     the tools over three pages (nextCursor), the last without one
//   loop      every page says nextCursor "again"
//   huge      50000 tools on one page, with status tools for half of them
//   notjson   answers initialize with a line that is not JSON
//   exit      exits with status 3 on initialize
//   error     answers tools/list with -32601
//   notools   answers tools/list with {"tools": "none"}
//   ping      sends a ping before answering initialize and writes the
//             answer it gets to DIR/pong
import fs from "node:fs";
import { readLines, send } from "./jsonl_server.mjs";

const [mode, dir] = process.argv.slice(2);
const obj = (props) => ({ type: "object", properties: Object.fromEntries(props.map((p) => [p, { type: "string" }])) });

const junk = [
  { name: 5 }, "refund", null, [], { name: "" }, { name: ["charge"] }, {},
  { name: "charge", inputSchema: obj(["charge_id", "$key", "{$env:X}"]), annotations: { destructiveHint: true } },
  { name: "get_charge_status", inputSchema: { ...obj(["charge_id", "$key"]), required: ["charge_id", 7, null] },
    annotations: { readOnlyHint: true } },
  { name: "charge", annotations: { readOnlyHint: true } },
  { name: "weird", annotations: "yes", inputSchema: { properties: [] } },
  { name: "weird_status", annotations: { readOnlyHint: "true" }, inputSchema: "none" },
  { name: "x".repeat(20000), inputSchema: obj(["id"]) },
  { name: "get_" + "x".repeat(20000), inputSchema: obj(["id"]), annotations: { readOnlyHint: true } },
  { name: "{$key}", inputSchema: obj(["id"]) },
  { name: "get_{$key}", inputSchema: obj(["id"]), annotations: { readOnlyHint: true } },
  { name: "café_order", inputSchema: obj(["order_id"]) },
  { name: "get_café_order", inputSchema: obj(["order_id"]), annotations: { readOnlyHint: true } },
];
const pages = [
  [{ name: "refund", inputSchema: obj(["order_id"]), annotations: { destructiveHint: true } }],
  [{ name: "get_refund_status", inputSchema: obj(["order_id"]), annotations: { readOnlyHint: true } }],
  [{ name: "send_email", inputSchema: obj(["to"]) }],
];
const huge = [];
for (let i = 0; i < 25000; i++) {
  huge.push({ name: `act_${i}`, inputSchema: obj([`thing_${i}_id`]) });
  huge.push({ name: `get_act_${i}_status`, inputSchema: obj([`thing_${i}_id`]), annotations: { readOnlyHint: true } });
}

readLines((line) => handle(JSON.parse(line)));

function handle(m) {
  if (m.id === "pong-me") { fs.writeFileSync(`${dir}/pong`, JSON.stringify(m)); return; }
  if (m.method === "initialize") {
    if (mode === "exit") process.exit(3);
    if (mode === "notjson") { process.stdout.write("hello, I am a server\n"); return; }
    if (mode === "ping") send({ jsonrpc: "2.0", id: "pong-me", method: "ping" });
    return send({ jsonrpc: "2.0", id: m.id, result: { protocolVersion: m.params.protocolVersion,
      capabilities: { tools: {} }, serverInfo: { name: "raw", version: "1" } } });
  }
  if (m.method !== "tools/list") {
    if (m.id !== undefined) send({ jsonrpc: "2.0", id: m.id, error: { code: -32601, message: "no such method" } });
    return;
  }
  if (mode === "error") return send({ jsonrpc: "2.0", id: m.id, error: { code: -32601, message: "no tools here" } });
  if (mode === "notools") return send({ jsonrpc: "2.0", id: m.id, result: { tools: "none" } });
  if (mode === "loop") return send({ jsonrpc: "2.0", id: m.id, result: { tools: [], nextCursor: "again" } });
  if (mode === "huge") return send({ jsonrpc: "2.0", id: m.id, result: { tools: huge } });
  if (mode === "pages") {
    const page = Number(m.params?.cursor ?? 0);
    return send({ jsonrpc: "2.0", id: m.id, result: { tools: pages[page],
      ...(page + 1 < pages.length ? { nextCursor: String(page + 1) } : {}) } });
  }
  send({ jsonrpc: "2.0", id: m.id, result: { tools: junk } });
}
