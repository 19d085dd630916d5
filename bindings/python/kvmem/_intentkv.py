"""High level for IntentKV: QueryMemory stores and heads, keep-set selection
(IntentKV rule, StreamingLLM, H2O, SnapKV), and the paged KV store with
per-request slot maps. Same ownership rules as _objects: close() idempotent,
context managers, finalizers; a KVStore closes its SlotMaps first."""
from __future__ import annotations

import ctypes
import weakref
from ctypes import byref, c_int32, c_int64, c_void_p
from typing import Any, List, Optional, Sequence, Tuple, Union

from . import _buffers as B
from . import _ints
from . import _lib as L
from ._errors import InvalidTypeError
from ._cstr import c_id_or_none, c_path
from ._info import KVStoreInfo, SlotMapInfo, from_struct
from ._objects import SPEC_V2, Context, ModelSpec, _given, _Handle, _in_array, _params, _to_result, spec_v2
from ._types import DTypeLike, FloatsLike, IntsLike, PathLike, SpecLike, TensorLike

SESSION_EXPLICIT, SESSION_MARKED, SESSION_PREFIX, SESSION_LOCAL = 1, 2, 3, 4
DEAD_SLOT = 0
SENTINEL_K = -1.0e4


def _mem_len(spec: SpecLike) -> int:
    return spec.n_layers * spec.n_q_heads * spec.head_dim


def _out_f32(shape: Sequence[int]) -> Any:
    return B.new_array(shape, "f32")


_KIND = {1: "SESSION_EXPLICIT", 2: "SESSION_MARKED", 3: "SESSION_PREFIX", 4: "SESSION_LOCAL"}


class SessionKey(L.kvmem_session_key):
    """kvmem_session_key: which session a turn belongs to (hand it back to update/get)."""

    def __repr__(self) -> str:
        return f"SessionKey({_KIND.get(self.kind, self.kind)}, {self.hi:016x}{self.lo:016x})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, L.kvmem_session_key):
            return NotImplemented
        return (self.hi, self.lo, self.kind) == (other.hi, other.lo, other.kind)

    def __hash__(self) -> int:
        return hash((self.hi, self.lo, self.kind))


class QmemStore(_Handle):
    """kvmem_qmem_store: per-session query memories (IntentKV). capacity
    (sessions kept, LRU), prefix_tokens (token ids hashed for a session key),
    lambda_ (the decay, the C field `lambda`); None keeps the default."""
    _kind = "QmemStore"

    def __init__(self, spec: SpecLike, *, capacity: Optional[int] = None, prefix_tokens: Optional[int] = None,
                 lambda_: Optional[float] = None) -> None:
        params = _given(locals())
        del params["spec"]
        spec = ModelSpec.of(spec)
        if "lambda_" in params:
            params["lambda"] = params.pop("lambda_")
        qp = _params(L.kvmem_qmem_default_params(), "QmemStore()", params)
        h = c_void_p()
        if SPEC_V2:
            L.kvmem_qmem_store_create_v2(byref(spec_v2(spec)), byref(qp), byref(h))
        else:
            L.kvmem_qmem_store_create(byref(spec), byref(qp), byref(h))
        self._init_handle(h.value, L.kvmem_qmem_store_free)
        self.spec = spec

    def session_key(self, session_id: Optional[str] = None, token_ids: Optional[IntsLike] = None,
                    mark: Optional[Tuple[int, int]] = None) -> "SessionKey":
        """kvmem_session_key_derive: explicit id, else marked span, else prefix, else local."""
        v2 = "kvmem_session_key_derive_v2" not in L.MISSING  # the growable source where the library has it
        src = L.kvmem_session_source_v2() if v2 else L.kvmem_session_source()
        if v2:
            src.struct_size = ctypes.sizeof(src)
        sid = c_id_or_none(session_id, "session_id")
        src.session_id = sid
        ptr, keep = B.int32s(token_ids, "token_ids")
        try:
            if ptr is not None:
                src.token_ids = ptr
                src.n_tokens = len(token_ids) if not isinstance(keep, B.View) else keep.count()
            if mark is not None:
                src.mark_begin, src.mark_end = mark
            key = SessionKey()
            (L.kvmem_session_key_derive_v2 if v2 else L.kvmem_session_key_derive)(self.handle, byref(src), byref(key))
            return key
        finally:
            B.release(keep)

    def update(self, key: L.kvmem_session_key, q: TensorLike, span_begin: int, span_end: int,
               dtype: DTypeLike = None) -> Any:
        """Fold q [n_q][n_layers][n_q_heads][head_dim] (post-RoPE) rows [span_begin,
        span_end) into the key's memory; returns the new memory [n_layers][n_q_heads][head_dim]."""
        s = self.spec
        qt, qv = B.tensor(q, "q", (-1, s.n_layers, s.n_q_heads, s.head_dim), dtype)
        try:
            out = _out_f32((s.n_layers, s.n_q_heads, s.head_dim))
            with B.View(out, True, "memory") as ov:
                L.kvmem_qmem_update(self.handle, byref(key), byref(qt), span_begin, span_end, ov.address)
            return out
        finally:
            qv.close()

    def get(self, key: L.kvmem_session_key) -> Any:
        """kvmem_qmem_get: the session's memory [n_layers][n_q_heads][head_dim] (zeros if none yet)."""
        s = self.spec
        out = _out_f32((s.n_layers, s.n_q_heads, s.head_dim))
        with B.View(out, True, "memory") as ov:
            L.kvmem_qmem_get(self.handle, byref(key), ov.address)
        return out

    @property
    def count(self) -> int:
        """kvmem_qmem_count: the number of sessions with a memory."""
        return int(L.kvmem_qmem_count(self.handle))


