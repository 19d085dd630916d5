/* Allocation-failure injection over the public API (SQLite's OOM tests are
 * the model). Every allocation in core/ goes through core/alloc.h; this
 * program fails the Nth of them for every N a call makes, and again with
 * every allocation from the Nth on failing, for each call of a compact
 * scenario that touches every allocating public function. For every N:
 *  - the call returns KVMEM_ERR_NOMEM and its message says "out of memory
 *    for <what>", or it returns KVMEM_OK with exactly the result of a run
 *    without failures (a fallback that did not need the memory);
 *  - on failure the objects are unchanged: a digest of everything the API
 *    can observe (pool and agent info, every agent's KV, tokens, text and
 *    AABBs, retrieval results, QueryMemory, slot maps and their store,
 *    segment state, output buffers, and the bytes of every file in the
 *    store and file directories) equals the digest taken before the call;
 *  - nothing leaks: once the fixture is freed no block is live (the
 *    allocator counts them; the ASan build checks again with LeakSanitizer);
 *  - no file is left that does not load (file bytes are in the digest, and
 *    the reference run loads what it saved).
 * The fixture is built fresh (without failures) before each run; contexts
 * have one thread so the Nth allocation is the same one in every run. The
 * device-routed paths run on a second CPU backend installed as the
 * context's "device" (the CPU backend implements the device ops).
 * KVMEM_OOM_OP=name runs one call; KVMEM_OOM_SITES=1 lists the sites failed.
 *
 * The Redis store: with KVMEM_TEST_REDIS_PORT (and _SOCK, _AUTH) set by
 * tests/checks/redis_oom.sh, which starts a server of its own, this program
 * sweeps the redis_* calls instead: pool creation (TCP, unix socket, ACL
 * user and password), agent open from the store, save (new and replacing),
 * load, list, remove, sync and a close that spills, through a redis://
 * store with 1 KiB chunks (several chunks per agent). The database is
 * emptied before every run. The digest also covers every key in it
 * (generation names are random, so a chunk records whether its generation
 * is the one its manifest names; values, sizes and expiries as they are)
 * and every stored agent as a second pool loads it: a failed call leaves
 * Redis as it was, and every stored agent loads bit for bit. After every
 * run each agent of the pool must still save: a version the pool forgot
 * would make it conflict with its own earlier save.
 * Allocations covered: all of the core's and all of the plugin's own code
 * (libkvmem-redis.so allocates through the core's allocator, handed over in
 * kvm_store_host). Not covered: those inside hiredis. Debian 12's hiredis
 * 0.14 has no allocator hooks (hiredisSetAllocators came with 1.0) and calls
 * libc's malloc directly; interposing malloc would fight the sanitizers'
 * allocators (core/alloc.h). Its connect functions copy the address with
 * hi_malloc/hi_strdup, which abort() on failure. With hiredis 1.x the hooks
 * exist but are process-wide (they would fail this program's own
 * connection and any other hiredis user in the process), so neither the
 * plugin nor this test sets them. */
#include "testutil.h"
#include "alloc.h"
#include "cpu/cpu_backend.h"
#include "backend/route/context.h"
#include "pool/pool.h"
#include "store/store.h"

#ifndef KVMEM_OOM_REDIS_BUILT
#  define KVMEM_OOM_REDIS_BUILT 0
#endif
#if KVMEM_OOM_REDIS_BUILT
#  include <hiredis/hiredis.h>
#endif

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NL 2
#define NQH 4
#define NKVH 2
#define HD 8
#define BSZ 8
#define ROW (NKVH * HD)

static char g_root[256], g_store[300], g_files[300];
/* the Redis store's URL (pool "oom", 1 KiB chunks), "" without a server;
 * the same server through its unix socket and as an ACL user */
static char g_redis[512], g_redis_unix[512], g_redis_auth[512];
#define REDIS_POOL "oom"
static void redis_flush(void);

/* ---- the fixture -------------------------------------------------------- */

#define OUT_BYTES (1 << 17)
#define N_AG 4

typedef struct fx {
    kvmem_context *ctx;
    kvmem_backend *dev; /* a second CPU backend standing in for a device */
    kvmem_model_spec spec;
    kvmem_pool *pool;
    kvmem_agent *ag[N_AG]; /* open handles: all of them are digested */
    kvmem_retrieval *ret;
    kvmem_qmem_store *qs;
    kvmem_session_key key;
    kvmem_qmem_head *head;
    kvmem_kvstore *kvs;
    kvmem_slotmap *sm[2];
    kvmem_segments *segs;
    int64_t i64[8];
    int32_t i32[8];
    unsigned char out[OUT_BYTES]; /* outputs of the call under test */
} fx;

static fx F;

static int32_t g_window[NL] = {0, 16};

static kvmem_model_spec spec(void) {
    kvmem_model_spec s = tu_spec(NL, HD);
    s.layer_window = g_window;
    return s;
}

/* [NL][T][NKVH][HD] K and V, deterministic. */
static float *kv_new(int64_t T, uint64_t seed, float **v) {
    size_t n = (size_t)NL * (size_t)T * ROW;
    float *k = malloc((n ? n : 1) * sizeof *k);
    *v = malloc((n ? n : 1) * sizeof **v);
    uint64_t r = seed;
    for (size_t i = 0; i < n; i++) {
        k[i] = tu_normal(&r);
        (*v)[i] = tu_normal(&r);
    }
    return k;
}

static kvmem_tensor t4(float *d, int64_t a, int64_t b, int64_t c, int64_t e) {
    kvmem_tensor t;
    int64_t sh[4] = {a, b, c, e};
    assert_ok(kvmem_tensor_init(&t, d, KVMEM_F32, 4, sh));
    return t;
}

static kvmem_tensor t3(float *d, int64_t a, int64_t b, int64_t c) {
    kvmem_tensor t;
    int64_t sh[3] = {a, b, c};
    assert_ok(kvmem_tensor_init(&t, d, KVMEM_F32, 3, sh));
    return t;
}

/* Append T tokens (ids first.., text "w<i> " each, offsets) with an optional
 * rotation; returns the status. */
static kvmem_status append(kvmem_agent *a, int64_t first, int64_t T, uint64_t seed, int rotated) {
    float *v, *k = kv_new(T, seed, &v);
    kvmem_tensor kt = t4(k, NL, T, NKVH, HD), vt = t4(v, NL, T, NKVH, HD);
    int32_t *ids = malloc((size_t)(T ? T : 1) * sizeof *ids), *offs = malloc((size_t)(T ? T : 1) * sizeof *offs);
    int32_t *pos = malloc((size_t)(T ? T : 1) * sizeof *pos);
    char *text = malloc((size_t)T * 16 + 1);
    size_t tl = 0;
    for (int64_t i = 0; i < T; i++) {
        ids[i] = (int32_t)(100 + first + i);
        pos[i] = (int32_t)(first + i);
        offs[i] = (int32_t)tl;
        tl += (size_t)sprintf(text + tl, "w%lld ", (long long)(first + i));
    }
    kvmem_append_params ap = kvmem_append_default_params();
    ap.token_ids = ids;
    ap.text = text;
    ap.text_len = tl;
    ap.token_text_offsets = offs;
    if (rotated) {
        ap.keys_rotated = 1;
        ap.positions = pos;
    }
    kvmem_status st = kvmem_agent_append(a, &kt, &vt, &ap);
    free(k), free(v), free(ids), free(offs), free(pos), free(text);
    return st;
}

static void make_ctx(void) {
    F.ctx = tu_context(1);
    F.spec = spec();
}

static void make_pool_p(uint64_t capacity, uint64_t budget, int with_store) {
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = BSZ;
    pp.capacity_bytes = capacity;
    pp.host_budget_bytes = budget;
    pp.store_dir = with_store ? g_store : NULL;
    assert_ok(kvmem_pool_create(F.ctx, &F.spec, &pp, &F.pool));
}

static void make_pool(void) { make_pool_p(0, 0, 1); }

static void make_pool_redis(void) {
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = BSZ;
    pp.store_dir = g_redis;
    assert_ok(kvmem_pool_create(F.ctx, &F.spec, &pp, &F.pool));
}

static kvmem_agent *open_ag(int slot, const char *id) {
    assert_ok(kvmem_agent_open(F.pool, id, &F.ag[slot]));
    return F.ag[slot];
}

/* ctx, pool with a store, agent "a" (20 tokens: 2 sealed blocks, a tail of
 * 4) and "b" (12 tokens). */
static void base(void) {
    make_ctx();
    make_pool();
    assert_ok(append(open_ag(0, "a"), 0, 20, 1, 0));
    assert_ok(append(open_ag(1, "b"), 0, 12, 2, 0));
}

static void make_dev(void) {
    assert_ok(kvm_cpu_backend_create(F.ctx, F.ctx->tp, &F.dev));
    F.ctx->backend = F.dev;
}

static void rm_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[600];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' && (e->d_name[1] == '\0' || (e->d_name[1] == '.' && e->d_name[2] == '\0'))) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
}

/* Setups that save through kvmem (two fsyncs a file) do so in the first run
 * of a call only; later runs write the same bytes back, which keeps the
 * sweep fast on a busy disk. */
typedef struct cached_file {
    char path[600];
    unsigned char *data;
    size_t n;
} cached_file;
static const void *g_cur_op, *g_cached_op;
static cached_file g_cache[32];
static int g_n_cache;

static void cache_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL && g_n_cache < 32) {
        if (e->d_name[0] == '.') continue;
        cached_file *c = &g_cache[g_n_cache++];
        snprintf(c->path, sizeof c->path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(c->path, "rb");
        assert_non_null(f);
        fseek(f, 0, SEEK_END);
        c->n = (size_t)ftell(f);
        fseek(f, 0, SEEK_SET);
        c->data = malloc(c->n + 1);
        assert_int_equal(fread(c->data, 1, c->n, f), c->n);
        fclose(f);
    }
    if (d) closedir(d);
}

