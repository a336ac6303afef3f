"""Ended is not finished (SPEC 6a as amended), through the Python binding.

Only a verdict finishes an attempt: the function returned a result, or
raised idem.NotApplied / idem.Rejected, or an exception its tool's
``not_applied_on`` names.  A function that raised anything else - here
urllib's own TimeoutError - ended without one: the request may sit in the
provider's queue and land later, so a status check saying "not applied"
permits neither a retry with the same key nor the model's re-issue until
the tool's settle_ms has passed since it ended.

The provider is a real HTTP server on loopback that accepts a refund and
applies it a second later (the seed's "an 8-second client deadline can
expire long after the processor accepted"); it keeps the key, so its
status lookup by key is truthful, and it does not dedupe on it: every
POST is a refund, and each extra one shows in its ledger.  A status
function given in code is the tool's status check even when the policy
names none (issue 26, item 6)."""
import asyncio
import http.client
import json
import socket
import threading
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support import idem, LogTest, next_turn

ORDER = {"order_id": "ord_1", "amount_cents": 6000}

# the guard's deadline (3 s) is far past the tool's own client's (0.3 s):
# the function raises TimeoutError long before the guard stops waiting
STATUS_POLICY = """{"tools":{
  "refund_payment":{"class":"guarded","timeout_ms":3000,%s
    "status":{"tool":"get_refund_status",
              "arguments":{"order_id":"{order_id}"}}},
  "get_refund_status":{"class":"read_only"}}}"""
NO_STATUS_POLICY = """{"tools":{
  "refund_payment":{"class":"guarded","timeout_ms":3000,%s"wait_ms":3000}}}"""

CLIENT_TIMEOUT_S = 0.3
APPLY_AFTER_S = 1.0


def policy(text, extra=""):
    return idem.Policy(text=text % extra, origin="test_ended")


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):  # quiet
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}")
        p = self.server.provider
        code, answer = p.accept(self.headers.get("Idempotency-Key"), body)
        self.reply(code, answer)

    def do_GET(self):
        p = self.server.provider
        key = urllib.parse.unquote(self.path.rsplit("/", 1)[-1])
        found = p.lookup(key)
        self.reply(200 if found else 404, found or {"error": "no such refund"})

    def reply(self, code, answer):
        data = json.dumps(answer).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up long ago
            pass


