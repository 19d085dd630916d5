/* kvmem_attend on the layouts engines hand over: K and V as HF/PyTorch hold
 * them ([batch][n_kv_heads][seq][head_dim], head-major: a head's rows
 * adjacent, viewed through strides as [T][n_kv_heads][head_dim]), a batch
 * row of a longer static cache, and rows with a non-unit element stride,
 * in f32, f16 and bf16, with GQA, prefill rows, slot maps, masks and a
 * history of thousands of positions (long enough that the attention
 * prefetches). Every result equals a double-precision reference on the
 * contiguous f32 values (plain loops, attend_ref.h); with the stop rule on,
 * head-major and contiguous give the same output and the same tiles.
 * Values lie on a 1/64 grid in [-4, 4]: exact in f16 and bf16. */
#include "testutil.h"
#include "attend_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TOL 2e-5

enum { LAYOUT_CONTIG, LAYOUT_HEAD_MAJOR, LAYOUT_HF_BATCH, LAYOUT_STRIDED, N_LAYOUTS };
static const char *const layout_name[N_LAYOUTS] = {"contiguous", "head-major", "HF batch row", "element stride 2"};

/* A [T][H][D] view of x (contiguous f32) in `layout` and dtype dt; the
 * buffer it owns is returned in *buf. */
static kvmem_tensor make_view(const float *x, int64_t T, int H, int D, int layout, kvmem_dtype dt, void **buf) {
    const size_t es = dt == KVMEM_F32 ? 4 : 2;
    const int64_t Tal = T + 37, B = 2; /* HF: a static cache of Tal positions, batch row 1 */
    size_t n = (size_t)T * (size_t)H * (size_t)D;
    if (layout == LAYOUT_HF_BATCH) n = (size_t)B * (size_t)H * (size_t)Tal * (size_t)D;
    if (layout == LAYOUT_STRIDED) n *= 2;
    unsigned char *b = calloc(n, es);
    assert_non_null(b);
    kvmem_tensor t;
    int64_t shape[3] = {T, H, D};
    assert_ok(kvmem_tensor_init(&t, b, dt, 3, shape));
    if (layout == LAYOUT_HEAD_MAJOR) t.strides[0] = D, t.strides[1] = T * D;
    if (layout == LAYOUT_HF_BATCH) {
        t.strides[0] = D, t.strides[1] = Tal * D;
        t.data = b + (size_t)H * (size_t)Tal * (size_t)D * es;
    }
    if (layout == LAYOUT_STRIDED) t.strides[0] *= 2, t.strides[1] *= 2, t.strides[2] = 2;
    for (int64_t j = 0; j < T; j++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) {
                const float f = x[((size_t)j * (size_t)H + (size_t)h) * (size_t)D + (size_t)d];
                unsigned char *at =
                    (unsigned char *)t.data + (size_t)(j * t.strides[0] + h * t.strides[1] + d * t.strides[2]) * es;
                if (dt == KVMEM_F32) {
                    memcpy(at, &f, 4);
                } else if (dt == KVMEM_F16) {
                    uint16_t u = ref_f16_exact(f);
                    memcpy(at, &u, 2);
                } else {
                    uint32_t u;
                    memcpy(&u, &f, 4);
                    uint16_t hb = (uint16_t)(u >> 16); /* exact: 8 significant bits */
                    memcpy(at, &hb, 2);
                }
            }
    *buf = b;
    return t;
}

static float grid(uint64_t *rng) { return roundf(fmaxf(-4.f, fminf(4.f, tu_normal(rng))) * 64.f) / 64.f; }

typedef struct causal_ctx {
    int64_t T;
    int R;
    const uint8_t *mask;
} causal_ctx;

static int causal_vis(void *u, int r, int64_t j) {
    const causal_ctx *c = u;
    return j <= c->T - c->R + r && (!c->mask || c->mask[j]);
}

/* Every layout and dtype, every order (the rule off, and on but never
 * firing), one and two threads, decode and causal prefill rows. */
