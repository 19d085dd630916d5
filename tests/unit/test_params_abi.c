/* Params structs across versions (kvmem.h, "ABI and versioning"). A binary
 * built against an older header is emulated by a struct declared here with
 * the current layout's first fields only (static asserts keep it a prefix)
 * and its own sizeof as struct_size, placed so it ends on a page boundary
 * with an unreadable page after it: a library that read or wrote past
 * struct_size would crash the test. A binary built against a newer header
 * is the current struct followed by fields this library does not have. */
#if !defined(_DEFAULT_SOURCE)
#  define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#endif
#define KVMEM_ALLOW_DEPRECATED /* one check runs through a deprecated *_errbuf form on purpose */
#include "testutil.h"

#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define L 2
#define HQ 4
#define H 2
#define D 8
#define BS 4
#define NTOK 16 /* 4 sealed blocks */

/* ---- layouts an older and a newer binary would have -------------------- */

/* kvmem_context_params before n_threads (and its reserved) */
typedef struct old_context_params {
    size_t struct_size;
    const char *backend;
} old_context_params;
_Static_assert(offsetof(old_context_params, backend) == offsetof(kvmem_context_params, backend), "prefix");
_Static_assert(sizeof(old_context_params) == offsetof(kvmem_context_params, n_threads), "prefix");

/* kvmem_attend_params before compare (and its reserved) */
typedef struct old_attend_params {
    size_t struct_size;
    kvmem_attend_order order;
    int32_t n_sink;
    const int32_t *tile_order;
    int32_t n_tile_order;
    int32_t tile_size;
    float scale, tau_s, tau_d;
    int32_t patience;
    kvmem_attend_probe probe;
    int32_t causal;
} old_attend_params;
_Static_assert(offsetof(old_attend_params, tile_order) == offsetof(kvmem_attend_params, tile_order), "prefix");
_Static_assert(offsetof(old_attend_params, causal) == offsetof(kvmem_attend_params, causal), "prefix");
_Static_assert(sizeof(old_attend_params) == offsetof(kvmem_attend_params, compare), "prefix");

/* kvmem_retrieve_params before skip_recent (and its reserved) */
typedef struct old_retrieve_params {
    size_t struct_size;
    int32_t top_k;
    kvmem_retrieve_mode mode;
    kvmem_retrieve_norm norm;
    kvmem_retrieve_agg agg;
    kvmem_retrieve_scope scope;
    float tau, rr_c;
    const int32_t *exclude;
    int32_t n_exclude;
    const int32_t *always_include;
    int32_t n_always_include;
    int32_t recent_window;
} old_retrieve_params;
_Static_assert(offsetof(old_retrieve_params, always_include) == offsetof(kvmem_retrieve_params, always_include),
               "prefix");
_Static_assert(sizeof(old_retrieve_params) == offsetof(kvmem_retrieve_params, skip_recent), "prefix");

/* the current structs plus a field added after them */
typedef struct newer_context_params {
    kvmem_context_params now;
    int64_t added;
} newer_context_params;
typedef struct newer_attend_params {
    kvmem_attend_params now;
    int32_t added, reserved;
} newer_attend_params;

/* ---- a struct that ends where readable memory ends --------------------- */

typedef struct guarded {
    unsigned char *base;
    size_t len;
} guarded;

/* `size` bytes ending on a page boundary, the page after them PROT_NONE. */
static void *guarded_tail(guarded *g, size_t size) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    g->len = 2 * page;
    void *m = mmap(NULL, g->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    g->base = m;
    assert_int_equal(mprotect(g->base + page, page, PROT_NONE), 0);
    return g->base + page - size;
}

static void guarded_free(guarded *g) { munmap(g->base, g->len); }

/* ---- a pool with one agent of NTOK tokens, and tensors for the calls ---- */

typedef struct fixture {
    kvmem_context *ctx;
    kvmem_model_spec spec;
    kvmem_pool *pool;
    kvmem_agent *agent;
    float kv1[L * 1 * H * D];           /* one token of K (and V) */
    float q[L * HQ * D];                /* retrieval query [1][L][HQ][D] */
    float aq[HQ * D], aout[HQ * D];     /* attention query and output [1][HQ][D] */
    float ak[NTOK * H * D], av[NTOK * H * D];
    kvmem_tensor k1, v1, tq, taq, taout, tak, tav;
    kvmem_attend_source src;
} fixture;

