'use strict';
// The shared scenario: the same calls as bindings/fixture/scenario.c, through
// the binding, must give exactly what the C program recorded.
const test = require('node:test');
const assert = require('node:assert/strict');
const kvmem = require('..');
const { L, HQ, HKV, D, BS, AGENTS, fixture, kv, value } = require('./scenario');

const f32 = (xs) => Float32Array.from(xs);

function appendTurn(spec, agent, salt, g0, n, rotated, text, async) {
  const { k, v } = kv(salt, g0, n);
  const tokenIds = Int32Array.from({ length: n }, (_, t) => salt * 1000 + g0 + t);
  const len = Buffer.byteLength(text);
  const tokenTextOffsets = Array.from({ length: n }, (_, t) => Math.floor(t * len / n));
  let positions;
  if (rotated) {
    positions = Int32Array.from({ length: n }, (_, t) => g0 + t + 100);
    const rows = Int32Array.from({ length: L * n * HKV }, (_, r) => positions[Math.floor(r / HKV) % n]);
    kvmem.ropeApply(spec, k, rows);
  }
  const opts = { tokenIds, text, tokenTextOffsets, positions };
  return async ? agent.appendAsync(k, v, opts) : agent.append(k, v, opts);
}

for (const mode of ['sync', 'async']) {
  test(`scenario matches the C fixture (${mode})`, async () => {
    const fx = fixture();
    const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
    const spec = kvmem.modelSpec({ nLayers: L, nQHeads: HQ, nKvHeads: HKV, headDim: D, modelId: 'scenario' });
    const pool = ctx.poolCreate(spec, { blockSize: BS, storageDtype: 'f16' });
    const agents = {};
    const done = {};
    for (const [id] of AGENTS) { agents[id] = pool.agentOpen(id); done[id] = 0; }
    for (let ti = 0; ti < 3; ti++)
      for (const [id, salt, turns] of AGENTS) {
        if (ti >= turns.length) continue;
        const [n, rot, text] = turns[ti];
        await appendTurn(spec, agents[id], salt, done[id], n, rot, text, mode === 'async');
        done[id] += n;
      }
    for (const a of Object.values(agents)) a.flush();

    const info = pool.getInfo();
    assert.equal(info.nAgents, fx.pool.n_agents);
    assert.equal(info.usedBytes, fx.pool.used_bytes);
    assert.deepEqual(pool.agentIds(), fx.pool.agent_ids);

    for (const [id, a] of Object.entries(agents)) {
      const want = fx.agents[id];
      const ai = a.getInfo();
      assert.deepEqual([ai.nTokens, ai.nBlocks, ai.nSealed, ai.bytes, ai.textBytes],
                       [want.n_tokens, want.n_blocks, want.n_sealed, want.bytes, want.text_bytes]);
      const r = mode === 'async' ? await a.readAsync() : a.read();
      assert.deepEqual(r.shape, [L, want.n_tokens, HKV, D]);
      assert.deepEqual(r.k, f32(want.k));
      assert.deepEqual(r.v, f32(want.v));
      assert.deepEqual(Array.from(a.tokens()), want.tokens);
      assert.equal(a.text(), want.text);
      want.blocks.forEach((wb, b) => {
        const bi = a.blockInfo(b);
        assert.deepEqual([bi.firstToken, bi.nTokens, bi.sealed], [wb.first_token, wb.n_tokens, wb.sealed === 1]);
        if (wb.sealed) {
          const { min, max } = a.blockAabb(b);
          assert.deepEqual(min, f32(wb.aabb_min));
          assert.deepEqual(max, f32(wb.aabb_max));
        }
      });
    }

    // retrieval: the same query rows as the fixture program, then a gather at 50
    const rq = new Float32Array(2 * L * HQ * D);
    for (let i = 0, n = 0; i < 2; i++) for (let l = 0; l < L; l++) for (let h = 0; h < HQ; h++) for (let d = 0; d < D; d++) rq[n++] = value(7, l, i, h, d, 7919, 2003);
    const wr = fx.retrieve;
    const res = mode === 'async' ? await agents.alice.retrieveAsync(rq, { topK: 2 }) : agents.alice.retrieve(rq, { topK: 2 });
    const got = res.get(0);
    assert.equal(res.nSets, wr.n_sets);
    assert.equal(res.nTokens(0), wr.n_tokens);
    assert.deepEqual(Array.from(got.blocks), wr.blocks);
    assert.deepEqual(got.scores, f32(wr.scores));
    assert.deepEqual(res.blockScores(0), f32(wr.block_scores));
    assert.deepEqual(Array.from(res.view(0).blocks), wr.blocks);
    const g = mode === 'async' ? await agents.alice.gatherAsync(got.blocks, 50) : agents.alice.gather(got.blocks, 50);
    assert.deepEqual(g.k, f32(wr.gather_k));
    assert.deepEqual(g.v, f32(wr.gather_v));
    agents.bob.retrieve(rq, { topK: 1, scope: kvmem.SCOPE_PER_LAYER, result: res });
    assert.equal(res.nSets, L);
    wr.bob_per_layer.forEach((ws, set) => {
      const gs = res.get(set);
      assert.deepEqual(Array.from(gs.blocks), ws.blocks);
      assert.deepEqual(gs.scores, f32(ws.scores));
    });
    res.close();

    // bad input: the C status and message reach the caller, nothing changes
    const errs = fx.errors;
    const alice = agents.alice;
    const before = alice.getInfo().nTokens;
    const { k, v } = kv(9, 0, 3);
    v[((1 * 3 + 2) * HKV + 0) * D + 0] = NaN;
    const expectErr = (e, want, cls) => {
      assert.ok(e instanceof cls, `${e.name} is not ${cls.name}`);
      assert.ok(e instanceof kvmem.KvmemError);
      assert.equal(e.status, want.status);
      assert.equal(e.code, want.name);
      assert.equal(e.message, want.message);
      return true;
    };
    if (mode === 'async') await assert.rejects(alice.appendAsync(k, v), (e) => expectErr(e, errs.append_nan, kvmem.InvalidArgumentError));
    else assert.throws(() => alice.append(k, v), (e) => expectErr(e, errs.append_nan, kvmem.InvalidArgumentError));
    assert.equal(alice.getInfo().nTokens, before);
    assert.throws(() => pool.agentOpen('bad id!'), (e) => expectErr(e, errs.open_bad_id, kvmem.InvalidArgumentError));
    assert.throws(() => pool.removeAgent('bob'), (e) => expectErr(e, errs.remove_open, kvmem.BusyError));
    if (mode === 'async') await assert.rejects(alice.readAsync(13, 2, { values: false }), (e) => expectErr(e, errs.read_past_end, kvmem.InvalidArgumentError));
    else assert.throws(() => alice.read(13, 2, { values: false }), (e) => expectErr(e, errs.read_past_end, kvmem.InvalidArgumentError));

    agents.bob.close();
    agents.bob.close(); // idempotent
    pool.removeAgent('bob');
    const after = pool.getInfo();
    assert.deepEqual([after.nAgents, after.usedBytes], [fx.after_remove.n_agents, fx.after_remove.used_bytes]);
    assert.throws(() => agents.bob.getInfo(), kvmem.ClosedError);
    ctx.close(); // closes the pool, which closes alice
    assert.ok(alice.closed && pool.closed && ctx.closed);
  });
}
