'use strict';
// The flood run: one client floods the service (32 connections, the largest
// bodies and answers it takes) while another sends one small request at a
// time, in alternating phases: light alone, light under the flood, for
// --rounds rounds. Reports the light client's p50/p99 alone and
// under the flood, the flood's answers, and the service's RSS (sampled every
// 100 ms) against the configured memory budget.
//
//   node scripts/loadfault/flood.js --service node|go --store none|dir|redis [--budget 512M]
//        [--phase-seconds 15] [--rounds 2] [--go-bin PATH] [--out DIR] [--service-env K=V,...]
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { SPEC, call, percentile, sleep } = require('./lib');

const args = {};
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  if (a.startsWith('--')) args[a.slice(2)] = process.argv[++i];
}
const root = path.resolve(__dirname, '..', '..');
const phaseMs = Number(args['phase-seconds'] ?? 15) * 1000;
const out = path.resolve(args.out ?? fs.mkdtempSync(path.join(os.tmpdir(), 'kvmem-flood-')));
fs.mkdirSync(out, { recursive: true });
const t0 = Date.now();
const log = (m) => process.stderr.write(`[${((Date.now() - t0) / 1000).toFixed(1)}s] ${m}\n`);

const freePort = () => new Promise((resolve) => {
  const s = net.createServer().listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
});
const rssKb = (pid) => { try { return Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]); } catch { return 0; } };
const UNITS = { K: 1024, M: 1024 ** 2, G: 1024 ** 3 };
const bytes = (s) => { const m = /^(\d+)([KMG]?)$/i.exec(String(s)); return Number(m[1]) * (UNITS[m[2].toUpperCase()] ?? 1); };

// what main started, stopped by the failure handler too (a Redis left running otherwise)
const children = [];

