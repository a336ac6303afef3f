// A re-list never weakens a tool's class (SPEC 10): an MCP server may list a
// tool again with other annotations at any time (notifications/tools/
// list_changed, or the client's own tools/list), and annotations are hints.
// Behind `idem mcp`, with the SDK's own client and server
// (relist_server.mjs, whose tools dedupe nothing):
//  a. send_refund, first listed without annotations (guarded), then with
//     readOnlyHint: true: it stays guarded - the same call id twice applies
//     once and the repeat replays - and stderr says, once, which tool and
//     which hint were ignored.
//  b. send_gift, then listed with idempotentHint: true: it stays guarded,
//     and no hint was ignored - idempotentHint alone never made a tool
//     idempotent (SPEC 10, amended 2026-12-06), so nothing weakened.
//  c. set_label, first listed readOnlyHint: true, then without: the
//     stronger class is taken (guarded), silently.
//
//   node relist_test.mjs PATH/TO/idem
import path from "node:path";
import { here, check, done, tmpdir, ledgerOf, connect, call, sanitizerSaid } from "./lib.mjs";

const dir = tmpdir("relist");
const ledger = `${dir}/ledger`;
const gw = await connect({ policy: path.join(here, "relist_policy.json"), log: `sqlite:${dir}/log.db`,
                           session: "relist", server: ["node", path.join(here, "relist_server.mjs"), ledger] });
const { client } = gw;
const annotationsOf = async (name) => (await client.listTools()).tools.find((t) => t.name === name)?.annotations;
const applied = (tool) => ledgerOf(ledger).filter((e) => e.tool === tool).length;

check((await annotationsOf("send_refund")) === undefined && (await annotationsOf("set_label"))?.readOnlyHint === true,
      "first listing: send_refund and send_gift unannotated (guarded), set_label readOnlyHint");
await call(client, "relabel", { tool: "send_refund", annotations: { readOnlyHint: true } });
await call(client, "relabel", { tool: "send_gift", annotations: { idempotentHint: true, destructiveHint: false } });
await call(client, "relabel", { tool: "set_label", annotations: {} });
const relisted = await annotationsOf("send_refund");
check(relisted?.readOnlyHint === true, "the server re-lists send_refund with readOnlyHint: true", relisted);
await client.listTools(); // a second re-list: no second line

for (const [tag, tool, hint] of [["a", "send_refund", "readOnlyHint: true"], ["b", "send_gift", null],
                                 ["c", "set_label", null]]) {
  const args = { order_id: `o-${tag}` };
  const r1 = await call(client, tool, args, { "io.idem/call_id": `${tag}1` });
  const r2 = await call(client, tool, args, { "io.idem/call_id": `${tag}1` });
  check(!r1.isError && !r2.isError && r2._meta?.["io.idem/status"] === "succeeded" &&
        r2._meta["io.idem/replayed"] === true && applied(tool) === 1,
        `${tag}: ${tool} stays guarded after the re-list: the same call id twice applied ${applied(tool)} time(s), ` +
        `the repeat replayed`, r1, r2, ledgerOf(ledger));
  const said = gw.stderr().split("\n").filter((l) => l.includes(`tools/list gives ${tool} `));
  if (hint)
    check(said.length === 1 && said[0].startsWith(`idem: tools/list gives ${tool} ${hint}; ignored: it was listed ` +
                                                  "guarded before"),
          `${tag}: ... and stderr says once that ${tool}'s ${hint} was ignored`, said);
  else
    check(said.length === 0, `${tag}: ... no hint ignored, no line saying so`, said);
}

const exit = await gw.close();
check(exit.code === 0 && !sanitizerSaid(gw.stderr()), "the gateway exits 0, nothing from the sanitizers", exit,
      gw.stderr());
done();
