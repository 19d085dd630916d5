'use strict';
// What the load-and-fault processes share: the model dims, the content every
// agent is given (a function of the agent and the token's index, so any
// process can check any read without a copy of what was sent), the binary
// tensor body, an HTTP call with a timeout, percentiles.
const http = require('node:http');
const path = require('node:path');
const { tensorChunks } = require(path.join(__dirname, '..', '..', 'examples', 'node', 'memory-service', 'lib', 'codec'));

const SPEC = { L: 2, HQ: 4, HKV: 2, D: 64 };
const PER = SPEC.L * SPEC.HKV * SPEC.D;

// agent's numeric seed from its id
function seedOf(id) {
  let h = 2166136261;
  for (const c of id) h = Math.imul(h ^ c.charCodeAt(0), 16777619) >>> 0;
  return h % 1000003;
}
// the token id of token t of the agent: unique per (agent, t) in practice
const tokenId = (seed, t) => (seed * 7919 + t * 104729) % 2147483647;
// V: small integers, exact in f16 storage; K: multiples of 1/16, exact too
const vAt = (seed, t, l, h, d) => ((seed * 37 + t * 11 + l * 5 + h * 3 + d) % 509) - 254;
const kAt = (seed, t, l, h, d) => (((seed * 13 + t * 7 + l + h * 17 + d * 3) % 97) - 48) / 16;

// K, V [L][T][HKV][D] and token ids of tokens [first, first + n)
function tokens(seed, first, n) {
  const k = new Float32Array(SPEC.L * n * SPEC.HKV * SPEC.D), v = new Float32Array(k.length);
  for (let l = 0; l < SPEC.L; l++) for (let t = 0; t < n; t++) for (let h = 0; h < SPEC.HKV; h++) for (let d = 0; d < SPEC.D; d++) {
    const i = ((l * n + t) * SPEC.HKV + h) * SPEC.D + d;
    k[i] = kAt(seed, first + t, l, h, d);
    v[i] = vAt(seed, first + t, l, h, d);
  }
  const ids = Int32Array.from({ length: n }, (_, i) => tokenId(seed, first + i));
  return { k, v, ids };
}

// every returned block's token ids, and the gathered V, against the agent's
// content; returns the problems found (empty: all as given)
function checkAnswer(seed, body) {
  const bad = [];
  const blocks = body.blocks ?? [];
  for (const b of blocks) {
    for (let i = 0; i < b.n_tokens; i++) {
      if (b.token_ids[i] !== tokenId(seed, b.first_token + i)) {
        bad.push(`block ${b.block} token ${b.first_token + i}: id ${b.token_ids[i]}, given ${tokenId(seed, b.first_token + i)}`);
        break;
      }
    }
  }
  const g = body.gathered;
  if (g) {
    const m = blocks.reduce((a, b) => a + b.n_tokens, 0);
    if (g.shape[1] !== m) bad.push(`gathered ${g.shape[1]} tokens, the blocks hold ${m}`);
    else {
      let off = 0;
      outer: for (const b of blocks) {
        for (let j = 0; j < b.n_tokens; j++) {
          for (let l = 0; l < SPEC.L; l++) for (let h = 0; h < SPEC.HKV; h++) for (let d = 0; d < SPEC.D; d += 7) {
            const got = g.v[((l * m + off + j) * SPEC.HKV + h) * SPEC.D + d], want = vAt(seed, b.first_token + j, l, h, d);
            if (got !== want) { bad.push(`V of token ${b.first_token + j} [${l},${h},${d}]: ${got}, given ${want}`); break outer; }
          }
        }
        off += b.n_tokens;
      }
    }
  }
  return bad;
}

function query(rand) {
  return Array.from({ length: SPEC.L * SPEC.HQ * SPEC.D }, () => Math.round((rand() * 2 - 1) * 16) / 16);
}

// the binary tensor body (docs/reliability.md): the Node service's own encoder
function tensorBody(fields, tensors) {
  return Buffer.concat(tensorChunks({ ...fields, ...tensors }));
}

function readTensorBody(buf) {
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.toString('utf8', 8, 8 + n));
  const data = buf.subarray(8 + n);
  const g = header.gathered;
  if (g) for (const name of ['k', 'v']) {
    const o = g[name].data_offsets;
    const b = Buffer.from(data.subarray(o[0], o[1]));
    g[name] = new Float32Array(b.buffer, b.byteOffset, b.length / 4);
  }
  return header;
}

const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
// headers every request of this process carries (x-client-id: who the service schedules it as)
const defaults = { headers: {} };

// one request: {code, body (parsed JSON or the tensor layout's header), ms,
// headers} or {err} for a transport failure (refused, reset, timeout)
function call(base, method, path, { body, headers = {}, timeoutMs = 30000, raw = false } = {}) {
  const t0 = process.hrtime.bigint();
  return new Promise((resolve) => {
    const u = new URL(path, base);
    const data = body === undefined ? null : Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body));
    const req = http.request(u, {
      method, agent, timeout: timeoutMs,
      headers: { ...defaults.headers, ...(data ? { 'content-type': 'application/json', 'content-length': data.length } : {}), ...headers },
    }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const buf = Buffer.concat(chunks);
        const ms = Number(process.hrtime.bigint() - t0) / 1e6;
        const ct = res.headers['content-type'] ?? '';
        let parsed = null;
        try {
          if (raw) parsed = null;
          else if (ct.startsWith('application/x-kvmem-tensors')) parsed = readTensorBody(buf);
          else if (ct.startsWith('application/json')) parsed = JSON.parse(buf.toString('utf8'));
          else parsed = { message: buf.toString('utf8', 0, 300) };
        } catch (e) { parsed = { message: `unparsable answer: ${e.message}` }; }
        resolve({ code: res.statusCode, body: parsed, ms, bytes: buf.length, headers: res.headers });
      });
      res.on('error', (e) => resolve({ err: e.code ?? e.message, ms: Number(process.hrtime.bigint() - t0) / 1e6 }));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', (e) => resolve({ err: e.code ?? e.message, ms: Number(process.hrtime.bigint() - t0) / 1e6 }));
    req.end(data);
  });
}

function percentile(xs, p) {
  if (!xs.length) return null;
  const s = Float64Array.from(xs).sort();
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

// a small seeded generator (mulberry32), so runs can be repeated
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

module.exports = { defaults, SPEC, PER, seedOf, tokenId, vAt, kAt, tokens, checkAnswer, query, tensorBody, readTensorBody, call, percentile, rng, sleep };
