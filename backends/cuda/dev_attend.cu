// ART attention (dev_attend) and IntentKV's rule score (dev_qmem_score):
// table entries of the CUDA backend (core/backend/backend.h), with
// kvm_attend_cpu / kvm_cpu_qmem_score as the references.
//
// dev_attend is split-K flash decoding with the reference's stop rule. A
// stream is one KV head with its G query heads. Tiles are visited in waves
// of tiles_per_wave:
//   attend_partial: one CTA per (tile of the wave, KV head, chunk of up to 8
//     query heads) computes the tile's unnormalised output, max and
//     denominator per query head (K/V read once per chunk); dead slots
//     (< 0, or >= n_slots) are never read.
//   attend_fold: one CTA per stream folds the wave's tiles in visiting
//     order, skipping tiles without a live position, and after each tile
//     runs the stop rule (host/rules.h: the same code the CPU test checks)
//     on the STRIDED probe of the stream's G*head_dim output. A stopped
//     stream keeps its output; later partial CTAs of that KV head exit at
//     once, so at most one wave of work is spent past the stop.
// Then attend_final writes out = o / l per query head and visited per
// stream. The scored form first finds each stream's order (tile_score, then
// tile_rank: every pair of a stream's tiles compared, n_tiles^2 / 2 cheap
// steps per stream) and the partial CTAs read their stream's own order. With tau_s = tau_d = 0 the rule never fires: full attention.
// A live position whose logit is not finite (K not finite there, or the
// product overflows) is noted per tile by the partial CTAs (the lowest such
// position); the fold stops the stream at that tile with visited = -1 -
// that position, the contract's report the core refuses.
#include "backend_impl.h"
#include "common.cuh"
#include "host/rules.h"

#include <float.h>
#include <limits.h>
#include <math.h>

