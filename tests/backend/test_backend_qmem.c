/* Backend conformance: dev_qmem_score (IntentKV's rule score, core/backend/backend.h)
 * on the backend under test, against the CPU backend's entry and a plain
 * double-precision reference written here:
 *   a[l,h,j] = softmax_j(M[l,h] . K[l,j,h/G] / sqrt(D)), s_j = sum_{l,h} a[l,h,j].
 *
 * Tolerance, per token j (each implementation vs the reference; the CPU and
 * the backend then agree within the sum of theirs):
 *   |s_j - ref_j| <= 2 * ( sum_{l,h} [ a_ref[l,h,j] (2 E_lh + (n + 16) 2^-23) + 2^-22 ]
 *                          + L Hq 2^-23 ref_j )
 * where E_lh = (D + 2) 2^-24 max_j' sum_d |M_d K_d| / sqrt(D) bounds the f32
 * error of a logit (a dot product of D terms, then the scale); 2 E_lh covers
 * the logit and the max it is shifted by; (n + 16) 2^-23 the f32 sum of n
 * exponentials and the division; 2^-22 (absolute) the exponential's error
 * (Vulkan allows 3 + 2|x| ulp: p |x| <= 1/e for p = softmax); the last term
 * the sum over L Hq layers and heads. The leading 2: both directions of
 * rounding in every bound. Results must also be bit-identical across two
 * runs on the same backend (a fixed reduction order).
 * Long contexts and big models: the Vulkan kernel once looped over a whole
 * (layer, head)'s tokens, or a token's layers and heads, in one invocation
 * and lavapipe cut such loops short past 65535 iterations; tens of
 * thousands of tokens and 24 layers x 32 heads x 128 reach well past that,
 * and a run with KVMEM_VULKAN_LOOP_BUDGET lowered splits small cases into
 * many dispatches.
 * Bad input (NULL args or buffers, zero sizes, Hq not a multiple of Hkv,
 * misaligned offsets, ranges outside the buffers): KVMEM_ERR_INVALID_ARG
 * with a message, scores unchanged.
 *
 * Harness: conformance.h. */
#include "conformance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t L, Hq, Hkv, D, n;
    float kscale; /* K magnitude: small = near-uniform softmax, large = sharp */
    size_t mem_off, k_off, scores_off;
} qcase;

static void reference(const qcase *c, const float *mem, const float *k, double *ref, double *tol) {
    size_t L = (size_t)c->L, Hq = (size_t)c->Hq, Hkv = (size_t)c->Hkv, D = (size_t)c->D, N = (size_t)c->n;
    size_t G = Hq / Hkv;
    double sc = 1.0 / sqrt((double)D);
    double *x = malloc(N * sizeof *x), *ab = malloc(N * sizeof *ab);
    for (size_t j = 0; j < N; j++) ref[j] = tol[j] = 0;
    for (size_t l = 0; l < L; l++)
        for (size_t h = 0; h < Hq; h++) {
            const float *m = mem + (l * Hq + h) * D;
            double mx = -INFINITY, E = 0, sum = 0;
            for (size_t j = 0; j < N; j++) {
                const float *kr = k + ((l * N + j) * Hkv + h / G) * D;
                double s = 0, a = 0;
                for (size_t d = 0; d < D; d++) {
                    s += (double)m[d] * kr[d];
                    a += fabs((double)m[d] * kr[d]);
                }
                x[j] = s * sc;
                ab[j] = a * sc;
                mx = x[j] > mx ? x[j] : mx;
                E = ab[j] > E ? ab[j] : E;
            }
            E *= (double)(D + 2) * ldexp(1, -24);
            for (size_t j = 0; j < N; j++) sum += exp(x[j] - mx);
            for (size_t j = 0; j < N; j++) {
                double a = exp(x[j] - mx) / sum;
                ref[j] += a;
                tol[j] += a * (2 * E + (double)(N + 16) * ldexp(1, -23)) + ldexp(1, -22);
            }
        }
    for (size_t j = 0; j < N; j++) tol[j] = 2 * (tol[j] + (double)(L * Hq) * ldexp(1, -23) * ref[j]);
    free(x);
    free(ab);
}

