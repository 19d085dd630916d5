/* The SCORED order: every KV head visits the tiles by their largest logit,
 * found here with no caller input, so the stop rule meets the tiles that
 * carry attention mass before the ones that do not, wherever they sit in the
 * history (RECENT reaches a far "recall" token only after the output has
 * looked stable for many tiles, and stops before it).
 *
 * Caller tensors and slot maps come with no summary of their keys: the scan
 * computes each tile's exact largest logit, one read of every visible K row
 * (half of what full attention reads), on the context's workers, and can
 * keep the logits so that the attention reads V alone. An agent's
 * sealed blocks carry AABBs of their raw keys (MemArt), so their score is an
 * upper bound on the block's largest logit from its box alone (2 * head_dim
 * floats per block and head instead of the block's rows), RoPE included:
 * see agent_bound. */
#include "attend.h"
#include "../cpu/kernels.h"
#include "../alloc.h"
#include "../backend/route/context.h"
#include "../cpu/scratch.h"
#include "../cpu/threadpool.h"
#include "../cpu/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SCAN_KEYS 16 /* positions per run: 16 rows of all heads stay in L1 */
#define SCAN_QS 16   /* query heads per qk call */

typedef struct scan_item_out {
    int64_t rows_read;
    int32_t failed;
    int32_t reserved;
} scan_item_out;

typedef struct scan_job {
    const kvm_attend_plan *p;
    const kvm_attend_kernels *kern;
    const float *qpairs; /* AGENT: [n_rows][n_q_heads][3][np4]: each rotated pair's two
                            elements and |q| (rotation keeps it), zero-padded */
    int32_t np4;         /* AGENT: n_pairs rounded up to a multiple of 4 */
    float *score;        /* [n_kv_heads][n_tiles] */
    float *logits;       /* caller K: [n_rows][n_q_heads][T] kept for the attention, or NULL */
    int32_t tiles_per_item, n_chunks;
    scan_item_out *out;  /* per item */
} scan_job;

static int is_live(const kvm_attend_plan *p, int64_t j) {
    if (p->mask && !p->mask[j]) return 0;
    if (p->slots && p->slots[j] == p->dead_slot) return 0;
    return 1;
}

static int64_t live_count(const kvm_attend_plan *p, int64_t a, int64_t b) {
    if (b <= a) return 0;
    return p->live_prefix ? p->live_prefix[b] - p->live_prefix[a] : b - a;
}

/* Does any row see a live position of tile t? (Tiles no row sees are not
 * visited at all; they go last.) */
static int tile_seen(const kvm_attend_plan *p, int32_t t, int64_t *lo, int64_t *hi) {
    const int64_t t0 = p->tile_start[t], t1 = p->tile_start[t + 1];
    int64_t a_min = INT64_MAX, b_max = INT64_MIN;
    for (int32_t r = 0; r < p->n_rows; r++) {
        const int64_t a = KVM_MAX(t0, p->row_lo[r]), b = KVM_MIN(t1, p->row_hi[r]);
        if (live_count(p, a, b) == 0) continue;
        a_min = KVM_MIN(a_min, a);
        b_max = KVM_MAX(b_max, b);
    }
    *lo = a_min;
    *hi = b_max;
    return a_min < b_max;
}

int32_t kvm_attend_tiles_seen(const kvm_attend_plan *p) {
    int32_t n = 0;
    for (int32_t t = 0; t < p->n_tiles; t++) {
        int64_t a, b;
        n += tile_seen(p, t, &a, &b);
    }
    return n;
}

/* Largest logit of the n keys of a run (krow, at ascending positions pos)
 * against the query heads of KV head h in every row, each row counting the
 * keys it sees; NaN scores are ignored. */
