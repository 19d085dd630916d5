'use strict';
// C memory freed by kvmem, the store and Node's Buffers must leave the RSS:
// glibc's defaults keep it in per-thread arenas and, once a large block was
// freed, carve later large blocks from them too. The service sets both at
// startup (lib/malloc.js). Each case runs in a fresh Node, so neither this
// runner's mallocs nor its environment decide the outcome.
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

const MALLOC = path.join(__dirname, '..', 'lib', 'malloc.js');

// runs `body` (a function's source, given m = lib/malloc.js) in a fresh Node
// without the MALLOC_ env variables but `env`; its JSON result
function fresh(body, env = {}) {
  const clean = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('MALLOC_')));
  const src = `const m = require(${JSON.stringify(MALLOC)}); Promise.resolve((${body})(m)).then((r) => process.stdout.write(JSON.stringify(r)));`;
  const r = spawnSync(process.execPath, ['-e', src], { env: { ...clean, ...env }, encoding: 'utf8', cwd: path.join(__dirname, '..') });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout);
}

const glibc = fresh(() => m.mallocArenas() >= 0);
const skip = glibc ? false : 'skipped: not glibc\'s malloc: nothing to tune';

test('malloc: threads that malloc for the first time share the service\'s arenas', { skip }, () => {
  // 8 codec-like worker threads, each allocating on its own thread
  const run = (tune) => fresh(`async (m) => {
    const { Worker } = require('node:worker_threads');
    const set = ${tune} ? m.tuneMalloc() : null;
    const before = m.mallocArenas();
    await Promise.all(Array.from({ length: 8 }, () => new Promise((resolve, reject) => {
      const w = new Worker('require("node:worker_threads").parentPort.postMessage(Buffer.alloc(1 << 16).length)', { eval: true });
      w.on('message', () => w.terminate().then(resolve)); w.on('error', reject);
    })));
    return { set, before, after: m.mallocArenas() };
  }`);
  const tuned = run(true);
  assert.deepEqual(tuned.set, { arenaMax: true, mmapThreshold: true });
  const allowed = Math.max(tuned.before, 2);
  assert.ok(tuned.after <= allowed, `${tuned.after} arenas after 8 threads malloced (${tuned.before} before, the service's limit 2)`);
  // the property is glibc's default to change: without the setting the threads get arenas of their own
  const untuned = run(false);
  assert.ok(untuned.after > allowed, `without tuning: ${untuned.after} arenas (the test would not tell)`);
});

test('malloc: a large block is mapped on its own even after a larger one was freed', { skip }, () => {
  // by default the threshold rises to a freed block's size (up to 32 MiB): the
  // 16 MiB block then comes from an arena and stays in the RSS once freed
  const sizes = (m) => [m.mappedOnItsOwn(24 << 20), m.mappedOnItsOwn(16 << 20), m.mappedOnItsOwn(4096)];
  assert.deepEqual(fresh(`(m) => { m.tuneMalloc(); return (${sizes})(m); }`), [1, 1, 0]);
  assert.deepEqual(fresh(`(m) => (${sizes})(m)`), [1, 0, 0], 'glibc\'s default, which the service changes');
});

test('malloc: MALLOC_ARENA_MAX and MALLOC_MMAP_THRESHOLD_ in the environment are left to it', { skip }, () => {
  const sizes = (m) => ({ set: m.tuneMalloc(), mapped: [m.mappedOnItsOwn(24 << 20), m.mappedOnItsOwn(16 << 20)] });
  // glibc reads the environment itself: a threshold of 32 MiB keeps both blocks in an arena
  let r = fresh(`${sizes}`, { MALLOC_MMAP_THRESHOLD_: String(32 << 20) });
  assert.deepEqual(r, { set: { arenaMax: true, mmapThreshold: false }, mapped: [0, 0] });
  r = fresh(`${sizes}`, { MALLOC_ARENA_MAX: '4' });
  assert.deepEqual(r, { set: { arenaMax: false, mmapThreshold: true }, mapped: [1, 1] });
});

test('malloc: the service sets both at startup and its threads share 2 arenas under concurrent large bodies', { skip }, async () => {
  const { startService, stop, tokensKV } = require('../testing/harness');
  const { child, call } = await startService({ KVMEM_WORKERS: '4', KVMEM_CLIENT_HEADER: 'x-client-id' });
  try {
    // JSON bodies over 64 KiB go to codec threads, the appends to worker threads
    const T = 1024;
    const rs = await Promise.all(Array.from({ length: 8 }, (_, i) => call('POST', `/agents/m${i}/append`,
      { k: tokensKV(i, 0, T), v: tokensKV(i + 1, 0, T), flush: true }, { 'x-client-id': `c${i}` })));
    for (const r of rs) assert.equal(r.code, 200, JSON.stringify(r.body));
    const h = await call('GET', '/health');
    assert.equal(h.body.malloc.arena_max, 2);
    assert.equal(h.body.malloc.mmap_threshold_bytes, 1 << 20);
    assert.ok(h.body.malloc.arenas >= 1 && h.body.malloc.arenas <= 2, `${h.body.malloc.arenas} malloc arenas in the service`);
  } finally {
    await stop(child);
  }
  // the environment's setting is left to it
  const { child: c2, call: call2 } = await startService({ MALLOC_ARENA_MAX: '4' });
  try {
    const h = await call2('GET', '/health');
    assert.equal(h.body.malloc.arena_max, null);
    assert.equal(h.body.malloc.mmap_threshold_bytes, 1 << 20);
  } finally {
    await stop(c2);
  }
});
