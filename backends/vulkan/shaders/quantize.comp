#version 450
// quantize: n f32 rows of `dim` -> one storage section (core/backend/quant_layout.h)
// of Q8, Q4 or Q4 KIVI keys, bit for bit the CPU's scalar reference.
// Two passes in one submission (a barrier between them):
//   pass 0, one invocation per word of f16 parameters: group (or KIVI
//     channel) min/max, scale (and bias) into tmp; a value that is not finite
//     within +-65504 sets tmp[0].
//   pass 1, one invocation per code word (no two invocations share a word),
//     then the parameter words copied from tmp to the section; nothing is
//     written when tmp[0] is set, so bad input leaves the section unchanged.
// Exactness on any device (float division has 2.5 ulp in Vulkan, and devices
// may flush denormals): min/max compare integer keys of the bits (first
// value wins on ties, like the scalar loop); the scale is the smallest f16 h
// with k*h >= range (k = 127 or 15; k*h is exact in f32, and that test picks
// the same h as rounding fl(range/k) up to f16, see quant_scale); 1/scale is
// the correctly rounded reciprocal by integer long division. Products and
// differences are correctly rounded in Vulkan, and roundEven is lrintf's RNE.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = KVM_WG) in;
layout(std430, binding = 0) readonly buffer Src { float x[]; };
layout(std430, binding = 1) buffer Dst { uint dst[]; };
layout(std430, binding = 2) buffer Tmp { uint tmp[]; }; // [0] flag, scales words, biases words
layout(push_constant) uniform P {
    uint mode;        // 0 Q8, 1 Q4 (groups along rows), 2 Q4 KIVI keys (per channel)
    uint pass;        // 0 parameters, 1 codes
    uint n, dim, G;   // rows, row length, groups per row (KIVI: unused)
    uint n_params;    // f16 scales (= biases) in the section
    uint src_off;     // floats
    uint sec_off;     // words: the section's start in dst
    uint codes_w, n_code_words; // section-relative word offset and count of the codes
    uint params_w, pw;          // word offset of the scales; words per parameter part
    uint group;       // 32 (Q8) or 64 (Q4)
} p;

// Order key of finite f32 bits: value order, +0 == -0 (as float compares).
int fkey(uint b) {
    int m = int(b & 0x7fffffffu);
    return (b & 0x80000000u) != 0u ? -m : m;
}

float f16v(uint h) { return uintBitsToFloat(kvm_f16_to_f32(h)); }

// Largest f16 <= x (x finite, |x| <= 65504): RNE, then one step down if above
// (kvm_f16_round_down; stepping down from +-0 gives -2^-24).
uint f16_down(uint xb) {
    uint h = kvm_f32_to_f16(xb);
    if (fkey(kvm_f16_to_f32(h)) <= fkey(xb)) return h;
    if ((h & 0x7fffu) == 0u) return 0x8001u;
    return (h & 0x8000u) != 0u ? h + 1u : h - 1u;
}

// f16_round_up(fl(r / k)) for r >= 0 (bits rb, never -0). fl(r/k) <= h iff
// r <= k*h: k*h is exact, and when r > k*h the gap is at least one ulp of
// k*h >= (k+1)/2 ulp(h) (k = 127: 64, k = 15: 8), so fl(r/k) > h + ulp(h)/2.
// Below r = tiny (63 for 127, 7 for 15, in units of 2^-149) fl(r/k) is 0.
uint quant_scale(uint rb, float k, uint tiny) {
    if (rb <= tiny) return 0u;
    float r = uintBitsToFloat(rb);
    uint h = max(kvm_f32_to_f16(floatBitsToUint(r / k)), 1u); // estimate
    // (a denormal r flushed to 0 compares <= k*h for any h >= 1: h = 1, right)
    while (h > 1u && f16v(h - 1u) * k >= r) h--;
    while (f16v(h) * k < r) h++;
    return h;
}

// Correctly rounded 1/s for the f16 s (bits h > 0, finite): s = m 2^E with
// integer m, 1/s = 2^-E / m; the 24-bit significand floor(2^(p+24) / m) by a
// two-step long division in 32 bits, rounded to nearest even.
float recip_f16(uint h) {
    uint e = (h >> 10) & 31u, m = h & 0x3ffu;
    int E = -24;
    if (e != 0u) {
        m |= 0x400u;
        E = int(e) - 25;
    }
    int pm = findMSB(m); // 2^pm <= m < 2^(pm+1), pm <= 10
    uint sh = uint(pm) + 4u; // 2^(pm+24) = 2^20 * 2^sh
    uint q1 = (1u << 20) / m, r1 = (1u << 20) % m;
    uint t = r1 << sh;
    uint q = (q1 << sh) + t / m, rem = t % m;
    if (2u * rem > m || (2u * rem == m && (q & 1u) != 0u)) q++;
    int ex = -(pm + 24) - E; // 1/s = q 2^ex, q in (2^23, 2^24]
    if (q == (1u << 24)) {
        q >>= 1;
        ex += 1;
    }
    return uintBitsToFloat((uint(ex + 23 + 127) << 23) | (q & 0x7fffffu));
}

