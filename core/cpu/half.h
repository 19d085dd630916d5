/* Scalar f16/bf16 <-> f32 conversions: the reference the SIMD paths must
 * match bit for bit. Rounding is round-to-nearest-even. NaN handling follows
 * x86 F16C: a NaN keeps its sign and top payload bits and comes out quiet. */
#ifndef KVMEM_CPU_HALF_H
#define KVMEM_CPU_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t kvm_f32_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}
static inline float kvm_bits_f32(uint32_t x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static inline uint16_t kvm_f32_to_f16(float f) {
    uint32_t x = kvm_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) { /* Inf or NaN */
        if (ax == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    }
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to Inf */
    if (ax < 0x38800000u) {
        /* Below the smallest normal f16 (2^-14): adding 0.5 puts the f16
         * subnormal unit (2^-24) at the f32 ulp, so the FPU rounds (RNE). */
        float a = kvm_bits_f32(ax) + 0.5f;
        return (uint16_t)(sign | (uint16_t)(kvm_f32_bits(a) - 0x3f000000u));
    }
    uint32_t odd = (ax >> 13) & 1u;
    ax += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
    return (uint16_t)(sign | (uint16_t)(ax >> 13));
}

static inline float kvm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float f = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
        return kvm_bits_f32(kvm_f32_bits(f) | sign);
    }
    if (e == 31) return kvm_bits_f32(sign | 0x7f800000u | (m ? 0x400000u : 0u) | (m << 13));
    return kvm_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static inline uint16_t kvm_f32_to_bf16(float f) {
    uint32_t x = kvm_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float kvm_bf16_to_f32(uint16_t b) { return kvm_bits_f32((uint32_t)b << 16); }

#endif
