// Type declarations for the kvmem Node.js binding (hand-written; keep in step with
// index.js; test/types/example.ts compiles against them with tsc --strict).
//
// Every key of a spec, an options object or a result is the camelCase form of
// its C field (n_kv_heads -> nKvHeads); unknown keys are refused at run time.

export type DType = 'f32' | 'f16' | 'bf16' | 0 | 1 | 2;
export type StorageDType = DType | 'q8' | 'q4' | 'q4_kivi' | 3 | 4 | 5;
/** Memory a tensor is read from or written to, without copying. */
export type TensorData = Float32Array | Uint16Array | Uint8Array | ArrayBuffer | DataView;
/** A strided view: shape and strides in elements, as in C's kvmem_tensor. */
export interface TensorView { data: TensorData; shape: number[]; strides?: number[]; dtype?: DType; }
export type TensorLike = TensorData | TensorView;
export type Int32Like = Int32Array | ArrayLike<number>;

export class KvmemError extends Error {
  /** kvmem_status: a negative code */
  status: number;
  /** C name of the status, e.g. "KVMEM_ERR_INVALID_ARG" */
  code: string;
}
export class InvalidArgumentError extends KvmemError {}
export class NoMemoryError extends KvmemError {}
export class CapacityError extends KvmemError {}
export class NotFoundError extends KvmemError {}
export class ExistsError extends KvmemError {}
export class ClosedError extends KvmemError {}
export class UnsupportedError extends KvmemError {}
export class BackendError extends KvmemError {}
export class IOError extends KvmemError {}
export class FormatError extends KvmemError {}
export class CorruptError extends KvmemError {}
export class MismatchError extends KvmemError {}
export class ConflictError extends KvmemError {}
export class InternalError extends KvmemError {}
export class BusyError extends KvmemError {}
/** The KvmemError subclass of a kvmem_status (KvmemError itself for an unknown code). */
export function errorFor(status: number, message: string, code?: string): KvmemError;

/** kvmem_model_spec: optional fields left out keep kvmem_model_spec_default()'s values. */
export interface ModelSpec {
  nLayers: number; nQHeads: number; nKvHeads: number; headDim: number;
  /** 0: head_dim */
  rotaryDim?: number; ropeStyle?: number; ropeTheta?: number; ropeScaling?: number;
  ropeFactor?: number; ropeLowFreqFactor?: number; ropeHighFreqFactor?: number;
  ropeOriginalMaxPos?: number; yarnBetaFast?: number; yarnBetaSlow?: number;
  yarnAttnFactor?: number;
  /** per-layer sliding window (0: full attention), nLayers entries, or null */
  layerWindow?: Int32Like | null; modelId?: string;
}
/** A spec as kvmem returns it: every field present. */
export interface FullModelSpec extends Required<Omit<ModelSpec, 'layerWindow'>> { layerWindow: number[] | null; }
export interface PoolParams {
  blockSize?: number; storageDtype?: StorageDType; capacityBytes?: number;
  maxAgents?: number; maxTokensPerAgent?: number;
  /** a directory where agents persist (AGENT_ID.safetensors) */
  storeDir?: string; hostBudgetBytes?: number;
  /** device bytes the agents' device-resident mirrors may hold (0: no limit); past it closed
   * agents' mirrors give way, then an agent is served from the host copy (same results) */
  deviceCapacityBytes?: number;
}
export interface PoolInfo { usedBytes: number; capacityBytes: number; nAgents: number; blockSize: number; storageDtype: number; }
export interface AgentInfo { nTokens: number; nBlocks: number; nSealed: number; bytes: number; textBytes: number; }
export interface BlockInfo { firstToken: number; nTokens: number; sealed: boolean; }
export interface BackendInfo { name: string; available: boolean; detail: string; }
export interface AppendOptions {
  tokenIds?: Int32Like; text?: string | Buffer; tokenTextOffsets?: Int32Like;
  /** positions the keys were rotated at (post-RoPE keys) */
  positions?: Int32Like; keysRotated?: boolean; dtype?: DType;
}
export interface ReadOptions { kOut?: TensorLike; vOut?: TensorLike; dtype?: DType; keys?: boolean; values?: boolean; }
export interface ReadResult<T = Float32Array | Uint16Array> { k: T | null; v: T | null; shape: number[]; }

