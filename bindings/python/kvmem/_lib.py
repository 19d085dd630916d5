"""Low level: find libkvmem, mirror its structs, declare each C function once.

Every public C function appears exactly once in ``_declare(...)`` below with
its C prototype in a comment. Functions returning ``kvmem_status`` are
declared with ``STATUS``: a failing call raises the KvmemError subclass of
its status, carrying ``kvmem_last_error()``. A function the loaded library
lacks (an older build) is left out of the namespace and listed in
``MISSING``; calling it raises UnsupportedError.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from ctypes import (CFUNCTYPE, POINTER, c_char, c_char_p, c_double, c_int, c_int32,
                    c_int64, c_size_t, c_uint32, c_uint64, c_void_p)
from pathlib import Path
from typing import Any, Dict, List, Set

from . import _ints
from ._errors import InvalidTypeError, UnsupportedError, error_for

# --------------------------------------------------------------------------
# Finding the library
# --------------------------------------------------------------------------

_PKG_DIR = Path(__file__).resolve().parent
_SONAMES = ["libkvmem.so.0", "libkvmem.so"] if sys.platform != "darwin" else ["libkvmem.0.dylib", "libkvmem.dylib"]


def _candidates() -> List[str]:
    """Where the library is looked for, in order."""
    out: List[str] = []
    env = os.environ.get("KVMEM_LIBRARY")
    if env:
        out.append(env)
    # installed beside the package (a wheel that ships the library)
    out += [str(_PKG_DIR / n) for n in _SONAMES]
    # a source checkout: bindings/python/kvmem -> repository root
    root = _PKG_DIR.parents[2]
    for preset in ("default", "release", "debug", "dev"):
        out += [str(root / "build" / preset / "core" / n) for n in _SONAMES]
    # the system search path (ldconfig, LD_LIBRARY_PATH, pkg installs)
    found = ctypes.util.find_library("kvmem")
    out += _SONAMES + ([found] if found else [])
    return out


def _load() -> ctypes.CDLL:
    tried: List[str] = []
    env = os.environ.get("KVMEM_LIBRARY")
    for cand in _candidates():
        if os.sep in cand and not os.path.exists(cand):
            tried.append(f"{cand} (no such file)")
        else:
            try:
                return ctypes.CDLL(cand)
            except OSError as e:
                tried.append(f"{cand} ({e})")
        if env and cand == env:
            break  # an explicit KVMEM_LIBRARY that fails is an error, not a hint
    raise OSError("kvmem: cannot load libkvmem. Set KVMEM_LIBRARY to its path, or build it "
                  "(make build) / install it. Looked in:\n  " + "\n  ".join(tried))


_dll = _load()
LIBRARY_PATH: str = getattr(_dll, "_name", "")

# --------------------------------------------------------------------------
# Types mirroring include/kvmem.h
# --------------------------------------------------------------------------

MAX_DIMS = 6
MAX_MODEL_ID = 128
MAX_AGENT_ID = 128
OPEN_FILE_NO_VERIFY = 0x1

c_status = c_int  # kvmem_status (an int-sized enum)
c_enum = c_int


class Structure(ctypes.Structure):
    """ctypes.Structure whose integer fields refuse what does not fit (ctypes
    would store 2**32 + 4 in an int32_t field as 4), and whose other fields
    turn ctypes' TypeError for a wrong value into InvalidTypeError naming the field."""

    def __setattr__(self, name: str, value: Any) -> None:
        cls = type(self)
        fields = cls.__dict__.get("_kvmem_field_types")
        if fields is None:
            fields = {}
            for klass in reversed(cls.__mro__):
                fields.update(dict(klass.__dict__.get("_fields_", ())))
            cls._kvmem_field_types = fields
        t = fields.get(name)
        if t is not None and _ints.int_range(t) is not None:
            value = _ints.check(value, name, t)
        try:
            super().__setattr__(name, value)
        except TypeError as e:
            if t is None:
                raise
            raise InvalidTypeError(f"{name}: {e}") from None


class kvmem_tensor(Structure):
    _fields_ = [("data", c_void_p), ("dtype", c_enum), ("ndim", c_int32),
                ("shape", c_int64 * MAX_DIMS), ("strides", c_int64 * MAX_DIMS)]


class kvmem_device_memory(Structure):
    _fields_ = [("struct_size", c_size_t), ("kind", c_enum), ("device", c_int32), ("handle", c_uint64),
                ("offset", c_uint64), ("size", c_uint64), ("stream", c_void_p)]


class kvmem_vulkan_device(Structure):
    _fields_ = [("struct_size", c_size_t), ("instance", c_void_p), ("physical_device", c_void_p),
                ("device", c_void_p), ("queue", c_void_p), ("queue_family", ctypes.c_uint32),
                ("api_version", ctypes.c_uint32)]


class kvmem_backend_info(Structure):
    _fields_ = [("name", c_char_p), ("available", c_int32), ("detail", c_char_p)]


class kvmem_context_params(Structure):
    _fields_ = [("struct_size", c_size_t), ("backend", c_char_p), ("n_threads", c_int32),
                ("reserved", c_int32)]


class kvmem_model_spec(Structure):
    _fields_ = [("n_layers", c_int32), ("n_q_heads", c_int32), ("n_kv_heads", c_int32),
                ("head_dim", c_int32), ("rotary_dim", c_int32), ("rope_style", c_enum),
                ("rope_theta", c_double), ("rope_scaling", c_enum), ("rope_factor", c_double),
                ("rope_low_freq_factor", c_double), ("rope_high_freq_factor", c_double),
                ("rope_original_max_pos", c_int32), ("yarn_beta_fast", c_double),
                ("yarn_beta_slow", c_double), ("yarn_attn_factor", c_double),
                ("layer_window", POINTER(c_int32)), ("model_id", c_char * MAX_MODEL_ID)]


class kvmem_model_spec_v2(Structure):  # the frozen spec's fields after struct_size, ordered without padding
    _fields_ = [("struct_size", c_size_t), ("layer_window", POINTER(c_int32)), ("n_layers", c_int32),
                ("n_q_heads", c_int32), ("n_kv_heads", c_int32), ("head_dim", c_int32), ("rotary_dim", c_int32),
                ("rope_style", c_enum), ("rope_scaling", c_enum), ("rope_original_max_pos", c_int32),
                ("rope_theta", c_double), ("rope_factor", c_double), ("rope_low_freq_factor", c_double),
                ("rope_high_freq_factor", c_double), ("yarn_beta_fast", c_double), ("yarn_beta_slow", c_double),
                ("yarn_attn_factor", c_double), ("model_id", c_char * MAX_MODEL_ID)]


