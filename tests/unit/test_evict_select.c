/* Kept-set selection (IntentKV forced set + top-C*) and the StreamingLLM,
 * H2O and SnapKV baselines, each against a reference written here. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Reference selection: repeatedly take the best remaining candidate
 * (highest score, then smallest position). O(N^2), obviously right. */
static int64_t ref_select(const float *s, int64_t n, int64_t C, int64_t pi, int64_t qb, int64_t qe, unsigned char *keep) {
    memset(keep, 0, (size_t)n);
    if (n <= C) {
        memset(keep, 1, (size_t)n);
        return n;
    }
    int64_t forced = 0;
    for (int64_t j = 0; j < n; j++)
        if (j < pi || (j >= qb && j < qe)) {
            keep[j] = 1;
            forced++;
        }
    int64_t room = C - forced > 0 ? C - forced : 0, kept = forced;
    for (int64_t r = 0; r < room; r++) {
        int64_t best = -1;
        for (int64_t j = 0; j < n; j++)
            if (!keep[j] && (best < 0 || s[j] > s[best])) best = j;
        if (best < 0) break;
        keep[best] = 1;
        kept++;
    }
    return kept;
}

static void check_select(const float *s, int64_t n, int64_t C, int64_t pi, int64_t qb, int64_t qe) {
    int32_t *kept = malloc((size_t)n * 4);
    unsigned char *ref = malloc((size_t)n);
    int64_t nk = -1;
    assert_ok(kvmem_select_keep(s, n, C, pi, qb, qe, kept, &nk));
    int64_t rn = ref_select(s, n, C, pi, qb, qe, ref);
    assert_int_equal(nk, rn);
    int64_t i = 0;
    for (int64_t j = 0; j < n; j++)
        if (ref[j]) {
            if (kept[i] != j) fail_msg("n=%lld C=%lld: kept[%lld] = %d, reference %lld", (long long)n, (long long)C,
                                       (long long)i, kept[i], (long long)j);
            i++;
        }
    free(kept);
    free(ref);
}

static void select_matches_reference(void **state) {
    (void)state;
    uint64_t rng = 1;
    for (int t = 0; t < 200; t++) {
        int64_t n = 1 + (int64_t)(tu_next(&rng) % 90);
        float *s = malloc((size_t)n * 4);
        /* few distinct values: many ties */
        for (int64_t j = 0; j < n; j++) s[j] = (float)(tu_next(&rng) % 6);
        if (t % 7 == 0) s[0] = -INFINITY;
        int64_t C = (int64_t)(tu_next(&rng) % (uint64_t)(n + 5));
        int64_t pi = (int64_t)(tu_next(&rng) % (uint64_t)(n + 1));
        int64_t qb = (int64_t)(tu_next(&rng) % (uint64_t)(n + 1));
        int64_t qe = qb + (int64_t)(tu_next(&rng) % (uint64_t)(n - qb + 1));
        check_select(s, n, C, pi, qb, qe);
        free(s);
    }
}

static void select_hand_cases(void **state) {
    (void)state;
    float s[8] = {0.1f, 0.9f, 0.5f, 0.5f, 0.2f, 0.8f, 0.0f, 0.3f};
    int32_t k[8];
    int64_t n;
    /* N <= C: everything, even with no scores worth keeping */
    assert_ok(kvmem_select_keep(s, 8, 8, 0, 0, 0, k, &n));
    assert_int_equal(n, 8);
    /* pi = 2, span [6, 8): F = {0, 1, 6, 7}, C = 6 -> 2 more: 5 (0.8), then 2 (0.5, older than 3) */
    assert_ok(kvmem_select_keep(s, 8, 6, 2, 6, 8, k, &n));
    int32_t want[6] = {0, 1, 2, 5, 6, 7};
    assert_int_equal(n, 6);
    assert_memory_equal(k, want, sizeof want);
    /* budget below the forced set: F only (C* = 0) */
    assert_ok(kvmem_select_keep(s, 8, 1, 2, 6, 8, k, &n));
    int32_t want2[4] = {0, 1, 6, 7};
    assert_int_equal(n, 4);
    assert_memory_equal(k, want2, sizeof want2);
    /* overlapping protect and span count once */
    assert_ok(kvmem_select_keep(s, 8, 4, 3, 1, 4, k, &n));
    int32_t want3[4] = {0, 1, 2, 3};
    assert_int_equal(n, 4);
    assert_memory_equal(k, want3, sizeof want3);
}

