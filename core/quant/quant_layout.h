/* Quantized KV storage formats: Q8, Q4 (MLX affine layout) and Q4 KIVI, as
 * the core encodes and decodes them (quant.h: the host kernels).
 *
 * Every format works on a "section": the n rows of `dim` values of one
 * (K or V, layer, head) of a block, rows of one token each. Rows decode
 * independently, so any row range of a section can be read.
 *
 * Q8    per row: ceil(dim/32) groups of 32 values along the row, the last one
 *       partial when dim is not a multiple of 32. Code q in [-127, 127],
 *       f16 scale s = absmax/127 rounded UP to f16, x' = q*s.
 *       Bound: |x - x'| <= s/2 (+ f32 rounding, < 2^-22 |x|), so
 *       |x - x'| <= absmax_g/254 * (1 + 2^-10) + 2^-25 (the last term: f16's
 *       smallest step 2^-24, which bounds s from below once absmax_g/127 is
 *       an f16 subnormal, below 2^-14; a conformance test found such groups).
 * Q4    per row: ceil(dim/64) groups of 64 along the row (last partial).
 *       Codes q in [0, 15] packed 8 per uint32 word, low bits first (the MLX
 *       affine layout: value i of a row sits in word i/8 at bits 4*(i%8));
 *       a row has ceil(dim/8) words, unused high nibbles of the last word 0.
 *       f16 bias b = min_g rounded DOWN to f16, f16 scale s = (max_g - b)/15
 *       rounded UP, x' = q*s + b, q = round((x - b)/s) clamped to [0, 15].
 *       Bound: |x - x'| <= s/2 + f32 rounding (< 2^-21 (|x| + |b|)), with
 *       s <= (max_g - min_g + ulp16(min_g))/15 * (1 + 2^-10) + 2^-24.
 * Q4 KIVI  values exactly as Q4. Keys per channel: one (scale, bias) per
 *       channel d over the n tokens of the block (KIVI's observation that key
 *       outliers live in channels), same rounding and bound with the channel's
 *       min/max over the block's tokens. Same packed code layout.
 *
 * Section byte layout (each part padded to 4 bytes so the next one is
 * word-aligned):
 *   Q8:        scales [n][G32] f16, codes [n][dim] int8
 *   Q4:        words [n][W] u32, scales [n][G64] f16, biases [n][G64] f16
 *   KIVI keys: words [n][W] u32, scales [dim] f16, biases [dim] f16
 * with W = ceil(dim/8), G32 = ceil(dim/32), G64 = ceil(dim/64).
 *
 * Inputs must be finite with |x| <= 65504 (so biases and scales fit f16);
 * the pool checks that at append time. */
#ifndef KVMEM_QUANT_LAYOUT_H
#define KVMEM_QUANT_LAYOUT_H

#include <stddef.h>

#include "kvmem.h"

#define KVM_Q8_GROUP 32
#define KVM_Q4_GROUP 64
#define KVM_QUANT_LIMIT 65504.0f

/* Parts of a section of n rows of `dim` (which: 0 = keys, 1 = values). */
typedef struct kvm_qsection {
    size_t codes_off, codes_bytes;  /* int8 codes (Q8) or u32 words (Q4) */
    size_t scales_off, scales_bytes;
    size_t biases_off, biases_bytes; /* 0 for Q8 */
    size_t bytes;                    /* whole section, padded */
    int per_channel;                 /* KIVI keys */
} kvm_qsection;

/* Layout of a section; raw dtypes get codes = the rows themselves. Inline
 * (header-only) so the device plugins, which cannot link the core's hidden
 * symbols, share this one definition. */
static inline size_t kvm_qpad4(size_t x) { return (x + 3) & ~(size_t)3; }
static inline kvm_qsection kvm_qsection_layout(kvmem_dtype dt, int which, size_t n, size_t dim) {
    kvm_qsection q = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t W = (dim + 7) / 8, G;
    switch (dt) {
    case KVMEM_Q8:
        q.scales_bytes = n * ((dim + KVM_Q8_GROUP - 1) / KVM_Q8_GROUP) * 2;
        q.codes_off = kvm_qpad4(q.scales_bytes);
        q.codes_bytes = n * dim;
        q.bytes = kvm_qpad4(q.codes_off + q.codes_bytes);
        break;
    case KVMEM_Q4:
    case KVMEM_Q4_KIVI:
        q.per_channel = dt == KVMEM_Q4_KIVI && which == 0;
        G = q.per_channel ? dim : n * ((dim + KVM_Q4_GROUP - 1) / KVM_Q4_GROUP);
        q.codes_bytes = n * W * 4;
        q.scales_off = q.codes_bytes;
        q.scales_bytes = G * 2;
        q.biases_off = kvm_qpad4(q.scales_off + q.scales_bytes);
        q.biases_bytes = G * 2;
        q.bytes = kvm_qpad4(q.biases_off + q.biases_bytes);
        break;
    default:
        q.codes_bytes = n * dim * (dt == KVMEM_F32 ? 4u : 2u);
        q.bytes = q.codes_bytes;
        break;
    }
    return q;
}

#endif
