/* The scoring kernels: SIMD tables equal the scalar reference (within a
 * stated reduction tolerance), the vector exp is accurate, and the AABB
 * score upper-bounds the best key of the block. */
#include "testutil.h"
#include "retrieve/score.h"
#include "cpu/half.h"
#include "cpu/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const kvm_score_kernels *simd_tables(int i) {
    const kvm_cpu_kernels *k = kvm_cpu_kernels_named(i == 0 ? "avx2" : "avx512");
    return k ? k->score : NULL;
}

/* |simd - scalar| <= 1e-5 * sum_k |q_k b_k| (different summation order) */
static void compare(const kvm_score_kernels *t, size_t R, size_t n, size_t K, uint64_t *rng) {
    const kvm_score_kernels *s = (&kvm_score_scalar);
    size_t rp = (R + KVM_SCORE_ROW_PAD - 1) / KVM_SCORE_ROW_PAD * KVM_SCORE_ROW_PAD;
    float *q = malloc(R * K * sizeof(float)), *qt = calloc(K * rp, sizeof(float));
    float *b = malloc(n * K * sizeof(float) + 64);
    const float **bp = malloc(n * sizeof *bp);
    float *o1 = malloc(n * rp * sizeof(float)), *o2 = malloc(n * rp * sizeof(float));
    double *mag = calloc(n * R, sizeof(double));
    for (size_t i = 0; i < R * K; i++) q[i] = tu_normal(rng);
    for (size_t r = 0; r < R; r++)
        for (size_t k = 0; k < K; k++) qt[k * rp + r] = q[r * K + k];
    for (size_t i = 0; i < n * K; i++) b[i + 1] = tu_normal(rng); /* unaligned rows */
    for (size_t j = 0; j < n; j++) bp[j] = b + 1 + j * K;
    for (size_t j = 0; j < n; j++)
        for (size_t r = 0; r < R; r++)
            for (size_t k = 0; k < K; k++) mag[j * R + r] += fabs((double)q[r * K + k] * bp[j][k]);
    /* row kernel */
    s->rows(q, R, bp, n, K, o1, R);
    t->rows(q, R, bp, n, K, o2, R);
    for (size_t j = 0; j < n; j++)
        for (size_t r = 0; r < R; r++)
            if (!(fabs(o1[j * R + r] - o2[j * R + r]) <= 1e-5 * mag[j * R + r] + 1e-30))
                fail_msg("%s rows R=%zu n=%zu K=%zu: [%zu][%zu] %g vs scalar %g", t->name, R, n, K, j, r,
                         (double)o2[j * R + r], (double)o1[j * R + r]);
    /* panel kernel */
    s->panel(qt, rp, bp, n, K, o1, rp);
    t->panel(qt, rp, bp, n, K, o2, rp);
    for (size_t j = 0; j < n; j++)
        for (size_t r = 0; r < rp; r++) {
            double m = r < R ? mag[j * R + r] : 0;
            if (!(fabs(o1[j * rp + r] - o2[j * rp + r]) <= 1e-5 * m + 1e-30))
                fail_msg("%s panel R=%zu n=%zu K=%zu: [%zu][%zu] %g vs scalar %g", t->name, R, n, K, j, r,
                         (double)o2[j * rp + r], (double)o1[j * rp + r]);
        }
    free(q);
    free(qt);
    free(b);
    free((void *)bp);
    free(o1);
    free(o2);
    free(mag);
}

static void simd_kernels_equal_scalar(void **state) {
    (void)state;
    int ran = 0;
    uint64_t rng = 77;
    const size_t Rs[] = {1, 3, 4, 5, 9, 16, 17, 40, 64, 100, 128};
    const size_t ns[] = {1, 2, 5, 6, 7, 13, 70};
    const size_t Ks[] = {2, 6, 16, 34, 128, 256};
    for (int i = 0; i < 2; i++) {
        const kvm_score_kernels *t = simd_tables(i);
        if (!t) continue;
        ran++;
        for (size_t a = 0; a < sizeof Rs / sizeof *Rs; a++)
            for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
                for (size_t c = 0; c < sizeof Ks / sizeof *Ks; c++) compare(t, Rs[a], ns[b], Ks[c], &rng);
    }
    if (!ran) skip(); /* skipped: this CPU has neither AVX2 nor AVX-512 */
}

