'use strict';
// Every integer a public call hands to C is refused when it is not an integer of
// its C type's range, before C runs (koffi wrapped it: topK 2**32, 2**40 and NaN
// gave "top_k -2147483648 < 0", topK 1.5 was 1, blockSize 2**32+4 a "block size
// -2147483648", gather([2**32+1]) returned block 1's data, token ids 2**40 or 'x'
// were stored as 0 and 2**31 as -2**31). The error is an InvalidArgumentError
// naming the argument and the range, and nothing changes. The table covers every
// integer parameter and option of index.d.ts; a last test parses index.d.ts so a
// new one without a row fails.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const kvmem = require('..');

const L = 2, HQ = 4, H = 2, D = 8, BS = 4, T = 8;
const spec = { nLayers: L, nQHeads: HQ, nKvHeads: H, headDim: D };
const I32 = [-(2n ** 31n), 2n ** 31n - 1n], I64 = [-(2n ** 63n), 2n ** 63n - 1n], U64 = [0n, 2n ** 64n - 1n];
const U8 = [0n, 255n];
const OUT = new Map([[I32, [2 ** 31, 2 ** 32, 2 ** 32 + 4, 2 ** 40, -(2 ** 31) - 1, 2 ** 64, 2n ** 33n]],
                     [I64, [2 ** 63, 2 ** 64, -(2 ** 64), 2n ** 63n, -(2n ** 63n) - 1n]],
                     [U64, [-1, 2 ** 64, -(2 ** 40), 2n ** 64n, -1n]],
                     [U8, [256, -1, 2 ** 32]]]);
const NOT_INTS = [1.5, NaN, Infinity, -Infinity, 'x', '3', true, null, {}];
const f32 = (n, seed = 1) => Float32Array.from({ length: n }, (_, i) => Math.sin(seed * 100 + i));

// A residual head with zero weights (safetensors), as kvmem_qmem_head_load reads it.
function zeroHead(d) {
  const f = 3 * d + 1;
  const shapes = [['alpha', [1]], ['w_q', [128, f]], ['w_k', [128, d]], ['w_v', [128, d]],
                  ['mlp.0.weight', [256, f + 128]], ['mlp.0.bias', [256]], ['mlp.2.weight', [1, 256]], ['mlp.2.bias', [1]]];
  const hdr = { __metadata__: { format: 'pt' } };
  let off = 0;
  for (const [name, shape] of shapes) {
    const n = 4 * shape.reduce((a, b) => a * b, 1);
    hdr[name] = { dtype: 'F32', shape, data_offsets: [off, off + n] };
    off += n;
  }
  let h = Buffer.from(JSON.stringify(hdr));
  h = Buffer.concat([h, Buffer.alloc((8 - (h.length % 8)) % 8, 0x20)]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(h.length));
  return Buffer.concat([len, h, Buffer.alloc(off)]);
}

function world() {
  const w = {};
  w.ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  w.pool = w.ctx.poolCreate(spec, { blockSize: BS, storageDtype: 'f32' });
  w.a = w.pool.agentOpen('alice');
  w.k = f32(L * T * H * D);
  w.k1 = f32(L * H * D, 2);
  w.a.append(w.k, w.k, { tokenIds: Array.from({ length: T }, (_, i) => i), text: 'hello world' });
  w.q = f32(2 * L * HQ * D, 3);
  w.r = w.a.retrieve(w.q, { topK: 1 });
  w.segs = w.pool.segmentsCreate('owner');
  w.segs.add('s0', 0);
  w.qs = new kvmem.QmemStore(spec);
  w.key = w.qs.sessionKey({ sessionId: 's' });
  w.mem = w.qs.update(w.key, w.q, 0, 2);
  w.head = kvmem.QmemHead.fromBuffer(zeroHead(D));
  w.kvs = new kvmem.KVStore(spec);
  w.map = w.kvs.slotmapCreate();
  w.map.append(w.k, w.k);
  w.qa = f32(HQ * D, 4);
  w.kv1 = { data: f32(T * H * D, 5), shape: [T, H, D] };
  w.batch = { data: new Float32Array(H * T * D), shape: [1, H, T, D] };
  w.state = () => [w.a.getInfo(), Array.from(w.a.tokens()), w.a.text(), w.segs.getInfo().nSegments, w.map.getInfo().nLive];
  w.close = () => { w.head.close(); w.kvs.close(); w.qs.close(); w.ctx.close(); };
  return w;
}

