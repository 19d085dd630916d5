// ART attention decode: split-K flash-decoding with run-time termination
// (DESIGN.md, Attention with run-time termination).
//
// One decode token, Hq query heads, KV in a paged store addressed through a
// slot map; dead slots (slot < 0) are skipped, never read. Logical positions
// are cut into tiles of `tile`; the caller gives the traversal order of the
// tiles (RECENT, IMPORTANCE, an index list: decided on the host). Tiles are
// processed in waves of `tiles_per_wave`:
//   attend_partial: one CTA per (wave slot, KV head) computes the tile's
//     unnormalised output, max and denominator for all query heads of that
//     KV head (GQA: K/V read once), every tile of the wave in parallel.
//   attend_fold: one warp per query head folds the wave's partials into the
//     running state in traversal order and applies the stop rule after each
//     tile, on the probe z = a 32-element strided subsample of o: lane i holds
//     o[i * D/32 .. (i+1) * D/32), so z[i] is lane i's first element and the
//     norms and the cosine are warp reductions (oracle mode: all D elements).
// A head that stopped makes later partial CTAs of its KV head exit at once, so
// the work past the stopping tile is at most one wave. With tau_s = tau_d = 0
// the result is full attention.
//
//   q         f32 [Hq][D]
//   k, v      T   [n_slots][Hkv][D]
//   slot_map  int32 [n_pos]
//   order     int32 [n_visit]           tile ids in traversal order
//   out       f32 [Hq][D]; visited, stopped int32 [Hq]
//   ws        kvm_cu_attend_plan.ws_bytes: partials, then per-head states
#pragma once
#include "common.cuh"

namespace kvmcu {

struct AttendParams {
    int n_q_heads, n_kv_heads;
    int n_pos, tile, n_visit, tiles_per_wave;
    int n_slots;         // slot ids outside [0, n_slots) count as dead: never read
    float scale;         // logit scale, 1/sqrt(D) by default
    float tau_s, tau_d;  // stop thresholds
    int patience;        // consecutive stable tiles to stop; 0 = never stop
    int oracle;          // 1: probe the whole vector
    size_t state_stride; // bytes per head state
};

template <int HEAD_DIM> struct AttendState {
    // layout fixed by kvm_cu_attend_state_bytes: o[D], m, l, zprev[32], 4 ints
    __device__ static float *o(unsigned char *s) { return reinterpret_cast<float *>(s); }
    __device__ static float *ml(unsigned char *s) { return reinterpret_cast<float *>(s) + HEAD_DIM; }
    __device__ static float *zprev(unsigned char *s) { return reinterpret_cast<float *>(s) + HEAD_DIM + 2; }
    __device__ static int *ints(unsigned char *s) { return reinterpret_cast<int *>(reinterpret_cast<float *>(s) + HEAD_DIM + 34); }
};

template <int HEAD_DIM>
__global__ void attend_init_kernel(unsigned char *states, int n_q_heads, size_t stride) {
    for (int h = blockIdx.x; h < n_q_heads; h += gridDim.x) {
        unsigned char *s = states + (size_t)h * stride;
        for (int i = threadIdx.x; i < HEAD_DIM; i += blockDim.x) AttendState<HEAD_DIM>::o(s)[i] = 0.0f;
        if (threadIdx.x < 32) AttendState<HEAD_DIM>::zprev(s)[threadIdx.x] = 0.0f;
        if (threadIdx.x == 0) {
            AttendState<HEAD_DIM>::ml(s)[0] = -INFINITY;
            AttendState<HEAD_DIM>::ml(s)[1] = 0.0f;
            for (int i = 0; i < 4; i++) AttendState<HEAD_DIM>::ints(s)[i] = 0; // streak, visited, stopped, have_prev
        }
    }
}

constexpr int kAttendMaxGroup = 8; // query heads per KV head in one CTA

template <int HEAD_DIM, typename T>
__global__ void __launch_bounds__(128)
attend_partial_kernel(const float *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
                      const int32_t *__restrict__ slot_map, const int32_t *__restrict__ order, int wave,
                      float *__restrict__ partials, const unsigned char *__restrict__ states, AttendParams p) {
    constexpr int VEC = HEAD_DIM / 32;
    constexpr int NW = 4;
    const int slot = blockIdx.x, hkv = blockIdx.y;
    const int idx = wave * p.tiles_per_wave + slot;
    if (idx >= p.n_visit) return;
    const int group = p.n_q_heads / p.n_kv_heads;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    int all_stopped = 1;
    for (int g = 0; g < group; g++)
        all_stopped &= AttendState<HEAD_DIM>::ints(const_cast<unsigned char *>(states) +
                                                   (size_t)(hkv * group + g) * p.state_stride)[2];
    if (all_stopped) return;

    float qr[kAttendMaxGroup][VEC], acc[kAttendMaxGroup][VEC], m[kAttendMaxGroup], l[kAttendMaxGroup];
#pragma unroll
    for (int g = 0; g < kAttendMaxGroup; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            qr[g][e] = g < group ? q[(size_t)(hkv * group + g) * HEAD_DIM + lane * VEC + e] * p.scale : 0.0f;
            acc[g][e] = 0.0f;
        }
    }
    const int tile = order[idx];
    // a tile id outside the slot map visits nothing (never reads out of bounds)
    const int p0 = tile < 0 ? 0 : tile * p.tile, p1 = tile < 0 ? 0 : min(p0 + p.tile, p.n_pos);
    const size_t row = (size_t)p.n_kv_heads * HEAD_DIM;
    for (int pos = p0 + warp; pos < p1; pos += NW) {
        const int s = slot_map[pos];
        if (s < 0 || s >= p.n_slots) continue; // dead slot: never read
        const T *kr = k + (size_t)s * row + (size_t)hkv * HEAD_DIM + lane * VEC;
        const T *vr = v + (size_t)s * row + (size_t)hkv * HEAD_DIM + lane * VEC;
        float kv[VEC], vv[VEC];
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            kv[e] = ld(kr + e);
            vv[e] = ld(vr + e);
        }
#pragma unroll
        for (int g = 0; g < kAttendMaxGroup; g++) {
            if (g < group) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < VEC; e++) d = fmaf(qr[g][e], kv[e], d);
                d = warp_sum(d);
                const float mn = fmaxf(m[g], d), a = __expf(m[g] - mn), b = __expf(d - mn);
                l[g] = l[g] * a + b;
#pragma unroll
                for (int e = 0; e < VEC; e++) acc[g][e] = acc[g][e] * a + b * vv[e];
                m[g] = mn;
            }
        }
    }
    // merge the warps: (m, l, acc) of each warp through shared memory
    __shared__ float sm_m[NW][kAttendMaxGroup], sm_l[NW][kAttendMaxGroup];
    __shared__ float sm_acc[NW][HEAD_DIM];
    // unrolled over the compile-time bound so acc stays in registers; the
    // condition is uniform across the CTA, so the barriers inside are safe
