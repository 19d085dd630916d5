/* kvmem_qmem_score on a device backend: a context whose backend is Vulkan
 * runs the rule score through its dev_qmem_score (K staged as contiguous
 * f32 from any dtype and strides) and matches the same call on a "cpu"
 * context. Skips, saying why, where Vulkan cannot run.
 *
 * Tolerance: |s_vk - s_cpu| <= 1e-4 (1 + s_cpu). The kernel itself is held
 * to a worst-case f32 bound in tests/backend/test_backend_qmem.c (relative
 * error there stays below 3e-3 for N = 4099, and measured errors are ~1e-6);
 * here the point is the routing: a wrong layout, stride, head mapping or
 * dtype conversion while staging moves scores by the order of the scores
 * themselves (a softmax mass of 1 per layer and head). */
#include "testutil.h"

#include "backend/route/context.h"
#include "cpu/half.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvmem_context *g_vk, *g_cpu;
static char g_why[512];

static int setup(void **state) {
    (void)state;
    kvmem_context_params p = kvmem_context_default_params();
    p.backend = "vulkan";
    p.n_threads = 2;
    if (kvmem_context_create(&p, &g_vk) != KVMEM_OK) {
        snprintf(g_why, sizeof g_why, "vulkan: %s", kvmem_last_error());
        g_vk = NULL;
    }
    p.backend = "cpu";
    if (kvmem_context_create(&p, &g_cpu) != KVMEM_OK) return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    kvmem_context_free(g_vk);
    kvmem_context_free(g_cpu);
    return 0;
}

#define NEED_VULKAN()                                   \
    do {                                                \
        if (!g_vk) {                                    \
            TU_SKIP("%s", g_why);      \
        }                                               \
    } while (0)

static double last_op_seconds(void) {
    kvmem_backend *be = g_vk->backend;
    void *p = be->iface->get_proc_address ? be->iface->get_proc_address(be, KVM_PROC_LAST_OP_SECONDS) : NULL;
    if (!p) return -2;
    kvm_last_op_seconds_fn f;
    memcpy(&f, &p, sizeof f);
    return f(be);
}

static void unit_rows(float *m, size_t rows, size_t D, uint64_t *rng) {
    for (size_t r = 0; r < rows; r++) {
        double n = 0;
        for (size_t d = 0; d < D; d++) {
            m[r * D + d] = tu_normal(rng);
            n += (double)m[r * D + d] * m[r * D + d];
        }
        for (size_t d = 0; d < D; d++) m[r * D + d] = (float)(m[r * D + d] / sqrt(n));
    }
}

/* K of L x N x 2 heads x D in dtype dt; strided: a view of every other
 * token of a buffer twice as long (non-contiguous rows). */
static void check_case(int L, int D, int64_t N, kvmem_dtype dt, int strided, uint64_t seed) {
    kvmem_model_spec s = tu_spec(L, D);
    size_t E = (size_t)L * 4 * D, T = (size_t)(strided ? 2 * N : N), KE = (size_t)L * T * 2 * D;
    uint64_t rng = seed;
    float *m = malloc(E * 4), *kf = malloc(KE * 4), *sv = malloc((size_t)N * 4), *sc = malloc((size_t)N * 4);
    uint16_t *kh = malloc(KE * 2);
    unit_rows(m, (size_t)L * 4, (size_t)D, &rng);
    for (size_t i = 0; i < KE; i++) kf[i] = 2.0f * tu_normal(&rng);
    kvmem_tensor kt;
    int64_t shape[4] = {L, (int64_t)T, 2, D};
    if (dt == KVMEM_F32) {
        assert_ok(kvmem_tensor_init(&kt, kf, KVMEM_F32, 4, shape));
    } else {
        for (size_t i = 0; i < KE; i++) kh[i] = dt == KVMEM_F16 ? kvm_f32_to_f16(kf[i]) : kvm_f32_to_bf16(kf[i]);
        assert_ok(kvmem_tensor_init(&kt, kh, dt, 4, shape));
    }
    if (strided) { /* tokens 0, 2, 4, ... */
        kt.shape[1] = N;
        kt.strides[1] *= 2;
    }
    assert_ok(kvmem_qmem_score(g_cpu, &s, m, &kt, sc));
    assert_ok(kvmem_qmem_score(g_vk, &s, m, &kt, sv));
    assert_true(last_op_seconds() > 0); /* the device ran it (timestamps) */
    double total = 0;
    for (int64_t j = 0; j < N; j++) {
        total += sv[j];
        if (!(fabs(sv[j] - sc[j]) <= 1e-4 * (1 + fabs(sc[j]))))
            fail_msg("L %d D %d N %lld dtype %s strided %d: score %lld vulkan %.9g, cpu %.9g", L, D, (long long)N,
                     kvmem_dtype_name(dt), strided, (long long)j, sv[j], sc[j]);
    }
    assert_true(fabs(total - 4.0 * L) <= 1e-3 * L);
    free(m);
    free(kf);
    free(kh);
    free(sv);
    free(sc);
}

static void test_qmem_score_on_vulkan_matches_cpu(void **state) {
    (void)state;
    NEED_VULKAN();
    check_case(1, 8, 1, KVMEM_F32, 0, 1);
    check_case(2, 64, 37, KVMEM_F32, 0, 2);
    check_case(3, 32, 300, KVMEM_F16, 0, 3);
    check_case(2, 128, 129, KVMEM_BF16, 1, 4);
    check_case(4, 16, 1001, KVMEM_F32, 1, 5);
}

static void test_qmem_score_on_vulkan_rejects_bad_input_unchanged(void **state) {
    (void)state;
    NEED_VULKAN();
    kvmem_model_spec s = tu_spec(1, 8);
    float m[4 * 8], k[4 * 2 * 8], sc[4] = {7, 7, 7, 7};
    for (int i = 0; i < 32; i++) m[i] = 0.1f;
    for (int i = 0; i < 64; i++) k[i] = 0.2f;
    kvmem_tensor kt;
    int64_t shape[4] = {1, 4, 2, 8};
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape));
    assert_status(kvmem_qmem_score(g_vk, &s, NULL, &kt, sc), KVMEM_ERR_INVALID_ARG, "memory is NULL");
    assert_status(kvmem_qmem_score(g_vk, &s, m, NULL, sc), KVMEM_ERR_INVALID_ARG, "K is NULL");
    m[3] = NAN;
    assert_status(kvmem_qmem_score(g_vk, &s, m, &kt, sc), KVMEM_ERR_INVALID_ARG, "not finite");
    m[3] = 0.1f;
    kt.shape[2] = 3;
    assert_status(kvmem_qmem_score(g_vk, &s, m, &kt, sc), KVMEM_ERR_INVALID_ARG, "K");
    for (int j = 0; j < 4; j++) assert_true(sc[j] == 7.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qmem_score_on_vulkan_matches_cpu),
        cmocka_unit_test(test_qmem_score_on_vulkan_rejects_bad_input_unchanged),
    };
    return tu_group_result(cmocka_run_group_tests(tests, setup, teardown), sizeof tests / sizeof tests[0]);
}
