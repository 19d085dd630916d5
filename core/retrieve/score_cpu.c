/* The CPU backend's retrieval scoring (op aabb_score) and top-k (op topk).
 *
 * Work is split by (layer, KV head): each item scores its head group's query
 * rows against every candidate block with the kernel table, then normalises
 * per query token and aggregates over tokens while the scores are still in
 * cache, so the full [tokens][layers][heads][blocks] score tensor is never
 * materialised (at 64k tokens and 32 query tokens it would be 0.5 GB). */
#include "score.h"
#include "../cpu/kernels.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if !defined(KVMEM_HAVE_AVX2)
const kvm_score_kernels *kvm_score_kernels_avx2(void) { return NULL; }
#endif
#if !defined(KVMEM_HAVE_AVX512)
const kvm_score_kernels *kvm_score_kernels_avx512(void) { return NULL; }
#endif
#if !defined(__wasm_simd128__) /* score_wasm128.c: WebAssembly build only */
const kvm_score_kernels *kvm_score_kernels_wasm128(void) { return NULL; }
#endif

const kvm_score_kernels *kvm_score_kernels_get(void) {
    const char *name = kvm_cpu_kernels_get()->name;
    const kvm_score_kernels *k = NULL;
    if (strcmp(name, "avx512") == 0) k = kvm_score_kernels_avx512();
    else if (strcmp(name, "avx2") == 0) k = kvm_score_kernels_avx2();
    else if (strcmp(name, "wasm128") == 0) k = kvm_score_kernels_wasm128();
    return k ? k : kvm_score_kernels_scalar();
}

/* Blocks scored per kernel call: 64 AABBs of head_dim 128 are 64 KiB, kept
 * in L2 while every row panel of the prefill passes over them. */
#define SCORE_CHUNK 64

typedef struct score_job {
    const kvm_score_desc *d;
    const kvm_score_kernels *kern;
    size_t G, R, K, ldo, kbuf_rows;
    int use_rows;
    float *qpack; /* block-major pass: packed query rows [item][R][K] */
    float *big; /* block-major pass: every item's scores [item][n_cand][ldo], or NULL */
    atomic_int failed;
} score_job;

typedef struct rank_item {
    float v;
    int32_t j;
} rank_item;

/* Descending value, ties toward the lower index (the older block). */
static int rank_cmp(const void *a, const void *b) {
    const rank_item *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return (x->j > y->j) - (x->j < y->j);
}

static void score_item(const score_job *job, size_t item, float *qbuf, float *sc, const float **bp,
                       float *kbuf, float *tmp) {
    const kvm_score_desc *d = job->d;
    const kvmem_pool *p = d->pool;
    const kvm_score_kernels *kern = job->kern;
    const size_t L = (size_t)p->spec.n_layers, NQ = (size_t)p->spec.n_q_heads, H = (size_t)p->spec.n_kv_heads;
    const size_t D = (size_t)p->spec.head_dim, G = job->G, R = job->R, K = job->K, ldo = job->ldo;
    const size_t nq = (size_t)d->n_q, nc = (size_t)d->n_cand;
    const size_t l = item / H, g = item % H;
    const int exact = d->mode == KVMEM_RETRIEVE_EXACT;

    /* Query rows of the group, r = gi * n_q + t: [q+ || q-] (AABB) or q (EXACT),
     * transposed into a zero-padded panel for the panel kernel. */
    if (!job->use_rows) memset(qbuf, 0, K * ldo * sizeof(float));
    for (size_t gi = 0; gi < G; gi++)
        for (size_t t = 0; t < nq; t++) {
            const size_t r = gi * nq + t;
            const float *src = d->q + ((t * L + l) * NQ + g * G + gi) * D;
            for (size_t k = 0; k < D; k++) {
                float x = src[k];
                float a = exact ? x : (x > 0.0f ? x : 0.0f), b = x < 0.0f ? x : 0.0f;
                if (job->use_rows) {
                    qbuf[r * K + k] = a;
                    if (!exact) qbuf[r * K + D + k] = b;
                } else {
                    qbuf[k * ldo + r] = a;
                    if (!exact) qbuf[(D + k) * ldo + r] = b;
                }
            }
        }

    if (!exact) {
        for (size_t j = 0; j < nc; j++) bp[j] = kvm_block_aabb(p, d->mem, d->cand[j], (int32_t)l, (int32_t)g);
        for (size_t j0 = 0; j0 < nc; j0 += SCORE_CHUNK) {
            size_t n = KVM_MIN((size_t)SCORE_CHUNK, nc - j0);
            if (job->use_rows) kern->rows(qbuf, R, bp + j0, n, K, sc + j0 * ldo, ldo);
            else kern->panel(qbuf, ldo, bp + j0, n, K, sc + j0 * ldo, ldo);
        }
    } else {
        for (size_t j = 0; j < nc; j++) {
            const kvm_block *blk = &d->mem->blocks[d->cand[j]];
            const size_t n = (size_t)blk->n_tokens;
            kvm_block_read_f32(p, blk, 0, (int32_t)l, (int32_t)g, 0, blk->n_tokens, kbuf);
            for (size_t i = 0; i < n; i++) bp[i] = kbuf + i * D;
            if (job->use_rows) kern->rows(qbuf, R, bp, n, K, tmp, ldo);
            else kern->panel(qbuf, ldo, bp, n, K, tmp, ldo);
            float *o = sc + j * ldo;
            memcpy(o, tmp, ldo * sizeof(float));
            for (size_t i = 1; i < n; i++)
                for (size_t r = 0; r < ldo; r++) o[r] = tmp[i * ldo + r] > o[r] ? tmp[i * ldo + r] : o[r];
        }
    }

}

