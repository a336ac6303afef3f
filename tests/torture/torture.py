#!/usr/bin/env python3
"""The torture suite of SPEC §11 for `idem exec`.

Each trial is one guarded refund through `idem exec`, killed at a random
moment (the front end alone, the executor `idem __run` alone, or every
process of the call) or at a named crash point (IDEM_CRASH_AT), or not at
all; then resumed with the same session, call id and arguments until it
answers something final; then re-issued once with a NEW call id (the model
calling again); then, once every process of the trial is gone and the remote
provider's queue holds nothing of it, the providers' ledgers are read.  A
trial fails when the refund was applied twice (a double) or when idem said
it was applied and it was not (a lost action).

The provider is local (a command that writes the ledger itself: ok, late,
fail) or remote (mode "remote": the command hands the refund to a provider
daemon outside the trial's processes, which applies it 0.1-0.6 s later,
and gives up after its own 30-300 ms with exit 75: ended, not finished).

    tests/torture/torture.py [-n TRIALS] [-j JOBS] [--seed S] [--log URL]
                             [--modes ok,late,fail,remote]
                             [--idem PATH] [--json FILE] [--keep]

Standard library only.  See tests/torture/README.md.
"""
import argparse
import collections
import concurrent.futures
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

MODES = ("ok", "late", "fail", "remote")
# the remote provider's queue: it applies a request this long after it got
# it; the command gives up after its own REMOTE_GIVEUP; the remote tool's
# settle_ms is above the longest delay (SPEC §6a: the policy tells the truth)
REMOTE_DELAY_MS = (100, 600)
REMOTE_GIVEUP_MS = (30, 300)
REMOTE_SETTLE_MS = 1500
CRASH_POINTS = ("after_pending_commit", "after_downstream_return",
                "before_outcome_commit", "after_outcome_commit")
# kill kinds, with their weights
KILLS = (("front", 2), ("runner", 2), ("all", 2), ("crash", 2), ("none", 1))
FINAL_STATUSES = ("succeeded", "already_applied", "failed")
APPLIED_STATUSES = ("succeeded", "already_applied")
UNKNOWN_STATUSES = ("outcome_unknown", "in_progress")
MARKER_VAR = "IDEM_TORTURE_TRIAL"
STOP = threading.Event()  # set on an interruption: no new process


class Interrupted(Exception):
    pass

# The provider: tests/tools/refund.sh's contract (append $IDEM_KEY to
# $LEDGER per application, answer JSON; fail -> exit 100) plus
#   late            sleep $LATE seconds FIRST, then apply and answer
#   REFUND_DEDUPE=1 apply a key at most once (checked under the ledger lock)
# Used when the repository's refund.sh lacks either.
# (Both write the ledger themselves: their effects end with their process
# group, which their policy says with settle_ms 0.)
PROVIDER_SH = r"""#!/bin/sh
# torture.py's copy of tests/tools/refund.sh, with `late` and REFUND_DEDUPE.
set -u
args=$(cat)
case "${REFUND_MODE:-ok}" in
  fail) echo "connection refused" >&2; exit 100 ;;
  reject) echo '{"error":"card_expired"}'; exit 101 ;;
  late) sleep "${LATE:-0.5}" ;;
esac
(
  flock 9
  if [ "${REFUND_DEDUPE:-0}" = 1 ] && grep -qxF "$IDEM_KEY" "$LEDGER" 2>/dev/null; then
    :
  else
    printf '%s\n' "$IDEM_KEY" >> "$LEDGER"
  fi
) 9>>"$LEDGER.lock"
n=$(wc -l < "$LEDGER" | tr -d ' ')
case "${REFUND_MODE:-ok}" in
  stall) sleep "${STALL:-2}" ;;
  crash) kill -9 $$ ;;
esac
printf '{"refund_id":"re_%s","args":%s}\n' "$n" "$args"
"""

# The remote command: the request goes to the provider daemon (its own
# session, outside every process of the trial), which applies it
# $REMOTE_DELAY_MS later whatever becomes of the caller; curl gives up
# after $REMOTE_GIVEUP seconds.  curl 6 and 7 sent nothing: exit 100 (not
# applied); an answer: 0; anything else (28, its own timeout): exit 75,
# which the policy does not map - unknown, an end without a verdict.
REMOTE_SH = r"""#!/bin/sh
# torture.py's remote refund: hand it to the provider's queue
curl -s -f --max-time "$REMOTE_GIVEUP" -X POST -H "Idempotency-Key: $IDEM_KEY" \
  --data-binary @- "$REMOTE_URL/refunds?delay_ms=$REMOTE_DELAY_MS"
case $? in
  0) exit 0 ;;
  6|7) exit 100 ;;
  *) exit 75 ;;
esac
"""

