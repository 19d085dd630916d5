#!/usr/bin/env python3
"""A story agent on a real model in PyTorch whose memory is kvmem (kvmem.torch).

The model is stories260K (llama2.c checkpoint, a Llama with grouped-query
attention) run as a PyTorch module on the CPU in float32, with its tokenizer;
the agent is the C story demo's (examples/tinyllm/story.c) in Python:

  * Sessions of a story arrive as text. For each new prompt the agent asks
    kvmem for memory, MemArt as deployed: the prompt's pre-RoPE queries
    (collected by kvmem.torch.QueryCapture's hooks on the q_proj modules while
    the prompt runs over the newest 32 tokens) score the agent's blocks; the
    newest blocks stay as the live context at their own positions and the
    retrieved blocks are re-encoded (RoPE) just before it.
  * The engine prefills only the prompt on that memory (its past_key_values),
    continues the story greedily, and the session and its continuation are
    appended to the agent straight from the engine's cache (no copy).
  * Phase 1 runs four sessions and saves the agent to one file; phase 2, a new
    process, loads it, checks that the next prompt's logits are the ones
    phase 1 computed, and runs the last session.

Run with the kvmem package installed (pip install ./bindings/python) and PyTorch
(Debian: apt-get install python3-torch):
    python3 torch_agent.py --model stories260K.bin [--state DIR] [--phase 1|2|all]
(from a checkout after `make build`: PYTHONPATH=bindings/python /usr/bin/python3 examples/python/torch_agent.py).
examples/python/test_torch_agent.py checks it against the C engine.
"""
from __future__ import annotations

import argparse
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")

try:
    import torch
    from torch import nn
except ImportError:  # the test skips before running it; a user gets the reason
    sys.exit("torch_agent.py needs PyTorch: apt-get install python3-torch (Debian), or pip install torch")

import kvmem  # noqa: E402
import kvmem.torch as kt  # noqa: E402

# The C demo's sessions (examples/tinyllm/story.c), phase 1's then phase 2's.
SESSIONS = [
    "Once upon a time, there was a little girl named Sue. Sue had a red kite. She liked to fly her kite in the "
    "park with her mom.",
    "The sun was warm and the sky was blue. A little bird sat on a branch and sang a happy song.",
    "A big brown cow lived on a farm. The cow ate green grass all day. At night, the cow slept in a warm barn.",
    "In the forest, there was a tall tree. A family of squirrels lived in the tree. They gathered nuts for the "
    "winter.",
    "One day,",
]
GEN, PROBE_WINDOW, MIN_BUDGET, BLOCK, LOCAL_FRAC = 20, 32, 32, 16, 0.75


# ---------------------------------------------------------------------------
# The model: a llama2.c checkpoint as a Llama-style torch module
# ---------------------------------------------------------------------------

class Config:
    def __init__(self, dim: int, hidden: int, n_layers: int, n_heads: int, n_kv_heads: int, vocab: int,
                 seq_len: int):
        self.dim, self.hidden, self.n_layers, self.n_heads = dim, hidden, n_layers, n_heads
        self.n_kv_heads, self.vocab, self.seq_len = n_kv_heads, vocab, seq_len
        self.head_dim = dim // n_heads
        self.theta, self.eps = 10000.0, 1e-5


class KVCache:
    """The engine's working set, allocated once as HF's StaticCache is: K, V
    [n_layers, 1, n_kv_heads, capacity, head_dim], rows [0, n) in use.
    key_cache / value_cache (HF's names) are the per-layer [1, n_kv_heads,
    capacity, head_dim] views that kvmem.torch reads and writes in place."""

    def __init__(self, cfg: Config, capacity: int):
        shape = (cfg.n_layers, 1, cfg.n_kv_heads, capacity, cfg.head_dim)
        self.K, self.V, self.n = torch.zeros(shape), torch.zeros(shape), 0
        self.key_cache, self.value_cache = list(self.K), list(self.V)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE on [1, heads, T, head_dim] at positions [T], llama2.c's pairing (2i, 2i+1)."""
    D = x.shape[-1]
    inv = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos().float(), ang.sin().float()
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, w: torch.Tensor, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(w, requires_grad=False), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def linear(w: torch.Tensor) -> nn.Linear:
    m = nn.Linear(w.shape[1], w.shape[0], bias=False)
    m.weight = nn.Parameter(w, requires_grad=False)
    return m


