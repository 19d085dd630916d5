/* AVX-512 (F, BW, VL) kernels. Compiled with -mavx512f -mavx512bw -mavx512vl
 * -mfma -mf16c; only called after run-time detection. Tails go through masked
 * loads so results match the scalar reference bit for bit. */
#include "../../half.h"
#include "../../kernels.h"

#include <immintrin.h>

static inline __mmask16 tail_mask(size_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

static void x_f16_to_f32(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m256i h = _mm256_maskz_loadu_epi16(m, src + i);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(h));
    }
}

static void x_f32_to_f16(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 f = _mm512_maskz_loadu_ps(m, src + i);
        _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT));
    }
}

static void x_bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + i));
        _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
}

static void x_f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i qbit = _mm512_set1_epi32(0x40);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 f = _mm512_maskz_loadu_ps(m, src + i);
        __m512i x = _mm512_castps_si512(f);
        __m512i hi = _mm512_srli_epi32(x, 16);
        __m512i r = _mm512_srli_epi32(
            _mm512_add_epi32(x, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
        __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, qbit));
        _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(r));
    }
}

static void x_minmax_rows(const float *x, size_t n_rows, size_t stride, size_t dim, float *mn,
                          float *mx) {
    for (size_t d = 0; d < dim; d += 16) {
        __mmask16 m = tail_mask(dim - d);
        __m512 lo = _mm512_maskz_loadu_ps(m, x + d), hi = lo;
        for (size_t r = 1; r < n_rows; r++) {
            __m512 v = _mm512_maskz_loadu_ps(m, x + r * stride + d);
            lo = _mm512_min_ps(v, lo);
            hi = _mm512_max_ps(v, hi);
        }
        _mm512_mask_storeu_ps(mn + d, m, lo);
        _mm512_mask_storeu_ps(mx + d, m, hi);
    }
}

/* Counted in vector lanes, four vectors a step: the per-vector mask
 * popcount and tail mask ran at half the speed, and the retrieval score
 * checks a decode call's whole score matrix (about 1 MB) with it. Blocks
 * of at most 2^30 elements keep the lane sums within 32 bits. */
static size_t x_count_nonfinite(const float *x, size_t n) {
    const __m512i em = _mm512_set1_epi32(0x7f800000), one = _mm512_set1_epi32(1);
    size_t c = 0, i = 0;
    while (n - i >= 64) {
        const size_t run = (n - i) & ~(size_t)63, end = i + (run < ((size_t)1 << 30) ? run : ((size_t)1 << 30));
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
        for (; i < end; i += 64) {
            __m512i v0 = _mm512_and_si512(_mm512_loadu_si512(x + i), em);
            __m512i v1 = _mm512_and_si512(_mm512_loadu_si512(x + i + 16), em);
            __m512i v2 = _mm512_and_si512(_mm512_loadu_si512(x + i + 32), em);
            __m512i v3 = _mm512_and_si512(_mm512_loadu_si512(x + i + 48), em);
            a0 = _mm512_mask_add_epi32(a0, _mm512_cmpeq_epi32_mask(v0, em), a0, one);
            a1 = _mm512_mask_add_epi32(a1, _mm512_cmpeq_epi32_mask(v1, em), a1, one);
            a2 = _mm512_mask_add_epi32(a2, _mm512_cmpeq_epi32_mask(v2, em), a2, one);
            a3 = _mm512_mask_add_epi32(a3, _mm512_cmpeq_epi32_mask(v3, em), a3, one);
        }
        c += (size_t)(uint32_t)_mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)));
    }
    for (; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi32(m, x + i), em);
        c += (size_t)__builtin_popcount((unsigned)_mm512_mask_cmpeq_epi32_mask(m, v, em));
    }
    return c;
}

static float x_dot(const float *a, const float *b, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

const kvm_cpu_kernels kvm_cpu_avx512 = {
    "avx512", x_f16_to_f32, x_f32_to_f16, x_bf16_to_f32, x_f32_to_bf16, x_minmax_rows, x_count_nonfinite, x_dot,
    &kvm_score_avx512, &kvm_attend_avx512, &kvm_qk_avx512, &kvm_quant_avx512, kvm_rope_rows_neox_avx512,
    kvm_acc64_stripes_avx512,
};
