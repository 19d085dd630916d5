/* The CPU backend's retrieval device kernels (dev_score, dev_score_reduce,
 * dev_topk, dev_gather_rope; contracts in core/backend/backend.h): the reference
 * every device backend is compared with in
 * tests/backend/test_backend_retrieve.c. Buffers of the CPU backend are host
 * memory, so these read and write them in place.
 * They reuse the host ops' pieces (the scoring kernel table, kvm_cpu_topk,
 * kvm_rope_rotate) so the reference and the host path agree. */
#include "../backend/dev_args.h"
#include "score.h"
#include "../cpu/kernels.h"
#include "../rope/rope.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static size_t cpu_size(const kvmem_buffer *b) {
    size_t n = 0;
    kvm_cpu_buffer_span(b, &n);
    return n;
}

static void *at(const kvmem_buffer *b, size_t off) {
    size_t n;
    return (unsigned char *)kvm_cpu_buffer_span(b, &n) + off;
}

/* ---- dev_score ---- */

/* Scores of one (layer, KV head) item are computed for a chunk of query
 * tokens at a time, rows r = t * G + gi, with at most this many floats of
 * scores [n_blocks][rows] per chunk (one token's rows always fit). */
#define DEV_SCORE_CHUNK_FLOATS ((size_t)1 << 20)

typedef struct dev_score_job {
    const kvm_dev_score_args *a;
    const float *q, *smin, *smax;
    float *out;
    const kvm_score_kernels *kern;
    size_t G, tc; /* query heads per KV head, tokens per chunk */
    atomic_int failed;
} dev_score_job;

typedef struct dev_rank {
    float v;
    int32_t j;
} dev_rank;

/* Descending value, ties toward the lower block index. */
static int dev_rank_cmp(const void *x, const void *y) {
    const dev_rank *a = x, *b = y;
    if (a->v > b->v) return -1;
    if (a->v < b->v) return 1;
    return (a->j > b->j) - (a->j < b->j);
}

static void dev_score_item(const dev_score_job *job, size_t item, float *qp, float *qn, float *sc, float *tmp,
                           const float **bx, const float **bn, dev_rank *rk, float *colm) {
    const kvm_dev_score_args *a = job->a;
    const size_t L = (size_t)a->n_layers, NQ = (size_t)a->n_q_heads, H = (size_t)a->n_kv_heads;
    const size_t D = (size_t)a->head_dim, NB = (size_t)a->n_blocks, nq = (size_t)a->n_q, G = job->G;
    const size_t l = item / H, g = item % H;
    for (size_t j = 0; j < NB; j++) {
        bx[j] = job->smax + ((j * L + l) * H + g) * D;
        bn[j] = job->smin + ((j * L + l) * H + g) * D;
    }
    float *out0 = job->out + (l * NQ + g * G) * NB; /* rows of the group's heads */
    memset(out0, 0, G * NB * sizeof(float));        /* every p >= 0: MAX from 0 is the max */
    for (size_t t0 = 0; t0 < nq; t0 += job->tc) {
        const size_t tn = KVM_MIN(job->tc, nq - t0), R = tn * G;
        for (size_t t = 0; t < tn; t++)
            for (size_t gi = 0; gi < G; gi++) {
                const float *src = job->q + (((t0 + t) * L + l) * NQ + g * G + gi) * D;
                float *p = qp + (t * G + gi) * D, *n = qn + (t * G + gi) * D;
                for (size_t d = 0; d < D; d++) {
                    p[d] = src[d] > 0.0f ? src[d] : 0.0f;
                    n[d] = src[d] < 0.0f ? src[d] : 0.0f;
                }
            }
        /* I = q+ . s_max + q- . s_min */
        job->kern->rows(qp, R, bx, NB, D, sc, R);
        job->kern->rows(qn, R, bn, NB, D, tmp, R);
        for (size_t i = 0; i < NB * R; i++) sc[i] += tmp[i];
        if (a->norm == KVMEM_NORM_SOFTMAX) {
            for (size_t r = 0; r < R; r++) colm[r] = sc[r];
            for (size_t j = 1; j < NB; j++)
                for (size_t r = 0; r < R; r++) colm[r] = sc[j * R + r] > colm[r] ? sc[j * R + r] : colm[r];
            for (size_t j = 0; j < NB; j++)
                for (size_t r = 0; r < R; r++) sc[j * R + r] = a->tau * (sc[j * R + r] - colm[r]);
            job->kern->exp_neg(sc, NB * R);
            for (size_t r = 0; r < R; r++) colm[r] = 0.0f;
            for (size_t j = 0; j < NB; j++)
                for (size_t r = 0; r < R; r++) colm[r] += sc[j * R + r];
            for (size_t r = 0; r < R; r++) colm[r] = 1.0f / colm[r];
            for (size_t j = 0; j < NB; j++)
                for (size_t r = 0; r < R; r++) sc[j * R + r] *= colm[r];
        } else {
            for (size_t r = 0; r < R; r++) {
                for (size_t j = 0; j < NB; j++) {
                    rk[j].v = sc[j * R + r];
                    rk[j].j = (int32_t)j;
                }
                qsort(rk, NB, sizeof *rk, dev_rank_cmp);
                for (size_t k = 0; k < NB; k++) sc[(size_t)rk[k].j * R + r] = 1.0f / ((float)(k + 1) + a->rr_c);
            }
        }
        for (size_t gi = 0; gi < G; gi++) {
            float *o = out0 + gi * NB;
            for (size_t t = 0; t < tn; t++)
                for (size_t j = 0; j < NB; j++) {
                    float p = sc[j * R + t * G + gi];
                    o[j] = a->agg == KVMEM_AGG_SUM ? o[j] + p : (p > o[j] ? p : o[j]);
                }
        }
    }
}

