/* Bad input to kvmem_attend: every case fails with a status and a message
 * naming the problem, and writes neither the output nor the stats. */
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define T 40
#define H 2
#define HQ 4
#define D 16

typedef struct fixture {
    kvmem_context *ctx;
    float q[HQ * D], out[HQ * D], k[T * H * D], v[T * H * D];
    kvmem_tensor tq, to, tk, tv;
    kvmem_attend_source src;
    kvmem_attend_params ap;
    kvmem_attend_stats st;
} fixture;

static void fx_init(fixture *f) {
    memset(f, 0, sizeof *f);
    f->ctx = tu_context(1);
    uint64_t rng = 1;
    tu_fill_kv(f->q, HQ * D, &rng);
    tu_fill_kv(f->k, T * H * D, &rng);
    tu_fill_kv(f->v, T * H * D, &rng);
    int64_t qs[3] = {1, HQ, D}, ks[3] = {T, H, D};
    assert_ok(kvmem_tensor_init(&f->tq, f->q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&f->to, f->out, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&f->tk, f->k, KVMEM_F32, 3, ks));
    assert_ok(kvmem_tensor_init(&f->tv, f->v, KVMEM_F32, 3, ks));
    f->src.kind = KVMEM_ATTEND_SRC_TENSORS;
    f->src.k = &f->tk;
    f->src.v = &f->tv;
    f->ap = kvmem_attend_default_params();
}

/* Poison out and stats, expect failure, check both untouched. */
#define EXPECT_FAIL(f, call, code, needle)                                              \
    do {                                                                                \
        for (int i_ = 0; i_ < HQ * D; i_++) (f)->out[i_] = 7.0f;                        \
        memset(&(f)->st, 0x5a, sizeof (f)->st);                                         \
        assert_status(call, code, needle);                                              \
        for (int i_ = 0; i_ < HQ * D; i_++) assert_true((f)->out[i_] == 7.0f);          \
        unsigned char b_[sizeof(kvmem_attend_stats)];                                   \
        memset(b_, 0x5a, sizeof b_);                                                    \
        assert_memory_equal(&(f)->st, b_, sizeof b_);                                   \
    } while (0)

#define ATTEND(f) kvmem_attend((f)->ctx, &(f)->tq, &(f)->src, &(f)->ap, &(f)->to, &(f)->st)

static void null_arguments(void **state) {
    (void)state;
    fixture f;
    fx_init(&f);
    EXPECT_FAIL(&f, kvmem_attend(NULL, &f.tq, &f.src, &f.ap, &f.to, &f.st), KVMEM_ERR_INVALID_ARG, "ctx is NULL");
    EXPECT_FAIL(&f, kvmem_attend(f.ctx, NULL, &f.src, &f.ap, &f.to, &f.st), KVMEM_ERR_INVALID_ARG, "q is NULL");
    EXPECT_FAIL(&f, kvmem_attend(f.ctx, &f.tq, NULL, &f.ap, &f.to, &f.st), KVMEM_ERR_INVALID_ARG, "source is NULL");
    EXPECT_FAIL(&f, kvmem_attend(f.ctx, &f.tq, &f.src, &f.ap, NULL, &f.st), KVMEM_ERR_INVALID_ARG, "out is NULL");
    f.src.k = NULL;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "source k is NULL");
    /* NULL params and stats are fine */
    f.src.k = &f.tk;
    assert_ok(kvmem_attend(f.ctx, &f.tq, &f.src, NULL, &f.to, NULL));
    kvmem_context_free(f.ctx);
}

static void bad_params(void **state) {
    (void)state;
    fixture f;
    fx_init(&f);
    const kvmem_attend_params d = kvmem_attend_default_params();
    int32_t order[3] = {0, 1, 0};
#define CASE(stmt, needle)        \
    do {                          \
        f.ap = d;                 \
        stmt;                     \
        EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, needle); \
    } while (0)
    CASE(f.ap.order = (kvmem_attend_order)7, "order 7");
    CASE(f.ap.n_sink = -1, "n_sink -1");
    CASE(f.ap.tile_size = -1, "tile_size -1");
    CASE(f.ap.tile_size = 5000, "tile_size 5000");
    CASE(f.ap.scale = NAN, "scale");
    CASE(f.ap.scale = -1.0f, "scale -1");
    CASE(f.ap.tau_s = -0.1f, "tau_s");
    CASE(f.ap.tau_d = INFINITY, "tau_d");
    CASE(f.ap.patience = 0, "patience 0");
    CASE(f.ap.probe = (kvmem_attend_probe)9, "probe 9");
    CASE(f.ap.causal = 2, "causal must be 0 or 1");
    CASE(f.ap.compare = 3, "compare must be 0 or 1");
    CASE((f.ap.order = KVMEM_ATTEND_INDEX, f.ap.n_tile_order = -1), "n_tile_order -1");
    CASE(f.ap.order = (kvmem_attend_order)4, "order 4 is not RECENT, IMPORTANCE, INDEX or SCORED");
    CASE((f.ap.tile_order = order, f.ap.n_tile_order = 1), "only used by the IMPORTANCE and INDEX"); /* SCORED */
    CASE((f.ap.order = KVMEM_ATTEND_RECENT, f.ap.tile_order = order, f.ap.n_tile_order = 1),
         "only used by the IMPORTANCE and INDEX");
    CASE((f.ap.order = KVMEM_ATTEND_INDEX, f.ap.n_tile_order = 2), "tile_order is NULL");
    CASE((f.ap.order = KVMEM_ATTEND_INDEX, f.ap.tile_size = 16, f.ap.tile_order = order, f.ap.n_tile_order = 3),
         "tile_order[2] = 0 appears twice");
    order[1] = 5; /* 40 positions in tiles of 16: 3 tiles */
    CASE((f.ap.order = KVMEM_ATTEND_IMPORTANCE, f.ap.tile_size = 16, f.ap.tile_order = order, f.ap.n_tile_order = 2),
         "tile_order[1] = 5 outside [0, 3)");
