// The one place where the binding calls libidem's step API (idem.h): the
// operations that may wait on the attempt log (begin, finish, resolve,
// poll, delivered, undelivered) are submitted to the guard's completion
// queue, which runs them on the library's own worker threads; the event
// loop watches the queue's pipe (a socket on a dup of its read end) and
// pops the completions when it is readable, each with its return code and
// its own error text.  What only reads a step the binding holds (next,
// key, args, envelope) or frees it is called directly.
//
// idem_guard_call is never used: it would run a JS tool from a foreign
// thread, which koffi relays to the loop and blocks until the function
// returns, not until its Promise settles (a deadlock until the deadline).
//
// The rest of the binding sees only this module's functions.
import net from 'node:net';
import { lib } from './lib.js';
import koffi from 'koffi';
import { errorFor, MisuseError } from './errors.js';

export const NEXT = { ANSWER: 1, EXECUTE: 2, CHECK: 3, WAIT: 4 };
export const OUTCOME = { APPLIED: 1, REJECTED: 2, NOT_APPLIED: 3, UNKNOWN: 4 };
/** Flags of a submission: record the delivery at ANSWER (only while the
 * caller still waits); the attempt ended before this finish. */
export const DELIVER = 1;
export const ENDED = 2;
/** begin: a replay of a told outcome is answered on the loop's thread
 * (the log read once, no worker); not for PostgreSQL, whose read is a
 * network round trip. */
const INLINE = 4;

const POP = 32; // completions taken per idem_queue_pop

/** A guard and its queue: G of the functions below. */
class Queued {
  constructor(L, g, inline) {
    this.L = L;
    this.g = g;
    this.inline = inline;
    this.q = null;
    this.waiting = new Map(); // operation number -> its promise's resolve
    this.seq = 0;
    this.closing = false;
    this.idle = null; // close() waits here for the last completion
    this.buf = Buffer.alloc(L.completionSize * POP);
    const out = [null];
    const rc = L.queue_open(g, out);
    if (rc) throw errorFor(rc, L.guard_errmsg(g) || L.strerror(rc));
    this.q = out[0];
    // the socket reads the pipe's byte: each read is one "completions
    // wait" edge, and pop() drains them all; it owns a dup of the fd, so
    // destroying it never closes the queue's own
    this.sock = new net.Socket({ fd: L.dup(L.queue_fd(this.q)),
      readable: true, writable: false });
    this.sock.on('data', () => this.drain());
    this.sock.on('error', () => {});
    this.sock.unref(); // nothing waits yet: the process may exit
  }

  drain() {
    const { L, buf, waiting } = this;
    const got = [0];
    for (;;) {
      buf.writeBigUInt64LE(BigInt(L.completionSize), 0);
      L.queue_pop(this.q, buf, POP, got);
      if (!got[0]) break;
      for (let i = 0; i < got[0]; i++) {
        const c = koffiDecode(L, buf, i);
        const done = waiting.get(Number(c.user));
        waiting.delete(Number(c.user));
        done?.(c);
      }
    }
    if (!waiting.size) {
      this.sock.unref();
      this.idle?.();
    }
  }

  /** Submit fn(q, ...args, n): the completion, when it comes.  here: it
   * may be ready at once (INLINE), so look before the loop turns. */
  submit(fn, args, here = false) {
    if (this.closing)
      return Promise.reject(new MisuseError('the guard is closed'));
    const n = ++this.seq;
    const rc = fn(this.q, ...args, n);
    if (rc) {
      return Promise.reject(errorFor(rc, this.L.guard_errmsg(this.g) ||
        this.L.strerror(rc)));
    }
    if (!this.waiting.size) this.sock.ref(); // a completion is due
    const done = new Promise((resolve) => this.waiting.set(n, resolve));
    if (here) this.drain();
    return done;
  }

  /** Refuse new operations, let those in flight complete (each a few
   * writes of the log: they always do), then close the queue and the
   * guard.  A step is the binding's again once its completion is popped,
   * so none is left to the queue. */
  async close() {
    this.closing = true;
    while (this.waiting.size)
      await new Promise((resolve) => { this.idle = resolve; });
    this.sock.destroy();
    this.L.queue_close(this.q);
    this.q = null;
    this.L.guard_close(this.g);
  }
}

function koffiDecode(L, buf, i) {
  return koffi.decode(buf, i * L.completionSize, L.Completion);
}

/** The completion's step and next, or its failure thrown. */
function settled(L, c, what) {
  if (c.rc) throw errorFor(c.rc, c.errmsg || `${what}: ${L.strerror(c.rc)}`);
  return c.next;
}

