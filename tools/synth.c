#include "synth.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint64_t kvm_synth_next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float kvm_synth_uniform(uint64_t *x) { return (float)(kvm_synth_next(x) >> 40) * (1.0f / 16777216.0f); }

float kvm_synth_normal(uint64_t *x) {
    float u1 = kvm_synth_uniform(x), u2 = kvm_synth_uniform(x);
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

int kvm_synth_init(kvm_synth *s, const kvmem_model_spec *spec, int32_t n_topics, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->n_layers = spec->n_layers;
    s->n_kv_heads = spec->n_kv_heads;
    s->head_dim = spec->head_dim;
    s->n_topics = n_topics;
    s->seed = seed;
    size_t row = (size_t)spec->n_layers * (size_t)spec->n_kv_heads * (size_t)spec->head_dim;
    s->topic = malloc((size_t)n_topics * row * sizeof(float));
    s->mean = malloc(row * sizeof(float));
    s->scale = malloc((size_t)spec->n_layers * (size_t)spec->n_kv_heads * sizeof(float));
    if (!s->topic || !s->mean || !s->scale) {
        kvm_synth_free(s);
        return 0;
    }
    uint64_t rng = seed;
    const int32_t D = spec->head_dim;
    for (size_t r = 0; r < row / (size_t)D; r++) {
        s->scale[r] = 0.5f + kvm_synth_uniform(&rng);          /* per-head variance */
        for (int32_t d = 0; d < D; d++) {
            float m = 0.3f * kvm_synth_normal(&rng);
            if (d % 32 == 3) m += 6.0f * (kvm_synth_uniform(&rng) < 0.5f ? -1.0f : 1.0f); /* outlier channels */
            s->mean[r * (size_t)D + (size_t)d] = m;
        }
    }
    for (size_t t = 0; t < (size_t)n_topics * row / (size_t)D; t++) {
        float *u = s->topic + t * (size_t)D, n2 = 0;
        for (int32_t d = 0; d < D; d++) {
            u[d] = kvm_synth_normal(&rng);
            n2 += u[d] * u[d];
        }
        float inv = 1.0f / sqrtf(n2);
        for (int32_t d = 0; d < D; d++) u[d] *= inv;
    }
    return 1;
}

void kvm_synth_free(kvm_synth *s) {
    free(s->topic);
    free(s->mean);
    free(s->scale);
    memset(s, 0, sizeof *s);
}

void kvm_synth_tokens(const kvm_synth *s, int32_t topic, int32_t T, uint64_t *rng, float *k, float *v) {
    const int32_t L = s->n_layers, H = s->n_kv_heads, D = s->head_dim;
    const size_t row = (size_t)L * (size_t)H * (size_t)D;
    const float strength = 3.0f * sqrtf((float)D); /* topic signal well above the noise */
    for (int32_t l = 0; l < L; l++)
        for (int32_t t = 0; t < T; t++)
            for (int32_t h = 0; h < H; h++) {
                size_t lh = (size_t)l * (size_t)H + (size_t)h;
                const float *mu = s->topic + (size_t)topic * row + lh * (size_t)D;
                const float *mean = s->mean + lh * (size_t)D;
                float sc = s->scale[lh];
                size_t o = (((size_t)l * (size_t)T + (size_t)t) * (size_t)H + (size_t)h) * (size_t)D;
                for (int32_t d = 0; d < D; d++) {
                    k[o + (size_t)d] = mean[d] + sc * (kvm_synth_normal(rng) + 0.25f * strength * mu[d]);
                    v[o + (size_t)d] = kvm_synth_normal(rng) + strength * 0.1f * mu[d];
                }
            }
}
