/* AVX-512 kernels of the rule score: a 4x4 register tile of (query row, key
 * row) dot products, and a vector exp for the softmax. Compiled with
 * -mavx512f..., only called after run-time detection. */
#include "qk_kernels.h"

#include <immintrin.h>
#include "../cpu/simd_exp.h"
#include <math.h>

static inline __mmask16 tmask(size_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

/* Transpose-and-add tree: 45 shuffles/adds instead of 16 full reductions.
 * Returns r with r[i] = sum of the lanes of a[i / 4][i % 4]. */
static inline __m512 hsum16(__m512 a[4][4]) {
    const __m512 *x = &a[0][0];
    __m512 s1[8], s2[4];
    for (int p = 0; p < 8; p++) /* per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3] */
        s1[p] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * p], x[2 * p + 1]), _mm512_unpackhi_ps(x[2 * p], x[2 * p + 1]));
    for (int q = 0; q < 4; q++) { /* per lane: the lane's partial sums of rows 4q .. 4q+3 */
        __m512d u = _mm512_castps_pd(s1[2 * q]), v = _mm512_castps_pd(s1[2 * q + 1]);
        s2[q] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(u, v)), _mm512_castpd_ps(_mm512_unpackhi_pd(u, v)));
    }
    __m512 u0 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[0], s2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(s2[0], s2[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 u1 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[2], s2[3], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(s2[2], s2[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
}

static void x_qk(const float *m, size_t G, size_t D, const float *k, size_t n, size_t kstride,
                 float scale, float *out, size_t out_stride) {
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = k + j * kstride, *k1 = k0 + kstride, *k2 = k1 + kstride, *k3 = k2 + kstride;
        size_t g = 0;
        for (; g + 4 <= G; g += 4) {
            const float *m0 = m + g * D, *m1 = m0 + D, *m2 = m1 + D, *m3 = m2 + D;
            __m512 a[4][4];
            for (int u = 0; u < 4; u++)
                for (int v = 0; v < 4; v++) a[u][v] = _mm512_setzero_ps();
            for (size_t d = 0; d < D; d += 16) {
                __mmask16 mk = tmask(D - d);
                __m512 kv[4] = {_mm512_maskz_loadu_ps(mk, k0 + d), _mm512_maskz_loadu_ps(mk, k1 + d),
                                _mm512_maskz_loadu_ps(mk, k2 + d), _mm512_maskz_loadu_ps(mk, k3 + d)};
                __m512 mv[4] = {_mm512_maskz_loadu_ps(mk, m0 + d), _mm512_maskz_loadu_ps(mk, m1 + d),
                                _mm512_maskz_loadu_ps(mk, m2 + d), _mm512_maskz_loadu_ps(mk, m3 + d)};
                for (int u = 0; u < 4; u++)
                    for (int v = 0; v < 4; v++) a[u][v] = _mm512_fmadd_ps(mv[u], kv[v], a[u][v]);
            }
            /* 16 horizontal sums at once: r[4u + v] = sum(a[u][v]) */
            __m512 r = _mm512_mul_ps(hsum16(a), _mm512_set1_ps(scale));
            _mm_storeu_ps(out + (g + 0) * out_stride + j, _mm512_extractf32x4_ps(r, 0));
            _mm_storeu_ps(out + (g + 1) * out_stride + j, _mm512_extractf32x4_ps(r, 1));
            _mm_storeu_ps(out + (g + 2) * out_stride + j, _mm512_extractf32x4_ps(r, 2));
            _mm_storeu_ps(out + (g + 3) * out_stride + j, _mm512_extractf32x4_ps(r, 3));
        }
        for (; g < G; g++) {
            const float *mr = m + g * D;
            __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            for (size_t d = 0; d < D; d += 16) {
                __mmask16 mk = tmask(D - d);
                __m512 mv = _mm512_maskz_loadu_ps(mk, mr + d);
                a[0] = _mm512_fmadd_ps(mv, _mm512_maskz_loadu_ps(mk, k0 + d), a[0]);
                a[1] = _mm512_fmadd_ps(mv, _mm512_maskz_loadu_ps(mk, k1 + d), a[1]);
                a[2] = _mm512_fmadd_ps(mv, _mm512_maskz_loadu_ps(mk, k2 + d), a[2]);
                a[3] = _mm512_fmadd_ps(mv, _mm512_maskz_loadu_ps(mk, k3 + d), a[3]);
            }
            for (int v = 0; v < 4; v++) out[g * out_stride + j + (size_t)v] = _mm512_reduce_add_ps(a[v]) * scale;
        }
    }
    for (; j < n; j++) {
        const float *kr = k + j * kstride;
        for (size_t g = 0; g < G; g++) {
            const float *mr = m + g * D;
            __m512 a = _mm512_setzero_ps();
            for (size_t d = 0; d < D; d += 16) {
                __mmask16 mk = tmask(D - d);
                a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, mr + d), _mm512_maskz_loadu_ps(mk, kr + d), a);
            }
            out[g * out_stride + j] = _mm512_reduce_add_ps(a) * scale;
        }
    }
}

