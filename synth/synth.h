/* The synthetic multi-turn session generator shared by `kvmem demo`, the
 * `retrieval` benchmark and the browser demo (same generator, same seed,
 * same numbers on every platform).
 *
 * Determinism: only integer arithmetic (splitmix64), float +, * and sqrtf
 * (correctly rounded by IEEE 754) are used, never libm's exp/log/sin/cos,
 * whose last bits differ between C libraries (glibc, musl, Emscripten). Build
 * without -ffast-math and without FMA contraction (-ffp-contract=off, the
 * ISO C default of GCC; pass it explicitly to clang/emcc).
 *
 * Key model, per layer l and KV head h, for a token about topic c:
 *   k[d] = mean[l,h,d] + scale[l,h] * amp[l,h,pair(d)] * (n[d] + s * u_c[l,h,d])
 * - mean: small N(0, 0.3^2) channel offsets plus a few large-magnitude
 *   OUTLIER channels (|mean| 6..12), placed in low-frequency rotary pairs as
 *   in real Llama keys, both halves of the pair;
 * - amp: ROPE-LIKE FREQUENCY STRUCTURE. Channels d and d + head_dim/2 form
 *   NEOX rotary pair j = d mod head_dim/2 and share one amplitude that grows
 *   with the pair's wavelength: amp_j = 0.5 + 1.5 (j / (head_dim/2 - 1))^2
 *   (high-frequency pairs carry little energy, low-frequency pairs most);
 * - scale: PER-HEAD VARIANCE, uniform in [0.5, 1.5] per (layer, head);
 * - n: approximately N(0, 1) noise (Irwin-Hall sum of 4 uniforms, rescaled);
 * - u_c: the topic direction, a random unit vector per (topic, layer, head),
 *   with strength s = 0.75 sqrt(head_dim) (a topic is visible but noisy).
 * Values: v[d] = n[d] + 0.3 sqrt(head_dim) u_c[d].
 * Queries about topic c, per query head hq (KV head g = hq / (n_q/n_kv)):
 *   q[d] = qs * (n[d] + 0.9 sqrt(head_dim) u_c[l,g,d]) / amp_pair(d),
 * qs = 1 / sqrt(head_dim) (a query is weighted toward the channels the keys
 * do not already dominate), so q . k is large for keys of topic c. */
#ifndef KVMEM_SYNTH_H
#define KVMEM_SYNTH_H

#include "kvmem.h"

#include <stdint.h>

typedef struct kvm_synth {
    int32_t n_layers, n_q_heads, n_kv_heads, head_dim, n_topics;
    uint64_t seed;
    float *topic; /* [n_topics][n_layers][n_kv_heads][head_dim], unit vectors */
    float *mean;  /* [n_layers][n_kv_heads][head_dim] */
    float *scale; /* [n_layers][n_kv_heads] */
    float *amp;   /* [n_layers][n_kv_heads][head_dim / 2] (per rotary pair) */
} kvm_synth;

/* Deterministic PRNG (splitmix64) so every build gives the same session. */
uint64_t kvm_synth_next(uint64_t *state);
float kvm_synth_uniform(uint64_t *state); /* [0, 1), 24 random bits */
float kvm_synth_normal(uint64_t *state);  /* ~N(0, 1): Irwin-Hall of 4 uniforms */

/* Build the model's fixed statistics for `spec` (head_dim even). Returns 0 on
 * allocation failure. */
int kvm_synth_init(kvm_synth *s, const kvmem_model_spec *spec, int32_t n_topics, uint64_t seed);
void kvm_synth_free(kvm_synth *s);

/* Fill K and V ([n_layers][T][n_kv_heads][head_dim] f32, contiguous) for T
 * tokens about `topic`, drawing noise from *rng. */
void kvm_synth_tokens(const kvm_synth *s, int32_t topic, int32_t T, uint64_t *rng, float *k, float *v);

/* Fill raw (pre-RoPE) queries q ([n_q][n_layers][n_q_heads][head_dim] f32)
 * for n_q tokens asking about `topic`. */
void kvm_synth_query(const kvm_synth *s, int32_t topic, int32_t n_q, uint64_t *rng, float *q);

#endif
