/* Scalar reference micro-kernels for ART attention, and the run-time choice
 * of the SIMD tables. The SIMD tables are tested against these. */
#include "attend.h"
#include "../cpu/half.h"
#include "../cpu/kernels.h"

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

static const kvm_attend_kernels scalar_table = {"scalar",  s_qk,      s_exp_sum, s_pv,          s_qk_f16,
                                                s_pv_f16,  s_qk_bf16, s_pv_bf16, s_softmax_step};

const kvm_attend_kernels *kvm_attend_kernels_scalar(void) { return &scalar_table; }

#if !defined(KVMEM_HAVE_AVX2)
const kvm_attend_kernels *kvm_attend_kernels_avx2(void) { return NULL; }
#endif
#if !defined(KVMEM_HAVE_AVX512)
const kvm_attend_kernels *kvm_attend_kernels_avx512(void) { return NULL; }
#endif

const kvm_attend_kernels *kvm_attend_kernels_named(const char *name) {
    if (!name) return NULL;
    if (strcmp(name, "scalar") == 0) return kvm_attend_kernels_scalar();
    /* the CPU kernel table decides whether the instruction set is usable */
    if (!kvm_cpu_kernels_named(name)) return NULL;
    if (strcmp(name, "avx2") == 0) return kvm_attend_kernels_avx2();
    if (strcmp(name, "avx512") == 0) return kvm_attend_kernels_avx512();
    return NULL;
}

/* Follow the CPU kernel table, so KVMEM_CPU=scalar|avx2|avx512 forces both. */
const kvm_attend_kernels *kvm_attend_kernels_get(void) {
    const kvm_attend_kernels *k = kvm_attend_kernels_named(kvm_cpu_kernels_get()->name);
    return k ? k : kvm_attend_kernels_scalar();
}
