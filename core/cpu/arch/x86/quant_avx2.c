/* AVX2 quantization kernels. Full groups run in vectors, partial groups and
 * KIVI key encoding use the scalar reference steps; every code, scale and
 * bias equals the scalar table's (same per-group parameters, RNE rounding,
 * multiply then add, no FMA). */
#define KVM_QUANT_F16C
#include "../../quant_ref.h"

#include <immintrin.h>

static inline float hmin8(__m256 v) {
    __m128 a = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_min_ps(a, _mm_movehl_ps(a, a));
    a = _mm_min_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

static inline float hmax8(__m256 v) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

/* 64 codes of one group with bias b and inverse scale inv -> 8 words. */
static inline void q4_encode64(const float *x, float b, float inv, uint32_t *w) {
    const __m256 vb = _mm256_set1_ps(b), vi = _mm256_set1_ps(inv);
    const __m256i lo = _mm256_setzero_si256(), hi = _mm256_set1_epi32(15);
    const __m256i sh4 = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    __m256i c[8];
    for (int j = 0; j < 8; j++) {
        __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + 8 * j), vb), vi));
        q = _mm256_min_epi32(_mm256_max_epi32(q, lo), hi);
        c[j] = _mm256_sllv_epi32(q, sh4);
    }
    /* word j = sum of the 8 shifted lanes of c[j] (bits do not overlap) */
    __m256i h01 = _mm256_hadd_epi32(c[0], c[1]), h23 = _mm256_hadd_epi32(c[2], c[3]);
    __m256i h45 = _mm256_hadd_epi32(c[4], c[5]), h67 = _mm256_hadd_epi32(c[6], c[7]);
    __m256i a = _mm256_hadd_epi32(h01, h23), bb = _mm256_hadd_epi32(h45, h67);
    __m256i sum = _mm256_add_epi32(_mm256_permute2x128_si256(a, bb, 0x20), _mm256_permute2x128_si256(a, bb, 0x31));
    _mm256_storeu_si256((__m256i *)(void *)w, sum);
}

/* Full groups 8 at a time: min/max, then directed f16 rounding, scale and
 * inverse for the 8 in vectors (the scalar reference's IEEE steps), then the
 * codes. Partial groups use the reference. */
static void q4_quant(const float *x, size_t n, size_t dim, uint32_t *words, uint16_t *scales, uint16_t *biases) {
    const size_t G = (dim + KVM_Q4_GROUP - 1) / KVM_Q4_GROUP, W = (dim + 7) / 8, full = dim / KVM_Q4_GROUP;
    const size_t total = n * full;
    float mn[8], mx[8], bf[8], inv[8], sv[8];
    uint16_t bh[8], sh[8];
    for (size_t f0 = 0; f0 < total; f0 += 8) {
        size_t cnt = total - f0 < 8 ? total - f0 : 8;
        for (size_t i = 0; i < 8; i++) mn[i] = mx[i] = 0.0f;
        for (size_t i = 0; i < cnt; i++) {
            size_t f = f0 + i, r = f / full, g = f % full;
            const float *p = x + r * dim + g * KVM_Q4_GROUP;
            __m256 v[8];
            for (int j = 0; j < 8; j++) v[j] = _mm256_loadu_ps(p + 8 * j);
            __m256 a = _mm256_min_ps(_mm256_min_ps(_mm256_min_ps(v[0], v[1]), _mm256_min_ps(v[2], v[3])),
                                     _mm256_min_ps(_mm256_min_ps(v[4], v[5]), _mm256_min_ps(v[6], v[7])));
            __m256 z = _mm256_max_ps(_mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3])),
                                     _mm256_max_ps(_mm256_max_ps(v[4], v[5]), _mm256_max_ps(v[6], v[7])));
            mn[i] = hmin8(a);
            mx[i] = hmax8(z);
        }
        __m256 vmn = _mm256_loadu_ps(mn), vmx = _mm256_loadu_ps(mx);
        __m128i vbh = _mm256_cvtps_ph(vmn, _MM_FROUND_TO_NEG_INF);
        __m256 vb = _mm256_cvtph_ps(vbh);
        __m128i vsh = _mm256_cvtps_ph(_mm256_div_ps(_mm256_sub_ps(vmx, vb), _mm256_set1_ps(15.0f)), _MM_FROUND_TO_POS_INF);
        __m256 vs = _mm256_cvtph_ps(vsh);
        _mm_storeu_si128((__m128i *)(void *)bh, vbh);
        _mm_storeu_si128((__m128i *)(void *)sh, vsh);
        _mm256_storeu_ps(bf, vb);
        _mm256_storeu_ps(sv, vs);
        _mm256_storeu_ps(inv, _mm256_div_ps(_mm256_set1_ps(1.0f), vs));
        for (size_t i = 0; i < cnt; i++) {
            size_t f = f0 + i, r = f / full, g = f % full;
            scales[r * G + g] = sh[i];
            biases[r * G + g] = bh[i];
            q4_encode64(x + r * dim + g * KVM_Q4_GROUP, bf[i], sv[i] > 0.0f ? inv[i] : 0.0f, words + r * W + g * 8);
        }
    }
    if (full < G)
        for (size_t r = 0; r < n; r++)
            kvm_q4_group_quant_ref(x + r * dim + full * KVM_Q4_GROUP, dim - full * KVM_Q4_GROUP, words + r * W + full * 8,
                                   scales + r * G + full, biases + r * G + full);
}

