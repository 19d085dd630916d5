/* kvmem_retrieve and kvmem_gather on a device backend ("vulkan": Mesa's
 * lavapipe here) against the same calls on "cpu": the core routes AABB
 * scoring through dev_score and gathering through dev_gather_rope when the
 * context's backend has them. Two contexts hold identical agents.
 *
 * Expected agreement:
 *   block scores  within 1e-4 relative (+1e-7): each (token, layer, head)
 *                 probability is within 2 tau dI relative of the exact one
 *                 (tests/backend/test_backend_retrieve.c), here
 *                 dI <= 32 * 2^-23 * M, M ~ 100: 2 tau dI ~ 1.4e-4 worst
 *                 case, ~1e-6 typical. The blocks are well separated (each
 *                 has its own key offset) so RR ranks cannot flip.
 *   selections    identical (the scores are far apart at the top-k cut,
 *                 which the test checks before asserting)
 *   EXACT mode    bit-identical (it stays on the CPU)
 *   gather        V bit-identical (a copy); K within 2^-20 sum|y| of each
 *                 head vector (rotation error 2^-21 (|x0| + |x1|) per pair,
 *                 and |x0| + |x1| <= sqrt(2) (|y0| + |y1|)).
 * Skips with the reason when the Vulkan backend is unusable. */
#include "testutil.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct side {
    kvmem_context *ctx;
    kvmem_pool *pool;
    kvmem_agent *ag;
} side;

static char g_why[512];
static int g_clear, g_close; /* selections compared exactly / at a close cut */

static int open_side(side *s, const char *backend, const kvmem_model_spec *spec, kvmem_dtype dt) {
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = backend;
    cp.n_threads = 2;
    if (kvmem_context_create(&cp, &s->ctx) != KVMEM_OK) {
        snprintf(g_why, sizeof g_why, "backend %s: %s", backend, kvmem_last_error());
        return 0;
    }
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = 16;
    pp.storage_dtype = dt;
    assert_ok(kvmem_pool_create(s->ctx, spec, &pp, &s->pool));
    assert_ok(kvmem_agent_open(s->pool, "a", &s->ag));
    return 1;
}

static void close_side(side *s) {
    kvmem_agent_close(s->ag);
    kvmem_pool_free(s->pool);
    kvmem_context_free(s->ctx);
}

/* n_tokens of KV in chunks; every 16-token block gets its own offset
 * direction so block scores are far apart. */
static void fill(side *a, side *b, const kvmem_model_spec *sp, int n_tokens, uint64_t seed) {
    const size_t L = (size_t)sp->n_layers, H = (size_t)sp->n_kv_heads, D = (size_t)sp->head_dim;
    uint64_t rng = seed;
    for (int t0 = 0; t0 < n_tokens; t0 += 24) {
        int n = n_tokens - t0 < 24 ? n_tokens - t0 : 24;
        size_t cnt = L * (size_t)n * H * D;
        float *k = malloc(cnt * 4), *v = malloc(cnt * 4);
        for (size_t l = 0; l < L; l++)
            for (int t = 0; t < n; t++)
                for (size_t h = 0; h < H; h++)
                    for (size_t d = 0; d < D; d++) {
                        size_t i = ((l * (size_t)n + (size_t)t) * H + h) * D + d;
                        uint64_t bs = (uint64_t)((t0 + t) / 16) * 1000003u + l * 31u + h * 7u + d;
                        float dir = (float)((bs * 2654435761u >> 7) % 2001) / 1000.0f - 1.0f; /* per block */
                        k[i] = 0.3f * tu_normal(&rng) + 1.5f * dir;
                        v[i] = tu_normal(&rng);
                    }
        int64_t sh[4] = {(int64_t)L, n, (int64_t)H, (int64_t)D};
        kvmem_tensor kt, vt;
        assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh));
        assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 4, sh));
        assert_ok(kvmem_agent_append(a->ag, &kt, &vt, NULL));
        assert_ok(kvmem_agent_append(b->ag, &kt, &vt, NULL));
        free(k);
        free(v);
    }
    assert_ok(kvmem_agent_flush(a->ag));
    assert_ok(kvmem_agent_flush(b->ag));
}

#define NEED_VULKAN(ok)                                  \
    do {                                                 \
        if (!(ok)) {                                     \
            TU_SKIP("%s", g_why);       \
        }                                                \
    } while (0)

static int cmp_desc(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return (a < b) - (a > b);
}