/**
 * Async calls (`...Async`): each runs on a worker thread and takes its turn among the
 * async calls made on the same object, in the order they were made. From the moment
 * it is made until its promise settles the object is busy: a synchronous call on it
 * throws BusyError (await the promise first), and close() throws BusyError. Inputs
 * (tensors, token ids, text, block lists) are copied when the call is made, so the
 * caller may reuse its arrays at once; outputs (kOut, vOut, out) are written when the
 * call runs and are ready when the promise resolves. Argument errors throw at the
 * call; failures of the C call reject.
 */
declare class Handle {
  /** the C pointer; throws ClosedError once closed, BusyError while an async call on it is pending */
  readonly handle: unknown;
  readonly closed: boolean;
  /** Free the C object; later calls do nothing. Throws BusyError while an async call runs on it. */
  close(): void;
  [Symbol.dispose](): void;
}

export class Context extends Handle {
  constructor(opts?: { backend?: 'cpu' | 'cuda' | 'vulkan' | 'auto' | string; nThreads?: number });
  readonly backend: string;
  readonly nThreads: number;
  /** the message of the last failed call on this context (attend, qmemScore), whichever thread ran it */
  lastError(): string;
  /** (experimental) bytes moved to (h2d) and from (d2h) the context's backend buffers */
  transferStats(): { h2dBytes: number; d2hBytes: number };
  transferReset(): void;
  /** (experimental) the Vulkan objects a "vulkan" context runs on */
  vulkanDevice(): { instance: unknown; physicalDevice: unknown; device: unknown; queue: unknown; queueFamily: number; apiVersion: number };
  /** (experimental) a tensor in device memory, taken where tensors are taken on a context of that backend */
  deviceTensor(opts: { kind: 'cuda' | 'vulkan'; handle: number | bigint; size: number | bigint; dtype?: DType;
                       shape: number[]; strides?: number[]; offset?: number | bigint; device?: number }): { close(): void };
  poolCreate(spec: ModelSpec, params?: PoolParams): Pool;
}

export class Pool extends Handle {
  constructor(ctx: Context, spec: ModelSpec, params?: PoolParams);
  readonly context: Context;
  readonly spec: FullModelSpec;
  getInfo(): PoolInfo;
  /** getInfo on a worker thread (the pool's mutex may be held by a spill to the store) */
  getInfoAsync(): Promise<PoolInfo>;
  getSpec(): FullModelSpec;
  /** (experimental) the device-resident mirrors: bytes held, evictions, calls served without one */
  deviceStats(): { mirrorBytes: number; evictions: number; unmirrored: number };
  agentId(index: number): string;
  agentIds(): string[];
  agentOpen(id: string): Agent;
  /** agentOpen on a worker thread: an agent moved to the store is read back there */
  agentOpenAsync(id: string): Promise<Agent>;
  /** kvmem_agent_open_file (experimental): a saved agent opened in place, read-only; its KV stays in the file. */
  agentOpenFile(path: string, opts?: { verify?: boolean }): Agent;
  removeAgent(id: string): void;
  /** removeAgent on a worker thread: the removal waits for the pool's mutex and deletes the agent from the store */
  removeAgentAsync(id: string): Promise<void>;
  sync(): void;
  /** kvmem_pool_sync on a worker thread; the pool is busy until it settles (see Handle) */
  syncAsync(): Promise<void>;
  /** the message of the last failed call on this pool (sync, agentOpen, ...), whichever thread ran it */
  lastError(): string;
  segmentsCreate(owner: string, params?: SegmentsParams): Segments;
}

