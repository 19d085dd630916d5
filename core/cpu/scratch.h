/* Work memory that outlives a call: the large per-call buffers of the CPU
 * ops (attention logits and tiles, the rule score's and SnapKV's logits)
 * are taken from a small per-backend cache and given back, so a steady
 * stream of calls on one context allocates nothing (no mmap, no page
 * faults, no zeroing by the kernel per call). Thread-safe: concurrent calls
 * get distinct blocks. Blocks are not cleared between uses. */
#ifndef KVMEM_CPU_SCRATCH_H
#define KVMEM_CPU_SCRATCH_H

#include <stddef.h>

typedef struct kvm_scratch kvm_scratch;

/* NULL when out of memory. */
kvm_scratch *kvm_scratch_create(void);
/* Frees every cached block; every taken block must have been given back. */
void kvm_scratch_free(kvm_scratch *s);

/* A 64-byte aligned block of at least `bytes` (> 0): a cached block that
 * fits, else a new one. NULL when out of memory. s may be NULL (a plain
 * allocation). */
void *kvm_scratch_take(kvm_scratch *s, size_t bytes);
/* Give back a block from kvm_scratch_take on the same s (NULL: no-op). */
void kvm_scratch_give(kvm_scratch *s, void *p);

#endif
