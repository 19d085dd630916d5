'use strict';
// The load-and-fault run: N client processes x M agents each against one
// memory service (Node or Go) on a directory or a Redis store, for a set
// time, with kill -9 of the service, of Redis and of clients, and SIGTERM of
// the service, spread over the run. Every read is checked against what the
// agent was given (client.js). At the end the service is stopped with SIGTERM
// and started again, and every agent is read back whole against the clients'
// journals. Reports throughput, p50/p99 per operation, lost acknowledged
// writes, mixed-up agents, spurious errors (outside the fault windows), and
// the service's RSS before, at its peak and after.
//
//   node scripts/loadfault/loadfault.js --service node|go --store dir|redis [--seconds 60] [--clients 8]
//        [--agents 8] [--faults] [--go-bin PATH] [--out DIR] [--budget 1G]
//
// (scripts/loadfault/run.sh builds the Go service and runs the whole matrix.)
const { spawn, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { SPEC, call, percentile, sleep } = require('./lib');

const args = {};
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  if (a.startsWith('--')) args[a.slice(2)] = process.argv[i + 1]?.startsWith('--') || i + 1 >= process.argv.length ? true : process.argv[++i];
}
const root = path.resolve(__dirname, '..', '..');
const seconds = Number(args.seconds ?? 60), nClients = Number(args.clients ?? 8), nAgents = Number(args.agents ?? 8);
const out = path.resolve(args.out ?? fs.mkdtempSync(path.join(os.tmpdir(), 'kvmem-loadfault-')));
fs.mkdirSync(out, { recursive: true });
const log = (m) => process.stderr.write(`[${((Date.now() - t0) / 1000).toFixed(1)}s] ${m}\n`);
const t0 = Date.now();

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

// ---- Redis -----------------------------------------------------------------

async function redisUp(port) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1', () => { s.write('*1\r\n$4\r\nPING\r\n'); });
    s.on('data', (d) => { s.destroy(); resolve(d.toString().startsWith('+PONG')); });
    s.on('error', () => resolve(false));
  });
}

function startRedis(port, dir) {
  // every write in the append-only file before Redis answers it: a kill -9 of
  // Redis then loses nothing it acknowledged (the kernel keeps what was written)
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '',
    '--appendonly', 'yes', '--appendfsync', 'always'], { stdio: ['ignore', fs.openSync(path.join(out, 'redis.log'), 'a'), 'inherit'] });
  child.exited = new Promise((r) => child.on('exit', r));
  return child;
}

// ---- the service -----------------------------------------------------------

function rssKb(pid) {
  try {
    const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    return Number(/VmRSS:\s+(\d+)/.exec(s)?.[1] ?? 0);
  } catch { return 0; }
}

// CPU seconds a process has used (user + system)
function cpuSeconds(pid) {
  try {
    const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return (Number(f[11]) + Number(f[12])) / 100;
  } catch { return 0; }
}

function serviceCmd() {
  if (args.service === 'go') return [args['go-bin'] ?? path.join(out, 'memsvc'), []];
  return [process.execPath, [path.join(root, 'examples', 'node', 'memory-service', 'server.js')]];
}

async function startService(env) {
  const [cmd, argv] = serviceCmd();
  const fd = fs.openSync(path.join(out, `service-${args.service}.log`), 'a');
  const child = spawn(cmd, argv, { env, stdio: ['ignore', fd, fd] });
  child.exited = new Promise((r) => child.on('exit', (c, sig) => r(c ?? sig)));
  const base = `http://127.0.0.1:${env.PORT}`;
  for (let i = 0; i < 600; i++) {
    const r = await call(base, 'GET', '/healthz', { timeoutMs: 2000 });
    if (r.code === 200) return child;
    if (child.exitCode !== null) throw new Error(`the service exited with ${child.exitCode} (see ${out}/service-${args.service}.log)`);
    await sleep(100);
  }
  throw new Error('the service did not become healthy in 60 s');
}

// ---- the run ---------------------------------------------------------------

