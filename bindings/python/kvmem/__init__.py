"""kvmem: memory for LLM agents kept as the model's own KV cache (ctypes binding).

    import kvmem
    ctx = kvmem.Context("cpu")
    pool = ctx.pool_create(kvmem.ModelSpec(n_layers=32, n_q_heads=32, n_kv_heads=8, head_dim=128))
    agent = pool.agent_open("alice")
    agent.append(k, v, token_ids=ids, text="...")      # k, v: [L][T][H_kv][D] numpy arrays

The low-level C functions are in ``kvmem._lib`` (one declaration each).
"""
from ._errors import (BusyError, CapacityError, ClosedError, ConflictError, CorruptError,
                      ExistsError, FormatError, InternalError, InvalidArgumentError, InvalidTypeError,
                      IOFailedError, KvmemError, MismatchError, NoMemoryError, NotFoundError,
                      UnsupportedError, BackendError)
from ._lib import LIBRARY_PATH, has_function
from ._info import (AgentInfo, BlockInfo, GroupInfo, KVStoreInfo, PoolInfo, SegmentInfo, SegmentsInfo,
                    SlotMapInfo)
from ._objects import (BF16, F16, F32, LOG_DEBUG, LOG_ERROR, LOG_INFO, LOG_WARN, Q4, Q4_KIVI, Q8,
                       ROPE_GPTJ, ROPE_NEOX, ROPE_SCALING_LINEAR, ROPE_SCALING_LLAMA3,
                       ROPE_SCALING_NONE, ROPE_SCALING_YARN, Agent, Context, DeviceTensor, ModelSpec, Pool, Retrieval,
                       RETRIEVE_AABB, RETRIEVE_EXACT, NORM_SOFTMAX, NORM_RR, AGG_MAX, AGG_SUM,
                       SCOPE_GLOBAL, SCOPE_PER_LAYER, Segments, GROUP_DYNAMIC, GROUP_STATIC,
                       SEG_EVENT_SEGMENT_STALE, SEG_EVENT_GROUP_STATIC, SEG_EVENT_GROUP_DYNAMIC,
                       SEG_UNIT_SEGMENT, SEG_UNIT_GROUP, cluster_kmeans, multihop_select,
                       multihop_schedule, load_plan, batch_merge, batch_extract, PREFIX_EXACT,
                       PREFIX_EXTEND, PREFIX_DIVERGE,
                       agent_id_valid, backends, dtype_name, last_error, log_set, rope_apply,
                       status_str, version, version_number)

from ._intentkv import (DEAD_SLOT, SENTINEL_K, SESSION_EXPLICIT, SESSION_LOCAL, SESSION_MARKED,
                        SESSION_PREFIX, KVStore, QmemHead, QmemStore, SessionKey, SlotMap, h2o_accumulate, h2o_keep,
                        qmem_score, select_keep, snapkv_score, streaming_keep)

from ._attend import (ATTEND_IMPORTANCE, ATTEND_INDEX, ATTEND_SCORED, ATTEND_MAX_ROWS, ATTEND_PROBE_ORACLE,
                      ATTEND_PROBE_SIZE, ATTEND_PROBE_STRIDED, ATTEND_RECENT, ATTEND_SRC_AGENT,
                      ATTEND_SRC_SLOTMAP, ATTEND_SRC_TENSORS, attend)

from ._window import WindowPlan, arrange, window_split

__version__ = "0.1.0"

__all__ = [n for n in dir() if not n.startswith("_")]
