/* Agent append/read and slot map append/gather on the layouts engines hand
 * over: K and V per layer as [n_kv_heads][T][head_dim] (HF/PyTorch caches,
 * head-major), viewed through strides as [n_layers][T][n_kv_heads][head_dim],
 * a batch row of a longer static cache, and position-major tensors, in f32,
 * f16 and bf16. Values lie on a 1/64 grid in [-4, 4] (exact in every dtype
 * and in f32 storage), so what comes back must equal what went in, bit for
 * bit, whatever the two layouts. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define L 3
#define H 4
#define D 40 /* not a multiple of the vector width */

enum { POS_MAJOR, HEAD_MAJOR, HF_BATCH, N_LAYOUTS };

static float grid(uint64_t *rng) { return roundf(fmaxf(-4.f, fminf(4.f, tu_normal(rng))) * 64.f) / 64.f; }

static kvmem_model_spec spec(void) {
    kvmem_model_spec s = tu_spec(L, D);
    s.n_q_heads = 2 * H, s.n_kv_heads = H;
    return s;
}

/* A [L][T][H][D] view in `layout` and dtype dt over a fresh buffer (*buf). */
static kvmem_tensor view(int64_t T, int layout, kvmem_dtype dt, void **buf) {
    const size_t es = dt == KVMEM_F32 ? 4 : 2;
    const int64_t Tal = T + 9; /* HF: a static cache longer than T, batch row 1 of 2 */
    const size_t n = (size_t)L * (size_t)H * (size_t)(layout == HF_BATCH ? 2 * Tal : T) * D;
    unsigned char *b = calloc(n ? n : 1, es);
    assert_non_null(b);
    kvmem_tensor t;
    int64_t shape[4] = {L, T, H, D};
    assert_ok(kvmem_tensor_init(&t, b, dt, 4, shape));
    if (layout == HEAD_MAJOR) t.strides[1] = D, t.strides[2] = T * D;
    if (layout == HF_BATCH) { /* [L][2][H][Tal][D], row 1 */
        t.strides[0] = 2 * H * Tal * D, t.strides[1] = D, t.strides[2] = Tal * D;
        t.data = b + (size_t)H * (size_t)Tal * D * es;
    }
    *buf = b;
    return t;
}

static void *at(const kvmem_tensor *t, int64_t l, int64_t j, int64_t h, int64_t d) {
    const size_t es = t->dtype == KVMEM_F32 ? 4 : 2;
    return ((unsigned char *)t->data +
                     (size_t)(l * t->strides[0] + j * t->strides[1] + h * t->strides[2] + d * t->strides[3]) * es);
}

static void put(const kvmem_tensor *t, int64_t l, int64_t j, int64_t h, int64_t d, float f) {
    void *p = at(t, l, j, h, d);
    uint32_t u;
    memcpy(&u, &f, 4);
    if (t->dtype == KVMEM_F32) {
        memcpy(p, &f, 4);
    } else if (t->dtype == KVMEM_BF16) {
        uint16_t x = (uint16_t)(u >> 16);
        memcpy(p, &x, 2);
    } else {
        uint32_t ex = (u >> 23) & 0xffu;
        uint16_t x = (uint16_t)(((u >> 16) & 0x8000u) | (ex ? ((ex - 112u) << 10) | ((u >> 13) & 0x3ffu) : 0u));
        if (ex == 0xffu) x = 0x7e00u; /* NaN */
        memcpy(p, &x, 2);
    }
}

