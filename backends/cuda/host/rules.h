/* Exact per-element rules shared by the CUDA kernels and the host: the same
 * source compiles as __host__ __device__ code inside the plugin and as plain
 * C in kvmem_cuda_host (built with -ffp-contract=off), where
 * tests/backend/test_cuda_host.c compares it bit for bit with the core's
 * scalar references (core/cpu/half.h, kvm_rope_rotate, the ART stop rule
 * of core/attend/attend_cpu.c). So what
 * the kernels compute per element is checked on machines without a GPU.
 *
 * Every float operation is a single, explicitly rounded step: on the device
 * the __f*_rn intrinsics (never contracted into an FMA), on the host the
 * plain operators without contraction. */
#ifndef KVMEM_CUDA_RULES_H
#define KVMEM_CUDA_RULES_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#  define KVM_CU_HD static __host__ __device__ __forceinline__
#else
#  define KVM_CU_HD static inline
#endif

#if defined(__CUDA_ARCH__)
#  define KVM_CU_MUL(a, b) __fmul_rn((a), (b))
#  define KVM_CU_ADD(a, b) __fadd_rn((a), (b))
#  define KVM_CU_SUB(a, b) __fsub_rn((a), (b))
#  define KVM_CU_DIV(a, b) __fdiv_rn((a), (b))
#  define KVM_CU_DMUL(a, b) __dmul_rn((a), (b))
#  define KVM_CU_DADD(a, b) __dadd_rn((a), (b))
#else
#  define KVM_CU_MUL(a, b) ((a) * (b))
#  define KVM_CU_ADD(a, b) ((a) + (b))
#  define KVM_CU_SUB(a, b) ((a) - (b))
#  define KVM_CU_DIV(a, b) ((a) / (b))
#  define KVM_CU_DMUL(a, b) ((a) * (b))
#  define KVM_CU_DADD(a, b) ((a) + (b))
#endif

KVM_CU_HD uint32_t kvm_cu_f32_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
#endif
}
KVM_CU_HD float kvm_cu_bits_f32(uint32_t x) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(x);
#else
    float f;
    memcpy(&f, &x, 4);
    return f;
#endif
}

/* ---- f16 (core/cpu/half.h: RNE, NaN payloads as x86 F16C) ---- */
KVM_CU_HD uint16_t kvm_cu_f32_to_f16(float f) {
    uint32_t x = kvm_cu_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    }
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {
        float a = KVM_CU_ADD(kvm_cu_bits_f32(ax), 0.5f);
        return (uint16_t)(sign | (uint16_t)(kvm_cu_f32_bits(a) - 0x3f000000u));
    }
    uint32_t odd = (ax >> 13) & 1u;
    ax += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
    return (uint16_t)(sign | (uint16_t)(ax >> 13));
}

KVM_CU_HD float kvm_cu_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) return kvm_cu_bits_f32(kvm_cu_f32_bits(KVM_CU_MUL((float)m, 5.9604644775390625e-8f)) | sign);
    if (e == 31) return kvm_cu_bits_f32(sign | 0x7f800000u | (m ? 0x400000u : 0u) | (m << 13));
    return kvm_cu_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* ---- RoPE (kvm_rope_rotate, forward) ---- */
KVM_CU_HD void kvm_cu_rope_pair(float x0, float x1, float c, float s, float af, float *y0, float *y1) {
    float a = KVM_CU_SUB(KVM_CU_MUL(x0, c), KVM_CU_MUL(x1, s));
    float b = KVM_CU_ADD(KVM_CU_MUL(x0, s), KVM_CU_MUL(x1, c));
    if (af != 1.0f) {
        a = KVM_CU_MUL(a, af);
        b = KVM_CU_MUL(b, af);
    }
    *y0 = a;
    *y1 = b;
}

/* The angle of base + pos from the angles of base (cb, sb) and pos (cp, sp)
 * by angle addition, as the device mirror rotates keys on the fly
 * (backend.h, dev_attend; the Vulkan attend shader's load_k_rot). */
KVM_CU_HD void kvm_cu_rope_angle_add(float cb, float sb, float cp, float sp, float *c, float *s) {
    *c = KVM_CU_SUB(KVM_CU_MUL(cb, cp), KVM_CU_MUL(sb, sp));
    *s = KVM_CU_ADD(KVM_CU_MUL(sb, cp), KVM_CU_MUL(cb, sp));
}

/* ---- ART stop rule (core/attend/attend_cpu.c: probe_fill, rule_step) ---- */
#define KVM_CU_PROBE 32

/* Element f of the stream's G*D output that probe entry i reads: the
 * strided probe z_i = o[i*s + s/2], s = N/32, when N > 32; else every
 * element (n = N). Returns the probe length. */
KVM_CU_HD int kvm_cu_probe_len(int32_t n_elems) { return n_elems > KVM_CU_PROBE ? KVM_CU_PROBE : n_elems; }
KVM_CU_HD int64_t kvm_cu_probe_elem(int32_t n_elems, int i) {
    if (n_elems <= KVM_CU_PROBE) return i;
    int64_t s = n_elems / KVM_CU_PROBE;
    return (int64_t)i * s + s / 2;
}
/* Probe value of element (acc, l): the strided probe divides, the whole
 * vector (N <= 32) multiplies by 1/l, as the reference does. */
KVM_CU_HD float kvm_cu_probe_value(int32_t n_elems, float acc, float l) {
    if (n_elems > KVM_CU_PROBE) return l > 0.0f ? KVM_CU_DIV(acc, l) : 0.0f;
    const float inv = l > 0.0f ? KVM_CU_DIV(1.0f, l) : 0.0f;
    return KVM_CU_MUL(acc, inv);
}

/* The rule's state of one stream. */
typedef struct kvm_cu_rule {
    double prev_norm;
    int32_t has_prev, streak, done, visited;
} kvm_cu_rule;

/* One tile's verdict on probe z[0..n) against prev (updated to z): returns
 * 1 when the stream stops now. stop_enabled: tau_s or tau_d nonzero. */
KVM_CU_HD int kvm_cu_rule_step(kvm_cu_rule *rs, float *prev, const float *z, int n, float tau_s, float tau_d,
                                int32_t patience, int stop_enabled) {
    double nz = 0, dot = 0;
    for (int i = 0; i < n; i++) {
        nz = KVM_CU_DADD(nz, KVM_CU_DMUL((double)z[i], (double)z[i]));
        dot = KVM_CU_DADD(dot, KVM_CU_DMUL((double)z[i], (double)prev[i]));
    }
    nz = sqrt(nz);
    int fire = 0;
    if (rs->has_prev) {
        const double np = rs->prev_norm;
        int ok;
        if (np == 0 || nz == 0) {
            ok = np == 0 && nz == 0;
        } else {
            int scale_ok = fabs(nz - np) <= KVM_CU_DMUL((double)tau_s, np);
            int dir_ok = 1.0 - dot / KVM_CU_DMUL(nz, np) <= (double)tau_d;
            ok = scale_ok && dir_ok;
        }
        rs->streak = ok ? rs->streak + 1 : 0;
        fire = stop_enabled && rs->streak >= patience;
    }
    for (int i = 0; i < n; i++) prev[i] = z[i];
    rs->prev_norm = nz;
    rs->has_prev = 1;
    return fire;
}

#endif
