#include "workbuf.h"
#include "../alloc.h"
#include "../internal.h"

#include <stdint.h>

void *kvm_workbuf_get(kvm_workbuf *b, size_t n) {
    if (n <= b->cap && b->p) return b->p;
    size_t want = (n + ((size_t)64 << 10) - 1) & ~(((size_t)64 << 10) - 1); /* whole 64 KiB: fewer regrowths */
    if (want < n) return NULL;
    void *p = kvm_aligned_alloc(want);
    if (!p) return NULL;
    kvm_aligned_free(b->p);
    b->p = p;
    b->cap = want;
    return p;
}

void kvm_workbuf_release(kvm_workbuf *b) {
    kvm_aligned_free(b->p);
    b->p = NULL;
    b->cap = 0;
}

void *kvm_carve_take(kvm_carve *c, size_t n, size_t size) {
    size_t bytes;
    if (!kvm_mul_size(n ? n : 1, size, &bytes) || bytes > SIZE_MAX - c->off - 64) {
        c->overflow = 1;
        return NULL;
    }
    void *p = c->base ? c->base + c->off : NULL;
    c->off += (bytes + 63) & ~(size_t)63;
    return p;
}
