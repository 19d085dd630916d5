/* Pools and agents: lifecycles, ids, append/seal/read, AABB containment,
 * de-rotation of post-RoPE keys, capacity, isolation, and that every bad
 * call returns the right status and message and changes nothing. */
#include "testutil.h"
#include "internal.h"
#include "cpu/tensor.h" /* kvm_convert_host: an independent f16 decode of the output */
#include "alloc.h"    /* kvm_huge_alloc: the KV blocks' allocator */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fixture {
    kvmem_context *ctx;
    kvmem_pool *pool;
    kvmem_model_spec spec;
} fixture;

static fixture *make(int32_t L, int32_t D, int32_t bs, kvmem_dtype dt, uint64_t cap) {
    fixture *f = calloc(1, sizeof *f);
    f->ctx = tu_context(2);
    f->spec = tu_spec(L, D);
    kvmem_pool_params p = kvmem_pool_default_params();
    p.block_size = bs;
    p.storage_dtype = dt;
    p.capacity_bytes = cap;
    assert_ok(kvmem_pool_create(f->ctx, &f->spec, &p, &f->pool));
    return f;
}

static void destroy(fixture *f) {
    kvmem_pool_free(f->pool);
    kvmem_context_free(f->ctx);
    free(f);
}

/* KV chunk [L][T][H][D] */
typedef struct chunk {
    int64_t T;
    float *k, *v;
    kvmem_tensor kt, vt;
} chunk;

static chunk make_chunk(const kvmem_model_spec *s, int64_t T, uint64_t *rng) {
    chunk c;
    c.T = T;
    size_t n = (size_t)s->n_layers * (size_t)T * (size_t)s->n_kv_heads * (size_t)s->head_dim;
    c.k = malloc((n ? n : 1) * sizeof(float));
    c.v = malloc((n ? n : 1) * sizeof(float));
    tu_fill_kv(c.k, n, rng);
    tu_fill_kv(c.v, n, rng);
    int64_t shape[4] = {s->n_layers, T, s->n_kv_heads, s->head_dim};
    assert_ok(kvmem_tensor_init(&c.kt, c.k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&c.vt, c.v, KVMEM_F32, 4, shape));
    return c;
}

static void free_chunk(chunk *c) {
    free(c->k);
    free(c->v);
}

static size_t kv_index(const kvmem_model_spec *s, int64_t T, int32_t l, int64_t t, int32_t h, int32_t d) {
    return (((size_t)l * (size_t)T + (size_t)t) * (size_t)s->n_kv_heads + (size_t)h) * (size_t)s->head_dim + (size_t)d;
}

