"""kvmem.torch: PyTorch caches cross as strided views of their own memory (the
pointer and strides are checked), come back exactly (agent read, f32/f16/bf16),
post-RoPE keys are de-rotated (against a RoPE written here), retrieval takes
HF query states and QueryCapture's hooks, gathered memory drives a small
HF-shaped Llama to the logits of its full context, and bad input is refused
before C is called."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="skipped: torch not installed (apt-get install python3-torch)")
from torch import nn  # noqa: E402

import kvmem  # noqa: E402
import kvmem.torch as kt  # noqa: E402

L, HQ, HKV, D, BS = 2, 4, 2, 16, 4


@pytest.fixture
def pool():
    spec = kvmem.ModelSpec(n_layers=L, n_q_heads=HQ, n_kv_heads=HKV, head_dim=D)
    with kvmem.Context("cpu", 1) as ctx, ctx.pool_create(spec, block_size=BS, storage_dtype="f32") as p:
        yield p


@pytest.fixture
def agent(pool):
    with pool.agent_open("t") as a:
        yield a


def gen(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def kvmem_order(t, b=0):
    """[batch, heads, seq, dim] per layer -> numpy [layers][seq][heads][dim] of row b."""
    return np.stack([x[b].permute(1, 0, 2).float().numpy() for x in t])


def rope_ref(x, pos, theta=10000.0):
    """NEOX RoPE (pairs (i, i + D/2)) in float64 plain loops: [..., T, D] at positions [T]."""
    x = x.double().clone()
    out = x.clone()
    half = x.shape[-1] // 2
    for t, p in enumerate(pos):
        for i in range(half):
            a = p * theta ** (-2.0 * i / x.shape[-1])
            c, s = math.cos(a), math.sin(a)
            x0, x1 = x[..., t, i], x[..., t, i + half]
            out[..., t, i], out[..., t, i + half] = x0 * c - x1 * s, x0 * s + x1 * c
    return out


# ---- append: views, no copy, round trip --------------------------------------------------------

def test_one_storage_cache_is_handed_over_in_place(agent):
    K, V = gen(L, 3, HKV, 10, D, seed=1), gen(L, 3, HKV, 10, D, seed=2)  # [layer, batch, heads, seq, dim]
    cache = tuple((K[i], V[i]) for i in range(L))
    kv, vv = kt.kv_views(cache, batch_index=1, start=2, stop=7)
    # the view starts at row 1, token 2 of layer 0's own memory, with the cache's strides
    assert kv.data == K[0, 1, :, 2].data_ptr() and vv.data == V[0, 1, :, 2].data_ptr()
    assert not kv.copied and not vv.copied
    s = K[0].stride()
    assert kv.shape == (L, 5, HKV, D) and kv.strides == (K.stride(0), s[2], s[1], s[3])
    assert kt.append(agent, cache, batch_index=1, start=2, stop=7) is True
    rk, rv = agent.read()
    np.testing.assert_array_equal(rk, kvmem_order([K[i][:, :, 2:7] for i in range(L)], 1))
    np.testing.assert_array_equal(rv, kvmem_order([V[i][:, :, 2:7] for i in range(L)], 1))


def test_hf_dynamic_cache_shape_is_read_and_separate_layers_are_stacked(agent):
    ks = [gen(1, HKV, 6, D, seed=10 + i) for i in range(L)]  # separate allocations, as DynamicCache's
    vs = [gen(1, HKV, 6, D, seed=20 + i) for i in range(L)]
    cache = SimpleNamespace(key_cache=ks, value_cache=vs)
    kv, _ = kt.kv_views(cache)
    if not kv.copied:  # two tensors that happen to lie upward in memory: one layer stride reaches both
        assert kv.data == ks[0].data_ptr() and kv.strides[0] * 4 == ks[1].data_ptr() - ks[0].data_ptr()
    kt.append(agent, cache)
    rk, rv = agent.read()
    np.testing.assert_array_equal(rk, kvmem_order(ks))
    np.testing.assert_array_equal(rv, kvmem_order(vs))
    # the newer transformers Cache shape: layers with keys / values
    layers = SimpleNamespace(layers=[SimpleNamespace(keys=k, values=v) for k, v in zip(ks, vs)])
    kt.append(agent, layers, start=4)
    rk, _ = agent.read(6)
    np.testing.assert_array_equal(rk, kvmem_order([k[:, :, 4:] for k in ks]))


def test_unevenly_spaced_layers_are_stacked_once_and_still_exact(agent):
    big = gen(3, 1, HKV, 5, D, seed=3)
    ks = [big[2], big[0]]  # layer 1 below layer 0 in memory: no non-negative layer stride
    kv, _ = kt.kv_views(tuple((k, k) for k in ks))
    assert kv.copied
    assert kt.append(agent, tuple((k, k) for k in ks)) is False
    rk, _ = agent.read()
    np.testing.assert_array_equal(rk, kvmem_order(ks))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes_round_trip_exactly(pool, dtype):
    with pool.agent_open(f"h{str(dtype)[-4:]}") as a:
        K = gen(L, 1, HKV, 5, D, seed=4).to(dtype)
        cache = tuple((K[i], K[i]) for i in range(L))
        assert kt.append(a, cache) is True
        back = kt.read(a, dtype=dtype)
        assert back[0][0].dtype == dtype and back[0][0].shape == (1, HKV, 5, D)
        for i in range(L):
            assert torch.equal(back[i][0], K[i]) and torch.equal(back[i][1], K[i])


def test_post_rope_keys_are_derotated_with_their_positions(agent):
    raw = gen(L, 1, HKV, 6, D, seed=5)
    pos = list(range(40, 46))
    rot = rope_ref(raw, pos).float()
    cache = tuple((rot[i], raw[i]) for i in range(L))
    kt.append(agent, cache, positions=40, token_ids=list(range(6)))
    rk, rv = agent.read()
    np.testing.assert_allclose(rk, kvmem_order(raw), atol=2e-5)
    np.testing.assert_array_equal(rv, kvmem_order(raw))
    assert agent.tokens() == list(range(6))
    for given in (np.int64(40), torch.tensor(pos), pos):  # the first position, or each one
        agent.truncate(0)
        kt.append(agent, cache, positions=given)
        np.testing.assert_array_equal(agent.read()[0], rk)
    # read(rotate=True) re-applies RoPE at the tokens' own positions: the engine's keys again
    agent.truncate(0)
    kt.append(agent, tuple((raw[i], raw[i]) for i in range(L)))  # pre-RoPE keys: no positions
    got = kt.read(agent, 2, 3, rotate=True)
    want = rope_ref(raw[:, :, :, 2:5], range(2, 5)).float()
    for i in range(L):
        torch.testing.assert_close(got[i][0], want[i], atol=2e-5, rtol=0)


def test_gather_returns_past_key_values_and_writes_into_a_cache_in_place(agent):
    raw = gen(L, 1, HKV, 12, D, seed=6)
    kt.append(agent, tuple((raw[i], raw[i]) for i in range(L)))
    agent.flush()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        past = kt.gather(agent, [0, 2], base_position=7, dtype=dtype)
        assert len(past) == L and past[0][0].shape == (1, HKV, 2 * BS, D) and past[0][0].dtype == dtype
        nk, nv = agent.gather([0, 2], 7)  # the numpy binding's gather: the reference layout
        for i in range(L):
            assert torch.equal(past[i][0], torch.from_numpy(nk[i]).permute(1, 0, 2)[None].to(dtype))
            assert torch.equal(past[i][1], torch.from_numpy(nv[i]).permute(1, 0, 2)[None].to(dtype))
    # and the keys are the raw ones rotated at 7.. (an independent RoPE)
    past = kt.gather(agent, [0, 2], base_position=7)
    want = rope_ref(torch.cat([raw[:, :, :, 0:4], raw[:, :, :, 8:12]], dim=3), range(7, 15)).float()
    torch.testing.assert_close(past[1][0], want[1], atol=2e-5, rtol=0)
    # into an existing static cache at rows 3..10 of batch row 1; nothing else changes
    K = torch.full((L, 2, HKV, 16, D), 9.0)
    V = torch.full((L, 2, HKV, 16, D), 9.0)
    static = SimpleNamespace(key_cache=list(K), value_cache=list(V))
    assert kt.gather(agent, [0, 2], 7, out=static, batch_index=1, out_start=3) is static
    assert torch.equal(K[:, 1:2, :, 3:11], torch.stack([p[0] for p in past]))
    assert (K[:, 0] == 9).all() and (K[:, 1, :, :3] == 9).all() and (K[:, 1, :, 11:] == 9).all()
    kt.read(agent, 0, 4, rotate=True, out=static, batch_index=0, out_start=12)
    torch.testing.assert_close(K[:, 0:1, :, 12:16], rope_ref(raw[:, :, :, 0:4], range(4)).float(), atol=2e-5, rtol=0)


def test_separate_layer_outputs_cannot_be_written_through_one_view(agent):
    kt.append(agent, tuple((gen(1, HKV, 4, D), gen(1, HKV, 4, D)) for _ in range(L)))
    agent.flush()
    big = torch.zeros(3, 1, HKV, 4, D)
    out = ((big[2], big[2]), (big[0], big[0]))  # layer 1 below layer 0
    with pytest.raises(ValueError, match="separate allocations"):
        kt.gather(agent, [0], out=out)
    assert (big == 0).all()


# ---- retrieval with query states ---------------------------------------------------------------

def test_hf_query_states_are_viewed_in_place_and_retrieve_as_numpy_does(agent):
    kt.append(agent, tuple((gen(1, HKV, 32, D, seed=30 + i), gen(1, HKV, 32, D)) for i in range(L)))
    Q = gen(L, 2, HQ, 3, D, seed=7)  # query_states per layer [batch, heads, q_len, dim], one storage
    qv = kt.query_view(list(Q), agent.pool.spec, batch_index=1)
    assert qv.data == Q[0, 1].data_ptr() and not qv.copied
    assert qv.shape == (3, L, HQ, D) and qv.strides == (D, Q.stride(0), 3 * D, 1)
    got = kt.retrieve(agent, list(Q), batch_index=1, top_k=3)
    want = agent.retrieve(Q[:, 1].permute(2, 0, 1, 3).contiguous().numpy(), top_k=3)
    np.testing.assert_array_equal(got.get()[0], want.get()[0])
    np.testing.assert_array_equal(got.get()[1], want.get()[1])
    # a tensor already in kvmem's order, and bf16 queries
    q4 = Q[:, 1].permute(2, 0, 1, 3)
    np.testing.assert_array_equal(kt.retrieve(agent, q4, top_k=3).get()[0], want.get()[0])
    assert len(kt.retrieve(agent, q4.to(torch.bfloat16), top_k=2, exclude=[0]).get()[0]) == 2
    with pytest.raises(TypeError, match="unexpected keyword argument 'topk'"):
        kt.retrieve(agent, q4, topk=3)


# ---- a small HF-shaped Llama: capture, append, retrieve, gather, continue ----------------------

def rotate_half(x):
    return torch.cat((-x[..., D // 2:], x[..., :D // 2]), dim=-1)


class TinyAttention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.q_proj = nn.Linear(dim, HQ * D, bias=False)
        self.k_proj = nn.Linear(dim, HKV * D, bias=False)
        self.v_proj = nn.Linear(dim, HKV * D, bias=False)
        self.o_proj = nn.Linear(HQ * D, dim, bias=False)
        self.query_states = []  # what HF calls query_states before RoPE, recorded for the test

    def forward(self, x, pos, past):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, HQ, D).transpose(1, 2)
        k = self.k_proj(x).view(B, T, HKV, D).transpose(1, 2)
        v = self.v_proj(x).view(B, T, HKV, D).transpose(1, 2)
        self.query_states.append(q.clone())
        inv = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        ang = pos.double()[:, None] * inv[None]
        cos, sin = torch.cat((ang.cos(), ang.cos()), -1).float(), torch.cat((ang.sin(), ang.sin()), -1).float()
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if past is not None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        P = k.shape[2] - T
        att = (q @ k.repeat_interleave(HQ // HKV, 1).transpose(-1, -2)) / math.sqrt(D)
        mask = torch.arange(P + T)[None] <= (P + torch.arange(T))[:, None]
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        o = (att @ v.repeat_interleave(HQ // HKV, 1)).transpose(1, 2).reshape(B, T, HQ * D)
        return self.o_proj(o), (k, v)


class TinyLlama(nn.Module):
    """HF's LlamaForCausalLM skeleton: model.layers[i].self_attn.q_proj, legacy past_key_values."""

    def __init__(self, vocab=64, dim=32):
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, dim)
        self.model.layers = nn.ModuleList()
        for _ in range(L):
            layer = nn.Module()
            layer.self_attn = TinyAttention(dim)
            layer.mlp = nn.Linear(dim, dim)
            self.model.layers.append(layer)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    @torch.no_grad()
    def forward(self, input_ids, position_ids, past_key_values=None, use_cache=True):
        x = self.model.embed_tokens(input_ids)
        position_ids = position_ids.reshape(-1)  # one row
        new = []
        for i, layer in enumerate(self.model.layers):
            a, kv = layer.self_attn(x, position_ids, None if past_key_values is None else past_key_values[i])
            x = x + a
            x = x + torch.tanh(layer.mlp(x))
            new.append(kv)
        return SimpleNamespace(logits=self.lm_head(x), past_key_values=tuple(new))