namespace {

constexpr int kChunk = KVM_CU_ATTEND_GROUP_CHUNK; // query heads per partial CTA
constexpr int kWarps = 4;

struct AttendDims {
    int Hq, Hkv, G, D, tile, n_visit, tpw, n_slots, probe_n, patience, stop_enabled;
    int ord_stride; // entries between the streams' orders (scored: n_tiles; else 0, one order)
    long long n_pos, n_tiles;
    float scale, tau_s, tau_d;
};

// The device mirror's fields (backend.h, dev_attend): f32 tail rows for
// slots >= tail_slot, keys rotated on the fly to base + position.
struct Mirror {
    const float *kt, *vt, *cs; // tail K, V [.][Hkv][D]; RoPE rows of rot floats (row 0 base, 1 + pos)
    long long tail_slot;       // LLONG_MAX: no tail
    int rot, gptj;
    float af;
};

// The mirror's read path, for any kernel that reads it: element d of slot
// s's K row for KV head g, rotated to position base + pos, and of its V row
// (the Vulkan attend shader's load_k_rot / load_v do the same maths).
template <typename T>
__device__ __forceinline__ float mirror_elem(const T *__restrict__ base, const float *__restrict__ tail, const Mirror &mi,
                                             int s, int g, int Hkv, int D, int d) {
    if (s >= mi.tail_slot) return tail[((size_t)(s - mi.tail_slot) * Hkv + g) * D + d];
    return kvmcu::ld(base + ((size_t)s * Hkv + g) * D + d);
}
template <typename T>
__device__ __forceinline__ float kvmcu_mirror_v(const T *__restrict__ v, const Mirror &mi, int s, int g, int Hkv, int D,
                                                int d) {
    return mirror_elem(v, mi.vt, mi, s, g, Hkv, D, d);
}
template <typename T>
__device__ __forceinline__ float kvmcu_mirror_k(const T *__restrict__ k, const Mirror &mi, int s, int g, int Hkv, int D,
                                                int d, long long pos) {
    const float x = mirror_elem(k, mi.kt, mi, s, g, Hkv, D, d);
    if (d >= mi.rot) return x;
    const int np = mi.rot / 2;
    int j, partner;
    bool first;
    if (mi.gptj) {
        j = d >> 1;
        first = (d & 1) == 0;
        partner = first ? d + 1 : d - 1;
    } else {
        first = d < np;
        j = first ? d : d - np;
        partner = first ? d + np : d - np;
    }
    const float *rp = mi.cs + (size_t)(pos + 1) * mi.rot;
    float c, sn, y0, y1;
    kvm_cu_rope_angle_add(mi.cs[j], mi.cs[np + j], rp[j], rp[np + j], &c, &sn);
    const float y = mirror_elem(k, mi.kt, mi, s, g, Hkv, D, partner);
    if (first) kvm_cu_rope_pair(x, y, c, sn, mi.af, &y0, &y1);
    else kvm_cu_rope_pair(y, x, c, sn, mi.af, &y0, &y1);
    return first ? y0 : y1;
}

struct AttendWs {
    float *part;      // [Hq][tpw][D + 2]
    int *live;        // [Hkv][tpw]
    int *bad;         // [Hkv][tpw]: lowest position with a non-finite logit, INT_MAX: none
    float *o;         // [Hq][D]
    float *ml;        // [Hq][2]
    float *z;         // [Hkv][32]
    kvm_cu_rule *rule; // [Hkv]
    int *pos;          // [Hkv]: live positions of the tiles each stream counted
    float *score;      // scored: [Hkv][n_tiles]
};

__global__ void attend_init_kernel(AttendWs w, AttendDims p) {
    const size_t n_o = (size_t)p.Hq * p.D;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_o; i += (size_t)gridDim.x * blockDim.x)
        w.o[i] = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)p.Hq; i += (size_t)gridDim.x * blockDim.x) {
        w.ml[2 * i] = -INFINITY;
        w.ml[2 * i + 1] = 0.0f;
    }
    const size_t n_bad = (size_t)p.Hkv * p.tpw;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_bad; i += (size_t)gridDim.x * blockDim.x)
        w.bad[i] = INT_MAX; // a stream with a bad tile stops there: a slot is never reused after one
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)p.Hkv; i += (size_t)gridDim.x * blockDim.x) {
        kvm_cu_rule r = {0.0, 0, 0, 0, 0};
        w.rule[i] = r;
        w.pos[i] = 0;
        for (int k = 0; k < KVM_CU_PROBE; k++) w.z[i * KVM_CU_PROBE + k] = 0.0f;
    }
}

// Lane `lane` holds elements d = e * 32 + lane (e < VEC) of a head vector.
template <int VEC, typename T>
__global__ void __launch_bounds__(kWarps * 32)
attend_partial_kernel(const float *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
                      const int32_t *__restrict__ slot_map, const int32_t *__restrict__ order, int wave, AttendWs w,
                      AttendDims p, Mirror mi) {
    const int slot = blockIdx.x, hkv = blockIdx.y, g0 = blockIdx.z * kChunk;
    const int idx = wave * p.tpw + slot;
    if (idx >= p.n_visit) return;
    if (w.rule[hkv].done) return; // the stream stopped in an earlier wave: nothing of it is read
    const int gn = min(kChunk, p.G - g0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    float qr[kChunk][VEC], acc[kChunk][VEC], m[kChunk], l[kChunk];
#pragma unroll
    for (int g = 0; g < kChunk; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            const int d = e * 32 + lane;
            qr[g][e] = g < gn && d < p.D ? q[(size_t)(hkv * p.G + g0 + g) * p.D + d] : 0.0f;
            acc[g][e] = 0.0f;
        }
    }
    // a tile id outside [0, n_tiles) visits nothing (never reads out of bounds)
    const int tile = order[(size_t)hkv * p.ord_stride + idx];
    long long p0 = 0, p1 = 0;
    if (tile >= 0 && tile < p.n_tiles) {
        p0 = (long long)tile * p.tile;
        p1 = p0 + p.tile < p.n_pos ? p0 + p.tile : p.n_pos;
    }
    int n_live = 0;
    const size_t row = (size_t)p.Hkv * p.D;
    for (long long pos = p0 + warp; pos < p1; pos += kWarps) {
        const int s = slot_map[pos];
        if (s < 0 || s >= p.n_slots) continue; // dead: never read
        n_live++;
        float kv[VEC], vv[VEC];
        if (mi.rot > 0 || s >= mi.tail_slot) { // the device mirror's rows
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const int d = e * 32 + lane;
                kv[e] = d < p.D ? kvmcu_mirror_k(k, mi, s, hkv, p.Hkv, p.D, d, pos) : 0.0f;
                vv[e] = d < p.D ? kvmcu_mirror_v(v, mi, s, hkv, p.Hkv, p.D, d) : 0.0f;
            }
        } else {
            const T *kr = k + (size_t)s * row + (size_t)hkv * p.D;
            const T *vr = v + (size_t)s * row + (size_t)hkv * p.D;
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const int d = e * 32 + lane;
                kv[e] = d < p.D ? kvmcu::ld(kr + d) : 0.0f;
                vv[e] = d < p.D ? kvmcu::ld(vr + d) : 0.0f;
            }
        }
