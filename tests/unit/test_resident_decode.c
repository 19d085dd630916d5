/* Device-resident agent memory (core/pool/resident.h) on "vulkan" (Mesa's
 * lavapipe here; skipped with the reason where no Vulkan device is usable),
 * or on the backend named by the first argument (ctest runs it for "cuda"
 * too: skipped without a GPU, run by scripts/gpu-check.sh on one).
 *
 * A decode step = kvmem_retrieve of 1 query token, kvmem_gather of the top-k
 * blocks, kvmem_attend over the agent (AGENT source, every layer). Two
 * contexts ("cpu", "vulkan") hold identical agents. After a warm-up step
 * (which uploads the blocks once), the context's transfer counters
 * (kvmem_context_transfer_stats) must show, per phase, bytes derived here
 * from the shapes alone:
 *   retrieve  up: the query, L * Hq * D floats. Down: exactly the
 *             result's per-block scores S(b), n_sets * n_blocks floats
 *             (kvmem_retrieval_block_scores; dev_score_reduce sums the
 *             per-(layer, query head) scores on the device): the one
 *             transfer that grows with the history, by 4 bytes a block per
 *             set whatever L and Hq (the host ranks them for the top-k).
 *             GLOBAL (n_sets 1) in the step; PER_LAYER (n_sets L) checked
 *             on its own.
 *   gather    down: exactly the gathered K and V, 2 * L * M * H * D floats;
 *             up: at most M slot ids and M * rotary_dim cos/sin values.
 *   attend    down: the output (Hq * D floats) and one tile count per KV
 *             head; up: exactly q plus the unsealed tail's f32 K/V rows
 *             (fewer than block_size tokens): keys are rotated on the fly
 *             from a resident cos/sin table, whose rows go up once per
 *             position (and one row for a new base_position). With the stop rule on,
 *             RECENT's tile list (sinks, then newest first) is a slice of a
 *             resident buffer: once the buffer exists a step uploads no tile
 *             ids, or 2 per sink tile when the tile count changed (before,
 *             the whole list went up: 4 bytes a tile, every call).
 * and the whole step's uploads do not change when the history grows 4x, its
 * downloads only by the new blocks' scores (4 bytes each), all within 2x
 * (query + result) bytes besides those scores. Before residency a step
 * uploaded every AABB (retrieve) and the agent's K/V went unused by the
 * device; before dev_score_reduce retrieval read back L * Hq floats a block.
 * Results equal the CPU context's: the same selection; scores within 1e-4
 * relative (tests/unit/test_retrieve_backend.c derives it); gathered V bit
 * for bit (a copy of the same decoded rows) and K within 1e-5 of its row's
 * scale (one rotation each side, cos/sin from the same function); attention
 * within 2e-5 of the output's scale (f32 online softmax in another order),
 * with the same tile statistics (the mirror holds the pool's f16 K, V and
 * boxes, so the device reads the host's values exactly; a key's angle for
 * base + p comes by angle addition, exact at base 0).
 * The other steps a session takes, each upload derived from the shapes:
 *   exclude   a block in the middle excluded: the candidates' boxes are
 *             gathered from the mirror on the device, nothing but the
 *             query goes up (before: every candidate's boxes, O(history));
 *   base      a new base_position: one cos/sin row (rotary_dim floats) on
 *             top of the steady step (before: every position's, again);
 *   truncate  whole blocks cut: the kept blocks stay resident, the next
 *             step uploads what a steady one does (before: everything).
 * Results equal the CPU context's in each. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { L = 2, HQ = 4, H = 2, D = 32, BS = 16, TOP_K = 4, TAIL = 5 };

typedef struct side {
    kvmem_context *ctx;
    kvmem_pool *pool;
    kvmem_agent *ag;
} side;

static char g_why[512];
static const char *g_backend = "vulkan";
static side g_cpu, g_dev;
static int g_ok;

static int open_side(side *s, const char *backend) {
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = backend;
    cp.n_threads = 2;
    if (kvmem_context_create(&cp, &s->ctx) != KVMEM_OK) {
        snprintf(g_why, sizeof g_why, "backend %s: %s", backend, kvmem_last_error());
        return 0;
    }
    kvmem_model_spec sp = tu_spec(L, D);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = BS;
    pp.storage_dtype = KVMEM_F16;
    assert_ok(kvmem_pool_create(s->ctx, &sp, &pp, &s->pool));
    assert_ok(kvmem_agent_open(s->pool, "a", &s->ag));
    return 1;
}

static int setup(void **state) {
    (void)state;
    g_ok = open_side(&g_cpu, "cpu") && open_side(&g_dev, g_backend);
    return 0;
}

static void close_side(side *s) {
    if (!s->ctx) return;
    kvmem_agent_close(s->ag);
    kvmem_pool_free(s->pool);
    kvmem_context_free(s->ctx);
    memset(s, 0, sizeof *s);
}

static int teardown(void **state) {
    (void)state;
    close_side(&g_cpu);
    close_side(&g_dev);
    return 0;
}

#define NEED_VULKAN()                                \
    do {                                             \
        if (!g_ok) {                                 \
            TU_SKIP("%s", g_why);   \
        }                                            \
    } while (0)

/* Append tokens [t0, t0 + n) to each of the n_ags agents: keys carry a
 * per-block offset direction so block scores are far apart (no near ties at
 * the top-k cut). */
