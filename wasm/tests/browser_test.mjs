// The demo page in headless Chromium, checked against the native library:
// serve build/wasm/www on 127.0.0.1, load the page, change its controls,
// read the numbers it shows and compare them with
// `kvmem demo --json --agent A --turn N --mode M --k K --block-size BS --tau-s X --tau-d Y`
// for the same seed and settings. Then the real-model mode (the tinyllm
// engine in the page, the model served beside it and then picked from disk
// with the file inputs) against the native engine on the same sessions:
// `tinyllm-story --art` (the page's own code, natively: every token id and
// ART stat) and, with ART off, `tinyllm demo` (story.c, its printed text:
// retrieved blocks, live context, the three continuations). Then the page
// opened from disk (file://) must say how to serve it. Saves screenshots.
// Prints "N passed, N failed"; exits 1 on any failure.
//
//   node wasm/tests/browser_test.mjs --www build/wasm/www --kvmem build/default/tools/kvmem [--screenshot out.png]
//        [--model M --tokenizer T --tinyllm DIR]   (DIR holds tinyllm and tinyllm-story)
//        [--model15m stories15M.bin --tokenizer15m tokenizer.bin | --skip15m WHY]
//   node wasm/tests/browser_test.mjs --www build/wasm/www --bench out.json   (bench.html only; no checks)
//   node wasm/tests/browser_test.mjs --www build/wasm/www --bench-story out.json [--repeat R]
//        (the real-model story R times in the page, ART on: the median time of each session; no checks)
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { chromium } from 'playwright-core';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
const www = path.resolve(args.www);
const kvmem = args.kvmem ? path.resolve(args.kvmem) : null;
const tinyllmDir = args.tinyllm ? path.resolve(args.tinyllm) : null;

class Done extends Error {}
let passed = 0, failed = 0;
function check(ok, what, detail = '') {
  if (ok) passed++;
  else {
    failed++;
    console.log(`FAIL: ${what}${detail ? ': ' + detail : ''}`);
  }
}
const sameList = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

// A static file server for the build folder, loopback only.
const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.mjs': 'text/javascript', '.css': 'text/css',
  '.wasm': 'application/wasm', '.json': 'application/json', '.png': 'image/png' };
