/* tinyllm on kvmem, with the real model: the history kept in a kvmem agent
 * (keys appended post-RoPE, de-rotated by kvmem, re-rotated on the way out)
 * gives the engine's own full-context logits; at a budget that holds the
 * whole history every method equals full context (ART with tau 0 too);
 * below it, every method keeps at most the budget and the rows it keeps are
 * the history's own rows at their positions; a save, a fully new context and
 * pool, and a load give the same logits. Skips without the model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "tinyllm.h"

#ifndef TINYLLM_TEST_MODEL
#define TINYLLM_TEST_MODEL "../shared/models/stories260K.bin"
#endif

enum { TURN = 32, TURNS = 3, PROMPT = 8, NSEQ = TURN * TURNS };

typedef struct fixture {
    tl_model m;
    int32_t tok[NSEQ], pos[NSEQ];
    float *logits;     /* [NSEQ][V] full context, the engine alone */
    float *k, *v;      /* [L][NSEQ][kvd] post-RoPE */
    float *q_rot;      /* [NSEQ][L][dim] */
    float *acc;        /* [NSEQ] H2O accumulator after turn 1 */
    kvmem_context *ctx;
} fixture;

static int setup(void **state) {
    const char *path = tl_find_model(TINYLLM_TEST_MODEL);
    if (!path) {
        *state = NULL;
        return 0;
    }
    fixture *f = calloc(1, sizeof *f);
    char err[TL_ERR_SIZE];
    if (tl_model_load(path, &f->m, err, sizeof err)) return -1;
    const tl_config *c = &f->m.cfg;
    size_t kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim, L = (size_t)c->n_layers;
    f->logits = malloc(sizeof(float) * NSEQ * (size_t)c->vocab_size);
    f->k = malloc(sizeof(float) * L * NSEQ * kvd);
    f->v = malloc(sizeof(float) * L * NSEQ * kvd);
    f->q_rot = malloc(sizeof(float) * NSEQ * L * (size_t)c->dim);
    f->acc = calloc(NSEQ, sizeof(float));
    if (tl_sample_sequence(&f->m, 7, 1.0f, NSEQ, f->tok)) return -1;
    for (int i = 0; i < NSEQ; i++) f->pos[i] = i;
    /* full context in one pass, keeping every post-RoPE K/V row */
    tl_state *s = tl_state_create(c, NSEQ);
    tl_kv kv;
    tl_kv_init(&kv, c, NSEQ);
    tl_trace tr = {0};
    tr.q_rot = f->q_rot;
    tr.k_rot = f->k;
    tr.v_out = f->v;
    if (tl_forward(&f->m, s, &kv, f->tok, 2 * TURN, f->pos, f->logits, &tr, NULL, NULL)) return -1;
    /* the H2O accumulator over the history (turns 0 and 1), from its own pass */
    tl_kv kv2;
    tl_kv_init(&kv2, c, NSEQ);
    tl_trace tr2 = {0};
    tr2.attn_acc = f->acc;
    if (tl_forward(&f->m, s, &kv2, f->tok, 2 * TURN, f->pos, NULL, &tr2, NULL, NULL)) return -1;
    /* turn 2 continues the first pass (its K/V rows are not needed) */
    if (tl_forward(&f->m, s, &kv, f->tok + 2 * TURN, TURN, f->pos + 2 * TURN,
                   f->logits + (size_t)2 * TURN * (size_t)c->vocab_size, NULL, NULL, NULL))
        return -1;
    tl_kv_free(&kv);
    tl_kv_free(&kv2);
    tl_state_free(s);
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cpu";
    cp.n_threads = 2;
    if (kvmem_context_create(&cp, &f->ctx) != KVMEM_OK) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    tl_model_free(&f->m);
    free(f->logits);
    free(f->k);
    free(f->v);
    free(f->q_rot);
    free(f->acc);
    kvmem_context_free(f->ctx);
    free(f);
    return 0;
}

#define NEED_MODEL(f)                                                                          \
    do {                                                                                       \
        if (!(f)) {                                                                            \
            printf("skipped: model not found at %s (set KVMEM_TEST_MODEL)\n", TINYLLM_TEST_MODEL); \
            skip();                                                                            \
        }                                                                                      \
    } while (0)

