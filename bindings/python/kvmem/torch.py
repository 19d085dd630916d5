"""kvmem.torch: PyTorch engines' caches in and out of kvmem.

Needs torch (Debian: ``apt-get install python3-torch``); ``import kvmem``
alone does not import it.

    import kvmem, kvmem.torch as kt
    kt.append(agent, past_key_values, positions=first_pos, token_ids=ids)  # post-RoPE keys
    with kt.QueryCapture(model) as cap:          # q_proj outputs: pre-RoPE queries
        model(prompt_ids, past_key_values=recent, position_ids=pos)
    hits = kt.retrieve(agent, cap, top_k=4)
    past = kt.gather(agent, hits.get()[0], base_position=0)   # ((k, v) per layer)

Layouts. An engine's cache holds, per layer, K and V as
``[batch, n_kv_heads, seq, head_dim]`` (head-major, as HF transformers keeps
it): a tuple of ``(k, v)`` pairs, or any object with ``key_cache`` and
``value_cache`` lists (HF DynamicCache), or with ``layers`` whose items have
``keys`` and ``values``. kvmem's order is ``[n_layers][T][n_kv_heads][head_dim]``
and a kvmem_tensor carries strides in elements, so one batch row of the cache
is handed to C as a strided view of the tensors' own memory: no copy. The
layer stride is the distance between the layers' data; when the layers are
not evenly spaced in memory (separately allocated tensors, HF's DynamicCache)
no single view covers them and the rows being appended are first stacked
into one staging tensor (one copy of exactly those rows, still head-major).
``kv_views`` says which happened.

Outputs (``gather``, ``read``) are new tensors ``[1, n_kv_heads, M, head_dim]``
per layer, written in place by C through the same kind of view (all layers
in one allocation): the tuple is usable as ``past_key_values`` directly
(``DynamicCache.from_legacy_cache(past)`` for transformers versions that want
a Cache object). dtypes: float32, float16, bfloat16.

Besides torch tensors, every tensor argument takes any object exporting
DLPack (``__dlpack__``: numpy >= 1.22 arrays, CuPy, JAX, ...) or a DLPack
capsule (``torch.utils.dlpack.to_dlpack``): it is imported with
``torch.utils.dlpack.from_dlpack``, sharing the producer's memory (no copy,
its strides kept) and keeping the producer alive while kvmem uses it. A
capsule is consumed once (the same capsule may appear several times in one
call; a used one is refused). The capsule is read first, so a dtype kvmem
does not take, negative strides or another device are refused before
anything consumes it.

CUDA tensors are passed as device tensors (kvmem.h, "Device tensors"): the
same strided view of the tensors' own memory, described as CUDA memory on
the tensor's device and ordered on torch's current stream there, no copy; a
context with backend "cuda" takes them, any other context refuses them with
the C library's message. A CUDA DLPack export from another library is
imported with torch (which needs a CUDA build of torch), its producer asked
to order its work before that stream (``__dlpack__(stream=...)``). Other
devices are refused with a message saying to move them to the CPU.
"""
from __future__ import annotations

import ctypes
import operator
from ctypes import byref, c_void_p
from typing import Any, Iterable, List, Optional, Sequence, Tuple

try:
    import torch as _torch
except ImportError as e:  # pragma: no cover - the suite skips without torch
    raise ImportError("kvmem.torch needs PyTorch (Debian: apt-get install python3-torch; "
                      "or pip install torch); `import kvmem` works without it") from e

from . import _dlpack
from . import _ints
from . import _lib as L
from ._errors import InvalidArgumentError, InvalidTypeError, UnsupportedError
from ._objects import F16, F32, BF16, Agent, Retrieval

__all__ = ["append", "kv_views", "query_view", "retrieve", "gather", "read", "QueryCapture", "TensorView"]

_DTYPES = {_torch.float32: F32, _torch.float16: F16, _torch.bfloat16: BF16}


