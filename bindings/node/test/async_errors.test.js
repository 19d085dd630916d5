'use strict';
// A failed async call rejects with the message of its own failure, taken on the
// object it was made on (kvmem_agent_last_error and co), and is never run again.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const kvmem = require('..');

const L = 2, H = 2, D = 8;
const spec = { nLayers: L, nQHeads: 4, nKvHeads: H, headDim: D };

function agentWith(T) {
  const ctx = new kvmem.Context({ backend: 'cpu' });
  const pool = ctx.poolCreate(spec, { blockSize: 4, storageDtype: 'f32' });
  const a = pool.agentOpen('alice');
  const k = Float32Array.from({ length: L * T * H * D }, (_, i) => Math.sin(i));
  a.append(k, k);
  return { ctx, a };
}

test('an async failure carries its own message, the same as the sync call', async () => {
  const { ctx, a } = agentWith(8);
  let sync;
  try { a.read(0, 1000); } catch (e) { sync = e; }
  assert.ok(sync instanceof kvmem.InvalidArgumentError);
  await assert.rejects(a.readAsync(0, 1000), (e) => e instanceof kvmem.InvalidArgumentError && e.message === sync.message);
  ctx.close();
});

test('concurrent failing async calls each get their own message', async () => {
  const { ctx, a } = agentWith(8);
  const ns = [100, 200, 300, 400, 500, 600, 700, 800];
  const results = await Promise.allSettled(ns.map((n) => a.readAsync(0, n)));
  results.forEach((r, i) => {
    assert.equal(r.status, 'rejected');
    assert.match(r.reason.message, new RegExp(`tokens \\[0, ${ns[i]}\\) outside \\[0, 8\\)`));
  });
  ctx.close();
});

test('a failed async call runs once: kvmem logs one failure for it', async () => {
  const { ctx, a } = agentWith(8);
  const failures = [];
  kvmem.logSet((level, msg) => { if (/kvmem_agent_read: tokens/.test(msg)) failures.push(msg); });
  try {
    await assert.rejects(a.readAsync(0, 999), kvmem.InvalidArgumentError);
  } finally {
    kvmem.logSet(null);
  }
  assert.equal(failures.length, 1, failures.join('\n'));
  ctx.close();
});

test('a failure whose cause clears before the promise settles is reported, not redone', async () => {
  // save into a directory that does not exist; the log callback (run on the
  // main thread while the worker waits, right after the failure) creates it.
  // A binding that re-ran the failed call to learn its message would now
  // succeed and write the file.
  const { ctx, a } = agentWith(8);
  const dir = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'kvmem-node-')), 'later');
  const file = path.join(dir, 'alice.safetensors');
  kvmem.logSet(() => { fs.mkdirSync(dir, { recursive: true }); });
  try {
    await assert.rejects(a.saveAsync(file), (e) => e instanceof kvmem.KvmemError && e.message.includes('later'));
  } finally {
    kvmem.logSet(null);
  }
  assert.ok(fs.existsSync(dir), 'the cause cleared');
  assert.ok(!fs.existsSync(file), 'the failed save was not run again');
  await a.saveAsync(file); // and now it works, once asked
  assert.ok(fs.existsSync(file));
  fs.rmSync(path.dirname(dir), { recursive: true, force: true });
  ctx.close();
});
