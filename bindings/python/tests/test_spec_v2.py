"""kvmem_model_spec_v2, the spec that grows: its defaults are those kvmem.h
states for kvmem_model_spec_default(), the binding's spec reaches the
library through it (pool, RoPE, validation), and an older caller's shorter
struct gets only its own bytes written."""
from __future__ import annotations

import ctypes
import math
from ctypes import byref, c_int32, c_size_t

import numpy as np
import pytest

import kvmem
from kvmem import _lib as L
from kvmem import _objects


def test_the_library_has_the_v2_forms_and_the_binding_uses_them():
    assert _objects.SPEC_V2, f"{L.LIBRARY_PATH} lacks kvmem_model_spec_v2_init"


def test_v2_init_writes_the_defaults_the_header_states():
    v = L.kvmem_model_spec_v2()
    L.kvmem_model_spec_v2_init(byref(v), ctypes.sizeof(v))
    # kvmem.h: a 1-layer, 1-head, head_dim 64 shape with NEOX RoPE, theta
    # 10000, no scaling (rotary_dim 0 = head_dim; llama3's 1/4/8192, YaRN's 32/1)
    got = {n: getattr(v, n) for n, _ in L.kvmem_model_spec_v2._fields_ if n not in ("layer_window", "model_id")}
    assert got == {"struct_size": ctypes.sizeof(v), "n_layers": 1, "n_q_heads": 1, "n_kv_heads": 1, "head_dim": 64,
                   "rotary_dim": 0, "rope_style": kvmem.ROPE_NEOX, "rope_scaling": kvmem.ROPE_SCALING_NONE,
                   "rope_original_max_pos": 8192, "rope_theta": 10000.0, "rope_factor": 1.0,
                   "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0, "yarn_beta_fast": 32.0,
                   "yarn_beta_slow": 1.0, "yarn_attn_factor": 0.0}
    assert not v.layer_window and v.model_id == b""


def test_an_older_struct_gets_only_its_bytes():
    """A caller built against a v2 of struct_size + layer_window + n_layers:
    the bytes after it stay as they were."""
    size = ctypes.sizeof(c_size_t) + ctypes.sizeof(ctypes.c_void_p) + 8  # n_layers and n_q_heads
    buf = (ctypes.c_uint8 * 64)(*([0xA5] * 64))
    L.kvmem_model_spec_v2_init(ctypes.cast(buf, ctypes.POINTER(L.kvmem_model_spec_v2)), size)
    assert c_size_t.from_buffer(buf, 0).value == size
    assert c_int32.from_buffer(buf, size - 8).value == 1 and c_int32.from_buffer(buf, size - 4).value == 1
    assert bytes(buf[size:]) == b"\xa5" * (64 - size)
    with pytest.raises(kvmem.InvalidArgumentError, match="struct_size"):
        L.kvmem_model_spec_v2_init(ctypes.cast(buf, ctypes.POINTER(L.kvmem_model_spec_v2)), 3)


def test_a_pool_made_through_v2_keeps_every_field():
    spec = kvmem.ModelSpec(n_layers=3, n_q_heads=4, n_kv_heads=2, head_dim=8, rotary_dim=6,
                           rope_style=kvmem.ROPE_GPTJ, rope_theta=500000.0, rope_scaling=kvmem.ROPE_SCALING_LLAMA3,
                           rope_factor=8.0, rope_original_max_pos=4096, layer_window=[0, 16, 0], model_id="m-v2")
    with kvmem.Context("cpu", 1) as ctx:
        pool = ctx.pool_create(spec, block_size=4)
        got = pool.get_spec()
        for name, _t in L.kvmem_model_spec._fields_:
            if name != "layer_window":
                assert getattr(got, name) == getattr(spec, name), name
        assert list(got.layer_window[:3]) == [0, 16, 0]


def test_rope_through_v2_equals_a_plain_rotation():
    """NEOX pairs (i, i + r/2), angle p * theta^(-2i/r) (DESIGN.md)."""
    d, r, theta = 8, 8, 10000.0
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, d)).astype(np.float32)
    pos = [0, 7, 1000]
    ref = x.astype(np.float64).copy()
    for row, p in enumerate(pos):
        for i in range(r // 2):
            a = p * theta ** (-2.0 * i / r)
            x0, x1 = x[row, i], x[row, i + r // 2]
            ref[row, i] = x0 * math.cos(a) - x1 * math.sin(a)
            ref[row, i + r // 2] = x0 * math.sin(a) + x1 * math.cos(a)
    y = x.copy()
    kvmem.rope_apply(kvmem.ModelSpec(head_dim=d, rope_theta=theta), y, pos)
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-6)


def test_validation_through_v2_names_the_field():
    with pytest.raises(kvmem.InvalidArgumentError, match="n_kv_heads"):
        kvmem.ModelSpec(n_layers=1, n_q_heads=3, n_kv_heads=2, head_dim=8).validate()
    kvmem.ModelSpec(n_layers=1, n_q_heads=4, n_kv_heads=2, head_dim=8).validate()
