#version 450
// aabb_score in its GEMM form (DESIGN.md, Retrieval):
//   I(q, b) = sum_d max(q_d smax_d, q_d smin_d) = [q+ || q-] . [smax || smin]
// one tiled matrix product of (query rows) x (2 head_dim) x (blocks) per
// batch slice (layer, query head). q+ and q- are formed once per tile load,
// so the inner loop is two FMAs per k like any SGEMM. GQA: slice b reads the
// AABBs of slice b / s_div (s_div = query heads per KV head).
// Tile: 16 query rows x 16 blocks per workgroup of 16 x 8 invocations, each
// computing rows ty and ty + 8 of column tx; k in chunks of 16.
// The boxes are f32, or f16 (the device mirror's: halves of 32-bit words,
// s_* offsets and strides in halves) decoded exactly.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 16, local_size_y = 8) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer Smin { uint smin[]; };
layout(std430, binding = 2) readonly buffer Smax { uint smax[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint n_q, n_blocks, dim, batch, s_div;
    uint q_off, q_bs, q_rs;   // q row r of slice b at q_off + b*q_bs + r*q_rs
    uint s_off, s_bs, s_rs;   // block k of slice b at s_off + (b/s_div)*s_bs + k*s_rs
    uint o_off, o_bs, o_rs;   // I(r, k) of slice b at o_off + b*o_bs + r*o_rs + k
    uint f16;                 // the boxes are f16
} p;

float box(bool is_max, uint e) {
    uint w = is_max ? smax[p.f16 != 0u ? e >> 1 : e] : smin[p.f16 != 0u ? e >> 1 : e];
    if (p.f16 == 0u) return uintBitsToFloat(w);
    return uintBitsToFloat(kvm_f16_to_f32((w >> ((e & 1u) * 16u)) & 0xffffu));
}

shared float qp[16][17], qn[16][17]; // [row][k], padded against bank conflicts
shared float sx[16][17], sn[16][17]; // [block][k]

void main() {
    uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    uint b = gl_WorkGroupID.z;
    uint row0 = gl_WorkGroupID.y * 16u, blk0 = gl_WorkGroupID.x * 16u;
    uint qbase = p.q_off + b * p.q_bs, sbase = p.s_off + (b / p.s_div) * p.s_bs;
    float acc0 = 0.0, acc1 = 0.0;
    for (uint k0 = 0u; k0 < p.dim; k0 += 16u) {
        // 128 invocations load 16 x 16 of each tile: two elements each
        for (uint e = ty * 16u + tx; e < 256u; e += 128u) {
            uint rr = e / 16u, kk = e % 16u;
            uint r = row0 + rr, blk = blk0 + rr, k = k0 + kk;
            float v = (r < p.n_q && k < p.dim) ? q[qbase + r * p.q_rs + k] : 0.0;
            qp[rr][kk] = max(v, 0.0);
            qn[rr][kk] = min(v, 0.0);
            bool ok = blk < p.n_blocks && k < p.dim;
            sx[rr][kk] = ok ? box(true, sbase + blk * p.s_rs + k) : 0.0;
            sn[rr][kk] = ok ? box(false, sbase + blk * p.s_rs + k) : 0.0;
        }
        barrier();
        for (uint kk = 0u; kk < 16u; kk++) {
            float a = sx[tx][kk], c = sn[tx][kk];
            acc0 += qp[ty][kk] * a + qn[ty][kk] * c;
            acc1 += qp[ty + 8u][kk] * a + qn[ty + 8u][kk] * c;
        }
        barrier();
    }
    uint blk = blk0 + tx;
    if (blk >= p.n_blocks) return;
    uint r0 = row0 + ty, r1 = r0 + 8u, obase = p.o_off + b * p.o_bs;
    if (r0 < p.n_q) o[obase + r0 * p.o_rs + blk] = acc0;
    if (r1 < p.n_q) o[obase + r1 * p.o_rs + blk] = acc1;
}