static void fx_init(fixture *f) {
    memset(f, 0, sizeof *f);
    f->ctx = tu_context(1);
    f->spec = tu_spec(L, D);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = BS;
    pp.storage_dtype = KVMEM_F32;
    assert_ok(kvmem_pool_create(f->ctx, &f->spec, &pp, &f->pool));
    assert_ok(kvmem_agent_open(f->pool, "a", &f->agent));
    static float k[L * NTOK * H * D], v[L * NTOK * H * D];
    uint64_t rng = 3;
    tu_fill_kv(k, sizeof k / sizeof k[0], &rng);
    tu_fill_kv(v, sizeof v / sizeof v[0], &rng);
    int64_t s[4] = {L, NTOK, H, D};
    kvmem_tensor tk, tv;
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, s));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, s));
    assert_ok(kvmem_agent_append(f->agent, &tk, &tv, NULL));
    tu_fill_kv(f->kv1, sizeof f->kv1 / sizeof f->kv1[0], &rng);
    int64_t s1[4] = {L, 1, H, D};
    assert_ok(kvmem_tensor_init(&f->k1, f->kv1, KVMEM_F32, 4, s1));
    assert_ok(kvmem_tensor_init(&f->v1, f->kv1, KVMEM_F32, 4, s1));
    tu_fill_kv(f->q, sizeof f->q / sizeof f->q[0], &rng);
    int64_t sq[4] = {1, L, HQ, D};
    assert_ok(kvmem_tensor_init(&f->tq, f->q, KVMEM_F32, 4, sq));
    tu_fill_kv(f->aq, HQ * D, &rng);
    tu_fill_kv(f->ak, NTOK * H * D, &rng);
    tu_fill_kv(f->av, NTOK * H * D, &rng);
    int64_t saq[3] = {1, HQ, D}, sak[3] = {NTOK, H, D};
    assert_ok(kvmem_tensor_init(&f->taq, f->aq, KVMEM_F32, 3, saq));
    assert_ok(kvmem_tensor_init(&f->taout, f->aout, KVMEM_F32, 3, saq));
    assert_ok(kvmem_tensor_init(&f->tak, f->ak, KVMEM_F32, 3, sak));
    assert_ok(kvmem_tensor_init(&f->tav, f->av, KVMEM_F32, 3, sak));
    f->src.kind = KVMEM_ATTEND_SRC_TENSORS;
    f->src.k = &f->tak;
    f->src.v = &f->tav;
}

static void fx_free(fixture *f) {
    kvmem_agent_close(f->agent);
    kvmem_pool_free(f->pool);
    kvmem_context_free(f->ctx);
}

static int64_t agent_tokens(fixture *f) {
    kvmem_agent_info info;
    assert_ok(kvmem_agent_get_info(f->agent, &info));
    return info.n_tokens;
}

/* ---- the defaults ------------------------------------------------------- */

static void every_default_params_sets_struct_size(void **state) {
    (void)state;
#define SIZE_OF_DEFAULT(name) assert_int_equal(kvmem_##name##_default_params().struct_size, sizeof(kvmem_##name##_params))
    SIZE_OF_DEFAULT(context);
    SIZE_OF_DEFAULT(pool);
    SIZE_OF_DEFAULT(append);
    SIZE_OF_DEFAULT(retrieve);
    SIZE_OF_DEFAULT(qmem);
    SIZE_OF_DEFAULT(kvstore);
    SIZE_OF_DEFAULT(attend);
    SIZE_OF_DEFAULT(prefix);
    SIZE_OF_DEFAULT(segments);
    SIZE_OF_DEFAULT(kmeans);
    SIZE_OF_DEFAULT(multihop);
    SIZE_OF_DEFAULT(load_plan);
#undef SIZE_OF_DEFAULT
    /* a few documented defaults, to see the fields land where the header says */
    assert_int_equal(kvmem_attend_default_params().patience, 8);
    assert_int_equal(kvmem_retrieve_default_params().top_k, 8);
    assert_int_equal(kvmem_pool_default_params().block_size, 16);
    assert_int_equal(kvmem_kmeans_default_params().seed, 42);
}

/* An older binary's kvmem_X_default_params() asks for its own size: the
 * library writes exactly that many bytes, the defaults of the fields it has. */
static void init_writes_only_the_callers_bytes(void **state) {
    (void)state;
    guarded g;
    old_attend_params *old = guarded_tail(&g, sizeof *old);
    memset(old, 0xab, sizeof *old);
    assert_ok(kvmem_attend_params_init((kvmem_attend_params *)(void *)old, sizeof *old));
    const kvmem_attend_params d = kvmem_attend_default_params();
    assert_int_equal(old->struct_size, sizeof *old);
    assert_memory_equal((const char *)old + sizeof(size_t), (const char *)&d + sizeof(size_t),
                        sizeof *old - sizeof(size_t));
    assert_int_equal(old->patience, 8);
    assert_int_equal(old->causal, 1);
    guarded_free(&g);

    old_context_params *oc = guarded_tail(&g, sizeof *oc);
    assert_ok(kvmem_context_params_init((kvmem_context_params *)(void *)oc, sizeof *oc));
    assert_int_equal(oc->struct_size, sizeof *oc);
    assert_string_equal(oc->backend, "auto");
    guarded_free(&g);

    /* a newer binary's: the fields this library lacks come back zero */
    unsigned char buf[sizeof(kvmem_attend_params) + 16];
    memset(buf, 0xab, sizeof buf);
    assert_ok(kvmem_attend_params_init((kvmem_attend_params *)(void *)buf, sizeof buf));
    size_t got;
    memcpy(&got, buf, sizeof got);
    assert_int_equal(got, sizeof buf);
    assert_memory_equal(buf + sizeof(size_t), (const char *)&d + sizeof(size_t), sizeof d - sizeof(size_t));
    for (size_t i = sizeof d; i < sizeof buf; i++) assert_int_equal(buf[i], 0);

    /* sizes no version has, and NULL: refused, nothing written */
    memset(buf, 0xab, sizeof buf);
    assert_status(kvmem_attend_params_init((kvmem_attend_params *)(void *)buf, 0), KVMEM_ERR_INVALID_ARG,
                  "struct_size is 0");
    assert_status(kvmem_attend_params_init((kvmem_attend_params *)(void *)buf, sizeof(size_t) + 4),
                  KVMEM_ERR_INVALID_ARG, "is not the size of any version");
    assert_status(kvmem_attend_params_init((kvmem_attend_params *)(void *)buf, 1 << 20), KVMEM_ERR_INVALID_ARG,
                  "is not the size of any version");
    for (size_t i = 0; i < sizeof buf; i++) assert_int_equal(buf[i], 0xab);
    assert_status(kvmem_attend_params_init(NULL, sizeof d), KVMEM_ERR_INVALID_ARG, "params is NULL");
}

