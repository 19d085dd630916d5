/* Scalar reference kernels. Plain loops, written for clarity: every SIMD
 * table is checked against these. */
#include "half.h"
#include "kernels.h"

static void s_f16_to_f32(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = kvm_f16_to_f32(src[i]);
}
static void s_f32_to_f16(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = kvm_f32_to_f16(src[i]);
}
static void s_bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = kvm_bf16_to_f32(src[i]);
}
static void s_f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = kvm_f32_to_bf16(src[i]);
}

static void s_minmax_rows(const float *x, size_t n_rows, size_t stride, size_t dim, float *mn,
                          float *mx) {
    for (size_t d = 0; d < dim; d++) mn[d] = mx[d] = x[d];
    for (size_t r = 1; r < n_rows; r++) {
        const float *row = x + r * stride;
        for (size_t d = 0; d < dim; d++) {
            /* operand order mirrors x86 min/max: the accumulator wins on NaN */
            mn[d] = row[d] < mn[d] ? row[d] : mn[d];
            mx[d] = row[d] > mx[d] ? row[d] : mx[d];
        }
    }
}

static size_t s_count_nonfinite(const float *x, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += (kvm_f32_bits(x[i]) & 0x7f800000u) == 0x7f800000u;
    return c;
}

static float s_dot(const float *a, const float *b, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

const kvm_cpu_kernels kvm_cpu_scalar = {
    "scalar", s_f16_to_f32, s_f32_to_f16, s_bf16_to_f32, s_f32_to_bf16, s_minmax_rows, s_count_nonfinite, s_dot,
    &kvm_score_scalar, &kvm_attend_scalar, &kvm_qk_scalar, &kvm_quant_scalar,
    NULL, /* RoPE rows: kvm_rope_rotate */
    NULL, /* the checksum: format/hash.c's scalar stripes */
};