static void append_to(kvmem_agent *const *ags, int n_ags, int64_t t0, int n, uint64_t *rng) {
    size_t cnt = (size_t)L * (size_t)n * H * D;
    float *k = malloc(cnt * 4), *v = malloc(cnt * 4);
    for (size_t l = 0; l < L; l++)
        for (int t = 0; t < n; t++)
            for (size_t h = 0; h < H; h++)
                for (size_t d = 0; d < D; d++) {
                    size_t i = ((l * (size_t)n + (size_t)t) * H + h) * D + d;
                    uint64_t bs = (uint64_t)((t0 + t) / BS) * 1000003u + l * 31u + h * 7u + d;
                    float dir = (float)((bs * 2654435761u >> 7) % 2001) / 1000.0f - 1.0f;
                    k[i] = 0.3f * tu_normal(rng) + 1.5f * dir;
                    v[i] = tu_normal(rng);
                }
    int64_t sh[4] = {L, n, H, D};
    kvmem_tensor kt, vt;
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 4, sh));
    for (int i = 0; i < n_ags; i++) assert_ok(kvmem_agent_append(ags[i], &kt, &vt, NULL));
    free(k);
    free(v);
}

static void append_both(int64_t t0, int n, uint64_t *rng) {
    kvmem_agent *ags[2] = {g_cpu.ag, g_dev.ag};
    append_to(ags, 2, t0, n, rng);
}

typedef struct step_out {
    int32_t sel[TOP_K], n_sel;
    float sel_score[TOP_K];
    float *all; /* per-block scores */
    int32_t n_blocks;
    float *gk, *gv; /* [L][M][H][D] */
    int64_t M;
    float att[L][HQ * D];
    kvmem_attend_stats st[L];
} step_out;

typedef struct step_bytes {
    uint64_t up[3], down[3]; /* retrieve, gather, attend */
} step_bytes;

static void counters(kvmem_context *ctx, uint64_t *h, uint64_t *d) { assert_ok(kvmem_context_transfer_stats(ctx, h, d)); }

