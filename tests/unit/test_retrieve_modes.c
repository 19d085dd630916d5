/* kvmem_retrieve against a double-precision plain-loop reference: every
 * mode, normalisation, aggregation and scope; filters; GQA; edge cases. */
#include "testutil.h"
#include "retrieve_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fixture {
    kvmem_context *ctx;
    kvmem_pool *pool;
    kvmem_agent *ag;
    kvmem_model_spec spec;
} fixture;

/* An agent with `turns` chunks of random KV (lengths given), flushed after
 * the chunks listed in flush_after (partial blocks). */
static void make(fixture *f, int L, int NQ, int NKV, int D, int bs, kvmem_dtype dt, const int *lens, int turns,
                 int flush_each, uint64_t seed) {
    f->ctx = tu_context(2);
    f->spec = tu_spec(L, D);
    f->spec.n_q_heads = NQ;
    f->spec.n_kv_heads = NKV;
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = bs;
    pp.storage_dtype = dt;
    assert_ok(kvmem_pool_create(f->ctx, &f->spec, &pp, &f->pool));
    assert_ok(kvmem_agent_open(f->pool, "a", &f->ag));
    uint64_t rng = seed;
    for (int t = 0; t < turns; t++) {
        size_t n = (size_t)L * (size_t)lens[t] * (size_t)NKV * (size_t)D;
        float *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
        /* per-turn offset so blocks differ in more than noise */
        float off = tu_uniform(&rng, -1.0f, 1.0f);
        for (size_t i = 0; i < n; i++) k[i] = tu_normal(&rng) + off * (float)((i % 7) == 0), v[i] = tu_normal(&rng);
        int64_t sh[4] = {L, lens[t], NKV, D};
        kvmem_tensor kt, vt;
        assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh));
        assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 4, sh));
        assert_ok(kvmem_agent_append(f->ag, &kt, &vt, NULL));
        if (flush_each) assert_ok(kvmem_agent_flush(f->ag));
        free(k);
        free(v);
    }
}

static void unmake(fixture *f) {
    kvmem_agent_close(f->ag);
    kvmem_pool_free(f->pool);
    kvmem_context_free(f->ctx);
}

static float *rand_query(const kvmem_model_spec *s, int n_q, uint64_t *rng) {
    size_t n = (size_t)n_q * (size_t)s->n_layers * (size_t)s->n_q_heads * (size_t)s->head_dim;
    float *q = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) q[i] = tu_normal(rng);
    return q;
}

static kvmem_tensor qview(const kvmem_model_spec *s, float *q, int n_q) {
    kvmem_tensor t;
    int64_t sh[4] = {n_q, s->n_layers, s->n_q_heads, s->head_dim};
    assert_ok(kvmem_tensor_init(&t, q, KVMEM_F32, 4, sh));
    return t;
}

/* Compare one retrieval with the reference: every block's score, and the
 * selection where the reference's k-th and (k+1)-th scores are not a near tie. */
