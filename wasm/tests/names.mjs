// The names and conventions of the WebAssembly API (bindings/README.md,
// "Names"), run by api_test.mjs on its module:
// - every deprecated name still works, gives what its new name gives, and
//   warns once with a message saying what to use;
// - an unknown key in any options or spec object is refused with a
//   TypeError naming it (and a key the C API has but the module cannot
//   honour with UnsupportedError naming it);
// - results have camelCase keys only, no `reserved`, booleans for C's flags;
// - kvmem.d.ts declares exactly the names the module's objects have;
// - beside the Node binding (bindings/node, when it loads): the same
//   methods on the same objects, every difference listed here with its
//   reason; the same constants; the same message for the same mistake;
//   the same results (specs, infos, read-back, retrieval, gather, ART) for
//   the same calls.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

// Deprecated names: [object, old name, new name (a fragment of the warning)].
// The calls themselves are in deprecatedChecks.
const DEPRECATED = {
  Kvmem: ['createContext', 'createRetrieval', 'createRng', 'attendDefaults', 'openStory'],
  Context: ['createPool', 'attendTensors'],
  Pool: ['openAgent', 'createSynth', 'blockSize', 'ropeApply'],
  Agent: ['info', 'attend'],
  Retrieval: ['read', 'free'],
  Rng: ['free'],
  Synth: ['free'],
  KvmemError: ['statusName'],
};

// What one binding has and the other has not, and why. The check fails on a
// name missing from these lists and on a name listed that is no longer so.
const ONLY = {
  Context: {
    wasm: [],
    node: { transferStats: 'host<->device transfer counters: the module has only the CPU backend',
      transferReset: 'the transfer counters (no device in the module)',
      deviceTensor: 'device memory: the module has only the CPU backend', vulkanDevice: 'no Vulkan in the module',
      lastError: 'a failure\'s message kept by the object, for async calls on worker threads (the module has none)' },
  },
  Pool: {
    wasm: { synthCreate: 'the generator of `kvmem demo` (synth/synth.c), compiled into the module for the demo page' },
    node: { sync: 'no agent store (store_dir) in the module', syncAsync: 'no agent store in the module',
      segmentsCreate: 'KEEP segments are not in the WebAssembly API yet',
      agentOpenFile: 'agent files opened in place: no file system in the module',
      lastError: 'a failure\'s message kept by the object, for async calls on worker threads (the module has none)' },
  },
  Agent: {
    wasm: {},
    node: { save: 'no file system in the module', saveAsync: 'no file system', load: 'no file system', loadAsync: 'no file system',
      lastError: 'a failure\'s message kept by the object, for async calls on worker threads (the module has none)' },
  },
  Retrieval: { wasm: { sets: 'every set as plain data, what retrieve() returned before it returned a Retrieval' }, node: {} },
  module: {
    wasm: {
      M: 'the Emscripten module', kernels: 'the CPU kernel table in use (wasm128 or scalar)',
      hasStory: 'whether the module holds the tinyllm engine', storyOpen: 'the tinyllm engine (no Node binding of it)',
      now: 'the module\'s monotonic clock', demoScript: 'the scripted session of `kvmem demo`, for the demo page',
      close: 'frees the instance\'s scratch memory (Node has no instance)',
      contextCreate: 'the factory form of new km.Context() (a class needs the instance)',
      retrievalCreate: 'the factory form of new km.Retrieval()', rngCreate: 'the generator\'s state (the demo page)',
      attendDefaultParams: 'kvmem_attend_default_params(), for the page\'s controls',
    },
    node: Object.fromEntries([
      ['errorFor', 'the Node binding\'s own helper'], ['tensor', 'the Node binding\'s koffi tensor helper'],
      ['libraryPath', 'the shared library Node loaded'], ['hasFunction', 'which C functions the loaded library has'],
      ['backends', 'the module has the CPU backend only'], ['logSet', 'no log callback into JavaScript in the module'],
      ...['Segments', 'clusterKmeans', 'multihopSelect', 'multihopSchedule', 'loadPlan', 'GROUP_DYNAMIC', 'GROUP_STATIC',
        'SEG_EVENT_SEGMENT_STALE', 'SEG_EVENT_GROUP_STATIC', 'SEG_EVENT_GROUP_DYNAMIC', 'SEG_UNIT_SEGMENT', 'SEG_UNIT_GROUP']
        .map((n) => [n, 'KEEP segments are not in the WebAssembly API yet']),
      ...['QmemStore', 'QmemHead', 'KVStore', 'SlotMap', 'qmemScore', 'selectKeep', 'streamingKeep', 'h2oAccumulate', 'h2oKeep',
        'snapkvScore', 'SESSION_EXPLICIT', 'SESSION_MARKED', 'SESSION_PREFIX', 'SESSION_LOCAL', 'DEAD_SLOT', 'SENTINEL_K',
        'ATTEND_SRC_TENSORS', 'ATTEND_SRC_AGENT', 'ATTEND_SRC_SLOTMAP']
        .map((n) => [n, 'IntentKV (eviction, slot maps) is not in the WebAssembly API yet']),
      ...['batchMerge', 'batchExtract'].map((n) => [n, 'batching is not in the WebAssembly API yet']),
      ...['LOG_DEBUG', 'LOG_INFO', 'LOG_WARN', 'LOG_ERROR'].map((n) => [n, 'no log callback in the module']),
      ...['arrange', 'windowSplit'].map((n) => [n, 'the window placement helpers are not in the WebAssembly API yet']),
    ]),
  },
};
// Names in both whose kind differs (a value here, a function there).
const KIND_DIFFERS = {};

