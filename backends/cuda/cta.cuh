// CTA-wide building blocks shared by several kernels: an exclusive scan
// and a bitonic sort of (key, index) pairs. Inline device functions only
// (no kernels), so several translation units may include this.
#pragma once
#include "common.cuh"

namespace kvmcu {

// Exclusive prefix sum of one int per thread over the CTA; returns the
// thread's offset and writes the total to *total. Uses scratch[32].
__device__ inline int cta_exclusive_scan(int v, int *scratch, int *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) scratch[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < n_warps ? scratch[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        if (lane < n_warps) scratch[lane] = w; // inclusive warp totals
    }
    __syncthreads();
    int base = warp ? scratch[warp - 1] : 0;
    *total = scratch[n_warps - 1];
    __syncthreads();
    return base + x - v;
}

// (key, index) pairs ordered by key descending, then index ascending.
__device__ __forceinline__ bool rr_before(uint2 a, uint2 b) { return a.x > b.x || (a.x == b.x && a.y < b.y); }

// Bitonic sort of n (a power of two) pairs by rr_before, by the whole CTA.
__device__ inline void cta_bitonic_sort(uint2 *x, int n) {
    for (int k = 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                int ixj = i ^ j;
                if (ixj > i) {
                    uint2 a = x[i], b = x[ixj];
                    bool up = (i & k) == 0;
                    if (up ? rr_before(b, a) : rr_before(a, b)) {
                        x[i] = b;
                        x[ixj] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
}

}  // namespace kvmcu