static void select_bad_input(void **state) {
    (void)state;
    float s[4] = {1, 2, 3, 4};
    int32_t k[4] = {-9, -9, -9, -9};
    int64_t n = -9;
    assert_status(kvmem_select_keep(NULL, 4, 2, 0, 0, 0, k, &n), KVMEM_ERR_INVALID_ARG, "scores is NULL");
    assert_status(kvmem_select_keep(s, 4, 2, 0, 0, 0, NULL, &n), KVMEM_ERR_INVALID_ARG, "kept is NULL");
    assert_status(kvmem_select_keep(s, 4, 2, 0, 0, 0, k, NULL), KVMEM_ERR_INVALID_ARG, "n_kept is NULL");
    assert_status(kvmem_select_keep(s, 0, 2, 0, 0, 0, k, &n), KVMEM_ERR_INVALID_ARG, "N = 0");
    assert_status(kvmem_select_keep(s, (int64_t)1 << 33, 2, 0, 0, 0, k, &n), KVMEM_ERR_INVALID_ARG, "INT32_MAX");
    assert_status(kvmem_select_keep(s, 4, -1, 0, 0, 0, k, &n), KVMEM_ERR_INVALID_ARG, "budget -1");
    assert_status(kvmem_select_keep(s, 4, 2, 5, 0, 0, k, &n), KVMEM_ERR_INVALID_ARG, "protected prefix 5");
    assert_status(kvmem_select_keep(s, 4, 2, 0, 3, 2, k, &n), KVMEM_ERR_INVALID_ARG, "query span");
    assert_status(kvmem_select_keep(s, 4, 2, 0, 2, 5, k, &n), KVMEM_ERR_INVALID_ARG, "query span");
    s[2] = NAN;
    assert_status(kvmem_select_keep(s, 4, 2, 0, 0, 0, k, &n), KVMEM_ERR_INVALID_ARG, "scores[2] is NaN");
    assert_true(n == -9 && k[0] == -9 && k[3] == -9);
}

static void streaming_keeps_sinks_and_window(void **state) {
    (void)state;
    int32_t k[20];
    int64_t n;
    assert_ok(kvmem_streaming_keep(20, 4, 5, k, &n));
    int32_t want[9] = {0, 1, 2, 3, 15, 16, 17, 18, 19};
    assert_int_equal(n, 9);
    assert_memory_equal(k, want, sizeof want);
    assert_ok(kvmem_streaming_keep(6, 4, 5, k, &n)); /* overlap: everything once */
    assert_int_equal(n, 6);
    for (int i = 0; i < 6; i++) assert_int_equal(k[i], i);
    assert_ok(kvmem_streaming_keep(6, 0, 0, k, &n));
    assert_int_equal(n, 0);
    assert_status(kvmem_streaming_keep(0, 4, 5, k, &n), KVMEM_ERR_INVALID_ARG, "N = 0");
    assert_status(kvmem_streaming_keep(6, -1, 5, k, &n), KVMEM_ERR_INVALID_ARG, ">= 0");
    assert_status(kvmem_streaming_keep(6, 1, 5, NULL, &n), KVMEM_ERR_INVALID_ARG, "NULL");
}

