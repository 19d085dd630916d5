/* Backend conformance: the same cases on a backend under test (argv[1]:
 * "vulkan", "cuda", or "cpu" for the reference itself) and on the CPU
 * backend, each output also checked against a plain reference written here.
 * Ops are reached through the context's backend table (internal headers),
 * since the public API does not expose raw ops.
 *
 * Tolerances, per op:
 *   buffers     exact bytes
 *   convert     exact bits (both backends do integer RNE conversions;
 *               NaNs: same bits as the CPU backend, and NaN in the reference)
 *   aabb_build  exact values (min/max pick input values); a group of 200000
 *               rows (one Vulkan invocation per column would loop past its
 *               budget, which lavapipe once cut short silently): exact, or
 *               refused as unsupported with a message
 *   aabb_score  (Vulkan GEMM kernel by name) |I - I_ref| <=
 *               dim * 2^-23 * sum_d |q_d| max(|smax_d|, |smin_d|): the f32
 *               accumulation bound; and I >= max_i q.k_i (the AABB bound)
 * The device kernels (dev_*) and quantize/dequantize have their own
 * programs: test_backend_{retrieve,attend,qmem,quant}.c.
 *
 * Harness: conformance.h. */
#include "conformance.h"
#include "vk_ops.h"

#include <math.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- buffers ---- */

static void test_buffers_round_trip_exact_bytes(void **state) {
    (void)state;
    NEED_BACKEND();
    /* 9 MiB crosses the Vulkan staging chunk (8 MiB) when staged */
    const size_t sizes[] = {0, 1, 3, 4, 4097, (size_t)9 << 20};
    uint64_t rng = 1;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        unsigned char *src = malloc(n + 1), *dst = malloc(n + 1);
        for (size_t i = 0; i < n; i++) src[i] = (unsigned char)tu_next(&rng);
        kvmem_buffer *b = balloc(g_be, n);
        bput(g_be, b, 0, src, n);
        memset(dst, 0xab, n + 1);
        bget(g_be, b, 0, dst, n);
        assert_memory_equal(src, dst, n);
        assert_int_equal(dst[n], 0xab); /* nothing written past the range */
        if (n >= 4) { /* partial, unaligned ranges */
            size_t off = 1, len = n - 3;
            for (size_t i = 0; i < len; i++) src[off + i] ^= 0x5a;
            bput(g_be, b, off, src + off, len);
            bget(g_be, b, 0, dst, n);
            assert_memory_equal(src, dst, n);
        }
        void *hp = g_be->iface->buffer_host_ptr ? g_be->iface->buffer_host_ptr(g_be, b) : NULL;
        if (hp && n) assert_memory_equal(hp, src, n);
        const char *staged = getenv("KVMEM_VULKAN_STAGING");
        if (strcmp(g_name, "vulkan") == 0 && staged && strcmp(staged, "1") == 0)
            assert_null(hp); /* the staged run really stages */
        g_be->iface->buffer_free(g_be, b);
        free(src);
        free(dst);
    }
    g_be->iface->buffer_free(g_be, NULL); /* no-op */
    if (g_be != g_cpu) { /* (the CPU's malloc of this aborts under ASan by design) */
        kvmem_buffer *huge = NULL;
        assert_status(g_be->iface->buffer_alloc(g_be, SIZE_MAX / 2, &huge), KVMEM_ERR_NOMEM, "allocate");
        assert_null(huge);
    }
    assert_ok(g_be->iface->synchronize(g_be));
}

