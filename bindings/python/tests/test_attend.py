"""ART attention through the binding: tau = 0 is full attention (checked
against a float64 softmax here), agent and slot-map sources, stats, errors."""
from __future__ import annotations

import numpy as np
import pytest

import kvmem

pytestmark = pytest.mark.skipif(not kvmem.has_function("kvmem_attend"),
                                reason="this libkvmem has no kvmem_attend yet")

HQ, H, D = 4, 2, 8


def reference(q, k, v):
    """Causal-free full attention in float64: q [R][HQ][D], k, v [T][H][D]."""
    G = q.shape[1] // k.shape[1]
    out = np.zeros(q.shape)
    for r in range(q.shape[0]):
        for h in range(q.shape[1]):
            logits = k[:, h // G].astype(np.float64) @ q[r, h].astype(np.float64) / np.sqrt(D)
            p = np.exp(logits - logits.max())
            out[r, h] = (p / p.sum()) @ v[:, h // G].astype(np.float64)
    return out


def test_tensors_source_full_attention():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, HQ, D)).astype(np.float32)
    k = rng.standard_normal((40, H, D)).astype(np.float32)
    v = rng.standard_normal((40, H, D)).astype(np.float32)
    with kvmem.Context("cpu", 1) as ctx:
        out, stats = kvmem.attend(ctx, q, k=k, v=v, tau_s=0, tau_d=0, tile_size=8)
        np.testing.assert_allclose(out, reference(q, k, v), rtol=1e-4, atol=1e-5)
        assert stats["n_streams"] == H and stats["tiles_visited"] == stats["tiles_total"] == 2 * 5
        # a slot map that points logical positions at reversed physical rows gives the same
        # attention as the reordered tensors
        slots = list(range(39, -1, -1))
        out2, _ = kvmem.attend(ctx, q, k=k, v=v, slots=slots, dead_slot=-1, tau_s=0, tau_d=0, causal=0)
        np.testing.assert_allclose(out2, reference(q, k[::-1], v[::-1]), rtol=1e-4, atol=1e-5)
        with pytest.raises(kvmem.InvalidArgumentError) as ei:
            kvmem.attend(ctx, q, k=k, v=v, tile_size=5000)
        assert ei.value.message


def test_agent_source():
    rng = np.random.default_rng(1)
    spec = kvmem.ModelSpec(n_layers=2, n_q_heads=HQ, n_kv_heads=H, head_dim=D)
    with kvmem.Context("cpu", 1) as ctx, ctx.pool_create(spec, block_size=4, storage_dtype="f32") as pool, \
            pool.agent_open("a") as agent:
        k = rng.standard_normal((2, 12, H, D)).astype(np.float32)
        agent.append(k, k)
        q = rng.standard_normal((1, HQ, D)).astype(np.float32)
        out, stats = kvmem.attend(ctx, q, agent=agent, layer=1, tau_s=0, tau_d=0)
        assert out.shape == (1, HQ, D) and np.isfinite(out).all()
        assert stats["tiles_total"] == H * 3
        agent.close()
        with pytest.raises(kvmem.ClosedError):
            kvmem.attend(ctx, q, agent=agent)


def test_transfer_counters():
    """A "cpu" context moves nothing; on "vulkan" (skipped where unusable) an
    attention over caller K/V uploads them and reads back the output and one
    tile count per KV head; reset zeroes both counters."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, HQ, D)).astype(np.float32)
    k = rng.standard_normal((40, H, D)).astype(np.float32)
    v = rng.standard_normal((40, H, D)).astype(np.float32)
    with kvmem.Context("cpu", 1) as ctx:
        kvmem.attend(ctx, q, k=k, v=v, tau_s=0, tau_d=0, tile_size=8)
        assert ctx.transfer_stats() == (0, 0)
    try:
        dev = kvmem.Context("vulkan", 1)
    except kvmem.KvmemError as e:
        pytest.skip(f"skipped: vulkan: {e}")
    with dev:
        kvmem.attend(dev, q, k=k, v=v, tau_s=0, tau_d=0, tile_size=8)
        h2d, d2h = dev.transfer_stats()
        assert h2d >= q.nbytes + k.nbytes + v.nbytes
        assert d2h == q.nbytes + 4 * H
        dev.transfer_reset()
        assert dev.transfer_stats() == (0, 0)