/* The AABB row kernels on stored boxes, f16 and f32, against a double
 * reference of [q+ || q-] . [s_max || s_min] written out here (so the
 * sign-select form is checked against the definition, not against itself):
 * |kernel - reference| <= 1e-5 * sum_d |q_d| max(|s_max,d|, |s_min,d|), for
 * every table, row counts that exercise full and partial tiles, block counts
 * that leave remainders, head sizes with and without a vector tail, and
 * queries with exact zeros. */
static void aabb_row_kernels_equal_the_definition(void **state) {
    (void)state;
    const kvm_score_kernels *tabs[3] = {(&kvm_score_scalar), simd_tables(0), simd_tables(1)};
    const size_t Rs[] = {1, 2, 3, 4, 5, 8, 13}, ns[] = {1, 2, 3, 4, 5, 7}, Ds[] = {8, 24, 64, 72, 128};
    uint64_t rng = 31;
    for (int t = 0; t < 3; t++) {
        if (!tabs[t]) continue;
        for (size_t a = 0; a < sizeof Rs / sizeof *Rs; a++)
            for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
                for (size_t c = 0; c < sizeof Ds / sizeof *Ds; c++) {
                    const size_t R = Rs[a], n = ns[b], D = Ds[c];
                    float *q = malloc(R * D * 4), *bf = malloc(n * 2 * D * 4 + 64), *o16 = malloc(n * R * 4),
                          *o32 = malloc(n * R * 4);
                    uint16_t *bh = malloc(n * 2 * D * 2 + 64);
                    const float **p32 = malloc(n * sizeof *p32);
                    const uint16_t **p16 = malloc(n * sizeof *p16);
                    for (size_t i = 0; i < R * D; i++) q[i] = i % 7 == 3 ? 0.0f : tu_normal(&rng);
                    for (size_t j = 0; j < n; j++) {
                        for (size_t d = 0; d < D; d++) {
                            float x = tu_normal(&rng) * 4.0f, y = tu_normal(&rng) * 4.0f;
                            float lo = fminf(x, y), hi = fmaxf(x, y);
                            /* f16 boxes hold f16 values: the same box in both element types */
                            bh[j * 2 * D + 1 + d] = kvm_f32_to_f16(hi), bh[j * 2 * D + 1 + D + d] = kvm_f32_to_f16(lo);
                            bf[j * 2 * D + 1 + d] = kvm_f16_to_f32(bh[j * 2 * D + 1 + d]);
                            bf[j * 2 * D + 1 + D + d] = kvm_f16_to_f32(bh[j * 2 * D + 1 + D + d]);
                        }
                        p32[j] = bf + 1 + j * 2 * D; /* unaligned boxes */
                        p16[j] = bh + 1 + j * 2 * D;
                    }
                    tabs[t]->aabb_rows_f16(q, R, p16, n, D, o16, R);
                    tabs[t]->aabb_rows_f32(q, R, p32, n, D, o32, R);
                    for (size_t j = 0; j < n; j++)
                        for (size_t r = 0; r < R; r++) {
                            double ref = 0, mag = 0;
                            for (size_t d = 0; d < D; d++) {
                                double x = q[r * D + d], hi = p32[j][d], lo = p32[j][D + d];
                                ref += (x > 0 ? x : 0) * hi + (x < 0 ? x : 0) * lo;
                                mag += fabs(x) * fmax(fabs(hi), fabs(lo));
                            }
                            if (!(fabs(o16[j * R + r] - ref) <= 1e-5 * mag + 1e-30) ||
                                !(fabs(o32[j * R + r] - ref) <= 1e-5 * mag + 1e-30))
                                fail_msg("%s aabb rows R=%zu n=%zu D=%zu [%zu][%zu]: f16 %g, f32 %g, reference %g",
                                         tabs[t]->name, R, n, D, j, r, (double)o16[j * R + r], (double)o32[j * R + r], ref);
                        }
                    free(q), free(bf), free(o16), free(o32), free(bh), free((void *)p32), free((void *)p16);
                }
    }
}

/* The EXACT kernels on one stored section of keys, f16 and f32, against a
 * double reference of max_i q_r . k_i written out here: |kernel - reference|
 * <= 1e-5 * max_i sum_d |q_d k_id|, for every table, row counts that fill
 * tiles of 4 rows and leave 1-3, key counts that leave tile remainders,
 * head sizes with and without a vector tail, keys at unaligned addresses,
 * and a row whose best key is not the first (the max really is taken). */
