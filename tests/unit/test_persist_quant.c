/* Quantized storage: every kernel table against the scalar reference (bit
 * for bit), the stated error bounds against a double-precision reference, the
 * MLX packing decoded independently, and pool round trips in every dtype. */
#include "testutil.h"
#include "internal.h"
#include "backend/route/context.h"
#include "cpu/half.h"
#include "cpu/kernels.h"
#include "quant/quant.h"
#include "cpu/quant_codec.h"
#include "pool/pool.h"

static size_t kvm_block_kv_bytes_for_test(kvmem_pool *p, int32_t n) { return kvm_block_kv_bytes(p, n); }

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const size_t dims[] = {128, 64, 96, 20, 2, 130, 256};

static void fill(float *x, size_t n, uint64_t *rng, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * tu_normal(rng);
    if (n > 3) x[3] = scale * 40.0f; /* an outlier */
}

static void f16_directed_rounding_brackets_the_value(void **state) {
    (void)state;
    uint64_t rng = 1;
    for (int i = 0; i < 20000; i++) {
        float x = tu_normal(&rng) * powf(10.0f, tu_uniform(&rng, -8.0f, 4.0f));
        float d = kvm_f16_to_f32(kvm_f16_round_down(x)), u = kvm_f16_to_f32(kvm_f16_round_up(x));
        assert_true(d <= x && x <= u);
        /* adjacent: no f16 strictly between them and x */
        assert_true(u - d <= fabsf(x) * 0.001f + 6e-8f);
    }
    assert_int_equal(kvm_f16_round_up(0.0f), 0);
    assert_true(kvm_f16_to_f32(kvm_f16_round_down(-1e-9f)) < 0.0f);
}

/* Decode Q4 codes by the MLX rule, independently of kvmem's decoder. */
static unsigned code_at(const uint32_t *row_words, size_t i) { return (row_words[i / 8] >> (4 * (i % 8))) & 15u; }

static void q4_codes_follow_the_mlx_layout_and_bound(void **state) {
    (void)state;
    uint64_t rng = 7;
    const kvm_quant_kernels *ref = (&kvm_quant_scalar);
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
        size_t D = dims[di], n = 5, W = (D + 7) / 8, G = (D + 63) / 64;
        float *x = malloc(n * D * 4), *y = malloc(n * D * 4);
        uint32_t *w = calloc(n * W, 4);
        uint16_t *s = calloc(n * G, 2), *b = calloc(n * G, 2);
        fill(x, n * D, &rng, 0.7f);
        ref->q4_quant(x, n, D, w, s, b);
        ref->q4_dequant(w, s, b, n, D, y);
        for (size_t r = 0; r < n; r++)
            for (size_t g = 0; g < G; g++) {
                size_t i0 = g * 64, k = D - i0 < 64 ? D - i0 : 64;
                double mn = 1e30, mx = -1e30;
                for (size_t i = 0; i < k; i++) mn = fmin(mn, x[r * D + i0 + i]), mx = fmax(mx, x[r * D + i0 + i]);
                double sc = kvm_f16_to_f32(s[r * G + g]), bi = kvm_f16_to_f32(b[r * G + g]);
                /* the header's bound on the scale */
                double ulp = fabs(mn) * 0x1p-10 + 6e-8;
                assert_true(sc <= (mx - mn + ulp) / 15.0 * (1 + 0x1p-10) + 1e-12);
                assert_true(bi <= mn);
                for (size_t i = 0; i < k; i++) {
                    size_t at = r * D + i0 + i;
                    double ind = (double)code_at(w + r * W, i0 + i) * sc + bi; /* independent decode */
                    assert_true(fabs(ind - y[at]) <= 1e-6 * (fabs(ind) + 1));
                    double err = fabs((double)x[at] - ind);
                    if (!(err <= sc / 2 + 0x1p-20 * (fabs(x[at]) + fabs(bi)) + 1e-12))
                        fail_msg("D=%zu row %zu i %zu: |%g - %g| = %g > s/2 = %g", D, r, i0 + i, x[at], ind, err, sc / 2);
                }
            }
        /* unused nibbles of a partial last word are zero */
        if (D % 8)
            for (size_t r = 0; r < n; r++) assert_int_equal(w[r * W + W - 1] >> (4 * (D % 8)), 0);
        free(x), free(y), free(w), free(s), free(b);
    }
}