class TensorView:
    """A kvmem_tensor over torch memory (``.c``) and the tensors that keep
    that memory alive. ``copied`` is True when the data had to be stacked
    into a staging tensor (layers not evenly spaced in memory)."""

    def __init__(self, c: L.kvmem_tensor, keep: Any, copied: bool):
        self.c, self.keep, self.copied = c, keep, copied

    @property
    def data(self) -> int:
        return int(self.c.data or 0)

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self.c.shape[i] for i in range(self.c.ndim))

    @property
    def strides(self) -> Tuple[int, ...]:
        return tuple(self.c.strides[i] for i in range(self.c.ndim))


def _refuse_device(what: str, device: Any) -> None:
    raise UnsupportedError(
        f"kvmem.torch: {what} is on {device}; kvmem takes host memory and CUDA memory: move it to the "
        f"CPU first, e.g. tuple((k.cpu(), v.cpu()) for k, v in past_key_values)")


def _check_dlpack_device(what: str, dev_type: int, dev_id: int) -> None:
    # torch imports a CUDA export only when it was built with CUDA
    device = _dlpack.device_name(dev_type, dev_id)
    if dev_type == _dlpack.CPU or (dev_type == _dlpack.CUDA and _torch.cuda.is_available()):
        return
    if dev_type == _dlpack.CUDA:
        raise UnsupportedError(
            f"kvmem.torch: {what} is on {device} but this torch has no CUDA (torch.cuda.is_available() is "
            f"False), so it cannot import it; pass it to kvmem's own calls instead "
            f"(kvmem.DeviceTensor.from_dlpack, Agent.append)")
    _refuse_device(what, device)


def _stream(dev_type: int, dev_id: int) -> Optional[int]:
    """torch's current stream on a CUDA device as the array API's stream int
    (the legacy default stream, handle 0, is 1 there; 0 is disallowed)."""
    return _torch.cuda.current_stream(dev_id).cuda_stream or 1


def _as_tensor(x: Any, what: str, memo: Optional[dict] = None) -> Any:
    """x itself when it is a torch.Tensor (or nothing DLPack: _check refuses it);
    a DLPack export as a torch.Tensor over the producer's memory. memo maps the
    capsules already imported in this call (a capsule is consumed once)."""
    if isinstance(x, _torch.Tensor) or not _dlpack.is_dlpack(x):
        return x
    if memo is not None and id(x) in memo:
        return memo[id(x)][1]
    cap = _dlpack.export(x, f"kvmem.torch: {what}", lambda t, i: _check_dlpack_device(what, t, i), _stream)
    info = _dlpack.peek(cap, f"kvmem.torch: {what}")
    if not info.on_host:
        _check_dlpack_device(what, *info.device)
    if info.dtype is None:
        raise InvalidTypeError(f"kvmem.torch: {what} is {info.dtype_name} (DLPack); kvmem takes float32, "
                        f"float16 or bfloat16")
    t = _torch.utils.dlpack.from_dlpack(cap)
    if memo is not None and cap is x:
        memo[id(x)] = (x, t)  # the capsule is kept so its id stays unique for the call
    return t


def _check(t: Any, what: str) -> None:
    if not isinstance(t, _torch.Tensor):
        raise InvalidTypeError(f"kvmem.torch: {what} must be a torch.Tensor or an object exporting "
                               f"DLPack (__dlpack__), got {type(t).__name__}")
    if t.device.type not in ("cpu", "cuda"):
        _refuse_device(what, t.device)
    if t.layout != _torch.strided:
        raise InvalidTypeError(f"kvmem.torch: {what} has layout {t.layout}; kvmem takes dense (strided) tensors")
    if t.dtype not in _DTYPES:
        raise InvalidTypeError(f"kvmem.torch: {what} is {t.dtype}; kvmem takes float32, float16 or bfloat16")


