'use strict';
// kvmem for Node.js: Context, Pool, Agent owning their C handles (koffi).
//
// Tensors cross without copies: a TypedArray (or Buffer) is handed to C as a
// pointer to its own memory. A flat array is read in the shape the call
// expects; a {data, shape, strides, dtype} object describes a strided view
// (strides in elements, as in C). Float32Array = f32; f16 and bf16 travel as
// Uint16Array bits with dtype 'f16' / 'bf16' (or a Float16Array where Node has it).
//
// Ownership mirrors C: a Pool keeps its Context, an Agent its Pool. close() is
// idempotent; objects support `using` (Symbol.dispose); a FinalizationRegistry
// frees what was never closed. Closing a Pool closes its Agents (C frees their
// handles); closing a Context closes its Pools. Closed objects throw ClosedError.
// Calls that do real work have an `...Async` form running on a worker thread
// (koffi async), so a service's event loop keeps running.
//
// Names: every key of a spec, an options object or a result is the camelCase
// form of its C field (n_kv_heads -> nKvHeads); unknown keys throw (names.js).
const util = require('node:util');
const L = require('./lib');
const errors = require('./errors');
const { cId, cPath } = require('./cstr');
const { camel, readKeys, fromC, toC, NOT_FIELDS } = require('./names');
const { checkInt, intArray } = require('./ints');

const { fns: C, koffi } = L;
const F32 = 0, F16 = 1, BF16 = 2, Q8 = 3, Q4 = 4, Q4_KIVI = 5;
const DTYPES = { f32: F32, float32: F32, f16: F16, float16: F16, bf16: BF16, bfloat16: BF16 };
const STORAGE = { ...DTYPES, q8: Q8, q4: Q4, q4_kivi: Q4_KIVI };
const ITEMSIZE = [4, 2, 2];

function dtypeCode(d, what) {
  if (typeof d === 'number' && d >= 0 && d <= 2) return d;
  const c = DTYPES[String(d).toLowerCase()];
  if (c === undefined) throw new TypeError(`kvmem: ${what}: dtype ${d} is not one of f32, f16, bf16`);
  return c;
}

// ---------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------

const HasF16 = typeof Float16Array !== 'undefined';

// The element dtype of a typed array, given the dtype the caller named (or undefined).
function elemDtype(data, dtype, what) {
  const want = dtype === undefined || dtype === null ? undefined : dtypeCode(dtype, what);
  if (data instanceof Float32Array) {
    if (want !== undefined && want !== F32) throw new TypeError(`kvmem: ${what} is a Float32Array, not ${dtype}`);
    return F32;
  }
  if (HasF16 && data instanceof Float16Array) {
    if (want !== undefined && want !== F16) throw new TypeError(`kvmem: ${what} is a Float16Array, not ${dtype}`);
    return F16;
  }
  if (data instanceof Uint16Array) {
    if (want === undefined || want === F32)
      throw new TypeError(`kvmem: ${what} is a Uint16Array: pass dtype 'f16' or 'bf16' to say what it holds`);
    return want;
  }
  if (data instanceof Uint8Array || data instanceof ArrayBuffer || data instanceof DataView) {
    if (want === undefined) throw new TypeError(`kvmem: ${what} is raw bytes: pass dtype ('f32', 'f16' or 'bf16')`);
    return want;
  }
  throw new TypeError(`kvmem: ${what} must be a Float32Array, Uint16Array (f16/bf16 bits), ` +
                      `Buffer or ArrayBuffer, got ${data === null ? 'null' : data?.constructor?.name ?? typeof data}`);
}

function byteLength(data) { return data.byteLength; }

// A kvmem_tensor (koffi struct object) over x's memory. `shape` is what the
// call expects, -1 entries inferred (at most one).
function tensor(x, what, shape, dtype) {
  if (x instanceof DeviceTensor) { // device memory: the C call checks it against its context
    const t = x._tensor;
    if (shape && (t.ndim !== shape.length || shape.some((s, i) => s >= 0 && s !== Number(t.shape[i]))))
      throw new RangeError(`kvmem: ${what} has shape [${t.shape.slice(0, t.ndim)}], expected [${shape.map(s => s < 0 ? '*' : s)}]`);
    return t;
  }
  let data = x, strides, given;
  if (Array.isArray(x))
    throw new TypeError(`kvmem: ${what} must be a Float32Array (or Uint16Array with dtype, or a {data, shape} view), not an array`);
  if (x && typeof x === 'object' && !ArrayBuffer.isView(x) && !(x instanceof ArrayBuffer)) {
    const o = readKeys(x, ['data', 'shape', 'strides', 'dtype'], `${what} view`);
    data = o.data; given = o.shape; strides = o.strides;
    if (o.dtype !== undefined) dtype = o.dtype;
  }
  const code = elemDtype(data, dtype, what);
  const isz = ITEMSIZE[code];
  if (byteLength(data) % isz) throw new TypeError(`kvmem: ${what}: ${byteLength(data)} bytes is not a whole number of ${isz}-byte elements`);
  const n = byteLength(data) / isz;
  if (data.byteOffset !== undefined && data.byteOffset % isz)
    throw new TypeError(`kvmem: ${what}: byte offset ${data.byteOffset} is not aligned to ${isz}`);
  let ext;
  if (given) {
    ext = Array.from(given, (e, i) => Number(checkInt(e, `${what} shape[${i}]`, 'Int64')));
    if (ext.some((e) => e < 0)) throw new errors.InvalidArgumentError(`${what}: shape [${ext}] has a negative extent`);
    if (shape && (ext.length !== shape.length || ext.some((e, i) => shape[i] >= 0 && shape[i] !== e)))
      throw new RangeError(`kvmem: ${what} has shape [${ext}], expected [${shape.map(s => s < 0 ? '*' : s)}]`);
  } else {
    if (!shape) throw new TypeError(`kvmem: ${what}: give {data, shape} for this call`);
    const known = shape.reduce((a, s) => a * (s >= 0 ? s : 1), 1);
    const unknown = shape.filter(s => s < 0).length;
    if (unknown > 1 || (unknown ? known === 0 || n % known : n !== known))
      throw new RangeError(`kvmem: ${what} holds ${n} elements, which is not a whole tensor of shape [${shape.map(s => s < 0 ? '*' : s)}]`);
    ext = shape.map(s => (s >= 0 ? s : n / known));
  }
  if (ext.length < 1 || ext.length > L.MAX_DIMS) throw new TypeError(`kvmem: ${what} has ${ext.length} dimensions, at most ${L.MAX_DIMS}`);
  if (!strides) {
    strides = new Array(ext.length);
    let acc = 1;
    for (let i = ext.length - 1; i >= 0; i--) { strides[i] = acc; acc *= ext[i]; }
  }
  if (given && strides.length === ext.length) strides = Array.from(strides, (st, i) => Number(checkInt(st, `${what} strides[${i}]`, 'Int64')));
  if (strides.length !== ext.length || strides.some(s => !Number.isInteger(s) || s < 0))
    throw new TypeError(`kvmem: ${what}: strides [${strides}] must be ${ext.length} non-negative integers (elements)`);
  // the furthest element the view reaches must lie inside the array: C trusts it
  if (ext.every(e => e > 0)) {
    const last = ext.reduce((a, e, i) => a + (e - 1) * strides[i], 0);
    if (last >= n) throw new RangeError(`kvmem: ${what}: shape [${ext}] with strides [${strides}] reaches element ${last}, the array has ${n}`);
  }
  const pad = (a) => a.concat(new Array(L.MAX_DIMS - a.length).fill(0));
  return { data, dtype: code, ndim: ext.length, shape: pad(ext), strides: pad(strides) };
}

// A view of device memory (kvmem.h, "Device tensors"): the descriptor lives
// in memory koffi allocated, which the tensor's data points to, until close().
class DeviceTensor {
  constructor(opts) {
    const o = readKeys(opts ?? {}, ['kind', 'handle', 'size', 'dtype', 'shape', 'strides', 'offset', 'device'], 'deviceTensor');
    const kind = { cuda: 1, vulkan: 2 }[o.kind];
    if (!kind) throw new TypeError(`kvmem: deviceTensor kind ${o.kind} is not 'cuda' or 'vulkan'`);
    const shape = Array.from(o.shape ?? [], Number);
    this._mem = L.koffi.alloc(L.types.kvmem_device_memory, 1);
    L.koffi.encode(this._mem, L.types.kvmem_device_memory, {
      struct_size: L.koffi.sizeof(L.types.kvmem_device_memory), kind, device: o.device ?? 0,
      handle: BigInt(o.handle ?? 0), offset: BigInt(o.offset ?? 0), size: BigInt(o.size ?? 0), stream: null,
    });
    const t = {};
    try {
      C.kvmem_tensor_init_device(t, this._mem, dtypeCode(o.dtype ?? 'f32', 'dtype'), shape.length, shape);
    } catch (e) { L.koffi.free(this._mem); throw e; }
    if (o.strides) t.strides = Array.from(o.strides, Number).concat(new Array(L.MAX_DIMS - o.strides.length).fill(0));
    this._tensor = t;
  }
  close() { if (this._mem) { L.koffi.free(this._mem); this._mem = null; } }
}

function newArray(n, dtype) {
  const c = dtypeCode(dtype, 'dtype');
  return c === F32 ? new Float32Array(n) : (c === F16 && HasF16 ? new Float16Array(n) : new Uint16Array(n));
}