/* One decode step on s; query rows from the seed (the same on both sides). */
static void decode_step(side *s, uint64_t seed, const kvmem_attend_params *ap, step_out *o, step_bytes *b) {
    uint64_t rng = seed;
    float q[L * HQ * D];
    for (int i = 0; i < L * HQ * D; i++) q[i] = tu_normal(&rng);
    uint64_t h0, d0, h1, d1;
    counters(s->ctx, &h0, &d0);
    /* retrieve */
    kvmem_retrieval *r = NULL;
    assert_ok(kvmem_retrieval_create(&r));
    int64_t qs[4] = {1, L, HQ, D};
    kvmem_tensor qt;
    assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 4, qs));
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    rp.top_k = TOP_K;
    assert_ok(kvmem_retrieve(s->ag, &qt, &rp, r));
    const int32_t *sel;
    const float *sc, *all;
    assert_ok(kvmem_retrieval_get(r, 0, &sel, &sc, &o->n_sel));
    assert_true(o->n_sel == TOP_K);
    memcpy(o->sel, sel, sizeof o->sel);
    memcpy(o->sel_score, sc, sizeof o->sel_score);
    assert_ok(kvmem_retrieval_block_scores(r, 0, &all, &o->n_blocks));
    o->all = malloc((size_t)o->n_blocks * 4);
    memcpy(o->all, all, (size_t)o->n_blocks * 4);
    assert_ok(kvmem_retrieval_n_tokens(r, 0, &o->M));
    kvmem_retrieval_free(r);
    counters(s->ctx, &h1, &d1);
    b->up[0] = h1 - h0, b->down[0] = d1 - d0;
    /* gather the selection at positions 0..M-1 */
    const size_t ge = (size_t)L * (size_t)o->M * H * D;
    o->gk = malloc(ge * 4);
    o->gv = malloc(ge * 4);
    int64_t gs[4] = {L, o->M, H, D};
    kvmem_tensor kt, vt;
    assert_ok(kvmem_tensor_init(&kt, o->gk, KVMEM_F32, 4, gs));
    assert_ok(kvmem_tensor_init(&vt, o->gv, KVMEM_F32, 4, gs));
    assert_ok(kvmem_gather(s->ag, o->sel, o->n_sel, 0, &kt, &vt));
    counters(s->ctx, &h0, &d0);
    b->up[1] = h0 - h1, b->down[1] = d0 - d1;
    /* attend over the whole agent, every layer */
    for (int l = 0; l < L; l++) {
        int64_t as[3] = {1, HQ, D};
        kvmem_tensor aq, ao;
        assert_ok(kvmem_tensor_init(&aq, q + (size_t)l * HQ * D, KVMEM_F32, 3, as));
        assert_ok(kvmem_tensor_init(&ao, o->att[l], KVMEM_F32, 3, as));
        kvmem_attend_source src;
        memset(&src, 0, sizeof src);
        src.kind = KVMEM_ATTEND_SRC_AGENT;
        src.agent = s->ag;
        src.layer = l;
        assert_ok(kvmem_attend(s->ctx, &aq, &src, ap, &ao, &o->st[l]));
    }
    counters(s->ctx, &h1, &d1);
    b->up[2] = h1 - h0, b->down[2] = d1 - d0;
}

static void step_free(step_out *o) {
    free(o->all);
    free(o->gk);
    free(o->gv);
}

static void assert_equal_steps(const step_out *c, const step_out *g) {
    assert_int_equal(c->n_blocks, g->n_blocks);
    for (int32_t j = 0; j < c->n_blocks; j++)
        assert_true(fabsf(c->all[j] - g->all[j]) <= 1e-4f * fabsf(c->all[j]) + 1e-7f);
    assert_int_equal(c->n_sel, g->n_sel);
    for (int i = 0; i < c->n_sel; i++) assert_int_equal(c->sel[i], g->sel[i]);
    assert_true(c->M == g->M);
    const size_t rows = (size_t)L * (size_t)c->M * H;
    for (size_t r = 0; r < rows; r++) {
        float scale = 0;
        for (int d = 0; d < D; d++) scale += fabsf(c->gk[r * D + d]);
        for (int d = 0; d < D; d++) {
            assert_true(fabsf(c->gk[r * D + d] - g->gk[r * D + d]) <= 1e-5f * scale);
            assert_true(c->gv[r * D + d] == g->gv[r * D + d]);
        }
    }
    for (int l = 0; l < L; l++) {
        float scale = 0;
        for (int i = 0; i < HQ * D; i++) scale = fmaxf(scale, fabsf(c->att[l][i]));
        for (int i = 0; i < HQ * D; i++) assert_true(fabsf(c->att[l][i] - g->att[l][i]) <= 2e-5f * scale);
        assert_int_equal(c->st[l].tiles_visited, g->st[l].tiles_visited);
        assert_int_equal(c->st[l].tiles_total, g->st[l].tiles_total);
        assert_int_equal(c->st[l].positions_read, g->st[l].positions_read);
        assert_int_equal(c->st[l].stopped_early, g->st[l].stopped_early);
    }
}

static kvmem_attend_params full_attention(void) {
    kvmem_attend_params p = kvmem_attend_default_params();
    p.order = KVMEM_ATTEND_RECENT;
    p.tau_s = p.tau_d = 0;
    return p;
}

