/* acc64 stripes with AVX2: two ymm of four lanes per 64-byte stripe.
 * acc[i ^ 1] += d[i] is summed unswapped and swapped once at the end
 * (addition mod 2^64 commutes): no shuffle per stripe. */
#include "../../kernels.h"

#include <immintrin.h>

void kvm_acc64_stripes_avx2(uint64_t acc[8], const unsigned char *p, size_t n_stripes) {
    __m256i a0 = _mm256_loadu_si256((const __m256i *)(const void *)acc);
    __m256i a1 = _mm256_loadu_si256((const __m256i *)(const void *)(acc + 4));
    const __m256i k0 = _mm256_loadu_si256((const __m256i *)(const void *)kvm_acc64_keys);
    const __m256i k1 = _mm256_loadu_si256((const __m256i *)(const void *)(kvm_acc64_keys + 4));
    __m256i s0 = _mm256_setzero_si256(), s1 = s0;
    for (size_t s = 0; s < n_stripes; s++, p += 64) {
        __m256i d0 = _mm256_loadu_si256((const __m256i *)(const void *)p);
        __m256i d1 = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32));
        __m256i v0 = _mm256_xor_si256(d0, k0), v1 = _mm256_xor_si256(d1, k1);
        a0 = _mm256_add_epi64(a0, _mm256_mul_epu32(v0, _mm256_srli_epi64(v0, 32)));
        a1 = _mm256_add_epi64(a1, _mm256_mul_epu32(v1, _mm256_srli_epi64(v1, 32)));
        s0 = _mm256_add_epi64(s0, d0);
        s1 = _mm256_add_epi64(s1, d1);
    }
    a0 = _mm256_add_epi64(a0, _mm256_shuffle_epi32(s0, 0x4e)); /* acc[i ^ 1] += d[i] */
    a1 = _mm256_add_epi64(a1, _mm256_shuffle_epi32(s1, 0x4e));
    _mm256_storeu_si256((__m256i *)(void *)acc, a0);
    _mm256_storeu_si256((__m256i *)(void *)(acc + 4), a1);
}
