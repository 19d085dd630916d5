'use strict';
// One naming convention: camelCase keys in specs, options and results; an
// unknown key is refused with its name; the old snake_case spelling of a known
// key still works, with a DeprecationWarning.
const test = require('node:test');
const assert = require('node:assert/strict');
const kvmem = require('..');

const spec = { nLayers: 3, nQHeads: 4, nKvHeads: 2, headDim: 8 };

test('a camelCase spec builds the pool it describes', () => {
  const ctx = new kvmem.Context({ backend: 'cpu' });
  const pool = ctx.poolCreate({ ...spec, ropeTheta: 500000, modelId: 'm', layerWindow: [0, 4, 0] }, { blockSize: 4 });
  const s = pool.getSpec();
  assert.deepEqual([s.nLayers, s.nQHeads, s.nKvHeads, s.headDim, s.ropeTheta, s.modelId, s.layerWindow],
                   [3, 4, 2, 8, 500000, 'm', [0, 4, 0]]);
  assert.equal(pool.getInfo().blockSize, 4);
  // and appending in that shape works (a 1-layer pool would refuse it)
  const a = pool.agentOpen('x');
  const k = new Float32Array(3 * 2 * 2 * 8);
  a.append(k, k);
  assert.equal(a.getInfo().nTokens, 2);
  ctx.close();
});

test('results are camelCase, flags are booleans', () => {
  const ctx = new kvmem.Context({ backend: 'cpu' });
  const pool = ctx.poolCreate(spec, { blockSize: 2 });
  const a = pool.agentOpen('x');
  const k = new Float32Array(3 * 3 * 2 * 8);
  a.append(k, k);
  assert.deepEqual(Object.keys(a.getInfo()).sort(), ['bytes', 'nBlocks', 'nSealed', 'nTokens', 'textBytes']);
  assert.deepEqual(Object.keys(pool.getInfo()).sort(), ['blockSize', 'capacityBytes', 'nAgents', 'storageDtype', 'usedBytes']);
  assert.deepEqual(a.blockInfo(0), { firstToken: 0, nTokens: 2, sealed: true });
  assert.deepEqual(a.blockInfo(1), { firstToken: 2, nTokens: 1, sealed: false });
  assert.deepEqual(Object.keys(a.prefixMatch('')).sort(), ['commonBytes', 'kind', 'processFrom', 'reuseTokens']);
  const every = (o) => Object.keys(o).every((key) => !key.includes('_'));
  assert.ok(every(pool.spec) && every(pool.getSpec()) && every(kvmem.modelSpec(spec)));
  ctx.close();
});

test('an unknown key is refused, naming it, in every options and spec object', () => {
  const ctx = new kvmem.Context({ backend: 'cpu' });
  const pool = ctx.poolCreate(spec, { blockSize: 2 });
  const a = pool.agentOpen('x');
  const k = new Float32Array(3 * 2 * 2 * 8);
  a.append(k, k);
  a.flush();
  const q = new Float32Array(3 * 4 * 8);
  const calls = {
    Context: () => new kvmem.Context({ backend: 'cpu', threads: 2 }),
    spec: () => ctx.poolCreate({ ...spec, nLayer: 3 }),
    'spec (case)': () => ctx.poolCreate({ ...spec, nKVHeads: 2 }),
    modelSpec: () => kvmem.modelSpec({ headDims: 8 }),
    specValidate: () => kvmem.specValidate({ ...spec, bogus: 1 }),
    'Pool params': () => ctx.poolCreate(spec, { blocksize: 4 }),
    append: () => a.append(k, k, { tokenIDs: [1, 2] }),
    read: () => a.read(0, 1, { kout: null }),
    'tensor view': () => a.append({ data: k, shape: [3, 2, 2, 8], stride: [1] }, k),
    retrieve: () => a.retrieve(q, { topk: 1 }),
    gather: () => a.gather([0], 0, { dtypes: 'f32' }),
    prefixMatch: () => a.prefixMatch('x', { ratio: 0.5 }),
    attend: () => kvmem.attend(ctx, q.subarray(0, 32), { agent: a, tauX: 0 }),
    Segments: () => pool.segmentsCreate('o', { staticSteps: 2 }),
    clusterKmeans: () => kvmem.clusterKmeans([1, 2], 2, 1, { clusters: 2 }),
    multihopSelect: () => kvmem.multihopSelect([1], 1, [1], 1, null, { rate: 0.5 }),
    loadPlan: () => kvmem.loadPlan([1], 1, [1], 1, [0], { gbps: 1 }),
    QmemStore: () => new kvmem.QmemStore(spec, { cap: 2 }),
    KVStore: () => new kvmem.KVStore(spec, { pages: 4 }),
    batchMerge: () => kvmem.batchMerge([a], 0, { max: 4 }),
    ropeApply: () => kvmem.ropeApply(spec, new Float32Array(8), [0], { reverse: true }),
  };
  for (const [what, call] of Object.entries(calls)) {
    const key = /unknown key '([^']+)'/;
    assert.throws(call, (e) => {
      assert.ok(e instanceof TypeError, `${what}: ${e}`);
      assert.match(e.message, key, what);
      return true;
    }, what);
  }
  assert.throws(() => ctx.poolCreate({ ...spec, nKVHeads: 2 }), /unknown key 'nKVHeads' \(did you mean 'nKvHeads'\?\)/);
  assert.equal(pool.getInfo().nAgents, 1, 'nothing was created by the refused calls');
  ctx.close();
});

test('the snake_case spelling still works, with a DeprecationWarning', async () => {
  const warnings = [];
  const onWarning = (w) => { if (w.code === 'KVMEM_SNAKE_CASE') warnings.push(w.message); };
  process.on('warning', onWarning);
  const ctx = new kvmem.Context({ backend: 'cpu' });
  const pool = ctx.poolCreate({ n_layers: 3, n_q_heads: 4, n_kv_heads: 2, head_dim: 8 }, { block_size: 4 });
  assert.deepEqual([pool.spec.nLayers, pool.spec.nKvHeads, pool.getInfo().blockSize], [3, 2, 4]);
  assert.throws(() => ctx.poolCreate({ ...spec, n_layers: 3 }), /'nLayers' is given twice/);
  await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
  process.off('warning', onWarning);
  assert.ok(warnings.some((m) => m.includes("'n_kv_heads'") && m.includes("'nKvHeads'")), warnings.join('\n'));
  assert.ok(warnings.some((m) => m.includes("'block_size'")));
  ctx.close();
});
