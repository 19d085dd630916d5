/* Backend conformance of the retrieval device kernels (core/backend/backend.h):
 * dev_score, dev_topk, dev_gather_rope on the backend under test (argv[1])
 * and on the CPU backend's reference entries, both checked against plain
 * references written here in double precision.
 *
 * Tolerances, per op:
 *   dev_score   I (block score) error bound per (token, layer, head, block):
 *                 f32 operands:  dI = head_dim * 2^-23 * M,
 *                 M = sum_d |q_d| max(|smax_d|, |smin_d|)
 *               (2 * head_dim products accumulated in f32). Backend "cuda"
 *               multiplies f16-rounded q and AABBs (f32 accumulate): each
 *               product q~ s~ = q s (1 + e1)(1 + e2), |e| <= 2^-11 for normal
 *               f16, plus 2^-25 absolute for f16 subnormals, so
 *                 dI = 1.01 * 2^-10 * M + 2^-25 * sum_d (|q_d| + max|s_d|)
 *                      + head_dim * 2^-23 * M.
 *               SOFTMAX, per token: an error d_j in I_j moves log p_j by at
 *               most tau (|d_j| + max |d|), so
 *                 |p - p_ref| <= p_ref (expm1(2 tau dI_row) + 2e-5 (1 + x_j)
 *                                + sum_j' p_j' 2e-5 (1 + x_j') + 1e-6),
 *               x_j = tau (max I - I_j): GLSL's exp is within 3 + 2|x| ulp,
 *               the rest is float rounding. MAX over tokens: the max of the
 *               token bounds; SUM: their sum + n_q 2^-23 sum p.
 *               RR: ranks are exact where scores are separated by more than
 *               the two scores' dI; within that window either order is
 *               allowed (so p lies in [1/(rank_max + c), 1/(rank_min + c)]),
 *               except blocks with bit-identical AABBs, whose equal scores
 *               must rank by index (the tie rule), every backend computing
 *               identical inputs identically. The backend and the CPU entry
 *               also agree within the sum of their bounds.
 *   dev_topk    exact: the same index set as the reference (NaN never
 *               selected, ties toward the lower index, -0 == +0), in
 *               ascending order, and *n_out = min(k, #non-NaN).
 *   dev_gather_rope  within 2^-21 (|x0| + |x1|) af of the CPU entry (FMA
 *               contraction may differ) and 1e-5 (|x0| + |x1|) af of a
 *               double-precision rotation; copied dims and zero rows exact.
 *   dev_score_reduce  bit-exact: the contract fixes the order of the f32
 *               additions, so the backend and the CPU entry equal a plain
 *               loop here (data that cancels, so another order would show),
 *               and that loop is within (n_heads + n_layers) 2^-24 sum |x| of
 *               a double sum.
 * Length: dev_score over thousands of blocks, and RR over many tokens x
 * blocks (the Vulkan kernel once ranked every block for every token of a
 * chunk in one invocation, which lavapipe cut short past 65535 loop
 * iterations), also split into many dispatches by a lowered
 * KVMEM_VULKAN_LOOP_BUDGET; dev_topk over a million scores; dev_gather_rope
 * of thousands of rows at far positions.
 * Bad input: a status and a message, output buffers and *n_out unchanged.
 *
 * Harness: conformance.h. */
#include "conformance.h"
#include "cpu/half.h"
#include "rope/rope.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_cuda(void) { return strcmp(g_name, "cuda") == 0; }

static void bfree(kvmem_backend *be, kvmem_buffer *b) { be->iface->buffer_free(be, b); }

/* ======================= dev_score ======================= */

typedef struct shape {
    int32_t L, Hq, Hkv, D, n_q, nb;
} shape;

enum { DATA_RANDOM, DATA_ALL_EQUAL, DATA_TWINS };

typedef struct score_data {
    shape s;
    float *q, *mn, *mx; /* [n_q][L][Hq][D], [nb][L][Hkv][D] x2 */
    size_t nq_el, ns_el, no_el;
} score_data;

static void make_score_data(score_data *sd, const shape *s, int kind, uint64_t *rng) {
    sd->s = *s;
    const size_t D = (size_t)s->D, BS = 8;
    sd->nq_el = (size_t)s->n_q * (size_t)s->L * (size_t)s->Hq * D;
    sd->ns_el = (size_t)s->nb * (size_t)s->L * (size_t)s->Hkv * D;
    sd->no_el = (size_t)s->L * (size_t)s->Hq * (size_t)s->nb;
    sd->q = malloc(sd->nq_el * 4);
    sd->mn = malloc(sd->ns_el * 4);
    sd->mx = malloc(sd->ns_el * 4);
    for (size_t i = 0; i < sd->nq_el; i++) sd->q[i] = tu_normal(rng);
    /* AABBs of BS random keys per (block, layer, KV head) */
    for (size_t r = 0; r < sd->ns_el / D; r++)
        for (size_t d = 0; d < D; d++) {
            float lo = INFINITY, hi = -INFINITY;
            for (size_t i = 0; i < BS; i++) {
                float x = tu_normal(rng);
                lo = fminf(lo, x);
                hi = fmaxf(hi, x);
            }
            sd->mn[r * D + d] = lo;
            sd->mx[r * D + d] = hi;
        }
    const size_t blk = sd->ns_el / (size_t)s->nb; /* floats per block */
    if (kind == DATA_ALL_EQUAL)
        for (int32_t j = 1; j < s->nb; j++) {
            memcpy(sd->mn + (size_t)j * blk, sd->mn, blk * 4);
            memcpy(sd->mx + (size_t)j * blk, sd->mx, blk * 4);
        }
    if (kind == DATA_TWINS) /* every third block repeats the block before it */
        for (int32_t j = 2; j < s->nb; j += 3) {
            memcpy(sd->mn + (size_t)j * blk, sd->mn + (size_t)(j - 1) * blk, blk * 4);
            memcpy(sd->mx + (size_t)j * blk, sd->mx + (size_t)(j - 1) * blk, blk * 4);
        }
}

static void free_score_data(score_data *sd) {
    free(sd->q);
    free(sd->mn);
    free(sd->mx);
}

/* The n outputs of bo placed off bytes in, framed by -777 sentinels that
 * must be left as they were (malloc'd; frees frame). */
static float *framed_output(kvmem_backend *be, const kvmem_buffer *bo, float *frame, size_t n, size_t off) {
    bget(be, bo, 0, frame, 2 * off + n * 4);
    for (size_t i = 0; i < off / 4; i++) {
        assert_true(frame[i] == -777.0f); /* nothing written outside the output */
        assert_true(frame[off / 4 + n + i] == -777.0f);
    }
    float *out = malloc(n * 4);
    memcpy(out, frame + off / 4, n * 4);
    free(frame);
    return out;
}

/* Run dev_score on `be` with the data placed `off` bytes into each buffer
 * (the output framed by sentinels); returns out [L][Hq][nb] (malloc'd). */
static float *run_score(kvmem_backend *be, const score_data *sd, kvmem_retrieve_norm norm, kvmem_retrieve_agg agg,
                        float tau, float rr_c, size_t off) {
    const shape *s = &sd->s;
    kvmem_buffer *bq = balloc(be, off + sd->nq_el * 4), *bmn = balloc(be, off + sd->ns_el * 4),
                 *bmx = balloc(be, off + sd->ns_el * 4), *bo = balloc(be, 2 * off + sd->no_el * 4);
    bput(be, bq, off, sd->q, sd->nq_el * 4);
    bput(be, bmn, off, sd->mn, sd->ns_el * 4);
    bput(be, bmx, off, sd->mx, sd->ns_el * 4);
    float *frame = malloc(2 * off + sd->no_el * 4);
    for (size_t i = 0; i < (2 * off) / 4 + sd->no_el; i++) frame[i] = -777.0f;
    bput(be, bo, 0, frame, 2 * off + sd->no_el * 4);
    kvm_dev_score_args a = {bq, bmn, bmx, bo, off, off, off, s->n_q, s->nb, s->L, s->Hq, s->Hkv, s->D,
                            norm, agg, tau, rr_c, 0, 0, NULL, KVMEM_RETRIEVE_AABB, NULL, NULL, 0, 0};
    assert_ok(be->iface->dev_score(be, &a));
    float *out = framed_output(be, bo, frame, sd->no_el, off);
    bfree(be, bq);
    bfree(be, bmn);
    bfree(be, bmx);
    bfree(be, bo);
    return out;
}