// [key as index.d.ts names it, range, call(w, x), the name the message gives (default: the key's argument)]
const CASES = [
  ['Context.nThreads', I32, (w, x) => new kvmem.Context({ backend: 'cpu', nThreads: x })],
  ['ModelSpec.nLayers', I32, (w, x) => kvmem.specValidate({ ...spec, nLayers: x })],
  ['ModelSpec.nQHeads', I32, (w, x) => kvmem.specValidate({ ...spec, nQHeads: x })],
  ['ModelSpec.nKvHeads', I32, (w, x) => kvmem.specValidate({ ...spec, nKvHeads: x })],
  ['ModelSpec.headDim', I32, (w, x) => w.ctx.poolCreate({ ...spec, headDim: x })],
  ['ModelSpec.rotaryDim', I32, (w, x) => w.ctx.poolCreate({ ...spec, rotaryDim: x })],
  ['ModelSpec.ropeStyle', I32, (w, x) => kvmem.specValidate({ ...spec, ropeStyle: x })],
  ['ModelSpec.ropeScaling', I32, (w, x) => kvmem.specValidate({ ...spec, ropeScaling: x })],
  ['ModelSpec.ropeOriginalMaxPos', I32, (w, x) => kvmem.specValidate({ ...spec, ropeOriginalMaxPos: x })],
  ['ModelSpec.layerWindow', I32, (w, x) => kvmem.specValidate({ ...spec, layerWindow: [0, x] }), 'layerWindow[1]'],
  ['PoolParams.blockSize', I32, (w, x) => w.ctx.poolCreate(spec, { blockSize: x })],
  ['PoolParams.storageDtype', I32, (w, x) => w.ctx.poolCreate(spec, { storageDtype: x })],
  ['PoolParams.capacityBytes', U64, (w, x) => w.ctx.poolCreate(spec, { capacityBytes: x })],
  ['PoolParams.maxAgents', I32, (w, x) => w.ctx.poolCreate(spec, { maxAgents: x })],
  ['PoolParams.maxTokensPerAgent', I32, (w, x) => w.ctx.poolCreate(spec, { maxTokensPerAgent: x })],
  ['PoolParams.hostBudgetBytes', U64, (w, x) => w.ctx.poolCreate(spec, { hostBudgetBytes: x })],
  ['PoolParams.deviceCapacityBytes', U64, (w, x) => w.ctx.poolCreate(spec, { deviceCapacityBytes: x })],
  ['Pool.agentId(index)', I32, (w, x) => w.pool.agentId(x)],
  ['AppendOptions.tokenIds', I32, (w, x) => w.a.append(w.k1, w.k1, { tokenIds: [x] }), 'tokenIds[0]'],
  ['AppendOptions.tokenTextOffsets', I32, (w, x) => w.a.append(w.k1, w.k1, { text: 'a', tokenTextOffsets: [x] }), 'tokenTextOffsets[0]'],
  ['AppendOptions.positions', I32, (w, x) => w.a.append(w.k1, w.k1, { positions: [x] }), 'positions[0]'],
  ['Agent.appendAsync(tokenIds)', I32, (w, x) => w.a.appendAsync(w.k1, w.k1, { tokenIds: [x] }), 'tokenIds[0]'],
  ['Agent.readAsync(first)', I64, (w, x) => w.a.readAsync(x, 1)],
  ['Agent.readAsync(n)', I64, (w, x) => w.a.readAsync(0, x)],
  ['Agent.gatherAsync(basePosition)', I64, (w, x) => w.a.gatherAsync([0], x)],
  ['Agent.blockInfo(block)', I32, (w, x) => w.a.blockInfo(x)],
  ['Agent.blockAabb(block)', I32, (w, x) => w.a.blockAabb(x)],
  ['Agent.read(first)', I64, (w, x) => w.a.read(x, 1)],
  ['Agent.read(n)', I64, (w, x) => w.a.read(0, x)],
  ['Agent.tokens(first)', I64, (w, x) => w.a.tokens(x, 1)],
  ['Agent.tokens(n)', I64, (w, x) => w.a.tokens(0, x)],
  ['Agent.truncate(nTokens)', I64, (w, x) => w.a.truncate(x)],
  ['RetrieveOptions.topK', I32, (w, x) => w.a.retrieve(w.q, { topK: x })],
  ['RetrieveOptions.mode', I32, (w, x) => w.a.retrieve(w.q, { mode: x })],
  ['RetrieveOptions.norm', I32, (w, x) => w.a.retrieve(w.q, { norm: x })],
  ['RetrieveOptions.agg', I32, (w, x) => w.a.retrieve(w.q, { agg: x })],
  ['RetrieveOptions.scope', I32, (w, x) => w.a.retrieve(w.q, { scope: x })],
  ['RetrieveOptions.recentWindow', I32, (w, x) => w.a.retrieve(w.q, { recentWindow: x })],
  ['RetrieveOptions.skipRecent', I32, (w, x) => w.a.retrieve(w.q, { skipRecent: x })],
  ['RetrieveOptions.exclude', I32, (w, x) => w.a.retrieve(w.q, { exclude: [x] }), 'exclude[0]'],
  ['RetrieveOptions.alwaysInclude', I32, (w, x) => w.a.retrieve(w.q, { alwaysInclude: [x] }), 'alwaysInclude[0]'],
  ['Agent.retrieveAsync(topK)', I32, (w, x) => w.a.retrieveAsync(w.q, { topK: x })],
  ['Agent.gather(blocks)', I32, (w, x) => w.a.gather([x]), 'blocks[0]'],
  ['Agent.gather(basePosition)', I64, (w, x) => w.a.gather([0], x)],
  ['Agent.gatherAsync(blocks)', I32, (w, x) => w.a.gatherAsync([x]), 'blocks[0]'],
  ['Retrieval.get(set)', I32, (w, x) => w.r.get(x)],
  ['Retrieval.view(set)', I32, (w, x) => w.r.view(x)],
  ['Retrieval.blockScores(set)', I32, (w, x) => w.r.blockScores(x)],
  ['Retrieval.nTokens(set)', I32, (w, x) => w.r.nTokens(x)],
  ['SegmentsParams.staticAfterSteps', I32, (w, x) => w.pool.segmentsCreate('o2', { staticAfterSteps: x })],
  ['SegmentsParams.maxSegments', I32, (w, x) => w.pool.segmentsCreate('o2', { maxSegments: x })],
  ['Segments.add(group)', I32, (w, x) => w.segs.add('s1', x)],
  ['Segments.update(index)', I32, (w, x) => w.segs.update(x)],
  ['Segments.remove(index)', I32, (w, x) => w.segs.remove(x)],
  ['Segments.assign(index)', I32, (w, x) => w.segs.assign(x, 0)],
  ['Segments.assign(group)', I32, (w, x) => w.segs.assign(0, x)],
  ['Segments.drainEvents(max)', I64, (w, x) => w.segs.drainEvents(x)],
  ['Segments.storeSegment(index)', I32, (w, x) => w.segs.storeSegment(x, w.k, w.k)],
  ['Segments.storeGroup(group)', I32, (w, x) => w.segs.storeGroup(x, w.k, w.k)],
  ['Segments.segmentInfo(index)', I32, (w, x) => w.segs.segmentInfo(x)],
  ['Segments.groupInfo(group)', I32, (w, x) => w.segs.groupInfo(x)],
  ['Segments.name(index)', I32, (w, x) => w.segs.name(x)],
  ['Segments.groupMembers(group)', I32, (w, x) => w.segs.groupMembers(x)],
  ['Segments.plan(maxUnits)', I32, (w, x) => w.segs.plan(null, x)],
  ['clusterKmeans(n)', U64, (w, x) => kvmem.clusterKmeans(new Float32Array(8), x, 2, { k: 2 })],
  ['clusterKmeans(dim)', U64, (w, x) => kvmem.clusterKmeans(new Float32Array(8), 4, x, { k: 2 })],
  ['clusterKmeans(k)', I32, (w, x) => kvmem.clusterKmeans(new Float32Array(8), 4, 2, { k: x })],
  ['clusterKmeans(maxIters)', I32, (w, x) => kvmem.clusterKmeans(new Float32Array(8), 4, 2, { maxIters: x })],
  ['clusterKmeans(seed)', U64, (w, x) => kvmem.clusterKmeans(new Float32Array(8), 4, 2, { seed: x })],
  ['multihopSelect(nQuery)', I32, (w, x) => kvmem.multihopSelect(new Float32Array(4), x, new Float32Array(4), 2)],
  ['multihopSelect(nSegments)', I32, (w, x) => kvmem.multihopSelect(new Float32Array(4), 2, new Float32Array(4), x)],
  ['multihopSelect(candidates)', U8, (w, x) => kvmem.multihopSelect(new Float32Array(4), 2, new Float32Array(4), 2, [1, x]), 'candidates[1]'],
  ['multihopSelect(maxIters)', I32, (w, x) => kvmem.multihopSelect(new Float32Array(4), 2, new Float32Array(4), 2, null, { maxIters: x })],
  ['multihopSchedule(nLayers)', I32, (w, x) => kvmem.multihopSchedule(x, 0.5)],
  ['loadPlan(nLayers)', I32, (w, x) => kvmem.loadPlan([1], x, [1], 1, [1])],
  ['loadPlan(loadBytes)', U64, (w, x) => kvmem.loadPlan([1], 1, [x], 1, [1]), 'loadBytes[0]'],
  ['loadPlan(nSegments)', I32, (w, x) => kvmem.loadPlan([1], 1, [1], x, [1])],
  ['loadPlan(recompute)', U8, (w, x) => kvmem.loadPlan([1], 1, [1], 1, [x]), 'recompute[0]'],
  ['loadPlan(maxAhead)', I32, (w, x) => kvmem.loadPlan([1], 1, [1], 1, [1], { maxAhead: x })],
  ['ropeApply(positions)', I32, (w, x) => kvmem.ropeApply(spec, new Float32Array(D), [x]), 'positions[0]'],
  ['ropeApply(stride)', U64, (w, x) => kvmem.ropeApply(spec, new Float32Array(D), [0], { stride: x })],
  ['statusStr(status)', I32, (w, x) => kvmem.statusStr(x)],
  ['dtypeName(dtype)', I32, (w, x) => kvmem.dtypeName(x)],
  ['QmemStore(capacity)', I32, (w, x) => new kvmem.QmemStore(spec, { capacity: x })],
  ['QmemStore(prefixTokens)', I32, (w, x) => new kvmem.QmemStore(spec, { prefixTokens: x })],
  ['QmemStore.sessionKey(tokenIds)', I32, (w, x) => w.qs.sessionKey({ tokenIds: [1, x] }), 'tokenIds[1]'],
  ['QmemStore.sessionKey(mark)', I64, (w, x) => w.qs.sessionKey({ tokenIds: [1, 2], mark: [0, x] }), 'markEnd'],
  ['QmemStore.update(spanBegin)', I64, (w, x) => w.qs.update(w.key, w.q, x, 1)],
  ['QmemStore.update(spanEnd)', I64, (w, x) => w.qs.update(w.key, w.q, 0, x)],
  ['QmemHead.apply(spanBegin)', I64, (w, x) => w.head.apply(spec, w.mem, w.k, new Float32Array(T), x, 1)],
  ['QmemHead.apply(spanEnd)', I64, (w, x) => w.head.apply(spec, w.mem, w.k, new Float32Array(T), 0, x)],
  ['selectKeep(budget)', I64, (w, x) => kvmem.selectKeep([1, 1, 1, 1], x)],
  ['selectKeep(protect)', I64, (w, x) => kvmem.selectKeep([1, 1, 1, 1], 2, x)],
  ['selectKeep(span)', I64, (w, x) => kvmem.selectKeep([1, 1, 1, 1], 2, 0, [0, x]), 'spanEnd'],
  ['streamingKeep(n)', I32, (w, x) => kvmem.streamingKeep(x, 1, 1)],
  ['streamingKeep(nSink)', I64, (w, x) => kvmem.streamingKeep(4, x, 1)],
  ['streamingKeep(window)', I64, (w, x) => kvmem.streamingKeep(4, 1, x)],
  ['h2oAccumulate(nRows)', I64, (w, x) => kvmem.h2oAccumulate(new Float32Array(4), x, 2, new Float32Array(2))],
  ['h2oAccumulate(n)', I64, (w, x) => kvmem.h2oAccumulate(new Float32Array(4), 2, x, new Float32Array(2))],
  ['h2oKeep(budget)', I64, (w, x) => kvmem.h2oKeep([1, 1, 1, 1], x, 1)],
  ['h2oKeep(recent)', I64, (w, x) => kvmem.h2oKeep([1, 1, 1, 1], 2, x)],
  ['snapkvScore(poolKernel)', I32, (w, x) => kvmem.snapkvScore(w.ctx, spec, w.q, w.k, x)],
  ['arrange(blocks)', I32, (w, x) => kvmem.arrange([1, x], [0.5, 0.25]), 'blocks[1]'],
  ['windowSplit(window)', I32, (w, x) => kvmem.windowSplit(x, 0, 0.5, 0.25, 4)],
  ['windowSplit(reserve)', I32, (w, x) => kvmem.windowSplit(64, x, 0.5, 0.25, 4)],
  ['windowSplit(blockSize)', I32, (w, x) => kvmem.windowSplit(64, 0, 0.5, 0.25, x)],
  ['KVStore(pageSlots)', I32, (w, x) => new kvmem.KVStore(spec, { pageSlots: x })],
  ['KVStore(maxSlots)', I64, (w, x) => new kvmem.KVStore(spec, { maxSlots: x })],
  ['KVStore.slotRefs(slot)', I32, (w, x) => w.kvs.slotRefs(x)],
  ['KVStore.readSlot(slot)', I32, (w, x) => w.kvs.readSlot(x)],
  ['SlotMap.fork(prefixLen)', I64, (w, x) => w.map.fork(x)],
  ['SlotMap.setProtected(protect)', I64, (w, x) => w.map.setProtected(x)],
  ['SlotMap.evict(kept)', I32, (w, x) => w.map.evict([0, x]), 'kept[1]'],
  ['SlotMap.compact(kept)', I32, (w, x) => w.map.compact([0, x]), 'kept[1]'],
  ['AttendOptions.layer', I32, (w, x) => kvmem.attend(w.ctx, w.qa, { agent: w.a, layer: x })],
  ['AttendOptions.basePosition', I64, (w, x) => kvmem.attend(w.ctx, w.qa, { agent: w.a, basePosition: x })],
  ['AttendOptions.positions', I32, (w, x) => kvmem.attend(w.ctx, w.qa, { agent: w.a, positions: [x, 0, 0, 0, 0, 0, 0, 0] }), 'positions[0]'],
  ['AttendOptions.slots', I32, (w, x) => kvmem.attend(w.ctx, { data: w.qa, shape: [1, HQ, D] }, { k: w.kv1, v: w.kv1, slots: [0, x] }), 'slots[1]'],
  ['AttendOptions.deadSlot', I32, (w, x) => kvmem.attend(w.ctx, { data: w.qa, shape: [1, HQ, D] }, { k: w.kv1, v: w.kv1, slots: [0, 1], deadSlot: x })],
  ['AttendOptions.mask', U8, (w, x) => kvmem.attend(w.ctx, w.qa, { agent: w.a, mask: [1, x, 1, 1, 1, 1, 1, 1] }), 'mask[1]'],
  ['AttendOptions.tileOrder', I32, (w, x) => kvmem.attend(w.ctx, w.qa, { agent: w.a, tileOrder: [x] }), 'tileOrder[0]'],
  ['AttendOptions.order', I32, (w, x) => kvmem.attend(w.ctx, w.qa, { agent: w.a, order: x })],
  ['AttendOptions.nSink', I32, (w, x) => kvmem.attend(w.ctx, w.qa, { agent: w.a, nSink: x })],
  ['AttendOptions.tileSize', I32, (w, x) => kvmem.attend(w.ctx, w.qa, { agent: w.a, tileSize: x })],
  ['AttendOptions.patience', I32, (w, x) => kvmem.attend(w.ctx, w.qa, { agent: w.a, patience: x })],
  ['AttendOptions.probe', I32, (w, x) => kvmem.attend(w.ctx, w.qa, { agent: w.a, probe: x })],
  ['AttendOptions.causal', I32, (w, x) => kvmem.attend(w.ctx, w.qa, { agent: w.a, causal: x })],
  ['AttendOptions.compare', I32, (w, x) => kvmem.attend(w.ctx, w.qa, { agent: w.a, compare: x })],
  ['attendAsync(layer)', I32, (w, x) => kvmem.attendAsync(w.ctx, w.qa, { agent: w.a, layer: x })],
  ['batchMerge(layer)', I32, (w, x) => kvmem.batchMerge([w.a], x)],
  ['batchMerge(maxLen)', I64, (w, x) => kvmem.batchMerge([w.a], 0, { maxLen: x })],
  ['batchExtract(row)', I32, (w, x) => kvmem.batchExtract(w.batch, x, T, 0, 1)],
  ['batchExtract(length)', I64, (w, x) => kvmem.batchExtract(w.batch, 0, x, 0, 1)],
  ['batchExtract(first)', I64, (w, x) => kvmem.batchExtract(w.batch, 0, T, x, 1)],
  ['batchExtract(n)', I64, (w, x) => kvmem.batchExtract(w.batch, 0, T, 0, x)],
  ['TensorView.shape', I64, (w, x) => w.a.append({ data: w.k, shape: [L, x, H, D] }, w.k), 'k shape[1]'],
  ['TensorView.strides', I64, (w, x) => w.a.append({ data: w.k, shape: [L, T, H, D], strides: [x, H * D, D, 1] }, w.k), 'strides'],
];
const argOf = (key) => (key.includes('(') ? key.slice(key.indexOf('(') + 1, -1) : key.slice(key.lastIndexOf('.') + 1));
// values a parameter takes besides integers: undefined/null as "not given", booleans for flags
const TAKES = { 'Agent.read(n)': [null], 'Agent.readAsync(n)': [null], 'Agent.tokens(n)': [null], 'batchMerge(maxLen)': [null], 'PoolParams.storageDtype': ['x', '3'],
                'AttendOptions.causal': [true], 'AttendOptions.compare': [true], 'Segments.drainEvents(max)': [Infinity],
                'ropeApply(stride)': [null], 'selectKeep(span)': [null] };

