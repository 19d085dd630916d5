"""Params structs carry struct_size (kvmem.h, "ABI and versioning"): the
binding sets it from its own ctypes declarations, a binding whose
declaration is older than the library still gets the defaults of the rest,
and struct_size is never a parameter a caller passes."""
from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, byref, c_char_p, c_size_t, c_void_p

import pytest

import kvmem
from kvmem import _lib as L

PARAMS = ["context", "pool", "append", "retrieve", "qmem", "kvstore", "attend", "prefix", "segments", "kmeans",
          "multihop", "load_plan"]


@pytest.mark.parametrize("name", PARAMS)
def test_default_params_carry_the_bindings_struct_size(name):
    struct = getattr(L, f"kvmem_{name}_params")
    assert struct._fields_[0] == ("struct_size", c_size_t)
    p = getattr(L, f"kvmem_{name}_default_params")()
    assert p.struct_size == ctypes.sizeof(struct)


def test_a_binding_older_than_the_library_gets_defaults_for_the_rest():
    class OldContextParams(Structure):  # kvmem_context_params before n_threads
        _fields_ = [("struct_size", c_size_t), ("backend", c_char_p)]

    old = OldContextParams()
    L.kvmem_context_params_init(ctypes.cast(byref(old), POINTER(L.kvmem_context_params)), ctypes.sizeof(old))
    assert old.struct_size == ctypes.sizeof(old) and old.backend == b"auto"
    old.backend = b"cpu"
    h, ref = c_void_p(), c_void_p()
    L.kvmem_context_create(ctypes.cast(byref(old), POINTER(L.kvmem_context_params)), byref(h))
    L.kvmem_context_create(None, byref(ref))
    try:
        assert L.kvmem_context_backend(h) == b"cpu"
        assert L.kvmem_context_n_threads(h) == L.kvmem_context_n_threads(ref)  # the default n_threads
    finally:
        L.kvmem_context_free(h)
        L.kvmem_context_free(ref)


def test_struct_size_zero_is_refused_with_the_libraries_message():
    p = L.kvmem_context_default_params()
    p.struct_size = 0
    with pytest.raises(kvmem.InvalidArgumentError, match=r"kvmem_context_params\.struct_size is 0"):
        L.kvmem_context_create(byref(p), byref(c_void_p()))


def test_struct_size_and_reserved_are_not_parameters():
    ctx = kvmem.Context("cpu", 1)
    pool = ctx.pool_create(kvmem.ModelSpec(n_layers=1, n_q_heads=2, n_kv_heads=1, head_dim=4))
    with pytest.raises(TypeError, match="unexpected keyword argument 'struct_size'"):
        kvmem.Segments(pool, "s", struct_size=8)
    with pytest.raises(TypeError, match="unexpected keyword argument 'struct_size'"):
        ctx.pool_create(kvmem.ModelSpec(n_layers=1, n_q_heads=2, n_kv_heads=1, head_dim=4), struct_size=8)
    with pytest.raises(TypeError, match="unexpected keyword argument 'reserved'"):
        kvmem.cluster_kmeans([1.0, 0.0, 0.0, 1.0], 2, 2, k=1, reserved=1)
    ctx.close()