static void x_softmax_acc(float *x, size_t n, float *acc) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (size_t j = 0; j < n; j += 16) {
        __mmask16 mk = tmask(n - j);
        mx = _mm512_mask_max_ps(mx, mk, mx, _mm512_maskz_loadu_ps(mk, x + j));
    }
    __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx)), sum = _mm512_setzero_ps();
    for (size_t j = 0; j < n; j += 16) {
        __mmask16 mk = tmask(n - j);
        __m512 e = _mm512_maskz_mov_ps(mk, kvm_exp_neg512_flush(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, x + j), m)));
        _mm512_mask_storeu_ps(x + j, mk, e);
        sum = _mm512_add_ps(sum, e);
    }
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (size_t j = 0; j < n; j += 16) {
        __mmask16 mk = tmask(n - j);
        __m512 a = _mm512_maskz_loadu_ps(mk, acc + j);
        _mm512_mask_storeu_ps(acc + j, mk, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, x + j), inv, a));
    }
}

/* 16 keys x 16 query rows in 16 accumulators, one per key: per dimension
 * one packed row load and 16 FMAs with the key element broadcast from
 * memory, so the FMA unit is the bound; then a 16x16 transpose turns the
 * keys' columns into the query rows' runs of 16 logits. */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) { /* lane L: r_i[4L], r_i+1[4L], r_i[4L+1], r_i+1[4L+1] (lo); 4L+2, 4L+3 (hi) */
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int q = 0; q < 16; q += 4) { /* u[4q + m], lane L: column 4L + m of rows 4q .. 4q + 3 */
        const __m512d a = _mm512_castps_pd(t[q]), b = _mm512_castps_pd(t[q + 2]);
        const __m512d c = _mm512_castps_pd(t[q + 1]), d = _mm512_castps_pd(t[q + 3]);
        u[q] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        u[q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int m = 0; m < 4; m++) { /* column 4L + m: lane q of it is lane L of u[4q + m] */
        const __m512 w0 = _mm512_shuffle_f32x4(u[m], u[4 + m], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512 w1 = _mm512_shuffle_f32x4(u[m], u[4 + m], _MM_SHUFFLE(3, 2, 3, 2));
        const __m512 w2 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512 w3 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], _MM_SHUFFLE(3, 2, 3, 2));
        r[m] = _mm512_shuffle_f32x4(w0, w2, _MM_SHUFFLE(2, 0, 2, 0));
        r[4 + m] = _mm512_shuffle_f32x4(w0, w2, _MM_SHUFFLE(3, 1, 3, 1));
        r[8 + m] = _mm512_shuffle_f32x4(w1, w3, _MM_SHUFFLE(2, 0, 2, 0));
        r[12 + m] = _mm512_shuffle_f32x4(w1, w3, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

static void x_qk16(const float *qp, const float *const *k, size_t nk, size_t D, float scale, float *out, size_t ldo) {
    static const float zero_row[1] = {0.0f};
    const float *kr[16];
    for (size_t j = 0; j < 16; j++) kr[j] = j < nk ? k[j] : zero_row;
    const size_t kd = nk == 16 ? 1 : 0; /* missing keys read element 0 of a zero row */
    __m512 a[16];
    for (int j = 0; j < 16; j++) a[j] = _mm512_setzero_ps();
    const float *k0 = kr[0], *k1 = kr[1], *k2 = kr[2], *k3 = kr[3], *k4 = kr[4], *k5 = kr[5], *k6 = kr[6],
                *k7 = kr[7], *k8 = kr[8], *k9 = kr[9], *k10 = kr[10], *k11 = kr[11], *k12 = kr[12], *k13 = kr[13],
                *k14 = kr[14], *k15 = kr[15];
    if (kd) {
        __m512 a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5], a6 = a[6], a7 = a[7], a8 = a[8],
               a9 = a[9], a10 = a[10], a11 = a[11], a12 = a[12], a13 = a[13], a14 = a[14], a15 = a[15];
        for (size_t d = 0; d < D; d++) {
            const __m512 b = _mm512_load_ps(qp + d * 16);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(k0[d]), b, a0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(k1[d]), b, a1);
            a2 = _mm512_fmadd_ps(_mm512_set1_ps(k2[d]), b, a2);
            a3 = _mm512_fmadd_ps(_mm512_set1_ps(k3[d]), b, a3);
            a4 = _mm512_fmadd_ps(_mm512_set1_ps(k4[d]), b, a4);
            a5 = _mm512_fmadd_ps(_mm512_set1_ps(k5[d]), b, a5);
            a6 = _mm512_fmadd_ps(_mm512_set1_ps(k6[d]), b, a6);
            a7 = _mm512_fmadd_ps(_mm512_set1_ps(k7[d]), b, a7);
            a8 = _mm512_fmadd_ps(_mm512_set1_ps(k8[d]), b, a8);
            a9 = _mm512_fmadd_ps(_mm512_set1_ps(k9[d]), b, a9);
            a10 = _mm512_fmadd_ps(_mm512_set1_ps(k10[d]), b, a10);
            a11 = _mm512_fmadd_ps(_mm512_set1_ps(k11[d]), b, a11);
            a12 = _mm512_fmadd_ps(_mm512_set1_ps(k12[d]), b, a12);
            a13 = _mm512_fmadd_ps(_mm512_set1_ps(k13[d]), b, a13);
            a14 = _mm512_fmadd_ps(_mm512_set1_ps(k14[d]), b, a14);
            a15 = _mm512_fmadd_ps(_mm512_set1_ps(k15[d]), b, a15);
        }
        a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3, a[4] = a4, a[5] = a5, a[6] = a6, a[7] = a7;
        a[8] = a8, a[9] = a9, a[10] = a10, a[11] = a11, a[12] = a12, a[13] = a13, a[14] = a14, a[15] = a15;
    } else { /* a partial block (the last keys): simple, rare */
        for (size_t d = 0; d < D; d++) {
            const __m512 b = _mm512_load_ps(qp + d * 16);
            for (size_t j = 0; j < nk; j++) a[j] = _mm512_fmadd_ps(_mm512_set1_ps(kr[j][d]), b, a[j]);
        }
    }
    transpose16(a);
    const __m512 vs = _mm512_set1_ps(scale);
    const __mmask16 m = nk >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nk) - 1u);
    for (int r = 0; r < 16; r++) _mm512_mask_storeu_ps(out + (size_t)r * ldo, m, _mm512_mul_ps(a[r], vs));
}

static const kvm_qk_kernels k_avx512 = {"avx512", x_qk, x_softmax_acc, x_qk16};
const kvm_qk_kernels *kvm_qk_kernels_avx512(void) { return &k_avx512; }
