"""Results of the info calls as frozen dataclasses (readable reprs, equality,
``dataclasses.asdict``) instead of the ctypes structs C fills. Field names are
the C ones; 0/1 flags are bools; ``reserved`` fields are left out."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, fields
from typing import Any, Type, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class PoolInfo:
    """kvmem_pool_info: bytes used and allowed, agents, block size, storage dtype code."""
    used_bytes: int
    capacity_bytes: int
    n_agents: int
    block_size: int
    storage_dtype: int


@dataclass(frozen=True)
class AgentInfo:
    """kvmem_agent_info: tokens, blocks (sealed ones retrievable), bytes of KV and of text."""
    n_tokens: int
    n_blocks: int
    n_sealed: int
    bytes: int
    text_bytes: int


@dataclass(frozen=True)
class BlockInfo:
    """kvmem_block_info: the block's first token, its token count, whether it is sealed."""
    first_token: int
    n_tokens: int
    sealed: bool


@dataclass(frozen=True)
class SegmentsInfo:
    step: int
    n_segments: int
    n_indices: int
    n_groups: int
    n_static: int
    n_events: int


@dataclass(frozen=True)
class SegmentInfo:
    group: int
    alive: bool
    has_kv: bool
    last_update: int
    n_tokens: int


@dataclass(frozen=True)
class GroupInfo:
    state: int
    n_members: int
    has_kv: bool
    last_change: int
    n_tokens: int


@dataclass(frozen=True)
class KVStoreInfo:
    n_slots: int
    n_used: int
    n_free: int
    page_slots: int
    dead_slot: int


@dataclass(frozen=True)
class SlotMapInfo:
    length: int
    n_live: int
    protect: int
    n_parked: int


def from_struct(cls: Type[T], struct: ctypes.Structure) -> T:
    """cls from the same-named fields of a ctypes struct (bool fields from 0/1)."""
    vals: dict = {}
    for f in fields(cls):  # type: ignore[arg-type]
        v: Any = getattr(struct, f.name)
        vals[f.name] = bool(v) if f.type in ("bool", bool) else v
    return cls(**vals)
