#!/usr/bin/env python3
"""kvmem against PyTorch on the same work, in one process, interleaved, at
equal thread counts: what a user choosing between kvmem and "just write it
in torch" would compare. One JSON object per line (suite "peers"):

  op, variant, layout, tokens, threads   what ran (layout: "contiguous" is the
        engine's [T][n_kv_heads][head_dim] rows, kvmem's own block-major boxes;
        "head_major" is [n_kv_heads][T][head_dim], as Hugging Face caches hold it)
  kvmem_ms, peer_ms   medians over `rounds` alternating rounds (7; --quick 2)
  ratio               peer_ms / kvmem_ms (> 1: kvmem is faster)
  limit, kvmem_share, peer_share   the limit each row is judged against, from
        `kvmem bench --json machine` run in the same process's lifetime (before
        and after: medians), or measured here (disk write+fsync): read_bw
        (bytes each side reads / time / single-thread read bandwidth x
        threads), fma_peak (flops / time / (peak x threads)), disk, memcpy
  match, check        both sides checked against each other: the same blocks
        selected, outputs within a stated tolerance, files round-tripping

Rows: AABB block selection (1 and 32 query tokens), EXACT block scoring,
decode attention with no early stop, SnapKV scoring (kvpress's algorithm:
keys repeated to every query head; and a GQA-aware one: one matmul per KV
head), the IntentKV rule score, and saving / loading an f16 agent against
torch.save / torch.load and a safetensors writer/reader in numpy (every
writer fsyncs a new file). Llama-3.1-8B geometry (32 layers, 32 query heads,
8 KV heads, head_dim 128, blocks of 16); --quick: a small geometry for tests.

The PyTorch side is written as a user would: f32 tensors on the CPU (torch's
f16 matmul on the CPU is far slower), batched matmuls over heads, softmax,
topk. Its BLAS is named in every row ("blas"): Debian's default libblas.so.3
is the reference BLAS, about 40x slower than OpenBLAS (whose own threads are
held to the row's thread count, named in "peer_blas_threads"); pick OpenBLAS with
  apt-get install libopenblas0-pthread
  update-alternatives --set libblas.so.3-x86_64-linux-gnu \\
      /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3

Needs numpy, torch and the kvmem Python binding (bindings/python; the library
from KVMEM_LIBRARY, default build/default/core/libkvmem.so). Without torch
(or numpy) it prints one "skipped" line saying why and exits 77."""
import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def emit(**kv):
    print(json.dumps({"suite": "peers", **kv}), flush=True)


def skip(why):
    emit(skipped=why)
    print("skipped: " + why, file=sys.stderr)
    sys.exit(77)


try:
    import numpy as np
except ImportError:
    skip("numpy is not installed")
try:
    import torch
    import torch.nn.functional as F
except ImportError:
    skip("PyTorch is not installed (Debian: apt-get install --no-install-recommends python3-torch)")
os.environ.setdefault("KVMEM_LIBRARY", os.path.join(ROOT, "build", "default", "core", "libkvmem.so"))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
try:
    import kvmem
except Exception as e:  # the library is not built, or not loadable
    skip("the kvmem binding cannot load %s: %s" % (os.environ["KVMEM_LIBRARY"], e))


def blas_libraries():
    """The BLAS libraries mapped into this process once torch has run a
    matmul (real paths): what torch's matmuls run on."""
    a = torch.ones(64, 64)
    (a @ a).sum().item()
    names = set()
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1] if "/" in line else ""
            if os.path.basename(p).startswith(("libblas", "libopenblas", "libmkl", "libblis")):
                names.add(os.path.realpath(p))
    return sorted(names)


def blas_in_use(names):
    """The BLAS torch's matmuls run on (blas_libraries()), named."""
    if not names:
        return "none mapped (torch's own kernels)"
    desc = {}
    for n in names:
        kind = ("OpenBLAS" if "openblas" in n else "MKL" if "mkl" in n else "BLIS" if "blis" in n
                else "reference BLAS" if "/blas/" in n else "BLAS")
        desc.setdefault(kind, []).append(n)
    return "; ".join("%s (%s)" % (k, ", ".join(v)) for k, v in desc.items())