/* The step on both sides: results equal, device bytes returned. */
static void both(uint64_t seed, const kvmem_attend_params *ap, step_bytes *b) {
    step_out c, g;
    step_bytes cb;
    memset(&c, 0, sizeof c);
    memset(&g, 0, sizeof g);
    decode_step(&g_cpu, seed, ap, &c, &cb);
    decode_step(&g_dev, seed, ap, &g, b);
    for (int i = 0; i < 3; i++) assert_true(cb.up[i] == 0 && cb.down[i] == 0); /* "cpu" moves nothing */
    assert_equal_steps(&c, &g);
    step_free(&c);
    step_free(&g);
}

/* attend's uploads of a step over every layer with `tail` unsealed tokens
 * whose cos/sin rows are up already: q and the tail's f32 K/V rows */
static uint64_t attend_up(int tail) { return (uint64_t)L * (HQ * D * 4 + (uint64_t)tail * (2 * H * D * 4)); }

/* Per-phase bounds derived from the shapes (see the header comment). */
static void assert_phase_bounds(const step_bytes *b, int32_t n_blocks) {
    const uint64_t M = TOP_K * BS, rot = D; /* tu_spec: rotary_dim = head_dim */
    assert_true(b->up[0] == (uint64_t)L * HQ * D * 4);
    assert_true(b->down[0] == 1 * (uint64_t)n_blocks * 4); /* n_sets * n_cand * 4 */
    assert_true(b->down[1] == 2ull * L * M * H * D * 4);
    assert_true(b->up[1] <= M * 4 + M * rot * 4);
    assert_true(b->down[2] == (uint64_t)L * (HQ * D * 4 + H * 4));
    assert_true(b->up[2] == attend_up(TAIL));
}

static uint64_t step_total(const step_bytes *b, int up) {
    return up ? b->up[0] + b->up[1] + b->up[2] : b->down[0] + b->down[1] + b->down[2];
}

/* A PER_LAYER retrieval (n_sets = L) on both sides: the device reads back
 * L * n_blocks floats, one score a block per layer, and uploads the query;
 * the selections equal the CPU's, the scores within the tolerance above. */
static void per_layer_retrieve(uint64_t seed, int32_t n_blocks) {
    uint64_t rng = seed;
    float q[L * HQ * D];
    for (int i = 0; i < L * HQ * D; i++) q[i] = tu_normal(&rng);
    int64_t qs[4] = {1, L, HQ, D};
    kvmem_tensor qt;
    assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 4, qs));
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    rp.top_k = TOP_K;
    rp.scope = KVMEM_SCOPE_PER_LAYER;
    kvmem_retrieval *rc = NULL, *rg = NULL;
    assert_ok(kvmem_retrieval_create(&rc));
    assert_ok(kvmem_retrieval_create(&rg));
    uint64_t h0, d0, h1, d1;
    assert_ok(kvmem_retrieve(g_cpu.ag, &qt, &rp, rc));
    counters(g_dev.ctx, &h0, &d0);
    assert_ok(kvmem_retrieve(g_dev.ag, &qt, &rp, rg));
    counters(g_dev.ctx, &h1, &d1);
    assert_true(h1 - h0 == (uint64_t)L * HQ * D * 4);
    assert_true(d1 - d0 == (uint64_t)L * (uint64_t)n_blocks * 4); /* n_sets * n_cand * 4 */
    assert_int_equal(kvmem_retrieval_n_sets(rg), L);
    for (int32_t l = 0; l < L; l++) {
        const float *ac, *ag;
        const int32_t *sc, *sg;
        int32_t nc, ng;
        assert_ok(kvmem_retrieval_block_scores(rc, l, &ac, &nc));
        assert_ok(kvmem_retrieval_block_scores(rg, l, &ag, &ng));
        assert_int_equal(nc, n_blocks);
        assert_int_equal(ng, n_blocks);
        for (int32_t j = 0; j < nc; j++) assert_true(fabsf(ac[j] - ag[j]) <= 1e-4f * fabsf(ac[j]) + 1e-7f);
        assert_ok(kvmem_retrieval_get(rc, l, &sc, NULL, &nc));
        assert_ok(kvmem_retrieval_get(rg, l, &sg, NULL, &ng));
        assert_int_equal(nc, ng);
        for (int32_t i = 0; i < nc; i++) assert_int_equal(sc[i], sg[i]);
    }
    kvmem_retrieval_free(rc);
    kvmem_retrieval_free(rg);
}

