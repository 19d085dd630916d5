/* kvmem_context_transfer_stats / _reset: the context counts every byte the
 * core moves through its backend's buffer_upload / buffer_download.
 *
 * - bad input: refused with a message, counters unchanged;
 * - "cpu": the ops read host memory in place, nothing is counted;
 * - "vulkan" (lavapipe here; skipped with the reason elsewhere): a one-row
 *   attention over caller K/V (TENSORS, the device path) moves exactly what
 *   that path must move, computed here from the shapes: up q, the slot map
 *   and the visiting order (int32 each), K and V; down the output and one
 *   tile count per KV head. Reset sets both counters to 0. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_bad_input(void **state) {
    (void)state;
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cpu";
    cp.n_threads = 1;
    kvmem_context *ctx = NULL;
    assert_ok(kvmem_context_create(&cp, &ctx));
    uint64_t h = 7, d = 9;
    assert_status(kvmem_context_transfer_stats(NULL, &h, &d), KVMEM_ERR_INVALID_ARG, "ctx is NULL");
    assert_status(kvmem_context_transfer_stats(ctx, NULL, NULL), KVMEM_ERR_INVALID_ARG, "both NULL");
    assert_status(kvmem_context_transfer_reset(NULL), KVMEM_ERR_INVALID_ARG, "ctx is NULL");
    assert_true(h == 7 && d == 9);
    assert_ok(kvmem_context_transfer_stats(ctx, &h, NULL));
    assert_ok(kvmem_context_transfer_stats(ctx, NULL, &d));
    assert_true(h == 0 && d == 0);
    kvmem_context_free(ctx);
}

enum { T = 300, H = 2, HQ = 4, D = 16 };

/* One attention call over random f32 K/V [T][H][D]; returns its status. */
static kvmem_status attend_once(kvmem_context *ctx, float *out) {
    static float q[HQ * D], k[T * H * D], v[T * H * D];
    uint64_t rng = 5;
    for (int i = 0; i < HQ * D; i++) q[i] = tu_normal(&rng);
    for (int i = 0; i < T * H * D; i++) {
        k[i] = tu_normal(&rng);
        v[i] = tu_normal(&rng);
    }
    int64_t qs[3] = {1, HQ, D}, ks[3] = {T, H, D};
    kvmem_tensor qt, kt, vt, ot;
    assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 3, ks));
    assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 3, ks));
    assert_ok(kvmem_tensor_init(&ot, out, KVMEM_F32, 3, qs));
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &kt;
    src.v = &vt;
    kvmem_attend_params p = kvmem_attend_default_params();
    p.order = KVMEM_ATTEND_RECENT;
    p.tile_size = 32;
    p.tau_s = p.tau_d = 0;
    return kvmem_attend(ctx, &qt, &src, &p, &ot, NULL);
}

static void test_cpu_counts_nothing(void **state) {
    (void)state;
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cpu";
    cp.n_threads = 1;
    kvmem_context *ctx = NULL;
    assert_ok(kvmem_context_create(&cp, &ctx));
    float out[HQ * D];
    assert_ok(attend_once(ctx, out));
    uint64_t h = 1, d = 1;
    assert_ok(kvmem_context_transfer_stats(ctx, &h, &d));
    assert_true(h == 0 && d == 0);
    kvmem_context_free(ctx);
}

static void test_device_attend_counts_its_bytes(void **state) {
    (void)state;
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "vulkan";
    cp.n_threads = 2;
    kvmem_context *ctx = NULL;
    if (kvmem_context_create(&cp, &ctx) != KVMEM_OK) {
        TU_SKIP("backend vulkan: %s", kvmem_last_error());
    }
    float out[HQ * D];
    assert_ok(attend_once(ctx, out));
    uint64_t h = 0, d = 0;
    assert_ok(kvmem_context_transfer_stats(ctx, &h, &d));
    const uint64_t n_tiles = (T + 31) / 32;
    const uint64_t up = HQ * D * 4 + T * 4 + n_tiles * 4 + 2ull * T * H * D * 4, down = HQ * D * 4 + H * 4;
    assert_true(h == up);
    assert_true(d == down);
    assert_ok(attend_once(ctx, out));
    assert_ok(kvmem_context_transfer_stats(ctx, &h, &d));
    assert_true(h == 2 * up && d == 2 * down);
    assert_ok(kvmem_context_transfer_reset(ctx));
    assert_ok(kvmem_context_transfer_stats(ctx, &h, &d));
    assert_true(h == 0 && d == 0);
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_cpu_counts_nothing),
        cmocka_unit_test(test_device_attend_counts_its_bytes),
    };
    return tu_group_result(cmocka_run_group_tests(tests, NULL, NULL), sizeof tests / sizeof tests[0]);
}
