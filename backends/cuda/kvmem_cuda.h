/* Ops of the CUDA backend beyond the backend table: the tensor-core
 * selection path (f16/bf16 block operand, used by the benchmark), a top-k
 * with scores, gather with RoPE from frequencies, the rule score, and
 * diagnostics. The table's own entries (dev_*) are in plugin.cu. They are reached through the escape hatch
 *     fn = (kvmem_cuda_topk_fn)be->iface->get_proc_address(be, KVMEM_CUDA_PROC_TOPK);
 * and used by the conformance suite and the benchmark, so every kernel is
 * exercised on a GPU before it is wired to a table entry.
 *
 * All tensors are in the backend's buffers (device memory), addressed by a
 * (buffer, byte offset) reference; ranges are checked against the buffer.
 * Ops are asynchronous on the backend's stream: KVMEM_CUDA_PROC_SYNCHRONIZE
 * or a download waits. Errors: KVMEM_ERR_INVALID_ARG (shapes, ranges),
 * KVMEM_ERR_UNSUPPORTED (a head dim without a kernel), KVMEM_ERR_BACKEND (a
 * CUDA failure); the message comes from KVMEM_CUDA_PROC_LAST_ERROR (the
 * plugin cannot set the core's kvmem_last_error()).
 * Threading: one backend is used by one thread at a time. */
#ifndef KVMEM_CUDA_H
#define KVMEM_CUDA_H

#include "kvmem.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kvmem_backend;
struct kvmem_buffer;

typedef struct kvmem_cuda_ref {
    struct kvmem_buffer *buf;
    size_t off; /* bytes */
} kvmem_cuda_ref;

#define KVMEM_CUDA_PROC_LAST_ERROR "kvmem_cuda_last_error"
typedef const char *(*kvmem_cuda_last_error_fn)(void);

/* Wait until every op queued on the backend (copies and kernels) is done:
 * what the benchmark times and the conformance suite waits with (the core
 * needs none: each of its device calls ends with a download). */
#define KVMEM_CUDA_PROC_SYNCHRONIZE "kvmem_cuda_synchronize"
typedef kvmem_status (*kvmem_cuda_synchronize_fn)(struct kvmem_backend *be);

typedef struct kvmem_cuda_device_info {
    char name[128];
    int32_t cc_major, cc_minor, n_sms, driver_version, runtime_version;
    uint64_t total_mem;
    size_t smem_per_block_optin;
} kvmem_cuda_device_info;
#define KVMEM_CUDA_PROC_DEVICE_INFO "kvmem_cuda_device_info"
typedef kvmem_status (*kvmem_cuda_device_info_fn)(struct kvmem_backend *be, kvmem_cuda_device_info *out);

/* Device-to-device copy bandwidth of `bytes` bytes, median of `reps`:
 * *gbps = 2 * bytes / time (bytes read plus written), the denominator of
 * kv_gbps ratios. */
#define KVMEM_CUDA_PROC_COPY_GBPS "kvmem_cuda_copy_gbps"
typedef kvmem_status (*kvmem_cuda_copy_gbps_fn)(struct kvmem_backend *be, size_t bytes, int32_t reps, double *gbps);

/* ---- retrieval ---- */

/* Build the block operand [L][Hkv][nb_pad][2D] (f16 or bf16) from the AABBs
 * f32 [NB][L][Hkv][D]; done once per sealed block set. nb_pad is n_blocks
 * rounded up to 16; blk must hold L*Hkv*nb_pad*2D 16-bit values. */
typedef struct kvmem_cuda_blocks_args {
    kvmem_cuda_ref aabb_min, aabb_max, blk;
    int32_t n_layers, n_kv_heads, head_dim, n_blocks;
    kvmem_dtype dtype; /* F16 or BF16 */
} kvmem_cuda_blocks_args;
#define KVMEM_CUDA_PROC_SCORE_BLOCKS "kvmem_cuda_score_blocks"
typedef kvmem_status (*kvmem_cuda_score_blocks_fn)(struct kvmem_backend *be, const kvmem_cuda_blocks_args *a);