static void test_decode_step_moves_query_and_result_bytes(void **state) {
    (void)state;
    NEED_VULKAN();
    uint64_t rng = 11;
    const int T1 = 256;
    append_both(0, T1 + TAIL, &rng); /* 16 sealed blocks and an unsealed tail */
    const kvmem_attend_params ap = full_attention();
    step_bytes warm, b1, b4;
    both(101, &ap, &warm); /* uploads the blocks once */
    assert_true(step_total(&warm, 1) > (uint64_t)T1 * L * H * D * 4); /* every K row went up at least once */
    both(102, &ap, &b1);
    assert_phase_bounds(&b1, T1 / BS);
    /* 4x the history: the new blocks go up once (warm-up), then the same step */
    append_both(T1 + TAIL, 3 * T1, &rng);
    both(103, &ap, &warm);
    both(104, &ap, &b4);
    assert_phase_bounds(&b4, 4 * T1 / BS);
    assert_true(step_total(&b4, 1) == step_total(&b1, 1));
    /* the growth is the new blocks' scores, one float each: not L * HQ */
    const uint64_t score_growth = (uint64_t)(4 * T1 / BS - T1 / BS) * 4;
    assert_true(step_total(&b4, 0) - step_total(&b1, 0) == score_growth);
    /* everything besides the block scores within 2x (query + result) */
    const uint64_t query = 2ull * L * HQ * D * 4;
    const uint64_t result = 2ull * L * TOP_K * BS * H * D * 4 + (uint64_t)L * HQ * D * 4 + TOP_K * 4;
    const uint64_t scores = (uint64_t)(4 * T1 / BS) * 4;
    assert_true(step_total(&b4, 1) + step_total(&b4, 0) - scores <= 2 * (query + result));
    print_message("decode step at %d and %d tokens: up %llu / %llu, down %llu / %llu bytes\n", T1 + TAIL,
                  4 * T1 + TAIL, (unsigned long long)step_total(&b1, 1), (unsigned long long)step_total(&b4, 1),
                  (unsigned long long)step_total(&b1, 0), (unsigned long long)step_total(&b4, 0));
    per_layer_retrieve(105, 4 * T1 / BS);
}

static void test_stop_rule_and_truncate_match_cpu(void **state) {
    (void)state;
    NEED_VULKAN();
    /* the agents hold the previous test's history: the stop rule on (RECENT
     * order with n_sink 4: one sink tile, then newest first) */
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.order = KVMEM_ATTEND_RECENT;
    ap.tau_s = 0.05f;
    ap.tau_d = 0.01f;
    ap.patience = 2;
    step_bytes b;
    both(201, &ap, &b); /* makes the mirror's RECENT buffer */
    both(204, &ap, &b);
    assert_true(b.up[2] == attend_up(TAIL)); /* no tile ids */
    /* one more block: the cos/sin rows of BS new positions, once for every
     * layer (tu_spec: rotary_dim = head_dim), the sink id put back and
     * written one slot down */
    uint64_t rng = 78;
    append_both(4 * 256 + TAIL, BS, &rng);
    both(205, &ap, &b);
    assert_true(b.up[2] == attend_up(TAIL) + (uint64_t)BS * D * 4 + 2 * 4);
    both(206, &ap, &b);
    assert_true(b.up[2] == attend_up(TAIL));
    /* truncate into a sealed block (it is re-opened as the tail), append a
     * different continuation: the mirror must not serve stale blocks */
    const int64_t n = 4 * 256 + BS + TAIL; /* the history so far */
    assert_ok(kvmem_agent_truncate(g_cpu.ag, n - 300));
    assert_ok(kvmem_agent_truncate(g_dev.ag, n - 300));
    rng = 77;
    append_both(n - 300, 100, &rng);
    const kvmem_attend_params full = full_attention();
    both(202, &full, &b);
    both(203, &ap, &b);
}

/* One whole step with an exclude list and a base_position on both sides:
 * results equal (as in both()), the device's bytes per phase returned. */
