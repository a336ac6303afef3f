// A server's message about no request reaches its client through idem mcp
// over Streamable HTTP on both sides: the upstream session's GET stream
// (opened by idem after initialize) to the client's GET stream at idem,
// and to that client alone (SPEC §10b).
//
//   node http_notify_test.mjs PATH/TO/idem
import fs from "node:fs";
import path from "node:path";
import { spawn } from "node:child_process";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";
import { idem, here, tmpdir, check, done, sanitizerSaid } from "./lib.mjs";

const dir = tmpdir("notify");
const policy = `${dir}/policy.json`;
fs.writeFileSync(policy, JSON.stringify({ unknown_tools: "guard", tools: {} }));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function start(cmd, args, pattern) {
  const p = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  const url = new Promise((resolve, reject) => {
    const look = (d) => { out += d; const m = out.match(pattern); if (m) resolve(m[1]); };
    p.stdout.on("data", look);
    p.stderr.on("data", look);
    p.once("exit", (c) => reject(new Error(`${cmd} exited ${c}: ${out}`)));
    setTimeout(() => reject(new Error(`${cmd}: no URL in 15 s: ${out}`)), 15000);
  });
  return { p, url, out: () => out };
}

const up = start("node", [path.join(here, "http_notify_server.mjs")], /(http:\S+)/);
const gw = start(idem, ["mcp", "--policy", policy, "--log", `sqlite:${dir}/log.db`, "--listen", "127.0.0.1:0",
                        "--", await up.url], /listening on (http:\S+)/);
const url = new URL(await gw.url);

async function client(name) {
  const c = new Client({ name, version: "1.0.0" });
  let changed = 0;
  c.setNotificationHandler(ToolListChangedNotificationSchema, () => { changed++; });
  await c.connect(new StreamableHTTPClientTransport(url));
  return { c, changed: () => changed };
}
try {
  const a = await client("a"), b = await client("b");
  await sleep(300); // the clients' GET streams open
  const r = await a.c.callTool({ name: "grow", arguments: { n: 1 } });
  check(r.content?.[0]?.text === "growing", "the read-only call passes through", r);
  for (let i = 0; i < 50 && !a.changed(); i++) await sleep(100);
  check(a.changed() === 1, `the list_changed of a's session reaches a (${a.changed()})`);
  await sleep(300);
  check(b.changed() === 0, `... and not b, whose session it is not (${b.changed()})`);
  const tools = await a.c.listTools();
  check(tools.tools.some((t) => t.name.startsWith("grown_1")), "a lists the new tool", tools.tools.map((t) => t.name));
  await a.c.close();
  await b.c.close();
} catch (e) {
  check(false, "the test ran to its end", String(e?.stack ?? e));
}
gw.p.kill("SIGTERM");
const code = await new Promise((r) => gw.p.once("exit", (c, s) => r(c ?? s)));
check(code === 0, `the gateway exits 0 on SIGTERM (${code})`, gw.out());
check(!sanitizerSaid(gw.out()), "nothing from the sanitizers", gw.out());
up.p.kill("SIGTERM");
fs.rmSync(dir, { recursive: true, force: true });
done();