static void q8_within_bound(void **state) {
    (void)state;
    uint64_t rng = 9;
    const kvm_quant_kernels *ref = (&kvm_quant_scalar);
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
        size_t D = dims[di], n = 4, G = (D + 31) / 32;
        float *x = malloc(n * D * 4), *y = malloc(n * D * 4);
        int8_t *q = calloc(n * D, 1);
        uint16_t *s = calloc(n * G, 2);
        fill(x, n * D, &rng, 3.0f);
        ref->q8_quant(x, n, D, s, q);
        ref->q8_dequant(s, q, n, D, y);
        for (size_t r = 0; r < n; r++)
            for (size_t g = 0; g < G; g++) {
                size_t i0 = g * 32, k = D - i0 < 32 ? D - i0 : 32;
                double amax = 0;
                for (size_t i = 0; i < k; i++) amax = fmax(amax, fabs(x[r * D + i0 + i]));
                for (size_t i = 0; i < k; i++) {
                    size_t at = r * D + i0 + i;
                    assert_true(q[at] >= -127 && q[at] <= 127);
                    assert_true(fabs((double)q[at] * kvm_f16_to_f32(s[r * G + g]) - y[at]) <= 1e-6 * (amax + 1));
                    assert_true(fabs((double)x[at] - y[at]) <= amax / 254.0 * (1 + 0x1p-10) + 1e-6 * fabs(x[at]) + 1e-12);
                }
            }
        free(x), free(y), free(q), free(s);
    }
}

static void kivi_keys_use_channel_groups(void **state) {
    (void)state;
    uint64_t rng = 11;
    size_t D = 96, n = 16, W = 12;
    float x[16 * 96], y[16 * 96], mn[96], mx[96];
    fill(x, n * D, &rng, 1.0f);
    for (size_t r = 0; r < n; r++) x[r * D + 5] = 100.0f + (float)r; /* an outlier channel */
    for (size_t d = 0; d < D; d++) {
        mn[d] = mx[d] = x[d];
        for (size_t r = 1; r < n; r++) mn[d] = fminf(mn[d], x[r * D + d]), mx[d] = fmaxf(mx[d], x[r * D + d]);
    }
    uint32_t w[16 * 12];
    uint16_t s[96], b[96];
    kvm_quant_scalar.q4c_quant(x, n, D, mn, mx, w, s, b);
    kvm_quant_scalar.q4c_dequant(w, s, b, n, D, y);
    for (size_t r = 0; r < n; r++)
        for (size_t d = 0; d < D; d++) {
            double sc = kvm_f16_to_f32(s[d]);
            double ind = (double)code_at(w + r * W, d) * sc + kvm_f16_to_f32(b[d]);
            assert_true(fabs(ind - y[r * D + d]) <= 1e-6 * (fabs(ind) + 1));
            assert_true(fabs(x[r * D + d] - ind) <= sc / 2 + 1e-5 * (fabs(x[r * D + d]) + 1));
        }
    /* the outlier channel does not widen the others' steps */
    assert_true(kvm_f16_to_f32(s[0]) < 1.0f && kvm_f16_to_f32(s[5]) < 1.5f);
}