def _ctensor(ptr: int, dtype: Any, shape: Sequence[int], strides: Sequence[int],
             device: Any = None) -> L.kvmem_tensor:
    """A kvmem_tensor over host memory, or over CUDA memory on a cuda device:
    then a device tensor whose descriptor (kept alive by the struct) names the
    span the view reaches, ordered on torch's current stream."""
    if device is not None and device.type == "cuda":
        span = _dlpack.span_bytes(shape, strides, _torch.empty((), dtype=dtype).element_size())
        idx = device.index if device.index is not None else _torch.cuda.current_device()
        stream = _torch.cuda.current_stream(idx).cuda_stream or None
        dt = _dlpack.cuda_tensor(ptr, 0, span, idx, _DTYPES[dtype], shape, strides, stream)
        c = dt._kvmem_device_tensor()
        c._kvmem_keep = dt  # the descriptor c.data points at lives as long as c
        return c
    c = L.kvmem_tensor()
    c.data = ptr or None
    c.dtype = _DTYPES[dtype]
    c.ndim = len(shape)
    for i, (e, s) in enumerate(zip(shape, strides)):
        c.shape[i], c.strides[i] = int(e), int(s)
    return c


def _layer_stride(ts: Sequence[Any], offset: int = 0) -> Optional[int]:
    """The constant distance in elements between the layers' data (offset
    elements into each), or None when the layers are not one strided tensor:
    different strides, or data not evenly spaced upward in memory."""
    isz = ts[0].element_size()
    ptrs = [t.data_ptr() + offset * isz for t in ts]
    if any(t.stride() != ts[0].stride() for t in ts):
        return None
    if len(ts) == 1:
        return 0
    step = ptrs[1] - ptrs[0]
    if step < 0 or step % isz or any(p != ptrs[0] + i * step for i, p in enumerate(ptrs)):
        return None
    return step // isz


def _layers(cache: Any, what: str) -> Tuple[List[Any], List[Any]]:
    """(keys, values): one tensor per layer, from any supported cache shape."""
    if hasattr(cache, "key_cache") and hasattr(cache, "value_cache"):
        ks, vs = list(cache.key_cache), list(cache.value_cache)
    elif hasattr(cache, "layers") and not isinstance(cache, (list, tuple)):
        ks = [getattr(x, "keys", None) for x in cache.layers]
        vs = [getattr(x, "values", None) for x in cache.layers]
    elif isinstance(cache, (list, tuple)):
        ks, vs = [], []
        for i, pair in enumerate(cache):
            if not isinstance(pair, (list, tuple)) or len(pair) < 2:
                raise InvalidTypeError(f"kvmem.torch: {what}[{i}] must be a (k, v) pair, got {type(pair).__name__}")
            ks.append(pair[0])
            vs.append(pair[1])
    else:
        raise InvalidTypeError(f"kvmem.torch: {what} must be a tuple of (k, v) per layer or an object with "
                        f"key_cache/value_cache lists (HF DynamicCache), got {type(cache).__name__}")
    if not ks or len(ks) != len(vs):
        raise InvalidArgumentError(f"kvmem.torch: {what} has {len(ks)} key and {len(vs)} value layers")
    memo: dict = {}
    ks = [_as_tensor(t, f"{what} layer {i} k", memo) for i, t in enumerate(ks)]
    vs = [_as_tensor(t, f"{what} layer {i} v", memo) for i, t in enumerate(vs)]
    for name, lst in (("k", ks), ("v", vs)):
        for i, t in enumerate(lst):
            _check(t, f"{what} layer {i} {name}")
            if t.dim() != 4:
                raise InvalidArgumentError(f"kvmem.torch: {what} layer {i} {name} has shape {tuple(t.shape)}; "
                                 f"expected [batch, n_kv_heads, seq, head_dim]")
            if t.shape != lst[0].shape or t.dtype != lst[0].dtype:
                raise InvalidArgumentError(f"kvmem.torch: {what} layer {i} {name} is {tuple(t.shape)} {t.dtype}, "
                                 f"layer 0 is {tuple(lst[0].shape)} {lst[0].dtype}")
    if ks[0].shape != vs[0].shape:
        raise InvalidArgumentError(f"kvmem.torch: {what}: keys are {tuple(ks[0].shape)}, values {tuple(vs[0].shape)}")
    return ks, vs


