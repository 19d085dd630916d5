'use strict';
// Fair admission of requests to the service's work slots.
//
// `workers` requests are at work at once (reading their body, decoding it,
// running kvmem, writing the answer); the rest wait, unread, in one queue per
// client. A free slot goes to the waiting client with the fewest requests at
// work, ties to the one served least recently, so a client that floods the
// service with connections gets no more turns than one that sends a request
// now and then. One client holds at most `clientRunning` slots (by default all
// cores but one, and fewer than there are slots), so a newcomer never waits
// for a flood's requests to finish; and at most `clientQueue` requests (at work and waiting): the next
// one is refused at once (429), before its body is read.
//
// A request granted while its client has others in the service (waiting or
// at work) is background work (its release function's `background` is true):
// the service encodes and decodes it on codec threads at a lower CPU
// priority, so a client's backlog of large bodies and answers does not take
// the cores from clients that send one request at a time.

class QueueFullError extends Error {}
class DrainingError extends Error {}

class FairScheduler {
  constructor({ workers, clientRunning = Math.max(1, workers - 1), clientQueue = 64 }) {
    this.workers = workers;
    this.clientRunning = Math.min(clientRunning, workers);
    this.clientQueue = clientQueue;
    this.running = 0;
    this.queued = 0;
    this.clients = new Map(); // id -> {id, waiting: [], running, lastTurn}
    this.turn = 0;
    this.draining = false;
    this._idle = [];
  }

  // A promise of a release function; throws QueueFullError at once when the
  // client has clientQueue requests in already. `signal` (an AbortSignal) takes
  // a request that is still waiting out of its queue.
  acquire(clientId, signal) {
    if (this.draining) throw new DrainingError('the service is shutting down');
    let c = this.clients.get(clientId);
    if (!c) this.clients.set(clientId, c = { id: clientId, waiting: [], running: 0, lastTurn: 0 });
    if (c.waiting.length + c.running >= this.clientQueue)
      throw new QueueFullError(`client '${clientId}' has ${this.clientQueue} requests in the service already (waiting or at work): retry when one is answered`);
    return new Promise((resolve, reject) => {
      const w = { resolve, reject };
      c.waiting.push(w);
      this.queued++;
      if (signal) {
        const drop = () => {
          const i = c.waiting.indexOf(w);
          if (i < 0) return;
          c.waiting.splice(i, 1);
          this.queued--;
          this._forget(c);
          reject(signal.reason ?? new Error('aborted'));
        };
        if (signal.aborted) drop(); else signal.addEventListener('abort', drop, { once: true });
      }
      this._pump();
    });
  }

  _forget(c) {
    if (!c.running && !c.waiting.length) this.clients.delete(c.id);
    if (!this.running && !this.queued) for (const f of this._idle.splice(0)) f();
  }

  _pump() {
    while (this.running < this.workers) {
      let best = null;
      for (const c of this.clients.values()) {
        if (!c.waiting.length || c.running >= this.clientRunning) continue;
        if (!best || c.running < best.running || (c.running === best.running && c.lastTurn < best.lastTurn)) best = c;
      }
      if (!best) return;
      const w = best.waiting.shift();
      this.queued--;
      best.running++;
      best.lastTurn = ++this.turn;
      this.running++;
      let released = false;
      const release = () => {
        if (released) return;
        released = true;
        best.running--;
        this.running--;
        this._forget(best);
        this._pump();
      };
      release.background = best.waiting.length > 0 || best.running > 1;
      w.resolve(release);
    }
  }

  // Refuse what waits (DrainingError) and new requests; resolves once the
  // requests at work are released.
  drain() {
    this.draining = true;
    for (const c of this.clients.values()) {
      for (const w of c.waiting.splice(0)) { this.queued--; w.reject(new DrainingError('the service is shutting down')); }
      this._forget(c);
    }
    return new Promise((resolve) => { if (!this.running) resolve(); else this._idle.push(resolve); });
  }

  stats() { return { running: this.running, queued: this.queued, clients: this.clients.size }; }
}

module.exports = { FairScheduler, QueueFullError, DrainingError };
