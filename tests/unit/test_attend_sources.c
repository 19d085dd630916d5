/* Every KV source of kvmem_attend: an agent's blocks (keys rotated on the
 * fly, tail included) equal rotating the agent's keys in the test; slot maps
 * and masks skip dead and masked positions, whose poisoned K/V (NaN, huge,
 * the IntentKV -1e4 sentinel) never reach the output. */
#include "testutil.h"
#include "attend_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* NEOX RoPE in double: pairs (i, i + D/2), angle pos * theta^(-2i/D). */
static void rope_neox(float *x, int D, double pos, double theta) {
    for (int i = 0; i < D / 2; i++) {
        double a = pos * pow(theta, -2.0 * i / D), c = cos(a), s = sin(a);
        double x0 = x[i], x1 = x[i + D / 2];
        x[i] = (float)(x0 * c - x1 * s);
        x[i + D / 2] = (float)(x0 * s + x1 * c);
    }
}

typedef struct vis_ctx {
    const uint8_t *mask;
    int64_t T;
    int R, causal;
} vis_ctx;

static int vis(void *u, int r, int64_t j) {
    const vis_ctx *c = u;
    if (c->mask && !c->mask[j]) return 0;
    return !c->causal || j <= c->T - c->R + r;
}

static void agent_source_equals_rotating_its_keys_yourself(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    kvmem_model_spec spec = tu_spec(2, 32); /* 4 q heads, 2 kv heads */
    const int L = 2, H = 2, Hq = 4, D = 32, T = 70, R = 3;
    const kvmem_dtype dts[2] = {KVMEM_F32, KVMEM_F16};
    for (int di = 0; di < 2; di++) {
        kvmem_pool_params pp = kvmem_pool_default_params();
        pp.storage_dtype = dts[di];
        kvmem_pool *pool = NULL;
        assert_ok(kvmem_pool_create(ctx, &spec, &pp, &pool));
        kvmem_agent *ag = NULL;
        assert_ok(kvmem_agent_open(pool, "a1", &ag));
        size_t n = (size_t)L * T * H * D;
        float *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
        uint64_t rng = 42 + (uint64_t)di;
        tu_fill_kv(k, n, &rng);
        tu_fill_kv(v, n, &rng);
        int64_t sh[4] = {L, T, H, D};
        kvmem_tensor tk, tv;
        assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, sh));
        assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, sh));
        assert_ok(kvmem_agent_append(ag, &tk, &tv, NULL)); /* 4 sealed blocks of 16 + a tail of 6 */
        /* what the agent stores, read back through the public API */
        float *rk = malloc(n * sizeof(float)), *rv = malloc(n * sizeof(float));
        assert_ok(kvmem_tensor_init(&tk, rk, KVMEM_F32, 4, sh));
        assert_ok(kvmem_tensor_init(&tv, rv, KVMEM_F32, 4, sh));
        assert_ok(kvmem_agent_read(ag, 0, T, &tk, &tv));
        const int layer = 1;
        float *lk = malloc((size_t)T * H * D * sizeof(float));
        float q[3 * 4 * 32], out[3 * 4 * 32];
        double ref[3 * 4 * 32];
        for (int i = 0; i < R * Hq * D; i++) q[i] = tu_normal(&rng);
        int64_t qs[3] = {R, Hq, D};
        kvmem_tensor tq, to;
        assert_ok(kvmem_tensor_init(&tq, q, KVMEM_F32, 3, qs));
        assert_ok(kvmem_tensor_init(&to, out, KVMEM_F32, 3, qs));
        int32_t *positions = malloc((size_t)T * sizeof(int32_t));
        for (int t = 0; t < T; t++) positions[t] = 3 * t + 7 - (t % 5 == 0 ? 2 : 0); /* jumps */
        uint8_t mask[70];
        for (int t = 0; t < T; t++) mask[t] = (uint8_t)(t % 7 != 3);
        for (int variant = 0; variant < 5; variant++) {
            /* 0: default positions; 1: base offset; 2: positions array (0-2 in the default
             * order, SCORED); 3: mask + index order; 4: positions array, RECENT order */
            const int64_t base = variant == 1 ? 1000 : 0;
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++) {
                    float *x = lk + ((size_t)t * H + h) * D;
                    memcpy(x, rk + (((size_t)layer * T + t) * H + h) * D, D * sizeof(float));
                    rope_neox(x, D, variant == 2 || variant == 4 ? positions[t] : (double)(t + base), spec.rope_theta);
                }
            vis_ctx vc = {variant == 3 ? mask : NULL, T, R, 1};
            ref_attend(q, R, Hq, H, D, lk, rv + (size_t)layer * T * H * D, T, NULL, 1.0 / sqrt(D), vis, &vc, ref);
            kvmem_attend_source src;
            memset(&src, 0, sizeof src);
            src.kind = KVMEM_ATTEND_SRC_AGENT;
            src.agent = ag;
            src.layer = layer;
            src.base_position = base;
            src.positions = variant == 2 || variant == 4 ? positions : NULL;
            src.mask = variant == 3 ? mask : NULL;
            kvmem_attend_params ap = kvmem_attend_default_params();
            ap.tau_s = ap.tau_d = 0;
            int32_t order[5] = {2, 4, 0, 3, 1};
            if (variant == 3) {
                ap.order = KVMEM_ATTEND_INDEX;
                ap.tile_order = order;
                ap.n_tile_order = 5;
            }
            if (variant == 4) ap.order = KVMEM_ATTEND_RECENT;
            kvmem_attend_stats st;
            assert_ok(kvmem_attend(ctx, &tq, &src, &ap, &to, &st));
            assert_int_equal(st.n_streams, R * H);
            double e = ref_max_err(out, ref, (size_t)(R * Hq * D));
            if (!(e <= 5e-5)) fail_msg("dtype %d variant %d: error %g", (int)dts[di], variant, e);
        }
        free(positions), free(lk), free(rk), free(rv), free(k), free(v);
        kvmem_agent_close(ag);
        kvmem_pool_free(pool);
    }
    kvmem_context_free(ctx);
}

