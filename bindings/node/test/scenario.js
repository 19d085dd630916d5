'use strict';
// The shared scenario (bindings/README.md): inputs from the integer formula of
// bindings/fixture/scenario.c, and where the C-computed fixture lives.
const fs = require('node:fs');
const path = require('node:path');

const L = 2, HQ = 4, HKV = 2, D = 8, BS = 4;
const AGENTS = [
  ['alice', 1, [[5, 0, 'hello there'], [6, 0, 'what is kv memory'], [3, 0, 'ok']]],
  ['bob', 2, [[4, 0, 'plan a trip'], [7, 1, 'to the mountains']]],
];
const REPO = path.resolve(__dirname, '..', '..', '..');

function fixture() {
  const p = process.env.KVMEM_FIXTURE || path.join(REPO, 'build', 'default', 'bindings', 'scenario.json');
  if (!fs.existsSync(p)) throw new Error(`scenario fixture ${p} is missing: build the C tree first (make build) or set KVMEM_FIXTURE`);
  return JSON.parse(fs.readFileSync(p, 'utf8'));
}

function value(salt, layer, token, head, dim, mul, mod) {
  const idx = (((salt * 8 + layer) * 1000 + token) * 16 + head) * 64 + dim;
  return ((idx * mul + 17) % mod) / (mod / 2) - 1; // exact in doubles (idx * mul < 2^53)
}

// Flat [L][n][HKV][D] K and V as Float32Array.
function kv(salt, g0, n) {
  const k = new Float32Array(L * n * HKV * D), v = new Float32Array(L * n * HKV * D);
  let i = 0;
  for (let l = 0; l < L; l++) for (let t = 0; t < n; t++) for (let h = 0; h < HKV; h++) for (let d = 0; d < D; d++, i++) {
    k[i] = value(salt, l, g0 + t, h, d, 7919, 2003);
    v[i] = value(salt, l, g0 + t, h, d, 104729, 1999);
  }
  return { k, v };
}

module.exports = { L, HQ, HKV, D, BS, AGENTS, REPO, fixture, kv, value };