class kvmem_pool_params(Structure):
    _fields_ = [("struct_size", c_size_t), ("block_size", c_int32), ("storage_dtype", c_enum), ("capacity_bytes", c_uint64),
                ("max_agents", c_int32), ("max_tokens_per_agent", c_int32), ("store_dir", c_char_p),
                ("host_budget_bytes", c_uint64), ("device_capacity_bytes", c_uint64)]


class kvmem_pool_info(Structure):
    _fields_ = [("used_bytes", c_uint64), ("capacity_bytes", c_uint64), ("n_agents", c_int32),
                ("block_size", c_int32), ("storage_dtype", c_enum), ("reserved", c_int32)]


class kvmem_append_params(Structure):
    _fields_ = [("struct_size", c_size_t), ("token_ids", POINTER(c_int32)), ("text", c_char_p), ("text_len", c_size_t),
                ("token_text_offsets", POINTER(c_int32)), ("positions", POINTER(c_int32)),
                ("keys_rotated", c_int32), ("reserved", c_int32)]


class kvmem_agent_info(Structure):
    _fields_ = [("n_tokens", c_int64), ("n_blocks", c_int32), ("n_sealed", c_int32),
                ("bytes", c_uint64), ("text_bytes", c_uint64)]


class kvmem_block_info(Structure):
    _fields_ = [("first_token", c_int64), ("n_tokens", c_int32), ("sealed", c_int32)]


class kvmem_retrieve_params(Structure):
    _fields_ = [("struct_size", c_size_t), ("top_k", c_int32), ("mode", c_enum), ("norm", c_enum), ("agg", c_enum),
                ("scope", c_enum), ("tau", ctypes.c_float), ("rr_c", ctypes.c_float),
                ("exclude", POINTER(c_int32)), ("n_exclude", c_int32),
                ("always_include", POINTER(c_int32)), ("n_always_include", c_int32),
                ("recent_window", c_int32), ("skip_recent", c_int32), ("reserved", c_int32)]


class kvmem_segments_params(Structure):
    _fields_ = [("struct_size", c_size_t), ("static_after_steps", c_int32), ("max_segments", c_int32)]


class kvmem_segment_event(Structure):
    _fields_ = [("kind", c_int32), ("group", c_int32), ("segment", c_int32), ("reserved", c_int32),
                ("step", c_int64)]


class kvmem_segments_info(Structure):
    _fields_ = [("step", c_int64), ("n_segments", c_int32), ("n_indices", c_int32), ("n_groups", c_int32),
                ("n_static", c_int32), ("n_events", c_uint64)]


class kvmem_segment_info(Structure):
    _fields_ = [("group", c_int32), ("alive", c_int32), ("has_kv", c_int32), ("reserved", c_int32),
                ("last_update", c_int64), ("n_tokens", c_int64)]


class kvmem_group_info(Structure):
    _fields_ = [("state", c_enum), ("n_members", c_int32), ("has_kv", c_int32), ("reserved", c_int32),
                ("last_change", c_int64), ("n_tokens", c_int64)]


class kvmem_segment_unit(Structure):
    _fields_ = [("kind", c_int32), ("group", c_int32), ("segment", c_int32), ("needs_compute", c_int32),
                ("score", ctypes.c_float), ("reserved", c_int32), ("first_token", c_int64),
                ("n_tokens", c_int64), ("agent_id", c_char * (MAX_AGENT_ID + 1))]


class kvmem_kmeans_params(Structure):
    _fields_ = [("struct_size", c_size_t), ("k", c_int32), ("max_iters", c_int32), ("seed", c_uint64)]


class kvmem_multihop_params(Structure):
    _fields_ = [("struct_size", c_size_t), ("ratio", ctypes.c_float), ("max_iters", c_int32)]


class kvmem_multihop_result(Structure):
    _fields_ = [("n_selected", c_int32), ("iters", c_int32), ("converged", c_int32), ("reserved", c_int32)]


class kvmem_load_plan_params(Structure):
    _fields_ = [("struct_size", c_size_t), ("bandwidth_gbps", c_double), ("max_ahead", c_int32), ("reserved", c_int32)]


class kvmem_load_item(Structure):
    _fields_ = [("segment", c_int32), ("layer", c_int32), ("issue_layer", c_int32), ("reserved", c_int32),
                ("start_ms", c_double), ("end_ms", c_double)]


class kvmem_load_plan_stats(Structure):
    _fields_ = [("naive_makespan_ms", c_double), ("naive_compute_idle_ms", c_double),
                ("naive_load_idle_ms", c_double), ("balanced_makespan_ms", c_double),
                ("balanced_compute_idle_ms", c_double), ("balanced_load_idle_ms", c_double),
                ("compute_ms", c_double), ("load_ms", c_double), ("n_loads", c_uint64)]


class kvmem_session_key(Structure):
    _fields_ = [("hi", c_uint64), ("lo", c_uint64), ("kind", c_enum), ("reserved", c_int32)]


class kvmem_session_source(Structure):
    _fields_ = [("session_id", c_char_p), ("token_ids", POINTER(c_int32)), ("n_tokens", c_int64),
                ("mark_begin", c_int64), ("mark_end", c_int64)]


class kvmem_session_source_v2(Structure):  # the same fields after struct_size
    _fields_ = [("struct_size", c_size_t)] + kvmem_session_source._fields_


class kvmem_qmem_params(Structure):
    _fields_ = [("struct_size", c_size_t), ("capacity", c_int32), ("prefix_tokens", c_int32), ("lambda", c_double)]


class kvmem_kvstore_params(Structure):
    _fields_ = [("struct_size", c_size_t), ("page_slots", c_int32), ("max_slots", c_int64)]


class kvmem_kvstore_info(Structure):
    _fields_ = [("n_slots", c_int64), ("n_used", c_int64), ("n_free", c_int64), ("page_slots", c_int32),
                ("dead_slot", c_int32)]


class kvmem_slotmap_info(Structure):
    _fields_ = [("length", c_int64), ("n_live", c_int64), ("protect", c_int64), ("n_parked", c_int64)]


class kvmem_attend_source(Structure):
    _fields_ = [("kind", c_enum), ("layer", c_int32), ("k", POINTER(kvmem_tensor)), ("v", POINTER(kvmem_tensor)),
                ("slots", POINTER(c_int32)), ("n_positions", c_int64), ("dead_slot", c_int32), ("reserved", c_int32),
                ("agent", c_void_p), ("positions", POINTER(c_int32)), ("base_position", c_int64),
                ("mask", POINTER(ctypes.c_uint8))]


class kvmem_attend_source_v2(Structure):  # the same fields after struct_size, base_position last
    _fields_ = ([("struct_size", c_size_t)] + [f for f in kvmem_attend_source._fields_ if f[0] != "base_position"]
                + [f for f in kvmem_attend_source._fields_ if f[0] == "base_position"])


