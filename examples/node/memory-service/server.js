'use strict';
// A small HTTP JSON memory service over kvmem: one pool, agents by id.
//
//   GET    /health                      {version, spec}
//   GET    /agents                      {agents: [id...]}
//   GET    /agents/:id                  agent info
//   POST   /agents/:id/append           {k, v, token_ids?, text?, token_text_offsets?, positions?, flush?}
//   POST   /agents/:id/flush            agent info
//   POST   /agents/:id/retrieve         {query, top_k?, gather?, base_position?}
//   POST   /agents/:id/save, /load      no body: the agent's file in the store (501 without one)
//   DELETE /agents/:id                  close and remove the agent
//
// Persistence goes through the pool's store: a directory chosen when the
// service starts (KVMEM_STORE_DIR), one AGENT_ID.safetensors file per agent,
// the id already checked by kvmem ([A-Za-z0-9._-], no leading '.'). A client
// never names a file: a body with a path (or any field) is refused, so no
// request can write or read outside the store, and error messages name the
// store as <store>, not the server's directories.
//
// K and V are flat arrays [n_layers][T][n_kv_heads][head_dim] and the query
// [n_q][n_layers][n_q_heads][head_dim], as an engine hands them over. The work
// runs on koffi worker threads (the binding's *Async calls), so the event loop
// keeps serving; calls on one agent are queued, as kvmem wants one thread per
// agent at a time. Errors come back as {error, status, message} with the
// kvmem message, and an HTTP code from the kvmem status.
//
// Run: npm install (the kvmem package: file:../../../bindings/node in a checkout,
//      or npm install kvmem-X.tgz), then KVMEM_STORE_DIR=/var/lib/kvmem node server.js
//      (HOST, PORT; PORT=0 picks a free port; without KVMEM_STORE_DIR, save/load answer 501)
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const kvmem = require('kvmem');

const HTTP_FOR_STATUS = {
  KVMEM_ERR_INVALID_ARG: 400, KVMEM_ERR_MISMATCH: 400, KVMEM_ERR_FORMAT: 400, KVMEM_ERR_NOT_FOUND: 404,
  KVMEM_ERR_EXISTS: 409, KVMEM_ERR_BUSY: 409, KVMEM_ERR_CONFLICT: 409, KVMEM_ERR_CAPACITY: 507,
  KVMEM_ERR_UNSUPPORTED: 501,
};

class HttpError extends Error {
  constructor(code, message, error = 'bad_request') { super(message); this.httpCode = code; this.error = error; }
}

function defaultSpec() {
  const n = (k, d) => Number(process.env[k] ?? d);
  return { nLayers: n('KVMEM_LAYERS', 2), nQHeads: n('KVMEM_Q_HEADS', 4), nKvHeads: n('KVMEM_KV_HEADS', 2),
           headDim: n('KVMEM_HEAD_DIM', 64), modelId: 'memory-service' };
}

// The HTTP API speaks snake_case JSON (as the Go service does); the
// binding's objects are camelCase.
const snake = (o) => Object.fromEntries(Object.entries(o).map(([k, v]) => [k.replace(/[A-Z]/g, (c) => '_' + c.toLowerCase()), v]));

