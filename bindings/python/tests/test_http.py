"""HTTP tools of the policy, run by the library from Python (Guard.run,
idem_guard_run): a real HTTP server on loopback that counts the refunds it
applies and does NOT dedupe on the key, so a second application would
show in its ledger."""
import http.server
import json
import os
import tempfile
import threading
import unittest

import idem


class Ledger(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.refunds = []  # (path, idempotency key, body)


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):  # quiet
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.server.lock:
            self.server.refunds.append(
                (self.path, self.headers.get("Idempotency-Key"),
                 json.loads(body)))
            n = len(self.server.refunds)
        out = json.dumps({"refund_id": "re_%d" % n}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


@unittest.skipIf(idem.http_missing() is not None, "no HTTP: %s" % idem.http_missing())
class GuardRun(unittest.TestCase):
    def setUp(self):
        self.srv = Ledger()
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.dir = tempfile.TemporaryDirectory()
        port = self.srv.server_address[1]
        self.policy = idem.Policy(text=json.dumps({"tools": {
            "refund_payment": {
                "class": "guarded", "timeout_ms": 5000, "retries": 0,
                "http": {"method": "POST",
                         "url": "http://127.0.0.1:%d/refunds/{order_id}"
                                "?amount={amount}" % port}},
            "local_note": {"class": "guarded"}}}))
        self.guard = idem.Guard("sqlite:" + os.path.join(self.dir.name, "log.db"),
                                self.policy)

    def tearDown(self):
        self.guard.close()
        self.srv.shutdown()
        self.srv.server_close()
        self.dir.cleanup()

    def test_once_then_replayed(self):
        args = {"order_id": "ord_1", "amount": 0.1}
        env = self.guard.run("s1", "c1", "refund_payment", args, turn="t1")
        self.assertEqual(env.status, "succeeded", env.text)
        self.assertEqual(env["result"], {"refund_id": "re_1"})
        again = self.guard.run("s1", "c1", "refund_payment", args, turn="t1")
        self.assertEqual(again.status, "succeeded")
        self.assertTrue(again["replayed"])
        self.assertEqual(len(self.srv.refunds), 1)
        path, key, body = self.srv.refunds[0]
        # the argument's canonical text in the URL, the key in the header,
        # the canonical arguments as the body
        self.assertEqual(path, "/refunds/ord_1?amount=0.1")
        self.assertEqual(key, env["idempotency_key"])
        self.assertEqual(body, args)
        self.assertEqual(self.guard.record("s1", "c1")["state"], "succeeded")

    def test_turn_of_identical_calls_runs_once(self):
        args = {"order_id": "ord_2", "amount": 25}
        answers = [None] * 3

        def one(i):
            answers[i] = self.guard.run("s2", "c%d" % i, "refund_payment",
                                        args, turn="t1")
        th = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        self.assertEqual(sorted(a.status for a in answers),
                         ["already_applied", "already_applied", "succeeded"])
        self.assertEqual(len(self.srv.refunds), 1)

    def test_not_an_http_tool(self):
        with self.assertRaises(idem.PolicyError) as e:
            self.guard.run("s3", "c1", "local_note", {})
        self.assertIn("local_note", str(e.exception))
        with self.assertRaises(idem.NotFoundError):
            self.guard.record("s3", "c1")  # nothing was recorded


if __name__ == "__main__":
    unittest.main()
