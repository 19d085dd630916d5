'use strict';
// One naming convention for every object that crosses the Node API: keys are
// lowerCamelCase forms of the C field names (n_kv_heads -> nKvHeads), in
// specs, options and results alike (bindings/README.md, "Names"). Unknown keys
// are refused with a TypeError naming the key. A snake_case key that names a
// known camelCase one (the C spelling, which specs used before 0.2) is still
// read, with a DeprecationWarning once per key.

const camel = (s) => s.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());

const warned = new Set();
function deprecated(what, key, canonical) {
  const id = `${what}:${key}`;
  if (warned.has(id)) return;
  warned.add(id);
  process.emitWarning(`kvmem: ${what}: '${key}' is the old snake_case spelling; use '${canonical}'`,
                      { type: 'DeprecationWarning', code: 'KVMEM_SNAKE_CASE' });
}

const kindOf = (v) => (v === null ? 'null' : Array.isArray(v) ? 'an array' : typeof v);

// The entries of `obj` under their canonical names. `keys`: the allowed
// camelCase names. Refuses unknown keys (naming the closest known one when
// only case or underscores differ) and a key given under both spellings.
function readKeys(obj, keys, what) {
  if (obj === undefined || obj === null) return {};
  if (typeof obj !== 'object' || Array.isArray(obj) || ArrayBuffer.isView(obj))
    throw new TypeError(`kvmem: ${what} must be an object of named options, not ${kindOf(obj)}`);
  const allowed = new Set(keys);
  const out = {};
  for (const [k, v] of Object.entries(obj)) {
    let key = k;
    if (!allowed.has(k)) {
      const c = camel(k);
      if (k.includes('_') && allowed.has(c)) {
        deprecated(what, k, c);
        key = c;
      } else {
        const flat = (s) => s.replace(/_/g, '').toLowerCase();
        const near = keys.find((x) => flat(x) === flat(k));
        throw new TypeError(`kvmem: ${what}: unknown key '${k}'` +
                            (near ? ` (did you mean '${near}'?)` : `; known keys: ${keys.join(', ')}`));
      }
    }
    if (Object.prototype.hasOwnProperty.call(out, key))
      throw new TypeError(`kvmem: ${what}: '${key}' is given twice (once as '${k}')`);
    out[key] = v;
  }
  return out;
}

// Fields of a C struct that are no option and no result: struct_size (the
// binding sets it, kvmem.h "ABI and versioning") and reserved (0).
const NOT_FIELDS = ['struct_size', 'reserved'];

// A C struct object (koffi, snake_case fields) as a result: camelCase keys,
// NOT_FIELDS dropped, the 0/1 fields named in `flags` (C names) as booleans.
function fromC(o, flags = []) {
  const r = {};
  for (const [k, v] of Object.entries(o)) {
    if (NOT_FIELDS.includes(k)) continue;
    r[camel(k)] = flags.includes(k) ? v !== 0 : v;
  }
  return r;
}

// The 0/1 flag fields of the params structs: they take booleans. A boolean
// anywhere else is refused at the C boundary (ints.js), not read as 0 or 1.
const FLAGS = new Set(['causal', 'compare', 'keys_rotated']);

// Fill the C params struct `defaults` (snake_case, from *_default_params())
// from options with camelCase keys; `skip` lists C fields the caller sets
// itself (counts, pointers given another way).
function toC(defaults, opts, what, skip = []) {
  const byCamel = new Map();
  for (const f of Object.keys(defaults)) if (!NOT_FIELDS.includes(f) && !skip.includes(f)) byCamel.set(camel(f), f);
  const o = readKeys(opts, [...byCamel.keys()], what);
  for (const [k, v] of Object.entries(o)) {
    if (v === undefined) continue;
    const f = byCamel.get(k);
    defaults[f] = typeof v === 'boolean' && FLAGS.has(f) ? (v ? 1 : 0) : v;
  }
  return defaults;
}

module.exports = { camel, readKeys, fromC, toC, NOT_FIELDS };
