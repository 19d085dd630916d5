// kvmem.js — the JavaScript API of kvmem's WebAssembly build.
//
// The same object model as the C API (include/kvmem.h): a Context holds
// Pools, a Pool holds Agents; an Agent appends KV, retrieves blocks for a
// query, gathers them at new positions and attends over its memory.
// Everything that owns wasm memory has an explicit free()/close(); the
// functions that return data copy it into ordinary typed arrays, so nothing
// returned points into the wasm heap. Errors are thrown as KvmemError with
// the C status and kvmem_last_error()'s message.
//
//   import { load } from './kvmem.js';
//   const km = await load();                       // fetches kvmem_wasm.wasm
//   const ctx = km.createContext();
//   const pool = ctx.createPool({ nLayers: 8, nQHeads: 8, nKvHeads: 2, headDim: 64 });
//   const agent = pool.openAgent('alice');
//   agent.append(k, v, nTokens); agent.flush();
//   const r = agent.retrieve(query, nQ, { topK: 8, norm: 'rr', agg: 'sum' });
//   agent.close(); pool.close(); ctx.close();
//
// A real model runs in the module too (the tinyllm engine): km.openStory(modelBytes,
// tokenizerBytes) is a story agent whose memory is kvmem; story.session(text)
// retrieves, prefills, continues and reports what it did.

export const Status = Object.freeze({
  OK: 0, INVALID_ARG: -1, NOMEM: -2, CAPACITY: -3, NOT_FOUND: -4, EXISTS: -5, CLOSED: -6,
  UNSUPPORTED: -7, BACKEND: -8, IO: -9, FORMAT: -10, CORRUPT: -11, MISMATCH: -12,
  CONFLICT: -13, INTERNAL: -14, BUSY: -15,
});

export class KvmemError extends Error {
  constructor(status, statusName, message) {
    super(`${statusName}: ${message}`);
    this.name = 'KvmemError';
    this.status = status;
    this.statusName = statusName;
  }
}

const MODE = { aabb: 0, exact: 1 };
const NORM = { softmax: 0, rr: 1 };
const AGG = { max: 0, sum: 1 };
const SCOPE = { global: 0, 'per-layer': 1 };
const ORDER = { recent: 0, importance: 1, index: 2 };
const PROBE = { strided: 0, oracle: 1 };
const DTYPE = { f32: 0, f16: 1, bf16: 2 };
const ROPE = { neox: 0, gptj: 1 };

function badArg(message) {
  return new KvmemError(Status.INVALID_ARG, 'KVMEM_ERR_INVALID_ARG', message);
}

// An id for C: a string without NUL. C reads up to the first NUL, so
// 'alice\0-evil' would be agent 'alice'; cwrap would turn a number into "42".
function cId(v, what) {
  if (typeof v !== 'string') throw new TypeError(`kvmem: ${what} must be a string, not ${v === null ? 'null' : typeof v}`);
  if (v.includes('\0')) throw badArg(`${what} ${JSON.stringify(v)} contains a NUL character`);
  return v;
}

// The C side reads exactly this many floats: a shorter array must never
// reach it (it would read past the copy).
function needLength(arr, n, what) {
  if (!arr || arr.length !== n) throw badArg(`${what} must hold ${n} values (has ${arr ? arr.length : 0})`);
}

function enumValue(table, value, what) {
  if (typeof value === 'number') return value;
  const v = table[value];
  if (v === undefined) throw new TypeError(`${what}: ${value} is not one of ${Object.keys(table).join(', ')}`);
  return v;
}

// A wasm-heap allocation that JavaScript owns: free() it (or let the
// helpers below, which free in finally blocks).
class HeapBlock {
  constructor(km, bytes) {
    this.km = km;
    this.ptr = bytes > 0 ? km._malloc(bytes) : 0;
    if (bytes > 0 && !this.ptr) throw new KvmemError(Status.NOMEM, 'KVMEM_ERR_NOMEM', `wasm malloc(${bytes})`);
    this.bytes = bytes;
  }
  free() {
    if (this.ptr) this.km._free(this.ptr);
    this.ptr = 0;
  }
}

