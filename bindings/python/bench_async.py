#!/usr/bin/env python3
"""Guarded calls from asyncio against the C API's 32 sessions, in one run
(docs/PERFORMANCE.md, "The Python binding from asyncio").

    python3 bindings/python/bench_async.py [--idem build/idem] [--rounds 3]
        [--per-task 40] [--replays 300] [--dir DIR]

Each round runs ``idem bench --only guard --dir DIR`` (the C figures:
guard_32, 32 sessions on threads calling idem_guard_call; replay, a
recorded call answered again in process), then, in this process, on a
SQLite log in the same DIR (the same disk):

  async_32   32 asyncio tasks in one event loop, each making --per-task
             guarded calls (distinct refunds, the same arguments as the C
             bench's) through GuardedTool.acall of an ``async def`` tool
             that applies at once: calls/s;
  sync_32    the same with a plain (sync) tool, run on a thread;
  replay     a recorded call again, one at a time: acall (from the loop)
             and call_json (the synchronous API) - the median in µs;
  steps_32   32 threads making the same calls through the blocking step
             API (begin, finish, delivered: the delivery its own commit,
             where idem_guard_call commits it with the outcome), from the
             idem_bench_replay module built next to the library - what
             the step API itself allows, beside guard_32;
  queue_32   the C side of the asyncio path, with no Python in it: the
             same calls from one thread through the completion queue
             (poll(2) on its pipe; the delivery in the outcome's commit),
             as acall drives them - the ceiling of async_32.

One JSON object per figure, and a summary with each side's best round and
the ratios (target for async_32: at least 0.8 x guard_32's calls/s).  Not
a test: nothing asserts a time.
"""
import argparse
import asyncio
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import idem  # noqa: E402

SESSIONS = 32


def refund_args(call_id: str) -> str:
    """cli/bench_guard.c's refund_args: a refund of its own order."""
    return ('{"order_id":"ord_%s","amount_cents":6000,"currency":"usd",'
            '"reason":"late delivery"}' % call_id)


