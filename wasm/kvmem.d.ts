// TypeScript types of kvmem.js, the JavaScript API of kvmem's WebAssembly build.
// Arrays passed in are copied into the wasm heap for the call; arrays returned
// are copies (never views of the heap). Objects that own wasm memory have
// free()/close(); using one afterwards throws KvmemError(CLOSED).

export declare const Status: Readonly<{
  OK: 0; INVALID_ARG: -1; NOMEM: -2; CAPACITY: -3; NOT_FOUND: -4; EXISTS: -5; CLOSED: -6;
  UNSUPPORTED: -7; BACKEND: -8; IO: -9; FORMAT: -10; CORRUPT: -11; MISMATCH: -12;
  CONFLICT: -13; INTERNAL: -14; BUSY: -15;
}>;

/** A failed kvmem call: the C status code, its name and kvmem_last_error()'s message. */
export declare class KvmemError extends Error {
  readonly status: number;
  readonly statusName: string;
}

export type RetrieveMode = 'aabb' | 'exact';
export type RetrieveNorm = 'softmax' | 'rr';
export type RetrieveAgg = 'max' | 'sum';
export type RetrieveScope = 'global' | 'per-layer';
export type AttendOrder = 'recent' | 'importance' | 'index';
export type AttendProbe = 'strided' | 'oracle';

export interface ModelSpec {
  nLayers: number;
  nQHeads: number;
  nKvHeads: number;
  headDim: number;
  /** 0 = headDim */
  rotaryDim?: number;
  ropeStyle?: 'neox' | 'gptj';
  /** default 10000 */
  ropeTheta?: number;
  modelId?: string;
}

export interface PoolParams {
  /** power of two in [1, 4096]; default 16 */
  blockSize?: number;
  /** default 'f16' */
  storage?: 'f32' | 'f16' | 'bf16';
  /** 0 = unlimited */
  capacityBytes?: number;
}

export interface AgentInfo { nTokens: number; nBlocks: number; nSealed: number; bytes: number; textBytes: number; }
export interface BlockInfo { firstToken: number; nTokens: number; sealed: boolean; }