def test_query_capture_records_pre_rope_queries_per_layer():
    m = TinyLlama()
    with kt.QueryCapture(m) as cap:
        assert cap.n_layers == L
        m(torch.tensor([[1, 2, 3]]), torch.arange(3))
        out = m(torch.tensor([[4, 5]]), torch.arange(3, 5), None)  # rows accumulate
        q = cap.queries(SimpleNamespace(n_q_heads=HQ, head_dim=D))
    assert q.shape == (5, L, HQ, D)
    for i, layer in enumerate(m.model.layers):
        want = torch.cat(layer.self_attn.query_states, dim=2)[0].permute(1, 0, 2)  # [T, heads, dim]
        assert torch.equal(q[:, i], want)
    assert out.logits.shape == (1, 2, 64)
    m(torch.tensor([[7]]), torch.arange(1))  # hooks are off after the with block
    geo = SimpleNamespace(n_q_heads=HQ, head_dim=D)
    assert torch.equal(cap.queries(geo), q)
    cap.clear()
    with pytest.raises(ValueError, match="layer 0 has seen no forward pass"):
        cap.queries(geo)
    with pytest.raises(ValueError, match="gives 64 values per token, the model spec n_q_heads \\* head_dim = 32"):
        with kt.QueryCapture(m) as c2:
            m(torch.tensor([[1]]), torch.arange(1))
            c2.queries(SimpleNamespace(n_q_heads=2, head_dim=D))
    with pytest.raises(ValueError, match="no module named 'wq'"):
        kt.QueryCapture(m, name="wq")


