/* Model spec validation, tensor views, contexts and the backend list. */
#include "testutil.h"

#include <math.h>
#include <string.h>

static void default_spec_is_valid(void **state) {
    (void)state;
    kvmem_model_spec s = kvmem_model_spec_default();
    assert_ok(kvmem_model_spec_validate(&s));
    assert_int_equal(s.rope_style, KVMEM_ROPE_NEOX);
    assert_true(s.rope_theta == 10000.0);
}

static void each_bad_field_is_named(void **state) {
    (void)state;
    kvmem_model_spec s;
    assert_status(kvmem_model_spec_validate(NULL), KVMEM_ERR_INVALID_ARG, "NULL");
#define BAD(field, value, needle)                                            \
    s = tu_spec(2, 8);                                                       \
    s.field = value;                                                         \
    assert_status(kvmem_model_spec_validate(&s), KVMEM_ERR_INVALID_ARG, needle)
    BAD(n_layers, 0, "n_layers 0");
    BAD(n_layers, 5000, "n_layers");
    BAD(n_q_heads, 3, "not a multiple of n_kv_heads");
    BAD(n_kv_heads, 0, "n_kv_heads 0");
    BAD(head_dim, 0, "head_dim 0");
    BAD(head_dim, 2048, "head_dim 2048");
    BAD(rotary_dim, 10, "rotary_dim 10");
    BAD(rotary_dim, 3, "rotary_dim 3");
    BAD(rotary_dim, -2, "rotary_dim -2");
    BAD(rope_style, (kvmem_rope_style)7, "rope_style 7");
    BAD(rope_theta, 1.0, "rope_theta");
    BAD(rope_theta, NAN, "rope_theta");
    BAD(rope_scaling, (kvmem_rope_scaling)9, "rope_scaling 9");
    s = tu_spec(2, 8);
    s.rope_scaling = KVMEM_ROPE_SCALING_LINEAR;
    s.rope_factor = 0.5;
    assert_status(kvmem_model_spec_validate(&s), KVMEM_ERR_INVALID_ARG, "rope_factor 0.5");
    s.rope_scaling = KVMEM_ROPE_SCALING_LLAMA3;
    s.rope_factor = 8;
    s.rope_low_freq_factor = 4;
    s.rope_high_freq_factor = 1;
    assert_status(kvmem_model_spec_validate(&s), KVMEM_ERR_INVALID_ARG, "low_freq_factor");
    s.rope_low_freq_factor = 1;
    s.rope_high_freq_factor = 4;
    assert_ok(kvmem_model_spec_validate(&s));
    s.rope_scaling = KVMEM_ROPE_SCALING_YARN;
    s.yarn_beta_fast = 0.5;
    assert_status(kvmem_model_spec_validate(&s), KVMEM_ERR_INVALID_ARG, "beta_slow");
    s = tu_spec(2, 8);
    int32_t win[2] = {0, -1};
    s.layer_window = win;
    assert_status(kvmem_model_spec_validate(&s), KVMEM_ERR_INVALID_ARG, "layer_window[1] = -1");
    win[1] = 4096;
    assert_ok(kvmem_model_spec_validate(&s));
    s = tu_spec(2, 8);
    memset(s.model_id, 'x', sizeof s.model_id);
    assert_status(kvmem_model_spec_validate(&s), KVMEM_ERR_INVALID_ARG, "model_id");
#undef BAD
}

static void tensor_init_is_contiguous_and_checked(void **state) {
    (void)state;
    float buf[2 * 3 * 4];
    kvmem_tensor t;
    int64_t shape[3] = {2, 3, 4};
    assert_ok(kvmem_tensor_init(&t, buf, KVMEM_F32, 3, shape));
    assert_int_equal(t.strides[0], 12);
    assert_int_equal(t.strides[1], 4);
    assert_int_equal(t.strides[2], 1);
    assert_ptr_equal(t.data, buf);
    kvmem_tensor before = t;
    assert_status(kvmem_tensor_init(NULL, buf, KVMEM_F32, 3, shape), KVMEM_ERR_INVALID_ARG, "out is NULL");
    assert_status(kvmem_tensor_init(&t, buf, KVMEM_Q4, 3, shape), KVMEM_ERR_INVALID_ARG, "dtype");
    assert_status(kvmem_tensor_init(&t, buf, KVMEM_F32, 0, shape), KVMEM_ERR_INVALID_ARG, "ndim 0");
    assert_status(kvmem_tensor_init(&t, buf, KVMEM_F32, 7, shape), KVMEM_ERR_INVALID_ARG, "ndim 7");
    assert_status(kvmem_tensor_init(&t, buf, KVMEM_F32, 3, NULL), KVMEM_ERR_INVALID_ARG, "shape is NULL");
    int64_t neg[3] = {2, -3, 4};
    assert_status(kvmem_tensor_init(&t, buf, KVMEM_F32, 3, neg), KVMEM_ERR_INVALID_ARG, "negative");
    int64_t huge[3] = {INT64_MAX / 2, INT64_MAX / 2, 4};
    assert_status(kvmem_tensor_init(&t, buf, KVMEM_F32, 3, huge), KVMEM_ERR_INVALID_ARG, "overflow");
    assert_memory_equal(&t, &before, sizeof t); /* failures left it alone */
}

static void contexts_and_backends(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(3);
    assert_string_equal(kvmem_context_backend(ctx), "cpu");
    assert_true(kvmem_context_n_threads(ctx) >= 1 && kvmem_context_n_threads(ctx) <= 3);
    kvmem_context_free(ctx);
    kvmem_context_free(NULL);
    assert_string_equal(kvmem_context_backend(NULL), "");

    kvmem_context_params p = kvmem_context_default_params();
    p.n_threads = -1;
    assert_status(kvmem_context_create(&p, &ctx), KVMEM_ERR_INVALID_ARG, "n_threads -1");
    assert_status(kvmem_context_create(NULL, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    p = kvmem_context_default_params();
    p.backend = "tpu";
    ctx = (kvmem_context *)&p; /* must be reset to NULL on failure */
    assert_status(kvmem_context_create(&p, &ctx), KVMEM_ERR_NOT_FOUND, "unknown backend 'tpu'");
    assert_null(ctx);

    /* auto always gives a working context */
    assert_ok(kvmem_context_create(NULL, &ctx));
    assert_true(strlen(kvmem_context_backend(ctx)) > 0);
    kvmem_context_free(ctx);

    size_t n = 0;
    assert_ok(kvmem_backends(NULL, 0, &n));
    assert_true(n >= 3);
    kvmem_backend_info info[8];
    assert_ok(kvmem_backends(info, 8, &n));
    assert_string_equal(info[0].name, "cpu");
    assert_int_equal(info[0].available, 1);
    for (size_t i = 0; i < n; i++) {
        assert_non_null(info[i].detail);
        assert_true(strlen(info[i].detail) > 0); /* available or not, it says why */
        if (!info[i].available) {
            /* asking for an unusable backend by name fails and repeats the reason */
            p.backend = info[i].name;
            assert_status(kvmem_context_create(&p, &ctx), KVMEM_ERR_UNSUPPORTED, "unusable here");
        }
    }
    assert_status(kvmem_backends(NULL, 2, &n), KVMEM_ERR_INVALID_ARG, "out is NULL");
    assert_status(kvmem_backends(info, 2, NULL), KVMEM_ERR_INVALID_ARG, "count is NULL");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(default_spec_is_valid),
        cmocka_unit_test(each_bad_field_is_named),
        cmocka_unit_test(tensor_init_is_contiguous_and_checked),
        cmocka_unit_test(contexts_and_backends),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
