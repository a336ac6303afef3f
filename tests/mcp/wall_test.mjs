// `idem mcp` as a wall (issue 20): nothing guarded reaches the server except
// through the guard, whatever the message's shape; no call is given another
// identity than its harness meant; a misbehaving server gets the true words
// and the safe outcome.  A raw client in front of wall_server.mjs, which
// counts every application in its ledger.
//
//   node wall_test.mjs PATH/TO/idem
import fs from "node:fs";
import path from "node:path";
import { spawnSync } from "node:child_process";
import { idem, here, check, done, tmpdir, ledgerOf, rawGateway, req, sanitizerSaid } from "./lib.mjs";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const init = req(0, "initialize", { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "1" } });

async function gateway(dir, env = {}) {
  const g = rawGateway({ policy: path.join(here, "wall_policy.json"), log: `sqlite:${dir}/log.db`, session: "desk",
                         server: ["node", path.join(here, "wall_server.mjs"), dir], env });
  g.send(init);
  await g.byId(0);
  g.call = async (id, name, args, meta) => {
    g.send(req(id, "tools/call", { name, arguments: args, ...(meta ? { _meta: meta } : {}) }));
    return g.byId(id);
  };
  return g;
}
const ledger = (dir) => ledgerOf(`${dir}/ledger`);
const status = (m) => m.result?._meta?.["io.idem/status"];
const words = (m) => m.result?.content?.map((c) => c.text).join(" ") ?? "";
const alive = (pid) => { try { process.kill(pid, 0); return true; } catch { return false; } };
const within = (p, ms) => Promise.race([p, sleep(ms).then(() => null)]);

// ---- 1. every message shape: a tools/call notification runs nothing -----------
{
  const dir = tmpdir("wall-shape");
  const g = await gateway(dir);
  g.send(JSON.stringify({ jsonrpc: "2.0", method: "tools/call",
                          params: { name: "refund", arguments: { order_id: "n1", amount_cents: 1 } } }) + "\n");
  g.send(JSON.stringify({ jsonrpc: "2.0", method: "tools/call",
                          params: { name: "drop_everything", arguments: {} } }) + "\n");
  g.send(req("p", "ping"));
  await g.byId("p");
  check(ledger(dir).length === 0, "1: a tools/call notification reaches no server that would act on it", ledger(dir));
  check(!g.lines.some((m) => m.id === undefined && (m.error || m.result)), "1: ... and nothing is answered to it", g.lines);
  g.p.stdin.end();
  await g.exited;
}