function int32s(x, what, n) {
  if (x === undefined || x === null) return null;
  const a = intArray(x, Int32Array, 'Int32', what); // arrays of numbers are converted (copied), each checked
  if (n !== undefined && a.length !== n) throw new RangeError(`kvmem: ${what} has ${a.length} entries, expected ${n}`);
  return a;
}

// ---------------------------------------------------------------------------
// Handles
// ---------------------------------------------------------------------------

const registry = new FinalizationRegistry(({ free, handle }) => {
  try { free(handle); } catch { /* never throw from a finalizer */ }
});

const noop = () => undefined;

class Handle {
  _own(handle, free, kind) {
    this._h = handle;
    this._kind = kind;
    this._busy = 0;    // async calls made on this object (or writing into it) not yet settled
    this._pins = 0;    // async calls on other objects that use this one (close() waits for them)
    this._turn = false;
    this._tail = null;
    this._free = free;
    registry.register(this, { free, handle }, this);
  }
  // The C handle for a synchronous call. Refused with BusyError while an async call
  // made on this object has not settled: the sync call would run before it (the async
  // one waits for its turn) or beside it on another thread.
  get handle() {
    const h = this._ptr();
    if (this._busy && !this._turn)
      throw new errors.BusyError(`${this._kind}: an async call made on it has not settled; await it before a synchronous call`);
    return h;
  }
  // the C handle, whatever runs on it (what an async call takes when its turn comes)
  _ptr() {
    if (this._h === null) throw new errors.ClosedError(`${this._kind} is closed`);
    return this._h;
  }
  get closed() { return this._h === null; }
  _forget() { registry.unregister(this); this._h = null; }
  close() {
    if (this._h === null) return;
    if (this._busy || this._pins) throw new errors.BusyError(`${this._kind}: an async call is still running on it; await it before close()`);
    const h = this._h;
    this._forget();
    this._free(h);
  }
  // An async call on this object: koffi runs it on a worker thread. It marks the
  // object busy at once (so a synchronous call made after it is refused rather than
  // run first), and waits for the async calls made on this object before it, so they
  // run in the order they were made. prepare() runs when its turn comes and may make
  // synchronous calls on this object (sizes, output arrays); it returns {args, out}.
  // `marks`: other objects the call writes (busy too); `pins`: objects it only
  // reads, kept open until it settles.
  _async(fn, prepare, { marks = [], pins = [] } = {}) {
    this._ptr();
    this._busy++;
    for (const m of marks) m._busy++;
    for (const p of pins) p._pins++;
    const turn = () => {
      let job;
      this._turn = true;
      try { job = prepare(); } finally { this._turn = false; }
      return fn.async(...job.args).then(() => (job.done ? job.done() : job.out));
    };
    const p = (this._tail || Promise.resolve()).then(turn, turn);
    this._tail = p.then(noop, noop);
    return p.finally(() => {
      this._busy--;
      for (const m of marks) m._busy--;
      for (const q of pins) q._pins--;
    });
  }
}
if (Symbol.dispose) Handle.prototype[Symbol.dispose] = function () { this.close(); };
// util.inspect / console.log: what the object is (its describe(), e.g. an agent's id and
// token counts), not the binding's internals (the C pointer, counters, queues)
Handle.prototype[util.inspect.custom] = function (depth, options, inspect) {
  let body;
  if (this._h === null) body = { closed: true };
  else if (this._busy) body = { pending: 'an async call has not settled' };
  else {
    try { body = this._describe(); } catch (e) { body = { error: e.message }; }
  }
  if (this._id !== undefined && !('id' in body)) body = { id: this._id, ...body };
  return `${this.constructor.name} ${inspect(body, { ...options, depth: options.depth === null ? null : options.depth - 1 })}`;
};
Handle.prototype._describe = function () { return {}; };

const APPEND_KEYS = ['tokenIds', 'text', 'tokenTextOffsets', 'positions', 'keysRotated', 'dtype'];

// K, V [n_layers][T][n_kv_heads][head_dim] and kvmem_append_params from opts
function kvArgs(spec, k, v, options, what) {
  const opts = readKeys(options, APPEND_KEYS, `${what} options`);
  const shape = [spec.nLayers, -1, spec.nKvHeads, spec.headDim];
  const kt = tensor(k, 'k', shape, opts.dtype);
  const vt = tensor(v, 'v', shape, opts.dtype);
  const T = kt.shape[1];
  const ap = C.kvmem_append_default_params();
  ap.token_ids = int32s(opts.tokenIds, 'tokenIds', T);
  if (opts.text !== undefined && opts.text !== null) {
    if (typeof opts.text !== 'string' && !(opts.text instanceof Uint8Array))
      throw new TypeError(`kvmem: ${what} options: text must be a string or a Buffer, not ${typeof opts.text}`);
    const tb = typeof opts.text === 'string' ? Buffer.from(opts.text, 'utf8') : Buffer.from(opts.text.buffer, opts.text.byteOffset, opts.text.byteLength);
    // koffi passes a Buffer as a pointer to its bytes (no NUL needed: text_len says how many)
    ap.text = tb.length ? tb : null;
    ap.text_len = tb.length;
  }
  ap.token_text_offsets = int32s(opts.tokenTextOffsets, 'tokenTextOffsets', T);
  ap.positions = int32s(opts.positions, 'positions', T);
  ap.keys_rotated = (opts.keysRotated ?? (opts.positions != null)) ? 1 : 0;
  return [kt, vt, ap];
}

// An object's own copy of its last failure (kvmem_X_last_error): what the
// last failed call on it said, on whichever thread it ran.
function objectError(fn, handle) {
  let buf = Buffer.alloc(512);
  const n = Number(fn(handle, buf, buf.length));
  if (n >= buf.length) fn(handle, buf = Buffer.alloc(n + 1), buf.length);
  return buf.toString('utf8', 0, Math.min(n, buf.length - 1));
}

// A copy of an input's bytes. An async call reads its inputs on a worker thread when
// its turn comes, maybe after the caller has moved on: it takes copies when it is
// made, so the caller may refill its arrays at once (an engine reuses one scratch
// buffer per step), as after a synchronous call. Outputs are not copied: an async
// call writes them when it runs, and they are ready when its promise resolves.
function copyOf(x) {
  if (x === null || x === undefined) return x;
  if (Buffer.isBuffer(x)) return Buffer.from(x);
  if (x instanceof ArrayBuffer) return x.slice(0);
  if (x instanceof DataView) return new Uint8Array(x.buffer, x.byteOffset, x.byteLength).slice();
  if (ArrayBuffer.isView(x)) return x.slice();
  return x;
}
const copyTensor = (t) => (t ? { ...t, data: copyOf(t.data) } : t);
function copyKv([kt, vt, ap]) {
  return [copyTensor(kt), copyTensor(vt), { ...ap, token_ids: copyOf(ap.token_ids), text: copyOf(ap.text),
                                            token_text_offsets: copyOf(ap.token_text_offsets), positions: copyOf(ap.positions) }];
}

class Context extends Handle {
  // backend: 'cpu', 'cuda', 'vulkan' or 'auto'; nThreads 0 = online cores
  constructor(options) {
    super();
    const { backend = 'auto', nThreads = 0 } = readKeys(options, ['backend', 'nThreads'], 'Context options');
    const out = [null];
    C.kvmem_context_create({ ...C.kvmem_context_default_params(), backend: cId(backend, 'backend'), n_threads: nThreads }, out);
    this._own(out[0], C.kvmem_context_free, 'Context');
    this._pools = new Set();
  }
  get backend() { return C.kvmem_context_backend(this.handle); }
  get nThreads() { return C.kvmem_context_n_threads(this.handle); }
  // the message of the last failed call on this context (attend, qmemScore), from any thread
  lastError() { return objectError(C.kvmem_context_last_error, this.handle); }
  // (experimental) bytes the library moved to / from this context's backend buffers
  transferStats() {
    const h = [0], d = [0];
    C.kvmem_context_transfer_stats(this.handle, h, d);
    return { h2dBytes: Number(h[0]), d2hBytes: Number(d[0]) };
  }
  transferReset() { C.kvmem_context_transfer_reset(this.handle); }
  // (experimental) the Vulkan objects a "vulkan" context runs on (pointers as koffi externals)
  vulkanDevice() {
    const out = { struct_size: L.koffi.sizeof(L.types.kvmem_vulkan_device) };
    C.kvmem_context_vulkan_device(this.handle, out);
    return { instance: out.instance, physicalDevice: out.physical_device, device: out.device, queue: out.queue,
             queueFamily: out.queue_family, apiVersion: out.api_version };
  }
  // (experimental) a tensor in device memory this context's calls take where
  // they take tensors: kind 'cuda' (handle: the device pointer) or 'vulkan'
  // (handle: the VkBuffer), size in bytes, offset of element 0 in bytes
  deviceTensor(opts) { return new DeviceTensor(opts); }
  _describe() { return { backend: this.backend, nThreads: this.nThreads }; }
  poolCreate(spec, params) { return new Pool(this, spec, params); }
  close() {
    if (this._h !== null && (this._busy || this._pins)) throw new errors.BusyError('Context: an async call is still running on it');
    for (const p of this._pools) if (p._busyTree()) throw new errors.BusyError('Context: an async call is still running on one of its agents');
    for (const p of [...this._pools]) p.close();
    super.close();
  }
}

