/* Prototypes of the wasm glue (the .c files of wasm/glue): the functions kvmem.js
 * calls beside the public API. Not part of the native library. */
#ifndef KVMEM_WASM_GLUE_H
#define KVMEM_WASM_GLUE_H

#include "internal.h"
#include "kvmem.h"

#include <stdint.h>

struct kvm_synth;

const char *kvmw_cpu_kernels(void);
double kvmw_now_ms(void);
kvmem_status kvmw_context_create(const char *backend, int32_t n_threads, kvmem_context **out);
/* Numbers from JavaScript as integer C fields, refused unless whole and in range. */
kvmem_status kvmw_int32_of(double v, const char *name, int32_t *out);
kvmem_status kvmw_int64_of(double v, const char *name, int64_t *out);
/* A kvmem_model_spec crosses as KVMW_SPEC_N doubles (core.c: spec_in). */
#define KVMW_SPEC_N 15
kvmem_status kvmw_spec_defaults(double *f);
kvmem_status kvmw_spec_validate(const double *f, const int32_t *layer_window, const char *model_id);
kvmem_status kvmw_pool_defaults(double *pp);
kvmem_status kvmw_pool_create(kvmem_context *ctx, const double *spec, const int32_t *layer_window,
                              const char *model_id, const double *pp, kvmem_pool **out);
kvmem_status kvmw_spec(kvmem_pool *pool, kvmem_model_spec *spec);
kvmem_status kvmw_pool_spec(kvmem_pool *pool, double *f, int32_t *layer_window, int32_t cap, int32_t *has_window,
                            char *model_id);
kvmem_status kvmw_pool_info(kvmem_pool *pool, double *out);
kvmem_status kvmw_pool_device_stats(kvmem_pool *pool, double *out);
kvmem_status kvmw_agent_append(kvmem_pool *pool, kvmem_agent *agent, float *k, float *v, int32_t n_tokens,
                               const int32_t *token_ids, const char *text, int32_t text_len,
                               const int32_t *token_text_offsets, const int32_t *positions, int32_t keys_rotated);
kvmem_status kvmw_agent_read(kvmem_pool *pool, kvmem_agent *agent, double first, double n, float *k, float *v);
kvmem_status kvmw_agent_tokens(kvmem_agent *agent, double first, double n, int32_t *out);
kvmem_status kvmw_agent_truncate(kvmem_agent *agent, double n_tokens);
kvmem_status kvmw_prefix_match(kvmem_agent *agent, const char *text, int32_t len, int32_t has_min_ratio,
                               double min_ratio, double *out);
kvmem_status kvmw_agent_info(kvmem_agent *agent, double *out);
kvmem_status kvmw_block_info(kvmem_agent *agent, int32_t block, double *out);
kvmem_status kvmw_rope_apply(const double *spec, const int32_t *layer_window, const char *model_id, float *x,
                             int32_t n_rows, int32_t stride, const int32_t *positions, int32_t inverse);
kvmem_status kvmw_synth_create(kvmem_pool *pool, int32_t n_topics, uint32_t seed_lo, uint32_t seed_hi,
                               struct kvm_synth **out);
void kvmw_synth_free(struct kvm_synth *s);
kvmem_status kvmw_synth_tokens(const struct kvm_synth *s, int32_t topic, int32_t n_tokens, uint64_t *rng, float *k,
                               float *v);

/* demo.c: the session script of `kvmem demo` as JSON (static, never freed) */
const char *kvmw_demo_script(void);

#if defined(KVMEM_WASM_HAVE_RETRIEVE)
/* retrieve.c (MemArt retrieval and gather) */
kvmem_status kvmw_synth_query(const struct kvm_synth *s, int32_t topic, int32_t n_q, uint64_t *rng, float *q);
kvmem_status kvmw_retrieve_defaults(double *out);
kvmem_status kvmw_retrieve(kvmem_pool *pool, kvmem_agent *agent, const float *q, int32_t n_q, int32_t top_k,
                           int32_t mode, int32_t norm, int32_t agg, int32_t scope, float tau, float rr_c,
                           const int32_t *exclude, int32_t n_exclude, const int32_t *always_include,
                           int32_t n_always_include, int32_t recent_window, int32_t skip_recent,
                           kvmem_retrieval *result);
kvmem_status kvmw_gather(kvmem_pool *pool, kvmem_agent *agent, const int32_t *blocks, int32_t n_blocks,
                         double base_position, float *k_out, float *v_out, int32_t n_tokens);

#endif

#if defined(KVMEM_WASM_HAVE_ATTEND)
/* attend.c (ART) */
kvmem_status kvmw_attend_defaults(double *out);
kvmem_status kvmw_attend_agent(kvmem_context *ctx, kvmem_pool *pool, kvmem_agent *agent, int32_t layer, const float *q,
                               int32_t n_rows, const int32_t *positions, double base_position, int32_t order,
                               int32_t n_sink, const int32_t *tile_order, int32_t n_tile_order, int32_t tile_size,
                               float scale,
                               float tau_s, float tau_d, int32_t patience, int32_t probe, int32_t causal,
                               int32_t compare, float *out, double *stats);
kvmem_status kvmw_attend_tensors(kvmem_context *ctx, const float *q, int32_t n_rows, int32_t n_q_heads,
                                 int32_t head_dim, const float *k, const float *v, int32_t T, int32_t n_kv_heads,
                                 const uint8_t *mask, int32_t order, int32_t n_sink, const int32_t *tile_order,
                                 int32_t n_tile_order, int32_t tile_size, float scale, float tau_s, float tau_d,
                                 int32_t patience, int32_t probe, int32_t causal, int32_t compare, float *out,
                                 double *stats);
#endif

#if defined(KVMEM_WASM_HAVE_STORY)
/* story.c (the real-model story: examples/tinyllm/story_session.c) */
typedef struct tl_story tl_story;
kvmem_status kvmw_story_open(const uint8_t *model, double model_size, const uint8_t *tok, double tok_size,
                             tl_story **out);
void kvmw_story_free(tl_story *s);
kvmem_status kvmw_story_reset(tl_story *s);
double kvmw_story_history(tl_story *s);
kvmem_status kvmw_story_describe(tl_story *s, char **out);
kvmem_status kvmw_story_session(tl_story *s, const char *text, int32_t len, int32_t art, int32_t art_tile,
                                char **json);
kvmem_status kvmw_story_encode(tl_story *s, const char *text, int32_t len, int32_t bos, int32_t *out, int32_t cap,
                               int32_t *n_out);
kvmem_status kvmw_story_decode(tl_story *s, const int32_t *ids, int32_t n, char **out);
#endif

#endif
