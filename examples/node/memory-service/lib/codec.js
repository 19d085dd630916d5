'use strict';
// Request bodies in, response bodies out: typed checks of every field, and the
// binary tensor layout beside JSON. Pure functions over bytes, so they run on
// the main thread for small bodies and on codec threads (codec-pool.js) for
// large ones, where parsing megabytes of JSON would stall every other client.
//
// A body is the binary tensor layout (Content-Type application/x-kvmem-tensors)
// or JSON (any other Content-Type, or none):
//
//   bytes 0..8        N, unsigned 64-bit little-endian: the header's length
//   bytes 8..8+N      the header: a JSON object with the request's fields, as
//                     in a JSON body, where a tensor field (k, v, query,
//                     token_ids, token_text_offsets, positions) may instead be
//                     {"dtype": "F32" | "I32", "shape": [...], "data_offsets": [BEGIN, END]}
//   bytes 8+N..       the data: each tensor's little-endian values at
//                     [BEGIN, END) of this section, END - BEGIN = 4 x the
//                     shape's product (safetensors' framing and descriptors)
//
// A retrieve whose request says Accept: application/x-kvmem-tensors gets its
// answer in the same layout, gathered.k and gathered.v as F32 descriptors.
//
// Every field has one type; a value of another type is refused (400), never
// converted: no strings for numbers, no 0/1 for booleans, no null, no
// fractions for integers, no float beyond float32's range, no unknown field.

const CT_JSON = 'application/json';
const CT_TENSORS = 'application/x-kvmem-tensors';
const FLT_MAX = 3.4028234663852886e38;
const I32_MIN = -(2 ** 31), I32_MAX = 2 ** 31 - 1;
const MAX_HEADER = 1 << 20;
// bytes one float takes at most in a JSON answer ("-1.2345678901234567e-45,"), and in a binary one
const JSON_FLOAT_BYTES = 24, BINARY_FLOAT_BYTES = 4;

class BodyError extends Error {
  constructor(code, error, message) { super(message); this.httpCode = code; this.error = error; }
}
const bad = (m) => new BodyError(400, 'bad_request', m);

const kinds = {
  f32s: { what: 'an array of numbers (float32)', dtype: 'F32' },
  i32s: { what: 'an array of 32-bit integers', dtype: 'I32' },
};
// per route: field -> [kind, range]
const FIELDS = {
  append: {
    k: ['f32s'], v: ['f32s'], token_ids: ['i32s'], text: ['string'], token_text_offsets: ['i32s'],
    positions: ['i32s'], flush: ['bool'], save: ['bool'], expect_tokens: ['int', 0, Number.MAX_SAFE_INTEGER],
  },
  retrieve: { query: ['f32s'], top_k: ['int', 0, 65536], gather: ['bool'], base_position: ['int', 0, I32_MAX] },
  flush: {}, save: {}, load: {},
};
const REQUIRED = { append: ['k', 'v'], retrieve: ['query'] };

function typeName(x) {
  if (x === null) return 'null';
  if (Array.isArray(x)) return 'an array';
  return typeof x === 'string' ? `a string (${JSON.stringify(x.length > 20 ? x.slice(0, 20) + '...' : x)})` : `a ${typeof x}`;
}

function checkF32(a, name) {
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    if (typeof x !== 'number')
      throw bad(`${name} must be ${kinds.f32s.what}: element ${i} is ${typeName(x)}`);
    if (!(x >= -FLT_MAX && x <= FLT_MAX)) throw bad(`${name} element ${i} (${x}) is not a finite float32`);
  }
  return Float32Array.from(a);
}

function checkI32(a, name) {
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    if (typeof x !== 'number' || !Number.isInteger(x) || x < I32_MIN || x > I32_MAX)
      throw bad(`${name} must be ${kinds.i32s.what}: element ${i} is ${typeof x === 'number' ? x : typeName(x)}`);
  }
  return Int32Array.from(a);
}

// a tensor descriptor of the binary layout -> a typed array over a copy of its bytes
function fromDescriptor(d, kind, name, data) {
  const keys = Object.keys(d);
  const extra = keys.filter((k) => !['dtype', 'shape', 'data_offsets'].includes(k));
  if (extra.length) throw bad(`${name}: unknown descriptor field ${JSON.stringify(extra[0])} (dtype, shape, data_offsets)`);
  if (d.dtype !== kinds[kind].dtype) throw bad(`${name}: dtype must be "${kinds[kind].dtype}" (got ${typeName(d.dtype)})`);
  if (!Array.isArray(d.shape) || d.shape.length > 8 || !d.shape.every((e) => Number.isSafeInteger(e) && e >= 0))
    throw bad(`${name}: shape must be an array of at most 8 non-negative integers`);
  const o = d.data_offsets;
  if (!Array.isArray(o) || o.length !== 2 || !o.every((e) => Number.isSafeInteger(e) && e >= 0) || o[0] > o[1] || o[1] > data.length)
    throw bad(`${name}: data_offsets must be [BEGIN, END] with 0 <= BEGIN <= END <= ${data.length} (the data section's length)`);
  const n = d.shape.reduce((a, e) => a * e, 1);
  if (o[1] - o[0] !== n * 4) throw bad(`${name}: data_offsets span ${o[1] - o[0]} bytes, shape [${d.shape}] needs ${n * 4}`);
  // a copy: aligned for the typed array, and independent of the body's buffer
  const bytes = new Uint8Array(n * 4);
  bytes.set(data.subarray(o[0], o[1]));
  if (kind === 'i32s') return new Int32Array(bytes.buffer);
  const f = new Float32Array(bytes.buffer);
  for (let i = 0; i < f.length; i++) if (!(f[i] >= -FLT_MAX && f[i] <= FLT_MAX)) throw bad(`${name} element ${i} (${f[i]}) is not a finite float32`);
  return f;
}