static void head_major_equals_reference_in_every_order(void **state) {
    (void)state;
    const int Hq = 8, H = 2, Ds[2] = {64, 40}; /* 40: the SIMD dimension tails */
    const int64_t T = 300;
    for (int di = 0; di < 2; di++)
        for (int R = 1; R <= 3; R += 2) {
            const int D = Ds[di];
            uint64_t rng = 40 + (uint64_t)(di * 4 + R);
            float *q = malloc(sizeof(float) * (size_t)(R * Hq * D)), *k = malloc(sizeof(float) * (size_t)(T * H * D));
            float *v = malloc(sizeof(float) * (size_t)(T * H * D)), *out = malloc(sizeof(float) * (size_t)(R * Hq * D));
            double *ref = malloc(sizeof(double) * (size_t)(R * Hq * D));
            for (int i = 0; i < R * Hq * D; i++) q[i] = tu_normal(&rng);
            for (int64_t i = 0; i < T * H * D; i++) k[i] = grid(&rng), v[i] = grid(&rng);
            causal_ctx cc = {T, R, NULL};
            ref_attend(q, R, Hq, H, D, k, v, T, NULL, 1.0 / sqrt(D), causal_vis, &cc, ref);
            kvmem_tensor tq, to;
            int64_t qs[3] = {R, Hq, D};
            assert_ok(kvmem_tensor_init(&tq, q, KVMEM_F32, 3, qs));
            assert_ok(kvmem_tensor_init(&to, out, KVMEM_F32, 3, qs));
            const kvmem_dtype dts[3] = {KVMEM_F32, KVMEM_F16, KVMEM_BF16};
            for (int threads = 1; threads <= 2; threads++) {
                kvmem_context *ctx = tu_context(threads);
                for (int layout = 0; layout < N_LAYOUTS; layout++)
                    for (int x = 0; x < 3; x++) {
                        void *kb, *vb;
                        kvmem_tensor tk = make_view(k, T, H, D, layout, dts[x], &kb);
                        kvmem_tensor tv = make_view(v, T, H, D, layout, dts[(x + 1) % 3], &vb); /* K and V dtypes differ */
                        kvmem_attend_source src;
                        memset(&src, 0, sizeof src);
                        src.kind = KVMEM_ATTEND_SRC_TENSORS;
                        src.k = &tk;
                        src.v = &tv;
                        for (int o = 0; o < 4; o++) {
                            kvmem_attend_params ap = kvmem_attend_default_params();
                            ap.tau_s = ap.tau_d = o == 3 ? 1e-30f : 0.0f; /* 3: SCORED, its rule on, never firing */
                            if (o == 3) ap.patience = 1;
                            ap.order = o == 0 ? KVMEM_ATTEND_RECENT : o == 2 ? KVMEM_ATTEND_INDEX : KVMEM_ATTEND_SCORED;
                            int32_t perm[19];
                            if (o == 2) { /* every tile, odd ones first */
                                int n = 0;
                                for (int t = 1; t < 19; t += 2) perm[n++] = t;
                                for (int t = 0; t < 19; t += 2) perm[n++] = t;
                                ap.tile_order = perm, ap.n_tile_order = 19;
                            }
                            kvmem_attend_stats st;
                            memset(out, 0xff, sizeof(float) * (size_t)(R * Hq * D));
                            assert_ok(kvmem_attend(ctx, &tq, &src, &ap, &to, &st));
                            const double e = ref_max_err(out, ref, (size_t)(R * Hq * D));
                            if (!(e <= TOL))
                                fail_msg("%s K %d V %d, order %d, D %d, R %d, %d threads: max error %g", layout_name[layout],
                                         (int)dts[x], (int)dts[(x + 1) % 3], o, D, R, threads, e);
                            assert_int_equal(st.tiles_visited, st.tiles_total);
                        }
                        free(kb), free(vb);
                    }
                kvmem_context_free(ctx);
            }
            free(q), free(k), free(v), free(out), free(ref);
        }
}

/* Llama-8B heads (32 query, 8 KV, head_dim 128), 2600 positions in f16 (10
 * MiB of KV: the attention prefetches the next tile) and f32, decode. */