static inline __m256 q4_word8(uint32_t word, __m256 vs, __m256 vb) {
    const __m256i sh4 = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    __m256i c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)word), sh4), _mm256_set1_epi32(15));
    return _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(c), vs), vb);
}

static void q4_dequant(const uint32_t *words, const uint16_t *scales, const uint16_t *biases, size_t n,
                       size_t dim, float *out) {
    size_t G = (dim + KVM_Q4_GROUP - 1) / KVM_Q4_GROUP, W = (dim + 7) / 8;
    for (size_t r = 0; r < n; r++)
        for (size_t g = 0; g < G; g++) {
            size_t i0 = g * KVM_Q4_GROUP;
            float s = kvm_qf32(scales[r * G + g]), b = kvm_qf32(biases[r * G + g]);
            const uint32_t *w = words + r * W + i0 / 8;
            float *o = out + r * dim + i0;
            if (dim - i0 >= KVM_Q4_GROUP) {
                __m256 vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b);
                for (int j = 0; j < 8; j++) _mm256_storeu_ps(o + 8 * j, q4_word8(w[j], vs, vb));
            } else {
                kvm_q4_group_dequant_ref(w, dim - i0, s, b, o);
            }
        }
}

static void q4c_quant(const float *x, size_t n, size_t dim, const float *mn, const float *mx, uint32_t *words,
                      uint16_t *scales, uint16_t *biases) {
    kvm_quant_scalar.q4c_quant(x, n, dim, mn, mx, words, scales, biases);
}

static void q4c_dequant(const uint32_t *words, const uint16_t *scales, const uint16_t *biases, size_t n,
                        size_t dim, float *out) {
    size_t W = (dim + 7) / 8;
    float s[1024], b[1024];
    for (size_t d = 0; d < dim; d++) {
        s[d] = kvm_qf32(scales[d]);
        b[d] = kvm_qf32(biases[d]);
    }
    for (size_t r = 0; r < n; r++) {
        size_t d = 0;
        for (; d + 8 <= dim; d += 8)
            _mm256_storeu_ps(out + r * dim + d, q4_word8(words[r * W + d / 8], _mm256_loadu_ps(s + d), _mm256_loadu_ps(b + d)));
        for (; d < dim; d++)
            out[r * dim + d] = (float)((words[r * W + d / 8] >> (4 * (d % 8))) & 15u) * s[d] + b[d];
    }
}

static inline void q8_group32(const float *x, int8_t *q, uint16_t *sh) {
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8), v2 = _mm256_loadu_ps(x + 16),
           v3 = _mm256_loadu_ps(x + 24);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, abs), _mm256_and_ps(v1, abs)),
                             _mm256_max_ps(_mm256_and_ps(v2, abs), _mm256_and_ps(v3, abs)));
    float inv;
    kvm_q8_params(hmax8(m), sh, &inv);
    const __m256 vi = _mm256_set1_ps(inv);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    __m256i c0 = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v0, vi)), lo), hi);
    __m256i c1 = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v1, vi)), lo), hi);
    __m256i c2 = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v2, vi)), lo), hi);
    __m256i c3 = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v3, vi)), lo), hi);
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(c0, c1), _mm256_packs_epi32(c2, c3));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)(void *)q, p);
}