/* Record the files the setup wrote so far for the call being swept. */
static void cache_files(void) {
    for (int i = 0; i < g_n_cache; i++) free(g_cache[i].data);
    g_n_cache = 0;
    cache_dir(g_store);
    cache_dir(g_files);
    g_cached_op = g_cur_op;
}

/* 1 if this call's files were recorded: they are written back now. */
static int files_cached(void) {
    if (g_cached_op != g_cur_op) return 0;
    for (int i = 0; i < g_n_cache; i++) {
        FILE *f = fopen(g_cache[i].path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(g_cache[i].data, 1, g_cache[i].n, f), g_cache[i].n);
        fclose(f);
    }
    return 1;
}

static void fx_reset(void) {
    memset(&F, 0, sizeof F);
    memset(F.out, 0xa5, sizeof F.out);
    rm_files(g_store);
    rm_files(g_files);
    if (g_redis[0]) redis_flush();
}

static void fx_free(void) {
    kvmem_segments_free(F.segs);
    for (int i = 0; i < N_AG; i++) kvmem_agent_close(F.ag[i]);
    kvmem_pool_free(F.pool);
    kvmem_retrieval_free(F.ret);
    kvmem_qmem_store_free(F.qs);
    kvmem_qmem_head_free(F.head);
    kvmem_slotmap_free(F.sm[1]);
    kvmem_slotmap_free(F.sm[0]);
    kvmem_kvstore_free(F.kvs);
    if (F.dev) F.ctx->backend = F.ctx->cpu, F.dev->iface->free(F.dev);
    kvmem_context_free(F.ctx);
    memset(&F, 0, sizeof F);
    rm_files(g_store);
    rm_files(g_files);
}

/* ---- the digest of everything observable --------------------------------- */

static void h_bytes(uint64_t *h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) *h = (*h ^ b[i]) * 0x100000001b3ull;
}
#define H(x) h_bytes(&h, &(x), sizeof(x))

static void h_agent(uint64_t *hp, kvmem_agent *a) {
    uint64_t h = *hp;
    kvmem_agent_info ai;
    kvmem_status st = kvmem_agent_get_info(a, &ai);
    H(st);
    if (st == KVMEM_OK) {
        H(ai);
        h_bytes(&h, kvmem_agent_get_id(a), strlen(kvmem_agent_get_id(a)));
        int64_t T = ai.n_tokens;
        size_t n = (size_t)NL * (size_t)T * ROW;
        float *k = calloc(n + 1, sizeof *k), *v = calloc(n + 1, sizeof *v);
        kvmem_tensor kt = t4(k, NL, T, NKVH, HD), vt = t4(v, NL, T, NKVH, HD);
        assert_ok(kvmem_agent_read(a, 0, T, &kt, &vt));
        h_bytes(&h, k, n * sizeof *k);
        h_bytes(&h, v, n * sizeof *v);
        free(k), free(v);
        int32_t *ids = calloc((size_t)T + 1, sizeof *ids);
        assert_ok(kvmem_agent_tokens(a, 0, T, ids));
        h_bytes(&h, ids, (size_t)T * sizeof *ids);
        free(ids);
        const char *text;
        size_t len;
        assert_ok(kvmem_agent_text(a, &text, &len));
        H(len);
        h_bytes(&h, text, len);
        for (int32_t b = 0; b < ai.n_blocks; b++) {
            kvmem_block_info bi;
            assert_ok(kvmem_agent_block_info(a, b, &bi));
            H(bi);
            if (bi.sealed) {
                float mn[NL * ROW], mx[NL * ROW];
                assert_ok(kvmem_agent_block_aabb(a, b, mn, mx));
                H(mn), H(mx);
            }
        }
        /* the prefix matcher reads the offsets: one probe covers them */
        kvmem_prefix_result pr;
        if (kvmem_prefix_match(a, "w0 w1 w2 w3 w4 w5 w6 w7 w8 x", 28, NULL, &pr) == KVMEM_OK) H(pr);
    }
    *hp = h;
}

static void h_dir(uint64_t *hp, const char *dir) {
    uint64_t h = *hp;
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        const char *nm = names[i]->d_name;
        if (strcmp(nm, ".") != 0 && strcmp(nm, "..") != 0) {
            h_bytes(&h, nm, strlen(nm) + 1);
            char p[600];
            snprintf(p, sizeof p, "%s/%s", dir, nm);
            FILE *f = fopen(p, "rb");
            if (f) {
                unsigned char buf[4096];
                size_t k;
                while ((k = fread(buf, 1, sizeof buf, f)) > 0) h_bytes(&h, buf, k);
                fclose(f);
            }
        }
        free(names[i]);
    }
    free(names);
    *hp = h;
}

static void h_slotmap(uint64_t *hp, kvmem_slotmap *m) {
    uint64_t h = *hp;
    kvmem_slotmap_info si;
    assert_ok(kvmem_slotmap_get_info(m, &si));
    H(si);
    const int32_t *slots;
    int64_t len;
    int32_t dead;
    assert_ok(kvmem_slotmap_slots(m, &slots, &len, &dead));
    H(len);
    if (len) h_bytes(&h, slots, (size_t)len * sizeof *slots);
    for (int64_t i = 0; i < len; i++) {
        float k[NL * ROW], v[NL * ROW];
        if (kvmem_kvstore_read_slot(F.kvs, slots[i], k, v) == KVMEM_OK) H(k), H(v);
    }
    *hp = h;
}

/* ---- the Redis store's side of the digest -------------------------------- */

#if KVMEM_OOM_REDIS_BUILT
static redisContext *g_rc; /* the test's own connection (libc allocations, never failed) */

static redisReply *rq(int argc, const char **argv) {
    redisReply *r = redisCommandArgv(g_rc, argc, argv, NULL);
    if (!r) fail_msg("redis %s: %s", argv[0], g_rc->errstr);
    if (r->type == REDIS_REPLY_ERROR) fail_msg("redis %s: %s", argv[0], r->str);
    return r;
}
static void redis_flush(void) {
    const char *av[1] = {"FLUSHDB"};
    freeReplyObject(rq(1, av));
}
static long long redis_pttl(const char *key) {
    const char *av[2] = {"PTTL", key};
    redisReply *r = rq(2, av);
    long long t = r->integer;
    freeReplyObject(r);
    return t;
}
static int cmp_cstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every key of the database as a record, sorted. Generation names are
 * random per save, so a chunk key records whether its generation is the one
 * its agent's manifest names ("cur") or not ("other"), and the manifest's
 * gen field is left out; everything else (values, chunk bytes, whether a
 * key expires) is recorded as it is. */
static void h_redis_keys(uint64_t *hp) {
    const char *pre = "kvmem:{" REDIS_POOL ":";
    const size_t pl = strlen(pre);
    const char *kav[2] = {"KEYS", "*"};
    redisReply *keys = rq(2, kav);
    size_t n = keys->elements;
    char **rec = calloc(n + 1, sizeof *rec);
    char ids[64][160], gens[64][48];
    int n_m = 0;
    for (size_t i = 0; i < n; i++) { /* the manifests first: their generations */
        const char *k = keys->element[i]->str;
        size_t len = strlen(k);
        if (strncmp(k, pre, pl) != 0 || len < pl + 3 || strcmp(k + len - 3, "}:m") != 0) continue;
        const char *av[7] = {"HMGET", k, "magic", "version", "size", "chunks", "chunk_bytes"};
        redisReply *f = rq(7, av);
        const char *gav[3] = {"HGET", k, "gen"};
        redisReply *g = rq(3, gav);
        const char *lav[2] = {"HLEN", k};
        redisReply *hl = rq(2, lav);
        rec[i] = malloc(1024);
        int o = snprintf(rec[i], 1024, "m %.*s len=%lld ttl=%d", (int)(len - pl - 3), k + pl, hl->integer,
                         redis_pttl(k) >= 0);
        for (size_t j = 0; j < f->elements; j++)
            o += snprintf(rec[i] + o, 1024 - (size_t)o, " %s", f->element[j]->str ? f->element[j]->str : "(nil)");
        assert_true(n_m < 64);
        snprintf(ids[n_m], sizeof ids[n_m], "%.*s", (int)(len - pl - 3), k + pl);
        snprintf(gens[n_m++], sizeof gens[0], "%s", g->str ? g->str : "");
        freeReplyObject(f), freeReplyObject(g), freeReplyObject(hl);
    }
    for (size_t i = 0; i < n; i++) {
        if (rec[i]) continue;
        const char *k = keys->element[i]->str;
        const char *d = strstr(k, "}:d:");
        rec[i] = malloc(1024);
        if (strncmp(k, pre, pl) == 0 && d) {
            char id[160], gen[48];
            unsigned long long idx = 0;
            snprintf(id, sizeof id, "%.*s", (int)(d - k - pl), k + pl);
            const char *colon = strchr(d + 4, ':');
            snprintf(gen, sizeof gen, "%.*s", colon ? (int)(colon - d - 4) : 0, d + 4);
            if (colon) idx = strtoull(colon + 1, NULL, 10);
            const char *cur = "other";
            for (int m = 0; m < n_m; m++)
                if (strcmp(ids[m], id) == 0 && strcmp(gens[m], gen) == 0) cur = "cur";
            const char *av[2] = {"GET", k};
            redisReply *v = rq(2, av);
            uint64_t vh = 0xcbf29ce484222325ull;
            if (v->type == REDIS_REPLY_STRING) h_bytes(&vh, v->str, v->len);
            snprintf(rec[i], 1024, "d %s %s %08llu ttl=%d type=%d bytes=%zu %016llx", id, cur, idx, redis_pttl(k) >= 0,
                     v->type, v->type == REDIS_REPLY_STRING ? v->len : 0, (unsigned long long)vh);
            freeReplyObject(v);
        } else {
            snprintf(rec[i], 1024, "x %s", k);
        }
    }
    qsort(rec, n, sizeof *rec, cmp_cstr);
    for (size_t i = 0; i < n; i++) {
        h_bytes(hp, rec[i], strlen(rec[i]) + 1);
        if (getenv("KVMEM_OOM_REDIS_KEYS")) printf("    %s\n", rec[i]);
        free(rec[i]);
    }
    free(rec);
    freeReplyObject(keys);
}