/* Physical K/V with poisoned rows: the dead slot holds the IntentKV
 * sentinel (K = -1e4, whose logit is hugely positive for a query with a
 * negative sum) and NaN values; masked positions map to NaN / 1e30 rows. */
static void poisoned_dead_and_masked_slots_never_reach_the_output(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    const int Hq = 4, H = 2, D = 32, n_slots = 50, T = 90;
    const int dead = 49, nan_slot = 48, huge_slot = 47;
    float *k = malloc(sizeof(float) * n_slots * H * D), *v = malloc(sizeof(float) * n_slots * H * D);
    uint64_t rng = 8;
    tu_fill_kv(k, (size_t)n_slots * H * D, &rng);
    tu_fill_kv(v, (size_t)n_slots * H * D, &rng);
    for (int h = 0; h < H; h++)
        for (int d = 0; d < D; d++) {
            k[((size_t)dead * H + h) * D + d] = -1e4f;
            v[((size_t)dead * H + h) * D + d] = NAN;
            k[((size_t)nan_slot * H + h) * D + d] = NAN;
            v[((size_t)nan_slot * H + h) * D + d] = NAN;
            k[((size_t)huge_slot * H + h) * D + d] = 1e30f;
            v[((size_t)huge_slot * H + h) * D + d] = -1e30f;
        }
    float q[4 * 32], out[4 * 32];
    for (int i = 0; i < Hq * D; i++) q[i] = -fabsf(tu_normal(&rng)); /* sum < 0: the sentinel trap */
    int32_t slots[90];
    uint8_t mask[90];
    for (int t = 0; t < T; t++) {
        slots[t] = (int32_t)(tu_next(&rng) % 47); /* live rows, some shared (aliases) */
        mask[t] = 1;
        if (t % 5 == 1) slots[t] = dead;
        if (t % 11 == 2) slots[t] = nan_slot, mask[t] = 0;
        if (t % 13 == 4) slots[t] = huge_slot, mask[t] = 0;
        if (t == 30) slots[t] = 100000, mask[t] = 0; /* out of range but masked: never looked at */
    }
    vis_ctx vc = {mask, T, 1, 0};
    int32_t ref_slots[90];
    for (int t = 0; t < T; t++) ref_slots[t] = slots[t] == dead ? 0 : slots[t];
    uint8_t live[90];
    for (int t = 0; t < T; t++) live[t] = mask[t] && slots[t] != dead;
    vc.mask = live;
    double ref[4 * 32];
    for (int t = 0; t < T; t++)
        if (!live[t]) ref_slots[t] = 0; /* the reference never looks at them either */
    ref_attend(q, 1, Hq, H, D, k, v, T, ref_slots, 1.0 / sqrt(D), vis, &vc, ref);
    int64_t ks[3] = {n_slots, H, D}, qs[3] = {1, Hq, D};
    kvmem_tensor tk, tv, tq, to;
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 3, ks));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 3, ks));
    assert_ok(kvmem_tensor_init(&tq, q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&to, out, KVMEM_F32, 3, qs));
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_SLOTMAP;
    src.k = &tk;
    src.v = &tv;
    src.slots = slots;
    src.n_positions = T;
    src.dead_slot = dead;
    src.mask = mask;
    int64_t n_live = 0;
    for (int t = 0; t < T; t++) n_live += live[t];
    for (int oi = 0; oi < 4; oi++) {
        kvmem_attend_params ap = kvmem_attend_default_params(); /* oi 0, 3: SCORED */
        ap.tau_s = ap.tau_d = 0;
        if (oi == 3) { /* the rule on, never firing: SCORED scans K, then reads V alone */
            ap.tau_s = ap.tau_d = 1e-30f;
            ap.patience = 1;
        }
        ap.tile_size = 8;
        int32_t order[12] = {11, 0, 5, 3, 9, 1, 7, 2, 10, 4, 8, 6};
        if (oi == 1) {
            ap.order = KVMEM_ATTEND_IMPORTANCE;
            ap.tile_order = order;
            ap.n_tile_order = 12;
        }
        if (oi == 2) ap.order = KVMEM_ATTEND_RECENT;
        kvmem_attend_stats st;
        assert_ok(kvmem_attend(ctx, &tq, &src, &ap, &to, &st));
        for (int i = 0; i < Hq * D; i++) assert_true(isfinite(out[i]));
        double e = ref_max_err(out, ref, (size_t)(Hq * D));
        if (!(e <= 2e-5)) fail_msg("slot map, order %d: error %g", oi, e);
        /* SCORED's scan: each live K row once, then each live V row, half a row each */
        assert_int_equal(st.positions_read, oi == 3 ? 2 * ((n_live * H + 1) / 2) : n_live * H);
        assert_int_equal(st.stopped_early, 0);
    }
    /* with the stop rule on, poison still never shows */
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.tile_size = 4;
    ap.patience = 1;
    assert_ok(kvmem_attend(ctx, &tq, &src, &ap, &to, NULL));
    for (int i = 0; i < Hq * D; i++) assert_true(isfinite(out[i]));

    /* caller tensors with a mask: masked rows are NaN */
    float *k2 = malloc(sizeof(float) * T * H * D), *v2 = malloc(sizeof(float) * T * H * D);
    tu_fill_kv(k2, (size_t)T * H * D, &rng);
    tu_fill_kv(v2, (size_t)T * H * D, &rng);
    for (int t = 0; t < T; t++)
        if (!mask[t])
            for (int i = 0; i < H * D; i++) k2[(size_t)t * H * D + i] = NAN, v2[(size_t)t * H * D + i] = INFINITY;
    vis_ctx v3 = {mask, T, 1, 0};
    ref_attend(q, 1, Hq, H, D, k2, v2, T, NULL, 1.0 / sqrt(D), vis, &v3, ref);
    int64_t ts[3] = {T, H, D};
    assert_ok(kvmem_tensor_init(&tk, k2, KVMEM_F32, 3, ts));
    assert_ok(kvmem_tensor_init(&tv, v2, KVMEM_F32, 3, ts));
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &tk;
    src.v = &tv;
    src.mask = mask;
    ap = kvmem_attend_default_params();
    ap.tau_s = ap.tau_d = 0;
    ap.tile_size = 16;
    assert_ok(kvmem_attend(ctx, &tq, &src, &ap, &to, NULL));
    double e = ref_max_err(out, ref, (size_t)(Hq * D));
    if (!(e <= 2e-5)) fail_msg("masked tensors: error %g", e);
    free(k2), free(v2), free(k), free(v);
    kvmem_context_free(ctx);
}

