// The computation behind the demo page, through the kvmem JavaScript API:
// replay the scripted session of `kvmem demo` (same generator, same seed) up
// to one question, retrieve for it (AABB and EXACT), gather the selection at
// new positions, and trace ART over the memory in retrieval-score order.
// `kvmem demo --json --agent ID --turn N ...` (tools/demo_view.c) computes
// the same numbers natively; the browser test compares the two.

export const MODES = {
  'softmax-max': { norm: 'softmax', agg: 'max' },
  'softmax-sum': { norm: 'softmax', agg: 'sum' },
  'rr-max': { norm: 'rr', agg: 'max' },
  'rr-sum': { norm: 'rr', agg: 'sum' },
};

export const ART_LAYER = 0;

/** The questions of the script: [{ agent, turn, topic, tokens }]. */
export function questions(script) {
  const out = [];
  for (const a of script.agents)
    a.steps.forEach((s, i) => { if (s.ask) out.push({ agent: a.id, turn: i + 1, topic: s.topic, tokens: s.tokens }); });
  return out;
}

// One turn appended as the engine would: rotated agents hand post-RoPE keys
// with their positions (kvmem de-rotates them); every turn ends in a flush.
function addTurn(km, pool, agent, syn, rng, topic, T, rotated, at) {
  const s = pool.spec, HD = s.nKvHeads * s.headDim;
  const { k, v } = syn.tokens(topic, T, rng);
  let positions = null;
  if (rotated) {
    const rowPos = new Int32Array(T * s.nKvHeads);
    for (let i = 0; i < rowPos.length; i++) rowPos[i] = at + Math.floor(i / s.nKvHeads);
    for (let l = 0; l < s.nLayers; l++) km.ropeApply(s, k.subarray(l * T * HD, (l + 1) * T * HD), rowPos); // in place
    positions = new Int32Array(T);
    for (let i = 0; i < T; i++) positions[i] = at + i;
  }
  agent.append(k, v, { positions });
  agent.flush();
}

// ART's importance order: blocks by AABB score, highest first; blocks
// without a score first; ties toward the older block (tools/demo_view.c).
function importanceOrder(scores) {
  const ids = Array.from(scores, (_, i) => i);
  return ids.sort((a, b) => {
    const x = scores[a], y = scores[b], xn = Number.isNaN(x), yn = Number.isNaN(y);
    if (xn !== yn) return xn ? -1 : 1;
    if (!xn && x !== y) return x > y ? -1 : 1;
    return a - b;
  });
}

/** Everything the page shows for one question and one set of settings. */
export function computeView(km, script, { seed = 42, agent: agentId, turn, mode = 'softmax-max', topK = 8, blockSize = 16,
  tauS, tauD }) {
  const { norm, agg } = MODES[mode];
  const ctx = new km.Context({ nThreads: 1 });
  const rng = km.rngCreate(BigInt(seed) ^ 0x5eedn);
  try {
    const m = script.model;
    const pool = ctx.poolCreate({ nLayers: m.nLayers, nQHeads: m.nQHeads, nKvHeads: m.nKvHeads, headDim: m.headDim,
      ropeTheta: m.ropeTheta, modelId: m.id }, { blockSize });
    const syn = pool.synthCreate(script.topics.length, seed);
    for (const a of script.agents) {
      const ag = pool.agentOpen(a.id);
      const blockTopic = [];
      let at = 0;
      for (let i = 0; i < a.steps.length; i++) {
        const step = a.steps[i];
        let T = step.tokens;
        if (step.ask) {
          const q = syn.query(step.topic, step.tokens, rng);
          if (a.id === agentId && i + 1 === turn) {
            const t0 = performance.now();
            const view = question(km, ag, pool, q, step, { agg, norm, topK, tauS, tauD });
            view.art.patience = km.attendDefaultParams().patience;
            view.ms = performance.now() - t0;
            Object.assign(view, { seed, agent: a.id, turn, topic: step.topic, topicName: script.topics[step.topic],
              queryTokens: step.tokens, mode, topK, blockSize, blockTopic });
            return view;
          }
          T += script.answerTokens;
        }
        const before = ag.getInfo().nSealed;
        addTurn(km, pool, ag, syn, rng, step.topic, T, a.rotated, at);
        at += T;
        const after = ag.getInfo().nSealed;
        for (let b = before; b < after; b++) blockTopic[b] = step.topic;
      }
      ag.close();
    }
    throw new Error(`agent ${agentId} asks no question at turn ${turn}`);
  } finally {
    rng.close();
    ctx.close(); // frees the pool, its agents and the generator
  }
}

