// The README's WebAssembly example (section "Examples") runs as written,
// under Node on the module's Node build: the page loads ./kvmem.js beside
// the module, here it is the same file in build/wasm/www, and load() gets
// the Node factory (kvmem_wasm_node.cjs) instead of fetching the .wasm.
//
//   node wasm/tests/readme_test.mjs build/wasm/www
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';

const www = path.resolve(process.argv[2] || 'build/wasm/www');
const root = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const readme = fs.readFileSync(path.join(root, 'README.md'), 'utf8');
const section = readme.slice(readme.indexOf('### WebAssembly'));
let code = section.match(/```js\n([\s\S]*?)```/)[1];
const want = 'recalled blocks 1 and 2: 32 tokens of memory';
for (const [from, to] of [["from './kvmem.js'", `from ${JSON.stringify(pathToFileURL(path.join(www, 'kvmem.js')).href)}`],
                          ['await load()', 'await load({ factory: globalThis.__kvmemFactory })']]) {
  if (!code.includes(from)) throw new Error(`README's WebAssembly example no longer has ${from}: update this test`);
  code = code.replace(from, to);
}
globalThis.__kvmemFactory = createRequire(import.meta.url)(path.join(www, 'kvmem_wasm_node.cjs'));
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvmem-readme-'));
const file = path.join(dir, 'example.mjs');
fs.writeFileSync(file, code);
const lines = [];
const log = console.log;
console.log = (...a) => lines.push(a.join(' '));
try {
  await import(pathToFileURL(file).href);
} finally {
  console.log = log;
  fs.rmSync(dir, { recursive: true, force: true });
}
if (lines.length !== 1 || lines[0] !== want) {
  console.log(`FAIL: the README's WebAssembly example printed ${JSON.stringify(lines)}, want ${JSON.stringify([want])}`);
  process.exit(1);
}
console.log(`README WebAssembly example: ${lines[0]}`);
