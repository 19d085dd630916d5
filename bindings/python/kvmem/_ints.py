"""Integers on their way to C, refused (never wrapped) when they do not fit.

ctypes converts a Python int to a C integer modulo 2**bits: ``top_k=2**32``
became 0, ``truncate(2**64)`` became ``truncate(0)``. Every integer argument
of a declared C function and every integer field of a params struct passes
through :func:`check` first: a non-integer (float, NaN, str) raises
InvalidTypeError, an integer outside the C type's range InvalidArgumentError,
both naming the argument and the range. numpy integers and bools are taken
(``operator.index``), as Python's own integer APIs take them.
"""
from __future__ import annotations

import ctypes
import operator
from typing import Any, Dict, Optional, Tuple

from ._errors import InvalidArgumentError, InvalidTypeError

# ctype -> (lo, hi, C name); c_int is c_int32 and c_size_t is c_uint64 (LP64)
# in ctypes, so the C name comes from size and sign, not the ctypes name.
_RANGES: Dict[Any, Tuple[int, int, str]] = {}
for _t in (ctypes.c_int8, ctypes.c_uint8, ctypes.c_int16, ctypes.c_uint16, ctypes.c_int32, ctypes.c_uint32,
           ctypes.c_int64, ctypes.c_uint64, ctypes.c_int, ctypes.c_uint, ctypes.c_long, ctypes.c_ulong,
           ctypes.c_longlong, ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_ssize_t):
    _bits = 8 * ctypes.sizeof(_t)
    if _t(-1).value == -1:
        _RANGES[_t] = (-(1 << (_bits - 1)), (1 << (_bits - 1)) - 1, f"int{_bits}")
    else:
        _RANGES[_t] = (0, (1 << _bits) - 1, f"uint{_bits}")


def int_range(ctype: Any) -> Optional[Tuple[int, int, str]]:
    """(lo, hi, name) of an integer ctypes type, None for any other type."""
    return _RANGES.get(ctype)


def check(value: Any, what: str, ctype: Any) -> int:
    """value as a Python int that fits ctype, or the error naming `what`."""
    lo, hi, name = _RANGES[ctype]
    if type(value) is int and lo <= value <= hi:
        return value
    try:
        v = operator.index(value)
    except TypeError:
        raise InvalidTypeError(f"{what} must be an integer ({name}), not {type(value).__name__} {value!r}") from None
    if not lo <= v <= hi:
        raise InvalidArgumentError(f"{what} = {v} is outside the range of {name} [{lo}, {hi}]")
    return v


def array(ctype: Any, values: Any, what: str) -> Any:
    """A new ctypes array of ctype holding `values` (a sequence), each checked:
    integers as check() does, floats must be real numbers."""
    vals = list(values)
    if ctype in _RANGES:
        vals = [check(x, f"{what}[{i}]", ctype) for i, x in enumerate(vals)]
    else:
        for i, x in enumerate(vals):
            if isinstance(x, (str, bytes)) or not hasattr(x, "__float__"):
                raise InvalidTypeError(f"{what}[{i}] must be a number, not {type(x).__name__} {x!r}")
    return (ctype * len(vals))(*vals)
