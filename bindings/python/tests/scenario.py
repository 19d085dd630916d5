"""The shared scenario (bindings/README.md): inputs from the integer formula of
bindings/fixture/scenario.c, and where the C-computed fixture lives."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List

L, HQ, HKV, D, BS = 2, 4, 2, 8, 4
AGENTS = [
    ("alice", 1, [(5, 0, "hello there"), (6, 0, "what is kv memory"), (3, 0, "ok")]),
    ("bob", 2, [(4, 0, "plan a trip"), (7, 1, "to the mountains")]),
]
REPO = Path(__file__).resolve().parents[3]


def fixture() -> Dict[str, Any]:
    path = os.environ.get("KVMEM_FIXTURE") or str(REPO / "build" / "default" / "bindings" / "scenario.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"scenario fixture {path} is missing: build the C tree first "
                                "(make build) or set KVMEM_FIXTURE")
    with open(path) as f:
        return json.load(f)


def value(salt: int, layer: int, token: int, head: int, dim: int, mul: int, mod: int) -> float:
    idx = (((salt * 8 + layer) * 1000 + token) * 16 + head) * 64 + dim
    return ((idx * mul + 17) % mod) / (mod / 2.0) - 1.0


def kv_lists(salt: int, g0: int, n: int) -> "tuple[List[float], List[float]]":
    """Flat [L][n][HKV][D] K and V values (doubles; float32 rounding happens at the store)."""
    k, v = [], []
    for l in range(L):
        for t in range(n):
            for h in range(HKV):
                for d in range(D):
                    k.append(value(salt, l, g0 + t, h, d, 7919, 2003))
                    v.append(value(salt, l, g0 + t, h, d, 104729, 1999))
    return k, v
