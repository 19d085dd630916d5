'use strict';
// Ids and paths with a NUL are refused before C sees them (C reads up to the
// NUL: agentOpen('alice\0-evil') used to open agent 'alice'), with
// InvalidArgumentError; an id that is not a string (a Buffer went to C as a
// pointer with no terminating NUL) is a TypeError. Nothing is created,
// removed or written by a refused call.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { pathToFileURL } = require('node:url');
const kvmem = require('..');

const L = 1, H = 1, D = 8;
const setup = (params = {}) => {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  return { ctx, pool: ctx.poolCreate({ nLayers: L, nQHeads: 2, nKvHeads: H, headDim: D }, { blockSize: 4, ...params }) };
};
const refused = (fn, what) =>
  assert.throws(fn, (e) => e instanceof kvmem.InvalidArgumentError && e instanceof Error && e.code === 'KVMEM_ERR_INVALID_ARG' &&
    e.message.includes('NUL') && e.message.includes(what));

test('agent ids with a NUL are refused; nothing is opened or removed', () => {
  const { ctx, pool } = setup();
  for (const bad of ['alice\0-evil', '\0', 'alice\0']) refused(() => pool.agentOpen(bad), 'agent id');
  assert.deepEqual(pool.agentIds(), []);
  pool.agentOpen('alice').close();
  refused(() => pool.removeAgent('alice\0-evil'), 'agent id');
  assert.deepEqual(pool.agentIds(), ['alice']);
  assert.equal(kvmem.agentIdValid('alice'), true);
  assert.equal(kvmem.agentIdValid('alice\0-evil'), false);
  ctx.close();
});

test('ids that are not strings are a TypeError', () => {
  const { ctx, pool } = setup();
  for (const bad of [Buffer.from('bob'), new Uint8Array([98, 111, 98]), null, undefined, 7, ['bob'], { id: 'bob' }]) {
    assert.throws(() => pool.agentOpen(bad), (e) => e instanceof TypeError && /agent id must be a string/.test(e.message));
    assert.throws(() => pool.removeAgent(bad), TypeError);
  }
  assert.deepEqual(pool.agentIds(), []);
  ctx.close();
});

test('paths with a NUL are refused and nothing is written', { skip: !kvmem.hasFunction('kvmem_agent_save') }, () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvmem-node-nul-'));
  const { ctx, pool } = setup({ storageDtype: 'f32' });
  const a = pool.agentOpen('alice');
  const k = Float32Array.from({ length: L * 5 * H * D }, (_, i) => i);
  a.append(k, k.map((x) => -x));
  const target = path.join(dir, 'alice.kvm');
  refused(() => a.save(`${target}\0.bak`), 'path');
  refused(() => a.saveAsync(`${target}\0.bak`), 'path'); // argument errors throw at the call, as appendAsync's do
  assert.deepEqual(fs.readdirSync(dir), []);
  assert.throws(() => a.save(Buffer.from(target)), (e) => e instanceof TypeError && /path must be a string/.test(e.message));
  assert.deepEqual(fs.readdirSync(dir), []);
  a.save(pathToFileURL(target)); // a file: URL, as node:fs takes it
  a.load(target);
  assert.deepEqual(a.read().v, k.map((x) => -x));
  refused(() => a.load(`${target}\0`), 'path');
  refused(() => a.loadAsync(`${target}\0`), 'path');
  refused(() => setup({ storeDir: `${dir}\0/elsewhere` }), 'storeDir');
  ctx.close();
  fs.rmSync(dir, { recursive: true });
});

test('other names with a NUL are refused', () => {
  refused(() => new kvmem.Context({ backend: 'cpu\0cuda' }), 'backend');
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  refused(() => ctx.poolCreate({ nLayers: L, nQHeads: 2, nKvHeads: H, headDim: D, modelId: 'llama\0-other' }), 'modelId');
  const pool = ctx.poolCreate({ nLayers: L, nQHeads: 2, nKvHeads: H, headDim: D });
  refused(() => pool.segmentsCreate('robot\0x'), 'owner');
  assert.deepEqual(pool.agentIds(), []);
  const segs = pool.segmentsCreate('robot');
  refused(() => segs.add('tool\0s', 0), 'segment name');
  assert.equal(segs.add('tools', 0), 0);
  refused(() => segs.find('tools\0x'), 'segment name');
  assert.equal(segs.find('tools'), 0);
  segs.close();
  if (kvmem.hasFunction('kvmem_qmem_store_create')) {
    refused(() => kvmem.QmemHead.load('/tmp/head\0.safetensors'), 'path');
    const store = new kvmem.QmemStore({ nLayers: L, nQHeads: 2, nKvHeads: H, headDim: D }, { capacity: 2 });
    refused(() => store.sessionKey({ sessionId: 'chat-1\0x' }), 'sessionId');
    assert.equal(store.sessionKey({ sessionId: 'chat-1' }).kind, kvmem.SESSION_EXPLICIT);
    store.close();
  }
  ctx.close();
});
