/* Backend conformance: quantize / dequantize (Q8, Q4, Q4 KIVI sections,
 * core/backend/quant_layout.h) on the backend under test, against the CPU backend's
 * entries and against a plain reference written here.
 *
 * Tolerances:
 *   layout      the section's size and part offsets as quant_layout.h spells them
 *               (recomputed here), padding bytes and unused nibbles 0, and
 *               nothing written outside [dst_off, dst_off + bytes)
 *   scales, biases  the same f16 values as the CPU entry and as the plain
 *               reference here (scale = absmax/127 or (max - bias)/15 in f32,
 *               rounded UP to f16; bias = min rounded DOWN); +0 and -0 count
 *               as equal (they decode alike)
 *   codes       equal to the CPU's, except that a backend whose arithmetic is
 *               not correctly rounded may differ by 1 where the exact ratio
 *               t = x/s (Q8) or (x - b)/s (Q4) lies within 2^-20 max(1, |t|)
 *               of a rounding tie (k + 1/2). The Vulkan shaders are exact.
 *   decoded     dequantize gives exactly the CPU's values (q*s is exact in
 *               f32, so q*s + b rounds once, fused or not) and the plain
 *               decode here; sections encoded on either backend decode on
 *               the other within quant_layout.h's bound, stated per value with the
 *               decoded scale s: |x - x'| <= s/2 + 2^-21 (|x| + |b|), and
 *               s <= range/k (1 + 2^-10) + 2^-24 (k = 127 for Q8 with range =
 *               absmax; k = 15 for Q4 with range = max - min + ulp16(min)).
 *               The 2^-24 term is the smallest f16 step: groups whose scale
 *               is an f16 subnormal need it (quant_layout.h states it since this
 *               test found them above absmax/254 (1 + 2^-10)).
 *   long blocks KIVI keys read each channel over all n rows: 40000 rows are
 *               quantized as above, or refused as unsupported with a message
 *               (Vulkan: one invocation would loop past its budget, which
 *               lavapipe once cut short silently)
 *   bad input   wrong dtype, which, n, dim, ranges, misaligned offsets,
 *               values not finite within +-65504: KVMEM_ERR_INVALID_ARG with
 *               a message, destination bytes unchanged.
 *
 * Harness: conformance.h. */
#include "conformance.h"
#include "quant/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- plain reference ---- */

static double f16d(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Smallest f16 >= q (q >= 0). */
static double f16_up(double q) {
    if (q <= 0) return 0;
    int lo = 1, hi = 0x7bff;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (f16d((uint16_t)mid) >= q) hi = mid;
        else lo = mid + 1;
    }
    return f16d((uint16_t)lo);
}

/* Largest f16 <= v. */
static double f16_down(double v) {
    if (v >= 0) {
        int lo = 0, hi = 0x7bff;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (f16d((uint16_t)mid) <= v) lo = mid;
            else hi = mid - 1;
        }
        return f16d((uint16_t)lo);
    }
    return -f16_up(-v);
}

static double ulp16(double v) {
    v = fabs(v);
    if (v < ldexp(1, -14)) return ldexp(1, -24);
    int e;
    frexp(v, &e); /* v in [2^(e-1), 2^e) */
    return ldexp(1, e - 1 - 10);
}

typedef struct {
    size_t codes_off, scales_off, biases_off, bytes, np, G, group, W;
    int mode; /* 0 Q8, 1 Q4, 2 KIVI keys */
} lay;

static size_t pad4(size_t x) { return (x + 3) / 4 * 4; }

static lay tlayout(kvmem_dtype dt, int which, size_t n, size_t dim) {
    lay l;
    memset(&l, 0, sizeof l);
    l.W = (dim + 7) / 8;
    if (dt == KVMEM_Q8) {
        l.group = 32;
        l.G = (dim + 31) / 32;
        l.np = n * l.G;
        l.codes_off = pad4(2 * l.np);
        l.bytes = pad4(l.codes_off + n * dim);
    } else {
        l.mode = dt == KVMEM_Q4_KIVI && which == 0 ? 2 : 1;
        l.group = 64;
        l.G = (dim + 63) / 64;
        l.np = l.mode == 2 ? dim : n * l.G;
        l.scales_off = n * l.W * 4;
        l.biases_off = pad4(l.scales_off + 2 * l.np);
        l.bytes = pad4(l.biases_off + 2 * l.np);
    }
    return l;
}