static void long_head_major_history_equals_reference(void **state) {
    (void)state;
    const int Hq = 32, H = 8, D = 128;
    const int64_t T = 2600;
    uint64_t rng = 9;
    float *q = malloc(sizeof(float) * (size_t)(Hq * D)), *k = malloc(sizeof(float) * (size_t)(T * H * D));
    float *v = malloc(sizeof(float) * (size_t)(T * H * D)), *out = malloc(sizeof(float) * (size_t)(Hq * D));
    double *ref = malloc(sizeof(double) * (size_t)(Hq * D));
    for (int i = 0; i < Hq * D; i++) q[i] = 0.3f * tu_normal(&rng);
    for (int64_t i = 0; i < T * H * D; i++) k[i] = grid(&rng), v[i] = grid(&rng);
    ref_attend(q, 1, Hq, H, D, k, v, T, NULL, 1.0 / sqrt(D), ref_all_visible, NULL, ref);
    kvmem_tensor tq, to;
    int64_t qs[3] = {1, Hq, D};
    assert_ok(kvmem_tensor_init(&tq, q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&to, out, KVMEM_F32, 3, qs));
    kvmem_context *ctx = tu_context(2);
    for (int layout = LAYOUT_CONTIG; layout <= LAYOUT_HF_BATCH; layout++)
        for (int x = 0; x < 2; x++) {
            const kvmem_dtype dt = x ? KVMEM_F32 : KVMEM_F16;
            void *kb, *vb;
            kvmem_tensor tk = make_view(k, T, H, D, layout, dt, &kb), tv = make_view(v, T, H, D, layout, dt, &vb);
            kvmem_attend_source src;
            memset(&src, 0, sizeof src);
            src.kind = KVMEM_ATTEND_SRC_TENSORS;
            src.k = &tk;
            src.v = &tv;
            for (int o = 0; o < 2; o++) {
                kvmem_attend_params ap = kvmem_attend_default_params();
                ap.tau_s = ap.tau_d = 0;
                ap.order = o ? KVMEM_ATTEND_SCORED : KVMEM_ATTEND_RECENT;
                assert_ok(kvmem_attend(ctx, &tq, &src, &ap, &to, NULL));
                const double e = ref_max_err(out, ref, (size_t)(Hq * D));
                if (!(e <= TOL)) fail_msg("%s %s, order %d: max error %g", layout_name[layout], x ? "f32" : "f16", o, e);
            }
            free(kb), free(vb);
        }
    kvmem_context_free(ctx);
    free(q), free(k), free(v), free(out), free(ref);
}

/* With the stop rule on (the defaults, and RECENT), head-major K/V give the
 * same output and the same tiles as the contiguous layout: a stream's work
 * does not depend on where its rows lie. */
static void stop_rule_sees_the_same_tiles_in_every_layout(void **state) {
    (void)state;
    const int Hq = 8, H = 2, D = 64;
    const int64_t T = 1500;
    uint64_t rng = 17;
    float *q = malloc(sizeof(float) * (size_t)(Hq * D)), *k = malloc(sizeof(float) * (size_t)(T * H * D));
    float *v = malloc(sizeof(float) * (size_t)(T * H * D));
    float *o0 = malloc(sizeof(float) * (size_t)(Hq * D)), *o1 = malloc(sizeof(float) * (size_t)(Hq * D));
    for (int i = 0; i < Hq * D; i++) q[i] = i % (4 * D) < D ? tu_normal(&rng) : q[i - D] + 0.1f * tu_normal(&rng);
    /* a group's query heads alike; attention concentrated on recent keys (so
     * the rule can stop) plus one far token */
    for (int64_t j = 0; j < T; j++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) {
                const float boost = j == 100 || j > T - 40 ? 1.5f : 0.0f; /* logit ~12 */
                k[((size_t)j * H + (size_t)h) * D + (size_t)d] =
                    roundf((0.2f * tu_normal(&rng) + boost * q[(h * 4) * D + d]) * 64.f) / 64.f;
                v[((size_t)j * H + (size_t)h) * D + (size_t)d] = grid(&rng);
            }
    kvmem_tensor tq, to0, to1;
    int64_t qs[3] = {1, Hq, D};
    assert_ok(kvmem_tensor_init(&tq, q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&to0, o0, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&to1, o1, KVMEM_F32, 3, qs));
    kvmem_context *ctx = tu_context(2);
    int stopped = 0;
    for (int x = 0; x < 2; x++) {
        const kvmem_dtype dt = x ? KVMEM_BF16 : KVMEM_F16;
        void *b[4];
        kvmem_tensor ck = make_view(k, T, H, D, LAYOUT_CONTIG, dt, &b[0]), cv = make_view(v, T, H, D, LAYOUT_CONTIG, dt, &b[1]);
        kvmem_tensor hk = make_view(k, T, H, D, LAYOUT_HF_BATCH, dt, &b[2]), hv = make_view(v, T, H, D, LAYOUT_HEAD_MAJOR, dt, &b[3]);
        kvmem_attend_source s0, s1;
        memset(&s0, 0, sizeof s0);
        s0.kind = KVMEM_ATTEND_SRC_TENSORS;
        s1 = s0;
        s0.k = &ck, s0.v = &cv;
        s1.k = &hk, s1.v = &hv;
        for (int o = 0; o < 2; o++) {
            kvmem_attend_params ap = kvmem_attend_default_params();
            if (o) ap.order = KVMEM_ATTEND_RECENT;
            kvmem_attend_stats st0, st1;
            assert_ok(kvmem_attend(ctx, &tq, &s0, &ap, &to0, &st0));
            assert_ok(kvmem_attend(ctx, &tq, &s1, &ap, &to1, &st1));
            assert_memory_equal(o0, o1, sizeof(float) * (size_t)(Hq * D));
            assert_int_equal(st0.tiles_visited, st1.tiles_visited);
            assert_int_equal(st0.streams_stopped, st1.streams_stopped);
            assert_int_equal(st0.positions_read, st1.positions_read);
            stopped += st0.stopped_early;
        }
        for (int i = 0; i < 4; i++) free(b[i]);
    }
    assert_true(stopped > 0); /* the rule did fire somewhere: the tiles compared were a choice */
    kvmem_context_free(ctx);
    free(q), free(k), free(v), free(o0), free(o1);
}

