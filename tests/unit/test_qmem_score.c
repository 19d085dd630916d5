/* The rule score: softmax over candidates per (layer, query head) of
 * M . K / sqrt(D) with KV heads expanded under GQA, summed; checked against
 * a double-precision reference, across kernel tables and thread counts. */
#include "testutil.h"

#include "cpu/kernels.h"
#include "cpu/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* memory [L][HQ][D], k [L][N][HKV][D] contiguous */
static void ref_score(const kvmem_model_spec *s, const float *m, const float *k, int64_t N, double *out) {
    int L = s->n_layers, HQ = s->n_q_heads, HKV = s->n_kv_heads, D = s->head_dim, G = HQ / HKV;
    double *lg = malloc((size_t)N * sizeof *lg);
    for (int64_t j = 0; j < N; j++) out[j] = 0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < HQ; h++) {
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < N; j++) {
                double d = 0;
                for (int e = 0; e < D; e++)
                    d += (double)m[((size_t)l * HQ + h) * D + e] * k[(((size_t)l * N + j) * HKV + h / G) * D + e];
                lg[j] = d / sqrt((double)D);
                mx = lg[j] > mx ? lg[j] : mx;
            }
            for (int64_t j = 0; j < N; j++) sum += exp(lg[j] - mx);
            for (int64_t j = 0; j < N; j++) out[j] += exp(lg[j] - mx) / sum;
        }
    free(lg);
}

static void unit_rows(float *m, size_t rows, size_t D, uint64_t *rng) {
    for (size_t r = 0; r < rows; r++) {
        double n = 0;
        for (size_t d = 0; d < D; d++) {
            m[r * D + d] = tu_normal(rng);
            n += (double)m[r * D + d] * m[r * D + d];
        }
        for (size_t d = 0; d < D; d++) m[r * D + d] = (float)(m[r * D + d] / sqrt(n));
    }
}

static void check_case(int L, int D, int64_t N, int threads, uint64_t seed) {
    kvmem_model_spec s = tu_spec(L, D); /* 4 q heads over 2 kv heads */
    size_t E = (size_t)L * 4 * D, KE = (size_t)L * N * 2 * D;
    uint64_t rng = seed;
    float *m = malloc(E * sizeof *m), *k = malloc(KE * sizeof *k), *sc = malloc((size_t)N * sizeof *sc);
    double *ref = malloc((size_t)N * sizeof *ref);
    unit_rows(m, (size_t)L * 4, (size_t)D, &rng);
    for (size_t i = 0; i < KE; i++) k[i] = 2.0f * tu_normal(&rng);
    kvmem_tensor kt;
    int64_t shape[4] = {L, N, 2, D};
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape));
    kvmem_context *ctx = tu_context(threads);
    assert_ok(kvmem_qmem_score(ctx, &s, m, &kt, sc));
    ref_score(&s, m, k, N, ref);
    double total = 0;
    for (int64_t j = 0; j < N; j++) {
        if (fabs(sc[j] - ref[j]) > 1e-5 * (1.0 + fabs(ref[j])))
            fail_msg("L=%d D=%d N=%lld j=%lld: %.9g vs reference %.9g", L, D, (long long)N, (long long)j, sc[j], ref[j]);
        total += sc[j];
    }
    /* each (layer, head) distributes exactly 1 */
    assert_true(fabs(total - (double)L * 4) < 1e-3);
    kvmem_context_free(ctx);
    free(m);
    free(k);
    free(sc);
    free(ref);
}

static void matches_reference_for_several_shapes(void **state) {
    (void)state;
    check_case(1, 8, 1, 1, 1);     /* one candidate: score = L * HQ */
    check_case(2, 16, 37, 2, 2);   /* tails in every kernel */
    check_case(3, 128, 300, 3, 3); /* Qwen-like head dim, more than one tile */
    check_case(2, 6, 513, 4, 4);   /* head_dim not a multiple of the vector width */
}

static void one_candidate_scores_number_of_heads(void **state) {
    (void)state;
    kvmem_model_spec s = tu_spec(3, 8);
    float m[3 * 4 * 8], k[3 * 1 * 2 * 8], sc[1];
    for (int i = 0; i < 96; i++) m[i] = 0.1f * (float)(i % 9);
    for (int i = 0; i < 48; i++) k[i] = (float)(i % 4);
    kvmem_tensor kt;
    int64_t shape[4] = {3, 1, 2, 8};
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape));
    kvmem_context *ctx = tu_context(1);
    assert_ok(kvmem_qmem_score(ctx, &s, m, &kt, sc));
    assert_true(fabsf(sc[0] - 12.0f) < 1e-5f); /* 3 layers x 4 heads, each softmax over one candidate = 1 */
    kvmem_context_free(ctx);
}

