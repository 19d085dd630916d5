'use strict';
// Every KVMEM_API function of include/kvmem.h is declared in lib.js, present in
// the loaded library, and called by the high-level API (or listed here as
// deliberately low-level).
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const L = require('../lib');
const { REPO } = require('./scenario');

// *_params_init: called by lib.js's kvmem_X_default_params(), as by kvmem.h's inline ones
const LOW_LEVEL_ONLY = new Set(['kvmem_tensor_init', 'kvmem_free']);
const isParamsInit = (n) => n.endsWith('_params_init');
const names = L.headerFunctions(fs.readFileSync(path.join(REPO, 'include', 'kvmem.h'), 'utf8'));

test('the header parser finds the API', () => assert.ok(names.length > 30, `${names.length} functions`));

test('every public function is declared', () => {
  assert.deepEqual(names.filter(n => !(n in L.declared)), []);
});

test('every declared public function is in the loaded library', () => {
  assert.deepEqual(names.filter(n => L.missing.has(n)), []);
});

test('every public function is used by the high-level API', () => {
  const src = fs.readFileSync(path.join(__dirname, '..', 'index.js'), 'utf8');
  const used = new Set([...src.matchAll(/\bC\.(kvmem_\w+)/g)].map(m => m[1]));
  // an *_errbuf form is what the plain call's `.async` runs (lib.js asyncForm)
  assert.deepEqual(names.filter(n => !used.has(n) && !LOW_LEVEL_ONLY.has(n) && !n.endsWith('_errbuf') && !isParamsInit(n)), []);
});

test('every *_errbuf form backs the .async of its plain call', () => {
  const forms = names.filter(n => n.endsWith('_errbuf'));
  assert.ok(forms.length >= 8);
  for (const n of forms) assert.equal(typeof L.fns[n.slice(0, -'_errbuf'.length)].async, 'function', n);
});

test('every public struct is mirrored with the size the C compiler gives it', () => {
  const { fixture } = require('./scenario');
  const abi = fixture().abi;
  const hdr = fs.readFileSync(path.join(REPO, 'include', 'kvmem.h'), 'utf8');
  const structs = [...hdr.matchAll(/typedef struct (kvmem_\w+) \{/g)].map(m => m[1]);
  assert.ok(structs.length >= 9);
  assert.deepEqual(structs.filter(s => !(s in abi)), [], 'add them to ABI_STRUCTS in bindings/fixture/scenario.c');
  const wrong = structs.filter(s => !L.types[s] || L.koffi.sizeof(L.types[s]) !== abi[s])
    .map(s => [s, L.types[s] ? L.koffi.sizeof(L.types[s]) : null, abi[s]]);
  assert.deepEqual(wrong, []);
});
