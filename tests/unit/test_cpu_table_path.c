/* The CPU path of the public calls goes through the CPU backend's table:
 * with the table's entries wrapped by counters, kvmem_retrieve (AABB and
 * EXACT, decode and prefill sizes, GLOBAL and PER_LAYER), kvmem_gather and
 * kvmem_qmem_score call them and give what the unwrapped table gives; with
 * an entry that fails, the call fails with that entry's status and message.
 * So the conformance suite (tests/backend), which checks these entries,
 * checks what a CPU user runs. (kvmem_attend runs the attend op the CPU
 * backend's dev_attend wraps: tests/backend/test_backend_attend.c.) */
#include "testutil.h"
#include "internal.h"
#include "backend/route/context.h"

#include <stdlib.h>
#include <string.h>

enum { L = 2, H = 2, HQ = 4, D = 16, BS = 4, T = 40 };

static const kvmem_backend_iface *g_orig;
static int g_score, g_topk, g_gather, g_qmem, g_fail;

static kvmem_status w_score(kvmem_backend *be, const kvm_dev_score_args *a) {
    g_score++;
    if (g_fail) return kvm_fail(KVMEM_ERR_BACKEND, "the instrumented dev_score refused");
    return g_orig->dev_score(be, a);
}
static kvmem_status w_topk(kvmem_backend *be, const kvm_dev_topk_args *a) {
    g_topk++;
    return g_orig->dev_topk(be, a);
}
static kvmem_status w_gather(kvmem_backend *be, const kvm_dev_gather_args *a) {
    g_gather++;
    return g_orig->dev_gather_rope(be, a);
}
static kvmem_status w_qmem(kvmem_backend *be, const kvm_dev_qmem_args *a) {
    g_qmem++;
    return g_orig->dev_qmem_score(be, a);
}

static kvmem_backend_iface g_wrapped;

static void wrap(kvmem_context *ctx) {
    g_orig = ctx->cpu->iface;
    g_wrapped = *g_orig;
    g_wrapped.dev_score = w_score;
    g_wrapped.dev_topk = w_topk;
    g_wrapped.dev_gather_rope = w_gather;
    g_wrapped.dev_qmem_score = w_qmem;
    ctx->cpu->iface = &g_wrapped;
}

static void unwrap(kvmem_context *ctx) { ctx->cpu->iface = g_orig; }

static void retrieve_gather_and_rule_score_run_through_the_table(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    kvmem_model_spec spec = tu_spec(L, D);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = BS;
    kvmem_pool *pool;
    kvmem_agent *ag;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &pool));
    assert_ok(kvmem_agent_open(pool, "t", &ag));
    const size_t n = (size_t)L * T * H * D;
    float *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
    uint64_t rng = 4;
    tu_fill_kv(k, n, &rng);
    tu_fill_kv(v, n, &rng);
    int64_t sh[4] = {L, T, H, D};
    kvmem_tensor kt, vt;
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_append(ag, &kt, &vt, NULL));
    const int nq_max = 20; /* 20 tokens x 2 query heads per KV head: past every table's rows/panel switch */
    float *q = malloc((size_t)nq_max * L * HQ * D * sizeof(float));
    tu_fill_kv(q, (size_t)nq_max * L * HQ * D, &rng);
    kvmem_retrieval *r0, *r1;
    assert_ok(kvmem_retrieval_create(&r0));
    assert_ok(kvmem_retrieval_create(&r1));
    const int nqs[2] = {1, nq_max};
    for (int combo = 0; combo < 8; combo++) {
        int64_t qs[4] = {nqs[combo & 1], L, HQ, D};
        kvmem_tensor qt;
        assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 4, qs));
        kvmem_retrieve_params p = kvmem_retrieve_default_params();
        p.top_k = 3;
        p.mode = combo & 2 ? KVMEM_RETRIEVE_EXACT : KVMEM_RETRIEVE_AABB;
        p.scope = combo & 4 ? KVMEM_SCOPE_PER_LAYER : KVMEM_SCOPE_GLOBAL;
        assert_ok(kvmem_retrieve(ag, &qt, &p, r0));
        wrap(ctx);
        g_score = g_topk = 0;
        assert_ok(kvmem_retrieve(ag, &qt, &p, r1));
        unwrap(ctx);
        assert_int_equal(g_score, 1);
        assert_int_equal(g_topk, kvmem_retrieval_n_sets(r1)); /* one ranking per set */
        for (int32_t s = 0; s < kvmem_retrieval_n_sets(r0); s++) {
            const float *a, *b;
            int32_t na, nb;
            assert_ok(kvmem_retrieval_block_scores(r0, s, &a, &na));
            assert_ok(kvmem_retrieval_block_scores(r1, s, &b, &nb));
            assert_int_equal(na, nb);
            assert_memory_equal(a, b, (size_t)na * sizeof(float));
        }
        /* an entry that fails: the call fails with it, the result as it was */
        wrap(ctx);
        g_fail = 1;
        assert_status(kvmem_retrieve(ag, &qt, &p, r1), KVMEM_ERR_BACKEND, "instrumented dev_score");
        g_fail = 0;
        unwrap(ctx);
        const float *b;
        int32_t nb;
        assert_ok(kvmem_retrieval_block_scores(r1, 0, &b, &nb));
    }
    /* gather: K and V through dev_gather_rope, bit for bit the same */
    const int32_t blocks[3] = {0, 4, 7};
    const size_t gn = (size_t)L * 3 * BS * H * D;
    float *g0 = malloc(2 * gn * sizeof(float)), *g1 = malloc(2 * gn * sizeof(float));
    int64_t gs[4] = {L, 3 * BS, H, D};
    kvmem_tensor k0, v0, k1, v1;
    assert_ok(kvmem_tensor_init(&k0, g0, KVMEM_F32, 4, gs));
    assert_ok(kvmem_tensor_init(&v0, g0 + gn, KVMEM_F32, 4, gs));
    assert_ok(kvmem_tensor_init(&k1, g1, KVMEM_F32, 4, gs));
    assert_ok(kvmem_tensor_init(&v1, g1 + gn, KVMEM_F32, 4, gs));
    assert_ok(kvmem_gather(ag, blocks, 3, 5, &k0, &v0));
    wrap(ctx);
    g_gather = 0;
    assert_ok(kvmem_gather(ag, blocks, 3, 5, &k1, &v1));
    unwrap(ctx);
    assert_int_equal(g_gather, 2);
    assert_memory_equal(g0, g1, 2 * gn * sizeof(float));
    /* the rule score through dev_qmem_score */
    float mem[L * HQ * D], s0[T], s1[T];
    tu_fill_kv(mem, sizeof mem / sizeof *mem, &rng);
    assert_ok(kvmem_qmem_score(ctx, &spec, mem, &kt, s0));
    wrap(ctx);
    g_qmem = 0;
    assert_ok(kvmem_qmem_score(ctx, &spec, mem, &kt, s1));
    unwrap(ctx);
    assert_int_equal(g_qmem, 1);
    assert_memory_equal(s0, s1, sizeof s0);
    free(g0), free(g1), free(q), free(k), free(v);
    kvmem_retrieval_free(r0);
    kvmem_retrieval_free(r1);
    kvmem_agent_close(ag);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(retrieve_gather_and_rule_score_run_through_the_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
