/* The *_errbuf forms: a call that fails on a worker thread hands its message
 * back in the caller's buffer (what a koffi async call needs), equal to what
 * kvmem_last_error() says on that thread; success empties the buffer; the
 * buffer is cut, never overrun; the call runs once. */
#define KVMEM_ALLOW_DEPRECATED /* these tests call the deprecated *_errbuf forms on purpose */
#include "testutil.h"
#include "internal.h" /* kvm_clear_error */

#include <pthread.h>
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_worker_failure_comes_back_in_the_buffer),
        cmocka_unit_test(success_empties_the_buffer_and_runs_once),
        cmocka_unit_test(the_buffer_is_cut_never_overrun),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
