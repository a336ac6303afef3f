// Adapters: a guarded tool in each framework's own signature.  Each maps
// the framework's ids onto (session, call id, turn) and hands the
// framework's own arguments to the wrapped function:
//
//   aiSdk      execute(input, {toolCallId, messages, abortSignal}): the call
//              id is toolCallId; the turn is one per step, named after the
//              step's `messages` array (the same object for every call of
//              one step); the session is the option's.
//   agents     execute(input, runContext, details): the call id is
//              details.toolCall.callId, the arguments the model's raw text
//              (details.toolCall.arguments); the turn is the response id
//              that idemModel(model) saw carry the call, else none (the
//              tool's coalesce_ms); the session the option's, else
//              runContext.context.session.
//   langchain  fn(input, config) under ToolNode: the call id is
//              config.toolCallId, the turn the id of the last AIMessage of
//              config.state.messages, the session the option's, else
//              config.configurable.thread_id.
//   mcp        handler(args, extra): the ids of extra._meta
//              ("io.idem/session", "io.idem/call_id", "io.idem/turn", as
//              `idem mcp` reads them, docs/MCP.md), else the session
//              option's and the JSON-RPC request id scoped to this wrapped
//              handler (`jsonrpc:NONCE:ID`): wrap once per server.
//
// The model reads the envelope: aiSdk returns it as an object, agents and
// langchain as its JSON text, mcp as a CallToolResult (docs/MCP.md); a
// handler's isError means what the tool's on_is_error says, as in
// `idem mcp`.
import { randomBytes, randomUUID } from 'node:crypto';
import { MisuseError, NotApplied, Rejected } from './errors.js';

const turnOfMessages = new WeakMap(); // a step's messages -> its turn id

function sessionOf(opt, ...ctx) {
  const s = typeof opt === 'function' ? opt(...ctx) : opt;
  return s;
}

function need(v, what, where) {
  if (v == null || v === '')
    throw new MisuseError(`${where}: no ${what}; give one in the options`);
  return typeof v === 'number' ? String(v) : v;
}

function aiSdk(guard, name, execute, { session, status } = {}) {
  const t = guard.tool(name, execute, { status });
  return async (input, opts = {}) => {
    const { toolCallId, messages, abortSignal } = opts;
    let turn = null;
    if (messages && typeof messages === 'object') {
      turn = turnOfMessages.get(messages);
      if (!turn) turnOfMessages.set(messages, turn = `step:${randomUUID()}`);
    }
    return t.call({
      session: need(sessionOf(session, opts), 'session', `aiSdk ${name}`),
      callId: toolCallId, turn,
    }, input, { signal: abortSignal, invoke: () => execute(input, opts) });
  };
}

// callId -> the id of the model response that carried it (idemModel);
// bounded: the oldest go first.
const turnOfCall = new Map();
const TURNS_MAX = 65536;

function noteTurns(response) {
  const turn = response?.responseId ?? `response:${randomUUID()}`;
  for (const item of response?.output ?? []) {
    if (item?.type === 'function_call' && item.callId) {
      turnOfCall.set(item.callId, turn);
      if (turnOfCall.size > TURNS_MAX)
        turnOfCall.delete(turnOfCall.keys().next().value);
    }
  }
}

/** An Agents SDK Model that notes which response carried each tool call,
 * so that withIdem.agents counts one response's calls as one turn. */
export function idemModel(model) {
  return {
    get supportsPromptModelSelection() {
      return model.supportsPromptModelSelection;
    },
    async getResponse(request) {
      const r = await model.getResponse(request);
      noteTurns(r);
      return r;
    },
    async *getStreamedResponse(request) {
      for await (const ev of model.getStreamedResponse(request)) {
        if (ev?.type === 'response_done') noteTurns(ev.response);
        yield ev;
      }
    },
    ...(model.getRetryAdvice
      ? { getRetryAdvice: (a) => model.getRetryAdvice(a) } : {}),
  };
}