// ---- 2. identity -----------------------------------------------------------------------
{
  const dir = tmpdir("wall-id");
  let g = await gateway(dir);
  let r = await g.call(1, "refund", { order_id: "i1", amount_cents: 5 }, { "io.idem/call_id": 77 });
  check(status(r) === undefined && !r.result?.isError && /^desk:77:/.test(ledger(dir).at(-1)?.key),
        "2a: a numeric _meta io.idem/call_id is taken as its decimal text", r, ledger(dir).at(-1));
  r = await g.call(2, "refund", { order_id: "i1", amount_cents: 5 }, { "io.idem/call_id": "77" });
  check(r.result?._meta?.["io.idem/replayed"] === true && ledger(dir).length === 1,
        "2a: ... the same action as the string \"77\" (replayed, one refund)", r, ledger(dir));
  r = await g.call(3, "refund", { order_id: "i2", amount_cents: 5 }, { "io.idem/session": 42, "io.idem/call_id": "c1" });
  check(/^42:c1:/.test(ledger(dir).at(-1)?.key ?? ""), "2a: a numeric _meta io.idem/session too", ledger(dir).at(-1));
  const n = ledger(dir).length;
  for (const [id, meta, what] of [[4, { "io.idem/call_id": "" }, /io\.idem\/call_id" is empty/],
                                  [5, { "io.idem/session": "" }, /io\.idem\/session" is empty/],
                                  [6, { "io.idem/call_id": { id: 1 } }, /non-empty string or an integer, not an object/],
                                  [7, { "io.idem/call_id": 1.5 }, /not a fraction/],
                                  [8, { "io.idem/call_id": null }, /not null/]]) {
    r = await g.call(id, "refund", { order_id: "i3", amount_cents: 5 }, meta);
    check(r.error?.code === -32602 && what.test(r.error.message) && /the tool was not called/.test(r.error.message),
          `2a: _meta ${JSON.stringify(meta)} is refused clearly`, r);
  }
  check(ledger(dir).length === n, "2a: ... and none of them ran", ledger(dir));
  check(/idem: a tools\/call of refund was refused: _meta "io.idem\/call_id" is empty/.test(g.stderr),
        "2a: ... each with an idem: line on stderr", g.stderr);

  // (b) a client that restarts numbers its requests again: id 5 of the new
  // connection is a new request, never the delivered call 5 of the old one
  r = await g.call(50, "refund", { order_id: "i4", amount_cents: 9 });
  check(!r.result?.isError, "2b: a call without _meta ids goes through", r);
  g.p.stdin.end();
  await g.exited;
  g = await gateway(dir);
  // (the model's next turn: told, it decides again - say so, or identical
  // calls within coalesce_ms count as one turn)
  r = await g.call(50, "refund", { order_id: "i4", amount_cents: 9 }, { "io.idem/turn": "t2" });
  const i4 = ledger(dir).filter((e) => e.args.order_id === "i4");
  check(!r.result?.isError && r.result?._meta?.["io.idem/replayed"] !== true && i4.length === 2 && i4[0].key !== i4[1].key,
        "2b: after a restart, JSON-RPC id 50 again with the same arguments is a new refund, not the old one replayed",
        r, i4);
  g.p.stdin.end();
  await g.exited;
}

// ---- 3. a server that closes its output and lives on -------------------------------
{
  const dir = tmpdir("wall-closed");
  const g = await gateway(dir);
  const pid = Number(fs.readFileSync(`${dir}/pid`, "utf8"));
  let r = await g.call(1, "close_out", { order_id: "c1" });
  check(status(r) === "outcome_unknown" && /closed its output before answering/.test(words(r)),
        "3: a call in flight is answered unknown: the server closed its output", r);
  g.send(req(2, "ping"));
  r = await g.byId(2);
  check(/the server closed its output/.test(r.error?.message ?? ""), "3: a later request is told so (not 'exited')", r);
  const ex = await within(g.exited, 8000);
  check(ex !== null && ex.code === 1, "3: the gateway stops the server (SIGTERM after 2 s) and exits 1, without waiting for the client", ex);
  await sleep(100);
  check(!alive(pid), "3: ... and the server is gone", pid);
  check(/the server closed its output but is still running/.test(g.stderr), "3: ... saying why on stderr", g.stderr);
  check(ledger(dir).length === 1, "3: one application", ledger(dir));
}
{
  // the client leaves after the server closed its output: still bounded
  const dir = tmpdir("wall-closed2");
  const g = await gateway(dir);
  await g.call(1, "close_out", { order_id: "c2" });
  g.p.stdin.end();
  const ex = await within(g.exited, 8000);
  check(ex !== null, "3: when the client then leaves, the gateway exits within the shutdown rule's bound", ex);
}

// ---- 4. a result that is not a CallToolResult -----------------------------------------
{
  const dir = tmpdir("wall-shape4");
  const g = await gateway(dir);
  let r = await g.call(1, "not_object", { order_id: "o1" }, { "io.idem/call_id": "no_1" });
  check(typeof r.result === "object" && status(r) === "outcome_unknown" && /not a tool result/.test(words(r)),
        "4: a non-object result is a protocol violation: outcome_unknown, in those words", r);
  r = await g.call(2, "not_object", { order_id: "o1" }, { "io.idem/call_id": "no_1" });
  check(typeof r.result === "object" && status(r) !== "succeeded" && !JSON.stringify(r).includes("notanobject"),
        "4: ... and its repeat is no 'succeeded' of another shape", r);
  check(ledger(dir).length === 1, "4: one application", ledger(dir));
  g.p.stdin.end();
  await g.exited;
}

// ---- 5. isError is not proof that nothing happened -------------------------------------
{
  const dir = tmpdir("wall-iserror");
  const g = await gateway(dir);
  let r = await g.call(1, "is_error", { order_id: "e1" }, { "io.idem/call_id": "ie_1" });
  check(status(r) === "succeeded" && r.result?.isError !== true,
        "5: isError from a server that applied: reconciled by the status tool, succeeded", r);
  r = await g.call(2, "is_error_nostatus", { order_id: "e2" }, { "io.idem/call_id": "ie_2" });
  check(status(r) === "outcome_unknown" && /isError: provider timed out/.test(words(r)),
        "5: without a status tool it is outcome_unknown, with the server's words", r);
  r = await g.call(3, "is_error_nostatus", { order_id: "e2" }, { "io.idem/call_id": "ie_2" });
  check(status(r) === "outcome_unknown", "5: ... and its repeat is not a replayed failure", r);
  r = await g.call(4, "is_error_rejected", { order_id: "e3" }, { "io.idem/call_id": "ie_3" });
  check(r.result?.isError === true && words(r) === "provider timed out",
        "5: on_is_error \"rejected\": a definite failure, the server's own result", r);
  r = await g.call(5, "is_error_rejected", { order_id: "e3" }, { "io.idem/call_id": "ie_3" });
  check(status(r) === "failed" && r.result?._meta?.["io.idem/replayed"] === true, "5: ... replayed as failed", r);
  check(ledger(dir).length === 3, "5: one application each (no status tool: no blind retry)", ledger(dir));
  g.p.stdin.end();
  await g.exited;
}

// ---- 6. the true reason -------------------------------------------------------------------
for (const [tool, said] of [["exit_mid", /the server has exited before answering/],
                            ["half_line", /the server has exited in the middle of a message, before answering/]]) {
  const dir = tmpdir("wall-reason");
  const g = await gateway(dir);
  const r = await g.call(1, tool, { order_id: "x" });
  check(status(r) === "outcome_unknown" && said.test(words(r)) && !/in time/.test(words(r)),
        `6: ${tool}: outcome_unknown, and the words say what happened`, r);
  check(ledger(dir).length === 1, `6: ${tool}: one application`, ledger(dir));
  g.p.stdin.end();
  await g.exited;
}

// ---- 8. a bad --log: one error line, and no server started -----------------------------
{
  const dir = tmpdir("wall-badlog");
  const r = spawnSync(idem, ["mcp", "--policy", path.join(here, "wall_policy.json"),
                             "--log", "sqlite:/proc/no/such/log.db", "--session", "s", "--",
                             "sh", "-c", `touch ${dir}/started`], { encoding: "utf8", input: "" });
  const lines = r.stderr.split("\n").filter(Boolean);
  check(r.status !== 0 && lines.length === 1 && /^idem: /.test(lines[0]) && !fs.existsSync(`${dir}/started`),
        "8: a bad --log is one idem: line, and the server is never started", r.status, r.stderr);
}

// ---- 8. "delivered" is stamped before the client can read the answer -------------------
{
  // with another call in flight, log steps go to the worker threads: the
  // next call the client sends the moment it reads an answer must find the
  // answered one told (a new decision), not fence it as a duplicate
  const dir = tmpdir("wall-told");
  const g = await gateway(dir, { WALL_SLOW: "6000" });
  g.send(req("slow", "tools/call", { name: "refund", arguments: { order_id: "slow", slow: true } }));
  await sleep(200);
  let fenced = 0;
  for (let i = 0; i < 25; i++) {
    const args = { order_id: `t${i}`, amount_cents: 1 };
    await g.call(`a${i}`, "refund", args, { "io.idem/call_id": `a${i}`, "io.idem/turn": `ta${i}` });
    const r = await g.call(`b${i}`, "refund", args, { "io.idem/call_id": `b${i}`, "io.idem/turn": `tb${i}` });
    if (status(r) !== undefined || r.result?.isError) { fenced++; if (fenced === 1) console.log(JSON.stringify(r)); }
  }
  check(fenced === 0 && ledger(dir).filter((e) => e.args.order_id.startsWith("t")).length === 50,
        "8: a new call sent the moment the answer was read is never fenced as its duplicate", fenced);
  await g.byId("slow");
  g.p.stdin.end();
  const ex = await g.exited;
  check(!sanitizerSaid(g.stderr), "the gateway's stderr holds no sanitizer report", g.stderr.slice(-2000));
  check(ex.code === 0, "the gateway exits 0 when the client closes", ex);
}
done();
