// Two callers of one `idem mcp --listen` gateway are kept apart by the
// Authorization they present (the gateway keys them by a digest of it):
// the provider (http_payments_server.mjs --tokens A,B, not deduping)
// accepts both tokens, and each caller is its own principal.
//
//   node http_callers_test.mjs PATH/TO/idem
//
//  a. callers A and B send the same _meta io.idem/session + io.idem/call_id
//     with the same arguments: two actions, two refunds, each caller its own
//     result; each one's repeat replays its own
//  b. the same, at the same moment
//  c. B presenting A's Mcp-Session-Id (POST tools/call with _meta ids, POST
//     with A's JSON-RPC id, GET, DELETE) is refused with HTTP 4xx and
//     nothing of it is forwarded to the provider; A's session goes on
//  d. --caller-header X-Forwarded-User (a trusted proxy names the user):
//     two users with one token are two callers
import fs from "node:fs";
import { tmpdir, ledgerOf, body, call } from "./lib.mjs";
import { check, sanitizerSaid, watchdog, finish, section, startUpstream, startGateway, httpClient, rawSession,
         tryPost } from "./http_peers.mjs";

watchdog(120000);
const dir = tmpdir("httpcallers");
const ledger = `${dir}/ledger`;
const log = `sqlite:${dir}/log.db`;
const A = "tok_A_" + Math.random().toString(36).slice(2), B = "tok_B_" + Math.random().toString(36).slice(2);
fs.writeFileSync(`${ledger}.nodedupe`, "");
const refunds = (order) => ledgerOf(ledger).filter((e) => e.order_id === order);
const T = { timeout: 20000 };
const replayed = (r) => !r.isError && r._meta?.["io.idem/replayed"] === true;

const up = await startUpstream(dir, ledger, ["--tokens", `${A},${B}`]);
const g = await startGateway({ log, upstream: up.url });
const cA = await httpClient(g.url, { token: A, name: "caller-A" });
const cB = await httpClient(g.url, { token: B, name: "caller-B" });
const callsFor = (order) => up.calls().filter((c) => c.tool === "refund_payment" &&
  refunds(order).some((e) => e.meta_key && e.meta_key === c.meta?.["io.idem/key"]));

// ---- a: the same session + call id from two callers
await section("a", async () => {
  const m = { "io.idem/session": "shared", "io.idem/call_id": "toolu_same" };
  const args = { order_id: "o1", amount_cents: 1000 };
  const rA = await call(cA.client, "refund_payment", args, m, T);
  const rB = await call(cB.client, "refund_payment", args, m, T);
  check(!rA.isError && !rB.isError && !replayed(rB) && body(rA).refund_id !== body(rB).refund_id &&
        refunds("o1").length === 2,
        `a: A and B, same session and call id: two actions, two refunds (ledger ${refunds("o1").length})`, rA, rB);
  check(callsFor("o1").map((c) => c.auth).sort().join() === "token#0,token#1",
        "a: the provider got one under A's token, one under B's", callsFor("o1"));
  const rA2 = await call(cA.client, "refund_payment", args, m, T);
  const rB2 = await call(cB.client, "refund_payment", args, m, T);
  check(replayed(rA2) && body(rA2).refund_id === body(rA).refund_id && replayed(rB2) && body(rB2).refund_id === body(rB).refund_id &&
        refunds("o1").length === 2, "a: each caller's repeat replays its own result", rA2, rB2);
  const keys = refunds("o1").map((e) => e.idempotency_key);
  console.log(`     (the keys the provider got: ${keys.join(" , ")})`);
});

// ---- b: at the same moment
await section("b", async () => {
  const m = { "io.idem/session": "shared", "io.idem/call_id": "toolu_both" };
  const args = { order_id: "o2", amount_cents: 2000 };
  const [rA, rB] = await Promise.all([call(cA.client, "refund_payment", args, m, T), call(cB.client, "refund_payment", args, m, T)]);
  check(!rA.isError && !rB.isError && body(rA).refund_id !== body(rB).refund_id && refunds("o2").length === 2,
        `b: A and B at once: two refunds, each its own (ledger ${refunds("o2").length})`, rA, rB);
});

