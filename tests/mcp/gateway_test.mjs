// `idem mcp` in front of the payments server (payments_server.mjs), driven by
// the official SDK client: the refund story of SPEC 10, checked against the
// provider's ledger.
//
//   node gateway_test.mjs PATH/TO/idem
import fs from "node:fs";
import { execFileSync } from "node:child_process";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { idem, check, done, tmpdir, ledgerOf, connect, payments, body, call } from "./lib.mjs";

const dir = tmpdir("story");
const ledger = `${dir}/ledger`;
const log = `sqlite:${dir}/log.db`;
const show = (session, callId) =>
  JSON.parse(execFileSync(idem, ["show", "--log", log, "--json", session, callId], { encoding: "utf8" }));
const lines = (f) => (fs.existsSync(f) ? fs.readFileSync(f, "utf8").split("\n").filter(Boolean) : []);

// The same server, straight, for comparison.
const direct = new Client({ name: "direct", version: "1.0.0" });
await direct.connect(new StdioClientTransport({ command: payments(`${dir}/direct-ledger`)[0],
                                                args: payments(`${dir}/direct-ledger`).slice(1) }));
const gw = await connect({ log, server: payments(ledger) });
const { client, stderr } = gw;

// ---- tools/list and read-only tools pass through unchanged
const viaGw = await client.listTools();
const viaDirect = await direct.listTools();
check(JSON.stringify(viaGw) === JSON.stringify(viaDirect), "tools/list passes through unchanged",
      viaGw, viaDirect);
let r = await call(client, "get_refund_status", { order_id: "nothing" });
let d = await call(direct, "get_refund_status", { order_id: "nothing" });
check(JSON.stringify(r) === JSON.stringify(d), "a read_only tool (policy) passes through unchanged", r, d);
r = await call(client, "get_balance", {});
check(!r.isError && body(r).balance_cents === 100000, "a tool annotated readOnlyHint passes through", r);
// idempotentHint alone is a hint, not a class (SPEC 10, amended): guarded
await call(client, "set_nickname", { name: "bo" }, { "io.idem/call_id": "nick" });
r = await call(client, "set_nickname", { name: "bo" }, { "io.idem/call_id": "nick" });
check(r._meta?.["io.idem/replayed"] === true && lines(`${ledger}.nicknames`).length === 1,
      "a tool annotated idempotentHint alone is guarded: the repeat is replayed, it ran once", r,
      lines(`${ledger}.nicknames`));

// ---- a tool the policy does not name, without annotations: guarded
r = await call(client, "send_receipt", { order_id: "o-r" }, { "io.idem/call_id": "rcpt_1" });
let r2 = await call(client, "send_receipt", { order_id: "o-r" }, { "io.idem/call_id": "rcpt_1" });
check(!r.isError && r2._meta?.["io.idem/replayed"] === true && lines(`${ledger}.receipts`).length === 1,
      "an unannotated tool is guarded: the repeat is replayed, one receipt sent", r, r2);
r = await call(client, "no_such_tool", {}, { "io.idem/call_id": "x_1" });
check(r.isError && r.structuredContent?.status === "refused",
      "a tool neither named nor listed is refused (unknown_tools)", r);

// ---- replay
const args1 = { order_id: "o1", amount_cents: 6000, idempotency_key: "model-made-this-up" };
r = await call(client, "refund_payment", args1, { "io.idem/call_id": "toolu_1" });
check(!r.isError && body(r).refund_id === "re_1" && !r._meta, "a refund goes through once", r);
r2 = await call(client, "refund_payment", args1, { "io.idem/call_id": "toolu_1" });
check(r2._meta?.["io.idem/replayed"] === true && body(r2).refund_id === "re_1",
      "the repeat of toolu_1 is replayed with io.idem/replayed", r2);
check(ledgerOf(ledger).length === 1, "the ledger holds one refund", ledgerOf(ledger));

// ---- the key: minted by code, the model's value overwritten
const key = execFileSync(idem, ["key", "--session", "sess_1", "--call", "toolu_1", "--tool", "refund_payment",
                                "--key-arg", "idempotency_key", JSON.stringify(args1)], { encoding: "utf8" }).trim();
const e1 = ledgerOf(ledger)[0];
check(e1.idempotency_key === key && key.startsWith("sess_1:toolu_1:"),
      "a model-supplied key_arg is overwritten with the minted key", e1, key);
check(e1.meta_key === key, "the key travels in _meta io.idem/key too", e1);

// ---- conflict
r = await call(client, "refund_payment", { ...args1, amount_cents: 7000 }, { "io.idem/call_id": "toolu_1" });
check(r.isError && r.structuredContent?.status === "conflict" && r.content[0].text === r.structuredContent.message,
      "toolu_1 reused with other arguments is a conflict", r);
check(ledgerOf(ledger).length === 1, "... and nothing ran", ledgerOf(ledger));

