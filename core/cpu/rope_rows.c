/* Batched forward rotation of many rows (the gather's hot loop), with SIMD
 * variants for NEOX pairing. Every path computes y0 = x0*c - x1*s,
 * y1 = x0*s + x1*c (then * attn_factor) with separately rounded products,
 * exactly like kvm_rope_rotate, so all paths agree bit for bit. */
#include "kernels.h"

#include <string.h>

void kvm_rope_rotate_rows(const kvm_rope *r, float *x, size_t n_rows, size_t stride, const float *cs,
                          size_t cs_stride) {
    const size_t np = (size_t)r->n_pairs;
    if (np == 0) return;
    const kvm_rope_rows_fn simd = kvm_cpu_kernels_get()->rope_rows_neox;
    if (r->style == KVMEM_ROPE_NEOX && simd) {
        simd(r, x, n_rows, stride, cs, cs_stride);
        return;
    }
    for (size_t i = 0; i < n_rows; i++) kvm_rope_rotate(r, x + i * stride, cs + i * cs_stride, cs + i * cs_stride + np, 0);
}
