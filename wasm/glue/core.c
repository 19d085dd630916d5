/* Flat-argument wrappers over the C API for JavaScript: no C struct crosses
 * into JavaScript, so kvmem.js never depends on struct layouts. Every
 * wrapper returns a kvmem_status and writes its results through pointers
 * the caller allocated in the wasm heap. Compiled only into the wasm module. */
#include "glue.h"

#include "cpu/kernels.h"
#include "synth.h"

#include <emscripten.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *kvmw_cpu_kernels(void) { return kvm_cpu_kernels_get()->name; }

double kvmw_now_ms(void) { return emscripten_get_now(); }

/* "auto" is the CPU backend here: the module has no other (no dlopen). */
kvmem_status kvmw_context_create(const char *backend, int32_t n_threads, kvmem_context **out) {
    kvmem_context_params p = kvmem_context_default_params();
    p.backend = !backend || !strcmp(backend, "auto") ? "cpu" : backend;
    p.n_threads = n_threads;
    return kvmem_context_create(&p, out);
}

/* A number from JavaScript as an integer C field: refused (naming the field)
 * unless it is a whole number in range, so 3.5 or NaN never truncates. */
kvmem_status kvmw_int32_of(double v, const char *name, int32_t *out) {
    if (!(v >= INT32_MIN && v <= INT32_MAX) || v != floor(v))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s %g: must be an integer in [%d, %d]", name, v, INT32_MIN, INT32_MAX);
    *out = (int32_t)v;
    return KVMEM_OK;
}

/* The same for 64-bit counts and positions; JavaScript numbers are exact to 2^53. */
kvmem_status kvmw_int64_of(double v, const char *name, int64_t *out) {
    if (!(v >= -9007199254740992.0 && v <= 9007199254740992.0) || v != floor(v))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s %g: must be an integer of at most 2^53", name, v);
    *out = (int64_t)v;
    return KVMEM_OK;
}

/* The model spec (kvmem_model_spec_v2, the form that grows) as KVMW_SPEC_N
 * doubles, in kvmem_model_spec's order (kvmem.js
 * SPEC_KEYS): n_layers, n_q_heads, n_kv_heads, head_dim, rotary_dim,
 * rope_style, rope_theta, rope_scaling, rope_factor, rope_low_freq_factor,
 * rope_high_freq_factor, rope_original_max_pos, yarn_beta_fast,
 * yarn_beta_slow, yarn_attn_factor; layer_window and model_id beside. */
static const char *const k_spec_fields[KVMW_SPEC_N] = {
    "n_layers", "n_q_heads", "n_kv_heads", "head_dim", "rotary_dim", "rope_style", "rope_theta", "rope_scaling",
    "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_pos", "yarn_beta_fast",
    "yarn_beta_slow", "yarn_attn_factor"};

/* layer_window: n_layers entries or NULL (the caller checked the count);
 * model_id: NULL for "". */
static kvmem_status spec_in(const double *f, const int32_t *layer_window, const char *model_id,
                            kvmem_model_spec_v2 *s) {
    if (!f) return kvm_fail(KVMEM_ERR_INVALID_ARG, "spec is NULL");
    kvmem_status init = kvmem_model_spec_v2_init(s, sizeof *s);
    if (init != KVMEM_OK) return init;
    int32_t *ints[KVMW_SPEC_N] = {&s->n_layers, &s->n_q_heads, &s->n_kv_heads, &s->head_dim, &s->rotary_dim,
                                  NULL, NULL, NULL, NULL, NULL, NULL, &s->rope_original_max_pos};
    int32_t style = 0, scaling = 0;
    ints[5] = &style;
    ints[7] = &scaling;
    for (int i = 0; i < KVMW_SPEC_N; i++) {
        if (!ints[i]) continue;
        kvmem_status st = kvmw_int32_of(f[i], k_spec_fields[i], ints[i]);
        if (st != KVMEM_OK) return st;
    }
    s->rope_style = (kvmem_rope_style)style;
    s->rope_scaling = (kvmem_rope_scaling)scaling;
    s->rope_theta = f[6];
    s->rope_factor = f[8];
    s->rope_low_freq_factor = f[9];
    s->rope_high_freq_factor = f[10];
    s->yarn_beta_fast = f[12];
    s->yarn_beta_slow = f[13];
    s->yarn_attn_factor = f[14];
    s->layer_window = layer_window;
    if (model_id) {
        size_t n = strlen(model_id);
        if (n >= sizeof s->model_id)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "model_id is %zu bytes: at most %d", n, KVMEM_MAX_MODEL_ID - 1);
        memcpy(s->model_id, model_id, n + 1);
    }
    return KVMEM_OK;
}