#pragma unroll
    for (int g = 0; g < kAttendMaxGroup; g++) {
        if (g >= group) break;
        if (lane == 0) {
            sm_m[warp][g] = m[g];
            sm_l[warp][g] = l[g];
        }
#pragma unroll
        for (int e = 0; e < VEC; e++) sm_acc[warp][lane * VEC + e] = acc[g][e];
        __syncthreads();
        float mx = -INFINITY;
        for (int w = 0; w < NW; w++) mx = fmaxf(mx, sm_m[w][g]);
        float *dst = partials + ((size_t)(hkv * group + g) * p.tiles_per_wave + slot) * (HEAD_DIM + 2);
        for (int i = threadIdx.x; i < HEAD_DIM; i += blockDim.x) {
            float o = 0.0f;
            for (int w = 0; w < NW; w++)
                if (sm_m[w][g] != -INFINITY) o += sm_acc[w][i] * __expf(sm_m[w][g] - mx);
            dst[i] = o;
        }
        if (threadIdx.x == 0) {
            float ls = 0.0f;
            for (int w = 0; w < NW; w++)
                if (sm_m[w][g] != -INFINITY) ls += sm_l[w][g] * __expf(sm_m[w][g] - mx);
            dst[HEAD_DIM] = mx;
            dst[HEAD_DIM + 1] = ls;
        }
        __syncthreads();
    }
}

