// `idem mcp` on the wire: raw bytes in, raw lines out, in front of a
// hand-written server (raw_server.mjs) that misbehaves on purpose.  Every
// line the gateway writes must be one whole JSON text.
//
//   node wire_test.mjs PATH/TO/idem
import fs from "node:fs";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { idem, here, check, done, tmpdir, sanitizerSaid, rawGateway, req } from "./lib.mjs";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const MAX = 4096;

// A gateway in front of raw_server.mjs, with a raw client (lib.mjs).
const gateway = (dir, env = {}) =>
  rawGateway({ policy: path.join(here, "raw_policy.json"), log: `sqlite:${dir}/log.db`, session: "w",
               extra: ["--max-message", String(MAX)], server: ["node", path.join(here, "raw_server.mjs"), dir], env });
const init = req(0, "initialize", { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "1" } });
const received = (dir) => fs.readFileSync(`${dir}/received`, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));

{
  const dir = tmpdir("wire");
  const g = gateway(dir, { RAW_DELAY: "1000", RAW_DIR: dir });
  g.send(init);
  await g.byId(0);
  g.send(req(1, "tools/list"));
  await g.byId(1);

  // a tools/call shaped as a notification (no id) never reaches the server:
  // nothing guarded passes except through the guard; no answer (JSON-RPC)
  g.send(JSON.stringify({ jsonrpc: "2.0", method: "tools/call",
                          params: { name: "refund_payment", arguments: { order_id: "n1", amount_cents: 1 } } }) + "\n");
  g.send(req("n-ping", "ping"));
  await g.byId("n-ping");
  check(!received(dir).some((m) => m.method === "tools/call" && m.id === undefined),
        "a tools/call notification is not passed to the server", received(dir));
  for (let i = 0; i < 100 && !/tools\/call without an id/.test(g.stderr); i++) await sleep(20);
  check(/idem: a tools\/call without an id \(a notification\) was dropped/.test(g.stderr),
        "a tools/call notification is dropped with an idem: line on stderr", g.stderr);
  check(!g.lines.some((m) => m.id === undefined && m.error), "and nothing is answered to it", g.lines);

  // a line cut in pieces, two in one write, a CRLF ending
  g.send('{"jsonrpc":"2.0","id":"a",');
  await sleep(100);
  g.send('"method":"ping"}\n{"jsonrpc":"2.0","id":"b","method":"ping"}\r\n');
  const [pa, pb] = [await g.byId("a"), await g.byId("b")];
  check(pa.result && pb.result, "a request cut across writes, and two in one write, are answered", pa, pb);

  // malformed client lines: a JSON-RPC error, and nothing reaches the server
  const before = received(dir).length;
  g.send("not json at all\n");
  g.send(Buffer.from([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x7d, 0x0a])); // {"\xff\xfe"}
  g.send('{"jsonrpc":"2.0","id":5}\n');
  g.send('[1,2]\n');
  await g.byId(5);
  await sleep(100);
  const errs = g.lines.filter((m) => m.error && (m.id === null || m.id === 5));
  check(errs.filter((m) => m.error.code === -32700).length === 2 && errs.some((m) => m.id === 5 && m.error.code === -32600),
        "bad JSON gets -32700 (id null), a non-request -32600", errs);
  check(received(dir).length === before, "... and none of it reached the server", received(dir).slice(before));

  // an oversized request: refused with its id, and the stream goes on
  g.send(JSON.stringify({ jsonrpc: "2.0", id: "big", method: "ping", params: { x: "y".repeat(3 * MAX) } }) + "\n");
  const big = await g.byId("big");
  check(big.error?.code === -32600 && /larger than 4096 bytes/.test(big.error.message),
        "a message over --max-message is refused with a clear error", big);
  g.send(req("after", "ping"));
  check((await g.byId("after")).result, "... and the next message is read whole");
  check(!received(dir).some((m) => JSON.stringify(m).includes("yyyy")), "... the big one never reached the server");

  // ids that collide with each other and with the gateway's own
  g.send(req(7, "ping") + req("7", "ping") + req(-1, "ping") + req(1.5, "ping") + req("idem-1", "ping"));
  const ids = await Promise.all([7, "7", -1, 1.5, "idem-1"].map((id) => g.byId(id)));
  check(ids.every((m) => m.result), "client ids 7, \"7\", -1, 1.5, \"idem-1\" each get their own answer", ids);
  const srvIds = received(dir).filter((m) => m.id !== undefined).map((m) => m.id);
  check(srvIds.every((id) => Number.isInteger(id)) && new Set(srvIds).size === srvIds.length,
        "the server sees the gateway's ids only, never one twice", srvIds);

  // the server's garbage: a line that is not JSON, a reply in three writes
  g.send(req(20, "tools/call", { name: "noise", arguments: {} }));
  const noise = await g.byId(20);
  check(noise.result?.content?.[0]?.text === "clean", "a reply written in pieces arrives whole", noise);
  check(/not JSON/.test(g.stderr), "the server's bad line is logged on stderr, not forwarded", g.stderr);

  // the server's oversized reply: the client gets an error for that request
  g.send(req(21, "tools/call", { name: "huge", arguments: { bytes: 3 * MAX } }));
  const huge = await g.byId(21);
  check(huge.error && /larger than the limit/.test(huge.error.message), "an oversized reply becomes an error", huge);

  // nothing lost: 3000 notifications and the result, in order
  g.send(req(22, "tools/call", { name: "burst", arguments: { n: 3000 } }));
  await g.byId(22);
  const notes = g.lines.filter((m) => m.method === "notifications/message").map((m) => m.params.data);
  check(notes.length === 3000 && notes.every((v, i) => v === i), "3000 notifications pass, none lost, in order",
        notes.length);

  // a late result: the deadline answers outcome_unknown, the server's
  // request is not cancelled, and its answer after that is recorded
  g.send(req(30, "tools/call", { name: "slow_refund", arguments: { order: 1 }, _meta: { "io.idem/call_id": "late_1" } }));
  const late = await g.byId(30);
  check(late.result?.isError && late.result.structuredContent?.status === "outcome_unknown",
        "past timeout_ms the client gets outcome_unknown", late);
  await sleep(1500);
  const cancel = received(dir).find((m) => m.method === "notifications/cancelled");
  check(!cancel, "the server got no notifications/cancelled for it", cancel);
  const rec = JSON.parse(execFileSync(idem, ["show", "--log", `sqlite:${dir}/log.db`, "--json", "w", "late_1"],
                                     { encoding: "utf8" }));
  check(rec.state === "succeeded" && rec.resolution === "late", "the late answer is recorded (resolution late)", rec);

  // the model re-issues it with a new call id: the late outcome was never
  // told, so the fence answers already_applied with the recorded result
  g.send(req(31, "tools/call", { name: "slow_refund", arguments: { order: 1 }, _meta: { "io.idem/call_id": "late_2" } }));
  const again = await g.byId(31);
  check(!again.result?.isError && again.result?._meta?.["io.idem/status"] === "already_applied" &&
        again.result._meta["io.idem/duplicate_of"] === "late_1" && again.result.content?.[0]?.text === '{"refunded":true}',
        "a re-issue with a new call id gets already_applied and the late result", again);
  check(fs.readFileSync(`${dir}/ledger`, "utf8").split("\n").filter(Boolean).length === 1,
        "... and the server ran it once");

  // a status command in the policy (as for idem exec) reconciles too
  g.send(req(32, "tools/call", { name: "slow_charge", arguments: { order: 2 }, _meta: { "io.idem/call_id": "cmd_1" } }));
  const viaCmd = await g.byId(32);
  check(!viaCmd.result?.isError && viaCmd.result?._meta?.["io.idem/status"] === "succeeded" &&
        viaCmd.result?.content?.[0]?.text === '{"found":true}',
        "past the deadline, the policy's status command finds it applied: succeeded", viaCmd);
  check(viaCmd.result?.content?.length === 2 &&
        /^The slow_charge call went through \(a status check found it applied\); the check's result is included\. Do not call slow_charge again/
          .test(viaCmd.result.content[1].text),
        "... and a second text item says so in words", viaCmd);

  // applied_when {pointer, equals}, read in the status tool's structuredContent
  g.send(req(33, "tools/call", { name: "slow_ptr", arguments: { order: 3 }, _meta: { "io.idem/call_id": "ptr_1" } }));
  const viaPtr = await g.byId(33);
  check(!viaPtr.result?.isError && viaPtr.result?._meta?.["io.idem/status"] === "succeeded" &&
        viaPtr.result?.structuredContent?.state === "done",
        "past the deadline, a status tool's structuredContent at /state says done: succeeded", viaPtr);

  // the client cancels a forwarded request: the server hears of it by its id
  g.send(req("h", "tools/call", { name: "hang", arguments: {} }));
  await sleep(200);
  g.send(JSON.stringify({ jsonrpc: "2.0", method: "notifications/cancelled", params: { requestId: "h", reason: "bored" } }) + "\n");
  for (let i = 0; i < 100 && !received(dir).some((m) => m.params?.reason === "bored"); i++) await sleep(20);
  const hang = received(dir).find((m) => m.params?.name === "hang");
  const hcancel = received(dir).filter((m) => m.method === "notifications/cancelled").at(-1);
  check(hcancel?.params.requestId === hang?.id && hcancel.params.reason === "bored",
        "a client's cancellation reaches the server with the id the server knows", hcancel, hang);

  check(g.bad.length === 0, "every line the gateway wrote is one whole JSON text", g.bad);

  // the server's exit status is the gateway's
  g.send(req(40, "tools/call", { name: "exit", arguments: { code: 3 } }));
  const gone = await g.byId(40);
  check(gone.error && /exited/.test(gone.error.message), "a request the server died on gets an error", gone);
  const exit = await g.exited;
  check(exit.code === 3, "the gateway exits with the server's status", exit);
  check(!sanitizerSaid(g.stderr), "nothing from the sanitizers", g.stderr);
  fs.rmSync(dir, { recursive: true, force: true });
}

