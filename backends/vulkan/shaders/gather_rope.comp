#version 450
// gather with RoPE (DESIGN.md, Decoupled position re-encoding): output row i
// is source row idx[i] (raw keys: [n_heads][head_dim]), rotated to the new
// position of output row i. The cos/sin of each output row's position come
// in a table computed on the host in double precision (shared by every layer
// and head of the gather): Vulkan leaves sin/cos accuracy unspecified outside
// [-pi, pi], and positions reach 10^5 radians. rotary_dim 0 = plain gather
// (values). One invocation per output element, so no two write one word.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = KVM_WG) in;
layout(std430, binding = 0) readonly buffer Src { uint src[]; }; // f32, or f16 halves of words
layout(std430, binding = 1) readonly buffer Idx { uint idx[]; };
layout(std430, binding = 2) readonly buffer CS { float cs[]; }; // [n_out][n_pairs] cos, then [n_out][n_pairs] sin
layout(std430, binding = 3) writeonly buffer Dst { float dst[]; };
layout(push_constant) uniform P {
    uint n_out, n_heads, head_dim, rotary_dim;
    uint gptj;        // 0: NEOX pairs (j, j + rotary_dim/2); 1: GPT-J pairs (2j, 2j + 1)
    float attn_factor; // multiplies rotated dims (YaRN); 1 otherwise
    uint src_off, src_rs, dst_off, n_src;
    uint idx_off, cs_off; // in elements
    uint src_f16;         // src holds f16 (src_off, src_rs in halves), decoded exactly
} p;

float load_src(uint e) {
    if (p.src_f16 == 0u) return uintBitsToFloat(src[e]);
    return uintBitsToFloat(kvm_f16_to_f32((src[e >> 1] >> ((e & 1u) * 16u)) & 0xffffu));
}

void main() {
    uint row = p.n_heads * p.head_dim;
    uint total = p.n_out * row;
    uint stride = gl_NumWorkGroups.x * KVM_WG;
    uint np = p.rotary_dim / 2u;
    for (uint e = gl_GlobalInvocationID.x; e < total; e += stride) {
        uint i = e / row, hd = e - i * row;
        uint h = hd / p.head_dim, d = hd - h * p.head_dim;
        uint s = idx[p.idx_off + i];
        if (s >= p.n_src) { dst[p.dst_off + e] = 0.0; continue; } // a bad index gives a zero row, never a stray read
        uint base = p.src_off + s * p.src_rs + h * p.head_dim;
        float x = load_src(base + d);
        if (d >= p.rotary_dim) { dst[p.dst_off + e] = x; continue; }
        uint j, partner;
        bool first;
        if (p.gptj != 0u) { j = d >> 1; first = (d & 1u) == 0u; partner = first ? d + 1u : d - 1u; }
        else { first = d < np; j = first ? d : d - np; partner = first ? d + np : d - np; }
        float c = cs[p.cs_off + i * np + j], sn = cs[p.cs_off + p.n_out * np + i * np + j];
        float y = load_src(base + partner);
        // (x0, x1) -> (x0 c - x1 s, x0 s + x1 c), as the CPU rotation
        float r = first ? x * c - y * sn : y * sn + x * c;
        dst[p.dst_off + e] = p.attn_factor != 1.0 ? r * p.attn_factor : r;
    }
}
