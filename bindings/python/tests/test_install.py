"""`pip install ./bindings/python` offline into a fresh virtual environment
(python3 -m venv --system-site-packages, so the distribution's setuptools
serves as the build backend), then the installed package at work from
outside the source tree: with IDEM_LIBRARY, and with the library installed
by `cmake --install` and found the system's way (ctypes.util)."""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from tests.support import PKG, REPO

CALL = """
import idem, json, sys
g = idem.Guard(sys.argv[1], None)
t = g.tool("refund_payment")(lambda a, k: {"refund_id": "re_1", "key": k})
e1 = t("sess_1", "toolu_7", '{"order_id":"ord_1","amount_cents":6000}')
e2 = t("sess_1", "toolu_7", {"amount_cents": 6000, "order_id": "ord_1"})
print(json.dumps({"file": idem.__file__, "lib": idem.library_path,
                  "e1": e1, "e2": e2}))
"""


class PipInstall(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="idem-pip-")
        # a copy of the source, so the build leaves nothing in the tree
        cls.src = os.path.join(cls.tmp, "python")
        shutil.copytree(PKG, cls.src, ignore=shutil.ignore_patterns(
            "__pycache__", "build", "*.egg-info", "tests"))
        cls.venv = os.path.join(cls.tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages",
                        cls.venv], check=True, capture_output=True)
        cls.py = os.path.join(cls.venv, "bin", "python")
        env = dict(os.environ, PIP_NO_INDEX="1",
                   PIP_DISABLE_PIP_VERSION_CHECK="1")
        cls.pip = subprocess.run(
            [cls.py, "-m", "pip", "install", "--no-index",
             "--no-build-isolation", cls.src],
            env=env, capture_output=True, text=True, timeout=300)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_installed(self, **env):
        e = {k: v for k, v in os.environ.items()
             if k not in ("PYTHONPATH", "IDEM_LIBRARY")}
        e.update(env)
        log = "sqlite:" + os.path.join(tempfile.mkdtemp(dir=self.tmp), "a.db")
        return subprocess.run([self.py, "-c", CALL, log], env=e,
                              cwd=self.tmp, capture_output=True, text=True,
                              timeout=120)

    def check_calls(self, r):
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        self.assertTrue(out["file"].startswith(self.venv), out["file"])
        self.assertEqual(out["e1"]["status"], "succeeded")
        self.assertIs(out["e1"]["replayed"], False)
        self.assertIs(out["e2"]["replayed"], True)
        self.assertEqual(out["e1"]["result"]["key"],
                         "sess_1:toolu_7:a280fb850f483293")
        return out

    def test_installed_offline(self):
        self.assertEqual(self.pip.returncode, 0,
                         self.pip.stdout + self.pip.stderr)
        r = subprocess.run([self.py, "-m", "pip", "show", "idem"],
                           capture_output=True, text=True)
        self.assertIn("Version: 0.3.0", r.stdout)

    def test_installed_with_idem_library(self):
        lib = os.environ["IDEM_LIBRARY"]
        out = self.check_calls(self.run_installed(IDEM_LIBRARY=lib))
        self.assertEqual(out["lib"], lib)

    def test_installed_finds_the_system_library(self):
        # `cmake --install` the library under a prefix, then let
        # ctypes.util.find_library find it as it finds any system library
        build = os.path.dirname(os.environ["IDEM_LIBRARY"])
        prefix = os.path.join(self.tmp, "prefix")
        subprocess.run(["cmake", "--install", build, "--prefix", prefix],
                       check=True, capture_output=True)
        libs = glob.glob(os.path.join(prefix, "lib*", "**", "libidem.so"),
                         recursive=True)
        self.assertTrue(libs, "cmake --install put no libidem.so")
        libdir = os.path.dirname(libs[0])
        out = self.check_calls(self.run_installed(
            LD_LIBRARY_PATH=libdir, LIBRARY_PATH=libdir))
        self.assertIn("libidem.so", out["lib"])
        self.assertNotEqual(out["lib"], os.environ["IDEM_LIBRARY"])

    def test_in_place_finds_the_build_tree(self):
        # used in place from the checkout, no IDEM_LIBRARY: <checkout>/build
        if not os.path.exists(os.path.join(REPO, "build", "libidem.so")):
            self.skipTest("no Release build in <checkout>/build")
        e = {k: v for k, v in os.environ.items() if k != "IDEM_LIBRARY"}
        e["PYTHONPATH"] = PKG
        r = subprocess.run([sys.executable, "-c",
                            "import idem; print(idem.library_path)"],
                           env=e, cwd=self.tmp, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(os.path.realpath(r.stdout.strip()),
                         os.path.realpath(os.path.join(REPO, "build",
                                                       "libidem.so")))


if __name__ == "__main__":
    unittest.main()
