"""Guarded calls from asyncio (GuardedTool.acall): the step API driven from
an event loop that is never blocked.

Every call of the C library that may wait (the log's writes: begin, finish,
resolve, poll, delivered; a status or tool function that is a plain
function) runs on a thread of a pool of this module's own, and a call hands
work to a thread as few times as it can:

* one hand-off from ``begin`` to the next point where the loop is needed:
  a replay, a refusal, a fenced call answer there (begin, delivered, the
  envelope, the step freed, all on the thread); a plain tool function runs
  there too, on a second thread that the first waits on with the
  deadline, so a sync tool costs one hand-off from the loop in all;
* an ``async def`` tool (or status function) runs as a task of the
  caller's loop, with the deadline as the wait's timeout; then one more
  hand-off records its outcome and carries the step to its answer.

The threads are this module's, not the loop's default executor: that one
has min(32, cpus + 4) threads, and a begin waits there for its synced
commit; with 32 calls at once, only 6 of them (2 cores) would reach the
log together, and the log groups the commits of the calls that are there.
A pool starts a thread when none is idle (a thread a call in flight at
most, as idem_guard_call does) and keeps at most 64 idle; the tool
functions have a pool of their own, so that tools that hang past their
deadline never hold up the log's calls. A thread hands its result back to
the loop with one call_soon_threadsafe.

The guard owns the deadline: past it the step is finished UNKNOWN and the
tool's task (or thread) goes on; its outcome is recorded when it comes
(Guard.late).  A caller cancelled while its call is under way does not
cancel it: the drive goes on (asyncio.shield) to its end and its outcome is
recorded, but ``delivered`` is not called for it, so the action counts as
not told to the model and a re-issue is fenced, never run again.
"""
import asyncio
import contextvars
import inspect
import json
import queue
import threading
from typing import Any, Awaitable, Callable, List, Optional, Set, Tuple

Verdict = Tuple[int, Optional[bytes], Optional[bytes]]
Job = Tuple[Callable[..., Any], Tuple[Any, ...]]
# Where a thread leaves the drive: (ANSWER, the envelope's text), or
# (RUN or CHECK, the arguments' JSON text, the key, the deadline in ms).
Step_ = Tuple[Any, ...]


class _Pool:
    """Threads that take jobs from one queue: a new thread when none is
    idle (up to ``most``; past it jobs wait their turn), at most
    ``idle_max`` kept waiting for work."""

    def __init__(self, name: str, most: Optional[int], idle_max: int = 64):
        self.name = name
        self.most = most
        self.idle_max = idle_max
        self.q: "queue.SimpleQueue[Job]" = queue.SimpleQueue()
        self.mu = threading.Lock()
        self.idle = 0
        self.threads = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self.mu:
            if self.idle:
                self.idle -= 1
                spawn = False
            else:
                spawn = self.most is None or self.threads < self.most
                if spawn:
                    self.threads += 1
        self.q.put((fn, args))
        if spawn:
            threading.Thread(target=self._work, name=self.name,
                             daemon=True).start()

    def _work(self) -> None:
        get = self.q.get
        while True:
            job = get()
            try:
                job[0](*job[1])
            except BaseException:  # a job reports its own failures
                pass
            # an idle thread holds nothing of its last job (a guard, a
            # policy, the caller's context)
            del job
            with self.mu:
                if self.idle >= self.idle_max:
                    self.threads -= 1
                    return
                self.idle += 1


_log_pool = _Pool("idem-log", None)
_tool_pool = _Pool("idem-tool", None)


def _settle_future(fut: "asyncio.Future[Any]", ok: bool, value: Any) -> None:
    if fut.cancelled():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


_UNKNOWN = 4  # IDEM_OUTCOME_UNKNOWN (guard.Outcome.UNKNOWN)

# What the drive asks of the loop (the first member of _Drive.advance's
# answer): the call's answer, or an async function to run on the loop.
ANSWER, RUN, CHECK = 0, 1, 2

# tasks and drives that outlive their caller: kept until they end
_detached: Set["asyncio.Future[Any]"] = set()


def _keep(t: "asyncio.Future[Any]") -> None:
    _detached.add(t)
    t.add_done_callback(_detached.discard)


