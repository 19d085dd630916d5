// The real-model mode of the demo page: the model (served, or picked from
// disk), the story's sessions, and per session what kvmem did. Plain DOM.
import { PRESETS, introducedName, recallVerdict, runSessions, servedModel } from './story.js';

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

// Line breaks shown as spaces, as `tinyllm demo` prints them.
const quoted = (text, cls = 'text') => el('q', { class: cls }, text.replace(/\n/g, ' '));
const plural = (n, one, many = one + 's') => `${n} ${n === 1 ? one : many}`;

function memoryView(r) {
  const m = r.memory;
  const box = el('div', { class: 'memory', 'data-rows': m.rows });
  box.append(el('p', {}, `kvmem memory: ${m.rows} of ${r.history} history tokens — ` +
    `${plural(m.blocks.length, 'retrieved block')} (${plural(m.retrievedRows, 'token')}, placed ${r.split.order === 'chrono'
      ? 'in the history\'s order' : r.split.order === 'score' ? 'the best nearest the text' : 'in runs of adjacent blocks, the best run nearest the text'}, ` +
    `re-encoded before the live context) and the live context (${plural(m.localRows, 'token')}):`));
  const ul = el('ul', { class: 'blocks' });
  for (const b of m.blocks)
    ul.append(el('li', { class: 'block', 'data-block': b.id, 'data-first': b.first, 'data-n': b.n, 'data-ids': b.ids.join(' ') },
      el('span', { class: 'label' }, `retrieved block ${b.id} · tokens ${b.first}–${b.first + b.n - 1}`), ' ', quoted(b.text)));
  if (!m.blocks.length) ul.append(el('li', { class: 'none' }, 'no block retrieved (the history fits the live context)'));
  box.append(ul);
  box.append(el('p', { class: 'live', 'data-first': m.live.first, 'data-n': m.live.n, 'data-ids': m.live.ids.join(' ') },
    el('span', { class: 'label' }, `live context · tokens ${m.live.first}–${m.live.first + m.live.n - 1}`), ' ',
    quoted(m.live.text)));
  if (r.rag) {
    box.append(el('p', {}, `text RAG: ${plural(r.rag.chunks.length, 'chunk')} of the history's text (16 tokens each), ` +
      'ranked by BM25 against the new text, prefilled again after BOS and before the live context\'s text:'));
    const cl = el('ul', { class: 'chunks' });
    for (const c of r.rag.chunks)
      cl.append(el('li', { class: 'chunk', 'data-first': c.first, 'data-n': c.n, 'data-ids': c.ids.join(' ') },
        el('span', { class: 'label' }, `chunk · tokens ${c.first}–${c.first + c.n - 1}`), ' ', quoted(c.text)));
    if (!r.rag.chunks.length) cl.append(el('li', { class: 'none' }, 'no chunk shares a word with the new text'));
    box.append(cl);
  }
  return box;
}

// Where ART stopped while decoding: tiles read of the tiles there were, summed
// over the decode steps, layers and KV heads (kvmem_attend's stats).
function artView(r, model, patience) {
  const a = r.art;
  if (!a) return el('p', { class: 'art off' }, 'ART off: the engine\'s exact attention read every position.');
  const d = a.decode, steps = r.kvmem.ids.length;
  const streams = Math.max(1, steps * model.nLayers * model.nKvHeads);
  const pct = d.tilesTotal ? (100 * d.tilesVisited) / d.tilesTotal : 100;
  const box = el('div', { class: 'art', 'data-visited': d.tilesVisited, 'data-total': d.tilesTotal,
    'data-positions': d.positionsRead, 'data-tile': a.tileSize });
  const bar = el('div', { class: 'art-bar', title: `${d.tilesVisited} of ${d.tilesTotal} tiles read` });
  const fill = el('div', { class: 'art-fill' });
  fill.style.width = `${pct.toFixed(1)}%`;
  bar.append(fill);
  const skipped = d.tilesTotal - d.tilesVisited;
  box.append(el('p', {}, el('span', { class: 'label' }, 'ART stop point'), ' decoding ',
    plural(steps, 'token'), ' (tiles of ', a.tileSize, ' positions): read ',
    el('strong', { class: 'art-visited' }, d.tilesVisited), ' of ', el('strong', { class: 'art-total' }, d.tilesTotal),
    ` tiles (${pct.toFixed(1)}%), ${(d.tilesVisited / streams).toFixed(2)} of ${(d.tilesTotal / streams).toFixed(2)} per step and KV-head stream; `,
    skipped ? `${plural(skipped, 'tile')} never read.`
      : d.tilesTotal / streams <= patience + 1
        ? `every tile read: too few tiles per stream for the stop rule, which waits for ${patience} stable tiles in a row (try a smaller tile).`
        : 'every tile read: no stream\'s output settled before its last tile.'), bar);
  box.append(el('p', { class: 'note' }, `prefill of the new text: ${a.prefill.tilesVisited} of ${a.prefill.tilesTotal} tiles read`));
  return box;
}

