"""A small Llama in the shape of HF transformers' LlamaForCausalLM (4.38-4.46,
eager attention), for testing caches without transformers: the attention
rotates q and k at ``position_ids``, calls ``past_key_value.update(k, v,
layer_idx, {"sin", "cos", "cache_position"})`` and masks key j for the query
at ``cache_position[i]`` when ``j > cache_position[i]``, as transformers'
causal mask does; the model fills ``cache_position`` and ``position_ids``
from ``past_key_values.get_seq_length()`` when they are not given. Also:
``PlainCache`` (transformers' DynamicCache: per-layer tensors, concatenated)
and ``greedy_generate`` (the loop ``generate(do_sample=False)`` runs)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn


class Config(SimpleNamespace):
    def __init__(self, n_layers=2, n_q_heads=4, n_kv_heads=2, head_dim=16, dim=32, vocab=64, theta=10000.0,
                 kv_dtype=torch.float32):
        super().__init__(n_layers=n_layers, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
                         dim=dim, vocab=vocab, theta=theta, kv_dtype=kv_dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg, layer_idx):
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        self.q_proj = nn.Linear(cfg.dim, cfg.n_q_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_q_heads * cfg.head_dim, cfg.dim, bias=False)
        self.seen = []  # (query_states before RoPE, keys, values the attention read): for the tests

    def forward(self, x, cos, sin, cache_position, past_key_value):
        c = self.cfg
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, c.n_q_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q_raw = q
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.to(c.kv_dtype), v.to(c.kv_dtype)  # the cache's dtype (bf16/f16 caches)
        if past_key_value is not None:
            k, v = past_key_value.update(k, v, self.layer_idx,
                                         {"sin": sin, "cos": cos, "cache_position": cache_position})
        self.seen.append((q_raw, k, v))
        rep = c.n_q_heads // c.n_kv_heads
        kf, vf = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
        att = (q @ kf.transpose(-1, -2)) / math.sqrt(c.head_dim)
        hidden = torch.arange(k.shape[2])[None, :] > cache_position[:, None]
        att = att.masked_fill(hidden, float("-inf")).softmax(-1)
        o = (att @ vf).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(o)


class HFLlama(nn.Module):
    """model.layers[i].self_attn.{q,k,v,o}_proj, model.embed_tokens, lm_head."""

    def __init__(self, cfg=None, seed=0):
        super().__init__()
        self.cfg = cfg = cfg or Config()
        torch.manual_seed(seed)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab, cfg.dim)
        self.model.layers = nn.ModuleList()
        for i in range(cfg.n_layers):
            layer = nn.Module()
            layer.self_attn = Attention(cfg, i)
            layer.mlp = nn.Linear(cfg.dim, cfg.dim)
            self.model.layers.append(layer)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def clear_seen(self):
        for layer in self.model.layers:
            layer.self_attn.seen.clear()

    @torch.no_grad()
    def forward(self, input_ids, position_ids=None, past_key_values=None, use_cache=True, cache_position=None):
        c = self.cfg
        T = input_ids.shape[1]
        if cache_position is None:
            past = past_key_values.get_seq_length() if past_key_values is not None else 0
            cache_position = torch.arange(past, past + T)
        if position_ids is None:
            position_ids = cache_position[None]
        inv = c.theta ** (-torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim)
        ang = position_ids[0].double()[:, None] * inv[None]
        cos = torch.cat((ang.cos(), ang.cos()), -1).float()
        sin = torch.cat((ang.sin(), ang.sin()), -1).float()
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = x + layer.self_attn(x, cos, sin, cache_position, past_key_values)
            x = x + torch.tanh(layer.mlp(x))
        return SimpleNamespace(logits=self.lm_head(x), past_key_values=past_key_values)


class PlainCache:
    """transformers' DynamicCache, as far as the model and the loop use it."""

    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def update(self, k, v, layer_idx, cache_kwargs=None):
        if len(self.key_cache) <= layer_idx:
            self.key_cache.append(k)
            self.value_cache.append(v)
        else:
            self.key_cache[layer_idx] = torch.cat([self.key_cache[layer_idx], k], dim=-2)
            self.value_cache[layer_idx] = torch.cat([self.value_cache[layer_idx], v], dim=-2)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def get_seq_length(self, layer_idx=0):
        return 0 if len(self.key_cache) <= layer_idx else self.key_cache[layer_idx].shape[-2]


def greedy_generate(model, input_ids, cache, max_new_tokens):
    """generate(input_ids, past_key_values=cache, do_sample=False): the ids not in
    the cache yet (cache_position from cache.get_seq_length()) are prefilled, then
    one token at a time; position_ids from the all-ones attention mask. Returns
    the whole sequence and the logits of each generated token."""
    cache_position = torch.arange(cache.get_seq_length(), input_ids.shape[1])
    seq, logits = input_ids, []
    for _ in range(max_new_tokens):
        inp = seq[:, cache_position]
        position_ids = (torch.ones_like(seq).cumsum(-1) - 1)[:, -inp.shape[1]:]
        out = model(inp, position_ids=position_ids, past_key_values=cache, use_cache=True,
                    cache_position=cache_position)
        logits.append(out.logits[:, -1])
        seq = torch.cat([seq, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        cache_position = cache_position[-1:] + 1
    return seq, torch.cat(logits)
