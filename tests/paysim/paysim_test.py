#!/usr/bin/env python3
"""idem-paysim over real HTTP, one behaviour of the simulator per case.

    paysim_test.py --bin BUILD/idem-paysim --curl /usr/bin/curl CASE

Each case starts the built simulator on a free loopback port with a ledger in
a fresh temporary folder, drives it with http.client (and curl(1) where the
exit code tells what the client saw), and checks the answers against the
ledger FILE, which is the truth of what was applied.  Every started
simulator must stop with exit 0 on SIGTERM (under ASan that includes "no
leaks"), unless the case killed it.
"""
import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ARGS = None
IDEMPOTENCY_MESSAGE = ("Keys for idempotent requests can only be used with the "
                       "same parameters they were first used with.")


class Fail(Exception):
    pass


def expect(cond, what, got=None, want=None):
    if not cond:
        raise Fail("%s\n   got: %r\n  want: %r" % (what, got, want))


def eq(got, want, what):
    expect(got == want, what, got, want)


class Response:
    def __init__(self, status, headers, data):
        self.status, self.headers, self.data = status, headers, data

    def json(self):
        try:
            return json.loads(self.data)
        except ValueError:
            raise Fail("not JSON: %r" % self.data[:200])

    def error_type(self):
        return self.json()["error"]["type"]

    def header(self, name):
        return self.headers.get(name)


