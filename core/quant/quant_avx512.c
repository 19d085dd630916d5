/* AVX-512 Q4 kernels (the bandwidth-critical pair: sealing and decoding Q4
 * blocks); Q8 and KIVI reuse the AVX2 table. Bit-identical to the scalar
 * reference: same per-group parameters, RNE conversion, multiply then add. */
#include "quant_ref.h"

#include <immintrin.h>

static inline void q4_group64(const float *x, uint32_t *w, uint16_t *sh, uint16_t *bh) {
    __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16), v2 = _mm512_loadu_ps(x + 32),
           v3 = _mm512_loadu_ps(x + 48);
    float mn = _mm512_reduce_min_ps(_mm512_min_ps(_mm512_min_ps(v0, v1), _mm512_min_ps(v2, v3)));
    float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(v0, v1), _mm512_max_ps(v2, v3)));
    float s, b, inv;
    kvm_q4_params(mn, mx, sh, bh, &s, &b, &inv);
    const __m512 vb = _mm512_set1_ps(b), vi = _mm512_set1_ps(inv);
    const __m512i lo = _mm512_setzero_si512(), hi = _mm512_set1_epi32(15);
    const __m512i sh4 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    __m512 v[4] = {v0, v1, v2, v3};
    __m256i c[8];
    for (int j = 0; j < 4; j++) {
        __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(v[j], vb), vi));
        q = _mm512_sllv_epi32(_mm512_min_epi32(_mm512_max_epi32(q, lo), hi), sh4);
        c[2 * j] = _mm512_castsi512_si256(q);
        c[2 * j + 1] = _mm512_extracti64x4_epi64(q, 1);
    }
    __m256i h01 = _mm256_hadd_epi32(c[0], c[1]), h23 = _mm256_hadd_epi32(c[2], c[3]);
    __m256i h45 = _mm256_hadd_epi32(c[4], c[5]), h67 = _mm256_hadd_epi32(c[6], c[7]);
    __m256i a = _mm256_hadd_epi32(h01, h23), bb = _mm256_hadd_epi32(h45, h67);
    __m256i sum = _mm256_add_epi32(_mm256_permute2x128_si256(a, bb, 0x20), _mm256_permute2x128_si256(a, bb, 0x31));
    _mm256_storeu_si256((__m256i *)(void *)w, sum);
}

static void q4_quant(const float *x, size_t n, size_t dim, uint32_t *words, uint16_t *scales, uint16_t *biases) {
    size_t G = (dim + KVM_Q4_GROUP - 1) / KVM_Q4_GROUP, W = (dim + 7) / 8;
    for (size_t r = 0; r < n; r++)
        for (size_t g = 0; g < G; g++) {
            size_t i0 = g * KVM_Q4_GROUP;
            if (dim - i0 >= KVM_Q4_GROUP)
                q4_group64(x + r * dim + i0, words + r * W + i0 / 8, scales + r * G + g, biases + r * G + g);
            else
                kvm_q4_group_quant_ref(x + r * dim + i0, dim - i0, words + r * W + i0 / 8, scales + r * G + g,
                                       biases + r * G + g);
        }
}

static void q4_dequant(const uint32_t *words, const uint16_t *scales, const uint16_t *biases, size_t n,
                       size_t dim, float *out) {
    size_t G = (dim + KVM_Q4_GROUP - 1) / KVM_Q4_GROUP, W = (dim + 7) / 8;
    const __m512i sh4 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    const __m512i m15 = _mm512_set1_epi32(15);
    for (size_t r = 0; r < n; r++)
        for (size_t g = 0; g < G; g++) {
            size_t i0 = g * KVM_Q4_GROUP;
            float s = kvm_f16_to_f32(scales[r * G + g]), b = kvm_f16_to_f32(biases[r * G + g]);
            const uint32_t *w = words + r * W + i0 / 8;
            float *o = out + r * dim + i0;
            if (dim - i0 >= KVM_Q4_GROUP) {
                const __m512 vs = _mm512_set1_ps(s), vb = _mm512_set1_ps(b);
                __m512i all = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)w));
                for (int j = 0; j < 4; j++) {
                    /* lanes 0-7 take word 2j, lanes 8-15 word 2j+1 */
                    __m512i idx = _mm512_setr_epi32(2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j + 1,
                                                    2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1);
                    __m512i c = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(idx, all), sh4), m15);
                    _mm512_storeu_ps(o + 16 * j, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(c), vs), vb));
                }
            } else {
                kvm_q4_group_dequant_ref(w, dim - i0, s, b, o);
            }
        }
}

static void q8_quant(const float *x, size_t n, size_t dim, uint16_t *scales, int8_t *codes) {
    kvm_quant_kernels_avx2()->q8_quant(x, n, dim, scales, codes);
}
static void q8_dequant(const uint16_t *scales, const int8_t *codes, size_t n, size_t dim, float *out) {
    kvm_quant_kernels_avx2()->q8_dequant(scales, codes, n, dim, out);
}
static void q4c_quant(const float *x, size_t n, size_t dim, const float *mn, const float *mx, uint32_t *words,
                      uint16_t *scales, uint16_t *biases) {
    kvm_quant_kernels_avx2()->q4c_quant(x, n, dim, mn, mx, words, scales, biases);
}
static void q4c_dequant(const uint32_t *words, const uint16_t *scales, const uint16_t *biases, size_t n,
                        size_t dim, float *out) {
    kvm_quant_kernels_avx2()->q4c_dequant(words, scales, biases, n, dim, out);
}

static const kvm_quant_kernels avx512_table = {
    "avx512", q8_quant, q8_dequant, q4_quant, q4_dequant, q4c_quant, q4c_dequant,
};

const kvm_quant_kernels *kvm_quant_kernels_avx512(void) { return &avx512_table; }
