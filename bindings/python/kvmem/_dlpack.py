"""Reading DLPack exports without consuming them (no torch or numpy needed).

A DLPack producer (torch, numpy >= 1.22, CuPy, JAX, ...) hands its tensor over
as a PyCapsule named ``"dltensor"`` that points to a ``DLManagedTensor``;
the consumer that takes it renames it ``"used_dltensor"`` and later calls its
deleter. ``peek`` reads the pointer, device, dtype, shape and strides of such
a capsule while leaving it unconsumed, so the caller can refuse it (a device
kvmem cannot read, a dtype it does not take, negative strides, which
PyTorch 1.13's importer aborts the process on) before anything takes
ownership. A capsule is consumed once: a second ``peek`` of a used capsule
says so.

The device check sits in one place (``export`` asks ``__dlpack_device__``
before the producer exports anything), so device tensors can be accepted
there once kvmem's C ABI takes device memory.
"""
from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_char_p, c_int, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p, py_object
from typing import Any, Callable, Optional, Tuple

from ._buffers import BF16, F16, F32
from ._errors import InvalidArgumentError, InvalidTypeError

# DLDeviceType (dlpack.h)
CPU = 1
_DEVICES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 9: "vpi",
            10: "rocm", 11: "rocm_host", 12: "ext_dev", 13: "cuda_managed", 14: "oneapi",
            15: "webgpu", 16: "hexagon", 17: "maia"}
# DLDataTypeCode (dlpack.h): kDLInt 0, kDLUInt 1, kDLFloat 2, kDLOpaqueHandle 3, kDLBfloat 4,
# kDLComplex 5, kDLBool 6
_CODES = {0: "int", 1: "uint", 2: "float", 3: "opaque", 4: "bfloat", 5: "complex", 6: "bool"}
_KVMEM_DTYPES = {(2, 32): F32, (2, 16): F16, (4, 16): BF16}
_ITEMSIZE = {F32: 4, F16: 2, BF16: 2}


class _DLDevice(Structure):
    _fields_ = [("device_type", c_int), ("device_id", c_int32)]


class _DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", _DLDevice), ("ndim", c_int32), ("dtype", _DLDataType),
                ("shape", POINTER(c_int64)), ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class _DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.argtypes, _is_valid.restype = [py_object, c_char_p], c_int
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.argtypes, _get_pointer.restype = [py_object, c_char_p], c_void_p
_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.argtypes, _get_name.restype = [py_object], c_char_p

_MAX_NDIM = 64  # far beyond any tensor kvmem takes; guards the shape read against a corrupt ndim


def device_name(device_type: int, device_id: int) -> str:
    """``"cuda:0"``, ``"cpu"``: PyTorch's spelling of a DLPack device."""
    name = _DEVICES.get(int(device_type), f"dlpack device type {int(device_type)}")
    return name if int(device_type) == CPU else f"{name}:{int(device_id)}"


def is_capsule(obj: Any) -> bool:
    return type(obj).__name__ == "PyCapsule"


def is_dlpack(obj: Any) -> bool:
    """An object with ``__dlpack__`` (the array API protocol) or a DLPack capsule."""
    return is_capsule(obj) or (hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"))


class Export:
    """What a DLPack capsule describes, read without consuming it.

    ``data`` is the first element's address (``data + byte_offset``);
    ``strides`` are in elements (a producer's NULL strides, compact row-major,
    are filled in); ``dtype`` is kvmem's code (F32, F16, BF16) or None for any
    other type, which ``dtype_name`` spells as DLPack does (``"int32"``)."""

    def __init__(self, data: int, device: Tuple[int, int], dtype: Optional[int], dtype_name: str,
                 shape: Tuple[int, ...], strides: Tuple[int, ...]):
        self.data, self.device, self.dtype, self.dtype_name = data, device, dtype, dtype_name
        self.shape, self.strides = shape, strides

    @property
    def device_name(self) -> str:
        return device_name(*self.device)

    @property
    def on_host(self) -> bool:
        return self.device[0] == CPU


def export(obj: Any, what: str, device_check: Callable[[str], None]) -> Any:
    """(what: the subject of error messages, e.g. "kvmem.torch: cache layer 0 k".)
    The DLPack capsule of obj (obj itself when it is one). An exporter's
    device goes through ``device_check(name)`` (which raises to refuse it)
    before ``__dlpack__`` is called, so a refused tensor is never exported."""
    if is_capsule(obj):
        return obj
    try:
        dev = obj.__dlpack_device__()
        dev_type, dev_id = int(dev[0]), int(dev[1])
    except Exception as e:
        raise InvalidTypeError(f"{what}: __dlpack_device__() failed: {e}") from None
    if dev_type != CPU:
        device_check(device_name(dev_type, dev_id))
    try:
        return obj.__dlpack__()
    except Exception as e:  # numpy refuses read-only arrays, others their own cases
        raise InvalidTypeError(f"{what}: its DLPack export (__dlpack__) failed: "
                        f"{type(e).__name__}: {e}") from None


def peek(capsule: Any, what: str) -> Export:
    """Read a ``"dltensor"`` capsule, leaving it unconsumed. Raises ValueError
    for a capsule that was already consumed (DLPack capsules are single-use)
    or is not DLPack's, and for shapes or strides kvmem cannot view."""
    if not _is_valid(capsule, b"dltensor"):
        name = _get_name(capsule)
        if name == b"used_dltensor":
            raise InvalidArgumentError(f"{what}: this DLPack capsule was already consumed (a capsule can be "
                             f"used once); pass the tensor itself, or a new capsule (to_dlpack) for "
                             f"each use")
        raise InvalidArgumentError(f"{what}: a capsule named {name!r} is not a DLPack tensor "
                         f"(expected 'dltensor')")
    m = _DLManagedTensor.from_address(_get_pointer(capsule, b"dltensor"))
    t = m.dl_tensor
    code, bits, lanes = int(t.dtype.code), int(t.dtype.bits), int(t.dtype.lanes)
    kv = _KVMEM_DTYPES.get((code, bits)) if lanes == 1 else None
    dname = f"{_CODES.get(code, f'code{code}_')}{bits}" + (f"x{lanes}" if lanes != 1 else "")
    ndim = int(t.ndim)
    if not 0 <= ndim <= _MAX_NDIM:
        raise InvalidArgumentError(f"{what}: DLPack tensor with ndim {ndim}")
    shape = tuple(int(t.shape[i]) for i in range(ndim)) if ndim else ()
    if any(e < 0 for e in shape):
        raise InvalidArgumentError(f"{what}: DLPack shape {shape} has a negative extent")
    if t.strides:
        strides = tuple(int(t.strides[i]) for i in range(ndim))
    else:  # NULL strides: compact row-major
        acc, rev = 1, []
        for e in reversed(shape):
            rev.append(acc)
            acc *= e
        strides = tuple(reversed(rev))
    if any(s < 0 for s in strides):
        raise InvalidArgumentError(f"{what}: strides {strides} (elements) are negative; kvmem takes "
                         f"non-negative strides: copy it first (numpy.ascontiguousarray, .contiguous())")
    # the farthest element's byte offset must fit in the address space
    isz = max(bits * lanes // 8, 1)
    span = sum((e - 1) * s for e, s in zip(shape, strides) if e > 0) * isz + int(t.byte_offset)
    if span >= 1 << 62:
        raise InvalidArgumentError(f"{what}: DLPack shape {shape} with strides {strides} spans {span} bytes")
    data = (int(t.data or 0) + int(t.byte_offset)) if t.data else 0
    return Export(data, (int(t.device.device_type), int(t.device.device_id)), kv, dname, shape, strides)
