/* A call that fails on a worker thread hands its message to a caller on
 * another thread (what a koffi async call needs), equal to what
 * kvmem_last_error() said on that thread, two ways:
 *  - the object the call was made on keeps it (kvmem_agent_last_error,
 *    kvmem_pool_last_error, kvmem_context_last_error): an agent source's
 *    failure in kvmem_attend goes to the context; a successful call and a
 *    call refused before it took the object (a busy agent) leave it as it
 *    was; it is cut, never overrun; two threads failing on one pool at once
 *    leave one whole message;
 *  - the deprecated *_errbuf forms copy it into the caller's buffer; success
 *    empties the buffer; the buffer is cut, never overrun; the call runs
 *    once. */
#define KVMEM_ALLOW_DEPRECATED /* these tests call the deprecated *_errbuf forms on purpose */
#include "testutil.h"
#include "internal.h" /* kvm_clear_error */

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { L = 2, D = 8, T = 6 };

typedef struct world {
    kvmem_context *ctx;
    kvmem_pool *pool;
    kvmem_agent *agent;
    kvmem_retrieval *res;
    kvmem_model_spec spec;
    float k[L * T * 2 * D], v[L * T * 2 * D];
    kvmem_tensor kt, vt;
} world;

static world *make(void) {
    world *w = calloc(1, sizeof *w);
    w->ctx = tu_context(1);
    w->spec = tu_spec(L, D);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = 2;
    pp.storage_dtype = KVMEM_F32;
    assert_ok(kvmem_pool_create(w->ctx, &w->spec, &pp, &w->pool));
    assert_ok(kvmem_agent_open(w->pool, "alice", &w->agent));
    assert_ok(kvmem_retrieval_create(&w->res));
    uint64_t rng = 7;
    tu_fill_kv(w->k, sizeof w->k / sizeof *w->k, &rng);
    tu_fill_kv(w->v, sizeof w->v / sizeof *w->v, &rng);
    int64_t shape[4] = {L, T, 2, D};
    assert_ok(kvmem_tensor_init(&w->kt, w->k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&w->vt, w->v, KVMEM_F32, 4, shape));
    return w;
}

static void destroy(world *w) {
    kvmem_retrieval_free(w->res);
    kvmem_pool_free(w->pool);
    kvmem_context_free(w->ctx);
    free(w);
}

/* One failing call of each form, by number. */
enum { N_FORMS = 8 };
static const char *const NEEDLE[N_FORMS] = {
    "kvmem_pool_sync: the pool has no store_dir", "K is NULL", "tokens [0, 1000) outside [0, 6)",
    "no path given", "no file '/nonexistent-dir/x.safetensors'", "query is NULL", "blocks[0] = 99",
    "layer 7 outside [0, 2)",
};

static kvmem_status call_form(world *w, int form, char *buf, size_t size) {
    kvmem_tensor q;
    float qd[4 * D] = {0};
    int64_t qshape[3] = {1, 4, D};
    int32_t bad_block = 99;
    switch (form) {
    case 0: return kvmem_pool_sync_errbuf(w->pool, buf, size);
    case 1: return kvmem_agent_append_errbuf(w->agent, NULL, &w->vt, NULL, buf, size);
    case 2: return kvmem_agent_read_errbuf(w->agent, 0, 1000, NULL, NULL, buf, size);
    case 3: return kvmem_agent_save_errbuf(w->agent, NULL, buf, size);
    case 4: return kvmem_agent_load_errbuf(w->agent, "/nonexistent-dir/x.safetensors", buf, size);
    case 5: return kvmem_retrieve_errbuf(w->agent, NULL, NULL, w->res, buf, size);
    case 6: return kvmem_gather_errbuf(w->agent, &bad_block, 1, 0, NULL, NULL, buf, size);
    default: {
        assert_ok(kvmem_tensor_init(&q, qd, KVMEM_F32, 3, qshape));
        kvmem_attend_source src = {0};
        src.kind = KVMEM_ATTEND_SRC_AGENT;
        src.agent = w->agent;
        src.layer = 7; /* no such layer */
        float out[4 * D];
        kvmem_tensor ot;
        assert_ok(kvmem_tensor_init(&ot, out, KVMEM_F32, 3, qshape));
        return kvmem_attend_errbuf(w->ctx, &q, &src, NULL, &ot, NULL, buf, size);
    }
    }
}

