// Pass-through conformance: @modelcontextprotocol/server-everything behind
// `idem mcp`, compared with a direct connection, both with the SDK client.
// The policy names no tool, so every tool is classified by its annotations.
//
//   node everything_test.mjs PATH/TO/idem
import fs from "node:fs";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { CreateMessageRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { idem, here, check, done, tmpdir, sanitizerSaid } from "./lib.mjs";

const dir = tmpdir("everything");
const server = ["node", path.join(here, "node_modules/@modelcontextprotocol/server-everything/dist/index.js"), "stdio"];
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

async function open(viaGateway) {
  const client = new Client({ name: "idem-test", version: "1.0.0" }, { capabilities: { sampling: {} } });
  // the server asks the client for a completion: a request the other way
  client.setRequestHandler(CreateMessageRequestSchema, async (req) => ({
    model: "test-model", role: "assistant",
    content: { type: "text", text: `sampled: ${req.params.messages[0].content.text}` },
  }));
  const cmd = viaGateway
    ? [idem, "mcp", "--policy", path.join(here, "everything_policy.json"), "--log", `sqlite:${dir}/log.db`,
       "--session", "ev", "--", ...server]
    : server;
  const transport = new StdioClientTransport({ command: cmd[0], args: cmd.slice(1), stderr: "pipe" });
  client.stderr = "";
  transport.stderr?.on("data", (d) => { client.stderr += d; });
  await client.connect(transport);
  client.exited = new Promise((r) => transport._process.once("exit", (code) => r(code)));
  return client;
}

const gw = await open(true);
const direct = await open(false);
const both = async (f) => [await f(gw), await f(direct)];

let [a, b] = await both((c) => c.listTools());
check(a.tools.length > 5 && same(a, b), "tools/list is the same through the gateway", a.tools.length, b.tools.length);
[a, b] = await both((c) => c.callTool({ name: "echo", arguments: { message: "héllo \u2028 \"x\"" } }));
check(same(a, b) && a.content[0].text.includes("héllo"), "echo (read-only) is the same", a, b);
[a, b] = await both((c) => c.callTool({ name: "get-sum", arguments: { a: 0.1, b: 1e21 } }));
check(same(a, b), "get-sum (add) is the same, numbers untouched", a, b);
[a, b] = await both((c) => c.callTool({ name: "get-structured-content", arguments: { location: "New York" } }));
check(same(a, b) && a.structuredContent, "structured content passes through", a, b);
[a, b] = await both((c) => c.listPrompts());
check(a.prompts.length > 0 && same(a, b), "prompts/list is the same", a, b);
const simple = a.prompts.find((p) => !(p.arguments ?? []).some((x) => x.required));
[a, b] = await both((c) => c.getPrompt({ name: simple.name }));
check(same(a, b), `prompts/get ${simple.name} is the same`, a, b);
[a, b] = await both((c) => c.listResources());
check(a.resources.length > 0 && same(a, b), "resources/list is the same", a.resources.length, b.resources.length);
[a, b] = await both((c) => c.readResource({ uri: a.resources[0].uri }));
check(same(a, b), "resources/read is the same", a, b);
[a, b] = await both((c) => c.listResourceTemplates());
check(same(a, b), "resources/templates/list is the same", a, b);

// server -> client notifications: progress of a long operation.  The SDK
// client runs a progress handler in a microtask but drops it synchronously
// when the response comes, so the last progress is lost whenever it shares
// a read with the response (directly too); wire_test.mjs counts raw lines.
const progress = [];
a = await gw.callTool({ name: "trigger-long-running-operation", arguments: { duration: 1, steps: 3 } }, undefined,
                      { onprogress: (p) => progress.push(p.progress) });
check(!a.isError && progress[0] === 1 && progress[1] === 2, "progress notifications reach the client", progress, a);

// a guarded tool (no readOnly/idempotent hints) whose server asks the client
// for a sampling completion while the guarded call is in flight
a = await gw.callTool({ name: "trigger-sampling-request", arguments: { prompt: "hi", maxTokens: 5 } });
b = await direct.callTool({ name: "trigger-sampling-request", arguments: { prompt: "hi", maxTokens: 5 } });
check(!a.isError && same(a, b) && JSON.stringify(a).includes("sampled: "),
      "a guarded call with a server->client request in flight works, result unchanged", a, b);
const recs = execFileSync(idem, ["ls", "--log", `sqlite:${dir}/log.db`, "--json"], { encoding: "utf8" })
  .split("\n").filter(Boolean).map((l) => JSON.parse(l));
check(recs.length === 1 && recs[0].tool === "trigger-sampling-request" && recs[0].state === "succeeded",
      "... it went through the guard (one record); the read-only tools left none", recs);
a = await gw.ping();
check(same(a, {}), "ping", a);

await gw.close();
await direct.close();
const code = await gw.exited;
check(code === 0 && !sanitizerSaid(gw.stderr), "the gateway exits 0, nothing from the sanitizers", code, gw.stderr);
fs.rmSync(dir, { recursive: true, force: true });
done();
