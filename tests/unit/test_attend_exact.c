/* ART attention with the stop rule off (tau_s = tau_d = 0) equals a
 * double-precision reference in every order and dtype; the full result does
 * not depend on the traversal order; causal prefill rows and the GQA
 * head mapping are right.
 * Tolerance: |o - ref| <= 2e-5 * max(1, |ref|) per element (float
 * accumulation over a few hundred positions of N(0,1) data). */
#include "testutil.h"
#include "attend_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TOL 2e-5

typedef struct problem {
    int R, Hq, H, D;
    int64_t T;
    float *q, *k, *v;
    double *ref;
} problem;

static void make_problem(problem *p, int R, int Hq, int H, int D, int64_t T, uint64_t seed) {
    uint64_t rng = seed;
    p->R = R, p->Hq = Hq, p->H = H, p->D = D, p->T = T;
    p->q = malloc(sizeof(float) * (size_t)(R * Hq * D));
    p->k = malloc(sizeof(float) * (size_t)T * (size_t)(H * D));
    p->v = malloc(sizeof(float) * (size_t)T * (size_t)(H * D));
    p->ref = malloc(sizeof(double) * (size_t)(R * Hq * D));
    assert_non_null(p->q), assert_non_null(p->k), assert_non_null(p->v), assert_non_null(p->ref);
    /* values on a 1/256 grid in [-4, 4]: exact in f16 and bf16 too */
    for (int i = 0; i < R * Hq * D; i++) p->q[i] = tu_normal(&rng);
    for (int64_t i = 0; i < T * H * D; i++) {
        p->k[i] = roundf(fmaxf(-4.f, fminf(4.f, tu_normal(&rng))) * 64.f) / 64.f;
        p->v[i] = roundf(fmaxf(-4.f, fminf(4.f, tu_normal(&rng))) * 64.f) / 64.f;
    }
}

static void free_problem(problem *p) {
    free(p->q), free(p->k), free(p->v), free(p->ref);
}

typedef struct causal_ctx {
    int64_t T;
    int R;
} causal_ctx;

static int causal_vis(void *u, int r, int64_t j) {
    const causal_ctx *c = u;
    return j <= c->T - c->R + r;
}

