"""kvmem.hf: a KV cache with HF transformers' ``Cache`` protocol whose session
lives in a kvmem agent.

    import kvmem, kvmem.hf
    cache = kvmem.hf.KvmemCache(agent, budget=1024, window=256, model=model)
    for user_ids in turns:                          # [1, n] token ids of each new turn
        ids = cache.begin_turn(user_ids)            # memory retrieved for this turn
        out = model.generate(ids, past_key_values=cache, max_new_tokens=64)
        # (the last generated token was never run through the model: the next turn's
        #  user_ids start with it, as they would for a DynamicCache)

Needs torch (kvmem.torch); transformers is optional: when it is importable
the class derives from ``transformers.cache_utils.Cache`` so transformers'
``isinstance`` checks take it as a cache object.

What the model sees. At each turn the cache holds one context, at contiguous
positions 0, 1, 2, ...: the memory (sealed blocks kvmem_retrieve selects for
the turn, at most ``budget`` tokens, in chronological order), then the live
window (the newest ``window`` tokens, rounded out to whole blocks, and the
unsealed tail), re-encoded with RoPE at those new positions (kvmem_gather,
MemArt's decoupled position encoding). New tokens follow at the next
positions; ``update`` appends each forward's keys and values to the context
(what the model attends over) and to the agent (the whole session; keys
de-rotated from the positions they were rotated at, token ids when the cache
was given the model).

Positions. ``get_seq_length()`` is the context's length, so a model must run
new tokens at ``cache_position = arange(get_seq_length(), get_seq_length() + n)``
and ``position_ids = cache_position[None]`` -- what HF's models and
``generate`` do by themselves when ``input_ids`` holds one id per context row
followed by the new ones (``begin_turn`` returns exactly that) and the
attention mask is all ones. The session's own token count (``n_tokens``) is
larger than the context once memory was selected; models must not use it as
a position. ``update`` checks ``cache_kwargs["cache_position"]`` where the
model passes it (HF's Llama does) and refuses other positions, since the
agent would de-rotate those keys at the wrong angle.

The retrieval needs the turn's query states before the turn runs with its
memory: ``begin_turn(new_ids)`` runs the new tokens once over the live window
alone with a ``QueryCapture`` on the model's query projections (pre-RoPE), a
pass that writes nothing to the agent; ``begin_turn(queries=...)`` takes
query states the caller recorded instead. When the budget holds every
candidate block no retrieval runs, and a context that is already what the
turn needs (every token at its own position) is kept as it is.

Batches. A context is shared by every row of a batch (beams); the agent keeps
one session, so rows produced while the batch is larger than one stay in the
cache until ``keep_row(i)`` picks the row to keep. ``reorder_cache`` and the
other batch methods act on the cache's rows.

Storage. The context of every layer lives in one tensor per K and V
([n_layers, batch, n_kv_heads, capacity, head_dim], grown by half when full);
``update``, ``key_cache``, ``value_cache`` and ``to_legacy_cache`` return views
of it. A turn's rows stay where they are until the next ``begin_turn`` or
``load``, which writes the new context into the same storage when it fits
(as transformers' StaticCache reuses its buffers): clone what you keep across
turns.

CPU tensors only, as kvmem.torch: device tensors are refused with the reason.
"""
from __future__ import annotations

import inspect
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch as _torch

from . import torch as _kt
from ._errors import InvalidArgumentError, InvalidTypeError
from ._objects import Agent, Retrieval, SCOPE_GLOBAL, rope_apply

__all__ = ["KvmemCache"]


def _cache_base() -> type:
    try:  # transformers' generate() and models check isinstance(past_key_values, Cache)
        from transformers.cache_utils import Cache
    except Exception:
        return object
    return Cache


_CacheBase = _cache_base()

# parameters of kt.retrieve the cache sets itself
_DERIVED = {"top_k": "budget // block_size", "skip_recent": "the live window's blocks"}