static void exact_kernels_equal_the_definition(void **state) {
    (void)state;
    const kvm_score_kernels *tabs[3] = {(&kvm_score_scalar), simd_tables(0), simd_tables(1)};
    const size_t Rs[] = {1, 2, 3, 4, 5, 8, 13}, ns[] = {1, 2, 3, 4, 5, 7, 16, 17}, Ds[] = {8, 24, 64, 72, 128};
    uint64_t rng = 43;
    for (int t = 0; t < 3; t++) {
        if (!tabs[t]) continue;
        for (size_t a = 0; a < sizeof Rs / sizeof *Rs; a++)
            for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
                for (size_t c = 0; c < sizeof Ds / sizeof *Ds; c++) {
                    const size_t R = Rs[a], n = ns[b], D = Ds[c];
                    float *q = malloc(R * D * 4), *kf = malloc(n * D * 4 + 64), *o16 = malloc(R * 4), *o32 = malloc(R * 4);
                    uint16_t *kh = malloc(n * D * 2 + 64);
                    for (size_t i = 0; i < R * D; i++) q[i] = tu_normal(&rng);
                    for (size_t i = 0; i < n * D; i++) { /* f16 keys hold f16 values: the same keys in both types */
                        kh[1 + i] = kvm_f32_to_f16(tu_normal(&rng) * 2.0f);
                        kf[1 + i] = kvm_f16_to_f32(kh[1 + i]);
                    }
                    if (n > 1) /* the last key of the first row's best direction: the max is not row 0 */
                        for (size_t d = 0; d < D; d++) kh[1 + (n - 1) * D + d] = kvm_f32_to_f16(8.0f * q[d]),
                                                       kf[1 + (n - 1) * D + d] = kvm_f16_to_f32(kh[1 + (n - 1) * D + d]);
                    tabs[t]->exact_f16(q, R, kh + 1, n, D, o16);
                    tabs[t]->exact_f32(q, R, kf + 1, n, D, o32);
                    for (size_t r = 0; r < R; r++) {
                        double ref = -INFINITY, mag = 0;
                        size_t best = 0;
                        for (size_t i = 0; i < n; i++) {
                            double s = 0, m = 0;
                            for (size_t d = 0; d < D; d++) {
                                s += (double)q[r * D + d] * kf[1 + i * D + d];
                                m += fabs((double)q[r * D + d] * kf[1 + i * D + d]);
                            }
                            if (s > ref) ref = s, best = i;
                            mag = fmax(mag, m);
                        }
                        if (r == 0 && n > 1) assert_int_equal(best, n - 1);
                        if (!(fabs(o16[r] - ref) <= 1e-5 * mag + 1e-30) || !(fabs(o32[r] - ref) <= 1e-5 * mag + 1e-30))
                            fail_msg("%s exact R=%zu n=%zu D=%zu row %zu: f16 %g, f32 %g, reference %g", tabs[t]->name, R,
                                     n, D, r, (double)o16[r], (double)o32[r], ref);
                    }
                    free(q), free(kf), free(o16), free(o32), free(kh);
                }
    }
}

/* The fused softmax's column operations and the dot product, every table
 * against plain loops: col_max exactly, col_exp_sum and dot within f32
 * rounding (exp_neg's accuracy; sums in another order). */
static void column_kernels_equal_plain_loops(void **state) {
    (void)state;
    const kvm_score_kernels *tabs[3] = {(&kvm_score_scalar), simd_tables(0), simd_tables(1)};
    uint64_t rng = 44;
    const size_t rows = 9, cols = 37, ld = 41;
    float x[9 * 41], e[9 * 41], m[41], z[41], mref[41];
    for (size_t i = 0; i < rows * ld; i++) x[i] = tu_normal(&rng) * 3.0f;
    for (size_t c = 0; c < cols; c++) {
        mref[c] = x[c];
        for (size_t r = 1; r < rows; r++) mref[c] = fmaxf(mref[c], x[r * ld + c]);
    }
    for (int t = 0; t < 3; t++) {
        if (!tabs[t]) continue;
        for (size_t c = 0; c < cols; c++) m[c] = -INFINITY, z[c] = 0.0f;
        tabs[t]->col_max(x, rows, ld, cols, m);
        for (size_t c = 0; c < cols; c++) assert_true(m[c] == mref[c]);
        memcpy(e, x, sizeof x);
        tabs[t]->col_exp_sum(e, rows, ld, cols, m, 0.7f, z);
        for (size_t c = 0; c < cols; c++) {
            double zs = 0;
            for (size_t r = 0; r < rows; r++) {
                double want = exp(0.7 * ((double)x[r * ld + c] - m[c]));
                zs += want;
                if (!(fabs(e[r * ld + c] - want) <= 1e-6 * want + 1e-30))
                    fail_msg("%s col_exp_sum [%zu][%zu]: %g, want %g", tabs[t]->name, r, c, (double)e[r * ld + c], want);
            }
            if (!(fabs(z[c] - zs) <= 1e-6 * zs)) fail_msg("%s col_exp_sum column %zu: sum %g, want %g", tabs[t]->name, c, (double)z[c], zs);
            for (size_t r = 0; r < rows; r++) assert_true(x[r * ld + cols] == e[r * ld + cols]); /* past cols: untouched */
        }
        for (size_t n = 0; n < rows * ld; n += 13) {
            double want = 0, mag = 0;
            for (size_t i = 0; i < n; i++) want += (double)x[i] * e[i], mag += fabs((double)x[i] * e[i]);
            float got = tabs[t]->dot(x, e, n);
            if (!(fabs(got - want) <= 1e-6 * mag + 1e-30)) fail_msg("%s dot n=%zu: %g, want %g", tabs[t]->name, n, (double)got, want);
        }
    }
}