static void dev_score_task(void *arg, size_t ib, size_t ie) {
    dev_score_job *job = arg;
    const size_t D = (size_t)job->a->head_dim, NB = (size_t)job->a->n_blocks, R = job->tc * job->G;
    float *qp = kvm_malloc(R * D * sizeof(float)), *qn = kvm_malloc(R * D * sizeof(float));
    float *sc = kvm_malloc(NB * R * sizeof(float)), *tmp = kvm_malloc(NB * R * sizeof(float)), *colm = kvm_malloc(R * sizeof(float));
    const float **bx = kvm_malloc(NB * sizeof *bx), **bn = kvm_malloc(NB * sizeof *bn);
    dev_rank *rk = job->a->norm == KVMEM_NORM_RR ? kvm_malloc(NB * sizeof *rk) : NULL;
    if (!qp || !qn || !sc || !tmp || !colm || !bx || !bn || (job->a->norm == KVMEM_NORM_RR && !rk))
        atomic_store(&job->failed, 1);
    else
        for (size_t it = ib; it < ie; it++) dev_score_item(job, it, qp, qn, sc, tmp, bx, bn, rk, colm);
    kvm_free(qp);
    kvm_free(qn);
    kvm_free(sc);
    kvm_free(tmp);
    kvm_free(colm);
    kvm_free((void *)bx);
    kvm_free((void *)bn);
    kvm_free(rk);
}

kvmem_status kvm_cpu_dev_score(kvmem_backend *be, const kvm_dev_score_args *a) {
    char msg[256];
    kvmem_status st = kvm_dev_score_check(a, cpu_size, msg, sizeof msg);
    if (st != KVMEM_OK) return kvm_fail(st, "%s", msg);
    dev_score_job job;
    memset(&job, 0, sizeof job);
    job.a = a;
    job.q = at(a->q, a->q_off);
    job.smin = at(a->s_min, a->s_off);
    job.smax = at(a->s_max, a->s_off);
    job.out = at(a->out, a->out_off);
    job.kern = kvm_cpu_kernels_get()->score;
    job.G = (size_t)(a->n_q_heads / a->n_kv_heads);
    job.tc = DEV_SCORE_CHUNK_FLOATS / ((size_t)a->n_blocks * job.G);
    job.tc = KVM_MAX((size_t)1, KVM_MIN(job.tc, (size_t)a->n_q));
    atomic_init(&job.failed, 0);
    kvm_threadpool *tp = be && be->ctx ? be->ctx->tp : NULL;
    kvm_parallel_for(tp, (size_t)a->n_layers * (size_t)a->n_kv_heads, 1, dev_score_task, &job);
    if (atomic_load(&job.failed)) return kvm_fail(KVMEM_ERR_NOMEM, "dev_score: out of memory for scoring scratch");
    return KVMEM_OK;
}

/* ---- dev_score_reduce ---- */

typedef struct dev_reduce_job {
    const kvm_dev_score_reduce_args *a;
    const float *in;
    float *out;
} dev_reduce_job;

/* Items [b, e) of out, item = s * n + j: the contract's order, spelled out
 * (a compiler may not reassociate float sums: no -ffast-math here). */
static void dev_reduce_task(void *arg, size_t b, size_t e) {
    const dev_reduce_job *job = arg;
    const size_t n = (size_t)job->a->n, Hn = (size_t)job->a->n_heads;
    const size_t per = (size_t)(job->a->n_layers / job->a->n_sets); /* layers of a set */
    for (size_t it = b; it < e; it++) {
        const size_t s = it / n, j = it % n;
        float acc = 0.0f;
        for (size_t l = s * per; l < (s + 1) * per; l++) {
            const float *x = job->in + l * Hn * n + j;
            float layer = 0.0f;
            for (size_t h = 0; h < Hn; h++) layer += x[h * n];
            acc += layer;
        }
        job->out[it] = acc;
    }
}