class _Drive:
    """One guarded call from asyncio.  The thread-side methods (advance,
    finish, resolve) move the step; the loop-side coroutine ``run`` takes
    over where the tool is an async function.  ``gone``: the caller was
    cancelled, so its answer is not delivered."""

    __slots__ = ("tool", "session", "call_id", "args", "turn", "context",
                 "step", "gone", "mu", "busy", "abandoned")

    def __init__(self, tool: Any, session: str, call_id: str, args: Any,
                 turn: Optional[str], context: contextvars.Context):
        self.tool = tool
        self.session, self.call_id, self.args = session, call_id, args
        self.turn = turn
        self.context = context
        self.step: Any = None
        self.gone = False
        self.mu = threading.Lock()
        self.busy = self.abandoned = False

    def hop(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any],
            *args: Any) -> "asyncio.Future[Any]":
        """fn(*args) on a thread of the log pool; a future of this loop.
        The step is the thread's until fn returns; a drive abandoned
        meanwhile (its loop shut down) has its step freed then."""
        fut = loop.create_future()
        self.busy = True

        def job() -> None:
            try:
                value, ok = fn(*args), True
            except BaseException as e:
                value, ok = e, False
            with self.mu:
                self.busy = False
                abandoned = self.abandoned
            if abandoned:
                self.close()
                return
            try:
                loop.call_soon_threadsafe(_settle_future, fut, ok, value)
            except RuntimeError:  # the loop is closed: nobody waits any more
                self.close()
        _log_pool.submit(job)
        return fut

    # ---- on a thread of the log pool ---------------------------------------

    def begin(self) -> Step_:
        t = self.tool
        # a status function given in code is a status check, whatever the
        # policy names
        self.step = t.guard.begin(self.session, self.call_id, t.name,
                                  self.args, self.turn,
                                  own_check=t.status is not None)
        return self.advance()

    def advance(self) -> Step_:
        """Carry the step as far as a thread can: to its answer (delivered
        unless the caller is gone, the step freed), or to an async function
        the loop must run."""
        from .guard import Next, Outcome, _time_sleep
        step, t = self.step, self.tool
        while True:
            n = step.next
            if n == Next.ANSWER:
                if not self.gone:
                    step.delivered()
                text = step.envelope_text
                step.close()
                return ANSWER, text
            if n == Next.WAIT:
                _time_sleep(step.delay_ms / 1000)
                step.poll()
            elif n == Next.EXECUTE:
                if step.delay_ms:
                    _time_sleep(step.delay_ms / 1000)
                if inspect.iscoroutinefunction(t.fn):
                    return RUN, step.args, step.key, step.deadline_ms
                self.run_sync(t.fn, step.args, step.key, False,
                              step.deadline_ms)
            else:  # CHECK
                if t.status is None:
                    step.resolve(Outcome.UNKNOWN)
                elif inspect.iscoroutinefunction(t.status):
                    return (CHECK, step.check_target, step.check_key,
                            step.deadline_ms)
                else:
                    self.run_sync(t.status, step.check_target,
                                  step.check_key, True, step.deadline_ms)

    def run_sync(self, fn: Callable[..., Any], args: str, key: str,
                 is_check: bool, deadline_ms: int) -> None:
        """A plain tool (or status) function on a thread of the tool pool,
        waited for up to the deadline; its verdict goes to the step."""
        from .guard import _in_context, _settled, _verdict, _inflight_add
        done = threading.Event()
        box: List[Any] = []
        late: List[Callable[[Verdict], None]] = []
        mu = threading.Lock()
        a = json.loads(args)
        context = self.context
        nao = self.tool.not_applied_on

        def job() -> None:
            _inflight_add(1)
            try:
                v = _verdict(lambda: _settled(_in_context(fn, a, key,
                                                          context)),
                             is_check, nao)
            finally:
                _inflight_add(-1)
            with mu:
                box.append(v)
                todo = late[:]
            done.set()
            for f in todo:
                f(v)
        _tool_pool.submit(job)
        done.wait(deadline_ms / 1000)
        with mu:  # decided once: in time, or past the deadline
            v = box[0] if box else None
            if v is None and not is_check:
                # the run goes on; what it comes to is recorded when it
                # comes (a status check's late answer is dropped: "not
                # applied" then proves nothing, SPEC 6a)
                late.append(self.late_recorder())
        if v is not None:
            if is_check:
                self._resolve(v)
            else:
                self._finish(v, True)
        elif is_check:
            self._resolve((_UNKNOWN, None, None))  # the check itself: unknown
        else:
            from .guard import _outlived
            _outlived()
            self._timed_out()

    def late_recorder(self) -> Callable[[Verdict], None]:
        """What records a late tool run's verdict (Guard.late), from any
        thread; a status check's late answer is dropped."""
        guard, session, call_id = self.tool.guard, self.session, self.call_id
        token = self.step.token

        def record(v: Verdict) -> None:
            outcome, result, error = v
            try:
                guard.late(session, call_id, token, outcome, None,
                           error.decode("utf-8", "replace") if error
                           else None, result.decode() if result else None)
            except Exception:  # settled meanwhile, or the guard is closed
                pass
        return record

    def _finish(self, v: Verdict, ended: bool) -> None:
        outcome, result, error = v
        step = self.step
        if ended:
            # it returned or raised: nothing of it runs any more; without
            # a verdict (UNKNOWN) it may still land until settle_ms has
            # passed (SPEC 6a)
            step.attempt_ended()
        step.finish(outcome, None, error.decode("utf-8", "replace")
                    if error else None, result.decode() if result else None)

    def _timed_out(self) -> None:
        step = self.step
        step.finish(_UNKNOWN, None,
                    "no answer within %d ms" % step.deadline_ms)

    def _resolve(self, v: Verdict) -> None:
        outcome, result, _ = v
        self.step.resolve(outcome, None, result.decode() if result else None)

    # the same, then on to the next point where the loop is needed

    def finish(self, v: Verdict, ended: bool) -> Step_:
        self._finish(v, ended)
        return self.advance()

    def timed_out(self) -> Step_:
        self._timed_out()
        return self.advance()

    def resolve(self, v: Verdict) -> Step_:
        self._resolve(v)
        return self.advance()

    def close(self) -> None:
        if self.step is not None:
            self.step.close()

    def abandon(self) -> None:
        """The drive stops (its loop shuts down): free the step, now if no
        thread holds it, else when the thread is done with it."""
        with self.mu:
            self.abandoned = True
            free = not self.busy
        if free and self.step is not None:
            _log_pool.submit(self.close)

    # ---- on the loop -------------------------------------------------------

    async def run(self) -> str:
        """The call, to the envelope's text."""
        loop = asyncio.get_running_loop()
        hop = self.hop
        try:
            r = await hop(loop, self.begin)
            while r[0] != ANSWER:
                kind, args, key, deadline_ms = r
                is_check = kind == CHECK
                fn = self.tool.status if is_check else self.tool.fn
                task = _attempt(fn, json.loads(args), key, is_check,
                                self.tool.not_applied_on)
                if not task.done():
                    await asyncio.wait((task,), timeout=deadline_ms / 1000)
                if task.done():
                    v = task.result()
                    r = await (hop(loop, self.resolve, v) if is_check
                               else hop(loop, self.finish, v, True))
                elif is_check:
                    r = await hop(loop, self.resolve, (_UNKNOWN, None, None))
                else:
                    from .guard import _outlived
                    _outlived()
                    _record_late(task, self.late_recorder())
                    r = await hop(loop, self.timed_out)
            return str(r[1])
        except BaseException:
            # a failure of the log (raised here), or the loop shutting down
            # under the drive: the step is freed; the record stays as the
            # log has it
            self.abandon()
            raise


