// What the tests of an SDK server in front of an HTTP payment provider
// share (iserror_test.mjs, rpcerror_test.mjs): the provider, idem-paysim,
// started without dedupe (a second POST with a key is a second refund, so
// the ledger counts every refund that was sent twice), the policy of
// fetch_server.mjs's refund_payment, and reading what idem recorded.
import fs from "node:fs";
import { spawn, execFileSync } from "node:child_process";
import { idem, ledgerOf, check, done, sanitizerSaid } from "./lib.mjs";

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function until(what, f, ms = 15000) {
  const t = Date.now();
  while (!f()) {
    if (Date.now() - t > ms) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

// idem-paysim (argv[3] of the test) on a port of its own, its files in dir.
export async function startPaysim(dir) {
  const paysim = process.argv[3];
  if (!paysim) {
    console.error(`usage: node ${process.argv[1]} PATH/TO/idem PATH/TO/idem-paysim`);
    process.exit(2);
  }
  const ledger = `${dir}/ledger.jsonl`, portFile = `${dir}/port`;
  const sim = spawn(paysim, ["--ledger", ledger, "--port", "0", "--port-file", portFile, "--no-dedupe"],
                    { stdio: ["ignore", "ignore", fs.openSync(`${dir}/paysim.log`, "w")] });
  const exited = new Promise((r) => sim.once("exit", (code, sig) => r({ code, sig })));
  await until("the provider's port", () => fs.existsSync(portFile));
  const url = `http://127.0.0.1:${Number(fs.readFileSync(portFile, "utf8"))}`;
  return {
    url,
    ledger: () => ledgerOf(ledger),
    refunds: (order) => ledgerOf(ledger).filter((e) => e.order_id === order).length,
    async mode(m) {
      const r = await fetch(`${url}/_mode`, { method: "POST", body: JSON.stringify(m) });
      if (r.status !== 200) throw new Error(`cannot set mode ${JSON.stringify(m)}: ${r.status}`);
    },
    stop() { sim.kill("SIGTERM"); return exited; },
  };
}

// refund_payment guarded, its key in idempotency_key, fenced by order_id,
// reconciled with get_refund_status by key; extra members for the tool.
export function refundPolicy(dir, name, extra = {}) {
  const file = `${dir}/${name}.policy.json`;
  fs.writeFileSync(file, JSON.stringify({
    unknown_tools: "refuse",
    tools: {
      refund_payment: {
        class: "guarded", timeout_ms: 5000, key_arg: "idempotency_key", fence: ["order_id"],
        status: { tool: "get_refund_status", arguments: { idempotency_key: "{$key}" },
                  applied_when: { pointer: "/data", key_present: true } },
        ...extra,
      },
      get_refund_status: { class: "read_only" },
    },
  }));
  return file;
}

// The record of an action (idem show --json).
export const show = (log, session, callId) =>
  JSON.parse(execFileSync(idem, ["show", "--log", log, "--json", session, callId], { encoding: "utf8" }));

// The lines fetch_server.mjs wrote to its SENT file that equal line: the
// POSTs with a key, or the status queries by it ("?" + key).
export const sentLines = (sent, line) =>
  (fs.existsSync(sent) ? fs.readFileSync(sent, "utf8").split("\n") : []).filter((k) => k === line).length;

export const statusOf = (r) => r.structuredContent?.status ?? r._meta?.["io.idem/status"];

// An answer that ran nothing and says so honestly (SPEC 6a): an error
// result whose text is the envelope's message, outcome_unknown - never
// failed, never "safe to call again" (the server's own words it quotes
// may say "failed": paysim's 503 does).
export function notRun(r) {
  const env = r.structuredContent;
  return r.isError === true && env?.status === "outcome_unknown" && r.content?.[0]?.text === env.message &&
    !/safe to call|did not take effect/i.test(env.message);
}

// Close the SDK client of a gateway (lib.mjs connect): it exits 0, and a
// sanitizer build said nothing.
export async function closed(tag, gw) {
  const exit = await gw.close();
  check(exit.code === 0 && !sanitizerSaid(gw.stderr()), `${tag}: the gateway exits 0, nothing from the sanitizers`,
        exit, gw.stderr());
}

// The end of a test: none of the answers the model got (told) said failed
// or "safe to call again"; the provider stops cleanly; dir goes.
export async function finish(told, sim, dir, what = "") {
  check(told.every((r) => statusOf(r) !== "failed" && !/safe to call|did not take effect/i.test(JSON.stringify(r))),
        `the model was never told failed, nor safe to call again${what}`);
  const exit = await sim.stop();
  check(exit.code === 0, "the provider stops cleanly", exit);
  fs.rmSync(dir, { recursive: true, force: true });
  done();
}
