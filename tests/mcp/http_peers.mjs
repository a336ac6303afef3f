// What the Streamable HTTP tests of `idem mcp` share (http_story_test.mjs,
// http_oauth_test.mjs, http_callers_test.mjs):
// starting the peers (http_payments_server.mjs, oauth_server.mjs) and the
// gateway with --listen, SDK clients over StreamableHTTPClientTransport, a
// raw HTTP client for what the SDK will not send, an OAuthClientProvider
// that approves itself, and bounded waits.  Every child started here is
// killed when the test ends, however it ends.
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { spawn, execFileSync } from "node:child_process";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";
import { idem, here, check as libCheck, done, sanitizerSaid } from "./lib.mjs";

// lib.mjs's check(), counted here: finish() keeps a failed test's files
let failed = 0;
export function check(cond, what, ...detail) {
  if (!cond) failed++;
  libCheck(cond, what, ...detail);
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export const statusOf = (r) => r?.structuredContent?.status ?? r?._meta?.["io.idem/status"];

// f() true within ms, else an Error naming what
export async function until(what, f, ms = 15000) {
  const t = Date.now();
  while (!(await f())) {
    if (Date.now() - t > ms) throw new Error(`timed out (${ms} ms) waiting for ${what}`);
    await sleep(25);
  }
}

// p, or a rejection naming what after ms
export function bounded(p, ms, what) {
  let t;
  return Promise.race([p, new Promise((_, rej) => { t = setTimeout(() => rej(new Error(`timed out (${ms} ms): ${what}`)), ms); })])
    .finally(() => clearTimeout(t));
}

// ---- children: all killed at the end
const children = new Set();
process.on("exit", () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) try { c.kill("SIGKILL"); } catch {}
});
function track(p) {
  children.add(p);
  p.exited = new Promise((r) => {
    p.once("exit", (code, sig) => { children.delete(p); r({ code, sig }); });
    // could not be started (ENOENT, EACCES: a binary being rebuilt): no exit event comes
    p.once("error", (e) => { p.spawnError = e; children.delete(p); r({ code: null, sig: null, error: String(e) }); });
  });
  return p;
}
// SIGTERM, then SIGKILL after ms; resolves to the exit
export async function stop(p, ms = 5000) {
  if (p.exitCode !== null || p.signalCode !== null || p.spawnError) return p.exited;
  p.kill("SIGTERM");
  const t = setTimeout(() => { try { p.kill("SIGKILL"); } catch {} }, ms);
  const e = await p.exited;
  clearTimeout(t);
  return e;
}
export async function stopAll() {
  await Promise.all([...children].map((c) => stop(c)));
}
// A watchdog for the whole test: FAIL and exit when it has not ended in ms.
export function watchdog(ms) {
  setTimeout(() => {
    console.log(`FAIL the test did not end within ${ms} ms`);
    process.exit(1); // the exit handler kills the children
  }, ms).unref();
}
// Runs one part of a test; an exception in it is a FAIL line, and the
// test goes on with the next part.
export async function section(name, f) {
  try {
    await f();
  } catch (e) {
    check(false, `${name}: the section ran to its end`, String(e?.stack ?? e));
  }
}
// Stops every child; removes dir when all passed, else says where it is.
export async function finish(dir) {
  await stopAll();
  if (dir && !failed) fs.rmSync(dir, { recursive: true, force: true });
  else if (dir) console.log(`     (kept ${dir})`);
  done();
}

// a port nobody listens on now (for a peer that must know its public URL
// before the gateway listens there)
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

async function portFrom(file, proc, what, ms = 10000) {
  await until(`${what} to write its port`, () => {
    if (proc.spawnError) throw new Error(`${what} could not be started: ${proc.spawnError}`);
    if (proc.exitCode !== null || proc.signalCode !== null) throw new Error(`${what} exited: ${proc.exitCode ?? proc.signalCode}`);
    return fs.existsSync(file);
  }, ms);
  return Number(fs.readFileSync(file, "utf8"));
}

// http_payments_server.mjs on LEDGER; args as for it (--token, --oauth ...).
// requests(): its --requests lines.
let upstreams = 0;
export async function startUpstream(dir, ledger, args = [], script = path.join(here, "http_payments_server.mjs")) {
  const n = ++upstreams;
  const portFile = `${dir}/upstream${n}.port`, requestsFile = `${dir}/upstream${n}.requests`;
  const p = track(spawn("node", [script, ledger, "--port", "0",
                                 "--port-file", portFile,
                                 ...(path.basename(script) === "http_payments_server.mjs" ? ["--requests", requestsFile] : []),
                                 ...args],
                        { stdio: ["ignore", "inherit", "pipe"] }));
  let stderr = "";
  p.stderr.on("data", (d) => { stderr += d; });
  const port = await portFrom(portFile, p, "http_payments_server");
  const lines = () => (fs.existsSync(requestsFile) ? fs.readFileSync(requestsFile, "utf8").split("\n").filter(Boolean)
    .map((l) => JSON.parse(l)) : []);
  return { proc: p, port, url: `http://127.0.0.1:${port}/mcp`, ledger, script, requests: lines, stderr: () => stderr,
           // the tools/call requests it got: [{auth, session, tool, meta, id}]
           calls: () => lines().flatMap((l) => l.rpc?.filter((m) => m.method === "tools/call")
             .map((m) => ({ auth: l.auth, session: l.session, status: l.status, ...m })) ?? []),
           stop: () => stop(p) };
}

