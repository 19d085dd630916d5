"""Zero-copy views of Python buffers as kvmem_tensor.

Any object with the buffer protocol works: numpy arrays (strided views too),
memoryview, bytes/bytearray, array.array. The data pointer, element format,
shape and strides come from the exporter through PyObject_GetBuffer, so no
byte is copied and numpy is not needed. The export is held (and the object
kept alive) until the `with` block ends, i.e. for the duration of the C call.

dtypes: format 'f' -> f32, 'e' -> f16. bfloat16 has no buffer format: pass a
uint16 buffer (e.g. ``arr.view(np.uint16)`` of the bf16 bits) with
``dtype="bf16"``. Strides must be non-negative multiples of the item size.
"""
from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_char_p, c_int, c_ssize_t, c_void_p, py_object
from typing import Any, List, Optional, Sequence, Tuple

from . import _ints, _lib
from ._errors import InvalidArgumentError, InvalidTypeError

F32, F16, BF16 = 0, 1, 2
_DTYPES = {"f32": F32, "float32": F32, "f16": F16, "float16": F16, "bf16": BF16, "bfloat16": BF16}
_ITEMSIZE = {F32: 4, F16: 2, BF16: 2}
# buffer format char -> the dtypes it may carry
_FORMATS = {"f": (F32,), "e": (F16,), "H": (BF16, F16)}


class _Py_buffer(Structure):
    _fields_ = [("buf", c_void_p), ("obj", c_void_p), ("len", c_ssize_t), ("itemsize", c_ssize_t),
                ("readonly", c_int), ("ndim", c_int), ("format", c_char_p),
                ("shape", POINTER(c_ssize_t)), ("strides", POINTER(c_ssize_t)),
                ("suboffsets", POINTER(c_ssize_t)), ("internal", c_void_p)]


_PyBUF_WRITABLE, _PyBUF_FORMAT, _PyBUF_STRIDES = 0x1, 0x4, 0x18
_get = ctypes.pythonapi.PyObject_GetBuffer
_get.argtypes = [py_object, POINTER(_Py_buffer), c_int]
_get.restype = c_int
_release = ctypes.pythonapi.PyBuffer_Release
_release.argtypes = [POINTER(_Py_buffer)]
_release.restype = None


def dtype_code(dtype: Any) -> int:
    if isinstance(dtype, int) and dtype in _ITEMSIZE:
        return dtype
    key = str(getattr(dtype, "name", dtype)).lower()
    if key not in _DTYPES:
        raise InvalidTypeError(f"dtype {dtype!r} is not one of f32, f16, bf16")
    return _DTYPES[key]


