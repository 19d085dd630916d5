#!/usr/bin/env python3
"""An agent loop that keeps its memory in kvmem across turns.

Each turn, the agent (1) asks kvmem which earlier blocks of its memory the new
message would attend to and prints them, then (2) appends the message's KV to
its memory. A real engine would take K/V (and the query rows) from the model's
attention layers; here a toy "model" gives every word a sparse key vector per
layer and KV head, so a message about mountains attends to the turn that
talked about mountains, which is what the printout shows.

Run with the kvmem package installed (pip install ./bindings/python) and numpy:
    python3 agent_loop.py
(from a checkout after `make build`: PYTHONPATH=bindings/python /usr/bin/python3 examples/python/agent_loop.py).
"""
from __future__ import annotations

import hashlib
import sys

import numpy as np

import kvmem

L, HQ, HKV, D, BS = 2, 4, 2, 64, 16
CONVERSATION = [
    "we plan a hiking trip to the mountains in june",
    "my sister is allergic to peanuts and shellfish",
    "the budget for the whole trip is two thousand euros",
    "please book a quiet hotel near the lake",
    "remind me which food my sister cannot eat",
    "how high are the mountains we will hike",
]


def word_key(word: str) -> np.ndarray:
    """[L][HKV][D]: each layer and KV head lights 3 dimensions chosen by a hash."""
    out = np.zeros((L, HKV, D), np.float32)
    for l in range(L):
        for h in range(HKV):
            dig = hashlib.blake2b(f"{l}/{h}/{word}".encode(), digest_size=6).digest()
            for j in range(3):
                out[l, h, int.from_bytes(dig[2 * j:2 * j + 2], "little") % D] = 1.0
    return out


class ToyModel:
    """Stands in for the engine: token ids, K/V for a message, query rows."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.words: dict[int, str] = {}

    def tokenize(self, text: str) -> list[str]:
        return text.split()

    def token_id(self, w: str) -> int:
        if w not in self.vocab:
            self.vocab[w] = len(self.vocab)
            self.words[self.vocab[w]] = w
        return self.vocab[w]

    def kv(self, words: list[str]) -> tuple[np.ndarray, np.ndarray]:
        k = np.stack([word_key(w) for w in words], axis=1)   # [L][T][HKV][D]
        v = k * 0.5
        return k, v

    def query(self, words: list[str]) -> np.ndarray:
        """[n_q][L][HQ][D]: each query head reads its KV head's key space."""
        q = np.zeros((len(words), L, HQ, D), np.float32)
        for i, w in enumerate(words):
            wk = word_key(w)
            for hq in range(HQ):
                q[i, :, hq] = wk[:, hq // (HQ // HKV)]
        return q


STOP = {"the", "a", "to", "in", "we", "my", "is", "and", "for", "me", "which", "of", "are", "will", "how", "please", "near", "whole", "cannot"}


def main() -> int:
    model = ToyModel()
    spec = kvmem.ModelSpec(n_layers=L, n_q_heads=HQ, n_kv_heads=HKV, head_dim=D, model_id="toy")
    with kvmem.Context("cpu") as ctx, ctx.pool_create(spec, block_size=BS) as pool, \
            pool.agent_open("assistant") as agent:
        can_retrieve = kvmem.has_function("kvmem_retrieve")
        for turn, msg in enumerate(CONVERSATION):
            words = model.tokenize(msg)
            print(f"turn {turn}: {msg!r}")
            info = agent.get_info()
            if info.n_sealed and can_retrieve:
                content = [w for w in words if w not in STOP]
                res = agent.retrieve(model.query(content), top_k=1)
                for b, score in zip(*res.get(0)):
                    bi = agent.block_info(int(b))
                    recalled = " ".join(model.words[t] for t in agent.tokens(bi.first_token, bi.n_tokens))
                    print(f"  retrieved block {int(b)} (score {score:.3f}): {recalled!r}")
                # the engine would prefill this re-encoded KV instead of recomputing it
                k, v = agent.gather(res.get(0)[0], base_position=0)
                print(f"  gathered {k.shape[1]} tokens of KV for the prompt")
            elif info.n_sealed:
                print("  (this libkvmem has no kvmem_retrieve yet)")
            ids = [model.token_id(w) for w in words]
            k, v = model.kv(words)
            offsets, pos = [], 0
            for w in words:
                pos = msg.index(w, pos)
                offsets.append(pos)
                pos += len(w)
            agent.append(k, v, token_ids=ids, text=msg, token_text_offsets=offsets)
            agent.flush()  # one block per turn, retrievable from the next turn on
        info = agent.get_info()
        print(f"memory: {info.n_tokens} tokens in {info.n_blocks} blocks, {info.bytes} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