/** Open a guard and its queue (synchronous: once per guard).  policy: a
 * handle or null. */
export function open(url, policy) {
  const L = lib();
  const out = [null];
  const rc = L.guard_open(url, policy, out);
  if (rc) {
    const msg = out[0] ? L.guard_errmsg(out[0]) : L.strerror(rc);
    if (out[0]) L.guard_close(out[0]);
    throw errorFor(rc, msg || L.strerror(rc));
  }
  try {
    const pg = /^postgres(ql)?:/.test(url) || /^\s*\w+\s*=/.test(url);
    return new Queued(L, out[0], pg ? 0 : INLINE);
  } catch (e) {
    L.guard_close(out[0]);
    throw e;
  }
}

/** Close the queue (after the operations in flight) and the guard. */
export const close = (G) => G.close();

/** An operator's verdict (idem_guard_resolve).  Synchronous, unlike the
 * step's calls: its failure's text is idem_guard_errmsg of this thread,
 * and it is an operator's rare act, not a model's call. */
export function resolveAction(G, session, callId, outcome, result, reason,
  by) {
  const L = lib();
  const g = G.g;
  const rc = L.guard_resolve(g, session, callId, outcome, result,
    result == null ? 0 : Buffer.byteLength(result, 'utf8'), reason, by);
  if (rc) throw errorFor(rc, L.guard_errmsg(g) || L.strerror(rc));
}

export function owner(G) {
  return lib().guard_owner(G.g);
}

function policyOut(L, rc, out) {
  if (!rc) return out[0];
  const msg = out[0] ? L.policy_errmsg(out[0]) : L.strerror(rc);
  L.policy_free(out[0]);
  throw errorFor(rc, msg);
}

/** A policy handle from JSON text; origin names it in messages. */
export function policyParse(text, origin) {
  const L = lib();
  const out = [null];
  return policyOut(L, L.policy_parse(text, Buffer.byteLength(text, 'utf8'),
    origin, out), out);
}

/** A policy handle from a file. */
export function policyLoad(file) {
  const L = lib();
  const out = [null];
  return policyOut(L, L.policy_load(file, out), out);
}

export const policyFree = (p) => lib().policy_free(p);

/** Decide a call: {step (free it with free()), next}, or an IdemError. */
export async function begin(G, ids, tool, args, ownCheck, flags) {
  const L = lib();
  const call = {
    size: L.callSize, session: ids.session, call_id: ids.callId, tool,
    args, args_len: Buffer.byteLength(args, 'utf8'),
    turn: ids.turn ?? null, own_check: ownCheck ? 1 : 0,
  };
  const c = await G.submit(L.queue_begin, [call, flags | G.inline],
    G.inline !== 0);
  if (c.rc && c.step) L.step_free(c.step);
  return { step: c.step, next: settled(L, c, 'begin') };
}

const len = (text) => (text == null ? 0 : Buffer.byteLength(text, 'utf8'));

/** Each resolves to the step's next after the operation. */
export const finish = async (G, s, outcome, result, error, flags) =>
  settled(lib(), await G.submit(lib().queue_finish,
    [s, outcome, result, len(result), error, flags]), 'finish');
export const resolve = async (G, s, outcome, result, flags) =>
  settled(lib(), await G.submit(lib().queue_resolve,
    [s, outcome, result, len(result), flags]), 'resolve');
export const poll = async (G, s, flags) =>
  settled(lib(), await G.submit(lib().queue_poll, [s, flags]), 'poll');
export const delivered = async (G, s) =>
  settled(lib(), await G.submit(lib().queue_delivered, [s]), 'delivered');
export const undelivered = async (G, s) =>
  settled(lib(), await G.submit(lib().queue_undelivered, [s]),
    'undelivered');

export const next = (s) => lib().step_next(s);
export const free = (s) => lib().step_free(s);

/** What an EXECUTE or a CHECK needs: the key, the arguments' JSON text, the
 * deadline and the delay (ms). */
export function view(s, check) {
  const L = lib();
  const n = [0];
  return check
    ? { key: L.step_check_key(s), args: L.step_check_target(s, n),
      deadlineMs: Number(L.step_deadline_ms(s)),
      delayMs: Number(L.step_delay_ms(s)) }
    : { key: L.step_key(s), args: L.step_args(s, n),
      deadlineMs: Number(L.step_deadline_ms(s)),
      delayMs: Number(L.step_delay_ms(s)) };
}

export function envelope(s) {
  return lib().step_envelope(s, [0]);
}
