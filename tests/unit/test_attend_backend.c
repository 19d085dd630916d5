/* kvmem_attend on a device backend ("vulkan": lavapipe here, any GPU
 * elsewhere) against the same call on the CPU backend: plans the device
 * kernel covers (one row, TENSORS or SLOTMAP, no mask, STRIDED probe, one
 * order for every KV head: not SCORED, the default) run
 * through dev_attend -- counted by wrapping the backend's entry -- and give
 * the CPU's stats exactly and its outputs within the attention bound
 * below; other plans, and shapes the device refuses as unsupported, run on
 * the CPU and give identical bytes. Skipped, with the reason, where Vulkan
 * cannot run.
 *
 * Output tolerance per query head (as tests/backend/test_backend_attend.c):
 * u = 2^-24, A = scale * max_j sum_d |q_d k_jd|, n positions, Vm = max |v|:
 *   2 * (2 e_w + 2 (n + 8) u) Vm, e_w = 4 D u A + (3 + 4 A) 2u
 * (f32 logits, exp within 3 + 2|x| ulp, f32 sums; doubled: both sides err).
 *
 * Stop decisions are compared on inputs built so that no verdict is near a
 * threshold: KV head 0 has one constant V row everywhere (its output is that
 * row after every tile: both metrics are rounding noise, ~1e-6, against
 * tau_s = 1e-3 and tau_d = 1e-4, so it stops after exactly patience + 1 live
 * tiles), KV head 1 has V = +-(t + 1) w by the parity of tile t with
 * near-uniform weights (its output swings in sign and size every tile: the
 * metrics are O(1), so it never stops). Those counts are hand-derived here. */
#include "testutil.h"
#include "attend_ref.h"
#include "backend/backend.h"
#include "backend/route/context.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvmem_context *g_cpu_ctx, *g_dev_ctx;
static char g_why[512];
static kvmem_backend_iface g_iface;
static const kvmem_backend_iface *g_orig;
static int g_calls;

static kvmem_status counting_dev_attend(kvmem_backend *be, const kvm_dev_attend_args *a) {
    g_calls++;
    return g_orig->dev_attend(be, a);
}

static int setup(void **state) {
    (void)state;
    g_cpu_ctx = tu_context(2);
    kvmem_context_params p = kvmem_context_default_params();
    p.backend = "vulkan";
    p.n_threads = 2;
    if (kvmem_context_create(&p, &g_dev_ctx) != KVMEM_OK) {
        snprintf(g_why, sizeof g_why, "vulkan: %s", kvmem_last_error());
        g_dev_ctx = NULL;
        return 0;
    }
    if (!g_dev_ctx->backend->iface->dev_attend) {
        snprintf(g_why, sizeof g_why, "vulkan backend has no dev_attend entry");
        return 0;
    }
    /* count the calls that reach the device kernel */
    g_orig = g_dev_ctx->backend->iface;
    g_iface = *g_orig;
    g_iface.dev_attend = counting_dev_attend;
    g_dev_ctx->backend->iface = &g_iface;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    if (g_dev_ctx && g_orig) g_dev_ctx->backend->iface = g_orig;
    kvmem_context_free(g_dev_ctx);
    kvmem_context_free(g_cpu_ctx);
    return 0;
}

#define NEED_DEVICE()                                  \
    do {                                               \
        if (!g_dev_ctx || !g_orig) {                   \
            TU_SKIP("%s", g_why);     \
        }                                              \
    } while (0)

/* Run the same call on both contexts; outputs f32 [R][Hq][D]. */
static void run_both(const kvmem_tensor *q, const kvmem_attend_source *src, const kvmem_attend_params *pr,
                     float *o_dev, float *o_cpu, kvmem_attend_stats *s_dev, kvmem_attend_stats *s_cpu) {
    kvmem_tensor od, oc;
    assert_ok(kvmem_tensor_init(&od, o_dev, KVMEM_F32, 3, q->shape));
    assert_ok(kvmem_tensor_init(&oc, o_cpu, KVMEM_F32, 3, q->shape));
    assert_ok(kvmem_attend(g_dev_ctx, q, src, pr, &od, s_dev));
    assert_ok(kvmem_attend(g_cpu_ctx, q, src, pr, &oc, s_cpu));
}