class KvmemCache(_CacheBase):  # type: ignore[misc, valid-type]
    """An HF-style KV cache over a kvmem agent (see the module doc).

    agent: the session's kvmem.Agent (its pool's spec is the model's geometry).
    budget: the most memory tokens retrieved per turn (whole blocks:
        top_k = budget // block_size); None keeps every token (no retrieval).
    window: the newest tokens always in the context besides the memory.
    model: the torch model; lets ``begin_turn`` run the retrieval pass and
        records each forward's token ids (a hook on its input embedding).
    dtype: the context's dtype before the first ``update`` sets it (default:
        the model's floating dtype, else float32).
    query_proj: the name of the query projection modules (QueryCapture).
    retrieve_params: more kvmem_retrieve parameters (mode, norm, agg, tau,
        rr_c, recent_window, exclude, always_include).
    """

    is_compileable = False

    def __init__(self, agent: Agent, budget: Optional[int] = None, *, window: int = 0, model: Any = None,
                 dtype: Any = None, query_proj: str = "q_proj",
                 retrieve_params: Optional[Dict[str, Any]] = None):
        if _CacheBase is not object:
            try:
                super().__init__()
            except (TypeError, ValueError):  # newer transformers' Cache wants layer objects we do not use
                pass
        if not isinstance(agent, Agent):
            raise InvalidTypeError(f"kvmem.hf: agent must be a kvmem.Agent, got {type(agent).__name__}")
        for name, val in (("budget", budget), ("window", window)):
            if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val < 0):
                raise InvalidArgumentError(f"kvmem.hf: {name} must be a non-negative int, got {val!r}")
        params = dict(retrieve_params or {})
        for k in params:
            if k in _DERIVED:
                raise InvalidTypeError(f"kvmem.hf: retrieve_params[{k!r}] is set by the cache ({_DERIVED[k]})")
        if params.get("scope", SCOPE_GLOBAL) != SCOPE_GLOBAL:
            raise InvalidArgumentError("kvmem.hf: the context is one block set for every layer: scope must be GLOBAL")
        if dtype is not None and dtype not in _kt._DTYPES:
            raise InvalidTypeError(f"kvmem.hf: dtype {dtype} is not float32, float16 or bfloat16")
        self.agent = agent
        self.spec = agent.pool.spec
        self.block_size = agent.pool.get_info().block_size
        self.budget, self.window = budget, window
        self.retrieve_params = params
        self.query_proj = query_proj
        self.__dict__["model"] = model  # a plain reference, not a submodule when Cache is an nn.Module
        if dtype is None and model is not None:
            dtype = next((p.dtype for p in model.parameters() if p.dtype in _kt._DTYPES), None)
        self._dtype = dtype or _torch.float32
        n = self.spec.n_layers
        self._K: Optional[Any] = None  # [n_layers, batch, n_kv_heads, capacity, head_dim]
        self._V: Optional[Any] = None
        self._lens = [0] * n           # context rows per layer
        self._committed = 0            # context rows [0, _committed) are in the agent
        self._runs: List[List[int]] = []  # [agent_first, n] runs of the committed rows, in order
        self._recording = True
        self._ids: Optional[Any] = None
        self.blocks: List[int] = []    # the memory blocks of this turn (chronological)
        self.memory_tokens = 0         # their tokens: the context's rows before the live window
        self.retrieval: Optional[Retrieval] = None
        self._hook = None
        if model is not None:
            emb = self._input_embedding(model)
            if emb is not None:
                ref = weakref.ref(self)

                def record(_m: Any, inp: Any, _out: Any) -> None:
                    c = ref()
                    if c is not None and c._recording and inp and isinstance(inp[0], _torch.Tensor):
                        c._ids = inp[0].detach()
                self._hook = emb.register_forward_hook(record)

    # ---- the HF Cache protocol ------------------------------------------------------------------

    def update(self, key_states: Any, value_states: Any, layer_idx: int,
               cache_kwargs: Optional[Dict[str, Any]] = None) -> Tuple[Any, Any]:
        """Append one forward's K, V ``[batch, n_kv_heads, T, head_dim]`` (post-RoPE,
        at positions ``get_seq_length(layer_idx)`` on) to layer ``layer_idx`` and
        return the layer's whole context (views into the cache's storage). When
        every layer has the rows, they go to the agent."""
        k, v = key_states, value_states
        _kt._check(k, "key_states")
        _kt._check(v, "value_states")
        H, D, n_layers = self.spec.n_kv_heads, self.spec.head_dim, self.spec.n_layers
        if k.dim() != 4 or k.shape != v.shape or k.shape[1] != H or k.shape[3] != D:
            raise InvalidArgumentError(f"kvmem.hf: update(): key_states {tuple(k.shape)} and value_states "
                             f"{tuple(v.shape)} must both be [batch, {H}, T, {D}] (the pool's spec)")
        if k.dtype != v.dtype:
            raise InvalidTypeError(f"kvmem.hf: update(): key_states is {k.dtype}, value_states {v.dtype}")
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not 0 <= layer_idx < n_layers:
            raise InvalidArgumentError(f"kvmem.hf: update(): layer_idx {layer_idx!r} is outside [0, {n_layers})")
        B, T = k.shape[0], k.shape[2]
        start = self._lens[layer_idx]
        cp = (cache_kwargs or {}).get("cache_position")
        if cp is not None:
            cp = _torch.as_tensor(cp).reshape(-1)
            if not _torch.equal(cp.cpu().long(), _torch.arange(start, start + T)):
                first = int(cp[0]) if cp.numel() else None
                raise InvalidArgumentError(
                    f"kvmem.hf: update(): layer {layer_idx} got cache_position from {first} for {T} tokens, "
                    f"but the cache's context holds {start}: run new tokens at cache_position = "
                    f"arange(cache.get_seq_length(), ...) and position_ids = cache_position[None] (the "
                    f"context sits at positions 0..{start - 1}); with generate(), pass input_ids = "
                    f"cache.begin_turn(new_ids)")
        if self._K is not None and self._K.shape[1] not in (1, B):
            raise InvalidArgumentError(f"kvmem.hf: update(): a batch of {B} rows, the cache holds {self._K.shape[1]}")
        if self._K is None:
            self._dtype = k.dtype
            self._allocate(B, T)
        elif self._K.dtype != k.dtype:  # context gathered before the model's dtype was known
            self._dtype = k.dtype
            self._K, self._V = self._K.to(k.dtype), self._V.to(k.dtype)
        if self._K.shape[1] != B:  # rows share the context: one copy per row
            self._K = self._K.expand(-1, B, -1, -1, -1).contiguous()
            self._V = self._V.expand(-1, B, -1, -1, -1).contiguous()
        self._reserve(start + T)
        self._K[layer_idx, :, :, start:start + T] = k
        self._V[layer_idx, :, :, start:start + T] = v
        self._lens[layer_idx] = start + T
        self._commit()
        return self._K[layer_idx, :, :, :start + T], self._V[layer_idx, :, :, :start + T]

    def get_seq_length(self, layer_idx: Optional[int] = 0) -> int:
        """Context rows of the layer: the next token's position (cache_position)."""
        if self._K is None or layer_idx is None or not 0 <= layer_idx < len(self._lens):
            return 0
        return self._lens[layer_idx]

    def get_max_cache_shape(self) -> Optional[int]:
        """None: the context grows as needed (as DynamicCache)."""
        return None

    def get_max_length(self) -> Optional[int]:
        """None (older transformers' name of get_max_cache_shape)."""
        return None

    def get_usable_length(self, new_seq_length: int, layer_idx: Optional[int] = 0) -> int:
        """The context length (older transformers ask this before each forward)."""
        return self.get_seq_length(layer_idx)

    def get_mask_sizes(self, cache_position: Any, layer_idx: int = 0) -> Tuple[int, int]:
        """(kv_length, kv_offset) for the attention mask (newer transformers)."""
        return self.get_seq_length(layer_idx) + int(_torch.as_tensor(cache_position).shape[0]), 0

    @property
    def is_sliding(self) -> List[bool]:
        """Per layer: no sliding-window layers (every layer sees the whole context)."""
        return [False] * self.spec.n_layers

    @property
    def seen_tokens(self) -> int:
        """The context length (older transformers read it for the next position)."""
        return self.get_seq_length(0)

    @property
    def key_cache(self) -> List[Any]:
        """Per layer, the context's keys [batch, n_kv_heads, seq, head_dim] (views)."""
        return [k for k, _ in self]

    @property
    def value_cache(self) -> List[Any]:
        """Per layer, the context's values [batch, n_kv_heads, seq, head_dim] (views)."""
        return [v for _, v in self]

    def __len__(self) -> int:
        return 0 if self._K is None else self.spec.n_layers

    def __getitem__(self, layer_idx: int) -> Tuple[Any, Any]:
        if self._K is None:
            raise IndexError(f"kvmem.hf: the cache is empty (layer {layer_idx})")
        n = len(self)
        i = layer_idx + n if isinstance(layer_idx, int) and layer_idx < 0 else layer_idx
        if not isinstance(i, int) or not 0 <= i < n:
            raise IndexError(f"kvmem.hf: layer {layer_idx} is outside the cache's {n} layers")
        return self._K[i, :, :, :self._lens[i]], self._V[i, :, :, :self._lens[i]]

    def __iter__(self) -> Iterator[Tuple[Any, Any]]:
        for i in range(len(self)):
            yield self[i]

    def to_legacy_cache(self) -> Tuple[Tuple[Any, Any], ...]:
        """((k, v), ...) per layer: the context as a tuple cache."""
        return tuple(self)

    @classmethod
    def from_legacy_cache(cls, past_key_values: Any = None, *, agent: Agent, **kwargs: Any) -> "KvmemCache":
        """A cache over ``agent`` holding a tuple cache's context ((k, v) per layer,
        post-RoPE at positions 0..S-1, as one prefill leaves it): the rows are
        appended to the agent as well. kwargs: those of the constructor."""
        cache = cls(agent, **kwargs)
        if past_key_values is not None:
            ks, vs = _kt._layers(past_key_values, "past_key_values")
            if len(ks) != cache.spec.n_layers:
                raise InvalidArgumentError(f"kvmem.hf: past_key_values has {len(ks)} layers, the pool's spec "
                                 f"{cache.spec.n_layers}")
            for i, (k, v) in enumerate(zip(ks, vs)):
                cache.update(k, v, i)
        return cache

    def reorder_cache(self, beam_idx: Any) -> None:
        """Rows in the order beam search gives (index_select over the batch)."""
        if self._K is not None:
            idx = _torch.as_tensor(beam_idx, dtype=_torch.long).reshape(-1)
            self._K, self._V = self._K.index_select(1, idx), self._V.index_select(1, idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._K is not None:
            self._K = self._K.repeat_interleave(repeats, dim=1)
            self._V = self._V.repeat_interleave(repeats, dim=1)

    def batch_select_indices(self, indices: Any) -> None:
        self.reorder_cache(indices)

    def crop(self, max_length: int) -> None:
        """Keep the first max_length context rows (negative: drop that many from the
        end), as assisted decoding does. Only rows after the memory can go (the live
        window and what followed it); those the agent holds leave it too
        (kvmem_agent_truncate): they are the session's newest tokens."""
        if self._K is None:
            return
        total = max(self._lens)
        m = max(total + max_length if max_length < 0 else max_length, 0)
        if m >= total:
            return
        if m < self.memory_tokens:
            raise InvalidArgumentError(f"kvmem.hf: crop({max_length}): the first {self.memory_tokens} rows are retrieved "
                             f"memory, not the session's newest tokens; crop cannot remove them")
        if m < self._committed:
            drop = self._committed - m
            n_agent = self.agent.get_info().n_tokens
            if sum(n for _, n in self._runs[-1:]) < drop or self._runs[-1][0] + self._runs[-1][1] != n_agent:
                raise InvalidArgumentError(f"kvmem.hf: crop({max_length}): the agent's newest tokens are not the "
                                 f"context's last rows (it was appended to beside this cache)")
            self.agent.truncate(n_agent - drop)
            self._runs[-1][1] -= drop
            if not self._runs[-1][1]:
                self._runs.pop()
            self._committed = m
        self._lens = [min(x, m) for x in self._lens]

    # ---- kvmem: turns, rows, tokens -------------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        """Tokens of the session in the agent (more than the context once memory was selected)."""
        return self.agent.get_info().n_tokens

    def begin_turn(self, new_ids: Any = None, *, queries: Any = None) -> Any:
        """Build the turn's context: retrieve memory for the new tokens (at most
        ``budget`` tokens; a probe pass of new_ids over the live window gives the
        query states, or pass ``queries``: a QueryCapture, a tensor
        [n_q, n_layers, n_q_heads, head_dim], or per-layer [batch, n_q_heads, q_len,
        head_dim] pre-RoPE query states), gather it at positions 0.. and re-encode
        the live window after it. Returns the input_ids to give the model or
        ``generate`` (one id per context row, then new_ids: [1, context + n]), or
        None when new_ids is None."""
        self._need_one_row("begin_turn")
        ids = None if new_ids is None else _torch.as_tensor(new_ids, dtype=_torch.long).reshape(1, -1)
        info = self.agent.get_info()
        live_first = self._live_first_block(info)
        cand_tokens = self._block_start(live_first, info)
        if self.budget is None or cand_tokens <= self.budget:
            self.retrieval = None
            self._load(list(range(live_first)), live_first, info, reuse=(self._K, self._V))
        else:
            if queries is None and (ids is None or self.model is None):
                raise InvalidArgumentError("kvmem.hf: begin_turn(): the memory is larger than the budget, so the turn "
                                 "needs query states to retrieve with: give the new token ids and "
                                 "model= to the constructor, or queries=")
            state = self._state()
            try:  # the probe replaces the context (in new storage); a failure puts the previous one back
                if queries is None:
                    queries = self._probe(ids, live_first, info)
                r = _kt.retrieve(self.agent, queries, top_k=self.budget // self.block_size,
                                 skip_recent=info.n_sealed - live_first, **self.retrieve_params)
                self._load([int(b) for b in r.get()[0]], live_first, info, reuse=state[:2])
            except BaseException:
                self._restore(state)
                raise
            self.retrieval = r
        return None if ids is None else _torch.cat([self.context_ids(), ids], dim=1)

    def load(self, blocks: Sequence[int]) -> None:
        """Set the context to ``blocks`` (sealed, before the live window; in the
        order given) at positions 0.., then the live window: begin_turn's last step,
        for a selection made by the caller."""
        self._need_one_row("load")
        info = self.agent.get_info()
        live_first = self._live_first_block(info)
        ids = [int(b) for b in blocks]
        bad = [b for b in ids if not 0 <= b < live_first]
        if bad:
            raise InvalidArgumentError(f"kvmem.hf: load(): blocks {bad} are not sealed blocks before the live window "
                             f"(blocks 0..{live_first - 1})")
        self._load(ids, live_first, info, reuse=(self._K, self._V))

    def context_ids(self, unknown: int = 0) -> Any:
        """The token ids of the committed context rows, [1, n] (ids the agent does
        not know -- appended without token ids -- as ``unknown``)."""
        out = []
        for first, n in self._runs:
            out += self.agent.tokens(first, n)
        t = _torch.tensor(out, dtype=_torch.long).reshape(1, -1)
        return t.masked_fill(t < 0, unknown)

    def keep_row(self, row: int) -> None:
        """Keep batch row ``row`` alone (e.g. the best beam) and hand its new
        rows to the agent."""
        if self._K is None:
            return
        B = self._K.shape[1]
        if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < B:
            raise InvalidArgumentError(f"kvmem.hf: keep_row({row!r}): the batch has {B} rows")
        self._K, self._V = self._K[:, row:row + 1].clone(), self._V[:, row:row + 1].clone()
        self._ids = None  # the recorded ids are the batch's, not this row's alone
        self._commit()

    def close(self) -> None:
        """Take the token-id hook off the model (the agent stays open: it is the caller's)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # ---- internals ------------------------------------------------------------------------------

    @staticmethod
    def _input_embedding(model: Any) -> Any:
        get = getattr(model, "get_input_embeddings", None)
        if callable(get):
            return get()
        return next((m for n, m in model.named_modules() if n.split(".")[-1] == "embed_tokens"), None)

    def _need_one_row(self, what: str) -> None:
        if self._K is not None and self._K.shape[1] != 1 and min(self._lens) > self._committed:
            raise InvalidArgumentError(f"kvmem.hf: {what}(): the batch has {self._K.shape[1]} rows not yet in the "
                             f"agent; keep_row(i) picks the one the session keeps")

    _STATE = ("_K", "_V", "_lens", "_committed", "_runs", "blocks", "memory_tokens", "retrieval")

    def _state(self) -> Tuple[Any, ...]:
        return tuple(getattr(self, n) for n in self._STATE[:2]) + (list(self._lens), self._committed,
                                                                   [list(r) for r in self._runs]) + \
            tuple(getattr(self, n) for n in self._STATE[5:])

    def _restore(self, state: Tuple[Any, ...]) -> None:
        for n, val in zip(self._STATE, state):
            setattr(self, n, val)

    def _allocate(self, B: int, rows: int) -> None:
        cap = rows + max(64, rows // 2)
        shape = (self.spec.n_layers, B, self.spec.n_kv_heads, cap, self.spec.head_dim)
        self._K = _torch.empty(shape, dtype=self._dtype)  # rows past the context are never read
        self._V = _torch.empty(shape, dtype=self._dtype)

    def _reserve(self, rows: int) -> None:
        cap = self._K.shape[3]
        if rows <= cap:
            return
        new, used = max(rows, cap + cap // 2), max(self._lens)
        for name in ("_K", "_V"):
            old = getattr(self, name)
            t = _torch.empty(old.shape[:3] + (new, old.shape[4]), dtype=old.dtype)
            t[:, :, :, :used] = old[:, :, :, :used]
            setattr(self, name, t)

    def _layer_views(self) -> Tuple[Tuple[Any, Any], ...]:
        # full-capacity views of each layer: slices of one storage, so kvmem.torch hands them to C in place
        return tuple((self._K[i], self._V[i]) for i in range(self.spec.n_layers))

    def _commit(self) -> None:
        n = min(self._lens)
        if not self._recording or n <= self._committed or self._K.shape[1] != 1:
            return
        T = n - self._committed
        ids = self._ids.reshape(-1) if self._ids is not None and self._ids.numel() == T else None
        first = self.agent.get_info().n_tokens
        try:
            _kt.append(self.agent, self._layer_views(), start=self._committed, stop=n,
                       positions=self._committed, token_ids=ids)
        except BaseException:  # (non-finite values): the forward's rows leave the context as well
            self._lens = [self._committed] * self.spec.n_layers
            raise
        if self._runs and self._runs[-1][0] + self._runs[-1][1] == first:
            self._runs[-1][1] += T
        else:
            self._runs.append([first, T])
        self._committed = n
        self._ids = None

    def _block_end(self, b: int) -> int:
        bi = self.agent.block_info(b)
        return bi.first_token + bi.n_tokens

    def _block_start(self, b: int, info: Any) -> int:
        """First token of sealed block b (b == n_sealed: of the unsealed tail)."""
        if b < info.n_sealed:
            return self.agent.block_info(b).first_token
        return self._block_end(b - 1) if b > 0 else 0

    def _live_first_block(self, info: Any) -> int:
        """The first sealed block of the live window: the blocks holding any of the
        newest `window` tokens (the unsealed tail is live as well)."""
        b = info.n_sealed
        while b > 0 and self._block_end(b - 1) > info.n_tokens - self.window:
            b -= 1
        return b

    def _load(self, blocks: List[int], live_first: int, info: Any, reuse: Tuple[Any, Any] = (None, None)) -> None:
        """Context = blocks, then the live sealed blocks, then the tail, at positions 0..;
        written into the storage `reuse` when it fits (a new context's pages cost
        more than its copy where memory is first touched), else into new storage."""
        seq = blocks + list(range(live_first, info.n_sealed))
        spans = [(bi.first_token, bi.n_tokens) for bi in map(self.agent.block_info, seq)]
        tail_first = spans[-1][0] + spans[-1][1] if live_first < info.n_sealed else \
            self._block_start(info.n_sealed, info)
        runs: List[List[int]] = []
        for first, n in spans + [(tail_first, info.n_tokens - tail_first)]:
            if runs and runs[-1][0] + runs[-1][1] == first:
                runs[-1][1] += n
            elif n:
                runs.append([first, n])
        self.blocks = blocks
        self.memory_tokens = sum(n for _, n in spans[:len(blocks)])
        if runs == self._runs and self._K is not None and max(self._lens) == self._committed:
            return  # the context is already this one (e.g. the whole session, every token at its own position)
        total = sum(n for _, n in runs)
        K, V = reuse
        if K is not None and K.shape[1] == 1 and K.dtype == self._dtype and K.shape[3] >= total:
            self._K, self._V = K, V
        else:
            self._allocate(1, total)
        self._lens = [total] * self.spec.n_layers
        self._committed, self._runs = total, runs
        m = sum(n for _, n in spans)
        if seq:
            _kt.gather(self.agent, seq, 0, out=self._layer_views())
        n_tail = total - m
        if n_tail:  # not sealed, so not gatherable: raw rows rotated at their new positions here
            k, v = self.agent.read(tail_first, n_tail)
            L, _, H, D = k.shape
            pos = _torch.arange(m, total, dtype=_torch.int32)[None, :, None].expand(L, n_tail, H)
            rope_apply(self.spec, k.reshape(-1, D), pos.contiguous().numpy().reshape(-1))
            self._K[:, 0, :, m:total] = _torch.from_numpy(k).permute(0, 2, 1, 3)
            self._V[:, 0, :, m:total] = _torch.from_numpy(v).permute(0, 2, 1, 3)

    def _probe(self, ids: Any, live_first: int, info: Any) -> Any:
        """Run the new tokens over the live window alone, recording the pre-RoPE
        query states and writing nothing to the agent."""
        self._load([], live_first, info)
        W = self.get_seq_length(0)
        cp = _torch.arange(W, W + ids.shape[1])
        kwargs: Dict[str, Any] = dict(input_ids=ids, position_ids=cp[None], past_key_values=self, use_cache=True)
        try:
            if "cache_position" in inspect.signature(self.model.forward).parameters:
                kwargs["cache_position"] = cp
        except (TypeError, ValueError):
            pass
        cap = _kt.QueryCapture(self.model, name=self.query_proj)
        self._recording = False
        try:
            with _torch.no_grad():
                self.model(**kwargs)
        finally:
            self._recording = True
            cap.remove()
            self._lens = [self._committed] * self.spec.n_layers  # the probe's rows are dropped
        return cap
