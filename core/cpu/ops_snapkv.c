/* The CPU backend's SnapKV scores (kvmem_snapkv_score validates, then runs
 * this) on the QueryMemory kernels: per (layer, query head) the W
 * observation rows attend causally over the request's keys, the
 * probabilities are summed over the window and max-pooled along positions,
 * then summed over layers and heads into one score per position (one kept
 * set per request, so the slot map stays shared by all heads). The logits
 * of a KV head's whole group come from one pass over its keys (GQA-aware),
 * as a GEMM: tiles of keys packed by dimension (qk kernels' kt_pack) against
 * every query row of the group and window (qk_tile). The softmax runs per
 * span of positions while the span's logits are still in L2 (its max and
 * sum per row), and the spans are weighted into the votes at the end. */
#include "cpu_backend.h"
#include "kernels.h"
#include "tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SK_MAX_CHUNKS 16
#define SK_TILE KVM_QK_TILE /* key rows per packed tile, and the prefetch distance */
#define SK_SPAN_FLOATS 131072 /* logits of one span, every row: 512 KiB, in L2 until their softmax */

/* A task is one (layer, KV head): the G query heads of its group read the
 * group's keys once for all of their W observation rows (GQA-aware: K
 * streams from memory once per KV head, not once per query head). Tasks
 * go in a fixed number of chunks, each with its own partial sum, reduced in
 * chunk order (the result does not depend on the thread count); worker w
 * takes chunks w, w + n_workers, ... with its own buffers. */
typedef struct {
    const kvmem_tensor *q, *k;
    const kvm_qk_kernels *kk;
    size_t L, Hq, Hkv, G, D, N, W, R, RP, NS, LD, n_spans, n_tasks, n_chunks, n_workers;
    int32_t radius;
    float scale;
    float *partial;  /* [n_chunks][N] */
    float *logits;   /* [n_workers][n_spans][R][LD]: row r = g * W + w */
    float *qp;       /* [n_workers][RP / 8][D][8]: the task's query rows packed by dimension */
    float *kt;       /* [n_workers][D][SK_TILE]: a tile of keys packed by dimension */
    float *kconv;    /* [n_workers][SK_TILE][D]: key rows as f32 (K not f32 rows) */
    float *stat;     /* [n_workers][3][n_spans][R]: per span and row, max, sum, weight */
    float *vote;     /* [n_workers][N] */
    int32_t bad[SK_MAX_CHUNKS]; /* per chunk: 1 if a logit was not finite */
} sk_job;

/* Max-pool v[b..e) into acc[b..e) (added), window [j - r, j + r] clipped to
 * [b, e): the prefix and the observation window are pooled apart, as SnapKV
 * pools only the prefix. */
static float pool_one(const float *v, size_t b, size_t e, size_t r, size_t j) {
    size_t lo = j >= b + r ? j - r : b, hi = KVM_MIN(e, j + r + 1);
    float m = v[lo];
    for (size_t i = lo + 1; i < hi; i++) m = v[i] > m ? v[i] : m;
    return m;
}

static void pool_add(const float *v, size_t b, size_t e, int32_t radius, float *acc) {
    const size_t r = (size_t)radius, lo = b + r, hi = e > r ? e - r : 0; /* whole windows: [lo, hi) */
    for (size_t j = b; j < KVM_MIN(lo, e); j++) acc[j] += pool_one(v, b, e, r, j);
    /* 64 positions at a time, an offset at a time over the block: loops
     * that vectorise */
    for (size_t j = lo; j < hi; j += 64) {
        const size_t n = KVM_MIN((size_t)64, hi - j);
        float m[64];
        for (size_t t = 0; t < n; t++) m[t] = v[j - r + t];
        for (size_t i = 1; i <= 2 * r; i++)
            for (size_t t = 0; t < n; t++) m[t] = v[j - r + i + t] > m[t] ? v[j - r + i + t] : m[t];
        for (size_t t = 0; t < n; t++) acc[j + t] += m[t];
    }
    for (size_t j = KVM_MAX(lo, hi); j < e; j++) acc[j] += pool_one(v, b, e, r, j);
}

/* The rows of KV head g at positions [j0, j0 + n) of layer l, ascending,
 * for the tile kernel to prefetch: the hardware prefetcher of the machine
 * measured does not follow a head's rows (see ops_attend.c). */
static kvm_qk_prefetch k_rows(const kvmem_tensor *k, size_t l, size_t g, size_t j0, size_t n, size_t D) {
    const size_t es = kvm_dtype_size(k->dtype);
    kvm_qk_prefetch p;
    p.base = (const char *)k->data +
             (size_t)((int64_t)l * k->strides[0] + (int64_t)j0 * k->strides[1] + (int64_t)g * k->strides[2]) * es;
    p.stride = (size_t)k->strides[1] * es;
    p.bytes = (size_t)((int64_t)(D - 1) * k->strides[3] + 1) * es;
    p.n = n;
    return p;
}

