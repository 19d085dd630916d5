/* The CPU backend: buffers are host memory, and its table's entries are
 * the CPU ops the core runs (ops_*.c), on buffers the core allocated or on
 * views of memory it already holds. */
#include "cpu_backend.h"
#include "../internal.h"
#include "kernels.h"
#include "scratch.h"
#include "attend_plan.h"

#include <stdlib.h>
#include <string.h>

/* The backend's own state: the context's worker pool (not owned) and the
 * cache of per-call work memory. */
typedef struct cpu_impl {
    kvm_threadpool *tp;
    kvm_scratch *scratch;
} cpu_impl;

static void cpu_free(kvmem_backend *be) {
    if (!be) return;
    cpu_impl *c = be->impl;
    if (c) kvm_scratch_free(c->scratch);
    kvm_free(c);
    kvm_free(be);
}

kvm_threadpool *kvm_cpu_backend_tp(const kvmem_backend *be) {
    return be && be->impl ? ((const cpu_impl *)be->impl)->tp : NULL;
}

kvm_scratch *kvm_cpu_backend_scratch(const kvmem_backend *be) {
    return be && be->impl ? ((const cpu_impl *)be->impl)->scratch : NULL;
}

static kvmem_status cpu_buffer_alloc(kvmem_backend *be, size_t size, kvmem_buffer **out) {
    (void)be;
    kvmem_buffer *b = kvm_malloc(sizeof *b);
    void *d = kvm_aligned_alloc(size);
    if (!b || !d) {
        kvm_free(b);
        kvm_aligned_free(d);
        return kvm_fail(KVMEM_ERR_NOMEM, "cpu backend: out of memory for a %zu-byte buffer", size);
    }
    b->size = size;
    b->data = d;
    *out = b;
    return KVMEM_OK;
}

static void cpu_buffer_free(kvmem_backend *be, kvmem_buffer *b) {
    (void)be;
    if (!b) return;
    kvm_aligned_free(b->data);
    kvm_free(b);
}

static int in_range(const kvmem_buffer *b, size_t off, size_t n) {
    return b && off <= b->size && n <= b->size - off;
}

static kvmem_status cpu_upload(kvmem_backend *be, kvmem_buffer *dst, size_t off, const void *src,
                               size_t n) {
    (void)be;
    if (!in_range(dst, off, n))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "upload of %zu bytes at %zu outside the buffer", n, off);
    if (n) memcpy(dst->data + off, src, n);
    return KVMEM_OK;
}

static kvmem_status cpu_download(kvmem_backend *be, const kvmem_buffer *src, size_t off, void *dst,
                                 size_t n) {
    (void)be;
    if (!in_range(src, off, n))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "download of %zu bytes at %zu outside the buffer", n, off);
    if (n) memcpy(dst, src->data + off, n);
    return KVMEM_OK;
}

static void *cpu_host_ptr(kvmem_backend *be, kvmem_buffer *b) {
    (void)be;
    return b ? b->data : NULL;
}

/* cpu_backend.h: bytes [off, off + n) of a CPU buffer, NULL outside or unaligned. */
void *kvm_cpu_buf_at(const kvmem_buffer *b, size_t off, size_t n) {
    return in_range(b, off, n) && off % 4 == 0 ? b->data + off : NULL;
}

/* Every form of every op (the host-side ones are the CPU backend's). */
static int cpu_supports(kvmem_backend *be, kvm_op op, const void *args) {
    (void)be, (void)op, (void)args;
    return 1;
}

static void *cpu_proc(kvmem_backend *be, const char *name) {
    (void)be;
    (void)name;
    return NULL;
}

static const kvmem_backend_iface cpu_iface = {
    .name = "cpu",
    .free = cpu_free,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .buffer_upload = cpu_upload,
    .buffer_download = cpu_download,
    .buffer_host_ptr = cpu_host_ptr,
    /* -- retrieval -- */
    .dev_score = kvm_cpu_dev_score,
    .dev_score_reduce = kvm_cpu_dev_score_reduce,
    .dev_topk = kvm_cpu_dev_topk,
    .dev_gather_rope = kvm_cpu_dev_gather_rope,

    /* -- eviction -- */
    .dev_qmem_score = kvm_cpu_dev_qmem_score,

    /* -- attention -- */
    .dev_attend = kvm_attend_dev_cpu,

    .supports_op = cpu_supports,
    .get_proc_address = cpu_proc,
};

kvmem_status kvm_cpu_backend_create(kvmem_context *ctx, kvm_threadpool *tp, kvmem_backend **out) {
    kvmem_backend *be = kvm_calloc(1, sizeof *be);
    cpu_impl *c = kvm_calloc(1, sizeof *c);
    kvm_scratch *sc = kvm_scratch_create();
    if (!be || !c || !sc) {
        kvm_free(be);
        kvm_free(c);
        kvm_scratch_free(sc);
        return KVMEM_ERR_NOMEM;
    }
    c->tp = tp;
    c->scratch = sc;
    be->impl = c;
    be->iface = &cpu_iface;
    be->ctx = ctx;
    *out = be;
    return KVMEM_OK;
}
