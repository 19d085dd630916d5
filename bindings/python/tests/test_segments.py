"""KEEP segments through the binding: store lifecycle, events, KV hand-over,
plan, k-means, multi-hop selection and schedule, load plan, errors."""
from __future__ import annotations

import numpy as np
import pytest

import kvmem

L, H, D = 2, 2, 8


@pytest.fixture
def pool():
    with kvmem.Context("cpu", 1) as ctx, ctx.pool_create(
            kvmem.ModelSpec(n_layers=L, n_q_heads=4, n_kv_heads=H, head_dim=D), block_size=4) as p:
        yield p


def test_segment_store_lifecycle(pool):
    segs = pool.segments_create("robot", static_after_steps=2)
    a, b = segs.add("cup", 0), segs.add("table", 0)
    assert (a, b) == (0, 1)
    assert segs.find("table") == 1 and segs.name(0) == "cup"
    assert segs.group_members(0) == [0, 1]
    ev = segs.drain_events()
    assert [(e["kind"], e["segment"]) for e in ev] == [(kvmem.SEG_EVENT_SEGMENT_STALE, 0),
                                                       (kvmem.SEG_EVENT_SEGMENT_STALE, 1)]
    k = np.full((L, 3, H, D), 0.5, np.float32)
    segs.store_segment(a, k, k, token_ids=[1, 2, 3])
    assert segs.segment_info(a).has_kv == 1 and segs.segment_info(a).n_tokens == 3
    for _ in range(2):
        segs.step()
    assert segs.group_info(0).state == kvmem.GROUP_STATIC
    ev = segs.drain_events()
    assert [e["kind"] for e in ev] == [kvmem.SEG_EVENT_GROUP_STATIC]
    segs.store_group(0, np.zeros((L, 5, H, D), np.float32), np.zeros((L, 5, H, D), np.float32))
    units = segs.plan([1.0, 2.0])
    assert len(units) == 1 and units[0]["kind"] == kvmem.SEG_UNIT_GROUP and units[0]["n_tokens"] == 5
    assert units[0]["agent_id"].startswith("robot.kvseg-g0")
    assert units[0]["agent_id"] in pool.agent_ids()
    segs.update(b)   # the group turns dynamic again
    assert segs.group_info(0).state == kvmem.GROUP_DYNAMIC
    units = segs.plan(np.array([1.0, 2.0], np.float32), max_units=1)
    assert [(u["segment"], u["needs_compute"]) for u in units] == [(1, 1)]
    info = segs.get_info()
    assert (info.n_segments, info.n_groups) == (2, 1)

    with pytest.raises(kvmem.ExistsError) as ei:
        segs.add("cup", 3)
    assert "cup" in ei.value.message
    with pytest.raises(kvmem.NotFoundError):
        segs.update(99)
    with pytest.raises(kvmem.InvalidArgumentError):
        segs.plan([1.0])            # one score per segment index
    with pytest.raises(kvmem.ExistsError):
        pool.segments_create("robot")   # its reserved agents exist
    segs.close()
    segs.close()
    assert not any(i.startswith("robot.kvseg-") for i in pool.agent_ids())
    with pytest.raises(kvmem.ClosedError):
        segs.step()


def test_pool_close_frees_its_segment_stores():
    ctx = kvmem.Context("cpu", 1)
    pool = ctx.pool_create(kvmem.ModelSpec(n_layers=1, n_q_heads=1, n_kv_heads=1, head_dim=4))
    segs = pool.segments_create("o")
    segs.add("x", 1)
    ctx.close()
    assert segs.closed and pool.closed


def test_kmeans_finds_obvious_clusters():
    emb = np.array([[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [0, 0.95, 0.05], [0, 0, 1], [0.05, 0, 1]], np.float32)
    labels, cents, iters = kvmem.cluster_kmeans(emb, 6, 3, k=3, seed=7)
    assert labels[0] == labels[1] and labels[2] == labels[3] and labels[4] == labels[5]
    assert len({int(x) for x in labels}) == 3
    assert np.allclose(np.linalg.norm(cents.reshape(3, 3), axis=1), 1, atol=1e-5)
    assert iters >= 1
    with pytest.raises(kvmem.InvalidArgumentError) as ei:
        kvmem.cluster_kmeans(np.zeros((2, 3), np.float32), 2, 3, k=1)
    assert ei.value.message
    with pytest.raises(TypeError, match="float"):
        kvmem.cluster_kmeans(np.zeros((2, 3)), 2, 3, k=1)   # float64


def test_multihop_select_and_schedule():
    # 4 segments; the query looks at segment 2, which attends to segment 0
    q2s = [[0, 0, 1, 0]]
    s2s = [[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]]
    sel, imp, res = kvmem.multihop_select(q2s, 1, s2s, 4, ratio=0.25, max_iters=0)
    assert list(sel) == [0, 0, 1, 0] and res["n_selected"] == 1
    sel, imp, res = kvmem.multihop_select(q2s, 1, s2s, 4, ratio=0.5)
    assert list(sel) == [1, 0, 1, 0]
    r = kvmem.multihop_schedule(8, 0.5)
    assert r[0] == 1 and abs(float(np.mean(r)) - 0.5) < 1e-6 and all(r[i] >= r[i + 1] for i in range(7))
    with pytest.raises(kvmem.InvalidArgumentError):
        kvmem.multihop_schedule(8, 0.01)


def test_load_plan():
    items, starts, stats = kvmem.load_plan([1.0, 1.0], 2, [1_000_000, 2_000_000], 2, [0, 0, 0, 0],
                                           bandwidth_gbps=1.0)
    assert len(items) == 4 and stats["n_loads"] == 4
    assert {(i["segment"], i["layer"]) for i in items} == {(0, 0), (1, 0), (0, 1), (1, 1)}
    assert stats["balanced_makespan_ms"] <= stats["naive_makespan_ms"] + 1e-9
    assert starts[0] >= 3.0 - 1e-9   # layer 0 waits for 3 MB at 1 GB/s
    with pytest.raises(kvmem.InvalidArgumentError):
        kvmem.load_plan([1.0, 1.0], 2, [1, 1], 2, [0, 0, 1, 1])   # recompute sets must shrink
