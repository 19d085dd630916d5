/* Retrieval internals: the scoring kernels (scalar reference, AVX2, AVX-512)
 * and the descriptors of the retrieval backend ops (aabb_score, topk,
 * gather) that core/backend/backend.h points at.
 *
 * Scoring is a matrix product. For one (layer, KV head) the R query rows of
 * its head group (n_q tokens x G query heads) meet the candidate blocks:
 *   AABB:  I[j][r] = [q+ || q-]_r . [s_max || s_min]_j     (K = 2 * head_dim)
 *   EXACT: I[j][r] = max_i q_r . k_{j,i}                    (K = head_dim)
 * Scores are kept block-major, out[j * ldo + r], so per-token normalisation
 * over blocks runs down columns with whole vectors of rows. */
#ifndef KVMEM_RETRIEVE_SCORE_H
#define KVMEM_RETRIEVE_SCORE_H

#include "../backend/backend.h"
#include "../cpu/cpu_backend.h" /* the CPU reference entries read CPU buffers in place */
#include "../pool/pool.h"
#include "../cpu/workbuf.h"

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
    /* AABB row product on the stored boxes, for few query rows (decode):
     *   out[j * ldo + r] = sum_d q_rd * (q_rd < 0 ? b[j][D + d] : b[j][d]),  j < n, r < R,
     * q [R][D] raw query rows, b[j] a box of 2*D elements (s_max, then s_min):
     * f16 (aabb_rows_f16) or f32 (aabb_rows_f32). This is [q+ || q-] .
     * [s_max || s_min] with one multiply-add per (row, dimension) instead of
     * two: the half of the products that are zero are never formed. The
     * boxes of the following items of a block are prefetched (the pool keeps
     * them right after b[j]). */
    void (*aabb_rows_f16)(const float *q, size_t R, const uint16_t *const *b, size_t n, size_t D, float *out,
                          size_t ldo);
    void (*aabb_rows_f32)(const float *q, size_t R, const float *const *b, size_t n, size_t D, float *out,
                          size_t ldo);
    /* Column maxima: m[c] = max(m[c], x[j * ld + c]), j < n, c < cols. */
    void (*col_max)(const float *x, size_t n, size_t ld, size_t cols, float *m);
    /* Shifted exponentials and their column sums: x[j * ld + c] =
     * exp(tau * (x[j * ld + c] - m[c])) (<= 1: m holds the column maxima),
     * z[c] += x[j * ld + c]. Accuracy of exp_neg. */
    void (*col_exp_sum)(float *x, size_t n, size_t ld, size_t cols, const float *m, float tau, float *z);
    /* sum_i a[i] * b[i], f32 lanes (order differs by table). */
    float (*dot)(const float *a, const float *b, size_t n);
    /* EXACT on one stored section of keys, for few query rows (decode):
     *   out[r] = max_{i < n} sum_d q[r * D + d] * k[i * D + d],  r < R,
     * q [R][D] raw query rows, k [n][D] contiguous key rows as the pool
     * stores them: f16 (exact_f16) or f32 (exact_f32). The keys are
     * widened in registers and each key row meets every query row of the
     * KV head while it is loaded, the max over the rows kept there: one
     * pass over the stored bytes, no f32 copy. */
    void (*exact_f16)(const float *q, size_t R, const uint16_t *k, size_t n, size_t D, float *out);
    void (*exact_f32)(const float *q, size_t R, const float *k, size_t n, size_t D, float *out);
} kvm_score_kernels;

const kvm_score_kernels *kvm_score_kernels_scalar(void);
const kvm_score_kernels *kvm_score_kernels_avx2(void);   /* NULL when not compiled in */
const kvm_score_kernels *kvm_score_kernels_avx512(void); /* NULL when not compiled in */
const kvm_score_kernels *kvm_score_kernels_wasm128(void); /* NULL outside the WebAssembly build */
/* The table matching kvm_cpu_kernels_get() (so KVMEM_CPU forces it too). */
const kvm_score_kernels *kvm_score_kernels_get(void);

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