static float keys_max(const scan_job *j, int32_t h, const void *const *krow, const int64_t *pos, int32_t n,
                      kvmem_dtype dt, float *s) {
    const kvm_attend_plan *p = j->p;
    const int32_t G = p->group, D = p->head_dim;
    const float *qv[SCAN_QS];
    float best = -INFINITY;
    for (int32_t r = 0; r < p->n_rows; r++) {
        int32_t a = 0, b = n;
        while (a < n && pos[a] < p->row_lo[r]) a++;
        while (b > a && pos[b - 1] >= p->row_hi[r]) b--;
        if (a == b) continue;
        for (int32_t g0 = 0; g0 < G; g0 += SCAN_QS) {
            const int32_t nq = KVM_MIN(SCAN_QS, G - g0);
            for (int32_t i = 0; i < nq; i++)
                qv[i] = p->q + ((size_t)r * (size_t)p->n_q_heads + (size_t)(h * G + g0 + i)) * (size_t)D;
            if (dt == KVMEM_F16)
                j->kern->qk_f16(qv, (size_t)nq, (const uint16_t *const *)(krow + a), (size_t)(b - a), (size_t)D,
                                p->scale, s, SCAN_KEYS);
            else if (dt == KVMEM_BF16)
                j->kern->qk_bf16(qv, (size_t)nq, (const uint16_t *const *)(krow + a), (size_t)(b - a), (size_t)D,
                                 p->scale, s, SCAN_KEYS);
            else
                j->kern->qk(qv, (size_t)nq, (const float *const *)(krow + a), (size_t)(b - a), (size_t)D, p->scale, s,
                            SCAN_KEYS);
            for (int32_t i = 0; i < nq; i++) {
                float *keep = j->logits ? j->logits + ((size_t)r * (size_t)p->n_q_heads + (size_t)(h * G + g0 + i)) *
                                                          (size_t)p->T
                                        : NULL;
                for (int32_t k = 0; k < b - a; k++) {
                    const float x = s[(size_t)i * SCAN_KEYS + (size_t)k];
                    best = x > best ? x : best;
                    if (keep) keep[pos[a + k]] = x;
                }
            }
        }
    }
    return best;
}

/* Prefetch K's rows of KV head h at the live positions [a, b) (a tile the
 * scan reads next) while the current one computes: the hardware prefetcher
 * of the machine measured does not follow these reads (see core/cpu/ops_attend.c). */
static void prefetch_k(const kvm_attend_plan *p, int64_t a, int64_t b, int32_t h) {
    const kvmem_tensor *k = p->k;
    const size_t es = kvm_dtype_size(k->dtype);
    const size_t bytes = (size_t)((int64_t)(p->head_dim - 1) * k->strides[2] + 1) * es;
    const char *base = (const char *)k->data + (size_t)(h * k->strides[1]) * es;
    for (int64_t x = a; x < b; x++) {
        if (!is_live(p, x)) continue;
        const char *r = base + (size_t)((p->slots ? p->slots[x] : x) * k->strides[0]) * es;
        for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(r + o, 0, 3);
    }
}

/* Caller tensors / slot maps: the exact largest logit of the KV heads
 * [ha, hb) over the live positions [a, b) of a tile, into best[h]. Positions
 * go SCAN_KEYS at a time, all heads of a run before the next run, so K
 * streams from memory once (its rows of one position are adjacent). Keys in
 * rows with a unit last stride are read in place (f16 and bf16 converted in
 * registers); others are converted into kbuf. [na, nb): the positions the
 * caller reads next, prefetched head by head (none when na = nb). */
static void tile_exact(scan_job *j, int64_t a, int64_t b, int32_t ha, int32_t hb, int64_t na, int64_t nb, float *kbuf,
                       float *best, scan_item_out *o) {
    const kvm_attend_plan *p = j->p;
    const kvmem_tensor *k = p->k;
    const size_t D = (size_t)p->head_dim, es = kvm_dtype_size(k->dtype);
    const kvmem_dtype dt = kbuf ? KVMEM_F32 : k->dtype;
    float s[SCAN_QS * SCAN_KEYS];
    const void *krow[SCAN_KEYS];
    int64_t row[SCAN_KEYS], pos[SCAN_KEYS];
    for (int32_t h = ha; h < hb; h++) best[h] = -INFINITY;
    for (int64_t x = a; x < b;) {
        int32_t n = 0;
        for (; x < b && n < SCAN_KEYS; x++)
            if (is_live(p, x)) pos[n] = x, row[n++] = p->slots ? p->slots[x] : x;
        if (n == 0) continue;
        o->rows_read += (int64_t)n * (hb - ha);
        for (int32_t h = ha; h < hb; h++) {
            if (x >= b && na < nb) prefetch_k(p, na, nb, h); /* the last run: the next tile's rows of this head */
            for (int32_t i = 0; i < n; i++) {
                const int64_t off = row[i] * k->strides[0] + (int64_t)h * k->strides[1];
                if (!kbuf) {
                    krow[i] = (const unsigned char *)k->data + (size_t)off * es;
                } else {
                    kvm_tensor_read_f32(k, off, kbuf + (size_t)i * D, D);
                    krow[i] = kbuf + (size_t)i * D;
                }
            }
            const float m = keys_max(j, h, krow, pos, n, dt, s);
            best[h] = m > best[h] ? m : best[h];
        }
    }
}

