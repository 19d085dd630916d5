// The JavaScript API on the WebAssembly module, under Node (the SINGLE_FILE
// CommonJS build, kvmem_wasm_node.cjs). Results are checked against
// references written here in plain double-precision JavaScript: AABBs
// against per-channel min/max, retrieval scores against the MemArt formulas
// (SOFTMAX-MAX and RR-SUM), gather and ropeApply against a NEOX rotation, ART
// with zero thresholds against full softmax attention, read-back against what
// was appended (f32 storage). Also: errors carry the C status and message,
// closed handles are refused, nothing returned aliases the wasm heap, results
// stay right after the heap grows. Then the API's names and conventions
// (names.mjs): the old names warn once and still work, unknown keys are
// refused naming the key, results are camelCase only, kvmem.d.ts declares
// what the module has, and the Node binding has the same methods, messages
// and results for the same calls.
// Prints "N passed, N failed".
//
//   node wasm/tests/api_test.mjs build/wasm/www
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { nameChecks } from './names.mjs';

const www = path.resolve(process.argv[2] || 'build/wasm/www');
const api = await import(pathToFileURL(path.join(www, 'kvmem.js')).href);
const { load, KvmemError, Status } = api;
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
function throwsType(fn, cls, fragment, what) {
  try {
    fn();
    check(false, what, 'did not throw');
  } catch (e) {
    check(e instanceof cls && e.message.includes(fragment), what, `${e.constructor.name} ${e.message}`);
  }
}
const maxRel = (a, b) => {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]) / Math.max(1, Math.abs(b[i])));
  return m;
};
const same = (a, b) => a.length === b.length && Array.from(a).every((x, i) => Object.is(x, b[i]));

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

// NEOX rotation of one head vector x (head_dim D) to position p, in double precision
function neox(x, p, D, theta = 10000) {
  const y = new Float64Array(D);
  for (let j = 0; j < D / 2; j++) {
    const th = p * Math.pow(theta, -2 * j / D);
    y[j] = x[j] * Math.cos(th) - x[j + D / 2] * Math.sin(th);
    y[j + D / 2] = x[j] * Math.sin(th) + x[j + D / 2] * Math.cos(th);
  }
  return y;
}

const km = await load({ factory });
check(km.kernels === 'wasm128', 'the SIMD128 kernel table is chosen', km.kernels);
check(typeof km.version === 'function' && /^\d+\.\d+\.\d+$/.test(km.version()), 'version() string, as in Node', km.version);
{
  const [x, y, z] = km.version().split('.').map(Number);
  check(km.versionNumber() === x * 1000000 + y * 1000 + z, 'versionNumber is X*1000000+Y*1000+Z of the version string');
}

// no pthreads in the module: workers cannot start, the pool runs jobs inline
{
  const c4 = new km.Context({ nThreads: 4 });
  check(c4.nThreads === 1 && c4.backend === 'cpu', 'a context asked for 4 threads runs on the calling thread, on the CPU',
    `${c4.nThreads} ${c4.backend}`);
  c4.close();
  throwsStatus(() => new km.Context({ backend: 'vulkan' }), Status.UNSUPPORTED, 'vulkan', 'a GPU backend is refused as unusable here');
  throwsType(() => new km.Context({ nThreads: 1.5 }), TypeError, 'nThreads', 'a fractional thread count is refused');
}

const L = 2, NQ = 2, NKV = 1, D = 8, BS = 4, NB = 6, T = NB * BS;
const ctx = km.contextCreate();
const spec = { nLayers: L, nQHeads: NQ, nKvHeads: NKV, headDim: D, ropeTheta: 10000 };
throwsStatus(() => ctx.poolCreate({ ...spec, headDim: 3 }), Status.INVALID_ARG, 'head_dim', 'an odd head_dim is refused');
throwsStatus(() => ctx.poolCreate({ ...spec, nQHeads: 3, nKvHeads: 2 }), Status.INVALID_ARG, 'n_q_heads', 'query heads not a multiple of KV heads are refused');
throwsType(() => ctx.poolCreate({ ...spec, nLayers: 2.5 }), TypeError, 'nLayers', 'a fractional layer count is refused, not truncated');
throwsType(() => ctx.poolCreate({ ...spec, layerWindow: [0] }), RangeError, 'layerWindow has 1 entries, expected 2',
  'a layer window of the wrong length is refused before C reads it');
