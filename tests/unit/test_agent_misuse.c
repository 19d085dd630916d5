/* Misuse detection (SQLite's SQLITE_MISUSE is the model): the contract says
 * one thread at a time per agent handle; two threads on one handle, or a
 * close while another thread appends, used to crash. Now a second
 * concurrent call returns KVMEM_ERR_BUSY naming the agent, and a close
 * waits for the call in flight. The first test holds a call open
 * deterministically (the log callback runs inside the failing call); the
 * second hammers one handle from several threads (also in the TSan build)
 * and checks that every call got OK, BUSY or CLOSED and that the agent is
 * exactly the sum of the appends that returned OK. */
#include "testutil.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define L_ 2
#define D_ 8
#define H_ 2
#define T_ 4 /* tokens per append */

static kvmem_pool *make_pool(kvmem_context *ctx) {
    kvmem_model_spec spec = tu_spec(L_, D_);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = 8;
    pp.storage_dtype = KVMEM_F32; /* read back exactly, sealed or not */
    kvmem_pool *p = NULL;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &p));
    return p;
}

static float g_k[L_ * T_ * H_ * D_], g_v[L_ * T_ * H_ * D_];

static kvmem_status append(kvmem_agent *a) {
    kvmem_tensor tk, tv;
    int64_t shape[4] = {L_, T_, H_, D_};
    kvmem_tensor_init(&tk, g_k, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&tv, g_v, KVMEM_F32, 4, shape);
    return kvmem_agent_append(a, &tk, &tv, NULL);
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- a call held open ---------------------------------------------------- */

static kvmem_agent *g_agent;
static atomic_int g_armed, g_inside, g_release, g_closed;
static pthread_t g_holder_self; /* written by the holder before it arms */

/* Runs inside the holder's failing kvmem_agent_append (kvm_fail logs at
 * DEBUG level): the handle is taken until it returns. */
static void hold_inside(kvmem_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
    if (!atomic_load(&g_armed) || !pthread_equal(pthread_self(), g_holder_self)) return;
    atomic_store(&g_armed, 0);
    atomic_store(&g_inside, 1);
    while (!atomic_load(&g_release)) sleep_ms(1);
}

static void *holder(void *arg) {
    (void)arg;
    g_holder_self = pthread_self();
    atomic_store(&g_armed, 1);
    /* K NULL: refused inside the call, after the handle was taken */
    kvmem_status st = kvmem_agent_append(g_agent, NULL, NULL, NULL);
    return (void *)(intptr_t)st;
}

static void *closer(void *arg) {
    (void)arg;
    kvmem_agent_close(g_agent);
    atomic_store(&g_closed, 1);
    return NULL;
}

static void second_call_is_busy_and_close_waits_for_the_call_in_flight(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_pool *p = make_pool(ctx);
    assert_ok(kvmem_agent_open(p, "shared-agent", &g_agent));
    assert_ok(append(g_agent));
    kvmem_log_set(hold_inside, NULL);
    pthread_t hold;
    assert_int_equal(pthread_create(&hold, NULL, holder, NULL), 0);
    while (!atomic_load(&g_inside)) sleep_ms(1);

    /* every call on the taken handle: BUSY, naming the agent, nothing done */
    kvmem_agent_info info;
    assert_status(kvmem_agent_get_info(g_agent, &info), KVMEM_ERR_BUSY, "'shared-agent'");
    assert_status(append(g_agent), KVMEM_ERR_BUSY, "in use");
    assert_status(kvmem_agent_flush(g_agent), KVMEM_ERR_BUSY, "'shared-agent'");
    assert_status(kvmem_agent_truncate(g_agent, 0), KVMEM_ERR_BUSY, "'shared-agent'");
    float buf[L_ * T_ * H_ * D_];
    kvmem_tensor t;
    int64_t shape[4] = {L_, 1, H_, D_};
    assert_ok(kvmem_tensor_init(&t, buf, KVMEM_F32, 4, shape));
    assert_status(kvmem_agent_read(g_agent, 0, 1, &t, NULL), KVMEM_ERR_BUSY, "'shared-agent'");
    kvmem_prefix_result pr;
    assert_status(kvmem_prefix_match(g_agent, "x", 1, NULL, &pr), KVMEM_ERR_BUSY, "'shared-agent'");
    assert_status(kvmem_agent_save(g_agent, "/nonexistent/x.safetensors"), KVMEM_ERR_BUSY, "'shared-agent'");
    kvmem_agent *both[1] = {g_agent};
    int64_t len;
    assert_status(kvmem_batch_merge(both, 1, 0, &t, NULL, &len), KVMEM_ERR_BUSY, "'shared-agent'");
    assert_string_equal(kvmem_agent_get_id(g_agent), "shared-agent"); /* read-only, always answers */

    /* a close from a third thread waits for the call in flight */
    pthread_t c;
    assert_int_equal(pthread_create(&c, NULL, closer, NULL), 0);
    sleep_ms(50);
    assert_int_equal(atomic_load(&g_closed), 0);
    atomic_store(&g_release, 1);
    void *rv;
    pthread_join(hold, &rv);
    assert_int_equal((int)(intptr_t)rv, KVMEM_ERR_INVALID_ARG); /* the held call finished normally */
    pthread_join(c, NULL);
    assert_int_equal(atomic_load(&g_closed), 1);
    kvmem_log_set(NULL, NULL);
    /* closed now: CLOSED, not BUSY */
    assert_status(kvmem_agent_get_info(g_agent, &info), KVMEM_ERR_CLOSED, "closed");
    /* the agent kept its one append */
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "shared-agent", &a));
    assert_ok(kvmem_agent_get_info(a, &info));
    assert_int_equal(info.n_tokens, T_);
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