static void simd_tables_match_scalar_bit_for_bit(void **state) {
    (void)state;
    const kvm_quant_kernels *tabs[2] = {kvm_cpu_has_avx2() ? &kvm_quant_avx2 : NULL,
                                        kvm_cpu_has_avx512() ? &kvm_quant_avx512 : NULL};
    const kvm_quant_kernels *ref = (&kvm_quant_scalar);
    int ran = 0;
    uint64_t rng = 3;
    for (int t = 0; t < 2; t++) {
        const kvm_quant_kernels *k = tabs[t];
        if (!k) continue;
        ran++;
        for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
            size_t D = dims[di], n = 7, W = (D + 7) / 8, G4 = (D + 63) / 64, G8 = (D + 31) / 32;
            float *x = malloc(n * D * 4), *y1 = malloc(n * D * 4), *y2 = malloc(n * D * 4), mn[260], mx[260];
            fill(x, n * D, &rng, 2.0f);
            for (size_t d = 0; d < D; d++) {
                mn[d] = mx[d] = x[d];
                for (size_t r = 1; r < n; r++) mn[d] = fminf(mn[d], x[r * D + d]), mx[d] = fmaxf(mx[d], x[r * D + d]);
            }
            uint32_t *w1 = calloc(n * W, 4), *w2 = calloc(n * W, 4);
            uint16_t *s1 = calloc(n * D, 2), *s2 = calloc(n * D, 2), *b1 = calloc(n * D, 2), *b2 = calloc(n * D, 2);
            int8_t *q1 = calloc(n * D, 1), *q2 = calloc(n * D, 1);
            ref->q4_quant(x, n, D, w1, s1, b1);
            k->q4_quant(x, n, D, w2, s2, b2);
            assert_memory_equal(w1, w2, n * W * 4);
            assert_memory_equal(s1, s2, n * G4 * 2);
            assert_memory_equal(b1, b2, n * G4 * 2);
            ref->q4_dequant(w1, s1, b1, n, D, y1);
            k->q4_dequant(w1, s1, b1, n, D, y2);
            assert_memory_equal(y1, y2, n * D * 4);
            ref->q8_quant(x, n, D, s1, q1);
            k->q8_quant(x, n, D, s2, q2);
            assert_memory_equal(q1, q2, n * D);
            assert_memory_equal(s1, s2, n * G8 * 2);
            ref->q8_dequant(s1, q1, n, D, y1);
            k->q8_dequant(s1, q1, n, D, y2);
            assert_memory_equal(y1, y2, n * D * 4);
            ref->q4c_quant(x, n, D, mn, mx, w1, s1, b1);
            k->q4c_quant(x, n, D, mn, mx, w2, s2, b2);
            assert_memory_equal(w1, w2, n * W * 4);
            ref->q4c_dequant(w1, s1, b1, n, D, y1);
            k->q4c_dequant(w1, s1, b1, n, D, y2);
            assert_memory_equal(y1, y2, n * D * 4);
            free(x), free(y1), free(y2), free(w1), free(w2), free(s1), free(s2), free(b1), free(b2), free(q1), free(q2);
        }
    }
    if (!ran) skip();
}

/* The AABB corners' rounding: every table's f16 toward +inf / -inf is the
 * nearest f16 at or above / at or below the input (an independent table of
 * all f16 values), across subnormals, exact f16 values, signs and the top of
 * the range; vector bodies and scalar tails alike (n = 1037). */
static void directed_f16_rounding_brackets_its_input_on_every_table(void **state) {
    (void)state;
    const kvm_quant_kernels *tabs[3] = {(&kvm_quant_scalar), kvm_cpu_has_avx2() ? &kvm_quant_avx2 : NULL,
                                        kvm_cpu_has_avx512() ? &kvm_quant_avx512 : NULL};
    enum { N = 1037 };
    float x[N];
    uint16_t up[N], dn[N];
    uint64_t rng = 91;
    for (int i = 0; i < N; i++) {
        float m = tu_uniform(&rng, -1.0f, 1.0f);
        switch (i % 6) {
        case 0: x[i] = m * 65504.0f; break;              /* the whole range */
        case 1: x[i] = m * 6.1e-5f; break;               /* subnormal f16 */
        case 2: x[i] = m * 3.0f; break;
        case 3: x[i] = (float)tu_f16_above(m * 100.0); break; /* exactly an f16 value */
        case 4: x[i] = i % 12 == 4 ? 0.0f : -0.0f; break;
        default: x[i] = m * 65000.0f + (m > 0 ? 500.0f : -500.0f); break; /* near the top */
        }
    }
    for (int t = 0; t < 3; t++) {
        if (!tabs[t]) continue;
        tabs[t]->f16_round(x, N, 1, up);
        tabs[t]->f16_round(x, N, 0, dn);
        for (int i = 0; i < N; i++) {
            float u = kvm_f16_to_f32(up[i]), d = kvm_f16_to_f32(dn[i]);
            if (!(u == (float)tu_f16_above(x[i]) && d == (float)tu_f16_below(x[i]) && d <= x[i] && x[i] <= u))
                fail_msg("%s: %.9g rounds to [%.9g, %.9g], want [%.9g, %.9g]", tabs[t]->name, (double)x[i], (double)d,
                         (double)u, tu_f16_below(x[i]), tu_f16_above(x[i]));
        }
    }
}

