"""Every integer a public call hands to C is refused when it does not fit its C
type, before C runs: ctypes used to wrap it modulo 2**bits, so top_k=2**32
returned nothing, block_size=2**32+4 made blocks of 4 and truncate(2**64)
emptied the agent. A non-integer (1.5, NaN, "x") is InvalidTypeError (a
TypeError), an integer out of range InvalidArgumentError (a ValueError), each
naming the argument and the range; the agent is left as it was.

The table covers every public method's integer parameters; a second test
walks the package's annotations so a new ``int`` parameter without a row fails."""
from __future__ import annotations

import dataclasses
import inspect
import json
import math
import struct
import typing

import numpy as np
import pytest

import kvmem
from kvmem import _ints

L, HQ, HKV, D, BS, T = 2, 4, 2, 8, 4, 8
SPEC = dict(n_layers=L, n_q_heads=HQ, n_kv_heads=HKV, head_dim=D)

I32 = (-(2**31), 2**31 - 1)
I64 = (-(2**63), 2**63 - 1)
U64 = (0, 2**64 - 1)
OUT = {I32: [2**31, 2**32, 2**32 + 4, -(2**31) - 1, 2**40, 2**64],
       I64: [2**63, 2**64, -(2**63) - 1, 2**64 + 1],
       U64: [-1, 2**64, -(2**63)]}
NOT_INTS = [1.5, math.nan, math.inf, "3", None]


