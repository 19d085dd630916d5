/* SnapKV scores on the QueryMemory kernels: per (layer, query head) the W
 * observation rows attend causally over the request's keys, the
 * probabilities are summed over the window and max-pooled along positions,
 * then summed over layers and heads into one score per position (one kept
 * set per request, so the slot map stays shared by all heads). */
#include "../context.h"
#include "../cpu/kernels.h"
#include "../qmem/qk_kernels.h"
#include "../qmem/qmem_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SK_MAX_CHUNKS 16

typedef struct {
    const kvmem_tensor *q, *k;
    const kvm_qk_kernels *kk;
    size_t Hq, G, D, N, W, n_tasks, n_chunks;
    int32_t radius;
    float scale;
    float *qrows;   /* [n_chunks][W][D] */
    float *logits;  /* [n_chunks][W][N] */
    float *vote;    /* [n_chunks][N] */
    float *partial; /* [n_chunks][N] */
    float *tile;    /* [n_chunks][TILE][D] */
    int32_t bad[SK_MAX_CHUNKS]; /* per chunk: 1 if a logit was not finite */
} sk_job;

/* Max-pool v[b..e) into acc[b..e) (added), window [j - r, j + r] clipped to
 * [b, e): the prefix and the observation window are pooled apart, as SnapKV
 * pools only the prefix. */
static void pool_add(const float *v, size_t b, size_t e, int32_t r, float *acc) {
    for (size_t j = b; j < e; j++) {
        size_t lo = j >= b + (size_t)r ? j - (size_t)r : b, hi = KVM_MIN(e, j + (size_t)r + 1);
        float m = v[lo];
        for (size_t i = lo + 1; i < hi; i++) m = v[i] > m ? v[i] : m;
        acc[j] += m;
    }
}

static void sk_task(void *arg, size_t b, size_t e) {
    sk_job *s = arg;
    for (size_t c = b; c < e; c++) {
        float *qr = s->qrows + c * s->W * s->D, *lg = s->logits + c * s->W * s->N;
        float *vote = s->vote + c * s->N, *acc = s->partial + c * s->N;
        float *tile = s->tile + c * KVM_QMEM_TILE * s->D;
        memset(acc, 0, s->N * sizeof *acc);
        size_t t0 = c * s->n_tasks / s->n_chunks, t1 = (c + 1) * s->n_tasks / s->n_chunks;
        for (size_t t = t0; t < t1; t++) {
            size_t l = t / s->Hq, h = t % s->Hq, g = h / s->G;
            for (size_t w = 0; w < s->W; w++) {
                int64_t idx[3] = {(int64_t)w, (int64_t)l, (int64_t)h};
                kvm_tensor_read_f32(s->q, kvm_tensor_row_offset(s->q, idx), qr + w * s->D, s->D);
            }
            for (size_t j0 = 0; j0 < s->N; j0 += KVM_QMEM_TILE) {
                size_t n = KVM_MIN(s->N - j0, (size_t)KVM_QMEM_TILE), ks;
                const float *rows = kvm_qmem_k_rows(s->k, (int64_t)l, (int64_t)g, (int64_t)j0, n, s->D, tile, &ks);
                s->kk->qk(qr, s->W, s->D, rows, n, ks, s->scale, lg + j0, s->N);
            }
            /* non-finite K or q_obs: refused, not clamped by SIMD exp into a
             * plausible score (the logits are 1/head_dim of the reads) */
            if (kvm_cpu_kernels_get()->count_nonfinite(lg, s->W * s->N)) {
                s->bad[c] = 1;
                break;
            }
            memset(vote, 0, s->N * sizeof *vote);
            /* causal: window row w sits at position N - W + w */
            for (size_t w = 0; w < s->W; w++) s->kk->softmax_acc(lg + w * s->N, s->N - s->W + w + 1, vote);
            pool_add(vote, 0, s->N - s->W, s->radius, acc);
            pool_add(vote, s->N - s->W, s->N, s->radius, acc);
        }
    }
}