/* Normalise item's scores sc[n_cand][ldo] per query token over the
 * candidates, aggregate over tokens, sum over the group's query heads. */
static void normalise_item(const score_job *job, size_t item, float *sc, float *colm, float *cols, rank_item *ranks) {
    const kvm_score_desc *d = job->d;
    const size_t G = job->G, R = job->R, ldo = job->ldo;
    const size_t nq = (size_t)d->n_q, nc = (size_t)d->n_cand;
    const kvm_score_kernels *kern = job->kern;
    /* Per-token normalisation over the candidates, column by column. */
    if (d->norm == KVMEM_NORM_SOFTMAX) {
        for (size_t r = 0; r < ldo; r++) colm[r] = sc[r];
        for (size_t j = 1; j < nc; j++)
            for (size_t r = 0; r < ldo; r++) colm[r] = sc[j * ldo + r] > colm[r] ? sc[j * ldo + r] : colm[r];
        const float tau = d->tau;
        for (size_t j = 0; j < nc; j++)
            for (size_t r = 0; r < ldo; r++) sc[j * ldo + r] = tau * (sc[j * ldo + r] - colm[r]);
        kern->exp_neg(sc, nc * ldo);
        for (size_t r = 0; r < ldo; r++) cols[r] = 0.0f;
        for (size_t j = 0; j < nc; j++)
            for (size_t r = 0; r < ldo; r++) cols[r] += sc[j * ldo + r];
        for (size_t r = 0; r < ldo; r++) cols[r] = 1.0f / cols[r];
        for (size_t j = 0; j < nc; j++)
            for (size_t r = 0; r < ldo; r++) sc[j * ldo + r] *= cols[r];
    } else {
        for (size_t r = 0; r < R; r++) {
            for (size_t j = 0; j < nc; j++) {
                ranks[j].v = sc[j * ldo + r];
                ranks[j].j = (int32_t)j;
            }
            qsort(ranks, nc, sizeof *ranks, rank_cmp);
            for (size_t k = 0; k < nc; k++) sc[(size_t)ranks[k].j * ldo + r] = 1.0f / ((float)(k + 1) + d->rr_c);
        }
    }

    /* Aggregate over the tokens of each query head, sum over the group. */
    float *out = d->out + item * nc;
    for (size_t j = 0; j < nc; j++) {
        const float *s = sc + j * ldo;
        float total = 0.0f;
        for (size_t gi = 0; gi < G; gi++) {
            float a = s[gi * nq];
            if (d->agg == KVMEM_AGG_MAX)
                for (size_t t = 1; t < nq; t++) a = s[gi * nq + t] > a ? s[gi * nq + t] : a;
            else
                for (size_t t = 1; t < nq; t++) a += s[gi * nq + t];
            total += a;
        }
        out[j] = total;
    }
}

