/* WebAssembly SIMD128 scoring kernels (the browser build): the products of
 * kernels.h over 4-lane vectors. Built only by wasm/CMakeLists.txt
 * (-msimd128); the "wasm128" kernel table's. Written out with named accumulators rather than through
 * score_simd.inc: clang does not unroll that file's loops over the
 * accumulator arrays for wasm, which leaves them in linear memory (a load
 * and a store per multiply-add, 5x slower). SIMD128 has no fused
 * multiply-add: a multiply and an add (two roundings), within the
 * tolerance the tests allow the x86 paths. */
#include "../../kernels.h"
#include "../../simd_math.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <wasm_simd128.h>

typedef v128_t V;
#define VLOAD(p) wasm_v128_load(p)
#define VSTORE(p, v) wasm_v128_store(p, v)
#define VSPLAT(x) wasm_f32x4_splat(x)
#define VMADD(a, b, c) wasm_f32x4_add(wasm_f32x4_mul(a, b), c)

static inline float hsum(V v) {
    return (wasm_f32x4_extract_lane(v, 0) + wasm_f32x4_extract_lane(v, 1)) +
           (wasm_f32x4_extract_lane(v, 2) + wasm_f32x4_extract_lane(v, 3));
}

/* Panel: out[j * ldo + r] = sum_k qt[k * rp + r] * b[j][k]; rp % 16 == 0.
 * Tile: 3 blocks x 16 rows (12 accumulators), broadcasts of block values. */
static void w_panel(const float *qt, size_t rp, const float *const *b, size_t n, size_t K, float *out, size_t ldo) {
    for (size_t r0 = 0; r0 < rp; r0 += 16) {
        size_t j = 0;
        for (; j + 3 <= n; j += 3) {
            const float *b0 = b[j], *b1 = b[j + 1], *b2 = b[j + 2];
            V a00 = VSPLAT(0), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
            V a20 = a00, a21 = a00, a22 = a00, a23 = a00;
            for (size_t k = 0; k < K; k++) {
                const float *q = qt + k * rp + r0;
                V q0 = VLOAD(q), q1 = VLOAD(q + 4), q2 = VLOAD(q + 8), q3 = VLOAD(q + 12);
                V x0 = VSPLAT(b0[k]), x1 = VSPLAT(b1[k]), x2 = VSPLAT(b2[k]);
                a00 = VMADD(x0, q0, a00), a01 = VMADD(x0, q1, a01), a02 = VMADD(x0, q2, a02), a03 = VMADD(x0, q3, a03);
                a10 = VMADD(x1, q0, a10), a11 = VMADD(x1, q1, a11), a12 = VMADD(x1, q2, a12), a13 = VMADD(x1, q3, a13);
                a20 = VMADD(x2, q0, a20), a21 = VMADD(x2, q1, a21), a22 = VMADD(x2, q2, a22), a23 = VMADD(x2, q3, a23);
            }
            float *o = out + j * ldo + r0;
            VSTORE(o, a00), VSTORE(o + 4, a01), VSTORE(o + 8, a02), VSTORE(o + 12, a03);
            o += ldo;
            VSTORE(o, a10), VSTORE(o + 4, a11), VSTORE(o + 8, a12), VSTORE(o + 12, a13);
            o += ldo;
            VSTORE(o, a20), VSTORE(o + 4, a21), VSTORE(o + 8, a22), VSTORE(o + 12, a23);
        }
        for (; j < n; j++) {
            const float *b0 = b[j];
            V a0 = VSPLAT(0), a1 = a0, a2 = a0, a3 = a0;
            for (size_t k = 0; k < K; k++) {
                const float *q = qt + k * rp + r0;
                V x0 = VSPLAT(b0[k]);
                a0 = VMADD(x0, VLOAD(q), a0), a1 = VMADD(x0, VLOAD(q + 4), a1);
                a2 = VMADD(x0, VLOAD(q + 8), a2), a3 = VMADD(x0, VLOAD(q + 12), a3);
            }
            float *o = out + j * ldo + r0;
            VSTORE(o, a0), VSTORE(o + 4, a1), VSTORE(o + 8, a2), VSTORE(o + 12, a3);
        }
    }
}

