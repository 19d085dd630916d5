/* The CPU backend: the backend table (core/backend/backend.h) over host
 * memory, always built, whose entries are the CPU ops the core runs
 * (ops_*.c), and the ops the table's buffer-level forms do not cover
 * (attention's whole plan: attend_plan.h; SnapKV). */
#ifndef KVMEM_CPU_BACKEND_H
#define KVMEM_CPU_BACKEND_H

#include "../backend/backend.h"

#include "scratch.h"
#include "threadpool.h"

/* tp: the context's worker pool, used by the ops (not owned). */
kvmem_status kvm_cpu_backend_create(kvmem_context *ctx, kvm_threadpool *tp, kvmem_backend **out);
/* The worker pool (NULL: run inline) and the work-memory cache of a CPU backend. */
kvm_threadpool *kvm_cpu_backend_tp(const kvmem_backend *be);
kvm_scratch *kvm_cpu_backend_scratch(const kvmem_backend *be);
/* A CPU buffer is host memory. A view wraps memory the core already holds,
 * so the CPU backend's entries run on it in place: on the stack, never
 * given to buffer_free. */
struct kvmem_buffer {
    size_t size;
    unsigned char *data;
};
static inline kvmem_buffer *kvm_cpu_buffer_view(kvmem_buffer *b, const void *p, size_t size) {
    b->size = size;
    b->data = (unsigned char *)(uintptr_t)p;
    return b;
}

/* The byte size of a CPU buffer (the argument checks' kvm_dev_size_fn) and
 * the host address of byte off of it (checked by the caller's argument
 * checks first). */
static inline size_t kvm_cpu_buffer_size(const kvmem_buffer *b) { return b->size; }
static inline void *kvm_cpu_at(const kvmem_buffer *b, size_t off) { return b->data + off; }

/* The address of bytes [off, off + n) of a CPU buffer, NULL when outside
 * the buffer or off is not a multiple of 4. */
void *kvm_cpu_buf_at(const kvmem_buffer *b, size_t off, size_t n);

/* ---- the CPU ops: the table's entries (contracts in core/backend/backend.h,
 * argument checks in dev_args.h), and the pieces tests reach directly ---- */

kvmem_status kvm_cpu_dev_score(kvmem_backend *be, const kvm_dev_score_args *a);        /* ops_score.c */
kvmem_status kvm_cpu_dev_score_reduce(kvmem_backend *be, const kvm_dev_score_reduce_args *a);
kvmem_status kvm_cpu_dev_topk(kvmem_backend *be, const kvm_dev_topk_args *a);          /* ops_topk.c */
kvmem_status kvm_cpu_dev_gather_rope(kvmem_backend *be, const kvm_dev_gather_args *a); /* ops_gather.c */

kvmem_status kvm_cpu_dev_qmem_score(kvmem_backend *be, const kvm_dev_qmem_args *a); /* ops_qmem.c */

/* The rule score (kvmem_qmem_score; inputs validated by the caller): the
 * work of dev_qmem_score on the caller's K view. */
kvmem_status kvm_cpu_qmem_score(kvmem_backend *be, const kvmem_model_spec *spec, const float *memory,
                                const kvmem_tensor *k, float *scores);

/* SnapKV's scores (kvmem_snapkv_score; inputs validated by the caller). */
kvmem_status kvm_cpu_snapkv_score(kvmem_backend *be, const kvmem_model_spec *spec, const kvmem_tensor *q_obs,
                                  const kvmem_tensor *k, int32_t pool_kernel, float *scores); /* ops_snapkv.c */

/* Largest score buffer (bytes) for which few-row (decode) scoring runs
 * block-major (one pass over the boxes, normalisation fused per chunk of
 * blocks); larger problems go item-major. Tests lower it to reach both. */
extern size_t kvm_score_block_major_max_bytes;

/* Indices of the k largest of score[0..n) (NaN never selected), ties toward
 * the lower index, written to out_idx in descending score order; *n_out gets
 * min(k, number of non-NaN scores). dev_topk's heap. */
kvmem_status kvm_cpu_topk(kvmem_backend *be, const float *score, int32_t n, int32_t k, int32_t *out_idx,
                          int32_t *n_out);

#endif
