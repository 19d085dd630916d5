"""Exceptions: one class per kvmem_status, all deriving from KvmemError.

Arguments the binding refuses before C (a wrong shape, dtype, type or an
integer out of its C type's range) raise InvalidArgumentError, a ValueError,
or InvalidTypeError, a TypeError: both are KvmemError, so one
``except kvmem.KvmemError`` sees every failure, while ``except ValueError`` /
``except TypeError`` keep working as for any Python API."""
from __future__ import annotations

from typing import Dict, Type


class KvmemError(Exception):
    """A kvmem call failed.

    ``status`` is the C status code (negative int), ``name`` its C name
    (``"KVMEM_ERR_INVALID_ARG"``) and ``message`` the library's own
    ``kvmem_last_error()`` text for the failed call.
    """

    status: int = -14
    name: str = "KVMEM_ERR_INTERNAL"

    def __init__(self, message: str, status: int | None = None, name: str | None = None):
        if status is not None:
            self.status = status
        if name is not None:
            self.name = name
        self.message = message
        super().__init__(f"{self.name}: {message}" if message else self.name)


class InvalidArgumentError(KvmemError, ValueError):
    status, name = -1, "KVMEM_ERR_INVALID_ARG"


class InvalidTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type (a float or a str where an integer goes, a
    buffer of the wrong element type). Status KVMEM_ERR_INVALID_ARG, as the C
    library would report it; a TypeError too (and, as an InvalidArgumentError,
    a ValueError)."""


class NoMemoryError(KvmemError, MemoryError):
    status, name = -2, "KVMEM_ERR_NOMEM"


class CapacityError(KvmemError):
    status, name = -3, "KVMEM_ERR_CAPACITY"


class NotFoundError(KvmemError, LookupError):
    status, name = -4, "KVMEM_ERR_NOT_FOUND"


class ExistsError(KvmemError):
    status, name = -5, "KVMEM_ERR_EXISTS"


class ClosedError(KvmemError):
    status, name = -6, "KVMEM_ERR_CLOSED"


class UnsupportedError(KvmemError):
    status, name = -7, "KVMEM_ERR_UNSUPPORTED"


class BackendError(KvmemError):
    status, name = -8, "KVMEM_ERR_BACKEND"


class IOFailedError(KvmemError):
    status, name = -9, "KVMEM_ERR_IO"


class FormatError(KvmemError):
    status, name = -10, "KVMEM_ERR_FORMAT"


class CorruptError(KvmemError):
    status, name = -11, "KVMEM_ERR_CORRUPT"


class MismatchError(KvmemError, ValueError):
    status, name = -12, "KVMEM_ERR_MISMATCH"


class ConflictError(KvmemError):
    status, name = -13, "KVMEM_ERR_CONFLICT"


class InternalError(KvmemError):
    status, name = -14, "KVMEM_ERR_INTERNAL"


class BusyError(KvmemError):
    status, name = -15, "KVMEM_ERR_BUSY"


BY_STATUS: Dict[int, Type[KvmemError]] = {
    cls.status: cls
    for cls in (InvalidArgumentError, NoMemoryError, CapacityError, NotFoundError, ExistsError,
                ClosedError, UnsupportedError, BackendError, IOFailedError, FormatError,
                CorruptError, MismatchError, ConflictError, InternalError, BusyError)
}


def error_for(status: int, message: str, name: str | None = None) -> KvmemError:
    """The exception for a status code (KvmemError itself for unknown codes)."""
    cls = BY_STATUS.get(status)
    if cls is None:
        return KvmemError(message, status, name or f"kvmem status {status}")
    return cls(message, status, name)
