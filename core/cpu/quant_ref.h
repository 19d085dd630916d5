/* Per-group reference steps shared by the scalar and SIMD quantizers, so
 * every path picks the same scale and bias and the codes agree bit for bit. */
#ifndef KVMEM_QUANT_REF_H
#define KVMEM_QUANT_REF_H

#include "half.h"
#include "kernels.h"
#include "../quant/quant.h"

#include <math.h>

/* f16 conversions on the per-group path: the SIMD files define
 * KVM_QUANT_F16C and get the F16C instructions, which round exactly like the
 * scalar reference (RNE), so every table picks the same scales and biases. */
#ifdef KVM_QUANT_F16C
#  include <immintrin.h>
static inline uint16_t kvm_qf16(float x) { return (uint16_t)_cvtss_sh(x, 0); }
static inline float kvm_qf32(uint16_t h) { return _cvtsh_ss(h); }
#else
static inline uint16_t kvm_qf16(float x) { return kvm_f32_to_f16(x); }
static inline float kvm_qf32(uint16_t h) { return kvm_f16_to_f32(h); }
#endif

/* f16 rounding toward -inf / +inf, inlined: they sit on every group's path. */
static inline uint16_t kvm_f16_step(uint16_t h, int up) {
    int neg = (h & 0x8000u) != 0;
    if ((h & 0x7fffu) == 0) return up ? 0x0001u : 0x8001u;
    return (uint16_t)((up != neg) ? h + 1 : h - 1);
}
#ifdef KVM_QUANT_F16C
/* F16C rounds toward -inf / +inf itself: the same f16 as RNE-then-step */
static inline uint16_t kvm_f16_down_inline(float x) { return (uint16_t)_cvtss_sh(x, _MM_FROUND_TO_NEG_INF); }
static inline uint16_t kvm_f16_up_inline(float x) { return (uint16_t)_cvtss_sh(x, _MM_FROUND_TO_POS_INF); }
#else
static inline uint16_t kvm_f16_down_inline(float x) {
    uint16_t h = kvm_qf16(x);
    return kvm_qf32(h) > x ? kvm_f16_step(h, 0) : h;
}
static inline uint16_t kvm_f16_up_inline(float x) {
    uint16_t h = kvm_qf16(x);
    return kvm_qf32(h) < x ? kvm_f16_step(h, 1) : h;
}
#endif

/* f16 bits to an integer of the same order as the value (+0 and -0 both 0). */
static inline int32_t kvm_f16_order(uint16_t h) {
    int32_t mag = h & 0x7fff;
    return (h & 0x8000u) ? -mag : mag;
}

/* The reference of kvm_quant_kernels.f16_boxes_bad. */
static inline size_t kvm_f16_boxes_bad_ref(const uint16_t *boxes, size_t n, size_t dim) {
    size_t bad = 0;
    for (size_t b = 0; b < n; b++) {
        const uint16_t *hi = boxes + b * 2 * dim, *lo = hi + dim;
        int inv = 0;
        for (size_t d = 0; d < dim; d++) {
            bad += (size_t)((hi[d] & 0x7c00u) == 0x7c00u) + (size_t)((lo[d] & 0x7c00u) == 0x7c00u);
            inv |= kvm_f16_order(lo[d]) > kvm_f16_order(hi[d]);
        }
        bad += (size_t)inv;
    }
    return bad;
}

/* Q4 affine parameters of a group with minimum mn and maximum mx. */
static inline void kvm_q4_params(float mn, float mx, uint16_t *sh, uint16_t *bh, float *s, float *b,
                                 float *inv) {
    *bh = kvm_f16_down_inline(mn);
    *b = kvm_qf32(*bh);
    *sh = kvm_f16_up_inline((mx - *b) / 15.0f);
    *s = kvm_qf32(*sh);
    *inv = *s > 0.0f ? 1.0f / *s : 0.0f;
}

static inline uint32_t kvm_q4_code(float x, float b, float inv) {
    long q = lrintf((x - b) * inv);
    return (uint32_t)(q < 0 ? 0 : q > 15 ? 15 : q);
}

/* One Q4 group of k <= 64 values starting on a word boundary. */
static inline void kvm_q4_group_quant_ref(const float *x, size_t k, uint32_t *w, uint16_t *sh, uint16_t *bh) {
    float mn = x[0], mx = x[0];
    for (size_t i = 1; i < k; i++) {
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
    }
    float s, b, inv;
    kvm_q4_params(mn, mx, sh, bh, &s, &b, &inv);
    for (size_t i = 0; i < k; i += 8) {
        uint32_t word = 0;
        for (size_t j = 0; j < 8 && i + j < k; j++) word |= kvm_q4_code(x[i + j], b, inv) << (4 * j);
        w[i / 8] = word;
    }
}

static inline void kvm_q4_group_dequant_ref(const uint32_t *w, size_t k, float s, float b, float *out) {
    for (size_t i = 0; i < k; i++) out[i] = (float)((w[i / 8] >> (4 * (i % 8))) & 15u) * s + b;
}

static inline void kvm_q8_params(float amax, uint16_t *sh, float *inv) {
    *sh = kvm_f16_up_inline(amax / 127.0f);
    float s = kvm_qf32(*sh);
    *inv = s > 0.0f ? 1.0f / s : 0.0f;
}

static inline int8_t kvm_q8_code(float x, float inv) {
    long q = lrintf(x * inv);
    return (int8_t)(q < -127 ? -127 : q > 127 ? 127 : q);
}

static inline void kvm_q8_group_quant_ref(const float *x, size_t k, int8_t *q, uint16_t *sh) {
    float amax = 0.0f;
    for (size_t i = 0; i < k; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float inv;
    kvm_q8_params(amax, sh, &inv);
    for (size_t i = 0; i < k; i++) q[i] = kvm_q8_code(x[i], inv);
}

#endif