/* group_max: the exact maxima of the rounded products, bit for bit, in
 * every table, for group lengths below, at and past a vector (1, 4, 16,
 * 32, 37 tokens), with and without weights. */
static void group_max_equals_a_plain_loop(void **state) {
    (void)state;
    const kvm_score_kernels *tabs[3] = {(&kvm_score_scalar), simd_tables(0), simd_tables(1)};
    uint64_t rng = 45;
    enum { G = 5, NMAX = 37 };
    float x[G * NMAX], w[G * NMAX], out[G + 1];
    for (size_t i = 0; i < G * NMAX; i++) x[i] = tu_normal(&rng), w[i] = 0.01f + fabsf(tu_normal(&rng));
    const size_t lens[5] = {1, 4, 16, 32, 37};
    for (int t = 0; t < 3; t++) {
        if (!tabs[t]) continue;
        for (int li = 0; li < 5; li++)
            for (int weighted = 0; weighted < 2; weighted++) {
                const size_t n = lens[li];
                out[G] = 12345.0f; /* past the groups: untouched */
                tabs[t]->group_max(x, weighted ? w : NULL, G, n, out);
                for (size_t g = 0; g < G; g++) {
                    float want = -INFINITY;
                    for (size_t i = g * n; i < (g + 1) * n; i++) {
                        volatile float v = weighted ? x[i] * w[i] : x[i]; /* rounded to f32 once */
                        if (v > want) want = v;
                    }
                    if (memcmp(&out[g], &want, sizeof want) != 0)
                        fail_msg("%s group_max n=%zu weighted=%d group %zu: %a, want %a", tabs[t]->name, n, weighted, g,
                                 (double)out[g], (double)want);
                }
                assert_true(out[G] == 12345.0f);
            }
    }
}

static void vector_exp_is_accurate(void **state) {
    (void)state;
    const kvm_score_kernels *tabs[3] = {(&kvm_score_scalar), simd_tables(0), simd_tables(1)};
    float x[1003], y[1003];
    for (int t = 0; t < 3; t++) {
        if (!tabs[t]) continue;
        for (int i = 0; i < 1003; i++) x[i] = y[i] = -87.0f * (float)i / 1002.0f;
        x[1002] = y[1002] = -120.0f; /* below the clamp */
        tabs[t]->exp_neg(y, 1003);
        for (int i = 0; i < 1002; i++) {
            double e = exp((double)x[i]);
            if (!(fabs(y[i] - e) <= 3e-7 * e)) fail_msg("%s: exp(%g) = %.9g, want %.9g", tabs[t]->name, (double)x[i], (double)y[i], e);
        }
        assert_true(y[1002] >= 0.0f && y[1002] < 2e-38f);
    }
}

/* I(q, b) = [q+ || q-] . [s_max || s_min] >= max_i q . k_i, for boxes built
 * by the pool from real keys (and the keys it stores, read back), through
 * every available kernel path. */
