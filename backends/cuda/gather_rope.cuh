// gather with RoPE: copy the selected tokens' K and V into a contiguous
// destination, rotating K to new positions (DESIGN.md, decoupled position
// re-encoding). Keys are stored raw, so this is the only rotation they get.
//   src_k, src_v  TI [n_src][Hkv][D]     device rows (a block staging area or the device tier)
//   rows          int64 [M]              source row of output token i; < 0 (dead slot) or
//                                        >= n_src: skipped, its output row is not written
//   pos           int32 [M]              new position of output token i
//   inv_freq      f64 [rotary_dim / 2]   from the model spec (kvm_rope_init), scaling applied
//   dst_k, dst_v  TO [M][Hkv][D]
// cos/sin are computed per token in double precision, as on the CPU, and the
// rotation uses unfused multiplies so the result matches the CPU bit for bit
// in f32. One CTA per output token (grid-stride); every head of the token
// shares its angles.
#pragma once
#include "common.cuh"

namespace kvmcu {

struct RopeParams {
    int n_kv_heads, head_dim, rotary_dim;
    int gptj;          // 0 NEOX pairs (j, j + rot/2); 1 GPT-J pairs (2j, 2j + 1)
    float attn_factor; // YaRN multiplier on the rotated dims; 1 otherwise
};

template <typename TI, typename TO>
__global__ void gather_rope_kernel(const TI *__restrict__ src_k, const TI *__restrict__ src_v,
                                   const int64_t *__restrict__ rows, const int32_t *__restrict__ pos,
                                   const double *__restrict__ inv_freq, int64_t m, int64_t n_src, TO *__restrict__ dst_k,
                                   TO *__restrict__ dst_v, RopeParams p) {
    extern __shared__ float cs[]; // cos[n_pairs], sin[n_pairs]
    const int np = p.rotary_dim / 2;
    const size_t row_elems = (size_t)p.n_kv_heads * p.head_dim;
    for (int64_t i = blockIdx.x; i < m; i += gridDim.x) {
        const int64_t r = rows[i];
        if (r < 0 || r >= n_src) continue; // dead slot (or outside the source): uniform across the CTA
        __syncthreads();     // the previous token's angles are no longer read
        for (int j = threadIdx.x; j < np; j += blockDim.x) {
            double s, c;
            sincos((double)pos[i] * inv_freq[j], &s, &c);
            cs[j] = (float)c;
            cs[np + j] = (float)s;
        }
        __syncthreads();
        const TI *ks = src_k + (size_t)r * row_elems;
        const TI *vs = src_v + (size_t)r * row_elems;
        TO *kd = dst_k + (size_t)i * row_elems;
        TO *vd = dst_v + (size_t)i * row_elems;
        for (size_t e = threadIdx.x; e < row_elems; e += blockDim.x) st(vd + e, ld(vs + e));
        // rotated pairs: one thread per (head, pair)
        const int step = p.gptj ? 2 : 1, off = p.gptj ? 1 : np;
        for (int t = threadIdx.x; t < p.n_kv_heads * np; t += blockDim.x) {
            const int h = t / np, j = t % np;
            const size_t a = (size_t)h * p.head_dim + (size_t)j * step, b = a + off;
            const float x0 = ld(ks + a), x1 = ld(ks + b), c = cs[j], s = cs[np + j];
            float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
            float y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
            if (p.attn_factor != 1.0f) {
                y0 = __fmul_rn(y0, p.attn_factor);
                y1 = __fmul_rn(y1, p.attn_factor);
            }
            st(kd + a, y0);
            st(kd + b, y1);
        }
        // dims past rotary_dim pass through
        const int pass = p.head_dim - p.rotary_dim;
        for (int t = threadIdx.x; t < p.n_kv_heads * pass; t += blockDim.x) {
            const size_t e = (size_t)(t / pass) * p.head_dim + p.rotary_dim + t % pass;
            st(kd + e, ld(ks + e));
        }
    }
}

inline cudaError_t gather_rope(const void *src_k, const void *src_v, DType src_dt, int64_t n_src, const int64_t *rows,
                               const int32_t *pos, const double *inv_freq, int64_t m, void *dst_k, void *dst_v,
                               DType dst_dt, const RopeParams &p, unsigned blocks, cudaStream_t stream) {
    if (m == 0) return cudaSuccess;
    if (p.rotary_dim < 0 || p.rotary_dim > p.head_dim || p.rotary_dim % 2) return cudaErrorInvalidValue;
    const size_t smem = (size_t)p.rotary_dim * sizeof(float);
    KVM_CU_DISPATCH_DTYPE(src_dt, TI, {
        KVM_CU_DISPATCH_DTYPE(dst_dt, TO, {
            gather_rope_kernel<TI, TO><<<blocks, 128, smem, stream>>>(
                static_cast<const TI *>(src_k), static_cast<const TI *>(src_v), rows, pos, inv_freq, m, n_src,
                static_cast<TO *>(dst_k), static_cast<TO *>(dst_v), p);
        });
    });
    return cudaGetLastError();
}

}  // namespace kvmcu
