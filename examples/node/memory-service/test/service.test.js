'use strict';
// Starts the memory service on a free loopback port, drives it over HTTP, stops it.
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const kvmem = require('kvmem');

const { L, HKV, D, SERVER, startService: start, caller, stop, wordKV, queryFor } = require('../testing/harness');

// storeDir: KVMEM_STORE_DIR for the service (undefined: none)
const startService = (storeDir) => start(storeDir === undefined ? {} : { KVMEM_STORE_DIR: storeDir });

test('memory service: append, flush, info, retrieve, save/load, errors', async () => {
  const store = fs.mkdtempSync(path.join(os.tmpdir(), 'kvmem-svc-store-'));
  const { child, base } = await startService(store);
  const call = caller(base);
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
    const q = queryFor('peanuts');
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
    // save and load go to the store directory, one file per agent
    for (const op of ['save', 'load']) {
      r = await call('POST', `/agents/alice/${op}`);
      if (!kvmem.hasFunction(`kvmem_agent_${op}`)) assert.equal(r.code, 501);
      else assert.equal(r.code, 200, JSON.stringify(r.body));
    }
    if (kvmem.hasFunction('kvmem_agent_save')) {
      assert.deepEqual(fs.readdirSync(store), ['alice.safetensors']);
      assert.equal(r.body.n_tokens, 12);
    }

    r = await call('DELETE', '/agents/bob');
    assert.equal(r.code, 200);
    r = await call('GET', '/agents');
    assert.deepEqual(r.body.agents, ['alice']);
  } finally {
    await stop(child);
    fs.rmSync(store, { recursive: true });
  }
});

// A client names an agent, never a file: requests that tried to write or
// read files anywhere (an absolute path, ../, /etc/passwd, an id that walks
// out of the store) are refused, write nothing, and no message repeats a
// file's bytes or the server's directories.
test('memory service: save/load cannot reach files outside the store', { skip: !kvmem.hasFunction('kvmem_agent_save') }, async () => {
  const store = fs.mkdtempSync(path.join(os.tmpdir(), 'kvmem-svc-store-'));
  const outside = fs.mkdtempSync(path.join(os.tmpdir(), 'kvmem-svc-outside-'));
  const { child, base } = await startService(store);
  const call = caller(base);
  try {
    let r = await call('POST', '/agents/alice/append', { k: wordKV(['a', 'b']), v: wordKV(['a', 'b']), flush: true });
    assert.equal(r.code, 200, JSON.stringify(r.body));
    // the first 8 bytes of /etc/passwd as the loader's old "header length", or the server's store path
    // (the client's own input may be quoted back)
    const leaks = (body) => {
      const m = JSON.stringify(body);
      return /3475222254926655346|root:x:0/.test(m) || m.includes(store);
    };
    const attacks = [
      ['save', '/agents/alice/save', { path: path.join(outside, 'evil.kvm') }, 400, /takes no body fields \(got "path"\)/],
      ['save', '/agents/alice/save', { path: '../../../../tmp/evil.kvm' }, 400, /takes no body fields/],
      ['save', '/agents/alice/save', { path: null }, 400, /takes no body fields/],
      ['save', '/agents/alice/save', { file: path.join(outside, 'evil.kvm') }, 400, /takes no body fields \(got "file"\)/],
      ['save', '/agents/alice/save', [path.join(outside, 'evil.kvm')], 400, /takes no body fields/],
      ['save', '/agents/alice/save', 'evil.kvm', 400, /takes no body fields/],
      ['load', '/agents/alice/load', { path: '/etc/passwd' }, 400, /takes no body fields/],
      ['load', '/agents/alice/load', { path: '../alice.safetensors' }, 400, /takes no body fields/],
      ['save', `/agents/${encodeURIComponent(path.join(outside, 'evil'))}/save`, undefined, 400, /agent id .* is invalid/],
      ['save', '/agents/..%2F..%2F..%2Ftmp%2Fevil/save', undefined, 400, /agent id .* is invalid/],
      ['load', '/agents/..%2F..%2F..%2F..%2Fetc%2Fpasswd/load', undefined, 400, /agent id .* is invalid/],
      ['load', '/agents/.hidden/load', undefined, 400, /agent id .* is invalid/],
      ['save', '/agents/alice%00-evil/save', undefined, 400, /contains a NUL/],
      ['load', '/agents/alice%00.safetensors/load', undefined, 400, /contains a NUL/],
    ];
    for (const [, route, body, code, msg] of attacks) {
      r = await call('POST', route, body);
      assert.equal(r.code, code, `${route} ${JSON.stringify(body)}: ${JSON.stringify(r.body)}`);
      assert.match(r.body.message, msg, route);
      assert.ok(!leaks(r.body), `${route}: the answer repeats file bytes or server paths: ${JSON.stringify(r.body)}`);
    }
    assert.deepEqual(fs.readdirSync(outside), [], 'nothing was written outside the store');
    assert.deepEqual(fs.readdirSync(store), [], 'and nothing in it either');
    r = await call('GET', '/agents');
    assert.deepEqual(r.body.agents, ['alice'], 'no agent was created by a refused request');
    // the honest requests still work, and a store file that is damaged is
    // reported without its bytes or the store's path
    r = await call('POST', '/agents/alice/save');
    assert.equal(r.code, 200, JSON.stringify(r.body));
    fs.writeFileSync(path.join(store, 'alice.safetensors'), 'root:x:0:0:root:/root:/bin/bash\n');
    r = await call('POST', '/agents/alice/load');
    assert.equal(r.code, 400, JSON.stringify(r.body));
    assert.equal(r.body.error, 'KVMEM_ERR_FORMAT');
    assert.match(r.body.message, /agent 'alice': the stored file is not a valid kvmem agent file/);
    assert.ok(!leaks(r.body), `a damaged store file: the answer repeats its bytes or the store path: ${JSON.stringify(r.body)}`);
    assert.match(child.log, /memory-service: load 'alice': /, 'the details go to the service log');
    r = await call('GET', '/agents/alice');
    assert.equal(r.body.n_tokens, 2, 'a failed load changes nothing');
  } finally {
    await stop(child);
    fs.rmSync(store, { recursive: true });
    fs.rmSync(outside, { recursive: true });
  }
});

test('memory service: without a store, save/load say so; a missing store directory stops it at startup', async () => {
  const { child, base } = await startService();
  const call = caller(base);
  try {
    for (const op of ['save', 'load']) {
      const r = await call('POST', `/agents/alice/${op}`);
      assert.equal(r.code, 501, JSON.stringify(r.body));
      if (kvmem.hasFunction(`kvmem_agent_${op}`)) assert.equal(r.body.error, 'no_store');
    }
  } finally {
    await stop(child);
  }
  const bad = spawn(process.execPath, [SERVER],
    { env: { ...process.env, PORT: '0', KVMEM_STORE_DIR: '/nonexistent/kvmem-store' }, stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  bad.stderr.on('data', (d) => { err += d; });
  const code = await new Promise((resolve) => bad.on('exit', resolve));
  assert.equal(code, 1);
  assert.match(err, /store directory \/nonexistent\/kvmem-store does not exist/);
});