// signals are forwarded: SIGTERM to the gateway ends the server, 128+15
{
  const dir = tmpdir("wire-sig");
  const g = gateway(dir);
  g.send(init);
  await g.byId(0);
  g.p.kill("SIGTERM");
  const exit = await g.exited;
  check(exit.code === 143, "SIGTERM is forwarded to the server; the gateway exits 143", exit, g.stderr);
  fs.rmSync(dir, { recursive: true, force: true });
}

// usage errors
for (const [args, want, what] of [
  [["mcp", "--", "true"], /--policy is required/, "no --policy"],
  [["mcp", "--policy", path.join(here, "raw_policy.json")], /server to run is missing/, "no command"],
  [["mcp", "--policy", "/nonexistent.json", "--", "true"], /nonexistent/, "a policy that cannot be read"],
  [["mcp", "--policy", path.join(here, "raw_policy.json"), "--max-message", "12", "--", "true"], /--max-message/,
   "a --max-message out of range"],
  [["mcp", "--policy", path.join(here, "raw_policy.json"), "--log", "sqlite:/dev/null/log.db", "--", "true"],
   /\/dev\/null/, "a log that cannot be opened"],
]) {
  let out;
  try { execFileSync(idem, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] }); out = { status: 0 }; }
  catch (e) { out = e; }
  check(out.status !== 0 && want.test(String(out.stderr)) && /^idem: /.test(String(out.stderr)),
        `${what}: a clear error`, out.status, String(out.stderr));
}
{
  const dir = tmpdir("wire-cmd");
  let out;
  try { execFileSync(idem, ["mcp", "--policy", path.join(here, "raw_policy.json"), "--log", `sqlite:${dir}/l.db`,
                            "--session", "s", "--", "/nonexistent/server"], { encoding: "utf8", stdio: "pipe" }); }
  catch (e) { out = e; }
  check(out?.status === 1 && /cannot run \/nonexistent\/server/.test(String(out.stderr)),
        "a server that cannot be started: a clear error, exit 1", out?.status, String(out?.stderr));
  fs.rmSync(dir, { recursive: true, force: true });
}
done();
