#version 450
// dev_topk (core/backend/backend.h): the indices of the k largest non-NaN scores,
// ties to the lower index, written in ascending index order. Radix select
// on an order-preserving key, then a stable compaction; one pipeline, six
// phases (dispatches in one submission, each followed by a barrier):
//   0 init     state = {prefix 0, rem k, total 0, take_all 0}, histogram 0
//   1 hist     (round r = 0..3) histogram of key bits [24-8r, 32-8r) over the
//              elements whose higher bits equal the prefix chosen so far
//   2 select   (round r) one invocation walks the 256 bins from the top to
//              the bin holding the rem-th largest; round 0 also counts the
//              non-NaN total, and when total <= k takes everything
//   after round 3, T = prefix is the k-th largest key and rem the number of
//   elements equal to T to take (the first rem by index: ties to the lower)
//   3 count    per chunk of 1024 elements: how many keys are > T and == T
//   4 scan     one invocation: per chunk, elements selected before it and
//              T-equal elements before it (exclusive prefix sums)
//   5 write    per chunk: each selected element's rank among the selected
//              (chunk prefix + workgroup scan) is its output position
// Keys: non-NaN x -> bits ^ (sign ? 0xffffffff : 0x80000000) (-0 as +0: the
// comparison, not the bits, decides ties), so key order is float order and
// no non-NaN key is 0 (-inf maps to 0x007fffff). NaNs are never counted.
// Comparisons are on bits: a device that flushes denormals still orders them.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = KVM_WG) in;
layout(std430, binding = 0) readonly buffer Sc { uint sc[]; };
layout(std430, binding = 1) buffer St { uint st[]; };
layout(std430, binding = 2) writeonly buffer Ix { int ix[]; };
layout(push_constant) uniform P {
    uint phase, round, n, k;
    uint sc_off, ix_off, n_chunks;
} p;

#define ST_PREFIX 0u
#define ST_REM 1u
#define ST_TOTAL 2u
#define ST_ALL 3u
#define ST_SEL 4u
#define ST_HIST 8u
#define ST_CHUNK (ST_HIST + 256u) // [n_chunks] selected before, then [n_chunks] equal before
#define CH 1024u                   // chunk: 8 consecutive elements per invocation
#define PER 8u

shared uint hist[256];
shared uint sg[KVM_WG], se[KVM_WG];

