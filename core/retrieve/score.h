/* Retrieval internals: the scoring kernels (scalar reference, AVX2, AVX-512)
 * and the descriptors of the retrieval backend ops (aabb_score, topk,
 * gather) that core/backend.h points at.
 *
 * Scoring is a matrix product. For one (layer, KV head) the R query rows of
 * its head group (n_q tokens x G query heads) meet the candidate blocks:
 *   AABB:  I[j][r] = [q+ || q-]_r . [s_max || s_min]_j     (K = 2 * head_dim)
 *   EXACT: I[j][r] = max_i q_r . k_{j,i}                    (K = head_dim)
 * Scores are kept block-major, out[j * ldo + r], so per-token normalisation
 * over blocks runs down columns with whole vectors of rows. */
#ifndef KVMEM_RETRIEVE_SCORE_H
#define KVMEM_RETRIEVE_SCORE_H

#include "../backend.h"
#include "../pool/pool.h"

#include <stddef.h>
#include <stdint.h>

/* Rows of a transposed query panel are padded to a multiple of this. */
#define KVM_SCORE_ROW_PAD 16

typedef struct kvm_score_kernels {
    const char *name; /* "scalar", "avx2", "avx512", "wasm128" */
    /* Panel product, for many query rows (prefill):
     *   out[j * ldo + r] = sum_k qt[k * rp + r] * b[j][k],  j < n, r < rp,
     * qt is the transposed query panel [K][rp], rp a multiple of
     * KVM_SCORE_ROW_PAD; b[j] points at K floats. */
    void (*panel)(const float *qt, size_t rp, const float *const *b, size_t n, size_t K, float *out,
                  size_t ldo);
    /* Row product, for few query rows (decode):
     *   out[j * ldo + r] = sum_k q[r * K + k] * b[j][k],  j < n, r < R. */
    void (*rows)(const float *q, size_t R, const float *const *b, size_t n, size_t K, float *out,
                 size_t ldo);
    /* In place x[i] = exp(x[i]) for x[i] <= 0 (arguments of a max-shifted
     * softmax); relative error below 2e-7 (SIMD) vs expf. */
    void (*exp_neg)(float *x, size_t n);
    /* Below this many query rows `rows` beats `panel`. */
    size_t rows_below;
} kvm_score_kernels;

const kvm_score_kernels *kvm_score_kernels_scalar(void);
const kvm_score_kernels *kvm_score_kernels_avx2(void);   /* NULL when not compiled in */
const kvm_score_kernels *kvm_score_kernels_avx512(void); /* NULL when not compiled in */
const kvm_score_kernels *kvm_score_kernels_wasm128(void); /* NULL outside the WebAssembly build */
/* The table matching kvm_cpu_kernels_get() (so KVMEM_CPU forces it too). */
const kvm_score_kernels *kvm_score_kernels_get(void);

/* ---- backend op descriptors ---- */

/* aabb_score: scores of every candidate block, normalised per query token,
 * aggregated over tokens and summed over the query heads of each KV head:
 *   out[(l * n_kv_heads + g) * n_cand + j] = sum_{hq in group g} agg_t p_t(l, hq, cand[j]).
 * Reads the agent's AABBs (AABB mode) or its keys through
 * kvm_block_read_f32 (EXACT mode). */
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
    float *out;           /* [n_layers][n_kv_heads][n_cand] */
    const kvm_score_kernels *kern; /* NULL: kvm_score_kernels_get() */
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
 * block-major; larger problems go item-major. Tests lower it to reach both. */
extern size_t kvm_score_block_major_max_bytes;

/* The CPU implementations the CPU backend's table points at. */
kvmem_status kvm_cpu_aabb_score(kvmem_backend *be, const kvm_score_desc *d);
/* Indices of the k largest of score[0..n) (NaN never selected), ties toward
 * the lower index, written to out_idx in descending score order; *n_out gets
 * min(k, number of non-NaN scores). */
kvmem_status kvm_cpu_topk(kvmem_backend *be, const float *score, int32_t n, int32_t k, int32_t *out_idx,
                          int32_t *n_out);
kvmem_status kvm_cpu_gather(kvmem_backend *be, const kvm_gather_desc *d);

/* The CPU backend's device kernels (score_dev.c; contracts in core/backend.h,
 * argument checks in dev_args.h). */
kvmem_status kvm_cpu_dev_score(kvmem_backend *be, const kvm_dev_score_args *a);
kvmem_status kvm_cpu_dev_topk(kvmem_backend *be, const kvm_dev_topk_args *a);
kvmem_status kvm_cpu_dev_gather_rope(kvmem_backend *be, const kvm_dev_gather_args *a);
/* The host ops on a device backend's kernels (dev_route.c): pack the pool's
 * data into its buffers, run dev_score / dev_gather_rope, read back into the
 * descriptors' outputs (AABB mode only for scoring). */
kvmem_status kvm_dev_aabb_score(kvmem_backend *be, const kvm_score_desc *d);
kvmem_status kvm_dev_gather(kvmem_backend *be, const kvm_gather_desc *d);

#endif
