/* The rule score on the CPU: for each (layer, KV head) the G query heads of
 * the group read the same key rows once (one register-tiled pass), then a
 * softmax per query head over all candidates is accumulated into a partial
 * score. Work is split into a fixed number of chunks, each with its own
 * partial sum, reduced in chunk order, so the result does not depend on
 * the thread count. */
#include "qk_kernels.h"
#include "qmem_internal.h"

#include "../context.h"
#include "../cpu/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define QS_MAX_CHUNKS 16
#undef KVM_QMEM_TILE
#define KVM_QMEM_TILE 32 /* rows per step: prefetch distance */

const float *kvm_qmem_k_rows(const kvmem_tensor *k, int64_t l, int64_t g, int64_t j0, size_t n,
                             size_t D, float *scratch, size_t *kstride) {
    int64_t base = l * k->strides[0] + j0 * k->strides[1] + g * k->strides[2];
    if (k->dtype == KVMEM_F32 && (k->strides[3] == 1 || D == 1)) {
        *kstride = (size_t)k->strides[1];
        return (const float *)k->data + base;
    }
    for (size_t i = 0; i < n; i++)
        kvm_tensor_read_f32(k, base + (int64_t)i * k->strides[1], scratch + i * D, D);
    *kstride = D;
    return scratch;
}

void kvm_qmem_k_prefetch(const kvmem_tensor *k, int64_t l, int64_t g, int64_t j0, size_t n, size_t D) {
#if defined(__GNUC__) || defined(__clang__)
    /* Key rows of one KV head sit n_kv_heads * head_dim floats apart, often a
     * page each: the hardware prefetcher does not follow that, so ask. */
    if (k->dtype != KVMEM_F32 || (k->strides[3] != 1 && D != 1)) return;
    const float *base = (const float *)k->data + l * k->strides[0] + g * k->strides[2];
    for (size_t i = 0; i < n; i++) {
        const char *r = (const char *)(base + (j0 + (int64_t)i) * k->strides[1]);
        for (size_t b = 0; b < D * sizeof(float); b += 64) __builtin_prefetch(r + b, 0, 0);
    }
#else
    (void)k; (void)l; (void)g; (void)j0; (void)n; (void)D;
#endif
}

kvmem_status kvm_qmem_check_k(const char *fn, const kvmem_model_spec *spec, const kvmem_tensor *k,
                              int64_t *n) {
    if (!spec) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: spec is NULL", fn);
    kvmem_status st = kvmem_model_spec_validate(spec);
    if (st != KVMEM_OK) return st;
    if (!k) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: K is NULL", fn);
    if (k->ndim != 4)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: K has %d dims, expected 4 [n_layers][N][n_kv_heads][head_dim]",
                        fn, k->ndim);
    if (k->shape[1] < 1 || k->shape[1] > INT32_MAX)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: K has N = %lld candidates, expected [1, INT32_MAX]", fn,
                        (long long)k->shape[1]);
    int64_t shape[4] = {spec->n_layers, k->shape[1], spec->n_kv_heads, spec->head_dim};
    st = kvm_tensor_expect(k, "K", "[n_layers][N][n_kv_heads][head_dim]", 4, shape);
    if (st != KVMEM_OK) return st;
    *n = k->shape[1];
    return KVMEM_OK;
}

typedef struct {
    const kvmem_tensor *k;
    const float *mem;
    const kvm_qk_kernels *kk;
    size_t L, Hq, Hkv, G, D, N, n_chunks;
    float scale;
    float *partial; /* [n_chunks][N] */
    float *logits;  /* [n_chunks][Hq][N] */
    float *tile;    /* [n_chunks][TILE][D] */
    int32_t bad[QS_MAX_CHUNKS]; /* per chunk: 1 + the first layer with a non-finite logit, or 0 */
} qs_job;

/* A chunk is a range of layers. Within a layer, key rows are swept once in
 * tiles of TILE positions, every KV head of a tile before the next tile:
 * one token's keys of all heads are contiguous in the usual layout, so the
 * sweep reads memory in order (per-head sweeps jump a page per row and ran
 * at a tenth of the bandwidth). */
