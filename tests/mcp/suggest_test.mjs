// `idem mcp --suggest-policy` (a policy drafted from a server's tools/list)
// and the gateway's notices on a server's tools (docs/MCP.md).
//
//  1. Over stdio, in front of suggest_server.mjs (the official SDK): the
//     draft's classes (destructive, unannotated and idempotentHint-only
//     tools guarded, readOnlyHint read_only), the status check proposed for
//     refund (get_refund_status by order_id), the key_arg, a note that says
//     what to add where no status tool fits; `idem policy check` accepts it.
//  2. The same server over Streamable HTTP (SSE answers, then JSON ones):
//     the same draft; the session kept from initialize, the protocol
//     version sent, the session DELETEd at the end; a --header with
//     {$env:NAME}; an unset NAME, a refused credential and a body that
//     echoes it - no header value ever printed.
//  3. Servers that list badly (suggest_raw_server.mjs): malformed entries,
//     pages, pages that never end, 50000 tools, not JSON, an exit, an
//     error, a ping: a valid draft or one clear line, never a crash.
//  4. The running gateway (idem mcp --console 127.0.0.1:0): a listed tool
//     the policy does not name, and a change of a tool's annotations, said
//     once each on stderr, in /api/info and in /metrics; junk in a
//     tools/list passes through without harm.
//
//   node suggest_test.mjs PATH/TO/idem
import fs from "node:fs";
import path from "node:path";
import { spawn } from "node:child_process";
import { here, idem, check, done, tmpdir, connect, call, rawGateway, req, sanitizerSaid } from "./lib.mjs";

const dir = tmpdir("suggest");
const server = ["node", path.join(here, "suggest_server.mjs")];
const raw = (mode) => ["node", path.join(here, "suggest_raw_server.mjs"), mode, dir];

