'use strict';
// What the service's tests share: start it as its own process on a free
// loopback port, call it, stop it; a Redis server of the test's own.
const assert = require('node:assert/strict');
const { spawn, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');

const L = 2, HQ = 4, HKV = 2, D = 8;
const SERVER = path.join(__dirname, '..', 'server.js');

// env: extra variables (KVMEM_STORE_DIR / KVMEM_STORE unset unless given)
function startService(env = {}) {
  const full = { ...process.env, HOST: '127.0.0.1', PORT: '0', KVMEM_LAYERS: L, KVMEM_Q_HEADS: HQ, KVMEM_KV_HEADS: HKV, KVMEM_HEAD_DIM: D };
  for (const k of Object.keys(full)) if (/^KVMEM_(STORE|MEMORY|MAX|WORKERS|CLIENT|ACCESS|SHUTDOWN)/.test(k)) delete full[k];
  Object.assign(full, env);
  for (const k of Object.keys(full)) if (full[k] === undefined) delete full[k];
  // stderr: the service's log; stdout: the listening line and the access log
  const child = spawn(process.execPath, [SERVER], { env: full, stdio: ['ignore', 'pipe', 'pipe'] });
  child.log = '';
  child.out = '';
  child.stderr.on('data', (d) => { child.log += d; });
  child.exited = new Promise((resolve) => child.on('exit', (c, sig) => resolve(c ?? sig)));
  return new Promise((resolve, reject) => {
    child.stdout.on('data', (d) => {
      child.out += d;
      const m = child.out.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
      if (m) resolve({ child, base: m[1], call: caller(m[1]) });
    });
    child.on('exit', (code) => reject(new Error(`service exited (${code}) before listening: ${child.out} ${child.log}`)));
  });
}

// call(method, path, body, headers) -> {code, body, headers}; a body that is a
// Buffer goes as it is, anything else as JSON
const caller = (base) => async (method, p, body, headers = {}) => {
  const raw = Buffer.isBuffer(body);
  const r = await fetch(base + p, {
    method, headers: { 'content-type': 'application/json', ...headers },
    body: body === undefined ? undefined : raw ? body : JSON.stringify(body),
  });
  const ct = r.headers.get('content-type') ?? '';
  const buf = Buffer.from(await r.arrayBuffer());
  return { code: r.status, body: ct.startsWith('application/json') ? JSON.parse(buf.toString('utf8')) : buf, headers: r.headers };
};

async function stop(child, signal = 'SIGTERM') {
  child.kill(signal);
  const code = await child.exited;
  if (signal === 'SIGTERM') assert.equal(code, 0, `the service stops cleanly on SIGTERM: ${child.log}`);
  return code;
}

// a token's key: one-hot in a dimension chosen by the word, per layer and head
function wordKV(words) {
  const k = new Array(L * words.length * HKV * D).fill(0);
  words.forEach((w, t) => {
    const h0 = [...w].reduce((a, c) => (a * 31 + c.charCodeAt(0)) >>> 0, 7);
    for (let l = 0; l < L; l++) for (let h = 0; h < HKV; h++) k[((l * words.length + t) * HKV + h) * D + ((h0 >>> (l + h)) % D)] = 1;
  });
  return k;
}

// n tokens of K = V = small integers (exact in f16), different per agent and token
function tokensKV(seed, first, n) {
  const k = new Array(L * n * HKV * D);
  for (let l = 0; l < L; l++) for (let t = 0; t < n; t++) for (let h = 0; h < HKV; h++) for (let d = 0; d < D; d++)
    k[((l * n + t) * HKV + h) * D + d] = ((seed * 131 + (first + t) * 7 + l * 3 + h * 5 + d) % 61) - 30;
  return k;
}

// the query that finds the token of `words` (wordKV) whose key it repeats
function queryFor(word) {
  const q = [];
  const qk = wordKV([word]);
  for (let l = 0; l < L; l++) for (let hq = 0; hq < HQ; hq++) for (let d = 0; d < D; d++) q.push(qk[(l * HKV + Math.floor(hq / (HQ / HKV))) * D + d]);
  return q;
}

const tmpdir = (what) => fs.mkdtempSync(path.join(os.tmpdir(), `kvmem-svc-${what}-`));

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

// A redis-server of the test's own on a free loopback port (null when there is
// none on PATH: the caller skips, saying so).
async function startRedis() {
  if (spawnSync('redis-server', ['--version']).status !== 0) return null;
  const dir = tmpdir('redis');
  const port = await freePort();
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '', '--appendonly', 'no'],
    { stdio: 'ignore' });
  const exited = new Promise((r) => child.on('exit', r));
  for (let i = 0; i < 100; i++) {
    const ok = await new Promise((resolve) => {
      const s = net.connect(port, '127.0.0.1', () => { s.end(); resolve(true); });
      s.on('error', () => resolve(false));
    });
    if (ok) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url: `redis://127.0.0.1:${port}`, port, pid: child.pid,
    stop: async () => { child.kill('SIGKILL'); await exited; fs.rmSync(dir, { recursive: true, force: true }); },
  };
}

// the binary tensor body: u64 LE header length, JSON header, data
function tensorBody(fields, tensors) {
  const header = { ...fields };
  const parts = [];
  let off = 0;
  for (const [name, arr] of Object.entries(tensors)) {
    const b = Buffer.from(arr.buffer, arr.byteOffset, arr.byteLength);
    header[name] = { dtype: arr instanceof Float32Array ? 'F32' : 'I32', shape: [arr.length], data_offsets: [off, off + b.length] };
    parts.push(b);
    off += b.length;
  }
  const hb = Buffer.from(JSON.stringify(header));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(hb.length));
  return Buffer.concat([len, hb, ...parts]);
}

// a tensor-layout answer: its header, and each F32 descriptor read as a Float32Array
function readTensorBody(buf) {
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.toString('utf8', 8, 8 + n));
  const data = buf.subarray(8 + n);
  const walk = (o) => {
    if (o && typeof o === 'object' && !Array.isArray(o)) {
      if (o.dtype === 'F32' && o.data_offsets) {
        const b = Buffer.from(data.subarray(o.data_offsets[0], o.data_offsets[1]));
        return new Float32Array(b.buffer, b.byteOffset, b.length / 4);
      }
      for (const k of Object.keys(o)) o[k] = walk(o[k]);
    } else if (Array.isArray(o)) return o.map(walk);
    return o;
  };
  return walk(header);
}

module.exports = { L, HQ, HKV, D, SERVER, startService, caller, stop, wordKV, tokensKV, queryFor, tmpdir, startRedis, tensorBody, readTensorBody };
