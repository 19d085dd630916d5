'use strict';
// One load client: M agents, one loop each, appending, reading back and
// checking every answer against what the agent was given (lib.js: the content
// is a function of the agent and the token, so nothing needs remembering but
// how many tokens were acknowledged). What it was told is journaled, so a
// client killed with -9 and started again goes on where it was.
//
//   node client.js --base URL --client N --agents M --until EPOCH_MS --dir DIR [--seed S]
//   node client.js --verify --base URL --dir DIR      (the final check over every journal)
//
// Files in DIR: journal-cN.jsonl (per agent: acknowledged tokens n, of them
// saved s), events-cN.jsonl (errors, rollbacks, losses, mix-ups, each with its
// time), stats-cN-PID.json (requests, codes, latencies; rewritten every 2 s).
const fs = require('node:fs');
const path = require('node:path');
const { defaults, seedOf, checkAnswer, tokens, query, tensorBody, call, rng, sleep } = require('./lib');

const args = {};
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  if (a.startsWith('--')) args[a.slice(2)] = process.argv[i + 1]?.startsWith('--') || i + 1 >= process.argv.length ? true : process.argv[++i];
}
const base = args.base, dir = args.dir;
const client = Number(args.client ?? 0);
const rand = rng(Number(args.seed ?? 1) * 1000 + client * 7 + process.pid);
defaults.headers['x-client-id'] = args.verify ? 'verify' : `c${client}`;

const eventsFile = path.join(dir, `events-c${args.verify ? 'verify' : client}.jsonl`);
const event = (e) => fs.appendFileSync(eventsFile, JSON.stringify({ t: Date.now(), client, ...e }) + '\n');

// ---- the checks ------------------------------------------------------------

// the whole agent: n_tokens, and its sealed blocks cover [0, sealed) with the given ids
async function readAll(id, seed) {
  const info = await call(base, 'GET', `/agents/${id}`);
  if (info.err || (info.code !== 200 && info.code !== 404)) return { fail: info };
  if (info.code === 404) return { n: 0, bad: [] };
  const { n_tokens: n, n_sealed: ns } = info.body;
  if (!ns) return { n, bad: [] };
  const r = await call(base, 'POST', `/agents/${id}/retrieve`, { body: { query: query(rand), top_k: ns } });
  if (r.err || r.code !== 200) return { fail: r };
  const bad = checkAnswer(seed, r.body);
  const blocks = [...r.body.blocks].sort((a, b) => a.first_token - b.first_token);
  let end = 0;
  for (const b of blocks) {
    if (b.first_token !== end) { bad.push(`blocks leave tokens ${end}..${b.first_token} out`); break; }
    end += b.n_tokens;
  }
  if (end > n) bad.push(`sealed blocks hold ${end} tokens, the agent ${n}`);
  return { n, bad };
}

// ---- the journal -----------------------------------------------------------

function readJournals(files) {
  const st = new Map();
  for (const f of files) {
    if (!fs.existsSync(f)) continue;
    for (const line of fs.readFileSync(f, 'utf8').split('\n')) {
      if (!line) continue;
      try { const e = JSON.parse(line); st.set(e.a, e); } catch { /* a line cut by kill -9 */ }
    }
  }
  return st;
}

// ---- the verify pass -------------------------------------------------------