def _head_major(ts: List[Any], b: int, start: int, stop: int, writable: bool, what: str) -> TensorView:
    """[n_layers][T][n_kv_heads][head_dim] over row b, seq [start, stop) of per-layer
    [batch, heads, seq, dim] tensors: a view when the layers are evenly spaced."""
    t0 = ts[0]
    sb, sh, ss, sd = t0.stride()
    off = b * sb + start * ss
    shape = (len(ts), stop - start, t0.shape[1], t0.shape[3])
    step = _layer_stride(ts, off)
    if step is not None:
        return TensorView(_ctensor(t0.data_ptr() + off * t0.element_size(), t0.dtype, shape,
                                   (step, ss, sh, sd), t0.device), ts, False)
    if writable:
        raise InvalidArgumentError(f"kvmem.torch: {what}: the layers are separate allocations, not evenly spaced "
                         f"in memory, so no single view can write into them; gather into new tensors "
                         f"(out=None) or give a cache whose layers are slices of one tensor")
    st = _torch.stack([t[b, :, start:stop] for t in ts])  # [L, heads, T, dim]: one copy, head-major kept
    s = st.stride()
    return TensorView(_ctensor(st.data_ptr(), st.dtype, shape, (s[0], s[2], s[1], s[3]), st.device), st, True)


def kv_views(cache: Any, *, batch_index: int = 0, start: int = 0, stop: Optional[int] = None,
             writable: bool = False) -> Tuple[TensorView, TensorView]:
    """kvmem_tensor views [n_layers][T][n_kv_heads][head_dim] of one batch row and
    the seq range [start, stop) of an engine's cache (see the module doc)."""
    ks, vs = _layers(cache, "cache")
    B, _, S, _ = ks[0].shape
    if not 0 <= batch_index < B:
        raise InvalidArgumentError(f"kvmem.torch: batch_index {batch_index} is outside the cache's batch of {B}")
    stop = S if stop is None else stop
    if not 0 <= start <= stop <= S:
        raise InvalidArgumentError(f"kvmem.torch: tokens [{start}, {stop}) are outside the cache's {S} positions")
    return (_head_major(ks, batch_index, start, stop, writable, "cache keys"),
            _head_major(vs, batch_index, start, stop, writable, "cache values"))


def _int32s(x: Any, what: str, n: int) -> Tuple[Any, Any]:
    """A pointer to n int32 values copied from a sequence or an integer tensor."""
    if x is None:
        return None, None
    if isinstance(x, _torch.Tensor):
        x = x.reshape(-1).tolist()
    vals = list(x)
    if len(vals) != n:
        raise InvalidArgumentError(f"kvmem.torch: {what} has {len(vals)} entries, expected {n}")
    arr = _ints.array(ctypes.c_int32, vals, what) if n else (ctypes.c_int32 * 1)()
    return ctypes.cast(arr, L.i32_p), arr


def append(agent: Agent, cache: Any, *, batch_index: int = 0, start: int = 0, stop: Optional[int] = None,
           positions: Any = None, keys_rotated: Optional[bool] = None, token_ids: Any = None,
           text: Any = None, token_text_offsets: Any = None) -> bool:
    """Append cache seq positions [start, stop) of row batch_index to the agent
    (kvmem_agent_append). positions: the RoPE positions the keys were rotated at,
    one int (the first; the rest follow on) or T of them; keys_rotated defaults
    to positions is not None (pre-RoPE keys: give neither). Returns True when
    the rows went to C in place, False when they were stacked first."""
    kv, vv = kv_views(cache, batch_index=batch_index, start=start, stop=stop)
    T = kv.shape[1]
    if isinstance(positions, bool):
        raise InvalidTypeError("kvmem.torch: positions must be the first position (an int) or T of them, not a bool")
    try:  # one integer (int, numpy or 0-d tensor): the first position, the rest follow on
        first = operator.index(positions) if positions is not None else None
    except TypeError:
        first = None
    if first is not None:
        positions = range(first, first + T)
    ap = L.kvmem_append_default_params()
    held: List[Any] = []
    for name, val in (("token_ids", token_ids), ("positions", positions),
                      ("token_text_offsets", token_text_offsets)):
        ptr, arr = _int32s(val, name, T)
        held.append(arr)
        if ptr is not None:
            setattr(ap, name, ptr)
    if text is not None:
        tb = text.encode() if isinstance(text, str) else bytes(text)
        held.append(tb)
        ap.text, ap.text_len = tb, len(tb)
    ap.keys_rotated = int(positions is not None if keys_rotated is None else bool(keys_rotated))
    L.kvmem_agent_append(agent.handle, byref(kv.c), byref(vv.c), byref(ap))
    return not (kv.copied or vv.copied)


