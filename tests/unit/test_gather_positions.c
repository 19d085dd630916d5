/* kvmem_gather: blocks concatenated in the given order, keys equal to the
 * raw keys rotated at the new positions (checked against kvmem_agent_read +
 * kvmem_rope_apply, and against a from-scratch double rotation), values
 * unchanged, every output dtype and strided views; bad input. */
#include "testutil.h"
#include "cpu/half.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct env {
    kvmem_context *ctx;
    kvmem_pool *pool;
    kvmem_agent *ag;
    kvmem_model_spec spec;
} env;

static void make(env *e, kvmem_model_spec spec, kvmem_dtype storage, int32_t bs) {
    e->ctx = tu_context(2);
    e->spec = spec;
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = bs;
    pp.storage_dtype = storage;
    assert_ok(kvmem_pool_create(e->ctx, &e->spec, &pp, &e->pool));
    assert_ok(kvmem_agent_open(e->pool, "g", &e->ag));
    const int L = spec.n_layers, H = spec.n_kv_heads, D = spec.head_dim;
    const int lens[3] = {3 * bs, bs / 2, 2 * bs + 1}; /* flush -> a partial block in the middle */
    uint64_t rng = 31;
    for (int t = 0; t < 3; t++) {
        size_t n = (size_t)L * (size_t)lens[t] * (size_t)H * (size_t)D;
        float *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
        tu_fill_kv(k, n, &rng);
        tu_fill_kv(v, n, &rng);
        int64_t sh[4] = {L, lens[t], H, D};
        kvmem_tensor kt, vt;
        assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh));
        assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 4, sh));
        assert_ok(kvmem_agent_append(e->ag, &kt, &vt, NULL));
        if (t == 1) assert_ok(kvmem_agent_flush(e->ag));
        free(k);
        free(v);
    }
}

static void unmake(env *e) {
    kvmem_agent_close(e->ag);
    kvmem_pool_free(e->pool);
    kvmem_context_free(e->ctx);
}

/* Expected K and V of a gather, from the public read path and rope_apply. */
static void expected(env *e, const int32_t *blocks, int n, int64_t base, float *ek, float *ev, int64_t *M_out) {
    const int L = e->spec.n_layers, H = e->spec.n_kv_heads, D = e->spec.head_dim;
    int64_t M = 0;
    for (int i = 0; i < n; i++) {
        kvmem_block_info bi;
        assert_ok(kvmem_agent_block_info(e->ag, blocks[i], &bi));
        M += bi.n_tokens;
    }
    int64_t row = 0;
    for (int i = 0; i < n; i++) {
        kvmem_block_info bi;
        assert_ok(kvmem_agent_block_info(e->ag, blocks[i], &bi));
        size_t cnt = (size_t)L * (size_t)bi.n_tokens * (size_t)H * (size_t)D;
        float *k = malloc(cnt * sizeof(float)), *v = malloc(cnt * sizeof(float));
        int64_t sh[4] = {L, bi.n_tokens, H, D};
        kvmem_tensor kt, vt;
        assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh));
        assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 4, sh));
        assert_ok(kvmem_agent_read(e->ag, bi.first_token, bi.n_tokens, &kt, &vt));
        int32_t *pos = malloc((size_t)bi.n_tokens * (size_t)H * sizeof(int32_t));
        for (int t = 0; t < bi.n_tokens; t++)
            for (int h = 0; h < H; h++) pos[t * H + h] = (int32_t)(base + row + t);
        for (int l = 0; l < L; l++)
            assert_ok(kvmem_rope_apply(&e->spec, k + (size_t)l * (size_t)bi.n_tokens * (size_t)H * (size_t)D,
                                       (size_t)bi.n_tokens * (size_t)H, (size_t)D, pos, 0));
        for (int l = 0; l < L; l++)
            for (int t = 0; t < bi.n_tokens; t++) {
                size_t src = ((size_t)l * (size_t)bi.n_tokens + (size_t)t) * (size_t)H * (size_t)D;
                size_t dst = ((size_t)l * (size_t)M + (size_t)(row + t)) * (size_t)H * (size_t)D;
                memcpy(ek + dst, k + src, (size_t)H * (size_t)D * sizeof(float));
                memcpy(ev + dst, v + src, (size_t)H * (size_t)D * sizeof(float));
            }
        row += bi.n_tokens;
        free(k);
        free(v);
        free(pos);
    }
    *M_out = M;
}

