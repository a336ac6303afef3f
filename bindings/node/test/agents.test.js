// The OpenAI Agents SDK (@openai/agents) with a scripted Model under
// Runner.run: a replay on the same callId, a conflict on changed arguments,
// and one response's parallel identical calls as one refund (the turn from
// idemModel: the response that carried them).
import test from 'node:test';
import assert from 'node:assert/strict';
import { Agent, Runner, tool, Usage, setTracingDisabled } from '@openai/agents';
import { z } from 'zod';
import { withIdem, idemModel } from '../src/index.js';
import { guardOn, ledger, refundPolicy } from './helpers.js';

setTracingDisabled(true);

const fcall = (callId, args) => ({ type: 'function_call', callId,
  name: 'refund', arguments: JSON.stringify(args), status: 'completed' });
const text = { type: 'message', role: 'assistant', status: 'completed',
  content: [{ type: 'output_text', text: 'done' }] };

/** A Model that answers request i with responses[i] (then a text). */
function scripted(responses) {
  let i = 0;
  return {
    async getResponse() {
      const output = responses[i] ?? [text];
      i += 1;
      return { usage: new Usage(), output, responseId: `resp_${i}` };
    },
    // eslint-disable-next-line require-yield
    async *getStreamedResponse() {
      throw new Error('not scripted');
    },
  };
}

/** Runner.run once per script of runs (a harness that runs again: after a
 * restart, the same model output), on one guard: the tool outputs. */
async function run(tag, runs) {
  const { guard } = guardOn(tag, refundPolicy({ coalesce_ms: 0 }));
  const l = ledger();
  const outs = [];
  for (const responses of runs) {
    const agent = new Agent({
      name: 'refunds', instructions: 'refund orders',
      model: idemModel(scripted(responses)),
      tools: [tool({
        name: 'refund', description: 'refund an order',
        parameters: z.object({ order: z.string(), amount: z.number() }),
        execute: withIdem.agents(guard, 'refund', (input) => l.refund(input)),
      })],
    });
    const r = await new Runner().run(agent, 'refund', {
      context: { session: `run-${tag}` }, maxTurns: 6 });
    for (const it of r.newItems)
      if (it.type === 'tool_call_output_item')
        outs.push(JSON.parse(typeof it.output === 'string' ? it.output
          : it.output.text));
  }
  await guard.close();
  return { outs, l };
}

const a = { order: 'o1', amount: 5 };

test('the same callId again (a run again): a replay, one refund',
  async () => {
  const { outs, l } = await run('agReplay', [[[fcall('call_1', a)]],
    [[fcall('call_1', a)]]]);
  assert.deepEqual(outs.map((o) => [o.status, o.replayed]),
    [['succeeded', false], ['succeeded', true]]);
  assert.equal(l.applied.length, 1);
  });

test('the same callId with changed arguments: conflict, nothing run',
  async () => {
    const { outs, l } = await run('agConflict', [[[fcall('call_1', a)]],
      [[fcall('call_1', { order: 'o1', amount: 50 })]]]);
    assert.deepEqual(outs.map((o) => o.status), ['succeeded', 'conflict']);
    assert.equal(l.applied.length, 1);
  });

test('one response\'s parallel identical calls: one refund', async () => {
  const { outs, l } = await run('agParallel', [[[fcall('call_1', a),
    fcall('call_2', a), fcall('call_3', a)]]]);
  assert.deepEqual(outs.map((o) => o.status).sort(),
    ['already_applied', 'already_applied', 'succeeded']);
  assert.equal(l.applied.length, 1, 'one refund');
});