# Its status check asks the provider by the key: 200 applied, 404 not (yet).
REMOTE_STATUS_SH = r"""#!/bin/sh
curl -s -f --max-time 2 "$REMOTE_URL/refunds/$IDEM_KEY"
case $? in
  0) exit 0 ;;
  22) exit 100 ;;
  *) exit 1 ;;
esac
"""


def redact(url):
    """A log URL with its password hidden (it is printed and saved)."""
    if not url:
        return url
    url = re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)
    return re.sub(r"(password\s*=\s*)\S+", r"\1***", url)


# ---- keys (SPEC §3, the reference snippet) ----------------------------------

def mint_key(session, call, tool, args):
    payload = json.dumps({"tool": tool, "args": args}, sort_keys=True,
                         separators=(",", ":"))
    return "%s:%s:%s" % (session, call,
                         hashlib.sha256(payload.encode()).hexdigest()[:16])


# ---- processes of a trial ------------------------------------------------------

def marked_pids(marker):
    """Live processes whose environment holds MARKER_VAR=marker (zombies have
    an empty environ and do not count: they can no longer act)."""
    needle = b"\0" + marker + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read()
        except OSError:
            continue
        if env and (b"\0" + env + b"\0").find(needle) >= 0:
            found.append(int(name))
    return found


def kill_prefix(prefix):
    """SIGKILL every process whose environment has an entry starting with
    prefix (every trial of this run)."""
    needle = b"\0" + prefix
    for _ in range(20):
        hit = False
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open("/proc/%s/environ" % name, "rb") as f:
                    env = f.read()
            except OSError:
                continue
            if env and (b"\0" + env).find(needle) >= 0:
                hit = sigkill(int(name)) or hit
        if not hit:
            return
        time.sleep(0.01)


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def is_runner(pid):
    argv = cmdline(pid)
    return len(argv) > 1 and argv[1] == b"__run"


def sigkill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def kill_all(marker, rounds=20):
    """SIGKILL every process of the trial, again until none is left (a child
    forked between two scans is caught by the next)."""
    killed = set()
    for _ in range(rounds):
        pids = marked_pids(marker)
        if not pids:
            break
        for p in pids:
            if sigkill(p):
                killed.add(p)
        time.sleep(0.005)
    return sorted(killed)


# ---- one trial -------------------------------------------------------------------

class Ctx:
    """What every trial of a run shares."""

    def __init__(self, opts, tmp, provider, policies, log, tag, remote=None):
        self.opts = opts
        self.tmp = tmp
        self.provider = provider
        self.policies = policies
        self.log = log
        self.tag = tag
        self.remote = remote  # the RemoteProvider, when a trial needs it


def plan_trial(seed, i, modes=MODES):
    """The random choices of trial i, from the run's seed alone (so that
    `--seed S --only I` replays them)."""
    r = random.Random("%s/%d" % (seed, i))
    kinds = [k for k, w in KILLS for _ in range(w)]
    kill = r.choice(kinds)
    mode = r.choice(modes)
    p = {
        "trial": i,
        "mode": mode,
        # the remote provider never dedupes
        "dedupe": i % 2 == 1 and mode != "remote",
        # told: SPEC 6.4's fence; window: repeat_window_s as well; settle:
        # the told fence with settle_ms 300 (SPEC 6a)
        "fence": r.choice(("told", "window", "settle")),
        "kill": kill,
        "resume_pause": 0.0 if r.random() < 0.5 else round(r.uniform(0.0, 1.0), 3),
        "retry_sleeps": [round(r.uniform(0.1, 0.3), 3) for _ in range(16)],
    }
    p["late"] = round(r.uniform(0.3, 0.6), 3) if p["mode"] == "late" else None
    # remote: each call's queue delay and client deadline (ms), by call
    if mode == "remote":
        p["remote"] = [(r.randint(*REMOTE_DELAY_MS), r.randint(*REMOTE_GIVEUP_MS))
                       for _ in range(24)]
    else:
        p["remote"] = None
    # a kill while something of the trial still runs: an answer at once takes
    # some 50 ms, a late one its hang and a little more, a remote one its
    # client's deadline
    hang = p["late"] or (p["remote"][0][1] / 1000.0 if p["remote"] else 0.0)
    p["kill_at"] = round(r.uniform(0.0, hang + 0.08), 3)
    p["crash_at"] = r.choice(CRASH_POINTS) if kill == "crash" else None
    return p