static void score_task(void *arg, size_t ib, size_t ie) {
    score_job *job = arg;
    const kvm_score_desc *d = job->d;
    const size_t nc = (size_t)d->n_cand, K = job->K, ldo = job->ldo;
    const size_t D = (size_t)d->pool->spec.head_dim, kr = job->kbuf_rows;
    const int exact = d->mode == KVMEM_RETRIEVE_EXACT;
    float *qbuf = kvm_aligned_alloc(K * ldo * sizeof(float));
    float *sc = job->big ? NULL : kvm_aligned_alloc(nc * ldo * sizeof(float));
    const float **bp = kvm_malloc((exact ? kr : nc) * sizeof *bp);
    float *kbuf = exact ? kvm_aligned_alloc(kr * D * sizeof(float)) : NULL;
    float *tmp = exact ? kvm_aligned_alloc(kr * ldo * sizeof(float)) : NULL;
    float *colm = kvm_malloc(2 * ldo * sizeof(float));
    rank_item *ranks = d->norm == KVMEM_NORM_RR ? kvm_malloc(nc * sizeof *ranks) : NULL;
    if (!qbuf || (!sc && !job->big) || !bp || !colm || (exact && (!kbuf || !tmp)) || (d->norm == KVMEM_NORM_RR && !ranks)) {
        atomic_store(&job->failed, 1);
    } else {
        for (size_t it = ib; it < ie; it++) {
            float *s = job->big ? job->big + it * nc * ldo : sc;
            if (!job->big) score_item(job, it, qbuf, s, bp, kbuf, tmp);
            normalise_item(job, it, s, colm, colm + ldo, ranks);
        }
    }
    kvm_aligned_free(qbuf);
    kvm_aligned_free(sc);
    kvm_free((void *)bp);
    kvm_aligned_free(kbuf);
    kvm_aligned_free(tmp);
    kvm_free(colm);
    kvm_free(ranks);
}

/* Decode-sized scoring in block-major order: a task takes a few consecutive
 * candidates and scores every (layer, KV head) for them, so it reads the
 * agent's AABB array (or each block's keys, EXACT) as a handful of sequential
 * streams (an item-major pass would jump 2 * L * H * head_dim floats between
 * blocks: a new page, and a TLB miss, per 1 KiB box). */
#define BM_BLOCKS 8

size_t kvm_score_block_major_max_bytes = (size_t)64 << 20;

static void block_major_task(void *arg, size_t cb, size_t ce) {
    score_job *job = arg;
    const kvm_score_desc *d = job->d;
    const kvmem_pool *p = d->pool;
    const size_t H = (size_t)p->spec.n_kv_heads, items = (size_t)p->spec.n_layers * H, D = (size_t)p->spec.head_dim;
    const size_t R = job->R, K = job->K, nc = (size_t)d->n_cand, kr = job->kbuf_rows;
    const int exact = d->mode == KVMEM_RETRIEVE_EXACT;
    float *kbuf = exact ? kvm_aligned_alloc(kr * D * sizeof(float)) : NULL;
    float *tmp = exact ? kvm_aligned_alloc(kr * R * sizeof(float)) : NULL;
    const float **kp = exact ? kvm_malloc(kr * sizeof *kp) : NULL;
    if (exact && (!kbuf || !tmp || !kp)) {
        atomic_store(&job->failed, 1);
        ce = cb;
    }
    for (size_t c = cb; c < ce; c++) {
        const size_t j0 = c * BM_BLOCKS, n = KVM_MIN((size_t)BM_BLOCKS, nc - j0);
        for (size_t item = 0; item < items; item++) {
            const int32_t l = (int32_t)(item / H), g = (int32_t)(item % H);
            const float *qi = job->qpack + item * R * K;
            float *out = job->big + (item * nc + j0) * R;
            if (!exact) {
                const float *bp[BM_BLOCKS];
                for (size_t j = 0; j < n; j++) bp[j] = kvm_block_aabb(p, d->mem, d->cand[j0 + j], l, g);
                job->kern->rows(qi, R, bp, n, K, out, R);
                continue;
            }
            for (size_t j = 0; j < n; j++) {
                const kvm_block *blk = &d->mem->blocks[d->cand[j0 + j]];
                const size_t nt = (size_t)blk->n_tokens;
                kvm_block_read_f32(p, blk, 0, l, g, 0, blk->n_tokens, kbuf);
                for (size_t i = 0; i < nt; i++) kp[i] = kbuf + i * D;
                job->kern->rows(qi, R, kp, nt, K, tmp, R);
                float *o = out + j * R;
                memcpy(o, tmp, R * sizeof(float));
                for (size_t i = 1; i < nt; i++)
                    for (size_t r = 0; r < R; r++) o[r] = tmp[i * R + r] > o[r] ? tmp[i * R + r] : o[r];
            }
        }
    }
    kvm_aligned_free(kbuf);
    kvm_aligned_free(tmp);
    kvm_free((void *)kp);
}

/* Query rows of every item, [item][R][K]: [q+ || q-] (AABB) or q (EXACT),
 * for the block-major pass. */
