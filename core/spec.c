/* Model spec defaults and validation. */
#include "internal.h"

#include <math.h>
#include <string.h>

kvmem_model_spec kvmem_model_spec_default(void) {
    kvmem_model_spec s;
    memset(&s, 0, sizeof s);
    s.n_layers = 1;
    s.n_q_heads = 1;
    s.n_kv_heads = 1;
    s.head_dim = 64;
    s.rotary_dim = 0;
    s.rope_style = KVMEM_ROPE_NEOX;
    s.rope_theta = 10000.0;
    s.rope_scaling = KVMEM_ROPE_SCALING_NONE;
    s.rope_factor = 1.0;
    s.rope_low_freq_factor = 1.0;
    s.rope_high_freq_factor = 4.0;
    s.rope_original_max_pos = 8192;
    s.yarn_beta_fast = 32.0;
    s.yarn_beta_slow = 1.0;
    s.yarn_attn_factor = 0.0;
    s.layer_window = NULL;
    return s;
}

#define BAD(...) kvm_fail(KVMEM_ERR_INVALID_ARG, __VA_ARGS__)

kvmem_status kvmem_model_spec_validate(const kvmem_model_spec *s) {
    if (!s) return BAD("model spec is NULL");
    if (s->n_layers < 1 || s->n_layers > 4096) return BAD("n_layers %d: must be in [1, 4096]", s->n_layers);
    if (s->n_kv_heads < 1 || s->n_kv_heads > 4096)
        return BAD("n_kv_heads %d: must be in [1, 4096]", s->n_kv_heads);
    if (s->n_q_heads < 1 || s->n_q_heads > 4096) return BAD("n_q_heads %d: must be in [1, 4096]", s->n_q_heads);
    if (s->n_q_heads % s->n_kv_heads != 0)
        return BAD("n_q_heads %d is not a multiple of n_kv_heads %d (grouped-query attention)",
                   s->n_q_heads, s->n_kv_heads);
    if (s->head_dim < 1 || s->head_dim > 1024) return BAD("head_dim %d: must be in [1, 1024]", s->head_dim);
    int32_t rd = s->rotary_dim ? s->rotary_dim : s->head_dim;
    if (s->rotary_dim < 0 || rd > s->head_dim || rd % 2 != 0)
        return BAD("rotary_dim %d: must be even and in [0, head_dim %d] (0 = head_dim)", s->rotary_dim,
                   s->head_dim);
    if (s->rope_style != KVMEM_ROPE_NEOX && s->rope_style != KVMEM_ROPE_GPTJ)
        return BAD("rope_style %d: must be KVMEM_ROPE_NEOX or KVMEM_ROPE_GPTJ", (int)s->rope_style);
    if (!isfinite(s->rope_theta) || !(s->rope_theta > 1.0))
        return BAD("rope_theta %g: must be finite and > 1", s->rope_theta);
    switch (s->rope_scaling) {
    case KVMEM_ROPE_SCALING_NONE: break;
    case KVMEM_ROPE_SCALING_LINEAR:
        if (!isfinite(s->rope_factor) || !(s->rope_factor >= 1.0))
            return BAD("rope_factor %g: must be finite and >= 1", s->rope_factor);
        break;
    case KVMEM_ROPE_SCALING_LLAMA3:
        if (!isfinite(s->rope_factor) || !(s->rope_factor >= 1.0))
            return BAD("rope_factor %g: must be finite and >= 1", s->rope_factor);
        if (!isfinite(s->rope_low_freq_factor) || !isfinite(s->rope_high_freq_factor) ||
            !(s->rope_low_freq_factor > 0) || !(s->rope_high_freq_factor > s->rope_low_freq_factor))
            return BAD("llama3 rope: need 0 < low_freq_factor (%g) < high_freq_factor (%g)",
                       s->rope_low_freq_factor, s->rope_high_freq_factor);
        if (s->rope_original_max_pos < 1)
            return BAD("rope_original_max_pos %d: must be >= 1", s->rope_original_max_pos);
        break;
    case KVMEM_ROPE_SCALING_YARN:
        if (!isfinite(s->rope_factor) || !(s->rope_factor >= 1.0))
            return BAD("rope_factor %g: must be finite and >= 1", s->rope_factor);
        if (s->rope_original_max_pos < 1)
            return BAD("rope_original_max_pos %d: must be >= 1", s->rope_original_max_pos);
        if (!isfinite(s->yarn_beta_fast) || !isfinite(s->yarn_beta_slow) || !(s->yarn_beta_slow > 0) ||
            !(s->yarn_beta_fast > s->yarn_beta_slow))
            return BAD("yarn: need 0 < beta_slow (%g) < beta_fast (%g)", s->yarn_beta_slow,
                       s->yarn_beta_fast);
        if (!isfinite(s->yarn_attn_factor) || s->yarn_attn_factor < 0)
            return BAD("yarn_attn_factor %g: must be finite and >= 0 (0 = default)", s->yarn_attn_factor);
        break;
    default: return BAD("rope_scaling %d: unknown", (int)s->rope_scaling);
    }
    if (s->layer_window)
        for (int32_t l = 0; l < s->n_layers; l++)
            if (s->layer_window[l] < 0)
                return BAD("layer_window[%d] = %d: must be >= 0 (0 = full attention)", l, s->layer_window[l]);
    if (memchr(s->model_id, '\0', sizeof s->model_id) == NULL)
        return BAD("model_id is not NUL-terminated within %d bytes", KVMEM_MAX_MODEL_ID);
    return KVMEM_OK;
}