/* One output of the row product with a scalar K tail. */
static inline float row_dot(const float *q, const float *b, size_t K, size_t k, V acc) {
    float s = hsum(acc);
    for (; k < K; k++) s += q[k] * b[k];
    return s;
}

/* Rows: out[j * ldo + r] = sum_k q[r * K + k] * b[j][k]. Tile: 2 blocks x
 * 4 rows (8 accumulators), vectors along K. */
static void w_rows(const float *q, size_t R, const float *const *b, size_t n, size_t K, float *out, size_t ldo) {
    const size_t K4 = K & ~(size_t)3;
    size_t j = 0;
    for (; j + 2 <= n; j += 2) {
        const float *b0 = b[j], *b1 = b[j + 1];
        size_t r = 0;
        for (; r + 4 <= R; r += 4) {
            const float *q0 = q + r * K, *q1 = q0 + K, *q2 = q1 + K, *q3 = q2 + K;
            V a00 = VSPLAT(0), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
            for (size_t k = 0; k < K4; k += 4) {
                V x0 = VLOAD(b0 + k), x1 = VLOAD(b1 + k);
                V y0 = VLOAD(q0 + k), y1 = VLOAD(q1 + k), y2 = VLOAD(q2 + k), y3 = VLOAD(q3 + k);
                a00 = VMADD(x0, y0, a00), a01 = VMADD(x0, y1, a01), a02 = VMADD(x0, y2, a02), a03 = VMADD(x0, y3, a03);
                a10 = VMADD(x1, y0, a10), a11 = VMADD(x1, y1, a11), a12 = VMADD(x1, y2, a12), a13 = VMADD(x1, y3, a13);
            }
            float *o = out + j * ldo + r;
            o[0] = row_dot(q0, b0, K, K4, a00), o[1] = row_dot(q1, b0, K, K4, a01);
            o[2] = row_dot(q2, b0, K, K4, a02), o[3] = row_dot(q3, b0, K, K4, a03);
            o += ldo;
            o[0] = row_dot(q0, b1, K, K4, a10), o[1] = row_dot(q1, b1, K, K4, a11);
            o[2] = row_dot(q2, b1, K, K4, a12), o[3] = row_dot(q3, b1, K, K4, a13);
        }
        for (; r < R; r++) {
            const float *q0 = q + r * K;
            V a0 = VSPLAT(0), a1 = a0;
            for (size_t k = 0; k < K4; k += 4) {
                V y0 = VLOAD(q0 + k);
                a0 = VMADD(VLOAD(b0 + k), y0, a0), a1 = VMADD(VLOAD(b1 + k), y0, a1);
            }
            out[j * ldo + r] = row_dot(q0, b0, K, K4, a0);
            out[(j + 1) * ldo + r] = row_dot(q0, b1, K, K4, a1);
        }
    }
    /* the last block alone: one accumulator per output, as in the pairs, so
     * a block's scores do not depend on where it falls in the tiling */
    for (; j < n; j++) {
        const float *b0 = b[j];
        for (size_t r = 0; r < R; r++) {
            const float *q0 = q + r * K;
            V a0 = VSPLAT(0);
            for (size_t k = 0; k < K4; k += 4) a0 = VMADD(VLOAD(b0 + k), VLOAD(q0 + k), a0);
            out[j * ldo + r] = row_dot(q0, b0, K, K4, a0);
        }
    }
}

#define vexp_neg kvm_exp_neg128 /* simd_math.h */

static void w_exp_neg(float *x, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) VSTORE(x + i, vexp_neg(VLOAD(x + i)));
    if (i < n) {
        float t[4] = {0};
        memcpy(t, x + i, (n - i) * sizeof(float));
        VSTORE(t, vexp_neg(VLOAD(t)));
        memcpy(x + i, t, (n - i) * sizeof(float));
    }
}

/* AABB rows on f32 boxes: per (row, 4 dimensions) the sign mask of the
 * query selects s_min or s_max, one multiply-add per block. Two rows at a
 * time share the box's loads (a decode step has 4-8 rows per KV head). */
