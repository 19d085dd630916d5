// kvmem.js — the JavaScript API of kvmem's WebAssembly build.
//
// The same object model, names and conventions as the Node binding
// (bindings/node; bindings/README.md, "Names"): a Context holds Pools, a Pool
// holds Agents; an Agent appends KV, retrieves blocks for a query, gathers
// them at new positions; attend() runs ART over its memory. Keys of specs,
// options and results are the C field names in lowerCamelCase (n_kv_heads ->
// nKvHeads), unknown keys throw a TypeError naming the key, methods are the C
// function's words after kvmem_ with the object they are called on left out
// (kvmem_pool_create on a Context is ctx.poolCreate). The module instance
// `km` from load() stands where Node's `require('kvmem')` does: km.Context,
// km.attend, km.ropeApply, km.NORM_RR, km.NotFoundError.
//
// Everything that owns wasm memory has close(); the functions that return
// data copy it into ordinary typed arrays, so nothing returned points into
// the wasm heap. Errors are thrown as KvmemError (one subclass per status)
// with the C status and kvmem_last_error()'s message.
//
//   import { load } from './kvmem.js';
//   const km = await load();                       // fetches kvmem_wasm.wasm
//   const ctx = new km.Context();                  // or km.contextCreate()
//   const pool = ctx.poolCreate({ nLayers: 8, nQHeads: 8, nKvHeads: 2, headDim: 64 });
//   const agent = pool.agentOpen('alice');
//   agent.append(k, v); agent.flush();             // k, v: [nLayers][T][nKvHeads][headDim]
//   const r = agent.retrieve(query, { topK: 8, norm: km.NORM_RR, agg: 'sum' });
//   const { blocks } = r.get(0);
//   ctx.close();
//
// A real model runs in the module too (the tinyllm engine): km.storyOpen(modelBytes,
// tokenizerBytes) is a story agent whose memory is kvmem; story.session(text)
// retrieves, prefills, continues and reports what it did.

export const Status = Object.freeze({
  OK: 0, INVALID_ARG: -1, NOMEM: -2, CAPACITY: -3, NOT_FOUND: -4, EXISTS: -5, CLOSED: -6,
  UNSUPPORTED: -7, BACKEND: -8, IO: -9, FORMAT: -10, CORRUPT: -11, MISMATCH: -12,
  CONFLICT: -13, INTERNAL: -14, BUSY: -15,
});

// ---------------------------------------------------------------------------
// Deprecated names: they work for one more release and warn once each.
// ---------------------------------------------------------------------------

const warned = new Set();
function deprecated(old, use) {
  if (warned.has(old)) return;
  warned.add(old);
  console.warn(`kvmem: ${old} is deprecated and goes in the next release; use ${use}`);
}

// ---------------------------------------------------------------------------
// Errors: one subclass per status, as in the Node binding (errors.js).
// ---------------------------------------------------------------------------

/** A failed kvmem call: `status` the C code, `code` its C name. */
export class KvmemError extends Error {
  constructor(status, code, message) {
    super(`${code}: ${message}`);
    this.name = new.target.name;
    this.status = status;
    this.code = code;
  }
  /** @deprecated the same as `code` */
  get statusName() {
    deprecated('KvmemError.statusName', 'error.code');
    return this.code;
  }
}

const ERROR_TABLE = [
  [-1, 'KVMEM_ERR_INVALID_ARG', 'InvalidArgumentError'], [-2, 'KVMEM_ERR_NOMEM', 'NoMemoryError'],
  [-3, 'KVMEM_ERR_CAPACITY', 'CapacityError'], [-4, 'KVMEM_ERR_NOT_FOUND', 'NotFoundError'],
  [-5, 'KVMEM_ERR_EXISTS', 'ExistsError'], [-6, 'KVMEM_ERR_CLOSED', 'ClosedError'],
  [-7, 'KVMEM_ERR_UNSUPPORTED', 'UnsupportedError'], [-8, 'KVMEM_ERR_BACKEND', 'BackendError'],
  [-9, 'KVMEM_ERR_IO', 'IOError'], [-10, 'KVMEM_ERR_FORMAT', 'FormatError'],
  [-11, 'KVMEM_ERR_CORRUPT', 'CorruptError'], [-12, 'KVMEM_ERR_MISMATCH', 'MismatchError'],
  [-13, 'KVMEM_ERR_CONFLICT', 'ConflictError'], [-14, 'KVMEM_ERR_INTERNAL', 'InternalError'],
  [-15, 'KVMEM_ERR_BUSY', 'BusyError'],
];
const ERRORS = { KvmemError };
const errorClass = new Map();
for (const [status, code, name] of ERROR_TABLE) {
  // a named class per status, so `err instanceof km.NotFoundError` works
  const cls = { [name]: class extends KvmemError {} }[name];
  cls.status = status;
  cls.code = code;
  ERRORS[name] = cls;
  errorClass.set(status, cls);
}
export const {
  InvalidArgumentError, NoMemoryError, CapacityError, NotFoundError, ExistsError, ClosedError, UnsupportedError,
  BackendError, IOError, FormatError, CorruptError, MismatchError, ConflictError, InternalError, BusyError,
} = ERRORS;

function errorFor(status, code, message) {
  const cls = errorClass.get(status) || KvmemError;
  return new cls(status, code, message);
}
const badArg = (message) => errorFor(Status.INVALID_ARG, 'KVMEM_ERR_INVALID_ARG', message);
const closedError = (message) => errorFor(Status.CLOSED, 'KVMEM_ERR_CLOSED', message);
// A key or value the C API knows but this build cannot honour (no threads,
// no file store, f32 tensors only): said as such, not as an unknown key.
const unsupported = (message) => errorFor(Status.UNSUPPORTED, 'KVMEM_ERR_UNSUPPORTED', message);

// ---------------------------------------------------------------------------
// Constants: the C enums, under the Node binding's names.
// ---------------------------------------------------------------------------

export const CONSTANTS = Object.freeze({
  F32: 0, F16: 1, BF16: 2, Q8: 3, Q4: 4, Q4_KIVI: 5,
  ROPE_NEOX: 0, ROPE_GPTJ: 1,
  ROPE_SCALING_NONE: 0, ROPE_SCALING_LINEAR: 1, ROPE_SCALING_LLAMA3: 2, ROPE_SCALING_YARN: 3,
  RETRIEVE_AABB: 0, RETRIEVE_EXACT: 1, NORM_SOFTMAX: 0, NORM_RR: 1, AGG_MAX: 0, AGG_SUM: 1,
  SCOPE_GLOBAL: 0, SCOPE_PER_LAYER: 1,
  ATTEND_RECENT: 0, ATTEND_IMPORTANCE: 1, ATTEND_INDEX: 2, ATTEND_SCORED: 3,
  ATTEND_PROBE_STRIDED: 0, ATTEND_PROBE_ORACLE: 1, ATTEND_MAX_ROWS: 64, ATTEND_PROBE_SIZE: 32,
  PREFIX_EXACT: 0, PREFIX_EXTEND: 1, PREFIX_DIVERGE: 2,
});

// The same enums by name (either form is accepted wherever an enum goes).
const MODE = { aabb: 0, exact: 1 };
const NORM = { softmax: 0, rr: 1 };
const AGG = { max: 0, sum: 1 };
const SCOPE = { global: 0, 'per-layer': 1 };
const ORDER = { recent: 0, importance: 1, index: 2, scored: 3 };
const PROBE = { strided: 0, oracle: 1 };
const STORAGE = { f32: 0, float32: 0, f16: 1, float16: 1, bf16: 2, bfloat16: 2, q8: 3, q4: 4, q4_kivi: 5 };
const ROPE = { neox: 0, gptj: 1 };
const ROPE_SCALING = { none: 0, linear: 1, llama3: 2, yarn: 3 };
const MAX_DIMS = 6; // KVMEM_MAX_DIMS

function enumValue(table, value, what) {
  if (typeof value === 'number') return value;
  const v = typeof value === 'string' ? table[value] : undefined;
  if (v === undefined) throw new TypeError(`kvmem: ${what}: ${value} is not one of ${Object.keys(table).join(', ')}`);
  return v;
}

// ---------------------------------------------------------------------------
// Names: the rule of the Node binding's names.js.
// ---------------------------------------------------------------------------

const kindOf = (v) => (v === null ? 'null' : Array.isArray(v) ? 'an array' : typeof v);

// The entries of `obj`, its keys checked against `keys` (camelCase, in the
// Node binding's order). An unknown key throws a TypeError naming it and the
// known key it resembles (only case or underscores differ: nKVHeads,
// n_kv_heads) or listing the known ones, worded as Node's names.js does.
// `unsupported`: keys of `keys` the C API has and this build cannot honour,
// with the reason (refused when given a value); `renamed`: old keys of this
// API, still read, with a deprecation warning.
function readKeys(obj, keys, what, { unsupported: notHere = {}, renamed = {} } = {}) {
  if (obj === undefined || obj === null) return {};
  if (typeof obj !== 'object' || Array.isArray(obj) || ArrayBuffer.isView(obj))
    throw new TypeError(`kvmem: ${what} must be an object of named options, not ${kindOf(obj)}`);
  const out = {};
  for (const [k, v] of Object.entries(obj)) {
    let key = k;
    if (k in notHere) {
      if (v === undefined) continue;
      throw unsupported(`${what}: '${k}' is not supported by the WebAssembly build (${notHere[k]})`);
    }
    if (!keys.includes(k)) {
      if (!(k in renamed)) {
        const flat = (x) => x.replace(/_/g, '').toLowerCase();
        const near = keys.find((x) => flat(x) === flat(k));
        throw new TypeError(`kvmem: ${what}: unknown key '${k}'` +
                            (near ? ` (did you mean '${near}'?)` : `; known keys: ${keys.join(', ')}`));
      }
      deprecated(`${what}: '${k}'`, `'${renamed[k]}'`);
      key = renamed[k];
    }
    if (Object.prototype.hasOwnProperty.call(out, key))
      throw new TypeError(`kvmem: ${what}: '${key}' is given twice (once as '${k}')`);
    out[key] = v;
  }
  return out;
}

