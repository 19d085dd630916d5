/* The counting, failing side of the core's allocator (core/alloc.h). Only
 * reached once a test called kvm_alloc_test_begin(). */
#if !defined(_DEFAULT_SOURCE)
#  define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#endif
#include "alloc.h"
#include "internal.h"

#include <pthread.h>
#include <string.h>
#if !defined(__EMSCRIPTEN__)
#  include <sys/mman.h>
#endif

atomic_int kvm_alloc_testing;

static atomic_uint_fast64_t g_calls, g_failed, g_fail_at;
static atomic_int g_from_on;
static atomic_int_fast64_t g_live;

#define KVM_MAX_SITES 1024
static pthread_mutex_t g_sites_mu = PTHREAD_MUTEX_INITIALIZER;
static const char *g_sites[KVM_MAX_SITES];
static size_t g_n_sites;
static _Atomic(const char *) g_last_site;

static void note_site(const char *site) {
    pthread_mutex_lock(&g_sites_mu);
    size_t i = 0;
    while (i < g_n_sites && strcmp(g_sites[i], site) != 0) i++;
    if (i == g_n_sites && g_n_sites < KVM_MAX_SITES) g_sites[g_n_sites++] = site;
    pthread_mutex_unlock(&g_sites_mu);
}

/* Count one allocation; 1 if it is to fail. */
static int must_fail(const char *site) {
    uint_fast64_t n = atomic_fetch_add(&g_calls, 1) + 1;
    uint_fast64_t at = atomic_load(&g_fail_at);
    if (at == 0 || n < at || (n > at && !atomic_load(&g_from_on))) return 0;
    atomic_fetch_add(&g_failed, 1);
    atomic_store(&g_last_site, site);
    note_site(site);
    return 1;
}

void *kvm_malloc_test(size_t size, const char *site) {
    if (must_fail(site)) return NULL;
    void *p = malloc(size);
    if (p) atomic_fetch_add(&g_live, 1);
    return p;
}

void *kvm_calloc_test(size_t n, size_t size, const char *site) {
    if (must_fail(site)) return NULL;
    void *p = calloc(n, size);
    if (p) atomic_fetch_add(&g_live, 1);
    return p;
}

void *kvm_realloc_test(void *old, size_t size, const char *site) {
    if (must_fail(site)) return NULL;
    void *p = realloc(old, size);
    if (p && !old) atomic_fetch_add(&g_live, 1);
    return p;
}

void *kvm_aligned_test(size_t size, size_t align, const char *site) {
    if (must_fail(site)) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, align, size) != 0) return NULL;
    atomic_fetch_add(&g_live, 1);
    return p;
}

void kvm_free_test(void *p) {
    if (!p) return;
    atomic_fetch_sub(&g_live, 1);
    free(p);
}

char *kvm_strdup_at(const char *s, const char *site) { return kvm_strndup_at(s, strlen(s), site); }

char *kvm_strndup_at(const char *s, size_t n, const char *site) {
    size_t len = strnlen(s, n);
    char *d = kvm_malloc_at(len + 1, site);
    if (!d) return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

void *kvm_aligned_alloc_at(size_t size, const char *site) {
    size_t rounded;
    if (!kvm_add_size(size ? size : 1, 63, &rounded)) return NULL;
    rounded &= ~(size_t)63;
    if (KVM_ALLOC_TESTING_()) return kvm_aligned_test(rounded, 64, site);
    return aligned_alloc(64, rounded);
}

void *kvm_huge_alloc_at(size_t size, const char *site) {
#if defined(MADV_HUGEPAGE) && !defined(__EMSCRIPTEN__)
    const size_t huge = (size_t)2 << 20;
    if (size < huge) return kvm_aligned_alloc_at(size, site);
    void *p = NULL;
    if (KVM_ALLOC_TESTING_()) p = kvm_aligned_test(size, huge, site);
    else if (posix_memalign(&p, huge, size) != 0) p = NULL;
    /* Advice only, on the whole 2 MiB pages the buffer covers (a partial
     * one would make the kernel back memory the buffer does not use):
     * where THP is off or no huge page is free, pages stay 4 KiB. */
    if (p) (void)madvise(p, size & ~(huge - 1), MADV_HUGEPAGE);
    return p;
#else /* no transparent huge pages (and in WebAssembly a 2 MiB alignment would only waste the heap) */
    return kvm_aligned_alloc_at(size, site);
#endif
}

void kvm_alloc_test_begin(void) { atomic_store(&kvm_alloc_testing, 1); }

void kvm_alloc_fail_at(uint64_t n, int from_on) {
    atomic_store(&g_fail_at, 0);
    atomic_store(&g_calls, 0);
    atomic_store(&g_failed, 0);
    atomic_store(&g_last_site, NULL);
    atomic_store(&g_from_on, from_on ? 1 : 0);
    atomic_store(&g_fail_at, n);
}

uint64_t kvm_alloc_calls(void) { return atomic_load(&g_calls); }
uint64_t kvm_alloc_failed(void) { return atomic_load(&g_failed); }
int64_t kvm_alloc_live(void) { return atomic_load(&g_live); }

const char *kvm_alloc_last_failed_site(void) { return atomic_load(&g_last_site); }

size_t kvm_alloc_failed_sites(const char **out, size_t cap) {
    pthread_mutex_lock(&g_sites_mu);
    size_t n = g_n_sites;
    for (size_t i = 0; i < n && i < cap; i++) out[i] = g_sites[i];
    pthread_mutex_unlock(&g_sites_mu);
    return n;
}