static float get(const kvmem_tensor *t, int64_t l, int64_t j, int64_t h, int64_t d) {
    const void *p = at(t, l, j, h, d);
    if (t->dtype == KVMEM_F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    uint16_t x;
    memcpy(&x, p, 2);
    uint32_t u;
    if (t->dtype == KVMEM_BF16) {
        u = (uint32_t)x << 16;
    } else {
        uint32_t ex = (x >> 10) & 31u;
        u = ((uint32_t)(x & 0x8000u) << 16) | (ex ? ((ex + 112u) << 23) | ((uint32_t)(x & 0x3ffu) << 13) : 0u);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ref [2][L][N][H][D]: K then V of every token appended */
#define REF(r, N, w, l, j, h, d) (r)[((((size_t)(w) * L + (size_t)(l)) * (size_t)(N) + (size_t)(j)) * H + (size_t)(h)) * D + (size_t)(d)]

static void agent_round_trips_every_layout(void **state) {
    (void)state;
    const int64_t chunks[3] = {37, 5, 50}, N = 92;
    const kvmem_dtype dts[3] = {KVMEM_F32, KVMEM_F16, KVMEM_BF16};
    uint64_t rng = 61;
    float *ref = malloc(sizeof(float) * 2 * L * (size_t)N * H * D);
    for (size_t i = 0; i < 2 * (size_t)L * (size_t)N * H * D; i++) ref[i] = grid(&rng);
    kvmem_context *ctx = tu_context(2);
    kvmem_model_spec s = spec();
    for (int layout = 0; layout < N_LAYOUTS; layout++)
        for (int x = 0; x < 3; x++) {
            kvmem_pool_params pp = kvmem_pool_default_params();
            pp.block_size = 16;
            pp.storage_dtype = KVMEM_F32;
            kvmem_pool *pool;
            kvmem_agent *ag;
            assert_ok(kvmem_pool_create(ctx, &s, &pp, &pool));
            assert_ok(kvmem_agent_open(pool, "a", &ag));
            int64_t j0 = 0;
            for (int c = 0; c < 3; c++) { /* appends of 37, 5 (then a flush) and 50 tokens */
                void *kb, *vb;
                kvmem_tensor tk = view(chunks[c], layout, dts[x], &kb), tv = view(chunks[c], layout, dts[(x + 1) % 3], &vb);
                for (int64_t l = 0; l < L; l++)
                    for (int64_t j = 0; j < chunks[c]; j++)
                        for (int64_t h = 0; h < H; h++)
                            for (int64_t d = 0; d < D; d++) {
                                put(&tk, l, j, h, d, REF(ref, N, 0, l, j0 + j, h, d));
                                put(&tv, l, j, h, d, REF(ref, N, 1, l, j0 + j, h, d));
                            }
                assert_ok(kvmem_agent_append(ag, &tk, &tv, NULL));
                if (c == 1) assert_ok(kvmem_agent_flush(ag));
                j0 += chunks[c];
                free(kb), free(vb);
            }
            /* read [0, N) and [7, 70) (blocks cut in the middle, the tail) in every layout */
            const int64_t ranges[2][2] = {{0, N}, {7, 63}};
            for (int ol = 0; ol < N_LAYOUTS; ol++)
                for (int r = 0; r < 2; r++) {
                    const int64_t f = ranges[r][0], n = ranges[r][1];
                    void *kb, *vb;
                    kvmem_tensor ok = view(n, ol, dts[(x + 2) % 3], &kb), ov = view(n, (ol + 1) % N_LAYOUTS, dts[x], &vb);
                    assert_ok(kvmem_agent_read(ag, f, n, &ok, &ov));
                    for (int64_t l = 0; l < L; l++)
                        for (int64_t j = 0; j < n; j++)
                            for (int64_t h = 0; h < H; h++)
                                for (int64_t d = 0; d < D; d++) {
                                    if (get(&ok, l, j, h, d) != REF(ref, N, 0, l, f + j, h, d) ||
                                        get(&ov, l, j, h, d) != REF(ref, N, 1, l, f + j, h, d))
                                        fail_msg("in layout %d dtype %d, out layout %d: token %lld layer %lld head %lld dim %lld differs",
                                                 layout, x, ol, (long long)(f + j), (long long)l, (long long)h, (long long)d);
                                }
                    free(kb), free(vb);
                }
            kvmem_agent_close(ag);
            kvmem_pool_free(pool);
        }
    kvmem_context_free(ctx);
    free(ref);
}

static void slot_map_round_trips_every_layout(void **state) {
    (void)state;
    const int64_t N = 70; /* the arrays below hold 70 */
    const kvmem_dtype dts[3] = {KVMEM_F32, KVMEM_F16, KVMEM_BF16};
    uint64_t rng = 62;
    float *ref = malloc(sizeof(float) * 2 * L * (size_t)N * H * D);
    for (size_t i = 0; i < 2 * (size_t)L * (size_t)N * H * D; i++) ref[i] = grid(&rng);
    kvmem_model_spec s = spec();
    for (int layout = 0; layout < N_LAYOUTS; layout++)
        for (int x = 0; x < 3; x++) {
            kvmem_kvstore *st;
            kvmem_slotmap *m;
            assert_ok(kvmem_kvstore_create(&s, NULL, &st));
            assert_ok(kvmem_slotmap_create(st, &m));
            void *kb, *vb;
            kvmem_tensor tk = view(N, layout, dts[x], &kb), tv = view(N, layout, dts[(x + 1) % 3], &vb);
            for (int64_t l = 0; l < L; l++)
                for (int64_t j = 0; j < N; j++)
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t d = 0; d < D; d++) {
                            put(&tk, l, j, h, d, REF(ref, N, 0, l, j, h, d));
                            put(&tv, l, j, h, d, REF(ref, N, 1, l, j, h, d));
                        }
            /* a NaN anywhere is refused and names its place; nothing is appended */
            put(&tk, 2, 41, 3, 17, NAN);
            assert_status(kvmem_slotmap_append(m, &tk, &tv), KVMEM_ERR_INVALID_ARG, "K[2][41][3][17] is not finite");
            put(&tk, 2, 41, 3, 17, REF(ref, N, 0, 2, 41, 3, 17));
            assert_ok(kvmem_slotmap_append(m, &tk, &tv));
            free(kb), free(vb);
            /* drop every third position, then gather the live ones */
            int32_t kept[70];
            int64_t nk = 0;
            for (int64_t j = 0; j < N; j++)
                if (j % 3 != 1) kept[nk++] = (int32_t)j;
            assert_ok(kvmem_slotmap_evict(m, kept, nk, NULL));
            for (int ol = 0; ol < N_LAYOUTS; ol++) {
                kvmem_tensor ok = view(nk, ol, dts[(x + 2) % 3], &kb), ov = view(nk, (ol + 2) % N_LAYOUTS, dts[x], &vb);
                int32_t pos[70];
                assert_ok(kvmem_slotmap_gather(m, &ok, &ov, pos));
                for (int64_t i = 0; i < nk; i++) {
                    assert_int_equal(pos[i], kept[i]);
                    for (int64_t l = 0; l < L; l++)
                        for (int64_t h = 0; h < H; h++)
                            for (int64_t d = 0; d < D; d++)
                                if (get(&ok, l, i, h, d) != REF(ref, N, 0, l, kept[i], h, d) ||
                                    get(&ov, l, i, h, d) != REF(ref, N, 1, l, kept[i], h, d))
                                    fail_msg("in layout %d dtype %d, out layout %d: live %lld (position %d) layer %lld head %lld differs",
                                             layout, x, ol, (long long)i, kept[i], (long long)l, (long long)h);
                }
                free(kb), free(vb);
            }
            kvmem_slotmap_free(m);
            kvmem_kvstore_free(st);
        }
    free(ref);
}

/* kvmem_gather writes the same bits into every output layout and dtype as
 * into a position-major tensor of that dtype (V also equal to what went in),
 * and kvmem_retrieve chooses the same blocks with the same scores whether
 * the queries come contiguous or per layer [n_q_heads][n_q][head_dim] (HF's
 * query_states), in every dtype. */
static void gather_and_retrieve_agree_in_every_layout(void **state) {
    (void)state;
    const int64_t N = 96; /* 6 blocks of 16 */
    const kvmem_dtype dts[3] = {KVMEM_F32, KVMEM_F16, KVMEM_BF16};
    uint64_t rng = 63;
    float *ref = malloc(sizeof(float) * 2 * L * (size_t)N * H * D);
    for (size_t i = 0; i < 2 * (size_t)L * (size_t)N * H * D; i++) ref[i] = grid(&rng);
    kvmem_context *ctx = tu_context(2);
    kvmem_model_spec s = spec();
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = 16;
    pp.storage_dtype = KVMEM_F32;
    kvmem_pool *pool;
    kvmem_agent *ag;
    assert_ok(kvmem_pool_create(ctx, &s, &pp, &pool));
    assert_ok(kvmem_agent_open(pool, "g", &ag));
    void *kb, *vb;
    kvmem_tensor tk = view(N, POS_MAJOR, KVMEM_F32, &kb), tv = view(N, POS_MAJOR, KVMEM_F32, &vb);
    for (int64_t l = 0; l < L; l++)
        for (int64_t j = 0; j < N; j++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++) {
                    put(&tk, l, j, h, d, REF(ref, N, 0, l, j, h, d));
                    put(&tv, l, j, h, d, REF(ref, N, 1, l, j, h, d));
                }
    assert_ok(kvmem_agent_append(ag, &tk, &tv, NULL));
    free(kb), free(vb);

    const int32_t blocks[3] = {4, 1, 2}; /* out of order: rows land where the caller asks */
    const int64_t M = 48;
    for (int x = 0; x < 3; x++) {
        void *rk, *rv;
        kvmem_tensor refk = view(M, POS_MAJOR, dts[x], &rk), refv = view(M, POS_MAJOR, dts[x], &rv);
        assert_ok(kvmem_gather(ag, blocks, 3, 5, &refk, &refv));
        for (int64_t l = 0; l < L; l++)
            for (int64_t i = 0; i < M; i++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t d = 0; d < D; d++)
                        if (get(&refv, l, i, h, d) != REF(ref, N, 1, l, blocks[i / 16] * 16 + i % 16, h, d))
                            fail_msg("dtype %d: gathered V row %lld layer %lld head %lld differs from what went in", x,
                                     (long long)i, (long long)l, (long long)h);
        for (int ol = 0; ol < N_LAYOUTS; ol++) {
            kvmem_tensor ok = view(M, ol, dts[x], &kb), ov = view(M, (ol + 1) % N_LAYOUTS, dts[x], &vb);
            assert_ok(kvmem_gather(ag, blocks, 3, 5, &ok, &ov));
            for (int64_t l = 0; l < L; l++)
                for (int64_t i = 0; i < M; i++)
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t d = 0; d < D; d++) {
                            const float a = get(&ok, l, i, h, d), b = get(&refk, l, i, h, d);
                            const float c = get(&ov, l, i, h, d), e = get(&refv, l, i, h, d);
                            if (memcmp(&a, &b, 4) || memcmp(&c, &e, 4))
                                fail_msg("dtype %d, K layout %d, V layout %d: gathered row %lld layer %lld head %lld dim %lld "
                                         "differs from position-major", x, ol, (ol + 1) % N_LAYOUTS, (long long)i, (long long)l,
                                         (long long)h, (long long)d);
                        }
            free(kb), free(vb);
        }
        free(rk), free(rv);
    }

    /* queries: 3 tokens, [3][L][2H][D], contiguous and per layer [2H][3][D] */
    const int64_t NQ = 2 * H, nq = 3;
    float *qref = malloc(sizeof(float) * (size_t)(nq * L * NQ * D));
    for (int64_t i = 0; i < nq * L * NQ * D; i++) qref[i] = grid(&rng);
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    rp.top_k = 3;
    kvmem_retrieval *r0, *r1;
    assert_ok(kvmem_retrieval_create(&r0));
    assert_ok(kvmem_retrieval_create(&r1));
    for (int x = 0; x < 3; x++) {
        kvmem_tensor q[2];
        void *qb[2];
        for (int hm = 0; hm < 2; hm++) {
            qb[hm] = calloc((size_t)(nq * L * NQ * D), 4);
            int64_t sh[4] = {nq, L, NQ, D};
            assert_ok(kvmem_tensor_init(&q[hm], qb[hm], dts[x], 4, sh));
            if (hm) q[hm].strides[0] = D, q[hm].strides[1] = NQ * nq * D, q[hm].strides[2] = nq * D;
            /* put() takes [l][j][h][d] of a KV view; here the first index is the token */
            for (int64_t t = 0; t < nq; t++)
                for (int64_t l = 0; l < L; l++)
                    for (int64_t h = 0; h < NQ; h++)
                        for (int64_t d = 0; d < D; d++) put(&q[hm], t, l, h, d, qref[((t * L + l) * NQ + h) * D + d]);
        }
        assert_ok(kvmem_retrieve(ag, &q[0], &rp, r0));
        assert_ok(kvmem_retrieve(ag, &q[1], &rp, r1));
        const int32_t *b0, *b1;
        const float *s0, *s1;
        int32_t n0, n1;
        assert_ok(kvmem_retrieval_get(r0, 0, &b0, &s0, &n0));
        assert_ok(kvmem_retrieval_get(r1, 0, &b1, &s1, &n1));
        assert_int_equal(n0, 3);
        assert_int_equal(n1, n0);
        assert_memory_equal(b0, b1, (size_t)n0 * sizeof *b0);
        assert_memory_equal(s0, s1, (size_t)n0 * sizeof *s0);
        assert_ok(kvmem_retrieval_block_scores(r0, 0, &s0, &n0));
        assert_ok(kvmem_retrieval_block_scores(r1, 0, &s1, &n1));
        assert_int_equal(n0, 6);
        assert_int_equal(n1, n0);
        assert_memory_equal(s0, s1, (size_t)n0 * sizeof *s0);
        free(qb[0]), free(qb[1]);
    }
    kvmem_retrieval_free(r0);
    kvmem_retrieval_free(r1);
    free(qref);
    kvmem_agent_close(ag);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
    free(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(agent_round_trips_every_layout),
        cmocka_unit_test(slot_map_round_trips_every_layout),
        cmocka_unit_test(gather_and_retrieve_agree_in_every_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