throwsStatus(() => ctx.poolCreate({ ...spec, modelId: 'x'.repeat(200) }), Status.INVALID_ARG, 'model_id', 'a model id longer than C holds is refused');
const pool = ctx.poolCreate(spec, { blockSize: BS, storageDtype: 'f32' });
throwsStatus(() => pool.agentOpen('.hidden'), Status.INVALID_ARG, 'id', 'a bad agent id is refused with the C message');
const ag = pool.agentOpen('a');
throwsStatus(() => pool.agentOpen('a'), Status.EXISTS, '', 'an agent open twice is refused');
// C reads an id up to its first NUL: 'z\0-evil' used to open agent 'z'
throwsStatus(() => pool.agentOpen('z\0-evil'), Status.INVALID_ARG, 'agent id "z\\u0000-evil" contains a NUL', 'an agent id with a NUL is refused');
{
  const z = pool.agentOpen('z'); // 'z' is not open: the refused call opened nothing
  z.close();
  throwsStatus(() => pool.removeAgent('z\0-evil'), Status.INVALID_ARG, 'contains a NUL', 'a remove with a NUL in the id is refused');
  check(pool.agentIds().sort().join() === 'a,z' && pool.getInfo().nAgents === 2, 'agentIds lists the pool\'s agents', pool.agentIds().join());
  pool.removeAgent('z'); // still there after the refused remove
  throwsStatus(() => pool.removeAgent('z'), Status.NOT_FOUND, '', 'and removed now');
  throwsStatus(() => ctx.poolCreate({ ...spec, modelId: 'llama\0-other' }), Status.INVALID_ARG, 'modelId', 'a model id with a NUL is refused');
  throwsType(() => pool.agentOpen(42), TypeError, 'agent id must be a string', 'an agent id that is not a string is a TypeError');
  check(km.agentIdValid('a-b.c') && !km.agentIdValid('.x') && !km.agentIdValid('a\0b'), 'agentIdValid');
}

// the spec as C holds it: every field, the defaults of the keys left out
{
  const p2 = ctx.poolCreate({ ...spec, ropeStyle: 'gptj', layerWindow: [0, 16], modelId: 'm' }, { blockSize: 8 });
  const s = p2.getSpec();
  check(s.nLayers === L && s.ropeStyle === km.ROPE_GPTJ && s.rotaryDim === 0 && s.ropeFactor === 1 &&
    same(s.layerWindow, [0, 16]) && s.modelId === 'm' && JSON.stringify(p2.spec) === JSON.stringify(s),
  'getSpec gives every field back, the window and the id too', JSON.stringify(s));
  const i = p2.getInfo();
  check(i.blockSize === 8 && i.storageDtype === km.F16 && i.nAgents === 0 && i.capacityBytes === 0, 'pool getInfo: the params it was made with',
    JSON.stringify(i));
  check(JSON.stringify(km.modelSpec({ ...spec, ropeStyle: 'gptj', layerWindow: [0, 16], modelId: 'm' })) === JSON.stringify(s),
    'modelSpec fills in the defaults as the pool does');
  // the module's context is the CPU's: no device mirror, whatever the capacity stated
  const p3 = ctx.poolCreate(spec, { deviceCapacityBytes: 4096 });
  check(JSON.stringify(p3.deviceStats()) === JSON.stringify({ mirrorBytes: 0, evictions: 0, unmirrored: 0 }) &&
    JSON.stringify(p2.deviceStats()) === JSON.stringify(p3.deviceStats()), 'deviceStats: no mirror on the CPU', JSON.stringify(p3.deviceStats()));
  p3.close();
  throwsStatus(() => ctx.poolCreate(spec, { deviceCapacityBytes: -1 }), Status.INVALID_ARG, 'device_capacity_bytes',
    'a negative deviceCapacityBytes is refused naming it');
  km.specValidate(spec);
  throwsStatus(() => km.specValidate({ ...spec, rotaryDim: 5 }), Status.INVALID_ARG, 'rotary_dim', 'specValidate names the wrong field');
  p2.close();
  // the glue reads and writes kvmem_model_spec_v2: its defaults are those
  // kvmem.h states (1 layer, 1 head, head_dim 64, NEOX, theta 10000, no scaling)
  const d = km.modelSpec({});
  const want = { nLayers: 1, nQHeads: 1, nKvHeads: 1, headDim: 64, rotaryDim: 0, ropeStyle: 0, ropeTheta: 10000, ropeScaling: 0,
    ropeFactor: 1, ropeLowFreqFactor: 1, ropeHighFreqFactor: 4, ropeOriginalMaxPos: 8192, yarnBetaFast: 32, yarnBetaSlow: 1,
    yarnAttnFactor: 0 };
  check(Object.entries(want).every(([k, v]) => d[k] === v) && !d.layerWindow && d.modelId === '',
    'the spec defaults (kvmem_model_spec_v2_init) are the header\'s', JSON.stringify(d));
}

