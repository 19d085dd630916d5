'use strict';
// Fair turns: a free slot goes to the client with the fewest requests at
// work (then the one served least recently), one client never holds every
// slot, and a client's requests beyond its queue are refused at once.
const test = require('node:test');
const assert = require('node:assert/strict');
const { FairScheduler, QueueFullError, DrainingError } = require('../lib/sched');

const tick = () => new Promise((r) => setImmediate(r));

// submit(client, label): records the label when the request gets its slot
function recorder(s) {
  const order = [], releases = {};
  const submit = (client, label, signal) => s.acquire(client, signal).then((rel) => { order.push(label); releases[label] = rel; }, () => order.push(`${label}:refused`));
  return { order, releases, submit };
}

test('sched: a flood of one client does not delay another beyond the request at work', async () => {
  const s = new FairScheduler({ workers: 1, clientRunning: 1, clientQueue: 100 });
  const { order, releases, submit } = recorder(s);
  for (let i = 0; i < 20; i++) submit('flood', `f${i}`);
  await tick();
  submit('light', 'l0');
  await tick();
  assert.deepEqual(order, ['f0']);
  releases.f0();
  await tick();
  assert.deepEqual(order, ['f0', 'l0'], 'the light client goes before the flood\'s second request');
  submit('light', 'l1');
  releases.l0();
  await tick();
  // turns alternate while both wait
  assert.deepEqual(order, ['f0', 'l0', 'f1']);
  releases.f1();
  await tick();
  assert.deepEqual(order, ['f0', 'l0', 'f1', 'l1']);
});

test('sched: one client holds at most clientRunning slots; a newcomer takes the one left', async () => {
  const s = new FairScheduler({ workers: 3, clientQueue: 100 });
  assert.equal(s.clientRunning, 2);
  const { order, releases, submit } = recorder(s);
  for (let i = 0; i < 5; i++) submit('flood', `f${i}`);
  await tick();
  assert.deepEqual(order, ['f0', 'f1'], 'the third slot stays free for others');
  assert.deepEqual(s.stats(), { running: 2, queued: 3, clients: 1 });
  submit('light', 'l0');
  await tick();
  assert.deepEqual(order, ['f0', 'f1', 'l0'], 'at once, without waiting for the flood');
  releases.l0();
  releases.f0();
  await tick();
  assert.deepEqual(order, ['f0', 'f1', 'l0', 'f2']);
});

test('sched: requests beyond a client\'s queue are refused at once; others are not affected', async () => {
  const s = new FairScheduler({ workers: 1, clientQueue: 3 });
  const { order, releases, submit } = recorder(s);
  for (let i = 0; i < 3; i++) submit('a', `a${i}`);
  assert.throws(() => s.acquire('a'), QueueFullError);
  submit('b', 'b0');
  await tick();
  releases.a0();
  await tick();
  assert.deepEqual(order, ['a0', 'b0']);
  submit('a', 'a3'); // a has room again: a1, a2 wait
  assert.throws(() => s.acquire('a'), /client 'a' has 3 requests in the service already/);
});

test('sched: a request whose client went away leaves the queue; drain refuses what waits', async () => {
  const s = new FairScheduler({ workers: 1, clientQueue: 10 });
  const { order, releases, submit } = recorder(s);
  submit('a', 'a0');
  const ac = new AbortController();
  submit('a', 'a1', ac.signal);
  submit('b', 'b0');
  await tick();
  ac.abort();
  await tick();
  assert.deepEqual(s.stats(), { running: 1, queued: 1, clients: 2 });
  let drained = false;
  const d = s.drain().then(() => { drained = true; });
  await tick();
  assert.deepEqual(order, ['a0', 'a1:refused', 'b0:refused']);
  assert.equal(drained, false, 'drain waits for the request at work');
  assert.throws(() => s.acquire('c'), DrainingError);
  releases.a0();
  await d;
  assert.deepEqual(s.stats(), { running: 0, queued: 0, clients: 0 });
});

test('sched: the requests of a client with others in the service are background work, a lone request is not', async () => {
  const s = new FairScheduler({ workers: 3, clientRunning: 2, clientQueue: 10 });
  const { order, releases, submit } = recorder(s);
  for (const l of ['f0', 'f1', 'f2']) submit('flood', l);
  submit('light', 'l0');
  await tick();
  assert.deepEqual(order, ['f0', 'f1', 'l0']);
  // f0 was alone when it came; f1 came to work beside f0 with f2 waiting
  assert.deepEqual(Object.fromEntries(order.map((l) => [l, releases[l].background])), { f0: false, f1: true, l0: false });
  for (const l of ['l0', 'f0', 'f1']) releases[l]();
  await tick();
  releases.f2();
  submit('flood', 'f3'); // alone in the service now
  await tick();
  assert.equal(releases.f3.background, false);
});