/* The loader's check of f16 boxes: every table counts the non-finite values
 * and the boxes with some min > max exactly as the decoded floats say
 * (+0 and -0 are equal, so a box [+0, -0] is sane). */
static void f16_box_check_counts_what_the_floats_say(void **state) {
    (void)state;
    const kvm_quant_kernels *tabs[3] = {(&kvm_quant_scalar), kvm_cpu_has_avx2() ? &kvm_quant_avx2 : NULL,
                                        kvm_cpu_has_avx512() ? &kvm_quant_avx512 : NULL};
    const size_t box_dims[] = {16, 48, 64, 128, 40};
    uint64_t rng = 17;
    for (size_t di = 0; di < sizeof box_dims / sizeof *box_dims; di++) {
        const size_t D = box_dims[di], n = 9;
        uint16_t *b = malloc(n * 2 * D * 2);
        for (size_t i = 0; i < n; i++)
            for (size_t d = 0; d < D; d++) {
                float x = tu_normal(&rng), y = tu_normal(&rng);
                b[i * 2 * D + d] = kvm_f32_to_f16(fmaxf(x, y));
                b[i * 2 * D + D + d] = kvm_f32_to_f16(fminf(x, y));
            }
        b[1 * 2 * D + 3] = 0x7c00;           /* +Inf max: one non-finite value */
        b[2 * 2 * D + D + 5] = 0xfe01;       /* NaN min */
        b[3 * 2 * D + 7] = kvm_f32_to_f16(-3.0f), b[3 * 2 * D + D + 7] = kvm_f32_to_f16(2.0f); /* inverted */
        b[4 * 2 * D + 1] = 0x8000, b[4 * 2 * D + D + 1] = 0x0000; /* max -0, min +0: equal, sane */
        b[5 * 2 * D + D - 1] = kvm_f32_to_f16(1.0f), b[5 * 2 * D + 2 * D - 1] = kvm_f32_to_f16(1.0f); /* min == max */
        b[0 * 2 * D + 9] = 0xfc00, b[0 * 2 * D + D + 9] = 0xfc00; /* -Inf both: two non-finite, not inverted */
        b[5 * 2 * D + 0] = 0x7c00, b[5 * 2 * D + D + 0] = 0x7c00; /* +Inf both */
        size_t want = 0;
        for (size_t i = 0; i < n; i++) {
            int inv = 0;
            for (size_t d = 0; d < D; d++) {
                float hi = kvm_f16_to_f32(b[i * 2 * D + d]), lo = kvm_f16_to_f32(b[i * 2 * D + D + d]);
                want += (size_t)!isfinite(hi) + (size_t)!isfinite(lo);
                inv |= lo > hi;
            }
            want += (size_t)inv;
        }
        assert_int_equal(want, 7);
        for (int t = 0; t < 3; t++)
            if (tabs[t]) {
                assert_int_equal(tabs[t]->f16_boxes_bad(b, n, D), want);
                assert_int_equal(tabs[t]->f16_boxes_bad(b + 6 * 2 * D, 3, D), 0); /* the sane ones */
            }
        free(b);
    }
}

/* ---- pool round trips ---- */

static double bound_for(kvmem_dtype dt, const float *row, size_t D, size_t i) {
    if (dt == KVMEM_F32) return 0;
    if (dt == KVMEM_F16) return fabs(row[i]) * 0x1p-11 + 3e-8;
    if (dt == KVMEM_BF16) return fabs(row[i]) * 0x1p-8;
    size_t gs = dt == KVMEM_Q8 ? 32 : 64, g0 = i / gs * gs, g1 = g0 + gs < D ? g0 + gs : D;
    double mn = 1e30, mx = -1e30, amax = 0;
    for (size_t j = g0; j < g1; j++) mn = fmin(mn, row[j]), mx = fmax(mx, row[j]), amax = fmax(amax, fabs(row[j]));
    if (dt == KVMEM_Q8) return amax / 254.0 * (1 + 0x1p-10) + 1e-6 * fabs(row[i]);
    return (mx - mn + fabs(mn) * 0x1p-10 + 6e-8) / 30.0 * (1 + 0x1p-9) + 0x1p-20 * (fabs(row[i]) + fabs(mn));
}