static void check_against_ref(fixture *f, const float *q, int n_q, const kvmem_retrieve_params *p,
                              kvmem_retrieval *r, double rel_tol) {
    kvmem_agent_info ai;
    assert_ok(kvmem_agent_get_info(f->ag, &ai));
    const int nb = ai.n_sealed;
    unsigned char *cand = calloc((size_t)(nb > 0 ? nb : 0) + 1, 1), *forced = calloc((size_t)(nb > 0 ? nb : 0) + 1, 1);
    int lo = p->recent_window > 0 ? (nb - p->recent_window > 0 ? nb - p->recent_window : 0) : 0;
    int hi = nb - (p->skip_recent < nb ? p->skip_recent : nb);
    for (int b = lo; b < hi; b++) cand[b] = 1;
    for (int i = 0; i < p->n_exclude; i++) cand[p->exclude[i]] = 0;
    for (int i = 0; i < p->n_always_include; i++) cand[p->always_include[i]] = 1, forced[p->always_include[i]] = 1;
    int n_sets = p->scope == KVMEM_SCOPE_GLOBAL ? 1 : f->spec.n_layers;
    assert_int_equal(kvmem_retrieval_n_sets(r), n_sets);
    double *S = malloc(sizeof(double) * ((size_t)(nb > 0 ? nb : 0) + 1));
    int *sel = malloc(sizeof(int) * ((size_t)(nb > 0 ? nb : 0) + 1));
    for (int s = 0; s < n_sets; s++) {
        ref_scores(f->ag, &f->spec, q, n_q, p, cand, n_sets == 1 ? -1 : s, S);
        const float *all;
        int32_t n_all;
        assert_ok(kvmem_retrieval_block_scores(r, s, &all, &n_all));
        assert_int_equal(n_all, nb);
        double smax = 0;
        for (int b = 0; b < nb; b++)
            if (!isnan(S[b])) smax = fmax(smax, fabs(S[b]));
        for (int b = 0; b < nb; b++) {
            if (isnan(S[b])) {
                assert_true(isnan(all[b]));
                continue;
            }
            if (!(fabs(all[b] - S[b]) <= rel_tol * smax + 1e-30))
                fail_msg("set %d block %d: score %.9g, reference %.9g", s, b, (double)all[b], S[b]);
        }
        int n_ref = ref_select(S, nb, forced, p->top_k, sel);
        const int32_t *blocks;
        const float *scores;
        int32_t n;
        assert_ok(kvmem_retrieval_get(r, s, &blocks, &scores, &n));
        assert_int_equal(n, n_ref);
        for (int i = 1; i < n; i++) assert_true(blocks[i - 1] < blocks[i]); /* chronological */
        for (int i = 0; i < n; i++) assert_true(scores[i] == all[blocks[i]]);
        /* is the boundary a near tie? then either choice is right */
        double kth = INFINITY, next = -INFINITY;
        for (int i = 0; i < n_ref; i++)
            if (!forced[sel[i]]) kth = fmin(kth, S[sel[i]]);
        for (int b = 0; b < nb; b++) {
            int in = 0;
            for (int i = 0; i < n_ref; i++) in |= sel[i] == b;
            if (!in && !isnan(S[b]) && !forced[b]) next = fmax(next, S[b]);
        }
        if (kth - next > 4 * rel_tol * smax)
            for (int i = 0; i < n; i++) assert_int_equal(blocks[i], sel[i]);
        int64_t tok = 0, want = 0;
        assert_ok(kvmem_retrieval_n_tokens(r, s, &tok));
        for (int i = 0; i < n; i++) {
            kvmem_block_info bi;
            assert_ok(kvmem_agent_block_info(f->ag, blocks[i], &bi));
            want += bi.n_tokens;
        }
        assert_int_equal(tok, want);
    }
    free(S);
    free(sel);
    free(cand);
    free(forced);
}

static void every_mode_matches_the_double_reference(void **state) {
    (void)state;
    fixture f;
    const int lens[] = {37, 16, 5, 50, 21, 9};
    /* flushed turns give partial blocks; 8 q heads over 2 kv heads (G = 4) */
    make(&f, 2, 8, 2, 32, 8, KVMEM_F32, lens, 6, 1, 11);
    uint64_t rng = 5;
    const int nqs[] = {1, 3, 9}; /* R = 4 (row kernel), 12, 36 (panel kernel) */
    kvmem_retrieval *r;
    assert_ok(kvmem_retrieval_create(&r));
    for (int qi = 0; qi < 3; qi++) {
        float *q = rand_query(&f.spec, nqs[qi], &rng);
        kvmem_tensor qt = qview(&f.spec, q, nqs[qi]);
        for (int mode = 0; mode < 2; mode++)
            for (int norm = 0; norm < 2; norm++)
                for (int agg = 0; agg < 2; agg++)
                    for (int scope = 0; scope < 2; scope++) {
                        kvmem_retrieve_params p = kvmem_retrieve_default_params();
                        p.mode = (kvmem_retrieve_mode)mode;
                        p.norm = (kvmem_retrieve_norm)norm;
                        p.agg = (kvmem_retrieve_agg)agg;
                        p.scope = (kvmem_retrieve_scope)scope;
                        p.top_k = 5;
                        assert_ok(kvmem_retrieve(f.ag, &qt, &p, r));
                        check_against_ref(&f, q, nqs[qi], &p, r, 2e-5);
                    }
        free(q);
    }
    kvmem_retrieval_free(r);
    unmake(&f);
}