static void w_aabb_rows_f32(const float *q, size_t R, const float *const *b, size_t n, size_t D, float *out,
                            size_t ldo) {
    const size_t D4 = D & ~(size_t)3;
    const V zero = VSPLAT(0);
    for (size_t j = 0; j < n; j++) {
        const float *hi = b[j], *lo = b[j] + D;
        size_t r = 0;
        for (; r + 2 <= R && D4 == D; r += 2) {
            const float *q0 = q + r * D, *q1 = q0 + D;
            V a0 = zero, a1 = zero;
            for (size_t d = 0; d < D; d += 4) {
                const V h = VLOAD(hi + d), l = VLOAD(lo + d), y0 = VLOAD(q0 + d), y1 = VLOAD(q1 + d);
                a0 = VMADD(wasm_v128_bitselect(l, h, wasm_f32x4_lt(y0, zero)), y0, a0);
                a1 = VMADD(wasm_v128_bitselect(l, h, wasm_f32x4_lt(y1, zero)), y1, a1);
            }
            out[j * ldo + r] = hsum(a0);
            out[j * ldo + r + 1] = hsum(a1);
        }
        for (; r < R; r++) {
            const float *qr = q + r * D;
            V a0 = zero, a1 = zero;
            size_t d = 0;
            for (; d + 8 <= D4; d += 8) {
                V y0 = VLOAD(qr + d), y1 = VLOAD(qr + d + 4);
                a0 = VMADD(wasm_v128_bitselect(VLOAD(lo + d), VLOAD(hi + d), wasm_f32x4_lt(y0, zero)), y0, a0);
                a1 = VMADD(wasm_v128_bitselect(VLOAD(lo + d + 4), VLOAD(hi + d + 4), wasm_f32x4_lt(y1, zero)), y1, a1);
            }
            for (; d < D4; d += 4) {
                V y0 = VLOAD(qr + d);
                a0 = VMADD(wasm_v128_bitselect(VLOAD(lo + d), VLOAD(hi + d), wasm_f32x4_lt(y0, zero)), y0, a0);
            }
            float s = hsum(wasm_f32x4_add(a0, a1));
            for (; d < D; d++) s += qr[d] * (qr[d] < 0.0f ? lo[d] : hi[d]);
            out[j * ldo + r] = s;
        }
    }
}

/* n finite halves to f32 (SIMD128 has no f16 conversion): the magnitude's
 * bits shifted into f32 place and scaled by 2^112 (exact, subnormals
 * included), the sign or-ed back. Stored boxes and keys are finite, so
 * infinities and NaNs need no case. */
static void widen_f16(const uint16_t *h, size_t n, float *out) {
    const V scale = VSPLAT(0x1p112f);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        v128_t x = wasm_u32x4_load16x4(h + i); /* 4 halves zero-extended in one load */
        v128_t mag = wasm_i32x4_shl(wasm_v128_and(x, wasm_i32x4_splat(0x7fff)), 13);
        v128_t sign = wasm_i32x4_shl(wasm_v128_and(x, wasm_i32x4_splat(0x8000)), 16);
        VSTORE(out + i, wasm_v128_or(wasm_f32x4_mul(mag, scale), sign));
    }
    for (; i < n; i++) {
        uint32_t x = h[i], bits = (x & 0x7fffu) << 13;
        float f;
        memcpy(&f, &bits, 4);
        f *= 0x1p112f;
        memcpy(&bits, &f, 4);
        bits |= (x & 0x8000u) << 16;
        memcpy(&out[i], &bits, 4);
    }
}

/* f16 boxes, widened in registers as widen_f16 does (the magnitude's bits
 * shifted into f32 place are the value times 2^-112, exactly; the sign is
 * kept in place by sign-extending) and used there: 4 operations per 4
 * halves, shared by 4 query rows at a time, instead of 7, a store and a
 * reload per row pair through a stack copy. */
static inline V half4(v128_t x) { /* 4 halves sign-extended to i32 */
    const V bits = wasm_v128_and(wasm_i32x4_shl(x, 13), wasm_i32x4_splat((int32_t)0x8fffe000));
    return wasm_f32x4_mul(bits, VSPLAT(0x1p112f));
}