def _f32_in(obj: Any, n: int, what: str) -> Tuple[Any, Any]:
    return _in_array(obj, ctypes.c_float, n, what)


def qmem_score(ctx: Context, spec: SpecLike, memory: FloatsLike, k: TensorLike, dtype: DTypeLike = None) -> Any:
    """kvmem_qmem_score: the rule score of each of the N positions of k
    [n_layers][N][n_kv_heads][head_dim] (post-RoPE) under memory."""
    spec = ModelSpec.of(spec)
    kt, kv = B.tensor(k, "k", (spec.n_layers, -1, spec.n_kv_heads, spec.head_dim), dtype)
    held: List[Any] = [kv]
    try:
        mp, h = _f32_in(memory, _mem_len(spec), "memory")
        held.append(h)
        n = kt.shape[1]
        out = _out_f32((n,))
        with B.View(out, True, "scores") as ov:
            if SPEC_V2:
                L.kvmem_qmem_score_v2(ctx.handle, byref(spec_v2(spec)), mp, byref(kt), ov.address)
            else:
                L.kvmem_qmem_score(ctx.handle, byref(spec), mp, byref(kt), ov.address)
        return out
    finally:
        B.release(*held)


class QmemHead(_Handle):
    """kvmem_qmem_head: the trained residual head (safetensors)."""
    _kind = "QmemHead"

    def __init__(self, path: Optional[PathLike] = None, *, data: Optional[Union[bytes, bytearray, memoryview]] = None) -> None:
        h = c_void_p()
        if (path is None) == (data is None):
            raise InvalidTypeError("QmemHead(path) or QmemHead(data=bytes)")
        if path is not None:
            L.kvmem_qmem_head_load(c_path(path), byref(h))
        else:
            with B.View(data, False, "data") as v:
                L.kvmem_qmem_head_load_buffer(v.address, v.count() * v.itemsize, byref(h))
        self._init_handle(h.value, L.kvmem_qmem_head_free)

    @property
    def head_dim(self) -> int:
        """The head_dim the residual head was trained for."""
        return int(L.kvmem_qmem_head_dim(self.handle))

    @property
    def alpha(self) -> float:
        """The residual head's weight alpha (clipped to [-5, 5])."""
        return float(L.kvmem_qmem_head_alpha(self.handle))

    def apply(self, spec: SpecLike, memory: FloatsLike, k: TensorLike, rule: FloatsLike, span_begin: int,
              span_end: int, dtype: DTypeLike = None) -> Any:
        """scores = rule + alpha * MLP(...) for the N positions of k."""
        spec = ModelSpec.of(spec)
        kt, kv = B.tensor(k, "k", (spec.n_layers, -1, spec.n_kv_heads, spec.head_dim), dtype)
        held: List[Any] = [kv]
        try:
            n = kt.shape[1]
            mp, h = _f32_in(memory, _mem_len(spec), "memory")
            held.append(h)
            rp, h = _f32_in(rule, n, "rule")
            held.append(h)
            out = _out_f32((n,))
            with B.View(out, True, "scores") as ov:
                if SPEC_V2:
                    L.kvmem_qmem_head_apply_v2(self.handle, byref(spec_v2(spec)), mp, byref(kt), rp, span_begin,
                                               span_end, ov.address)
                else:
                    L.kvmem_qmem_head_apply(self.handle, byref(spec), mp, byref(kt), rp, span_begin, span_end,
                                            ov.address)
            return out
        finally:
            B.release(*held)


def _kept(n: int, fn: Any) -> Any:
    kept = (c_int32 * max(n, 1))()
    nk = c_int64()
    fn(kept, byref(nk))
    return _to_result(kept, nk.value, "int32")