class HttpProvider:
    """A payment provider on 127.0.0.1.  POST /refunds with an
    Idempotency-Key header: in mode "queued" the refund is accepted, applied
    APPLY_AFTER_S later, and answered after that (the client has given up);
    "drop": accepted, answered late, never applied; "ok": applied and
    answered at once.  GET /refunds/<key>: 200 with the refund once applied,
    404 before (the key is kept: the lookup is truthful).  No dedupe."""

    def __init__(self, mode="queued"):
        self.mu = threading.Lock()
        self.mode = mode
        self.posts = []    # keys, in the order the requests came
        self.ledger = []   # keys of applied refunds, in order
        self.lookups = 0
        self.timers = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.provider = self
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def close(self):
        for t in self.timers:
            t.cancel()
        self.server.shutdown()
        self.server.server_close()

    def apply(self, key):
        with self.mu:
            self.ledger.append(key)
            return {"refund_id": "re_%d" % len(self.ledger),
                    "status": "applied"}

    def accept(self, key, body):
        with self.mu:
            self.posts.append(key)
            mode = self.mode
        if mode == "ok":
            return 201, dict(self.apply(key), amount_cents=body.get(
                "amount_cents"))
        if mode == "queued":
            t = threading.Timer(APPLY_AFTER_S, self.apply, (key,))
            t.daemon = True
            self.timers.append(t)
            t.start()
        time.sleep(APPLY_AFTER_S + 0.2)  # long past the client's timeout
        return 202, {"status": "queued"}

    def lookup(self, key):
        with self.mu:
            self.lookups += 1
            if key in self.ledger:
                return {"refund_id": "re_%d" % (self.ledger.index(key) + 1),
                        "status": "applied"}
        return None

    # the tool's body and its status function, as a harness writes them

    def post(self, order_id, amount_cents, key):
        req = urllib.request.Request(
            self.url + "/refunds", method="POST",
            data=json.dumps({"order_id": order_id,
                             "amount_cents": amount_cents}).encode(),
            headers={"Idempotency-Key": key,
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=CLIENT_TIMEOUT_S) as r:
            return json.load(r)

    def status(self, args, key):
        url = self.url + "/refunds/" + urllib.parse.quote(key, safe="")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None  # not applied (yet)
            raise


def closed_port():
    """A loopback port nothing listens on: connecting is refused."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Base(LogTest):
    def setUp(self):
        super().setUp()
        self.p = HttpProvider()
        self.guards = []

    def tearDown(self):
        for g in self.guards:
            g.close()
        self.p.close()
        super().tearDown()

    def guard(self, pol):
        g = idem.Guard(self.log(), pol)
        self.guards.append(g)
        return g

    def key(self, g, session, call_id):
        return g.record(session, call_id)["key"]


class TheClientsTimeoutIsNoVerdict(Base):
    """The tool's own urllib client times out after 0.3 s; the provider
    applies the refund at 1 s.  One refund, whatever the model does."""

    def check_story(self, g, call):
        """call(call_id, turn) -> the envelope; the model re-issues at once
        after the answer, then 1.6 s later."""
        env = call("c1", next_turn())
        self.assertEqual(env["status"], "outcome_unknown", env)
        self.assertEqual(env["attempts"], 1, env)  # no retry on "not applied"
        self.assertNotIn("safe to call", env["message"])
        self.assertNotIn("did not take effect", env["message"])
        self.assertEqual(env["check_with"]["tool"], "get_refund_status")
        self.assertEqual(len(self.p.posts), 1)
        self.assertGreaterEqual(self.p.lookups, 1)  # the check ran
        rec = g.record("s", "c1")
        self.assertEqual(rec["state"], "in_doubt")
        self.assertIsNone(rec["executor"])       # nothing of it runs ...
        self.assertGreater(rec["settle_from"], 0)  # ... yet it may land
        self.assertIn("TimeoutError", rec["error"])
        # the model re-issues under a new call id right after its answer:
        # fenced, nothing sent
        env = call("c2", next_turn())
        self.assertEqual(env["status"], "outcome_unknown", env)
        self.assertEqual(env["duplicate_of"], "c1")
        self.assertNotIn("safe to call", env["message"])
        self.assertEqual(len(self.p.posts), 1)
        self.assertEqual(self.p.ledger, [])  # it has not landed yet
        # and again 1.6 s later: the refund has landed
        time.sleep(1.6)
        env = call("c3", next_turn())
        self.assertEqual(env["status"], "already_applied", env)
        self.assertEqual(env["duplicate_of"], "c1")
        self.assertEqual(env["result"]["refund_id"], "re_1")
        self.assertEqual(self.p.posts, [self.key(g, "s", "c1")])
        self.assertEqual(self.p.ledger, [self.key(g, "s", "c1")])
        rec = g.record("s", "c1")
        self.assertEqual(rec["state"], "succeeded")
        self.assertEqual(rec["resolution"], "reconciled")
        self.assertEqual(rec["attempts"], 1)

    def test_sync_tool(self):
        g = self.guard(policy(STATUS_POLICY))
        p = self.p

        @g.tool("refund_payment", status=p.status)
        def refund_payment(order_id: str, amount_cents: int) -> dict:
            return p.post(order_id, amount_cents, idem.current_key())

        def call(call_id, turn):
            with idem.call_context(session="s", call_id=call_id, turn=turn):
                return refund_payment(**ORDER)
        self.check_story(g, call)

    def test_asyncio_tool(self):
        g = self.guard(policy(STATUS_POLICY))
        p = self.p

        async def status(args, key):
            return await asyncio.to_thread(p.status, args, key)

        @g.tool("refund_payment", status=status)
        async def refund_payment(order_id: str, amount_cents: int) -> dict:
            return await asyncio.to_thread(p.post, order_id, amount_cents,
                                           idem.current_key())

        async def story():
            loop = asyncio.get_running_loop()

            def call(call_id, turn):
                # each call awaited on the loop, from a thread of its own,
                # so that check_story stays one function for both forms
                async def one():
                    with idem.call_context(session="s", call_id=call_id,
                                           turn=turn):
                        return await refund_payment(**ORDER)
                return asyncio.run_coroutine_threadsafe(one(), loop).result(30)
            await asyncio.to_thread(self.check_story, g, call)
        asyncio.run(story())

    def test_first_form_acall(self):
        g = self.guard(policy(STATUS_POLICY))
        p = self.p
        tool = g.tool("refund_payment", status=p.status)(
            lambda args, key: p.post(args["order_id"], args["amount_cents"],
                                     key))

        async def story():
            loop = asyncio.get_running_loop()

            def call(call_id, turn):
                return asyncio.run_coroutine_threadsafe(
                    tool.acall("s", call_id, ORDER, turn=turn), loop
                ).result(30)
            await asyncio.to_thread(self.check_story, g, call)
        asyncio.run(story())


class SettleMs(Base):
    """settle_ms bounds how long an ended attempt may still land: after it,
    "not applied" is a verdict, and a re-issue runs - once."""

    def test_a_reissue_after_settle_ms_runs_once(self):
        self.p.mode = "drop"  # accepted, never applied
        g = self.guard(policy(STATUS_POLICY, '"settle_ms":500,'))
        p = self.p

        @g.tool("refund_payment", status=p.status)
        def refund_payment(order_id: str, amount_cents: int) -> dict:
            return p.post(order_id, amount_cents, idem.current_key())

        def call(call_id):
            with idem.call_context(session="s", call_id=call_id,
                                   turn=next_turn()):
                return refund_payment(**ORDER)
        env = call("c1")
        ended = time.monotonic()
        self.assertEqual(env["status"], "outcome_unknown", env)
        self.assertEqual(env["attempts"], 1, env)
        self.assertEqual(len(p.posts), 1)
        # within settle_ms of its end: fenced
        env = call("c2")
        self.assertEqual(env["status"], "outcome_unknown", env)
        self.assertEqual(env["duplicate_of"], "c1")
        self.assertEqual(len(p.posts), 1)
        # past it: c1 did not take effect, and c2's re-issue runs once
        time.sleep(max(0.0, ended + 0.5 + 0.2 - time.monotonic()))
        p.mode = "ok"
        env = call("c3")
        self.assertEqual(env["status"], "succeeded", env)
        self.assertEqual(env["attempts"], 1)
        self.assertEqual(p.posts, [self.key(g, "s", "c1"),
                                   self.key(g, "s", "c3")])
        self.assertEqual(p.ledger, [self.key(g, "s", "c3")])
        self.assertEqual(g.record("s", "c1")["state"], "not_applied")

    def test_settle_ms_0_a_local_tool_retries_with_its_key(self):
        # the control: a local write's effects end with the function, so
        # its end is a finish, and "not applied" retries with the same key
        g = self.guard(policy(STATUS_POLICY, '"settle_ms":0,"backoff_ms":1,'))
        written, keys = [], []

        def status(args, key):
            return {"written": key} if key in written else None

        @g.tool("refund_payment", status=status)
        def refund_payment(order_id: str, amount_cents: int) -> dict:
            keys.append(idem.current_key())
            if len(keys) == 1:
                raise OSError("disk full")  # before anything was written
            written.append(idem.current_key())
            return {"written": idem.current_key()}
        with idem.call_context(session="s", call_id="c1"):
            env = refund_payment(**ORDER)
        self.assertEqual(env["status"], "succeeded", env)
        self.assertEqual(env["attempts"], 2)
        self.assertEqual(len(set(keys)), 1)
        self.assertEqual(len(keys), 2)

    def test_default_the_same_local_tool_stays_in_doubt(self):
        # the same tool under the default (no settle_ms): its exception is
        # no verdict, the check's "not applied" no licence to run it again
        g = self.guard(policy(STATUS_POLICY, '"backoff_ms":1,'))
        keys = []

        @g.tool("refund_payment", status=lambda a, k: None)
        def refund_payment(order_id: str, amount_cents: int) -> dict:
            keys.append(idem.current_key())
            raise OSError("disk full")
        with idem.call_context(session="s", call_id="c1"):
            env = refund_payment(**ORDER)
        self.assertEqual(env["status"], "outcome_unknown", env)
        self.assertEqual(env["attempts"], 1)
        self.assertEqual(len(keys), 1)


class Verdicts(Base):
    """What the function says reaches the C core as a verdict (the record
    keeps no attempt that may land: settle_from 0), sync and asyncio; any
    other exception does not."""

    POLICY = NO_STATUS_POLICY % '"backoff_ms":1,'

    def tool(self, g, raise_, asyncio_form):
        calls = []
        if asyncio_form:
            async def refund_payment(order_id: str, amount_cents: int):
                calls.append(idem.current_key())
                await asyncio.sleep(0)
                raise raise_
        else:
            def refund_payment(order_id: str, amount_cents: int):
                calls.append(idem.current_key())
                raise raise_
        return g.tool("refund_payment")(refund_payment), calls

    def run_one(self, raise_, asyncio_form, call_id):
        g = self.guard(idem.Policy(text=self.POLICY, origin="t"))
        fn, calls = self.tool(g, raise_, asyncio_form)
        with idem.call_context(session="s", call_id=call_id):
            env = (asyncio.run(fn(**ORDER)) if asyncio_form
                   else fn(**ORDER))
        return env, calls, g.record("s", call_id)

    def test_not_applied_rejected_and_the_rest(self):
        for form in (False, True):
            with self.subTest(asyncio_form=form):
                env, calls, rec = self.run_one(
                    idem.NotApplied("connection refused"), form, "na")
                self.assertEqual(env["status"], "failed", env)
                self.assertEqual(env["attempts"], 3)  # retries 2, same key
                self.assertEqual(len(calls), 3)
                self.assertEqual(len(set(calls)), 1)
                self.assertIn("safe to call it again", env["message"])
                self.assertEqual(rec["state"], "not_applied")
                self.assertIsNone(rec["executor"])
                self.assertEqual(rec["settle_from"], 0)

                env, calls, rec = self.run_one(
                    idem.Rejected("card expired"), form, "rj")
                self.assertEqual(env["status"], "failed", env)
                self.assertEqual(len(calls), 1)
                self.assertIn("card expired", env["message"])
                self.assertEqual(rec["state"], "failed")
                self.assertEqual(rec["settle_from"], 0)

                env, calls, rec = self.run_one(
                    ConnectionResetError("reset after sending"), form, "cr")
                self.assertEqual(env["status"], "outcome_unknown", env)
                self.assertEqual(len(calls), 1)
                self.assertEqual(rec["state"], "in_doubt")
                self.assertIsNone(rec["executor"])
                self.assertGreater(rec["settle_from"], 0)
                # no status check anywhere: the model is told so, truly
                self.assertIn("there is no status check", env["message"])


class NotAppliedOn(Base):
    """not_applied_on=(ConnectionRefusedError,): a refused connection
    proves nothing was sent - retried with the same key, then failed,
    safe to call again; without it, the same refusal is in doubt."""

    def test_a_closed_port_urllib(self):
        url = "http://127.0.0.1:%d/refunds" % closed_port()
        for nao in ((ConnectionRefusedError,), None):
            with self.subTest(not_applied_on=nao):
                g = self.guard(policy(NO_STATUS_POLICY, '"backoff_ms":1,'))
                keys = []

                @g.tool("refund_payment", not_applied_on=nao)
                def refund_payment(order_id: str, amount_cents: int) -> dict:
                    keys.append(idem.current_key())
                    req = urllib.request.Request(
                        url, method="POST", data=b"{}",
                        headers={"Idempotency-Key": idem.current_key()})
                    with urllib.request.urlopen(req, timeout=0.3) as r:
                        return json.load(r)
                with idem.call_context(session="s", call_id="c1"):
                    env = refund_payment(**ORDER)
                rec = g.record("s", "c1")
                if nao:
                    self.assertEqual(env["status"], "failed", env)
                    self.assertEqual(env["attempts"], 3)
                    self.assertEqual(len(keys), 3)
                    self.assertEqual(len(set(keys)), 1)
                    self.assertIn("safe to call it again", env["message"])
                    self.assertIn("Connection refused", env["message"])
                    self.assertEqual(rec["state"], "not_applied")
                    self.assertEqual(rec["settle_from"], 0)
                else:
                    self.assertEqual(env["status"], "outcome_unknown", env)
                    self.assertEqual(env["attempts"], 1)
                    self.assertEqual(len(keys), 1)
                    self.assertEqual(rec["state"], "in_doubt")

    def test_a_closed_port_asyncio(self):
        port = closed_port()
        g = self.guard(policy(NO_STATUS_POLICY, '"backoff_ms":1,'))
        tries = []

        @g.tool("refund_payment", not_applied_on=(ConnectionRefusedError,))
        async def refund_payment(order_id: str, amount_cents: int) -> dict:
            tries.append(idem.current_key())
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return {}

        async def go():
            with idem.call_context(session="s", call_id="c1"):
                return await refund_payment(**ORDER)
        env = asyncio.run(go())
        self.assertEqual(env["status"], "failed", env)
        self.assertEqual(env["attempts"], 3)
        self.assertEqual(len(tries), 3)
        self.assertEqual(g.record("s", "c1")["state"], "not_applied")

    def test_only_for_the_tool_not_its_status_check(self):
        # a status check that cannot connect has checked nothing
        g = self.guard(policy(STATUS_POLICY, '"backoff_ms":1,'))

        def status(args, key):
            raise ConnectionRefusedError("status API down")

        @g.tool("refund_payment", status=status,
                not_applied_on=(ConnectionRefusedError,))
        def refund_payment(order_id: str, amount_cents: int) -> dict:
            raise TimeoutError("no answer")
        with idem.call_context(session="s", call_id="c1"):
            env = refund_payment(**ORDER)
        self.assertEqual(env["status"], "outcome_unknown", env)
        self.assertEqual(env["attempts"], 1)

    def test_the_argument_is_checked(self):
        g = self.guard(policy(NO_STATUS_POLICY, ""))
        ok = g.tool("refund_payment", not_applied_on=(
            ConnectionRefusedError, socket.gaierror))(lambda a, k: {})
        self.assertEqual(ok.not_applied_on,
                         (ConnectionRefusedError, socket.gaierror))
        for bad, says in (
                (ConnectionRefusedError, "tuple"),
                ([ConnectionRefusedError], "tuple"),
                (("ConnectionRefusedError",), "exception classes"),
                ((ConnectionRefusedError, 3), "exception classes"),
                ((OSError,), "TimeoutError"),
                ((ConnectionError,), "ConnectionResetError"),
                ((Exception,), "TimeoutError"),
                ((TimeoutError,), "TimeoutError"),
                ((http.client.RemoteDisconnected,), "ConnectionResetError"),
                ((asyncio.TimeoutError,), "TimeoutError"),
                ((urllib.error.URLError,), "wraps any socket error"),
                ((urllib.error.HTTPError,), "HTTP answer"),
                ((idem.NotApplied,), "verdict")):
            with self.subTest(bad=bad):
                with self.assertRaises(TypeError) as cm:
                    g.tool("refund_payment", not_applied_on=bad)
                self.assertIn(says, str(cm.exception))
                with self.assertRaises(TypeError):
                    idem.GuardedTool(g, "refund_payment", lambda a, k: {},
                                     not_applied_on=bad)


class StatusInCode(Base):
    """A status function given in code is a status check, whatever the
    policy says (issue 26, item 6): it is called, and the model's words
    about the check are true."""

    def test_called_sync_and_asyncio(self):
        for form in ("sync", "asyncio", "first"):
            with self.subTest(form=form):
                g = self.guard(policy(NO_STATUS_POLICY, ""))
                ledger, checked = [], []

                def status(args, key):
                    checked.append(key)
                    return {"refund": key} if key in ledger else None

                def body(key):
                    ledger.append(key)
                    raise ConnectionResetError("reset after sending")
                if form == "sync":
                    @g.tool("refund_payment", status=status)
                    def refund_payment(order_id: str, amount_cents: int):
                        body(idem.current_key())
                    with idem.call_context(session="s", call_id="c1"):
                        env = refund_payment(**ORDER)
                elif form == "asyncio":
                    @g.tool("refund_payment", status=status)
                    async def refund_payment(order_id: str,
                                             amount_cents: int):
                        body(idem.current_key())

                    async def go():
                        with idem.call_context(session="s", call_id="c1"):
                            return await refund_payment(**ORDER)
                    env = asyncio.run(go())
                else:
                    tool = g.tool("refund_payment", status=status)(
                        lambda a, k: body(k))
                    env = tool("s", "c1", ORDER)
                self.assertEqual(checked, ledger)  # called, with the key
                self.assertEqual(env["status"], "succeeded", env)
                self.assertEqual(env["result"], {"refund": ledger[0]})
                self.assertEqual(g.record("s", "c1")["resolution"],
                                 "reconciled")

    def test_not_found_the_words_are_true(self):
        for form in ("sync", "asyncio"):
            with self.subTest(form=form):
                g = self.guard(policy(NO_STATUS_POLICY, ""))
                checked = []

                def status(args, key):
                    checked.append(key)
                    return None

                if form == "sync":
                    @g.tool("refund_payment", status=status)
                    def refund_payment(order_id: str, amount_cents: int):
                        raise TimeoutError("the client gave up")
                    with idem.call_context(session="s", call_id="c1"):
                        env = refund_payment(**ORDER)
                else:
                    @g.tool("refund_payment", status=status)
                    async def refund_payment(order_id: str,
                                             amount_cents: int):
                        raise TimeoutError("the client gave up")

                    async def go():
                        with idem.call_context(session="s", call_id="c1"):
                            return await refund_payment(**ORDER)
                    env = asyncio.run(go())
                self.assertEqual(len(checked), 1)
                self.assertEqual(env["status"], "outcome_unknown", env)
                self.assertNotIn("no status check", env["message"])
                self.assertNotIn("safe to call", env["message"])

    def test_two_phase_own_check(self):
        g = self.guard(policy(NO_STATUS_POLICY, ""))
        with g.begin("s1", "c1", "refund_payment", ORDER) as st:
            self.assertEqual(st.next, idem.Next.EXECUTE)
            st.attempt_ended()
            st.finish(idem.UNKNOWN, error="TimeoutError: the client gave up")
            self.assertEqual(st.next, idem.Next.ANSWER)  # no check to run
            self.assertIn("there is no status check", st.envelope["message"])
        with g.begin("s2", "c1", "refund_payment", ORDER,
                     own_check=True) as st:
            self.assertEqual(st.next, idem.Next.EXECUTE)
            st.attempt_ended()
            st.finish(idem.UNKNOWN, error="TimeoutError: the client gave up")
            self.assertEqual(st.next, idem.Next.CHECK)
            self.assertIsNone(st.check_tool)
            self.assertEqual(st.check_key, st.key)
            st.resolve(idem.APPLIED, {"refund_id": "re_9"})
            self.assertEqual(st.answer, "succeeded")


if __name__ == "__main__":
    unittest.main()
