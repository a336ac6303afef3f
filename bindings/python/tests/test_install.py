"""`pip install ./bindings/python` offline into a fresh virtual environment
(python3 -m venv --system-site-packages, so the distribution's setuptools
serves as the build backend), then the installed package at work from
outside the source tree: with IDEM_LIBRARY; with the library installed by
`cmake --install` and found through pkg-config's libdir (PKG_CONFIG_PATH
naming the prefix's lib/pkgconfig, nothing else); found the system's way
(ctypes.util); and, with no library anywhere, LibraryNotFound saying what
to do.  The package carries its py.typed marker, and its type hints check
(mypy --strict, where mypy is installed)."""
import ctypes.util
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from tests.support import PKG, REPO, idem

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

    @classmethod
    def install_prefix(cls):
        """`cmake --install` of the build under a prefix of the test's: its
        libdir (where libidem.so and pkgconfig/idem.pc are)."""
        if getattr(cls, "libdir", None) is None:
            build = os.path.dirname(os.environ["IDEM_LIBRARY"])
            prefix = os.path.join(cls.tmp, "prefix")
            subprocess.run(["cmake", "--install", build, "--prefix", prefix],
                           check=True, capture_output=True)
            libs = glob.glob(os.path.join(prefix, "lib*", "**",
                                          "libidem.so"), recursive=True)
            assert libs, "cmake --install put no libidem.so"
            cls.libdir = os.path.dirname(libs[0])
        return cls.libdir

    def run_installed(self, code=CALL, **env):
        # nothing of the build's or the host's: no IDEM_LIBRARY, no
        # library or pkg-config paths but the ones given
        e = {k: v for k, v in os.environ.items()
             if k not in ("PYTHONPATH", "IDEM_LIBRARY", "LD_LIBRARY_PATH",
                          "LIBRARY_PATH", "PKG_CONFIG_PATH")}
        e.update(env)
        log = "sqlite:" + os.path.join(tempfile.mkdtemp(dir=self.tmp), "a.db")
        return subprocess.run([self.py, "-c", code, log], env=e,
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
        self.assertIn("Version: 0.4.0", r.stdout)

    def test_installed_with_idem_library(self):
        lib = os.environ["IDEM_LIBRARY"]
        out = self.check_calls(self.run_installed(IDEM_LIBRARY=lib))
        self.assertEqual(out["lib"], lib)

    def test_installed_carries_its_type_hints(self):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        r = subprocess.run([self.py, "-c", "import idem, os; print("
                            "os.path.dirname(idem.__file__))"],
                           env=env, cwd=self.tmp, capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        where = r.stdout.strip()
        self.assertTrue(where.startswith(self.venv), where)
        for f in ("py.typed", "natural.py", "_aio.py", "guard.py"):
            self.assertTrue(os.path.exists(os.path.join(where, f)), f)

    def test_installed_finds_the_system_library(self):
        # `cmake --install` the library under a prefix, then let
        # ctypes.util.find_library find it as it finds any system library
        libdir = self.install_prefix()
        out = self.check_calls(self.run_installed(
            LD_LIBRARY_PATH=libdir, LIBRARY_PATH=libdir))
        self.assertIn("libidem.so", out["lib"])
        self.assertNotEqual(out["lib"], os.environ["IDEM_LIBRARY"])

    def test_installed_finds_the_library_through_pkg_config(self):
        if not shutil.which("pkg-config"):
            self.skipTest("no pkg-config")
        libdir = self.install_prefix()
        pc = os.path.join(libdir, "pkgconfig")
        self.assertTrue(os.path.exists(os.path.join(pc, "idem.pc")))
        out = self.check_calls(self.run_installed(PKG_CONFIG_PATH=pc))
        self.assertEqual(os.path.realpath(os.path.dirname(out["lib"])),
                         os.path.realpath(libdir), out["lib"])

    def test_no_library_anywhere_says_what_to_do(self):
        if ctypes.util.find_library("idem") or subprocess.run(
                ["pkg-config", "--exists", "idem"]).returncode == 0:
            self.skipTest("a libidem is installed on this system")
        empty = tempfile.mkdtemp(dir=self.tmp)
        r = self.run_installed("import idem", PKG_CONFIG_PATH=empty)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("idem.errors.LibraryNotFound: idem: cannot load "
                      "libidem; tried", r.stderr)
        for what in ("cmake --build build", "cmake --install build",
                     "PKG_CONFIG_PATH", "pkg-config --variable=libdir idem",
                     "IDEM_LIBRARY"):
            self.assertIn(what, r.stderr)
        self.assertTrue(issubclass(idem.LibraryNotFound, ImportError))

    def test_type_hints_check(self):
        r = subprocess.run([sys.executable, "-m", "mypy", "--version"],
                           capture_output=True, text=True)
        mypy = [sys.executable, "-m", "mypy"]
        if r.returncode != 0:
            if not shutil.which("mypy"):
                self.skipTest("mypy is not installed (apt-get install mypy)")
            mypy = ["mypy"]
        r = subprocess.run(mypy + [
            "--strict", "--cache-dir", os.path.join(self.tmp, "mypy"),
            "idem"], cwd=PKG, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

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
