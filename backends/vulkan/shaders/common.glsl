// Shared by kvmem's compute shaders. Buffers are bound whole as arrays of
// 32-bit words (no 16-bit storage feature needed) and ops address them with
// element offsets from push constants; 16-bit elements are halves of words.
// Conversions are integer bit operations so results match the CPU backend's
// reference (core/cpu/half.h) bit for bit, whatever the device's float
// rounding or denormal modes are.

#define KVM_F32 0u
#define KVM_F16 1u
#define KVM_BF16 2u
#define KVM_WG 128 // workgroup size: Vulkan guarantees 128 invocations

// f32 bits -> f16 bits, round to nearest even; NaN keeps sign and top payload, quiet.
uint kvm_f32_to_f16(uint x) {
    uint sign = (x >> 16) & 0x8000u;
    uint ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u) return sign | 0x7c00u;
        return sign | 0x7e00u | ((ax >> 13) & 0x3ffu);
    }
    if (ax >= 0x477ff000u) return sign | 0x7c00u; // >= 65520 rounds to Inf
    if (ax < 0x38800000u) {
        // f16 subnormal: value / 2^-24 = m * 2^(e - 126), rounded to nearest even
        uint e = ax >> 23;
        if (e < 102u) return sign; // below 2^-25: rounds to zero
        uint m = (ax & 0x7fffffu) | 0x800000u;
        uint sh = 126u - e; // in [14, 24]
        uint q = m >> sh;
        uint rem = m & ((1u << sh) - 1u);
        uint half_ = 1u << (sh - 1u);
        if (rem > half_ || (rem == half_ && (q & 1u) != 0u)) q += 1u;
        return sign | q;
    }
    uint odd = (ax >> 13) & 1u;
    ax += (uint(15 - 127) << 23) + 0xfffu + odd;
    return sign | ((ax >> 13) & 0xffffu);
}

// f16 bits -> f32 bits (exact, subnormals included).
uint kvm_f16_to_f32(uint h) {
    uint sign = (h & 0x8000u) << 16;
    uint e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0u) {
        if (m == 0u) return sign;
        // normalise: m * 2^-24 with m < 2^10
        int shift = 10 - findMSB(m); // leading bit to position 10
        m = (m << uint(shift)) & 0x3ffu;
        return sign | (uint(113 - shift) << 23) | (m << 13);
    }
    if (e == 31u) return sign | 0x7f800000u | (m != 0u ? 0x400000u : 0u) | (m << 13);
    return sign | ((e + 112u) << 23) | (m << 13);
}

uint kvm_f32_to_bf16(uint x) {
    if ((x & 0x7fffffffu) > 0x7f800000u) return ((x >> 16) | 0x40u) & 0xffffu;
    x += 0x7fffu + ((x >> 16) & 1u);
    return x >> 16;
}

uint kvm_bf16_to_f32(uint b) { return b << 16; }