const isCamel = (k) => /^[a-z][a-zA-Z0-9]*$/.test(k);

// Every public name an object has: its prototype chain's (methods and
// accessors) and its own enumerable properties, without _-prefixed ones.
export function publicNames(obj) {
  const out = new Set(Object.keys(obj).filter((n) => !n.startsWith('_')));
  for (let p = Object.getPrototypeOf(obj); p && p !== Object.prototype && p !== Function.prototype; p = Object.getPrototypeOf(p))
    for (const n of Object.getOwnPropertyNames(p)) if (!n.startsWith('_') && n !== 'constructor') out.add(n);
  return out;
}

// Member names of the classes and interfaces declared in kvmem.d.ts, with
// what `extends` brings in.
export function declaredMembers(dts) {
  const decls = {};
  const re = /^export declare class (\w+)(?: extends (\w+))?|^declare class (\w+)(?: extends (\w+))?|^export interface (\w+)(?: extends ([\w, ]+))?/gm;
  let m;
  while ((m = re.exec(dts))) {
    const name = m[1] || m[3] || m[5], base = m[2] || m[4] || m[6] || '';
    let i = dts.indexOf('{', m.index), depth = 0, j = i;
    for (; j < dts.length; j++) {
      if (dts[j] === '{') depth++;
      else if (dts[j] === '}' && --depth === 0) break;
    }
    const members = new Set();
    let d = 0;
    const body = dts.slice(i + 1, j).replace(/\/\*[\s\S]*?\*\//g, '').replace(/\/\/.*$/gm, '');
    for (const part of body.split(/[;\n]/)) {
      const t = part.trim();
      if (d === 0) {
        const mm = /^(?:static\s+)?(?:readonly\s+)?(?:get\s+|set\s+)?(\w+)\??\s*[(:<]/.exec(t);
        if (mm && mm[1] !== 'constructor') members.add(mm[1]);
      }
      for (const c of t) { if (c === '{' || c === '(') d++; else if (c === '}' || c === ')') d--; }
    }
    // a class and an interface of the same name merge, as in TypeScript
    const prev = decls[name] || { base: [], members: new Set() };
    decls[name] = { base: prev.base.concat(base.split(',').map((x) => x.trim()).filter(Boolean)), members: new Set([...prev.members, ...members]) };
  }
  const all = (name) => {
    const d = decls[name];
    if (!d) return new Set();
    const s = new Set(d.members);
    for (const b of d.base) for (const x of all(b)) s.add(x);
    return s;
  };
  return { decls, all };
}

export async function nameChecks({ km, api, check, throwsType, root, www }) {
  const spec = { nLayers: 2, nQHeads: 2, nKvHeads: 1, headDim: 8 };
  const T = 8, row = 2 * 1 * 8;
  const k = Float32Array.from({ length: T * row }, (_, i) => Math.sin(i * 0.7));
  const v = Float32Array.from({ length: T * row }, (_, i) => Math.cos(i * 0.3));
  const q = Float32Array.from({ length: 2 * 2 * 2 * 8 }, (_, i) => Math.sin(i * 1.3 + 1));

  // ---- deprecated names: they work and warn once, saying what to use ----
  {
    const warnings = [];
    const orig = console.warn;
    console.warn = (...a) => warnings.push(a.join(' '));
    const ctx = km.contextCreate();
    try {
      // each entry: [old name, what its warning must name, call (returns whether it gave the new name's result)]
      const pool0 = ctx.poolCreate(spec, { blockSize: 4, storageDtype: 'f32' });
      const a0 = pool0.agentOpen('a');
      a0.append(k, v);
      const calls = [
        ['km.createContext()', 'new km.Context(options) or km.contextCreate', () => { const c = km.createContext({ nThreads: 1 }); const ok = c instanceof api.Context; c.close(); return ok; }],
        ['km.createRetrieval()', 'km.retrievalCreate', () => { const r = km.createRetrieval(); const ok = r instanceof api.Retrieval && !r.closed; r.close(); return ok; }],
        ['km.createRng()', 'km.rngCreate', () => { const r = km.createRng(7n); const ok = r.state === 7n; r.close(); return ok; }],
        ['km.attendDefaults()', 'km.attendDefaultParams()', () => JSON.stringify(km.attendDefaults()) === JSON.stringify(km.attendDefaultParams())],
        ['km.openStory()', 'km.storyOpen', () => {
          const err = (f) => { try { f(); return null; } catch (e) { return `${e.constructor.name} ${e.message}`; } };
          const garbage = new Uint8Array(64).fill(7);
          const x = err(() => km.openStory(garbage, null)), y = err(() => km.storyOpen(garbage, null));
          return x !== null && x === y;
        }],
        ['ctx.createPool()', 'ctx.poolCreate', () => { const p = ctx.createPool(spec, { blockSize: 8 }); const ok = p.getInfo().blockSize === 8; p.close(); return ok; }],
        ["Pool params: 'storage'", "'storageDtype'", () => { const p = ctx.poolCreate(spec, { storage: 'bf16' }); const ok = p.getInfo().storageDtype === km.BF16; p.close(); return ok; }],
        ['ctx.attendTensors()', 'km.attend(ctx', () => {
          const kk = k.subarray(0, 5 * 8), vv = v.subarray(0, 5 * 8), qq = q.subarray(0, 16);
          const old = ctx.attendTensors(qq, 1, kk, vv, { nQHeads: 2, nKvHeads: 1, headDim: 8, tauS: 0, tauD: 0 });
          const now = km.attend(ctx, { data: qq, shape: [1, 2, 8] }, { k: { data: kk, shape: [5, 1, 8] }, v: { data: vv, shape: [5, 1, 8] }, tauS: 0, tauD: 0 });
          return old.out.join() === now.out.join() && JSON.stringify(old.stats) === JSON.stringify(now.stats);
        }],
        ['pool.openAgent()', 'pool.agentOpen', () => { const a = pool0.openAgent('o'); const ok = a instanceof api.Agent && a.id === 'o'; a.close(); return ok; }],
        ['pool.createSynth()', 'pool.synthCreate', () => { const s = pool0.createSynth(3, 1); const ok = s instanceof api.Synth; s.close(); return ok; }],
        ['pool.blockSize', 'pool.getInfo().blockSize', () => pool0.blockSize === 4],
        ['pool.ropeApply()', 'km.ropeApply(pool.spec', () => {
          const x = Float32Array.from(k.subarray(0, 16)), y = Float32Array.from(x);
          const r = pool0.ropeApply(x, 2, 8, [3, 4]);
          km.ropeApply(pool0.spec, y, [3, 4]);
          return r.join() === y.join() && x.join() === Float32Array.from(k.subarray(0, 16)).join();
        }],
        ['agent.append(k, v, nTokens, options)', 'agent.append(k, v, options)', () => { a0.append(k, v, T, { positions: null }); return a0.getInfo().nTokens === 2 * T; }],
        ['agent.info()', 'agent.getInfo()', () => JSON.stringify(a0.info()) === JSON.stringify(a0.getInfo())],
        ['agent.retrieve(q, nQ, params, into)', 'agent.retrieve(q, { ...params, result })', () => {
          const into = km.retrievalCreate();
          const old = a0.retrieve(q, 2, { topK: 2 }, into), now = a0.retrieve(q, { topK: 2 });
          into.close();
          return old.sets[0].blocks.join() === now.get(0).blocks.join() && old.sets[0].blockScores.join() === now.blockScores(0).join();
        }],
        ['agent.attend(layer, q, nRows, params)', 'km.attend(ctx, q, { agent, layer', () => {
          const qq = q.subarray(0, 16);
          return a0.attend(1, qq, 1, { tauS: 0, tauD: 0 }).out.join() === km.attend(ctx, qq, { agent: a0, layer: 1, tauS: 0, tauD: 0 }).out.join();
        }],
        ['gather(...).nTokens', 'gather(...).shape[1]', () => { const g = a0.gather([0, 2]); return g.nTokens === 8 && g.shape[1] === 8; }],
        ['retrieval.read()', 'retrieval.sets', () => {
          const r = km.retrievalCreate();
          a0.retrieve(q, { topK: 1, result: r });
          const ok = JSON.stringify(r.read()) === JSON.stringify({ sets: r.sets });
          r.close();
          return ok;
        }],
        ['retrieval.free()', 'retrieval.close()', () => { const r = km.retrievalCreate(); r.free(); return r.closed; }],
        ['rng.free()', 'rng.close()', () => { const r = km.rngCreate(1); r.free(); try { return r.state === undefined; } catch (e) { return e instanceof api.ClosedError; } }],
        ['synth.free()', 'synth.close()', () => { const s = pool0.synthCreate(2, 1); s.free(); return s.closed; }],
        ['KvmemError.statusName', 'error.code', () => { try { pool0.agentOpen('.x'); } catch (e) { return e.statusName === e.code && e.code === 'KVMEM_ERR_INVALID_ARG'; } return false; }],
      ];
      const untried = Object.entries(DEPRECATED).flatMap(([cls, names]) => names.map((n) => [cls, n]))
        .filter(([, n]) => !calls.some(([old]) => old.includes(`.${n}`)));
      check(untried.length === 0, 'every deprecated name is tried', untried.join(' '));
      for (const [old, use, call] of calls) {
        const n0 = warnings.length;
        let ok;
        try { ok = call(); } catch (e) { ok = `threw ${e.message}`; }
        const w = warnings.slice(n0);
        check(ok === true, `deprecated ${old} still gives what its new name gives`, String(ok));
        check(w.length === 1 && w[0].includes(old) && w[0].includes('deprecated') && w[0].includes(`use ${use}`),
          `deprecated ${old} warns once, saying to use ${use}`, w.join(' | '));
        const n1 = warnings.length;
        try { call(); } catch { /* the first call's result was checked */ }
        check(warnings.length === n1, `deprecated ${old} warns only the first time`);
      }
    } finally {
      console.warn = orig;
      ctx.close();
    }
  }

  // ---- unknown keys are refused, naming the key, in every options and spec object ----
  const ctx = km.contextCreate();
  const pool = ctx.poolCreate(spec, { blockSize: 4, storageDtype: 'f32' });
  const a = pool.agentOpen('x');
  a.append(k, v, { tokenIds: Int32Array.from({ length: T }, (_, i) => i), text: 'abcdefgh', tokenTextOffsets: [0, 1, 2, 3, 4, 5, 6, 7] });
  const mistakes = {
    Context: () => new km.Context({ threads: 2 }),
    spec: () => ctx.poolCreate({ ...spec, nLayer: 3 }),
    'spec (case)': () => ctx.poolCreate({ ...spec, nKVHeads: 1 }),
    'spec (snake_case)': () => ctx.poolCreate({ ...spec, n_layers: 2 }),
    modelSpec: () => km.modelSpec({ headDims: 8 }),
    specValidate: () => km.specValidate({ ...spec, bogus: 1 }),
    'Pool params': () => ctx.poolCreate(spec, { blocksize: 4 }),
    append: () => a.append(k, v, { tokenIDs: [1, 2] }),
    read: () => a.read(0, 1, { kout: null }),
    'tensor view': () => a.append({ data: k, shape: [2, T, 1, 8], stride: [1] }, v),
    retrieve: () => a.retrieve(q, { topk: 1 }),
    gather: () => a.gather([0], 0, { dtypes: 'f32' }),
    prefixMatch: () => a.prefixMatch('x', { ratio: 0.5 }),
    attend: () => km.attend(ctx, q.subarray(0, 16), { agent: a, tauX: 0 }),
    ropeApply: () => km.ropeApply(spec, new Float32Array(8), [0], { reverse: true }),
    'ropeApply spec': () => km.ropeApply({ ...spec, theta: 1e4 }, new Float32Array(8), [0]),
  };
  for (const [what, call] of Object.entries(mistakes)) {
    let e = null;
    try { call(); } catch (x) { e = x; }
    const m = e && /unknown key '([^']+)'/.exec(e.message);
    check(e instanceof TypeError && m && String(call).includes(m[1]), `${what}: an unknown key is a TypeError naming it`, String(e));
  }
  throwsType(() => ctx.poolCreate({ ...spec, nKVHeads: 1 }), TypeError, "unknown key 'nKVHeads' (did you mean 'nKvHeads'?)",
    'a key in another case says which one was meant');
  throwsType(() => ctx.poolCreate(spec, { storage: 'f32', storageDtype: 'f32' }), TypeError, "'storageDtype' is given twice",
    'a key given under its old and new name is refused');
  throwsType(() => ctx.poolCreate(spec, { storeDir: '/tmp' }), api.UnsupportedError, "'storeDir' is not supported by the WebAssembly build",
    'a key the module cannot honour is refused as unsupported, naming it');
  throwsType(() => a.append(k, v, { dtype: 'f16' }), api.UnsupportedError, 'dtype f16', 'f16 tensors are refused as unsupported');
  throwsType(() => ctx.poolCreate(spec, 16), TypeError, 'Pool params must be an object', 'options that are not an object are refused');

  // ---- results: camelCase keys only, no reserved fields, booleans for flags ----
  {
    const bad = [];
    const walk = (x, where) => {
      if (x === null || typeof x !== 'object' || ArrayBuffer.isView(x)) return;
      for (const [key, val] of Object.entries(x)) {
        if (!Array.isArray(x) && !isCamel(key)) bad.push(`${where}.${key}`);
        walk(val, `${where}.${key}`);
      }
    };
    const into = km.retrievalCreate();
    const results = {
      'pool.getInfo()': pool.getInfo(), 'pool.getSpec()': pool.getSpec(), 'pool.spec': pool.spec, 'km.modelSpec()': km.modelSpec(spec),
      'agent.getInfo()': a.getInfo(), 'agent.blockInfo()': a.blockInfo(0), 'agent.read()': a.read(0, 2),
      'agent.gather()': a.gather([0, 1], 3), 'agent.prefixMatch()': a.prefixMatch('abc'),
      'retrieve().sets': a.retrieve(q, { topK: 1 }).sets, 'retrieve({ result }).sets': a.retrieve(q, { result: into }).sets,
      'km.attend()': km.attend(ctx, q.subarray(0, 16), { agent: a, layer: 0 }), 'km.attendDefaultParams()': km.attendDefaultParams(),
      'km.demoScript()': km.demoScript(),
    };
    into.close();
    for (const [where, r] of Object.entries(results)) walk(r, where);
    check(bad.length === 0, 'every result key is camelCase (no snake_case, no reserved)', bad.join(', '));
    const st = results['km.attend()'].stats, d = results['km.attendDefaultParams()'];
    check(results['agent.blockInfo()'].sealed === true && st.stoppedEarly === false && typeof d.causal === 'boolean' &&
      typeof d.compare === 'boolean', 'C\'s 0/1 flags come as booleans');
  }

  // ---- kvmem.d.ts declares the names the module's objects have ----
  {
    const dts = readFileSync(path.join(www, 'kvmem.d.ts'), 'utf8');
    const { decls, all } = declaredMembers(dts);
    const syn = pool.synthCreate(2, 1), rng = km.rngCreate(1), into = km.retrievalCreate();
    const instances = { Kvmem: km, Context: ctx, Pool: pool, Agent: a, Retrieval: into, RetrievalResult: a.retrieve(q), Rng: rng, Synth: syn };
    const ignore = new Set([...Object.keys(api.CONSTANTS), ...Object.keys(api).filter((n) => /Error$/.test(n)), 'Pool', 'Agent']);
    for (const [cls, obj] of Object.entries(instances)) {
      const run = [...publicNames(obj)].filter((n) => !(cls === 'Kvmem' && ignore.has(n)));
      const dec = new Set([...all(cls)].filter((n) => !(cls === 'Kvmem' && ignore.has(n))));
      const missing = run.filter((n) => !dec.has(n)), extra = [...dec].filter((n) => !run.includes(n));
      check(decls[cls] && !missing.length && !extra.length, `kvmem.d.ts declares what ${cls} has`,
        `not declared: ${missing.join(' ')}; declared, not there: ${extra.join(' ')}`);
    }
    const ns = all('Constants');
    check(Object.keys(api.CONSTANTS).every((n) => ns.has(n)) && ns.size === Object.keys(api.CONSTANTS).length,
      'kvmem.d.ts declares every constant');
    for (const n of Object.keys(api).filter((x) => /Error$/.test(x)))
      check(decls[n] && all('ErrorClasses').has(n), `kvmem.d.ts declares ${n}, on the module too`);
    syn.close(); rng.close(); into.close();
  }

  // ---- beside the Node binding ----
  let N;
  try {
    N = createRequire(import.meta.url)(path.join(root, 'bindings/node'));
  } catch (e) {
    console.log(`Node binding checks skipped: the Node binding did not load (${String(e.message).split('\n')[0]})`);
    ctx.close();
    return;
  }
  {
    const nctx = new N.Context({ backend: 'cpu', nThreads: 1 });
    const np = nctx.poolCreate(spec, { blockSize: 4, storageDtype: 'f32' });
    const na = np.agentOpen('x');
    na.append(k, v, { tokenIds: Int32Array.from({ length: T }, (_, i) => i), text: 'abcdefgh', tokenTextOffsets: [0, 1, 2, 3, 4, 5, 6, 7] });
    const nr = na.retrieve(q, { topK: 1 });
    const wr = km.retrievalCreate();

    // the same methods on the same objects
    const without = (names, cls) => new Set([...names].filter((n) => !(DEPRECATED[cls] || []).includes(n)));
    const pairs = { Context: [ctx, nctx], Pool: [pool, np], Agent: [a, na], Retrieval: [wr, nr] };
    for (const [cls, [w, n]] of Object.entries(pairs)) {
      const wn = without(publicNames(w), cls), nn = publicNames(n);
      const onlyW = [...wn].filter((x) => !nn.has(x)).sort(), onlyN = [...nn].filter((x) => !wn.has(x)).sort();
      check(onlyW.join() === Object.keys(ONLY[cls].wasm).sort().join(), `${cls}: the names only the WebAssembly API has are the listed ones`,
        `${onlyW.join(' ')} vs listed ${Object.keys(ONLY[cls].wasm).join(' ')}`);
      check(onlyN.join() === Object.keys(ONLY[cls].node).sort().join(), `${cls}: the names only the Node binding has are the listed ones`,
        `${onlyN.join(' ')} vs listed ${Object.keys(ONLY[cls].node).join(' ')}`);
    }
    // the module instance against Node's module
    const wn = without(publicNames(km), 'Kvmem'), nn = new Set(Object.keys(N).filter((x) => !x.startsWith('_')));
    const onlyW = [...wn].filter((x) => !nn.has(x)).sort(), onlyN = [...nn].filter((x) => !wn.has(x)).sort();
    check(onlyW.join() === Object.keys(ONLY.module.wasm).sort().join(), 'module: the names only the WebAssembly API has are the listed ones',
      `${onlyW.join(' ')} vs listed ${Object.keys(ONLY.module.wasm).join(' ')}`);
    check(onlyN.join() === Object.keys(ONLY.module.node).sort().join(), 'module: the names only the Node binding has are the listed ones',
      `${onlyN.join(' ')} vs listed ${Object.keys(ONLY.module.node).join(' ')}`);
    const kinds = [...wn].filter((x) => nn.has(x) && (typeof km[x] === 'function') !== (typeof N[x] === 'function')).sort();
    check(kinds.join() === Object.keys(KIND_DIFFERS).join(), 'module: a name in both is a function in both or in neither', kinds.join(' '));
    const consts = Object.keys(api.CONSTANTS).filter((c) => c in N && N[c] !== km[c]);
    check(consts.length === 0, 'the constants have the Node binding\'s values', consts.join(' '));

    // the same message for the same mistake
    const msg = (f) => { try { f(); return 'no error'; } catch (e) { return `${e.constructor.name}: ${e.message}`; } };
    const both = {
      'spec, a key in another case': (m, c) => c.poolCreate({ ...spec, nKVHeads: 1 }),
      'spec, snake_case': (m, c) => c.poolCreate({ ...spec, head_dims: 8 }),
      'Context options': (m) => new m.Context({ threads: 2 }),
      'Pool params': (m, c) => c.poolCreate(spec, { blocksize: 4 }),
      'Pool params, listing the known keys': (m, c) => c.poolCreate(spec, { bogus: 4 }),
      'append options': (m, c, ag) => ag.append(k, v, { tokenIDs: [1] }),
      'a short K': (m, c, ag) => ag.append(k.subarray(1), v),
      'read options': (m, c, ag) => ag.read(0, 1, { kout: null }),
      'gather options': (m, c, ag) => ag.gather([0], 0, { dtypes: 'f32' }),
      'retrieve options': (m, c, ag) => ag.retrieve(q, { topk: 1 }),
      'a query of the wrong size': (m, c, ag) => ag.retrieve(q.subarray(1)),
      'a tensor view': (m, c, ag) => ag.append({ data: k, shape: [2, T, 1, 8], stride: [1] }, v),
      'a view of the wrong shape': (m, c, ag) => ag.append({ data: k, shape: [2, T, 2, 4] }, v),
      'attend options': (m, c, ag) => m.attend(c, q.subarray(0, 16), { agent: ag, tauX: 0 }),
      'attend over tensors without a view': (m, c) => m.attend(c, q.subarray(0, 16), { k: { data: k, shape: [16, 1, 8] }, v: { data: v, shape: [16, 1, 8] } }),
      'prefixMatch options': (m, c, ag) => ag.prefixMatch('x', { ratio: 0.5 }),
      'ropeApply options': (m) => m.ropeApply(spec, new Float32Array(8), [0], { reverse: true }),
      'ropeApply rows': (m) => m.ropeApply(spec, new Float32Array(8), [0, 1]),
      'modelSpec': (m) => m.modelSpec({ headDims: 8 }),
      'a closed Context': (m) => { const c = new m.Context({ backend: 'cpu' }); c.close(); c.poolCreate(spec); },
    };
    for (const [what, f] of Object.entries(both)) {
      const x = msg(() => f(km, ctx, a)), y = msg(() => f(N, nctx, na));
      // C's messages: Node's is kvmem_last_error(), the WebAssembly one says the status name first
      const strip = x.replace(/^(\w+): KVMEM_ERR_\w+: /, '$1: ');
      check(strip === y && y !== 'no error', `the same message as Node for: ${what}`, `${x} vs ${y}`);
    }
    {
      let w = null, n = null;
      try { pool.agentOpen('.hidden'); } catch (e) { w = e; }
      try { np.agentOpen('.hidden'); } catch (e) { n = e; }
      check(w && n && w.constructor.name === n.constructor.name && w.code === n.code && w.status === n.status &&
        w.message === `${n.code}: ${n.message}`, 'a C error: the same class, code, status and message as in Node', `${w} vs ${n}`);
    }

    // the same results for the same calls
    const json = (x) => JSON.stringify(x);
    check(json(pool.getSpec()) === json(np.getSpec()) && json(pool.spec) === json(np.spec), 'getSpec and spec: as in Node', `${json(pool.getSpec())} vs ${json(np.getSpec())}`);
    const specW = { ...spec, ropeTheta: 500000, rotaryDim: 4, ropeScaling: km.ROPE_SCALING_LLAMA3, ropeFactor: 8, layerWindow: [0, 4], modelId: 'm' };
    check(json(km.modelSpec(specW)) === json(N.modelSpec(specW)), 'modelSpec: as in Node', `${json(km.modelSpec(specW))} vs ${json(N.modelSpec(specW))}`);
    check(json(pool.getInfo()) === json(np.getInfo()) && json(a.getInfo()) === json(na.getInfo()) && json(a.blockInfo(1)) === json(na.blockInfo(1)),
      'pool and agent infos: as in Node', `${json(a.getInfo())} vs ${json(na.getInfo())}; ${json(pool.getInfo())} vs ${json(np.getInfo())}`);
    const rw = a.read(1, 5), rn = na.read(1, 5);
    check(same(rw.k, rn.k) && same(rw.v, rn.v) && json(rw.shape) === json(rn.shape) && same(a.tokens(), na.tokens()) && a.text() === na.text(),
      'read, tokens and text: as in Node');
    check(json(a.prefixMatch('abcdefghij')) === json(na.prefixMatch('abcdefghij')) && json(a.prefixMatch('abcx', { minRatio: 0.1 })) === json(na.prefixMatch('abcx', { minRatio: 0.1 })),
      'prefixMatch: as in Node');
    for (const opts of [{ topK: 1 }, { topK: 2, norm: km.NORM_RR, agg: km.AGG_SUM }, { topK: 1, scope: km.SCOPE_PER_LAYER }, { mode: km.RETRIEVE_EXACT }]) {
      const x = a.retrieve(q, opts), y = na.retrieve(q, opts);
      let ok = x.nSets === y.nSets;
      for (let s = 0; ok && s < x.nSets; s++)
        ok = same(x.get(s).blocks, y.get(s).blocks) && x.nTokens(s) === y.nTokens(s) && close(x.blockScores(s), y.blockScores(s)) &&
          close(x.get(s).scores, y.get(s).scores);
      check(ok, `retrieve ${json(opts)}: the blocks and (to f32 rounding) the scores Node gets`);
      y.close();
    }
    const empty = (r) => json({ k: r.k && Array.from(r.k), v: r.v && Array.from(r.v), shape: r.shape });
    check(empty(a.read(3, 0)) === empty(na.read(3, 0)) && empty(a.gather([])) === empty(na.gather([])) &&
      empty(a.read(0, 2, { keys: false })) === empty(na.read(0, 2, { keys: false })), 'empty reads and gathers, and skipped keys: as in Node',
    `${empty(a.gather([]))} vs ${empty(na.gather([]))}`);
    const gw = a.gather([1, 0], 10), gn = na.gather([1, 0], 10);
    check(json(gw.shape) === json(gn.shape) && same(gw.v, gn.v) && close(gw.k, gn.k), 'gather: as in Node');
    for (const layer of [0, 1]) {
      const qq = q.subarray(16, 48);
      const x = km.attend(ctx, qq, { agent: a, layer, basePosition: 3, tauS: 0, tauD: 0 }), y = N.attend(nctx, qq, { agent: na, layer, basePosition: 3, tauS: 0, tauD: 0 });
      check(close(x.out, y.out) && json(x.stats) === json(y.stats), `attend over layer ${layer}: out and stats as in Node`, `${json(x.stats)} vs ${json(y.stats)}`);
    }
    {
      const x = Float32Array.from(q), y = Float32Array.from(q);
      km.ropeApply(specW, x, [5, 9, 1000, 7], { stride: 8 });
      N.ropeApply(specW, y, [5, 9, 1000, 7], { stride: 8 });
      check(close(x, y), 'ropeApply (llama3 scaling, partial rotary): as in Node');
    }

    // one piece of code, run unchanged on Node's module and on the module instance
    const portable = async (kvmem) => {
      const c = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
      const p = c.poolCreate({ ...spec, ropeTheta: 500000, modelId: 'portable' }, { blockSize: 4, storageDtype: kvmem.F32 });
      const agent = p.agentOpen('p');
      await agent.appendAsync(k, v, { tokenIds: Int32Array.from({ length: T }, (_, i) => 7 * i), text: 'portable' });
      agent.flush();
      const r = await agent.retrieveAsync(q, { topK: 2, norm: kvmem.NORM_RR, agg: kvmem.AGG_SUM });
      const { blocks } = r.get(0);
      const g = await agent.gatherAsync(blocks, 5, { values: false });
      const a = await kvmem.attendAsync(c, q.subarray(0, 16), { agent, layer: 1, tauS: 0, tauD: 0 });
      let err = null;
      try { p.agentOpen('p'); } catch (e) { err = [e.constructor.name, e.code, e instanceof kvmem.ExistsError]; }
      const out = { info: agent.getInfo(), pool: p.getInfo(), spec: p.getSpec(), ids: p.agentIds(), tokens: Array.from(agent.tokens()),
        text: agent.text(), blocks: Array.from(blocks), nTokens: r.nTokens(0), shape: g.shape, v: g.v, stats: a.stats, err };
      r.close();
      c.close();
      return out;
    };
    check(json(await portable(km)) === json(await portable(N)), 'the same code runs on both and gives the same results',
      `${json(await portable(km))} vs ${json(await portable(N))}`);

    wr.close();
    nr.close();
    nctx.close();
  }
  ctx.close();
}

function same(a, b) { return a.length === b.length && Array.from(a).every((x, i) => Object.is(x, b[i])); }
// to f32 rounding: the two builds run different SIMD kernels (wasm128, AVX2/AVX-512)
function close(a, b) {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) {
    if (Number.isNaN(a[i]) !== Number.isNaN(b[i])) return false;
    if (!Number.isNaN(a[i]) && Math.abs(a[i] - b[i]) > 1e-5 * Math.max(1, Math.abs(b[i]))) return false;
  }
  return true;
}