static void qs_task(void *arg, size_t b, size_t e) {
    qs_job *q = arg;
    for (size_t c = b; c < e; c++) {
        float *acc = q->partial + c * q->N, *lg = q->logits + c * q->Hq * q->N;
        float *tile = q->tile + c * KVM_QMEM_TILE * q->D;
        memset(acc, 0, q->N * sizeof *acc);
        size_t l0 = c * q->L / q->n_chunks, l1 = (c + 1) * q->L / q->n_chunks;
        for (size_t l = l0; l < l1; l++) {
            for (size_t j0 = 0; j0 < q->N; j0 += KVM_QMEM_TILE) {
                size_t n = KVM_MIN(q->N - j0, (size_t)KVM_QMEM_TILE), ks;
                size_t nn = KVM_MIN(q->N - j0 - n, (size_t)KVM_QMEM_TILE);
                for (size_t g = 0; g < q->Hkv; g++) {
                    kvm_qmem_k_prefetch(q->k, (int64_t)l, (int64_t)g, (int64_t)(j0 + n), nn, q->D);
                    const float *rows = kvm_qmem_k_rows(q->k, (int64_t)l, (int64_t)g, (int64_t)j0, n, q->D, tile, &ks);
                    q->kk->qk(q->mem + (l * q->Hq + g * q->G) * q->D, q->G, q->D, rows, n, ks, q->scale,
                              lg + g * q->G * q->N + j0, q->N);
                }
            }
            /* a non-finite K (or an overflowing logit) would be ignored by
             * the max and clamped by SIMD exp into a plausible score: refuse
             * it; the logits are 1/head_dim of K, so the check is cheap */
            if (kvm_cpu_kernels_get()->count_nonfinite(lg, q->Hq * q->N)) {
                q->bad[c] = (int32_t)l + 1;
                break;
            }
            for (size_t h = 0; h < q->Hq; h++) q->kk->softmax_acc(lg + h * q->N, q->N, acc);
        }
    }
}

typedef struct {
    const float *partial;
    size_t n_chunks, N;
    float *out;
} qs_reduce;

static void qs_reduce_task(void *arg, size_t b, size_t e) {
    const qs_reduce *r = arg;
    for (size_t j = b; j < e; j++) {
        float s = 0.0f;
        for (size_t c = 0; c < r->n_chunks; c++) s += r->partial[c * r->N + j];
        r->out[j] = s;
    }
}

kvmem_status kvm_cpu_qmem_score(kvmem_backend *be, const kvmem_model_spec *spec, const float *memory,
                                const kvmem_tensor *k, float *scores) {
    qs_job q;
    q.k = k;
    q.mem = memory;
    q.kk = kvm_qk_kernels_get();
    q.Hq = (size_t)spec->n_q_heads;
    q.Hkv = (size_t)spec->n_kv_heads;
    q.G = q.Hq / q.Hkv;
    q.D = (size_t)spec->head_dim;
    q.N = (size_t)k->shape[1];
    q.L = (size_t)spec->n_layers;
    q.n_chunks = KVM_MIN(q.L, (size_t)QS_MAX_CHUNKS);
    q.scale = (float)(1.0 / sqrt((double)q.D));
    size_t np, nl, nt;
    if (!kvm_mul_size(q.n_chunks, q.N, &np) || !kvm_mul_size(np, q.Hq, &nl) ||
        !kvm_mul_size(q.n_chunks * KVM_QMEM_TILE, q.D, &nt) || nl > SIZE_MAX / 8)
        return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_qmem_score: out of memory for scratch of N = %zu candidates (its size overflows)", q.N);
    q.partial = kvm_aligned_alloc(np * sizeof(float));
    q.logits = kvm_aligned_alloc(nl * sizeof(float));
    q.tile = kvm_aligned_alloc(nt * sizeof(float));
    if (!q.partial || !q.logits || !q.tile) {
        kvm_aligned_free(q.partial);
        kvm_aligned_free(q.logits);
        kvm_aligned_free(q.tile);
        return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_qmem_score: out of memory for scratch of N = %zu candidates", q.N);
    }
    kvm_threadpool *tp = be && be->ctx ? be->ctx->tp : NULL;
    memset(q.bad, 0, sizeof q.bad);
    kvm_parallel_for(tp, q.n_chunks, 1, qs_task, &q);
    for (size_t c = 0; c < q.n_chunks; c++)
        if (q.bad[c]) { /* scores are untouched */
            kvm_aligned_free(q.partial);
            kvm_aligned_free(q.logits);
            kvm_aligned_free(q.tile);
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_qmem_score: K at layer %d holds a non-finite value (or a logit overflows)",
                            q.bad[c] - 1);
        }
    qs_reduce r = {q.partial, q.n_chunks, q.N, scores};
    kvm_parallel_for(tp, q.N, 4096, qs_reduce_task, &r);
    kvm_aligned_free(q.partial);
    kvm_aligned_free(q.logits);
    kvm_aligned_free(q.tile);
    return KVMEM_OK;
}
