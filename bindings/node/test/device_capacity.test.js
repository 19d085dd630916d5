'use strict';
// deviceCapacityBytes and Pool.deviceStats(): the device-resident mirrors never
// hold more than the capacity, and an agent whose mirror does not fit is served
// from the host copy with the CPU context's results. Vulkan is lavapipe here;
// without a usable device that part skips with the reason.
const test = require('node:test');
const assert = require('node:assert/strict');
const kvmem = require('..');

const L = 2, HQ = 4, H = 2, D = 16, BS = 16, NB = 6;
const spec = { nLayers: L, nQHeads: HQ, nKvHeads: H, headDim: D };

function kv() {
  const n = L * NB * BS * H * D;
  const k = Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37) + 2 * Math.cos(Math.floor(i / (H * D * BS)) * 1.7));
  const v = Float32Array.from({ length: n }, (_, i) => Math.cos(i * 0.11));
  return [k, v];
}
const q = Float32Array.from({ length: L * HQ * D }, (_, i) => Math.sin(i * 0.53));

function step(pool) {
  const a = pool.agentOpen('a');
  a.append(...kv());
  const { blocks, scores } = a.retrieve(q, { topK: 3 }).get(0);
  const g = a.gather(blocks, 0);
  return { blocks, scores, k: g.k, v: g.v };
}

test('the default is no limit; a CPU context holds no mirror', () => {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const pool = ctx.poolCreate(spec, { blockSize: BS, deviceCapacityBytes: 1 });
  step(pool);
  assert.deepEqual(pool.deviceStats(), { mirrorBytes: 0, evictions: 0, unmirrored: 0 });
  assert.throws(() => ctx.poolCreate(spec, { deviceCapacityBytes: -1 }), /deviceCapacityBytes/);
  ctx.close();
});

test('at the capacity the host copy serves, with the CPU context\'s results', (t) => {
  let ctx;
  try { ctx = new kvmem.Context({ backend: 'vulkan', nThreads: 1 }); } catch (e) { t.skip(`backend vulkan: ${e.message}`); return; }
  const cpu = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const ref = step(cpu.poolCreate(spec, { blockSize: BS }));
  for (const capacity of [1, 0]) {
    const pool = ctx.poolCreate(spec, { blockSize: BS, deviceCapacityBytes: capacity });
    const got = step(pool);
    assert.deepEqual(Array.from(got.blocks), Array.from(ref.blocks));
    got.scores.forEach((s, i) => assert.ok(Math.abs(s - ref.scores[i]) <= 1e-4 * Math.abs(ref.scores[i]) + 1e-7));
    const scale = ref.k.reduce((m, x) => Math.max(m, Math.abs(x)), 0);
    got.k.forEach((x, i) => assert.ok(Math.abs(x - ref.k[i]) <= 1e-5 * scale, `k[${i}]`));
    assert.deepEqual(got.v, ref.v);
    const st = pool.deviceStats();
    if (capacity) assert.ok(st.mirrorBytes === 0 && st.unmirrored > 0, JSON.stringify(st));
    else assert.ok(st.mirrorBytes > 0 && st.unmirrored === 0, JSON.stringify(st));
    pool.close();
  }
  cpu.close();
  ctx.close();
});