/* ---- an older binary's struct ------------------------------------------- */

static void older_context_params_get_the_default_thread_count(void **state) {
    (void)state;
    kvmem_context *ref = NULL;
    assert_ok(kvmem_context_create(NULL, &ref));
    const int32_t def = kvmem_context_n_threads(ref);
    kvmem_context_free(ref);

    guarded g;
    old_context_params *old = guarded_tail(&g, sizeof *old);
    old->struct_size = sizeof *old;
    old->backend = "cpu";
    kvmem_context *ctx = NULL;
    assert_ok(kvmem_context_create((const kvmem_context_params *)(const void *)old, &ctx));
    assert_string_equal(kvmem_context_backend(ctx), "cpu");
    assert_int_equal(kvmem_context_n_threads(ctx), def);
    kvmem_context_free(ctx);
    guarded_free(&g);

    /* the bytes past struct_size are not read even when they are there */
    kvmem_context_params p = kvmem_context_default_params();
    p.backend = "cpu";
    p.n_threads = def < 1024 ? def + 1 : def - 1;
    p.reserved = 77; /* would be refused if it were read */
    p.struct_size = sizeof(old_context_params);
    assert_ok(kvmem_context_create(&p, &ctx));
    assert_int_equal(kvmem_context_n_threads(ctx), def);
    kvmem_context_free(ctx);
    /* control: with its full size the same struct's fields count */
    p.struct_size = sizeof p;
    p.reserved = 0;
    assert_ok(kvmem_context_create(&p, &ctx));
    assert_int_equal(kvmem_context_n_threads(ctx), p.n_threads);
    kvmem_context_free(ctx);
}

static void older_attend_params_run_without_compare(void **state) {
    (void)state;
    fixture f;
    fx_init(&f);
    kvmem_attend_params p = kvmem_attend_default_params();
    p.order = KVMEM_ATTEND_RECENT;
    p.tile_size = 2;
    p.patience = 2;
    p.compare = 1;
    kvmem_attend_stats with, without, old_st;
    assert_ok(kvmem_attend(f.ctx, &f.taq, &f.src, &p, &f.taout, &with));
    assert_true(with.oracle_tiles > 0); /* compare counts where the ORACLE rule stops */
    float ref[HQ * D];
    memcpy(ref, f.aout, sizeof ref);

    /* the same struct cut before `compare`: its default (0) is used */
    p.struct_size = sizeof(old_attend_params);
    assert_ok(kvmem_attend(f.ctx, &f.taq, &f.src, &p, &f.taout, &without));
    assert_int_equal(without.oracle_tiles, 0);
    assert_int_equal(without.tiles_visited, with.tiles_visited);
    assert_memory_equal(f.aout, ref, sizeof ref);

    /* an older binary's own struct, ending at unreadable memory */
    guarded g;
    old_attend_params *old = guarded_tail(&g, sizeof *old);
    assert_ok(kvmem_attend_params_init((kvmem_attend_params *)(void *)old, sizeof *old));
    old->order = KVMEM_ATTEND_RECENT;
    old->tile_size = 2;
    old->patience = 2;
    memset(f.aout, 0, sizeof f.aout);
    assert_ok(kvmem_attend(f.ctx, &f.taq, &f.src, (const kvmem_attend_params *)(const void *)old, &f.taout,
                           &old_st));
    assert_int_equal(old_st.oracle_tiles, 0);
    assert_int_equal(old_st.tiles_visited, with.tiles_visited);
    assert_memory_equal(f.aout, ref, sizeof ref);
    guarded_free(&g);
    fx_free(&f);
}

static void older_retrieve_params_skip_nothing(void **state) {
    (void)state;
    fixture f;
    fx_init(&f);
    kvmem_retrieval *r = NULL;
    assert_ok(kvmem_retrieval_create(&r));
    kvmem_retrieve_params p = kvmem_retrieve_default_params();
    p.top_k = NTOK / BS;
    p.skip_recent = 2;
    const int32_t *blocks;
    int32_t n;
    assert_ok(kvmem_retrieve(f.agent, &f.tq, &p, r));
    assert_ok(kvmem_retrieval_get(r, 0, &blocks, NULL, &n));
    assert_int_equal(n, NTOK / BS - 2); /* the newest two are not candidates */

    p.struct_size = sizeof(old_retrieve_params);
    assert_ok(kvmem_retrieve(f.agent, &f.tq, &p, r));
    assert_ok(kvmem_retrieval_get(r, 0, &blocks, NULL, &n));
    assert_int_equal(n, NTOK / BS); /* skip_recent is past struct_size: default 0 */
    assert_int_equal(blocks[n - 1], NTOK / BS - 1);

    guarded g;
    old_retrieve_params *old = guarded_tail(&g, sizeof *old);
    assert_ok(kvmem_retrieve_params_init((kvmem_retrieve_params *)(void *)old, sizeof *old));
    old->top_k = 1;
    old->recent_window = 1; /* only the newest block is a candidate */
    assert_ok(kvmem_retrieve(f.agent, &f.tq, (const kvmem_retrieve_params *)(const void *)old, r));
    assert_ok(kvmem_retrieval_get(r, 0, &blocks, NULL, &n));
    assert_int_equal(n, 1);
    assert_int_equal(blocks[0], NTOK / BS - 1);
    guarded_free(&g);
    kvmem_retrieval_free(r);
    fx_free(&f);
}