// storeDir: an existing directory, the only place agents are saved to and
// loaded from (the pool's store); null: no persistence.
function createService({ spec = defaultSpec(), pool: poolParams = { blockSize: 16 }, backend = 'cpu',
                         storeDir = process.env.KVMEM_STORE_DIR || null } = {}) {
  if (storeDir !== null) {
    storeDir = path.resolve(storeDir);
    if (!fs.statSync(storeDir, { throwIfNoEntry: false })?.isDirectory())
      throw new Error(`memory-service: store directory ${storeDir} does not exist or is not a directory`);
  }
  const ctx = new kvmem.Context({ backend });
  const pool = ctx.poolCreate(spec, storeDir === null ? poolParams : { ...poolParams, storeDir });
  const agents = new Map(); // id -> {agent, queue}

  function agentFor(id) {
    let e = agents.get(id);
    if (!e) {
      e = { agent: pool.agentOpen(id), queue: Promise.resolve() };
      agents.set(id, e);
    }
    return e;
  }
  // run fn(agent) after the agent's earlier requests: one call per agent at a time
  function withAgent(id, fn) {
    const e = agentFor(id);
    const run = e.queue.then(() => fn(e.agent));
    e.queue = run.catch(() => {});
    return run;
  }
  const infoOf = (a) => ({ id: a.id, ...snake(a.getInfo()) });
  const has = kvmem.hasFunction;
  const f32 = (x, what) => {
    if (!Array.isArray(x)) throw new HttpError(400, `${what} must be an array of numbers`);
    return Float32Array.from(x);
  };

  // save and load use the pool's store only: the client names the agent, never a file
  function persistable(op, body) {
    if (!has(`kvmem_agent_${op}`)) throw new HttpError(501, `this libkvmem has no kvmem_agent_${op}`, 'not_implemented');
    if (body === null || typeof body !== 'object' || Array.isArray(body) || Object.keys(body).length)
      throw new HttpError(400, `${op} takes no body fields${body && typeof body === 'object' && Object.keys(body).length
        ? ` (got ${Object.keys(body).map((k) => JSON.stringify(k)).join(', ')})` : ''}: agents are kept in the store directory set when the service started`);
    if (storeDir === null)
      throw new HttpError(501, `${op}: this service has no store (start it with KVMEM_STORE_DIR=DIR)`, 'no_store');
  }
  // kvmem's messages may name the store's files: clients see <store>, not the server's directories
  const hidden = storeDir !== null && storeDir !== path.parse(storeDir).root ? storeDir : null;
  const hideStore = (msg) => (hidden === null ? msg : msg.split(hidden).join('<store>'));

  const routes = {
    async append(id, body) {
      return withAgent(id, async (a) => {
        await a.appendAsync(f32(body.k, 'k'), f32(body.v, 'v'), {
          tokenIds: body.token_ids, text: body.text, tokenTextOffsets: body.token_text_offsets, positions: body.positions,
        });
        if (body.flush) a.flush();
        return infoOf(a);
      });
    },
    async flush(id) { return withAgent(id, async (a) => { a.flush(); return infoOf(a); }); },
    async retrieve(id, body) {
      if (!has('kvmem_retrieve')) throw new HttpError(501, 'this libkvmem has no kvmem_retrieve', 'not_implemented');
      return withAgent(id, async (a) => {
        const r = await a.retrieveAsync(f32(body.query, 'query'), { topK: body.top_k ?? 8 });
        try {
          const { blocks, scores } = r.get(0);
          const out = { blocks: Array.from(blocks, (b, i) => {
            const bi = a.blockInfo(b);
            return { block: b, score: scores[i], first_token: bi.firstToken, n_tokens: bi.nTokens,
                     token_ids: Array.from(a.tokens(bi.firstToken, bi.nTokens)) };
          }), n_tokens: r.nTokens(0) };
          if (body.gather) {
            const g = await a.gatherAsync(blocks, body.base_position ?? 0);
            out.gathered = { shape: g.shape, k: Array.from(g.k), v: Array.from(g.v) };
          }
          return out;
        } finally { r.close(); }
      });
    },
    async save(id, body) {
      persistable('save', body);
      return withAgent(id, async (a) => { await a.saveAsync(null); return { saved: a.id, ...snake(a.getInfo()) }; });
    },
    async load(id, body) {
      persistable('load', body);
      return withAgent(id, async (a) => {
        try {
          await a.loadAsync(null);
        } catch (e) {
          // what is wrong inside a damaged file stays in the service's log:
          // the client learns the kind of failure, not the file's content
          if (!(e instanceof kvmem.FormatError || e instanceof kvmem.CorruptError)) throw e;
          console.error(`memory-service: load '${id}': ${e.message}`);
          throw new e.constructor(`agent '${id}': the stored file is ${e instanceof kvmem.FormatError
            ? 'not a valid kvmem agent file' : 'damaged'} (details in the service log)`);
        }
        return infoOf(a);
      });
    },
  };

  async function handle(req, body) {
    const url = new URL(req.url, 'http://x');
    const parts = url.pathname.split('/').filter(Boolean).map(decodeURIComponent);
    if (req.method === 'GET' && url.pathname === '/health') return { version: kvmem.version(), spec: snake(pool.spec) };
    if (parts[0] !== 'agents') throw new HttpError(404, `no route ${req.method} ${url.pathname}`, 'not_found');
    if (parts.length === 1 && req.method === 'GET') return { agents: pool.agentIds() };
    const id = parts[1];
    if (parts.length === 2 && req.method === 'GET') {
      if (!agents.has(id) && !pool.agentIds().includes(id)) throw new HttpError(404, `no agent '${id}'`, 'not_found');
      return withAgent(id, async (a) => infoOf(a));
    }
    if (parts.length === 2 && req.method === 'DELETE') {
      const e = agents.get(id);
      if (e) { await e.queue; e.agent.close(); agents.delete(id); }
      pool.removeAgent(id);
      return { removed: id };
    }
    if (parts.length === 3 && req.method === 'POST' && Object.hasOwn(routes, parts[2])) return routes[parts[2]](id, body);
    throw new HttpError(404, `no route ${req.method} ${url.pathname}`, 'not_found');
  }

  const server = http.createServer((req, res) => {
    const chunks = [];
    let size = 0;
    req.on('data', (c) => { size += c.length; if (size <= 64 << 20) chunks.push(c); });
    req.on('end', async () => {
      let code = 200, out;
      try {
        if (size > 64 << 20) throw new HttpError(413, 'request body over 64 MiB');
        let body = {};
        if (chunks.length) {
          try { body = JSON.parse(Buffer.concat(chunks).toString('utf8')); } catch (e) { throw new HttpError(400, `invalid JSON: ${e.message}`); }
        }
        out = await handle(req, body);
      } catch (e) {
        if (e instanceof HttpError) { code = e.httpCode; out = { error: e.error, message: e.message }; }
        else if (e instanceof kvmem.KvmemError) { code = HTTP_FOR_STATUS[e.code] ?? 500; out = { error: e.code, status: e.status, message: e.message }; }
        else if (e instanceof TypeError || e instanceof RangeError) { code = 400; out = { error: 'bad_request', message: e.message }; }
        else { code = 500; out = { error: 'internal', message: String(e && e.message) }; }
        out.message = hideStore(out.message);
      }
      const data = JSON.stringify(out);
      res.writeHead(code, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) });
      res.end(data);
    });
  });

  server.on('close', () => {
    for (const e of agents.values()) e.agent.close();
    agents.clear();
    ctx.close();
  });
  return server;
}

module.exports = { createService };

if (require.main === module) {
  let server;
  try {
    server = createService();
  } catch (e) {
    console.error(e.message);
    process.exit(1);
  }
  const host = process.env.HOST ?? '127.0.0.1';
  server.listen(Number(process.env.PORT ?? 8080), host, () => {
    console.log(`kvmem memory-service listening on http://${host}:${server.address().port}`);
  });
  const stop = () => server.close(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}