/* Scores of every block: q f32 [n_q][L][Hq][D]; out f32 [NB] (per_layer 0)
 * or [L][NB] (per_layer 1); agg (optional, may have buf NULL) receives the
 * per-(layer, query head) aggregates f32 [L][Hq][NB]. */
typedef struct kvmem_cuda_score_args {
    kvmem_cuda_ref q, blk, out, agg;
    int32_t n_layers, n_q_heads, n_kv_heads, head_dim, n_q, n_blocks;
    kvmem_dtype dtype;  /* of blk: F16 or BF16 */
    float tau;          /* softmax temperature; 0 = 1/sqrt(head_dim) */
    float rr_c;         /* RR constant; 0 = 60 */
    int32_t norm_rr;    /* 0 SOFTMAX, 1 RR */
    int32_t agg_sum;    /* 0 MAX, 1 SUM */
    int32_t per_layer;  /* 0 GLOBAL, 1 PER_LAYER */
} kvmem_cuda_score_args;
#define KVMEM_CUDA_PROC_AABB_SCORE "kvmem_cuda_aabb_score"
typedef kvmem_status (*kvmem_cuda_aabb_score_fn)(struct kvmem_backend *be, const kvmem_cuda_score_args *a);

/* Top k of scores f32 [n] (-inf = never selected): idx int32 [k] in
 * chronological order, out_scores f32 [k] (optional), n_out int32 [1]. */
typedef struct kvmem_cuda_topk_args {
    kvmem_cuda_ref scores, idx, out_scores, n_out;
    int64_t n;
    int32_t k;
} kvmem_cuda_topk_args;
#define KVMEM_CUDA_PROC_TOPK "kvmem_cuda_topk"
typedef kvmem_status (*kvmem_cuda_topk_fn)(struct kvmem_backend *be, const kvmem_cuda_topk_args *a);

/* Gather rows[i] of src_k/src_v [n_src][Hkv][D] into dst [M][Hkv][D],
 * rotating K to positions pos[i]; rows[i] < 0 is a dead slot (skipped).
 * rows int64 [M], pos int32 [M], inv_freq f64 [rotary_dim/2]. */
typedef struct kvmem_cuda_gather_args {
    kvmem_cuda_ref src_k, src_v, rows, pos, inv_freq, dst_k, dst_v;
    int64_t n_src, m;
    int32_t n_kv_heads, head_dim, rotary_dim;
    kvmem_rope_style style;
    float attn_factor; /* 0 = 1 */
    kvmem_dtype src_dtype, dst_dtype;
} kvmem_cuda_gather_args;
#define KVMEM_CUDA_PROC_GATHER_ROPE "kvmem_cuda_gather_rope"
typedef kvmem_status (*kvmem_cuda_gather_rope_fn)(struct kvmem_backend *be, const kvmem_cuda_gather_args *a);

/* ART attention has no proc: the backend table's dev_attend entry
 * (core/backend/backend.h) is the CUDA implementation, with the core's stop
 * rule. */

/* ---- eviction (IntentKV) ---- */

/* mem f32 [L][Hq][D]; k [L][N][Hkv][D]; rule f32 [N]. */
typedef struct kvmem_cuda_qmem_args {
    kvmem_cuda_ref mem, k, rule;
    int32_t n_layers, n_q_heads, n_kv_heads, head_dim, n;
    kvmem_dtype dtype;
    float scale; /* 0 = 1/sqrt(head_dim) */
} kvmem_cuda_qmem_args;
#define KVMEM_CUDA_PROC_QMEM_SCORE "kvmem_cuda_qmem_score"
typedef kvmem_status (*kvmem_cuda_qmem_score_fn)(struct kvmem_backend *be, const kvmem_cuda_qmem_args *a);

#ifdef __cplusplus
}
#endif

#endif
