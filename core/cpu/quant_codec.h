/* Encoding and decoding quantized sections (formats: core/quant/quant.h and
 * quant_layout.h) through the CPU kernel table. */
#ifndef KVMEM_CPU_QUANT_CODEC_H
#define KVMEM_CPU_QUANT_CODEC_H

#include "../quant/quant.h"

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
