// The demo page: controls in, the view from session.js out (synthetic
// mode), or the real-model story (story-view.js). Plain DOM.
import { load } from './kvmem.js';
import { computeView, questions } from './session.js';
import { initStoryMode } from './story-view.js';

const TOPIC_COLORS = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#b07aa1', '#76b7b2', '#edc948', '#9c755f', '#bab0ac'];
const SVG = 'http://www.w3.org/2000/svg';
const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, text = '') {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text) e.textContent = text;
  return e;
}

function svgEl(tag, attrs = {}) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

const fmtScore = (x) => (Number.isNaN(x) ? '–' : x.toFixed(4));

function drawStrip(container, scores, selected, view) {
  container.replaceChildren();
  const sel = new Set(selected);
  const finite = Array.from(scores).filter((x) => !Number.isNaN(x));
  const hi = Math.max(...finite), lo = Math.min(...finite);
  scores.forEach((s, b) => {
    const h = Number.isNaN(s) ? 0 : 12 + 88 * (hi > lo ? (s - lo) / (hi - lo) : 1);
    const bar = el('div', {
      class: 'bar' + (sel.has(b) ? ' selected' : '') + (view.blockTopic[b] === view.topic ? ' asked' : ''),
      'data-block': b, 'data-score': fmtScore(s),
      title: `block ${b} · ${view.blockTopic[b] !== undefined ? 'topic ' + view.blockTopic[b] : ''} · S(b) = ${fmtScore(s)}${sel.has(b) ? ' · selected' : ''}`,
    });
    bar.style.height = `${h}%`;
    container.append(bar);
  });
}

function drawTopics(container, view) {
  container.replaceChildren();
  view.blockTopic.forEach((t, b) => {
    const c = el('div', { class: 'cell' + (t === view.topic ? ' asked' : ''), title: `block ${b}: topic ${t}` });
    c.style.background = TOPIC_COLORS[t % TOPIC_COLORS.length];
    container.append(c);
  });
}

function drawArt(container, art) {
  const W = 900, H = 220, L = 56, R = 12, T = 12, B = 34;
  const n = art.order.length;
  const svg = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': 'ART output change per block' });
  const vals = [...art.scaleChange, ...art.directionChange, art.tauS, art.tauD].filter((v) => v !== null && v > 0);
  const lmin = Math.floor(Math.log10(Math.min(...vals))), lmax = Math.ceil(Math.log10(Math.max(...vals)));
  const x = (t) => L + ((t - 0.5) / n) * (W - L - R);
  const y = (v) => T + (1 - (Math.log10(Math.max(v, 10 ** lmin)) - lmin) / (lmax - lmin || 1)) * (H - T - B);
  for (let e = lmin; e <= lmax; e++) {
    svg.append(svgEl('line', { x1: L, x2: W - R, y1: y(10 ** e), y2: y(10 ** e), class: 'grid' }));
    const lab = svgEl('text', { x: L - 6, y: y(10 ** e) + 4, class: 'axis', 'text-anchor': 'end' });
    lab.textContent = `1e${e}`;
    svg.append(lab);
  }
  // the stop point: mean blocks read per KV-head stream
  const stop = art.tilesVisited / art.nStreams;
  if (stop < n) {
    svg.append(svgEl('rect', { x: x(stop + 0.5), y: T, width: W - R - x(stop + 0.5), height: H - T - B, class: 'skipped' }));
    svg.append(svgEl('line', { x1: x(stop + 0.5), x2: x(stop + 0.5), y1: T, y2: H - B, class: 'stop' }));
    // label on the side with room
    const right = x(stop + 0.5) < (L + W - R) / 2;
    const lab = svgEl('text', { x: x(stop + 0.5) + (right ? 6 : -6), y: T + 12, class: 'axis stoplabel',
      'text-anchor': right ? 'start' : 'end' });
    lab.textContent = right ? 'stop: the blocks to the right are never read' : 'stop: the blocks to the right are never read →';
    svg.append(lab);
  }
  svg.append(svgEl('line', { x1: L, x2: W - R, y1: y(art.tauS), y2: y(art.tauS), class: 'tau scale' }));
  svg.append(svgEl('line', { x1: L, x2: W - R, y1: y(art.tauD), y2: y(art.tauD), class: 'tau direction' }));
  for (const [series, cls] of [[art.scaleChange, 'scale'], [art.directionChange, 'direction']]) {
    let d = '';
    series.forEach((v, t) => { if (v !== null) d += `${d ? 'L' : 'M'}${x(t + 1).toFixed(1)},${y(v).toFixed(1)}`; });
    svg.append(svgEl('path', { d, class: `series ${cls}` }));
    series.forEach((v, t) => {
      if (v === null) return;
      const c = svgEl('circle', { cx: x(t + 1), cy: y(v), r: 2.6, class: `pt ${cls}`, 'data-tile': t + 1, 'data-value': v.toPrecision(3) });
      const tip = svgEl('title');
      tip.textContent = `${t + 1} blocks read (block ${art.order[t]}): ${cls} change ${v.toPrecision(3)}`;
      c.append(tip);
      svg.append(c);
    });
  }
  const xl = svgEl('text', { x: (L + W - R) / 2, y: H - 6, class: 'axis', 'text-anchor': 'middle' });
  xl.textContent = `blocks read, in retrieval-score order (1 … ${n})`;
  svg.append(xl);
  const legend = el('div', { class: 'legend' });
  legend.innerHTML = '<span class="key scale"></span>scale change <span class="key direction"></span>direction change ' +
    '<span class="key stop"></span>stop point';
  container.replaceChildren(svg, legend);
}