// keys: block j leans on channel j % D, so blocks differ
const k = randArray(L * T * NKV * D), v = randArray(L * T * NKV * D);
for (let l = 0; l < L; l++) for (let t = 0; t < T; t++) k[(l * T + t) * D + (Math.floor(t / BS) % D)] += 2;
throwsType(() => ag.append(k.subarray(1), v), RangeError, 'which is not a whole tensor', 'a short K is refused');
throwsType(() => ag.append(k, v.subarray(0, v.length - L * D)), RangeError, 'v holds', 'a V of another length than K is refused');
const ids = Int32Array.from({ length: T }, (_, i) => 100 + i), text = 'é'.repeat(T);
ag.append(k, v, { tokenIds: ids, text, tokenTextOffsets: Int32Array.from({ length: T }, (_, i) => 2 * i) });
const info = ag.getInfo();
check(info.nTokens === T && info.nSealed === NB && info.textBytes === 2 * T, 'append seals full blocks and keeps the text', JSON.stringify(info));
check(same(ag.tokens(), ids) && same(ag.tokens(3, 2), ids.subarray(3, 5)) && ag.text() === text, 'token ids and text come back');

// read-back: f32 storage keeps the values exactly; a strided output view is filled in place
{
  const r = ag.read(5, 7);
  let ok = r.shape.join() === [L, 7, NKV, D].join();
  for (let l = 0; l < L; l++)
    for (let t = 0; t < 7; t++)
      for (let d = 0; d < D; d++)
        ok &&= r.k[(l * 7 + t) * D + d] === k[(l * T + 5 + t) * D + d] && r.v[(l * 7 + t) * D + d] === v[(l * T + 5 + t) * D + d];
  check(ok, 'read gives the appended K and V back, exactly (f32 storage)');
  const big = new Float32Array(2 * L * 7 * NKV * D).fill(-1); // every other element
  const out = ag.read(5, 7, { kOut: { data: big, shape: [L, 7, NKV, D], strides: [2 * 7 * D, 2 * D, 2 * D, 2] }, values: false });
  let ok2 = out.v === null && out.k.data === big;
  for (let i = 0; i < big.length; i++) ok2 &&= i % 2 ? big[i] === -1 : big[i] === r.k[i / 2];
  check(ok2, 'read into a strided kOut view writes every other element, values skipped');
  // a strided input view: K spread over a wider array reads the same as the packed one
  const wide = new Float32Array(2 * k.length);
  for (let i = 0; i < k.length; i++) wide[2 * i + 1] = k[i];
  const w = pool.agentOpen('w');
  w.append({ data: wide.subarray(1), shape: [L, T, NKV, D], strides: [2 * T * D, 2 * D, 2 * D, 2] }, v);
  check(same(w.read().k, ag.read().k), 'a strided K view is appended as its elements');
  w.close();
  pool.removeAgent('w');
}