/* Interval [lo, hi] each output must lie in, from the double reference and
 * the I error bound of a backend (f16 operands or f32). */
/* I_ext, dI_ext (EXACT; NULL: from the AABBs): each block's relevance and
 * its error bound, [L][Hq][n_q][nb]. */
static void score_bounds_of(const score_data *sd, kvmem_retrieve_norm norm, kvmem_retrieve_agg agg, double tau,
                            double rr_c, int f16, const double *I_ext, const double *dI_ext, double *lo, double *hi);
static void score_bounds(const score_data *sd, kvmem_retrieve_norm norm, kvmem_retrieve_agg agg, double tau,
                         double rr_c, int f16, double *lo, double *hi) {
    score_bounds_of(sd, norm, agg, tau, rr_c, f16, NULL, NULL, lo, hi);
}
static void score_bounds_of(const score_data *sd, kvmem_retrieve_norm norm, kvmem_retrieve_agg agg, double tau,
                            double rr_c, int f16, const double *I_ext, const double *dI_ext, double *lo, double *hi) {
    const shape *s = &sd->s;
    const size_t L = (size_t)s->L, Hq = (size_t)s->Hq, Hkv = (size_t)s->Hkv, D = (size_t)s->D, NB = (size_t)s->nb;
    const size_t G = Hq / Hkv, nq = (size_t)s->n_q;
    double *I = malloc(NB * sizeof *I), *dI = malloc(NB * sizeof *dI), *plo = malloc(NB * sizeof *plo),
           *phi = malloc(NB * sizeof *phi);
    size_t *cls = malloc(NB * sizeof *cls); /* lowest block with a bit-identical AABB */
    for (size_t l = 0; l < L; l++)
        for (size_t h = 0; h < Hq; h++) {
            const size_t g = h / G;
            for (size_t j = 0; j < NB; j++) {
                const float *bj = sd->mx + ((j * L + l) * Hkv + g) * D, *cj = sd->mn + ((j * L + l) * Hkv + g) * D;
                cls[j] = j;
                for (size_t k = 0; k < j && cls[j] == j && !I_ext; k++)
                    if (cls[k] == k && memcmp(bj, sd->mx + ((k * L + l) * Hkv + g) * D, D * 4) == 0 &&
                        memcmp(cj, sd->mn + ((k * L + l) * Hkv + g) * D, D * 4) == 0)
                        cls[j] = k;
            }
            double *olo = lo + (l * Hq + h) * NB, *ohi = hi + (l * Hq + h) * NB;
            for (size_t j = 0; j < NB; j++) olo[j] = ohi[j] = 0;
            for (size_t t = 0; t < nq; t++) {
                const float *q = sd->q + ((t * L + l) * Hq + h) * D;
                double m = -INFINITY, dmax = 0;
                for (size_t j = 0; I_ext && j < NB; j++) {
                    I[j] = I_ext[((l * Hq + h) * nq + t) * NB + j];
                    dI[j] = dI_ext[((l * Hq + h) * nq + t) * NB + j];
                    m = fmax(m, I[j]);
                    dmax = fmax(dmax, dI[j]);
                }
                for (size_t j = 0; !I_ext && j < NB; j++) {
                    const float *mx = sd->mx + ((j * L + l) * Hkv + g) * D, *mn = sd->mn + ((j * L + l) * Hkv + g) * D;
                    double acc = 0, M = 0, sub = 0;
                    for (size_t d = 0; d < D; d++) {
                        double a = (double)q[d] * mx[d], b = (double)q[d] * mn[d];
                        acc += a > b ? a : b;
                        double sm = fmax(fabs((double)mx[d]), fabs((double)mn[d]));
                        M += fabs((double)q[d]) * sm;
                        sub += fabs((double)q[d]) + sm;
                    }
                    I[j] = acc;
                    dI[j] = (double)D * ldexp(1, -23) * M + (f16 ? 1.01 * ldexp(1, -10) * M + ldexp(1, -25) * sub : 0);
                    m = fmax(m, acc);
                    dmax = fmax(dmax, dI[j]);
                }
                if (norm == KVMEM_NORM_SOFTMAX) {
                    double sum = 0, den = 0;
                    for (size_t j = 0; j < NB; j++) sum += exp(tau * (I[j] - m));
                    for (size_t j = 0; j < NB; j++) den += exp(tau * (I[j] - m)) / sum * 2e-5 * (1 + tau * (m - I[j]));
                    for (size_t j = 0; j < NB; j++) {
                        double p = exp(tau * (I[j] - m)) / sum;
                        double e = p * (expm1(2 * tau * dmax) + 2e-5 * (1 + tau * (m - I[j])) + den + 1e-6);
                        plo[j] = p - e;
                        phi[j] = p + e;
                    }
                } else {
                    for (size_t j = 0; j < NB; j++) {
                        size_t rmin = 1, rmax = 1;
                        for (size_t k = 0; k < NB; k++) {
                            if (k == j) continue;
                            if (cls[k] == cls[j]) { /* twins: the tie rule */
                                rmin += k < j;
                                rmax += k < j;
                                continue;
                            }
                            double dd = I[k] - I[j], w = dI[j] + dI[k];
                            if (dd > w) rmin++, rmax++;
                            else if (dd >= -w) rmax++;
                        }
                        plo[j] = 1.0 / ((double)rmax + rr_c) * (1 - 4 * ldexp(1, -24));
                        phi[j] = 1.0 / ((double)rmin + rr_c) * (1 + 4 * ldexp(1, -24));
                    }
                }
                for (size_t j = 0; j < NB; j++) {
                    if (agg == KVMEM_AGG_MAX) {
                        olo[j] = fmax(olo[j], plo[j]);
                        ohi[j] = fmax(ohi[j], phi[j]);
                    } else {
                        olo[j] += plo[j];
                        ohi[j] += phi[j];
                    }
                }
            }
            if (agg == KVMEM_AGG_SUM) /* f32 accumulation over the tokens */
                for (size_t j = 0; j < NB; j++) {
                    double e = (double)nq * ldexp(1, -23) * ohi[j];
                    olo[j] -= e;
                    ohi[j] += e;
                }
        }
    free(I);
    free(dI);
    free(plo);
    free(phi);
    free(cls);
}

static void check_in(const char *who, const float *got, const double *lo, const double *hi, size_t n, const shape *s,
                     int norm, int agg) {
    for (size_t i = 0; i < n; i++)
        if (!((double)got[i] >= lo[i] && (double)got[i] <= hi[i]))
            fail_msg("dev_score %s (L %d Hq %d Hkv %d D %d n_q %d nb %d, norm %d agg %d): out[%zu] = %.9g outside "
                     "[%.9g, %.9g]",
                     who, s->L, s->Hq, s->Hkv, s->D, s->n_q, s->nb, norm, agg, i, (double)got[i], lo[i], hi[i]);
}

static void score_case(const shape *s, int kind, size_t off, float tau, uint64_t *rng) {
    score_data sd;
    make_score_data(&sd, s, kind, rng);
    const float rr_c = 60.0f;
    double *lo = malloc(sd.no_el * sizeof *lo), *hi = malloc(sd.no_el * sizeof *hi);
    double *clo = malloc(sd.no_el * sizeof *clo), *chi = malloc(sd.no_el * sizeof *chi);
    for (int norm = 0; norm < 2; norm++)
        for (int agg = 0; agg < 2; agg++) {
            kvmem_retrieve_norm nm = norm ? KVMEM_NORM_RR : KVMEM_NORM_SOFTMAX;
            kvmem_retrieve_agg ag = agg ? KVMEM_AGG_SUM : KVMEM_AGG_MAX;
            float *got = run_score(g_be, &sd, nm, ag, tau, rr_c, off);
            float *cpu = g_be == g_cpu ? NULL : run_score(g_cpu, &sd, nm, ag, tau, rr_c, off);
            score_bounds(&sd, nm, ag, tau, rr_c, is_cuda(), lo, hi);
            check_in(g_name, got, lo, hi, sd.no_el, s, nm, ag);
            if (cpu) {
                score_bounds(&sd, nm, ag, tau, rr_c, 0, clo, chi);
                check_in("cpu", cpu, clo, chi, sd.no_el, s, nm, ag);
                for (size_t i = 0; i < sd.no_el; i++) { /* backend vs CPU entry: within both bounds */
                    double tol = (hi[i] - lo[i]) + (chi[i] - clo[i]);
                    if (fabs((double)got[i] - (double)cpu[i]) > tol)
                        fail_msg("dev_score %s vs cpu: out[%zu] %.9g vs %.9g (tol %.3g)", g_name, i, (double)got[i],
                                 (double)cpu[i], tol);
                }
            }
            if (kind == DATA_ALL_EQUAL && s->n_q == 1) { /* exact: uniform softmax, RR ranks in index order */
                for (size_t i = 0; i < sd.no_el; i++) {
                    size_t j = i % (size_t)s->nb;
                    double want = nm == KVMEM_NORM_RR ? 1.0 / ((double)(j + 1) + rr_c) : 1.0 / s->nb;
                    if (fabs((double)got[i] - want) > 4e-6 * want)
                        fail_msg("dev_score ties: out[%zu] = %.9g, want %.9g", i, (double)got[i], want);
                }
            }
            free(got);
            free(cpu);
        }
    free(lo);
    free(hi);
    free(clo);
    free(chi);
    free_score_data(&sd);
}

