'use strict';
// A store that stalls holds up only the requests that need the pool, never the
// service's event loop: opening an agent asks the store whether it holds it,
// under the pool's mutex, as a spill to the store writes (and a directory
// store fsyncs) under it. Here Redis is stopped (SIGSTOP) while an append opens
// a new agent; another client's GET /agents must be answered before Redis
// resumes. Before the service opened agents on worker threads the event loop
// waited inside the open and answered nobody until then; the same for a DELETE,
// which removes the agent from the store under the pool's mutex.
const test = require('node:test');
const assert = require('node:assert/strict');
const { startService, stop, tokensKV, startRedis } = require('../testing/harness');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// settles with its value or 'pending' after ms
const within = (p, ms) => Promise.race([p, sleep(ms).then(() => 'pending')]);

// A call that holds the pool's mutex while Redis is stopped is in it once /health
// (the pool's numbers, read under that mutex) stays unanswered.
async function inPoolMutex(svc, headers) {
  for (let i = 0; i < 100; i++) {
    if ((await within(svc.call('GET', '/health', undefined, headers), 300)) === 'pending') return true;
    await sleep(50);
  }
  return false;
}

// fn({svc, as, pause, resume}) against a service on a Redis of its own (pool name
// `pool`); pause stops Redis (SIGSTOP), and it is resumed and everything stopped after.
async function withRedisService(t, pool, fn) {
  const redis = await startRedis();
  if (!redis) return t.skip('skipped: redis-server not found (apt-get install redis-server)');
  let stopped = false;
  const pause = () => { process.kill(redis.pid, 'SIGSTOP'); stopped = true; };
  const resume = () => { if (stopped) { process.kill(redis.pid, 'SIGCONT'); stopped = false; } };
  let svc;
  try {
    svc = await startService({ KVMEM_STORE: `${redis.url}?pool=${pool}&timeout_ms=60000`, KVMEM_CLIENT_HEADER: 'x-client', KVMEM_ACCESS_LOG: 'off' });
    await fn({ svc, as: (client) => ({ 'x-client': client }), pause, resume });
  } finally {
    resume();
    if (svc) await stop(svc.child);
    await redis.stop();
  }
}

test('a stalled store holds up the request that opens an agent, not other clients (Redis stopped mid-open)', (t) =>
  withRedisService(t, 'stall', async ({ svc, as, pause, resume }) => {
    const body = { k: tokensKV(1, 0, 4), v: tokensKV(1, 0, 4), token_ids: [1, 2, 3, 4] };
    assert.equal((await svc.call('POST', '/agents/first/append', body, as('a'))).code, 200);

    pause();
    const opening = svc.call('POST', '/agents/second/append', body, as('b')); // asks Redis whether 'second' exists
    assert.ok(await inPoolMutex(svc, as('c')), 'the append reached the open while Redis was stopped');
    // another client, on a route that needs neither the pool nor the store
    const list = await within(svc.call('GET', '/agents', undefined, as('d')), 10000);
    const answeredWhileStalled = list !== 'pending';
    resume();
    assert.ok(answeredWhileStalled, 'GET /agents was answered while another request waited for the store');
    assert.equal(list.code, 200);
    assert.deepEqual(list.body.agents, ['first']);
    const r = await opening;
    assert.equal(r.code, 200, JSON.stringify(r.body));
    assert.equal(r.body.n_tokens, 4);
  }));

test('a stalled store holds up a DELETE, not other clients (Redis stopped mid-remove)', (t) =>
  withRedisService(t, 'stall-del', async ({ svc, as, pause, resume }) => {
    const body = { k: tokensKV(1, 0, 4), v: tokensKV(1, 0, 4), token_ids: [1, 2, 3, 4], save: true };
    for (const id of ['doomed', 'kept']) assert.equal((await svc.call('POST', `/agents/${id}/append`, body, as('a'))).code, 200);

    pause();
    const removing = svc.call('DELETE', '/agents/doomed', undefined, as('b')); // removes it from Redis
    assert.ok(await inPoolMutex(svc, as('c')), 'the DELETE reached the store while Redis was stopped');
    const list = await within(svc.call('GET', '/agents', undefined, as('d')), 10000);
    const answeredWhileStalled = list !== 'pending';
    resume();
    assert.ok(answeredWhileStalled, 'GET /agents was answered while a DELETE waited for the store');
    assert.equal(list.code, 200);
    assert.deepEqual(list.body.agents, ['doomed', 'kept']); // not removed yet
    const r = await removing;
    assert.equal(r.code, 200, JSON.stringify(r.body));
    assert.deepEqual((await svc.call('GET', '/agents', undefined, as('d'))).body.agents, ['kept']);
    assert.equal((await svc.call('GET', '/agents/doomed', undefined, as('d'))).code, 404);
  }));