static void both_with(uint64_t seed, const int32_t *excl, int32_t n_excl, int64_t base, step_bytes *b) {
    step_out o[2];
    for (int side_i = 0; side_i < 2; side_i++) {
        side *sd = side_i ? &g_dev : &g_cpu;
        step_out *x = &o[side_i];
        memset(x, 0, sizeof *x);
        uint64_t rng = seed;
        float q[L * HQ * D];
        for (int i = 0; i < L * HQ * D; i++) q[i] = tu_normal(&rng);
        uint64_t h0, d0, h1, d1;
        counters(sd->ctx, &h0, &d0);
        kvmem_retrieval *r = NULL;
        assert_ok(kvmem_retrieval_create(&r));
        int64_t qs[4] = {1, L, HQ, D};
        kvmem_tensor qt;
        assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 4, qs));
        kvmem_retrieve_params rp = kvmem_retrieve_default_params();
        rp.top_k = TOP_K;
        rp.exclude = excl;
        rp.n_exclude = n_excl;
        assert_ok(kvmem_retrieve(sd->ag, &qt, &rp, r));
        const int32_t *sel;
        const float *all;
        assert_ok(kvmem_retrieval_get(r, 0, &sel, NULL, &x->n_sel));
        memcpy(x->sel, sel, (size_t)x->n_sel * 4);
        assert_ok(kvmem_retrieval_block_scores(r, 0, &all, &x->n_blocks));
        x->all = malloc((size_t)x->n_blocks * 4);
        memcpy(x->all, all, (size_t)x->n_blocks * 4);
        kvmem_retrieval_free(r);
        counters(sd->ctx, &h1, &d1);
        b->up[0] = h1 - h0, b->down[0] = d1 - d0;
        b->up[1] = b->down[1] = 0;
        const kvmem_attend_params ap = full_attention();
        for (int l = 0; l < L; l++) {
            int64_t as[3] = {1, HQ, D};
            kvmem_tensor aq, ao;
            assert_ok(kvmem_tensor_init(&aq, q + (size_t)l * HQ * D, KVMEM_F32, 3, as));
            assert_ok(kvmem_tensor_init(&ao, x->att[l], KVMEM_F32, 3, as));
            kvmem_attend_source src;
            memset(&src, 0, sizeof src);
            src.kind = KVMEM_ATTEND_SRC_AGENT;
            src.agent = sd->ag;
            src.layer = l;
            src.base_position = base;
            assert_ok(kvmem_attend(sd->ctx, &aq, &src, &ap, &ao, &x->st[l]));
        }
        counters(sd->ctx, &h0, &d0);
        b->up[2] = h0 - h1, b->down[2] = d0 - d1;
    }
    const step_out *c = &o[0], *g = &o[1];
    assert_int_equal(c->n_blocks, g->n_blocks);
    for (int32_t j = 0; j < c->n_blocks; j++) /* an excluded block's score is NaN on both */
        assert_true(isnan(c->all[j]) ? isnan(g->all[j]) : fabsf(c->all[j] - g->all[j]) <= 1e-4f * fabsf(c->all[j]) + 1e-7f);
    assert_int_equal(c->n_sel, g->n_sel);
    for (int i = 0; i < c->n_sel; i++) assert_int_equal(c->sel[i], g->sel[i]);
    for (int l = 0; l < L; l++) {
        float scale = 0;
        for (int i = 0; i < HQ * D; i++) scale = fmaxf(scale, fabsf(c->att[l][i]));
        for (int i = 0; i < HQ * D; i++) assert_true(fabsf(c->att[l][i] - g->att[l][i]) <= 2e-5f * scale);
        assert_int_equal(c->st[l].tiles_visited, g->st[l].tiles_visited);
    }
    free(o[0].all);
    free(o[1].all);
}

