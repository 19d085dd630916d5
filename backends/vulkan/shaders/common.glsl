// Shared by kvmem's compute shaders. Buffers are bound whole as arrays of
// 32-bit words (no 16-bit storage feature needed) and ops address them with
// element offsets from push constants; 16-bit elements are halves of words.
// The f16 conversion is integer bit operations so results match the CPU
// backend's reference (core/cpu/half.h) bit for bit, whatever the device's
// float rounding or denormal modes are.

#define KVM_WG 128 // workgroup size: Vulkan guarantees 128 invocations

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