static int collect_id(const char *key, void *user) {
    char (*ids)[KVMEM_MAX_AGENT_ID + 1] = user;
    int i = 0;
    while (ids[i][0]) i++;
    if (i < 31) snprintf(ids[i], sizeof ids[i], "%s", key);
    return 0;
}

/* Every agent stored in Redis, as a second pool loads it. */
static void h_redis_loads(uint64_t *hp) {
    assert_non_null(F.ctx);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = BSZ;
    pp.store_dir = g_redis;
    kvmem_pool *p;
    assert_ok(kvmem_pool_create(F.ctx, &F.spec, &pp, &p));
    static char ids[32][KVMEM_MAX_AGENT_ID + 1];
    memset(ids, 0, sizeof ids);
    assert_ok(p->store->iface->list(p->store, collect_id, ids));
    uint64_t h = *hp;
    for (int i = 0; i < 32 && ids[i][0]; i++) {
        kvmem_agent *a = NULL;
        kvmem_status st = kvmem_agent_open(p, ids[i], &a);
        h_bytes(&h, ids[i], strlen(ids[i]) + 1);
        H(st);
        if (st == KVMEM_OK) h_agent(&h, a);
        kvmem_agent_close(a);
    }
    kvmem_pool_free(p);
    *hp = h;
}

static void h_redis(uint64_t *hp) {
    if (!g_redis[0]) return;
    h_redis_keys(hp);
    h_redis_loads(hp);
}
#else
static void redis_flush(void) {}
static void h_redis(uint64_t *hp) { (void)hp; }
#endif

static uint64_t digest(void) {
    uint64_t h = 0xcbf29ce484222325ull;
    int present[] = {F.ctx != NULL, F.pool != NULL, F.ret != NULL, F.qs != NULL, F.head != NULL,
                     F.kvs != NULL, F.sm[0] != NULL, F.sm[1] != NULL, F.segs != NULL};
    H(present);
    if (F.pool) {
        kvmem_pool_info pi;
        assert_ok(kvmem_pool_get_info(F.pool, &pi));
        H(pi);
        for (int32_t i = 0; i < pi.n_agents; i++) {
            char id[KVMEM_MAX_AGENT_ID + 1];
            assert_ok(kvmem_pool_agent_id(F.pool, i, id, sizeof id, NULL));
            h_bytes(&h, id, strlen(id) + 1);
        }
    }
    for (int i = 0; i < N_AG; i++)
        if (F.ag[i]) h_agent(&h, F.ag[i]);
    if (F.ret) {
        int32_t ns = kvmem_retrieval_n_sets(F.ret);
        H(ns);
        for (int32_t s = 0; s < ns; s++) {
            int32_t blocks[64], n;
            float sc[64];
            assert_ok(kvmem_retrieval_copy(F.ret, s, blocks, sc, 64, &n));
            H(n);
            h_bytes(&h, blocks, (size_t)n * sizeof *blocks);
            h_bytes(&h, sc, (size_t)n * sizeof *sc);
            const float *bs;
            int32_t nb;
            assert_ok(kvmem_retrieval_block_scores(F.ret, s, &bs, &nb));
            h_bytes(&h, bs, (size_t)nb * sizeof *bs);
            int64_t nt;
            assert_ok(kvmem_retrieval_n_tokens(F.ret, s, &nt));
            H(nt);
        }
    }
    if (F.qs) {
        int32_t c = kvmem_qmem_count(F.qs);
        H(c);
        float m[NL * NQH * HD];
        if (kvmem_qmem_get(F.qs, &F.key, m) == KVMEM_OK) H(m);
    }
    if (F.head) {
        float al = kvmem_qmem_head_alpha(F.head);
        H(al);
    }
    if (F.kvs) {
        kvmem_kvstore_info ki;
        assert_ok(kvmem_kvstore_get_info(F.kvs, &ki));
        H(ki);
        for (int32_t s = 0; s < ki.n_slots; s++) {
            int32_t r;
            assert_ok(kvmem_kvstore_slot_refs(F.kvs, s, &r));
            H(r);
        }
    }
    for (int i = 0; i < 2; i++)
        if (F.sm[i]) h_slotmap(&h, F.sm[i]);
    if (F.segs) {
        kvmem_segments_info si;
        assert_ok(kvmem_segments_get_info(F.segs, &si));
        H(si);
        for (int32_t i = 0; i < si.n_indices; i++) {
            kvmem_segment_info s;
            assert_ok(kvmem_segments_segment_info(F.segs, i, &s));
            H(s);
        }
        for (int32_t g = 0; g < 4; g++) {
            kvmem_group_info gi;
            kvmem_status st = kvmem_segments_group_info(F.segs, g, &gi);
            H(st);
            if (st == KVMEM_OK) H(gi);
        }
    }
    H(F.i64), H(F.i32);
    h_bytes(&h, F.out, sizeof F.out);
    h_dir(&h, g_store);
    h_dir(&h, g_files);
    h_redis(&h);
    return h;
}

/* ---- the calls ------------------------------------------------------------ */

typedef struct op {
    const char *name;
    void (*setup)(void);
    kvmem_status (*call)(void);
    /* void calls (free, close): checked after the call instead of by status */
    void (*verify)(void);
    int redis; /* through the Redis store: swept only with KVMEM_OOM_REDIS */
} op;

static char g_path[600];
static const char *fpath(const char *name) {
    snprintf(g_path, sizeof g_path, "%s/%s", g_files, name);
    return g_path;
}

/* context and pool */
static void s_none(void) {}
static kvmem_status c_context_create(void) {
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cpu";
    cp.n_threads = 1;
    kvmem_status st = kvmem_context_create(&cp, &F.ctx);
    if (st != KVMEM_OK) assert_null(F.ctx);
    return st;
}
static kvmem_status c_context_threads(void) {
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cpu";
    cp.n_threads = 2;
    kvmem_status st = kvmem_context_create(&cp, &F.ctx);
    if (st != KVMEM_OK) assert_null(F.ctx);
    return st;
}
static void s_ctx(void) { make_ctx(); }
static kvmem_status c_pool_create(void) {
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = BSZ;
    pp.store_dir = g_store;
    kvmem_status st = kvmem_pool_create(F.ctx, &F.spec, &pp, &F.pool);
    if (st != KVMEM_OK) assert_null(F.pool);
    return st;
}

/* agents */
static kvmem_status c_open_new(void) { return kvmem_agent_open(F.pool, "c", &F.ag[2]); }
static void s_in_store(void) {
    make_ctx();
    if (!files_cached()) {
        make_pool();
        assert_ok(append(open_ag(0, "s"), 0, 13, 3, 0));
        assert_ok(kvmem_agent_save(F.ag[0], NULL));
        kvmem_agent_close(F.ag[0]);
        F.ag[0] = NULL;
        kvmem_pool_free(F.pool);
        cache_files();
    }
    make_pool();
}
static kvmem_status c_open_s(void) { return kvmem_agent_open(F.pool, "s", &F.ag[0]); }
static void s_spilled(void) {
    make_ctx();
    make_pool_p(0, 1, 1); /* host budget 1 byte: every close spills */
    assert_ok(append(open_ag(0, "s"), 0, 13, 3, 0));
    kvmem_agent_close(F.ag[0]);
    F.ag[0] = NULL;
}
static kvmem_status c_append(void) { return append(F.ag[0], 20, 10, 7, 0); }
static kvmem_status c_append_rot(void) { return append(F.ag[0], 20, 10, 7, 1); }
static kvmem_status c_append_big(void) { return append(F.ag[0], 20, 300, 8, 0); }
static void s_empty_c(void) {
    base();
    open_ag(2, "c");
}
static kvmem_status c_append_c(void) { return append(F.ag[2], 0, 11, 9, 0); }
static kvmem_status c_flush(void) { return kvmem_agent_flush(F.ag[0]); }
static kvmem_status c_read(void) {
    float *k = (float *)(void *)F.out, *v = k + NL * 20 * ROW;
    kvmem_tensor kt = t4(k, NL, 20, NKVH, HD), vt = t4(v, NL, 20, NKVH, HD);
    return kvmem_agent_read(F.ag[0], 0, 20, &kt, &vt);
}
static void s_no_tail(void) {
    /* an agent whose memory came from a file without a tail has no tail
     * buffer: truncating into a sealed block must allocate one */
    make_ctx();
    make_pool();
    if (!files_cached()) {
        assert_ok(append(open_ag(0, "t"), 0, 16, 4, 0));
        assert_ok(kvmem_agent_save(F.ag[0], fpath("t.safetensors")));
        kvmem_agent_close(F.ag[0]);
        assert_ok(kvmem_pool_remove_agent(F.pool, "t"));
        cache_files();
    }
    open_ag(0, "t");
    assert_ok(kvmem_agent_load(F.ag[0], fpath("t.safetensors")));
}
static kvmem_status c_truncate(void) { return kvmem_agent_truncate(F.ag[0], 5); }
static void s_closed_b(void) {
    base();
    kvmem_agent_close(F.ag[1]);
    F.ag[1] = NULL;
}
static void s_stored_b(void) {
    base();
    if (!files_cached()) {
        assert_ok(kvmem_agent_save(F.ag[1], NULL));
        cache_files();
    }
    kvmem_agent_close(F.ag[1]);
    F.ag[1] = NULL;
}
static kvmem_status c_remove_b(void) { return kvmem_pool_remove_agent(F.pool, "b"); }
static void s_budget(void) {
    make_ctx();
    make_pool_p(0, 1, 1);
    assert_ok(append(open_ag(0, "a"), 0, 20, 1, 0));
    assert_ok(append(open_ag(1, "b"), 0, 12, 2, 0));
}
static kvmem_status c_close_b(void) {
    kvmem_agent_close(F.ag[1]);
    F.ag[1] = NULL;
    return KVMEM_OK;
}
static void v_close_b(void) {
    /* spilled or not, "b" must come back whole */
    kvmem_agent *b;
    assert_ok(kvmem_agent_open(F.pool, "b", &b));
    kvmem_agent_info ai;
    assert_ok(kvmem_agent_get_info(b, &ai));
    assert_int_equal(ai.n_tokens, 12);
    kvmem_agent_close(b);
}
static void s_capacity(void) {
    /* capacity for about two agents: appending to "a" must spill "b" */
    make_ctx();
    make_pool_p(0, 0, 1);
    kvmem_pool_info pi;
    assert_ok(append(open_ag(1, "b"), 0, 16, 2, 0));
    kvmem_agent_close(F.ag[1]);
    F.ag[1] = NULL;
    assert_ok(kvmem_pool_get_info(F.pool, &pi));
    uint64_t cap = pi.used_bytes * 2;
    kvmem_pool_free(F.pool);
    make_pool_p(cap, 0, 1);
    assert_ok(append(open_ag(1, "b"), 0, 16, 2, 0));
    kvmem_agent_close(F.ag[1]);
    F.ag[1] = NULL;
    assert_ok(append(open_ag(0, "a"), 0, 8, 1, 0));
}
static kvmem_status c_append_spill(void) { return append(F.ag[0], 8, 16, 5, 0); }

