/* Vulkan kernels for ops whose backend-table entries land with later issues
 * (retrieval: aabb_score, gather with RoPE). Until then they are reached
 * through get_proc_address under the names below, so the conformance suite
 * checks them now and wiring them to the table is a one-line change each.
 * All offsets are in bytes (multiples of 4), strides and counts in elements;
 * every call is synchronous and validated like a table entry. */
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

/* out row i ([n_heads][head_dim], contiguous) = source row idx[i] (rows
 * src_rs apart, n_src of them) rotated by RoPE with the cos/sin of row i's
 * new position: cs = [n_out][rotary_dim/2] cos then [n_out][rotary_dim/2]
 * sin (kvm_rope_cos_sin, computed once per gather). rotary_dim 0: plain
 * gather (values). idx holds uint32 row indices; one >= n_src (the host
 * cannot see device memory to check) gives a zero row, never a stray read. */
#define KVM_VK_PROC_GATHER_ROPE "vulkan.gather_rope"
typedef struct kvm_vk_gather_rope_args {
    const kvmem_buffer *src, *idx, *cs;
    kvmem_buffer *out;
    size_t src_off, idx_off, cs_off, out_off;
    size_t n_src, src_rs, n_out, n_heads, head_dim, rotary_dim;
    int gptj;           /* 0 NEOX, 1 GPT-J pairing */
    float attn_factor;  /* YaRN; 1 otherwise */
} kvm_vk_gather_rope_args;
typedef kvmem_status (*kvm_vk_gather_rope_fn)(kvmem_backend *be, const kvm_vk_gather_rope_args *a);

#endif
