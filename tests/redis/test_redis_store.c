/* The Redis store against a real redis-server, started by
 * tests/checks/redis_store.sh, which passes:
 *   KVMEM_TEST_REDIS_PORT     the server's loopback port
 *   KVMEM_TEST_REDIS_SOCK     its unix socket
 *   KVMEM_TEST_REDIS_KILL     a command that kills the server (SIGKILL)
 *   KVMEM_TEST_REDIS_START    a command that starts it again (same data dir,
 *                             appendfsync always) and waits until it answers
 *   KVMEM_TEST_REDIS_CLUSTER  (optional) "host:port" of a 3-master cluster
 * Every test uses its own pool name, so they do not see each other's keys.
 * The test talks to the server directly with hiredis to inspect the layout
 * and to damage values the way a bad disk, a foreign writer or a bug would. */
#include "testutil.h"
#include "internal.h"
#include "store/store.h"

#include <hiredis/hiredis.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int g_port;

static void url_of(char *buf, size_t n, const char *pool, const char *extra) {
    snprintf(buf, n, "redis://127.0.0.1:%d/0?pool=%s%s%s", g_port, pool, extra ? "&" : "", extra ? extra : "");
}

static redisContext *direct(void) {
    redisContext *c = redisConnect("127.0.0.1", g_port);
    if (!c || c->err) fail_msg("cannot connect to the test server: %s", c ? c->errstr : "?");
    return c;
}

static redisReply *rcmd(redisContext *c, int argc, const char **argv, const size_t *lens) {
    redisReply *r = redisCommandArgv(c, argc, argv, lens);
    if (!r) fail_msg("redis command %s failed: %s", argv[0], c->errstr);
    return r;
}

static long long rint_cmd(redisContext *c, const char *a0, const char *a1) {
    const char *av[2] = {a0, a1};
    redisReply *r = rcmd(c, 2, av, NULL);
    long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -999;
    freeReplyObject(r);
    return v;
}

static long long hget_ll(redisContext *c, const char *key, const char *field) {
    const char *av[3] = {"HGET", key, field};
    redisReply *r = rcmd(c, 3, av, NULL);
    long long v = r->type == REDIS_REPLY_STRING ? atoll(r->str) : -1;
    freeReplyObject(r);
    return v;
}

/* Keys matching pattern (KEYS is fine on a test server). */
static size_t count_keys(redisContext *c, const char *pattern) {
    const char *av[2] = {"KEYS", pattern};
    redisReply *r = rcmd(c, 2, av, NULL);
    size_t n = r->type == REDIS_REPLY_ARRAY ? r->elements : 0;
    freeReplyObject(r);
    return n;
}

static void chunk_key(redisContext *c, const char *pool, const char *id, long long i, char *out, size_t n) {
    char m[300];
    snprintf(m, sizeof m, "kvmem:{%s:%s}:m", pool, id);
    const char *av[3] = {"HGET", m, "gen"};
    redisReply *r = rcmd(c, 3, av, NULL);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    snprintf(out, n, "kvmem:{%s:%s}:d:%s:%lld", pool, id, r->str, i);
    freeReplyObject(r);
}

static kvmem_pool *make_pool(kvmem_context *ctx, int32_t L, int32_t D, kvmem_dtype dt, const char *store) {
    kvmem_model_spec spec = tu_spec(L, D);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.storage_dtype = dt;
    pp.block_size = 8;
    pp.store_dir = store;
    kvmem_pool *p = NULL;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &p));
    return p;
}

static const char *k_text = "Hello, world! caf\xc3\xa9 na\xc3\xafve and more text";

static void fill_agent(kvmem_agent *a, int32_t L, int32_t D, int32_t T, uint64_t seed) {
    const int32_t H = 2;
    size_t n = (size_t)L * T * H * D;
    float *k = malloc(n * 4), *v = malloc(n * 4);
    tu_fill_kv(k, n, &seed);
    tu_fill_kv(v, n, &seed);
    int32_t *ids = malloc((size_t)T * 4), *offs = malloc((size_t)T * 4);
    size_t tl = strlen(k_text);
    for (int32_t i = 0; i < T; i++) {
        ids[i] = 1000 + i;
        offs[i] = (int32_t)((size_t)i * tl / (size_t)T);
    }
    kvmem_tensor tk, tv;
    int64_t shape[4] = {L, T, H, D};
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape));
    kvmem_append_params ap = kvmem_append_default_params();
    ap.token_ids = ids;
    ap.text = k_text;
    ap.text_len = tl;
    ap.token_text_offsets = offs;
    assert_ok(kvmem_agent_append(a, &tk, &tv, &ap));
    free(k), free(v), free(ids), free(offs);
}

/* Everything observable about an agent, through the public API. */
typedef struct snap {
    kvmem_agent_info info;
    float *k, *v, *aabb;
    int32_t *ids;
    char *text;
    size_t text_len;
} snap;

static snap take(kvmem_agent *a, int32_t L, int32_t D) {
    snap s;
    memset(&s, 0, sizeof s);
    assert_ok(kvmem_agent_get_info(a, &s.info));
    int64_t T = s.info.n_tokens;
    size_t n = (size_t)L * (size_t)T * 2 * (size_t)D;
    s.k = malloc(n * 4 + 4);
    s.v = malloc(n * 4 + 4);
    if (T) {
        kvmem_tensor tk, tv;
        int64_t shape[4] = {L, T, 2, D};
        assert_ok(kvmem_tensor_init(&tk, s.k, KVMEM_F32, 4, shape));
        assert_ok(kvmem_tensor_init(&tv, s.v, KVMEM_F32, 4, shape));
        assert_ok(kvmem_agent_read(a, 0, T, &tk, &tv));
    }
    size_t per = (size_t)L * 2 * (size_t)D;
    s.aabb = malloc(((size_t)s.info.n_sealed * 2 * per + 1) * 4);
    for (int32_t b = 0; b < s.info.n_sealed; b++)
        assert_ok(kvmem_agent_block_aabb(a, b, s.aabb + (size_t)b * 2 * per, s.aabb + (size_t)b * 2 * per + per));
    s.ids = malloc((size_t)T * 4 + 4);
    if (T) assert_ok(kvmem_agent_tokens(a, 0, T, s.ids));
    const char *t;
    assert_ok(kvmem_agent_text(a, &t, &s.text_len));
    s.text = malloc(s.text_len + 1);
    memcpy(s.text, t, s.text_len);
    return s;
}

static void snap_equal(const snap *x, const snap *y, int32_t L, int32_t D) {
    assert_int_equal(x->info.n_tokens, y->info.n_tokens);
    assert_int_equal(x->info.n_blocks, y->info.n_blocks);
    assert_int_equal(x->info.n_sealed, y->info.n_sealed);
    /* (info.bytes is not compared: a live agent may hold a tail buffer a reloaded one has not allocated yet) */
    size_t n = (size_t)L * (size_t)x->info.n_tokens * 2 * (size_t)D;
    assert_memory_equal(x->k, y->k, n * 4 + 0); /* bit-exact, whatever the dtype */
    assert_memory_equal(x->v, y->v, n * 4 + 0);
    assert_memory_equal(x->aabb, y->aabb, (size_t)x->info.n_sealed * 2 * (size_t)L * 2 * (size_t)D * 4);
    assert_memory_equal(x->ids, y->ids, (size_t)x->info.n_tokens * 4);
    assert_int_equal(x->text_len, y->text_len);
    assert_memory_equal(x->text, y->text, x->text_len);
}

static void snap_free(snap *s) { free(s->k), free(s->v), free(s->aabb), free(s->ids), free(s->text); }

/* Open `id` in a fresh pool on `url` (so it can only come from Redis) and
 * compare with `want`. */