async function main() {
  const port = await freePort(), base = `http://127.0.0.1:${port}`;
  let redis = null, store = '';
  if (args.store === 'redis') {
    const rp = await freePort();
    fs.mkdirSync(path.join(out, 'redis'), { recursive: true });
    redis = spawn('redis-server', ['--port', String(rp), '--bind', '127.0.0.1', '--dir', path.join(out, 'redis'), '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
    children.push(redis);
    await sleep(500);
    store = `redis://127.0.0.1:${rp}?pool=flood`;
  } else if (args.store === 'dir') {
    store = path.join(out, 'store');
    fs.mkdirSync(store, { recursive: true });
  }
  const budget = args.budget ?? '512M';
  const env = {
    ...process.env, HOST: '127.0.0.1', PORT: String(port), KVMEM_STORE: store, KVMEM_CLIENT_HEADER: 'x-client-id', KVMEM_MEMORY_BUDGET: budget,
    KVMEM_LAYERS: String(SPEC.L), KVMEM_Q_HEADS: String(SPEC.HQ), KVMEM_KV_HEADS: String(SPEC.HKV), KVMEM_HEAD_DIM: String(SPEC.D),
  };
  delete env.KVMEM_STORE_DIR;
  for (const kv of (args['service-env'] ?? '').split(',').filter(Boolean)) { const [k, v] = kv.split('='); env[k] = v; }
  const [cmd, argv] = args.service === 'go' ? [args['go-bin'] ?? path.join(out, 'memsvc'), []]
    : [process.execPath, [path.join(root, 'examples', 'node', 'memory-service', 'server.js')]];
  const fd = fs.openSync(path.join(out, `service-${args.service}.log`), 'a');
  const svc = spawn(cmd, argv, { env, stdio: ['ignore', fd, fd] });
  children.push(svc);
  let health;
  for (let i = 0; i < 600; i++) {
    health = await call(base, 'GET', '/health', { timeoutMs: 2000 });
    if (health.code === 200) break;
    await sleep(100);
  }
  if (health.code !== 200) throw new Error(`the service did not answer /health (its log: ${path.join(out, `service-${args.service}.log`)})`);
  const limits = health.body.limits;
  log(`${args.service} on ${base}, store ${args.store}, budget ${budget}: pool ${limits.pool_capacity_bytes} bytes, ${limits.workers} workers`);
  const rounds = Number(args.rounds ?? 2);
  const phases = Array.from({ length: 2 * rounds }, (_, i) => ({ kind: i % 2 ? 'flood' : 'alone', start: Date.now() + 500 + i * phaseMs, rssPeakKb: 0 }));
  const end = phases[phases.length - 1].start + phaseMs;
  const rssBefore = rssKb(svc.pid);
  let rssPeak = 0;
  const sampler = setInterval(() => {
    const r = rssKb(svc.pid);
    rssPeak = Math.max(rssPeak, r);
    const p = phases.find((ph) => Date.now() >= ph.start && Date.now() < ph.start + phaseMs);
    if (p) p.rssPeakKb = Math.max(p.rssPeakKb, r);
  }, 100);
  const client = (mode, until) => {
    const c = spawn(process.execPath, [path.join(__dirname, 'flood-client.js'), '--mode', mode, '--base', base, '--until', String(until), '--dir', out,
      '--max-body', String(limits.max_body_bytes), '--max-response', String(limits.max_response_bytes)], { stdio: ['ignore', 'inherit', 'inherit'] });
    c.exited = new Promise((r) => c.on('exit', r));
    return c;
  };
  // the Node service's event-loop delay, per second, read from /health
  const loopDelays = [];
  const poller = setInterval(async () => {
    const h = await call(base, 'GET', '/health', { timeoutMs: 5000 });
    if (h.body?.event_loop_delay_ms) loopDelays.push({ t: Date.now(), ...h.body.event_loop_delay_ms });
  }, 1000);
  await sleep(Math.max(0, phases[0].start - Date.now()));
  const light = client('light', end);
  for (const p of phases) {
    await sleep(Math.max(0, p.start - Date.now()));
    log(`phase ${p.kind}`);
    if (p.kind === 'flood') {
      const f = client('flood', p.start + phaseMs);
      await sleep(Math.max(0, p.start + phaseMs - Date.now()));
      f.kill('SIGTERM'); // what it has in flight is cut: a client gone mid-request
      await f.exited;
    }
  }
  await light.exited;
  await sleep(1000);
  const rssAfter = rssKb(svc.pid);
  clearInterval(sampler);
  clearInterval(poller);
  const pool = (await call(base, 'GET', '/health')).body.pool;
  svc.kill('SIGTERM');
  await new Promise((r) => svc.on('exit', r));
  if (redis) redis.kill('SIGKILL');

  const rows = fs.readFileSync(path.join(out, 'light.jsonl'), 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
  const inPhase = (kind) => rows.filter((r) => r.op !== 'mixed' && phases.some((p) => p.kind === kind && r.t >= p.start + 1000 && r.t < p.start + phaseMs));
  const summary = (xs) => ({ n: xs.length, p50_ms: percentile(xs.map((r) => r.ms), 50), p99_ms: percentile(xs.map((r) => r.ms), 99),
    errors: xs.filter((r) => r.code !== 200).length });
  const alone = summary(inPhase('alone')), flooded = summary(inPhase('flood'));
  // each round's ratio (a flood phase against the alone phase before it): the machine's own
  // noise moves both, so their spread says how far one ratio can be trusted
  const inOne = (p) => rows.filter((r) => r.op !== 'mixed' && r.t >= p.start + 1000 && r.t < p.start + phaseMs);
  const roundRatios = [];
  for (let i = 0; i + 1 < phases.length; i += 2) {
    const a = summary(inOne(phases[i])), f = summary(inOne(phases[i + 1]));
    roundRatios.push(Math.round((f.p99_ms / a.p99_ms) * 100) / 100);
  }
  const floods = fs.readdirSync(out).filter((f) => /^flood-\d+\.json$/.test(f)).map((f) => JSON.parse(fs.readFileSync(path.join(out, f), 'utf8')));
  const fcodes = {};
  for (const f of floods) for (const [k, n] of Object.entries(f.codes)) fcodes[k] = (fcodes[k] ?? 0) + n;
  const report = {
    service: args.service, store: args.store, budget_mb: Math.round(bytes(budget) / 2 ** 20), limits,
    machine: `${os.cpus().length} vCPU ${os.cpus()[0]?.model ?? ''}, load average at the end ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}`,
    light_alone: alone, light_under_flood: flooded, p99_ratio: flooded.p99_ms / alone.p99_ms, round_p99_ratios: roundRatios,
    light_mixed_up: rows.filter((r) => r.op === 'mixed').length,
    flood: { codes: fcodes, ok_per_s: Math.round(floods.reduce((a, f) => a + f.lat.length, 0) / (2 * phaseMs / 1000)),
      sent_mb: Math.round(floods.reduce((a, f) => a + f.bytes_sent, 0) / 2 ** 20), json_tokens: floods[0]?.json_tokens, bin_tokens: floods[0]?.bin_tokens },
    rss_mb: { before: Math.round(rssBefore / 1024), peak: Math.round(rssPeak / 1024), after: Math.round(rssAfter / 1024),
      peak_per_phase: phases.map((p) => `${p.kind} ${Math.round(p.rssPeakKb / 1024)}`) },
    within_budget: rssPeak * 1024 <= bytes(budget), pool_after: pool,
    ...(loopDelays.length ? { event_loop_delay_max_ms: Object.fromEntries(['alone', 'flood'].map((kind) => [kind,
      Math.max(0, ...loopDelays.filter((d) => phases.some((p) => p.kind === kind && d.t >= p.start + 1000 && d.t < p.start + phaseMs)).map((d) => d.max))])) } : {}),
    out,
  };
  fs.writeFileSync(path.join(out, 'report.json'), JSON.stringify(report, null, 1));
  process.stdout.write(JSON.stringify(report) + '\n');
}

main().catch((e) => {
  console.error(e);
  for (const c of children) c.kill('SIGKILL');
  process.exit(2);
});
