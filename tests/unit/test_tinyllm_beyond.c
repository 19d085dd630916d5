/* tinyllm beyond the window (examples/tinyllm/beyond.h): BM25 equals the
 * formula computed here by plain loops; chunks cover the history without
 * control tokens (fixed spans aligned to blocks, sentences at . ! ?); text
 * RAG's choice respects the budget and the live context's start; the three
 * placements give the orders worked out by hand; the split rounds memory to
 * whole blocks and never overfills; with the real model, ingest equals full
 * context while the history fits, keeps the attention bookkeeping exact past
 * it (every query row's attention sums to 1), and a gather of blocks equals
 * the same tokens read and re-rotated. Model parts skip without the model. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "beyond.h"
#include "testutil.h"

#ifndef TINYLLM_TEST_MODEL
#define TINYLLM_TEST_MODEL "../shared/models/stories260K.bin"
#endif

/* ---- BM25 against the formula, written out here ---- */

enum { MAXW = 32 };
typedef struct words {
    char w[MAXW][32];
    int n;
} words;

static void split_words(const char *s, words *out) {
    out->n = 0;
    while (*s) {
        while (*s && !isalnum((unsigned char)*s)) s++;
        int k = 0;
        while (*s && isalnum((unsigned char)*s)) out->w[out->n][k++] = (char)tolower((unsigned char)*s++);
        if (k) out->w[out->n++][k] = '\0';
    }
}

static int count(const words *d, const char *w) {
    int c = 0;
    for (int i = 0; i < d->n; i++) c += !strcmp(d->w[i], w);
    return c;
}

static void test_bm25_equals_the_formula(void **state) {
    (void)state;
    const char *docs[] = {"The cat sat on the mat.", "A dog and a cat, and a dog!", "Mia had a red kite. Mia's kite",
                          "", "RED red Red: the kite of Mia"};
    const char *queries[] = {"red kite", "the cat", "Who had the red kite? It was", "zebra", "mia MIA mia"};
    int n = 5;
    size_t lens[5];
    for (int i = 0; i < n; i++) lens[i] = strlen(docs[i]);
    tl_bm25 *b;
    assert_int_equal(tl_bm25_create(docs, lens, n, &b), 0);
    words d[5];
    double avg = 0;
    for (int i = 0; i < n; i++) {
        split_words(docs[i], &d[i]);
        avg += d[i].n;
    }
    avg /= n;
    for (int qi = 0; qi < 5; qi++) {
        float got[5];
        tl_bm25_score(b, queries[qi], strlen(queries[qi]), got);
        words q;
        split_words(queries[qi], &q);
        for (int i = 0; i < n; i++) {
            double want = 0;
            for (int t = 0; t < q.n; t++) {
                int dup = 0;
                for (int u = 0; u < t; u++) dup |= !strcmp(q.w[u], q.w[t]);
                if (dup) continue;
                int df = 0;
                for (int j = 0; j < n; j++) df += count(&d[j], q.w[t]) > 0;
                int f = count(&d[i], q.w[t]);
                if (!f) continue;
                double idf = log(1 + (n - df + 0.5) / (df + 0.5));
                want += idf * f * 2.2 / (f + 1.2 * (0.25 + 0.75 * d[i].n / avg));
            }
            if (fabs(got[i] - want) > 1e-5 * (1 + want))
                fail_msg("query '%s', doc %d: %g, the formula %g", queries[qi], i, got[i], want);
        }
    }
    /* a word only in doc 2 and 4 ranks them first, the longer doc lower */
    float s[5];
    tl_bm25_score(b, "kite", 4, s);
    assert_true(s[2] > 0 && s[4] > 0 && s[0] == 0 && s[3] == 0);
    tl_bm25_free(b);
    tl_bm25_free(NULL);
}

/* ---- placement and the split, by hand ---- */

