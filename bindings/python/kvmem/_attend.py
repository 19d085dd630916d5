"""High level for ART attention (kvmem_attend)."""
from __future__ import annotations

import ctypes
from ctypes import byref
from typing import Any, Dict, List, Optional, Tuple

from . import _buffers as B
from . import _lib as L
from ._errors import InvalidTypeError
from ._objects import Agent, Context, _given, _in_array, _params, _struct_dict
from ._types import Array, DTypeLike, IntsLike, OutTensor, TensorLike

ATTEND_SRC_TENSORS, ATTEND_SRC_AGENT, ATTEND_SRC_SLOTMAP = 0, 1, 2
ATTEND_RECENT, ATTEND_IMPORTANCE, ATTEND_INDEX, ATTEND_SCORED = 0, 1, 2, 3
ATTEND_PROBE_STRIDED, ATTEND_PROBE_ORACLE = 0, 1
ATTEND_MAX_ROWS, ATTEND_PROBE_SIZE = 64, 32


def attend(ctx: Context, q: TensorLike, *, k: Optional[TensorLike] = None, v: Optional[TensorLike] = None,
           agent: Optional[Agent] = None, layer: int = 0, positions: Optional[IntsLike] = None,
           base_position: int = 0, slots: Optional[IntsLike] = None, dead_slot: int = 0,
           mask: Optional[IntsLike] = None, out: Optional[OutTensor] = None, dtype: DTypeLike = None,
           tile_order: Optional[IntsLike] = None, order: Optional[int] = None, n_sink: Optional[int] = None,
           tile_size: Optional[int] = None, scale: Optional[float] = None, tau_s: Optional[float] = None,
           tau_d: Optional[float] = None, patience: Optional[int] = None, probe: Optional[int] = None,
           causal: Optional[int] = None, compare: Optional[int] = None) -> Tuple[Array, Dict[str, Any]]:
    """kvmem_attend: attention of q [n_rows][n_q_heads][head_dim] (post-RoPE) over
    an agent's layer (agent=, layer=, positions= or base_position=), caller
    tensors k, v [T][n_kv_heads][head_dim] (keys post-RoPE), or a slot map's
    physical k, v [n_slots][..][..] with slots= (logical -> physical) and
    dead_slot=. mask: T bytes, 0 = skip. params: order, n_sink, tile_size,
    scale, tau_s, tau_d, patience, probe, causal, compare; tile_order a list.
    Returns (out [n_rows][n_q_heads][head_dim] f32 unless given, stats dict)."""
    params = {key: val for key, val in _given(locals()).items()
              if key in ("order", "n_sink", "tile_size", "scale", "tau_s", "tau_d", "patience", "probe", "causal",
                         "compare")}
    params = {key: int(val) if isinstance(val, bool) else val for key, val in params.items()}
    ap = _params(L.kvmem_attend_default_params(), "attend()", params)
    v2 = "kvmem_attend_v2" not in L.MISSING  # the growable source where the library has it
    src = L.kvmem_attend_source_v2() if v2 else L.kvmem_attend_source()
    if v2:
        src.struct_size = ctypes.sizeof(src)
    held: List[Any] = []
    try:
        if agent is not None:
            s = agent.pool.spec
            qt, h = B.tensor(q, "q", (-1, s.n_q_heads, s.head_dim), dtype)
            src.kind, src.agent, src.layer, src.base_position = ATTEND_SRC_AGENT, agent.handle, layer, base_position
            ptr, hp = B.int32s(positions, "positions")
            held += [h, hp]
            if ptr is not None:
                src.positions = ptr
        else:
            if k is None or v is None:
                raise InvalidTypeError("attend() needs agent=, or k= and v=")
            qt, h = B.tensor(q, "q", None, dtype)
            held.append(h)
            kt, h = B.tensor(k, "k", None, dtype)
            held.append(h)
            vt, h = B.tensor(v, "v", None, dtype)
            held.append(h)
            src.k, src.v = ctypes.pointer(kt), ctypes.pointer(vt)
            if slots is not None:
                sp, hs = B.int32s(slots if not isinstance(slots, range) else list(slots), "slots")
                held.append(hs)
                src.kind, src.slots, src.dead_slot = ATTEND_SRC_SLOTMAP, sp, dead_slot
                src.n_positions = hs.count() if isinstance(hs, B.View) else len(slots)
            else:
                src.kind = ATTEND_SRC_TENSORS
        if mask is not None:
            mp, hm = _in_array(mask, ctypes.c_uint8, None, "mask")
            held.append(hm)
            src.mask = ctypes.cast(mp, ctypes.POINTER(ctypes.c_uint8))
        if tile_order is not None:
            tp, ht = B.int32s(list(tile_order), "tile_order")
            held.append(ht)
            ap.tile_order, ap.n_tile_order = tp, len(tile_order)
        shape = tuple(qt.shape[i] for i in range(qt.ndim))
        if out is None:
            out = B.new_array(shape, "f32")
        ot, h = B.tensor(out, "out", shape, None, writable=True)
        held.append(h)
        stats = L.kvmem_attend_stats()
        (L.kvmem_attend_v2 if v2 else L.kvmem_attend)(ctx.handle, byref(qt), byref(src), byref(ap), byref(ot),
                                                      byref(stats))
        return out, _struct_dict(stats)
    finally:
        B.release(*held)