/* ---- a newer binary's struct --------------------------------------------- */

static void newer_params_with_a_zero_tail_are_taken(void **state) {
    (void)state;
    newer_context_params p;
    memset(&p, 0, sizeof p);
    p.now = kvmem_context_default_params();
    p.now.struct_size = sizeof p;
    p.now.backend = "cpu";
    p.now.n_threads = 2;
    kvmem_context *ctx = NULL;
    assert_ok(kvmem_context_create(&p.now, &ctx));
    assert_int_equal(kvmem_context_n_threads(ctx), 2);
    kvmem_context_free(ctx);

    /* a field this library does not have, set: refused, nothing created */
    p.added = 5;
    ctx = (kvmem_context *)(uintptr_t)1;
    assert_status(kvmem_context_create(&p.now, &ctx), KVMEM_ERR_UNSUPPORTED, "a field this version does not have");
    assert_null(ctx);
    /* the message names the first nonzero byte past this library's layout */
    const unsigned char *bytes = (const unsigned char *)&p;
    size_t first = 0;
    for (size_t i = sizeof(kvmem_context_params); i < sizeof p && !first; i++)
        if (bytes[i]) first = i;
    char want[64];
    snprintf(want, sizeof want, "byte %zu is set", first);
    kvm_test_assert_msg("kvmem_context_create", want);
}

static void newer_attend_params_with_a_set_field_write_nothing(void **state) {
    (void)state;
    fixture f;
    fx_init(&f);
    newer_attend_params p;
    memset(&p, 0, sizeof p);
    assert_ok(kvmem_attend_params_init(&p.now, sizeof p));
    assert_int_equal(p.now.struct_size, sizeof p);
    kvmem_attend_stats st;
    assert_ok(kvmem_attend(f.ctx, &f.taq, &f.src, &p.now, &f.taout, &st));
    p.added = 1;
    for (int i = 0; i < HQ * D; i++) f.aout[i] = 7.0f;
    assert_status(kvmem_attend(f.ctx, &f.taq, &f.src, &p.now, &f.taout, &st), KVMEM_ERR_UNSUPPORTED,
                  "kvmem_attend: kvmem_attend_params has");
    for (int i = 0; i < HQ * D; i++) assert_true(f.aout[i] == 7.0f);
    fx_free(&f);
}

/* ---- every function that takes params checks struct_size ---------------- */

/* 0, a size no layout can have (odd) and one beyond any: refused with the
 * function's name; then the struct as it came is accepted. */