static void test_placement_orders_worked_by_hand(void **state) {
    (void)state;
    const int32_t ids[5] = {9, 3, 12, 7, 8};
    const float sc[5] = {0.2f, 0.5f, 0.3f, 0.1f, 0.9f};
    int32_t out[5];
    assert_int_equal(tl_place(ids, sc, 5, TL_ORDER_CHRONO, out), 0);
    const int32_t chrono[5] = {3, 7, 8, 9, 12};
    assert_memory_equal(out, chrono, sizeof out);
    assert_int_equal(tl_place(ids, NULL, 5, TL_ORDER_CHRONO, out), 0); /* no scores needed */
    assert_memory_equal(out, chrono, sizeof out);
    /* best nearest the cue: 7 (0.1), 9 (0.2), 12 (0.3), 3 (0.5), 8 (0.9) */
    assert_int_equal(tl_place(ids, sc, 5, TL_ORDER_SCORE, out), 0);
    const int32_t by_score[5] = {7, 9, 12, 3, 8};
    assert_memory_equal(out, by_score, sizeof out);
    /* runs {3} 0.5, {7,8,9} 0.9, {12} 0.3: 12, 3, then 7 8 9 in order */
    assert_int_equal(tl_place(ids, sc, 5, TL_ORDER_RUNS, out), 0);
    const int32_t runs[5] = {12, 3, 7, 8, 9};
    assert_memory_equal(out, runs, sizeof out);
    /* ties: the older farther from the cue */
    const int32_t tid[3] = {5, 1, 3};
    const float tsc[3] = {1, 1, 1};
    assert_int_equal(tl_place(tid, tsc, 3, TL_ORDER_SCORE, out), 0);
    assert_true(out[0] == 1 && out[1] == 3 && out[2] == 5);
    assert_int_equal(tl_place(tid, tsc, 3, TL_ORDER_RUNS, out), 0);
    assert_true(out[0] == 1 && out[1] == 3 && out[2] == 5);
    /* bad input */
    assert_int_equal(tl_place(ids, NULL, 5, TL_ORDER_SCORE, out), -1);
    assert_int_equal(tl_place(ids, sc, 5, (tl_order)9, out), -1);
    assert_int_equal(tl_place(ids, sc, -1, TL_ORDER_CHRONO, out), -1);
    assert_int_equal(tl_place(NULL, NULL, 0, TL_ORDER_SCORE, NULL), 0);
    assert_string_equal(tl_order_name(TL_ORDER_RUNS), "runs");
}

static void test_split_rounds_to_blocks_and_never_overfills(void **state) {
    (void)state;
    tl_split s = tl_window_split(256, 16, 0.25, 0, 16);
    assert_int_equal(s.memory, 64);
    assert_int_equal(s.live, 176);
    s = tl_window_split(256, 16, 0.25, 0.25, 16);
    assert_int_equal(s.memory, 64);
    assert_int_equal(s.live, 64);
    s = tl_window_split(256, 16, 0.75, 0, 16);
    assert_int_equal(s.memory, 192);
    assert_int_equal(s.live, 48);
    s = tl_window_split(256, 100, 0.75, 0.5, 16); /* memory takes what is left, in whole blocks */
    assert_int_equal(s.memory, 144);
    assert_int_equal(s.live, 12);
    s = tl_window_split(100, 10, 0.3, 0, 16); /* 30 tokens: one block */
    assert_int_equal(s.memory, 16);
    assert_int_equal(s.live, 74);
    s = tl_window_split(64, 80, 0.5, 0, 16);
    assert_int_equal(s.memory, 0);
    assert_int_equal(s.live, 0);
}

/* ---- with the model: chunks, ingest, gather ---- */

typedef struct fixture {
    tl_model m;
    tl_tokenizer *tok;
    kvmem_context *ctx;
} fixture;

static int setup(void **state) {
    const char *path = tl_find_model(TINYLLM_TEST_MODEL);
    *state = NULL;
    if (!path) return 0;
    fixture *f = calloc(1, sizeof *f);
    char err[TL_ERR_SIZE], tp[4096];
    if (tl_model_load(path, &f->m, err, sizeof err)) return -1;
    const char *tpath = tl_find_tokenizer(path, tp, sizeof tp);
    if (tpath && tl_tokenizer_load(tpath, f->m.cfg.vocab_size, &f->tok, err, sizeof err)) return -1;
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cpu";
    cp.n_threads = 1;
    if (kvmem_context_create(&cp, &f->ctx) != KVMEM_OK) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    kvmem_context_free(f->ctx);
    tl_tokenizer_free(f->tok);
    tl_model_free(&f->m);
    free(f);
    return 0;
}

#define NEED_MODEL(f)                                                                       \
    do {                                                                                    \
        if (!(f)) {                                                                         \
            printf("skipped: model not found at %s (set KVMEM_TEST_MODEL)\n", TINYLLM_TEST_MODEL); \
            skip();                                                                         \
        }                                                                                   \
    } while (0)

