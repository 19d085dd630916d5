// Retrieval table entries of the CUDA backend (core/backend/backend.h): dev_score,
// dev_score_reduce, dev_topk, dev_gather_rope. Plain f32 kernels on the
// CUDA cores: the contract is the CPU reference's f32 arithmetic, so no f16
// operands here (the tensor-core selection path stays a proc,
// kvmem_cuda.h). Arguments are checked on the host (host/dev_check.c); the
// kernels also never read outside their inputs for any device data
// (indices are bounded).
#include "backend_impl.h"
#include "cta.cuh"
#include "host/rules.h"

namespace {

// ---- dev_score ----

struct ScoreDims {
    int L, Hq, Hkv, G, D, nq, nb, n_chunks;
    float tau, rr_c;
    int rr, agg_sum, sort_in_smem, sort_len;
};

constexpr int kScoreRows = 32;    // query rows per shared-memory stage (one per lane)
constexpr int kScoreBlocks = 64;  // candidate blocks per CTA (8 warps x 8)

// I[l][h][t][j] = sum_d max(q_d * s_max_d, q_d * s_min_d), d in order.
// CTA = (layer, KV head, chunk of 64 blocks); lane = query row (head of the
// group, token) staged in shared memory, warp = block: every lane of a warp
// reads the same AABB element (one broadcast load).
// Boxes T: f32, or f16 (the device mirror's), decoded exactly.
template <typename T>
__global__ void __launch_bounds__(256)
dev_score_kernel(const float *__restrict__ q, const T *__restrict__ smin, const T *__restrict__ smax,
                 float *__restrict__ S, ScoreDims p) {
    extern __shared__ float qs[]; // [kScoreRows][D + 1] (padded: lanes hit different banks)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int jc = (int)(blockIdx.x % (unsigned)p.n_chunks);
    const int lg = (int)(blockIdx.x / (unsigned)p.n_chunks), l = lg / p.Hkv, g = lg % p.Hkv;
    const int R = p.G * p.nq, D = p.D, ld = D + 1;
    for (int rbase = 0; rbase < R; rbase += kScoreRows) {
        __syncthreads(); // the previous stage is no longer read
        for (int i = threadIdx.x; i < kScoreRows * D; i += blockDim.x) {
            const int rr = i / D, d = i % D, r = rbase + rr;
            float v = 0.0f;
            if (r < R) {
                const int gi = r / p.nq, t = r % p.nq;
                v = q[(((size_t)t * p.L + l) * p.Hq + (size_t)g * p.G + gi) * D + d];
            }
            qs[rr * ld + d] = v;
        }
        __syncthreads();
        const int r = rbase + lane;
        const float *qr = qs + lane * ld;
        for (int jj = warp; jj < kScoreBlocks; jj += 8) {
            const int j = jc * kScoreBlocks + jj;
            if (j >= p.nb) break; // uniform across the warp
            const size_t base = (((size_t)j * p.L + l) * p.Hkv + g) * D;
            const T *a = smax + base, *b = smin + base;
            float acc = 0.0f;
            for (int d = 0; d < D; d++) {
                const float x = qr[d];
                acc += fmaxf(x * kvmcu::ld(a + d), x * kvmcu::ld(b + d));
            }
            if (r < R) {
                const int gi = r / p.nq, t = r % p.nq;
                S[(((size_t)l * p.Hq + (size_t)g * p.G + gi) * p.nq + t) * p.nb + j] = acc;
            }
        }
    }
}

// EXACT's buffer form, one layer l: I[l][h][t][j] = max over the rows of
// block j (block_rows rows on from keys) of q . k, as the CPU reference: the
// first row's product, then each later one when larger. One warp per
// (query head, token, block), lanes over head_dim.
template <typename T>
__global__ void __launch_bounds__(256)
exact_score_kernel(const float *__restrict__ q, const T *__restrict__ keys, float *__restrict__ S, ScoreDims p, int l,
                   int block_rows) {
    const int lane = threadIdx.x & 31;
    const long long item = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (item >= (long long)p.Hq * p.nq * p.nb) return; // uniform across the warp
    const int j = (int)(item % p.nb), t = (int)(item / p.nb % p.nq), h = (int)(item / ((long long)p.nb * p.nq));
    const int g = h / p.G, D = p.D;
    const float *qr = q + (((size_t)t * p.L + l) * p.Hq + h) * D;
    float best = 0.0f;
    for (int r = 0; r < block_rows; r++) {
        const T *kr = keys + (((size_t)j * block_rows + r) * p.Hkv + g) * D;
        float dot = 0.0f;
        for (int d = lane; d < D; d += 32) dot = fmaf(qr[d], kvmcu::ld(kr + d), dot);
        dot = kvmcu::warp_sum(dot);
        best = r == 0 ? dot : (dot > best ? dot : best);
    }
    if (lane == 0) S[(((size_t)l * p.Hq + h) * p.nq + t) * p.nb + j] = best;
}

// Deterministic CTA reductions (fixed shuffle tree, then warps in order);
// every thread gets the result. red: 32 floats of shared memory.
__device__ float cta_max(float v, float *red) {
    v = kvmcu::warp_max(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) m = fmaxf(m, red[w]);
    return m;
}
__device__ float cta_sum(float v, float *red) {
    v = kvmcu::warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = red[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) s += red[w];
    return s;
}

// Normalise each token's row over the blocks and aggregate over tokens:
// out[l][h][j] = MAX or SUM over t of p[t][j]. CTA = (layer, query head);
// a thread owns columns j = tid + k * blockDim, so its aggregate runs over
// t in order, as the CPU's loop.
__global__ void __launch_bounds__(256)
dev_score_norm_kernel(float *S, uint2 *ws_sort, float *__restrict__ out, ScoreDims p) {
    // S and ws_sort: no __restrict__, threads exchange values through them across barriers
    extern __shared__ __align__(16) unsigned char norm_smem[];
    __shared__ float red[32];
    const size_t cta = blockIdx.x;
    uint2 *buf = p.sort_in_smem ? reinterpret_cast<uint2 *>(norm_smem) : ws_sort + cta * (size_t)p.sort_len;
    float *o = out + cta * (size_t)p.nb;
    for (int t = 0; t < p.nq; t++) {
        float *row = S + (cta * p.nq + t) * (size_t)p.nb;
        if (!p.rr) {
            float m = -INFINITY;
            for (int j = threadIdx.x; j < p.nb; j += blockDim.x) m = fmaxf(m, row[j]);
            m = cta_max(m, red);
            float z = 0.0f;
            for (int j = threadIdx.x; j < p.nb; j += blockDim.x) {
                const float e = expf(p.tau * (row[j] - m));
                row[j] = e;
                z += e;
            }
            const float inv = 1.0f / cta_sum(z, red);
            for (int j = threadIdx.x; j < p.nb; j += blockDim.x) row[j] *= inv;
        } else {
            // rank by I descending, ties to the lower j: sort (key, j) pairs;
            // -0 is taken as +0 (equal floats tie), NaN as the lowest key
            for (int i = threadIdx.x; i < p.sort_len; i += blockDim.x) {
                uint2 e = make_uint2(0u, 0xffffffffu);
                if (i < p.nb) {
                    const float v = row[i];
                    e = make_uint2(v != v ? 0u : kvmcu::float_key(__fadd_rn(v, 0.0f)), (unsigned)i);
                }
                buf[i] = e;
            }
            __syncthreads();
            kvmcu::cta_bitonic_sort(buf, p.sort_len);
            for (int r = threadIdx.x; r < p.nb; r += blockDim.x) {
                const unsigned j = buf[r].y;
                if (j < (unsigned)p.nb) row[j] = 1.0f / ((float)(r + 1) + p.rr_c);
            }
        }
        __syncthreads(); // row is final
        for (int j = threadIdx.x; j < p.nb; j += blockDim.x) {
            const float v = row[j];
            if (t == 0) o[j] = v;
            else o[j] = p.agg_sum ? o[j] + v : (v > o[j] ? v : o[j]);
        }
        __syncthreads(); // buf and red are reused by the next token
    }
}

// ---- dev_score_reduce ----

struct ReduceDims {
    size_t n, items, per, heads; // blocks; n_sets * n; layers per set; heads per layer
};

// out[s][j] in the contract's order (core/backend/backend.h): per layer the heads
// in order, then the set's layers in order, plain f32 additions (nvcc
// neither reassociates them nor contracts an add with no multiply), so the
// CPU reference's bits. One thread per item = s * n + j, grid-stride.
__global__ void dev_score_reduce_kernel(const float *__restrict__ in, float *__restrict__ out, ReduceDims p) {
    for (size_t it = (size_t)blockIdx.x * blockDim.x + threadIdx.x; it < p.items; it += (size_t)gridDim.x * blockDim.x) {
        const size_t s = it / p.n, j = it - s * p.n;
        float acc = 0.0f;
        for (size_t l = s * p.per; l < (s + 1) * p.per; l++) {
            const float *x = in + l * p.heads * p.n + j;
            float layer = 0.0f;
            for (size_t h = 0; h < p.heads; h++) layer = __fadd_rn(layer, x[h * p.n]);
            acc = __fadd_rn(acc, layer);
        }
        out[it] = acc;
    }
}

// ---- dev_topk ----

// The min(k, #non-NaN) largest scores' indices in ascending index order,
// ties to the lower index. One CTA: radix select of the k-th largest key
// (NaN = key 0, never taken; -0 taken as +0), then one ordered pass that
// keeps every key above it and the first `ties` equal to it.
__device__ __forceinline__ uint32_t topk_key(float s) {
    return s != s ? 0u : kvmcu::float_key(__fadd_rn(s, 0.0f));
}

__global__ void __launch_bounds__(1024)
dev_topk_kernel(const float *__restrict__ scores, int n, int k, int *__restrict__ out_idx, int *__restrict__ count) {
    __shared__ unsigned hist[256];
    __shared__ int scratch[32];
    __shared__ uint32_t s_prefix, s_mask;
    __shared__ int s_remaining;
    int local = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) local += topk_key(scores[i]) != 0u;
    int valid;
    (void)kvmcu::cta_exclusive_scan(local, scratch, &valid);
    if (valid < k) k = valid;
    if (threadIdx.x == 0) {
        s_prefix = 0;
        s_mask = 0;
        s_remaining = k;
        *count = k;
    }
    __syncthreads();
    if (k == 0) return;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix, mask = s_mask;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const uint32_t key = topk_key(scores[i]);
            if (key != 0u && (key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int rem = s_remaining;
            for (int d = 255; d >= 0; d--) {
                const int c = (int)hist[d];
                if (c >= rem) {
                    s_prefix = prefix | ((uint32_t)d << shift);
                    s_mask = mask | (255u << shift);
                    break;
                }
                rem -= c;
            }
            s_remaining = rem;
        }
        __syncthreads();
    }
    const uint32_t thr = s_prefix;
    const int ties = s_remaining; // keys equal to thr still to take, lowest indices first
    int ties_before = 0, written = 0;
    for (int base = 0; base < n; base += blockDim.x) {
        const int i = base + threadIdx.x;
        const uint32_t key = i < n ? topk_key(scores[i]) : 0u;
        const int eq = key != 0u && key == thr;
        int n_eq, n_take;
        const int eq_rank = ties_before + kvmcu::cta_exclusive_scan(eq, scratch, &n_eq);
        const int take = (key != 0u && key > thr) || (eq && eq_rank < ties);
        const int pos = written + kvmcu::cta_exclusive_scan(take, scratch, &n_take);
        if (take && pos < k) out_idx[pos] = i;
        ties_before += n_eq;
        written += n_take;
    }
}

