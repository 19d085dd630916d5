"""High level: Context, Pool, Agent owning their C handles.

Ownership mirrors the C API: a Pool keeps its Context alive, an Agent its
Pool. ``close()`` is idempotent; objects are context managers; a
weakref.finalize safety net frees what was not closed (also at interpreter
exit, newest object first). Closing a Pool closes its open Agents (the C
pool frees their handles); closing a Context closes its Pools. Using a closed
object raises ClosedError without calling C.

Threading: ctypes releases the GIL during C calls, so append/read/retrieve
from several threads run in parallel; as in C, one Agent is used by one
thread at a time.
"""
from __future__ import annotations

import ctypes
import weakref
from ctypes import byref, c_size_t, c_uint64, c_void_p
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _buffers as B
from . import _dlpack
from . import _ints
from . import _lib as L
from ._cstr import c_id, c_path
from ._info import AgentInfo, BlockInfo, GroupInfo, PoolInfo, SegmentInfo, SegmentsInfo, from_struct
from ._errors import ClosedError, InvalidArgumentError, InvalidTypeError
from ._types import Array, DTypeLike, FloatsLike, IntsLike, OutTensor, PathLike, SpecLike, TensorLike, TextLike

F32, F16, BF16 = B.F32, B.F16, B.BF16
Q8, Q4, Q4_KIVI = 3, 4, 5
ROPE_NEOX, ROPE_GPTJ = 0, 1
ROPE_SCALING_NONE, ROPE_SCALING_LINEAR, ROPE_SCALING_LLAMA3, ROPE_SCALING_YARN = 0, 1, 2, 3
LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR = 0, 1, 2, 3
RETRIEVE_AABB, RETRIEVE_EXACT = 0, 1
NORM_SOFTMAX, NORM_RR = 0, 1
AGG_MAX, AGG_SUM = 0, 1
SCOPE_GLOBAL, SCOPE_PER_LAYER = 0, 1

_STORAGE = {"f32": F32, "f16": F16, "bf16": BF16, "q8": Q8, "q4": Q4, "q4_kivi": Q4_KIVI}

# Fields of a params struct that are not parameters: the binding sets
# struct_size (kvmem.h, "ABI and versioning"), reserved stays 0.
_NOT_PARAMS = ("struct_size", "reserved")


def _given(values: Dict[str, Any]) -> Dict[str, Any]:
    """The keyword arguments a call was given (those not None), from its locals():
    None leaves the library's default."""
    return {k: v for k, v in values.items() if v is not None and k not in ("self", "__class__")}


def _s(b: Optional[bytes]) -> str:
    return b.decode("utf-8", "replace") if b else ""


# ---------------------------------------------------------------------------
# Free functions
# ---------------------------------------------------------------------------

def version() -> str:
    """Version string of the loaded library ("0.1.0")."""
    return _s(L.kvmem_version())


def version_number() -> int:
    """kvmem_version_number: the loaded library's version as X*1000000 + Y*1000 + Z."""
    return int(L.kvmem_version_number())


def status_str(status: int) -> str:
    """kvmem_status_str: the C name of a status code ("KVMEM_ERR_INVALID_ARG")."""
    return _s(L.kvmem_status_str(status))


def last_error() -> str:
    """kvmem_last_error() of this thread (exceptions already carry it)."""
    return _s(L.kvmem_last_error())


def dtype_name(dtype: int) -> str:
    """kvmem_dtype_name: the name of a dtype code ("f16")."""
    return _s(L.kvmem_dtype_name(dtype))


def agent_id_valid(agent_id: str) -> bool:
    """Whether agent_id is a valid agent id ([A-Za-z0-9._-]{1,128}, not starting with ".")."""
    if isinstance(agent_id, str) and "\x00" in agent_id:
        return False  # C would judge only the part before the NUL
    return bool(L.kvmem_agent_id_valid(c_id(agent_id, "agent id")))


_log_keep: List[Any] = []


def log_set(callback: Optional[Callable[[int, str], None]]) -> None:
    """Route kvmem's log messages to callback(level, message) (None: off).
    The callback may run on kvmem's worker threads; exceptions in it are ignored."""
    if callback is None:
        L.kvmem_log_set(L.kvmem_log_callback(), None)
        _log_keep.clear()
        return

    def tramp(level: int, msg: Optional[bytes], _ud: Any) -> None:
        try:
            callback(int(level), _s(msg))
        except Exception:  # never unwind into C
            pass

    cb = L.kvmem_log_callback(tramp)
    L.kvmem_log_set(cb, None)
    _log_keep[:] = [cb]  # the C side holds the pointer: keep the thunk alive


def backends() -> List[Dict[str, Any]]:
    """[{"name", "available", "detail"}] for every backend this build knows."""
    n = c_size_t()
    L.kvmem_backends(None, 0, byref(n))
    arr = (L.kvmem_backend_info * max(n.value, 1))()
    L.kvmem_backends(arr, n.value, byref(n))
    return [{"name": _s(b.name), "available": bool(b.available), "detail": _s(b.detail)}
            for b in arr[:n.value]]


