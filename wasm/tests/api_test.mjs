// The JavaScript API on the WebAssembly module, under Node (the SINGLE_FILE
// CommonJS build, kvmem_wasm_node.cjs). Results are checked against
// references written here in plain double-precision JavaScript: AABBs
// against per-channel min/max, retrieval scores against the MemArt formulas
// (SOFTMAX-MAX and RR-SUM), gather against a NEOX rotation, ART with zero
// thresholds against full softmax attention. Also: errors carry the C
// status and message, closed handles are refused, nothing returned aliases
// the wasm heap, results stay right after the heap grows.
// Prints "N passed, N failed".
//
//   node wasm/tests/api_test.mjs build/wasm/www
import path from 'node:path';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const www = path.resolve(process.argv[2] || 'build/wasm/www');
const { load, KvmemError, Status } = await import(pathToFileURL(path.join(www, 'kvmem.js')).href);
const factory = createRequire(import.meta.url)(path.join(www, 'kvmem_wasm_node.cjs'));

let passed = 0, failed = 0;
function check(ok, what, detail = '') {
  if (ok) passed++;
  else {
    failed++;
    console.log(`FAIL: ${what}${detail ? ': ' + detail : ''}`);
  }
}
function throwsStatus(fn, status, fragment, what) {
  try {
    fn();
    check(false, what, 'did not throw');
  } catch (e) {
    check(e instanceof KvmemError && e.status === status && e.message.includes(fragment), what, `${e.status} ${e.message}`);
  }
}
const maxRel = (a, b) => {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]) / Math.max(1, Math.abs(b[i])));
  return m;
};

// splitmix64 + uniform: test data without the library
let seed = 12345n;
function rand() {
  seed = (seed + 0x9e3779b97f4a7c15n) & 0xffffffffffffffffn;
  let z = seed;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & 0xffffffffffffffffn;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & 0xffffffffffffffffn;
  return Number((z ^ (z >> 31n)) >> 11n) / 2 ** 53;
}
const randArray = (n, scale = 1) => Float32Array.from({ length: n }, () => (rand() * 2 - 1) * scale);

const km = await load({ factory });
check(km.kernels === 'wasm128', 'the SIMD128 kernel table is chosen', km.kernels);
check(/^\d+\.\d+\.\d+$/.test(km.version), 'version string', km.version);

// no pthreads in the module: workers cannot start, the pool runs jobs inline
{
  const c4 = km.createContext({ nThreads: 4 });
  check(c4.nThreads === 1, 'a context asked for 4 threads runs on the calling thread', String(c4.nThreads));
  c4.close();
}

const L = 2, NQ = 2, NKV = 1, D = 8, BS = 4, NB = 6, T = NB * BS;
const ctx = km.createContext();
const spec = { nLayers: L, nQHeads: NQ, nKvHeads: NKV, headDim: D, ropeTheta: 10000 };
throwsStatus(() => ctx.createPool({ ...spec, headDim: 3 }), Status.INVALID_ARG, 'head_dim', 'an odd head_dim is refused');
const pool = ctx.createPool(spec, { blockSize: BS, storage: 'f32' });
throwsStatus(() => pool.openAgent('.hidden'), Status.INVALID_ARG, 'id', 'a bad agent id is refused with the C message');
const ag = pool.openAgent('a');
throwsStatus(() => pool.openAgent('a'), Status.EXISTS, '', 'an agent open twice is refused');
// C reads an id up to its first NUL: 'z\0-evil' used to open agent 'z'
throwsStatus(() => pool.openAgent('z\0-evil'), Status.INVALID_ARG, 'agent id "z\\u0000-evil" contains a NUL', 'an agent id with a NUL is refused');
{
  const z = pool.openAgent('z'); // 'z' is not open: the refused call opened nothing
  z.close();
  throwsStatus(() => pool.removeAgent('z\0-evil'), Status.INVALID_ARG, 'contains a NUL', 'a remove with a NUL in the id is refused');
  pool.removeAgent('z'); // still there after the refused remove
  throwsStatus(() => pool.removeAgent('z'), Status.NOT_FOUND, '', 'and removed now');
  throwsStatus(() => ctx.createPool({ ...spec, modelId: 'llama\0-other' }), Status.INVALID_ARG, 'modelId', 'a model id with a NUL is refused');
  let te = null;
  try { pool.openAgent(42); } catch (e) { te = e; }
  check(te instanceof TypeError && /agent id must be a string/.test(te.message), 'an agent id that is not a string is a TypeError', String(te));
}