def plan_record(p, ncalls):
    """The plan as the results keep it: the remote draws of the calls made."""
    out = {k: v for k, v in p.items() if k not in ("retry_sleeps", "remote")}
    out["remote"] = p["remote"][:max(1, ncalls)] if p.get("remote") else None
    return out


def kill_label(p):
    return "crash:" + p["crash_at"] if p["kill"] == "crash" else p["kill"]


def mode_label(p):
    return "%s/%s" % (p["mode"], "dedupe" if p["dedupe"] else "plain")


class Trial:
    def __init__(self, ctx, plan):
        self.ctx = ctx
        self.p = plan
        i = plan["trial"]
        self.dir = os.path.join(ctx.tmp, "t%05d" % i)
        os.mkdir(self.dir)
        self.session = "tt-%s-%d" % (ctx.tag, i)
        self.args = {"order_id": "o_%d" % i, "amount_cents": 500}
        self.args_json = json.dumps(self.args, separators=(",", ":"))
        self.ledger = os.path.join(self.dir, "ledger")
        open(self.ledger, "w").close()
        self.marker = ("%s:%d" % (ctx.tag, i))
        self.marker_b = ("%s=%s" % (MARKER_VAR, self.marker)).encode()
        self.remote = plan["mode"] == "remote"
        self.policy = ctx.policies[(self.remote, plan["dedupe"], plan["fence"])]
        self.env = dict(os.environ)
        for k in ("IDEM_CRASH_AT", "IDEM_LOG", "REFUND_MODE", "LATE",
                  "REFUND_DEDUPE", "STALL", "REMOTE_URL", "REMOTE_DELAY_MS",
                  "REMOTE_GIVEUP"):
            self.env.pop(k, None)
        self.env.update({
            "LEDGER": self.ledger,
            "REFUND_MODE": plan["mode"],
            "REFUND_DEDUPE": "1" if plan["dedupe"] else "0",
            MARKER_VAR: self.marker,
        })
        if plan["late"] is not None:
            self.env["LATE"] = "%.3f" % plan["late"]
        if self.remote:
            self.env["REMOTE_URL"] = ctx.remote.url
        self.t0 = None
        self.events = []
        self.ncalls = 0

    def now(self):
        return round(time.monotonic() - self.t0, 3)

    def note(self, what, **kw):
        e = {"t": self.now(), "what": what}
        e.update(kw)
        self.events.append(e)

    def argv(self, call):
        o = self.ctx.opts
        provider = self.ctx.remote.command if self.remote else self.ctx.provider
        return [o.idem, "exec", "--log", self.ctx.log, "--policy", self.policy,
                "--session", self.session, "--call", call, "--tool", "refund",
                "--args", self.args_json, "--", "sh", provider]

    def spawn(self, call, crash_at=None):
        if STOP.is_set():
            raise Interrupted()
        self.ncalls += 1
        n = self.ncalls
        env = self.env
        if crash_at:
            env = dict(env, IDEM_CRASH_AT=crash_at)
        if self.remote:
            delay, giveup = self.p["remote"][(n - 1) % len(self.p["remote"])]
            env = dict(env, REMOTE_DELAY_MS=str(delay),
                       REMOTE_GIVEUP="%.3f" % (giveup / 1000.0))
        out = open(os.path.join(self.dir, "call%d.out" % n), "wb")
        err = open(os.path.join(self.dir, "call%d.err" % n), "wb")
        # files, not pipes: a pipe would also wait for every process that
        # inherited it (the runner, the provider)
        proc = subprocess.Popen(self.argv(call), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, env=env)
        out.close()
        err.close()
        return proc, n

    def answer(self, proc, n, call, start, killed=False):
        """The answer of a finished call, as an event."""
        rc = proc.returncode
        with open(os.path.join(self.dir, "call%d.out" % n), "rb") as f:
            out = f.read().decode("utf-8", "replace")
        with open(os.path.join(self.dir, "call%d.err" % n), "rb") as f:
            err = f.read().decode("utf-8", "replace")
        env = None
        for line in reversed(out.strip().splitlines()):
            try:
                env = json.loads(line)
                break
            except ValueError:
                continue
        status = env.get("status") if isinstance(env, dict) else None
        ev = {"t": round(start - self.t0, 3), "what": "call", "n": n,
              "call": call, "exit": rc, "status": status,
              "ms": int((time.monotonic() - start) * 1000)}
        if isinstance(env, dict):
            if env.get("duplicate_of"):
                ev["duplicate_of"] = env["duplicate_of"]
            if env.get("replayed"):
                ev["replayed"] = True
        if killed:
            ev["killed"] = True
        if status is None or rc not in (0, 1, 75):
            ev["stdout"] = out.strip()[-400:]
            ev["stderr"] = err.strip()[-400:]
        self.events.append(ev)
        return ev

    def call(self, call, timeout=30.0):
        start = time.monotonic()
        proc, n = self.spawn(call)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            self.note("hung", n=n, call=call)
        return self.answer(proc, n, call, start)

    # -- the phases ---------------------------------------------------------

    def first_call(self):
        p = self.p
        start = time.monotonic()
        proc, n = self.spawn("c1", crash_at=p["crash_at"])
        killed = False
        self.kill_hit = False
        if p["kill"] in ("front", "runner", "all"):
            delay = start + p["kill_at"] - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            alive = proc.poll() is None
            if p["kill"] == "front":
                hit = alive and sigkill(proc.pid)
                self.note("kill", kind="front", hit=hit, front_alive=alive)
                killed = self.kill_hit = hit
            elif p["kill"] == "runner":
                runners = [q for q in marked_pids(self.marker_b) if is_runner(q)]
                hit = [q for q in runners if sigkill(q)]
                self.note("kill", kind="runner", hit=bool(hit), pids=hit,
                          front_alive=alive)
                self.kill_hit = bool(hit)
            else:
                pids = kill_all(self.marker_b)
                self.note("kill", kind="all", hit=bool(pids), pids=pids,
                          front_alive=alive)
                killed = alive
                self.kill_hit = bool(pids)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            self.note("hung", n=n, call="c1")
        if p["kill"] == "crash":
            # the crash point was reached when the front end died by SIGKILL
            killed = self.kill_hit = proc.returncode == -signal.SIGKILL
        return self.answer(proc, n, "c1", start, killed=killed)

    def resume(self, pause=True):
        """Call c1 again until a final answer, within the bounds: the last
        answer, and whether it is still not final."""
        o = self.ctx.opts
        if pause and self.p["resume_pause"]:
            time.sleep(self.p["resume_pause"])
        start = time.monotonic()
        tries = 0
        last = None
        while True:
            tries += 1
            last = self.call("c1")
            if last["exit"] in (0, 1) and last["status"] in FINAL_STATUSES:
                return last, False
            if tries >= o.tries or time.monotonic() - start >= o.resume_s:
                return last, True
            time.sleep(self.p["retry_sleeps"][(tries - 1) % 16])

    def settle(self, bound=30.0):
        """Wait until no process of the trial is left and the remote
        provider's queue holds nothing of it (late applications land); kill
        what is still there after the bound."""
        end = time.monotonic() + bound
        while time.monotonic() < end and not STOP.is_set():
            if not marked_pids(self.marker_b) and (
                    not self.remote
                    or self.ctx.remote.pending(self.session + ":") == 0):
                return []
            time.sleep(0.05)
        left = kill_all(self.marker_b)
        self.note("stragglers_killed", pids=left)
        return left

    def show(self, call):
        try:
            r = subprocess.run([self.ctx.opts.idem, "show", "--json", "--log",
                                self.ctx.log, self.session, call],
                               stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=30, env=self.env)
            txt = r.stdout.decode("utf-8", "replace").strip()
            return json.loads(txt) if r.returncode == 0 and txt else None
        except (ValueError, subprocess.TimeoutExpired):
            return None

    def ledger_lines(self):
        """Every application of this trial: its own ledger's lines (the
        local provider) and the remote provider's lines of its session."""
        with open(self.ledger) as f:
            lines = [l.strip() for l in f if l.strip()]
        if self.ctx.remote:
            lines += self.ctx.remote.lines(self.session + ":")
        return lines

    def run(self):
        self.t0 = time.monotonic()
        first = self.first_call()
        told, unresolved = self.resume()
        fresh = self.call("c2")
        stragglers = self.settle()
        final, probed, still = told, False, unresolved
        k2 = mint_key(self.session, "c2", "refund", self.args)
        if unresolved and k2 not in self.ledger_lines():
            # nothing of the trial runs any more: can the action still be
            # settled (or run)?  Not when c2 ran meanwhile: a resume of c1
            # after c2 was applied would test the harness, not idem.
            self.note("probe")
            final, still = self.resume(pause=False)
            probed = True
            stragglers += self.settle()
        return self.classify(first, told, unresolved, fresh, final, probed,
                             still, stragglers)

    # -- the verdict ------------------------------------------------------------

    def classify(self, first, last, unresolved, fresh, final, probed, still,
                 stragglers):
        """last/unresolved: c1's answer before c2 was issued; final/still:
        c1's last answer of all (after the probe, when there was one)."""
        p = self.p
        k1 = mint_key(self.session, "c1", "refund", self.args)
        k2 = mint_key(self.session, "c2", "refund", self.args)
        lines = self.ledger_lines()
        count = collections.Counter(lines)
        a1, a2 = count.get(k1, 0), count.get(k2, 0)
        others = sorted(set(lines) - {k1, k2})
        rec1, rec2 = self.show("c1"), self.show("c2")
        problems = []
        # double: one key applied twice, or two applications for the order
        # unless the second is a legitimate new decision (the model had been
        # told the first was applied, and the policy has no repeat window)
        told_applied = (not unresolved and last["status"] in APPLIED_STATUSES)
        legit_second = (p["fence"] != "window" and told_applied and a1 == 1
                        and a2 == 1 and not others)
        double = False
        for k, c in count.items():
            if c > 1:
                double = True
                problems.append("double: key %s applied %d times" % (k, c))
        if len(lines) > 1 and not legit_second and not any(
                c > 1 for c in count.values()):
            double = True
            problems.append("double: %d applications for order %s (%s)" % (
                len(lines), self.args["order_id"],
                "the first was never told applied" if not told_applied
                else "repeat window"))
        # lost: told applied without an application
        lost = False
        applied_by = {"c1": a1, "c2": a2}
        for ev in self.events:
            if ev.get("what") != "call" or ev.get("status") not in APPLIED_STATUSES:
                continue
            target = ev["call"]
            if ev["status"] == "already_applied":
                target = ev.get("duplicate_of") or target
            if applied_by.get(target, 0) == 0:
                lost = True
                problems.append("lost: call %d (%s) answered %s for %s, whose "
                                "key is not in the ledger" % (
                                    ev["n"], ev["call"], ev["status"], target))
        # stuck: nothing applied, nothing of the trial runs any more, and c1
        # still answers outcome_unknown / in_progress: it can never run again
        stuck = (probed and still and not lines
                 and final.get("status") in UNKNOWN_STATUSES)
        if stuck:
            lost = True
            problems.append("lost (stuck): nothing applied, no process left, "
                            "and c1 still answers %s" % final.get("status"))
        for call, rec, a in (("c1", rec1, a1), ("c2", rec2, a2)):
            if rec and rec.get("state") == "succeeded" and a == 0:
                lost = True
                problems.append("lost: the log holds %s succeeded, its key "
                                "is not in the ledger" % call)
        # a definite failure told for an action that was applied after all
        false_failed = ((not still and final["status"] == "failed" and a1 > 0)
                        or (fresh["status"] == "failed" and a2 > 0))
        errors = [e for e in self.events
                  if e.get("what") == "hung" or (
                      e.get("what") == "call" and not e.get("killed")
                      and e["n"] > 1 and (e["status"] is None
                                          or e["exit"] not in (0, 1, 75)))]
        if others:
            errors.append({"what": "unknown keys in the ledger", "keys": others})
        if stragglers:
            errors.append({"what": "processes left after 30 s", "pids": stragglers})
        return {
            "plan": plan_record(p, self.ncalls),
            "kill_label": kill_label(p), "mode_label": mode_label(p),
            "session": self.session, "keys": [k1, k2],
            "ledger": lines, "applications": len(lines),
            "double": double, "lost": lost,
            "unresolved": still and final.get("status") in UNKNOWN_STATUSES,
            "stuck": stuck, "probed": probed,
            "resolved_by_probe": probed and not still,
            "false_failed": false_failed, "errors": errors,
            "kill_hit": self.kill_hit,
            "first": first.get("status") or ("exit %s" % first["exit"]),
            "last": last.get("status") or ("exit %s" % last["exit"]),
            "final": final.get("status") or ("exit %s" % final["exit"]),
            "fresh": fresh.get("status") or ("exit %s" % fresh["exit"]),
            "resumes": sum(1 for e in self.events
                           if e.get("what") == "call" and e["call"] == "c1") - 1,
            "problems": problems, "events": self.events,
            "log": {"c1": rec1, "c2": rec2},
            "ok": not (double or lost),
        }