static void tensors(problem *p, kvmem_tensor *q, kvmem_tensor *k, kvmem_tensor *v, kvmem_tensor *o, float *out) {
    int64_t qs[3] = {p->R, p->Hq, p->D}, ks[3] = {p->T, p->H, p->D};
    assert_ok(kvmem_tensor_init(q, p->q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(k, p->k, KVMEM_F32, 3, ks));
    assert_ok(kvmem_tensor_init(v, p->v, KVMEM_F32, 3, ks));
    assert_ok(kvmem_tensor_init(o, out, KVMEM_F32, 3, qs));
}

/* Run kvmem_attend reading every tile (tau = 0, or with never_stop a rule
 * that runs but cannot fire: SCORED then scans K for its order) and compare
 * with the reference. */
static void run_full(kvmem_context *ctx, problem *p, kvmem_attend_params *ap, const char *what, int never_stop) {
    kvmem_tensor q, k, v, o;
    float *out = malloc(sizeof(float) * (size_t)(p->R * p->Hq * p->D));
    tensors(p, &q, &k, &v, &o, out);
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &k;
    src.v = &v;
    ap->tau_s = never_stop ? 1e-30f : 0.0f; /* consecutive outputs never agree that closely */
    ap->tau_d = ap->tau_s;
    if (never_stop) ap->patience = 1;
    kvmem_attend_stats st;
    assert_ok(kvmem_attend(ctx, &q, &src, ap, &o, &st));
    double e = ref_max_err(out, p->ref, (size_t)(p->R * p->Hq * p->D));
    if (!(e <= TOL)) fail_msg("%s: max error %g > %g", what, e, TOL);
    assert_int_equal(st.stopped_early, 0);
    assert_int_equal(st.tiles_visited, st.tiles_total);
    free(out);
}

static void run_exact(kvmem_context *ctx, problem *p, kvmem_attend_params *ap, const char *what) {
    run_full(ctx, p, ap, what, 0);
}

static void tau_zero_equals_reference_in_every_order(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    const int Ds[2] = {64, 40}; /* 40: exercises the SIMD dimension tails */
    for (int di = 0; di < 2; di++) {
        problem p;
        make_problem(&p, 1, 8, 2, Ds[di], 300, 11 + (uint64_t)di);
        ref_attend(p.q, 1, 8, 2, p.D, p.k, p.v, p.T, NULL, 1.0 / sqrt(p.D), ref_all_visible, NULL, p.ref);
        const int tiles[3] = {0, 7, 300};
        for (int ti = 0; ti < 3; ti++) {
            kvmem_attend_params ap = kvmem_attend_default_params();
            ap.tile_size = tiles[ti];
            int ts = tiles[ti] ? tiles[ti] : 16, nt = (int)((p.T + ts - 1) / ts); /* 0: tiles of 16 */
            ap.order = KVMEM_ATTEND_SCORED;
            run_exact(ctx, &p, &ap, "scored");
            run_full(ctx, &p, &ap, "scored, the rule on", 1);
            ap.order = KVMEM_ATTEND_RECENT;
            run_exact(ctx, &p, &ap, "recent");
            ap.n_sink = 100;
            run_exact(ctx, &p, &ap, "recent, 100 sink tokens");
            ap.n_sink = 0;
            run_exact(ctx, &p, &ap, "recent, no sink");
            int32_t *perm = malloc(sizeof(int32_t) * (size_t)nt);
            uint64_t rng = 5;
            for (int i = 0; i < nt; i++) perm[i] = i;
            for (int i = nt - 1; i > 0; i--) {
                int j = (int)(tu_next(&rng) % (uint64_t)(i + 1)), t = perm[i];
                perm[i] = perm[j], perm[j] = t;
            }
            ap.order = KVMEM_ATTEND_INDEX;
            ap.tile_order = perm;
            ap.n_tile_order = nt;
            run_exact(ctx, &p, &ap, "index, a random permutation");
            ap.order = KVMEM_ATTEND_IMPORTANCE;
            ap.n_tile_order = nt / 2; /* the rest newest to oldest */
            run_exact(ctx, &p, &ap, "importance, half listed");
            free(perm);
        }
        free_problem(&p);
    }
    kvmem_context_free(ctx);
}

static void full_result_is_invariant_to_order_and_dtype(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    problem p;
    make_problem(&p, 2, 4, 1, 32, 257, 3);
    const size_t n = (size_t)(2 * 4 * 32);
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    kvmem_tensor q, k, v, o;
    tensors(&p, &q, &k, &v, &o, a);
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &k;
    src.v = &v;
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.tau_s = ap.tau_d = 0;
    ap.tile_size = 16;
    ap.causal = 0;
    assert_ok(kvmem_attend(ctx, &q, &src, &ap, &o, NULL));
    /* oldest-first through INDEX (RECENT went newest-first), and f16 K/V */
    int32_t rev[17];
    for (int i = 0; i < 17; i++) rev[i] = i;
    ap.order = KVMEM_ATTEND_INDEX;
    ap.tile_order = rev;
    ap.n_tile_order = 17;
    uint16_t *kh = malloc(sizeof(uint16_t) * (size_t)(257 * 32)), *vh = malloc(sizeof(uint16_t) * (size_t)(257 * 32));
    for (int i = 0; i < 257 * 32; i++) kh[i] = ref_f16_exact(p.k[i]), vh[i] = ref_f16_exact(p.v[i]);
    kvmem_tensor k16 = k, v16 = v, o2 = o;
    k16.data = kh, k16.dtype = KVMEM_F16;
    v16.data = vh, v16.dtype = KVMEM_F16;
    o2.data = b;
    src.k = &k16;
    src.v = &v16;
    assert_ok(kvmem_attend(ctx, &q, &src, &ap, &o2, NULL));
    for (size_t i = 0; i < n; i++) assert_true(fabsf(a[i] - b[i]) <= 1e-5f * fmaxf(1.f, fabsf(a[i])));
    free(kh), free(vh), free(a), free(b);
    free_problem(&p);
    kvmem_context_free(ctx);
}

static void causal_prefill_rows_see_only_their_past(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    problem p;
    const int R = 37; /* not a multiple of anything; crosses tile edges */
    make_problem(&p, R, 4, 2, 32, 150, 9);
    causal_ctx cc = {p.T, R};
    ref_attend(p.q, R, 4, 2, 32, p.k, p.v, p.T, NULL, 1.0 / sqrt(32.0), causal_vis, &cc, p.ref);
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.tile_size = 16;
    run_exact(ctx, &p, &ap, "causal prefill, scored (the default)");
    run_full(ctx, &p, &ap, "causal prefill, scored, the rule on", 1);
    ap.order = KVMEM_ATTEND_RECENT;
    run_exact(ctx, &p, &ap, "causal prefill, recent");
    int32_t order[10] = {3, 9, 0, 5, 1, 8, 2, 7, 4, 6};
    ap.order = KVMEM_ATTEND_INDEX;
    ap.tile_order = order;
    ap.n_tile_order = 10;
    run_exact(ctx, &p, &ap, "causal prefill, index");
    /* non-causal: every row sees everything */
    ref_attend(p.q, R, 4, 2, 32, p.k, p.v, p.T, NULL, 1.0 / sqrt(32.0), ref_all_visible, NULL, p.ref);
    ap.causal = 0;
    run_exact(ctx, &p, &ap, "prefill, not causal");
    ap = kvmem_attend_default_params();
    ap.causal = 0;
    run_exact(ctx, &p, &ap, "prefill, not causal, scored");
    /* more rows than positions: the first rows see nothing and get zeros */
    problem s;
    make_problem(&s, 6, 4, 2, 32, 4, 10);
    causal_ctx c2 = {4, 6};
    ref_attend(s.q, 6, 4, 2, 32, s.k, s.v, 4, NULL, 1.0 / sqrt(32.0), causal_vis, &c2, s.ref);
    for (int i = 0; i < 2 * 4 * 32; i++) assert_true(s.ref[i] == 0.0);
    kvmem_attend_params a2 = kvmem_attend_default_params();
    run_exact(ctx, &s, &a2, "rows before the first position");
    free_problem(&s);
    free_problem(&p);
    kvmem_context_free(ctx);
}

/* A prefill chunk whose logits would outgrow what SCORED keeps (64 rows x
 * 8 heads x 8200 positions > 4 Mi floats): its attention reads K again
 * instead, (K, V) rows in full after the scan's K rows (half a row each). */
static void scored_without_room_for_logits_reads_k_again(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    problem p;
    const int R = 64;
    make_problem(&p, R, 8, 2, 8, 8200, 12);
    causal_ctx cc = {p.T, R};
    ref_attend(p.q, R, 8, 2, 8, p.k, p.v, p.T, NULL, 1.0 / sqrt(8.0), causal_vis, &cc, p.ref);
    kvmem_tensor q, k, v, o;
    float *out = malloc(sizeof(float) * (size_t)(R * 8 * 8));
    tensors(&p, &q, &k, &v, &o, out);
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &k;
    src.v = &v;
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.tau_s = ap.tau_d = 1e-30f; /* the rule runs, never fires */
    ap.patience = 1;
    kvmem_attend_stats st;
    assert_ok(kvmem_attend(ctx, &q, &src, &ap, &o, &st));
    double e = ref_max_err(out, p.ref, (size_t)(R * 8 * 8));
    if (!(e <= TOL)) fail_msg("max error %g > %g", e, TOL);
    assert_int_equal(st.stopped_early, 0);
    assert_int_equal(st.positions_read, p.T * 2 + (p.T * 2 + 1) / 2);
    free(out);
    free_problem(&p);
    kvmem_context_free(ctx);
}

/* Query head h reads KV head h / (Hq / H): with each KV head's values a
 * constant, every query head's output is its KV head's constant. */
static void gqa_maps_query_heads_to_kv_heads(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    const int Hq = 12, H = 3, D = 16, T = 50;
    problem p;
    make_problem(&p, 1, Hq, H, D, T, 4);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) p.v[((size_t)t * H + h) * D + d] = (float)(h + 1) * 10.f + (float)d;
    float out[12 * 16];
    kvmem_tensor q, k, v, o;
    tensors(&p, &q, &k, &v, &o, out);
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &k;
    src.v = &v;
    assert_ok(kvmem_attend(ctx, &q, &src, NULL, &o, NULL));
    for (int hq = 0; hq < Hq; hq++)
        for (int d = 0; d < D; d++)
            assert_float_equal(out[hq * D + d], (float)(hq / (Hq / H) + 1) * 10.f + (float)d, 1e-3);
    ref_attend(p.q, 1, Hq, H, D, p.k, p.v, T, NULL, 1.0 / sqrt(D), ref_all_visible, NULL, p.ref);
    kvmem_attend_params ap = kvmem_attend_default_params();
    run_exact(ctx, &p, &ap, "gqa 12/3");
    free_problem(&p);
    kvmem_context_free(ctx);
}

