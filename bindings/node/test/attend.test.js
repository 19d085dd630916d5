'use strict';
// ART attention through the binding: tau = 0 is full attention (checked
// against a float64 softmax here), slot maps, agent source, async, errors.
const test = require('node:test');
const assert = require('node:assert/strict');
const kvmem = require('..');

const HQ = 4, H = 2, D = 8;
const skip = kvmem.hasFunction('kvmem_attend') ? false : 'this libkvmem has no kvmem_attend yet';
let seed = 7;
const rnd = (n) => Float32Array.from({ length: n }, () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648 * 2 - 1; });

// q [HQ][D] one row, k, v [T][H][D], logical order `order` (array of T physical rows)
function reference(q, k, v, T, order) {
  const out = new Float64Array(HQ * D), G = HQ / H;
  for (let h = 0; h < HQ; h++) {
    const kh = Math.floor(h / G);
    const logits = order.map((t) => { let s = 0; for (let d = 0; d < D; d++) s += q[h * D + d] * k[(t * H + kh) * D + d]; return s / Math.sqrt(D); });
    const m = Math.max(...logits);
    const p = logits.map((x) => Math.exp(x - m));
    const z = p.reduce((a, b) => a + b, 0);
    order.forEach((t, i) => { for (let d = 0; d < D; d++) out[h * D + d] += p[i] / z * v[(t * H + kh) * D + d]; });
  }
  return out;
}
const close = (a, b) => a.every((x, i) => Math.abs(x - b[i]) <= 1e-4 + 1e-4 * Math.abs(b[i]));

test('tensors and slot-map sources equal full attention at tau 0', { skip }, async () => {
  const T = 40;
  const q = rnd(HQ * D), k = rnd(T * H * D), v = rnd(T * H * D);
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const qv = { data: q, shape: [1, HQ, D] }, kv = { data: k, shape: [T, H, D] }, vv = { data: v, shape: [T, H, D] };
  const { out, stats } = kvmem.attend(ctx, qv, { k: kv, v: vv, tauS: 0, tauD: 0, tileSize: 8 });
  assert.ok(close(out, reference(q, k, v, T, [...Array(T).keys()])));
  assert.equal(Number(stats.tilesVisited), 10);
  const rev = [...Array(T).keys()].reverse();
  const r2 = await kvmem.attendAsync(ctx, qv, { k: kv, v: vv, slots: rev, deadSlot: -1, tauS: 0, tauD: 0, causal: 0 });
  assert.ok(close(r2.out, reference(q, k, v, T, rev)));
  assert.throws(() => kvmem.attend(ctx, qv, { k: kv, v: vv, tileSize: 5000 }), (e) => e instanceof kvmem.InvalidArgumentError && e.message.length > 0);
  ctx.close();
});

test('agent source', { skip }, () => {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const pool = ctx.poolCreate({ nLayers: 2, nQHeads: HQ, nKvHeads: H, headDim: D }, { blockSize: 4, storageDtype: 'f32' });
  const agent = pool.agentOpen('a');
  const k = rnd(2 * 12 * H * D);
  agent.append(k, k);
  const { out, stats } = kvmem.attend(ctx, rnd(HQ * D), { agent, layer: 1, tauS: 0, tauD: 0 });
  assert.equal(out.length, HQ * D);
  assert.ok(out.every(Number.isFinite));
  assert.equal(Number(stats.tilesTotal), H * 3);
  agent.close();
  assert.throws(() => kvmem.attend(ctx, rnd(HQ * D), { agent }), kvmem.ClosedError);
  ctx.close();
});
