/* The CPU backend's retrieval scoring: its dev_score entry, every form of
 * it (core/backend/backend.h), the only normalisation the CPU runs.
 *
 * Decode-sized problems (few query rows) run BLOCK-MAJOR: one pass over the
 * candidates' boxes (or keys, EXACT: F16 and F32 blocks read in place, each
 * block's K half streamed once through the exact kernels, which widen f16 in
 * registers and keep the max over the block's rows) in chunks of consecutive blocks, each
 * chunk scored for every (layer, KV head) item into a [block][item][row]
 * score array, its column maxima m_c taken while it is in cache. Once every
 * chunk is done, the global maxima m are known; a second pass over the
 * chunks takes e = exp(tau (I - m)) in place and each chunk's column sums
 * z_c, and Z = sum_c z_c (chunks in order). A block's set score is one dot
 * product of its e row with 1 / Z (aggregation over tokens folded in). e
 * is taken from the global m, never from a chunk's maximum rescaled: a
 * block's score is then a function of its box and the query alone (and of
 * the call's m and Z), so identical boxes score identically wherever the
 * chunk boundaries fall. Chunks depend on the problem, not on the thread
 * count, so Z (and every score) is the same on any number of threads. Each
 * score is exponentiated once. The agent's boxes are read once, as a
 * few sequential streams, and nothing is sorted (RR norm ranks per column
 * instead).
 *
 * Larger problems (prefill: many rows) run ITEM-MAJOR: each (layer, KV head)
 * item scores its query rows against every candidate with the panel kernel,
 * then normalises and aggregates while the scores are in cache, so the full
 * [tokens][layers][heads][blocks] tensor is never materialised (at 64k
 * tokens and 32 query tokens it would be 0.5 GB).
 *
 * Boxes are read where they lie: the pool's own array (PAIRED, f16 or f32,
 * the candidates named by a list) for the core's calls; the SPLIT form of
 * the buffer-level contract is first packed into that layout. Keys (EXACT)
 * come through the caller's callbacks: F16 and F32 rows in memory in place,
 * others decoded. Outputs are the per-set sums (n_sets > 0: what retrieval
 * keeps) or the per (layer, query head) scores of the buffer-level form,
 * from the same normalisation.
 *
 * Working memory comes from the backend's cache (cpu/scratch.h); threads
 * take work by atomic counter, each with its own slot of that memory. */

#include "cpu_backend.h"
#include "kernels.h"
#include "half.h"
#include "workbuf.h"
#include "../internal.h"
#include "../backend/dev_args.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#  define KVM_PREFETCH(p) __builtin_prefetch(p)
#else
#  define KVM_PREFETCH(p) ((void)(p))
#endif

/* ---- shared pieces ---- */

/* Blocks scored per kernel call in the block-major pass (a multiple of
 * every table's tile: 2 and 3). */
#define BM_GROUP 3
/* Chunks the block-major pass aims at, for the threads to share... */
#define BM_MIN_CHUNKS 64
/* ...none smaller than this many bytes of boxes: below, each chunk's calls
 * cost more than its blocks (a decode over a few hundred KiB is one or two
 * chunks, no threads). */
#define BM_MIN_CHUNK_BYTES ((size_t)256 << 10)

/* Blocks scored per item-major kernel call: 64 AABBs of head_dim 128 are 64
 * KiB (f32), kept in L2 while every row panel of the prefill passes over them. */
#define SCORE_CHUNK 64

size_t kvm_score_block_major_max_bytes = (size_t)64 << 20;

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

typedef struct slot {
    /* EXACT: keys of one (block, layer, head) as f32; item-major: their row scores */
    float *kbuf, *tmp;
    /* item-major */
    float *qbuf, *sc, *colm, *boxf;
    const float **bp;
    /* RR */
    rank_item *ranks;
    float *col; /* one item's scores [n_cand][R] */
    float *gm;  /* one block's AGG_MAX group maxima [G] */
} slot;