// ---------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------

// An id for C: a string without NUL. C reads up to the first NUL, so
// 'alice\0-evil' would be agent 'alice'; cwrap would turn a number into "42".
function cId(v, what) {
  if (typeof v !== 'string') throw new TypeError(`kvmem: ${what} must be a string, not ${v === null ? 'null' : typeof v}`);
  if (v.includes('\0')) throw badArg(`${what} ${JSON.stringify(v)} contains a NUL character`);
  return v;
}

// cwrap hands numbers to int32 parameters with |0: 2.5 would become 2 and
// 2**32 zero, so integer arguments are checked here.
function int32(v, what) {
  if (!Number.isInteger(v) || v < -2147483648 || v > 2147483647)
    throw new TypeError(`kvmem: ${what} must be an integer, not ${typeof v === 'number' ? v : kindOf(v)}`);
  return v;
}
function num(v, what) {
  if (typeof v !== 'number') throw new TypeError(`kvmem: ${what} must be a number, not ${kindOf(v)}`);
  return v;
}
const flag = (v) => (v ? 1 : 0);

function int32s(x, what, n) {
  if (x === undefined || x === null) return null;
  if (typeof x !== 'object' || typeof x.length !== 'number') throw new TypeError(`kvmem: ${what} must be an array of integers`);
  const a = x instanceof Int32Array ? x : Int32Array.from(x); // arrays of numbers are converted (copied)
  if (n !== undefined && a.length !== n) throw new RangeError(`kvmem: ${what} has ${a.length} entries, expected ${n}`);
  return a;
}

const utf8 = new TextEncoder();
const utf8Decoder = new TextDecoder();
function textBytesOf(x, what) {
  if (typeof x === 'string') return utf8.encode(x);
  if (x instanceof ArrayBuffer) return new Uint8Array(x);
  if (ArrayBuffer.isView(x)) return new Uint8Array(x.buffer, x.byteOffset, x.byteLength);
  throw new TypeError(`kvmem: ${what} must be a string or bytes, not ${kindOf(x)}`);
}

function checkF32(dtype, what) {
  if (dtype === undefined || dtype === null || dtype === 0) return;
  const d = typeof dtype === 'string' ? dtype.toLowerCase() : dtype;
  if (d === 'f32' || d === 'float32') return;
  if ([1, 2, 'f16', 'float16', 'bf16', 'bfloat16'].includes(d))
    throw unsupported(`${what}: dtype ${dtype}: the WebAssembly build takes f32 tensors (Float32Array) only`);
  throw new TypeError(`kvmem: ${what}: dtype ${dtype} is not one of f32, f16, bf16`);
}

// Visit the elements of a view in row-major order: fn(offset into data, i).
function forEachElement(ext, strides, fn) {
  const nd = ext.length, idx = new Array(nd).fill(0);
  const total = ext.reduce((a, e) => a * e, 1);
  let off = 0;
  for (let i = 0; i < total; i++) {
    fn(off, i);
    for (let d = nd - 1; d >= 0; d--) {
      if (++idx[d] < ext[d]) { off += strides[d]; break; }
      off -= (ext[d] - 1) * strides[d];
      idx[d] = 0;
    }
  }
}

// A tensor argument: a Float32Array read in the shape the call expects
// (`shape`, -1 entries inferred, at most one; null: the caller must say), or a
// {data, shape, strides, dtype} view (strides in elements, as in C). Checks
// and messages are the Node binding's (index.js, tensor()). Returns
// { data, ext, strides, count, contiguous }.
function tensorView(x, what, shape, dtype) {
  let data = x, strides, given;
  if (Array.isArray(x))
    throw new TypeError(`kvmem: ${what} must be a Float32Array (or a {data, shape} view), not an array`);
  if (x && typeof x === 'object' && !ArrayBuffer.isView(x) && !(x instanceof ArrayBuffer)) {
    const o = readKeys(x, ['data', 'shape', 'strides', 'dtype'], `${what} view`);
    data = o.data; given = o.shape; strides = o.strides;
    if (o.dtype !== undefined) dtype = o.dtype;
  }
  checkF32(dtype, what);
  if (!(data instanceof Float32Array))
    throw new TypeError(`kvmem: ${what} must be a Float32Array (the WebAssembly build takes f32), ` +
                        `got ${data === null ? 'null' : data?.constructor?.name ?? typeof data}`);
  const n = data.length;
  let ext;
  if (given) {
    ext = Array.from(given, Number);
    if (shape && (ext.length !== shape.length || ext.some((e, i) => shape[i] >= 0 && shape[i] !== e)))
      throw new RangeError(`kvmem: ${what} has shape [${ext}], expected [${shape.map((s) => (s < 0 ? '*' : s))}]`);
  } else {
    if (!shape) throw new TypeError(`kvmem: ${what}: give {data, shape} for this call`);
    const known = shape.reduce((a, s) => a * (s >= 0 ? s : 1), 1);
    const unknown = shape.filter((s) => s < 0).length;
    if (unknown > 1 || (unknown ? known === 0 || n % known : n !== known))
      throw new RangeError(`kvmem: ${what} holds ${n} elements, which is not a whole tensor of shape [${shape.map((s) => (s < 0 ? '*' : s))}]`);
    ext = shape.map((s) => (s >= 0 ? s : n / known));
  }
  if (ext.length < 1 || ext.length > MAX_DIMS) throw new TypeError(`kvmem: ${what} has ${ext.length} dimensions, at most ${MAX_DIMS}`);
  if (ext.some((e) => !Number.isInteger(e) || e < 0)) throw new TypeError(`kvmem: ${what}: shape [${ext}] must be non-negative integers`);
  const dense = new Array(ext.length);
  for (let i = ext.length - 1, acc = 1; i >= 0; i--) { dense[i] = acc; acc *= ext[i]; }
  if (!strides) strides = dense;
  strides = Array.from(strides);
  if (strides.length !== ext.length || strides.some((s) => !Number.isInteger(s) || s < 0))
    throw new TypeError(`kvmem: ${what}: strides [${strides}] must be ${ext.length} non-negative integers (elements)`);
  // the furthest element the view reaches must lie inside the array
  if (ext.every((e) => e > 0)) {
    const last = ext.reduce((a, e, i) => a + (e - 1) * strides[i], 0);
    if (last >= n) throw new RangeError(`kvmem: ${what}: shape [${ext}] with strides [${strides}] reaches element ${last}, the array has ${n}`);
  }
  const count = ext.reduce((a, e) => a * e, 1);
  const contiguous = ext.every((e, i) => e <= 1 || strides[i] === dense[i]);
  return { data, ext, strides, count, contiguous };
}

// The elements of a view, packed row-major (the array itself when it already is).
function packed(t) {
  if (t.contiguous) return t.data.length === t.count ? t.data : t.data.subarray(0, t.count);
  const out = new Float32Array(t.count);
  forEachElement(t.ext, t.strides, (off, i) => { out[i] = t.data[off]; });
  return out;
}

// Write packed row-major values into a view.
function unpack(src, t) {
  if (t.contiguous) t.data.set(src.subarray(0, t.count));
  else forEachElement(t.ext, t.strides, (off, i) => { t.data[off] = src[i]; });
}

// A Node-style xAsync for a binding without threads: the call runs now, on
// the calling thread, and its result or error comes as a promise.
function promised(call) {
  try {
    return Promise.resolve(call());
  } catch (e) {
    return Promise.reject(e);
  }
}

// A wasm-heap allocation that JavaScript owns: free() it (or let the
// helpers below, which free in finally blocks).
class HeapBlock {
  constructor(km, bytes) {
    this.km = km;
    this.ptr = bytes > 0 ? km._malloc(bytes) : 0;
    if (bytes > 0 && !this.ptr) throw errorFor(Status.NOMEM, 'KVMEM_ERR_NOMEM', `wasm malloc(${bytes})`);
    this.bytes = bytes;
  }
  free() {
    if (this.ptr) this.km._free(this.ptr);
    this.ptr = 0;
  }
}

// ---------------------------------------------------------------------------
// Specs and parameters
// ---------------------------------------------------------------------------

// kvmem_model_spec's numeric fields in struct order (glue/core.c, spec_in),
// then layerWindow and modelId: Node's SPEC_KEYS, in the same order.
const SPEC_NUMS = ['nLayers', 'nQHeads', 'nKvHeads', 'headDim', 'rotaryDim', 'ropeStyle', 'ropeTheta', 'ropeScaling',
  'ropeFactor', 'ropeLowFreqFactor', 'ropeHighFreqFactor', 'ropeOriginalMaxPos', 'yarnBetaFast', 'yarnBetaSlow',
  'yarnAttnFactor'];
const SPEC_KEYS = SPEC_NUMS.concat(['layerWindow', 'modelId']);
const SPEC_ENUMS = { ropeStyle: ROPE, ropeScaling: ROPE_SCALING };
const SPEC_INTS = ['nLayers', 'nQHeads', 'nKvHeads', 'headDim', 'rotaryDim', 'ropeOriginalMaxPos'];