class kvmem_attend_params(Structure):
    _fields_ = [("struct_size", c_size_t), ("order", c_enum), ("n_sink", c_int32), ("tile_order", POINTER(c_int32)), ("n_tile_order", c_int32),
                ("tile_size", c_int32), ("scale", ctypes.c_float), ("tau_s", ctypes.c_float),
                ("tau_d", ctypes.c_float), ("patience", c_int32), ("probe", c_enum), ("causal", c_int32),
                ("compare", c_int32), ("reserved", c_int32)]


class kvmem_attend_stats(Structure):
    _fields_ = [("n_streams", c_int64), ("tiles_total", c_int64), ("tiles_visited", c_int64),
                ("streams_stopped", c_int64), ("oracle_tiles", c_int64), ("oracle_agree", c_int64),
                ("positions_read", c_int64), ("stopped_early", c_int32), ("reserved", c_int32)]


class kvmem_prefix_params(Structure):
    _fields_ = [("struct_size", c_size_t), ("min_ratio", c_double)]


class kvmem_prefix_result(Structure):
    _fields_ = [("kind", c_enum), ("reserved", c_int32), ("reuse_tokens", c_int64), ("common_bytes", c_size_t),
                ("process_from", c_size_t)]


class kvmem_window_plan(Structure):
    _fields_ = [("memory_tokens", c_int32), ("top_k", c_int32), ("live_tokens", c_int32)]


# void (*kvmem_log_callback)(kvmem_log_level level, const char *message, void *user_data)
kvmem_log_callback = CFUNCTYPE(None, c_enum, c_char_p, c_void_p)

# opaque handles travel as void*
ctx_p = pool_p = agent_p = retrieval_p = segs_p = qstore_p = qhead_p = kvstore_p = slotmap_p = c_void_p
f32_p = POINTER(ctypes.c_float)
i32_p = POINTER(c_int32)
T_p = POINTER(kvmem_tensor)

# --------------------------------------------------------------------------
# Declarations
# --------------------------------------------------------------------------

STATUS = object()  # marker: returns kvmem_status, raise on failure
DECLARED: Dict[str, str] = {}  # name -> C prototype, every function declared here
MISSING: Set[str] = set()      # declared but absent from the loaded library
_ns: Dict[str, Any] = globals()


def _raise_status(result: int, func: Any, args: Any) -> int:
    if result != 0:
        raise error_for(result, _last_error(), _status_str(result))
    return result


def _declare(proto: str, restype: Any, *argtypes: Any) -> None:
    """Declare one C function: its prototype (for the reader, the API
    completeness test and error messages), the ctypes restype and argtypes."""
    name = proto.split("(")[0].split()[-1].lstrip("*")
    DECLARED[name] = proto
    try:
        fn = getattr(_dll, name)
    except AttributeError:
        MISSING.add(name)

        def _missing(*_a: Any, _n: str = name) -> Any:
            raise UnsupportedError(f"{_n} is not in {LIBRARY_PATH or 'the loaded libkvmem'} "
                                   "(built from an older kvmem)")
        _ns[name] = _missing
        return
    fn.argtypes = list(argtypes)
    if restype is STATUS:
        fn.restype = c_status
        fn.errcheck = _raise_status
    else:
        fn.restype = restype
    _ns[name] = _checked(fn, proto, argtypes)


def _param_names(proto: str) -> List[str]:
    """The parameter names of a C prototype ("int32_t block" -> "block")."""
    inner = proto[proto.index("(") + 1:proto.rindex(")")].strip()
    if inner in ("", "void"):
        return []
    return [p.replace("*", " ").split()[-1] for p in inner.split(",")]


def _checked(fn: Any, proto: str, argtypes: Any) -> Any:
    """fn, or a wrapper that checks its integer arguments (_ints.check) first."""
    names = _param_names(proto)
    ints = [(i, names[i], t) for i, t in enumerate(argtypes) if _ints.int_range(t) is not None]
    if not ints:
        return fn
    ranges = [(i, what, t, *_ints.int_range(t)[:2]) for i, what, t in ints]

    def call(*args: Any) -> Any:
        for i, what, t, lo, hi in ranges:
            a = args[i]
            if type(a) is not int or a < lo or a > hi:
                args = args[:i] + (_ints.check(a, what, t),) + args[i + 1:]
        return fn(*args)
    call.__name__ = call.__qualname__ = fn.__name__
    call.__doc__ = proto
    return call


_d = _declare
# Version
_d("int32_t kvmem_version_number(void)", c_int32)
_d("const char *kvmem_version(void)", c_char_p)
# Status and errors
_d("const char *kvmem_status_str(kvmem_status status)", c_char_p, c_status)
_d("const char *kvmem_last_error(void)", c_char_p)
_d("size_t kvmem_agent_last_error(const kvmem_agent *agent, char *buf, size_t size)", c_size_t, agent_p, c_char_p,
   c_size_t)
_d("size_t kvmem_pool_last_error(const kvmem_pool *pool, char *buf, size_t size)", c_size_t, pool_p, c_char_p, c_size_t)
_d("size_t kvmem_context_last_error(const kvmem_context *ctx, char *buf, size_t size)", c_size_t, ctx_p, c_char_p,
   c_size_t)
_d("void kvmem_log_set(kvmem_log_callback callback, void *user_data)", None, kvmem_log_callback, c_void_p)
_d("void kvmem_free(void *ptr)", None, c_void_p)
# Tensors
_d("const char *kvmem_dtype_name(kvmem_dtype dtype)", c_char_p, c_enum)
_d("kvmem_status kvmem_tensor_init(kvmem_tensor *out, void *data, kvmem_dtype dtype, int32_t ndim, "
   "const int64_t *shape)", STATUS, T_p, c_void_p, c_enum, c_int32, POINTER(c_int64))
# Context and backends
_d("kvmem_status kvmem_backends(kvmem_backend_info *out, size_t capacity, size_t *count)",
   STATUS, POINTER(kvmem_backend_info), c_size_t, POINTER(c_size_t))
_d("kvmem_status kvmem_context_params_init(kvmem_context_params *params, size_t struct_size)", STATUS,
   POINTER(kvmem_context_params), c_size_t)
_d("kvmem_status kvmem_context_create(const kvmem_context_params *params, kvmem_context **out)",
   STATUS, POINTER(kvmem_context_params), POINTER(ctx_p))
_d("void kvmem_context_free(kvmem_context *ctx)", None, ctx_p)
_d("const char *kvmem_context_backend(const kvmem_context *ctx)", c_char_p, ctx_p)
_d("int32_t kvmem_context_n_threads(const kvmem_context *ctx)", c_int32, ctx_p)
# (experimental) host <-> device transfer counters
_d("kvmem_status kvmem_context_transfer_stats(const kvmem_context *ctx, uint64_t *h2d_bytes, uint64_t *d2h_bytes)",
   STATUS, ctx_p, POINTER(c_uint64), POINTER(c_uint64))
