/* AVX-512 scoring kernels: 16 query rows per vector. */
#include <immintrin.h>

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
#define SIMD_NAME "avx512"
#define SIMD_GETTER kvm_score_kernels_avx512

static inline float vhsum(V v) { return _mm512_reduce_add_ps(v); }

/* exp(x) for x <= 0 (Cephes expf polynomial; 2^n applied with scalef). */
static inline V vexp_neg(V x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    V n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
    V p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(5.0000001201e-1f));
    V y = _mm512_fmadd_ps(p, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

#include "score_simd.inc"
