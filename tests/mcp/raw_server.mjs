// A hand-written MCP server (plain JSON lines, no SDK) for the wire tests of
// `idem mcp`: it misbehaves on purpose where the SDK would not.
//
//   node raw_server.mjs DIR
//
// DIR/received gets every line it reads.  Tools:
//   slow_refund  appends to DIR/ledger, answers after $RAW_DELAY ms even
//                when cancelled (a late result); slow_charge: the same
//   burst {n}    n notifications/message, then the result
//   noise        a line that is not JSON, then the result in three writes
//   huge {bytes} a result of that many bytes
//   charge_status {key}  structuredContent {state: "done" | "none"}: whether
//                the ledger holds key
//   exit {code}  exits with that status
//   hang         never answers
import fs from "node:fs";
import { send, serve } from "./jsonl_server.mjs";

const dir = process.argv[2];
const delay = Number(process.env.RAW_DELAY ?? 0);
const result = (id, obj) => send({ jsonrpc: "2.0", id, result: { content: [{ type: "text", text: JSON.stringify(obj) }] } });
const tools = [
  { name: "slow_refund", inputSchema: { type: "object" } },
  { name: "slow_charge", inputSchema: { type: "object" } },
  { name: "burst", inputSchema: { type: "object" }, annotations: { readOnlyHint: true } },
  { name: "noise", inputSchema: { type: "object" }, annotations: { readOnlyHint: true } },
  { name: "huge", inputSchema: { type: "object" }, annotations: { readOnlyHint: true } },
  { name: "exit", inputSchema: { type: "object" }, annotations: { readOnlyHint: true } },
  { name: "hang", inputSchema: { type: "object" }, annotations: { readOnlyHint: true } },
  { name: "slow_ptr", inputSchema: { type: "object" } },
  { name: "charge_status", inputSchema: { type: "object" }, annotations: { readOnlyHint: true } },
];

serve({ name: "raw", tools, call: handle, onLine: (line) => fs.appendFileSync(`${dir}/received`, line + "\n") });

function handle(m) {
  const a = m.params.arguments ?? {};
  switch (m.params.name) {
  case "slow_refund":
  case "slow_charge":
  case "slow_ptr":
    fs.appendFileSync(`${dir}/ledger`, JSON.stringify({ key: m.params._meta?.["io.idem/key"] }) + "\n");
    setTimeout(() => result(m.id, { refunded: true }), delay);
    break;
  case "burst":
    for (let i = 0; i < a.n; i++)
      send({ jsonrpc: "2.0", method: "notifications/message", params: { level: "info", data: i } });
    result(m.id, { sent: a.n });
    break;
  case "noise": {
    process.stdout.write("this is not json\n");
    const line = JSON.stringify({ jsonrpc: "2.0", id: m.id, result: { content: [{ type: "text", text: "clean" }] } }) + "\n";
    process.stdout.write(line.slice(0, 10));
    setTimeout(() => process.stdout.write(line.slice(10, 30)), 50);
    setTimeout(() => process.stdout.write(line.slice(30)), 100);
    break;
  }
  case "huge":
    result(m.id, { pad: "x".repeat(a.bytes) });
    break;
  case "exit":
    process.exit(a.code);
    break;
  case "hang":
    break;
  case "charge_status": {
    const seen = fs.existsSync(`${dir}/ledger`) && fs.readFileSync(`${dir}/ledger`, "utf8").includes(`"${a.key}"`);
    send({ jsonrpc: "2.0", id: m.id, result: { content: [{ type: "text", text: "see structuredContent" }],
                                                structuredContent: { state: seen ? "done" : "none" } } });
    break;
  }
  }
}
