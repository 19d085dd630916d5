/* acc64 stripes with AVX-512: one zmm of eight lanes per 64-byte stripe.
 * acc[i ^ 1] += d[i] is summed unswapped in its own accumulators and
 * swapped once at the end (addition mod 2^64 commutes): one shuffle per
 * call instead of one per stripe, and four independent add chains. */
#include "../../kernels.h"

#include <immintrin.h>

void kvm_acc64_stripes_avx512(uint64_t acc[8], const unsigned char *p, size_t n_stripes) {
    __m512i a = _mm512_loadu_si512((const void *)acc);
    const __m512i k = _mm512_loadu_si512((const void *)kvm_acc64_keys);
    size_t s = 0;
    __m512i b = _mm512_setzero_si512(), sa = b, sb = b;
    for (; s + 2 <= n_stripes; s += 2, p += 128) {
        __m512i d0 = _mm512_loadu_si512((const void *)p), d1 = _mm512_loadu_si512((const void *)(p + 64));
        __m512i v0 = _mm512_xor_si512(d0, k), v1 = _mm512_xor_si512(d1, k);
        a = _mm512_add_epi64(a, _mm512_mul_epu32(v0, _mm512_srli_epi64(v0, 32)));
        b = _mm512_add_epi64(b, _mm512_mul_epu32(v1, _mm512_srli_epi64(v1, 32)));
        sa = _mm512_add_epi64(sa, d0);
        sb = _mm512_add_epi64(sb, d1);
    }
    for (; s < n_stripes; s++, p += 64) {
        __m512i d = _mm512_loadu_si512((const void *)p), v = _mm512_xor_si512(d, k);
        a = _mm512_add_epi64(a, _mm512_mul_epu32(v, _mm512_srli_epi64(v, 32)));
        sa = _mm512_add_epi64(sa, d);
    }
    const __m512i sw = _mm512_shuffle_epi32(_mm512_add_epi64(sa, sb), (_MM_PERM_ENUM)0x4e); /* lane i ^ 1 */
    _mm512_storeu_si512((void *)acc, _mm512_add_epi64(_mm512_add_epi64(a, b), sw));
}
