/* Quantized sections: encode/decode entry points through the kernel table,
 * f16 directed rounding. */
#include "quant_codec.h"
#include "quant_ref.h"

#include <string.h>

void kvm_quant_section(kvmem_dtype dt, int which, const float *x, size_t n, size_t dim, const float *mn,
                       const float *mx, void *dst) {
    const kvm_quant_kernels *k = kvm_cpu_kernels_get()->quant;
    kvm_qsection q = kvm_qsection_layout(dt, which, n, dim);
    unsigned char *d = dst;
    if (dt == KVMEM_Q8) {
        k->q8_quant(x, n, dim, (uint16_t *)(void *)(d + q.scales_off), (int8_t *)(d + q.codes_off));
    } else if (q.per_channel) {
        k->q4c_quant(x, n, dim, mn, mx, (uint32_t *)(void *)d, (uint16_t *)(void *)(d + q.scales_off),
                     (uint16_t *)(void *)(d + q.biases_off));
    } else {
        k->q4_quant(x, n, dim, (uint32_t *)(void *)d, (uint16_t *)(void *)(d + q.scales_off),
                    (uint16_t *)(void *)(d + q.biases_off));
    }
    if (q.bytes > q.codes_off + q.codes_bytes && dt == KVMEM_Q8) /* padding: deterministic files */
        memset(d + q.codes_off + q.codes_bytes, 0, q.bytes - q.codes_off - q.codes_bytes);
    if (dt != KVMEM_Q8) {
        memset(d + q.scales_off + q.scales_bytes, 0, q.biases_off - q.scales_off - q.scales_bytes);
        memset(d + q.biases_off + q.biases_bytes, 0, q.bytes - q.biases_off - q.biases_bytes);
    }
}

void kvm_dequant_section(kvmem_dtype dt, int which, const void *src, size_t n, size_t dim, size_t row0,
                         size_t cnt, float *out) {
    const kvm_quant_kernels *k = kvm_cpu_kernels_get()->quant;
    kvm_qsection q = kvm_qsection_layout(dt, which, n, dim);
    const unsigned char *s = src;
    size_t W = (dim + 7) / 8;
    if (dt == KVMEM_Q8) {
        size_t G = (dim + KVM_Q8_GROUP - 1) / KVM_Q8_GROUP;
        k->q8_dequant((const uint16_t *)(const void *)(s + q.scales_off) + row0 * G,
                      (const int8_t *)(s + q.codes_off) + row0 * dim, cnt, dim, out);
    } else if (q.per_channel) {
        k->q4c_dequant((const uint32_t *)(const void *)s + row0 * W, (const uint16_t *)(const void *)(s + q.scales_off),
                       (const uint16_t *)(const void *)(s + q.biases_off), cnt, dim, out);
    } else {
        size_t G = (dim + KVM_Q4_GROUP - 1) / KVM_Q4_GROUP;
        k->q4_dequant((const uint32_t *)(const void *)s + row0 * W,
                      (const uint16_t *)(const void *)(s + q.scales_off) + row0 * G,
                      (const uint16_t *)(const void *)(s + q.biases_off) + row0 * G, cnt, dim, out);
    }
}

void kvm_quant_parts(kvmem_dtype dt, int which, const float *x, size_t n, size_t dim, const float *mn,
                     const float *mx, kvm_qparts dst) {
    const kvm_quant_kernels *k = kvm_cpu_kernels_get()->quant;
    kvm_qsection q = kvm_qsection_layout(dt, which, n, dim);
    if (dt == KVMEM_Q8)
        k->q8_quant(x, n, dim, (uint16_t *)(void *)dst.scales, (int8_t *)dst.codes);
    else if (q.per_channel)
        k->q4c_quant(x, n, dim, mn, mx, (uint32_t *)(void *)dst.codes, (uint16_t *)(void *)dst.scales,
                     (uint16_t *)(void *)dst.biases);
    else
        k->q4_quant(x, n, dim, (uint32_t *)(void *)dst.codes, (uint16_t *)(void *)dst.scales,
                    (uint16_t *)(void *)dst.biases);
}

void kvm_dequant_parts(kvmem_dtype dt, int which, kvm_qparts src, size_t n, size_t dim, size_t row0, size_t cnt,
                       float *out) {
    const kvm_quant_kernels *k = kvm_cpu_kernels_get()->quant;
    kvm_qsection q = kvm_qsection_layout(dt, which, n, dim);
    const size_t W = (dim + 7) / 8;
    if (dt == KVMEM_Q8) {
        size_t G = (dim + KVM_Q8_GROUP - 1) / KVM_Q8_GROUP;
        k->q8_dequant((const uint16_t *)(const void *)src.scales + row0 * G, (const int8_t *)src.codes + row0 * dim, cnt,
                      dim, out);
    } else if (q.per_channel) {
        k->q4c_dequant((const uint32_t *)(const void *)src.codes + row0 * W, (const uint16_t *)(const void *)src.scales,
                       (const uint16_t *)(const void *)src.biases, cnt, dim, out);
    } else {
        size_t G = (dim + KVM_Q4_GROUP - 1) / KVM_Q4_GROUP;
        k->q4_dequant((const uint32_t *)(const void *)src.codes + row0 * W,
                      (const uint16_t *)(const void *)src.scales + row0 * G,
                      (const uint16_t *)(const void *)src.biases + row0 * G, cnt, dim, out);
    }
}

uint16_t kvm_f16_round_down(float x) { return kvm_f16_down_inline(x); }
uint16_t kvm_f16_round_up(float x) { return kvm_f16_up_inline(x); }