export class Agent extends Handle {
  constructor(pool: Pool, id: string);
  readonly pool: Pool;
  readonly id: string;
  /** the message of the last failed call on this agent, whichever thread ran it */
  lastError(): string;
  /** k, v: [n_layers][T][n_kv_heads][head_dim] */
  append(k: TensorLike, v: TensorLike, opts?: AppendOptions): void;
  /** append on a worker thread, after the agent's earlier async calls; k, v and opts' arrays are copied at the call */
  /** copy: false leaves the inputs uncopied: keep them untouched until the promise settles */
  appendAsync(k: TensorLike, v: TensorLike, opts?: AppendOptions & { copy?: boolean }): Promise<void>;
  flush(): void;
  flushAsync(): Promise<void>;
  /** close on a worker thread, after the async calls made before it */
  closeAsync(): Promise<void>;
  getInfo(): AgentInfo;
  blockInfo(block: number): BlockInfo;
  read(first?: number, n?: number, opts?: ReadOptions): ReadResult;
  /** read on a worker thread, after the agent's earlier async calls (n omitted: to the end as it is then) */
  readAsync(first?: number, n?: number, opts?: ReadOptions): Promise<ReadResult>;
  blockAabb(block: number): { min: Float32Array; max: Float32Array };
  tokens(first?: number, n?: number): Int32Array;
  textBytes(): Buffer;
  text(): string;
  save(path?: string | URL | null): void;
  saveAsync(path?: string | URL | null): Promise<void>;
  load(path?: string | URL | null): void;
  loadAsync(path?: string | URL | null): Promise<void>;
  truncate(nTokens: number): void;
  prefixMatch(newText: string | Buffer, opts?: { minRatio?: number }): PrefixMatch;
  /** kvmem_retrieve: query [n_q][n_layers][n_q_heads][head_dim], raw (pre-RoPE). */
  retrieve(query: TensorLike, opts?: RetrieveOptions): Retrieval;
  /** retrieve on a worker thread; the query and block lists are copied at the call; opts.result is busy until it settles */
  retrieveAsync(query: TensorLike, opts?: RetrieveOptions): Promise<Retrieval>;
  /** kvmem_gather: sealed blocks concatenated and re-encoded at positions basePosition.. */
  gather(blocks: Int32Like, basePosition?: number, opts?: ReadOptions): ReadResult;
  /** gather on a worker thread, after the agent's earlier async calls; blocks copied at the call */
  gatherAsync(blocks: Int32Like, basePosition?: number, opts?: ReadOptions): Promise<ReadResult>;
}

/** kvmem_prefix_match; processFrom is a byte offset into the UTF-8 text */
export interface PrefixMatch { kind: number; reuseTokens: number; commonBytes: number; processFrom: number; }

export interface RetrieveOptions {
  topK?: number; mode?: number; norm?: number; agg?: number; scope?: number; tau?: number; rrC?: number;
  exclude?: Int32Like; alwaysInclude?: Int32Like; recentWindow?: number; skipRecent?: number;
  /** a Retrieval to fill again instead of a new one */
  result?: Retrieval; dtype?: DType;
}

/** kvmem_retrieval: the reusable result of Agent.retrieve. */
export class Retrieval extends Handle {
  constructor();
  readonly nSets: number;
  /** blocks (chronological) and their scores of a set, copied */
  get(set?: number): { blocks: Int32Array; scores: Float32Array };
  view(set?: number): { blocks: Int32Array; scores: Float32Array };
  /** S(b) of every sealed block at retrieval time (NaN: not a candidate) */
  blockScores(set?: number): Float32Array;
  nTokens(set?: number): number;
}