// Run a call that may return a promise: the error it throws or rejects with.
async function failure(call) {
  try { await call(); } catch (e) { return e; }
  return null;
}

test('an integer outside its C type is refused, naming it and the range', async () => {
  const w = world();
  const before = w.state();
  for (const [key, [lo, hi], call, name = argOf(key)] of CASES) {
    for (const x of OUT.get(CASES.find((c) => c[0] === key)[1])) {
      const e = await failure(() => call(w, x));
      assert.ok(e instanceof kvmem.InvalidArgumentError, `${key} = ${x}: ${e}`);
      if (key.startsWith('TensorView.strides')) { assert.match(e.message, /strides/, key); continue; }
      assert.ok(e.message.includes(name) && e.message.includes(`[${lo}, ${hi}]`), `${key} = ${x}: ${e.message}`);
    }
  }
  assert.deepEqual(w.state(), before);
  w.close();
});

test('a non-integer is refused, naming it', async () => {
  const w = world();
  const before = w.state();
  for (const [key, , call, name = argOf(key)] of CASES) {
    for (const x of NOT_INTS) {
      if ((TAKES[key] || []).some((t) => Object.is(t, x))) continue;
      const e = await failure(() => call(w, x));
      assert.ok(e instanceof kvmem.KvmemError || e instanceof TypeError, `${key} = ${String(x)}: ${e}`);
      if (e instanceof kvmem.KvmemError) {
        assert.ok(e instanceof kvmem.InvalidArgumentError, `${key} = ${String(x)}: ${e}`);
        assert.ok(e.message.includes(name.split('[')[0]), `${key} = ${String(x)}: ${e.message}`);
      }
    }
  }
  assert.deepEqual(w.state(), before);
  w.close();
});

