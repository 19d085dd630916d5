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

Device memory: ``device_tensor`` takes a CUDA export (kDLCUDA, and
kDLCUDAManaged, whose pointers the CUDA backend reads in place) as a
``DeviceTensor`` of kind "cuda" over the producer's own memory, no copy: the
data pointer is the descriptor's handle, byte_offset its offset, the size
the bytes the view spans. The consumer's stream goes to ``__dlpack__(stream=)``
as the array API says (None or 1: the legacy default stream, 2: the
per-thread one, a larger int: a cudaStream_t; -1: the producer does not
synchronise) and into the descriptor, so kvmem's work is ordered after the
producer's. The capsule is consumed (renamed ``"used_dltensor"``) and its
deleter runs when the DeviceTensor goes, so the producer's memory lives as
long as the view. kDLCUDAHost (pinned) is host memory and goes the host way;
other device types are refused naming them, before anything is consumed.
"""
from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_char_p, c_int, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p, py_object
from typing import Any, Callable, Optional, Sequence, Tuple

from ._buffers import BF16, F16, F32
from ._errors import InvalidArgumentError, InvalidTypeError, UnsupportedError

# DLDeviceType (dlpack.h)
CPU, CUDA, CUDA_HOST, CUDA_MANAGED = 1, 2, 3, 13
HOST_TYPES = (CPU, CUDA_HOST)          # host-addressable memory (pinned included)
CUDA_TYPES = (CUDA, CUDA_MANAGED)      # pointers the CUDA backend reads in place
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
_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.argtypes, _set_name.restype = [py_object, c_void_p], c_int
# PyCapsule_SetName keeps the pointer: the name must outlive every capsule
_USED_NAME = ctypes.create_string_buffer(b"used_dltensor")
_DELETER = ctypes.CFUNCTYPE(None, c_void_p)  # DLPack deleters may run without the GIL

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
                 shape: Tuple[int, ...], strides: Tuple[int, ...], handle: int = 0, byte_offset: int = 0,
                 span: int = 0, managed: int = 0):
        self.data, self.device, self.dtype, self.dtype_name = data, device, dtype, dtype_name
        self.shape, self.strides = shape, strides
        # the producer's data pointer and byte_offset as given; span: bytes from
        # element 0 to one past the last (0 when empty); managed: the DLManagedTensor
        self.handle, self.byte_offset, self.span, self.managed = handle, byte_offset, span, managed

    @property
    def device_name(self) -> str:
        return device_name(*self.device)

    @property
    def on_host(self) -> bool:
        return self.device[0] == CPU


def export(obj: Any, what: str, device_check: Callable[[int, int], None],
           stream_for: Optional[Callable[[int, int], Optional[int]]] = None) -> Any:
    """(what: the subject of error messages, e.g. "kvmem.torch: cache layer 0 k".)
    The DLPack capsule of obj (obj itself when it is one). An exporter's
    device goes through ``device_check(device_type, device_id)`` (which
    raises to refuse it) before ``__dlpack__`` is called, so a refused tensor
    is never exported.
    ``stream_for(device_type, device_id)``: the consumer's stream for a CUDA
    export, passed as ``__dlpack__(stream=...)`` (None: not passed)."""
    if is_capsule(obj):
        return obj
    try:
        dev = obj.__dlpack_device__()
        dev_type, dev_id = int(dev[0]), int(dev[1])
    except Exception as e:
        raise InvalidTypeError(f"{what}: __dlpack_device__() failed: {e}") from None
    device_check(dev_type, dev_id)
    stream = stream_for(dev_type, dev_id) if stream_for is not None and dev_type in CUDA_TYPES else None
    try:
        return obj.__dlpack__() if stream is None else obj.__dlpack__(stream=stream)
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
    reach = sum((e - 1) * s for e, s in zip(shape, strides) if e > 0) * isz + int(t.byte_offset)
    if reach >= 1 << 62:
        raise InvalidArgumentError(f"{what}: DLPack shape {shape} with strides {strides} spans {reach} bytes")
    data = (int(t.data or 0) + int(t.byte_offset)) if t.data else 0
    return Export(data, (int(t.device.device_type), int(t.device.device_id)), kv, dname, shape, strides,
                  int(t.data or 0), int(t.byte_offset), span_bytes(shape, strides, isz), ctypes.addressof(m))


def span_bytes(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> int:
    """Bytes from element 0 to one past the last of a view with non-negative
    strides (in elements): what its memory must hold; 0 when it is empty."""
    if any(int(e) == 0 for e in shape):
        return 0
    return (1 + sum((int(e) - 1) * int(s) for e, s in zip(shape, strides))) * itemsize


class _Owner:
    """A consumed DLPack tensor: its deleter runs once, when the last view of
    its memory goes (the producer's memory lives until then)."""

    def __init__(self, managed: int, deleter: int):
        self._managed, self._deleter = managed, deleter

    def __del__(self) -> None:
        d, self._deleter = self._deleter, 0
        if d:
            _DELETER(d)(self._managed)


def consume(capsule: Any, info: Export) -> _Owner:
    """Take ownership of a peeked capsule, as a DLPack consumer does: renamed
    ``"used_dltensor"`` (its own destructor then leaves the tensor alone, and
    a second consumer is refused) and its deleter left to the returned owner."""
    if _set_name(capsule, ctypes.addressof(_USED_NAME)) != 0:  # pragma: no cover - a valid capsule
        raise InvalidArgumentError("kvmem: could not mark the DLPack capsule consumed")
    return _Owner(info.managed, int(_DLManagedTensor.from_address(info.managed).deleter or 0))


def check_stream(stream: Optional[int], what: str) -> Optional[int]:
    """A consumer stream as the array API spells it: None, -1, 1, 2 or a
    cudaStream_t as a positive int (0 is ambiguous and disallowed)."""
    if stream is None:
        return None
    if isinstance(stream, bool) or not isinstance(stream, int) or stream == 0 or not -1 <= stream < 1 << 64:
        raise InvalidArgumentError(f"{what}: stream {stream!r} is not None, -1, 1 (legacy default), 2 "
                                   f"(per-thread default) or a cudaStream_t as a positive int")
    return stream


def refuse_device(device: Tuple[int, int], what: str) -> None:
    """The typed refusal of device memory no kvmem backend takes from DLPack."""
    dt, di = device
    raise UnsupportedError(f"{what} is on {device_name(dt, di)} (DLPack device type {dt}); kvmem takes "
                           f"host memory (cpu, cuda_host) and CUDA memory (cuda, cuda_managed)")


def cuda_tensor(handle: int, offset: int, span: int, device: int, dtype: int, shape: Sequence[int],
                strides: Sequence[int], stream: Optional[int], keep: Any = None) -> Any:
    """A DeviceTensor of kind "cuda" over [handle + offset, + span bytes);
    keep: what must live as long as it (the producer, a consumed capsule's owner).
    Stream -1 (no synchronisation asked of the producer) and None order
    kvmem on the legacy default stream (the descriptor's NULL)."""
    from ._objects import DeviceTensor  # _objects imports this module's users
    s = None if stream in (None, -1) else stream
    dt = DeviceTensor("cuda", handle=handle, size=offset + span, dtype=dtype, shape=shape, strides=strides,
                      offset=offset, device=device, stream=s)
    dt._keep = keep
    return dt


def device_tensor(obj: Any, what: str, stream: Optional[int] = None) -> Any:
    """A DeviceTensor over the CUDA memory a DLPack exporter or capsule
    describes (see the module doc). Host exports and other devices are
    refused before anything is exported or consumed."""
    stream = check_stream(stream, what)

    def check(info_device: Tuple[int, int]) -> None:
        if info_device[0] in CUDA_TYPES:
            return
        if info_device[0] in HOST_TYPES:
            raise InvalidTypeError(f"{what} is in host memory ({device_name(*info_device)}): pass it as a "
                                   f"buffer (a numpy array, memoryview) or through kvmem.torch, not as a "
                                   f"device tensor")
        refuse_device(info_device, what)

    cap = export(obj, what, lambda t, i: check((t, i)), lambda t, i: stream)
    info = peek(cap, what)
    check(info.device)
    if info.dtype is None:
        raise InvalidTypeError(f"{what} is {info.dtype_name} (DLPack); kvmem takes float32, float16 or bfloat16")
    dt = cuda_tensor(info.handle, info.byte_offset, info.span, info.device[1], info.dtype, info.shape,
                     info.strides, stream)
    dt._keep = (consume(cap, info), None if cap is obj else obj)
    return dt
