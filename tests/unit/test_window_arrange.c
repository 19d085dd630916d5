/* kvmem_arrange and kvmem_window_split (experimental): the three orders give
 * the orders worked out here by hand, ties go the documented way, a
 * retrieval set arranged by score and gathered puts the best block right
 * before the live context (checked against a gather of that block alone);
 * the split rounds memory to whole blocks and never overfills; bad input is
 * refused with a message and writes nothing. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_orders_worked_by_hand(void **state) {
    (void)state;
    const int32_t ids[5] = {9, 3, 12, 7, 8};
    const float sc[5] = {0.2f, 0.5f, 0.3f, 0.1f, 0.9f};
    int32_t out[5];
    const int32_t chrono[5] = {3, 7, 8, 9, 12}, by_score[5] = {7, 9, 12, 3, 8}, runs[5] = {12, 3, 7, 8, 9};
    assert_ok(kvmem_arrange(ids, sc, 5, KVMEM_ARRANGE_CHRONO, out));
    assert_memory_equal(out, chrono, sizeof out);
    assert_ok(kvmem_arrange(ids, NULL, 5, KVMEM_ARRANGE_CHRONO, out));
    assert_memory_equal(out, chrono, sizeof out);
    /* the best (8: 0.9) last; 7 (0.1) farthest */
    assert_ok(kvmem_arrange(ids, sc, 5, KVMEM_ARRANGE_SCORE, out));
    assert_memory_equal(out, by_score, sizeof out);
    /* runs {3} best 0.5, {7, 8, 9} best 0.9, {12} best 0.3 */
    assert_ok(kvmem_arrange(ids, sc, 5, KVMEM_ARRANGE_RUNS, out));
    assert_memory_equal(out, runs, sizeof out);
    /* ties: the older block (and run) farther from the new tokens */
    const int32_t tid[4] = {6, 1, 3, 4};
    const float tsc[4] = {1, 1, 1, 1};
    const int32_t tie_score[4] = {1, 3, 4, 6}, tie_runs[4] = {1, 3, 4, 6};
    assert_ok(kvmem_arrange(tid, tsc, 4, KVMEM_ARRANGE_SCORE, out));
    assert_memory_equal(out, tie_score, sizeof tie_score);
    assert_ok(kvmem_arrange(tid, tsc, 4, KVMEM_ARRANGE_RUNS, out));
    assert_memory_equal(out, tie_runs, sizeof tie_runs);
    assert_ok(kvmem_arrange(NULL, NULL, 0, KVMEM_ARRANGE_SCORE, NULL));
}

static void test_bad_input_writes_nothing(void **state) {
    (void)state;
    const int32_t ids[3] = {4, 2, 4}, ok_ids[3] = {4, 2, 5};
    const float sc[3] = {1, 2, 3}, nan_sc[3] = {1, NAN, 3};
    int32_t out[3] = {-7, -7, -7};
    const int32_t untouched[3] = {-7, -7, -7};
    assert_int_equal(kvmem_arrange(ids, sc, 3, KVMEM_ARRANGE_SCORE, out), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvmem_last_error(), "listed twice"));
    assert_int_equal(kvmem_arrange(ok_ids, nan_sc, 3, KVMEM_ARRANGE_SCORE, out), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvmem_last_error(), "NaN"));
    assert_int_equal(kvmem_arrange(ok_ids, NULL, 3, KVMEM_ARRANGE_RUNS, out), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvmem_last_error(), "needs scores"));
    assert_int_equal(kvmem_arrange(ok_ids, sc, 3, (kvmem_arrange_order)7, out), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvmem_arrange(ok_ids, sc, -1, KVMEM_ARRANGE_CHRONO, out), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvmem_arrange(ok_ids, sc, 3, KVMEM_ARRANGE_CHRONO, NULL), KVMEM_ERR_INVALID_ARG);
    const int32_t neg[2] = {1, -1};
    assert_int_equal(kvmem_arrange(neg, sc, 2, KVMEM_ARRANGE_CHRONO, out), KVMEM_ERR_INVALID_ARG);
    assert_memory_equal(out, untouched, sizeof out);
    kvmem_window_plan p = {-1, -1, -1};
    assert_int_equal(kvmem_window_split(256, 16, 1.5f, 0, 16, &p), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvmem_window_split(256, 16, NAN, 0, 16, &p), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvmem_window_split(256, 300, 0.25f, 0, 16, &p), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvmem_window_split(0, 0, 0.25f, 0, 16, &p), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvmem_window_split(256, 16, 0.25f, 0, 0, &p), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvmem_window_split(256, 16, 0.25f, 0, 16, NULL), KVMEM_ERR_INVALID_ARG);
    assert_true(p.memory_tokens == -1 && p.top_k == -1 && p.live_tokens == -1);
}