static void pool_params_are_checked(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_model_spec s = tu_spec(2, 8);
    kvmem_pool *pool = NULL;
    kvmem_pool_params p = kvmem_pool_default_params();
    assert_int_equal(p.block_size, 16);
    p.block_size = 0;
    assert_status(kvmem_pool_create(ctx, &s, &p, &pool), KVMEM_ERR_INVALID_ARG,
                  "block size 0: must be a power of two in [1, 4096]");
    p.block_size = 24;
    assert_status(kvmem_pool_create(ctx, &s, &p, &pool), KVMEM_ERR_INVALID_ARG, "block size 24");
    p.block_size = 8192;
    assert_status(kvmem_pool_create(ctx, &s, &p, &pool), KVMEM_ERR_INVALID_ARG, "block size 8192");
    p = kvmem_pool_default_params();
    p.storage_dtype = (kvmem_dtype)42;
    assert_status(kvmem_pool_create(ctx, &s, &p, &pool), KVMEM_ERR_INVALID_ARG, "storage dtype");
    p = kvmem_pool_default_params();
    p.max_agents = -1;
    assert_status(kvmem_pool_create(ctx, &s, &p, &pool), KVMEM_ERR_INVALID_ARG, "max_agents");
    p = kvmem_pool_default_params();
    assert_status(kvmem_pool_create(NULL, &s, &p, &pool), KVMEM_ERR_INVALID_ARG, "context is NULL");
    assert_status(kvmem_pool_create(ctx, NULL, &p, &pool), KVMEM_ERR_INVALID_ARG, "model spec is NULL");
    assert_status(kvmem_pool_create(ctx, &s, &p, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    s.n_q_heads = 3;
    assert_status(kvmem_pool_create(ctx, &s, &p, &pool), KVMEM_ERR_INVALID_ARG, "multiple of n_kv_heads");
    assert_null(pool);
    /* defaults with NULL params */
    s = tu_spec(2, 8);
    int32_t win[2] = {0, 128};
    s.layer_window = win;
    assert_ok(kvmem_pool_create(ctx, &s, NULL, &pool));
    win[1] = 7; /* the pool kept its own copy */
    kvmem_model_spec got;
    assert_ok(kvmem_pool_get_spec(pool, &got));
    assert_int_equal(got.layer_window[1], 128);
    assert_string_equal(got.model_id, s.model_id);
    kvmem_pool_info info;
    assert_ok(kvmem_pool_get_info(pool, &info));
    assert_int_equal(info.block_size, 16);
    assert_int_equal(info.storage_dtype, KVMEM_F16);
    assert_int_equal(info.n_agents, 0);
    assert_status(kvmem_pool_get_info(pool, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    assert_status(kvmem_pool_get_info(NULL, &info), KVMEM_ERR_INVALID_ARG, "pool is NULL");
    kvmem_pool_free(pool);
    kvmem_pool_free(NULL);
    kvmem_context_free(ctx);
}

static void agent_ids(void **state) {
    (void)state;
    fixture *f = make(1, 8, 4, KVMEM_F32, 0);
    const char *good[] = {"a", "agent-1", "A.b_c-9", "x..y", "0"};
    const char *bad[] = {"", ".hidden", "a/b", "../x", "a b", "é", "a\\b", "ab\n"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) assert_true(kvmem_agent_id_valid(good[i]));
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_false(kvmem_agent_id_valid(bad[i]));
        kvmem_agent *a = NULL;
        assert_status(kvmem_agent_open(f->pool, bad[i], &a), KVMEM_ERR_INVALID_ARG, "is invalid");
        assert_null(a);
    }
    char longid[130];
    memset(longid, 'q', 128);
    longid[128] = '\0';
    assert_true(kvmem_agent_id_valid(longid));
    longid[128] = 'q';
    longid[129] = '\0';
    assert_false(kvmem_agent_id_valid(longid));
    assert_false(kvmem_agent_id_valid(NULL));
    kvmem_agent *a = NULL;
    assert_status(kvmem_agent_open(f->pool, NULL, &a), KVMEM_ERR_INVALID_ARG, "agent id is NULL");
    assert_status(kvmem_agent_open(NULL, "a", &a), KVMEM_ERR_INVALID_ARG, "pool is NULL");
    assert_status(kvmem_agent_open(f->pool, "a", NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    kvmem_pool_info info;
    kvmem_pool_get_info(f->pool, &info);
    assert_int_equal(info.n_agents, 0); /* nothing was created by the failures */
    destroy(f);
}

static void open_close_remove_and_listing(void **state) {
    (void)state;
    fixture *f = make(1, 8, 4, KVMEM_F32, 0);
    kvmem_agent *a = NULL, *b = NULL, *c = NULL;
    assert_ok(kvmem_agent_open(f->pool, "zeta", &a));
    assert_ok(kvmem_agent_open(f->pool, "alpha", &b));
    assert_string_equal(kvmem_agent_get_id(a), "zeta");
    assert_status(kvmem_agent_open(f->pool, "zeta", &c), KVMEM_ERR_EXISTS, "already open");
    assert_null(c);
    assert_status(kvmem_pool_remove_agent(f->pool, "zeta"), KVMEM_ERR_BUSY, "close it first");
    /* sorted listing */
    char id[8];
    size_t len = 0;
    assert_ok(kvmem_pool_agent_id(f->pool, 0, id, sizeof id, &len));
    assert_string_equal(id, "alpha");
    assert_int_equal(len, 5);
    assert_ok(kvmem_pool_agent_id(f->pool, 1, id, 3, &len)); /* truncated, full length reported */
    assert_string_equal(id, "ze");
    assert_int_equal(len, 4);
    assert_ok(kvmem_pool_agent_id(f->pool, 1, NULL, 0, &len));
    assert_int_equal(len, 4);
    assert_status(kvmem_pool_agent_id(f->pool, 2, id, sizeof id, &len), KVMEM_ERR_NOT_FOUND, "index 2");
    assert_status(kvmem_pool_agent_id(f->pool, -1, id, sizeof id, &len), KVMEM_ERR_NOT_FOUND, "index -1");
    assert_status(kvmem_pool_agent_id(f->pool, 0, NULL, 4, &len), KVMEM_ERR_INVALID_ARG, "buf is NULL");

    /* memory survives close; reopen sees it */
    uint64_t rng = 3;
    chunk ch = make_chunk(&f->spec, 6, &rng);
    assert_ok(kvmem_agent_append(a, &ch.kt, &ch.vt, NULL));
    kvmem_agent_close(a);
    kvmem_agent_info info;
    /* use after close: a clear error, not a crash */
    assert_status(kvmem_agent_get_info(a, &info), KVMEM_ERR_CLOSED, "closed");
    assert_status(kvmem_agent_append(a, &ch.kt, &ch.vt, NULL), KVMEM_ERR_CLOSED, "closed");
    assert_status(kvmem_agent_flush(a), KVMEM_ERR_CLOSED, "closed");
    assert_string_equal(kvmem_agent_get_id(a), "");
    kvmem_agent_close(a); /* closing twice is harmless */
    assert_ok(kvmem_agent_open(f->pool, "zeta", &a));
    assert_ok(kvmem_agent_get_info(a, &info));
    assert_int_equal(info.n_tokens, 6);
    kvmem_agent_close(a);
    kvmem_pool_info pi;
    assert_ok(kvmem_pool_get_info(f->pool, &pi));
    assert_true(pi.used_bytes > 0);
    assert_ok(kvmem_pool_remove_agent(f->pool, "zeta"));
    assert_status(kvmem_pool_remove_agent(f->pool, "zeta"), KVMEM_ERR_NOT_FOUND, "no agent 'zeta'");
    assert_status(kvmem_pool_remove_agent(f->pool, "../zeta"), KVMEM_ERR_INVALID_ARG, "invalid");
    assert_status(kvmem_pool_remove_agent(NULL, "zeta"), KVMEM_ERR_INVALID_ARG, "pool is NULL");
    assert_ok(kvmem_pool_get_info(f->pool, &pi));
    assert_int_equal(pi.used_bytes, 0);
    assert_int_equal(pi.n_agents, 1);
    assert_ok(kvmem_agent_open(f->pool, "zeta", &a)); /* a new, empty agent */
    assert_ok(kvmem_agent_get_info(a, &info));
    assert_int_equal(info.n_tokens, 0);
    /* many open/close cycles: handles are recycled without growth or crashes */
    for (int i = 0; i < 1000; i++) {
        kvmem_agent_close(a);
        assert_ok(kvmem_agent_open(f->pool, "zeta", &a));
    }
    free_chunk(&ch);
    destroy(f); /* frees open handles a and b too */
    (void)b;
}

/* Append in uneven chunks, then everything reads back: raw for f32,
 * within the storage dtype's rounding otherwise. */
static void append_seal_and_read_back(kvmem_dtype dt, float tol) {
    fixture *f = make(3, 16, 8, dt, 0);
    kvmem_agent *a = NULL;
    assert_ok(kvmem_agent_open(f->pool, "reader", &a));
    uint64_t rng = 11;
    int64_t sizes[] = {5, 3, 0, 17, 1, 8};
    int64_t total = 0;
    for (size_t i = 0; i < 6; i++) total += sizes[i];
    float *all_k = malloc((size_t)total * 3 * 2 * 16 * sizeof(float));
    float *all_v = malloc((size_t)total * 3 * 2 * 16 * sizeof(float));
    int64_t at = 0;
    for (size_t i = 0; i < 6; i++) {
        chunk ch = make_chunk(&f->spec, sizes[i], &rng);
        for (int32_t l = 0; l < 3; l++)
            for (int64_t t = 0; t < sizes[i]; t++)
                for (int32_t h = 0; h < 2; h++)
                    for (int32_t d = 0; d < 16; d++) {
                        all_k[kv_index(&f->spec, total, l, at + t, h, d)] = ch.k[kv_index(&f->spec, sizes[i], l, t, h, d)];
                        all_v[kv_index(&f->spec, total, l, at + t, h, d)] = ch.v[kv_index(&f->spec, sizes[i], l, t, h, d)];
                    }
        int32_t ids[32];
        for (int64_t t = 0; t < sizes[i]; t++) ids[t] = (int32_t)(100 + at + t);
        kvmem_append_params ap = kvmem_append_default_params();
        ap.token_ids = ids;
        assert_ok(kvmem_agent_append(a, &ch.kt, &ch.vt, &ap));
        at += sizes[i];
        free_chunk(&ch);
    }
    kvmem_agent_info info;
    assert_ok(kvmem_agent_get_info(a, &info));
    assert_int_equal(info.n_tokens, total);
    assert_int_equal(info.n_sealed, total / 8);
    assert_int_equal(info.n_blocks, total / 8 + (total % 8 != 0));
    for (int32_t b = 0; b < info.n_blocks; b++) {
        kvmem_block_info bi;
        assert_ok(kvmem_agent_block_info(a, b, &bi));
        assert_int_equal(bi.first_token, (int64_t)b * 8);
        assert_int_equal(bi.sealed, b < info.n_sealed);
    }
    kvmem_block_info bi;
    assert_status(kvmem_agent_block_info(a, info.n_blocks, &bi), KVMEM_ERR_NOT_FOUND, "outside");

    /* read everything back, also through a strided f16 view */
    float *rk = malloc((size_t)total * 3 * 2 * 16 * sizeof(float));
    float *rv = malloc((size_t)total * 3 * 2 * 16 * sizeof(float));
    int64_t shape[4] = {3, total, 2, 16};
    kvmem_tensor tk, tv;
    kvmem_tensor_init(&tk, rk, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&tv, rv, KVMEM_F32, 4, shape);
    assert_ok(kvmem_agent_read(a, 0, total, &tk, &tv));
    for (size_t i = 0; i < (size_t)total * 96; i++) {
        float ek = dt == KVMEM_F32 ? all_k[i] : all_k[i], ev = all_v[i];
        assert_true(fabsf(rk[i] - ek) <= tol * fabsf(ek) + 1e-7f);
        assert_true(fabsf(rv[i] - ev) <= tol * fabsf(ev) + 1e-7f);
    }
    /* a window in the middle, spanning sealed blocks and the tail, into a
     * transposed-strides f16 view [L][T][H][D] with the T axis outermost in memory */
    int64_t first = 6, n = total - 6;
    uint16_t *h16 = malloc((size_t)n * 96 * 2);
    kvmem_tensor tt;
    memset(&tt, 0, sizeof tt);
    tt.data = h16;
    tt.dtype = KVMEM_F16;
    tt.ndim = 4;
    tt.shape[0] = 3; tt.shape[1] = n; tt.shape[2] = 2; tt.shape[3] = 16;
    tt.strides[1] = 96; tt.strides[0] = 32; tt.strides[2] = 16; tt.strides[3] = 1;
    assert_ok(kvmem_agent_read(a, first, n, &tt, NULL));
    float back[1];
    for (int32_t l = 0; l < 3; l++)
        for (int64_t t = 0; t < n; t++)
            for (int32_t h = 0; h < 2; h++)
                for (int32_t d = 0; d < 16; d++) {
                    kvm_convert_host(back, KVMEM_F32, &h16[t * 96 + l * 32 + h * 16 + d], KVMEM_F16, 1);
                    float e = all_k[kv_index(&f->spec, total, l, first + t, h, d)];
                    assert_true(fabsf(back[0] - e) <= (tol + 1e-3f) * fabsf(e) + 1e-4f);
                }
    int32_t ids[64];
    assert_ok(kvmem_agent_tokens(a, 0, total, ids));
    for (int64_t t = 0; t < total; t++) assert_int_equal(ids[t], 100 + t);
    /* bad reads change nothing and say why */
    assert_status(kvmem_agent_read(a, -1, 2, &tk, NULL), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(kvmem_agent_read(a, 0, total + 1, &tk, NULL), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(kvmem_agent_read(a, 1, total, &tk, NULL), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(kvmem_agent_read(a, 0, 2, &tk, NULL), KVMEM_ERR_INVALID_ARG, "does not match");
    assert_status(kvmem_agent_tokens(a, 0, total + 1, ids), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(kvmem_agent_tokens(a, 0, 1, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    free(h16);
    free(rk);
    free(rv);
    free(all_k);
    free(all_v);
    destroy(f);
}

static void read_back_f32(void **state) { (void)state; append_seal_and_read_back(KVMEM_F32, 0.0f); }
static void read_back_f16(void **state) { (void)state; append_seal_and_read_back(KVMEM_F16, 1.0f / 1024); }
static void read_back_bf16(void **state) { (void)state; append_seal_and_read_back(KVMEM_BF16, 1.0f / 128); }

static void aabb_contains_every_key(void **state) {
    (void)state;
    kvmem_dtype dts[3] = {KVMEM_F32, KVMEM_F16, KVMEM_BF16};
    for (int di = 0; di < 3; di++) {
        fixture *f = make(2, 24, 16, dts[di], 0);
        kvmem_agent *a = NULL;
        assert_ok(kvmem_agent_open(f->pool, "boxes", &a));
        uint64_t rng = 21 + (uint64_t)di;
        chunk ch = make_chunk(&f->spec, 53, &rng);
        assert_ok(kvmem_agent_append(a, &ch.kt, &ch.vt, NULL));
        assert_ok(kvmem_agent_flush(a)); /* the 5-token tail becomes a short sealed block */
        kvmem_agent_info info;
        kvmem_agent_get_info(a, &info);
        assert_int_equal(info.n_sealed, 4);
        assert_int_equal(info.n_blocks, 4);
        float mn[2 * 2 * 24], mx[2 * 2 * 24];
        for (int32_t b = 0; b < 4; b++) {
            kvmem_block_info bi;
            assert_ok(kvmem_agent_block_info(a, b, &bi));
            assert_ok(kvmem_agent_block_aabb(a, b, mn, mx));
            for (int32_t l = 0; l < 2; l++)
                for (int32_t h = 0; h < 2; h++)
                    for (int32_t d = 0; d < 24; d++) {
                        size_t o = ((size_t)l * 2 + (size_t)h) * 24 + (size_t)d;
                        double lo = INFINITY, hi = -INFINITY;
                        for (int64_t t = bi.first_token; t < bi.first_token + bi.n_tokens; t++) {
                            float k = ch.k[kv_index(&f->spec, 53, l, t, h, d)];
                            assert_true(mn[o] <= k && k <= mx[o]); /* min <= k <= max */
                            lo = fmin(lo, k);
                            hi = fmax(hi, k);
                        }
                        /* and tight: exact f32 for F32/BF16 pools; F16 pools keep f16 boxes rounded
                         * outward, the nearest f16 values below the minimum and above the maximum */
                        if (dts[di] == KVMEM_F16)
                            assert_true(mn[o] == (float)tu_f16_below(lo) && mx[o] == (float)tu_f16_above(hi));
                        else
                            assert_true(mn[o] == (float)lo && mx[o] == (float)hi);
                    }
        }
        assert_status(kvmem_agent_block_aabb(a, 4, mn, mx), KVMEM_ERR_NOT_FOUND, "not a sealed block");
        assert_status(kvmem_agent_block_aabb(a, 0, NULL, mx), KVMEM_ERR_INVALID_ARG, "out_min is NULL");
        /* a new append after flush starts a new block */
        assert_ok(kvmem_agent_append(a, &ch.kt, &ch.vt, NULL));
        kvmem_block_info bi;
        assert_ok(kvmem_agent_block_info(a, 4, &bi));
        assert_int_equal(bi.first_token, 53);
        free_chunk(&ch);
        destroy(f);
    }
}

static void post_rope_keys_are_derotated(void **state) {
    (void)state;
    kvmem_rope_style styles[2] = {KVMEM_ROPE_NEOX, KVMEM_ROPE_GPTJ};
    for (int si = 0; si < 2; si++) {
        fixture *f = calloc(1, sizeof *f);
        f->ctx = tu_context(2);
        f->spec = tu_spec(2, 32);
        f->spec.rope_style = styles[si];
        f->spec.rotary_dim = si ? 16 : 0;
        f->spec.rope_scaling = KVMEM_ROPE_SCALING_LLAMA3;
        f->spec.rope_factor = 8;
        f->spec.rope_theta = 500000.0;
        kvmem_pool_params pp = kvmem_pool_default_params();
        pp.storage_dtype = KVMEM_F32;
        assert_ok(kvmem_pool_create(f->ctx, &f->spec, &pp, &f->pool));
        kvmem_agent *a = NULL;
        assert_ok(kvmem_agent_open(f->pool, "rot", &a));
        uint64_t rng = 5;
        chunk ch = make_chunk(&f->spec, 40, &rng);
        float *raw = malloc(2 * 40 * 2 * 32 * sizeof(float));
        memcpy(raw, ch.k, 2 * 40 * 2 * 32 * sizeof(float));
        int32_t pos[40];
        for (int i = 0; i < 40; i++) pos[i] = 1000 + 37 * i; /* arbitrary, non-contiguous */
        /* rotate as an engine would: each row at its token's position */
        for (int32_t l = 0; l < 2; l++)
            for (int t = 0; t < 40; t++) {
                int32_t pp2[2] = {pos[t], pos[t]};
                assert_ok(kvmem_rope_apply(&f->spec, &ch.k[kv_index(&f->spec, 40, l, t, 0, 0)], 2, 32, pp2, 0));
            }
        kvmem_append_params ap = kvmem_append_default_params();
        ap.keys_rotated = 1;
        ap.positions = pos;
        assert_ok(kvmem_agent_append(a, &ch.kt, &ch.vt, &ap));
        float *back = malloc(2 * 40 * 2 * 32 * sizeof(float));
        int64_t shape[4] = {2, 40, 2, 32};
        kvmem_tensor bt;
        kvmem_tensor_init(&bt, back, KVMEM_F32, 4, shape);
        assert_ok(kvmem_agent_read(a, 0, 40, &bt, NULL));
        double worst = 0;
        for (size_t i = 0; i < 2 * 40 * 2 * 32; i++) worst = fmax(worst, fabs(back[i] - raw[i]) / (1.0 + fabs(raw[i])));
        assert_true(worst < 4e-6); /* float rounding, not an approximation */
        /* positions without keys_rotated, and the reverse, are refused */
        ap.keys_rotated = 0;
        assert_status(kvmem_agent_append(a, &ch.kt, &ch.vt, &ap), KVMEM_ERR_INVALID_ARG, "keys_rotated is 0");
        ap.keys_rotated = 1;
        ap.positions = NULL;
        assert_status(kvmem_agent_append(a, &ch.kt, &ch.vt, &ap), KVMEM_ERR_INVALID_ARG, "positions is NULL");
        free(back);
        free(raw);
        free_chunk(&ch);
        destroy(f);
    }
}

/* Snapshot of everything observable about an agent, to prove failed calls change nothing. */
typedef struct snapshot {
    kvmem_agent_info info;
    kvmem_pool_info pool;
    float k[4 * 2 * 8 * 1];
} snapshot;

static snapshot snap(kvmem_pool *p, kvmem_agent *a) {
    snapshot s;
    memset(&s, 0, sizeof s);
    assert_ok(kvmem_agent_get_info(a, &s.info));
    assert_ok(kvmem_pool_get_info(p, &s.pool));
    int64_t n = s.info.n_tokens < 4 ? s.info.n_tokens : 4;
    int64_t shape[4] = {1, n, 2, 8};
    kvmem_tensor t;
    kvmem_tensor_init(&t, s.k, KVMEM_F32, 4, shape);
    if (n) assert_ok(kvmem_agent_read(a, s.info.n_tokens - n, n, &t, NULL));
    return s;
}

static void bad_appends_change_nothing(void **state) {
    (void)state;
    fixture *f = make(1, 8, 4, KVMEM_F16, 0);
    kvmem_agent *a = NULL;
    assert_ok(kvmem_agent_open(f->pool, "guarded", &a));
    uint64_t rng = 9;
    chunk ch = make_chunk(&f->spec, 6, &rng);
    assert_ok(kvmem_agent_append(a, &ch.kt, &ch.vt, NULL)); /* 1 sealed block + 2 in the tail */
    snapshot before = snap(f->pool, a);

    chunk bad = make_chunk(&f->spec, 7, &rng);
    kvmem_tensor t = bad.kt;
    assert_status(kvmem_agent_append(NULL, &bad.kt, &bad.vt, NULL), KVMEM_ERR_INVALID_ARG, "agent is NULL");
    assert_status(kvmem_agent_append(a, NULL, &bad.vt, NULL), KVMEM_ERR_INVALID_ARG, "K is NULL");
    assert_status(kvmem_agent_append(a, &bad.kt, NULL, NULL), KVMEM_ERR_INVALID_ARG, "V is NULL");
    t.dtype = KVMEM_Q8;
    assert_status(kvmem_agent_append(a, &t, &bad.vt, NULL), KVMEM_ERR_INVALID_ARG, "dtype");
    t = bad.kt;
    t.shape[3] = 16;
    assert_status(kvmem_agent_append(a, &t, &bad.vt, NULL), KVMEM_ERR_INVALID_ARG, "does not match");
    t = bad.kt;
    t.ndim = 3;
    assert_status(kvmem_agent_append(a, &t, &bad.vt, NULL), KVMEM_ERR_INVALID_ARG, "expected 4");
    t = bad.kt;
    t.shape[0] = 2;
    assert_status(kvmem_agent_append(a, &t, &bad.vt, NULL), KVMEM_ERR_INVALID_ARG, "[n_layers]");
    kvmem_tensor v2 = bad.vt;
    v2.shape[1] = 6;
    assert_status(kvmem_agent_append(a, &bad.kt, &v2, NULL), KVMEM_ERR_INVALID_ARG, "V: shape");
    t = bad.kt;
    t.data = NULL;
    assert_status(kvmem_agent_append(a, &t, &bad.vt, NULL), KVMEM_ERR_INVALID_ARG, "data is NULL");
    t = bad.kt;
    t.strides[2] = -8;
    assert_status(kvmem_agent_append(a, &t, &bad.vt, NULL), KVMEM_ERR_INVALID_ARG, "negative");
    t = bad.kt;
    t.shape[1] = (int64_t)1 << 40;
    assert_status(kvmem_agent_append(a, &t, &bad.vt, NULL), KVMEM_ERR_INVALID_ARG, "out of range");

    /* non-finite values anywhere, even in the last token of the last layer */
    bad.k[7 * 16 - 1] = NAN;
    assert_status(kvmem_agent_append(a, &bad.kt, &bad.vt, NULL), KVMEM_ERR_INVALID_ARG, "K at layer 0, token 6: non-finite");
    bad.k[7 * 16 - 1] = 0;
    bad.v[3] = INFINITY;
    assert_status(kvmem_agent_append(a, &bad.kt, &bad.vt, NULL), KVMEM_ERR_INVALID_ARG, "V at layer 0, token 0: non-finite");
    bad.v[3] = 0;
    bad.k[20] = 1e6f; /* finite, but Inf once stored as f16 */
    assert_status(kvmem_agent_append(a, &bad.kt, &bad.vt, NULL), KVMEM_ERR_INVALID_ARG, "exceeds the f16 storage range");
    bad.k[20] = 0;

    kvmem_append_params ap = kvmem_append_default_params();
    ap.text_len = 5;
    assert_status(kvmem_agent_append(a, &bad.kt, &bad.vt, &ap), KVMEM_ERR_INVALID_ARG, "text is NULL");
    int32_t offs[7] = {0, 1, 2, 1, 3, 4, 5};
    ap.text = "abcdef";
    ap.text_len = 6;
    ap.token_text_offsets = offs;
    assert_status(kvmem_agent_append(a, &bad.kt, &bad.vt, &ap), KVMEM_ERR_INVALID_ARG, "non-decreasing");
    offs[3] = 2;
    offs[6] = 7;
    assert_status(kvmem_agent_append(a, &bad.kt, &bad.vt, &ap), KVMEM_ERR_INVALID_ARG, "within text_len");
    ap = kvmem_append_default_params();
    ap.keys_rotated = 2;
    assert_status(kvmem_agent_append(a, &bad.kt, &bad.vt, &ap), KVMEM_ERR_INVALID_ARG, "keys_rotated must be 0 or 1");

    snapshot after = snap(f->pool, a);
    assert_memory_equal(&before, &after, sizeof before);

    /* and the agent still works */
    offs[6] = 6;
    ap = kvmem_append_default_params();
    ap.text = "abcdef";
    ap.text_len = 6;
    ap.token_text_offsets = offs;
    assert_ok(kvmem_agent_append(a, &bad.kt, &bad.vt, &ap));
    const char *text;
    size_t len;
    assert_ok(kvmem_agent_text(a, &text, &len));
    assert_int_equal(len, 6);
    assert_memory_equal(text, "abcdef", 6);
    assert_status(kvmem_agent_text(a, NULL, &len), KVMEM_ERR_INVALID_ARG, "text is NULL");
    free_chunk(&ch);
    free_chunk(&bad);
    destroy(f);
}

static void capacity_refuses_without_dropping(void **state) {
    (void)state;
    /* room for exactly two 4-token blocks plus the f32 tail staging */
    const size_t L = 1, H = 2, D = 8, BS = 4;
    uint64_t block = 2 * L * H * BS * D * 2 + 2 * L * H * D * 2; /* f16 KV + f16 AABB */
    uint64_t tail = 2 * L * H * BS * D * 4;
    fixture *f = make(1, 8, 4, KVMEM_F16, 2 * block + tail);
    kvmem_agent *a = NULL, *b = NULL;
    assert_ok(kvmem_agent_open(f->pool, "a", &a));
    assert_ok(kvmem_agent_open(f->pool, "b", &b));
    uint64_t rng = 13;
    chunk ch = make_chunk(&f->spec, 8, &rng);
    assert_ok(kvmem_agent_append(a, &ch.kt, &ch.vt, NULL));
    kvmem_pool_info pi;
    kvmem_pool_get_info(f->pool, &pi);
    assert_int_equal(pi.used_bytes, 2 * block + tail);
    snapshot before = snap(f->pool, a);
    chunk one = make_chunk(&f->spec, 1, &rng), four = make_chunk(&f->spec, 4, &rng);
    /* a token that fits the existing tail needs no memory; a full block does */
    assert_status(kvmem_agent_append(a, &four.kt, &four.vt, NULL), KVMEM_ERR_CAPACITY, "nothing was appended");
    assert_status(kvmem_agent_append(b, &one.kt, &one.vt, NULL), KVMEM_ERR_CAPACITY, "pool capacity");
    snapshot after = snap(f->pool, a);
    assert_memory_equal(&before, &after, sizeof before);
    kvmem_agent_info bi;
    kvmem_agent_get_info(b, &bi);
    assert_int_equal(bi.n_tokens, 0);
    /* freeing an agent makes room */
    kvmem_agent_close(a);
    assert_ok(kvmem_pool_remove_agent(f->pool, "a"));
    assert_ok(kvmem_agent_append(b, &one.kt, &one.vt, NULL));
    free_chunk(&ch);
    free_chunk(&one);
    free_chunk(&four);
    destroy(f);

    /* max_agents and max_tokens_per_agent */
    kvmem_context *ctx = tu_context(1);
    kvmem_model_spec s = tu_spec(1, 8);
    kvmem_pool_params p = kvmem_pool_default_params();
    p.max_agents = 1;
    p.max_tokens_per_agent = 5;
    kvmem_pool *pool;
    assert_ok(kvmem_pool_create(ctx, &s, &p, &pool));
    assert_ok(kvmem_agent_open(pool, "one", &a));
    assert_status(kvmem_agent_open(pool, "two", &b), KVMEM_ERR_CAPACITY, "max_agents");
    chunk six = make_chunk(&s, 6, &rng);
    assert_status(kvmem_agent_append(a, &six.kt, &six.vt, NULL), KVMEM_ERR_CAPACITY, "max_tokens_per_agent 5");
    free_chunk(&six);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
}

static void null_outputs_and_handles_are_refused(void **state) {
    (void)state;
    fixture *f = make(1, 8, 4, KVMEM_F32, 0);
    kvmem_agent *a = NULL;
    assert_ok(kvmem_agent_open(f->pool, "nulls", &a));
    assert_status(kvmem_pool_get_spec(f->pool, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    assert_status(kvmem_pool_get_spec(NULL, NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_agent_get_info(a, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    assert_status(kvmem_agent_get_info(NULL, NULL), KVMEM_ERR_INVALID_ARG, "agent is NULL");
    assert_status(kvmem_agent_block_info(a, 0, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    kvmem_block_info bi;
    assert_status(kvmem_agent_block_info(a, 0, &bi), KVMEM_ERR_NOT_FOUND, "block 0 outside [0, 0)");
    assert_status(kvmem_agent_flush(NULL), KVMEM_ERR_INVALID_ARG, "agent is NULL");
    assert_ok(kvmem_agent_flush(a)); /* nothing to seal */
    float m[16];
    assert_status(kvmem_agent_block_aabb(NULL, 0, m, m), KVMEM_ERR_INVALID_ARG, "agent is NULL");
    assert_status(kvmem_agent_read(NULL, 0, 0, NULL, NULL), KVMEM_ERR_INVALID_ARG, "agent is NULL");
    assert_ok(kvmem_agent_read(a, 0, 0, NULL, NULL)); /* empty range, nothing asked */
    int32_t ids[1];
    assert_status(kvmem_agent_tokens(NULL, 0, 0, ids), KVMEM_ERR_INVALID_ARG, "agent is NULL");
    const char *text;
    size_t len;
    assert_ok(kvmem_agent_text(a, &text, &len));
    assert_int_equal(len, 0);
    assert_string_equal(kvmem_agent_get_id(NULL), "");
    /* a pointer that is not an agent handle is recognised as such */
    int32_t junk[8] = {0};
    assert_status(kvmem_agent_get_info((kvmem_agent *)(void *)junk, &(kvmem_agent_info){0}), KVMEM_ERR_INVALID_ARG,
                  "not an agent handle");
    kvmem_agent_close(a);
    assert_status(kvmem_agent_text(a, &text, &len), KVMEM_ERR_CLOSED, "closed");
    assert_status(kvmem_agent_read(a, 0, 0, NULL, NULL), KVMEM_ERR_CLOSED, "closed");
    assert_status(kvmem_agent_tokens(a, 0, 0, ids), KVMEM_ERR_CLOSED, "closed");
    assert_status(kvmem_agent_block_aabb(a, 0, m, m), KVMEM_ERR_CLOSED, "closed");
    assert_status(kvmem_agent_block_info(a, 0, &bi), KVMEM_ERR_CLOSED, "closed");
    kvmem_agent_close(NULL);
    destroy(f);
}

/* The VmFlags line of the mapping in /proc/self/smaps holding addr (the
 * kernel's own record of the advice), into flags: 1 if found, 0 if not,
 * -1 without a readable /proc/self/smaps. */
static int vm_flags_of(const void *addr, char *flags, size_t n) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int in = 0, found = 0;
    const uintptr_t a = (uintptr_t)addr;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) in = a >= lo && a < hi; /* a mapping's first line */
        else if (in && strncmp(line, "VmFlags:", 8) == 0) {
            snprintf(flags, n, "%s", line + 8);
            found = 1;
        }
    }
    fclose(f);
    return found;
}

/* Buffers of 2 MiB and more start on a 2 MiB boundary, and the kernel
 * records the huge-page advice ("hg") for their whole 2 MiB pages; smaller
 * ones keep the 64-byte alignment; both hold what is written. */
static void large_buffers_start_on_huge_pages(void **state) {
    (void)state;
    const size_t mib2 = (size_t)2 << 20, sizes[] = {mib2, mib2 * 2 + 4096, 4096 + 64};
    for (size_t i = 0; i < 3; i++) {
        unsigned char *p = kvm_huge_alloc(sizes[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        memset(p, 0x5a, sizes[i]);
        for (size_t o = 0; o < sizes[i]; o += 4093) assert_int_equal(p[o], 0x5a);
#if defined(__linux__)
        if (sizes[i] >= mib2) {
            assert_int_equal((uintptr_t)p % mib2, 0);
            char flags[512] = "";
            FILE *thp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
            const int first = thp ? vm_flags_of(p, flags, sizeof flags) : -1;
            if (thp) fclose(thp);
            if (first < 0) {
                print_message("skipped (huge-page advice): %s\n", !thp ? "this kernel has no transparent huge pages"
                                                                        : "no /proc/self/smaps to read it from");
            } else {
                assert_int_equal(first, 1);
                assert_non_null(strstr(flags, " hg"));
                assert_int_equal(vm_flags_of(p + (sizes[i] & ~(mib2 - 1)) - 1, flags, sizeof flags), 1);
                assert_non_null(strstr(flags, " hg"));
            }
        }
#endif
        kvm_free(p);
    }
}

static void agents_are_isolated(void **state) {
    (void)state;
    fixture *f = make(1, 8, 4, KVMEM_F32, 0);
    kvmem_agent *a = NULL, *b = NULL;
    assert_ok(kvmem_agent_open(f->pool, "a", &a));
    assert_ok(kvmem_agent_open(f->pool, "b", &b));
    uint64_t rng = 17;
    chunk ca = make_chunk(&f->spec, 9, &rng), cb = make_chunk(&f->spec, 3, &rng);
    assert_ok(kvmem_agent_append(a, &ca.kt, &ca.vt, NULL));
    assert_ok(kvmem_agent_append(b, &cb.kt, &cb.vt, NULL));
    kvmem_agent_info ia, ib;
    kvmem_agent_get_info(a, &ia);
    kvmem_agent_get_info(b, &ib);
    assert_int_equal(ia.n_tokens, 9);
    assert_int_equal(ib.n_tokens, 3);
    /* b cannot read past its own 3 tokens, even though a has 9 */
    float out[16 * 4];
    int64_t shape[4] = {1, 4, 2, 8};
    kvmem_tensor t;
    kvmem_tensor_init(&t, out, KVMEM_F32, 4, shape);
    assert_status(kvmem_agent_read(b, 0, 4, &t, NULL), KVMEM_ERR_INVALID_ARG, "outside [0, 3)");
    shape[1] = 3;
    kvmem_tensor_init(&t, out, KVMEM_F32, 4, shape);
    assert_ok(kvmem_agent_read(b, 0, 3, &t, NULL));
    assert_memory_equal(out, cb.k, 3 * 16 * sizeof(float));
    free_chunk(&ca);
    free_chunk(&cb);
    destroy(f);
}

/* Ranges whose end does not fit int64 are refused like any other range
 * outside the agent, with a message that states them (formatting the end as
 * first + n overflowed: undefined behaviour, which UBSan stops on). */
static void ranges_past_int64_are_refused_with_a_message(void **state) {
    (void)state;
    fixture *f = make(1, 8, 4, KVMEM_F32, 0);
    kvmem_agent *a = NULL;
    assert_ok(kvmem_agent_open(f->pool, "a", &a));
    uint64_t rng = 5;
    chunk c = make_chunk(&f->spec, 6, &rng);
    assert_ok(kvmem_agent_append(a, &c.kt, &c.vt, NULL));
    float out[16];
    int64_t shape[4] = {1, 1, 2, 8};
    kvmem_tensor t;
    kvmem_tensor_init(&t, out, KVMEM_F32, 4, shape);
    assert_status(kvmem_agent_read(a, INT64_MAX, 1, &t, NULL), KVMEM_ERR_INVALID_ARG,
                  "[9223372036854775807, 9223372036854775807 + 1) outside [0, 6)");
    assert_status(kvmem_agent_read(a, 1, INT64_MAX, &t, NULL), KVMEM_ERR_INVALID_ARG, "outside [0, 6)");
    assert_status(kvmem_agent_read(a, INT64_MIN, -1, &t, NULL), KVMEM_ERR_INVALID_ARG, "outside [0, 6)");
    int32_t ids[4];
    assert_status(kvmem_agent_tokens(a, 1, INT64_MAX, ids), KVMEM_ERR_INVALID_ARG,
                  "[1, 1 + 9223372036854775807) outside [0, 6)");
    assert_status(kvmem_agent_tokens(a, INT64_MAX, INT64_MAX, ids), KVMEM_ERR_INVALID_ARG, "outside [0, 6)");
    assert_status(kvmem_agent_tokens(a, INT64_MIN, INT64_MIN, ids), KVMEM_ERR_INVALID_ARG, "outside [0, 6)");
    /* the agent is as it was */
    assert_ok(kvmem_agent_tokens(a, 0, 4, ids));
    kvmem_agent_close(a);
    free_chunk(&c);
    destroy(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pool_params_are_checked),
        cmocka_unit_test(ranges_past_int64_are_refused_with_a_message),
        cmocka_unit_test(agent_ids),
        cmocka_unit_test(open_close_remove_and_listing),
        cmocka_unit_test(read_back_f32),
        cmocka_unit_test(read_back_f16),
        cmocka_unit_test(read_back_bf16),
        cmocka_unit_test(aabb_contains_every_key),
        cmocka_unit_test(post_rope_keys_are_derotated),
        cmocka_unit_test(bad_appends_change_nothing),
        cmocka_unit_test(capacity_refuses_without_dropping),
        cmocka_unit_test(null_outputs_and_handles_are_refused),
        cmocka_unit_test(agents_are_isolated),
        cmocka_unit_test(large_buffers_start_on_huge_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