export interface SegmentsParams { staticAfterSteps?: number; maxSegments?: number; }
export interface SegmentEvent { kind: number; group: number; segment: number; step: number; }
export interface SegmentsInfo { step: number; nSegments: number; nIndices: number; nGroups: number; nStatic: number; nEvents: number; }
export interface SegmentInfo { group: number; alive: boolean; hasKv: boolean; lastUpdate: number; nTokens: number; }
export interface GroupInfo { state: number; nMembers: number; hasKv: boolean; lastChange: number; nTokens: number; }
export interface SegmentUnit { kind: number; group: number; segment: number; needsCompute: boolean; score: number; firstToken: number; nTokens: number; agentId: string; }

/** kvmem_segments: a KEEP segment store whose KV lives in a Pool. */
export class Segments extends Handle {
  constructor(pool: Pool, owner: string, params?: SegmentsParams);
  readonly pool: Pool;
  add(name: string, group: number): number;
  update(index: number): void;
  remove(index: number): void;
  assign(index: number, group: number): void;
  step(): void;
  drainEvents(max?: number): SegmentEvent[];
  storeSegment(index: number, k: TensorLike, v: TensorLike, opts?: AppendOptions): void;
  storeGroup(group: number, k: TensorLike, v: TensorLike, opts?: AppendOptions): void;
  getInfo(): SegmentsInfo;
  segmentInfo(index: number): SegmentInfo;
  groupInfo(group: number): GroupInfo;
  find(name: string): number;
  name(index: number): string;
  groupMembers(group: number): number[];
  plan(scores?: ArrayLike<number> | null, maxUnits?: number): SegmentUnit[];
}

export function clusterKmeans(emb: ArrayLike<number>, n: number, dim: number, params?: { k?: number; maxIters?: number; seed?: number | bigint }):
  { labels: Int32Array; centroids: Float32Array; iters: number };
export function multihopSelect(q2s: ArrayLike<number>, nQuery: number, s2s: ArrayLike<number>, nSegments: number,
  candidates?: ArrayLike<number> | null, params?: { ratio?: number; maxIters?: number }):
  { selected: Uint8Array; importance: Float32Array; result: { nSelected: number; iters: number; converged: boolean } };
export function multihopSchedule(nLayers: number, avg: number): Float32Array;
export function loadPlan(computeMs: ArrayLike<number>, nLayers: number, loadBytes: ArrayLike<number | bigint>, nSegments: number,
  recompute: ArrayLike<number>, params?: { bandwidthGbps?: number; maxAhead?: number }):
  { items: { segment: number; layer: number; issueLayer: number; startMs: number; endMs: number }[]; layerStartMs: Float64Array; stats: LoadPlanStats };
export interface LoadPlanStats {
  naiveMakespanMs: number; naiveComputeIdleMs: number; naiveLoadIdleMs: number;
  balancedMakespanMs: number; balancedComputeIdleMs: number; balancedLoadIdleMs: number;
  computeMs: number; loadMs: number; nLoads: number | bigint;
}
export const GROUP_DYNAMIC: 0, GROUP_STATIC: 1;
export const SEG_EVENT_SEGMENT_STALE: 1, SEG_EVENT_GROUP_STATIC: 2, SEG_EVENT_GROUP_DYNAMIC: 3;
export const SEG_UNIT_SEGMENT: 0, SEG_UNIT_GROUP: 1;
export const RETRIEVE_AABB: 0, RETRIEVE_EXACT: 1, NORM_SOFTMAX: 0, NORM_RR: 1, AGG_MAX: 0, AGG_SUM: 1, SCOPE_GLOBAL: 0, SCOPE_PER_LAYER: 1;

export function modelSpec(fields?: Partial<ModelSpec>): FullModelSpec;
export function specValidate(spec: ModelSpec): void;
/** Rotate rows (head vectors) of x in place, one position per row. */
export function ropeApply(spec: ModelSpec, x: Float32Array, positions: Int32Like, opts?: { inverse?: boolean; stride?: number }): void;
export function backends(): BackendInfo[];
export function logSet(fn: ((level: number, message: string) => void) | null): void;
export function version(): string;
export function versionNumber(): number;
export function statusStr(status: number): string;
export function lastError(): string;
export function dtypeName(dtype: number): string;
export function agentIdValid(id: string): boolean;

