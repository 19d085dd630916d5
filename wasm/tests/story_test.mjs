// The real-model entry points of the WebAssembly module under Node
// (km.storyOpen, story.session/encode/decode/reset), on the real model.
// Checked against references written here: a llama2.c forward pass in
// plain double-precision JavaScript (the first session's continuation is
// its greedy decoding), the story's own token history (every retrieved
// block and the live context are the history's tokens at their places),
// story_session.h's window shares, block alignment. Also: bad files and bad sessions
// are refused with the C status and message and leave the story unchanged,
// a reset story repeats itself exactly, closed stories are refused; the
// names follow the API's rule (unknown option keys refused naming the key,
// camelCase results, kvmem.d.ts declares what a Story has).
// Prints "N passed, N failed", or "skipped: <why>" without the model.
//
//   node wasm/tests/story_test.mjs build/wasm/www MODEL TOKENIZER
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { declaredMembers, publicNames } from './names.mjs';

const www = path.resolve(process.argv[2] || 'build/wasm/www');
const modelPath = process.argv[3], tokPath = process.argv[4];
if (!modelPath || !existsSync(modelPath) || !tokPath || !existsSync(tokPath)) {
  console.log(`skipped: no model or tokenizer (${modelPath} ${tokPath})`);
  process.exit(0);
}
const { load, KvmemError, Status } = await import(pathToFileURL(path.join(www, 'kvmem.js')).href);
const { PRESETS } = await import(pathToFileURL(path.join(www, 'story.js')).href);
const factory = createRequire(import.meta.url)(path.join(www, 'kvmem_wasm_node.cjs'));

let passed = 0, failed = 0;
function check(ok, what, detail = '') {
  if (ok) passed++;
  else {
    failed++;
    console.log(`FAIL: ${what}${detail ? ': ' + detail : ''}`);
  }
}
function throwsStatus(fn, status, fragment, what) {
  try {
    fn();
    check(false, what, 'did not throw');
  } catch (e) {
    check(e instanceof KvmemError && e.status === status && e.message.includes(fragment), what, `${e.status} ${e.message}`);
  }
}
const same = (a, b) => a.length === b.length && Array.from(a).every((x, i) => x === b[i]);

// ---- a llama2.c checkpoint, read and run here (double precision) ----
function readLlama2c(bytes) {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const h = Array.from({ length: 7 }, (_, i) => dv.getInt32(4 * i, true));
  const [dim, hidden, L, H, KVH, vocabRaw, seqLen] = h;
  const vocab = Math.abs(vocabRaw), hs = dim / H, kvd = KVH * hs;
  let at = 28;
  const take = (n) => {
    const a = new Float64Array(n);
    for (let i = 0; i < n; i++) a[i] = dv.getFloat32(at + 4 * i, true);
    at += 4 * n;
    return a;
  };
  const w = { emb: take(vocab * dim), rmsAtt: take(L * dim), wq: take(L * dim * dim), wk: take(L * kvd * dim),
    wv: take(L * kvd * dim), wo: take(L * dim * dim), rmsFfn: take(L * dim), w1: take(L * hidden * dim),
    w2: take(L * dim * hidden), w3: take(L * hidden * dim), rmsFinal: take(dim) };
  at += 4 * seqLen * hs; // the legacy freq_cis tables
  w.cls = vocabRaw > 0 ? w.emb : take(vocab * dim);
  return { dim, hidden, L, H, KVH, vocab, seqLen, hs, kvd, w };
}

