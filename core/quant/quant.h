/* Quantized KV storage: Q8, Q4 (MLX affine layout) and Q4 KIVI.
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
 *       an f16 subnormal, below 2^-14; tests/backend/test_backend_quant.c).
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
#ifndef KVMEM_QUANT_H
#define KVMEM_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kvmem.h"

#define KVM_Q8_GROUP 32
#define KVM_Q4_GROUP 64
#define KVM_QUANT_LIMIT 65504.0f

/* Host kernels on one section. `n` rows of `dim` floats, rows `dim` apart. */
typedef struct kvm_quant_kernels {
    const char *name;
    void (*q8_quant)(const float *x, size_t n, size_t dim, uint16_t *scales, int8_t *codes);
    void (*q8_dequant)(const uint16_t *scales, const int8_t *codes, size_t n, size_t dim, float *out);
    void (*q4_quant)(const float *x, size_t n, size_t dim, uint32_t *words, uint16_t *scales,
                     uint16_t *biases);
    void (*q4_dequant)(const uint32_t *words, const uint16_t *scales, const uint16_t *biases, size_t n,
                       size_t dim, float *out);
    /* KIVI keys: per-channel scale/bias from the channel min/max over the
     * n rows (mn, mx given: the block's AABB). */
    void (*q4c_quant)(const float *x, size_t n, size_t dim, const float *mn, const float *mx,
                      uint32_t *words, uint16_t *scales, uint16_t *biases);
    void (*q4c_dequant)(const uint32_t *words, const uint16_t *scales, const uint16_t *biases, size_t n,
                        size_t dim, float *out);
    /* out[i] = x[i] rounded to f16 toward +inf (up) or -inf (AABB corners:
     * a box rounded outward still holds its keys). Bit-identical across tables. */
    void (*f16_round)(const float *x, size_t n, int up, uint16_t *out);
    /* Checks n f16 boxes of 2*dim values (s_max, then s_min) as a loader
     * must: the number of non-finite values plus the number of boxes with
     * some s_min > s_max (+0 and -0 equal). 0: all sane. */
    size_t (*f16_boxes_bad)(const uint16_t *boxes, size_t n, size_t dim);
} kvm_quant_kernels;

/* The table matching the CPU kernel table in use (KVMEM_CPU forces it). */
const kvm_quant_kernels *kvm_quant_kernels_get(void);
const kvm_quant_kernels *kvm_quant_kernels_scalar(void);
const kvm_quant_kernels *kvm_quant_kernels_avx2(void);   /* NULL when not compiled in */
const kvm_quant_kernels *kvm_quant_kernels_avx512(void); /* NULL when not compiled in */

static inline int kvm_is_quant_dtype(kvmem_dtype dt) {
    return dt == KVMEM_Q8 || dt == KVMEM_Q4 || dt == KVMEM_Q4_KIVI;
}

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

/* A quantized block of a pool: its n_sec = 2 * n_layers * n_kv_heads
 * sections (K then V, each [layer][head]) stored part by part, so each part
 * of all of a block's K (or V) sections is one contiguous region:
 *   codes K | codes V | scales K | scales V | biases K | biases V
 * (section g of K's codes at codes[0] + g * sec[0].codes_bytes, and so on;
 * regions start on 64-byte boundaries, parts inside a region are packed).
 * An agent file lists these regions block after block, so loading a block
 * is a few large copies instead of three small ones per section. */
typedef struct kvm_qblock {
    size_t codes[2], scales[2], biases[2]; /* region offsets, [0] K, [1] V */
    kvm_qsection sec[2];                    /* part sizes of one K / V section */
    size_t bytes;
} kvm_qblock;

static inline size_t kvm_qpad64(size_t x) { return (x + 63) & ~(size_t)63; }
static inline kvm_qblock kvm_qblock_layout(kvmem_dtype dt, size_t n_heads_layers, size_t n, size_t dim) {
    kvm_qblock b;
    size_t off = 0;
    for (int w = 0; w < 2; w++) b.sec[w] = kvm_qsection_layout(dt, w, n, dim);
    for (int w = 0; w < 2; w++) b.codes[w] = off, off = kvm_qpad64(off + n_heads_layers * b.sec[w].codes_bytes);
    for (int w = 0; w < 2; w++) b.scales[w] = off, off = kvm_qpad64(off + n_heads_layers * b.sec[w].scales_bytes);
    for (int w = 0; w < 2; w++) b.biases[w] = off, off = kvm_qpad64(off + n_heads_layers * b.sec[w].biases_bytes);
    b.bytes = off;
    return b;
}

/* The parts of one section (which, g = layer * n_kv_heads + head) of a
 * quantized block at base. */
typedef struct kvm_qparts {
    unsigned char *codes, *scales, *biases;
} kvm_qparts;
static inline kvm_qparts kvm_qblock_parts(const kvm_qblock *b, void *base, int which, size_t g) {
    unsigned char *p = (unsigned char *)base;
    kvm_qparts q;
    q.codes = p + b->codes[which] + g * b->sec[which].codes_bytes;
    q.scales = p + b->scales[which] + g * b->sec[which].scales_bytes;
    q.biases = p + b->biases[which] + g * b->sec[which].biases_bytes;
    return q;
}

/* Encode n rows into the parts of one section (as kvm_quant_section). */
void kvm_quant_parts(kvmem_dtype dt, int which, const float *x, size_t n, size_t dim, const float *mn,
                     const float *mx, kvm_qparts dst);
/* Decode rows [row0, row0 + cnt) of a section of n rows from its parts. */
void kvm_dequant_parts(kvmem_dtype dt, int which, kvm_qparts src, size_t n, size_t dim, size_t row0, size_t cnt,
                       float *out);

/* Encode n f32 rows into a section at dst. mn/mx: per-channel min/max over
 * the rows (needed for KIVI keys, ignored otherwise; may be NULL then). */
void kvm_quant_section(kvmem_dtype dt, int which, const float *x, size_t n, size_t dim, const float *mn,
                       const float *mx, void *dst);
/* Decode rows [row0, row0 + cnt) of a section of n rows into out. */
void kvm_dequant_section(kvmem_dtype dt, int which, const void *src, size_t n, size_t dim, size_t row0,
                         size_t cnt, float *out);

/* f16 rounding toward -inf / +inf (scales up, biases down keep the bound). */
uint16_t kvm_f16_round_down(float x);
uint16_t kvm_f16_round_up(float x);

#endif