static void h2o_accumulates_and_keeps_heavy_hitters(void **state) {
    (void)state;
    float p[2 * 6] = {0.5f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, /* row 0 */
                      0.1f, 0.1f, 0.4f, 0.1f, 0.2f, 0.1f};
    float acc[6] = {0, 0, 0, 0, 0, 1.0f};
    assert_ok(kvmem_h2o_accumulate(p, 2, 6, acc));
    float want[6] = {0.6f, 0.2f, 0.5f, 0.2f, 0.3f, 1.2f};
    for (int j = 0; j < 6; j++) assert_true(fabsf(acc[j] - want[j]) < 1e-6f);
    int32_t k[6];
    int64_t n;
    /* budget 4, recent floor 1: {5} + heavy {0, 2, 4} */
    assert_ok(kvmem_h2o_keep(acc, 6, 4, 1, k, &n));
    int32_t wk[4] = {0, 2, 4, 5};
    assert_int_equal(n, 4);
    assert_memory_equal(k, wk, sizeof wk);
    /* recent floor 3: {3, 4, 5} + heavy {0} */
    assert_ok(kvmem_h2o_keep(acc, 6, 4, 3, k, &n));
    int32_t wk2[4] = {0, 3, 4, 5};
    assert_memory_equal(k, wk2, sizeof wk2);
    float before[6];
    memcpy(before, acc, sizeof acc);
    float badp[6] = {0.1f, 0.1f, -0.1f, 0.1f, 0.1f, 0.1f};
    assert_status(kvmem_h2o_accumulate(badp, 1, 6, acc), KVMEM_ERR_INVALID_ARG, "probs[0][2]");
    badp[2] = NAN;
    assert_status(kvmem_h2o_accumulate(badp, 1, 6, acc), KVMEM_ERR_INVALID_ARG, "not a probability");
    assert_memory_equal(before, acc, sizeof acc);
    assert_status(kvmem_h2o_accumulate(NULL, 1, 6, acc), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_h2o_accumulate(p, -1, 6, acc), KVMEM_ERR_INVALID_ARG, "shape");
    assert_status(kvmem_h2o_keep(acc, 6, 2, 3, k, &n), KVMEM_ERR_INVALID_ARG, "recent window 3");
    assert_status(kvmem_h2o_keep(acc, 6, 2, -1, k, &n), KVMEM_ERR_INVALID_ARG, "recent window");
}

/* SnapKV reference in double. q [W][L][HQ][D], k [L][N][HKV][D]. */
static void ref_snapkv(int L, int HQ, int HKV, int D, int64_t N, int64_t W, const float *q, const float *k, int ker,
                       double *out) {
    int G = HQ / HKV, r = ker / 2;
    double *vote = malloc((size_t)N * sizeof *vote), *lg = malloc((size_t)N * sizeof *lg);
    for (int64_t j = 0; j < N; j++) out[j] = 0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < HQ; h++) {
            for (int64_t j = 0; j < N; j++) vote[j] = 0;
            for (int64_t w = 0; w < W; w++) {
                int64_t visible = N - W + w + 1;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < visible; j++) {
                    double d = 0;
                    for (int e = 0; e < D; e++)
                        d += (double)q[(((size_t)w * L + l) * HQ + h) * D + e] * k[(((size_t)l * N + j) * HKV + h / G) * D + e];
                    lg[j] = d / sqrt((double)D);
                    mx = lg[j] > mx ? lg[j] : mx;
                }
                for (int64_t j = 0; j < visible; j++) sum += exp(lg[j] - mx);
                for (int64_t j = 0; j < visible; j++) vote[j] += exp(lg[j] - mx) / sum;
            }
            /* pool the prefix [0, N-W) and the window [N-W, N) apart */
            for (int64_t j = 0; j < N; j++) {
                int64_t b = j < N - W ? 0 : N - W, e = j < N - W ? N - W : N;
                double m = -INFINITY;
                for (int64_t i = j - r; i <= j + r; i++)
                    if (i >= b && i < e && vote[i] > m) m = vote[i];
                out[j] += m;
            }
        }
    free(vote);
    free(lg);
}