function greedy(m, prompt, nGen) {
  const { dim, hidden, L, H, KVH, hs, kvd, w } = m;
  const K = Array.from({ length: L }, () => []), V = Array.from({ length: L }, () => []);
  const matvec = (W, off, x, rows, cols) => {
    const y = new Float64Array(rows);
    for (let r = 0; r < rows; r++) {
      let s = 0;
      for (let c = 0; c < cols; c++) s += W[off + r * cols + c] * x[c];
      y[r] = s;
    }
    return y;
  };
  const rms = (x, W, off) => {
    let ss = 0;
    for (const v of x) ss += v * v;
    const k = 1 / Math.sqrt(ss / x.length + 1e-5);
    return x.map((v, i) => v * k * W[off + i]);
  };
  const rope = (x, pos) => { // llama2.c: pairs (2i, 2i+1) in each head
    for (let i = 0; i < x.length; i += 2) {
      const th = pos * Math.pow(10000, -(i % hs) / hs), c = Math.cos(th), s = Math.sin(th);
      const a = x[i], b = x[i + 1];
      x[i] = a * c - b * s;
      x[i + 1] = a * s + b * c;
    }
  };
  const step = (tok, pos) => {
    let x = w.emb.slice(tok * dim, (tok + 1) * dim);
    for (let l = 0; l < L; l++) {
      const xb = rms(x, w.rmsAtt, l * dim);
      const q = matvec(w.wq, l * dim * dim, xb, dim, dim), k = matvec(w.wk, l * kvd * dim, xb, kvd, dim);
      const v = matvec(w.wv, l * kvd * dim, xb, kvd, dim);
      rope(q, pos);
      rope(k, pos);
      K[l].push(k);
      V[l].push(v);
      const att = new Float64Array(dim);
      for (let h = 0; h < H; h++) {
        const kh = Math.floor(h / (H / KVH));
        const sc = K[l].map((kk) => {
          let s = 0;
          for (let e = 0; e < hs; e++) s += q[h * hs + e] * kk[kh * hs + e];
          return s / Math.sqrt(hs);
        });
        const mx = Math.max(...sc), ex = sc.map((s) => Math.exp(s - mx)), z = ex.reduce((a, b) => a + b, 0);
        V[l].forEach((vv, t) => { for (let e = 0; e < hs; e++) att[h * hs + e] += (ex[t] / z) * vv[kh * hs + e]; });
      }
      const o = matvec(w.wo, l * dim * dim, att, dim, dim);
      x = x.map((v, i) => v + o[i]);
      const xf = rms(x, w.rmsFfn, l * dim);
      const g = matvec(w.w1, l * hidden * dim, xf, hidden, dim), u = matvec(w.w3, l * hidden * dim, xf, hidden, dim);
      const hb = g.map((a, i) => (a / (1 + Math.exp(-a))) * u[i]);
      const d = matvec(w.w2, l * dim * hidden, hb, dim, hidden);
      x = x.map((v, i) => v + d[i]);
    }
    const logits = matvec(w.cls, 0, rms(x, w.rmsFinal, 0), m.vocab, dim);
    let best = 0;
    for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
    return best;
  };
  let t = 0;
  prompt.forEach((tok, i) => { t = step(tok, i); });
  const out = [];
  while (out.length < nGen && t > 2) { // 0 unk, 1 BOS, 2 EOS: story.c stops at a story boundary
    out.push(t);
    t = step(t, prompt.length + out.length - 1);
  }
  return out;
}

const modelBytes = readFileSync(modelPath), tokBytes = readFileSync(tokPath);
const km = await load({ factory });
check(km.hasStory, 'the module holds the tinyllm engine');

// ---- bad files are refused with the loader's message ----
throwsStatus(() => km.storyOpen(new Uint8Array(0), tokBytes), Status.INVALID_ARG, 'empty', 'an empty model is refused');
throwsStatus(() => km.storyOpen(modelBytes.subarray(0, 1000), tokBytes), Status.FORMAT, 'the model file',
  'a truncated model is refused, the message naming the model file');
throwsStatus(() => km.storyOpen(new Uint8Array(64).fill(7), tokBytes), Status.FORMAT, '', 'a model of garbage is refused');
throwsStatus(() => km.storyOpen(modelBytes, tokBytes.subarray(0, tokBytes.length >> 1)), Status.FORMAT, '',
  'a truncated tokenizer is refused');
throwsStatus(() => km.storyOpen(modelBytes, null), Status.FORMAT, 'tokenizer',
  'a llama2.c model without a tokenizer is refused (it has no vocabulary of its own)');
try {
  km.storyOpen('stories260K.bin', tokBytes);
  check(false, 'a file name instead of bytes is refused');
} catch (e) {
  check(e instanceof TypeError, 'a file name instead of bytes is refused', e.message);
}

// ---- the model and the tokenizer ----
const story = km.storyOpen(modelBytes.buffer.slice(modelBytes.byteOffset, modelBytes.byteOffset + modelBytes.length), tokBytes);
const ref = readLlama2c(modelBytes);
const M = story.model;
check(M.format === 'llama2c' && M.dim === ref.dim && M.nLayers === ref.L && M.nHeads === ref.H && M.nKvHeads === ref.KVH &&
  M.vocab === ref.vocab && M.seqLen === ref.seqLen && M.hiddenDim === ref.hidden, 'the model is described as its header says',
JSON.stringify(M));
for (const s of ['Once upon a time, there was a little girl named Sue.', 'Hello "world"!\tTab, 2+2=4', 'ünïcödé ✓ 日本']) {
  // llama2.c's rules: the dummy-prefix space stays unless BOS precedes it
  const ids = story.encode(s, { bos: true });
  check(story.decode(ids) === s, `encode (after BOS) then decode gives the text back: ${JSON.stringify(s)}`,
    story.decode(ids));
  check(story.decode(story.encode(s)) === ' ' + s, `without BOS the dummy-prefix space stays: ${JSON.stringify(s)}`,
    story.decode(story.encode(s)));
  const noBos = story.encode(s);
  check(ids[0] === 1 && same(ids.subarray(1), noBos), 'bos prepends id 1');
}
throwsStatus(() => story.decode([0, M.vocab]), Status.INVALID_ARG, 'outside', 'decoding an id outside the vocabulary is refused');