/* Run dev_qmem_score on be; scores into out (n floats). */
static void run(kvmem_backend *be, const qcase *c, const float *mem, const float *k, float *out) {
    size_t me = (size_t)c->L * c->Hq * c->D, ke = (size_t)c->L * c->n * c->Hkv * c->D, N = (size_t)c->n;
    kvmem_buffer *bm = balloc(be, c->mem_off + me * 4), *bk = balloc(be, c->k_off + ke * 4),
                 *bs = balloc(be, c->scores_off + N * 4 + 4);
    bput(be, bm, c->mem_off, mem, me * 4);
    bput(be, bk, c->k_off, k, ke * 4);
    float *pre = malloc(c->scores_off + N * 4 + 4);
    memset(pre, 0x7f, c->scores_off + N * 4 + 4);
    bput(be, bs, 0, pre, c->scores_off + N * 4 + 4);
    kvm_dev_qmem_args a = {bm, bk, bs, c->mem_off, c->k_off, c->scores_off, c->L, c->Hq, c->Hkv, c->D, c->n, NULL};
    assert_ok(be->iface->dev_qmem_score(be, &a));
    unsigned char *all = malloc(c->scores_off + N * 4 + 4);
    bget(be, bs, 0, all, c->scores_off + N * 4 + 4);
    assert_memory_equal(all, pre, c->scores_off); /* nothing written outside */
    assert_memory_equal(all + c->scores_off + N * 4, (unsigned char *)pre + c->scores_off + N * 4, 4);
    memcpy(out, all + c->scores_off, N * 4);
    free(all);
    free(pre);
    be->iface->buffer_free(be, bm);
    be->iface->buffer_free(be, bk);
    be->iface->buffer_free(be, bs);
}

static void one(const qcase *c, uint64_t seed) {
    size_t L = (size_t)c->L, Hq = (size_t)c->Hq, D = (size_t)c->D, N = (size_t)c->n;
    size_t me = L * Hq * D, ke = L * N * (size_t)c->Hkv * D;
    float *mem = malloc(me * 4), *k = malloc(ke * 4), *sb = malloc(N * 4), *sb2 = malloc(N * 4), *sc = malloc(N * 4);
    double *ref = malloc(N * sizeof *ref), *tol = malloc(N * sizeof *tol);
    uint64_t rng = seed;
    /* memories are unit vectors (kvmem_qmem_update projects them) */
    for (size_t r = 0; r < L * Hq; r++) {
        double nrm = 0;
        for (size_t d = 0; d < D; d++) {
            mem[r * D + d] = tu_normal(&rng);
            nrm += (double)mem[r * D + d] * mem[r * D + d];
        }
        for (size_t d = 0; d < D; d++) mem[r * D + d] = (float)(mem[r * D + d] / sqrt(nrm));
    }
    for (size_t i = 0; i < ke; i++) k[i] = tu_normal(&rng) * c->kscale;
    reference(c, mem, k, ref, tol);
    run(g_cpu, c, mem, k, sc);
    run(g_be, c, mem, k, sb);
    run(g_be, c, mem, k, sb2);
    assert_memory_equal(sb, sb2, N * 4); /* deterministic */
    double total = 0;
    for (size_t j = 0; j < N; j++) {
        total += ref[j];
        if (!(fabs(sc[j] - ref[j]) <= tol[j]))
            fail_msg("L %d Hq %d Hkv %d D %d n %d: cpu score %zu = %.9g, reference %.9g, tol %.3g", c->L, c->Hq, c->Hkv,
                     c->D, c->n, j, sc[j], ref[j], tol[j]);
        if (!(fabs(sb[j] - ref[j]) <= tol[j]))
            fail_msg("L %d Hq %d Hkv %d D %d n %d: %s score %zu = %.9g, reference %.9g (cpu %.9g), tol %.3g", c->L,
                     c->Hq, c->Hkv, c->D, c->n, g_name, j, sb[j], ref[j], sc[j], tol[j]);
    }
    /* the scores of each (l, h) sum to 1 */
    assert_true(fabs(total - (double)(L * Hq)) <= 1e-9 * (double)(L * Hq));
    free(mem);
    free(k);
    free(sb);
    free(sb2);
    free(sc);
    free(ref);
    free(tol);
}

