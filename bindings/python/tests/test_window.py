"""kvmem.arrange and kvmem.window_split against plain reimplementations of
the header's contract (include/kvmem.h, "The window")."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import kvmem


def ref_arrange(blocks, scores, order):
    """The header's orders, written out plainly."""
    ids = sorted(blocks)
    if order == "chrono":
        return ids
    s = dict(zip(blocks, scores))
    if order == "score":  # ascending score, ties: the older block first
        return sorted(ids, key=lambda b: (s[b], b))
    runs, cur = [], [ids[0]]
    for b in ids[1:]:  # maximal runs of adjacent ids
        if b == cur[-1] + 1:
            cur.append(b)
        else:
            runs.append(cur)
            cur = [b]
    runs.append(cur)
    runs.sort(key=lambda r: (max(s[b] for b in r), r[0]))  # by best score, ties: the older run
    return [b for r in runs for b in r]


def test_arrange_on_a_hand_computed_example():
    blocks = [9, 3, 4, 12, 5, 10]
    scores = [0.7, 0.1, 0.9, 0.3, 0.2, 0.4]
    assert kvmem.arrange(blocks, order="chrono") == [3, 4, 5, 9, 10, 12]
    assert kvmem.arrange(blocks, scores, "score") == [3, 5, 12, 10, 9, 4]
    # runs 3-5 (best 0.9), 9-10 (best 0.7), 12 (0.3): 12, then 9 10, then 3 4 5
    assert kvmem.arrange(blocks, scores, "runs") == [12, 9, 10, 3, 4, 5]
    assert kvmem.arrange(blocks, np.array(scores, np.float32)) == [3, 5, 12, 10, 9, 4]
    assert kvmem.arrange([], order="chrono") == []


def test_arrange_matches_the_reference_on_random_sets():
    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(1, 12))
        blocks = [int(b) for b in rng.choice(20, n, replace=False)]
        scores = [float(x) for x in rng.integers(0, 4, n).astype(np.float32) / 4]  # ties on purpose
        for order in ("chrono", "score", "runs"):
            assert kvmem.arrange(blocks, scores, order) == ref_arrange(blocks, scores, order), (blocks, scores, order)


def test_arrange_refuses_bad_input():
    with pytest.raises(kvmem.InvalidArgumentError, match="listed twice"):
        kvmem.arrange([1, 2, 1], [0.1, 0.2, 0.3])
    with pytest.raises(kvmem.InvalidArgumentError, match="needs scores"):
        kvmem.arrange([1, 2])
    with pytest.raises(kvmem.InvalidArgumentError, match="NaN"):
        kvmem.arrange([1, 2], [0.1, math.nan])
    with pytest.raises(kvmem.InvalidArgumentError, match="< 0"):
        kvmem.arrange([1, -2], order="chrono")
    with pytest.raises(kvmem.InvalidArgumentError, match="expected 2"):
        kvmem.arrange([1, 2], [0.1])
    with pytest.raises(kvmem.InvalidArgumentError, match="order 'best'"):
        kvmem.arrange([1, 2], [0.1, 0.2], "best")
    with pytest.raises(kvmem.InvalidTypeError, match="order"):
        kvmem.arrange([1, 2], [0.1, 0.2], 1)  # type: ignore[arg-type]


def ref_split(window, reserve, memory_share, live_share, block_size):
    room = window - reserve
    memory = math.floor(memory_share * window + 1e-9) // block_size * block_size
    memory = min(memory, room // block_size * block_size)
    left = room - memory
    live = math.floor(live_share * window + 1e-9) if live_share > 0 else left
    live = min(live, left)
    return memory, memory // block_size, live


def test_window_split_on_hand_computed_examples():
    # 256 tokens, 64 for the turn: memory half = 128 (8 blocks of 16), live a quarter = 64
    assert kvmem.window_split(256, 64, 0.5, 0.25, 16) == kvmem.WindowPlan(128, 8, 64)
    # live_share 0: all that is left
    assert kvmem.window_split(256, 64, 0.5, 0.0, 16) == kvmem.WindowPlan(128, 8, 64)
    # memory capped by the room, in whole blocks: room 100 -> 96
    assert kvmem.window_split(200, 100, 0.9, 0.5, 16) == kvmem.WindowPlan(96, 6, 4)
    # rounded down to whole blocks: 0.3 * 100 = 30 -> 24
    assert kvmem.window_split(100, 0, 0.3, 0.0, 8) == kvmem.WindowPlan(24, 3, 76)


def test_window_split_matches_the_reference():
    shares = [0.0, 0.1, 0.25, 1 / 3, 0.5, 0.75, 1.0]
    for window, reserve, ms, ls, bs in itertools.product([1, 7, 64, 255, 2048], [0, 1, 16, 200],
                                                         shares, shares, [1, 3, 16, 64]):
        if reserve > window:
            continue
        # the C side computes in float: compare with the share it receives
        ms32, ls32 = float(np.float32(ms)), float(np.float32(ls))
        p = kvmem.window_split(window, reserve, ms, ls, bs)
        assert (p.memory_tokens, p.top_k, p.live_tokens) == ref_split(window, reserve, ms32, ls32, bs), \
            (window, reserve, ms, ls, bs)
        assert p.memory_tokens + p.live_tokens <= window - reserve


def test_window_split_refuses_bad_input():
    for args in [(0, 0, 0.5, 0.25, 4), (64, 65, 0.5, 0.25, 4), (64, -1, 0.5, 0.25, 4),
                 (64, 0, 1.5, 0.25, 4), (64, 0, 0.5, -0.1, 4), (64, 0, math.nan, 0.25, 4),
                 (64, 0, 0.5, 0.25, 0)]:
        with pytest.raises(kvmem.InvalidArgumentError, match="kvmem_window_split"):
            kvmem.window_split(*args)
    with pytest.raises(kvmem.InvalidTypeError, match="memory_share"):
        kvmem.window_split(64, 0, "half", 0.25, 4)  # type: ignore[arg-type]