function agents(guard, name, execute, { session, status } = {}) {
  const t = guard.tool(name, execute, { status });
  return async (input, runContext, details) => {
    const tc = details?.toolCall;
    const callId = need(tc?.callId, 'details.toolCall.callId',
      `agents ${name}`);
    const env = await t.call({
      session: need(sessionOf(session, runContext) ??
        runContext?.context?.session, 'session (option, or ' +
        'runContext.context.session)', `agents ${name}`),
      callId, turn: turnOfCall.get(callId) ?? null,
    }, typeof tc?.arguments === 'string' ? tc.arguments : input, {
      signal: details?.signal,
      invoke: () => execute(input, runContext, details),
    });
    return env.text;
  };
}

function langchain(guard, name, fn, { session, status } = {}) {
  const t = guard.tool(name, fn, { status });
  return async (input, config = {}) => {
    const msgs = config.state?.messages ?? [];
    let turn = null;
    for (let i = msgs.length - 1; i >= 0; i--) {
      const m = msgs[i];
      const type = typeof m?.getType === 'function' ? m.getType() : m?.type;
      if (type === 'ai') {
        turn = m.id ?? null;
        break;
      }
    }
    const env = await t.call({
      session: need(sessionOf(session, config) ??
        config.configurable?.thread_id, 'session (option, or ' +
        'configurable.thread_id)', `langchain ${name}`),
      callId: need(config.toolCallId ?? config.toolCall?.id, 'toolCallId',
        `langchain ${name}`),
      turn,
    }, input, { signal: config.signal, invoke: () => fn(input, config) });
    return env.text;
  };
}

function metaId(meta, member, where) {
  const v = meta?.[member];
  if (v === undefined) return null;
  if ((typeof v === 'string' && v !== '') || Number.isSafeInteger(v))
    return String(v);
  throw new MisuseError(`${where}: _meta "${member}" is ` +
    `${v === '' ? 'empty' : JSON.stringify(v)}; give a non-empty string or ` +
    'an integer, or leave it out; the tool was not called');
}

/** The MCP answer for an envelope (docs/MCP.md, the gateway's table). */
function mcpResult(env) {
  const meta = { 'io.idem/status': env.status };
  if (env.status === 'succeeded' || env.status === 'already_applied') {
    const r = env.result && typeof env.result === 'object'
      && Array.isArray(env.result.content) ? env.result
      : { content: [{ type: 'text', text: JSON.stringify(env.result) }] };
    if (env.replayed || env.status === 'already_applied')
      meta['io.idem/replayed'] = true;
    if (env.message) meta['io.idem/message'] = env.message;
    return { ...r, _meta: { ...(r._meta ?? {}), ...meta } };
  }
  return { isError: true, structuredContent: { ...env },
    content: [{ type: 'text', text: env.message ?? env.status }], _meta: meta };
}

/** What a result with isError means, by the tool's on_is_error
 * (docs/POLICY.md): by default nothing (an SDK turns any exception of a
 * handler into isError, its own timeout included), so the outcome is
 * unknown; "rejected" or "not_applied" when the policy says so. */
function isError(guard, name, r) {
  const words = r.content?.map((c) => c.text ?? '').join(' ') ||
    'the tool answered isError';
  const on = guard._rule(name).on_is_error ?? 'unknown';
  if (on === 'rejected') return new Rejected(words);
  if (on === 'not_applied') return new NotApplied(words);
  const e = new Error(words);
  e.name = 'isError';
  return e;
}

function mcp(guard, name, handler, { session, status } = {}) {
  const nonce = randomBytes(8).toString('hex');
  const fallback = session ?? `mcp:${nonce}`;
  const where = `mcp ${name}`;
  const t = guard.tool(name, handler, { status });
  return async (args, extra = {}) => {
    const meta = extra._meta;
    const callId = metaId(meta, 'io.idem/call_id', where) ??
      `jsonrpc:${nonce}:${extra.sessionId ? `${extra.sessionId}:` : ''}` +
      JSON.stringify(extra.requestId);
    const env = await t.call({
      session: metaId(meta, 'io.idem/session', where) ?? fallback,
      callId, turn: metaId(meta, 'io.idem/turn', where),
    }, args ?? {}, {
      signal: extra.signal,
      invoke: async () => {
        const r = await handler(args, extra);
        if (r?.isError) throw isError(guard, name, r);
        return r;
      },
    });
    return mcpResult(env);
  };
}

/** Guarded tools in each framework's own signature. */
export const withIdem = { aiSdk, agents, langchain, mcp };
