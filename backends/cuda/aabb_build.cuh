// aabb_build: per-dimension min and max over the n_rows keys of each group
// (a block's keys of one layer and KV head). One CTA per group, threads over
// dims; rows are read coalesced. NaN semantics follow the CPU reference: the
// accumulator wins a comparison with NaN, so only a NaN in the first row
// propagates.
#pragma once
#include "common.cuh"

namespace kvmcu {

__global__ void aabb_build_kernel(const float *__restrict__ keys, size_t n_groups, size_t group_stride,
                                  size_t n_rows, size_t dim, float *__restrict__ out_min,
                                  float *__restrict__ out_max) {
    for (size_t g = blockIdx.x; g < n_groups; g += gridDim.x) {
        const float *x = keys + g * group_stride;
        for (size_t d = threadIdx.x; d < dim; d += blockDim.x) {
            float mn = x[d], mx = mn;
            for (size_t r = 1; r < n_rows; r++) {
                float v = x[r * dim + d];
                mn = v < mn ? v : mn;
                mx = v > mx ? v : mx;
            }
            out_min[g * dim + d] = mn;
            out_max[g * dim + d] = mx;
        }
    }
}

inline cudaError_t aabb_build(const float *keys, size_t n_groups, size_t group_stride, size_t n_rows, size_t dim,
                              float *out_min, float *out_max, unsigned blocks, unsigned threads,
                              cudaStream_t stream) {
    if (n_groups == 0 || dim == 0) return cudaSuccess;
    aabb_build_kernel<<<blocks, threads, 0, stream>>>(keys, n_groups, group_stride, n_rows, dim, out_min, out_max);
    return cudaGetLastError();
}

}  // namespace kvmcu