static void f16_storage_and_custom_tau_match_the_reference(void **state) {
    (void)state;
    fixture f;
    const int lens[] = {64, 40};
    make(&f, 3, 4, 1, 64, 16, KVMEM_F16, lens, 2, 0, 12);
    uint64_t rng = 9;
    float *q = rand_query(&f.spec, 2, &rng);
    kvmem_tensor qt = qview(&f.spec, q, 2);
    kvmem_retrieval *r;
    assert_ok(kvmem_retrieval_create(&r));
    kvmem_retrieve_params p = kvmem_retrieve_default_params();
    p.tau = 0.05f;
    p.rr_c = 3.0f;
    for (int mode = 0; mode < 2; mode++)
        for (int norm = 0; norm < 2; norm++) {
            p.mode = (kvmem_retrieve_mode)mode;
            p.norm = (kvmem_retrieve_norm)norm;
            assert_ok(kvmem_retrieve(f.ag, &qt, &p, r));
            check_against_ref(&f, q, 2, &p, r, 2e-5);
        }
    kvmem_retrieval_free(r);
    free(q);
    unmake(&f);
}

/* EXACT on every storage dtype, with the few query rows of a decode step
 * (1 and 2 tokens over G = 4 heads: the block-major pass, which reads F16
 * and F32 blocks in place and the others through the block reader) and
 * partial blocks from flushes, against the reference on the keys as the
 * agent stores them. */
static void exact_on_every_storage_dtype_matches_the_reference(void **state) {
    (void)state;
    const kvmem_dtype dts[] = {KVMEM_F16, KVMEM_F32, KVMEM_BF16, KVMEM_Q8, KVMEM_Q4};
    const int lens[] = {40, 7, 33, 16};
    for (size_t t = 0; t < sizeof dts / sizeof *dts; t++) {
        fixture f;
        make(&f, 2, 8, 2, 64, 16, dts[t], lens, 4, 1, 30 + t);
        uint64_t rng = 17 + t;
        kvmem_retrieval *r;
        assert_ok(kvmem_retrieval_create(&r));
        for (int nq = 1; nq <= 2; nq++) {
            float *q = rand_query(&f.spec, nq, &rng);
            kvmem_tensor qt = qview(&f.spec, q, nq);
            for (int norm = 0; norm < 2; norm++) {
                kvmem_retrieve_params p = kvmem_retrieve_default_params();
                p.mode = KVMEM_RETRIEVE_EXACT;
                p.norm = (kvmem_retrieve_norm)norm;
                p.top_k = 4;
                assert_ok(kvmem_retrieve(f.ag, &qt, &p, r));
                check_against_ref(&f, q, nq, &p, r, 2e-5);
            }
            free(q);
        }
        kvmem_retrieval_free(r);
        unmake(&f);
    }
}

static void filters_exclude_include_and_recency(void **state) {
    (void)state;
    fixture f;
    const int lens[] = {160};
    make(&f, 2, 4, 2, 16, 8, KVMEM_F32, lens, 1, 0, 13); /* 20 blocks */
    uint64_t rng = 3;
    float *q = rand_query(&f.spec, 2, &rng);
    kvmem_tensor qt = qview(&f.spec, q, 2);
    kvmem_retrieval *r;
    assert_ok(kvmem_retrieval_create(&r));
    const int32_t ex[] = {3, 7, 8}, inc[] = {0, 19, 0};
    kvmem_retrieve_params p = kvmem_retrieve_default_params();
    p.top_k = 6;
    p.exclude = ex;
    p.n_exclude = 3;
    p.always_include = inc;
    p.n_always_include = 3; /* a duplicate is harmless */
    for (int scope = 0; scope < 2; scope++) {
        p.scope = (kvmem_retrieve_scope)scope;
        assert_ok(kvmem_retrieve(f.ag, &qt, &p, r));
        check_against_ref(&f, q, 2, &p, r, 2e-5);
        const int32_t *b;
        int32_t n;
        assert_ok(kvmem_retrieval_get(r, 0, &b, NULL, &n));
        assert_int_equal(n, 6);
        assert_int_equal(b[0], 0);
        assert_int_equal(b[n - 1], 19);
        for (int i = 0; i < n; i++) assert_true(b[i] != 3 && b[i] != 7 && b[i] != 8);
    }
    p.scope = KVMEM_SCOPE_GLOBAL;
    p.n_exclude = 0;
    p.n_always_include = 0;
    p.recent_window = 10;
    p.skip_recent = 3;
    assert_ok(kvmem_retrieve(f.ag, &qt, &p, r));
    check_against_ref(&f, q, 2, &p, r, 2e-5);
    const int32_t *b;
    int32_t n;
    assert_ok(kvmem_retrieval_get(r, 0, &b, NULL, &n));
    assert_int_equal(n, 6);
    for (int i = 0; i < n; i++) assert_true(b[i] >= 10 && b[i] < 17);
    /* more forced blocks than top_k: all forced, nothing else */
    p.recent_window = 0;
    p.skip_recent = 0;
    p.top_k = 1;
    p.always_include = inc;
    p.n_always_include = 2;
    assert_ok(kvmem_retrieve(f.ag, &qt, &p, r));
    assert_ok(kvmem_retrieval_get(r, 0, &b, NULL, &n));
    assert_int_equal(n, 2);
    assert_int_equal(b[0], 0);
    assert_int_equal(b[1], 19);
    kvmem_retrieval_free(r);
    free(q);
    unmake(&f);
}