/** The loaded module. Create with load(). */
export class Kvmem {
  constructor(M) {
    this.M = M;
    this._fns = new Map();
    this._malloc = M._malloc;
    this._free = M._free;
    // scratch for out-parameters (pointers, counts, small structs): 256 bytes
    this._scratch = M._malloc(256);
    this.version = this.fn('kvmem_version', 'string', [])();
    this.kernels = this.fn('kvmw_cpu_kernels', 'string', [])();
    /** whether the module holds the tinyllm engine (openStory) */
    this.hasStory = typeof M._kvmw_story_open === 'function';
  }

  // cwrap once, reuse: the wrappers are cached by name.
  fn(name, ret, args) {
    let f = this._fns.get(name);
    if (!f) {
      if (typeof this.M['_' + name] !== 'function')
        throw new KvmemError(Status.UNSUPPORTED, 'KVMEM_ERR_UNSUPPORTED', `${name} is not in this build`);
      f = this.M.cwrap(name, ret, args);
      this._fns.set(name, f);
    }
    return f;
  }

  // Heap views are re-read on every use: a call that grows wasm memory
  // replaces the underlying ArrayBuffer.
  get f32() { return this.M.HEAPF32; }
  get i32() { return this.M.HEAP32; }
  get u32() { return this.M.HEAPU32; }
  get f64() { return this.M.HEAPF64; }

  check(status) {
    if (status >= 0) return status;
    const name = this.fn('kvmem_status_str', 'string', ['number'])(status);
    const msg = this.fn('kvmem_last_error', 'string', [])();
    throw new KvmemError(status, name, msg);
  }

  /** Copy a typed array into a new heap block (null/undefined -> ptr 0). */
  copyIn(arr) {
    if (arr == null) return new HeapBlock(this, 0);
    const b = new HeapBlock(this, arr.byteLength);
    if (b.ptr) this.M.HEAPU8.set(new Uint8Array(arr.buffer, arr.byteOffset, arr.byteLength), b.ptr);
    return b;
  }

  /** Run fn(blocks) and free the blocks afterwards, whatever happens. */
  withHeap(blocks, fn) {
    try {
      return fn(blocks);
    } finally {
      for (const b of blocks) b.free();
    }
  }

  readPtr(slot = 0) { return this.u32[(this._scratch >> 2) + slot]; }

  /** Milliseconds from the module's monotonic clock (performance.now). */
  now() { return this.fn('kvmw_now_ms', 'number', [])(); }

  createContext({ nThreads = 1 } = {}) {
    this.check(this.fn('kvmw_context_create', 'number', ['number', 'number'])(nThreads, this._scratch));
    return new Context(this, this.readPtr());
  }

  /** A reusable retrieval result for agent.retrieve(q, nQ, params, into) (free() it). */
  createRetrieval() { return new Retrieval(this); }

  /** kvmem_attend_default_params(), by name (order and probe as numbers). */
  attendDefaults() {
    const p = attendParams(this, {});
    return { order: p.order, nSink: p.nSink, tileSize: p.tileSize, scale: p.scale, tauS: p.tauS, tauD: p.tauD,
      patience: p.patience, probe: p.probe, causal: p.causal === 1, compare: p.compare === 1 };
  }

  /** A generator state for Synth (free() it). */
  createRng(seed) { return new Rng(this, seed); }

  /** The scripted session of `kvmem demo` (agents, turns, questions, model). */
  demoScript() { return JSON.parse(this.fn('kvmw_demo_script', 'string', [])()); }

  /** The tinyllm engine on a real model, its KV memory a kvmem agent: model is a
   *  llama2.c checkpoint or a GGUF file (llama, F32/F16), tokenizer llama2.c's
   *  tokenizer file (null: the GGUF's own vocabulary); bytes as ArrayBuffer or a
   *  typed array, copied. Throws KvmemError(FORMAT) with the loader's message. */
  openStory(model, tokenizer = null) {
    const open = this.fn('kvmw_story_open', 'number', Array(5).fill('number')); // UNSUPPORTED without the engine
    const mb = asBytes(model, 'model'), tb = tokenizer == null ? null : asBytes(tokenizer, 'tokenizer');
    if (!mb.length) throw badArg('the model file is empty');
    return this.withHeap([this.copyIn(mb), this.copyIn(tb && tb.length ? tb : null)], ([m, t]) => {
      this.check(open(m.ptr, mb.length, t.ptr, t.ptr ? tb.length : 0, this._scratch));
      return new Story(this, this.readPtr());
    });
  }

