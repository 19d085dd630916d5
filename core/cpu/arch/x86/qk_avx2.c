/* AVX2 + FMA kernels of the rule score (a 4x2 register tile of dot products
 * and a vector exp) and of SnapKV (keys packed through an 8x8 register
 * transpose, a 4 x 16 GEMM tile against them).
 * Only called after run-time detection. */
#include "../../kernels.h"

#include <immintrin.h>
#include "../../simd_math.h"
#include <math.h>
#include <string.h>

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float dot_tail(const float *a, const float *b, size_t d0, size_t D) {
    float s = 0.0f;
    for (size_t d = d0; d < D; d++) s += a[d] * b[d];
    return s;
}

static void x_qk(const float *m, size_t G, size_t D, const float *k, size_t n, size_t kstride,
                 float scale, float *out, size_t out_stride) {
    const size_t D8 = D & ~(size_t)7;
    size_t j = 0;
    for (; j + 2 <= n; j += 2) {
        const float *k0 = k + j * kstride, *k1 = k0 + kstride;
        size_t g = 0;
        for (; g + 4 <= G; g += 4) {
            const float *mr[4] = {m + g * D, m + (g + 1) * D, m + (g + 2) * D, m + (g + 3) * D};
            __m256 a[4][2];
            for (int u = 0; u < 4; u++) a[u][0] = a[u][1] = _mm256_setzero_ps();
            for (size_t d = 0; d < D8; d += 8) {
                __m256 kv0 = _mm256_loadu_ps(k0 + d), kv1 = _mm256_loadu_ps(k1 + d);
                for (int u = 0; u < 4; u++) {
                    __m256 mv = _mm256_loadu_ps(mr[u] + d);
                    a[u][0] = _mm256_fmadd_ps(mv, kv0, a[u][0]);
                    a[u][1] = _mm256_fmadd_ps(mv, kv1, a[u][1]);
                }
            }
            for (int u = 0; u < 4; u++) {
                out[(g + (size_t)u) * out_stride + j] = (hsum256(a[u][0]) + dot_tail(mr[u], k0, D8, D)) * scale;
                out[(g + (size_t)u) * out_stride + j + 1] = (hsum256(a[u][1]) + dot_tail(mr[u], k1, D8, D)) * scale;
            }
        }
        for (; g < G; g++) {
            const float *mg = m + g * D;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0;
            for (size_t d = 0; d < D8; d += 8) {
                __m256 mv = _mm256_loadu_ps(mg + d);
                a0 = _mm256_fmadd_ps(mv, _mm256_loadu_ps(k0 + d), a0);
                a1 = _mm256_fmadd_ps(mv, _mm256_loadu_ps(k1 + d), a1);
            }
            out[g * out_stride + j] = (hsum256(a0) + dot_tail(mg, k0, D8, D)) * scale;
            out[g * out_stride + j + 1] = (hsum256(a1) + dot_tail(mg, k1, D8, D)) * scale;
        }
    }
    for (; j < n; j++) {
        const float *kr = k + j * kstride;
        for (size_t g = 0; g < G; g++) {
            const float *mg = m + g * D;
            __m256 a = _mm256_setzero_ps();
            for (size_t d = 0; d < D8; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(mg + d), _mm256_loadu_ps(kr + d), a);
            out[g * out_stride + j] = (hsum256(a) + dot_tail(mg, kr, D8, D)) * scale;
        }
    }
}

/* x[j] = exp(x[j] - mx) for j < n, in place; returns their sum. */
static float exp_sum(float *x, size_t n, float mx) {
    const size_t n8 = n & ~(size_t)7;
    const __m256 m = _mm256_set1_ps(mx);
    __m256 sv = _mm256_setzero_ps();
    for (size_t j = 0; j < n8; j += 8) {
        const __m256 e = kvm_exp_neg256_flush(_mm256_sub_ps(_mm256_loadu_ps(x + j), m));
        _mm256_storeu_ps(x + j, e);
        sv = _mm256_add_ps(sv, e);
    }
    float sum = hsum256(sv);
    for (size_t j = n8; j < n; j++) {
        x[j] = expf(x[j] - mx);
        sum += x[j];
    }
    return sum;
}

