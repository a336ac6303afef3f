// Types of the idem package (bindings/node).  See README.md.

/** The answer for the model (SPEC §7).  `text` is the JSON text exactly as
 * the library made it; String(envelope) is that text too. */
export interface Envelope {
  status: 'succeeded' | 'failed' | 'outcome_unknown' | 'already_applied' |
    'conflict' | 'in_progress' | 'refused' | 'invalid_arguments';
  tool: string;
  call_id: string;
  idempotency_key?: string;
  replayed?: boolean;
  attempts?: number;
  result?: unknown;
  message?: string;
  duplicate_of?: string;
  readonly text: string;
  [member: string]: unknown;
}

/** Which action a call is: (session, callId); turn, the model turn that
 * issued it (identical calls of one turn are one action). */
export interface CallIds {
  session: string | number;
  callId: string | number;
  turn?: string | number | null;
}

export interface ToolContext {
  /** The idempotency key: send it downstream. */
  key: string;
  /** Aborted only when the guard is closed while the tool still runs. */
  signal: AbortSignal;
}

/** A tool function: its result (any JSON value) means applied; throw
 * Rejected or NotApplied for a definite failure; anything else thrown is
 * an unknown outcome. */
export type ToolFn<A = any, R = unknown> =
  (args: A, ctx: ToolContext) => R | Promise<R>;
/** A status check: the action's result when it took effect, null or
 * undefined when it did not. */
export type StatusFn<A = any> =
  (args: A, ctx: { key: string; signal: AbortSignal }) => unknown;

/** A policy (docs/POLICY.md) as an object or JSON text, or a file. */
export type PolicySource = string | Record<string, unknown> | { file: string };

export class Guard {
  constructor(logUrl?: string | null, options?: { policy?: PolicySource });
  readonly owner: string;
  tool<A = any, R = unknown>(name: string, fn: ToolFn<A, R>,
    options?: { status?: StatusFn<A> }): Tool<A>;
  /** An operator's verdict on an action in doubt (synchronous). */
  resolve(session: string, callId: string, verdict: {
    applied: boolean; result?: unknown; reason?: string; by?: string;
  }): void;
  /** Wait (at most lateMs, default 10000) for calls and late results in
   * flight, then close. */
  close(options?: { lateMs?: number }): Promise<void>;
}

export class Tool<A = any> {
  readonly guard: Guard;
  readonly name: string;
  /** Guard one call.  Resolves to the envelope; rejects only when the log
   * failed (an IdemError) or the signal aborted (the attempt goes on, its
   * outcome recorded but not delivered). */
  call(ids: CallIds, args: string | Uint8Array | A | Record<string, unknown>,
    options?: { signal?: AbortSignal }): Promise<Envelope>;
}

/** The key of the guarded call whose tool function is running, or null. */
export function currentKey(): string | null;

/** This process's counters (idem_metrics_read): what every guard of the
 * process has done since it started.  docs/CONSOLE.md names each one. */
export interface ProcessMetrics {
  answers: Record<'succeeded' | 'failed' | 'outcome_unknown' |
    'already_applied' | 'conflict' | 'in_progress' | 'refused' |
    'invalid_arguments', number>;
  replays: number;
  fenced: number;
  coalesced: number;
  attempts: number;
  late: number;
  checks: Record<'applied' | 'rejected' | 'not_applied' | 'unknown', number>;
  resolved: number;
  /** cumulative buckets: [upper bound in seconds, calls within it] */
  latency: { buckets: Array<[number, number]>; count: number;
    sumSeconds: number };
}
export function processMetrics(): ProcessMetrics;

type Session<C> = string | ((ctx: C) => string);

export const withIdem: {
  /** AI SDK `execute`: one turn per step (its `messages`). */
  aiSdk<I, R>(guard: Guard, name: string,
    execute: (input: I, options: any) => R | Promise<R>,
    options: { session: Session<any>; status?: StatusFn<I> }):
    (input: I, options: any) => Promise<Envelope>;
  /** Agents SDK `execute`: raw argument text; the turn from idemModel. */
  agents<I, R>(guard: Guard, name: string,
    execute: (input: I, runContext?: any, details?: any) => R | Promise<R>,
    options?: { session?: Session<any>; status?: StatusFn<I> }):
    (input: I, runContext?: any, details?: any) => Promise<string>;
  /** LangChain / LangGraph.js tool function under ToolNode. */
  langchain<I, R>(guard: Guard, name: string,
    fn: (input: I, config?: any) => R | Promise<R>,
    options?: { session?: Session<any>; status?: StatusFn<I> }):
    (input: I, config?: any) => Promise<string>;
  /** MCP McpServer tool handler: _meta ids, else the request id scoped to
   * this handler (wrap once per server). */
  mcp<I, R>(guard: Guard, name: string,
    handler: (args: I, extra: any) => R | Promise<R>,
    options?: { session?: string; status?: StatusFn<I> }):
    (args: I, extra: any) => Promise<any>;
};

/** An Agents SDK Model that notes which response carried each tool call. */
export function idemModel<M>(model: M): M;

export class IdemError extends Error {
  static readonly code: number;
  static readonly status: string;
  constructor(message: string, code?: number);
  readonly code: number;
  readonly status: string;
}
export class LibraryNotFound extends IdemError {}
export class JSONError extends IdemError {}
export class NoMemoryError extends IdemError {}
export class MisuseError extends IdemError {}
export class InvalidError extends IdemError {}
export class IdemRangeError extends IdemError {}
export class IOError extends IdemError {}
export class JSONSyntaxError extends JSONError {}
export class TrailingBytesError extends JSONError {}
export class UTF8Error extends JSONError {}
export class SurrogateError extends JSONError {}
export class DuplicateMemberError extends JSONError {}
export class NumberOverflowError extends JSONError {}
export class NumberUnderflowError extends JSONError {}
export class BigIntError extends JSONError {}
export class DepthError extends JSONError {}
export class TooBigError extends JSONError {}
export class BOMError extends JSONError {}
export class NotObjectError extends JSONError {}
export class PolicyError extends IdemError {}
export class NotFoundError extends IdemError {}
export class StoreError extends IdemError {}
export class BusyError extends StoreError {}
export class CorruptError extends StoreError {}
export class StaleError extends IdemError {}
/** Every class by its C status code. */
export const ERRORS: Map<number, typeof IdemError>;
export function errorFor(code: number, message: string): IdemError;

export class ToolOutcome extends Error {
  static readonly outcome: number;
}
/** Thrown by a tool: a definite failure, nothing applied. */
export class Rejected extends ToolOutcome {}
/** Thrown by a tool: certainly not applied (may be retried). */
export class NotApplied extends ToolOutcome {}