class View:
    """A buffer export held open: address, element dtype, shape, strides (in elements)."""

    def __init__(self, obj: Any, writable: bool, what: str):
        self._buf = _Py_buffer()
        self._held = False
        flags = _PyBUF_STRIDES | _PyBUF_FORMAT | (_PyBUF_WRITABLE if writable else 0)
        try:
            if _get(obj, ctypes.byref(self._buf), flags) != 0:
                raise BufferError  # pragma: no cover  (ctypes raises the Python error itself)
        except (TypeError, BufferError, ValueError) as e:
            need = "a writable" if writable else "a"
            raise InvalidTypeError(f"{what} must be {need} buffer (numpy array, memoryview, "
                            f"bytearray, array.array), got {type(obj).__name__}: {e}") from None
        self._held = True
        b = self._buf
        if b.suboffsets:
            self.close()
            raise InvalidTypeError(f"{what}: indirect (PIL-style) buffers are not supported")
        self.address = b.buf or 0
        self.itemsize = b.itemsize
        fmt = (b.format or b"B").decode()
        if fmt[:1] in "<=@":
            fmt = fmt[1:]
        elif fmt[:1] in ">!":
            self.close()
            raise InvalidTypeError(f"{what} is big-endian ({fmt}); kvmem takes native little-endian data")
        self.format = fmt
        if b.ndim == 0:
            self.shape: List[int] = [b.len // max(b.itemsize, 1)]
            self.byte_strides: List[int] = [b.itemsize]
        else:
            self.shape = [b.shape[i] for i in range(b.ndim)]
            self.byte_strides = [b.strides[i] for i in range(b.ndim)]

    def close(self) -> None:
        if self._held:
            self._held = False
            _release(ctypes.byref(self._buf))

    def __enter__(self) -> "View":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # a View leaked by an exception still releases the export
        try:
            self.close()
        except Exception:
            pass

    def contiguous(self) -> bool:
        expect = self.itemsize
        for ext, st in zip(reversed(self.shape), reversed(self.byte_strides)):
            if ext > 1 and st != expect:
                return False
            expect *= ext
        return True

    def count(self) -> int:
        n = 1
        for e in self.shape:
            n *= e
        return n


def _elem_dtype(v: View, dtype: Optional[Any], what: str) -> int:
    want = dtype_code(dtype) if dtype is not None else None
    ok = _FORMATS.get(v.format)
    if v.format in ("B", "b", "c") and want is not None:
        return want  # raw bytes: the caller names the element type
    if ok is None:
        raise InvalidTypeError(f"{what} has element format {v.format!r}; kvmem takes float32 "
                        f"('f'), float16 ('e') or bfloat16 bits as uint16 with dtype='bf16'")
    if want is None:
        if v.format == "H":
            raise InvalidTypeError(f"{what} is uint16: pass dtype='bf16' (or 'f16') to say what it holds")
        return ok[0]
    if want not in ok:
        raise InvalidTypeError(f"{what} has element format {v.format!r}, which cannot hold dtype "
                        f"{['f32', 'f16', 'bf16'][want]}")
    return want


class _NoView:
    """What tensor() holds for a DeviceTensor: nothing to release."""

    def close(self) -> None:
        pass


_NO_VIEW = _NoView()


class _Held(_NoView):
    """What tensor() holds for a DeviceTensor it made from a DLPack export:
    the view (its descriptor and the producer) lives until the call is done."""

    def __init__(self, obj: Any):
        self.obj = obj

    def close(self) -> None:
        self.obj = None


def _is_buffer(obj: Any) -> bool:
    try:
        memoryview(obj).release()
        return True
    except TypeError:
        return False


def tensor(obj: Any, what: str, shape: Optional[Sequence[int]] = None, dtype: Optional[Any] = None,
           writable: bool = False) -> Tuple[_lib.kvmem_tensor, View]:
    """A kvmem_tensor over obj's memory, and the held View (close it after the call).

    shape: the logical shape the C call expects; one entry may be -1 (inferred).
    A buffer of another rank (e.g. flat bytes) is taken as that shape when it is
    contiguous and its element count fits; a buffer of the same rank must match
    it (-1 entries match anything) and may be strided.
    """
    held: Any = _NO_VIEW
    if getattr(obj, "_kvmem_device_tensor", None) is None and not _is_buffer(obj):
        from . import _dlpack  # imports this module
        if _dlpack.is_dlpack(obj):  # a CUDA export (CuPy, torch): a DeviceTensor, no copy
            obj = _dlpack.device_tensor(obj, f"kvmem: {what}")
            held = _Held(obj)
    dev = getattr(obj, "_kvmem_device_tensor", None)
    if dev is not None:  # a DeviceTensor: the C call checks it against its context
        t = dev()
        if shape is not None and (len(shape) != t.ndim or
                                  any(w >= 0 and w != t.shape[i] for i, w in enumerate(shape))):
            raise InvalidArgumentError(f"kvmem: {what} has shape {tuple(t.shape[:t.ndim])}, expected "
                                       f"{tuple(x if x >= 0 else '*' for x in shape)}")
        return t, held
    v = View(obj, writable, what)
    try:
        code = _elem_dtype(v, dtype, what)
        isz = _ITEMSIZE[code]
        if v.format in ("B", "b", "c"):  # raw bytes reinterpreted as elements
            if not v.contiguous():
                raise InvalidTypeError(f"{what}: a byte buffer must be contiguous")
            if v.count() % isz:
                raise InvalidTypeError(f"{what}: {v.count()} bytes is not a whole number of {isz}-byte elements")
            v.shape, v.byte_strides, v.itemsize = [v.count() // isz], [isz], isz
        for st in v.byte_strides:
            if st < 0 or st % isz:
                raise InvalidTypeError(f"{what}: strides {v.byte_strides} bytes must be non-negative "
                                f"multiples of {isz} (copy it, e.g. numpy.ascontiguousarray)")
        ext = list(v.shape)
        strides = [st // isz for st in v.byte_strides]
        if shape is not None:
            want = list(shape)
            if len(want) != len(ext):
                if not v.contiguous():
                    raise InvalidTypeError(f"{what} has shape {tuple(ext)}; a buffer of another rank "
                                    f"than {len(want)} must be contiguous to be read as {tuple(want)}")
                known = 1
                for w in want:
                    known *= w if w >= 0 else 1
                n = v.count()
                if want.count(-1) > 1 or known == 0 or n % known:
                    raise InvalidArgumentError(f"{what} holds {n} elements, which is not a whole "
                                     f"tensor of shape {tuple(want)}")
                ext = [w if w >= 0 else n // known for w in want]
                if ext and _prod(ext) != n:
                    raise InvalidArgumentError(f"{what} holds {n} elements, expected {_prod(ext)} "
                                     f"for shape {tuple(ext)}")
                strides = _row_major(ext)
            else:
                for i, (w, e) in enumerate(zip(want, ext)):
                    if w >= 0 and w != e:
                        raise InvalidArgumentError(f"{what} has shape {tuple(ext)}, expected "
                                         f"{tuple(x if x >= 0 else '*' for x in want)}")
        if not 1 <= len(ext) <= _lib.MAX_DIMS:
            raise InvalidTypeError(f"{what} has {len(ext)} dimensions, at most {_lib.MAX_DIMS}")
        t = _lib.kvmem_tensor()
        t.data = v.address or None
        t.dtype = code
        t.ndim = len(ext)
        for i, (e, s) in enumerate(zip(ext, strides)):
            t.shape[i], t.strides[i] = e, s
        return t, v
    except BaseException:
        v.close()
        raise


def _prod(xs: Sequence[int]) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def _row_major(shape: Sequence[int]) -> List[int]:
    st, acc = [], 1
    for e in reversed(shape):
        st.append(acc)
        acc *= e
    return list(reversed(st))


def int32s(obj: Any, what: str, n: Optional[int] = None) -> Tuple[Any, Any]:
    """A pointer to n int32 values: a contiguous int32 buffer is used in place,
    a Python sequence is copied into a new array (returned to keep it alive)."""
    if obj is None:
        return None, None
    if isinstance(obj, (list, tuple, range)):
        if n is not None and len(obj) != n:
            raise InvalidArgumentError(f"{what} has {len(obj)} entries, expected {n}")
        arr = _ints.array(ctypes.c_int32, obj, what)
        return ctypes.cast(arr, _lib.i32_p), arr
    v = View(obj, False, what)
    try:
        if v.itemsize != 4 or v.format not in ("i", "l" if ctypes.sizeof(ctypes.c_long) == 4 else "i"):
            raise InvalidTypeError(f"{what} must hold int32 values (format 'i'), got {v.format!r}")
        if not v.contiguous():
            raise InvalidTypeError(f"{what} must be contiguous")
        if n is not None and v.count() != n:
            raise InvalidArgumentError(f"{what} has {v.count()} entries, expected {n}")
        return ctypes.cast(c_void_p(v.address), _lib.i32_p), v
    except BaseException:
        v.close()
        raise


def release(*held: Any) -> None:
    for h in held:
        if isinstance(h, View):
            h.close()



try:  # numpy is optional: outputs are numpy arrays when it is there
    import numpy as _np
except ImportError:  # pragma: no cover - exercised by the no-numpy test
    _np = None


def new_array(shape: Sequence[int], dtype: Any = "f32") -> Any:
    """A new zeroed output array: numpy.ndarray when numpy is importable
    (bf16 as uint16 bits), else a memoryview of that shape over a bytearray
    (f32 as "f"; f16 and bf16 as uint16 bits, format "H")."""
    code = dtype_code(dtype)
    if any(e < 0 for e in shape):
        raise InvalidArgumentError(f"an output of shape {tuple(shape)}: extents must not be negative")
    if _np is not None:
        return _np.zeros(tuple(shape), dtype={F32: _np.float32, F16: _np.float16, BF16: _np.uint16}[code])
    n = _prod(shape) * _ITEMSIZE[code]
    mv = memoryview(bytearray(n))
    # f16 as uint16 bits: memoryview cannot cast to "e"
    return mv.cast({F32: "f", F16: "H", BF16: "H"}[code], tuple(shape)) if n else mv.cast({F32: "f", F16: "H", BF16: "H"}[code])