static uint16_t rd16(const unsigned char *p, size_t off) { return (uint16_t)(p[off] | (p[off + 1] << 8)); }

/* Parameter index of value (r, i), and the range [i0, i0 + k) x rows it covers. */
static size_t pidx(const lay *l, size_t r, size_t i) { return l->mode == 2 ? i : r * l->G + i / l->group; }

static int code_of(const lay *l, const unsigned char *s, size_t dim, size_t r, size_t i) {
    if (l->mode == 0) return (int)(int8_t)s[l->codes_off + r * dim + i];
    uint32_t w;
    memcpy(&w, s + 4 * (r * l->W + i / 8), 4);
    return (int)((w >> (4 * (i % 8))) & 15u);
}

/* Reference parameters: scale and bias of parameter p over x (n rows). */
static void ref_params(const lay *l, const float *x, size_t n, size_t dim, size_t p, double *s, double *b,
                       double *bound) {
    size_t r0 = 0, r1 = n, i0 = 0, i1 = dim;
    if (l->mode == 2) {
        i0 = p;
        i1 = p + 1;
    } else {
        r0 = p / l->G;
        r1 = r0 + 1;
        i0 = (p % l->G) * l->group;
        i1 = i0 + l->group < dim ? i0 + l->group : dim;
    }
    float amax = 0, mn = x[r0 * dim + i0], mx = mn;
    for (size_t r = r0; r < r1; r++)
        for (size_t i = i0; i < i1; i++) {
            float v = x[r * dim + i];
            amax = fabsf(v) > amax ? fabsf(v) : amax;
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
    if (l->mode == 0) {
        *s = f16_up(amax / 127.0f);
        *b = 0;
        *bound = amax / 127.0 * (1 + ldexp(1, -10)) + ldexp(1, -24);
    } else {
        *b = f16_down(mn);
        *s = f16_up((mx - (float)*b) / 15.0f);
        *bound = ((double)mx - mn + ulp16(mn)) / 15.0 * (1 + ldexp(1, -10)) + ldexp(1, -24);
    }
}

/* ---- data ---- */

enum { D_NORMAL, D_WIDE, D_LIMIT, D_CONST, D_TINY, D_MIXED, D_KINDS };

static void fill(float *x, size_t n, size_t dim, int kind, uint64_t *rng) {
    float cst = 0.0f;
    for (size_t i = 0; i < n * dim; i++) {
        float v;
        switch (kind) {
        case D_NORMAL: v = tu_normal(rng); break;
        case D_WIDE: v = tu_normal(rng) * ldexpf(1, (int)(tu_next(rng) % 20) - 10) + 3.0f; break;
        case D_LIMIT: { /* near and at +-65504 */
            uint64_t c = tu_next(rng) % 4;
            v = c == 0 ? 65504.0f : c == 1 ? -65504.0f : tu_uniform(rng, 65000.0f, 65504.0f) * (c == 2 ? 1 : -1);
            break;
        }
        case D_CONST: { /* the whole section one value: constant groups and channels */
            static const float cv[5] = {0.0f, -2.5f, 1e-3f, 65504.0f, -7e-6f};
            if (i == 0) cst = cv[tu_next(rng) % 5];
            v = cst;
            break;
        }
        case D_TINY: { /* f16 subnormal and f32 denormal magnitudes, zeros */
            uint64_t c = tu_next(rng) % 4;
            v = c == 0 ? 0.0f : c == 1 ? tu_normal(rng) * 1e-6f : c == 2 ? tu_normal(rng) * 1e-39f : tu_normal(rng) * 3e-8f;
            break;
        }
        default: /* one outlier per few values */
            v = tu_next(rng) % 7 == 0 ? tu_uniform(rng, -3000, 3000) : tu_normal(rng) * 0.01f;
            break;
        }
        x[i] = v;
    }
}

/* ---- helpers on the backends ---- */

/* Quantize x (n x dim) on be at src_off / dst_off; returns the section in a
 * malloc'd copy of the destination buffer (sentinel 0xa5 around it). */
static unsigned char *run_quant(kvmem_backend *be, kvmem_dtype dt, int which, const float *x, size_t n, size_t dim,
                                size_t src_off, size_t dst_off, size_t dst_size) {
    kvmem_buffer *src = balloc(be, src_off + n * dim * 4), *dst = balloc(be, dst_size);
    unsigned char *out = malloc(dst_size);
    memset(out, 0xa5, dst_size);
    bput(be, dst, 0, out, dst_size);
    bput(be, src, src_off, x, n * dim * 4);
    assert_ok(be->iface->quantize(be, dt, which, src, src_off, n, dim, dst, dst_off));
    bget(be, dst, 0, out, dst_size);
    be->iface->buffer_free(be, src);
    be->iface->buffer_free(be, dst);
    return out;
}

static float *run_dequant(kvmem_backend *be, kvmem_dtype dt, int which, const unsigned char *sec, size_t bytes,
                          size_t n, size_t dim, size_t row0, size_t cnt, size_t dst_off) {
    size_t src_off = 8, ob = dst_off + cnt * dim * 4 + 4;
    kvmem_buffer *src = balloc(be, src_off + bytes), *dst = balloc(be, ob);
    bput(be, src, src_off, sec, bytes);
    unsigned char *o = malloc(ob);
    memset(o, 0x5a, ob);
    bput(be, dst, 0, o, ob);
    assert_ok(be->iface->dequantize(be, dt, which, src, src_off, n, dim, row0, cnt, dst, dst_off));
    bget(be, dst, 0, o, ob);
    for (size_t i = 0; i < dst_off; i++) assert_int_equal(o[i], 0x5a);
    for (size_t i = dst_off + cnt * dim * 4; i < ob; i++) assert_int_equal(o[i], 0x5a);
    float *y = malloc(cnt * dim * 4 + 4);
    memcpy(y, o + dst_off, cnt * dim * 4);
    free(o);
    be->iface->buffer_free(be, src);
    be->iface->buffer_free(be, dst);
    return y;
}

/* Bound check of decoded y (rows [row0, row0+cnt)) against x, with the
 * section's own parameters. */
static void check_bound(const lay *l, const unsigned char *sec, const float *x, const float *y, size_t n, size_t dim,
                        size_t row0, size_t cnt, const char *what) {
    for (size_t r = row0; r < row0 + cnt; r++)
        for (size_t i = 0; i < dim; i++) {
            size_t p = pidx(l, r, i);
            double s = f16d(rd16(sec, (l->mode == 0 ? 0 : l->scales_off) + 2 * p));
            double b = l->mode == 0 ? 0 : f16d(rd16(sec, l->biases_off + 2 * p));
            double xv = x[r * dim + i], yv = y[(r - row0) * dim + i];
            double bound = s / 2 + ldexp(fabs(xv) + fabs(b), -21);
            if (!(fabs(xv - yv) <= bound))
                fail_msg("%s: value (%zu, %zu) = %.9g decodes to %.9g, |err| %.3g > bound %.3g (s %.6g, b %.6g)", what,
                         r, i, xv, yv, fabs(xv - yv), bound, s, b);
        }
}

/* The quantize case: backend vs CPU vs reference, then decoding both ways. */
static void one_case(kvmem_dtype dt, int which, size_t n, size_t dim, int kind, uint64_t *rng, size_t src_off,
                     size_t dst_off) {
    float *x = malloc(n * dim * 4);
    fill(x, n, dim, kind, rng);
    lay l = tlayout(dt, which, n, dim);
    kvm_qsection q = kvm_qsection_layout(dt, which, n, dim);
    assert_int_equal(q.bytes, l.bytes);
    assert_int_equal(q.codes_off, l.codes_off);
    assert_int_equal(q.scales_off, l.scales_off);
    assert_int_equal(q.biases_off, l.biases_off);
    size_t dsz = dst_off + l.bytes + 8;
    unsigned char *cb = run_quant(g_cpu, dt, which, x, n, dim, 0, dst_off, dsz);
    unsigned char *bb = run_quant(g_be, dt, which, x, n, dim, src_off, dst_off, dsz);
    for (size_t i = 0; i < dst_off; i++) assert_int_equal(bb[i], 0xa5);
    for (size_t i = dst_off + l.bytes; i < dsz; i++) assert_int_equal(bb[i], 0xa5);
    const unsigned char *c = cb + dst_off, *b = bb + dst_off;
    char what[160];
    snprintf(what, sizeof what, "%s which %d n %zu dim %zu kind %d", kvmem_dtype_name(dt), which, n, dim, kind);
    /* parameters: reference == CPU == backend (values) */
    size_t so = l.mode == 0 ? 0 : l.scales_off;
    for (size_t p = 0; p < l.np; p++) {
        double rs, rb, sbound;
        ref_params(&l, x, n, dim, p, &rs, &rb, &sbound);
        if (!(rs <= sbound)) fail_msg("%s: scale %zu: %.9g above quant_layout.h's bound %.9g", what, p, rs, sbound);
        double cs = f16d(rd16(c, so + 2 * p)), bs = f16d(rd16(b, so + 2 * p));
        if (cs != rs || bs != rs) fail_msg("%s: scale %zu: reference %.9g, cpu %.9g, backend %.9g", what, p, rs, cs, bs);
        if (l.mode) {
            double cbias = f16d(rd16(c, l.biases_off + 2 * p)), bbias = f16d(rd16(b, l.biases_off + 2 * p));
            if (cbias != rb || bbias != rb)
                fail_msg("%s: bias %zu: reference %.9g, cpu %.9g, backend %.9g", what, p, rb, cbias, bbias);
        }
    }
    /* padding bytes */
    if (l.mode == 0) {
        for (size_t i = 2 * l.np; i < l.codes_off; i++) assert_int_equal(b[i], 0);
        for (size_t i = l.codes_off + n * dim; i < l.bytes; i++) assert_int_equal(b[i], 0);
    } else {
        for (size_t i = l.scales_off + 2 * l.np; i < l.biases_off; i++) assert_int_equal(b[i], 0);
        for (size_t i = l.biases_off + 2 * l.np; i < l.bytes; i++) assert_int_equal(b[i], 0);
        if (dim % 8)
            for (size_t r = 0; r < n; r++) {
                uint32_t w;
                memcpy(&w, b + 4 * (r * l.W + l.W - 1), 4);
                assert_int_equal(w >> (4 * (dim % 8)), 0); /* unused nibbles */
            }
    }
    /* codes: reference == CPU; backend == CPU except near ties */
    for (size_t r = 0; r < n; r++)
        for (size_t i = 0; i < dim; i++) {
            size_t p = pidx(&l, r, i);
            double s = f16d(rd16(c, so + 2 * p)), bias = l.mode ? f16d(rd16(c, l.biases_off + 2 * p)) : 0;
            float inv = s > 0 ? 1.0f / (float)s : 0.0f;
            float t32 = l.mode ? ((x[r * dim + i] - (float)bias) * inv) : x[r * dim + i] * inv;
            long rq = lrintf(t32);
            long lo = l.mode ? 0 : -127, hi = l.mode ? 15 : 127;
            rq = rq < lo ? lo : rq > hi ? hi : rq;
            int cc = code_of(&l, c, dim, r, i), bc = code_of(&l, b, dim, r, i);
            if (cc != rq) fail_msg("%s: cpu code (%zu, %zu) %d, reference %ld", what, r, i, cc, rq);
            if (bc != cc) {
                double t = s > 0 ? ((double)x[r * dim + i] - bias) / s : 0;
                double tie = fabs(t - (floor(t) + 0.5));
                if (abs(bc - cc) != 1 || tie > ldexp(fmax(1, fabs(t)), -20))
                    fail_msg("%s: backend code (%zu, %zu) %d, cpu %d (t = %.9g)", what, r, i, bc, cc, t);
            }
        }
    /* decoding: backend section on the CPU, CPU section on the backend */
    float *y1 = run_dequant(g_cpu, dt, which, b, l.bytes, n, dim, 0, n, 0);
    check_bound(&l, b, x, y1, n, dim, 0, n, what);
    float *y2 = run_dequant(g_be, dt, which, c, l.bytes, n, dim, 0, n, 4);
    float *y3 = run_dequant(g_cpu, dt, which, c, l.bytes, n, dim, 0, n, 0);
    check_bound(&l, c, x, y2, n, dim, 0, n, what);
    for (size_t e = 0; e < n * dim; e++) {
        size_t r = e / dim, i = e % dim, p = pidx(&l, r, i);
        double s = f16d(rd16(c, so + 2 * p)), bias = l.mode ? f16d(rd16(c, l.biases_off + 2 * p)) : 0;
        float plain = (float)((double)code_of(&l, c, dim, r, i) * s + bias); /* q*s exact: one rounding */
        if (y2[e] != y3[e] || y3[e] != plain)
            fail_msg("%s: decoded %zu: backend %.9g, cpu %.9g, plain %.9g", what, e, y2[e], y3[e], plain);
    }
    /* a row range */
    if (n > 2) {
        size_t row0 = n / 3, cnt = n - row0 - 1;
        float *y4 = run_dequant(g_be, dt, which, c, l.bytes, n, dim, row0, cnt, 12);
        assert_memory_equal(y4, y3 + row0 * dim, cnt * dim * 4);
        free(y4);
    }
    free(y1);
    free(y2);
    free(y3);
    free(x);
    free(cb);
    free(bb);
}

static const size_t k_dims[] = {1, 7, 8, 31, 32, 33, 63, 64, 65, 100, 128, 130, 257};
static const size_t k_rows[] = {1, 3, 16, 17};

static void run_format(kvmem_dtype dt, int which, uint64_t seed) {
    uint64_t rng = seed;
    int c = 0;
    for (size_t di = 0; di < sizeof k_dims / sizeof k_dims[0]; di++)
        for (size_t ri = 0; ri < sizeof k_rows / sizeof k_rows[0]; ri++, c++)
            one_case(dt, which, k_rows[ri], k_dims[di], c % D_KINDS, &rng, 4 * (size_t)(c % 3), 4 * (size_t)(c % 2));
    /* every data kind at a common shape, and a long block */
    for (int kind = 0; kind < D_KINDS; kind++) one_case(dt, which, 16, 128, kind, &rng, 0, 0);
    one_case(dt, which, 256, 128, D_NORMAL, &rng, 0, 0);
}

static void test_quant_q8_matches_cpu_and_reference(void **state) {
    (void)state;
    NEED_ENTRY(quantize);
    run_format(KVMEM_Q8, 1, 11);
    run_format(KVMEM_Q8, 0, 12);
}

static void test_quant_q4_matches_cpu_and_reference(void **state) {
    (void)state;
    NEED_ENTRY(quantize);
    run_format(KVMEM_Q4, 1, 21);
}

static void test_quant_kivi_keys_per_channel_and_values(void **state) {
    (void)state;
    NEED_ENTRY(quantize);
    run_format(KVMEM_Q4_KIVI, 0, 31);
    run_format(KVMEM_Q4_KIVI, 1, 32);
}

static void test_quant_kivi_keys_long_block_or_refused(void **state) {
    (void)state;
    NEED_ENTRY(quantize);
    const size_t n = 40000, dim = 8;
    uint64_t rng = 33;
    float *x = malloc(n * dim * 4);
    fill(x, n, dim, D_NORMAL, &rng);
    const size_t bytes = kvm_qsection_layout(KVMEM_Q4_KIVI, 0, n, dim).bytes;
    kvmem_buffer *src = bnew(g_be, x, n * dim * 4), *dst = balloc(g_be, bytes);
    kvmem_status st = g_be->iface->quantize(g_be, KVMEM_Q4_KIVI, 0, src, 0, n, dim, dst, 0);
    g_be->iface->buffer_free(g_be, src);
    g_be->iface->buffer_free(g_be, dst);
    free(x);
    if (st == KVMEM_OK) {
        one_case(KVMEM_Q4_KIVI, 0, n, dim, D_NORMAL, &rng, 0, 4);
    } else {
        assert_int_equal(st, KVMEM_ERR_UNSUPPORTED);
        assert_non_null(strstr(kvmem_last_error(), "quantize")); /* a message naming the op */
        assert_true(g_be != g_cpu);
    }
}

/* Every code of every scale: a group built so each value sits exactly on a
 * code or exactly on a tie between two codes (ties go to even on the CPU). */
static void test_quant_exact_ties_round_to_even(void **state) {
    (void)state;
    NEED_ENTRY(quantize);
    const size_t n = 4, dim = 64;
    float x[4 * 64];
    for (size_t r = 0; r < n; r++)
        for (size_t i = 0; i < dim; i++) {
            /* amax 127 * 0.25: scale exactly 0.25 (an f16); values k/8 are codes or ties */
            float v = (float)((int)(i * 4 + r) % 255 - 127) * 0.125f;
            x[r * dim + i] = i == 0 ? 31.75f : v;
        }
    kvmem_dtype dts[3] = {KVMEM_Q8, KVMEM_Q4, KVMEM_Q4_KIVI};
    for (int k = 0; k < 3; k++) {
        lay l = tlayout(dts[k], 0, n, dim);
        unsigned char *cb = run_quant(g_cpu, dts[k], 0, x, n, dim, 0, 0, l.bytes);
        unsigned char *bb = run_quant(g_be, dts[k], 0, x, n, dim, 0, 0, l.bytes);
        assert_memory_equal(cb, bb, l.bytes); /* no +-0 parameters here: bytes */
        free(cb);
        free(bb);
    }
}

static void test_quant_rejects_bad_input_and_changes_nothing(void **state) {
    (void)state;
    NEED_ENTRY(quantize);
    const size_t n = 4, dim = 40;
    float x[4 * 40];
    uint64_t rng = 5;
    fill(x, n, dim, D_NORMAL, &rng);
    lay l = tlayout(KVMEM_Q8, 1, n, dim);
    kvmem_buffer *src = bnew(g_be, x, sizeof x), *dst = balloc(g_be, l.bytes + 8), *big = balloc(g_be, 512);
    unsigned char pre[512], post[512];
    memset(pre, 0x77, sizeof pre);
    bput(g_be, dst, 0, pre, l.bytes + 8);
    bput(g_be, big, 0, pre, sizeof pre);
    kvmem_backend *be = g_be;
    assert_status(be->iface->quantize(be, KVMEM_F32, 1, src, 0, n, dim, dst, 0), KVMEM_ERR_INVALID_ARG, "dtype");
    assert_status(be->iface->quantize(be, (kvmem_dtype)99, 1, src, 0, n, dim, dst, 0), KVMEM_ERR_INVALID_ARG, "dtype");
    assert_status(be->iface->quantize(be, KVMEM_Q8, 2, src, 0, n, dim, dst, 0), KVMEM_ERR_INVALID_ARG, "which");
    assert_status(be->iface->quantize(be, KVMEM_Q8, -1, src, 0, n, dim, dst, 0), KVMEM_ERR_INVALID_ARG, "which");
    assert_status(be->iface->quantize(be, KVMEM_Q8, 1, src, 0, 0, dim, dst, 0), KVMEM_ERR_INVALID_ARG, "rows");
    assert_status(be->iface->quantize(be, KVMEM_Q8, 1, src, 0, n, 0, dst, 0), KVMEM_ERR_INVALID_ARG, "rows");
    assert_status(be->iface->quantize(be, KVMEM_Q8, 1, src, 0, 1, 1025, dst, 0), KVMEM_ERR_INVALID_ARG, "rows");
    assert_status(be->iface->quantize(be, KVMEM_Q8, 1, src, 0, SIZE_MAX, dim, dst, 0), KVMEM_ERR_INVALID_ARG, "rows");
    assert_status(be->iface->quantize(be, KVMEM_Q8, 1, src, 4, n, dim, dst, 0), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(be->iface->quantize(be, KVMEM_Q8, 1, src, 0, n + 1, dim, dst, 0), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(be->iface->quantize(be, KVMEM_Q8, 1, src, 0, n, dim, dst, 12), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(be->iface->quantize(be, KVMEM_Q8, 1, src, 0, n, dim, dst, 2), KVMEM_ERR_INVALID_ARG, "misaligned");
    assert_status(be->iface->quantize(be, KVMEM_Q8, 1, src, 2, n - 1, dim, dst, 0), KVMEM_ERR_INVALID_ARG, "misaligned");
    assert_status(be->iface->quantize(be, KVMEM_Q8, 1, NULL, 0, n, dim, dst, 0), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(be->iface->quantize(be, KVMEM_Q8, 1, src, 0, n, dim, NULL, 0), KVMEM_ERR_INVALID_ARG, "outside");
    /* values outside what f16 parameters can hold, per format */
    const float badv[4] = {NAN, INFINITY, -INFINITY, 65505.0f};
    kvmem_dtype dts[3] = {KVMEM_Q8, KVMEM_Q4, KVMEM_Q4_KIVI};
    for (int k = 0; k < 4; k++)
        for (int d = 0; d < 3; d++)
            for (int w = 0; w < 2; w++) {
                float y[4 * 40];
                memcpy(y, x, sizeof y);
                y[(size_t)(k * 37 + d * 11 + w) % (n * dim)] = badv[k];
                bput(g_be, src, 0, y, sizeof y);
                assert_status(be->iface->quantize(be, dts[d], w, src, 0, n, dim, big, 0), KVMEM_ERR_INVALID_ARG,
                              "not finite");
            }
    bget(g_be, dst, 0, post, l.bytes + 8);
    assert_memory_equal(pre, post, l.bytes + 8);
    bget(g_be, big, 0, post, sizeof post);
    assert_memory_equal(pre, post, sizeof pre);
    g_be->iface->buffer_free(g_be, big);
    g_be->iface->buffer_free(g_be, src);
    g_be->iface->buffer_free(g_be, dst);
}

static void test_dequant_rejects_bad_input_and_changes_nothing(void **state) {
    (void)state;
    NEED_ENTRY(dequantize);
    const size_t n = 5, dim = 70;
    lay l = tlayout(KVMEM_Q4, 1, n, dim);
    unsigned char sec[2048];
    memset(sec, 0x33, sizeof sec);
    kvmem_buffer *src = bnew(g_be, sec, l.bytes), *dst = balloc(g_be, n * dim * 4);
    float pre[5 * 70], post[5 * 70];
    for (size_t i = 0; i < n * dim; i++) pre[i] = (float)i;
    bput(g_be, dst, 0, pre, sizeof pre);
    kvmem_backend *be = g_be;
    assert_status(be->iface->dequantize(be, KVMEM_BF16, 1, src, 0, n, dim, 0, n, dst, 0), KVMEM_ERR_INVALID_ARG, "dtype");
    assert_status(be->iface->dequantize(be, KVMEM_Q4, 3, src, 0, n, dim, 0, n, dst, 0), KVMEM_ERR_INVALID_ARG, "which");
    assert_status(be->iface->dequantize(be, KVMEM_Q4, 1, src, 0, 0, dim, 0, 0, dst, 0), KVMEM_ERR_INVALID_ARG, "rows");
    assert_status(be->iface->dequantize(be, KVMEM_Q4, 1, src, 0, n, 2000, 0, 1, dst, 0), KVMEM_ERR_INVALID_ARG, "rows");
    assert_status(be->iface->dequantize(be, KVMEM_Q4, 1, src, 0, n, dim, 3, 3, dst, 0), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(be->iface->dequantize(be, KVMEM_Q4, 1, src, 0, n, dim, n + 1, 0, dst, 0), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(be->iface->dequantize(be, KVMEM_Q4, 1, src, 0, n, dim, 1, SIZE_MAX, dst, 0), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(be->iface->dequantize(be, KVMEM_Q4, 1, src, 4, n, dim, 0, n, dst, 0), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(be->iface->dequantize(be, KVMEM_Q4, 1, src, 0, n, dim, 0, n, dst, 4), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(be->iface->dequantize(be, KVMEM_Q4, 1, src, 0, n, dim, 0, n - 1, dst, 2), KVMEM_ERR_INVALID_ARG, "misaligned");
    assert_status(be->iface->dequantize(be, KVMEM_Q4, 1, NULL, 0, n, dim, 0, n, dst, 0), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(be->iface->dequantize(be, KVMEM_Q4, 1, src, 0, n, dim, 0, n, NULL, 0), KVMEM_ERR_INVALID_ARG, "outside");
    /* zero rows: valid, writes nothing */
    assert_ok(be->iface->dequantize(be, KVMEM_Q4, 1, src, 0, n, dim, 2, 0, dst, 0));
    bget(g_be, dst, 0, post, sizeof post);
    assert_memory_equal(pre, post, sizeof pre);
    g_be->iface->buffer_free(g_be, src);
    g_be->iface->buffer_free(g_be, dst);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_quant_q8_matches_cpu_and_reference),
    cmocka_unit_test(test_quant_q4_matches_cpu_and_reference),
    cmocka_unit_test(test_quant_kivi_keys_per_channel_and_values),
    cmocka_unit_test(test_quant_kivi_keys_long_block_or_refused),
    cmocka_unit_test(test_quant_exact_ties_round_to_even),
    cmocka_unit_test(test_quant_rejects_bad_input_and_changes_nothing),
    cmocka_unit_test(test_dequant_rejects_bad_input_and_changes_nothing),
};
CONF_MAIN(tests)