static void fresh_pool_sees(kvmem_context *ctx, const char *url, const char *id, kvmem_dtype dt, int32_t L, int32_t D,
                            const snap *want) {
    kvmem_pool *p = make_pool(ctx, L, D, dt, url);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, id, &a));
    snap got = take(a, L, D);
    snap_equal(want, &got, L, D);
    snap_free(&got);
    kvmem_agent_close(a);
    kvmem_pool_free(p);
}

/* ---- tests ---- */

static void every_dtype_round_trips_in_chunks(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    redisContext *rc = direct();
    const kvmem_dtype dts[] = {KVMEM_F32, KVMEM_F16, KVMEM_BF16, KVMEM_Q8, KVMEM_Q4, KVMEM_Q4_KIVI};
    for (size_t t = 0; t < 6; t++) {
        const int32_t L = 2, D = t % 2 ? 80 : 64;
        char pool[64], url[256], pat[128], mkey[128];
        snprintf(pool, sizeof pool, "rt%zu", t);
        url_of(url, sizeof url, pool, "chunk_bytes=4096"); /* many chunks, a short last one */
        kvmem_pool *p = make_pool(ctx, L, D, dts[t], url);
        kvmem_agent *a;
        assert_ok(kvmem_agent_open(p, "agent-1", &a));
        fill_agent(a, L, D, 21, 5 + t);
        assert_ok(kvmem_agent_flush(a));
        fill_agent(a, L, D, 3, 50 + t);
        assert_ok(kvmem_agent_save(a, NULL));
        /* layout: one manifest and ceil(size / 4096) chunks, all under the agent's hash tag */
        snprintf(mkey, sizeof mkey, "kvmem:{%s:agent-1}:m", pool);
        snprintf(pat, sizeof pat, "kvmem:{%s:agent-1}:*", pool);
        long long size = hget_ll(rc, mkey, "size"), chunks = hget_ll(rc, mkey, "chunks");
        assert_int_equal(hget_ll(rc, mkey, "version"), 1);
        assert_true(size > 4096 * 2);
        assert_int_equal(chunks, (size + 4095) / 4096);
        assert_int_equal(count_keys(rc, pat), (size_t)chunks + 1);
        /* a second save: version 2, and the first generation's chunks are gone */
        fill_agent(a, L, D, 5, 90 + t);
        snap before = take(a, L, D);
        assert_ok(kvmem_agent_save(a, NULL));
        assert_int_equal(hget_ll(rc, mkey, "version"), 2);
        chunks = hget_ll(rc, mkey, "chunks");
        assert_int_equal(count_keys(rc, pat), (size_t)chunks + 1);
        /* no chunk is left with the pending expiry of an uncommitted save */
        char ck[256];
        chunk_key(rc, pool, "agent-1", chunks - 1, ck, sizeof ck);
        assert_int_equal(rint_cmd(rc, "PTTL", ck), -1);
        assert_int_equal(rint_cmd(rc, "PTTL", mkey), -1);
        kvmem_agent_close(a);
        kvmem_pool_free(p);
        fresh_pool_sees(ctx, url, "agent-1", dts[t], L, D, &before);
        snap_free(&before);
    }
    redisFree(rc);
    kvmem_context_free(ctx);
}

static void unix_socket_and_default_chunks_work(void **state) {
    (void)state;
    const char *sock = getenv("KVMEM_TEST_REDIS_SOCK");
    if (!sock || !*sock) skip();
    kvmem_context *ctx = tu_context(1);
    char url[512];
    snprintf(url, sizeof url, "unix://%s?pool=sock&db=0&timeout_ms=2000", sock);
    kvmem_pool *p = make_pool(ctx, 1, 64, KVMEM_F16, url);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "via-socket", &a));
    fill_agent(a, 1, 64, 40, 3);
    snap before = take(a, 1, 64);
    assert_ok(kvmem_agent_save(a, NULL));
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    fresh_pool_sees(ctx, url, "via-socket", KVMEM_F16, 1, 64, &before);
    redisContext *rc = direct(); /* the same server over TCP sees one chunk (4 MiB default) */
    assert_int_equal(hget_ll(rc, "kvmem:{sock:via-socket}:m", "chunks"), 1);
    redisFree(rc);
    snap_free(&before);
    kvmem_context_free(ctx);
}

static void stale_save_conflicts_and_never_overwrites(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    char url[256];
    url_of(url, sizeof url, "cas", "chunk_bytes=1024");
    const int32_t L = 1, D = 64;
    kvmem_pool *pa = make_pool(ctx, L, D, KVMEM_F16, url), *pb = make_pool(ctx, L, D, KVMEM_F16, url);
    kvmem_agent *a, *b;
    assert_ok(kvmem_agent_open(pa, "shared", &a));
    fill_agent(a, L, D, 10, 1);
    assert_ok(kvmem_agent_save(a, NULL)); /* version 1 */
    assert_ok(kvmem_agent_open(pb, "shared", &b)); /* B loads version 1 */
    fill_agent(b, L, D, 6, 2);
    assert_ok(kvmem_agent_save(b, NULL)); /* version 2 */
    snap b2 = take(b, L, D);
    fill_agent(a, L, D, 4, 3);
    snap a_local = take(a, L, D);
    assert_status(kvmem_agent_save(a, NULL), KVMEM_ERR_CONFLICT, "holds version 2, this pool's copy is based on version 1");
    /* A's memory is untouched by the failed save, and the store still has B's */
    snap a_after = take(a, L, D);
    snap_equal(&a_local, &a_after, L, D);
    fresh_pool_sees(ctx, url, "shared", KVMEM_F16, L, D, &b2);
    /* reloading makes A current: its next save wins */
    assert_ok(kvmem_agent_load(a, NULL));
    snap a_reloaded = take(a, L, D);
    snap_equal(&b2, &a_reloaded, L, D);
    fill_agent(a, L, D, 2, 4);
    snap a3 = take(a, L, D);
    assert_ok(kvmem_agent_save(a, NULL)); /* version 3 */
    fresh_pool_sees(ctx, url, "shared", KVMEM_F16, L, D, &a3);
    /* and now B is the stale one */
    assert_status(kvmem_agent_save(b, NULL), KVMEM_ERR_CONFLICT, "holds version 3");
    /* an agent created here while another pool created it too: conflict */
    kvmem_agent *n1, *n2;
    assert_ok(kvmem_agent_open(pa, "born-twice", &n1));
    assert_ok(kvmem_agent_open(pb, "born-twice", &n2));
    fill_agent(n1, L, D, 3, 5);
    fill_agent(n2, L, D, 3, 6);
    assert_ok(kvmem_agent_save(n2, NULL));
    assert_status(kvmem_agent_save(n1, NULL), KVMEM_ERR_CONFLICT, "holds version 1, this pool's copy is based on 0");
    snap_free(&b2), snap_free(&a_local), snap_free(&a_after), snap_free(&a_reloaded), snap_free(&a3);
    kvmem_agent_close(a), kvmem_agent_close(b), kvmem_agent_close(n1), kvmem_agent_close(n2);
    kvmem_pool_free(pa);
    kvmem_pool_free(pb);
    kvmem_context_free(ctx);
}

