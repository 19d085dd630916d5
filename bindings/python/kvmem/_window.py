"""The model's window when retrieved memory goes into it (experimental): the
order of the retrieved blocks before the live context (kvmem_arrange) and how
the window is shared between memory and the live context (kvmem_window_split)."""
from __future__ import annotations

import ctypes
from ctypes import byref, c_int32
from dataclasses import dataclass
from typing import Dict, List, Optional

from . import _buffers as B
from . import _ints
from . import _lib as L
from ._errors import InvalidArgumentError, InvalidTypeError
from ._objects import _in_array
from ._types import FloatsLike, IntsLike

# kvmem_arrange_order by name
_ORDERS: Dict[str, int] = {"chrono": 0, "score": 1, "runs": 2}


@dataclass(frozen=True)
class WindowPlan:
    """kvmem_window_plan: tokens of retrieved memory (whole blocks), the blocks
    to retrieve for it (top_k) and the newest history tokens kept live."""
    memory_tokens: int
    top_k: int
    live_tokens: int


def arrange(blocks: IntsLike, scores: Optional[FloatsLike] = None, order: str = "score") -> List[int]:
    """kvmem_arrange: the order to gather `blocks` (distinct ids >= 0, e.g. a
    retrieval set) in, first = farthest from the new tokens. order: "score"
    (ascending score, the most relevant block last), "chrono" (ascending id;
    scores may be None) or "runs" (runs of adjacent ids kept whole, the runs by
    ascending best score). scores: one per block, needed by "score" and "runs"."""
    if not isinstance(order, str):
        raise InvalidTypeError(f"order must be one of {sorted(_ORDERS)}, not {type(order).__name__} {order!r}")
    if order not in _ORDERS:
        raise InvalidArgumentError(f"order {order!r} is not one of {sorted(_ORDERS)}")
    ids = [_ints.check(b, f"blocks[{i}]", c_int32) for i, b in enumerate(blocks)]
    n = len(ids)
    arr = (c_int32 * max(n, 1))(*ids)
    out = (c_int32 * max(n, 1))()
    sp, keep = _in_array(scores, ctypes.c_float, n, "scores")
    try:
        L.kvmem_arrange(arr, sp, n, _ORDERS[order], out)
    finally:
        B.release(keep)
    return list(out[:n])


def window_split(window: int, reserve: int, memory_share: float, live_share: float, block_size: int) -> WindowPlan:
    """kvmem_window_split: share a window of `window` tokens, `reserve` of them
    for the turn itself. Memory gets memory_share of the window rounded down to
    whole blocks of block_size (never more than window - reserve); the live
    context live_share of the window (0: all that is left), never more than is
    left. Shares are in [0, 1]."""
    shares = []
    for what, x in (("memory_share", memory_share), ("live_share", live_share)):
        if isinstance(x, (str, bytes)) or not hasattr(x, "__float__"):
            raise InvalidTypeError(f"{what} must be a number, not {type(x).__name__} {x!r}")
        shares.append(float(x))
    plan = L.kvmem_window_plan()
    L.kvmem_window_split(window, reserve, shares[0], shares[1], block_size, byref(plan))
    return WindowPlan(plan.memory_tokens, plan.top_k, plan.live_tokens)


__all__ = ["WindowPlan", "arrange", "window_split"]