/* With one token per block the box is the key itself, so AABB = EXACT. */
static void recall_is_one_when_block_size_is_one(void **state) {
    (void)state;
    fixture f;
    const int lens[] = {48};
    make(&f, 2, 4, 2, 32, 1, KVMEM_F32, lens, 1, 0, 14);
    uint64_t rng = 21;
    kvmem_retrieval *ra, *re;
    assert_ok(kvmem_retrieval_create(&ra));
    assert_ok(kvmem_retrieval_create(&re));
    for (int trial = 0; trial < 4; trial++) {
        float *q = rand_query(&f.spec, 1 + trial, &rng);
        kvmem_tensor qt = qview(&f.spec, q, 1 + trial);
        kvmem_retrieve_params p = kvmem_retrieve_default_params();
        p.top_k = 10;
        p.norm = trial % 2 ? KVMEM_NORM_RR : KVMEM_NORM_SOFTMAX;
        p.agg = trial / 2 ? KVMEM_AGG_SUM : KVMEM_AGG_MAX;
        assert_ok(kvmem_retrieve(f.ag, &qt, &p, ra));
        p.mode = KVMEM_RETRIEVE_EXACT;
        assert_ok(kvmem_retrieve(f.ag, &qt, &p, re));
        const int32_t *a, *e;
        int32_t na, ne;
        assert_ok(kvmem_retrieval_get(ra, 0, &a, NULL, &na));
        assert_ok(kvmem_retrieval_get(re, 0, &e, NULL, &ne));
        assert_int_equal(na, 10);
        assert_int_equal(ne, 10);
        int hit = 0;
        for (int i = 0; i < na; i++)
            for (int j = 0; j < ne; j++) hit += a[i] == e[j];
        assert_int_equal(hit, 10);
        free(q);
    }
    kvmem_retrieval_free(ra);
    kvmem_retrieval_free(re);
    unmake(&f);
}

/* Identical blocks tie exactly: RR gives the older one the better rank,
 * top-k prefers it, and the scores are 1/(rank + c) exactly. */
