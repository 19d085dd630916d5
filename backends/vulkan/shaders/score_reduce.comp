#version 450
// dev_score's second half (core/backend/backend.h): normalise the block scores
// I[b][t][j] of a chunk of query tokens (written by aabb_score, b = layer x
// query head slice) over the blocks j of each (b, t), and aggregate over the
// tokens into out[b][j]. Three phases (dispatches of this pipeline):
//   phase 0 (SOFTMAX only): one workgroup per row (b, t) reduces the row's
//     max m and 1 / sum_j exp(tau (I_j - m)) into stats[row] (after the
//     scores in the scratch buffer); the scores are not rewritten.
//   phase 2 (RR only): one workgroup per (row, 128 blocks); invocation j
//     counts the blocks i in [i0, i1) that rank before it (I_i > I_j, or
//     equal with i < j: ties to the lower index), staged through shared
//     memory in tiles, and adds the count to rank[row][j] (after the stats;
//     i0 = 0 starts it). The host splits the blocks into such ranges.
//   phase 1: one workgroup per (b, 128 blocks); invocation j takes, for each
//     token t in [t0, t1) of the chunk, p = exp(tau (I_j - m)) / sum
//     (SOFTMAX) or 1 / (rank_j + 1 + rr_c) (RR), and folds it into out[b][j]
//     with MAX or SUM (starting from 0 when `first`: every p >= 0, so MAX
//     from 0 is the max).
// As the CPU reference: p = exp(tau * (I - m)) * (1 / sum). Ranks are
// counts below 2^24, exact in f32.
// Every phase's loops are bounded per dispatch by the host (token ranges,
// block ranges, the chunk size) to stay within the loop budget
// (vk_internal.h); vk_retrieval.c counts the loops here.
// KVM_SUBGROUP: phase 0's reductions use subgroup operations.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#ifdef KVM_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

layout(local_size_x = KVM_WG) in;
layout(std430, binding = 0) buffer S { float s[]; };     // I [rows][nb], then stats [rows][2]
layout(std430, binding = 1) buffer O { float o[]; };     // out [batch][nb] at out_off
layout(push_constant) uniform P {
    uint phase, nb, batch, tn; // blocks, slices, tokens in this chunk
    uint norm;                 // 0 SOFTMAX, 1 RR
    uint agg;                  // 0 MAX, 1 SUM
    float tau, rr_c;
    uint out_off, first;       // first: this dispatch starts the aggregate
    uint stats_off;            // = rows * nb
    uint t0, t1;               // phase 1: the tokens of this dispatch
    uint i0, i1;               // phase 2: the blocks counted by this dispatch
    uint rank_off;             // = stats_off + 2 * rows
} p;

shared float red[KVM_WG];
shared float tile[KVM_WG];

// Workgroup reductions; every invocation calls them (barriers inside).
float wg_max(float x) {
#ifdef KVM_SUBGROUP
    x = subgroupMax(x);
    if (subgroupElect()) red[gl_SubgroupID] = x;
    barrier();
    float r = red[0];
    for (uint i = 1u; i < gl_NumSubgroups; i++) r = max(r, red[i]);
    barrier();
    return r;
#else
    red[gl_LocalInvocationID.x] = x;
    barrier();
    for (uint w = KVM_WG / 2; w > 0u; w >>= 1) {
        if (gl_LocalInvocationID.x < w)
            red[gl_LocalInvocationID.x] = max(red[gl_LocalInvocationID.x], red[gl_LocalInvocationID.x + w]);
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
#endif
}

float wg_sum(float x) {
#ifdef KVM_SUBGROUP
    x = subgroupAdd(x);
    if (subgroupElect()) red[gl_SubgroupID] = x;
    barrier();
    float r = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; i++) r += red[i];
    barrier();
    return r;
#else
    red[gl_LocalInvocationID.x] = x;
    barrier();
    for (uint w = KVM_WG / 2; w > 0u; w >>= 1) {
        if (gl_LocalInvocationID.x < w) red[gl_LocalInvocationID.x] += red[gl_LocalInvocationID.x + w];
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
#endif
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint ngroups = gl_NumWorkGroups.x * gl_NumWorkGroups.y;
    uint gid = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (p.phase == 0u) {
        uint rows = p.batch * p.tn;
        for (uint row = gid; row < rows; row += ngroups) { // uniform per workgroup
            uint base = row * p.nb;
            float m = -3.402823466e38;
            for (uint j = tid; j < p.nb; j += KVM_WG) m = max(m, s[base + j]);
            m = wg_max(m);
            float acc = 0.0;
            for (uint j = tid; j < p.nb; j += KVM_WG) acc += exp(p.tau * (s[base + j] - m));
            acc = wg_sum(acc);
            if (tid == 0u) {
                s[p.stats_off + 2u * row] = m;
                s[p.stats_off + 2u * row + 1u] = 1.0 / acc;
            }
        }
        return;
    }
    uint jt = (p.nb + KVM_WG - 1u) / KVM_WG; // block tiles per slice
    if (p.phase == 2u) {
        uint rows = p.batch * p.tn;
        for (uint w = gid; w < rows * jt; w += ngroups) { // uniform per workgroup
            uint row = w / jt, j = (w - row * jt) * KVM_WG + tid, base = row * p.nb;
            bool live = j < p.nb;
            float x = live ? s[base + j] : 0.0;
            uint rank = 0u;
            for (uint j0 = p.i0; j0 < p.i1; j0 += KVM_WG) {
                tile[tid] = j0 + tid < p.i1 ? s[base + j0 + tid] : 0.0;
                barrier();
                uint n = min(KVM_WG, p.i1 - j0);
                for (uint i = 0u; i < n; i++) {
                    float y = tile[i];
                    rank += (y > x || (y == x && j0 + i < j)) ? 1u : 0u;
                }
                barrier();
            }
            if (live) {
                uint ri = p.rank_off + base + j;
                s[ri] = (p.i0 == 0u ? 0.0 : s[ri]) + float(rank);
            }
        }
        return;
    }
    for (uint w = gid; w < p.batch * jt; w += ngroups) { // uniform per workgroup
        uint b = w / jt, j = (w - b * jt) * KVM_WG + tid;
        bool live = j < p.nb;
        uint oi = p.out_off + b * p.nb + j;
        float acc = (p.first != 0u || !live) ? 0.0 : o[oi];
        for (uint t = p.t0; t < p.t1; t++) {
            uint row = b * p.tn + t, base = row * p.nb;
            float pr;
            if (p.norm == 0u) {
                float x = live ? s[base + j] : 0.0;
                pr = exp(p.tau * (x - s[p.stats_off + 2u * row])) * s[p.stats_off + 2u * row + 1u];
            } else {
                pr = 1.0 / ((live ? s[p.rank_off + base + j] : 0.0) + 1.0 + p.rr_c);
            }
            acc = p.agg == 0u ? max(acc, pr) : acc + pr;
        }
        if (live) o[oi] = acc;
    }
}