// Model specs: camelCase objects in JavaScript (nLayers, nQHeads, nKvHeads,
// headDim, rotaryDim, ropeStyle, ropeTheta, ..., layerWindow, modelId);
// kvmem_model_spec (snake_case, koffi) only on the way to C.
const SPEC_FIELDS = Object.keys(C.kvmem_model_spec_default());
const SPEC_KEYS = SPEC_FIELDS.map(camel);

// kvmem_model_spec for C: kvmem_model_spec_default() with the given keys set
function cSpec(spec, what = 'model spec') {
  const f = readKeys(spec, SPEC_KEYS, what);
  const s = C.kvmem_model_spec_default();
  SPEC_FIELDS.forEach((field, i) => { if (f[SPEC_KEYS[i]] !== undefined) s[field] = f[SPEC_KEYS[i]]; });
  if (f.modelId !== undefined) s.model_id = cId(f.modelId, 'modelId');
  const w = f.layerWindow;
  s.layer_window = w === undefined || w === null ? null : intArray(w, Int32Array, 'Int32', 'layerWindow');
  // C reads n_layers entries: a shorter array would be read past its end
  if (s.layer_window && s.layer_window.length !== s.n_layers)
    throw new RangeError(`kvmem: ${what}: layerWindow has ${s.layer_window.length} entries, nLayers is ${s.n_layers}`);
  return s;
}

// a C spec (kvmem_pool_get_spec, or cSpec's) as a JavaScript one
function specFromC(s) {
  const r = fromC(s);
  const w = s.layer_window;
  r.layerWindow = !w ? null : (w instanceof Int32Array ? Array.from(w) : Array.from(koffi.decode(w, 'int32_t', s.n_layers)));
  return r;
}

// The growable spec (kvmem_model_spec_v2) where the loaded library has it, the
// frozen one against an older library: the same fields with the same meaning,
// so cSpec builds the frozen form and each call converts it.
const SPEC_V2 = !L.missing.has('kvmem_model_spec_v2_init');
const SPEC_V2_SIZE = L.koffi.sizeof(L.types.kvmem_model_spec_v2);
// cs as kvmem_model_spec_v2: the library's defaults of this binding's struct_size, then cs's fields
function specV2(cs) {
  const d = {};
  C.kvmem_model_spec_v2_init(d, SPEC_V2_SIZE);
  return { ...d, ...cs, struct_size: d.struct_size };
}

// The full spec (defaults filled in) of the given keys, camelCase.
function modelSpec(fields = {}) { return specFromC(cSpec(fields)); }

function specValidate(spec) {
  if (SPEC_V2) C.kvmem_model_spec_validate_v2(specV2(cSpec(spec)));
  else C.kvmem_model_spec_validate(cSpec(spec));
}

const POOL_KEYS = ['blockSize', 'storageDtype', 'capacityBytes', 'maxAgents', 'maxTokensPerAgent', 'storeDir', 'hostBudgetBytes',
                   'deviceCapacityBytes'];

class Pool extends Handle {
  // params: blockSize, storageDtype ('f16', 'f32', 'bf16', 'q8', 'q4', 'q4_kivi'), capacityBytes,
  // maxAgents, maxTokensPerAgent, storeDir, hostBudgetBytes, deviceCapacityBytes (device bytes the
  // agents' device-resident mirrors may hold; 0 = no limit; see deviceStats)
  constructor(ctx, spec, params) {
    super();
    const o = readKeys(params, POOL_KEYS, 'Pool params');
    if (typeof o.storageDtype === 'string') {
      const d = o.storageDtype.toLowerCase();
      if (!(d in STORAGE)) throw new TypeError(`kvmem: storageDtype ${o.storageDtype} is not one of ${Object.keys(STORAGE)}`);
      o.storageDtype = STORAGE[d];
    }
    if (o.storeDir !== undefined) o.storeDir = cPath(o.storeDir, 'storeDir');
    const pp = toC(C.kvmem_pool_default_params(), o, 'Pool params');
    const cs = cSpec(spec);
    const out = [null];
    if (SPEC_V2) C.kvmem_pool_create_v2(ctx.handle, specV2(cs), pp, out);
    else C.kvmem_pool_create(ctx.handle, cs, pp, out);
    this._own(out[0], C.kvmem_pool_free, 'Pool');
    this.context = ctx;
    this._agents = new Set(); // WeakRefs: agents may be collected before the pool
    this._segments = new Set();
    ctx._pools.add(this);
    this.spec = this.getSpec();
  }
  _busyTree() {
    if (this._busy || this._pins) return true;
    for (const r of this._agents) { const a = r.deref(); if (a && (a._busy || a._pins)) return true; }
    return false;
  }
  close() {
    if (this._h === null) return;
    if (this._busyTree()) throw new errors.BusyError('Pool: an async call is still running on one of its agents');
    for (const r of this._segments) r.deref()?.close(); // the pool must outlive its segment stores
    this._segments.clear();
    for (const r of this._agents) r.deref()?._forget(); // kvmem_pool_free frees every agent handle
    this._agents.clear();
    this.context._pools.delete(this);
    super.close();
  }
  getInfo() { const o = {}; C.kvmem_pool_get_info(this.handle, o); return fromC(o); }
  // (experimental) the agents' device-resident mirrors: device bytes held, closed agents' mirrors
  // evicted for room, device calls served from the host copy because a mirror did not fit
  deviceStats() {
    const b = [0], e = [0], u = [0];
    C.kvmem_pool_device_stats(this.handle, b, e, u);
    return { mirrorBytes: Number(b[0]), evictions: Number(e[0]), unmirrored: Number(u[0]) };
  }
  // The pool's calls that wait for its mutex (held while an agent is written to the
  // store or read back) on a worker thread, so the event loop does not wait with them.
  // The pool is thread-safe: these are not ordered with its other async calls; it
  // only stays open until they settle.
  _pinned(run) {
    this._ptr();
    this._pins++;
    let p;
    try { p = run(); } catch (e) { p = Promise.reject(e); }
    return p.finally(() => { this._pins--; });
  }
  getInfoAsync() { const o = {}; return this._pinned(() => C.kvmem_pool_get_info.async(this._ptr(), o).then(() => fromC(o))); }
  // agentOpen on a worker thread: an agent moved to the store is read back there
  agentOpenAsync(id) {
    const cid = cId(id, 'agent id'), out = [null];
    return this._pinned(() => C.kvmem_agent_open.async(this._ptr(), cid, out).then(() => new Agent(this, null, out[0])));
  }
  _describe() {
    const i = this.getInfo(), s = this.spec;
    return { nLayers: s.nLayers, nQHeads: s.nQHeads, nKvHeads: s.nKvHeads, headDim: s.headDim, blockSize: i.blockSize,
             storageDtype: C.kvmem_dtype_name(i.storageDtype), nAgents: i.nAgents, usedBytes: i.usedBytes,
             capacityBytes: i.capacityBytes };
  }
  getSpec() {
    const o = {};
    if (!SPEC_V2) { C.kvmem_pool_get_spec(this.handle, o); return specFromC(o); }
    C.kvmem_model_spec_v2_init(o, SPEC_V2_SIZE);
    C.kvmem_pool_get_spec_v2(this.handle, o);
    return specFromC(Object.fromEntries(SPEC_FIELDS.map((f) => [f, o[f]])));
  }
  agentId(index) {
    const len = [0];
    C.kvmem_pool_agent_id(this.handle, index, null, 0, len);
    const buf = Buffer.alloc(len[0] + 1);
    C.kvmem_pool_agent_id(this.handle, index, buf, buf.length, len);
    return buf.toString('utf8', 0, len[0]);
  }
  agentIds() { return Array.from({ length: this.getInfo().nAgents }, (_, i) => this.agentId(i)); }
  agentOpen(id) { return new Agent(this, id); }
  // kvmem_agent_open_file (experimental): a saved agent file opened in place, read-only;
  // its KV blocks stay in the file, so the agent may be larger than capacityBytes.
  // The agent takes the file's id; { verify: false } skips the data checksum pass.
  agentOpenFile(file, { verify = true } = {}) {
    const out = [null];
    C.kvmem_agent_open_file(this.handle, cPath(file, 'path'), verify ? 0 : OPEN_FILE_NO_VERIFY, out);
    return new Agent(this, null, out[0]);
  }
  // kvmem_pool_sync: write changed agents to the pool's store
  sync() { C.kvmem_pool_sync(this.handle); }
  syncAsync() { return this._async(C.kvmem_pool_sync, () => ({ args: [this._ptr()] })); }
  // the message of the last failed call on this pool (sync, agentOpen, ...), from any thread
  lastError() { return objectError(C.kvmem_pool_last_error, this.handle); }
  segmentsCreate(owner, params) { return new Segments(this, owner, params); }
  removeAgent(id) { C.kvmem_pool_remove_agent(this.handle, cId(id, 'agent id')); }
  // removeAgent on a worker thread: it waits for the pool's mutex and deletes the
  // agent from the store (a file and its directory's fsync, or a Redis round trip)
  removeAgentAsync(id) {
    const cid = cId(id, 'agent id');
    return this._pinned(() => C.kvmem_pool_remove_agent.async(this._ptr(), cid).then(noop));
  }
}

const OUT_KEYS = ['kOut', 'vOut', 'dtype', 'keys', 'values'];

const OPEN_FILE_NO_VERIFY = 0x1;