async function main() {
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  let redis = null, redisPort = null, store;
  if (args.store === 'redis') {
    redisPort = await freePort();
    fs.mkdirSync(path.join(out, 'redis'), { recursive: true });
    redis = startRedis(redisPort, path.join(out, 'redis'));
    for (let i = 0; i < 100 && !(await redisUp(redisPort)); i++) await sleep(50);
    store = `redis://127.0.0.1:${redisPort}?pool=loadfault`;
  } else {
    store = path.join(out, 'store');
    fs.mkdirSync(store, { recursive: true });
  }
  const env = {
    ...process.env, HOST: '127.0.0.1', PORT: String(port), KVMEM_STORE: store, KVMEM_CLIENT_HEADER: 'x-client-id',
    KVMEM_LAYERS: String(SPEC.L), KVMEM_Q_HEADS: String(SPEC.HQ), KVMEM_KV_HEADS: String(SPEC.HKV), KVMEM_HEAD_DIM: String(SPEC.D),
    KVMEM_MEMORY_BUDGET: args.budget ?? '1G',
  };
  delete env.KVMEM_STORE_DIR;
  let svc = await startService(env);
  const rss = { before_kb: rssKb(svc.pid), peak_kb: 0, after_kb: 0 };
  // the service's CPU: its instances' last readings, summed (a killed one's from just before)
  let cpuDone = 0, cpuNow = 0;
  const loadStart = Date.now();
  const sampler = setInterval(() => { rss.peak_kb = Math.max(rss.peak_kb, rssKb(svc.pid)); cpuNow = cpuSeconds(svc.pid) || cpuNow; }, 250);
  log(`${args.service} service on ${base}, store ${args.store}, RSS ${rss.before_kb} kB`);

  const until = Date.now() + seconds * 1000;
  const clients = new Map();
  const startClient = (c) => {
    const child = spawn(process.execPath, [path.join(__dirname, 'client.js'), '--base', base, '--client', String(c), '--agents', String(nAgents),
      '--until', String(until), '--dir', out, '--seed', String(args.seed ?? 1)], { stdio: ['ignore', 'inherit', 'inherit'] });
    child.exited = new Promise((r) => child.on('exit', r));
    clients.set(c, child);
  };
  for (let c = 0; c < nClients; c++) startClient(c);

  // faults: [kind, start, end of the window (recovered + grace)]
  const faults = [];
  const GRACE = 2000;
  const healthy = async () => { for (;;) { const r = await call(base, 'GET', '/healthz', { timeoutMs: 2000 }); if (r.code === 200) return; await sleep(50); } };
  const plan = args.faults ? (redis ? ['client', 'service-kill', 'redis-kill', 'service-term', 'client', 'service-kill', 'redis-kill']
    : ['client', 'service-kill', 'service-term', 'client', 'service-kill', 'service-term']) : [];
  const every = (seconds * 1000) / (plan.length + 1);
  for (const [i, kind] of plan.entries()) {
    await sleep(Math.max(0, t0 + every * (i + 1) - Date.now()));
    const f = { kind, start: Date.now() };
    if (kind === 'client') {
      const c = Math.floor(Math.random() * nClients);
      clients.get(c).kill('SIGKILL');
      await clients.get(c).exited;
      await sleep(500);
      startClient(c);
      f.detail = `client ${c}`;
    } else if (kind === 'service-kill' || kind === 'service-term') {
      rss.peak_kb = Math.max(rss.peak_kb, rssKb(svc.pid));
      const t = Date.now();
      cpuNow = cpuSeconds(svc.pid) || cpuNow;
      svc.kill(kind === 'service-kill' ? 'SIGKILL' : 'SIGTERM');
      f.exit = await svc.exited;
      f.stop_ms = Date.now() - t;
      cpuDone += cpuNow;
      cpuNow = 0;
      svc = await startService(env);
      await healthy();
    } else if (kind === 'redis-kill') {
      redis.kill('SIGKILL');
      await redis.exited;
      await sleep(1000);
      redis = startRedis(redisPort, path.join(out, 'redis'));
      for (let j = 0; j < 200 && !(await redisUp(redisPort)); j++) await sleep(50);
      await healthy();
    }
    f.end = Date.now() + GRACE;
    faults.push(f);
    log(`fault ${kind}${f.detail ? ` (${f.detail})` : ''}${f.exit !== undefined ? `, exit ${f.exit} after ${f.stop_ms} ms` : ''}`);
  }
  await sleep(Math.max(0, until - Date.now()));
  await Promise.race([Promise.all([...clients.values()].map((c) => c.exited)), sleep(60000)]);
  for (const c of clients.values()) if (c.exitCode === null) c.kill('SIGTERM');
  clearInterval(sampler);
  rss.peak_kb = Math.max(rss.peak_kb, rssKb(svc.pid));
  rss.after_kb = rssKb(svc.pid);
  const serviceCores = (cpuDone + cpuSeconds(svc.pid)) / ((Date.now() - loadStart) / 1000);
  log(`load over; RSS ${rss.after_kb} kB (peak ${rss.peak_kb} kB)`);

  // the final check: a graceful restart, then every agent read back whole
  const tStop = Date.now();
  svc.kill('SIGTERM');
  const finalExit = await svc.exited;
  const finalStopMs = Date.now() - tStop;
  svc = await startService(env);
  const v = spawnSync(process.execPath, [path.join(__dirname, 'client.js'), '--verify', '--base', base, '--dir', out], { encoding: 'utf8' });
  const verify = JSON.parse(v.stdout.trim().split('\n').pop() || '{}');
  svc.kill('SIGTERM');
  await svc.exited;
  if (redis) { redis.kill('SIGTERM'); await redis.exited; }

  // ---- the report ----------------------------------------------------------
  const stats = fs.readdirSync(out).filter((f) => /^stats-c\d+-\d+\.json$/.test(f)).map((f) => JSON.parse(fs.readFileSync(path.join(out, f), 'utf8')));
  const events = fs.readdirSync(out).filter((f) => /^events-c.*\.jsonl$/.test(f))
    .flatMap((f) => fs.readFileSync(path.join(out, f), 'utf8').split('\n').filter(Boolean).map((l) => { try { return JSON.parse(l); } catch { return null; } }))
    .filter(Boolean);
  const inWindow = (t) => faults.some((f) => t >= f.start && t <= f.end);
  const killedBetween = (a, b) => faults.some((f) => f.kind === 'service-kill' && f.start >= a && f.start <= b);
  const lat = {}, codes = {};
  let ok = 0, total = 0;
  for (const s of stats) {
    for (const [op, xs] of Object.entries(s.lat)) (lat[op] ??= []).push(...xs);
    for (const [k, n] of Object.entries(s.codes)) { codes[k] = (codes[k] ?? 0) + n; total += n; if (k.endsWith(' 200')) ok += n; }
  }
  const all = Object.values(lat).flat();
  const spurious = events.filter((e) => e.kind === 'spurious' || (e.kind === 'error' && !inWindow(e.t)));
  // saved tokens missing: lost, whatever happened
  const lostDurable = events.filter((e) => e.kind === 'lost' || (e.kind === 'verify-short' && e.found < e.saved));
  // acknowledged tokens rolled back with no kill -9 of the service since the acknowledged request
  // was sent (the service answered it at some point after that): lost too (a SIGTERM, a Redis
  // or client kill must keep them)
  const lostRollback = events.filter((e) => (e.kind === 'rollback' || (e.kind === 'verify-short' && e.found >= e.saved))
    && !killedBetween(e.last_ack ?? 0, e.t));
  const report = {
    service: args.service, store: args.store, seconds, clients: nClients, agents_per_client: nAgents,
    machine: `${os.cpus().length} vCPU ${os.cpus()[0]?.model ?? ''}, load average at the end ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}`,
    requests: total, ok, throughput_rps: Math.round(ok / seconds), service_cores: Math.round(serviceCores * 100) / 100,
    p50_ms: percentile(all, 50), p99_ms: percentile(all, 99),
    per_op: Object.fromEntries(Object.entries(lat).map(([op, xs]) => [op, { n: xs.length, p50_ms: percentile(xs, 50), p99_ms: percentile(xs, 99) }])),
    codes,
    faults: faults.map((f) => ({ kind: f.kind, at_s: Math.round((f.start - t0) / 100) / 10, at_ms: f.start, window_ms: f.end - f.start,
      ...(f.exit !== undefined ? { exit: f.exit } : {}) })),
    errors_in_fault_windows: events.filter((e) => e.kind === 'error' && inWindow(e.t)).length,
    conflicts_after_restart: events.filter((e) => e.kind === 'conflict-after-restart').length,
    unsaved_rolled_back_by_kill9: events.filter((e) => e.kind === 'rollback' || e.kind === 'verify-short').length - lostRollback.length,
    lost_acknowledged_writes: lostDurable.length + lostRollback.length,
    mixed_up: events.filter((e) => e.kind === 'mixed').length,
    spurious_errors: spurious.length,
    verify: { ...verify, final_sigterm_exit: finalExit, final_stop_ms: finalStopMs },
    rss_mb: { before: Math.round(rss.before_kb / 1024), peak: Math.round(rss.peak_kb / 1024), after: Math.round(rss.after_kb / 1024) },
    examples: { spurious: spurious.slice(0, 5), lost: [...lostDurable, ...lostRollback].slice(0, 5), mixed: events.filter((e) => e.kind === 'mixed').slice(0, 3) },
    out,
  };
  fs.writeFileSync(path.join(out, 'report.json'), JSON.stringify(report, null, 1));
  process.stdout.write(JSON.stringify(report) + '\n');
}

main().catch((e) => { console.error(e); process.exit(2); });
