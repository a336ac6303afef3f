// A hand-written MCP server (plain JSON lines, no SDK) for the wire tests of
// `idem mcp`: it misbehaves on purpose where the SDK would not.
//
//   node raw_server.mjs DIR
//
// DIR/received gets every line it reads.  Tools (found by whatever
// params.name is, as handlers[params.name] finds them; an unknown one: -32602):
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

// Looked up by whatever name the call gives, as many JavaScript servers do:
// handlers[["slow_refund"]] is handlers["slow_refund"] (a key is a string).
const refund = (m) => {
  fs.appendFileSync(`${dir}/ledger`, JSON.stringify({ key: m.params._meta?.["io.idem/key"] }) + "\n");
  setTimeout(() => result(m.id, { refunded: true }), delay);
};
const handlers = {
  slow_refund: refund,
  slow_charge: refund,
  slow_ptr: refund,
  burst(m, a) {
    for (let i = 0; i < a.n; i++)
      send({ jsonrpc: "2.0", method: "notifications/message", params: { level: "info", data: i } });
    result(m.id, { sent: a.n });
  },
  noise(m) {
    process.stdout.write("this is not json\n");
    const line = JSON.stringify({ jsonrpc: "2.0", id: m.id, result: { content: [{ type: "text", text: "clean" }] } }) + "\n";
    process.stdout.write(line.slice(0, 10));
    setTimeout(() => process.stdout.write(line.slice(10, 30)), 50);
    setTimeout(() => process.stdout.write(line.slice(30)), 100);
  },
  huge(m, a) { result(m.id, { pad: "x".repeat(a.bytes) }); },
  exit(m, a) { process.exit(a.code); },
  hang() {},
  charge_status(m, a) {
    const seen = fs.existsSync(`${dir}/ledger`) && fs.readFileSync(`${dir}/ledger`, "utf8").includes(`"${a.key}"`);
    send({ jsonrpc: "2.0", id: m.id, result: { content: [{ type: "text", text: "see structuredContent" }],
                                                structuredContent: { state: seen ? "done" : "none" } } });
  },
};

function handle(m) {
  const h = Object.hasOwn(handlers, m.params?.name) ? handlers[m.params.name] : null;
  if (h) h(m, m.params.arguments ?? {});
  else if (m.id !== undefined) send({ jsonrpc: "2.0", id: m.id, error: { code: -32602, message: `no tool ${m.params?.name}` } });
}
