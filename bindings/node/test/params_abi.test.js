'use strict';
// Params structs carry struct_size (kvmem.h, "ABI and versioning"): the binding
// sets it from its own koffi declarations, a binding whose declaration is older
// than the library still gets the defaults of the rest, and structSize is never
// an option a caller passes.
const test = require('node:test');
const assert = require('node:assert/strict');
const kvmem = require('..');
const L = require('../lib');

const PARAMS = ['context', 'pool', 'append', 'retrieve', 'qmem', 'kvstore', 'attend', 'prefix', 'segments', 'kmeans',
                'multihop', 'load_plan'];

test('every *_default_params carries the binding\'s struct_size', () => {
  for (const name of PARAMS) {
    const p = L.fns[`kvmem_${name}_default_params`]();
    assert.equal(Number(p.struct_size), L.koffi.sizeof(L.types[`kvmem_${name}_params`]), name);
  }
});

test('a binding older than the library gets the defaults of the fields it lacks', () => {
  // kvmem_context_params before n_threads
  const Old = L.koffi.struct('old_context_params', { struct_size: 'size_t', backend: 'const char *' });
  const init = L.lib.func('kvmem_context_params_init', 'int', [L.koffi.out(L.koffi.pointer(Old)), 'size_t']);
  const create = L.lib.func('kvmem_context_create', 'int', [L.koffi.pointer(Old), L.koffi.out(L.koffi.pointer('kvmem_context *'))]);
  const old = {};
  assert.equal(init(old, L.koffi.sizeof(Old)), 0);
  assert.equal(Number(old.struct_size), L.koffi.sizeof(Old));
  assert.equal(old.backend, 'auto');
  const h = [null], ref = [null];
  assert.equal(create({ ...old, backend: 'cpu' }, h), 0);
  L.fns.kvmem_context_create(null, ref);
  try {
    assert.equal(L.fns.kvmem_context_backend(h[0]), 'cpu');
    assert.equal(L.fns.kvmem_context_n_threads(h[0]), L.fns.kvmem_context_n_threads(ref[0])); // the default
  } finally {
    L.fns.kvmem_context_free(h[0]);
    L.fns.kvmem_context_free(ref[0]);
  }
});

test('struct_size 0 is refused with the library\'s message', () => {
  const p = { ...L.fns.kvmem_context_default_params(), struct_size: 0 };
  assert.throws(() => L.fns.kvmem_context_create(p, [null]),
                (e) => e instanceof kvmem.InvalidArgumentError && /kvmem_context_params\.struct_size is 0/.test(e.message));
});

test('structSize and reserved are not options', () => {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const spec = { nLayers: 1, nQHeads: 2, nKvHeads: 1, headDim: 4 };
  assert.throws(() => ctx.poolCreate(spec, { structSize: 8 }), /unknown key 'structSize'/);
  const pool = ctx.poolCreate(spec);
  assert.throws(() => new kvmem.Segments(pool, 's', { structSize: 8 }), /unknown key 'structSize'/);
  assert.throws(() => kvmem.clusterKmeans(new Float32Array([1, 0, 0, 1]), 2, 2, { k: 1, reserved: 1 }), /unknown key 'reserved'/);
  ctx.close();
});
