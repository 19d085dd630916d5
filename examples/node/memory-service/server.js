'use strict';
// An HTTP memory service over kvmem: one pool, agents by id.
//
//   GET    /healthz                     200 {status: "ok", pid, started, ...}; 503 while shutting down or when the store does not answer
//   GET    /health                      {version, spec, limits, pool, malloc}
//   GET    /agents                      {agents: [id...]}: the pool's agents and the store's
//   GET    /agents/:id                  agent info
//   POST   /agents/:id/append           {k, v, token_ids?, text?, token_text_offsets?, positions?, flush?, save?, expect_tokens?}
//   POST   /agents/:id/flush            agent info
//   POST   /agents/:id/retrieve         {query, top_k?, gather?, base_position?}
//   POST   /agents/:id/save, /load      no body: the agent's entry in the store (501 without one)
//   DELETE /agents/:id                  remove the agent, from the store too
//
// Only append creates an agent; the others answer 404 for one the service does
// not hold. Bodies are JSON or the binary tensor layout (lib/codec.js), every
// field checked for its type (400, never converted). K and V are flat arrays
// [n_layers][T][n_kv_heads][head_dim] and the query
// [n_q][n_layers][n_q_heads][head_dim], as an engine hands them over.
// append's save: true answers only once the agent is in the store
// (saved: true); expect_tokens: N refuses (409) unless the agent holds N
// tokens, so a client that lost track after a failure cannot append twice.
//
// Persistence goes through the pool's store, chosen when the service starts
// (KVMEM_STORE): a directory, one AGENT_ID.safetensors file per agent, or a
// redis:// URL. A client never names a file: save and load take no body, the
// id is checked by kvmem ([A-Za-z0-9._-], no leading '.'), and messages name a
// directory store <store>. SIGTERM or SIGINT stops taking requests, finishes
// those at work and writes every changed agent to the store before exiting.
//
// Limits (docs/reliability.md): a memory budget (KVMEM_MEMORY_BUDGET; the pool
// gets what the runtime and the requests at work leave, 507 once it is full
// and no agent can be moved to the store), bodies (KVMEM_MAX_BODY_BYTES, 413),
// answers (KVMEM_MAX_RESPONSE_BYTES, 413, checked before the work), tokens
// per agent (KVMEM_MAX_AGENT_TOKENS, 413), and fair turns (lib/sched.js):
// KVMEM_WORKERS requests at work, one client at most KVMEM_CLIENT_RUNNING of
// them and KVMEM_CLIENT_QUEUE in the service (429 beyond). A client is its
// address, or the KVMEM_CLIENT_HEADER header a proxy in front sets. One JSON
// line per request goes to the access log (KVMEM_ACCESS_LOG: - for stdout,
// off, or a file); the service's own messages to stderr.
//
// The work runs on koffi worker threads (the binding's *Async calls) and
// large bodies are decoded on codec threads, so the event loop keeps serving;
// calls on one agent are queued, as kvmem wants one thread per agent at a time.
//
// Run: npm install (the kvmem package: file:../../../bindings/node in a checkout,
//      or npm install kvmem-X.tgz), then KVMEM_STORE=/var/lib/kvmem node server.js
//      (HOST, PORT; PORT=0 picks a free port; without a store, save/load answer 501)
const { tuneMalloc, mallocReport } = require('./lib/malloc');
// First, before loading kvmem starts its threads (each thread's first malloc
// may make an arena, which a later limit would not take back): glibc's malloc
// held to the budget (lib/malloc.js). Only when run as the service.
if (require.main === module) {
  try {
    tuneMalloc();
  } catch (e) {
    process.stderr.write(`memory-service: ${e.message}: glibc's malloc keeps its defaults\n`);
  }
}
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { monitorEventLoopDelay } = require('node:perf_hooks');
const kvmem = require('kvmem');
const { loadConfig, perRequestBytes } = require('./lib/config');
const { FairScheduler, QueueFullError, DrainingError } = require('./lib/sched');
const codec = require('./lib/codec');
const { CodecPool } = require('./lib/codec-pool');
const { storeOf, checkStoreDir } = require('./lib/store');

