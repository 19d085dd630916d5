"""IntentKV through the binding: query memories, rule scores, keep-set
selection (rule, StreamingLLM, H2O, SnapKV), paged store and slot maps."""
from __future__ import annotations

import numpy as np
import pytest

import kvmem

pytestmark = pytest.mark.skipif(not kvmem.has_function("kvmem_qmem_store_create"),
                                reason="this libkvmem has no IntentKV functions yet")

L, HQ, H, D = 2, 4, 2, 8


def spec():
    return kvmem.ModelSpec(n_layers=L, n_q_heads=HQ, n_kv_heads=H, head_dim=D)


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_query_memory_and_rule_score():
    with kvmem.QmemStore(spec(), capacity=4, lambda_=0.5) as store:
        a1 = store.session_key(session_id="chat-1")
        a2 = store.session_key(session_id="chat-1")
        b = store.session_key(session_id="chat-2")
        assert (a1.hi, a1.lo, a1.kind) == (a2.hi, a2.lo, kvmem.SESSION_EXPLICIT)
        assert (a1.hi, a1.lo) != (b.hi, b.lo)
        p = store.session_key(token_ids=list(range(300)))
        assert p.kind == kvmem.SESSION_PREFIX
        q = rnd(6, L, HQ, D)
        mem = store.update(a1, q, 2, 5)
        assert mem.shape == (L, HQ, D)
        np.testing.assert_allclose(np.linalg.norm(mem, axis=-1), 1.0, rtol=1e-5)
        # the first turn's memory is the normalised mean of the span
        want = q[2:5].mean(axis=0)
        want /= np.linalg.norm(want, axis=-1, keepdims=True)
        np.testing.assert_allclose(mem, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(store.get(a1), mem)
        assert store.count == 1
        with pytest.raises(kvmem.NotFoundError):
            store.get(b)
        with pytest.raises(kvmem.InvalidArgumentError) as ei:
            store.update(b, q, 4, 4)   # empty span
        assert ei.value.message
        with kvmem.Context("cpu", 1) as ctx:
            k = rnd(L, 10, H, D, seed=1)
            s = kvmem.qmem_score(ctx, spec(), mem, k)
            assert s.shape == (10,)
            # a softmax over positions per (layer, query head), summed: total L * HQ
            assert abs(float(s.sum()) - L * HQ) < 1e-4


def test_keep_sets():
    scores = np.array([0.1, 0.9, 0.2, 0.8, 0.3, 0.05, 0.7, 0.6], np.float32)
    kept = kvmem.select_keep(scores, budget=5, protect=1, span=(6, 8))
    assert list(kept) == [0, 1, 3, 6, 7]   # forced 0, 6, 7, then the best two of the rest
    assert list(kvmem.streaming_keep(10, 2, 3)) == [0, 1, 7, 8, 9]
    acc = np.zeros(4, np.float32)
    kvmem.h2o_accumulate(np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]], np.float32), 2, 4, acc)
    np.testing.assert_allclose(acc, [0.5, 0.5, 0.5, 0.5])
    acc = np.array([5, 1, 4, 0.5, 0.2, 0.1], np.float32)
    assert list(kvmem.h2o_keep(acc, budget=4, recent=2)) == [0, 2, 4, 5]
    with pytest.raises(kvmem.InvalidArgumentError):
        kvmem.h2o_keep(acc, budget=1, recent=2)
    with kvmem.Context("cpu", 1) as ctx:
        s = kvmem.snapkv_score(ctx, spec(), rnd(3, L, HQ, D), rnd(L, 12, H, D, seed=2), pool_kernel=3)
        assert s.shape == (12,) and np.isfinite(s).all()
        with pytest.raises(kvmem.InvalidArgumentError):
            kvmem.snapkv_score(ctx, spec(), rnd(3, L, HQ, D), rnd(L, 12, H, D), pool_kernel=2)


def test_slot_maps_evict_compact_fork():
    store = kvmem.KVStore(spec(), page_slots=4)
    m = store.slotmap_create()
    k, v = rnd(L, 5, H, D, seed=3), rnd(L, 5, H, D, seed=4)
    m.append(k, v)
    assert m.get_info().length == 5
    child = m.fork(3)
    slots, dead = m.slots()
    assert dead == kvmem.DEAD_SLOT and len(slots) == 5 and kvmem.DEAD_SLOT not in list(slots)
    assert store.slot_refs(int(slots[0])) == 2   # shared with the fork
    freed = m.evict([0, 2, 4])
    assert freed == 1                             # slot 3 was only ours; slot 1 is held by the fork
    slots2, _ = m.slots()
    assert [int(slots2[i]) for i in (1, 3)] == [dead, dead]
    gk, gv, pos = m.gather()
    assert list(pos) == [0, 2, 4]
    np.testing.assert_array_equal(gk, k[:, [0, 2, 4]])
    np.testing.assert_array_equal(gv, v[:, [0, 2, 4]])
    rk, rv = store.read_slot(int(slots2[2]))
    np.testing.assert_array_equal(rk, k[:, 2])
    m.compact([0, 2, 4])
    assert m.get_info().length == 3
    with pytest.raises(kvmem.InvalidArgumentError) as ei:
        m.evict([2, 1])                           # not ascending
    assert ei.value.message
    info = store.get_info()
    assert info.dead_slot == kvmem.DEAD_SLOT and info.n_used >= 1
    store.close()                                 # closes both maps first
    assert m.closed and child.closed
    with pytest.raises(kvmem.ClosedError):
        m.get_info()


def test_qmem_head_load_errors():
    with pytest.raises(kvmem.KvmemError) as ei:
        kvmem.QmemHead("/nonexistent/head.safetensors")
    assert "/nonexistent/head.safetensors" in ei.value.message
    with pytest.raises(kvmem.KvmemError) as ei:
        kvmem.QmemHead(data=b"not a safetensors file")
    assert ei.value.status in (-10, -11, -1)