// prefix matching against the stored text (2-byte characters, an offset per token)
{
  const m = ag.prefixMatch(text + 'more');
  check(m.kind === km.PREFIX_EXTEND && m.reuseTokens === T && m.commonBytes === 2 * T && m.processFrom === 2 * T,
    'prefixMatch: the stored text extended reuses every token', JSON.stringify(m));
  const d = ag.prefixMatch('é'.repeat(T - 4) + 'x', { minRatio: 0.5 });
  check(d.kind === km.PREFIX_DIVERGE && d.reuseTokens === T - 4 && d.commonBytes === 2 * (T - 4), 'prefixMatch: a divergence keeps the tokens before it',
    JSON.stringify(d));
}

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
for (const [norm, agg] of [['softmax', 'max'], [km.NORM_RR, km.AGG_SUM]]) {
  const name = `${norm}-${agg}`;
  const ref = reference(norm === km.NORM_RR ? 'rr' : norm, agg === km.AGG_SUM ? 'sum' : agg);
  const r = ag.retrieve(q, { topK: 3, norm, agg });
  const got = r.blockScores(0);
  check(r.nSets === 1 && maxRel(got, ref) < 1e-5, `${name}: block scores equal the reference`, `${Array.from(got)} vs ${Array.from(ref)}`);
  const top = Array.from(ref.keys()).sort((a, b) => (ref[b] - ref[a]) || (a - b)).slice(0, 3).sort((a, b) => a - b);
  check(Array.from(r.get(0).blocks).join() === top.join(), `${name}: top-3 in chronological order`, `${r.get(0).blocks} vs ${top}`);
  check(r.nTokens(0) === 3 * BS && r.sets[0].nTokens === 3 * BS, `${name}: selected token count`);
  check(got.buffer !== km.M.HEAPU8.buffer && r.get(0).blocks.buffer !== km.M.HEAPU8.buffer, 'results do not alias the wasm heap');
  // into a reused C result: the same numbers, read from C
  const into = new km.Retrieval();
  const same2 = ag.retrieve(q, { topK: 3, norm, agg, result: into });
  check(same2 === into && same(into.get(0).blocks, r.get(0).blocks) && same(into.blockScores(0), got) && into.nTokens(0) === r.nTokens(0),
    `${name}: retrieving into a Retrieval returns it, with the same results`);
  into.close();
  throwsStatus(() => into.get(0), Status.CLOSED, 'closed', 'a closed Retrieval is refused');
}
throwsType(() => ag.retrieve(q.subarray(0, 5)), RangeError, 'query holds 5 elements', 'a query of the wrong size is refused');
throwsType(() => ag.retrieve(q, { topK: 2.5 }), TypeError, 'topK', 'a fractional topK is refused, not truncated');
throwsType(() => ag.retrieve(q, { result: {} }), TypeError, 'result must be a Retrieval', 'a result that is not a Retrieval is refused');
{
  const r = ag.retrieve(q, { scope: 'per-layer', topK: 2 });
  check(r.nSets === L && r.sets.length === L, 'per-layer scope: one set per layer');
  throwsStatus(() => r.get(L), Status.INVALID_ARG, 'set', 'a set past the last is refused');
}

// KVMEM_CPU=scalar (set before the module starts) forces the scalar tables;
// the SIMD128 scores agree with them to f32 rounding
{
  const ks = await load({ factory, preRun: [(m) => { m.ENV.KVMEM_CPU = 'scalar'; }] });
  check(ks.kernels === 'scalar', 'KVMEM_CPU=scalar forces the scalar tables', ks.kernels);
  const c2 = new ks.Context(), p2 = c2.poolCreate(spec, { blockSize: BS, storageDtype: 'f32' }), a2 = p2.agentOpen('a');
  a2.append(k, v);
  // a handle of one instance points into that instance's heap: another refuses it
  throwsType(() => km.attend(ctx, q.subarray(0, NQ * D), { agent: a2 }), TypeError, 'an Agent of this module', 'an agent of another instance is refused');
  throwsType(() => ag.retrieve(q, { result: ks.retrievalCreate() }), TypeError, 'a Retrieval of this module', 'a Retrieval of another instance is refused');
  for (const mode of ['aabb', 'exact']) {
    const x = a2.retrieve(q, { topK: 3, mode }), y = ag.retrieve(q, { topK: 3, mode });
    check(maxRel(y.blockScores(0), x.blockScores(0)) < 1e-5 && x.get(0).blocks.join() === y.get(0).blocks.join(),
      `${mode}: wasm128 and scalar retrieval agree`);
  }
  c2.close();
  ks.close();
}
throwsType(() => ag.retrieve(q, { mode: 'nearest' }), TypeError, 'nearest', 'an unknown mode name is refused');