/* The history = turns 0 and 1 (64 tokens), appended turn by turn. */
static void history_make(fixture *f, tl_history *h, kvmem_context *ctx, kvmem_dtype dt) {
    const tl_config *c = &f->m.cfg;
    char err[TL_ERR_SIZE];
    size_t kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim, L = (size_t)c->n_layers;
    if (tl_history_init(h, ctx, &f->m, NSEQ, dt, 16, "test-agent", err, sizeof err)) fail_msg("%s", err);
    float *k = malloc(sizeof(float) * L * TURN * kvd), *v = malloc(sizeof(float) * L * TURN * kvd);
    for (int t = 0; t < 2; t++) {
        for (size_t l = 0; l < L; l++) {
            memcpy(k + l * TURN * kvd, f->k + (l * 2 * TURN + (size_t)t * TURN) * kvd, TURN * kvd * sizeof(float));
            memcpy(v + l * TURN * kvd, f->v + (l * 2 * TURN + (size_t)t * TURN) * kvd, TURN * kvd * sizeof(float));
        }
        if (tl_history_append(h, k, v, TURN, f->pos + t * TURN, f->tok + t * TURN,
                              f->q_rot + (size_t)t * TURN * L * (size_t)c->dim, t == 1 ? f->acc : NULL,
                              PROMPT, err, sizeof err))
            fail_msg("%s", err);
    }
    free(k);
    free(v);
}

/* Run turn 2 (prompt prefilled, the rest decoded) on the memory `me` builds. */
static void run_turn(fixture *f, tl_history *h, const tl_method *me, int64_t budget, float tau0,
                     float *logits, int32_t *mem_rows, tl_kv *mem_out) {
    const tl_config *c = &f->m.cfg;
    char err[TL_ERR_SIZE];
    int32_t N = 2 * TURN, V = c->vocab_size;
    tl_state *s = tl_state_create(c, TURN);
    tl_kv kv;
    assert_int_equal(tl_kv_init(&kv, c, NSEQ + 32), 0);
    float *probe = malloc(sizeof(float) * PROMPT * (size_t)c->n_layers * (size_t)c->dim);
    if (me->needs_probe) {
        assert_int_equal(tl_memory_recent(h, 32, &kv, err, sizeof err), 0);
        tl_trace tr = {0};
        tr.q_raw = probe;
        assert_int_equal(tl_forward(&f->m, s, &kv, f->tok + N, PROMPT, f->pos + N, NULL, &tr, NULL, NULL), 0);
    }
    if (tl_memory_build(h, me, budget, probe, PROMPT, N, &kv, err, sizeof err)) fail_msg("%s: %s", me->name, err);
    *mem_rows = kv.n;
    if (mem_out) {
        assert_int_equal(tl_kv_init(mem_out, c, kv.n > 0 ? kv.n : 1), 0);
        for (int32_t l = 0; l < c->n_layers; l++) {
            memcpy(mem_out->k + (size_t)l * mem_out->cap * (size_t)kv.kv_dim,
                   kv.k + (size_t)l * kv.cap * (size_t)kv.kv_dim, (size_t)kv.n * (size_t)kv.kv_dim * sizeof(float));
            memcpy(mem_out->v + (size_t)l * mem_out->cap * (size_t)kv.kv_dim,
                   kv.v + (size_t)l * kv.cap * (size_t)kv.kv_dim, (size_t)kv.n * (size_t)kv.kv_dim * sizeof(float));
        }
        memcpy(mem_out->pos, kv.pos, (size_t)kv.n * sizeof(int32_t));
        mem_out->n = kv.n;
    }
    assert_int_equal(tl_forward(&f->m, s, &kv, f->tok + N, PROMPT, f->pos + N, logits, NULL, NULL, NULL), 0);
    tl_art art, *artp = NULL;
#ifdef TINYLLM_HAVE_ATTEND
    if (me->art) {
        memset(&art, 0, sizeof art);
        art.ctx = f->ctx;
        art.params = kvmem_attend_default_params();
        art.params.tile_size = me->art_tile;
        if (me->art_order) art.params.order = (kvmem_attend_order)(me->art_order - 1);
        if (me->art_patience) art.params.patience = me->art_patience;
        if (me->art_tau_scale > 0) {
            art.params.tau_s *= me->art_tau_scale;
            art.params.tau_d *= me->art_tau_scale;
        }
        if (tau0 == 0.0f) art.params.tau_s = art.params.tau_d = 0.0f;
        artp = &art;
    }
#else
    (void)art;
    (void)tau0;
#endif
    for (int32_t i = PROMPT; i < TURN; i++)
        assert_int_equal(tl_forward(&f->m, s, &kv, f->tok + N + i, 1, f->pos + N + i,
                                    logits + (size_t)i * (size_t)V, NULL, artp, NULL), 0);
    free(probe);
    tl_kv_free(&kv);
    tl_state_free(s);
}