// ---- a story: the default preset, which is story.c's ----
const texts = PRESETS[0].sessions;
const run = () => texts.map((t) => story.session(t, { art: true }));
const results = run();
const history = []; // every token the agent holds, as the sessions report them
// story_session.h's shares of the window (beyond.h's tl_window_split): a quarter for memory, an eighth live
const split = (np) => {
  const room = M.seqLen - np - M.gen;
  const memory = Math.min(Math.floor(0.25 * M.seqLen / M.blockSize) * M.blockSize, Math.floor(room / M.blockSize) * M.blockSize);
  return { memory, live: Math.max(0, Math.min(Math.floor(0.125 * M.seqLen), room - memory)) };
};
results.forEach((r, i) => {
  const N = history.length, np = r.prompt.length, sp = split(np);
  check(r.session === i + 1 && r.history === N, `session ${i + 1}: its history is the tokens before it`, `${r.history} vs ${N}`);
  check(same(r.prompt, story.encode(texts[i], { bos: N === 0 })), `session ${i + 1}: the prompt is the text's tokens`);
  check(r.split.memory === sp.memory && r.split.live === sp.live && r.budget === sp.memory + sp.live,
    `session ${i + 1}: the window's shares are story_session.h's (a quarter memory, an eighth live context)`,
    `${JSON.stringify(r.split)} vs ${JSON.stringify(sp)}`);
  if (N === 0) {
    check(r.memory === null && r.full === null && r.recent === null && r.rag === null, 'session 1: no memory, nothing to compare with');
  } else {
    const m = r.memory;
    check(m.rows === m.localRows + m.retrievedRows && m.retrievedRows <= sp.memory && m.localRows <= sp.live &&
      m.rows + np + M.gen <= M.seqLen, `session ${i + 1}: kvmem's memory, the text and the continuation fit the window`,
      JSON.stringify({ rows: m.rows, localRows: m.localRows, retrievedRows: m.retrievedRows, sp }));
    let blocksOk = true, nRetrieved = 0;
    const ids = new Set();
    for (const b of m.blocks) {
      blocksOk &&= b.n === M.blockSize && b.first === b.id * M.blockSize && !ids.has(b.id) &&
        b.first + b.n <= m.live.first && same(b.ids, history.slice(b.first, b.first + b.n)) && b.text === story.decode(b.ids);
      ids.add(b.id);
      nRetrieved += b.n;
    }
    check(blocksOk && nRetrieved === m.retrievedRows, `session ${i + 1}: retrieved blocks are whole, distinct, older than ` +
      'the live context, and hold the history\'s tokens', JSON.stringify(m.blocks.map((b) => [b.id, b.first, b.n])));
    check(m.live.first + m.live.n === N && m.live.n === m.localRows && m.live.first % M.blockSize === 0 &&
      same(m.live.ids, history.slice(m.live.first)), `session ${i + 1}: the live context is the newest history, from a block boundary`);
    let prev = -1, chunksOk = true, nChunk = 0;
    for (const c of r.rag.chunks) {
      chunksOk &&= c.first > prev && c.first + c.n <= m.live.first && same(c.ids, history.slice(c.first, c.first + c.n));
      prev = c.first + c.n - 1;
      nChunk += c.n;
    }
    check(chunksOk && nChunk < sp.memory, `session ${i + 1}: text RAG's chunks are chronological, older than the live context, ` +
      'within the memory share, and hold the history\'s tokens', JSON.stringify(r.rag.chunks.map((c) => [c.first, c.n])));
    check(r.tokens.ragPrefilled === 1 + nChunk + m.live.n + np, `session ${i + 1}: text RAG prefills BOS, its chunks, the live context and the text`);
    check(r.recent.window === Math.min(N, r.budget) && r.full.pastWindow === (N + np + M.gen > M.seqLen) &&
      [r.full, r.recent, r.rag].every((c) => c.ids.length <= M.gen && c.text === story.decode(c.ids)),
    `session ${i + 1}: the recent window, the whole history and text RAG continued`);
  }
  // a decode step per continued token (none when the story ends at once)
  check(r.art && r.art.decode.tilesVisited <= r.art.decode.tilesTotal && (r.art.decode.tilesTotal > 0) === (r.kvmem.ids.length > 0) &&
    r.art.prefill.tilesTotal > 0 && r.art.tileSize === M.artDefaultTile, `session ${i + 1}: ART stats`, JSON.stringify(r.art));
  check(r.kvmem.ids.length <= M.gen && r.kvmem.text === story.decode(r.kvmem.ids), `session ${i + 1}: the continuation's text is its ids'`);
  check(r.tokens.prefilled === np && r.tokens.probed === (r.memory && r.memory.blocks.length ? np : 0) &&
    r.tokens.reread === N + np, `session ${i + 1}: token counts`);
  history.push(...r.prompt);
});
check(story.historyTokens === history.length && history.length > M.seqLen, 'the agent holds every session\'s text (not the ' +
  'continuations), past the model\'s window', `${story.historyTokens} vs ${history.length}`);