/* Slot maps over head-major slot storage, with dead slots and a mask that
 * skip positions whose rows hold NaN (the prefetch skips them too). */
static void slot_map_over_head_major_storage(void **state) {
    (void)state;
    const int Hq = 4, H = 2, D = 64, n_slots = 2400; /* over 1 MiB of K/V: the attention prefetches */
    const int64_t T = 2000;
    uint64_t rng = 23;
    float *q = malloc(sizeof(float) * (size_t)(2 * Hq * D)), *ks = malloc(sizeof(float) * (size_t)(n_slots * H * D));
    float *vs = malloc(sizeof(float) * (size_t)(n_slots * H * D)), *out = malloc(sizeof(float) * (size_t)(2 * Hq * D));
    double *ref = malloc(sizeof(double) * (size_t)(2 * Hq * D));
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)T);
    uint8_t *mask = malloc((size_t)T);
    for (int i = 0; i < 2 * Hq * D; i++) q[i] = tu_normal(&rng);
    for (int64_t i = 0; i < (int64_t)n_slots * H * D; i++) ks[i] = grid(&rng), vs[i] = grid(&rng);
    for (int64_t j = 0; j < T; j++) {
        slots[j] = (int32_t)((j * 7 + 1) % n_slots); /* distinct slots: 7 is prime to n_slots */
        mask[j] = j % 11 != 5;
        if (j % 13 == 4) slots[j] = -1; /* dead */
    }
    for (int64_t j = 0; j < T; j++) /* what is skipped holds NaN: reading it would show */
        if (slots[j] >= 0 && !mask[j])
            for (int d = 0; d < H * D; d++) ks[(size_t)slots[j] * H * D + (size_t)d] = NAN;
    /* the reference: live positions only (dead or masked are invisible) */
    int32_t *ref_slots = malloc(sizeof(int32_t) * (size_t)T);
    uint8_t *live = malloc((size_t)T);
    for (int64_t j = 0; j < T; j++) live[j] = slots[j] >= 0 && mask[j], ref_slots[j] = slots[j] >= 0 ? slots[j] : 0;
    causal_ctx cc = {T, 2, live};
    ref_attend(q, 2, Hq, H, D, ks, vs, T, ref_slots, 1.0 / sqrt(D), causal_vis, &cc, ref);
    kvmem_tensor tq, to;
    int64_t qs[3] = {2, Hq, D};
    assert_ok(kvmem_tensor_init(&tq, q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&to, out, KVMEM_F32, 3, qs));
    kvmem_context *ctx = tu_context(2);
    for (int x = 0; x < 3; x++) {
        const kvmem_dtype dt = x == 0 ? KVMEM_F32 : x == 1 ? KVMEM_F16 : KVMEM_BF16;
        void *kb, *vb;
        kvmem_tensor tk = make_view(ks, n_slots, H, D, LAYOUT_HEAD_MAJOR, dt, &kb);
        kvmem_tensor tv = make_view(vs, n_slots, H, D, LAYOUT_HF_BATCH, dt, &vb);
        kvmem_attend_source src;
        memset(&src, 0, sizeof src);
        src.kind = KVMEM_ATTEND_SRC_SLOTMAP;
        src.k = &tk, src.v = &tv;
        src.slots = slots, src.n_positions = T, src.dead_slot = -1, src.mask = mask;
        for (int o = 0; o < 2; o++) {
            kvmem_attend_params ap = kvmem_attend_default_params();
            ap.tau_s = ap.tau_d = 0;
            if (o) ap.order = KVMEM_ATTEND_RECENT;
            assert_ok(kvmem_attend(ctx, &tq, &src, &ap, &to, NULL));
            const double e = ref_max_err(out, ref, (size_t)(2 * Hq * D));
            if (!(e <= TOL)) fail_msg("slot map, dtype %d, order %d: max error %g", (int)dt, o, e);
        }
        free(kb), free(vb);
    }
    kvmem_context_free(ctx);
    free(q), free(ks), free(vs), free(out), free(ref), free(slots), free(mask), free(ref_slots), free(live);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(head_major_equals_reference_in_every_order),
        cmocka_unit_test(long_head_major_history_equals_reference),
        cmocka_unit_test(stop_rule_sees_the_same_tiles_in_every_layout),
        cmocka_unit_test(slot_map_over_head_major_storage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