  /** A C string the call malloc'd, at the scratch slot: read and freed. */
  takeString(slot = 0) {
    const p = this.readPtr(slot);
    try {
      return this.M.UTF8ToString(p);
    } finally {
      this._free(p);
    }
  }

  /** Free the module's own scratch memory (after every object is closed). */
  close() {
    if (this._scratch) this._free(this._scratch);
    this._scratch = 0;
  }
}

class Handle {
  constructor(km, ptr, what) {
    this.km = km;
    this.ptr = ptr;
    this.what = what;
  }
  live() {
    if (!this.ptr) throw new KvmemError(Status.CLOSED, 'KVMEM_ERR_CLOSED', `${this.what} is closed`);
    return this.ptr;
  }
}

export class Context extends Handle {
  constructor(km, ptr) {
    super(km, ptr, 'context');
    this.pools = new Set();
  }
  get nThreads() { return this.km.fn('kvmem_context_n_threads', 'number', ['number'])(this.live()); }

  /** spec: { nLayers, nQHeads, nKvHeads, headDim, rotaryDim = 0, ropeStyle = 'neox',
   *  ropeTheta = 10000, modelId = '' }; params: { blockSize = 16, storage = 'f16',
   *  capacityBytes = 0 }. */
  createPool(spec, { blockSize = 16, storage = 'f16', capacityBytes = 0 } = {}) {
    const km = this.km;
    const s = { rotaryDim: 0, ropeStyle: 'neox', ropeTheta: 10000, modelId: '', ...spec };
    km.check(km.fn('kvmw_pool_create', 'number',
      ['number', 'number', 'number', 'number', 'number', 'number', 'number', 'number', 'number', 'number', 'number', 'string', 'number'])(
      this.live(), s.nLayers, s.nQHeads, s.nKvHeads, s.headDim, s.rotaryDim, enumValue(ROPE, s.ropeStyle, 'ropeStyle'),
      s.ropeTheta, blockSize, enumValue(DTYPE, storage, 'storage'), capacityBytes, cId(s.modelId, 'modelId'), km._scratch));
    const pool = new Pool(km, km.readPtr(), this, s, blockSize);
    this.pools.add(pool);
    return pool;
  }

  /** ART over caller tensors: q [nRows][nQHeads][headDim], k/v [T][nKvHeads][headDim]
   *  (post-RoPE), f32. Returns { out: Float32Array, stats }. */
  attendTensors(q, nRows, k, v, { nQHeads, nKvHeads, headDim, mask = null, ...params }) {
    const km = this.km;
    const T = k.length / (nKvHeads * headDim);
    if (!Number.isInteger(T) || T < 1) throw badArg(`k must hold T * ${nKvHeads * headDim} values`);
    needLength(v, k.length, 'v');
    needLength(q, nRows * nQHeads * headDim, 'q');
    if (mask) needLength(mask, T, 'mask');
    const p = attendParams(km, params);
    const out = new Float32Array(nRows * nQHeads * headDim);
    return km.withHeap([km.copyIn(q), km.copyIn(k), km.copyIn(v), km.copyIn(mask), km.copyIn(p.tileOrder),
      new HeapBlock(km, out.byteLength), new HeapBlock(km, 9 * 8)], ([qb, kb, vb, mb, tb, ob, sb]) => {
      km.check(km.fn('kvmw_attend_tensors', 'number', Array(25).fill('number'))(
        this.live(), qb.ptr, nRows, nQHeads, headDim, kb.ptr, vb.ptr, T, nKvHeads, mb.ptr,
        p.order, p.nSink, tb.ptr, p.nTileOrder, p.tileSize, p.scale, p.tauS, p.tauD, p.patience, p.probe,
        p.causal, p.compare, ob.ptr, sb.ptr, 0));
      out.set(km.f32.subarray(ob.ptr >> 2, (ob.ptr >> 2) + out.length));
      return { out, stats: readStats(km, sb.ptr) };
    });
  }

  close() {
    if (!this.ptr) return;
    for (const p of this.pools) p.close();
    this.km.fn('kvmem_context_free', null, ['number'])(this.ptr);
    this.ptr = 0;
  }
}