_d("kvmem_status kvmem_context_transfer_reset(kvmem_context *ctx)", STATUS, ctx_p)
_d("kvmem_status kvmem_pool_device_stats(kvmem_pool *pool, uint64_t *mirror_bytes, uint64_t *evictions, "
   "uint64_t *unmirrored)", STATUS, pool_p, POINTER(c_uint64), POINTER(c_uint64), POINTER(c_uint64))
# (experimental) device tensors
_d("kvmem_status kvmem_tensor_init_device(kvmem_tensor *out, const kvmem_device_memory *mem, kvmem_dtype dtype, "
   "int32_t ndim, const int64_t *shape)",
   STATUS, POINTER(kvmem_tensor), POINTER(kvmem_device_memory), c_enum, c_int32, POINTER(c_int64))
_d("kvmem_status kvmem_context_vulkan_device(const kvmem_context *ctx, kvmem_vulkan_device *out)",
   STATUS, ctx_p, POINTER(kvmem_vulkan_device))
# Model geometry
_d("kvmem_model_spec kvmem_model_spec_default(void)", kvmem_model_spec)
_d("kvmem_status kvmem_model_spec_validate(const kvmem_model_spec *spec)", STATUS, POINTER(kvmem_model_spec))
_d("kvmem_status kvmem_rope_apply(const kvmem_model_spec *spec, float *x, size_t n_rows, size_t stride, "
   "const int32_t *positions, int32_t inverse)",
   STATUS, POINTER(kvmem_model_spec), c_void_p, c_size_t, c_size_t, c_void_p, c_int32)
# Pool and agents
_d("kvmem_status kvmem_pool_params_init(kvmem_pool_params *params, size_t struct_size)", STATUS,
   POINTER(kvmem_pool_params), c_size_t)
_d("kvmem_status kvmem_pool_create(kvmem_context *ctx, const kvmem_model_spec *spec, "
   "const kvmem_pool_params *params, kvmem_pool **out)",
   STATUS, ctx_p, POINTER(kvmem_model_spec), POINTER(kvmem_pool_params), POINTER(pool_p))
_d("void kvmem_pool_free(kvmem_pool *pool)", None, pool_p)
_d("kvmem_status kvmem_pool_get_info(kvmem_pool *pool, kvmem_pool_info *out)", STATUS, pool_p, POINTER(kvmem_pool_info))
_d("kvmem_status kvmem_pool_get_spec(kvmem_pool *pool, kvmem_model_spec *out)", STATUS, pool_p, POINTER(kvmem_model_spec))
_d("kvmem_status kvmem_pool_agent_id(kvmem_pool *pool, int32_t index, char *buf, size_t size, size_t *len)",
   STATUS, pool_p, c_int32, c_void_p, c_size_t, POINTER(c_size_t))
_d("int32_t kvmem_agent_id_valid(const char *id)", c_int32, c_char_p)
_d("kvmem_status kvmem_agent_open(kvmem_pool *pool, const char *id, kvmem_agent **out)",
   STATUS, pool_p, c_char_p, POINTER(agent_p))
_d("void kvmem_agent_close(kvmem_agent *agent)", None, agent_p)
_d("kvmem_status kvmem_agent_open_file(kvmem_pool *pool, const char *path, uint32_t flags, kvmem_agent **out)",
   STATUS, pool_p, c_char_p, c_uint32, POINTER(agent_p))
_d("kvmem_status kvmem_pool_remove_agent(kvmem_pool *pool, const char *id)", STATUS, pool_p, c_char_p)
_d("const char *kvmem_agent_get_id(const kvmem_agent *agent)", c_char_p, agent_p)
_d("kvmem_status kvmem_append_params_init(kvmem_append_params *params, size_t struct_size)", STATUS,
   POINTER(kvmem_append_params), c_size_t)
_d("kvmem_status kvmem_agent_append(kvmem_agent *agent, const kvmem_tensor *k, const kvmem_tensor *v, "
   "const kvmem_append_params *params)", STATUS, agent_p, T_p, T_p, POINTER(kvmem_append_params))
_d("kvmem_status kvmem_agent_flush(kvmem_agent *agent)", STATUS, agent_p)
_d("kvmem_status kvmem_agent_get_info(kvmem_agent *agent, kvmem_agent_info *out)", STATUS, agent_p, POINTER(kvmem_agent_info))
_d("kvmem_status kvmem_agent_block_info(kvmem_agent *agent, int32_t block, kvmem_block_info *out)",
   STATUS, agent_p, c_int32, POINTER(kvmem_block_info))
_d("kvmem_status kvmem_agent_read(kvmem_agent *agent, int64_t first_token, int64_t n_tokens, "
   "const kvmem_tensor *k_out, const kvmem_tensor *v_out)", STATUS, agent_p, c_int64, c_int64, T_p, T_p)
_d("kvmem_status kvmem_agent_block_aabb(kvmem_agent *agent, int32_t block, float *out_min, float *out_max)",
   STATUS, agent_p, c_int32, c_void_p, c_void_p)
_d("kvmem_status kvmem_agent_tokens(kvmem_agent *agent, int64_t first, int64_t n, int32_t *out)",
   STATUS, agent_p, c_int64, c_int64, c_void_p)
_d("kvmem_status kvmem_agent_text(kvmem_agent *agent, const char **text, size_t *len)",
   STATUS, agent_p, POINTER(c_void_p), POINTER(c_size_t))
# MemArt retrieval
_d("kvmem_status kvmem_retrieve_params_init(kvmem_retrieve_params *params, size_t struct_size)", STATUS,
   POINTER(kvmem_retrieve_params), c_size_t)
_d("kvmem_status kvmem_retrieval_create(kvmem_retrieval **out)", STATUS, POINTER(retrieval_p))
_d("void kvmem_retrieval_free(kvmem_retrieval *r)", None, retrieval_p)
_d("kvmem_status kvmem_retrieve(kvmem_agent *agent, const kvmem_tensor *query, "
   "const kvmem_retrieve_params *params, kvmem_retrieval *result)",
   STATUS, agent_p, T_p, POINTER(kvmem_retrieve_params), retrieval_p)
_d("int32_t kvmem_retrieval_n_sets(const kvmem_retrieval *r)", c_int32, retrieval_p)
_d("kvmem_status kvmem_retrieval_get(const kvmem_retrieval *r, int32_t set, const int32_t **blocks, "
   "const float **scores, int32_t *n)", STATUS, retrieval_p, c_int32, POINTER(c_void_p), POINTER(c_void_p), POINTER(c_int32))