static void assert_stats_equal(const kvmem_attend_stats *a, const kvmem_attend_stats *b) {
    assert_int_equal(a->n_streams, b->n_streams);
    assert_int_equal(a->tiles_total, b->tiles_total);
    assert_int_equal(a->tiles_visited, b->tiles_visited);
    assert_int_equal(a->streams_stopped, b->streams_stopped);
    /* exact on the CPU too: one KV head per worker (2 heads, 2 threads) */
    assert_int_equal(a->positions_read, b->positions_read);
    assert_int_equal(a->stopped_early, b->stopped_early);
    assert_int_equal(a->oracle_tiles, b->oracle_tiles);
    assert_int_equal(a->oracle_agree, b->oracle_agree);
}

/* The tolerance above for query head hq over positions [0, T) of f32 K/V
 * rows [T][H][D] (slot-mapped through slot when not NULL; < 0 skipped). */
static double tol_head(const float *q, int hq, int G, int H, int D, const float *k, const float *v, int64_t T,
                       const int32_t *slot, double scale) {
    const double u = ldexp(1.0, -24);
    double A = 0, vm = 0;
    const int h = hq / G;
    for (int64_t j = 0; j < T; j++) {
        const int64_t row = slot ? slot[j] : j;
        if (row < 0) continue;
        const float *kr = k + ((size_t)row * H + h) * D, *vr = v + ((size_t)row * H + h) * D;
        double sa = 0;
        for (int d = 0; d < D; d++) {
            sa += fabs((double)q[(size_t)hq * D + d] * kr[d]);
            vm = fmax(vm, fabs(vr[d]));
        }
        A = fmax(A, sa * scale);
    }
    const double ew = 4.0 * D * u * A + (3.0 + 4.0 * A) * 2.0 * u;
    return 2.0 * (2.0 * ew + 2.0 * ((double)T + 8.0) * u) * vm + 1e-30;
}

/* ---- TENSORS: every dtype and layout, full attention ---- */

