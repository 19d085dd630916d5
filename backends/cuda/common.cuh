// Shared pieces of the CUDA kernels: element loads/stores with the CPU
// backend's exact rounding, compile-time dispatch of run-time sizes, warp
// reductions. Header-only; every op is one header (a kernel plus a host
// launcher that returns cudaError_t, takes the stream last and never
// allocates: the caller passes workspace).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "host/rules.h"

namespace kvmcu {

// ---- dtypes: the backend's F32/F16/BF16 (kvmem_dtype values 0, 1, 2) ----
enum DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// Bit-level conversions identical to core/cpu/half.h (round to nearest even,
// NaN payloads as x86 F16C), so the conformance suite can ask for equality:
// the shared host/device rules that test_cuda_host checks on the CPU.
__device__ __forceinline__ uint16_t f32_to_f16_bits(float f) { return kvm_cu_f32_to_f16(f); }
__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) { return kvm_cu_f16_to_f32(h); }

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

// Typed loads/stores through f32. Storage types: float, __half, __nv_bfloat16.
template <typename T> struct Elem;
template <> struct Elem<float> {
    static constexpr DType dtype = kF32;
    __device__ __forceinline__ static float load(const float *p) { return *p; }
    __device__ __forceinline__ static void store(float *p, float v) { *p = v; }
};
template <> struct Elem<__half> {
    static constexpr DType dtype = kF16;
    __device__ __forceinline__ static float load(const __half *p) {
        return f16_bits_to_f32(*reinterpret_cast<const uint16_t *>(p));
    }
    __device__ __forceinline__ static void store(__half *p, float v) {
        *reinterpret_cast<uint16_t *>(p) = f32_to_f16_bits(v);
    }
};
template <> struct Elem<__nv_bfloat16> {
    static constexpr DType dtype = kBF16;
    __device__ __forceinline__ static float load(const __nv_bfloat16 *p) {
        return bf16_bits_to_f32(*reinterpret_cast<const uint16_t *>(p));
    }
    __device__ __forceinline__ static void store(__nv_bfloat16 *p, float v) {
        *reinterpret_cast<uint16_t *>(p) = f32_to_bf16_bits(v);
    }
};

template <typename T> __device__ __forceinline__ float ld(const T *p) { return Elem<T>::load(p); }
template <typename T> __device__ __forceinline__ void st(T *p, float v) { Elem<T>::store(p, v); }

// ---- warp reductions ----
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Order-preserving map of a float to an unsigned key (larger float, larger
// key; NaN above +inf), for radix selection and atomicMax on floats.
__device__ __forceinline__ uint32_t float_key(float f) {
    uint32_t x = __float_as_uint(f);
    return (x & 0x80000000u) ? ~x : (x | 0x80000000u);
}
__device__ __forceinline__ float key_float(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

}  // namespace kvmcu

// ---- compile-time dispatch of run-time values (FlashInfer style) ----
// DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, { kernel<HEAD_DIM><<<...>>>(...); })
// returns cudaErrorInvalidValue for a head dim without a compiled kernel;
// kvm_cu_head_dim_supported() (host/cuda_host.h) lists the same set.
#define KVM_CU_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, ...)      \
    switch (head_dim) {                                        \
    case 64: {                                                 \
        constexpr int HEAD_DIM = 64;                           \
        __VA_ARGS__                                            \
        break;                                                 \
    }                                                          \
    case 128: {                                                \
        constexpr int HEAD_DIM = 128;                          \
        __VA_ARGS__                                            \
        break;                                                 \
    }                                                          \
    case 256: {                                                \
        constexpr int HEAD_DIM = 256;                          \
        __VA_ARGS__                                            \
        break;                                                 \
    }                                                          \
    default:                                                   \
        return cudaErrorInvalidValue;                          \
    }

// DISPATCH_DTYPE(dtype, T, {...}) for F32/F16/BF16 storage.
#define KVM_CU_DISPATCH_DTYPE(dtype, T, ...)                   \
    switch (dtype) {                                           \
    case kvmcu::kF32: {                                        \
        using T = float;                                       \
        __VA_ARGS__                                            \
        break;                                                 \
    }                                                          \
    case kvmcu::kF16: {                                        \
        using T = __half;                                      \
        __VA_ARGS__                                            \
        break;                                                 \
    }                                                          \
    case kvmcu::kBF16: {                                       \
        using T = __nv_bfloat16;                               \
        __VA_ARGS__                                            \
        break;                                                 \
    }                                                          \
    default:                                                   \
        return cudaErrorInvalidValue;                          \
    }

// DISPATCH_HALF(dtype, T, {...}) for the 16-bit MMA operand types.
#define KVM_CU_DISPATCH_HALF(dtype, T, ...)                    \
    switch (dtype) {                                           \
    case kvmcu::kF16: {                                        \
        using T = __half;                                      \
        __VA_ARGS__                                            \
        break;                                                 \
    }                                                          \
    case kvmcu::kBF16: {                                       \
        using T = __nv_bfloat16;                               \
        __VA_ARGS__                                            \
        break;                                                 \
    }                                                          \
    default:                                                   \
        return cudaErrorInvalidValue;                          \
    }