class Attention(nn.Module):
    def __init__(self, cfg: Config, wq, wk, wv, wo):
        super().__init__()
        self.cfg = cfg
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = linear(wq), linear(wk), linear(wv), linear(wo)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
        c, T = self.cfg, x.shape[1]
        q = self.q_proj(x).view(1, T, c.n_heads, c.head_dim).transpose(1, 2)  # pre-RoPE: what kvmem retrieves with
        k = self.k_proj(x).view(1, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(1, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q, k = rope(q, pos, c.theta), rope(k, pos, c.theta)
        n0 = cache.n
        cache.K[layer, :, :, n0:n0 + T] = k
        cache.V[layer, :, :, n0:n0 + T] = v
        rep = c.n_heads // c.n_kv_heads  # query head h reads KV head h // rep
        K = cache.K[layer, :, :, :n0 + T].repeat_interleave(rep, dim=1)
        V = cache.V[layer, :, :, :n0 + T].repeat_interleave(rep, dim=1)
        att = (q @ K.transpose(-1, -2)) / math.sqrt(c.head_dim)
        visible = torch.arange(n0 + T)[None, :] <= (n0 + torch.arange(T))[:, None]  # the cache, then causal
        att = att.masked_fill(~visible, float("-inf")).softmax(-1)
        return self.o_proj((att @ V).transpose(1, 2).reshape(1, T, c.dim))


class MLP(nn.Module):
    def __init__(self, w1, w2, w3):
        super().__init__()
        self.gate_proj, self.down_proj, self.up_proj = linear(w1), linear(w2), linear(w3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: Config, w: dict, l: int):
        super().__init__()
        self.input_layernorm = RMSNorm(w["rms_att"][l], cfg.eps)
        self.self_attn = Attention(cfg, w["wq"][l], w["wk"][l], w["wv"][l], w["wo"][l])
        self.post_attention_layernorm = RMSNorm(w["rms_ffn"][l], cfg.eps)
        self.mlp = MLP(w["w1"][l], w["w2"][l], w["w3"][l])

    def forward(self, x, pos, cache, l):
        x = x + self.self_attn(self.input_layernorm(x), pos, cache, l)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, cfg: Config, w: dict):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding.from_pretrained(w["tok_emb"], freeze=True)
        self.layers = nn.ModuleList(Layer(cfg, w, l) for l in range(cfg.n_layers))
        self.norm = RMSNorm(w["rms_final"], cfg.eps)

    @torch.no_grad()
    def forward(self, ids, positions, cache: KVCache) -> torch.Tensor:
        """Run tokens at positions over the cache (their K/V rows are added to
        it): logits [T, vocab]."""
        ids = torch.as_tensor(ids, dtype=torch.long)
        pos = torch.as_tensor(positions, dtype=torch.long)
        x = self.embed_tokens(ids)[None]
        for l, layer in enumerate(self.layers):
            x = layer(x, pos, cache, l)
        cache.n += len(ids)
        return (self.norm(x) @ self.embed_tokens.weight.T)[0]  # classifier shared with the embedding


def load_llama2c(path: str) -> Llama:
    """llama2.c's checkpoint: seven int32 (dim, hidden, layers, heads, kv heads,
    vocab, seq_len; vocab > 0: classifier shared), then f32 weights in order."""
    with open(path, "rb") as f:
        dim, hidden, L, H, Hkv, vocab, seq_len = struct.unpack("<7i", f.read(28))
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
    if vocab <= 0:
        sys.exit(f"{path}: a separate classifier (negative vocab) is not handled by this example")
    cfg = Config(dim, hidden, L, H, Hkv, vocab, seq_len)
    kvd = Hkv * cfg.head_dim
    w, at = {}, 0
    for name, shape in (("tok_emb", (vocab, dim)), ("rms_att", (L, dim)), ("wq", (L, dim, dim)),
                        ("wk", (L, kvd, dim)), ("wv", (L, kvd, dim)), ("wo", (L, dim, dim)),
                        ("rms_ffn", (L, dim)), ("w1", (L, hidden, dim)), ("w2", (L, dim, hidden)),
                        ("w3", (L, hidden, dim)), ("rms_final", (dim,))):
        n = math.prod(shape)
        if at + n > data.numel():
            sys.exit(f"{path}: too short for a llama2.c checkpoint of this header")
        w[name] = data[at:at + n].view(shape)
        at += n
    return Llama(cfg, w).eval()


# ---------------------------------------------------------------------------
# The tokenizer: llama2.c's (sentencepiece BPE with byte fallback)
# ---------------------------------------------------------------------------

class Tokenizer:
    def __init__(self, path: str, vocab: int):
        with open(path, "rb") as f:
            buf = f.read()
        at, self.pieces, self.scores = 4, [], []
        for _ in range(vocab):
            score, n = struct.unpack_from("<fi", buf, at)
            self.pieces.append(buf[at + 8:at + 8 + n])
            self.scores.append(score)
            at += 8 + n
        # 0 <unk>, 1 BOS, 2 EOS; <0xNN> pieces are bytes; the rest merge
        self.byte = {}
        self.ids = {}
        for i, p in enumerate(self.pieces):
            if len(p) == 6 and p.startswith(b"<0x") and p.endswith(b">"):
                self.byte.setdefault(int(p[3:5], 16), i)
            elif i > 2 and p and p not in self.ids:
                self.ids[p] = i
        self.byte_ids = set(self.byte.values())

    def encode(self, text: str, bos: bool) -> list:
        """Dummy-prefix space, one piece per UTF-8 character (else its bytes),
        then merge the best-scoring adjacent pair (leftmost on a tie) until none merges."""
        syms = []  # (bytes, id, mergeable)
        for ch in " " + text if text else "":
            b = ch.encode()
            if b in self.ids:
                syms.append((b, self.ids[b], True))
            else:
                syms += [(bytes([x]), self.byte.get(x, 0), False) for x in b]
        while True:
            best = None
            for i in range(len(syms) - 1):
                if syms[i][2] and syms[i + 1][2]:
                    j = self.ids.get(syms[i][0] + syms[i + 1][0])
                    if j is not None and (best is None or self.scores[j] > self.scores[best[1]]):
                        best = (i, j)
            if best is None:
                break
            i, j = best
            syms[i:i + 2] = [(syms[i][0] + syms[i + 1][0], j, True)]
        return ([1] if bos else []) + [s[1] for s in syms]

    def decode(self, ids) -> str:
        out = b""
        for i, t in enumerate(ids):
            p = b"" if t < 3 else self.pieces[t]
            if t in self.byte_ids:
                p = bytes([int(p[3:5], 16)])
            elif i and ids[i - 1] == 1 and p.startswith(b" "):
                p = p[1:]  # the dummy prefix after BOS
            out += p
        return out.decode("utf-8", "replace")


# ---------------------------------------------------------------------------
# The agent
# ---------------------------------------------------------------------------

def budget_for(history: int) -> int:
    """The memory budget: a quarter of the history in whole blocks, at least MIN_BUDGET."""
    return max(MIN_BUDGET, (history // 4 + 8) // 16 * 16)


def show(label: str, text: str) -> None:
    print(f'{label}"{text.replace(chr(10), " ")}"')


def kvmem_spec(c: Config) -> kvmem.ModelSpec:
    """The model's KV geometry and RoPE for kvmem: the C engine's spec, model id
    included, so its agent files and these are interchangeable."""
    return kvmem.ModelSpec(n_layers=c.n_layers, n_q_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim,
                           rotary_dim=c.head_dim, rope_style=kvmem.ROPE_GPTJ, rope_theta=c.theta,
                           model_id=f"tinyllm-llama2c-d{c.dim}-l{c.n_layers}")


class StoryAgent:
    def __init__(self, model: Llama, tok: Tokenizer):
        self.model, self.tok, self.cfg = model, tok, model.cfg
        self.spec = kvmem_spec(model.cfg)
        self.ctx = kvmem.Context("cpu")
        self.pool = self.ctx.pool_create(self.spec, block_size=BLOCK, storage_dtype="f16")
        self.agent = self.pool.agent_open("story-agent")

    @property
    def n(self) -> int:
        return self.agent.get_info().n_tokens

    def probe(self, prompt: list, N: int) -> torch.Tensor:
        """The prompt's pre-RoPE queries [n, n_layers, n_heads, head_dim] over the newest history."""
        w = min(PROBE_WINDOW, N)
        cache = KVCache(self.cfg, w + len(prompt))
        kt.read(self.agent, N - w, w, rotate=True, out=cache)
        cache.n = w
        with kt.QueryCapture(self.model) as cap:
            self.model(prompt, range(N, N + len(prompt)), cache)
            return cap.queries(self.spec)

    def memory(self, prompt: list, budget: int, cache: KVCache) -> dict:
        """MemArt as deployed, into the cache: retrieved blocks re-encoded just
        before the live context (the newest blocks at their own positions)."""
        N = self.n
        b = 0 if budget >= N else budget  # 0: everything
        local = n_local = 0
        if b > 0:  # the live context takes up to LOCAL_FRAC of the budget, leaving a block to retrieval
            room = min(int(b * LOCAL_FRAC), b - BLOCK)
            for blk in range(self.agent.get_info().n_sealed - 1, -1, -1):
                nt = self.agent.block_info(blk).n_tokens
                if local + nt > room:
                    break
                local, n_local = local + nt, n_local + 1
        hits = kt.retrieve(self.agent, self.probe(prompt, N), top_k=(b - local) // BLOCK if b else 2**30,
                           skip_recent=n_local, mode=kvmem.RETRIEVE_AABB, norm=kvmem.NORM_SOFTMAX,
                           agg=kvmem.AGG_MAX)
        blocks, M = [int(x) for x in hits.get()[0]], hits.n_tokens()
        if M:
            kt.gather(self.agent, blocks, max(N - local - M, 0), out=cache)
        if local:
            kt.read(self.agent, N - local, local, rotate=True, out=cache, out_start=M)
        cache.n = M + local
        return {"blocks": blocks, "retrieved": M, "local": local}

    def print_range(self, label: str, first: int, n: int) -> None:
        show(label, self.tok.decode(self.agent.tokens(first, n)))

    def kvmem_memory(self, prompt: list, cache: KVCache, verbose: bool) -> None:
        N = self.n
        info = self.memory(prompt, budget_for(N), cache)
        if not verbose:
            return
        nb = len(info["blocks"])
        print(f"  kvmem memory, {cache.n} of {N} history tokens: the live context ({info['local']} tokens) and "
              f"{nb} retrieved block{'' if nb == 1 else 's'} ({info['retrieved']} tokens, re-encoded just "
              f"before it):")
        for blk in info["blocks"]:
            bi = self.agent.block_info(blk)
            self.print_range(f"    retrieved block {blk} (tokens {bi.first_token}-{bi.first_token + bi.n_tokens - 1}): ",
                             bi.first_token, bi.n_tokens)
        if info["local"]:
            self.print_range("    live context: ", N - info["local"], info["local"])

    def continue_text(self, cache: KVCache, prompt: list, N: int):
        """Prefill the prompt on the memory in the cache, then continue greedily
        for up to GEN tokens (to a story boundary); every token's K/V row ends
        up in the cache. Returns (continuation ids, the prompt's logits)."""
        logits = self.model(prompt, range(N, N + len(prompt)), cache)
        t, gen = int(logits[-1].argmax()), []
        while len(gen) < GEN and t > 2:  # 0 unk, 1 BOS, 2 EOS: the story ends
            gen.append(t)
            t = int(self.model([t], [N + len(prompt) + len(gen) - 1], cache)[-1].argmax())
        return gen, logits

    def session(self, no: int, text: str) -> None:
        N = self.n
        prompt = self.tok.encode(text, bos=N == 0)
        print(f"\nsession {no} (history {N} tokens; memory budget {budget_for(N)}):")
        show("  new text: ", text)
        cache = KVCache(self.cfg, N + len(prompt) + GEN + 1)
        if N > 0:
            self.kvmem_memory(prompt, cache, True)
        mem_rows = cache.n
        gen, _ = self.continue_text(cache, prompt, N)
        show("  continued with kvmem memory: " if N > 0 else "  continued: ", self.tok.decode(gen))
        # the session and its continuation, from the engine's cache as computed (post-RoPE keys)
        ids = prompt + gen
        kt.append(self.agent, cache, start=mem_rows, stop=mem_rows + len(ids), positions=N, token_ids=ids)
        self.agent.flush()
        print(f"  tokens through the model: {len(prompt)} new + {len(prompt) if N else 0} probe "
              f"(a text agent re-reading its history: {N + len(prompt)})")

    def last_session_logits(self) -> torch.Tensor:
        """The last session's prompt logits over kvmem's memory of the agent as it stands."""
        prompt = self.tok.encode(SESSIONS[-1], bos=False)
        N = self.n
        cache = KVCache(self.cfg, N + len(prompt))
        self.kvmem_memory(prompt, cache, False)
        return self.model(prompt, range(N, N + len(prompt)), cache)


def phase1(agent: StoryAgent, state: str) -> None:
    for i, text in enumerate(SESSIONS[:-1]):
        agent.session(i + 1, text)
    logits = agent.last_session_logits()
    path = os.path.join(state, "story-agent.safetensors")
    agent.agent.save(path)
    # the C demo's format: the prompt's logits as raw float32
    with open(os.path.join(state, "story-expect.bin"), "wb") as f:
        f.write(logits.contiguous().numpy().tobytes())
    print(f"\nsaved the agent ({agent.n} tokens) to {path}")


def phase2(agent: StoryAgent, state: str) -> int:
    path = os.path.join(state, "story-agent.safetensors")
    agent.agent.load(path)
    print(f"\nrestart: a new process loaded the agent 'story-agent' ({agent.n} tokens) from {path}")
    got = agent.last_session_logits()
    with open(os.path.join(state, "story-expect.bin"), "rb") as f:
        want = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).view(got.shape)
    worst = float((got - want).abs().max())
    print(f"  the next session's prompt over the loaded memory: logits "
          f"{'identical to phase 1' if worst == 0 else 'DIFFER from phase 1'} (max difference {worst:g})")
    if worst != 0:
        return 1
    agent.session(len(SESSIONS), SESSIONS[-1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_model = os.environ.get("KVMEM_TEST_MODEL") or os.path.join(ROOT, "..", "shared", "models",
                                                                       "stories260K.bin")
    ap.add_argument("--model", default=default_model, help="llama2.c checkpoint (default: %(default)s)")
    ap.add_argument("--tokenizer", help="llama2.c tokenizer (default: tok512.bin beside the model)")
    ap.add_argument("--state", default="/tmp", help="directory for the agent's file (default: %(default)s)")
    ap.add_argument("--phase", choices=("1", "2", "all"), default="all")
    a = ap.parse_args()
    tok_path = a.tokenizer or os.path.join(os.path.dirname(a.model), "tok512.bin")
    for what, p in (("model", a.model), ("tokenizer", tok_path)):
        if not os.path.isfile(p):
            ap.error(f"no {what} at {p}")
    if not os.path.isdir(a.state):
        ap.error(f"--state {a.state}: not a directory")
    model = load_llama2c(a.model)
    tok = Tokenizer(tok_path, model.cfg.vocab)
    c = model.cfg
    print(f"PyTorch {torch.__version__} agent on {a.model} (dim {c.dim}, {c.n_layers} layers, "
          f"{c.n_heads}/{c.n_kv_heads} heads, vocab {c.vocab}); its KV memory is a kvmem agent (f16, blocks of "
          f"{BLOCK})")
    rc = 0
    if a.phase in ("1", "all"):
        phase1(StoryAgent(model, tok), a.state)
    if a.phase in ("2", "all"):
        rc = phase2(StoryAgent(model, tok), a.state)
    return rc


if __name__ == "__main__":
    sys.exit(main())
