/* The batched NEOX row rotation used by kvmem_gather: every SIMD variant
 * equals the scalar single-row kvm_rope_rotate bit for bit, for any number
 * of pairs (vector bodies and scalar tails), strides and YaRN's factor. */
#include "testutil.h"
#include "cpu/kernels.h"
#include "rope/rope.h"

#include <stdlib.h>
#include <string.h>

typedef void (*rows_fn)(const kvm_rope *, float *, size_t, size_t, const float *, size_t);

static void check(rows_fn fn, const char *name) {
    uint64_t rng = 17;
    for (int D = 2; D <= 96; D += 2)
        for (int yarn = 0; yarn < 2; yarn++) {
            kvmem_model_spec s = kvmem_model_spec_default();
            s.head_dim = D;
            if (yarn) {
                s.rope_scaling = KVMEM_ROPE_SCALING_YARN;
                s.rope_factor = 4.0;
                s.rope_original_max_pos = 512;
            }
            kvm_rope r;
            kvm_rope_init(&r, &s);
            const size_t n = 5, stride = (size_t)D + 3, np = (size_t)r.n_pairs;
            float *x = malloc(n * stride * sizeof(float)), *y = malloc(n * stride * sizeof(float));
            float *cs = malloc(n * 2 * np * sizeof(float));
            for (size_t i = 0; i < n * stride; i++) x[i] = y[i] = tu_normal(&rng);
            for (size_t i = 0; i < n; i++) kvm_rope_cos_sin(&r, 1000.0 + 37.0 * (double)i, cs + i * 2 * np, cs + i * 2 * np + np);
            fn(&r, x, n, stride, cs, 2 * np);
            for (size_t i = 0; i < n; i++) kvm_rope_rotate(&r, y + i * stride, cs + i * 2 * np, cs + i * 2 * np + np, 0);
            if (memcmp(x, y, n * stride * sizeof(float)) != 0) fail_msg("%s: D = %d, yarn %d differs from the scalar rotation", name, D, yarn);
            free(x);
            free(y);
            free(cs);
        }
}

static void simd_rows_equal_scalar_rotation(void **state) {
    (void)state;
    check(kvm_rope_rotate_rows, "kvm_rope_rotate_rows (dispatched)");
    int ran = 0;
    if (kvm_cpu_kernels_named("avx2")) {
        check(kvm_cpu_kernels_named("avx2")->rope_rows_neox, "avx2");
        ran++;
    }
    if (kvm_cpu_kernels_named("avx512")) {
        check(kvm_cpu_kernels_named("avx512")->rope_rows_neox, "avx512");
        ran++;
    }
    if (!ran) skip(); /* skipped: no AVX2/AVX-512 on this CPU */
}

static void gptj_rows_use_the_scalar_formula(void **state) {
    (void)state;
    kvmem_model_spec s = kvmem_model_spec_default();
    s.head_dim = 64;
    s.rotary_dim = 48;
    s.rope_style = KVMEM_ROPE_GPTJ;
    kvm_rope r;
    kvm_rope_init(&r, &s);
    float x[3 * 64], y[3 * 64], cs[3 * 48];
    uint64_t rng = 5;
    for (int i = 0; i < 3 * 64; i++) x[i] = y[i] = tu_normal(&rng);
    for (int i = 0; i < 3; i++) kvm_rope_cos_sin(&r, 9.0 * i, cs + i * 48, cs + i * 48 + 24);
    kvm_rope_rotate_rows(&r, x, 3, 64, cs, 48);
    for (int i = 0; i < 3; i++) kvm_rope_rotate(&r, y + i * 64, cs + i * 48, cs + i * 48 + 24, 0);
    assert_memory_equal(x, y, sizeof x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(simd_rows_equal_scalar_rotation),
        cmocka_unit_test(gptj_rows_use_the_scalar_formula),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
