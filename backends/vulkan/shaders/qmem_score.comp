#version 450
// dev_qmem_score: IntentKV's rule score (core/backend/backend.h)
//   a[l,h,j] = softmax over j of (scale * mem[l,h] . k[l,j,h/G]),
//   scores[j] = sum over l, h of a[l,h,j].
// pass 0: one workgroup per (l, h) (group id x = h, y = l): online softmax
//   over the tokens [j0, j1) (running max and sum of exp), reduced across the
//   workgroup with subgroup operations (KVM_SUBGROUP) or in shared memory,
//   and combined with the statistics of the earlier ranges in stats[l][h]
//   (max, then the sum; 1/sum after the last range).
// pass 1: one invocation per token j: adds, for the slices s = l * Hq + h in
//   [s0, s1) in order, exp(logit - max) / sum to scores[j] (0 before the
//   first slice). The order is fixed, so results are deterministic on a
//   device, and no scratch of N x layers x heads is needed (logits are
//   recomputed: two reads of K in all).
// The host splits both passes into dispatches (token ranges, slice ranges)
// that stay within the loop budget (vk_internal.h; vk_qmem.c counts the
// loops here).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#ifdef KVM_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

layout(local_size_x = KVM_WG) in;
layout(std430, binding = 0) readonly buffer Mem { float mem[]; };
layout(std430, binding = 1) readonly buffer K { float kk[]; };
layout(std430, binding = 2) buffer Stats { float stats[]; }; // [L][Hq][2]: max, 1/sum
layout(std430, binding = 3) buffer Scores { float scores[]; };
layout(push_constant) uniform P {
    uint L, Hq, Hkv, D, n;
    uint mem_off, k_off, scores_off; // floats
    float scale;
    uint pass;
    uint j0, j1;      // pass 0: the tokens of this dispatch
    uint first, last; // pass 0: the first and the last token range
    uint s0, s1;      // pass 1: the slices of this dispatch
} p;

const float NEG = -3.402823466e38; // empty state: exp(NEG - m) == 0

float logit(uint l, uint h, uint j) {
    uint g = h / (p.Hq / p.Hkv);
    uint mb = p.mem_off + (l * p.Hq + h) * p.D;
    uint kb = p.k_off + ((l * p.n + j) * p.Hkv + g) * p.D;
    float s = 0.0;
    for (uint d = 0u; d < p.D; d++) s += mem[mb + d] * kk[kb + d];
    return s * p.scale;
}

// (m, s) <- (m, s) combined with (m2, s2): the larger max, sums rescaled.
void combine(inout float m, inout float s, float m2, float s2) {
    float mm = max(m, m2);
    s = s * exp(m - mm) + s2 * exp(m2 - mm);
    m = mm;
}

shared float sh_m[KVM_WG], sh_s[KVM_WG]; // per invocation, or per subgroup (KVM_SUBGROUP)

// This range's (M, S) combined with the earlier ranges' and stored: the sum
// until the last range, then its inverse.
void store_stats(uint l, uint h, float M, float S) {
    uint si = 2u * (l * p.Hq + h);
    if (p.first == 0u) combine(M, S, stats[si], stats[si + 1u]);
    stats[si] = M;
    stats[si + 1u] = p.last != 0u ? 1.0 / S : S;
}

void pass0() {
    uint h = gl_WorkGroupID.x, l = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    float m = NEG, s = 0.0;
    for (uint j = p.j0 + tid; j < p.j1; j += KVM_WG) {
        float x = logit(l, h, j);
        if (x > m) {
            s = s * exp(m - x) + 1.0;
            m = x;
        } else {
            s += exp(x - m);
        }
    }
#ifdef KVM_SUBGROUP
    float sm = subgroupMax(m);
    float ss = subgroupAdd(s * exp(m - sm));
    if (subgroupElect()) {
        sh_m[gl_SubgroupID] = sm;
        sh_s[gl_SubgroupID] = ss;
    }
    barrier();
    if (tid == 0u) {
        float M = sh_m[0], S = sh_s[0];
        for (uint i = 1u; i < gl_NumSubgroups; i++) combine(M, S, sh_m[i], sh_s[i]);
        store_stats(l, h, M, S);
    }
#else
    sh_m[tid] = m;
    sh_s[tid] = s;
    barrier();
    for (uint w = KVM_WG / 2u; w > 0u; w >>= 1) {
        if (tid < w) {
            float M = sh_m[tid], S = sh_s[tid];
            combine(M, S, sh_m[tid + w], sh_s[tid + w]);
            sh_m[tid] = M;
            sh_s[tid] = S;
        }
        barrier();
    }
    if (tid == 0u) store_stats(l, h, sh_m[0], sh_s[0]);
#endif
}

void pass1() {
    uint stride = gl_NumWorkGroups.x * KVM_WG;
    for (uint j = gl_GlobalInvocationID.x; j < p.n; j += stride) {
        float acc = p.s0 == 0u ? 0.0 : scores[p.scores_off + j];
        for (uint x = p.s0; x < p.s1; x++) { // slice x = (l, h), l-major as the reference sums
            uint l = x / p.Hq, h = x - l * p.Hq;
            acc += exp(logit(l, h, j) - stats[2u * x]) * stats[2u * x + 1u];
        }
        scores[p.scores_off + j] = acc;
    }
}

void main() {
    if (p.pass == 0u) pass0();
    else pass1();
}