def c_figures(exe: str, d: str) -> Dict[str, Dict[str, Any]]:
    r = subprocess.run([exe, "bench", "--only", "guard", "--dir", d],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit("bench_async: %s bench failed: %s" % (exe, r.stderr))
    out = {}
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            o = json.loads(line)
            out[o["bench"]] = o
    for need in ("guard_32", "replay"):
        if need not in out:
            sys.exit("bench_async: no %s in the output of %s bench"
                     % (need, exe))
    return out


def fresh(path: str) -> None:
    for ext in ("", "-wal", "-shm", "-journal"):
        if os.path.exists(path + ext):
            os.unlink(path + ext)


def async_32(d: str, tag: str, per: int, sync: bool) -> float:
    """calls/s of SESSIONS asyncio tasks, per calls each."""
    path = os.path.join(d, "python_async_%s.db" % tag)
    fresh(path)
    g = idem.Guard("sqlite:" + path, None)
    try:
        if sync:
            @g.tool("refund_payment")
            def refund(args: Any, key: str) -> Any:
                return {"refund_id": "re_1"}
        else:
            @g.tool("refund_payment")
            async def refund(args: Any, key: str) -> Any:
                return {"refund_id": "re_1"}

        async def session(s: str, n: int) -> None:
            for i in range(n):
                c = "call_%d" % i
                env = await refund.acall(s, c, refund_args(s + "_" + c))
                if env["status"] != "succeeded":
                    raise SystemExit("bench_async: %s %s: %s" % (s, c, env))

        async def run() -> float:
            # warm the threads and the log, then time
            await asyncio.gather(*[session("warm_%d" % i, 2)
                                   for i in range(SESSIONS)])
            t0 = time.perf_counter()
            await asyncio.gather(*[session("bench_s%d" % i, per)
                                   for i in range(SESSIONS)])
            return SESSIONS * per / (time.perf_counter() - t0)
        return asyncio.run(run())
    finally:
        g.close()
        fresh(path)


def c_32(fn: Any, what: str, d: str, tag: str, per: int) -> float:
    """calls/s of one of bench_replay.c's 32-session figures: fn is
    idem_bench_steps_32 (32 threads, the step API) or idem_bench_queue_32
    (one thread, the completion queue)."""
    path = os.path.join(d, "c_%s_%s.db" % (what, tag))
    fresh(path)
    g = idem.Guard("sqlite:" + path, None)
    try:
        v = float(fn(g._g, tag.encode(), per))
        if v < 0:
            raise SystemExit("bench_async: a C %s call failed" % what)
        return v
    finally:
        g.close()
        fresh(path)


def replays(d: str, n: int) -> Dict[str, float]:
    """Median µs of a replay through acall and through call_json."""
    path = os.path.join(d, "python_replay.db")
    fresh(path)
    g = idem.Guard("sqlite:" + path, None)
    try:
        @g.tool("refund_payment")
        def refund(args: Any, key: str) -> Any:
            return {"refund_id": "re_1"}
        calls = [("call_%d" % i, refund_args("r%d" % i)) for i in range(n)]
        for c, a in calls:
            refund.call_json("single", c, a)
        lat: List[float] = []
        for c, a in calls:
            t0 = time.perf_counter()
            refund.call_json("single", c, a)
            lat.append((time.perf_counter() - t0) * 1e6)
        sync_us = statistics.median(lat)

        async def run() -> float:
            lat2: List[float] = []
            for c, a in calls:
                t0 = time.perf_counter()
                await refund.acall("single", c, a)
                lat2.append((time.perf_counter() - t0) * 1e6)
            return statistics.median(lat2)
        return {"call_json_us": sync_us, "acall_us": asyncio.run(run())}
    finally:
        g.close()
        fresh(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idem", default=os.path.join(HERE, "..", "..",
                                                   "build", "idem"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-task", type=int, default=40)
    ap.add_argument("--replays", type=int, default=300)
    ap.add_argument("--dir")
    ap.add_argument("--module", default=os.path.join(
        HERE, "..", "..", "build", "bindings", "python",
        "libidem_bench_replay.so"))
    o = ap.parse_args()
    mod = ctypes.CDLL(o.module)
    for f in (mod.idem_bench_steps_32, mod.idem_bench_queue_32):
        f.restype = ctypes.c_double
        f.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int)
    d = o.dir or tempfile.mkdtemp(prefix="idem-bench-async-",
                                  dir=os.environ.get("TMPDIR") or "/tmp")
    os.makedirs(d, exist_ok=True)
    best: Dict[str, float] = {}
    low: Dict[str, float] = {}
    try:
        for r in range(o.rounds):
            c = c_figures(o.idem, d)
            g32 = float(c["guard_32"]["calls_per_s"])
            a = async_32(d, "a%d" % r, o.per_task, sync=False)
            s = async_32(d, "s%d" % r, o.per_task, sync=True)
            st = c_32(mod.idem_bench_steps_32, "steps", d, "c%d" % r,
                      o.per_task)
            qu = c_32(mod.idem_bench_queue_32, "queue", d, "q%d" % r,
                      o.per_task)
            rp = replays(d, o.replays)
            row = {"bench": "python_async_round", "round": r + 1,
                   "dir": d, "guard_32_calls_per_s": round(g32),
                   "async_32_calls_per_s": round(a),
                   "sync_32_calls_per_s": round(s),
                   "steps_32_calls_per_s": round(st),
                   "queue_32_calls_per_s": round(qu),
                   "async_ratio": round(a / g32, 3),
                   "sync_ratio": round(s / g32, 3),
                   "steps_ratio": round(st / g32, 3),
                   "queue_ratio": round(qu / g32, 3),
                   "c_replay_median_us": c["replay"]["median_us"],
                   "call_json_replay_median_us": round(rp["call_json_us"], 1),
                   "acall_replay_median_us": round(rp["acall_us"], 1),
                   "fdatasync_us": c.get("fdatasync", {}).get("median_us")}
            print(json.dumps(row), flush=True)
            for k, v in (("guard_32", g32), ("async_32", a), ("sync_32", s),
                         ("steps_32", st), ("queue_32", qu)):
                best[k] = max(best.get(k, 0.0), v)
            for k, v in (("c_replay", c["replay"]["median_us"]),
                         ("call_json_replay", rp["call_json_us"]),
                         ("acall_replay", rp["acall_us"])):
                low[k] = min(low.get(k, float("inf")), v)
        print(json.dumps({
            "bench": "python_async_32", "sessions": SESSIONS,
            "calls": SESSIONS * o.per_task, "rounds": o.rounds,
            "guard_32_calls_per_s": round(best["guard_32"]),
            "async_32_calls_per_s": round(best["async_32"]),
            "sync_32_calls_per_s": round(best["sync_32"]),
            "steps_32_calls_per_s": round(best["steps_32"]),
            "queue_32_calls_per_s": round(best["queue_32"]),
            "async_ratio": round(best["async_32"] / best["guard_32"], 3),
            "sync_ratio": round(best["sync_32"] / best["guard_32"], 3),
            "steps_ratio": round(best["steps_32"] / best["guard_32"], 3),
            "queue_ratio": round(best["queue_32"] / best["guard_32"], 3),
            "async_to_queue": round(best["async_32"] / best["queue_32"], 3),
            "target": ">=0.8"}))
        print(json.dumps({
            "bench": "python_replay_latency",
            "c_median_us": low["c_replay"],
            "call_json_median_us": round(low["call_json_replay"], 1),
            "acall_median_us": round(low["acall_replay"], 1)}))
    finally:
        if not o.dir:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