// ---- c: B presenting A's Mcp-Session-Id
await section("c", async () => {
  const sidA = cA.transport.sessionId;
  check(!!sidA && sidA !== cB.transport.sessionId, "c: A and B have Mcp-Session-Ids of their own", sidA, cB.transport.sessionId);
  const pv = "2025-06-18";
  const n0 = up.requests().length;
  const x = await tryPost(g.url, { jsonrpc: "2.0", id: 41, method: "tools/call",
                                params: { name: "refund_payment", arguments: { order_id: "o3", amount_cents: 3000 },
                                          _meta: { "io.idem/session": "shared", "io.idem/call_id": "hijack" } } },
                       { session: sidA, token: B, protocolVersion: pv });
  check(x.status >= 400 && x.status < 500 && refunds("o3").length === 0,
        `c: B's tools/call in A's Mcp-Session-Id is refused: HTTP ${x.status}`, x.text);

  // A's call by JSON-RPC id (no _meta), then B sends that id with those arguments in A's session
  const rsA = await rawSession(g.url, { token: A });
  const a5 = await rsA.call(5, "refund_payment", { order_id: "o4", amount_cents: 4000 });
  const resA = a5.answer(5)?.result;
  check(resA && !resA.isError && refunds("o4").length === 1, "c: A's call by JSON-RPC id 5 refunds", a5.text);
  const n1 = up.requests().length;
  const b5 = await tryPost(g.url, { jsonrpc: "2.0", id: 5, method: "tools/call",
                                 params: { name: "refund_payment", arguments: { order_id: "o4", amount_cents: 4000 } } },
                        { session: rsA.session, token: B, protocolVersion: rsA.protocolVersion });
  check(b5.status >= 400 && b5.status < 500 && !(resA && b5.text.includes(body(resA).refund_id)) && refunds("o4").length === 1,
        `c: B's id 5 in A's raw session is refused (HTTP ${b5.status}), and gets nothing of A's result`, b5.text);
  const get = await fetch(g.url, { method: "GET", headers: { accept: "text/event-stream", "mcp-session-id": sidA,
                                                            authorization: `Bearer ${B}`, "mcp-protocol-version": pv },
                                   signal: AbortSignal.timeout(5000) });
  await get.body?.cancel();
  check(get.status >= 400 && get.status < 500, `c: B's GET (the SSE stream) of A's session is refused: HTTP ${get.status}`);
  const del = await fetch(g.url, { method: "DELETE", headers: { "mcp-session-id": sidA, authorization: `Bearer ${B}`,
                                                               "mcp-protocol-version": pv }, signal: AbortSignal.timeout(5000) });
  await del.body?.cancel();
  check(del.status >= 400 && del.status < 500, `c: B's DELETE of A's session is refused: HTTP ${del.status}`);
  const seen = up.requests().slice(n0).filter((l) => l.auth !== "token#0"); // what A did meanwhile is A's own
  check(seen.length === 0, "c: nothing B sent in A's session reached the provider", seen);
  check(up.requests().slice(n1).length === 0, "c: (nothing at all reached it after A's id 5)", up.requests().slice(n1));
  const still = await cA.client.listTools(undefined, T);
  const r = await call(cA.client, "refund_payment", { order_id: "o5", amount_cents: 5 }, { "io.idem/session": "shared", "io.idem/call_id": "after" }, T);
  check(still.tools.length > 0 && !r.isError && refunds("o5").length === 1, "c: A's session goes on", r);
});

// ---- d: --caller-header: a trusted proxy in front names the user
await section("d", async () => {
  const g2 = await startGateway({ log, upstream: up.url, extra: ["--caller-header", "X-Forwarded-User"] });
  const as = async (user) => httpClient(g2.url, { token: A, headers: { "X-Forwarded-User": user }, name: user });
  const [alice, bob, alice2] = [await as("alice"), await as("bob"), await as("alice")];
  const m = { "io.idem/session": "proxied", "io.idem/call_id": "toolu_p" };
  const args = { order_id: "o6", amount_cents: 600 };
  const ra = await call(alice.client, "refund_payment", args, m, T);
  const rb = await call(bob.client, "refund_payment", args, m, T);
  const ra2 = await call(alice2.client, "refund_payment", args, m, T);
  check(!ra.isError && !rb.isError && !replayed(rb) && body(ra).refund_id !== body(rb).refund_id &&
        replayed(ra2) && body(ra2).refund_id === body(ra).refund_id && refunds("o6").length === 2,
        `d: --caller-header X-Forwarded-User: alice and bob (one token) are two callers; alice again replays hers (ledger ${refunds("o6").length})`,
        ra, rb, ra2);
  for (const c of [alice, bob, alice2]) await c.close();
  await g2.stop();
});

await cA.close();
await cB.close();
const e = await g.stop();
check(e.sig !== "SIGKILL" && !sanitizerSaid(g.stderr()), "the gateway stops on SIGTERM, nothing from the sanitizers", e, g.stderr());
await finish(dir);
