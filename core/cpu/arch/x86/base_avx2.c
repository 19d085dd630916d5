/* AVX2 + FMA + F16C kernels. Compiled with -mavx2 -mfma -mf16c; only called
 * after run-time detection says the CPU has them. Tails use the scalar code
 * so results match the reference bit for bit. */
#include "../../half.h"
#include "../../kernels.h"

#include <immintrin.h>

static void a_f16_to_f32(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = kvm_f16_to_f32(src[i]);
}

static void a_f32_to_f16(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = kvm_f32_to_f16(src[i]);
}

static void a_bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; i++) dst[i] = kvm_bf16_to_f32(src[i]);
}

static void a_f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i qbit = _mm256_set1_epi32(0x40);
    for (; i + 8 <= n; i += 8) {
        __m256 f = _mm256_loadu_ps(src + i);
        __m256i x = _mm256_castps_si256(f);
        __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(x, 16), one)));
        r = _mm256_srli_epi32(r, 16);
        __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
        __m256i qn = _mm256_or_si256(_mm256_srli_epi32(x, 16), qbit);
        r = _mm256_blendv_epi8(r, qn, nan);
        /* pack 32->16 without saturation: values are < 65536 */
        __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
        _mm_storeu_si128((__m128i *)(dst + i), _mm_packus_epi32(lo, hi));
    }
    for (; i < n; i++) dst[i] = kvm_f32_to_bf16(src[i]);
}

static void a_minmax_rows(const float *x, size_t n_rows, size_t stride, size_t dim, float *mn,
                          float *mx) {
    size_t d = 0;
    for (; d + 8 <= dim; d += 8) {
        __m256 lo = _mm256_loadu_ps(x + d), hi = lo;
        for (size_t r = 1; r < n_rows; r++) {
            __m256 v = _mm256_loadu_ps(x + r * stride + d);
            lo = _mm256_min_ps(v, lo); /* returns lo (accumulator) on NaN, like the scalar */
            hi = _mm256_max_ps(v, hi);
        }
        _mm256_storeu_ps(mn + d, lo);
        _mm256_storeu_ps(mx + d, hi);
    }
    for (; d < dim; d++) {
        float lo = x[d], hi = x[d];
        for (size_t r = 1; r < n_rows; r++) {
            float v = x[r * stride + d];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        mn[d] = lo;
        mx[d] = hi;
    }
}

/* Counted in vector lanes (a lane's compare is -1), four vectors a step;
 * blocks of at most 2^30 elements keep the lane sums within 32 bits. */
static size_t a_count_nonfinite(const float *x, size_t n) {
    size_t i = 0, c = 0;
    const __m256i em = _mm256_set1_epi32(0x7f800000);
    while (n - i >= 32) {
        const size_t run = (n - i) & ~(size_t)31, end = i + (run < ((size_t)1 << 30) ? run : ((size_t)1 << 30));
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
        for (; i < end; i += 32) {
            a0 = _mm256_sub_epi32(a0, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), em), em));
            a1 = _mm256_sub_epi32(a1, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i + 8)), em), em));
            a2 = _mm256_sub_epi32(a2, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i + 16)), em), em));
            a3 = _mm256_sub_epi32(a3, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i + 24)), em), em));
        }
        __m256i a = _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3));
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
        c += (size_t)(uint32_t)_mm_cvtsi128_si32(h);
    }
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), em);
        int m = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(v, em)));
        c += (size_t)__builtin_popcount((unsigned)m);
    }
    for (; i < n; i++) c += (kvm_f32_bits(x[i]) & 0x7f800000u) == 0x7f800000u;
    return c;
}

static float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float a_dot(const float *a, const float *b, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

const kvm_cpu_kernels kvm_cpu_avx2 = {
    "avx2", a_f16_to_f32, a_f32_to_f16, a_bf16_to_f32, a_f32_to_bf16, a_minmax_rows, a_count_nonfinite, a_dot,
    &kvm_score_avx2, &kvm_attend_avx2, &kvm_qk_avx2, &kvm_quant_avx2, kvm_rope_rows_neox_avx2, kvm_acc64_stripes_avx2,
};
