/* Retrieval internals: the descriptors of the retrieval ops (aabb_score,
 * topk, gather); their kernels are the CPU kernel table's (cpu/kernels.h). */
#ifndef KVMEM_RETRIEVE_SCORE_H
#define KVMEM_RETRIEVE_SCORE_H

#include "../backend/backend.h"
#include "../cpu/cpu_backend.h" /* the CPU reference entries read CPU buffers in place */
#include "../pool/pool.h"
#include "../cpu/workbuf.h"
#include "../cpu/kernels.h"

#include <stddef.h>
#include <stdint.h>

/* ---- backend op descriptors ---- */


/* aabb_score: the relevance of every candidate block per set, normalised per
 * query token over the candidates, aggregated over tokens and summed over
 * the set's (layer, query head) pairs:
 *   out[s * n_cand + j] = sum_{l in set s} sum_{hq} agg_t p_t(l, hq, cand[j]).
 * Sets: n_sets 1 (GLOBAL, every layer) or n_layers (PER_LAYER, set s =
 * layer s). Reads the agent's AABBs (AABB mode) or its keys (EXACT mode:
 * F16 and F32 blocks in place through exact_f16 / exact_f32 when few query
 * rows are scored, others through kvm_block_read_f32). */
typedef struct kvm_score_desc {
    const kvmem_pool *pool;
    const kvm_agent_mem *mem;
    const float *q;       /* [n_q][n_layers][n_q_heads][head_dim] f32, contiguous, raw */
    int32_t n_q;
    const int32_t *cand;  /* n_cand ascending sealed block ids */
    int32_t n_cand;
    kvmem_retrieve_mode mode;
    kvmem_retrieve_norm norm;
    kvmem_retrieve_agg agg;
    float tau, rr_c;
    int32_t n_sets;       /* 1 or n_layers */
    float *out;           /* [n_sets][n_cand] */
    kvm_workbuf *scratch; /* reused working memory, or NULL (allocated for the call) */
    const kvm_score_kernels *kern; /* NULL: kvm_cpu_kernels_get()->score */
} kvm_score_desc;

/* gather: blocks concatenated, keys rotated at base .. base+M-1. */
typedef struct kvm_gather_desc {
    const kvmem_pool *pool;
    const kvm_agent_mem *mem;
    const int32_t *blocks;
    int32_t n_blocks;
    const int64_t *first; /* n_blocks + 1 prefix sums of block tokens (row of each block in the output) */
    int64_t base;
    const kvmem_tensor *k_out, *v_out; /* validated, either may be NULL */
} kvm_gather_desc;

/* Largest score buffer (bytes) for which few-row (decode) scoring runs
 * block-major (one pass over the agent's boxes, normalisation fused per
 * chunk of blocks); larger problems go item-major. Tests lower it to reach
 * both. */
extern size_t kvm_score_block_major_max_bytes;

/* Retrieval on the CPU (kvmem_retrieve and kvmem_gather call them directly;
 * be is the context's CPU backend, whose scratch and worker pool they use). */
kvmem_status kvm_cpu_aabb_score(kvmem_backend *be, const kvm_score_desc *d);
/* KVMEM_ERR_INVALID_ARG with the message for a query whose relevance to
 * some block (or whose normalised scores) is not finite. */
kvmem_status kvm_score_overflow(const kvm_score_desc *d);
/* Indices of the k largest of score[0..n) (NaN never selected), ties toward
 * the lower index, written to out_idx in descending score order; *n_out gets
 * min(k, number of non-NaN scores). */
kvmem_status kvm_cpu_topk(kvmem_backend *be, const float *score, int32_t n, int32_t k, int32_t *out_idx,
                          int32_t *n_out);
kvmem_status kvm_cpu_gather(kvmem_backend *be, const kvm_gather_desc *d);
/* Rows [M][H][D] (f32) of layer l into a [L][M][H][D] tensor view. */
void kvm_gather_write_layer(const kvmem_tensor *t, int64_t l, const float *rows, size_t M, size_t H, size_t D);

/* The CPU backend's device kernels (score_dev.c; contracts in core/backend/backend.h,
 * argument checks in dev_args.h). */
kvmem_status kvm_cpu_dev_score(kvmem_backend *be, const kvm_dev_score_args *a);
kvmem_status kvm_cpu_dev_score_reduce(kvmem_backend *be, const kvm_dev_score_reduce_args *a);
kvmem_status kvm_cpu_dev_topk(kvmem_backend *be, const kvm_dev_topk_args *a);
kvmem_status kvm_cpu_dev_gather_rope(kvmem_backend *be, const kvm_dev_gather_args *a);
/* The host ops on a device backend's kernels (dev_route.c): pack the pool's
 * data into its buffers (or read its resident mirror), run dev_score and
 * dev_score_reduce / dev_gather_rope, read back into the descriptors'
 * outputs (AABB mode only for scoring). */
kvmem_status kvm_dev_aabb_score(kvmem_backend *be, const kvm_score_desc *d);
kvmem_status kvm_dev_gather(kvmem_backend *be, const kvm_gather_desc *d);

#endif
