'use strict';
// IntentKV through the binding (skipped, with the reason, before the library has it).
const test = require('node:test');
const assert = require('node:assert/strict');
const kvmem = require('..');

const L = 2, HQ = 4, H = 2, D = 8;
const spec = { nLayers: L, nQHeads: HQ, nKvHeads: H, headDim: D };
const skip = kvmem.hasFunction('kvmem_qmem_store_create') ? false : 'this libkvmem has no IntentKV functions yet';
let seed = 1;
const rnd = (n) => Float32Array.from({ length: n }, () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648 * 2 - 1; });

test('query memory and rule score', { skip }, () => {
  const store = new kvmem.QmemStore(spec, { capacity: 4, lambda: 0.5 });
  const a1 = store.sessionKey({ sessionId: 'chat-1' }), a2 = store.sessionKey({ sessionId: 'chat-1' });
  const b = store.sessionKey({ sessionId: 'chat-2' });
  assert.deepEqual([a1.hi, a1.lo, a1.kind], [a2.hi, a2.lo, kvmem.SESSION_EXPLICIT]);
  assert.notDeepEqual([a1.hi, a1.lo], [b.hi, b.lo]);
  assert.equal(store.sessionKey({ tokenIds: Array.from({ length: 300 }, (_, i) => i) }).kind, kvmem.SESSION_PREFIX);
  const q = rnd(6 * L * HQ * D);
  const mem = store.update(a1, q, 2, 5);
  // first turn: the normalised mean of rows 2..4
  const row = L * HQ * D;
  for (let r = 0; r < L * HQ; r++) {
    const want = Array.from({ length: D }, (_, d) => (q[2 * row + r * D + d] + q[3 * row + r * D + d] + q[4 * row + r * D + d]) / 3);
    const norm = Math.hypot(...want);
    for (let d = 0; d < D; d++) assert.ok(Math.abs(mem[r * D + d] - want[d] / norm) < 1e-5);
  }
  assert.deepEqual(store.get(a1), mem);
  assert.equal(store.count, 1);
  assert.throws(() => store.get(b), kvmem.NotFoundError);
  assert.throws(() => store.update(b, q, 4, 4), (e) => e instanceof kvmem.InvalidArgumentError && e.message.length > 0);
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const s = kvmem.qmemScore(ctx, spec, mem, rnd(L * 10 * H * D));
  assert.equal(s.length, 10);
  assert.ok(Math.abs(s.reduce((x, y) => x + y, 0) - L * HQ) < 1e-4);
  ctx.close();
  store.close();
});

test('keep sets', { skip }, () => {
  assert.deepEqual(Array.from(kvmem.selectKeep([0.1, 0.9, 0.2, 0.8, 0.3, 0.05, 0.7, 0.6], 5, 1, [6, 8])), [0, 1, 3, 6, 7]);
  assert.deepEqual(Array.from(kvmem.streamingKeep(10, 2, 3)), [0, 1, 7, 8, 9]);
  const acc = new Float32Array(4);
  kvmem.h2oAccumulate([0.1, 0.2, 0.3, 0.4, 0.4, 0.3, 0.2, 0.1], 2, 4, acc);
  assert.ok(acc.every((x) => Math.abs(x - 0.5) < 1e-6));
  assert.deepEqual(Array.from(kvmem.h2oKeep([5, 1, 4, 0.5, 0.2, 0.1], 4, 2)), [0, 2, 4, 5]);
  assert.throws(() => kvmem.h2oKeep([5, 1], 1, 2), kvmem.InvalidArgumentError);
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const s = kvmem.snapkvScore(ctx, spec, rnd(3 * L * HQ * D), rnd(L * 12 * H * D), 3);
  assert.equal(s.length, 12);
  assert.ok(s.every(Number.isFinite));
  ctx.close();
});

test('slot maps: evict, gather, fork, compact', { skip }, () => {
  const store = new kvmem.KVStore(spec, { pageSlots: 4 });
  const m = store.slotmapCreate();
  const k = rnd(L * 5 * H * D), v = rnd(L * 5 * H * D);
  m.append(k, v);
  const child = m.fork(3);
  const { slots, deadSlot } = m.slots();
  assert.equal(deadSlot, kvmem.DEAD_SLOT);
  assert.equal(store.slotRefs(slots[0]), 2);
  assert.equal(m.evict([0, 2, 4]), 1);
  const after = m.slots().slots;
  assert.deepEqual([after[1], after[3]], [deadSlot, deadSlot]);
  const g = m.gather();
  assert.deepEqual(Array.from(g.positions), [0, 2, 4]);
  const row = H * D;
  for (let l = 0; l < L; l++) [0, 2, 4].forEach((p, i) => {
    assert.deepEqual(g.k.subarray((l * 3 + i) * row, (l * 3 + i + 1) * row), k.subarray((l * 5 + p) * row, (l * 5 + p + 1) * row));
  });
  const rs = store.readSlot(after[2]);
  assert.deepEqual(rs.k.subarray(0, row), k.subarray(2 * row, 3 * row));
  m.compact([0, 2, 4]);
  assert.equal(Number(m.getInfo().length), 3);
  assert.throws(() => m.evict([2, 1]), kvmem.InvalidArgumentError);
  store.close();
  assert.ok(m.closed && child.closed);
  assert.throws(() => m.getInfo(), kvmem.ClosedError);
});

test('qmem head load errors carry the path', { skip }, () => {
  assert.throws(() => kvmem.QmemHead.load('/nonexistent/head.safetensors'), (e) => e instanceof kvmem.KvmemError && /nonexistent/.test(e.message));
  assert.throws(() => kvmem.QmemHead.fromBuffer(Buffer.from('not a safetensors file')), kvmem.KvmemError);
});