static void sk_one(sk_job *s, size_t t, float *lg, float *qp, float *kt, float *kconv, float *st, float *vote,
                   float *acc, int32_t *bad) {
    const size_t l = t / s->Hkv, g = t % s->Hkv, D = s->D, N = s->N, W = s->W, R = s->R, NS = s->NS, LD = s->LD;
    const kvmem_tensor *k = s->k;
    /* the group's W * G query rows, packed by dimension in blocks of 8
     * (rows past R are zero and their logits not stored) */
    memset(qp, 0, s->RP * D * sizeof *qp);
    for (size_t r = 0; r < R; r++) {
        float row[1024];
        const size_t h = g * s->G + r / W, w = r % W;
        int64_t idx[3] = {(int64_t)w, (int64_t)l, (int64_t)h};
        kvm_tensor_read_f32(s->q, kvm_tensor_row_offset(s->q, idx), row, D);
        float *blk = qp + (r / 8) * D * 8;
        for (size_t d = 0; d < D; d++) blk[d * 8 + r % 8] = row[d];
    }
    const int direct = k->dtype == KVMEM_F32 && (k->strides[3] == 1 || D == 1);
    const int direct16 = k->dtype == KVMEM_F16 && (k->strides[3] == 1 || D == 1) && s->kk->kt_pack_f16;
    const size_t es = kvm_dtype_size(k->dtype);
    float *smax = st, *ssum = st + s->n_spans * R, *wt = st + 2 * s->n_spans * R; /* [span][R] each */
    const float *rows[SK_TILE];
    const uint16_t *rows16[SK_TILE];
    for (size_t c = 0; c < s->n_spans; c++) {
        const size_t c0 = c * NS, cn = KVM_MIN(NS, N - c0);
        float *ls = lg + c * R * LD;
        for (size_t j0 = c0; j0 < c0 + cn; j0 += SK_TILE) {
            const size_t n = KVM_MIN(c0 + cn - j0, (size_t)SK_TILE);
            const kvm_qk_prefetch pf = k_rows(k, l, g, j0 + n, KVM_MIN(N - j0 - n, (size_t)SK_TILE), D);
            for (size_t i = 0; i < n; i++) {
                const int64_t off = (int64_t)l * k->strides[0] + (int64_t)(j0 + i) * k->strides[1] + (int64_t)g * k->strides[2];
                if (direct) {
                    rows[i] = (const float *)((const unsigned char *)k->data + (size_t)off * es);
                } else if (direct16) { /* widened by the packing */
                    rows16[i] = (const uint16_t *)((const unsigned char *)k->data + (size_t)off * es);
                } else { /* f16 / bf16 / strided rows: converted once here, reused by every query row */
                    kvm_tensor_read_f32(k, off, kconv + i * D, D);
                    rows[i] = kconv + i * D;
                }
            }
            if (direct16) s->kk->kt_pack_f16(rows16, n, D, kt);
            else s->kk->kt_pack(rows, n, D, kt);
            s->kk->qk_tile(qp, R, kt, n, D, s->scale, ls + (j0 - c0), LD, &pf);
        }
        /* the span's softmax pieces while its logits are in L2; causal:
         * window row w sits at position N - W + w and sees the keys before */
        for (size_t r = 0; r < R; r++) {
            const size_t vis = N - W + r % W + 1, nv = vis > c0 ? KVM_MIN(vis - c0, cn) : 0;
            const float sum = s->kk->exp_row(ls + r * LD, nv, cn, &smax[c * R + r]);
            /* non-finite K or q_obs: refused, not clamped by SIMD exp into a
             * plausible score (the last window row sees every key) */
            if (isnan(sum)) {
                *bad = 1;
                return;
            }
            ssum[c * R + r] = sum;
        }
    }
    /* per row and span: exp(span max - row max) / row sum, the weight of the
     * span's exps (an empty span's max is -inf: weight 0) */
    for (size_t r = 0; r < R; r++) {
        float mx = -INFINITY, tot = 0.0f;
        for (size_t c = 0; c < s->n_spans; c++) mx = smax[c * R + r] > mx ? smax[c * R + r] : mx;
        for (size_t c = 0; c < s->n_spans; c++) {
            wt[c * R + r] = expf(smax[c * R + r] - mx);
            tot += ssum[c * R + r] * wt[c * R + r];
        }
        for (size_t c = 0; c < s->n_spans; c++) wt[c * R + r] /= tot;
    }
    for (size_t gi = 0; gi < s->G; gi++) { /* one query head: its W rows' votes, pooled */
        for (size_t c = 0; c < s->n_spans; c++) {
            const size_t c0 = c * NS;
            s->kk->wsum(lg + (c * R + gi * W) * LD, LD, wt + c * R + gi * W, W, KVM_MIN(NS, N - c0), vote + c0);
        }
        pool_add(vote, 0, N - W, s->radius, acc);
        pool_add(vote, N - W, N, s->radius, acc);
    }
}

