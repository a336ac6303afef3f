// A tools/call whose params.name is not a non-empty string (SPEC §10 as
// amended; issue 27, item 3) has no tool to class, key or record: passed
// on, it would reach the server unguarded, and a server that looks its
// handler up by whatever name it is given (handlers[params.name] in
// JavaScript finds "slow_refund" under ["slow_refund"], as raw_server.mjs
// does) may act on it.  The
// gateway refuses it with -32602 and an idem: line, under both
// unknown_tools settings; the server, which records every line it reads
// (raw_server.mjs), never sees it; nothing is recorded.
//
//   node callname_test.mjs PATH/TO/idem
import fs from "node:fs";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { idem, here, check, done, tmpdir, sanitizerSaid, rawGateway, req } from "./lib.mjs";

const init = req(0, "initialize", { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "1" } });
const shapes = [
  ["an array", { name: ["slow_refund"], arguments: {} }],
  ["a number", { name: 123, arguments: {} }],
  ["an object", { name: {}, arguments: {} }],
  ["null", { name: null, arguments: {} }],
  ["true or false", { name: true, arguments: {} }],
  ["empty", { name: "", arguments: {} }],
  ["missing", { arguments: {} }],
  ["no params", undefined],
];

for (const unknown of ["refuse", "guard"]) {
  const tag = `unknown_tools ${unknown}`;
  const dir = tmpdir("callname");
  const policy = `${dir}/policy.json`;
  const raw = JSON.parse(fs.readFileSync(path.join(here, "raw_policy.json"), "utf8"));
  fs.writeFileSync(policy, JSON.stringify({ ...raw, unknown_tools: unknown }));
  const log = `sqlite:${dir}/log.db`;
  const g = rawGateway({ policy, log, session: "n", server: ["node", path.join(here, "raw_server.mjs"), dir] });
  g.send(init);
  await g.byId(0);
  shapes.forEach(([, params], i) => g.send(req(`bad${i}`, "tools/call", params)));
  // all at once: a gateway that passes them on is not waited for one by one
  const answers = await Promise.all(shapes.map((_, i) => g.byId(`bad${i}`, 3000).catch(() => null)));
  shapes.forEach(([what], i) => {
    const a = answers[i];
    check(a?.error?.code === -32602 && /^Invalid params: idem: .*params\.name.*the tool was not called$/.test(a.error.message),
          `${tag}: params.name ${what}: -32602 from the gateway, saying why`, a);
  });
  // a good call afterwards reaches the server: what it received is not empty by accident
  g.send(req("good", "tools/call", { name: "slow_refund", arguments: { order_id: "n1" } }));
  const good = await g.byId("good", 5000).catch(() => null);
  const received = fs.readFileSync(`${dir}/received`, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
  const calls = received.filter((m) => m.method === "tools/call");
  check(good?.result && calls.length === 1 && calls[0].params.name === "slow_refund",
        `${tag}: none of them reached the server; the good call after them did`, good, calls);
  const refunds = fs.readFileSync(`${dir}/ledger`, "utf8").split("\n").filter(Boolean);
  check(refunds.length === 1, `${tag}: one refund, the good call's (the server finds slow_refund under ` +
        `["slow_refund"] too)`, refunds);
  const lines = g.stderr.split("\n").filter((l) => /^idem: a tools\/call was refused: .*params/.test(l));
  check(lines.length === shapes.length, `${tag}: an idem: line on stderr for each`, g.stderr);
  const records = execFileSync(idem, ["ls", "--log", log, "--json"], { encoding: "utf8" }).split("\n").filter(Boolean);
  check(records.length === 1, `${tag}: nothing recorded but the good call`, records);
  g.p.stdin.end();
  const exit = await g.exited;
  check(exit.code === 0 && !sanitizerSaid(g.stderr) && g.bad.length === 0,
        `${tag}: the gateway exits 0, every line it wrote is JSON, nothing from the sanitizers`, exit, g.stderr, g.bad);
  fs.rmSync(dir, { recursive: true, force: true });
}
done();