static void test_qmem_score_matches_cpu_and_reference(void **state) {
    (void)state;
    NEED_ENTRY(dev_qmem_score);
    const qcase cases[] = {
        {1, 1, 1, 1, 1, 1.0f, 0, 0, 0},        {1, 1, 1, 2, 2, 1.0f, 4, 8, 12},
        {2, 4, 2, 64, 37, 1.0f, 0, 0, 0},      {3, 8, 2, 33, 129, 3.0f, 8, 4, 4},
        {1, 4, 4, 128, 1000, 1.0f, 0, 16, 0},  {4, 6, 3, 100, 257, 0.01f, 0, 0, 8},
        {2, 8, 1, 96, 131, 20.0f, 4, 0, 0},    {5, 2, 2, 31, 1, 1.0f, 0, 0, 0},
        {2, 4, 2, 128, 4099, 2.0f, 0, 0, 0},   {1, 32, 8, 64, 300, 1.0f, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) one(&cases[i], 100 + i);
}

static void test_qmem_score_long_contexts_and_many_heads(void **state) {
    (void)state;
    NEED_ENTRY(dev_qmem_score);
    const qcase cases[] = {
        {1, 1, 1, 256, 49000, 1.0f, 0, 0, 0}, /* 49000 tokens x head_dim 256 for one (layer, head) */
        {24, 32, 8, 128, 64, 1.0f, 0, 0, 0},  /* 768 (layer, head) slices of 128 per token */
        {2, 4, 2, 96, 8000, 3.0f, 4, 8, 0},   /* GQA, a longer context, offsets */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) one(&cases[i], 200 + i);
    /* many small dispatches: token ranges of 128, one or two slices each */
    setenv("KVMEM_VULKAN_LOOP_BUDGET", "300", 1);
    const qcase small[] = {{3, 8, 2, 64, 1000, 2.0f, 0, 0, 0}, {2, 4, 4, 33, 300, 1.0f, 4, 4, 4}};
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) one(&small[i], 210 + i);
    unsetenv("KVMEM_VULKAN_LOOP_BUDGET");
}

static void test_qmem_score_rejects_bad_input_and_changes_nothing(void **state) {
    (void)state;
    NEED_ENTRY(dev_qmem_score);
    const int32_t L = 2, Hq = 4, Hkv = 2, D = 8, N = 5;
    float mem[2 * 4 * 8], k[2 * 5 * 2 * 8], pre[6], post[6];
    for (size_t i = 0; i < sizeof mem / 4; i++) mem[i] = 0.25f;
    for (size_t i = 0; i < sizeof k / 4; i++) k[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < 6; i++) pre[i] = -1.0f - (float)i;
    kvmem_buffer *bm = bnew(g_be, mem, sizeof mem), *bk = bnew(g_be, k, sizeof k), *bs = bnew(g_be, pre, sizeof pre);
    kvmem_backend *be = g_be;
    kvm_dev_qmem_args ok = {bm, bk, bs, 0, 0, 0, L, Hq, Hkv, D, N, NULL}, a;
    assert_status(be->iface->dev_qmem_score(be, NULL), KVMEM_ERR_INVALID_ARG, "NULL");
#define BAD(field, value, msg)                                                            \
    do {                                                                                  \
        a = ok;                                                                           \
        a.field = value;                                                                  \
        assert_status(be->iface->dev_qmem_score(be, &a), KVMEM_ERR_INVALID_ARG, msg);    \
    } while (0)
    BAD(n_layers, 0, "need");
    BAD(n_q_heads, 0, "need");
    BAD(n_kv_heads, 0, "need");
    BAD(n_kv_heads, 3, "multiple");
    BAD(head_dim, -1, "need");
    BAD(n, 0, "need");
    BAD(n, -5, "need");
    BAD(n, N + 1, "outside");
    BAD(head_dim, D + 1, "outside");
    BAD(n_layers, L + 1, "outside");
    BAD(mem_off, 2, "multiples of 4");
    BAD(k_off, 6, "multiples of 4");
    BAD(scores_off, 1, "multiples of 4");
    BAD(mem_off, 4, "outside");
    BAD(k_off, 4, "outside");
    BAD(scores_off, 8, "outside");
    BAD(mem, NULL, "outside");
    BAD(k, NULL, "outside");
    BAD(scores, NULL, "outside");
    BAD(n, INT32_MAX, "outside");
#undef BAD
    bget(g_be, bs, 0, post, sizeof post);
    assert_memory_equal(pre, post, sizeof pre);
    /* and the good call works on the same buffers: scores of N tokens sum to L*Hq */
    assert_ok(be->iface->dev_qmem_score(be, &ok));
    bget(g_be, bs, 0, post, sizeof post);
    double sum = 0;
    for (int j = 0; j < N; j++) sum += post[j];
    assert_true(fabs(sum - L * Hq) < 1e-4);
    assert_true(post[5] == pre[5]);
    g_be->iface->buffer_free(g_be, bm);
    g_be->iface->buffer_free(g_be, bk);
    g_be->iface->buffer_free(g_be, bs);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_qmem_score_matches_cpu_and_reference),
    cmocka_unit_test(test_qmem_score_long_contexts_and_many_heads),
    cmocka_unit_test(test_qmem_score_rejects_bad_input_and_changes_nothing),
};
CONF_MAIN(tests)
