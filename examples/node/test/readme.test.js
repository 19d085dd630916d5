'use strict';
// The README's Node lines of the Bindings section run as written.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const Module = require('node:module');

const root = path.join(__dirname, '..', '..', '..');
const kvmem = require(path.join(root, 'bindings', 'node'));

test('README Node lines run', async () => {
  const readme = fs.readFileSync(path.join(root, 'README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('## Bindings'));
  const code = section.match(/```js\n([\s\S]*?)```/)[1];
  const T = 5;
  const env = {
    k: new Float32Array(32 * T * 8 * 128).fill(0.25), v: new Float32Array(32 * T * 8 * 128),
    tokenIds: Int32Array.from({ length: T }, (_, i) => i), text: 'hello', q: new Float32Array(2 * 32 * 32 * 128).fill(1),
  };
  // require('kvmem') resolves to this checkout's binding
  const req = (name) => (name === 'kvmem' ? kvmem : Module.createRequire(__filename)(name));
  const fn = new Function('require', 'env', `return (async () => { const { k, v, tokenIds, text, q } = env;\n${code}\nreturn { ctx, agent, hits: typeof hits === 'undefined' ? null : hits }; })();`);
  if (kvmem.hasFunction('kvmem_retrieve')) {
    const r = await fn(req, env);
    assert.equal(r.agent.getInfo().nTokens, T);
    assert.equal(r.hits.nSets, 1);
    r.ctx.close();
  } else {
    await assert.rejects(fn(req, env), (e) => e instanceof kvmem.UnsupportedError && /kvmem_retrieve/.test(e.message));
  }
});