class Agent extends Handle {
  // opened: a handle the library already opened (Pool.agentOpenFile)
  constructor(pool, id, opened = null) {
    super();
    const out = [opened];
    if (opened === null) C.kvmem_agent_open(pool.handle, cId(id, 'agent id'), out);
    else id = C.kvmem_agent_get_id(opened);
    this._own(out[0], C.kvmem_agent_close, `Agent '${id}'`);
    this._id = id;
    this.pool = pool;
    const ref = new WeakRef(this);
    pool._agents.add(ref);
    this._ref = ref;
  }
  close() {
    if (this._h !== null && !this._busy && !this._pins) this.pool._agents.delete(this._ref);
    super.close();
  }
  // an agent's id never changes: read once, so it stays readable while an async call runs
  get id() { this._ptr(); return this._id; }
  // the message of the last failed call on this agent, from any thread
  lastError() { return objectError(C.kvmem_agent_last_error, this.handle); }
  _kvShape(n = -1) { const s = this.pool.spec; return [s.nLayers, n, s.nKvHeads, s.headDim]; }

  // k, v: [n_layers][T][n_kv_heads][head_dim]; opts: tokenIds, text, tokenTextOffsets,
  // positions (post-RoPE keys), keysRotated, dtype
  append(k, v, opts) { C.kvmem_agent_append(this.handle, ...kvArgs(this.pool.spec, k, v, opts, 'append')); }
  // the inputs are copied when the call is made (copyOf): the caller may reuse them at once.
  // { copy: false }: not copied (megabytes of KV held the event loop for tens of ms), for
  // a caller that leaves k, v and the options' arrays untouched until the promise settles
  appendAsync(k, v, opts) {
    let copy = true;
    if (opts && typeof opts === 'object' && Object.hasOwn(opts, 'copy')) {
      ({ copy, ...opts } = opts);
      if (typeof copy !== 'boolean') throw new TypeError(`kvmem: append options: copy must be a boolean, not ${typeof copy}`);
    }
    const kv = kvArgs(this.pool.spec, k, v, opts, 'append');
    const args = copy ? copyKv(kv) : kv;
    return this._async(C.kvmem_agent_append, () => ({ args: [this._ptr(), ...args] }));
  }
  flush() { C.kvmem_agent_flush(this.handle); }
  // sealing the tail reserves memory, which may write another agent to the store
  flushAsync() { return this._async(C.kvmem_agent_flush, () => ({ args: [this._ptr()] })); }
  // close() on a worker thread (kvmem_agent_close waits for the pool's mutex), after
  // the async calls made before it; calls made after it get ClosedError
  closeAsync() {
    if (this._h === null) return Promise.resolve();
    const close = { async: (h) => new Promise((resolve, reject) => {
      if (this._pins) { reject(new errors.BusyError(`${this._kind}: an async call is still using it; await it before closeAsync()`)); return; }
      this._forget();
      this.pool._agents.delete(this._ref);
      L.raw.kvmem_agent_close.async(h, (err) => (err ? reject(err) : resolve()));
    }) };
    return this._async(close, () => ({ args: [this._ptr()] }));
  }
  getInfo() { const o = {}; C.kvmem_agent_get_info(this.handle, o); return fromC(o); }
  _describe() { const i = this.getInfo(); return { id: this._id, nTokens: i.nTokens, nBlocks: i.nBlocks, nSealed: i.nSealed, bytes: i.bytes }; }
  blockInfo(block) { const o = {}; C.kvmem_agent_block_info(this.handle, block, o); return fromC(o, ['sealed']); }

  // first and n (undefined: to the end) checked against the agent's tokens before an
  // output of n tokens is allocated (n = 2**40 would ask for 16 TiB)
  _span(first, n, fn) {
    first = Number(checkInt(first, 'first', 'Int64'));
    const total = Number(this.getInfo().nTokens);
    n = n === undefined || n === null ? total - first : Number(checkInt(n, 'n', 'Int64'));
    if (first < 0 || n < 0 || first > total - n)
      throw new errors.InvalidArgumentError(`${fn}: tokens [${first}, ${first + n}) outside [0, ${total})`);
    return [first, n];
  }

  _readArgs(first = 0, n, options) {
    const opts = readKeys(options, OUT_KEYS, 'read options');
    first = checkInt(first, 'first', 'Int64');
    n = n === undefined || n === null ? Number(this.getInfo().nTokens) - Number(first) : checkInt(n, 'n', 'Int64');
    // the span checked by C (no outputs: nothing read) before n tokens of output are allocated
    C.kvmem_agent_read(this.handle, first, n, null, null);
    const shape = this._kvShape(n);
    const count = shape.reduce((a, b) => a * b, 1);
    const dtype = opts.dtype ?? 'f32';
    let kOut = opts.kOut, vOut = opts.vOut;
    if (opts.keys !== false && !kOut) kOut = newArray(count, dtype);
    if (opts.values !== false && !vOut) vOut = newArray(count, dtype);
    const kt = kOut ? tensor(kOut, 'kOut', shape, opts.kOut ? opts.dtype : dtype) : null;
    const vt = vOut ? tensor(vOut, 'vOut', shape, opts.vOut ? opts.dtype : dtype) : null;
    return { args: [this.handle, first, n, kt, vt], out: { k: kOut ?? null, v: vOut ?? null, shape } };
  }
  // Raw KV of tokens [first, first+n) as {k, v, shape}; opts: kOut/vOut (written in place), dtype, keys, values
  read(first, n, opts) { const r = this._readArgs(first, n, opts); C.kvmem_agent_read(...r.args); return r.out; }
  // n (when not given) and the outputs are taken when the read's turn comes, after the calls before it
  readAsync(first, n, opts) {
    readKeys(opts, OUT_KEYS, 'read options');
    return this._async(C.kvmem_agent_read, () => this._readArgs(first, n, opts));
  }

  blockAabb(block) {
    const s = this.pool.spec;
    const n = s.nLayers * s.nKvHeads * s.headDim;
    const min = new Float32Array(n), max = new Float32Array(n);
    C.kvmem_agent_block_aabb(this.handle, block, min, max);
    return { min, max };
  }
  tokens(first = 0, n) {
    [first, n] = this._span(first, n, 'kvmem_agent_tokens');
    const out = new Int32Array(n);
    C.kvmem_agent_tokens(this.handle, first, n, n ? out : null);
    return out;
  }
  textBytes() {
    const p = [null], len = [0];
    C.kvmem_agent_text(this.handle, p, len);
    // copy out: the pointer is valid only until the next append
    return len[0] ? Buffer.from(koffi.view(p[0], Number(len[0]))) : Buffer.alloc(0);
  }
  text() { return this.textBytes().toString('utf8'); }

  // kvmem_agent_save / kvmem_agent_load: a crash-safe safetensors file (path null: the pool's store)
  save(path = null) { C.kvmem_agent_save(this.handle, cPath(path)); }
  saveAsync(path = null) { const p = cPath(path); return this._async(C.kvmem_agent_save, () => ({ args: [this._ptr(), p] })); }
  load(path = null) { C.kvmem_agent_load(this.handle, cPath(path)); }
  loadAsync(path = null) { const p = cPath(path); return this._async(C.kvmem_agent_load, () => ({ args: [this._ptr(), p] })); }
  truncate(nTokens) { C.kvmem_agent_truncate(this.handle, nTokens); }
  // kvmem_prefix_match: {kind, reuseTokens, commonBytes, processFrom (a byte offset into the UTF-8 text)}
  prefixMatch(newText, opts) {
    const tb = Buffer.isBuffer(newText) ? newText : Buffer.from(String(newText), 'utf8');
    const pp = toC(C.kvmem_prefix_default_params(), opts, 'prefixMatch options');
    const out = {};
    C.kvmem_prefix_match(this.handle, tb.length ? tb : null, tb.length, pp, out);
    return fromC(out);
  }

  _retrieveArgs(query, options, h = this.handle) {
    const s = this.pool.spec;
    const { result, dtype, exclude, alwaysInclude, ...params } =
      readKeys(options, RETRIEVE_KEYS, 'retrieve options');
    const rp = toC(C.kvmem_retrieve_default_params(), params, 'retrieve options', RETRIEVE_SET_APART);
    rp.exclude = int32s(exclude, 'exclude');
    rp.n_exclude = rp.exclude ? rp.exclude.length : 0;
    rp.always_include = int32s(alwaysInclude, 'alwaysInclude');
    rp.n_always_include = rp.always_include ? rp.always_include.length : 0;
    const qt = tensor(query, 'query', [-1, s.nLayers, s.nQHeads, s.headDim], dtype);
    const r = result ?? new Retrieval();
    return { args: [h, qt, rp, r.handle], result: r };
  }
  // kvmem_retrieve: query rows [n_q][n_layers][n_q_heads][head_dim] (raw, pre-RoPE).
  // opts: topK, mode, norm, agg, scope, tau, rrC, exclude, alwaysInclude, recentWindow,
  // skipRecent, result (a Retrieval to reuse), dtype. Returns the Retrieval.
  retrieve(query, opts) { const r = this._retrieveArgs(query, opts); C.kvmem_retrieve(...r.args); return r.result; }
  // the query and the block lists are copied when the call is made; the result is
  // busy (its sync calls refused) until the promise settles
  retrieveAsync(query, opts) {
    const r = this._retrieveArgs(query, opts, this._ptr());
    const [, qt, rp] = r.args;
    const args = [qt && copyTensor(qt), { ...rp, exclude: copyOf(rp.exclude), always_include: copyOf(rp.always_include) }];
    return this._async(C.kvmem_retrieve, () => ({ args: [this._ptr(), ...args, r.result._ptr()], out: r.result }),
                       { marks: [r.result] });
  }

