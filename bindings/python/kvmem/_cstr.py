"""Ids and paths on their way to C, checked before any call.

C reads a string up to its first NUL, so ``pool.agent_open("alice\\x00-evil")``
would open agent "alice" and a path "a.kvm\\x00.bak" would write "a.kvm". A NUL
is refused here with InvalidArgumentError (a ValueError, as ``os.open``
raises for one), and a value of the wrong type with InvalidTypeError (a TypeError).
"""
from __future__ import annotations

import os
from typing import Any, Optional

from ._errors import InvalidArgumentError, InvalidTypeError


def c_id(value: Any, what: str) -> bytes:
    """An id or name (agent id, segment name, owner, session id, backend,
    model id): a str without NUL, as UTF-8."""
    if not isinstance(value, str):
        raise InvalidTypeError(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise InvalidArgumentError(f"{what} {value!r} contains a NUL character")
    return value.encode()


def c_id_or_none(value: Any, what: str) -> Optional[bytes]:
    return None if value is None else c_id(value, what)


def c_path(value: Any, what: str = "path") -> Optional[bytes]:
    """A file path (str, bytes or os.PathLike; None stays None) without NUL,
    encoded as the os module encodes paths."""
    if value is None:
        return None
    try:
        b = os.fsencode(value)
    except TypeError:
        raise InvalidTypeError(f"{what} must be a str, bytes or os.PathLike, not {type(value).__name__}") from None
    if b"\x00" in b:
        raise InvalidArgumentError(f"{what} {value!r} contains a NUL character")
    return b