function question(km, ag, pool, q, step, { agg, norm, topK, tauS, tauD }) {
  const s = pool.spec, nq = step.tokens;
  const info = ag.getInfo();
  const params = { topK, norm, agg, alwaysInclude: [0] };
  const aabb = ag.retrieve(q, { ...params, mode: 'aabb' }).sets[0]; // nq query rows
  const exact = ag.retrieve(q, { ...params, mode: 'exact' }).sets[0];
  const exactSet = new Set(exact.blocks);
  const hits = Array.from(aabb.blocks).filter((b) => exactSet.has(b)).length;
  const blocks = [];
  for (let b = 0; b < info.nSealed; b++) blocks.push(ag.blockInfo(b));
  // re-position the selection at 0..M-1, as an engine would load it
  const gathered = ag.gather(aabb.blocks, 0);
  const newPositions = [];
  let at = 0;
  for (const b of aabb.blocks) {
    newPositions.push([at, at + blocks[b].nTokens - 1]);
    at += blocks[b].nTokens;
  }

  // ART: the question's last query row of layer ART_LAYER at its position
  // after the history, over the agent's blocks in retrieval-score order.
  const NQD = s.nQHeads * s.headDim, P = info.nTokens + nq - 1;
  const row = q.subarray(((nq - 1) * s.nLayers + ART_LAYER) * NQD, ((nq - 1) * s.nLayers + ART_LAYER + 1) * NQD);
  const qrot = Float32Array.from(row);
  km.ropeApply(s, qrot, new Int32Array(s.nQHeads).fill(P));
  const order = importanceOrder(aabb.blockScores);
  const run = km.attend(pool.context, qrot, { agent: ag, layer: ART_LAYER, order: 'importance', tileOrder: order, tauS, tauD });
  const scaleChange = [null], directionChange = [null];
  let prev = null;
  for (let t = 1; t <= order.length; t++) {
    const o = km.attend(pool.context, qrot, { agent: ag, layer: ART_LAYER, order: 'index', tileOrder: order.slice(0, t), tauS: 0, tauD: 0 }).out;
    if (prev) {
      let on = 0, pn = 0, dot = 0;
      for (let i = 0; i < o.length; i++) { on += o[i] * o[i]; pn += prev[i] * prev[i]; dot += o[i] * prev[i]; }
      on = Math.sqrt(on); pn = Math.sqrt(pn);
      scaleChange.push(pn > 0 ? Math.abs(on - pn) / pn : 0);
      directionChange.push(on > 0 && pn > 0 ? 1 - dot / (on * pn) : 0);
    }
    prev = o;
  }
  return {
    historyTokens: info.nTokens, historyBlocks: info.nSealed, blocks,
    aabbScores: aabb.blockScores, exactScores: exact.blockScores,
    aabbSelected: Array.from(aabb.blocks), exactSelected: Array.from(exact.blocks), aabbSelectedScores: Array.from(aabb.scores),
    hits, recall: exact.blocks.length ? hits / exact.blocks.length : 1, memoryTokens: gathered.shape[1], newPositions,
    art: { layer: ART_LAYER, position: P, tauS, tauD, order, scaleChange, directionChange, ...run.stats },
  };
}