static void gathered_keys_are_raw_keys_rotated_at_new_positions(void **state) {
    (void)state;
    kvmem_model_spec specs[4];
    specs[0] = tu_spec(2, 32); /* NEOX */
    specs[1] = tu_spec(3, 16);
    specs[1].rope_style = KVMEM_ROPE_GPTJ;
    specs[1].rotary_dim = 8;
    specs[2] = tu_spec(1, 64);
    specs[2].rope_scaling = KVMEM_ROPE_SCALING_LLAMA3;
    specs[2].rope_factor = 8;
    specs[2].rope_theta = 500000;
    specs[3] = tu_spec(2, 32);
    specs[3].rope_scaling = KVMEM_ROPE_SCALING_YARN;
    specs[3].rope_factor = 4;
    specs[3].rope_original_max_pos = 1024;
    for (int si = 0; si < 4; si++) {
        env e;
        make(&e, specs[si], si == 1 ? KVMEM_F16 : KVMEM_F32, 8);
        const int32_t blocks[] = {4, 0, 3, 5, 0}; /* any order, repeats allowed; block 3 is partial */
        const int64_t bases[] = {0, 77, 100000};
        const int L = e.spec.n_layers, H = e.spec.n_kv_heads, D = e.spec.head_dim;
        for (int bi = 0; bi < 3; bi++) {
            int64_t M = 0;
            size_t cap = (size_t)L * 64 * (size_t)H * (size_t)D;
            float *ek = malloc(cap * sizeof(float)), *ev = malloc(cap * sizeof(float));
            expected(&e, blocks, 5, bases[bi], ek, ev, &M);
            assert_int_equal(M, 8 + 8 + 4 + 8 + 8);
            size_t n = (size_t)L * (size_t)M * (size_t)H * (size_t)D;
            float *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
            int64_t sh[4] = {L, M, H, D};
            kvmem_tensor kt, vt;
            assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh));
            assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 4, sh));
            assert_ok(kvmem_gather(e.ag, blocks, 5, bases[bi], &kt, &vt));
            /* same rotation code path on the same stored rows: bit-exact */
            for (size_t i = 0; i < n; i++) {
                if (k[i] != ek[i]) fail_msg("spec %d base %lld: K[%zu] = %.9g, expected %.9g", si, (long long)bases[bi], i, (double)k[i], (double)ek[i]);
                if (v[i] != ev[i]) fail_msg("spec %d: V[%zu] = %.9g, expected %.9g", si, i, (double)v[i], (double)ev[i]);
            }
            free(k);
            free(v);
            free(ek);
            free(ev);
        }
        unmake(&e);
    }
}

/* Independent of kvmem_rope_apply: rotate in double by hand (NEOX, no scaling). */
static void gather_matches_a_hand_rotation(void **state) {
    (void)state;
    env e;
    make(&e, tu_spec(1, 8), KVMEM_F32, 4);
    const int32_t blocks[] = {2};
    float k[4 * 2 * 8];
    int64_t sh[4] = {1, 4, 2, 8};
    kvmem_tensor kt;
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh));
    assert_ok(kvmem_gather(e.ag, blocks, 1, 1000, &kt, NULL));
    float raw[4 * 2 * 8];
    kvmem_tensor rt;
    assert_ok(kvmem_tensor_init(&rt, raw, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_read(e.ag, 8, 4, &rt, NULL));
    for (int t = 0; t < 4; t++)
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++) {
                double f = pow(10000.0, -2.0 * j / 8), a = (1000 + t) * f;
                const float *x = raw + (t * 2 + h) * 8;
                double y0 = x[j] * cos(a) - x[j + 4] * sin(a), y1 = x[j + 4] * cos(a) + x[j] * sin(a);
                assert_true(fabs(k[(t * 2 + h) * 8 + j] - y0) < 1e-5);
                assert_true(fabs(k[(t * 2 + h) * 8 + j + 4] - y1) < 1e-5);
            }
    unmake(&e);
}

static void output_dtypes_and_strided_views(void **state) {
    (void)state;
    env e;
    make(&e, tu_spec(2, 16), KVMEM_F32, 8);
    const int32_t blocks[] = {1, 2};
    int64_t M = 0;
    const size_t L = 2, H = 2, D = 16;
    float *ek = malloc(L * 64 * H * D * sizeof(float)), *ev = malloc(L * 64 * H * D * sizeof(float));
    expected(&e, blocks, 2, 5, ek, ev, &M);
    assert_int_equal(M, 16);
    const size_t n = L * (size_t)M * H * D;
    for (int dt = 1; dt <= 2; dt++) {
        /* a strided view: every head row padded to 24 elements */
        uint16_t *k = malloc(L * (size_t)M * H * 24 * 2), *v = malloc(L * (size_t)M * H * 24 * 2);
        memset(k, 0xab, L * (size_t)M * H * 24 * 2);
        int64_t sh[4] = {(int64_t)L, M, (int64_t)H, (int64_t)D};
        kvmem_tensor kt, vt;
        assert_ok(kvmem_tensor_init(&kt, k, (kvmem_dtype)dt, 4, sh));
        assert_ok(kvmem_tensor_init(&vt, v, (kvmem_dtype)dt, 4, sh));
        kt.strides[2] = vt.strides[2] = 24;
        kt.strides[1] = vt.strides[1] = 24 * (int64_t)H;
        kt.strides[0] = vt.strides[0] = 24 * (int64_t)H * M;
        assert_ok(kvmem_gather(e.ag, blocks, 2, 5, &kt, &vt));
        for (size_t i = 0; i < n; i++) {
            size_t row = i / D, d = i % D;
            uint16_t want_k = dt == KVMEM_F16 ? kvm_f32_to_f16(ek[i]) : kvm_f32_to_bf16(ek[i]);
            uint16_t want_v = dt == KVMEM_F16 ? kvm_f32_to_f16(ev[i]) : kvm_f32_to_bf16(ev[i]);
            assert_int_equal(k[row * 24 + d], want_k);
            assert_int_equal(v[row * 24 + d], want_v);
        }
        for (size_t row = 0; row < n / D; row++)
            for (size_t d = D; d < 24; d++) assert_int_equal(k[row * 24 + d], 0xabab); /* gaps untouched */
        free(k);
        free(v);
    }
    free(ek);
    free(ev);
    unmake(&e);
}

