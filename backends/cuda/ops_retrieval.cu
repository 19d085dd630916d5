// Retrieval ops of the CUDA backend: the block operand, fused AABB scores,
// block top-k, gather with RoPE. C entry points over the launchers in
// aabb_score.cuh, topk.cuh and gather_rope.cuh.
#include "aabb_score.cuh"
#include "backend_impl.h"
#include "gather_rope.cuh"
#include "topk.cuh"

#include <math.h>

static bool half_dtype(kvmem_dtype dt) { return dt == KVMEM_F16 || dt == KVMEM_BF16; }

extern "C" kvmem_status kvm_cu_op_score_blocks(kvmem_backend *be, const kvmem_cuda_blocks_args *a) {
    if (!be || !a) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "score_blocks: NULL argument");
    if (a->n_layers < 1 || a->n_kv_heads < 1 || a->n_blocks < 1 || a->n_blocks > (1 << 24))
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "score_blocks: %d layers, %d KV heads, %d blocks: need >= 1",
                           a->n_layers, a->n_kv_heads, a->n_blocks);
    if (!kvm_cu_head_dim_supported(a->head_dim))
        return kvm_cu_fail(KVMEM_ERR_UNSUPPORTED, "score_blocks: head_dim %d has no CUDA kernel (64, 128, 256)", a->head_dim);
    if (!half_dtype(a->dtype)) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "score_blocks: dtype must be f16 or bf16");
    kvm_cu_backend *b = cu_impl(be);
    const size_t lh = (size_t)a->n_layers * a->n_kv_heads, nb_pad = ((size_t)a->n_blocks + 15) / 16 * 16;
    const size_t aabb_bytes = (size_t)a->n_blocks * lh * a->head_dim * 4;
    const size_t blk_bytes = lh * nb_pad * 2 * a->head_dim * 2;
    kvmem_status st = KVMEM_OK;
    const float *mn = static_cast<const float *>(cu_ref(a->aabb_min, aabb_bytes, "score_blocks: aabb_min", &st));
    const float *mx = static_cast<const float *>(cu_ref(a->aabb_max, aabb_bytes, "score_blocks: aabb_max", &st));
    void *blk = cu_ref(a->blk, blk_bytes, "score_blocks: blk", &st);
    if (st != KVMEM_OK) return st;
    cudaSetDevice(b->device);
    return cu_check(kvmcu::score_prepare_blocks(mn, mx, blk, (kvmcu::DType)a->dtype, a->n_layers, a->n_kv_heads,
                                                a->head_dim, a->n_blocks, (int)nb_pad, b->stream),
                    "score_blocks");
}

extern "C" kvmem_status kvm_cu_op_aabb_score(kvmem_backend *be, const kvmem_cuda_score_args *a) {
    if (!be || !a) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "aabb_score: NULL argument");
    if (!half_dtype(a->dtype)) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "aabb_score: dtype must be f16 or bf16");
    kvm_cu_backend *b = cu_impl(be);
    kvm_cu_score_shape shape = {a->n_layers, a->n_q_heads, a->n_kv_heads, a->head_dim, a->n_q, a->n_blocks, a->norm_rr};
    kvm_cu_score_plan plan;
    kvmem_status st = kvm_cu_score_plan_make(&shape, b->props.sharedMemPerBlockOptin, &plan);
    if (st != KVMEM_OK) return st;
    const size_t L = (size_t)a->n_layers, NB = (size_t)a->n_blocks, D = (size_t)a->head_dim;
    const void *q = cu_ref(a->q, (size_t)a->n_q * L * a->n_q_heads * D * 4, "aabb_score: q", &st);
    const void *blk = cu_ref(a->blk, plan.blk_bytes, "aabb_score: blk", &st);
    float *out = static_cast<float *>(cu_ref(a->out, (a->per_layer ? L : 1) * NB * 4, "aabb_score: out", &st));
    const size_t agg_bytes = L * a->n_q_heads * NB * 4;
    float *agg = a->agg.buf ? static_cast<float *>(cu_ref(a->agg, agg_bytes, "aabb_score: agg", &st)) : nullptr;
    // workspace: the planned part, then agg when the caller did not give one
    const size_t ws_bytes = plan.ws_bytes + (agg ? 0 : (agg_bytes + 255) / 256 * 256);
    unsigned char *ws = static_cast<unsigned char *>(cu_scratch(b, ws_bytes, &st));
    if (st != KVMEM_OK) return st;
    if (!agg) agg = reinterpret_cast<float *>(ws + plan.ws_bytes);
    kvmcu::ScoreParams p;
    p.n_layers = a->n_layers;
    p.n_q_heads = a->n_q_heads;
    p.n_kv_heads = a->n_kv_heads;
    p.n_q = a->n_q;
    p.n_blocks = a->n_blocks;
    p.heads_per_cta = plan.heads_per_cta;
    p.rows_pad = plan.rows_pad;
    p.nb_pad = plan.nb_pad;
    p.sort_len = plan.sort_len;
    p.tau = a->tau > 0 ? a->tau : 1.0f / sqrtf((float)a->head_dim);
    p.rr_c = a->rr_c > 0 ? a->rr_c : 60.0f;
    p.norm_rr = a->norm_rr != 0;
    p.agg_sum = a->agg_sum != 0;
    cudaSetDevice(b->device);
    return cu_check(kvmcu::aabb_score(static_cast<const float *>(q), blk, (kvmcu::DType)a->dtype, a->head_dim, p,
                                      plan.in_smem, plan.smem_bytes, ws, agg, out, a->per_layer != 0, b->stream),
                    "aabb_score");
}