/* f: KVMW_SPEC_N doubles; layer_window: s->n_layers entries written when the
 * spec has one (*has_window 1), else untouched; model_id: KVMEM_MAX_MODEL_ID
 * bytes. Either of the last three may be NULL. */
static void spec_out(const kvmem_model_spec_v2 *s, double *f, int32_t *layer_window, int32_t *has_window,
                     char *model_id) {
    const double v[KVMW_SPEC_N] = {s->n_layers, s->n_q_heads, s->n_kv_heads, s->head_dim, s->rotary_dim,
                                   s->rope_style, s->rope_theta, s->rope_scaling, s->rope_factor,
                                   s->rope_low_freq_factor, s->rope_high_freq_factor, s->rope_original_max_pos,
                                   s->yarn_beta_fast, s->yarn_beta_slow, s->yarn_attn_factor};
    memcpy(f, v, sizeof v);
    if (has_window) *has_window = s->layer_window != NULL;
    if (layer_window && s->layer_window) memcpy(layer_window, s->layer_window, (size_t)s->n_layers * sizeof(int32_t));
    if (model_id) memcpy(model_id, s->model_id, sizeof s->model_id);
}

kvmem_status kvmw_spec_defaults(double *f) {
    if (!f) return kvm_fail(KVMEM_ERR_INVALID_ARG, "out is NULL");
    kvmem_model_spec_v2 s;
    kvmem_status st = kvmem_model_spec_v2_init(&s, sizeof s);
    if (st != KVMEM_OK) return st;
    spec_out(&s, f, NULL, NULL, NULL);
    return KVMEM_OK;
}

kvmem_status kvmw_spec_validate(const double *f, const int32_t *layer_window, const char *model_id) {
    kvmem_model_spec_v2 s;
    kvmem_status st = spec_in(f, layer_window, model_id, &s);
    return st != KVMEM_OK ? st : kvmem_model_spec_validate_v2(&s);
}

/* pp: block_size, storage_dtype, capacity_bytes, max_agents,
 * max_tokens_per_agent, host_budget_bytes, device_capacity_bytes
 * (kvmem_pool_params but store_dir). */
kvmem_status kvmw_pool_defaults(double *pp) {
    if (!pp) return kvm_fail(KVMEM_ERR_INVALID_ARG, "out is NULL");
    kvmem_pool_params p = kvmem_pool_default_params();
    pp[0] = p.block_size;
    pp[1] = p.storage_dtype;
    pp[2] = (double)p.capacity_bytes;
    pp[3] = p.max_agents;
    pp[4] = p.max_tokens_per_agent;
    pp[5] = (double)p.host_budget_bytes;
    pp[6] = (double)p.device_capacity_bytes;
    return KVMEM_OK;
}

