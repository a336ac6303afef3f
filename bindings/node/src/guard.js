// The guard from JS: Guard, Tool and currentKey().
//
// A call is a drive of one step (driver.js) from the event loop: begin, then
// EXECUTE runs the tool function on the loop, CHECK its status function,
// WAIT sleeps and polls, ANSWER hands the envelope over.  The binding owns
// the deadline: past it the step is finished UNKNOWN and answered; the tool
// goes on, and what it comes to is given to the same step when it comes
// (resolution "late").  guard.close() waits for those late results, with a
// bound, before the guard goes.
//
// The caller's AbortSignal never cancels the attempt: the call's promise
// rejects at once (an AbortError), the drive goes on to its end and its
// outcome is recorded, but it is not marked delivered - the model was not
// told - so a re-issue is fenced, never run again (SPEC §10, "told").
import fs from 'node:fs';
import { AsyncLocalStorage } from 'node:async_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import * as D from './driver.js';
import { MisuseError, ToolOutcome, Rejected } from './errors.js';

const als = new AsyncLocalStorage();

/** The key of the guarded call whose tool function is running, or null. */
export function currentKey() {
  return als.getStore()?.key ?? null;
}

/** The envelope (SPEC §7) as an object; its non-enumerable `text` is the
 * JSON text exactly as the library made it, and so is String(envelope). */
function envelope(text) {
  const e = JSON.parse(text);
  Object.defineProperty(e, 'text', { value: text });
  Object.defineProperty(e, 'toString', { value: () => text });
  return e;
}

function name(v, what) {
  if (typeof v === 'number' && Number.isSafeInteger(v)) return String(v);
  if (typeof v !== 'string' || v === '')
    throw new MisuseError(`${what} must be a non-empty string, not ` +
      `${v === '' ? 'an empty one' : typeof v}`);
  return v;
}

function argsText(args) {
  if (typeof args === 'string') return args; // the model's text, kept raw
  if (args instanceof Uint8Array) return Buffer.from(args).toString('utf8');
  if (args === null || typeof args !== 'object' || Array.isArray(args))
    throw new MisuseError('args must be a JSON object (text or object), ' +
      `not ${Array.isArray(args) ? 'an array' : typeof args}`);
  return JSON.stringify(args);
}

function errorText(e) {
  if (e instanceof Error) return `${e.name}: ${e.message}`;
  return String(e);
}

/** What a tool (or status) function came to, as the step takes it:
 * [outcome, result JSON text or null, error text or null].  Only a verdict
 * finishes an attempt (SPEC §6a): a value, NotApplied, Rejected; anything
 * else thrown is UNKNOWN. */
function verdict(ok, v, check) {
  if (ok) {
    if (check && v == null) return [D.OUTCOME.NOT_APPLIED, null, null];
    if (v instanceof ToolOutcome) return verdict(false, v, check);
    let text;
    try {
      text = v === undefined ? null : JSON.stringify(v);
    } catch (e) {
      return [D.OUTCOME.UNKNOWN, null,
        `the tool returned a value that is not JSON (${e.message})`];
    }
    return [D.OUTCOME.APPLIED, text ?? null, null];
  }
  if (v instanceof ToolOutcome) {
    const o = v.constructor.outcome;
    return [check && o === Rejected.outcome ? D.OUTCOME.NOT_APPLIED : o,
      null, v.message || null];
  }
  return [D.OUTCOME.UNKNOWN, null, errorText(v)];
}

/** fn's run as a promise that never rejects: [ok, value]. */
function settle(fn, args, key, signal) {
  return als.run({ key }, async () => fn(args, { key, signal }))
    .then((v) => [true, v], (e) => [false, e]);
}

/** run's [ok, value], or null when ms pass first. */
async function within(run, ms) {
  let t;
  const r = await Promise.race([run,
    new Promise((res) => { t = setTimeout(res, ms, null); })]);
  clearTimeout(t);
  return r;
}

function abortError(signal) {
  const r = signal.reason;
  if (r instanceof Error) return r;
  const e = new Error('the call was aborted; its outcome is recorded, ' +
    'not delivered');
  e.name = 'AbortError';
  return e;
}