const server = http.createServer((req, res) => {
  const rel = decodeURIComponent(new URL(req.url, 'http://x').pathname).replace(/^\/+/, '') || 'index.html';
  const file = path.resolve(www, rel);
  if (!file.startsWith(www + path.sep)) { res.writeHead(403).end(); return; }
  try {
    if (!statSync(file).isFile()) throw new Error('not a file');
    res.writeHead(200, { 'content-type': TYPES[path.extname(file)] || 'application/octet-stream' });
    res.end(readFileSync(file));
  } catch {
    res.writeHead(404).end();
  }
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const url = `http://127.0.0.1:${server.address().port}/`;

function native(s) {
  const out = execFileSync(kvmem, ['demo', '--json', '--seed', '42', '--agent', s.agent, '--turn', String(s.turn),
    '--mode', s.mode, '--k', String(s.k), '--block-size', String(s.bs), '--tau-s', String(s.tauS), '--tau-d', String(s.tauD)],
  { encoding: 'utf8' });
  return JSON.parse(out);
}

// What the page shows, read from the DOM.
async function shown(page) {
  return page.evaluate(() => {
    const bars = (id) => Array.from(document.querySelectorAll(`#${id} .bar`));
    const rows = Array.from(document.querySelectorAll('#selected tbody tr'));
    const pts = (cls) => Array.from(document.querySelectorAll(`#art-chart circle.${cls}`)).map((c) => Number(c.dataset.value));
    return {
      aabbScores: bars('strip-aabb').map((b) => Number(b.dataset.score)),
      exactScores: bars('strip-exact').map((b) => Number(b.dataset.score)),
      aabbSelected: bars('strip-aabb').filter((b) => b.classList.contains('selected')).map((b) => Number(b.dataset.block)),
      exactSelected: bars('strip-exact').filter((b) => b.classList.contains('selected')).map((b) => Number(b.dataset.block)),
      tableBlocks: rows.map((r) => Number(r.dataset.block)),
      newPositions: rows.map((r) => r.querySelector('.newpos').textContent.split('–').map(Number)),
      tableScores: rows.map((r) => Number(r.querySelector('.score').textContent)),
      recall: document.getElementById('recall').textContent,
      artVisited: document.getElementById('art-visited').textContent,
      artStopped: Number(document.getElementById('art-stopped').textContent),
      scaleChange: pts('scale'),
      directionChange: pts('direction'),
      meta: document.getElementById('meta').textContent,
      question: document.getElementById('question-text').textContent,
    };
  });
}

function compare(label, ui, nat) {
  const close = (a, b, tol) => a.length === b.length && a.every((x, i) => Math.abs(x - b[i]) <= tol(b[i]));
  // scores are shown to 4 decimals; SIMD128 and the native SIMD sum in other orders
  const score = () => 6e-5 + 0;
  const sig3 = (v) => 5e-3 * Math.abs(v) + 1e-9;
  check(sameList(ui.aabbSelected, nat.aabb_selected), `${label}: AABB selection`, `${ui.aabbSelected} vs ${nat.aabb_selected}`);
  check(sameList(ui.exactSelected, nat.exact_selected), `${label}: EXACT selection`, `${ui.exactSelected} vs ${nat.exact_selected}`);
  check(sameList(ui.tableBlocks, nat.aabb_selected), `${label}: selected-blocks table`);
  check(JSON.stringify(ui.newPositions) === JSON.stringify(nat.new_positions), `${label}: new positions`,
    `${JSON.stringify(ui.newPositions)} vs ${JSON.stringify(nat.new_positions)}`);
  check(close(ui.aabbScores, nat.aabb_scores, score), `${label}: AABB score strip (${nat.aabb_scores.length} blocks)`);
  check(close(ui.exactScores, nat.exact_scores, score), `${label}: EXACT score strip`);
  check(close(ui.tableScores, nat.aabb_selected.map((b) => nat.aabb_scores[b]), score), `${label}: table scores`);
  check(ui.recall === nat.recall.toFixed(4), `${label}: recall@k`, `${ui.recall} vs ${nat.recall}`);
  const art = nat.art;
  check(ui.artVisited === (art.tiles_visited / art.streams).toFixed(1), `${label}: ART blocks read per stream`,
    `${ui.artVisited} vs ${art.tiles_visited}/${art.streams}`);
  check(ui.artStopped === art.streams_stopped, `${label}: ART streams stopped`);
  check(close(ui.scaleChange, art.scale_change.slice(1), sig3), `${label}: ART scale change per block`);
  check(close(ui.directionChange, art.direction_change.slice(1), sig3), `${label}: ART direction change per block`);
}

// ---- the real-model mode ----

// The native engine on the same sessions: the page's code (story_session.c) as JSON.
function nativeStory(model, tok, texts, { art = true, artTile = 0 } = {}) {
  const a = [model, '--tokenizer', tok, ...(art ? ['--art'] : []), ...(artTile ? ['--art-tile', String(artTile)] : []), ...texts];
  return JSON.parse(execFileSync(path.join(tinyllmDir, 'tinyllm-story'), a, { encoding: 'utf8' })).sessions;
}

// `tinyllm demo`'s printed story (story.c, both processes), parsed: phase 1's
// sessions (their history after each) and phase 2's last session in full.
function demoStory(model, tok) {
  const dir = mkdtempSync(path.join(tmpdir(), 'kvmem-story-'));
  try {
    const out = execFileSync(path.join(tinyllmDir, 'tinyllm'), ['demo', model, '--tokenizer', tok, '--state', dir], { encoding: 'utf8' });
    const sessions = [];
    let last = null, m;
    for (const line of out.split('\n')) {
      if ((m = /^ {2}session +(\d+), +(\d+) tokens \(history +(\d+), [^)]*\) "(.*?)(?: \.\.\.)?"$/.exec(line)))
        sessions.push({ session: +m[1], n: +m[2], historyAfter: +m[3], excerpt: m[4] });
      else if ((m = /^session (\d+) \(history (\d+) tokens, [^)]*\): "(.*)"$/.exec(line)))
        last = { session: +m[1], history: +m[2], newText: m[3], blocks: [], chunks: [], live: null, cont: {} };
      else if (!last) continue;
      else if ((m = /^ {4}block +(\d+) {2}tokens +(\d+)-(\d+) +"(.*)"$/.exec(line)))
        last.blocks.push({ id: +m[1], first: +m[2], n: +m[3] - +m[2] + 1, text: m[4] });
      else if ((m = /^ {15}tokens +(\d+)-(\d+) +"(.*)"$/.exec(line))) last.chunks.push({ first: +m[1], n: +m[2] - +m[1] + 1, text: m[3] });
      else if ((m = /^ {2}both end with the live context, the newest \d+ tokens: "(.*)"$/.exec(line))) last.live = m[1];
      else if ((m = /^ {4}(kvmem's memory|text RAG|the recent +\d+ tokens|the whole history) +\d+: [^"]*"(.*)"$/.exec(line)))
        last.cont[{ "kvmem's memory": 'kvmem', 'text RAG': 'rag', 'the whole history': 'full' }[m[1]] || 'recent'] = m[2];
      else if ((m = /^(Recall of .*)$/.exec(line))) last.verdict = m[1];
    }
    return { sessions, last };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// What the story mode shows, read from the DOM.
async function shownStory(page) {
  return page.evaluate(() => Array.from(document.querySelectorAll('#story-results article')).map((a) => {
    const q = (sel) => a.querySelector(sel);
    const ids = (e) => e.dataset.ids.split(' ').filter(Boolean).map(Number);
    const text = (e) => e.querySelector('q').textContent;
    const row = (kind) => { const r = q(`tr[data-kind="${kind}"]`); return r && { ids: ids(r), text: text(r) }; };
    const live = q('p.live'), art = q('.art[data-visited]'), verdict = q('p.verdict');
    return {
      error: a.classList.contains('error') ? a.textContent : null,
      session: Number(a.dataset.session), history: Number(a.dataset.history), budget: Number(a.dataset.budget),
      newText: q('.newtext') && text(q('.newtext')),
      blocks: Array.from(a.querySelectorAll('li.block')).map((b) => ({ id: Number(b.dataset.block), first: Number(b.dataset.first),
        n: Number(b.dataset.n), ids: ids(b), text: text(b) })),
      live: live && { first: Number(live.dataset.first), n: Number(live.dataset.n), ids: ids(live), text: text(live) },
      art: art && { visited: Number(art.dataset.visited), total: Number(art.dataset.total), positions: Number(art.dataset.positions),
        tile: Number(art.dataset.tile) },
      chunks: Array.from(a.querySelectorAll('li.chunk')).map((c) => ({ first: Number(c.dataset.first), n: Number(c.dataset.n),
        ids: ids(c), text: text(c) })),
      kvmem: row('kvmem'), rag: row('rag'), full: row('full'), recent: row('recent'),
      verdict: verdict && { text: verdict.textContent, named: verdict.dataset.named.split(' ').filter(Boolean) },
    };
  }));
}

const flat = (t) => t.replace(/\n/g, ' '); // the page and `tinyllm demo` show line breaks as spaces

// The page against tinyllm-story's JSON: every id, every ART stat.
function compareStory(label, ui, nat) {
  check(ui.length === nat.length && ui.every((u) => !u.error), `${label}: ${nat.length} sessions shown, no error`,
    `${ui.length} shown; ${ui.filter((u) => u.error).map((u) => u.error).join(' | ')}`);
  ui.forEach((u, i) => {
    const n = nat[i], L = `${label}, session ${i + 1}`;
    if (!n) return;
    check(u.history === n.history && u.budget === n.budget, `${L}: history and budget`, `${u.history}/${u.budget} vs ${n.history}/${n.budget}`);
    check(u.newText === flat(n.text), `${L}: the new text`);
    const nb = n.memory ? n.memory.blocks : [];
    check(sameList(u.blocks.map((b) => b.id), nb.map((b) => b.id)), `${L}: the same retrieved blocks`,
      `${u.blocks.map((b) => b.id)} vs ${nb.map((b) => b.id)}`);
    check(u.blocks.every((b, j) => nb[j] && b.first === nb[j].first && b.n === nb[j].n && sameList(b.ids, nb[j].ids) && b.text === flat(nb[j].text)),
      `${L}: the retrieved blocks' tokens and text`);
    if (n.memory)
      check(u.live && u.live.first === n.memory.live.first && sameList(u.live.ids, n.memory.live.ids) && u.live.text === flat(n.memory.live.text),
        `${L}: the live context`);
    if (n.art)
      check(u.art && u.art.visited === n.art.decode.tiles_visited && u.art.total === n.art.decode.tiles_total &&
        u.art.positions === n.art.decode.positions_read && u.art.tile === n.art.tile_size, `${L}: the ART stop point`,
      `${JSON.stringify(u.art)} vs ${JSON.stringify(n.art.decode)}`);
    const nc = n.rag ? n.rag.chunks : [];
    check(JSON.stringify(u.chunks.map((c) => [c.first, c.n, c.ids.join(' '), c.text])) ===
      JSON.stringify(nc.map((c) => [c.first, c.n, c.ids.join(' '), flat(c.text)])), `${L}: text RAG's chunks`);
    for (const kind of ['kvmem', 'rag', 'full', 'recent']) {
      if (!n[kind]) continue;
      check(u[kind] && sameList(u[kind].ids, n[kind].ids) && u[kind].text === flat(n[kind].text), `${L}: the ${kind} continuation's tokens`,
        `${u[kind] && u[kind].ids} vs ${n[kind].ids}`);
    }
  });
}

// The page (ART off) against `tinyllm demo`'s printed text: another program,
// story.c: every session's history, and the last session's memories and continuations.
function compareDemo(label, ui, demo) {
  const { sessions, last } = demo;
  check(ui.length === sessions.length + 1 && last, `${label}: as many sessions as tinyllm demo`, `${ui.length} vs ${sessions.length} + 1`);
  ui.slice(1).forEach((u, i) => check(sessions[i] && u.history === sessions[i].historyAfter,
    `${label}, session ${i + 2}: the history tinyllm demo had`, `${u.history} vs ${sessions[i] && sessions[i].historyAfter}`));
  const u = ui[ui.length - 1];
  if (!u || !last) return;
  const L = `${label}, the last session`;
  check(u.history === last.history && u.newText === last.newText, `${L}: history and text`);
  check(JSON.stringify(u.blocks.map((b) => [b.id, b.first, b.n, b.text])) === JSON.stringify(last.blocks.map((b) => [b.id, b.first, b.n, b.text])),
    `${L}: the same retrieved blocks, tokens and text`,
    `${JSON.stringify(u.blocks.map((b) => [b.id, b.first]))} vs ${JSON.stringify(last.blocks.map((b) => [b.id, b.first]))}`);
  check(JSON.stringify(u.chunks.map((c) => [c.first, c.n, c.text])) === JSON.stringify(last.chunks.map((c) => [c.first, c.n, c.text])),
    `${L}: the same text RAG chunks`);
  check((u.live ? u.live.text : null) === last.live, `${L}: the live context`, `${u.live && u.live.text} vs ${last.live}`);
  for (const kind of ['kvmem', 'rag', 'recent', 'full'])
    check(u[kind] && u[kind].text === last.cont[kind], `${L}: continued on ${kind}`, `${u[kind] && u[kind].text} vs ${last.cont[kind]}`);
  // the verdict: the page's line is tinyllm demo's, and the continuations it says name session 1's person are
  // the ones whose text holds the name as a word (looked for here)
  const name = /named ([A-Z][A-Za-z]*)/.exec((ui[0] && ui[0].newText) || '');
  check(u.verdict && u.verdict.text === last.verdict, `${L}: the verdict line`, `${u.verdict && u.verdict.text} vs ${last.verdict}`);
  if (name && u.verdict) {
    const says = ['kvmem', 'rag', 'recent', 'full'].filter((k) => u[k] && new RegExp(`(^|[^A-Za-z0-9])${name[1]}([^A-Za-z0-9]|$)`).test(u[k].text));
    check(JSON.stringify(u.verdict.named) === JSON.stringify(says), `${L}: the verdict names the continuations that say ${name[1]}`,
      `${u.verdict.named} vs ${says}`);
  }
}

const storyStatus = (page) => page.evaluate(() => document.getElementById('story-model').textContent);

// Served without a model, the story mode asks for the files (models.json answered 404).
async function noModelChecks(page, errors) {
  const n0 = errors.length;
  await page.route('**/models/models.json', (r) => r.fulfill({ status: 404, body: '' }));
  await page.goto(url + 'index.html#story'); // another URL than the page's, so a fresh load
  await page.waitForSelector('body[data-story="no-model"]', { timeout: 30000 });
  const st = await storyStatus(page);
  check(/No model is served/.test(st) && /Pick a model file/.test(st), 'without a served model the story mode asks for files', st);
  check(await page.evaluate(() => document.getElementById('story-run').disabled), 'without a model there is nothing to run');
  await page.unroute('**/models/models.json');
  // the browser logs the 404 it was given; anything else is an error
  const logged = errors.splice(n0);
  check(logged.every((e) => /404/.test(e)), 'no page errors without a served model', logged.join(' | '));
}

async function storyChecks(page, errors, model, tok) {
  const runs = () => page.evaluate(() => window.kvmemStoryRuns || 0);
  const act = async (fn) => {
    const before = await runs();
    await fn();
    await page.waitForFunction((b) => (window.kvmemStoryRuns || 0) > b, before, { timeout: 60000 });
  };
  const texts = () => page.evaluate(() => Array.from(document.querySelectorAll('#story-sessions textarea')).map((t) => t.value.trim()));
  const status = () => storyStatus(page);

  // no model served: the visitor picks the files from disk (the page is where noModelChecks left it)
  await page.setInputFiles('#story-model-file', model);
  await page.setInputFiles('#story-tok-file', tok);
  await act(() => page.click('#story-load-files'));
  check(/from disk/.test(await status()), 'the story mode loads a model picked from disk', await status());
  compareStory('story from files picked on disk', await shownStory(page), nativeStory(model, tok, await texts(), { art: true }));

  // the model the page is served with is the one compared against
  const served = JSON.parse(readFileSync(path.join(www, 'models', 'models.json'), 'utf8'));
  check(readFileSync(path.join(www, 'models', served.model)).equals(readFileSync(model)), 'the page serves the model under test');

  await page.goto(url);
  await page.waitForSelector('body[data-state="ready"]', { timeout: 30000 });
  await act(() => page.click('#tab-story'));
  check(/served with the page/.test(await status()), 'the story mode loads the served model', await status());
  const preset = await texts();
  const demo = demoStory(model, tok);
  check(preset.length === demo.sessions.length + 1 && preset[preset.length - 1] === demo.last.newText &&
    demo.sessions.every((d, i) => preset[i].startsWith(d.excerpt)), 'the page\'s default sessions are tinyllm demo\'s', JSON.stringify(preset));
  compareStory('story, ART at kvmem\'s default tile', await shownStory(page), nativeStory(model, tok, preset, { art: true }));
  if (args.screenshot) {
    const shot = args.screenshot.replace(/(\.\w+)$/, '-story$1');
    const jpeg = /\.jpe?g$/.test(shot);
    await page.screenshot({ path: shot, fullPage: true, ...(jpeg ? { quality: 45 } : {}) });
    console.log(`screenshot: ${shot}`);
  }

  await act(() => page.uncheck('#story-art'));
  compareDemo('story, exact attention vs tinyllm demo', await shownStory(page), demo);

  // at kvmem's default tile (16) this story reads every tile: 8 shows a stop point
  await act(() => page.selectOption('#story-art-tile', '8'));
  await act(() => page.check('#story-art'));
  const ui8 = await shownStory(page);
  const nat8 = nativeStory(model, tok, preset, { art: true, artTile: 8 });
  compareStory('story, ART tiles of 8', ui8, nat8);
  const v = nat8.reduce((a, n) => a + n.art.decode.tiles_visited, 0), t = nat8.reduce((a, n) => a + n.art.decode.tiles_total, 0);
  check(v < t, 'with tiles of 8 ART stops early somewhere in the story (the stop point is not trivial)', `${v} of ${t}`);

  // files picked from disk replace the served model; the settings stay
  await page.setInputFiles('#story-model-file', model);
  await page.setInputFiles('#story-tok-file', tok);
  await act(() => page.click('#story-load-files'));
  check(/from disk/.test(await status()), 'files picked on disk replace the served model', await status());
  compareStory('story from disk, ART tiles of 8', await shownStory(page), nat8);

  // and types the next session
  await page.fill('#story-next', 'The next day,');
  await act(() => page.click('#story-continue'));
  compareStory('story with a typed session after it', await shownStory(page), nativeStory(model, tok, [...preset, 'The next day,'], { art: true, artTile: 8 }));
  check(errors.length === 0, 'no page errors in the story mode', errors.join(' | '));
}

// stories15M (trained on 256 tokens) picked from disk: make demo's story runs
// about four windows past it. With exact attention, the page against
// tinyllm-story's JSON (every id, every session) and `tinyllm demo`'s printed
// story (another program: the histories, the last session's memories and its
// four continuations).
async function story15mChecks(page, errors, model, tok) {
  const act = async (fn, timeout = 60000) => {
    const before = await page.evaluate(() => window.kvmemStoryRuns || 0);
    await fn();
    await page.waitForFunction((b) => (window.kvmemStoryRuns || 0) > b, before, { timeout });
  };
  if (await page.isChecked('#story-art')) await act(() => page.uncheck('#story-art'));
  await act(() => page.selectOption('#story-preset', '1'));
  await act(() => page.selectOption('#story-preset', '0'));
  await page.setInputFiles('#story-model-file', model);
  await page.setInputFiles('#story-tok-file', tok);
  const t0 = Date.now();
  await act(() => page.click('#story-load-files'), 900000);
  const st = await storyStatus(page);
  check(/from disk/.test(st) && /vocab 32000, context 256/.test(st), 'the story mode loads stories15M picked from disk', st);
  const texts = await page.evaluate(() => Array.from(document.querySelectorAll('#story-sessions textarea')).map((t) => t.value.trim()));
  const ui = await shownStory(page);
  console.log(`stories15M: ${ui.length} sessions, ${ui.length ? ui[ui.length - 1].history : 0} tokens of history, ` +
    `in ${((Date.now() - t0) / 1000).toFixed(1)} s in the page`);
  compareStory('stories15M from disk, exact attention', ui, nativeStory(model, tok, texts, { art: false }));
  compareDemo('stories15M vs tinyllm demo', ui, demoStory(model, tok));
  check(errors.length === 0, 'no page errors with stories15M', errors.join(' | '));
}

const profile = mkdtempSync(path.join(tmpdir(), 'kvmem-chromium-'));
let context;
try {
  context = await chromium.launchPersistentContext(profile, {
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1100, height: 900 },
  });
  const page = context.pages()[0] || await context.newPage();
  if (args.bench) {
    await page.goto(url + 'bench.html');
    await page.waitForSelector('body[data-state]', { timeout: 300000 });
    const r = await page.evaluate(() => window.kvmemBench || null);
    check(r !== null, 'the benchmark ran');
    if (r) {
      writeFileSync(args.bench, JSON.stringify(r) + '\n');
      console.log(JSON.stringify(r));
    }
    throw new Done();
  }
  if (args['bench-story']) {
    const R = Number(args.repeat || 15);
    const runs = () => page.evaluate(() => window.kvmemStoryRuns || 0);
    await page.goto(url + '#story');
    await page.waitForFunction(() => window.kvmemStoryRuns > 0, null, { timeout: 120000 });
    const ms = [];
    for (let r = 0; r < R; r++) {
      const before = await runs();
      await page.click('#story-run');
      await page.waitForFunction((b) => (window.kvmemStoryRuns || 0) > b, before, { timeout: 120000 });
      ms.push(await page.evaluate(() => window.kvmemStory.map((x) => x.ms)));
    }
    const median = (x) => { const y = [...x].sort((a, b) => a - b), n = y.length; return n % 2 ? y[n >> 1] : (y[n / 2 - 1] + y[n / 2]) / 2; };
    const r = { suite: 'story-browser', repeat: R, session_ms: ms[0].map((_, i) => +median(ms.map((m) => m[i])).toFixed(3)),
      story_ms: +median(ms.map((m) => m.reduce((a, b) => a + b, 0))).toFixed(3),
      user_agent: await page.evaluate(() => navigator.userAgent) };
    check(ms.every((m) => m.length === ms[0].length && m.length > 0), 'every run showed every session');
    writeFileSync(args['bench-story'], JSON.stringify(r) + '\n');
    console.log(JSON.stringify(r));
    throw new Done();
  }
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  // errors, and the deprecation warnings of kvmem.js: the page uses no old name
  page.on('console', (m) => { if (m.type() === 'error' || (m.type() === 'warning' && /^kvmem: .* is deprecated/.test(m.text()))) errors.push(m.text()); });
  // every request must stay on the loopback server
  let fromDisk = false; // the last check opens the page from file://
  page.on('request', (r) => check(r.url().startsWith(url) || r.url().startsWith('data:') || (fromDisk && r.url().startsWith('file:')),
    'request stays on 127.0.0.1', r.url()));

  await page.goto(url);
  await page.waitForSelector('body[data-state="ready"]', { timeout: 30000 });
  let ui = await shown(page);
  check(/wasm128 kernels/.test(ui.meta), 'the page runs the SIMD128 kernels', ui.meta);
  compare('defaults (alice turn 7, softmax-max, k 8, bs 16)', ui,
    native({ agent: 'alice', turn: 7, mode: 'softmax-max', k: 8, bs: 16, tauS: 0.05, tauD: 0.005 }));

  // change the controls, as a person would
  const count = async () => page.evaluate(() => window.kvmemRenders || 0);
  const settle = async (before) => page.waitForFunction((b) => (window.kvmemRenders || 0) > b, before, { timeout: 30000 });
  const steps = [
    [['#mode', 'rr-sum']],
    [['#blocksize', '32'], ['#question', '5']],
    [['#topk', '5'], ['#mode', 'softmax-sum'], ['#tau', '0.1,0.01']],
  ];
  for (const step of steps) {
    for (const [sel, value] of step) {
      const before = await count();
      if (sel === '#topk') await page.fill(sel, value).then(() => page.dispatchEvent(sel, 'change'));
      else await page.selectOption(sel, value);
      await settle(before);
    }
  }
  ui = await shown(page);
  check(/bob, turn 9/.test(ui.question), 'the question control took effect', ui.question);
  compare('after changes (bob turn 9, softmax-sum, k 5, bs 32, tau 0.1/0.01)', ui,
    native({ agent: 'bob', turn: 9, mode: 'softmax-sum', k: 5, bs: 32, tauS: 0.1, tauD: 0.01 }));

  // RR-SUM at block size 8 on another question
  for (const [sel, value] of [['#mode', 'rr-sum'], ['#blocksize', '8'], ['#question', '1'], ['#topk', '8'], ['#tau', '0.05,0.005']]) {
    const before = await count();
    if (sel === '#topk') await page.fill(sel, value).then(() => page.dispatchEvent(sel, 'change'));
    else await page.selectOption(sel, value);
    await settle(before);
  }
  compare('rr-sum (alice turn 9, k 8, bs 8)', await shown(page),
    native({ agent: 'alice', turn: 9, mode: 'rr-sum', k: 8, bs: 8, tauS: 0.05, tauD: 0.005 }));

  // back to the defaults for the picture
  for (const [sel, value] of [['#question', '0'], ['#mode', 'softmax-max'], ['#blocksize', '16']]) {
    const before = await count();
    await page.selectOption(sel, value);
    await settle(before);
  }
  check(errors.length === 0, 'no page errors', errors.join(' | '));
  if (args.screenshot) {
    const jpeg = /\.jpe?g$/.test(args.screenshot); // docs/ keeps a small JPEG
    await page.screenshot({ path: args.screenshot, fullPage: true, ...(jpeg ? { quality: 45 } : {}) });
    console.log(`screenshot: ${args.screenshot}`);
  }

  const model = args.model && path.resolve(args.model), tok = args.tokenizer && path.resolve(args.tokenizer);
  const why = !model || !existsSync(model) ? `no model at ${args.model} (set KVMEM_TEST_MODEL)`
    : !tok || !existsSync(tok) ? `no tokenizer at ${args.tokenizer}`
      : !tinyllmDir || !existsSync(path.join(tinyllmDir, 'tinyllm-story')) ? `the native tinyllm-story is not built in ${tinyllmDir}`
        : !existsSync(path.join(www, 'models', 'models.json')) ? 'no model served in www/models (scripts/wasm-build.sh copies it)' : '';
  await noModelChecks(page, errors);
  if (why) console.log(`real-model browser checks skipped: ${why}`);
  else await storyChecks(page, errors, model, tok);
  const m15 = args.model15m && path.resolve(args.model15m), t15 = args.tokenizer15m && path.resolve(args.tokenizer15m);
  if (why) console.log('stories15M browser checks skipped: the story mode was not checked');
  else if (!m15 || !existsSync(m15) || !t15 || !existsSync(t15)) console.log(`stories15M browser checks skipped: ${args['skip15m'] || 'no --model15m and --tokenizer15m given'}`);
  else await story15mChecks(page, errors, m15, t15);

  // opened from disk the page cannot load its module: it must say how to serve it
  fromDisk = true;
  await page.goto(pathToFileURL(path.join(www, 'index.html')).href);
  await page.waitForSelector('body[data-state="not-served"]', { timeout: 15000 });
  const hint = await page.evaluate(() => document.getElementById('meta').textContent);
  check(/file:\/\//.test(hint) && /make demo-web/.test(hint) && /127\.0\.0\.1:8765/.test(hint),
    'opened from file:// the page says how to serve it', hint);
} catch (e) {
  if (!(e instanceof Done)) throw e;
} finally {
  if (context) await context.close();
  server.close();
  rmSync(profile, { recursive: true, force: true });
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