static void every_storage_dtype_round_trips_within_its_bound(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    const kvmem_dtype dts[] = {KVMEM_F32, KVMEM_F16, KVMEM_BF16, KVMEM_Q8, KVMEM_Q4, KVMEM_Q4_KIVI};
    const int32_t Ds[] = {64, 80};
    for (size_t di = 0; di < 2; di++)
        for (size_t t = 0; t < sizeof dts / sizeof *dts; t++) {
            const int32_t L = 2, H = 2, D = Ds[di], T = 37;
            kvmem_model_spec spec = tu_spec(L, D);
            kvmem_pool_params pp = kvmem_pool_default_params();
            pp.storage_dtype = dts[t];
            pp.block_size = 16;
            kvmem_pool *pool;
            assert_ok(kvmem_pool_create(ctx, &spec, &pp, &pool));
            kvmem_agent *a;
            assert_ok(kvmem_agent_open(pool, "rt", &a));
            size_t n = (size_t)L * T * H * D;
            float *k = malloc(n * 4), *v = malloc(n * 4), *k2 = malloc(n * 4), *v2 = malloc(n * 4);
            uint64_t rng = 100 + t;
            tu_fill_kv(k, n, &rng);
            tu_fill_kv(v, n, &rng);
            kvmem_tensor tk, tv, tk2, tv2;
            int64_t shape[4] = {L, T, H, D};
            assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape));
            assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape));
            assert_ok(kvmem_tensor_init(&tk2, k2, KVMEM_F32, 4, shape));
            assert_ok(kvmem_tensor_init(&tv2, v2, KVMEM_F32, 4, shape));
            assert_ok(kvmem_agent_append(a, &tk, &tv, NULL));
            assert_ok(kvmem_agent_read(a, 0, T, &tk2, &tv2));
            for (int64_t tok = 0; tok < T; tok++)
                for (int32_t l = 0; l < L; l++)
                    for (int32_t h = 0; h < H; h++) {
                        size_t base = (((size_t)l * T + (size_t)tok) * H + (size_t)h) * D;
                        int sealed = tok < 32;
                        for (int32_t d = 0; d < D; d++) {
                            /* the unsealed tail is f32 staging: exact */
                            double bk = sealed ? bound_for(dts[t], k + base, (size_t)D, (size_t)d) : 0;
                            double bv = sealed ? bound_for(dts[t], v + base, (size_t)D, (size_t)d) : 0;
                            if (dts[t] == KVMEM_Q4_KIVI && sealed) { /* keys: channel groups over the block */
                                double mn = 1e30, mx = -1e30;
                                for (int32_t r = 0; r < 16; r++) {
                                    float x = k[(((size_t)l * T + (size_t)(tok / 16 * 16 + r)) * H + (size_t)h) * D + (size_t)d];
                                    mn = fmin(mn, x), mx = fmax(mx, x);
                                }
                                bk = (mx - mn + fabs(mn) * 0x1p-10 + 6e-8) / 30.0 * (1 + 0x1p-9) + 1e-6 * (fabs(mn) + fabs(k[base + d]));
                            }
                            if (!(fabs(k[base + d] - k2[base + d]) <= bk) || !(fabs(v[base + d] - v2[base + d]) <= bv))
                                fail_msg("%s D=%d token %lld l %d h %d d %d: k %g->%g (bound %g), v %g->%g (bound %g)",
                                         kvmem_dtype_name(dts[t]), D, (long long)tok, l, h, d, k[base + d], k2[base + d], bk,
                                         v[base + d], v2[base + d], bv);
                        }
                    }
            /* AABBs come from the unquantized keys: exact in F32 and BF16 pools, in f16
             * rounded outward (the nearest f16 below the min, above the max) otherwise */
            const int f16box = dts[t] != KVMEM_F32 && dts[t] != KVMEM_BF16;
            float mn[2 * 2 * 80], mx[2 * 2 * 80];
            assert_ok(kvmem_agent_block_aabb(a, 1, mn, mx));
            for (int32_t l = 0; l < L; l++)
                for (int32_t h = 0; h < H; h++)
                    for (int32_t d = 0; d < D; d++) {
                        float lo = INFINITY, hi = -INFINITY;
                        for (int32_t r = 16; r < 32; r++) {
                            float x = k[(((size_t)l * T + (size_t)r) * H + (size_t)h) * D + (size_t)d];
                            lo = fminf(lo, x), hi = fmaxf(hi, x);
                        }
                        size_t o = ((size_t)l * H + (size_t)h) * D + (size_t)d;
                        if (f16box)
                            assert_true(mn[o] == (float)tu_f16_below(lo) && mx[o] == (float)tu_f16_above(hi));
                        else
                            assert_true(mn[o] == lo && mx[o] == hi);
                        assert_true(mn[o] <= lo && hi <= mx[o]);
                    }
            /* the reported size is the encoded size */
            kvmem_agent_info info;
            assert_ok(kvmem_agent_get_info(a, &info));
            kvmem_pool_info pi;
            assert_ok(kvmem_pool_get_info(pool, &pi));
            assert_int_equal(pi.used_bytes, info.bytes);
            kvmem_agent_close(a);
            kvmem_pool_free(pool);
            free(k), free(v), free(k2), free(v2);
        }
    kvmem_context_free(ctx);
}