/* An agent's tile t, KV head h: an upper bound on scale * q . k_rot over its
 * tokens, the rows and the group's query heads, from the box [lo, hi] of its
 * raw keys (a sealed block's AABB; the unsealed tail's box of its live rows in
 * [a, b)) and the span [p0, p1] of its RoPE positions.
 * A key at position p is af * R(p w) k on each rotated pair (angle p * w,
 * attention factor af). With c = (p0 + p1) / 2 and e = (p - c) w in
 * [-d, d], d = (p1 - p0) w / 2:
 *   q . R(p w) k = q' . R(e) k,  q' = R(-c w) q,
 *   |q' . (R(e) - I) k| <= |q'| |k| min(d, 2),
 * so one pair scores at most af * min(box(q') + |q| r min(d, 2), |q| r), box(q')
 * the largest q' . k over the pair's 2-D box and r its largest norm; dims
 * RoPE leaves alone score at most max(q_i lo_i, q_i hi_i). Exact for a box
 * of one key at one position, and tight where the box is small and d is:
 * the low frequencies, which is where RoPE models keep what is recalled. */
/* cos / sin of c * w for a run of tiles: tiles whose centres advance by the
 * same step (blocks of equal length at consecutive positions, the usual
 * case) take one angle-addition step in double precision instead of n_pairs
 * libm calls; any other step is computed directly. wob: min(d, 2). */
typedef struct tile_rotation {
    int32_t valid;
    double c, delta;
    double cd[KVM_ROPE_MAX_PAIRS], sd[KVM_ROPE_MAX_PAIRS], c1[KVM_ROPE_MAX_PAIRS], s1[KVM_ROPE_MAX_PAIRS];
    float cs[KVM_ROPE_MAX_PAIRS], sn[KVM_ROPE_MAX_PAIRS], wob[KVM_ROPE_MAX_PAIRS]; /* zero past n_pairs */
} tile_rotation;

static void rotation_at(tile_rotation *tr, const kvm_rope *rope, double c, double half) {
    const int32_t np = rope->n_pairs;
    if (tr->valid && c - tr->c != tr->delta) {
        tr->delta = c - tr->c;
        for (int32_t i = 0; i < np; i++) {
            tr->c1[i] = cos(tr->delta * rope->inv_freq[i]);
            tr->s1[i] = sin(tr->delta * rope->inv_freq[i]);
        }
    }
    for (int32_t i = 0; i < np; i++) {
        if (tr->valid) {
            const double x = tr->cd[i], y = tr->sd[i];
            tr->cd[i] = x * tr->c1[i] - y * tr->s1[i];
            tr->sd[i] = y * tr->c1[i] + x * tr->s1[i];
        } else {
            tr->cd[i] = cos(c * rope->inv_freq[i]);
            tr->sd[i] = sin(c * rope->inv_freq[i]);
        }
        tr->cs[i] = (float)tr->cd[i];
        tr->sn[i] = (float)tr->sd[i];
        const double dd = half * rope->inv_freq[i];
        tr->wob[i] = (float)(dd < 2.0 ? dd : 2.0);
    }
    tr->c = c;
    tr->valid = 1;
}

/* One tile and KV head of an agent: its pairs' box corners and largest
 * norms, gathered into runs of 4 so the pair loop below vectorises. */