function checkField(route, name, x, spec, data) {
  const [kind, lo, hi] = spec;
  const full = `${route}: ${name}`;
  switch (kind) {
    case 'f32s': case 'i32s':
      if (Array.isArray(x)) return kind === 'f32s' ? checkF32(x, full) : checkI32(x, full);
      if (data && x !== null && typeof x === 'object') return fromDescriptor(x, kind, full, data);
      throw bad(`${full} must be ${kinds[kind].what}${data ? ' or a tensor descriptor' : ''}, not ${typeName(x)}`);
    case 'string':
      if (typeof x !== 'string') throw bad(`${full} must be a string, not ${typeName(x)}`);
      return x;
    case 'bool':
      if (typeof x !== 'boolean') throw bad(`${full} must be true or false, not ${typeName(x)}`);
      return x;
    case 'int':
      if (typeof x !== 'number' || !Number.isInteger(x) || x < lo || x > hi)
        throw bad(`${full} must be an integer in [${lo}, ${hi}], not ${typeof x === 'number' ? x : typeName(x)}`);
      return x;
  }
  throw new Error(`codec: no kind ${kind}`);
}

function noFields(route, body, got) {
  return bad(`${route} takes no body fields${got ? ` (got ${got})` : ''}` +
    (route === 'flush' ? '' : ': agents are kept in the store set when the service started'));
}

// The fields of a request body for `route`, checked; typed arrays for tensors.
// ctype: the Content-Type header (undefined: JSON). Throws BodyError.
function decodeRequest(route, ctype, buf) {
  const spec = FIELDS[route];
  if (!spec) throw new Error(`codec: no route ${route}`);
  const mt = (ctype ?? '').split(';')[0].trim().toLowerCase();
  let obj, data = null;
  if (mt === CT_TENSORS) {
    if (buf.length < 8) throw bad(`a ${CT_TENSORS} body starts with its header's length (8 bytes), got ${buf.length} bytes`);
    const n = buf.readBigUInt64LE(0);
    if (n > BigInt(Math.min(MAX_HEADER, buf.length - 8)))
      throw bad(`the ${CT_TENSORS} header length ${n} exceeds the body (${buf.length - 8} bytes after it) or 1 MiB`);
    const hl = Number(n);
    try { obj = JSON.parse(buf.toString('utf8', 8, 8 + hl)); } catch (e) { throw bad(`invalid JSON header: ${e.message}`); }
    data = buf.subarray(8 + hl);
    if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) throw bad(`the ${CT_TENSORS} header must be a JSON object`);
  } else {
    // any other Content-Type is read as JSON (curl -d sends form-urlencoded)
    if (buf.length === 0) obj = {};
    else {
      try { obj = JSON.parse(buf.toString('utf8')); } catch (e) { throw bad(`invalid JSON: ${e.message}`); }
    }
    if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) {
      if (!Object.keys(spec).length) throw noFields(route, obj);
      throw bad(`${route}: the body must be a JSON object, not ${typeName(obj)}`);
    }
  }
  const keys = Object.keys(obj);
  if (!Object.keys(spec).length && keys.length) throw noFields(route, obj, keys.map((k) => JSON.stringify(k)).join(', '));
  const out = {};
  for (const k of keys) {
    if (!Object.hasOwn(spec, k)) throw bad(`${route}: unknown field ${JSON.stringify(k)} (fields: ${Object.keys(spec).join(', ')})`);
    out[k] = checkField(route, k, obj[k], spec[k], data);
  }
  for (const k of REQUIRED[route] ?? []) if (!Object.hasOwn(out, k)) throw bad(`${route}: ${k} is required`);
  return out;
}

const accepts = (accept) => typeof accept === 'string' && accept.toLowerCase().includes(CT_TENSORS);

// An upper bound of a retrieve answer's bytes before it is made: nFloats
// gathered values and the blocks' token ids.
function responseBound(binary, nFloats, nBlocks, nTokenIds) {
  return 256 + nBlocks * 160 + nTokenIds * 12 + nFloats * (binary ? BINARY_FLOAT_BYTES : JSON_FLOAT_BYTES);
}

// JSON of a result whose typed arrays become arrays of numbers. Not with a
// JSON.stringify replacer: that is called for every element (2.5x slower).
function jsonBytes(obj) {
  const walk = (v) => {
    if (v instanceof Float32Array || v instanceof Int32Array) return Array.from(v);
    if (Array.isArray(v)) return v.map(walk);
    if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, walk(x)]));
    return v;
  };
  return Buffer.from(JSON.stringify(walk(obj)), 'utf8');
}

// The binary layout of a result: its typed arrays (at any depth) become
// descriptors, their bytes the data section. Returns a list of chunks.
function tensorChunks(obj) {
  const parts = [];
  let off = 0;
  const header = JSON.stringify(obj, (k, v) => {
    if (!(v instanceof Float32Array || v instanceof Int32Array)) return v;
    const d = { dtype: v instanceof Float32Array ? 'F32' : 'I32', shape: [v.length], data_offsets: [off, off + v.byteLength] };
    parts.push(Buffer.from(v.buffer, v.byteOffset, v.byteLength));
    off += v.byteLength;
    return d;
  });
  const hb = Buffer.from(header, 'utf8');
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(hb.length));
  return [len, hb, ...parts];
}

module.exports = {
  CT_JSON, CT_TENSORS, BodyError, decodeRequest, accepts, responseBound, jsonBytes, tensorChunks,
  JSON_FLOAT_BYTES, BINARY_FLOAT_BYTES,
};