class Sim:
    """One idem-paysim process."""
    started = []  # every one, to show their stderr and kill what is left

    def __init__(self, folder, ledger=None, args=(), expect_start=True):
        Sim.started.append(self)
        self.folder = folder
        self.ledger = ledger or os.path.join(folder, "ledger.jsonl")
        self.port_file = os.path.join(folder, "port.%d" % len(Sim.started))
        self.err_path = os.path.join(folder, "stderr.%d" % len(Sim.started))
        with open(self.err_path, "wb") as err:
            self.p = subprocess.Popen(
                [ARGS.bin, "--ledger", self.ledger, "--port-file",
                 self.port_file] + list(args), stderr=err)
        self.port = None
        if expect_start:
            self.wait_port()

    def wait_port(self):
        until = time.monotonic() + 30
        while not os.path.exists(self.port_file):
            if self.p.poll() is not None:
                raise Fail("idem-paysim exited %d at start:\n%s" %
                           (self.p.returncode, self.stderr()))
            expect(time.monotonic() < until, "no port file after 30 s")
            time.sleep(0.02)
        with open(self.port_file) as f:
            self.port = int(f.read())

    def stderr(self):
        with open(self.err_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def request(self, method, path, body=None, headers=None, timeout=20,
                chunked=False):
        conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                          timeout=timeout)
        try:
            if body is not None and not isinstance(body, (bytes, str)) \
                    and not chunked:
                body = json.dumps(body)
            conn.request(method, path, body=body, headers=headers or {},
                         encode_chunked=chunked)
            r = conn.getresponse()
            return Response(r.status, r.headers, r.read())
        finally:
            conn.close()

    def refund(self, body, key=None, timeout=20):
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        return self.request("POST", "/v1/refunds", body, headers, timeout)

    def get(self, path):
        return self.request("GET", path)

    def mode(self, mode, **more):
        more["mode"] = mode
        r = self.request("POST", "/_mode", more)
        eq(r.status, 200, "POST /_mode %r" % more)
        return r.json()

    def curl_refund(self, body, key):
        """POST with curl(1): (exit code, http code, stdout)."""
        out = os.path.join(self.folder, "curl.out")
        c = subprocess.run(
            [ARGS.curl, "-sS", "-m", "20", "-o", out, "-w", "%{http_code}",
             "-X", "POST", "-H", "Content-Type: application/json",
             "-H", "Idempotency-Key: " + key, "--data-binary", json.dumps(body),
             "http://127.0.0.1:%d/v1/refunds" % self.port],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        data = open(out, "rb").read() if os.path.exists(out) else b""
        return c.returncode, c.stdout.decode(), data

    def stop(self, sig=signal.SIGTERM):
        self.p.send_signal(sig)
        try:
            rc = self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            raise Fail("idem-paysim did not stop within 20 s of %s" % sig.name)
        expect(rc == 0, "exit status after %s (stderr below)\n%s" %
               (sig.name, self.stderr()), rc, 0)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def ledger_lines(path):
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        text = f.read().decode()
    expect(text == "" or text.endswith("\n"), "ledger ends with a newline",
           text[-80:])
    return [json.loads(line) for line in text.splitlines()]


def applied(r, key, order_id, amount, num, reason=None):
    """Check a 200 refund answer; returns its object."""
    eq(r.status, 200, "status of a refund that applies (%s)" % r.data[:200])
    eq(r.header("Content-Type"), "application/json", "Content-Type")
    o = r.json()
    want = {"id": "re_%06d" % num, "object": "refund", "status": "succeeded",
            "order_id": order_id, "amount_cents": amount, "reason": reason,
            "idempotency_key": key}
    eq({k: o.get(k) for k in want}, want, "refund object")
    expect(isinstance(o.get("created_ms"), int), "created_ms", o)
    return o


def record_of(o):
    """The ledger line a refund object stands for."""
    return {"id": o["id"], "idempotency_key": o["idempotency_key"],
            "order_id": o["order_id"], "amount_cents": o["amount_cents"],
            "reason": o["reason"], "created_ms": o["created_ms"]}


def is_error(r, status, etype, what):
    eq(r.status, status, "%s: status (body %r)" % (what, r.data[:300]))
    eq(r.header("Content-Type"), "application/json", what + ": Content-Type")
    eq(r.error_type(), etype, what + ": error type")
    expect(isinstance(r.json()["error"].get("message"), str),
           what + ": error message", r.data)


# ---- the cases ---------------------------------------------------------------

def case_apply(d):
    """POST applies, is durable in the ledger, and the reads show it."""
    s = Sim(d)
    r = s.refund({"order_id": "ord_1", "amount_cents": 6000,
                  "reason": "duplicate charge"}, key="k1")
    a = applied(r, "k1", "ord_1", 6000, 1, "duplicate charge")
    eq(r.header("Idempotent-Replayed"), None, "no replay header on apply")
    eq(ledger_lines(s.ledger), [record_of(a)], "ledger after one refund")
    # No key: applied, key null; a body member idempotency_key is ignored.
    r = s.refund({"order_id": "ord_1", "amount_cents": 250,
                  "idempotency_key": "body_key", "currency": "eur"})
    b = applied(r, None, "ord_1", 250, 2)
    c = applied(s.refund({"order_id": "ord_2", "amount_cents": 1}, key="k3"),
                "k3", "ord_2", 1, 3)
    lines = ledger_lines(s.ledger)
    eq(lines, [record_of(x) for x in (a, b, c)], "ledger after three")
    eq(list(lines[0].keys()), ["id", "idempotency_key", "order_id",
                               "amount_cents", "reason", "created_ms"],
       "ledger line members, in order")
    r = s.get("/v1/refunds?order_id=ord_1")
    eq(r.status, 200, "list by order")
    eq(r.json(), {"object": "list", "data": [a, b]}, "list of ord_1")
    eq(s.get("/v1/refunds?order_id=ord_none").json()["data"], [],
       "list of an order without refunds")
    eq(s.get("/v1/refunds?idempotency_key=k3").json()["data"], [c],
       "list by key")
    eq(s.get("/v1/refunds?idempotency_key=body_key").json()["data"], [],
       "the body's idempotency_key is not the key")
    eq(s.get("/v1/refunds?order_id=ord_1&idempotency_key=k1").json()["data"],
       [a], "list by order and key")
    eq(s.get("/v1/refunds").json()["data"], [a, b, c], "list of all")
    eq(s.get("/v1/refunds/re_000002").json(), b, "one refund by id")
    eq(s.get("/_ledger").json(), {"refunds": [a, b, c]}, "/_ledger")
    s.stop()
    log = s.stderr()
    for line in ("paysim: listening on 127.0.0.1:%d" % s.port,
                 "paysim: POST /v1/refunds key=k1 -> 200 applied re_000001",
                 "paysim: POST /v1/refunds key=- -> 200 applied re_000002",
                 "paysim: stopped (SIGTERM)"):
        expect(line in log, "stderr has the line", log, line)


def case_replay(d):
    """The same key with the same parameters answers the first answer again."""
    s = Sim(d)
    first = s.refund({"order_id": "ord_1", "amount_cents": 6000}, key="k1")
    a = applied(first, "k1", "ord_1", 6000, 1)
    for body in ({"order_id": "ord_1", "amount_cents": 6000},
                 {"amount_cents": 6000, "order_id": "ord_1", "reason": None},
                 {"order_id": "ord_1", "amount_cents": 6000, "note": "x",
                  "idempotency_key": "other"}):
        r = s.refund(body, key="k1")
        eq((r.status, r.data), (first.status, first.data),
           "replay: same status and body bytes for %r" % body)
        eq(r.header("Idempotent-Replayed"), "true", "Idempotent-Replayed")
    eq(len(ledger_lines(s.ledger)), 1, "ledger lines after replays")
    # Racing the same key: one applies, all get the same body.
    answers = []

    def post():
        answers.append(s.refund({"order_id": "ord_9", "amount_cents": 9},
                                key="race"))
    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # A racer that arrives while the first is still being applied (its
    # ledger line being synced) gets 409, as Stripe answers; every other
    # answer is the one body.
    ok = [r for r in answers if r.status == 200]
    busy = [r for r in answers if r.status != 200]
    eq(sorted({r.status for r in busy}) or [409], [409], "racing statuses")
    expect(all(b"idempotency_conflict" in r.data for r in busy),
           "racing: a 409 says idempotency_conflict", [r.data for r in busy])
    eq(len({r.data for r in ok}), 1, "racing bodies all equal")
    eq(sum(r.header("Idempotent-Replayed") is None for r in ok), 1,
       "racing: exactly one applied")
    eq([x["idempotency_key"] for x in ledger_lines(s.ledger)], ["k1", "race"],
       "ledger after the race")
    # After a restart the key is still known, and ids continue.
    s.stop()
    s = Sim(d)
    r = s.refund({"order_id": "ord_1", "amount_cents": 6000}, key="k1")
    eq((r.status, r.data), (200, first.data), "replay after restart")
    eq(r.header("Idempotent-Replayed"), "true", "replay header after restart")
    applied(s.refund({"order_id": "ord_1", "amount_cents": 1}, key="k2"),
            "k2", "ord_1", 1, 3)
    eq(s.get("/v1/refunds/re_000001").json(), a, "re_000001 after restart")
    s.stop()


def case_mismatch(d):
    """The same key with other parameters is a 422 idempotency_error."""
    s = Sim(d)
    first = s.refund({"order_id": "ord_1", "amount_cents": 100,
                      "reason": "a"}, key="k1")
    applied(first, "k1", "ord_1", 100, 1, "a")
    for other in ({"order_id": "ord_1", "amount_cents": 101, "reason": "a"},
                  {"order_id": "ord_2", "amount_cents": 100, "reason": "a"},
                  {"order_id": "ord_1", "amount_cents": 100, "reason": "b"},
                  {"order_id": "ord_1", "amount_cents": 100}):
        r = s.refund(other, key="k1")
        is_error(r, 422, "idempotency_error", "same key, %r" % other)
        eq(r.json()["error"]["message"], IDEMPOTENCY_MESSAGE, "message")
        eq(r.header("Idempotent-Replayed"), None, "no replay header")
    r = s.refund({"order_id": "ord_1", "amount_cents": 100, "reason": "a"},
                 key="k1")
    eq((r.status, r.data), (200, first.data), "the first parameters replay")
    eq(len(ledger_lines(s.ledger)), 1, "ledger lines")
    s.stop()


def case_conflict(d):
    """The same key while its first request stalls is a 409."""
    s = Sim(d)
    s.mode("stall", count=1, stall_ms=5000)
    first = []
    t = threading.Thread(target=lambda: first.append(
        s.refund({"order_id": "ord_1", "amount_cents": 700}, key="k1",
                 timeout=60)))
    t.start()
    until = time.monotonic() + 20
    while not ledger_lines(s.ledger):
        expect(time.monotonic() < until, "the stalled refund reaches the ledger")
        time.sleep(0.02)
    r = s.refund({"order_id": "ord_1", "amount_cents": 700}, key="k1")
    is_error(r, 409, "idempotency_conflict", "same key while stalled")
    r = s.refund({"order_id": "ord_1", "amount_cents": 999}, key="k1")
    is_error(r, 409, "idempotency_conflict", "same key, other args, stalled")
    # Applied already: a status read sees it while the request stalls, and
    # other requests are served meanwhile (thread per connection).
    r = s.get("/v1/refunds?idempotency_key=k1")
    eq([x["id"] for x in r.json()["data"]], ["re_000001"],
       "status read during the stall")
    applied(s.refund({"order_id": "ord_2", "amount_cents": 5}, key="k2",
                     timeout=4), "k2", "ord_2", 5, 2)
    t.join()
    expect(first, "the stalled request got an answer")
    a = applied(first[0], "k1", "ord_1", 700, 1)
    eq(first[0].header("Idempotent-Replayed"), None, "stalled one applied")
    r = s.refund({"order_id": "ord_1", "amount_cents": 700}, key="k1")
    eq((r.status, r.data), (200, first[0].data), "replay after the stall")
    eq([x["id"] for x in ledger_lines(s.ledger)], ["re_000001", "re_000002"],
       "ledger")
    eq(s.get("/_ledger").json()["refunds"][0], a, "ledger entry")
    s.stop()


def case_stall(d):
    """Mode stall: applied (ledger written), then no answer for stall_ms."""
    s = Sim(d, args=["--mode", "stall", "--stall-ms", "60000"])
    for n, key in enumerate(("k1", "k2"), 1):
        try:
            r = s.refund({"order_id": "ord_1", "amount_cents": 10 * n},
                         key=key, timeout=1)
            raise Fail("a stalled request was answered: %d %r" %
                       (r.status, r.data))
        except socket.timeout:
            pass
        eq([x["idempotency_key"] for x in ledger_lines(s.ledger)],
           ["k1", "k2"][:n], "ledger right after a client timeout")
    eq(len(s.get("/v1/refunds?order_id=ord_1").json()["data"]), 2,
       "reads are served during stalls")
    is_error(s.refund({"order_id": "ord_1", "amount_cents": 10}, key="k1"),
             409, "idempotency_conflict", "the stalled key")
    eq(s.get("/_mode").json(), {"mode": "stall", "count": None,
                                "stall_ms": 60000, "dedupe": True},
       "GET /_mode")
    # SIGTERM does not wait out the stalls: stop() allows 20 s of the 60.
    s.stop()


def wait_log(s, line, what):
    until = time.monotonic() + 20
    while line not in s.stderr():
        expect(time.monotonic() < until, what, s.stderr(), line)
        time.sleep(0.02)


def case_late(d):
    """Mode late: held stall_ms FIRST, then applied, then 200; meanwhile the
    key answers 409 and nothing is in the ledger."""
    s = Sim(d)
    eq(s.mode("late", count=1, stall_ms=1500)["mode"], "late", "mode late")
    first = []
    t = threading.Thread(target=lambda: first.append(
        s.refund({"order_id": "ord_1", "amount_cents": 700}, key="k1",
                 timeout=60)))
    t.start()
    wait_log(s, "key=k1 -> holding 1500 ms", "the request is held")
    eq(ledger_lines(s.ledger), [], "ledger while held: not applied yet")
    eq(s.get("/v1/refunds?idempotency_key=k1").json()["data"], [],
       "status read while held: not applied yet")
    # The same key while held: 409, and it does not apply (nor count).
    for args in ({"order_id": "ord_1", "amount_cents": 700},
                 {"order_id": "ord_1", "amount_cents": 999}):
        is_error(s.refund(args, key="k1"), 409, "idempotency_conflict",
                 "same key while held, %r" % args)
    # Other requests are served meanwhile; count=1 is used up by k1.
    applied(s.refund({"order_id": "ord_2", "amount_cents": 5}, key="k2",
                     timeout=4), "k2", "ord_2", 5, 1)
    eq([x["idempotency_key"] for x in ledger_lines(s.ledger)], ["k2"],
       "ledger while held: only the other refund")
    t.join()
    expect(first, "the held request got an answer")
    a = applied(first[0], "k1", "ord_1", 700, 2)
    eq(first[0].header("Idempotent-Replayed"), None, "the held one applied")
    eq(ledger_lines(s.ledger)[1], record_of(a), "applied after the hold")
    r = s.refund({"order_id": "ord_1", "amount_cents": 700}, key="k1")
    eq((r.status, r.data), (200, first[0].data), "replay after the hold")
    eq(r.header("Idempotent-Replayed"), "true", "replayed")
    # The client gives up during the hold; the refund lands after that.
    s.mode("late", count=1, stall_ms=1000)
    try:
        r = s.refund({"order_id": "ord_3", "amount_cents": 3}, key="k3",
                     timeout=0.3)
        raise Fail("a held request was answered: %d %r" % (r.status, r.data))
    except socket.timeout:
        pass
    eq([x["idempotency_key"] for x in ledger_lines(s.ledger)], ["k2", "k1"],
       "ledger right after the client's timeout: not applied")
    until = time.monotonic() + 20
    while len(ledger_lines(s.ledger)) < 3:
        expect(time.monotonic() < until, "the late refund lands")
        time.sleep(0.02)
    r = s.refund({"order_id": "ord_3", "amount_cents": 3}, key="k3")
    applied(r, "k3", "ord_3", 3, 3)
    eq(r.header("Idempotent-Replayed"), "true", "the landed refund replays")
    # No key: held, then applied all the same.
    s.mode("late", count=1, stall_ms=200)
    applied(s.refund({"order_id": "ord_4", "amount_cents": 4}), None, "ord_4",
            4, 4)
    # Stopped while held: dropped unanswered and NOT applied.
    s.mode("late", stall_ms=60000)
    eq(s.get("/_mode").json(), {"mode": "late", "count": None,
                                "stall_ms": 60000, "dedupe": True},
       "GET /_mode")
    try:
        s.refund({"order_id": "ord_5", "amount_cents": 5}, key="k5", timeout=1)
        raise Fail("a held request was answered")
    except socket.timeout:
        pass
    s.stop()
    eq([x["idempotency_key"] for x in ledger_lines(s.ledger)],
       ["k2", "k1", "k3", None], "ledger: the one held at SIGTERM is not in it")


def case_queued(d):
    """Mode queued: 504 at once, applied stall_ms later from the queue (a
    proxy gave up, the provider did not); meanwhile nothing is in the
    ledger or the status reads, and the key answers 409."""
    s = Sim(d)
    s.mode("queued", count=1, stall_ms=1000)
    t0 = time.monotonic()
    r = s.refund({"order_id": "ord_1", "amount_cents": 700}, key="k1")
    is_error(r, 504, "gateway_timeout", "mode queued")
    expect(time.monotonic() - t0 < 0.8, "the 504 comes at once",
           time.monotonic() - t0)
    eq(ledger_lines(s.ledger), [], "ledger right after the 504")
    eq(s.get("/v1/refunds?idempotency_key=k1").json()["data"], [],
       "status read while queued: not applied yet")
    # The same key while queued: 409, applies nothing, counts nothing.
    is_error(s.refund({"order_id": "ord_1", "amount_cents": 700}, key="k1"),
             409, "idempotency_conflict", "same key while queued")
    applied(s.refund({"order_id": "ord_2", "amount_cents": 5}, key="k2"),
            "k2", "ord_2", 5, 1)
    until = time.monotonic() + 20
    while len(ledger_lines(s.ledger)) < 2:
        expect(time.monotonic() < until, "the queued refund lands")
        time.sleep(0.02)
    expect(time.monotonic() - t0 >= 0.95, "... not before stall_ms",
           time.monotonic() - t0)
    eq([x["idempotency_key"] for x in ledger_lines(s.ledger)], ["k2", "k1"],
       "ledger: the queued refund after the other one")
    r = s.refund({"order_id": "ord_1", "amount_cents": 700}, key="k1")
    a = applied(r, "k1", "ord_1", 700, 2)
    eq(r.header("Idempotent-Replayed"), "true", "the queued refund replays")
    eq(ledger_lines(s.ledger)[1], record_of(a), "its ledger line")
    # Without dedupe the same key while queued applies again: two refunds.
    s.mode("queued", count=1, stall_ms=500, dedupe=False)
    is_error(s.refund({"order_id": "ord_3", "amount_cents": 3}, key="k3"),
             504, "gateway_timeout", "mode queued without dedupe")
    applied(s.refund({"order_id": "ord_3", "amount_cents": 3}, key="k3"),
            "k3", "ord_3", 3, 3)
    until = time.monotonic() + 20
    while len(ledger_lines(s.ledger)) < 4:
        expect(time.monotonic() < until, "the queued refund lands")
        time.sleep(0.02)
    eq([x["idempotency_key"] for x in ledger_lines(s.ledger)],
       ["k2", "k1", "k3", "k3"], "ledger without dedupe")
    # Stopped while queued: dropped, NOT applied, and the stop waits for it.
    s.mode("queued", count=1, stall_ms=60000, dedupe=True)
    is_error(s.refund({"order_id": "ord_5", "amount_cents": 5}, key="k5"),
             504, "gateway_timeout", "queued for a minute")
    s.stop()
    eq(len(ledger_lines(s.ledger)), 4, "ledger: the one queued at SIGTERM "
       "is not in it")
    expect("key=k5 -> dropped from the queue, not applied" in s.stderr(),
           "the drop is said", s.stderr())


def case_no_dedupe(d):
    """--no-dedupe: the key binds nothing, every POST applies a new refund."""
    s = Sim(d, args=["--no-dedupe"])
    eq(s.get("/_mode").json()["dedupe"], False, "GET /_mode dedupe")
    body = {"order_id": "ord_1", "amount_cents": 600}
    a = applied(s.refund(body, key="k1"), "k1", "ord_1", 600, 1)
    r = s.refund(body, key="k1")
    b = applied(r, "k1", "ord_1", 600, 2)
    eq(r.header("Idempotent-Replayed"), None, "not a replay")
    # Other parameters under the same key: applied too, no 422.
    c = applied(s.refund({"order_id": "ord_1", "amount_cents": 1}, key="k1"),
                "k1", "ord_1", 1, 3)
    eq(ledger_lines(s.ledger), [record_of(x) for x in (a, b, c)],
       "two POSTs with one key: two ledger lines (and a third)")
    eq(s.get("/v1/refunds?idempotency_key=k1").json()["data"], [a, b, c],
       "status read by key lists every one")
    # Mode late without dedupe: a second request while the first is held
    # is no 409; both apply.
    s.mode("late", count=1, stall_ms=1000)
    first = []
    t = threading.Thread(target=lambda: first.append(
        s.refund({"order_id": "ord_2", "amount_cents": 2}, key="k2",
                 timeout=60)))
    t.start()
    wait_log(s, "key=k2 -> holding 1000 ms", "the request is held")
    eq(len(ledger_lines(s.ledger)), 3, "not applied while held")
    applied(s.refund({"order_id": "ord_2", "amount_cents": 2}, key="k2"),
            "k2", "ord_2", 2, 4)
    t.join()
    applied(first[0], "k2", "ord_2", 2, 5)
    # Nor does a stall make the key answer 409.
    s.mode("stall", count=1, stall_ms=1000)
    t = threading.Thread(target=lambda: first.append(
        s.refund({"order_id": "ord_3", "amount_cents": 3}, key="k3",
                 timeout=60)))
    t.start()
    wait_log(s, "key=k3 -> applied re_000006, stalling", "the stall")
    applied(s.refund({"order_id": "ord_3", "amount_cents": 3}, key="k3"),
            "k3", "ord_3", 3, 7)
    t.join()
    applied(first[1], "k3", "ord_3", 3, 6)
    keys = [x["idempotency_key"] for x in ledger_lines(s.ledger)]
    eq(keys, ["k1"] * 3 + ["k2"] * 2 + ["k3"] * 2, "ledger")
    s.stop()
    # Read back with --no-dedupe: fine, ids continue.
    s = Sim(d, args=["--no-dedupe"])
    applied(s.refund(body, key="k1"), "k1", "ord_1", 600, 8)
    s.stop()
    # Without it, a ledger with a key applied twice is refused.
    t = Sim(d, expect_start=False)
    eq(t.p.wait(timeout=20), 1, "a deduping simulator on that ledger")
    expect("idempotency key \"k1\" applied twice" in t.stderr(), "message",
           t.stderr())
    # Switched at run time: dedupe off, then on again (a key applied more
    # than once then replays its first refund).
    s = Sim(d, ledger=os.path.join(d, "other.jsonl"))
    a = applied(s.refund(body, key="k1"), "k1", "ord_1", 600, 1)
    eq(s.mode("normal", dedupe=False)["dedupe"], False, "dedupe off")
    applied(s.refund(body, key="k1"), "k1", "ord_1", 600, 2)
    eq(s.mode("normal")["dedupe"], False, "kept when absent")
    eq(s.mode("normal", dedupe=True)["dedupe"], True, "dedupe on")
    r = s.refund(body, key="k1")
    eq((r.status, r.json()), (200, a), "replays the first refund")
    eq(r.header("Idempotent-Replayed"), "true", "replayed")
    eq(len(ledger_lines(s.ledger)), 2, "ledger")
    s.stop()


def case_fail(d):
    """Mode fail: 503 without applying; the key stays free."""
    s = Sim(d)
    s.mode("fail", count=2)
    is_error(s.refund({"order_id": "ord_1", "amount_cents": 50}, key="k1"),
             503, "api_error", "mode fail")
    eq(ledger_lines(s.ledger), [], "ledger after a 503")
    eq(s.get("/v1/refunds?idempotency_key=k1").json()["data"], [],
       "status read after a 503")
    # Validation errors and replays do not use up the count.
    is_error(s.refund({"order_id": "ord_1", "amount_cents": 0}, key="k1"),
             422, "invalid_amount", "validation in mode fail")
    is_error(s.refund({"order_id": "ord_1", "amount_cents": 50}, key="k1"),
             503, "api_error", "mode fail, second")
    applied(s.refund({"order_id": "ord_1", "amount_cents": 50}, key="k1"),
            "k1", "ord_1", 50, 1)
    eq(s.get("/_mode").json()["mode"], "normal", "back to normal after count")
    eq(len(ledger_lines(s.ledger)), 1, "ledger")
    s.stop()


def case_reset(d):
    """Mode reset: applied, then the connection is reset without an answer."""
    s = Sim(d)
    s.mode("reset", count=1)
    rc, code, data = s.curl_refund({"order_id": "ord_1", "amount_cents": 5},
                                   "k1")
    # The contract allows 52 (empty reply) too; the simulator sends a RST.
    eq(rc, 56, "curl exit code (56: connection reset by peer)")
    eq((code, data), ("000", b""), "no HTTP answer at all")
    eq([x["idempotency_key"] for x in ledger_lines(s.ledger)], ["k1"],
       "ledger has the reset refund")
    r = s.refund({"order_id": "ord_1", "amount_cents": 5}, key="k1")
    applied(r, "k1", "ord_1", 5, 1)
    eq(r.header("Idempotent-Replayed"), "true", "the retry replays")
    s.stop()


def case_crash(d):
    """Mode crash: applied and durable, then SIGKILL; a restart replays."""
    s = Sim(d)
    applied(s.refund({"order_id": "ord_0", "amount_cents": 1}, key="k0"),
            "k0", "ord_0", 1, 1)
    s.mode("crash")
    rc, code, data = s.curl_refund({"order_id": "ord_1", "amount_cents": 6000},
                                   "k1")
    expect(rc in (52, 56), "curl exit code", rc, "52 or 56")
    eq((code, data), ("000", b""), "no HTTP answer")
    try:
        eq(s.p.wait(timeout=20), -signal.SIGKILL, "killed by SIGKILL")
    except subprocess.TimeoutExpired:
        s.kill()
        raise Fail("mode crash: the process is still alive")
    lines = ledger_lines(s.ledger)
    eq([(x["id"], x["idempotency_key"]) for x in lines],
       [("re_000001", "k0"), ("re_000002", "k1")], "ledger after the crash")
    s = Sim(d)  # same ledger, normal mode
    expect("ledger %s: 2 refunds" % s.ledger in s.stderr(), "start message",
           s.stderr())
    r = s.refund({"order_id": "ord_1", "amount_cents": 6000}, key="k1")
    eq(r.header("Idempotent-Replayed"), "true", "replay after the crash")
    eq(record_of(applied(r, "k1", "ord_1", 6000, 2)), lines[1],
       "the replay is the refund in the ledger")
    applied(s.refund({"order_id": "ord_1", "amount_cents": 7}, key="k2"),
            "k2", "ord_1", 7, 3)
    eq(len(ledger_lines(s.ledger)), 3, "ledger lines")
    s.stop()


def case_status_down(d):
    """Mode status_down: status reads 503, POSTs normal, count counts GETs."""
    s = Sim(d)
    a = applied(s.refund({"order_id": "ord_1", "amount_cents": 3}, key="k1"),
                "k1", "ord_1", 3, 1)
    s.mode("status_down", count=2)
    b = applied(s.refund({"order_id": "ord_1", "amount_cents": 4}, key="k2"),
                "k2", "ord_1", 4, 2)
    eq(s.get("/_ledger").json()["refunds"], [a, b], "/_ledger stays up")
    is_error(s.get("/v1/refunds?order_id=ord_1"), 503, "api_error",
             "list while down")
    is_error(s.get("/v1/refunds/re_000001"), 503, "api_error", "one while down")
    eq(s.get("/v1/refunds?order_id=ord_1").json()["data"], [a, b],
       "reads are back after count GETs")
    s.mode("status_down")
    for _ in range(3):
        is_error(s.get("/v1/refunds?idempotency_key=k1"), 503, "api_error",
                 "down until changed")
    s.mode("normal")
    eq(s.get("/v1/refunds?idempotency_key=k1").json()["data"], [a], "normal")
    s.stop()


def case_reject429(d):
    """Mode reject429: 429 without applying."""
    s = Sim(d)
    s.mode("reject429", count=1)
    r = s.refund({"order_id": "ord_1", "amount_cents": 5}, key="k1")
    is_error(r, 429, "rate_limit", "mode reject429")
    eq(r.header("Retry-After"), "1", "Retry-After")
    eq(ledger_lines(s.ledger), [], "ledger after a 429")
    applied(s.refund({"order_id": "ord_1", "amount_cents": 5}, key="k1"),
            "k1", "ord_1", 5, 1)
    s.stop()


def case_errors(d):
    """400, 422, 404, 405 and 413, each a JSON error; nothing applied."""
    s = Sim(d)
    for body in (b"", b"nope", b"[1]", b'"s"', b"{}", b'{"order_id":"o"}',
                 b'{"amount_cents":5}', b'{"order_id":5,"amount_cents":5}',
                 b'{"order_id":"","amount_cents":5}',
                 b'{"order_id":"o","amount_cents":"5"}',
                 b'{"order_id":"o","amount_cents":5.0}',
                 b'{"order_id":"o","amount_cents":1e3}',
                 b'{"order_id":"o","amount_cents":5,"reason":7}',
                 b'{"order_id":"o","amount_cents":5,"amount_cents":6}',
                 b'{"order_id":"o","amount_cents":5} x',
                 b'{"order_id":"o","amount_cents":5',
                 b'{"order_id":"o","amount_cents":99999999999999999999999}',
                 b'{"order_id":"\xff","amount_cents":5}',
                 ('{"order_id":"%s","amount_cents":5}' % ("o" * 256)).encode()):
        is_error(s.refund(body, key="k1"), 400, "invalid_request",
                 "body %r" % body[:60])
    for key in ("", "k" * 256, b"\xff\xfe"):
        is_error(s.refund({"order_id": "o", "amount_cents": 5}, key=key), 400,
                 "invalid_request", "Idempotency-Key %r" % key[:20])
    for amount in (0, -1, 10000001, -10 ** 15):
        is_error(s.refund({"order_id": "o", "amount_cents": amount}, key="k1"),
                 422, "invalid_amount", "amount %d" % amount)
    r = s.refund({"order_id": "closed_7", "amount_cents": 5}, key="kc")
    is_error(r, 422, "order_closed", "closed order")
    eq(ledger_lines(s.ledger), [], "nothing applied by errors")
    # A rejected request does not bind its key.
    applied(s.refund({"order_id": "o", "amount_cents": 10000000}, key="kc"),
            "kc", "o", 10000000, 1)
    applied(s.refund({"order_id": "o", "amount_cents": 1}, key="k" * 255),
            "k" * 255, "o", 1, 2)
    for method, path in (("GET", "/nope"), ("POST", "/v1/refund"),
                         ("GET", "/v1/refunds/re_999999"),
                         ("GET", "/v1/refunds/"), ("GET", "/v1/refunds/a/b"),
                         ("GET", "/")):
        is_error(s.request(method, path), 404, "not_found", method + " " + path)
    for method, path, allow in (("PUT", "/v1/refunds", "GET, POST"),
                                ("DELETE", "/v1/refunds/re_000001", "GET"),
                                ("POST", "/_ledger", "GET"),
                                ("PATCH", "/_mode", "GET, POST")):
        r = s.request(method, path)
        is_error(r, 405, "method_not_allowed", method + " " + path)
        eq(r.header("Allow"), allow, "Allow of " + path)
    # 1 MiB exactly is fine; one byte more is 413, declared or chunked.
    head = b'{"order_id":"big","amount_cents":3,"pad":"'
    mib = head + b"x" * ((1 << 20) - len(head) - 2) + b'"}'
    eq(len(mib), 1 << 20, "test body size")
    applied(s.refund(mib, key="kbig"), "kbig", "big", 3, 3)
    over = head + b"x" * ((1 << 20) - len(head) - 1) + b'"}'
    is_error(s.refund(over, key="kover"), 413, "invalid_request", "1 MiB + 1")
    r = s.request("POST", "/v1/refunds", (over[i:i + 65536] for i in
                                          range(0, len(over), 65536)),
                  {"Idempotency-Key": "kchunk"}, chunked=True)
    is_error(r, 413, "invalid_request", "chunked, 1 MiB + 1")
    # Declared far over (64 MiB): refused before the body is read.
    got = raw(s.port, b"POST /v1/refunds HTTP/1.1\r\nHost: x\r\n"
              b"Content-Length: 100000000\r\n\r\n{", read=True)
    expect(got.startswith(b"HTTP/1.1 413 "), "413 for a declared 100 MB",
           got[:100])
    for bad in ({"mode": "bogus"}, {"mode": "fail", "count": 0},
                {"mode": "fail", "count": "2"}, {"mode": "stall", "stall_ms": -1},
                {"mode": "normal", "dedupe": "no"},
                {"mode": "normal", "dedupe": 0}, {"dedupe": False},
                {"count": 1}, [1]):
        is_error(s.request("POST", "/_mode", bad), 400, "invalid_request",
                 "/_mode %r" % bad)
    eq(s.get("/_mode").json()["mode"], "normal", "mode after bad /_mode")
    eq(s.get("/_mode").json()["dedupe"], True, "dedupe after bad /_mode")
    eq([x["idempotency_key"] for x in ledger_lines(s.ledger)],
       ["kc", "k" * 255, "kbig"], "ledger")
    s.stop()


def case_ledger_truncated(d):
    """A crash mid-write leaves a cut last line: dropped with a warning."""
    ledger = os.path.join(d, "ledger.jsonl")
    good = ['{"id":"re_000001","idempotency_key":"k1","order_id":"o",'
            '"amount_cents":5,"reason":null,"created_ms":1}',
            '{"id":"re_000002","idempotency_key":null,"order_id":"o",'
            '"amount_cents":6,"reason":"r","created_ms":2}']
    with open(ledger, "w") as f:
        f.write("\n".join(good) + '\n{"id":"re_000003","idempotency_ke')
    s = Sim(d)
    expect("warning" in s.stderr() and "truncated last line" in s.stderr(),
           "a warning names the cut line", s.stderr())
    eq([x["id"] for x in s.get("/_ledger").json()["refunds"]],
       ["re_000001", "re_000002"], "the two whole refunds")
    r = s.refund({"order_id": "o", "amount_cents": 5}, key="k1")
    eq(r.header("Idempotent-Replayed"), "true", "k1 known from the file")
    applied(s.refund({"order_id": "o", "amount_cents": 7}, key="k3"), "k3",
            "o", 7, 3)
    eq([x["id"] for x in ledger_lines(ledger)],
       ["re_000001", "re_000002", "re_000003"], "the file is whole again")
    s.stop()
    # A whole last record without its newline is kept, and finished.
    with open(ledger, "a") as f:
        f.write(good[0].replace("re_000001", "re_000009")
                .replace('"k1"', '"k9"'))
    s = Sim(d)
    expect("warning" not in s.stderr(), "no warning for a whole line",
           s.stderr())
    applied(s.refund({"order_id": "o", "amount_cents": 1}, key="k10"), "k10",
            "o", 1, 10)
    eq([x["id"] for x in ledger_lines(ledger)][-2:],
       ["re_000009", "re_000010"], "ids continue after the highest")
    s.stop()
    # Anything else is an error, named by file and line; nothing is guessed.
    for text, why in (
            (good[0] + "\nnot json\n" + good[1] + "\n", ":2: not JSON"),
            (good[1] + "\n" + good[0] + "\n", ":2: refund id re_000001 out"),
            (good[0] + "\n" + good[0].replace("re_000001", "re_000002") + "\n",
             ":2: idempotency key \"k1\" applied twice"),
            ('{"id":"x"}\n', ":1: not a refund record")):
        bad = os.path.join(d, "bad.jsonl")
        with open(bad, "w") as f:
            f.write(text)
        s = Sim(d, ledger=bad, expect_start=False)
        eq(s.p.wait(timeout=20), 1, "exit status on a bad ledger")
        expect(("paysim: ledger %s%s" % (bad, why)) in s.stderr(),
               "error names the line", s.stderr(), why)
    # Two simulators never share a ledger.
    s = Sim(d)
    t = Sim(d, expect_start=False)
    eq(t.p.wait(timeout=20), 1, "second simulator on one ledger")
    expect("in use by another idem-paysim" in t.stderr(), "message",
           t.stderr())
    s.stop()


def raw(port, data, read=True, timeout=2.0):
    """Send bytes on a fresh connection; whatever comes back, or b''."""
    c = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    got = b""
    try:
        c.sendall(data)
        if read:
            c.shutdown(socket.SHUT_WR)
            while True:
                b = c.recv(65536)
                if not b:
                    break
                got += b
    except OSError:
        pass  # a reset or a timeout is an answer too
    finally:
        c.close()
    return got


def case_garbage(d):
    """Random bytes, broken HTTP, malformed JSON, huge headers: no crash."""
    s = Sim(d)
    rng = random.Random(20261202)
    port = s.port
    for i in range(150):
        n = rng.choice((1, 7, 100, 1000, 5000))
        data = bytes(rng.getrandbits(8) for _ in range(n))
        if i % 3 == 1:
            data = b"POST /v1/refunds HTTP/1.1\r\n" + data
        if i % 3 == 2:
            data = (b"POST /v1/refunds HTTP/1.1\r\nHost: x\r\nContent-Length: "
                    b"%d\r\nIdempotency-Key: g%d\r\n\r\n" % (len(data), i)) + data
        raw(port, data)
    for data in (
            b"GET " + b"/" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /v1/refunds HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200000 +
            b"\r\n\r\n",
            b"GET /v1/refunds HTTP/1.1\r\n" + b"X-H: 1\r\n" * 20000 + b"\r\n",
            b"GET /v1/refunds?order_id=%00%ff&idempotency_key=%ZZ HTTP/1.1\r\n"
            b"Host: x\r\n\r\n",
            b"GET /v1/refunds/%00 HTTP/1.0\r\n\r\n",
            b"POST /v1/refunds HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
            b"POST /v1/refunds HTTP/1.1\r\nHost: x\r\nContent-Length: "
            b"99999999999999999999999\r\n\r\n",
            b"POST /v1/refunds HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
            b"\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
            b"POST /v1/refunds HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"
            b"{\"order",
            b"POST /_mode HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n\x00\x01"
            b"\x02\x03",
            b"\r\n" * 1000,
            b"GET / HTTP/9.9\r\n\r\n",
            b"GET /_ledger HTTP/1.1\r\nHost: x\r\n\r\n" * 50):
        raw(port, data)
    for body in (b"[" * 100000, b"{\"a\":" * 50000, b"\"\x00\"", b"\xc3\x28",
                 b'{"order_id":"o","amount_cents":1e999999}',
                 b'{"order_id":"o\\ud800","amount_cents":5}',
                 b'{"order_id":"o\\u0000x","amount_cents":5}',
                 bytes(rng.getrandbits(8) for _ in range(20000))):
        for path in ("/v1/refunds", "/_mode"):
            r = s.request("POST", path, body, {"Idempotency-Key": "kj"})
            expect(r.status in (400, 422), "malformed JSON to %s" % path,
                   r.status)
    # Connections left open: half a request, and an idle one.
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    idle[0].sendall(b"POST /v1/refunds HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
    expect(s.p.poll() is None, "alive after the garbage", s.p.returncode)
    applied(s.refund({"order_id": "o", "amount_cents": 5}, key="after"),
            "after", "o", 5, 1)
    eq([x["idempotency_key"] for x in ledger_lines(s.ledger)], ["after"],
       "garbage applied nothing")
    s.stop()
    for c in idle:
        c.close()


def case_cli(d):
    """The command line: usage errors, --port, --quiet, SIGINT."""
    for args, why in (([], "--ledger FILE is required"),
                      (["--ledger"], "missing value for"),
                      (["--ledger", "l", "--port", "70000"], "not a port"),
                      (["--ledger", "l", "--port", "x"], "not a port"),
                      (["--ledger", "l", "--mode", "bogus"], "unknown mode"),
                      (["--ledger", "l", "--stall-ms", "-1"], "--stall-ms"),
                      (["--ledger", "l", "--nope"], "unknown option")):
        c = subprocess.run([ARGS.bin] + args, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, cwd=d)
        eq(c.returncode, 2, "exit status of %r" % args)
        err = c.stderr.decode()
        expect(err.startswith("paysim: ") and why in err and "usage:" in err,
               "message of %r" % args, err, why)
    c = subprocess.run([ARGS.bin, "--ledger", os.path.join(d, "no", "such")],
                       stderr=subprocess.PIPE)
    eq(c.returncode, 1, "exit status for a ledger in a missing folder")
    expect(b"paysim: ledger " in c.stderr, "message", c.stderr)
    c = subprocess.run([ARGS.bin, "--help"], stdout=subprocess.PIPE)
    expect(c.returncode == 0 and b"reject429" in c.stdout and b" late " in
           c.stdout and b"--no-dedupe" in c.stdout, "--help", c.stdout)
    # An explicit port, the defaults, --quiet, SIGINT.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    s = Sim(d, args=["--port", str(port), "--quiet", "--stall-ms", "1234"])
    eq(s.port, port, "the port file holds --port")
    eq(s.get("/_mode").json(), {"mode": "normal", "count": None,
                                "stall_ms": 1234, "dedupe": True}, "defaults")
    applied(s.refund({"order_id": "o", "amount_cents": 5}, key="k"), "k", "o",
            5, 1)
    s.stop(signal.SIGINT)
    eq(s.stderr().splitlines(), ["paysim: listening on 127.0.0.1:%d" % port,
                                 "paysim: stopped (SIGINT)"], "--quiet stderr")
    eq(sorted(f for f in os.listdir(d) if "tmp" in f), [],
       "no temporary port file left")
    t = Sim(d, ledger=os.path.join(d, "other.jsonl"),
            args=["--port", str(port)], expect_start=False)
    s2 = Sim(d, ledger=os.path.join(d, "third.jsonl"))  # a free port still
    eq(s2.get("/_mode").json()["stall_ms"], 30000, "default stall_ms")
    t.wait_port()  # the port was free again after the first one stopped
    taken = Sim(d, ledger=os.path.join(d, "fourth.jsonl"),
                args=["--port", str(port)], expect_start=False)
    eq(taken.p.wait(timeout=20), 1, "exit status when the port is taken")
    expect("paysim: cannot listen on 127.0.0.1:%d" % port in taken.stderr(),
           "message when the port is taken", taken.stderr())
    t.stop()
    s2.stop()


CASES = {name[5:]: fn for name, fn in globals().items()
         if name.startswith("case_")}


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--curl", default="curl")
    ap.add_argument("case", choices=sorted(CASES))
    ARGS = ap.parse_args()
    d = tempfile.mkdtemp(prefix="paysim_%s." % ARGS.case)
    try:
        CASES[ARGS.case](d)
    except Fail as e:
        print("FAIL paysim_%s: %s" % (ARGS.case, e), file=sys.stderr)
        for s in Sim.started:
            print("--- stderr of a simulator ---\n" + s.stderr()[-3000:],
                  file=sys.stderr)
        return 1
    finally:
        for s in Sim.started:
            s.kill()
        shutil.rmtree(d, ignore_errors=True)
    print("ok paysim_%s: %s" % (ARGS.case, CASES[ARGS.case].__doc__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
