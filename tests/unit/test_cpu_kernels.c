/* Every SIMD kernel table equals the scalar reference, bit for bit, on
 * random and edge-case inputs: odd sizes and tails, denormals, Inf, NaN,
 * values at the f16 overflow boundary. And the scalar conversions equal
 * hand-computed encodings. */
#include "testutil.h"
#include "cpu/half.h"
#include "cpu/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const kvm_cpu_kernels *simd_tables(int i) {
    return i == 0 ? kvm_cpu_kernels_named("avx2") : kvm_cpu_kernels_named("avx512");
}

/* Interesting f32 bit patterns. */
static const uint32_t k_edge[] = {
    0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, /* zeros, f32 denormals */
    0x33800000u, 0x33000000u, 0x33000001u, 0x387fe000u, /* f16 subnormal range and ties */
    0x38800000u, 0x477fe000u, 0x477fefffu, 0x477ff000u, /* smallest normal f16, max f16, overflow tie */
    0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, /* Inf, -Inf, qNaN, sNaN */
    0xffc12345u, 0x3f800000u, 0xbf7fffffu, 0x3f808000u, /* NaN with payload, 1, ~-1, bf16 tie */
    0x3f818000u, 0x7f7fffffu, 0x4b800001u,
};
#define N_EDGE (sizeof k_edge / sizeof k_edge[0])

static void fill_mixed(float *x, size_t n, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) {
        uint64_t r = tu_next(rng);
        switch (r % 4) {
        case 0: x[i] = kvm_bits_f32(k_edge[(r >> 8) % N_EDGE]); break;
        case 1: x[i] = kvm_bits_f32((uint32_t)(r >> 16)); break; /* any bit pattern */
        default: x[i] = tu_normal(rng) * powf(2.0f, (float)((int)(r >> 40) % 40 - 20)); break;
        }
    }
}

