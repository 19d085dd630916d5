'use strict';
// The two clients of the flood run (flood.js):
//   --mode light: one request at a time on its own 4 agents (append 16 tokens,
//     then retrieve 4 blocks with their KV as JSON), every answer checked;
//     each request's time goes to DIR/light.jsonl
//   --mode flood: 32 connections sending the largest bodies the service
//     takes (binary appends 60%, JSON appends 20%, to 256 agents) and asking
//     for the largest answers (gathers, 20%), as fast as they are answered;
//     codes and times go to DIR/flood-PID.json
//   node flood-client.js --mode light|flood --base URL --until EPOCH_MS --dir DIR --max-body BYTES --max-response BYTES
const fs = require('node:fs');
const path = require('node:path');
const { defaults, PER, seedOf, checkAnswer, tokens, query, tensorBody, call, rng } = require('./lib');

const args = {};
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  if (a.startsWith('--')) args[a.slice(2)] = process.argv[++i];
}
const base = args.base, until = Number(args.until), dir = args.dir;
const rand = rng(process.pid);
defaults.headers['x-client-id'] = args.mode;

async function light() {
  const file = path.join(dir, 'light.jsonl');
  const ids = [0, 1, 2, 3].map((i) => `light-${i}`);
  const n = new Map(ids.map((id) => [id, 0]));
  const rec = (op, r) => fs.appendFileSync(file, JSON.stringify({ t: Date.now(), op, ms: Math.round(r.ms * 100) / 100, code: r.code ?? r.err }) + '\n');
  for (let i = 0; Date.now() < until; i++) {
    const id = ids[i % ids.length], seed = seedOf(id);
    if (n.get(id) >= 2000) { rec('delete', await call(base, 'DELETE', `/agents/${id}`)); n.set(id, 0); }
    const { k, v, ids: tids } = tokens(seed, n.get(id), 16);
    const a = await call(base, 'POST', `/agents/${id}/append`, { body: { k: Array.from(k), v: Array.from(v), token_ids: Array.from(tids), flush: true } });
    rec('append', a);
    if (a.code === 200) n.set(id, a.body.n_tokens);
    const r = await call(base, 'POST', `/agents/${id}/retrieve`, { body: { query: query(rand), top_k: 4, gather: true } });
    rec('retrieve+gather', r);
    if (r.code === 200) {
      const bad = checkAnswer(seed, r.body);
      if (bad.length) fs.appendFileSync(file, JSON.stringify({ t: Date.now(), op: 'mixed', agent: id, problems: bad.slice(0, 3) }) + '\n');
    }
  }
}

async function flood() {
  const maxBody = Number(args['max-body']), maxResp = Number(args['max-response']);
  // the largest bodies the service takes: random float32 values (the costliest JSON)
  const jsonBody = (() => {
    let T = Math.floor(maxBody / (PER * 2 * 20));
    for (;;) {
      const k = Array.from({ length: PER * T }, () => Math.fround(rand() * 2 - 1));
      const b = Buffer.from(JSON.stringify({ k, v: k, flush: true }));
      if (b.length <= maxBody) return { b, T };
      T = Math.floor(T * 0.9);
    }
  })();
  const binT = Math.floor((maxBody - 4096) / (PER * 4 * 2));
  const kb = Float32Array.from({ length: PER * binT }, () => Math.fround(rand() * 2 - 1));
  const binBody = tensorBody({ flush: true }, { k: kb, v: kb });
  // gathers just under the answer limit: as JSON (24 bytes a float counted) and binary (4)
  const blocksFor = (bytesPerFloat) => Math.max(1, Math.floor(maxResp / (16 * PER * 2 * bytesPerFloat * 1.1)));
  const st = { pid: process.pid, codes: {}, lat: [], bytes_sent: 0 };
  const rec = (op, r) => {
    st.codes[`${op} ${r.code ?? r.err}`] = (st.codes[`${op} ${r.code ?? r.err}`] ?? 0) + 1;
    if (r.code === 200) st.lat.push(Math.round(r.ms));
  };
  const save = () => fs.writeFileSync(path.join(dir, `flood-${process.pid}.json`), JSON.stringify({ ...st, json_tokens: jsonBody.T, bin_tokens: binT }));
  const timer = setInterval(save, 1000);
  process.on('SIGTERM', () => { save(); process.exit(0); });
  let a = 0;
  await Promise.all(Array.from({ length: 32 }, async () => {
    while (Date.now() < until) {
      // binary appends fill the pool fastest; JSON ones cost the service the most per byte
      const id = `flood-${a++ % 256}`, x = rand();
      if (x < 0.2) {
        st.bytes_sent += jsonBody.b.length;
        rec('append-json', await call(base, 'POST', `/agents/${id}/append`, { body: jsonBody.b, raw: true }));
      } else if (x < 0.8) {
        st.bytes_sent += binBody.length;
        rec('append-bin', await call(base, 'POST', `/agents/${id}/append`, { body: binBody, raw: true, headers: { 'content-type': 'application/x-kvmem-tensors' } }));
      } else {
        const binary = rand() < 0.5;
        rec(binary ? 'gather-bin' : 'gather-json', await call(base, 'POST', `/agents/${id}/retrieve`, {
          body: { query: query(rand), top_k: blocksFor(binary ? 4 : 24), gather: true }, raw: true,
          headers: binary ? { accept: 'application/x-kvmem-tensors' } : {},
        }));
      }
    }
  }));
  clearInterval(timer);
  save();
}

(args.mode === 'light' ? light() : flood()).catch((e) => { console.error(e); process.exit(2); });
