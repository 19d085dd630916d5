/* Host-side logic of the CUDA backend, in plain C so that it builds and is
 * unit-tested on machines without CUDA (tests/backend/test_cuda_host.c):
 * argument validation, launch-parameter computation, the caching device
 * allocator's bookkeeping and the pinned staging plan. The plugin links it;
 * nothing here calls CUDA. */
#ifndef KVMEM_CUDA_HOST_H
#define KVMEM_CUDA_HOST_H

#include "backend.h" /* kvm_op, for supports_op; kvmem.h with its experimental section */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ----
 * The plugin cannot reach the core's kvm_fail (hidden in libkvmem), so it
 * keeps its own thread-local message, readable through the backend's
 * get_proc_address("kvmem_cuda_last_error"). */
kvmem_status kvm_cu_fail(kvmem_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
const char *kvm_cu_last_error(void);

/* ---- validation ---- */

/* [off, off + n) inside a buffer of `size` bytes, without overflow. */
bool kvm_cu_in_range(size_t size, size_t off, size_t n);
/* Bytes of n elements of a tensor dtype (F32/F16/BF16); false on overflow or
 * another dtype. */
bool kvm_cu_tensor_bytes(kvmem_dtype dt, size_t n, size_t *bytes);

/* Head dims with a compiled kernel (DISPATCH_HEAD_DIM in common.cuh). */
bool kvm_cu_head_dim_supported(int32_t head_dim);

/* ---- device tensors ----
 * Whether the plugin may wrap the caller's memory mem (kvmem.h, "Device
 * tensors") for a backend on CUDA device backend_device: pointer_is_device
 * and pointer_device are what cudaPointerGetAttributes said of
 * mem->handle (0 and -1 when it did not know the pointer). KVMEM_OK, or the
 * refusal with its message: INVALID_ARG for a descriptor that cannot name
 * device memory, UNSUPPORTED for memory of another kind or device (named). */
kvmem_status kvm_cu_wrap_check(const kvmem_device_memory *mem, int32_t backend_device, int32_t pointer_device,
                               int pointer_is_device);

/* ---- launch parameters ---- */

typedef struct kvm_cu_grid {
    uint32_t blocks;  /* 0 when there is nothing to do */
    uint32_t threads;
} kvm_cu_grid;

/* Grid-stride 1-D launch: enough blocks to cover n, at most max_blocks. */
kvm_cu_grid kvm_cu_grid_1d(size_t n, uint32_t threads, uint32_t max_blocks);

/* aabb_score (fused GEMM + per-token normalisation + aggregation), one CTA per
 * (layer, group of query heads sharing a KV head): the group's rows share one
 * pass over the KV head's block operand, which grouped-query models would
 * otherwise read once per query head. */
typedef struct kvm_cu_score_shape {
    int32_t n_layers, n_q_heads, n_kv_heads, head_dim;
    int32_t n_q;      /* query tokens */
    int32_t n_blocks; /* candidate blocks */
    int32_t norm_rr;  /* 1: reciprocal-rank normalisation (needs a per-row sort) */
} kvm_cu_score_shape;

typedef struct kvm_cu_score_plan {
    int32_t heads_per_cta; /* query heads of one KV head per CTA (divides Hq/Hkv) */
    int32_t rows_pad;    /* heads_per_cta * n_q rows (head-major) rounded up to the 16-row MMA tile */
    int32_t nb_pad;      /* n_blocks rounded up to the 16-column MMA tile */
    int32_t sort_len;    /* power of two >= n_blocks for the RR sort; 0 for softmax */
    int32_t in_smem;     /* 1: scores stay in shared memory; 0: in the workspace */
    size_t smem_bytes;   /* dynamic shared memory per CTA */
    size_t qp_bytes;     /* [L][Hq/heads_per_cta][rows_pad][2D] half query operand */
    size_t blk_bytes;    /* [L][Hkv][nb_pad][2D] half block operand */
    size_t ws_bytes;     /* workspace the caller provides (qp + global scores/sort when !in_smem) */
} kvm_cu_score_plan;

#define KVM_CU_SCORE_MAX_Q 64 /* query tokens per fused CTA (4 MMA row tiles) */

/* Fill *plan for a shape and a per-CTA shared memory limit; INVALID_ARG or
 * UNSUPPORTED (with a message) when the shape cannot run. */
kvmem_status kvm_cu_score_plan_make(const kvm_cu_score_shape *s, size_t smem_limit,
                                    kvm_cu_score_plan *plan);

#define KVM_CU_TOPK_MAX_K 2048

/* Block top-k: one CTA, the selected indices sorted chronologically in a
 * power-of-two buffer of shared memory. */
typedef struct kvm_cu_topk_plan {
    int32_t k;          /* min(k, n) */
    int32_t sort_len;   /* power of two >= k */
    size_t smem_bytes;
} kvm_cu_topk_plan;
kvmem_status kvm_cu_topk_plan_make(int64_t n, int32_t k, kvm_cu_topk_plan *plan);

/* ---- the device-kernel table entries (core/backend/backend.h, API 5) ----
 * Argument checks of dev_score, dev_score_reduce, dev_topk,
 * dev_gather_rope, dev_attend and dev_qmem_score,
 * with the byte sizes of the buffers passed in (the plugin knows them;
 * kvmem_buffer is opaque here). Each returns KVMEM_OK, KVMEM_ERR_INVALID_ARG
 * (shapes, ranges, offsets not multiples of 4) or KVMEM_ERR_UNSUPPORTED (a
 * size beyond this backend's kernels), with the message in
 * kvm_cu_last_error(), and fills the launch plan the kernels need. */
struct kvm_dev_score_args;
struct kvm_dev_topk_args;
struct kvm_dev_gather_args;
struct kvm_dev_attend_args;
struct kvm_dev_qmem_args;
struct kvm_dev_score_reduce_args;

#define KVM_CU_DEV_MAX_HEAD_DIM 256 /* register tiles of 8 elements per lane */

/* a*b (and a*b*c) without overflow; false when it would overflow */
bool kvm_cu_mul2(size_t a, size_t b, size_t *out);
bool kvm_cu_mul3(size_t a, size_t b, size_t c, size_t *out);

/* dev_score: scores [L][Hq][n_q][nb] f32 in the workspace (ws_scores bytes),
 * then a normalisation pass; RR sorts (key, index) pairs of sort_len (a
 * power of two >= nb) in shared memory when sort_in_smem, else in the
 * workspace (ws_sort bytes). Rows of the query operand are staged in
 * shared memory rows_chunk at a time. */
typedef struct kvm_cu_dev_score_plan {
    size_t ws_scores, ws_sort, ws_bytes;
    int32_t sort_len, sort_in_smem;
    int32_t rows_chunk;   /* query rows (head, token) per shared-memory stage */
    int32_t blocks_per_cta;
    int64_t score_ctas;   /* L * Hkv * ceil(nb / blocks_per_cta) */
} kvm_cu_dev_score_plan;
#define KVM_CU_SCORE_SMEM_FLOATS 8192 /* 32 KiB of staged query rows */
#define KVM_CU_SORT_SMEM_PAIRS 4096   /* 32 KiB of (key, index) pairs */
/* key_size: byte size of a buffer of EXACT's key_rows (the buffer form) */
kvmem_status kvm_cu_check_dev_score(const struct kvm_dev_score_args *a, size_t q_size, size_t s_min_size,
                                    size_t s_max_size, size_t out_size, size_t (*key_size)(const struct kvmem_buffer *),
                                    kvm_cu_dev_score_plan *plan);

/* dev_score_reduce: one thread per output element (grid-stride). */
kvmem_status kvm_cu_check_dev_score_reduce(const struct kvm_dev_score_reduce_args *a, size_t in_size, size_t out_size);

kvmem_status kvm_cu_check_dev_topk(const struct kvm_dev_topk_args *a, size_t scores_size, size_t idx_size);

kvmem_status kvm_cu_check_dev_gather(const struct kvm_dev_gather_args *a, size_t src_size, size_t idx_size,
                                     size_t cs_size, size_t out_size);

/* dev_attend: tiles are visited in waves of tiles_per_wave (all computed in
 * parallel, split-K), then one fold per stream applies them in order with
 * the stop rule, so at most one wave of work is spent past a stop. Query
 * heads are taken group_chunk at a time per CTA (K/V read once per chunk). */
#define KVM_CU_ATTEND_GROUP_CHUNK 8
typedef struct kvm_cu_dev_attend_plan {
    int64_t n_tiles;         /* ceil(n_pos / tile) */
    int32_t group;           /* G = n_q_heads / n_kv_heads */
    int32_t n_gchunks;       /* ceil(G / KVM_CU_ATTEND_GROUP_CHUNK) */
    int32_t vec;             /* elements per lane: 1, 2, 4 or 8 (head_dim <= 32 * vec) */
    int32_t tiles_per_wave, n_waves;
    int32_t probe_n;         /* kvm_cu_probe_len(G * head_dim) */
    /* workspace pieces, byte offsets (256-aligned) */
    size_t off_part;         /* f32 [Hq][tpw][head_dim + 2]: o, m, l of each tile */
    size_t off_live;         /* int32 [Hkv][tpw]: live positions of each tile */
    size_t off_bad;          /* int32 [Hkv][tpw]: lowest position of the tile with a non-finite logit, INT32_MAX: none */
    size_t off_o, off_ml;    /* f32 [Hq][head_dim]; f32 [Hq][2] running m, l */
    size_t off_z;            /* f32 [Hkv][32] previous probe */
    size_t off_rule;         /* kvm_cu_rule [Hkv] */
    size_t off_pos;          /* int32 [Hkv]: live positions of the tiles each stream counted */
    size_t off_score;        /* scored: f32 [Hkv][n_tiles], each tile's largest logit per stream */
    size_t ws_bytes;
} kvm_cu_dev_attend_plan;
kvmem_status kvm_cu_check_dev_attend(const struct kvm_dev_attend_args *a, size_t q_size, size_t k_size,
                                     size_t v_size, size_t slot_map_size, size_t order_size, size_t out_size,
                                     size_t visited_size, int32_t n_sms, kvm_cu_dev_attend_plan *plan);

/* dev_attend's device-mirror fields (tail rows, keys rotated on the fly):
 * the shared rules (core/backend/attend_dev.h) on the three buffers' sizes. */
kvmem_status kvm_cu_check_dev_attend_mirror(const struct kvm_dev_attend_args *a, size_t k_tail_size,
                                            size_t v_tail_size, size_t rope_cs_size);

/* supports_op: the buffer-level forms only (the host-side ones are the CPU
 * backend's); shapes beyond the kernels' limits are refused by the entries
 * (KVMEM_ERR_UNSUPPORTED: the core then runs the op on the CPU). */
int kvm_cu_supports_op(kvmem_backend *be, kvm_op op, const void *args);

kvmem_status kvm_cu_check_dev_qmem(const struct kvm_dev_qmem_args *a, size_t mem_size, size_t k_size,
                                   size_t scores_size);

/* Host run of the RoPE pair rule (rules.h), compiled without FMA
 * contraction, for the bit-for-bit test. */
void kvm_cu_host_rope_pair(float x0, float x1, float c, float s, float af, float *y0, float *y1);
/* Host run of the mirror's angle addition (rules.h), likewise. */
void kvm_cu_host_rope_angle_add(float cb, float sb, float cp, float sp, float *c, float *s);

/* ---- caching device allocator ----
 * Freed blocks are kept by rounded size and handed out again, so the
 * steady state of a serving loop makes no cudaMalloc/cudaFree calls (both
 * synchronise the device). Raw memory comes from callbacks (cudaMalloc in
 * the plugin, malloc in tests). Thread-safe. */
typedef void *(*kvm_cu_raw_alloc_fn)(void *user, size_t size);
typedef void (*kvm_cu_raw_free_fn)(void *user, void *ptr);

typedef struct kvm_cu_allocator kvm_cu_allocator;

typedef struct kvm_cu_alloc_stats {
    size_t in_use;        /* rounded bytes handed out */
    size_t cached;        /* rounded bytes kept for reuse */
    size_t peak_in_use;
    uint64_t raw_allocs, raw_frees, reuses;
} kvm_cu_alloc_stats;

/* Size classes: multiples of 512 B up to 1 MiB, of 1 MiB above; 0 -> 512. */
size_t kvm_cu_round_size(size_t size);

/* max_cached: bytes the cache may keep (0 = none: every free is raw). */
kvm_cu_allocator *kvm_cu_allocator_create(kvm_cu_raw_alloc_fn raw_alloc, kvm_cu_raw_free_fn raw_free,
                                          void *user, size_t max_cached);
/* Frees the cache. Blocks still in use are the caller's (reported by stats). */
void kvm_cu_allocator_free(kvm_cu_allocator *a);
/* NULL when the raw allocator fails even after the cache was emptied.
 * *granted receives the rounded size (pass it back to kvm_cu_release). */
void *kvm_cu_alloc(kvm_cu_allocator *a, size_t size, size_t *granted);
void kvm_cu_release(kvm_cu_allocator *a, void *ptr, size_t granted);
/* Return every cached block to the raw allocator. */
void kvm_cu_allocator_trim(kvm_cu_allocator *a);
kvm_cu_alloc_stats kvm_cu_allocator_stats(kvm_cu_allocator *a);

/* ---- pinned staging ----
 * Host<->device transfers of pageable memory go through two pinned buffers
 * of `chunk` bytes: while chunk i is in flight on the copy stream, chunk i+1
 * is copied into the other buffer. */
typedef struct kvm_cu_chunk {
    size_t offset, size;
    int32_t slot; /* which pinned buffer (0 or 1) */
} kvm_cu_chunk;
size_t kvm_cu_staging_n_chunks(size_t bytes, size_t chunk);
kvm_cu_chunk kvm_cu_staging_chunk(size_t bytes, size_t chunk, size_t i);

#ifdef __cplusplus
}
#endif

#endif
