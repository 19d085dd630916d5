// TypeScript types of kvmem.js, the JavaScript API of kvmem's WebAssembly build.
//
// Names and conventions are the Node binding's (bindings/node/index.d.ts;
// bindings/README.md, "Names"): keys are the C field names in lowerCamelCase,
// methods the C function's words after kvmem_ with the object they are called
// on left out, results camelCase with booleans for C's 0/1 flags; unknown keys
// are refused at run time. The instance `km` from load() stands where Node's
// module does (km.Context, km.attend, km.NORM_RR, km.NotFoundError).
// Arrays passed in are copied into the wasm heap for the call; arrays returned
// are copies (never views of the heap). Objects that own wasm memory have
// close(); using one afterwards throws ClosedError. Tensors are f32
// (Float32Array); other dtypes throw UnsupportedError.
// The wasm tests check that this file declares exactly what the objects have
// (wasm/tests/names.mjs).

export declare const Status: Readonly<{
  OK: 0; INVALID_ARG: -1; NOMEM: -2; CAPACITY: -3; NOT_FOUND: -4; EXISTS: -5; CLOSED: -6;
  UNSUPPORTED: -7; BACKEND: -8; IO: -9; FORMAT: -10; CORRUPT: -11; MISMATCH: -12;
  CONFLICT: -13; INTERNAL: -14; BUSY: -15;
}>;

/** A failed kvmem call: the C status, its name and kvmem_last_error()'s message
 *  (the message starts with the name: "KVMEM_ERR_NOT_FOUND: ..."). */
export declare class KvmemError extends Error {
  /** kvmem_status: a negative code */
  readonly status: number;
  /** C name of the status, e.g. "KVMEM_ERR_INVALID_ARG" */
  readonly code: string;
  /** @deprecated the same as `code` */
  readonly statusName: string;
}
export declare class InvalidArgumentError extends KvmemError {}
export declare class NoMemoryError extends KvmemError {}
export declare class CapacityError extends KvmemError {}
export declare class NotFoundError extends KvmemError {}
export declare class ExistsError extends KvmemError {}
export declare class ClosedError extends KvmemError {}
/** a kvmem feature or a key the WebAssembly build does not have (a GPU backend, storeDir, f16 tensors) */
export declare class UnsupportedError extends KvmemError {}
export declare class BackendError extends KvmemError {}
export declare class IOError extends KvmemError {}
export declare class FormatError extends KvmemError {}
export declare class CorruptError extends KvmemError {}
export declare class MismatchError extends KvmemError {}
export declare class ConflictError extends KvmemError {}
export declare class InternalError extends KvmemError {}
export declare class BusyError extends KvmemError {}

/** The error classes, on the module instance as on Node's module. */
export interface ErrorClasses {
  KvmemError: typeof KvmemError; InvalidArgumentError: typeof InvalidArgumentError; NoMemoryError: typeof NoMemoryError;
  CapacityError: typeof CapacityError; NotFoundError: typeof NotFoundError; ExistsError: typeof ExistsError;
  ClosedError: typeof ClosedError; UnsupportedError: typeof UnsupportedError; BackendError: typeof BackendError;
  IOError: typeof IOError; FormatError: typeof FormatError; CorruptError: typeof CorruptError;
  MismatchError: typeof MismatchError; ConflictError: typeof ConflictError; InternalError: typeof InternalError;
  BusyError: typeof BusyError;
}

