/* Retrieval internals: the descriptors of the retrieval ops (aabb_score,
 * topk, gather); their kernels are the CPU kernel table's (cpu/kernels.h). */
#ifndef KVMEM_RETRIEVE_SCORE_H
#define KVMEM_RETRIEVE_SCORE_H

#include "../backend/backend.h"
#include "../cpu/cpu_backend.h"
#include "../pool/pool.h"
#include "../cpu/workbuf.h"
#include "../cpu/kernels.h"

#include <stddef.h>
#include <stdint.h>

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
    struct kvm_devt *k_dev, *v_dev;    /* (optional) k_out / v_out name device memory: a device
                                          path may write it in place (backend/route/devtensor.h) */
} kvm_gather_desc;

/* The CPU backend's retrieval ops run through its table (core/cpu); the
 * CPU gather over the agent's blocks in place (gather.c). */
kvmem_status kvm_cpu_gather(kvmem_backend *be, const kvm_gather_desc *d);
/* Rows [M][H][D] (f32) of layer l into a [L][M][H][D] tensor view. */
void kvm_gather_write_layer(const kvmem_tensor *t, int64_t l, const float *rows, size_t M, size_t H, size_t D);
/* KVMEM_ERR_INVALID_ARG with the message for a query whose scores are not
 * finite (its relevance to some block overflows f32). */
kvmem_status kvm_score_overflow(const kvm_score_desc *d);

/* The host ops on a device backend's kernels (dev_route.c): pack the pool's
 * data into its buffers (or read its resident mirror), run dev_score and
 * dev_score_reduce / dev_gather_rope, read back into the descriptors'
 * outputs (EXACT scoring from the resident keys only: one run of full
 * blocks; KVMEM_ERR_UNSUPPORTED otherwise, for the CPU to run). */
kvmem_status kvm_dev_aabb_score(kvmem_backend *be, const kvm_score_desc *d);
kvmem_status kvm_dev_gather(kvmem_backend *be, const kvm_gather_desc *d);

#endif