static void bounds_case(kvmem_dtype dt) {
    kvmem_context *ctx = tu_context(1);
    kvmem_model_spec s = tu_spec(1, 48);
    s.n_q_heads = 1;
    s.n_kv_heads = 1;
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = 16;
    pp.storage_dtype = dt;
    kvmem_pool *pool;
    kvmem_agent *ag;
    assert_ok(kvmem_pool_create(ctx, &s, &pp, &pool));
    assert_ok(kvmem_agent_open(pool, "b", &ag));
    uint64_t rng = 8;
    const int T = 16 * 24, D = 48;
    float *k = malloc((size_t)T * D * sizeof(float));
    for (int i = 0; i < T * D; i++) k[i] = 3.0f * tu_normal(&rng) + (i % D == 5 ? 20.0f : 0.0f);
    int64_t sh[4] = {1, T, 1, D};
    kvmem_tensor kt;
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_append(ag, &kt, &kt, NULL));
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_read(ag, 0, T, &kt, NULL)); /* the stored keys */
    const int nb = T / 16, R = 20;
    float *box = malloc((size_t)nb * 2 * D * sizeof(float)), mn[48], mx[48];
    const float **bp = malloc((size_t)nb * sizeof *bp);
    for (int b = 0; b < nb; b++) {
        assert_ok(kvmem_agent_block_aabb(ag, b, mn, mx));
        memcpy(box + (size_t)b * 2 * D, mx, sizeof mx);
        memcpy(box + (size_t)b * 2 * D + D, mn, sizeof mn);
        bp[b] = box + (size_t)b * 2 * D;
    }
    float *q = malloc((size_t)R * 2 * D * sizeof(float)), *qt = calloc((size_t)2 * D * 32, sizeof(float));
    float *raw = malloc((size_t)R * D * sizeof(float)), *o = malloc((size_t)nb * 32 * sizeof(float));
    for (int r = 0; r < R; r++)
        for (int d = 0; d < D; d++) {
            float x = tu_normal(&rng);
            raw[r * D + d] = x;
            q[r * 2 * D + d] = qt[(size_t)d * 32 + (size_t)r] = x > 0 ? x : 0;
            q[r * 2 * D + D + d] = qt[(size_t)(D + d) * 32 + (size_t)r] = x < 0 ? x : 0;
        }
    /* the stored boxes in the pool's element type: f16 values, exactly, in an F16 pool */
    uint16_t *box16 = malloc((size_t)nb * 2 * D * sizeof(uint16_t));
    const uint16_t **bp16 = malloc((size_t)nb * sizeof *bp16);
    for (int b = 0; b < nb; b++) {
        for (int i = 0; i < 2 * D; i++) box16[(size_t)b * 2 * D + (size_t)i] = kvm_f32_to_f16(box[(size_t)b * 2 * D + (size_t)i]);
        bp16[b] = box16 + (size_t)b * 2 * D;
    }
    const kvm_score_kernels *tabs[3] = {(&kvm_score_scalar), simd_tables(0), simd_tables(1)};
    for (int t = 0; t < 3; t++) {
        if (!tabs[t]) continue;
        for (int path = 0; path < 3; path++) {
            size_t ldo = path == 1 ? 32 : (size_t)R;
            if (path == 1) tabs[t]->panel(qt, 32, bp, (size_t)nb, (size_t)(2 * D), o, ldo);
            else if (path == 0) tabs[t]->rows(q, (size_t)R, bp, (size_t)nb, (size_t)(2 * D), o, ldo);
            else if (dt == KVMEM_F16) tabs[t]->aabb_rows_f16(raw, (size_t)R, bp16, (size_t)nb, (size_t)D, o, ldo);
            else tabs[t]->aabb_rows_f32(raw, (size_t)R, bp, (size_t)nb, (size_t)D, o, ldo);
            for (int b = 0; b < nb; b++)
                for (int r = 0; r < R; r++) {
                    double best = -INFINITY, mag = 0;
                    for (int i = 0; i < 16; i++) {
                        double dot = 0;
                        for (int d = 0; d < D; d++) {
                            dot += (double)raw[r * D + d] * k[(size_t)(b * 16 + i) * D + (size_t)d];
                            mag += fabs((double)raw[r * D + d] * k[(size_t)(b * 16 + i) * D + (size_t)d]);
                        }
                        best = fmax(best, dot);
                    }
                    /* f32 rounding of the sums only */
                    if (!(o[(size_t)b * ldo + (size_t)r] >= best - 1e-5 * mag))
                        fail_msg("%s %s path %d: I = %g < best key %g", kvmem_dtype_name(dt), tabs[t]->name, path,
                                 (double)o[(size_t)b * ldo + (size_t)r], best);
                }
        }
    }
    free(box16);
    free((void *)bp16);
    free(k);
    free(box);
    free((void *)bp);
    free(q);
    free(qt);
    free(raw);
    free(o);
    kvmem_agent_close(ag);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
}