static void compare_retrieval(side *cpu, side *dev, const kvmem_model_spec *sp, int n_q, const kvmem_retrieve_params *p,
                              int exact, uint64_t *rng) {
    size_t nqe = (size_t)n_q * (size_t)sp->n_layers * (size_t)sp->n_q_heads * (size_t)sp->head_dim;
    float *q = malloc(nqe * 4);
    for (size_t i = 0; i < nqe; i++) q[i] = tu_normal(rng);
    int64_t sh[4] = {n_q, sp->n_layers, sp->n_q_heads, sp->head_dim};
    kvmem_tensor qt;
    assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 4, sh));
    kvmem_retrieval *rc, *rd;
    assert_ok(kvmem_retrieval_create(&rc));
    assert_ok(kvmem_retrieval_create(&rd));
    assert_ok(kvmem_retrieve(cpu->ag, &qt, p, rc));
    assert_ok(kvmem_retrieve(dev->ag, &qt, p, rd));
    int32_t sets = kvmem_retrieval_n_sets(rc);
    assert_int_equal(sets, kvmem_retrieval_n_sets(rd));
    for (int32_t s = 0; s < sets; s++) {
        const float *sc, *sd;
        int32_t nb, nb2;
        assert_ok(kvmem_retrieval_block_scores(rc, s, &sc, &nb));
        assert_ok(kvmem_retrieval_block_scores(rd, s, &sd, &nb2));
        assert_int_equal(nb, nb2);
        for (int32_t b = 0; b < nb; b++) {
            if (isnan(sc[b])) {
                assert_true(isnan(sd[b]));
                continue;
            }
            if (exact) {
                if (memcmp(&sc[b], &sd[b], 4) != 0)
                    fail_msg("EXACT set %d block %d: %.9g vs %.9g (must stay on the CPU)", s, b, (double)sc[b],
                             (double)sd[b]);
            } else if (fabs((double)sc[b] - (double)sd[b]) > 1e-4 * fabs((double)sc[b]) + 1e-7) {
                fail_msg("set %d block %d: cpu %.9g, device %.9g (norm %d agg %d n_q %d)", s, b, (double)sc[b],
                         (double)sd[b], (int)p->norm, (int)p->agg, n_q);
            }
        }
        /* Selections are identical where the top-k cut is wider than the
         * score tolerance on both sides; at a closer cut the sets may differ
         * only by blocks scored within tolerance of the cut. */
        float *sorted = malloc(((size_t)nb + 1) * 4);
        int m = 0;
        for (int32_t b = 0; b < nb; b++)
            if (!isnan(sc[b])) sorted[m++] = sc[b];
        qsort(sorted, (size_t)m, 4, cmp_desc);
        double cut = p->top_k < m ? (double)sorted[p->top_k - 1] : -INFINITY;
        double tol = 1e-4 * fabs(cut) + 1e-7;
        int clear = p->top_k >= m || (double)sorted[p->top_k - 1] - (double)sorted[p->top_k] > 2 * tol;
        free(sorted);
        const int32_t *bc, *bd;
        int32_t nc, nd;
        assert_ok(kvmem_retrieval_get(rc, s, &bc, NULL, &nc));
        assert_ok(kvmem_retrieval_get(rd, s, &bd, NULL, &nd));
        assert_int_equal(nc, nd);
        assert_true(nc > 0);
        if (clear || p->n_always_include) {
            g_clear += clear;
            assert_memory_equal(bc, bd, (size_t)nc * 4);
        } else {
            g_close++;
            for (int32_t i = 0; i < nc; i++) {
                int in = 0;
                for (int32_t j = 0; j < nd; j++) in |= bc[i] == bd[j];
                if (!in && fabs((double)sc[bc[i]] - cut) > 2 * tol)
                    fail_msg("set %d: block %d (score %.9g, cut %.9g) selected on cpu only", s, bc[i],
                             (double)sc[bc[i]], cut);
            }
        }
    }
    kvmem_retrieval_free(rc);
    kvmem_retrieval_free(rd);
    free(q);
}

static void test_retrieve_on_vulkan_matches_cpu(void **state) {
    (void)state;
    kvmem_model_spec sp = tu_spec(2, 32); /* 4 query heads on 2 KV heads */
    side cpu, dev;
    assert_true(open_side(&cpu, "cpu", &sp, KVMEM_F32));
    int ok = open_side(&dev, "vulkan", &sp, KVMEM_F32);
    if (!ok) close_side(&cpu);
    NEED_VULKAN(ok);
    assert_string_equal(kvmem_context_backend(dev.ctx), "vulkan");
    fill(&cpu, &dev, &sp, 16 * 37 + 5, 7); /* 37 sealed blocks (the tail flushed as a 38th) */
    uint64_t rng = 3;
    for (int norm = 0; norm < 2; norm++)
        for (int agg = 0; agg < 2; agg++)
            for (int scope = 0; scope < 2; scope++) {
                kvmem_retrieve_params p = kvmem_retrieve_default_params();
                p.norm = norm ? KVMEM_NORM_RR : KVMEM_NORM_SOFTMAX;
                p.agg = agg ? KVMEM_AGG_SUM : KVMEM_AGG_MAX;
                p.scope = scope ? KVMEM_SCOPE_PER_LAYER : KVMEM_SCOPE_GLOBAL;
                p.top_k = 5;
                compare_retrieval(&cpu, &dev, &sp, 1, &p, 0, &rng);
                compare_retrieval(&cpu, &dev, &sp, 19, &p, 0, &rng);
            }
    /* filters: forced and excluded blocks, a recent window */
    kvmem_retrieve_params p = kvmem_retrieve_default_params();
    int32_t ex[2] = {3, 10}, inc[1] = {0};
    p.exclude = ex;
    p.n_exclude = 2;
    p.always_include = inc;
    p.n_always_include = 1;
    p.recent_window = 30;
    p.top_k = 4;
    compare_retrieval(&cpu, &dev, &sp, 3, &p, 0, &rng);
    /* EXACT stays on the CPU: bit-identical */
    p = kvmem_retrieve_default_params();
    p.mode = KVMEM_RETRIEVE_EXACT;
    compare_retrieval(&cpu, &dev, &sp, 2, &p, 1, &rng);
    assert_true(g_clear > 3 * g_close); /* the comparison is mostly exact */
    close_side(&cpu);
    close_side(&dev);
}