def test_memory_gathered_from_kvmem_is_the_models_past_key_values(agent):
    m = TinyLlama()
    hist = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(8))
    out = m(hist, torch.arange(24))
    kt.append(agent, out.past_key_values, positions=0, token_ids=hist[0])  # post-RoPE keys
    agent.flush()
    prompt, pos = torch.tensor([[3, 14, 15]]), torch.arange(24, 27)
    full = m(prompt, pos, out.past_key_values).logits
    with kt.QueryCapture(m) as cap:
        m(prompt, pos, out.past_key_values)
    hits = kt.retrieve(agent, cap, top_k=24 // BS)
    blocks = [int(b) for b in hits.get()[0]]
    assert blocks == list(range(24 // BS))
    # every block, re-encoded at its own positions: the model's own cache again
    past = kt.gather(agent, blocks, base_position=0)
    for (gk, gv), (k, v) in zip(past, out.past_key_values):
        torch.testing.assert_close(gk, k, atol=3e-5, rtol=0)
        assert torch.equal(gv, v)
    torch.testing.assert_close(m(prompt, pos, past).logits, full, atol=1e-4, rtol=0)
    # the same retrieval from the recorded HF query states and from the capture. The recorded
    # states come from the later pass over the gathered past, whose keys differ from the
    # model's own by rounding, so the two query sets differ by a few ulp (how many depends on
    # PyTorch's kernels for this CPU): the same blocks, and scores within the bound that
    # difference allows.
    qs = [torch.cat(l.self_attn.query_states[-1:], dim=2) for l in m.model.layers]
    top2 = kt.retrieve(agent, qs, top_k=2).get()
    ref = kt.retrieve(agent, cap, top_k=2).get()
    np.testing.assert_array_equal(top2[0], ref[0])
    qa = torch.stack([q[0] for q in qs]).permute(2, 0, 1, 3).double().numpy()  # [n_q, L, H, D]
    qb = cap.queries(agent.pool.spec).double().numpy()
    assert qa.shape == qb.shape
    # SOFTMAX/MAX: a logit tau*I(q, b) moves by at most tau * |dq|_1 * max|k| (the box's
    # corners are key coordinates), a softmax share by a factor e^(2 dz) at most, and MAX
    # over queries and the sum over layers and heads keep that relative bound.
    dz = np.abs(qa - qb).sum(axis=-1).max() * np.abs(agent.read()[0]).max() / math.sqrt(D)
    assert dz < 1e-4
    bound = (math.expm1(2 * dz) + 64 * np.finfo(np.float32).eps) * np.abs(ref[1])
    assert np.all(np.abs(top2[1].astype(np.float64) - ref[1]) <= bound)


# ---- refusals ----------------------------------------------------------------------------------

def test_device_tensors_are_refused_naming_the_fix(agent):
    meta = torch.empty(1, HKV, 4, D, device="meta")  # any non-CPU device takes this path (cuda too)
    with pytest.raises(kvmem.UnsupportedError, match=r"is on meta.*move it to the CPU first.*\.cpu\(\)"):
        kt.append(agent, ((meta, meta),) * L)
    with pytest.raises(kvmem.UnsupportedError, match="queries layer 0 is on meta"):
        kt.retrieve(agent, [meta] * L)
    assert agent.get_info().n_tokens == 0


def test_bad_caches_are_refused_and_nothing_is_appended(agent):
    good = gen(1, HKV, 4, D)
    cases = [
        # C judges the geometry against the pool's spec
        (((good, good),) * (L + 1), kvmem.InvalidArgumentError, r"shape \[3\]\[4\]\[2\]\[16\] does not match"),
        (((gen(1, HKV + 1, 4, D),) * 2,) * L, kvmem.InvalidArgumentError, r"shape \[2\]\[4\]\[3\]\[16\] does not"),
        (((good, good * float("nan")),) * L, kvmem.InvalidArgumentError, "non-finite"),
        (((good.double(), good.double()),) * L, TypeError, "float64"),
        (((good.to(torch.int32), good),) * L, TypeError, "int32"),
        (((good[0], good[0]),) * L, ValueError, r"expected \[batch, n_kv_heads, seq, head_dim\]"),
        (((good, gen(1, HKV, 5, D)),) * L, ValueError, "keys are"),
        ([(good, good), (gen(1, HKV, 5, D), gen(1, HKV, 5, D))], ValueError, "layer 1 k"),
        ({"k": good}, TypeError, "tuple of \\(k, v\\) per layer"),
        ((good,) * L, TypeError, r"cache\[0\] must be a \(k, v\) pair"),
    ]
    for cache, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            kt.append(agent, cache)
    with pytest.raises(ValueError, match="batch_index 1 is outside the cache's batch of 1"):
        kt.append(agent, ((good, good),) * L, batch_index=1)
    with pytest.raises(ValueError, match=r"tokens \[3, 9\) are outside the cache's 4 positions"):
        kt.append(agent, ((good, good),) * L, start=3, stop=9)
    with pytest.raises(ValueError, match="positions has 2 entries, expected 4"):
        kt.append(agent, ((good, good),) * L, positions=[1, 2])
    with pytest.raises(kvmem.InvalidArgumentError, match="positions is NULL"):
        kt.append(agent, ((good, good),) * L, keys_rotated=True)
    assert agent.get_info().n_tokens == 0


def test_readme_torch_example_runs(agent):
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "python.md")).read()
    section = doc[doc.index("## PyTorch"):]
    code = next(c for c in re.findall(r"```python\n(.*?)```", section, re.S) if "kvmem.torch" in c)
    m = TinyLlama()
    env = {"torch": torch, "model": m, "agent": agent, "T": 16, "n": 3,
           "ids": torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(9)),
           "prompt": torch.tensor([[5, 6, 7]])}
    exec(code, env)
    assert agent.get_info().n_tokens == 16 and len(env["hits"].get()[0]) == 4
    assert env["M"] == 16 and env["out"].logits.shape == (1, 3, 64)
    # all four blocks at positions 0..15: the prompt's logits on its full context
    full = m(env["prompt"], torch.arange(16, 19), m(env["ids"], torch.arange(16)).past_key_values).logits
    torch.testing.assert_close(env["out"].logits, full, atol=1e-4, rtol=0)


def test_kvmem_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import kvmem\n"
            "assert kvmem.Context('cpu', 1).backend == 'cpu'\n"
            "try:\n"
            "    import kvmem.torch\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "kvmem.torch needs PyTorch" in r.stdout and "python3-torch" in r.stdout