/* F32 pools keep exact f32 boxes; F16 pools f16 boxes rounded outward, read
 * by the f16 kernel: the bound holds for the keys the pool stores. */
static void aabb_score_bounds_the_best_key(void **state) {
    (void)state;
    bounds_case(KVMEM_F32);
    bounds_case(KVMEM_F16);
}

/* Decode-sized problems score block-major, larger ones item-major: both
 * orders give the same scores (same kernels, same summation order). */
static void block_major_and_item_major_agree(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    kvmem_model_spec s = tu_spec(3, 32);
    s.n_q_heads = 8;
    s.n_kv_heads = 2;
    kvmem_pool *pool;
    kvmem_agent *ag;
    assert_ok(kvmem_pool_create(ctx, &s, NULL, &pool));
    assert_ok(kvmem_agent_open(pool, "bm", &ag));
    uint64_t rng = 12;
    const int T = 16 * 21;
    size_t n = (size_t)3 * T * 2 * 32;
    float *kv = malloc(n * sizeof(float)), q[2 * 3 * 8 * 32];
    tu_fill_kv(kv, n, &rng);
    tu_fill_kv(q, sizeof q / sizeof *q, &rng);
    int64_t sh[4] = {3, T, 2, 32}, qs[4] = {2, 3, 8, 32};
    kvmem_tensor kt, qt;
    assert_ok(kvmem_tensor_init(&kt, kv, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_append(ag, &kt, &kt, NULL));
    assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 4, qs));
    kvmem_retrieval *a, *b;
    assert_ok(kvmem_retrieval_create(&a));
    assert_ok(kvmem_retrieval_create(&b));
    const size_t saved = kvm_score_block_major_max_bytes;
    for (int mode = 0; mode < 2; mode++)
        for (int nq = 1; nq <= 2; nq++) {
            qt.shape[0] = nq;
            kvmem_retrieve_params p = kvmem_retrieve_default_params();
            p.mode = (kvmem_retrieve_mode)mode;
            p.norm = nq == 2 ? KVMEM_NORM_RR : KVMEM_NORM_SOFTMAX;
            kvm_score_block_major_max_bytes = saved;
            assert_ok(kvmem_retrieve(ag, &qt, &p, a));
            kvm_score_block_major_max_bytes = 0;
            assert_ok(kvmem_retrieve(ag, &qt, &p, b));
            const float *sa, *sb;
            int32_t na, nb;
            assert_ok(kvmem_retrieval_block_scores(a, 0, &sa, &na));
            assert_ok(kvmem_retrieval_block_scores(b, 0, &sb, &nb));
            assert_int_equal(na, 21);
            assert_int_equal(nb, 21);
            for (int i = 0; i < na; i++) assert_true(fabsf(sa[i] - sb[i]) <= 1e-6f * fabsf(sa[i]));
        }
    kvm_score_block_major_max_bytes = saved;
    kvmem_retrieval_free(a);
    kvmem_retrieval_free(b);
    free(kv);
    kvmem_agent_close(ag);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
}

static void topk_ties_and_nan(void **state) {
    (void)state;
    const float s[8] = {1.0f, 3.0f, NAN, 3.0f, 2.0f, 3.0f, -1.0f, NAN};
    int32_t idx[8], n;
    assert_ok(kvm_cpu_topk(NULL, s, 8, 4, idx, &n));
    assert_int_equal(n, 4);
    assert_int_equal(idx[0], 1);
    assert_int_equal(idx[1], 3);
    assert_int_equal(idx[2], 5);
    assert_int_equal(idx[3], 4);
    assert_ok(kvm_cpu_topk(NULL, s, 8, 100, idx, &n));
    assert_int_equal(n, 6);
    assert_int_equal(idx[5], 6);
    assert_ok(kvm_cpu_topk(NULL, s, 8, 0, idx, &n));
    assert_int_equal(n, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(simd_kernels_equal_scalar),
        cmocka_unit_test(aabb_row_kernels_equal_the_definition),
        cmocka_unit_test(exact_kernels_equal_the_definition),
        cmocka_unit_test(column_kernels_equal_plain_loops),
        cmocka_unit_test(group_max_equals_a_plain_loop),
        cmocka_unit_test(vector_exp_is_accurate),
        cmocka_unit_test(aabb_score_bounds_the_best_key),
        cmocka_unit_test(block_major_and_item_major_agree),
        cmocka_unit_test(topk_ties_and_nan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
