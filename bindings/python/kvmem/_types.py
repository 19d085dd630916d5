"""The types of the public signatures (for editors and type checkers).

Tensors cross without copies as any object with the buffer protocol; numpy
is optional, so a checker sees numpy arrays named only where numpy is
installed. At run time these names are plain aliases (``Any``): the binding
checks what it is given itself, naming the argument.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

if TYPE_CHECKING:
    import array

    import numpy

    #: float32 / float16 data (or bfloat16 bits as uint16 with dtype="bf16"):
    #: numpy arrays (any strides), memoryview, bytes, bytearray, array.array
    TensorLike = Union["numpy.ndarray[Any, Any]", memoryview, bytes, bytearray, "array.array[Any]"]
    #: an output kvmem writes into: a writable buffer
    OutTensor = Union["numpy.ndarray[Any, Any]", memoryview, bytearray, "array.array[Any]"]
    #: what a call returns: a numpy array (a memoryview of that shape without numpy)
    Array = Union["numpy.ndarray[Any, Any]", memoryview]
    #: integers copied for the call (each must fit int32), or a contiguous int32 buffer used in place
    IntsLike = Union[Sequence[int], "numpy.ndarray[Any, Any]", memoryview, "array.array[int]"]
    #: float32 values: a sequence of numbers or a contiguous float32 buffer
    FloatsLike = Union[Sequence[float], "numpy.ndarray[Any, Any]", memoryview, "array.array[float]"]
    from ._objects import ModelSpec

    #: a ModelSpec, or a mapping of its fields (n_layers=..., head_dim=...)
    SpecLike = Union[ModelSpec, Mapping[str, Any]]
else:
    TensorLike = OutTensor = Array = IntsLike = FloatsLike = SpecLike = Any

#: "f32", "f16", "bf16" (or "float32", ..., a numpy dtype, a code F32/F16/BF16)
DTypeLike = Union[str, int, Any, None]
#: a file path, as the os module takes them
PathLike = Union[str, bytes, os.PathLike]
#: text kept with the tokens: str (stored as UTF-8) or bytes
TextLike = Union[str, bytes]

__all__ = ["TensorLike", "OutTensor", "Array", "IntsLike", "FloatsLike", "DTypeLike", "PathLike", "SpecLike", "TextLike"]