kvmem_status kvmem_snapkv_score(kvmem_context *ctx, const kvmem_model_spec *spec, const kvmem_tensor *q_obs,
                                const kvmem_tensor *k, int32_t pool_kernel, float *scores) {
    static const char fn[] = "kvmem_snapkv_score";
    if (!ctx) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    int64_t N;
    kvmem_status st = kvm_qmem_check_k(fn, spec, k, &N);
    if (st != KVMEM_OK) return st;
    if (!q_obs) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: q_obs is NULL", fn);
    if (q_obs->ndim != 4 || q_obs->shape[0] < 1 || q_obs->shape[0] > N)
        return kvm_fail(KVMEM_ERR_INVALID_ARG,
                        "%s: q_obs must be [W][n_layers][n_q_heads][head_dim] with W in [1, N = %lld]", fn,
                        (long long)N);
    int64_t qs[4] = {q_obs->shape[0], spec->n_layers, spec->n_q_heads, spec->head_dim};
    st = kvm_tensor_expect(q_obs, "q_obs", "[W][n_layers][n_q_heads][head_dim]", 4, qs);
    if (st != KVMEM_OK) return st;
    if (pool_kernel < 1 || pool_kernel % 2 == 0 || pool_kernel > 1025)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: pool kernel %d must be odd, in [1, 1025]", fn, pool_kernel);
    if (!scores) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: scores is NULL", fn);

    sk_job s;
    s.q = q_obs;
    s.k = k;
    s.kk = kvm_qk_kernels_get();
    s.Hq = (size_t)spec->n_q_heads;
    s.G = s.Hq / (size_t)spec->n_kv_heads;
    s.D = (size_t)spec->head_dim;
    s.N = (size_t)N;
    s.W = (size_t)q_obs->shape[0];
    s.n_tasks = (size_t)spec->n_layers * s.Hq;
    s.n_chunks = KVM_MIN(s.n_tasks, (size_t)SK_MAX_CHUNKS);
    s.radius = pool_kernel / 2;
    s.scale = (float)(1.0 / sqrt((double)s.D));
    size_t nl;
    if (!kvm_mul_size(s.n_chunks * s.W, s.N, &nl) || nl > SIZE_MAX / 8)
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for scratch of N = %lld positions (its size overflows)", fn, (long long)N);
    s.qrows = kvm_aligned_alloc(s.n_chunks * s.W * s.D * sizeof(float));
    s.logits = kvm_aligned_alloc(nl * sizeof(float));
    s.vote = kvm_aligned_alloc(s.n_chunks * s.N * sizeof(float));
    s.partial = kvm_aligned_alloc(s.n_chunks * s.N * sizeof(float));
    s.tile = kvm_aligned_alloc(s.n_chunks * KVM_QMEM_TILE * s.D * sizeof(float));
    if (!s.qrows || !s.logits || !s.vote || !s.partial || !s.tile) {
        kvm_aligned_free(s.qrows);
        kvm_aligned_free(s.logits);
        kvm_aligned_free(s.vote);
        kvm_aligned_free(s.partial);
        kvm_aligned_free(s.tile);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for scratch of N = %lld positions", fn, (long long)N);
    }
    memset(s.bad, 0, sizeof s.bad);
    kvm_parallel_for(ctx->tp, s.n_chunks, 1, sk_task, &s);
    for (size_t c = 0; c < s.n_chunks; c++)
        if (s.bad[c]) {
            kvm_aligned_free(s.qrows);
            kvm_aligned_free(s.logits);
            kvm_aligned_free(s.vote);
            kvm_aligned_free(s.partial);
            kvm_aligned_free(s.tile);
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: K or q_obs holds a non-finite value (or a logit overflows)", fn);
        }
    for (size_t j = 0; j < s.N; j++) {
        float v = 0.0f;
        for (size_t c = 0; c < s.n_chunks; c++) v += s.partial[c * s.N + j];
        scores[j] = v;
    }
    kvm_aligned_free(s.qrows);
    kvm_aligned_free(s.logits);
    kvm_aligned_free(s.vote);
    kvm_aligned_free(s.partial);
    kvm_aligned_free(s.tile);
    return KVMEM_OK;
}