/* retrieval and gather */
static float *query(int n_q, uint64_t seed) {
    static float q[4 * NL * NQH * HD];
    uint64_t r = seed;
    for (int i = 0; i < n_q * NL * NQH * HD; i++) q[i] = tu_normal(&r);
    return q;
}
static kvmem_status retrieve(kvmem_retrieve_params *rp) {
    kvmem_tensor qt = t4(query(2, 11), 2, NL, NQH, HD);
    return kvmem_retrieve(F.ag[0], &qt, rp, F.ret);
}
static void s_ret(void) {
    base();
    assert_ok(kvmem_agent_flush(F.ag[0])); /* 3 sealed blocks */
    assert_ok(kvmem_retrieval_create(&F.ret));
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    rp.top_k = 1;
    assert_ok(retrieve(&rp)); /* a previous result the failed calls must keep */
}
static void s_ret_dev(void) {
    s_ret();
    make_dev();
}
static kvmem_status c_retrieval_create(void) {
    kvmem_status st = kvmem_retrieval_create(&F.ret);
    if (st != KVMEM_OK) assert_null(F.ret);
    return st;
}
static kvmem_status c_retrieve(void) {
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    rp.top_k = 2;
    return retrieve(&rp);
}
static kvmem_status c_retrieve_layer(void) {
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    int32_t inc[1] = {0};
    rp.top_k = 2;
    rp.scope = KVMEM_SCOPE_PER_LAYER;
    rp.norm = KVMEM_NORM_RR;
    rp.agg = KVMEM_AGG_SUM;
    rp.always_include = inc;
    rp.n_always_include = 1;
    return retrieve(&rp);
}
static kvmem_status c_retrieve_exact(void) {
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    int32_t exc[1] = {1};
    rp.top_k = 2;
    rp.mode = KVMEM_RETRIEVE_EXACT;
    rp.exclude = exc;
    rp.n_exclude = 1;
    return retrieve(&rp);
}
static kvmem_status c_retrieve_excl(void) {
    /* candidates {0, 2}: not one run of blocks, so a device packs their AABBs */
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    int32_t exc[1] = {1};
    rp.top_k = 1;
    rp.exclude = exc;
    rp.n_exclude = 1;
    return retrieve(&rp);
}
static kvmem_status c_gather(void) {
    int32_t blocks[3] = {2, 0, 2};
    float *k = (float *)(void *)F.out, *v = k + NL * 16 * ROW; /* 4 + 8 + 4 tokens */
    kvmem_tensor kt = t4(k, NL, 16, NKVH, HD), vt = t4(v, NL, 16, NKVH, HD);
    return kvmem_gather(F.ag[0], blocks, 3, 5, &kt, &vt);
}

/* attention */
static kvmem_status attend(const kvmem_attend_source *src, kvmem_attend_params *ap, int rows) {
    kvmem_tensor qt = t3(query(1, 12), rows, NQH, HD);
    float *o = (float *)(void *)F.out;
    kvmem_tensor ot = t3(o, rows, NQH, HD);
    kvmem_attend_stats *stats = (kvmem_attend_stats *)(void *)(F.out + 4096);
    /* the device kernel takes one tile order for every KV head, so SCORED
     * (the default, an order per head) runs on the CPU: the device ops ask
     * for RECENT to reach the device path's allocations */
    if (F.dev && F.ctx->backend == F.dev && ap->order == KVMEM_ATTEND_SCORED) ap->order = KVMEM_ATTEND_RECENT;
    return kvmem_attend(F.ctx, &qt, src, ap, &ot, stats);
}
static float g_kt[40 * ROW], g_vt[40 * ROW];
static kvmem_status attend_tensors(int rows, int variant) {
    uint64_t r = 13;
    for (int i = 0; i < 40 * ROW; i++) g_kt[i] = tu_normal(&r), g_vt[i] = tu_normal(&r);
    kvmem_tensor kt = t3(g_kt, 40, NKVH, HD), vt = t3(g_vt, 40, NKVH, HD);
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &kt;
    src.v = &vt;
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.tile_size = 8;
    static uint8_t mask[40];
    int32_t order[2] = {3, 1};
    if (variant == 1) {
        ap.compare = 1;
        ap.probe = KVMEM_ATTEND_PROBE_ORACLE;
    } else if (variant == 2) {
        for (int i = 0; i < 40; i++) mask[i] = (uint8_t)(i % 3 != 0);
        src.mask = mask;
        ap.order = KVMEM_ATTEND_IMPORTANCE;
        ap.tile_order = order;
        ap.n_tile_order = 2;
    }
    return attend(&src, &ap, rows);
}
static kvmem_status c_attend_strided(void) {
    /* K with a row stride twice its width: the device path packs it */
    static float ks[40 * 2 * ROW];
    uint64_t r = 14;
    for (int i = 0; i < 40 * 2 * ROW; i++) ks[i] = tu_normal(&r);
    for (int i = 0; i < 40 * ROW; i++) g_vt[i] = tu_normal(&r);
    kvmem_tensor kt = t3(ks, 40, NKVH, HD), vt = t3(g_vt, 40, NKVH, HD);
    kt.strides[0] = 2 * ROW;
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &kt;
    src.v = &vt;
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.tile_size = 8;
    return attend(&src, &ap, 1);
}
static kvmem_status c_attend_t(void) { return attend_tensors(2, 0); }
static kvmem_status c_attend_t1(void) { return attend_tensors(1, 0); }
static kvmem_status c_attend_cmp(void) { return attend_tensors(2, 1); }
static kvmem_status c_attend_mask(void) { return attend_tensors(2, 2); }
static kvmem_status c_attend_agent(void) {
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_AGENT;
    src.agent = F.ag[0];
    src.layer = 1;
    kvmem_attend_params ap = kvmem_attend_default_params();
    return attend(&src, &ap, 2);
}

/* agent "a" on the device: 2 full sealed blocks and a 4-token tail, layer 0
 * (full attention), one row, the stop rule on in RECENT order: the mirror,
 * its rotated keys, the tail and the resident RECENT tile list */
static void s_agent_dev(void) {
    base();
    make_dev();
}
static kvmem_status c_attend_agent_recent(void) {
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_AGENT;
    src.agent = F.ag[0];
    src.layer = 0;
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.order = KVMEM_ATTEND_RECENT;
    ap.tau_s = 0.05f;
    ap.tau_d = 0.01f;
    return attend(&src, &ap, 1);
}

/* QueryMemory, the residual head, selection and SnapKV */
static kvmem_status qmem_update(const char *session, uint64_t seed) {
    kvmem_session_source ss;
    memset(&ss, 0, sizeof ss);
    ss.session_id = session;
    kvmem_session_key key;
    assert_ok(kvmem_session_key_derive(F.qs, &ss, &key));
    kvmem_tensor qt = t4(query(3, seed), 3, NL, NQH, HD);
    kvmem_status st = kvmem_qmem_update(F.qs, &key, &qt, 0, 3, (float *)(void *)F.out);
    if (st == KVMEM_OK) F.key = key;
    return st;
}
static kvmem_status qmem_create(int32_t cap) {
    kvmem_qmem_params qp = kvmem_qmem_default_params();
    qp.capacity = cap;
    kvmem_status st = kvmem_qmem_store_create(&F.spec, &qp, &F.qs);
    if (st != KVMEM_OK) assert_null(F.qs);
    return st;
}
static kvmem_status c_qmem_create(void) { return qmem_create(4); }
static void s_qs(void) {
    make_ctx();
    assert_ok(qmem_create(2));
    assert_ok(qmem_update("s1", 21));
}
static void s_qs_full(void) {
    s_qs();
    assert_ok(qmem_update("s2", 22));
}
static kvmem_status c_qmem_new(void) { return qmem_update("s3", 23); }
static kvmem_status c_qmem_again(void) { return qmem_update("s1", 24); }
static kvmem_status c_qmem_get(void) { return kvmem_qmem_get(F.qs, &F.key, (float *)(void *)F.out); }
static float g_mem[NL * NQH * HD];
static kvmem_status qmem_score(void) {
    uint64_t r = 31;
    float *k = calloc((size_t)NL * 24 * ROW, sizeof *k);
    for (int i = 0; i < NL * 24 * ROW; i++) k[i] = tu_normal(&r);
    for (int i = 0; i < NL * NQH * HD; i++) g_mem[i] = tu_normal(&r) * 0.3f;
    kvmem_tensor kt = t4(k, NL, 24, NKVH, HD);
    kvmem_status st = kvmem_qmem_score(F.ctx, &F.spec, g_mem, &kt, (float *)(void *)F.out);
    free(k);
    return st;
}
static void s_dev(void) {
    make_ctx();
    make_dev();
}