_d("kvmem_status kvmem_retrieval_copy(const kvmem_retrieval *r, int32_t set, int32_t *blocks, float *scores, "
   "int32_t capacity, int32_t *n)", STATUS, retrieval_p, c_int32, c_void_p, c_void_p, c_int32, POINTER(c_int32))
_d("kvmem_status kvmem_retrieval_block_scores(const kvmem_retrieval *r, int32_t set, const float **scores, "
   "int32_t *n_blocks)", STATUS, retrieval_p, c_int32, POINTER(c_void_p), POINTER(c_int32))
_d("kvmem_status kvmem_retrieval_n_tokens(const kvmem_retrieval *r, int32_t set, int64_t *n_tokens)",
   STATUS, retrieval_p, c_int32, POINTER(c_int64))
_d("kvmem_status kvmem_gather(kvmem_agent *agent, const int32_t *blocks, int32_t n_blocks, int64_t base_position, "
   "const kvmem_tensor *k_out, const kvmem_tensor *v_out)", STATUS, agent_p, c_void_p, c_int32, c_int64, T_p, T_p)
# KEEP segments
_d("kvmem_status kvmem_segments_params_init(kvmem_segments_params *params, size_t struct_size)", STATUS,
   POINTER(kvmem_segments_params), c_size_t)
_d("kvmem_status kvmem_segments_create(kvmem_pool *pool, const char *owner, const kvmem_segments_params *params, "
   "kvmem_segments **out)", STATUS, pool_p, c_char_p, POINTER(kvmem_segments_params), POINTER(segs_p))
_d("void kvmem_segments_free(kvmem_segments *segs)", None, segs_p)
_d("kvmem_status kvmem_segments_add(kvmem_segments *segs, const char *name, int32_t group, int32_t *index)",
   STATUS, segs_p, c_char_p, c_int32, POINTER(c_int32))
_d("kvmem_status kvmem_segments_update(kvmem_segments *segs, int32_t index)", STATUS, segs_p, c_int32)
_d("kvmem_status kvmem_segments_remove(kvmem_segments *segs, int32_t index)", STATUS, segs_p, c_int32)
_d("kvmem_status kvmem_segments_assign(kvmem_segments *segs, int32_t index, int32_t group)", STATUS, segs_p, c_int32, c_int32)
_d("kvmem_status kvmem_segments_step(kvmem_segments *segs)", STATUS, segs_p)
_d("kvmem_status kvmem_segments_drain_events(kvmem_segments *segs, kvmem_segment_event *out, size_t capacity, "
   "size_t *n_out, size_t *n_left)", STATUS, segs_p, POINTER(kvmem_segment_event), c_size_t, POINTER(c_size_t), POINTER(c_size_t))
_d("kvmem_status kvmem_segments_store_segment(kvmem_segments *segs, int32_t index, const kvmem_tensor *k, "
   "const kvmem_tensor *v, const kvmem_append_params *params)", STATUS, segs_p, c_int32, T_p, T_p, POINTER(kvmem_append_params))
_d("kvmem_status kvmem_segments_store_group(kvmem_segments *segs, int32_t group, const kvmem_tensor *k, "
   "const kvmem_tensor *v, const kvmem_append_params *params)", STATUS, segs_p, c_int32, T_p, T_p, POINTER(kvmem_append_params))
_d("kvmem_status kvmem_segments_get_info(kvmem_segments *segs, kvmem_segments_info *out)", STATUS, segs_p, POINTER(kvmem_segments_info))
_d("kvmem_status kvmem_segments_segment_info(kvmem_segments *segs, int32_t index, kvmem_segment_info *out)",
   STATUS, segs_p, c_int32, POINTER(kvmem_segment_info))
_d("kvmem_status kvmem_segments_group_info(kvmem_segments *segs, int32_t group, kvmem_group_info *out)",
   STATUS, segs_p, c_int32, POINTER(kvmem_group_info))
_d("kvmem_status kvmem_segments_find(kvmem_segments *segs, const char *name, int32_t *index)",
   STATUS, segs_p, c_char_p, POINTER(c_int32))
_d("kvmem_status kvmem_segments_name(kvmem_segments *segs, int32_t index, char *buf, size_t size, size_t *len)",
   STATUS, segs_p, c_int32, c_void_p, c_size_t, POINTER(c_size_t))
_d("kvmem_status kvmem_segments_group_members(kvmem_segments *segs, int32_t group, int32_t *out, size_t capacity, "
   "size_t *n_members)", STATUS, segs_p, c_int32, c_void_p, c_size_t, POINTER(c_size_t))
_d("kvmem_status kvmem_segments_plan(kvmem_segments *segs, const float *scores, size_t n_scores, int32_t max_units, "
   "kvmem_segment_unit *out, size_t capacity, size_t *n_units)",
   STATUS, segs_p, c_void_p, c_size_t, c_int32, POINTER(kvmem_segment_unit), c_size_t, POINTER(c_size_t))
_d("kvmem_status kvmem_kmeans_params_init(kvmem_kmeans_params *params, size_t struct_size)", STATUS,
   POINTER(kvmem_kmeans_params), c_size_t)
_d("kvmem_status kvmem_cluster_kmeans(const float *emb, size_t n, size_t dim, const kvmem_kmeans_params *params, "
   "int32_t *labels, float *centroids, int32_t *iters)",
   STATUS, c_void_p, c_size_t, c_size_t, POINTER(kvmem_kmeans_params), c_void_p, c_void_p, POINTER(c_int32))
_d("kvmem_status kvmem_multihop_params_init(kvmem_multihop_params *params, size_t struct_size)", STATUS,
   POINTER(kvmem_multihop_params), c_size_t)
_d("kvmem_status kvmem_multihop_select(const kvmem_multihop_params *params, const float *q2s, int32_t n_query, "
   "const float *s2s, int32_t n_segments, const uint8_t *candidates, uint8_t *selected, float *importance, "
   "kvmem_multihop_result *result)", STATUS, POINTER(kvmem_multihop_params), c_void_p, c_int32, c_void_p, c_int32,
   c_void_p, c_void_p, c_void_p, POINTER(kvmem_multihop_result))
_d("kvmem_status kvmem_multihop_schedule(int32_t n_layers, float avg, float *ratios)", STATUS, c_int32, ctypes.c_float, c_void_p)
_d("kvmem_status kvmem_load_plan_params_init(kvmem_load_plan_params *params, size_t struct_size)", STATUS,
   POINTER(kvmem_load_plan_params), c_size_t)
_d("kvmem_status kvmem_load_plan(const kvmem_load_plan_params *params, const double *compute_ms, int32_t n_layers, "
   "const uint64_t *load_bytes, int32_t n_segments, const uint8_t *recompute, kvmem_load_item *items, "
   "size_t capacity, size_t *n_items, double *layer_start_ms, kvmem_load_plan_stats *stats)",
   STATUS, POINTER(kvmem_load_plan_params), c_void_p, c_int32, c_void_p, c_int32, c_void_p,
   POINTER(kvmem_load_item), c_size_t, POINTER(c_size_t), c_void_p, POINTER(kvmem_load_plan_stats))
