/* The context object (internal layout). */
#ifndef KVMEM_CONTEXT_H
#define KVMEM_CONTEXT_H

#include "../../internal.h"
#include "../backend.h"
#include "../../cpu/threadpool.h"

#include <stdatomic.h>

struct kvmem_context {
    char backend_name[16];
    int n_threads;
    kvm_threadpool *tp;
    kvmem_backend *cpu;     /* always present: host work and the reference */
    kvmem_backend *backend; /* the chosen one (== cpu for "cpu") */
    /* bytes the core moved through buffer_upload / buffer_download of this
     * context's backends (kvmem_context_transfer_stats); atomic: agents of
     * one context run on many threads */
    _Atomic uint64_t h2d_bytes, d2h_bytes;
    kvm_errslot err; /* kvmem_context_last_error: calls on the context (kvmem_attend, kvmem_qmem_score) */
};

/* Every buffer_upload / buffer_download the core issues goes through these,
 * so the context's transfer counters see every byte (successful copies only). */
static inline kvmem_status kvm_be_upload(kvmem_backend *be, kvmem_buffer *dst, size_t offset, const void *src,
                                         size_t size) {
    kvmem_status st = be->iface->buffer_upload(be, dst, offset, src, size);
    if (st == KVMEM_OK && be->ctx) atomic_fetch_add_explicit(&be->ctx->h2d_bytes, size, memory_order_relaxed);
    return st;
}
static inline kvmem_status kvm_be_download(kvmem_backend *be, const kvmem_buffer *src, size_t offset, void *dst,
                                           size_t size) {
    kvmem_status st = be->iface->buffer_download(be, src, offset, dst, size);
    if (st == KVMEM_OK && be->ctx) atomic_fetch_add_explicit(&be->ctx->d2h_bytes, size, memory_order_relaxed);
    return st;
}

/* The work-memory cache of the context's CPU backend (cpu/scratch.h), or
 * NULL (ctx NULL). */
struct kvm_scratch *kvm_ctx_scratch(const kvmem_context *ctx);

#endif
