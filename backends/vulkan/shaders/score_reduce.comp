#version 450
// dev_score's second half (core/backend.h): normalise the block scores
// I[b][t][j] of a chunk of query tokens (written by aabb_score, b = layer x
// query head slice) over the blocks j of each (b, t), and aggregate over the
// tokens into out[b][j]. Two phases (two dispatches of this pipeline):
//   phase 0 (SOFTMAX only): one workgroup per row (b, t) reduces the row's
//     max m and 1 / sum_j exp(tau (I_j - m)) into stats[row] (after the
//     scores in the scratch buffer); the scores are not rewritten.
//   phase 1: one workgroup per (b, 128 blocks); invocation j takes, for each
//     token t of the chunk, p = exp(tau (I_j - m)) / sum (SOFTMAX) or
//     1 / (rank_j + rr_c) (RR: rank from 1 by I descending, ties to the lower
//     j, counted against the row staged through shared memory in tiles), and
//     folds it into out[b][j] with MAX or SUM (starting from 0 on the first
//     chunk: every p >= 0, so MAX from 0 is the max).
// As the CPU reference: p = exp(tau * (I - m)) * (1 / sum).
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
    uint out_off, first;       // first: this chunk starts the aggregate
    uint stats_off;            // = rows * nb
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
    for (uint w = gid; w < p.batch * jt; w += ngroups) { // uniform per workgroup
        uint b = w / jt, j = (w - b * jt) * KVM_WG + tid;
        bool live = j < p.nb;
        uint oi = p.out_off + b * p.nb + j;
        float acc = (p.first != 0u || !live) ? 0.0 : o[oi];
        for (uint t = 0u; t < p.tn; t++) {
            uint row = b * p.tn + t, base = row * p.nb;
            float x = live ? s[base + j] : 0.0, pr;
            if (p.norm == 0u) {
                pr = exp(p.tau * (x - s[p.stats_off + 2u * row])) * s[p.stats_off + 2u * row + 1u];
            } else {
                uint rank = 1u;
                for (uint j0 = 0u; j0 < p.nb; j0 += KVM_WG) {
                    tile[tid] = j0 + tid < p.nb ? s[base + j0 + tid] : 0.0;
                    barrier();
                    uint n = min(KVM_WG, p.nb - j0);
                    for (uint i = 0u; i < n; i++) {
                        float y = tile[i];
                        rank += (y > x || (y == x && j0 + i < j)) ? 1u : 0u;
                    }
                    barrier();
                }
                pr = 1.0 / (float(rank) + p.rr_c);
            }
            acc = p.agg == 0u ? max(acc, pr) : acc + pr;
        }
        if (live) o[oi] = acc;
    }
}
