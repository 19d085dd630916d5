/* Bad input to every retrieval function: a status, a clear message, and
 * nothing changed (the result object keeps its previous content). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct env {
    kvmem_context *ctx;
    kvmem_pool *pool;
    kvmem_agent *ag;
    kvmem_model_spec spec;
    float *q;
    kvmem_tensor qt;
    kvmem_retrieval *r;
} env;

static void setup_env(env *e) {
    e->ctx = tu_context(1);
    e->spec = tu_spec(2, 16);
    assert_ok(kvmem_pool_create(e->ctx, &e->spec, NULL, &e->pool));
    assert_ok(kvmem_agent_open(e->pool, "x", &e->ag));
    uint64_t rng = 2;
    size_t n = 2 * 40 * 2 * 16;
    float *kv = malloc(n * sizeof(float));
    tu_fill_kv(kv, n, &rng);
    int64_t sh[4] = {2, 40, 2, 16};
    kvmem_tensor kt;
    assert_ok(kvmem_tensor_init(&kt, kv, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_append(e->ag, &kt, &kt, NULL)); /* 2 sealed blocks + tail of 8 */
    free(kv);
    e->q = malloc(3 * 2 * 4 * 16 * sizeof(float));
    tu_fill_kv(e->q, 3 * 2 * 4 * 16, &rng);
    int64_t qs[4] = {3, 2, 4, 16};
    assert_ok(kvmem_tensor_init(&e->qt, e->q, KVMEM_F32, 4, qs));
    assert_ok(kvmem_retrieval_create(&e->r));
    kvmem_retrieve_params p = kvmem_retrieve_default_params();
    p.top_k = 1;
    assert_ok(kvmem_retrieve(e->ag, &e->qt, &p, e->r));
}

static void teardown_env(env *e) {
    kvmem_retrieval_free(e->r);
    free(e->q);
    kvmem_agent_close(e->ag);
    kvmem_pool_free(e->pool);
    kvmem_context_free(e->ctx);
}

/* The result still holds the first retrieval (top_k 1 of 2 blocks). */
static void assert_unchanged(const env *e, int32_t block) {
    const int32_t *b;
    int32_t n;
    assert_int_equal(kvmem_retrieval_n_sets(e->r), 1);
    assert_ok(kvmem_retrieval_get(e->r, 0, &b, NULL, &n));
    assert_int_equal(n, 1);
    assert_int_equal(b[0], block);
}

