/* RoPE as the pool uses it to de-rotate post-RoPE keys: hand-computed
 * rotations for both pairings and partial rotary_dim, and the round trip
 * R_{-p} R_p x = x at float rounding level. (Every scaling against the
 * published formulas is tested with retrieval's gather.) */
#include "testutil.h"

#include <math.h>
#include <string.h>

static void neox_and_gptj_by_hand(void **state) {
    (void)state;
    kvmem_model_spec s = tu_spec(1, 4);
    s.rope_theta = 100.0;
    /* head_dim 4: inv_freq = {1, 100^(-2/4) = 0.1} */
    float x[4] = {1, 2, 3, 4};
    int32_t pos = 3;
    assert_ok(kvmem_rope_apply(&s, x, 1, 4, &pos, 0));
    /* NEOX pairs (0,2) with freq 1 and (1,3) with freq 0.1 */
    double a0 = 3.0, a1 = 0.3;
    double e[4] = {1 * cos(a0) - 3 * sin(a0), 2 * cos(a1) - 4 * sin(a1), 1 * sin(a0) + 3 * cos(a0),
                   2 * sin(a1) + 4 * cos(a1)};
    for (int i = 0; i < 4; i++) assert_true(fabs(x[i] - e[i]) < 1e-5);

    s.rope_style = KVMEM_ROPE_GPTJ; /* pairs (0,1) freq 1 and (2,3) freq 0.1 */
    float y[4] = {1, 2, 3, 4};
    assert_ok(kvmem_rope_apply(&s, y, 1, 4, &pos, 0));
    double g[4] = {1 * cos(a0) - 2 * sin(a0), 1 * sin(a0) + 2 * cos(a0), 3 * cos(a1) - 4 * sin(a1),
                   3 * sin(a1) + 4 * cos(a1)};
    for (int i = 0; i < 4; i++) assert_true(fabs(y[i] - g[i]) < 1e-5);
}

static void partial_rotary_leaves_the_rest(void **state) {
    (void)state;
    kvmem_model_spec s = tu_spec(1, 8);
    s.rotary_dim = 4;
    s.rope_theta = 10000.0;
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t pos = 11;
    assert_ok(kvmem_rope_apply(&s, x, 1, 8, &pos, 0));
    assert_true(x[4] == 5 && x[5] == 6 && x[6] == 7 && x[7] == 8);
    double f1 = pow(10000.0, -2.0 / 4.0);
    assert_true(fabs(x[0] - (1 * cos(11.0) - 3 * sin(11.0))) < 1e-5);
    assert_true(fabs(x[1] - (2 * cos(11.0 * f1) - 4 * sin(11.0 * f1))) < 1e-5);
}

static void round_trip_is_float_rounding(void **state) {
    (void)state;
    kvmem_rope_style styles[2] = {KVMEM_ROPE_NEOX, KVMEM_ROPE_GPTJ};
    kvmem_rope_scaling scal[4] = {KVMEM_ROPE_SCALING_NONE, KVMEM_ROPE_SCALING_LINEAR, KVMEM_ROPE_SCALING_LLAMA3,
                                  KVMEM_ROPE_SCALING_YARN};
    uint64_t rng = 7;
    for (int si = 0; si < 2; si++)
        for (int sc = 0; sc < 4; sc++) {
            kvmem_model_spec s = tu_spec(1, 128);
            s.rope_style = styles[si];
            s.rope_scaling = scal[sc];
            s.rope_factor = 8.0;
            s.rope_theta = 500000.0;
            s.rotary_dim = sc == 3 ? 64 : 0;
            enum { R = 64 };
            static float x[R * 128], orig[R * 128];
            int32_t pos[R];
            for (int r = 0; r < R; r++) pos[r] = (int32_t)(tu_next(&rng) % 131072);
            tu_fill_kv(x, R * 128, &rng);
            memcpy(orig, x, sizeof x);
            assert_ok(kvmem_rope_apply(&s, x, R, 128, pos, 0));
            assert_ok(kvmem_rope_apply(&s, x, R, 128, pos, 1));
            for (int i = 0; i < R * 128; i++) assert_true(fabsf(x[i] - orig[i]) <= 4e-6f * (1.0f + fabsf(orig[i])));
        }
}

static void bad_arguments(void **state) {
    (void)state;
    kvmem_model_spec s = tu_spec(1, 8);
    float x[8] = {0};
    int32_t pos = 0;
    assert_status(kvmem_rope_apply(NULL, x, 1, 8, &pos, 0), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_rope_apply(&s, NULL, 1, 8, &pos, 0), KVMEM_ERR_INVALID_ARG, "x is NULL");
    assert_status(kvmem_rope_apply(&s, x, 1, 8, NULL, 0), KVMEM_ERR_INVALID_ARG, "positions is NULL");
    assert_status(kvmem_rope_apply(&s, x, 1, 4, &pos, 0), KVMEM_ERR_INVALID_ARG, "stride 4");
    assert_status(kvmem_rope_apply(&s, x, 1, 8, &pos, 2), KVMEM_ERR_INVALID_ARG, "inverse");
    assert_ok(kvmem_rope_apply(&s, NULL, 0, 8, NULL, 0)); /* nothing to do */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(neox_and_gptj_by_hand),
        cmocka_unit_test(partial_rotary_leaves_the_rest),
        cmocka_unit_test(round_trip_is_float_rounding),
        cmocka_unit_test(bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
