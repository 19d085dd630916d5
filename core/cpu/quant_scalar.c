/* Scalar quantization kernels: the reference the SIMD tables must match bit
 * for bit. Groups run along each row; the last group of a row may be partial. */
#include "quant_ref.h"

static void q8_quant(const float *x, size_t n, size_t dim, uint16_t *scales, int8_t *codes) {
    size_t G = (dim + KVM_Q8_GROUP - 1) / KVM_Q8_GROUP;
    for (size_t r = 0; r < n; r++)
        for (size_t g = 0; g < G; g++) {
            size_t i0 = g * KVM_Q8_GROUP, k = dim - i0 < KVM_Q8_GROUP ? dim - i0 : KVM_Q8_GROUP;
            kvm_q8_group_quant_ref(x + r * dim + i0, k, codes + r * dim + i0, scales + r * G + g);
        }
}

static void q8_dequant(const uint16_t *scales, const int8_t *codes, size_t n, size_t dim, float *out) {
    size_t G = (dim + KVM_Q8_GROUP - 1) / KVM_Q8_GROUP;
    for (size_t r = 0; r < n; r++)
        for (size_t i = 0; i < dim; i++)
            out[r * dim + i] = (float)codes[r * dim + i] * kvm_f16_to_f32(scales[r * G + i / KVM_Q8_GROUP]);
}

static void q4_quant(const float *x, size_t n, size_t dim, uint32_t *words, uint16_t *scales, uint16_t *biases) {
    size_t G = (dim + KVM_Q4_GROUP - 1) / KVM_Q4_GROUP, W = (dim + 7) / 8;
    for (size_t r = 0; r < n; r++)
        for (size_t g = 0; g < G; g++) {
            size_t i0 = g * KVM_Q4_GROUP, k = dim - i0 < KVM_Q4_GROUP ? dim - i0 : KVM_Q4_GROUP;
            kvm_q4_group_quant_ref(x + r * dim + i0, k, words + r * W + i0 / 8, scales + r * G + g,
                                   biases + r * G + g);
        }
}

static void q4_dequant(const uint32_t *words, const uint16_t *scales, const uint16_t *biases, size_t n,
                       size_t dim, float *out) {
    size_t G = (dim + KVM_Q4_GROUP - 1) / KVM_Q4_GROUP, W = (dim + 7) / 8;
    for (size_t r = 0; r < n; r++)
        for (size_t g = 0; g < G; g++) {
            size_t i0 = g * KVM_Q4_GROUP, k = dim - i0 < KVM_Q4_GROUP ? dim - i0 : KVM_Q4_GROUP;
            kvm_q4_group_dequant_ref(words + r * W + i0 / 8, k, kvm_f16_to_f32(scales[r * G + g]),
                                     kvm_f16_to_f32(biases[r * G + g]), out + r * dim + i0);
        }
}

static void q4c_quant(const float *x, size_t n, size_t dim, const float *mn, const float *mx, uint32_t *words,
                      uint16_t *scales, uint16_t *biases) {
    size_t W = (dim + 7) / 8;
    float sb[2 * 1024 + 1], *b = sb, *inv = sb + 1024;
    for (size_t d = 0; d < dim; d++) {
        float s;
        kvm_q4_params(mn[d], mx[d], scales + d, biases + d, &s, b + d, inv + d);
    }
    for (size_t r = 0; r < n; r++)
        for (size_t w = 0; w < W; w++) {
            uint32_t word = 0;
            for (size_t j = 0; j < 8 && w * 8 + j < dim; j++) {
                size_t d = w * 8 + j;
                word |= kvm_q4_code(x[r * dim + d], b[d], inv[d]) << (4 * j);
            }
            words[r * W + w] = word;
        }
}

static void q4c_dequant(const uint32_t *words, const uint16_t *scales, const uint16_t *biases, size_t n,
                        size_t dim, float *out) {
    size_t W = (dim + 7) / 8;
    for (size_t r = 0; r < n; r++)
        for (size_t d = 0; d < dim; d++)
            out[r * dim + d] = (float)((words[r * W + d / 8] >> (4 * (d % 8))) & 15u) * kvm_f16_to_f32(scales[d]) +
                               kvm_f16_to_f32(biases[d]);
}

static void f16_round(const float *x, size_t n, int up, uint16_t *out) {
    for (size_t i = 0; i < n; i++) out[i] = up ? kvm_f16_up_inline(x[i]) : kvm_f16_down_inline(x[i]);
}

const kvm_quant_kernels kvm_quant_scalar = {
    "scalar", q8_quant, q8_dequant, q4_quant, q4_dequant, q4c_quant, q4c_dequant, f16_round, kvm_f16_boxes_bad_ref,
};
