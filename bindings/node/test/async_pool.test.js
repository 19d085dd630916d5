'use strict';
// The pool's calls that wait for its mutex have async forms, so a service's event
// loop never waits while another thread writes an agent to the store (a spill holds
// the mutex through the write and a directory store's fsync): Pool.agentOpenAsync
// and getInfoAsync, Agent.flushAsync and closeAsync. appendAsync(..., {copy: false})
// hands the caller's arrays over instead of copying them (an 8 MB copy held the
// event loop for tens of milliseconds).
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const kvmem = require('..');

const L = 1, H = 1, D = 8, BS = 4;
const spec = { nLayers: L, nQHeads: 1, nKvHeads: H, headDim: D };
const kv = (T, seed) => Float32Array.from({ length: L * T * H * D }, (_, i) => seed + i);

function setup(params = {}) {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const pool = ctx.poolCreate(spec, { blockSize: BS, storageDtype: 'f32', ...params });
  return { ctx, pool };
}

test('agentOpenAsync opens (and reads back from the store) as agentOpen does; its refusals are typed', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvmem-async-pool-'));
  try {
    const { ctx, pool } = setup({ storeDir: dir });
    const a = await pool.agentOpenAsync('alice');
    assert.ok(a instanceof kvmem.Agent);
    assert.equal(a.id, 'alice');
    a.append(kv(6, 1), kv(6, 2));
    await a.saveAsync(null);
    await assert.rejects(pool.agentOpenAsync('alice'), kvmem.ExistsError);
    await assert.rejects(pool.agentOpenAsync('.hidden'), (e) => e instanceof kvmem.InvalidArgumentError && /agent id/.test(e.message));
    await a.closeAsync();
    pool.close();
    // a fresh pool over the same store: the open reads the agent back
    const pool2 = ctx.poolCreate(spec, { blockSize: BS, storageDtype: 'f32', storeDir: dir });
    const b = await pool2.agentOpenAsync('alice');
    assert.equal(b.getInfo().nTokens, 6);
    assert.deepEqual(Array.from(b.read(0, 6).v), Array.from(kv(6, 2)));
    const info = await pool2.getInfoAsync();
    assert.deepEqual(info, pool2.getInfo());
    assert.equal(info.nAgents, 1);
    ctx.close();
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('flushAsync seals the tail, after the async calls made before it', async () => {
  const { ctx, pool } = setup();
  const a = pool.agentOpen('a');
  a.appendAsync(kv(6, 1), kv(6, 1));
  const p = a.flushAsync();
  assert.throws(() => a.flush(), kvmem.BusyError);
  await p;
  const i = a.getInfo();
  assert.deepEqual([i.nTokens, i.nBlocks, i.nSealed], [6, 2, 2]);
  ctx.close();
});

test('closeAsync closes after the async calls made before it; calls made after it are refused', async () => {
  const { ctx, pool } = setup();
  const a = pool.agentOpen('a');
  a.appendAsync(kv(4, 1), kv(4, 1));
  const closing = a.closeAsync();
  assert.throws(() => a.getInfo(), kvmem.BusyError);
  await closing;
  assert.equal(a.closed, true);
  assert.throws(() => a.getInfo(), kvmem.ClosedError);
  await a.closeAsync(); // again: nothing to do
  const b = pool.agentOpen('a'); // the handle is free again, and the append ran first
  assert.equal(b.getInfo().nTokens, 4);
  assert.doesNotThrow(() => pool.close());
  ctx.close();
});

test('a pool with an agentOpenAsync in flight cannot be closed under it', async () => {
  const { ctx, pool } = setup();
  const p = pool.agentOpenAsync('a');
  assert.throws(() => pool.close(), kvmem.BusyError);
  const a = await p;
  a.close();
  pool.close();
  ctx.close();
});

test('appendAsync copies its inputs unless told copy: false', async () => {
  const { ctx, pool } = setup();
  const a = pool.agentOpen('a');
  const k = kv(4, 1), v = kv(4, 2);
  const copied = a.appendAsync(k, v);
  v.fill(7); // after the call: the copy is what is stored
  await copied;
  assert.deepEqual(Array.from(a.read(0, 4).v), Array.from(kv(4, 2)));
  const k2 = kv(4, 3), v2 = kv(4, 4);
  const handed = a.appendAsync(k2, v2, { copy: false });
  v2.fill(7); // the call has not run yet: it reads the caller's array when it does
  await handed;
  assert.deepEqual(Array.from(a.read(4, 4).v), new Array(4 * D).fill(7));
  assert.throws(() => a.appendAsync(k2, v2, { copy: 'no' }), (e) => e instanceof TypeError && /copy must be a boolean/.test(e.message));
  assert.throws(() => a.append(k2, v2, { copy: false }), /copy/, 'the synchronous append has no copy option');
  assert.equal(a.getInfo().nTokens, 8);
  ctx.close();
});

test('removeAgentAsync removes the agent from the pool and the store; its refusals are typed', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvmem-async-remove-'));
  try {
    const { ctx, pool } = setup({ storeDir: dir });
    const a = pool.agentOpen('alice');
    a.append(kv(6, 1), kv(6, 2));
    a.save(null);
    const file = path.join(dir, 'alice.safetensors');
    assert.ok(fs.existsSync(file));
    await assert.rejects(pool.removeAgentAsync('alice'), kvmem.BusyError); // open: close it first
    assert.deepEqual(pool.agentIds(), ['alice']);
    a.close();
    const p = pool.removeAgentAsync('alice');
    assert.ok(p instanceof Promise);
    assert.throws(() => pool.close(), kvmem.BusyError); // in flight: the pool stays open under it
    assert.equal(await p, undefined);
    assert.deepEqual(pool.agentIds(), []);
    assert.equal(fs.existsSync(file), false);
    await assert.rejects(pool.removeAgentAsync('alice'), (e) => e instanceof kvmem.NotFoundError && /alice/.test(e.message));
    await assert.rejects(pool.removeAgentAsync('.hidden'), (e) => e instanceof kvmem.InvalidArgumentError && /agent id/.test(e.message));
    assert.throws(() => pool.removeAgentAsync('a\0b'), (e) => e instanceof kvmem.InvalidArgumentError && /NUL/.test(e.message));
    // a fresh pool over the store finds nothing to read back
    const pool2 = ctx.poolCreate(spec, { blockSize: BS, storageDtype: 'f32', storeDir: dir });
    assert.equal(pool2.agentOpen('alice').getInfo().nTokens, 0);
    ctx.close();
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
