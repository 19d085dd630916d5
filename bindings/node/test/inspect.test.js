'use strict';
// util.inspect (console.log) shows what an object is, not the binding's
// internals: it showed `_h`, `_busy`, `_kind`, `_free` and the queue.
const test = require('node:test');
const assert = require('node:assert/strict');
const util = require('node:util');
const kvmem = require('..');

test('inspect shows ids, sizes and state, never the internals', async () => {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const pool = ctx.poolCreate({ nLayers: 2, nQHeads: 4, nKvHeads: 2, headDim: 8 }, { blockSize: 4, storageDtype: 'f32' });
  const a = pool.agentOpen('alice');
  const k = new Float32Array(2 * 8 * 2 * 8).fill(0.5);
  a.append(k, k);
  const r = a.retrieve(new Float32Array(2 * 4 * 8).fill(1), { topK: 1 });
  const shown = [ctx, pool, a, r].map((o) => util.inspect(o, { breakLength: Infinity }));
  for (const s of shown) assert.doesNotMatch(s, /_h\b|_busy|_kind|_free|_tail|_pins|\[External/, s);
  assert.equal(shown[0], "Context { backend: 'cpu', nThreads: 1 }");
  assert.match(shown[1], /^Pool \{ nLayers: 2, nQHeads: 4, nKvHeads: 2, headDim: 8, blockSize: 4, storageDtype: 'f32', nAgents: 1,/);
  assert.equal(shown[2], `Agent { id: 'alice', nTokens: 8, nBlocks: 2, nSealed: 2, bytes: ${a.getInfo().bytes} }`);
  assert.match(shown[3], /^Retrieval \{ nSets: 1, blocks: \[ [01] \], scores: \[ [-\d.e]+ \] \}$/);
  const p = a.appendAsync(k, k);
  assert.equal(util.inspect(a), "Agent { id: 'alice', pending: 'an async call has not settled' }");
  await p;
  a.close();
  assert.equal(util.inspect(a), "Agent { id: 'alice', closed: true }");
  ctx.close();
  assert.equal(util.inspect(pool), 'Pool { closed: true }');
});