export async function startOAuth(dir) {
  const portFile = `${dir}/oauth.port`, log = `${dir}/oauth.log`;
  const p = track(spawn("node", [path.join(here, "oauth_server.mjs"), "--port", "0", "--port-file", portFile,
                                 "--log", log], { stdio: ["ignore", "inherit", "pipe"] }));
  let stderr = "";
  p.stderr.on("data", (d) => { stderr += d; });
  const port = await portFrom(portFile, p, "oauth_server");
  return { proc: p, port, url: `http://127.0.0.1:${port}`, stderr: () => stderr,
           log: () => (fs.existsSync(log) ? fs.readFileSync(log, "utf8").split("\n").filter(Boolean)
             .map((l) => JSON.parse(l)) : []),
           stop: () => stop(p) };
}

// `idem mcp --policy P --log L [extra] --listen LISTEN -- UPSTREAM...`;
// resolves once its stderr says `idem mcp: listening on URL`.
export async function startGateway({ policy = path.join(here, "policy.json"), log, listen = "127.0.0.1:0",
                                     extra = [], upstream, env = {}, ms = 10000 }) {
  const args = ["mcp", "--policy", policy, "--log", log, ...extra, "--listen", listen, "--",
                ...(Array.isArray(upstream) ? upstream : [upstream])];
  const e = { ...process.env, ...env };
  for (const k of Object.keys(e)) if (e[k] === undefined) delete e[k]; // env: {NAME: undefined} unsets NAME
  const p = track(spawn(idem, args, { env: e, stdio: ["ignore", "ignore", "pipe"] }));
  let stderr = "";
  p.stderr.on("data", (d) => { stderr += d; });
  let url;
  try {
    await until("idem mcp to say `listening on`", () => {
      const m = /idem mcp: listening on (http:\/\/\S+)/.exec(stderr);
      if (m) { url = m[1]; return true; }
      if (p.spawnError) throw new Error(`idem mcp could not be started: ${p.spawnError}`);
      if (p.exitCode !== null || p.signalCode !== null) throw new Error(`idem mcp exited (${p.exitCode ?? p.signalCode})`);
      return false;
    }, ms);
  } catch (e) {
    e.message += `\n     command: ${idem} ${args.map((a) => JSON.stringify(a)).join(" ")}\n     stderr: ${stderr}`;
    try { p.kill("SIGKILL"); } catch {}
    throw e;
  }
  return { proc: p, pid: p.pid, url, args, stderr: () => stderr, exited: p.exited, stop: () => stop(p),
           kill: async (sig = "SIGKILL") => { p.kill(sig); return p.exited; } };
}

// An SDK client over Streamable HTTP; token → "Authorization: Bearer token"
// on every request.  authProvider for the SDK's own OAuth flow.
export async function httpClient(url, { token, authProvider, headers = {}, ms = 15000, name = "idem-http-test" } = {}) {
  const h = { ...headers, ...(token ? { Authorization: `Bearer ${token}` } : {}) };
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: h }, authProvider });
  const client = new Client({ name, version: "1.0.0" });
  await bounded(client.connect(transport, { timeout: ms }), ms + 1000, `connect to ${url}`);
  return { client, transport, close: () => bounded(client.close(), 5000, "client.close").catch(() => {}) };
}

// The OAuth flow as the SDK's own client runs it: connect, get
// UnauthorizedError once the provider was sent to authorize, finishAuth
// with the code, connect again (a new transport, the same provider).
export async function oauthClient(url, provider, ms = 15000) {
  try {
    return await httpClient(url, { authProvider: provider, ms });
  } catch (e) {
    if (!(e instanceof UnauthorizedError) || !provider.code) throw e;
  }
  const t = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider });
  await bounded(t.finishAuth(provider.code), ms, "finishAuth");
  return httpClient(url, { authProvider: provider, ms });
}