def query_view(queries: Any, spec: L.kvmem_model_spec, *, batch_index: int = 0) -> TensorView:
    """Query rows [n_q][n_layers][n_q_heads][head_dim] (pre-RoPE) from: a
    QueryCapture; a tensor already in that order; or one tensor per layer,
    [batch, n_q_heads, q_len, head_dim] (HF's query_states before RoPE)."""
    if isinstance(queries, QueryCapture):
        queries = queries.queries(spec, batch_index=batch_index)
    queries = _as_tensor(queries, "queries")
    if isinstance(queries, _torch.Tensor):
        _check(queries, "queries")
        if queries.dim() != 4:
            raise InvalidArgumentError(f"kvmem.torch: queries has shape {tuple(queries.shape)}; expected "
                             f"[n_q, n_layers, n_q_heads, head_dim] (or one [batch, n_q_heads, q_len, "
                             f"head_dim] tensor per layer)")
        return TensorView(_ctensor(queries.data_ptr(), queries.dtype, queries.shape, queries.stride(),
                                   queries.device), queries, False)
    memo: dict = {}
    qs = [_as_tensor(q, f"queries layer {i}", memo) for i, q in enumerate(queries)]
    if not qs:
        raise InvalidArgumentError("kvmem.torch: queries: no layers")
    for i, q in enumerate(qs):
        _check(q, f"queries layer {i}")
        if q.dim() != 4 or q.shape != qs[0].shape or q.dtype != qs[0].dtype:
            raise InvalidArgumentError(f"kvmem.torch: queries layer {i} is {tuple(q.shape)} {q.dtype}; every layer "
                             f"must be [batch, n_q_heads, q_len, head_dim] like layer 0 "
                             f"({tuple(qs[0].shape)} {qs[0].dtype})")
    if not 0 <= batch_index < qs[0].shape[0]:
        raise InvalidArgumentError(f"kvmem.torch: batch_index {batch_index} is outside the queries' batch of "
                         f"{qs[0].shape[0]}")
    view = _head_major(qs, batch_index, 0, qs[0].shape[2], False, "queries")
    c = view.c  # [L][q_len][heads][dim] -> [q_len][L][heads][dim]
    c.shape[0], c.shape[1] = c.shape[1], c.shape[0]
    c.strides[0], c.strides[1] = c.strides[1], c.strides[0]
    return view


def retrieve(agent: Agent, queries: Any, *, batch_index: int = 0, result: Optional[Retrieval] = None,
             exclude: Optional[Iterable[int]] = None, always_include: Optional[Iterable[int]] = None,
             top_k: Optional[int] = None, mode: Optional[int] = None, norm: Optional[int] = None,
             agg: Optional[int] = None, scope: Optional[int] = None, tau: Optional[float] = None,
             rr_c: Optional[float] = None, recent_window: Optional[int] = None,
             skip_recent: Optional[int] = None) -> Retrieval:
    """kvmem_retrieve with an engine's pre-RoPE query states (see query_view);
    top_k, mode, norm, agg, scope, tau, rr_c, recent_window, skip_recent as in
    Agent.retrieve (None keeps the default)."""
    rp = L.kvmem_retrieve_default_params()
    for k, val in ((k, v) for k, v in locals().items() if k in (
            "top_k", "mode", "norm", "agg", "scope", "tau", "rr_c", "recent_window", "skip_recent")):
        if val is not None:
            setattr(rp, k, val)
    held: List[Any] = []
    for name, lst in (("exclude", exclude), ("always_include", always_include)):
        if lst is not None:
            vals = list(lst)
            arr = _ints.array(ctypes.c_int32, vals, name) if vals else (ctypes.c_int32 * 1)()
            held.append(arr)
            setattr(rp, name, ctypes.cast(arr, L.i32_p))
            setattr(rp, "n_" + name, len(vals))
    qv = query_view(queries, agent.pool.spec, batch_index=batch_index)
    r = result if result is not None else Retrieval()
    L.kvmem_retrieve(agent.handle, byref(qv.c), byref(rp), r.handle)
    return r


