/* Scalar reference micro-kernels for ART attention. The SIMD tables are
 * tested against these. */
#include "half.h"
#include "kernels.h"

#include <math.h>
#include <string.h>

static void s_qk(const float *const *q, size_t nq, const float *const *k, size_t nk, size_t dim,
                 float scale, float *s, size_t lds) {
    for (size_t g = 0; g < nq; g++)
        for (size_t i = 0; i < nk; i++) {
            float acc = 0.0f;
            for (size_t d = 0; d < dim; d++) acc += q[g][d] * k[i][d];
            s[g * lds + i] = acc * scale;
        }
}

static float s_exp_sum(float *s, size_t n, float m) {
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) {
        s[i] = expf(s[i] - m);
        sum += s[i];
    }
    return sum;
}

static void s_pv(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                 const float *const *v, size_t nk, size_t dim) {
    for (size_t g = 0; g < nq; g++) {
        float *a = acc[g];
        for (size_t d = 0; d < dim; d++) a[d] *= c[g];
        for (size_t i = 0; i < nk; i++) {
            const float w = p[g * ldp + i];
            for (size_t d = 0; d < dim; d++) a[d] += w * v[i][d];
        }
    }
}

static void s_qk_f16(const float *const *q, size_t nq, const uint16_t *const *k, size_t nk, size_t dim,
                     float scale, float *s, size_t lds) {
    for (size_t g = 0; g < nq; g++)
        for (size_t i = 0; i < nk; i++) {
            float acc = 0.0f;
            for (size_t d = 0; d < dim; d++) acc += q[g][d] * kvm_f16_to_f32(k[i][d]);
            s[g * lds + i] = acc * scale;
        }
}

static void s_pv_f16(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                     const uint16_t *const *v, size_t nk, size_t dim) {
    for (size_t g = 0; g < nq; g++) {
        float *a = acc[g];
        for (size_t d = 0; d < dim; d++) a[d] *= c[g];
        for (size_t i = 0; i < nk; i++) {
            const float w = p[g * ldp + i];
            for (size_t d = 0; d < dim; d++) a[d] += w * kvm_f16_to_f32(v[i][d]);
        }
    }
}

static void s_qk_bf16(const float *const *q, size_t nq, const uint16_t *const *k, size_t nk, size_t dim,
                      float scale, float *s, size_t lds) {
    for (size_t g = 0; g < nq; g++)
        for (size_t i = 0; i < nk; i++) {
            float acc = 0.0f;
            for (size_t d = 0; d < dim; d++) acc += q[g][d] * kvm_bf16_to_f32(k[i][d]);
            s[g * lds + i] = acc * scale;
        }
}

static void s_pv_bf16(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                      const uint16_t *const *v, size_t nk, size_t dim) {
    for (size_t g = 0; g < nq; g++) {
        float *a = acc[g];
        for (size_t d = 0; d < dim; d++) a[d] *= c[g];
        for (size_t i = 0; i < nk; i++) {
            const float w = p[g * ldp + i];
            for (size_t d = 0; d < dim; d++) a[d] += w * kvm_bf16_to_f32(v[i][d]);
        }
    }
}

static int s_softmax_step(float *s, size_t lds, size_t nq, size_t nk, float *m, float *l, float *c) {
    for (size_t g = 0; g < nq; g++) {
        float *x = s + g * lds, t = -INFINITY;
        for (size_t i = 0; i < nk; i++) {
            if (!isfinite(x[i])) return (int)g;
            t = x[i] > t ? x[i] : t;
        }
        const float mn = t > m[g] ? t : m[g];
        c[g] = m[g] == -INFINITY ? 0.0f : expf(m[g] - mn);
        l[g] = l[g] * c[g] + s_exp_sum(x, nk, mn);
        m[g] = mn;
    }
    return -1;
}

const kvm_attend_kernels kvm_attend_scalar = {"scalar",  s_qk,      s_exp_sum, s_pv,          s_qk_f16,
                                                s_pv_f16,  s_qk_bf16, s_pv_bf16, s_softmax_step,
                                                NULL,      NULL};
