// topk: the k highest-scoring blocks, returned in chronological (index)
// order with their scores. Ties break toward the older block (lower index);
// -inf marks a block that must not be selected (excluded by a filter), so
// fewer than k may come back (*n_out says how many).
// One CTA of 1024 threads: a 4-pass radix select on order-preserving float
// keys finds the k-th largest key, a compaction takes everything above it
// plus the oldest ties, and a bitonic sort puts the result in index order.
// Candidate counts of a retrieval (thousands to a few hundred thousand
// blocks) make one CTA the right size: the whole op is a few microseconds.
#pragma once
#include "common.cuh"
#include "cta.cuh"

namespace kvmcu {

__device__ __forceinline__ uint32_t topk_key(float s) {
    // -inf (excluded) and NaN (never meaningful) map to 0: below every candidate
    return (s == -INFINITY || s != s) ? 0u : float_key(s);
}

__global__ void __launch_bounds__(1024)
topk_kernel(const float *__restrict__ scores, int n, int k, int sort_len, int *__restrict__ out_idx,
            float *__restrict__ out_scores, int *__restrict__ n_out) {
    extern __shared__ __align__(16) unsigned char topk_smem[];
    unsigned *hist = reinterpret_cast<unsigned *>(topk_smem);                // 256
    int *sel = reinterpret_cast<int *>(topk_smem + 256 * 4);                   // sort_len
    __shared__ int scratch[32];
    __shared__ uint32_t s_prefix, s_mask;
    __shared__ int s_remaining, s_count;

    // valid candidates
    int local = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) local += topk_key(scores[i]) != 0u;
    int valid;
    (void)cta_exclusive_scan(local, scratch, &valid);
    if (valid < k) k = valid;
    if (threadIdx.x == 0) {
        s_prefix = 0;
        s_mask = 0;
        s_remaining = k;
        s_count = 0;
    }
    __syncthreads();
    if (k == 0) {
        if (threadIdx.x == 0) *n_out = 0;
        return;
    }

    // 1. radix select: the key of the k-th largest valid candidate
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix, mask = s_mask;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            uint32_t key = topk_key(scores[i]);
            if (key != 0u && (key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int rem = s_remaining;
            for (int d = 255; d >= 0; d--) {
                int c = (int)hist[d];
                if (c >= rem) {
                    s_prefix = prefix | ((uint32_t)d << shift);
                    s_mask = mask | (255u << shift);
                    break;
                }
                rem -= c;
            }
            s_remaining = rem; // ties at the threshold still to take
        }
        __syncthreads();
    }
    const uint32_t thr = s_prefix;
    const int ties = s_remaining, above = k - ties;

    // 2. compaction: everything above the threshold (any order), then the
    // oldest `ties` candidates equal to it, in index order
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (topk_key(scores[i]) > thr) sel[atomicAdd(&s_count, 1)] = i;
    int taken = 0;
    for (int base = 0; base < n && taken < ties; base += blockDim.x) {
        const int i = base + threadIdx.x;
        const int flag = i < n && topk_key(scores[i]) == thr;
        int total;
        const int r = cta_exclusive_scan(flag, scratch, &total);
        if (flag && taken + r < ties) sel[above + taken + r] = i;
        taken += total;
    }
    for (int i = k + threadIdx.x; i < sort_len; i += blockDim.x) sel[i] = 0x7fffffff;
    __syncthreads();

    // 3. chronological order
    for (int kk = 2; kk <= sort_len; kk <<= 1) {
        for (int j = kk >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < sort_len; i += blockDim.x) {
                int ixj = i ^ j;
                if (ixj > i) {
                    int a = sel[i], b = sel[ixj];
                    bool up = (i & kk) == 0;
                    if (up ? a > b : a < b) {
                        sel[i] = b;
                        sel[ixj] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        out_idx[i] = sel[i];
        if (out_scores) out_scores[i] = scores[sel[i]];
    }
    if (threadIdx.x == 0) *n_out = k;
}

// smem_bytes and sort_len from kvm_cu_topk_plan_make.
inline cudaError_t topk(const float *scores, int n, int k, int sort_len, size_t smem_bytes, int *out_idx,
                        float *out_scores, int *n_out, cudaStream_t stream) {
    cudaError_t e = cudaFuncSetAttribute(topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes);
    if (e != cudaSuccess) return e;
    topk_kernel<<<1, 1024, smem_bytes, stream>>>(scores, n, k, sort_len, out_idx, out_scores, n_out);
    return cudaGetLastError();
}

}  // namespace kvmcu