typedef struct job {
    world *w;
    int form;
    kvmem_status st;
    char buf[512];
    char tls[512]; /* kvmem_last_error() on the worker, right after the call */
} job;

static void *worker(void *arg) {
    job *j = arg;
    memset(j->buf, 'x', sizeof j->buf);
    j->st = call_form(j->w, j->form, j->buf, sizeof j->buf);
    snprintf(j->tls, sizeof j->tls, "%s", kvmem_last_error());
    return NULL;
}

static void a_worker_failure_comes_back_in_the_buffer(void **state) {
    (void)state;
    world *w = make();
    assert_ok(kvmem_agent_append(w->agent, &w->kt, &w->vt, NULL));
    for (int form = 0; form < N_FORMS; form++) {
        kvm_clear_error();
        job j = {.w = w, .form = form};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, worker, &j), 0);
        pthread_join(t, NULL);
        if (j.st == KVMEM_OK) fail_msg("form %d did not fail", form);
        assert_true(strlen(j.buf) > 0);
        assert_string_equal(j.buf, j.tls);
        if (!strstr(j.buf, NEEDLE[form])) fail_msg("form %d: '%s' lacks '%s'", form, j.buf, NEEDLE[form]);
        /* the message never reached this thread: that is what the buffer is for */
        assert_string_equal(kvmem_last_error(), "");
    }
    /* a failed call changed nothing */
    kvmem_agent_info info;
    assert_ok(kvmem_agent_get_info(w->agent, &info));
    assert_int_equal(info.n_tokens, T);
    destroy(w);
}

static void success_empties_the_buffer_and_runs_once(void **state) {
    (void)state;
    world *w = make();
    char buf[64];
    memset(buf, 'x', sizeof buf);
    assert_ok(kvmem_agent_append_errbuf(w->agent, &w->kt, &w->vt, NULL, buf, sizeof buf));
    assert_string_equal(buf, "");
    kvmem_agent_info info;
    assert_ok(kvmem_agent_get_info(w->agent, &info));
    assert_int_equal(info.n_tokens, T); /* appended once, not twice */
    /* read back through the errbuf form: the same values */
    float k2[L * T * 2 * D];
    int64_t shape[4] = {L, T, 2, D};
    kvmem_tensor kt2;
    assert_ok(kvmem_tensor_init(&kt2, k2, KVMEM_F32, 4, shape));
    memset(buf, 'x', sizeof buf);
    assert_ok(kvmem_agent_read_errbuf(w->agent, 0, T, &kt2, NULL, buf, sizeof buf));
    assert_string_equal(buf, "");
    assert_memory_equal(k2, w->k, sizeof k2);
    destroy(w);
}

