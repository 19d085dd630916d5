/* Scalar reference kernels of the rule score and SnapKV. */
#include "kernels.h"

#include <math.h>
#include <string.h>

static void s_qk(const float *m, size_t G, size_t D, const float *k, size_t n, size_t kstride,
                 float scale, float *out, size_t out_stride) {
    for (size_t j = 0; j < n; j++) {
        const float *kr = k + j * kstride;
        for (size_t g = 0; g < G; g++) {
            const float *mr = m + g * D;
            float s = 0.0f;
            for (size_t d = 0; d < D; d++) s += mr[d] * kr[d];
            out[g * out_stride + j] = s * scale;
        }
    }
}

static void s_softmax_acc(float *x, size_t n, float *acc) {
    float mx = x[0];
    for (size_t j = 1; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    float sum = 0.0f;
    for (size_t j = 0; j < n; j++) {
        x[j] = expf(x[j] - mx);
        sum += x[j];
    }
    float inv = 1.0f / sum;
    for (size_t j = 0; j < n; j++) acc[j] += x[j] * inv;
}

static void s_kt_pack(const float *const *rows, size_t nk, size_t D, float *kt) {
    for (size_t d = 0; d < D; d++)
        for (size_t j = 0; j < KVM_QK_TILE; j++) kt[d * KVM_QK_TILE + j] = j < nk ? rows[j][d] : 0.0f;
}

static void s_qk_tile(const float *qp, size_t nr, const float *kt, size_t nk, size_t D, float scale, float *out,
                      size_t ldo, const kvm_qk_prefetch *pf) {
    (void)pf; /* a hint only */
    for (size_t r = 0; r < nr; r++) {
        const float *q = qp + (r / 8) * D * 8 + r % 8;
        for (size_t j = 0; j < nk; j++) {
            float s = 0.0f;
            for (size_t d = 0; d < D; d++) s += q[d * 8] * kt[d * KVM_QK_TILE + j];
            out[r * ldo + j] = s * scale;
        }
    }
}

static float s_exp_row(float *x, size_t n, size_t nz, float *mx) {
    float m = -INFINITY, sum = 0.0f;
    int bad = 0;
    for (size_t j = 0; j < n; j++) {
        bad |= !isfinite(x[j]);
        m = x[j] > m ? x[j] : m;
    }
    for (size_t j = 0; j < n; j++) {
        x[j] = expf(x[j] - m);
        sum += x[j];
    }
    for (size_t j = n; j < nz; j++) x[j] = 0.0f;
    *mx = m;
    return bad ? NAN : sum;
}

static void s_wsum(const float *e, size_t lde, const float *f, size_t nr, size_t n, float *vote) {
    for (size_t j = 0; j < n; j++) {
        float s = 0.0f;
        for (size_t i = 0; i < nr; i++) s += f[i] * e[i * lde + j];
        vote[j] = s;
    }
}

const kvm_qk_kernels kvm_qk_scalar = {"scalar", s_qk, s_softmax_acc, s_kt_pack, s_qk_tile, s_exp_row, s_wsum, NULL};
