"""Device tensors through the binding (kvmem.h, "Device tensors"): a
DeviceTensor goes where tensors go; a context that does not own its memory
refuses it naming both, and nothing is appended or written. The memory
handles here are made up: a refusal never touches them. Taking real device
memory is tested in C on lavapipe (tests/unit/test_device_tensors.c)."""
from __future__ import annotations

import numpy as np
import pytest

import kvmem

L, H, D, T = 2, 2, 8, 16


def _agent(ctx):
    pool = ctx.pool_create(kvmem.ModelSpec(n_layers=L, n_q_heads=4, n_kv_heads=H, head_dim=D))
    return pool, pool.agent_open("a")


def test_cpu_context_refuses_device_memory():
    with kvmem.Context("cpu") as ctx:
        pool, a = _agent(ctx)
        v = np.zeros((L, T, H, D), np.float32)
        dk = kvmem.DeviceTensor("vulkan", handle=0xDEAD0000, size=1 << 20, dtype="f32", shape=(L, T, H, D))
        with pytest.raises(kvmem.UnsupportedError, match="K is in Vulkan device memory but the context runs on cpu"):
            a.append(dk, v)
        dv = kvmem.DeviceTensor("cuda", handle=0xBEEF0000, size=1 << 20, dtype="f16", shape=(L, T, H, D), device=1)
        with pytest.raises(kvmem.UnsupportedError, match="V is in CUDA device memory"):
            a.append(v, dv)
        assert a.get_info().n_tokens == 0
        with pytest.raises(kvmem.UnsupportedError, match="not on a Vulkan device"):
            ctx.vulkan_device()


def test_descriptor_refusals():
    with pytest.raises(kvmem.InvalidArgumentError, match="reaches past"):
        kvmem.DeviceTensor("vulkan", handle=0x1000, size=L * T * H * D * 4 - 1, dtype="f32", shape=(L, T, H, D))
    with pytest.raises(kvmem.InvalidArgumentError, match="handle is 0"):
        kvmem.DeviceTensor("cuda", handle=0, size=64, dtype="f32", shape=(4,))
    with pytest.raises(kvmem.InvalidArgumentError, match="not 'cuda' or 'vulkan'"):
        kvmem.DeviceTensor("metal", handle=1, size=64, dtype="f32", shape=(4,))
    with pytest.raises(ValueError, match="expected"):
        with kvmem.Context("cpu") as ctx:
            _, a = _agent(ctx)
            a.append(kvmem.DeviceTensor("cuda", handle=1, size=1 << 20, dtype="f32", shape=(L, T, H, D + 1)),
                     np.zeros((L, T, H, D), np.float32))


def test_vulkan_device_handles():
    try:
        ctx = kvmem.Context("vulkan")
    except kvmem.KvmemError as e:
        pytest.skip(f"backend vulkan: {e}")
    with ctx:
        d = ctx.vulkan_device()
        assert d["instance"] and d["physical_device"] and d["device"] and d["queue"]
        assert d["api_version"] >= (1 << 22) | (1 << 12)  # Vulkan 1.1
