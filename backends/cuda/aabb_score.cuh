// aabb_score: MemArt block relevance on tensor cores, fused with per-token
// normalisation and aggregation over the query tokens (DESIGN.md, Retrieval).
//
//   I(q, b) = [q+ || q-] . [s_max(b) || s_min(b)]        (one GEMM per layer and head)
//   SOFTMAX p(q, b) = exp(tau I - max) / sum_b' exp(tau I - max)
//   RR      p(q, b) = 1 / (rank_q(b) + c)   rank from 1, ties toward the older block
//   MAX     S(b) = max_q p(q, b)     SUM  S(b) = sum_q p(q, b)
//
// Layouts (device memory):
//   q        f32 [n_q][L][Hq][D]           raw queries
//   aabb     f32 [NB][L][Hkv][D]            min and max, the pool's per-block layout
//   blk      T   [L][Hkv][nb_pad][2D]       block operand [s_max || s_min], zero padded
//   qp       T   [L][Hq/hp][rows_pad][2D]   query operand [q+ || q-] of hp heads,
//                                           row hi * n_q + t, zero padded
//   agg      f32 [L][Hq][NB]                per (layer, query head) aggregate
//   out      f32 [NB] (GLOBAL) or [L][NB] (PER_LAYER): sums of agg
// T is __half or __nv_bfloat16 (wmma m16n16k16, f32 accumulate).
// One CTA per (layer, hp query heads of one KV head): the hp heads' rows
// share each load of the block operand (grouped-query attention would read
// it hp times over otherwise); its scores [rows_pad][nb_pad] stay in shared
// memory when they fit (kvm_cu_score_plan_make picks hp for that), else in
// the caller's workspace.
#pragma once
#include "common.cuh"
#include "cta.cuh"

#include <mma.h>

namespace kvmcu {

struct ScoreParams {
    int n_layers, n_q_heads, n_kv_heads;
    int heads_per_cta; // hp: query heads of one KV head per CTA
    int n_q, n_blocks, rows_pad, nb_pad, sort_len;
    float tau;   // softmax temperature (1/sqrt(D) by default)
    float rr_c;  // RR constant (60 by default)
    int norm_rr; // 0 softmax, 1 reciprocal rank
    int agg_sum; // 0 max, 1 sum
};

template <typename T>
__global__ void score_prepare_blocks_kernel(const float *__restrict__ amin, const float *__restrict__ amax,
                                            T *__restrict__ blk, int n_blocks, int nb_pad, int lh_kv,
                                            int head_dim) {
    const size_t k2 = 2 * (size_t)head_dim;
    const size_t total = (size_t)lh_kv * nb_pad * k2;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t k = i % k2, b = (i / k2) % nb_pad, lh = i / (k2 * nb_pad);
        float v = 0.0f;
        if ((int)b < n_blocks) {
            size_t d = k < (size_t)head_dim ? k : k - head_dim;
            const float *src = k < (size_t)head_dim ? amax : amin;
            v = src[(b * lh_kv + lh) * head_dim + d];
        }
        st(blk + i, v);
    }
}

template <typename T>
__global__ void score_prepare_queries_kernel(const float *__restrict__ q, T *__restrict__ qp, int n_q,
                                             int rows_pad, int lh_q, int hp, int head_dim) {
    const size_t k2 = 2 * (size_t)head_dim;
    const size_t n_cta = (size_t)lh_q / hp, total = n_cta * rows_pad * k2;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t k = i % k2, r = (i / k2) % rows_pad, cta = i / (k2 * rows_pad);
        float v = 0.0f;
        if (r < (size_t)hp * n_q) {
            // row r = (head hi of the CTA's group, token t); the group's heads are consecutive
            const size_t hi = r / n_q, t = r % n_q, lh = cta * hp + hi;
            size_t d = k < (size_t)head_dim ? k : k - head_dim;
            float x = q[(t * lh_q + lh) * head_dim + d];
            v = k < (size_t)head_dim ? fmaxf(x, 0.0f) : fminf(x, 0.0f);
        }
        st(qp + i, v);
    }
}