/* A child process (its own pool, its own connections) writes; returns its exit status. */
static int child_saves(const char *url, const char *id, int32_t T, uint64_t seed, int expect_tokens) {
    pid_t pid = fork();
    if (pid == 0) {
        kvmem_context *ctx;
        kvmem_context_params cp = kvmem_context_default_params();
        cp.n_threads = 1;
        if (kvmem_context_create(&cp, &ctx) != KVMEM_OK) _exit(10);
        kvmem_model_spec spec = tu_spec(1, 64);
        kvmem_pool_params pp = kvmem_pool_default_params();
        pp.block_size = 8;
        pp.store_dir = url;
        kvmem_pool *p;
        kvmem_agent *a;
        if (kvmem_pool_create(ctx, &spec, &pp, &p) != KVMEM_OK) _exit(11);
        if (kvmem_agent_open(p, id, &a) != KVMEM_OK) _exit(12);
        kvmem_agent_info info;
        if (kvmem_agent_get_info(a, &info) != KVMEM_OK || info.n_tokens != expect_tokens) _exit(13);
        /* append like fill_agent, without cmocka in the child */
        size_t n = (size_t)T * 2 * 64;
        float *k = malloc(n * 4), *v = malloc(n * 4);
        tu_fill_kv(k, n, &seed);
        tu_fill_kv(v, n, &seed);
        kvmem_tensor tk, tv;
        int64_t shape[4] = {1, T, 2, 64};
        kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape);
        kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape);
        if (kvmem_agent_append(a, &tk, &tv, NULL) != KVMEM_OK) _exit(14);
        if (kvmem_agent_save(a, NULL) != KVMEM_OK) _exit(15);
        free(k), free(v);
        kvmem_agent_close(a);
        kvmem_pool_free(p);
        kvmem_context_free(ctx);
        _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

/* A load that reads the stored bytes but fails in the core (here: another
 * model's agent) must not make this pool's copy count as that version: its
 * next save conflicts instead of silently replacing what it never held. */
static void failed_load_leaves_the_pool_behind(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    char url[256];
    url_of(url, sizeof url, "failload", "chunk_bytes=1024");
    kvmem_pool *pa = make_pool(ctx, 1, 64, KVMEM_F16, url), *pc = make_pool(ctx, 1, 32, KVMEM_F16, url);
    kvmem_agent *a, *c;
    assert_ok(kvmem_agent_open(pc, "mixed", &c)); /* nothing stored yet: a new agent */
    assert_ok(kvmem_agent_open(pa, "mixed", &a));
    fill_agent(a, 1, 64, 10, 1);
    snap a1 = take(a, 1, 64);
    assert_ok(kvmem_agent_save(a, NULL)); /* version 1, head_dim 64 */
    assert_true(kvmem_agent_load(c, NULL) != KVMEM_OK); /* read, then refused: head_dim 64 is not this pool's 32 */
    fill_agent(c, 1, 32, 4, 2);
    assert_status(kvmem_agent_save(c, NULL), KVMEM_ERR_CONFLICT, "holds version 1, this pool's copy is based on 0");
    fresh_pool_sees(ctx, url, "mixed", KVMEM_F16, 1, 64, &a1);
    snap_free(&a1);
    kvmem_agent_close(a), kvmem_agent_close(c);
    kvmem_pool_free(pa);
    kvmem_pool_free(pc);
    kvmem_context_free(ctx);
}

static void two_processes_share_an_agent(void **state) {
    (void)state;
    char url[256];
    url_of(url, sizeof url, "procs", NULL);
    /* process 1 creates it; process 2 finds process 1's tokens, adds more */
    assert_int_equal(child_saves(url, "fleet-agent", 12, 7, 0), 0);
    assert_int_equal(child_saves(url, "fleet-agent", 5, 8, 12), 0);
    /* this process sees both appends, equal to the same appends made locally */
    kvmem_context *ctx = tu_context(1);
    kvmem_pool *local = make_pool(ctx, 1, 64, KVMEM_F16, NULL);
    kvmem_agent *l;
    assert_ok(kvmem_agent_open(local, "fleet-agent", &l));
    uint64_t seeds[2] = {7, 8};
    int32_t Ts[2] = {12, 5};
    for (int i = 0; i < 2; i++) {
        size_t n = (size_t)Ts[i] * 2 * 64;
        float *k = malloc(n * 4), *v = malloc(n * 4);
        tu_fill_kv(k, n, &seeds[i]);
        tu_fill_kv(v, n, &seeds[i]);
        kvmem_tensor tk, tv;
        int64_t shape[4] = {1, Ts[i], 2, 64};
        assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape));
        assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape));
        assert_ok(kvmem_agent_append(l, &tk, &tv, NULL));
        free(k), free(v);
    }
    snap want = take(l, 1, 64);
    assert_int_equal(want.info.n_tokens, 17);
    fresh_pool_sees(ctx, url, "fleet-agent", KVMEM_F16, 1, 64, &want);
    snap_free(&want);
    kvmem_agent_close(l);
    kvmem_pool_free(local);
    kvmem_context_free(ctx);
}

typedef struct idl {
    char ids[8][64];
    int n;
} idl;

static int collect(const char *id, void *user) {
    idl *l = user;
    if (l->n < 8) snprintf(l->ids[l->n++], sizeof l->ids[0], "%s", id);
    return 0;
}

static void store_write(kvm_store *s, const char *id, const char *payload) {
    kvm_store_writer *w;
    assert_ok(s->iface->open_write(s, id, &w));
    assert_ok(w->write(w, payload, strlen(payload)));
    assert_ok(w->commit(w));
}

static void list_remove_exists_and_ttl(void **state) {
    (void)state;
    char url[256], other[256];
    url_of(url, sizeof url, "lst", "chunk_bytes=16");
    url_of(other, sizeof other, "lst-other", NULL);
    kvm_store *s, *o;
    assert_ok(kvm_store_open(url, &s));
    assert_ok(kvm_store_open(other, &o));
    assert_string_equal(s->iface->name, "redis");
    store_write(s, "b", "a value of more than sixteen bytes");
    store_write(s, "a", "x");
    store_write(s, "c.1", "");
    store_write(o, "zz", "not in pool lst");
    idl l = {0};
    assert_ok(s->iface->list(s, collect, &l));
    assert_int_equal(l.n, 3);
    assert_string_equal(l.ids[0], "a");
    assert_string_equal(l.ids[1], "b");
    assert_string_equal(l.ids[2], "c.1");
    /* read back through the positional reader, across chunk boundaries */
    kvm_store_reader *r;
    uint64_t size;
    assert_ok(s->iface->open_read(s, "b", &r, &size));
    assert_int_equal(size, strlen("a value of more than sixteen bytes"));
    char buf[64] = {0};
    size_t got;
    assert_ok(r->read_at(r, 10, buf, 20, &got));
    assert_int_equal(got, 20);
    assert_memory_equal(buf, "a value of more than sixteen bytes" + 10, 20);
    assert_ok(r->read_at(r, size - 2, buf, 20, &got));
    assert_int_equal(got, 2);
    assert_ok(r->read_at(r, size, buf, 20, &got));
    assert_int_equal(got, 0);
    r->close(r);
    assert_ok(s->iface->open_read(s, "c.1", &r, &size));
    assert_int_equal(size, 0);
    r->close(r);
    int ex = 0;
    assert_ok(s->iface->exists(s, "a", &ex));
    assert_int_equal(ex, 1);
    assert_ok(s->iface->remove(s, "b"));
    assert_status(s->iface->remove(s, "b"), KVMEM_ERR_NOT_FOUND, "no stored agent 'b'");
    assert_ok(s->iface->exists(s, "b", &ex));
    assert_int_equal(ex, 0);
    assert_status(s->iface->open_read(s, "b", &r, &size), KVMEM_ERR_NOT_FOUND, "no stored agent 'b'");
    redisContext *rc = direct();
    assert_int_equal(count_keys(rc, "kvmem:{lst:b}:*"), 0); /* chunks went with the manifest */
    /* bad keys are refused before any I/O */
    assert_status(s->iface->exists(s, ".hidden", &ex), KVMEM_ERR_INVALID_ARG, "not a valid agent id");
    assert_status(s->iface->open_write(s, "a}b", (kvm_store_writer **)&r), KVMEM_ERR_INVALID_ARG, "not a valid agent id");
    kvm_store_free(s);
    kvm_store_free(o);

    /* ttl: manifest and chunks expire together */
    char eph[256];
    url_of(eph, sizeof eph, "eph", "ttl=100&chunk_bytes=16");
    assert_ok(kvm_store_open(eph, &s));
    store_write(s, "short-lived", "forty bytes of ephemeral agent memory...");
    long long pt = rint_cmd(rc, "PTTL", "kvmem:{eph:short-lived}:m");
    assert_true(pt > 90000 && pt <= 100000);
    char ck[256];
    chunk_key(rc, "eph", "short-lived", 2, ck, sizeof ck);
    pt = rint_cmd(rc, "PTTL", ck);
    assert_true(pt > 90000 && pt <= 100000);
    kvm_store_free(s);
    redisFree(rc);
}

