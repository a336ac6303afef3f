// LangGraph.js: a StateGraph with a scripted model node, a ToolNode and a
// MemorySaver: one AIMessage's identical calls are one refund (the turn:
// that message's id; the session: the thread id).
import test from 'node:test';
import assert from 'node:assert/strict';
import { StateGraph, MessagesAnnotation, MemorySaver, START, END }
  from '@langchain/langgraph';
import { ToolNode } from '@langchain/langgraph/prebuilt';
import { AIMessage } from '@langchain/core/messages';
import { tool } from '@langchain/core/tools';
import { z } from 'zod';
import { withIdem } from '../src/index.js';
import { guardOn, ledger, refundPolicy } from './helpers.js';

test('one AIMessage\'s identical calls: one refund', async () => {
  const { guard } = guardOn('lg', refundPolicy({ coalesce_ms: 0 }));
  const l = ledger();
  const refund = tool(withIdem.langchain(guard, 'refund',
    (input) => l.refund(input, 5)), {
    name: 'refund', description: 'refund an order',
    schema: z.object({ order: z.string(), amount: z.number() }),
  });
  const a = { order: 'o1', amount: 5 };
  let turns = 0;
  const model = async () => {
    turns += 1;
    if (turns > 1) return { messages: [new AIMessage('done')] };
    return { messages: [new AIMessage({
      id: 'ai_1', content: '',
      tool_calls: ['tc_1', 'tc_2', 'tc_3'].map((id) =>
        ({ id, name: 'refund', args: a, type: 'tool_call' })),
    })] };
  };
  const graph = new StateGraph(MessagesAnnotation)
    .addNode('model', model)
    .addNode('tools', new ToolNode([refund]))
    .addEdge(START, 'model')
    .addConditionalEdges('model', (s) =>
      s.messages.at(-1).tool_calls?.length ? 'tools' : END)
    .addEdge('tools', 'model')
    .compile({ checkpointer: new MemorySaver() });
  const r = await graph.invoke({ messages: [{ role: 'user',
    content: 'refund o1' }] }, { configurable: { thread_id: 'thread-lg' } });
  const outs = r.messages.filter((m) => m.getType() === 'tool')
    .map((m) => JSON.parse(m.content));
  assert.deepEqual(outs.map((o) => o.status).sort(),
    ['already_applied', 'already_applied', 'succeeded']);
  assert.equal(outs[0].idempotency_key.split(':')[0], 'thread-lg');
  assert.equal(l.applied.length, 1, 'one refund');
  await guard.close();
});
