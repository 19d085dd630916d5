/* AVX-512 Q4 kernels (the bandwidth-critical pair: sealing and decoding Q4
 * blocks); Q8 and KIVI reuse the AVX2 table. Bit-identical to the scalar
 * reference: same per-group parameters, RNE conversion, multiply then add. */
#define KVM_QUANT_F16C
#include "../../quant_ref.h"

#include <immintrin.h>

/* 64 codes of one group with bias b and inverse scale inv -> 8 words. */
static inline void q4_encode64(const float *x, float b, float inv, uint32_t *w) {
    const __m512 vb = _mm512_set1_ps(b), vi = _mm512_set1_ps(inv);
    const __m512i lo = _mm512_setzero_si512(), hi = _mm512_set1_epi32(15);
    __m128i c[4];
    for (int j = 0; j < 4; j++) {
        __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + 16 * j), vb), vi));
        c[j] = _mm512_cvtepi32_epi8(_mm512_min_epi32(_mm512_max_epi32(q, lo), hi)); /* one code per byte */
    }
    __m512i all = _mm512_inserti32x4(_mm512_castsi128_si512(c[0]), c[1], 1);
    all = _mm512_inserti32x4(_mm512_inserti32x4(all, c[2], 2), c[3], 3);
    /* u16 lane j holds codes 2j (low byte) and 2j+1: pack them into one byte */
    __m512i nib = _mm512_or_si512(_mm512_and_si512(all, _mm512_set1_epi16(0x000f)),
                                  _mm512_and_si512(_mm512_srli_epi16(all, 4), _mm512_set1_epi16(0x00f0)));
    _mm256_storeu_si256((__m256i *)(void *)w, _mm512_cvtepi16_epi8(nib));
}

/* Full groups are done 16 at a time: their min/max, then the directed f16
 * rounding, scale and inverse for all 16 in vectors (the same IEEE steps as
 * the scalar reference), then the codes. Partial groups use the reference. */
static void q4_quant(const float *x, size_t n, size_t dim, uint32_t *words, uint16_t *scales, uint16_t *biases) {
    const size_t G = (dim + KVM_Q4_GROUP - 1) / KVM_Q4_GROUP, W = (dim + 7) / 8, full = dim / KVM_Q4_GROUP;
    const size_t total = n * full;
    float mn[16], mx[16], bf[16], inv[16];
    uint16_t bh[16], sh[16];
    for (size_t f0 = 0; f0 < total; f0 += 16) {
        size_t cnt = total - f0 < 16 ? total - f0 : 16;
        for (size_t i = 0; i < cnt; i++) {
            size_t f = f0 + i, r = f / full, g = f % full;
            const float *p = x + r * dim + g * KVM_Q4_GROUP;
            __m512 v0 = _mm512_loadu_ps(p), v1 = _mm512_loadu_ps(p + 16), v2 = _mm512_loadu_ps(p + 32),
                   v3 = _mm512_loadu_ps(p + 48);
            mn[i] = _mm512_reduce_min_ps(_mm512_min_ps(_mm512_min_ps(v0, v1), _mm512_min_ps(v2, v3)));
            mx[i] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(v0, v1), _mm512_max_ps(v2, v3)));
        }
        __mmask16 m = (__mmask16)(cnt == 16 ? 0xffffu : (1u << cnt) - 1u);
        __m512 vmn = _mm512_maskz_loadu_ps(m, mn), vmx = _mm512_maskz_loadu_ps(m, mx);
        __m256i vbh = _mm512_cvt_roundps_ph(vmn, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        __m512 vb = _mm512_cvtph_ps(vbh);
        __m512 t = _mm512_div_ps(_mm512_sub_ps(vmx, vb), _mm512_set1_ps(15.0f));
        __m256i vsh = _mm512_cvt_roundps_ph(t, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
        __m512 vs = _mm512_cvtph_ps(vsh);
        __mmask16 pos = _mm512_cmp_ps_mask(vs, _mm512_setzero_ps(), _CMP_GT_OQ);
        __m512 vinv = _mm512_maskz_div_ps(pos, _mm512_set1_ps(1.0f), vs);
        _mm256_storeu_si256((__m256i *)(void *)bh, vbh);
        _mm256_storeu_si256((__m256i *)(void *)sh, vsh);
        _mm512_storeu_ps(bf, vb);
        _mm512_storeu_ps(inv, vinv);
        for (size_t i = 0; i < cnt; i++) {
            size_t f = f0 + i, r = f / full, g = f % full;
            scales[r * G + g] = sh[i];
            biases[r * G + g] = bh[i];
            q4_encode64(x + r * dim + g * KVM_Q4_GROUP, bf[i], inv[i], words + r * W + g * 8);
        }
    }
    if (full < G)
        for (size_t r = 0; r < n; r++)
            kvm_q4_group_quant_ref(x + r * dim + full * KVM_Q4_GROUP, dim - full * KVM_Q4_GROUP, words + r * W + full * 8,
                                   scales + r * G + full, biases + r * G + full);
}

static void q4_dequant(const uint32_t *words, const uint16_t *scales, const uint16_t *biases, size_t n,
                       size_t dim, float *out) {
    size_t G = (dim + KVM_Q4_GROUP - 1) / KVM_Q4_GROUP, W = (dim + 7) / 8;
    const __m512i sh4 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    const __m512i m15 = _mm512_set1_epi32(15);
    for (size_t r = 0; r < n; r++)
        for (size_t g = 0; g < G; g++) {
            size_t i0 = g * KVM_Q4_GROUP;
            float s = kvm_qf32(scales[r * G + g]), b = kvm_qf32(biases[r * G + g]);
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
    kvm_quant_avx2.q8_quant(x, n, dim, scales, codes);
}
static void q8_dequant(const uint16_t *scales, const int8_t *codes, size_t n, size_t dim, float *out) {
    kvm_quant_avx2.q8_dequant(scales, codes, n, dim, out);
}
static void q4c_quant(const float *x, size_t n, size_t dim, const float *mn, const float *mx, uint32_t *words,
                      uint16_t *scales, uint16_t *biases) {
    kvm_quant_avx2.q4c_quant(x, n, dim, mn, mx, words, scales, biases);
}
static void q4c_dequant(const uint32_t *words, const uint16_t *scales, const uint16_t *biases, size_t n,
                        size_t dim, float *out) {
    kvm_quant_avx2.q4c_dequant(words, scales, biases, n, dim, out);
}

static void f16_round(const float *x, size_t n, int up, uint16_t *out) {
    size_t i = 0;
    if (up)
        for (; i + 16 <= n; i += 16)
            _mm256_storeu_si256((__m256i *)(void *)(out + i),
                                _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC));
    else
        for (; i + 16 <= n; i += 16)
            _mm256_storeu_si256((__m256i *)(void *)(out + i),
                                _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
    kvm_quant_avx2.f16_round(x + i, n - i, up, out + i);
}

static size_t f16_boxes_bad(const uint16_t *boxes, size_t n, size_t dim) {
    return kvm_quant_avx2.f16_boxes_bad(boxes, n, dim); /* bound by memory: 256-bit is enough */
}

const kvm_quant_kernels kvm_quant_avx512 = {
    "avx512", q8_quant, q8_dequant, q4_quant, q4_dequant, q4c_quant, q4c_dequant, f16_round, f16_boxes_bad,
};