// A spec object as the glue takes it: { f: Float64Array, layerWindow, modelId },
// the keys left out at kvmem_model_spec_default()'s values.
function specIn(km, spec, what = 'model spec') {
  const o = readKeys(spec, SPEC_KEYS, what);
  const f = Float64Array.from(km._defaults('spec'));
  SPEC_NUMS.forEach((k, i) => {
    if (o[k] === undefined) return;
    f[i] = SPEC_ENUMS[k] ? enumValue(SPEC_ENUMS[k], o[k], k)
      : SPEC_INTS.includes(k) ? int32(o[k], `${what}: ${k}`) : num(o[k], `${what}: ${k}`);
  });
  // C reads n_layers entries of the window: exactly that many must be there
  const layerWindow = o.layerWindow == null ? null : int32s(o.layerWindow, 'layerWindow', f[0]);
  const modelId = o.modelId === undefined ? '' : cId(o.modelId, 'modelId');
  return { f, layerWindow, modelId };
}

// kvmem_pool_params but store_dir, in the glue's order (glue/core.c, kvmw_pool_defaults).
const POOL_NUMS = ['blockSize', 'storageDtype', 'capacityBytes', 'maxAgents', 'maxTokensPerAgent', 'hostBudgetBytes',
  'deviceCapacityBytes'];
// Node's POOL_KEYS, in its order (the same "known keys" list)
const POOL_KEYS = ['blockSize', 'storageDtype', 'capacityBytes', 'maxAgents', 'maxTokensPerAgent', 'storeDir', 'hostBudgetBytes',
  'deviceCapacityBytes'];
const POOL_UNSUPPORTED = { storeDir: 'no file store in the module' };

function poolParamsIn(km, params) {
  const o = readKeys(params, POOL_KEYS, 'Pool params', { unsupported: POOL_UNSUPPORTED, renamed: { storage: 'storageDtype' } });
  const p = Float64Array.from(km._defaults('pool'));
  POOL_NUMS.forEach((k, i) => {
    if (o[k] === undefined) return;
    p[i] = k === 'storageDtype' ? enumValue(STORAGE, typeof o[k] === 'string' ? o[k].toLowerCase() : o[k], 'storageDtype')
      : k.endsWith('Bytes') ? num(o[k], `Pool params: ${k}`) : int32(o[k], `Pool params: ${k}`);
  });
  return p;
}

// kvmem_retrieve_params, in Node's RETRIEVE_KEYS order.
const RETRIEVE_KEYS = ['topK', 'mode', 'norm', 'agg', 'scope', 'tau', 'rrC', 'recentWindow', 'skipRecent',
  'exclude', 'alwaysInclude', 'result', 'dtype'];

// kvmem_retrieve_default_params(), read once per module.
function retrieveParams(km, o) {
  const d = km._defaults('retrieve');
  const p = { ...d };
  for (const k of ['topK', 'recentWindow', 'skipRecent']) if (o[k] !== undefined) p[k] = int32(o[k], `retrieve options: ${k}`);
  for (const k of ['tau', 'rrC']) if (o[k] !== undefined) p[k] = num(o[k], `retrieve options: ${k}`);
  p.mode = enumValue(MODE, o.mode ?? d.mode, 'mode');
  p.norm = enumValue(NORM, o.norm ?? d.norm, 'norm');
  p.agg = enumValue(AGG, o.agg ?? d.agg, 'agg');
  p.scope = enumValue(SCOPE, o.scope ?? d.scope, 'scope');
  p.exclude = int32s(o.exclude, 'exclude') || new Int32Array(0);
  p.alwaysInclude = int32s(o.alwaysInclude, 'alwaysInclude') || new Int32Array(0);
  return p;
}

// attend options: the source, the output, and kvmem_attend_params (camelCase)
// but the tile order, which comes from tileOrder; Node's ATTEND_KEYS order.
const ATTEND_OWN_KEYS = ['agent', 'layer', 'positions', 'basePosition', 'k', 'v', 'slots', 'deadSlot', 'mask', 'out', 'dtype',
  'tileOrder'];
const ATTEND_PARAM_KEYS = ['order', 'nSink', 'tileSize', 'scale', 'tauS', 'tauD', 'patience', 'probe', 'causal', 'compare'];
const ATTEND_UNSUPPORTED = { slots: 'no slot maps (KVStore) in the module', deadSlot: 'no slot maps (KVStore) in the module' };

// ART parameters: kvmem_attend_default_params() for what the caller leaves out.
function attendParams(km, params) {
  const d = km._defaults('attend');
  const o = { ...d, ...Object.fromEntries(Object.entries(params).filter(([, v]) => v !== undefined)) };
  for (const k of ['nSink', 'tileSize', 'patience']) int32(o[k], `attend options: ${k}`);
  for (const k of ['scale', 'tauS', 'tauD']) num(o[k], `attend options: ${k}`);
  const tileOrder = int32s(params.tileOrder, 'tileOrder');
  return {
    order: enumValue(ORDER, o.order, 'order'), nSink: o.nSink, tileOrder, nTileOrder: tileOrder ? tileOrder.length : 0,
    tileSize: o.tileSize, scale: o.scale, tauS: o.tauS, tauD: o.tauD, patience: o.patience,
    probe: enumValue(PROBE, o.probe, 'probe'), causal: flag(o.causal), compare: flag(o.compare),
  };
}

function readStats(km, ptr) {
  const d = km._f64.subarray(ptr >> 3, (ptr >> 3) + 9);
  return {
    nStreams: d[0], tilesTotal: d[1], tilesVisited: d[2], streamsStopped: d[3], oracleTiles: d[4],
    oracleAgree: d[5], positionsRead: d[6], stoppedEarly: d[7] === 1,
  };
}

// ---------------------------------------------------------------------------
// The module
// ---------------------------------------------------------------------------

/** The loaded module: what Node's `require('kvmem')` is. Create with load(). */
export class Kvmem {
  constructor(M) {
    this.M = M;
    this._fns = new Map();
    this._malloc = M._malloc;
    this._free = M._free;
    this._defaultsCache = {};
    // scratch for out-parameters (pointers, counts, small structs): 256 bytes
    this._scratch = M._malloc(256);
    const version = this._fn('kvmem_version', 'string', [])();
    this.version = () => version; // a function, as Node's kvmem.version()
    this.kernels = this._fn('kvmw_cpu_kernels', 'string', [])();
    /** whether the module holds the tinyllm engine (storyOpen) */
    this.hasStory = typeof M._kvmw_story_open === 'function';
    // Node's constructors, bound to this module: new km.Context(options), new km.Retrieval()
    const km = this;
    this.Context = { Context: class extends Context { constructor(options) { super(km, options); } } }.Context;
    this.Retrieval = { Retrieval: class extends Retrieval { constructor() { super(km); } } }.Retrieval;
  }

  // cwrap once, reuse: the wrappers are cached by name.
  _fn(name, ret, args) {
    let f = this._fns.get(name);
    if (!f) {
      if (typeof this.M['_' + name] !== 'function') throw unsupported(`${name} is not in this build`);
      f = this.M.cwrap(name, ret, args);
      this._fns.set(name, f);
    }
    return f;
  }

  // Heap views are re-read on every use: a call that grows wasm memory
  // replaces the underlying ArrayBuffer.
  get _f32() { return this.M.HEAPF32; }
  get _i32() { return this.M.HEAP32; }
  get _u32() { return this.M.HEAPU32; }
  get _f64() { return this.M.HEAPF64; }

  _check(status) {
    if (status >= 0) return status;
    const code = this._fn('kvmem_status_str', 'string', ['number'])(status);
    const msg = this._fn('kvmem_last_error', 'string', [])();
    throw errorFor(status, code, msg);
  }

  /** Copy a typed array into a new heap block (null/undefined -> ptr 0). */
  _copyIn(arr) {
    if (arr == null) return new HeapBlock(this, 0);
    const b = new HeapBlock(this, arr.byteLength);
    if (b.ptr) this.M.HEAPU8.set(new Uint8Array(arr.buffer, arr.byteOffset, arr.byteLength), b.ptr);
    return b;
  }

  /** Run fn(blocks) and free the blocks afterwards, whatever happens. */
  _withHeap(blocks, fn) {
    try {
      return fn(blocks);
    } finally {
      for (const b of blocks) b.free();
    }
  }

  _readPtr(slot = 0) { return this._u32[(this._scratch >> 2) + slot]; }

  /** A C string the call malloc'd, at the scratch slot: read and freed. */
  _takeString(slot = 0) {
    const p = this._readPtr(slot);
    try {
      return this.M.UTF8ToString(p);
    } finally {
      this._free(p);
    }
  }