# IntentKV: QueryMemory, selection baselines, slot maps
_d("kvmem_status kvmem_qmem_params_init(kvmem_qmem_params *params, size_t struct_size)", STATUS,
   POINTER(kvmem_qmem_params), c_size_t)
_d("kvmem_status kvmem_qmem_store_create(const kvmem_model_spec *spec, const kvmem_qmem_params *params, "
   "kvmem_qmem_store **out)", STATUS, POINTER(kvmem_model_spec), POINTER(kvmem_qmem_params), POINTER(qstore_p))
_d("void kvmem_qmem_store_free(kvmem_qmem_store *store)", None, qstore_p)
_d("kvmem_status kvmem_session_key_derive(const kvmem_qmem_store *store, const kvmem_session_source *src, "
   "kvmem_session_key *out)", STATUS, qstore_p, POINTER(kvmem_session_source), POINTER(kvmem_session_key))
_d("kvmem_status kvmem_session_key_derive_v2(const kvmem_qmem_store *store, const kvmem_session_source_v2 *src, "
   "kvmem_session_key *out)", STATUS, qstore_p, POINTER(kvmem_session_source_v2), POINTER(kvmem_session_key))
_d("kvmem_status kvmem_qmem_update(kvmem_qmem_store *store, const kvmem_session_key *key, const kvmem_tensor *q, "
   "int64_t span_begin, int64_t span_end, float *memory_out)",
   STATUS, qstore_p, POINTER(kvmem_session_key), T_p, c_int64, c_int64, c_void_p)
_d("kvmem_status kvmem_qmem_get(kvmem_qmem_store *store, const kvmem_session_key *key, float *out)",
   STATUS, qstore_p, POINTER(kvmem_session_key), c_void_p)
_d("int32_t kvmem_qmem_count(const kvmem_qmem_store *store)", c_int32, qstore_p)
_d("kvmem_status kvmem_qmem_score(kvmem_context *ctx, const kvmem_model_spec *spec, const float *memory, "
   "const kvmem_tensor *k, float *scores)", STATUS, ctx_p, POINTER(kvmem_model_spec), c_void_p, T_p, c_void_p)
_d("kvmem_status kvmem_qmem_head_load(const char *path, kvmem_qmem_head **out)", STATUS, c_char_p, POINTER(qhead_p))
_d("kvmem_status kvmem_qmem_head_load_buffer(const void *data, size_t size, kvmem_qmem_head **out)",
   STATUS, c_void_p, c_size_t, POINTER(qhead_p))
_d("void kvmem_qmem_head_free(kvmem_qmem_head *head)", None, qhead_p)
_d("int32_t kvmem_qmem_head_dim(const kvmem_qmem_head *head)", c_int32, qhead_p)
_d("float kvmem_qmem_head_alpha(const kvmem_qmem_head *head)", ctypes.c_float, qhead_p)
_d("kvmem_status kvmem_qmem_head_apply(const kvmem_qmem_head *head, const kvmem_model_spec *spec, "
   "const float *memory, const kvmem_tensor *k, const float *rule, int64_t span_begin, int64_t span_end, "
   "float *scores_out)", STATUS, qhead_p, POINTER(kvmem_model_spec), c_void_p, T_p, c_void_p, c_int64, c_int64, c_void_p)
_d("kvmem_status kvmem_select_keep(const float *scores, int64_t n, int64_t budget, int64_t protect, "
   "int64_t span_begin, int64_t span_end, int32_t *kept, int64_t *n_kept)",
   STATUS, c_void_p, c_int64, c_int64, c_int64, c_int64, c_int64, c_void_p, POINTER(c_int64))
_d("kvmem_status kvmem_streaming_keep(int64_t n, int64_t n_sink, int64_t window, int32_t *kept, int64_t *n_kept)",
   STATUS, c_int64, c_int64, c_int64, c_void_p, POINTER(c_int64))
_d("kvmem_status kvmem_h2o_accumulate(const float *probs, int64_t n_rows, int64_t n, float *acc)",
   STATUS, c_void_p, c_int64, c_int64, c_void_p)
_d("kvmem_status kvmem_h2o_keep(const float *acc, int64_t n, int64_t budget, int64_t recent, int32_t *kept, "
   "int64_t *n_kept)", STATUS, c_void_p, c_int64, c_int64, c_int64, c_void_p, POINTER(c_int64))
_d("kvmem_status kvmem_snapkv_score(kvmem_context *ctx, const kvmem_model_spec *spec, const kvmem_tensor *q_obs, "
   "const kvmem_tensor *k, int32_t pool_kernel, float *scores)",
   STATUS, ctx_p, POINTER(kvmem_model_spec), T_p, T_p, c_int32, c_void_p)
_d("kvmem_status kvmem_arrange(const int32_t *blocks, const float *scores, int32_t n, kvmem_arrange_order order, "
   "int32_t *out)", STATUS, c_void_p, c_void_p, c_int32, c_enum, c_void_p)
_d("kvmem_status kvmem_window_split(int32_t window, int32_t reserve, float memory_share, float live_share, "
   "int32_t block_size, kvmem_window_plan *out)",
   STATUS, c_int32, c_int32, ctypes.c_float, ctypes.c_float, c_int32, POINTER(kvmem_window_plan))
_d("kvmem_status kvmem_kvstore_params_init(kvmem_kvstore_params *params, size_t struct_size)", STATUS,
   POINTER(kvmem_kvstore_params), c_size_t)
_d("kvmem_status kvmem_kvstore_create(const kvmem_model_spec *spec, const kvmem_kvstore_params *params, "
   "kvmem_kvstore **out)", STATUS, POINTER(kvmem_model_spec), POINTER(kvmem_kvstore_params), POINTER(kvstore_p))
_d("void kvmem_kvstore_free(kvmem_kvstore *store)", None, kvstore_p)
_d("kvmem_status kvmem_kvstore_get_info(kvmem_kvstore *store, kvmem_kvstore_info *out)",
   STATUS, kvstore_p, POINTER(kvmem_kvstore_info))
_d("kvmem_status kvmem_kvstore_slot_refs(kvmem_kvstore *store, int32_t slot, int32_t *refs)",
   STATUS, kvstore_p, c_int32, POINTER(c_int32))
_d("kvmem_status kvmem_kvstore_read_slot(kvmem_kvstore *store, int32_t slot, float *k_out, float *v_out)",
   STATUS, kvstore_p, c_int32, c_void_p, c_void_p)
