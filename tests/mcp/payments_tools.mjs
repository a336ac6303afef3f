// The payments provider's MCP tools, shared by payments_server.mjs (stdio)
// and http_payments_server.mjs (Streamable HTTP): the ledger format, the
// switch files and the tools are described in payments_server.mjs.
//
//   const pay = paymentsTools(LEDGER);   // one per process: the keys in
//   pay.register(mcpServer);             // flight are kept in its memory
//
// register() may be called on many McpServer instances (one per HTTP
// session): they share the ledger and the keys in flight.
import fs from "node:fs";
import { z } from "zod";

export function paymentsTools(ledger) {
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

  function register(server) {
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
    return server;
  }

  return { register, entries };
}
