// The MCP gateway's added latency (SPEC 12: under 1 ms per message at the
// median).  Not a test: run by hand, figures go to docs/PERFORMANCE.md.
//
//   node tests/mcp/bench.mjs build/idem [N]
//
// The same SDK client calls the same server (server-everything) directly
// and through `idem mcp`, one request at a time, in alternating rounds so
// that both sides see the same machine load.  For each kind of message it
// prints one JSON object: the median and p90 round trip of each side in
// microseconds, and the median added by the gateway.  A guarded call's
// figure includes its durable write-ahead record (an fdatasync).
import fs from "node:fs";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { idem, here, tmpdir } from "./lib.mjs";

const N = Number(process.argv[3] ?? 2000);
const dir = tmpdir("bench");
const policy = `${dir}/policy.json`;
fs.writeFileSync(policy, JSON.stringify({ unknown_tools: "refuse", tools: { echo: { class: "read_only" },
  "get-sum": { class: "guarded" } } }));
const server = ["node", path.join(here, "node_modules/@modelcontextprotocol/server-everything/dist/index.js"), "stdio"];

async function open(cmd) {
  const c = new Client({ name: "bench", version: "1.0.0" });
  await c.connect(new StdioClientTransport({ command: cmd[0], args: cmd.slice(1), stderr: "ignore" }));
  await c.listTools();
  return c;
}
const direct = await open(server);
const gw = await open([idem, "mcp", "--policy", policy, "--log", `sqlite:${dir}/log.db`, "--session", "bench",
                       "--", ...server]);

const kinds = {
  ping: (c) => c.ping(),
  "tools/call read_only (echo)": (c) => c.callTool({ name: "echo", arguments: { message: "hello" } }),
};
const guarded = { "tools/call guarded (get-sum)": (c, i) =>
  c.callTool({ name: "get-sum", arguments: { a: i, b: 1 }, _meta: { "io.idem/call_id": `b${i}` } }) };

const q = (v, p) => { const s = [...v].sort((a, b) => a - b); return s[Math.floor(p * (s.length - 1))]; };
async function time(f, c, i) { const t = performance.now(); await f(c, i); return (performance.now() - t) * 1000; }

for (const [name, f] of Object.entries(kinds)) {
  const d = [], g = [];
  for (let i = 0; i < 200; i++) { await f(direct, i); await f(gw, i); } // warm up
  for (let r = 0; r < N; r += 100)
    for (let i = 0; i < 100; i++) { d.push(await time(f, direct, r + i)); g.push(await time(f, gw, r + i)); }
  console.log(JSON.stringify({ bench: "mcp", message: name, n: d.length,
    direct_median_us: Math.round(q(d, 0.5)), gateway_median_us: Math.round(q(g, 0.5)),
    direct_p90_us: Math.round(q(d, 0.9)), gateway_p90_us: Math.round(q(g, 0.9)),
    added_median_us: Math.round(q(g, 0.5) - q(d, 0.5)) }));
}
for (const [name, f] of Object.entries(guarded)) {
  const g = [], d = [];
  const n = Math.min(N, 500);
  for (let i = 0; i < n; i++) {
    d.push(await time((c) => c.callTool({ name: "get-sum", arguments: { a: i, b: 1 } }), direct, i));
    g.push(await time(f, gw, i));
  }
  console.log(JSON.stringify({ bench: "mcp", message: name, n,
    direct_median_us: Math.round(q(d, 0.5)), gateway_median_us: Math.round(q(g, 0.5)),
    added_median_us: Math.round(q(g, 0.5) - q(d, 0.5)) }));
}
// what the guarded figure is made of: one fdatasync on the log's disk
{
  const fd = fs.openSync(`${dir}/sync`, "w");
  const v = [];
  for (let i = 0; i < 200; i++) {
    fs.writeSync(fd, "x".repeat(100));
    const t = performance.now();
    fs.fdatasyncSync(fd);
    v.push((performance.now() - t) * 1000);
  }
  fs.closeSync(fd);
  console.log(JSON.stringify({ bench: "mcp", message: "fdatasync of the log's disk", n: v.length,
    median_us: Math.round(q(v, 0.5)) }));
}
await gw.close();
await direct.close();
fs.rmSync(dir, { recursive: true, force: true });