export class Pool extends Handle {
  constructor(km, ptr, ctx, spec, blockSize) {
    super(km, ptr, 'pool');
    this.context = ctx;
    this.spec = Object.freeze({ ...spec });
    this.blockSize = blockSize;
    this.agents = new Set();
    this.synths = new Set();
  }

  /** Open (creating if needed) the agent `id`. */
  openAgent(id) {
    const km = this.km;
    km.check(km.fn('kvmem_agent_open', 'number', ['number', 'string', 'number'])(this.live(), cId(id, 'agent id'), km._scratch));
    const a = new Agent(km, km.readPtr(), this, id);
    this.agents.add(a);
    return a;
  }

  removeAgent(id) {
    this.km.check(this.km.fn('kvmem_pool_remove_agent', 'number', ['number', 'string'])(this.live(), cId(id, 'agent id')));
  }

  /** Rotate rows of headDim floats (stride floats apart) to `positions`, or undo it. */
  ropeApply(x, nRows, stride, positions, inverse = false) {
    const km = this.km;
    if (nRows > 0 && x.length < (nRows - 1) * stride + this.spec.headDim)
      throw badArg(`x must hold at least ${(nRows - 1) * stride + this.spec.headDim} values`);
    needLength(positions, nRows, 'positions');
    return km.withHeap([km.copyIn(x), km.copyIn(Int32Array.from(positions))], ([xb, pb]) => {
      km.check(km.fn('kvmw_rope_apply', 'number', Array(6).fill('number'))(this.live(), xb.ptr, nRows, stride, pb.ptr, inverse ? 1 : 0));
      const r = new Float32Array(x.length);
      r.set(km.f32.subarray(xb.ptr >> 2, (xb.ptr >> 2) + x.length));
      return r;
    });
  }

  /** The synthetic session generator of `kvmem demo` (tools/synth.c) for this pool's model. */
  createSynth(nTopics, seed) {
    const km = this.km;
    const s = BigInt.asUintN(64, BigInt(seed));
    km.check(km.fn('kvmw_synth_create', 'number', Array(5).fill('number'))(
      this.live(), nTopics, Number(s & 0xffffffffn), Number(s >> 32n), km._scratch));
    const syn = new Synth(km, km.readPtr(), this);
    this.synths.add(syn);
    return syn;
  }

  close() {
    if (!this.ptr) return;
    for (const s of this.synths) s.free();
    for (const a of this.agents) a.ptr = 0; // the pool frees every handle
    this.km.fn('kvmem_pool_free', null, ['number'])(this.ptr);
    this.ptr = 0;
    this.context.pools.delete(this);
  }
}

export class Agent extends Handle {
  constructor(km, ptr, pool, id) {
    super(km, ptr, `agent ${id}`);
    this.pool = pool;
    this.id = id;
  }

  get rowFloats() {
    const s = this.pool.spec;
    return s.nLayers * s.nKvHeads * s.headDim;
  }

  /** Append nTokens tokens: k, v Float32Array [nLayers][nTokens][nKvHeads][headDim].
   *  positions (optional): keys are post-RoPE at these positions (kvmem de-rotates them). */
  append(k, v, nTokens, { positions = null } = {}) {
    const km = this.km;
    needLength(k, nTokens * this.rowFloats, 'k');
    needLength(v, nTokens * this.rowFloats, 'v');
    if (positions) needLength(positions, nTokens, 'positions');
    km.withHeap([km.copyIn(k), km.copyIn(v), km.copyIn(positions && Int32Array.from(positions))], ([kb, vb, pb]) => {
      km.check(km.fn('kvmw_agent_append', 'number', Array(6).fill('number'))(this.pool.live(), this.live(), kb.ptr, vb.ptr, nTokens, pb.ptr));
    });
  }

  flush() { this.km.check(this.km.fn('kvmem_agent_flush', 'number', ['number'])(this.live())); }

  info() {
    const km = this.km;
    km.check(km.fn('kvmw_agent_info', 'number', ['number', 'number'])(this.live(), km._scratch));
    const d = km.f64.subarray(km._scratch >> 3, (km._scratch >> 3) + 5);
    return { nTokens: d[0], nBlocks: d[1], nSealed: d[2], bytes: d[3], textBytes: d[4] };
  }

  blockInfo(block) {
    const km = this.km;
    km.check(km.fn('kvmw_block_info', 'number', ['number', 'number', 'number'])(this.live(), block, km._scratch));
    const d = km.f64.subarray(km._scratch >> 3, (km._scratch >> 3) + 3);
    return { firstToken: d[0], nTokens: d[1], sealed: d[2] === 1 };
  }

