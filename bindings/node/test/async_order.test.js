'use strict';
// An `...Async` call is made when it is called: it marks its object busy at once, so
// a synchronous call on the same object made before the promise settles is refused
// with BusyError (it used to run first: appendAsync(k1); append(k2) stored k2
// before k1). Async calls on one object run in the order they were made. The
// inputs are copied when the call is made: appendAsync(buf); buf.fill(7) used to
// store the 7s.
const test = require('node:test');
const assert = require('node:assert/strict');
const kvmem = require('..');

const L = 2, HQ = 4, H = 2, D = 8, BS = 4;
const spec = { nLayers: L, nQHeads: HQ, nKvHeads: H, headDim: D };
const rows = (n, seed) => Float32Array.from({ length: n }, (_, i) => Math.cos(seed * 1000 + i));
const kv = (T, seed) => Float32Array.from({ length: L * T * H * D }, (_, i) => Math.sin(seed * 1000 + i));

function setup() {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const pool = ctx.poolCreate(spec, { blockSize: BS, storageDtype: 'f32' });
  return { ctx, pool, a: pool.agentOpen('alice') };
}

test('a synchronous call after an async one on the same agent is refused, and the async one runs', async () => {
  const { ctx, a } = setup();
  const k1 = kv(4, 1), k2 = kv(4, 2);
  const p = a.appendAsync(k1, k1, { text: 'first ' });
  assert.throws(() => a.append(k2, k2, { text: 'second' }), kvmem.BusyError);
  assert.throws(() => a.getInfo(), (e) => e instanceof kvmem.BusyError && /await it/.test(e.message));
  assert.throws(() => a.read(0, 1), kvmem.BusyError);
  assert.equal(a.id, 'alice', 'the id stays readable');
  await p;
  a.append(k2, k2, { text: 'second' });
  assert.equal(a.text(), 'first second');
  assert.deepEqual(a.read(0, 4).k, k1);
  assert.deepEqual(a.read(4, 4).k, k2);
  ctx.close();
});

test('async calls on one agent run in the order they were made', async () => {
  const { ctx, a } = setup();
  const parts = ['a', 'b', 'c', 'd', 'e', 'f'];
  const jobs = parts.map((t, i) => a.appendAsync(kv(1, i), kv(1, i), { text: t, tokenIds: [i] }));
  // a read with no count, made last, runs last: it sees every token appended before it
  const all = a.readAsync(0, undefined, { values: false });
  const first = a.readAsync(0, 1, { values: false });
  await Promise.all(jobs);
  const got = await all;
  assert.equal((await first).shape[1], 1);
  assert.equal(got.shape[1], parts.length);
  assert.equal(a.text(), parts.join(''));
  assert.deepEqual(Array.from(a.tokens()), parts.map((_, i) => i));
  for (let i = 0; i < parts.length; i++)
    for (let l = 0; l < L; l++)
      assert.deepEqual(got.k.subarray(((l * parts.length) + i) * H * D, ((l * parts.length) + i + 1) * H * D),
                       kv(1, i).subarray(l * H * D, (l + 1) * H * D));
  ctx.close();
});

test('the inputs of an async call are taken when it is made: the caller may reuse them at once', async () => {
  const { ctx, a } = setup();
  const k = kv(4, 3), want = k.slice();
  const ids = Int32Array.from([1, 2, 3, 4]);
  const text = Buffer.from('abcd');
  const p = a.appendAsync(k, k, { tokenIds: ids, text });
  k.fill(7); ids.fill(9); text.fill(0x7a);
  await p;
  assert.deepEqual(a.read(0, 4).k, want);
  assert.deepEqual(Array.from(a.tokens()), [1, 2, 3, 4]);
  assert.equal(a.text(), 'abcd');
  // a {data, shape} view and a Uint16Array of bf16 bits are copied too
  const u = new Uint16Array(L * 4 * H * D).fill(0x3f80); // bf16 1.0
  const q = a.appendAsync({ data: u, shape: [L, 4, H, D] }, { data: u, shape: [L, 4, H, D] }, { dtype: 'bf16' });
  u.fill(0);
  await q;
  assert.ok(a.read(4, 4).k.every((x) => x === 1));

  a.flush();
  const query = rows(2 * L * HQ * D, 4);
  const exclude = Int32Array.from([1]);
  const r = a.retrieveAsync(query, { topK: 1, exclude });
  query.fill(-1); exclude[0] = 0;
  const got = (await r).get();
  assert.deepEqual(got, a.retrieve(rows(2 * L * HQ * D, 4), { topK: 1, exclude: [1] }).get());
  assert.deepEqual(Array.from(got.blocks), [0]);

  const blocks = Int32Array.from([0]);
  const g = a.gatherAsync(blocks);
  blocks[0] = 1;
  assert.deepEqual((await g).k, a.gather([0]).k);
  ctx.close();
});

test('a retrieval result being filled is busy; attendAsync takes its turn on the agent', async () => {
  const { ctx, a } = setup();
  a.append(kv(8, 5), kv(8, 6));
  a.flush();
  const res = new kvmem.Retrieval();
  const q = rows(L * HQ * D, 7);
  const p = a.retrieveAsync(q, { topK: 1, result: res });
  assert.throws(() => res.get(), kvmem.BusyError);
  await p;
  assert.equal(res.get().blocks.length, 1);

  const qa = rows(HQ * D, 8);
  const want = kvmem.attend(ctx, qa, { agent: a, layer: 1 }).out;
  const k3 = kv(4, 9);
  const app = a.appendAsync(k3, k3);
  const att = kvmem.attendAsync(ctx, qa, { agent: a, layer: 1 }); // after the append
  assert.throws(() => kvmem.attend(ctx, qa, { agent: a, layer: 1 }), kvmem.BusyError);
  assert.throws(() => ctx.close(), kvmem.BusyError);
  await app;
  const after = (await att).out;
  assert.notDeepEqual(after, want, 'the attention saw the appended tokens');
  assert.deepEqual(after, kvmem.attend(ctx, qa, { agent: a, layer: 1 }).out);
  res.close();
  ctx.close();
});

test('a pool with an async sync running refuses synchronous calls until it settles', async (t) => {
  const dir = require('node:fs').mkdtempSync(require('node:path').join(require('node:os').tmpdir(), 'kvmem-order-'));
  t.after(() => require('node:fs').rmSync(dir, { recursive: true, force: true }));
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const pool = ctx.poolCreate(spec, { blockSize: BS, storageDtype: 'f32', storeDir: dir });
  const a = pool.agentOpen('alice');
  a.append(kv(4, 1), kv(4, 1));
  const p = pool.syncAsync();
  assert.throws(() => pool.getInfo(), kvmem.BusyError);
  await p;
  assert.equal(pool.getInfo().nAgents, 1);
  ctx.close();
});
