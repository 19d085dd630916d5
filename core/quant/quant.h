/* Quantized KV storage: a pool block's layout of its sections. The formats
 * themselves (groups, rounding, error bounds, a section's byte layout) are
 * defined in quant_layout.h; encoding and decoding sections is the CPU
 * backend's (cpu/quant_codec.h). */
#ifndef KVMEM_QUANT_H
#define KVMEM_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kvmem.h"
#include "quant_layout.h" /* the formats: groups, section layout */

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

#endif