  // The C defaults, read once: 'spec' (Float64Array in SPEC_NUMS order),
  // 'pool' (POOL_NUMS order), 'retrieve' and 'attend' (objects).
  _defaults(which) {
    const c = this._defaultsCache;
    if (c[which]) return c[which];
    const sc = this._scratch, d = () => this._f64.subarray(sc >> 3, (sc >> 3) + 16);
    if (which === 'spec') {
      this._check(this._fn('kvmw_spec_defaults', 'number', ['number'])(sc));
      c.spec = Float64Array.from(d().subarray(0, SPEC_NUMS.length));
    } else if (which === 'pool') {
      this._check(this._fn('kvmw_pool_defaults', 'number', ['number'])(sc));
      c.pool = Float64Array.from(d().subarray(0, POOL_NUMS.length));
    } else if (which === 'retrieve') {
      this._check(this._fn('kvmw_retrieve_defaults', 'number', ['number'])(sc));
      const v = d();
      c.retrieve = Object.freeze({ topK: v[0], mode: v[1], norm: v[2], agg: v[3], scope: v[4], tau: v[5], rrC: v[6],
        recentWindow: v[7], skipRecent: v[8] });
    } else {
      this._check(this._fn('kvmw_attend_defaults', 'number', ['number'])(sc));
      const v = d();
      c.attend = Object.freeze({ order: v[0], nSink: v[1], tileSize: v[2], scale: v[3], tauS: v[4], tauD: v[5],
        patience: v[6], probe: v[7], causal: v[8] === 1, compare: v[9] === 1 });
    }
    return c[which];
  }

  /** Milliseconds from the module's monotonic clock (performance.now). */
  now() { return this._fn('kvmw_now_ms', 'number', [])(); }

  versionNumber() { return this._fn('kvmem_version_number', 'number', [])(); }
  statusStr(status) { return this._fn('kvmem_status_str', 'string', ['number'])(int32(status, 'status')); }
  lastError() { return this._fn('kvmem_last_error', 'string', [])(); }
  dtypeName(dtype) { return this._fn('kvmem_dtype_name', 'string', ['number'])(int32(dtype, 'dtype')); }
  /** kvmem_agent_id_valid (a NUL-containing id is not valid: C would judge only the part before it) */
  agentIdValid(id) {
    if (typeof id === 'string' && id.includes('\0')) return false;
    return this._fn('kvmem_agent_id_valid', 'number', ['string'])(cId(id, 'agent id')) === 1;
  }

  /** options: { backend = 'auto' ('cpu'; the module has no other), nThreads = 0 } */
  contextCreate(options) { return new this.Context(options); }
  /** A reusable retrieval result for agent.retrieve(q, { result }) (close() it). */
  retrievalCreate() { return new this.Retrieval(); }
  /** A generator state for Synth (close() it). */
  rngCreate(seed) { return new Rng(this, seed); }

  /** kvmem_attend_default_params(): { order, nSink, tileSize, scale, tauS, tauD, patience, probe, causal, compare } */
  attendDefaultParams() { return { ...this._defaults('attend') }; }

  /** The full spec (defaults filled in) of the given keys, camelCase (Node's modelSpec). */
  modelSpec(fields = {}) {
    const s = specIn(this, fields);
    const o = {};
    SPEC_NUMS.forEach((k, i) => { o[k] = s.f[i]; });
    o.layerWindow = s.layerWindow ? Array.from(s.layerWindow) : null;
    o.modelId = s.modelId;
    return o;
  }

  /** kvmem_model_spec_validate: throws InvalidArgumentError naming the first wrong field. */
  specValidate(spec) {
    const s = specIn(this, spec);
    this._withHeap([this._copyIn(s.f), this._copyIn(s.layerWindow)], ([fb, wb]) => {
      this._check(this._fn('kvmw_spec_validate', 'number', ['number', 'number', 'string'])(fb.ptr, wb.ptr, s.modelId));
    });
  }

  /** Rotate rows (head vectors) of x in place, one position per row, as Node's
   *  ropeApply: rows are `stride` floats apart (default headDim); inverse undoes it. */
  ropeApply(spec, x, positions, options) {
    const { inverse = false, stride } = readKeys(options, ['inverse', 'stride'], 'ropeApply options');
    const s = specIn(this, spec);
    if (!(x instanceof Float32Array)) throw new TypeError('kvmem: ropeApply: x must be a Float32Array');
    const headDim = s.f[3], st = stride === undefined ? headDim : int32(stride, 'stride');
    const pos = int32s(positions, 'positions');
    if (!pos) throw new TypeError('kvmem: ropeApply: positions must be an array of integers');
    const nRows = pos.length;
    if (nRows && (nRows - 1) * st + headDim > x.length)
      throw new RangeError(`kvmem: ropeApply: ${nRows} rows of stride ${st} exceed x (${x.length} floats)`);
    this._withHeap([this._copyIn(s.f), this._copyIn(s.layerWindow), this._copyIn(x), this._copyIn(pos)], ([fb, wb, xb, pb]) => {
      this._check(this._fn('kvmw_rope_apply', 'number', ['number', 'number', 'string', 'number', 'number', 'number', 'number', 'number'])(
        fb.ptr, wb.ptr, s.modelId, xb.ptr, nRows, st, pb.ptr, flag(inverse)));
      x.set(this._f32.subarray(xb.ptr >> 2, (xb.ptr >> 2) + x.length));
    });
  }

  /** kvmem_attend, as Node's attend(ctx, q, options): q [nRows][nQHeads][headDim]
   *  post-RoPE over an agent's layer ({ agent, layer, positions | basePosition }; q
   *  flat or a view) or over tensors ({ k, v } views [T][nKvHeads][headDim], keys
   *  post-RoPE; q a {data, shape} view); options mask, out, dtype, tileOrder and
   *  kvmem_attend_params (order, nSink, tileSize, scale, tauS, tauD, patience,
   *  probe, causal, compare). Returns { out, stats }. */
  attend(ctx, q, options) {
    // handles of another instance point into another heap
    if (!(ctx instanceof Context) || ctx._km !== this) throw new TypeError('kvmem: attend: ctx must be a Context of this module');
    const o = readKeys(options, ATTEND_OWN_KEYS.concat(ATTEND_PARAM_KEYS), 'attend options', { unsupported: ATTEND_UNSUPPORTED });
    const { agent, layer = 0, positions, basePosition = 0, k, v, mask, out, dtype } = o;
    const p = attendParams(this, Object.fromEntries(ATTEND_PARAM_KEYS.concat(['tileOrder']).map((key) => [key, o[key]])));
    const sb = new HeapBlock(this, 9 * 8);
    try {
      let qt, run;
      if (agent !== undefined && agent !== null) {
        if (!(agent instanceof Agent) || agent._km !== this) throw new TypeError('kvmem: attend: agent must be an Agent of this module');
        if (k != null || v != null) throw new TypeError('kvmem: attend: give {agent} or {k, v}, not both');
        const s = agent.pool.spec;
        qt = tensorView(q, 'q', [-1, s.nQHeads, s.headDim], dtype);
        const pos = positions == null ? null : int32s(positions, 'positions', agent.getInfo().nTokens);
        run = (qb, ob) => this._withHeap([this._copyIn(pos), this._copyIn(p.tileOrder)], ([pb, tb]) =>
          this._check(this._fn('kvmw_attend_agent', 'number', Array(22).fill('number'))(
            ctx._live(), agent.pool._live(), agent._live(), int32(layer, 'layer'), qb.ptr, qt.ext[0], pb.ptr, num(basePosition, 'basePosition'),
            p.order, p.nSink, tb.ptr, p.nTileOrder, p.tileSize, p.scale, p.tauS, p.tauD, p.patience, p.probe, p.causal,
            p.compare, ob.ptr, sb.ptr)));
      } else {
        if (k == null || v == null) throw new TypeError('kvmem: attend needs {agent} or {k, v}');
        if (positions != null || o.basePosition !== undefined || o.layer !== undefined)
          throw new TypeError('kvmem: attend: layer, positions and basePosition go with {agent}');
        qt = tensorView(q, 'q', null, dtype);
        const kt = tensorView(k, 'k', null, dtype);
        const vt = tensorView(v, 'v', kt.ext, dtype);
        if (qt.ext.length !== 3 || kt.ext.length !== 3 || kt.ext[2] !== qt.ext[2])
          throw new RangeError(`kvmem: attend: q [${qt.ext}] and k [${kt.ext}] must be [nRows, nQHeads, headDim] and [T, nKvHeads, headDim]`);
        const T = kt.ext[0];
        const m = mask == null ? null : (mask instanceof Uint8Array ? mask : Uint8Array.from(mask));
        if (m && m.length !== T) throw new RangeError(`kvmem: mask has ${m.length} entries, expected ${T}`);
        run = (qb, ob) => this._withHeap([this._copyIn(packed(kt)), this._copyIn(packed(vt)), this._copyIn(m), this._copyIn(p.tileOrder)],
          ([kb, vb, mb, tb]) => this._check(this._fn('kvmw_attend_tensors', 'number', Array(25).fill('number'))(
            ctx._live(), qb.ptr, qt.ext[0], qt.ext[1], qt.ext[2], kb.ptr, vb.ptr, T, kt.ext[1], mb.ptr,
            p.order, p.nSink, tb.ptr, p.nTileOrder, p.tileSize, p.scale, p.tauS, p.tauD, p.patience, p.probe,
            p.causal, p.compare, ob.ptr, sb.ptr, 0)));
      }
      const ot = out == null ? null : tensorView(out, 'out', qt.ext, dtype);
      const result = out == null ? new Float32Array(qt.count) : null;
      this._withHeap([this._copyIn(packed(qt)), new HeapBlock(this, 4 * qt.count)], ([qb, ob]) => {
        run(qb, ob);
        const got = this._f32.subarray(ob.ptr >> 2, (ob.ptr >> 2) + qt.count);
        if (ot) unpack(got, ot);
        else result.set(got);
      });
      return { out: out == null ? result : out, stats: readStats(this, sb.ptr) };
    } finally {
      sb.free();
    }
  }
  attendAsync(ctx, q, options) { return promised(() => this.attend(ctx, q, options)); }