static float agent_bound(const scan_job *j, const tile_rotation *tr, int32_t t, int32_t h, int64_t a, int64_t b,
                         float *box) {
    const kvm_attend_plan *p = j->p;
    const kvm_agent_mem *m = p->mem;
    const kvm_rope *rope = &p->pool->rope;
    const int32_t D = p->head_dim, G = p->group, np = rope->n_pairs, n4 = j->np4;
    const int32_t step = rope->style == KVMEM_ROPE_NEOX ? 1 : 2, off = rope->style == KVMEM_ROPE_NEOX ? np : 1;
    const float *hi, *lo;
    if (t < m->n_sealed) {
        kvm_block_aabb_f32(p->pool, m, t, p->layer, h, box); /* s_max, then s_min (f16 boxes widened) */
        hi = box, lo = box + D;
    } else {
        const float *kt = kvm_tail_rows(p->pool, m, 0, p->layer, h);
        const int64_t first = m->n_tokens - m->tail_n;
        float *bh = box, *bl = box + D;
        for (int32_t d = 0; d < D; d++) bh[d] = -INFINITY, bl[d] = INFINITY;
        for (int64_t x = a; x < b; x++) {
            if (!is_live(p, x)) continue;
            const float *kr = kt + (size_t)(x - first) * (size_t)D;
            for (int32_t d = 0; d < D; d++) {
                bh[d] = kr[d] > bh[d] ? kr[d] : bh[d];
                bl[d] = kr[d] < bl[d] ? kr[d] : bl[d];
            }
        }
        hi = bh, lo = bl;
    }
    /* [la, ha, lb, hb, rad] x n4: the pair's two box sides and largest norm;
     * padding pairs are zero and add zero */
    float *la = box + 2 * D, *ha = la + n4, *lb = ha + n4, *hb = lb + n4, *rad = hb + n4;
    for (int32_t i = 0; i < n4; i++) {
        const int32_t ia = i * step, ib = ia + off;
        la[i] = i < np ? lo[ia] : 0, ha[i] = i < np ? hi[ia] : 0;
        lb[i] = i < np ? lo[ib] : 0, hb[i] = i < np ? hi[ib] : 0;
        const float xa = KVM_MAX(fabsf(la[i]), fabsf(ha[i])), xb = KVM_MAX(fabsf(lb[i]), fabsf(hb[i]));
        rad[i] = sqrtf(xa * xa + xb * xb);
    }
    const float af = (float)rope->attn_factor;
    float best = -INFINITY;
    for (int32_t r = 0; r < p->n_rows; r++)
        for (int32_t g = 0; g < G; g++) {
            const size_t hq = (size_t)r * (size_t)p->n_q_heads + (size_t)(h * G + g);
            const float *q = p->q + hq * (size_t)D;
            const float *qa = j->qpairs + hq * 3 * (size_t)n4, *qb = qa + n4, *qn = qb + n4;
            float rot4[4] = {0, 0, 0, 0};
            for (int32_t i = 0; i < n4; i += 4)
                for (int32_t u = 0; u < 4; u++) { /* q' = R(-c w) q on pair i + u */
                    const int32_t k = i + u;
                    const float ya = qa[k] * tr->cs[k] + qb[k] * tr->sn[k], yb = qb[k] * tr->cs[k] - qa[k] * tr->sn[k];
                    const float xa = ya * la[k], xha = ya * ha[k], xb = yb * lb[k], xhb = yb * hb[k];
                    const float bx = (xa > xha ? xa : xha) + (xb > xhb ? xb : xhb);
                    const float cap = qn[k] * rad[k], wide = bx + cap * tr->wob[k];
                    rot4[u] += wide < cap ? wide : cap;
                }
            float acc = 0;
            for (int32_t d = 2 * np; d < D; d++) /* dims RoPE leaves alone (both styles rotate [0, 2 np)) */
                acc += KVM_MAX(q[d] * lo[d], q[d] * hi[d]);
            acc = (acc + af * ((rot4[0] + rot4[1]) + (rot4[2] + rot4[3]))) * p->scale;
            best = acc > best ? acc : best;
        }
    return best;
}

/* Scores of the tiles of one chunk, every KV head. A tile's heads are scored
 * one after the other while its rows are in cache, so caller K streams from
 * memory once, position by position, as in the attention itself. */