export class Guard {
  #g = null;
  #policy = null;
  #rules = {}; // the policy as JSON, valid (the library checked it)
  #pending = new Set(); // drives and late results in flight
  #tools = new AbortController(); // aborts what still runs after close

  /**
   * Open a guard on the attempt log logUrl ("sqlite:PATH", "postgres://...",
   * a path; null: $IDEM_LOG, else the default).  policy: the policy as an
   * object or JSON text, or {file: PATH}; none guards every tool with the
   * defaults.
   */
  constructor(logUrl = null, { policy } = {}) {
    if (policy != null) {
      if (typeof policy === 'object' && typeof policy.file === 'string') {
        this.#policy = D.policyLoad(policy.file);
        this.#rules = JSON.parse(fs.readFileSync(policy.file, 'utf8'));
      } else {
        const text = typeof policy === 'string' ? policy
          : JSON.stringify(policy);
        this.#policy = D.policyParse(text, 'policy');
        this.#rules = JSON.parse(text);
      }
    }
    try {
      this.#g = D.open(logUrl, this.#policy);
    } catch (e) {
      if (this.#policy) D.policyFree(this.#policy);
      throw e;
    }
  }

  #handle() {
    if (!this.#g) throw new MisuseError('the guard is closed');
    return this.#g;
  }

  /** This guard's owner id, "HOST:PID:START". */
  get owner() {
    return D.owner(this.#handle());
  }

  /** A guarded tool: fn(args, {key, signal}) may be async; status, the
   * status check (args, {key}) => result, or null/undefined when the
   * action is not there. */
  tool(toolName, fn, { status } = {}) {
    if (typeof fn !== 'function')
      throw new MisuseError('guard.tool: fn must be a function');
    if (status != null && typeof status !== 'function')
      throw new MisuseError('guard.tool: status must be a function');
    return new Tool(this, name(toolName, 'tool name'), fn, status ?? null);
  }

  /**
   * An operator's verdict on an action in doubt (SPEC §9, `idem resolve`):
   * {applied: true, result} or {applied: false, reason}.  Synchronous.
   */
  resolve(session, callId, { applied, result, reason, by } = {}) {
    if (typeof applied !== 'boolean')
      throw new MisuseError('resolve: applied must be true or false');
    if (!applied && !(typeof reason === 'string' && reason))
      throw new MisuseError('resolve: a verdict of not applied needs a ' +
        'reason (what the provider said)');
    D.resolveAction(this.#handle(), name(session, 'session'),
      name(callId, 'callId'),
      applied ? D.OUTCOME.APPLIED : D.OUTCOME.NOT_APPLIED,
      result === undefined ? null : JSON.stringify(result),
      reason ?? null, by ?? null);
  }

  /** Close the guard: wait (at most lateMs) for the calls and late results
   * in flight to be recorded, then abort the signal of the tools still
   * running and let the guard go (a step still live keeps it until
   * freed). */
  async close({ lateMs = 10000 } = {}) {
    if (!this.#g) return;
    const g = this.#g;
    this.#g = null;
    if (this.#pending.size) {
      let t;
      await Promise.race([Promise.allSettled([...this.#pending]),
        new Promise((r) => { t = setTimeout(r, lateMs); })]);
      clearTimeout(t);
    }
    this.#tools.abort(new Error('the guard was closed'));
    await D.close(g);
    if (this.#policy) D.policyFree(this.#policy);
    this.#policy = null;
  }

  _keep(p) {
    this.#pending.add(p);
    p.finally(() => this.#pending.delete(p)).catch(() => {});
    return p;
  }

  _queue() {
    return this.#handle();
  }

  /** The policy's entry for a tool as written ({} when none): what an
   * adapter reads that the library does not act on itself. */
  _rule(toolName) {
    return this.#rules?.tools?.[toolName] ?? {};
  }

  get _signal() {
    return this.#tools.signal;
  }
}

export class Tool {
  constructor(guard, toolName, fn, status) {
    this.guard = guard;
    this.name = toolName;
    this.fn = fn;
    this.status = status;
  }

  /**
   * Guard one call: {session, callId, turn} and the arguments (the model's
   * JSON text, or an object).  Resolves to the envelope; rejects only when
   * the log failed (an IdemError) or the caller's signal aborted.  invoke,
   * when given, runs instead of the tool's function for this call (an
   * adapter's way to hand the framework's own arguments through).
   */
  call(ids, args, opts = {}) {
    try {
      return this.#call(ids, args, opts);
    } catch (e) {
      return Promise.reject(e);
    }
  }

  #call(ids, args, { signal, invoke }) {
    const id = {
      session: name(ids?.session, 'session'),
      callId: name(ids?.callId, 'callId'),
      turn: ids?.turn == null ? null : name(ids.turn, 'turn'),
    };
    const ctl = { gone: false };
    const drive = this.guard._keep(this.#drive(id, argsText(args), ctl,
      invoke ?? this.fn));
    if (!signal) return drive;
    if (signal.aborted) ctl.gone = true;
    return new Promise((resolve, reject) => {
      const onAbort = () => {
        ctl.gone = true;
        reject(abortError(signal));
      };
      if (signal.aborted) return onAbort();
      signal.addEventListener('abort', onAbort, { once: true });
      drive.then(resolve, reject).finally(() =>
        signal.removeEventListener('abort', onAbort));
    });
  }

  async #drive(ids, args, ctl, fn) {
    const G = this.guard._queue();
    // each operation records the delivery at ANSWER while the caller
    // still waits (DELIVER); told: the last one did
    const deliver = () => (ctl.gone ? 0 : D.DELIVER);
    let told = deliver();
    const b = await D.begin(G, ids, this.name, args, this.status !== null,
      told);
    const s = b.step;
    let n = b.next;
    let late = null; // a tool run past its deadline: {run: its promise}
    try {
      for (;;) {
        if (n === D.NEXT.ANSWER) {
          const text = D.envelope(s);
          // aborted meanwhile: the model was not told after all
          if (told && ctl.gone) await D.undelivered(G, s);
          return envelope(text);
        }
        if (n === D.NEXT.WAIT) {
          await sleep(D.view(s, false).delayMs);
          n = await D.poll(G, s, told = deliver());
        } else if (n === D.NEXT.EXECUTE) {
          [n, late] = await this.#execute(G, s, fn, told = deliver());
        } else if (this.status === null) { // CHECK, none of our own:
          n = await D.resolve(G, s, 0, null, // none is made
            told = deliver());
        } else {
          n = await this.#check(G, s, told = deliver());
        }
      }
    } finally {
      if (late) this.guard._keep(this.#late(G, s, late.run));
      else D.free(s);
    }
  }

  /** Run the tool within the deadline and finish the step: [next, null],
   * or [next, {run: the run's promise}] when it went on past the
   * deadline. */
  async #execute(G, s, fn, flags) {
    const v = D.view(s, false);
    if (v.delayMs > 0) await sleep(v.delayMs);
    const run = settle(fn, JSON.parse(v.args), v.key,
      this.guard._signal);
    const r = await within(run, v.deadlineMs);
    if (r === null) {
      return [await D.finish(G, s, D.OUTCOME.UNKNOWN, null,
        `no answer within ${v.deadlineMs} ms`, flags), { run }];
    }
    // it returned or threw: nothing of it runs any more (SPEC §6a)
    return [await D.finish(G, s, ...verdict(r[0], r[1], false),
      flags | D.ENDED), null];
  }

  async #check(G, s, flags) {
    const v = D.view(s, true);
    const r = await within(settle(this.status, JSON.parse(v.args), v.key,
      this.guard._signal), v.deadlineMs);
    // a check past its deadline proves nothing: unknown
    return D.resolve(G, s, ...(r === null ? [D.OUTCOME.UNKNOWN, null]
      : verdict(r[0], r[1], true).slice(0, 2)), flags);
  }

  /** The late result of a run past its deadline, given to its step. */
  async #late(G, s, run) {
    try {
      const [ok, value] = await run;
      await D.finish(G, s, ...verdict(ok, value, false), D.ENDED);
    } catch {
      // settled meanwhile, the guard closed, or the log failed: the action
      // stays as the log has it (in doubt), for a status check or an
      // operator
    } finally {
      D.free(s);
    }
  }
}
