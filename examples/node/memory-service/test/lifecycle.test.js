'use strict';
// Restarts and races: SIGTERM saves every agent before the service exits, a
// restarted service lists and serves what its store holds, append's save
// survives kill -9, a DELETE racing other requests never makes them fail
// with 500, and the same against a Redis store.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const { startService, stop, tokensKV, queryFor, tmpdir, startRedis } = require('../testing/harness');

// the token ids of every sealed block of an agent, in token order
async function storedIds(call, id) {
  const info = await call('GET', `/agents/${id}`);
  assert.equal(info.code, 200, `${id}: ${JSON.stringify(info.body)}`);
  const r = await call('POST', `/agents/${id}/retrieve`, { query: queryFor('x'), top_k: info.body.n_sealed });
  assert.equal(r.code, 200, JSON.stringify(r.body));
  return r.body.blocks.sort((a, b) => a.first_token - b.first_token).flatMap((b) => b.token_ids);
}
const range = (a, n) => Array.from({ length: n }, (_, i) => a + i);
const append = (call, id, first, n, extra = {}) =>
  call('POST', `/agents/${id}/append`, { k: tokensKV(id.length, first, n), v: tokensKV(id.length, first, n), token_ids: range(first, n), flush: true, ...extra });

async function restartKeeps(storeEnv) {
  let svc = await startService(storeEnv);
  try {
    for (const [id, n] of [['alice', 5], ['bob', 3]]) assert.equal((await append(svc.call, id, 0, n)).code, 200);
    assert.equal((await svc.call('POST', '/agents/bob/save')).code, 200);
    assert.equal((await append(svc.call, 'bob', 3, 2)).code, 200, 'changed after its save');
  } finally {
    await stop(svc.child); // SIGTERM: exit 0 once everything is saved
  }
  assert.match(svc.child.log, /SIGTERM: finishing the requests at work and saving the agents/);
  svc = await startService(storeEnv);
  try {
    const r = await svc.call('GET', '/agents');
    assert.deepEqual(r.body.agents, ['alice', 'bob'], 'the store\'s agents are listed after a restart');
    assert.deepEqual(await storedIds(svc.call, 'alice'), range(0, 5), 'never saved before SIGTERM');
    assert.deepEqual(await storedIds(svc.call, 'bob'), range(0, 5), 'changed after its save');
    assert.equal((await svc.call('DELETE', '/agents/alice')).code, 200);
  } finally {
    await stop(svc.child);
  }
  svc = await startService(storeEnv);
  try {
    assert.deepEqual((await svc.call('GET', '/agents')).body.agents, ['bob'], 'a deleted agent is gone from the store');
    assert.equal((await svc.call('GET', '/agents/alice')).code, 404);
  } finally {
    await stop(svc.child);
  }
}

test('restart: SIGTERM saves every agent, and a restarted service lists and serves the store\'s agents (directory)', async () => {
  const store = tmpdir('store');
  try {
    await restartKeeps({ KVMEM_STORE_DIR: store });
  } finally {
    fs.rmSync(store, { recursive: true });
  }
});

test('restart: the same with a redis:// store', async (t) => {
  const redis = await startRedis();
  if (!redis) return t.skip('skipped: redis-server not found (apt-get install redis-server)');
  try {
    await restartKeeps({ KVMEM_STORE: `${redis.url}/0?pool=svc-test` });
    const svc = await startService({ KVMEM_STORE: `${redis.url}?pool=svc-test` });
    try {
      let r = await svc.call('GET', '/healthz');
      assert.deepEqual([r.code, r.body.status, r.body.store], [200, 'ok', 'redis']);
      await redis.stop();
      r = await svc.call('GET', '/healthz');
      assert.equal(r.code, 503);
      assert.equal(r.body.status, 'store_unavailable');
      // the store is away: a save is refused as unavailable (503), not as a server bug
      r = await append(svc.call, 'carol', 0, 2, { save: true });
      assert.equal(r.code, 503, JSON.stringify(r.body));
      assert.equal(r.body.error, 'KVMEM_ERR_IO');
    } finally {
      svc.child.kill('SIGKILL');
      await svc.child.exited;
    }
  } finally {
    await redis.stop();
  }
});

