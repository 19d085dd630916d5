'use strict';
// Persistence through the binding: save/load (sync and async), store_dir and
// sync, truncate, prefix match, batch merge/extract, errors.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const kvmem = require('..');

const L = 2, H = 2, D = 8;
const skip = kvmem.hasFunction('kvmem_agent_save') ? false : 'this libkvmem has no persistence yet';
const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), 'kvmem-node-'));
const setup = (params = {}) => {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  return { ctx, pool: ctx.poolCreate({ nLayers: L, nQHeads: 4, nKvHeads: H, headDim: D }, { blockSize: 4, ...params }) };
};

test('save, load, truncate, prefix match', { skip }, async () => {
  const dir = tmp();
  const { ctx, pool } = setup({ storageDtype: 'f32' });
  const a = pool.agentOpen('alice');
  const k = Float32Array.from({ length: L * 7 * H * D }, (_, i) => Math.sin(i));
  a.append(k, k.map((x) => 2 * x), { tokenIds: [0, 1, 2, 3, 4, 5, 6], text: 'hello world', tokenTextOffsets: [0, 1, 2, 4, 6, 8, 10] });
  const file = path.join(dir, 'alice.safetensors');
  await a.saveAsync(file);
  const b = pool.agentOpen('bob');
  assert.throws(() => b.load(file), kvmem.MismatchError);
  a.truncate(3);
  assert.equal(a.text(), 'hell');
  await a.loadAsync(file);
  assert.deepEqual(a.read().k, k);
  assert.equal(a.text(), 'hello world');
  assert.equal(a.prefixMatch('hello world, again').kind, kvmem.PREFIX_EXTEND);
  const bytes = fs.readFileSync(file);
  bytes[bytes.length - 3] ^= 0xff;
  fs.writeFileSync(file, bytes);
  await assert.rejects(a.loadAsync(file), (e) => (e.status === -10 || e.status === -11) && e.message.length > 0);
  assert.equal(Number(a.getInfo().nTokens), 7);
  ctx.close();
});

test('store dir and sync', { skip }, () => {
  const dir = tmp();
  const { ctx, pool } = setup({ storeDir: dir });
  const a = pool.agentOpen('carol');
  a.append(new Float32Array(L * 5 * H * D).fill(1), new Float32Array(L * 5 * H * D).fill(1));
  a.close();
  pool.sync();
  assert.ok(fs.existsSync(path.join(dir, 'carol.safetensors')));
  ctx.close();
});

test('batch merge and extract', { skip }, () => {
  const { ctx, pool } = setup({ storageDtype: 'f32' });
  const a = pool.agentOpen('a'), b = pool.agentOpen('b');
  const ka = Float32Array.from({ length: L * 5 * H * D }, (_, i) => i), kb = Float32Array.from({ length: L * 3 * H * D }, (_, i) => -i - 1);
  a.append(ka, ka);
  b.append(kb, kb);
  const m = kvmem.batchMerge([a, b], 1);
  assert.deepEqual(m.lengths, [5, 3]);
  assert.deepEqual(m.shape, [2, H, 5, D]);
  const row = kvmem.batchExtract({ data: m.k, shape: m.shape }, 1, 3, 0, 3);
  assert.deepEqual(row, kb.subarray(3 * H * D, 6 * H * D)); // layer 1 of b, token-major
  assert.throws(() => kvmem.batchMerge([a, b], 5), kvmem.InvalidArgumentError);
  ctx.close();
});

test('agent file opened in place (experimental): same KV as loaded, read-only', { skip }, () => {
  const dir = tmp();
  const { ctx, pool } = setup({ storageDtype: 'q8' });
  const a = pool.agentOpen('erin');
  const T = 4 * 40 + 2;
  const k = Float32Array.from({ length: L * T * H * D }, (_, i) => Math.cos(i * 0.37));
  a.append(k, k.map((x) => -x));
  const file = path.join(dir, 'erin.safetensors');
  a.save(file);
  const ref = a.read();
  a.close();
  pool.removeAgent('erin');
  const size = fs.statSync(file).size;
  const small = ctx.poolCreate({ nLayers: L, nQHeads: 4, nKvHeads: H, headDim: D },
    { blockSize: 4, storageDtype: 'q8', capacityBytes: Math.floor(size / 2) });
  const m = small.agentOpenFile(file);
  assert.equal(m.id, 'erin');
  assert.ok(Number(small.getInfo().usedBytes) <= size / 2);
  const got = m.read();
  assert.deepEqual(got.k, ref.k);
  assert.deepEqual(got.v, ref.v);
  assert.throws(() => m.flush(), (e) => e instanceof kvmem.UnsupportedError && /read-only/.test(e.message));
  assert.throws(() => small.agentOpenFile(file, { verify: false }), kvmem.ExistsError);
  m.close();
  ctx.close();
});