typedef struct score_job {
    const kvm_dev_score_args *d;
    const kvm_score_kernels *kern;
    const float *q;             /* [n_q][L][NQ][D] */
    const unsigned char *boxes; /* [.][L][H][2][D] of esz, s_max then s_min */
    const int32_t *blocks;      /* candidate j's box, or NULL: j */
    float *out;
    size_t L, H, NQ, D, G, R, K, items, cols, nc, nq, ldo, kbuf_rows, esz;
    size_t n_sets;              /* sets of the output; per_head: L * NQ, one (layer, query head) each */
    int exact, use_rows, per_head;
    float *qpack; /* block-major: [item][R][D] raw query rows */
    float *sc;    /* block-major: scores [n_cand][cols], cols = items * R */
    size_t chunk, n_chunks;
    float *cm, *cz; /* softmax: per chunk column maxima and sums [n_chunks][cols]; cz + 2 rows: m, 1 / Z */
    float *oi;      /* per item results [items][n_cand], per_head [items][G][n_cand] (RR, item-major) */
    slot *slots;
    atomic_size_t next;
    size_t n_work;
    atomic_int overflow; /* a relevance I was not finite (the query's products overflow f32) */
} score_job;

/* Relevances are finite for finite inputs unless a product or sum
 * overflows; such a call's scores are all NaN (the contract's signal, which
 * the core refuses) rather than normalised into plausible numbers. */
static void check_finite(score_job *job, const float *x, size_t n) {
    if (kvm_cpu_kernels_get()->count_nonfinite(x, n)) atomic_store(&job->overflow, 1);
}

/* The box of candidate j for (l, g): 2 * D elements of esz. */
static inline const void *box_at(const score_job *job, size_t j, size_t l, size_t g) {
    const size_t b = job->blocks ? (size_t)job->blocks[j] : j;
    return job->boxes + ((b * job->L + l) * job->H + g) * 2 * job->D * job->esz;
}

/* The same box as 2 * D floats. */
static void box_f32(const score_job *job, size_t j, size_t l, size_t g, float *dst) {
    const void *b = box_at(job, j, l, g);
    if (job->esz == 4) memcpy(dst, b, 2 * job->D * sizeof(float));
    else kvm_cpu_kernels_get()->f16_to_f32(b, dst, 2 * job->D);
}

/* [q+ || q-] of one query row; restrict lets the compiler vectorize it (a
 * scalar compare per element mispredicts on the query's random signs). */
static void split_row(const float *restrict src, float *restrict pos, float *restrict neg, size_t D) {
    for (size_t k = 0; k < D; k++) {
        const float v = src[k];
        pos[k] = v > 0.0f ? v : 0.0f;
        neg[k] = v < 0.0f ? v : 0.0f;
    }
}

/* Query rows of item (l, g), r = gi * n_q + t, raw or split into [q+ || q-]. */
static void pack_rows(const score_job *job, size_t item, float *dst, int split) {
    const size_t l = item / job->H, g = item % job->H, D = job->D, nq = job->nq;
    for (size_t gi = 0; gi < job->G; gi++)
        for (size_t t = 0; t < nq; t++) {
            const float *src = job->q + ((t * job->L + l) * job->NQ + g * job->G + gi) * D;
            float *row = dst + (gi * nq + t) * (split ? 2 * D : D);
            if (!split) {
                memcpy(row, src, D * sizeof(float));
                continue;
            }
            split_row(src, row, row + D, D);
        }
}

/* Per-token normalisation of one item's scores sc[n_cand][ldo] (rows r < R)
 * over the candidates, aggregation over tokens and the sum over the group:
 * o[j] for every candidate (per_head: o[gi][j] per query head of the
 * group). sc is overwritten. Softmax leaves e = exp(tau (I - m)) in sc and
 * the weights 1 / Z in w; the aggregation takes each e * w as it goes (one
 * pass fewer over the scores, the same products). */
