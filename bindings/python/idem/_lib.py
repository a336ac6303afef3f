"""Finding libidem and declaring its functions (ctypes).

The library is looked for, in order:

1. ``$IDEM_LIBRARY``: the path of the shared library to load;
2. next to this package: ``idem/libidem.so*`` (a wheel that bundles it);
3. the build tree when the package is used in place from a source checkout:
   ``bindings/python/idem`` -> ``<checkout>/build/libidem.so``;
4. an installed one: the ``libdir`` of ``pkg-config --variable=libdir idem``
   (the idem.pc that ``cmake --install`` puts under
   ``<prefix>/lib/pkgconfig``, found through ``$PKG_CONFIG_PATH`` for a
   prefix of one's own), then ``ctypes.util.find_library("idem")``
   (ldconfig, then the compiler's search path), then the soname
   ``libidem.so.0`` through the dynamic loader.

Every prototype is declared once here (argtypes and restype), so a call does
no type inference; pointers travel as c_void_p.
"""
import ctypes
import ctypes.util
import os
import shutil
import subprocess
from typing import Any, Iterator, List, Optional, Tuple

from .errors import LibraryNotFound

SONAME = "libidem.so.0"


def pkg_config_libdir() -> Optional[str]:
    """``pkg-config --variable=libdir idem``, or None (no pkg-config, no
    idem.pc on its path, or no answer within 5 s)."""
    exe = shutil.which("pkg-config")
    if not exe:
        return None
    try:
        r = subprocess.run([exe, "--variable=libdir", "idem"],
                           capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    d = r.stdout.strip()
    return d if r.returncode == 0 and d else None


def _candidates() -> Iterator[Tuple[str, str]]:
    env = os.environ.get("IDEM_LIBRARY")
    if env:
        yield env, "IDEM_LIBRARY"
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.startswith("libidem.so"):
            yield os.path.join(here, name), "the package"
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    if os.path.isfile(os.path.join(root, "include", "idem.h")):
        yield os.path.join(root, "build", "libidem.so"), "the build tree"
    libdir = pkg_config_libdir()
    if libdir:
        for name in (SONAME, "libidem.so"):
            yield os.path.join(libdir, name), "pkg-config's libdir"
    found = ctypes.util.find_library("idem")
    if found:
        yield found, "the system"
    yield SONAME, "the system"


def load() -> Tuple[ctypes.CDLL, str]:
    tried: List[str] = []
    for path, where in _candidates():
        if where != "the system" and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            if where == "IDEM_LIBRARY":
                break
    raise LibraryNotFound(
        "cannot load libidem; tried %s. Build it (cmake -S . -B build && "
        "cmake --build build) and install it (cmake --install build, then "
        "ldconfig; for a prefix of your own, put <prefix>/lib/pkgconfig on "
        "PKG_CONFIG_PATH so that `pkg-config --variable=libdir idem` names "
        "it), or set IDEM_LIBRARY to the path of libidem.so"
        % ", ".join(tried))


lib, path = load()

c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p
c_int = ctypes.c_int
c_size_t = ctypes.c_size_t
c_longlong = ctypes.c_longlong
P = ctypes.POINTER


class _Sized(ctypes.Structure):
    """A struct of idem.h that carries its size first (the ABI rule): made
    with the other fields positionally, size set to the struct's."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(ctypes.sizeof(self), *args, **kw)


class Call(_Sized):
    # own_check (0.4.0): the caller runs a status check of its own.  A
    # library of 0.3.0 reads the fields within its own size and ignores it.
    _fields_ = [("size", c_size_t), ("session", c_char_p),
                ("call_id", c_char_p), ("tool", c_char_p),
                ("args", c_char_p), ("args_len", c_size_t),
                ("turn", c_char_p), ("own_check", c_int)]


class KeySpec(_Sized):
    _fields_ = [("size", c_size_t), ("key_arg", c_char_p),
                ("key_max_len", c_size_t)]


class Key(ctypes.Structure):
    _fields_ = [("key", c_void_p), ("key_len", c_size_t),
                ("payload", c_void_p), ("payload_len", c_size_t),
                ("args", c_void_p), ("args_len", c_size_t),
                ("fingerprint", ctypes.c_char * 65)]


class Record(ctypes.Structure):
    _fields_ = [("session", c_char_p), ("call_id", c_char_p),
                ("tool", c_char_p), ("fingerprint", c_char_p),
                ("key", c_char_p), ("args", c_char_p),
                ("fence_key", c_char_p), ("cls", c_int), ("state", c_int),
                ("attempts", c_int), ("owner", c_char_p),
                ("lease_until", c_longlong), ("token", c_longlong),
                ("result", c_char_p), ("error", c_char_p),
                ("created", c_longlong), ("updated", c_longlong),
                ("expires", c_longlong), ("resolution", c_int),
                ("delivered", c_longlong), ("duplicate_of", c_char_p),
                # the attempt that may still be running (SPEC 6a)
                ("executor", c_char_p), ("pgid", c_longlong),
                ("settle_from", c_longlong),
                # the model turn of the call (SPEC 6.4)
                ("turn", c_char_p),
                # an operator's verdict: who and when (0.4.0, SPEC 9)
                ("resolved_by", c_char_p), ("resolved_at", c_longlong),
                # status checks of an action in doubt (0.5.0)
                ("check_with", c_char_p), ("last_check", c_char_p),
                ("checked_at", c_longlong), ("checks", c_longlong)]


# int run(void *ctx, const char *key, const char *args, size_t args_len,
#         char **result, char **error)
TOOL_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_char_p, c_void_p, c_size_t,
                           P(c_void_p), P(c_void_p))


class Tool(_Sized):
    _fields_ = [("size", c_size_t), ("run", TOOL_FN), ("check", TOOL_FN),
                ("ctx", c_void_p)]


class Settlement(_Sized):
    _fields_ = [("size", c_size_t), ("session", c_char_p),
                ("call_id", c_char_p),
                ("token", c_longlong), ("outcome", c_int),
                ("result", c_char_p), ("result_len", c_size_t),
                ("rc", c_int)]


class Completion(ctypes.Structure):
    """idem_completion: size (set in the first element: the stride),
    user, step, op, rc, next, answer, errmsg."""
    _fields_ = [("size", c_size_t), ("user", c_void_p), ("step", c_void_p),
                ("op", c_int), ("rc", c_int), ("next", c_int),
                ("answer", c_int), ("errmsg", c_char_p)]


LATENCY_BUCKETS = 16  # IDEM_LATENCY_BUCKETS


class Metrics(ctypes.Structure):
    """idem_metrics: this process's counters (idem_metrics_read)."""
    _fields_ = [("size", c_size_t), ("answers", ctypes.c_longlong * 9),
                ("replays", ctypes.c_longlong),
                ("fenced", ctypes.c_longlong),
                ("coalesced", ctypes.c_longlong),
                ("attempts", ctypes.c_longlong), ("late", ctypes.c_longlong),
                ("checks", ctypes.c_longlong * 5),
                ("resolved", ctypes.c_longlong),
                ("latency_le", ctypes.c_longlong * LATENCY_BUCKETS),
                ("latency_count", ctypes.c_longlong),
                ("latency_sum_us", ctypes.c_longlong)]


def _fn(name: str, restype: Any, *argtypes: Any) -> Any:
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = argtypes
    return f


PP = P(c_void_p)
SZ = P(c_size_t)

strerror = _fn("idem_strerror", c_char_p, c_int)
status_name = _fn("idem_status_name", c_char_p, c_int)
version = _fn("idem_version", c_char_p)
version_number = _fn("idem_version_number", ctypes.c_uint)
free = _fn("idem_free", None, c_void_p)
metrics_read = _fn("idem_metrics_read", c_int, P(Metrics))
latency_bound_us = _fn("idem_latency_bound_us", ctypes.c_longlong, c_int)

canon_open = _fn("idem_canon_open", c_int, PP)
canon_close = _fn("idem_canon_close", None, c_void_p)
canon_limit = _fn("idem_canon_limit", c_int, c_void_p, c_int, c_size_t)
canon_json = _fn("idem_canon_json", c_int, c_void_p, c_char_p, c_size_t, PP,
                 SZ)
canon_errmsg = _fn("idem_canon_errmsg", c_char_p, c_void_p)
canon_erroffset = _fn("idem_canon_erroffset", c_size_t, c_void_p)
key_mint = _fn("idem_key_mint", c_int, c_void_p, P(Call), P(KeySpec), P(Key))

policy_load = _fn("idem_policy_load", c_int, c_char_p, PP)
policy_parse = _fn("idem_policy_parse", c_int, c_char_p, c_size_t, c_char_p,
                   PP)
policy_free = _fn("idem_policy_free", None, c_void_p)
policy_errmsg = _fn("idem_policy_errmsg", c_char_p, c_void_p)
policy_class = _fn("idem_policy_class", c_int, c_void_p, c_char_p)
policy_explain = _fn("idem_policy_explain", c_int, c_void_p, c_char_p, PP)

state_name = _fn("idem_state_name", c_char_p, c_int)
resolution_name = _fn("idem_resolution_name", c_char_p, c_int)
answer_name = _fn("idem_answer_name", c_char_p, c_int)
record_free = _fn("idem_record_free", None, c_void_p)

guard_open = _fn("idem_guard_open", c_int, c_char_p, c_void_p, PP)
guard_close = _fn("idem_guard_close", None, c_void_p)
guard_errmsg = _fn("idem_guard_errmsg", c_char_p, c_void_p)
guard_begin = _fn("idem_guard_begin", c_int, c_void_p, P(Call), PP)
guard_call = _fn("idem_guard_call", c_int, c_void_p, P(Call), P(Tool), PP, SZ)
# HTTP tools, run by the library itself (hooks: NULL)
guard_run = _fn("idem_guard_run", c_int, c_void_p, P(Call), c_void_p, PP, SZ)
http_missing = _fn("idem_http_missing", c_char_p)
policy_http = _fn("idem_policy_http", c_int, c_void_p, c_char_p)
guard_recover = _fn("idem_guard_recover", c_int, c_void_p, c_char_p,
                    c_char_p, PP)
guard_settle = _fn("idem_guard_settle", c_int, c_void_p, c_char_p, c_char_p,
                   c_longlong, c_int, c_char_p, c_size_t)
guard_late = _fn("idem_guard_late", c_int, c_void_p, c_char_p, c_char_p,
                 c_longlong, c_int, c_char_p, c_size_t, c_char_p, c_int)
guard_record = _fn("idem_guard_record", c_int, c_void_p, c_char_p, c_char_p,
                   P(P(Record)))
guard_resolve = _fn("idem_guard_resolve", c_int, c_void_p, c_char_p,
                    c_char_p, c_int, c_char_p, c_size_t, c_char_p, c_char_p)

step_next = _fn("idem_step_next", c_int, c_void_p)
step_finish = _fn("idem_step_finish", c_int, c_void_p, c_int, c_char_p,
                  c_size_t, c_char_p)
step_resolve = _fn("idem_step_resolve", c_int, c_void_p, c_int, c_char_p,
                   c_size_t)
step_poll = _fn("idem_step_poll", c_int, c_void_p)
step_delivered = _fn("idem_step_delivered", c_int, c_void_p)
step_undelivered = _fn("idem_step_undelivered", c_int, c_void_p)
step_attempt_ended = _fn("idem_step_attempt_ended", c_int, c_void_p)
step_free = _fn("idem_step_free", None, c_void_p)
step_key = _fn("idem_step_key", c_char_p, c_void_p)
step_args = _fn("idem_step_args", c_void_p, c_void_p, SZ)
step_check_tool = _fn("idem_step_check_tool", c_char_p, c_void_p)
step_check_args = _fn("idem_step_check_args", c_void_p, c_void_p, SZ)
step_check_command = _fn("idem_step_check_command", c_char_p, c_void_p)
step_check_key = _fn("idem_step_check_key", c_char_p, c_void_p)
step_check_target = _fn("idem_step_check_target", c_void_p, c_void_p, SZ)
step_attempt = _fn("idem_step_attempt", c_int, c_void_p)
step_deadline_ms = _fn("idem_step_deadline_ms", c_longlong, c_void_p)
step_delay_ms = _fn("idem_step_delay_ms", c_longlong, c_void_p)
step_answer = _fn("idem_step_answer", c_int, c_void_p)
step_envelope = _fn("idem_step_envelope", c_void_p, c_void_p, SZ)
step_token = _fn("idem_step_token", c_longlong, c_void_p)

# The completion queue (asyncio's path).  Its submissions and pop never
# wait (a lock held for a moment, a thread started at most): they keep the
# GIL (PyDLL), which spares a release and a re-acquisition per step.
# Closing waits for the operations in flight: it releases the GIL (CDLL).
_pyq = ctypes.PyDLL(path)


def _qfn(name: str, restype: Any, *argtypes: Any) -> Any:
    f = _pyq[name]
    f.restype = restype
    f.argtypes = argtypes
    return f


guard_log = _fn("idem_guard_log", c_char_p, c_void_p)
queue_open = _fn("idem_queue_open", c_int, c_void_p, PP)
queue_close = _fn("idem_queue_close", None, c_void_p)
queue_fd = _qfn("idem_queue_fd", c_int, c_void_p)
queue_pending = _qfn("idem_queue_pending", c_size_t, c_void_p)
queue_pop = _qfn("idem_queue_pop", c_int, c_void_p, P(Completion), c_size_t,
                 SZ)
queue_begin = _qfn("idem_queue_begin", c_int, c_void_p, P(Call), c_int,
                   c_void_p)
queue_finish = _qfn("idem_queue_finish", c_int, c_void_p, c_void_p, c_int,
                    c_char_p, c_size_t, c_char_p, c_int, c_void_p)
queue_resolve = _qfn("idem_queue_resolve", c_int, c_void_p, c_void_p, c_int,
                     c_char_p, c_size_t, c_int, c_void_p)
queue_poll = _qfn("idem_queue_poll", c_int, c_void_p, c_void_p, c_int,
                  c_void_p)
queue_undelivered = _qfn("idem_queue_undelivered", c_int, c_void_p, c_void_p,
                         c_void_p)
queue_late = _qfn("idem_queue_late", c_int, c_void_p, c_char_p, c_char_p,
                  c_longlong, c_int, c_char_p, c_size_t, c_char_p, c_int,
                  c_void_p)

# What a tool hands over for the library to free (its result and error)
# comes from the library's own allocator (idem.h: one rule for memory).
malloc = _fn("idem_malloc", c_void_p, c_size_t)

# The replay's hot path: the same functions without argtypes, called only
# with ctypes objects (c_void_p, byref) so nothing needs converting or
# checking on the way.  lib["name"] makes a new function object, leaving
# the declared ones above as they are.
guard_call_fast = lib["idem_guard_call"]
guard_call_fast.restype = c_int
# idem_free takes no lock and calls back into nothing: it may keep the
# GIL (PyDLL), which spares a release and a re-acquisition per replay.
free_fast = ctypes.PyDLL(path)["idem_free"]
free_fast.restype = None

# Where CPython keeps the bytes of a bytes object, relative to id(): what
# ctypes itself hands to C for a c_char_p.  With it, an idem_call is filled
# by one struct.pack_into instead of six descriptor stores.  None on an
# interpreter where it cannot be established (the binding then stores the
# fields one by one).
def _bytes_offset() -> Optional[int]:
    try:
        offs = set()
        for b in (b"", b"x", b"idem" * 40):
            addr = ctypes.cast(c_char_p(b), c_void_p).value
            if addr is None:
                return None
            offs.add(addr - id(b))
        return offs.pop() if len(offs) == 1 else None
    except Exception:
        return None


BYTES_OFFSET = _bytes_offset()