/** The C enums under the Node binding's names (also on the module instance). */
export interface Constants {
  readonly F32: 0; readonly F16: 1; readonly BF16: 2; readonly Q8: 3; readonly Q4: 4; readonly Q4_KIVI: 5;
  readonly ROPE_NEOX: 0; readonly ROPE_GPTJ: 1;
  readonly ROPE_SCALING_NONE: 0; readonly ROPE_SCALING_LINEAR: 1; readonly ROPE_SCALING_LLAMA3: 2; readonly ROPE_SCALING_YARN: 3;
  readonly RETRIEVE_AABB: 0; readonly RETRIEVE_EXACT: 1; readonly NORM_SOFTMAX: 0; readonly NORM_RR: 1;
  readonly AGG_MAX: 0; readonly AGG_SUM: 1; readonly SCOPE_GLOBAL: 0; readonly SCOPE_PER_LAYER: 1;
  readonly ATTEND_RECENT: 0; readonly ATTEND_IMPORTANCE: 1; readonly ATTEND_INDEX: 2; readonly ATTEND_SCORED: 3;
  readonly ATTEND_PROBE_STRIDED: 0; readonly ATTEND_PROBE_ORACLE: 1; readonly ATTEND_MAX_ROWS: 64; readonly ATTEND_PROBE_SIZE: 32;
  readonly PREFIX_EXACT: 0; readonly PREFIX_EXTEND: 1; readonly PREFIX_DIVERGE: 2;
}
export declare const CONSTANTS: Constants;

// Enums go by number (the constants) or by name.
export type RetrieveMode = 'aabb' | 'exact' | 0 | 1;
export type RetrieveNorm = 'softmax' | 'rr' | 0 | 1;
export type RetrieveAgg = 'max' | 'sum' | 0 | 1;
export type RetrieveScope = 'global' | 'per-layer' | 0 | 1;
export type AttendOrder = 'recent' | 'importance' | 'index' | 'scored' | 0 | 1 | 2 | 3;
export type AttendProbe = 'strided' | 'oracle' | 0 | 1;
/** tensors: f32 only in this build */
export type DType = 'f32' | 'float32' | 0;
export type StorageDType = 'f32' | 'f16' | 'bf16' | 'q8' | 'q4' | 'q4_kivi' | 0 | 1 | 2 | 3 | 4 | 5;

/** A strided view: shape and strides in elements, as in C's kvmem_tensor. */
export interface TensorView { data: Float32Array; shape: number[]; strides?: number[]; dtype?: DType; }
/** A flat Float32Array (read in the shape the call expects) or a view. */
export type TensorLike = Float32Array | TensorView;
export type Int32Like = Int32Array | ArrayLike<number>;

/** kvmem_model_spec: optional fields left out keep kvmem_model_spec_default()'s values. */
export interface ModelSpec {
  nLayers: number; nQHeads: number; nKvHeads: number; headDim: number;
  /** 0: headDim */
  rotaryDim?: number;
  ropeStyle?: 'neox' | 'gptj' | number;
  /** default 10000 */
  ropeTheta?: number;
  ropeScaling?: 'none' | 'linear' | 'llama3' | 'yarn' | number;
  ropeFactor?: number; ropeLowFreqFactor?: number; ropeHighFreqFactor?: number;
  ropeOriginalMaxPos?: number; yarnBetaFast?: number; yarnBetaSlow?: number; yarnAttnFactor?: number;
  /** per-layer sliding window (0: full attention), nLayers entries, or null */
  layerWindow?: Int32Like | null;
  modelId?: string;
}
/** A spec as kvmem returns it: every field present, enums as numbers. */
export interface FullModelSpec {
  nLayers: number; nQHeads: number; nKvHeads: number; headDim: number; rotaryDim: number; ropeStyle: number;
  ropeTheta: number; ropeScaling: number; ropeFactor: number; ropeLowFreqFactor: number; ropeHighFreqFactor: number;
  ropeOriginalMaxPos: number; yarnBetaFast: number; yarnBetaSlow: number; yarnAttnFactor: number;
  layerWindow: number[] | null; modelId: string;
}

/** kvmem_pool_params (storeDir: UnsupportedError, the module has no file store). */
export interface PoolParams {
  /** power of two in [1, 4096]; default 16 */
  blockSize?: number;
  /** default 'f16' */
  storageDtype?: StorageDType;
  /** 0 = unlimited */
  capacityBytes?: number;
  maxAgents?: number; maxTokensPerAgent?: number; hostBudgetBytes?: number;
  /** device bytes the agents' device-resident mirrors may hold (0: no limit; the module has no device) */
  deviceCapacityBytes?: number;
  /** @deprecated storageDtype */
  storage?: StorageDType;
}