/* One row's contribution of 4 dimensions: the query's sign picks the bound. */
#define AABB_STEP(acc, qrow, d, H, L)                                                                                  \
    do {                                                                                                               \
        const V y_ = VLOAD((qrow) + (d));                                                                              \
        acc = VMADD(wasm_v128_bitselect(L, H, wasm_f32x4_lt(y_, zero)), y_, acc);                                      \
    } while (0)

static void w_aabb_rows_f16(const float *q, size_t R, const uint16_t *const *b, size_t n, size_t D, float *out,
                            size_t ldo) {
    const V zero = VSPLAT(0);
    const size_t D8 = D & ~(size_t)7, D4 = D & ~(size_t)3;
    for (size_t r0 = 0; r0 < R; r0 += 4) {
        const size_t nr = R - r0 < 4 ? R - r0 : 4;
        /* a partial group repeats its last row and drops the copies */
        const float *q0 = q + r0 * D, *q1 = q + (r0 + (nr > 1 ? 1 : 0)) * D, *q2 = q + (r0 + (nr > 2 ? 2 : nr - 1)) * D,
                    *q3 = q + (r0 + nr - 1) * D;
        for (size_t j = 0; j < n; j++) {
            const uint16_t *hi = b[j], *lo = b[j] + D;
            V a0 = zero, a1 = zero, a2 = zero, a3 = zero;
            size_t d = 0;
            for (; d < D8; d += 8) {
                const v128_t h8 = wasm_v128_load(hi + d), l8 = wasm_v128_load(lo + d);
                const V h0 = half4(wasm_i32x4_extend_low_i16x8(h8)), h1 = half4(wasm_i32x4_extend_high_i16x8(h8));
                const V l0 = half4(wasm_i32x4_extend_low_i16x8(l8)), l1 = half4(wasm_i32x4_extend_high_i16x8(l8));
                AABB_STEP(a0, q0, d, h0, l0);
                AABB_STEP(a0, q0, d + 4, h1, l1);
                AABB_STEP(a1, q1, d, h0, l0);
                AABB_STEP(a1, q1, d + 4, h1, l1);
                AABB_STEP(a2, q2, d, h0, l0);
                AABB_STEP(a2, q2, d + 4, h1, l1);
                AABB_STEP(a3, q3, d, h0, l0);
                AABB_STEP(a3, q3, d + 4, h1, l1);
            }
            for (; d < D4; d += 4) {
                const V h0 = half4(wasm_i32x4_load16x4(hi + d)), l0 = half4(wasm_i32x4_load16x4(lo + d));
                AABB_STEP(a0, q0, d, h0, l0);
                AABB_STEP(a1, q1, d, h0, l0);
                AABB_STEP(a2, q2, d, h0, l0);
                AABB_STEP(a3, q3, d, h0, l0);
            }
            float s[4] = {hsum(a0), hsum(a1), hsum(a2), hsum(a3)};
            const float *qr[4] = {q0, q1, q2, q3};
            for (; d < D; d++) {
                float hv, lv;
                widen_f16(hi + d, 1, &hv);
                widen_f16(lo + d, 1, &lv);
                for (size_t k = 0; k < 4; k++) s[k] += qr[k][d] * (qr[k][d] < 0.0f ? lv : hv);
            }
            for (size_t k = 0; k < nr; k++) out[j * ldo + r0 + k] = s[k];
        }
    }
}
#undef AABB_STEP

/* EXACT on stored keys: each key row widened once into a stack buffer
 * (widen_f16), then dotted with every query row while it is in L1. */
static void w_exact_f32(const float *q, size_t R, const float *k, size_t n, size_t D, float *out) {
    const size_t D4 = D & ~(size_t)3;
    for (size_t r = 0; r < R; r++) out[r] = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        const float *kr = k + i * D;
        for (size_t r = 0; r < R; r++) {
            const float *qr = q + r * D;
            V a0 = VSPLAT(0), a1 = a0;
            size_t d = 0;
            for (; d + 8 <= D4; d += 8) {
                a0 = VMADD(VLOAD(kr + d), VLOAD(qr + d), a0);
                a1 = VMADD(VLOAD(kr + d + 4), VLOAD(qr + d + 4), a1);
            }
            for (; d < D4; d += 4) a0 = VMADD(VLOAD(kr + d), VLOAD(qr + d), a0);
            const float x = row_dot(qr, kr, D, d, wasm_f32x4_add(a0, a1));
            out[r] = x > out[r] ? x : out[r];
        }
    }
}