extern "C" kvmem_status kvm_cu_op_topk(kvmem_backend *be, const kvmem_cuda_topk_args *a) {
    if (!be || !a) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "topk: NULL argument");
    kvm_cu_backend *b = cu_impl(be);
    kvm_cu_topk_plan plan;
    kvmem_status st = kvm_cu_topk_plan_make(a->n, a->k, &plan);
    if (st != KVMEM_OK) return st;
    const float *s = static_cast<const float *>(cu_ref(a->scores, (size_t)a->n * 4, "topk: scores", &st));
    int *idx = static_cast<int *>(cu_ref(a->idx, (size_t)plan.k * 4, "topk: idx", &st));
    float *os = a->out_scores.buf ? static_cast<float *>(cu_ref(a->out_scores, (size_t)plan.k * 4, "topk: out_scores", &st))
                                  : nullptr;
    int *n_out = static_cast<int *>(cu_ref(a->n_out, 4, "topk: n_out", &st));
    if (st != KVMEM_OK) return st;
    cudaSetDevice(b->device);
    return cu_check(kvmcu::topk(s, (int)a->n, plan.k, plan.sort_len, plan.smem_bytes, idx, os, n_out, b->stream), "topk");
}

extern "C" kvmem_status kvm_cu_op_gather_rope(kvmem_backend *be, const kvmem_cuda_gather_args *a) {
    if (!be || !a) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "gather_rope: NULL argument");
    kvm_cu_backend *b = cu_impl(be);
    if (a->n_kv_heads < 1 || a->head_dim < 2 || a->head_dim > 1024 || a->head_dim % 2 || a->rotary_dim < 0 ||
        a->rotary_dim > a->head_dim || a->rotary_dim % 2 || a->n_src < 0 || a->m < 0)
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG,
                           "gather_rope: %d KV heads, head_dim %d, rotary_dim %d: need head_dim even in [2, 1024], rotary_dim even <= head_dim",
                           a->n_kv_heads, a->head_dim, a->rotary_dim);
    if (a->style != KVMEM_ROPE_NEOX && a->style != KVMEM_ROPE_GPTJ)
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "gather_rope: unknown RoPE style %d", (int)a->style);
    size_t ses, des;
    if (!kvm_cu_tensor_bytes(a->src_dtype, 1, &ses) || !kvm_cu_tensor_bytes(a->dst_dtype, 1, &des))
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "gather_rope: dtypes must be f32, f16 or bf16");
    const size_t row = (size_t)a->n_kv_heads * a->head_dim;
    kvmem_status st = KVMEM_OK;
    const void *sk = cu_ref(a->src_k, (size_t)a->n_src * row * ses, "gather_rope: src_k", &st);
    const void *sv = cu_ref(a->src_v, (size_t)a->n_src * row * ses, "gather_rope: src_v", &st);
    const int64_t *rows = static_cast<const int64_t *>(cu_ref(a->rows, (size_t)a->m * 8, "gather_rope: rows", &st));
    const int32_t *pos = static_cast<const int32_t *>(cu_ref(a->pos, (size_t)a->m * 4, "gather_rope: pos", &st));
    // no rotated dims (rotary_dim 0): no frequencies to read
    const double *inv = a->rotary_dim ? static_cast<const double *>(cu_ref(a->inv_freq, (size_t)(a->rotary_dim / 2) * 8,
                                                                          "gather_rope: inv_freq", &st))
                                      : nullptr;
    void *dk = cu_ref(a->dst_k, (size_t)a->m * row * des, "gather_rope: dst_k", &st);
    void *dv = cu_ref(a->dst_v, (size_t)a->m * row * des, "gather_rope: dst_v", &st);
    if (st != KVMEM_OK) return st;
    // rows outside [0, n_src) are skipped like dead slots: never read
    kvmcu::RopeParams p = {a->n_kv_heads, a->head_dim, a->rotary_dim, a->style == KVMEM_ROPE_GPTJ,
                           a->attn_factor > 0 ? a->attn_factor : 1.0f};
    cudaSetDevice(b->device);
    kvm_cu_grid g = kvm_cu_grid_1d((size_t)a->m, 1, (uint32_t)b->props.multiProcessorCount * 16u);
    return cu_check(kvmcu::gather_rope(sk, sv, (kvmcu::DType)a->src_dtype, a->n_src, rows, pos, inv, a->m, dk, dv,
                                       (kvmcu::DType)a->dst_dtype, p, g.blocks, b->stream),
                    "gather_rope");
}
