/* Glue for retrieval and gather (MemArt) and the generator's queries. */
#include "glue.h"

#include "synth.h"

kvmem_status kvmw_synth_query(const kvm_synth *s, int32_t topic, int32_t n_q, uint64_t *rng, float *q) {
    if (!s || !rng || !q) return kvm_fail(KVMEM_ERR_INVALID_ARG, "synth, rng or q is NULL");
    if (topic < 0 || topic >= s->n_topics) return kvm_fail(KVMEM_ERR_INVALID_ARG, "topic %d: must be in [0, %d)", topic, s->n_topics);
    if (n_q < 1) return kvm_fail(KVMEM_ERR_INVALID_ARG, "n_q %d: must be >= 1", n_q);
    kvm_synth_query(s, topic, n_q, rng, q);
    return KVMEM_OK;
}

/* out: top_k, mode, norm, agg, scope, tau, rr_c, recent_window, skip_recent. */
kvmem_status kvmw_retrieve_defaults(double *out) {
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "out is NULL");
    kvmem_retrieve_params p = kvmem_retrieve_default_params();
    out[0] = p.top_k;
    out[1] = p.mode;
    out[2] = p.norm;
    out[3] = p.agg;
    out[4] = p.scope;
    out[5] = p.tau;
    out[6] = p.rr_c;
    out[7] = p.recent_window;
    out[8] = p.skip_recent;
    return KVMEM_OK;
}

/* q: [n_q][n_layers][n_q_heads][head_dim] f32, contiguous. */
kvmem_status kvmw_retrieve(kvmem_pool *pool, kvmem_agent *agent, const float *q, int32_t n_q, int32_t top_k,
                           int32_t mode, int32_t norm, int32_t agg, int32_t scope, float tau, float rr_c,
                           const int32_t *exclude, int32_t n_exclude, const int32_t *always_include,
                           int32_t n_always_include, int32_t recent_window, int32_t skip_recent,
                           kvmem_retrieval *result) {
    kvmem_model_spec spec;
    kvmem_status st = kvmw_spec(pool, &spec);
    if (st != KVMEM_OK) return st;
    int64_t shape[4] = {n_q, spec.n_layers, spec.n_q_heads, spec.head_dim};
    kvmem_tensor qt;
    if ((st = kvmem_tensor_init(&qt, (void *)(uintptr_t)q, KVMEM_F32, 4, shape)) != KVMEM_OK) return st;
    kvmem_retrieve_params p = kvmem_retrieve_default_params();
    p.top_k = top_k;
    p.mode = (kvmem_retrieve_mode)mode;
    p.norm = (kvmem_retrieve_norm)norm;
    p.agg = (kvmem_retrieve_agg)agg;
    p.scope = (kvmem_retrieve_scope)scope;
    p.tau = tau;
    p.rr_c = rr_c;
    p.exclude = n_exclude ? exclude : NULL;
    p.n_exclude = n_exclude;
    p.always_include = n_always_include ? always_include : NULL;
    p.n_always_include = n_always_include;
    p.recent_window = recent_window;
    p.skip_recent = skip_recent;
    return kvmem_retrieve(agent, &qt, &p, result);
}

/* k_out, v_out: [n_layers][n_tokens][n_kv_heads][head_dim] f32 (either NULL to skip). */
kvmem_status kvmw_gather(kvmem_pool *pool, kvmem_agent *agent, const int32_t *blocks, int32_t n_blocks,
                         double base_position, float *k_out, float *v_out, int32_t n_tokens) {
    kvmem_model_spec spec;
    int64_t base;
    kvmem_status st = kvmw_spec(pool, &spec);
    if (st != KVMEM_OK || (st = kvmw_int64_of(base_position, "base_position", &base)) != KVMEM_OK) return st;
    int64_t shape[4] = {spec.n_layers, n_tokens, spec.n_kv_heads, spec.head_dim};
    kvmem_tensor kt, vt;
    if ((st = kvmem_tensor_init(&kt, k_out, KVMEM_F32, 4, shape)) != KVMEM_OK) return st;
    if ((st = kvmem_tensor_init(&vt, v_out, KVMEM_F32, 4, shape)) != KVMEM_OK) return st;
    return kvmem_gather(agent, blocks, n_blocks, base, k_out ? &kt : NULL, v_out ? &vt : NULL);
}
