/* AVX-512 micro-kernels for ART attention. Compiled with -mavx512f
 * -mavx512bw -mavx512vl -mfma; only called after run-time detection.
 * Dimension tails use masked loads, so any head_dim works. */
#include "attend.h"

#include <immintrin.h>

static inline __mmask16 tail_mask(size_t n) { return (__mmask16)((1u << n) - 1u); }

/* Four queries against two keys per step: eight independent FMA chains. */
static void x_qk(const float *const *q, size_t nq, const float *const *k, size_t nk, size_t dim,
                 float scale, float *s, size_t lds) {
    const size_t full = dim & ~(size_t)15;
    const __mmask16 tm = tail_mask(dim - full);
    for (size_t g0 = 0; g0 < nq; g0 += 4) {
        const size_t ng = nq - g0 < 4 ? nq - g0 : 4;
        const float *qq[4];
        for (size_t g = 0; g < 4; g++) qq[g] = q[g0 + (g < ng ? g : 0)];
        size_t i = 0;
        for (; i + 2 <= nk; i += 2) {
            const float *k0 = k[i], *k1 = k[i + 1];
            __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
                   a30 = a00, a31 = a00;
            for (size_t d = 0; d < dim; d += 16) {
                __m512 x0, x1, y0, y1, y2, y3;
                if (d < full) {
                    x0 = _mm512_loadu_ps(k0 + d), x1 = _mm512_loadu_ps(k1 + d);
                    y0 = _mm512_loadu_ps(qq[0] + d), y1 = _mm512_loadu_ps(qq[1] + d);
                    y2 = _mm512_loadu_ps(qq[2] + d), y3 = _mm512_loadu_ps(qq[3] + d);
                } else {
                    x0 = _mm512_maskz_loadu_ps(tm, k0 + d), x1 = _mm512_maskz_loadu_ps(tm, k1 + d);
                    y0 = _mm512_maskz_loadu_ps(tm, qq[0] + d), y1 = _mm512_maskz_loadu_ps(tm, qq[1] + d);
                    y2 = _mm512_maskz_loadu_ps(tm, qq[2] + d), y3 = _mm512_maskz_loadu_ps(tm, qq[3] + d);
                }
                a00 = _mm512_fmadd_ps(y0, x0, a00), a01 = _mm512_fmadd_ps(y0, x1, a01);
                a10 = _mm512_fmadd_ps(y1, x0, a10), a11 = _mm512_fmadd_ps(y1, x1, a11);
                a20 = _mm512_fmadd_ps(y2, x0, a20), a21 = _mm512_fmadd_ps(y2, x1, a21);
                a30 = _mm512_fmadd_ps(y3, x0, a30), a31 = _mm512_fmadd_ps(y3, x1, a31);
            }
            float r[8] = {_mm512_reduce_add_ps(a00), _mm512_reduce_add_ps(a01), _mm512_reduce_add_ps(a10),
                          _mm512_reduce_add_ps(a11), _mm512_reduce_add_ps(a20), _mm512_reduce_add_ps(a21),
                          _mm512_reduce_add_ps(a30), _mm512_reduce_add_ps(a31)};
            for (size_t g = 0; g < ng; g++) {
                s[(g0 + g) * lds + i] = r[2 * g] * scale;
                s[(g0 + g) * lds + i + 1] = r[2 * g + 1] * scale;
            }
        }
        for (; i < nk; i++) {
            const float *k0 = k[i];
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (size_t d = 0; d < dim; d += 16) {
                __mmask16 m = d < full ? (__mmask16)0xffff : tm;
                __m512 x0 = _mm512_maskz_loadu_ps(m, k0 + d);
                a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qq[0] + d), x0, a0);
                a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qq[1] + d), x0, a1);
                a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qq[2] + d), x0, a2);
                a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qq[3] + d), x0, a3);
            }
            float r[4] = {_mm512_reduce_add_ps(a0), _mm512_reduce_add_ps(a1), _mm512_reduce_add_ps(a2),
                          _mm512_reduce_add_ps(a3)};
            for (size_t g = 0; g < ng; g++) s[(g0 + g) * lds + i] = r[g] * scale;
        }
    }
}