static void test_tensors_match_cpu_and_reference(void **state) {
    (void)state;
    NEED_DEVICE();
    const int H = 2, G = 4, D = 64, Hq = H * G, T = 300, PAD = 8;
    uint64_t rng = 3;
    const kvmem_dtype dts[] = {KVMEM_F32, KVMEM_F16, KVMEM_BF16};
    float *q = malloc((size_t)Hq * D * 4), *kf = malloc((size_t)T * H * (D + PAD) * 4),
          *vf = malloc((size_t)T * H * (D + PAD) * 4);
    float *od = malloc((size_t)Hq * D * 4), *oc = malloc((size_t)Hq * D * 4);
    double *ref = malloc((size_t)Hq * D * sizeof(double));
    uint16_t *k16 = malloc((size_t)T * H * (D + PAD) * 2), *v16 = malloc((size_t)T * H * (D + PAD) * 2);
    for (int i = 0; i < Hq * D; i++) q[i] = tu_normal(&rng);
    for (size_t i = 0; i < (size_t)T * H * (D + PAD); i++) {
        /* values exact in f16 and bf16 (8 significant bits, small range), so
         * every dtype holds the same K/V */
        kf[i] = roundf(fmaxf(-7.9f, fminf(7.9f, tu_normal(&rng))) * 16.0f) / 16.0f;
        vf[i] = roundf(fmaxf(-7.9f, fminf(7.9f, tu_normal(&rng))) * 16.0f) / 16.0f;
    }
    for (int di = 0; di < 3; di++)
        for (int strided = 0; strided < 2; strided++) {
            const kvmem_dtype dt = dts[di];
            const int64_t rs = strided ? D + PAD : D; /* row stride in elements */
            for (size_t i = 0; i < (size_t)T * H * rs; i++) {
                uint32_t kb, vb;
                memcpy(&kb, &kf[i], 4);
                memcpy(&vb, &vf[i], 4);
                k16[i] = dt == KVMEM_F16 ? ref_f16_exact(kf[i]) : (uint16_t)(kb >> 16); /* exact: 7-bit values */
                v16[i] = dt == KVMEM_F16 ? ref_f16_exact(vf[i]) : (uint16_t)(vb >> 16);
            }
            kvmem_tensor qt, kt, vt;
            const int64_t qs[3] = {1, Hq, D}, ks[3] = {T, H, D};
            assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 3, qs));
            assert_ok(kvmem_tensor_init(&kt, dt == KVMEM_F32 ? (void *)kf : (void *)k16, dt, 3, ks));
            assert_ok(kvmem_tensor_init(&vt, dt == KVMEM_F32 ? (void *)vf : (void *)v16, dt, 3, ks));
            kt.strides[1] = vt.strides[1] = rs;
            kt.strides[0] = vt.strides[0] = H * rs;
            kvmem_attend_source src;
            memset(&src, 0, sizeof src);
            src.kind = KVMEM_ATTEND_SRC_TENSORS;
            src.k = &kt;
            src.v = &vt;
            kvmem_attend_params pr = kvmem_attend_default_params();
            pr.order = KVMEM_ATTEND_RECENT; /* the default, SCORED, runs on the CPU */
            pr.tau_s = pr.tau_d = 0.0f;
            pr.tile_size = 32;
            kvmem_attend_stats sd, sc;
            const int calls = g_calls;
            run_both(&qt, &src, &pr, od, oc, &sd, &sc);
            assert_int_equal(g_calls, calls + 1);
            assert_stats_equal(&sd, &sc);
            assert_int_equal(sd.tiles_visited, 2 * 10);
            /* the double reference over contiguous f32 copies of the same values */
            float *kc = malloc((size_t)T * H * D * 4), *vc = malloc((size_t)T * H * D * 4);
            for (int64_t j = 0; j < T * H; j++) {
                memcpy(kc + j * D, kf + j * rs, (size_t)D * 4);
                memcpy(vc + j * D, vf + j * rs, (size_t)D * 4);
            }
            const double scale = 1.0 / sqrt((double)D);
            ref_attend(q, 1, Hq, H, D, kc, vc, T, NULL, scale, ref_all_visible, NULL, ref);
            for (int hq = 0; hq < Hq; hq++) {
                const double tol = tol_head(q, hq, G, H, D, kc, vc, T, NULL, scale);
                for (int d = 0; d < D; d++) {
                    const size_t i = (size_t)hq * D + d;
                    if (!(fabs(od[i] - ref[i]) <= tol && fabs(od[i] - oc[i]) <= tol && fabs(oc[i] - ref[i]) <= tol))
                        fail_msg("dtype %d strided %d head %d dim %d: device %.9g cpu %.9g reference %.9g (tol %.3g)",
                                 (int)dt, strided, hq, d, (double)od[i], (double)oc[i], ref[i], tol);
                }
            }
            free(kc);
            free(vc);
        }
    free(q);
    free(kf);
    free(vf);
    free(od);
    free(oc);
    free(ref);
    free(k16);
    free(v16);
}

/* ---- SLOTMAP: orders, dead slots, the stop rule on clear inputs ---- */