static void snapkv_matches_reference(void **state) {
    (void)state;
    const int L = 2, D = 16;
    int64_t Ns[3] = {40, 9, 300}, Ws[3] = {8, 9, 32};
    for (int c = 0; c < 3; c++) {
        int64_t N = Ns[c], W = Ws[c];
        kvmem_model_spec s = tu_spec(L, D);
        uint64_t rng = 100 + (uint64_t)c;
        size_t QE = (size_t)W * L * 4 * D, KE = (size_t)L * N * 2 * D;
        float *q = malloc(QE * 4), *k = malloc(KE * 4), *sc = malloc((size_t)N * 4);
        double *ref = malloc((size_t)N * sizeof *ref);
        for (size_t i = 0; i < QE; i++) q[i] = tu_normal(&rng);
        for (size_t i = 0; i < KE; i++) k[i] = tu_normal(&rng);
        kvmem_tensor qt, kt;
        int64_t qs[4] = {W, L, 4, D}, ks[4] = {L, N, 2, D};
        assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 4, qs));
        assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, ks));
        kvmem_context *ctx = tu_context(2);
        assert_ok(kvmem_snapkv_score(ctx, &s, &qt, &kt, 7, sc));
        ref_snapkv(L, 4, 2, D, N, W, q, k, 7, ref);
        for (int64_t j = 0; j < N; j++)
            if (fabs(sc[j] - ref[j]) > 1e-4 * (1 + fabs(ref[j])))
                fail_msg("N=%lld W=%lld j=%lld: %.8g vs %.8g", (long long)N, (long long)W, (long long)j, sc[j], ref[j]);
        /* selection keeps the window, as SnapKV does */
        int32_t *kept = malloc((size_t)N * 4);
        int64_t nk;
        assert_ok(kvmem_select_keep(sc, N, W + 4, 0, N - W, N, kept, &nk));
        assert_int_equal(nk, N <= W + 4 ? N : W + 4);
        assert_int_equal(kept[nk - 1], N - 1);
        assert_int_equal(kept[nk - W], N - W);
        free(kept);
        kvmem_context_free(ctx);
        free(q);
        free(k);
        free(sc);
        free(ref);
    }
}

/* GQA-aware SnapKV on the layouts engines hand over: 32 query heads over
 * 8 KV heads, head_dim 72 (vector tails), 1100 positions; K position-major, head-major
 * ([L][n_kv_heads][N][D] viewed through strides) and with an element
 * stride of 2, in f32, f16 and bf16 (values on a 1/64 grid in [-4, 4]:
 * exact in all three); q_obs head-major ([L][n_q_heads][W][D] viewed as
 * [W][L][n_q_heads][D]). Every case matches the reference; one and three
 * threads agree to the bit. */
