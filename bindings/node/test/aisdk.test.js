// The AI SDK (ai v6) with its own mock model (MockLanguageModelV3): a step's
// identical refunds are one refund; a re-issue in the next step after
// outcome_unknown is fenced, and already_applied once the late result is in.
import test from 'node:test';
import assert from 'node:assert/strict';
import { generateText, streamText, tool, stepCountIs,
  simulateReadableStream } from 'ai';
import { MockLanguageModelV3 } from 'ai/test';
import { z } from 'zod';
import { withIdem } from '../src/index.js';
import { guardOn, ledger, refundPolicy } from './helpers.js';

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};
const call = (id, args) => ({ type: 'tool-call', toolCallId: id,
  toolName: 'refund', input: JSON.stringify(args) });
const done = (calls) => ({
  content: calls.length ? calls : [{ type: 'text', text: 'done' }],
  finishReason: { unified: calls.length ? 'tool-calls' : 'stop',
    raw: undefined },
  usage, warnings: [],
});

/** A mock model that answers step i with steps[i] (then "done"). */
function scripted(steps, { stream = false, before } = {}) {
  let i = 0;
  const next = async () => {
    if (before) await before(i);
    return done(steps[i++] ?? []);
  };
  return new MockLanguageModelV3(stream ? {
    doStream: async () => {
      const r = await next();
      return { stream: simulateReadableStream({ chunks: [
        { type: 'stream-start', warnings: [] }, ...r.content.map((c) =>
          c.type === 'text' ? { type: 'text-delta', id: 't', delta: c.text }
            : c),
        { type: 'finish', finishReason: r.finishReason, usage }] }) };
    },
  } : { doGenerate: next });
}

function refundTool(guard, l, ms = 5) {
  return tool({
    description: 'refund an order',
    inputSchema: z.object({ order: z.string(), amount: z.number() }),
    execute: withIdem.aiSdk(guard, 'refund', (input) => l.refund(input, ms),
      { session: 'run-ai' }),
  });
}

const statuses = (r) => r.steps[0].toolResults.map((t) => t.output.status)
  .sort();

for (const stream of [false, true]) {
  test(`${stream ? 'streamText' : 'generateText'}: three identical ` +
    'refunds in one step are one refund', async () => {
    const { guard } = guardOn(`ai${stream}`, refundPolicy({ coalesce_ms: 0 }));
    const l = ledger();
    const a = { order: 'o1', amount: 5 };
    const opts = {
      model: scripted([[call('c1', a), call('c2', a), call('c3', a)]],
        { stream }),
      tools: { refund: refundTool(guard, l) },
      prompt: 'refund order o1', stopWhen: stepCountIs(3),
    };
    let r;
    if (stream) {
      r = streamText(opts);
      await r.consumeStream();
      r = { steps: await r.steps };
    } else {
      r = await generateText(opts);
    }
    assert.deepEqual(statuses(r),
      ['already_applied', 'already_applied', 'succeeded']);
    assert.equal(l.applied.length, 1, 'one refund');
    await guard.close();
  });
}

test('generateText: the next step\'s re-issue after outcome_unknown is ' +
  'fenced, and already_applied after the late result', async () => {
  const { guard } = guardOn('aiLate',
    refundPolicy({ timeout_ms: 100, coalesce_ms: 0 }));
  const l = ledger();
  const a = { order: 'o9', amount: 9 };
  const seen = [];
  const model = scripted([[call('c1', a)], [call('c2', a)], [call('c3', a)]],
    {
      before: async (i) => {
        seen.push(l.applied.length);
        // before the third step, the first attempt's late result is in
        if (i === 2) await new Promise((res) => setTimeout(res, 500));
      },
    });
  const r = await generateText({
    model, tools: { refund: refundTool(guard, l, 300) },
    prompt: 'refund order o9', stopWhen: stepCountIs(5),
  });
  const out = r.steps.map((s) => s.toolResults[0]?.output.status);
  assert.equal(out[0], 'outcome_unknown');
  assert.ok(out[1] === 'outcome_unknown' || out[1] === 'in_progress',
    `the re-issue while the first may land is fenced, got ${out[1]}`);
  assert.equal(out[2], 'already_applied');
  assert.deepEqual(seen.slice(0, 2), [0, 0]);
  assert.equal(l.applied.length, 1, 'one refund');
  await guard.close();
});

test('across steps: a told success is a new decision, unless ' +
  'repeat_window_s', async () => {
  const a = { order: 'o7', amount: 7 };
  for (const [window, refunds] of [[0, 2], [600, 1]]) {
    const { guard } = guardOn(`aiWindow${window}`,
      refundPolicy({ coalesce_ms: 0, repeat_window_s: window }));
    const l = ledger();
    const r = await generateText({
      model: scripted([[call('c1', a)], [call('c2', a)]]),
      tools: { refund: refundTool(guard, l) },
      prompt: 'refund order o7', stopWhen: stepCountIs(4),
    });
    const out = r.steps.map((s) => s.toolResults[0]?.output.status);
    assert.deepEqual(out.slice(0, 2), ['succeeded',
      window ? 'already_applied' : 'succeeded']);
    assert.equal(l.applied.length, refunds, `repeat_window_s ${window}`);
    await guard.close();
  }
});