static void the_buffer_is_cut_never_overrun(void **state) {
    (void)state;
    world *w = make();
    char full[512];
    assert_int_equal(kvmem_agent_read_errbuf(w->agent, 0, 1000, NULL, NULL, full, sizeof full), KVMEM_ERR_INVALID_ARG);
    assert_true(strlen(full) > 8);
    char small[16];
    memset(small, '#', sizeof small);
    assert_int_equal(kvmem_agent_read_errbuf(w->agent, 0, 1000, NULL, NULL, small, 6), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(strlen(small), 5);
    assert_memory_equal(small, full, 5);
    for (size_t i = 6; i < sizeof small; i++) assert_int_equal(small[i], '#');
    /* size 1: only the terminator */
    memset(small, '#', sizeof small);
    assert_int_equal(kvmem_agent_read_errbuf(w->agent, 0, 1000, NULL, NULL, small, 1), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(small[0], '\0');
    assert_int_equal(small[1], '#');
    /* NULL buffer or size 0: the status alone, nothing written */
    memset(small, '#', sizeof small);
    assert_int_equal(kvmem_agent_read_errbuf(w->agent, 0, 1000, NULL, NULL, NULL, 64), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvmem_agent_read_errbuf(w->agent, 0, 1000, NULL, NULL, small, 0), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(small[0], '#');
    destroy(w);
}

enum { ON_AGENT, ON_POOL, ON_CONTEXT };

/* One failing call of each kind, by number: which object keeps its
 * message, and a piece of that message. */
static const struct {
    int on;
    const char *needle;
} CALLS[] = {
    {ON_POOL, "kvmem_pool_sync: the pool has no store_dir"},
    {ON_AGENT, "K is NULL"},
    {ON_AGENT, "tokens [0, 1000) outside [0, 6)"},
    {ON_AGENT, "no path given"},
    {ON_AGENT, "no file '/nonexistent-dir/x.safetensors'"},
    {ON_AGENT, "query is NULL"},
    {ON_AGENT, "blocks[0] = 99"},
    {ON_CONTEXT, "layer 7 outside [0, 2)"}, /* an agent source: the context keeps it */
    {ON_CONTEXT, "kvmem_qmem_score"},
    {ON_POOL, "agent id '.x' is invalid"},
    {ON_POOL, "no agent 'nobody'"},
};
enum { N_CALLS = sizeof CALLS / sizeof CALLS[0] };

static kvmem_status call(world *w, int c) {
    kvmem_tensor q, ot;
    float qd[4 * D] = {0}, out[4 * D];
    int64_t qshape[3] = {1, 4, D};
    int32_t bad_block = 99;
    kvmem_agent *a2 = NULL;
    switch (c) {
    case 0: return kvmem_pool_sync(w->pool);
    case 1: return kvmem_agent_append(w->agent, NULL, &w->vt, NULL);
    case 2: return kvmem_agent_read(w->agent, 0, 1000, NULL, NULL);
    case 3: return kvmem_agent_save(w->agent, NULL);
    case 4: return kvmem_agent_load(w->agent, "/nonexistent-dir/x.safetensors");
    case 5: return kvmem_retrieve(w->agent, NULL, NULL, w->res);
    case 6: return kvmem_gather(w->agent, &bad_block, 1, 0, NULL, NULL);
    case 7: {
        assert_ok(kvmem_tensor_init(&q, qd, KVMEM_F32, 3, qshape));
        assert_ok(kvmem_tensor_init(&ot, out, KVMEM_F32, 3, qshape));
        kvmem_attend_source src = {0};
        src.kind = KVMEM_ATTEND_SRC_AGENT;
        src.agent = w->agent;
        src.layer = 7; /* no such layer */
        return kvmem_attend(w->ctx, &q, &src, NULL, &ot, NULL);
    }
    case 8: return kvmem_qmem_score(w->ctx, &w->spec, NULL, NULL, NULL);
    case 9: return kvmem_agent_open(w->pool, ".x", &a2);
    default: return kvmem_pool_remove_agent(w->pool, "nobody");
    }
}

static size_t object_error(world *w, int on, char *buf, size_t size) {
    return on == ON_AGENT ? kvmem_agent_last_error(w->agent, buf, size)
         : on == ON_POOL  ? kvmem_pool_last_error(w->pool, buf, size)
                          : kvmem_context_last_error(w->ctx, buf, size);
}

typedef struct ojob {
    world *w;
    int c;
    kvmem_status st;
    char tls[512]; /* kvmem_last_error() on the worker, right after the call */
} ojob;

static void *oworker(void *arg) {
    ojob *j = arg;
    j->st = call(j->w, j->c);
    snprintf(j->tls, sizeof j->tls, "%s", kvmem_last_error());
    return NULL;
}

static void a_worker_failure_is_kept_by_its_object(void **state) {
    (void)state;
    world *w = make();
    assert_ok(kvmem_agent_append(w->agent, &w->kt, &w->vt, NULL));
    for (int c = 0; c < N_CALLS; c++) {
        ojob j = {.w = w, .c = c};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, oworker, &j), 0);
        pthread_join(t, NULL);
        if (j.st == KVMEM_OK) fail_msg("call %d did not fail", c);
        char got[512];
        size_t n = object_error(w, CALLS[c].on, got, sizeof got);
        assert_int_equal(n, strlen(j.tls));
        assert_string_equal(got, j.tls);
        if (!strstr(got, CALLS[c].needle)) fail_msg("call %d: '%s' lacks '%s'", c, got, CALLS[c].needle);
        /* and it went to that object only: the others still hold what they held */
        for (int on = ON_AGENT; on <= ON_CONTEXT; on++) {
            if (on == CALLS[c].on) continue;
            char other[512];
            object_error(w, on, other, sizeof other);
            if (!strcmp(other, got)) fail_msg("call %d: object %d has its message too", c, on);
        }
    }
    /* a failed call changed nothing */
    kvmem_agent_info info;
    assert_ok(kvmem_agent_get_info(w->agent, &info));
    assert_int_equal(info.n_tokens, T);
    destroy(w);
}

static void success_and_refusals_leave_the_message(void **state) {
    (void)state;
    world *w = make();
    char before[512], after[512];
    assert_int_equal(kvmem_agent_last_error(w->agent, before, sizeof before), 0); /* nothing failed yet */
    assert_string_equal(before, "");
    assert_int_equal(kvmem_agent_read(w->agent, 0, 1000, NULL, NULL), KVMEM_ERR_INVALID_ARG);
    kvmem_agent_last_error(w->agent, before, sizeof before);
    assert_ok(kvmem_agent_append(w->agent, &w->kt, &w->vt, NULL));
    kvmem_agent_last_error(w->agent, after, sizeof after);
    assert_string_equal(after, before);
    /* a NULL object: "" and 0, nothing read */
    char buf[8] = "#######";
    assert_int_equal(kvmem_agent_last_error(NULL, buf, sizeof buf), 0);
    assert_string_equal(buf, "");
    assert_int_equal(kvmem_pool_last_error(NULL, NULL, 0), 0);
    assert_int_equal(kvmem_context_last_error(NULL, NULL, 0), 0);
    destroy(w);
}

/* Holds a call on the agent open from a log callback, which runs inside the
 * failing call (kvm_fail logs), so the main thread can try the agent. */
static atomic_int g_inside, g_release;
static void hold_inside(kvmem_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
    atomic_store(&g_inside, 1);
    while (!atomic_load(&g_release)) {
    }
}

static void *holder(void *arg) {
    world *w = arg;
    kvmem_agent_read(w->agent, 0, 1000, NULL, NULL);
    return NULL;
}

static void a_busy_refusal_leaves_the_holders_message(void **state) {
    (void)state;
    world *w = make();
    atomic_store(&g_inside, 0);
    atomic_store(&g_release, 0);
    kvmem_log_set(hold_inside, NULL);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, holder, w), 0);
    while (!atomic_load(&g_inside)) {
    }
    kvmem_log_set(NULL, NULL); /* the busy refusal below must not block in the callback */
    assert_status(kvmem_agent_append(w->agent, &w->kt, &w->vt, NULL), KVMEM_ERR_BUSY, "in use by a call on another thread");
    atomic_store(&g_release, 1);
    pthread_join(t, NULL);
    char got[512];
    kvmem_agent_last_error(w->agent, got, sizeof got);
    if (!strstr(got, "tokens [0, 1000) outside [0, 0)")) fail_msg("the holder's message was replaced: '%s'", got);
    destroy(w);
}