export interface PoolInfo { usedBytes: number; capacityBytes: number; nAgents: number; blockSize: number; storageDtype: number; }
export interface AgentInfo { nTokens: number; nBlocks: number; nSealed: number; bytes: number; textBytes: number; }
export interface BlockInfo { firstToken: number; nTokens: number; sealed: boolean; }

export interface AppendOptions {
  tokenIds?: Int32Like | null; text?: string | Uint8Array | null; tokenTextOffsets?: Int32Like | null;
  /** positions the keys were rotated at (post-RoPE keys; kvmem de-rotates them) */
  positions?: Int32Like | null; keysRotated?: boolean; dtype?: DType;
}
export interface ReadOptions { kOut?: TensorLike; vOut?: TensorLike; dtype?: DType; keys?: boolean; values?: boolean; }
/** [nLayers][n][nKvHeads][headDim]; kOut/vOut as given when given, null when skipped */
export interface ReadResult { k: Float32Array | TensorView | null; v: Float32Array | TensorView | null; shape: number[]; }

/** Defaults are kvmem_retrieve_default_params()'s. */
export interface RetrieveOptions {
  topK?: number; mode?: RetrieveMode; norm?: RetrieveNorm; agg?: RetrieveAgg; scope?: RetrieveScope;
  /** 0 = 1/sqrt(headDim) */
  tau?: number;
  /** 0 = 60 */
  rrC?: number;
  exclude?: Int32Like; alwaysInclude?: Int32Like; recentWindow?: number; skipRecent?: number;
  /** a Retrieval to fill (and return) instead of a new result */
  result?: Retrieval;
  dtype?: DType;
}

export interface RetrievalSet {
  /** selected block ids, chronological */
  blocks: Int32Array;
  /** their aggregated scores S(b) */
  scores: Float32Array;
  /** tokens in the selected blocks */
  nTokens: number;
  /** S(b) of every sealed block (NaN: not a candidate) */
  blockScores: Float32Array;
}

/** The readers of a retrieval, Node's Retrieval methods (set: 0, or the layer with 'per-layer' scope). */
export interface RetrievalReader {
  /** one set (global scope) or one per layer (per-layer) */
  readonly nSets: number;
  /** every set as plain data */
  readonly sets: RetrievalSet[];
  /** the selected blocks (chronological) and their scores, copied */
  get(set?: number): { blocks: Int32Array; scores: Float32Array };
  view(set?: number): { blocks: Int32Array; scores: Float32Array };
  /** S(b) of every sealed block at retrieval time (NaN: not a candidate) */
  blockScores(set?: number): Float32Array;
  nTokens(set?: number): number;
  close(): void;
}

/** Defaults are kvmem_attend_default_params()'s. */
export interface AttendParams {
  order?: AttendOrder;
  nSink?: number;
  tileOrder?: Int32Like;
  /** tensors only (0 = 16); agent tiles are its blocks */
  tileSize?: number;
  /** 0 = 1/sqrt(headDim) */
  scale?: number;
  tauS?: number;
  tauD?: number;
  patience?: number;
  probe?: AttendProbe;
  causal?: boolean | number;
  compare?: boolean | number;
}
/** kvmem_attend's source and output: { agent, layer, positions | basePosition } or { k, v, mask }.
 *  slots/deadSlot (slot maps): UnsupportedError. */
export interface AttendOptions extends AttendParams {
  agent?: Agent; layer?: number; positions?: Int32Like | null; basePosition?: number;
  k?: TensorView; v?: TensorView; mask?: Uint8Array | ArrayLike<number> | null;
  out?: TensorLike; dtype?: DType;
}
export interface AttendStats {
  nStreams: number; tilesTotal: number; tilesVisited: number; streamsStopped: number;
  oracleTiles: number; oracleAgree: number; positionsRead: number; stoppedEarly: boolean;
}
export interface AttendResult {
  /** [nRows][nQHeads][headDim]: `out` when given */
  out: Float32Array | TensorLike;
  stats: AttendStats;
}
export interface AttendDefaultParams {
  order: number; nSink: number; tileSize: number; scale: number; tauS: number; tauD: number;
  patience: number; probe: number; causal: boolean; compare: boolean;
}

