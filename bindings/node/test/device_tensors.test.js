'use strict';
// Device tensors through the binding (kvmem.h, "Device tensors"): a
// ctx.deviceTensor() goes where tensors go; a context that does not own its
// memory refuses it naming both, nothing appended. The handles are made up:
// a refusal never touches them (real device memory: tests/unit/test_device_tensors.c).
const test = require('node:test');
const assert = require('node:assert/strict');
const kvmem = require('..');

const L = 2, H = 2, D = 8, T = 16;

test('a cpu context refuses Vulkan and CUDA memory, naming both', () => {
  const ctx = new kvmem.Context({ backend: 'cpu' });
  const pool = ctx.poolCreate({ nLayers: L, nQHeads: 4, nKvHeads: H, headDim: D });
  const a = pool.agentOpen('a');
  const v = new Float32Array(L * T * H * D);
  const dk = ctx.deviceTensor({ kind: 'vulkan', handle: 0xdead0000, size: 1 << 20, dtype: 'f32', shape: [L, T, H, D] });
  assert.throws(() => a.append(dk, v), { name: 'UnsupportedError', message: /K is in Vulkan device memory but the context runs on cpu/ });
  const dv = ctx.deviceTensor({ kind: 'cuda', handle: 0xbeef0000, size: 1 << 20, dtype: 'f16', shape: [L, T, H, D], device: 1 });
  assert.throws(() => a.append(v, dv), { name: 'UnsupportedError', message: /V is in CUDA device memory/ });
  assert.equal(a.getInfo().nTokens, 0);
  assert.throws(() => ctx.vulkanDevice(), { name: 'UnsupportedError', message: /not on a Vulkan device/ });
  dk.close();
  dv.close();
  dv.close(); // idempotent
  ctx.close();
});

test('descriptors that cannot name device memory are refused', () => {
  const ctx = new kvmem.Context({ backend: 'cpu' });
  assert.throws(() => ctx.deviceTensor({ kind: 'vulkan', handle: 0x1000, size: L * T * H * D * 4 - 1, shape: [L, T, H, D] }),
                { name: 'InvalidArgumentError', message: /reaches past/ });
  assert.throws(() => ctx.deviceTensor({ kind: 'cuda', handle: 0, size: 64, shape: [4] }), { name: 'InvalidArgumentError', message: /handle is 0/ });
  assert.throws(() => ctx.deviceTensor({ kind: 'metal', handle: 1, size: 64, shape: [4] }), /not 'cuda' or 'vulkan'/);
  ctx.close();
});

test('a vulkan context shows its device', (t) => {
  let ctx;
  try { ctx = new kvmem.Context({ backend: 'vulkan' }); } catch (e) { t.skip(`backend vulkan: ${e.message}`); return; }
  const d = ctx.vulkanDevice();
  assert.ok(d.instance && d.device && d.queue);
  assert.ok(d.apiVersion >= ((1 << 22) | (1 << 12)));
  ctx.close();
});