template <int HEAD_DIM>
__global__ void attend_fold_kernel(const float *__restrict__ partials, unsigned char *__restrict__ states, int wave,
                                   float *__restrict__ out, int32_t *__restrict__ visited, int32_t *__restrict__ stopped,
                                   AttendParams p) {
    constexpr int VEC = HEAD_DIM / 32;
    const int h = blockIdx.x, lane = threadIdx.x & 31;
    unsigned char *s = states + (size_t)h * p.state_stride;
    float *so = AttendState<HEAD_DIM>::o(s), *sml = AttendState<HEAD_DIM>::ml(s), *sz = AttendState<HEAD_DIM>::zprev(s);
    int *si = AttendState<HEAD_DIM>::ints(s);
    float o[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) o[e] = so[lane * VEC + e];
    float m = sml[0], l = sml[1], zp = sz[lane];
    int streak = si[0], vis = si[1], stop = si[2], have_prev = si[3];
    const int n_in_wave = min(p.tiles_per_wave, p.n_visit - wave * p.tiles_per_wave);
    for (int t = 0; t < n_in_wave && !stop; t++) {
        const float *pp = partials + ((size_t)h * p.tiles_per_wave + t) * (HEAD_DIM + 2);
        const float pm = pp[HEAD_DIM], pl = pp[HEAD_DIM + 1];
        if (pl == 0.0f) continue; // every slot of the tile dead: nothing visited
        // the previous output o/l, before this tile is folded in
        float prev[VEC];
        const float inv_old = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
        for (int e = 0; e < VEC; e++) prev[e] = o[e] * inv_old;
        const float mn = fmaxf(m, pm), a = m == -INFINITY ? 0.0f : __expf(m - mn), b = __expf(pm - mn);
#pragma unroll
        for (int e = 0; e < VEC; e++) o[e] = o[e] * a + pp[lane * VEC + e] * b;
        l = l * a + pl * b;
        m = mn;
        vis++;
        // the probe: lane i's first element is z[i] (strided subsample), or
        // every element (oracle); norms and the dot are warp reductions
        const float inv = 1.0f / l;
        float zz = 0.0f, zd = 0.0f, pz = 0.0f;
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            if (e == 0 || p.oracle) {
                const float z = o[e] * inv;
                zz += z * z;
                zd += z * prev[e];
                pz += prev[e] * prev[e];
            }
        }
        zz = warp_sum(zz);
        zd = warp_sum(zd);
        pz = warp_sum(pz);
        zp = o[0] * inv;
        if (have_prev && p.patience > 0) {
            const float n = sqrtf(zz), np = sqrtf(pz);
            const float ds = np > 0.0f ? fabsf(n - np) / np : INFINITY;
            const float cosv = (n > 0.0f && np > 0.0f) ? zd / (n * np) : -1.0f;
            const bool stable = ds <= p.tau_s && (1.0f - cosv) <= p.tau_d;
            streak = stable ? streak + 1 : 0;
            if (streak >= p.patience) stop = 1;
        }
        have_prev = 1;
    }
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        so[lane * VEC + e] = o[e];
        out[(size_t)h * HEAD_DIM + lane * VEC + e] = l > 0.0f ? o[e] / l : 0.0f;
    }
    sz[lane] = zp;
    if (lane == 0) {
        sml[0] = m;
        sml[1] = l;
        si[0] = streak;
        si[1] = vis;
        si[2] = stop;
        si[3] = have_prev;
        visited[h] = vis;
        stopped[h] = stop;
    }
}

// ws: partial_bytes then state_bytes of kvm_cu_attend_plan.
inline cudaError_t attend(const float *q, const void *k, const void *v, DType dt, int head_dim,
                          const int32_t *slot_map, const int32_t *order, const AttendParams &p, size_t partial_bytes,
                          void *ws, float *out, int32_t *visited, int32_t *stopped, cudaStream_t stream) {
    if (p.n_q_heads % p.n_kv_heads || p.n_q_heads / p.n_kv_heads > kAttendMaxGroup) return cudaErrorInvalidValue;
    float *partials = static_cast<float *>(ws);
    unsigned char *states = static_cast<unsigned char *>(ws) + partial_bytes;
    const int n_waves = (p.n_visit + p.tiles_per_wave - 1) / p.tiles_per_wave;
    KVM_CU_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, {
        attend_init_kernel<HEAD_DIM><<<p.n_q_heads, 128, 0, stream>>>(states, p.n_q_heads, p.state_stride);
        KVM_CU_DISPATCH_HALF(dt, T, {
            for (int w = 0; w < n_waves; w++) {
                attend_partial_kernel<HEAD_DIM, T><<<dim3(p.tiles_per_wave, p.n_kv_heads), 128, 0, stream>>>(
                    q, static_cast<const T *>(k), static_cast<const T *>(v), slot_map, order, w, partials, states, p);
                attend_fold_kernel<HEAD_DIM><<<p.n_q_heads, 32, 0, stream>>>(partials, states, w, out, visited, stopped, p);
            }
        });
    });
    return cudaGetLastError();
}

}  // namespace kvmcu
