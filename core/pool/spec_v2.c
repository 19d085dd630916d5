/* The _v2 forms of the calls that take a model spec (kvmem.h, "The model
 * spec that grows"): the caller's kvmem_model_spec_v2 read in as params
 * structs are (core/params.h), turned into the frozen kvmem_model_spec, and
 * the frozen call made. Fields appended to the v2 struct are read here, and
 * reach the calls through whatever carries them then. A failure of the
 * read is the object's last error as the call's own failures are. */
#include "pool.h"
#include "../params.h"

#include <string.h>

static kvmem_model_spec_v2 v2_of(const kvmem_model_spec *s) {
    kvmem_model_spec_v2 v;
    memset(&v, 0, sizeof v);
    v.struct_size = sizeof v;
    v.layer_window = s->layer_window;
    v.n_layers = s->n_layers;
    v.n_q_heads = s->n_q_heads;
    v.n_kv_heads = s->n_kv_heads;
    v.head_dim = s->head_dim;
    v.rotary_dim = s->rotary_dim;
    v.rope_style = s->rope_style;
    v.rope_scaling = s->rope_scaling;
    v.rope_original_max_pos = s->rope_original_max_pos;
    v.rope_theta = s->rope_theta;
    v.rope_factor = s->rope_factor;
    v.rope_low_freq_factor = s->rope_low_freq_factor;
    v.rope_high_freq_factor = s->rope_high_freq_factor;
    v.yarn_beta_fast = s->yarn_beta_fast;
    v.yarn_beta_slow = s->yarn_beta_slow;
    v.yarn_attn_factor = s->yarn_attn_factor;
    memcpy(v.model_id, s->model_id, sizeof v.model_id);
    return v;
}

/* The caller's v2 spec over the defaults, as the frozen struct. */
static kvmem_status spec_in(const kvmem_model_spec_v2 *in, kvmem_model_spec *out, const char *fn) {
    if (!in) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: model spec is NULL", fn);
    const kvmem_model_spec d = kvmem_model_spec_default();
    kvmem_model_spec_v2 v = v2_of(&d);
    kvmem_status st = KVM_PARAMS_IN(kvmem_model_spec_v2, &v, in, fn);
    if (st != KVMEM_OK) return st;
    memset(out, 0, sizeof *out);
    out->n_layers = v.n_layers;
    out->n_q_heads = v.n_q_heads;
    out->n_kv_heads = v.n_kv_heads;
    out->head_dim = v.head_dim;
    out->rotary_dim = v.rotary_dim;
    out->rope_style = v.rope_style;
    out->rope_theta = v.rope_theta;
    out->rope_scaling = v.rope_scaling;
    out->rope_factor = v.rope_factor;
    out->rope_low_freq_factor = v.rope_low_freq_factor;
    out->rope_high_freq_factor = v.rope_high_freq_factor;
    out->rope_original_max_pos = v.rope_original_max_pos;
    out->yarn_beta_fast = v.yarn_beta_fast;
    out->yarn_beta_slow = v.yarn_beta_slow;
    out->yarn_attn_factor = v.yarn_attn_factor;
    out->layer_window = v.layer_window;
    memcpy(out->model_id, v.model_id, sizeof out->model_id);
    return KVMEM_OK;
}

kvmem_status kvmem_model_spec_v2_init(kvmem_model_spec_v2 *spec, size_t struct_size) {
    const kvmem_model_spec d = kvmem_model_spec_default();
    const kvmem_model_spec_v2 v = v2_of(&d);
    return KVM_PARAMS_INIT(kvmem_model_spec_v2, spec, struct_size, &v, "kvmem_model_spec_v2_init");
}

kvmem_status kvmem_model_spec_validate_v2(const kvmem_model_spec_v2 *spec) {
    kvmem_model_spec s;
    kvmem_status st = spec_in(spec, &s, "kvmem_model_spec_validate_v2");
    return st == KVMEM_OK ? kvmem_model_spec_validate(&s) : st;
}