export const F32: 0, F16: 1, BF16: 2, Q8: 3, Q4: 4, Q4_KIVI: 5;
export const ROPE_NEOX: 0, ROPE_GPTJ: 1;
export const ROPE_SCALING_NONE: 0, ROPE_SCALING_LINEAR: 1, ROPE_SCALING_LLAMA3: 2, ROPE_SCALING_YARN: 3;
export const LOG_DEBUG: 0, LOG_INFO: 1, LOG_WARN: 2, LOG_ERROR: 3;
export const libraryPath: string;
/** Whether the binding declares the C function `name` and the loaded library has it. */
export function hasFunction(name: string): boolean;
/** Low level: the kvmem_tensor descriptor (koffi struct object) a call would hand to C for x,
 *  `shape` the shape it expects (-1: inferred). Throws as the calls do. */
export function tensor(x: TensorLike, what: string, shape: number[] | null, dtype?: DType): unknown;
/** Low level, unstable: the koffi layer (lib.js): C functions by their C names, the loaded library's path. */
export const _lib: { libraryPath: string; fns: Record<string, (...args: any[]) => any>; declared: Record<string, string> };

// ---- IntentKV ----
export interface SessionKey { hi: bigint | number; lo: bigint | number; kind: number; }
export class QmemStore extends Handle {
  constructor(spec: ModelSpec, params?: { capacity?: number; prefixTokens?: number; lambda?: number });
  sessionKey(src?: { sessionId?: string | null; tokenIds?: Int32Like | null; mark?: [number, number] | null }): SessionKey;
  /** q: [n_q][n_layers][n_q_heads][head_dim] post-RoPE; returns the new memory [n_layers][n_q_heads][head_dim] */
  update(key: SessionKey, q: TensorLike, spanBegin: number, spanEnd: number, dtype?: DType): Float32Array;
  get(key: SessionKey): Float32Array;
  readonly count: number;
}
export class QmemHead extends Handle {
  static load(path: string | URL): QmemHead;
  static fromBuffer(data: ArrayBufferView | ArrayBuffer): QmemHead;
  readonly headDim: number;
  readonly alpha: number;
  apply(spec: ModelSpec, memory: ArrayLike<number>, k: TensorLike, rule: ArrayLike<number>, spanBegin: number, spanEnd: number, dtype?: DType): Float32Array;
}
export function qmemScore(ctx: Context, spec: ModelSpec, memory: ArrayLike<number>, k: TensorLike, dtype?: DType): Float32Array;
export function selectKeep(scores: ArrayLike<number>, budget: number, protect?: number, span?: [number, number]): Int32Array;
export function streamingKeep(n: number, nSink: number, window: number): Int32Array;
/** kvmem_arrange (experimental): the order to gather `blocks` in, first = farthest from the new tokens.
 *  'score': ascending score (the most relevant block last); 'chrono': ascending id (scores may be null);
 *  'runs': runs of adjacent ids kept whole, the runs by ascending best score. */