// gather: blocks 4 and 1 at base 100, keys rotated (NEOX) to 100..107
const g = ag.gather([4, 1], 100);
let ropeErr = 0;
for (let l = 0; l < L; l++)
  for (let i = 0; i < 2 * BS; i++) {
    const src = (i < BS ? 4 * BS : BS) + (i % BS);
    const y = neox(k.subarray((l * T + src) * D, (l * T + src + 1) * D), 100 + i, D);
    for (let d = 0; d < D; d++) ropeErr = Math.max(ropeErr, Math.abs(y[d] - g.k[(l * 2 * BS + i) * D + d]));
    for (let d = 0; d < D; d++) if (g.v[(l * 2 * BS + i) * D + d] !== v[(l * T + src) * D + d]) ropeErr = Infinity;
  }
check(g.shape.join() === [L, 2 * BS, NKV, D].join() && ropeErr < 1e-5, 'gather: values copied, keys rotated to the new positions', String(ropeErr));
throwsStatus(() => ag.gather([NB + 3]), Status.NOT_FOUND, '', 'gathering a block that does not exist is refused');

// ropeApply rotates rows in place (NEOX), and inverse undoes it
{
  const x = randArray(3 * D), x0 = Float64Array.from(x), pos = [0, 7, 1000];
  km.ropeApply(spec, x, pos);
  let err = 0;
  for (let r = 0; r < 3; r++) {
    const y = neox(x0.subarray(r * D, (r + 1) * D), pos[r], D);
    for (let d = 0; d < D; d++) err = Math.max(err, Math.abs(y[d] - x[r * D + d]));
  }
  km.ropeApply(spec, x, pos, { inverse: true });
  check(err < 1e-5 && maxRel(x, x0) < 1e-5, 'ropeApply rotates each row to its position and inverse undoes it', String(err));
  const strided = new Float32Array(2 * D + 3).fill(5);
  km.ropeApply(spec, strided, [0, 0], { stride: D + 3 }); // position 0: unchanged, gaps untouched
  check(strided.every((e) => e === 5), 'ropeApply with a stride: position 0 leaves the rows as they were');
  throwsType(() => km.ropeApply(spec, new Float32Array(D), [1, 2]), RangeError, 'exceed x', 'more positions than rows are refused');
}

// ART over tensors with zero thresholds = full softmax attention
function fullAttention(qq, kk, vv, TT) {
  const o = new Float64Array(NQ * D);
  for (let h = 0; h < NQ; h++) {
    const s = [];
    for (let j = 0; j < TT; j++) {
      let d = 0;
      for (let c = 0; c < D; c++) d += qq[h * D + c] * kk[j * D + c];
      s.push(d / Math.sqrt(D));
    }
    const m = Math.max(...s), e = s.map((x) => Math.exp(x - m)), z = e.reduce((a, b) => a + b, 0);
    for (let c = 0; c < D; c++) for (let j = 0; j < TT; j++) o[h * D + c] += (e[j] / z) * vv[j * D + c];
  }
  return o;
}
{
  const TT = 40, kk = randArray(TT * NKV * D), vv = randArray(TT * NKV * D), qq = randArray(NQ * D);
  const r = km.attend(ctx, { data: qq, shape: [1, NQ, D] }, { k: { data: kk, shape: [TT, NKV, D] }, v: { data: vv, shape: [TT, NKV, D] },
    tileSize: 8, tauS: 0, tauD: 0 });
  check(maxRel(r.out, fullAttention(qq, kk, vv, TT)) < 1e-5, 'ART with zero thresholds equals full attention');
  check(r.stats.tilesVisited === r.stats.tilesTotal && r.stats.tilesTotal === 5 * NKV, 'every tile read', JSON.stringify(r.stats));
  throwsType(() => km.attend(ctx, qq, { k: { data: kk, shape: [TT, NKV, D] }, v: { data: vv, shape: [TT, NKV, D] } }), TypeError,
    'give {data, shape}', 'attend over tensors needs q as a {data, shape} view');
  throwsType(() => km.attend(ctx, { data: qq, shape: [1, NQ, D] }, { k: { data: kk, shape: [TT, NKV, D] }, v: { data: vv, shape: [TT - 1, NKV, D] } }),
    RangeError, 'v has shape', 'V of another shape than K is refused');
  throwsType(() => km.attend(ctx, qq, { k: kk, v: vv, slots: [0] }), api.UnsupportedError, "'slots' is not supported", 'slot maps are refused as unsupported');
}
// ART over the agent's layer 1 with zero thresholds = full attention over its keys rotated to their positions
{
  const qq = randArray(NQ * D), out = new Float32Array(NQ * D);
  const r = km.attend(ctx, qq, { agent: ag, layer: 1, basePosition: 10, tauS: 0, tauD: 0, out });
  const kk = new Float32Array(T * D), vv = new Float32Array(T * D);
  for (let t = 0; t < T; t++) {
    kk.set(neox(k.subarray((T + t) * D, (T + t + 1) * D), 10 + t, D), t * D);
    vv.set(v.subarray((T + t) * D, (T + t + 1) * D), t * D);
  }
  check(r.out === out && maxRel(out, fullAttention(qq, kk, vv, T)) < 1e-4, 'ART over an agent layer equals full attention over its rotated keys',
    String(maxRel(out, fullAttention(qq, kk, vv, T))));
  throwsType(() => km.attend(ctx, qq, { agent: ag, positions: [1, 2] }), RangeError, 'positions has 2 entries',
    'positions of another length than the agent are refused');
}

