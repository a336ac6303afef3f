#!/usr/bin/env python3
"""What the Python layer adds to a replayed call (docs/PERFORMANCE.md).

    python3 bindings/python/bench.py [--module PATH] [--calls N] [--rounds R]

Records CALLS refund calls once through the binding, then replays them
ROUNDS times each way, alternating, in this one process on this one log:

  c      the C API alone: idem_guard_call in a C loop (the idem_bench_replay
         module built with the library, build/bindings/python/)
  text   GuardedTool.call_json with the arguments as a JSON text (what an
         OpenAI-style harness holds) -> the envelope's JSON text
  dict   GuardedTool(...) -> the Envelope dict (json.loads of that text)
  input  dict arguments (an Anthropic-style `input`) -> the Envelope dict

The best round's mean per replay counts on each side; the ratios are to
`c`.  One JSON object per figure.  Not a test: nothing asserts a time.

    python3 bindings/python/bench.py --instructions

counts instead of timing (for a noisy machine): runs itself under
valgrind's callgrind once per form with no replay round and once with two,
and reports the instructions per replay of each form (the difference over
2 x CALLS replays) and their ratio to `c`.
"""
import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import idem  # noqa: E402
from idem import _lib  # noqa: E402

POLICY = '{"tools":{"refund_payment":{"class":"guarded","timeout_ms":5000}}}'


def refund(args, key):
    return {"refund_id": "re_1", "amount_cents": 6000}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", default=os.path.join(
        HERE, "..", "..", "build", "bindings", "python",
        "libidem_bench_replay.so"))
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", choices=("c", "text", "dict", "input"))
    ap.add_argument("--instructions", action="store_true")
    o = ap.parse_args()
    if o.instructions:
        return instructions(o)
    mod = ctypes.CDLL(o.module)
    mod.idem_bench_replay_c.restype = ctypes.c_double
    mod.idem_bench_replay_c.argtypes = (ctypes.c_void_p,
                                        ctypes.POINTER(_lib.Call), ctypes.c_int)
    d = tempfile.mkdtemp(prefix="idem-bench-")
    g = idem.Guard("sqlite:%s/bench.db" % d, idem.Policy(text=POLICY))
    try:
        tool = g.tool("refund_payment")(refund)
        n = o.calls
        ids = ["call_%d" % i for i in range(n)]
        texts = ['{"order_id":"ord_%d","amount_cents":6000}' % i
                 for i in range(n)]
        dicts = [json.loads(t) for t in texts]
        for i in range(n):  # record every call once
            assert tool("bench", ids[i], texts[i]).status == "succeeded"
        assert '"replayed":true' in tool.call_json("bench", ids[0], texts[0])
        keep = [(i.encode(), t.encode()) for i, t in zip(ids, texts)]
        calls = (_lib.Call * n)(*[
            _lib.Call(b"bench", i, b"refund_payment", t, len(t))
            for i, t in keep])
        cj = tool.call_json

        def c_round():
            us = mod.idem_bench_replay_c(g._g, calls, n)
            assert us > 0, "the C replays were not all replays"
            return us

        def py_round(fn, args):
            t0 = time.perf_counter()
            for i in range(n):
                fn("bench", ids[i], args[i])
            return (time.perf_counter() - t0) * 1e6 / n

        forms = {"c": c_round,
                 "text": lambda: py_round(cj, texts),
                 "dict": lambda: py_round(tool, texts),
                 "input": lambda: py_round(tool, dicts)}
        if o.only:
            forms = {o.only: forms[o.only]}
            for r in range(o.rounds):
                forms[o.only]()
            return
        best = {k: float("inf") for k in forms}
        for r in range(o.rounds + 1):  # round 0 warms up
            for k, fn in forms.items():
                us = fn()
                if r:
                    best[k] = min(best[k], us)
        for k in forms:
            print(json.dumps({
                "bench": "python_replay", "form": k, "calls": n,
                "rounds": o.rounds, "mean_us": round(best[k], 2),
                "ratio_to_c": round(best[k] / best["c"], 3),
                "overhead_us": round(best[k] - best["c"], 2)}))
    finally:
        g.close()
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        os.rmdir(d)


def instructions(o):
    def count(form, rounds):
        out = os.path.join(tempfile.mkdtemp(prefix="idem-cg-"), "cg.out")
        r = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out,
             sys.executable, os.path.abspath(__file__), "--module", o.module,
             "--calls", str(o.calls), "--rounds", str(rounds), "--only",
             form], capture_output=True, text=True, check=True)
        os.unlink(out)
        os.rmdir(os.path.dirname(out))
        return int(re.search(r"Collected : (\d+)", r.stderr).group(1))

    base = {}
    per = {}
    for form in ("c", "text", "dict", "input"):
        base[form] = count(form, 0)
        per[form] = (count(form, 2) - base[form]) / (2 * o.calls)
    for form in per:
        print(json.dumps({
            "bench": "python_replay_instructions", "form": form,
            "calls": o.calls, "instructions": round(per[form]),
            "ratio_to_c": round(per[form] / per["c"], 3)}))


if __name__ == "__main__":
    main()
