'use strict';
// The README's Node.js example (section "Examples") runs as written.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const Module = require('node:module');

const root = path.join(__dirname, '..', '..', '..');
const kvmem = require(path.join(root, 'bindings', 'node'));

test('README Node.js example runs', () => {
  const readme = fs.readFileSync(path.join(root, 'README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('## Examples'));
  const code = section.match(/```js\n([\s\S]*?)```/)[1];
  // require('kvmem') resolves to this checkout's binding
  const req = (name) => (name === 'kvmem' ? kvmem : Module.createRequire(__filename)(name));
  const lines = [];
  const console = { log: (...a) => lines.push(a.join(' ')) };
  const fn = new Function('require', 'console', `${code}\nreturn { v, blocks, mem };`);
  const { v, blocks, mem } = fn(req, console);
  assert.deepEqual(lines, ['recalled blocks 1 and 2: 32 tokens of memory']);
  assert.deepEqual(mem.shape, [2, 32, 2, 8]);
  // the gathered values are the appended ones of those blocks (V is not rotated), to f16's precision
  const [L, T, row] = [2, 64, 2 * 8];
  for (let l = 0; l < L; l++)
    for (let j = 0; j < 32; j++)
      for (let e = 0; e < row; e++) {
        const t = blocks[j >> 4] * 16 + (j & 15);
        const want = v[(l * T + t) * row + e], got = mem.v[(l * 32 + j) * row + e];
        assert.ok(Math.abs(got - want) <= Math.abs(want) * 2 ** -11, `v[${l}][${t}][${e}]: ${got} vs ${want}`);
      }
});
