'use strict';
// kvmem_model_spec_v2, the spec that grows: its defaults are those kvmem.h
// states for kvmem_model_spec_default(), the binding's specs reach the library
// through it (pool, RoPE, validation), and an older caller's shorter struct
// gets only its own bytes written.
const test = require('node:test');
const assert = require('node:assert/strict');
const kvmem = require('..');
const L = require('../lib');

test('the loaded library has the v2 forms', () => {
  assert.ok(!L.missing.has('kvmem_model_spec_v2_init') && !L.missing.has('kvmem_pool_create_v2'), L.libraryPath);
});

test('kvmem_model_spec_v2_init writes the defaults kvmem.h states', () => {
  const v = {};
  L.fns.kvmem_model_spec_v2_init(v, L.koffi.sizeof(L.types.kvmem_model_spec_v2));
  // a 1-layer, 1-head, head_dim 64 shape with NEOX RoPE, theta 10000, no scaling
  const { layer_window: w, ...rest } = v;
  assert.equal(w, null);
  assert.deepEqual({ ...rest, struct_size: Number(rest.struct_size) }, {
    struct_size: L.koffi.sizeof(L.types.kvmem_model_spec_v2), n_layers: 1, n_q_heads: 1, n_kv_heads: 1, head_dim: 64,
    rotary_dim: 0, rope_style: 0, rope_scaling: 0, rope_original_max_pos: 8192, rope_theta: 10000, rope_factor: 1,
    rope_low_freq_factor: 1, rope_high_freq_factor: 4, yarn_beta_fast: 32, yarn_beta_slow: 1, yarn_attn_factor: 0,
    model_id: '',
  });
});

test('an older struct gets only its own bytes', () => {
  const ptr = L.koffi.sizeof('void *');
  const size = 8 + ptr + 8; // struct_size, layer_window, n_layers, n_q_heads (8-byte size_t on 64-bit hosts)
  if (L.koffi.sizeof('size_t') !== 8) return;
  const buf = Buffer.alloc(64, 0xa5);
  const init = L.lib.func('kvmem_model_spec_v2_init', 'int', ['void *', 'size_t']);
  assert.equal(init(buf, size), 0);
  assert.equal(Number(buf.readBigUInt64LE(0)), size);
  assert.deepEqual([buf.readInt32LE(size - 8), buf.readInt32LE(size - 4)], [1, 1]);
  assert.ok(buf.subarray(size).every((b) => b === 0xa5));
  assert.notEqual(init(buf, 3), 0); // a size no version has
});

test('a pool made through v2 keeps every field', () => {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const spec = { nLayers: 3, nQHeads: 4, nKvHeads: 2, headDim: 8, rotaryDim: 6, ropeStyle: kvmem.ROPE_GPTJ,
                 ropeTheta: 500000, ropeScaling: kvmem.ROPE_SCALING_LLAMA3, ropeFactor: 8, ropeOriginalMaxPos: 4096,
                 layerWindow: [0, 16, 0], modelId: 'm-v2' };
  const pool = ctx.poolCreate(spec, { blockSize: 4 });
  assert.deepEqual(pool.getSpec(), kvmem.modelSpec(spec));
  const s = pool.getSpec();
  assert.deepEqual([s.rotaryDim, s.ropeStyle, s.ropeTheta, s.ropeFactor, s.layerWindow, s.modelId],
                   [6, kvmem.ROPE_GPTJ, 500000, 8, [0, 16, 0], 'm-v2']);
  ctx.close();
});

test('RoPE through v2 equals a plain NEOX rotation', () => {
  // pairs (i, i + r/2), angle p * theta^(-2i/r) (DESIGN.md)
  const d = 8, theta = 10000, pos = [0, 7, 1000];
  const x = Float32Array.from({ length: 3 * d }, (_, i) => Math.sin(i * 1.3) * 2);
  const ref = Array.from(x);
  pos.forEach((p, row) => {
    for (let i = 0; i < d / 2; i++) {
      const a = p * Math.pow(theta, -2 * i / d), x0 = x[row * d + i], x1 = x[row * d + i + d / 2];
      ref[row * d + i] = x0 * Math.cos(a) - x1 * Math.sin(a);
      ref[row * d + i + d / 2] = x0 * Math.sin(a) + x1 * Math.cos(a);
    }
  });
  const y = Float32Array.from(x);
  kvmem.ropeApply({ headDim: d, ropeTheta: theta }, y, pos);
  y.forEach((v, i) => assert.ok(Math.abs(v - ref[i]) <= 2e-6, `${i}: ${v} vs ${ref[i]}`));
});

test('validation through v2 names the field', () => {
  assert.throws(() => kvmem.specValidate({ nLayers: 1, nQHeads: 3, nKvHeads: 2, headDim: 8 }),
                (e) => e instanceof kvmem.InvalidArgumentError && /n_kv_heads/.test(e.message));
  kvmem.specValidate({ nLayers: 1, nQHeads: 4, nKvHeads: 2, headDim: 8 });
});