/* One store used from several threads at once (the pool saves from agent
 * threads and spills under its mutex): each thread writes and reads back
 * its own agents; run under TSan by make test. */
typedef struct thr_arg {
    kvm_store *s;
    int t;
    int bad;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    char id[32], val[3000], back[3000];
    for (int round = 0; round < 5; round++) {
        snprintf(id, sizeof id, "t%d-%d", a->t, round % 2);
        for (size_t i = 0; i < sizeof val; i++) val[i] = (char)(a->t * 31 + round * 7 + (int)i);
        kvm_store_writer *w;
        kvm_store_reader *r;
        uint64_t size;
        size_t got;
        if (round >= 2) { /* the agent exists: read it first, so the save is based on its version */
            if (a->s->iface->open_read(a->s, id, &r, &size) != KVMEM_OK) a->bad = 1;
            else r->close(r);
        }
        if (a->s->iface->open_write(a->s, id, &w) != KVMEM_OK) { a->bad = 1; continue; }
        if (w->write(w, val, sizeof val) != KVMEM_OK || w->commit(w) != KVMEM_OK) { a->bad = 1; continue; }
        if (a->s->iface->open_read(a->s, id, &r, &size) != KVMEM_OK) { a->bad = 1; continue; }
        if (size != sizeof val || r->read_at(r, 0, back, sizeof back, &got) != KVMEM_OK || got != sizeof back ||
            memcmp(val, back, sizeof val) != 0)
            a->bad = 1;
        r->close(r);
    }
    return NULL;
}

static void one_store_from_several_threads(void **state) {
    (void)state;
    char url[256];
    url_of(url, sizeof url, "thr", "chunk_bytes=1000");
    kvm_store *s;
    assert_ok(kvm_store_open(url, &s));
    pthread_t th[4];
    thr_arg args[4];
    for (int t = 0; t < 4; t++) {
        args[t] = (thr_arg){s, t, 0};
        assert_int_equal(pthread_create(&th[t], NULL, thr_main, &args[t]), 0);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        assert_int_equal(args[t].bad, 0);
    }
    idl l = {0};
    assert_ok(s->iface->list(s, collect, &l));
    assert_int_equal(l.n, 8);
    for (int i = 0; i < l.n; i++) assert_ok(s->iface->remove(s, l.ids[i]));
    kvm_store_free(s);
}

static void connection_failures_and_bad_urls_are_clear(void **state) {
    (void)state;
    kvm_store *s = NULL;
    /* a port nobody listens on: bind one, learn it, close it */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    int dead_port = ntohs(sa.sin_port);
    close(fd);
    char url[256];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", dead_port);
    assert_status(kvm_store_open(url, &s), KVMEM_ERR_IO, "cannot connect");
    assert_null(s);
    /* a server that accepts but never answers: the configured timeout */
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sa.sin_port = 0;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 4), 0);
    sl = sizeof sa;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(url, sizeof url, "redis://127.0.0.1:%d?timeout_ms=200", ntohs(sa.sin_port));
    assert_status(kvm_store_open(url, &s), KVMEM_ERR_IO, "timed out after 200 ms");
    close(fd);
    /* the pool reports the same through kvmem_pool_create */
    kvmem_context *ctx = tu_context(1);
    kvmem_model_spec spec = tu_spec(1, 64);
    kvmem_pool_params pp = kvmem_pool_default_params();
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", dead_port);
    pp.store_dir = url;
    kvmem_pool *p = NULL;
    assert_status(kvmem_pool_create(ctx, &spec, &pp, &p), KVMEM_ERR_IO, "cannot connect");
    assert_null(p);
    kvmem_context_free(ctx);
    /* bad URLs */
    assert_status(kvm_store_open("redis://127.0.0.1:99999", &s), KVMEM_ERR_INVALID_ARG, "bad port");
    assert_status(kvm_store_open("redis://:6379", &s), KVMEM_ERR_INVALID_ARG, "no host");
    assert_status(kvm_store_open("redis://127.0.0.1/x", &s), KVMEM_ERR_INVALID_ARG, "not a number");
    assert_status(kvm_store_open("redis://127.0.0.1?pool=a:b", &s), KVMEM_ERR_INVALID_ARG, "pool name");
    assert_status(kvm_store_open("redis://127.0.0.1?chunk_bytes=1", &s), KVMEM_ERR_INVALID_ARG, "bad option");
    assert_status(kvm_store_open("redis://127.0.0.1?colour=red", &s), KVMEM_ERR_INVALID_ARG, "bad option 'colour=red'");
    assert_status(kvm_store_open("unix://relative.sock", &s), KVMEM_ERR_INVALID_ARG, "absolute socket path");
    assert_null(s);
}

/* A password in the URL never reaches a message: not in the URL that
 * messages quote (parse errors, any part of the URL), not when the server
 * cannot be reached or refuses the credentials, not through
 * kvmem_pool_create; a password holding '?' or '/' is not cut into the
 * options or the database either. */
static void passwords_never_appear_in_messages(void **state) {
    (void)state;
    char urls[10][200];
    int n = 0;
    snprintf(urls[n++], 200, "redis://:s3cretPW@127.0.0.1:99999");
    snprintf(urls[n++], 200, "redis://bob:s3cretPW@127.0.0.1:%d/x", g_port);
    snprintf(urls[n++], 200, "redis://s3cretPW@127.0.0.1:%d?colour=red", g_port);
    snprintf(urls[n++], 200, "redis://:s3cretPW@[::1:%d", g_port);
    snprintf(urls[n++], 200, "redis://:s3cretPW@:%d", g_port);
    snprintf(urls[n++], 200, "redis://:s3cretPW?pool=x@127.0.0.1:99999");
    snprintf(urls[n++], 200, "redis://:s3c/retPW@127.0.0.1:%d/x", g_port);
    snprintf(urls[n++], 200, "redis://:s3cretPW@127.0.0.1:%d?pool=a:b", g_port);
    const int n_parse = n;
    snprintf(urls[n++], 200, "redis://bob:s3cretPW@127.0.0.1:%d", g_port); /* AUTH refused by the server */
    snprintf(urls[n++], 200, "redis://:s3cretPW@127.0.0.1:1");             /* nobody listens */
    kvmem_context *ctx = tu_context(1);
    kvmem_model_spec spec = tu_spec(1, 64);
    for (int i = 0; i < n; i++) {
        kvm_store *s = NULL;
        kvmem_status st = kvm_store_open(urls[i], &s);
        assert_int_not_equal(st, KVMEM_OK);
        assert_null(s);
        const char *msg = kvmem_last_error();
        if (strstr(msg, "s3cret") || strstr(msg, "retPW")) fail_msg("%s: the password is in the message: %s", urls[i], msg);
        if (i < n_parse && !strstr(msg, "***")) fail_msg("%s: the message does not show the URL redacted: %s", urls[i], msg);
        kvmem_pool_params pp = kvmem_pool_default_params();
        pp.store_dir = urls[i];
        kvmem_pool *p = NULL;
        assert_int_equal(kvmem_pool_create(ctx, &spec, &pp, &p), st);
        assert_null(p);
        msg = kvmem_last_error();
        if (strstr(msg, "s3cret") || strstr(msg, "retPW")) fail_msg("%s: the password is in the pool's message: %s", urls[i], msg);
    }
    /* the redacted form keeps what helps: the user, the host, the bad part */
    kvm_store *s = NULL;
    assert_status(kvm_store_open("redis://bob:s3cretPW@127.0.0.1:99999", &s), KVMEM_ERR_INVALID_ARG,
                  "redis://bob:***@127.0.0.1:99999");
    kvmem_context_free(ctx);
}