static void test_buffers_reject_out_of_range_and_change_nothing(void **state) {
    (void)state;
    NEED_BACKEND();
    unsigned char a[64], b[64];
    for (int i = 0; i < 64; i++) a[i] = (unsigned char)i;
    kvmem_buffer *buf = balloc(g_be, 64);
    bput(g_be, buf, 0, a, 64);
    unsigned char junk[64];
    memset(junk, 0xee, sizeof junk);
    assert_status(g_be->iface->buffer_upload(g_be, buf, 1, junk, 64), KVMEM_ERR_INVALID_ARG, "outside the buffer");
    assert_status(g_be->iface->buffer_upload(g_be, buf, 65, junk, 0), KVMEM_ERR_INVALID_ARG, "outside the buffer");
    assert_status(g_be->iface->buffer_upload(g_be, buf, SIZE_MAX, junk, 2), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(g_be->iface->buffer_download(g_be, buf, 60, b, 5), KVMEM_ERR_INVALID_ARG, "outside the buffer");
    bget(g_be, buf, 0, b, 64);
    assert_memory_equal(a, b, 64);
    g_be->iface->buffer_free(g_be, buf);
}

/* ---- convert: an independent reference in double arithmetic ---- */

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Round |x| to a float with `mbits` explicit mantissa bits and exponent range
 * [emin, emax] (IEEE layout, bias -emin+1), RNE; returns the bit pattern
 * without sign. Finite, non-NaN x only. */
static uint32_t ref_round(double ax, int mbits, int emin, int emax) {
    int bias = 1 - emin;
    if (ax == 0) return 0;
    int k;
    frexp(ax, &k); /* ax = f * 2^k, f in [0.5, 1) */
    int e = k - 1;
    if (e < emin) { /* subnormal: units of 2^(emin - mbits) */
        double q = nearbyint(ldexp(ax, mbits - emin));
        return (uint32_t)q; /* q == 2^mbits becomes the smallest normal: same bits */
    }
    double m = nearbyint(ldexp(ax, mbits - e)); /* in [2^mbits, 2^(mbits+1)] */
    if (m == ldexp(1, mbits + 1)) {
        m = ldexp(1, mbits);
        e++;
    }
    if (e > emax) return (uint32_t)(emax + bias + 1) << mbits; /* infinity */
    return ((uint32_t)(e + bias) << mbits) | ((uint32_t)m - (1u << mbits));
}

static uint16_t ref_f16(float x) {
    uint16_t s = (uint16_t)(signbit(x) ? 0x8000 : 0);
    if (isinf(x)) return (uint16_t)(s | 0x7c00);
    return (uint16_t)(s | ref_round(fabs((double)x), 10, -14, 15));
}
static uint16_t ref_bf16(float x) {
    uint16_t s = (uint16_t)(signbit(x) ? 0x8000 : 0);
    if (isinf(x)) return (uint16_t)(s | 0x7f80);
    return (uint16_t)(s | ref_round(fabs((double)x), 7, -126, 127));
}
static double ref_from16(uint16_t h, int bf) {
    int mbits = bf ? 7 : 10, ebits = bf ? 8 : 5, bias = bf ? 127 : 15;
    int e = (h >> mbits) & ((1 << ebits) - 1);
    int m = h & ((1 << mbits) - 1);
    double sgn = (h & 0x8000) ? -1.0 : 1.0;
    if (e == (1 << ebits) - 1) return m ? NAN : sgn * INFINITY;
    if (e == 0) return sgn * ldexp(m, 1 - bias - mbits);
    return sgn * ldexp(m + (1 << mbits), e - bias - mbits);
}

/* Values that stress rounding: ties, subnormals of each format, overflow. */
static float special(uint64_t *rng, size_t i) {
    static const uint32_t bits[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc12345u, 0x7f800001u,
        0x00000001u, 0x007fffffu, 0x00800000u, 0x33000000u, 0x33000001u, 0x33800000u, 0x387fc000u,
        0x38800000u, 0x38801000u, 0x38803000u, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x47800000u,
        0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x7f7f8000u, 0x3f800fffu, 0x3f801000u, 0x3f803000u};
    const size_t nb = sizeof bits / sizeof bits[0];
    if (i < nb) return u2f(bits[i]);
    switch (tu_next(rng) % 4) {
    case 0: return tu_normal(rng);
    case 1: return ldexpf(tu_uniform(rng, -1, 1), (int)(tu_next(rng) % 60) - 40); /* f16 range edges */
    case 2: return u2f((uint32_t)tu_next(rng)); /* any bit pattern, NaNs included */
    default: return u2f((uint32_t)(tu_next(rng) & 0xffff8fffu) | 0x1000u); /* ties at 13 bits */
    }
}

static size_t dsz(kvmem_dtype d) { return d == KVMEM_F32 ? 4 : 2; }

/* The value the reference says element i of a conversion src->dst has, as
 * bits of dst; *is_nan when it must be a NaN (bits then unchecked here). */
static uint32_t ref_convert(const void *src, kvmem_dtype sdt, size_t i, kvmem_dtype ddt, int *is_nan) {
    double v;
    if (sdt == KVMEM_F32) v = ((const float *)src)[i];
    else v = ref_from16(((const uint16_t *)src)[i], sdt == KVMEM_BF16);
    *is_nan = isnan(v);
    if (*is_nan) return 0;
    float f = (float)v; /* exact: every f16/bf16 value is a float */
    if (ddt == KVMEM_F32) return f2u(f);
    if (sdt == ddt) return ((const uint16_t *)src)[i];
    return ddt == KVMEM_F16 ? ref_f16(f) : ref_bf16(f);
}

static uint32_t get_el(const void *p, kvmem_dtype d, size_t i) {
    return d == KVMEM_F32 ? ((const uint32_t *)p)[i] : ((const uint16_t *)p)[i];
}

static void convert_case(kvmem_dtype sdt, kvmem_dtype ddt, size_t n, size_t src_el_off, size_t dst_el_off,
                         uint64_t *rng) {
    size_t ss = dsz(sdt), ds = dsz(ddt);
    size_t sbytes = (src_el_off + n) * ss, dbytes = (dst_el_off + n + 3) * ds;
    unsigned char *src = malloc(sbytes + 4), *dinit = malloc(dbytes), *got = malloc(dbytes), *cpu = malloc(dbytes);
    for (size_t i = 0; i < src_el_off + n; i++) {
        float f = special(rng, i >= src_el_off ? i - src_el_off : 1000);
        if (sdt == KVMEM_F32) memcpy(src + i * 4, &f, 4);
        else {
            uint16_t h = (uint16_t)tu_next(rng); /* every 16-bit pattern is a valid input */
            if (i - src_el_off < 64) h = (uint16_t)(i * 1031u); /* subnormals, inf, nan early */
            memcpy(src + i * 2, &h, 2);
        }
    }
    for (size_t i = 0; i < dbytes; i++) dinit[i] = (unsigned char)tu_next(rng);

    kvmem_backend *bes[2] = {g_be, g_cpu};
    unsigned char *outs[2] = {got, cpu};
    for (int k = 0; k < 2; k++) {
        kvmem_backend *be = bes[k];
        kvmem_buffer *bs = balloc(be, sbytes), *bd = balloc(be, dbytes);
        bput(be, bs, 0, src, sbytes);
        bput(be, bd, 0, dinit, dbytes);
        assert_ok(be->iface->convert(be, bd, dst_el_off * ds, ddt, bs, src_el_off * ss, sdt, n));
        bget(be, bd, 0, outs[k], dbytes);
        be->iface->buffer_free(be, bs);
        be->iface->buffer_free(be, bd);
    }
    /* outside the range: untouched (the 16-bit neighbours sharing a word too) */
    assert_memory_equal(got, dinit, dst_el_off * ds);
    assert_memory_equal(got + (dst_el_off + n) * ds, dinit + (dst_el_off + n) * ds, 3 * ds);
    for (size_t i = 0; i < n; i++) {
        int is_nan;
        uint32_t want = ref_convert(src + src_el_off * ss, sdt, i, ddt, &is_nan);
        uint32_t g = get_el(got, ddt, dst_el_off + i), c = get_el(cpu, ddt, dst_el_off + i);
        if (g != c)
            fail_msg("convert %s->%s n=%zu element %zu: %s 0x%x, cpu 0x%x", kvmem_dtype_name(sdt),
                     kvmem_dtype_name(ddt), n, i, g_name, g, c);
        if (is_nan) {
            double back = ddt == KVMEM_F32 ? (double)u2f(g) : ref_from16((uint16_t)g, ddt == KVMEM_BF16);
            if (!isnan(back)) fail_msg("convert element %zu: NaN became 0x%x", i, g);
        } else if (g != want) {
            fail_msg("convert %s->%s element %zu: got 0x%x, reference 0x%x", kvmem_dtype_name(sdt),
                     kvmem_dtype_name(ddt), i, g, want);
        }
    }
    free(src);
    free(dinit);
    free(got);
    free(cpu);
}

static void test_convert_all_pairs_bit_exact(void **state) {
    (void)state;
    NEED_BACKEND();
    const kvmem_dtype dts[] = {KVMEM_F32, KVMEM_F16, KVMEM_BF16};
    const size_t ns[] = {1, 2, 3, 64, 1001, 70000};
    uint64_t rng = 7;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                convert_case(dts[a], dts[b], ns[k], 0, 0, &rng);
                convert_case(dts[a], dts[b], ns[k], 1, 3, &rng); /* odd element offsets */
            }
}

