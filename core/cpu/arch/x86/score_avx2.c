/* AVX2 + FMA scoring kernels: 8 query rows per vector. */
#include <immintrin.h>
#include "../../simd_math.h"

typedef __m256 V;
#define VW 8
#define VZERO _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VBCAST(x) _mm256_set1_ps(x)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define PANEL_NB 3 /* 3 blocks x 4 vectors = 12 of the 16 registers */
#define ROWS_NB 2
#define ROWS_NR 4
#define AABB_NB 2 /* 2 blocks x 4 rows = 8 accumulators, 4 box vectors (16 registers) */
#define VLOADH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define VM __m256 /* the query itself: blendv reads its sign bits */
#define VSIGN(q) (q)
#define VSEL(s, a, b) _mm256_blendv_ps(a, b, s)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VSUM4(a0, a1, a2, a3, f)                                                                        \
    do {                                                                                                \
        __m256 t_ = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));                     \
        _mm_storeu_ps(f, _mm_add_ps(_mm256_castps256_ps128(t_), _mm256_extractf128_ps(t_, 1)));        \
    } while (0)
#define SIMD_NAME "avx2"
#define SIMD_TABLE kvm_score_avx2

static inline float vhsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define vexp_neg kvm_exp_neg256
#include "score_simd.inc"
