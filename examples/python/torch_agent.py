#!/usr/bin/env python3
"""A story agent on a real model in PyTorch whose memory is kvmem (kvmem.torch).

The model is stories260K (llama2.c checkpoint, a Llama with grouped-query
attention) run as a PyTorch module on the CPU in float32, with its tokenizer;
the agent is the C story demo's (examples/tinyllm/story.c) in Python:

  * Sessions of a story arrive as text; the story grows to several of the
    model's windows (512 tokens for stories260K). Each session is read in one
    window, shared as the C demo shares it (kvmem_window_split): a quarter of
    it for retrieved memory (128 tokens), an eighth for the live context (the
    newest 64 tokens, from a block boundary), the rest for the new text.
  * The memory is MemArt as deployed: the prompt's pre-RoPE queries (collected
    by kvmem.torch.QueryCapture's hooks on the q_proj modules while the prompt
    runs over the newest 32 tokens) score the agent's blocks by their key
    boxes; the 8 best are placed as runs of adjacent blocks, the best run
    nearest the text (kvmem_arrange's RUNS order), re-encoded (RoPE) from
    position 0, and the live context follows them, re-encoded too.
  * The engine prefills only the prompt on that memory (its past_key_values)
    and the session's text is appended to the agent straight from the
    engine's cache (no copy).
  * Phase 1 runs sixteen sessions and saves the agent to one file; phase 2, a
    new process, loads it, checks that the next prompt's logits are the ones
    phase 1 computed, and continues the last session, which begins a sentence
    whose next word is a name said only in session 1, 3.6 windows back.
    (The C demo also continues it on text RAG, the recent window and the
    whole history; this example keeps to kvmem's part.)

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
    'Once upon a time, there was a little girl named Sue. Sue had a red kite. Every day, Sue took her kite to '
    'the park with her mom. Sue ran fast, and the kite flew high in the sky. Sue laughed and said, "Look, '
    'Mom, my kite is dancing!"',
    'The sun was warm and the sky was blue. A little bird sat on a branch and sang a happy song. The bird had '
    'a nest with three small eggs. Every day, the bird sat on the eggs to keep them warm. One morning, the '
    'eggs began to crack, and three baby birds came out.',
    'A big brown cow lived on a farm. The cow ate green grass all day. At night, the cow slept in a warm '
    'barn. The farmer had a dog named Spot. Spot liked to run around the cow and bark. The cow did not mind. '
    'She just kept eating her grass and said, "Moo!"',
    'In the forest, there was a tall tree. A family of squirrels lived in the tree. They gathered nuts for '
    'the winter. The baby squirrel was very small, but he wanted to help. He found a big nut and carried it '
    'all the way home. His mom was very proud of him.',
    'The rain fell on the roof. Drip, drop, drip, drop. The puddles in the street got bigger and bigger, and '
    'the frogs were very happy. They jumped from puddle to puddle and sang their froggy songs. When the rain '
    'stopped, a big rainbow came out in the sky.',
    'The moon was big and bright. The stars were shining in the dark sky. An owl sat on a fence and said, '
    '"Hoo, hoo." A little mouse heard the owl and ran into his hole. He was scared, but the owl only wanted '
    'to say hello.',
    'A small fish swam in the river. The water was cool and clear. The fish saw a shiny stone at the bottom '
    'and swam around it. A big turtle came by and said, "That stone is my friend." The fish and the turtle '
    'played together all afternoon.',
    'The bees were busy in the garden. They flew from flower to flower. They made sweet honey in their hive. '
    'A bear smelled the honey and came to the hive. The bees buzzed very loud, and the bear ran away into the '
    'woods.',
    'The sea was big and blue. The waves went up and down. A crab walked sideways on the sand and hid under a '
    'rock. A seagull flew over the water and looked for fish. The sun went down, and the sky turned orange '
    'and pink.',
    'The snow was white and cold. It covered the houses and the trees. A snowman with a carrot nose stood in '
    'a yard. A little rabbit hopped by and looked at the carrot. The rabbit was hungry, but he did not eat '
    "the snowman's nose.",
    'A big red truck drove down the road. It was full of toys for the children in the town. The driver was a '
    'kind man with a big smile. He stopped at every house and gave each child a toy. The children clapped and '
    'cheered.',
    'The wind blew through the tall grass. A lion sat on a hill and looked at the land. He was the king of '
    'the animals. A small monkey came and sat next to him. Together they watched the sun go down over the '
    'trees.',
    'The old clock in the hall went tick, tock, tick, tock. A little mouse lived behind the clock. Every '
    'night, when the house was quiet, the mouse came out to look for crumbs. One night he found a big piece '
    'of cheese under the table.',
    'A family of ducks lived by the pond. The mother duck had five yellow ducklings. They walked in a line '
    'behind her, one, two, three, four, five. They jumped into the water and swam to the other side, where '
    'the grass was soft and green.',
    'The train went choo, choo over the hills. It carried people to the big city. A boy looked out of the '
    'window and counted the cows in the fields. He saw ten cows, two horses and a big black dog.',
    'The baker made bread every morning. The bread was warm and smelled very good. People came from all over '
    'the town to buy it. The baker also made little cakes with pink icing, and the children loved them.',
    'The next morning,',
]
# The girl session 1 names: the word the last session's continuation recalls or not.
NAME = "Sue"
# story_session.h's: tokens generated, the probe's window, the window's shares (retrieved memory, live context)
GEN, PROBE_WINDOW, BLOCK, MEM_SHARE, LIVE_SHARE = 20, 32, 16, 0.25, 0.125


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

def window_split(window: int, reserve: int, memory_share: float, live_share: float, block: int):
    """kvmem_window_split: (memory tokens in whole blocks, live context tokens);
    the header's contract in plain Python where the binding lacks it."""
    if hasattr(kvmem, "window_split"):
        plan = kvmem.window_split(window, reserve, memory_share, live_share, block)
        return plan.memory_tokens, plan.live_tokens
    room = window - reserve
    memory = int(math.floor(memory_share * window + 1e-9)) // block * block
    if memory > room:
        memory = room // block * block
    left = room - memory
    live = int(math.floor(live_share * window + 1e-9)) if live_share > 0 else left
    return memory, min(live, left)


