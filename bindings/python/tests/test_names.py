"""Keyword arguments and spec fields are the C names; an unknown one is a
TypeError naming it, everywhere; info results are dataclasses that print
their fields."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import kvmem

SPEC = dict(n_layers=3, n_q_heads=4, n_kv_heads=2, head_dim=8)


@pytest.fixture
def world():
    with kvmem.Context("cpu") as ctx:
        pool = ctx.pool_create(SPEC, block_size=2, storage_dtype="f32")
        a = pool.agent_open("x")
        k = np.arange(3 * 3 * 2 * 8, dtype=np.float32).reshape(3, 3, 2, 8) / 100
        a.append(k, k)
        yield ctx, pool, a


def test_info_results_are_dataclasses_with_their_fields_in_the_repr(world):
    ctx, pool, a = world
    info = a.get_info()
    assert dataclasses.is_dataclass(info)
    assert repr(info) == "AgentInfo(n_tokens=3, n_blocks=2, n_sealed=1, bytes=%d, text_bytes=0)" % info.bytes
    assert a.block_info(0) == kvmem.BlockInfo(first_token=0, n_tokens=2, sealed=True)
    assert a.block_info(1).sealed is False
    p = pool.get_info()
    assert (p.n_agents, p.block_size, p.storage_dtype) == (1, 2, kvmem.F32)
    assert "PoolInfo(used_bytes=" in repr(p)
    assert dataclasses.asdict(p)["n_agents"] == 1
    spec = pool.get_spec()
    assert isinstance(spec, kvmem.ModelSpec) and "n_layers=3" in repr(spec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.n_tokens = 0  # a snapshot, not a live view


def test_segment_store_and_slot_map_infos_too(world):
    ctx, pool, a = world
    with pool.segments_create("robot") as segs:
        segs.add("arm", 0)
        assert segs.get_info() == kvmem.SegmentsInfo(step=0, n_segments=1, n_indices=1, n_groups=1, n_static=0,
                                                     n_events=segs.get_info().n_events)
        si = segs.segment_info(0)
        assert (si.alive, si.has_kv) == (True, False)
        assert repr(segs.group_info(0)).startswith("GroupInfo(state=")
    with kvmem.KVStore(SPEC) as store:
        assert "KVStoreInfo(n_slots=" in repr(store.get_info())
        m = store.slotmap_create()
        assert m.get_info() == kvmem.SlotMapInfo(length=0, n_live=0, protect=0, n_parked=0)
        key = kvmem.QmemStore(SPEC).session_key(session_id="user-1")
        assert repr(key).startswith("SessionKey(SESSION_EXPLICIT, ")


def test_a_spec_can_be_a_dict_and_an_unknown_field_is_named(world):
    ctx, pool, a = world
    assert pool.spec.n_layers == 3  # the dict built this pool
    for bad in ({**SPEC, "nLayers": 3}, {**SPEC, "n_layer": 3}):
        with pytest.raises(TypeError, match=repr(next(k for k in bad if k not in SPEC))):
            ctx.pool_create(bad)
    with pytest.raises(TypeError, match="model spec"):
        ctx.pool_create([3, 4, 2, 8])


def test_every_keyword_call_refuses_an_unknown_name(world):
    ctx, pool, a = world
    q = np.zeros((1, 3, 4, 8), np.float32)
    a.flush()
    calls = {
        "Pool": lambda: ctx.pool_create(SPEC, blockSize=4),
        "retrieve": lambda: a.retrieve(q, topK=1),
        "Segments": lambda: pool.segments_create("o", staticAfterSteps=2),
        "cluster_kmeans": lambda: kvmem.cluster_kmeans([1.0, 2.0], 2, 1, clusters=2),
        "multihop_select": lambda: kvmem.multihop_select([1.0], 1, [1.0], 1, rate=0.5),
        "load_plan": lambda: kvmem.load_plan([1.0], 1, [1], 1, [0], gbps=1),
        "QmemStore": lambda: kvmem.QmemStore(SPEC, cap=2),
        "KVStore": lambda: kvmem.KVStore(SPEC, pages=4),
        "attend": lambda: kvmem.attend(ctx, q[0, 0:1], agent=a, tauS=0.0),
        "append": lambda: a.append(np.zeros((3, 1, 2, 8), np.float32), np.zeros((3, 1, 2, 8), np.float32), tokenIds=[1]),
        "ModelSpec": lambda: kvmem.ModelSpec(headDim=8),
    }
    for what, call in calls.items():
        with pytest.raises(TypeError, match=r"unexpected keyword|unknown (parameter|field)") as ei:
            call()
        bad = str(ei.value)
        assert any(name in bad for name in ("blockSize", "topK", "staticAfterSteps", "clusters", "rate", "gbps",
                                            "cap", "pages", "tauS", "tokenIds", "headDim")), (what, bad)
    assert a.get_info().n_tokens == 3 and pool.get_info().n_agents == 1  # nothing happened