async function verify() {
  const journals = fs.readdirSync(dir).filter((f) => /^journal-c\d+\.jsonl$/.test(f)).map((f) => path.join(dir, f));
  const st = readJournals(journals);
  const list = await call(base, 'GET', '/agents');
  const listed = new Set(list.body?.agents ?? []);
  const out = { agents: st.size, short: 0, mixed: 0, unlisted: 0, failures: 0 };
  for (const [id, e] of st) {
    const r = await readAll(id, seedOf(id));
    if (r.fail) { out.failures++; event({ kind: 'verify-failure', agent: id, code: r.fail.code, err: r.fail.err, message: r.fail.body?.message }); continue; }
    if (r.bad.length) { out.mixed++; event({ kind: 'mixed', agent: id, where: 'verify', problems: r.bad.slice(0, 3) }); }
    // fewer tokens than acknowledged: lost unless a kill -9 of the service came after
    // the last acknowledgement and took only unsaved ones (the driver judges, from its faults)
    if (!e.deleting && r.n < e.n) { out.short++; event({ kind: 'verify-short', agent: id, acked: e.n, saved: e.s, found: r.n, last_ack: e.t ?? 0 }); }
    if (r.n > 0 && !listed.has(id)) { out.unlisted++; event({ kind: 'unlisted', agent: id }); }
  }
  process.stdout.write(JSON.stringify(out) + '\n');
}

// ---- the load loop ---------------------------------------------------------

const stats = { pid: process.pid, client, ops: {}, codes: {}, lat: {} };
const count = (op, code, ms) => {
  stats.ops[op] = (stats.ops[op] ?? 0) + 1;
  stats.codes[`${op} ${code}`] = (stats.codes[`${op} ${code}`] ?? 0) + 1;
  if (code === 200 && ms !== undefined) (stats.lat[op] ??= []).push(Math.round(ms * 100) / 100);
};
const flushStats = () => fs.writeFileSync(path.join(dir, `stats-c${client}-${process.pid}.json`), JSON.stringify(stats));

async function instance() {
  const r = await call(base, 'GET', '/healthz', { timeoutMs: 5000 });
  return r.code === 200 ? `${r.body.pid}:${r.body.started}` : null;
}