static void test_convert_every_f16_and_bf16_pattern(void **state) {
    (void)state;
    NEED_BACKEND();
    /* all 65536 patterns to f32 and back */
    uint16_t *all = malloc(65536 * 2);
    float *f = malloc(65536 * 4), *fc = malloc(65536 * 4);
    uint16_t *back = malloc(65536 * 2);
    for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    for (int bf = 0; bf < 2; bf++) {
        kvmem_dtype dt = bf ? KVMEM_BF16 : KVMEM_F16;
        kvmem_buffer *h = balloc(g_be, 65536 * 2), *x = balloc(g_be, 65536 * 4);
        bput(g_be, h, 0, all, 65536 * 2);
        assert_ok(g_be->iface->convert(g_be, x, 0, KVMEM_F32, h, 0, dt, 65536));
        bget(g_be, x, 0, f, 65536 * 4);
        assert_ok(g_be->iface->convert(g_be, h, 0, dt, x, 0, KVMEM_F32, 65536));
        bget(g_be, h, 0, back, 65536 * 2);
        kvm_convert_host(fc, KVMEM_F32, all, dt, 65536);
        for (uint32_t i = 0; i < 65536; i++) {
            double r = ref_from16((uint16_t)i, bf);
            if (isnan(r)) {
                assert_true(isnan(f[i]));
                assert_int_equal(f2u(f[i]), f2u(fc[i]));
                continue;
            }
            if ((double)f[i] != r || !signbit(f[i]) != !signbit(r))
                fail_msg("%s 0x%04x -> %.9g, reference %.9g", bf ? "bf16" : "f16", i, (double)f[i], r);
            assert_int_equal(back[i], i); /* exact round trip of every non-NaN */
        }
        g_be->iface->buffer_free(g_be, h);
        g_be->iface->buffer_free(g_be, x);
    }
    free(all);
    free(f);
    free(fc);
    free(back);
}