static void sk_task(void *arg, size_t b, size_t e) {
    sk_job *s = arg;
    for (size_t wk = b; wk < e; wk++) {
        float *lg = s->logits + wk * s->n_spans * s->R * s->LD, *qp = s->qp + wk * s->RP * s->D;
        float *kt = s->kt + wk * s->D * SK_TILE, *kconv = s->kconv + wk * SK_TILE * s->D;
        float *st = s->stat + wk * 3 * s->n_spans * s->R, *vote = s->vote + wk * s->N;
        for (size_t c = wk; c < s->n_chunks; c += s->n_workers) {
            float *acc = s->partial + c * s->N;
            memset(acc, 0, s->N * sizeof *acc);
            const size_t t0 = c * s->n_tasks / s->n_chunks, t1 = (c + 1) * s->n_tasks / s->n_chunks;
            for (size_t t = t0; t < t1 && !s->bad[c]; t++) sk_one(s, t, lg, qp, kt, kconv, st, vote, acc, &s->bad[c]);
        }
    }
}

kvmem_status kvm_cpu_snapkv_score(kvmem_backend *be, const kvmem_model_spec *spec, const kvmem_tensor *q_obs,
                                  const kvmem_tensor *k, int32_t pool_kernel, float *scores) {
    static const char fn[] = "kvmem_snapkv_score";
    const int64_t N = k->shape[1];
    kvmem_status st = KVMEM_OK;
    kvm_threadpool *tp = kvm_cpu_backend_tp(be);
    sk_job s;
    memset(&s, 0, sizeof s);
    s.q = q_obs;
    s.k = k;
    s.kk = kvm_cpu_kernels_get()->qk;
    s.Hq = (size_t)spec->n_q_heads;
    s.Hkv = (size_t)spec->n_kv_heads;
    s.G = s.Hq / s.Hkv;
    s.D = (size_t)spec->head_dim;
    s.N = (size_t)N;
    s.W = (size_t)q_obs->shape[0];
    s.R = s.G * s.W;
    s.RP = (s.R + 7) / 8 * 8;
    s.NS = KVM_MAX((size_t)SK_TILE, SK_SPAN_FLOATS / s.R / SK_TILE * SK_TILE);
    s.n_spans = (s.N + s.NS - 1) / s.NS;
    s.LD = KVM_MIN(s.NS, (s.N + SK_TILE - 1) / SK_TILE * SK_TILE) + 16; /* + 64 bytes: rows 4 KiB apart share L1 sets */
    s.n_tasks = (size_t)spec->n_layers * s.Hkv;
    s.n_chunks = KVM_MIN(s.n_tasks, (size_t)SK_MAX_CHUNKS);
    s.n_workers = KVM_MIN(s.n_chunks, (size_t)kvm_threadpool_size(tp));
    s.radius = pool_kernel / 2;
    s.scale = (float)(1.0 / sqrt((double)s.D));
    size_t nl, np;
    if (!kvm_mul_size(s.n_workers * s.n_spans * s.R, s.LD, &nl) || nl > SIZE_MAX / 8 || !kvm_mul_size(s.n_chunks, s.N, &np) ||
        np > SIZE_MAX / 8)
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for scratch of N = %lld positions (its size overflows)", fn, (long long)N);
    /* work memory from the backend's cache: nothing allocated per call once warm */
    kvm_scratch *sc = kvm_cpu_backend_scratch(be);
    s.partial = kvm_scratch_take(sc, np * sizeof(float));
    s.logits = kvm_scratch_take(sc, nl * sizeof(float));
    s.qp = kvm_scratch_take(sc, s.n_workers * s.RP * s.D * sizeof(float));
    s.kt = kvm_scratch_take(sc, s.n_workers * s.D * SK_TILE * sizeof(float));
    s.kconv = kvm_scratch_take(sc, s.n_workers * SK_TILE * s.D * sizeof(float));
    s.stat = kvm_scratch_take(sc, s.n_workers * 3 * s.n_spans * s.R * sizeof(float));
    s.vote = kvm_scratch_take(sc, s.n_workers * s.N * sizeof(float));
    if (!s.partial || !s.logits || !s.qp || !s.kt || !s.kconv || !s.stat || !s.vote) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for scratch of N = %lld positions", fn, (long long)N);
        goto done;
    }
    kvm_parallel_for(tp, s.n_workers, 1, sk_task, &s);
    for (size_t c = 0; c < s.n_chunks; c++)
        if (s.bad[c]) {
            st = kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: K or q_obs holds a non-finite value (or a logit overflows)", fn);
            goto done;
        }
    for (size_t j = 0; j < s.N; j++) {
        float v = 0.0f;
        for (size_t c = 0; c < s.n_chunks; c++) v += s.partial[c * s.N + j];
        scores[j] = v;
    }
done:
    kvm_scratch_give(sc, s.partial);
    kvm_scratch_give(sc, s.logits);
    kvm_scratch_give(sc, s.qp);
    kvm_scratch_give(sc, s.kt);
    kvm_scratch_give(sc, s.stat);
    kvm_scratch_give(sc, s.kconv);
    kvm_scratch_give(sc, s.vote);
    return st;
}