// ---- dev_gather_rope ----

struct GatherDims {
    size_t n_src, src_rs, n_out, H, D, rot;
    int gptj;
    float af;
};

// Row i of out = source row idx[i] rotated with row i's cos/sin (a zero row
// for an index >= n_src). One thread per output element: the element's
// pair is rotated by the shared rule (kvm_rope_rotate's arithmetic).
// Source rows T: f32, or f16 (the device mirror's), decoded exactly.
template <typename T>
__global__ void dev_gather_kernel(const T *__restrict__ src, const uint32_t *__restrict__ idx,
                                  const float *__restrict__ cs, float *__restrict__ out, GatherDims p) {
    const size_t row = p.H * p.D, np = p.rot / 2;
    for (size_t i = blockIdx.x; i < p.n_out; i += gridDim.x) {
        const uint32_t r = idx[i];
        float *o = out + i * row;
        if ((size_t)r >= p.n_src) {
            for (size_t e = threadIdx.x; e < row; e += blockDim.x) o[e] = 0.0f;
            continue;
        }
        const T *x = src + (size_t)r * p.src_rs;
        for (size_t e = threadIdx.x; e < row; e += blockDim.x) {
            const size_t d = e % p.D, h0 = e - d;
            if (d >= p.rot) {
                o[e] = kvmcu::ld(x + e);
                continue;
            }
            size_t j, a, b; // pair j: elements a (first) and b (partner)
            if (p.gptj) {
                j = d / 2;
                a = 2 * j;
                b = a + 1;
            } else {
                j = d < np ? d : d - np;
                a = j;
                b = j + np;
            }
            float y0, y1;
            kvm_cu_rope_pair(kvmcu::ld(x + h0 + a), kvmcu::ld(x + h0 + b), cs[i * np + j], cs[(p.n_out + i) * np + j], p.af, &y0, &y1);
            o[e] = d == a ? y0 : y1;
        }
    }
}

