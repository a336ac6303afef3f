// payments_server.mjs with a behaviour of real MCP servers that the SDK's
// own server does not have, for inflight_test.mjs (SPEC 6a):
//
//   node inflight_server.mjs LEDGER
//
//   INFLIGHT_DRAIN=1  SIGTERM (the gateway's death reaches the server as
//       one) does not stop the work in flight: the server ignores it and
//       exits once its stdin is closed and its last refund is done - a
//       graceful shutdown.  Without it, SIGTERM ends the server at once and
//       a refund still waiting in LEDGER.late never lands.
if (process.env.INFLIGHT_DRAIN === "1") process.on("SIGTERM", () => {});

await import("./payments_server.mjs");