def zero_head(d):
    """A residual head with zero weights (safetensors), as kvmem_qmem_head_load reads it."""
    f = 3 * d + 1
    shapes = [("alpha", [1]), ("w_q", [128, f]), ("w_k", [128, d]), ("w_v", [128, d]),
              ("mlp.0.weight", [256, f + 128]), ("mlp.0.bias", [256]), ("mlp.2.weight", [1, 256]), ("mlp.2.bias", [1])]
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes:
        n = 4 * math.prod(shape)
        hdr[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + bytes(off)


class World:
    """A context, a pool and an agent of T tokens (two sealed blocks), a
    retrieval, a segment store, a qmem store and a KV store with a slot map."""

    def __init__(self):
        self.ctx = kvmem.Context("cpu", 1)
        self.pool = self.ctx.pool_create(SPEC, block_size=BS, storage_dtype="f32")
        self.agent = self.pool.agent_open("alice")
        rng = np.random.default_rng(1)
        self.k = rng.standard_normal((L, T, HKV, D), dtype=np.float32)
        self.agent.append(self.k, -self.k, token_ids=list(range(T)), text="hello world")
        self.q = rng.standard_normal((2, L, HQ, D), dtype=np.float32)
        self.r = self.agent.retrieve(self.q, top_k=1)
        self.segs = self.pool.segments_create("owner")
        self.segs.add("s0", 0)
        self.qs = kvmem.QmemStore(SPEC)
        self.key = self.qs.session_key(session_id="s")
        self.kvs = kvmem.KVStore(SPEC)
        self.map = self.kvs.slotmap_create()
        self.map.append(self.k, -self.k)
        self.head = kvmem.QmemHead(data=zero_head(D))
        self.mem = self.qs.update(self.key, self.q, 0, 2)

    def state(self):
        info = self.agent.get_info()
        return (info.n_tokens, info.n_sealed, self.agent.tokens(), self.agent.text(),
                self.segs.get_info().n_segments, self.map.get_info().n_live)


# (name, range, call(world, value)) for every integer parameter
CASES = [
    ("Context(n_threads)", I32, lambda w, x: kvmem.Context("cpu", n_threads=x)),
    ("ModelSpec(n_layers)", I32, lambda w, x: kvmem.ModelSpec(n_layers=x)),
    ("ModelSpec(n_q_heads)", I32, lambda w, x: kvmem.ModelSpec(n_q_heads=x)),
    ("ModelSpec(n_kv_heads)", I32, lambda w, x: kvmem.ModelSpec(n_kv_heads=x)),
    ("ModelSpec(head_dim)", I32, lambda w, x: kvmem.ModelSpec(head_dim=x)),
    ("ModelSpec(rotary_dim)", I32, lambda w, x: kvmem.ModelSpec(rotary_dim=x)),
    ("ModelSpec(rope_style)", I32, lambda w, x: kvmem.ModelSpec(rope_style=x)),
    ("ModelSpec(rope_scaling)", I32, lambda w, x: kvmem.ModelSpec(rope_scaling=x)),
    ("ModelSpec(rope_original_max_pos)", I32, lambda w, x: kvmem.ModelSpec(rope_original_max_pos=x)),
    ("ModelSpec(layer_window)", I32, lambda w, x: kvmem.ModelSpec(n_layers=2, layer_window=[0, x])),
    ("Pool(block_size)", I32, lambda w, x: w.ctx.pool_create(SPEC, block_size=x)),
    ("Pool(storage_dtype)", I32, lambda w, x: w.ctx.pool_create(SPEC, storage_dtype=x)),
    ("Pool(capacity_bytes)", U64, lambda w, x: w.ctx.pool_create(SPEC, capacity_bytes=x)),
    ("Pool(max_agents)", I32, lambda w, x: w.ctx.pool_create(SPEC, max_agents=x)),
    ("Pool(max_tokens_per_agent)", I32, lambda w, x: w.ctx.pool_create(SPEC, max_tokens_per_agent=x)),
    ("Pool(host_budget_bytes)", U64, lambda w, x: w.ctx.pool_create(SPEC, host_budget_bytes=x)),
    ("Pool(device_capacity_bytes)", U64, lambda w, x: w.ctx.pool_create(SPEC, device_capacity_bytes=x)),
    ("Pool.agent_id(index)", I32, lambda w, x: w.pool.agent_id(x)),
    ("Agent.append(token_ids)", I32, lambda w, x: w.agent.append(w.k[:, :1], w.k[:, :1], token_ids=[x])),
    ("Agent.append(token_text_offsets)", I32,
     lambda w, x: w.agent.append(w.k[:, :1], w.k[:, :1], text="a", token_text_offsets=[x])),
    ("Agent.append(positions)", I32, lambda w, x: w.agent.append(w.k[:, :1], w.k[:, :1], positions=[x])),
    ("Agent.block_info(block)", I32, lambda w, x: w.agent.block_info(x)),
    ("Agent.block_aabb(block)", I32, lambda w, x: w.agent.block_aabb(x)),
    ("Agent.read(first)", I64, lambda w, x: w.agent.read(x, 1)),
    ("Agent.read(n)", I64, lambda w, x: w.agent.read(0, x)),
    ("Agent.tokens(first)", I64, lambda w, x: w.agent.tokens(x, 1)),
    ("Agent.tokens(n)", I64, lambda w, x: w.agent.tokens(0, x)),
    ("Agent.truncate(n_tokens)", I64, lambda w, x: w.agent.truncate(x)),
    ("Agent.retrieve(top_k)", I32, lambda w, x: w.agent.retrieve(w.q, top_k=x)),
    ("Agent.retrieve(mode)", I32, lambda w, x: w.agent.retrieve(w.q, mode=x)),
    ("Agent.retrieve(norm)", I32, lambda w, x: w.agent.retrieve(w.q, norm=x)),
    ("Agent.retrieve(agg)", I32, lambda w, x: w.agent.retrieve(w.q, agg=x)),
    ("Agent.retrieve(scope)", I32, lambda w, x: w.agent.retrieve(w.q, scope=x)),
    ("Agent.retrieve(recent_window)", I32, lambda w, x: w.agent.retrieve(w.q, recent_window=x)),
    ("Agent.retrieve(skip_recent)", I32, lambda w, x: w.agent.retrieve(w.q, skip_recent=x)),
    ("Agent.retrieve(exclude)", I32, lambda w, x: w.agent.retrieve(w.q, exclude=[x])),
    ("Agent.retrieve(always_include)", I32, lambda w, x: w.agent.retrieve(w.q, always_include=[x])),
    ("Agent.gather(blocks)", I32, lambda w, x: w.agent.gather([x])),
    ("Agent.gather(base_position)", I64, lambda w, x: w.agent.gather([0], x)),
    ("Retrieval.get(set)", I32, lambda w, x: w.r.get(x)),
    ("Retrieval.block_scores(set)", I32, lambda w, x: w.r.block_scores(x)),
    ("Retrieval.n_tokens(set)", I32, lambda w, x: w.r.n_tokens(x)),
    ("Retrieval.blocks_view(set)", I32, lambda w, x: w.r.blocks_view(x)),
    ("Segments(static_after_steps)", I32, lambda w, x: w.pool.segments_create("o2", static_after_steps=x)),
    ("Segments(max_segments)", I32, lambda w, x: w.pool.segments_create("o2", max_segments=x)),
    ("Segments.add(group)", I32, lambda w, x: w.segs.add("s1", x)),
    ("Segments.update(index)", I32, lambda w, x: w.segs.update(x)),
    ("Segments.remove(index)", I32, lambda w, x: w.segs.remove(x)),
    ("Segments.assign(index)", I32, lambda w, x: w.segs.assign(x, 0)),
    ("Segments.assign(group)", I32, lambda w, x: w.segs.assign(0, x)),
    ("Segments.drain_events(max_events)", I64, lambda w, x: w.segs.drain_events(x)),
    ("Segments.segment_info(index)", I32, lambda w, x: w.segs.segment_info(x)),
    ("Segments.group_info(group)", I32, lambda w, x: w.segs.group_info(x)),
    ("Segments.name(index)", I32, lambda w, x: w.segs.name(x)),
    ("Segments.group_members(group)", I32, lambda w, x: w.segs.group_members(x)),
    ("Segments.plan(max_units)", I32, lambda w, x: w.segs.plan(None, x)),
    ("Segments.store_segment(index)", I32, lambda w, x: w.segs.store_segment(x, w.k, w.k)),
    ("Segments.store_group(group)", I32, lambda w, x: w.segs.store_group(x, w.k, w.k)),
    ("cluster_kmeans(n)", U64, lambda w, x: kvmem.cluster_kmeans(np.zeros(8, np.float32), x, 2, k=2)),
    ("cluster_kmeans(dim)", U64, lambda w, x: kvmem.cluster_kmeans(np.zeros(8, np.float32), 4, x, k=2)),
    ("cluster_kmeans(k)", I32, lambda w, x: kvmem.cluster_kmeans(np.zeros(8, np.float32), 4, 2, k=x)),
    ("cluster_kmeans(max_iters)", I32, lambda w, x: kvmem.cluster_kmeans(np.zeros(8, np.float32), 4, 2, max_iters=x)),
    ("cluster_kmeans(seed)", U64, lambda w, x: kvmem.cluster_kmeans(np.zeros(8, np.float32), 4, 2, seed=x)),
    ("multihop_select(n_query)", I32,
     lambda w, x: kvmem.multihop_select(np.zeros(4, np.float32), x, np.zeros(4, np.float32), 2)),
    ("multihop_select(n_segments)", I32,
     lambda w, x: kvmem.multihop_select(np.zeros(4, np.float32), 2, np.zeros(4, np.float32), x)),
    ("multihop_select(max_iters)", I32,
     lambda w, x: kvmem.multihop_select(np.zeros(4, np.float32), 2, np.zeros(4, np.float32), 2, max_iters=x)),
    ("multihop_select(candidates)", (0, 255),
     lambda w, x: kvmem.multihop_select(np.zeros(4, np.float32), 2, np.zeros(4, np.float32), 2, [1, x])),
    ("multihop_schedule(n_layers)", I32, lambda w, x: kvmem.multihop_schedule(x, 0.5)),
    ("load_plan(n_layers)", I32, lambda w, x: kvmem.load_plan([1.0], x, [1], 1, [1])),
    ("load_plan(n_segments)", I32, lambda w, x: kvmem.load_plan([1.0], 1, [1], x, [1])),
    ("load_plan(load_bytes)", U64, lambda w, x: kvmem.load_plan([1.0], 1, [x], 1, [1])),
    ("load_plan(recompute)", (0, 255), lambda w, x: kvmem.load_plan([1.0], 1, [1], 1, [x])),
    ("load_plan(max_ahead)", I32, lambda w, x: kvmem.load_plan([1.0], 1, [1], 1, [1], max_ahead=x)),
    ("batch_merge(layer)", I32, lambda w, x: kvmem.batch_merge([w.agent], x)),
    ("batch_merge(max_len)", I64, lambda w, x: kvmem.batch_merge([w.agent], 0, x)),
    ("batch_extract(row)", I32, lambda w, x: kvmem.batch_extract(np.zeros((1, HKV, T, D), np.float32), x, T, 0, 1)),
    ("batch_extract(length)", I64, lambda w, x: kvmem.batch_extract(np.zeros((1, HKV, T, D), np.float32), 0, x, 0, 1)),
    ("batch_extract(first)", I64, lambda w, x: kvmem.batch_extract(np.zeros((1, HKV, T, D), np.float32), 0, T, x, 1)),
    ("batch_extract(n)", I64, lambda w, x: kvmem.batch_extract(np.zeros((1, HKV, T, D), np.float32), 0, T, 0, x)),
    ("rope_apply(positions)", I32, lambda w, x: kvmem.rope_apply(SPEC, np.zeros((1, D), np.float32), [x])),
    ("QmemStore(capacity)", I32, lambda w, x: kvmem.QmemStore(SPEC, capacity=x)),
    ("QmemStore(prefix_tokens)", I32, lambda w, x: kvmem.QmemStore(SPEC, prefix_tokens=x)),
    ("QmemStore.session_key(token_ids)", I32, lambda w, x: w.qs.session_key(token_ids=[1, x])),
    ("QmemStore.session_key(mark)", I64, lambda w, x: w.qs.session_key(token_ids=[1, 2], mark=(0, x))),
    ("QmemStore.update(span_begin)", I64,
     lambda w, x: w.qs.update(w.key, w.q, x, 1)),
    ("QmemStore.update(span_end)", I64, lambda w, x: w.qs.update(w.key, w.q, 0, x)),
    ("QmemHead.apply(span_begin)", I64,
     lambda w, x: w.head.apply(SPEC, w.mem, w.k, np.zeros(T, np.float32), x, 1)),
    ("QmemHead.apply(span_end)", I64,
     lambda w, x: w.head.apply(SPEC, w.mem, w.k, np.zeros(T, np.float32), 0, x)),
    ("select_keep(budget)", I64, lambda w, x: kvmem.select_keep(np.ones(4, np.float32), x)),
    ("select_keep(protect)", I64, lambda w, x: kvmem.select_keep(np.ones(4, np.float32), 2, x)),
    ("select_keep(span)", I64, lambda w, x: kvmem.select_keep(np.ones(4, np.float32), 2, 0, (0, x))),
    ("streaming_keep(n)", I32, lambda w, x: kvmem.streaming_keep(x, 1, 1)),
    ("streaming_keep(n_sink)", I64, lambda w, x: kvmem.streaming_keep(4, x, 1)),
    ("streaming_keep(window)", I64, lambda w, x: kvmem.streaming_keep(4, 1, x)),
    ("h2o_accumulate(n_rows)", I64,
     lambda w, x: kvmem.h2o_accumulate(np.zeros(4, np.float32), x, 2, np.zeros(2, np.float32))),
    ("h2o_accumulate(n)", I64,
     lambda w, x: kvmem.h2o_accumulate(np.zeros(4, np.float32), 2, x, np.zeros(2, np.float32))),
    ("h2o_keep(budget)", I64, lambda w, x: kvmem.h2o_keep(np.ones(4, np.float32), x, 1)),
    ("h2o_keep(recent)", I64, lambda w, x: kvmem.h2o_keep(np.ones(4, np.float32), 2, x)),
    ("snapkv_score(pool_kernel)", I32, lambda w, x: kvmem.snapkv_score(w.ctx, SPEC, w.q, w.k, x)),
    ("arrange(blocks)", I32, lambda w, x: kvmem.arrange([1, x], [0.5, 0.25])),
    ("window_split(window)", I32, lambda w, x: kvmem.window_split(x, 0, 0.5, 0.25, 4)),
    ("window_split(reserve)", I32, lambda w, x: kvmem.window_split(64, x, 0.5, 0.25, 4)),
    ("window_split(block_size)", I32, lambda w, x: kvmem.window_split(64, 0, 0.5, 0.25, x)),
    ("KVStore(page_slots)", I32, lambda w, x: kvmem.KVStore(SPEC, page_slots=x)),
    ("KVStore(max_slots)", I64, lambda w, x: kvmem.KVStore(SPEC, max_slots=x)),
    ("KVStore.slot_refs(slot)", I32, lambda w, x: w.kvs.slot_refs(x)),
    ("KVStore.read_slot(slot)", I32, lambda w, x: w.kvs.read_slot(x)),
    ("SlotMap.fork(prefix_len)", I64, lambda w, x: w.map.fork(x)),
    ("SlotMap.set_protected(protect)", I64, lambda w, x: w.map.set_protected(x)),
    ("SlotMap.evict(kept)", I32, lambda w, x: w.map.evict([0, x])),
    ("SlotMap.compact(kept)", I32, lambda w, x: w.map.compact([0, x])),
    ("attend(layer)", I32, lambda w, x: kvmem.attend(w.ctx, w.q[0, 0], agent=w.agent, layer=x)),
    ("attend(base_position)", I64, lambda w, x: kvmem.attend(w.ctx, w.q[0, 0], agent=w.agent, base_position=x)),
    ("attend(positions)", I32,
     lambda w, x: kvmem.attend(w.ctx, w.q[0, 0], agent=w.agent, positions=[x] + [0] * (T - 1))),
    ("attend(slots)", I32,
     lambda w, x: kvmem.attend(w.ctx, w.q[0, :1], k=w.k[0], v=w.k[0], slots=[0, x])),
    ("attend(dead_slot)", I32,
     lambda w, x: kvmem.attend(w.ctx, w.q[0, :1], k=w.k[0], v=w.k[0], slots=[0, 1], dead_slot=x)),
    ("attend(tile_order)", I32, lambda w, x: kvmem.attend(w.ctx, w.q[0, 0], agent=w.agent, tile_order=[x])),
    ("attend(n_sink)", I32, lambda w, x: kvmem.attend(w.ctx, w.q[0, 0], agent=w.agent, n_sink=x)),
    ("attend(tile_size)", I32, lambda w, x: kvmem.attend(w.ctx, w.q[0, 0], agent=w.agent, tile_size=x)),
    ("attend(patience)", I32, lambda w, x: kvmem.attend(w.ctx, w.q[0, 0], agent=w.agent, patience=x)),
    ("attend(order)", I32, lambda w, x: kvmem.attend(w.ctx, w.q[0, 0], agent=w.agent, order=x)),
    ("attend(probe)", I32, lambda w, x: kvmem.attend(w.ctx, w.q[0, 0], agent=w.agent, probe=x)),
    ("attend(causal)", I32, lambda w, x: kvmem.attend(w.ctx, w.q[0, 0], agent=w.agent, causal=x)),
    ("attend(compare)", I32, lambda w, x: kvmem.attend(w.ctx, w.q[0, 0], agent=w.agent, compare=x)),
    ("DeviceTensor(handle)", U64, lambda w, x: kvmem.DeviceTensor("cuda", x, 64, "f32", [4])),
    ("DeviceTensor(size)", U64, lambda w, x: kvmem.DeviceTensor("cuda", 1, x, "f32", [4])),
    ("DeviceTensor(shape)", I64, lambda w, x: kvmem.DeviceTensor("cuda", 1, 64, "f32", [x])),
    ("DeviceTensor(strides)", I64, lambda w, x: kvmem.DeviceTensor("cuda", 1, 64, "f32", [4], strides=[x])),
    ("DeviceTensor(offset)", U64, lambda w, x: kvmem.DeviceTensor("cuda", 1, 64, "f32", [4], offset=x)),
    ("DeviceTensor(device)", I32, lambda w, x: kvmem.DeviceTensor("cuda", 1, 64, "f32", [4], device=x)),
    ("DeviceTensor(stream)", U64, lambda w, x: kvmem.DeviceTensor("cuda", 1, 64, "f32", [4], stream=x)),
    ("status_str(status)", I32, lambda w, x: kvmem.status_str(x)),
    ("dtype_name(dtype)", I32, lambda w, x: kvmem.dtype_name(x)),
]


def _arg(name):
    return name[name.index("(") + 1:-1]


@pytest.fixture
def world():
    w = World()
    yield w
    w.head.close()
    w.kvs.close()
    w.qs.close()
    w.ctx.close()


@pytest.mark.parametrize("name,rng,call", CASES, ids=[c[0] for c in CASES])
def test_an_integer_out_of_its_c_range_is_refused_naming_it(world, name, rng, call):
    before = world.state()
    for x in OUT.get(rng, [rng[0] - 1, rng[1] + 1, 2**64]):
        with pytest.raises(ValueError) as ei:
            call(world, x)
        e = ei.value
        assert isinstance(e, kvmem.InvalidArgumentError) and isinstance(e, kvmem.KvmemError), repr(e)
        assert _arg(name) in str(e) and str(x) in str(e), str(e)
        assert f"[{rng[0]}, {rng[1]}]" in str(e), str(e)
    assert world.state() == before


# keyword options whose None keeps the library's default
NONE_IS_DEFAULT = {c[0] for c in CASES if c[0].startswith((
    "ModelSpec(", "Pool(", "Segments(", "QmemStore(", "KVStore(")) and "layer_window" not in c[0]} | {
    f"Agent.retrieve({p})" for p in ("top_k", "mode", "norm", "agg", "scope", "recent_window", "skip_recent")} | {
    f"attend({p})" for p in ("n_sink", "tile_size", "patience", "order", "probe", "causal", "compare")} | {
    "cluster_kmeans(k)", "cluster_kmeans(max_iters)", "cluster_kmeans(seed)", "multihop_select(max_iters)",
    "load_plan(max_ahead)", "DeviceTensor(stream)"}


@pytest.mark.parametrize("name,rng,call", CASES, ids=[c[0] for c in CASES])
def test_a_non_integer_is_refused_naming_it(world, name, rng, call):
    before = world.state()
    for x in NOT_INTS:
        if x is None and (name.startswith(("Agent.read(n)", "Agent.tokens(n)", "batch_merge(max_len)",
                                           "Segments.drain_events")) or name in NONE_IS_DEFAULT):
            continue  # None there means "to the end" / "the longest agent" / "all" / "the default"
        if x == "3" and name == "Pool(storage_dtype)":
            continue  # a str names the dtype ("f16"): an unknown name is InvalidArgumentError
        with pytest.raises(TypeError) as ei:
            call(world, x)
        e = ei.value
        assert isinstance(e, kvmem.InvalidTypeError) and isinstance(e, kvmem.KvmemError), repr(e)
        assert _arg(name) in str(e) and "integer" in str(e), str(e)
    assert world.state() == before


def test_the_reported_wraps_are_refused(world):
    """The exact calls that used to succeed with a wrapped value."""
    a = world.agent
    with pytest.raises(kvmem.InvalidArgumentError, match=r"top_k = 4294967296 is outside the range of int32"):
        a.retrieve(world.q, top_k=2**32)
    with pytest.raises(kvmem.InvalidArgumentError, match=r"block_size = 4294967300"):
        world.ctx.pool_create(SPEC, block_size=2**32 + 4)
    with pytest.raises(kvmem.InvalidArgumentError, match=r"n_tokens = 18446744073709551616 .*int64"):
        a.truncate(2**64)
    assert a.get_info().n_tokens == T
    with pytest.raises(kvmem.InvalidArgumentError, match=r"block = 4294967296"):
        a.block_info(2**32)
    with pytest.raises(kvmem.InvalidArgumentError, match=r"blocks\[0\] = 4294967297"):
        a.gather([2**32 + 1])
    with pytest.raises(kvmem.InvalidArgumentError, match=r"head_dim = 4294967304"):
        world.ctx.pool_create(dict(SPEC, head_dim=2**32 + 8))
    with pytest.raises(kvmem.InvalidArgumentError, match=r"n_threads = 4294967297"):
        kvmem.Context("cpu", 2**32 + 1)
    # in range, these still work (numpy integers and bools are integers)
    assert a.block_info(np.int64(1)).first_token == BS
    assert list(a.retrieve(world.q, top_k=np.int32(1)).get()[0]) == list(world.r.get()[0])
    assert a.tokens(True, 1) == [1]


def test_sizes_are_checked_before_an_output_is_allocated(world):
    """tokens/read of 2**40 tokens used to ask numpy/ctypes for terabytes first."""
    a = world.agent
    for call in (lambda: a.tokens(0, 2**40), lambda: a.read(0, 2**40), lambda: a.read(2**40),
                 lambda: a.tokens(-1, 2), lambda: a.tokens(0, -1)):
        with pytest.raises(kvmem.InvalidArgumentError, match=r"outside \[0, 8\)"):
            call()
    with pytest.raises(kvmem.InvalidArgumentError, match="must not be negative"):
        kvmem.batch_extract(np.zeros((1, HKV, T, D), np.float32), 0, T, 0, -1)


def _int_params(fn):
    """Names of fn's parameters annotated as integers (int, Optional[int], sequences of int)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # pragma: no cover - a hint that does not resolve is a failure below
        raise
    out = []
    for name, h in hints.items():
        if name == "return":
            continue
        text = str(h)
        if "Callable" in text:
            continue
        if h is int or "[int" in text or "int]" in text or ", int" in text:
            out.append(name)
    return out


def _public_callables():
    for name in kvmem.__all__:
        obj = getattr(kvmem, name)
        if inspect.isclass(obj) and obj.__module__.startswith("kvmem"):
            if issubclass(obj, BaseException) or dataclasses.is_dataclass(obj):
                continue  # results, not calls
            yield name, obj.__init__
            for mname, m in inspect.getmembers(obj, inspect.isfunction):
                if not mname.startswith("_"):
                    yield f"{name}.{mname}", m
        elif inspect.isfunction(obj) and obj.__module__.startswith("kvmem"):
            yield name, obj


def test_every_integer_parameter_of_the_public_api_has_a_row():
    covered = {(c[0][:c[0].index("(")], _arg(c[0])) for c in CASES}
    covered |= {(c[0][:c[0].index("(")] + ".__init__", _arg(c[0])) for c in CASES}
    # parameters whose integers never reach C as such (or reach it checked elsewhere)
    exempt = {("SlotMap", "handle")}  # made by KVStore.slotmap_create, not by users
    # the same parameters reached another way: Context.pool_create is Pool(), Pool.segments_create is Segments()
    alias = {"Context.pool_create": "Pool", "Pool.segments_create": "Segments"}
    missing = []
    for name, fn in _public_callables():
        for p in _int_params(fn):
            if p == "dtype":
                continue  # an element type: F32/F16/BF16 or a name, checked by membership
            key = (name, p)
            init = (alias.get(name, name.replace(".__init__", "")), p)
            if key not in covered and init not in covered and key not in exempt:
                missing.append(f"{name}({p})")
    assert not missing, f"integer parameters without a row in CASES: {missing}"


def test_checks_are_exact_at_the_edges():
    assert _ints.check(2**31 - 1, "x", _ints.ctypes.c_int32) == 2**31 - 1
    assert _ints.check(-(2**31), "x", _ints.ctypes.c_int32) == -(2**31)
    assert _ints.check(2**64 - 1, "x", _ints.ctypes.c_uint64) == 2**64 - 1
    with pytest.raises(kvmem.InvalidArgumentError):
        _ints.check(2**31, "x", _ints.ctypes.c_int32)
    with pytest.raises(kvmem.InvalidArgumentError):
        _ints.check(-1, "x", _ints.ctypes.c_size_t)