/* Damage one stored agent in several ways; each load fails with the right
 * code, the pool is unchanged, and repairing the value makes it load again. */
static void damaged_and_foreign_values_are_refused(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    redisContext *rc = direct();
    char url[256];
    url_of(url, sizeof url, "bad", "chunk_bytes=2048");
    kvmem_pool *p = make_pool(ctx, 1, 64, KVMEM_F16, url);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "victim", &a));
    fill_agent(a, 1, 64, 30, 9);
    snap good = take(a, 1, 64);
    assert_ok(kvmem_agent_save(a, NULL));
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    const char *mkey = "kvmem:{bad:victim}:m";
    long long chunks = hget_ll(rc, mkey, "chunks");
    assert_true(chunks >= 3);
    char c1[256], clast[256];
    chunk_key(rc, "bad", "victim", 1, c1, sizeof c1);
    chunk_key(rc, "bad", "victim", chunks - 1, clast, sizeof clast);
    /* keep good copies to restore */
    const char *av_get[2] = {"DUMP", c1}, *av_get2[2] = {"DUMP", clast};
    redisReply *saved1 = rcmd(rc, 2, av_get, NULL), *saved_last = rcmd(rc, 2, av_get2, NULL);
    assert_int_equal(saved1->type, REDIS_REPLY_STRING);
    assert_int_equal(saved_last->type, REDIS_REPLY_STRING);

    struct {
        const char *what;
        kvmem_status code;
        const char *msg;
    } cases[] = {
        {"truncated chunk", KVMEM_ERR_CORRUPT, "holds 100 bytes, the manifest says 2048"},
        {"garbled chunk", KVMEM_ERR_CORRUPT, ""},
        {"missing chunk", KVMEM_ERR_CORRUPT, "chunk 1 of"},
        {"chunk of another type", KVMEM_ERR_FORMAT, "chunk 1 holds a value kvmem did not write"},
        {"foreign string at the manifest", KVMEM_ERR_FORMAT, "holds a value kvmem did not write"},
        {"hash without the magic", KVMEM_ERR_FORMAT, "no 'kvmem-redis/1' magic"},
        {"chunk count does not match", KVMEM_ERR_CORRUPT, "inconsistent"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* snapshot the manifest to restore it after */
        const char *dm[2] = {"DUMP", mkey};
        redisReply *mdump = rcmd(rc, 2, dm, NULL);
        redisReply *x = NULL;
        if (i == 0) {
            char junk[100];
            memset(junk, 'j', sizeof junk);
            const char *av[3] = {"SET", c1, junk};
            size_t lens[3] = {3, strlen(c1), sizeof junk};
            x = rcmd(rc, 3, av, lens);
        } else if (i == 1) {
            /* the last chunk holds tensor data (the header comes first): the checksum catches it */
            const char *av[4] = {"SETRANGE", clast, "3", "\x7f\x7f\x7f"};
            x = rcmd(rc, 4, av, NULL);
        } else if (i == 2) {
            const char *av[2] = {"DEL", c1};
            x = rcmd(rc, 2, av, NULL);
        } else if (i == 3) {
            const char *av[3] = {"DEL", c1};
            freeReplyObject(rcmd(rc, 2, av, NULL));
            const char *av2[3] = {"LPUSH", c1, "x"};
            x = rcmd(rc, 3, av2, NULL);
        } else if (i == 4) {
            const char *av[3] = {"SET", mkey, "{\"someone\":\"else\"}"};
            freeReplyObject(rcmd(rc, 2, (const char *[]){"DEL", mkey}, NULL));
            x = rcmd(rc, 3, av, NULL);
        } else if (i == 5) {
            const char *av[4] = {"HSET", mkey, "magic", "other-app/7"};
            x = rcmd(rc, 4, av, NULL);
        } else {
            const char *av[4] = {"HSET", mkey, "chunks", "2"};
            x = rcmd(rc, 4, av, NULL);
        }
        freeReplyObject(x);
        p = make_pool(ctx, 1, 64, KVMEM_F16, url);
        kvmem_agent *b = NULL;
        kvmem_status st = kvmem_agent_open(p, "victim", &b);
        if (st != cases[i].code)
            fail_msg("%s: got %s (%s), expected %s", cases[i].what, kvmem_status_str(st), kvmem_last_error(),
                     kvmem_status_str(cases[i].code));
        if (!strstr(kvmem_last_error(), cases[i].msg))
            fail_msg("%s: message '%s' lacks '%s'", cases[i].what, kvmem_last_error(), cases[i].msg);
        assert_null(b);
        kvmem_pool_info pi;
        assert_ok(kvmem_pool_get_info(p, &pi));
        assert_int_equal(pi.n_agents, 0); /* nothing half-loaded */
        assert_int_equal(pi.used_bytes, 0);
        if (i == 4 || i == 5) {
            /* a save never overwrites a value kvmem did not write */
            kvm_store *s;
            assert_ok(kvm_store_open(url, &s));
            kvm_store_writer *w;
            assert_ok(s->iface->open_write(s, "victim", &w));
            assert_ok(w->write(w, "x", 1));
            assert_status(w->commit(w), KVMEM_ERR_FORMAT, "not overwritten");
            kvm_store_free(s);
        }
        kvmem_pool_free(p);
        /* restore the manifest and chunk 1 */
        const char *rm[4] = {"DEL", mkey, c1, clast};
        freeReplyObject(rcmd(rc, 4, rm, NULL));
        const char *rsl_[4] = {"RESTORE", clast, "0", saved_last->str};
        size_t rsll[4] = {7, strlen(clast), 1, saved_last->len};
        freeReplyObject(rcmd(rc, 4, rsl_, rsll));
        const char *rs[4] = {"RESTORE", mkey, "0", mdump->str};
        size_t rsl[4] = {7, strlen(mkey), 1, mdump->len};
        freeReplyObject(rcmd(rc, 4, rs, rsl));
        const char *rs1[4] = {"RESTORE", c1, "0", saved1->str};
        size_t rs1l[4] = {7, strlen(c1), 1, saved1->len};
        freeReplyObject(rcmd(rc, 4, rs1, rs1l));
        freeReplyObject(mdump);
        fresh_pool_sees(ctx, url, "victim", KVMEM_F16, 1, 64, &good); /* repaired: loads again */
    }
    freeReplyObject(saved1);
    freeReplyObject(saved_last);
    snap_free(&good);
    redisFree(rc);
    kvmem_context_free(ctx);
}

static void hset_version(redisContext *c, const char *key, const char *v) {
    const char *av[4] = {"HSET", key, "version", v};
    size_t lens[4] = {4, strlen(key), 7, strlen(v)};
    freeReplyObject(rcmd(c, 4, av, lens));
}