def blas_threads(names):
    """(set, get) for the thread count of the BLAS torch's matmuls run on
    (blas_libraries()),
    or None. torch.set_num_threads holds ATen's own loops only: Debian's
    torch reaches OpenBLAS through libblas.so.3, and OpenBLAS's own threads
    (one per core) stay on, so a "1 thread" peer row ran on every core."""
    for p in names:
        base = os.path.basename(p)
        for prefix, set_sym, get_sym in (("libopenblas", "openblas_set_num_threads", "openblas_get_num_threads"),
                                         ("libmkl_rt", "MKL_Set_Num_Threads", "MKL_Get_Max_Threads"),
                                         ("libblis", "bli_thread_set_num_threads", "bli_thread_get_num_threads")):
            if base.startswith(prefix):
                lib = ctypes.CDLL(p)
                set_fn, get_fn = getattr(lib, set_sym, None), getattr(lib, get_sym, None)
                if set_fn is not None and get_fn is not None:
                    set_fn.argtypes, set_fn.restype = [ctypes.c_int], None
                    get_fn.argtypes, get_fn.restype = [], ctypes.c_int
                    return set_fn, get_fn
    return None


def machine_limits(cli):
    """kvmem bench --json machine: single-thread read bandwidth, memcpy, FMA peak."""
    if not cli or not os.access(cli, os.X_OK):
        return None
    try:
        out = subprocess.run([cli, "bench", "--json", "machine"], capture_output=True, text=True, timeout=120)
        for line in out.stdout.splitlines():
            d = json.loads(line)
            if d.get("suite") == "machine":
                return d
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return None


def disk_write_gbps(directory, nbytes):
    """Write+fsync of a new file of nbytes (1 MiB writes): the disk as a save meets it."""
    path = os.path.join(directory, ".peers-disk")
    chunk = bytes(range(256)) * 4096
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        left = nbytes
        while left > 0:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            left -= n
        os.fsync(f.fileno())
    t = time.perf_counter() - t0
    os.unlink(path)
    return nbytes / t / 1e9


def timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def interleave(rounds, kv_fn, peer_fn, before=None):
    """Alternate the two sides `rounds` times after one warm-up call each;
    medians of the seconds. before(): run ahead of each round (untimed)."""
    kv_fn()
    peer_fn()
    tk, tp = [], []
    for r in range(rounds):
        if before:
            before()
        t, _ = timed(kv_fn)
        tk.append(t)
        if before:
            before()
        t, _ = timed(peer_fn)
        tp.append(t)
    return statistics.median(tk), statistics.median(tp)


class Geometry:
    def __init__(self, quick):
        if quick:
            self.L, self.HQ, self.H, self.D, self.BS = 2, 8, 2, 64, 16
        else:
            self.L, self.HQ, self.H, self.D, self.BS = 32, 32, 8, 128, 16
        self.G = self.HQ // self.H

    def spec(self):
        s = kvmem.ModelSpec(n_layers=self.L, n_q_heads=self.HQ, n_kv_heads=self.H, head_dim=self.D)
        s.rope_theta = 500000.0
        return s


def build_agent(ctx, g, T, rng, storage=kvmem.F16, agent_id="peers"):
    """An agent of T tokens of random KV (appended 256 tokens at a time)."""
    pool = ctx.pool_create(g.spec(), storage_dtype=storage, block_size=g.BS)
    a = pool.agent_open(agent_id)
    for t0 in range(0, T, 256):
        n = min(256, T - t0)
        k = rng.standard_normal((g.L, n, g.H, g.D), dtype=np.float32)
        v = rng.standard_normal((g.L, n, g.H, g.D), dtype=np.float32)
        a.append(k, v)
    return pool, a


def agent_from(ctx, g, path, agent_id):
    """The agent saved at path, in a pool on ctx (so its calls run on ctx's threads)."""
    pool = ctx.pool_create(g.spec(), storage_dtype=kvmem.F16, block_size=g.BS)
    a = pool.agent_open(agent_id)
    a.load(path)
    return pool, a


def agent_boxes(a, g, nb):
    """The agent's boxes as f32 [nb][L][H][2][D] (s_max, s_min): the values kvmem scores."""
    box = np.empty((nb, g.L, g.H, 2, g.D), dtype=np.float32)
    for b in range(nb):
        mn, mx = a.block_aabb(b)
        box[b, :, :, 0, :] = mx
        box[b, :, :, 1, :] = mn
    return box


# ---------------------------------------------------------------- PyTorch side

