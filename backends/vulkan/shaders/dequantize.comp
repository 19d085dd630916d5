#version 450
// dequantize: rows [row0, row0 + cnt) of a Q8 / Q4 / Q4 KIVI-keys section
// (core/backend/quant_layout.h) to f32, one invocation per output value. Exactly
// the CPU's values: q*s is exact in f32 (8 or 4 bits times an f16's 11), so
// q*s + b rounds once whether or not the device fuses it, and the f16
// conversions are integer (common.glsl), immune to denormal flushing.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = KVM_WG) in;
layout(std430, binding = 0) readonly buffer Src { uint sec[]; };
layout(std430, binding = 1) writeonly buffer Dst { float y[]; };
layout(push_constant) uniform P {
    uint mode;    // 0 Q8, 1 Q4, 2 Q4 KIVI keys
    uint n, dim, G, group;
    uint sec_off; // words
    uint codes_w, scales_w, biases_w; // section-relative word offsets
    uint row0, cnt;
    uint dst_off; // floats
} p;

uint half16(uint wbase, uint i) {
    uint w = sec[wbase + (i >> 1)];
    return (i & 1u) != 0u ? w >> 16 : w & 0xffffu;
}

float f16v(uint h) { return uintBitsToFloat(kvm_f16_to_f32(h)); }

void main() {
    uint total = p.cnt * p.dim;
    uint stride = gl_NumWorkGroups.x * KVM_WG;
    uint W = (p.dim + 7u) / 8u;
    for (uint e = gl_GlobalInvocationID.x; e < total; e += stride) {
        uint rr = e / p.dim, i = e - rr * p.dim, r = p.row0 + rr;
        float v;
        if (p.mode == 0u) {
            uint b = r * p.dim + i; // byte of the code within the codes part
            int c = bitfieldExtract(int(sec[p.sec_off + p.codes_w + (b >> 2)]), int(8u * (b & 3u)), 8);
            v = float(c) * f16v(half16(p.sec_off + p.scales_w, r * p.G + i / p.group));
        } else {
            uint c = (sec[p.sec_off + p.codes_w + r * W + i / 8u] >> (4u * (i & 7u))) & 15u;
            uint pi = p.mode == 1u ? r * p.G + i / p.group : i;
            precise float t = float(c) * f16v(half16(p.sec_off + p.scales_w, pi)) + f16v(half16(p.sec_off + p.biases_w, pi));
            v = t;
        }
        y[p.dst_off + e] = v;
    }
}