/* a residual head image: every tensor F32, little-endian host */
static unsigned char *head_image(size_t *size) {
    static const char *names[8] = {"alpha", "w_q", "w_k", "w_v", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"};
    const int64_t Fd = 3 * HD + 1;
    int64_t sh[8][2] = {{1, 0}, {128, Fd}, {128, HD}, {128, HD}, {256, Fd + 128}, {256, 0}, {1, 256}, {1, 0}};
    char hdr[2048];
    size_t at = 0, off = 0, n[8];
    at += (size_t)snprintf(hdr, sizeof hdr, "{");
    for (int i = 0; i < 8; i++) {
        n[i] = (size_t)sh[i][0] * (size_t)(sh[i][1] ? sh[i][1] : 1);
        if (sh[i][1])
            at += (size_t)snprintf(hdr + at, sizeof hdr - at, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                                   i ? "," : "", names[i], (long long)sh[i][0], (long long)sh[i][1], off, off + n[i] * 4);
        else
            at += (size_t)snprintf(hdr + at, sizeof hdr - at, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                                   i ? "," : "", names[i], (long long)sh[i][0], off, off + n[i] * 4);
        off += n[i] * 4;
    }
    at += (size_t)snprintf(hdr + at, sizeof hdr - at, "}");
    while (at % 8) hdr[at++] = ' ';
    *size = 8 + at + off;
    unsigned char *buf = malloc(*size);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)at >> (8 * i));
    memcpy(buf + 8, hdr, at);
    uint64_t r = 41;
    float *w = (float *)(void *)(buf + 8 + at);
    for (size_t i = 0; i < off / 4; i++) w[i] = tu_normal(&r) * 0.1f;
    w[0] = 0.5f; /* alpha */
    return buf;
}
static kvmem_status c_head_buffer(void) {
    size_t n;
    unsigned char *img = head_image(&n);
    kvmem_status st = kvmem_qmem_head_load_buffer(img, n, &F.head);
    free(img);
    if (st != KVMEM_OK) assert_null(F.head);
    return st;
}
static void s_head_file(void) {
    size_t n;
    unsigned char *img = head_image(&n);
    FILE *f = fopen(fpath("head.safetensors"), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(img, 1, n, f), n);
    fclose(f);
    free(img);
}
static kvmem_status c_head_file(void) {
    kvmem_status st = kvmem_qmem_head_load(fpath("head.safetensors"), &F.head);
    if (st != KVMEM_OK) assert_null(F.head);
    return st;
}
static void s_head(void) {
    make_ctx();
    assert_ok(c_head_buffer());
}
static kvmem_status c_head_apply(void) {
    uint64_t r = 51;
    float *k = calloc((size_t)NL * 24 * ROW, sizeof *k), rule[24];
    for (int i = 0; i < NL * 24 * ROW; i++) k[i] = tu_normal(&r);
    for (int i = 0; i < NL * NQH * HD; i++) g_mem[i] = tu_normal(&r) * 0.3f;
    for (int i = 0; i < 24; i++) rule[i] = (float)i / 24.0f;
    kvmem_tensor kt = t4(k, NL, 24, NKVH, HD);
    kvmem_status st = kvmem_qmem_head_apply(F.head, &F.spec, g_mem, &kt, rule, 20, 24, (float *)(void *)F.out);
    free(k);
    return st;
}
static float g_sc[64];
static void sc_fill(void) {
    for (int i = 0; i < 64; i++) g_sc[i] = (float)((i * 37) % 64) / 64.0f;
}
static kvmem_status c_select_keep(void) {
    sc_fill();
    return kvmem_select_keep(g_sc, 64, 20, 4, 50, 56, (int32_t *)(void *)F.out, &F.i64[0]);
}
static kvmem_status c_streaming(void) { return kvmem_streaming_keep(64, 4, 10, (int32_t *)(void *)F.out, &F.i64[0]); }
static kvmem_status c_h2o_acc(void) {
    float probs[3 * 64];
    for (int i = 0; i < 3 * 64; i++) probs[i] = 1.0f / 64.0f;
    float *acc = (float *)(void *)F.out;
    memset(acc, 0, 64 * sizeof *acc);
    return kvmem_h2o_accumulate(probs, 3, 64, acc);
}
static kvmem_status c_h2o_keep(void) {
    sc_fill();
    return kvmem_h2o_keep(g_sc, 64, 20, 5, (int32_t *)(void *)F.out, &F.i64[0]);
}
static kvmem_status c_snapkv(void) {
    uint64_t r = 61;
    float *k = calloc((size_t)NL * 24 * ROW, sizeof *k);
    for (int i = 0; i < NL * 24 * ROW; i++) k[i] = tu_normal(&r);
    kvmem_tensor kt = t4(k, NL, 24, NKVH, HD), qt = t4(query(4, 62), 4, NL, NQH, HD);
    kvmem_status st = kvmem_snapkv_score(F.ctx, &F.spec, &qt, &kt, 3, (float *)(void *)F.out);
    free(k);
    return st;
}

/* the paged KV store and slot maps */
static kvmem_status kvstore_create(void) {
    kvmem_kvstore_params kp = kvmem_kvstore_default_params();
    kp.page_slots = 4;
    kvmem_status st = kvmem_kvstore_create(&F.spec, &kp, &F.kvs);
    if (st != KVMEM_OK) assert_null(F.kvs);
    return st;
}
static kvmem_status sm_append(kvmem_slotmap *m, int64_t T, uint64_t seed) {
    float *v, *k = kv_new(T, seed, &v);
    kvmem_tensor kt = t4(k, NL, T, NKVH, HD), vt = t4(v, NL, T, NKVH, HD);
    kvmem_status st = kvmem_slotmap_append(m, &kt, &vt);
    free(k), free(v);
    return st;
}
static void s_kvs(void) {
    make_ctx();
    assert_ok(kvstore_create());
}
static void s_sm(void) {
    s_kvs();
    assert_ok(kvmem_slotmap_create(F.kvs, &F.sm[0]));
    assert_ok(sm_append(F.sm[0], 10, 71));
    assert_ok(kvmem_slotmap_set_protected(F.sm[0], 2));
}
static void s_sm_fork(void) {
    s_sm();
    assert_ok(kvmem_slotmap_fork(F.sm[0], 6, &F.sm[1]));
}
static kvmem_status c_sm_create(void) {
    kvmem_status st = kvmem_slotmap_create(F.kvs, &F.sm[0]);
    if (st != KVMEM_OK) assert_null(F.sm[0]);
    return st;
}
static kvmem_status c_sm_append(void) { return sm_append(F.sm[0], 9, 72); }
static kvmem_status c_sm_fork(void) {
    kvmem_status st = kvmem_slotmap_fork(F.sm[0], 6, &F.sm[1]);
    if (st != KVMEM_OK) assert_null(F.sm[1]);
    return st;
}
static const int32_t g_kept[5] = {0, 3, 4, 7, 9};
static kvmem_status c_sm_evict(void) { return kvmem_slotmap_evict(F.sm[0], g_kept, 5, &F.i64[0]); }
static kvmem_status c_sm_compact(void) { return kvmem_slotmap_compact(F.sm[0], g_kept, 5, &F.i64[0]); }
static kvmem_status c_sm_compact_fork(void) { return kvmem_slotmap_compact(F.sm[1], g_kept, 3, &F.i64[0]); }
static kvmem_status c_sm_gather(void) {
    float *k = (float *)(void *)F.out, *v = k + NL * 10 * ROW;
    kvmem_tensor kt = t4(k, NL, 10, NKVH, HD), vt = t4(v, NL, 10, NKVH, HD);
    return kvmem_slotmap_gather(F.sm[0], &kt, &vt, (int32_t *)(void *)(F.out + 8192));
}
static kvmem_status c_attend_slots(void) {
    static float pk[64 * ROW], pv[64 * ROW];
    uint64_t r = 81;
    for (int i = 0; i < 64 * ROW; i++) pk[i] = tu_normal(&r), pv[i] = tu_normal(&r);
    kvmem_tensor kt = t3(pk, 64, NKVH, HD), vt = t3(pv, 64, NKVH, HD);
    int32_t slots[30];
    for (int i = 0; i < 30; i++) slots[i] = i % 5 == 4 ? 0 : 1 + (i * 7) % 63;
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_SLOTMAP;
    src.k = &kt;
    src.v = &vt;
    src.slots = slots;
    src.n_positions = 30;
    src.dead_slot = 0;
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.tile_size = 8;
    return attend(&src, &ap, 1);
}