#pragma unroll
        for (int g = 0; g < kChunk; g++) {
            if (g < gn) {
                float dot = 0.0f;
#pragma unroll
                for (int e = 0; e < VEC; e++) dot = fmaf(qr[g][e], kv[e], dot);
                const float sc = kvmcu::warp_sum(dot) * p.scale;
                if (!(fabsf(sc) <= FLT_MAX) && lane == 0) atomicMin(&w.bad[hkv * p.tpw + slot], (int)pos); // NaN or inf
                const float mn = fmaxf(m[g], sc), a = expf(m[g] - mn), b = expf(sc - mn);
                l[g] = l[g] * a + b;
#pragma unroll
                for (int e = 0; e < VEC; e++) acc[g][e] = acc[g][e] * a + b * vv[e];
                m[g] = mn;
            }
        }
    }
    // merge the warps through shared memory, one query head at a time
    __shared__ float sm_m[kWarps], sm_l[kWarps];
    __shared__ float sm_acc[kWarps][VEC * 32];
    __shared__ int sm_live[kWarps];
    if (lane == 0) sm_live[warp] = n_live;
#pragma unroll
    for (int g = 0; g < kChunk; g++) {
        if (g >= gn) break; // uniform across the CTA: the barriers below are safe
        if (lane == 0) {
            sm_m[warp] = m[g];
            sm_l[warp] = l[g];
        }
#pragma unroll
        for (int e = 0; e < VEC; e++) sm_acc[warp][e * 32 + lane] = acc[g][e];
        __syncthreads();
        float mx = -INFINITY;
        for (int i = 0; i < kWarps; i++) mx = fmaxf(mx, sm_m[i]);
        float *dst = w.part + ((size_t)(hkv * p.G + g0 + g) * p.tpw + slot) * (p.D + 2);
        for (int d = threadIdx.x; d < p.D; d += blockDim.x) {
            float o = 0.0f;
            for (int i = 0; i < kWarps; i++)
                if (sm_m[i] != -INFINITY) o += sm_acc[i][d] * expf(sm_m[i] - mx);
            dst[d] = o;
        }
        if (threadIdx.x == 0) {
            float ls = 0.0f;
            for (int i = 0; i < kWarps; i++)
                if (sm_m[i] != -INFINITY) ls += sm_l[i] * expf(sm_m[i] - mx);
            dst[p.D] = mx;
            dst[p.D + 1] = ls;
            if (blockIdx.z == 0) w.live[hkv * p.tpw + slot] = sm_live[0] + sm_live[1] + sm_live[2] + sm_live[3];
        }
        __syncthreads();
    }
}