/** kvmem_prefix_match; processFrom is a byte offset into the UTF-8 text */
export interface PrefixMatch { kind: number; reuseTokens: number; commonBytes: number; processFrom: number; }

export interface DemoScript {
  model: { id: string; nLayers: number; nQHeads: number; nKvHeads: number; headDim: number; ropeTheta: number };
  topK: number;
  answerTokens: number;
  systemTopic: number;
  topics: string[];
  agents: { id: string; rotated: boolean; steps: { topic: number; tokens: number; ask: boolean }[] }[];
}

/** The model a Story runs (story.model). */
export interface StoryModel {
  /** 'llama2c' or 'gguf' */
  format: string;
  dim: number;
  hiddenDim: number;
  nLayers: number;
  nHeads: number;
  nKvHeads: number;
  headDim: number;
  vocab: number;
  /** the model's trained window; the story's history may grow to 8 of them */
  seqLen: number;
  /** the kvmem agent's block size (16) and storage ('f16') */
  blockSize: number;
  storage: string;
  /** tokens generated per continuation (20) */
  gen: number;
  /** the longest session text, in tokens (160) */
  maxPrompt: number;
  /** history tokens the retrieval probe sees (32) */
  probeWindow: number;
  /** whether the build has ART (kvmem_attend), and its default tile size */
  art: boolean;
  artDefaultTile: number;
}

/** Token ids and their text (decoded by the model's tokenizer). */
export interface StoryText { ids: number[]; text: string; }

/** History tokens [first, first + n): ids and text. */
export interface StoryRange extends StoryText { first: number; n: number; }

/** ART stats summed over layers, KV heads and rows (kvmem_attend's). */
export interface StoryArtStats { tilesVisited: number; tilesTotal: number; positionsRead: number; }

/** One session of a Story (story.session(text)). Every context but the whole history gets one
 *  window of the model (seqLen tokens) for its memory, the text and the continuation. */
export interface StorySession {
  /** 1, 2, ... since the story began (or was reset) */
  session: number;
  /** tokens in the agent's history before this session (it may be several windows long) */
  history: number;
  /** memory + live context: what kvmem and the recent window get of the window besides the text */
  budget: number;
  /** the window's shares: retrieved memory and live context (tokens), and how the retrieved
   *  blocks are placed ('chrono', 'score' or 'runs') */
  split: { memory: number; live: number; order: string };
  text: string;
  /** the text's token ids (BOS first in the first session) */
  prompt: number[];
  /** what kvmem gave the prompt (null in the first session): the retrieved blocks (in window
   *  order, with their retrieval scores), re-encoded before the live context (the newest history) */
  memory: null | { rows: number; localRows: number; retrievedRows: number;
    blocks: (StoryRange & { id: number; score: number })[]; live: StoryRange };
  /** null unless the session ran with { art: true }: where ART stopped */
  art: null | { tileSize: number; prefill: StoryArtStats; decode: StoryArtStats };
  /** the continuation on kvmem's memory (the text, not the continuation, goes into the agent) */
  kvmem: StoryText;
  /** the same session on text RAG (BOS, the history's 16-token chunks BM25 ranks best against
   *  the text, the live context, all prefilled as text), on the last `window` tokens, and on the
   *  whole history at its own positions (pastWindow: past the model's trained window); null in
   *  the first session */
  rag: (StoryText & { chunks: StoryRange[] }) | null;
  recent: (StoryText & { window: number }) | null;
  full: (StoryText & { pastWindow: boolean }) | null;
  /** tokens run through the model: the text, kvmem's retrieval probe, text RAG's whole context
   *  with the text, and what a text agent re-reading the whole history runs */
  tokens: { prefilled: number; probed: number; ragPrefilled: number; reread: number };
}