static void snapkv_gqa_layouts_match_reference(void **state) {
    (void)state;
    const int L = 1, HQ = 32, HKV = 8, D = 72; /* 72: the vector tails */
    const int64_t N = 1100, W = 20;
    kvmem_model_spec s = tu_spec(L, D);
    s.n_q_heads = HQ, s.n_kv_heads = HKV;
    uint64_t rng = 404;
    const size_t QE = (size_t)W * L * HQ * D, KE = (size_t)L * N * HKV * D;
    float *q = malloc(QE * 4), *qh = malloc(QE * 4), *k = malloc(KE * 4), *a = malloc((size_t)N * 4), *b = malloc((size_t)N * 4);
    unsigned char *buf = malloc(KE * 8);
    double *ref = malloc((size_t)N * sizeof *ref);
    for (size_t i = 0; i < QE; i++) q[i] = 0.3f * tu_normal(&rng);
    for (size_t i = 0; i < KE; i++) k[i] = roundf(fmaxf(-4.f, fminf(4.f, tu_normal(&rng))) * 64.f) / 64.f;
    ref_snapkv(L, HQ, HKV, D, N, W, q, k, 7, ref);
    /* q_obs head-major: qh[l][h][w][d] */
    for (int64_t w = 0; w < W; w++)
        for (int l = 0; l < L; l++)
            for (int h = 0; h < HQ; h++)
                memcpy(qh + (((size_t)l * HQ + (size_t)h) * (size_t)W + (size_t)w) * D,
                       q + (((size_t)w * L + (size_t)l) * HQ + (size_t)h) * D, D * 4);
    kvmem_tensor qt;
    int64_t qs[4] = {W, L, HQ, D};
    assert_ok(kvmem_tensor_init(&qt, qh, KVMEM_F32, 4, qs));
    qt.strides[0] = D, qt.strides[1] = (int64_t)HQ * W * D, qt.strides[2] = W * D;
    kvmem_context *c1 = tu_context(1), *c3 = tu_context(3);
    for (int layout = 0; layout < 3; layout++)
        for (int x = 0; x < 3; x++) {
            const kvmem_dtype dt = x == 0 ? KVMEM_F32 : x == 1 ? KVMEM_F16 : KVMEM_BF16;
            const size_t es = dt == KVMEM_F32 ? 4 : 2;
            kvmem_tensor kt;
            int64_t ks[4] = {L, N, HKV, D};
            assert_ok(kvmem_tensor_init(&kt, buf, dt, 4, ks));
            if (layout == 1) kt.strides[1] = D, kt.strides[2] = N * D;
            if (layout == 2) kt.strides[0] *= 2, kt.strides[1] *= 2, kt.strides[2] *= 2, kt.strides[3] = 2;
            for (size_t i = 0; i < KE; i++) {
                const size_t d = i % D, g = i / D % HKV, j = i / D / HKV % (size_t)N, l = i / D / HKV / (size_t)N;
                unsigned char *at = buf + (size_t)((int64_t)l * kt.strides[0] + (int64_t)j * kt.strides[1] +
                                                   (int64_t)g * kt.strides[2] + (int64_t)d * kt.strides[3]) * es;
                uint32_t u;
                memcpy(&u, &k[i], 4);
                if (dt == KVMEM_F32) {
                    memcpy(at, &k[i], 4);
                } else if (dt == KVMEM_BF16) {
                    uint16_t h = (uint16_t)(u >> 16);
                    memcpy(at, &h, 2);
                } else { /* exact for this grid (zero stays zero) */
                    uint32_t ex = (u >> 23) & 0xffu;
                    uint16_t h = (uint16_t)(((u >> 16) & 0x8000u) | (ex ? ((ex - 112u) << 10) | ((u >> 13) & 0x3ffu) : 0u));
                    memcpy(at, &h, 2);
                }
            }
            assert_ok(kvmem_snapkv_score(c1, &s, &qt, &kt, 7, a));
            assert_ok(kvmem_snapkv_score(c3, &s, &qt, &kt, 7, b));
            assert_memory_equal(a, b, (size_t)N * 4);
            for (int64_t j = 0; j < N; j++)
                if (!(fabs(a[j] - ref[j]) <= 1e-4 * (1 + fabs(ref[j]))))
                    fail_msg("layout %d dtype %d j=%lld: %.8g vs %.8g", layout, (int)dt, (long long)j, a[j], ref[j]);
        }
    kvmem_context_free(c1);
    kvmem_context_free(c3);
    free(q), free(qh), free(k), free(a), free(b), free(buf), free(ref);
}

/* A window long enough that the logits go in many spans of positions
 * (4 query heads x 700 rows: spans of 64 positions), rows whose causal
 * prefix ends before the last spans start (those spans weigh nothing for
 * them), a key count off the tile size; f32 and f16 keys (ctest runs it on
 * each kernel table): each matches the reference, one and three threads
 * agree to the bit. */
