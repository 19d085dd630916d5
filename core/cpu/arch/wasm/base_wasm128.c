/* WebAssembly SIMD128 kernels (the browser build). Compiled only by the
 * Emscripten build (wasm/CMakeLists.txt, -msimd128); dispatch.c picks this
 * table under __wasm_simd128__. WASM SIMD has no f16 instructions, so the
 * conversions are the scalar bit recipes of half.h done four lanes at a time,
 * and equal the scalar reference bit for bit, as do minmax and the NaN
 * count; dot sums in four lanes (order differs, like the x86 paths). */
#include "../../half.h"
#include "../../kernels.h"

#include <wasm_simd128.h>

/* f16 -> f32 of four halves held in the low 16 bits of each u32 lane.
 * Exponent and mantissa shifted into f32 position and multiplied by 2^112
 * rebias exactly, subnormal halves included (wasm keeps f32 denormals);
 * Inf and NaN (exponent 31) are built by hand, NaN with its quiet bit. */
static v128_t h4_to_f4(v128_t h) {
    const v128_t sign = wasm_i32x4_shl(wasm_v128_and(h, wasm_i32x4_splat(0x8000)), 16);
    const v128_t em = wasm_i32x4_shl(wasm_v128_and(h, wasm_i32x4_splat(0x7fff)), 13);
    v128_t r = wasm_f32x4_mul(em, wasm_f32x4_splat(5.192296858534828e+33f)); /* 2^112 */
    const v128_t m = wasm_v128_and(em, wasm_i32x4_splat(0x007fe000));
    v128_t quiet = wasm_v128_andnot(wasm_i32x4_splat(0x400000), wasm_i32x4_eq(m, wasm_i32x4_splat(0)));
    v128_t special = wasm_v128_or(wasm_v128_or(wasm_i32x4_splat(0x7f800000), quiet), m);
    r = wasm_v128_bitselect(special, r, wasm_u32x4_ge(em, wasm_i32x4_splat(0x0f800000)));
    return wasm_v128_or(r, sign);
}

/* f32 -> f16 of four floats, the result in the low 16 bits of each lane. */
static v128_t f4_to_h4(v128_t x) {
    const v128_t sign = wasm_v128_and(wasm_u32x4_shr(x, 16), wasm_i32x4_splat(0x8000));
    const v128_t ax = wasm_v128_and(x, wasm_i32x4_splat(0x7fffffff));
    /* Inf and NaN */
    v128_t nan = wasm_v128_or(wasm_i32x4_splat(0x7e00),
                              wasm_v128_and(wasm_u32x4_shr(ax, 13), wasm_i32x4_splat(0x3ff)));
    v128_t special = wasm_v128_bitselect(wasm_i32x4_splat(0x7c00), nan,
                                         wasm_i32x4_eq(ax, wasm_i32x4_splat(0x7f800000)));
    /* below the smallest normal: let the FPU round at the f16 subnormal unit */
    v128_t sub = wasm_i32x4_sub(wasm_f32x4_add(ax, wasm_f32x4_splat(0.5f)), wasm_i32x4_splat(0x3f000000));
    /* normal: round to nearest even at bit 13 */
    v128_t odd = wasm_v128_and(wasm_u32x4_shr(ax, 13), wasm_i32x4_splat(1));
    v128_t normal = wasm_u32x4_shr(
        wasm_i32x4_add(wasm_i32x4_add(ax, wasm_i32x4_splat((int32_t)((uint32_t)(15 - 127) << 23) + 0xfff)), odd), 13);
    v128_t r = wasm_v128_bitselect(sub, normal, wasm_u32x4_lt(ax, wasm_i32x4_splat(0x38800000)));
    r = wasm_v128_bitselect(wasm_i32x4_splat(0x7c00), r, wasm_u32x4_ge(ax, wasm_i32x4_splat(0x477ff000)));
    r = wasm_v128_bitselect(special, r, wasm_u32x4_ge(ax, wasm_i32x4_splat(0x7f800000)));
    return wasm_v128_and(wasm_v128_or(r, sign), wasm_i32x4_splat(0xffff));
}

static void w_f16_to_f32(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v128_t h = wasm_v128_load(src + i);
        wasm_v128_store(dst + i, h4_to_f4(wasm_u32x4_extend_low_u16x8(h)));
        wasm_v128_store(dst + i + 4, h4_to_f4(wasm_u32x4_extend_high_u16x8(h)));
    }
    for (; i < n; i++) dst[i] = kvm_f16_to_f32(src[i]);
}

static void w_f32_to_f16(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v128_t lo = f4_to_h4(wasm_v128_load(src + i)), hi = f4_to_h4(wasm_v128_load(src + i + 4));
        /* lanes hold values < 65536, so the saturating narrow is exact */
        wasm_v128_store(dst + i, wasm_u16x8_narrow_i32x4(lo, hi));
    }
    for (; i < n; i++) dst[i] = kvm_f32_to_f16(src[i]);
}

