"""device_capacity_bytes and Pool.device_stats(): the device-resident
mirror's bytes are those its layout gives (kvmem.h, core/pool/resident.h),
they never pass the capacity, and an agent whose mirror does not fit is
served from the host copy with the CPU context's results. Vulkan runs on
lavapipe here; without a usable device those parts skip with the reason."""
from __future__ import annotations

import numpy as np
import pytest

import kvmem

L, HQ, H, D, BS, NB, TOP_K = 2, 4, 2, 16, 16, 6, 3
SPEC = dict(n_layers=L, n_q_heads=HQ, n_kv_heads=H, head_dim=D)


def _kv(seed):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((L, NB * BS, H, D)).astype(np.float32)
    k += np.repeat(rng.uniform(-2, 2, (L, NB, H, D)), BS, axis=1).astype(np.float32)  # blocks far apart
    return k, rng.standard_normal((L, NB * BS, H, D)).astype(np.float32)


def _step(pool, kv, q):
    """Retrieve the top blocks for q and gather them: (blocks, scores, k, v)."""
    a = pool.agent_open("a")
    a.append(*kv)
    blocks, scores = a.retrieve(q, top_k=TOP_K).get()
    k, v = a.gather(blocks, 0)
    return blocks, scores, k, v


def _vulkan():
    try:
        return kvmem.Context("vulkan", 1)
    except kvmem.KvmemError as e:
        pytest.skip(f"backend vulkan: {e}")


def test_the_parameter_defaults_to_no_limit_and_a_cpu_context_holds_nothing():
    assert kvmem._lib.kvmem_pool_default_params().device_capacity_bytes == 0
    with kvmem.Context("cpu", 1) as ctx:
        pool = ctx.pool_create(SPEC, block_size=BS, device_capacity_bytes=1)
        q = np.ones((1, L, HQ, D), np.float32)
        _step(pool, _kv(1), q)
        assert pool.device_stats() == {"mirror_bytes": 0, "evictions": 0, "unmirrored": 0}


def test_at_the_capacity_the_host_copy_serves_with_the_same_results():
    kv = _kv(2)
    q = np.random.default_rng(3).standard_normal((1, L, HQ, D)).astype(np.float32)
    with kvmem.Context("cpu", 1) as cpu:
        ref = _step(cpu.pool_create(SPEC, block_size=BS), kv, q)
    with _vulkan() as ctx:
        # resident.h's layout at the exact size (no room to grow): f16 boxes,
        # f16 K and V for the sealed tokens plus a tail block's slots, the
        # slot map, the tail's f32 K/V rows, cos/sin rows (rotary_dim = D)
        nt = NB * BS + BS
        exact = 2 * NB * L * H * D * 2 + 2 * L * nt * H * D * 2 + nt * 4 + 2 * BS * H * D * 4 + (nt + 1) * D * 4
        for capacity, want_bytes in ((exact - 1, 0), (exact, exact), (0, None)):
            pool = ctx.pool_create(SPEC, block_size=BS, device_capacity_bytes=capacity)
            got = _step(pool, kv, q)
            np.testing.assert_array_equal(got[0], ref[0])
            np.testing.assert_allclose(got[1], ref[1], rtol=1e-4, atol=1e-7)
            np.testing.assert_allclose(got[2], ref[2], rtol=0, atol=1e-5 * np.abs(ref[2]).max())
            np.testing.assert_array_equal(got[3], ref[3])  # values are copies of the same rows
            st = pool.device_stats()
            if want_bytes is None:  # unlimited: room to grow, more than the exact size
                assert st["mirror_bytes"] > exact and st["unmirrored"] == 0
            else:
                assert st["mirror_bytes"] == want_bytes <= capacity
                assert (st["unmirrored"] > 0) == (want_bytes == 0)
            pool.close()
