'use strict';
// A store that stalls holds up only the requests that need the pool, never the
// service's event loop: opening an agent asks the store whether it holds it,
// under the pool's mutex, as a spill to the store writes (and a directory
// store fsyncs) under it. Here Redis is stopped (SIGSTOP) while an append opens
// a new agent; another client's GET /agents must be answered before Redis
// resumes. Before the service opened agents on worker threads the event loop
// waited inside the open and answered nobody until then.
const test = require('node:test');
const assert = require('node:assert/strict');
const { startService, stop, tokensKV, startRedis } = require('../testing/harness');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// settles with its value or 'pending' after ms
const within = (p, ms) => Promise.race([p, sleep(ms).then(() => 'pending')]);

test('a stalled store holds up the request that opens an agent, not other clients (Redis stopped mid-open)', async (t) => {
  const redis = await startRedis();
  if (!redis) return t.skip('skipped: redis-server not found (apt-get install redis-server)');
  let stopped = false;
  const resume = () => { if (stopped) { process.kill(redis.pid, 'SIGCONT'); stopped = false; } };
  let svc;
  try {
    svc = await startService({ KVMEM_STORE: `${redis.url}?pool=stall&timeout_ms=60000`, KVMEM_CLIENT_HEADER: 'x-client', KVMEM_ACCESS_LOG: 'off' });
    const as = (client) => ({ 'x-client': client });
    const body = { k: tokensKV(1, 0, 4), v: tokensKV(1, 0, 4), token_ids: [1, 2, 3, 4] };
    assert.equal((await svc.call('POST', '/agents/first/append', body, as('a'))).code, 200);

    process.kill(redis.pid, 'SIGSTOP');
    stopped = true;
    const opening = svc.call('POST', '/agents/second/append', body, as('b')); // asks Redis whether 'second' exists
    // the open holds the pool's mutex while Redis is stopped: /health (the pool's
    // numbers, read under that mutex) stays unanswered once the open is in it
    let inOpen = false;
    for (let i = 0; i < 100 && !inOpen; i++) {
      const h = svc.call('GET', '/health', undefined, as('c'));
      inOpen = (await within(h, 300)) === 'pending';
      if (!inOpen) await sleep(50);
    }
    assert.ok(inOpen, 'the append reached the open while Redis was stopped');
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
  } finally {
    resume();
    if (svc) await stop(svc.child);
    await redis.stop();
  }
});