// session 1 has no memory: its continuation is the model's greedy decoding of the text alone
{
  const want = greedy(ref, Array.from(results[0].prompt), M.gen);
  const exact = (() => { story.reset(); return story.session(texts[0]); })();
  check(same(exact.kvmem.ids, want), 'session 1 (exact attention) = greedy decoding by a double-precision JavaScript forward pass',
    `${exact.kvmem.ids} vs ${want}`);
  check(same(results[0].kvmem.ids, want), 'session 1 with ART = the same greedy decoding');
  check(exact.art === null, 'exact attention reports no ART stats');
}

// a reset story repeats itself exactly
story.reset();
check(story.historyTokens === 0, 'reset empties the history');
check(JSON.stringify(run()) === JSON.stringify(results), 'the same sessions after a reset give the same results');

// a smaller tile lets ART stop early somewhere in the story; its stats stay consistent
{
  story.reset();
  const small = texts.map((t) => story.session(t, { art: true, artTile: 8 }));
  const v = small.reduce((a, r) => a + r.art.decode.tilesVisited, 0), tot = small.reduce((a, r) => a + r.art.decode.tilesTotal, 0);
  check(small.every((r) => r.art.tileSize === 8) && v < tot, 'ART with tiles of 8 positions skips some tiles', `${v} of ${tot}`);
}

// ---- refusals leave the story as it was ----
const before = story.historyTokens;
throwsStatus(() => story.session(''), Status.INVALID_ARG, 'empty', 'an empty session is refused');
throwsStatus(() => story.session('word '.repeat(200)), Status.INVALID_ARG, `at most ${M.maxPrompt}`, 'a session over the prompt limit is refused');
throwsStatus(() => story.session('x', { artTile: 5000 }), Status.INVALID_ARG, 'tile', 'an ART tile size over 4096 is refused');
check(story.historyTokens === before, 'refused sessions leave the history unchanged');
{
  let full = null;
  const long = 'The cat sat on the mat and the dog ran in the sun. They played all day long. '.repeat(3);
  for (let i = 0; i < 80 && !full; i++) {
    try {
      story.session(long, { artTile: 0 });
    } catch (e) {
      full = e;
    }
  }
  const cap = 8 * M.seqLen, np = story.encode(long).length;
  check(full instanceof KvmemError && /story is full/.test(full.message) && story.historyTokens <= cap &&
    story.historyTokens + np > cap, 'a story past the agent\'s eight windows is refused', full && full.message);
}

// ---- names: unknown option keys are refused naming the key, results are camelCase ----
const h0 = story.historyTokens;
for (const [what, call] of [['session', () => story.session('x', { arts: true })], ['session (case)', () => story.session('x', { arttile: 8 })],
  ['encode', () => story.encode('x', { BOS: true })]]) {
  let e = null;
  try { call(); } catch (x) { e = x; }
  check(e instanceof TypeError && /unknown key '(arts|arttile|BOS)'/.test(e.message), `${what}: an unknown option key is a TypeError naming it`, String(e));
}
check(story.historyTokens === h0, 'refused options leave the history unchanged');
{
  const bad = [];
  const walk = (x, where) => {
    if (x === null || typeof x !== 'object') return;
    for (const [key, val] of Object.entries(x)) {
      if (!Array.isArray(x) && !/^[a-z][a-zA-Z0-9]*$/.test(key)) bad.push(`${where}.${key}`);
      walk(val, `${where}.${key}`);
    }
  };
  walk(M, 'model');
  results.forEach((r, i) => walk(r, `session ${i + 1}`));
  check(bad.length === 0, 'story.model and every session result have camelCase keys only', bad.join(', '));
  const dts = declaredMembers(readFileSync(path.join(www, 'kvmem.d.ts'), 'utf8'));
  const run = [...publicNames(story)], dec = dts.all('Story');
  check(run.every((n) => dec.has(n)) && [...dec].every((n) => run.includes(n)), 'kvmem.d.ts declares what a Story has',
    `${run.sort().join(' ')} vs ${[...dec].sort().join(' ')}`);
}

story.close();
story.close(); // a second close is a no-op
throwsStatus(() => story.session('One day,'), Status.CLOSED, 'closed', 'a closed story is refused');
km.close();
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
