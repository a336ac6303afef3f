"""Bad input through the Python binding raises the right typed exception:
every rejection case of tests/data/jcs and every bad policy of tests/policy
(the same data the C suites use), wrong Python types, logs that cannot be
used, a library that cannot be found; and what a model sends wrong is an
answer (invalid_arguments), not an exception."""
import os
import subprocess
import sys
import unittest

from tests.support import idem, REPO, PKG, LogTest, ARGS

JCS = os.path.join(REPO, "tests", "data", "jcs")
POLICIES = os.path.join(REPO, "tests", "policy")

# the short status names of tests/data/jcs/*/error -> the exception class
BY_NAME = {cls.name: cls for cls in (
    idem.JSONSyntaxError, idem.TrailingBytesError, idem.UTF8Error,
    idem.SurrogateError, idem.DuplicateMemberError, idem.NumberOverflowError,
    idem.NumberUnderflowError, idem.BigIntError, idem.DepthError,
    idem.TooBigError, idem.BOMError, idem.NotObjectError)}


class JSONRejections(unittest.TestCase):
    def test_every_jcs_error_case(self):
        cases = sorted(c for c in os.listdir(JCS) if c.startswith("err_"))
        self.assertGreater(len(cases), 30)
        for case in cases:
            with self.subTest(case=case):
                with open(os.path.join(JCS, case, "input"), "rb") as f:
                    data = f.read()
                with open(os.path.join(JCS, case, "error")) as f:
                    name, offset = f.read().split()
                with self.assertRaises(BY_NAME[name]) as cm:
                    idem.canon(data)
                e = cm.exception
                self.assertIsInstance(e, idem.JSONError)
                self.assertIsInstance(e, ValueError)
                self.assertEqual(e.offset, int(offset))
                self.assertEqual(e.name, name)
                self.assertIn("at byte", str(e))
                self.assertTrue(str(e).startswith("idem: "))

    def test_every_jcs_ok_case(self):
        cases = sorted(c for c in os.listdir(JCS) if c.startswith("ok_"))
        for case in cases:
            with self.subTest(case=case):
                with open(os.path.join(JCS, case, "input"), "rb") as f:
                    data = f.read()
                with open(os.path.join(JCS, case, "expected"), "rb") as f:
                    want = f.read().rstrip(b"\n")
                self.assertEqual(idem.canon(data).encode(), want)

    def test_keys_of_bad_arguments(self):
        with self.assertRaises(idem.NotObjectError):
            idem.key("s", "c", "t", "[1]")
        with self.assertRaises(idem.JSONSyntaxError):
            idem.key("s", "c", "t", "{not json")
        with self.assertRaises(idem.BigIntError):
            idem.key("s", "c", "t", '{"n":9007199254740993}')
        with self.assertRaises(idem.InvalidError):
            idem.key("", "c", "t", "{}")
        with self.assertRaises(idem.InvalidError):  # NaN is not JSON
            idem.key("s", "c", "t", {"x": float("nan")})
        with self.assertRaises(idem.RangeError):
            idem.canon("[]", max_depth=0)


class BadPolicies(unittest.TestCase):
    def test_every_policy_case(self):
        files = sorted(f for f in os.listdir(POLICIES) if f.endswith(".json"))
        self.assertGreater(len(files), 100)
        for f in files:
            with self.subTest(policy=f):
                path = os.path.join(POLICIES, f)
                with open(path[:-5] + ".err") as fh:
                    want = fh.readline().rstrip("\n")
                with open(path, "rb") as fh:
                    text = fh.read()
                with self.assertRaises(idem.PolicyError) as cm:
                    idem.Policy(text=text, origin=f)
                msg = cm.exception.message
                self.assertTrue(msg.startswith(want), (msg, want))
                with self.assertRaises(idem.PolicyError) as cm:
                    idem.Policy(path)
                self.assertEqual(cm.exception.message.replace(path, f, 1),
                                 msg)
                with self.assertRaises(idem.PolicyError):
                    idem.Guard("sqlite::memory:", path)

    def test_missing_file_and_misuse(self):
        with self.assertRaises(idem.IdemIOError) as cm:
            idem.Policy("/nonexistent/policy.json")
        self.assertIsInstance(cm.exception, OSError)
        self.assertIn("/nonexistent/policy.json", str(cm.exception))
        with self.assertRaises(idem.MisuseError):
            idem.Policy()
        with self.assertRaises(idem.MisuseError):
            idem.Policy(42)