// keys: block j leans on channel j % D, so blocks differ
const k = randArray(L * T * NKV * D), v = randArray(L * T * NKV * D);
for (let l = 0; l < L; l++) for (let t = 0; t < T; t++) k[(l * T + t) * D + (Math.floor(t / BS) % D)] += 2;
throwsStatus(() => ag.append(k.subarray(1), v, T), Status.INVALID_ARG, 'must hold', 'a short K is refused');
ag.append(k, v, T);
const info = ag.info();
check(info.nTokens === T && info.nSealed === NB, 'append seals full blocks', JSON.stringify(info));

// AABB = per-channel min/max of the block's keys
let aabbOk = true;
for (let b = 0; b < NB; b++) {
  const { min, max } = ag.blockAabb(b);
  for (let l = 0; l < L; l++)
    for (let d = 0; d < D; d++) {
      let lo = Infinity, hi = -Infinity;
      for (let t = b * BS; t < (b + 1) * BS; t++) { lo = Math.min(lo, k[(l * T + t) * D + d]); hi = Math.max(hi, k[(l * T + t) * D + d]); }
      if (min[l * D + d] !== lo || max[l * D + d] !== hi) aabbOk = false;
    }
}
check(aabbOk, 'block AABBs equal the per-channel min and max of the keys');

// retrieval against the formulas
const nq = 3, q = randArray(nq * L * NQ * D);
function reference(norm, agg) {
  const S = new Float64Array(NB);
  for (let l = 0; l < L; l++)
    for (let h = 0; h < NQ; h++) {
      const perToken = [];
      for (let t = 0; t < nq; t++) {
        const qv = q.subarray(((t * L + l) * NQ + h) * D, ((t * L + l) * NQ + h + 1) * D);
        const I = [];
        for (let b = 0; b < NB; b++) {
          const { min, max } = ag.blockAabb(b);
          let s = 0;
          for (let d = 0; d < D; d++) s += Math.max(qv[d] * max[l * D + d], qv[d] * min[l * D + d]);
          I.push(s);
        }
        let p;
        if (norm === 'softmax') {
          const tau = 1 / Math.sqrt(D), m = Math.max(...I);
          const e = I.map((x) => Math.exp(tau * (x - m))), z = e.reduce((a, b) => a + b, 0);
          p = e.map((x) => x / z);
        } else {
          const order = I.map((x, b) => b).sort((a, b) => (I[b] - I[a]) || (a - b));
          p = new Array(NB);
          order.forEach((b, r) => { p[b] = 1 / (r + 1 + 60); });
        }
        perToken.push(p);
      }
      for (let b = 0; b < NB; b++) {
        const col = perToken.map((p) => p[b]);
        S[b] += agg === 'max' ? Math.max(...col) : col.reduce((a, c) => a + c, 0);
      }
    }
  return S;
}
for (const [norm, agg] of [['softmax', 'max'], ['rr', 'sum']]) {
  const ref = reference(norm, agg);
  const r = ag.retrieve(q, nq, { topK: 3, norm, agg });
  const got = r.sets[0].blockScores;
  check(maxRel(got, ref) < 1e-5, `${norm}-${agg}: block scores equal the reference`, `${Array.from(got)} vs ${Array.from(ref)}`);
  const top = Array.from(ref.keys()).sort((a, b) => (ref[b] - ref[a]) || (a - b)).slice(0, 3).sort((a, b) => a - b);
  check(Array.from(r.sets[0].blocks).join() === top.join(), `${norm}-${agg}: top-3 in chronological order`, `${r.sets[0].blocks} vs ${top}`);
  check(r.sets[0].nTokens === 3 * BS, `${norm}-${agg}: selected token count`);
  check(!(got.buffer instanceof ArrayBuffer) || got.buffer !== km.M.HEAPU8.buffer, 'results do not alias the wasm heap');
}
throwsStatus(() => ag.retrieve(q.subarray(0, 5), 1), Status.INVALID_ARG, '', 'a query of the wrong size is refused');