async function agentLoop(id, st, journal, until) {
  const seed = seedOf(id);
  const save = () => journal({ a: id, n: st.n, s: st.s, t: st.lastAck, ...(st.deleting ? { deleting: true } : {}) });
  const failed = async (op, r) => {
    // transport failures and 5xx: the driver tells those inside a fault window from the rest
    event({ kind: 'error', op, agent: id, code: r.code ?? null, err: r.err ?? null, message: r.body?.message?.slice(0, 200) });
    st.sync = true;
    await sleep(200);
  };
  while (Date.now() < until) {
    if (st.sync) {
      const inst = await instance();
      if (!inst) { await sleep(200); continue; }
      const r = await readAll(id, seed);
      if (r.fail) { await failed('resync', r.fail); continue; }
      if (r.bad.length) event({ kind: 'mixed', agent: id, where: 'resync', problems: r.bad.slice(0, 3) });
      if (!st.deleting) {
        if (r.n < st.s) event({ kind: 'lost', agent: id, where: 'resync', saved: st.s, found: r.n });
        if (r.n < st.n) event({ kind: 'rollback', agent: id, acked: st.n, saved: st.s, found: r.n, last_ack: st.lastAck, instance: inst, was: st.instance });
      }
      st.n = r.n;
      st.s = Math.min(st.s, r.n);
      st.deleting = false;
      st.instance = inst;
      st.sync = false;
      save();
    }
    const x = rand();
    if (st.n > 3000) {
      // start the agent over: DELETE races nothing of ours, but exercises removal from the store
      st.deleting = true;
      save();
      const sent = Date.now();
      const r = await call(base, 'DELETE', `/agents/${id}`);
      count('delete', r.code ?? r.err, r.ms);
      if (r.code !== 200) { await failed('delete', r); continue; }
      st.n = 0; st.s = 0; st.deleting = false; st.lastAck = sent;
      save();
    } else if (x < 0.6) {
      const T = 1 + Math.floor(rand() * 48);
      const durable = rand() < 0.25;
      const { k, v, ids } = tokens(seed, st.n, T);
      const fields = { flush: true, expect_tokens: st.n, ...(durable ? { save: true } : {}) };
      const binary = rand() < 0.5;
      const body = binary ? tensorBody(fields, { k, v, token_ids: ids })
        : { ...fields, k: Array.from(k), v: Array.from(v), token_ids: Array.from(ids) };
      const sent = Date.now();
      const r = await call(base, 'POST', `/agents/${id}/append`, { body, headers: binary ? { 'content-type': 'application/x-kvmem-tensors' } : {} });
      const op = durable ? 'append+save' : 'append';
      count(op, r.code ?? r.err, r.ms);
      if (r.code === 200) {
        if (r.body.n_tokens !== st.n + T) event({ kind: 'spurious', op, agent: id, message: `n_tokens ${r.body.n_tokens} after appending ${T} to ${st.n}` });
        st.n += T;
        if (durable) st.s = st.n;
        st.lastAck = sent;
        save();
      } else if (r.code === 409) {
        // the agent is not what this client was told last: a restart rolled it back, or an
        // append whose answer was lost did land; expected only if the service restarted since
        const inst = await instance();
        event({ kind: inst && inst !== st.instance ? 'conflict-after-restart' : 'spurious', op, agent: id, code: 409, message: r.body?.message });
        st.sync = true;
      } else await failed(op, r);
    } else if (x < 0.85) {
      const sealed = Math.ceil(st.n / 16);
      if (!sealed) continue;
      const gather = rand() < 0.5, binary = gather && rand() < 0.5;
      const r = await call(base, 'POST', `/agents/${id}/retrieve`, {
        body: { query: query(rand), top_k: Math.min(8, sealed), gather, base_position: 0 },
        headers: binary ? { accept: 'application/x-kvmem-tensors' } : {},
      });
      const op = gather ? (binary ? 'retrieve+gather(bin)' : 'retrieve+gather') : 'retrieve';
      count(op, r.code ?? r.err, r.ms);
      if (r.code === 200) {
        const bad = checkAnswer(seed, r.body);
        if (bad.length) event({ kind: 'mixed', agent: id, where: op, problems: bad.slice(0, 3) });
      } else await failed(op, r);
    } else if (x < 0.95) {
      const r = await call(base, 'GET', `/agents/${id}`);
      count('info', r.code ?? r.err, r.ms);
      if (r.code === 200 || (r.code === 404 && st.n === 0)) {
        const n = r.code === 404 ? 0 : r.body.n_tokens;
        if (n !== st.n) {
          const inst = await instance();
          event({ kind: inst && inst !== st.instance ? 'conflict-after-restart' : 'spurious', op: 'info', agent: id, message: `n_tokens ${n}, acknowledged ${st.n}` });
          st.sync = true;
        }
      } else await failed('info', r);
    } else {
      if (!st.n) continue;
      const sent = Date.now();
      const r = await call(base, 'POST', `/agents/${id}/save`);
      count('save', r.code ?? r.err, r.ms);
      if (r.code === 200) { st.s = Math.max(st.s, Math.min(st.n, r.body.n_tokens)); st.lastAck = sent; save(); } else await failed('save', r);
    }
  }
}

async function load() {
  const journalFile = path.join(dir, `journal-c${client}.jsonl`);
  const known = readJournals([journalFile]);
  const journal = (e) => fs.appendFileSync(journalFile, JSON.stringify(e) + '\n');
  const until = Number(args.until);
  const timer = setInterval(flushStats, 2000);
  process.on('SIGTERM', () => { flushStats(); process.exit(0); });
  const loops = [];
  for (let j = 0; j < Number(args.agents); j++) {
    const id = `lf-c${client}-a${j}`;
    const e = known.get(id);
    const st = { n: e?.n ?? 0, s: e?.s ?? 0, deleting: !!e?.deleting, lastAck: e?.t ?? 0, instance: null, sync: true };
    loops.push(agentLoop(id, st, journal, until));
  }
  await Promise.all(loops);
  clearInterval(timer);
  flushStats();
}

(args.verify ? verify() : load()).catch((e) => { console.error(e); process.exit(2); });