static void gather_both(side *cpu, side *dev, const kvmem_model_spec *sp, const int32_t *blocks, int nb, int64_t base) {
    const int64_t M = 16 * (int64_t)nb; /* whole blocks of 16 */
    const size_t L = (size_t)sp->n_layers, H = (size_t)sp->n_kv_heads, D = (size_t)sp->head_dim;
    const size_t n = L * (size_t)M * H * D;
    float *k[2], *v[2];
    for (int s = 0; s < 2; s++) {
        k[s] = malloc(n * 4);
        v[s] = malloc(n * 4);
        memset(k[s], 0x7f, n * 4);
        memset(v[s], 0x7f, n * 4);
        int64_t sh[4] = {(int64_t)L, M, (int64_t)H, (int64_t)D};
        kvmem_tensor kt, vt;
        assert_ok(kvmem_tensor_init(&kt, k[s], KVMEM_F32, 4, sh));
        assert_ok(kvmem_tensor_init(&vt, v[s], KVMEM_F32, 4, sh));
        assert_ok(kvmem_gather(s ? dev->ag : cpu->ag, blocks, nb, base, &kt, &vt));
    }
    assert_memory_equal(v[0], v[1], n * 4);
    for (size_t r = 0; r < n / D; r++) {
        double m = 0;
        for (size_t d = 0; d < D; d++) m += fabs((double)k[0][r * D + d]);
        for (size_t d = 0; d < D; d++)
            if (fabs((double)k[0][r * D + d] - (double)k[1][r * D + d]) > ldexp(1, -20) * m)
                fail_msg("gather K row %zu dim %zu: cpu %.9g, device %.9g", r, d, (double)k[0][r * D + d],
                         (double)k[1][r * D + d]);
    }
    for (int s = 0; s < 2; s++) {
        free(k[s]);
        free(v[s]);
    }
}

static void test_gather_on_vulkan_matches_cpu(void **state) {
    (void)state;
    for (int style = 0; style < 2; style++) {
        kvmem_model_spec sp = tu_spec(3, 64);
        sp.rope_style = style ? KVMEM_ROPE_GPTJ : KVMEM_ROPE_NEOX;
        sp.rotary_dim = style ? 32 : 0; /* GPT-J with a partial rotary part */
        side cpu, dev;
        assert_true(open_side(&cpu, "cpu", &sp, style ? KVMEM_F16 : KVMEM_F32));
        int ok = open_side(&dev, "vulkan", &sp, style ? KVMEM_F16 : KVMEM_F32);
        if (!ok) close_side(&cpu);
        NEED_VULKAN(ok);
        fill(&cpu, &dev, &sp, 16 * 9, 11);
        const int32_t blocks[5] = {7, 2, 2, 0, 8}; /* any order, repeats */
        gather_both(&cpu, &dev, &sp, blocks, 5, 0);
        gather_both(&cpu, &dev, &sp, blocks, 5, 50000);
        gather_both(&cpu, &dev, &sp, blocks + 4, 1, 3);
        /* bad input is refused the same way on both */
        int32_t bad = 99;
        assert_status(kvmem_gather(dev.ag, &bad, 1, 0, NULL, NULL), KVMEM_ERR_NOT_FOUND, "not a sealed block");
        close_side(&cpu);
        close_side(&dev);
    }
}

int main(void) {
    /* The core is linked statically: the plugins are in the build's core/
     * directory, beside libkvmem.so, not beside this program. */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0 && !getenv("KVMEM_BACKEND_PATH")) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            char dir[PATH_MAX + 16];
            snprintf(dir, sizeof dir, "%s/../core", exe);
            setenv("KVMEM_BACKEND_PATH", dir, 1);
        }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_retrieve_on_vulkan_matches_cpu),
        cmocka_unit_test(test_gather_on_vulkan_matches_cpu),
    };
    return tu_group_result(cmocka_run_group_tests(tests, NULL, NULL), sizeof tests / sizeof tests[0]);
}