// idem with args; its exit code, stdout, stderr
function run(args, env = {}) {
  return new Promise((resolve) => {
    const p = spawn(idem, args, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    let out = "", err = "";
    p.stdout.on("data", (d) => { out += d; });
    p.stderr.on("data", (d) => { err += d; });
    p.on("exit", (code, sig) => resolve({ code, sig, out, err }));
  });
}
const suggest = (target, extra = [], env = {}) => run(["mcp", "--suggest-policy", ...extra, "--", ...target], env);
const parse = (s) => { try { return JSON.parse(s); } catch { return null; } };
async function policyCheck(text, tag) {
  const f = path.join(dir, `${tag}.json`);
  fs.writeFileSync(f, text);
  return run(["policy", "check", f]);
}
const clean = (r) => !sanitizerSaid(r.err);

// ---- 1. stdio ------------------------------------------------------------------
let r = await suggest(server);
const draft = parse(r.out);
check(r.code === 0 && draft && clean(r), "stdio: exit 0 and a JSON draft on stdout", r.code, r.err);
const t = draft?.tools ?? {};
check(draft?.unknown_tools === "refuse", "the draft refuses tools it does not name", draft?.unknown_tools);
check(JSON.stringify(Object.keys(t)) ===
      JSON.stringify(["refund", "get_refund_status", "send_email", "set_flag", "list_orders", "relabel"]),
      "every tool, in the server's order", Object.keys(t));
for (const [tool, cls] of [["refund", "guarded"], ["send_email", "guarded"], ["set_flag", "guarded"],
                           ["get_refund_status", "read_only"], ["list_orders", "read_only"], ["relabel", "read_only"]])
  check(t[tool]?.class === cls, `${tool} is ${cls}`, t[tool]);
check(JSON.stringify(t.refund?.status) === JSON.stringify({ tool: "get_refund_status",
      arguments: { order_id: "{order_id}" }, applied_when: "key_present" }),
      "refund: the status check proposed is get_refund_status by its order_id", t.refund?.status);
check(t.refund?.key_arg === "idempotency_key", "refund: its idempotency_key argument is the key_arg", t.refund);
check(/destructiveHint: true/.test(t.refund?.note) && /io\.idem\/key/.test(t.refund?.note),
      "refund: the note says why guarded and what to check of the status tool", t.refund?.note);
check(!t.send_email?.status && /no annotations/.test(t.send_email?.note) && /Add a "status"/.test(t.send_email?.note),
      "send_email: no status tool fits; the note says so and what to add", t.send_email);
check(!t.set_flag?.status && /idempotentHint: true/.test(t.set_flag?.note) &&
      /"class": "idempotent"/.test(t.set_flag?.note),
      "set_flag (idempotentHint alone): guarded, and the note says how to make it idempotent", t.set_flag);
check(Object.values(t).every((x) => typeof x.note === "string"), "every rule has a note");
let pc = await policyCheck(r.out, "stdio");
check(pc.code === 0 && /ok \(6 tools/.test(pc.out), "idem policy check accepts the draft", pc);
check(/a draft policy for the 6 tools of the server \(node\): 3 guarded \(1 with a status check proposed\), 3 read_only/
      .test(r.err), "stderr sums the draft up", r.err);

// ---- 2. Streamable HTTP ----------------------------------------------------------
async function httpServer(tag, extra = []) {
  const portFile = path.join(dir, `${tag}.port`), requests = path.join(dir, `${tag}.requests`);
  const p = spawn("node", [path.join(here, "suggest_server.mjs"), path.join(dir, `${tag}.ledger`), "--http",
                           "--port-file", portFile, "--requests", requests, ...extra], { stdio: "inherit" });
  for (let i = 0; i < 200 && !fs.existsSync(portFile); i++) await new Promise((res) => setTimeout(res, 50));
  const port = fs.readFileSync(portFile, "utf8");
  return { p, url: `http://127.0.0.1:${port}/mcp`, base: `http://127.0.0.1:${port}`,
           requests: () => fs.readFileSync(requests, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l)) };
}

for (const [tag, extra] of [["sse", []], ["json", ["--json"]]]) {
  const h = await httpServer(tag, extra);
  r = await suggest([h.url]);
  check(r.code === 0 && r.out === JSON.stringify(draft, null, 2) + "\n" && clean(r),
        `HTTP (${tag} answers): the same draft as over stdio`, r.code, r.err);
  const q = h.requests();
  const sid = q[1]?.session;
  check(q.length === 4 && q[0].rpc === "initialize" && q[0].session === null &&
        q[1].rpc === "notifications/initialized" && q[2].rpc === "tools/list" && q[3].method === "DELETE" &&
        sid && q.slice(1).every((x) => x.session === sid && x.protocol === "2025-06-18"),
        `HTTP (${tag}): initialize, then the session and protocol version on every request, DELETE at the end`, q);
  h.p.kill();
}

const token = "s3cr3t-t0ken-value";
const h = await httpServer("auth", ["--token", token]);
const auth = ["--header", "Authorization: Bearer {$env:SUGGEST_TOKEN}"];
r = await suggest([h.url], auth, { SUGGEST_TOKEN: token });
check(r.code === 0 && JSON.stringify(parse(r.out)) === JSON.stringify(draft) && !r.err.includes(token),
      "a --header with {$env:NAME}, filled from the environment: the server takes it", r.code, r.err);
r = await suggest([h.url], ["--header", "Authorization: Bearer {$env:SUGGEST_NO_SUCH_VAR}"]);
check(r.code === 2 && r.out === "" &&
      r.err === "idem: --header Authorization: the environment variable SUGGEST_NO_SUCH_VAR is not set\n",
      "an unset variable: exit 2, one line naming it", r.code, r.err);
r = await suggest([h.url], auth, { SUGGEST_TOKEN: "wrong-" + token });
check(r.code === 1 && /answered initialize with HTTP 401: a credential given with --header was refused/.test(r.err) &&
      !r.err.includes(token), "a refused credential: HTTP 401 said, the value never printed", r.code, r.err);
r = await suggest([h.url]);
check(r.code === 1 && /HTTP 401: it wants a credential: give it with --header/.test(r.err),
      "no credential at all: what to give", r.err);
h.p.kill();
// a server that echoes what it was sent in an error's body
const echo = await httpServer("echo");
r = await suggest([echo.base + "/nothing?key=" + token], ["--header", `X-Api-Key: {$env:SUGGEST_TOKEN}`],
                  { SUGGEST_TOKEN: token });
check(r.code === 1 && /HTTP 404: \(the body is not shown: it holds a --header value\)/.test(r.err) &&
      !r.err.includes(token), "an HTTP error: its status, and neither the query nor a header value", r.err);
echo.p.kill();
r = await suggest(["http://127.0.0.1:1/mcp"]);
check(r.code === 1 && /the server at http:\/\/127\.0\.0\.1:1\/mcp did not answer initialize: /.test(r.err),
      "nothing listening: one line", r.err);
r = await suggest(["http://127.0.0.1:1/mcp"], [], { IDEM_LIBCURL: "/nonexistent/libcurl.so.4" });
check(r.code === 1 && /^idem: a URL needs libcurl \(.*\); install the package libcurl4\n$/.test(r.err),
      "without libcurl: one line saying what to install", r.code, r.err);
r = await suggest(["http://127.0.0.1:1/mcp", "extra"]);
check(r.code === 2, "a URL takes no arguments", r.code, r.err);
r = await suggest(server, ["--header", "A: b"]);
check(r.code === 2 && /--header is for a server at an http/.test(r.err), "--header is for a URL", r.err);
r = await run(["mcp", "--suggest-policy", "--policy", "x.json", "--", ...server]);
check(r.code === 2 && /takes only --header/.test(r.err), "--suggest-policy takes no other option", r.err);

// ---- 3. servers that list badly --------------------------------------------------
r = await suggest(raw("junk"));
const junk = parse(r.out);
pc = await policyCheck(r.out, "junk");
check(r.code === 0 && junk && pc.code === 0 && clean(r), "malformed entries: a draft idem policy check accepts",
      r.code, r.err, pc);
check(/listed 7 entries without a name/.test(r.err) && /listed 1 tool again/.test(r.err),
      "... and stderr says what was left out", r.err);
check(junk?.tools?.charge?.class === "guarded" && junk.tools.charge.status?.tool === "get_charge_status" &&
      JSON.stringify(junk.tools.charge.status.arguments) === '{"charge_id":"{charge_id}"}',
      "... the first charge kept, its status tool found past junk in required, \"$key\" never an argument",
      junk?.tools?.charge);
check(junk?.tools?.weird_status?.class === "guarded", 'readOnlyHint: "true" (a string) is no readOnlyHint',
      junk?.tools?.weird_status);
r = await suggest(raw("pages"));
check(r.code === 0 && JSON.stringify(Object.keys(parse(r.out)?.tools ?? {})) ===
      '["refund","get_refund_status","send_email"]' && parse(r.out).tools.refund.status?.tool === "get_refund_status",
      "three pages by nextCursor: every tool, matched across pages", r.code, r.out, r.err);
const t0 = Date.now();
r = await suggest(raw("huge"));
const hugeDraft = parse(r.out);
check(r.code === 0 && Object.keys(hugeDraft?.tools ?? {}).length === 50000 &&
      hugeDraft.tools.act_7.status?.tool === "get_act_7_status" && Date.now() - t0 < 30000,
      `50000 tools: drafted, matched, in ${Date.now() - t0} ms`, r.code, r.err);
for (const [mode, code, said] of [
  ["loop", 65, /gives tools\/list pages that do not end \(a nextCursor that came before\)/],
  ["notjson", 65, /answered initialize with a message that is not JSON/],
  ["exit", 1, /the server \(node\) exited with status 3 before it answered initialize/],
  ["error", 1, /answered tools\/list with error -32601: no tools here/],
  ["notools", 65, /answered tools\/list without a list of tools \("tools" is a string\)/]]) {
  r = await suggest(raw(mode));
  check(r.code === code && r.out === "" && said.test(r.err) && r.err.split("\n").length === 2 && clean(r),
        `${mode}: exit ${code}, one line`, r.code, r.err);
}
r = await suggest(raw("ping"));
check(r.code === 0 && parse(fs.readFileSync(path.join(dir, "pong"), "utf8"))?.result !== undefined,
      "a ping from the server is answered", r.code, r.err);
r = await suggest(["/no/such/server"]);
check(r.code === 1 && /cannot run \/no\/such\/server: No such file or directory/.test(r.err), "no such command", r.err);

// ---- 4. the gateway's notices --------------------------------------------------------
const gw = await connect({ policy: path.join(here, "suggest_policy.json"), log: `sqlite:${dir}/log.db`,
                           server: [...server, path.join(dir, "gw.ledger")], extra: ["--console", "127.0.0.1:0"] });
let url = null;
for (let i = 0; i < 100 && !url; i++) {
  const m = /idem serve: (http:\/\/\S+\/)/.exec(gw.stderr());
  if (m) url = m[1];
  else await new Promise((res) => setTimeout(res, 50));
}
const said = (re) => gw.stderr().split("\n").filter((l) => re.test(l));
await gw.client.listTools();
await gw.client.listTools();
const unnamed = said(/which the policy does not name/);
check(unnamed.length === 3 && ["send_email", "set_flag", "list_orders"].every((n) =>
        unnamed.filter((l) => l.startsWith(`idem: tools/list lists ${n}, which the policy does not name: it is `)).length === 1),
      "each listed tool the policy does not name: one line, however often listed", unnamed);
check(/list_orders, which the policy does not name: it is read_only \(readOnlyHint: true\)/.test(unnamed.join("\n")),
      "... saying the class its annotations give it", unnamed);
const relabel = (tool, annotations) => call(gw.client, "relabel", { tool, annotations });
const relist = async () => { await gw.client.listTools(); await gw.client.listTools(); };
await relabel("send_email", { readOnlyHint: true });
await relabel("set_flag", { idempotentHint: true, title: "Flag" });
await relabel("refund", { destructiveHint: false });
await relist();
await relabel("set_flag", { idempotentHint: true });
await relist();
await relabel("set_flag", { idempotentHint: true, title: "Flag" }); // a change said before
await relist();
const changes = said(/tools\/list (changes the annotations of|gives) /);
const want = [ // in the order of the listing
  'idem: tools/list changes the annotations of refund: {"destructiveHint":true,"readOnlyHint":false} before, ' +
    '{"destructiveHint":false} now; the policy names it, and its class stays the policy\'s',
  "idem: tools/list gives send_email readOnlyHint: true; ignored: it was listed guarded before",
  'idem: tools/list changes the annotations of set_flag: {"idempotentHint":true} before, ' +
    '{"idempotentHint":true,"title":"Flag"} now; its class stays guarded',
  'idem: tools/list changes the annotations of set_flag: {"idempotentHint":true,"title":"Flag"} before, ' +
    '{"idempotentHint":true} now; its class stays guarded'];
check(changes.length === want.length && want.every((w, i) => changes[i].startsWith(w)),
      "each change of a tool's annotations: one line, once per tool and change (a weakening: ignored, in its words)",
      changes);
const info = await (await fetch(url + "api/info")).json();
const notices = info.tool_notices ?? [];
check(notices.length === 7 && notices.filter((n) => n.kind === "unnamed").length === 3 &&
      notices.filter((n) => n.kind === "annotations_changed").map((n) => n.tool).join() ===
      "refund,send_email,set_flag,set_flag" &&
      notices.every((n) => gw.stderr().includes(`idem: ${n.message}`) && n.at > 0),
      "/api/info lists the notices, in the words of stderr", notices);
const metrics = await (await fetch(url + "metrics")).text();
check(/^idem_mcp_tools_unnamed 3$/m.test(metrics) && /^# TYPE idem_mcp_tools_unnamed gauge$/m.test(metrics) &&
      /^idem_mcp_tool_annotation_changes_total 4$/m.test(metrics) &&
      /^# TYPE idem_mcp_tool_annotation_changes_total counter$/m.test(metrics),
      "/metrics: idem_mcp_tools_unnamed 3, idem_mcp_tool_annotation_changes_total 4",
      metrics.split("\n").filter((l) => l.includes("idem_mcp")));
let exit = await gw.close();
check(exit.code === 0 && !sanitizerSaid(gw.stderr()), "the gateway exits 0, nothing from the sanitizers", exit,
      gw.stderr().slice(-2000));

// junk in a tools/list, through the gateway
const g = rawGateway({ policy: path.join(here, "suggest_policy.json"), log: `sqlite:${dir}/log2.db`, session: "s",
                       server: raw("junk") });
g.send(req(1, "initialize", { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "t", version: "1" } }));
await g.byId(1);
g.send(req(2, "tools/list"));
g.send(req(3, "tools/list"));
const listed = await g.byId(3);
check(Array.isArray(listed.result?.tools) && listed.result.tools.length === 18,
      "junk in a tools/list reaches the client as it came", listed.result?.tools?.length);
const lines = g.stderr.split("\n").filter((l) => /which the policy does not name/.test(l));
check(lines.length === 10 && lines.some((l) => /lists x{100}\.\.\., which/.test(l)) &&
      lines.some((l) => l.includes("lists {$key}, which")),
      "... each named tool said once, long names cut", lines.map((l) => l.slice(0, 150)));
g.p.stdin.end();
exit = await g.exited;
check(exit.code === 0 && !sanitizerSaid(g.stderr), "... and the gateway exits 0", exit, g.stderr.slice(-2000));
done();