static void test_chunks_cover_the_text_without_control_tokens(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    if (!f->tok) {
        printf("skipped: no tokenizer beside the model\n");
        skip();
    }
    const char *text = "Once upon a time, Sue had a kite. She ran! Did it fly? \"Yes.\" Mom said it was good";
    int32_t ids[256], n;
    char err[TL_ERR_SIZE];
    assert_int_equal(tl_encode(f->tok, text, strlen(text), 1, ids, 256, &n, err, sizeof err), 0);
    tl_textmem *t;
    assert_int_equal(tl_textmem_create(f->tok, ids, n, TL_CHUNK_SENTENCES, 0, &t, err, sizeof err), 0);
    const char *want[] = {"Once upon a time, Sue had a kite.", " She ran!", " Did it fly?", " \"Yes.\"",
                          " Mom said it was good"};
    assert_int_equal(tl_textmem_count(t), 5);
    int32_t covered = 0;
    for (int32_t c = 0; c < 5; c++) {
        tl_chunk k = tl_textmem_chunk(t, c);
        char *s = tl_decode(f->tok, ids + k.first, k.n);
        /* the first chunk follows BOS, which drops the dummy prefix's space */
        char *got = s;
        if (c == 0 && got[0] == ' ') got++;
        if (strcmp(got, want[c])) fail_msg("sentence %d: '%s', want '%s'", c, got, want[c]);
        free(s);
        for (int32_t i = k.first; i < k.first + k.n; i++) assert_int_equal(tl_textmem_find(t, i), c);
        covered += k.n;
    }
    assert_int_equal(covered, n - 1); /* all but BOS */
    assert_int_equal(tl_textmem_find(t, 0), -1);
    /* BM25 finds the kite sentence */
    float sc[5];
    tl_textmem_score(t, "the kite", 8, sc);
    assert_true(sc[0] > 0 && sc[1] == 0 && sc[4] == 0);
    tl_textmem_free(t);
    /* fixed spans: aligned to token 0 (block i's tokens), BOS left out */
    assert_int_equal(tl_textmem_create(f->tok, ids, n, TL_CHUNK_TOKENS, 16, &t, err, sizeof err), 0);
    assert_int_equal(tl_textmem_count(t), (n + 15) / 16);
    tl_chunk k0 = tl_textmem_chunk(t, 0), k1 = tl_textmem_chunk(t, 1);
    assert_int_equal(k0.first, 1);
    assert_int_equal(k0.n, 15);
    assert_int_equal(k1.first, 16);
    assert_int_equal(k1.n, n >= 32 ? 16 : n - 16);
    /* the choice: budget, live start, chronological output, zero scores left out */
    int32_t nc = tl_textmem_count(t);
    float s2[64];
    for (int32_t c = 0; c < nc; c++) s2[c] = (float)(c + 1);
    s2[0] = 0; /* no match: never chosen */
    int32_t out[64], used;
    int32_t got = tl_textmem_choose(t, s2, 32, n, out, 64, &used);
    assert_int_equal(got, 2); /* the two best, the last possibly short */
    assert_true(out[0] < out[1] && out[1] == nc - 1);
    assert_true(used <= 32);
    got = tl_textmem_choose(t, s2, 1000, 32, out, 64, &used); /* only chunks ending by token 32 */
    assert_int_equal(got, 1);
    assert_int_equal(out[0], 1);
    assert_int_equal(used, 16);
    assert_int_equal(tl_textmem_choose(t, s2, 15, n, out, 64, &used), (n - 16 * (nc - 1)) <= 15 ? 1 : 0);
    tl_textmem_free(t);
    assert_int_equal(tl_textmem_create(f->tok, ids, n, TL_CHUNK_TOKENS, 0, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "bad arguments"));
}

/* A sampled sequence ingested into a history (chunks of W/2, sink 4). */
static int32_t *sample(const tl_model *m, uint64_t seed, int32_t n) {
    int32_t *t = malloc(sizeof(int32_t) * (size_t)n), W = m->cfg.seq_len;
    /* the model samples at most its window: past it, repeat samples joined (BOS only first) */
    for (int32_t at = 0; at < n; at += W) {
        int32_t k = n - at < W ? n - at : W;
        assert_int_equal(tl_sample_sequence(m, seed + (uint64_t)at, 1.0f, k, t + at), 0);
        if (at) t[at] = 300;
    }
    return t;
}

