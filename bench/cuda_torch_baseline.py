#!/usr/bin/env python3
"""PyTorch baselines for `kvmem bench --json cuda`, on the same GPU and the
same geometry, one JSON object per line (suite "cuda_torch"):

  selection    exact block scores (I(q,b) = max over the block's keys of q.k,
               the baseline AABB scoring is measured against), per-token
               softmax over blocks, max over tokens, sum over layers and heads,
               then torch.topk; Llama-3.1-8B geometry, 14k tokens, 32 queries
  attend       decode attention with torch's SDPA over 32k tokens of one
               layer (GQA expanded), kv_gbps
  copy         device-to-device copy bandwidth as torch measures it

Without torch or without a CUDA device it prints one "skipped" line and exits
77 (the skip code of kvmem's check scripts)."""
import json
import sys


def emit(**kv):
    kv = {"suite": "cuda_torch", **kv}
    print(json.dumps(kv), flush=True)


def main():
    quick = "--quick" in sys.argv
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        emit(skipped="torch not installed")
        print("skipped: torch not installed", file=sys.stderr)
        return 77
    if not torch.cuda.is_available():
        emit(skipped="no CUDA device for torch")
        print("skipped: no CUDA device", file=sys.stderr)
        return 77
    dev = torch.device("cuda")
    torch.manual_seed(0)

    def time_ms(fn, reps):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        ts.sort()
        return ts[len(ts) // 2]

    reps = 5 if quick else 30
    # copy bandwidth (read + written)
    nbytes = (32 << 20) if quick else (512 << 20)
    x = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x), reps)
    copy_gbps = 2 * nbytes / (ms * 1e-3) / 1e9
    emit(case="copy", device=torch.cuda.get_device_name(), torch=torch.__version__, copy_gbps=copy_gbps)
    del x, y

    # selection, exact scores + topk
    L, Hq, Hkv, D, BS, nq, k = 32, 32, 8, 128, 16, 32, 64
    tokens = 2048 if quick else 14000
    NB = tokens // BS
    G = Hq // Hkv
    keys = torch.randn(L, Hkv, NB, BS, D, device=dev, dtype=torch.float16)
    q = torch.randn(L, Hkv, G * nq, D, device=dev, dtype=torch.float16)
    tau = 1.0 / D ** 0.5

    def select():
        # [L, Hkv, G*nq, NB*BS] -> max over each block's keys
        s = torch.matmul(q, keys.view(L, Hkv, NB * BS, D).transpose(-1, -2)).float()
        s = s.view(L, Hkv, G * nq, NB, BS).amax(-1)
        p = torch.softmax(s * tau, dim=-1).view(L, Hkv, G, nq, NB)
        agg = p.amax(3).sum((0, 1, 2))
        return torch.topk(agg, k)

    ms = time_ms(select, reps)
    emit(case="selection", method="exact+topk", tokens=tokens, blocks=NB, n_q=nq, k=k, ms=ms)
    del keys, q

    # decode attention with SDPA
    n = 4096 if quick else 32768
    kk = torch.randn(1, Hkv, n, D, device=dev, dtype=torch.float16)
    vv = torch.randn(1, Hkv, n, D, device=dev, dtype=torch.float16)
    qq = torch.randn(1, Hq, 1, D, device=dev, dtype=torch.float16)

    def attend():
        ke = kk.repeat_interleave(G, dim=1)  # the usual GQA path without enable_gqa
        ve = vv.repeat_interleave(G, dim=1)
        return F.scaled_dot_product_attention(qq, ke, ve)

    def attend_gqa():
        return F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True)

    kv_bytes = 2 * n * Hkv * D * 2
    for name, fn in (("sdpa_expand", attend), ("sdpa_gqa", attend_gqa)):
        try:
            ms = time_ms(fn, reps)
        except TypeError:  # torch without enable_gqa
            continue
        gbps = kv_bytes / (ms * 1e-3) / 1e9
        emit(case="attend", method=name, tokens=n, ms=ms, kv_gbps=gbps, kv_over_copy=gbps / copy_gbps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
