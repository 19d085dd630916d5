/* Vulkan kernels reached by name through get_proc_address: the raw GEMM
 * form of block scoring (the first half of the dev_score entry, which adds
 * normalisation and aggregation), so the conformance suite and the backend
 * benchmark can check and time it alone. Offsets are in bytes (multiples
 * of 4), strides and counts in elements; the call is synchronous and
 * validated like a table entry. */
#ifndef KVMEM_VK_OPS_H
#define KVMEM_VK_OPS_H

#include "backend.h"

/* I(q, b) = sum_d max(q_d smax_d, q_d smin_d) in its GEMM form for `batch`
 * slices (layer x query head): row r of slice b at q + q_off + 4*(b*q_bs + r*q_rs),
 * block k's AABB of slice b at s + s_off + 4*((b/s_div)*s_bs + k*s_rs)
 * (s_div: query heads per KV head, GQA), I(r, k) at
 * out + out_off + 4*(b*o_bs + r*o_rs + k). */
#define KVM_VK_PROC_AABB_SCORE "vulkan.aabb_score"
typedef struct kvm_vk_aabb_score_args {
    const kvmem_buffer *q, *s_min, *s_max;
    kvmem_buffer *out;
    size_t q_off, s_off, out_off;
    size_t n_q, n_blocks, dim, batch, s_div;
    size_t q_bs, q_rs, s_bs, s_rs, o_bs, o_rs;
} kvm_vk_aabb_score_args;
typedef kvmem_status (*kvm_vk_aabb_score_fn)(kvmem_backend *be, const kvm_vk_aabb_score_args *a);

#endif