def _attempt(fn: Callable[..., Awaitable[Any]], a: Any, key: str,
             is_check: bool, not_applied_on: Tuple[type, ...] = ()
             ) -> "asyncio.Future[Verdict]":
    """An async tool (or status function) as a task of the running loop,
    in the drive's context (a copy of the caller's) with current_key()
    set.  The task's result is the verdict (outcome, result, error)."""
    from .guard import _current_key, _verdict

    async def run() -> Verdict:
        _current_key.set(key)
        try:
            value = await fn(a, key)
        except BaseException as e:  # judged as a sync tool's exception
            exc = e

            def value_of() -> Any:
                raise exc
            return _verdict(value_of, is_check, not_applied_on)
        return _verdict(lambda: value, is_check)
    t = asyncio.ensure_future(run())
    _keep(t)
    return t


def _record_late(task: "asyncio.Future[Verdict]",
                 record: Callable[[Verdict], None]) -> None:
    """When the tool's task ends after the deadline, record its outcome
    (on a thread: the log's write).  A task cancelled (its loop closed
    under it) records nothing: the action stays in doubt."""
    def done(t: "asyncio.Future[Verdict]") -> None:
        if not t.cancelled():
            _log_pool.submit(record, t.result())
    task.add_done_callback(done)


async def acall(tool: Any, session: str, call_id: str, args: Any,
                turn: Optional[str]) -> str:
    """GuardedTool.acall's body: the envelope's text."""
    drive = _Drive(tool, session, call_id, args, turn,
                   contextvars.copy_context())
    task = asyncio.ensure_future(drive.run())
    _keep(task)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            drive.gone = True  # the drive goes on, its answer untold
        raise
