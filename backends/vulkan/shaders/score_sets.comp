#version 450
// dev_score_reduce (core/backend.h): dev_score's per-(layer, query head)
// block scores in[l][h][j] summed into per-set scores out[s][j], in the
// contract's order: per layer the heads in order, then the set's layers in
// order, each a float sum from 0 (`precise`: no reassociation, no
// contraction), so the result is the CPU reference's bit for bit.
// One invocation per item = s * n + j of a range [i0, i0 + 128 * groups);
// a dispatch adds the set-local layers [u0, u1) to the item's running total
// (u0 = 0 starts it), so the host splits long sums into dispatches at layer
// boundaries to stay within the loop budget (vk_internal.h), and a float
// carried through memory between dispatches is the same float a register
// would hold.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = KVM_WG) in;
layout(std430, binding = 0) readonly buffer I { float x[]; }; // in [n_layers][heads][n] at in_off
layout(std430, binding = 1) buffer O { float o[]; };          // out [n_sets][n] at out_off
layout(push_constant) uniform P {
    uint n, n_items;     // blocks; n_sets * n
    uint per, heads;     // layers per set; heads per layer
    uint in_off, out_off;
    uint u0, u1;         // the set-local layers this dispatch adds
    uint i0;             // the first item of this dispatch
} p;

void main() {
    uint item = p.i0 + gl_GlobalInvocationID.x;
    if (item < p.n_items) { // no early return: lavapipe may drop a workgroup's later lanes after one
        uint s = item / p.n, j = item - s * p.n;
        precise float acc = p.u0 == 0u ? 0.0 : o[p.out_off + item];
        for (uint u = p.u0; u < p.u1; u++) {
            uint base = p.in_off + (s * p.per + u) * p.heads * p.n + j;
            precise float layer = 0.0;
            for (uint h = 0u; h < p.heads; h++) layer += x[base + h * p.n];
            acc += layer;
        }
        o[p.out_off + item] = acc;
    }
}