static void q4_blocks_are_about_3_5x_smaller_than_f16(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_model_spec spec = tu_spec(4, 128);
    kvmem_pool_params pp = kvmem_pool_default_params();
    kvmem_pool *p16, *p4;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &p16));
    pp.storage_dtype = KVMEM_Q4;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &p4));
    /* 128 values: 16 words + 2 f16 scales + 2 f16 biases = 72 bytes vs 256 */
    assert_int_equal(kvm_block_kv_bytes_for_test(p4, 16), 2 * 4 * 2 * 16 * 72);
    assert_int_equal(kvm_block_kv_bytes_for_test(p16, 16), 2 * 4 * 2 * 16 * 256);
    kvmem_pool_free(p16);
    kvmem_pool_free(p4);
    kvmem_context_free(ctx);
}

static void quantized_pool_refuses_values_beyond_f16(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_model_spec spec = tu_spec(1, 64);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.storage_dtype = KVMEM_Q4;
    kvmem_pool *pool;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &pool));
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(pool, "big", &a));
    float k[2 * 64] = {0}, v[2 * 64] = {0};
    k[70] = 70000.0f;
    kvmem_tensor tk, tv;
    int64_t shape[4] = {1, 1, 2, 64};
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape));
    assert_status(kvmem_agent_append(a, &tk, &tv, NULL), KVMEM_ERR_INVALID_ARG, "storage range");
    kvmem_agent_info info;
    assert_ok(kvmem_agent_get_info(a, &info));
    assert_int_equal(info.n_tokens, 0);
    pp.storage_dtype = (kvmem_dtype)9;
    kvmem_pool *bad = NULL;
    assert_status(kvmem_pool_create(ctx, &spec, &pp, &bad), KVMEM_ERR_INVALID_ARG, "unknown");
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(f16_directed_rounding_brackets_the_value),
        cmocka_unit_test(q4_codes_follow_the_mlx_layout_and_bound),
        cmocka_unit_test(q8_within_bound),
        cmocka_unit_test(kivi_keys_use_channel_groups),
        cmocka_unit_test(simd_tables_match_scalar_bit_for_bit),
        cmocka_unit_test(directed_f16_rounding_brackets_its_input_on_every_table),
        cmocka_unit_test(f16_box_check_counts_what_the_floats_say),
        cmocka_unit_test(every_storage_dtype_round_trips_within_its_bound),
        cmocka_unit_test(q4_blocks_are_about_3_5x_smaller_than_f16),
        cmocka_unit_test(quantized_pool_refuses_values_beyond_f16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
