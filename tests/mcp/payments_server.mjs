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
import { z } from "zod";

const ledger = process.argv[2];
if (!ledger) {
  console.error("usage: payments_server.mjs LEDGER");
  process.exit(2);
}
fs.writeFileSync(ledger + ".pid", String(process.pid));

function entries() {
  if (!fs.existsSync(ledger)) return [];
  return fs
    .readFileSync(ledger, "utf8")
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l));
}

function text(obj, isError = false) {
  return { content: [{ type: "text", text: JSON.stringify(obj) }], isError };
}

// key -> promise of the refund entry, for calls waiting in LEDGER.late
const inFlight = new Map();

// The ms LEDGER.late asks for, or null when it is absent.
function lateMs() {
  let t;
  try {
    t = fs.readFileSync(ledger + ".late", "utf8").trim();
  } catch {
    return null;
  }
  const n = Number(t);
  return t === "" || !Number.isFinite(n) || n < 0 ? 1500 : n;
}

async function refund(args, extra, kind) {
  const key = args.idempotency_key;
  if (args.amount_cents <= 0)
    return text({ error: "amount_cents must be positive" }, true);
  const dedupe = !fs.existsSync(ledger + ".nodedupe");
  if (dedupe && key && inFlight.has(key)) return text(await inFlight.get(key));
  const seen = dedupe && key && entries().find((e) => e.idempotency_key === key);
  if (seen) return text(seen);
  // the gateway's notifications/cancelled reaches the handler as an abort
  extra?.signal?.addEventListener("abort", () =>
    fs.appendFileSync(ledger + ".cancelled", (key ?? "") + "\n"));
  const late = lateMs();
  if (late !== null) {
    const held = dedupe && key;
    const done = (async () => {
      await new Promise((r) => setTimeout(r, late));
      // deduping: applied meanwhile (another process on this ledger)?
      return (held && entries().find((e) => e.idempotency_key === key)) || apply(args, extra, kind);
    })();
    if (held) inFlight.set(key, done);
    let e;
    try {
      e = await done;
    } finally {
      if (held) inFlight.delete(key);
    }
    if (fs.existsSync(ledger + ".stall")) await new Promise((r) => setTimeout(r, 600000));
    return text(e);
  }
  const e = apply(args, extra, kind);
  if (fs.existsSync(ledger + ".stall")) await new Promise((r) => setTimeout(r, 600000));
  return text(e);
}

// Append the refund to the ledger, at once (synchronously).
function apply(args, extra, kind) {
  const key = args.idempotency_key;
  const e = {
    refund_id: `re_${entries().length + 1}`,
    kind,
    order_id: args.order_id,
    amount_cents: args.amount_cents,
    idempotency_key: key ?? null,
    meta_key: extra?._meta?.["io.idem/key"] ?? null,
  };
  fs.appendFileSync(ledger, JSON.stringify(e) + "\n");
  let fill;
  try {
    fill = fs.readFileSync(ledger + ".fill", "utf8").trim();
  } catch {}
  if (fill) fs.writeFileSync(fill, "");
  return e;
}

const server = new McpServer({ name: "payments", version: "1.0.0" });
const refundArgs = {
  order_id: z.string(),
  amount_cents: z.number().int(),
  idempotency_key: z.string().optional(),
};

server.registerTool(
  "refund_payment",
  { description: "Refund an order (money moves).", inputSchema: refundArgs },
  async (args, extra) => refund(args, extra, "refund"),
);
// Same provider behaviour, but the policy gives it no status tool.
server.registerTool(
  "charge_card",
  { description: "Charge a card (money moves).", inputSchema: refundArgs },
  async (args, extra) => refund(args, extra, "charge"),
);
server.registerTool(
  "get_refund_status",
  {
    description: "The refunds made for an order.",
    inputSchema: { order_id: z.string() },
    annotations: { readOnlyHint: true },
  },
  async ({ order_id }) => text({ order_id, refunds: entries().filter((e) => e.order_id === order_id) }),
);
// Not named in the test policy: classified from these annotations.
server.registerTool(
  "get_balance",
  { description: "The balance.", inputSchema: {}, annotations: { readOnlyHint: true } },
  async () => text({ balance_cents: 100000 - entries().reduce((s, e) => s + e.amount_cents, 0) }),
);
server.registerTool(
  "send_receipt",
  { description: "Email a receipt (no annotations: guarded).", inputSchema: { order_id: z.string() } },
  async ({ order_id }) => {
    fs.appendFileSync(ledger + ".receipts", order_id + "\n");
    return text({ sent: order_id });
  },
);
server.registerTool(
  "set_nickname",
  {
    description: "Idempotent by its annotations.",
    inputSchema: { name: z.string() },
    annotations: { idempotentHint: true, destructiveHint: false },
  },
  async ({ name }) => {
    fs.appendFileSync(ledger + ".nicknames", name + "\n");
    return text({ nickname: name });
  },
);

await server.connect(new StdioServerTransport());