static void gqa_expands_kv_heads(void **state) {
    (void)state;
    /* two candidates; kv head 0 prefers candidate 0 strongly, kv head 1 candidate 1.
     * Query heads 0,1 read kv head 0; 2,3 read kv head 1: the score splits 2 / 2. */
    kvmem_model_spec s = tu_spec(1, 4);
    float m[4 * 4] = {0}, k[2 * 2 * 4] = {0}, sc[2];
    for (int h = 0; h < 4; h++) m[h * 4] = 1.0f;
    k[(0 * 2 + 0) * 4] = 100.0f; /* j=0, g=0 */
    k[(1 * 2 + 1) * 4] = 100.0f; /* j=1, g=1 */
    kvmem_tensor kt;
    int64_t shape[4] = {1, 2, 2, 4};
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape));
    kvmem_context *ctx = tu_context(1);
    assert_ok(kvmem_qmem_score(ctx, &s, m, &kt, sc));
    assert_true(fabsf(sc[0] - 2.0f) < 1e-6f && fabsf(sc[1] - 2.0f) < 1e-6f);
    kvmem_context_free(ctx);
}

static void independent_of_threads_and_f16_keys_match(void **state) {
    (void)state;
    const int L = 4, D = 32;
    const int64_t N = 777;
    kvmem_model_spec s = tu_spec(L, D);
    uint64_t rng = 9;
    size_t E = (size_t)L * 4 * D, KE = (size_t)L * N * 2 * D;
    float *m = malloc(E * 4), *k = malloc(KE * 4), *a = malloc((size_t)N * 4), *b = malloc((size_t)N * 4);
    uint16_t *kh = malloc(KE * 2);
    unit_rows(m, (size_t)L * 4, D, &rng);
    for (size_t i = 0; i < KE; i++) k[i] = tu_normal(&rng);
    kvmem_tensor kt;
    int64_t shape[4] = {L, N, 2, D};
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape));
    kvmem_context *c1 = tu_context(1), *c4 = tu_context(4);
    assert_ok(kvmem_qmem_score(c1, &s, m, &kt, a));
    assert_ok(kvmem_qmem_score(c4, &s, m, &kt, b));
    assert_memory_equal(a, b, (size_t)N * 4); /* bit-identical */
    /* F16 keys: the score of the f16-rounded keys (reference on the rounded values) */
    for (size_t i = 0; i < KE; i++) { /* f16 encode via a round trip the test owns: truncate to 10 mantissa bits */
        uint32_t x;
        memcpy(&x, &k[i], 4);
        x &= 0xffffe000u; /* f32 with a 10-bit mantissa, exponent in f16 range for N(0,1) */
        memcpy(&k[i], &x, 4);
        uint32_t sign = (x >> 16) & 0x8000u, ex = (x >> 23) & 0xffu, man = (x >> 13) & 0x3ffu;
        kh[i] = (uint16_t)(ex == 0 ? sign : (sign | ((ex - 112u) << 10) | man));
        if (ex != 0 && (ex < 113 || ex > 142)) { /* outside normal f16: zero it in both */
            k[i] = 0.0f;
            kh[i] = 0;
        }
    }
    kvmem_tensor kf;
    assert_ok(kvmem_tensor_init(&kf, kh, KVMEM_F16, 4, shape));
    assert_ok(kvmem_qmem_score(c4, &s, m, &kf, a));
    double *ref = malloc((size_t)N * sizeof *ref);
    ref_score(&s, m, k, N, ref);
    for (int64_t j = 0; j < N; j++) assert_true(fabs(a[j] - ref[j]) < 1e-5 * (1 + fabs(ref[j])));
    kvmem_context_free(c1);
    kvmem_context_free(c4);
    free(m);
    free(k);
    free(kh);
    free(a);
    free(b);
    free(ref);
}