  _gatherArgs(blocks, basePosition = 0, options) {
    const opts = readKeys(options, OUT_KEYS, 'gather options');
    const ids = int32s(Array.from(blocks), 'blocks');
    let m = 0;
    for (const b of ids) m += this.blockInfo(b).nTokens;
    const shape = this._kvShape(m);
    const count = shape.reduce((a, b) => a * b, 1);
    const dtype = opts.dtype ?? 'f32';
    let kOut = opts.kOut, vOut = opts.vOut;
    if (opts.keys !== false && !kOut) kOut = newArray(count, dtype);
    if (opts.values !== false && !vOut) vOut = newArray(count, dtype);
    const kt = kOut ? tensor(kOut, 'kOut', shape, opts.kOut ? opts.dtype : dtype) : null;
    const vt = vOut ? tensor(vOut, 'vOut', shape, opts.vOut ? opts.dtype : dtype) : null;
    return { args: [this.handle, ids.length ? ids : null, ids.length, basePosition, kt, vt], out: { k: kOut ?? null, v: vOut ?? null, shape } };
  }
  // kvmem_gather: sealed blocks concatenated, re-encoded at positions basePosition..; {k, v, shape}
  gather(blocks, basePosition, opts) { const r = this._gatherArgs(blocks, basePosition, opts); C.kvmem_gather(...r.args); return r.out; }
  // the block list is copied when the call is made; sizes and outputs are taken when its turn comes
  gatherAsync(blocks, basePosition, opts) {
    readKeys(opts, OUT_KEYS, 'gather options');
    const ids = Array.from(int32s(Array.from(blocks), 'blocks'));
    return this._async(C.kvmem_gather, () => this._gatherArgs(ids, basePosition, opts));
  }
}

// retrieve options: the kvmem_retrieve_params fields (camelCase) but the
// arrays and their counts, which come from exclude / alwaysInclude
const RETRIEVE_SET_APART = ['exclude', 'n_exclude', 'always_include', 'n_always_include'];
const RETRIEVE_KEYS = Object.keys(C.kvmem_retrieve_default_params())
  .filter((f) => !RETRIEVE_SET_APART.includes(f) && !NOT_FIELDS.includes(f)).map(camel)
  .concat(['exclude', 'alwaysInclude', 'result', 'dtype']);

// kvmem_retrieval: the reusable result of Agent.retrieve.
class Retrieval extends Handle {
  constructor() {
    super();
    const out = [null];
    C.kvmem_retrieval_create(out);
    this._own(out[0], C.kvmem_retrieval_free, 'Retrieval');
  }
  get nSets() { return C.kvmem_retrieval_n_sets(this.handle); }
  _describe() {
    const n = this.nSets;
    if (!n) return { nSets: 0 };
    const { blocks, scores } = this.get(0);
    return { nSets: n, blocks: Array.from(blocks), scores: Array.from(scores) };
  }
  // {blocks: Int32Array, scores: Float32Array} of a set, chronological (copies)
  get(set = 0) {
    const n = [0];
    C.kvmem_retrieval_copy(this.handle, set, null, null, 0, n);
    const blocks = new Int32Array(n[0]), scores = new Float32Array(n[0]);
    if (n[0]) C.kvmem_retrieval_copy(this.handle, set, blocks, scores, n[0], n);
    return { blocks, scores };
  }
  // the same, read through the pointers the result owns (kvmem_retrieval_get)
  view(set = 0) {
    const b = [null], s = [null], n = [0];
    C.kvmem_retrieval_get(this.handle, set, b, s, n);
    if (!n[0]) return { blocks: new Int32Array(0), scores: new Float32Array(0) };
    return { blocks: Int32Array.from(koffi.decode(b[0], 'int32_t', n[0])), scores: Float32Array.from(koffi.decode(s[0], 'float', n[0])) };
  }
  // S(b) of every sealed block at retrieval time (NaN: not a candidate)
  blockScores(set = 0) {
    const p = [null], n = [0];
    C.kvmem_retrieval_block_scores(this.handle, set, p, n);
    return n[0] ? Float32Array.from(koffi.decode(p[0], 'float', n[0])) : new Float32Array(0);
  }
  nTokens(set = 0) { const n = [0]; C.kvmem_retrieval_n_tokens(this.handle, set, n); return Number(n[0]); }
}

// ---------------------------------------------------------------------------
// KEEP segments
// ---------------------------------------------------------------------------

// kvmem_segments: a KEEP segment store whose KV lives in a Pool (params:
// staticAfterSteps, maxSegments). close() frees it and removes its agents.
class Segments extends Handle {
  constructor(pool, owner, params) {
    super();
    const out = [null];
    C.kvmem_segments_create(pool.handle, cId(owner, 'owner'), toC(C.kvmem_segments_default_params(), params, 'Segments params'), out);
    this._own(out[0], C.kvmem_segments_free, 'Segments');
    this.pool = pool;
    this._ref = new WeakRef(this);
    pool._segments.add(this._ref);
  }
  close() {
    if (this._h !== null) this.pool._segments.delete(this._ref);
    super.close();
  }
  add(name, group) { const i = [0]; C.kvmem_segments_add(this.handle, cId(name, 'segment name'), group, i); return i[0]; }
  update(index) { C.kvmem_segments_update(this.handle, index); }
  remove(index) { C.kvmem_segments_remove(this.handle, index); }
  assign(index, group) { C.kvmem_segments_assign(this.handle, index, group); }
  step() { C.kvmem_segments_step(this.handle); }
  // queued events, oldest first (all of them unless max is given)
  drainEvents(max = Infinity) {
    if (max !== Infinity && (checkInt(max, 'max', 'Int64') < 0)) throw new errors.InvalidArgumentError(`max = ${max} is negative`);
    max = Number(max);
    const out = [];
    while (out.length < max) {
      const cap = Math.min(64, max - out.length);
      const buf = Array.from({ length: cap }, () => ({}));
      const n = [0], left = [0];
      C.kvmem_segments_drain_events(this.handle, buf, cap, n, left);
      for (let i = 0; i < n[0]; i++) out.push(fromC(buf[i]));
      if (!left[0] || !n[0]) break;
    }
    return out;
  }
  // the KV of one segment / of a STATIC group, [n_layers][T][n_kv_heads][head_dim] (opts as Agent.append)
  storeSegment(index, k, v, opts) { C.kvmem_segments_store_segment(this.handle, index, ...kvArgs(this.pool.spec, k, v, opts, 'storeSegment')); }
  storeGroup(group, k, v, opts) { C.kvmem_segments_store_group(this.handle, group, ...kvArgs(this.pool.spec, k, v, opts, 'storeGroup')); }
  getInfo() { const o = {}; C.kvmem_segments_get_info(this.handle, o); return fromC(o); }
  _describe() { return this.getInfo(); }
  segmentInfo(index) { const o = {}; C.kvmem_segments_segment_info(this.handle, index, o); return fromC(o, ['alive', 'has_kv']); }
  groupInfo(group) { const o = {}; C.kvmem_segments_group_info(this.handle, group, o); return fromC(o, ['has_kv']); }
  find(name) { const i = [0]; C.kvmem_segments_find(this.handle, cId(name, 'segment name'), i); return i[0]; }
  name(index) {
    const len = [0];
    C.kvmem_segments_name(this.handle, index, null, 0, len);
    const buf = Buffer.alloc(len[0] + 1);
    C.kvmem_segments_name(this.handle, index, buf, buf.length, len);
    return buf.toString('utf8', 0, len[0]);
  }
  groupMembers(group) {
    const n = [0];
    C.kvmem_segments_group_members(this.handle, group, null, 0, n);
    const out = new Int32Array(n[0]);
    if (n[0]) C.kvmem_segments_group_members(this.handle, group, out, n[0], n);
    return Array.from(out.subarray(0, n[0]));
  }
  // units to load for a query, best first; scores: one per segment index (Float32Array or numbers) or null
  plan(scores = null, maxUnits = 0) {
    const sc = scores == null ? null : (scores instanceof Float32Array ? scores : Float32Array.from(scores));
    const ns = sc ? sc.length : 0;
    const n = [0];
    C.kvmem_segments_plan(this.handle, sc, ns, maxUnits, null, 0, n);
    if (!n[0]) return [];
    const out = Array.from({ length: n[0] }, () => ({}));
    C.kvmem_segments_plan(this.handle, sc, ns, maxUnits, out, out.length, n);
    return out.slice(0, n[0]).map((u) => fromC(u, ['needs_compute']));
  }
}

const asF32 = (x, n, what) => { const a = x instanceof Float32Array ? x : Float32Array.from(x); if (n !== undefined && a.length !== n) throw new RangeError(`kvmem: ${what} has ${a.length} values, expected ${n}`); return a; };
const asU8 = (x, n, what) => { const a = intArray(x, Uint8Array, 'UInt8', what); if (n !== undefined && a.length !== n) throw new RangeError(`kvmem: ${what} has ${a.length} values, expected ${n}`); return a; };

// kvmem_cluster_kmeans over emb [n][dim] f32: {labels, centroids, iters}; params: k, maxIters, seed
function clusterKmeans(emb, n, dim, params) {
  n = Number(checkInt(n, 'n', 'UInt64')); dim = Number(checkInt(dim, 'dim', 'UInt64'));
  const kp = toC(C.kvmem_kmeans_default_params(), params, 'clusterKmeans params');
  checkInt(kp.k, 'k', 'Int32'); // sizes the centroids below
  const e = asF32(emb, n * dim, 'emb');
  const labels = new Int32Array(n), centroids = new Float32Array(Math.max(kp.k, 0) * dim), iters = [0];
  C.kvmem_cluster_kmeans(e, n, dim, kp, labels, centroids, iters);
  return { labels, centroids, iters: iters[0] };
}

