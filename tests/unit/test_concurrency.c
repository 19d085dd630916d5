/* One pool, many agents, several threads: each thread owns its agents
 * (per-agent sequential use), all share the pool and its worker threads.
 * Run under TSan by `make test`; here it also checks every agent's memory
 * is exactly what its own thread appended. */
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_THREADS = 4, AGENTS_PER_THREAD = 3, ROUNDS = 12, L = 2, H = 2, D = 16 };

typedef struct worker_arg {
    kvmem_pool *pool;
    int id;
    int failures;
} worker_arg;

static void *worker(void *p) {
    worker_arg *w = p;
    uint64_t rng = 1000 + (uint64_t)w->id;
    float k[L * 8 * H * D], v[L * 8 * H * D], back[L * 8 * H * D];
    for (int r = 0; r < ROUNDS; r++) {
        for (int a = 0; a < AGENTS_PER_THREAD; a++) {
            char id[32];
            snprintf(id, sizeof id, "t%d-a%d", w->id, a);
            kvmem_agent *ag = NULL;
            if (kvmem_agent_open(w->pool, id, &ag) != KVMEM_OK) {
                w->failures++;
                continue;
            }
            int64_t T = 1 + (int64_t)(tu_next(&rng) % 8);
            /* values encode (thread, agent, round) so cross-talk would show */
            for (int i = 0; i < L * T * H * D; i++) k[i] = v[i] = (float)(w->id * 1000 + a * 100 + r);
            int64_t shape[4] = {L, T, H, D};
            kvmem_tensor kt, vt, bt;
            kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape);
            kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape);
            kvmem_agent_info before;
            kvmem_agent_get_info(ag, &before);
            if (kvmem_agent_append(ag, &kt, &vt, NULL) != KVMEM_OK) w->failures++;
            if (r % 5 == 4) kvmem_agent_flush(ag);
            kvmem_tensor_init(&bt, back, KVMEM_F32, 4, shape);
            if (kvmem_agent_read(ag, before.n_tokens, T, &bt, NULL) != KVMEM_OK) w->failures++;
            for (int i = 0; i < L * T * H * D; i++)
                if (back[i] != k[i]) {
                    w->failures++;
                    break;
                }
            kvmem_agent_close(ag);
        }
        /* shared, read-only pool queries from every thread */
        kvmem_pool_info pi;
        kvmem_pool_get_info(w->pool, &pi);
        char buf[64];
        for (int i = 0; i < pi.n_agents; i++) kvmem_pool_agent_id(w->pool, i, buf, sizeof buf, NULL);
        /* churn: a scratch agent created and removed */
        char tmp[32];
        snprintf(tmp, sizeof tmp, "scratch-%d", w->id);
        kvmem_agent *s = NULL;
        if (kvmem_agent_open(w->pool, tmp, &s) == KVMEM_OK) {
            kvmem_agent_close(s);
            if (kvmem_pool_remove_agent(w->pool, tmp) != KVMEM_OK) w->failures++;
        }
    }
    return NULL;
}

static void many_agents_many_threads_one_pool(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(3);
    kvmem_model_spec spec = tu_spec(L, D);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = 4;
    pp.storage_dtype = KVMEM_F32;
    kvmem_pool *pool = NULL;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &pool));
    pthread_t th[N_THREADS];
    worker_arg args[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        args[i] = (worker_arg){pool, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N_THREADS; i++) assert_int_equal(args[i].failures, 0);
    kvmem_pool_info pi;
    kvmem_pool_get_info(pool, &pi);
    assert_int_equal(pi.n_agents, N_THREADS * AGENTS_PER_THREAD);
    /* accounting adds up: the pool's bytes are the sum of its agents' */
    uint64_t sum = 0;
    for (int i = 0; i < pi.n_agents; i++) {
        char id[64];
        kvmem_pool_agent_id(pool, i, id, sizeof id, NULL);
        kvmem_agent *a = NULL;
        assert_ok(kvmem_agent_open(pool, id, &a));
        kvmem_agent_info ai;
        kvmem_agent_get_info(a, &ai);
        sum += ai.bytes;
        kvmem_agent_close(a);
    }
    assert_int_equal(sum, pi.used_bytes);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
}

static void *ctx_worker(void *p) {
    (void)p;
    for (int i = 0; i < 20; i++) {
        kvmem_backend_info info[8];
        size_t n = 0;
        if (kvmem_backends(info, 8, &n) != KVMEM_OK) return (void *)1;
        kvmem_context *ctx = NULL;
        kvmem_context_params cp = kvmem_context_default_params();
        cp.backend = "cpu";
        cp.n_threads = 2;
        if (kvmem_context_create(&cp, &ctx) != KVMEM_OK) return (void *)1;
        kvmem_context_free(ctx);
    }
    return NULL;
}

static void concurrent_contexts_and_backend_queries(void **state) {
    (void)state;
    pthread_t th[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, ctx_worker, NULL), 0);
    for (int i = 0; i < 4; i++) {
        void *r = NULL;
        pthread_join(th[i], &r);
        assert_null(r);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(many_agents_many_threads_one_pool),
        cmocka_unit_test(concurrent_contexts_and_backend_queries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
