// Q8 / Q4 quantize and dequantize (DESIGN.md, storage dtypes).
//   Q8: int8, groups of 32 consecutive values, one f16 scale per group:
//       scale = absmax / 127, q = rint(x / scale) in [-127, 127], x' = q * scale.
//   Q4: the MLX affine format, groups of 64, f16 scale and bias per group,
//       eight 4-bit values per little-endian uint32 (element 0 in bits 0-3):
//       scale = (max - min) / 15, bias = min, q = rint((x - bias) / scale) in [0, 15],
//       x' = q * scale + bias.
// The scale and bias are rounded to f16 before q is computed, so dequantizing
// uses exactly the stored values. n must be a multiple of the group size.
// One warp per group: the group's statistics are warp reductions.
#pragma once
#include "common.cuh"

namespace kvmcu {

template <typename T>
__global__ void quantize_q8_kernel(const T *__restrict__ x, size_t n_groups, int8_t *__restrict__ q,
                                   __half *__restrict__ scales) {
    const int lane = threadIdx.x & 31;
    const size_t warps = (size_t)gridDim.x * (blockDim.x >> 5);
    for (size_t g = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); g < n_groups; g += warps) {
        const float v = ld(x + g * 32 + lane);
        const float amax = warp_max(fabsf(v));
        uint16_t sb = f32_to_f16_bits(amax / 127.0f);
        const float s = f16_bits_to_f32(sb);
        float r = s > 0.0f ? rintf(v / s) : 0.0f;
        r = fminf(fmaxf(r, -127.0f), 127.0f);
        q[g * 32 + lane] = (int8_t)r;
        if (lane == 0) reinterpret_cast<uint16_t *>(scales)[g] = sb;
    }
}

template <typename T>
__global__ void dequantize_q8_kernel(const int8_t *__restrict__ q, const __half *__restrict__ scales, size_t n,
                                     T *__restrict__ y) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float s = f16_bits_to_f32(reinterpret_cast<const uint16_t *>(scales)[i / 32]);
        st(y + i, (float)q[i] * s);
    }
}

template <typename T>
__global__ void quantize_q4_kernel(const T *__restrict__ x, size_t n_groups, uint32_t *__restrict__ w,
                                   __half *__restrict__ scales, __half *__restrict__ biases) {
    const int lane = threadIdx.x & 31;
    const size_t warps = (size_t)gridDim.x * (blockDim.x >> 5);
    for (size_t g = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); g < n_groups; g += warps) {
        const float v0 = ld(x + g * 64 + 2 * lane), v1 = ld(x + g * 64 + 2 * lane + 1);
        const float mx = warp_max(fmaxf(v0, v1)), mn = -warp_max(-fminf(v0, v1));
        const uint16_t sb = f32_to_f16_bits((mx - mn) / 15.0f), bb = f32_to_f16_bits(mn);
        const float s = f16_bits_to_f32(sb), b = f16_bits_to_f32(bb);
        float q0 = s > 0.0f ? rintf((v0 - b) / s) : 0.0f, q1 = s > 0.0f ? rintf((v1 - b) / s) : 0.0f;
        q0 = fminf(fmaxf(q0, 0.0f), 15.0f);
        q1 = fminf(fmaxf(q1, 0.0f), 15.0f);
        // lane i holds elements 2i, 2i+1: one byte; four lanes make a word
        uint32_t byte = (uint32_t)q0 | ((uint32_t)q1 << 4);
        uint32_t word = byte;
        word |= __shfl_down_sync(0xffffffffu, byte, 1) << 8;
        word |= __shfl_down_sync(0xffffffffu, byte, 2) << 16;
        word |= __shfl_down_sync(0xffffffffu, byte, 3) << 24;
        if ((lane & 3) == 0) w[g * 8 + lane / 4] = word;
        if (lane == 0) {
            reinterpret_cast<uint16_t *>(scales)[g] = sb;
            reinterpret_cast<uint16_t *>(biases)[g] = bb;
        }
    }
}

template <typename T>
__global__ void dequantize_q4_kernel(const uint32_t *__restrict__ w, const __half *__restrict__ scales,
                                     const __half *__restrict__ biases, size_t n, T *__restrict__ y) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t q = (w[i / 8] >> (4 * (i % 8))) & 15u;
        const float s = f16_bits_to_f32(reinterpret_cast<const uint16_t *>(scales)[i / 64]);
        const float b = f16_bits_to_f32(reinterpret_cast<const uint16_t *>(biases)[i / 64]);
        st(y + i, __fadd_rn(__fmul_rn((float)q, s), b));
    }
}

inline cudaError_t quantize_q8(const void *x, DType dt, size_t n, int8_t *q, __half *scales, unsigned blocks,
                               cudaStream_t stream) {
    if (n % 32) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    KVM_CU_DISPATCH_DTYPE(dt, T, {
        quantize_q8_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<const T *>(x), n / 32, q, scales);
    });
    return cudaGetLastError();
}

inline cudaError_t dequantize_q8(const int8_t *q, const __half *scales, size_t n, void *y, DType dt, unsigned blocks,
                                 cudaStream_t stream) {
    if (n % 32) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    KVM_CU_DISPATCH_DTYPE(dt, T, {
        dequantize_q8_kernel<T><<<blocks, 256, 0, stream>>>(q, scales, n, static_cast<T *>(y));
    });
    return cudaGetLastError();
}

inline cudaError_t quantize_q4(const void *x, DType dt, size_t n, uint32_t *w, __half *scales, __half *biases,
                               unsigned blocks, cudaStream_t stream) {
    if (n % 64) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    KVM_CU_DISPATCH_DTYPE(dt, T, {
        quantize_q4_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<const T *>(x), n / 64, w, scales, biases);
    });
    return cudaGetLastError();
}

inline cudaError_t dequantize_q4(const uint32_t *w, const __half *scales, const __half *biases, size_t n, void *y,
                                 DType dt, unsigned blocks, cudaStream_t stream) {
    if (n % 64) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    KVM_CU_DISPATCH_DTYPE(dt, T, {
        dequantize_q4_kernel<T><<<blocks, 256, 0, stream>>>(w, scales, biases, n, static_cast<T *>(y));
    });
    return cudaGetLastError();
}

}  // namespace kvmcu