/* exp(x) for x <= 0 (x >= -87.3 is exact to ~2 ulp; below, a tiny positive
 * number instead of 0, harmless against a running sum >= 1). Range
 * reduction by ln 2 in two parts, a degree-6 polynomial, then scalef. */
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.33654f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

static float x_exp_sum(float *s, size_t n, float m) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    size_t i = 0;
    for (; i < n; i += 16) {
        __mmask16 msk = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(msk, s + i), vm));
        _mm512_mask_storeu_ps(s + i, msk, e);
        sum = _mm512_mask_add_ps(sum, msk, sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* Four queries by two 16-wide column chunks: eight accumulators in
 * registers while the keys stream past. */
static void x_pv(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                 const float *const *v, size_t nk, size_t dim) {
    for (size_t g0 = 0; g0 < nq; g0 += 4) {
        const size_t ng = nq - g0 < 4 ? nq - g0 : 4;
        for (size_t d = 0; d < dim; d += 32) {
            const __mmask16 m0 = dim - d >= 16 ? (__mmask16)0xffff : tail_mask(dim - d);
            const __mmask16 m1 = dim - d >= 32 ? (__mmask16)0xffff : dim - d > 16 ? tail_mask(dim - d - 16) : 0;
            __m512 a[4][2];
            for (size_t g = 0; g < 4; g++) {
                size_t gg = g < ng ? g0 + g : g0;
                __m512 cg = _mm512_set1_ps(c[gg]);
                a[g][0] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m0, acc[gg] + d), cg);
                a[g][1] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, acc[gg] + d + 16), cg);
            }
            const float *p0 = p + g0 * ldp;
            const float *p1 = p + (g0 + (ng > 1 ? 1 : 0)) * ldp;
            const float *p2 = p + (g0 + (ng > 2 ? 2 : 0)) * ldp;
            const float *p3 = p + (g0 + (ng > 3 ? 3 : 0)) * ldp;
            for (size_t i = 0; i < nk; i++) {
                __m512 v0 = _mm512_maskz_loadu_ps(m0, v[i] + d), v1 = _mm512_maskz_loadu_ps(m1, v[i] + d + 16);
                __m512 w0 = _mm512_set1_ps(p0[i]), w1 = _mm512_set1_ps(p1[i]);
                __m512 w2 = _mm512_set1_ps(p2[i]), w3 = _mm512_set1_ps(p3[i]);
                a[0][0] = _mm512_fmadd_ps(w0, v0, a[0][0]), a[0][1] = _mm512_fmadd_ps(w0, v1, a[0][1]);
                a[1][0] = _mm512_fmadd_ps(w1, v0, a[1][0]), a[1][1] = _mm512_fmadd_ps(w1, v1, a[1][1]);
                a[2][0] = _mm512_fmadd_ps(w2, v0, a[2][0]), a[2][1] = _mm512_fmadd_ps(w2, v1, a[2][1]);
                a[3][0] = _mm512_fmadd_ps(w3, v0, a[3][0]), a[3][1] = _mm512_fmadd_ps(w3, v1, a[3][1]);
            }
            for (size_t g = 0; g < ng; g++) {
                _mm512_mask_storeu_ps(acc[g0 + g] + d, m0, a[g][0]);
                _mm512_mask_storeu_ps(acc[g0 + g] + d + 16, m1, a[g][1]);
            }
        }
    }
}

static const kvm_attend_kernels avx512_table = {"avx512", x_qk, x_exp_sum, x_pv};

const kvm_attend_kernels *kvm_attend_kernels_avx512(void) { return &avx512_table; }
