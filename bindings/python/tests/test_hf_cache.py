"""kvmem.hf.KvmemCache drives an HF-shaped Llama's generate loop (tests/hf_llama.py:
transformers' attention, masks and positions, the loop generate() runs): at full
budget to exactly the tokens of the model's own cache, and at a budget to the
memory a direct kvmem_retrieve + kvmem_gather sequence gives (the same blocks,
the same K/V bits fed to the attention); head-major bf16/f16 caches over
histories of thousands of tokens; the rest of the Cache protocol (lengths,
layers, legacy tuples, beams, crop) and its refusals."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="skipped: torch not installed (apt-get install python3-torch)")

import kvmem  # noqa: E402
import kvmem.torch as kt  # noqa: E402
from kvmem.hf import KvmemCache  # noqa: E402
from hf_llama import Config, HFLlama, PlainCache, greedy_generate  # noqa: E402

L, HQ, HKV, D = 2, 4, 2, 16


def make_pool(ctx, block_size=4, storage="f32"):
    spec = kvmem.ModelSpec(n_layers=L, n_q_heads=HQ, n_kv_heads=HKV, head_dim=D)
    return ctx.pool_create(spec, block_size=block_size, storage_dtype=storage)


@pytest.fixture
def ctx():
    with kvmem.Context("cpu", 1) as c:
        yield c


@pytest.fixture
def pool(ctx):
    with make_pool(ctx) as p:
        yield p


def ids(n, seed):
    return torch.randint(0, 64, (1, n), generator=torch.Generator().manual_seed(seed))


def rope_ref(x, pos, theta=10000.0):
    """NEOX RoPE as complex rotation in float64: (x_i + j x_{i+D/2}) e^{j p theta^(-2i/D)}, [..., T, D]."""
    x = x.double()
    half = x.shape[-1] // 2
    ang = torch.tensor(list(pos), dtype=torch.float64)[:, None] * theta ** (
        -2.0 * torch.arange(half, dtype=torch.float64) / x.shape[-1])
    z = torch.complex(x[..., :half], x[..., half:]) * torch.polar(torch.ones_like(ang), ang)
    return torch.cat([z.real, z.imag], dim=-1)


# ---- full budget: the model's own tokens -----------------------------------------------------------

@pytest.mark.parametrize("budget", [None, 10_000])
def test_full_budget_generates_exactly_the_tokens_of_the_models_own_cache(pool, budget):
    m = HFLlama()
    with pool.agent_open("full") as agent:
        cache = KvmemCache(agent, budget, window=8, model=m)
        plain = PlainCache()
        conv = ids(9, 1)
        for turn in range(4):
            inp = cache.begin_turn(conv[:, cache.n_tokens:])
            assert torch.equal(inp, conv)  # the context is the whole session: its own ids
            got, got_logits = greedy_generate(m, inp, cache, 6)
            want, want_logits = greedy_generate(m, conv, plain, 6)
            assert torch.equal(got, want)
            torch.testing.assert_close(got_logits, want_logits, atol=1e-5, rtol=0)
            assert cache.get_seq_length() == plain.get_seq_length() == got.shape[1] - 1
            conv = torch.cat([want, ids(5 + turn, 10 + turn)], dim=1)
        # every token ran through the model is in the agent, with its id, and its values exactly
        n = cache.n_tokens
        assert n == plain.get_seq_length() and agent.tokens() == conv[0, :n].tolist()
        np.testing.assert_array_equal(agent.read()[1], np.stack([v[0].permute(1, 0, 2).numpy()
                                                                 for v in plain.value_cache]))
        # the keys de-rotated from the positions the model used: its own keys at those positions again
        rk = torch.from_numpy(agent.read()[0]).permute(0, 2, 1, 3)  # [L, heads, n, dim]
        for i in range(L):
            torch.testing.assert_close(rope_ref(rk[i, :, :40], range(40)).float(),
                                       plain.key_cache[i][0, :, :40], atol=2e-5, rtol=0)


def test_a_reopened_session_is_gathered_whole_and_gives_the_same_tokens(pool):
    m = HFLlama()
    with pool.agent_open("reopen") as agent:
        first = KvmemCache(agent, model=m)
        plain = PlainCache()
        conv = ids(23, 2)
        greedy_generate(m, first.begin_turn(conv), first, 4)
        seq, _ = greedy_generate(m, conv, plain, 4)
        first.close()
        # a new cache over the agent (a new process, an agent loaded from its file): its first
        # turn gathers every block at its own position and reads the tail
        again = KvmemCache(agent, model=m)
        new = ids(6, 3)
        inp = again.begin_turn(torch.cat([seq[:, agent.get_info().n_tokens:], new], dim=1))
        conv = torch.cat([seq, new], dim=1)
        assert torch.equal(inp, conv) and again.blocks == list(range(agent.get_info().n_sealed))
        for (gk, gv), pk, pv in zip(again, plain.key_cache, plain.value_cache):
            torch.testing.assert_close(gk, pk, atol=3e-5, rtol=0)  # de-rotated, stored, re-rotated
            assert torch.equal(gv, pv)
        got, got_logits = greedy_generate(m, inp, again, 8)
        want, want_logits = greedy_generate(m, conv, plain, 8)
        assert torch.equal(got, want)
        torch.testing.assert_close(got_logits, want_logits, atol=1e-4, rtol=0)


# ---- at a budget: the memory of a direct retrieve + gather ---------------------------------------

def by_hand_context(agent, blocks, live_first, base=0):
    """kvmem_gather of blocks + the live sealed blocks at base.., then the unsealed
    tail read raw and rotated at the next positions (kvmem_rope_apply): [L] x (k, v)."""
    info = agent.get_info()
    seq = list(blocks) + list(range(live_first, info.n_sealed))
    parts = [kt.gather(agent, seq, base)] if seq else []
    m = sum(agent.block_info(b).n_tokens for b in seq)
    tail_first = info.n_sealed * agent.pool.get_info().block_size
    n_tail = info.n_tokens - tail_first
    if n_tail:
        k, v = agent.read(tail_first, n_tail)
        pos = np.repeat(np.arange(base + m, base + m + n_tail, dtype=np.int32), HKV)
        for i in range(L):
            kvmem.rope_apply(agent.pool.spec, k[i].reshape(-1, D), pos)
        parts.append(tuple((torch.from_numpy(k[i]).permute(1, 0, 2)[None], torch.from_numpy(v[i]).permute(1, 0, 2)[None])
                           for i in range(L)))
    if not parts:
        return [(torch.zeros(1, HKV, 0, D), torch.zeros(1, HKV, 0, D))] * L
    return [(torch.cat([p[i][0] for p in parts], 2), torch.cat([p[i][1] for p in parts], 2)) for i in range(L)]


def by_hand_turn(m, agent, new_ids, budget, window, dtype=torch.float32):
    """What the cache should do at a turn, with the C API directly: the live window's
    first block (plain arithmetic: blocks of bs, no flushes), the probe pass over the
    live window with a plain cache, kvmem_retrieve, the context of kvmem_gather."""
    info = agent.get_info()
    bs = agent.pool.get_info().block_size
    live_first = min(info.n_sealed, max(0, info.n_tokens - window) // bs)
    if live_first * bs <= budget:
        return list(range(live_first)), by_hand_context(agent, range(live_first), live_first)
    probe = PlainCache()
    for i, (k, v) in enumerate(by_hand_context(agent, [], live_first)):
        probe.update(k.to(dtype), v.to(dtype), i)
    with kt.QueryCapture(m) as cap:
        m(new_ids, past_key_values=probe)
    hits = kt.retrieve(agent, cap, top_k=budget // bs, skip_recent=info.n_sealed - live_first)
    blocks = [int(b) for b in hits.get()[0]]
    return blocks, by_hand_context(agent, blocks, live_first)


def test_at_a_budget_the_model_reads_the_memory_retrieve_and_gather_give(pool):
    m = HFLlama()
    budget, window, bs = 12, 6, 4
    with pool.agent_open("budget") as agent:
        cache = KvmemCache(agent, budget, window=window, model=m)
        conv = ids(30, 4)
        selected, storage = [], set()
        for turn in range(4):
            new = conv[:, agent.get_info().n_tokens:]
            blocks, ctx_kv = by_hand_turn(m, agent, new, budget, window)
            inp = cache.begin_turn(new)
            assert cache.blocks == blocks and cache.memory_tokens == sum(
                agent.block_info(b).n_tokens for b in blocks) <= budget
            n_ctx = inp.shape[1] - new.shape[1]
            assert n_ctx == cache.get_seq_length() == ctx_kv[0][0].shape[2]
            # the context's ids: the blocks' and the live window's own tokens
            toks = agent.tokens()
            live = agent.get_info().n_tokens - (n_ctx - cache.memory_tokens)
            want_ids = sum((toks[b * bs:(b + 1) * bs] for b in blocks), []) + toks[live:]
            assert inp[0, :n_ctx].tolist() == want_ids and torch.equal(inp[:, n_ctx:], new)
            m.clear_seen()
            got, got_logits = greedy_generate(m, inp, cache, 5)
            for layer, (hk, hv) in zip(m.model.layers, ctx_kv):
                _, fk, fv = layer.self_attn.seen[0]  # what the prefill's attention read
                assert torch.equal(fk[:, :, :n_ctx], hk) and torch.equal(fv[:, :, :n_ctx], hv)
            # the same loop over a plain cache holding the by-hand context: the same tokens
            plain = PlainCache()
            for i, (k, v) in enumerate(ctx_kv):
                plain.update(k, v, i)
            want, want_logits = greedy_generate(m, inp, plain, 5)
            assert torch.equal(got, want) and torch.equal(got_logits, want_logits)
            selected.append(blocks)
            storage.add(cache.key_cache[0].data_ptr())
            conv = torch.cat([conv, got[:, inp.shape[1]:], ids(7, 20 + turn)], dim=1)
        assert any(s and s != list(range(len(s))) for s in selected)  # retrieval chose, not a prefix
        assert len(storage) == 1  # each turn's context went into the storage of the last one
        assert agent.tokens() == conv[0, :agent.get_info().n_tokens].tolist()


@pytest.mark.parametrize("dtype,storage", [(torch.bfloat16, "bf16"), (torch.float16, "f16")])
def test_half_caches_over_thousands_of_tokens_feed_the_c_apis_memory(ctx, dtype, storage):
    m = HFLlama(Config(kv_dtype=dtype))
    budget, window, bs = 256, 64, 16
    with make_pool(ctx, bs, storage) as pool, pool.agent_open("long") as agent:
        cache = KvmemCache(agent, budget, window=window, model=m)
        conv, n_turns, checked = ids(480, 30), 7, 0
        for turn in range(n_turns):
            new = conv[:, agent.get_info().n_tokens:]
            blocks, ctx_kv = by_hand_turn(m, agent, new, budget, window, dtype)
            inp = cache.begin_turn(new)
            assert cache.blocks == blocks
            n_ctx = cache.get_seq_length()
            m.clear_seen()
            got, _ = greedy_generate(m, inp, cache, 3)
            for layer, (hk, hv) in zip(m.model.layers, ctx_kv):
                _, fk, fv = layer.self_attn.seen[0]
                assert fk.dtype == dtype and fk.shape == (1, HKV, n_ctx + new.shape[1], D)
                assert torch.equal(fk[:, :, :n_ctx], hk.to(dtype)) and torch.equal(fv[:, :, :n_ctx], hv.to(dtype))
            checked += bool(cache.retrieval)
            conv = torch.cat([conv, got[:, inp.shape[1]:], ids(480, 40 + turn)], dim=1)
        n = agent.get_info().n_tokens
        assert n > 3000 and checked == n_turns - 1  # every turn after the first retrieved
        assert agent.tokens() == conv[0, :n].tolist()
        assert cache.get_seq_length() <= budget + window + bs + 480 + 3


# ---- the rest of the protocol --------------------------------------------------------------------

def test_protocol_lengths_layers_and_legacy_tuples(pool):
    with pool.agent_open("proto") as agent:
        cache = KvmemCache(agent)
        assert len(cache) == 0 and cache.get_seq_length() == 0 and list(cache) == []
        assert cache.get_max_cache_shape() is None and cache.get_max_length() is None
        k = torch.randn(1, HKV, 5, D)
        v = torch.randn(1, HKV, 5, D)
        rk, rv = cache.update(k, v, 0, {"cache_position": torch.arange(5)})
        assert torch.equal(rk, k) and torch.equal(rv, v)
        assert cache.get_seq_length(0) == 5 and cache.get_seq_length(1) == 0
        assert agent.get_info().n_tokens == 0  # layer 1 has not got them yet
        cache.update(k * 2, v * 2, 1)
        assert agent.get_info().n_tokens == 5 and cache.seen_tokens == 5
        assert cache.get_usable_length(3) == 5 and cache.get_mask_sizes(torch.arange(5, 8)) == (8, 0)
        assert len(cache) == L and len(cache.key_cache) == len(cache.value_cache) == L
        assert torch.equal(cache[-1][0], k * 2) and torch.equal(cache.value_cache[1], v * 2)
        legacy = cache.to_legacy_cache()
        assert isinstance(legacy, tuple) and all(torch.equal(a[0], b) for a, b in zip(legacy, cache.key_cache))
        with pytest.raises(IndexError, match="layer 2 is outside"):
            cache[2]
        # from_legacy_cache: a tuple cache's rows (post-RoPE at 0..) into a new session
        with pool.agent_open("legacy") as other:
            raw = torch.randn(L, 1, HKV, 6, D)
            rot = rope_ref(raw, range(6)).float()
            again = KvmemCache.from_legacy_cache(tuple((rot[i], raw[i]) for i in range(L)), agent=other, window=4)
            assert again.get_seq_length() == 6 and torch.equal(again[1][0], rot[1])
            torch.testing.assert_close(torch.from_numpy(other.read()[0]), raw[:, 0].permute(0, 2, 1, 3),
                                       atol=2e-5, rtol=0)
    assert kt.KvmemCache is KvmemCache


def test_refusals_change_nothing(pool):
    m = HFLlama()
    with pool.agent_open("refuse") as agent:
        cache = KvmemCache(agent, model=m)
        greedy_generate(m, cache.begin_turn(ids(14, 5)), cache, 2)
        n, length = agent.get_info().n_tokens, cache.get_seq_length()
        k = torch.randn(1, HKV, 2, D)
        with pytest.raises(ValueError, match=r"cache_position from 3 for 2 tokens, but the cache's context holds 15"):
            cache.update(k, k, 0, {"cache_position": torch.arange(3, 5)})
        meta = torch.empty(1, HKV, 2, D, device="meta")
        with pytest.raises(kvmem.UnsupportedError, match="key_states is on meta.*move it to the CPU first"):
            cache.update(meta, meta, 0)
        with pytest.raises(ValueError, match=r"must both be \[batch, 2, T, 16\]"):
            cache.update(torch.randn(1, 3, 2, D), torch.randn(1, 3, 2, D), 0)
        with pytest.raises(ValueError, match=r"layer_idx 2 is outside \[0, 2\)"):
            cache.update(k, k, 2)
        with pytest.raises(TypeError, match="must be a torch.Tensor"):
            cache.update(k.numpy(), k, 0)
        assert agent.get_info().n_tokens == n and cache.get_seq_length() == length
        # rows C refuses (non-finite) when the last layer hands them over: none of the forward stays
        cache.update(k, k, 0)
        with pytest.raises(kvmem.InvalidArgumentError, match="non-finite"):
            cache.update(k * float("nan"), k, 1)
        assert agent.get_info().n_tokens == n and cache.get_seq_length(0) == cache.get_seq_length(1) == length
        with pytest.raises(ValueError, match="budget must be a non-negative int"):
            KvmemCache(agent, -1)
        with pytest.raises(TypeError, match=r"retrieve_params\['top_k'\] is set by the cache"):
            KvmemCache(agent, 8, retrieve_params={"top_k": 3})
        with pytest.raises(ValueError, match="scope must be GLOBAL"):
            KvmemCache(agent, 8, retrieve_params={"scope": kvmem.SCOPE_PER_LAYER})
        with pytest.raises(TypeError, match="agent must be a kvmem.Agent"):
            KvmemCache(pool)
        # a retrieval C refuses (a block id out of range) after the probe pass: the context stays
        bad = KvmemCache(agent, 4, model=m, retrieve_params={"always_include": [999]})
        bad.load([0])  # a context: block 0, then the live tail
        before = [k.clone() for k in bad.key_cache]
        with pytest.raises(kvmem.InvalidArgumentError):
            bad.begin_turn(ids(3, 6))
        assert bad.get_seq_length() == 4 + 3 and bad.blocks == [0]
        assert all(torch.equal(a, b) for a, b in zip(bad.key_cache, before))
        assert agent.get_info().n_tokens == n
        blind = KvmemCache(agent, 4)  # a budget, but neither the model nor query states
        with pytest.raises(ValueError, match="needs query states to retrieve with"):
            blind.begin_turn(ids(3, 6))
        with pytest.raises(ValueError, match=r"blocks \[2\] are not sealed blocks before the live window"):
            KvmemCache(agent, 4, window=4).load([2])  # 15 tokens: block 2 holds tokens 8..11


def test_recorded_query_states_select_as_retrieve_does(pool):
    m = HFLlama()
    with pool.agent_open("queries") as agent:
        cache = KvmemCache(agent, model=m)
        greedy_generate(m, cache.begin_turn(ids(40, 7)), cache, 2)
        # the caller's own pre-RoPE query states of the new turn (here: a pass with no memory)
        m.clear_seen()
        new = ids(5, 8)
        m(new, past_key_values=PlainCache())
        qs = [layer.self_attn.seen[0][0] for layer in m.model.layers]  # [batch, heads, q_len, dim]
        limited = KvmemCache(agent, 8, window=4)
        limited.begin_turn(queries=qs)
        want = kt.retrieve(agent, qs, top_k=2, skip_recent=agent.get_info().n_sealed - 10)
        assert limited.blocks == [int(b) for b in want.get()[0]] and len(limited.blocks) == 2
        assert limited.get_seq_length() == 8 + 4 + 1  # memory, the live block, the tail of 41 tokens


def test_beams_share_the_context_and_the_kept_row_reaches_the_agent(pool):
    with pool.agent_open("beams") as agent:
        cache = KvmemCache(agent)
        k0 = torch.randn(1, HKV, 4, D)
        for i in range(L):
            cache.update(k0, k0, i)
        assert agent.get_info().n_tokens == 4
        step = torch.randn(3, HKV, 1, D)  # three beams, one token each
        for i in range(L):
            out_k, _ = cache.update(step, step + i, i)
        assert out_k.shape == (3, HKV, 5, D) and torch.equal(out_k[2, :, :4], k0[0])
        assert agent.get_info().n_tokens == 4  # which beam wins is not known yet
        cache.reorder_cache(torch.tensor([2, 0, 0]))
        assert torch.equal(cache[0][0][:, :, 4], step[[2, 0, 0], :, 0])
        with pytest.raises(ValueError, match=r"keep_row\(i\) picks the one"):
            cache.begin_turn()
        cache.keep_row(0)  # beam 2 of the step
        assert agent.get_info().n_tokens == 5 and cache[0][0].shape[0] == 1
        np.testing.assert_array_equal(agent.read(4)[1][1], (step[2] + 1).permute(1, 0, 2).numpy())


def test_crop_removes_the_newest_tokens_from_the_context_and_the_agent(pool):
    m = HFLlama()
    with pool.agent_open("crop") as agent:
        cache = KvmemCache(agent, model=m)
        greedy_generate(m, cache.begin_turn(ids(10, 9)), cache, 4)
        n = agent.get_info().n_tokens
        cache.crop(-2)
        assert cache.get_seq_length() == n - 2 and agent.get_info().n_tokens == n - 2
        cache.crop(n)  # longer than the context: nothing to do
        assert cache.get_seq_length() == n - 2
        # after a retrieval the memory rows are not the session's newest: refused
        limited = KvmemCache(agent, 4, window=2, model=m)
        inp = limited.begin_turn(ids(2, 10))
        greedy_generate(m, inp, limited, 3)
        assert limited.memory_tokens == 4
        with pytest.raises(ValueError, match="the first 4 rows are retrieved memory"):
            limited.crop(3)
        n, length = agent.get_info().n_tokens, limited.get_seq_length()
        limited.crop(4)  # everything after the memory: the live tail and this turn's tokens
        assert limited.get_seq_length() == 4 and agent.get_info().n_tokens == n - (length - 4)


def test_a_transformers_cache_base_class_is_used_when_transformers_is_importable(tmp_path):
    # transformers 4.40-4.46's Cache is an nn.Module with a no-argument __init__
    pkg = tmp_path / "transformers"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cache_utils.py").write_text("import torch\nclass Cache(torch.nn.Module):\n    pass\n")
    here = os.path.dirname(os.path.abspath(__file__))
    code = textwrap.dedent("""
        import torch, kvmem
        from transformers.cache_utils import Cache
        from kvmem.hf import KvmemCache
        from hf_llama import HFLlama, PlainCache, greedy_generate
        spec = kvmem.ModelSpec(n_layers=2, n_q_heads=4, n_kv_heads=2, head_dim=16)
        with kvmem.Context("cpu", 1) as ctx, ctx.pool_create(spec, block_size=4) as pool:
            m = HFLlama()
            cache = KvmemCache(pool.agent_open("t"), model=m)
            assert isinstance(cache, Cache) and "model" not in dict(cache.named_children())
            x = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(0))
            got, _ = greedy_generate(m, cache.begin_turn(x), cache, 5)
            want, _ = greedy_generate(m, x, PlainCache(), 5)
            assert torch.equal(got, want)
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), here, os.path.dirname(here)]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
