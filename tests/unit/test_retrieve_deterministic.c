/* Retrieval is deterministic to the last bit: a block's score depends only
 * on its box (its keys, EXACT) and the query, never on which scoring chunk,
 * how many threads or which pass (decode's block-major, prefill's
 * item-major) computed it, and ties at the top-k edge go to the older block.
 * Agents hold exact copies of earlier blocks scattered across the whole
 * history, so copies land in different chunks of every chunking; each
 * retrieval runs on 1 and 4 threads, SOFTMAX and RR, MAX and SUM, AABB and
 * EXACT, f32 and f16 storage, one and several query tokens. The kernel table
 * is the process's (ctest runs this program again with KVMEM_CPU=scalar and
 * avx2; the plain run takes the best: AVX-512 where the CPU has it). */
#include "testutil.h"
#include "retrieve/score.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { L = 4, NQ = 4, NKV = 2, D = 64, BS = 8, NB = 603, N_DUP = 60 };

typedef struct agent_set {
    kvmem_context *ctx;
    kvmem_pool *pool;
    kvmem_agent *ag;
} agent_set;

/* Block b of the history copies block dup_of[b] (< b) exactly, or is its own
 * (dup_of[b] == b). */
static int dup_of[NB];

static void make_dups(uint64_t *rng) {
    for (int b = 0; b < NB; b++) dup_of[b] = b;
    for (int i = 0; i < N_DUP; i++) {
        int b = 1 + (int)(tu_next(rng) % (NB - 1));
        int src = (int)(tu_next(rng) % (uint64_t)b);
        dup_of[b] = dup_of[src]; /* a copy of a copy is a copy of the original */
    }
}

/* One agent with the history above: [L][NB * BS][NKV][D] keys. */
static void make(agent_set *a, int n_threads, kvmem_dtype dt) {
    a->ctx = tu_context(n_threads);
    kvmem_model_spec s = tu_spec(L, D);
    s.n_q_heads = NQ;
    s.n_kv_heads = NKV;
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = BS;
    pp.storage_dtype = dt;
    assert_ok(kvmem_pool_create(a->ctx, &s, &pp, &a->pool));
    assert_ok(kvmem_agent_open(a->pool, "d", &a->ag));
    const size_t T = (size_t)NB * BS, row = (size_t)NKV * D, n = (size_t)L * T * row;
    float *k = malloc(n * sizeof(float)), *v = calloc(n, sizeof(float));
    uint64_t rng = 99;
    for (size_t i = 0; i < n; i++) k[i] = tu_normal(&rng) + 0.3f * (float)((i / row) % 5);
    for (int b = 0; b < NB; b++)
        if (dup_of[b] != b)
            for (size_t l = 0; l < L; l++)
                memcpy(k + (l * T + (size_t)b * BS) * row, k + (l * T + (size_t)dup_of[b] * BS) * row,
                       BS * row * sizeof(float));
    int64_t sh[4] = {L, (int64_t)T, NKV, D};
    kvmem_tensor kt, vt;
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_append(a->ag, &kt, &vt, NULL));
    free(k);
    free(v);
}

static void unmake(agent_set *a) {
    kvmem_agent_close(a->ag);
    kvmem_pool_free(a->pool);
    kvmem_context_free(a->ctx);
}

/* Every block's score (top_k = NB) into S. */
static void all_scores(kvmem_agent *ag, const kvmem_tensor *q, kvmem_retrieve_params p, kvmem_retrieval *r, float *S) {
    p.top_k = NB;
    assert_ok(kvmem_retrieve(ag, q, &p, r));
    const float *all;
    int32_t nb;
    assert_ok(kvmem_retrieval_block_scores(r, 0, &all, &nb));
    assert_int_equal(nb, NB);
    memcpy(S, all, NB * sizeof(float));
}

/* The top-k contract on the scores the call itself returned: the k best by
 * score, ties toward the lower (older) block, in chronological order. */
static void check_topk(kvmem_agent *ag, const kvmem_tensor *q, kvmem_retrieve_params p, kvmem_retrieval *r,
                       const float *S, int k, const char *what) {
    p.top_k = k;
    assert_ok(kvmem_retrieve(ag, q, &p, r));
    const int32_t *sel;
    int32_t n;
    assert_ok(kvmem_retrieval_get(r, 0, &sel, NULL, &n));
    assert_int_equal(n, k);
    unsigned char *in = calloc(NB, 1);
    for (int i = 0; i < n; i++) {
        if (i > 0 && sel[i] <= sel[i - 1]) fail_msg("%s: selection not chronological", what);
        in[sel[i]] = 1;
    }
    for (int a = 0; a < NB; a++)
        for (int b = 0; b < NB; b++) {
            if (!in[a] || in[b]) continue;
            /* a kept, b dropped: a must rank before b */
            if (!(S[a] > S[b] || (S[a] == S[b] && a < b)))
                fail_msg("%s, top_k %d: kept block %d (%a) but dropped block %d (%a)", what, k, a, (double)S[a], b,
                         (double)S[b]);
        }
    free(in);
}