static void test_ingest_is_full_context_while_it_fits(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    const tl_config *c = &f->m.cfg;
    int32_t W = c->seq_len, n = W - 8, V = c->vocab_size;
    int32_t *tok = sample(&f->m, 11, n + 1);
    char err[TL_ERR_SIZE];
    tl_history h;
    assert_int_equal(tl_history_init(&h, f->ctx, &f->m, n, KVMEM_F32, 16, "ingest", err, sizeof err), 0);
    tl_state *s = tl_state_create(c, W / 2);
    /* in three calls of uneven size: the chunking must not matter */
    assert_int_equal(tl_history_ingest(&h, &f->m, s, tok, 37, 4, 37, err, sizeof err), 0);
    assert_int_equal(tl_history_ingest(&h, &f->m, s, tok + 37, n - 37 - 5, 4, 0, err, sizeof err), 0);
    assert_int_equal(tl_history_ingest(&h, &f->m, s, tok + n - 5, 5, 4, 0, err, sizeof err), 0);
    assert_int_equal(h.n, n);
    /* the next token over the history's KV equals one pass over everything */
    tl_kv kv;
    assert_int_equal(tl_kv_init(&kv, c, n + 1), 0);
    assert_int_equal(tl_window_put_tokens(&h, 0, n, 0, &kv, err, sizeof err), 0);
    float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)(n + 1) * (size_t)V);
    assert_int_equal(tl_forward(&f->m, s, &kv, tok + n, 1, &n, a, NULL, NULL, NULL), 0);
    tl_state *s2 = tl_state_create(c, n + 1);
    tl_kv kv2;
    assert_int_equal(tl_kv_init(&kv2, c, n + 1), 0);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(n + 1));
    for (int32_t i = 0; i <= n; i++) pos[i] = i;
    assert_int_equal(tl_forward(&f->m, s2, &kv2, tok, n + 1, pos, b, NULL, NULL, NULL), 0);
    for (int32_t i = 0; i < V; i++) assert_true(fabsf(a[i] - b[(size_t)n * (size_t)V + (size_t)i]) < 1e-3f);
    /* blocks aligned to 16 tokens across the calls (no early flush), the tail unsealed */
    kvmem_agent_info ai;
    assert_int_equal(kvmem_agent_get_info(h.agent, &ai), KVMEM_OK);
    assert_int_equal(ai.n_sealed, n / 16);
    assert_int_equal(tl_history_block_of(&h, 37), 2);
    assert_int_equal(tl_history_blocks_before(&h, 37), 2);
    assert_int_equal(tl_history_blocks_before(&h, 48), 3);
    /* a gather of blocks equals the same tokens read and re-rotated, at any base */
    int32_t blocks[3] = {5, 1, 2};
    kv.n = 0;
    assert_int_equal(tl_window_put_blocks(&h, blocks, 3, 7, &kv, err, sizeof err), 0);
    tl_kv ref;
    assert_int_equal(tl_kv_init(&ref, c, 48), 0);
    assert_int_equal(tl_window_put_tokens(&h, 80, 16, 7, &ref, err, sizeof err), 0);
    assert_int_equal(tl_window_put_tokens(&h, 16, 32, 23, &ref, err, sizeof err), 0);
    assert_int_equal(kv.n, 48);
    for (int32_t i = 0; i < 48; i++) assert_int_equal(kv.pos[i], 7 + i);
    size_t kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    for (int32_t l = 0; l < c->n_layers; l++)
        for (size_t i = 0; i < 48 * kvd; i++) {
            assert_true(fabsf(kv.k[(size_t)l * (size_t)kv.cap * kvd + i] - ref.k[(size_t)l * 48 * kvd + i]) < 1e-4f);
            assert_true(kv.v[(size_t)l * (size_t)kv.cap * kvd + i] == ref.v[(size_t)l * 48 * kvd + i]);
        }
    /* bad input: a range past the history, an unsealed block */
    assert_int_equal(tl_window_put_tokens(&h, n - 4, 8, 0, &ref, err, sizeof err), -1);
    int32_t tail = n / 16;
    assert_int_equal(tl_window_put_blocks(&h, &tail, 1, 0, &ref, err, sizeof err), -1);
    assert_non_null(strstr(err, "not a sealed block"));
    tl_kv_free(&ref);
    tl_kv_free(&kv);
    tl_kv_free(&kv2);
    tl_history_free(&h);
    tl_state_free(s);
    tl_state_free(s2);
    free(a);
    free(b);
    free(pos);
    free(tok);
}