// xAsync: the call runs now (no threads in the module), its result or error as a promise
{
  const before = ag.getInfo().nTokens;
  const bad = await ag.appendAsync(k.subarray(1), v).then(() => null, (e) => e);
  check(bad instanceof RangeError && ag.getInfo().nTokens === before, 'appendAsync rejects a short K and appends nothing');
  const r = await ag.retrieveAsync(q, { topK: 3 });
  check(same(r.get(0).blocks, ag.retrieve(q, { topK: 3 }).get(0).blocks), 'retrieveAsync resolves to the same result');
  const gg = await ag.gatherAsync([4, 1], 100);
  check(same(gg.k, g.k), 'gatherAsync resolves to the same result');
  pool.agentOpen('gone').close();
  await pool.removeAgentAsync('gone');
  const again = await pool.removeAgentAsync('gone').then(() => null, (e) => e);
  check(!pool.agentIds().includes('gone') && again instanceof KvmemError && again.status === Status.NOT_FOUND,
    'removeAgentAsync removes the agent, and a second one rejects with NOT_FOUND');
}

// the heap grows (16 MiB initially): results stay right, views are re-read
{
  const big = pool.agentOpen('big');
  const n = 8192;
  const kb = randArray(L * n * NKV * D), vb = randArray(L * n * NKV * D);
  for (let i = 0; i < 40; i++) big.append(kb, vb); // ~100 MB of f32 KV
  const before = reference('softmax', 'max');
  const after = ag.retrieve(q, { topK: 3 }).blockScores(0);
  check(big.getInfo().nTokens === 40 * n && maxRel(after, before) < 1e-5, 'after heap growth: appends counted, scores unchanged');
  big.close();
  pool.removeAgent('big');
}

// truncate drops the newest tokens
{
  const t = pool.agentOpen('t');
  t.append(k, v);
  t.truncate(T - BS - 1);
  const i = t.getInfo();
  check(i.nTokens === T - BS - 1 && i.nSealed === NB - 2, 'truncate keeps the first tokens and the blocks they fill', JSON.stringify(i));
  t.close();
}

// the names and conventions (names.mjs), on this module and beside the Node binding
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
await nameChecks({ km, api, check, throwsType, root, www, factory, load });

// closed handles
ag.close();
ag.close(); // a second close is a no-op
check(ag.closed, 'closed says so');
throwsStatus(() => ag.getInfo(), Status.CLOSED, 'closed', 'a closed agent is refused');
check((() => { try { ag.getInfo(); } catch (e) { return e instanceof km.ClosedError && e.code === 'KVMEM_ERR_CLOSED'; } return false; })(),
  'the error of a closed agent is a ClosedError with its C name as code');
const other = pool.agentOpen('b');
ctx.close(); // frees the pool and every handle on it
throwsStatus(() => other.flush(), Status.CLOSED, 'closed', 'an agent of a freed pool is refused');
throwsStatus(() => pool.agentOpen('c'), Status.CLOSED, 'closed', 'a freed pool is refused');
km.close();

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
