#version 450
// convert: n elements between F32/F16/BF16. One invocation per destination
// 32-bit word, so two 16-bit outputs sharing a word are written by the same
// invocation (no write race); halves outside [dst_off, dst_off + n) are kept.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = KVM_WG) in;
layout(std430, binding = 0) readonly buffer Src { uint src[]; };
layout(std430, binding = 1) buffer Dst { uint dst[]; };
layout(push_constant) uniform P {
    uint n;       // elements
    uint src_off; // in source elements
    uint dst_off; // in destination elements
    uint src_dt, dst_dt;
} p;

uint load_f32bits(uint e) { // source element e (absolute) as f32 bits
    if (p.src_dt == KVM_F32) return src[e];
    uint h = (src[e >> 1] >> ((e & 1u) * 16u)) & 0xffffu;
    return p.src_dt == KVM_F16 ? kvm_f16_to_f32(h) : kvm_bf16_to_f32(h);
}

uint load_16(uint e) { // source element e as destination 16-bit bits
    if (p.src_dt == p.dst_dt) return (src[e >> 1] >> ((e & 1u) * 16u)) & 0xffffu;
    uint f = load_f32bits(e);
    return p.dst_dt == KVM_F16 ? kvm_f32_to_f16(f) : kvm_f32_to_bf16(f);
}

void main() {
    uint stride = gl_NumWorkGroups.x * KVM_WG;
    if (p.dst_dt == KVM_F32) {
        for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride)
            dst[p.dst_off + i] = load_f32bits(p.src_off + i);
        return;
    }
    uint w0 = p.dst_off >> 1, w1 = (p.dst_off + p.n + 1u) >> 1;
    for (uint w = w0 + gl_GlobalInvocationID.x; w < w1; w += stride) {
        uint a = 2u * w, b = a + 1u; // absolute destination elements in this word
        bool in_a = a >= p.dst_off && a < p.dst_off + p.n;
        bool in_b = b >= p.dst_off && b < p.dst_off + p.n;
        uint old = (in_a && in_b) ? 0u : dst[w];
        uint lo = in_a ? load_16(p.src_off + (a - p.dst_off)) : (old & 0xffffu);
        uint hi = in_b ? load_16(p.src_off + (b - p.dst_off)) : (old >> 16);
        dst[w] = lo | (hi << 16);
    }
}