  /** The AABB of a sealed block: { min, max }, each [nLayers][nKvHeads][headDim]. */
  blockAabb(block) {
    const km = this.km;
    const s = this.pool.spec, n = s.nLayers * s.nKvHeads * s.headDim;
    return km.withHeap([new HeapBlock(km, 8 * n)], ([b]) => {
      km.check(km.fn('kvmem_agent_block_aabb', 'number', Array(4).fill('number'))(this.live(), block, b.ptr, b.ptr + 4 * n));
      const all = km.f32.slice(b.ptr >> 2, (b.ptr >> 2) + 2 * n);
      return { min: all.subarray(0, n), max: all.subarray(n) };
    });
  }

  /** Score the sealed blocks against query rows q ([nQ][nLayers][nQHeads][headDim], raw)
   *  and select blocks. params: { topK = 8, mode = 'aabb'|'exact', norm = 'softmax'|'rr',
   *  agg = 'max'|'sum', scope = 'global'|'per-layer', tau = 0, rrC = 0, exclude = [],
   *  alwaysInclude = [], recentWindow = 0, skipRecent = 0 }. `into` (optional): a
   *  Retrieval to reuse. Returns { sets: [{ blocks, scores, nTokens, blockScores }] }. */
  retrieve(q, nQ, params = {}, into = null) {
    const km = this.km;
    const s = this.pool.spec;
    needLength(q, nQ * s.nLayers * s.nQHeads * s.headDim, 'query');
    const p = { ...retrieveDefaults(km), ...params };
    const r = into || new Retrieval(km);
    try {
      km.withHeap([km.copyIn(q), km.copyIn(Int32Array.from(p.exclude || [])), km.copyIn(Int32Array.from(p.alwaysInclude || []))],
        ([qb, eb, ib]) => {
          km.check(km.fn('kvmw_retrieve', 'number', Array(17).fill('number'))(
            this.pool.live(), this.live(), qb.ptr, nQ, p.topK, enumValue(MODE, p.mode, 'mode'), enumValue(NORM, p.norm, 'norm'),
            enumValue(AGG, p.agg, 'agg'), enumValue(SCOPE, p.scope, 'scope'), p.tau, p.rrC, eb.ptr, (p.exclude || []).length,
            ib.ptr, (p.alwaysInclude || []).length, p.recentWindow, p.skipRecent, r.live()));
        });
      return r.read();
    } finally {
      if (!into) r.free();
    }
  }

  /** Concatenate sealed blocks, RoPE at basePosition.. : { k, v, nTokens }, f32
   *  [nLayers][nTokens][nKvHeads][headDim]. */
  gather(blocks, basePosition = 0) {
    const km = this.km;
    let M = 0;
    for (const b of blocks) M += this.blockInfo(b).nTokens;
    const n = M * this.rowFloats;
    return km.withHeap([km.copyIn(Int32Array.from(blocks)), new HeapBlock(km, 4 * n), new HeapBlock(km, 4 * n)], ([bb, kb, vb]) => {
      km.check(km.fn('kvmw_gather', 'number', Array(8).fill('number'))(this.pool.live(), this.live(), bb.ptr, blocks.length, basePosition, kb.ptr, vb.ptr, M));
      return { k: km.f32.slice(kb.ptr >> 2, (kb.ptr >> 2) + n), v: km.f32.slice(vb.ptr >> 2, (vb.ptr >> 2) + n), nTokens: M };
    });
  }

