'use strict';
// What the service needs to know of the pool's store that kvmem's API does not
// tell: which agents it holds (the agent list after a restart) and whether it
// answers (/healthz). A directory store is read with readdir; a Redis store
// (redis://, unix://, the URL kvmem_pool_create takes) with SCAN over the
// plugin's manifest keys kvmem:{POOL:AGENT}:m through a few lines of RESP.
// A Redis Cluster is not scanned node by node: one server or one proxy.
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');

const ID = /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$/;
const isUrl = (s) => /^(redis|unix):\/\//.test(s);

// The parts of a store URL the plugin reads (stores/redis/redis_store.c): the
// password stays out of every message.
function parseRedisUrl(url) {
  const q = url.indexOf('?');
  const main = q < 0 ? url : url.slice(0, q);
  const r = { host: null, port: 6379, sock: null, user: null, pass: null, db: 0, pool: 'default', timeoutMs: 2000 };
  if (main.startsWith('unix://')) {
    r.sock = main.slice(7);
  } else {
    let p = main.slice(8);
    const at = p.lastIndexOf('@');
    if (at >= 0) {
      const cred = p.slice(0, at);
      const colon = cred.indexOf(':');
      if (colon >= 0) { r.user = colon > 0 ? cred.slice(0, colon) : null; r.pass = cred.slice(colon + 1); } else if (cred) r.pass = cred;
      p = p.slice(at + 1);
    }
    const slash = p.indexOf('/');
    if (slash >= 0) { if (p.slice(slash + 1)) r.db = Number(p.slice(slash + 1)); p = p.slice(0, slash); }
    const m = /^\[(.*)\](?::(\d+))?$/.exec(p) ?? /^([^:]*)(?::(\d+))?$/.exec(p);
    r.host = m ? m[1] : p;
    if (m && m[2]) r.port = Number(m[2]);
  }
  for (const kv of q < 0 ? [] : url.slice(q + 1).split('&')) {
    const [k, v] = kv.split('=');
    if (k === 'pool') r.pool = v;
    else if (k === 'db') r.db = Number(v);
    else if (k === 'timeout_ms') r.timeoutMs = Number(v);
  }
  return r;
}

// One connection, commands in order, replies parsed from RESP2.
function redisSession(r, fn) {
  return new Promise((resolve, reject) => {
    const sock = r.sock ? net.connect(r.sock) : net.connect(r.port, r.host);
    const where = r.sock ? `redis ${r.sock}` : `redis ${r.host}:${r.port}`;
    let buf = Buffer.alloc(0);
    const waiting = [];
    let done = false;
    const finish = (err, v) => {
      if (done) return;
      done = true;
      sock.destroy();
      clearTimeout(timer);
      if (err) reject(new Error(`${where}: ${err.message}`)); else resolve(v);
    };
    const timer = setTimeout(() => finish(new Error(`no answer in ${r.timeoutMs} ms`)), r.timeoutMs);
    // parse one reply at buf[i..]: [value, next] or null when incomplete
    const parse = (i) => {
      const nl = buf.indexOf('\r\n', i);
      if (nl < 0) return null;
      const t = String.fromCharCode(buf[i]), line = buf.toString('utf8', i + 1, nl);
      if (t === '+') return [line, nl + 2];
      if (t === '-') return [new Error(line), nl + 2];
      if (t === ':') return [Number(line), nl + 2];
      if (t === '$') {
        const n = Number(line);
        if (n < 0) return [null, nl + 2];
        if (buf.length < nl + 2 + n + 2) return null;
        return [buf.toString('utf8', nl + 2, nl + 2 + n), nl + 2 + n + 2];
      }
      if (t === '*') {
        const n = Number(line), out = [];
        let j = nl + 2;
        for (let k = 0; k < n; k++) {
          const e = parse(j);
          if (!e) return null;
          out.push(e[0]);
          j = e[1];
        }
        return [out, j];
      }
      throw new Error(`unexpected reply type ${JSON.stringify(t)}`);
    };
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      try {
        for (;;) {
          const e = parse(0);
          if (!e) break;
          buf = buf.subarray(e[1]);
          const w = waiting.shift();
          if (w) w(e[0]);
        }
      } catch (err) { finish(err); }
    });
    sock.on('error', (err) => finish(err));
    sock.on('close', () => finish(new Error('connection closed')));
    const cmd = (...args) => new Promise((res, rej) => {
      waiting.push((v) => (v instanceof Error ? rej(new Error(`${args[0]}: ${v.message}`)) : res(v)));
      sock.write(`*${args.length}\r\n` + args.map((a) => `$${Buffer.byteLength(String(a))}\r\n${a}\r\n`).join(''));
    });
    sock.on('connect', async () => {
      try {
        if (r.pass !== null) await cmd('AUTH', ...(r.user ? [r.user] : []), r.pass);
        if (r.db) await cmd('SELECT', r.db);
        finish(null, await fn(cmd));
      } catch (err) { finish(err); }
    });
  });
}

// storeSpec: a directory or a store URL (null: no store)
function storeOf(storeSpec) {
  if (storeSpec === null) return { kind: 'none', list: async () => [], ping: async () => {} };
  if (!isUrl(storeSpec)) {
    const dir = storeSpec;
    return {
      kind: 'dir',
      // AGENT.safetensors files; the store's temporary files start with '.'
      list: async () => (await fs.promises.readdir(dir)).filter((f) => f.endsWith('.safetensors'))
        .map((f) => f.slice(0, -'.safetensors'.length)).filter((id) => ID.test(id)).sort(),
      ping: async () => { if (!(await fs.promises.stat(dir)).isDirectory()) throw new Error('the store is not a directory'); },
    };
  }
  const r = parseRedisUrl(storeSpec);
  const pre = `kvmem:{${r.pool}:`;
  return {
    kind: 'redis',
    list: () => redisSession(r, async (cmd) => {
      const ids = new Set();
      let cursor = '0';
      do {
        const [next, keys] = await cmd('SCAN', cursor, 'MATCH', `${pre}*}:m`, 'COUNT', 1000);
        cursor = next;
        for (const k of keys) {
          if (!k.startsWith(pre) || !k.endsWith('}:m')) continue;
          const id = k.slice(pre.length, -3);
          if (ID.test(id)) ids.add(id);
        }
      } while (cursor !== '0');
      return [...ids].sort();
    }),
    ping: () => redisSession(r, (cmd) => cmd('PING')),
  };
}

// A directory store must exist: kvmem_pool_create says so too, but naming the variable helps
function checkStoreDir(storeSpec) {
  if (storeSpec === null || isUrl(storeSpec)) return storeSpec;
  const dir = path.resolve(storeSpec);
  if (!fs.statSync(dir, { throwIfNoEntry: false })?.isDirectory())
    throw new Error(`memory-service: store directory ${dir} does not exist or is not a directory`);
  return dir;
}

module.exports = { storeOf, checkStoreDir, isUrl, parseRedisUrl };