// One CTA per stream: fold the wave's tiles in order, with the stop rule.
__global__ void __launch_bounds__(256) attend_fold_kernel(AttendWs w, int wave, AttendDims p) {
    const int hkv = blockIdx.x, h0 = hkv * p.G, N = p.G * p.D;
    __shared__ float zs[KVM_CU_PROBE];
    __shared__ int s_done;
    if (threadIdx.x == 0) s_done = w.rule[hkv].done;
    __syncthreads();
    const int n_in_wave = min(p.tpw, p.n_visit - wave * p.tpw);
    for (int t = 0; t < n_in_wave && !s_done; t++) {
        if (w.live[hkv * p.tpw + t] == 0) continue; // no live position: not a visited tile
        const int bad = w.bad[hkv * p.tpw + t];
        if (bad != INT_MAX) { // uniform: every thread reads the same word
            __syncthreads();
            if (threadIdx.x == 0) {
                kvm_cu_rule r = w.rule[hkv];
                r.done = 1;
                r.visited = -1 - bad;
                w.rule[hkv] = r;
                s_done = 1;
            }
            __syncthreads();
            break;
        }
        // o = o * exp(m - m') + o_t * exp(m_t - m'), m' = max(m, m_t)
        for (int e = threadIdx.x; e < N; e += blockDim.x) {
            const int h = h0 + e / p.D, d = e % p.D;
            const float *pt = w.part + ((size_t)h * p.tpw + t) * (p.D + 2);
            const float m = w.ml[2 * h], mt = pt[p.D], mn = fmaxf(m, mt);
            const float c = m == -INFINITY ? 0.0f : expf(m - mn), b = mt == -INFINITY ? 0.0f : expf(mt - mn);
            w.o[(size_t)h * p.D + d] = w.o[(size_t)h * p.D + d] * c + pt[d] * b;
        }
        __syncthreads(); // every old m was read
        for (int g = threadIdx.x; g < p.G; g += blockDim.x) {
            const int h = h0 + g;
            const float *pt = w.part + ((size_t)h * p.tpw + t) * (p.D + 2);
            const float m = w.ml[2 * h], mt = pt[p.D], mn = fmaxf(m, mt);
            const float c = m == -INFINITY ? 0.0f : expf(m - mn), b = mt == -INFINITY ? 0.0f : expf(mt - mn);
            w.ml[2 * h] = mn;
            w.ml[2 * h + 1] = w.ml[2 * h + 1] * c + pt[p.D + 1] * b;
        }
        __syncthreads();
        // the probe of the stream's running output (o / l per head)
        if (threadIdx.x < p.probe_n) {
            const long long f = kvm_cu_probe_elem(N, threadIdx.x);
            const int g = (int)(f / p.D), d = (int)(f % p.D);
            zs[threadIdx.x] = kvm_cu_probe_value(N, w.o[(size_t)(h0 + g) * p.D + d], w.ml[2 * (h0 + g) + 1]);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            kvm_cu_rule r = w.rule[hkv];
            r.visited++;
            w.pos[hkv] += w.live[hkv * p.tpw + t];
            if (kvm_cu_rule_step(&r, w.z + (size_t)hkv * KVM_CU_PROBE, zs, p.probe_n, p.tau_s, p.tau_d, p.patience,
                                 p.stop_enabled))
                r.done = 1;
            w.rule[hkv] = r;
            s_done = r.done;
        }
        __syncthreads();
    }
}

__global__ void attend_final_kernel(AttendWs w, AttendDims p, float *__restrict__ out, int32_t *__restrict__ visited,
                                    int scored) {
    const size_t n_o = (size_t)p.Hq * p.D;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_o; i += (size_t)gridDim.x * blockDim.x) {
        const float l = w.ml[2 * (i / p.D) + 1];
        const float inv = l > 0.0f ? KVM_CU_DIV(1.0f, l) : 0.0f; // write_stream's acc * (1 / l)
        out[i] = KVM_CU_MUL(w.o[i], inv);
    }
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)p.Hkv; i += (size_t)gridDim.x * blockDim.x) {
        visited[i] = w.rule[i].visited;
        if (scored) visited[p.Hkv + i] = w.pos[i];
    }
}

