// The demo page in headless Chromium, checked against the native library:
// serve build/wasm/www on 127.0.0.1, load the page, change its controls,
// read the numbers it shows and compare them with
// `kvmem demo --json --agent A --turn N --mode M --k K --block-size BS --tau-s X --tau-d Y`
// for the same seed and settings. Saves a screenshot. Prints
// "N passed, N failed"; exits 1 on any failure.
//
//   node wasm/tests/browser_test.mjs --www build/wasm/www --kvmem build/default/tools/kvmem [--screenshot out.png]
//   node wasm/tests/browser_test.mjs --www build/wasm/www --bench out.json   (bench.html only; no checks)
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
const www = path.resolve(args.www);
const kvmem = args.kvmem ? path.resolve(args.kvmem) : null;

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
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  // every request must stay on the loopback server
  page.on('request', (r) => check(r.url().startsWith(url) || r.url().startsWith('data:'), 'request stays on 127.0.0.1', r.url()));

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
} catch (e) {
  if (!(e instanceof Done)) throw e;
} finally {
  if (context) await context.close();
  server.close();
  rmSync(profile, { recursive: true, force: true });
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