static void scan_chunk(scan_job *j, size_t item) {
    const kvm_attend_plan *p = j->p;
    const int32_t t0 = (int32_t)item * j->tiles_per_item, t1 = KVM_MIN(t0 + j->tiles_per_item, p->n_tiles);
    const int32_t H = p->n_kv_heads;
    const size_t D = (size_t)p->head_dim;
    const int agent = p->kind == KVMEM_ATTEND_SRC_AGENT;
    scan_item_out *o = &j->out[item];
    /* scratch: an agent's tile rotation and a tail's box (and pair norms);
     * converted caller keys (rows with a non-unit last stride) */
    const int convert = !agent && p->k->strides[2] != 1;
    const size_t buf_floats = agent ? 2 * D + 5 * (size_t)j->np4 : SCAN_KEYS * D;
    float *buf = NULL, *best = kvm_malloc((size_t)H * sizeof(float));
    tile_rotation *tr = NULL;
    if (!best || ((agent || convert) && !(buf = kvm_malloc(buf_floats * sizeof(float)))) ||
        (agent && !(tr = kvm_calloc(1, sizeof *tr)))) {
        kvm_free(best), kvm_free(buf);
        o->failed = 1;
        return;
    }
    if (!agent) {
        /* head-major K (a head's rows adjacent: HF caches): one head at a
         * time through the chunk, one run of memory; otherwise every head of
         * a tile while its rows are in cache, so K streams once, position by
         * position, as in the attention itself */
        const int per_head = H > 1 && p->k->strides[1] > p->k->strides[0];
        for (int32_t t = t0; t < t1; t++) /* tiles no row sees stay at -inf */
            for (int32_t h = 0; h < H; h++) j->score[(size_t)h * (size_t)p->n_tiles + (size_t)t] = -INFINITY;
        for (int32_t ha = 0; ha < H; ha = per_head ? ha + 1 : H) {
            const int32_t hb = per_head ? ha + 1 : H;
            int64_t a = 0, b = 0, na = 0, nb = 0;
            int32_t t = t0;
            while (t < t1 && !tile_seen(p, t, &a, &b)) t++;
            while (t < t1) { /* tile t is seen ([a, b)); the next seen one's rows are prefetched */
                int32_t u = t + 1;
                while (u < t1 && !tile_seen(p, u, &na, &nb)) u++;
                if (u == t1) na = nb = 0;
                tile_exact(j, a, b, ha, hb, na, nb, convert ? buf : NULL, best, o);
                for (int32_t h = ha; h < hb; h++) j->score[(size_t)h * (size_t)p->n_tiles + (size_t)t] = best[h];
                t = u, a = na, b = nb;
            }
        }
    } else {
        for (int32_t t = t0; t < t1; t++) {
            int64_t a, b;
            const int seen = tile_seen(p, t, &a, &b);
            if (seen) { /* the tile's span of positions (all of it: wider only loosens the bound) */
                double p0 = INFINITY, p1 = -INFINITY;
                for (int64_t x = p->tile_start[t]; x < p->tile_start[t + 1]; x++) {
                    const double pos = p->positions ? (double)p->positions[x] : (double)(p->base_position + x);
                    p0 = pos < p0 ? pos : p0;
                    p1 = pos > p1 ? pos : p1;
                }
                rotation_at(tr, &p->pool->rope, 0.5 * (p0 + p1), 0.5 * (p1 - p0));
            }
            for (int32_t h = 0; h < H; h++)
                j->score[(size_t)h * (size_t)p->n_tiles + (size_t)t] = !seen ? -INFINITY : agent_bound(j, tr, t, h, a, b, buf);
        }
    }
    kvm_free(buf);
    kvm_free(best);
    kvm_free(tr);
}

static void scan_task(void *arg, size_t b, size_t e) {
    for (size_t i = b; i < e; i++) scan_chunk(arg, i);
}

typedef struct scored_tile {
    float score;
    int32_t tile;
} scored_tile;

/* Highest score first; equal scores (and tiles no row sees, -inf) newest first. */
static int by_score(const void *a, const void *b) {
    const scored_tile *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? 1 : -1;
    return (x->tile < y->tile) - (x->tile > y->tile);
}