static void test_ingest_past_the_window_keeps_exact_bookkeeping(void **state) {
    fixture *f = *state;
    NEED_MODEL(f);
    const tl_config *c = &f->m.cfg;
    int32_t W = c->seq_len, n = 2 * W + 40, sink = 4;
    int32_t *tok = sample(&f->m, 5, n);
    char err[TL_ERR_SIZE];
    tl_history h;
    assert_int_equal(tl_history_init(&h, f->ctx, &f->m, n, KVMEM_F32, 16, "past", err, sizeof err), 0);
    tl_state *s = tl_state_create(c, W / 2);
    /* the model alone would refuse this history; ingest never needs to be told */
    assert_int_equal(tl_history_ingest(&h, &f->m, s, tok, n - 20, sink, 0, err, sizeof err), 0);
    /* the last chunk again by hand: the sink and the newest tokens, then the chunk */
    int32_t N = (int32_t)h.n, T = 20, recent = W - T - sink;
    tl_kv kv;
    assert_int_equal(tl_kv_init(&kv, c, W), 0);
    assert_int_equal(tl_window_put_tokens(&h, 0, sink, 0, &kv, err, sizeof err), 0);
    assert_int_equal(tl_window_put_tokens(&h, N - recent, recent, sink, &kv, err, sizeof err), 0);
    size_t kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim, L = (size_t)c->n_layers;
    float *kr = malloc(sizeof(float) * L * (size_t)T * kvd), *vr = malloc(sizeof(float) * L * (size_t)T * kvd);
    int32_t pos[20];
    for (int32_t i = 0; i < T; i++) pos[i] = sink + recent + i;
    tl_trace tr = {0};
    tr.k_rot = kr;
    tr.v_out = vr;
    assert_int_equal(tl_forward(&f->m, s, &kv, tok + N, T, pos, NULL, &tr, NULL, NULL), 0);
    assert_int_equal(tl_history_ingest(&h, &f->m, s, tok + N, T, sink, 0, err, sizeof err), 0);
    assert_int_equal(h.n, n);
    /* what the history holds for those tokens, re-rotated at the chunk's positions */
    tl_kv got;
    assert_int_equal(tl_kv_init(&got, c, T), 0);
    assert_int_equal(tl_window_put_tokens(&h, N, T, sink + recent, &got, err, sizeof err), 0);
    for (size_t l = 0; l < L; l++)
        for (size_t i = 0; i < (size_t)T * kvd; i++) {
            assert_true(fabsf(got.k[l * (size_t)T * kvd + i] - kr[l * (size_t)T * kvd + i]) < 1e-4f);
            assert_true(fabsf(got.v[l * (size_t)T * kvd + i] - vr[l * (size_t)T * kvd + i]) < 1e-6f);
        }
    /* H2O's accumulator: each query row spreads 1 per head and layer */
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += h.acc[i];
    double want = (double)n * (double)c->n_heads * (double)c->n_layers;
    if (fabs(sum - want) > 1e-3 * want) fail_msg("attention received sums to %g, want %g", sum, want);
    /* the token ids are the history's */
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    assert_int_equal(kvmem_agent_tokens(h.agent, 0, n, ids), KVMEM_OK);
    assert_memory_equal(ids, tok, sizeof(int32_t) * (size_t)n);
    /* bad input: more than the history holds */
    assert_int_equal(tl_history_ingest(&h, &f->m, s, tok, 1, sink, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "exceed"));
    free(ids);
    free(kr);
    free(vr);
    tl_kv_free(&kv);
    tl_kv_free(&got);
    tl_history_free(&h);
    tl_state_free(s);
    free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bm25_equals_the_formula),
        cmocka_unit_test(test_placement_orders_worked_by_hand),
        cmocka_unit_test(test_split_rounds_to_blocks_and_never_overfills),
        cmocka_unit_test_setup_teardown(test_chunks_cover_the_text_without_control_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ingest_is_full_context_while_it_fits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ingest_past_the_window_keeps_exact_bookkeeping, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
