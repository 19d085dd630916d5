/* The synthetic session generator: see synth.h for the model. */
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

/* Sum of 4 uniforms (16 bits each, from one draw): mean 2, variance 1/3;
 * rescaled to mean 0, variance 1. Exact in float: no libm. */
float kvm_synth_normal(uint64_t *x) {
    uint64_t r = kvm_synth_next(x);
    float s = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) + (float)((r >> 32) & 0xffff) + (float)(r >> 48);
    return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

int kvm_synth_init(kvm_synth *s, const kvmem_model_spec *spec, int32_t n_topics, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->n_layers = spec->n_layers;
    s->n_q_heads = spec->n_q_heads;
    s->n_kv_heads = spec->n_kv_heads;
    s->head_dim = spec->head_dim;
    s->n_topics = n_topics;
    s->seed = seed;
    const int32_t D = spec->head_dim, half = D / 2;
    const size_t heads = (size_t)spec->n_layers * (size_t)spec->n_kv_heads, row = heads * (size_t)D;
    s->topic = malloc((size_t)n_topics * row * sizeof(float));
    s->mean = malloc(row * sizeof(float));
    s->scale = malloc(heads * sizeof(float));
    s->amp = malloc(heads * (size_t)(half ? half : 1) * sizeof(float));
    if (!s->topic || !s->mean || !s->scale || !s->amp) {
        kvm_synth_free(s);
        return 0;
    }
    uint64_t rng = seed;
    for (size_t r = 0; r < heads; r++) {
        s->scale[r] = 0.5f + kvm_synth_uniform(&rng); /* per-head variance */
        float *amp = s->amp + r * (size_t)half, *mean = s->mean + r * (size_t)D;
        for (int32_t j = 0; j < half; j++) {
            float f = half > 1 ? (float)j / (float)(half - 1) : 1.0f;
            amp[j] = 0.5f + 1.5f * f * f; /* energy grows with the wavelength */
        }
        for (int32_t d = 0; d < D; d++) mean[d] = 0.3f * kvm_synth_normal(&rng);
        /* two outlier pairs among the lowest-frequency quarter */
        for (int o = 0; o < 2 && half >= 4; o++) {
            int32_t j = half - 1 - (int32_t)(kvm_synth_next(&rng) % (uint64_t)(half / 4));
            float m = 6.0f + 6.0f * kvm_synth_uniform(&rng);
            mean[j] = kvm_synth_uniform(&rng) < 0.5f ? -m : m;
            mean[j + half] = kvm_synth_uniform(&rng) < 0.5f ? -m : m;
        }
    }
    for (size_t t = 0; t < (size_t)n_topics * heads; t++) {
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
    free(s->amp);
    memset(s, 0, sizeof *s);
}

void kvm_synth_tokens(const kvm_synth *s, int32_t topic, int32_t T, uint64_t *rng, float *k, float *v) {
    const int32_t L = s->n_layers, H = s->n_kv_heads, D = s->head_dim, half = D / 2;
    const size_t row = (size_t)L * (size_t)H * (size_t)D;
    const float sd = sqrtf((float)D), ks = 0.75f * sd, vs = 0.3f * sd;
    for (int32_t l = 0; l < L; l++)
        for (int32_t t = 0; t < T; t++)
            for (int32_t h = 0; h < H; h++) {
                size_t lh = (size_t)l * (size_t)H + (size_t)h;
                const float *u = s->topic + (size_t)topic * row + lh * (size_t)D;
                const float *mean = s->mean + lh * (size_t)D, *amp = s->amp + lh * (size_t)half;
                const float sc = s->scale[lh];
                size_t o = (((size_t)l * (size_t)T + (size_t)t) * (size_t)H + (size_t)h) * (size_t)D;
                for (int32_t d = 0; d < D; d++) {
                    float a = amp[d % half];
                    k[o + (size_t)d] = mean[d] + sc * a * (kvm_synth_normal(rng) + ks * u[d]);
                    v[o + (size_t)d] = kvm_synth_normal(rng) + vs * u[d];
                }
            }
}

void kvm_synth_query(const kvm_synth *s, int32_t topic, int32_t n_q, uint64_t *rng, float *q) {
    const int32_t L = s->n_layers, NQ = s->n_q_heads, H = s->n_kv_heads, D = s->head_dim, half = D / 2;
    const int32_t G = NQ / H;
    const size_t row = (size_t)L * (size_t)H * (size_t)D;
    const float sd = sqrtf((float)D), qs = 1.0f / sd, ts = 0.9f * sd;
    for (int32_t t = 0; t < n_q; t++)
        for (int32_t l = 0; l < L; l++)
            for (int32_t hq = 0; hq < NQ; hq++) {
                size_t lh = (size_t)l * (size_t)H + (size_t)(hq / G);
                const float *u = s->topic + (size_t)topic * row + lh * (size_t)D;
                const float *amp = s->amp + lh * (size_t)half;
                float *o = q + (((size_t)t * (size_t)L + (size_t)l) * (size_t)NQ + (size_t)hq) * (size_t)D;
                for (int32_t d = 0; d < D; d++) o[d] = qs * (kvm_synth_normal(rng) + ts * u[d]) / amp[d % half];
            }
}