static void test_convert_rejects_bad_input_and_changes_nothing(void **state) {
    (void)state;
    NEED_BACKEND();
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8];
    kvmem_buffer *s = balloc(g_be, 32), *d = balloc(g_be, 32);
    bput(g_be, s, 0, a, 32);
    bput(g_be, d, 0, a, 32);
    assert_status(g_be->iface->convert(g_be, d, 0, KVMEM_Q8, s, 0, KVMEM_F32, 4), KVMEM_ERR_INVALID_ARG, "dtype");
    assert_status(g_be->iface->convert(g_be, d, 0, KVMEM_F32, s, 0, (kvmem_dtype)99, 4), KVMEM_ERR_INVALID_ARG,
                  "dtype");
    assert_status(g_be->iface->convert(g_be, d, 4, KVMEM_F32, s, 0, KVMEM_F32, 8), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(g_be->iface->convert(g_be, d, 0, KVMEM_F16, s, 0, KVMEM_F32, SIZE_MAX / 2), KVMEM_ERR_INVALID_ARG,
                  "outside");
    bget(g_be, d, 0, b, 32);
    assert_memory_equal(a, b, 32);
    assert_ok(g_be->iface->convert(g_be, d, 0, KVMEM_F32, s, 0, KVMEM_F32, 0)); /* empty: fine */
    g_be->iface->buffer_free(g_be, s);
    g_be->iface->buffer_free(g_be, d);
}

/* ---- aabb_build ---- */