// key, or 0 for NaN (no non-NaN key is 0)
uint key_of(uint i) {
    uint x = sc[p.sc_off + i];
    uint ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return 0u;
    if (ax == 0u) x = 0u;
    return (x & 0x80000000u) != 0u ? ~x : x | 0x80000000u;
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint ngroups = gl_NumWorkGroups.x * gl_NumWorkGroups.y;
    uint gid = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (p.phase == 0u) {
        if (gid != 0u) return;
        if (tid == 0u) {
            st[ST_PREFIX] = 0u;
            st[ST_REM] = p.k;
            st[ST_TOTAL] = 0u;
            st[ST_ALL] = 0u;
            st[ST_SEL] = 0u;
        }
        for (uint b = tid; b < 256u; b += KVM_WG) st[ST_HIST + b] = 0u;
        return;
    }
    if (p.phase == 1u) {
        if (st[ST_ALL] != 0u) return; // uniform: everything is taken
        uint shift = 24u - 8u * p.round;
        uint himask = p.round == 0u ? 0u : ~0u << (32u - 8u * p.round);
        uint prefix = st[ST_PREFIX];
        for (uint b = tid; b < 256u; b += KVM_WG) hist[b] = 0u;
        barrier();
        uint stride = gl_NumWorkGroups.x * KVM_WG;
        for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
            uint key = key_of(i);
            if (key != 0u && (key & himask) == prefix) atomicAdd(hist[(key >> shift) & 255u], 1u);
        }
        barrier();
        for (uint b = tid; b < 256u; b += KVM_WG)
            if (hist[b] != 0u) atomicAdd(st[ST_HIST + b], hist[b]);
        return;
    }
    if (p.phase == 2u) {
        if (gid != 0u || tid != 0u) return;
        if (st[ST_ALL] != 0u) return;
        uint shift = 24u - 8u * p.round, rem = st[ST_REM];
        if (p.round == 0u) {
            uint total = 0u;
            for (uint b = 0u; b < 256u; b++) total += st[ST_HIST + b];
            st[ST_TOTAL] = total;
            if (total <= p.k) { // take every non-NaN: T = 0 (below every key)
                st[ST_ALL] = 1u;
                st[ST_PREFIX] = 0u;
                st[ST_REM] = 0u;
                return;
            }
        }
        uint cum = 0u;
        for (int b = 255; b >= 0; b--) {
            uint h = st[ST_HIST + uint(b)];
            if (cum + h >= rem) {
                st[ST_PREFIX] |= uint(b) << shift;
                st[ST_REM] = rem - cum;
                break;
            }
            cum += h;
        }
        for (uint b = 0u; b < 256u; b++) st[ST_HIST + b] = 0u;
        return;
    }
    uint T = st[ST_PREFIX], rem = st[ST_REM];
    if (p.phase == 3u) {
        for (uint c = gid; c < p.n_chunks; c += ngroups) { // uniform per workgroup
            if (tid == 0u) { hist[0] = 0u; hist[1] = 0u; }
            barrier();
            uint g = 0u, e = 0u;
            for (uint i = c * CH + tid * PER, end = min(i + PER, p.n); i < end; i++) {
                uint key = key_of(i);
                g += key > T ? 1u : 0u;
                e += key == T && key != 0u ? 1u : 0u;
            }
            atomicAdd(hist[0], g);
            atomicAdd(hist[1], e);
            barrier();
            if (tid == 0u) {
                st[ST_CHUNK + c] = hist[0];
                st[ST_CHUNK + p.n_chunks + c] = hist[1];
            }
            barrier();
        }
        return;
    }
    if (p.phase == 4u) {
        if (gid != 0u || tid != 0u) return;
        uint selb = 0u, eqb = 0u;
        for (uint c = 0u; c < p.n_chunks; c++) {
            uint g = st[ST_CHUNK + c], e = st[ST_CHUNK + p.n_chunks + c];
            st[ST_CHUNK + c] = selb;
            st[ST_CHUNK + p.n_chunks + c] = eqb;
            selb += g + (min(eqb + e, rem) - min(eqb, rem));
            eqb += e;
        }
        st[ST_SEL] = selb;
        return;
    }
    // phase 5: write
    for (uint c = gid; c < p.n_chunks; c += ngroups) { // uniform per workgroup
        uint i0 = c * CH + tid * PER, end = min(i0 + PER, p.n);
        uint g = 0u, e = 0u;
        for (uint i = i0; i < end; i++) {
            uint key = key_of(i);
            g += key > T ? 1u : 0u;
            e += key == T && key != 0u ? 1u : 0u;
        }
        sg[tid] = g;
        se[tid] = e;
        barrier();
        if (tid == 0u) { // exclusive scan of 128 pairs
            uint a = 0u, b = 0u;
            for (uint t = 0u; t < KVM_WG; t++) {
                uint x = sg[t], y = se[t];
                sg[t] = a;
                se[t] = b;
                a += x;
                b += y;
            }
        }
        barrier();
        uint selb = st[ST_CHUNK + c], eqb = st[ST_CHUNK + p.n_chunks + c];
        uint gb = sg[tid], eb = eqb + se[tid];
        uint base = selb - min(eqb, rem);
        for (uint i = i0; i < end; i++) {
            uint key = key_of(i);
            bool gt = key > T, eq = key == T && key != 0u;
            if (gt || (eq && eb < rem)) ix[p.ix_off + base + gb + min(eb, rem)] = int(i);
            gb += gt ? 1u : 0u;
            eb += eq ? 1u : 0u;
        }
        barrier();
    }
}