def select_keep(scores: FloatsLike, budget: int, protect: int = 0, span: Tuple[int, int] = (0, 0)) -> Any:
    """kvmem_select_keep: kept positions (ascending) of N scored positions."""
    sp, keep = _f32_in(scores, None, "scores")
    try:
        n = keep.count()
        return _kept(n, lambda kept, nk: L.kvmem_select_keep(sp, n, budget, protect, span[0], span[1], kept, nk))
    finally:
        B.release(keep)


def streaming_keep(n: int, n_sink: int, window: int) -> Any:
    """kvmem_streaming_keep (StreamingLLM): the first n_sink and last window positions."""
    # kept positions are int32: a larger n is refused before its n-entry output is allocated
    n = _ints.check(n, "n", c_int32)
    return _kept(n, lambda kept, nk: L.kvmem_streaming_keep(n, n_sink, window, kept, nk))


def h2o_accumulate(probs: FloatsLike, n_rows: int, n: int, acc: FloatsLike) -> Any:
    """kvmem_h2o_accumulate: acc[j] += sum over rows of probs[r][j]; acc (n f32) is updated in place."""
    n_rows, n = _ints.check(n_rows, "n_rows", c_int64), _ints.check(n, "n", c_int64)
    pp, keep = _f32_in(probs, n_rows * n, "probs")
    try:
        with B.View(acc, True, "acc") as av:
            if av.format != "f" or av.count() != n or not av.contiguous():
                raise InvalidTypeError(f"acc must be {n} contiguous float32 values")
            L.kvmem_h2o_accumulate(pp, n_rows, n, av.address)
        return acc
    finally:
        B.release(keep)


def h2o_keep(acc: FloatsLike, budget: int, recent: int) -> Any:
    """kvmem_h2o_keep: the recent floor plus the heavy hitters."""
    ap, keep = _f32_in(acc, None, "acc")
    try:
        n = keep.count()
        return _kept(n, lambda kept, nk: L.kvmem_h2o_keep(ap, n, budget, recent, kept, nk))
    finally:
        B.release(keep)


def snapkv_score(ctx: Context, spec: SpecLike, q_obs: TensorLike, k: TensorLike, pool_kernel: int = 7,
                 dtype: DTypeLike = None) -> Any:
    """kvmem_snapkv_score: q_obs [W][n_layers][n_q_heads][head_dim], k
    [n_layers][N][n_kv_heads][head_dim], both post-RoPE; N scores."""
    spec = ModelSpec.of(spec)
    qt, qv = B.tensor(q_obs, "q_obs", (-1, spec.n_layers, spec.n_q_heads, spec.head_dim), dtype)
    held: List[Any] = [qv]
    try:
        kt, kv = B.tensor(k, "k", (spec.n_layers, -1, spec.n_kv_heads, spec.head_dim), dtype)
        held.append(kv)
        out = _out_f32((kt.shape[1],))
        with B.View(out, True, "scores") as ov:
            if SPEC_V2:
                L.kvmem_snapkv_score_v2(ctx.handle, byref(spec_v2(spec)), byref(qt), byref(kt), pool_kernel,
                                        ov.address)
            else:
                L.kvmem_snapkv_score(ctx.handle, byref(spec), byref(qt), byref(kt), pool_kernel, ov.address)
        return out
    finally:
        B.release(*held)


class KVStore(_Handle):
    """kvmem_kvstore: paged physical KV that slot maps point into. page_slots
    (slots per page), max_slots; None keeps the default. Closing it closes its
    slot maps first."""
    _kind = "KVStore"

    def __init__(self, spec: SpecLike, *, page_slots: Optional[int] = None, max_slots: Optional[int] = None) -> None:
        params = _given(locals())
        del params["spec"]
        spec = ModelSpec.of(spec)
        kp = _params(L.kvmem_kvstore_default_params(), "KVStore()", params)
        h = c_void_p()
        if SPEC_V2:
            L.kvmem_kvstore_create_v2(byref(spec_v2(spec)), byref(kp), byref(h))
        else:
            L.kvmem_kvstore_create(byref(spec), byref(kp), byref(h))
        self._init_handle(h.value, L.kvmem_kvstore_free)
        self.spec = spec
        self._maps: "weakref.WeakSet[SlotMap]" = weakref.WeakSet()

    def close(self) -> None:
        """Close the store's slot maps, then free it; idempotent."""
        for m in list(self._maps):
            m.close()
        super().close()

    def get_info(self) -> KVStoreInfo:
        """kvmem_kvstore_get_info: slots, used, free, page size, the dead slot."""
        x = L.kvmem_kvstore_info()
        L.kvmem_kvstore_get_info(self.handle, byref(x))
        return from_struct(KVStoreInfo, x)

    def slot_refs(self, slot: int) -> int:
        """kvmem_kvstore_slot_refs: how many slot-map positions point at slot."""
        r = c_int32()
        L.kvmem_kvstore_slot_refs(self.handle, slot, byref(r))
        return r.value

    def read_slot(self, slot: int) -> Tuple[Any, Any]:
        """(K, V) rows of a slot, each [n_layers][n_kv_heads][head_dim] f32."""
        s = self.spec
        shape = (s.n_layers, s.n_kv_heads, s.head_dim)
        k, v = _out_f32(shape), _out_f32(shape)
        with B.View(k, True, "k") as kv, B.View(v, True, "v") as vv:
            L.kvmem_kvstore_read_slot(self.handle, slot, kv.address, vv.address)
        return k, v

    def slotmap_create(self) -> "SlotMap":
        """kvmem_slotmap_create: a new, empty slot map over this store."""
        h = c_void_p()
        L.kvmem_slotmap_create(self.handle, byref(h))
        return SlotMap(self, h.value)