static void aabb_case(size_t n_groups, size_t group_stride, size_t n_rows, size_t dim, size_t keys_off_el,
                      size_t out_off_el, uint64_t *rng) {
    size_t in_el = keys_off_el + (n_groups - 1) * group_stride + n_rows * dim;
    size_t out_el = out_off_el + n_groups * dim;
    float *keys = malloc(in_el * 4), *init = malloc(out_el * 4);
    float *mn[2], *mx[2];
    for (size_t i = 0; i < in_el; i++) keys[i] = tu_normal(rng) * 4.0f;
    if (in_el > 3) keys[3] = -0.0f;
    for (size_t i = 0; i < out_el; i++) init[i] = 1234.5f;
    kvmem_backend *bes[2] = {g_be, g_cpu};
    for (int k = 0; k < 2; k++) {
        kvmem_backend *be = bes[k];
        mn[k] = malloc(out_el * 4);
        mx[k] = malloc(out_el * 4);
        kvmem_buffer *bk = balloc(be, in_el * 4), *bmn = balloc(be, out_el * 4), *bmx = balloc(be, out_el * 4);
        bput(be, bk, 0, keys, in_el * 4);
        bput(be, bmn, 0, init, out_el * 4);
        bput(be, bmx, 0, init, out_el * 4);
        assert_ok(be->iface->aabb_build(be, bk, keys_off_el * 4, n_groups, group_stride, n_rows, dim, bmn, bmx,
                                        out_off_el * 4));
        bget(be, bmn, 0, mn[k], out_el * 4);
        bget(be, bmx, 0, mx[k], out_el * 4);
        be->iface->buffer_free(be, bk);
        be->iface->buffer_free(be, bmn);
        be->iface->buffer_free(be, bmx);
    }
    for (size_t i = 0; i < out_off_el; i++) assert_true(mn[0][i] == 1234.5f && mx[0][i] == 1234.5f);
    for (size_t g = 0; g < n_groups; g++)
        for (size_t d = 0; d < dim; d++) {
            double lo = INFINITY, hi = -INFINITY;
            for (size_t r = 0; r < n_rows; r++) {
                double v = keys[keys_off_el + g * group_stride + r * dim + d];
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
            size_t o = out_off_el + g * dim + d;
            if ((double)mn[0][o] != lo || (double)mx[0][o] != hi || mn[0][o] != mn[1][o] || mx[0][o] != mx[1][o])
                fail_msg("aabb g=%zu d=%zu: %s [%g, %g], cpu [%g, %g], reference [%g, %g]", g, d, g_name,
                         (double)mn[0][o], (double)mx[0][o], (double)mn[1][o], (double)mx[1][o], lo, hi);
        }
    free(keys);
    free(init);
    for (int k = 0; k < 2; k++) {
        free(mn[k]);
        free(mx[k]);
    }
}

static void test_aabb_build_matches_reference_exactly(void **state) {
    (void)state;
    NEED_BACKEND();
    uint64_t rng = 11;
    aabb_case(1, 0, 1, 1, 0, 0, &rng);                 /* one key */
    aabb_case(3, 16 * 128, 16, 128, 0, 0, &rng);       /* contiguous blocks */
    aabb_case(5, 1000, 7, 33, 5, 3, &rng);             /* gaps, odd dims, offsets */
    aabb_case(2 * 4 * 64, 16 * 64, 16, 64, 0, 0, &rng); /* a pool's worth: groups x KV heads */
    aabb_case(70000, 2, 1, 2, 1, 1, &rng);             /* more groups than one dispatch row */
}

static void test_aabb_build_long_group_exact_or_refused(void **state) {
    (void)state;
    NEED_BACKEND();
    const size_t n_rows = 200000, dim = 2;
    float z[4] = {0};
    kvmem_buffer *bk = balloc(g_be, n_rows * dim * 4), *bmn = bnew(g_be, z, sizeof z), *bmx = bnew(g_be, z, sizeof z);
    kvmem_status st = g_be->iface->aabb_build(g_be, bk, 0, 1, 0, n_rows, dim, bmn, bmx, 0);
    float back[4];
    bget(g_be, bmn, 0, back, sizeof back);
    g_be->iface->buffer_free(g_be, bk);
    g_be->iface->buffer_free(g_be, bmn);
    g_be->iface->buffer_free(g_be, bmx);
    uint64_t rng = 12;
    if (st == KVMEM_OK) {
        aabb_case(1, 0, n_rows, dim, 3, 1, &rng);
        aabb_case(3, n_rows * dim + 5, n_rows, dim, 0, 0, &rng);
    } else {
        assert_int_equal(st, KVMEM_ERR_UNSUPPORTED);
        assert_non_null(strstr(kvmem_last_error(), "aabb_build")); /* a message naming the op */
        assert_memory_equal(back, z, sizeof z);                    /* nothing written */
        assert_true(g_be != g_cpu);
    }
}

static void test_aabb_build_rejects_bad_input_and_changes_nothing(void **state) {
    (void)state;
    NEED_BACKEND();
    float k[64], init[16], got[16];
    for (int i = 0; i < 64; i++) k[i] = (float)i;
    for (int i = 0; i < 16; i++) init[i] = -7;
    kvmem_buffer *bk = balloc(g_be, sizeof k), *bmn = balloc(g_be, sizeof init), *bmx = balloc(g_be, sizeof init);
    bput(g_be, bk, 0, k, sizeof k);
    bput(g_be, bmn, 0, init, sizeof init);
    bput(g_be, bmx, 0, init, sizeof init);
    assert_status(g_be->iface->aabb_build(g_be, bk, 0, 1, 0, 0, 4, bmn, bmx, 0), KVMEM_ERR_INVALID_ARG, "empty");
    assert_status(g_be->iface->aabb_build(g_be, bk, 0, 0, 0, 4, 4, bmn, bmx, 0), KVMEM_ERR_INVALID_ARG, "empty");
    assert_status(g_be->iface->aabb_build(g_be, bk, 0, 1, 0, 17, 4, bmn, bmx, 0), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(g_be->iface->aabb_build(g_be, bk, 0, 2, 60, 4, 4, bmn, bmx, 0), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(g_be->iface->aabb_build(g_be, bk, 0, 1, 0, 4, 4, bmn, bmx, 52), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(g_be->iface->aabb_build(g_be, bk, 0, SIZE_MAX, SIZE_MAX, 4, 4, bmn, bmx, 0), KVMEM_ERR_INVALID_ARG,
                  "outside");
    bget(g_be, bmn, 0, got, sizeof got);
    assert_memory_equal(got, init, sizeof init);
    bget(g_be, bmx, 0, got, sizeof got);
    assert_memory_equal(got, init, sizeof init);
    g_be->iface->buffer_free(g_be, bk);
    g_be->iface->buffer_free(g_be, bmn);
    g_be->iface->buffer_free(g_be, bmx);
}

/* ---- registry ---- */

static void test_registry_reports_backend_and_auto_prefers_native_cpu(void **state) {
    (void)state;
    NEED_BACKEND();
    kvmem_backend_info info[8];
    size_t n = 0;
    assert_ok(kvmem_backends(info, 8, &n));
    int seen = 0;
    for (size_t i = 0; i < n && i < 8; i++) {
        if (strcmp(info[i].name, g_name) != 0) continue;
        seen = 1;
        assert_int_equal(info[i].available, 1);
        assert_true(strlen(info[i].detail) > 0);
        if (g_be->detail) assert_non_null(strstr(info[i].detail, g_be->detail) ? info[i].detail : NULL);
    }
    assert_true(seen || strcmp(g_name, "cpu") == 0);
    assert_string_equal(kvmem_context_backend(g_ctx), g_name);
    /* "auto": a CPU-type device (lavapipe) never wins over the native CPU backend */
    kvmem_context_params p = kvmem_context_default_params();
    kvmem_context *a = NULL;
    assert_ok(kvmem_context_create(&p, &a));
    if (g_be->cpu_device) assert_string_not_equal(kvmem_context_backend(a), g_name);
    assert_int_equal(a->backend->cpu_device, 0);
    kvmem_context_free(a);
    /* an op failing on the plugin leaves its message for kvmem_last_error() */
    kvmem_buffer *b = balloc(g_be, 4);
    assert_status(g_be->iface->buffer_upload(g_be, b, 8, "x", 1), KVMEM_ERR_INVALID_ARG, "outside the buffer");
    g_be->iface->buffer_free(g_be, b);
}

static void test_vulkan_device_choice_and_reasons(void **state) {
    (void)state;
    NEED_BACKEND();
    if (strcmp(g_name, "vulkan") != 0) skip();
    kvmem_context_params p = kvmem_context_default_params();
    p.backend = "vulkan";
    kvmem_context *c = NULL;
    /* by index and by name substring (any case) */
    setenv("KVMEM_VULKAN_DEVICE", "0", 1);
    assert_ok(kvmem_context_create(&p, &c));
    char name[64];
    snprintf(name, sizeof name, "%.4s", c->backend->detail); /* the device name starts the detail */
    kvmem_context_free(c);
    for (char *q = name; *q; q++) *q = (char)(*q >= 'a' && *q <= 'z' ? *q - 32 : *q);
    setenv("KVMEM_VULKAN_DEVICE", name, 1);
    assert_ok(kvmem_context_create(&p, &c));
    kvmem_context_free(c);
    setenv("KVMEM_VULKAN_DEVICE", "no-such-gpu-xyz", 1);
    assert_status(kvmem_context_create(&p, &c), KVMEM_ERR_UNSUPPORTED, "KVMEM_VULKAN_DEVICE='no-such-gpu-xyz'");
    assert_null(c);
    setenv("KVMEM_VULKAN_DEVICE", "99", 1);
    assert_status(kvmem_context_create(&p, &c), KVMEM_ERR_UNSUPPORTED, "no device");
    unsetenv("KVMEM_VULKAN_DEVICE");
    /* the plugin refuses a core of another backend API version, plainly */
    const char *dir = getenv("KVMEM_BACKEND_PATH");
    if (dir) {
        char path[1024];
        snprintf(path, sizeof path, "%s/libkvmem-vulkan.so", dir);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        assert_non_null(h);
        kvmem_backend_plugin_init_fn init;
        *(void **)(&init) = dlsym(h, KVMEM_BACKEND_PLUGIN_INIT);
        assert_non_null(*(void **)(&init));
        char why[256] = "";
        kvmem_backend *be = NULL;
        assert_int_equal(init(KVMEM_BACKEND_API_VERSION - 1, NULL, &be, why, sizeof why), KVMEM_ERR_UNSUPPORTED);
        assert_null(be);
        assert_non_null(strstr(why, "rebuild them together"));
        dlclose(h);
    }
}

/* ---- retrieval kernels reached by name (Vulkan, ahead of the table) ---- */

static void *proc(const char *name) {
    return g_be->iface->get_proc_address ? g_be->iface->get_proc_address(g_be, name) : NULL;
}

static kvmem_buffer *bfloat(const float *x, size_t n) {
    kvmem_buffer *b = balloc(g_be, n * 4);
    if (x) bput(g_be, b, 0, x, n * 4);
    return b;
}

/* Query layout [n_q][L][Hq][D], AABBs [L][Hkv][n_blocks][D] built from real
 * keys [L][Hkv][n_blocks][BS][D], scores [L*Hq][n_q][n_blocks]. */
static void score_case(kvm_vk_aabb_score_fn fn, size_t L, size_t Hq, size_t Hkv, size_t D, size_t n_q,
                       size_t n_blocks, size_t BS, size_t out_pad, uint64_t *rng) {
    size_t batch = L * Hq, g = Hq / Hkv;
    size_t nqe = n_q * L * Hq * D, nse = L * Hkv * n_blocks * D, nke = nse * BS;
    size_t noe = out_pad + batch * n_q * n_blocks;
    float *q = malloc(nqe * 4), *k = malloc(nke * 4), *mn = malloc(nse * 4), *mx = malloc(nse * 4);
    float *out = malloc(noe * 4);
    for (size_t i = 0; i < nqe; i++) q[i] = tu_normal(rng);
    for (size_t i = 0; i < nke; i++) k[i] = tu_normal(rng);
    for (size_t s = 0; s < L * Hkv * n_blocks; s++)
        for (size_t d = 0; d < D; d++) {
            float lo = INFINITY, hi = -INFINITY;
            for (size_t r = 0; r < BS; r++) {
                float x = k[(s * BS + r) * D + d];
                lo = fminf(lo, x);
                hi = fmaxf(hi, x);
            }
            mn[s * D + d] = lo;
            mx[s * D + d] = hi;
        }
    kvmem_buffer *bq = bfloat(q, nqe), *bmn = bfloat(mn, nse), *bmx = bfloat(mx, nse), *bo = bfloat(NULL, noe);
    float sentinel = -999.0f;
    for (size_t i = 0; i < out_pad; i++) bput(g_be, bo, i * 4, &sentinel, 4);
    kvm_vk_aabb_score_args a = {bq, bmn, bmx, bo, 0, 0, out_pad * 4, n_q, n_blocks, D, batch, g,
                                D, L * Hq * D, n_blocks * D, D, n_q * n_blocks, n_blocks};
    assert_ok(fn(g_be, &a));
    bget(g_be, bo, 0, out, noe * 4);
    for (size_t i = 0; i < out_pad; i++) assert_true(out[i] == sentinel);
    for (size_t b = 0; b < batch; b++)
        for (size_t r = 0; r < n_q; r++)
            for (size_t blk = 0; blk < n_blocks; blk++) {
                const float *qr = q + r * L * Hq * D + b * D;
                size_t s = (b / g) * n_blocks + blk;
                double ref = 0, mag = 0, best = -INFINITY;
                for (size_t d = 0; d < D; d++) {
                    double t1 = (double)qr[d] * mx[s * D + d], t2 = (double)qr[d] * mn[s * D + d];
                    ref += t1 > t2 ? t1 : t2;
                    mag += fabs((double)qr[d]) * fmax(fabs((double)mx[s * D + d]), fabs((double)mn[s * D + d]));
                }
                for (size_t i = 0; i < BS; i++) {
                    double dot = 0;
                    for (size_t d = 0; d < D; d++) dot += (double)qr[d] * k[(s * BS + i) * D + d];
                    best = dot > best ? dot : best;
                }
                double got = out[out_pad + (b * n_q + r) * n_blocks + blk], tol = (double)D * ldexp(1, -23) * mag;
                if (fabs(got - ref) > tol)
                    fail_msg("aabb_score b=%zu r=%zu blk=%zu: got %.9g, reference %.9g (tol %.3g)", b, r, blk, got,
                             ref, tol);
                if (got < best - tol) fail_msg("aabb_score below max_i q.k_i: %.9g < %.9g", got, best);
            }
    g_be->iface->buffer_free(g_be, bq);
    g_be->iface->buffer_free(g_be, bmn);
    g_be->iface->buffer_free(g_be, bmx);
    g_be->iface->buffer_free(g_be, bo);
    free(q);
    free(k);
    free(mn);
    free(mx);
    free(out);
}

static void test_vulkan_aabb_score_gemm_form_matches_reference(void **state) {
    (void)state;
    NEED_BACKEND();
    kvm_vk_aabb_score_fn fn;
    void *p = proc(KVM_VK_PROC_AABB_SCORE);
    if (!p) skip(); /* only the Vulkan plugin has it before the retrieval entries land */
    memcpy(&fn, &p, sizeof fn);
    uint64_t rng = 21;
    score_case(fn, 2, 4, 2, 64, 5, 37, 16, 0, &rng);   /* GQA 2:1, partial tiles */
    score_case(fn, 1, 2, 2, 40, 17, 33, 4, 3, &rng);   /* dim not a multiple of 16, output offset */
    score_case(fn, 1, 1, 1, 128, 1, 300, 16, 0, &rng); /* decode: one query row */
    /* bad input changes nothing */
    float z[8] = {0}, o[8];
    kvmem_buffer *b = bfloat(z, 8), *bo = bfloat(z, 8);
    kvm_vk_aabb_score_args a = {b, b, b, bo, 0, 0, 0, 1, 2, 4, 1, 1, 4, 4, 4, 4, 2, 2};
    assert_ok(fn(g_be, &a));
    a.n_q = 0;
    assert_status(fn(g_be, &a), KVMEM_ERR_INVALID_ARG, "empty");
    a.n_q = 1;
    a.n_blocks = 3;
    assert_status(fn(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    a.n_blocks = 2;
    a.out_off = 25 * 4;
    assert_status(fn(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    a.out_off = 2;
    assert_status(fn(g_be, &a), KVMEM_ERR_INVALID_ARG, "multiples of 4");
    a.out_off = 0;
    a.q_rs = SIZE_MAX;
    a.n_q = 2;
    assert_status(fn(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(fn(g_be, NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    bget(g_be, bo, 0, o, sizeof o);
    for (int i = 0; i < 8; i++) assert_true(o[i] == 0.0f);
    g_be->iface->buffer_free(g_be, b);
    g_be->iface->buffer_free(g_be, bo);
}


/* ---- threads: ops on one backend from several threads, and contexts
 * created and freed concurrently (the plugin's shared instance) ---- */

static void *thread_ops(void *arg) {
    uint64_t rng = (uint64_t)(uintptr_t)arg;
    int bad = 0;
    for (int it = 0; it < 20 && !bad; it++) {
        float x[257], y[257];
        uint16_t h[257];
        for (int i = 0; i < 257; i++) x[i] = tu_normal(&rng);
        kvmem_buffer *a = NULL, *b = NULL;
        if (g_be->iface->buffer_alloc(g_be, sizeof x, &a) || g_be->iface->buffer_alloc(g_be, sizeof h, &b)) {
            bad = 1;
        } else {
            bad |= g_be->iface->buffer_upload(g_be, a, 0, x, sizeof x) != KVMEM_OK;
            bad |= g_be->iface->convert(g_be, b, 0, KVMEM_BF16, a, 0, KVMEM_F32, 257) != KVMEM_OK;
            bad |= g_be->iface->convert(g_be, a, 0, KVMEM_F32, b, 0, KVMEM_BF16, 257) != KVMEM_OK;
            bad |= g_be->iface->buffer_download(g_be, a, 0, y, sizeof y) != KVMEM_OK;
            for (int i = 0; i < 257 && !bad; i++) bad |= fabsf(y[i] - x[i]) > fabsf(x[i]) * (1.0f / 128);
        }
        g_be->iface->buffer_free(g_be, a);
        g_be->iface->buffer_free(g_be, b);
    }
    return (void *)(uintptr_t)bad;
}

static void *thread_contexts(void *arg) {
    (void)arg;
    int bad = 0;
    for (int it = 0; it < 3; it++) {
        kvmem_context_params p = kvmem_context_default_params();
        p.backend = g_name;
        p.n_threads = 1;
        kvmem_context *c = NULL;
        bad |= kvmem_context_create(&p, &c) != KVMEM_OK;
        kvmem_context_free(c);
    }
    return (void *)(uintptr_t)bad;
}

static void test_threads_share_a_backend_and_create_contexts(void **state) {
    (void)state;
    NEED_BACKEND();
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, i < 3 ? thread_ops : thread_contexts, (void *)(i + 1)), 0);
    for (int i = 0; i < 4; i++) {
        void *r;
        assert_int_equal(pthread_join(t[i], &r), 0);
        assert_true(r == NULL);
    }
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_buffers_round_trip_exact_bytes),
    cmocka_unit_test(test_buffers_reject_out_of_range_and_change_nothing),
    cmocka_unit_test(test_convert_all_pairs_bit_exact),
    cmocka_unit_test(test_convert_every_f16_and_bf16_pattern),
    cmocka_unit_test(test_convert_rejects_bad_input_and_changes_nothing),
    cmocka_unit_test(test_aabb_build_matches_reference_exactly),
    cmocka_unit_test(test_aabb_build_long_group_exact_or_refused),
    cmocka_unit_test(test_aabb_build_rejects_bad_input_and_changes_nothing),
    cmocka_unit_test(test_registry_reports_backend_and_auto_prefers_native_cpu),
    cmocka_unit_test(test_vulkan_device_choice_and_reasons),
    cmocka_unit_test(test_vulkan_aabb_score_gemm_form_matches_reference),
    cmocka_unit_test(test_threads_share_a_backend_and_create_contexts),
};
CONF_MAIN(tests)