template <int HEAD_DIM, typename T, bool IN_SMEM>
__global__ void __launch_bounds__(128)
aabb_score_fused_kernel(const T *__restrict__ qp, const T *__restrict__ blk, float *__restrict__ agg,
                        float *__restrict__ ws_scores, uint2 *__restrict__ ws_sort, ScoreParams p) {
    using namespace nvcuda;
    constexpr int K2 = 2 * HEAD_DIM;
    const int hp = p.heads_per_cta, l = blockIdx.y;
    const int h0 = blockIdx.x * hp; // the CTA's first query head
    const int group = p.n_q_heads / p.n_kv_heads, hkv = h0 / group;
    const int cta = l * gridDim.x + blockIdx.x;
    const int warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int mt_count = p.rows_pad / 16, nt_count = p.nb_pad / 16;
    const int n_rows = hp * p.n_q; // real rows: head hi's token t is row hi * n_q + t

    extern __shared__ __align__(128) unsigned char score_smem[];
    T *qs = reinterpret_cast<T *>(score_smem);
    float *S;
    uint2 *sortbuf;
    if (IN_SMEM) {
        S = reinterpret_cast<float *>(score_smem + (size_t)p.rows_pad * K2 * sizeof(T));
        sortbuf = reinterpret_cast<uint2 *>(S + (size_t)p.rows_pad * p.nb_pad);
    } else {
        S = ws_scores + (size_t)cta * p.rows_pad * p.nb_pad;
        sortbuf = ws_sort + (size_t)cta * p.sort_len;
    }

    // the query operand of this (layer, head): rows_pad x 2D, 16-byte copies
    {
        const int4 *src = reinterpret_cast<const int4 *>(qp + (size_t)cta * p.rows_pad * K2);
        int4 *dst = reinterpret_cast<int4 *>(qs);
        const int n16 = p.rows_pad * K2 * (int)sizeof(T) / 16;
        for (int i = threadIdx.x; i < n16; i += blockDim.x) dst[i] = src[i];
    }
    __syncthreads();

    // 1. scores: each warp takes 16-block column tiles, all row tiles at once
    const T *bbase = blk + ((size_t)l * p.n_kv_heads + hkv) * p.nb_pad * K2;
    for (int nt = warp; nt < nt_count; nt += n_warps) {
        for (int m0 = 0; m0 < mt_count; m0 += 4) { // four row tiles per pass
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> c[4];
#pragma unroll
            for (int m = 0; m < 4; m++) wmma::fill_fragment(c[m], 0.0f);
#pragma unroll 4
            for (int k = 0; k < K2; k += 16) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
                wmma::load_matrix_sync(b, bbase + (size_t)nt * 16 * K2 + k, K2);
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    if (m0 + m < mt_count) {
                        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                        wmma::load_matrix_sync(a, qs + (size_t)(m0 + m) * 16 * K2 + k, K2);
                        wmma::mma_sync(c[m], a, b, c[m]);
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < 4; m++)
                if (m0 + m < mt_count)
                    wmma::store_matrix_sync(S + (size_t)(m0 + m) * 16 * p.nb_pad + nt * 16, c[m], p.nb_pad,
                                            wmma::mem_row_major);
        }
    }
    __syncthreads();

    // 2. normalise each real token's row over the n_blocks real columns
    if (!p.norm_rr) {
        for (int t = warp; t < n_rows; t += n_warps) {
            float *row = S + (size_t)t * p.nb_pad;
            float mx = -INFINITY;
            for (int b = threadIdx.x & 31; b < p.n_blocks; b += 32) mx = fmaxf(mx, p.tau * row[b]);
            mx = warp_max(mx);
            float z = 0.0f;
            for (int b = threadIdx.x & 31; b < p.n_blocks; b += 32) {
                float e = __expf(p.tau * row[b] - mx);
                row[b] = e;
                z += e;
            }
            z = warp_sum(z);
            __syncwarp();
            const float inv = 1.0f / z;
            for (int b = threadIdx.x & 31; b < p.n_blocks; b += 32) row[b] *= inv;
        }
    } else {
        for (int t = 0; t < n_rows; t++) {
            float *row = S + (size_t)t * p.nb_pad;
            for (int i = threadIdx.x; i < p.sort_len; i += blockDim.x)
                sortbuf[i] = i < p.n_blocks ? make_uint2(float_key(row[i]), (unsigned)i) : make_uint2(0u, 0xffffffffu);
            __syncthreads();
            cta_bitonic_sort(sortbuf, p.sort_len);
            for (int r = threadIdx.x; r < p.n_blocks; r += blockDim.x)
                row[sortbuf[r].y] = 1.0f / ((float)(r + 1) + p.rr_c);
            __syncthreads();
        }
    }
    __syncthreads();

    // 3. aggregate over the tokens, per query head
    for (int hi = 0; hi < hp; hi++) {
        float *o = agg + ((size_t)l * p.n_q_heads + h0 + hi) * p.n_blocks;
        const float *Sh = S + (size_t)hi * p.n_q * p.nb_pad;
        for (int b = threadIdx.x; b < p.n_blocks; b += blockDim.x) {
            float a = p.agg_sum ? 0.0f : -INFINITY;
            for (int t = 0; t < p.n_q; t++) {
                float v = Sh[(size_t)t * p.nb_pad + b];
                a = p.agg_sum ? a + v : fmaxf(a, v);
            }
            o[b] = a;
        }
    }
}