  /** The scripted session of `kvmem demo` (agents, turns, questions, model). */
  demoScript() { return JSON.parse(this._fn('kvmw_demo_script', 'string', [])()); }

  /** The tinyllm engine on a real model, its KV memory a kvmem agent: model is a
   *  llama2.c checkpoint or a GGUF file (llama, F32/F16), tokenizer llama2.c's
   *  tokenizer file (null: the GGUF's own vocabulary); bytes as ArrayBuffer or a
   *  typed array, copied. Throws FormatError with the loader's message. */
  storyOpen(model, tokenizer = null) {
    const open = this._fn('kvmw_story_open', 'number', Array(5).fill('number')); // UNSUPPORTED without the engine
    const mb = asBytes(model, 'model'), tb = tokenizer == null ? null : asBytes(tokenizer, 'tokenizer');
    if (!mb.length) throw badArg('the model file is empty');
    return this._withHeap([this._copyIn(mb), this._copyIn(tb && tb.length ? tb : null)], ([m, t]) => {
      this._check(open(m.ptr, mb.length, t.ptr, t.ptr ? tb.length : 0, this._scratch));
      return new Story(this, this._readPtr());
    });
  }

  /** Free the module's own scratch memory (after every object is closed). */
  close() {
    if (this._scratch) this._free(this._scratch);
    this._scratch = 0;
  }

  // ---- deprecated names ----
  /** @deprecated new km.Context(options) or km.contextCreate(options) */
  createContext(options) { deprecated('km.createContext()', 'new km.Context(options) or km.contextCreate(options)'); return this.contextCreate(options); }
  /** @deprecated km.retrievalCreate() or new km.Retrieval() */
  createRetrieval() { deprecated('km.createRetrieval()', 'km.retrievalCreate() or new km.Retrieval()'); return this.retrievalCreate(); }
  /** @deprecated km.rngCreate(seed) */
  createRng(seed) { deprecated('km.createRng()', 'km.rngCreate(seed)'); return this.rngCreate(seed); }
  /** @deprecated km.attendDefaultParams() */
  attendDefaults() { deprecated('km.attendDefaults()', 'km.attendDefaultParams()'); return this.attendDefaultParams(); }
  /** @deprecated km.storyOpen(model, tokenizer) */
  openStory(model, tokenizer) { deprecated('km.openStory()', 'km.storyOpen(model, tokenizer)'); return this.storyOpen(model, tokenizer); }
}

// The Node module's namespace on the instance: constants, error classes, Pool and Agent.
Object.assign(Kvmem.prototype, CONSTANTS, ERRORS);

// ---------------------------------------------------------------------------
// Handles
// ---------------------------------------------------------------------------

class Handle {
  constructor(km, ptr, what) {
    this._km = km;
    this._ptr = ptr;
    this._what = what;
  }
  _live() {
    if (!this._ptr) throw closedError(`${this._what} is closed`);
    return this._ptr;
  }
  /** the C pointer (a number); throws ClosedError once closed */
  get handle() { return this._live(); }
  get closed() { return !this._ptr; }
}
if (Symbol.dispose) Handle.prototype[Symbol.dispose] = function dispose() { this.close(); };

export class Context extends Handle {
  /** new km.Context(options) (or km.contextCreate). options: { backend = 'auto', nThreads = 0 };
   *  the module has the CPU backend only and no threads (nThreads reads 1). */
  constructor(km, options) {
    if (!(km instanceof Kvmem)) throw new TypeError('kvmem: use new km.Context(options), km being the module from load()');
    const { backend = 'auto', nThreads = 0 } = readKeys(options, ['backend', 'nThreads'], 'Context options');
    km._check(km._fn('kvmw_context_create', 'number', ['string', 'number', 'number'])(cId(backend, 'backend'),
      int32(nThreads, 'nThreads'), km._scratch));
    super(km, km._readPtr(), 'Context');
    this._pools = new Set();
  }
  get backend() { return this._km._fn('kvmem_context_backend', 'string', ['number'])(this._live()); }
  get nThreads() { return this._km._fn('kvmem_context_n_threads', 'number', ['number'])(this._live()); }

  /** spec: kvmem_model_spec in camelCase ({ nLayers, nQHeads, nKvHeads, headDim, rotaryDim,
   *  ropeStyle, ropeTheta, ropeScaling, ..., layerWindow, modelId }); params: { blockSize,
   *  storageDtype, capacityBytes, maxAgents, maxTokensPerAgent, hostBudgetBytes, deviceCapacityBytes }. */
  poolCreate(spec, params) { return new Pool(this, spec, params); }

  close() {
    if (!this._ptr) return;
    for (const p of [...this._pools]) p.close();
    this._km._fn('kvmem_context_free', null, ['number'])(this._ptr);
    this._ptr = 0;
  }

  // ---- deprecated names ----
  /** @deprecated ctx.poolCreate(spec, params) */
  createPool(spec, params) { deprecated('ctx.createPool()', 'ctx.poolCreate(spec, params)'); return this.poolCreate(spec, params); }
  /** @deprecated km.attend(ctx, q, { k, v, ... }) */
  attendTensors(q, nRows, k, v, { nQHeads, nKvHeads, headDim, mask = null, ...params } = {}) {
    deprecated('ctx.attendTensors()', 'km.attend(ctx, {data: q, shape}, { k: {data: k, shape}, v: {data: v, shape}, ... })');
    const row = nKvHeads * headDim;
    return this._km.attend(this, { data: q, shape: [nRows, nQHeads, headDim] }, {
      k: { data: k, shape: [k.length / row, nKvHeads, headDim] }, v: { data: v, shape: [v.length / row, nKvHeads, headDim] },
      mask, ...params,
    });
  }
}

export class Pool extends Handle {
  /** As Node's: new Pool(ctx, spec, params), the same as ctx.poolCreate(spec, params). */
  constructor(ctx, spec, params) {
    if (!(ctx instanceof Context)) throw new TypeError('kvmem: Pool: ctx must be a Context');
    const km = ctx._km;
    const s = specIn(km, spec);
    const pp = poolParamsIn(km, params);
    km._withHeap([km._copyIn(s.f), km._copyIn(s.layerWindow), km._copyIn(pp)], ([fb, wb, pb]) => {
      km._check(km._fn('kvmw_pool_create', 'number', ['number', 'number', 'number', 'string', 'number', 'number'])(
        ctx._live(), fb.ptr, wb.ptr, s.modelId, pb.ptr, km._scratch));
    });
    super(km, km._readPtr(), 'Pool');
    this.context = ctx;
    this._agents = new Set();
    this._synths = new Set();
    ctx._pools.add(this);
    /** the full spec (getSpec()), read once */
    this.spec = Object.freeze(this.getSpec());
  }

  /** kvmem_pool_get_info: { usedBytes, capacityBytes, nAgents, blockSize, storageDtype } */
  getInfo() {
    const km = this._km;
    km._check(km._fn('kvmw_pool_info', 'number', ['number', 'number'])(this._live(), km._scratch));
    const d = km._f64.subarray(km._scratch >> 3, (km._scratch >> 3) + 5);
    return { usedBytes: d[0], capacityBytes: d[1], nAgents: d[2], blockSize: d[3], storageDtype: d[4] };
  }
  getInfoAsync() { return promised(() => this.getInfo()); }

  /** kvmem_pool_device_stats (experimental): { mirrorBytes, evictions, unmirrored } of the
   *  agents' device-resident mirrors; all 0 here (the module's context is the CPU's). */
  deviceStats() {
    const km = this._km;
    km._check(km._fn('kvmw_pool_device_stats', 'number', ['number', 'number'])(this._live(), km._scratch));
    const d = km._f64.subarray(km._scratch >> 3, (km._scratch >> 3) + 3);
    return { mirrorBytes: d[0], evictions: d[1], unmirrored: d[2] };
  }

  /** kvmem_pool_get_spec: every field, camelCase (ropeStyle and ropeScaling as numbers). */
  getSpec() {
    const km = this._km;
    const call = (cap) => km._withHeap([new HeapBlock(km, 8 * SPEC_NUMS.length), new HeapBlock(km, 4 * Math.max(cap, 1)),
      new HeapBlock(km, 128 + 4)], ([fb, wb, ib]) => {
      km._check(km._fn('kvmw_pool_spec', 'number', Array(6).fill('number'))(this._live(), fb.ptr, wb.ptr, cap, ib.ptr + 128, ib.ptr));
      const f = km._f64.slice(fb.ptr >> 3, (fb.ptr >> 3) + SPEC_NUMS.length);
      const has = km._i32[(ib.ptr + 128) >> 2] === 1;
      const o = {};
      SPEC_NUMS.forEach((k, i) => { o[k] = f[i]; });
      o.layerWindow = has && cap >= o.nLayers ? Array.from(km._i32.subarray(wb.ptr >> 2, (wb.ptr >> 2) + o.nLayers)) : (has ? undefined : null);
      o.modelId = km.M.UTF8ToString(ib.ptr);
      return o;
    });
    const o = call(0);
    return o.layerWindow === undefined ? call(o.nLayers) : o;
  }

  /** The id of the agent at `index` (0 .. getInfo().nAgents - 1). */
  agentId(index) {
    const km = this._km, f = km._fn('kvmem_pool_agent_id', 'number', Array(5).fill('number'));
    km._check(f(this._live(), int32(index, 'index'), 0, 0, km._scratch));
    const len = km._readPtr();
    return km._withHeap([new HeapBlock(km, len + 1)], ([b]) => {
      km._check(f(this._live(), index, b.ptr, len + 1, km._scratch));
      return km.M.UTF8ToString(b.ptr, len);
    });
  }
  agentIds() { return Array.from({ length: this.getInfo().nAgents }, (_, i) => this.agentId(i)); }