// ---- the scored form: each stream's SCORED order (core/attend/attend_order.c) ----
// tile_score: one CTA per (tile, KV head): the tile's largest logit over its
// live positions and the stream's G query heads, NaN ignored (-inf when no
// position is live), one warp per position at a time.
template <int VEC, typename T>
__global__ void __launch_bounds__(kWarps * 32)
tile_score_kernel(const float *__restrict__ q, const T *__restrict__ k, const int32_t *__restrict__ slot_map, AttendWs w,
                  AttendDims p) {
    const long long t = blockIdx.x;
    const int hkv = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long p0 = t * p.tile, p1 = p0 + p.tile < p.n_pos ? p0 + p.tile : p.n_pos;
    const size_t row = (size_t)p.Hkv * p.D;
    float best = -INFINITY;
    for (long long pos = p0 + warp; pos < p1; pos += kWarps) {
        const int s = slot_map[pos];
        if (s < 0 || s >= p.n_slots) continue; // dead: never read
        const T *kr = k + (size_t)s * row + (size_t)hkv * p.D;
        float kv[VEC];
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            const int d = e * 32 + lane;
            kv[e] = d < p.D ? kvmcu::ld(kr + d) : 0.0f;
        }
        for (int g = 0; g < p.G; g++) {
            const float *qr = q + (size_t)(hkv * p.G + g) * p.D;
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const int d = e * 32 + lane;
                if (d < p.D) dot = fmaf(qr[d], kv[e], dot);
            }
            const float sc = kvmcu::warp_sum(dot) * p.scale;
            best = sc > best ? sc : best; // NaN ignored
        }
    }
    __shared__ float red[kWarps];
    if (lane == 0) red[warp] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = red[0];
        for (int i = 1; i < kWarps; i++) m = red[i] > m ? red[i] : m;
        w.score[(size_t)hkv * p.n_tiles + t] = m;
    }
}

// tile_rank: one thread per (tile, KV head): its place in the stream's order
// = the tiles ahead of it (a higher score, or the same score and a higher
// id: every pair compared exactly, so the order is the CPU sort's), the
// stream's scores read through shared memory 256 at a time.
constexpr int kRankThreads = 256;
__global__ void __launch_bounds__(kRankThreads) tile_rank_kernel(AttendWs w, AttendDims p, int32_t *__restrict__ order) {
    const int hkv = blockIdx.y;
    const long long t = (long long)blockIdx.x * kRankThreads + threadIdx.x;
    const float *sc = w.score + (size_t)hkv * p.n_tiles;
    const float st = t < p.n_tiles ? sc[t] : 0.0f;
    __shared__ float s_sc[kRankThreads];
    long long rank = 0;
    for (long long u0 = 0; u0 < p.n_tiles; u0 += kRankThreads) {
        __syncthreads();
        if (u0 + threadIdx.x < p.n_tiles) s_sc[threadIdx.x] = sc[u0 + threadIdx.x];
        __syncthreads();
        const int n = p.n_tiles - u0 < kRankThreads ? (int)(p.n_tiles - u0) : kRankThreads;
        for (int i = 0; i < n; i++) {
            const float su = s_sc[i];
            rank += su > st || (su == st && u0 + i > t);
        }
    }
    if (t < p.n_tiles && rank < p.n_tiles) order[(size_t)hkv * p.n_tiles + rank] = (int32_t)t;
}

