"""Guarded calls from asyncio (GuardedTool.acall): the step API driven from
an event loop that is never blocked, through the C library's completion
queue (idem_queue_*, include/idem.h).

The log's operations of a step - begin, finish, resolve, poll, undelivered,
a late result - are submitted to the queue without blocking and run on the
C library's own worker threads, where the log groups the commits of every
call that is there at once.  Each ends in a completion; the queue's pipe is
watched with ``loop.add_reader``, and one reader callback pops the
completions and settles the futures of the calls that wait for them.  No
thread of Python's is used per call in flight, and no GIL round trip per
step: the loop hands work to C and takes it back, nothing else.

A guard has one queue per event loop (made at its first call there, closed
with the guard or when its loop is found closed).  An ``async def`` tool
(or status function) runs as a task of the caller's loop, with the
deadline as the wait's timeout; a plain one runs on a thread of this
module's tool pool (a tool that blocks needs a thread; the call does not).

The guard owns the deadline: past it the step is finished UNKNOWN and the
tool's task (or thread) goes on; its outcome is recorded when it comes
(idem_queue_late, with the attempt's token).  Delivery: every operation
that may end at the answer is submitted with IDEM_QUEUE_DELIVER while the
caller waits, so the delivery is recorded in the outcome's own commit.  A
caller cancelled while its call is under way does not cancel it: the drive
goes on (asyncio.shield) to its end and its outcome is recorded, and what
was marked delivered meanwhile is undone (idem_queue_undelivered), so the
action counts as not told to the model and a re-issue is fenced, never run
again.
"""
import asyncio
import contextvars
import ctypes
import inspect
import itertools
import json
import queue
import re
import threading
import types
import weakref
from typing import Any, Awaitable, Callable, Dict, Optional, Set, Tuple

from . import _lib as L
from .core import _args_text, _decode, _name
from .errors import MisuseError, error_for

# idem.guard, which imports this module: bound at the first call (_bind)
G: Any = None


def _bind() -> Any:
    global G
    from . import guard
    G = guard
    return guard

Verdict = Tuple[int, Optional[bytes], Optional[bytes]]
Job = Tuple[Callable[..., Any], Tuple[Any, ...]]


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


# plain (sync) tool and status functions: they block, so each needs a thread
_tool_pool = _Pool("idem-tool", None)


def _settle_future(fut: "asyncio.Future[Any]", ok: bool, value: Any) -> None:
    if fut.cancelled():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


_UNKNOWN = 4  # IDEM_OUTCOME_UNKNOWN (guard.Outcome.UNKNOWN)
# enum idem_next
_ANSWER, _EXECUTE, _CHECK, _WAIT = 1, 2, 3, 4
# the submission flags (IDEM_QUEUE_*)
DELIVER, ENDED, INLINE = 1, 2, 4

# tasks and drives that outlive their caller: kept until they end
_detached: Set["asyncio.Future[Any]"] = set()


def _keep(t: "asyncio.Future[Any]") -> None:
    _detached.add(t)
    t.add_done_callback(_detached.discard)


# (rc, step, next, error text or None): what a completion says
Done = Tuple[int, Optional[int], int, Optional[str]]
_BATCH = 64