static void bad_gather_calls_fail_and_write_nothing(void **state) {
    (void)state;
    env e;
    make(&e, tu_spec(2, 16), KVMEM_F16, 8);
    /* blocks: 0..2 full, 3 partial (4), 4..5 full, tail of 1 token */
    float *k = malloc(2 * 16 * 2 * 16 * sizeof(float));
    for (int i = 0; i < 2 * 16 * 2 * 16; i++) k[i] = 42.0f;
    int64_t sh[4] = {2, 16, 2, 16};
    kvmem_tensor kt;
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh));
    const int32_t ok2[] = {0, 1}, bad[] = {0, 9}, tail[] = {6}, neg[] = {-1};
    assert_status(kvmem_gather(NULL, ok2, 2, 0, &kt, NULL), KVMEM_ERR_INVALID_ARG, "agent is NULL");
    assert_status(kvmem_gather(e.ag, NULL, 2, 0, &kt, NULL), KVMEM_ERR_INVALID_ARG, "blocks is NULL");
    assert_status(kvmem_gather(e.ag, ok2, -1, 0, &kt, NULL), KVMEM_ERR_INVALID_ARG, "n_blocks -1");
    assert_status(kvmem_gather(e.ag, bad, 2, 0, &kt, NULL), KVMEM_ERR_NOT_FOUND, "blocks[1] = 9 is not a sealed block");
    assert_status(kvmem_gather(e.ag, neg, 1, 0, &kt, NULL), KVMEM_ERR_NOT_FOUND, "blocks[0] = -1");
    assert_status(kvmem_gather(e.ag, tail, 1, 0, &kt, NULL), KVMEM_ERR_NOT_FOUND, "kvmem_agent_flush");
    assert_status(kvmem_gather(e.ag, ok2, 2, -5, &kt, NULL), KVMEM_ERR_INVALID_ARG, "base_position -5");
    assert_status(kvmem_gather(e.ag, ok2, 2, INT32_MAX - 3, &kt, NULL), KVMEM_ERR_INVALID_ARG, "exceed 2^31 - 1");
    kvmem_tensor t = kt;
    t.shape[1] = 15;
    assert_status(kvmem_gather(e.ag, ok2, 2, 0, &t, NULL), KVMEM_ERR_MISMATCH, "[2][16][2][16]");
    t = kt;
    t.shape[2] = 4;
    assert_status(kvmem_gather(e.ag, ok2, 2, 0, NULL, &t), KVMEM_ERR_MISMATCH, "v_out");
    t = kt;
    t.ndim = 3;
    assert_status(kvmem_gather(e.ag, ok2, 2, 0, &t, NULL), KVMEM_ERR_MISMATCH, "k_out");
    t = kt;
    t.dtype = KVMEM_Q8;
    assert_status(kvmem_gather(e.ag, ok2, 2, 0, &t, NULL), KVMEM_ERR_INVALID_ARG, "not f32, f16 or bf16");
    t = kt;
    t.data = NULL;
    assert_status(kvmem_gather(e.ag, ok2, 2, 0, &t, NULL), KVMEM_ERR_INVALID_ARG, "data is NULL");
    for (int i = 0; i < 2 * 16 * 2 * 16; i++) assert_true(k[i] == 42.0f);
    /* nothing to gather is fine */
    int64_t sh0[4] = {2, 0, 2, 16};
    kvmem_tensor z;
    assert_ok(kvmem_tensor_init(&z, NULL, KVMEM_F32, 4, sh0));
    assert_ok(kvmem_gather(e.ag, NULL, 0, 0, &z, &z));
    assert_ok(kvmem_gather(e.ag, ok2, 2, 0, NULL, NULL));
    kvmem_agent *a2;
    assert_ok(kvmem_agent_open(e.pool, "closed", &a2));
    kvmem_agent_close(a2);
    assert_status(kvmem_gather(a2, ok2, 2, 0, &kt, NULL), KVMEM_ERR_CLOSED, "closed");
    free(k);
    unmake(&e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gathered_keys_are_raw_keys_rotated_at_new_positions),
        cmocka_unit_test(gather_matches_a_hand_rotation),
        cmocka_unit_test(output_dtypes_and_strided_views),
        cmocka_unit_test(bad_gather_calls_fail_and_write_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