static void normalise_item(const score_job *job, float *sc, size_t ldo, float *colm, rank_item *ranks, float *gm,
                           float *o) {
    const kvm_dev_score_args *d = job->d;
    const size_t G = job->G, R = job->R, nq = job->nq, nc = job->nc;
    const float *w = NULL;
    if (d->norm == KVMEM_NORM_SOFTMAX) {
        float *cols = colm + ldo;
        for (size_t r = 0; r < R; r++) colm[r] = -INFINITY, cols[r] = 0.0f;
        job->kern->col_max(sc, nc, ldo, R, colm);
        job->kern->col_exp_sum(sc, nc, ldo, R, colm, d->tau, cols);
        for (size_t r = 0; r < R; r++) cols[r] = 1.0f / cols[r];
        w = cols;
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
    for (size_t j = 0; j < nc; j++) {
        const float *s = sc + j * ldo;
        float total = 0.0f;
        if (d->agg == KVMEM_AGG_MAX) job->kern->group_max(s, w, G, nq, gm);
        for (size_t gi = 0; gi < G; gi++) {
            float a;
            if (d->agg == KVMEM_AGG_MAX) {
                a = gm[gi];
            } else {
                const float *x = s + gi * nq, *wg = w ? w + gi * nq : NULL;
                a = wg ? x[0] * wg[0] : x[0];
                for (size_t t = 1; t < nq; t++) a += wg ? x[t] * wg[t] : x[t];
            }
            if (job->per_head) o[gi * nc + j] = a;
            total += a;
        }
        if (!job->per_head) o[j] = total;
    }
}

/* out[s][j] = sum of oi[item][j] over the items of set s (layer order, in
 * double: up to n_layers * n_kv_heads terms); per_head: oi is the output. */
static void sum_sets(const score_job *job) {
    const size_t nc = job->nc, per = job->items / job->n_sets;
    if (job->per_head) {
        memcpy(job->out, job->oi, job->items * job->G * nc * sizeof(float));
        return;
    }
    for (size_t s = 0; s < job->n_sets; s++)
        for (size_t j = 0; j < nc; j++) {
            double acc = 0;
            for (size_t it = s * per; it < (s + 1) * per; it++) acc += job->oi[it * nc + j];
            job->out[s * nc + j] = (float)acc;
        }
}

/* ---- block-major pass (decode) ---- */

/* EXACT, block-major: block j's scores for every item. Keys in memory as
 * F16 or F32 are read in place, the block's K half ([L][H] sections of n
 * rows, in item order) streamed once front to back; others (other storage
 * dtypes, a mapped agent's blocks) are decoded section by section into the
 * slot's buffer, then scored by exact_f32 (the same arithmetic as exact_f16
 * on the widened values: a mapped agent scores bit for bit as the loaded
 * one). */
static void exact_row(const score_job *job, const slot *s, size_t j, float *out) {
    const kvm_dev_keys *keys = job->d->keys;
    const int32_t b = job->blocks ? job->blocks[j] : (int32_t)j;
    const size_t R = job->R, D = job->D;
    for (size_t item = 0; item < job->items; item++) {
        const float *q = job->qpack + item * R * D;
        const int32_t l = (int32_t)(item / job->H), g = (int32_t)(item % job->H);
        int32_t n = 0;
        kvmem_dtype dt = KVMEM_F32;
        const void *rows = keys->rows ? keys->rows(keys->ctx, b, l, g, &n, &dt) : NULL;
        if (!rows) {
            keys->read(keys->ctx, b, l, g, s->kbuf, &n);
            job->kern->exact_f32(q, R, s->kbuf, (size_t)n, D, out + item * R);
        } else if (dt == KVMEM_F16) {
            job->kern->exact_f16(q, R, rows, (size_t)n, D, out + item * R);
        } else {
            job->kern->exact_f32(q, R, rows, (size_t)n, D, out + item * R);
        }
    }
}

static void bm_chunk(score_job *job, const slot *s, size_t c) {
    const kvm_dev_score_args *d = job->d;
    const size_t j0 = c * job->chunk, j1 = KVM_MIN(job->nc, j0 + job->chunk), cols = job->cols, R = job->R;
    for (size_t j = j0; job->exact && j < j1; j++) exact_row(job, s, j, job->sc + j * cols);
    for (size_t j = j0; !job->exact && j < j1; j += BM_GROUP) {
        const size_t n = KVM_MIN((size_t)BM_GROUP, j1 - j);
        for (size_t item = 0; item < job->items; item++) {
            const int32_t l = (int32_t)(item / job->H), g = (int32_t)(item % job->H);
            const float *q = job->qpack + item * R * job->D;
            float *out = job->sc + j * cols + item * R;
            if (job->esz == 2) {
                const uint16_t *bp[BM_GROUP];
                for (size_t x = 0; x < n; x++) bp[x] = box_at(job, j + x, (size_t)l, (size_t)g);
                job->kern->aabb_rows_f16(q, R, bp, n, job->D, out, cols);
            } else {
                const float *bp[BM_GROUP];
                for (size_t x = 0; x < n; x++) bp[x] = box_at(job, j + x, (size_t)l, (size_t)g);
                job->kern->aabb_rows_f32(q, R, bp, n, job->D, out, cols);
            }
        }
    }
    check_finite(job, job->sc + j0 * cols, (j1 - j0) * cols);
    if (d->norm != KVMEM_NORM_SOFTMAX) return;
    /* the chunk's maxima, while its scores are in cache */
    float *m = job->cm + c * cols;
    for (size_t k = 0; k < cols; k++) m[k] = -INFINITY;
    job->kern->col_max(job->sc + j0 * cols, j1 - j0, cols, cols, m);
}

/* The chunk's e = exp(tau (I - m)) in place, from the global maxima m
 * (cz's row n_chunks), and its column sums z_c. */
static void bm_exp(score_job *job, size_t c) {
    const size_t j0 = c * job->chunk, j1 = KVM_MIN(job->nc, j0 + job->chunk), cols = job->cols;
    float *z = job->cz + c * cols;
    for (size_t k = 0; k < cols; k++) z[k] = 0.0f;
    job->kern->col_exp_sum(job->sc + j0 * cols, j1 - j0, cols, cols, job->cz + job->n_chunks * cols, job->d->tau, z);
}

/* Set scores of the chunk's blocks: e rows against the weights 1 / Z
 * (cz's last row). A set is `per` consecutive columns: a layer's or every
 * layer's items, or per_head one (layer, query head)'s n_q tokens. */
static void bm_finish(score_job *job, size_t c) {
    const kvm_dev_score_args *d = job->d;
    const size_t j0 = c * job->chunk, j1 = KVM_MIN(job->nc, j0 + job->chunk), cols = job->cols;
    const size_t per = cols / job->n_sets, nq = job->nq;
    const float *w = job->cz + (job->n_chunks + 1) * cols;
    for (size_t j = j0; j < j1; j++) {
        const float *e = job->sc + j * cols;
        for (size_t s = 0; s < job->n_sets; s++) {
            if (d->agg == KVMEM_AGG_SUM || nq == 1) {
                job->out[s * job->nc + j] = job->kern->dot(e + s * per, w + s * per, per);
                continue;
            }
            float total = 0.0f;
            for (size_t gr = s * per; gr < (s + 1) * per; gr += nq) { /* one (item, query head): max over tokens */
                float a = e[gr] * w[gr];
                for (size_t t = 1; t < nq; t++) a = e[gr + t] * w[gr + t] > a ? e[gr + t] * w[gr + t] : a;
                total += a;
            }
            job->out[s * job->nc + j] = total;
        }
    }
}

/* RR: one item's ranks per column, aggregated, into oi[item]. */
static void bm_rank_item(score_job *job, const slot *s, size_t item) {
    const size_t nc = job->nc, R = job->R, cols = job->cols;
    for (size_t j = 0; j < nc; j++) memcpy(s->col + j * R, job->sc + j * cols + item * R, R * sizeof(float));
    normalise_item(job, s->col, R, NULL, s->ranks, s->gm, job->oi + item * (job->per_head ? job->G : 1) * nc);
}

enum { W_SCORE, W_EXP, W_FINISH, W_RANK, W_ITEM };

typedef struct phase {
    score_job *job;
    int what;
} phase;

static void item_major(score_job *job, const slot *s, size_t item);

static void slot_task(void *arg, size_t b, size_t e) {
    phase *ph = arg;
    score_job *job = ph->job;
    for (size_t si = b; si < e; si++)
        for (;;) {
            size_t w = atomic_fetch_add(&job->next, 1);
            if (w >= job->n_work) break;
            if (ph->what == W_SCORE) bm_chunk(job, &job->slots[si], w);
            else if (ph->what == W_EXP) bm_exp(job, w);
            else if (ph->what == W_FINISH) bm_finish(job, w);
            else if (ph->what == W_RANK) bm_rank_item(job, &job->slots[si], w);
            else item_major(job, &job->slots[si], w);
        }
}

static void run_phase(score_job *job, kvm_threadpool *tp, size_t n_slots, size_t n_work, int what) {
    phase ph = {job, what};
    atomic_store(&job->next, 0);
    job->n_work = n_work;
    kvm_parallel_for(tp, n_slots, 1, slot_task, &ph);
}

/* The weights 1 / Z, Z = sum_c z_c over the chunks in order. */
static void combine_sums(score_job *job, float *w) {
    const size_t cols = job->cols, nch = job->n_chunks;
    for (size_t k = 0; k < cols; k++) w[k] = 0.0f;
    for (size_t c = 0; c < nch; c++)
        for (size_t k = 0; k < cols; k++) w[k] += job->cz[c * cols + k];
    for (size_t k = 0; k < cols; k++) w[k] = 1.0f / w[k];
}

/* ---- item-major pass (prefill, or block-major too large) ---- */

static void item_major(score_job *job, const slot *s, size_t item) {
    const size_t D = job->D, R = job->R, K = job->K, ldo = job->ldo, nc = job->nc;
    const size_t l = item / job->H, g = item % job->H;
    if (job->use_rows) {
        pack_rows(job, item, s->qbuf, !job->exact);
    } else { /* the transposed, zero-padded panel [K][ldo], in 16 x 16 tiles (both sides stay in L1) */
        float *rows = s->sc; /* [R][K] staging, overwritten by the scores below */
        pack_rows(job, item, rows, !job->exact);
        for (size_t k0 = 0; k0 < K; k0 += 16)
            for (size_t r0 = 0; r0 < ldo; r0 += 16)
                for (size_t k = k0; k < KVM_MIN(K, k0 + 16); k++) {
                    float *dst = s->qbuf + k * ldo;
                    for (size_t r = r0; r < r0 + 16; r++) dst[r] = r < R ? rows[r * K + k] : 0.0f;
                }
    }
    float *sc = s->sc;
    if (!job->exact) {
        const size_t ahead = 8, box_bytes = 2 * D * job->esz; /* boxes of other blocks: far apart, prefetched */
        for (size_t j0 = 0; j0 < nc; j0 += SCORE_CHUNK) {
            size_t n = KVM_MIN((size_t)SCORE_CHUNK, nc - j0);
            for (size_t j = 0; j < n; j++) {
                if (j0 + j + ahead < nc) {
                    const char *pf = box_at(job, j0 + j + ahead, l, g);
                    for (size_t c = 0; c < box_bytes; c += 64) KVM_PREFETCH(pf + c);
                }
                float *f = s->boxf + j * 2 * D;
                box_f32(job, j0 + j, l, g, f);
                s->bp[j] = f;
            }
            if (job->use_rows) job->kern->rows(s->qbuf, R, s->bp, n, K, sc + j0 * ldo, ldo);
            else job->kern->panel(s->qbuf, ldo, s->bp, n, K, sc + j0 * ldo, ldo);
        }
    } else {
        const kvm_dev_keys *keys = job->d->keys;
        for (size_t j = 0; j < nc; j++) {
            int32_t nr = 0;
            keys->read(keys->ctx, job->blocks ? job->blocks[j] : (int32_t)j, (int32_t)l, (int32_t)g, s->kbuf, &nr);
            const size_t n = (size_t)nr;
            for (size_t i = 0; i < n; i++) s->bp[i] = s->kbuf + i * D;
            if (job->use_rows) job->kern->rows(s->qbuf, R, s->bp, n, K, s->tmp, ldo);
            else job->kern->panel(s->qbuf, ldo, s->bp, n, K, s->tmp, ldo);
            float *o = sc + j * ldo;
            memcpy(o, s->tmp, ldo * sizeof(float));
            for (size_t i = 1; i < n; i++)
                for (size_t r = 0; r < ldo; r++) o[r] = s->tmp[i * ldo + r] > o[r] ? s->tmp[i * ldo + r] : o[r];
        }
    }
    check_finite(job, sc, nc * ldo);
    normalise_item(job, sc, ldo, s->colm, s->ranks, s->gm, job->oi + item * (job->per_head ? job->G : 1) * nc);
}

/* ---- the op ---- */

static void layout(score_job *job, kvm_carve *c, size_t n_slots, int block_major) {
    const size_t nc = job->nc, D = job->D, R = job->R, kr = job->kbuf_rows;
    const int rr = job->d->norm == KVMEM_NORM_RR;
    job->slots = kvm_carve_take(c, n_slots, sizeof(slot));
    if (block_major) {
        job->qpack = kvm_carve_take(c, job->items * R, D * sizeof(float));
        job->sc = kvm_carve_take(c, nc, job->cols * sizeof(float));
        if (!rr) {
            job->cm = kvm_carve_take(c, job->n_chunks, job->cols * sizeof(float));
            job->cz = kvm_carve_take(c, job->n_chunks + 2, job->cols * sizeof(float)); /* + m and Z of the combine */
        }
    }
    if (!block_major || rr) job->oi = kvm_carve_take(c, job->items * (job->per_head ? job->G : 1), nc * sizeof(float));
    for (size_t i = 0; i < n_slots; i++) {
        slot s;
        memset(&s, 0, sizeof s);
        if (job->exact) {
            s.kbuf = kvm_carve_take(c, kr, D * sizeof(float));
            if (!block_major) s.tmp = kvm_carve_take(c, kr, job->ldo * sizeof(float));
        }
        if (!block_major) {
            s.qbuf = kvm_carve_take(c, job->K, job->ldo * sizeof(float));
            s.sc = kvm_carve_take(c, KVM_MAX(nc * job->ldo, R * job->K), sizeof(float));
            s.colm = kvm_carve_take(c, 2 * job->ldo, sizeof(float));
            s.bp = kvm_carve_take(c, KVM_MAX(kr, (size_t)SCORE_CHUNK), sizeof(float *));
            if (!job->exact) s.boxf = kvm_carve_take(c, (size_t)SCORE_CHUNK * 2, D * sizeof(float));
        }
        if (rr) {
            s.ranks = kvm_carve_take(c, nc, sizeof(rank_item));
            if (block_major) s.col = kvm_carve_take(c, nc, R * sizeof(float));
        }
        s.gm = kvm_carve_take(c, job->G, sizeof(float));
        if (c->base) job->slots[i] = s;
    }
}

/* The SPLIT form's boxes as PAIRED f32, [n_blocks][L][H][2][D]. */
/* SPLIT boxes (elements of es bytes) as PAIRED ones, the layout the CPU reads. */
static void pair_boxes(const void *smin, const void *smax, size_t n, size_t LH, size_t D, size_t es, void *dst) {
    const unsigned char *mn = smin, *mx = smax;
    unsigned char *o = dst;
    for (size_t i = 0; i < n * LH; i++) {
        memcpy(o + i * 2 * D * es, mx + i * D * es, D * es);
        memcpy(o + (i * 2 + 1) * D * es, mn + i * D * es, D * es);
    }
}

/* EXACT's buffer form: block b's keys of (layer l, KV head g) are rows
 * [b * block_rows, ..) of key_rows[l], [.][n_kv_heads][head_dim] f32 or f16
 * from s_off, read through kvm_dev_keys like the host form's. */
static void key_rows_read(void *ctx, int32_t b, int32_t l, int32_t g, float *dst, int32_t *n) {
    const kvm_dev_score_args *a = ctx;
    const size_t H = (size_t)a->n_kv_heads, D = (size_t)a->head_dim, R = (size_t)a->block_rows;
    const unsigned char *base = kvm_cpu_at(a->key_rows[l], a->s_off);
    for (size_t r = 0; r < R; r++) {
        const size_t at = (((size_t)b * R + r) * H + (size_t)g) * D;
        if (a->key_f16) {
            const uint16_t *src = (const uint16_t *)(const void *)base + at;
            for (size_t d = 0; d < D; d++) dst[r * D + d] = kvm_f16_to_f32(src[d]);
        } else {
            memcpy(dst + r * D, (const float *)(const void *)base + at, D * sizeof(float));
        }
    }
    *n = a->block_rows;
}

kvmem_status kvm_cpu_dev_score(kvmem_backend *be, const kvm_dev_score_args *d) {
    char msg[256];
    kvmem_status st = kvm_dev_score_check(d, kvm_cpu_buffer_size, msg, sizeof msg);
    if (st != KVMEM_OK) return kvm_fail(st, "%s", msg);
    kvm_dev_score_args with_keys;
    kvm_dev_keys buf_keys;
    if (d->mode == KVMEM_RETRIEVE_EXACT && !d->keys) {
        with_keys = *d;
        buf_keys = (kvm_dev_keys){(void *)(uintptr_t)d, d->block_rows, NULL, key_rows_read};
        with_keys.keys = &buf_keys;
        d = &with_keys;
    }
    score_job job;
    memset(&job, 0, sizeof job);
    job.d = d;
    job.kern = kvm_cpu_kernels_get()->score;
    job.L = (size_t)d->n_layers;
    job.H = (size_t)d->n_kv_heads;
    job.NQ = (size_t)d->n_q_heads;
    job.D = (size_t)d->head_dim;
    job.G = job.NQ / job.H;
    job.nq = (size_t)d->n_q;
    job.nc = (size_t)d->n_blocks;
    job.R = job.G * job.nq;
    job.items = job.L * job.H;
    job.cols = job.items * job.R;
    job.exact = d->mode == KVMEM_RETRIEVE_EXACT;
    job.K = job.D * (job.exact ? 1 : 2);
    job.per_head = d->n_sets == 0;
    job.n_sets = job.per_head ? job.L * job.NQ : (size_t)d->n_sets;
    job.q = kvm_cpu_at(d->q, d->q_off);
    job.out = (float *)kvm_cpu_at(d->out, d->out_off);
    job.blocks = d->blocks;
    job.esz = d->box_layout == KVM_BOXES_PAIRED_F16 || d->box_layout == KVM_BOXES_SPLIT_F16 ? 2 : 4;
    job.use_rows = job.R < job.kern->rows_below;
    job.ldo = job.use_rows ? job.R : (job.R + KVM_SCORE_ROW_PAD - 1) / KVM_SCORE_ROW_PAD * KVM_SCORE_ROW_PAD;
    job.kbuf_rows = job.exact ? (size_t)KVM_MAX(d->keys->max_rows, 1) : 1;
    const size_t box_block = 2 * job.L * job.H * job.D * job.esz; /* one block's boxes */
    kvm_threadpool *tp = kvm_cpu_backend_tp(be);
    size_t sc_bytes = 0;
    const int block_major = job.use_rows && kvm_mul_size(job.nc * job.cols, sizeof(float), &sc_bytes) &&
                            sc_bytes <= kvm_score_block_major_max_bytes;
    /* a decode pass over less than 1 MiB of boxes takes microseconds: waking
     * the other threads would cost more than it saves */
    if (block_major && !job.exact && job.nc * box_block < ((size_t)1 << 20)) tp = NULL;
    const size_t n_slots = (size_t)kvm_threadpool_size(tp);
    if (block_major) {
        /* chunks of about 2 MB of boxes, and at least BM_MIN_CHUNKS of them
         * when there are blocks enough (4 per thread up to 16 threads), but
         * none under BM_MIN_CHUNK_BYTES, a multiple of the kernel group;
         * never from the thread count, which would make the normalisers
         * depend on it */
        size_t box_bytes = box_block * (job.exact ? 8 : 1);
        size_t ch = KVM_MAX((size_t)1, ((size_t)2 << 20) / KVM_MAX(box_bytes, (size_t)1));
        ch = KVM_MIN(ch, (job.nc + BM_MIN_CHUNKS - 1) / BM_MIN_CHUNKS);
        ch = KVM_MAX(ch, BM_MIN_CHUNK_BYTES / KVM_MAX(box_bytes, (size_t)1));
        ch = KVM_MAX((size_t)BM_GROUP, (ch + BM_GROUP - 1) / BM_GROUP * BM_GROUP);
        job.chunk = ch;
        job.n_chunks = (job.nc + ch - 1) / ch;
    }
    const int split = (d->box_layout == KVM_BOXES_SPLIT_F32 || d->box_layout == KVM_BOXES_SPLIT_F16) && !job.exact;
    kvm_carve c = {NULL, 0, 0};
    void *paired = split ? kvm_carve_take(&c, job.nc * job.L * job.H * 2, job.D * job.esz) : NULL;
    layout(&job, &c, n_slots, block_major);
    kvm_scratch *scr = kvm_cpu_backend_scratch(be);
    void *base = c.overflow ? NULL : kvm_scratch_take(scr, c.off);
    if (!base)
        return kvm_fail(KVMEM_ERR_NOMEM, "scoring: out of memory for %zu bytes of work memory (%zu candidates)", c.off,
                        job.nc);
    c = (kvm_carve){base, 0, 0};
    if (split) {
        paired = kvm_carve_take(&c, job.nc * job.L * job.H * 2, job.D * job.esz);
        pair_boxes(kvm_cpu_at(d->s_min, d->s_off), kvm_cpu_at(d->s_max, d->s_off), job.nc, job.L * job.H, job.D, job.esz,
                   paired);
        job.boxes = (const unsigned char *)paired;
        job.blocks = NULL;
    } else if (!job.exact) {
        job.boxes = kvm_cpu_at(d->s_max, d->s_off);
    }
    layout(&job, &c, n_slots, block_major);

    atomic_init(&job.overflow, 0);
    if (block_major) {
        for (size_t it = 0; it < job.items; it++) pack_rows(&job, it, job.qpack + it * job.R * job.D, 0);
        run_phase(&job, tp, n_slots, job.n_chunks, W_SCORE);
        if (atomic_load(&job.overflow)) {
            /* nothing to normalise: every score NaN below */
        } else if (d->norm == KVMEM_NORM_SOFTMAX) {
            float *m = job.cz + job.n_chunks * job.cols;
            for (size_t k = 0; k < job.cols; k++) m[k] = -INFINITY;
            job.kern->col_max(job.cm, job.n_chunks, job.cols, job.cols, m);
            run_phase(&job, tp, n_slots, job.n_chunks, W_EXP);
            combine_sums(&job, m + job.cols);
            run_phase(&job, tp, n_slots, job.n_chunks, W_FINISH);
        } else {
            run_phase(&job, tp, n_slots, job.items, W_RANK);
            sum_sets(&job);
        }
    } else {
        run_phase(&job, tp, n_slots, job.items, W_ITEM);
        sum_sets(&job);
    }
    if (atomic_load(&job.overflow))
        for (size_t i = 0; i < job.n_sets * job.nc; i++) job.out[i] = NAN;
    kvm_scratch_give(scr, base);
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
    kvmem_status st = kvm_dev_score_reduce_check(a, kvm_cpu_buffer_size, msg, sizeof msg);
    if (st != KVMEM_OK) return kvm_fail(st, "%s", msg);
    dev_reduce_job job = {a, kvm_cpu_at(a->in, a->in_off), (float *)kvm_cpu_at(a->out, a->out_off)};
    kvm_parallel_for(kvm_cpu_backend_tp(be), (size_t)a->n_sets * (size_t)a->n, 256, dev_reduce_task, &job);
    return KVMEM_OK;
}