static void rr_ranks_ties_toward_the_older_block(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_model_spec s = tu_spec(1, 8);
    s.n_q_heads = 1;
    s.n_kv_heads = 1;
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = 2;
    pp.storage_dtype = KVMEM_F32;
    kvmem_pool *pool;
    kvmem_agent *ag;
    assert_ok(kvmem_pool_create(ctx, &s, &pp, &pool));
    assert_ok(kvmem_agent_open(pool, "t", &ag));
    /* blocks: 0 = A, 1 = B (stronger), 2 = A, 3 = A, 4 = C (weaker) */
    float k[10][8], v[10][8];
    memset(v, 0, sizeof v);
    for (int t = 0; t < 10; t++)
        for (int d = 0; d < 8; d++) {
            int b = t / 2;
            float base = b == 1 ? 2.0f : b == 4 ? 0.5f : 1.0f;
            k[t][d] = base + 0.1f * (float)(t % 2) + 0.01f * (float)d;
        }
    int64_t sh[4] = {1, 10, 1, 8};
    kvmem_tensor kt, vt;
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_append(ag, &kt, &vt, NULL));
    float q[8];
    for (int d = 0; d < 8; d++) q[d] = 1.0f;
    int64_t qs[4] = {1, 1, 1, 8};
    kvmem_tensor qt;
    assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 4, qs));
    kvmem_retrieval *r;
    assert_ok(kvmem_retrieval_create(&r));
    for (int mode = 0; mode < 2; mode++) {
        kvmem_retrieve_params p = kvmem_retrieve_default_params();
        p.norm = KVMEM_NORM_RR;
        p.mode = (kvmem_retrieve_mode)mode;
        p.top_k = 3;
        assert_ok(kvmem_retrieve(ag, &qt, &p, r));
        const float *all;
        int32_t nb;
        assert_ok(kvmem_retrieval_block_scores(r, 0, &all, &nb));
        assert_int_equal(nb, 5);
        /* ranks: B=1, A0=2, A2=3, A3=4, C=5 */
        const int rank[5] = {2, 1, 3, 4, 5};
        for (int b = 0; b < 5; b++) assert_true(all[b] == 1.0f / ((float)rank[b] + 60.0f));
        const int32_t *sel;
        int32_t n;
        assert_ok(kvmem_retrieval_get(r, 0, &sel, NULL, &n));
        assert_int_equal(n, 3);
        assert_int_equal(sel[0], 0);
        assert_int_equal(sel[1], 1);
        assert_int_equal(sel[2], 2);
    }
    /* SOFTMAX: the tied blocks get equal scores, top-2 of {A,A,A} after
     * excluding B and C takes the two oldest. */
    kvmem_retrieve_params p = kvmem_retrieve_default_params();
    const int32_t ex[] = {1, 4};
    p.exclude = ex;
    p.n_exclude = 2;
    p.top_k = 2;
    assert_ok(kvmem_retrieve(ag, &qt, &p, r));
    const int32_t *sel;
    const float *sc;
    int32_t n;
    assert_ok(kvmem_retrieval_get(r, 0, &sel, &sc, &n));
    assert_int_equal(n, 2);
    assert_int_equal(sel[0], 0);
    assert_int_equal(sel[1], 2);
    assert_true(sc[0] == sc[1]);
    kvmem_retrieval_free(r);
    kvmem_agent_close(ag);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
}

