/* kvmem_rope_apply against values computed here, in double, from the
 * Hugging Face transformers formulas (modeling_rope_utils.py and the
 * rotate_half / interleaved rotations), for every style and scaling. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PI 3.14159265358979323846

/* inv_freq and attention factor of a spec, the HF way. */
static double hf_inv_freq(const kvmem_model_spec *s, int j, double *attn) {
    const int rd = s->rotary_dim ? s->rotary_dim : s->head_dim;
    const double base = s->rope_theta, factor = s->rope_factor;
    double inv = 1.0 / pow(base, (2.0 * j) / rd);
    *attn = 1.0;
    switch (s->rope_scaling) {
    case KVMEM_ROPE_SCALING_NONE: return inv;
    case KVMEM_ROPE_SCALING_LINEAR: return inv / factor; /* HF divides the position by factor */
    case KVMEM_ROPE_SCALING_LLAMA3: {
        double old = s->rope_original_max_pos;
        double low_wl = old / s->rope_low_freq_factor, high_wl = old / s->rope_high_freq_factor;
        double wl = 2 * PI / inv;
        double llama = wl > low_wl ? inv / factor : inv;
        double smooth = (old / wl - s->rope_low_freq_factor) / (s->rope_high_freq_factor - s->rope_low_freq_factor);
        double smoothed = (1 - smooth) * llama / factor + smooth * llama;
        int medium = !(wl < high_wl) && !(wl > low_wl);
        return medium ? smoothed : llama;
    }
    case KVMEM_ROPE_SCALING_YARN: {
        double pos_freq = pow(base, (2.0 * j) / rd);
        double extra = 1.0 / pos_freq, inter = 1.0 / (factor * pos_freq);
        double mp = s->rope_original_max_pos;
        double low = floor(rd * log(mp / (s->yarn_beta_fast * 2 * PI)) / (2 * log(base)));
        double high = ceil(rd * log(mp / (s->yarn_beta_slow * 2 * PI)) / (2 * log(base)));
        if (low < 0) low = 0;
        if (high > rd - 1) high = rd - 1;
        if (low == high) high += 0.001;
        double ramp = (j - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double ef = 1 - ramp;
        *attn = s->yarn_attn_factor > 0 ? s->yarn_attn_factor : factor > 1 ? 0.1 * log(factor) + 1.0 : 1.0;
        return inter * (1 - ef) + extra * ef;
    }
    }
    return inv;
}

/* HF: NEOX q*cos + rotate_half(q)*sin on the first rotary_dim dims;
 * GPT-J pairs (2i, 2i+1); dims past rotary_dim pass through. */
static void hf_rotate(const kvmem_model_spec *s, const float *x, double pos, double *y) {
    const int D = s->head_dim, rd = s->rotary_dim ? s->rotary_dim : D, half = rd / 2;
    for (int d = 0; d < D; d++) y[d] = x[d];
    for (int j = 0; j < half; j++) {
        double attn, f = hf_inv_freq(s, j, &attn);
        double c = cos(pos * f) * attn, sn = sin(pos * f) * attn;
        int a = s->rope_style == KVMEM_ROPE_NEOX ? j : 2 * j, b = s->rope_style == KVMEM_ROPE_NEOX ? j + half : 2 * j + 1;
        y[a] = x[a] * c - x[b] * sn;
        y[b] = x[b] * c + x[a] * sn;
    }
}

static void check_spec(const kvmem_model_spec *s, const char *what) {
    const int D = s->head_dim, N = 7;
    const int32_t pos[7] = {0, 1, 5, 100, 4095, 9000, 131071};
    uint64_t rng = 99;
    float *x = malloc((size_t)N * (size_t)(D + 3) * sizeof(float)), *orig = malloc((size_t)N * (size_t)(D + 3) * sizeof(float));
    for (int i = 0; i < N * (D + 3); i++) x[i] = orig[i] = tu_normal(&rng);
    assert_ok(kvmem_rope_apply(s, x, (size_t)N, (size_t)(D + 3), pos, 0)); /* strided rows */
    double y[1024];
    for (int i = 0; i < N; i++) {
        hf_rotate(s, orig + i * (D + 3), pos[i], y);
        for (int d = 0; d < D; d++) {
            /* float cos/sin and float products: a few ulps of the inputs' scale */
            double tol = 2e-6 * (fabs(orig[i * (D + 3) + d]) + 4.0);
            if (!(fabs(x[i * (D + 3) + d] - y[d]) <= tol))
                fail_msg("%s: pos %d dim %d: %.9g, HF formula %.9g", what, pos[i], d, (double)x[i * (D + 3) + d], y[d]);
        }
        for (int d = D; d < D + 3; d++) assert_true(x[i * (D + 3) + d] == orig[i * (D + 3) + d]); /* gaps untouched */
    }
    /* inverse undoes it */
    assert_ok(kvmem_rope_apply(s, x, (size_t)N, (size_t)(D + 3), pos, 1));
    for (int i = 0; i < N * (D + 3); i++) assert_true(fabs(x[i] - orig[i]) <= 1e-5 * (fabs(orig[i]) + 1));
    free(x);
    free(orig);
}

static void neox_and_gptj(void **state) {
    (void)state;
    kvmem_model_spec s = kvmem_model_spec_default();
    s.head_dim = 64;
    check_spec(&s, "neox");
    s.rope_style = KVMEM_ROPE_GPTJ;
    check_spec(&s, "gptj");
    s.rope_theta = 500000.0;
    s.head_dim = 128;
    check_spec(&s, "gptj theta 5e5");
}

static void partial_rotary_dim(void **state) {
    (void)state;
    kvmem_model_spec s = kvmem_model_spec_default();
    s.head_dim = 80;
    s.rotary_dim = 20; /* GPT-NeoX-style partial rotary */
    check_spec(&s, "neox partial");
    s.rope_style = KVMEM_ROPE_GPTJ;
    s.rotary_dim = 64; /* GPT-J 6B: 64 of 256 */
    s.head_dim = 256;
    check_spec(&s, "gptj partial");
}

static void linear_scaling(void **state) {
    (void)state;
    kvmem_model_spec s = kvmem_model_spec_default();
    s.head_dim = 128;
    s.rope_scaling = KVMEM_ROPE_SCALING_LINEAR;
    s.rope_factor = 4.0;
    check_spec(&s, "linear");
}

static void llama3_scaling(void **state) {
    (void)state;
    kvmem_model_spec s = kvmem_model_spec_default(); /* Llama-3.1-8B */
    s.head_dim = 128;
    s.rope_theta = 500000.0;
    s.rope_scaling = KVMEM_ROPE_SCALING_LLAMA3;
    s.rope_factor = 8.0;
    s.rope_low_freq_factor = 1.0;
    s.rope_high_freq_factor = 4.0;
    s.rope_original_max_pos = 8192;
    check_spec(&s, "llama3");
    /* the three regimes are all present: kept, blended and divided */
    int kept = 0, blended = 0, divided = 0;
    for (int j = 0; j < 64; j++) {
        double attn, f = hf_inv_freq(&s, j, &attn), f0 = 1.0 / pow(500000.0, 2.0 * j / 128);
        if (fabs(f - f0) < 1e-15 * f0) kept++;
        else if (fabs(f - f0 / 8) < 1e-15 * f0) divided++;
        else blended++;
    }
    assert_true(kept > 0 && blended > 0 && divided > 0);
}

static void yarn_scaling(void **state) {
    (void)state;
    kvmem_model_spec s = kvmem_model_spec_default();
    s.head_dim = 128;
    s.rope_scaling = KVMEM_ROPE_SCALING_YARN;
    s.rope_factor = 4.0;
    s.rope_original_max_pos = 4096;
    check_spec(&s, "yarn default attn factor");
    s.yarn_attn_factor = 1.3;
    s.yarn_beta_fast = 16;
    s.yarn_beta_slow = 2;
    s.rope_style = KVMEM_ROPE_GPTJ;
    check_spec(&s, "yarn gptj attn 1.3");
    /* one hand-computed value: D = 4, pair 0 keeps its frequency (ramp 0),
     * mscale = 0.1 ln 4 + 1; x = (1, 0, 0, 0) at position 1 */
    kvmem_model_spec t = kvmem_model_spec_default();
    t.head_dim = 4;
    t.rope_scaling = KVMEM_ROPE_SCALING_YARN;
    t.rope_factor = 4.0;
    t.rope_original_max_pos = 4096;
    float x[4] = {1, 0, 0, 0};
    int32_t p = 1;
    assert_ok(kvmem_rope_apply(&t, x, 1, 4, &p, 0));
    double m = 0.1 * log(4.0) + 1.0;
    assert_true(fabs(x[0] - cos(1.0) * m) < 1e-6);
    assert_true(fabs(x[2] - sin(1.0) * m) < 1e-6);
}

static void bad_input(void **state) {
    (void)state;
    kvmem_model_spec s = kvmem_model_spec_default();
    float x[64] = {0};
    int32_t p = 3;
    assert_status(kvmem_rope_apply(NULL, x, 1, 64, &p, 0), KVMEM_ERR_INVALID_ARG, "spec is NULL");
    assert_status(kvmem_rope_apply(&s, NULL, 1, 64, &p, 0), KVMEM_ERR_INVALID_ARG, "x is NULL");
    assert_status(kvmem_rope_apply(&s, x, 1, 64, NULL, 0), KVMEM_ERR_INVALID_ARG, "positions is NULL");
    assert_status(kvmem_rope_apply(&s, x, 1, 32, &p, 0), KVMEM_ERR_INVALID_ARG, "stride 32 < head_dim 64");
    assert_status(kvmem_rope_apply(&s, x, 1, 64, &p, 2), KVMEM_ERR_INVALID_ARG, "inverse must be 0 or 1");
    s.rotary_dim = 3;
    assert_status(kvmem_rope_apply(&s, x, 1, 64, &p, 0), KVMEM_ERR_INVALID_ARG, "rotary_dim 3");
    s = kvmem_model_spec_default();
    s.rope_scaling = KVMEM_ROPE_SCALING_YARN;
    s.yarn_beta_fast = 0.5;
    assert_status(kvmem_rope_apply(&s, x, 1, 64, &p, 0), KVMEM_ERR_INVALID_ARG, "beta");
    for (int i = 0; i < 64; i++) assert_true(x[i] == 0.0f);
    s = kvmem_model_spec_default();
    assert_ok(kvmem_rope_apply(&s, NULL, 0, 64, NULL, 0)); /* zero rows: nothing to do */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(neox_and_gptj),
        cmocka_unit_test(partial_rotary_dim),
        cmocka_unit_test(linear_scaling),
        cmocka_unit_test(llama3_scaling),
        cmocka_unit_test(yarn_scaling),
        cmocka_unit_test(bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
