/* Batched forward rotation of many rows (the gather's hot loop), with SIMD
 * variants for NEOX pairing. Every path computes y0 = x0*c - x1*s,
 * y1 = x0*s + x1*c (then * attn_factor) with separately rounded products,
 * exactly like kvm_rope_rotate, so all paths agree bit for bit. */
#include "rope.h"
#include "../cpu/kernels.h"

#include <string.h>

#if !defined(KVMEM_HAVE_AVX2)
void kvm_rope_rows_neox_avx2(const kvm_rope *r, float *x, size_t n_rows, size_t stride, const float *cs,
                             size_t cs_stride) {
    (void)r, (void)x, (void)n_rows, (void)stride, (void)cs, (void)cs_stride;
}
#endif
#if !defined(KVMEM_HAVE_AVX512)
void kvm_rope_rows_neox_avx512(const kvm_rope *r, float *x, size_t n_rows, size_t stride, const float *cs,
                               size_t cs_stride) {
    (void)r, (void)x, (void)n_rows, (void)stride, (void)cs, (void)cs_stride;
}
#endif

void kvm_rope_rotate_rows(const kvm_rope *r, float *x, size_t n_rows, size_t stride, const float *cs,
                          size_t cs_stride) {
    const size_t np = (size_t)r->n_pairs;
    if (np == 0) return;
    if (r->style == KVMEM_ROPE_NEOX) {
        const char *isa = kvm_cpu_kernels_get()->name;
#if defined(KVMEM_HAVE_AVX512)
        if (strcmp(isa, "avx512") == 0) {
            kvm_rope_rows_neox_avx512(r, x, n_rows, stride, cs, cs_stride);
            return;
        }
#endif
#if defined(KVMEM_HAVE_AVX2)
        if (strcmp(isa, "avx2") == 0 || strcmp(isa, "avx512") == 0) {
            kvm_rope_rows_neox_avx2(r, x, n_rows, stride, cs, cs_stride);
            return;
        }
#endif
        (void)isa;
    }
    for (size_t i = 0; i < n_rows; i++) kvm_rope_rotate(r, x + i * stride, cs + i * cs_stride, cs + i * cs_stride + np, 0);
}
