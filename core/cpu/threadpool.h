/* A small pthread worker pool for data-parallel loops. */
#ifndef KVMEM_CPU_THREADPOOL_H
#define KVMEM_CPU_THREADPOOL_H

#include <stddef.h>

typedef struct kvm_threadpool kvm_threadpool;

/* fn processes items [begin, end). */
typedef void (*kvm_task_fn)(void *arg, size_t begin, size_t end);

/* n_threads counts the caller: n_threads - 1 workers are started.
 * Returns NULL on allocation or thread-creation failure. */
kvm_threadpool *kvm_threadpool_create(int n_threads);
void kvm_threadpool_free(kvm_threadpool *tp);
int kvm_threadpool_size(const kvm_threadpool *tp);

/* Run fn over [0, n) in chunks of `grain` items on the workers and the
 * calling thread; returns when all are done. Safe to call from several
 * threads at once: a call that finds the pool busy runs inline, serially,
 * rather than waiting. tp may be NULL (runs inline). */
void kvm_parallel_for(kvm_threadpool *tp, size_t n, size_t grain, kvm_task_fn fn, void *arg);

#endif