_d("kvmem_status kvmem_slotmap_create(kvmem_kvstore *store, kvmem_slotmap **out)", STATUS, kvstore_p, POINTER(slotmap_p))
_d("kvmem_status kvmem_slotmap_fork(kvmem_slotmap *parent, int64_t prefix_len, kvmem_slotmap **out)",
   STATUS, slotmap_p, c_int64, POINTER(slotmap_p))
_d("void kvmem_slotmap_free(kvmem_slotmap *map)", None, slotmap_p)
_d("kvmem_status kvmem_slotmap_append(kvmem_slotmap *map, const kvmem_tensor *k, const kvmem_tensor *v)",
   STATUS, slotmap_p, T_p, T_p)
_d("kvmem_status kvmem_slotmap_set_protected(kvmem_slotmap *map, int64_t protect)", STATUS, slotmap_p, c_int64)
_d("kvmem_status kvmem_slotmap_evict(kvmem_slotmap *map, const int32_t *kept, int64_t n_kept, int64_t *n_freed)",
   STATUS, slotmap_p, c_void_p, c_int64, POINTER(c_int64))
_d("kvmem_status kvmem_slotmap_compact(kvmem_slotmap *map, const int32_t *kept, int64_t n_kept, int64_t *n_freed)",
   STATUS, slotmap_p, c_void_p, c_int64, POINTER(c_int64))
_d("kvmem_status kvmem_slotmap_slots(const kvmem_slotmap *map, const int32_t **slots, int64_t *len, "
   "int32_t *dead_slot)", STATUS, slotmap_p, POINTER(c_void_p), POINTER(c_int64), POINTER(c_int32))
_d("kvmem_status kvmem_slotmap_get_info(const kvmem_slotmap *map, kvmem_slotmap_info *out)",
   STATUS, slotmap_p, POINTER(kvmem_slotmap_info))
_d("kvmem_status kvmem_slotmap_gather(const kvmem_slotmap *map, const kvmem_tensor *k_out, "
   "const kvmem_tensor *v_out, int32_t *positions_out)", STATUS, slotmap_p, T_p, T_p, c_void_p)
# ART attention
_d("kvmem_status kvmem_attend_params_init(kvmem_attend_params *params, size_t struct_size)", STATUS,
   POINTER(kvmem_attend_params), c_size_t)
_d("kvmem_status kvmem_attend(kvmem_context *ctx, const kvmem_tensor *q, const kvmem_attend_source *source, "
   "const kvmem_attend_params *params, const kvmem_tensor *out, kvmem_attend_stats *stats)",
   STATUS, ctx_p, T_p, POINTER(kvmem_attend_source), POINTER(kvmem_attend_params), T_p, POINTER(kvmem_attend_stats))
# Persistence, prefix, batch
_d("kvmem_status kvmem_attend_v2(kvmem_context *ctx, const kvmem_tensor *q, const kvmem_attend_source_v2 *source, "
   "const kvmem_attend_params *params, const kvmem_tensor *out, kvmem_attend_stats *stats)",
   STATUS, ctx_p, T_p, POINTER(kvmem_attend_source_v2), POINTER(kvmem_attend_params), T_p, POINTER(kvmem_attend_stats))
_d("kvmem_status kvmem_agent_save(kvmem_agent *agent, const char *path)", STATUS, agent_p, c_char_p)
_d("kvmem_status kvmem_agent_load(kvmem_agent *agent, const char *path)", STATUS, agent_p, c_char_p)
_d("kvmem_status kvmem_pool_sync(kvmem_pool *pool)", STATUS, pool_p)
_d("kvmem_status kvmem_agent_truncate(kvmem_agent *agent, int64_t n_tokens)", STATUS, agent_p, c_int64)
_d("kvmem_status kvmem_prefix_params_init(kvmem_prefix_params *params, size_t struct_size)", STATUS,
   POINTER(kvmem_prefix_params), c_size_t)
_d("kvmem_status kvmem_prefix_match(kvmem_agent *agent, const char *new_text, size_t new_len, "
   "const kvmem_prefix_params *params, kvmem_prefix_result *out)",
   STATUS, agent_p, c_void_p, c_size_t, POINTER(kvmem_prefix_params), POINTER(kvmem_prefix_result))
_d("kvmem_status kvmem_batch_merge(kvmem_agent *const *agents, int32_t n_agents, int32_t layer, "
   "const kvmem_tensor *k_out, const kvmem_tensor *v_out, int64_t *lengths)",
   STATUS, POINTER(c_void_p), c_int32, c_int32, T_p, T_p, c_void_p)
_d("kvmem_status kvmem_batch_extract(const kvmem_tensor *batch, int32_t row, int64_t length, int64_t first, "
   "int64_t n, const kvmem_tensor *out)", STATUS, T_p, c_int32, c_int64, c_int64, c_int64, T_p)
# The model spec that grows (kvmem_model_spec_v2) and the _v2 forms of the calls that take a spec
spec2_p = POINTER(kvmem_model_spec_v2)
_d("kvmem_status kvmem_model_spec_v2_init(kvmem_model_spec_v2 *spec, size_t struct_size)", STATUS, spec2_p, c_size_t)
_d("kvmem_status kvmem_model_spec_validate_v2(const kvmem_model_spec_v2 *spec)", STATUS, spec2_p)
_d("kvmem_status kvmem_rope_apply_v2(const kvmem_model_spec_v2 *spec, float *x, size_t n_rows, size_t stride, "
   "const int32_t *positions, int32_t inverse)", STATUS, spec2_p, c_void_p, c_size_t, c_size_t, c_void_p, c_int32)
_d("kvmem_status kvmem_pool_create_v2(kvmem_context *ctx, const kvmem_model_spec_v2 *spec, "
   "const kvmem_pool_params *params, kvmem_pool **out)",
   STATUS, ctx_p, spec2_p, POINTER(kvmem_pool_params), POINTER(pool_p))
_d("kvmem_status kvmem_pool_get_spec_v2(kvmem_pool *pool, kvmem_model_spec_v2 *out)", STATUS, pool_p, spec2_p)
_d("kvmem_status kvmem_qmem_store_create_v2(const kvmem_model_spec_v2 *spec, const kvmem_qmem_params *params, "
   "kvmem_qmem_store **out)", STATUS, spec2_p, POINTER(kvmem_qmem_params), POINTER(qstore_p))
_d("kvmem_status kvmem_qmem_score_v2(kvmem_context *ctx, const kvmem_model_spec_v2 *spec, const float *memory, "
   "const kvmem_tensor *k, float *scores)", STATUS, ctx_p, spec2_p, c_void_p, T_p, c_void_p)
_d("kvmem_status kvmem_kvstore_create_v2(const kvmem_model_spec_v2 *spec, const kvmem_kvstore_params *params, "
   "kvmem_kvstore **out)", STATUS, spec2_p, POINTER(kvmem_kvstore_params), POINTER(kvstore_p))