#define CHECK_SIZES(var, call, fn, type)                                                            \
    do {                                                                                            \
        const size_t good_ = (var).struct_size;                                                     \
        (var).struct_size = 0;                                                                      \
        assert_status(call, KVMEM_ERR_INVALID_ARG, fn ": " type ".struct_size is 0");               \
        (var).struct_size = good_ + 1;                                                              \
        assert_status(call, KVMEM_ERR_INVALID_ARG, fn ": " type ".struct_size");                    \
        kvm_test_assert_msg(#call, "is not the size of any version");                               \
        (var).struct_size = (size_t)1 << 20;                                                        \
        assert_status(call, KVMEM_ERR_INVALID_ARG, "is not the size of any version");               \
        (var).struct_size = good_;                                                                  \
    } while (0)

static void every_function_refuses_a_bad_struct_size(void **state) {
    (void)state;
    fixture f;
    fx_init(&f);
    char errbuf[256];

    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cpu";
    cp.n_threads = 1;
    kvmem_context *ctx = NULL;
    CHECK_SIZES(cp, kvmem_context_create(&cp, &ctx), "kvmem_context_create", "kvmem_context_params");
    assert_null(ctx);

    kvmem_pool_params pp = kvmem_pool_default_params();
    kvmem_pool *pool = NULL;
    CHECK_SIZES(pp, kvmem_pool_create(f.ctx, &f.spec, &pp, &pool), "kvmem_pool_create", "kvmem_pool_params");
    assert_null(pool);

    kvmem_append_params ap = kvmem_append_default_params();
    CHECK_SIZES(ap, kvmem_agent_append(f.agent, &f.k1, &f.v1, &ap), "kvmem_agent_append", "kvmem_append_params");
    CHECK_SIZES(ap, kvmem_agent_append_errbuf(f.agent, &f.k1, &f.v1, &ap, errbuf, sizeof errbuf),
                "kvmem_agent_append", "kvmem_append_params");
    assert_non_null(strstr(errbuf, "is not the size of any version"));
    assert_int_equal(agent_tokens(&f), NTOK);

    kvmem_retrieval *r = NULL;
    assert_ok(kvmem_retrieval_create(&r));
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    CHECK_SIZES(rp, kvmem_retrieve(f.agent, &f.tq, &rp, r), "kvmem_retrieve", "kvmem_retrieve_params");
    assert_int_equal(kvmem_retrieval_n_sets(r), 0);
    kvmem_retrieval_free(r);

    kvmem_qmem_params qp = kvmem_qmem_default_params();
    kvmem_qmem_store *qs = NULL;
    CHECK_SIZES(qp, kvmem_qmem_store_create(&f.spec, &qp, &qs), "kvmem_qmem_store_create", "kvmem_qmem_params");
    assert_null(qs);

    kvmem_kvstore_params kp = kvmem_kvstore_default_params();
    kvmem_kvstore *kvs = NULL;
    CHECK_SIZES(kp, kvmem_kvstore_create(&f.spec, &kp, &kvs), "kvmem_kvstore_create", "kvmem_kvstore_params");
    assert_null(kvs);

    kvmem_attend_params atp = kvmem_attend_default_params();
    CHECK_SIZES(atp, kvmem_attend(f.ctx, &f.taq, &f.src, &atp, &f.taout, NULL), "kvmem_attend",
                "kvmem_attend_params");

    kvmem_prefix_params xp = kvmem_prefix_default_params();
    kvmem_prefix_result xr;
    CHECK_SIZES(xp, kvmem_prefix_match(f.agent, "abc", 3, &xp, &xr), "kvmem_prefix_match", "kvmem_prefix_params");

    kvmem_segments_params sp = kvmem_segments_default_params();
    kvmem_segments *segs = NULL;
    CHECK_SIZES(sp, kvmem_segments_create(f.pool, "own", &sp, &segs), "kvmem_segments_create",
                "kvmem_segments_params");
    assert_null(segs);
    assert_ok(kvmem_segments_create(f.pool, "own", &sp, &segs));
    int32_t idx = -1;
    assert_ok(kvmem_segments_add(segs, "s0", 0, &idx));
    CHECK_SIZES(ap, kvmem_segments_store_segment(segs, idx, &f.k1, &f.v1, &ap), "kvmem_segments_store_segment",
                "kvmem_append_params");
    CHECK_SIZES(ap, kvmem_segments_store_group(segs, 0, &f.k1, &f.v1, &ap), "kvmem_segments_store_group",
                "kvmem_append_params");
    kvmem_pool_info pinfo;
    assert_ok(kvmem_pool_get_info(f.pool, &pinfo));
    assert_int_equal(pinfo.n_agents, 1); /* no unit agent was created */
    kvmem_segments_free(segs);

    float emb[4 * 2] = {1, 0, 0.9f, 0.1f, 0, 1, 0.1f, 0.9f};
    int32_t labels[4];
    kvmem_kmeans_params kmp = kvmem_kmeans_default_params();
    kmp.k = 2;
    CHECK_SIZES(kmp, kvmem_cluster_kmeans(emb, 4, 2, &kmp, labels, NULL, NULL), "kvmem_cluster_kmeans",
                "kvmem_kmeans_params");

    float q2s[2] = {0.5f, 0.5f}, s2s[4] = {1, 0, 0, 1};
    uint8_t sel[2];
    kvmem_multihop_params mp = kvmem_multihop_default_params();
    CHECK_SIZES(mp, kvmem_multihop_select(&mp, q2s, 1, s2s, 2, NULL, sel, NULL, NULL), "kvmem_multihop_select",
                "kvmem_multihop_params");

    double compute_ms[2] = {1, 1};
    uint64_t load_bytes[1] = {1000};
    uint8_t recompute[2] = {1, 0};
    size_t n_items = 0;
    kvmem_load_plan_params lp = kvmem_load_plan_default_params();
    CHECK_SIZES(lp, kvmem_load_plan(&lp, compute_ms, 2, load_bytes, 1, recompute, NULL, 0, &n_items, NULL, NULL),
                "kvmem_load_plan", "kvmem_load_plan_params");

    /* and each accepts the struct its default_params made */
    assert_ok(kvmem_context_create(&cp, &ctx));
    kvmem_context_free(ctx);
    assert_ok(kvmem_cluster_kmeans(emb, 4, 2, &kmp, labels, NULL, NULL));
    assert_ok(kvmem_multihop_select(&mp, q2s, 1, s2s, 2, NULL, sel, NULL, NULL));
    assert_ok(kvmem_load_plan(&lp, compute_ms, 2, load_bytes, 1, recompute, NULL, 0, &n_items, NULL, NULL));
    assert_ok(kvmem_prefix_match(f.agent, "abc", 3, &xp, &xr));
    fx_free(&f);
}

/* A reserved field is for a later version: set, it is refused. */
static void reserved_fields_must_be_zero(void **state) {
    (void)state;
    fixture f;
    fx_init(&f);
    kvmem_context_params cp = kvmem_context_default_params();
    cp.reserved = 1;
    kvmem_context *ctx = NULL;
    assert_status(kvmem_context_create(&cp, &ctx), KVMEM_ERR_UNSUPPORTED, "kvmem_context_params.reserved is 1");
    kvmem_append_params ap = kvmem_append_default_params();
    ap.reserved = 1;
    assert_status(kvmem_agent_append(f.agent, &f.k1, &f.v1, &ap), KVMEM_ERR_UNSUPPORTED,
                  "kvmem_append_params.reserved is 1");
    assert_int_equal(agent_tokens(&f), NTOK);
    kvmem_retrieval *r = NULL;
    assert_ok(kvmem_retrieval_create(&r));
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    rp.reserved = 1;
    assert_status(kvmem_retrieve(f.agent, &f.tq, &rp, r), KVMEM_ERR_UNSUPPORTED, "kvmem_retrieve_params.reserved");
    kvmem_retrieval_free(r);
    kvmem_attend_params atp = kvmem_attend_default_params();
    atp.reserved = 1;
    assert_status(kvmem_attend(f.ctx, &f.taq, &f.src, &atp, &f.taout, NULL), KVMEM_ERR_UNSUPPORTED,
                  "kvmem_attend_params.reserved");
    double compute_ms[1] = {1};
    size_t n_items = 0;
    kvmem_load_plan_params lp = kvmem_load_plan_default_params();
    lp.reserved = 1;
    assert_status(kvmem_load_plan(&lp, compute_ms, 1, NULL, 0, NULL, NULL, 0, &n_items, NULL, NULL),
                  KVMEM_ERR_UNSUPPORTED, "kvmem_load_plan_params.reserved");
    fx_free(&f);
}

/* ---- the source structs' growable forms ---------------------------------- */

/* A kvmem_attend_source_v2 gives what the same kvmem_attend_source gives, for
 * tensors and an agent; a newer binary's struct (its added field zero) is
 * taken, one that sets it or a nonzero reserved is refused with nothing
 * written, and the size rules are those of params structs. */
typedef struct newer_attend_source {
    kvmem_attend_source_v2 now;
    const float *added;
} newer_attend_source;

static void attend_source_v2_is_the_same_source(void **state) {
    (void)state;
    fixture f;
    fx_init(&f);
    float want[HQ * D], got[HQ * D];
    for (int kind = 0; kind < 2; kind++) {
        kvmem_attend_source v1 = f.src;
        kvmem_attend_source_v2 v2;
        kvmem_attend_source_v2_init(&v2);
        assert_int_equal(v2.struct_size, sizeof v2);
        if (kind == 0) {
            v2.kind = KVMEM_ATTEND_SRC_TENSORS, v2.k = &f.tak, v2.v = &f.tav;
        } else {
            v1 = (kvmem_attend_source){0};
            v1.kind = v2.kind = KVMEM_ATTEND_SRC_AGENT;
            v1.agent = v2.agent = f.agent;
            v1.layer = v2.layer = 1;
            v1.base_position = v2.base_position = 3;
        }
        kvmem_attend_stats s1, s2;
        assert_ok(kvmem_attend(f.ctx, &f.taq, &v1, NULL, &f.taout, &s1));
        memcpy(want, f.aout, sizeof want);
        memset(f.aout, 0, sizeof f.aout);
        assert_ok(kvmem_attend_v2(f.ctx, &f.taq, &v2, NULL, &f.taout, &s2));
        memcpy(got, f.aout, sizeof got);
        assert_memory_equal(got, want, sizeof got);
        assert_memory_equal(&s2, &s1, sizeof s1);
        /* a newer binary's struct: its added field zero is taken */
        newer_attend_source nw;
        memset(&nw, 0, sizeof nw);
        nw.now = v2;
        nw.now.struct_size = sizeof nw;
        memset(f.aout, 0, sizeof f.aout);
        assert_ok(kvmem_attend_v2(f.ctx, &f.taq, &nw.now, NULL, &f.taout, NULL));
        assert_memory_equal(f.aout, want, sizeof want);
        /* set, or a reserved field set: refused, out untouched */
        nw.added = want;
        memset(f.aout, 0x7f, sizeof f.aout);
        assert_status(kvmem_attend_v2(f.ctx, &f.taq, &nw.now, NULL, &f.taout, NULL), KVMEM_ERR_UNSUPPORTED,
                      "kvmem_attend_source_v2 has");
        v2.reserved = 1;
        assert_status(kvmem_attend_v2(f.ctx, &f.taq, &v2, NULL, &f.taout, NULL), KVMEM_ERR_UNSUPPORTED, "reserved");
        for (size_t i = 0; i < sizeof f.aout; i++) assert_int_equal(((unsigned char *)f.aout)[i], 0x7f);
        v2.reserved = 0;
        /* sizes no version has */
        v2.struct_size = 0;
        assert_status(kvmem_attend_v2(f.ctx, &f.taq, &v2, NULL, &f.taout, NULL), KVMEM_ERR_INVALID_ARG,
                      "kvmem_attend_source_v2.struct_size is 0: start from kvmem_attend_source_v2_init()");
        v2.struct_size = 12;
        assert_status(kvmem_attend_v2(f.ctx, &f.taq, &v2, NULL, &f.taout, NULL), KVMEM_ERR_INVALID_ARG,
                      "is not the size of any version");
    }
    assert_status(kvmem_attend_v2(f.ctx, &f.taq, NULL, NULL, &f.taout, NULL), KVMEM_ERR_INVALID_ARG, "source is NULL");
    /* the context keeps the message of a refused v2 source too */
    char msg[512];
    kvmem_context_last_error(f.ctx, msg, sizeof msg);
    assert_non_null(strstr(msg, "kvmem_attend_v2: source is NULL"));
    fx_free(&f);
}

static void session_source_v2_is_the_same_source(void **state) {
    (void)state;
    kvmem_model_spec spec = tu_spec(L, D);
    kvmem_qmem_store *store = NULL;
    kvmem_qmem_params qp = kvmem_qmem_default_params();
    qp.prefix_tokens = 4; /* so 6 tokens key by their prefix (a LOCAL key never repeats) */
    assert_ok(kvmem_qmem_store_create(&spec, &qp, &store));
    const int32_t ids[6] = {5, 6, 7, 8, 9, 10};
    for (int way = 0; way < 3; way++) { /* explicit id, marked span, prefix */
        kvmem_session_source v1 = {0};
        kvmem_session_source_v2 v2;
        kvmem_session_source_v2_init(&v2);
        v1.token_ids = v2.token_ids = ids;
        v1.n_tokens = v2.n_tokens = 6;
        if (way == 0) v1.session_id = v2.session_id = "chat-7";
        if (way == 1) v1.mark_begin = v2.mark_begin = 1, v1.mark_end = v2.mark_end = 4;
        kvmem_session_key k1, k2;
        assert_ok(kvmem_session_key_derive(store, &v1, &k1));
        assert_ok(kvmem_session_key_derive_v2(store, &v2, &k2));
        assert_int_equal(k1.kind, way == 0 ? KVMEM_SESSION_EXPLICIT : way == 1 ? KVMEM_SESSION_MARKED : KVMEM_SESSION_PREFIX);
        assert_int_equal(k1.kind, k2.kind);
        assert_true(k1.hi == k2.hi && k1.lo == k2.lo);
        v2.mark_begin = 9, v2.mark_end = 10; /* outside [0, 6): the same refusal */
        if (way == 1) assert_status(kvmem_session_key_derive_v2(store, &v2, &k2), KVMEM_ERR_INVALID_ARG, "");
    }
    kvmem_session_source_v2 v2;
    kvmem_session_source_v2_init(&v2);
    kvmem_session_key k;
    v2.struct_size = 0;
    assert_status(kvmem_session_key_derive_v2(store, &v2, &k), KVMEM_ERR_INVALID_ARG,
                  "kvmem_session_source_v2.struct_size is 0: start from kvmem_session_source_v2_init()");
    assert_status(kvmem_session_key_derive_v2(store, NULL, &k), KVMEM_ERR_INVALID_ARG, "src is NULL");
    kvmem_qmem_store_free(store);
}

/* kvmem_model_spec_v2: the defaults of the frozen spec, written only to the
 * caller's bytes; every _v2 call does what the frozen call does with the
 * same spec (outputs equal bit for bit, the same refusals); struct_size
 * read as a params struct's. */
static void fields_equal(const kvmem_model_spec_v2 *v, const kvmem_model_spec *s) {
    assert_int_equal(v->n_layers, s->n_layers);
    assert_int_equal(v->n_q_heads, s->n_q_heads);
    assert_int_equal(v->n_kv_heads, s->n_kv_heads);
    assert_int_equal(v->head_dim, s->head_dim);
    assert_int_equal(v->rotary_dim, s->rotary_dim);
    assert_int_equal(v->rope_style, s->rope_style);
    assert_int_equal(v->rope_scaling, s->rope_scaling);
    assert_int_equal(v->rope_original_max_pos, s->rope_original_max_pos);
    assert_true(v->rope_theta == s->rope_theta && v->rope_factor == s->rope_factor);
    assert_true(v->rope_low_freq_factor == s->rope_low_freq_factor);
    assert_true(v->rope_high_freq_factor == s->rope_high_freq_factor);
    assert_true(v->yarn_beta_fast == s->yarn_beta_fast && v->yarn_beta_slow == s->yarn_beta_slow);
    assert_true(v->yarn_attn_factor == s->yarn_attn_factor);
    assert_string_equal(v->model_id, s->model_id);
}

typedef struct newer_model_spec {
    kvmem_model_spec_v2 now;
    double added;
} newer_model_spec;

static void model_spec_v2_is_the_same_spec(void **state) {
    (void)state;
    kvmem_model_spec_v2 v;
    memset(&v, 0x5a, sizeof v);
    assert_ok(kvmem_model_spec_v2_init(&v, sizeof v));
    assert_int_equal(v.struct_size, sizeof v);
    const kvmem_model_spec d = kvmem_model_spec_default();
    fields_equal(&v, &d);
    assert_null(v.layer_window);
    /* an older caller's struct (up to rope_theta) ends before a guard page */
    guarded g;
    const size_t old_size = offsetof(kvmem_model_spec_v2, rope_theta);
    kvmem_model_spec_v2 *o = guarded_tail(&g, old_size);
    assert_ok(kvmem_model_spec_v2_init(o, old_size));
    assert_int_equal(o->struct_size, old_size);
    assert_int_equal(o->head_dim, d.head_dim);
    assert_int_equal(o->rope_original_max_pos, d.rope_original_max_pos);
    guarded_free(&g);
    assert_status(kvmem_model_spec_v2_init(NULL, sizeof v), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_model_spec_v2_init(&v, 0), KVMEM_ERR_INVALID_ARG, "struct_size is 0");

    /* the same spec both ways, every RoPE field away from its default */
    const int32_t window[L] = {0, 6};
    kvmem_model_spec s1 = tu_spec(L, D);
    s1.rope_scaling = KVMEM_ROPE_SCALING_LLAMA3;
    s1.rope_factor = 8.0, s1.rope_low_freq_factor = 1.5, s1.rope_high_freq_factor = 3.0;
    s1.rope_original_max_pos = 64, s1.rope_theta = 5000.0, s1.rotary_dim = D - 2;
    s1.layer_window = window;
    snprintf(s1.model_id, sizeof s1.model_id, "v2-model");
    assert_ok(kvmem_model_spec_v2_init(&v, sizeof v));
    v.n_layers = s1.n_layers, v.n_q_heads = s1.n_q_heads, v.n_kv_heads = s1.n_kv_heads, v.head_dim = s1.head_dim;
    v.rotary_dim = s1.rotary_dim, v.rope_style = s1.rope_style, v.rope_theta = s1.rope_theta;
    v.rope_scaling = s1.rope_scaling, v.rope_factor = s1.rope_factor;
    v.rope_low_freq_factor = s1.rope_low_freq_factor, v.rope_high_freq_factor = s1.rope_high_freq_factor;
    v.rope_original_max_pos = s1.rope_original_max_pos, v.layer_window = window;
    snprintf(v.model_id, sizeof v.model_id, "v2-model");
    fields_equal(&v, &s1);
    assert_ok(kvmem_model_spec_validate_v2(&v));

    float x1[3 * D], x2[3 * D];
    uint64_t rng = 11;
    tu_fill_kv(x1, 3 * D, &rng);
    memcpy(x2, x1, sizeof x1);
    const int32_t pos[3] = {0, 17, 1000};
    assert_ok(kvmem_rope_apply(&s1, x1, 3, D, pos, 0));
    assert_ok(kvmem_rope_apply_v2(&v, x2, 3, D, pos, 0));
    assert_memory_equal(x1, x2, sizeof x1);

    kvmem_context *ctx = tu_context(1);
    kvmem_pool *p1, *p2;
    assert_ok(kvmem_pool_create(ctx, &s1, NULL, &p1));
    assert_ok(kvmem_pool_create_v2(ctx, &v, NULL, &p2));
    kvmem_model_spec got1;
    kvmem_model_spec_v2 got2;
    assert_ok(kvmem_pool_get_spec(p2, &got1));
    fields_equal(&v, &got1);
    assert_ok(kvmem_model_spec_v2_init(&got2, sizeof got2));
    assert_ok(kvmem_pool_get_spec_v2(p1, &got2));
    fields_equal(&got2, &s1);
    assert_memory_equal(got2.layer_window, window, sizeof window); /* the pool's copy */
    kvmem_pool_free(p1);
    kvmem_pool_free(p2);

    /* the rule score and SnapKV: equal outputs */
    v.layer_window = NULL, s1.layer_window = NULL;
    enum { N = 24, W = 8 };
    static float k[L * N * H * D], q[W * L * HQ * D], mem[L * HQ * D];
    float a[N], b[N];
    tu_fill_kv(k, sizeof k / sizeof *k, &rng);
    tu_fill_kv(q, sizeof q / sizeof *q, &rng);
    tu_fill_kv(mem, sizeof mem / sizeof *mem, &rng);
    kvmem_tensor kt, qt;
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, (int64_t[]){L, N, H, D}));
    assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 4, (int64_t[]){W, L, HQ, D}));
    assert_ok(kvmem_qmem_score(ctx, &s1, mem, &kt, a));
    assert_ok(kvmem_qmem_score_v2(ctx, &v, mem, &kt, b));
    assert_memory_equal(a, b, sizeof a);
    assert_ok(kvmem_snapkv_score(ctx, &s1, &qt, &kt, 7, a));
    assert_ok(kvmem_snapkv_score_v2(ctx, &v, &qt, &kt, 7, b));
    assert_memory_equal(a, b, sizeof a);
    kvmem_qmem_store *qs;
    kvmem_kvstore *ks;
    assert_ok(kvmem_qmem_store_create_v2(&v, NULL, &qs));
    kvmem_qmem_store_free(qs);
    assert_ok(kvmem_kvstore_create_v2(&v, NULL, &ks));
    kvmem_kvstore_free(ks);

    /* the same refusal as the frozen form */
    char m1[512];
    s1.n_q_heads = 3, v.n_q_heads = 3;
    assert_int_equal(kvmem_model_spec_validate(&s1), KVMEM_ERR_INVALID_ARG);
    snprintf(m1, sizeof m1, "%s", kvmem_last_error());
    assert_status(kvmem_model_spec_validate_v2(&v), KVMEM_ERR_INVALID_ARG, m1);
    assert_status(kvmem_pool_create_v2(ctx, &v, NULL, &p2), KVMEM_ERR_INVALID_ARG, "n_q_heads 3");
    v.n_q_heads = HQ;
    /* a newer binary's struct: a zero tail taken, a set one refused, before anything is made */
    newer_model_spec nw;
    memset(&nw, 0, sizeof nw);
    nw.now = v;
    nw.now.struct_size = sizeof nw;
    assert_ok(kvmem_model_spec_validate_v2(&nw.now));
    nw.added = 1.0;
    p2 = NULL;
    assert_status(kvmem_pool_create_v2(ctx, &nw.now, NULL, &p2), KVMEM_ERR_UNSUPPORTED, "kvmem_model_spec_v2 has");
    assert_null(p2);
    char msg[512];
    kvmem_context_last_error(ctx, msg, sizeof msg);
    assert_non_null(strstr(msg, "kvmem_pool_create_v2"));
    /* sizes no version has, NULL */
    v.struct_size = 0;
    assert_status(kvmem_rope_apply_v2(&v, x2, 3, D, pos, 0), KVMEM_ERR_INVALID_ARG,
                  "kvmem_model_spec_v2.struct_size is 0: start from kvmem_model_spec_v2_init()");
    v.struct_size = 12;
    assert_status(kvmem_snapkv_score_v2(ctx, &v, &qt, &kt, 7, b), KVMEM_ERR_INVALID_ARG, "is not the size of any version");
    assert_status(kvmem_qmem_score_v2(ctx, NULL, mem, &kt, b), KVMEM_ERR_INVALID_ARG, "model spec is NULL");
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_default_params_sets_struct_size),
        cmocka_unit_test(init_writes_only_the_callers_bytes),
        cmocka_unit_test(older_context_params_get_the_default_thread_count),
        cmocka_unit_test(older_attend_params_run_without_compare),
        cmocka_unit_test(older_retrieve_params_skip_nothing),
        cmocka_unit_test(newer_params_with_a_zero_tail_are_taken),
        cmocka_unit_test(newer_attend_params_with_a_set_field_write_nothing),
        cmocka_unit_test(every_function_refuses_a_bad_struct_size),
        cmocka_unit_test(reserved_fields_must_be_zero),
        cmocka_unit_test(attend_source_v2_is_the_same_source),
        cmocka_unit_test(session_source_v2_is_the_same_source),
        cmocka_unit_test(model_spec_v2_is_the_same_spec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
