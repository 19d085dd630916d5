#!/usr/bin/env python3
"""Binding overhead, Python: calls that do almost nothing (Agent.get_info, and
Agent.block_info with its integer argument checked), and append/read of one
turn at a Llama-3-8B shape, median of repeated runs.
Prints flat JSON lines. Run: /usr/bin/python3 bindings/bench/overhead.py"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import numpy as np  # noqa: E402

import kvmem  # noqa: E402

L, H, D, T = 32, 8, 128, 16


def median_us(fn, reps, inner):
    fn()
    xs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        xs.append((time.perf_counter() - t0) / inner * 1e6)
    xs.sort()
    return xs[len(xs) // 2]


with kvmem.Context("cpu", 1) as ctx, ctx.pool_create(
        kvmem.ModelSpec(n_layers=L, n_q_heads=32, n_kv_heads=H, head_dim=D), storage_dtype="f16") as pool:
    a = pool.agent_open("bench")
    k = np.random.default_rng(0).standard_normal((L, T, H, D)).astype(np.float32)
    out = np.empty_like(k)
    print(json.dumps({"lang": "python", "op": "get_info", "us": round(median_us(a.get_info, 9, 2000), 3)}))
    print(json.dumps({"lang": "python", "op": "append_16tok_l32", "us": round(median_us(lambda: a.append(k, k), 9, 20), 1)}))
    print(json.dumps({"lang": "python", "op": "read_16tok_l32_into", "us": round(median_us(lambda: a.read(0, T, k_out=out, values=False), 9, 50), 1)}))
    # a call with integer arguments (each checked against its C type before the call)
    print(json.dumps({"lang": "python", "op": "block_info", "us": round(median_us(lambda: a.block_info(0), 9, 2000), 3)}))
    print(json.dumps({"lang": "python", "op": "read_16tok_l32_new", "us": round(median_us(lambda: a.read(0, T, values=False), 9, 50), 1)}))