static void bad_retrieve_calls_fail_cleanly(void **state) {
    (void)state;
    env e;
    setup_env(&e);
    const int32_t *b;
    int32_t n, first;
    assert_ok(kvmem_retrieval_get(e.r, 0, &b, NULL, &n));
    first = b[0];
    kvmem_retrieve_params p = kvmem_retrieve_default_params();
    assert_status(kvmem_retrieve(NULL, &e.qt, &p, e.r), KVMEM_ERR_INVALID_ARG, "agent is NULL");
    assert_status(kvmem_retrieve(e.ag, NULL, &p, e.r), KVMEM_ERR_INVALID_ARG, "query is NULL");
    assert_status(kvmem_retrieve(e.ag, &e.qt, &p, NULL), KVMEM_ERR_INVALID_ARG, "result is NULL");
    kvmem_retrieve_params bad = p;
    bad.top_k = -1;
    assert_status(kvmem_retrieve(e.ag, &e.qt, &bad, e.r), KVMEM_ERR_INVALID_ARG, "top_k -1");
    bad = p;
    bad.mode = (kvmem_retrieve_mode)7;
    assert_status(kvmem_retrieve(e.ag, &e.qt, &bad, e.r), KVMEM_ERR_INVALID_ARG, "mode 7");
    bad = p;
    bad.norm = (kvmem_retrieve_norm)-1;
    assert_status(kvmem_retrieve(e.ag, &e.qt, &bad, e.r), KVMEM_ERR_INVALID_ARG, "norm -1");
    bad = p;
    bad.agg = (kvmem_retrieve_agg)2;
    assert_status(kvmem_retrieve(e.ag, &e.qt, &bad, e.r), KVMEM_ERR_INVALID_ARG, "agg 2");
    bad = p;
    bad.scope = (kvmem_retrieve_scope)2;
    assert_status(kvmem_retrieve(e.ag, &e.qt, &bad, e.r), KVMEM_ERR_INVALID_ARG, "scope 2");
    bad = p;
    bad.tau = NAN;
    assert_status(kvmem_retrieve(e.ag, &e.qt, &bad, e.r), KVMEM_ERR_INVALID_ARG, "tau");
    bad = p;
    bad.rr_c = -1.0f;
    assert_status(kvmem_retrieve(e.ag, &e.qt, &bad, e.r), KVMEM_ERR_INVALID_ARG, "rr_c");
    bad = p;
    bad.recent_window = -2;
    assert_status(kvmem_retrieve(e.ag, &e.qt, &bad, e.r), KVMEM_ERR_INVALID_ARG, "recent_window -2");
    bad = p;
    bad.n_exclude = 1;
    assert_status(kvmem_retrieve(e.ag, &e.qt, &bad, e.r), KVMEM_ERR_INVALID_ARG, "exclude is NULL");
    const int32_t tail[] = {2}, zero[] = {0};
    bad = p;
    bad.exclude = tail;
    bad.n_exclude = 1;
    assert_status(kvmem_retrieve(e.ag, &e.qt, &bad, e.r), KVMEM_ERR_INVALID_ARG, "exclude[0] = 2 is not a sealed block");
    bad = p;
    bad.always_include = tail;
    bad.n_always_include = 1;
    assert_status(kvmem_retrieve(e.ag, &e.qt, &bad, e.r), KVMEM_ERR_INVALID_ARG, "always_include[0] = 2");
    bad = p;
    bad.exclude = zero;
    bad.n_exclude = 1;
    bad.always_include = zero;
    bad.n_always_include = 1;
    assert_status(kvmem_retrieve(e.ag, &e.qt, &bad, e.r), KVMEM_ERR_INVALID_ARG, "both excluded and always included");
    bad = p;
    bad.n_exclude = -1;
    assert_status(kvmem_retrieve(e.ag, &e.qt, &bad, e.r), KVMEM_ERR_INVALID_ARG, "n_exclude = -1");
    assert_unchanged(&e, first);

    /* query shape against the spec: MISMATCH */
    kvmem_tensor q = e.qt;
    q.shape[1] = 3;
    assert_status(kvmem_retrieve(e.ag, &q, &p, e.r), KVMEM_ERR_MISMATCH, "does not match the pool's model spec");
    q = e.qt;
    q.shape[2] = 2; /* KV heads instead of query heads */
    assert_status(kvmem_retrieve(e.ag, &q, &p, e.r), KVMEM_ERR_MISMATCH, "[n_q][2][4][16]");
    q = e.qt;
    q.shape[3] = 8;
    assert_status(kvmem_retrieve(e.ag, &q, &p, e.r), KVMEM_ERR_MISMATCH, "model spec");
    q = e.qt;
    q.ndim = 3;
    assert_status(kvmem_retrieve(e.ag, &q, &p, e.r), KVMEM_ERR_MISMATCH, "3 dims");
    q = e.qt;
    q.shape[0] = 0;
    assert_status(kvmem_retrieve(e.ag, &q, &p, e.r), KVMEM_ERR_INVALID_ARG, "n_q = 0");
    q = e.qt;
    q.shape[0] = (int64_t)1 << 40;
    assert_status(kvmem_retrieve(e.ag, &q, &p, e.r), KVMEM_ERR_INVALID_ARG, "n_q");
    q = e.qt;
    q.dtype = KVMEM_Q4;
    assert_status(kvmem_retrieve(e.ag, &q, &p, e.r), KVMEM_ERR_INVALID_ARG, "not f32, f16 or bf16");
    q = e.qt;
    q.data = NULL;
    assert_status(kvmem_retrieve(e.ag, &q, &p, e.r), KVMEM_ERR_INVALID_ARG, "data is NULL");
    q = e.qt;
    q.strides[1] = -1;
    assert_status(kvmem_retrieve(e.ag, &q, &p, e.r), KVMEM_ERR_INVALID_ARG, "negative");
    e.q[77] = INFINITY;
    assert_status(kvmem_retrieve(e.ag, &e.qt, &p, e.r), KVMEM_ERR_INVALID_ARG, "not finite");
    e.q[77] = NAN;
    assert_status(kvmem_retrieve(e.ag, &e.qt, &p, e.r), KVMEM_ERR_INVALID_ARG, "not finite");
    e.q[77] = 0.0f;
    assert_unchanged(&e, first);
    /* head-major queries (per layer [4 heads][3 tokens][16], as HF hands
     * them) are read in memory order; the message still names the first
     * non-finite value in index order: [0][1][2][5], not [2][0][0][3],
     * which comes first in memory */
    float *hq = malloc(3 * 2 * 4 * 16 * sizeof(float));
    kvmem_tensor hqt = e.qt;
    hqt.data = hq;
    hqt.strides[0] = 16, hqt.strides[1] = 4 * 3 * 16, hqt.strides[2] = 3 * 16;
    for (int t = 0; t < 3; t++)
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 4; h++)
                for (int d = 0; d < 16; d++) hq[t * 16 + l * 192 + h * 48 + d] = e.q[((t * 2 + l) * 4 + h) * 16 + d];
    hq[2 * 16 + 0 * 192 + 0 * 48 + 3] = NAN;
    hq[0 * 16 + 1 * 192 + 2 * 48 + 5] = INFINITY;
    assert_status(kvmem_retrieve(e.ag, &hqt, &p, e.r), KVMEM_ERR_INVALID_ARG, "query[0][1][2][5] = inf is not finite");
    free(hq);
    assert_unchanged(&e, first);

    /* a closed agent handle */
    kvmem_agent *a2;
    assert_ok(kvmem_agent_open(e.pool, "y", &a2));
    kvmem_agent_close(a2);
    assert_status(kvmem_retrieve(a2, &e.qt, &p, e.r), KVMEM_ERR_CLOSED, "closed");
    assert_unchanged(&e, first);
    teardown_env(&e);
}

