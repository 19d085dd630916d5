// Type declarations for the kvmem Node.js binding (hand-written; keep in step with index.js).

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

/** kvmem_model_spec (C field names). */
export interface ModelSpec {
  n_layers: number; n_q_heads: number; n_kv_heads: number; head_dim: number;
  rotary_dim?: number; rope_style?: number; rope_theta?: number; rope_scaling?: number;
  rope_factor?: number; rope_low_freq_factor?: number; rope_high_freq_factor?: number;
  rope_original_max_pos?: number; yarn_beta_fast?: number; yarn_beta_slow?: number;
  yarn_attn_factor?: number; layer_window?: Int32Like | null; model_id?: string;
}
export interface PoolParams {
  blockSize?: number; storageDtype?: StorageDType; capacityBytes?: number;
  maxAgents?: number; maxTokensPerAgent?: number;
  /** a directory where agents persist (AGENT_ID.safetensors) */
  storeDir?: string; hostBudgetBytes?: number;
}
export interface PoolInfo { used_bytes: number; capacity_bytes: number; n_agents: number; block_size: number; storage_dtype: number; }
export interface AgentInfo { n_tokens: number; n_blocks: number; n_sealed: number; bytes: number; text_bytes: number; }
export interface BlockInfo { first_token: number; n_tokens: number; sealed: number; }
export interface BackendInfo { name: string; available: boolean; detail: string; }
export interface AppendOptions {
  tokenIds?: Int32Like; text?: string | Buffer; tokenTextOffsets?: Int32Like;
  /** positions the keys were rotated at (post-RoPE keys) */
  positions?: Int32Like; keysRotated?: boolean; dtype?: DType;
}
export interface ReadOptions { kOut?: TensorLike; vOut?: TensorLike; dtype?: DType; keys?: boolean; values?: boolean; }
export interface ReadResult<T = Float32Array | Uint16Array> { k: T | null; v: T | null; shape: number[]; }

declare class Handle {
  /** the C pointer; throws ClosedError once closed */
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
  poolCreate(spec: ModelSpec, params?: PoolParams): Pool;
}

export class Pool extends Handle {
  constructor(ctx: Context, spec: ModelSpec, params?: PoolParams);
  readonly context: Context;
  readonly spec: Required<ModelSpec>;
  getInfo(): PoolInfo;
  getSpec(): Required<ModelSpec>;
  agentId(index: number): string;
  agentIds(): string[];
  agentOpen(id: string): Agent;
  removeAgent(id: string): void;
  sync(): void;
  syncAsync(): Promise<void>;
  segmentsCreate(owner: string, params?: { static_after_steps?: number; max_segments?: number }): Segments;
}

export class Agent extends Handle {
  constructor(pool: Pool, id: string);
  readonly pool: Pool;
  readonly id: string;
  /** k, v: [n_layers][T][n_kv_heads][head_dim] */
  append(k: TensorLike, v: TensorLike, opts?: AppendOptions): void;
  appendAsync(k: TensorLike, v: TensorLike, opts?: AppendOptions): Promise<void>;
  flush(): void;
  getInfo(): AgentInfo;
  blockInfo(block: number): BlockInfo;
  read(first?: number, n?: number, opts?: ReadOptions): ReadResult;
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
  prefixMatch(newText: string | Buffer, opts?: { minRatio?: number }): { kind: number; reuse_tokens: number; common_bytes: number; process_from: number };
  /** kvmem_retrieve: query [n_q][n_layers][n_q_heads][head_dim], raw (pre-RoPE). */
  retrieve(query: TensorLike, opts?: RetrieveOptions): Retrieval;
  retrieveAsync(query: TensorLike, opts?: RetrieveOptions): Promise<Retrieval>;
  /** kvmem_gather: sealed blocks concatenated and re-encoded at positions basePosition.. */
  gather(blocks: Int32Like, basePosition?: number, opts?: ReadOptions): ReadResult;
  gatherAsync(blocks: Int32Like, basePosition?: number, opts?: ReadOptions): Promise<ReadResult>;
}

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

export interface SegmentEvent { kind: number; group: number; segment: number; step: number; }
export interface SegmentsInfo { step: number; n_segments: number; n_indices: number; n_groups: number; n_static: number; n_events: number; }
export interface SegmentInfo { group: number; alive: number; has_kv: number; last_update: number; n_tokens: number; }
export interface GroupInfo { state: number; n_members: number; has_kv: number; last_change: number; n_tokens: number; }
export interface SegmentUnit { kind: number; group: number; segment: number; needs_compute: number; score: number; first_token: number; n_tokens: number; agent_id: string; }