static void w_bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v128_t h = wasm_v128_load(src + i);
        wasm_v128_store(dst + i, wasm_i32x4_shl(wasm_u32x4_extend_low_u16x8(h), 16));
        wasm_v128_store(dst + i + 4, wasm_i32x4_shl(wasm_u32x4_extend_high_u16x8(h), 16));
    }
    for (; i < n; i++) dst[i] = kvm_bf16_to_f32(src[i]);
}

static v128_t f4_to_bf4(v128_t x) {
    v128_t hi = wasm_u32x4_shr(x, 16);
    v128_t r = wasm_u32x4_shr(
        wasm_i32x4_add(x, wasm_i32x4_add(wasm_i32x4_splat(0x7fff), wasm_v128_and(hi, wasm_i32x4_splat(1)))), 16);
    v128_t nan = wasm_u32x4_gt(wasm_v128_and(x, wasm_i32x4_splat(0x7fffffff)), wasm_i32x4_splat(0x7f800000));
    return wasm_v128_bitselect(wasm_v128_or(hi, wasm_i32x4_splat(0x40)), r, nan);
}

static void w_f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        wasm_v128_store(dst + i, wasm_u16x8_narrow_i32x4(f4_to_bf4(wasm_v128_load(src + i)),
                                                         f4_to_bf4(wasm_v128_load(src + i + 4))));
    for (; i < n; i++) dst[i] = kvm_f32_to_bf16(src[i]);
}

static void w_minmax_rows(const float *x, size_t n_rows, size_t stride, size_t dim, float *mn, float *mx) {
    size_t d = 0;
    for (; d + 4 <= dim; d += 4) {
        v128_t lo = wasm_v128_load(x + d), hi = lo;
        for (size_t r = 1; r < n_rows; r++) {
            v128_t v = wasm_v128_load(x + r * stride + d);
            /* pmin(a, b) = b < a ? b : a: the scalar's operand order, so the
             * accumulator wins on NaN (wasm's plain min would propagate it) */
            lo = wasm_f32x4_pmin(lo, v);
            hi = wasm_f32x4_pmax(hi, v);
        }
        wasm_v128_store(mn + d, lo);
        wasm_v128_store(mx + d, hi);
    }
    for (; d < dim; d++) {
        float lo = x[d], hi = x[d];
        for (size_t r = 1; r < n_rows; r++) {
            float v = x[r * stride + d];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        mn[d] = lo;
        mx[d] = hi;
    }
}

static size_t w_count_nonfinite(const float *x, size_t n) {
    size_t i = 0, c = 0;
    const v128_t em = wasm_i32x4_splat(0x7f800000);
    for (; i + 4 <= n; i += 4) {
        v128_t v = wasm_v128_and(wasm_v128_load(x + i), em);
        c += (size_t)__builtin_popcount((unsigned)wasm_i32x4_bitmask(wasm_i32x4_eq(v, em)));
    }
    for (; i < n; i++) c += (kvm_f32_bits(x[i]) & 0x7f800000u) == 0x7f800000u;
    return c;
}

static float w_dot(const float *a, const float *b, size_t n) {
    v128_t s0 = wasm_f32x4_splat(0.0f), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = wasm_f32x4_add(s0, wasm_f32x4_mul(wasm_v128_load(a + i), wasm_v128_load(b + i)));
        s1 = wasm_f32x4_add(s1, wasm_f32x4_mul(wasm_v128_load(a + i + 4), wasm_v128_load(b + i + 4)));
        s2 = wasm_f32x4_add(s2, wasm_f32x4_mul(wasm_v128_load(a + i + 8), wasm_v128_load(b + i + 8)));
        s3 = wasm_f32x4_add(s3, wasm_f32x4_mul(wasm_v128_load(a + i + 12), wasm_v128_load(b + i + 12)));
    }
    for (; i + 4 <= n; i += 4) s0 = wasm_f32x4_add(s0, wasm_f32x4_mul(wasm_v128_load(a + i), wasm_v128_load(b + i)));
    v128_t s = wasm_f32x4_add(wasm_f32x4_add(s0, s1), wasm_f32x4_add(s2, s3));
    float r = (wasm_f32x4_extract_lane(s, 0) + wasm_f32x4_extract_lane(s, 1)) +
              (wasm_f32x4_extract_lane(s, 2) + wasm_f32x4_extract_lane(s, 3));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

/* Scoring has SIMD128 kernels; attention, the rule score and quantization
 * run the scalar ones here. */
const kvm_cpu_kernels kvm_cpu_wasm128 = {
    "wasm128", w_f16_to_f32, w_f32_to_f16, w_bf16_to_f32, w_f32_to_bf16, w_minmax_rows, w_count_nonfinite, w_dot,
    &kvm_score_wasm128, &kvm_attend_scalar, &kvm_qk_scalar, &kvm_quant_scalar, NULL, NULL,
};