function continuationRow(kind, label, c, tokens, note = '') {
  return el('tr', { 'data-kind': kind, 'data-ids': c.ids.join(' ') }, el('th', {}, label),
    el('td', { class: 'tokens' }, tokens), el('td', {}, quoted(c.text, 'text continuation'), note ? el('span', { class: 'note' }, ` ${note}`) : ''));
}

// name: who the story's first session named (null: nobody), looked for in the continuations.
function sessionView(r, model, patience, name) {
  const card = el('article', { class: 'session', 'data-session': r.session, 'data-history': r.history,
    'data-budget': r.budget });
  const windows = (r.history / model.seqLen).toFixed(1);
  card.append(el('h3', {}, `Session ${r.session} `,
    el('span', { class: 'note' }, `history ${r.history} tokens (${windows} windows of ${model.seqLen}) · memory ${r.split.memory} + live ` +
      `${r.split.live} · ${r.ms.toFixed(1)} ms in this page`)));
  card.append(el('p', { class: 'newtext' }, el('span', { class: 'label' }, 'new text'), ' ', quoted(r.text)));
  if (r.memory) card.append(memoryView(r));
  card.append(artView(r, model, patience));
  const t = el('table', { class: 'continuations' });
  const np = r.tokens.prefilled;
  if (r.full) {
    t.append(continuationRow('kvmem', 'kvmem\'s memory', r.kvmem, `${np + r.tokens.probed} tokens run: the text${r.tokens.probed ? ' + its probe' : ''}`));
    t.append(continuationRow('rag', 'text RAG', r.rag, `${r.tokens.ragPrefilled} tokens run: BOS, chunks, live context, text`));
    t.append(continuationRow('recent', `the recent ${r.recent.window} tokens`, r.recent, `${np} tokens run: the text (the window's KV kept)`));
    t.append(continuationRow('full', 'the whole history', r.full, `${np} tokens run: the text (its KV kept)`,
      r.full.pastWindow ? `(${r.history} tokens at their own positions: past the model's window of ${model.seqLen})` : ''));
  } else {
    t.append(continuationRow('kvmem', 'continued', r.kvmem, `${np} tokens run: the text`));
  }
  card.append(t);
  if (r.full && name && r.session > 1) {
    const v = recallVerdict(r, name, model.seqLen);
    card.append(el('p', { class: 'verdict', 'data-named': Object.keys(v.named).filter((k) => v.named[k]).join(' ') }, v.line));
  }
  card.append(el('p', { class: 'note tokens' }, `a text agent re-reading the whole history would run ${r.tokens.reread} tokens`));
  return card;
}

function errorView(i, e) {
  return el('article', { class: 'session error', 'data-error': i + 1 }, el('h3', {}, `Session ${i + 1}`),
    el('p', {}, e.message));
}