test('the reported wraps are refused; integers in range (numbers, bigints) still work', () => {
  const w = world();
  for (const topK of [2 ** 32, 2 ** 40, NaN, 1.5])
    assert.throws(() => w.a.retrieve(w.q, { topK }), (e) => e instanceof kvmem.InvalidArgumentError && /topK/.test(e.message));
  assert.throws(() => w.ctx.poolCreate(spec, { blockSize: 2 ** 32 + 4 }), /blockSize = 4294967300 is outside the range of int32/);
  assert.throws(() => w.a.gather([2 ** 32 + 1]), /blocks\[0\] = 4294967297/);
  for (const id of [2 ** 40, 'x', 2 ** 31])
    assert.throws(() => w.a.append(w.k1, w.k1, { tokenIds: [id] }), kvmem.InvalidArgumentError);
  assert.equal(w.a.getInfo().nTokens, T);
  assert.deepEqual(Array.from(w.a.tokens()), [0, 1, 2, 3, 4, 5, 6, 7]);
  assert.equal(w.a.retrieve(w.q, { topK: 1n }).get().blocks.length, 1);
  assert.equal(w.a.blockInfo(1n).firstToken, BS);
  assert.deepEqual(Array.from(w.a.tokens(2n ** 0n, 2)), [1, 2]);
  w.a.append(w.k1, w.k1, { tokenIds: [2 ** 31 - 1] });
  assert.equal(w.a.tokens(T, 1)[0], 2 ** 31 - 1);
  w.close();
});