def torch_select(q, hi, lo, g, top_k, tau, exact_keys=None):
    """The same selection as kvmem_retrieve (GLOBAL, SOFTMAX, MAX): per (layer,
    query head, token) softmax over blocks of I(q, b), max over tokens, sum over
    layers and heads, topk. q [nq][L][HQ][D]; hi, lo [L][H][nb][D] (any
    strides): I = q+ . hi + q- . lo. exact_keys [L][H][T][D]: I = max over the
    block's keys of q . k instead."""
    nq = q.shape[0]
    qg = q.permute(1, 2, 0, 3).reshape(g.L, g.H, g.G * nq, g.D)  # rows (gi, t) per KV head
    if exact_keys is None:
        scores = torch.matmul(qg.clamp(min=0), hi.transpose(-1, -2)) + torch.matmul(qg.clamp(max=0), lo.transpose(-1, -2))
    else:
        logits = torch.matmul(qg, exact_keys.transpose(-1, -2))  # [L][H][R][T]
        nb = logits.shape[-1] // g.BS
        scores = logits[..., : nb * g.BS].reshape(g.L, g.H, g.G * nq, nb, g.BS).amax(-1)
    p = torch.softmax(scores * tau, dim=-1)  # over blocks
    p = p.reshape(g.L, g.H, g.G, nq, -1).amax(3)  # max over tokens
    total = p.sum(dim=(0, 1, 2))
    top = torch.topk(total, top_k)
    return torch.sort(top.indices).values, total


def torch_attend(q, k, v, g, head_major):
    """Decode attention of one layer: q [1][HQ][D]; k, v [T][H][D] or [H][T][D]."""
    if not head_major:
        k, v = k.transpose(0, 1), v.transpose(0, 1)  # views [H][T][D]
    qg = q.reshape(g.H, g.G, g.D)
    w = torch.softmax(torch.matmul(qg, k.transpose(-1, -2)) / math.sqrt(g.D), dim=-1)
    return torch.matmul(w, v).reshape(1, g.HQ, g.D)


