/* The vector math of the CPU kernels, one copy per instruction set: the
 * exp of attention's online softmax, retrieval's normalisation and the
 * rule score's softmax, exp(x) for x <= 0,
 * the arguments of a max-shifted softmax. Cephes' expf: x clamped at
 * ln(FLT_MIN) so 2^n stays a normal number, n = round(x / ln 2), the
 * reduction by ln 2 in two parts, a degree-6 polynomial; relative error
 * about 2e-7 against expf above the clamp. Below it the result is about
 * FLT_MIN (harmless against a running sum >= 1); the _flush variants give 0
 * there, for callers that report the weights themselves.
 * Include from a file compiled for AVX2+FMA (256-bit), AVX-512F (both) or
 * WebAssembly SIMD128. */
#ifndef KVMEM_CPU_SIMD_MATH_H
#define KVMEM_CPU_SIMD_MATH_H

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__wasm_simd128__)
#include <wasm_simd128.h>
#endif

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

#if defined(__wasm_simd128__)
/* The same polynomial on 4 lanes, clamped at -87 (no FMA: multiply, then
 * add), 2^n through the exponent bits. */
static inline v128_t kvm_exp_neg128(v128_t x) {
    x = wasm_f32x4_max(x, wasm_f32x4_splat(-87.0f));
    const v128_t n = wasm_f32x4_nearest(wasm_f32x4_mul(x, wasm_f32x4_splat(1.44269504088896341f)));
    x = wasm_f32x4_sub(x, wasm_f32x4_mul(n, wasm_f32x4_splat(0.693359375f)));
    x = wasm_f32x4_sub(x, wasm_f32x4_mul(n, wasm_f32x4_splat(-2.12194440e-4f)));
#define KVM_MADD128(a, b, c) wasm_f32x4_add(wasm_f32x4_mul(a, b), c)
    v128_t p = wasm_f32x4_splat(1.9875691500e-4f);
    p = KVM_MADD128(p, x, wasm_f32x4_splat(1.3981999507e-3f));
    p = KVM_MADD128(p, x, wasm_f32x4_splat(8.3334519073e-3f));
    p = KVM_MADD128(p, x, wasm_f32x4_splat(4.1665795894e-2f));
    p = KVM_MADD128(p, x, wasm_f32x4_splat(1.6666665459e-1f));
    p = KVM_MADD128(p, x, wasm_f32x4_splat(5.0000001201e-1f));
    const v128_t y = KVM_MADD128(p, wasm_f32x4_mul(x, x), wasm_f32x4_add(x, wasm_f32x4_splat(1.0f)));
#undef KVM_MADD128
    const v128_t e = wasm_i32x4_shl(wasm_i32x4_add(wasm_i32x4_trunc_sat_f32x4(n), wasm_i32x4_splat(127)), 23);
    return wasm_f32x4_mul(y, e);
}
#endif

#endif