  /** Open (creating if needed) the agent `id`. */
  agentOpen(id) { return new Agent(this, id); }
  agentOpenAsync(id) { return promised(() => this.agentOpen(id)); }

  removeAgent(id) {
    this._km._check(this._km._fn('kvmem_pool_remove_agent', 'number', ['number', 'string'])(this._live(), cId(id, 'agent id')));
  }
  removeAgentAsync(id) { return promised(() => this.removeAgent(id)); }

  /** The synthetic session generator of `kvmem demo` (synth/synth.c) for this pool's model. */
  synthCreate(nTopics, seed) {
    const km = this._km;
    const s = BigInt.asUintN(64, BigInt(seed));
    km._check(km._fn('kvmw_synth_create', 'number', Array(5).fill('number'))(
      this._live(), int32(nTopics, 'nTopics'), Number(s & 0xffffffffn), Number(s >> 32n), km._scratch));
    const syn = new Synth(km, km._readPtr(), this);
    this._synths.add(syn);
    return syn;
  }

  close() {
    if (!this._ptr) return;
    for (const s of [...this._synths]) s.close();
    for (const a of this._agents) a._ptr = 0; // the pool frees every handle
    this._agents.clear();
    this._km._fn('kvmem_pool_free', null, ['number'])(this._ptr);
    this._ptr = 0;
    this.context._pools.delete(this);
  }

  // ---- deprecated names ----
  /** @deprecated pool.agentOpen(id) */
  openAgent(id) { deprecated('pool.openAgent()', 'pool.agentOpen(id)'); return this.agentOpen(id); }
  /** @deprecated pool.synthCreate(nTopics, seed) */
  createSynth(nTopics, seed) { deprecated('pool.createSynth()', 'pool.synthCreate(nTopics, seed)'); return this.synthCreate(nTopics, seed); }
  /** @deprecated pool.getInfo().blockSize */
  get blockSize() { deprecated('pool.blockSize', 'pool.getInfo().blockSize'); return this.getInfo().blockSize; }
  /** @deprecated km.ropeApply(pool.spec, x, positions, { stride, inverse }) (in place) */
  ropeApply(x, nRows, stride, positions, inverse = false) {
    deprecated('pool.ropeApply()', 'km.ropeApply(pool.spec, x, positions, { stride, inverse }), which rotates x in place');
    if (int32s(positions, 'positions').length !== nRows) throw badArg(`positions must hold ${nRows} values`);
    const r = Float32Array.from(x);
    this._km.ropeApply(this.spec, r, positions, { stride, inverse });
    return r;
  }
}

const APPEND_KEYS = ['tokenIds', 'text', 'tokenTextOffsets', 'positions', 'keysRotated', 'dtype'];
const OUT_KEYS = ['kOut', 'vOut', 'dtype', 'keys', 'values'];

export class Agent extends Handle {
  /** As Node's: new Agent(pool, id), the same as pool.agentOpen(id). */
  constructor(pool, id) {
    if (!(pool instanceof Pool)) throw new TypeError('kvmem: Agent: pool must be a Pool');
    const km = pool._km;
    km._check(km._fn('kvmem_agent_open', 'number', ['number', 'string', 'number'])(pool._live(), cId(id, 'agent id'), km._scratch));
    super(km, km._readPtr(), `Agent '${id}'`);
    this.pool = pool;
    this.id = id;
    pool._agents.add(this);
  }

  _kvShape(n = -1) { const s = this.pool.spec; return [s.nLayers, n, s.nKvHeads, s.headDim]; }

  /** Append T tokens: k, v [nLayers][T][nKvHeads][headDim] (Float32Array, T from its
   *  length, or a {data, shape, strides} view). options: { tokenIds, text (string or
   *  bytes), tokenTextOffsets, positions (keys are post-RoPE there; kvmem de-rotates
   *  them), keysRotated, dtype ('f32') }. */
  append(k, v, options, ...rest) {
    let expect;
    if (typeof options === 'number') {
      deprecated('agent.append(k, v, nTokens, options)', 'agent.append(k, v, options) (T comes from k)');
      expect = options;
      options = rest[0];
    }
    const km = this._km;
    const o = readKeys(options, APPEND_KEYS, 'append options');
    const kt = tensorView(k, 'k', this._kvShape(expect ?? -1), o.dtype);
    const T = kt.ext[1];
    const vt = tensorView(v, 'v', this._kvShape(T), o.dtype);
    const ids = int32s(o.tokenIds, 'tokenIds', T), offsets = int32s(o.tokenTextOffsets, 'tokenTextOffsets', T);
    const pos = int32s(o.positions, 'positions', T);
    const text = o.text == null ? null : textBytesOf(o.text, 'text');
    km._withHeap([km._copyIn(packed(kt)), km._copyIn(packed(vt)), km._copyIn(ids), km._copyIn(text && text.length ? text : null),
      km._copyIn(offsets), km._copyIn(pos)], ([kb, vb, ib, tb, ob, pb]) => {
      km._check(km._fn('kvmw_agent_append', 'number', Array(11).fill('number'))(this.pool._live(), this._live(), kb.ptr, vb.ptr, T,
        ib.ptr, tb.ptr, text ? text.length : 0, ob.ptr, pb.ptr, flag(o.keysRotated ?? pos != null)));
    });
  }
  appendAsync(k, v, options) { return promised(() => this.append(k, v, options)); }

  flush() { this._km._check(this._km._fn('kvmem_agent_flush', 'number', ['number'])(this._live())); }
  flushAsync() { return promised(() => this.flush()); }

  /** kvmem_agent_get_info: { nTokens, nBlocks, nSealed, bytes, textBytes } */
  getInfo() {
    const km = this._km;
    km._check(km._fn('kvmw_agent_info', 'number', ['number', 'number'])(this._live(), km._scratch));
    const d = km._f64.subarray(km._scratch >> 3, (km._scratch >> 3) + 5);
    return { nTokens: d[0], nBlocks: d[1], nSealed: d[2], bytes: d[3], textBytes: d[4] };
  }

  /** kvmem_agent_block_info: { firstToken, nTokens, sealed } */
  blockInfo(block) {
    const km = this._km;
    km._check(km._fn('kvmw_block_info', 'number', ['number', 'number', 'number'])(this._live(), int32(block, 'block'), km._scratch));
    const d = km._f64.subarray(km._scratch >> 3, (km._scratch >> 3) + 3);
    return { firstToken: d[0], nTokens: d[1], sealed: d[2] === 1 };
  }

  /** The AABB of a sealed block: { min, max }, each [nLayers][nKvHeads][headDim]. */
  blockAabb(block) {
    const km = this._km;
    const s = this.pool.spec, n = s.nLayers * s.nKvHeads * s.headDim;
    return km._withHeap([new HeapBlock(km, 8 * n)], ([b]) => {
      km._check(km._fn('kvmem_agent_block_aabb', 'number', Array(4).fill('number'))(this._live(), int32(block, 'block'), b.ptr, b.ptr + 4 * n));
      const all = km._f32.slice(b.ptr >> 2, (b.ptr >> 2) + 2 * n);
      return { min: all.subarray(0, n), max: all.subarray(n) };
    });
  }

  // The outputs of read/gather ([nLayers][n][nKvHeads][headDim] f32): the
  // caller's kOut/vOut (written) or new arrays; keys/values false skip one.
  _outputs(options, what, n, call) {
    const km = this._km;
    const o = readKeys(options, OUT_KEYS, what);
    checkF32(o.dtype, what);
    const shape = this._kvShape(n), count = shape.reduce((a, b) => a * b, 1);
    const kv = o.kOut == null ? null : tensorView(o.kOut, 'kOut', shape), vv = o.vOut == null ? null : tensorView(o.vOut, 'vOut', shape);
    const wantK = o.keys !== false || kv, wantV = o.values !== false || vv;
    return km._withHeap([new HeapBlock(km, wantK ? 4 * count : 0), new HeapBlock(km, wantV ? 4 * count : 0)], ([kb, vb]) => {
      call(kb.ptr, vb.ptr);
      const take = (b, want, view, given) => {
        if (!want) return null;
        const got = b.ptr ? km._f32.subarray(b.ptr >> 2, (b.ptr >> 2) + count) : new Float32Array(0); // no block: 0 tokens
        if (!view) return got.slice();
        unpack(got, view);
        return given;
      };
      return { k: take(kb, wantK, kv, o.kOut), v: take(vb, wantV, vv, o.vOut), shape };
    });
  }

  /** Raw KV of tokens [first, first + n) as { k, v, shape }; options: { kOut, vOut (written
   *  in place), dtype ('f32'), keys, values (false: skip) }. */
  read(first = 0, n, options) {
    int32(first, 'first');
    if (n === undefined || n === null) n = this.getInfo().nTokens - first;
    int32(n, 'n');
    return this._outputs(options, 'read options', n, (kp, vp) =>
      this._km._check(this._km._fn('kvmw_agent_read', 'number', Array(6).fill('number'))(this.pool._live(), this._live(), first, n, kp, vp)));
  }
  readAsync(first, n, options) { return promised(() => this.read(first, n, options)); }