static void x_softmax_acc(float *x, size_t n, float *acc) {
    const size_t n8 = n & ~(size_t)7;
    __m256 mxv = _mm256_set1_ps(-INFINITY);
    for (size_t j = 0; j < n8; j += 8) mxv = _mm256_max_ps(mxv, _mm256_loadu_ps(x + j));
    float tmp[8], mx = -INFINITY;
    _mm256_storeu_ps(tmp, mxv);
    for (int i = 0; i < 8; i++) mx = tmp[i] > mx ? tmp[i] : mx;
    for (size_t j = n8; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    float sum = exp_sum(x, n, mx);
    float inv = 1.0f / sum;
    __m256 iv = _mm256_set1_ps(inv);
    for (size_t j = 0; j < n8; j += 8)
        _mm256_storeu_ps(acc + j, _mm256_fmadd_ps(_mm256_loadu_ps(x + j), iv, _mm256_loadu_ps(acc + j)));
    for (size_t j = n8; j < n; j++) acc[j] += x[j] * inv;
}

/* 4 query rows x 16 keys in 8 named accumulators (with the two key
 * vectors and a broadcast, 11 registers): an array of accumulators indexed
 * in a loop was kept on the stack by gcc, a load and a store around every
 * FMA (the AVX2 SnapKV ran at a fifth of the AVX-512 speed). */
#define QT_ROW(u)                                                   \
    do {                                                            \
        const __m256 b = _mm256_broadcast_ss(q + u);                \
        a##u##0 = _mm256_fmadd_ps(b, k0, a##u##0);                  \
        a##u##1 = _mm256_fmadd_ps(b, k1, a##u##1);                  \
    } while (0)
#define QT_OUT(u)                                                                       \
    if (u < nrr) {                                                                      \
        float *o = out + (r0 + u) * ldo + h;                                            \
        if (nj == 16) {                                                                 \
            _mm256_storeu_ps(o, _mm256_mul_ps(a##u##0, vs));                            \
            _mm256_storeu_ps(o + 8, _mm256_mul_ps(a##u##1, vs));                        \
        } else {                                                                        \
            float t[16];                                                                \
            _mm256_storeu_ps(t, _mm256_mul_ps(a##u##0, vs));                            \
            _mm256_storeu_ps(t + 8, _mm256_mul_ps(a##u##1, vs));                        \
            for (size_t j = 0; j < nj; j++) o[j] = t[j];                                \
        }                                                                               \
    }

static void x_qk_tile(const float *qp, size_t nr, const float *kt, size_t nk, size_t D, float scale, float *out,
                      size_t ldo, const kvm_qk_prefetch *pf) {
    const __m256 vs = _mm256_set1_ps(scale);
    /* the prefetch lines, a share per row block */
    const size_t lpr = pf ? (pf->bytes + 63) / 64 : 0, nl = pf ? lpr * pf->n : 0, nb = (nr + 3) / 4;
    size_t pl = 0, prow = 0, pcol = 0;
    for (size_t r0 = 0; r0 < nr; r0 += 4) {
        for (const size_t pe = r0 + 4 >= nr ? nl : nl * (r0 / 4 + 1) / nb; pl < pe; pl++) {
            _mm_prefetch(pf->base + prow * pf->stride + pcol * 64, _MM_HINT_T1);
            if (++pcol == lpr) pcol = 0, prow++;
        }
        const size_t nrr = nr - r0;
        for (size_t h = 0; h < nk; h += 16) {
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
                   a31 = a00;
            const float *q = qp + (r0 / 8) * D * 8 + r0 % 8, *kp = kt + h;
            for (size_t d = 0; d < D; d++, q += 8, kp += KVM_QK_TILE) {
                const __m256 k0 = _mm256_load_ps(kp), k1 = _mm256_load_ps(kp + 8);
                QT_ROW(0);
                QT_ROW(1);
                QT_ROW(2);
                QT_ROW(3);
            }
            const size_t nj = nk - h < 16 ? nk - h : 16;
            QT_OUT(0) QT_OUT(1) QT_OUT(2) QT_OUT(3)
        }
    }
}
#undef QT_ROW
#undef QT_OUT

/* 8x8 transpose in registers: r[c] lane i = r[i] lane c on return. */
static inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 8
    for (int q = 0; q < 8; q += 4) { /* u[q + m], 128-bit half L: column 4L + m of rows q .. q + 3 */
        u[q] = _mm256_shuffle_ps(t[q], t[q + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[q + 1] = _mm256_shuffle_ps(t[q], t[q + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[q + 2] = _mm256_shuffle_ps(t[q + 1], t[q + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[q + 3] = _mm256_shuffle_ps(t[q + 1], t[q + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) {
        r[m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x20);
        r[4 + m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x31);
    }
}

/* Keys packed by dimension: 8 rows at a time through the register
 * transpose, each row read once as whole vectors (the plain loop reads one
 * element per row per store). Rows of f32, or of f16 (f16 = 1) widened in
 * the load (F16C): f16 rows are read in place, with no f32 copy between.
 * Rows past nk are zeros, never read; the last dimensions (D % 8) are read
 * through a masked load (f32) or a zero-filled copy (f16). */
static inline __attribute__((always_inline)) void kt_pack_impl(const void *const *rows, size_t nk, size_t D, float *kt,
                                                               int f16) {
    for (size_t h = 0; h < KVM_QK_TILE; h += 8) {
        const size_t live = nk > h ? (nk - h < 8 ? nk - h : 8) : 0;
        if (!live) {
            for (size_t d = 0; d < D; d++) _mm256_store_ps(kt + d * KVM_QK_TILE + h, _mm256_setzero_ps());
            continue;
        }
        for (size_t d0 = 0; d0 < D; d0 += 8) {
            const size_t nd = D - d0 < 8 ? D - d0 : 8;
            const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nd), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            __m256 r[8];
#pragma GCC unroll 8
            for (size_t i = 0; i < 8; i++) {
                if (i >= live) {
                    r[i] = _mm256_setzero_ps();
                } else if (f16) {
                    const uint16_t *src = (const uint16_t *)rows[h + i] + d0;
                    uint16_t tail[8] = {0};
                    if (nd < 8) memcpy(tail, src, nd * sizeof *tail), src = tail;
                    r[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)src));
                } else {
                    r[i] = nd == 8 ? _mm256_loadu_ps((const float *)rows[h + i] + d0)
                                   : _mm256_maskload_ps((const float *)rows[h + i] + d0, mk);
                }
            }
            transpose8(r);
            float *o = kt + d0 * KVM_QK_TILE + h;
#pragma GCC unroll 8
            for (size_t c = 0; c < 8; c++)
                if (c < nd) _mm256_store_ps(o + c * KVM_QK_TILE, r[c]);
        }
    }
}

static void x_kt_pack(const float *const *rows, size_t nk, size_t D, float *kt) {
    kt_pack_impl((const void *const *)rows, nk, D, kt, 0);
}

static void x_kt_pack_f16(const uint16_t *const *rows, size_t nk, size_t D, float *kt) {
    kt_pack_impl((const void *const *)rows, nk, D, kt, 1);
}

static float x_exp_row(float *x, size_t n, size_t nz, float *mxo) {
    const size_t n8 = n & ~(size_t)7;
    __m256 mxv = _mm256_set1_ps(-INFINITY), bad = _mm256_setzero_ps();
    for (size_t j = 0; j < n8; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        mxv = _mm256_max_ps(mxv, v);
        bad = _mm256_fmadd_ps(v, _mm256_setzero_ps(), bad); /* 0 unless some v is inf or NaN */
    }
    float tmp[8], mx = -INFINITY;
    _mm256_storeu_ps(tmp, mxv);
    for (int i = 0; i < 8; i++) mx = tmp[i] > mx ? tmp[i] : mx;
    int nf = hsum256(bad) != 0.0f;
    for (size_t j = n8; j < n; j++) {
        nf |= !isfinite(x[j]);
        mx = x[j] > mx ? x[j] : mx;
    }
    float sum = exp_sum(x, n, mx);
    for (size_t j = n; j < nz; j++) x[j] = 0.0f;
    *mxo = mx;
    return nf ? NAN : sum;
}

static void x_wsum(const float *e, size_t lde, const float *f, size_t nr, size_t n, float *vote) {
    size_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t i = 0; i < nr; i++) {
            const __m256 w = _mm256_set1_ps(f[i]);
            const float *r = e + i * lde + j;
            a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r), a0);
            a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 8), a1);
            a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 16), a2);
            a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 24), a3);
        }
        _mm256_storeu_ps(vote + j, a0);
        _mm256_storeu_ps(vote + j + 8, a1);
        _mm256_storeu_ps(vote + j + 16, a2);
        _mm256_storeu_ps(vote + j + 24, a3);
    }
    for (; j < n; j++) {
        float s = 0.0f;
        for (size_t i = 0; i < nr; i++) s += f[i] * e[i * lde + j];
        vote[j] = s;
    }
}

const kvm_qk_kernels kvm_qk_avx2 = {"avx2", x_qk, x_softmax_acc, x_kt_pack, x_qk_tile, x_exp_row, x_wsum, x_kt_pack_f16};