const HTTP_FOR_STATUS = {
  KVMEM_ERR_INVALID_ARG: 400, KVMEM_ERR_MISMATCH: 400, KVMEM_ERR_FORMAT: 400, KVMEM_ERR_NOT_FOUND: 404,
  KVMEM_ERR_EXISTS: 409, KVMEM_ERR_BUSY: 409, KVMEM_ERR_CONFLICT: 409, KVMEM_ERR_CAPACITY: 507,
  KVMEM_ERR_NOMEM: 507, KVMEM_ERR_UNSUPPORTED: 501, KVMEM_ERR_IO: 503,
};

class HttpError extends Error {
  constructor(code, message, error = 'bad_request') { super(message); this.httpCode = code; this.error = error; }
}

// The HTTP API speaks snake_case JSON (as the Go service does); the binding's objects are camelCase.
const snake = (o) => Object.fromEntries(Object.entries(o).map(([k, v]) => [k.replace(/[A-Z]/g, (c) => '_' + c.toLowerCase()), v]));

function checkId(id) {
  if (id.includes('\0')) throw new HttpError(400, `agent id ${JSON.stringify(id)} contains a NUL byte`);
  if (!kvmem.agentIdValid(id))
    throw new HttpError(400, `agent id '${id.length > 40 ? id.slice(0, 40) + '...' : id}' is invalid: use 1-128 of [A-Za-z0-9._-], not starting with '.'`);
}