def arrange_runs(blocks: list, scores: list) -> list:
    """kvmem_arrange's RUNS order (first = farthest from the new tokens): runs
    of adjacent block ids kept whole and ascending inside, the runs by
    ascending best score (ties: the older run first), the best run last; the
    header's contract in plain Python where the binding lacks kvmem.arrange."""
    if hasattr(kvmem, "arrange"):
        return [int(b) for b in kvmem.arrange(blocks, scores, "runs")]
    units = sorted(zip(blocks, scores))
    runs = []
    for b, sc in units:
        if runs and b == runs[-1][-1][0] + 1:
            runs[-1].append((b, sc))
        else:
            runs.append([(b, sc)])
    order = sorted(range(len(runs)), key=lambda r: (max(sc for _, sc in runs[r]), r))
    return [b for r in order for b, _ in runs[r]]


def show(text: str, cut: int = 0) -> str:
    """story.c's print_text: quoted, line breaks as spaces, cut after `cut` UTF-8 bytes (0: whole)."""
    raw = text.encode()
    if cut and len(raw) > cut:
        while cut > 0 and (raw[cut] & 0xC0) == 0x80:
            cut -= 1
        return '"' + raw[:cut].decode("utf-8", "replace").replace("\n", " ") + ' ..."'
    return '"' + text.replace("\n", " ") + '"'


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

    def windows(self, n: int) -> str:
        return f"{n / self.cfg.seq_len:.1f}"

    def put_tokens(self, first: int, n: int, cache: KVCache) -> None:
        """History tokens [first, first + n) appended to the cache, keys re-encoded
        at the cache's next positions (tinyllm's tl_window_put_tokens)."""
        if n <= 0:
            return
        k, v = self.agent.read(first, n)  # raw keys [L, n, kv heads, head_dim]
        L_, _, H, D = k.shape
        pos = torch.arange(cache.n, cache.n + n, dtype=torch.int32)[None, :, None].expand(L_, n, H)
        kvmem.rope_apply(self.spec, k.reshape(-1, D), pos.contiguous().numpy().reshape(-1))
        cache.K[:, 0, :, cache.n:cache.n + n] = torch.from_numpy(k).permute(0, 2, 1, 3)
        cache.V[:, 0, :, cache.n:cache.n + n] = torch.from_numpy(v).permute(0, 2, 1, 3)
        cache.n += n

    def probe(self, prompt: list) -> torch.Tensor:
        """The prompt's pre-RoPE queries [n, n_layers, n_heads, head_dim] over the
        newest history, re-encoded from position 0."""
        N = self.n
        w = min(PROBE_WINDOW, N)
        cache = KVCache(self.cfg, w + len(prompt))
        self.put_tokens(N - w, w, cache)
        with kt.QueryCapture(self.model) as cap:
            self.model(prompt, range(w, w + len(prompt)), cache)
            return cap.queries(self.spec)

    def memory(self, prompt: list, cache: KVCache) -> dict:
        """kvmem's window for the prompt, as the C demo builds it: the window's
        shares (retrieved memory, live context) and, from position 0, the
        retrieved blocks placed as runs, then the live context (from a block
        boundary), all re-encoded; the prompt follows."""
        N = self.n
        memory, live = window_split(self.cfg.seq_len, len(prompt) + GEN, MEM_SHARE, LIVE_SHARE, BLOCK)
        live = min(live, N)
        live_first = min(-(-(N - live) // BLOCK) * BLOCK, N)
        blocks = []
        if N:
            info = self.agent.get_info()
            cand = 0  # sealed blocks wholly before the live context
            while cand < info.n_sealed:
                bi = self.agent.block_info(cand)
                if bi.first_token + bi.n_tokens > live_first:
                    break
                cand += 1
            top_k = memory // BLOCK
            if cand > 0 and top_k > 0:
                hits = kt.retrieve(self.agent, self.probe(prompt), top_k=top_k, skip_recent=info.n_sealed - cand,
                                   mode=kvmem.RETRIEVE_AABB, norm=kvmem.NORM_SOFTMAX, agg=kvmem.AGG_MAX)
                ids, scores = hits.get()
                blocks = arrange_runs([int(b) for b in ids], [float(s) for s in scores])
                if blocks:
                    kt.gather(self.agent, blocks, 0, out=cache)
                    cache.n = hits.n_tokens()
        self.put_tokens(live_first, N - live_first, cache)
        return {"blocks": blocks, "local": N - live_first}

    def continue_text(self, cache: KVCache, prompt: list):
        """Prefill the prompt on the memory in the cache, then continue greedily
        for up to GEN tokens (to a story boundary). Returns (continuation ids,
        the prompt's logits)."""
        base = cache.n
        logits = self.model(prompt, range(base, base + len(prompt)), cache)
        t, gen = int(logits[-1].argmax()), []
        while len(gen) < GEN and t > 2:  # 0 unk, 1 BOS, 2 EOS: the story ends
            gen.append(t)
            if len(gen) == GEN:
                break  # nothing reads the last token's logits
            t = int(self.model([t], [base + len(prompt) + len(gen) - 1], cache)[-1].argmax())
        return gen, logits

    def window_cache(self) -> KVCache:
        """One window of the model, as the C demo allocates it."""
        return KVCache(self.cfg, self.cfg.seq_len)

    def session(self, text: str) -> dict:
        """One session of phase 1: the prompt read on kvmem's window, its rows
        (the session's text, as the engine computed them) appended to the agent.
        The continuation is the model's guess, not the story: it stays out."""
        N = self.n
        prompt = self.tok.encode(text, bos=N == 0)
        cache = self.window_cache()
        info = self.memory(prompt, cache)
        mem_rows = cache.n
        self.model(prompt, range(mem_rows, mem_rows + len(prompt)), cache)
        kt.append(self.agent, cache, start=mem_rows, stop=mem_rows + len(prompt), positions=mem_rows,
                  token_ids=prompt)
        return {"prompt": prompt, "history": N, **info}

    def prompt_logits(self, text: str) -> torch.Tensor:
        """A prompt's logits over kvmem's window of the agent as it stands."""
        prompt = self.tok.encode(text, bos=self.n == 0)
        cache = self.window_cache()
        self.memory(prompt, cache)
        return self.model(prompt, range(cache.n, cache.n + len(prompt)), cache)

    def text(self, first: int, n: int) -> str:
        return show(self.tok.decode(self.agent.tokens(first, n)))


def phase1(agent: StoryAgent, state: str) -> None:
    print(f"\nphase 1: {len(SESSIONS) - 1} sessions of a story go into the agent")
    prefilled = probed = reread = 0
    for i, text in enumerate(SESSIONS[:-1]):
        r = agent.session(text)
        np_, N = len(r["prompt"]), agent.n
        print(f"  session {i + 1:2d}, {np_:3d} tokens (history {N:4d}, {agent.windows(N)} windows) {show(text, 44)}")
        prefilled += np_
        probed += np_ if r["blocks"] else 0
        reread += r["history"] + np_
    logits = agent.prompt_logits(SESSIONS[-1])
    path = os.path.join(state, "story-agent.safetensors")
    agent.agent.save(path)
    # the C demo's format: the prompt's logits as raw float32
    with open(os.path.join(state, "story-expect.bin"), "wb") as f:
        f.write(logits.contiguous().numpy().tobytes())
    N = agent.n
    print(f"saved the agent ({N} tokens, {agent.windows(N)} windows of the model) to {path}\n"
          f"kvmem ran {prefilled + probed} tokens through the model ({prefilled} of text, {probed} of probes); "
          f"a text agent re-reading its history each session: {reread}")


def phase2(agent: StoryAgent, state: str) -> int:
    path = os.path.join(state, "story-agent.safetensors")
    agent.agent.load(path)
    N = agent.n
    print(f"\nphase 2: a new process loaded the agent 'story-agent' ({N} tokens) from {path}")
    got = agent.prompt_logits(SESSIONS[-1])
    with open(os.path.join(state, "story-expect.bin"), "rb") as f:
        want = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).view(got.shape)
    worst = float((got - want).abs().max())
    print(f"  the next session's prompt over the loaded memory: logits "
          f"{'identical to phase 1' if worst == 0 else 'DIFFER from phase 1'} (max difference {worst:g})")
    if worst != 0:
        return 1
    text = SESSIONS[-1]
    prompt = agent.tok.encode(text, bos=N == 0)
    cache = agent.window_cache()
    info = agent.memory(prompt, cache)
    print(f"\nsession {len(SESSIONS)} (history {N} tokens, {agent.windows(N)} windows of the model): {show(text)}")
    print(f"  (the next word, in a story of this kind, is its girl's name: {NAME}, named in session 1 only)")
    nb = len(info["blocks"])
    print(f"  kvmem retrieved {nb} block{'' if nb == 1 else 's'} of 16 tokens by the text's queries against the "
          f"blocks' key boxes (placed: runs of adjacent blocks, the best run nearest the text):")
    for b in info["blocks"]:
        bi = agent.agent.block_info(b)
        print(f"    block {b:3d}  tokens {bi.first_token:4d}-{bi.first_token + bi.n_tokens - 1:<4d} "
              f"{agent.text(bi.first_token, bi.n_tokens)}")
    if info["local"]:
        print(f"  it ends with the live context, the newest {info['local']} tokens: "
              f"{agent.text(N - info['local'], info['local'])}")
    gen, _ = agent.continue_text(cache, prompt)
    print("  continued on               tokens run through the model")
    print(f"    kvmem's memory           {f'{2 * len(prompt)}: the text + its probe':<28} "
          f"{show(agent.tok.decode(gen))}")
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