// out[b] (or out[l][b]) = sum over heads (and layers) of agg, in a fixed
// order: lane y of a column sums terms y, y + 8, ... (the terms are the
// (layer, head) pairs in order), then the 8 partial sums are added in order.
// A CTA is 32 consecutive outputs x 8 lanes, so each load of a warp is one
// 128-byte line, and thousands of terms per output are spread over 8 threads
// (a thread per output left a 1024-term dependent chain, about 0.2 ms).
constexpr int kReduceCols = 32, kReduceLanes = 8;
__global__ void __launch_bounds__(kReduceCols *kReduceLanes)
score_reduce_kernel(const float *__restrict__ agg, float *__restrict__ out, int n_layers, int n_q_heads, int n_blocks,
                    int per_layer) {
    __shared__ float part[kReduceLanes][kReduceCols];
    const int x = threadIdx.x % kReduceCols, y = threadIdx.x / kReduceCols;
    const int n_out = per_layer ? n_layers * n_blocks : n_blocks;
    const int i = blockIdx.x * kReduceCols + x;
    float s = 0.0f;
    if (i < n_out) {
        const int b = i % n_blocks, l0 = per_layer ? i / n_blocks : 0;
        const int n_terms = (per_layer ? 1 : n_layers) * n_q_heads;
        const float *base = agg + (size_t)l0 * n_q_heads * n_blocks + b;
#pragma unroll 8
        for (int t = y; t < n_terms; t += kReduceLanes) s += base[(size_t)t * n_blocks];
    }
    part[y][x] = s;
    __syncthreads();
    if (y == 0 && i < n_out) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < kReduceLanes; j++) acc += part[j][x];
        out[i] = acc;
    }
}

// Build the block operand (done once per sealed block set, then reused).
inline cudaError_t score_prepare_blocks(const float *aabb_min, const float *aabb_max, void *blk, DType dt,
                                        int n_layers, int n_kv_heads, int head_dim, int n_blocks, int nb_pad,
                                        cudaStream_t stream) {
    KVM_CU_DISPATCH_HALF(dt, T, {
        score_prepare_blocks_kernel<T><<<1024, 256, 0, stream>>>(aabb_min, aabb_max, static_cast<T *>(blk), n_blocks,
                                                               nb_pad, n_layers * n_kv_heads, head_dim);
    });
    return cudaGetLastError();
}

// The whole selection score: query operand into ws, fused scores into agg,
// sums into out. ws: kvm_cu_score_plan.ws_bytes; agg: L*Hq*NB floats.
inline cudaError_t aabb_score(const float *q, const void *blk, DType dt, int head_dim, const ScoreParams &p,
                              int in_smem, size_t smem_bytes, void *ws, float *agg, float *out, int per_layer,
                              cudaStream_t stream) {
    const int lh_q = p.n_layers * p.n_q_heads;
    const size_t k2 = 2 * (size_t)head_dim, qp_bytes = (size_t)lh_q / p.heads_per_cta * p.rows_pad * k2 * 2;
    unsigned char *w = static_cast<unsigned char *>(ws);
    const size_t qp_round = (qp_bytes + 255) / 256 * 256;
    float *ws_scores = reinterpret_cast<float *>(w + qp_round);
    uint2 *ws_sort = reinterpret_cast<uint2 *>(ws_scores + (size_t)lh_q / p.heads_per_cta * p.rows_pad * p.nb_pad);
    cudaError_t e;
    dim3 grid(p.n_q_heads / p.heads_per_cta, p.n_layers);
    KVM_CU_DISPATCH_HALF(dt, T, {
        score_prepare_queries_kernel<T><<<256, 256, 0, stream>>>(q, reinterpret_cast<T *>(w), p.n_q, p.rows_pad, lh_q,
                                                              p.heads_per_cta, head_dim);
        KVM_CU_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, {
            if (in_smem) {
                auto kern = aabb_score_fused_kernel<HEAD_DIM, T, true>;
                if ((e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes)) !=
                    cudaSuccess)
                    return e;
                kern<<<grid, 128, smem_bytes, stream>>>(reinterpret_cast<const T *>(w), static_cast<const T *>(blk), agg,
                                                       nullptr, nullptr, p);
            } else {
                auto kern = aabb_score_fused_kernel<HEAD_DIM, T, false>;
                if ((e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes)) !=
                    cudaSuccess)
                    return e;
                kern<<<grid, 128, smem_bytes, stream>>>(reinterpret_cast<const T *>(w), static_cast<const T *>(blk), agg,
                                                       ws_scores, ws_sort, p);
            }
        });
    });
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    const int n_out = per_layer ? p.n_layers * p.n_blocks : p.n_blocks;
    score_reduce_kernel<<<(n_out + kReduceCols - 1) / kReduceCols, kReduceCols * kReduceLanes, 0, stream>>>(
        agg, out, p.n_layers, p.n_q_heads, p.n_blocks, per_layer);
    return cudaGetLastError();
}

}  // namespace kvmcu
