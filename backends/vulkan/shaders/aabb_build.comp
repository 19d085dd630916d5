#version 450
// aabb_build: per group g and dimension d, the min and max over n_rows f32
// rows (rows `dim` apart, groups `group_stride` apart). One invocation per
// (g, d): adjacent invocations read adjacent dims, so loads coalesce.
// Comparison order mirrors the CPU reference (the accumulator wins on NaN).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = KVM_WG) in;
layout(std430, binding = 0) readonly buffer Keys { float keys[]; };
layout(std430, binding = 1) writeonly buffer Mn { float out_min[]; };
layout(std430, binding = 2) writeonly buffer Mx { float out_max[]; };
layout(push_constant) uniform P {
    uint n_groups, group_stride, n_rows, dim;
    uint keys_off, out_off; // in floats
} p;

void main() {
    uint total = p.n_groups * p.dim;
    uint stride = gl_NumWorkGroups.x * KVM_WG;
    for (uint i = gl_GlobalInvocationID.x; i < total; i += stride) {
        uint g = i / p.dim, d = i - g * p.dim;
        uint base = p.keys_off + g * p.group_stride + d;
        float mn = keys[base], mx = mn;
        for (uint r = 1u; r < p.n_rows; r++) {
            float v = keys[base + r * p.dim];
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        out_min[p.out_off + i] = mn;
        out_max[p.out_off + i] = mx;
    }
}