  /** ART attention of post-RoPE query rows q ([nRows][nQHeads][headDim]) of `layer`
   *  over this agent's memory (keys rotated at token index + basePosition, or at
   *  `positions`). params: { order = 'recent'|'importance'|'index', nSink, tileOrder,
   *  scale, tauS, tauD, patience, probe, causal, compare }. Returns { out, stats }. */
  attend(layer, q, nRows, { positions = null, basePosition = 0, ...params } = {}) {
    const km = this.km;
    const s = this.pool.spec;
    needLength(q, nRows * s.nQHeads * s.headDim, 'q');
    if (positions) needLength(positions, this.info().nTokens, 'positions');
    const p = attendParams(km, params);
    const out = new Float32Array(nRows * s.nQHeads * s.headDim);
    return km.withHeap([km.copyIn(q), km.copyIn(positions && Int32Array.from(positions)), km.copyIn(p.tileOrder),
      new HeapBlock(km, out.byteLength), new HeapBlock(km, 9 * 8)], ([qb, pb, tb, ob, sb]) => {
      km.check(km.fn('kvmw_attend_agent', 'number', Array(21).fill('number'))(
        this.pool.context.live(), this.pool.live(), this.live(), layer, qb.ptr, nRows, pb.ptr, basePosition,
        p.order, p.nSink, tb.ptr, p.nTileOrder, p.scale, p.tauS, p.tauD, p.patience, p.probe, p.causal, p.compare,
        ob.ptr, sb.ptr));
      out.set(km.f32.subarray(ob.ptr >> 2, (ob.ptr >> 2) + out.length));
      return { out, stats: readStats(km, sb.ptr) };
    });
  }

  close() {
    if (!this.ptr) return;
    this.km.fn('kvmem_agent_close', null, ['number'])(this.ptr);
    this.ptr = 0;
    this.pool.agents.delete(this);
  }
}

/** A reusable C retrieval result (kvmem_retrieval); free() when done. */
export class Retrieval extends Handle {
  constructor(km) {
    km.check(km.fn('kvmem_retrieval_create', 'number', ['number'])(km._scratch));
    super(km, km.readPtr(), 'retrieval');
  }

  read() {
    const km = this.km, r = this.live(), sc = km._scratch;
    const nSets = km.fn('kvmem_retrieval_n_sets', 'number', ['number'])(r);
    const sets = [];
    for (let s = 0; s < nSets; s++) {
      km.check(km.fn('kvmem_retrieval_copy', 'number', Array(6).fill('number'))(r, s, 0, 0, 0, sc));
      const n = km.i32[sc >> 2];
      const set = km.withHeap([new HeapBlock(km, 4 * n), new HeapBlock(km, 4 * n)], ([bb, sb]) => {
        km.check(km.fn('kvmem_retrieval_copy', 'number', Array(6).fill('number'))(r, s, bb.ptr, sb.ptr, n, sc));
        return { blocks: km.i32.slice(bb.ptr >> 2, (bb.ptr >> 2) + n), scores: km.f32.slice(sb.ptr >> 2, (sb.ptr >> 2) + n) };
      });
      km.check(km.fn('kvmem_retrieval_n_tokens', 'number', ['number', 'number', 'number'])(r, s, sc));
      set.nTokens = km.u32[sc >> 2] + km.i32[(sc >> 2) + 1] * 4294967296;
      km.check(km.fn('kvmem_retrieval_block_scores', 'number', Array(4).fill('number'))(r, s, sc, sc + 8));
      const ptr = km.u32[sc >> 2], nb = km.i32[(sc + 8) >> 2];
      set.blockScores = km.f32.slice(ptr >> 2, (ptr >> 2) + nb);
      sets.push(set);
    }
    return { sets };
  }

  free() {
    if (this.ptr) this.km.fn('kvmem_retrieval_free', null, ['number'])(this.ptr);
    this.ptr = 0;
  }
}

/** The state of the generator's 64-bit PRNG (splitmix64), kept in the wasm heap. */
export class Rng {
  constructor(km, seed) {
    this.km = km;
    this.block = new HeapBlock(km, 8);
    this.state = seed;
  }
  get ptr() {
    if (!this.block.ptr) throw new KvmemError(Status.CLOSED, 'KVMEM_ERR_CLOSED', 'rng is freed');
    return this.block.ptr;
  }
  get state() {
    const u = this.km.u32, i = this.ptr >> 2;
    return (BigInt(u[i + 1]) << 32n) | BigInt(u[i]);
  }
  set state(seed) {
    const s = BigInt.asUintN(64, BigInt(seed)), u = this.km.u32, i = this.ptr >> 2;
    u[i] = Number(s & 0xffffffffn);
    u[i + 1] = Number(s >> 32n);
  }
  free() { this.block.free(); }
}