#undef CASE
    kvmem_context_free(f.ctx);
}

static void bad_shapes_and_dtypes(void **state) {
    (void)state;
    fixture f;
    fx_init(&f);
    kvmem_tensor good_q = f.tq, good_k = f.tk, good_v = f.tv, good_o = f.to;
    f.tq.ndim = 2;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "q has 2 dims");
    f.tq = good_q;
    f.tq.shape[0] = 0;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "0 query rows");
    f.tq.shape[0] = 65;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "65 query rows");
    f.tq = good_q;
    f.tq.shape[1] = 3;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "not a multiple of the 2 KV heads");
    f.tq = good_q;
    f.tq.shape[2] = 8;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "q: shape");
    f.tq = good_q;
    f.tq.dtype = KVMEM_Q4;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "not f32, f16 or bf16");
    f.tq = good_q;
    f.q[5] = NAN;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "q[0][0][5] is not finite");
    f.q[5] = 0.5f;
    f.to.shape[1] = 2;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "out: shape");
    f.to = good_o;
    f.to.dtype = KVMEM_Q8;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "out: dtype");
    f.to = good_o;
    f.tk.ndim = 4;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "source k has 4 dims");
    f.tk = good_k;
    f.tv.shape[0] = T - 1;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "source v: shape");
    f.tv = good_v;
    f.tk.shape[2] = 0;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "head_dim in [1, 1024]");
    f.tk.shape[2] = 2048;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "head_dim in [1, 1024]");
    f.tk = good_k;
    f.tk.strides[0] = -1;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "negative");
    f.tk = good_k;
    /* huge: 2^40 positions cannot be tiled in int32 tile ids; nothing is read */
    kvmem_tensor hk = good_k, hv = good_v;
    hk.shape[0] = hv.shape[0] = (int64_t)1 << 40;
    hk.strides[0] = hv.strides[0] = 0;
    f.src.k = &hk;
    f.src.v = &hv;
    f.ap.tile_size = 1;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "more than 2^31 tiles");
    kvmem_context_free(f.ctx);
}

static void bad_sources(void **state) {
    (void)state;
    fixture f;
    fx_init(&f);
    const kvmem_attend_source good = f.src;
    f.src.kind = (kvmem_attend_source_kind)9;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "source kind 9");
    f.src = good;
    int32_t slots[T];
    for (int i = 0; i < T; i++) slots[i] = i;
    f.src.slots = slots;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "are for SLOTMAP sources");
    f.src = good;
    f.src.layer = 1;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "are for AGENT sources");
    /* slot maps */
    f.src = good;
    f.src.kind = KVMEM_ATTEND_SRC_SLOTMAP;
    f.src.n_positions = -1;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "n_positions -1");
    f.src.n_positions = T;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "slots is NULL");
    f.src.slots = slots;
    f.src.dead_slot = -1;
    slots[7] = T; /* one past the physical rows */
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "slots[7] = 40 outside [0, 40)");
    slots[7] = -1; /* the dead slot: fine */
    assert_ok(ATTEND(&f));
    /* agents */
    kvmem_model_spec spec = tu_spec(2, D);
    kvmem_pool *pool = NULL;
    assert_ok(kvmem_pool_create(f.ctx, &spec, NULL, &pool));
    kvmem_agent *ag = NULL;
    assert_ok(kvmem_agent_open(pool, "bad", &ag));
    memset(&f.src, 0, sizeof f.src);
    f.src.kind = KVMEM_ATTEND_SRC_AGENT;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, NULL);
    f.src.agent = ag;
    f.src.layer = 2;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "layer 2 outside [0, 2)");
    f.src.layer = 1;
    f.src.k = &f.tk;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "not used by AGENT sources");
    f.src.k = NULL;
    f.src.base_position = -5;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "base_position -5");
    f.src.base_position = 0;
    f.ap.tile_size = 16;
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_INVALID_ARG, "tiles are its blocks");
    f.ap.tile_size = 0;
    /* an empty agent: every row sees nothing, output zeros */
    for (int i = 0; i < HQ * D; i++) f.out[i] = 7.0f;
    assert_ok(ATTEND(&f));
    for (int i = 0; i < HQ * D; i++) assert_true(f.out[i] == 0.0f);
    assert_int_equal(f.st.tiles_total, 0);
    kvmem_agent_close(ag);
    EXPECT_FAIL(&f, ATTEND(&f), KVMEM_ERR_CLOSED, NULL);
    kvmem_pool_free(pool);
    kvmem_context_free(f.ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(null_arguments),
        cmocka_unit_test(bad_params),
        cmocka_unit_test(bad_shapes_and_dtypes),
        cmocka_unit_test(bad_sources),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
