// Compiled with tsc --strict against index.d.ts, then run against the binding
// (test/types.test.js): the declarations and the runtime must agree.
import * as kvmem from '../..';

const L = 2, HQ = 4, HKV = 2, D = 8, T = 6;

function check(ok: boolean, what: string): void {
  if (!ok) throw new Error(`types example: ${what}`);
}

async function main(): Promise<void> {
  const ctx = new kvmem.Context({ backend: 'cpu', nThreads: 1 });
  const spec: kvmem.ModelSpec = { nLayers: L, nQHeads: HQ, nKvHeads: HKV, headDim: D, modelId: 'ts' };
  const pool: kvmem.Pool = ctx.poolCreate(spec, { blockSize: 2, storageDtype: 'f32' });
  const full: kvmem.FullModelSpec = pool.getSpec();
  check(full.nLayers === L && full.modelId === 'ts' && full.layerWindow === null, 'getSpec');

  const agent = pool.agentOpen('alice');
  const k = Float32Array.from({ length: L * T * HKV * D }, (_, i) => Math.sin(i));
  await agent.appendAsync(k, k, { tokenIds: Int32Array.from({ length: T }, (_, t) => t), text: 'hello' });
  agent.flush();
  const info: kvmem.AgentInfo = agent.getInfo();
  check(info.nTokens === T && info.nSealed === 3 && info.textBytes === 5, 'getInfo');
  const block: kvmem.BlockInfo = agent.blockInfo(0);
  check(block.sealed === true && block.firstToken === 0, 'blockInfo');

  const q = new Float32Array(L * HQ * D).fill(1);
  const hits: kvmem.Retrieval = await agent.retrieveAsync(q, { topK: 2, scope: kvmem.SCOPE_GLOBAL });
  const { blocks, scores } = hits.get();
  check(blocks.length === 2 && scores.length === 2, 'retrieve');
  const mem: kvmem.ReadResult = await agent.gatherAsync(blocks, 0);
  check(mem.shape[1] === 4 && mem.k !== null, 'gather');
  const pm: kvmem.PrefixMatch = agent.prefixMatch('hello world');
  check(pm.kind === kvmem.PREFIX_EXTEND && pm.reuseTokens === T, 'prefixMatch');
  const { stats } = await kvmem.attendAsync(ctx, new Float32Array(HQ * D), { agent, layer: 1, tauS: 0, tauD: 0 });
  const s: kvmem.AttendStats = stats;
  check(s.stoppedEarly === false && s.tilesVisited > 0, 'attend');

  try {
    await agent.readAsync(0, 1000);
    check(false, 'readAsync past the end');
  } catch (e) {
    check(e instanceof kvmem.InvalidArgumentError && (e as kvmem.KvmemError).code === 'KVMEM_ERR_INVALID_ARG', 'error class');
  }

  ctx.close();
  console.log('types example ok');
}

// What the types refuse: each line must be a compile error, or tsc fails on
// the unused @ts-expect-error. Never called.
function refused(ctx: kvmem.Context, agent: kvmem.Agent): void {
  // @ts-expect-error the C spelling of a spec key is not part of the typed API
  ctx.poolCreate({ n_layers: 2, nQHeads: 4, nKvHeads: 2, headDim: 8 });
  // @ts-expect-error results are camelCase
  console.log(agent.getInfo().n_tokens);
  // @ts-expect-error options are camelCase
  agent.read(0, 1, { k_out: null });
  // @ts-expect-error a spec needs its geometry
  ctx.poolCreate({ nLayers: 2 });
  // @ts-expect-error sealed is a boolean
  const sealed: number = agent.blockInfo(0).sealed;
  void sealed;
}
void refused;

main().catch((e: unknown) => { console.error(e); process.exitCode = 1; });