static void the_objects_copy_is_cut_never_overrun(void **state) {
    (void)state;
    world *w = make();
    assert_int_equal(kvmem_agent_read(w->agent, 0, 1000, NULL, NULL), KVMEM_ERR_INVALID_ARG);
    char full[512];
    const size_t n = kvmem_agent_last_error(w->agent, full, sizeof full);
    assert_true(n > 8);
    assert_int_equal(n, strlen(full));
    char small[16];
    memset(small, '#', sizeof small);
    assert_int_equal(kvmem_agent_last_error(w->agent, small, 6), n); /* the full length, whatever fits */
    assert_int_equal(strlen(small), 5);
    assert_memory_equal(small, full, 5);
    for (size_t i = 6; i < sizeof small; i++) assert_int_equal(small[i], '#');
    memset(small, '#', sizeof small);
    assert_int_equal(kvmem_agent_last_error(w->agent, small, 1), n);
    assert_int_equal(small[0], '\0');
    assert_int_equal(small[1], '#');
    assert_int_equal(kvmem_agent_last_error(w->agent, NULL, 0), n);
    destroy(w);
}

/* Two threads fail on one pool over and over while a third reads its
 * message: every read is one whole message of one of them. */
typedef struct racer {
    world *w;
    const char *id;
    atomic_int *stop;
} racer;