static void test_exclude_base_truncate_move_o1(void **state) {
    (void)state;
    NEED_VULKAN();
    assert_ok(kvmem_agent_truncate(g_cpu.ag, 0));
    assert_ok(kvmem_agent_truncate(g_dev.ag, 0));
    uint64_t rng = 5;
    const int T = 512;
    append_both(0, T + TAIL, &rng);
    const int32_t nb = T / BS;
    step_bytes b;
    both_with(301, NULL, 0, 0, &b); /* warm-up: the blocks go up once */
    both_with(302, NULL, 0, 0, &b);
    const uint64_t q_up = (uint64_t)L * HQ * D * 4;
    assert_true(b.up[0] == q_up);
    assert_true(b.up[2] == attend_up(TAIL));
    /* an exclude list that splits the candidates into runs (two blocks in
     * the middle, one near the end): the query alone goes up; the scores of
     * the nb - 3 candidates come back */
    const int32_t excl[3] = {nb / 2, nb / 2 + 2, nb - 3};
    both_with(303, excl, 3, 0, &b);
    assert_true(b.up[0] == q_up);
    assert_true(b.down[0] == (uint64_t)(nb - 3) * 4);
    /* a new base_position: one cos/sin row (rotary_dim = head_dim floats),
     * for every layer; then nothing more at the same base */
    both_with(304, NULL, 0, 1000, &b);
    assert_true(b.up[2] == attend_up(TAIL) + (uint64_t)D * 4);
    both_with(305, NULL, 0, 1000, &b);
    assert_true(b.up[2] == attend_up(TAIL));
    /* with the exclude list too */
    both_with(306, excl, 3, 1000, &b);
    assert_true(b.up[0] == q_up && b.up[2] == attend_up(TAIL));
    /* truncate 3 whole blocks plus the tail: the kept blocks stay resident,
     * nothing goes up but the query (and the base row, changed back) */
    assert_ok(kvmem_agent_truncate(g_cpu.ag, T - 3 * BS));
    assert_ok(kvmem_agent_truncate(g_dev.ag, T - 3 * BS));
    both_with(307, NULL, 0, 0, &b);
    assert_true(b.up[0] == q_up);
    assert_true(b.up[2] == attend_up(0) + (uint64_t)D * 4);
    /* truncate into a block (re-opened as the tail) and a new continuation:
     * one new block goes up (f16 K and V of every layer, its f16 boxes) */
    assert_ok(kvmem_agent_truncate(g_cpu.ag, T - 4 * BS + 3));
    assert_ok(kvmem_agent_truncate(g_dev.ag, T - 4 * BS + 3));
    rng = 99;
    append_both(T - 4 * BS + 3, BS, &rng); /* seals the re-opened block; 3 tokens left in the tail */
    both_with(308, NULL, 0, 0, &b);
    const uint64_t block_up = 2ull * L * BS * H * D * 2 + 2ull * L * H * D * 2;
    assert_true(b.up[0] == q_up + block_up);
    both_with(309, NULL, 0, 0, &b);
    assert_true(b.up[0] == q_up && b.up[2] == attend_up(3));
}

/* kvmem_pool_device_stats of p: mirror bytes, evictions, unmirrored. */
static void dev_stats(kvmem_pool *p, uint64_t out[3]) { assert_ok(kvmem_pool_device_stats(p, &out[0], &out[1], &out[2])); }

/* A pool with the given device capacity on ctx (f16, as the sides'), agents
 * ids[0..n) open in ags. */
static kvmem_pool *capped_pool(kvmem_context *ctx, uint64_t capacity, const char *const *ids, int n, kvmem_agent **ags) {
    kvmem_model_spec sp = tu_spec(L, D);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = BS;
    pp.storage_dtype = KVMEM_F16;
    pp.device_capacity_bytes = capacity;
    kvmem_pool *p = NULL;
    assert_ok(kvmem_pool_create(ctx, &sp, &pp, &p));
    for (int i = 0; i < n; i++) assert_ok(kvmem_agent_open(p, ids[i], &ags[i]));
    return p;
}

/* One decode step on s equal to the CPU side's step on c. */
static void step_equal(side *c, side *s, uint64_t seed, const kvmem_attend_params *ap) {
    step_out co, so;
    step_bytes b;
    memset(&co, 0, sizeof co);
    memset(&so, 0, sizeof so);
    decode_step(c, seed, ap, &co, &b);
    decode_step(s, seed, ap, &so, &b);
    assert_equal_steps(&co, &so);
    step_free(&co);
    step_free(&so);
}

/* device_capacity_bytes: the mirror's bytes are those resident.h's layout
 * gives (computed here from the shapes); at the limit a closed agent's
 * mirror gives way, an open one's does not, and an agent whose mirror does
 * not fit is served from the host copy with the CPU context's results; the
 * bytes held never pass the capacity. A CPU context holds none. */