class ModelSpec(L.kvmem_model_spec):
    """kvmem_model_spec: a model's geometry, starting from
    kvmem_model_spec_default(); each keyword sets the C field of that name
    (None keeps the default). model_id takes a str, layer_window a sequence of
    n_layers ints (0: full attention; kept alive by the spec, pools copy it)."""

    def __init__(self, *, n_layers: Optional[int] = None, n_q_heads: Optional[int] = None,
                 n_kv_heads: Optional[int] = None, head_dim: Optional[int] = None, rotary_dim: Optional[int] = None,
                 rope_style: Optional[int] = None, rope_theta: Optional[float] = None,
                 rope_scaling: Optional[int] = None, rope_factor: Optional[float] = None,
                 rope_low_freq_factor: Optional[float] = None, rope_high_freq_factor: Optional[float] = None,
                 rope_original_max_pos: Optional[int] = None, yarn_beta_fast: Optional[float] = None,
                 yarn_beta_slow: Optional[float] = None, yarn_attn_factor: Optional[float] = None,
                 layer_window: Optional[IntsLike] = None, model_id: Optional[str] = None) -> None:
        fields = _given(locals())
        super().__init__()
        ctypes.memmove(byref(self), byref(L.kvmem_model_spec_default()), ctypes.sizeof(self))
        for k, val in fields.items():
            setattr(self, k, val)

    @classmethod
    def of(cls, spec: SpecLike) -> "L.kvmem_model_spec":
        """A spec from a ModelSpec / kvmem_model_spec (as is) or a mapping of fields."""
        if isinstance(spec, L.kvmem_model_spec):
            return spec
        if isinstance(spec, Mapping):
            return cls(**spec)
        raise InvalidTypeError(f"a model spec must be a ModelSpec or a mapping of its fields, "
                        f"not {type(spec).__name__}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "model_id" and isinstance(value, str):
            value = c_id(value, "model_id")
        elif name == "model_id" and isinstance(value, (bytes, bytearray)) and b"\x00" in value:
            raise InvalidArgumentError(f"model_id {bytes(value)!r} contains a NUL character")
        elif name == "layer_window" and value is not None and not isinstance(value, ctypes._Pointer):
            arr = _ints.array(ctypes.c_int32, value, "layer_window")
            object.__setattr__(self, "_layer_window_keep", arr)
            value = ctypes.cast(arr, L.i32_p)
        elif name not in dict(L.kvmem_model_spec._fields_) and not name.startswith("_"):
            raise AttributeError(f"kvmem_model_spec has no field {name!r}")
        super().__setattr__(name, value)

    def validate(self) -> None:
        """kvmem_model_spec_validate: raises InvalidArgumentError naming the bad field."""
        if SPEC_V2:
            L.kvmem_model_spec_validate_v2(byref(spec_v2(self)))
        else:
            L.kvmem_model_spec_validate(byref(self))

    def __repr__(self) -> str:
        return (f"ModelSpec(n_layers={self.n_layers}, n_q_heads={self.n_q_heads}, "
                f"n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, "
                f"rope_theta={self.rope_theta:g}, model_id={_s(self.model_id)!r})")


# The growable spec (kvmem_model_spec_v2) where the loaded library has it,
# the frozen kvmem_model_spec against an older one: the same fields, the same
# meaning, so ModelSpec keeps the frozen layout and is converted per call.
SPEC_V2 = L.has_function("kvmem_model_spec_v2_init")


def spec_v2(spec: "L.kvmem_model_spec") -> "L.kvmem_model_spec_v2":
    """spec as kvmem_model_spec_v2: the library's defaults of this binding's
    struct_size (kvmem_model_spec_v2_init), then every field the two share.
    layer_window points at spec's array: keep spec alive for the call."""
    v = L.kvmem_model_spec_v2()
    L.kvmem_model_spec_v2_init(byref(v), ctypes.sizeof(v))
    for name, _t in L.kvmem_model_spec._fields_:
        setattr(v, name, getattr(spec, name))
    return v


def rope_apply(spec: SpecLike, x: OutTensor, positions: IntsLike, *, inverse: bool = False) -> None:
    """Rotate x in place: rows of head_dim f32 values (x is [..., head_dim],
    contiguous rows, row stride in elements taken from x), one position per row."""
    t, v = B.tensor(x, "x", dtype="f32", writable=True)
    try:
        n_rows = 1
        for i in range(t.ndim - 1):
            n_rows *= t.shape[i]
        stride = t.strides[t.ndim - 2] if t.ndim > 1 else t.shape[0]
        if t.ndim > 2 and not v.contiguous():
            raise InvalidTypeError("rope_apply: x must be contiguous rows (2-D may have a row stride)")
        if t.strides[t.ndim - 1] != 1:
            raise InvalidTypeError("rope_apply: each row of x must be contiguous")
        pp, pk = B.int32s(positions, "positions", n_rows)
        try:
            cs = ModelSpec.of(spec)
            if SPEC_V2:
                L.kvmem_rope_apply_v2(byref(spec_v2(cs)), t.data, n_rows, stride, pp, int(bool(inverse)))
            else:
                L.kvmem_rope_apply(byref(cs), t.data, n_rows, stride, pp, int(bool(inverse)))
        finally:
            B.release(pk)
    finally:
        v.close()


# ---------------------------------------------------------------------------
# Handles
# ---------------------------------------------------------------------------

def _free_guarded(fn: Any, handle: int) -> None:
    try:  # at interpreter exit the library may already be half torn down
        fn(handle)
    except Exception:
        pass


class _Handle:
    _kind = "object"

    def _init_handle(self, handle: int, free: Any) -> None:
        self._h: Optional[int] = handle
        self._fin = weakref.finalize(self, _free_guarded, free, handle)

    @property
    def handle(self) -> int:
        """The C pointer (int); ClosedError once closed."""
        if self._h is None:
            raise ClosedError(f"{self._kind} is closed")
        return self._h

    @property
    def closed(self) -> bool:
        """Whether close() has run (or the owner closed this object)."""
        return self._h is None

    def _forget(self) -> None:
        """The C side freed the handle already (its owner went away)."""
        self._fin.detach()
        self._h = None

    def close(self) -> None:
        """Free the C object; calling it again does nothing."""
        if self._h is not None:
            self._h = None
            self._fin()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _call_kv(spec: SpecLike, fn: Any, lead: Tuple[Any, ...], k: TensorLike, v: TensorLike, token_ids: IntsLike, text: TextLike,
             token_text_offsets: IntsLike, positions: IntsLike, keys_rotated: Any, dtype: Any) -> None:
    """fn(*lead, &k, &v, &append_params) with K, V [n_layers][T][n_kv_heads][head_dim]."""
    shape = (spec.n_layers, -1, spec.n_kv_heads, spec.head_dim)
    kt, kv = B.tensor(k, "k", shape, dtype)
    held: List[Any] = [kv]
    try:
        vt, vv = B.tensor(v, "v", shape, dtype)
        held.append(vv)
        T = kt.shape[1]
        ap = L.kvmem_append_default_params()
        ptr, h = B.int32s(token_ids, "token_ids", T)
        held.append(h)
        if ptr is not None:
            ap.token_ids = ptr
        if text is not None:
            tb = text.encode() if isinstance(text, str) else bytes(text)
            held.append(tb)
            ap.text, ap.text_len = tb, len(tb)
        ptr, h = B.int32s(token_text_offsets, "token_text_offsets", T)
        held.append(h)
        if ptr is not None:
            ap.token_text_offsets = ptr
        ptr, h = B.int32s(positions, "positions", T)
        held.append(h)
        if ptr is not None:
            ap.positions = ptr
        ap.keys_rotated = int(positions is not None if keys_rotated is None else bool(keys_rotated))
        fn(*lead, byref(kt), byref(vt), byref(ap))
    finally:
        B.release(*held)


def _object_error(fn: Any, handle: int) -> str:
    """An object's own copy of its last failure (kvmem_X_last_error): what the
    last failed call on it said, on whichever thread it ran."""
    buf = ctypes.create_string_buffer(512)
    n = int(fn(handle, buf, len(buf)))
    if n >= len(buf):
        buf = ctypes.create_string_buffer(n + 1)
        fn(handle, buf, len(buf))
    return buf.value.decode("utf-8", "replace")


class Context(_Handle):
    """kvmem_context: a backend ("cpu", "cuda", "vulkan", "auto") and worker threads."""
    _kind = "Context"

    def __init__(self, backend: str = "auto", n_threads: int = 0) -> None:
        p = L.kvmem_context_default_params()
        p.backend = c_id(backend, "backend")
        p.n_threads = n_threads
        h = c_void_p()
        L.kvmem_context_create(byref(p), byref(h))
        self._init_handle(h.value, L.kvmem_context_free)
        self._pools: "weakref.WeakSet[Pool]" = weakref.WeakSet()

    @property
    def backend(self) -> str:
        """The backend this context runs on ("cpu", "cuda", "vulkan")."""
        return _s(L.kvmem_context_backend(self.handle))

    @property
    def n_threads(self) -> int:
        """The number of worker threads the context uses."""
        return int(L.kvmem_context_n_threads(self.handle))

    @property
    def last_error(self) -> str:
        """The message of the last failed call on this context (attend,
        qmem_score), whichever thread made it (kvmem_context_last_error)."""
        return _object_error(L.kvmem_context_last_error, self.handle)

    def transfer_stats(self) -> "tuple[int, int]":
        """(h2d_bytes, d2h_bytes) the library moved to and from this context's
        backend buffers since creation or transfer_reset() (experimental)."""
        h, d = c_uint64(), c_uint64()
        L.kvmem_context_transfer_stats(self.handle, byref(h), byref(d))
        return int(h.value), int(d.value)

    def transfer_reset(self) -> None:
        """Set the transfer counters to 0 (experimental)."""
        L.kvmem_context_transfer_reset(self.handle)

    def vulkan_device(self) -> Dict[str, int]:
        """The Vulkan objects a "vulkan" context runs on (experimental), as
        integers: instance, physical_device, device, queue (handles),
        queue_family, api_version. Buffers made on this device can be passed as
        DeviceTensor(kind="vulkan", ...)."""
        out = L.kvmem_vulkan_device()
        out.struct_size = ctypes.sizeof(out)
        L.kvmem_context_vulkan_device(self.handle, byref(out))
        return {f: int(getattr(out, f) or 0) for f, _ in L.kvmem_vulkan_device._fields_ if f != "struct_size"}

    def pool_create(self, spec: SpecLike, *, block_size: Optional[int] = None,
                    storage_dtype: Union[str, int, None] = None, capacity_bytes: Optional[int] = None,
                    max_agents: Optional[int] = None, max_tokens_per_agent: Optional[int] = None,
                    store_dir: Optional[PathLike] = None, host_budget_bytes: Optional[int] = None,
                    device_capacity_bytes: Optional[int] = None) -> "Pool":
        """A Pool for spec (a ModelSpec or a dict of its fields); the parameters as Pool()."""
        params = _given(locals())
        del params["spec"]
        return Pool(self, spec, **params)

    def close(self) -> None:
        """Close the context's pools, then free it; calling it again does nothing."""
        for p in list(self._pools):
            p.close()
        super().close()


class Pool(_Handle):
    """kvmem_pool: the memory of agents of one model spec. block_size (tokens per
    block, a power of two), storage_dtype ("f16", "f32", "bf16", "q8", "q4",
    "q4_kivi" or a code), capacity_bytes (host memory for blocks, 0: no limit),
    max_agents, max_tokens_per_agent, store_dir (a directory where agents
    persist), host_budget_bytes, device_capacity_bytes (device bytes the
    agents' device-resident mirrors may hold, 0: no limit; see device_stats);
    None keeps kvmem_pool_default_params()'s value."""
    _kind = "Pool"

    def __init__(self, ctx: Context, spec: SpecLike, *, block_size: Optional[int] = None,
                 storage_dtype: Union[str, int, None] = None, capacity_bytes: Optional[int] = None,
                 max_agents: Optional[int] = None, max_tokens_per_agent: Optional[int] = None,
                 store_dir: Optional[PathLike] = None, host_budget_bytes: Optional[int] = None,
                 device_capacity_bytes: Optional[int] = None) -> None:
        params = _given(locals())
        del params["ctx"], params["spec"]
        spec = ModelSpec.of(spec)
        pp = L.kvmem_pool_default_params()
        for k, val in params.items():
            if k == "storage_dtype" and isinstance(val, str):
                if val.lower() not in _STORAGE:
                    raise InvalidArgumentError(f"storage_dtype {val!r} is not one of {sorted(_STORAGE)}")
                val = _STORAGE[val.lower()]
            if k not in dict(L.kvmem_pool_params._fields_) or k in _NOT_PARAMS:
                raise InvalidTypeError(f"Pool() got an unknown parameter {k!r}")
            if k == "store_dir":
                val = c_path(val, "store_dir")  # C copies it at create
            setattr(pp, k, val)
        h = c_void_p()
        if SPEC_V2:
            L.kvmem_pool_create_v2(ctx.handle, byref(spec_v2(spec)), byref(pp), byref(h))
        else:
            L.kvmem_pool_create(ctx.handle, byref(spec), byref(pp), byref(h))
        self._init_handle(h.value, L.kvmem_pool_free)
        self.context = ctx
        self._agents: "weakref.WeakSet[Agent]" = weakref.WeakSet()
        self._segments: "weakref.WeakSet[Segments]" = weakref.WeakSet()
        ctx._pools.add(self)
        self.spec = self.get_spec()

    def close(self) -> None:
        """Close the pool's segment stores, forget its agents (C frees them), free it; idempotent."""
        if self._h is not None:
            for sg in list(self._segments):
                sg.close()   # the pool must outlive its segment stores
            for a in list(self._agents):
                a._forget()  # kvmem_pool_free frees every agent handle
        super().close()

    def segments_create(self, owner: str, *, static_after_steps: Optional[int] = None,
                        max_segments: Optional[int] = None) -> "Segments":
        """A KEEP segment store whose KV lives in this pool (see Segments)."""
        params = _given(locals())
        del params["owner"]
        return Segments(self, owner, **params)

    @property
    def last_error(self) -> str:
        """The message of the last failed call on this pool (sync,
        agent_open, ...), whichever thread made it (kvmem_pool_last_error)."""
        return _object_error(L.kvmem_pool_last_error, self.handle)

    def get_info(self) -> PoolInfo:
        """kvmem_pool_get_info: bytes used, capacity, agents, block size, storage dtype."""
        info = L.kvmem_pool_info()
        L.kvmem_pool_get_info(self.handle, byref(info))
        return from_struct(PoolInfo, info)

    def device_stats(self) -> Dict[str, int]:
        """kvmem_pool_device_stats (experimental): {"mirror_bytes": device bytes
        the agents' device-resident mirrors hold, "evictions": closed agents'
        mirrors freed for room, "unmirrored": device calls served from the
        host copy because a mirror did not fit device_capacity_bytes}."""
        b, e, u = c_uint64(), c_uint64(), c_uint64()
        L.kvmem_pool_device_stats(self.handle, byref(b), byref(e), byref(u))
        return {"mirror_bytes": int(b.value), "evictions": int(e.value), "unmirrored": int(u.value)}

    def get_spec(self) -> "ModelSpec":
        """The pool's spec (a copy: layer_window, if any, is copied too)."""
        spec = ModelSpec()
        if SPEC_V2:
            raw = L.kvmem_model_spec_v2()
            L.kvmem_model_spec_v2_init(byref(raw), ctypes.sizeof(raw))
            L.kvmem_pool_get_spec_v2(self.handle, byref(raw))
            for name, _t in L.kvmem_model_spec._fields_:
                if name != "layer_window":
                    setattr(spec, name, getattr(raw, name))
        else:
            raw = L.kvmem_model_spec()
            L.kvmem_pool_get_spec(self.handle, byref(raw))
            ctypes.memmove(byref(spec), byref(raw), ctypes.sizeof(raw))
        if raw.layer_window:
            spec.layer_window = list(raw.layer_window[:raw.n_layers])
        return spec

    def agent_id(self, index: int) -> str:
        """kvmem_pool_agent_id: the id of the agent at index (agents sorted by id)."""
        n = c_size_t()
        L.kvmem_pool_agent_id(self.handle, index, None, 0, byref(n))
        buf = ctypes.create_string_buffer(n.value + 1)
        L.kvmem_pool_agent_id(self.handle, index, buf, n.value + 1, byref(n))
        return _s(buf.value)

    def agent_ids(self) -> List[str]:
        """The ids of every agent in the pool, sorted."""
        return [self.agent_id(i) for i in range(self.get_info().n_agents)]

    def sync(self) -> None:
        """kvmem_pool_sync: write changed agents to the pool's store."""
        L.kvmem_pool_sync(self.handle)

    def agent_open(self, agent_id: str) -> "Agent":
        """kvmem_agent_open: the agent of that id (created empty, or the one the pool's store holds)."""
        return Agent(self, agent_id)

    def agent_open_file(self, path: PathLike, *, verify: bool = True) -> "Agent":
        """kvmem_agent_open_file (experimental): a saved agent file opened in place, read-only;
        its KV blocks stay in the file and are read when used, so the agent may be larger
        than capacity_bytes. The agent takes the file's agent id. verify=False skips the
        data checksum pass."""
        h = c_void_p()
        L.kvmem_agent_open_file(self.handle, c_path(path), 0 if verify else L.OPEN_FILE_NO_VERIFY, byref(h))
        return Agent._adopt(self, h.value)

    def remove_agent(self, agent_id: str) -> None:
        """kvmem_pool_remove_agent: drop the agent from the pool (and from its store)."""
        L.kvmem_pool_remove_agent(self.handle, c_id(agent_id, "agent id"))


class Agent(_Handle):
    """kvmem_agent: one agent's memory in a pool. Open with Pool.agent_open."""
    _kind = "Agent"

    def __init__(self, pool: Pool, agent_id: str) -> None:
        h = c_void_p()
        L.kvmem_agent_open(pool.handle, c_id(agent_id, "agent id"), byref(h))
        self._init_handle(h.value, L.kvmem_agent_close)
        self.pool = pool
        pool._agents.add(self)
        self._kind = f"Agent {agent_id!r}"

    @classmethod
    def _adopt(cls, pool: Pool, handle: int) -> "Agent":
        """An Agent for a handle the C library just opened (kvmem_agent_open_file)."""
        self = cls.__new__(cls)
        self._init_handle(handle, L.kvmem_agent_close)
        self.pool = pool
        pool._agents.add(self)
        self._kind = f"Agent {self.id!r}"
        return self

    def _span(self, first: Any, n: Any, fn: str) -> Tuple[int, int]:
        """first and n (None: to the end) checked against the agent's tokens before
        an output of n tokens is allocated (n = 2**40 would ask for terabytes)."""
        first = _ints.check(first, "first", ctypes.c_int64)
        total = self.get_info().n_tokens
        n = _ints.check(total - first if n is None else n, "n", ctypes.c_int64)
        if first < 0 or n < 0 or first > total - n:
            raise InvalidArgumentError(f"{fn}: tokens [{first}, {first + n}) outside [0, {total})")
        return first, n

    def _kv_shape(self, n: int = -1) -> Tuple[int, int, int, int]:
        s = self.pool.spec
        return (s.n_layers, n, s.n_kv_heads, s.head_dim)

    @property
    def id(self) -> str:
        """The agent's id."""
        return _s(L.kvmem_agent_get_id(self.handle))

    @property
    def last_error(self) -> str:
        """The message of the last failed call on this agent, whichever
        thread made it (kvmem_agent_last_error)."""
        return _object_error(L.kvmem_agent_last_error, self.handle)

    def append(self, k: TensorLike, v: TensorLike, *, token_ids: Optional[IntsLike] = None, text: Optional[str | bytes] = None,
               token_text_offsets: Optional[IntsLike] = None, positions: Optional[IntsLike] = None,
               keys_rotated: Optional[bool] = None, dtype: DTypeLike = None) -> None:
        """Append T tokens. k, v: [n_layers][T][n_kv_heads][head_dim] buffers (any strides;
        flat contiguous buffers are read in that shape). positions (T int32) with
        post-RoPE keys; keys_rotated defaults to positions is not None."""
        _call_kv(self.pool.spec, L.kvmem_agent_append, (self.handle,), k, v, token_ids, text,
                 token_text_offsets, positions, keys_rotated, dtype)

    def flush(self) -> None:
        """kvmem_agent_flush: seal the partial last block so retrieval sees it."""
        L.kvmem_agent_flush(self.handle)

    def get_info(self) -> AgentInfo:
        """kvmem_agent_get_info: tokens, blocks, sealed blocks, bytes, text bytes."""
        info = L.kvmem_agent_info()
        L.kvmem_agent_get_info(self.handle, byref(info))
        return from_struct(AgentInfo, info)

    def block_info(self, block: int) -> BlockInfo:
        """kvmem_agent_block_info: a block's first token, token count and whether it is sealed."""
        bi = L.kvmem_block_info()
        L.kvmem_agent_block_info(self.handle, block, byref(bi))
        return from_struct(BlockInfo, bi)

    def read(self, first: int = 0, n: Optional[int] = None, *, k_out: Optional[OutTensor] = None, v_out: Optional[OutTensor] = None,
             dtype: DTypeLike = "f32", keys: bool = True, values: bool = True) -> Tuple[Any, Any]:
        """Raw KV of tokens [first, first+n) (n: to the end) as (k, v), each
        [n_layers][n][n_kv_heads][head_dim]. Given k_out/v_out buffers are
        written in place (any strides); otherwise new arrays of dtype."""
        first, n = self._span(first, n, "kvmem_agent_read")
        shape = self._kv_shape(n)
        if keys and k_out is None:
            k_out = B.new_array(shape, dtype)
        if values and v_out is None:
            v_out = B.new_array(shape, dtype)
        held: List[Any] = []
        try:
            kt = vt = None
            if k_out is not None:
                kt, h = B.tensor(k_out, "k_out", shape, dtype, writable=True)
                held.append(h)
            if v_out is not None:
                vt, h = B.tensor(v_out, "v_out", shape, dtype, writable=True)
                held.append(h)
            L.kvmem_agent_read(self.handle, first, n, byref(kt) if kt else None, byref(vt) if vt else None)
        finally:
            B.release(*held)
        return k_out, v_out

    def block_aabb(self, block: int) -> Tuple[Any, Any]:
        """(min, max) of a sealed block's raw keys, each [n_layers][n_kv_heads][head_dim] f32."""
        s = self.pool.spec
        shape = (s.n_layers, s.n_kv_heads, s.head_dim)
        mn, mx = B.new_array(shape), B.new_array(shape)
        with B.View(mn, True, "min") as a, B.View(mx, True, "max") as b:
            L.kvmem_agent_block_aabb(self.handle, block, a.address, b.address)
        return mn, mx

    def tokens(self, first: int = 0, n: Optional[int] = None) -> List[int]:
        """The token ids of tokens [first, first+n) (n: to the end); -1 where none was given."""
        first, n = self._span(first, n, "kvmem_agent_tokens")
        arr = (ctypes.c_int32 * max(n, 1))()
        L.kvmem_agent_tokens(self.handle, first, n, arr)
        return list(arr[:n])

    def text_bytes(self) -> bytes:
        """The text kept with the agent's tokens, as stored (UTF-8 bytes, copied)."""
        p, n = c_void_p(), c_size_t()
        L.kvmem_agent_text(self.handle, byref(p), byref(n))
        return ctypes.string_at(p.value, n.value) if n.value else b""

    def text(self) -> str:
        """The text kept with the agent's tokens, decoded from UTF-8."""
        return self.text_bytes().decode("utf-8", "replace")

    def save(self, path: Optional[PathLike] = None) -> None:
        """kvmem_agent_save: crash-safe safetensors file (None: the pool's store)."""
        L.kvmem_agent_save(self.handle, c_path(path))

    def load(self, path: Optional[PathLike] = None) -> None:
        """kvmem_agent_load: replace this agent's memory with a saved file (all or nothing)."""
        L.kvmem_agent_load(self.handle, c_path(path))

    def truncate(self, n_tokens: int) -> None:
        """kvmem_agent_truncate: keep the first n_tokens tokens (their blocks, ids and text)."""
        L.kvmem_agent_truncate(self.handle, n_tokens)

    def prefix_match(self, new_text: "str | bytes", min_ratio: Optional[float] = None) -> Dict[str, Any]:
        """kvmem_prefix_match: kind (PREFIX_EXACT/EXTEND/DIVERGE), reuse_tokens,
        common_bytes, process_from (a byte offset into the UTF-8 text)."""
        tb = new_text.encode() if isinstance(new_text, str) else bytes(new_text)
        pp = L.kvmem_prefix_default_params()
        if min_ratio is not None:
            pp.min_ratio = min_ratio
        res = L.kvmem_prefix_result()
        L.kvmem_prefix_match(self.handle, ctypes.c_char_p(tb), len(tb), byref(pp), byref(res))
        return _struct_dict(res)

    def retrieve(self, query: TensorLike, *, top_k: Optional[int] = None, mode: Optional[int] = None,
                 norm: Optional[int] = None, agg: Optional[int] = None, scope: Optional[int] = None,
                 tau: Optional[float] = None, rr_c: Optional[float] = None, recent_window: Optional[int] = None,
                 skip_recent: Optional[int] = None, exclude: Optional[IntsLike] = None,
                 always_include: Optional[IntsLike] = None, result: Optional["Retrieval"] = None,
                 dtype: DTypeLike = None) -> "Retrieval":
        """kvmem_retrieve: score the sealed blocks against query rows
        [n_q][n_layers][n_q_heads][head_dim] (raw, pre-RoPE) and keep the top_k.
        mode (RETRIEVE_AABB / RETRIEVE_EXACT), norm (NORM_SOFTMAX / NORM_RR), agg
        (AGG_MAX / AGG_SUM), scope (SCOPE_GLOBAL / SCOPE_PER_LAYER), tau, rr_c,
        recent_window, skip_recent, exclude and always_include (block ids) as in
        kvmem_retrieve_params; None keeps the default. Fills and returns `result`
        (a new Retrieval when None; reuse one to avoid allocations)."""
        params = {k: v for k, v in _given(locals()).items()
                  if k not in ("query", "exclude", "always_include", "result", "dtype")}
        s = self.pool.spec
        rp = L.kvmem_retrieve_default_params()
        for k, val in params.items():
            setattr(rp, k, val)
        held: List[Any] = []
        try:
            for name in ("exclude", "always_include"):
                lst = exclude if name == "exclude" else always_include
                if lst is not None:
                    ptr, h = B.int32s(lst if hasattr(lst, "__array_interface__") else list(lst), name)
                    held.append(h)
                    setattr(rp, name, ptr)
                    setattr(rp, "n_" + name, len(lst))
            qt, qv = B.tensor(query, "query", (-1, s.n_layers, s.n_q_heads, s.head_dim), dtype)
            held.append(qv)
            r = result if result is not None else Retrieval()
            L.kvmem_retrieve(self.handle, byref(qt), byref(rp), r.handle)
            return r
        finally:
            B.release(*held)

    def gather(self, blocks: IntsLike, base_position: int = 0, *, k_out: Optional[OutTensor] = None, v_out: Optional[OutTensor] = None,
               dtype: DTypeLike = "f32", keys: bool = True, values: bool = True) -> Tuple[Any, Any]:
        """kvmem_gather: the KV of sealed `blocks` concatenated and re-encoded with
        RoPE at positions base_position.. as (k, v) [n_layers][M][n_kv_heads][head_dim]."""
        ids = [_ints.check(b, f"blocks[{i}]", ctypes.c_int32) for i, b in enumerate(blocks)]
        m = sum(self.block_info(b).n_tokens for b in ids)
        shape = self._kv_shape(m)
        if keys and k_out is None:
            k_out = B.new_array(shape, dtype)
        if values and v_out is None:
            v_out = B.new_array(shape, dtype)
        arr = (ctypes.c_int32 * max(len(ids), 1))(*ids)
        held: List[Any] = []
        try:
            kt = vt = None
            if k_out is not None:
                kt, h = B.tensor(k_out, "k_out", shape, dtype, writable=True)
                held.append(h)
            if v_out is not None:
                vt, h = B.tensor(v_out, "v_out", shape, dtype, writable=True)
                held.append(h)
            L.kvmem_gather(self.handle, arr, len(ids), base_position,
                           byref(kt) if kt else None, byref(vt) if vt else None)
        finally:
            B.release(*held)
        return k_out, v_out

    def __repr__(self) -> str:
        return f"<kvmem.Agent {self._kind[6:]}{' closed' if self.closed else ''}>"



class Retrieval(_Handle):
    """kvmem_retrieval: the reusable result of Agent.retrieve."""
    _kind = "Retrieval"

    def __init__(self) -> None:
        h = c_void_p()
        L.kvmem_retrieval_create(byref(h))
        self._init_handle(h.value, L.kvmem_retrieval_free)

    @property
    def n_sets(self) -> int:
        """1 for GLOBAL scope, n_layers for PER_LAYER, 0 before the first retrieve."""
        return int(L.kvmem_retrieval_n_sets(self.handle))

    def get(self, set: int = 0) -> Tuple[Any, Any]:
        """(blocks int32, scores f32) of a set, chronological; copies owned by the caller."""
        n = ctypes.c_int32()
        L.kvmem_retrieval_copy(self.handle, set, None, None, 0, byref(n))
        blocks = (ctypes.c_int32 * max(n.value, 1))()
        scores = (ctypes.c_float * max(n.value, 1))()
        L.kvmem_retrieval_copy(self.handle, set, blocks, scores, n.value, byref(n))
        if B._np is not None:
            return (B._np.array(blocks[:n.value], dtype=B._np.int32),
                    B._np.array(scores[:n.value], dtype=B._np.float32))
        return list(blocks[:n.value]), list(scores[:n.value])

    def block_scores(self, set: int = 0) -> List[float]:
        """S(b) of every sealed block at retrieval time (NaN: not a candidate)."""
        p, n = c_void_p(), ctypes.c_int32()
        L.kvmem_retrieval_block_scores(self.handle, set, byref(p), byref(n))
        if not n.value:
            return []
        return list(ctypes.cast(p, ctypes.POINTER(ctypes.c_float))[:n.value])

    def n_tokens(self, set: int = 0) -> int:
        """Tokens in the set's blocks (what gather yields)."""
        n = ctypes.c_int64()
        L.kvmem_retrieval_n_tokens(self.handle, set, byref(n))
        return n.value

    def blocks_view(self, set: int = 0) -> Tuple[List[int], List[float]]:
        """kvmem_retrieval_get: the set read through the pointers the result owns."""
        b, s, n = c_void_p(), c_void_p(), ctypes.c_int32()
        L.kvmem_retrieval_get(self.handle, set, byref(b), byref(s), byref(n))
        if not n.value:
            return [], []
        return (list(ctypes.cast(b, ctypes.POINTER(ctypes.c_int32))[:n.value]),
                list(ctypes.cast(s, ctypes.POINTER(ctypes.c_float))[:n.value]))



# ---------------------------------------------------------------------------
# KEEP segments
# ---------------------------------------------------------------------------

GROUP_DYNAMIC, GROUP_STATIC = 0, 1
SEG_EVENT_SEGMENT_STALE, SEG_EVENT_GROUP_STATIC, SEG_EVENT_GROUP_DYNAMIC = 1, 2, 3
SEG_UNIT_SEGMENT, SEG_UNIT_GROUP = 0, 1


# 0/1 fields of the structs returned as dicts: bools, as in the info dataclasses
_FLAGS = {"needs_compute", "converged", "stopped_early"}


def _struct_dict(x: OutTensor) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for name, _t in x._fields_:
        if name == "reserved":
            continue
        val = getattr(x, name)
        out[name] = _s(val) if isinstance(val, bytes) else bool(val) if name in _FLAGS else val
    return out


def _params(struct: Any, what: str, params: Dict[str, Any]) -> Any:
    for k, val in params.items():
        if k not in dict(type(struct)._fields_) or k in _NOT_PARAMS:
            raise InvalidTypeError(f"{what} got an unknown parameter {k!r}")
        setattr(struct, k, val)
    return struct


class Segments(_Handle):
    """kvmem_segments: a KEEP segment store whose KV lives in a Pool.
    static_after_steps (steps without a change before a group turns STATIC),
    max_segments; None keeps the default. Closing it (or its pool) frees it and
    removes its agents from the pool."""
    _kind = "Segments"

    def __init__(self, pool: Pool, owner: str, *, static_after_steps: Optional[int] = None,
                 max_segments: Optional[int] = None) -> None:
        params = _given(locals())
        del params["pool"], params["owner"]
        sp = _params(L.kvmem_segments_default_params(), "Segments()", params)
        h = c_void_p()
        L.kvmem_segments_create(pool.handle, c_id(owner, "owner"), byref(sp), byref(h))
        self._init_handle(h.value, L.kvmem_segments_free)
        self.pool = pool
        pool._segments.add(self)

    def add(self, name: str, group: int) -> int:
        """kvmem_segments_add: a new segment in group; its index."""
        i = ctypes.c_int32()
        L.kvmem_segments_add(self.handle, c_id(name, "segment name"), group, byref(i))
        return i.value

    def update(self, index: int) -> None:
        """kvmem_segments_update: the segment changed (its KV is stale until stored again)."""
        L.kvmem_segments_update(self.handle, index)

    def remove(self, index: int) -> None:
        """kvmem_segments_remove: drop the segment and its KV."""
        L.kvmem_segments_remove(self.handle, index)

    def assign(self, index: int, group: int) -> None:
        """kvmem_segments_assign: move the segment to another group."""
        L.kvmem_segments_assign(self.handle, index, group)

    def step(self) -> None:
        """kvmem_segments_step: one step of time (groups unchanged long enough turn STATIC)."""
        L.kvmem_segments_step(self.handle)

    def drain_events(self, max_events: Optional[int] = None) -> List[Dict[str, Any]]:
        """Queued events, oldest first, as dicts (kind, group, segment, step); all of them by default."""
        if max_events is not None:
            max_events = _ints.check(max_events, "max_events", ctypes.c_int64)
            if max_events < 0:
                raise InvalidArgumentError(f"max_events = {max_events} is negative")
        out: List[Dict[str, Any]] = []
        while max_events is None or len(out) < max_events:
            cap = 64 if max_events is None else min(64, max_events - len(out))
            arr = (L.kvmem_segment_event * cap)()
            n, left = c_size_t(), c_size_t()
            L.kvmem_segments_drain_events(self.handle, arr, cap, byref(n), byref(left))
            out += [_struct_dict(e) for e in arr[:n.value]]
            if left.value == 0 or n.value == 0:
                break
        return out

    def store_segment(self, index: int, k: TensorLike, v: TensorLike, *, token_ids: Optional[IntsLike] = None, text: Optional[TextLike] = None,
                      token_text_offsets: Optional[IntsLike] = None, positions: Optional[IntsLike] = None,
                      keys_rotated: Optional[bool] = None, dtype: DTypeLike = None) -> None:
        """Hand over the KV of one segment, [n_layers][T][n_kv_heads][head_dim] (as Agent.append)."""
        _call_kv(self.pool.spec, L.kvmem_segments_store_segment, (self.handle, index), k, v, token_ids,
                 text, token_text_offsets, positions, keys_rotated, dtype)

    def store_group(self, group: int, k: TensorLike, v: TensorLike, *, token_ids: Optional[IntsLike] = None, text: Optional[TextLike] = None,
                    token_text_offsets: Optional[IntsLike] = None, positions: Optional[IntsLike] = None,
                    keys_rotated: Optional[bool] = None, dtype: DTypeLike = None) -> None:
        """Hand over the joint KV of a STATIC group (members in group_members order)."""
        _call_kv(self.pool.spec, L.kvmem_segments_store_group, (self.handle, group), k, v, token_ids,
                 text, token_text_offsets, positions, keys_rotated, dtype)

    def get_info(self) -> SegmentsInfo:
        """kvmem_segments_get_info: step, segments, groups, static groups, events."""
        x = L.kvmem_segments_info()
        L.kvmem_segments_get_info(self.handle, byref(x))
        return from_struct(SegmentsInfo, x)

    def segment_info(self, index: int) -> SegmentInfo:
        """kvmem_segments_segment_info: a segment's group, state and KV."""
        x = L.kvmem_segment_info()
        L.kvmem_segments_segment_info(self.handle, index, byref(x))
        return from_struct(SegmentInfo, x)

    def group_info(self, group: int) -> GroupInfo:
        """kvmem_segments_group_info: a group's state (STATIC / DYNAMIC), members and KV."""
        x = L.kvmem_group_info()
        L.kvmem_segments_group_info(self.handle, group, byref(x))
        return from_struct(GroupInfo, x)

    def find(self, name: str) -> int:
        """kvmem_segments_find: the index of the segment of that name."""
        i = ctypes.c_int32()
        L.kvmem_segments_find(self.handle, c_id(name, "segment name"), byref(i))
        return i.value

    def name(self, index: int) -> str:
        """kvmem_segments_name: the name of the segment at index."""
        n = c_size_t()
        L.kvmem_segments_name(self.handle, index, None, 0, byref(n))
        buf = ctypes.create_string_buffer(n.value + 1)
        L.kvmem_segments_name(self.handle, index, buf, n.value + 1, byref(n))
        return _s(buf.value)

    def group_members(self, group: int) -> List[int]:
        """kvmem_segments_group_members: the segment indices in a group, in order."""
        n = c_size_t()
        L.kvmem_segments_group_members(self.handle, group, None, 0, byref(n))
        arr = (ctypes.c_int32 * max(n.value, 1))()
        L.kvmem_segments_group_members(self.handle, group, arr, n.value, byref(n))
        return list(arr[:n.value])

    def plan(self, scores: Optional[FloatsLike] = None, max_units: int = 0) -> List[Dict[str, Any]]:
        """Units to load for a query, best first: dicts of kind, group, segment,
        needs_compute, score, first_token, n_tokens, agent_id."""
        sp, keep = _in_array(scores, ctypes.c_float, None, "scores")
        ns = 0 if scores is None else _count(keep)
        n = c_size_t()
        L.kvmem_segments_plan(self.handle, sp, ns, max_units, None, 0, byref(n))
        arr = (L.kvmem_segment_unit * max(n.value, 1))()
        L.kvmem_segments_plan(self.handle, sp, ns, max_units, arr, n.value, byref(n))
        B.release(keep)
        return [_struct_dict(u) for u in arr[:n.value]]


_FMT = {ctypes.c_float: ("f",), ctypes.c_double: ("d",), ctypes.c_uint8: ("B", "?"),
        ctypes.c_uint64: ("Q", "L" if ctypes.sizeof(ctypes.c_ulong) == 8 else "Q")}


class _Copied:
    """A ctypes copy of a Python sequence, and how many values it holds."""

    def __init__(self, arr: Any, n: int):
        self.arr, self.n = arr, n

    def count(self) -> int:
        return self.n


def _count(keep: Any) -> int:
    """Values behind what _in_array returned (a View or a _Copied)."""
    return keep.count()


def _in_array(obj: Any, ctype: Any, n: Optional[int], what: str) -> Tuple[Any, Any]:
    """A pointer to n contiguous values of ctype: a buffer of that type is used in
    place; a (nested) Python sequence is copied."""
    if obj is None:
        return None, None
    if isinstance(obj, (list, tuple)):
        flat: List[Any] = []
        stack = [obj]
        while stack:  # flatten nested sequences in order
            x = stack.pop()
            if isinstance(x, (list, tuple)):
                stack.extend(reversed(x))
            else:
                flat.append(x)
        if n is not None and len(flat) != n:
            raise InvalidArgumentError(f"{what} has {len(flat)} values, expected {n}")
        arr = _ints.array(ctype, flat, what) if flat else (ctype * 1)()
        return ctypes.cast(arr, c_void_p), _Copied(arr, len(flat))
    v = B.View(obj, False, what)
    try:
        if v.format not in _FMT[ctype] or v.itemsize != ctypes.sizeof(ctype):
            raise InvalidTypeError(f"{what} must hold {ctype.__name__[2:]} values, got format {v.format!r}")
        if not v.contiguous():
            raise InvalidTypeError(f"{what} must be contiguous")
        if n is not None and v.count() != n:
            raise InvalidArgumentError(f"{what} has {v.count()} values, expected {n}")
        return c_void_p(v.address), v
    except BaseException:
        v.close()
        raise


def _out_array(ctype: Any, n: int) -> Any:
    return (ctype * max(n, 1))()


def _to_result(arr: Any, n: int, np_dtype: str) -> Any:
    if B._np is not None:
        return B._np.ctypeslib.as_array(arr)[:n].astype(np_dtype, copy=True)
    return list(arr[:n])


def cluster_kmeans(emb: FloatsLike, n: int, dim: int, *, k: Optional[int] = None, max_iters: Optional[int] = None,
                   seed: Optional[int] = None) -> Tuple[Array, Array, int]:
    """kvmem_cluster_kmeans over emb [n][dim] f32, cosine k-means into k groups:
    (labels, centroids [k][dim], iterations run). max_iters, seed; None keeps the default."""
    params = {key: val for key, val in _given(locals()).items() if key not in ("emb", "n", "dim")}
    n, dim = _ints.check(n, "n", c_size_t), _ints.check(dim, "dim", c_size_t)
    kp = _params(L.kvmem_kmeans_default_params(), "cluster_kmeans()", params)
    ep, keep = _in_array(emb, ctypes.c_float, n * dim, "emb")
    try:
        labels = _out_array(ctypes.c_int32, n)
        cents = _out_array(ctypes.c_float, max(kp.k, 0) * dim)
        it = ctypes.c_int32()
        L.kvmem_cluster_kmeans(ep, n, dim, byref(kp), labels, cents, byref(it))
    finally:
        B.release(keep)
    return _to_result(labels, n, "int32"), _to_result(cents, kp.k * dim, "float32"), it.value


def multihop_select(q2s: FloatsLike, n_query: int, s2s: FloatsLike, n_segments: int,
                    candidates: Optional[IntsLike] = None, *, ratio: Optional[float] = None,
                    max_iters: Optional[int] = None) -> Tuple[Array, Array, Dict[str, Any]]:
    """kvmem_multihop_select: (selected 0/1 per segment, importance, result dict).
    q2s [n_query][n_segments], s2s [n_segments][n_segments] f32; candidates 0/1 bytes or None.
    ratio (the fraction kept), max_iters; None keeps the default."""
    params = {key: val for key, val in _given(locals()).items()
              if key not in ("q2s", "n_query", "s2s", "n_segments", "candidates")}
    n_query = _ints.check(n_query, "n_query", ctypes.c_int32)
    n_segments = _ints.check(n_segments, "n_segments", ctypes.c_int32)
    mp = _params(L.kvmem_multihop_default_params(), "multihop_select()", params)
    held: List[Any] = []
    try:
        qp, h = _in_array(q2s, ctypes.c_float, n_query * n_segments, "q2s")
        held.append(h)
        sp, h = _in_array(s2s, ctypes.c_float, n_segments * n_segments, "s2s")
        held.append(h)
        cp, h = _in_array(candidates, ctypes.c_uint8, n_segments, "candidates")
        held.append(h)
        sel = _out_array(ctypes.c_uint8, n_segments)
        imp = _out_array(ctypes.c_float, n_segments)
        res = L.kvmem_multihop_result()
        L.kvmem_multihop_select(byref(mp), qp, n_query, sp, n_segments, cp, sel, imp, byref(res))
    finally:
        B.release(*held)
    return _to_result(sel, n_segments, "uint8"), _to_result(imp, n_segments, "float32"), _struct_dict(res)


def multihop_schedule(n_layers: int, avg: float) -> Any:
    """kvmem_multihop_schedule: per-layer recompute ratios (n_layers floats)."""
    n_layers = _ints.check(n_layers, "n_layers", ctypes.c_int32)
    out = _out_array(ctypes.c_float, n_layers)
    L.kvmem_multihop_schedule(n_layers, avg, out)
    return _to_result(out, n_layers, "float32")


def load_plan(compute_ms: FloatsLike, n_layers: int, load_bytes: IntsLike, n_segments: int, recompute: IntsLike,
              *, bandwidth_gbps: Optional[float] = None,
              max_ahead: Optional[int] = None) -> Tuple[List[Dict[str, Any]], Array, Dict[str, Any]]:
    """kvmem_load_plan: (items of the balanced plan, layer_start_ms, stats).
    compute_ms n_layers f64, load_bytes n_segments u64, recompute [n_layers][n_segments] 0/1 bytes.
    bandwidth_gbps (the load stream's speed), max_ahead (layers a load may run
    ahead); None keeps the default."""
    params = {key: val for key, val in _given(locals()).items()
              if key not in ("compute_ms", "n_layers", "load_bytes", "n_segments", "recompute")}
    n_layers = _ints.check(n_layers, "n_layers", ctypes.c_int32)
    n_segments = _ints.check(n_segments, "n_segments", ctypes.c_int32)
    lp = _params(L.kvmem_load_plan_default_params(), "load_plan()", params)
    held: List[Any] = []
    try:
        cp, h = _in_array(compute_ms, ctypes.c_double, n_layers, "compute_ms")
        held.append(h)
        bp, h = _in_array(load_bytes, ctypes.c_uint64, n_segments, "load_bytes")
        held.append(h)
        rp, h = _in_array(recompute, ctypes.c_uint8, n_layers * n_segments, "recompute")
        held.append(h)
        n = c_size_t()
        L.kvmem_load_plan(byref(lp), cp, n_layers, bp, n_segments, rp, None, 0, byref(n), None, None)
        items = (L.kvmem_load_item * max(n.value, 1))()
        starts = _out_array(ctypes.c_double, n_layers)
        stats = L.kvmem_load_plan_stats()
        L.kvmem_load_plan(byref(lp), cp, n_layers, bp, n_segments, rp, items, max(n.value, 1), byref(n),
                          starts, byref(stats))
    finally:
        B.release(*held)
    return [_struct_dict(i) for i in items[:n.value]], _to_result(starts, n_layers, "float64"), _struct_dict(stats)


PREFIX_EXACT, PREFIX_EXTEND, PREFIX_DIVERGE = 0, 1, 2


def batch_merge(agents: Sequence[Agent], layer: int, max_len: Optional[int] = None, *, k_out: Optional[OutTensor] = None,
                v_out: Optional[OutTensor] = None, dtype: DTypeLike = "f32") -> Tuple[Any, Any, List[int]]:
    """kvmem_batch_merge: one layer of several agents, left-padded, as
    (k, v [B][n_kv_heads][max_len][head_dim], lengths)."""
    if not agents:
        raise InvalidArgumentError("batch_merge needs at least one agent")
    s = agents[0].pool.spec
    if max_len is None:
        max_len = max(a.get_info().n_tokens for a in agents)
    max_len = _ints.check(max_len, "max_len", ctypes.c_int64)
    shape = (len(agents), s.n_kv_heads, max_len, s.head_dim)
    if k_out is None:
        k_out = B.new_array(shape, dtype)
    if v_out is None:
        v_out = B.new_array(shape, dtype)
    handles = (c_void_p * len(agents))(*[a.handle for a in agents])
    lengths = (ctypes.c_int64 * len(agents))()
    held: List[Any] = []
    try:
        kt, h = B.tensor(k_out, "k_out", shape, dtype, writable=True)
        held.append(h)
        vt, h = B.tensor(v_out, "v_out", shape, dtype, writable=True)
        held.append(h)
        L.kvmem_batch_merge(handles, len(agents), layer, byref(kt), byref(vt), lengths)
    finally:
        B.release(*held)
    return k_out, v_out, list(lengths)


def batch_extract(batch: TensorLike, row: int, length: int, first: int, n: int, *, out: Optional[OutTensor] = None,
                  dtype: DTypeLike = None) -> Any:
    """kvmem_batch_extract: n tokens of row `row` of a left-padded batch
    [B][n_kv_heads][max_len][head_dim], as [n][n_kv_heads][head_dim]."""
    bt, bv = B.tensor(batch, "batch", None, dtype)
    try:
        if bt.ndim != 4:
            raise InvalidArgumentError("batch must be [B][n_kv_heads][max_len][head_dim]")
        shape = (_ints.check(n, "n", ctypes.c_int64), bt.shape[1], bt.shape[3])
        if out is None:
            out = B.new_array(shape, "f32")
        ot, ov = B.tensor(out, "out", shape, None, writable=True)
        try:
            L.kvmem_batch_extract(byref(bt), row, length, first, n, byref(ot))
        finally:
            ov.close()
        return out
    finally:
        bv.close()


class DeviceTensor:
    """A view of device memory that kvmem calls take where they take tensors
    (experimental; kvmem.h, "Device tensors"): a CUDA device pointer or a
    VkBuffer handle, with the memory's size in bytes, the byte offset of
    element 0, the dtype, shape and strides in elements (default row-major).
    The memory is the caller's: it must stay allocated while a call uses it.
    Only a context of the matching backend accepts it ("cuda" / "vulkan")."""

    _KINDS = {"cuda": 1, "vulkan": 2}

    def __init__(self, kind: str, handle: int, size: int, dtype: DTypeLike, shape: Sequence[int],
                 strides: Optional[Sequence[int]] = None, offset: int = 0, device: int = 0,
                 stream: Optional[int] = None) -> None:
        if kind not in self._KINDS:
            raise InvalidArgumentError(f"kvmem: DeviceTensor kind {kind!r} is not 'cuda' or 'vulkan'")
        # each integer as the C field or array it goes to holds it: never wrapped
        handle = _ints.check(handle, "handle", ctypes.c_uint64)
        size = _ints.check(size, "size", ctypes.c_uint64)
        offset = _ints.check(offset, "offset", ctypes.c_uint64)
        device = _ints.check(device, "device", ctypes.c_int32)
        if stream is not None:
            stream = _ints.check(stream, "stream", ctypes.c_uint64)
        shape = list(_ints.array(ctypes.c_int64, shape, "shape"))
        if strides is not None:
            strides = list(_ints.array(ctypes.c_int64, strides, "strides"))
        mem = L.kvmem_device_memory()
        mem.struct_size = ctypes.sizeof(mem)
        mem.kind, mem.device, mem.handle = self._KINDS[kind], int(device), int(handle)
        mem.offset, mem.size, mem.stream = int(offset), int(size), stream
        t = L.kvmem_tensor()
        if strides is not None and len(strides) != len(shape):
            raise InvalidArgumentError(f"kvmem: DeviceTensor has {len(shape)} dims and {len(strides)} strides")
        dims = [int(x) for x in shape]
        if strides is not None and shape:
            # a strided view (a slice, a broadcast) may span less than its row-major
            # size: the descriptor is checked over the elements it spans, then the
            # view takes its own shape and strides (each call checks them again)
            flat = (ctypes.c_int64 * 1)(max(_dlpack.span_bytes(dims, strides, 1), 0))
            L.kvmem_tensor_init_device(byref(t), byref(mem), B.dtype_code(dtype), 1, flat)
            t.ndim = len(dims)
            for i, (e, st) in enumerate(zip(dims, strides)):
                t.shape[i], t.strides[i] = e, int(st)
        else:
            shp = (ctypes.c_int64 * max(len(dims), 1))(*dims)
            L.kvmem_tensor_init_device(byref(t), byref(mem), B.dtype_code(dtype), len(dims), shp)
        self._mem, self._t = mem, t  # the tensor's data points at _mem: both live as long as self
        self.kind, self.shape = kind, tuple(int(x) for x in shape)

    def _kvmem_device_tensor(self) -> Any:
        return self._t

    @classmethod
    def from_dlpack(cls, obj: object, stream: Optional[int] = None) -> "DeviceTensor":
        """A view of a CUDA tensor exported by DLPack (CuPy, PyTorch, JAX: an
        object with ``__dlpack__`` or a capsule), no copy; the producer stays
        alive as long as the view. stream: the CUDA stream kvmem's calls are
        ordered on, passed to ``__dlpack__(stream=)`` as the array API says
        (None: the legacy default stream). Host and other devices' exports
        are refused naming the device."""
        return _dlpack.device_tensor(obj, "kvmem: DeviceTensor.from_dlpack", stream)
