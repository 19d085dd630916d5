/* Scalar scoring kernels: the reference the SIMD tables are tested against.
 * Plain loops, f32 accumulation in index order. */
#include "kernels.h"
#include "half.h"

#include <math.h>

static void s_panel(const float *qt, size_t rp, const float *const *b, size_t n, size_t K, float *out,
                    size_t ldo) {
    for (size_t j = 0; j < n; j++) {
        float *o = out + j * ldo;
        for (size_t r = 0; r < rp; r++) o[r] = 0.0f;
        for (size_t k = 0; k < K; k++) {
            const float x = b[j][k];
            const float *q = qt + k * rp;
            for (size_t r = 0; r < rp; r++) o[r] += q[r] * x;
        }
    }
}

static void s_rows(const float *q, size_t R, const float *const *b, size_t n, size_t K, float *out,
                   size_t ldo) {
    for (size_t j = 0; j < n; j++)
        for (size_t r = 0; r < R; r++) {
            float s = 0.0f;
            for (size_t k = 0; k < K; k++) s += q[r * K + k] * b[j][k];
            out[j * ldo + r] = s;
        }
}

static void s_exp_neg(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = expf(x[i]);
}

static void s_aabb_rows_f32(const float *q, size_t R, const float *const *b, size_t n, size_t D, float *out,
                            size_t ldo) {
    for (size_t j = 0; j < n; j++)
        for (size_t r = 0; r < R; r++) {
            const float *qr = q + r * D;
            float s = 0.0f;
            for (size_t d = 0; d < D; d++) s += qr[d] * (qr[d] < 0.0f ? b[j][D + d] : b[j][d]);
            out[j * ldo + r] = s;
        }
}

static void s_aabb_rows_f16(const float *q, size_t R, const uint16_t *const *b, size_t n, size_t D, float *out,
                            size_t ldo) {
    for (size_t j = 0; j < n; j++)
        for (size_t r = 0; r < R; r++) {
            const float *qr = q + r * D;
            float s = 0.0f;
            for (size_t d = 0; d < D; d++) s += qr[d] * kvm_f16_to_f32(qr[d] < 0.0f ? b[j][D + d] : b[j][d]);
            out[j * ldo + r] = s;
        }
}

static void s_col_max(const float *x, size_t n, size_t ld, size_t cols, float *m) {
    for (size_t j = 0; j < n; j++)
        for (size_t c = 0; c < cols; c++) m[c] = x[j * ld + c] > m[c] ? x[j * ld + c] : m[c];
}

static void s_col_exp_sum(float *x, size_t n, size_t ld, size_t cols, const float *m, float tau, float *z) {
    for (size_t j = 0; j < n; j++)
        for (size_t c = 0; c < cols; c++) {
            float e = expf(tau * (x[j * ld + c] - m[c]));
            x[j * ld + c] = e;
            z[c] += e;
        }
}

static float s_dot(const float *a, const float *b, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void s_exact_f16(const float *q, size_t R, const uint16_t *k, size_t n, size_t D, float *out) {
    for (size_t r = 0; r < R; r++) {
        float m = -INFINITY;
        for (size_t i = 0; i < n; i++) {
            float s = 0.0f;
            for (size_t d = 0; d < D; d++) s += q[r * D + d] * kvm_f16_to_f32(k[i * D + d]);
            m = s > m ? s : m;
        }
        out[r] = m;
    }
}

static void s_exact_f32(const float *q, size_t R, const float *k, size_t n, size_t D, float *out) {
    for (size_t r = 0; r < R; r++) {
        float m = -INFINITY;
        for (size_t i = 0; i < n; i++) {
            float s = 0.0f;
            for (size_t d = 0; d < D; d++) s += q[r * D + d] * k[i * D + d];
            m = s > m ? s : m;
        }
        out[r] = m;
    }
}

static void s_group_max(const float *x, const float *w, size_t n_groups, size_t n, float *out) {
    for (size_t g = 0; g < n_groups; g++) {
        float a = -INFINITY;
        for (size_t t = g * n; t < (g + 1) * n; t++) {
            const float v = w ? x[t] * w[t] : x[t];
            a = v > a ? v : a;
        }
        out[g] = a;
    }
}

const kvm_score_kernels kvm_score_scalar = {"scalar",          s_panel,     s_rows,          s_exp_neg, 1,
                                           s_aabb_rows_f16,   s_aabb_rows_f32, s_col_max, s_col_exp_sum, s_dot,
                                           s_exact_f16,       s_exact_f32,     s_group_max};
