// A hand-written MCP server (plain JSON lines, no SDK) that misbehaves the
// ways issue 20 found, for wall_test.mjs.  Every tool that "applies" writes
// one line {tool, key, args} to DIR/ledger first; the test counts them.
//
//   node wall_server.mjs DIR
//
// Tools (all guarded unless the policy says otherwise):
//   refund          applies, answers {refunded: true}; after $WALL_SLOW ms
//                   when args.slow is true
//   close_out       applies, then closes its stdout and keeps running
//   not_object      applies, answers "result": "notanobject"
//   is_error        applies, then answers isError with "provider timed out"
//                   (an SDK handler whose own call to the provider threw)
//   exit_mid        applies, then exits without answering
//   half_line       applies, writes half of its answer's line, then exits
//   refund_status {key}  read-only: the ledger lines holding key, as JSON
// DIR/pid holds the server's pid.
import fs from "node:fs";
import { send, serve } from "./jsonl_server.mjs";

const dir = process.argv[2];
fs.writeFileSync(`${dir}/pid`, String(process.pid));
const text = (obj) => ({ content: [{ type: "text", text: JSON.stringify(obj) }] });
const names = ["refund", "close_out", "not_object", "is_error", "is_error_nostatus", "is_error_rejected",
               "exit_mid", "half_line"];
const tools = [...names.map((name) => ({ name, inputSchema: { type: "object" } })),
               { name: "refund_status", inputSchema: { type: "object" }, annotations: { readOnlyHint: true } }];

function apply(m) {
  fs.appendFileSync(`${dir}/ledger`, JSON.stringify({ tool: m.params.name, key: m.params._meta?.["io.idem/key"],
                                                      args: m.params.arguments }) + "\n");
}

serve({ name: "wall", tools, call: handle });

function handle(m) {
  if (m.id === undefined) apply(m); // a server that acts on a notification
  const a = m.params.arguments ?? {};
  switch (m.params.name) {
  case "refund":
    apply(m);
    setTimeout(() => send({ jsonrpc: "2.0", id: m.id, result: text({ refunded: true }) }),
               a.slow ? Number(process.env.WALL_SLOW ?? 1000) : 0);
    break;
  case "close_out":
    apply(m);
    fs.closeSync(1);
    setInterval(() => {}, 1000); // and lives on
    break;
  case "not_object":
    apply(m);
    send({ jsonrpc: "2.0", id: m.id, result: "notanobject" });
    break;
  case "is_error":
  case "is_error_nostatus":
  case "is_error_rejected":
    apply(m);
    send({ jsonrpc: "2.0", id: m.id, result: { content: [{ type: "text", text: "provider timed out" }], isError: true } });
    break;
  case "exit_mid":
    apply(m);
    process.exit(3);
    break;
  case "half_line": {
    apply(m);
    const line = JSON.stringify({ jsonrpc: "2.0", id: m.id, result: text({ refunded: true }) });
    fs.writeSync(1, line.slice(0, 20));
    process.exit(0);
    break;
  }
  case "refund_status": {
    const hits = (fs.existsSync(`${dir}/ledger`) ? fs.readFileSync(`${dir}/ledger`, "utf8") : "")
      .split("\n").filter((l) => l && JSON.parse(l).key === a.key);
    send({ jsonrpc: "2.0", id: m.id, result: text({ refunds: hits.map((l) => JSON.parse(l).key) }) });
    break;
  }
  default:
    send({ jsonrpc: "2.0", id: m.id, error: { code: -32602, message: "no such tool" } });
  }
}