static void w_exact_f16(const float *q, size_t R, const uint16_t *k, size_t n, size_t D, float *out) {
    float row[1024], m[64];
    for (size_t r = 0; r < R; r++) out[r] = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        widen_f16(k + i * D, D, row);
        for (size_t r0 = 0; r0 < R; r0 += 64) { /* rows in groups that fit m */
            const size_t nr = R - r0 < 64 ? R - r0 : 64;
            w_exact_f32(q + r0 * D, nr, row, 1, D, m);
            for (size_t r = 0; r < nr; r++) out[r0 + r] = m[r] > out[r0 + r] ? m[r] : out[r0 + r];
        }
    }
}

static void w_col_max(const float *x, size_t n, size_t ld, size_t cols, float *m) {
    size_t c = 0;
    for (; c + 4 <= cols; c += 4) {
        V a = VLOAD(m + c);
        for (size_t j = 0; j < n; j++) a = wasm_f32x4_pmax(a, VLOAD(x + j * ld + c));
        VSTORE(m + c, a);
    }
    for (; c < cols; c++)
        for (size_t j = 0; j < n; j++) m[c] = x[j * ld + c] > m[c] ? x[j * ld + c] : m[c];
}

static void w_col_exp_sum(float *x, size_t n, size_t ld, size_t cols, const float *m, float tau, float *z) {
    const V t = VSPLAT(tau);
    size_t c = 0;
    for (; c + 4 <= cols; c += 4) {
        const V mv = VLOAD(m + c);
        V zs = VLOAD(z + c);
        for (size_t j = 0; j < n; j++) {
            V e = vexp_neg(wasm_f32x4_mul(t, wasm_f32x4_sub(VLOAD(x + j * ld + c), mv)));
            VSTORE(x + j * ld + c, e);
            zs = wasm_f32x4_add(zs, e);
        }
        VSTORE(z + c, zs);
    }
    for (; c < cols; c++)
        for (size_t j = 0; j < n; j++) {
            float e = expf(tau * (x[j * ld + c] - m[c]));
            x[j * ld + c] = e;
            z[c] += e;
        }
}

static float w_dot(const float *a, const float *b, size_t n) {
    V s0 = VSPLAT(0), s1 = s0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 = VMADD(VLOAD(a + i), VLOAD(b + i), s0);
        s1 = VMADD(VLOAD(a + i + 4), VLOAD(b + i + 4), s1);
    }
    for (; i + 4 <= n; i += 4) s0 = VMADD(VLOAD(a + i), VLOAD(b + i), s0);
    float s = hsum(wasm_f32x4_add(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void w_group_max(const float *x, const float *w, size_t n_groups, size_t n, float *out) {
    for (size_t g = 0; g < n_groups; g++, x += n, w = w ? w + n : NULL) {
        float a = -INFINITY;
        size_t t = 0;
        if (n >= 4) {
            V acc = w ? wasm_f32x4_mul(VLOAD(x), VLOAD(w)) : VLOAD(x);
            for (t = 4; t + 4 <= n; t += 4) acc = wasm_f32x4_pmax(acc, w ? wasm_f32x4_mul(VLOAD(x + t), VLOAD(w + t)) : VLOAD(x + t));
            float lanes[4];
            VSTORE(lanes, acc);
            for (size_t i = 0; i < 4; i++) a = lanes[i] > a ? lanes[i] : a;
        }
        for (; t < n; t++) {
            const float v = w ? x[t] * w[t] : x[t];
            a = v > a ? v : a;
        }
        out[g] = a;
    }
}

/* rows_below 16: a decode step's 4-8 query rows would be padded to a
 * 16-row panel; the row product is faster below that. */
const kvm_score_kernels kvm_score_wasm128 = {"wasm128",       w_panel,         w_rows,    w_exp_neg,     16,
                                            w_aabb_rows_f16, w_aabb_rows_f32, w_col_max, w_col_exp_sum, w_dot,
                                            w_exact_f16,     w_exact_f32,     w_group_max};