static void simd_tables_match_scalar(void **state) {
    (void)state;
    const kvm_qk_kernels *sc = (&kvm_qk_scalar);
    const kvm_qk_kernels *t[2] = {kvm_cpu_has_avx2() ? &kvm_qk_avx2 : NULL,
                                  kvm_cpu_has_avx512() ? &kvm_qk_avx512 : NULL};
    int ran = 0;
    uint64_t rng = 77;
    for (int ti = 0; ti < 2; ti++) {
        if (!t[ti]) continue;
        ran++;
        size_t Ds[4] = {1, 7, 16, 130}, Gs[3] = {1, 4, 9}, ns[3] = {1, 5, 67};
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 3; b++)
                for (int c = 0; c < 3; c++) {
                    size_t D = Ds[a], G = Gs[b], n = ns[c], ks = D + 2;
                    float *m = malloc(G * D * 4), *k = malloc(n * ks * 4), *o1 = malloc(G * n * 4), *o2 = malloc(G * n * 4);
                    for (size_t i = 0; i < G * D; i++) m[i] = tu_normal(&rng);
                    for (size_t i = 0; i < n * ks; i++) k[i] = tu_normal(&rng);
                    sc->qk(m, G, D, k, n, ks, 0.5f, o1, n);
                    t[ti]->qk(m, G, D, k, n, ks, 0.5f, o2, n);
                    for (size_t i = 0; i < G * n; i++) assert_true(fabsf(o1[i] - o2[i]) < 1e-4f * (1.0f + fabsf(o1[i])));
                    free(m);
                    free(k);
                    free(o1);
                    free(o2);
                }
        size_t lens[5] = {1, 8, 15, 17, 1000};
        for (int c = 0; c < 5; c++) {
            size_t n = lens[c];
            float *x1 = malloc(n * 4), *x2 = malloc(n * 4), *a1 = calloc(n, 4), *a2 = calloc(n, 4);
            for (size_t i = 0; i < n; i++) x1[i] = x2[i] = 30.0f * tu_normal(&rng); /* wide range: exp underflow too */
            sc->softmax_acc(x1, n, a1);
            t[ti]->softmax_acc(x2, n, a2);
            for (size_t i = 0; i < n; i++) assert_true(fabsf(a1[i] - a2[i]) < 2e-6f + 1e-5f * a1[i]);
            free(x1);
            free(x2);
            free(a1);
            free(a2);
        }
    }
    if (!ran) skip();
}

/* SnapKV's kernels, every table (the scalar one too) against plain loops in
 * double: keys packed by dimension (exactly, zeros past the keys), the GEMM
 * tile (query rows packed in blocks of 8; row and key counts off the block
 * sizes, dimensions off the vector width; nothing written past the rows or
 * keys asked for), a softmax row piece (max, exps, zeros up to nz, nothing
 * past, NaN for a non-finite input) and the window's weighted sum. */
