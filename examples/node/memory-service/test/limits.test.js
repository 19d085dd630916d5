'use strict';
// The service as something to deploy: bounded agents, bodies, answers and
// memory (413 / 507 with a message, nothing changed), fair turns that a
// flooding client cannot take from another (429 beyond its queue), typed
// fields over HTTP, the binary tensor body, /healthz and the access log.
const test = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const { L, HKV, D, startService, stop, tokensKV, wordKV, queryFor, tensorBody, readTensorBody } = require('../testing/harness');

test('limits: tokens per agent, body and answer sizes are refused with 413 and change nothing', async () => {
  const { child, call } = await startService({ KVMEM_MAX_AGENT_TOKENS: '40', KVMEM_MAX_BODY_BYTES: '64K', KVMEM_MAX_RESPONSE_BYTES: '8K' });
  try {
    let r = await call('POST', '/agents/a/append', { k: tokensKV(1, 0, 32), v: tokensKV(1, 0, 32), flush: true });
    assert.equal(r.code, 200, JSON.stringify(r.body));
    r = await call('POST', '/agents/a/append', { k: tokensKV(1, 32, 16), v: tokensKV(1, 32, 16) });
    assert.equal(r.code, 413, JSON.stringify(r.body));
    assert.equal(r.body.error, 'too_large');
    assert.match(r.body.message, /agent 'a' holds 32 tokens: 16 more would pass the service's limit of 40 tokens per agent/);
    r = await call('POST', '/agents/a/append', { k: tokensKV(1, 32, 8), v: tokensKV(1, 32, 8), flush: true });
    assert.equal(r.code, 200, 'up to the limit is fine');
    assert.equal(r.body.n_tokens, 40);

    // a body over 64 KiB: refused before it is read, the agent as it was
    const big = new Array(70 * 1024 / 2).fill(1);
    r = await call('POST', '/agents/a/append', { k: big, v: big });
    assert.equal(r.code, 413);
    assert.match(r.body.message, /request body of \d+ bytes is over the service's limit of 65536/);
    r = await call('GET', '/agents/a');
    assert.equal(r.body.n_tokens, 40);

    // an answer over 8 KiB: 40 tokens x 32 floats x 2 gathered as JSON is; the blocks alone are not
    const q = queryFor('x');
    r = await call('POST', '/agents/a/retrieve', { query: q, top_k: 8, gather: true });
    assert.equal(r.code, 413, JSON.stringify(r.body));
    assert.match(r.body.message, /the answer would take up to \d+ bytes, over the service's limit of 8192: ask for fewer blocks \(top_k\), or for the gathered tensors as application\/x-kvmem-tensors/);
    r = await call('POST', '/agents/a/retrieve', { query: q, top_k: 8 });
    assert.equal(r.code, 200);
    assert.equal(r.body.blocks.length, 3);
    r = await call('POST', '/agents/a/retrieve', { query: q, top_k: 1, gather: true }, { accept: 'application/x-kvmem-tensors' });
    assert.equal(r.code, 200, 'one block as binary fits');
  } finally {
    await stop(child);
  }
});

test('limits: the memory budget bounds the pool: 507 with a message once it is full, nothing appended', async () => {
  // 16 MiB of the budget left for agents: 128 MiB for the runtime, 3 requests at work of 10 x 1 MiB + 3 x 64 KiB
  const budget = 128 * 2 ** 20 + 3 * (10 * 2 ** 20 + 3 * 65536) + 16 * 2 ** 20;
  const env = { KVMEM_MEMORY_BUDGET: String(budget), KVMEM_MAX_BODY_BYTES: '1M', KVMEM_MAX_RESPONSE_BYTES: '64K',
    KVMEM_WORKERS: '3', KVMEM_HEAD_DIM: '256', KVMEM_KV_HEADS: '8', KVMEM_Q_HEADS: '8' };
  const { child, call } = await startService(env);
  try {
    const h = await call('GET', '/health');
    assert.equal(h.body.limits.pool_capacity_bytes, 16 * 2 ** 20);
    // 16 tokens of [2][16][8][256] f32 = 256 KiB each for K and V (8 KiB per token held as f16)
    const T = 16, n = L * T * 8 * 256;
    const k = new Float32Array(n).fill(0.5);
    let i = 0, r;
    for (; i < 200; i++) {
      r = await call('POST', `/agents/a${i % 7}/append`, tensorBody({ flush: true }, { k, v: k }), { 'content-type': 'application/x-kvmem-tensors' });
      if (r.code !== 200) break;
    }
    assert.equal(r.code, 507, `after ${i} appends: ${JSON.stringify(r.body)}`);
    assert.equal(r.body.error, 'KVMEM_ERR_CAPACITY');
    assert.match(r.body.message, /pool capacity 16777216 bytes: .*nothing was appended/);
    const info = (await call('GET', '/health')).body.pool;
    assert.ok(info.used_bytes <= 16 * 2 ** 20, `${info.used_bytes} bytes held`);
    // each append holds 256 KiB of f16 KV and its block's box
    assert.ok(info.used_bytes >= 12 * 2 ** 20 && i >= 40, `${i} appends, ${info.used_bytes} bytes: the budget was used`);
    r = await call('GET', `/agents/a${i % 7}`);
    assert.equal(r.body.n_tokens, T * Math.floor(i / 7), 'the refused append added nothing');
  } finally {
    await stop(child);
  }
});

// a request whose body never finishes: it holds a slot (or waits for one)
function stuckRequest(base, client) {
  const u = new URL(base);
  const s = net.connect(Number(u.port), u.hostname);
  s.write(`POST /agents/${client}-stuck/append HTTP/1.1\r\nhost: x\r\nx-client-id: ${client}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{"k": [`);
  s.on('error', () => {});
  return s;
}

test('fair turns: a client with requests stuck in every slot it may hold gets 429 beyond its queue; another is served', async () => {
  const { child, base, call } = await startService({ KVMEM_WORKERS: '2', KVMEM_CLIENT_QUEUE: '2', KVMEM_CLIENT_HEADER: 'x-client-id' });
  const socks = [];
  try {
    socks.push(stuckRequest(base, 'flood'), stuckRequest(base, 'flood'));
    for (let i = 0; i < 250; i++) {
      const hz = await call('GET', '/healthz');
      if (hz.body.running + hz.body.queued === 2) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    const hz = await call('GET', '/healthz');
    assert.deepEqual([hz.body.running, hz.body.queued], [1, 1], 'one at work (its slot cap), one waiting');
    let r = await call('POST', '/agents/f/append', { k: wordKV(['x']), v: wordKV(['x']) }, { 'x-client-id': 'flood' });
    assert.equal(r.code, 429, JSON.stringify(r.body));
    assert.equal(r.headers.get('retry-after'), '1');
    assert.match(r.body.message, /client 'flood' has 2 requests in the service already/);
    r = await call('POST', '/agents/l/append', { k: wordKV(['x']), v: wordKV(['x']) }, { 'x-client-id': 'light' });
    assert.equal(r.code, 200, 'the other client takes the slot the flood may not hold');
  } finally {
    for (const s of socks) s.destroy();
    await stop(child);
  }
});

test('typed fields over HTTP: 400 for wrong types and bad escapes, never 500, never converted; the agent unchanged', async () => {
  const { child, call } = await startService();
  try {
    let r = await call('POST', '/agents/a/append', { k: wordKV(['a', 'b']), v: wordKV(['a', 'b']), token_ids: [1, 2], flush: true });
    assert.equal(r.code, 200);
    const k1 = wordKV(['c']);
    const bad = [
      ['POST', '/agents/a%ZZ/append', { k: k1, v: k1 }, /bad percent escape/],
      ['GET', '/agents/%E0%A4%A', undefined, /bad percent escape/],
      ['POST', '/agents/a/retrieve', { query: queryFor('a'), top_k: '1' }, /top_k must be an integer in \[0, 65536\], not a string/],
      ['POST', '/agents/a/append', { k: k1.map((x) => x === 1), v: k1 }, /k must be an array of numbers \(float32\): element 0 is a boolean/],
      ['POST', '/agents/a/append', { k: k1.map(String), v: k1 }, /element 0 is a string/],
      ['POST', '/agents/a/append', { k: k1, v: k1, token_ids: ['9'] }, /token_ids must be an array of 32-bit integers/],
      ['POST', '/agents/a/append', { k: k1, v: k1, flush: 'true' }, /flush must be true or false/],
      ['POST', '/agents/a/append', { k: k1, v: k1, path: 'x' }, /unknown field "path"/],
      ['POST', '/agents/a/append', [k1, k1], /the body must be a JSON object/],
    ];
    for (const [method, p, body, re] of bad) {
      r = await call(method, p, body);
      assert.equal(r.code, 400, `${method} ${p}: ${JSON.stringify(r.body).slice(0, 300)}`);
      assert.match(r.body.message, re, p);
    }
    r = await call('GET', '/agents/a');
    assert.deepEqual([r.body.n_tokens, r.body.n_blocks], [2, 1], 'nothing was appended');
    r = await call('POST', '/agents/nobody/retrieve', { query: queryFor('a') });
    assert.equal(r.code, 404, 'only append creates an agent');
    r = await call('GET', '/agents');
    assert.deepEqual(r.body.agents, ['a']);
  } finally {
    await stop(child);
  }
});

test('binary tensor body: an append and a gathered answer in application/x-kvmem-tensors equal their JSON twins', async () => {
  const { child, call } = await startService();
  try {
    const words = ['mountains', 'trip', 'june', 'sister', 'peanuts', 'allergy'];
    const k = wordKV(words), v = tokensKV(3, 0, words.length);
    const ids = words.map((_, i) => 100 + i);
    let r = await call('POST', '/agents/json/append', { k, v, token_ids: ids, text: words.join(' '), flush: true });
    assert.equal(r.code, 200);
    const body = tensorBody({ text: words.join(' '), flush: true }, { k: Float32Array.from(k), v: Float32Array.from(v), token_ids: Int32Array.from(ids) });
    r = await call('POST', '/agents/bin/append', body, { 'content-type': 'application/x-kvmem-tensors' });
    assert.equal(r.code, 200, JSON.stringify(r.body));
    assert.equal(r.body.n_tokens, words.length);
    const q = { query: queryFor('peanuts'), top_k: 1, gather: true, base_position: 3 };
    const a = await call('POST', '/agents/json/retrieve', q);
    const b = await call('POST', '/agents/bin/retrieve', tensorBody({ top_k: 1, gather: true, base_position: 3 }, { query: Float32Array.from(q.query) }),
      { 'content-type': 'application/x-kvmem-tensors', accept: 'application/x-kvmem-tensors' });
    assert.equal(b.code, 200);
    assert.equal(b.headers.get('content-type'), 'application/x-kvmem-tensors');
    const bb = readTensorBody(b.body);
    assert.deepEqual(bb.blocks, a.body.blocks);
    assert.deepEqual(bb.gathered.shape, [L, words.length, HKV, D]);
    // the same floats (JSON writes -0 as 0)
    assert.deepEqual(Array.from(bb.gathered.k, (x) => x + 0), a.body.gathered.k);
    assert.deepEqual(Array.from(bb.gathered.v, (x) => x + 0), a.body.gathered.v);
    // V is stored as given (small integers are exact in f16)
    assert.deepEqual(a.body.gathered.v, v);
    r = await call('POST', '/agents/bin/append', Buffer.from('not a tensor body'), { 'content-type': 'application/x-kvmem-tensors' });
    assert.equal(r.code, 400);
    assert.match(r.body.message, /header length \d+ exceeds the body/);
  } finally {
    await stop(child);
  }
});

test('/healthz answers ok with the store kind; each request leaves one JSON line in the access log', async () => {
  const { child, call } = await startService();
  try {
    let r = await call('GET', '/healthz');
    assert.equal(r.code, 200);
    assert.equal(r.body.status, 'ok');
    assert.equal(r.body.store, 'none');
    r = await call('POST', '/agents/a/append', { k: wordKV(['a']), v: wordKV(['a']) });
    assert.equal(r.code, 200);
    r = await call('GET', '/agents/zz');
    assert.equal(r.code, 404);
    await new Promise((res) => setTimeout(res, 50));
    const lines = child.out.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
    const ap = lines.find((l) => l.path === '/agents/a/append');
    assert.ok(ap, child.out);
    assert.equal(ap.method, 'POST');
    assert.equal(ap.status, 200);
    assert.equal(ap.client, '127.0.0.1');
    assert.ok(ap.in > 0 && ap.out > 0 && ap.ms >= 0 && ap.queue_ms >= 0 && !Number.isNaN(Date.parse(ap.time)));
    assert.equal(lines.find((l) => l.path === '/agents/zz').status, 404);
  } finally {
    await stop(child);
  }
});