export class Synth extends Handle {
  constructor(km, ptr, pool) {
    super(km, ptr, 'synth');
    this.pool = pool;
  }
  /** K and V of nTokens tokens about `topic`: f32 [nLayers][nTokens][nKvHeads][headDim]. */
  tokens(topic, nTokens, rng) {
    const km = this.km, s = this.pool.spec, n = nTokens * s.nLayers * s.nKvHeads * s.headDim;
    return km.withHeap([new HeapBlock(km, 4 * n), new HeapBlock(km, 4 * n)], ([kb, vb]) => {
      km.check(km.fn('kvmw_synth_tokens', 'number', Array(6).fill('number'))(this.live(), topic, nTokens, rng.ptr, kb.ptr, vb.ptr));
      return { k: km.f32.slice(kb.ptr >> 2, (kb.ptr >> 2) + n), v: km.f32.slice(vb.ptr >> 2, (vb.ptr >> 2) + n) };
    });
  }
  /** Raw query rows of nQ tokens asking about `topic`: f32 [nQ][nLayers][nQHeads][headDim]. */
  query(topic, nQ, rng) {
    const km = this.km, s = this.pool.spec, n = nQ * s.nLayers * s.nQHeads * s.headDim;
    return km.withHeap([new HeapBlock(km, 4 * n)], ([qb]) => {
      km.check(km.fn('kvmw_synth_query', 'number', Array(5).fill('number'))(this.live(), topic, nQ, rng.ptr, qb.ptr));
      return km.f32.slice(qb.ptr >> 2, (qb.ptr >> 2) + n);
    });
  }
  free() {
    if (this.ptr) this.km.fn('kvmw_synth_free', null, ['number'])(this.ptr);
    this.ptr = 0;
    this.pool.synths.delete(this);
  }
}

function asBytes(x, what) {
  if (x instanceof Uint8Array) return x;
  if (x instanceof ArrayBuffer) return new Uint8Array(x);
  if (ArrayBuffer.isView(x)) return new Uint8Array(x.buffer, x.byteOffset, x.byteLength);
  throw new TypeError(`${what}: expected an ArrayBuffer or a typed array`);
}

const utf8 = new TextEncoder();

// The C side writes JSON with snake_case keys; JavaScript gets camelCase.
function camel(x) {
  if (Array.isArray(x)) return x.map(camel);
  if (x === null || typeof x !== 'object') return x;
  const out = {};
  for (const [k, v] of Object.entries(x)) out[k.replace(/_([a-z])/g, (_, c) => c.toUpperCase())] = camel(v);
  return out;
}

/** A story agent on a real model (examples/tinyllm/story_session.c): each session
 *  asks kvmem for memory (MemArt as deployed: the live context plus the blocks the
 *  new text's queries retrieve, a quarter of the history), prefills the text on it,
 *  continues greedily and appends both to the agent; beside it the same session
 *  runs on full context and on a recent window of the same budget. close() it. */
export class Story extends Handle {
  constructor(km, ptr) {
    super(km, ptr, 'story');
    km.check(km.fn('kvmw_story_describe', 'number', ['number', 'number'])(ptr, km._scratch));
    /** { format, dim, hiddenDim, nLayers, nHeads, nKvHeads, headDim, vocab, seqLen, blockSize,
     *  storage, gen, maxPrompt, probeWindow, art, artDefaultTile } */
    this.model = Object.freeze(camel(JSON.parse(km.takeString())));
  }

  /** Tokens in the agent's history. */
  get historyTokens() { return this.km.fn('kvmw_story_history', 'number', ['number'])(this.live()); }

  /** One session of text. options: { art = false (kvmem's run attends with ART and
   *  reports where it stopped), artTile = 0 (ART tile size; 0 = kvmem's default) }.
   *  Returns { session, history, budget, text, prompt, memory, art, kvmem, full, recent,
   *  tokens } (kvmem.d.ts: StorySession). Refused (KvmemError, the story unchanged):
   *  empty text, more than model.maxPrompt tokens, a story past the model's context. */
  session(text, { art = false, artTile = 0 } = {}) {
    const km = this.km;
    if (typeof text !== 'string') throw new TypeError('text must be a string');
    if (!Number.isInteger(artTile) || artTile < 0) throw badArg(`artTile ${artTile}: expected an integer >= 0`);
    const bytes = utf8.encode(text);
    return km.withHeap([km.copyIn(bytes)], ([tb]) => {
      km.check(km.fn('kvmw_story_session', 'number', Array(6).fill('number'))(
        this.live(), tb.ptr, bytes.length, art ? 1 : 0, artTile, km._scratch));
      return camel(JSON.parse(km.takeString()));
    });
  }

