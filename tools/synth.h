/* The synthetic multi-turn session generator shared by `kvmem demo`, the
 * benchmarks and the browser demo (same generator, same seed, same numbers).
 *
 * Keys are built to look like real attention keys: a per-(layer, head)
 * mean with a few large-magnitude outlier channels, a per-head scale, a
 * topic direction that gives each turn's tokens something in common, and
 * Gaussian noise. Values are noise plus the topic direction. */
#ifndef KVMEM_SYNTH_H
#define KVMEM_SYNTH_H

#include "kvmem.h"

#include <stdint.h>

typedef struct kvm_synth {
    int32_t n_layers, n_kv_heads, head_dim, n_topics;
    uint64_t seed;
    float *topic;   /* [n_topics][n_layers][n_kv_heads][head_dim], unit vectors */
    float *mean;    /* [n_layers][n_kv_heads][head_dim] */
    float *scale;   /* [n_layers][n_kv_heads] */
} kvm_synth;

/* Deterministic PRNG (splitmix64) so every build gives the same session. */
uint64_t kvm_synth_next(uint64_t *state);
float kvm_synth_uniform(uint64_t *state);  /* [0, 1) */
float kvm_synth_normal(uint64_t *state);   /* N(0, 1), Box-Muller */

int kvm_synth_init(kvm_synth *s, const kvmem_model_spec *spec, int32_t n_topics, uint64_t seed);
void kvm_synth_free(kvm_synth *s);

/* Fill K and V ([n_layers][T][n_kv_heads][head_dim] f32, contiguous) for T
 * tokens about `topic`, drawing noise from *rng. */
void kvm_synth_tokens(const kvm_synth *s, int32_t topic, int32_t T, uint64_t *rng, float *k, float *v);

#endif
