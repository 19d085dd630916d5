'use strict';
// Starts the memory service on a free loopback port, drives it over HTTP, stops it.
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const path = require('node:path');
const kvmem = require(path.join(__dirname, '..', '..', '..', '..', 'bindings', 'node'));

const L = 2, HQ = 4, HKV = 2, D = 8;

function startService() {
  const child = spawn(process.execPath, [path.join(__dirname, '..', 'server.js')], {
    env: { ...process.env, HOST: '127.0.0.1', PORT: '0', KVMEM_LAYERS: L, KVMEM_Q_HEADS: HQ, KVMEM_KV_HEADS: HKV, KVMEM_HEAD_DIM: D },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return new Promise((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
      if (m) resolve({ child, base: m[1] });
    });
    child.on('exit', (code) => reject(new Error(`service exited (${code}) before listening: ${out}`)));
  });
}

// a token's key: one-hot in a dimension chosen by the word, per layer and head
function wordKV(words) {
  const k = new Array(L * words.length * HKV * D).fill(0);
  words.forEach((w, t) => {
    const h0 = [...w].reduce((a, c) => (a * 31 + c.charCodeAt(0)) >>> 0, 7);
    for (let l = 0; l < L; l++) for (let h = 0; h < HKV; h++) k[((l * words.length + t) * HKV + h) * D + ((h0 >>> (l + h)) % D)] = 1;
  });
  return k;
}

test('memory service: append, flush, info, retrieve, save/load, errors', async () => {
  const { child, base } = await startService();
  const call = async (method, p, body) => {
    const r = await fetch(base + p, { method, headers: { 'content-type': 'application/json' }, body: body && JSON.stringify(body) });
    return { code: r.status, body: await r.json() };
  };
  try {
    let r = await call('GET', '/health');
    assert.equal(r.code, 200);
    assert.equal(r.body.version, kvmem.version());
    assert.equal(r.body.spec.head_dim, D);

    const turns = [['mountains', 'trip', 'june', 'hike'], ['sister', 'peanuts', 'allergy'], ['budget', 'euros', 'hotel', 'lake', 'quiet']];
    let tokens = 0;
    for (const words of turns) {
      const k = wordKV(words);
      r = await call('POST', '/agents/alice/append', { k, v: k.map((x) => x / 2), token_ids: words.map((_, i) => tokens + i), text: words.join(' '), flush: true });
      assert.equal(r.code, 200, JSON.stringify(r.body));
      tokens += words.length;
      assert.equal(r.body.n_tokens, tokens);
    }
    assert.equal(r.body.n_sealed, 3);
    r = await call('POST', '/agents/bob/append', { k: wordKV(['x']), v: wordKV(['x']) });
    assert.equal(r.code, 200);
    r = await call('GET', '/agents');
    assert.deepEqual(r.body.agents, ['alice', 'bob']);
    r = await call('GET', '/agents/alice');
    assert.deepEqual([r.body.n_tokens, r.body.n_blocks], [12, 3]);

    // bad input: kvmem's own message reaches the HTTP client, nothing changes
    r = await call('POST', '/agents/alice/append', { k: [1, 2, 3], v: [1, 2, 3] });
    assert.equal(r.code, 400);
    assert.match(r.body.message, /not a whole tensor/);
    const bad = wordKV(['a']);
    bad[3] = 1e30; // beyond the f16 storage range
    r = await call('POST', '/agents/alice/append', { k: bad, v: bad });
    assert.equal(r.code, 400);
    assert.equal(r.body.error, 'KVMEM_ERR_INVALID_ARG');
    assert.match(r.body.message, /exceeds the f16 storage range/);
    r = await call('POST', '/agents/bad%20id/append', { k: bad, v: bad });
    assert.equal(r.code, 400);
    assert.match(r.body.message, /agent id 'bad id' is invalid/);
    r = await call('GET', '/agents/alice');
    assert.equal(r.body.n_tokens, 12);
    r = await call('GET', '/agents/nobody');
    assert.equal(r.code, 404);

    // retrieve: a query about the sister finds her turn's block (501 before retrieval landed)
    const q = [];
    const qk = wordKV(['peanuts']);
    for (let l = 0; l < L; l++) for (let hq = 0; hq < HQ; hq++) for (let d = 0; d < D; d++) q.push(qk[(l * HKV + Math.floor(hq / (HQ / HKV))) * D + d]);
    r = await call('POST', '/agents/alice/retrieve', { query: q, top_k: 1, gather: true, base_position: 5 });
    if (!kvmem.hasFunction('kvmem_retrieve')) {
      assert.equal(r.code, 501);
    } else {
      assert.equal(r.code, 200, JSON.stringify(r.body));
      assert.equal(r.body.blocks.length, 1);
      assert.equal(r.body.blocks[0].block, 1);
      assert.deepEqual(r.body.blocks[0].token_ids, [4, 5, 6]);
      assert.deepEqual(r.body.gathered.shape, [L, 3, HKV, D]);
    }
    const file = path.join(require('node:fs').mkdtempSync(path.join(require('node:os').tmpdir(), 'kvmem-svc-')), 'alice.kvm');
    for (const op of ['save', 'load']) {
      r = await call('POST', `/agents/alice/${op}`, { path: file });
      if (!kvmem.hasFunction(`kvmem_agent_${op}`)) assert.equal(r.code, 501);
      else assert.equal(r.code, 200, JSON.stringify(r.body));
    }

    r = await call('DELETE', '/agents/bob');
    assert.equal(r.code, 200);
    r = await call('GET', '/agents');
    assert.deepEqual(r.body.agents, ['alice']);
  } finally {
    child.kill('SIGTERM');
    const code = await new Promise((resolve) => child.on('exit', (c, sig) => resolve(c ?? sig)));
    assert.equal(code, 0, 'the service stops cleanly on SIGTERM');
  }
});
