// MCP: an McpServer of the official SDK with a handler under withIdem.mcp,
// a Client over InMemoryTransport: the _meta ids, the per-connection
// fallback (the JSON-RPC request id scoped to the connection), and a
// notifications/cancelled that loses nothing.
import test from 'node:test';
import assert from 'node:assert/strict';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { InMemoryTransport } from '@modelcontextprotocol/sdk/inMemory.js';
import { z } from 'zod';
import { withIdem } from '../src/index.js';
import { guardOn, ledger, refundPolicy } from './helpers.js';

/** A server with a guarded refund tool (ms: how long a refund takes, or
 * a handler of its own), and a client connected to it. */
async function connect(guard, l, ms = 5, handler = null) {
  const server = new McpServer({ name: 'pay', version: '1.0.0' });
  server.registerTool('refund', {
    description: 'refund an order',
    inputSchema: { order: z.string(), amount: z.number() },
  }, withIdem.mcp(guard, 'refund', handler ?? (async (args) => {
    const r = await l.refund(args, ms);
    return { content: [{ type: 'text', text: JSON.stringify(r) }] };
  })));
  const [ct, st] = InMemoryTransport.createLinkedPair();
  await server.connect(st);
  const client = new Client({ name: 'harness', version: '1.0.0' });
  await client.connect(ct);
  return { client, server };
}

const meta = (callId, turn) => ({ 'io.idem/session': 'run-mcp',
  'io.idem/call_id': callId, ...(turn ? { 'io.idem/turn': turn } : {}) });
const status = (r) => r._meta?.['io.idem/status'];

test('_meta ids: the same call id again is a replay', async () => {
  const { guard } = guardOn('mcpMeta', refundPolicy({ coalesce_ms: 0 }));
  const l = ledger();
  const { client, server } = await connect(guard, l);
  const args = { order: 'o1', amount: 5 };
  const r1 = await client.callTool({ name: 'refund', arguments: args,
    _meta: meta('toolu_1') });
  const r2 = await client.callTool({ name: 'refund', arguments: args,
    _meta: meta('toolu_1') });
  assert.equal(status(r1), 'succeeded');
  assert.equal(status(r2), 'succeeded');
  assert.equal(r2._meta['io.idem/replayed'], true);
  assert.deepEqual(JSON.parse(r2.content[0].text), { refund_id: 'rf_1',
    amount: 5 });
  const bad = await client.callTool({ name: 'refund', arguments: args,
    _meta: { 'io.idem/call_id': '' } }).then((r) => r, (e) => e);
  assert.match(JSON.stringify(bad.content ?? bad.message),
    /_meta \\"?io.idem\/call_id\\"? is empty/);
  assert.equal(l.applied.length, 1);
  await client.close();
  await server.close();
  await guard.close();
});

test('no _meta: the request id, scoped per connection', async () => {
  const { guard } = guardOn('mcpConn', refundPolicy({ coalesce_ms: 0 }));
  const l = ledger();
  const a = await connect(guard, l);
  const b = await connect(guard, l);
  // both connections' first tools/call carry the same JSON-RPC id
  const ra = await a.client.callTool({ name: 'refund',
    arguments: { order: 'o1', amount: 5 } });
  const rb = await b.client.callTool({ name: 'refund',
    arguments: { order: 'o2', amount: 7 } });
  assert.equal(status(ra), 'succeeded');
  assert.equal(status(rb), 'succeeded', 'not a conflict with the other ' +
    'connection\'s request of the same id');
  assert.equal(l.applied.length, 2);
  for (const c of [a, b]) {
    await c.client.close();
    await c.server.close();
  }
  await guard.close();
});

test('notifications/cancelled loses nothing: recorded, not told, a ' +
  're-issue fenced', async () => {
  const { guard } = guardOn('mcpCancel', refundPolicy({ coalesce_ms: 0 }));
  const l = ledger();
  const { client, server } = await connect(guard, l, 150);
  const args = { order: 'o1', amount: 5 };
  const ac = new AbortController();
  const p = client.callTool({ name: 'refund', arguments: args,
    _meta: meta('toolu_1', 'turn_1') }, undefined, { signal: ac.signal });
  setTimeout(() => ac.abort('the user pressed stop'), 30);
  await assert.rejects(p);
  assert.equal(l.applied.length, 0);
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(l.applied.length, 1, 'the refund went on');
  // the model was not told: its re-issue in the next turn is fenced
  const again = await client.callTool({ name: 'refund', arguments: args,
    _meta: meta('toolu_2', 'turn_2') });
  assert.equal(status(again), 'already_applied');
  const replay = await client.callTool({ name: 'refund', arguments: args,
    _meta: meta('toolu_1', 'turn_1') });
  assert.equal(status(replay), 'succeeded');
  assert.equal(replay._meta['io.idem/replayed'], true);
  assert.equal(l.applied.length, 1, 'one refund');
  await client.close();
  await server.close();
  await guard.close();
});

test('isError means what on_is_error says: unknown by default', async () => {
  for (const [on, want] of [[undefined, 'outcome_unknown'],
    ['rejected', 'failed']]) {
    const { guard } = guardOn(`mcpIsError${on}`, refundPolicy({
      coalesce_ms: 0, ...(on ? { on_is_error: on } : {}) }));
    const { client, server } = await connect(guard, null, 0, async () =>
      ({ isError: true,
        content: [{ type: 'text', text: 'provider timed out' }] }));
    const r = await client.callTool({ name: 'refund',
      arguments: { order: 'o1', amount: 1 }, _meta: meta('toolu_e') });
    assert.equal(status(r), want, on ?? 'default');
    assert.equal(r.isError, true);
    assert.match(r.content[0].text, /provider timed out/);
    await client.close();
    await server.close();
    await guard.close();
  }
});
