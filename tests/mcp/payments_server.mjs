// A small payments provider as an MCP server, written with the official SDK,
// for the tests of `idem mcp` (SPEC 10).  Not a mock of idem: it is the kind
// of server idem stands in front of.
//
//   node payments_server.mjs LEDGER
//
// LEDGER is a JSON-lines file, one line per refund the provider applied:
// {"refund_id","order_id","amount_cents","idempotency_key","meta_key"}.
// refund_payment honours its idempotency_key argument the way Stripe does:
// a key seen before returns the refund made for it, and applies nothing.
//
// The switches, files looked at when a call of refund_payment or
// charge_card (both apply money) arrives:
//   LEDGER.stall     apply, then stall (never answer within any deadline) -
//                    the provider that applied the change while the client
//                    timed out.
//   LEDGER.late      wait the number of ms written in it (default 1500 when
//                    empty) FIRST, then apply and answer - the attempt that
//                    lands after the client's deadline.  Cancelling the call
//                    does not stop it; killing the server during the wait
//                    applies nothing.  With LEDGER.stall too: wait, apply,
//                    stall.  While a call is waiting, another call with its
//                    idempotency_key (when deduping) waits for it and answers
//                    its refund, applying nothing (one process: the keys in
//                    flight are kept in memory).
//   LEDGER.nodedupe  the provider that does not dedupe: the idempotency_key
//                    is recorded but never looked up, so every call applies
//                    a new refund (double refunds show in the ledger).
//   LEDGER.fill      holds a path: right after applying, create that file -
//                    under IDEM_FULL_WHILE=that path, the gateway's disk
//                    fills while the call runs.
// A cancellation of a refund in flight is logged in LEDGER.cancelled.
// LEDGER.pid gets this process's pid (the crash test kills it).
import fs from "node:fs";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { paymentsTools } from "./payments_tools.mjs";

const ledger = process.argv[2];
if (!ledger) {
  console.error("usage: payments_server.mjs LEDGER");
  process.exit(2);
}
fs.writeFileSync(ledger + ".pid", String(process.pid));

const server = new McpServer({ name: "payments", version: "1.0.0" });
paymentsTools(ledger).register(server);

await server.connect(new StdioServerTransport());
