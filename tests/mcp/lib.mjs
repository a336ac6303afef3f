// What the tests of `idem mcp` share: starting the gateway in front of a
// server with the SDK's own client, reading the payments ledger, checks.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { spawn } from "node:child_process";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

export const here = path.dirname(fileURLToPath(import.meta.url));
export const idem = process.argv[2];
if (!idem) {
  console.error(`usage: node ${process.argv[1]} PATH/TO/idem`);
  process.exit(2);
}

let failures = 0;
export function check(cond, what, ...detail) {
  if (cond) {
    console.log(`ok   ${what}`);
  } else {
    failures++;
    console.log(`FAIL ${what}`);
    for (const d of detail) console.log("     " + (typeof d === "string" ? d : JSON.stringify(d)));
  }
}
export function done() {
  console.log(failures ? `${failures} FAILED` : "all passed");
  process.exit(failures ? 1 : 0);
}

// What a sanitizer build or a crash would have said on stderr.
export const sanitizerSaid = (s) => /Sanitizer|runtime error:|Segmentation|Assertion/.test(s);

export function tmpdir(tag) {
  return fs.mkdtempSync(path.join(os.tmpdir(), `idem-mcp-${tag}-`));
}

export function ledgerOf(file) {
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
}

// An SDK client talking to `idem mcp ... -- server...`.
export async function connect({ policy = path.join(here, "policy.json"), log, session = "sess_1",
                                server, extra = [], env = {} }) {
  const args = ["mcp", "--policy", policy, "--log", log, ...(session ? ["--session", session] : []),
                ...extra, "--", ...server];
  const transport = new StdioClientTransport({
    command: idem, args, stderr: "pipe",
    env: { ...process.env, ...env },
  });
  const client = new Client({ name: "idem-test", version: "1.0.0" });
  let stderr = "";
  transport.stderr?.on("data", (d) => { stderr += d; });
  await client.connect(transport);
  const proc = transport._process; // pinned SDK version: the child process
  const exited = new Promise((r) => proc.once("exit", (code, sig) => r({ code, sig })));
  // close, and wait for the gateway to exit (a sanitizer build reports at exit)
  const close = async () => { await client.close(); return exited; };
  return { client, transport, pid: proc.pid, exited, close, stderr: () => stderr };
}

export function payments(ledger) {
  return ["node", path.join(here, "payments_server.mjs"), ledger];
}

// A tool result's JSON: structuredContent, else its first text item parsed.
export function body(result) {
  if (result.structuredContent) return result.structuredContent;
  const t = result.content?.find((c) => c.type === "text");
  try { return JSON.parse(t.text); } catch { return t?.text; }
}

export function call(client, name, args, meta, opts) {
  return client.callTool({ name, arguments: args, ...(meta ? { _meta: meta } : {}) }, undefined, opts);
}

// `idem mcp` with a raw client: send bytes (g.send), wait for whole lines
// (g.wait(pred), g.byId(id)); lines that are not JSON land in g.bad.
export function rawGateway({ policy, log, session, server, extra = [], env = {} }) {
  const p = spawn(idem, ["mcp", "--policy", policy, "--log", log, ...(session ? ["--session", session] : []),
                         ...extra, "--", ...server],
                  { env: { ...process.env, ...env }, stdio: ["pipe", "pipe", "pipe"] });
  const g = { p, lines: [], bad: [], stderr: "", waiters: [] };
  let buf = "";
  p.stdout.on("data", (d) => {
    buf += d;
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      try { g.lines.push(JSON.parse(line)); } catch { g.bad.push(line); }
    }
    g.waiters = g.waiters.filter((w) => !w());
  });
  p.stderr.on("data", (d) => { g.stderr += d; });
  p.stdin.on("error", () => {}); // a gateway that is gone: the test says so
  g.exited = new Promise((r) => p.on("exit", (code, sig) => r({ code, sig })));
  g.send = (s) => p.stdin.write(s);
  g.wait = (pred, ms = 10000) => new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error("timed out: " + pred)), ms);
    const w = () => { const m = g.lines.find(pred); if (m) { clearTimeout(t); resolve(m); return true; } return false; };
    if (!w()) g.waiters.push(w);
  });
  g.byId = (id, ms) => g.wait((m) => m.id === id && !m.method, ms);
  return g;
}

// One JSON-RPC request line.
export const req = (id, method, params) =>
  JSON.stringify({ jsonrpc: "2.0", id, method, ...(params ? { params } : {}) }) + "\n";