/* HGET as the exact string the server holds. */
static void hget_str(redisContext *c, const char *key, const char *field, char *out, size_t n) {
    const char *av[3] = {"HGET", key, field};
    redisReply *r = rcmd(c, 3, av, NULL);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    snprintf(out, n, "%s", r->str);
    freeReplyObject(r);
}

/* The manifest's version is an exact integer end to end. A version that is
 * not a canonical decimal in [1, INT64_MAX] is refused (strtoll used to
 * clamp "99999999999999999999" to INT64_MAX and accept it); one beyond 2^53,
 * where doubles skip integers, is saved as exactly the next integer (the
 * commit script used to compute it as a Lua number and write back
 * "9.007199254741e+15", after which the agent never loaded again); at
 * INT64_MAX a save is refused and the manifest stays as it was. */
static void manifest_version_stays_an_exact_integer(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    redisContext *rc = direct();
    char url[256], got[64];
    url_of(url, sizeof url, "version", NULL);
    const int32_t L = 1, D = 64;
    const char *mkey = "kvmem:{version:counted}:m";
    kvmem_pool *p = make_pool(ctx, L, D, KVMEM_F16, url);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "counted", &a));
    fill_agent(a, L, D, 10, 7);
    assert_ok(kvmem_agent_save(a, NULL));
    snap good = take(a, L, D);
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    hget_str(rc, mkey, "version", got, sizeof got);
    assert_string_equal(got, "1");

    static const char *const bad[] = {"0", "-1", "+5", " 5", "5 ", "05", "", "1e3", "1.0", "0x10", "5\n",
                                      "9223372036854775808", "99999999999999999999", "18446744073709551617"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hset_version(rc, mkey, bad[i]);
        p = make_pool(ctx, L, D, KVMEM_F16, url);
        kvmem_agent *b = NULL;
        kvmem_status st = kvmem_agent_open(p, "counted", &b);
        if (st != KVMEM_ERR_CORRUPT || !strstr(kvmem_last_error(), "version is not an integer in [1, 9223372036854775807]"))
            fail_msg("version '%s': got %s (%s), expected KVMEM_ERR_CORRUPT naming the version", bad[i], kvmem_status_str(st),
                     kvmem_last_error());
        assert_null(b);
        kvmem_pool_info pi;
        assert_ok(kvmem_pool_get_info(p, &pi));
        assert_int_equal(pi.n_agents, 0);
        kvmem_pool_free(p);
    }

    /* 2^53 + 1 (no double holds it) and INT64_MAX - 1: load, save, and the
     * next version is the exact next integer, which loads again */
    static const char *const from[] = {"9007199254740993", "9223372036854775806"};
    static const char *const next[] = {"9007199254740994", "9223372036854775807"};
    for (int i = 0; i < 2; i++) {
        hset_version(rc, mkey, from[i]);
        p = make_pool(ctx, L, D, KVMEM_F16, url);
        assert_ok(kvmem_agent_open(p, "counted", &a));
        snap loaded = take(a, L, D);
        snap_equal(&good, &loaded, L, D);
        fill_agent(a, L, D, 3, 11 + (uint64_t)i);
        snap_free(&good);
        good = take(a, L, D);
        assert_ok(kvmem_agent_save(a, NULL));
        hget_str(rc, mkey, "version", got, sizeof got);
        if (strcmp(got, next[i]) != 0) fail_msg("saved on top of version %s: the manifest says '%s', want '%s'", from[i], got, next[i]);
        kvmem_agent_close(a);
        kvmem_pool_free(p);
        snap_free(&loaded);
        fresh_pool_sees(ctx, url, "counted", KVMEM_F16, L, D, &good);
    }

    /* at INT64_MAX: it loads, a save is refused, nothing changes */
    p = make_pool(ctx, L, D, KVMEM_F16, url);
    assert_ok(kvmem_agent_open(p, "counted", &a));
    fill_agent(a, L, D, 2, 13);
    assert_status(kvmem_agent_save(a, NULL), KVMEM_ERR_CAPACITY, "is at version 9223372036854775807, the last one");
    hget_str(rc, mkey, "version", got, sizeof got);
    assert_string_equal(got, "9223372036854775807");
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    fresh_pool_sees(ctx, url, "counted", KVMEM_F16, L, D, &good);
    assert_int_equal(count_keys(rc, "kvmem:{version:counted}:d:*"), (size_t)hget_ll(rc, mkey, "chunks"));

    snap_free(&good);
    redisFree(rc);
    kvmem_context_free(ctx);
}

static void server_killed_mid_save_keeps_the_old_version(void **state) {
    (void)state;
    const char *kill_cmd = getenv("KVMEM_TEST_REDIS_KILL"), *start_cmd = getenv("KVMEM_TEST_REDIS_START");
    if (!kill_cmd || !start_cmd) skip();
    kvmem_context *ctx = tu_context(1);
    char url[256];
    url_of(url, sizeof url, "crash", "chunk_bytes=1024&timeout_ms=2000");
    kvmem_pool *p = make_pool(ctx, 1, 64, KVMEM_F16, url);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "survivor", &a));
    fill_agent(a, 1, 64, 20, 11);
    snap v1 = take(a, 1, 64);
    assert_ok(kvmem_agent_save(a, NULL));
    kvmem_agent_close(a);
    kvmem_pool_free(p);

    /* a newer save, interrupted: chunks written, the server dies, the commit fails */
    kvm_store *s;
    assert_ok(kvm_store_open(url, &s));
    kvm_store_reader *r;
    uint64_t size;
    assert_ok(s->iface->open_read(s, "survivor", &r, &size)); /* based on version 1 */
    r->close(r);
    kvm_store_writer *w;
    assert_ok(s->iface->open_write(s, "survivor", &w));
    char junk[3000];
    memset(junk, 'n', sizeof junk);
    assert_ok(w->write(w, junk, sizeof junk)); /* two chunks sent */
    assert_int_equal(system(kill_cmd), 0);
    kvmem_status st = w->write(w, junk, sizeof junk);
    if (st == KVMEM_OK) st = w->commit(w);
    else w->abort(w);
    assert_int_equal(st, KVMEM_ERR_IO);
    /* while it is down, saves and loads fail clearly */
    assert_status(s->iface->open_read(s, "survivor", &r, &size), KVMEM_ERR_IO, "redis 127.0.0.1:");
    assert_ok(system(start_cmd) == 0 ? KVMEM_OK : KVMEM_ERR_INTERNAL);
    kvm_store_free(s);

    /* after the restart the old version is there and loads */
    fresh_pool_sees(ctx, url, "survivor", KVMEM_F16, 1, 64, &v1);
    redisContext *rc = direct();
    assert_int_equal(hget_ll(rc, "kvmem:{crash:survivor}:m", "version"), 1);
    /* the interrupted save's chunks are orphans with an expiry, not a leak */
    const char *av[2] = {"KEYS", "kvmem:{crash:survivor}:d:*"};
    redisReply *keys = rcmd(rc, 2, av, NULL);
    char live[256];
    chunk_key(rc, "crash", "survivor", 0, live, sizeof live);
    size_t gen_len = strlen(live) - 1; /* up to ":" before the chunk index */
    int orphans = 0;
    for (size_t i = 0; i < keys->elements; i++) {
        if (strncmp(keys->element[i]->str, live, gen_len) == 0) continue;
        orphans++;
        long long pt = rint_cmd(rc, "PTTL", keys->element[i]->str);
        assert_true(pt > 0);
    }
    assert_true(orphans >= 1);
    freeReplyObject(keys);
    redisFree(rc);
    snap_free(&v1);
    kvmem_context_free(ctx);
}

/* ---- a commit whose reply is lost ---- */

