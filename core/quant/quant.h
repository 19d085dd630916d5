/* Quantized KV storage: the host kernels of the Q8, Q4 and Q4 KIVI formats
 * and a pool block's layout of its sections. The formats themselves (groups,
 * rounding, error bounds, a section's byte layout) are defined in
 * quant_layout.h. */
#ifndef KVMEM_QUANT_H
#define KVMEM_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kvmem.h"
#include "quant_layout.h" /* the formats: groups, section layout */

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