static void snapkv_kernels_match_reference(void **state) {
    (void)state;
    const kvm_qk_kernels *t[3] = {(&kvm_qk_scalar), kvm_cpu_has_avx2() ? &kvm_qk_avx2 : NULL,
                                  kvm_cpu_has_avx512() ? &kvm_qk_avx512 : NULL};
    const size_t T = KVM_QK_TILE, LDO = 40;
    uint64_t rng = 91;
    for (int ti = 0; ti < 3; ti++) {
        if (!t[ti]) continue;
        const size_t Ds[5] = {1, 7, 16, 33, 130}, nks[5] = {1, 5, 16, 17, 32}, nrs[4] = {1, 5, 8, 21};
        for (int a = 0; a < 5; a++)
            for (int b = 0; b < 5; b++) {
                const size_t D = Ds[a], nk = nks[b];
                float *kr = malloc(T * D * 4), *kt = aligned_alloc(64, D * T * 4);
                for (size_t i = 0; i < T * D; i++) kr[i] = tu_normal(&rng);
                const float *kp[KVM_QK_TILE];
                for (size_t j = 0; j < T; j++) kp[j] = kr + (T - 1 - j) * D; /* not in memory order */
                for (size_t i = 0; i < D * T; i++) kt[i] = -99.0f;
                t[ti]->kt_pack(kp, nk, D, kt);
                for (size_t d = 0; d < D; d++)
                    for (size_t j = 0; j < T; j++) assert_true(kt[d * T + j] == (j < nk ? kp[j][d] : 0.0f));
                if (t[ti]->kt_pack_f16) { /* from f16 rows: the halves' exact values */
                    uint16_t *kh = malloc(T * D * 2);
                    float *kw = malloc(T * D * 4);
                    (&kvm_cpu_scalar)->f32_to_f16(kr, kh, T * D);
                    (&kvm_cpu_scalar)->f16_to_f32(kh, kw, T * D);
                    const uint16_t *kp16[KVM_QK_TILE];
                    for (size_t j = 0; j < T; j++) kp16[j] = kh + (T - 1 - j) * D;
                    for (size_t i = 0; i < D * T; i++) kt[i] = -99.0f;
                    t[ti]->kt_pack_f16(kp16, nk, D, kt);
                    for (size_t d = 0; d < D; d++)
                        for (size_t j = 0; j < T; j++)
                            assert_true(kt[d * T + j] == (j < nk ? kw[(T - 1 - j) * D + d] : 0.0f));
                    free(kh);
                    free(kw);
                }
                t[ti]->kt_pack(kp, nk, D, kt); /* again: the GEMM below reads the f32 packing */
                for (int c = 0; c < 4; c++) {
                    const size_t nr = nrs[c], nb = (nr + 7) / 8;
                    float *qp = aligned_alloc(64, (nb * D * 32 + 63) / 64 * 64), *o = malloc((nr + 1) * LDO * 4);
                    for (size_t i = 0; i < nb * D * 8; i++) qp[i] = tu_normal(&rng);
                    for (size_t i = 0; i < (nr + 1) * LDO; i++) o[i] = -99.0f;
                    const kvm_qk_prefetch pf = {(const char *)kr, D * 4, D * 4, T}; /* a hint: no effect on results */
                    t[ti]->qk_tile(qp, nr, kt, nk, D, 0.25f, o, LDO, c % 2 ? &pf : NULL);
                    for (size_t r = 0; r <= nr; r++)
                        for (size_t j = 0; j < LDO; j++) {
                            if (r == nr || j >= nk) {
                                assert_true(o[r * LDO + j] == -99.0f); /* nothing past the rows or keys */
                                continue;
                            }
                            double ref = 0;
                            for (size_t d = 0; d < D; d++) ref += (double)qp[(r / 8) * D * 8 + d * 8 + r % 8] * kp[j][d];
                            ref *= 0.25;
                            if (fabs(o[r * LDO + j] - ref) > 1e-5 * (1.0 + fabs(ref)) * sqrt((double)D))
                                fail_msg("%s qk_tile D=%zu nk=%zu nr=%zu [%zu][%zu]: %.8g vs %.8g", t[ti]->name, D, nk, nr, r,
                                         j, o[r * LDO + j], ref);
                        }
                    free(qp);
                    free(o);
                }
                free(kr);
                free(kt);
            }
        const size_t ns[6] = {0, 1, 15, 17, 100, 1000};
        for (int c = 0; c < 6; c++) {
            const size_t n = ns[c], nz = n + 21;
            float *x = malloc((nz + 3) * 4), *x0 = malloc(n ? n * 4 : 4);
            for (size_t i = 0; i < nz + 3; i++) x[i] = -99.0f;
            for (size_t i = 0; i < n; i++) x[i] = x0[i] = 30.0f * tu_normal(&rng); /* wide range: exp underflow too */
            float mx;
            const float sum = t[ti]->exp_row(x, n, nz, &mx);
            double rm = -INFINITY, rs = 0;
            for (size_t i = 0; i < n; i++) rm = x0[i] > rm ? x0[i] : rm;
            assert_true(mx == (float)rm);
            for (size_t i = 0; i < n; i++) {
                const double e = exp((double)(x0[i] - (float)rm)); /* the float difference, as the kernels take it */
                rs += e;
                if (!(fabs(x[i] - e) < 1e-37 + 1e-6 * e))
                    fail_msg("%s exp_row n=%zu [%zu]: %.8g vs %.8g", t[ti]->name, n, i, x[i], e);
            }
            for (size_t i = n; i < nz; i++) assert_true(x[i] == 0.0f);
            for (size_t i = nz; i < nz + 3; i++) assert_true(x[i] == -99.0f);
            assert_true(fabs(sum - rs) < 1e-6 * rs + (n ? 0 : 1e-30));
            if (n) { /* a non-finite value anywhere in [0, n): NaN */
                const float bad[3] = {NAN, INFINITY, -INFINITY};
                for (int v = 0; v < 3; v++) {
                    memcpy(x, x0, n * 4);
                    x[(n * 7 / 10 + (size_t)v) % n] = bad[v];
                    assert_true(isnan(t[ti]->exp_row(x, n, nz, &mx)));
                }
            }
            free(x);
            free(x0);
        }
        const size_t nrw[3] = {1, 9, 32}, nw[4] = {1, 17, 64, 150};
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 4; b++) {
                const size_t nr = nrw[a], n = nw[b], lde = n + 5;
                float *e = malloc(nr * lde * 4), *f = malloc(nr * 4), *v = malloc((n + 2) * 4);
                for (size_t i = 0; i < nr * lde; i++) e[i] = fabsf(tu_normal(&rng));
                for (size_t i = 0; i < nr; i++) f[i] = fabsf(tu_normal(&rng));
                for (size_t i = 0; i < n + 2; i++) v[i] = -99.0f;
                t[ti]->wsum(e, lde, f, nr, n, v);
                for (size_t j = 0; j < n; j++) {
                    double ref = 0;
                    for (size_t i = 0; i < nr; i++) ref += (double)f[i] * e[i * lde + j];
                    assert_true(fabs(v[j] - ref) < 1e-5 * ref);
                }
                assert_true(v[n] == -99.0f && v[n + 1] == -99.0f);
                free(e);
                free(f);
                free(v);
            }
    }
}