/* persistence, prefix matching, batches */
static void s_saved(void) {
    /* "a" saved with 20 tokens, then 5 more appended: a failed save or load
     * must leave both the file and the agent as they were */
    base();
    if (!files_cached()) {
        assert_ok(kvmem_agent_save(F.ag[0], fpath("a.safetensors")));
        assert_ok(kvmem_agent_save(F.ag[0], NULL));
        cache_files();
    }
    assert_ok(append(F.ag[0], 20, 5, 6, 0));
}
static kvmem_status c_save_path(void) { return kvmem_agent_save(F.ag[0], fpath("a.safetensors")); }
static kvmem_status c_save_new(void) { return kvmem_agent_save(F.ag[0], fpath("new.safetensors")); }
static kvmem_status c_save_store(void) { return kvmem_agent_save(F.ag[0], NULL); }
static kvmem_status c_load_path(void) { return kvmem_agent_load(F.ag[0], fpath("a.safetensors")); }
static kvmem_status c_load_store(void) { return kvmem_agent_load(F.ag[0], NULL); }
static kvmem_status c_sync(void) { return kvmem_pool_sync(F.pool); }
static void s_mapped_file(void) {
    /* agent "m" of 24 tokens in m.safetensors, not in the pool */
    make_ctx();
    make_pool_p(0, 0, 0);
    if (!files_cached()) {
        assert_ok(append(open_ag(0, "m"), 0, 24, 5, 0));
        assert_ok(kvmem_agent_save(F.ag[0], fpath("m.safetensors")));
        kvmem_agent_close(F.ag[0]);
        F.ag[0] = NULL;
        assert_ok(kvmem_pool_remove_agent(F.pool, "m"));
        cache_files();
    }
}
static kvmem_status c_open_file(void) { return kvmem_agent_open_file(F.pool, fpath("m.safetensors"), 0, &F.ag[0]); }
static void s_mapped(void) {
    s_mapped_file();
    assert_ok(kvmem_agent_open_file(F.pool, fpath("m.safetensors"), 0, &F.ag[0]));
}
static kvmem_status c_prefix(void) {
    kvmem_prefix_result *r = (kvmem_prefix_result *)(void *)F.out;
    return kvmem_prefix_match(F.ag[0], "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 wx", 44, NULL, r);
}
static kvmem_status c_merge(void) {
    float *k = (float *)(void *)F.out, *v = k + 2 * NKVH * 24 * HD;
    kvmem_tensor kt = t4(k, 2, NKVH, 24, HD), vt = t4(v, 2, NKVH, 24, HD);
    kvmem_agent *ags[2] = {F.ag[0], F.ag[1]};
    return kvmem_batch_merge(ags, 2, 1, &kt, &vt, &F.i64[0]);
}
static kvmem_status c_extract(void) {
    static float batch[2 * NKVH * 24 * HD];
    for (int i = 0; i < 2 * NKVH * 24 * HD; i++) batch[i] = (float)i;
    kvmem_tensor bt = t4(batch, 2, NKVH, 24, HD);
    kvmem_tensor ot = t3((float *)(void *)F.out, 10, NKVH, HD);
    return kvmem_batch_extract(&bt, 1, 20, 3, 10, &ot);
}

/* segments */
static kvmem_status seg_store(int32_t idx, int64_t T, uint64_t seed) {
    float *v, *k = kv_new(T, seed, &v);
    kvmem_tensor kt = t4(k, NL, T, NKVH, HD), vt = t4(v, NL, T, NKVH, HD);
    kvmem_status st = kvmem_segments_store_segment(F.segs, idx, &kt, &vt, NULL);
    free(k), free(v);
    return st;
}
static kvmem_status c_segs_create(void) {
    kvmem_segments_params sp = kvmem_segments_default_params();
    sp.static_after_steps = 2;
    kvmem_status st = kvmem_segments_create(F.pool, "own", &sp, &F.segs);
    if (st != KVMEM_OK) assert_null(F.segs);
    return st;
}
static void s_pool(void) {
    make_ctx();
    make_pool();
}
static void s_segs(void) {
    /* segments 0, 1 in group 0 (static, with a joint KV), 2 in group 1 */
    s_pool();
    assert_ok(c_segs_create());
    assert_ok(kvmem_segments_add(F.segs, "s0", 0, NULL));
    assert_ok(kvmem_segments_add(F.segs, "s1", 0, NULL));
    assert_ok(kvmem_segments_add(F.segs, "s2", 1, NULL));
    assert_ok(seg_store(0, 5, 91));
    assert_ok(seg_store(2, 6, 92));
    assert_ok(kvmem_segments_step(F.segs));
    assert_ok(kvmem_segments_step(F.segs));
    float *v, *k = kv_new(9, 93, &v);
    kvmem_tensor kt = t4(k, NL, 9, NKVH, HD), vt = t4(v, NL, 9, NKVH, HD);
    assert_ok(kvmem_segments_store_group(F.segs, 0, &kt, &vt, NULL));
    free(k), free(v);
}
static void s_segs_dyn(void) {
    s_segs();
    assert_ok(kvmem_segments_update(F.segs, 1)); /* group 0 dynamic again */
}
static void s_segs_full(void) {
    /* 32 segments (the first table size) and 63 queued events (the queue
     * holds 64): the next add grows both tables */
    s_pool();
    assert_ok(c_segs_create());
    char name[16];
    for (int i = 0; i < 32; i++) {
        snprintf(name, sizeof name, "n%d", i);
        assert_ok(kvmem_segments_add(F.segs, name, 0, NULL));
    }
    for (int i = 0; i < 31; i++) assert_ok(kvmem_segments_update(F.segs, i));
}
static kvmem_status c_segs_add(void) { return kvmem_segments_add(F.segs, "s3", 3, NULL); }
static kvmem_status c_segs_add_far(void) { return kvmem_segments_add(F.segs, "s3", 40, NULL); }
static kvmem_status c_segs_update(void) { return kvmem_segments_update(F.segs, 0); }
static kvmem_status c_segs_remove(void) { return kvmem_segments_remove(F.segs, 2); }
static kvmem_status c_segs_assign(void) { return kvmem_segments_assign(F.segs, 2, 3); }
static kvmem_status c_segs_step(void) { return kvmem_segments_step(F.segs); }
static kvmem_status c_segs_store(void) { return seg_store(1, 7, 94); }
static kvmem_status c_segs_store_again(void) { return seg_store(0, 4, 95); }
static kvmem_status c_segs_group(void) {
    float *v, *k = kv_new(9, 96, &v);
    kvmem_tensor kt = t4(k, NL, 9, NKVH, HD), vt = t4(v, NL, 9, NKVH, HD);
    kvmem_status st = kvmem_segments_store_group(F.segs, 0, &kt, &vt, NULL);
    free(k), free(v);
    return st;
}
static kvmem_status c_segs_plan(void) {
    float sc[3] = {0.2f, 0.9f, 0.5f};
    return kvmem_segments_plan(F.segs, sc, 3, 0, (kvmem_segment_unit *)(void *)F.out, 8, (size_t *)(void *)&F.i64[0]);
}
static kvmem_status c_segs_drain(void) {
    return kvmem_segments_drain_events(F.segs, (kvmem_segment_event *)(void *)F.out, 64, (size_t *)(void *)&F.i64[0], NULL);
}
static kvmem_status c_segs_free(void) {
    kvmem_segments_free(F.segs);
    F.segs = NULL;
    return KVMEM_OK;
}
static void v_segs_free(void) {
    /* every unit agent is gone, from the pool and from its store */
    kvmem_pool_info pi;
    assert_ok(kvmem_pool_get_info(F.pool, &pi));
    for (int32_t i = 0; i < pi.n_agents; i++) {
        char id[KVMEM_MAX_AGENT_ID + 1];
        assert_ok(kvmem_pool_agent_id(F.pool, i, id, sizeof id, NULL));
        if (strncmp(id, "own.kvseg-", 10) == 0) fail_msg("unit agent '%s' is still in the pool", id);
    }
    DIR *d = opendir(g_store);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, "own.kvseg-", 10) == 0) fail_msg("unit file '%s' is still in the store", e->d_name);
    closedir(d);
}

/* the directory store's listing (internal: no public call lists a store) */
static int count_key(const char *key, void *user) {
    (void)key;
    ++*(int64_t *)user;
    return 0;
}
static void s_many_stored(void) {
    base();
    char id[16];
    int cached = files_cached();
    for (int i = 0; i < 17; i++) { /* more than the first table of 16 names */
        kvmem_agent *a;
        snprintf(id, sizeof id, "x%02d", i);
        assert_ok(kvmem_agent_open(F.pool, id, &a));
        if (!cached) assert_ok(kvmem_agent_save(a, NULL));
        kvmem_agent_close(a);
    }
    if (!cached) cache_files();
}
static kvmem_status c_store_list(void) { return F.pool->store->iface->list(F.pool->store, count_key, &F.i64[0]); }