static void test_split_by_hand(void **state) {
    (void)state;
    kvmem_window_plan p;
    assert_ok(kvmem_window_split(256, 16, 0.25f, 0, 16, &p));
    assert_true(p.memory_tokens == 64 && p.top_k == 4 && p.live_tokens == 176);
    assert_ok(kvmem_window_split(256, 16, 0.25f, 0.25f, 16, &p));
    assert_true(p.memory_tokens == 64 && p.top_k == 4 && p.live_tokens == 64);
    assert_ok(kvmem_window_split(256, 100, 0.75f, 0.5f, 16, &p)); /* 156 left: 144 in blocks, 12 live */
    assert_true(p.memory_tokens == 144 && p.top_k == 9 && p.live_tokens == 12);
    assert_ok(kvmem_window_split(100, 10, 0.3f, 0, 16, &p)); /* 30 tokens: one whole block */
    assert_true(p.memory_tokens == 16 && p.top_k == 1 && p.live_tokens == 74);
    assert_ok(kvmem_window_split(512, 0, 0, 0, 16, &p));
    assert_true(p.memory_tokens == 0 && p.top_k == 0 && p.live_tokens == 512);
}

/* A retrieval set, arranged by score and gathered: the block with the best
 * score ends right before base + M, exactly as that block gathered alone at
 * its place; the chronological arrangement is the set as returned. */
static void test_score_order_puts_the_best_block_last(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_model_spec spec = tu_spec(2, 16);
    kvmem_pool *pool;
    kvmem_agent *ag;
    assert_ok(kvmem_pool_create(ctx, &spec, NULL, &pool));
    assert_ok(kvmem_agent_open(pool, "w", &ag));
    uint64_t rng = 5;
    int64_t T = 16 * 12;
    size_t n = (size_t)(2 * T * 2 * 16);
    float *kv = malloc(n * sizeof(float));
    tu_fill_kv(kv, n, &rng);
    int64_t sh[4] = {2, T, 2, 16};
    kvmem_tensor kt;
    assert_ok(kvmem_tensor_init(&kt, kv, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_append(ag, &kt, &kt, NULL));
    float q[2 * 2 * 4 * 16];
    tu_fill_kv(q, sizeof q / sizeof q[0], &rng);
    int64_t qs[4] = {2, 2, 4, 16};
    kvmem_tensor qt;
    assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 4, qs));
    kvmem_retrieval *r;
    assert_ok(kvmem_retrieval_create(&r));
    kvmem_retrieve_params p = kvmem_retrieve_default_params();
    p.top_k = 4;
    assert_ok(kvmem_retrieve(ag, &qt, &p, r));
    const int32_t *blocks;
    const float *scores;
    int32_t nb;
    assert_ok(kvmem_retrieval_get(r, 0, &blocks, &scores, &nb));
    assert_int_equal(nb, 4);
    int32_t chrono[4], order[4], best = 0;
    assert_ok(kvmem_arrange(blocks, scores, nb, KVMEM_ARRANGE_CHRONO, chrono));
    assert_memory_equal(chrono, blocks, sizeof chrono); /* retrieval returns chronological sets */
    assert_ok(kvmem_arrange(blocks, scores, nb, KVMEM_ARRANGE_SCORE, order));
    for (int32_t i = 1; i < nb; i++)
        if (scores[i] > scores[best]) best = i;
    assert_int_equal(order[3], blocks[best]);
    for (int32_t i = 1; i < 4; i++) {
        int32_t a = -1, b = -1;
        for (int32_t j = 0; j < 4; j++) {
            if (blocks[j] == order[i - 1]) a = j;
            if (blocks[j] == order[i]) b = j;
        }
        assert_true(scores[a] <= scores[b]);
    }
    /* gathered in that order from base 100: the last 16 rows are the best block at 148.. */
    size_t rows = (size_t)(2 * 64 * 2 * 16), one = (size_t)(2 * 16 * 2 * 16);
    float *k_all = malloc(rows * sizeof(float)), *k_one = malloc(one * sizeof(float));
    int64_t s_all[4] = {2, 64, 2, 16}, s_one[4] = {2, 16, 2, 16};
    kvmem_tensor ta, to;
    assert_ok(kvmem_tensor_init(&ta, k_all, KVMEM_F32, 4, s_all));
    assert_ok(kvmem_tensor_init(&to, k_one, KVMEM_F32, 4, s_one));
    assert_ok(kvmem_gather(ag, order, 4, 100, &ta, NULL));
    assert_ok(kvmem_gather(ag, &blocks[best], 1, 148, &to, NULL));
    for (int l = 0; l < 2; l++)
        assert_memory_equal(k_all + (size_t)l * 64 * 32 + 48 * 32, k_one + (size_t)l * 16 * 32, 16 * 32 * sizeof(float));
    free(k_all);
    free(k_one);
    free(kv);
    kvmem_retrieval_free(r);
    kvmem_agent_close(ag);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_orders_worked_by_hand),
        cmocka_unit_test(test_bad_input_writes_nothing),
        cmocka_unit_test(test_split_by_hand),
        cmocka_unit_test(test_score_order_puts_the_best_block_last),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