static void q8_quant(const float *x, size_t n, size_t dim, uint16_t *scales, int8_t *codes) {
    size_t G = (dim + KVM_Q8_GROUP - 1) / KVM_Q8_GROUP;
    for (size_t r = 0; r < n; r++)
        for (size_t g = 0; g < G; g++) {
            size_t i0 = g * KVM_Q8_GROUP;
            if (dim - i0 >= KVM_Q8_GROUP)
                q8_group32(x + r * dim + i0, codes + r * dim + i0, scales + r * G + g);
            else
                kvm_q8_group_quant_ref(x + r * dim + i0, dim - i0, codes + r * dim + i0, scales + r * G + g);
        }
}

static void q8_dequant(const uint16_t *scales, const int8_t *codes, size_t n, size_t dim, float *out) {
    size_t G = (dim + KVM_Q8_GROUP - 1) / KVM_Q8_GROUP;
    for (size_t r = 0; r < n; r++) {
        const int8_t *c = codes + r * dim;
        float *o = out + r * dim;
        size_t i = 0;
        for (; i + 8 <= dim; i += 8) {
            __m256 vs = _mm256_set1_ps(kvm_qf32(scales[r * G + i / KVM_Q8_GROUP]));
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(c + i)));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_cvtepi32_ps(q), vs));
        }
        for (; i < dim; i++) o[i] = (float)c[i] * kvm_qf32(scales[r * G + i / KVM_Q8_GROUP]);
    }
}

/* F16C's directed rounding (the immediate) gives the f16 that RNE-then-step gives */
static void f16_round(const float *x, size_t n, int up, uint16_t *out) {
    size_t i = 0;
    if (up)
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(void *)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_POS_INF));
    else
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(void *)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEG_INF));
    for (; i < n; i++) out[i] = up ? kvm_f16_up_inline(x[i]) : kvm_f16_down_inline(x[i]);
}

/* 16 f16 values as order keys (+-0 both 0): -magnitude for negatives. */
static inline __m256i f16_keys(__m256i v) {
    __m256i neg = _mm256_srai_epi16(v, 15), mag = _mm256_and_si256(v, _mm256_set1_epi16(0x7fff));
    return _mm256_sub_epi16(_mm256_xor_si256(mag, neg), neg);
}

static size_t f16_boxes_bad(const uint16_t *boxes, size_t n, size_t dim) {
    if (dim % 16) return kvm_f16_boxes_bad_ref(boxes, n, dim);
    const __m256i expo = _mm256_set1_epi16(0x7c00);
    size_t bad = 0;
    for (size_t b = 0; b < n; b++) {
        const uint16_t *hi = boxes + b * 2 * dim, *lo = hi + dim;
        __m256i nf = _mm256_setzero_si256(), inv = _mm256_setzero_si256();
        for (size_t d = 0; d < dim; d += 16) {
            __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(hi + d));
            __m256i l = _mm256_loadu_si256((const __m256i *)(const void *)(lo + d));
            nf = _mm256_or_si256(nf, _mm256_cmpeq_epi16(_mm256_and_si256(h, expo), expo));
            nf = _mm256_or_si256(nf, _mm256_cmpeq_epi16(_mm256_and_si256(l, expo), expo));
            inv = _mm256_or_si256(inv, _mm256_cmpgt_epi16(f16_keys(l), f16_keys(h)));
        }
        /* rare: count exactly with the reference */
        if (!_mm256_testz_si256(nf, nf) || !_mm256_testz_si256(inv, inv)) bad += kvm_f16_boxes_bad_ref(hi, 1, dim);
    }
    return bad;
}

const kvm_quant_kernels kvm_quant_avx2 = {
    "avx2", q8_quant, q8_dequant, q4_quant, q4_dequant, q4c_quant, q4c_dequant, f16_round, f16_boxes_bad,
};
