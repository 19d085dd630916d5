// The browser benchmark: the workload of `kvmem bench webref` (bench/webref.c)
// through the JavaScript API, so the two can be compared on one machine:
// the demo model, 8192 tokens in 256-token turns (topic = turn % 9, seed 42),
// top-16 retrieval (SOFTMAX-MAX) for 1 query token (decode) and 32 (prefill),
// AABB and EXACT; medians of `reps` samples after 3 warm-up calls. A sample
// times a batch of calls, so the browser's coarse clock does not matter.
import { load } from './kvmem.js';

export function runBench(km, { tokens = 8192, reps = 15 } = {}) {
  const script = km.demoScript(), m = script.model, turn = 256;
  const ctx = new km.Context({ nThreads: 1 });
  const rng = km.rngCreate(42n ^ 0x5eedn);
  const into = km.retrievalCreate();
  try {
    const pool = ctx.poolCreate({ nLayers: m.nLayers, nQHeads: m.nQHeads, nKvHeads: m.nKvHeads, headDim: m.headDim,
      ropeTheta: m.ropeTheta, modelId: m.id }, { blockSize: 16 });
    const syn = pool.synthCreate(script.topics.length, 42);
    const ag = pool.agentOpen('bench');
    for (let c = 0; c < tokens / turn; c++) {
      const { k, v } = syn.tokens(c % script.topics.length, turn, rng);
      ag.append(k, v);
    }
    const q = syn.query(3, 32, rng), row = m.nLayers * m.nQHeads * m.headDim;
    const time = (nq, mode) => {
      // into a reused Retrieval, the results copied out (.sets), as before
      const qq = q.subarray(0, nq * row), call = () => ag.retrieve(qq, { topK: 16, mode, result: into }).sets;
      for (let i = 0; i < 3; i++) call();
      let batch = 1;
      for (let t0 = performance.now(); performance.now() - t0 < 5 && batch < 64;) {
        const t1 = performance.now();
        for (let i = 0; i < batch; i++) call();
        if (performance.now() - t1 > 5) break;
        batch *= 2;
      }
      const samples = [];
      for (let s = 0; s < reps; s++) {
        const t1 = performance.now();
        for (let i = 0; i < batch; i++) call();
        samples.push((performance.now() - t1) / batch);
      }
      samples.sort((a, b) => a - b);
      return samples[Math.floor(samples.length / 2)];
    };
    const info = ag.getInfo();
    return { suite: 'webref-browser', model: m.id, tokens: info.nTokens, blocks: info.nSealed, threads: 1,
      kernels: km.kernels, aabb_decode_ms: time(1, 'aabb'), aabb_prefill_ms: time(32, 'aabb'), exact_decode_ms: time(1, 'exact') };
  } finally {
    into.close();
    rng.close();
    ctx.close();
  }
}

// bench.html: run on load and show the result.
if (typeof document !== 'undefined' && document.getElementById('bench-out')) {
  const out = document.getElementById('bench-out');
  load().then((km) => {
    out.textContent = 'running…';
    setTimeout(() => {
      const r = runBench(km);
      out.textContent = JSON.stringify(r, null, 1);
      window.kvmemBench = r;
      document.body.dataset.state = 'ready';
    }, 0);
  }).catch((e) => { out.textContent = `error: ${e.message}`; document.body.dataset.state = 'error'; });
}