template <int VEC>
cudaError_t launch_scores(const kvm_dev_attend_args *a, const AttendWs &w, const AttendDims &p, cudaStream_t stream) {
    const dim3 grid((unsigned)p.n_tiles, (unsigned)a->n_kv_heads, 1);
    const float *q = cu_at<const float>(a->q, a->q_off);
    const int32_t *sm = cu_at<const int32_t>(a->slot_map, a->slot_map_off);
    if (a->dtype == KVMEM_F32)
        tile_score_kernel<VEC, float><<<grid, kWarps * 32, 0, stream>>>(q, cu_at<const float>(a->k, a->k_off), sm, w, p);
    else
        tile_score_kernel<VEC, __half><<<grid, kWarps * 32, 0, stream>>>(q, cu_at<const __half>(a->k, a->k_off), sm, w, p);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const dim3 rgrid((unsigned)((p.n_tiles + kRankThreads - 1) / kRankThreads), (unsigned)a->n_kv_heads, 1);
    tile_rank_kernel<<<rgrid, kRankThreads, 0, stream>>>(w, p, cu_at<int32_t>(a->order, a->order_off));
    return cudaGetLastError();
}

template <int VEC>
cudaError_t launch_partials(const kvm_dev_attend_args *a, const kvm_cu_dev_attend_plan &plan, int wave, const AttendWs &w,
                            const AttendDims &p, cudaStream_t stream) {
    const dim3 grid((unsigned)plan.tiles_per_wave, (unsigned)a->n_kv_heads, (unsigned)plan.n_gchunks);
    const float *q = cu_at<const float>(a->q, a->q_off);
    const int32_t *sm = cu_at<const int32_t>(a->slot_map, a->slot_map_off);
    const int32_t *ord = cu_at<const int32_t>(a->order, a->order_off);
    Mirror mi;
    mi.kt = a->k_tail ? cu_at<const float>(a->k_tail, a->tail_off) : nullptr;
    mi.vt = a->v_tail ? cu_at<const float>(a->v_tail, a->tail_off) : nullptr;
    mi.cs = a->rotary_dim ? cu_at<const float>(a->rope_cs, a->rope_off) : nullptr;
    mi.tail_slot = a->k_tail ? (long long)a->tail_slot : LLONG_MAX;
    mi.rot = a->rotary_dim;
    mi.gptj = a->gptj;
    mi.af = a->attn_factor;
    if (a->dtype == KVMEM_F32)
        attend_partial_kernel<VEC, float><<<grid, kWarps * 32, 0, stream>>>(
            q, cu_at<const float>(a->k, a->k_off), cu_at<const float>(a->v, a->v_off), sm, ord, wave, w, p, mi);
    else
        attend_partial_kernel<VEC, __half><<<grid, kWarps * 32, 0, stream>>>(
            q, cu_at<const __half>(a->k, a->k_off), cu_at<const __half>(a->v, a->v_off), sm, ord, wave, w, p, mi);
    return cudaGetLastError();
}

// ---- dev_qmem_score ----

// One layer: ws[h][j] = softmax_j(scale * mem[l][h] . k[l][j][h / G]).
template <int VEC>
__global__ void __launch_bounds__(256)
qmem_layer_kernel(const float *__restrict__ mem, const float *__restrict__ k, int l, int n, int Hq, int Hkv, int D,
                  float scale, float *__restrict__ ws) {
    __shared__ float red[32];
    const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int hkv = h / (Hq / Hkv);
    float mr[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        const int d = e * 32 + lane;
        mr[e] = d < D ? mem[((size_t)l * Hq + h) * D + d] : 0.0f;
    }
    float *row = ws + (size_t)h * n;
    float mx = -INFINITY;
    for (int j = warp; j < n; j += n_warps) {
        const float *kr = k + (((size_t)l * n + j) * Hkv + hkv) * D;
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            const int d = e * 32 + lane;
            if (d < D) dot = fmaf(mr[e], kr[d], dot);
        }
        const float s = kvmcu::warp_sum(dot) * scale; // the reference: dot, then times scale
        if (lane == 0) row[j] = s;
        mx = fmaxf(mx, s);
    }
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    for (int i = 1; i < n_warps; i++) mx = fmaxf(mx, red[i]);
    __syncthreads();
    float z = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float e = expf(row[j] - mx);
        row[j] = e;
        z += e;
    }
    z = kvmcu::warp_sum(z);
    if (lane == 0) red[warp] = z;
    __syncthreads();
    z = red[0];
    for (int i = 1; i < n_warps; i++) z += red[i];
    const float inv = 1.0f / z;
    for (int j = threadIdx.x; j < n; j += blockDim.x) row[j] *= inv;
}