/** What owns wasm memory (or a C object): close() frees it, once; `using` works where Symbol.dispose exists. */
declare class Handle {
  /** the C pointer (a number); throws ClosedError once closed */
  readonly handle: number;
  readonly closed: boolean;
  close(): void;
  [Symbol.dispose](): void;
}

/** A story agent on a real model: the tinyllm engine in the module, its KV memory a kvmem agent. */
export declare class Story extends Handle {
  readonly model: Readonly<StoryModel>;
  /** tokens in the agent's history */
  readonly historyTokens: number;
  /** One session: retrieve, prefill, continue greedily (four ways), append the text. Throws
   *  InvalidArgumentError for empty text, more than model.maxPrompt tokens (or too many for the
   *  window), or a story past 8 windows (the story unchanged). */
  session(text: string, options?: { art?: boolean; artTile?: number }): StorySession;
  /** forget the history */
  reset(): void;
  encode(text: string, options?: { bos?: boolean }): Int32Array;
  decode(ids: ArrayLike<number>): string;
}

/** The loaded module: what Node's `require('kvmem')` is. */
export declare class Kvmem {
  /** kvmem_version(): the library's version string, as Node's kvmem.version() */
  version(): string;
  /** kvmem_version_number(): X*1000000 + Y*1000 + Z */
  versionNumber(): number;
  /** the CPU kernel table in use ("wasm128", or "scalar" with ENV.KVMEM_CPU=scalar) */
  readonly kernels: string;
  /** the Emscripten module */
  readonly M: any;
  /** whether the module holds the tinyllm engine (storyOpen) */
  readonly hasStory: boolean;
  /** new km.Context(options), as Node's new kvmem.Context(options) */
  readonly Context: new (options?: ContextOptions) => Context;
  /** new km.Retrieval(), as Node's new kvmem.Retrieval() */
  readonly Retrieval: new () => Retrieval;
  readonly Pool: typeof Pool;
  readonly Agent: typeof Agent;
  contextCreate(options?: ContextOptions): Context;
  retrievalCreate(): Retrieval;
  /** the generator's state for Synth */
  rngCreate(seed: bigint | number): Rng;
  /** kvmem_attend_default_params() */
  attendDefaultParams(): AttendDefaultParams;
  /** the full spec (defaults filled in) of the given keys */
  modelSpec(fields?: Partial<ModelSpec>): FullModelSpec;
  /** kvmem_model_spec_validate: throws InvalidArgumentError naming the first wrong field */
  specValidate(spec: ModelSpec): void;
  /** Rotate rows (head vectors) of x in place, one position per row, `stride` floats apart (default headDim). */
  ropeApply(spec: ModelSpec, x: Float32Array, positions: Int32Like, options?: { inverse?: boolean; stride?: number }): void;
  /** kvmem_attend: q [nRows][nQHeads][headDim] post-RoPE over an agent's layer or over tensors. */
  attend(ctx: Context, q: TensorLike, options: AttendOptions): AttendResult;
  /** runs now, on the calling thread (no threads in the module); the result as a promise */
  attendAsync(ctx: Context, q: TensorLike, options: AttendOptions): Promise<AttendResult>;
  /** The tinyllm engine on a real model: a llama2.c checkpoint or GGUF file, and llama2.c's
   *  tokenizer file (null: the GGUF's own vocabulary). Throws FormatError with the loader's message. */
  storyOpen(model: ArrayBuffer | ArrayBufferView, tokenizer?: ArrayBuffer | ArrayBufferView | null): Story;
  statusStr(status: number): string;
  lastError(): string;
  dtypeName(dtype: number): string;
  agentIdValid(id: string): boolean;
  /** the scripted session of `kvmem demo` */
  demoScript(): DemoScript;
  /** milliseconds, monotonic */
  now(): number;
  /** free the module's scratch memory (after every object is closed) */
  close(): void;
  /** @deprecated new km.Context(options) or km.contextCreate(options) */
  createContext(options?: ContextOptions): Context;
  /** @deprecated km.retrievalCreate() */
  createRetrieval(): Retrieval;
  /** @deprecated km.rngCreate(seed) */
  createRng(seed: bigint | number): Rng;
  /** @deprecated km.attendDefaultParams() */
  attendDefaults(): AttendDefaultParams;
  /** @deprecated km.storyOpen(model, tokenizer) */
  openStory(model: ArrayBuffer | ArrayBufferView, tokenizer?: ArrayBuffer | ArrayBufferView | null): Story;
}
export interface Kvmem extends Constants, ErrorClasses {}

