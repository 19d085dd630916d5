/* The CPU backend (core/cpu/cpu_backend.c): the reference implementation of
 * the backend table (core/backend/backend.h), always built. Core-only: its
 * buffers are host memory, which the CPU reference entries of the device
 * ops (score_dev.c, attend_dev.c, qmem_dev.c) read in place. */
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
/* The host address and byte size of a CPU buffer, and the address of bytes
 * [off, off + n), NULL when outside the buffer or off is not a multiple of 4. */
void *kvm_cpu_buffer_span(const kvmem_buffer *b, size_t *size);
void *kvm_cpu_buf_at(const kvmem_buffer *b, size_t off, size_t n);

#endif
