// The CUDA backend's state, shared by its translation units (C++, inside the
// plugin only: templates and CUDA types never cross the backend table).
#pragma once
#include <pthread.h>

#include <cuda_runtime.h>

extern "C" {
#include "backend.h"
#include "host/cuda_host.h"
#include "kvmem_cuda.h"
}

struct kvmem_buffer {
    void *dev;
    size_t size;    // bytes the caller asked for (ranges are checked against it)
    size_t granted; // bytes of the allocator's block
    int borrowed;   // a caller's device memory (a device tensor): never released to the allocator
};

struct kvm_cu_backend {
    int device;
    cudaDeviceProp props;
    char detail[192]; /* the device, for kvmem backends and messages: "NAME (sm_XY, N SMs, G GiB)" */
    /* One caller at a time: the staging buffers, the scratch workspace and
     * the allocator are shared by every call on this backend, which threads
     * may make at once (kvmem.h: a context may be used from several threads). */
    pthread_mutex_t lock;
    cudaStream_t stream;      // every kernel
    cudaStream_t copy_stream; // host<->device transfers, overlapping kernels
    cudaEvent_t copy_done, compute_done, free_done, slot_ev[2];
    void *pinned[2];
    size_t pinned_size;
    kvm_cu_allocator *alloc;
    void *scratch; // op workspace, grown on demand
    size_t scratch_granted;
};

static inline kvm_cu_backend *cu_impl(kvmem_backend *be) { return static_cast<kvm_cu_backend *>(be->impl); }

// A CUDA error as a kvmem status with the runtime's message.
static inline kvmem_status cu_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return KVMEM_OK;
    return kvm_cu_fail(KVMEM_ERR_BACKEND, "cuda backend: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

// Device address of [ref.off, ref.off + bytes) of a buffer, or NULL with the
// failure recorded in *st.
static inline void *cu_ref(const kvmem_cuda_ref &r, size_t bytes, const char *what, kvmem_status *st) {
    if (*st != KVMEM_OK) return nullptr;
    if (!r.buf) {
        *st = kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "cuda backend: %s: buffer is NULL", what);
        return nullptr;
    }
    if (!kvm_cu_in_range(r.buf->size, r.off, bytes)) {
        *st = kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "cuda backend: %s: %zu bytes at offset %zu outside its buffer of %zu",
                          what, bytes, r.off, r.buf->size);
        return nullptr;
    }
    return static_cast<unsigned char *>(r.buf->dev) + r.off;
}

// Workspace of at least `bytes` on the backend's stream (kept between ops).
void *cu_scratch(kvm_cu_backend *b, size_t bytes, kvmem_status *st);

// The ops reached through get_proc_address (ops_*.cu).
extern "C" {
kvmem_status kvm_cu_op_score_blocks(kvmem_backend *be, const kvmem_cuda_blocks_args *a);
kvmem_status kvm_cu_op_aabb_score(kvmem_backend *be, const kvmem_cuda_score_args *a);
kvmem_status kvm_cu_op_topk(kvmem_backend *be, const kvmem_cuda_topk_args *a);
kvmem_status kvm_cu_op_gather_rope(kvmem_backend *be, const kvmem_cuda_gather_args *a);
kvmem_status kvm_cu_op_qmem_score(kvmem_backend *be, const kvmem_cuda_qmem_args *a);
}

// The table entries of core/backend/backend.h (dev_retrieval.cu,
// dev_attend.cu). They record failures with kvm_cu_fail; plugin.cu's
// wrappers hand the message to the core (be->fail).
kvmem_status kvm_cu_dev_score(kvmem_backend *be, const kvm_dev_score_args *a);
kvmem_status kvm_cu_dev_score_reduce(kvmem_backend *be, const kvm_dev_score_reduce_args *a);
kvmem_status kvm_cu_dev_topk(kvmem_backend *be, const kvm_dev_topk_args *a);
kvmem_status kvm_cu_dev_gather_rope(kvmem_backend *be, const kvm_dev_gather_args *a);
kvmem_status kvm_cu_dev_attend(kvmem_backend *be, const kvm_dev_attend_args *a);
kvmem_status kvm_cu_dev_qmem_score(kvmem_backend *be, const kvm_dev_qmem_args *a);

// Size of a buffer, 0 for NULL (the checks then refuse the range).
static inline size_t cu_size(const kvmem_buffer *b) { return b ? b->size : 0; }
// Device address of a validated (buffer, offset).
template <typename T> static inline T *cu_at(const kvmem_buffer *b, size_t off) {
    return b ? reinterpret_cast<T *>(static_cast<unsigned char *>(b->dev) + off) : nullptr;
}