static void *race_fail(void *arg) {
    racer *r = arg;
    kvmem_agent *a;
    for (int i = 0; i < 2000 && !atomic_load(r->stop); i++) kvmem_agent_open(r->w->pool, r->id, &a);
    return NULL;
}

static void concurrent_failures_leave_one_whole_message(void **state) {
    (void)state;
    world *w = make();
    atomic_int stop;
    atomic_init(&stop, 0);
    racer r1 = {w, ".first-bad-id", &stop}, r2 = {w, ".the-other-bad-one-quite-a-lot-longer", &stop};
    pthread_t t1, t2;
    assert_int_equal(pthread_create(&t1, NULL, race_fail, &r1), 0);
    assert_int_equal(pthread_create(&t2, NULL, race_fail, &r2), 0);
    char m1[512] = "", m2[512] = "";
    for (int i = 0; i < 3000; i++) {
        char got[512];
        kvmem_pool_last_error(w->pool, got, sizeof got);
        if (!*got) continue;
        const int first = strstr(got, r1.id) != NULL, second = strstr(got, r2.id) != NULL;
        if (first == second || !strstr(got, "is invalid: use 1-128 of")) {
            atomic_store(&stop, 1);
            fail_msg("a torn message: '%s'", got);
        }
        snprintf(first ? m1 : m2, sizeof m1, "%s", got);
    }
    atomic_store(&stop, 1);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    /* each failure's message is that thread's exact text */
    kvmem_agent *a;
    assert_status(kvmem_agent_open(w->pool, r1.id, &a), KVMEM_ERR_INVALID_ARG, "");
    char want[512];
    snprintf(want, sizeof want, "%s", kvmem_last_error());
    char got[512];
    kvmem_pool_last_error(w->pool, got, sizeof got);
    assert_string_equal(got, want);
    if (*m1) assert_string_equal(m1, want);
    destroy(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_worker_failure_comes_back_in_the_buffer),
        cmocka_unit_test(success_empties_the_buffer_and_runs_once),
        cmocka_unit_test(the_buffer_is_cut_never_overrun),
        cmocka_unit_test(a_worker_failure_is_kept_by_its_object),
        cmocka_unit_test(success_and_refusals_leave_the_message),
        cmocka_unit_test(a_busy_refusal_leaves_the_holders_message),
        cmocka_unit_test(the_objects_copy_is_cut_never_overrun),
        cmocka_unit_test(concurrent_failures_leave_one_whole_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