// kvmem_multihop_select: q2s [nQuery][nSegments], s2s [nSegments][nSegments]; {selected, importance, result}
function multihopSelect(q2s, nQuery, s2s, nSegments, candidates = null, params) {
  nQuery = checkInt(nQuery, 'nQuery', 'Int32'); nSegments = checkInt(nSegments, 'nSegments', 'Int32');
  const mp = toC(C.kvmem_multihop_default_params(), params, 'multihopSelect params');
  const selected = new Uint8Array(nSegments), importance = new Float32Array(nSegments), result = {};
  C.kvmem_multihop_select(mp, asF32(q2s, nQuery * nSegments, 'q2s'), nQuery, asF32(s2s, nSegments * nSegments, 's2s'), nSegments,
                          candidates == null ? null : asU8(candidates, nSegments, 'candidates'), selected, importance, result);
  return { selected, importance, result: fromC(result, ['converged']) };
}

function multihopSchedule(nLayers, avg) {
  nLayers = checkInt(nLayers, 'nLayers', 'Int32');
  const r = new Float32Array(nLayers);
  C.kvmem_multihop_schedule(nLayers, avg, r);
  return r;
}

// kvmem_load_plan: {items, layerStartMs, stats}; params: bandwidthGbps, maxAhead
function loadPlan(computeMs, nLayers, loadBytes, nSegments, recompute, params) {
  nLayers = checkInt(nLayers, 'nLayers', 'Int32'); nSegments = checkInt(nSegments, 'nSegments', 'Int32');
  const lp = toC(C.kvmem_load_plan_default_params(), params, 'loadPlan params');
  const cm = computeMs instanceof Float64Array ? computeMs : Float64Array.from(computeMs);
  const lb = intArray(loadBytes, BigUint64Array, 'UInt64', 'loadBytes');
  if (cm.length !== nLayers || lb.length !== nSegments) throw new RangeError('kvmem: loadPlan: computeMs needs nLayers values, loadBytes nSegments');
  const rc = asU8(recompute, nLayers * nSegments, 'recompute');
  const n = [0];
  C.kvmem_load_plan(lp, cm, nLayers, lb, nSegments, rc, null, 0, n, null, null);
  const items = Array.from({ length: Math.max(n[0], 1) }, () => ({}));
  const starts = new Float64Array(nLayers), stats = {};
  C.kvmem_load_plan(lp, cm, nLayers, lb, nSegments, rc, items, items.length, n, starts, stats);
  return { items: items.slice(0, n[0]).map((i) => fromC(i)), layerStartMs: starts, stats: fromC(stats) };
}

// ---------------------------------------------------------------------------
// IntentKV
// ---------------------------------------------------------------------------

const memLen = (s) => s.nLayers * s.nQHeads * s.headDim;
// a session key (a result) on its way back to C
const cKey = (key) => { const o = readKeys(key, ['hi', 'lo', 'kind'], 'session key'); return { ...o, reserved: 0 }; };

// kvmem_qmem_store: per-session query memories; params: capacity, prefixTokens, lambda
class QmemStore extends Handle {
  constructor(spec, params) {
    super();
    this.spec = modelSpec(spec);
    const out = [null];
    const cs = cSpec(this.spec), qp = toC(C.kvmem_qmem_default_params(), params, 'QmemStore params');
    if (SPEC_V2) C.kvmem_qmem_store_create_v2(specV2(cs), qp, out);
    else C.kvmem_qmem_store_create(cs, qp, out);
    this._own(out[0], C.kvmem_qmem_store_free, 'QmemStore');
  }
  // kvmem_session_key_derive: {sessionId} | {tokenIds, mark: [begin, end]} | {tokenIds} | {}
  sessionKey(source) {
    const { sessionId = null, tokenIds = null, mark = null } = readKeys(source, ['sessionId', 'tokenIds', 'mark'], 'sessionKey source');
    const ids = int32s(tokenIds, 'tokenIds');
    const src = { session_id: sessionId === null ? null : cId(sessionId, 'sessionId'), token_ids: ids && ids.length ? ids : null, n_tokens: ids ? ids.length : 0,
                  mark_begin: mark ? mark[0] : 0, mark_end: mark ? mark[1] : 0 };
    const key = {};
    // the growable source where the library has it
    if (L.missing.has('kvmem_session_key_derive_v2')) C.kvmem_session_key_derive(this.handle, src, key);
    else C.kvmem_session_key_derive_v2(this.handle, { struct_size: L.koffi.sizeof(L.types.kvmem_session_source_v2), ...src }, key);
    return fromC(key);
  }
  // fold q [n_q][n_layers][n_q_heads][head_dim] rows [spanBegin, spanEnd) into key's memory; the new memory
  update(key, q, spanBegin, spanEnd, dtype) {
    const s = this.spec;
    const qt = tensor(q, 'q', [-1, s.nLayers, s.nQHeads, s.headDim], dtype);
    const mem = new Float32Array(memLen(s));
    C.kvmem_qmem_update(this.handle, cKey(key), qt, spanBegin, spanEnd, mem);
    return mem;
  }
  get(key) { const mem = new Float32Array(memLen(this.spec)); C.kvmem_qmem_get(this.handle, cKey(key), mem); return mem; }
  get count() { return C.kvmem_qmem_count(this.handle); }
  _describe() { return { sessions: this.count }; }
}

function f32In(x, n, what) {
  const a = x instanceof Float32Array ? x : Float32Array.from(x);
  if (n !== undefined && a.length !== n) throw new RangeError(`kvmem: ${what} has ${a.length} values, expected ${n}`);
  return a;
}

// kvmem_qmem_score: rule scores of the N positions of k [n_layers][N][n_kv_heads][head_dim] (post-RoPE)
function qmemScore(ctx, spec, memory, k, dtype) {
  const cs = cSpec(spec), s = specFromC(cs);
  const kt = tensor(k, 'k', [s.nLayers, -1, s.nKvHeads, s.headDim], dtype);
  const scores = new Float32Array(kt.shape[1]);
  const mem = f32In(memory, memLen(s), 'memory');
  if (SPEC_V2) C.kvmem_qmem_score_v2(ctx.handle, specV2(cs), mem, kt, scores);
  else C.kvmem_qmem_score(ctx.handle, cs, mem, kt, scores);
  return scores;
}

// kvmem_qmem_head: QmemHead.load(path) or QmemHead.fromBuffer(bytes)
class QmemHead extends Handle {
  constructor(handle) { super(); this._own(handle, C.kvmem_qmem_head_free, 'QmemHead'); }
  static load(path) { const out = [null]; C.kvmem_qmem_head_load(cPath(path), out); return new QmemHead(out[0]); }
  static fromBuffer(data) {
    const b = ArrayBuffer.isView(data) || data instanceof ArrayBuffer ? data : Buffer.from(data);
    const out = [null];
    C.kvmem_qmem_head_load_buffer(b, b.byteLength, out);
    return new QmemHead(out[0]);
  }
  get headDim() { return C.kvmem_qmem_head_dim(this.handle); }
  get alpha() { return C.kvmem_qmem_head_alpha(this.handle); }
  _describe() { return { headDim: this.headDim, alpha: this.alpha }; }
  apply(spec, memory, k, rule, spanBegin, spanEnd, dtype) {
    const cs = cSpec(spec), s = specFromC(cs);
    const kt = tensor(k, 'k', [s.nLayers, -1, s.nKvHeads, s.headDim], dtype);
    const n = kt.shape[1];
    const out = new Float32Array(n);
    const mem = f32In(memory, memLen(s), 'memory'), r = f32In(rule, n, 'rule');
    if (SPEC_V2) C.kvmem_qmem_head_apply_v2(this.handle, specV2(cs), mem, kt, r, spanBegin, spanEnd, out);
    else C.kvmem_qmem_head_apply(this.handle, cs, mem, kt, r, spanBegin, spanEnd, out);
    return out;
  }
}

// n entries of room: refused before allocating when the positions could not be int32
function keptOf(n, call) {
  n = checkInt(n, 'n', 'Int32');
  const kept = new Int32Array(Math.max(n, 1)), nk = [0];
  call(kept, nk);
  return kept.slice(0, Number(nk[0]));
}
// kvmem_select_keep: kept positions (ascending)
function selectKeep(scores, budget, protect = 0, span = [0, 0]) {
  const sc = f32In(scores);
  return keptOf(sc.length, (kept, nk) => C.kvmem_select_keep(sc, sc.length, budget, protect, span[0], span[1], kept, nk));
}
function streamingKeep(n, nSink, window) { return keptOf(n, (kept, nk) => C.kvmem_streaming_keep(n, nSink, window, kept, nk)); }

