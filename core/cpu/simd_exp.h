/* The one vector exp of the CPU kernels (attention's online softmax,
 * retrieval's normalisation, the rule score's softmax): exp(x) for x <= 0,
 * the arguments of a max-shifted softmax. Cephes' expf: x clamped at
 * ln(FLT_MIN) so 2^n stays a normal number, n = round(x / ln 2), the
 * reduction by ln 2 in two parts, a degree-6 polynomial; relative error
 * about 2e-7 against expf above the clamp. Below it the result is about
 * FLT_MIN (harmless against a running sum >= 1); the _flush variants give 0
 * there, for callers that report the weights themselves.
 * Include from a file compiled for AVX2+FMA (256-bit) or AVX-512F (both). */
#ifndef KVMEM_CPU_SIMD_EXP_H
#define KVMEM_CPU_SIMD_EXP_H

#include <immintrin.h>

#define KVM_EXP_LO (-87.33654f) /* ln(FLT_MIN) */

#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 kvm_exp_neg256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(KVM_EXP_LO));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
static inline __m256 kvm_exp_neg256_flush(__m256 x) {
    const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(KVM_EXP_LO), _CMP_LT_OQ);
    return _mm256_andnot_ps(tiny, kvm_exp_neg256(x));
}
#endif

#if defined(__AVX512F__)
static inline __m512 kvm_exp_neg512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(KVM_EXP_LO));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
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
static inline __m512 kvm_exp_neg512_flush(__m512 x) {
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(KVM_EXP_LO), _CMP_LT_OQ);
    return _mm512_maskz_mov_ps((__mmask16)~tiny, kvm_exp_neg512(x));
}
#endif

#endif
