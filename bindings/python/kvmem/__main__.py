"""python3 -m kvmem: which library is loaded, its backends, and a short
self-check (append, retrieve, gather on the CPU; no numpy needed)."""
from __future__ import annotations

import array
import sys

import kvmem


def main() -> int:
    print(f"kvmem {kvmem.version()} (binding {kvmem.__version__})")
    print(f"library: {kvmem.LIBRARY_PATH}")
    for b in kvmem.backends():
        print(f"backend {b['name']}: {'available' if b['available'] else 'not available'} ({b['detail']})")
    L, HQ, HKV, D, T = 2, 4, 2, 8, 8
    with kvmem.Context("cpu") as ctx:
        pool = ctx.pool_create(dict(n_layers=L, n_q_heads=HQ, n_kv_heads=HKV, head_dim=D), block_size=4)
        agent = pool.agent_open("self-check")
        # token t's keys point along dimension t % D: a query along dimension 5 finds block 1 (tokens 4..7)
        k = array.array("f", [1.0 if d == t % D else 0.0 for _ in range(L) for t in range(T) for _ in range(HKV)
                              for d in range(D)])
        agent.append(k, k, token_ids=list(range(T)), text="self check")
        q = array.array("f", [1.0 if d == 5 else 0.0 for _ in range(L) for _ in range(HQ) for d in range(D)])
        blocks, _ = agent.retrieve(q, top_k=1).get()
        mem_k, _ = agent.gather(blocks)
        got = (list(blocks), agent.get_info().n_tokens, len(memoryview(mem_k).cast("B")) // 4)
        want = ([1], T, L * 4 * HKV * D)
        print(f"self-check: retrieved blocks {got[0]}, {got[1]} tokens kept, {got[2]} values gathered")
        if got != want:
            print(f"self-check FAILED: expected {want}", file=sys.stderr)
            return 1
    print("self-check ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