/* helpers without an object */
static kvmem_status c_kmeans(void) {
    float emb[12 * 4];
    uint64_t r = 101;
    for (int i = 0; i < 12 * 4; i++) emb[i] = tu_normal(&r);
    kvmem_kmeans_params kp = kvmem_kmeans_default_params();
    kp.k = 3;
    return kvmem_cluster_kmeans(emb, 12, 4, &kp, (int32_t *)(void *)F.out, (float *)(void *)(F.out + 1024), &F.i32[0]);
}
static kvmem_status c_multihop(void) {
    float q2s[3 * 6], s2s[6 * 6];
    for (int i = 0; i < 18; i++) q2s[i] = (float)((i * 5) % 7) / 7.0f;
    for (int i = 0; i < 36; i++) s2s[i] = (float)((i * 11) % 13) / 13.0f;
    kvmem_multihop_params mp = kvmem_multihop_default_params();
    mp.ratio = 0.5f;
    return kvmem_multihop_select(&mp, q2s, 3, s2s, 6, NULL, F.out, (float *)(void *)(F.out + 64),
                                 (kvmem_multihop_result *)(void *)(F.out + 256));
}
static kvmem_status c_schedule(void) { return kvmem_multihop_schedule(6, 0.5f, (float *)(void *)F.out); }
static kvmem_status c_load_plan(void) {
    double cms[4] = {1.0, 2.0, 1.5, 1.0};
    uint64_t lb[5] = {1000000, 2000000, 500000, 3000000, 100000};
    uint8_t rc[4 * 5] = {1, 1, 1, 1, 1, 1, 0, 1, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1};
    kvmem_load_plan_params lp = kvmem_load_plan_default_params();
    return kvmem_load_plan(&lp, cms, 4, lb, 5, rc, (kvmem_load_item *)(void *)F.out, 64, (size_t *)(void *)&F.i64[0],
                           (double *)(void *)(F.out + 8192), (kvmem_load_plan_stats *)(void *)(F.out + 9000));
}
static void s_rope(void) {
    float *x = (float *)(void *)F.out;
    for (int i = 0; i < 6 * HD; i++) x[i] = (float)i / 10.0f;
}
static kvmem_status c_rope(void) {
    float *x = (float *)(void *)F.out;
    int32_t pos[6] = {0, 1, 5, 100, 7, 3};
    kvmem_model_spec sp = spec();
    sp.rope_scaling = KVMEM_ROPE_SCALING_YARN;
    sp.rope_factor = 4.0;
    return kvmem_rope_apply(&sp, x, 6, HD, pos, 0);
}

/* through the Redis store (KVMEM_OOM_REDIS) */
static kvmem_status pool_create_url(const char *url) {
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = BSZ;
    pp.store_dir = url;
    kvmem_status st = kvmem_pool_create(F.ctx, &F.spec, &pp, &F.pool);
    if (st != KVMEM_OK) assert_null(F.pool);
    return st;
}
static kvmem_status c_pool_create_redis(void) { return pool_create_url(g_redis); }
static kvmem_status c_pool_create_unix(void) { return pool_create_url(g_redis_unix); }
static kvmem_status c_pool_create_auth(void) { return pool_create_url(g_redis_auth); }
static void s_redis_base(void) {
    make_ctx();
    make_pool_redis();
    assert_ok(append(open_ag(0, "a"), 0, 20, 1, 0));
    assert_ok(append(open_ag(1, "b"), 0, 12, 2, 0));
}
static void s_redis_in_store(void) {
    make_ctx();
    make_pool_redis();
    assert_ok(append(open_ag(0, "s"), 0, 13, 3, 0));
    assert_ok(kvmem_agent_save(F.ag[0], NULL));
    kvmem_agent_close(F.ag[0]);
    F.ag[0] = NULL;
    kvmem_pool_free(F.pool);
    make_pool_redis();
}
static void s_redis_saved(void) {
    /* "a" saved with 20 tokens (version 1), then 5 more appended */
    s_redis_base();
    assert_ok(kvmem_agent_save(F.ag[0], NULL));
    assert_ok(append(F.ag[0], 20, 5, 6, 0));
}
static void s_redis_stored_b(void) {
    s_redis_base();
    assert_ok(kvmem_agent_save(F.ag[1], NULL));
    kvmem_agent_close(F.ag[1]);
    F.ag[1] = NULL;
}
static void s_redis_closed_b(void) {
    s_redis_base();
    kvmem_agent_close(F.ag[1]);
    F.ag[1] = NULL;
}
static void s_redis_budget(void) {
    make_ctx();
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = BSZ;
    pp.host_budget_bytes = 1; /* every close spills */
    pp.store_dir = g_redis;
    assert_ok(kvmem_pool_create(F.ctx, &F.spec, &pp, &F.pool));
    assert_ok(append(open_ag(0, "a"), 0, 20, 1, 0));
    assert_ok(append(open_ag(1, "b"), 0, 12, 2, 0));
}
static void s_redis_many(void) {
    s_redis_base();
    char id[16];
    for (int i = 0; i < 17; i++) {
        kvmem_agent *a;
        snprintf(id, sizeof id, "x%02d", i);
        assert_ok(kvmem_agent_open(F.pool, id, &a));
        assert_ok(append(a, 0, 3, 40 + (uint64_t)i, 0));
        assert_ok(kvmem_agent_save(a, NULL));
        kvmem_agent_close(a);
    }
}

/* the objects' destructors */
static kvmem_status c_pool_free(void) {
    for (int i = 0; i < N_AG; i++) F.ag[i] = NULL; /* handles go with the pool */
    kvmem_pool_free(F.pool);
    F.pool = NULL;
    return KVMEM_OK;
}
static void v_nothing(void) {}

#define OP(n, s, c) {n, s, c, NULL, 0}
#define OPV(n, s, c, v) {n, s, c, v, 0}
#define ROP(n, s, c) {n, s, c, NULL, 1}
#define ROPV(n, s, c, v) {n, s, c, v, 1}
static const op k_ops[] = {
    OP("context_create", s_none, c_context_create),
    OP("context_create_threads", s_none, c_context_threads),
    OP("pool_create", s_ctx, c_pool_create),
    OP("agent_open_new", base, c_open_new),
    OP("agent_open_from_store", s_in_store, c_open_s),
    OP("agent_open_spilled", s_spilled, c_open_s),
    OP("agent_append", base, c_append),
    OP("agent_append_rotated", base, c_append_rot),
    OP("agent_append_grows", base, c_append_big),
    OP("agent_append_first", s_empty_c, c_append_c),
    OP("agent_append_spills", s_capacity, c_append_spill),
    OP("agent_flush", base, c_flush),
    OP("agent_read", base, c_read),
    OP("agent_truncate_reopen", s_no_tail, c_truncate),
    OP("pool_remove_agent", s_stored_b, c_remove_b),
    OPV("agent_close_spills", s_budget, c_close_b, v_close_b),
    OP("retrieval_create", s_none, c_retrieval_create),
    OP("retrieve", s_ret, c_retrieve),
    OP("retrieve_per_layer_rr", s_ret, c_retrieve_layer),
    OP("retrieve_exact", s_ret, c_retrieve_exact),
    OP("retrieve_device", s_ret_dev, c_retrieve),
    OP("retrieve_device_per_layer", s_ret_dev, c_retrieve_layer),
    OP("retrieve_device_packed", s_ret_dev, c_retrieve_excl),
    OP("gather", s_ret, c_gather),
    OP("gather_device", s_ret_dev, c_gather),
    OP("attend_tensors", s_ctx, c_attend_t),
    OP("attend_compare_oracle", s_ctx, c_attend_cmp),
    OP("attend_mask_importance", s_ctx, c_attend_mask),
    OP("attend_agent", base, c_attend_agent),
    OP("attend_slots", s_ctx, c_attend_slots),
    OP("attend_device", s_dev, c_attend_t1),
    OP("attend_device_slots", s_dev, c_attend_slots),
    OP("attend_device_strided", s_dev, c_attend_strided),
    OP("attend_device_agent_recent", s_agent_dev, c_attend_agent_recent),
    OP("qmem_store_create", s_ctx, c_qmem_create),
    OP("qmem_update_new", s_qs, c_qmem_new),
    OP("qmem_update_evicts", s_qs_full, c_qmem_new),
    OP("qmem_update_existing", s_qs, c_qmem_again),
    OP("qmem_get", s_qs, c_qmem_get),
    OP("qmem_score", s_ctx, qmem_score),
    OP("qmem_score_device", s_dev, qmem_score),
    OP("qmem_head_load_buffer", s_ctx, c_head_buffer),
    OP("qmem_head_load", s_head_file, c_head_file),
    OP("qmem_head_apply", s_head, c_head_apply),
    OP("select_keep", s_none, c_select_keep),
    OP("streaming_keep", s_none, c_streaming),
    OP("h2o_accumulate", s_none, c_h2o_acc),
    OP("h2o_keep", s_none, c_h2o_keep),
    OP("snapkv_score", s_ctx, c_snapkv),
    OP("kvstore_create", s_ctx, kvstore_create),
    OP("slotmap_create", s_kvs, c_sm_create),
    OP("slotmap_append", s_sm, c_sm_append),
    OP("slotmap_fork", s_sm, c_sm_fork),
    OP("slotmap_evict", s_sm_fork, c_sm_evict),
    OP("slotmap_compact", s_sm_fork, c_sm_compact),
    OP("slotmap_compact_sibling", s_sm_fork, c_sm_compact_fork),
    OP("slotmap_gather", s_sm, c_sm_gather),
    OP("agent_save_replace", s_saved, c_save_path),
    OP("agent_save_new", s_saved, c_save_new),
    OP("agent_save_store", s_saved, c_save_store),
    OP("agent_load", s_saved, c_load_path),
    OP("agent_load_store", s_saved, c_load_store),
    OP("agent_open_file", s_mapped_file, c_open_file),
    OP("agent_read_mapped", s_mapped, c_read),
    OP("pool_sync", s_closed_b, c_sync),
    OP("dir_store_list", s_many_stored, c_store_list),
    OP("prefix_match", base, c_prefix),
    OP("batch_merge", base, c_merge),
    OP("batch_extract", s_none, c_extract),
    OP("segments_create", s_pool, c_segs_create),
    OP("segments_add", s_segs, c_segs_add),
    OP("segments_add_new_group", s_segs, c_segs_add_far),
    OP("segments_add_grows", s_segs_full, c_segs_add),
    OP("segments_update", s_segs, c_segs_update),
    OP("segments_remove", s_segs, c_segs_remove),
    OP("segments_assign", s_segs, c_segs_assign),
    OP("segments_step", s_segs_dyn, c_segs_step),
    OP("segments_store_segment", s_segs, c_segs_store),
    OP("segments_store_replace", s_segs, c_segs_store_again),
    OP("segments_store_group", s_segs, c_segs_group),
    OP("segments_plan", s_segs, c_segs_plan),
    OP("segments_drain_events", s_segs, c_segs_drain),
    OPV("segments_free", s_segs, c_segs_free, v_segs_free),
    OP("cluster_kmeans", s_none, c_kmeans),
    OP("multihop_select", s_none, c_multihop),
    OP("multihop_schedule", s_none, c_schedule),
    OP("load_plan", s_none, c_load_plan),
    OP("rope_apply", s_rope, c_rope),
    OPV("pool_free", base, c_pool_free, v_nothing),
    ROP("redis_pool_create", s_ctx, c_pool_create_redis),
    ROP("redis_pool_create_unix", s_ctx, c_pool_create_unix),
    ROP("redis_pool_create_auth", s_ctx, c_pool_create_auth),
    ROP("redis_agent_open_from_store", s_redis_in_store, c_open_s),
    ROP("redis_agent_save_new", s_redis_base, c_save_store),
    ROP("redis_agent_save_replace", s_redis_saved, c_save_store),
    ROP("redis_agent_load", s_redis_saved, c_load_store),
    ROP("redis_store_list", s_redis_many, c_store_list),
    ROP("redis_pool_remove_agent", s_redis_stored_b, c_remove_b),
    ROP("redis_pool_sync", s_redis_closed_b, c_sync),
    ROPV("redis_agent_close_spills", s_redis_budget, c_close_b, v_close_b),
};
#define N_OPS (sizeof k_ops / sizeof k_ops[0])