def run_trial(ctx, plan):
    t = Trial(ctx, plan)
    try:
        return t.run()
    except Exception as e:  # a harness bug: reported, never a pass
        kill_all(t.marker_b)
        if isinstance(e, Interrupted):
            return None
        return {"plan": plan_record(plan, t.ncalls),
                "kill_label": kill_label(plan), "mode_label": mode_label(plan),
                "session": t.session, "double": False, "lost": False,
                "unresolved": False, "false_failed": False, "ok": False,
                "stuck": False, "probed": False, "resolved_by_probe": False,
                "kill_hit": False,
                "errors": [{"what": "harness exception", "error": repr(e)}],
                "problems": ["harness exception: %r" % (e,)],
                "events": t.events, "ledger": [], "applications": 0,
                "first": None, "last": None, "final": None, "fresh": None, "resumes": 0,
                "keys": [], "log": {}}


# ---- the remote provider ---------------------------------------------------------

class RemoteProvider:
    """The provider of mode "remote": tests/tools/remote_provider.py, one
    daemon for the whole run, in a session of its own and without the
    trials' marker - no kill of a trial reaches it, and nothing a trial's
    executor can see says when it will apply what it was sent.  It never
    dedupes; its ledger is one file for every trial, a line per
    application (the key, whose session names the trial)."""

    def __init__(self, tmp):
        self.ledger = os.path.join(tmp, "remote-ledger")
        self.command = os.path.join(tmp, "remote.sh")
        self.status = os.path.join(tmp, "remote_status.sh")
        for path, text in ((self.command, REMOTE_SH),
                           (self.status, REMOTE_STATUS_SH)):
            with open(path, "w") as f:
                f.write(text)
        port_file = os.path.join(tmp, "remote-port")
        env = {k: v for k, v in os.environ.items() if k != MARKER_VAR}
        self.err = open(os.path.join(tmp, "remote-provider.err"), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(REPO, "tests", "tools",
                                          "remote_provider.py"),
             "--ledger", self.ledger, "--port-file", port_file],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=self.err, env=env, start_new_session=True)
        port = None
        for _ in range(200):
            try:
                with open(port_file) as f:
                    port = int(f.read().strip())
                break
            except (OSError, ValueError):
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        if port is None:
            self.stop()
            sys.exit("torture: the remote provider did not start")
        self.url = "http://127.0.0.1:%d" % port

    def pending(self, prefix):
        """Requests of keys starting with prefix queued, not yet applied."""
        q = urllib.parse.urlencode({"prefix": prefix})
        with urllib.request.urlopen("%s/pending?%s" % (self.url, q),
                                    timeout=10) as r:
            return json.loads(r.read())["pending"]

    def lines(self, prefix):
        with open(self.ledger) as f:
            return [l.strip() for l in f if l.startswith(prefix) and l.endswith("\n")]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()


