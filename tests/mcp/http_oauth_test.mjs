// An OAuth-protected MCP server behind `idem mcp --listen`: the official
// SDK client runs its own discovery and authorization (client/auth.js: RFC
// 9728 protected-resource metadata, RFC 8414, dynamic client registration,
// authorization code + PKCE) against the test's authorization server
// (oauth_server.mjs), through the gateway, and the provider
// (http_payments_server.mjs --oauth) accepts only tokens issued for its
// resource.
//
//   node http_oauth_test.mjs PATH/TO/idem
//
//  0. the peers, straight (no idem): the SDK's OAuth flow gets a token and
//     refunds once
//  a. --public-url: the gateway listens on port P; the provider's resource
//     is http://127.0.0.1:P/mcp, the gateway's public URL.  The SDK client
//     connects to the gateway, discovers, registers, authorizes, gets a
//     token for that resource and refunds once (ledger 1); the repeat is
//     replayed
//  b. neither mode (no --public-url, no own credential) in front of a
//     provider whose resource is its own URL: the client gets a clear error
//     naming --public-url / --header (HTTP 502, MCP.md), not the SDK's
//     discovery failure "Protected resource ... does not match"; the
//     gateway goes on running
import fs from "node:fs";
import { tmpdir, ledgerOf, body, call } from "./lib.mjs";
import { check, sanitizerSaid, sleep, statusOf, watchdog, finish, section, startUpstream, startOAuth, startGateway,
         httpClient, oauthClient, AutoApproveProvider, tryPost, initializeMsg, freePort, showRecord } from "./http_peers.mjs";

watchdog(150000);
const dir = tmpdir("httpoauth");
const ledger = `${dir}/ledger`;
const log = `sqlite:${dir}/log.db`;
fs.writeFileSync(`${ledger}.nodedupe`, "");
const refunds = (order) => ledgerOf(ledger).filter((e) => e.order_id === order).length;
const T = { timeout: 20000 };
const as = await startOAuth(dir);
const flow = (from) => as.log().slice(from).map((l) => `${l.method} ${l.path} ${l.status}`);

// ---- 0: straight
await section("0", async () => {
  const port = await freePort();
  const self = `http://127.0.0.1:${port}/mcp`;
  const up = await startUpstream(dir, ledger, ["--oauth", "--resource", self, "--issuer", as.url, "--port", String(port)]);
  const prov = new AutoApproveProvider();
  const c = await oauthClient(up.url, prov);
  const r = await call(c.client, "refund_payment", { order_id: "o-direct", amount_cents: 100 }, undefined, T);
  check(!r.isError && refunds("o-direct") === 1 && prov.authorizations.length === 1 &&
        new URL(prov.authorizations[0]).searchParams.get("resource") === self,
        "0: the SDK's own OAuth flow, straight to the provider: a token for its resource, one refund", r, flow(0));
  await c.close();
  await up.stop();
});