uint32_t max_blocks(const kvm_cu_backend *b) { return (uint32_t)b->props.multiProcessorCount * 8u; }

}  // namespace

kvmem_status kvm_cu_dev_score(kvmem_backend *be, const kvm_dev_score_args *a) {
    if (!be || !a) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "dev_score: args is NULL");
    kvm_cu_dev_score_plan plan;
    kvmem_status st = kvm_cu_check_dev_score(a, cu_size(a->q), cu_size(a->s_min), cu_size(a->s_max), cu_size(a->out),
                                             cu_size, &plan);
    if (st != KVMEM_OK) return st;
    const bool exact = a->mode == KVMEM_RETRIEVE_EXACT;
    if (exact && !a->key_rows)
        return kvm_cu_fail(KVMEM_ERR_UNSUPPORTED, "dev_score: cuda reads EXACT's keys from key_rows only");
    kvm_cu_backend *b = cu_impl(be);
    cudaSetDevice(b->device);
    unsigned char *ws = static_cast<unsigned char *>(cu_scratch(b, plan.ws_bytes, &st));
    if (st != KVMEM_OK) return st;
    ScoreDims p;
    p.L = a->n_layers;
    p.Hq = a->n_q_heads;
    p.Hkv = a->n_kv_heads;
    p.G = a->n_q_heads / a->n_kv_heads;
    p.D = a->head_dim;
    p.nq = a->n_q;
    p.nb = a->n_blocks;
    p.n_chunks = (a->n_blocks + kScoreBlocks - 1) / kScoreBlocks;
    p.tau = a->tau;
    p.rr_c = a->rr_c;
    p.rr = a->norm == KVMEM_NORM_RR;
    p.agg_sum = a->agg == KVMEM_AGG_SUM;
    p.sort_in_smem = plan.sort_in_smem;
    p.sort_len = plan.sort_len;
    float *S = reinterpret_cast<float *>(ws);
    uint2 *sort = reinterpret_cast<uint2 *>(ws + plan.ws_scores);
    const size_t qs_bytes = (size_t)kScoreRows * (size_t)(p.D + 1) * 4; // <= 32.9 KiB (D <= 256)
    if (exact) {
        const long long items = (long long)p.Hq * p.nq * p.nb;
        const unsigned grid = (unsigned)((items + 7) / 8); // 8 warps per CTA
        for (int l = 0; l < p.L && st == KVMEM_OK; l++) {
            if (a->key_f16)
                exact_score_kernel<__half><<<grid, 256, 0, b->stream>>>(
                    cu_at<const float>(a->q, a->q_off), cu_at<const __half>(a->key_rows[l], a->s_off), S, p, l,
                    a->block_rows);
            else
                exact_score_kernel<float><<<grid, 256, 0, b->stream>>>(
                    cu_at<const float>(a->q, a->q_off), cu_at<const float>(a->key_rows[l], a->s_off), S, p, l,
                    a->block_rows);
            st = cu_check(cudaGetLastError(), "dev_score");
        }
    } else if (a->box_layout == KVM_BOXES_SPLIT_F16) {
        dev_score_kernel<__half><<<(unsigned)plan.score_ctas, 256, qs_bytes, b->stream>>>(
            cu_at<const float>(a->q, a->q_off), cu_at<const __half>(a->s_min, a->s_off),
            cu_at<const __half>(a->s_max, a->s_off), S, p);
    } else {
        dev_score_kernel<float><<<(unsigned)plan.score_ctas, 256, qs_bytes, b->stream>>>(
            cu_at<const float>(a->q, a->q_off), cu_at<const float>(a->s_min, a->s_off),
            cu_at<const float>(a->s_max, a->s_off), S, p);
    }
    if ((st = cu_check(cudaGetLastError(), "dev_score")) != KVMEM_OK) return st;
    const size_t sort_smem = p.rr && p.sort_in_smem ? (size_t)p.sort_len * 8 : 0; // <= 32 KiB
    dev_score_norm_kernel<<<(unsigned)(p.L * p.Hq), 256, sort_smem, b->stream>>>(S, sort, cu_at<float>(a->out, a->out_off), p);
    return cu_check(cudaGetLastError(), "dev_score");
}