  /** Forget the history: the next session is the first again. */
  reset() { this.km.check(this.km.fn('kvmw_story_reset', 'number', ['number'])(this.live())); }

  /** The tokenizer: text to ids (bos: prepend BOS, id 1). */
  encode(text, { bos = false } = {}) {
    const km = this.km, bytes = utf8.encode(String(text)), cap = bytes.length + 3;
    return km.withHeap([km.copyIn(bytes), new HeapBlock(km, 4 * cap)], ([tb, ob]) => {
      km.check(km.fn('kvmw_story_encode', 'number', Array(7).fill('number'))(
        this.live(), tb.ptr, bytes.length, bos ? 1 : 0, ob.ptr, cap, km._scratch));
      const n = km.i32[km._scratch >> 2];
      return km.i32.slice(ob.ptr >> 2, (ob.ptr >> 2) + n);
    });
  }

  /** Ids to text (the tokenizer's decoding: no space after BOS, <0xNN> as bytes). */
  decode(ids) {
    const km = this.km, a = Int32Array.from(ids);
    for (const id of a)
      if (id < 0 || id >= this.model.vocab) throw badArg(`token id ${id} outside the vocabulary [0, ${this.model.vocab})`);
    return km.withHeap([km.copyIn(a)], ([ib]) => {
      km.check(km.fn('kvmw_story_decode', 'number', Array(4).fill('number'))(this.live(), ib.ptr, a.length, km._scratch));
      return km.takeString();
    });
  }

  close() {
    if (this.ptr) this.km.fn('kvmw_story_free', null, ['number'])(this.ptr);
    this.ptr = 0;
  }
}

// kvmem_retrieve_default_params(), read once per module.
function retrieveDefaults(km) {
  if (km._retrieveDefaults) return km._retrieveDefaults;
  const sc = km._scratch;
  km.check(km.fn('kvmw_retrieve_defaults', 'number', ['number'])(sc));
  const d = km.f64.subarray(sc >> 3, (sc >> 3) + 9);
  km._retrieveDefaults = Object.freeze({ topK: d[0], mode: d[1], norm: d[2], agg: d[3], scope: d[4], tau: d[5], rrC: d[6],
    recentWindow: d[7], skipRecent: d[8] });
  return km._retrieveDefaults;
}

// ART parameters: kvmem_attend_default_params() (read once) for what the caller leaves out.
function attendParams(km, params) {
  if (!km._attendDefaults) {
    const sc = km._scratch;
    km.check(km.fn('kvmw_attend_defaults', 'number', ['number'])(sc));
    km._attendDefaults = Array.from(km.f64.subarray(sc >> 3, (sc >> 3) + 10));
  }
  const d = km._attendDefaults;
  const { order = d[0], nSink = d[1], tileOrder = null, tileSize = d[2], scale = d[3], tauS = d[4], tauD = d[5],
    patience = d[6], probe = d[7], causal = d[8] === 1, compare = d[9] === 1 } = params;
  return {
    order: enumValue(ORDER, order, 'order'), nSink, tileOrder: tileOrder && Int32Array.from(tileOrder),
    nTileOrder: tileOrder ? tileOrder.length : 0, tileSize, scale, tauS, tauD, patience,
    probe: enumValue(PROBE, probe, 'probe'), causal: causal ? 1 : 0, compare: compare ? 1 : 0,
  };
}

function readStats(km, ptr) {
  const d = km.f64.subarray(ptr >> 3, (ptr >> 3) + 9);
  return {
    nStreams: d[0], tilesTotal: d[1], tilesVisited: d[2], streamsStopped: d[3], oracleTiles: d[4],
    oracleAgree: d[5], positionsRead: d[6], stoppedEarly: d[7] === 1,
  };
}

/** Instantiate the WebAssembly module. options.factory: the Emscripten factory to use
 *  (default: ./kvmem_wasm.js, the browser build; Node passes kvmem_wasm_node.cjs's).
 *  Other options go to the factory (e.g. locateFile). */
export async function load({ factory = null, ...moduleOptions } = {}) {
  const create = factory || (await import('./kvmem_wasm.js')).default;
  return new Kvmem(await create(moduleOptions));
}
