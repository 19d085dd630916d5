'use strict';
// index.d.ts against a TypeScript program: tsc --strict compiles
// test/types/example.ts (which also holds lines the types must refuse), and
// the compiled program runs against the binding, so declarations and runtime agree.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');

const tsc = path.join(__dirname, '..', 'node_modules', 'typescript', 'bin', 'tsc');
const skip = fs.existsSync(tsc) ? false : 'skipped: typescript is not installed (cd bindings/node && npm ci)';

test('index.d.ts compiles with a strict TypeScript program that then runs', { skip }, () => {
  const src = path.join(__dirname, 'types', 'example.ts');
  const out = path.join(__dirname, 'types', 'example.js');
  try {
    const c = spawnSync(process.execPath, [tsc, '--strict', '--target', 'es2022', '--module', 'commonjs',
      '--types', 'node', '--noUnusedLocals', src], { encoding: 'utf8', cwd: path.join(__dirname, '..') });
    assert.equal(c.status, 0, `tsc --strict:\n${c.stdout}${c.stderr}`);
    const r = spawnSync(process.execPath, [out], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /types example ok/);
  } finally {
    fs.rmSync(out, { force: true });
  }
});