/* ---- the sweep ------------------------------------------------------------- */

static uint64_t g_runs, g_failed_calls;

/* After a Redis run, whatever its outcome: every agent of the pool saves.
 * The store must still know which version this pool holds; one it forgot
 * would make the pool's next save conflict with its own earlier one. */
static void redis_save_all(const char *name, uint64_t n, int from_on, const char *site) {
    kvmem_pool_info pi;
    assert_ok(kvmem_pool_get_info(F.pool, &pi));
    for (int32_t i = 0; i < pi.n_agents; i++) {
        char id[KVMEM_MAX_AGENT_ID + 1];
        assert_ok(kvmem_pool_agent_id(F.pool, i, id, sizeof id, NULL));
        kvmem_agent *a = NULL, *opened = NULL;
        for (int j = 0; j < N_AG; j++)
            if (F.ag[j] && strcmp(kvmem_agent_get_id(F.ag[j]), id) == 0) a = F.ag[j];
        if (!a) {
            assert_ok(kvmem_agent_open(F.pool, id, &opened));
            a = opened;
        }
        kvmem_status st = kvmem_agent_save(a, NULL);
        if (st != KVMEM_OK)
            fail_msg("%s, allocation %llu%s failed (%s): afterwards agent '%s' cannot be saved: %s (%s)", name,
                     (unsigned long long)n, from_on ? " on" : "", site ? site : "none", id, kvmem_status_str(st),
                     kvmem_last_error());
        kvmem_agent_close(opened);
    }
}

/* One run of call `o` with allocation n failing (n = 0: none; the reference
 * run, which reports the allocations made and the result's digest). */
static void run_once(const op *o, uint64_t n, int from_on, uint64_t *ok_digest, uint64_t *calls) {
    int64_t live0 = kvm_alloc_live();
    fx_reset();
    o->setup();
    uint64_t before = digest();
    kvm_alloc_fail_at(n, from_on);
    kvmem_status st = o->call();
    uint64_t fired = kvm_alloc_failed(), made = kvm_alloc_calls();
    const char *site = kvm_alloc_last_failed_site();
    kvm_alloc_fail_at(0, 0);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", kvmem_last_error());
    g_runs++;
    if (n == 0) {
        if (st != KVMEM_OK) fail_msg("%s: without failures: %s (%s)", o->name, kvmem_status_str(st), msg);
        if (o->verify) o->verify();
        *calls = made;
        *ok_digest = digest();
    } else if (!fired) {
        if (st != KVMEM_OK) fail_msg("%s: without failures: %s (%s)", o->name, kvmem_status_str(st), msg);
        if (!o->verify && digest() != *ok_digest) fail_msg("%s: a run without failures differs from the first", o->name);
    } else if (o->verify) {
        o->verify();
    } else if (st == KVMEM_OK) {
        /* a fallback that did without the memory: the result must be the real one */
        if (digest() != *ok_digest)
            fail_msg("%s, allocation %llu%s failed (%s): returned OK with a different result", o->name,
                     (unsigned long long)n, from_on ? " on" : "", site);
    } else {
        g_failed_calls++;
        if (st != KVMEM_ERR_NOMEM)
            fail_msg("%s, allocation %llu%s failed (%s): %s, expected KVMEM_ERR_NOMEM (%s)", o->name,
                     (unsigned long long)n, from_on ? " on" : "", site, kvmem_status_str(st), msg);
        const char *om = strstr(msg, "out of memory for ");
        if (!om || strlen(om) < strlen("out of memory for ") + 3)
            fail_msg("%s, allocation %llu (%s): the message does not say what could not be allocated: '%s'", o->name,
                     (unsigned long long)n, site, msg);
        if (digest() != before)
            fail_msg("%s, allocation %llu%s failed (%s): state changed (%s)", o->name, (unsigned long long)n,
                     from_on ? " on" : "", site, msg);
    }
    if (o->redis && F.pool) redis_save_all(o->name, n, from_on, site);
    fx_free();
    if (kvm_alloc_live() != live0)
        fail_msg("%s, allocation %llu%s failed (%s): %lld blocks leaked", o->name, (unsigned long long)n,
                 from_on ? " on" : "", site ? site : "none", (long long)(kvm_alloc_live() - live0));
}

static void sweep(void **state) {
    const op *o = *state;
    uint64_t calls = 0, ok_digest = 0;
    g_cur_op = o;
    run_once(o, 0, 0, &ok_digest, &calls);
    for (int from_on = 0; from_on < 2; from_on++)
        for (uint64_t n = 1; n <= calls; n++) run_once(o, n, from_on, &ok_digest, NULL);
    print_message("%-28s %3llu allocations, each failed alone and from it on\n", o->name, (unsigned long long)calls);
}

static void rm_tree(void) {
    rm_files(g_store);
    rm_files(g_files);
    rmdir(g_store);
    rmdir(g_files);
    rmdir(g_root);
}

int main(void) {
    kvm_alloc_test_begin(); /* before any kvmem call: every live block is counted */
    const char *tmp = getenv("TMPDIR");
    snprintf(g_root, sizeof g_root, "%s/kvmem-oom-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_root)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    snprintf(g_store, sizeof g_store, "%s/store", g_root);
    snprintf(g_files, sizeof g_files, "%s/files", g_root);
    mkdir(g_store, 0700);
    mkdir(g_files, 0700);
    const char *port = getenv("KVMEM_TEST_REDIS_PORT");
    int redis = port && *port;
    if (redis) {
#if KVMEM_OOM_REDIS_BUILT
        snprintf(g_redis, sizeof g_redis, "redis://127.0.0.1:%s/0?pool=" REDIS_POOL "&chunk_bytes=1024", port);
        /* KVMEM_TEST_REDIS_SOCK: the server's socket; KVMEM_TEST_REDIS_AUTH:
         * "user:password" of an ACL user (each falls back to the TCP URL) */
        const char *sock = getenv("KVMEM_TEST_REDIS_SOCK"), *auth = getenv("KVMEM_TEST_REDIS_AUTH");
        if (sock && *sock) snprintf(g_redis_unix, sizeof g_redis_unix, "unix://%s?db=0&pool=" REDIS_POOL, sock);
        else snprintf(g_redis_unix, sizeof g_redis_unix, "%s", g_redis);
        if (auth && *auth) snprintf(g_redis_auth, sizeof g_redis_auth, "redis://%s@127.0.0.1:%s/0?pool=" REDIS_POOL, auth, port);
        else snprintf(g_redis_auth, sizeof g_redis_auth, "%s", g_redis);
        g_rc = redisConnect("127.0.0.1", atoi(port));
        if (!g_rc || g_rc->err) {
            fprintf(stderr, "cannot connect to the test server on port %s: %s\n", port, g_rc ? g_rc->errstr : "?");
            return 1;
        }
#else
        printf("skipped: this build has no Redis store (libhiredis-dev not found)\n");
        rm_tree();
        return 77;
#endif
    }
    const char *only = getenv("KVMEM_OOM_OP");
    struct CMUnitTest tests[N_OPS];
    size_t n = 0;
    for (size_t i = 0; i < N_OPS; i++) {
        if (k_ops[i].redis != redis) continue;
        if (only && *only && strcmp(only, k_ops[i].name) != 0) continue;
        tests[n++] = (struct CMUnitTest){k_ops[i].name, sweep, NULL, NULL, (void *)(uintptr_t)&k_ops[i]};
    }
    int rc = _cmocka_run_group_tests("oom", tests, n, NULL, NULL);
    const char *sites[1024];
    size_t ns = kvm_alloc_failed_sites(sites, 1024);
    printf("oom: %zu calls, %llu runs, %llu failed with KVMEM_ERR_NOMEM, %zu allocation sites failed\n", n,
           (unsigned long long)g_runs, (unsigned long long)g_failed_calls, ns);
    if (getenv("KVMEM_OOM_SITES"))
        for (size_t i = 0; i < ns && i < 1024; i++) printf("  %s\n", sites[i]);
    rm_tree();
#if KVMEM_OOM_REDIS_BUILT
    if (g_rc) redisFree(g_rc);
#endif
    return rc;
}