  /** Token ids of [first, first + n) (-1 where none was given). */
  tokens(first = 0, n) {
    const km = this._km;
    int32(first, 'first');
    if (n === undefined) n = this.getInfo().nTokens - first;
    int32(n, 'n');
    return km._withHeap([new HeapBlock(km, 4 * n)], ([b]) => {
      km._check(km._fn('kvmw_agent_tokens', 'number', Array(4).fill('number'))(this._live(), first, n, b.ptr));
      return km._i32.slice(b.ptr >> 2, (b.ptr >> 2) + n);
    });
  }
  /** The agent's stored text, as bytes (a copy). */
  textBytes() {
    const km = this._km, sc = km._scratch;
    km._check(km._fn('kvmem_agent_text', 'number', Array(3).fill('number'))(this._live(), sc, sc + 4));
    const p = km._u32[sc >> 2], len = km._u32[(sc >> 2) + 1];
    return len ? km.M.HEAPU8.slice(p, p + len) : new Uint8Array(0);
  }
  text() { return utf8Decoder.decode(this.textBytes()); }

  truncate(nTokens) {
    this._km._check(this._km._fn('kvmw_agent_truncate', 'number', ['number', 'number'])(this._live(), num(nTokens, 'nTokens')));
  }

  /** kvmem_prefix_match: { kind, reuseTokens, commonBytes, processFrom (a byte offset into
   *  the UTF-8 text) }; options: { minRatio } */
  prefixMatch(newText, options) {
    const km = this._km;
    const { minRatio } = readKeys(options, ['minRatio'], 'prefixMatch options');
    const bytes = textBytesOf(newText, 'newText');
    return km._withHeap([km._copyIn(bytes.length ? bytes : null)], ([tb]) => {
      km._check(km._fn('kvmw_prefix_match', 'number', Array(6).fill('number'))(this._live(), tb.ptr, bytes.length,
        flag(minRatio !== undefined), minRatio === undefined ? 0 : num(minRatio, 'minRatio'), km._scratch));
      const d = km._f64.subarray(km._scratch >> 3, (km._scratch >> 3) + 4);
      return { kind: d[0], reuseTokens: d[1], commonBytes: d[2], processFrom: d[3] };
    });
  }

  /** kvmem_retrieve: query rows q [nQ][nLayers][nQHeads][headDim], raw (pre-RoPE), nQ from
   *  its length. options: { topK, mode ('aabb'|'exact' or RETRIEVE_*), norm ('softmax'|'rr'),
   *  agg ('max'|'sum'), scope ('global'|'per-layer'), tau, rrC, exclude, alwaysInclude,
   *  recentWindow, skipRecent, result (a Retrieval to fill and return), dtype ('f32') }.
   *  Returns a RetrievalResult (plain data), or `result`. */
  retrieve(q, options, ...rest) {
    if (typeof options === 'number') {
      deprecated('agent.retrieve(q, nQ, params, into)', 'agent.retrieve(q, { ...params, result }) (nQ comes from q)');
      const [params = {}, into = null] = rest;
      const s = this.pool.spec;
      tensorView(q, 'query', [options, s.nLayers, s.nQHeads, s.headDim]);
      const r = this._retrieve(q, { ...params, result: into || undefined });
      return r instanceof Retrieval ? r._snapshot() : r;
    }
    return this._retrieve(q, options);
  }
  retrieveAsync(q, options) { return promised(() => this.retrieve(q, options)); }

  _retrieve(q, options) {
    const km = this._km, s = this.pool.spec;
    const o = readKeys(options, RETRIEVE_KEYS, 'retrieve options');
    if (o.result != null && (!(o.result instanceof Retrieval) || o.result._km !== km))
      throw new TypeError('kvmem: retrieve options: result must be a Retrieval of this module');
    const p = retrieveParams(km, o);
    const qt = tensorView(q, 'query', [-1, s.nLayers, s.nQHeads, s.headDim], o.dtype);
    const r = o.result ?? new Retrieval(km);
    try {
      km._withHeap([km._copyIn(packed(qt)), km._copyIn(p.exclude), km._copyIn(p.alwaysInclude)], ([qb, eb, ib]) => {
        km._check(km._fn('kvmw_retrieve', 'number', Array(18).fill('number'))(
          this.pool._live(), this._live(), qb.ptr, qt.ext[0], p.topK, p.mode, p.norm, p.agg, p.scope, p.tau, p.rrC,
          eb.ptr, p.exclude.length, ib.ptr, p.alwaysInclude.length, p.recentWindow, p.skipRecent, r._live()));
      });
      return o.result ? r : r._snapshot();
    } finally {
      if (!o.result) r.close();
    }
  }

  /** kvmem_gather: sealed blocks concatenated, keys re-encoded at basePosition.., as
   *  { k, v, shape } ([nLayers][M][nKvHeads][headDim]); options as read's. */
  gather(blocks, basePosition = 0, options) {
    const km = this._km;
    const ids = int32s(blocks, 'blocks');
    if (!ids) throw new TypeError('kvmem: gather: blocks must be an array of block ids');
    let M = 0;
    for (const b of ids) M += this.blockInfo(b).nTokens;
    const r = km._withHeap([km._copyIn(ids)], ([bb]) => this._outputs(options, 'gather options', M, (kp, vp) =>
      km._check(km._fn('kvmw_gather', 'number', Array(8).fill('number'))(this.pool._live(), this._live(), bb.ptr, ids.length,
        num(basePosition, 'basePosition'), kp, vp, M))));
    // the old result's token count, kept off Object.keys: shape[1] says it
    Object.defineProperty(r, 'nTokens', { enumerable: false, get() { deprecated('gather(...).nTokens', 'gather(...).shape[1]'); return M; } });
    return r;
  }
  gatherAsync(blocks, basePosition, options) { return promised(() => this.gather(blocks, basePosition, options)); }

  close() {
    if (!this._ptr) return;
    this._km._fn('kvmem_agent_close', null, ['number'])(this._ptr);
    this._ptr = 0;
    this.pool._agents.delete(this);
  }
  closeAsync() { return promised(() => this.close()); }

  // ---- deprecated names ----
  /** @deprecated agent.getInfo() */
  info() { deprecated('agent.info()', 'agent.getInfo()'); return this.getInfo(); }
  /** @deprecated km.attend(ctx, q, { agent, layer, ... }) */
  attend(layer, q, nRows, params = {}) {
    deprecated('agent.attend(layer, q, nRows, params)', 'km.attend(ctx, q, { agent, layer, ...params })');
    const s = this.pool.spec;
    tensorView(q, 'q', [nRows, s.nQHeads, s.headDim]);
    return this._km.attend(this.pool.context, q, { ...params, agent: this, layer });
  }
}

// The readers of a retrieval result, shared by Retrieval (read from C) and
// RetrievalResult (a copy): Node's Retrieval methods, plus `sets`.
const READERS = {
  /** every set: [{ blocks, scores, nTokens, blockScores }] */
  get sets() { return Array.from({ length: this.nSets }, (_, s) => ({ ...this.get(s), nTokens: this.nTokens(s), blockScores: this.blockScores(s) })); },
  /** the selected blocks (chronological) and their scores S(b) of a set, copied */
  view(set = 0) { return this.get(set); },
};

/** A retrieval's sets as plain data (agent.retrieve without `result`); close() does nothing. */
export class RetrievalResult {
  constructor(sets) { this._sets = sets; }
  get nSets() { return this._sets.length; }
  _set(set) {
    int32(set, 'set');
    if (set < 0 || set >= this._sets.length) throw badArg(`set ${set}: the result has ${this._sets.length}`);
    return this._sets[set];
  }
  get(set = 0) { const s = this._set(set); return { blocks: s.blocks.slice(), scores: s.scores.slice() }; }
  /** S(b) of every sealed block at retrieval time (NaN: not a candidate) */
  blockScores(set = 0) { return this._set(set).blockScores.slice(); }
  nTokens(set = 0) { return this._set(set).nTokens; }
  close() {}
}
Object.defineProperties(RetrievalResult.prototype, Object.getOwnPropertyDescriptors(READERS));
if (Symbol.dispose) RetrievalResult.prototype[Symbol.dispose] = function dispose() {};

/** A reusable C retrieval result (kvmem_retrieval): new km.Retrieval() or km.retrievalCreate();
 *  pass it as retrieve's `result`; close() when done. */
export class Retrieval extends Handle {
  constructor(km) {
    if (!(km instanceof Kvmem)) throw new TypeError('kvmem: use new km.Retrieval(), km being the module from load()');
    km._check(km._fn('kvmem_retrieval_create', 'number', ['number'])(km._scratch));
    super(km, km._readPtr(), 'Retrieval');
  }
  get nSets() { return this._km._fn('kvmem_retrieval_n_sets', 'number', ['number'])(this._live()); }
  get(set = 0) {
    const km = this._km, r = this._live(), sc = km._scratch, copy = km._fn('kvmem_retrieval_copy', 'number', Array(6).fill('number'));
    km._check(copy(r, int32(set, 'set'), 0, 0, 0, sc));
    const n = km._i32[sc >> 2];
    return km._withHeap([new HeapBlock(km, 4 * n), new HeapBlock(km, 4 * n)], ([bb, sb]) => {
      if (n) km._check(copy(r, set, bb.ptr, sb.ptr, n, sc));
      return { blocks: km._i32.slice(bb.ptr >> 2, (bb.ptr >> 2) + n), scores: km._f32.slice(sb.ptr >> 2, (sb.ptr >> 2) + n) };
    });
  }
  blockScores(set = 0) {
    const km = this._km, sc = km._scratch;
    km._check(km._fn('kvmem_retrieval_block_scores', 'number', Array(4).fill('number'))(this._live(), int32(set, 'set'), sc, sc + 8));
    const ptr = km._u32[sc >> 2], nb = km._i32[(sc + 8) >> 2];
    return km._f32.slice(ptr >> 2, (ptr >> 2) + nb);
  }
  nTokens(set = 0) {
    const km = this._km, sc = km._scratch;
    km._check(km._fn('kvmem_retrieval_n_tokens', 'number', ['number', 'number', 'number'])(this._live(), int32(set, 'set'), sc));
    return km._u32[sc >> 2] + km._i32[(sc >> 2) + 1] * 4294967296;
  }
  _snapshot() { return new RetrievalResult(this.sets); }
  close() {
    if (this._ptr) this._km._fn('kvmem_retrieval_free', null, ['number'])(this._ptr);
    this._ptr = 0;
  }

