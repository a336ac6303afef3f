// payments_server.mjs with two behaviours of real MCP servers that the
// SDK's own server does not have, for inflight_test.mjs (SPEC 6a):
//
//   node inflight_server.mjs LEDGER
//
//   INFLIGHT_IGNORE_CANCEL=1  the server cannot take a refund back, so it
//       ignores notifications/cancelled (MCP allows that) and answers the
//       call when it is done: the SDK never sees the notification (each one
//       is logged in LEDGER.cancelled as "ignored ID").  Without it, the
//       SDK server honours a cancellation: the refund still lands, but its
//       answer is never sent.
//   INFLIGHT_DRAIN=1  SIGTERM (the gateway's death reaches the server as
//       one) does not stop the work in flight: the server ignores it and
//       exits once its stdin is closed and its last refund is done - a
//       graceful shutdown.  Without it, SIGTERM ends the server at once and
//       a refund still waiting in LEDGER.late never lands.
import fs from "node:fs";
import { PassThrough } from "node:stream";

const ledger = process.argv[2];

if (process.env.INFLIGHT_DRAIN === "1") process.on("SIGTERM", () => {});

if (process.env.INFLIGHT_IGNORE_CANCEL === "1") {
  // the SDK's transport reads process.stdin: give it the lines but the
  // cancellations
  const real = process.stdin, seen = new PassThrough();
  let buf = "";
  real.on("data", (d) => {
    buf += d;
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl + 1);
      buf = buf.slice(nl + 1);
      let m = null;
      try { m = JSON.parse(line); } catch { /* the SDK reports it */ }
      if (m?.method === "notifications/cancelled")
        fs.appendFileSync(`${ledger}.cancelled`, `ignored ${m.params?.requestId}\n`);
      else
        seen.write(line);
    }
  });
  real.on("end", () => seen.end());
  Object.defineProperty(process, "stdin", { value: seen, configurable: true });
}

await import("./payments_server.mjs");