static void test_slotmap_orders_and_stop_rule(void **state) {
    (void)state;
    NEED_DEVICE();
    const int H = 2, G = 2, D = 32, Hq = H * G, TS = 16, T = 16 * 12 + 5; /* 13 tiles, the last partial */
    const int64_t n_slots = T + 40;
    const int32_t DEAD = 7; /* a dead id that is also a valid slot number */
    uint64_t rng = 9;
    float *q = malloc((size_t)Hq * D * 4), *k = malloc((size_t)n_slots * H * D * 4), *v = malloc((size_t)n_slots * H * D * 4);
    int32_t *slots = malloc((size_t)T * 4);
    float w[32], v0[32];
    for (int d = 0; d < D; d++) {
        w[d] = tu_normal(&rng);
        v0[d] = tu_normal(&rng);
    }
    for (int i = 0; i < Hq * D; i++) q[i] = tu_normal(&rng);
    for (int64_t s = 0; s < n_slots * H * D; s++) {
        k[s] = 0.05f * tu_normal(&rng); /* near-uniform weights */
        v[s] = 0.0f;
    }
    /* position j -> slot j + 20 (reversed halves, so slots are not positions) */
    for (int j = 0; j < T; j++) slots[j] = j < T / 2 ? T / 2 - 1 - j + 20 : j + 20;
    for (int j = 0; j < T; j++)
        if (j % 5 == 3 || (j >= 2 * TS && j < 3 * TS)) slots[j] = DEAD; /* tile 2 wholly dead */
    for (int j = 0; j < T; j++) {
        if (slots[j] == DEAD) continue;
        const int t = j / TS;
        const float sg = (t % 2 ? -1.0f : 1.0f) * (float)(t + 1);
        for (int d = 0; d < D; d++) {
            v[((size_t)slots[j] * H + 0) * D + d] = v0[d];
            v[((size_t)slots[j] * H + 1) * D + d] = sg * w[d];
        }
    }
    kvmem_tensor qt, kt, vt;
    const int64_t qs[3] = {1, Hq, D}, ks[3] = {n_slots, H, D};
    assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 3, ks));
    assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 3, ks));
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_SLOTMAP;
    src.k = &kt;
    src.v = &vt;
    src.slots = slots;
    src.n_positions = T;
    src.dead_slot = DEAD;
    const int32_t imp[2] = {5, 1}, idx[4] = {12, 2, 4, 0};
    const struct {
        kvmem_attend_order order;
        const int32_t *list;
        int32_t n;
        int32_t n_live; /* live tiles the order reaches */
    } orders[] = {{KVMEM_ATTEND_RECENT, NULL, 0, 12}, {KVMEM_ATTEND_IMPORTANCE, imp, 2, 12}, {KVMEM_ATTEND_INDEX, idx, 4, 3}};
    float *od = malloc((size_t)Hq * D * 4), *oc = malloc((size_t)Hq * D * 4);
    for (size_t oi = 0; oi < 3; oi++)
        for (int32_t patience = 1; patience <= 3; patience += 2)
            for (int stop = 0; stop < 2; stop++) {
                kvmem_attend_params pr = kvmem_attend_default_params();
                pr.order = orders[oi].order;
                pr.tile_order = orders[oi].list;
                pr.n_tile_order = orders[oi].n;
                pr.tile_size = TS;
                pr.patience = patience;
                pr.tau_s = stop ? 1e-3f : 0.0f;
                pr.tau_d = stop ? 1e-4f : 0.0f;
                kvmem_attend_stats sd, sc;
                const int calls = g_calls;
                run_both(&qt, &src, &pr, od, oc, &sd, &sc);
                assert_int_equal(g_calls, calls + 1);
                assert_stats_equal(&sd, &sc);
                /* hand-derived counts */
                const int32_t nl = orders[oi].n_live;
                const int32_t v0t = stop && patience + 1 < nl ? patience + 1 : nl;
                assert_int_equal(sd.n_streams, 2);
                assert_int_equal(sd.tiles_total, 2 * nl);
                assert_int_equal(sd.tiles_visited, v0t + nl);
                assert_int_equal(sd.streams_stopped, v0t < nl);
                for (int hq = 0; hq < Hq; hq++) {
                    const double tol = tol_head(q, hq, G, H, D, k, v, n_slots, NULL, 1.0 / sqrt((double)D));
                    for (int d = 0; d < D; d++) {
                        const size_t i = (size_t)hq * D + d;
                        if (!(fabs(od[i] - oc[i]) <= tol))
                            fail_msg("order %d patience %d stop %d head %d dim %d: device %.9g cpu %.9g (tol %.3g)",
                                     (int)oi, patience, stop, hq, d, (double)od[i], (double)oc[i], tol);
                    }
                    if (hq < G) /* KV head 0: the constant row, whatever it read */
                        for (int d = 0; d < D; d++) assert_true(fabs(od[hq * D + d] - v0[d]) <= tol);
                }
            }
    free(q);
    free(k);
    free(v);
    free(slots);
    free(od);
    free(oc);
}

/* ---- plans the device kernel does not cover run on the CPU ---- */