static void test_dev_score_matches_reference(void **state) {
    (void)state;
    NEED_ENTRY(dev_score);
    uint64_t rng = 11;
    const shape shapes[] = {
        {2, 4, 2, 64, 5, 37},   /* GQA 2:1, blocks not a multiple of 16 */
        {1, 1, 1, 128, 1, 1},   /* one block: softmax 1, RR 1/(1 + c) */
        {1, 8, 1, 40, 20, 300}, /* 8:1, n_q > 16, > 128 blocks (several tiles), D not a multiple of 16 */
        {3, 2, 2, 16, 17, 16},  /* MHA, n_q 17, blocks exactly one tile */
        {1, 2, 1, 8, 1, 129},   /* decode */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        score_case(&shapes[i], DATA_RANDOM, i % 2 ? 12 : 0, 1.0f / sqrtf((float)shapes[i].D), &rng);
    shape sharp = {1, 4, 4, 32, 3, 50};
    score_case(&sharp, DATA_RANDOM, 4, 1.0f, &rng); /* a sharper softmax */
}

static void test_dev_score_ties_rank_by_index(void **state) {
    (void)state;
    NEED_ENTRY(dev_score);
    uint64_t rng = 12;
    shape eq = {1, 2, 1, 32, 1, 40};
    score_case(&eq, DATA_ALL_EQUAL, 0, 0.25f, &rng);
    shape tw = {2, 4, 2, 24, 3, 61};
    score_case(&tw, DATA_TWINS, 8, 0.2f, &rng);
}

/* Many query tokens through a small scratch buffer: the Vulkan backend then
 * scores in several chunks over several submissions. */
static void test_dev_score_many_tokens_in_chunks(void **state) {
    (void)state;
    NEED_ENTRY(dev_score);
    uint64_t rng = 13;
    shape s = {1, 2, 1, 16, 100, 37};
    setenv("KVMEM_VULKAN_SCORE_SCRATCH_BYTES", "4096", 1);
    score_case(&s, DATA_TWINS, 0, 0.25f, &rng);
    unsetenv("KVMEM_VULKAN_SCORE_SCRATCH_BYTES");
}

/* Thousands of blocks, and RR's tokens x blocks well past what one
 * invocation may loop over (800 tokens x 128 blocks; the reference's RR is
 * tokens x blocks^2, so the long cases keep one of the two small). */
static void test_dev_score_many_blocks_and_tokens(void **state) {
    (void)state;
    NEED_ENTRY(dev_score);
    uint64_t rng = 14;
    const shape shapes[] = {
        {1, 1, 1, 16, 800, 128}, /* 800 tokens x 128 blocks */
        {1, 1, 1, 32, 1, 2000},  /* decode over 2000 blocks */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        score_case(&shapes[i], i == 1 ? DATA_TWINS : DATA_RANDOM, i % 2 ? 8 : 0, 0.25f, &rng);
    /* one 128-block rank range and one token per dispatch */
    setenv("KVMEM_VULKAN_LOOP_BUDGET", "1", 1);
    shape s = {1, 2, 1, 16, 5, 700};
    score_case(&s, DATA_TWINS, 4, 0.25f, &rng);
    unsetenv("KVMEM_VULKAN_LOOP_BUDGET");
}

static void test_dev_score_rejects_bad_input_and_changes_nothing(void **state) {
    (void)state;
    NEED_ENTRY(dev_score);
    float z[64], o[64], init[64];
    for (int i = 0; i < 64; i++) z[i] = 0.5f, init[i] = -1.0f;
    kvmem_buffer *b = bnew(g_be, z, sizeof z), *bo = bnew(g_be, init, sizeof init);
    /* 1 token, 2 blocks, 1 layer, 2 q heads, 1 KV head, dim 4: q 8, s 8, out 4 floats */
    kvm_dev_score_args a = {b, b, b, bo, 0, 0, 0, 1, 2, 1, 2, 1, 4, KVMEM_NORM_SOFTMAX, KVMEM_AGG_MAX, 0.5f, 60.0f, 0, 0, NULL, KVMEM_RETRIEVE_AABB, NULL, NULL, 0, 0};
    kvm_dev_score_args g = a;
    assert_status(g_be->iface->dev_score(g_be, NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    a.n_q = 0;
    assert_status(g_be->iface->dev_score(g_be, &a), KVMEM_ERR_INVALID_ARG, "empty");
    a = g;
    a.n_blocks = -1;
    assert_status(g_be->iface->dev_score(g_be, &a), KVMEM_ERR_INVALID_ARG, "negative");
    a = g;
    a.n_kv_heads = 3;
    a.n_q_heads = 4;
    assert_status(g_be->iface->dev_score(g_be, &a), KVMEM_ERR_INVALID_ARG, "multiple");
    a = g;
    a.norm = (kvmem_retrieve_norm)7;
    assert_status(g_be->iface->dev_score(g_be, &a), KVMEM_ERR_INVALID_ARG, "norm");
    a = g;
    a.agg = (kvmem_retrieve_agg)9;
    assert_status(g_be->iface->dev_score(g_be, &a), KVMEM_ERR_INVALID_ARG, "agg");
    a = g;
    a.tau = 0;
    assert_status(g_be->iface->dev_score(g_be, &a), KVMEM_ERR_INVALID_ARG, "tau");
    a.tau = NAN;
    assert_status(g_be->iface->dev_score(g_be, &a), KVMEM_ERR_INVALID_ARG, "tau");
    a = g;
    a.rr_c = -1;
    assert_status(g_be->iface->dev_score(g_be, &a), KVMEM_ERR_INVALID_ARG, "rr_c");
    a = g;
    a.s_max = NULL;
    assert_status(g_be->iface->dev_score(g_be, &a), KVMEM_ERR_INVALID_ARG, "NULL");
    a = g;
    a.out_off = 2;
    assert_status(g_be->iface->dev_score(g_be, &a), KVMEM_ERR_INVALID_ARG, "multiples of 4");
    a = g;
    a.n_blocks = 17; /* 68 floats of AABBs: more than the buffer */
    assert_status(g_be->iface->dev_score(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    a = g;
    a.out_off = 61 * 4;
    assert_status(g_be->iface->dev_score(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    a = g;
    a.q_off = SIZE_MAX - 3;
    assert_status(g_be->iface->dev_score(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    a = g;
    a.n_q = INT32_MAX;
    a.n_layers = INT32_MAX;
    assert_status(g_be->iface->dev_score(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    bget(g_be, bo, 0, o, sizeof o);
    assert_memory_equal(o, init, sizeof o);
    assert_ok(g_be->iface->dev_score(g_be, &g)); /* the good call works: 2 equal blocks */
    bget(g_be, bo, 0, o, sizeof o);
    for (int i = 0; i < 4; i++) assert_true(fabsf(o[i] - 0.5f) < 1e-6f);
    assert_true(o[4] == -1.0f);
    bfree(g_be, b);
    bfree(g_be, bo);
}

/* kvmem_retrieve with mode EXACT on the backend's context and on a CPU
 * context holding the same agent (f16 storage, blocks of 16, GQA): the same
 * selection, block scores within 1e-4 relative, and after a first call
 * (which makes the agent's resident copy) a call uploads the query alone
 * and reads back the per-block scores: nothing that grows with the history
 * goes up. */
static void test_exact_retrieve_api_matches_cpu(void **state) {
    (void)state;
    NEED_BACKEND();
    enum { EL = 2, EHQ = 4, EH = 2, ED = 32, EBS = 16, ETOP = 5, ET = 64 * EBS };
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cpu";
    cp.n_threads = 2;
    kvmem_context *cctx = NULL;
    assert_ok(kvmem_context_create(&cp, &cctx));
    kvmem_context *ctxs[2] = {g_ctx, cctx};
    kvmem_pool *pools[2];
    kvmem_agent *ags[2];
    kvmem_model_spec sp = tu_spec(EL, ED);
    sp.n_q_heads = EHQ, sp.n_kv_heads = EH;
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = EBS;
    pp.storage_dtype = KVMEM_F16;
    uint64_t rng = 41;
    const size_t cnt = (size_t)EL * ET * EH * ED;
    float *k = malloc(cnt * 4), *v = malloc(cnt * 4);
    for (size_t i = 0; i < cnt; i++) k[i] = tu_normal(&rng), v[i] = tu_normal(&rng);
    int64_t sh[4] = {EL, ET, EH, ED};
    kvmem_tensor kt, vt;
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 4, sh));
    for (int i = 0; i < 2; i++) {
        assert_ok(kvmem_pool_create(ctxs[i], &sp, &pp, &pools[i]));
        assert_ok(kvmem_agent_open(pools[i], "a", &ags[i]));
        assert_ok(kvmem_agent_append(ags[i], &kt, &vt, NULL));
    }
    for (int call = 0; call < 3; call++) {
        float q[EL * EHQ * ED];
        for (int i = 0; i < EL * EHQ * ED; i++) q[i] = tu_normal(&rng);
        int64_t qs[4] = {1, EL, EHQ, ED};
        kvmem_tensor qt;
        assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 4, qs));
        kvmem_retrieve_params rp = kvmem_retrieve_default_params();
        rp.top_k = ETOP;
        rp.mode = KVMEM_RETRIEVE_EXACT;
        kvmem_retrieval *r[2];
        uint64_t h0, d0, h1, d1;
        assert_ok(kvmem_context_transfer_stats(g_ctx, &h0, &d0));
        for (int i = 0; i < 2; i++) {
            assert_ok(kvmem_retrieval_create(&r[i]));
            assert_ok(kvmem_retrieve(ags[i], &qt, &rp, r[i]));
        }
        assert_ok(kvmem_context_transfer_stats(g_ctx, &h1, &d1));
        const float *all[2];
        const int32_t *sel[2];
        int32_t nb[2], ns[2];
        for (int i = 0; i < 2; i++) {
            assert_ok(kvmem_retrieval_block_scores(r[i], 0, &all[i], &nb[i]));
            assert_ok(kvmem_retrieval_get(r[i], 0, &sel[i], NULL, &ns[i]));
        }
        assert_int_equal(nb[0], nb[1]);
        assert_int_equal(ns[0], ns[1]);
        for (int32_t j = 0; j < nb[0]; j++)
            if (!(fabsf(all[0][j] - all[1][j]) <= 1e-4f * fabsf(all[1][j]) + 1e-7f))
                fail_msg("EXACT on %s: block %d scores %.9g, cpu %.9g", g_name, j, (double)all[0][j], (double)all[1][j]);
        for (int32_t i = 0; i < ns[0]; i++) assert_int_equal(sel[0][i], sel[1][i]);
        if (g_be != g_cpu && call > 0) { /* the mirror is resident: the query up, the scores down */
            if (h1 - h0 != sizeof q || d1 - d0 != (uint64_t)nb[0] * 4)
                fail_msg("EXACT on %s moved %llu bytes up (query %zu), %llu down (scores %d)", g_name,
                         (unsigned long long)(h1 - h0), sizeof q, (unsigned long long)(d1 - d0), nb[0] * 4);
        }
        kvmem_retrieval_free(r[0]);
        kvmem_retrieval_free(r[1]);
    }
    for (int i = 0; i < 2; i++) {
        kvmem_agent_close(ags[i]);
        kvmem_pool_free(pools[i]);
    }
    kvmem_context_free(cctx);
    free(k);
    free(v);
}

/* ---- EXACT's buffer form: keys from per-layer row buffers ----
 * Block j's keys are rows [j R, (j + 1) R) of layer l's buffer
 * ([rows][Hkv][D], from byte `off`), as an agent's resident raw keys. I is
 * the largest q . k over the block's rows, in double here; its bound is the
 * largest of the rows' f32 dot-product bounds, D 2^-23 sum_d |q_d k_d|; the
 * normalised outputs then lie within score_bounds' intervals. f16 rows
 * are read exactly (widened), so the bound is the same. */
static float *run_exact(kvmem_backend *be, const score_data *sd, float *const *keys, uint16_t *const *keys16,
                        int32_t R, kvmem_retrieve_norm norm, kvmem_retrieve_agg agg, float tau, float rr_c, size_t off) {
    const shape *s = &sd->s;
    const size_t nk = (size_t)s->nb * R * s->Hkv * s->D, es = keys16 ? 2 : 4;
    kvmem_buffer *bq = balloc(be, off + sd->nq_el * 4), *bo = balloc(be, 2 * off + sd->no_el * 4);
    kvmem_buffer **bk = malloc((size_t)s->L * sizeof *bk);
    bput(be, bq, off, sd->q, sd->nq_el * 4);
    for (int32_t l = 0; l < s->L; l++) {
        bk[l] = balloc(be, off + nk * es + 4);
        bput(be, bk[l], off, keys16 ? (const void *)keys16[l] : (const void *)keys[l], nk * es);
    }
    float *frame = malloc(2 * off + sd->no_el * 4);
    for (size_t i = 0; i < (2 * off) / 4 + sd->no_el; i++) frame[i] = -777.0f;
    bput(be, bo, 0, frame, 2 * off + sd->no_el * 4);
    kvm_dev_score_args a;
    memset(&a, 0, sizeof a);
    a.q = bq, a.out = bo, a.q_off = off, a.s_off = off, a.out_off = off;
    a.n_q = s->n_q, a.n_blocks = s->nb, a.n_layers = s->L, a.n_q_heads = s->Hq, a.n_kv_heads = s->Hkv, a.head_dim = s->D;
    a.norm = norm, a.agg = agg, a.tau = tau, a.rr_c = rr_c, a.mode = KVMEM_RETRIEVE_EXACT;
    a.key_rows = (const kvmem_buffer *const *)bk;
    a.block_rows = R;
    a.key_f16 = keys16 != NULL;
    assert_ok(be->iface->dev_score(be, &a));
    float *out = framed_output(be, bo, frame, sd->no_el, off);
    bfree(be, bq);
    bfree(be, bo);
    for (int32_t l = 0; l < s->L; l++) bfree(be, bk[l]);
    free(bk);
    return out;
}

static void exact_case(const shape *s, int32_t R, int f16, size_t off, float tau, uint64_t *rng) {
    score_data sd;
    make_score_data(&sd, s, DATA_RANDOM, rng);
    const size_t L = (size_t)s->L, Hq = (size_t)s->Hq, Hkv = (size_t)s->Hkv, D = (size_t)s->D, NB = (size_t)s->nb;
    const size_t nq = (size_t)s->n_q, G = Hq / Hkv, nk = NB * (size_t)R * Hkv * D;
    float **keys = malloc(L * sizeof *keys);
    uint16_t **keys16 = malloc(L * sizeof *keys16);
    for (size_t l = 0; l < L; l++) {
        keys[l] = malloc(nk * 4);
        keys16[l] = malloc(nk * 2);
        for (size_t i = 0; i < nk; i++) {
            keys16[l][i] = kvm_f32_to_f16(tu_normal(rng));
            keys[l][i] = f16 ? kvm_f16_to_f32(keys16[l][i]) : tu_normal(rng);
        }
    }
    double *I = malloc(sd.no_el * nq * sizeof *I), *dI = malloc(sd.no_el * nq * sizeof *dI);
    for (size_t l = 0; l < L; l++)
        for (size_t h = 0; h < Hq; h++)
            for (size_t t = 0; t < nq; t++)
                for (size_t j = 0; j < NB; j++) {
                    const float *q = sd.q + ((t * L + l) * Hq + h) * D;
                    double best = -INFINITY, bound = 0;
                    for (int32_t r = 0; r < R; r++) {
                        const float *k = keys[l] + ((j * (size_t)R + (size_t)r) * Hkv + h / G) * D;
                        double x = 0, m = 0;
                        for (size_t d = 0; d < D; d++) x += (double)q[d] * k[d], m += fabs((double)q[d] * k[d]);
                        best = fmax(best, x);
                        bound = fmax(bound, (double)D * ldexp(1, -23) * m);
                    }
                    I[((l * Hq + h) * nq + t) * NB + j] = best;
                    dI[((l * Hq + h) * nq + t) * NB + j] = bound;
                }
    double *lo = malloc(sd.no_el * sizeof *lo), *hi = malloc(sd.no_el * sizeof *hi);
    const float rr_c = 60.0f;
    for (int norm = 0; norm < 2; norm++)
        for (int agg = 0; agg < 2; agg++) {
            kvmem_retrieve_norm nm = norm ? KVMEM_NORM_RR : KVMEM_NORM_SOFTMAX;
            kvmem_retrieve_agg ag = agg ? KVMEM_AGG_SUM : KVMEM_AGG_MAX;
            score_bounds_of(&sd, nm, ag, tau, rr_c, 0, I, dI, lo, hi);
            float *got = run_exact(g_be, &sd, keys, f16 ? keys16 : NULL, R, nm, ag, tau, rr_c, off);
            float *cpu = run_exact(g_cpu, &sd, keys, f16 ? keys16 : NULL, R, nm, ag, tau, rr_c, off);
            check_in(g_name, got, lo, hi, sd.no_el, s, nm, ag);
            check_in("cpu", cpu, lo, hi, sd.no_el, s, nm, ag);
            for (size_t i = 0; i < sd.no_el; i++) /* the backend and the CPU entry: within both bounds */
                if (fabs((double)got[i] - (double)cpu[i]) > 2 * (hi[i] - lo[i]))
                    fail_msg("dev_score EXACT %s vs cpu: out[%zu] %.9g vs %.9g", g_name, i, (double)got[i], (double)cpu[i]);
            free(got);
            free(cpu);
        }
    for (size_t l = 0; l < L; l++) free(keys[l]), free(keys16[l]);
    free(keys), free(keys16), free(I), free(dI), free(lo), free(hi);
    free_score_data(&sd);
}

static void test_dev_score_exact_key_rows_match_reference(void **state) {
    (void)state;
    NEED_ENTRY(dev_score);
    uint64_t rng = 31;
    const struct {
        shape s;
        int32_t R, f16;
        size_t off;
    } cases[] = {
        {{2, 4, 2, 64, 1, 37}, 16, 0, 0},   /* decode, GQA 2:1, blocks of 16 */
        {{1, 8, 1, 40, 3, 130}, 8, 1, 12},  /* f16 rows, 8:1, n_q 3, > 128 blocks, an offset */
        {{3, 2, 2, 16, 17, 16}, 5, 0, 4},   /* MHA, n_q 17, odd blocks */
        {{1, 2, 1, 128, 1, 300}, 64, 1, 8}, /* long blocks: Vulkan splits the rows across dispatches */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        exact_case(&cases[i].s, cases[i].R, cases[i].f16, cases[i].off, 1.0f / sqrtf((float)cases[i].s.D), &rng);
    /* a low loop budget: one row per dispatch, many dispatches */
    setenv("KVMEM_VULKAN_LOOP_BUDGET", "100", 1);
    exact_case(&cases[0].s, 16, 0, 0, 0.125f, &rng);
    unsetenv("KVMEM_VULKAN_LOOP_BUDGET");
}

/* ======================= dev_score_reduce ======================= */

/* The contract's order (core/backend/backend.h), written out in the test: per layer
 * the heads in order, then the set's layers in order, f32 from 0. */
static void ref_reduce(const float *in, int32_t L, int32_t Hn, int32_t n, int32_t n_sets, float *out) {
    const int32_t per = L / n_sets;
    for (int32_t s = 0; s < n_sets; s++)
        for (int32_t j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int32_t l = s * per; l < (s + 1) * per; l++) {
                float layer = 0.0f;
                for (int32_t h = 0; h < Hn; h++) layer += in[((size_t)l * (size_t)Hn + (size_t)h) * (size_t)n + (size_t)j];
                acc += layer;
            }
            out[(size_t)s * (size_t)n + (size_t)j] = acc;
        }
}

/* Run dev_score_reduce on be with in at in_off and out framed by sentinels
 * at out_off; checks nothing outside out changed; returns out (malloc'd). */
static float *run_reduce(kvmem_backend *be, const float *in, int32_t L, int32_t Hn, int32_t n, int32_t n_sets,
                         size_t off) {
    const size_t ni = (size_t)L * (size_t)Hn * (size_t)n, no = (size_t)n_sets * (size_t)n;
    kvmem_buffer *bi = balloc(be, off + ni * 4), *bo = balloc(be, 2 * off + no * 4);
    bput(be, bi, off, in, ni * 4);
    float *frame = malloc(2 * off + no * 4), *back = malloc(ni * 4);
    for (size_t i = 0; i < 2 * off / 4 + no; i++) frame[i] = -777.0f;
    bput(be, bo, 0, frame, 2 * off + no * 4);
    kvm_dev_score_reduce_args a = {bi, bo, off, off, L, Hn, n, n_sets};
    assert_ok(be->iface->dev_score_reduce(be, &a));
    bget(be, bo, 0, frame, 2 * off + no * 4);
    for (size_t i = 0; i < off / 4; i++) {
        assert_true(frame[i] == -777.0f);
        assert_true(frame[off / 4 + no + i] == -777.0f);
    }
    bget(be, bi, off, back, ni * 4);
    assert_memory_equal(back, in, ni * 4); /* the input is read only */
    float *out = malloc(no * 4);
    memcpy(out, frame + off / 4, no * 4);
    free(frame);
    free(back);
    bfree(be, bi);
    bfree(be, bo);
    return out;
}

/* Both set layouts of one shape: the backend and the CPU entry equal the
 * test's loop bit for bit (same additions in the same order), and that loop
 * is the sum: within (n_heads + layers per set) * 2^-24 * sum |x| of a
 * double sum. Returns how many outputs a single running sum over the set's
 * (layer, head) pairs would round differently (the data must tell the
 * orders apart for the bit check to mean anything). */
static size_t reduce_case(int32_t L, int32_t Hn, int32_t n, size_t off, uint64_t *rng) {
    const size_t ni = (size_t)L * (size_t)Hn * (size_t)n;
    float *in = malloc(ni * 4);
    /* signs and magnitudes mixed (2^-12 .. 2^12): sums that cancel, so the
     * order of the additions shows in the bits */
    for (size_t i = 0; i < ni; i++) in[i] = tu_normal(rng) * ldexpf(1.0f, (int)(tu_uniform(rng, -12.0f, 12.0f)));
    size_t differ = 0;
    for (int32_t n_sets = 1; n_sets <= L; n_sets += L > 1 ? L - 1 : 1) {
        const size_t no = (size_t)n_sets * (size_t)n;
        const int32_t per = L / n_sets;
        float *want = malloc(no * 4);
        ref_reduce(in, L, Hn, n, n_sets, want);
        float *got = run_reduce(g_be, in, L, Hn, n, n_sets, off);
        float *cpu = g_be == g_cpu ? NULL : run_reduce(g_cpu, in, L, Hn, n, n_sets, off);
        for (size_t i = 0; i < no; i++) {
            const size_t s = i / (size_t)n, j = i % (size_t)n;
            if (memcmp(&got[i], &want[i], 4) != 0 && !(got[i] == 0.0f && want[i] == 0.0f))
                fail_msg("dev_score_reduce %s (L %d heads %d n %d sets %d): out[%zu] = %.9g, the contract's order gives %.9g",
                         g_name, L, Hn, n, n_sets, i, (double)got[i], (double)want[i]);
            if (cpu && memcmp(&cpu[i], &want[i], 4) != 0 && !(cpu[i] == 0.0f && want[i] == 0.0f))
                fail_msg("dev_score_reduce cpu: out[%zu] = %.9g, want %.9g", i, (double)cpu[i], (double)want[i]);
            double exact = 0, mag = 0;
            float one = 0.0f; /* a single running sum */
            for (int32_t l = (int32_t)s * per; l < ((int32_t)s + 1) * per; l++)
                for (int32_t h = 0; h < Hn; h++) {
                    const float x = in[((size_t)l * (size_t)Hn + (size_t)h) * (size_t)n + j];
                    exact += x;
                    mag += fabs((double)x);
                    one += x;
                }
            assert_true(fabs((double)want[i] - exact) <= (double)(Hn + per) * ldexp(1, -24) * mag);
            differ += memcmp(&one, &want[i], 4) != 0;
        }
        free(want);
        free(got);
        free(cpu);
    }
    free(in);
    return differ;
}

static void test_dev_score_reduce_follows_the_contract_order_bit_for_bit(void **state) {
    (void)state;
    NEED_ENTRY(dev_score_reduce);
    uint64_t rng = 21;
    /* GQA geometries (the reduce sums every query head of a layer) */
    assert_true(reduce_case(4, 8, 3000, 0, &rng) > 0); /* 4 layers, 8 query heads (8/2 GQA), thousands of blocks */
    assert_true(reduce_case(3, 6, 129, 12, &rng) > 0); /* a partial workgroup, offsets */
    reduce_case(1, 1, 1, 4, &rng);                     /* one term: a copy */
    assert_true(reduce_case(32, 32, 700, 0, &rng) > 0); /* Llama-8B's 32 x 32 */
    /* one layer per dispatch (Vulkan: the running total goes through
     * memory between dispatches), and one item range per dispatch */
    setenv("KVMEM_VULKAN_LOOP_BUDGET", "1", 1);
    assert_true(reduce_case(5, 4, 300, 8, &rng) > 0);
    unsetenv("KVMEM_VULKAN_LOOP_BUDGET");
}

static void test_dev_score_reduce_rejects_bad_input_and_changes_nothing(void **state) {
    (void)state;
    NEED_ENTRY(dev_score_reduce);
    float x[64], o[64], init[64];
    for (int i = 0; i < 64; i++) x[i] = (float)i, init[i] = -1.0f;
    kvmem_buffer *b = bnew(g_be, x, sizeof x), *bo = bnew(g_be, init, sizeof init);
    /* 2 layers x 3 heads x 4 blocks = 24 floats in, 4 (GLOBAL) or 8 out */
    kvm_dev_score_reduce_args a = {b, bo, 0, 0, 2, 3, 4, 1}, g = a;
    assert_status(g_be->iface->dev_score_reduce(g_be, NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    a.n = 0;
    assert_status(g_be->iface->dev_score_reduce(g_be, &a), KVMEM_ERR_INVALID_ARG, ">= 1");
    a = g;
    a.n_heads = -2;
    assert_status(g_be->iface->dev_score_reduce(g_be, &a), KVMEM_ERR_INVALID_ARG, ">= 1");
    a = g;
    a.n_sets = 3; /* neither 1 nor n_layers */
    assert_status(g_be->iface->dev_score_reduce(g_be, &a), KVMEM_ERR_INVALID_ARG, "n_sets");
    a = g;
    a.out = NULL;
    assert_status(g_be->iface->dev_score_reduce(g_be, &a), KVMEM_ERR_INVALID_ARG, "NULL");
    a = g;
    a.in_off = 2;
    assert_status(g_be->iface->dev_score_reduce(g_be, &a), KVMEM_ERR_INVALID_ARG, "multiples of 4");
    a = g;
    a.in_off = 41 * 4; /* 24 floats from 41 > 64 */
    assert_status(g_be->iface->dev_score_reduce(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    a = g;
    a.out_off = 57 * 4; /* 8 floats (PER_LAYER) from 57 > 64 */
    a.n_sets = 2;
    assert_status(g_be->iface->dev_score_reduce(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    a = g;
    a.n_layers = INT32_MAX;
    a.n_heads = INT32_MAX;
    assert_status(g_be->iface->dev_score_reduce(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    a = g;
    a.out = b; /* in place: out [20, 24) inside in [0, 24) */
    a.out_off = 20 * 4;
    assert_status(g_be->iface->dev_score_reduce(g_be, &a), KVMEM_ERR_INVALID_ARG, "overlap");
    bget(g_be, bo, 0, o, sizeof o);
    assert_memory_equal(o, init, sizeof o);
    bget(g_be, b, 0, o, sizeof o);
    assert_memory_equal(o, x, sizeof o);
    a = g;
    a.out = b; /* the same buffer, disjoint ranges: allowed */
    a.out_off = 24 * 4;
    assert_ok(g_be->iface->dev_score_reduce(g_be, &a));
    bget(g_be, b, 0, o, sizeof o);
    /* out[j] = sum over l, h of x[(l * 3 + h) * 4 + j] = 6 j + 4 * (0 + 1 + .. + 5) = 6 j + 60 */
    for (int j = 0; j < 4; j++) assert_true(o[24 + j] == (float)(6 * j + 60));
    assert_true(o[28] == 28.0f);
    bfree(g_be, b);
    bfree(g_be, bo);
}

/* ======================= dev_topk ======================= */

typedef struct rank_ref {
    float v;
    int32_t i;
} rank_ref;

static int ref_cmp(const void *x, const void *y) {
    const rank_ref *a = x, *b = y;
    if (a->v > b->v) return -1;
    if (a->v < b->v) return 1;
    return (a->i > b->i) - (a->i < b->i);
}

static int i32_cmp(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

/* The reference: sort (value desc, index asc) without NaNs, first k, ascending. */
static int32_t ref_topk(const float *x, int32_t n, int32_t k, int32_t *out) {
    rank_ref *r = malloc(((size_t)n + 1) * sizeof *r);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if (x[i] == x[i]) r[m].v = x[i], r[m++].i = i;
    qsort(r, (size_t)m, sizeof *r, ref_cmp);
    int32_t c = k < m ? k : m;
    for (int32_t i = 0; i < c; i++) out[i] = r[i].i;
    qsort(out, (size_t)c, sizeof *out, i32_cmp);
    free(r);
    return c;
}

static void run_topk(kvmem_backend *be, const float *x, int32_t n, int32_t k, size_t off, int32_t *got, int32_t *n_got) {
    const int32_t cap = k < n ? k : n;
    kvmem_buffer *bs = balloc(be, off + (size_t)n * 4 + 4), *bi = balloc(be, off + (size_t)cap * 4 + 8);
    bput(be, bs, off, x, (size_t)n * 4);
    int32_t *frame = malloc(off + (size_t)cap * 4 + 8);
    for (size_t i = 0; i < (off + (size_t)cap * 4 + 8) / 4; i++) frame[i] = -5;
    bput(be, bi, 0, frame, off + (size_t)cap * 4 + 8);
    *n_got = -9;
    kvm_dev_topk_args a = {bs, bi, off, off, n, k, n_got};
    assert_ok(be->iface->dev_topk(be, &a));
    bget(be, bi, 0, frame, off + (size_t)cap * 4 + 8);
    assert_true(*n_got >= 0 && *n_got <= cap);
    for (size_t i = 0; i < off / 4; i++) assert_int_equal(frame[i], -5);
    for (size_t i = off / 4 + (size_t)*n_got; i < (off + (size_t)cap * 4 + 8) / 4; i++)
        assert_int_equal(frame[i], -5); /* nothing written past n_out */
    memcpy(got, frame + off / 4, (size_t)*n_got * 4);
    free(frame);
    bfree(be, bs);
    bfree(be, bi);
}

static void topk_case(const float *x, int32_t n, int32_t k, size_t off) {
    int32_t cap = k < n ? k : n;
    int32_t *want = malloc(((size_t)cap + 1) * 4), *got = malloc(((size_t)cap + 1) * 4);
    int32_t nw = ref_topk(x, n, k, want), ng;
    for (int pass = 0; pass < 2; pass++) {
        kvmem_backend *be = pass ? g_cpu : g_be;
        if (pass && g_be == g_cpu) break;
        run_topk(be, x, n, k, off, got, &ng);
        if (ng != nw) fail_msg("dev_topk %s n %d k %d: n_out %d, want %d", be->iface->name, n, k, ng, nw);
        for (int32_t i = 0; i < nw; i++)
            if (got[i] != want[i])
                fail_msg("dev_topk %s n %d k %d: idx[%d] = %d, want %d", be->iface->name, n, k, i, got[i], want[i]);
    }
    free(want);
    free(got);
}

static void test_dev_topk_matches_reference_exactly(void **state) {
    (void)state;
    NEED_ENTRY(dev_topk);
    uint64_t rng = 21;
    const int32_t ns[] = {1, 2, 10, 1023, 1024, 1025, 5000};
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
        int32_t n = ns[c];
        float *x = malloc((size_t)n * 4);
        for (int variant = 0; variant < 4; variant++) {
            for (int32_t i = 0; i < n; i++) {
                float v = tu_normal(&rng);
                if (variant == 1) v = floorf(v * 3.0f); /* many ties */
                if (variant == 2 && tu_next(&rng) % 5 == 0) v = NAN;
                if (variant == 3) { /* signed zeros, infinities, denormals, NaNs, ties */
                    static const float pool[] = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, 1e-40f, -1e-40f, 0.5f};
                    uint64_t r = tu_next(&rng) % 10;
                    v = r < 9 ? pool[r] : NAN;
                }
                x[i] = v;
            }
            const int32_t ks[] = {1, 2, 3, n / 2, n - 1, n, n + 5};
            for (size_t kc = 0; kc < sizeof ks / sizeof ks[0]; kc++)
                if (ks[kc] > 0) topk_case(x, n, ks[kc], (kc % 2) * 8);
        }
        free(x);
    }
}

static void test_dev_topk_edges(void **state) {
    (void)state;
    NEED_ENTRY(dev_topk);
    float x[5] = {NAN, NAN, NAN, NAN, NAN};
    topk_case(x, 5, 3, 0); /* all NaN: nothing */
    float y[6] = {2, 2, 2, 2, 2, 2};
    topk_case(y, 6, 4, 4); /* all equal: the lowest indices */
    float z[3] = {-0.0f, 0.0f, -0.0f};
    topk_case(z, 3, 1, 0); /* -0 == +0: index 0 */
    /* k = 0 and n = 0: nothing written, n_out 0 */
    kvmem_buffer *b = bnew(g_be, y, sizeof y);
    int32_t n_out = 7;
    kvm_dev_topk_args a = {b, b, 0, 0, 6, 0, &n_out};
    assert_ok(g_be->iface->dev_topk(g_be, &a));
    assert_int_equal(n_out, 0);
    n_out = 7;
    a.n = 0;
    a.k = 3;
    assert_ok(g_be->iface->dev_topk(g_be, &a));
    assert_int_equal(n_out, 0);
    float back[6];
    bget(g_be, b, 0, back, sizeof back);
    assert_memory_equal(back, y, sizeof y);
    bfree(g_be, b);
}

static void test_dev_topk_million(void **state) {
    (void)state;
    NEED_ENTRY(dev_topk);
    uint64_t rng = 22;
    const int32_t n = 1 << 20;
    float *x = malloc((size_t)n * 4);
    for (int32_t i = 0; i < n; i++) x[i] = floorf(tu_normal(&rng) * 100.0f) / 100.0f; /* ~ 800 distinct values */
    for (int32_t i = 0; i < n; i += 97) x[i] = NAN;
    topk_case(x, n, 1000, 0);
    topk_case(x, n, n / 2 + 3, 4);
    for (int32_t i = 0; i < n; i++) x[i] = tu_normal(&rng);
    topk_case(x, n, 8, 0);
    free(x);
}

static void test_dev_topk_rejects_bad_input_and_changes_nothing(void **state) {
    (void)state;
    NEED_ENTRY(dev_topk);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t init[8] = {-1, -1, -1, -1, -1, -1, -1, -1}, back[8];
    kvmem_buffer *bs = bnew(g_be, x, sizeof x), *bi = bnew(g_be, init, sizeof init);
    int32_t n_out = 42;
    kvm_dev_topk_args a = {bs, bi, 0, 0, 8, 4, &n_out}, g = a;
    assert_status(g_be->iface->dev_topk(g_be, NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    a.n_out = NULL;
    assert_status(g_be->iface->dev_topk(g_be, &a), KVMEM_ERR_INVALID_ARG, "n_out");
    a = g;
    a.n = -1;
    assert_status(g_be->iface->dev_topk(g_be, &a), KVMEM_ERR_INVALID_ARG, ">= 0");
    a = g;
    a.k = -2;
    assert_status(g_be->iface->dev_topk(g_be, &a), KVMEM_ERR_INVALID_ARG, ">= 0");
    a = g;
    a.scores = NULL;
    assert_status(g_be->iface->dev_topk(g_be, &a), KVMEM_ERR_INVALID_ARG, "NULL");
    a = g;
    a.scores_off = 2;
    assert_status(g_be->iface->dev_topk(g_be, &a), KVMEM_ERR_INVALID_ARG, "multiples of 4");
    a = g;
    a.n = 9;
    assert_status(g_be->iface->dev_topk(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    a = g;
    a.idx_off = 20; /* 4 results from int 5: past the 8 */
    assert_status(g_be->iface->dev_topk(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    a = g;
    a.scores_off = SIZE_MAX - 3;
    assert_status(g_be->iface->dev_topk(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    assert_int_equal(n_out, 42);
    bget(g_be, bi, 0, back, sizeof back);
    assert_memory_equal(back, init, sizeof init);
    assert_ok(g_be->iface->dev_topk(g_be, &g));
    assert_int_equal(n_out, 4);
    bget(g_be, bi, 0, back, sizeof back);
    for (int i = 0; i < 4; i++) assert_int_equal(back[i], 4 + i);
    assert_int_equal(back[4], -1);
    bfree(g_be, bs);
    bfree(g_be, bi);
}

/* ======================= dev_gather_rope ======================= */

static float *run_gather(kvmem_backend *be, const kvm_dev_gather_args *shape_args, const float *src, size_t src_el,
                         const uint32_t *idx, const float *cs, size_t cs_el) {
    kvm_dev_gather_args a = *shape_args;
    const size_t row = a.n_heads * a.head_dim, out_el = a.n_out * row;
    kvmem_buffer *bs = balloc(be, a.src_off + src_el * 4), *bi = balloc(be, a.idx_off + a.n_out * 4),
                 *bc = cs ? balloc(be, a.cs_off + cs_el * 4) : NULL, *bo = balloc(be, a.out_off + out_el * 4 + 8);
    bput(be, bs, a.src_off, src, src_el * 4);
    bput(be, bi, a.idx_off, idx, a.n_out * 4);
    if (cs) bput(be, bc, a.cs_off, cs, cs_el * 4);
    float *frame = malloc(a.out_off + out_el * 4 + 8);
    for (size_t i = 0; i < (a.out_off + out_el * 4 + 8) / 4; i++) frame[i] = -333.0f;
    bput(be, bo, 0, frame, a.out_off + out_el * 4 + 8);
    a.src = bs;
    a.idx = bi;
    a.cs = bc;
    a.out = bo;
    assert_ok(be->iface->dev_gather_rope(be, &a));
    bget(be, bo, 0, frame, a.out_off + out_el * 4 + 8);
    for (size_t i = 0; i < a.out_off / 4; i++) assert_true(frame[i] == -333.0f);
    assert_true(frame[a.out_off / 4 + out_el] == -333.0f && frame[a.out_off / 4 + out_el + 1] == -333.0f);
    float *out = malloc(out_el * 4 + 4);
    memcpy(out, frame + a.out_off / 4, out_el * 4);
    free(frame);
    bfree(be, bs);
    bfree(be, bi);
    bfree(be, bc);
    bfree(be, bo);
    return out;
}

static void gather_case(kvmem_rope_style style, int32_t D, int32_t rot, double af, size_t n_src, size_t n_out, size_t H,
                        int64_t pos_base, size_t off, int bad_rows, uint64_t *rng) {
    kvmem_model_spec spec = tu_spec(1, D);
    spec.rotary_dim = rot;
    spec.rope_style = style;
    kvm_rope *r = malloc(sizeof *r);
    kvm_rope_init(r, &spec);
    if (rot == 0) r->n_pairs = 0; /* values: a plain gather */
    const size_t row = H * (size_t)D, np = (size_t)rot / 2, src_rs = row + 3;
    const size_t src_el = (n_src - 1) * src_rs + row, cs_el = 2 * n_out * np;
    float *src = malloc(src_el * 4), *cs = rot ? malloc(cs_el * 4) : NULL;
    uint32_t *idx = malloc(n_out * 4);
    for (size_t i = 0; i < src_el; i++) src[i] = tu_normal(rng);
    for (size_t i = 0; i < n_out; i++) idx[i] = (uint32_t)(tu_next(rng) % n_src);
    if (bad_rows) {
        idx[0] = (uint32_t)n_src; /* out of range: a zero row */
        idx[n_out - 1] = UINT32_MAX;
    }
    float c[KVM_ROPE_MAX_PAIRS], s[KVM_ROPE_MAX_PAIRS];
    for (size_t i = 0; i < n_out && rot; i++) {
        kvm_rope_cos_sin(r, (double)(pos_base + (int64_t)i), c, s);
        for (size_t j = 0; j < np; j++) {
            cs[i * np + j] = c[j];
            cs[n_out * np + i * np + j] = s[j];
        }
    }
    kvm_dev_gather_args a = {NULL, NULL, NULL, NULL, off, off + 4, off, off, n_src, src_rs, n_out, H, (size_t)D,
                             (size_t)rot, style == KVMEM_ROPE_GPTJ, (float)af, NULL, NULL, 0, 0, 0, KVMEM_F32};
    float *got = run_gather(g_be, &a, src, src_el, idx, cs, cs_el);
    float *cpu = run_gather(g_cpu, &a, src, src_el, idx, cs, cs_el);
    const size_t step = style == KVMEM_ROPE_NEOX ? 1 : 2, poff = style == KVMEM_ROPE_NEOX ? np : 1;
    for (size_t i = 0; i < n_out; i++)
        for (size_t h = 0; h < H; h++) {
            const float *g = got + i * row + h * (size_t)D, *cp = cpu + i * row + h * (size_t)D;
            if (idx[i] >= n_src) {
                for (size_t d = 0; d < (size_t)D; d++) assert_true(g[d] == 0.0f && cp[d] == 0.0f);
                continue;
            }
            const float *x = src + idx[i] * src_rs + h * (size_t)D;
            for (size_t d = (size_t)rot; d < (size_t)D; d++) assert_true(g[d] == x[d] && cp[d] == x[d]);
            for (size_t j = 0; j < np; j++) {
                size_t d0 = j * step, d1 = d0 + poff;
                double ang = (double)(pos_base + (int64_t)i) * r->inv_freq[j];
                double y0 = af * ((double)x[d0] * cos(ang) - (double)x[d1] * sin(ang));
                double y1 = af * ((double)x[d0] * sin(ang) + (double)x[d1] * cos(ang));
                double m = fabs((double)x[d0]) + fabs((double)x[d1]);
                double tc = ldexp(1, -21) * m * af + 1e-30, td = 1e-5 * m * af + 1e-30;
                if (fabs(g[d0] - cp[d0]) > tc || fabs(g[d1] - cp[d1]) > tc || fabs(g[d0] - y0) > td ||
                    fabs(g[d1] - y1) > td || fabs(cp[d0] - y0) > td || fabs(cp[d1] - y1) > td)
                    fail_msg("dev_gather_rope row %zu head %zu pair %zu: got (%.9g, %.9g), cpu (%.9g, %.9g), double "
                             "(%.9g, %.9g)",
                             i, h, j, (double)g[d0], (double)g[d1], (double)cp[d0], (double)cp[d1], y0, y1);
            }
        }
    free(r);
    free(src);
    free(cs);
    free(idx);
    free(got);
    free(cpu);
}

static void test_dev_gather_rope_matches_cpu_and_double(void **state) {
    (void)state;
    NEED_ENTRY(dev_gather_rope);
    uint64_t rng = 31;
    gather_case(KVMEM_ROPE_NEOX, 64, 64, 1.0, 50, 37, 2, 0, 0, 0, &rng);
    gather_case(KVMEM_ROPE_GPTJ, 64, 64, 1.0, 50, 37, 2, 5, 8, 1, &rng);
    gather_case(KVMEM_ROPE_NEOX, 128, 32, 1.0, 10, 20, 3, 100000, 4, 0, &rng); /* partial rotary, far positions */
    gather_case(KVMEM_ROPE_GPTJ, 32, 16, 1.25, 9, 5, 1, 4095, 0, 1, &rng);     /* YaRN-style attention factor */
    gather_case(KVMEM_ROPE_NEOX, 16, 0, 1.0, 9, 5, 4, 0, 12, 1, &rng);         /* values: plain gather, no cs */
    gather_case(KVMEM_ROPE_NEOX, 128, 128, 1.0, 300, 1000, 8, 7, 0, 0, &rng);  /* a long gather */
    gather_case(KVMEM_ROPE_GPTJ, 64, 64, 1.0, 6000, 5000, 2, 120000, 8, 0, &rng); /* thousands of rows, far */
}

static void test_dev_gather_rope_rejects_bad_input_and_changes_nothing(void **state) {
    (void)state;
    NEED_ENTRY(dev_gather_rope);
    float z[64], back[64], init[64];
    for (int i = 0; i < 64; i++) z[i] = (float)i, init[i] = -1.0f;
    kvmem_buffer *b = bnew(g_be, z, sizeof z), *bo = bnew(g_be, init, sizeof init);
    /* 1 source row of 8, one output row, rotary 8 */
    kvm_dev_gather_args a = {b, b, b, bo, 0, 0, 0, 0, 1, 8, 1, 1, 8, 8, 0, 1.0f, NULL, NULL, 0, 0, 0, KVMEM_F32}, g = a;
    assert_status(g_be->iface->dev_gather_rope(g_be, NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    a.n_out = 0;
    assert_status(g_be->iface->dev_gather_rope(g_be, &a), KVMEM_ERR_INVALID_ARG, "empty");
    a = g;
    a.rotary_dim = 7;
    assert_status(g_be->iface->dev_gather_rope(g_be, &a), KVMEM_ERR_INVALID_ARG, "even");
    a.rotary_dim = 10;
    assert_status(g_be->iface->dev_gather_rope(g_be, &a), KVMEM_ERR_INVALID_ARG, "head_dim");
    a = g;
    a.gptj = 2;
    assert_status(g_be->iface->dev_gather_rope(g_be, &a), KVMEM_ERR_INVALID_ARG, "gptj");
    a = g;
    a.attn_factor = 0;
    assert_status(g_be->iface->dev_gather_rope(g_be, &a), KVMEM_ERR_INVALID_ARG, "attn_factor");
    a.attn_factor = NAN;
    assert_status(g_be->iface->dev_gather_rope(g_be, &a), KVMEM_ERR_INVALID_ARG, "attn_factor");
    a = g;
    a.cs = NULL;
    assert_status(g_be->iface->dev_gather_rope(g_be, &a), KVMEM_ERR_INVALID_ARG, "NULL");
    a = g;
    a.out_off = 6;
    assert_status(g_be->iface->dev_gather_rope(g_be, &a), KVMEM_ERR_INVALID_ARG, "multiples of 4");
    a = g;
    a.n_out = 9;
    assert_status(g_be->iface->dev_gather_rope(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    a = g;
    a.src_rs = 4;
    assert_status(g_be->iface->dev_gather_rope(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    a = g;
    a.n_src = 9; /* 9 rows of 8: 72 floats */
    assert_status(g_be->iface->dev_gather_rope(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    a = g;
    a.n_heads = SIZE_MAX / 4;
    assert_status(g_be->iface->dev_gather_rope(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    bget(g_be, bo, 0, back, sizeof back);
    assert_memory_equal(back, init, sizeof init);
    a = g;
    a.rotary_dim = 0;
    a.cs = NULL; /* values: no cos/sin buffer needed */
    assert_ok(g_be->iface->dev_gather_rope(g_be, &a));
    bget(g_be, bo, 0, back, sizeof back);
    /* idx[0] holds the bits of 0.0f, row 0: a copy of z[0..8), the rest untouched */
    assert_memory_equal(back, z, 8 * sizeof(float));
    assert_true(back[8] == -1.0f);
    bfree(g_be, b);
    bfree(g_be, bo);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_dev_score_matches_reference),
    cmocka_unit_test(test_dev_score_ties_rank_by_index),
    cmocka_unit_test(test_dev_score_many_tokens_in_chunks),
    cmocka_unit_test(test_dev_score_many_blocks_and_tokens),
    cmocka_unit_test(test_dev_score_rejects_bad_input_and_changes_nothing),
    cmocka_unit_test(test_dev_score_exact_key_rows_match_reference),
    cmocka_unit_test(test_exact_retrieve_api_matches_cpu),
    cmocka_unit_test(test_dev_score_reduce_follows_the_contract_order_bit_for_bit),
    cmocka_unit_test(test_dev_score_reduce_rejects_bad_input_and_changes_nothing),
    cmocka_unit_test(test_dev_topk_matches_reference_exactly),
    cmocka_unit_test(test_dev_topk_edges),
    cmocka_unit_test(test_dev_topk_million),
    cmocka_unit_test(test_dev_topk_rejects_bad_input_and_changes_nothing),
    cmocka_unit_test(test_dev_gather_rope_matches_cpu_and_double),
    cmocka_unit_test(test_dev_gather_rope_rejects_bad_input_and_changes_nothing),
};
CONF_MAIN(tests)