/* The caller's scale replaces 1/sqrt(head_dim); bf16 queries and outputs. */
static void scale_and_dtypes(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    problem p;
    make_problem(&p, 1, 2, 1, 8, 20, 21);
    ref_attend(p.q, 1, 2, 1, 8, p.k, p.v, p.T, NULL, 0.9, ref_all_visible, NULL, p.ref);
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.scale = 0.9f;
    run_exact(ctx, &p, &ap, "scale 0.9");
    /* f16 output: rounding to f16 bounds the error */
    uint16_t out16[16];
    kvmem_tensor q, k, v, o;
    float dummy[16];
    tensors(&p, &q, &k, &v, &o, dummy);
    o.data = out16;
    o.dtype = KVMEM_F16;
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &k;
    src.v = &v;
    assert_ok(kvmem_attend(ctx, &q, &src, &ap, &o, NULL));
    for (int i = 0; i < 16; i++) {
        uint16_t h = out16[i];
        int e = (h >> 10) & 31;
        float m = (float)(h & 1023), f = e ? ldexpf(1024.f + m, e - 25) : ldexpf(m, -24);
        if (h & 0x8000) f = -f;
        assert_true(fabs(f - p.ref[i]) <= 1e-3 * fmax(1.0, fabs(p.ref[i])));
    }
    free_problem(&p);
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tau_zero_equals_reference_in_every_order),
        cmocka_unit_test(full_result_is_invariant_to_order_and_dtype),
        cmocka_unit_test(causal_prefill_rows_see_only_their_past),
        cmocka_unit_test(scored_without_room_for_logits_reads_k_again),
        cmocka_unit_test(gqa_maps_query_heads_to_kv_heads),
        cmocka_unit_test(scale_and_dtypes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