// KVMEM_CPU=scalar (set before the module starts) forces the scalar tables;
// the SIMD128 scores agree with them to f32 rounding
{
  const ks = await load({ factory, preRun: [(m) => { m.ENV.KVMEM_CPU = 'scalar'; }] });
  check(ks.kernels === 'scalar', 'KVMEM_CPU=scalar forces the scalar tables', ks.kernels);
  const c2 = ks.createContext(), p2 = c2.createPool(spec, { blockSize: BS, storage: 'f32' }), a2 = p2.openAgent('a');
  a2.append(k, v, T);
  for (const mode of ['aabb', 'exact']) {
    const x = a2.retrieve(q, nq, { topK: 3, mode }).sets[0], y = ag.retrieve(q, nq, { topK: 3, mode }).sets[0];
    check(maxRel(y.blockScores, x.blockScores) < 1e-5 && x.blocks.join() === y.blocks.join(),
      `${mode}: wasm128 and scalar retrieval agree`);
  }
  c2.close();
  ks.close();
}
try {
  ag.retrieve(q, nq, { mode: 'nearest' });
  check(false, 'an unknown mode name is refused');
} catch (e) {
  check(e instanceof TypeError && e.message.includes('nearest'), 'an unknown mode name is refused', e.message);
}

// gather: blocks 4 and 1 at base 100, keys rotated (NEOX) to 100..107
const g = ag.gather([4, 1], 100);
let ropeErr = 0;
for (let l = 0; l < L; l++)
  for (let i = 0; i < 2 * BS; i++) {
    const src = (i < BS ? 4 * BS : BS) + (i % BS), p = 100 + i;
    const x = k.subarray((l * T + src) * D, (l * T + src + 1) * D), y = g.k.subarray((l * 2 * BS + i) * D, (l * 2 * BS + i + 1) * D);
    for (let j = 0; j < D / 2; j++) {
      const th = p * Math.pow(10000, -2 * j / D);
      const a = x[j] * Math.cos(th) - x[j + D / 2] * Math.sin(th), b = x[j] * Math.sin(th) + x[j + D / 2] * Math.cos(th);
      ropeErr = Math.max(ropeErr, Math.abs(a - y[j]), Math.abs(b - y[j + D / 2]));
    }
    for (let d = 0; d < D; d++) if (g.v[(l * 2 * BS + i) * D + d] !== v[(l * T + src) * D + d]) ropeErr = Infinity;
  }
check(g.nTokens === 2 * BS && ropeErr < 1e-5, 'gather: values copied, keys rotated to the new positions', String(ropeErr));
throwsStatus(() => ag.gather([NB + 3]), Status.NOT_FOUND, '', 'gathering a block that does not exist is refused');

// ART over tensors with zero thresholds = full softmax attention
{
  const TT = 40, kk = randArray(TT * NKV * D), vv = randArray(TT * NKV * D), qq = randArray(NQ * D);
  const r = ctx.attendTensors(qq, 1, kk, vv, { nQHeads: NQ, nKvHeads: NKV, headDim: D, tileSize: 8, tauS: 0, tauD: 0 });
  let err = 0;
  for (let h = 0; h < NQ; h++) {
    const s = [];
    for (let j = 0; j < TT; j++) {
      let d = 0;
      for (let c = 0; c < D; c++) d += qq[h * D + c] * kk[j * D + c];
      s.push(d / Math.sqrt(D));
    }
    const m = Math.max(...s), e = s.map((x) => Math.exp(x - m)), z = e.reduce((a, b) => a + b, 0);
    for (let c = 0; c < D; c++) {
      let o = 0;
      for (let j = 0; j < TT; j++) o += (e[j] / z) * vv[j * D + c];
      err = Math.max(err, Math.abs(o - r.out[h * D + c]));
    }
  }
  check(err < 1e-5, 'ART with zero thresholds equals full attention', String(err));
  check(r.stats.tilesVisited === r.stats.tilesTotal && r.stats.tilesTotal === 5 * NKV, 'every tile read', JSON.stringify(r.stats));
}

// the heap grows (16 MiB initially): results stay right, views are re-read
{
  const big = pool.openAgent('big');
  const n = 8192;
  const kb = randArray(L * n * NKV * D), vb = randArray(L * n * NKV * D);
  for (let i = 0; i < 40; i++) big.append(kb, vb, n); // ~100 MB of f32 KV
  const before = reference('softmax', 'max');
  const after = ag.retrieve(q, nq, { topK: 3 }).sets[0].blockScores;
  check(big.info().nTokens === 40 * n && maxRel(after, before) < 1e-5, 'after heap growth: appends counted, scores unchanged');
  big.close();
  pool.removeAgent('big');
}

// closed handles
ag.close();
ag.close(); // a second close is a no-op
throwsStatus(() => ag.info(), Status.CLOSED, 'closed', 'a closed agent is refused');
const other = pool.openAgent('b');
ctx.close(); // frees the pool and every handle on it
throwsStatus(() => other.flush(), Status.CLOSED, 'closed', 'an agent of a freed pool is refused');
throwsStatus(() => pool.openAgent('c'), Status.CLOSED, 'closed', 'a freed pool is refused');
km.close();

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