static void scalar_f16_known_values(void **state) {
    (void)state;
    assert_int_equal(kvm_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(kvm_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(kvm_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(kvm_f32_to_f16(65519.0f), 0x7bff); /* below the tie: stays max */
    assert_int_equal(kvm_f32_to_f16(65520.0f), 0x7c00); /* tie to even -> Inf */
    assert_int_equal(kvm_f32_to_f16(5.9604644775390625e-8f), 0x0001); /* 2^-24 */
    assert_int_equal(kvm_f32_to_f16(2.98023223876953125e-8f), 0x0000); /* 2^-25: tie to even 0 */
    assert_int_equal(kvm_f32_to_f16(6.103515625e-05f), 0x0400); /* 2^-14 */
    assert_int_equal(kvm_f32_to_f16(1.0009765625f), 0x3c01);
    assert_int_equal(kvm_f32_to_f16(1.00048828125f), 0x3c00); /* 1 + 2^-11: tie to even */
    assert_int_equal(kvm_f32_to_f16(INFINITY), 0x7c00);
    assert_true((kvm_f32_to_f16(NAN) & 0x7e00) == 0x7e00);
    assert_true(kvm_f16_to_f32(0x3555) > 0.33325f && kvm_f16_to_f32(0x3555) < 0.33334f);
    assert_true(kvm_f16_to_f32(0x0001) == 5.9604644775390625e-8f);
    assert_true(isinf(kvm_f16_to_f32(0xfc00)) && kvm_f16_to_f32(0xfc00) < 0);
    assert_int_equal(kvm_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(kvm_f32_to_bf16(kvm_bits_f32(0x3f808000u)), 0x3f80); /* tie to even */
    assert_int_equal(kvm_f32_to_bf16(kvm_bits_f32(0x3f818000u)), 0x3f82); /* tie to even (odd) */
    assert_true(kvm_bf16_to_f32(0xc040) == -3.0f);
    /* every f16 value survives f16 -> f32 -> f16 */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kvm_f16_to_f32((uint16_t)h);
        uint16_t back = kvm_f32_to_f16(f);
        if (isnan(f)) assert_true((back & 0x7e00) == 0x7e00 && (back & 0x8000) == (h & 0x8000));
        else assert_int_equal(back, h);
    }
}

static void simd_conversions_equal_scalar(void **state) {
    (void)state;
    const kvm_cpu_kernels *s = (&kvm_cpu_scalar);
    int tested = 0;
    for (int t = 0; t < 2; t++) {
        const kvm_cpu_kernels *k = simd_tables(t);
        if (!k) continue;
        tested++;
        uint64_t rng = 1234 + (uint64_t)t;
        for (size_t n = 0; n <= 67; n++) {
            float x[80], ya[80], yb[80];
            uint16_t ha[80], hb[80], in16[80];
            fill_mixed(x, n, &rng);
            s->f32_to_f16(x, ha, n);
            k->f32_to_f16(x, hb, n);
            if (n) assert_memory_equal(ha, hb, n * 2);
            s->f32_to_bf16(x, ha, n);
            k->f32_to_bf16(x, hb, n);
            if (n) assert_memory_equal(ha, hb, n * 2);
            for (size_t i = 0; i < n; i++) in16[i] = (uint16_t)tu_next(&rng);
            s->f16_to_f32(in16, ya, n);
            k->f16_to_f32(in16, yb, n);
            if (n) assert_memory_equal(ya, yb, n * 4);
            s->bf16_to_f32(in16, ya, n);
            k->bf16_to_f32(in16, yb, n);
            if (n) assert_memory_equal(ya, yb, n * 4);
            assert_int_equal(s->count_nonfinite(x, n), k->count_nonfinite(x, n));
        }
        /* all 65536 f16 patterns at once */
        uint16_t *all = malloc(65536 * 2);
        float *fa = malloc(65536 * 4), *fb = malloc(65536 * 4);
        for (uint32_t h = 0; h < 65536; h++) all[h] = (uint16_t)h;
        s->f16_to_f32(all, fa, 65536);
        k->f16_to_f32(all, fb, 65536);
        assert_memory_equal(fa, fb, 65536 * 4);
        free(all);
        free(fa);
        free(fb);
    }
    if (!tested) skip();
}

static void count_nonfinite_counts(void **state) {
    (void)state;
    float x[37];
    for (int i = 0; i < 37; i++) x[i] = (float)i;
    x[3] = INFINITY;
    x[20] = -INFINITY;
    x[36] = NAN;
    x[10] = kvm_bits_f32(0x00000001u); /* denormal: finite */
    assert_int_equal((&kvm_cpu_scalar)->count_nonfinite(x, 37), 3);
    assert_int_equal(kvm_cpu_kernels_get()->count_nonfinite(x, 37), 3);
}

/* Sizes across the SIMD forms' four-vector steps and their tails (up to
 * 64 floats a step), Inf/NaN bit patterns at every phase, against a plain
 * loop over the exponent bits. */
static void count_nonfinite_long_rows(void **state) {
    (void)state;
    static const uint32_t bad[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu};
    uint64_t rng = 7;
    float *x = malloc(1100 * sizeof(float));
    assert_non_null(x);
    int tested = 0;
    for (size_t n = 0; n <= 1100; n += n < 200 ? 1 : 37) {
        size_t want = 0;
        for (size_t i = 0; i < n; i++) {
            const uint64_t r = tu_next(&rng);
            x[i] = r % 9 == 0 ? kvm_bits_f32(bad[(r >> 8) % 5]) : r % 9 == 1 ? kvm_bits_f32(0x7f7fffffu) : tu_normal(&rng);
            want += (kvm_f32_bits(x[i]) & 0x7f800000u) == 0x7f800000u;
        }
        assert_int_equal((&kvm_cpu_scalar)->count_nonfinite(x, n), want);
        for (int t = 0; t < 2; t++) {
            const kvm_cpu_kernels *k = simd_tables(t);
            if (!k) continue;
            tested++;
            assert_int_equal(k->count_nonfinite(x, n), want);
        }
    }
    free(x);
    if (!tested) skip();
}

static void minmax_equals_reference_and_scalar(void **state) {
    (void)state;
    uint64_t rng = 99;
    const kvm_cpu_kernels *tabs[3] = {(&kvm_cpu_scalar), simd_tables(0), simd_tables(1)};
    for (size_t dim = 1; dim <= 70; dim += 3) {
        for (size_t rows = 1; rows <= 17; rows += 4) {
            size_t stride = dim + (rows % 3);
            float *x = malloc(rows * stride * sizeof(float));
            for (size_t i = 0; i < rows * stride; i++) x[i] = tu_normal(&rng) * 100.0f;
            x[0] = kvm_bits_f32(0x80000001u); /* a negative denormal */
            float mn_ref[80], mx_ref[80];
            for (size_t d = 0; d < dim; d++) {
                mn_ref[d] = mx_ref[d] = x[d];
                for (size_t r = 1; r < rows; r++) {
                    mn_ref[d] = fminf(mn_ref[d], x[r * stride + d]);
                    mx_ref[d] = fmaxf(mx_ref[d], x[r * stride + d]);
                }
            }
            for (int t = 0; t < 3; t++) {
                if (!tabs[t]) continue;
                float mn[80], mx[80];
                tabs[t]->minmax_rows(x, rows, stride, dim, mn, mx);
                assert_memory_equal(mn, mn_ref, dim * 4);
                assert_memory_equal(mx, mx_ref, dim * 4);
            }
            free(x);
        }
    }
}

static void minmax_nan_behaviour_is_the_same_everywhere(void **state) {
    (void)state;
    /* Documented: a NaN in a later row is ignored; a NaN in the first row sticks. */
    float x[3 * 20];
    for (int i = 0; i < 60; i++) x[i] = (float)(i % 7) - 3.0f;
    x[20 + 5] = NAN;
    x[0 + 9] = NAN;
    const kvm_cpu_kernels *tabs[3] = {(&kvm_cpu_scalar), simd_tables(0), simd_tables(1)};
    for (int t = 0; t < 3; t++) {
        if (!tabs[t]) continue;
        float mn[20], mx[20];
        tabs[t]->minmax_rows(x, 3, 20, 20, mn, mx);
        assert_false(isnan(mn[5]) || isnan(mx[5]));
        assert_true(isnan(mn[9]) && isnan(mx[9]));
    }
}

static void dot_matches_double_reference(void **state) {
    (void)state;
    uint64_t rng = 5;
    const kvm_cpu_kernels *tabs[3] = {(&kvm_cpu_scalar), simd_tables(0), simd_tables(1)};
    for (size_t n = 0; n < 300; n += 7) {
        float a[300], b[300];
        double ref = 0, mag = 0;
        for (size_t i = 0; i < n; i++) {
            a[i] = tu_normal(&rng);
            b[i] = tu_normal(&rng);
            ref += (double)a[i] * b[i];
            mag += fabs((double)a[i] * b[i]);
        }
        for (int t = 0; t < 3; t++) {
            if (!tabs[t]) continue;
            double got = tabs[t]->dot(a, b, n);
            /* summation order differs by path: bound by n * eps * sum|a_i b_i| */
            assert_true(fabs(got - ref) <= 1e-6 * (double)(n + 1) * (mag + 1e-30));
        }
    }
}

static void forced_table_follows_env(void **state) {
    (void)state;
    const char *force = getenv("KVMEM_CPU");
    const kvm_cpu_kernels *k = kvm_cpu_kernels_get();
    if (force && kvm_cpu_kernels_named(force)) assert_string_equal(k->name, force);
    assert_null(kvm_cpu_kernels_named("sse9"));
    assert_null(kvm_cpu_kernels_named(NULL));
    assert_non_null(kvm_cpu_kernels_named("scalar"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(scalar_f16_known_values),
        cmocka_unit_test(simd_conversions_equal_scalar),
        cmocka_unit_test(count_nonfinite_counts),
        cmocka_unit_test(count_nonfinite_long_rows),
        cmocka_unit_test(minmax_equals_reference_and_scalar),
        cmocka_unit_test(minmax_nan_behaviour_is_the_same_everywhere),
        cmocka_unit_test(dot_matches_double_reference),
        cmocka_unit_test(forced_table_follows_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