static void test_device_capacity_bounds_the_mirrors(void **state) {
    (void)state;
    NEED_VULKAN();
    const int T = 8 * BS + TAIL;
    const kvmem_attend_params ap = full_attention();
    static const char *const ids[2] = {"a", "b"};
    kvmem_agent *ref_ag[1], *cap_ag[2];
    kvmem_pool *ref = capped_pool(g_cpu.ctx, 1, ids, 1, ref_ag); /* a CPU context ignores the capacity */
    /* the exact-size mirror of T tokens: f16 boxes (smax, smin) of every
     * sealed block, f16 K and V of every layer for the sealed tokens and the
     * tail's slots, the slot map, the tail's f32 K and V rows, cos/sin rows
     * for position 0.. and the base (rotary_dim = head_dim), and RECENT's
     * tile list, 2 * (slots / BS + 2) ids, made when the stop rule first needs it */
    const uint64_t nb = T / BS, nt = nb * BS + BS;
    const uint64_t recent = 2 * (nt / BS + 2) * 4;
    const uint64_t exact = 2 * nb * L * H * D * 2 + 2ull * L * nt * H * D * 2 + nt * 4 + 2ull * BS * H * D * 4 +
                           (nt + 1) * D * 4 + recent;
    kvmem_pool *cap = capped_pool(g_dev.ctx, exact, ids, 2, cap_ag);
    uint64_t rng = 21;
    kvmem_agent *all[3] = {ref_ag[0], cap_ag[0], cap_ag[1]};
    append_to(all, 3, 0, T, &rng);
    side c = {g_cpu.ctx, ref, ref_ag[0]}, a = {g_dev.ctx, cap, cap_ag[0]}, b = {g_dev.ctx, cap, cap_ag[1]};
    uint64_t st[3];
    /* a's mirror: twice its size does not fit, the exact size does */
    step_equal(&c, &a, 201, &ap);
    dev_stats(cap, st);
    assert_true(st[0] == exact - recent && st[1] == 0 && st[2] == 0); /* full attention reads in order */
    kvmem_attend_params stop = ap; /* the stop rule on: RECENT's tile list becomes resident */
    stop.tau_s = 0.05f;
    stop.tau_d = 0.01f;
    stop.patience = 2;
    step_equal(&c, &a, 206, &stop);
    dev_stats(cap, st);
    assert_true(st[0] == exact && st[1] == 0 && st[2] == 0);
    /* b while a is open: no room, a's mirror stays; b is served from the host */
    step_equal(&c, &b, 202, &ap);
    dev_stats(cap, st);
    assert_true(st[0] == exact && st[1] == 0 && st[2] > 0);
    const uint64_t unmirrored = st[2];
    step_equal(&c, &a, 203, &ap); /* a still resident: nothing new turned away */
    dev_stats(cap, st);
    assert_true(st[0] == exact && st[2] == unmirrored);
    /* a closed: its mirror gives way to b's */
    kvmem_agent_close(cap_ag[0]);
    step_equal(&c, &b, 204, &ap);
    dev_stats(cap, st);
    assert_true(st[0] == exact - recent && st[1] == 1 && st[2] == unmirrored);
    /* unlimited: the mirror has room to grow (twice the blocks and slots) */
    kvmem_agent *big_ag[1];
    kvmem_pool *big = capped_pool(g_dev.ctx, 0, ids, 1, big_ag);
    rng = 21;
    append_to(big_ag, 1, 0, T, &rng);
    side g = {g_dev.ctx, big, big_ag[0]};
    step_equal(&c, &g, 205, &ap);
    dev_stats(big, st);
    assert_true(st[0] > exact && st[1] == 0 && st[2] == 0);
    /* a CPU context holds no mirror, whatever the capacity */
    dev_stats(ref, st);
    assert_true(st[0] == 0 && st[1] == 0 && st[2] == 0);
    /* bad input */
    assert_int_equal(kvmem_pool_device_stats(NULL, &st[0], NULL, NULL), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvmem_pool_device_stats(cap, NULL, NULL, NULL), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvmem_last_error(), "all NULL"));
    kvmem_agent_close(big_ag[0]);
    kvmem_agent_close(cap_ag[1]);
    kvmem_agent_close(ref_ag[0]);
    kvmem_pool_free(big);
    kvmem_pool_free(cap);
    kvmem_pool_free(ref);
}

int main(int argc, char **argv) {
    if (argc > 1) g_backend = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_step_moves_query_and_result_bytes),
        cmocka_unit_test(test_stop_rule_and_truncate_match_cpu),
        cmocka_unit_test(test_exclude_base_truncate_move_o1),
        cmocka_unit_test(test_device_capacity_bounds_the_mirrors),
    };
    return tu_group_result(cmocka_run_group_tests(tests, setup, teardown), sizeof tests / sizeof tests[0]);
}