// An OAuthClientProvider (SDK client/auth.js) whose user approves at once:
// redirectToAuthorization fetches the authorization URL itself and keeps
// the code of the redirect.
export class AutoApproveProvider {
  constructor(redirectUrl = "http://127.0.0.1:9/callback") {
    this._redirect = redirectUrl;
    this.authorizations = []; // the authorization URLs it was sent to
    this.code = undefined;
    this._client = undefined;
    this._tokens = undefined;
    this._verifier = undefined;
  }
  get redirectUrl() { return this._redirect; }
  get clientMetadata() {
    return { client_name: "idem-http-test", redirect_uris: [this._redirect], grant_types: ["authorization_code", "refresh_token"],
             response_types: ["code"], token_endpoint_auth_method: "none" };
  }
  state() { return "st_" + Math.random().toString(36).slice(2); }
  clientInformation() { return this._client; }
  saveClientInformation(c) { this._client = c; }
  tokens() { return this._tokens; }
  saveTokens(t) { this._tokens = t; }
  saveCodeVerifier(v) { this._verifier = v; }
  codeVerifier() { return this._verifier; }
  invalidateCredentials(scope) {
    if (scope === "all" || scope === "client") this._client = undefined;
    if (scope === "all" || scope === "tokens") this._tokens = undefined;
    if (scope === "all" || scope === "verifier") this._verifier = undefined;
  }
  async redirectToAuthorization(url) {
    this.authorizations.push(String(url));
    const r = await fetch(url, { redirect: "manual", signal: AbortSignal.timeout(5000) });
    const loc = r.headers.get("location");
    await r.body?.cancel();
    if (r.status !== 302 || !loc) throw new Error(`authorization endpoint answered ${r.status}, no redirect`);
    const back = new URL(loc);
    if (back.searchParams.get("error")) throw new Error(`authorization refused: ${back.searchParams.get("error")}: ` +
                                                        back.searchParams.get("error_description"));
    if (back.searchParams.get("state") !== url.searchParams.get("state")) throw new Error("authorization: state differs");
    this.code = back.searchParams.get("code");
  }
}

// ---- raw HTTP: one POST, its answer read whole (JSON or SSE), bounded
export async function post(url, message, { session, token, headers = {}, ms = 15000, protocolVersion, signal } = {}) {
  const h = { "content-type": "application/json", accept: "application/json, text/event-stream", ...headers };
  if (session) h["mcp-session-id"] = session;
  if (token) h.authorization = `Bearer ${token}`;
  if (protocolVersion) h["mcp-protocol-version"] = protocolVersion;
  const r = await fetch(url, { method: "POST", headers: h, body: typeof message === "string" ? message : JSON.stringify(message),
                               signal: signal ? AbortSignal.any([signal, AbortSignal.timeout(ms)]) : AbortSignal.timeout(ms) });
  const text = await r.text();
  const type = (r.headers.get("content-type") ?? "").split(";")[0].trim();
  let messages = [];
  if (type === "application/json") {
    try { const j = JSON.parse(text); messages = Array.isArray(j) ? j : [j]; } catch {}
  } else if (type === "text/event-stream") {
    for (const ev of text.split(/\r?\n\r?\n/)) {
      const data = ev.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data) try { messages.push(JSON.parse(data)); } catch {}
    }
  }
  return { status: r.status, headers: r.headers, text, messages, session: r.headers.get("mcp-session-id"),
           answer: (id) => messages.find((m) => m.id === id && !m.method) };
}

// post(), but a failure (a timeout, a reset) is an answer {status: 0, error}
export async function tryPost(url, message, o = {}) {
  try {
    return await post(url, message, o);
  } catch (e) {
    return { status: 0, error: String(e), headers: new Headers(), text: `(no answer: ${e})`, messages: [], answer: () => undefined };
  }
}
export const initializeMsg = (id = 1) => ({ jsonrpc: "2.0", id, method: "initialize",
  params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "1" } } });

// A raw MCP session: initialize + notifications/initialized.
export async function rawSession(url, { token, headers } = {}) {
  const init = await post(url, { jsonrpc: "2.0", id: 0, method: "initialize",
                                 params: { protocolVersion: "2025-06-18", capabilities: {},
                                           clientInfo: { name: "raw", version: "1" } } }, { token, headers });
  if (init.status !== 200 || !init.answer(0)?.result)
    throw new Error(`raw initialize: HTTP ${init.status}: ${init.text.slice(0, 500)}`);
  const session = init.session;
  const pv = init.answer(0).result.protocolVersion;
  const n = await post(url, { jsonrpc: "2.0", method: "notifications/initialized" },
                       { session, token, headers, protocolVersion: pv });
  if (n.status >= 300) throw new Error(`raw notifications/initialized: HTTP ${n.status}: ${n.text.slice(0, 500)}`);
  return {
    session, protocolVersion: pv,
    post: (message, o = {}) => post(url, message, { session, token, headers, protocolVersion: pv, ...o }),
    call: (id, name, args, meta, o = {}) =>
      post(url, { jsonrpc: "2.0", id, method: "tools/call",
                  params: { name, arguments: args, ...(meta ? { _meta: meta } : {}) } },
           { session, token, headers, protocolVersion: pv, ...o }),
  };
}

// The bytes of a file (and its -wal, -shm, -journal), for a secret that must not be there.
export function bytesOf(file) {
  return ["", "-wal", "-shm", "-journal"].map((s) => file + s).filter((f) => fs.existsSync(f))
    .map((f) => fs.readFileSync(f)).reduce((a, b) => Buffer.concat([a, b]), Buffer.alloc(0));
}

export const showRecord = (log, session, callId) => {
  try {
    return JSON.parse(execFileSync(idem, ["show", "--log", log, "--json", session, callId], { encoding: "utf8",
                                                                                               stdio: ["ignore", "pipe", "pipe"] }));
  } catch (e) {
    return { error: String(e.stderr ?? e) };
  }
};

export { idem, here, sanitizerSaid };