// scores[j] (+)= sum over the layer's heads in order, as the reference accumulates.
__global__ void qmem_accumulate_kernel(const float *__restrict__ ws, int n, int Hq, int first, float *__restrict__ scores) {
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
        float s = first ? 0.0f : scores[j];
        for (int h = 0; h < Hq; h++) s += ws[(size_t)h * n + j];
        scores[j] = s;
    }
}

}  // namespace

kvmem_status kvm_cu_dev_attend(kvmem_backend *be, const kvm_dev_attend_args *a) {
    if (!be || !a) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "dev_attend: args is NULL");
    kvm_cu_backend *b = cu_impl(be);
    kvm_cu_dev_attend_plan plan;
    kvmem_status st = kvm_cu_check_dev_attend(a, cu_size(a->q), cu_size(a->k), cu_size(a->v), cu_size(a->slot_map),
                                              cu_size(a->order), cu_size(a->out), cu_size(a->visited),
                                              b->props.multiProcessorCount, &plan);
    if (st == KVMEM_OK)
        st = kvm_cu_check_dev_attend_mirror(a, a->k_tail ? cu_size(a->k_tail) : 0, a->v_tail ? cu_size(a->v_tail) : 0,
                                            a->rope_cs ? cu_size(a->rope_cs) : 0);
    if (st != KVMEM_OK) return st;
    cudaSetDevice(b->device);
    unsigned char *ws = static_cast<unsigned char *>(cu_scratch(b, plan.ws_bytes, &st));
    if (st != KVMEM_OK) return st;
    AttendWs w;
    w.part = reinterpret_cast<float *>(ws + plan.off_part);
    w.live = reinterpret_cast<int *>(ws + plan.off_live);
    w.bad = reinterpret_cast<int *>(ws + plan.off_bad);
    w.o = reinterpret_cast<float *>(ws + plan.off_o);
    w.ml = reinterpret_cast<float *>(ws + plan.off_ml);
    w.z = reinterpret_cast<float *>(ws + plan.off_z);
    w.rule = reinterpret_cast<kvm_cu_rule *>(ws + plan.off_rule);
    w.pos = reinterpret_cast<int *>(ws + plan.off_pos);
    w.score = reinterpret_cast<float *>(ws + plan.off_score);
    AttendDims p;
    p.Hq = a->n_q_heads;
    p.Hkv = a->n_kv_heads;
    p.G = plan.group;
    p.D = a->head_dim;
    p.tile = a->tile;
    p.n_visit = a->n_visit;
    p.tpw = plan.tiles_per_wave;
    p.n_slots = (int)a->n_slots;
    p.probe_n = plan.probe_n;
    p.patience = a->patience;
    p.stop_enabled = a->tau_s != 0.0f || a->tau_d != 0.0f;
    p.n_pos = a->n_pos;
    p.n_tiles = plan.n_tiles;
    p.scale = a->scale;
    p.tau_s = a->tau_s;
    p.tau_d = a->tau_d;
    p.ord_stride = a->scored ? (int)plan.n_tiles : 0;
    const uint32_t cap = (uint32_t)b->props.multiProcessorCount * 4u;
    const size_t n_o = (size_t)p.Hq * p.D, n_bad = (size_t)p.Hkv * p.tpw;
    kvm_cu_grid g = kvm_cu_grid_1d(n_o > n_bad ? n_o : n_bad, 256, cap);
    attend_init_kernel<<<g.blocks, g.threads, 0, b->stream>>>(w, p);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && a->scored && p.n_tiles > 0) { // the streams' orders, written to a->order
        switch (plan.vec) {
        case 1: e = launch_scores<1>(a, w, p, b->stream); break;
        case 2: e = launch_scores<2>(a, w, p, b->stream); break;
        case 4: e = launch_scores<4>(a, w, p, b->stream); break;
        default: e = launch_scores<8>(a, w, p, b->stream); break;
        }
    }
    for (int wave = 0; wave < plan.n_waves && e == cudaSuccess; wave++) {
        switch (plan.vec) {
        case 1: e = launch_partials<1>(a, plan, wave, w, p, b->stream); break;
        case 2: e = launch_partials<2>(a, plan, wave, w, p, b->stream); break;
        case 4: e = launch_partials<4>(a, plan, wave, w, p, b->stream); break;
        default: e = launch_partials<8>(a, plan, wave, w, p, b->stream); break;
        }
        if (e == cudaSuccess) {
            attend_fold_kernel<<<(unsigned)p.Hkv, 256, 0, b->stream>>>(w, wave, p);
            e = cudaGetLastError();
        }
    }
    if (e == cudaSuccess) {
        attend_final_kernel<<<g.blocks, g.threads, 0, b->stream>>>(w, p, cu_at<float>(a->out, a->out_off),
                                                                   cu_at<int32_t>(a->visited, a->visited_off), a->scored);
        e = cudaGetLastError();
    }
    return cu_check(e, "dev_attend");
}