/* K as HF caches hold it ([n_layers][n_kv_heads][N][head_dim], viewed
 * through strides as [n_layers][N][n_kv_heads][head_dim]), position-major,
 * and with an element stride of 2, in f32, f16 and bf16 (values on a 1/64
 * grid in [-4, 4]: exact in all three), 8 KV heads under 32 query heads:
 * every layout and dtype matches the reference, on one and three threads;
 * one layout's result does not depend on the thread count. */
static void layouts_case(int L, int64_t N) {
    const int HQ = 32, HKV = 8, D = 128;
    kvmem_model_spec s = tu_spec(L, D);
    s.n_q_heads = HQ, s.n_kv_heads = HKV;
    uint64_t rng = 31;
    const size_t E = (size_t)L * HQ * D, KE = (size_t)L * N * HKV * D;
    float *m = malloc(E * 4), *k = malloc(KE * 4), *a = malloc((size_t)N * 4), *b = malloc((size_t)N * 4);
    unsigned char *buf = malloc(KE * 4 * 2);
    double *ref = malloc((size_t)N * sizeof *ref);
    unit_rows(m, (size_t)L * HQ, D, &rng);
    for (size_t i = 0; i < KE; i++) k[i] = roundf(fmaxf(-4.f, fminf(4.f, 1.5f * tu_normal(&rng))) * 64.f) / 64.f;
    ref_score(&s, m, k, N, ref);
    kvmem_context *c1 = tu_context(1), *c3 = tu_context(3);
    for (int layout = 0; layout < 3; layout++)
        for (int x = 0; x < 3; x++) {
            const kvmem_dtype dt = x == 0 ? KVMEM_F32 : x == 1 ? KVMEM_F16 : KVMEM_BF16;
            const size_t es = dt == KVMEM_F32 ? 4 : 2;
            kvmem_tensor kt;
            int64_t shape[4] = {L, N, HKV, D};
            assert_ok(kvmem_tensor_init(&kt, buf, dt, 4, shape));
            if (layout == 1) kt.strides[1] = D, kt.strides[2] = N * D; /* head-major */
            if (layout == 2) kt.strides[0] *= 2, kt.strides[1] *= 2, kt.strides[2] *= 2, kt.strides[3] = 2;
            for (int64_t l = 0; l < L; l++)
                for (int64_t j = 0; j < N; j++)
                    for (int64_t g = 0; g < HKV; g++)
                        for (int64_t d = 0; d < D; d++) {
                            const float f = k[(((size_t)l * (size_t)N + (size_t)j) * HKV + (size_t)g) * D + (size_t)d];
                            unsigned char *at = buf + (size_t)(l * kt.strides[0] + j * kt.strides[1] + g * kt.strides[2] +
                                                               d * kt.strides[3]) * es;
                            uint32_t u;
                            memcpy(&u, &f, 4);
                            if (dt == KVMEM_F32) {
                                memcpy(at, &f, 4);
                            } else if (dt == KVMEM_BF16) {
                                uint16_t h = (uint16_t)(u >> 16);
                                memcpy(at, &h, 2);
                            } else { /* f16: exact for this grid (zero stays zero) */
                                uint32_t ex = (u >> 23) & 0xffu;
                                uint16_t h = (uint16_t)(((u >> 16) & 0x8000u) |
                                                        (ex ? ((ex - 112u) << 10) | ((u >> 13) & 0x3ffu) : 0u));
                                memcpy(at, &h, 2);
                            }
                        }
            assert_ok(kvmem_qmem_score(c1, &s, m, &kt, a));
            assert_ok(kvmem_qmem_score(c3, &s, m, &kt, b));
            assert_memory_equal(a, b, (size_t)N * 4); /* bit-identical across thread counts */
            for (int64_t j = 0; j < N; j++)
                if (!(fabs(a[j] - ref[j]) < 1e-5 * (1 + fabs(ref[j]))))
                    fail_msg("layout %d dtype %d j=%lld: %.9g vs reference %.9g", layout, (int)dt, (long long)j, a[j],
                             ref[j]);
        }
    kvmem_context_free(c1);
    kvmem_context_free(c3);
    free(m), free(k), free(a), free(b), free(buf), free(ref);
}

