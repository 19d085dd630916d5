/* AVX2 + FMA micro-kernels for ART attention. Compiled with -mavx2 -mfma;
 * only called after run-time detection. Dimension tails (head_dim not a
 * multiple of 8) run scalar. */
#include "../../half.h"
#include "../../kernels.h"

#include <immintrin.h>
#include "../../simd_math.h"
#include <math.h>

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Row loads of f32 (dt 0), f16 (1) or bf16 (2), converted in registers,
 * vector and scalar. */
static inline __attribute__((always_inline)) __m256 ld8(const void *row, size_t d, int dt) {
    if (dt == 1) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + d)));
    if (dt == 2)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + d))), 16));
    return _mm256_loadu_ps((const float *)row + d);
}
static inline __attribute__((always_inline)) float ld1(const void *row, size_t d, int dt) {
    if (dt == 1) return kvm_f16_to_f32(((const uint16_t *)row)[d]);
    if (dt == 2) return kvm_bf16_to_f32(((const uint16_t *)row)[d]);
    return ((const float *)row)[d];
}

static inline __attribute__((always_inline)) void qk_impl(const float *const *q, size_t nq, const void *const *k,
                                                          size_t nk, size_t dim, float scale, float *s, size_t lds,
                                                          int f16) {
    const size_t full = dim & ~(size_t)7;
    for (size_t g0 = 0; g0 < nq; g0 += 4) {
        const size_t ng = nq - g0 < 4 ? nq - g0 : 4;
        const float *qq[4];
        for (size_t g = 0; g < 4; g++) qq[g] = q[g0 + (g < ng ? g : 0)];
        for (size_t i = 0; i < nk; i++) {
            const void *k0 = k[i];
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (size_t d = 0; d < full; d += 8) {
                __m256 x = ld8(k0, d, f16);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qq[0] + d), x, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qq[1] + d), x, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(qq[2] + d), x, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(qq[3] + d), x, a3);
            }
            float r[4] = {hsum256(a0), hsum256(a1), hsum256(a2), hsum256(a3)};
            for (size_t g = 0; g < ng; g++) {
                for (size_t d = full; d < dim; d++) r[g] += qq[g][d] * ld1(k0, d, f16);
                s[(g0 + g) * lds + i] = r[g] * scale;
            }
        }
    }
}

static void a_qk(const float *const *q, size_t nq, const float *const *k, size_t nk, size_t dim,
                 float scale, float *s, size_t lds) {
    qk_impl(q, nq, (const void *const *)k, nk, dim, scale, s, lds, 0);
}

static void a_qk_f16(const float *const *q, size_t nq, const uint16_t *const *k, size_t nk, size_t dim,
                     float scale, float *s, size_t lds) {
    qk_impl(q, nq, (const void *const *)k, nk, dim, scale, s, lds, 1);
}

static void a_qk_bf16(const float *const *q, size_t nq, const uint16_t *const *k, size_t nk, size_t dim,
                      float scale, float *s, size_t lds) {
    qk_impl(q, nq, (const void *const *)k, nk, dim, scale, s, lds, 2);
}