static void k_larger_than_blocks_and_empty_agents(void **state) {
    (void)state;
    fixture f;
    const int lens[] = {20};
    make(&f, 1, 4, 2, 16, 4, KVMEM_F32, lens, 1, 0, 15); /* 5 blocks */
    uint64_t rng = 1;
    float *q = rand_query(&f.spec, 1, &rng);
    kvmem_tensor qt = qview(&f.spec, q, 1);
    kvmem_retrieval *r;
    assert_ok(kvmem_retrieval_create(&r));
    assert_int_equal(kvmem_retrieval_n_sets(r), 0);
    kvmem_retrieve_params p = kvmem_retrieve_default_params();
    p.top_k = 100;
    assert_ok(kvmem_retrieve(f.ag, &qt, &p, r));
    check_against_ref(&f, q, 1, &p, r, 2e-5);
    int32_t blocks[8], n;
    assert_ok(kvmem_retrieval_copy(r, 0, blocks, NULL, 8, &n));
    assert_int_equal(n, 5);
    for (int i = 0; i < 5; i++) assert_int_equal(blocks[i], i);
    /* copy-out with a small buffer: the full count, only capacity written */
    blocks[2] = -7;
    assert_ok(kvmem_retrieval_copy(r, 0, blocks, NULL, 2, &n));
    assert_int_equal(n, 5);
    assert_int_equal(blocks[2], -7);
    p.top_k = 0;
    assert_ok(kvmem_retrieve(f.ag, &qt, &p, r));
    assert_ok(kvmem_retrieval_copy(r, 0, blocks, NULL, 8, &n));
    assert_int_equal(n, 0);

    /* an empty agent, then one with only an unsealed tail: nothing to retrieve */
    kvmem_agent *e;
    assert_ok(kvmem_agent_open(f.pool, "empty", &e));
    p.top_k = 4;
    p.scope = KVMEM_SCOPE_PER_LAYER;
    assert_ok(kvmem_retrieve(e, &qt, &p, r));
    assert_int_equal(kvmem_retrieval_n_sets(r), 1);
    assert_ok(kvmem_retrieval_copy(r, 0, blocks, NULL, 8, &n));
    assert_int_equal(n, 0);
    float kv[3 * 2 * 16] = {0};
    int64_t sh[4] = {1, 3, 2, 16};
    kvmem_tensor kt;
    assert_ok(kvmem_tensor_init(&kt, kv, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_append(e, &kt, &kt, NULL));
    assert_ok(kvmem_retrieve(e, &qt, &p, r));
    assert_ok(kvmem_retrieval_copy(r, 0, blocks, NULL, 8, &n));
    assert_int_equal(n, 0); /* the tail is not retrievable */
    assert_ok(kvmem_agent_flush(e));
    assert_ok(kvmem_retrieve(e, &qt, &p, r));
    assert_ok(kvmem_retrieval_copy(r, 0, blocks, NULL, 8, &n));
    assert_int_equal(n, 1);
    int64_t tok;
    assert_ok(kvmem_retrieval_n_tokens(r, 0, &tok));
    assert_int_equal(tok, 3);
    kvmem_agent_close(e);
    kvmem_retrieval_free(r);
    free(q);
    unmake(&f);
}

/* Same query in f16 with a strided layout gives the f16-rounded query's scores. */
static void strided_f16_query(void **state) {
    (void)state;
    fixture f;
    const int lens[] = {64};
    make(&f, 2, 4, 2, 16, 8, KVMEM_F32, lens, 1, 0, 16);
    uint64_t rng = 4;
    const int nq = 3;
    size_t n = (size_t)nq * 2 * 4 * 16;
    float *q = rand_query(&f.spec, nq, &rng);
    uint16_t *h = malloc(2 * n * sizeof(uint16_t)); /* every other element used */
    for (size_t i = 0; i < n; i++) {
        uint16_t b;
        /* round q to f16 through the library's own tensor copy path is what we test;
         * build f16 bits by hand (values are normal, |q| < 8) */
        float x = q[i];
        uint32_t u;
        memcpy(&u, &x, 4);
        uint32_t sign = (u >> 16) & 0x8000u;
        int e = (int)((u >> 23) & 0xff) - 127 + 15;
        uint32_t mant = u & 0x7fffffu;
        if (e <= 0) {
            b = (uint16_t)sign; /* tiny -> 0 */
            q[i] = sign ? -0.0f : 0.0f;
        } else {
            uint32_t m10 = mant >> 13; /* truncate */
            b = (uint16_t)(sign | ((uint32_t)e << 10) | m10);
            uint32_t back = (sign << 16) | ((uint32_t)(e - 15 + 127) << 23) | (m10 << 13);
            memcpy(&q[i], &back, 4);
        }
        h[2 * i] = b;
        h[2 * i + 1] = 0xffff; /* NaN bits in the gaps: must never be read */
    }
    kvmem_tensor qt;
    int64_t sh[4] = {nq, 2, 4, 16};
    assert_ok(kvmem_tensor_init(&qt, h, KVMEM_F16, 4, sh));
    for (int d = 0; d < 4; d++) qt.strides[d] *= 2;
    kvmem_retrieval *r;
    assert_ok(kvmem_retrieval_create(&r));
    kvmem_retrieve_params p = kvmem_retrieve_default_params();
    assert_ok(kvmem_retrieve(f.ag, &qt, &p, r));
    check_against_ref(&f, q, nq, &p, r, 2e-5);
    kvmem_retrieval_free(r);
    free(h);
    free(q);
    unmake(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_mode_matches_the_double_reference),
        cmocka_unit_test(f16_storage_and_custom_tau_match_the_reference),
        cmocka_unit_test(exact_on_every_storage_dtype_matches_the_reference),
        cmocka_unit_test(filters_exclude_include_and_recency),
        cmocka_unit_test(recall_is_one_when_block_size_is_one),
        cmocka_unit_test(rr_ranks_ties_toward_the_older_block),
        cmocka_unit_test(k_larger_than_blocks_and_empty_agents),
        cmocka_unit_test(strided_f16_query),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