kvmem_status kvm_cpu_dev_score_reduce(kvmem_backend *be, const kvm_dev_score_reduce_args *a) {
    char msg[256];
    kvmem_status st = kvm_dev_score_reduce_check(a, cpu_size, msg, sizeof msg);
    if (st != KVMEM_OK) return kvm_fail(st, "%s", msg);
    dev_reduce_job job = {a, at(a->in, a->in_off), at(a->out, a->out_off)};
    kvm_parallel_for(be && be->ctx ? be->ctx->tp : NULL, (size_t)a->n_sets * (size_t)a->n, 256, dev_reduce_task, &job);
    return KVMEM_OK;
}

/* ---- dev_topk ---- */

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

kvmem_status kvm_cpu_dev_topk(kvmem_backend *be, const kvm_dev_topk_args *a) {
    char msg[256];
    kvmem_status st = kvm_dev_topk_check(a, cpu_size, msg, sizeof msg);
    if (st != KVMEM_OK) return kvm_fail(st, "%s", msg);
    if (a->n == 0 || a->k == 0) {
        *a->n_out = 0;
        return KVMEM_OK;
    }
    int32_t c = 0, *idx = at(a->idx, a->idx_off);
    /* kvm_cpu_topk writes in descending score order into a private array:
     * on failure the caller's buffer is unchanged. */
    int32_t *tmp = kvm_malloc((size_t)KVM_MIN(a->k, a->n) * sizeof *tmp);
    if (!tmp) return kvm_fail(KVMEM_ERR_NOMEM, "dev_topk: out of memory for %d candidates", KVM_MIN(a->k, a->n));
    st = kvm_cpu_topk(be, (const float *)at(a->scores, a->scores_off), a->n, a->k, tmp, &c);
    if (st == KVMEM_OK) {
        qsort(tmp, (size_t)c, sizeof *tmp, cmp_i32);
        memcpy(idx, tmp, (size_t)c * sizeof *tmp);
        *a->n_out = c;
    }
    kvm_free(tmp);
    return st;
}

/* ---- dev_gather_rope ---- */

typedef struct dev_gather_job {
    const kvm_dev_gather_args *a;
    const float *src, *cs;
    const uint32_t *idx;
    float *out;
    kvm_rope *rope; /* pairing and attn_factor only: the angles come in cs */
} dev_gather_job;

static void dev_gather_task(void *arg, size_t b, size_t e) {
    const dev_gather_job *job = arg;
    const kvm_dev_gather_args *a = job->a;
    const size_t row = a->n_heads * a->head_dim, np = a->rotary_dim / 2;
    for (size_t i = b; i < e; i++) {
        float *o = job->out + i * row;
        const uint32_t s = job->idx[i];
        if (s >= a->n_src) { /* a bad index gives a zero row */
            memset(o, 0, row * sizeof(float));
            continue;
        }
        memcpy(o, job->src + (size_t)s * a->src_rs, row * sizeof(float));
        if (!np) continue;
        const float *c = job->cs + i * np, *sn = job->cs + a->n_out * np + i * np;
        for (size_t h = 0; h < a->n_heads; h++) kvm_rope_rotate(job->rope, o + h * a->head_dim, c, sn, 0);
    }
}

kvmem_status kvm_cpu_dev_gather_rope(kvmem_backend *be, const kvm_dev_gather_args *a) {
    char msg[256];
    kvmem_status st = kvm_dev_gather_check(a, cpu_size, msg, sizeof msg);
    if (st != KVMEM_OK) return kvm_fail(st, "%s", msg);
    if (a->rotary_dim / 2 > KVM_ROPE_MAX_PAIRS)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "dev_gather_rope: rotary_dim %zu > %d", a->rotary_dim,
                        2 * KVM_ROPE_MAX_PAIRS);
    kvm_rope *rope = kvm_calloc(1, sizeof *rope);
    if (!rope) return kvm_fail(KVMEM_ERR_NOMEM, "dev_gather_rope: out of memory for the RoPE tables");
    rope->head_dim = (int32_t)a->head_dim;
    rope->rotary_dim = (int32_t)a->rotary_dim;
    rope->n_pairs = (int32_t)(a->rotary_dim / 2);
    rope->style = a->gptj ? KVMEM_ROPE_GPTJ : KVMEM_ROPE_NEOX;
    rope->attn_factor = a->attn_factor;
    dev_gather_job job = {a, at(a->src, a->src_off), a->rotary_dim ? at(a->cs, a->cs_off) : NULL,
                          at(a->idx, a->idx_off), at(a->out, a->out_off), rope};
    kvm_parallel_for(be && be->ctx ? be->ctx->tp : NULL, a->n_out, 64, dev_gather_task, &job);
    kvm_free(rope);
    return KVMEM_OK;
}
