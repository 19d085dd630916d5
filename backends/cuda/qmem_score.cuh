// qmem_score: IntentKV rule score of every candidate position (DESIGN.md,
// QueryMemory and eviction):
//   a[l,h,j] = softmax_j( M[l,h] . K[l,hkv(h),j] * scale ),   rule_j = sum_{l,h} a[l,h,j]
//   M     f32 [L][Hq][D]        the session's query memory (unit rows)
//   k     T   [L][N][Hkv][D]    candidate keys
//   ws    f32 [L][Hq][N]        per-(layer, head) probabilities (caller's workspace)
//   rule  f32 [N]
// One CTA per (layer, query head): a warp per position for the logits, then a
// CTA-wide max and sum; a second kernel sums over (layer, head) in a fixed
// order, so the result does not depend on scheduling.
#pragma once
#include "common.cuh"

namespace kvmcu {

template <int HEAD_DIM, typename T>
__global__ void __launch_bounds__(256)
qmem_logits_kernel(const float *__restrict__ mem, const T *__restrict__ k, int n, int n_q_heads, int n_kv_heads,
                   float scale, float *__restrict__ ws) {
    constexpr int VEC = HEAD_DIM / 32;
    const int h = blockIdx.x, l = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_warps = blockDim.x >> 5, hkv = h / (n_q_heads / n_kv_heads);
    float mr[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) mr[e] = mem[((size_t)l * n_q_heads + h) * HEAD_DIM + lane * VEC + e] * scale;
    float *row = ws + ((size_t)l * n_q_heads + h) * n;
    float mx = -INFINITY;
    for (int j = warp; j < n; j += n_warps) {
        const T *kr = k + (((size_t)l * n + j) * n_kv_heads + hkv) * HEAD_DIM + lane * VEC;
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < VEC; e++) d = fmaf(mr[e], ld(kr + e), d);
        d = warp_sum(d);
        if (lane == 0) row[j] = d;
        mx = fmaxf(mx, d);
    }
    __shared__ float red[32];
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int w = 0; w < n_warps; w++) mx = fmaxf(mx, red[w]);
    __syncthreads();
    float z = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float e = __expf(row[j] - mx);
        row[j] = e;
        z += e;
    }
    z = warp_sum(z);
    if (lane == 0) red[warp] = z;
    __syncthreads();
    z = 0.0f;
    for (int w = 0; w < n_warps; w++) z += red[w];
    const float inv = 1.0f / z;
    for (int j = threadIdx.x; j < n; j += blockDim.x) row[j] *= inv;
}

__global__ void qmem_reduce_kernel(const float *__restrict__ ws, int n, int n_rows, float *__restrict__ rule) {
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int r = 0; r < n_rows; r++) s += ws[(size_t)r * n + j];
        rule[j] = s;
    }
}

inline cudaError_t qmem_score(const float *mem, const void *k, DType dt, int n_layers, int n_q_heads, int n_kv_heads,
                              int head_dim, int n, float scale, float *ws, float *rule, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (n_q_heads % n_kv_heads) return cudaErrorInvalidValue;
    KVM_CU_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, {
        KVM_CU_DISPATCH_DTYPE(dt, T, {
            qmem_logits_kernel<HEAD_DIM, T><<<dim3(n_q_heads, n_layers), 256, 0, stream>>>(
                mem, static_cast<const T *>(k), n, n_q_heads, n_kv_heads, scale, ws);
        });
    });
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    qmem_reduce_kernel<<<(n + 255) / 256, 256, 0, stream>>>(ws, n, n_layers * n_q_heads, rule);
    return cudaGetLastError();
}

}  // namespace kvmcu
