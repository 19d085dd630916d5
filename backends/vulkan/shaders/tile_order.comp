#version 450
// tile_order: dev_attend's scored form (core/backend/backend.h): each
// stream's SCORED order of the tiles, found on the device before attend.comp
// visits them. A tile's score for KV head g is its largest logit
// scale * q_h . k over its live positions and the stream's G query heads
// (NaN logits ignored, no live position: -inf); the order is highest first,
// equal scores newest (highest tile id) first -- core/attend/attend_order.c's
// scan and sort, which the CPU reference runs.
// Four phases, chosen by a push constant, each a series of dispatches that
// stays within the loop budget per invocation (vk_attend.c sizes them):
//   0 scan: one workgroup per (span of a tile, KV head): the span's largest
//     logit, reduced in shared memory, into part[(g * n_tiles + t) * n_sub + s];
//   1 combine: one invocation per (g, t): score = max over the spans; rank = 0;
//   2 rank: rank(g, t) += the tiles u in [u0, u1) ahead of t (a higher score,
//     or the same score and a higher id): the rank is t's place in the order;
//   3 scatter: order[g * n_tiles + rank(g, t)] = t.
// The comparisons are exact on both sides (no ties broken by rounding), so
// the orders equal the CPU's wherever the scores do.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = KVM_WG) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { uint kw[]; };
layout(std430, binding = 2) readonly buffer S { int slot_map[]; };
// part [n_kv * n_tiles * n_sub] (float bits), score [n_kv * n_tiles], rank [n_kv * n_tiles]
layout(std430, binding = 3) buffer W { uint w[]; };
layout(std430, binding = 4) writeonly buffer Ord { int order_[]; };
layout(push_constant) uniform P {
    uint n_slots, n_pos, n_kv, G, D, tile, n_tiles;
    uint f16; // K is f16 (halves of 32-bit words), else f32
    float scale;
    uint q_off, k_off, s_off, ord_off; // element offsets
    uint phase;
    uint n_sub, span; // spans per tile, positions per span
    uint x0;          // first workgroup (phase 0) or item (phases 1-3) of this dispatch
    uint u0, u1;      // phase 2: the tiles compared in this dispatch
    uint score_off, rank_off; // word offsets in w (part at 0)
} p;

shared float red[KVM_WG];

float load_k(uint e) {
    uint x = kw[p.f16 != 0u ? e >> 1 : e];
    if (p.f16 == 0u) return uintBitsToFloat(x);
    return uintBitsToFloat(kvm_f16_to_f32((x >> ((e & 1u) * 16u)) & 0xffffu));
}

void main() {
    const float NEG_INF = uintBitsToFloat(0xff800000u);
    const uint tid = gl_LocalInvocationID.x;
    if (p.phase == 0u) {
        const uint wx = p.x0 + gl_WorkGroupID.x, g = gl_WorkGroupID.y;
        const uint t = wx / p.n_sub, s = wx - t * p.n_sub;
        if (t >= p.n_tiles) return; // uniform
        const uint t1 = min(t * p.tile + p.tile, p.n_pos);
        const uint a = min(t * p.tile + s * p.span, t1), b = min(a + p.span, t1);
        const uint G = p.G, D = p.D;
        float best = NEG_INF;
        for (uint i = tid; i < (b - a) * G; i += KVM_WG) {
            const uint c = i / G, h = i - c * G;
            const int x = slot_map[p.s_off + a + c];
            if (x < 0 || uint(x) >= p.n_slots) continue; // dead: never read
            const uint kb = p.k_off + (uint(x) * p.n_kv + g) * D, qb = p.q_off + (g * G + h) * D;
            float d = 0.0;
            for (uint e = 0u; e < D; e++) d += q[qb + e] * load_k(kb + e);
            const float sc = p.scale * d;
            if (sc > best) best = sc; // NaN ignored
        }
        red[tid] = best;
        barrier();
        for (uint st = KVM_WG / 2u; st > 0u; st >>= 1) {
            if (tid < st && red[tid + st] > red[tid]) red[tid] = red[tid + st];
            barrier();
        }
        if (tid == 0u) w[(g * p.n_tiles + t) * p.n_sub + s] = floatBitsToUint(red[0]);
        return;
    }
    const uint i = p.x0 + gl_GlobalInvocationID.x;
    if (i >= p.n_kv * p.n_tiles) return;
    const uint g = i / p.n_tiles, t = i - g * p.n_tiles;
    if (p.phase == 1u) {
        float m = NEG_INF;
        for (uint s = 0u; s < p.n_sub; s++) {
            const float x = uintBitsToFloat(w[i * p.n_sub + s]);
            if (x > m) m = x;
        }
        w[p.score_off + i] = floatBitsToUint(m);
        w[p.rank_off + i] = 0u;
    } else if (p.phase == 2u) {
        const float st = uintBitsToFloat(w[p.score_off + i]);
        const uint base = p.score_off + g * p.n_tiles, u1 = min(p.u1, p.n_tiles);
        uint r = w[p.rank_off + i];
        for (uint u = p.u0; u < u1; u++) {
            const float su = uintBitsToFloat(w[base + u]);
            if (su > st || (su == st && u > t)) r++;
        }
        w[p.rank_off + i] = r;
    } else {
        const uint r = w[p.rank_off + i];
        if (r < p.n_tiles) order_[p.ord_off + g * p.n_tiles + r] = int(t);
    }
}
