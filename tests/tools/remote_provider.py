#!/usr/bin/env python3
"""A remote payment provider for the tests of SPEC §6a: ended is not finished.

It runs as a process of its own, outside the process group of any command
that calls it (start it with setsid), and applies a refund LATER than it
accepts it, from its queue - the seed's case: "an 8-second client deadline
can expire long after the processor accepted".  Whatever happens to the
caller after the request is sent (its client gives up, it is killed, its
executor dies), the refund lands.  It does NOT dedupe on the key: every
application is a line of the ledger, so a double shows.

    remote_provider.py --ledger FILE --port-file FILE [--pid-file FILE]
                       [--received FILE] [--delay-ms MS]

HTTP on 127.0.0.1, an ephemeral port written to --port-file once it listens:

  POST /refunds[?delay_ms=MS][&never=1]   header Idempotency-Key: KEY
      the request is accepted (a line "KEY" in --received) and queued; MS
      (default --delay-ms, 1000) later KEY is appended to --ledger and the
      answer, if the client still waits, is 200 {"refund_id":"re_N",
      "key":KEY}.  never=1: accepted, never applied (a lost request); the
      answer after 10 s is 202 {"queued":true}.
  GET /refunds/KEY       200 {"applied":true,"key":KEY} when KEY is in the
                         ledger, else 404 {"applied":false}
  GET /pending?prefix=P  200 {"pending":N}: requests whose key starts with
                         P that are queued and not applied yet (never=1
                         ones are not counted: they will not be)
  GET /ledger?prefix=P   200, the ledger's lines that start with P

Standard library only.  It exits on SIGTERM or SIGINT.
"""
import argparse
import json
import os
import signal
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
APPLIED = {}      # key -> times applied
PENDING = {}      # key -> requests queued and not yet applied
OPTS = None


def append(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()


def apply_later(key, delay_s, done):
    """The queue: apply KEY after delay_s, then wake the handler (done)."""
    time.sleep(delay_s)
    with LOCK:
        append(OPTS.ledger, key)
        APPLIED[key] = APPLIED.get(key, 0) + 1
        PENDING[key] -= 1
        if not PENDING[key]:
            del PENDING[key]
        done["n"] = sum(APPLIED.values())
    done["ev"].set()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, fmt, *args):  # quiet
        pass

    def answer(self, code, obj):
        body = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client gave up: the refund is applied all the same

    def do_POST(self):
        url = urllib.parse.urlsplit(self.path)
        q = urllib.parse.parse_qs(url.query)
        if url.path != "/refunds":
            return self.answer(404, {"error": "no such endpoint"})
        n = int(self.headers.get("Content-Length") or 0)
        try:
            self.rfile.read(n)
        except OSError:
            return
        key = self.headers.get("Idempotency-Key")
        if not key:
            return self.answer(400, {"error": "no Idempotency-Key"})
        never = q.get("never", ["0"])[0] == "1"
        delay = int(q.get("delay_ms", [str(OPTS.delay_ms)])[0]) / 1000.0
        with LOCK:
            if OPTS.received:
                append(OPTS.received, key)
            if not never:
                PENDING[key] = PENDING.get(key, 0) + 1
        if never:
            time.sleep(10)
            return self.answer(202, {"queued": True})
        done = {"ev": threading.Event(), "n": None}
        threading.Thread(target=apply_later, args=(key, delay, done),
                         daemon=True).start()
        if done["ev"].wait(60):
            self.answer(200, {"refund_id": "re_%d" % done["n"], "key": key})

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        q = urllib.parse.parse_qs(url.query)
        prefix = q.get("prefix", [""])[0]
        if url.path.startswith("/refunds/"):
            key = urllib.parse.unquote(url.path[len("/refunds/"):])
            with LOCK:
                applied = APPLIED.get(key, 0) > 0
            if applied:
                return self.answer(200, {"applied": True, "key": key})
            return self.answer(404, {"applied": False})
        if url.path == "/pending":
            with LOCK:
                n = sum(c for k, c in PENDING.items() if k.startswith(prefix))
            return self.answer(200, {"pending": n})
        if url.path == "/ledger":
            with LOCK:
                with open(OPTS.ledger) as f:
                    lines = [l.strip() for l in f if l.startswith(prefix)]
            return self.answer(200, {"lines": lines})
        return self.answer(404, {"error": "no such endpoint"})


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


def main():
    global OPTS
    ap = argparse.ArgumentParser()
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--pid-file")
    ap.add_argument("--received")
    ap.add_argument("--delay-ms", type=int, default=1000)
    OPTS = ap.parse_args()
    open(OPTS.ledger, "a").close()
    srv = Server(("127.0.0.1", 0), Handler)

    def stop(signum, frame):
        threading.Thread(target=srv.shutdown, daemon=True).start()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if OPTS.pid_file:
        with open(OPTS.pid_file + ".tmp", "w") as f:
            f.write("%d\n" % os.getpid())
        os.rename(OPTS.pid_file + ".tmp", OPTS.pid_file)
    with open(OPTS.port_file + ".tmp", "w") as f:
        f.write("%d\n" % srv.server_address[1])
    os.rename(OPTS.port_file + ".tmp", OPTS.port_file)
    srv.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