static float a_exp_sum(float *s, size_t n, float m) {
    const __m256 vm = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = kvm_exp_neg256(_mm256_sub_ps(_mm256_loadu_ps(s + i), vm));
        _mm256_storeu_ps(s + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    float t = hsum256(sum);
    for (; i < n; i++) {
        s[i] = expf(s[i] - m);
        t += s[i];
    }
    return t;
}

static inline __attribute__((always_inline)) void pv_impl(float *const *acc, size_t nq, const float *c,
                                                          const float *p, size_t ldp, const void *const *v,
                                                          size_t nk, size_t dim, int f16) {
    const size_t full = dim & ~(size_t)7;
    for (size_t g0 = 0; g0 < nq; g0 += 4) {
        const size_t ng = nq - g0 < 4 ? nq - g0 : 4;
        const float *pp[4];
        for (size_t g = 0; g < 4; g++) pp[g] = p + (g0 + (g < ng ? g : 0)) * ldp;
        /* rows beyond ng alias row g0 and are not stored */
        float *const r0 = acc[g0], *const r1 = acc[g0 + (ng > 1 ? 1 : 0)];
        float *const r2 = acc[g0 + (ng > 2 ? 2 : 0)], *const r3 = acc[g0 + (ng > 3 ? 3 : 0)];
        const __m256 c0 = _mm256_set1_ps(c[g0]), c1 = _mm256_set1_ps(c[g0 + (ng > 1 ? 1 : 0)]);
        const __m256 c2 = _mm256_set1_ps(c[g0 + (ng > 2 ? 2 : 0)]), c3 = _mm256_set1_ps(c[g0 + (ng > 3 ? 3 : 0)]);
        for (size_t d = 0; d < full; d += 8) {
            /* named accumulators stay in registers */
            __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(r0 + d), c0), a1 = _mm256_mul_ps(_mm256_loadu_ps(r1 + d), c1);
            __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(r2 + d), c2), a3 = _mm256_mul_ps(_mm256_loadu_ps(r3 + d), c3);
            for (size_t i = 0; i < nk; i++) {
                __m256 x = ld8(v[i], d, f16);
                a0 = _mm256_fmadd_ps(_mm256_set1_ps(pp[0][i]), x, a0);
                a1 = _mm256_fmadd_ps(_mm256_set1_ps(pp[1][i]), x, a1);
                a2 = _mm256_fmadd_ps(_mm256_set1_ps(pp[2][i]), x, a2);
                a3 = _mm256_fmadd_ps(_mm256_set1_ps(pp[3][i]), x, a3);
            }
            if (ng > 3) _mm256_storeu_ps(r3 + d, a3);
            if (ng > 2) _mm256_storeu_ps(r2 + d, a2);
            if (ng > 1) _mm256_storeu_ps(r1 + d, a1);
            _mm256_storeu_ps(r0 + d, a0);
        }
        for (size_t g = 0; g < ng; g++)
            for (size_t d = full; d < dim; d++) {
                float t = acc[g0 + g][d] * c[g0 + g];
                for (size_t i = 0; i < nk; i++) t += pp[g][i] * ld1(v[i], d, f16);
                acc[g0 + g][d] = t;
            }
    }
}

static void a_pv(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                 const float *const *v, size_t nk, size_t dim) {
    pv_impl(acc, nq, c, p, ldp, (const void *const *)v, nk, dim, 0);
}

static void a_pv_f16(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                     const uint16_t *const *v, size_t nk, size_t dim) {
    pv_impl(acc, nq, c, p, ldp, (const void *const *)v, nk, dim, 1);
}

static void a_pv_bf16(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                      const uint16_t *const *v, size_t nk, size_t dim) {
    pv_impl(acc, nq, c, p, ldp, (const void *const *)v, nk, dim, 2);
}

/* Per row: the maximum and finiteness in one pass, then the exps. */
static int a_softmax_step(float *s, size_t lds, size_t nq, size_t nk, float *m, float *l, float *c) {
    for (size_t g = 0; g < nq; g++) {
        float *x = s + g * lds;
        __m256 mx = _mm256_set1_ps(-INFINITY), bad = _mm256_setzero_ps();
        size_t i = 0;
        for (; i + 8 <= nk; i += 8) {
            const __m256 v = _mm256_loadu_ps(x + i);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_NEQ_UQ));
            mx = _mm256_max_ps(mx, v);
        }
        float lanes[8], t = -INFINITY;
        if (_mm256_movemask_ps(bad)) return (int)g;
        _mm256_storeu_ps(lanes, mx);
        for (int u = 0; u < 8; u++) t = lanes[u] > t ? lanes[u] : t;
        for (; i < nk; i++) {
            if (!isfinite(x[i])) return (int)g;
            t = x[i] > t ? x[i] : t;
        }
        const float mn = t > m[g] ? t : m[g];
        c[g] = m[g] == -INFINITY ? 0.0f : expf(m[g] - mn);
        l[g] = l[g] * c[g] + a_exp_sum(x, nk, mn);
        m[g] = mn;
    }
    return -1;
}

const kvm_attend_kernels kvm_attend_avx2 = {"avx2",   a_qk,      a_exp_sum, a_pv,          a_qk_f16,
                                              a_pv_f16, a_qk_bf16, a_pv_bf16, a_softmax_step};