def snapkv_torch(q_obs, k, g, pool_kernel, gqa, head_major):
    """kvmem_snapkv_score's definition in torch: per (layer, query head) softmax
    over keys of the W window rows (causal: row w sees keys <= N - W + w),
    summed over the rows, max-pooled along positions, summed over layers and
    heads. gqa False: kvpress's structure (keys repeated to every query head,
    repeat_kv); True: the group's rows against its KV head's keys, once.
    q_obs [W][L][HQ][D]; k [L][N][H][D] (contiguous) or [L][H][N][D]."""
    W, N = q_obs.shape[0], k.shape[2 if head_major else 1]
    mask = torch.ones(W, N, dtype=torch.bool).triu(diagonal=N - W + 1)
    total = torch.zeros(N)
    for l in range(g.L):
        kl = k[l] if head_major else k[l].transpose(0, 1)  # [H][N][D]
        ql = q_obs[:, l].transpose(0, 1)  # [HQ][W][D]
        if gqa:
            att = torch.matmul(ql.reshape(g.H, g.G * W, g.D), kl.transpose(-1, -2)).reshape(g.HQ, W, N)
        else:
            kr = kl.repeat_interleave(g.G, dim=0)  # [HQ][N][D], as kvpress's repeat_kv
            att = torch.matmul(ql, kr.transpose(-1, -2))
        att = att / math.sqrt(g.D)
        att.masked_fill_(mask, float("-inf"))
        s = torch.softmax(att, dim=-1).sum(1).unsqueeze(1)  # [HQ][1][N]
        # the prefix and the window max-pooled apart (kvmem pools them so; SnapKV pools the prefix only)
        pool = lambda x: F.max_pool1d(x, pool_kernel, stride=1, padding=pool_kernel // 2)
        s = torch.cat((pool(s[..., : N - W]), pool(s[..., N - W :])), dim=-1).squeeze(1)
        total += s.sum(0)
    return total


def rule_torch(mem, k, g, head_major):
    """kvmem_qmem_score: softmax over positions of M[l,h] . K[l,j,h/G] / sqrt(D), summed."""
    total = None
    for l in range(g.L):
        kl = k[l] if head_major else k[l].transpose(0, 1)  # [H][N][D]
        a = torch.softmax(torch.matmul(mem[l].reshape(g.H, g.G, g.D), kl.transpose(-1, -2)) / math.sqrt(g.D), dim=-1)
        s = a.sum(dim=(0, 1))
        total = s if total is None else total + s
    return total


def st_write(path, arrays, meta):
    """A safetensors file from numpy arrays (header, raw little-endian bytes), fsynced."""
    header, off = {"__metadata__": meta}, 0
    dt = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}
    for name, a in arrays.items():
        header[name] = {"dtype": dt[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb", buffering=0) as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for a in arrays.values():
            f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
        os.fsync(f.fileno())


def st_read(path):
    """Every tensor of a safetensors file into new numpy arrays."""
    out = {}
    with open(path, "rb", buffering=0) as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        base = 8 + n
        dt = {"F16": np.float16, "F32": np.float32}
        for name, t in header.items():
            if name == "__metadata__":
                continue
            a = np.empty(t["shape"], dtype=dt[t["dtype"]])
            f.seek(base + t["data_offsets"][0])
            f.readinto(memoryview(a).cast("B"))
            out[name] = a
    return out


def torch_save(path, obj):
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------- the rows

class Runner:
    def __init__(self, args):
        self.args = args
        self.g = Geometry(args.quick)
        self.rounds = args.rounds or (2 if args.quick else 7)
        libs = blas_libraries()
        self.blas = blas_in_use(libs)
        self.blas_threads = blas_threads(libs)
        self.limits = []
        self.cli = args.kvmem_cli
        m = machine_limits(self.cli)
        if m:
            self.limits.append(m)
        self.tmp = tempfile.mkdtemp(prefix="kvmem-peers-", dir=args.dir)

    def limit(self, key):
        v = [m[key] for m in self.limits if m.get(key)]
        return statistics.median(v) if v else None

    def row(self, op, variant, layout, tokens, threads, tk, tp, limit, kv_amount, peer_amount, match, check, **extra):
        share_k = share_p = None
        if limit == "read_bw":
            bw = self.limit("read_bw_gbps")
            if bw:
                share_k, share_p = kv_amount / tk / 1e9 / (bw * threads), peer_amount / tp / 1e9 / (bw * threads)
        elif limit == "fma_peak":
            pk = self.limit("peak_gflops")
            if pk:
                share_k, share_p = kv_amount / tk / 1e9 / (pk * threads), peer_amount / tp / 1e9 / (pk * threads)
        elif limit == "memcpy":
            mc = self.limit("memcpy_gbps")
            if mc:
                share_k, share_p = kv_amount / tk / 1e9 / mc, peer_amount / tp / 1e9 / mc
        elif limit == "disk":  # kv_amount, peer_amount: (bytes, disk GB/s)
            share_k, share_p = kv_amount[0] / tk / 1e9 / kv_amount[1], peer_amount[0] / tp / 1e9 / peer_amount[1]
        emit(op=op, variant=variant, layout=layout, tokens=tokens, threads=threads, kvmem_ms=round(tk * 1e3, 4),
             peer_ms=round(tp * 1e3, 4), ratio=round(tp / tk, 3), limit=limit,
             kvmem_share=None if share_k is None else round(share_k, 3),
             peer_share=None if share_p is None else round(share_p, 3), match=bool(match), check=check,
             blas=self.blas, peer_blas_threads=self.blas_threads[1]() if self.blas_threads else None, **extra)

    def set_threads(self, n):
        """Both sides on n threads: kvmem's context, ATen's loops and the BLAS's own."""
        torch.set_num_threads(n)
        if self.blas_threads:
            self.blas_threads[0](n)
        return kvmem.Context("cpu", n_threads=n)

    # AABB selection and EXACT scoring on one agent per size
    def selection(self, T, threads_list):
        g, rng = self.g, np.random.default_rng(T)
        ctx = kvmem.Context("cpu", n_threads=max(threads_list))
        pool0, a0 = build_agent(ctx, g, T, rng)
        saved = os.path.join(self.tmp, "select.safetensors")
        a0.save(saved)
        nb = a0.get_info().n_sealed
        a = a0
        box = agent_boxes(a, g, nb)  # [nb][L][H][2][D]
        boxes_t = torch.from_numpy(box)
        hi_c = boxes_t[:, :, :, 0, :].permute(1, 2, 0, 3)  # views into the block-major array
        lo_c = boxes_t[:, :, :, 1, :].permute(1, 2, 0, 3)
        hi_h, lo_h = hi_c.contiguous(), lo_c.contiguous()  # [L][H][nb][D]
        box_bytes_kv = nb * g.L * g.H * 2 * g.D * 2  # f16 boxes
        top_k, tau = 16, 1.0 / math.sqrt(g.D)
        keys = None
        for threads in threads_list:
            kctx = self.set_threads(threads)
            pool, a = agent_from(kctx, g, saved, "peers")  # the same agent, on this many threads
            for nq in (1, 32):
                q = rng.standard_normal((nq, g.L, g.HQ, g.D), dtype=np.float32)
                qt = torch.from_numpy(q)
                res = kvmem.Retrieval()
                kv = lambda: a.retrieve(q, result=res, top_k=top_k)
                sel_k, sc_k = None, None
                for layout, hi, lo in (("head_major", hi_h, lo_h), ("contiguous", hi_c, lo_c)):
                    peer = lambda: torch_select(qt, hi, lo, g, top_k, tau)
                    tk, tp = interleave(self.rounds, kv, peer)
                    blocks, _ = res.get(0)
                    tb, total = peer()
                    ks = np.array(res.block_scores(0), dtype=np.float64)
                    rel = float(np.max(np.abs(ks - total.numpy()) / np.maximum(np.abs(total.numpy()), 1e-30)))
                    same = list(blocks) == tb.tolist()
                    flops = 2.0 * 2 * g.D * g.G * nq * g.L * g.H * nb
                    if nq == 1:
                        self.row("aabb_select", "1 query token", layout, T, threads, tk, tp, "read_bw", box_bytes_kv,
                                 box_bytes_kv * 2, same and rel < 1e-4,
                                 "same %d blocks selected; block scores within %.1e relative" % (top_k, rel),
                                 kvmem_gbps=round(box_bytes_kv / tk / 1e9, 2))
                    else:
                        self.row("aabb_select", "32 query tokens", layout, T, threads, tk, tp, "fma_peak", flops, flops,
                                 same and rel < 1e-4,
                                 "same %d blocks selected; block scores within %.1e relative" % (top_k, rel))
            # EXACT block scoring (1 query token): kvmem reads its f16 keys, torch f32 keys [L][H][T][D]
            if keys is None:
                kk, _ = a.read(0, nb * g.BS, values=False)  # [L][T][H][D] f32 (the stored f16 values)
                keys = torch.from_numpy(np.ascontiguousarray(kk.transpose(0, 2, 1, 3)))
                del kk
            q = rng.standard_normal((1, g.L, g.HQ, g.D), dtype=np.float32)
            qt = torch.from_numpy(q)
            res = kvmem.Retrieval()
            kv = lambda: a.retrieve(q, result=res, top_k=top_k, mode=kvmem.RETRIEVE_EXACT)
            peer = lambda: torch_select(qt, None, None, g, top_k, tau, exact_keys=keys)
            tk, tp = interleave(max(2, self.rounds // 2), kv, peer)
            blocks, _ = res.get(0)
            tb, total = peer()
            ks = np.array(res.block_scores(0), dtype=np.float64)
            rel = float(np.max(np.abs(ks - total.numpy()) / np.maximum(np.abs(total.numpy()), 1e-30)))
            self.row("exact_select", "1 query token", "head_major", T, threads, tk, tp, "read_bw",
                     nb * g.BS * g.L * g.H * g.D * 2, nb * g.BS * g.L * g.H * g.D * 4,
                     list(blocks) == tb.tolist() and rel < 1e-4,
                     "same %d blocks selected; block scores within %.1e relative" % (top_k, rel))
            a.close()
            pool.close()
        a0.close()
        pool0.close()
        os.unlink(saved)

    def attention(self, T, threads_list):
        g, rng = self.g, np.random.default_rng(T + 1)
        k = rng.standard_normal((T, g.H, g.D), dtype=np.float32)
        v = rng.standard_normal((T, g.H, g.D), dtype=np.float32)
        q = rng.standard_normal((1, g.HQ, g.D), dtype=np.float32)
        kh, vh = np.ascontiguousarray(k.transpose(1, 0, 2)), np.ascontiguousarray(v.transpose(1, 0, 2))
        qt = torch.from_numpy(q)
        for threads in threads_list:
            ctx = self.set_threads(threads)
            for layout in ("contiguous", "head_major"):
                if layout == "contiguous":
                    ka, va, kt, vt = k, v, torch.from_numpy(k), torch.from_numpy(v)
                else:  # kvmem reads the [H][T][D] arrays through strides
                    ka, va, kt, vt = kh.transpose(1, 0, 2), vh.transpose(1, 0, 2), torch.from_numpy(kh), torch.from_numpy(vh)
                out = np.empty((1, g.HQ, g.D), dtype=np.float32)
                kv = lambda: kvmem.attend(ctx, q, k=ka, v=va, out=out, tau_s=0.0, tau_d=0.0,
                                          order=kvmem.ATTEND_RECENT)
                peer = lambda: torch_attend(qt, kt, vt, g, layout == "head_major")
                tk, tp = interleave(self.rounds, kv, peer)
                ref = peer().numpy()
                err = float(np.max(np.abs(out - ref)))
                self.row("attend", "decode, no early stop", layout, T, threads, tk, tp, "read_bw", 2 * k.nbytes,
                         2 * k.nbytes, err < 1e-4, "outputs within %.1e absolute" % err)

    def snapkv_and_rule(self, N, threads_list):
        g, rng = self.g, np.random.default_rng(N + 2)
        W = 32 if not self.args.quick else 8
        k = rng.standard_normal((g.L, N, g.H, g.D), dtype=np.float32)
        kh = np.ascontiguousarray(k.transpose(0, 2, 1, 3))
        q_obs = rng.standard_normal((W, g.L, g.HQ, g.D), dtype=np.float32)
        mem = rng.standard_normal((g.L, g.HQ, g.D), dtype=np.float32)
        mem /= np.linalg.norm(mem, axis=-1, keepdims=True)
        spec = g.spec()
        qo_t, mem_t = torch.from_numpy(q_obs), torch.from_numpy(mem)
        for threads in threads_list:
            ctx = self.set_threads(threads)
            for layout in ("contiguous", "head_major"):
                ka = k if layout == "contiguous" else kh.transpose(0, 2, 1, 3)
                kt = torch.from_numpy(k if layout == "contiguous" else kh)
                hm = layout == "head_major"
                flops = 2.0 * W * g.HQ * g.D * N * g.L
                for variant, gqa in (("kvpress (keys repeated per query head)", False), ("GQA-aware", True)):
                    kv = lambda: kvmem.snapkv_score(ctx, spec, q_obs, ka, 7)
                    peer = lambda: snapkv_torch(qo_t, kt, g, 7, gqa, hm)
                    tk, tp = interleave(max(2, self.rounds // 2), kv, peer)
                    a, b = kv(), peer().numpy()
                    rel = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-6)))
                    self.row("snapkv_score", variant, layout, N, threads, tk, tp, "fma_peak", flops, flops, rel < 1e-3,
                             "scores within %.1e relative" % rel, window=W)
                kv = lambda: kvmem.qmem_score(ctx, spec, mem, ka)
                peer = lambda: rule_torch(mem_t, kt, g, hm)
                tk, tp = interleave(self.rounds, kv, peer)
                a, b = kv(), peer().numpy()
                rel = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-6)))
                self.row("rule_score", "IntentKV rule", layout, N, threads, tk, tp, "read_bw", k.nbytes, k.nbytes,
                         rel < 1e-3, "scores within %.1e relative" % rel)

    def persistence(self, T, threads_list):
        g, rng = self.g, np.random.default_rng(T + 3)
        pool0, a0 = build_agent(kvmem.Context("cpu", n_threads=max(threads_list)), g, T, rng, agent_id="saved")
        first = os.path.join(self.tmp, "first.safetensors")
        a0.save(first)
        a0.close()
        pool0.close()
        for threads in threads_list:
            ctx = self.set_threads(threads)
            pool, a = agent_from(ctx, g, first, "saved")
            nb = a.get_info().n_sealed
            k, v = a.read(0, T, dtype="f16")  # [L][T][H][D] f16: what the agent holds
            box = agent_boxes(a, g, nb).astype(np.float16)
            kvp = os.path.join(self.tmp, "saved.safetensors")
            tp_path = os.path.join(self.tmp, "torch.pt")
            sp = os.path.join(self.tmp, "numpy.safetensors")
            a.save(kvp)
            nbytes = os.path.getsize(kvp)
            obj = {"k": torch.from_numpy(k), "v": torch.from_numpy(v), "aabb": torch.from_numpy(box)}
            arrays = {"k": k, "v": v, "aabb": box}

            def fresh(*paths):
                def f():
                    for p in paths:
                        if os.path.exists(p):
                            os.unlink(p)
                return f
            disk = []

            def before_disk():
                disk.append(disk_write_gbps(self.tmp, nbytes))
                fresh(kvp, tp_path, sp)()
            for name, peer, path in (("torch.save + fsync", lambda: torch_save(tp_path, obj), tp_path),
                                     ("numpy safetensors writer + fsync", lambda: st_write(sp, arrays, {"k": "v"}), sp)):
                disk.clear()
                tk, tpp = interleave(max(2, self.rounds // 2), lambda: a.save(kvp), peer, before=before_disk)
                d = statistics.median(disk)
                pbytes = os.path.getsize(path)
                self.row("save", name, "contiguous", T, threads, tk, tpp, "disk", (nbytes, d), (pbytes, d), True,
                         "kvmem file %d bytes, peer %d bytes; disk write+fsync %.2f GB/s" % (nbytes, pbytes, d),
                         kvmem_gbps=round(nbytes / tk / 1e9, 3), disk_gbps=round(d, 3))
            # loads (files in the page cache, as the saves left them)
            a.save(kvp)
            torch_save(tp_path, obj)
            st_write(sp, arrays, {"k": "v"})
            pbytes_t, pbytes_s = os.path.getsize(tp_path), os.path.getsize(sp)
            tk, tpp = interleave(max(2, self.rounds // 2), lambda: a.load(kvp), lambda: torch.load(tp_path))
            k2, _ = a.read(0, T, dtype="f16", values=False)
            t2 = torch.load(tp_path)
            ok = np.array_equal(k2, k) and torch.equal(t2["k"], obj["k"]) and torch.equal(t2["aabb"], obj["aabb"])
            self.row("load", "torch.load", "contiguous", T, threads, tk, tpp, "memcpy", nbytes, pbytes_t, ok,
                     "both round-trip K, V and the boxes bit for bit")
            tk, tpp = interleave(max(2, self.rounds // 2), lambda: a.load(kvp), lambda: st_read(sp))
            r = st_read(sp)
            ok = np.array_equal(r["v"], v) and np.array_equal(r["aabb"], box)
            self.row("load", "numpy safetensors reader", "contiguous", T, threads, tk, tpp, "memcpy", nbytes, pbytes_s,
                     ok, "both round-trip K, V and the boxes bit for bit")
            for p in (kvp, tp_path, sp):
                if os.path.exists(p):
                    os.unlink(p)
            a.close()
            pool.close()
            del k, v, obj, arrays
        os.unlink(first)

    def finish(self):
        m = machine_limits(self.cli)
        if m:
            self.limits.append(m)
        try:
            os.rmdir(self.tmp)
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small geometry and sizes (tests)")
    ap.add_argument("--threads", default=None, help="comma-separated thread counts (default: 1 and all cores)")
    ap.add_argument("--rounds", type=int, default=0, help="alternating rounds per row (default 7; --quick 2)")
    ap.add_argument("--only", default="select,attend,snapkv,store", help="row groups to run")
    ap.add_argument("--dir", default=None, help="directory for the save/load files (default: the temp dir)")
    ap.add_argument("--kvmem-cli", default=os.environ.get("KVMEM_CLI", os.path.join(ROOT, "build", "default", "tools", "kvmem")))
    args = ap.parse_args()
    ncpu = os.cpu_count() or 1
    threads = [int(x) for x in args.threads.split(",")] if args.threads else sorted({1, ncpu})
    r = Runner(args)
    emit(machine=dict(r.limits[0]) if r.limits else None, blas=r.blas, blas_threads_held=r.blas_threads is not None,
         torch=torch.__version__,
         kvmem=kvmem.version(), threads=threads, rounds=r.rounds)
    only = set(args.only.split(","))
    q = args.quick
    if "select" in only:
        for T in ((512,) if q else (4096, 16384)):
            r.selection(T, threads)
    if "attend" in only:
        for T in ((512,) if q else (4096, 16384)):
            r.attention(T, threads)
    if "snapkv" in only:
        r.snapkv_and_rule(256 if q else 8192, threads)
    if "store" in only:
        r.persistence(256 if q else 4096, threads)
    r.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
