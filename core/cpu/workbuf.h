/* Work memory owned by one object between calls (a kvmem_retrieval keeps
 * four), so a call in steady state allocates nothing, and the carving of one
 * such block into aligned regions. The context-wide cache of work memory is
 * scratch.h; a workbuf belongs to its owner and needs no lock. */
#ifndef KVMEM_CPU_WORKBUF_H
#define KVMEM_CPU_WORKBUF_H

#include <stddef.h>

typedef struct kvm_workbuf {
    void *p;
    size_t cap;
} kvm_workbuf;

/* At least n bytes, 64-byte aligned; the contents are not kept. NULL when
 * out of memory (the old buffer stays). */
void *kvm_workbuf_get(kvm_workbuf *b, size_t n);
void kvm_workbuf_release(kvm_workbuf *b);

/* Carving one block into 64-byte aligned regions: a first pass with base
 * NULL sums the sizes (off), a second with the block as base hands out the
 * same regions. overflow is set when a size does not fit size_t. */
typedef struct kvm_carve {
    unsigned char *base;
    size_t off;
    int overflow;
} kvm_carve;

/* n elements of size bytes (n = 0 takes one); NULL in the sizing pass. */
void *kvm_carve_take(kvm_carve *c, size_t n, size_t size);

#endif
