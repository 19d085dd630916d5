/* The CPU backend's cache of work memory (scratch.h). A handful of slots,
 * best fit; a block too large to keep (KVM_SCRATCH_KEEP_MAX) or one that
 * finds every slot in use is allocated for the call and freed when given
 * back. */
#include "scratch.h"
#include "../alloc.h"

#include <pthread.h>
#include <string.h>

#define KVM_SCRATCH_SLOTS 8
#define KVM_SCRATCH_KEEP_MAX ((size_t)256 << 20) /* larger blocks are not kept between calls */

typedef struct slot {
    void *p;
    size_t size;
    int busy;
} slot;

struct kvm_scratch {
    pthread_mutex_t mu;
    slot s[KVM_SCRATCH_SLOTS];
};

kvm_scratch *kvm_scratch_create(void) {
    kvm_scratch *s = kvm_calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

void kvm_scratch_free(kvm_scratch *s) {
    if (!s) return;
    for (int i = 0; i < KVM_SCRATCH_SLOTS; i++) kvm_aligned_free(s->s[i].p);
    pthread_mutex_destroy(&s->mu);
    kvm_free(s);
}

void *kvm_scratch_take(kvm_scratch *s, size_t bytes) {
    if (bytes == 0) bytes = 1;
    if (!s || bytes > KVM_SCRATCH_KEEP_MAX) return kvm_aligned_alloc(bytes);
    pthread_mutex_lock(&s->mu);
    int best = -1, spare = -1;
    for (int i = 0; i < KVM_SCRATCH_SLOTS; i++) {
        const slot *x = &s->s[i];
        if (x->busy) continue;
        if (x->p && x->size >= bytes && (best < 0 || x->size < s->s[best].size)) best = i;
        if (!x->p) { /* an empty slot first, else the smallest free one */
            if (spare < 0 || s->s[spare].p) spare = i;
        } else if (spare < 0 || (s->s[spare].p && x->size < s->s[spare].size)) {
            spare = i;
        }
    }
    if (best >= 0) {
        s->s[best].busy = 1;
        pthread_mutex_unlock(&s->mu);
        return s->s[best].p;
    }
    if (spare < 0) { /* every slot in use: a block for this call only */
        pthread_mutex_unlock(&s->mu);
        return kvm_aligned_alloc(bytes);
    }
    /* the smallest free slot (an empty one first) grows to this size; the
     * allocation runs outside the lock, the slot held meanwhile */
    slot *x = &s->s[spare];
    void *old = x->p;
    x->p = NULL;
    x->size = 0;
    x->busy = 1;
    pthread_mutex_unlock(&s->mu);
    kvm_aligned_free(old);
    void *p = kvm_aligned_alloc(bytes);
    pthread_mutex_lock(&s->mu);
    x->p = p;
    x->size = p ? bytes : 0;
    x->busy = p != NULL;
    pthread_mutex_unlock(&s->mu);
    return p;
}

void kvm_scratch_give(kvm_scratch *s, void *p) {
    if (!p) return;
    if (s) {
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < KVM_SCRATCH_SLOTS; i++)
            if (s->s[i].p == p) {
                s->s[i].busy = 0;
                pthread_mutex_unlock(&s->mu);
                return;
            }
        pthread_mutex_unlock(&s->mu);
    }
    kvm_aligned_free(p); /* not a cached block */
}