class SlotMap(_Handle):
    """kvmem_slotmap: one request's logical positions -> slots of a KVStore."""
    _kind = "SlotMap"

    def __init__(self, store: KVStore, handle: int) -> None:
        self._init_handle(handle, L.kvmem_slotmap_free)
        self.store = store
        store._maps.add(self)

    def fork(self, prefix_len: int) -> "SlotMap":
        """kvmem_slotmap_fork: a new map sharing the first prefix_len positions' slots."""
        h = c_void_p()
        L.kvmem_slotmap_fork(self.handle, prefix_len, byref(h))
        return SlotMap(self.store, h.value)

    def append(self, k: TensorLike, v: TensorLike, dtype: DTypeLike = None) -> None:
        """T tokens, k and v [n_layers][T][n_kv_heads][head_dim], post-RoPE keys."""
        s = self.store.spec
        shape = (s.n_layers, -1, s.n_kv_heads, s.head_dim)
        kt, kv = B.tensor(k, "k", shape, dtype)
        try:
            vt, vv = B.tensor(v, "v", shape, dtype)
            try:
                L.kvmem_slotmap_append(self.handle, byref(kt), byref(vt))
            finally:
                vv.close()
        finally:
            kv.close()

    def set_protected(self, protect: int) -> None:
        """kvmem_slotmap_set_protected: positions [0, protect) are never freed."""
        L.kvmem_slotmap_set_protected(self.handle, protect)

    def _kept_call(self, fn: Any, kept: IntsLike) -> int:
        kp, keep = B.int32s(kept if not isinstance(kept, range) else list(kept), "kept")
        try:
            n = 0 if keep is None else (keep.count() if isinstance(keep, B.View) else len(kept))
            freed = c_int64()
            fn(self.handle, kp, n, byref(freed))
            return freed.value
        finally:
            B.release(keep)

    def evict(self, kept: IntsLike) -> int:
        """Point every position not in kept at the dead slot; returns slots freed."""
        return self._kept_call(L.kvmem_slotmap_evict, kept)

    def compact(self, kept: IntsLike) -> int:
        """Move kept rows to positions 0..n_kept-1 (re-rotating moved keys); returns slots freed."""
        return self._kept_call(L.kvmem_slotmap_compact, kept)

    def slots(self) -> Tuple[Any, int]:
        """(the position -> slot array, copied; the dead slot id)."""
        p, n, dead = c_void_p(), c_int64(), c_int32()
        L.kvmem_slotmap_slots(self.handle, byref(p), byref(n), byref(dead))
        arr = (c_int32 * n.value).from_address(p.value) if n.value else (c_int32 * 1)()
        return _to_result(arr, n.value, "int32"), dead.value

    def get_info(self) -> SlotMapInfo:
        """kvmem_slotmap_get_info: length, live positions, protected prefix, parked slots."""
        x = L.kvmem_slotmap_info()
        L.kvmem_slotmap_get_info(self.handle, byref(x))
        return from_struct(SlotMapInfo, x)

    def gather(self, dtype: DTypeLike = "f32") -> Tuple[Any, Any, Any]:
        """The live rows in position order: (k, v, positions)."""
        s = self.store.spec
        n = self.get_info().n_live
        shape = (s.n_layers, n, s.n_kv_heads, s.head_dim)
        k, v = B.new_array(shape, dtype), B.new_array(shape, dtype)
        pos = (c_int32 * max(n, 1))()
        held: List[Any] = []
        try:
            kt, h = B.tensor(k, "k_out", shape, dtype, writable=True)
            held.append(h)
            vt, h = B.tensor(v, "v_out", shape, dtype, writable=True)
            held.append(h)
            L.kvmem_slotmap_gather(self.handle, byref(kt), byref(vt), pos)
        finally:
            B.release(*held)
        return k, v, _to_result(pos, n, "int32")