# ---- setup -------------------------------------------------------------------------

def repo_provider_ok(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return False
    return "late)" in text and "REFUND_DEDUPE" in text


def write_policies(tmp, opts, remote):
    """The policies, by (remote, dedupe, fence).  Each tells the truth of
    its provider (SPEC §6a): the local one's effects end with its process
    group (settle_ms 0; the settle fence's 300 ms bound holds too, the
    runner kills the command then); the remote one's land up to
    REMOTE_DELAY_MS after the request, whatever became of the command
    (settle_ms REMOTE_SETTLE_MS, whatever the fence)."""
    status = "sh %s" % os.path.join(REPO, "tests", "tools", "refund_status.sh")
    if opts.status:
        status = opts.status
    out = {}
    kinds = [(False, False), (False, True)]
    if remote:
        kinds.append((True, False))
    for is_remote, dedupe in kinds:
        for fence in ("told", "window", "settle"):
            rule = {"class": "guarded", "timeout_ms": opts.timeout_ms,
                    "retries": 1, "backoff_ms": 20,
                    "status": {"command": "sh %s" % remote.status
                               if is_remote else status}}
            if dedupe:
                rule["provider_dedupes"] = True
            if fence == "window":
                rule["repeat_window_s"] = 3600
            if is_remote:
                rule["settle_ms"] = REMOTE_SETTLE_MS
            else:
                rule["settle_ms"] = 300 if fence == "settle" else 0
            pol = {"unknown_tools": "refuse", "tools": {"refund": rule}}
            path = os.path.join(tmp, "policy-%s-%s.json" % (
                "remote" if is_remote else "dedupe" if dedupe else "plain",
                fence))
            with open(path, "w") as f:
                json.dump(pol, f, indent=1)
            r = subprocess.run([opts.idem, "policy", "check", path],
                               capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit("torture: the policy is refused: %s%s" % (r.stdout, r.stderr))
            out[(is_remote, dedupe, fence)] = path
    return out


# ---- report --------------------------------------------------------------------------

COLS = ("trials", "killed", "double", "lost", "stuck", "unresolved",
        "probe_fixed", "false_failed", "errors")


def tally(rows):
    return {
        "trials": len(rows),
        "killed": sum(bool(r["kill_hit"]) for r in rows),
        "double": sum(bool(r["double"]) for r in rows),
        "lost": sum(bool(r["lost"]) for r in rows),
        "stuck": sum(bool(r["stuck"]) for r in rows),
        "unresolved": sum(bool(r["unresolved"]) for r in rows),
        "probe_fixed": sum(bool(r["resolved_by_probe"]) for r in rows),
        "false_failed": sum(bool(r["false_failed"]) for r in rows),
        "errors": sum(bool(r["errors"]) for r in rows),
    }


def groups(rows, key):
    out = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return {k: tally(v) for k, v in sorted(out.items())}


def table(title, rows, key):
    print("%-34s %s" % (title, " ".join("%12s" % c for c in COLS)))
    print("-" * (34 + 13 * len(COLS)))
    for k, t in groups(rows, key).items():
        print("%-34s %s" % (k, " ".join("%12d" % t[c] for c in COLS)))
    print()


def print_failure(r, seed, ctx):
    p = r["plan"]
    print("FAIL trial %d (seed %s): kill=%s mode=%s fence=%s kill_at=%s "
          "late=%s resume_pause=%s%s" % (
              p["trial"], seed, r["kill_label"], r["mode_label"], p["fence"],
              p["kill_at"], p["late"], p["resume_pause"],
              " remote(delay_ms,giveup_ms)=%s" % p["remote"] if p.get("remote")
              else ""))
    print("  replay: %s --seed %s --only %d --modes %s --idem %s%s" % (
        sys.argv[0], seed, p["trial"], ctx.opts.modes, ctx.opts.idem,
        " --log '%s'" % redact(ctx.opts.log) if ctx.opts.log else ""))
    for pr in r["problems"]:
        print("  " + pr)
    print("  keys: c1=%s c2=%s" % tuple(r["keys"] or ("?", "?")))
    print("  ledger: %s" % (r["ledger"] or "(empty)"))
    for e in sorted(r["events"], key=lambda e: e["t"]):
        print("  event: %s" % json.dumps(e, separators=(",", ":")))
    for c, rec in sorted((r.get("log") or {}).items()):
        if rec:
            keep = {k: rec.get(k) for k in ("state", "attempts", "resolution",
                                             "error", "token", "delivered",
                                             "duplicate_of", "owner")}
            print("  log %s: %s" % (c, json.dumps(keep, separators=(",", ":"))))
        else:
            print("  log %s: (no record)" % c)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=200, help="trials (default 200)")
    ap.add_argument("-j", type=int, default=2, help="trials in parallel (default 2)")
    ap.add_argument("--seed", help="the run's seed (default: random, printed)")
    ap.add_argument("--only", help="run only these trial numbers (comma "
                    "separated), to replay failures of a seed")
    ap.add_argument("--log", help="the attempt log URL (default: one sqlite "
                    "file in the temp dir); e.g. postgres://...")
    ap.add_argument("--idem", default=os.path.join(REPO, "build", "idem"),
                    help="the idem binary (default build/idem)")
    ap.add_argument("--provider", help="the provider script (default "
                    "tests/tools/refund.sh when it has `late` and "
                    "REFUND_DEDUPE, else a copy that does)")
    ap.add_argument("--status", help="the status command (default sh "
                    "tests/tools/refund_status.sh)")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="the providers to draw from, comma separated "
                    "(default %s)" % ",".join(MODES))
    ap.add_argument("--timeout-ms", type=int, default=150,
                    help="the tool's timeout_ms (default 150)")
    ap.add_argument("--tries", type=int, default=8,
                    help="resume calls at most (default 8)")
    ap.add_argument("--resume-s", type=float, default=6.0,
                    help="resume for at most this long (default 6)")
    ap.add_argument("--json", help="write the summary as JSON to FILE")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("-q", "--quiet", action="store_true",
                    help="no progress line")
    opts = ap.parse_args()
    opts.idem = os.path.abspath(opts.idem)
    modes = tuple(m for m in opts.modes.split(",") if m)
    if not modes or any(m not in MODES for m in modes):
        sys.exit("torture: --modes takes a list of %s" % ",".join(MODES))
    if not os.access(opts.idem, os.X_OK):
        sys.exit("torture: %s is not an executable (build idem or pass --idem)"
                 % opts.idem)
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    seed = opts.seed if opts.seed is not None else str(
        int.from_bytes(os.urandom(4), "big"))
    tag = os.urandom(4).hex()
    tmp = tempfile.mkdtemp(prefix="idem-torture-")
    started = time.monotonic()
    results = []
    ctx = None
    remote = None
    interrupted = False
    try:
        repo_provider = os.path.join(REPO, "tests", "tools", "refund.sh")
        if opts.provider:
            provider = os.path.abspath(opts.provider)
        elif repo_provider_ok(repo_provider):
            provider = repo_provider
        else:
            provider = os.path.join(tmp, "refund.sh")
            with open(provider, "w") as f:
                f.write(PROVIDER_SH)
        log = opts.log or "sqlite:" + os.path.join(tmp, "torture.db")
        which = (sorted(int(x) for x in opts.only.split(","))
                 if opts.only else range(opts.n))
        plans = [plan_trial(seed, i, modes) for i in which]
        if any(p["mode"] == "remote" for p in plans):
            remote = RemoteProvider(tmp)
        policies = write_policies(tmp, opts, remote)
        ctx = Ctx(opts, tmp, provider, policies, log, tag, remote)
        print("torture: seed %s, %d trials, -j %d, idem %s, log %s, modes %s, "
              "provider %s%s" % (
                  seed, len(plans), opts.j, opts.idem,
                  redact(opts.log) or "sqlite (temp)", ",".join(modes),
                  provider, ", remote provider %s" % remote.url if remote
                  else ""), flush=True)
        ex = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, opts.j))
        try:
            futs = [ex.submit(run_trial, ctx, p) for p in plans]
            for f in concurrent.futures.as_completed(futs):
                if f.result() is not None:
                    results.append(f.result())
                if not opts.quiet and sys.stderr.isatty():
                    sys.stderr.write("\r%d/%d trials, %d failed " % (
                        len(results), len(plans),
                        sum(not x["ok"] for x in results)))
                    sys.stderr.flush()
        finally:
            # on an interruption: no new trial, and the running ones end
            # soon once their processes are killed (below)
            STOP.set()
            ex.shutdown(wait=False, cancel_futures=True)
            kill_prefix(("%s=%s:" % (MARKER_VAR, tag)).encode())
            ex.shutdown(wait=True)
        if not opts.quiet and sys.stderr.isatty():
            sys.stderr.write("\n")
    except KeyboardInterrupt:
        interrupted = True
        print("torture: interrupted", file=sys.stderr)
    finally:
        # whatever an interruption left running
        kill_prefix(("%s=%s:" % (MARKER_VAR, tag)).encode())
        if remote:
            remote.stop()
        if opts.keep:
            print("torture: kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    results.sort(key=lambda r: r["plan"]["trial"])
    failed = [r for r in results if not r["ok"]]
    for r in failed:
        print_failure(r, seed, ctx)
    for r in results:
        if r["ok"] and r["errors"]:
            print("NOTE trial %d (seed %s, kill=%s mode=%s): %s" % (
                r["plan"]["trial"], seed, r["kill_label"], r["mode_label"],
                json.dumps(r["errors"], separators=(",", ":"))[:600]))
    print()
    table("by kill", results, lambda r: r["kill_label"])
    table("by provider", results, lambda r: r["mode_label"])
    table("by fence policy", results, lambda r: r["plan"]["fence"])
    total = tally(results)
    doubles, lost = total["double"], total["lost"]
    elapsed = time.monotonic() - started
    print("doubles %d, lost %d (stuck %d), unresolved %d (%d more settled by "
          "the probe), false failed %d, errors %d, %.0f s" % (
              doubles, lost, total["stuck"], total["unresolved"],
              total["probe_fixed"], total["false_failed"], total["errors"],
              elapsed))
    if opts.json:
        summary = {
            "seed": seed, "trials": len(results),
            "passed": len(results) - len(failed), "failed": len(failed),
            "totals": total,
            "idem": opts.idem, "log": redact(opts.log) or "sqlite (temp)",
            "provider": ctx.provider if ctx else None,
            "timeout_ms": opts.timeout_ms, "jobs": opts.j,
            "modes": list(modes),
            "seconds": round(elapsed, 1),
            "by_kill": groups(results, lambda r: r["kill_label"]),
            "by_provider": groups(results, lambda r: r["mode_label"]),
            "by_kill_provider": groups(
                results, lambda r: r["kill_label"] + " " + r["mode_label"]),
            "by_fence": groups(results, lambda r: r["plan"]["fence"]),
            "results": results,
        }
        with open(opts.json, "w") as f:
            json.dump(summary, f, indent=1)
    if total["errors"] and not failed:
        print("torture: %d trials with errors (see the NOTE lines)" % total["errors"])
    print("torture: %d passed, %d failed" % (len(results) - len(failed),
                                            len(failed)))
    if interrupted:
        return 130
    if doubles or lost or failed:
        return 1
    return 2 if total["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