static double max_diff(const float *a, const float *b, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > w) w = d;
    }
    return w;
}

static void test_every_method_equals_full_context_when_the_budget_holds_the_history(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    tl_history h;
    history_make(f, &h, f->ctx, KVMEM_F32);
    assert_int_equal(h.n, 2 * TURN);
    tl_method ms[32];
    char missing[256];
    int32_t n = tl_method_list(ms, 32, missing, sizeof missing);
    assert_true(n >= 2);
    if (missing[0]) printf("note: not in this build: %s\n", missing);
    size_t V = (size_t)f->m.cfg.vocab_size;
    const float *want = f->logits + (size_t)2 * TURN * V;
    float *got = malloc(sizeof(float) * TURN * V);
    for (int32_t i = 0; i < n; i++) {
        for (int b = 0; b < 2; b++) {
            int64_t budget = b == 0 ? 0 : 2 * TURN; /* 0 = all, or exactly the history */
            int32_t rows;
            run_turn(f, &h, &ms[i], budget, 0.0f, got, &rows, NULL);
            assert_int_equal(rows, 2 * TURN);
            double d = max_diff(got, want, TURN * V);
            if (d > 2e-4) fail_msg("%s at budget %lld: logits differ from full context by %g", ms[i].name,
                                   (long long)budget, d);
        }
    }
    free(got);
    tl_history_free(&h);
}

static void test_methods_keep_at_most_the_budget_and_rows_of_the_history(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    tl_history h;
    history_make(f, &h, f->ctx, KVMEM_F32);
    tl_method ms[32];
    int32_t n = tl_method_list(ms, 32, NULL, 0);
    size_t V = (size_t)f->m.cfg.vocab_size, kvd = (size_t)h.kv_dim;
    float *got = malloc(sizeof(float) * TURN * V);
    for (int32_t i = 0; i < n; i++) {
        if (ms[i].kind == TL_M_FULL) continue;
        int32_t rows;
        tl_kv mem;
        run_turn(f, &h, &ms[i], 32, 1.0f, got, &rows, &mem);
        if (rows > 32 || rows < 16) fail_msg("%s kept %d rows at budget 32", ms[i].name, rows);
        double kl = 0;
        for (int t = 0; t < TURN; t++)
            kl += tl_kl_logits(f->logits + (size_t)(2 * TURN + t) * V, got + (size_t)t * V, (int32_t)V);
        assert_true(isfinite(kl) && kl >= 0);
        if (ms[i].kind != TL_M_MEMART || ms[i].orig_pos) {
            /* eviction (and retrieval without re-encoding) keeps rows in place: each is
             * the history's row at its own position */
            for (int32_t r = 0; r < rows; r++) {
                int32_t p = mem.pos[r];
                assert_true(p >= 0 && p < 2 * TURN && (r == 0 || p > mem.pos[r - 1]));
                for (int32_t l = 0; l < h.n_layers; l++) {
                    const float *a = mem.k + ((size_t)l * (size_t)mem.cap + (size_t)r) * kvd;
                    const float *b = f->k + ((size_t)l * 2 * TURN + (size_t)p) * kvd;
                    assert_true(max_diff(a, b, kvd) < 1e-4);
                }
            }
            if (ms[i].kind == TL_M_RECENT) assert_int_equal(mem.pos[0], 2 * TURN - 32);
            if (ms[i].kind == TL_M_STREAMING) assert_int_equal(mem.pos[3], 3);
        } else {
            /* retrieval re-encodes whole blocks at contiguous positions ending at the turn */
            assert_int_equal(rows % 16, 0);
            assert_int_equal(mem.pos[rows - 1], 2 * TURN - 1);
            for (int32_t r = 1; r < rows; r++) assert_int_equal(mem.pos[r], mem.pos[r - 1] + 1);
            /* MemArt as deployed: the newest blocks (the live context) are the
             * history's own rows at their own positions, and a retrieved block
             * fills the rest of the budget */
            int64_t local = 0;
            int32_t nl = tl_memart_local_blocks(&h, &ms[i], 32, &local);
            if (ms[i].local_frac > 0) {
                assert_int_equal(nl, 1);
                assert_int_equal(local, 16);
                assert_int_equal(rows, 32);
            } else {
                assert_int_equal(nl, 0);
            }
            for (int32_t r = rows - (int32_t)local; r < rows; r++)
                for (int32_t l = 0; l < h.n_layers; l++) {
                    const float *a = mem.k + ((size_t)l * (size_t)mem.cap + (size_t)r) * kvd;
                    const float *b = f->k + ((size_t)l * 2 * TURN + (size_t)mem.pos[r]) * kvd;
                    assert_true(max_diff(a, b, kvd) < 1e-4);
                }
        }
        tl_kv_free(&mem);
    }
    free(got);
    tl_history_free(&h);
}

