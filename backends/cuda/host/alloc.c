/* The caching device allocator's bookkeeping (plain C, raw memory through
 * callbacks). A flat list of cached blocks is enough: a serving loop holds
 * tens of distinct sizes, not thousands. */
#include "cuda_host.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct cached_block {
    void *ptr;
    size_t size;
} cached_block;

struct kvm_cu_allocator {
    pthread_mutex_t mu;
    kvm_cu_raw_alloc_fn raw_alloc;
    kvm_cu_raw_free_fn raw_free;
    void *user;
    size_t max_cached;
    cached_block *blocks;
    size_t n_blocks, cap_blocks;
    kvm_cu_alloc_stats st;
};

size_t kvm_cu_round_size(size_t size) {
    const size_t small = 512, big = (size_t)1 << 20;
    if (size == 0) return small;
    size_t m = size <= big ? small : big;
    if (size > SIZE_MAX - (m - 1)) return 0;
    return (size + m - 1) / m * m;
}

kvm_cu_allocator *kvm_cu_allocator_create(kvm_cu_raw_alloc_fn raw_alloc, kvm_cu_raw_free_fn raw_free,
                                          void *user, size_t max_cached) {
    if (!raw_alloc || !raw_free) return NULL;
    kvm_cu_allocator *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    pthread_mutex_init(&a->mu, NULL);
    a->raw_alloc = raw_alloc;
    a->raw_free = raw_free;
    a->user = user;
    a->max_cached = max_cached;
    return a;
}

static void trim_locked(kvm_cu_allocator *a) {
    for (size_t i = 0; i < a->n_blocks; i++) {
        a->raw_free(a->user, a->blocks[i].ptr);
        a->st.raw_frees++;
    }
    a->n_blocks = 0;
    a->st.cached = 0;
}

void kvm_cu_allocator_trim(kvm_cu_allocator *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    trim_locked(a);
    pthread_mutex_unlock(&a->mu);
}

void kvm_cu_allocator_free(kvm_cu_allocator *a) {
    if (!a) return;
    kvm_cu_allocator_trim(a);
    free(a->blocks);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

void *kvm_cu_alloc(kvm_cu_allocator *a, size_t size, size_t *granted) {
    size_t want = kvm_cu_round_size(size);
    if (!a || want == 0) return NULL;
    pthread_mutex_lock(&a->mu);
    /* best fit among cached blocks no more than twice the request, so a
     * small request never pins a huge block */
    size_t best = a->n_blocks;
    for (size_t i = 0; i < a->n_blocks; i++) {
        size_t s = a->blocks[i].size;
        if (s >= want && s / 2 <= want && (best == a->n_blocks || s < a->blocks[best].size)) best = i;
    }
    void *p = NULL;
    size_t got = want;
    if (best < a->n_blocks) {
        p = a->blocks[best].ptr;
        got = a->blocks[best].size;
        a->blocks[best] = a->blocks[--a->n_blocks];
        a->st.cached -= got;
        a->st.reuses++;
    } else {
        p = a->raw_alloc(a->user, want);
        if (!p && a->n_blocks) { /* out of device memory: give the cache back, retry once */
            trim_locked(a);
            p = a->raw_alloc(a->user, want);
        }
        if (p) a->st.raw_allocs++;
    }
    if (p) {
        a->st.in_use += got;
        if (a->st.in_use > a->st.peak_in_use) a->st.peak_in_use = a->st.in_use;
        if (granted) *granted = got;
    }
    pthread_mutex_unlock(&a->mu);
    return p;
}

void kvm_cu_release(kvm_cu_allocator *a, void *ptr, size_t granted) {
    if (!a || !ptr) return;
    pthread_mutex_lock(&a->mu);
    a->st.in_use -= granted <= a->st.in_use ? granted : a->st.in_use;
    int keep = a->st.cached + granted <= a->max_cached;
    if (keep && a->n_blocks == a->cap_blocks) {
        size_t cap = a->cap_blocks ? 2 * a->cap_blocks : 16;
        cached_block *nb = realloc(a->blocks, cap * sizeof *nb);
        if (nb) {
            a->blocks = nb;
            a->cap_blocks = cap;
        } else {
            keep = 0;
        }
    }
    if (keep) {
        a->blocks[a->n_blocks].ptr = ptr;
        a->blocks[a->n_blocks].size = granted;
        a->n_blocks++;
        a->st.cached += granted;
    } else {
        a->raw_free(a->user, ptr);
        a->st.raw_frees++;
    }
    pthread_mutex_unlock(&a->mu);
}

kvm_cu_alloc_stats kvm_cu_allocator_stats(kvm_cu_allocator *a) {
    kvm_cu_alloc_stats s = {0, 0, 0, 0, 0, 0};
    if (!a) return s;
    pthread_mutex_lock(&a->mu);
    s = a->st;
    pthread_mutex_unlock(&a->mu);
    return s;
}