export function arrange(blocks: Int32Like, scores?: ArrayLike<number> | null, order?: ArrangeOrder): Int32Array;
export type ArrangeOrder = 'chrono' | 'score' | 'runs';
/** kvmem_window_plan: retrieved memory in whole blocks, the blocks to retrieve, the live context. */
export interface WindowPlan { memoryTokens: number; topK: number; liveTokens: number; }
/** kvmem_window_split (experimental): share a window of `window` tokens, `reserve` for the turn itself. */
export function windowSplit(window: number, reserve: number, memoryShare: number, liveShare: number, blockSize: number): WindowPlan;
export function h2oAccumulate(probs: ArrayLike<number>, nRows: number, n: number, acc: Float32Array): Float32Array;
export function h2oKeep(acc: ArrayLike<number>, budget: number, recent: number): Int32Array;
export function snapkvScore(ctx: Context, spec: ModelSpec, qObs: TensorLike, k: TensorLike, poolKernel?: number, dtype?: DType): Float32Array;
export class KVStore extends Handle {
  constructor(spec: ModelSpec, params?: { pageSlots?: number; maxSlots?: number });
  getInfo(): { nSlots: number; nUsed: number; nFree: number; pageSlots: number; deadSlot: number };
  slotRefs(slot: number): number;
  readSlot(slot: number): { k: Float32Array; v: Float32Array };
  slotmapCreate(): SlotMap;
}
export class SlotMap extends Handle {
  readonly store: KVStore;
  fork(prefixLen: number): SlotMap;
  append(k: TensorLike, v: TensorLike, dtype?: DType): void;
  setProtected(protect: number): void;
  evict(kept: Int32Like): number;
  compact(kept: Int32Like): number;
  slots(): { slots: Int32Array; deadSlot: number };
  getInfo(): { length: number; nLive: number; protect: number; nParked: number };
  gather(dtype?: DType): { k: Float32Array | Uint16Array; v: Float32Array | Uint16Array; positions: Int32Array; shape: number[] };
}
export const SESSION_EXPLICIT: 1, SESSION_MARKED: 2, SESSION_PREFIX: 3, SESSION_LOCAL: 4, DEAD_SLOT: 0, SENTINEL_K: number;

// ---- ART attention ----
export interface AttendOptions {
  agent?: Agent; layer?: number; positions?: Int32Like; basePosition?: number;
  k?: TensorLike; v?: TensorLike; slots?: Int32Like; deadSlot?: number;
  mask?: ArrayLike<number>; out?: TensorLike; dtype?: DType; tileOrder?: Int32Like;
  order?: number; nSink?: number; tileSize?: number; scale?: number; tauS?: number; tauD?: number;
  patience?: number; probe?: number; causal?: number | boolean; compare?: number | boolean;
}
export interface AttendStats {
  nStreams: number; tilesTotal: number; tilesVisited: number; streamsStopped: number;
  oracleTiles: number; oracleAgree: number; positionsRead: number; stoppedEarly: boolean;
}
/** kvmem_attend: q [n_rows][n_q_heads][head_dim] post-RoPE over an agent layer, tensors or a slot map. */
export function attend(ctx: Context, q: TensorLike, opts: AttendOptions): { out: TensorData; stats: AttendStats };
/** attend on a worker thread: with an agent source, after that agent's earlier async calls (the agent is busy until it
 * settles); q, k, v, positions, slots, mask and tileOrder are copied at the call; the context stays open until it settles */
export function attendAsync(ctx: Context, q: TensorLike, opts: AttendOptions): Promise<{ out: TensorData; stats: AttendStats }>;
export const ATTEND_SRC_TENSORS: 0, ATTEND_SRC_AGENT: 1, ATTEND_SRC_SLOTMAP: 2;
export const ATTEND_RECENT: 0, ATTEND_IMPORTANCE: 1, ATTEND_INDEX: 2, ATTEND_SCORED: 3, ATTEND_PROBE_STRIDED: 0, ATTEND_PROBE_ORACLE: 1;
export const ATTEND_MAX_ROWS: 64, ATTEND_PROBE_SIZE: 32;

// ---- Persistence, prefix, batch ----
export function batchMerge(agents: Agent[], layer: number, opts?: { maxLen?: number; dtype?: DType; kOut?: TensorLike; vOut?: TensorLike }):
  { k: TensorData; v: TensorData; lengths: number[]; shape: number[] };
export function batchExtract(batch: TensorView, row: number, length: number, first: number, n: number, opts?: { out?: TensorLike; dtype?: DType }): TensorData;
export const PREFIX_EXACT: 0, PREFIX_EXTEND: 1, PREFIX_DIVERGE: 2;