/** backend: 'cpu' or 'auto' (the same here); nThreads: the module has no threads (it reads 1). */
export interface ContextOptions { backend?: 'cpu' | 'auto' | string; nThreads?: number; }

export declare class Context extends Handle {
  /** new km.Context(options) */
  constructor(km: Kvmem, options?: ContextOptions);
  readonly backend: string;
  readonly nThreads: number;
  poolCreate(spec: ModelSpec, params?: PoolParams): Pool;
  /** @deprecated ctx.poolCreate(spec, params) */
  createPool(spec: ModelSpec, params?: PoolParams): Pool;
  /** @deprecated km.attend(ctx, {data: q, shape}, { k: {data: k, shape}, v: {data: v, shape}, ... }) */
  attendTensors(q: Float32Array, nRows: number, k: Float32Array, v: Float32Array,
    options: AttendParams & { nQHeads: number; nKvHeads: number; headDim: number; mask?: Uint8Array | null }): AttendResult;
}

export declare class Pool extends Handle {
  /** the same as ctx.poolCreate(spec, params) */
  constructor(ctx: Context, spec: ModelSpec, params?: PoolParams);
  readonly context: Context;
  /** getSpec(), read once */
  readonly spec: Readonly<FullModelSpec>;
  getInfo(): PoolInfo;
  getInfoAsync(): Promise<PoolInfo>;
  /** (experimental) the device-resident mirrors: all 0 in the module (CPU only) */
  deviceStats(): { mirrorBytes: number; evictions: number; unmirrored: number };
  getSpec(): FullModelSpec;
  agentId(index: number): string;
  agentIds(): string[];
  agentOpen(id: string): Agent;
  agentOpenAsync(id: string): Promise<Agent>;
  removeAgent(id: string): void;
  removeAgentAsync(id: string): Promise<void>;
  /** the generator of `kvmem demo` (tools/synth.c) for this model */
  synthCreate(nTopics: number, seed: bigint | number): Synth;
  /** @deprecated pool.agentOpen(id) */
  openAgent(id: string): Agent;
  /** @deprecated pool.synthCreate(nTopics, seed) */
  createSynth(nTopics: number, seed: bigint | number): Synth;
  /** @deprecated pool.getInfo().blockSize */
  readonly blockSize: number;
  /** @deprecated km.ropeApply(pool.spec, x, positions, { stride, inverse }), in place */
  ropeApply(x: Float32Array, nRows: number, stride: number, positions: ArrayLike<number>, inverse?: boolean): Float32Array;
}

