/* Flat-argument wrappers over the C API for JavaScript: no C struct crosses
 * into JavaScript, so kvmem.js never depends on struct layouts. Every
 * wrapper returns a kvmem_status and writes its results through pointers
 * the caller allocated in the wasm heap. Compiled only into the wasm module. */
#include "glue.h"

#include "cpu/kernels.h"
#include "synth.h"

#include <emscripten.h>
#include <stdlib.h>
#include <string.h>

const char *kvmw_cpu_kernels(void) { return kvm_cpu_kernels_get()->name; }

double kvmw_now_ms(void) { return emscripten_get_now(); }

kvmem_status kvmw_context_create(int32_t n_threads, kvmem_context **out) {
    kvmem_context_params p = kvmem_context_default_params();
    p.backend = "cpu";
    p.n_threads = n_threads;
    return kvmem_context_create(&p, out);
}

kvmem_status kvmw_pool_create(kvmem_context *ctx, int32_t n_layers, int32_t n_q_heads, int32_t n_kv_heads,
                              int32_t head_dim, int32_t rotary_dim, int32_t rope_style, double rope_theta,
                              int32_t block_size, int32_t storage_dtype, double capacity_bytes,
                              const char *model_id, kvmem_pool **out) {
    kvmem_model_spec spec = kvmem_model_spec_default();
    spec.n_layers = n_layers;
    spec.n_q_heads = n_q_heads;
    spec.n_kv_heads = n_kv_heads;
    spec.head_dim = head_dim;
    spec.rotary_dim = rotary_dim;
    spec.rope_style = (kvmem_rope_style)rope_style;
    spec.rope_theta = rope_theta;
    if (model_id) {
        strncpy(spec.model_id, model_id, sizeof spec.model_id - 1);
        spec.model_id[sizeof spec.model_id - 1] = '\0';
    }
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = block_size;
    pp.storage_dtype = (kvmem_dtype)storage_dtype;
    if (capacity_bytes < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "capacity_bytes must be >= 0");
    pp.capacity_bytes = (uint64_t)capacity_bytes;
    return kvmem_pool_create(ctx, &spec, &pp, out);
}

kvmem_status kvmw_spec(kvmem_pool *pool, kvmem_model_spec *spec) {
    if (!pool) return kvm_fail(KVMEM_ERR_INVALID_ARG, "pool is NULL");
    return kvmem_pool_get_spec(pool, spec);
}

kvmem_status kvmw_agent_append(kvmem_pool *pool, kvmem_agent *agent, float *k, float *v, int32_t n_tokens,
                               const int32_t *positions) {
    kvmem_model_spec spec;
    kvmem_status st = kvmw_spec(pool, &spec);
    if (st != KVMEM_OK) return st;
    int64_t shape[4] = {spec.n_layers, n_tokens, spec.n_kv_heads, spec.head_dim};
    kvmem_tensor kt, vt;
    if ((st = kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape)) != KVMEM_OK) return st;
    if ((st = kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape)) != KVMEM_OK) return st;
    kvmem_append_params ap = kvmem_append_default_params();
    ap.positions = positions;
    ap.keys_rotated = positions != NULL;
    return kvmem_agent_append(agent, &kt, &vt, &ap);
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

kvmem_status kvmw_rope_apply(kvmem_pool *pool, float *x, int32_t n_rows, int32_t stride, const int32_t *positions,
                             int32_t inverse) {
    kvmem_model_spec spec;
    kvmem_status st = kvmw_spec(pool, &spec);
    if (st != KVMEM_OK) return st;
    if (n_rows < 0 || stride < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "n_rows and stride must be >= 0");
    return kvmem_rope_apply(&spec, x, (size_t)n_rows, (size_t)stride, positions, inverse);
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