kvmem_status kvmw_pool_create(kvmem_context *ctx, const double *spec, const int32_t *layer_window,
                              const char *model_id, const double *pp, kvmem_pool **out) {
    kvmem_model_spec_v2 s;
    kvmem_status st = spec_in(spec, layer_window, model_id, &s);
    if (st != KVMEM_OK) return st;
    if (!pp) return kvm_fail(KVMEM_ERR_INVALID_ARG, "params is NULL");
    kvmem_pool_params p = kvmem_pool_default_params();
    int32_t dtype = 0;
    int64_t capacity = 0, budget = 0, device = 0;
    if ((st = kvmw_int32_of(pp[0], "block_size", &p.block_size)) != KVMEM_OK ||
        (st = kvmw_int32_of(pp[1], "storage_dtype", &dtype)) != KVMEM_OK ||
        (st = kvmw_int64_of(pp[2], "capacity_bytes", &capacity)) != KVMEM_OK ||
        (st = kvmw_int32_of(pp[3], "max_agents", &p.max_agents)) != KVMEM_OK ||
        (st = kvmw_int32_of(pp[4], "max_tokens_per_agent", &p.max_tokens_per_agent)) != KVMEM_OK ||
        (st = kvmw_int64_of(pp[5], "host_budget_bytes", &budget)) != KVMEM_OK ||
        (st = kvmw_int64_of(pp[6], "device_capacity_bytes", &device)) != KVMEM_OK)
        return st;
    if (capacity < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "capacity_bytes must be >= 0");
    if (budget < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "host_budget_bytes must be >= 0");
    if (device < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "device_capacity_bytes must be >= 0");
    p.storage_dtype = (kvmem_dtype)dtype;
    p.capacity_bytes = (uint64_t)capacity;
    p.host_budget_bytes = (uint64_t)budget;
    p.device_capacity_bytes = (uint64_t)device;
    return kvmem_pool_create_v2(ctx, &s, &p, out);
}

kvmem_status kvmw_spec(kvmem_pool *pool, kvmem_model_spec *spec) {
    if (!pool) return kvm_fail(KVMEM_ERR_INVALID_ARG, "pool is NULL");
    return kvmem_pool_get_spec(pool, spec);
}

/* The pool's spec as spec_out writes it. The window is copied only when
 * layer_window has room for n_layers entries (cap): *has_window says whether
 * there is one, so a caller asks with cap 0 first and again when it is 1. */
kvmem_status kvmw_pool_spec(kvmem_pool *pool, double *f, int32_t *layer_window, int32_t cap, int32_t *has_window,
                            char *model_id) {
    if (!pool) return kvm_fail(KVMEM_ERR_INVALID_ARG, "pool is NULL");
    kvmem_model_spec_v2 s;
    kvmem_status st = kvmem_model_spec_v2_init(&s, sizeof s);
    if (st == KVMEM_OK) st = kvmem_pool_get_spec_v2(pool, &s);
    if (st != KVMEM_OK) return st;
    if (!f || !has_window || !model_id) return kvm_fail(KVMEM_ERR_INVALID_ARG, "an output is NULL");
    spec_out(&s, f, cap >= s.n_layers ? layer_window : NULL, has_window, model_id);
    return KVMEM_OK;
}

/* out: mirror_bytes, evictions, unmirrored (kvmem_pool_device_stats). */
kvmem_status kvmw_pool_device_stats(kvmem_pool *pool, double *out) {
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "out is NULL");
    uint64_t b = 0, e = 0, u = 0;
    kvmem_status st = kvmem_pool_device_stats(pool, &b, &e, &u);
    if (st != KVMEM_OK) return st;
    out[0] = (double)b;
    out[1] = (double)e;
    out[2] = (double)u;
    return KVMEM_OK;
}

/* out: used_bytes, capacity_bytes, n_agents, block_size, storage_dtype. */
kvmem_status kvmw_pool_info(kvmem_pool *pool, double *out) {
    kvmem_pool_info pi;
    kvmem_status st = kvmem_pool_get_info(pool, &pi);
    if (st != KVMEM_OK) return st;
    out[0] = (double)pi.used_bytes;
    out[1] = (double)pi.capacity_bytes;
    out[2] = pi.n_agents;
    out[3] = pi.block_size;
    out[4] = pi.storage_dtype;
    return KVMEM_OK;
}

/* k, v: [n_layers][n_tokens][n_kv_heads][head_dim] f32; the rest is
 * kvmem_append_params (each pointer NULL when not given). */