class _Queue:
    """One completion queue of one guard, read by one event loop."""

    __slots__ = ("h", "fd", "loop_ref", "waiting", "ids", "buf", "got",
                 "gotp", "guard", "closed", "inline")

    def __init__(self, guard: Any, loop: asyncio.AbstractEventLoop) -> None:
        h = ctypes.c_void_p()
        rc = L.queue_open(guard._h(), ctypes.byref(h))
        if rc:
            raise G._err(guard._g, rc)
        self.h = ctypes.c_void_p(h.value)
        self.guard = guard._g
        self.fd = L.queue_fd(self.h)
        self.loop_ref = weakref.ref(loop)
        self.waiting: Dict[int, "asyncio.Future[Done]"] = {}
        self.ids = itertools.count(1)
        self.buf = (L.Completion * _BATCH)()
        self.buf[0].size = ctypes.sizeof(L.Completion)
        self.got = ctypes.c_size_t()
        self.gotp = ctypes.byref(self.got)
        self.closed = False
        # a replay of a told outcome runs in its submission, on the loop:
        # a read of SQLite's WAL never waits; PostgreSQL's (a URL or libpq
        # keywords) is a round trip
        log = L.guard_log(guard._g) or b""
        pg = re.match(rb"postgres(ql)?:|\s*\w+\s*=", log)
        self.inline = 0 if pg else INLINE
        loop.add_reader(self.fd, self.ready)

    def submit(self, fn: Any, *args: Any) -> "asyncio.Future[Done]":
        """fn(q, *args, user) submitted; the future of its completion."""
        loop = self.loop_ref()
        if self.closed or loop is None:
            raise MisuseError("the guard is closed")
        t = next(self.ids)
        fut = loop.create_future()
        rc = fn(self.h, *args, t)
        if rc:
            raise error_for(rc, L.guard_errmsg(self.guard).decode(
                "utf-8", "replace") or L.strerror(rc).decode())
        self.waiting[t] = fut
        return fut

    def ready(self) -> None:
        """The pipe is readable: settle what has completed."""
        buf, waiting, n = self.buf, self.waiting, _BATCH
        while n == _BATCH and not self.closed:
            L.queue_pop(self.h, buf, _BATCH, self.gotp)
            n = self.got.value
            for i in range(n):
                c = buf[i]
                fut = waiting.pop(c.user, None)
                if fut is None or fut.cancelled():
                    # its drive is gone (the loop shut down under it)
                    if c.step:
                        L.step_free(c.step)
                    continue
                fut.set_result((c.rc, c.step, c.next, c.errmsg.decode(
                    "utf-8", "replace") if c.rc else None))

    def close(self) -> None:
        """Stop watching (when the loop still runs), wait for the
        operations in flight, free what was never popped; the calls still
        waiting for a completion fail (the guard was closed under them:
        their operations are recorded, their steps freed)."""
        loop = self.loop_ref()
        if loop is not None and not loop.is_closed():
            try:
                loop.remove_reader(self.fd)
            except Exception:  # a loop of another thread, shutting down
                pass
        self.closed = True
        L.queue_close(self.h)
        waiting, self.waiting = self.waiting, {}
        if not waiting or loop is None or loop.is_closed():
            return
        e = MisuseError("the guard was closed while the call was under way")
        for fut in waiting.values():
            try:
                loop.call_soon_threadsafe(_settle_future, fut, False, e)
            except RuntimeError:  # the loop closed meanwhile
                break


def _queue_for(guard: Any, loop: asyncio.AbstractEventLoop) -> _Queue:
    """The guard's queue for this loop, made at its first call here; the
    queues of loops that have closed are closed on the way."""
    qs: Dict[int, _Queue] = guard._queues
    q = qs.get(id(loop))
    if q is not None and q.loop_ref() is loop:
        return q
    for k, old in list(qs.items()):
        lp = old.loop_ref()
        if lp is None or lp.is_closed() or k == id(loop):
            del qs[k]
            old.close()
    q = qs[id(loop)] = _Queue(guard, loop)
    return q


def close_queues(guard: Any) -> None:
    """Guard.close: its queues first (they hold the C guard)."""
    qs = getattr(guard, "_queues", None)
    while qs:
        qs.popitem()[1].close()