// kvmem_arrange_order by name
const ARRANGE_ORDERS = { chrono: 0, score: 1, runs: 2 };
// kvmem_arrange: the order to gather `blocks` (distinct ids >= 0) in, first = farthest from the
// new tokens. order 'score' (ascending score: the most relevant block last), 'chrono' (ascending
// id; scores may be null) or 'runs' (runs of adjacent ids kept whole, by ascending best score).
function arrange(blocks, scores = null, order = 'score') {
  if (typeof order !== 'string') throw new TypeError(`kvmem: order must be one of ${Object.keys(ARRANGE_ORDERS).join(', ')}, not ${typeof order}`);
  if (!Object.prototype.hasOwnProperty.call(ARRANGE_ORDERS, order))
    throw new errors.InvalidArgumentError(`order '${order}' is not one of ${Object.keys(ARRANGE_ORDERS).join(', ')}`);
  const ids = intArray(blocks, Int32Array, 'Int32', 'blocks');
  const sc = scores == null ? null : f32In(scores, ids.length, 'scores');
  const out = new Int32Array(Math.max(ids.length, 1));
  C.kvmem_arrange(ids, sc, ids.length, ARRANGE_ORDERS[order], out);
  return out.slice(0, ids.length);
}
// kvmem_window_split: {memoryTokens (whole blocks), topK, liveTokens} for a window of `window`
// tokens, `reserve` of them for the turn itself; shares in [0, 1] (liveShare 0: all that is left)
function windowSplit(window, reserve, memoryShare, liveShare, blockSize) {
  for (const [what, x] of [['memoryShare', memoryShare], ['liveShare', liveShare]])
    if (typeof x !== 'number') throw new TypeError(`kvmem: ${what} must be a number, not ${typeof x}`);
  const out = {};
  C.kvmem_window_split(window, reserve, memoryShare, liveShare, blockSize, out);
  return fromC(out);
}
// acc (Float32Array of n) += column sums of probs [nRows][n], in place
function h2oAccumulate(probs, nRows, n, acc) {
  nRows = Number(checkInt(nRows, 'nRows', 'Int64')); n = Number(checkInt(n, 'n', 'Int64'));
  if (!(acc instanceof Float32Array) || acc.length !== n) throw new TypeError(`kvmem: acc must be a Float32Array of ${n}`);
  C.kvmem_h2o_accumulate(f32In(probs, nRows * n, 'probs'), nRows, n, acc);
  return acc;
}
function h2oKeep(acc, budget, recent) {
  const a = f32In(acc);
  return keptOf(a.length, (kept, nk) => C.kvmem_h2o_keep(a, a.length, budget, recent, kept, nk));
}
function snapkvScore(ctx, spec, qObs, k, poolKernel = 7, dtype) {
  const cs = cSpec(spec), s = specFromC(cs);
  const qt = tensor(qObs, 'qObs', [-1, s.nLayers, s.nQHeads, s.headDim], dtype);
  const kt = tensor(k, 'k', [s.nLayers, -1, s.nKvHeads, s.headDim], dtype);
  const scores = new Float32Array(kt.shape[1]);
  if (SPEC_V2) C.kvmem_snapkv_score_v2(ctx.handle, specV2(cs), qt, kt, poolKernel, scores);
  else C.kvmem_snapkv_score(ctx.handle, cs, qt, kt, poolKernel, scores);
  return scores;
}

// kvmem_kvstore: paged KV that slot maps point into; params: pageSlots, maxSlots.
// close() closes its slot maps first.
class KVStore extends Handle {
  constructor(spec, params) {
    super();
    this.spec = modelSpec(spec);
    const out = [null];
    const cs = cSpec(this.spec), kp = toC(C.kvmem_kvstore_default_params(), params, 'KVStore params');
    if (SPEC_V2) C.kvmem_kvstore_create_v2(specV2(cs), kp, out);
    else C.kvmem_kvstore_create(cs, kp, out);
    this._own(out[0], C.kvmem_kvstore_free, 'KVStore');
    this._maps = new Set();
  }
  close() {
    if (this._h === null) return;
    for (const r of [...this._maps]) r.deref()?.close();
    this._maps.clear();
    super.close();
  }
  getInfo() { const o = {}; C.kvmem_kvstore_get_info(this.handle, o); return fromC(o); }
  _describe() { return this.getInfo(); }
  slotRefs(slot) { const r = [0]; C.kvmem_kvstore_slot_refs(this.handle, slot, r); return r[0]; }
  readSlot(slot) {
    const n = this.spec.nLayers * this.spec.nKvHeads * this.spec.headDim;
    const k = new Float32Array(n), v = new Float32Array(n);
    C.kvmem_kvstore_read_slot(this.handle, slot, k, v);
    return { k, v };
  }
  slotmapCreate() { const out = [null]; C.kvmem_slotmap_create(this.handle, out); return new SlotMap(this, out[0]); }
}

class SlotMap extends Handle {
  constructor(store, handle) {
    super();
    this._own(handle, C.kvmem_slotmap_free, 'SlotMap');
    this.store = store;
    this._ref = new WeakRef(this);
    store._maps.add(this._ref);
  }
  close() { if (this._h !== null) this.store._maps.delete(this._ref); super.close(); }
  fork(prefixLen) { const out = [null]; C.kvmem_slotmap_fork(this.handle, prefixLen, out); return new SlotMap(this.store, out[0]); }
  append(k, v, dtype) {
    const s = this.store.spec;
    const shape = [s.nLayers, -1, s.nKvHeads, s.headDim];
    C.kvmem_slotmap_append(this.handle, tensor(k, 'k', shape, dtype), tensor(v, 'v', shape, dtype));
  }
  setProtected(p) { C.kvmem_slotmap_set_protected(this.handle, p); }
  evict(kept) { const k = int32s(kept, 'kept'), f = [0]; C.kvmem_slotmap_evict(this.handle, k.length ? k : null, k.length, f); return Number(f[0]); }
  compact(kept) { const k = int32s(kept, 'kept'), f = [0]; C.kvmem_slotmap_compact(this.handle, k.length ? k : null, k.length, f); return Number(f[0]); }
  // {slots: Int32Array (copied), deadSlot}
  slots() {
    const p = [null], n = [0], dead = [0];
    C.kvmem_slotmap_slots(this.handle, p, n, dead);
    const len = Number(n[0]);
    return { slots: len ? Int32Array.from(koffi.decode(p[0], 'int32_t', len)) : new Int32Array(0), deadSlot: dead[0] };
  }
  getInfo() { const o = {}; C.kvmem_slotmap_get_info(this.handle, o); return fromC(o); }
  _describe() { return this.getInfo(); }
  // the live rows in position order: {k, v, positions, shape}
  gather(dtype = 'f32') {
    const s = this.store.spec;
    const n = Number(this.getInfo().nLive);
    const shape = [s.nLayers, n, s.nKvHeads, s.headDim];
    const count = shape.reduce((a, b) => a * b, 1);
    const k = newArray(count, dtype), v = newArray(count, dtype), positions = new Int32Array(Math.max(n, 1));
    C.kvmem_slotmap_gather(this.handle, tensor(k, 'k', shape, dtype), tensor(v, 'v', shape, dtype), positions);
    return { k, v, positions: positions.slice(0, n), shape };
  }
}

// ---------------------------------------------------------------------------
// ART attention
// ---------------------------------------------------------------------------

// attend options: the source, the output, and the kvmem_attend_params fields
// (camelCase) but the tile order, which comes from tileOrder
const ATTEND_OWN_KEYS = ['agent', 'layer', 'positions', 'basePosition', 'k', 'v', 'slots', 'deadSlot', 'mask', 'out',
                         'dtype', 'tileOrder'];
const ATTEND_SET_APART = ['tile_order', 'n_tile_order'];
const ATTEND_KEYS = ATTEND_OWN_KEYS.concat(Object.keys(C.kvmem_attend_default_params())
  .filter((f) => !ATTEND_SET_APART.includes(f) && !NOT_FIELDS.includes(f)).map(camel));