kvmem_status kvm_cu_dev_qmem_score(kvmem_backend *be, const kvm_dev_qmem_args *a) {
    if (!be || !a) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "dev_qmem_score: args is NULL");
    kvmem_status st = kvm_cu_check_dev_qmem(a, cu_size(a->mem), cu_size(a->k), cu_size(a->scores));
    if (st != KVMEM_OK) return st;
    kvm_cu_backend *b = cu_impl(be);
    cudaSetDevice(b->device);
    size_t ws_bytes;
    if (!kvm_cu_mul3((size_t)a->n_q_heads, (size_t)a->n, 4, &ws_bytes))
        return kvm_cu_fail(KVMEM_ERR_UNSUPPORTED, "dev_qmem_score: workspace overflows");
    float *ws = static_cast<float *>(cu_scratch(b, ws_bytes, &st));
    if (st != KVMEM_OK) return st;
    const float scale = (float)(1.0 / sqrt((double)a->head_dim)); // kvm_cpu_qmem_score's
    const float *mem = cu_at<const float>(a->mem, a->mem_off), *k = cu_at<const float>(a->k, a->k_off);
    float *scores = cu_at<float>(a->scores, a->scores_off);
    const int D = a->head_dim;
    kvm_cu_grid g = kvm_cu_grid_1d((size_t)a->n, 256, (uint32_t)b->props.multiProcessorCount * 8u);
    cudaError_t e = cudaSuccess;
    for (int l = 0; l < a->n_layers && e == cudaSuccess; l++) {
        const unsigned hq = (unsigned)a->n_q_heads;
        if (D <= 32) qmem_layer_kernel<1><<<hq, 256, 0, b->stream>>>(mem, k, l, a->n, a->n_q_heads, a->n_kv_heads, D, scale, ws);
        else if (D <= 64) qmem_layer_kernel<2><<<hq, 256, 0, b->stream>>>(mem, k, l, a->n, a->n_q_heads, a->n_kv_heads, D, scale, ws);
        else if (D <= 128) qmem_layer_kernel<4><<<hq, 256, 0, b->stream>>>(mem, k, l, a->n, a->n_q_heads, a->n_kv_heads, D, scale, ws);
        else qmem_layer_kernel<8><<<hq, 256, 0, b->stream>>>(mem, k, l, a->n, a->n_q_heads, a->n_kv_heads, D, scale, ws);
        if ((e = cudaGetLastError()) != cudaSuccess) break;
        qmem_accumulate_kernel<<<g.blocks, g.threads, 0, b->stream>>>(ws, a->n, a->n_q_heads, l == 0, scores);
        e = cudaGetLastError();
    }
    return cu_check(e, "dev_qmem_score");
}