class _Drive:
    """One guarded call from asyncio, on the loop.  ``step`` is the drive's
    between completions and None while the queue holds it.  ``gone``: the
    caller was cancelled, so its answer is not delivered."""

    __slots__ = ("tool", "session", "call_id", "args", "turn", "context",
                 "step", "gone", "q", "told")

    def __init__(self, tool: Any, session: str, call_id: str, args: Any,
                 turn: Optional[str], context: contextvars.Context):
        self.tool = tool
        self.session, self.call_id, self.args = session, call_id, args
        self.turn = turn
        self.context = context
        self.step: Optional[int] = None
        self.gone = False
        self.q: Optional[_Queue] = None
        self.told = False  # the last operation was asked to deliver

    def send(self, fn: Any, *args: Any, flags: Optional[int] = 0
             ) -> "asyncio.Future[Done]":
        """Submit one operation of the step (the step is the queue's until
        it lands).  One that may end at the answer (flags not None)
        delivers it, in the outcome's commit, while the caller waits."""
        assert self.q is not None
        if flags is not None:
            if not self.gone:
                flags |= DELIVER
            self.told = bool(flags & DELIVER)
            args += (flags,)
        s, self.step = self.step, None
        if s is None:  # begin makes the step
            fut = self.q.submit(fn, *args)
            if flags and flags & INLINE:
                self.q.ready()  # a replay is done already: no loop turn
            return fut
        return self.q.submit(fn, s, *args)

    def landed(self, done: Done) -> int:
        """An operation's completion: the step back, its next."""
        rc, self.step, nxt, err = done
        if rc:
            raise error_for(rc, err or L.strerror(rc).decode())
        return nxt

    async def op(self, fn: Any, *args: Any, flags: Optional[int] = 0
                 ) -> int:
        """One operation of the step through the queue; the step's next."""
        return self.landed(await self.send(fn, *args, flags=flags))

    def begin(self) -> "asyncio.Future[Done]":
        """Submit the begin (on the loop, at once); its future."""
        t = self.tool
        self.q = _queue_for(t.guard, asyncio.get_running_loop())
        a = _args_text(self.args)
        # a status function given in code is a status check, whatever the
        # policy names
        c = L.Call(_name(self.session, "session"),
                   _name(self.call_id, "call_id"), t._name, a, len(a),
                   G._turn(self.turn), 1 if t.status is not None else 0)
        return self.send(L.queue_begin, ctypes.byref(c), flags=self.q.inline)

    def answered(self) -> str:
        """The envelope's text, the step freed."""
        text = G._raw_text(self.step, G._step_envelope)
        L.step_free(self.step)
        self.step = None
        return text

    def finish(self, v: Verdict, flags: int) -> Awaitable[int]:
        outcome, result, error = v
        return self.op(L.queue_finish, outcome, result,
                       len(result) if result else 0, error, flags=flags)

    def resolve(self, v: Verdict) -> Awaitable[int]:
        outcome, result, _ = v
        return self.op(L.queue_resolve, outcome, result,
                       len(result) if result else 0)

    def late_recorder(self) -> Callable[[Verdict], None]:
        """What records a late tool run's verdict, by the attempt's token:
        through the queue from the loop, or (the loop gone) with the
        blocking call from the tool's own thread."""
        guard, q = self.tool.guard, self.q
        session = self.session.encode("utf-8", "surrogatepass")
        call_id = self.call_id.encode("utf-8", "surrogatepass")
        token = G._step_token(self.step)
        loop = q.loop_ref() if q is not None else None

        def record(v: Verdict) -> None:
            outcome, result, error = v
            try:
                if q is not None and _on_loop(loop):
                    q.submit(L.queue_late, session, call_id, token, outcome,
                             result, len(result) if result else 0, error, 1)
                else:
                    guard.late(self.session, self.call_id, token, outcome,
                               None, error.decode("utf-8", "replace")
                               if error else None,
                               result.decode() if result else None)
            except Exception:  # settled meanwhile, or the guard is closed
                pass
        return record

    async def attempt(self, is_check: bool) -> int:
        """Run the tool (or its status check) within the deadline, and
        report it; the step's next."""
        s, t = self.step, self.tool
        fn = t.status if is_check else t.fn
        if fn is None:  # CHECK without a status function: none is made
            return await self.resolve((0, None, None))
        a = json.loads(G._raw_text(s, G._step_check_target if is_check
                                   else G._step_args))
        key = _decode(G._step_check_key(s) if is_check else G._step_key(s))
        deadline_ms = G._step_deadline_ms(s)
        late: list = []
        if inspect.iscoroutinefunction(fn):
            task = _attempt(fn, a, key, is_check, t.not_applied_on)
        else:
            task = _thread_attempt(fn, a, key, is_check, t.not_applied_on,
                                   self.context, late)
        if type(task) is tuple:  # an async tool that never had to wait
            v = task
            return await (self.resolve(v) if is_check
                          else self.finish(v, ENDED))
        if not task.done():
            await asyncio.wait((task,), timeout=deadline_ms / 1000)
        if task.done():
            v = task.result()
            return await (self.resolve(v) if is_check
                          else self.finish(v, ENDED))
        if is_check:  # the check itself: unknown (its late word is dropped:
            # "not applied" then proves nothing, SPEC 6a)
            return await self.resolve((_UNKNOWN, None, None))
        G._outlived()
        record = self.late_recorder()
        late.append(record)
        _record_late(task, record)
        return await self.finish(
            (_UNKNOWN, None, b"no answer within %d ms" % deadline_ms), 0)

    async def run(self, begun: "asyncio.Future[Done]") -> str:
        """The call from its begin on, to the envelope's text."""
        try:
            nxt = self.landed(await begun)
            while nxt != _ANSWER:
                if nxt == _WAIT:
                    await asyncio.sleep(G._step_delay_ms(self.step) / 1000)
                    nxt = await self.op(L.queue_poll)
                elif nxt == _EXECUTE:
                    delay = G._step_delay_ms(self.step)
                    if delay:
                        await asyncio.sleep(delay / 1000)
                    nxt = await self.attempt(False)
                else:
                    nxt = await self.attempt(True)
            if self.gone and self.told:
                # the caller left while the answer was being recorded as
                # delivered: undo it, the model was not told
                await self.op(L.queue_undelivered, flags=None)
            return self.answered()
        finally:
            # answered, a failure of the log (raised), or the loop shutting
            # down under the drive: the step is freed (one the queue holds
            # is freed when its completion comes); the record stays as the
            # log has it
            if self.step:
                L.step_free(self.step)
                self.step = None