def _new_cache(spec: L.kvmem_model_spec, n: int, dtype: Any, device: Any = None) -> Tuple[Any, Any, Tuple[Any, ...]]:
    """K, V [n_layers, 1, n_kv_heads, n, head_dim] (one allocation each) and the
    per-layer ((k, v), ...) tuple of views into them."""
    if dtype not in _DTYPES:
        raise InvalidTypeError(f"kvmem.torch: dtype {dtype} is not float32, float16 or bfloat16")
    shape = (spec.n_layers, 1, spec.n_kv_heads, n, spec.head_dim)
    K, V = _torch.empty(shape, dtype=dtype, device=device), _torch.empty(shape, dtype=dtype, device=device)
    return K, V, tuple((K[i], V[i]) for i in range(spec.n_layers))


def _out_views(out: Any, spec: L.kvmem_model_spec, n: int, dtype: Any, batch_index: int,
               out_start: int, device: Any = None) -> Tuple[TensorView, TensorView, Any]:
    if out is None:
        _, _, out = _new_cache(spec, n, dtype, device)
        batch_index, out_start = 0, 0
    kv, vv = kv_views(out, batch_index=batch_index, start=out_start, stop=out_start + n, writable=True)
    return kv, vv, out


def gather(agent: Agent, blocks: Iterable[int], base_position: int = 0, *, dtype: Any = _torch.float32,
           out: Any = None, batch_index: int = 0, out_start: int = 0, device: Any = None) -> Any:
    """kvmem_gather: the sealed blocks' KV concatenated, keys re-encoded with RoPE
    at positions base_position.. (MemArt), as past_key_values: ((k, v), ...) per
    layer, each [1, n_kv_heads, M, head_dim] of dtype on device (default the
    CPU; "cuda" on a CUDA context: written in place there). out: an existing
    cache to write into instead (row batch_index, seq positions out_start..),
    its layers slices of one tensor; it is returned."""
    ids = [_ints.check(b, f"blocks[{i}]", ctypes.c_int32) for i, b in enumerate(blocks)]
    m = sum(agent.block_info(b).n_tokens for b in ids)
    kv, vv, out = _out_views(out, agent.pool.spec, m, dtype, batch_index, out_start, device)
    arr = (ctypes.c_int32 * max(len(ids), 1))(*ids)
    L.kvmem_gather(agent.handle, arr, len(ids), base_position, byref(kv.c), byref(vv.c))
    return out


def read(agent: Agent, first: int = 0, n: Optional[int] = None, *, dtype: Any = _torch.float32,
         rotate: bool = False, out: Any = None, batch_index: int = 0, out_start: int = 0) -> Any:
    """kvmem_agent_read: tokens [first, first + n) as past_key_values (as gather
    returns them, or written into `out` as gather does), keys raw (pre-RoPE);
    rotate=True applies RoPE at the tokens' own positions first..first+n-1
    (kvmem_rope_apply), as the engine held them: in place for float32 outputs,
    through a float32 copy for the others."""
    if n is None:
        n = agent.get_info().n_tokens - first
    spec = agent.pool.spec
    out_dtype = dtype if out is None else _layers(out, "out")[0][0].dtype
    if rotate and out_dtype != _torch.float32:
        f32 = read(agent, first, n, rotate=True)
        if out is None:
            return tuple((k.to(dtype), v.to(dtype)) for k, v in f32)
        ks, vs = _layers(out, "out")
        if not (0 <= batch_index < ks[0].shape[0] and 0 <= out_start <= out_start + n <= ks[0].shape[2]):
            raise InvalidArgumentError(f"kvmem.torch: out: row {batch_index}, tokens [{out_start}, {out_start + n}) "
                             f"are outside its shape {tuple(ks[0].shape)}")
        for i, (k, v) in enumerate(f32):
            ks[i][batch_index, :, out_start:out_start + n].copy_(k[0])
            vs[i][batch_index, :, out_start:out_start + n].copy_(v[0])
        return out
    if out is None:
        batch_index, out_start = 0, 0
    kv, vv, out = _out_views(out, spec, n, dtype, batch_index, out_start)
    L.kvmem_agent_read(agent.handle, first, n, byref(kv.c), byref(vv.c))
    if rotate and n > 0:
        pos = _torch.arange(first, first + n, dtype=_torch.int32)
        for k in _layers(out, "out")[0]:
            rows = k[batch_index, :, out_start:out_start + n]  # [heads, n, dim]
            if rows.stride(2) != 1:
                raise InvalidArgumentError("kvmem.torch: read(rotate=True): out's head_dim must be contiguous")
            for h in range(rows.shape[0]):  # one call per head: its n rows are evenly spaced
                L.kvmem_rope_apply(byref(spec), c_void_p(rows[h].data_ptr()), n, rows.stride(1),
                                   c_void_p(pos.data_ptr()), 0)
    return out