test('kill -9: what append acknowledged with saved: true is there after the restart; expect_tokens refuses a stale append', async () => {
  const store = tmpdir('store');
  try {
    let svc = await startService({ KVMEM_STORE_DIR: store });
    let r = await append(svc.call, 'dave', 0, 4, { save: true });
    assert.equal(r.code, 200, JSON.stringify(r.body));
    assert.equal(r.body.saved, true);
    r = await append(svc.call, 'dave', 4, 4); // not saved: may be lost
    assert.equal(r.code, 200);
    await stop(svc.child, 'SIGKILL');
    svc = await startService({ KVMEM_STORE_DIR: store });
    try {
      r = await svc.call('GET', '/agents/dave');
      assert.equal(r.body.n_tokens, 4);
      // a client that believed dave held 8 tokens is told, and nothing is appended
      r = await append(svc.call, 'dave', 8, 2, { expect_tokens: 8 });
      assert.equal(r.code, 409);
      assert.match(r.body.message, /agent 'dave' holds 4 tokens, the request expected 8/);
      r = await append(svc.call, 'dave', 4, 2, { expect_tokens: 4 });
      assert.equal(r.code, 200);
      assert.deepEqual(await storedIds(svc.call, 'dave'), range(0, 6));
    } finally {
      await stop(svc.child);
    }
  } finally {
    fs.rmSync(store, { recursive: true });
  }
});

test('races: DELETE while other requests use the agent answers each of them 200 or 404, never 500', async () => {
  const store = tmpdir('store');
  // one client sends up to 180 requests at once here: room for them in its queue
  const { child, call } = await startService({ KVMEM_STORE_DIR: store, KVMEM_CLIENT_QUEUE: '1000' });
  const pause = (ms) => new Promise((r) => setTimeout(r, ms));
  try {
    const codes = {};
    for (let round = 0; round < 10; round++) {
      const id = `r${round % 3}`;
      await append(call, id, 0, 2048);
      // a save (written and fsynced) keeps the agent busy; the DELETE and the rest, before it and after, arrive meanwhile
      const reqs = [call('POST', `/agents/${id}/save`)];
      const others = () => reqs.push(call('GET', `/agents/${id}`), call('POST', `/agents/${id}/flush`),
        call('POST', `/agents/${id}/retrieve`, { query: queryFor('x'), top_k: 2 }), call('POST', `/agents/${id}/save`));
      await pause(1);
      for (let i = 0; i < 4; i++) others();
      reqs.push(call('DELETE', `/agents/${id}`));
      for (let i = 0; i < 4; i++) others();
      reqs.push(append(call, id, 0, 1));
      for (const r of await Promise.all(reqs)) {
        codes[r.code] = (codes[r.code] ?? 0) + 1;
        assert.ok(r.code === 200 || r.code === 404, `round ${round}: ${r.code} ${JSON.stringify(r.body)}`);
      }
      await call('DELETE', `/agents/${id}`);
    }
    assert.ok(codes[200] > 0 && codes[404] > 0, JSON.stringify(codes));
    // a stable agent stays visible while others are created and deleted around it
    await append(call, 'stable', 0, 3);
    const churn = [];
    for (let i = 0; i < 60; i++) churn.push(append(call, `c${i % 6}`, 0, 1), call('DELETE', `/agents/c${(i + 3) % 6}`), call('GET', '/agents/stable'));
    for (const r of await Promise.all(churn)) assert.ok(r.code === 200 || (r.code === 404 && r.body.message !== "no agent 'stable'"), JSON.stringify(r.body));
  } finally {
    await stop(child);
    fs.rmSync(store, { recursive: true });
  }
});
