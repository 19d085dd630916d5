#include "rope.h"
#include "../internal.h"

#include <math.h>
#include <stdlib.h>

#define KVM_PI 3.14159265358979323846

/* YaRN helpers, as in the YaRN paper's reference implementation. */
static double yarn_correction_dim(double n_rot, double dim, double base, double max_pos) {
    return dim * log(max_pos / (n_rot * 2.0 * KVM_PI)) / (2.0 * log(base));
}

void kvm_rope_init(kvm_rope *r, const kvmem_model_spec *s) {
    int32_t rd = s->rotary_dim ? s->rotary_dim : s->head_dim;
    r->head_dim = s->head_dim;
    r->rotary_dim = rd;
    r->n_pairs = rd / 2;
    r->style = s->rope_style;
    r->attn_factor = 1.0;
    const double base = s->rope_theta, factor = s->rope_factor;
    double low = 0, high = 0;
    if (s->rope_scaling == KVMEM_ROPE_SCALING_YARN) {
        low = floor(yarn_correction_dim(s->yarn_beta_fast, rd, base, s->rope_original_max_pos));
        high = ceil(yarn_correction_dim(s->yarn_beta_slow, rd, base, s->rope_original_max_pos));
        low = KVM_MAX(low, 0.0);
        high = KVM_MIN(high, (double)(rd - 1));
        if (high == low) high += 0.001; /* avoid a zero-width ramp */
        r->attn_factor = s->yarn_attn_factor > 0 ? s->yarn_attn_factor
                         : factor > 1.0          ? 0.1 * log(factor) + 1.0
                                                 : 1.0;
    }
    for (int32_t j = 0; j < r->n_pairs; j++) {
        double f = pow(base, -2.0 * j / rd);
        switch (s->rope_scaling) {
        case KVMEM_ROPE_SCALING_NONE: break;
        case KVMEM_ROPE_SCALING_LINEAR: f /= factor; break;
        case KVMEM_ROPE_SCALING_LLAMA3: {
            /* Llama 3.1: long wavelengths divided by factor, short kept, a
             * smooth blend between. */
            double old = s->rope_original_max_pos;
            double lo_wl = old / s->rope_low_freq_factor, hi_wl = old / s->rope_high_freq_factor;
            double wl = 2.0 * KVM_PI / f;
            if (wl > lo_wl) {
                f = f / factor;
            } else if (wl >= hi_wl) {
                double smooth = (old / wl - s->rope_low_freq_factor) /
                                (s->rope_high_freq_factor - s->rope_low_freq_factor);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
            break;
        }
        case KVMEM_ROPE_SCALING_YARN: {
            double ramp = ((double)j - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extrap = 1.0 - ramp; /* 1: keep the original frequency */
            f = (f / factor) * (1.0 - extrap) + f * extrap;
            break;
        }
        }
        r->inv_freq[j] = f;
    }
}

void kvm_rope_cos_sin(const kvm_rope *r, double pos, float *c, float *s) {
    for (int32_t j = 0; j < r->n_pairs; j++) {
        double a = pos * r->inv_freq[j];
        c[j] = (float)cos(a);
        s[j] = (float)sin(a);
    }
}

void kvm_rope_rotate(const kvm_rope *r, float *x, const float *c, const float *s, int inverse) {
    const int32_t np = r->n_pairs;
    const int32_t step = r->style == KVMEM_ROPE_NEOX ? 1 : 2;   /* index of pair j's first element */
    const int32_t off = r->style == KVMEM_ROPE_NEOX ? np : 1;   /* distance to its partner */
    const float af = (float)r->attn_factor;
    for (int32_t j = 0; j < np; j++) {
        float *a = x + j * step, *b = a + off;
        float x0 = *a, x1 = *b, cj = c[j], sj = inverse ? -s[j] : s[j];
        float y0 = x0 * cj - x1 * sj, y1 = x0 * sj + x1 * cj;
        if (af != 1.0f) {
            y0 = inverse ? y0 / af : y0 * af;
            y1 = inverse ? y1 / af : y1 * af;
        }
        *a = y0;
        *b = y1;
    }
}

kvmem_status kvmem_rope_apply(const kvmem_model_spec *spec, float *x, size_t n_rows, size_t stride,
                              const int32_t *positions, int32_t inverse) {
    kvmem_status st = kvmem_model_spec_validate(spec);
    if (st != KVMEM_OK) return st;
    if (n_rows == 0) return KVMEM_OK;
    if (!x) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_rope_apply: x is NULL");
    if (!positions) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_rope_apply: positions is NULL");
    if (stride < (size_t)spec->head_dim)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_rope_apply: stride %zu < head_dim %d", stride,
                        spec->head_dim);
    if (inverse != 0 && inverse != 1)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_rope_apply: inverse must be 0 or 1, got %d", inverse);
    /* the last row ends at (n_rows - 1) * stride + head_dim floats: that must
     * be addressable, or a wrapped offset would land one row on another */
    size_t span;
    if (!kvm_mul_size(n_rows - 1, stride, &span) || !kvm_add_size(span, (size_t)spec->head_dim, &span) ||
        span > (size_t)PTRDIFF_MAX / sizeof(float))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_rope_apply: %zu rows of stride %zu floats are larger than any array can be",
                        n_rows, stride);
    kvm_rope *r = kvm_malloc(sizeof *r);
    if (!r) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_rope_apply: out of memory for the RoPE tables");
    kvm_rope_init(r, spec);
    float c[KVM_ROPE_MAX_PAIRS], s[KVM_ROPE_MAX_PAIRS];
    int64_t last = INT64_MIN;
    for (size_t i = 0; i < n_rows; i++) {
        if (positions[i] != last) { /* rows of one token share their angles */
            kvm_rope_cos_sin(r, positions[i], c, s);
            last = positions[i];
        }
        kvm_rope_rotate(r, x + i * stride, c, s, inverse);
    }
    kvm_free(r);
    return KVMEM_OK;
}
