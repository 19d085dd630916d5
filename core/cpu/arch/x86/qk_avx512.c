/* AVX-512 kernels of the rule score (a 4x4 register tile of (query row, key
 * row) dot products, and a vector exp for the softmax) and of SnapKV (a
 * GEMM tile against keys packed by dimension). Compiled with
 * -mavx512f..., only called after run-time detection. */
#include "../../kernels.h"

#include <immintrin.h>
#include "../../simd_math.h"
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

/* 16x16 transpose in registers: r[c] lane i = r[i] lane c on return. */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 2) { /* lane L: r_i[4L], r_i+1[4L], r_i[4L+1], r_i+1[4L+1] (lo); 4L+2, 4L+3 (hi) */
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 16
    for (int q = 0; q < 16; q += 4) { /* u[4q + m], lane L: column 4L + m of rows 4q .. 4q + 3 */
        const __m512d a = _mm512_castps_pd(t[q]), b = _mm512_castps_pd(t[q + 2]);
        const __m512d c = _mm512_castps_pd(t[q + 1]), d = _mm512_castps_pd(t[q + 3]);
        u[q] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        u[q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
#pragma GCC unroll 16
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

/* Keys packed by dimension: 16 rows at a time through the register
 * transpose (paid once per tile, against 128 query rows' FMAs at Llama-8B
 * geometry). Rows of f32, or of f16 (f16 = 1) widened in the load (F16C):
 * f16 rows are read once, in place, with no f32 copy between. */
static inline __attribute__((always_inline)) void kt_pack_impl(const void *const *rows, size_t nk, size_t D, float *kt,
                                                               int f16) {
    for (size_t h = 0; h < KVM_QK_TILE; h += 16) {
        if (h >= nk) {
            for (size_t d = 0; d < D; d++) _mm512_store_ps(kt + d * KVM_QK_TILE + h, _mm512_setzero_ps());
            continue;
        }
        /* rows past nk: a masked load of nothing (no fault), zeros */
        const void *p[16];
        __mmask16 live[16];
        for (size_t i = 0; i < 16; i++) {
            p[i] = h + i < nk ? rows[h + i] : rows[0];
            live[i] = h + i < nk ? (__mmask16)0xffff : 0;
        }
        for (size_t d0 = 0; d0 < D; d0 += 16) {
            const __mmask16 md = tmask(D - d0);
            __m512 r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                r[i] = f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(md & live[i], (const uint16_t *)p[i] + d0))
                           : _mm512_maskz_loadu_ps(md & live[i], (const float *)p[i] + d0);
            transpose16(r);
            float *o = kt + d0 * KVM_QK_TILE + h;
            const size_t nd = D - d0; /* dimensions of this block: 16 but in the tail */
#pragma GCC unroll 16
            for (size_t c = 0; c < 16; c++)
                if (c < nd) _mm512_store_ps(o + c * KVM_QK_TILE, r[c]);
        }
    }
}

static void x_kt_pack(const float *const *rows, size_t nk, size_t D, float *kt) {
    kt_pack_impl((const void *const *)rows, nk, D, kt, 0);
}

static void x_kt_pack_f16(const uint16_t *const *rows, size_t nk, size_t D, float *kt) {
    kt_pack_impl((const void *const *)rows, nk, D, kt, 1);
}

/* 8 query rows x 32 keys in 16 accumulators: per dimension two packed key
 * loads and 8 broadcasts of query elements for 16 FMAs (the FMA units, not
 * the loads, are the bound), rows of logits stored as they are. */
#define QT_ROW(i)                                                    \
    do {                                                             \
        const __m512 b = _mm512_set1_ps(q[i]);                       \
        a##i##0 = _mm512_fmadd_ps(b, k0, a##i##0);                   \
        a##i##1 = _mm512_fmadd_ps(b, k1, a##i##1);                   \
    } while (0)
#define QT_OUT(i)                                                                                   \
    if (i < nrr) {                                                                                  \
        _mm512_mask_storeu_ps(o + i * ldo, m0, _mm512_mul_ps(a##i##0, vs));                         \
        if (m1) _mm512_mask_storeu_ps(o + i * ldo + 16, m1, _mm512_mul_ps(a##i##1, vs));            \
    }

static void x_qk_tile(const float *qp, size_t nr, const float *kt, size_t nk, size_t D, float scale, float *out,
                      size_t ldo, const kvm_qk_prefetch *pf) {
    const __m512 vs = _mm512_set1_ps(scale);
    const __mmask16 m0 = tmask(nk), m1 = nk > 16 ? tmask(nk - 16) : 0;
    /* the prefetch lines, a share per row block */
    const size_t lpr = pf ? (pf->bytes + 63) / 64 : 0, nl = pf ? lpr * pf->n : 0, nb = (nr + 7) / 8;
    size_t pl = 0, prow = 0, pcol = 0;
    for (size_t r0 = 0; r0 < nr; r0 += 8) {
        for (const size_t pe = r0 + 8 >= nr ? nl : nl * (r0 / 8 + 1) / nb; pl < pe; pl++) {
            _mm_prefetch(pf->base + prow * pf->stride + pcol * 64, _MM_HINT_T1);
            if (++pcol == lpr) pcol = 0, prow++;
        }
        __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
               a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00, a60 = a00, a61 = a00, a70 = a00, a71 = a00;
        const float *q = qp + r0 * D, *kp = kt;
        for (size_t d = 0; d < D; d++, q += 8, kp += KVM_QK_TILE) {
            const __m512 k0 = _mm512_load_ps(kp), k1 = _mm512_load_ps(kp + 16);
            QT_ROW(0);
            QT_ROW(1);
            QT_ROW(2);
            QT_ROW(3);
            QT_ROW(4);
            QT_ROW(5);
            QT_ROW(6);
            QT_ROW(7);
        }
        const size_t nrr = nr - r0;
        float *o = out + r0 * ldo;
        QT_OUT(0) QT_OUT(1) QT_OUT(2) QT_OUT(3) QT_OUT(4) QT_OUT(5) QT_OUT(6) QT_OUT(7)
    }
}
#undef QT_ROW
#undef QT_OUT

static float x_exp_row(float *x, size_t n, size_t nz, float *mxo) {
    __m512 mx = _mm512_set1_ps(-INFINITY), bad = _mm512_setzero_ps();
    for (size_t j = 0; j < n; j += 16) {
        const __mmask16 mk = tmask(n - j);
        const __m512 v = _mm512_maskz_loadu_ps(mk, x + j);
        mx = _mm512_mask_max_ps(mx, mk, mx, v);
        bad = _mm512_fmadd_ps(v, _mm512_setzero_ps(), bad); /* 0 unless some v is inf or NaN */
    }
    const float m = _mm512_reduce_max_ps(mx);
    const __m512 vm = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (size_t j = 0; j < n; j += 16) {
        const __mmask16 mk = tmask(n - j);
        const __m512 e = _mm512_maskz_mov_ps(mk, kvm_exp_neg512_flush(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, x + j), vm)));
        _mm512_mask_storeu_ps(x + j, tmask(nz - j), e); /* lanes in [n, nz) get 0 */
        sum = _mm512_add_ps(sum, e);
    }
    for (size_t j = (n + 15) & ~(size_t)15; j < nz; j += 16) _mm512_mask_storeu_ps(x + j, tmask(nz - j), _mm512_setzero_ps());
    *mxo = m;
    return _mm512_reduce_add_ps(bad) == 0.0f ? _mm512_reduce_add_ps(sum) : NAN;
}

/* Blocks of 64 positions, every row accumulated in registers. */
static void x_wsum(const float *e, size_t lde, const float *f, size_t nr, size_t n, float *vote) {
    size_t j = 0;
    for (; j + 64 <= n; j += 64) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t i = 0; i < nr; i++) {
            const __m512 w = _mm512_set1_ps(f[i]);
            const float *r = e + i * lde + j;
            a0 = _mm512_fmadd_ps(w, _mm512_loadu_ps(r), a0);
            a1 = _mm512_fmadd_ps(w, _mm512_loadu_ps(r + 16), a1);
            a2 = _mm512_fmadd_ps(w, _mm512_loadu_ps(r + 32), a2);
            a3 = _mm512_fmadd_ps(w, _mm512_loadu_ps(r + 48), a3);
        }
        _mm512_storeu_ps(vote + j, a0);
        _mm512_storeu_ps(vote + j + 16, a1);
        _mm512_storeu_ps(vote + j + 32, a2);
        _mm512_storeu_ps(vote + j + 48, a3);
    }
    for (; j < n; j += 16) {
        const __mmask16 mk = tmask(n - j);
        __m512 a = _mm512_setzero_ps();
        for (size_t i = 0; i < nr; i++) a = _mm512_fmadd_ps(_mm512_set1_ps(f[i]), _mm512_maskz_loadu_ps(mk, e + i * lde + j), a);
        _mm512_mask_storeu_ps(vote + j, mk, a);
    }
}

const kvm_qk_kernels kvm_qk_avx512 = {"avx512", x_qk, x_softmax_acc, x_kt_pack, x_qk_tile, x_exp_row, x_wsum, x_kt_pack_f16};