static void test_other_plans_run_on_cpu(void **state) {
    (void)state;
    NEED_DEVICE();
    const int H = 2, T = 100;
    int D = 32, G = 2;
    uint64_t rng = 5;
    float *buf = malloc(((size_t)4 * 32 * 256 + 2 * (size_t)T * H * 256) * 4);
    float *q = buf, *k = buf + 4 * 32 * 256, *v = k + (size_t)T * H * 256;
    for (size_t i = 0; i < (size_t)4 * 32 * 256 + 2 * (size_t)T * H * 256; i++) buf[i] = tu_normal(&rng);
    uint8_t mask[100];
    for (int j = 0; j < T; j++) mask[j] = j % 3 != 0;
    float *od = malloc((size_t)4 * 64 * 256 * 4), *oc = malloc((size_t)4 * 64 * 256 * 4);
    for (int c = 0; c < 5; c++) { /* (SCORED runs on the device: tests/backend/test_backend_attend.c) */
        int R = 1;
        kvmem_attend_params pr = kvmem_attend_default_params();
        pr.order = KVMEM_ATTEND_RECENT; /* one order for all heads: what the kernel takes */
        kvmem_attend_source src;
        memset(&src, 0, sizeof src);
        src.kind = KVMEM_ATTEND_SRC_TENSORS;
        D = 32, G = 2;
        if (c == 0) src.mask = mask;
        if (c == 1) R = 3;
        if (c == 2) pr.probe = KVMEM_ATTEND_PROBE_ORACLE;
        if (c == 3) pr.compare = 1;
        if (c == 4) D = 256, G = 32; /* beyond the Vulkan kernel: refused as unsupported, run here */
        kvmem_tensor qt, kt, vt;
        const int64_t qs[3] = {R, H * G, D}, ks[3] = {T, H, D};
        assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 3, qs));
        assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 3, ks));
        assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 3, ks));
        src.k = &kt;
        src.v = &vt;
        kvmem_attend_stats sd, sc;
        const int calls = g_calls;
        run_both(&qt, &src, &pr, od, oc, &sd, &sc);
        assert_int_equal(g_calls, calls + (c == 4));
        assert_memory_equal(od, oc, (size_t)R * H * G * D * 4);
        assert_stats_equal(&sd, &sc);
    }
    free(buf);
    free(od);
    free(oc);
}

/* ---- bad input on the device context: refused, nothing written ---- */

static void test_bad_input_on_device_context(void **state) {
    (void)state;
    NEED_DEVICE();
    const int H = 2, G = 2, D = 16, T = 20;
    float q[4 * 16], k[20 * 2 * 16], v[20 * 2 * 16], out[4 * 16];
    uint64_t rng = 1;
    for (int i = 0; i < 4 * 16; i++) q[i] = tu_normal(&rng);
    for (int i = 0; i < 20 * 2 * 16; i++) k[i] = v[i] = tu_normal(&rng);
    kvmem_tensor qt, kt, vt, ot;
    const int64_t qs[3] = {1, H * G, D}, ks[3] = {T, H, D};
    assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 3, ks));
    assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 3, ks));
    assert_ok(kvmem_tensor_init(&ot, out, KVMEM_F32, 3, qs));
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_SLOTMAP;
    src.k = &kt;
    src.v = &vt;
    int32_t slots[20];
    for (int j = 0; j < T; j++) slots[j] = j;
    slots[4] = T; /* outside [0, n_slots) */
    src.slots = slots;
    src.n_positions = T;
    src.dead_slot = -1;
    for (int i = 0; i < 4 * 16; i++) out[i] = 777.0f;
    const int calls = g_calls;
    assert_status(kvmem_attend(g_dev_ctx, &qt, &src, NULL, &ot, NULL), KVMEM_ERR_INVALID_ARG, "slots[4]");
    q[3] = NAN;
    slots[4] = 4;
    assert_status(kvmem_attend(g_dev_ctx, &qt, &src, NULL, &ot, NULL), KVMEM_ERR_INVALID_ARG, "not finite");
    assert_int_equal(g_calls, calls);
    for (int i = 0; i < 4 * 16; i++) assert_true(out[i] == 777.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensors_match_cpu_and_reference),
        cmocka_unit_test(test_slotmap_orders_and_stop_rule),
        cmocka_unit_test(test_other_plans_run_on_cpu),
        cmocka_unit_test(test_bad_input_on_device_context),
    };
    return tu_group_result(cmocka_run_group_tests(tests, setup, teardown), sizeof tests / sizeof tests[0]);
}
