'use strict';
// Tensors cross without copies; wrong types and layouts fail before any C call.
const test = require('node:test');
const assert = require('node:assert/strict');
const kvmem = require('..');

const L = 2, H = 2, D = 8;
function setup(storage = 'f32') {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const pool = ctx.poolCreate({ nLayers: L, nQHeads: 4, nKvHeads: H, headDim: D }, { blockSize: 4, storageDtype: storage });
  return { ctx, pool, a: pool.agentOpen('t') };
}
const seq = (n, s = 1) => Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37 + s));

test('strided views are read in place', () => {
  const { ctx, a } = setup();
  const T = 3;
  const big = seq(L * T * H * 2 * D); // [L][T][H][2D], view every other element
  const k = { data: big, shape: [L, T, H, D], strides: [T * H * 2 * D, H * 2 * D, 2 * D, 2] };
  a.append(k, k);
  const r = a.read();
  let i = 0;
  for (let l = 0; l < L; l++) for (let t = 0; t < T; t++) for (let h = 0; h < H; h++) for (let d = 0; d < D; d++, i++)
    assert.equal(r.k[i], big[((l * T + t) * H + h) * 2 * D + 2 * d]);
  ctx.close();
});

test('read writes into the caller array, through a subarray offset', () => {
  const { ctx, a } = setup();
  const k = seq(L * 2 * H * D);
  a.append(k, k);
  const backing = new Float32Array(k.length + 8).fill(7);
  const view = backing.subarray(8);
  const r = a.read(0, 2, { kOut: view, values: false });
  assert.equal(r.k, view);
  assert.deepEqual(view, k);
  assert.deepEqual(backing.subarray(0, 8), new Float32Array(8).fill(7));
  ctx.close();
});

test('f16 and bf16 travel as Uint16Array bits', () => {
  const { ctx, a } = setup();
  const f = seq(L * H * D);
  const bits = new Uint16Array(new Uint32Array(f.buffer).map(x => x >>> 16)); // bf16 by truncation
  a.append(bits, bits, { dtype: 'bf16' });
  const r = a.read(0, 1, { values: false });
  assert.deepEqual(r.k, new Float32Array(new Uint32Array(bits).map(x => x << 16).buffer));
  const rb = a.read(0, 1, { values: false, dtype: 'bf16' });
  assert.ok(rb.k instanceof Uint16Array);
  assert.deepEqual(rb.k, bits);
  assert.throws(() => a.append(bits, bits), { name: 'TypeError', message: /dtype 'f16' or 'bf16'/ });
  ctx.close();
});

test('Buffers are taken as raw bytes with a dtype', () => {
  const { ctx, a } = setup();
  const k = seq(L * H * D);
  a.append(Buffer.from(k.buffer), Buffer.from(k.buffer), { dtype: 'f32' });
  assert.deepEqual(a.read().k, k);
  assert.throws(() => a.append(Buffer.from(k.buffer), k), { name: 'TypeError', message: /raw bytes/ });
  ctx.close();
});

test('wrong types, shapes and strides are refused before C', () => {
  const { ctx, a } = setup();
  assert.throws(() => a.append(new Float64Array(L * H * D), new Float64Array(L * H * D)), TypeError);
  assert.throws(() => a.append([1, 2, 3], [1, 2, 3]), TypeError);
  assert.throws(() => a.append(new Float32Array(7), new Float32Array(7)), { name: 'RangeError', message: /whole tensor/ });
  const small = new Float32Array(L * H * D);
  assert.throws(() => a.append({ data: small, shape: [L, 2, H, D] }, small), RangeError);
  assert.throws(() => a.append({ data: small, shape: [L, 1, H, D], strides: [H * D, 0, D, -1] }, small), TypeError);
  assert.throws(() => a.append({ data: small, shape: [L, 1, H, D], strides: [H * D, 0, D, 2] }, small), { message: /reaches element/ });
  assert.equal(a.getInfo().nTokens, 0);
  ctx.close();
});