static void head_major_and_half_keys_match_reference(void **state) {
    (void)state;
    layouts_case(3, 2500);
    /* 1001 = 62 position-major 16-bit tiles of 16 positions + 9, 250 f32
     * tiles of 4 + 1: the kernels' one-key tail after a 4-key block, and a
     * last tile with nothing after it to prefetch */
    layouts_case(1, 1001);
}

static void bad_input(void **state) {
    (void)state;
    kvmem_model_spec s = tu_spec(2, 8);
    float m[2 * 4 * 8], k[2 * 3 * 2 * 8], sc[3] = {-7, -7, -7};
    for (int i = 0; i < 64; i++) m[i] = 0.1f;
    for (int i = 0; i < 96; i++) k[i] = 0.2f;
    kvmem_tensor kt;
    int64_t shape[4] = {2, 3, 2, 8};
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape));
    kvmem_context *ctx = tu_context(1);
    assert_status(kvmem_qmem_score(NULL, &s, m, &kt, sc), KVMEM_ERR_INVALID_ARG, "ctx is NULL");
    assert_status(kvmem_qmem_score(ctx, NULL, m, &kt, sc), KVMEM_ERR_INVALID_ARG, "spec is NULL");
    assert_status(kvmem_qmem_score(ctx, &s, NULL, &kt, sc), KVMEM_ERR_INVALID_ARG, "memory is NULL");
    assert_status(kvmem_qmem_score(ctx, &s, m, NULL, sc), KVMEM_ERR_INVALID_ARG, "K is NULL");
    assert_status(kvmem_qmem_score(ctx, &s, m, &kt, NULL), KVMEM_ERR_INVALID_ARG, "scores is NULL");
    kvmem_tensor bad = kt;
    bad.shape[1] = 0;
    assert_status(kvmem_qmem_score(ctx, &s, m, &bad, sc), KVMEM_ERR_INVALID_ARG, "N = 0");
    bad = kt;
    bad.shape[2] = 4;
    assert_status(kvmem_qmem_score(ctx, &s, m, &bad, sc), KVMEM_ERR_INVALID_ARG, "does not match");
    bad = kt;
    bad.ndim = 3;
    assert_status(kvmem_qmem_score(ctx, &s, m, &bad, sc), KVMEM_ERR_INVALID_ARG, "3 dims");
    bad = kt;
    bad.shape[1] = (int64_t)1 << 40;
    assert_status(kvmem_qmem_score(ctx, &s, m, &bad, sc), KVMEM_ERR_INVALID_ARG, "candidates");
    bad = kt;
    bad.dtype = KVMEM_Q8;
    assert_status(kvmem_qmem_score(ctx, &s, m, &bad, sc), KVMEM_ERR_INVALID_ARG, "dtype");
    m[5] = NAN;
    assert_status(kvmem_qmem_score(ctx, &s, m, &kt, sc), KVMEM_ERR_INVALID_ARG, "memory[5]");
    m[5] = 0.1f;
    kvmem_model_spec bs = s;
    bs.head_dim = 0;
    assert_status(kvmem_qmem_score(ctx, &bs, m, &kt, sc), KVMEM_ERR_INVALID_ARG, "head_dim");
    assert_true(sc[0] == -7 && sc[1] == -7 && sc[2] == -7); /* untouched */
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(matches_reference_for_several_shapes),
        cmocka_unit_test(one_candidate_scores_number_of_heads),
        cmocka_unit_test(gqa_expands_kv_heads),
        cmocka_unit_test(independent_of_threads_and_f16_keys_match),
        cmocka_unit_test(simd_tables_match_scalar),
        cmocka_unit_test(snapkv_kernels_match_reference),
        cmocka_unit_test(head_major_and_half_keys_match_reference),
        cmocka_unit_test(bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