kvmem_status kvmw_agent_append(kvmem_pool *pool, kvmem_agent *agent, float *k, float *v, int32_t n_tokens,
                               const int32_t *token_ids, const char *text, int32_t text_len,
                               const int32_t *token_text_offsets, const int32_t *positions, int32_t keys_rotated) {
    kvmem_model_spec spec;
    kvmem_status st = kvmw_spec(pool, &spec);
    if (st != KVMEM_OK) return st;
    if (text_len < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "text_len must be >= 0");
    int64_t shape[4] = {spec.n_layers, n_tokens, spec.n_kv_heads, spec.head_dim};
    kvmem_tensor kt, vt;
    if ((st = kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape)) != KVMEM_OK) return st;
    if ((st = kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape)) != KVMEM_OK) return st;
    kvmem_append_params ap = kvmem_append_default_params();
    ap.token_ids = token_ids;
    ap.text = text_len ? text : NULL;
    ap.text_len = (size_t)text_len;
    ap.token_text_offsets = token_text_offsets;
    ap.positions = positions;
    ap.keys_rotated = keys_rotated;
    return kvmem_agent_append(agent, &kt, &vt, &ap);
}

/* k, v: [n_layers][n][n_kv_heads][head_dim] f32 (either NULL to skip). */
kvmem_status kvmw_agent_read(kvmem_pool *pool, kvmem_agent *agent, double first, double n, float *k, float *v) {
    kvmem_model_spec spec;
    int64_t f0, n0;
    kvmem_status st = kvmw_spec(pool, &spec);
    if (st != KVMEM_OK || (st = kvmw_int64_of(first, "first_token", &f0)) != KVMEM_OK ||
        (st = kvmw_int64_of(n, "n_tokens", &n0)) != KVMEM_OK)
        return st;
    int64_t shape[4] = {spec.n_layers, n0, spec.n_kv_heads, spec.head_dim};
    kvmem_tensor kt, vt;
    if ((st = kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape)) != KVMEM_OK) return st;
    if ((st = kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape)) != KVMEM_OK) return st;
    return kvmem_agent_read(agent, f0, n0, k ? &kt : NULL, v ? &vt : NULL);
}

kvmem_status kvmw_agent_tokens(kvmem_agent *agent, double first, double n, int32_t *out) {
    int64_t f0, n0;
    kvmem_status st;
    if ((st = kvmw_int64_of(first, "first", &f0)) != KVMEM_OK || (st = kvmw_int64_of(n, "n", &n0)) != KVMEM_OK)
        return st;
    return kvmem_agent_tokens(agent, f0, n0, out);
}

kvmem_status kvmw_agent_truncate(kvmem_agent *agent, double n_tokens) {
    int64_t n;
    kvmem_status st = kvmw_int64_of(n_tokens, "n_tokens", &n);
    return st != KVMEM_OK ? st : kvmem_agent_truncate(agent, n);
}

/* out: kind, reuse_tokens, common_bytes, process_from; min_ratio used when
 * has_min_ratio (else kvmem_prefix_default_params()'s). */
kvmem_status kvmw_prefix_match(kvmem_agent *agent, const char *text, int32_t len, int32_t has_min_ratio,
                               double min_ratio, double *out) {
    if (len < 0 || !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "bad text length or NULL out");
    kvmem_prefix_params p = kvmem_prefix_default_params();
    if (has_min_ratio) p.min_ratio = min_ratio;
    kvmem_prefix_result r;
    kvmem_status st = kvmem_prefix_match(agent, len ? text : NULL, (size_t)len, &p, &r);
    if (st != KVMEM_OK) return st;
    out[0] = r.kind;
    out[1] = (double)r.reuse_tokens;
    out[2] = (double)r.common_bytes;
    out[3] = (double)r.process_from;
    return KVMEM_OK;
}

