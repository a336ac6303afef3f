// idem mcp over Streamable HTTP: the latency it adds and the throughput it
// keeps (issue 39), against the same calls straight to the upstream.  Not a
// test: run by hand, figures go to docs/PERFORMANCE.md.
//
//   node tests/mcp/bench_http.mjs build/idem [N] [CLIENTS] [SECONDS]
//
// One upstream (bench_http_server.mjs: the official SDK, JSON answers), and
// `idem mcp --listen 127.0.0.1:0 -- URL` in front of it.  The SDK's
// Streamable HTTP client calls each side one request at a time, in
// alternating rounds so that both see the same load, and prints for each
// kind of call the median and p90 round trip of each side in microseconds:
//   - a read-only call (passed through);
//   - a guarded call's replay (the same call id again: answered from the
//     log, the upstream not called) against a direct call of the tool;
//   - a guarded first call (new call id each time: the durable write-ahead
//     record and the outcome, each a synced commit, then the upstream);
// then CLIENTS clients at once (each its own MCP session) calling the
// read-only tool for SECONDS seconds on each side: calls per second, and
// the ratio.
import fs from "node:fs";
import path from "node:path";
import { spawn } from "node:child_process";
import { performance } from "node:perf_hooks";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { idem, here, tmpdir } from "./lib.mjs";

const N = Number(process.argv[3] ?? 1000);
const CLIENTS = Number(process.argv[4] ?? 100);
const SECONDS = Number(process.argv[5] ?? 5);
const dir = tmpdir("benchhttp");
const policy = `${dir}/policy.json`;
fs.writeFileSync(policy, JSON.stringify({ unknown_tools: "refuse", tools: {
  echo: { class: "read_only" }, add: { class: "guarded", timeout_ms: 5000 } } }));

function start(cmd, args, pattern) {
  const p = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"] });
  return new Promise((resolve, reject) => {
    let out = "";
    const look = (d) => { out += d; const m = out.match(pattern); if (m) resolve({ p, url: m[1] }); };
    p.stdout.on("data", look);
    p.stderr.on("data", look);
    p.once("exit", (c) => reject(new Error(`${cmd} exited ${c}: ${out}`)));
    setTimeout(() => reject(new Error(`${cmd}: no URL in 15 s: ${out}`)), 15000);
  });
}

const up = await start("node", [path.join(here, "bench_http_server.mjs")], /(http:\S+)/);
const gw = await start(idem, ["mcp", "--policy", policy, "--log", `sqlite:${dir}/log.db`, "--session", "bench",
                              "--listen", "127.0.0.1:0", "--", up.url], /listening on (http:\S+)/);

async function open(url) {
  const c = new Client({ name: "bench", version: "1.0.0" });
  await c.connect(new StreamableHTTPClientTransport(new URL(url)));
  await c.listTools();
  return c;
}
const direct = await open(up.url), through = await open(gw.url);

const q = (v, p) => { const s = [...v].sort((a, b) => a - b); return s[Math.floor(p * (s.length - 1))]; };
async function time(f, c, i) { const t = performance.now(); await f(c, i); return (performance.now() - t) * 1000; }
function report(name, d, g) {
  console.log(JSON.stringify({ figure: name, n: d.length,
    direct_median_us: Math.round(q(d, 0.5)), direct_p90_us: Math.round(q(d, 0.9)),
    idem_median_us: Math.round(q(g, 0.5)), idem_p90_us: Math.round(q(g, 0.9)),
    added_median_us: Math.round(q(g, 0.5) - q(d, 0.5)) }));
}

const echo = (c) => c.callTool({ name: "echo", arguments: { message: "hello" } });
const add = (c, i) => c.callTool({ name: "add", arguments: { a: i, b: 1 } });
const replay = (c) => c.callTool({ name: "add", arguments: { a: 1, b: 1 }, _meta: { "io.idem/call_id": "replayed" } });
const first = (c, i) => c.callTool({ name: "add", arguments: { a: i, b: 1 }, _meta: { "io.idem/call_id": `f${i}` } });

async function rounds(name, fd, fg, n) {
  const d = [], g = [];
  for (let i = 0; i < 100; i++) { await fd(direct, i); await fg(through, 1e6 + i); } // warm up
  for (let i = 0; i < n; i++) { d.push(await time(fd, direct, i)); g.push(await time(fg, through, i)); }
  report(name, d, g);
}
await replay(through);
await rounds("tools/call read_only (echo)", echo, echo, N);
await rounds("tools/call guarded, a replay (idem) vs the call (direct)", add, replay, N);
await rounds("tools/call guarded, a first call (two synced commits)", add, first, Math.min(N, 500));

async function load(url) {
  const clients = await Promise.all(Array.from({ length: CLIENTS }, () => open(url)));
  let calls = 0, stop = false;
  const t = performance.now();
  setTimeout(() => { stop = true; }, SECONDS * 1000);
  await Promise.all(clients.map(async (c) => { while (!stop) { await echo(c); calls++; } }));
  const rate = calls / ((performance.now() - t) / 1000);
  await Promise.all(clients.map((c) => c.close()));
  return rate;
}
const rd = await load(up.url), rg = await load(gw.url);
console.log(JSON.stringify({ figure: `${CLIENTS} clients at once, read_only calls`, seconds: SECONDS,
  direct_per_s: Math.round(rd), idem_per_s: Math.round(rg), ratio: Number((rg / rd).toFixed(2)) }));

await direct.close();
await through.close();
gw.p.kill("SIGTERM");
up.p.kill("SIGTERM");
fs.rmSync(dir, { recursive: true, force: true });