kvmem_status kvm_cu_dev_score_reduce(kvmem_backend *be, const kvm_dev_score_reduce_args *a) {
    if (!be || !a) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "dev_score_reduce: args is NULL");
    kvmem_status st = kvm_cu_check_dev_score_reduce(a, cu_size(a->in), cu_size(a->out));
    if (st != KVMEM_OK) return st;
    kvm_cu_backend *b = cu_impl(be);
    cudaSetDevice(b->device);
    ReduceDims p = {(size_t)a->n, (size_t)a->n_sets * (size_t)a->n, (size_t)(a->n_layers / a->n_sets), (size_t)a->n_heads};
    kvm_cu_grid g = kvm_cu_grid_1d(p.items, 256, max_blocks(b) * 4);
    dev_score_reduce_kernel<<<g.blocks, g.threads, 0, b->stream>>>(cu_at<const float>(a->in, a->in_off),
                                                                   cu_at<float>(a->out, a->out_off), p);
    return cu_check(cudaGetLastError(), "dev_score_reduce");
}

kvmem_status kvm_cu_dev_topk(kvmem_backend *be, const kvm_dev_topk_args *a) {
    if (!be || !a) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "dev_topk: args is NULL");
    kvmem_status st = kvm_cu_check_dev_topk(a, cu_size(a->scores), cu_size(a->idx));
    if (st != KVMEM_OK) return st;
    if (a->n == 0 || a->k == 0) {
        *a->n_out = 0;
        return KVMEM_OK;
    }
    kvm_cu_backend *b = cu_impl(be);
    cudaSetDevice(b->device);
    int *count = static_cast<int *>(cu_scratch(b, 256, &st));
    if (st != KVMEM_OK) return st;
    dev_topk_kernel<<<1, 1024, 0, b->stream>>>(cu_at<const float>(a->scores, a->scores_off), a->n, a->k,
                                                cu_at<int>(a->idx, a->idx_off), count);
    int c = 0;
    st = cu_check(cudaGetLastError(), "dev_topk");
    if (st == KVMEM_OK) st = cu_check(cudaMemcpyAsync(&c, count, sizeof c, cudaMemcpyDeviceToHost, b->stream), "dev_topk");
    if (st == KVMEM_OK) st = cu_check(cudaStreamSynchronize(b->stream), "dev_topk");
    if (st == KVMEM_OK) *a->n_out = c;
    return st;
}