export function initStoryMode(km) {
  let story = null, inSync = false, busy = false;
  const results = $('story-results'), list = $('story-sessions');

  PRESETS.forEach((p, i) => $('story-preset').append(el('option', { value: i }, p.name)));
  const { patience } = km.attendDefaultParams();
  // ART's tile size: 0 is kvmem_attend's own default (tile_size 0 in its params)
  for (const [v, label] of [[0, "kvmem's default"], [64, '64'], [32, '32'], [16, '16'], [8, '8']])
    $('story-art-tile').append(el('option', { value: v }, label));

  function addSession(text) {
    const ta = el('textarea', { rows: 2, class: 'story-text' });
    ta.value = text;
    ta.addEventListener('input', () => { inSync = false; });
    const rm = el('button', { type: 'button', class: 'remove', title: 'remove this session' }, '×');
    rm.addEventListener('click', () => { li.remove(); inSync = false; });
    const li = el('li', {}, el('div', {}, ta, rm));
    list.append(li);
  }
  function setSessions(texts) {
    list.replaceChildren();
    texts.forEach(addSession);
    inSync = false;
  }
  const texts = () => Array.from(list.querySelectorAll('textarea')).map((t) => t.value.trim()).filter((t) => t);
  const options = () => ({ art: $('story-art').checked, artTile: Number($('story-art-tile').value) });

  function status(parts, cls = '') {
    const s = $('story-model');
    s.className = 'model-status ' + cls;
    s.replaceChildren(...parts.map((p) => (p instanceof Node ? p : document.createTextNode(p))));
  }
  function describe(name, tokName) {
    const m = story.model;
    status([el('strong', {}, name), ` · ${m.format}, dim ${m.dim}, ${m.nLayers} layers, ${m.nHeads}/${m.nKvHeads} heads, ` +
      `vocab ${m.vocab}, context ${m.seqLen} · ${tokName ? 'tokenizer ' + tokName : 'its own vocabulary'} · ` +
      `kvmem agent: f16, blocks of ${m.blockSize}`]);
  }
  function open(model, tokenizer, name, tokName) {
    const s = km.storyOpen(model, tokenizer);
    if (story) story.close();
    story = s;
    inSync = false;
    describe(name, tokName);
    $('story-run').disabled = false;
    $('story-continue').disabled = false;
  }

  // One session at a time, yielding between them so the page paints as it goes.
  async function run(textsToRun, fresh) {
    if (!story || busy) return;
    busy = true;
    document.body.dataset.story = 'running';
    const opts = options();
    try {
      if (fresh) {
        story.reset();
        results.replaceChildren();
        window.kvmemStory = []; // the sessions' results, for the curious (and the console)
      }
      for (const text of textsToRun) {
        await new Promise((r) => setTimeout(r, 0));
        try {
          const [r] = runSessions(story, [text], opts);
          const first = window.kvmemStory.length ? window.kvmemStory[0].text : r.text;
          results.append(sessionView(r, story.model, patience, introducedName(first)));
          window.kvmemStory.push(r);
        } catch (e) {
          results.append(errorView(window.kvmemStory.length, e));
          break;
        }
      }
      inSync = true;
    } finally {
      busy = false;
      window.kvmemStoryRuns = (window.kvmemStoryRuns || 0) + 1; // the browser test waits on this
      document.body.dataset.story = 'ready';
    }
  }
  const runAll = () => run(texts(), true);

  $('story-run').addEventListener('click', runAll);
  $('story-continue').addEventListener('click', async () => {
    const text = $('story-next').value.trim();
    if (!text) return;
    addSession(text);
    $('story-next').value = '';
    if (inSync) {
      await run([text], false);
    } else {
      await runAll();
    }
  });
  $('story-preset').addEventListener('change', () => {
    setSessions(PRESETS[Number($('story-preset').value)].sessions);
    runAll();
  });
  for (const id of ['story-art', 'story-art-tile']) $(id).addEventListener('change', runAll);
  $('story-load-files').addEventListener('click', async () => {
    const mf = $('story-model-file').files[0], tf = $('story-tok-file').files[0];
    if (!mf) {
      status(['pick a model file first (stories15M.bin), and its tokenizer (tokenizer.bin)'], 'error');
      return;
    }
    try {
      const [m, t] = await Promise.all([mf.arrayBuffer(), tf ? tf.arrayBuffer() : null]);
      open(m, t, `${mf.name} (from disk)`, tf ? tf.name : null);
      await runAll();
    } catch (e) {
      status([`could not load ${mf.name}${tf ? ' with ' + tf.name : ''}: ${e.message}`], 'error');
      document.body.dataset.story = 'error';
    }
  });

  setSessions(PRESETS[0].sessions);
  status(['looking for a model served with the page…']);
  return (async () => {
    try {
      const served = await servedModel();
      if (served) {
        open(served.model, served.tokenizer, `${served.name} (served with the page)`, served.tokenizerFile);
        await runAll();
        return;
      }
      status(['No model is served with this page (scripts/wasm-build.sh copies $KVMEM_TEST_MODEL, or ' +
        '../shared/models/stories260K.bin and tok512.bin, when it finds them). Pick a model file and its tokenizer ' +
        'above: stories15M.bin and tokenizer.bin, which make demo fetches into ~/.cache/kvmem/stories15M.']);
    } catch (e) {
      status([`the served model did not load: ${e.message}. Pick a model file and its tokenizer above.`], 'error');
    }
    document.body.dataset.story = 'no-model';
  })();
}