class QueryCapture:
    """Collect the pre-RoPE query states of every layer of a Llama-style torch
    model: forward hooks on its ``q_proj`` modules (in module order, one per
    layer) record their outputs [batch, seq, n_q_heads * head_dim]. Every
    forward pass adds its rows; ``queries(spec)`` gives them as
    [n_q, n_layers, n_q_heads, head_dim], what kvmem_retrieve takes;
    ``clear()`` forgets them, ``remove()`` (or leaving a ``with`` block)
    takes the hooks off. ``modules`` names the projection modules instead."""

    def __init__(self, model: Any = None, *, name: str = "q_proj", modules: Optional[Sequence[Any]] = None):
        if modules is None:
            if model is None:
                raise InvalidTypeError("kvmem.torch: QueryCapture needs a model or modules=[...]")
            modules = [m for n, m in model.named_modules() if n == name or n.endswith("." + name)]
            if not modules:
                raise InvalidArgumentError(f"kvmem.torch: QueryCapture: no module named {name!r} in "
                                 f"{type(model).__name__}; pass name= (the query projection's "
                                 f"attribute name) or modules=[one per layer]")
        self._rows: List[List[Any]] = [[] for _ in modules]
        self._hooks = [m.register_forward_hook(self._hook(i)) for i, m in enumerate(modules)]

    def _hook(self, i: int) -> Any:
        def record(_mod: Any, _inp: Any, out: Any) -> None:
            # a copy: an engine may rotate the projection's output in place
            self._rows[i].append(out.detach().clone())
        return record

    @property
    def n_layers(self) -> int:
        return len(self._rows)

    def clear(self) -> None:
        for r in self._rows:
            r.clear()

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __enter__(self) -> "QueryCapture":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def queries(self, spec: L.kvmem_model_spec, *, batch_index: int = 0) -> Any:
        """The recorded rows of batch row batch_index as [n_q, n_layers, n_q_heads, head_dim]."""
        H, D = spec.n_q_heads, spec.head_dim
        per_layer = []
        for i, rows in enumerate(self._rows):
            if not rows:
                raise InvalidArgumentError(f"kvmem.torch: QueryCapture: layer {i} has seen no forward pass")
            x = _torch.cat([r if r.dim() == 3 else r.unsqueeze(0) for r in rows], dim=1)
            if x.shape[-1] != H * D:
                raise InvalidArgumentError(f"kvmem.torch: QueryCapture: layer {i}'s projection gives {x.shape[-1]} "
                                 f"values per token, the model spec n_q_heads * head_dim = {H * D}")
            if not 0 <= batch_index < x.shape[0]:
                raise InvalidArgumentError(f"kvmem.torch: batch_index {batch_index} is outside the batch of {x.shape[0]}")
            per_layer.append(x[batch_index].reshape(x.shape[1], H, D))
        n = {p.shape[0] for p in per_layer}
        if len(n) != 1:
            raise InvalidArgumentError(f"kvmem.torch: QueryCapture: layers saw different numbers of tokens {sorted(n)}")
        return _torch.stack(per_layer, dim=1)


def __getattr__(name: str) -> Any:
    # kvmem.torch.KvmemCache: the HF-style cache lives in kvmem.hf, which imports this module
    if name == "KvmemCache":
        from .hf import KvmemCache
        return KvmemCache
    raise AttributeError(f"module 'kvmem.torch' has no attribute {name!r}")