def _on_loop(loop: Optional[asyncio.AbstractEventLoop]) -> bool:
    try:
        return loop is not None and asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _attempt(fn: Callable[..., Awaitable[Any]], a: Any, key: str,
             is_check: bool, not_applied_on: Tuple[type, ...] = ()
             ) -> Any:
    """An async tool (or status function), in the drive's context (a copy
    of the caller's) with current_key() set, started at once on the
    drive's own step (as an eager task is): one that returns without
    having to wait is its verdict (outcome, result, error), with no task
    made; one that waits goes on as a task of the running loop, whose
    result is the verdict."""
    _current_key, _verdict = G._current_key, G._verdict

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
    coro = run()
    try:
        waits_on = coro.send(None)
    except StopIteration as done:
        return done.value
    t = asyncio.ensure_future(_go_on(coro, waits_on))
    _keep(t)
    return t


@types.coroutine
def _go_on(coro: Any, waits_on: Any) -> Any:
    """The rest of a coroutine started by hand, as a task's: what it waits
    on goes to the task, what the task sends or throws goes to it."""
    while True:
        try:
            try:
                sent = yield waits_on
            except BaseException as e:
                waits_on = coro.throw(e)
            else:
                waits_on = coro.send(sent)
        except StopIteration as done:
            return done.value


def _thread_attempt(fn: Callable[..., Any], a: Any, key: str, is_check: bool,
                    not_applied_on: Tuple[type, ...],
                    context: contextvars.Context,
                    late: list) -> "asyncio.Future[Verdict]":
    """A plain tool (or status function) on a thread of the tool pool; a
    future of the running loop with its verdict.  When the loop is gone by
    the time it ends, what ``late`` holds records its verdict there."""
    _in_context, _settled, _verdict = G._in_context, G._settled, G._verdict
    _inflight_add = G._inflight_add
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def job() -> None:
        _inflight_add(1)
        try:
            v = _verdict(lambda: _settled(_in_context(fn, a, key, context)),
                         is_check, not_applied_on)
        finally:
            _inflight_add(-1)
        try:
            loop.call_soon_threadsafe(_settle_future, fut, True, v)
        except RuntimeError:  # the loop is closed: record it from here
            for f in late:
                f(v)
    _tool_pool.submit(job)
    return fut


def _record_late(task: "asyncio.Future[Verdict]",
                 record: Callable[[Verdict], None]) -> None:
    """When the tool's task ends after the deadline, record its outcome.
    A task cancelled (its loop closed under it) records nothing: the action
    stays in doubt."""
    def done(t: "asyncio.Future[Verdict]") -> None:
        if not t.cancelled():
            record(t.result())
    task.add_done_callback(done)


async def acall(tool: Any, session: str, call_id: str, args: Any,
                turn: Optional[str]) -> str:
    """GuardedTool.acall's body: the envelope's text."""
    if G is None:
        _bind()
    drive = _Drive(tool, session, call_id, args, turn,
                   contextvars.copy_context())
    begun = drive.begin()
    if begun.done() and begun.result()[2] == _ANSWER:
        # answered in the submission (a replay): no task to drive it
        try:
            drive.landed(begun.result())
            return drive.answered()
        finally:
            if drive.step:
                L.step_free(drive.step)
                drive.step = None
    task = asyncio.ensure_future(drive.run(begun))
    _keep(task)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            drive.gone = True  # the drive goes on, its answer untold
        raise