static void bad_result_accessors(void **state) {
    (void)state;
    env e;
    setup_env(&e);
    const int32_t *b;
    const float *s;
    int32_t n, buf[4];
    int64_t tok;
    assert_status(kvmem_retrieval_create(NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    kvmem_retrieval_free(NULL);
    assert_int_equal(kvmem_retrieval_n_sets(NULL), 0);
    assert_status(kvmem_retrieval_get(NULL, 0, &b, &s, &n), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_retrieval_get(e.r, 1, &b, &s, &n), KVMEM_ERR_INVALID_ARG, "set 1 outside [0, 1)");
    assert_status(kvmem_retrieval_get(e.r, -1, &b, &s, &n), KVMEM_ERR_INVALID_ARG, "set -1");
    assert_status(kvmem_retrieval_get(e.r, 0, &b, &s, NULL), KVMEM_ERR_INVALID_ARG, "n is NULL");
    assert_status(kvmem_retrieval_copy(e.r, 0, buf, NULL, -1, &n), KVMEM_ERR_INVALID_ARG, "capacity -1");
    assert_status(kvmem_retrieval_copy(e.r, 0, buf, NULL, 4, NULL), KVMEM_ERR_INVALID_ARG, "n is NULL");
    assert_status(kvmem_retrieval_block_scores(e.r, 0, NULL, &n), KVMEM_ERR_INVALID_ARG, "scores is NULL");
    assert_status(kvmem_retrieval_block_scores(e.r, 0, &s, NULL), KVMEM_ERR_INVALID_ARG, "n_blocks is NULL");
    assert_status(kvmem_retrieval_n_tokens(e.r, 0, NULL), KVMEM_ERR_INVALID_ARG, "n_tokens is NULL");
    assert_status(kvmem_retrieval_n_tokens(e.r, 3, &tok), KVMEM_ERR_INVALID_ARG, "set 3");
    kvmem_retrieval *fresh;
    assert_ok(kvmem_retrieval_create(&fresh));
    assert_status(kvmem_retrieval_get(fresh, 0, &b, &s, &n), KVMEM_ERR_INVALID_ARG, "no successful kvmem_retrieve yet");
    kvmem_retrieval_free(fresh);
    teardown_env(&e);
}

/* A finite query whose relevance to a block overflows f32 (3e38 against
 * keys of about 1) is refused with a message, for every mode, norm and
 * aggregation and both box types, and the result keeps its content; a
 * large query that does not overflow (1e30) still scores, finitely. */
static void queries_whose_scores_overflow_are_refused(void **state) {
    (void)state;
    const kvmem_dtype dts[2] = {KVMEM_F32, KVMEM_F16};
    for (int di = 0; di < 2; di++) {
        kvmem_context *ctx = tu_context(2);
        kvmem_model_spec spec = tu_spec(2, 16);
        kvmem_pool_params pp = kvmem_pool_default_params();
        pp.storage_dtype = dts[di];
        pp.block_size = 4;
        kvmem_pool *pool;
        kvmem_agent *ag;
        assert_ok(kvmem_pool_create(ctx, &spec, &pp, &pool));
        assert_ok(kvmem_agent_open(pool, "o", &ag));
        uint64_t rng = 3;
        const size_t n = 2 * 80 * 2 * 16;
        float *kv = malloc(n * sizeof(float));
        tu_fill_kv(kv, n, &rng);
        int64_t sh[4] = {2, 80, 2, 16};
        kvmem_tensor kt;
        assert_ok(kvmem_tensor_init(&kt, kv, KVMEM_F32, 4, sh));
        assert_ok(kvmem_agent_append(ag, &kt, &kt, NULL)); /* 20 sealed blocks */
        free(kv);
        const size_t nq = 2 * 2 * 4 * 16;
        float *q = malloc(nq * sizeof(float));
        int64_t qs[4] = {2, 2, 4, 16};
        kvmem_tensor qt;
        assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 4, qs));
        kvmem_retrieval *r;
        assert_ok(kvmem_retrieval_create(&r));
        for (int combo = 0; combo < 8; combo++) {
            kvmem_retrieve_params p = kvmem_retrieve_default_params();
            p.top_k = 3;
            p.norm = combo & 1 ? KVMEM_NORM_RR : KVMEM_NORM_SOFTMAX;
            p.agg = combo & 2 ? KVMEM_AGG_SUM : KVMEM_AGG_MAX;
            p.mode = combo & 4 ? KVMEM_RETRIEVE_EXACT : KVMEM_RETRIEVE_AABB;
            tu_fill_kv(q, nq, &rng);
            assert_ok(kvmem_retrieve(ag, &qt, &p, r));
            int32_t before[3], after[3], nb = 0, na = 0;
            assert_ok(kvmem_retrieval_copy(r, 0, before, NULL, 3, &nb));
            for (int pass = 0; pass < 2; pass++) {
                if (pass == 0) /* every value: both signs of the products overflow */
                    for (size_t i = 0; i < nq; i++) q[i] = i % 3 ? 3e38f : -3e38f;
                else /* one value of one token and head */
                    tu_fill_kv(q, nq, &rng), q[nq - 5] = 3e38f;
                assert_status(kvmem_retrieve(ag, &qt, &p, r), KVMEM_ERR_INVALID_ARG, "overflow");
                assert_ok(kvmem_retrieval_copy(r, 0, after, NULL, 3, &na));
                assert_int_equal(na, nb);
                assert_memory_equal(before, after, sizeof before);
            }
            tu_fill_kv(q, nq, &rng); /* about 1e30: large, finite scores */
            for (size_t i = 0; i < nq; i++) q[i] *= 1e30f;
            assert_ok(kvmem_retrieve(ag, &qt, &p, r));
            const float *all;
            int32_t nblk;
            assert_ok(kvmem_retrieval_block_scores(r, 0, &all, &nblk));
            assert_int_equal(nblk, 20);
            for (int b = 0; b < nblk; b++) assert_true(isfinite(all[b]));
        }
        kvmem_retrieval_free(r);
        free(q);
        kvmem_agent_close(ag);
        kvmem_pool_free(pool);
        kvmem_context_free(ctx);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_retrieve_calls_fail_cleanly),
        cmocka_unit_test(bad_result_accessors),
        cmocka_unit_test(queries_whose_scores_overflow_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
