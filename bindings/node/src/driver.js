// The one place where the binding calls the step API of libidem (idem.h,
// "Two-phase use"): everything that may wait on the attempt log (begin,
// finish, resolve, poll, delivered, undelivered) runs through koffi's
// `.async` form on libuv's thread pool, so the event loop never blocks on
// the log; what only reads the step (next, key, args, envelope) or does no
// I/O (attempt_ended, free) is called directly.
//
// idem_guard_call is never used: it would run a JS tool from a foreign
// thread, which koffi relays to the loop and blocks until the function
// returns, not until its Promise settles (a deadlock until the deadline).
//
// A failed call's text is read from the step (idem_step_errmsg), which keeps
// it: idem_guard_errmsg is per thread, and the thread was libuv's.
//
// The rest of the binding sees only this module's functions, so the driver
// can move onto a completion queue of the C library without the rest
// changing.
import { lib } from './lib.js';
import { errorFor, MisuseError } from './errors.js';

export const NEXT = { ANSWER: 1, EXECUTE: 2, CHECK: 3, WAIT: 4 };
export const OUTCOME = { APPLIED: 1, REJECTED: 2, NOT_APPLIED: 3, UNKNOWN: 4 };

function async_(fn, args) {
  return new Promise((resolve, reject) => {
    fn.async(...args, (err, rc) => (err ? reject(err) : resolve(rc)));
  });
}

function fail(L, s, rc, what) {
  const text = s ? L.step_errmsg(s) : '';
  return errorFor(rc, text || `${what}: ${L.strerror(rc)}`);
}

/** Open a guard (synchronous: once per guard).  policy: a handle or null. */
export function open(url, policy) {
  const L = lib();
  const out = [null];
  const rc = L.guard_open(url, policy, out);
  if (rc) {
    const msg = out[0] ? L.guard_errmsg(out[0]) : L.strerror(rc);
    if (out[0]) L.guard_close(out[0]);
    throw errorFor(rc, msg || L.strerror(rc));
  }
  return out[0];
}

export function close(g) {
  lib().guard_close(g);
}

/** An operator's verdict (idem_guard_resolve).  Synchronous, unlike the
 * step's calls: its failure's text is idem_guard_errmsg of this thread,
 * and it is an operator's rare act, not a model's call. */
export function resolveAction(g, session, callId, outcome, result, reason,
  by) {
  const L = lib();
  const rc = L.guard_resolve(g, session, callId, outcome, result,
    result == null ? 0 : Buffer.byteLength(result, 'utf8'), reason, by);
  if (rc) throw errorFor(rc, L.guard_errmsg(g) || L.strerror(rc));
}

export function owner(g) {
  return lib().guard_owner(g);
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

/** Decide a call: the step (free it with free()), or an IdemError. */
export async function begin(g, ids, tool, args, ownCheck) {
  const L = lib();
  const call = {
    size: 0, session: ids.session, call_id: ids.callId, tool,
    args, args_len: Buffer.byteLength(args, 'utf8'),
    turn: ids.turn ?? null, own_check: ownCheck ? 1 : 0,
  };
  call.size = L.callSize;
  const out = [null];
  const rc = await async_(L.guard_begin, [g, call, out]);
  if (rc) {
    const err = fail(L, out[0], rc, 'begin');
    if (out[0]) L.step_free(out[0]);
    throw err;
  }
  return out[0];
}

async function op(fn, s, args, what) {
  const L = lib();
  const rc = await async_(fn, [s, ...args]);
  if (rc) throw fail(L, s, rc, what);
}

export const finish = (s, outcome, result, error) =>
  op(lib().step_finish, s, [outcome, result,
    result == null ? 0 : Buffer.byteLength(result, 'utf8'), error], 'finish');
export const resolve = (s, outcome, result) =>
  op(lib().step_resolve, s, [outcome, result,
    result == null ? 0 : Buffer.byteLength(result, 'utf8')], 'resolve');
export const poll = (s) => op(lib().step_poll, s, [], 'poll');
export const delivered = (s) => op(lib().step_delivered, s, [], 'delivered');
export const undelivered = (s) =>
  op(lib().step_undelivered, s, [], 'undelivered');

export function ended(s) {
  const rc = lib().step_attempt_ended(s);
  if (rc) throw new MisuseError('attempt_ended on a bad step', rc);
}

export const next = (s) => lib().step_next(s);
export const free = (s) => lib().step_free(s);

/** What an EXECUTE or a CHECK needs: the key, the arguments' JSON text, the
 * deadline and the delay (ms). */
export function view(s, check) {
  const L = lib();
  const len = [0];
  return check
    ? { key: L.step_check_key(s), args: L.step_check_target(s, len),
      deadlineMs: Number(L.step_deadline_ms(s)),
      delayMs: Number(L.step_delay_ms(s)) }
    : { key: L.step_key(s), args: L.step_args(s, len),
      deadlineMs: Number(L.step_deadline_ms(s)),
      delayMs: Number(L.step_delay_ms(s)) };
}

export function envelope(s) {
  return lib().step_envelope(s, [0]);
}