  // ---- deprecated names ----
  /** @deprecated retrieval.sets (or get(set), blockScores(set), nTokens(set)) */
  read() { deprecated('retrieval.read()', 'retrieval.sets'); return { sets: this.sets }; }
  /** @deprecated retrieval.close() */
  free() { deprecated('retrieval.free()', 'retrieval.close()'); this.close(); }
}
Object.defineProperties(Retrieval.prototype, Object.getOwnPropertyDescriptors(READERS));

/** The state of the generator's 64-bit PRNG (splitmix64), kept in the wasm heap. */
export class Rng {
  constructor(km, seed) {
    this._km = km;
    this._block = new HeapBlock(km, 8);
    this.state = seed;
  }
  get _ptr() {
    if (!this._block.ptr) throw closedError('Rng is closed');
    return this._block.ptr;
  }
  get state() {
    const u = this._km._u32, i = this._ptr >> 2;
    return (BigInt(u[i + 1]) << 32n) | BigInt(u[i]);
  }
  set state(seed) {
    const s = BigInt.asUintN(64, BigInt(seed)), u = this._km._u32, i = this._ptr >> 2;
    u[i] = Number(s & 0xffffffffn);
    u[i + 1] = Number(s >> 32n);
  }
  close() { this._block.free(); }
  /** @deprecated rng.close() */
  free() { deprecated('rng.free()', 'rng.close()'); this.close(); }
}

export class Synth extends Handle {
  constructor(km, ptr, pool) {
    super(km, ptr, 'Synth');
    this.pool = pool;
  }
  /** K and V of nTokens tokens about `topic`: f32 [nLayers][nTokens][nKvHeads][headDim]. */
  tokens(topic, nTokens, rng) {
    const km = this._km, s = this.pool.spec, n = int32(nTokens, 'nTokens') * s.nLayers * s.nKvHeads * s.headDim;
    return km._withHeap([new HeapBlock(km, 4 * n), new HeapBlock(km, 4 * n)], ([kb, vb]) => {
      km._check(km._fn('kvmw_synth_tokens', 'number', Array(6).fill('number'))(this._live(), int32(topic, 'topic'), nTokens, rng._ptr, kb.ptr, vb.ptr));
      return { k: km._f32.slice(kb.ptr >> 2, (kb.ptr >> 2) + n), v: km._f32.slice(vb.ptr >> 2, (vb.ptr >> 2) + n) };
    });
  }
  /** Raw query rows of nQ tokens asking about `topic`: f32 [nQ][nLayers][nQHeads][headDim]. */
  query(topic, nQ, rng) {
    const km = this._km, s = this.pool.spec, n = int32(nQ, 'nQ') * s.nLayers * s.nQHeads * s.headDim;
    return km._withHeap([new HeapBlock(km, 4 * n)], ([qb]) => {
      km._check(km._fn('kvmw_synth_query', 'number', Array(5).fill('number'))(this._live(), int32(topic, 'topic'), nQ, rng._ptr, qb.ptr));
      return km._f32.slice(qb.ptr >> 2, (qb.ptr >> 2) + n);
    });
  }
  close() {
    if (this._ptr) this._km._fn('kvmw_synth_free', null, ['number'])(this._ptr);
    this._ptr = 0;
    this.pool._synths.delete(this);
  }
  /** @deprecated synth.close() */
  free() { deprecated('synth.free()', 'synth.close()'); this.close(); }
}

function asBytes(x, what) {
  if (x instanceof Uint8Array) return x;
  if (x instanceof ArrayBuffer) return new Uint8Array(x);
  if (ArrayBuffer.isView(x)) return new Uint8Array(x.buffer, x.byteOffset, x.byteLength);
  throw new TypeError(`kvmem: ${what}: expected an ArrayBuffer or a typed array`);
}

// The C side writes JSON with snake_case keys; JavaScript gets camelCase.
function camel(x) {
  if (Array.isArray(x)) return x.map(camel);
  if (x === null || typeof x !== 'object') return x;
  const out = {};
  for (const [k, v] of Object.entries(x)) out[k.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase())] = camel(v);
  return out;
}

/** A story agent on a real model (examples/tinyllm/story_session.c), its history
 *  up to 8 windows of the model: each session asks kvmem for memory (the blocks the
 *  new text's queries retrieve, then the live context, within one window), prefills
 *  the text on it, continues greedily and appends the text to the agent; beside it
 *  the same session runs on text RAG, on the recent window and on the whole
 *  history. close() it. */
export class Story extends Handle {
  constructor(km, ptr) {
    super(km, ptr, 'Story');
    km._check(km._fn('kvmw_story_describe', 'number', ['number', 'number'])(ptr, km._scratch));
    /** { format, dim, hiddenDim, nLayers, nHeads, nKvHeads, headDim, vocab, seqLen, blockSize,
     *  storage, gen, maxPrompt, probeWindow, art, artDefaultTile } */
    this.model = Object.freeze(camel(JSON.parse(km._takeString())));
  }

  /** Tokens in the agent's history. */
  get historyTokens() { return this._km._fn('kvmw_story_history', 'number', ['number'])(this._live()); }

  /** One session of text. options: { art = false (kvmem's run attends with ART and
   *  reports where it stopped), artTile = 0 (ART tile size; 0 = kvmem's default) }.
   *  Returns { session, history, budget, split, text, prompt, memory, art, kvmem, rag,
   *  recent, full, tokens } (kvmem.d.ts: StorySession). Refused (KvmemError, the story
   *  unchanged): empty text, more than model.maxPrompt tokens (or too many for the
   *  window), a story past 8 windows of the model. */
  session(text, options) {
    const km = this._km;
    const { art = false, artTile = 0 } = readKeys(options, ['art', 'artTile'], 'session options');
    if (typeof text !== 'string') throw new TypeError('kvmem: text must be a string');
    if (!Number.isInteger(artTile) || artTile < 0) throw badArg(`artTile ${artTile}: expected an integer >= 0`);
    const bytes = utf8.encode(text);
    return km._withHeap([km._copyIn(bytes)], ([tb]) => {
      km._check(km._fn('kvmw_story_session', 'number', Array(6).fill('number'))(
        this._live(), tb.ptr, bytes.length, flag(art), artTile, km._scratch));
      return camel(JSON.parse(km._takeString()));
    });
  }

  /** Forget the history: the next session is the first again. */
  reset() { this._km._check(this._km._fn('kvmw_story_reset', 'number', ['number'])(this._live())); }

  /** The tokenizer: text to ids (bos: prepend BOS, id 1). */
  encode(text, options) {
    const { bos = false } = readKeys(options, ['bos'], 'encode options');
    const km = this._km, bytes = utf8.encode(String(text)), cap = bytes.length + 3;
    return km._withHeap([km._copyIn(bytes), new HeapBlock(km, 4 * cap)], ([tb, ob]) => {
      km._check(km._fn('kvmw_story_encode', 'number', Array(7).fill('number'))(
        this._live(), tb.ptr, bytes.length, flag(bos), ob.ptr, cap, km._scratch));
      const n = km._i32[km._scratch >> 2];
      return km._i32.slice(ob.ptr >> 2, (ob.ptr >> 2) + n);
    });
  }

  /** Ids to text (the tokenizer's decoding: no space after BOS, <0xNN> as bytes). */
  decode(ids) {
    const km = this._km, a = Int32Array.from(ids);
    for (const id of a)
      if (id < 0 || id >= this.model.vocab) throw badArg(`token id ${id} outside the vocabulary [0, ${this.model.vocab})`);
    return km._withHeap([km._copyIn(a)], ([ib]) => {
      km._check(km._fn('kvmw_story_decode', 'number', Array(4).fill('number'))(this._live(), ib.ptr, a.length, km._scratch));
      return km._takeString();
    });
  }

  close() {
    if (this._ptr) this._km._fn('kvmw_story_free', null, ['number'])(this._ptr);
    this._ptr = 0;
  }
}

// The Node module's classes on the instance too (new km.Pool(ctx, spec) as new kvmem.Pool(ctx, spec)).
Object.assign(Kvmem.prototype, { Pool, Agent });

/** Instantiate the WebAssembly module. options.factory: the Emscripten factory to use
 *  (default: ./kvmem_wasm.js, the browser build; Node passes kvmem_wasm_node.cjs's).
 *  Other options are Emscripten's Module options and go to the factory as they are
 *  (locateFile, preRun, print, ...): the one options object kvmem does not check. */
export async function load({ factory = null, ...moduleOptions } = {}) {
  const create = factory || (await import('./kvmem_wasm.js')).default;
  return new Kvmem(await create(moduleOptions));
}