// ---- a: --public-url
await section("a", async () => {
  const P = await freePort();
  const pub = `http://127.0.0.1:${P}/mcp`;
  const up = await startUpstream(dir, ledger, ["--oauth", "--resource", pub, "--issuer", as.url]);
  const g = await startGateway({ log, listen: `127.0.0.1:${P}`, extra: ["--public-url", pub], upstream: up.url });
  check(g.url === pub, `a: the gateway listens on its public URL ${pub}`, g.url);

  const x = await tryPost(g.url, initializeMsg(), { ms: 8000 });
  const www = x.headers.get("www-authenticate") ?? "";
  const prmUrl = /resource_metadata="([^"]*)"/.exec(www)?.[1];
  check(x.status === 401 && prmUrl === `http://127.0.0.1:${P}/.well-known/oauth-protected-resource/mcp`,
        "a: a client without a token gets 401, resource_metadata at the gateway's origin", x.status, www, x.text);
  if (prmUrl) {
    const m = await fetch(prmUrl, { signal: AbortSignal.timeout(5000) }).then(async (r) => ({ status: r.status, j: await r.json().catch(() => null) }));
    check(m.status === 200 && m.j?.resource === pub && m.j?.authorization_servers?.[0] === as.url,
          "a: the gateway serves the protected-resource metadata: resource = the public URL, the provider's authorization server", m);
  }

  const from = as.log().length;
  const prov = new AutoApproveProvider();
  const c = await oauthClient(g.url, prov);
  const steps = flow(from);
  const tokenLine = as.log().slice(from).find((l) => l.path === "/token" && l.status === 200);
  check(prov.authorizations.length === 1 && new URL(prov.authorizations[0]).searchParams.get("resource") === pub &&
        steps.includes("POST /register 201") && tokenLine?.aud === pub,
        "a: the SDK client discovered, registered, authorized and got a token for the public URL", steps, prov.authorizations);
  const m = { "io.idem/session": "oauth", "io.idem/call_id": "oa_1" };
  const r = await call(c.client, "refund_payment", { order_id: "o1", amount_cents: 6000 }, m, T);
  check(!r.isError && body(r).order_id === "o1" && refunds("o1") === 1, `a: one refund through the gateway (ledger ${refunds("o1")})`,
        r, showRecord(log, "oauth", "oa_1"), g.stderr());
  const r2 = await call(c.client, "refund_payment", { order_id: "o1", amount_cents: 6000 }, m, T);
  check(!r2.isError && r2._meta?.["io.idem/replayed"] === true && refunds("o1") === 1,
        `a: the repeat is replayed (ledger ${refunds("o1")})`, r2);
  const calls = up.calls().filter((k) => k.tool === "refund_payment");
  check(calls.length === 1 && /^oauth:client_/.test(calls[0].auth),
        "a: the provider got the call once, under the client's own token", up.calls());
  await c.close();
  const e = await g.stop();
  check(e.sig !== "SIGKILL" && !sanitizerSaid(g.stderr()), "a: the gateway stops on SIGTERM, nothing from the sanitizers",
        e, g.stderr());
  await up.stop();
});

// ---- b: neither --public-url nor an own credential
await section("b", async () => {
  const port = await freePort();
  const self = `http://127.0.0.1:${port}/mcp`;
  const up = await startUpstream(dir, ledger, ["--oauth", "--resource", self, "--issuer", as.url, "--port", String(port)]);
  const g = await startGateway({ log, upstream: up.url });
  const prov = new AutoApproveProvider();
  let err;
  try {
    const c = await httpClient(g.url, { authProvider: prov });
    await c.close();
  } catch (e) {
    err = e;
  }
  const said = String(err?.message ?? err);
  const x = await tryPost(g.url, initializeMsg(), { ms: 8000 });
  console.log(`     (the client was told: ${said.slice(0, 400)})`);
  check(x.status === 502 && /--public-url/.test(x.text), "b: raw, the gateway answers 502 with a JSON-RPC error naming --public-url",
        x.status, x.text);
  check(err && /--public-url|--header/.test(said) && !/does not match/.test(said),
        "b: the client gets a clear error naming --public-url / --header, not the SDK's \"does not match\"", said,
        `raw initialize: HTTP ${x.status} ${x.headers.get("www-authenticate") ?? ""} ${x.text.slice(0, 400)}`,
        `idem stderr: ${g.stderr()}`, `authorizations: ${prov.authorizations.length}`);
  await Promise.race([g.exited, sleep(500)]); // an exit is seen once its event came
  check(g.proc.exitCode === null && g.proc.signalCode === null, "b: the gateway still runs after saying so",
        { exit: g.proc.exitCode, signal: g.proc.signalCode }, g.stderr());
  check(!sanitizerSaid(g.stderr()), "b: nothing from the sanitizers", g.stderr());
  await g.stop();
  await up.stop();
});

await finish(dir);