/** Defaults are kvmem_retrieve_default_params()'s. */
export interface RetrieveParams {
  topK?: number;
  mode?: RetrieveMode;
  norm?: RetrieveNorm;
  agg?: RetrieveAgg;
  scope?: RetrieveScope;
  /** 0 = 1/sqrt(headDim) */
  tau?: number;
  /** 0 = 60 */
  rrC?: number;
  exclude?: ArrayLike<number>;
  alwaysInclude?: ArrayLike<number>;
  recentWindow?: number;
  skipRecent?: number;
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

export interface RetrievalResult {
  /** one set (GLOBAL) or one per layer (PER_LAYER) */
  sets: RetrievalSet[];
}

export interface Gathered {
  /** [nLayers][nTokens][nKvHeads][headDim], RoPE at basePosition.. */
  k: Float32Array;
  v: Float32Array;
  nTokens: number;
}

/** Defaults are kvmem_attend_default_params()'s. */
export interface AttendParams {
  order?: AttendOrder;
  nSink?: number;
  tileOrder?: ArrayLike<number>;
  /** tensors only; agent tiles are its blocks */
  tileSize?: number;
  /** 0 = 1/sqrt(headDim) */
  scale?: number;
  tauS?: number;
  tauD?: number;
  patience?: number;
  probe?: AttendProbe;
  causal?: boolean;
  compare?: boolean;
}

export interface AttendStats {
  nStreams: number;
  tilesTotal: number;
  tilesVisited: number;
  streamsStopped: number;
  oracleTiles: number;
  oracleAgree: number;
  positionsRead: number;
  stoppedEarly: boolean;
}

export interface AttendResult {
  /** [nRows][nQHeads][headDim] */
  out: Float32Array;
  stats: AttendStats;
}

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
  /** the model's context length: a story ends there */
  seqLen: number;
  /** the kvmem agent's block size (16) and storage ('f16') */
  blockSize: number;
  storage: string;
  /** tokens generated per continuation (20) */
  gen: number;
  /** the longest session text, in tokens (128) */
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

/** One session of a Story (story.session(text)). */
export interface StorySession {
  /** 1, 2, ... since the story began (or was reset) */
  session: number;
  /** tokens in the agent's history before this session */
  history: number;
  /** the memory budget: a quarter of the history in whole blocks, at least 32 */
  budget: number;
  text: string;
  /** the text's token ids (BOS first in the first session) */
  prompt: number[];
  /** what kvmem gave the prompt (null in the first session): the live context (the newest
   *  history, at its own positions) and the retrieved blocks (chronological, re-encoded
   *  just before the live context) */
  memory: null | { rows: number; localRows: number; retrievedRows: number;
    blocks: (StoryRange & { id: number })[]; live: StoryRange };
  /** null unless the session ran with { art: true }: where ART stopped */
  art: null | { tileSize: number; prefill: StoryArtStats; decode: StoryArtStats };
  /** the continuation on kvmem's memory (appended to the agent with the text) */
  kvmem: StoryText;
  /** the same session on the full history and on the last `budget` tokens (null in the first) */
  full: StoryText | null;
  recent: (StoryText & { window: number }) | null;
  /** tokens through the model: the text, the retrieval probe, and what a text agent re-reads */
  tokens: { prefilled: number; probed: number; reread: number };
}

/** A story agent on a real model: the tinyllm engine in the module, its KV memory a kvmem agent. */
export declare class Story {
  readonly model: Readonly<StoryModel>;
  /** tokens in the agent's history */
  readonly historyTokens: number;
  /** One session: retrieve, prefill, continue greedily, append. Throws KvmemError(INVALID_ARG)
   *  for empty text, more than model.maxPrompt tokens or a story past model.seqLen (unchanged). */
  session(text: string, options?: { art?: boolean; artTile?: number }): StorySession;
  /** forget the history */
  reset(): void;
  encode(text: string, options?: { bos?: boolean }): Int32Array;
  decode(ids: ArrayLike<number>): string;
  close(): void;
}

/** The loaded module. */
export declare class Kvmem {
  /** kvmem_version() */
  readonly version: string;
  /** the CPU kernel table in use ("wasm128", or "scalar" with ENV.KVMEM_CPU=scalar) */
  readonly kernels: string;
  /** the Emscripten module */
  readonly M: any;
  /** whether the module holds the tinyllm engine (openStory) */
  readonly hasStory: boolean;
  /** The tinyllm engine on a real model: a llama2.c checkpoint or GGUF file, and llama2.c's
   *  tokenizer file (null: the GGUF's own vocabulary). Throws KvmemError(FORMAT) with the
   *  loader's message. */
  openStory(model: ArrayBuffer | ArrayBufferView, tokenizer?: ArrayBuffer | ArrayBufferView | null): Story;
  createContext(options?: { nThreads?: number }): Context;
  createRng(seed: bigint | number): Rng;
  createRetrieval(): Retrieval;
  attendDefaults(): Required<Omit<AttendParams, 'order' | 'probe' | 'tileOrder'>> & { order: number; probe: number };
  /** the scripted session of `kvmem demo` */
  demoScript(): DemoScript;
  /** milliseconds, monotonic */
  now(): number;
  /** free the module's scratch memory (after every object is closed) */
  close(): void;
}

export declare class Context {
  readonly nThreads: number;
  createPool(spec: ModelSpec, params?: PoolParams): Pool;
  /** ART over caller tensors: q [nRows][nQHeads][headDim], k/v [T][nKvHeads][headDim], post-RoPE. */
  attendTensors(q: Float32Array, nRows: number, k: Float32Array, v: Float32Array,
    options: AttendParams & { nQHeads: number; nKvHeads: number; headDim: number; mask?: Uint8Array | null }): AttendResult;
  /** frees every pool (and agent) created on it */
  close(): void;
}

export declare class Pool {
  readonly spec: Readonly<Required<ModelSpec>>;
  readonly blockSize: number;
  openAgent(id: string): Agent;
  removeAgent(id: string): void;
  /** rotate (or undo) nRows rows of headDim floats, `stride` floats apart */
  ropeApply(x: Float32Array, nRows: number, stride: number, positions: ArrayLike<number>, inverse?: boolean): Float32Array;
  /** the generator of `kvmem demo` (tools/synth.c) for this model */
  createSynth(nTopics: number, seed: bigint | number): Synth;
  /** frees every agent handle and generator of the pool */
  close(): void;
}

export declare class Agent {
  readonly id: string;
  readonly pool: Pool;
  /** k, v: [nLayers][nTokens][nKvHeads][headDim]; positions: keys are post-RoPE there */
  append(k: Float32Array, v: Float32Array, nTokens: number, options?: { positions?: ArrayLike<number> | null }): void;
  flush(): void;
  info(): AgentInfo;
  blockInfo(block: number): BlockInfo;
  /** [nLayers][nKvHeads][headDim] each */
  blockAabb(block: number): { min: Float32Array; max: Float32Array };
  /** q: [nQ][nLayers][nQHeads][headDim], raw (pre-RoPE) */
  retrieve(q: Float32Array, nQ: number, params?: RetrieveParams, into?: Retrieval | null): RetrievalResult;
  gather(blocks: ArrayLike<number>, basePosition?: number): Gathered;
  /** q: [nRows][nQHeads][headDim] of `layer`, post-RoPE */
  attend(layer: number, q: Float32Array, nRows: number,
    params?: AttendParams & { positions?: ArrayLike<number> | null; basePosition?: number }): AttendResult;
  close(): void;
}

/** A reusable C retrieval result. */
export declare class Retrieval {
  read(): RetrievalResult;
  free(): void;
}

/** The generator's 64-bit PRNG state, kept in the wasm heap. */
export declare class Rng {
  state: bigint;
  free(): void;
}

export declare class Synth {
  /** K and V [nLayers][nTokens][nKvHeads][headDim] of tokens about `topic` */
  tokens(topic: number, nTokens: number, rng: Rng): { k: Float32Array; v: Float32Array };
  /** raw query rows [nQ][nLayers][nQHeads][headDim] about `topic` */
  query(topic: number, nQ: number, rng: Rng): Float32Array;
  free(): void;
}

/** Instantiate the module. factory: an Emscripten createKvmem (default: ./kvmem_wasm.js);
 *  other options go to the factory (locateFile, preRun, ...). */
export declare function load(options?: { factory?: (opts: object) => Promise<any>; [option: string]: unknown }): Promise<Kvmem>;