// ---- session and call id from --session and the JSON-RPC id
r = await call(client, "refund_payment", { order_id: "o-id", amount_cents: 5 });
const byId = ledgerOf(ledger).find((e) => e.order_id === "o-id");
check(!r.isError && /^sess_1:jsonrpc%3A[0-9a-f]{16}%3A\d+:[0-9a-f]{16}$/.test(byId?.idempotency_key ?? ""),
      "without _meta, the session is --session and the call id the JSON-RPC id, scoped to this gateway process", byId);
r = await call(client, "refund_payment", { order_id: "o-s", amount_cents: 5 },
               { "io.idem/session": "other sess", "io.idem/call_id": "c/1" });
check(ledgerOf(ledger).find((e) => e.order_id === "o-s")?.idempotency_key.startsWith("other%20sess:c%2F1:"),
      "_meta io.idem/session and io.idem/call_id name the action", ledgerOf(ledger).at(-1));

// ---- a timeout after the refund was applied, reconciled by the status tool
fs.writeFileSync(`${ledger}.stall`, "");
let t0 = Date.now();
r = await call(client, "refund_payment", { order_id: "o2", amount_cents: 2500 }, { "io.idem/call_id": "toolu_2" });
check(!r.isError && r._meta?.["io.idem/status"] === "succeeded",
      "a refund applied but unanswered within timeout_ms is reconciled: succeeded", r);
check(Date.now() - t0 >= 1400, "... after the gateway's deadline", Date.now() - t0);
check(body(r).order_id === "o2" && r.content.length === 2 && r.content[1].type === "text" &&
      /refund_payment call went through \(a status check with get_refund_status found it applied\).*Do not call refund_payment again/
        .test(r.content[1].text) && r._meta?.["io.idem/message"] === r.content[1].text,
      "... the status tool's result comes first, then a text item that says in words what happened", r);
let rec = show("sess_1", "toolu_2");
check(rec.state === "succeeded" && rec.resolution === "reconciled", "... recorded succeeded, reconciled", rec);
check(ledgerOf(ledger).filter((e) => e.order_id === "o2").length === 1, "... one refund for o2", ledgerOf(ledger));
check(!lines(`${ledger}.cancelled`).includes(rec.key),
      "... and the server's request was not cancelled (its answer would still be recorded)",
      lines(`${ledger}.cancelled`));
r2 = await call(client, "refund_payment", { order_id: "o2", amount_cents: 2500 }, { "io.idem/call_id": "toolu_2" });
check(r2._meta?.["io.idem/replayed"] === true, "... and its repeat is replayed", r2);

// ---- a timeout without a status tool: outcome_unknown, then the fence
r = await call(client, "charge_card", { order_id: "o3", amount_cents: 900 }, { "io.idem/call_id": "toolu_3" });
const env = r.structuredContent;
check(r.isError && env?.status === "outcome_unknown" && r.content[0].type === "text" &&
      r.content[0].text === env.message && /not call/i.test(env.message),
      "no status tool: the deadline gives outcome_unknown as a tool result", r);
check(show("sess_1", "toolu_3").state === "in_doubt", "... the action is in doubt");
r2 = await call(client, "charge_card", { order_id: "o3", amount_cents: 900 }, { "io.idem/call_id": "toolu_4" });
check(r2.isError && r2.structuredContent?.status === "outcome_unknown" &&
      JSON.stringify(r2.structuredContent).includes("toolu_3"),
      "the model's re-issue with a new call id is fenced, naming toolu_3", r2);
check(ledgerOf(ledger).filter((e) => e.order_id === "o3").length === 1, "... one charge for o3", ledgerOf(ledger));
fs.unlinkSync(`${ledger}.stall`);

// ---- 50 concurrent calls
const before = ledgerOf(ledger).length;
t0 = Date.now();
const many = await Promise.all(Array.from({ length: 50 }, (_, i) =>
  call(client, "refund_payment", { order_id: `c${i}`, amount_cents: 10 + i }, { "io.idem/call_id": `par_${i}` })));
const after = ledgerOf(ledger).slice(before);
check(many.every((x, i) => !x.isError && body(x).order_id === `c${i}` && body(x).amount_cents === 10 + i),
      "50 concurrent calls each get their own answer", many.filter((x) => x.isError));
check(after.length === 50 && new Set(after.map((e) => e.idempotency_key)).size === 50,
      "... and the ledger holds 50 refunds, each key once", after.length);
const same = await Promise.all(Array.from({ length: 10 }, () =>
  call(client, "refund_payment", { order_id: "dup", amount_cents: 1 }, { "io.idem/call_id": "par_dup" })));
check(ledgerOf(ledger).filter((e) => e.order_id === "dup").length === 1 &&
      same.every((x) => x.isError ? x.structuredContent?.status === "in_progress" : body(x).order_id === "dup"),
      "10 concurrent copies of one call apply once", same);

const exit = await gw.close();
await direct.close();
check(exit.code === 0, "the gateway exits 0 when the client closes", exit);
check(!/error|fault|sanitizer/i.test(stderr()),
      "the gateway wrote no error on stderr", stderr());
fs.rmSync(dir, { recursive: true, force: true });
done();
