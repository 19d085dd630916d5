'use strict';
// kvmem.arrange and kvmem.windowSplit against plain reimplementations of the
// header's contract (include/kvmem.h, "The window").
const test = require('node:test');
const assert = require('node:assert/strict');
const kvmem = require('..');

const skip = kvmem.hasFunction('kvmem_arrange') ? false : 'this libkvmem has no kvmem_arrange yet';

function refArrange(blocks, scores, order) {
  const ids = [...blocks].sort((a, b) => a - b);
  if (order === 'chrono') return ids;
  const s = new Map(blocks.map((b, i) => [b, scores[i]]));
  if (order === 'score') return ids.sort((a, b) => s.get(a) - s.get(b) || a - b); // ties: the older first
  const runs = [];
  for (const b of ids) {
    const r = runs[runs.length - 1];
    if (r && b === r[r.length - 1] + 1) r.push(b); else runs.push([b]);
  }
  const best = (r) => Math.max(...r.map((b) => s.get(b)));
  runs.sort((x, y) => best(x) - best(y) || x[0] - y[0]);
  return runs.flat();
}

test('arrange on a hand-computed example', { skip }, () => {
  const blocks = [9, 3, 4, 12, 5, 10], scores = [0.7, 0.1, 0.9, 0.3, 0.2, 0.4];
  assert.deepEqual(Array.from(kvmem.arrange(blocks, null, 'chrono')), [3, 4, 5, 9, 10, 12]);
  assert.deepEqual(Array.from(kvmem.arrange(blocks, scores, 'score')), [3, 5, 12, 10, 9, 4]);
  assert.deepEqual(Array.from(kvmem.arrange(blocks, scores)), [3, 5, 12, 10, 9, 4]);
  // runs 3-5 (best 0.9), 9-10 (0.7), 12 (0.3)
  assert.deepEqual(Array.from(kvmem.arrange(Int32Array.from(blocks), Float32Array.from(scores), 'runs')), [12, 9, 10, 3, 4, 5]);
  assert.deepEqual(Array.from(kvmem.arrange([], null, 'chrono')), []);
});

test('arrange matches the reference on random sets', { skip }, () => {
  let seed = 7;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  for (let t = 0; t < 50; t++) {
    const n = 1 + rnd(11), pool = Array.from({ length: 20 }, (_, i) => i), blocks = [];
    for (let i = 0; i < n; i++) blocks.push(pool.splice(rnd(pool.length), 1)[0]);
    const scores = blocks.map(() => rnd(4) / 4); // ties on purpose, exact in float32
    for (const order of ['chrono', 'score', 'runs'])
      assert.deepEqual(Array.from(kvmem.arrange(blocks, scores, order)), refArrange(blocks, scores, order), `${blocks} ${scores} ${order}`);
  }
});

test('arrange refuses bad input', { skip }, () => {
  assert.throws(() => kvmem.arrange([1, 2, 1], [0.1, 0.2, 0.3]), (e) => e instanceof kvmem.InvalidArgumentError && /listed twice/.test(e.message));
  assert.throws(() => kvmem.arrange([1, 2]), (e) => e instanceof kvmem.InvalidArgumentError && /needs scores/.test(e.message));
  assert.throws(() => kvmem.arrange([1, 2], [0.1, NaN]), (e) => e instanceof kvmem.InvalidArgumentError && /NaN/.test(e.message));
  assert.throws(() => kvmem.arrange([1, -2], null, 'chrono'), (e) => e instanceof kvmem.InvalidArgumentError && /< 0/.test(e.message));
  assert.throws(() => kvmem.arrange([1, 2], [0.1]), /expected 2/);
  assert.throws(() => kvmem.arrange([1, 2], [0.1, 0.2], 'best'), kvmem.InvalidArgumentError);
  assert.throws(() => kvmem.arrange([1, 2], [0.1, 0.2], 1), TypeError);
});

function refSplit(window, reserve, ms, ls, bs) {
  ms = Math.fround(ms); ls = Math.fround(ls); // C receives floats
  const room = window - reserve;
  let memory = Math.floor(Math.floor(ms * window + 1e-9) / bs) * bs;
  memory = Math.min(memory, Math.floor(room / bs) * bs);
  const left = room - memory;
  const live = Math.min(ls > 0 ? Math.floor(ls * window + 1e-9) : left, left);
  return { memoryTokens: memory, topK: memory / bs, liveTokens: live };
}

test('windowSplit on hand-computed examples and against the reference', { skip }, () => {
  assert.deepEqual(kvmem.windowSplit(256, 64, 0.5, 0.25, 16), { memoryTokens: 128, topK: 8, liveTokens: 64 });
  assert.deepEqual(kvmem.windowSplit(256, 64, 0.5, 0, 16), { memoryTokens: 128, topK: 8, liveTokens: 64 });
  assert.deepEqual(kvmem.windowSplit(200, 100, 0.9, 0.5, 16), { memoryTokens: 96, topK: 6, liveTokens: 4 });
  assert.deepEqual(kvmem.windowSplit(100, 0, 0.3, 0, 8), { memoryTokens: 24, topK: 3, liveTokens: 76 });
  const shares = [0, 0.1, 0.25, 1 / 3, 0.5, 0.75, 1];
  for (const w of [1, 7, 64, 255, 2048]) for (const r of [0, 1, 16, 200]) for (const ms of shares) for (const ls of shares)
    for (const bs of [1, 3, 16, 64]) {
      if (r > w) continue;
      const p = kvmem.windowSplit(w, r, ms, ls, bs);
      assert.deepEqual(p, refSplit(w, r, ms, ls, bs), `${w} ${r} ${ms} ${ls} ${bs}`);
      assert.ok(p.memoryTokens + p.liveTokens <= w - r);
    }
});

test('windowSplit refuses bad input', { skip }, () => {
  for (const args of [[0, 0, 0.5, 0.25, 4], [64, 65, 0.5, 0.25, 4], [64, -1, 0.5, 0.25, 4], [64, 0, 1.5, 0.25, 4],
    [64, 0, 0.5, -0.1, 4], [64, 0, NaN, 0.25, 4], [64, 0, 0.5, 0.25, 0]])
    assert.throws(() => kvmem.windowSplit(...args), (e) => e instanceof kvmem.InvalidArgumentError && /kvmem_window_split/.test(e.message), `${args}`);
  assert.throws(() => kvmem.windowSplit(64, 0, 'half', 0.25, 4), (e) => e instanceof TypeError && /memoryShare/.test(e.message));
});