static void pack_all_queries(const score_job *job) {
    const kvm_score_desc *d = job->d;
    const kvmem_pool *p = d->pool;
    const size_t L = (size_t)p->spec.n_layers, NQ = (size_t)p->spec.n_q_heads, H = (size_t)p->spec.n_kv_heads;
    const size_t D = (size_t)p->spec.head_dim, G = job->G, R = job->R, K = job->K, nq = (size_t)d->n_q;
    const int exact = d->mode == KVMEM_RETRIEVE_EXACT;
    for (size_t item = 0; item < L * H; item++) {
        const size_t l = item / H, g = item % H;
        for (size_t gi = 0; gi < G; gi++)
            for (size_t t = 0; t < nq; t++) {
                const float *src = d->q + ((t * L + l) * NQ + g * G + gi) * D;
                float *row = job->qpack + (item * R + gi * nq + t) * K;
                for (size_t k = 0; k < D; k++) {
                    if (exact) {
                        row[k] = src[k];
                    } else {
                        row[k] = src[k] > 0.0f ? src[k] : 0.0f;
                        row[D + k] = src[k] < 0.0f ? src[k] : 0.0f;
                    }
                }
            }
    }
}

kvmem_status kvm_cpu_aabb_score(kvmem_backend *be, const kvm_score_desc *d) {
    const kvmem_pool *p = d->pool;
    if (d->n_cand <= 0 || d->n_q <= 0) return KVMEM_OK;
    score_job job;
    memset(&job, 0, sizeof job);
    job.d = d;
    job.kern = d->kern ? d->kern : kvm_score_kernels_get();
    job.G = (size_t)(p->spec.n_q_heads / p->spec.n_kv_heads);
    job.R = job.G * (size_t)d->n_q;
    job.K = (size_t)p->spec.head_dim * (d->mode == KVMEM_RETRIEVE_EXACT ? 1 : 2);
    job.use_rows = job.R < job.kern->rows_below;
    job.ldo = job.use_rows ? job.R : (job.R + KVM_SCORE_ROW_PAD - 1) / KVM_SCORE_ROW_PAD * KVM_SCORE_ROW_PAD;
    int32_t maxrows = 1;
    for (int32_t j = 0; j < d->n_cand; j++) maxrows = KVM_MAX(maxrows, d->mem->blocks[d->cand[j]].n_tokens);
    job.kbuf_rows = (size_t)maxrows;
    atomic_init(&job.failed, 0);
    size_t items = (size_t)p->spec.n_layers * (size_t)p->spec.n_kv_heads;
    kvm_threadpool *tp = be && be->ctx ? be->ctx->tp : NULL;
    /* Few query rows (decode): score block-major into one buffer first when
     * it stays small (both modes, so EXACT gets the same access pattern);
     * normalisation then runs per item. */
    size_t big_bytes = items * (size_t)d->n_cand * job.ldo * sizeof(float);
    if (job.use_rows && big_bytes <= kvm_score_block_major_max_bytes) {
        job.big = kvm_aligned_alloc(big_bytes);
        job.qpack = kvm_aligned_alloc(items * job.R * job.K * sizeof(float));
        if (!job.big || !job.qpack) {
            kvm_aligned_free(job.big);
            job.big = NULL; /* fall back to the item-major pass */
        } else {
            pack_all_queries(&job);
            size_t chunks = ((size_t)d->n_cand + BM_BLOCKS - 1) / BM_BLOCKS;
            kvm_parallel_for(tp, chunks, 4, block_major_task, &job);
        }
    }
    size_t grain = items / (4 * (size_t)kvm_threadpool_size(tp));
    if (!atomic_load(&job.failed)) kvm_parallel_for(tp, items, grain ? grain : 1, score_task, &job);
    kvm_aligned_free(job.big);
    kvm_aligned_free(job.qpack);
    if (atomic_load(&job.failed)) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_retrieve: out of memory for scoring scratch");
    return KVMEM_OK;
}

kvmem_status kvm_cpu_topk(kvmem_backend *be, const float *score, int32_t n, int32_t k, int32_t *out_idx,
                          int32_t *n_out) {
    (void)be;
    *n_out = 0;
    if (n <= 0 || k <= 0) return KVMEM_OK;
    rank_item *it = kvm_malloc((size_t)n * sizeof *it);
    if (!it) return kvm_fail(KVMEM_ERR_NOMEM, "topk: out of memory for ranking %d candidates", n);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if (!isnan(score[i])) {
            it[m].v = score[i];
            it[m].j = i;
            m++;
        }
    qsort(it, (size_t)m, sizeof *it, rank_cmp);
    int32_t c = KVM_MIN(k, m);
    for (int32_t i = 0; i < c; i++) out_idx[i] = it[i].j;
    *n_out = c;
    kvm_free(it);
    return KVMEM_OK;
}