bool bad(uint b) { return (b & 0x7fffffffu) > 0x477fe000u; } // not finite within +-65504

uint half16(uint base, uint i) {
    uint w = tmp[base + (i >> 1)];
    return (i & 1u) != 0u ? w >> 16 : w & 0xffffu;
}

// Parameters of parameter index i: (scale, bias) f16 bits in .x, .y.
uvec2 params(uint i, inout bool err) {
    if (p.mode == 0u) {
        uint r = i / p.G, g = i - r * p.G, i0 = g * p.group;
        uint k = min(p.group, p.dim - i0), base = p.src_off + r * p.dim + i0;
        uint a = 0u;
        for (uint j = 0u; j < k; j++) {
            uint b = floatBitsToUint(x[base + j]);
            err = err || bad(b);
            a = max(a, b & 0x7fffffffu);
        }
        return uvec2(quant_scale(a, 127.0, 63u), 0u);
    }
    uint base, step, cnt;
    if (p.mode == 1u) {
        uint r = i / p.G, g = i - r * p.G, i0 = g * p.group;
        base = p.src_off + r * p.dim + i0;
        step = 1u;
        cnt = min(p.group, p.dim - i0);
    } else { // KIVI keys: channel i over the n rows
        base = p.src_off + i;
        step = p.dim;
        cnt = p.n;
    }
    uint mn = floatBitsToUint(x[base]), mx = mn;
    err = err || bad(mn);
    for (uint j = 1u; j < cnt; j++) {
        uint b = floatBitsToUint(x[base + j * step]);
        err = err || bad(b);
        if (fkey(b) < fkey(mn)) mn = b;
        if (fkey(b) > fkey(mx)) mx = b;
    }
    uint bh = f16_down(mn);
    uint bb = kvm_f16_to_f32(bh);
    uint db;
    if ((bb & 0x7fffffffu) == 0u) {
        // mx - (+-0) without the device's arithmetic (a denormal mx survives);
        // mx is then +-0 only when every value is zero: +0
        db = (mx & 0x7fffffffu) == 0u ? 0u : mx;
    } else {
        // |b| >= 2^-24, so mx - b is exact-or-rounded like the CPU's and never denormal
        precise float d = uintBitsToFloat(mx) - uintBitsToFloat(bb);
        db = floatBitsToUint(d);
    }
    return uvec2(quant_scale(db, 15.0, 7u), bh);
}

void pass0() {
    uint stride = gl_NumWorkGroups.x * KVM_WG;
    for (uint w = gl_GlobalInvocationID.x; w < p.pw; w += stride) {
        bool err = false;
        uvec2 a = params(2u * w, err), b = uvec2(0u);
        if (2u * w + 1u < p.n_params) b = params(2u * w + 1u, err);
        tmp[1u + w] = a.x | (b.x << 16);
        if (p.mode != 0u) tmp[1u + p.pw + w] = a.y | (b.y << 16);
        if (err) atomicOr(tmp[0], 1u);
    }
}

uint q8_word(uint cw) {
    uint word = 0u, total = p.n * p.dim;
    for (uint j = 0u; j < 4u; j++) {
        uint e = 4u * cw + j;
        if (e >= total) break;
        uint r = e / p.dim, i = e - r * p.dim;
        uint sh = half16(1u, r * p.G + i / p.group);
        float inv = sh != 0u ? recip_f16(sh) : 0.0;
        precise float t = x[p.src_off + e] * inv;
        int c = int(clamp(roundEven(t), -127.0, 127.0));
        word |= (uint(c) & 0xffu) << (8u * j);
    }
    return word;
}

uint q4_word(uint cw) {
    uint W = (p.dim + 7u) / 8u;
    uint r = cw / W, w = cw - r * W, word = 0u;
    for (uint j = 0u; j < 8u; j++) {
        uint i = 8u * w + j;
        if (i >= p.dim) break;
        uint pi = p.mode == 1u ? r * p.G + i / p.group : i;
        uint sh = half16(1u, pi), bh = half16(1u + p.pw, pi);
        float inv = (sh & 0x7fffu) != 0u ? recip_f16(sh) : 0.0;
        float b = f16v(bh);
        precise float t = (x[p.src_off + r * p.dim + i] - b) * inv;
        uint c = uint(clamp(roundEven(t), 0.0, 15.0));
        word |= c << (4u * j);
    }
    return word;
}

void pass1() {
    if (tmp[0] != 0u) return;
    uint n_param_words = p.mode == 0u ? p.pw : 2u * p.pw;
    uint total = p.n_code_words + n_param_words;
    uint stride = gl_NumWorkGroups.x * KVM_WG;
    for (uint i = gl_GlobalInvocationID.x; i < total; i += stride) {
        if (i < p.n_code_words)
            dst[p.sec_off + p.codes_w + i] = p.mode == 0u ? q8_word(i) : q4_word(i);
        else
            dst[p.sec_off + p.params_w + (i - p.n_code_words)] = tmp[1u + (i - p.n_code_words)];
    }
}

void main() {
    if (p.pass == 0u) pass0();
    else pass1();
}