kvmem_status kvm_cu_dev_gather_rope(kvmem_backend *be, const kvm_dev_gather_args *a) {
    if (!be || !a) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "dev_gather_rope: args is NULL");
    kvmem_status st = kvm_cu_check_dev_gather(a, cu_size(a->src), cu_size(a->idx), cu_size(a->cs), cu_size(a->out));
    if (st != KVMEM_OK || a->n_out == 0) return st;
    kvm_cu_backend *b = cu_impl(be);
    cudaSetDevice(b->device);
    GatherDims p = {a->n_src, a->src_rs, a->n_out, a->n_heads, a->head_dim, a->rotary_dim, a->gptj, a->attn_factor};
    kvm_cu_grid g = kvm_cu_grid_1d(a->n_out, 1, max_blocks(b) * 2);
    const uint32_t *idx = cu_at<const uint32_t>(a->idx, a->idx_off);
    const float *cs = a->rotary_dim ? cu_at<const float>(a->cs, a->cs_off) : nullptr;
    if (a->src_dtype == KVMEM_F16)
        dev_gather_kernel<__half><<<g.blocks, 128, 0, b->stream>>>(cu_at<const __half>(a->src, a->src_off), idx, cs,
                                                                    cu_at<float>(a->out, a->out_off), p);
    else
        dev_gather_kernel<float><<<g.blocks, 128, 0, b->stream>>>(cu_at<const float>(a->src, a->src_off), idx, cs,
                                                                   cu_at<float>(a->out, a->out_off), p);
    return cu_check(cudaGetLastError(), "dev_gather_rope");
}
