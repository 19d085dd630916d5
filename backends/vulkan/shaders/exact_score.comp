#version 450
// exact_score: dev_score's EXACT relevance in its buffer form (core/backend/
// backend.h): I(t, h, j) = max over the rows of block j of q_t,h . k (the
// keys of layer l, KV head h / G), into the scratch that score_reduce.comp
// then normalises, at slice b = l * n_q_heads + h (aabb_score's layout).
// One invocation per (query head, token, block) of one layer; rows
// [r0, r1) of each block per dispatch (the host keeps each within the loop
// budget), folded into what the earlier dispatches wrote unless first.
// As the CPU reference: the first row's product, then each later one when
// larger.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = KVM_WG) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { uint kw[]; };
layout(std430, binding = 2) buffer O { float o[]; };
layout(push_constant) uniform P {
    uint n_tok, n_blocks, D, n_q_heads, G, n_kv;
    uint q_off, q_rs;   // q of token t, slice b at q_off + t * q_rs + b * D
    uint k_off;         // elements (of the key dtype) to block 0's first row
    uint block_rows, f16;
    uint layer;
    uint o_bs;          // I(t, j) of slice b at b * o_bs + t * n_blocks + j
    uint item0;         // first item of this dispatch
    uint r0, r1;        // the rows of each block this dispatch reads
} p;

float load_k(uint e) {
    uint x = kw[p.f16 != 0u ? e >> 1 : e];
    if (p.f16 == 0u) return uintBitsToFloat(x);
    return uintBitsToFloat(kvm_f16_to_f32((x >> ((e & 1u) * 16u)) & 0xffffu));
}

void main() {
    const uint i = p.item0 + gl_GlobalInvocationID.x;
    if (i >= p.n_q_heads * p.n_tok * p.n_blocks) return;
    const uint j = i % p.n_blocks, t = (i / p.n_blocks) % p.n_tok, h = i / (p.n_blocks * p.n_tok);
    const uint b = p.layer * p.n_q_heads + h, g = h / p.G, D = p.D;
    const uint qb = p.q_off + t * p.q_rs + b * D, oi = b * p.o_bs + t * p.n_blocks + j;
    float best = p.r0 == 0u ? 0.0 : o[oi];
    for (uint r = p.r0; r < p.r1; r++) {
        const uint kb = p.k_off + ((j * p.block_rows + r) * p.n_kv + g) * D;
        float d = 0.0;
        for (uint e = 0u; e < D; e++) d += q[qb + e] * load_k(kb + e);
        best = r == 0u ? d : (d > best ? d : best);
    }
    o[oi] = best;
}