/* out: n_tokens, n_blocks, n_sealed, bytes, text_bytes (as doubles). */
kvmem_status kvmw_agent_info(kvmem_agent *agent, double *out) {
    kvmem_agent_info ai;
    kvmem_status st = kvmem_agent_get_info(agent, &ai);
    if (st != KVMEM_OK) return st;
    out[0] = (double)ai.n_tokens;
    out[1] = ai.n_blocks;
    out[2] = ai.n_sealed;
    out[3] = (double)ai.bytes;
    out[4] = (double)ai.text_bytes;
    return KVMEM_OK;
}

/* out: first_token, n_tokens, sealed. */
kvmem_status kvmw_block_info(kvmem_agent *agent, int32_t block, double *out) {
    kvmem_block_info bi;
    kvmem_status st = kvmem_agent_block_info(agent, block, &bi);
    if (st != KVMEM_OK) return st;
    out[0] = (double)bi.first_token;
    out[1] = bi.n_tokens;
    out[2] = bi.sealed;
    return KVMEM_OK;
}

/* kvmem_rope_apply on a spec given as spec_in reads it. */
kvmem_status kvmw_rope_apply(const double *spec, const int32_t *layer_window, const char *model_id, float *x,
                             int32_t n_rows, int32_t stride, const int32_t *positions, int32_t inverse) {
    kvmem_model_spec_v2 s;
    kvmem_status st = spec_in(spec, layer_window, model_id, &s);
    if (st != KVMEM_OK) return st;
    if (n_rows < 0 || stride < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "n_rows and stride must be >= 0");
    return kvmem_rope_apply_v2(&s, x, (size_t)n_rows, (size_t)stride, positions, inverse);
}

/* The generator of `kvmem demo` for the pool's model. 64-bit seeds travel
 * as two 32-bit halves (this Emscripten splits i64 arguments anyway). */
kvmem_status kvmw_synth_create(kvmem_pool *pool, int32_t n_topics, uint32_t seed_lo, uint32_t seed_hi,
                               kvm_synth **out) {
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "out is NULL");
    kvmem_model_spec spec;
    kvmem_status st = kvmw_spec(pool, &spec);
    if (st != KVMEM_OK) return st;
    if (n_topics < 1 || n_topics > 4096) return kvm_fail(KVMEM_ERR_INVALID_ARG, "n_topics %d: must be in [1, 4096]", n_topics);
    kvm_synth *s = malloc(sizeof *s);
    if (!s) return kvm_fail(KVMEM_ERR_NOMEM, "synth");
    if (!kvm_synth_init(s, &spec, n_topics, ((uint64_t)seed_hi << 32) | seed_lo)) {
        free(s);
        return kvm_fail(KVMEM_ERR_NOMEM, "synth");
    }
    *out = s;
    return KVMEM_OK;
}

void kvmw_synth_free(kvm_synth *s) {
    if (!s) return;
    kvm_synth_free(s);
    free(s);
}

static kvmem_status synth_check(const kvm_synth *s, int32_t topic, int32_t n, const uint64_t *rng) {
    if (!s || !rng) return kvm_fail(KVMEM_ERR_INVALID_ARG, "synth or rng is NULL");
    if (topic < 0 || topic >= s->n_topics) return kvm_fail(KVMEM_ERR_INVALID_ARG, "topic %d: must be in [0, %d)", topic, s->n_topics);
    if (n < 1) return kvm_fail(KVMEM_ERR_INVALID_ARG, "token count %d: must be >= 1", n);
    return KVMEM_OK;
}

/* rng: the generator's 64-bit state in the heap, advanced in place. */
kvmem_status kvmw_synth_tokens(const kvm_synth *s, int32_t topic, int32_t n_tokens, uint64_t *rng, float *k, float *v) {
    kvmem_status st = synth_check(s, topic, n_tokens, rng);
    if (st != KVMEM_OK) return st;
    kvm_synth_tokens(s, topic, n_tokens, rng, k, v);
    return KVMEM_OK;
}