/* A loopback proxy in front of the test server that can lose one reply: when
 * armed with n, the n-th commit script sent (on any connection) is forwarded,
 * the proxy waits until the server answers (the script has run: Redis runs it
 * whole), then closes the connection without passing the answer on. The client sees what
 * it sees when Redis dies (or a network fails) right after a commit. */
#define PX_MAX_CONN 64
static const char k_commit_marker[] = "redis.call('HSET', KEYS[1], 'magic'";

typedef struct proxy {
    int lfd, port;
    pthread_t acceptor, conn[PX_MAX_CONN];
    int n_conn;
    atomic_int stop, armed, dropped;
} proxy;

typedef struct px_conn {
    proxy *px;
    int cfd, sfd;
} px_conn;

static int send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

static int contains(const char *hay, size_t n, const char *needle, size_t m) {
    for (size_t i = 0; i + m <= n; i++)
        if (memcmp(hay + i, needle, m) == 0) return 1;
    return 0;
}

static void *px_pump(void *arg) {
    px_conn *pc = arg;
    proxy *px = pc->px;
    const size_t ml = sizeof k_commit_marker - 1;
    char buf[65536 + sizeof k_commit_marker], tail[sizeof k_commit_marker] = {0};
    size_t tl = 0;
    int dropping = 0; /* this connection carries the commit whose answer is lost */
    while (!atomic_load(&px->stop)) {
        struct pollfd fds[2] = {{pc->cfd, POLLIN, 0}, {pc->sfd, POLLIN, 0}};
        if (poll(fds, 2, 100) < 0) break;
        if (fds[0].revents) { /* client -> server, looking for the commit */
            ssize_t k = recv(pc->cfd, buf + tl, 65536, 0);
            if (k <= 0) break;
            memcpy(buf, tail, tl); /* the previous read's end: a marker split across reads */
            size_t n = tl + (size_t)k;
            if (!dropping && atomic_load(&px->armed) > 0 && contains(buf, n, k_commit_marker, ml))
                dropping = atomic_fetch_sub(&px->armed, 1) == 1;
            if (send_all(pc->sfd, buf + tl, (size_t)k) != 0) break;
            tl = n < ml - 1 ? n : ml - 1;
            memcpy(tail, buf + n - tl, tl);
        }
        if (fds[1].revents) { /* server -> client */
            ssize_t k = recv(pc->sfd, buf, 65536, 0);
            if (k <= 0) break;
            if (dropping) {
                atomic_fetch_add(&px->dropped, 1);
                break; /* the script ran; its answer goes nowhere */
            }
            if (send_all(pc->cfd, buf, (size_t)k) != 0) break;
        }
    }
    close(pc->cfd);
    close(pc->sfd);
    free(pc);
    return NULL;
}

static void *px_accept(void *arg) {
    proxy *px = arg;
    while (!atomic_load(&px->stop)) {
        struct pollfd pf = {px->lfd, POLLIN, 0};
        if (poll(&pf, 1, 100) <= 0) continue;
        int cfd = accept(px->lfd, NULL, NULL);
        if (cfd < 0) continue;
        int sfd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        px_conn *pc = malloc(sizeof *pc);
        if (sfd < 0 || !pc || connect(sfd, (struct sockaddr *)&sa, sizeof sa) != 0 || px->n_conn == PX_MAX_CONN) {
            close(cfd);
            if (sfd >= 0) close(sfd);
            free(pc);
            continue;
        }
        pc->px = px, pc->cfd = cfd, pc->sfd = sfd;
        if (pthread_create(&px->conn[px->n_conn], NULL, px_pump, pc) == 0) px->n_conn++;
        else close(cfd), close(sfd), free(pc);
    }
    return NULL;
}

static void proxy_start(proxy *px) {
    memset(px, 0, sizeof *px);
    px->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    assert_true(px->lfd >= 0);
    assert_int_equal(bind(px->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(px->lfd, 16), 0);
    assert_int_equal(getsockname(px->lfd, (struct sockaddr *)&sa, &sl), 0);
    px->port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(&px->acceptor, NULL, px_accept, px), 0);
}

static void proxy_stop(proxy *px) {
    atomic_store(&px->stop, 1);
    pthread_join(px->acceptor, NULL);
    for (int i = 0; i < px->n_conn; i++) pthread_join(px->conn[i], NULL);
    close(px->lfd);
}

static void proxied_url(char *buf, size_t n, const proxy *px, const char *pool) {
    snprintf(buf, n, "redis://127.0.0.1:%d/0?pool=%s&chunk_bytes=1024", px->port, pool);
}

/* One save whose nth commit script (1: the first) runs on the server but
 * whose answer is lost. */
static void save_losing_the_reply(proxy *px, kvmem_agent *a, int nth) {
    int before = atomic_load(&px->dropped);
    atomic_store(&px->armed, nth);
    assert_status(kvmem_agent_save(a, NULL), KVMEM_ERR_IO, "committing the manifest");
    assert_int_equal(atomic_load(&px->dropped), before + 1);
    assert_int_equal(atomic_load(&px->armed), 0);
}

/* A save stored by Redis whose answer never came back is this pool's own:
 * the next saves build on it instead of being refused as "saved elsewhere"
 * for good (acknowledged writes would be lost at shutdown). */
static void own_unanswered_commit_is_adopted(void **state) {
    (void)state;
    proxy px;
    proxy_start(&px);
    kvmem_context *ctx = tu_context(1);
    char url[256], direct_url[256];
    proxied_url(url, sizeof url, &px, "lostreply");
    url_of(direct_url, sizeof direct_url, "lostreply", NULL);
    kvmem_pool *p = make_pool(ctx, 1, 64, KVMEM_F16, url);
    redisContext *rc = direct();
    const char *mkey = "kvmem:{lostreply:mine}:m";
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "mine", &a));
    fill_agent(a, 1, 64, 20, 31);
    assert_ok(kvmem_agent_save(a, NULL)); /* version 1 */
    fill_agent(a, 1, 64, 9, 32);
    snap a2 = take(a, 1, 64);
    save_losing_the_reply(&px, a, 1);
    assert_int_equal(hget_ll(rc, mkey, "version"), 2); /* stored all the same */
    fresh_pool_sees(ctx, direct_url, "mine", KVMEM_F16, 1, 64, &a2);
    fill_agent(a, 1, 64, 5, 33);
    snap a3 = take(a, 1, 64);
    assert_ok(kvmem_agent_save(a, NULL)); /* builds on its own version 2 */
    assert_int_equal(hget_ll(rc, mkey, "version"), 3);
    fresh_pool_sees(ctx, direct_url, "mine", KVMEM_F16, 1, 64, &a3);
    /* two in a row: the second (which adopts the first) loses its answer too */
    fill_agent(a, 1, 64, 3, 34);
    save_losing_the_reply(&px, a, 1); /* version 4 */
    fill_agent(a, 1, 64, 3, 35);
    save_losing_the_reply(&px, a, 2); /* conflicts with 4, adopts it, stores 5: that answer lost */
    assert_int_equal(hget_ll(rc, mkey, "version"), 5);
    fill_agent(a, 1, 64, 4, 36);
    snap a6 = take(a, 1, 64);
    assert_ok(kvmem_agent_save(a, NULL));
    assert_int_equal(hget_ll(rc, mkey, "version"), 6);
    fresh_pool_sees(ctx, direct_url, "mine", KVMEM_F16, 1, 64, &a6);
    /* only the live generation's chunks are left (the adopted ones were collected) */
    assert_int_equal(count_keys(rc, "kvmem:{lostreply:mine}:d:*"), hget_ll(rc, mkey, "chunks"));
    /* a new agent whose first save loses its answer */
    kvmem_agent *n;
    assert_ok(kvmem_agent_open(p, "newborn", &n));
    fill_agent(n, 1, 64, 11, 37);
    save_losing_the_reply(&px, n, 1);
    fill_agent(n, 1, 64, 2, 38);
    snap n2 = take(n, 1, 64);
    assert_ok(kvmem_agent_save(n, NULL));
    assert_int_equal(hget_ll(rc, "kvmem:{lostreply:newborn}:m", "version"), 2);
    fresh_pool_sees(ctx, direct_url, "newborn", KVMEM_F16, 1, 64, &n2);
    snap_free(&a2), snap_free(&a3), snap_free(&a6), snap_free(&n2);
    kvmem_agent_close(a), kvmem_agent_close(n);
    kvmem_pool_free(p);
    redisFree(rc);
    kvmem_context_free(ctx);
    proxy_stop(&px);
}

