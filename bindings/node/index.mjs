// kvmem for Node.js as an ES module: the same objects as the CommonJS entry
// (index.js, loaded once through require, so `instanceof` and the loaded library
// are shared by importers of either kind), each name a real named export.
// test/esm.test.mjs checks this list against index.d.ts and index.js.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const kvmem = require('./index.js');

export const {
  KvmemError, InvalidArgumentError, NoMemoryError, CapacityError, NotFoundError, ExistsError,
  ClosedError, UnsupportedError, BackendError, IOError, FormatError, CorruptError, MismatchError,
  ConflictError, InternalError, BusyError, errorFor, Context, Pool, Agent, Retrieval, Segments,
  clusterKmeans, multihopSelect, multihopSchedule, loadPlan, batchMerge, batchExtract, PREFIX_EXACT,
  PREFIX_EXTEND, PREFIX_DIVERGE, attend, attendAsync, ATTEND_SRC_TENSORS, ATTEND_SRC_AGENT,
  ATTEND_SRC_SLOTMAP, ATTEND_RECENT, ATTEND_IMPORTANCE, ATTEND_INDEX, ATTEND_SCORED,
  ATTEND_PROBE_STRIDED, ATTEND_PROBE_ORACLE, ATTEND_MAX_ROWS, ATTEND_PROBE_SIZE, QmemStore, QmemHead,
  KVStore, SlotMap, qmemScore, selectKeep, streamingKeep, h2oAccumulate, h2oKeep, snapkvScore,
  arrange, windowSplit,
  SESSION_EXPLICIT, SESSION_MARKED, SESSION_PREFIX, SESSION_LOCAL, DEAD_SLOT, SENTINEL_K,
  GROUP_DYNAMIC, GROUP_STATIC, SEG_EVENT_SEGMENT_STALE, SEG_EVENT_GROUP_STATIC,
  SEG_EVENT_GROUP_DYNAMIC, SEG_UNIT_SEGMENT, SEG_UNIT_GROUP, RETRIEVE_AABB, RETRIEVE_EXACT,
  NORM_SOFTMAX, NORM_RR, AGG_MAX, AGG_SUM, SCOPE_GLOBAL, SCOPE_PER_LAYER, modelSpec, specValidate,
  ropeApply, backends, logSet, tensor, version, versionNumber, statusStr, lastError, dtypeName,
  agentIdValid, F32, F16, BF16, Q8, Q4, Q4_KIVI, ROPE_NEOX, ROPE_GPTJ, ROPE_SCALING_NONE,
  ROPE_SCALING_LINEAR, ROPE_SCALING_LLAMA3, ROPE_SCALING_YARN, LOG_DEBUG, LOG_INFO, LOG_WARN,
  LOG_ERROR, libraryPath, hasFunction, _lib
} = kvmem;
export default kvmem;