// cfg: lib/config.js's loadConfig(); returns {server, shutdown, ...} once the
// store's agents are listed.
async function createService(cfg, { log = (m) => process.stderr.write(`memory-service: ${m}\n`) } = {}) {
  const storeSpec = checkStoreDir(cfg.store);
  const store = storeOf(storeSpec);
  const ctx = new kvmem.Context({ backend: 'cpu' });
  let pool;
  try {
    pool = ctx.poolCreate(cfg.spec, {
      blockSize: cfg.blockSize, capacityBytes: cfg.poolCapacityBytes, maxTokensPerAgent: cfg.maxAgentTokens,
      ...(storeSpec === null ? {} : { storeDir: storeSpec }),
    });
  } catch (e) {
    ctx.close();
    throw e;
  }
  // the agents: those in the store when the service starts, and those it creates
  let known;
  try {
    known = new Set(await store.list());
  } catch (e) {
    pool.close();
    ctx.close();
    throw new Error(`memory-service: cannot list the store's agents: ${e.message}`);
  }
  const sched = new FairScheduler({ workers: cfg.workers, clientRunning: cfg.clientRunning, clientQueue: cfg.clientQueue });
  // a codec thread's heap: what one request may take (lib/config.js)
  const codecs = new CodecPool(cfg.workers, { heapMb: Math.ceil(perRequestBytes(cfg) / 2 ** 20) + 32 });
  await codecs.start();
  const entries = new Map(); // id -> {id, refs, tail, agent, dead}: the agents requests are using
  const { nLayers: L, nKvHeads: H, headDim: D } = pool.spec;
  let draining = false;
  const started = Date.now();
  const loopDelay = monitorEventLoopDelay({ resolution: 10 });
  loopDelay.enable();

  // kvmem's messages may name the store's files: clients see <store>, not the server's directories
  const hidden = storeSpec !== null && store.kind === 'dir' && storeSpec !== path.parse(storeSpec).root ? storeSpec : null;
  const hideStore = (msg) => (hidden === null ? msg : msg.split(hidden).join('<store>'));
  const infoOf = (a) => ({ id: a.id, ...snake(a.getInfo()) });

  // fn(e) after the earlier requests on the agent: one kvmem call per agent
  // at a time. A request queued behind a DELETE starts over on a fresh entry.
  // Opening, flushing, closing and removing wait for the pool's mutex, which a spill to the
  // store holds through its write (and a directory store's fsync): they run on
  // worker threads (the binding's *Async), never on the event loop, so one
  // client's spills hold up only the requests that need the pool, not every client.
  // The handle stays open while requests for the agent are in, and for IDLE_MS
  // after the last while the idle handles hold at most an eighth of the pool
  // (an open agent is never moved to the store): a client's next request on
  // the agent neither reopens it nor waits for a close behind another client's
  // spills. Past that the handle is closed, so the pool may move the agent out.
  const IDLE_MS = 2000;
  const idle = new Map(); // entry -> {bytes, timer}: open handles no request is using, oldest first
  let idleBytes = 0;
  function closeEntry(e) {
    e.tail = e.tail.then(async () => {
      if (e.agent && e.refs === 0) {
        const a = e.agent;
        e.agent = null;
        try { await a.closeAsync(); } catch (err) { log(`closing agent '${e.id}': ${err.message}`); }
      }
      if (e.refs === 0 && entries.get(e.id) === e) entries.delete(e.id);
    });
  }
  function unidle(e) {
    const x = idle.get(e);
    if (!x) return;
    clearTimeout(x.timer);
    idle.delete(e);
    idleBytes -= x.bytes;
  }
  function release(e) {
    let bytes = Infinity;
    try { if (e.agent && !e.dead && !draining) bytes = e.agent.getInfo().bytes; } catch { /* closed: not kept */ }
    const room = cfg.poolCapacityBytes / 8;
    if (bytes > room) { closeEntry(e); return; }
    // the oldest idle handles make room
    for (const [old] of idle) {
      if (idleBytes + bytes <= room) break;
      unidle(old);
      closeEntry(old);
    }
    const timer = setTimeout(() => { unidle(e); closeEntry(e); }, IDLE_MS);
    timer.unref();
    idle.set(e, { bytes, timer });
    idleBytes += bytes;
  }
  // every idle handle closed (the pool is full, or the service stops)
  function closeIdle() {
    for (const [e] of idle) { unidle(e); closeEntry(e); }
  }
  // op(), again once the idle handles are closed when the pool had no room
  async function roomy(op) {
    try {
      return await op();
    } catch (err) {
      if (!(err instanceof kvmem.CapacityError) || !idle.size) throw err;
      const closing = [...idle.keys()];
      closeIdle();
      await Promise.all(closing.map((x) => x.tail));
      return op();
    }
  }
  async function withEntry(id, fn) {
    checkId(id);
    for (;;) {
      let e = entries.get(id);
      if (!e) entries.set(id, e = { id, refs: 0, tail: Promise.resolve(), agent: null, dead: false });
      e.refs++;
      unidle(e);
      let retry = false;
      const run = e.tail.then(() => {
        if (e.dead) { retry = true; return undefined; }
        return fn(e);
      });
      e.tail = run.then(() => {}, () => {});
      try {
        const v = await run;
        if (!retry) return v;
      } finally {
        if (--e.refs === 0) release(e);
      }
    }
  }
  async function open(e, create) {
    if (e.agent) return e.agent;
    if (!create && !known.has(e.id)) throw new HttpError(404, `no agent '${e.id}'`, 'not_found');
    e.agent = await roomy(() => pool.agentOpenAsync(e.id));
    known.add(e.id);
    return e.agent;
  }
  // an agent a failed first request created is removed again
  async function undoCreate(e) {
    try {
      if (e.agent.getInfo().nTokens !== 0) return;
      const a = e.agent;
      e.agent = null;
      await a.closeAsync();
      await pool.removeAgentAsync(e.id);
      known.delete(e.id);
    } catch (err) { log(`undoing the creation of '${e.id}': ${err.message}`); }
  }

  function noStore(op) {
    if (storeSpec === null) throw new HttpError(501, `${op}: this service has no store (start it with KVMEM_STORE=DIR or a redis:// URL)`, 'no_store');
  }
  function persistable(op) {
    if (!kvmem.hasFunction(`kvmem_agent_${op}`)) throw new HttpError(501, `this libkvmem has no kvmem_agent_${op}`, 'not_implemented');
    noStore(op);
  }

  const routes = {
    async append(id, f) {
      const per = L * H * D;
      if (f.save) persistable('save');
      const T = f.k.length / per;
      return withEntry(id, async (e) => {
        const created = !e.agent && !known.has(id);
        const a = await open(e, true);
        try {
          const n = a.getInfo().nTokens;
          if (f.expect_tokens !== undefined && n !== f.expect_tokens)
            throw new HttpError(409, `agent '${id}' holds ${n} tokens, the request expected ${f.expect_tokens}`, 'conflict');
          if (Number.isInteger(T) && n + T > cfg.maxAgentTokens)
            throw new HttpError(413, `agent '${id}' holds ${n} tokens: ${T} more would pass the service's limit of ${cfg.maxAgentTokens} tokens per agent`, 'too_large');
          // the decoded arrays are this request's alone: handed over without a copy
          await roomy(() => a.appendAsync(f.k, f.v, { tokenIds: f.token_ids, text: f.text, tokenTextOffsets: f.token_text_offsets, positions: f.positions, copy: false }));
        } catch (err) {
          if (created) await undoCreate(e);
          throw err;
        }
        if (f.flush) await roomy(() => a.flushAsync());
        if (f.save) {
          try {
            await a.saveAsync(null);
          } catch (err) {
            err.message = `appended, but not saved: ${err.message}`;
            throw err;
          }
        }
        return { ...infoOf(a), ...(f.save ? { saved: true } : {}) };
      });
    },
    async flush(id) { return withEntry(id, async (e) => { const a = await open(e, false); await roomy(() => a.flushAsync()); return infoOf(a); }); },
    async retrieve(id, f, binary) {
      if (!kvmem.hasFunction('kvmem_retrieve')) throw new HttpError(501, 'this libkvmem has no kvmem_retrieve', 'not_implemented');
      return withEntry(id, async (e) => {
        const a = await open(e, false);
        const r = await a.retrieveAsync(f.query, { topK: f.top_k ?? 8 });
        try {
          const { blocks, scores } = r.get(0);
          const infos = Array.from(blocks, (b) => a.blockInfo(b));
          const nTok = infos.reduce((s, bi) => s + bi.nTokens, 0);
          const bound = codec.responseBound(binary, f.gather ? 2 * nTok * L * H * D : 0, blocks.length, nTok);
          if (bound > cfg.maxResponseBytes)
            throw new HttpError(413, `the answer would take up to ${bound} bytes, over the service's limit of ${cfg.maxResponseBytes}: `
              + `ask for fewer blocks (top_k)${f.gather && !binary ? `, or for the gathered tensors as ${codec.CT_TENSORS}` : ''}`, 'too_large');
          const out = { blocks: infos.map((bi, i) => ({
            block: blocks[i], score: scores[i], first_token: bi.firstToken, n_tokens: bi.nTokens,
            token_ids: Array.from(a.tokens(bi.firstToken, bi.nTokens)),
          })), n_tokens: r.nTokens(0) };
          if (f.gather) {
            const g = await a.gatherAsync(blocks, f.base_position ?? 0);
            out.gathered = { shape: g.shape, k: g.k, v: g.v };
          }
          return out;
        } finally { r.close(); }
      });
    },
    async save(id) {
      persistable('save');
      return withEntry(id, async (e) => { const a = await open(e, false); await a.saveAsync(null); return { saved: a.id, ...snake(a.getInfo()) }; });
    },
    async load(id) {
      persistable('load');
      return withEntry(id, async (e) => {
        const a = await open(e, false);
        try {
          await a.loadAsync(null);
        } catch (err) {
          // what is wrong inside a damaged file stays in the service's log:
          // the client learns the kind of failure, not the file's content
          if (!(err instanceof kvmem.FormatError || err instanceof kvmem.CorruptError)) throw err;
          log(`load '${id}': ${err.message}`);
          throw new err.constructor(`agent '${id}': the stored file is ${err instanceof kvmem.FormatError
            ? 'not a valid kvmem agent file' : 'damaged'} (details in the service log)`);
        }
        return infoOf(a);
      });
    },
    async info(id) { return withEntry(id, async (e) => infoOf(await open(e, false))); },
    async remove(id) {
      return withEntry(id, async (e) => {
        if (!e.agent && !known.has(id)) throw new HttpError(404, `no agent '${id}'`, 'not_found');
        if (e.agent) { const a = e.agent; e.agent = null; await a.closeAsync(); }
        await pool.removeAgentAsync(id);
        known.delete(id);
        e.dead = true;
        if (entries.get(id) === e) entries.delete(id);
        return { removed: id };
      });
    },
    async list() { return { agents: [...known].sort() }; },
  };

  // the route of a request: [name, id] (throws 400 for a bad escape, 404 for no route)
  function routeOf(method, pathname) {
    let parts;
    try {
      parts = pathname.split('/').filter(Boolean).map(decodeURIComponent);
    } catch {
      throw new HttpError(400, `bad percent escape in ${JSON.stringify(pathname.slice(0, 200))}`);
    }
    const none = () => new HttpError(404, `no route ${method} ${pathname.slice(0, 200)}`, 'not_found');
    if (parts.length === 1 && method === 'GET' && (parts[0] === 'healthz' || parts[0] === 'health')) return [parts[0], null];
    if (parts[0] !== 'agents' || parts.length > 3) throw none();
    if (parts.length === 1) { if (method === 'GET') return ['list', null]; throw none(); }
    if (parts.length === 2) {
      if (method === 'GET') return ['info', parts[1]];
      if (method === 'DELETE') return ['remove', parts[1]];
      throw none();
    }
    if (method === 'POST' && ['append', 'flush', 'retrieve', 'save', 'load'].includes(parts[2])) return [parts[2], parts[1]];
    throw none();
  }

  function errorAnswer(e) {
    if (e instanceof HttpError || e instanceof codec.BodyError) return [e.httpCode, { error: e.error, message: e.message }];
    if (e instanceof QueueFullError) return [429, { error: 'too_many_requests', message: e.message }];
    if (e instanceof DrainingError) return [503, { error: 'shutting_down', message: e.message }];
    if (e instanceof kvmem.KvmemError)
      return [HTTP_FOR_STATUS[e.code] ?? 500, { error: e.code, status: e.status, message: e.message }];
    // the binding's own argument checks ("kvmem: ...")
    if ((e instanceof TypeError || e instanceof RangeError) && /^kvmem: /.test(e.message)) return [400, { error: 'bad_request', message: e.message }];
    log(`internal error: ${e && e.stack}`);
    return [500, { error: 'internal', message: String(e && e.message) }];
  }

  const accessOut = cfg.accessLog === 'off' ? null : cfg.accessLog === '-' ? process.stdout : fs.createWriteStream(cfg.accessLog, { flags: 'a' });
  const clientOf = (req) => {
    const h = cfg.clientHeader && req.headers[cfg.clientHeader];
    return typeof h === 'string' && /^[\x21-\x7e]{1,128}$/.test(h) ? h : req.socket.remoteAddress ?? '?';
  };

  // The body as it arrives. A foreground request's is copied into one buffer
  // of its Content-Length (one copy of 8 MB at the end held the event loop for
  // tens of milliseconds). A background request's chunks are kept as they
  // came, uncopied: a large body goes to a codec thread as they are, which
  // joins them there, at its lower priority (copying a flood's bodies was a
  // third of the event loop's work under one).
  function readBody(req, limit, keepChunks) {
    return new Promise((resolve, reject) => {
      const cl = Number(req.headers['content-length']);
      const whole = !keepChunks && Number.isSafeInteger(cl) && cl >= 0 && cl <= limit ? Buffer.allocUnsafe(cl) : null;
      const chunks = [];
      let n = 0;
      req.on('data', (c) => {
        if (n + c.length > limit || (whole && n + c.length > whole.length)) {
          req.removeAllListeners('data');
          req.pause();
          reject(new HttpError(413, `request body over the service's limit of ${limit} bytes`, 'too_large'));
          return;
        }
        if (whole) c.copy(whole, n); else chunks.push(c);
        n += c.length;
      });
      req.on('end', () => resolve(whole ? whole.subarray(0, n) : keepChunks ? chunks : Buffer.concat(chunks, n)));
      req.on('error', reject);
      req.on('aborted', () => reject(new Error('the client went away')));
    });
  }

  async function onRequest(req, res) {
    const t0 = process.hrtime.bigint();
    const client = clientOf(req);
    let release = null, queueMs = 0, inBytes = 0, outBytes = 0, code = 200;
    // the slot is given back once the work is over and the answer is out (or
    // the client gone): a client that stops reading holds its own slots only
    let ends = 2;
    const ended = () => { if (--ends === 0 && release) release(); };
    const ac = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) ac.abort(new Error('the client went away'));
      ended();
      if (accessOut) {
        const ms = Number(process.hrtime.bigint() - t0) / 1e6;
        // 499: the client went away before its answer (nginx's code for it)
        accessOut.write(JSON.stringify({ time: new Date().toISOString(), client, method: req.method, path: req.url.split('?')[0].slice(0, 300),
          status: res.writableFinished ? code : 499, in: inBytes, out: outBytes, ms: Math.round(ms * 100) / 100, queue_ms: Math.round(queueMs * 100) / 100 }) + '\n');
      }
    });
    const send = (status, chunks, ctype, close = false) => {
      code = status;
      outBytes = chunks.reduce((a, c) => a + c.length, 0);
      const headers = { 'content-type': ctype, 'content-length': outBytes };
      if (status === 429 || status === 503) headers['retry-after'] = '1';
      if (close || draining) headers.connection = 'close';
      res.writeHead(status, headers);
      for (const c of chunks.slice(0, -1)) res.write(c);
      res.end(chunks[chunks.length - 1]);
    };
    const sendJson = (status, obj, close) => send(status, [Buffer.from(JSON.stringify(obj), 'utf8')], codec.CT_JSON, close);
    let route, id;
    try {
      const pathname = req.url.split('?')[0];
      [route, id] = routeOf(req.method, pathname);
      if (route === 'healthz') {
        if (draining) return sendJson(503, { status: 'shutting_down' });
        try {
          await store.ping();
        } catch (err) {
          return sendJson(503, { status: 'store_unavailable', message: hideStore(err.message) });
        }
        return sendJson(200, { status: 'ok', store: store.kind, agents: known.size, ...sched.stats(), pid: process.pid, started });
      }
      if (route === 'health') {
        const pi = await pool.getInfoAsync();
        // how long the event loop was held since the last /health: what every client waited at worst
        const loop = { p50: loopDelay.percentile(50) / 1e6, p99: loopDelay.percentile(99) / 1e6, max: loopDelay.max / 1e6 };
        loopDelay.reset();
        return sendJson(200, { version: kvmem.version(), spec: snake(pool.spec), limits: {
          memory_budget_bytes: cfg.budgetBytes, pool_capacity_bytes: cfg.poolCapacityBytes, max_body_bytes: cfg.maxBodyBytes,
          max_response_bytes: cfg.maxResponseBytes, max_agent_tokens: cfg.maxAgentTokens, workers: cfg.workers,
          client_running: cfg.clientRunning, client_queue: cfg.clientQueue,
        }, pool: { used_bytes: pi.usedBytes, n_agents: pi.nAgents }, malloc: mallocReport(), event_loop_delay_ms: loop });
      }
      if (draining) throw new DrainingError('the service is shutting down');
      const cl = req.headers['content-length'];
      if (cl !== undefined && Number(cl) > cfg.maxBodyBytes)
        return sendJson(413, { error: 'too_large', message: `request body of ${cl} bytes is over the service's limit of ${cfg.maxBodyBytes}` }, true);
      const waitFrom = process.hrtime.bigint();
      release = await sched.acquire(client, ac.signal);
      queueMs = Number(process.hrtime.bigint() - waitFrom) / 1e6;
      let body;
      try {
        body = await readBody(req, cfg.maxBodyBytes, release.background);
      } catch (err) {
        if (err instanceof HttpError) return sendJson(err.httpCode, { error: err.error, message: err.message }, true);
        throw err;
      }
      inBytes = Array.isArray(body) ? body.reduce((a, c) => a + c.length, 0) : body.length;
      let out;
      if (['list', 'info', 'remove'].includes(route)) out = await routes[route](id);
      else {
        const fields = await codecs.decode(route, req.headers['content-type'], body, release.background);
        out = await routes[route](id, fields, codec.accepts(req.headers.accept));
      }
      if (out.gathered) {
        if (codec.accepts(req.headers.accept)) return send(200, codec.tensorChunks(out), codec.CT_TENSORS);
        return send(200, [await codecs.json(out, [out.gathered.k, out.gathered.v], release.background)], codec.CT_JSON);
      }
      return sendJson(200, out);
    } catch (e) {
      if (ac.signal.aborted) return undefined;
      const [status, out] = errorAnswer(e);
      out.message = hideStore(out.message);
      return sendJson(status, out, status === 429);
    } finally {
      ended();
    }
  }

  const server = http.createServer((req, res) => {
    onRequest(req, res).catch((e) => { log(`answering ${req.method} ${req.url}: ${e && e.stack}`); res.destroy(); });
  });
  server.requestTimeout = 120000;
  server.headersTimeout = 60000;

  // Stop taking requests, finish those at work, write every changed agent
  // to the store. Resolves true when everything was saved.
  let stopped = null;
  function shutdown() {
    if (stopped) return stopped;
    draining = true;
    stopped = (async () => {
      server.close();
      // requests at work finish; an answer a client does not read is cut after the timeout
      const drained = sched.drain();
      let timer;
      await Promise.race([drained, new Promise((r) => { timer = setTimeout(r, cfg.shutdownMs); })]);
      clearTimeout(timer);
      server.closeAllConnections();
      await drained;
      // the handles' closes queued on their entries, then any left open
      closeIdle();
      await Promise.all([...entries.values()].map((e) => e.tail));
      for (const e of entries.values()) if (e.agent) { const a = e.agent; e.agent = null; await a.closeAsync(); }
      let ok = true;
      if (storeSpec !== null) {
        const until = Date.now() + cfg.shutdownMs;
        for (let wait = 100; ; wait = Math.min(2 * wait, 2000)) {
          try {
            await pool.syncAsync();
            break;
          } catch (err) {
            log(`saving the agents to the store: ${hideStore(err.message)}`);
            if (Date.now() + wait > until) { ok = false; log('giving up: agents changed since their last save are lost'); break; }
            await new Promise((r) => setTimeout(r, wait));
          }
        }
      }
      codecs.close();
      pool.close();
      ctx.close();
      if (accessOut && accessOut !== process.stdout) await new Promise((r) => accessOut.end(r));
      return ok;
    })();
    return stopped;
  }

  return { server, shutdown, known, sched };
}

module.exports = { createService };

if (require.main === module) {
  (async () => {
    let svc, cfg;
    try {
      cfg = loadConfig();
      svc = await createService(cfg);
    } catch (e) {
      console.error(e.message);
      process.exit(1);
    }
    svc.server.listen(cfg.port, cfg.host, () => {
      console.log(`kvmem memory-service listening on http://${cfg.host}:${svc.server.address().port}`);
    });
    const stop = (sig) => {
      process.stderr.write(`memory-service: ${sig}: finishing the requests at work and saving the agents\n`);
      svc.shutdown().then((ok) => process.exit(ok ? 0 : 1));
    };
    process.on('SIGTERM', () => stop('SIGTERM'));
    process.on('SIGINT', () => stop('SIGINT'));
  })();
}