/* Another pool's save is never taken for this pool's unanswered one: after
 * it, this pool's saves are refused as before. */
static void unanswered_commit_never_covers_another_writer(void **state) {
    (void)state;
    proxy px;
    proxy_start(&px);
    kvmem_context *ctx = tu_context(1);
    char url[256], direct_url[256];
    proxied_url(url, sizeof url, &px, "lostfor");
    url_of(direct_url, sizeof direct_url, "lostfor", "chunk_bytes=1024");
    kvmem_pool *pa = make_pool(ctx, 1, 64, KVMEM_F16, url), *pb = make_pool(ctx, 1, 64, KVMEM_F16, direct_url);
    redisContext *rc = direct();
    /* A's commit lands (answer lost), then B loads it and saves on top */
    kvmem_agent *a, *b;
    assert_ok(kvmem_agent_open(pa, "shared", &a));
    fill_agent(a, 1, 64, 20, 41);
    assert_ok(kvmem_agent_save(a, NULL)); /* version 1 */
    fill_agent(a, 1, 64, 6, 42);
    save_losing_the_reply(&px, a, 1); /* version 2, A's */
    assert_ok(kvmem_agent_open(pb, "shared", &b));
    fill_agent(b, 1, 64, 3, 43);
    snap b3 = take(b, 1, 64);
    assert_ok(kvmem_agent_save(b, NULL)); /* version 3, B's */
    fill_agent(a, 1, 64, 2, 44);
    assert_status(kvmem_agent_save(a, NULL), KVMEM_ERR_CONFLICT, "holds version 3, this pool's copy is based on version 1");
    fresh_pool_sees(ctx, direct_url, "shared", KVMEM_F16, 1, 64, &b3);
    /* B saves first, then A's commit is refused on the server and that
     * answer is lost: A's next save still finds B's version, not its own */
    kvmem_agent *a2, *b2;
    assert_ok(kvmem_agent_open(pa, "second", &a2));
    fill_agent(a2, 1, 64, 10, 45);
    assert_ok(kvmem_agent_save(a2, NULL)); /* version 1 */
    assert_ok(kvmem_agent_open(pb, "second", &b2));
    fill_agent(b2, 1, 64, 4, 46);
    snap b2v = take(b2, 1, 64);
    assert_ok(kvmem_agent_save(b2, NULL)); /* version 2, B's */
    fill_agent(a2, 1, 64, 4, 47);
    save_losing_the_reply(&px, a2, 1); /* refused on the server: nothing of A's stored */
    assert_int_equal(hget_ll(rc, "kvmem:{lostfor:second}:m", "version"), 2);
    assert_status(kvmem_agent_save(a2, NULL), KVMEM_ERR_CONFLICT, "holds version 2, this pool's copy is based on version 1");
    fresh_pool_sees(ctx, direct_url, "second", KVMEM_F16, 1, 64, &b2v);
    /* and reloading still makes A current */
    assert_ok(kvmem_agent_load(a2, NULL));
    fill_agent(a2, 1, 64, 2, 48);
    assert_ok(kvmem_agent_save(a2, NULL));
    assert_int_equal(hget_ll(rc, "kvmem:{lostfor:second}:m", "version"), 3);
    snap_free(&b3), snap_free(&b2v);
    kvmem_agent_close(a), kvmem_agent_close(b), kvmem_agent_close(a2), kvmem_agent_close(b2);
    kvmem_pool_free(pa);
    kvmem_pool_free(pb);
    redisFree(rc);
    kvmem_context_free(ctx);
    proxy_stop(&px);
}

static void cluster_keeps_each_agent_in_one_slot(void **state) {
    (void)state;
    const char *node = getenv("KVMEM_TEST_REDIS_CLUSTER");
    if (!node || !*node) skip();
    kvmem_context *ctx = tu_context(1);
    char url[256];
    snprintf(url, sizeof url, "redis://%s?pool=cl&chunk_bytes=512", node);
    kvmem_pool *p = make_pool(ctx, 1, 64, KVMEM_Q8, url);
    char ids[6][16];
    snap want[6];
    for (int i = 0; i < 6; i++) {
        snprintf(ids[i], sizeof ids[i], "agent-%d", i);
        kvmem_agent *a;
        assert_ok(kvmem_agent_open(p, ids[i], &a));
        fill_agent(a, 1, 64, 17 + i, 100 + (uint64_t)i);
        want[i] = take(a, 1, 64);
        assert_ok(kvmem_agent_save(a, NULL));
        fill_agent(a, 1, 64, 2, 200 + (uint64_t)i);
        snap_free(&want[i]);
        want[i] = take(a, 1, 64);
        assert_ok(kvmem_agent_save(a, NULL)); /* the old generation is collected on its node */
        kvmem_agent_close(a);
    }
    kvmem_pool_free(p);
    kvm_store *s;
    assert_ok(kvm_store_open(url, &s));
    idl l = {0};
    assert_ok(s->iface->list(s, collect, &l)); /* scans every master */
    assert_int_equal(l.n, 6);
    for (int i = 0; i < 6; i++) assert_string_equal(l.ids[i], ids[i]);
    for (int i = 0; i < 6; i++) fresh_pool_sees(ctx, url, ids[i], KVMEM_Q8, 1, 64, &want[i]);
    for (int i = 0; i < 6; i++) {
        assert_ok(s->iface->remove(s, ids[i]));
        snap_free(&want[i]);
    }
    l.n = 0;
    assert_ok(s->iface->list(s, collect, &l));
    assert_int_equal(l.n, 0);
    kvm_store_free(s);
    kvmem_context_free(ctx);
}

int main(void) {
    const char *port = getenv("KVMEM_TEST_REDIS_PORT");
    if (!port || !*port) {
        printf("skipped: KVMEM_TEST_REDIS_PORT not set (tests/checks/redis_store.sh starts a server and runs this)\n");
        return 77;
    }
    g_port = atoi(port);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_dtype_round_trips_in_chunks),
        cmocka_unit_test(unix_socket_and_default_chunks_work),
        cmocka_unit_test(stale_save_conflicts_and_never_overwrites),
        cmocka_unit_test(failed_load_leaves_the_pool_behind),
        cmocka_unit_test(two_processes_share_an_agent),
        cmocka_unit_test(list_remove_exists_and_ttl),
        cmocka_unit_test(one_store_from_several_threads),
        cmocka_unit_test(connection_failures_and_bad_urls_are_clear),
        cmocka_unit_test(passwords_never_appear_in_messages),
        cmocka_unit_test(damaged_and_foreign_values_are_refused),
        cmocka_unit_test(manifest_version_stays_an_exact_integer),
        cmocka_unit_test(server_killed_mid_save_keeps_the_old_version),
        cmocka_unit_test(own_unanswered_commit_is_adopted),
        cmocka_unit_test(unanswered_commit_never_covers_another_writer),
        cmocka_unit_test(cluster_keeps_each_agent_in_one_slot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