// Arguments of kvmem_attend. q: [n_rows][n_q_heads][head_dim] post-RoPE (a
// {data, shape} view, or flat with an agent source). Source: {agent, layer,
// positions | basePosition}, or {k, v} ([T][n_kv_heads][head_dim] views, keys
// post-RoPE), plus {slots, deadSlot} for a slot map. opts: mask, out, dtype,
// tileOrder, and the params (order, nSink, tileSize, scale, tauS, tauD,
// patience, probe, causal, compare).
function attendArgs(ctx, q, options, forAsync = false) {
  const opts = readKeys(options, ATTEND_KEYS, 'attend options');
  const { agent, layer = 0, positions, basePosition = 0, k, v, slots, deadSlot = 0, mask, out, dtype, tileOrder } = opts;
  for (const key of ATTEND_OWN_KEYS) delete opts[key];
  const ap = toC(C.kvmem_attend_default_params(), opts, 'attend options', ATTEND_SET_APART);
  const src = { kind: 0, layer: 0, k: null, v: null, slots: null, n_positions: 0, dead_slot: 0, reserved: 0,
                agent: null, positions: null, base_position: 0, mask: null };
  let qt;
  const holders = [agent];
  if (agent) {
    const s = agent.pool.spec;
    qt = tensor(q, 'q', [-1, s.nQHeads, s.headDim], dtype);
    Object.assign(src, { kind: 1, agent: forAsync ? agent._ptr() : agent.handle, layer, base_position: basePosition, positions: int32s(positions, 'positions') });
  } else {
    if (!k || !v) throw new TypeError('kvmem: attend needs {agent} or {k, v}');
    qt = tensor(q, 'q', null, dtype);
    src.k = tensor(k, 'k', null, dtype);
    src.v = tensor(v, 'v', null, dtype);
    if (slots != null) {
      const sl = int32s(slots, 'slots');
      Object.assign(src, { kind: 2, slots: sl, n_positions: sl.length, dead_slot: deadSlot });
    }
  }
  if (mask != null) src.mask = intArray(mask, Uint8Array, 'UInt8', 'mask');
  if (tileOrder != null) { ap.tile_order = int32s(tileOrder, 'tileOrder'); ap.n_tile_order = ap.tile_order.length; }
  const shape = qt.shape.slice(0, qt.ndim);
  const o = out ?? new Float32Array(shape.reduce((a, b) => a * b, 1));
  const ot = tensor(o, 'out', shape, out ? dtype : 'f32');
  const stats = {};
  if (ATTEND_V2) src.struct_size = L.koffi.sizeof(L.types.kvmem_attend_source_v2);
  return { args: [forAsync ? ctx._ptr() : ctx.handle, qt, src, ap, ot, stats], out: o, stats, holders };
}
// the growable source where the library has it
const ATTEND_V2 = !L.missing.has('kvmem_attend_v2');
const ATTEND_FN = ATTEND_V2 ? C.kvmem_attend_v2 : C.kvmem_attend;
// kvmem_attend: {out, stats}
function attend(ctx, q, opts) {
  const a = attendArgs(ctx, q, opts);
  ATTEND_FN(...a.args);
  return { out: a.out, stats: fromC(a.stats, ['stopped_early']) };
}
// The inputs are copied when the call is made. With an agent source the call takes its
// turn among the agent's async calls (the agent is busy until it settles); the context
// is kept open until it settles.
function attendAsync(ctx, q, opts) {
  const a = attendArgs(ctx, q, opts, true);
  const [c, qt, src, ap, ot, stats] = a.args;
  const args = [c, copyTensor(qt), { ...src, k: copyTensor(src.k), v: copyTensor(src.v), positions: copyOf(src.positions),
                                     slots: copyOf(src.slots), mask: copyOf(src.mask) },
                { ...ap, tile_order: copyOf(ap.tile_order) }, ot, stats];
  const done = () => ({ out: a.out, stats: fromC(stats, ['stopped_early']) });
  const agent = opts && opts.agent;
  if (agent) return agent._async(ATTEND_FN, () => ({ args, done }), { pins: [ctx] });
  ctx._pins++;
  return ATTEND_FN.async(...args).then(done).finally(() => { ctx._pins--; });
}

// kvmem_batch_merge: one layer of several agents, left-padded: {k, v, lengths, shape}
function batchMerge(agents, layer, opts) {
  const { maxLen, dtype = 'f32', kOut, vOut } = readKeys(opts, ['maxLen', 'dtype', 'kOut', 'vOut'], 'batchMerge options');
  if (!agents.length) throw new RangeError('kvmem: batchMerge needs at least one agent');
  const s = agents[0].pool.spec;
  const ml = Number(checkInt(maxLen ?? Math.max(...agents.map((a) => Number(a.getInfo().nTokens))), 'maxLen', 'Int64'));
  if (ml < 0) throw new errors.InvalidArgumentError(`maxLen = ${ml} is negative`);
  const shape = [agents.length, s.nKvHeads, ml, s.headDim];
  const count = shape.reduce((a, b) => a * b, 1);
  const k = kOut ?? newArray(count, dtype), v = vOut ?? newArray(count, dtype);
  const lengths = new BigInt64Array(agents.length);
  C.kvmem_batch_merge(agents.map((a) => a.handle), agents.length, layer, tensor(k, 'kOut', shape, kOut ? undefined : dtype),
                      tensor(v, 'vOut', shape, vOut ? undefined : dtype), lengths);
  return { k, v, lengths: Array.from(lengths, Number), shape };
}
// kvmem_batch_extract: n tokens of row `row` of batch {data, shape: [B][H][max_len][D]} as [n][H][D]
function batchExtract(batch, row, length, first, n, opts) {
  const { out, dtype } = readKeys(opts, ['out', 'dtype'], 'batchExtract options');
  const bt = tensor(batch, 'batch', null, dtype);
  if (bt.ndim !== 4) throw new TypeError('kvmem: batch must be a {data, shape: [B, H, max_len, D]} view');
  n = Number(checkInt(n, 'n', 'Int64'));
  if (n < 0) throw new errors.InvalidArgumentError(`n = ${n} is negative`);
  const shape = [n, bt.shape[1], bt.shape[3]];
  const o = out ?? new Float32Array(shape.reduce((a, b) => a * b, 1));
  C.kvmem_batch_extract(bt, row, length, first, n, tensor(o, 'out', shape, out ? undefined : 'f32'));
  return o;
}

// ---------------------------------------------------------------------------
// Free functions
// ---------------------------------------------------------------------------

function backends() {
  const count = [0];
  C.kvmem_backends(null, 0, count);
  const out = Array.from({ length: count[0] }, () => ({}));
  if (count[0]) C.kvmem_backends(out, out.length, count);
  return out.map(b => ({ name: b.name, available: !!b.available, detail: b.detail }));
}

// Rotate rows of x (head vectors, contiguous rows of head_dim f32) in place to positions (one per row).
function ropeApply(spec, x, positions, opts) {
  const { inverse = false, stride } = readKeys(opts, ['inverse', 'stride'], 'ropeApply options');
  const cs = cSpec(spec);
  if (!(x instanceof Float32Array)) throw new TypeError('kvmem: ropeApply: x must be a Float32Array');
  const st = Number(checkInt(stride ?? cs.head_dim, 'stride', 'UInt64'));
  const pos = int32s(positions, 'positions');
  const nRows = pos.length;
  if (nRows && (nRows - 1) * st + cs.head_dim > x.length)
    throw new RangeError(`kvmem: ropeApply: ${nRows} rows of stride ${st} exceed x (${x.length} floats)`);
  if (SPEC_V2) C.kvmem_rope_apply_v2(specV2(cs), x, nRows, st, pos, inverse ? 1 : 0);
  else C.kvmem_rope_apply(cs, x, nRows, st, pos, inverse ? 1 : 0);
}

let logCallback = null;
// Route kvmem's log messages to fn(level, message); null turns logging off.
// Messages from kvmem worker threads are queued to the main thread by koffi.
function logSet(fn) {
  if (logCallback) { koffi.unregister(logCallback); logCallback = null; }
  if (!fn) { C.kvmem_log_set(null, null); return; }
  logCallback = koffi.register((level, msg) => { try { fn(level, msg); } catch { /* never unwind into C */ } },
                               koffi.pointer(L.types.kvmem_log_callback));
  C.kvmem_log_set(logCallback, null);
}

module.exports = {
  ...errors,
  Context, Pool, Agent, Retrieval, Segments,
  clusterKmeans, multihopSelect, multihopSchedule, loadPlan, batchMerge, batchExtract,
  PREFIX_EXACT: 0, PREFIX_EXTEND: 1, PREFIX_DIVERGE: 2,
  attend, attendAsync, ATTEND_SRC_TENSORS: 0, ATTEND_SRC_AGENT: 1, ATTEND_SRC_SLOTMAP: 2,
  ATTEND_RECENT: 0, ATTEND_IMPORTANCE: 1, ATTEND_INDEX: 2, ATTEND_SCORED: 3, ATTEND_PROBE_STRIDED: 0, ATTEND_PROBE_ORACLE: 1,
  ATTEND_MAX_ROWS: 64, ATTEND_PROBE_SIZE: 32,
  QmemStore, QmemHead, KVStore, SlotMap, qmemScore, selectKeep, streamingKeep, h2oAccumulate, h2oKeep, snapkvScore,
  arrange, windowSplit,
  SESSION_EXPLICIT: 1, SESSION_MARKED: 2, SESSION_PREFIX: 3, SESSION_LOCAL: 4, DEAD_SLOT: 0, SENTINEL_K: -1.0e4,
  GROUP_DYNAMIC: 0, GROUP_STATIC: 1, SEG_EVENT_SEGMENT_STALE: 1, SEG_EVENT_GROUP_STATIC: 2, SEG_EVENT_GROUP_DYNAMIC: 3,
  SEG_UNIT_SEGMENT: 0, SEG_UNIT_GROUP: 1,
  RETRIEVE_AABB: 0, RETRIEVE_EXACT: 1, NORM_SOFTMAX: 0, NORM_RR: 1, AGG_MAX: 0, AGG_SUM: 1,
  SCOPE_GLOBAL: 0, SCOPE_PER_LAYER: 1,
  modelSpec, specValidate, ropeApply, backends, logSet, tensor,
  version: () => C.kvmem_version(),
  versionNumber: () => C.kvmem_version_number(),
  statusStr: (s) => C.kvmem_status_str(s),
  lastError: () => C.kvmem_last_error(),
  dtypeName: (d) => C.kvmem_dtype_name(d),
  // a NUL-containing id is not valid (C would judge only the part before it)
  agentIdValid: (id) => (typeof id === 'string' && id.includes('\0') ? false : C.kvmem_agent_id_valid(cId(id, 'agent id')) === 1),
  F32, F16, BF16, Q8, Q4, Q4_KIVI,
  ROPE_NEOX: 0, ROPE_GPTJ: 1,
  ROPE_SCALING_NONE: 0, ROPE_SCALING_LINEAR: 1, ROPE_SCALING_LLAMA3: 2, ROPE_SCALING_YARN: 3,
  LOG_DEBUG: 0, LOG_INFO: 1, LOG_WARN: 2, LOG_ERROR: 3,
  libraryPath: L.libraryPath,
  // whether this binding declares `name` and the loaded library has it
  hasFunction: (name) => name in L.declared && !L.missing.has(name),
  _lib: L,
};