/* A spec with a sliding window on one layer: that layer's rows see only the
 * last `window` positions up to themselves. */
static void agent_layer_window_limits_what_rows_see(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_model_spec spec = tu_spec(2, 16);
    int32_t window[2] = {0, 10};
    spec.layer_window = window;
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.storage_dtype = KVMEM_F32;
    kvmem_pool *pool = NULL;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &pool));
    kvmem_agent *ag = NULL;
    assert_ok(kvmem_agent_open(pool, "w", &ag));
    const int L = 2, H = 2, D = 16, T = 40, Hq = 4;
    size_t n = (size_t)L * T * H * D;
    float *k = malloc(n * 4), *v = malloc(n * 4);
    uint64_t rng = 5;
    tu_fill_kv(k, n, &rng);
    tu_fill_kv(v, n, &rng);
    int64_t sh[4] = {L, T, H, D};
    kvmem_tensor tk, tv;
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_append(ag, &tk, &tv, NULL));
    float q[4 * 16], out[4 * 16];
    for (int i = 0; i < Hq * D; i++) q[i] = tu_normal(&rng);
    int64_t qs[3] = {1, Hq, D};
    kvmem_tensor tq, to;
    assert_ok(kvmem_tensor_init(&tq, q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&to, out, KVMEM_F32, 3, qs));
    /* reference: layer 1's stored keys, rotated, only the last 10 positions */
    float *lk = malloc((size_t)T * H * D * 4), *lv = malloc((size_t)T * H * D * 4);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            memcpy(lk + ((size_t)t * H + h) * D, k + (((size_t)1 * T + t) * H + h) * D, D * 4);
            memcpy(lv + ((size_t)t * H + h) * D, v + (((size_t)1 * T + t) * H + h) * D, D * 4);
            rope_neox(lk + ((size_t)t * H + h) * D, D, t, spec.rope_theta);
        }
    uint8_t inwin[40];
    for (int t = 0; t < T; t++) inwin[t] = (uint8_t)(t >= T - 10);
    vis_ctx vc = {inwin, T, 1, 1};
    double ref[4 * 16];
    ref_attend(q, 1, Hq, H, D, lk, lv, T, NULL, 1.0 / sqrt(D), vis, &vc, ref);
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_AGENT;
    src.agent = ag;
    src.layer = 1;
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.tau_s = ap.tau_d = 0;
    kvmem_attend_stats st;
    assert_ok(kvmem_attend(ctx, &tq, &src, &ap, &to, &st));
    double e = ref_max_err(out, ref, (size_t)(Hq * D));
    if (!(e <= 5e-5)) fail_msg("window: error %g", e);
    assert_int_equal(st.positions_read, 10 * H);
    free(lk), free(lv), free(k), free(v);
    kvmem_agent_close(ag);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(agent_source_equals_rotating_its_keys_yourself),
        cmocka_unit_test(poisoned_dead_and_masked_slots_never_reach_the_output),
        cmocka_unit_test(agent_layer_window_limits_what_rows_see),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