function render(view) {
  $('question-text').textContent =
    `— ${view.agent}, turn ${view.turn}, asks about “${view.topicName}” (${view.queryTokens} query tokens; ` +
    `history ${view.historyTokens} tokens in ${view.historyBlocks} blocks)`;
  drawStrip($('strip-aabb'), view.aabbScores, view.aabbSelected, view);
  drawStrip($('strip-exact'), view.exactScores, view.exactSelected, view);
  drawTopics($('strip-topic'), view);
  $('recall-k').textContent = view.topK;
  $('recall').textContent = view.recall.toFixed(4);
  $('recall-detail').textContent = `(${view.hits} of the ${view.exactSelected.length} EXACT blocks found by AABB)`;
  $('mem-tokens').textContent = view.memoryTokens;

  const exact = new Set(view.exactSelected);
  const tbody = $('selected').querySelector('tbody');
  tbody.replaceChildren();
  view.aabbSelected.forEach((b, i) => {
    const info = view.blocks[b], [p0, p1] = view.newPositions[i];
    const tr = el('tr', { 'data-block': b });
    const topic = view.blockTopic[b];
    const sw = el('span', { class: 'swatch' });
    sw.style.background = TOPIC_COLORS[topic % TOPIC_COLORS.length];
    const tdTopic = el('td');
    tdTopic.append(sw, document.createTextNode(` ${topic}`));
    tr.append(el('td', { class: 'num' }, String(b)), tdTopic,
      el('td', { class: 'num' }, `${info.firstToken}–${info.firstToken + info.nTokens - 1}`),
      el('td', { class: 'num newpos' }, `${p0}–${p1}`),
      el('td', { class: 'num score' }, fmtScore(view.aabbSelectedScores[i])),
      el('td', {}, exact.has(b) ? '✓' : '—'));
    tbody.append(tr);
  });

  const art = view.art;
  $('art-layer').textContent = art.layer;
  $('art-patience').textContent = art.patience;
  drawArt($('art-chart'), art);
  const perStream = art.tilesVisited / art.nStreams, total = art.tilesTotal / art.nStreams;
  $('art-summary').innerHTML = '';
  const s = $('art-summary');
  s.append(document.createTextNode('Read '), el('strong', { id: 'art-visited' }, perStream.toFixed(1)),
    document.createTextNode(` of ${total} blocks per KV-head stream (mean over ${art.nStreams} streams); `),
    el('strong', { id: 'art-stopped' }, String(art.streamsStopped)),
    document.createTextNode(` of ${art.nStreams} streams stopped early.`));
  $('view').hidden = false;
}

// Two modes, one module: the story mode loads its model when first shown.
function setupTabs(km) {
  let story = null;
  const tabs = { synthetic: $('tab-synthetic'), story: $('tab-story') };
  function show(mode) {
    for (const [m, tab] of Object.entries(tabs)) {
      tab.setAttribute('aria-selected', String(m === mode));
      $(`mode-${m}`).hidden = m !== mode;
    }
    if (mode === 'story' && !story) story = initStoryMode(km);
    if (location.hash !== (mode === 'story' ? '#story' : '')) history.replaceState(null, '', mode === 'story' ? '#story' : location.pathname);
  }
  if (!km.hasStory) {
    tabs.story.disabled = true;
    tabs.story.title = 'this build of the module has no tinyllm engine';
  }
  tabs.synthetic.addEventListener('click', () => show('synthetic'));
  tabs.story.addEventListener('click', () => show('story'));
  if (location.hash === '#story' && km.hasStory) show('story');
  window.addEventListener('hashchange', () => show(location.hash === '#story' && km.hasStory ? 'story' : 'synthetic'));
}

async function main() {
  let km;
  try {
    km = await load();
  } catch (e) {
    // the module's fetch failed (not served, or not built): say how to serve it
    if (window.kvmemServeHint) window.kvmemServeHint(`the WebAssembly module did not load: ${e.message}`);
    throw e;
  }
  const script = km.demoScript();
  const qs = questions(script);
  const qsel = $('question');
  qs.forEach((q, i) => qsel.append(el('option', { value: i }, `${q.agent} · turn ${q.turn} · asks about ${script.topics[q.topic]}`)));
  $('meta').textContent = `kvmem ${km.version()} · WebAssembly, ${km.kernels} kernels${km.hasStory ? ' · tinyllm engine' : ''} · ` +
    `synthetic model ${script.model.id} (${script.model.nLayers} layers, ${script.model.nQHeads}/${script.model.nKvHeads} heads, ` +
    `head_dim ${script.model.headDim}) · seed 42`;

  function update() {
    const q = qs[Number(qsel.value)];
    const [tauS, tauD] = $('tau').value.split(',').map(Number);
    const settings = { seed: 42, agent: q.agent, turn: q.turn, mode: $('mode').value,
      topK: Math.max(1, Math.min(32, Number($('topk').value) || 8)), blockSize: Number($('blocksize').value), tauS, tauD };
    const t0 = performance.now();
    try {
      const view = computeView(km, script, settings);
      render(view);
      $('timing').textContent = `memory rebuilt and analysed in ${(performance.now() - t0).toFixed(0)} ms`;
      window.kvmemView = view; // for the curious (and the console)
      window.kvmemRenders = (window.kvmemRenders || 0) + 1; // the browser test waits on this
      document.body.dataset.state = 'ready';
    } catch (e) {
      $('timing').textContent = `error: ${e.message}`;
      document.body.dataset.state = 'error';
      throw e;
    }
  }
  for (const id of ['question', 'mode', 'topk', 'blocksize', 'tau']) $(id).addEventListener('change', update);
  update();
  setupTabs(km);
}

main().catch((e) => {
  if (document.body.dataset.state === 'not-served') return;
  $('meta').textContent = `could not start: ${e.message}`;
  document.body.dataset.state = 'error';
});
