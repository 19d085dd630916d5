/* Scalar scoring kernels: the reference the SIMD tables are tested against.
 * Plain loops, f32 accumulation in index order. */
#include "score.h"

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

static const kvm_score_kernels k_scalar = {"scalar", s_panel, s_rows, s_exp_neg, 1};

const kvm_score_kernels *kvm_score_kernels_scalar(void) { return &k_scalar; }