_d("kvmem_status kvmem_qmem_head_apply_v2(const kvmem_qmem_head *head, const kvmem_model_spec_v2 *spec, "
   "const float *memory, const kvmem_tensor *k, const float *rule, int64_t span_begin, int64_t span_end, "
   "float *scores_out)", STATUS, qhead_p, spec2_p, c_void_p, T_p, c_void_p, c_int64, c_int64, c_void_p)
_d("kvmem_status kvmem_snapkv_score_v2(kvmem_context *ctx, const kvmem_model_spec_v2 *spec, "
   "const kvmem_tensor *q_obs, const kvmem_tensor *k, int32_t pool_kernel, float *scores)",
   STATUS, ctx_p, spec2_p, T_p, T_p, c_int32, c_void_p)
# Deprecated: the failure message in a caller buffer (kvmem_agent_last_error
# and co replace them). Declared, not used.
_d("kvmem_status kvmem_pool_sync_errbuf(kvmem_pool *pool, char *errbuf, size_t errbuf_size)",
   STATUS, pool_p, c_void_p, c_size_t)
_d("kvmem_status kvmem_agent_append_errbuf(kvmem_agent *agent, const kvmem_tensor *k, const kvmem_tensor *v, "
   "const kvmem_append_params *params, char *errbuf, size_t errbuf_size)",
   STATUS, agent_p, T_p, T_p, POINTER(kvmem_append_params), c_void_p, c_size_t)
_d("kvmem_status kvmem_agent_read_errbuf(kvmem_agent *agent, int64_t first_token, int64_t n_tokens, "
   "const kvmem_tensor *k_out, const kvmem_tensor *v_out, char *errbuf, size_t errbuf_size)",
   STATUS, agent_p, c_int64, c_int64, T_p, T_p, c_void_p, c_size_t)
_d("kvmem_status kvmem_agent_save_errbuf(kvmem_agent *agent, const char *path, char *errbuf, size_t errbuf_size)",
   STATUS, agent_p, c_char_p, c_void_p, c_size_t)
_d("kvmem_status kvmem_agent_load_errbuf(kvmem_agent *agent, const char *path, char *errbuf, size_t errbuf_size)",
   STATUS, agent_p, c_char_p, c_void_p, c_size_t)
_d("kvmem_status kvmem_retrieve_errbuf(kvmem_agent *agent, const kvmem_tensor *query, "
   "const kvmem_retrieve_params *params, kvmem_retrieval *result, char *errbuf, size_t errbuf_size)",
   STATUS, agent_p, T_p, POINTER(kvmem_retrieve_params), retrieval_p, c_void_p, c_size_t)
_d("kvmem_status kvmem_gather_errbuf(kvmem_agent *agent, const int32_t *blocks, int32_t n_blocks, "
   "int64_t base_position, const kvmem_tensor *k_out, const kvmem_tensor *v_out, char *errbuf, size_t errbuf_size)",
   STATUS, agent_p, c_void_p, c_int32, c_int64, T_p, T_p, c_void_p, c_size_t)
_d("kvmem_status kvmem_attend_errbuf(kvmem_context *ctx, const kvmem_tensor *q, const kvmem_attend_source *source, "
   "const kvmem_attend_params *params, const kvmem_tensor *out, kvmem_attend_stats *stats, char *errbuf, "
   "size_t errbuf_size)", STATUS, ctx_p, T_p, POINTER(kvmem_attend_source), POINTER(kvmem_attend_params), T_p,
   POINTER(kvmem_attend_stats), c_void_p, c_size_t)
del _d


def _last_error() -> str:
    return (kvmem_last_error() or b"").decode("utf-8", "replace")  # noqa: F821


def _status_str(status: int) -> str:
    return (kvmem_status_str(status) or b"").decode()  # noqa: F821


def _defaults(struct: Any, init: Any) -> Any:
    p = struct()
    init(ctypes.byref(p), ctypes.sizeof(p))
    return p


# kvmem.h's inline kvmem_X_default_params(): struct_size is the size of the
# struct declared here, so against a newer library this binding gets the
# defaults of the fields it knows and the library uses its own for the rest.
def kvmem_context_default_params() -> kvmem_context_params:
    return _defaults(kvmem_context_params, kvmem_context_params_init)  # noqa: F821


def kvmem_pool_default_params() -> kvmem_pool_params:
    return _defaults(kvmem_pool_params, kvmem_pool_params_init)  # noqa: F821


def kvmem_append_default_params() -> kvmem_append_params:
    return _defaults(kvmem_append_params, kvmem_append_params_init)  # noqa: F821


def kvmem_retrieve_default_params() -> kvmem_retrieve_params:
    return _defaults(kvmem_retrieve_params, kvmem_retrieve_params_init)  # noqa: F821


def kvmem_qmem_default_params() -> kvmem_qmem_params:
    return _defaults(kvmem_qmem_params, kvmem_qmem_params_init)  # noqa: F821


def kvmem_kvstore_default_params() -> kvmem_kvstore_params:
    return _defaults(kvmem_kvstore_params, kvmem_kvstore_params_init)  # noqa: F821


def kvmem_attend_default_params() -> kvmem_attend_params:
    return _defaults(kvmem_attend_params, kvmem_attend_params_init)  # noqa: F821


def kvmem_prefix_default_params() -> kvmem_prefix_params:
    return _defaults(kvmem_prefix_params, kvmem_prefix_params_init)  # noqa: F821


def kvmem_segments_default_params() -> kvmem_segments_params:
    return _defaults(kvmem_segments_params, kvmem_segments_params_init)  # noqa: F821


def kvmem_kmeans_default_params() -> kvmem_kmeans_params:
    return _defaults(kvmem_kmeans_params, kvmem_kmeans_params_init)  # noqa: F821


def kvmem_multihop_default_params() -> kvmem_multihop_params:
    return _defaults(kvmem_multihop_params, kvmem_multihop_params_init)  # noqa: F821


def kvmem_load_plan_default_params() -> kvmem_load_plan_params:
    return _defaults(kvmem_load_plan_params, kvmem_load_plan_params_init)  # noqa: F821


def header_functions(header: str) -> List[str]:
    """Names of the KVMEM_API functions declared in a kvmem.h text."""
    import re
    text = re.sub(r"/\*.*?\*/", " ", header, flags=re.S)
    text = re.sub(r"(?m)^\s*#.*$", " ", text)
    return re.findall(r"KVMEM_API\b[^;(]*?\b(kvmem_\w+)\s*\(", text)



def has_function(name: str) -> bool:
    """Whether the binding declares the C function `name` and the loaded library has it."""
    return name in DECLARED and name not in MISSING