static void scores_depend_only_on_the_box_and_ties_go_to_the_older_block(void **state) {
    (void)state;
    uint64_t rng = 7;
    make_dups(&rng);
    const kvmem_dtype dts[2] = {KVMEM_F32, KVMEM_F16};
    const size_t saved = kvm_score_block_major_max_bytes;
    for (int di = 0; di < 2; di++) {
        agent_set one, many;
        make(&one, 1, dts[di]);
        make(&many, 4, dts[di]);
        kvmem_retrieval *r1, *r4;
        assert_ok(kvmem_retrieval_create(&r1));
        assert_ok(kvmem_retrieval_create(&r4));
        float *S1 = malloc(NB * sizeof(float)), *S4 = malloc(NB * sizeof(float));
        const int n_qs[2] = {1, 3};
        for (int qi = 0; qi < 2; qi++) {
            const int nq = n_qs[qi];
            const size_t nqf = (size_t)nq * L * NQ * D;
            float *qb = malloc(nqf * sizeof(float));
            for (size_t i = 0; i < nqf; i++) qb[i] = tu_normal(&rng);
            int64_t qs[4] = {nq, L, NQ, D};
            kvmem_tensor q;
            assert_ok(kvmem_tensor_init(&q, qb, KVMEM_F32, 4, qs));
            for (int combo = 0; combo < 16; combo++) {
                kvmem_retrieve_params p = kvmem_retrieve_default_params();
                p.norm = combo & 1 ? KVMEM_NORM_RR : KVMEM_NORM_SOFTMAX;
                p.agg = combo & 2 ? KVMEM_AGG_SUM : KVMEM_AGG_MAX;
                p.mode = combo & 4 ? KVMEM_RETRIEVE_EXACT : KVMEM_RETRIEVE_AABB;
                /* 0: decode's block-major pass where it applies; 1: item-major everywhere */
                kvm_score_block_major_max_bytes = combo & 8 ? 0 : saved;
                char what[160];
                snprintf(what, sizeof what, "%s %s %s %s n_q %d %s (table %s)", dts[di] == KVMEM_F32 ? "f32" : "f16",
                         p.norm == KVMEM_NORM_RR ? "RR" : "SOFTMAX", p.agg == KVMEM_AGG_SUM ? "SUM" : "MAX",
                         p.mode == KVMEM_RETRIEVE_EXACT ? "EXACT" : "AABB", nq, combo & 8 ? "item-major" : "default",
                         kvm_cpu_kernels_get()->score->name);
                all_scores(one.ag, &q, p, r1, S1);
                all_scores(many.ag, &q, p, r4, S4);
                for (int b = 0; b < NB; b++) {
                    if (memcmp(&S1[b], &S4[b], sizeof(float)) != 0)
                        fail_msg("%s: block %d scores %a on 1 thread, %a on 4", what, b, (double)S1[b], (double)S4[b]);
                    if (!isfinite(S1[b]) || S1[b] < 0) fail_msg("%s: block %d scores %g", what, b, (double)S1[b]);
                }
                int n_pairs = 0;
                for (int b = 0; b < NB; b++) {
                    const int a = dup_of[b];
                    if (a == b) continue;
                    n_pairs++;
                    /* SOFTMAX: one function of the box; RR: the older of equal
                     * relevances ranks first (1 / (rank + c)), never after */
                    if (p.norm == KVMEM_NORM_SOFTMAX ? memcmp(&S1[a], &S1[b], sizeof(float)) != 0 : !(S1[a] >= S1[b]))
                        fail_msg("%s: block %d copies block %d but scores %a against %a", what, b, a, (double)S1[b],
                                 (double)S1[a]);
                }
                assert_true(n_pairs > 0);
                /* the top-k edge on a tie: k = 1 + the blocks strictly ahead of a copied block */
                int edges = 0;
                for (int b = 0; b < NB && edges < 3; b++) {
                    if (dup_of[b] == b) continue;
                    int ahead = 0;
                    for (int c = 0; c < NB; c++) ahead += S1[c] > S1[dup_of[b]];
                    check_topk(one.ag, &q, p, r1, S1, ahead + 1, what);
                    check_topk(many.ag, &q, p, r4, S4, ahead + 1, what);
                    edges++;
                }
            }
            free(qb);
        }
        kvm_score_block_major_max_bytes = saved;
        free(S1);
        free(S4);
        kvmem_retrieval_free(r1);
        kvmem_retrieval_free(r4);
        unmake(&one);
        unmake(&many);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(scores_depend_only_on_the_box_and_ties_go_to_the_older_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