static void test_persist_restart_reload_gives_the_same_logits(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
#ifndef TINYLLM_HAVE_PERSIST
    printf("skipped: persistence (kvmem_agent_save/load) is not in this build\n");
    skip();
#else
    kvmem_dtype dts[] = {KVMEM_F16, KVMEM_Q4};
    size_t V = (size_t)f->m.cfg.vocab_size;
    tl_method ms[32];
    assert_true(tl_method_list(ms, 32, NULL, 0) >= 1);
    assert_int_equal(ms[0].kind, TL_M_FULL);
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        char err[TL_ERR_SIZE], path[] = "/tmp/tinyllm_agent_XXXXXX";
        int fd = mkstemp(path);
        assert_true(fd >= 0);
        close(fd);
        tl_history h;
        history_make(f, &h, f->ctx, dts[d]);
        float *before = malloc(sizeof(float) * TURN * V), *after = malloc(sizeof(float) * TURN * V);
        int32_t rows;
        run_turn(f, &h, &ms[0], 0, 0.0f, before, &rows, NULL);
        if (tl_history_save(&h, path, err, sizeof err)) fail_msg("%s", err);
        tl_history_free(&h);
        /* a fully new context and pool, as after a process restart */
        kvmem_context *ctx2;
        assert_ok(kvmem_context_create(NULL, &ctx2));
        tl_history h2;
        if (tl_history_init(&h2, ctx2, &f->m, NSEQ, dts[d], 16, "test-agent", err, sizeof err)) fail_msg("%s", err);
        if (tl_history_load(&h2, path, err, sizeof err)) fail_msg("%s", err);
        assert_int_equal(h2.n, 2 * TURN);
        int32_t toks[2 * TURN];
        assert_ok(kvmem_agent_tokens(h2.agent, 0, 2 * TURN, toks));
        assert_memory_equal(toks, f->tok, sizeof toks);
        run_turn(f, &h2, &ms[0], 0, 0.0f, after, &rows, NULL);
        assert_memory_equal(before, after, sizeof(float) * TURN * V);
        /* quantized storage changes the logits a little, not the argmax mostly */
        if (dts[d] == KVMEM_F16) assert_true(max_diff(before, f->logits + (size_t)2 * TURN * V, TURN * V) < 0.05);
        /* a file that is not an agent is refused and the agent keeps its memory */
        FILE *fp = fopen(path, "wb");
        fputs("not a safetensors file", fp);
        fclose(fp);
        assert_int_equal(tl_history_load(&h2, path, err, sizeof err), -1);
        assert_int_equal(h2.n, 2 * TURN);
        tl_history_free(&h2);
        kvmem_context_free(ctx2);
        remove(path);
        free(before);
        free(after);
    }
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_method_equals_full_context_when_the_budget_holds_the_history),
        cmocka_unit_test(test_methods_keep_at_most_the_budget_and_rows_of_the_history),
        cmocka_unit_test(test_persist_restart_reload_gives_the_same_logits),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