/* ---- several threads on one handle ---------------------------------------- */

#define N_THREADS 4
#define N_CALLS 200 /* calls that got through, per thread, unless closed first */

typedef struct worker {
    int id;
    kvmem_agent *a;
    int64_t appended; /* appends that returned OK */
    int64_t busy, closed;
    char bad[256];    /* the first unexpected outcome */
} worker;

static atomic_int g_go, g_through;

static void *hammer(void *arg) {
    worker *w = arg;
    kvmem_retrieval *r = NULL;
    kvmem_retrieval_create(&r);
    float q[1 * L_ * 4 * D_];
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) q[i] = (float)((i * 7) % 5) - 2.0f;
    kvmem_tensor qt;
    int64_t qs[4] = {1, L_, 4, D_};
    kvmem_tensor_init(&qt, q, KVMEM_F32, 4, qs);
    float out[L_ * 2 * H_ * D_];
    kvmem_tensor ot;
    int64_t os[4] = {L_, 2, H_, D_};
    kvmem_tensor_init(&ot, out, KVMEM_F32, 4, os);
    while (!atomic_load(&g_go)) sleep_ms(1);
    for (int it = 0, ok = 0; ok < N_CALLS && !w->bad[0]; it++) {
        kvmem_status st;
        kvmem_agent_info info;
        switch ((it + w->id) % 5) {
        case 0: st = append(w->a); break;
        case 1: st = kvmem_agent_get_info(w->a, &info); break;
        case 2: st = kvmem_agent_read(w->a, 0, 2, &ot, NULL); break;
        case 3: st = kvmem_retrieve(w->a, &qt, NULL, r); break;
        default: st = kvmem_agent_flush(w->a); break;
        }
        if (st == KVMEM_OK) {
            ok++;
            atomic_fetch_add(&g_through, 1);
            if ((it + w->id) % 5 == 0) w->appended++;
        } else if (st == KVMEM_ERR_BUSY) {
            w->busy++;
            if (!strstr(kvmem_last_error(), "'hammered'"))
                snprintf(w->bad, sizeof w->bad, "BUSY without the agent's name: %s", kvmem_last_error());
            sched_yield(); /* let the holder finish: real interleavings, not a spin */
        } else if (st == KVMEM_ERR_CLOSED) {
            w->closed++;
            break;
        } else {
            snprintf(w->bad, sizeof w->bad, "%s: %s", kvmem_status_str(st), kvmem_last_error());
        }
    }
    kvmem_retrieval_free(r);
    return NULL;
}

static void threads_on_one_handle_get_busy_or_ok_never_a_crash(void **state) {
    (void)state;
    uint64_t rng = 3;
    tu_fill_kv(g_k, sizeof g_k / sizeof g_k[0], &rng);
    tu_fill_kv(g_v, sizeof g_v / sizeof g_v[0], &rng);
    kvmem_context *ctx = tu_context(2);
    kvmem_pool *p = make_pool(ctx);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "hammered", &a));
    assert_ok(append(a)); /* something to read from the start */
    worker w[N_THREADS];
    pthread_t t[N_THREADS];
    memset(w, 0, sizeof w);
    atomic_store(&g_go, 0);
    for (int i = 0; i < N_THREADS; i++) {
        w[i].id = i;
        w[i].a = a;
        assert_int_equal(pthread_create(&t[i], NULL, hammer, &w[i]), 0);
    }
    atomic_store(&g_go, 1);
    /* and a close while they run (half way): it waits for the call in flight */
    while (atomic_load(&g_through) < N_THREADS * N_CALLS / 2) sleep_ms(1);
    kvmem_agent_close(a);
    int64_t appended = 1, busy = 0;
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(t[i], NULL);
        if (w[i].bad[0]) fail_msg("thread %d: %s", i, w[i].bad);
        appended += w[i].appended;
        busy += w[i].busy;
    }
    print_message("hammer: %lld appends went through, %lld calls were refused as busy\n", (long long)appended,
                  (long long)busy);
    /* every append that returned OK is there, whole, and nothing else */
    assert_ok(kvmem_agent_open(p, "hammered", &a));
    kvmem_agent_info info;
    assert_ok(kvmem_agent_get_info(a, &info));
    assert_int_equal(info.n_tokens, appended * T_);
    size_t n = (size_t)L_ * (size_t)info.n_tokens * H_ * D_;
    float *k = malloc((n ? n : 1) * sizeof *k);
    kvmem_tensor kt;
    int64_t ks[4] = {L_, info.n_tokens, H_, D_};
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, ks));
    assert_ok(kvmem_agent_read(a, 0, info.n_tokens, &kt, NULL));
    /* each appended copy equals the first (f32 storage: exact) */
    for (int64_t c = 1; c < appended; c++)
        for (int l = 0; l < L_; l++)
            assert_memory_equal(k + ((size_t)l * (size_t)info.n_tokens + (size_t)(c * T_)) * H_ * D_,
                                k + (size_t)l * (size_t)info.n_tokens * H_ * D_, (size_t)T_ * H_ * D_ * sizeof *k);
    free(k);
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(second_call_is_busy_and_close_waits_for_the_call_in_flight),
        cmocka_unit_test(threads_on_one_handle_get_busy_or_ok_never_a_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