class WrongTypes(LogTest):
    def test_guard_calls(self):
        with idem.Guard(self.log(), None) as g:
            refund = g.tool("refund_payment")(lambda a, k: {"ok": 1})
            for session, call_id, args, exc in (
                    (123, "c", ARGS, idem.MisuseError),
                    ("s", None, ARGS, idem.MisuseError),
                    ("s", "c", 42, idem.MisuseError),
                    ("s", "c", object(), idem.MisuseError),
                    ("", "c", ARGS, idem.InvalidError),
                    ("s", "", ARGS, idem.InvalidError),
                    ("s", "c\0d", ARGS, idem.InvalidError),
                    ("s", "c", {"x": {1, 2}}, idem.InvalidError),
                    ("s", "c", {"x": float("inf")}, idem.InvalidError)):
                with self.subTest(session=session, call_id=call_id,
                                  args=args):
                    with self.assertRaises(exc):
                        refund(session, call_id, args)
            # misuse is a TypeError, invalid a ValueError, to plain Python
            with self.assertRaises(TypeError):
                refund(1, "c", ARGS)
            with self.assertRaises(ValueError):
                refund("", "c", ARGS)
            with self.assertRaises(idem.MisuseError):
                g.tool("t")("not callable")
            with self.assertRaises(idem.MisuseError):
                with g.begin("s", "c9", "refund_payment", ARGS) as s:
                    s.finish(99)
            with self.assertRaises(idem.MisuseError):
                with g.begin("s", "c10", "refund_payment", ARGS) as s:
                    s.resolve(idem.APPLIED)  # no CHECK step

    def test_model_errors_are_answers(self):
        with idem.Guard(self.log(), None) as g:
            refund = g.tool("refund_payment")(lambda a, k: {"ok": 1})
            for bad in ("", "{", '{"a":1}x', "[1]", '"str"', "\ufeff{}",
                        '{"a":1,"a":1}', b'{"a":"\xff"}'):
                with self.subTest(args=bad):
                    env = refund("s", "c", bad)
                    self.assertEqual(env["status"], "invalid_arguments")
                    self.assertIn("Nothing was run", env["message"])

    def test_odd_results_are_errors(self):
        # a result json cannot encode is an error, never its str() recorded
        # as succeeded: the outcome is unknown, in words that say why
        with idem.Guard(self.log(), None) as g:
            t = g.tool("t")(lambda a, k: {1, 2})
            env = t("s", "c", "{}")
            self.assertEqual(env["status"], "outcome_unknown")
            self.assertIn("returned set, which is not JSON", env["message"])


class BadLogs(LogTest):
    def test_corrupt_log_and_directory(self):
        path = os.path.join(self.dir, "corrupt.db")
        with open(path, "w") as f:
            f.write("this is not a database\n" * 300)
        with self.assertRaises(idem.CorruptError) as cm:
            idem.Guard("sqlite:" + path)
        self.assertIsInstance(cm.exception, idem.StoreError)
        with self.assertRaises(idem.IdemError):
            idem.Guard("sqlite:" + self.dir)
        with self.assertRaises(idem.MisuseError):
            idem.Guard(42)


class Library(unittest.TestCase):
    def run_py(self, code, **env):
        e = dict(os.environ, PYTHONPATH=PKG)
        e.update(env)
        return subprocess.run([sys.executable, "-c", code], env=e,
                              capture_output=True, text=True, timeout=60)

    def test_library_not_found(self):
        r = self.run_py("import idem", IDEM_LIBRARY="/nonexistent/libidem.so")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("LibraryNotFound", r.stderr)
        self.assertIn("idem: cannot load libidem", r.stderr)
        self.assertIn("IDEM_LIBRARY", r.stderr)
        r = self.run_py("import idem", IDEM_LIBRARY="/etc/passwd")
        self.assertIn("LibraryNotFound", r.stderr)

    def test_library_from_env(self):
        lib = os.environ.get("IDEM_LIBRARY")
        if not lib:
            self.skipTest("IDEM_LIBRARY is not set (run under CTest)")
        r = self.run_py("import idem; print(idem.library_path, "
                        "idem.version())")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), [lib, idem.version()])


if __name__ == "__main__":
    unittest.main()