test('sizes are checked before an output is allocated', () => {
  const w = world();
  for (const call of [() => w.a.tokens(0, 2 ** 40), () => w.a.read(0, 2 ** 40), () => w.a.read(2 ** 40), () => w.a.tokens(-1, 2)])
    assert.throws(call, (e) => e instanceof kvmem.InvalidArgumentError && /outside \[0, 8\)/.test(e.message));
  assert.throws(() => kvmem.streamingKeep(2 ** 40, 1, 1), /n = 1099511627776 is outside the range of int32/);
  assert.throws(() => kvmem.multihopSchedule(2 ** 40, 0.5), kvmem.InvalidArgumentError);
  w.close();
});

// Every `name: number` parameter and input option of index.d.ts (floats listed) has a row.
test('every integer parameter and option of index.d.ts has a row', () => {
  const dts = fs.readFileSync(path.join(__dirname, '..', 'index.d.ts'), 'utf8').replace(/\/\*[\s\S]*?\*\//g, '');
  const FLOATS = new Set(['ropeTheta', 'ropeFactor', 'ropeLowFreqFactor', 'ropeHighFreqFactor', 'yarnBetaFast', 'yarnBetaSlow',
    'yarnAttnFactor', 'tau', 'rrC', 'scale', 'tauS', 'tauD', 'avg', 'ratio', 'bandwidthGbps', 'lambda', 'minRatio', 'emb', 'q2s',
    's2s', 'scores', 'computeMs', 'memory', 'rule', 'probs', 'acc', 'level', 'nThreads',
    'memoryShare', 'liveShare']);
  const INPUTS = ['ModelSpec', 'PoolParams', 'AppendOptions', 'RetrieveOptions', 'SegmentsParams', 'AttendOptions', 'TensorView'];
  const found = new Set();
  let owner = '';
  const decl = /(?:export function |^\s+(?:static )?)(\w+)\(([^)]*)\)/;
  const flat = dts.replace(/\(\s*\n\s*/g, '(').replace(/,\s*\n\s*/g, ', ');
  for (const line of flat.split('\n')) {
    const o = line.match(/^export (?:declare )?(?:class|interface) (\w+)/);
    if (o) owner = o[1];
    if (/^}/.test(line)) owner = '';
    const numeric = (s) => [...s.matchAll(/(\w+)\??: (?:number(?: \| bigint)?|Int32Like|\[number, number\])\b/g)].map((m) => m[1]);
    if (INPUTS.includes(owner) && !decl.test(line)) for (const n of numeric(line)) found.add(`${owner}.${n}`);
    const m = line.match(decl);
    if (m && !/^(get|constructor)$/.test(m[1])) {
      const fn = owner && !line.startsWith('export function') ? `${owner}.${m[1]}` : m[1];
      for (const n of numeric(m[2])) found.add(`${fn}(${n})`);
    } else if (/constructor\(/.test(line)) {
      for (const n of numeric(line.slice(line.indexOf('(')))) found.add(`${owner}(${n})`);
    }
  }
  const keys = new Set(CASES.map((c) => c[0]));
  // errorFor's status is looked up, never handed to C; tensor()'s shape is the TensorView.shape row
  const EXEMPT = new Set(['errorFor(status)', 'tensor(shape)']);
  const missing = [...found].filter((k) => !keys.has(k) && !FLOATS.has(argOf(k)) && !k.startsWith('Handle') && !EXEMPT.has(k));
  assert.ok(found.size > 60, `parsed ${found.size} integer parameters from index.d.ts`);
  assert.deepEqual(missing, [], 'integer parameters without a row in CASES');
});