/* AGENT: every query's rotated pairs as runs (see qpairs). */
static float *query_pairs(const kvm_attend_plan *p, int32_t n4) {
    const kvm_rope *rope = &p->pool->rope;
    const int32_t np = rope->n_pairs, D = p->head_dim;
    const int32_t step = rope->style == KVMEM_ROPE_NEOX ? 1 : 2, off = rope->style == KVMEM_ROPE_NEOX ? np : 1;
    const size_t nq = (size_t)p->n_rows * (size_t)p->n_q_heads;
    float *qp = kvm_calloc(nq * 3 * (size_t)n4 + 1, sizeof(float));
    if (!qp) return NULL;
    for (size_t x = 0; x < nq; x++)
        for (int32_t i = 0; i < np; i++) {
            const float *q = p->q + x * (size_t)D;
            float *o = qp + x * 3 * (size_t)n4;
            o[i] = q[i * step];
            o[n4 + i] = q[i * step + off];
            o[2 * n4 + i] = sqrtf(o[i] * o[i] + o[n4 + i] * o[n4 + i]);
        }
    return qp;
}

kvmem_status kvm_attend_scored_order(kvmem_context *ctx, const kvm_attend_plan *p, int32_t *head_order,
                                     float *scores, float *logits, int64_t *k_rows_read) {
    const char *fn = "kvmem_attend";
    const int32_t H = p->n_kv_heads, NT = p->n_tiles;
    *k_rows_read = 0;
    if (NT == 0) return KVMEM_OK;
    kvm_threadpool *tp = ctx ? ctx->tp : NULL;
    const int32_t nt = tp ? kvm_threadpool_size(tp) : 1;
    scan_job j;
    memset(&j, 0, sizeof j);
    j.p = p;
    j.kern = kvm_cpu_kernels_get()->attend;
    j.logits = p->kind == KVMEM_ATTEND_SRC_AGENT ? NULL : logits;
    if (p->kind == KVMEM_ATTEND_SRC_AGENT) j.np4 = (p->pool->rope.n_pairs + 3) / 4 * 4;
    /* a few chunks of tiles per thread keep the threads evenly busy */
    j.n_chunks = KVM_MIN(NT, 4 * nt);
    j.tiles_per_item = (NT + j.n_chunks - 1) / j.n_chunks;
    j.n_chunks = (NT + j.tiles_per_item - 1) / j.tiles_per_item;
    const size_t items = (size_t)j.n_chunks;
    kvm_scratch *sc = kvm_ctx_scratch(ctx);
    j.score = kvm_scratch_take(sc, (size_t)H * (size_t)NT * sizeof(float));
    j.out = kvm_calloc(items, sizeof *j.out);
    scored_tile *st = kvm_scratch_take(sc, (size_t)NT * sizeof *st);
    float *qn = NULL;
    kvmem_status rc = KVMEM_OK;
    if (!j.score || !j.out || !st || (p->kind == KVMEM_ATTEND_SRC_AGENT && !(qn = query_pairs(p, j.np4)))) {
        rc = kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for the scores of %d tiles", fn, NT);
        goto done;
    }
    j.qpairs = qn;
    kvm_parallel_for(tp, items, 1, scan_task, &j);
    for (size_t i = 0; i < items; i++) {
        if (j.out[i].failed) {
            rc = kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for a worker's scratch while scoring tiles", fn);
            goto done;
        }
        *k_rows_read += j.out[i].rows_read;
    }
    if (scores) memcpy(scores, j.score, (size_t)H * (size_t)NT * sizeof(float));
    for (int32_t h = 0; h < H; h++) {
        for (int32_t t = 0; t < NT; t++) {
            st[t].score = j.score[(size_t)h * (size_t)NT + (size_t)t];
            st[t].tile = t;
        }
        qsort(st, (size_t)NT, sizeof *st, by_score);
        for (int32_t t = 0; t < NT; t++) head_order[(size_t)h * (size_t)NT + (size_t)t] = st[t].tile;
    }
done:
    kvm_scratch_give(sc, j.score);
    kvm_free(j.out);
    kvm_scratch_give(sc, st);
    kvm_free(qn);
    return rc;
}