export declare class Agent extends Handle {
  /** the same as pool.agentOpen(id) */
  constructor(pool: Pool, id: string);
  readonly id: string;
  readonly pool: Pool;
  /** k, v: [nLayers][T][nKvHeads][headDim], T from k */
  append(k: TensorLike, v: TensorLike, options?: AppendOptions): void;
  /** @deprecated agent.append(k, v, options): T comes from k */
  append(k: Float32Array, v: Float32Array, nTokens: number, options?: AppendOptions): void;
  appendAsync(k: TensorLike, v: TensorLike, options?: AppendOptions): Promise<void>;
  flush(): void;
  flushAsync(): Promise<void>;
  /** close() as a promise (the Node binding's closeAsync waits for the agent's async calls) */
  closeAsync(): Promise<void>;
  getInfo(): AgentInfo;
  blockInfo(block: number): BlockInfo;
  /** [nLayers][nKvHeads][headDim] each */
  blockAabb(block: number): { min: Float32Array; max: Float32Array };
  /** raw KV of tokens [first, first + n) */
  read(first?: number, n?: number, options?: ReadOptions): ReadResult;
  readAsync(first?: number, n?: number, options?: ReadOptions): Promise<ReadResult>;
  tokens(first?: number, n?: number): Int32Array;
  textBytes(): Uint8Array;
  text(): string;
  truncate(nTokens: number): void;
  prefixMatch(newText: string | Uint8Array, options?: { minRatio?: number }): PrefixMatch;
  /** q: [nQ][nLayers][nQHeads][headDim], raw (pre-RoPE); `result` given: that Retrieval, filled */
  retrieve(q: TensorLike, options: RetrieveOptions & { result: Retrieval }): Retrieval;
  retrieve(q: TensorLike, options?: RetrieveOptions): RetrievalResult;
  /** @deprecated agent.retrieve(q, { ...params, result }): nQ comes from q */
  retrieve(q: Float32Array, nQ: number, params?: RetrieveOptions, into?: Retrieval | null): { sets: RetrievalSet[] };
  retrieveAsync(q: TensorLike, options?: RetrieveOptions): Promise<RetrievalResult | Retrieval>;
  /** sealed blocks concatenated, keys re-encoded at basePosition.. */
  gather(blocks: Int32Like, basePosition?: number, options?: ReadOptions): ReadResult;
  gatherAsync(blocks: Int32Like, basePosition?: number, options?: ReadOptions): Promise<ReadResult>;
  /** @deprecated agent.getInfo() */
  info(): AgentInfo;
  /** @deprecated km.attend(ctx, q, { agent, layer, ...params }) */
  attend(layer: number, q: Float32Array, nRows: number,
    params?: AttendParams & { positions?: Int32Like | null; basePosition?: number }): AttendResult;
}

/** A retrieval's sets as plain data (agent.retrieve without `result`); holds no wasm memory. */
export declare class RetrievalResult implements RetrievalReader {
  readonly nSets: number;
  readonly sets: RetrievalSet[];
  get(set?: number): { blocks: Int32Array; scores: Float32Array };
  view(set?: number): { blocks: Int32Array; scores: Float32Array };
  blockScores(set?: number): Float32Array;
  nTokens(set?: number): number;
  /** nothing to free */
  close(): void;
}

/** A reusable C retrieval result (kvmem_retrieval): new km.Retrieval(), retrieve's `result`. */
export declare class Retrieval extends Handle implements RetrievalReader {
  constructor(km: Kvmem);
  readonly nSets: number;
  readonly sets: RetrievalSet[];
  get(set?: number): { blocks: Int32Array; scores: Float32Array };
  view(set?: number): { blocks: Int32Array; scores: Float32Array };
  blockScores(set?: number): Float32Array;
  nTokens(set?: number): number;
  /** @deprecated retrieval.sets */
  read(): { sets: RetrievalSet[] };
  /** @deprecated retrieval.close() */
  free(): void;
}

/** The generator's 64-bit PRNG state, kept in the wasm heap. */
export declare class Rng {
  state: bigint;
  close(): void;
  /** @deprecated rng.close() */
  free(): void;
}

export declare class Synth extends Handle {
  readonly pool: Pool;
  /** K and V [nLayers][nTokens][nKvHeads][headDim] of tokens about `topic` */
  tokens(topic: number, nTokens: number, rng: Rng): { k: Float32Array; v: Float32Array };
  /** raw query rows [nQ][nLayers][nQHeads][headDim] about `topic` */
  query(topic: number, nQ: number, rng: Rng): Float32Array;
  /** @deprecated synth.close() */
  free(): void;
}

/** Instantiate the module. factory: an Emscripten createKvmem (default: ./kvmem_wasm.js);
 *  other options are Emscripten's Module options and go to the factory unchecked
 *  (locateFile, preRun, ...). */
export declare function load(options?: { factory?: (opts: object) => Promise<any>; [option: string]: unknown }): Promise<Kvmem>;