/** kvmem_segments: a KEEP segment store whose KV lives in a Pool. */
export class Segments extends Handle {
  constructor(pool: Pool, owner: string, params?: { static_after_steps?: number; max_segments?: number });
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

export function clusterKmeans(emb: ArrayLike<number>, n: number, dim: number, params?: { k?: number; max_iters?: number; seed?: number | bigint }):
  { labels: Int32Array; centroids: Float32Array; iters: number };
export function multihopSelect(q2s: ArrayLike<number>, nQuery: number, s2s: ArrayLike<number>, nSegments: number,
  candidates?: ArrayLike<number> | null, params?: { ratio?: number; max_iters?: number }):
  { selected: Uint8Array; importance: Float32Array; result: { n_selected: number; iters: number; converged: number } };
export function multihopSchedule(nLayers: number, avg: number): Float32Array;
export function loadPlan(computeMs: ArrayLike<number>, nLayers: number, loadBytes: ArrayLike<number | bigint>, nSegments: number,
  recompute: ArrayLike<number>, params?: { bandwidth_gbps?: number; max_ahead?: number }):
  { items: { segment: number; layer: number; issue_layer: number; start_ms: number; end_ms: number }[]; layerStartMs: Float64Array; stats: Record<string, number> };
export const GROUP_DYNAMIC: 0, GROUP_STATIC: 1;
export const SEG_EVENT_SEGMENT_STALE: 1, SEG_EVENT_GROUP_STATIC: 2, SEG_EVENT_GROUP_DYNAMIC: 3;
export const SEG_UNIT_SEGMENT: 0, SEG_UNIT_GROUP: 1;
export const RETRIEVE_AABB: 0, RETRIEVE_EXACT: 1, NORM_SOFTMAX: 0, NORM_RR: 1, AGG_MAX: 0, AGG_SUM: 1, SCOPE_GLOBAL: 0, SCOPE_PER_LAYER: 1;

export function modelSpec(fields?: Partial<ModelSpec> & { layerWindow?: Int32Like }): Required<ModelSpec>;
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

// ---- IntentKV ----
export interface SessionKey { hi: bigint | number; lo: bigint | number; kind: number; }
export class QmemStore extends Handle {
  constructor(spec: ModelSpec, params?: { capacity?: number; prefix_tokens?: number; lambda?: number });
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
export function h2oAccumulate(probs: ArrayLike<number>, nRows: number, n: number, acc: Float32Array): Float32Array;
export function h2oKeep(acc: ArrayLike<number>, budget: number, recent: number): Int32Array;
export function snapkvScore(ctx: Context, spec: ModelSpec, qObs: TensorLike, k: TensorLike, poolKernel?: number, dtype?: DType): Float32Array;
export class KVStore extends Handle {
  constructor(spec: ModelSpec, params?: { page_slots?: number; max_slots?: number });
  getInfo(): { n_slots: number; n_used: number; n_free: number; page_slots: number; dead_slot: number };
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
  getInfo(): { length: number; n_live: number; protect: number; n_parked: number };
  gather(dtype?: DType): { k: Float32Array | Uint16Array; v: Float32Array | Uint16Array; positions: Int32Array; shape: number[] };
}
export const SESSION_EXPLICIT: 1, SESSION_MARKED: 2, SESSION_PREFIX: 3, SESSION_LOCAL: 4, DEAD_SLOT: 0, SENTINEL_K: number;

// ---- ART attention ----
export interface AttendOptions {
  agent?: Agent; layer?: number; positions?: Int32Like; basePosition?: number;
  k?: TensorLike; v?: TensorLike; slots?: Int32Like; deadSlot?: number;
  mask?: ArrayLike<number>; out?: TensorLike; dtype?: DType; tileOrder?: Int32Like;
  order?: number; n_sink?: number; tile_size?: number; scale?: number; tau_s?: number; tau_d?: number;
  patience?: number; probe?: number; causal?: number; compare?: number;
}
export interface AttendStats {
  n_streams: number; tiles_total: number; tiles_visited: number; streams_stopped: number;
  oracle_tiles: number; oracle_agree: number; positions_read: number; stopped_early: number;
}
/** kvmem_attend: q [n_rows][n_q_heads][head_dim] post-RoPE over an agent layer, tensors or a slot map. */
export function attend(ctx: Context, q: TensorLike, opts: AttendOptions): { out: TensorData; stats: AttendStats };
export function attendAsync(ctx: Context, q: TensorLike, opts: AttendOptions): Promise<{ out: TensorData; stats: AttendStats }>;
export const ATTEND_SRC_TENSORS: 0, ATTEND_SRC_AGENT: 1, ATTEND_SRC_SLOTMAP: 2;
export const ATTEND_RECENT: 0, ATTEND_IMPORTANCE: 1, ATTEND_INDEX: 2, ATTEND_PROBE_STRIDED: 0, ATTEND_PROBE_ORACLE: 1;
export const ATTEND_MAX_ROWS: 64, ATTEND_PROBE_SIZE: 32;

// ---- Persistence, prefix, batch ----
export function batchMerge(agents: Agent[], layer: number, opts?: { maxLen?: number; dtype?: DType; kOut?: TensorLike; vOut?: TensorLike }):
  { k: TensorData; v: TensorData; lengths: number[]; shape: number[] };
export function batchExtract(batch: TensorView, row: number, length: number, first: number, n: number, opts?: { out?: TensorLike; dtype?: DType }): TensorData;
export const PREFIX_EXACT: 0, PREFIX_EXTEND: 1, PREFIX_DIVERGE: 2;
