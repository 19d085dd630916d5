// convert: n elements between F32/F16/BF16, bit-identical to the CPU backend.
#pragma once
#include "common.cuh"

namespace kvmcu {

template <typename TD, typename TS>
__global__ void convert_kernel(TD *__restrict__ dst, const TS *__restrict__ src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        st(dst + i, ld(src + i));
}

// Same dtype is a copy; the caller uses cudaMemcpyAsync for it.
inline cudaError_t convert(void *dst, DType ddt, const void *src, DType sdt, size_t n, unsigned blocks,
                           unsigned threads, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    KVM_CU_DISPATCH_DTYPE(ddt, TD, {
        KVM_CU_DISPATCH_DTYPE(sdt, TS, {
            convert_kernel<TD, TS><<<blocks, threads, 0, stream>>>(static_cast<TD *>(dst),
                                                                  static_cast<const TS *>(src), n);
        });
    });
    return cudaGetLastError();
}

}  // namespace kvmcu
