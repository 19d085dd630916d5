'use strict';
// Codec threads: JSON.parse of a multi-megabyte body (or JSON.stringify of a
// large answer) takes tens to hundreds of milliseconds, and on the main
// thread every other client would wait for it. Bodies and answers above
// `inlineBytes` go to one of these threads instead; the buffers move between
// threads without copies (transferred). Small ones (a 64 KiB body parses in
// about a millisecond) stay on the main thread: a hop to a thread waits for
// a core, and under load that costs more than the parse.
const os = require('node:os');
const path = require('node:path');
const { Worker, isMainThread, parentPort, workerData } = require('node:worker_threads');
const codec = require('./codec');

if (!isMainThread && parentPort) {
  // a background thread does the large bodies' and answers' work of clients
  // with a backlog (lib/sched.js): at a lower CPU priority (Linux: per
  // thread), a flood of them leaves the cores to the other clients' requests,
  // on the main thread and on the foreground threads
  if (workerData?.background) try { os.setPriority(0, Math.max(os.getPriority(0), 10)); } catch { /* not permitted: same priority */ }
  parentPort.on('message', ({ id, op, route, ctype, bytes, obj }) => {
    try {
      if (op === 'priority') {
        parentPort.postMessage({ id, ok: true, priority: os.getPriority(0) });
      } else if (op === 'decode') {
        // a background body comes as the chunks it arrived in: joined here, off the event loop
        const buf = Array.isArray(bytes) ? Buffer.concat(bytes.map((ab) => Buffer.from(ab))) : Buffer.from(bytes);
        const fields = codec.decodeRequest(route, ctype, buf);
        const moved = Object.values(fields).filter(ArrayBuffer.isView).map((a) => a.buffer);
        parentPort.postMessage({ id, ok: true, fields }, moved);
      } else {
        const b = codec.jsonBytes(obj);
        const ab = b.buffer.slice(b.byteOffset, b.byteOffset + b.length);
        parentPort.postMessage({ id, ok: true, bytes: ab }, [ab]);
      }
    } catch (e) {
      parentPort.postMessage({ id, ok: false, httpCode: e.httpCode, error: e.error, message: e.message });
    }
  });
}

class CodecPool {
  // n background threads (nice 10) and nForeground at the service's own
  // priority. heapMb: each thread's V8 heap limit. V8 lets a busy heap grow
  // with its garbage (hundreds of MB under a flood of large bodies) before
  // it collects; a limit sized to one request's work holds it to that.
  constructor(n, { inlineBytes = 65536, heapMb = 256, nForeground = 1 } = {}) {
    this.inlineBytes = inlineBytes;
    this.heapMb = heapMb;
    this.n = { true: n, false: nForeground };
    this.workers = [];
    this.seq = 0;
    this.pending = new Map(); // id -> {resolve, reject, w}
  }

  // start every thread now (a new V8 isolate takes 50-300 ms): the first
  // large bodies then find them ready
  async start() {
    for (const bg of [true, false]) {
      while (this.workers.filter((w) => w.background === bg).length < this.n[bg]) {
        const w = this._worker(bg);
        await new Promise((resolve, reject) => { w.once('online', resolve); w.once('error', reject); });
      }
    }
  }

  _worker(background) {
    const mine = this.workers.filter((w) => w.background === background);
    if (mine.length < this.n[background]) {
      const w = new Worker(path.join(__dirname, 'codec-pool.js'),
        { workerData: { background }, resourceLimits: { maxOldGenerationSizeMb: this.heapMb, maxYoungGenerationSizeMb: 8 } });
      w.unref();
      w.background = background;
      w.jobs = 0;
      w.on('message', (m) => {
        const p = this.pending.get(m.id);
        if (!p) return;
        this.pending.delete(m.id);
        w.jobs--;
        if (m.ok) p.resolve(m);
        else p.reject(m.httpCode ? new codec.BodyError(m.httpCode, m.error, m.message) : new Error(m.message));
      });
      const fail = (err) => {
        // a thread that died (out of memory, a bug) fails its requests and is replaced
        this.workers = this.workers.filter((x) => x !== w);
        for (const [id, p] of this.pending) if (p.w === w) { this.pending.delete(id); p.reject(new Error(`codec thread: ${err.message ?? err}`)); }
      };
      w.on('error', fail);
      w.on('exit', (code) => fail(new Error(`exited with code ${code}`)));
      this.workers.push(w);
      return w;
    }
    // the least busy thread: a small body never waits behind a flood's large one
    // (there are as many background threads as requests at work)
    return mine.reduce((a, b) => (b.jobs < a.jobs ? b : a));
  }

  _run(msg, transfer, background) {
    return new Promise((resolve, reject) => {
      const id = ++this.seq;
      const w = this._worker(Boolean(background));
      w.jobs++;
      this.pending.set(id, { resolve, reject, w });
      w.postMessage({ ...msg, id }, transfer);
    });
  }

  // codec.decodeRequest, off the main thread when the body is large (on a
  // background thread for background work). body: a Buffer, or the chunks
  // it arrived in (moved to the thread, which joins them)
  async decode(route, ctype, body, background = true) {
    const chunks = Array.isArray(body) ? body : null;
    const size = chunks ? chunks.reduce((a, c) => a + c.length, 0) : body.length;
    if (size <= this.inlineBytes) return codec.decodeRequest(route, ctype, chunks ? Buffer.concat(chunks, size) : body);
    const own = (b) => (b.byteOffset === 0 && b.length === b.buffer.byteLength ? b.buffer : b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
    const bytes = chunks ? chunks.map(own) : own(body);
    return (await this._run({ op: 'decode', route, ctype, bytes }, chunks ? bytes : [bytes], background)).fields;
  }

  // codec.jsonBytes, off the main thread when `arrays` (typed arrays inside
  // obj, moved to the thread) hold more than inlineBytes
  async json(obj, arrays = [], background = true) {
    if (arrays.reduce((a, x) => a + x.byteLength, 0) <= this.inlineBytes) return codec.jsonBytes(obj);
    return Buffer.from((await this._run({ op: 'json', obj }, arrays.map((a) => a.buffer), background)).bytes);
  }

  // the threads' ids and priorities (Linux: os.getPriority of each thread), for tests
  async priorities() {
    return Promise.all(this.workers.map((w) => this._runOn(w, { op: 'priority' }).then((m) => ({ background: w.background, priority: m.priority }))));
  }

  _runOn(w, msg) {
    return new Promise((resolve, reject) => {
      const id = ++this.seq;
      w.jobs++;
      this.pending.set(id, { resolve, reject, w });
      w.postMessage({ ...msg, id });
    });
  }

  close() { for (const w of this.workers) w.terminate(); this.workers = []; }
}

module.exports = { CodecPool };