static void snapkv_long_window_spans_match_reference(void **state) {
    (void)state;
    const int L = 1, HQ = 4, HKV = 2, D = 8;
    const int64_t N = 2013, W = 700;
    kvmem_model_spec s = tu_spec(L, D);
    s.n_q_heads = HQ, s.n_kv_heads = HKV;
    uint64_t rng = 505;
    const size_t QE = (size_t)W * L * HQ * D, KE = (size_t)L * N * HKV * D;
    float *q = malloc(QE * 4), *k = malloc(KE * 4), *a = malloc((size_t)N * 4), *b = malloc((size_t)N * 4);
    uint16_t *kh = malloc(KE * 2);
    double *ref = malloc((size_t)N * sizeof *ref);
    for (size_t i = 0; i < QE; i++) q[i] = 0.7f * tu_normal(&rng);
    for (size_t i = 0; i < KE; i++) { /* a 1/64 grid in [-4, 4]: exact in f16 */
        k[i] = roundf(fmaxf(-4.f, fminf(4.f, tu_normal(&rng))) * 64.f) / 64.f;
        uint32_t u, ex;
        memcpy(&u, &k[i], 4);
        ex = (u >> 23) & 0xffu;
        kh[i] = (uint16_t)(((u >> 16) & 0x8000u) | (ex ? ((ex - 112u) << 10) | ((u >> 13) & 0x3ffu) : 0u));
    }
    ref_snapkv(L, HQ, HKV, D, N, W, q, k, 7, ref);
    kvmem_tensor qt, kt[2];
    int64_t qs[4] = {W, L, HQ, D}, ks[4] = {L, N, HKV, D};
    assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 4, qs));
    assert_ok(kvmem_tensor_init(&kt[0], k, KVMEM_F32, 4, ks));
    assert_ok(kvmem_tensor_init(&kt[1], kh, KVMEM_F16, 4, ks));
    kvmem_context *c1 = tu_context(1), *c3 = tu_context(3);
    for (int x = 0; x < 2; x++) {
        assert_ok(kvmem_snapkv_score(c1, &s, &qt, &kt[x], 7, a));
        assert_ok(kvmem_snapkv_score(c3, &s, &qt, &kt[x], 7, b));
        assert_memory_equal(a, b, (size_t)N * 4);
        for (int64_t j = 0; j < N; j++)
            if (!(fabs(a[j] - ref[j]) <= 1e-4 * (1 + fabs(ref[j]))))
                fail_msg("dtype %d j=%lld: %.8g vs %.8g", x, (long long)j, a[j], ref[j]);
    }
    kvmem_context_free(c1);
    kvmem_context_free(c3);
    free(q), free(k), free(kh), free(a), free(b), free(ref);
}

static void snapkv_bad_input(void **state) {
    (void)state;
    kvmem_model_spec s = tu_spec(1, 8);
    float q[2 * 4 * 8] = {0}, k[5 * 2 * 8] = {0}, sc[5] = {-1, -1, -1, -1, -1};
    kvmem_tensor qt, kt;
    int64_t qs[4] = {2, 1, 4, 8}, ks[4] = {1, 5, 2, 8};
    assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 4, qs));
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, ks));
    kvmem_context *ctx = tu_context(1);
    assert_status(kvmem_snapkv_score(NULL, &s, &qt, &kt, 7, sc), KVMEM_ERR_INVALID_ARG, "ctx is NULL");
    assert_status(kvmem_snapkv_score(ctx, &s, NULL, &kt, 7, sc), KVMEM_ERR_INVALID_ARG, "q_obs is NULL");
    assert_status(kvmem_snapkv_score(ctx, &s, &qt, NULL, 7, sc), KVMEM_ERR_INVALID_ARG, "K is NULL");
    assert_status(kvmem_snapkv_score(ctx, &s, &qt, &kt, 6, sc), KVMEM_ERR_INVALID_ARG, "must be odd");
    assert_status(kvmem_snapkv_score(ctx, &s, &qt, &kt, 0, sc), KVMEM_ERR_INVALID_ARG, "must be odd");
    assert_status(kvmem_snapkv_score(ctx, &s, &qt, &kt, 7, NULL), KVMEM_ERR_INVALID_ARG, "scores is NULL");
    kvmem_tensor bad = qt;
    bad.shape[0] = 6; /* W > N */
    assert_status(kvmem_snapkv_score(ctx, &s, &bad, &kt, 7, sc), KVMEM_ERR_INVALID_ARG, "W in [1, N = 5]");
    bad = qt;
    bad.shape[2] = 2;
    assert_status(kvmem_snapkv_score(ctx, &s, &bad, &kt, 7, sc), KVMEM_ERR_INVALID_ARG, "does not match");
    for (int j = 0; j < 5; j++) assert_true(sc[j] == -1.0f);
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(select_matches_reference),
        cmocka_unit_test(select_hand_cases),
        cmocka_unit_test(select_bad_input),
        cmocka_unit_test(streaming_keeps_sinks_and_window),
        cmocka_unit_test(h2o_accumulates_and_keeps_heavy_hitters),
        cmocka_unit_test(snapkv_matches_reference),
        cmocka_unit_test(snapkv_gqa_layouts_match_reference),
        cmocka_unit_test(snapkv_long_window_spans_match_reference),
        cmocka_unit_test(snapkv_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
