/* Retrieval kernels ahead of their table entries (vk_ops.h): aabb_score in
 * its GEMM form and gather with RoPE. Validation mirrors the table ops: bad
 * input gets a status and a message and nothing runs. */
#include "vk_internal.h"
#include "vk_ops.h"
#include "internal.h"

#include <string.h>

/* base + (c1-1)*s1 + (c2-1)*s2 + tail elements, overflow-checked (c1, c2 >= 1). */
static int extent(size_t *out, size_t base, size_t c1, size_t s1, size_t c2, size_t s2, size_t tail) {
    size_t a, b;
    return kvm_mul_size(c1 - 1, s1, &a) && kvm_mul_size(c2 - 1, s2, &b) && kvm_add_size(base, a, out) &&
           kvm_add_size(*out, b, out) && kvm_add_size(*out, tail, out);
}

/* The buffer holds `el` f32 elements (from its start) and the shaders can
 * index them with 32-bit indices. */
static int holds(const kvmem_buffer *b, size_t el) {
    return b && el <= UINT32_MAX && el <= b->size / 4;
}

static kvm_vk *impl(kvmem_backend *be) { return be->impl; }

static kvmem_status vk_aabb_score(kvmem_backend *be, const kvm_vk_aabb_score_args *a) {
    kvm_vk *v = impl(be);
    if (!a) return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "aabb_score: args is NULL");
    if (!a->n_q || !a->n_blocks || !a->dim || !a->batch || !a->s_div)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "aabb_score: empty input (n_q %zu, n_blocks %zu, dim %zu, batch %zu, s_div %zu)",
                           a->n_q, a->n_blocks, a->dim, a->batch, a->s_div);
    if (a->q_off % 4 || a->s_off % 4 || a->out_off % 4)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "aabb_score: offsets must be multiples of 4 bytes");
    size_t qe, se, oe;
    if (!extent(&qe, a->q_off / 4, a->batch, a->q_bs, a->n_q, a->q_rs, a->dim) ||
        !extent(&se, a->s_off / 4, (a->batch - 1) / a->s_div + 1, a->s_bs, a->n_blocks, a->s_rs, a->dim) ||
        !extent(&oe, a->out_off / 4, a->batch, a->o_bs, a->n_q, a->o_rs, a->n_blocks) || !holds(a->q, qe) ||
        !holds(a->s_min, se) || !holds(a->s_max, se) || !holds(a->out, oe))
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "aabb_score: ranges outside the buffers");
    if (a->q_rs < a->dim || a->s_rs < a->dim || a->o_rs < a->n_blocks)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "aabb_score: row strides shorter than the rows");
    const uint32_t *lim = v->props.limits.maxComputeWorkGroupCount;
    uint32_t g[3] = {(uint32_t)((a->n_blocks + 15) / 16), (uint32_t)((a->n_q + 15) / 16), (uint32_t)a->batch};
    if ((a->n_blocks + 15) / 16 > lim[0] || (a->n_q + 15) / 16 > lim[1] || a->batch > lim[2])
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "aabb_score: %zu x %zu x %zu exceeds this device's dispatch limits",
                           a->n_q, a->n_blocks, a->batch);
    uint32_t push[14] = {(uint32_t)a->n_q,   (uint32_t)a->n_blocks, (uint32_t)a->dim,     (uint32_t)a->batch,
                         (uint32_t)a->s_div, (uint32_t)(a->q_off / 4), (uint32_t)a->q_bs, (uint32_t)a->q_rs,
                         (uint32_t)(a->s_off / 4), (uint32_t)a->s_bs, (uint32_t)a->s_rs, (uint32_t)(a->out_off / 4),
                         (uint32_t)a->o_bs, (uint32_t)a->o_rs};
    const kvmem_buffer *bufs[4] = {a->q, a->s_min, a->s_max, a->out};
    return kvm_vk_run(v, "aabb_score", KVM_VK_AABB_SCORE, bufs, 4, push, sizeof push, 0, g);
}

static kvmem_status vk_gather_rope(kvmem_backend *be, const kvm_vk_gather_rope_args *a) {
    kvm_vk *v = impl(be);
    if (!a) return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "gather_rope: args is NULL");
    if (!a->n_out || !a->n_heads || !a->head_dim || !a->n_src)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "gather_rope: empty input");
    if (a->rotary_dim % 2 || a->rotary_dim > a->head_dim || (a->gptj != 0 && a->gptj != 1))
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG,
                           "gather_rope: rotary_dim %zu must be even and <= head_dim %zu, gptj 0 or 1", a->rotary_dim,
                           a->head_dim);
    if (a->src_off % 4 || a->idx_off % 4 || a->cs_off % 4 || a->out_off % 4)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "gather_rope: offsets must be multiples of 4 bytes");
    size_t row, se, oe, ce, pairs;
    if (!kvm_mul_size(a->n_heads, a->head_dim, &row) || a->src_rs < row ||
        !extent(&se, a->src_off / 4, a->n_src, a->src_rs, 1, 0, row) ||
        !extent(&oe, a->out_off / 4, a->n_out, row, 1, 0, row) ||
        !kvm_mul_size(a->n_out, a->rotary_dim, &pairs) || !kvm_add_size(a->cs_off / 4, pairs, &ce) ||
        !holds(a->src, se) || !holds(a->out, oe) || !holds(a->idx, a->idx_off / 4 + a->n_out) ||
        (a->rotary_dim && !holds(a->cs, ce)) || (!a->rotary_dim && !a->cs))
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "gather_rope: ranges outside the buffers");
    float af = a->attn_factor;
    uint32_t afb;
    memcpy(&afb, &af, 4);
    uint32_t push[12] = {(uint32_t)a->n_out,  (uint32_t)a->n_heads, (uint32_t)a->head_dim, (uint32_t)a->rotary_dim,
                         (uint32_t)a->gptj,   afb,                   (uint32_t)(a->src_off / 4), (uint32_t)a->src_rs,
                         (uint32_t)(a->out_off / 4), (uint32_t)a->n_src, (uint32_t)(a->idx_off / 4),
                         (uint32_t)(a->cs_off / 4)};
    const kvmem_buffer *bufs[4] = {a->src, a->idx, a->cs, a->out};
    return kvm_vk_run(v, "gather_rope", KVM_VK_GATHER_ROPE, bufs, 4, push, sizeof push, (uint64_t)a->n_out * row, NULL);
}

void *kvm_vk_retrieval_proc(const char *name) {
    void *p = NULL;
    if (strcmp(name, KVM_VK_PROC_AABB_SCORE) == 0) {
        kvm_vk_aabb_score_fn f = vk_aabb_score;
        memcpy(&p, &f, sizeof p);
    } else if (strcmp(name, KVM_VK_PROC_GATHER_ROPE) == 0) {
        kvm_vk_gather_rope_fn f = vk_gather_rope;
        memcpy(&p, &f, sizeof p);
    }
    return p;
}
