/* AVX-512 scoring kernels: 16 query rows per vector. */
#include <immintrin.h>
#include "../../simd_math.h"

typedef __m512 V;
#define VW 16
#define VZERO _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VBCAST(x) _mm512_set1_ps(x)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define PANEL_NB 6 /* 6 blocks x 4 vectors = 24 of the 32 registers */
#define ROWS_NB 4
#define ROWS_NR 4
#define AABB_NB 3 /* 3 blocks x 4 rows = 12 accumulators, 6 box vectors */
#define VLOADH(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define VM __mmask16
#define VSIGN(q) _mm512_cmplt_epi32_mask(_mm512_castps_si512(q), _mm512_setzero_si512())
#define VSEL(s, a, b) _mm512_mask_blend_ps(s, a, b)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define SIMD_NAME "avx512"
#define SIMD_TABLE kvm_score_avx512

static inline float vhsum(V v) { return _mm512_reduce_add_ps(v); }

/* Sums of the 16 vectors a[i][r] (i, r < 4) into s[i * 4 + r] with 45
 * shuffles and adds instead of 16 separate reductions. */
static inline __m512 pair_sum(__m512 a, __m512 b) { /* per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] */
    return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
}
static inline __m512 quad_sum(__m512 a, __m512 b, __m512 c, __m512 d) { /* per lane: [sa, sb, sc, sd] */
    __m512 t0 = pair_sum(a, b), t1 = pair_sum(c, d);
    return _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
}
static inline __m512 lane_fold(__m512 u, __m512 v) { /* [u.l0+l1, u.l2+l3, v.l0+l1, v.l2+l3] */
    return _mm512_add_ps(_mm512_shuffle_f32x4(u, v, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u, v, _MM_SHUFFLE(3, 1, 3, 1)));
}
/* f[r] = the lane sum of ar, r < 4 */
#define VSUM4(a0, a1, a2, a3, f)                                                                        \
    do {                                                                                                \
        __m512 u_ = quad_sum(a0, a1, a2, a3);                                                           \
        __m256 h_ = _mm256_add_ps(_mm512_castps512_ps256(u_),                                           \
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u_), 1)));   \
        _mm_storeu_ps(f, _mm_add_ps(_mm256_castps256_ps128(h_), _mm256_extractf128_ps(h_, 1)));        \
    } while (0)
#define VHSUM16(a, s)                                                                          \
    do {                                                                                       \
        __m512 u0_ = quad_sum(a[0][0], a[0][1], a[0][2], a[0][3]);                             \
        __m512 u1_ = quad_sum(a[1][0], a[1][1], a[1][2], a[1][3]);                             \
        __m512 u2_ = quad_sum(a[2][0], a[2][1], a[2][2], a[2][3]);                             \
        __m512 u3_ = quad_sum(a[3][0], a[3][1], a[3][2], a[3][3]);                             \
        __m512 w0_ = lane_fold(u0_, u1_), w1_ = lane_fold(u2_, u3_);                           \
        _mm512_storeu_ps(s, lane_fold(w0_, w1_));                                              \
    } while (0)

#define vexp_neg kvm_exp_neg512
#include "score_simd.inc"
