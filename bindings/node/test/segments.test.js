'use strict';
// KEEP segments through the binding: lifecycle, events, KV hand-over, plan,
// k-means, multi-hop, load plan, errors.
const test = require('node:test');
const assert = require('node:assert/strict');
const kvmem = require('..');

const L = 2, H = 2, D = 8;
function setup() {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const pool = ctx.poolCreate({ nLayers: L, nQHeads: 4, nKvHeads: H, headDim: D }, { blockSize: 4 });
  return { ctx, pool };
}

test('segment store lifecycle', () => {
  const { ctx, pool } = setup();
  const segs = pool.segmentsCreate('robot', { staticAfterSteps: 2 });
  assert.deepEqual([segs.add('cup', 0), segs.add('table', 0)], [0, 1]);
  assert.equal(segs.find('table'), 1);
  assert.equal(segs.name(0), 'cup');
  assert.deepEqual(segs.groupMembers(0), [0, 1]);
  assert.deepEqual(segs.drainEvents().map(e => [e.kind, e.segment]), [[kvmem.SEG_EVENT_SEGMENT_STALE, 0], [kvmem.SEG_EVENT_SEGMENT_STALE, 1]]);
  const k = new Float32Array(L * 3 * H * D).fill(0.5);
  segs.storeSegment(0, k, k, { tokenIds: [1, 2, 3] });
  assert.deepEqual([segs.segmentInfo(0).hasKv, segs.segmentInfo(0).nTokens], [true, 3]);
  segs.step(); segs.step();
  assert.equal(segs.groupInfo(0).state, kvmem.GROUP_STATIC);
  assert.deepEqual(segs.drainEvents().map(e => e.kind), [kvmem.SEG_EVENT_GROUP_STATIC]);
  const z = new Float32Array(L * 5 * H * D);
  segs.storeGroup(0, z, z);
  let units = segs.plan([1, 2]);
  assert.equal(units.length, 1);
  assert.equal(units[0].kind, kvmem.SEG_UNIT_GROUP);
  assert.equal(units[0].nTokens, 5);
  assert.ok(pool.agentIds().includes(units[0].agentId));
  segs.update(1);
  assert.equal(segs.groupInfo(0).state, kvmem.GROUP_DYNAMIC);
  units = segs.plan(new Float32Array([1, 2]), 1);
  assert.deepEqual(units.map(u => [u.segment, u.needsCompute]), [[1, true]]);
  assert.deepEqual([segs.getInfo().nSegments, segs.getInfo().nGroups], [2, 1]);
  assert.throws(() => segs.add('cup', 3), (e) => e instanceof kvmem.ExistsError && /cup/.test(e.message));
  assert.throws(() => segs.update(99), kvmem.NotFoundError);
  assert.throws(() => segs.plan([1]), kvmem.InvalidArgumentError);
  assert.throws(() => pool.segmentsCreate('robot'), kvmem.ExistsError);
  segs.close(); segs.close();
  assert.ok(!pool.agentIds().some(i => i.startsWith('robot.kvseg-')));
  assert.throws(() => segs.step(), kvmem.ClosedError);
  const s2 = pool.segmentsCreate('other');
  ctx.close();
  assert.ok(s2.closed && pool.closed);
});

test('k-means, multi-hop, schedule, load plan', () => {
  const emb = [1, 0, 0, 0.9, 0.1, 0, 0, 1, 0, 0, 0.95, 0.05, 0, 0, 1, 0.05, 0, 1];
  const { labels, centroids, iters } = kvmem.clusterKmeans(emb, 6, 3, { k: 3, seed: 7 });
  assert.ok(labels[0] === labels[1] && labels[2] === labels[3] && labels[4] === labels[5]);
  assert.equal(new Set(labels).size, 3);
  assert.equal(centroids.length, 9);
  assert.ok(iters >= 1);
  assert.throws(() => kvmem.clusterKmeans(new Float32Array(6), 2, 3, { k: 1 }), kvmem.InvalidArgumentError);

  const q2s = [0, 0, 1, 0], s2s = [1, 0, 0, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 1];
  let r = kvmem.multihopSelect(q2s, 1, s2s, 4, null, { ratio: 0.25, maxIters: 0 });
  assert.deepEqual(Array.from(r.selected), [0, 0, 1, 0]);
  r = kvmem.multihopSelect(q2s, 1, s2s, 4, null, { ratio: 0.5 });
  assert.deepEqual(Array.from(r.selected), [1, 0, 1, 0]);
  assert.equal(r.result.nSelected, 2);
  const sch = kvmem.multihopSchedule(8, 0.5);
  assert.equal(sch[0], 1);
  assert.ok(Math.abs(sch.reduce((a, b) => a + b, 0) / 8 - 0.5) < 1e-6);
  assert.throws(() => kvmem.multihopSchedule(8, 0.01), kvmem.InvalidArgumentError);

  const lp = kvmem.loadPlan([1, 1], 2, [1e6, 2e6], 2, [0, 0, 0, 0], { bandwidthGbps: 1 });
  assert.equal(lp.items.length, 4);
  assert.equal(Number(lp.stats.nLoads), 4);
  assert.ok(lp.layerStartMs[0] >= 3 - 1e-9);
  assert.ok(lp.stats.balancedMakespanMs <= lp.stats.naiveMakespanMs + 1e-9);
  assert.throws(() => kvmem.loadPlan([1, 1], 2, [1, 1], 2, [0, 0, 1, 1]), kvmem.InvalidArgumentError);
});
