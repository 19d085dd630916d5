// The package is an ES module and a CommonJS one (package.json "exports"):
// every value index.d.ts declares is a real named export of index.mjs, the
// same object as require('kvmem') gives (`import { InvalidArgumentError } from
// 'kvmem'` used to throw "Named export 'InvalidArgumentError' not found": 95 of
// 106 names were missing), and a TypeScript ES module (--module nodenext)
// compiles against the declarations the "import" condition names.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const pkg = path.resolve(here, '..');
const require = createRequire(import.meta.url);

// the runtime values index.d.ts declares: classes, functions, consts
function declared() {
  const dts = fs.readFileSync(path.join(pkg, 'index.d.ts'), 'utf8').replace(/\/\*[\s\S]*?\*\//g, '');
  const names = new Set();
  for (const m of dts.matchAll(/^export (?:declare )?(?:abstract )?(?:class|function) (\w+)/gm)) names.add(m[1]);
  for (const m of dts.matchAll(/^export const ([^;]+);/gm))
    for (const part of m[1].split(/,(?![^{]*})/)) names.add(part.trim().split(':')[0].trim());
  return [...names];
}

test('index.d.ts declares every name the CommonJS module exports, and only those', () => {
  const names = declared();
  const cjs = require('kvmem'); // the package itself, through its "exports" map
  assert.equal(names.length, 108);
  assert.deepEqual(names.slice().sort(), Object.keys(cjs).sort());
});

test('every declared name is a named ES export, the same object as CommonJS gives', async () => {
  const names = declared();
  const cjs = require('kvmem');
  const esm = await import('kvmem');
  for (const n of names) assert.ok(esm[n] !== undefined && esm[n] === cjs[n], `ES export ${n}`);
  assert.equal(esm.default, cjs);
  assert.deepEqual(Object.keys(esm).filter((n) => n !== 'default').sort(), names.slice().sort());
  // a static import of each name by name: a missing one is a SyntaxError at link time
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvmem-esm-'));
  try {
    const file = path.join(dir, 'all.mjs');
    fs.writeFileSync(file, `import { ${names.join(', ')} } from ${JSON.stringify(pathToFileURL(path.join(pkg, 'index.mjs')).href)};\n` +
                           `export const values = [${names.join(', ')}];\n`);
    const m = await import(pathToFileURL(file).href);
    assert.equal(m.values.length, names.length);
    assert.ok(m.values.every((v, i) => v === cjs[names[i]]));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
  assert.ok(new esm.InvalidArgumentError('x') instanceof cjs.KvmemError);
  assert.equal(typeof esm.version, 'function');
  assert.equal(esm.version(), cjs.version());
});

const tsc = path.join(pkg, 'node_modules', 'typescript', 'bin', 'tsc');
test('a TypeScript ES module compiles against the "import" types (nodenext)', { skip: fs.existsSync(tsc) ? false : 'skipped: typescript is not installed (cd bindings/node && npm ci)' }, () => {
  const dir = path.join(pkg, 'test', 'types', 'esm');
  fs.mkdirSync(dir, { recursive: true });
  const src = path.join(dir, 'named.mts');
  try {
    fs.writeFileSync(src, [
      "import kvmem, { InvalidArgumentError, KvmemError, Context, attend, QmemStore, SEG_UNIT_GROUP, version } from 'kvmem';",
      "import type { ModelSpec } from 'kvmem';",
      "const spec: ModelSpec = { nLayers: 1, nQHeads: 2, nKvHeads: 1, headDim: 4 };",
      "const e: KvmemError = new InvalidArgumentError('x');",
      "const v: string = version();",
      "export const all = [kvmem.Pool, Context, attend, QmemStore, SEG_UNIT_GROUP, e, v, spec];",
      '',
    ].join('\n'));
    const c = spawnSync(process.execPath, [tsc, '--strict', '--noEmit', '--module', 'nodenext', '--moduleResolution', 'nodenext',
      '--target', 'es2022', '--types', 'node', src], { encoding: 'utf8', cwd: pkg });
    assert.equal(c.status, 0, `tsc --module nodenext:\n${c.stdout}${c.stderr}`);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
