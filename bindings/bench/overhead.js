'use strict';
// Binding overhead, Node: near-empty calls (getInfo, blockInfo with its integer
// argument checked), append/read of one turn at a Llama-3-8B shape, and the async forms. Run: node bindings/bench/overhead.js
const kvmem = require('../node');
const L = 32, H = 8, D = 128, T = 16;

function medianUs(fn, reps, inner) {
  fn();
  const xs = [];
  for (let r = 0; r < reps; r++) {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < inner; i++) fn();
    xs.push(Number(process.hrtime.bigint() - t0) / 1e3 / inner);
  }
  xs.sort((a, b) => a - b);
  return xs[xs.length >> 1];
}
async function medianUsAsync(fn, reps, inner) {
  await fn();
  const xs = [];
  for (let r = 0; r < reps; r++) {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < inner; i++) await fn();
    xs.push(Number(process.hrtime.bigint() - t0) / 1e3 / inner);
  }
  xs.sort((a, b) => a - b);
  return xs[xs.length >> 1];
}

(async () => {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const pool = ctx.poolCreate({ n_layers: L, n_q_heads: 32, n_kv_heads: H, head_dim: D }, { storageDtype: 'f16' });
  const a = pool.agentOpen('bench');
  const k = Float32Array.from({ length: L * T * H * D }, (_, i) => Math.sin(i));
  const out = new Float32Array(k.length);
  const line = (op, us) => console.log(JSON.stringify({ lang: 'node', op, us: Math.round(us * 1000) / 1000 }));
  line('get_info', medianUs(() => a.getInfo(), 9, 2000));
  line('append_16tok_l32', medianUs(() => a.append(k, k), 9, 20));
  line('read_16tok_l32_into', medianUs(() => a.read(0, T, { kOut: out, values: false }), 9, 50));
  line('read_16tok_l32_new', medianUs(() => a.read(0, T, { values: false }), 9, 50));
  line('read_16tok_l32_async', await medianUsAsync(() => a.readAsync(0, T, { kOut: out, values: false }), 9, 50));
  // a call with an integer argument (checked against its C type before the call)
  line('block_info', medianUs(() => a.blockInfo(0), 9, 2000));
  // the async append takes a copy of its inputs (4 MiB here) when it is made
  line('append_16tok_l32_async', await medianUsAsync(() => a.appendAsync(k, k), 9, 20));
  ctx.close();
})();
