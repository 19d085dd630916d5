'use strict';
// The tables of docs/reliability.md from a run.sh output directory.
//   node scripts/loadfault/report.js OUT_DIR
const fs = require('node:fs');
const path = require('node:path');

const dir = process.argv[2];
const reports = (prefix) => fs.readdirSync(dir).filter((d) => d.startsWith(prefix))
  .map((d) => path.join(dir, d, 'report.json')).filter((f) => fs.existsSync(f)).map((f) => JSON.parse(fs.readFileSync(f, 'utf8')));
const ms = (x) => (x === null || x === undefined ? '-' : x < 10 ? x.toFixed(1) : String(Math.round(x)));

for (const [prefix, title] of [['steady-', 'Load without faults'], ['fault-', 'Load and faults']]) {
  const faults = reports(prefix);
  if (!faults.length) continue;
  console.log(`${title}: ${faults[0].clients} clients x ${faults[0].agents_per_client} agents, ${faults[0].seconds} s each; machine: ${faults[0].machine}\n`);
  console.log('| service | store | faults | req/s (service CPU, cores) | p50 ms | p99 ms | lost acked writes | mixed-up | spurious errors | errors in fault windows | unsaved rolled back by kill -9 | RSS MB before / peak / after |');
  console.log('|---|---|---|---|---|---|---|---|---|---|---|---|');
  for (const r of faults) {
    const f = r.faults.map((x) => x.kind).reduce((a, k) => ({ ...a, [k]: (a[k] ?? 0) + 1 }), {});
    const down = r.faults.filter((x) => x.kind !== 'client').reduce((a, x) => a + x.window_ms, 0);
    console.log(`| ${r.service} | ${r.store} | ${Object.entries(f).map(([k, n]) => `${n} ${k}`).join(', ') || 'none'}${down ? ` (${Math.round(down / 1000)} s in windows)` : ''} | ${r.throughput_rps}${r.service_cores !== undefined ? ` (${r.service_cores})` : ''} | ${ms(r.p50_ms)} | ${ms(r.p99_ms)} | `
      + `${r.lost_acknowledged_writes} | ${r.mixed_up} | ${r.spurious_errors} | ${r.errors_in_fault_windows} | ${r.unsaved_rolled_back_by_kill9} | `
      + `${r.rss_mb.before} / ${r.rss_mb.peak} / ${r.rss_mb.after} |`);
  }
  console.log('');
}
const floods = reports('flood-');
if (floods.length) {
  console.log(`Flood: one client with 32 connections and the largest bodies and answers, another one request at a time; machine: ${floods[0].machine}\n`);
  console.log('| service | store | budget MB | light p50 / p99 ms alone | light p50 / p99 ms under flood | p99 ratio (per round) | light errors | flood answers (code: count) | RSS MB before / peak / after |');
  console.log('|---|---|---|---|---|---|---|---|---|');
  for (const r of floods) {
    const codes = {};
    for (const [k, n] of Object.entries(r.flood.codes)) { const c = k.split(' ').pop(); codes[c] = (codes[c] ?? 0) + n; }
    console.log(`| ${r.service} | ${r.store} | ${r.budget_mb} | ${ms(r.light_alone.p50_ms)} / ${ms(r.light_alone.p99_ms)} | `
      + `${ms(r.light_under_flood.p50_ms)} / ${ms(r.light_under_flood.p99_ms)} | ${r.p99_ratio.toFixed(2)} (${(r.round_p99_ratios ?? []).join(', ')}) | ${r.light_alone.errors + r.light_under_flood.errors} | `
      + `${Object.entries(codes).map(([c, n]) => `${c}: ${n}`).join(', ')} | ${r.rss_mb.before} / ${r.rss_mb.peak} / ${r.rss_mb.after} |`);
  }
}
