/* Rotary position encoding: inverse frequencies for every style and scaling
 * of DESIGN.md, and rotation of head vectors forward or back. */
#ifndef KVMEM_ROPE_H
#define KVMEM_ROPE_H

#include "kvmem.h"

#include <stddef.h>

#define KVM_ROPE_MAX_PAIRS 512

typedef struct kvm_rope {
    int32_t head_dim, rotary_dim, n_pairs;
    kvmem_rope_style style;
    double attn_factor; /* multiplies the rotated dims (YaRN); 1 otherwise */
    double inv_freq[KVM_ROPE_MAX_PAIRS];
} kvm_rope;

/* Build the table for a validated spec. */
void kvm_rope_init(kvm_rope *r, const kvmem_model_spec *spec);

/* cos/sin (n_pairs each) of position pos, angles in double precision. */
void kvm_rope_cos_sin(const kvm_rope *r, double pos, float *cos_out, float *sin_out);

/* Rotate one head vector in place: forward x <- af * R x, inverse x <- R^T x / af. */
void kvm_rope_rotate(const kvm_rope *r, float *x, const float *c, const float *s, int inverse);

#endif
