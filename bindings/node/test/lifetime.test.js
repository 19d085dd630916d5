'use strict';
// Ownership, closed handles, async calls keeping the event loop free, lookup errors.
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');
const kvmem = require('..');

const spec = { nLayers: 1, nQHeads: 2, nKvHeads: 1, headDim: 4 };

test('close is idempotent; owners close what they own; closed handles throw', () => {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const pool = ctx.poolCreate(spec);
  const a = pool.agentOpen('x');
  a.close(); a.close();
  assert.throws(() => a.flush(), { name: 'ClosedError', message: "Agent 'x' is closed" });
  const b = pool.agentOpen('x');
  assert.equal(b.id, 'x');
  assert.throws(() => pool.agentOpen('x'), kvmem.ExistsError);
  ctx.close();
  assert.ok(pool.closed && b.closed);
  assert.throws(() => pool.getInfo(), kvmem.ClosedError);
  ctx.close();
});

test('close while an async call runs is refused, then works', async () => {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const pool = ctx.poolCreate(spec, { storageDtype: 'f32' });
  const a = pool.agentOpen('y');
  const k = new Float32Array(4 * 64).fill(0.5);
  const p = a.appendAsync(k, k);
  assert.throws(() => a.close(), kvmem.BusyError);
  assert.throws(() => ctx.close(), kvmem.BusyError);
  await p;
  assert.equal(a.getInfo().nTokens, 64);
  ctx.close();
});

test('async calls let the event loop run', async () => {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const pool = ctx.poolCreate({ nLayers: 8, nQHeads: 8, nKvHeads: 8, headDim: 128 }, { storageDtype: 'f32' });
  const a = pool.agentOpen('big');
  const T = 256;
  const k = new Float32Array(8 * T * 8 * 128).fill(0.25);
  for (let i = 0; i < 4; i++) a.append(k, k);
  let ticks = 0;
  const timer = setInterval(() => ticks++, 0);
  const jobs = [];
  for (let i = 0; i < 20; i++) jobs.push(a.readAsync(0, 4 * T, { values: false }));
  const results = await Promise.all(jobs);
  clearInterval(timer);
  assert.equal(results[19].k[0], 0.25);
  assert.ok(ticks > 0, 'the event loop ran while the reads were in flight');
  ctx.close();
});

test('spec validation, pool parameters, unknown backends', () => {
  assert.throws(() => kvmem.specValidate({ nLayers: 1, nQHeads: 3, nKvHeads: 2, headDim: 4 }),
                (e) => e instanceof kvmem.InvalidArgumentError && /n_q_heads/.test(e.message));
  assert.throws(() => new kvmem.Context({ backend: 'nonsense' }), (e) => e.status === -4 && /nonsense/.test(e.message));
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  assert.throws(() => ctx.poolCreate(spec, { blockSize: 3 }), kvmem.InvalidArgumentError);
  assert.throws(() => ctx.poolCreate(spec, { blocksize: 4 }), TypeError);
  // a window shorter than nLayers would be read past its end by C: refused
  assert.throws(() => ctx.poolCreate({ ...spec, nLayers: 4, layerWindow: [0] }), /layerWindow has 1 entries, nLayers is 4/);
  const pool = ctx.poolCreate({ ...spec, nLayers: 2, layerWindow: [0, 8] });
  assert.equal(pool.spec.nLayers, 2);
  ctx.close();
});

test('free functions', () => {
  assert.equal(kvmem.version(), '0.1.0');
  assert.equal(kvmem.versionNumber(), 1000);
  assert.equal(kvmem.statusStr(-6), 'KVMEM_ERR_CLOSED');
  assert.equal(kvmem.dtypeName(kvmem.F16), 'f16');
  assert.ok(kvmem.agentIdValid('a.b-c_1') && !kvmem.agentIdValid('.x'));
  assert.ok(kvmem.backends().some(b => b.name === 'cpu' && b.available));
  const got = [];
  kvmem.logSet((lvl, msg) => got.push([lvl, msg]));
  assert.throws(() => new kvmem.Context({ backend: 'nonsense' }));
  kvmem.logSet(null);
  assert.ok(got.some(([, m]) => /nonsense/.test(m)), 'the failure was logged at debug level');
  assert.match(kvmem.lastError(), /nonsense/);
});

test('a missing library is reported with the places looked at', () => {
  const r = spawnSync(process.execPath, ['-e', `require(${JSON.stringify(path.join(__dirname, '..'))})`],
                      { env: { ...process.env, KVMEM_LIBRARY: '/nonexistent/libkvmem.so' }, encoding: 'utf8' });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /KVMEM_LIBRARY/);
  assert.match(r.stderr, /\/nonexistent\/libkvmem\.so \(no such file\)/);
});