kvmem_status kvmem_rope_apply_v2(const kvmem_model_spec_v2 *spec, float *x, size_t n_rows, size_t stride,
                                 const int32_t *positions, int32_t inverse) {
    kvmem_model_spec s;
    kvmem_status st = spec_in(spec, &s, "kvmem_rope_apply_v2");
    return st == KVMEM_OK ? kvmem_rope_apply(&s, x, n_rows, stride, positions, inverse) : st;
}

kvmem_status kvmem_pool_create_v2(kvmem_context *ctx, const kvmem_model_spec_v2 *spec, const kvmem_pool_params *params,
                                  kvmem_pool **out) {
    int own = ctx ? kvm_err_begin(&ctx->err) : 0;
    kvmem_model_spec s;
    kvmem_status st = spec_in(spec, &s, "kvmem_pool_create_v2");
    kvm_err_end(own);
    return st == KVMEM_OK ? kvmem_pool_create(ctx, &s, params, out) : st;
}

kvmem_status kvmem_pool_get_spec_v2(kvmem_pool *pool, kvmem_model_spec_v2 *out) {
    kvmem_model_spec s;
    kvmem_status st = kvmem_pool_get_spec(pool, out ? &s : NULL);
    if (st != KVMEM_OK) return st;
    int own = kvm_err_begin(&pool->err);
    const kvmem_model_spec_v2 v = v2_of(&s);
    st = KVM_PARAMS_INIT(kvmem_model_spec_v2, out, out->struct_size, &v, "kvmem_pool_get_spec_v2");
    kvm_err_end(own);
    return st;
}

kvmem_status kvmem_qmem_store_create_v2(const kvmem_model_spec_v2 *spec, const kvmem_qmem_params *params,
                                        kvmem_qmem_store **out) {
    kvmem_model_spec s;
    kvmem_status st = spec_in(spec, &s, "kvmem_qmem_store_create_v2");
    return st == KVMEM_OK ? kvmem_qmem_store_create(&s, params, out) : st;
}

kvmem_status kvmem_qmem_score_v2(kvmem_context *ctx, const kvmem_model_spec_v2 *spec, const float *memory,
                                 const kvmem_tensor *k, float *scores) {
    int own = ctx ? kvm_err_begin(&ctx->err) : 0;
    kvmem_model_spec s;
    kvmem_status st = spec_in(spec, &s, "kvmem_qmem_score_v2");
    kvm_err_end(own);
    return st == KVMEM_OK ? kvmem_qmem_score(ctx, &s, memory, k, scores) : st;
}

kvmem_status kvmem_kvstore_create_v2(const kvmem_model_spec_v2 *spec, const kvmem_kvstore_params *params,
                                     kvmem_kvstore **out) {
    kvmem_model_spec s;
    kvmem_status st = spec_in(spec, &s, "kvmem_kvstore_create_v2");
    return st == KVMEM_OK ? kvmem_kvstore_create(&s, params, out) : st;
}

kvmem_status kvmem_qmem_head_apply_v2(const kvmem_qmem_head *head, const kvmem_model_spec_v2 *spec,
                                      const float *memory, const kvmem_tensor *k, const float *rule,
                                      int64_t span_begin, int64_t span_end, float *scores_out) {
    kvmem_model_spec s;
    kvmem_status st = spec_in(spec, &s, "kvmem_qmem_head_apply_v2");
    return st == KVMEM_OK ? kvmem_qmem_head_apply(head, &s, memory, k, rule, span_begin, span_end, scores_out) : st;
}

kvmem_status kvmem_snapkv_score_v2(kvmem_context *ctx, const kvmem_model_spec_v2 *spec, const kvmem_tensor *q_obs,
                                   const kvmem_tensor *k, int32_t pool_kernel, float *scores) {
    int own = ctx ? kvm_err_begin(&ctx->err) : 0;
    kvmem_model_spec s;
    kvmem_status st = spec_in(spec, &s, "kvmem_snapkv_score_v2");
    kvm_err_end(own);
    return st == KVMEM_OK ? kvmem_snapkv_score(ctx, &s, q_obs, k, pool_kernel, scores) : st;
}
