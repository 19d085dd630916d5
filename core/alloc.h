/* The core's allocator: every allocation in core/ goes through these
 * wrappers (tests/checks/alloc_sites.sh keeps it so), so a test can fail the
 * Nth allocation, or every one from the Nth on, and count what is still live
 * (tests/oom). Interposing malloc instead would fight the sanitizers' own
 * allocators; this works the same in the plain, ASan and TSan builds.
 *
 * Cost when no test is running: one relaxed load of a flag and a branch
 * that is never taken. The site string (file:line) is only touched on the
 * test path. Nothing here is exported from libkvmem.so (hidden visibility). */
#ifndef KVMEM_ALLOC_H
#define KVMEM_ALLOC_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define KVM_STR2_(x) #x
#define KVM_STR_(x) KVM_STR2_(x)
/* The allocation site, "core/pool/agent.c:217" (the build maps the source
 * directory away, see core/CMakeLists.txt). The WebAssembly build, where
 * the allocation test never runs, keeps no site strings (bytes shipped to
 * browsers). */
#if defined(__EMSCRIPTEN__)
#  define KVM_SITE "?"
#else
#  define KVM_SITE __FILE__ ":" KVM_STR_(__LINE__)
#endif

#if defined(__GNUC__) || defined(__clang__)
#  define KVM_ALLOC_COLD __attribute__((noinline, cold))
#  define KVM_ALLOC_TESTING_() __builtin_expect(atomic_load_explicit(&kvm_alloc_testing, memory_order_relaxed), 0)
#else
#  define KVM_ALLOC_COLD
#  define KVM_ALLOC_TESTING_() atomic_load_explicit(&kvm_alloc_testing, memory_order_relaxed)
#endif

/* Nonzero once a test switched the counting allocator on. */
extern atomic_int kvm_alloc_testing;

void *kvm_malloc_test(size_t size, const char *site) KVM_ALLOC_COLD;
void *kvm_calloc_test(size_t n, size_t size, const char *site) KVM_ALLOC_COLD;
void *kvm_realloc_test(void *p, size_t size, const char *site) KVM_ALLOC_COLD;
void *kvm_aligned_test(size_t size, size_t align, const char *site) KVM_ALLOC_COLD;
void kvm_free_test(void *p) KVM_ALLOC_COLD;

static inline void *kvm_malloc_at(size_t size, const char *site) {
    if (KVM_ALLOC_TESTING_()) return kvm_malloc_test(size, site);
    return malloc(size);
}
static inline void *kvm_calloc_at(size_t n, size_t size, const char *site) {
    if (KVM_ALLOC_TESTING_()) return kvm_calloc_test(n, size, site);
    return calloc(n, size);
}
/* As realloc; size must be > 0. On failure p is untouched. */
static inline void *kvm_realloc_at(void *p, size_t size, const char *site) {
    if (KVM_ALLOC_TESTING_()) return kvm_realloc_test(p, size, site);
    return realloc(p, size);
}
static inline void kvm_free(void *p) {
    if (KVM_ALLOC_TESTING_()) {
        kvm_free_test(p);
        return;
    }
    free(p);
}
char *kvm_strdup_at(const char *s, const char *site);
char *kvm_strndup_at(const char *s, size_t n, const char *site);
/* 64-byte aligned (cache line, AVX-512 vector), size rounded up; freed with
 * kvm_aligned_free (== kvm_free). */
void *kvm_aligned_alloc_at(size_t size, const char *site);
/* For KV blocks: from 2 MiB up, 2 MiB aligned and advised onto
 * transparent huge pages (as numpy does for its large arrays), so one TLB
 * entry covers a whole block instead of 512 page walks; smaller sizes as
 * kvm_aligned_alloc. Freed with kvm_free. */
void *kvm_huge_alloc_at(size_t size, const char *site);

#define kvm_malloc(n) kvm_malloc_at((n), KVM_SITE)
#define kvm_calloc(n, s) kvm_calloc_at((n), (s), KVM_SITE)
#define kvm_realloc(p, n) kvm_realloc_at((p), (n), KVM_SITE)
#define kvm_strdup(s) kvm_strdup_at((s), KVM_SITE)
#define kvm_strndup(s, n) kvm_strndup_at((s), (n), KVM_SITE)
#define kvm_aligned_alloc(n) kvm_aligned_alloc_at((n), KVM_SITE)
#define kvm_huge_alloc(n) kvm_huge_alloc_at((n), KVM_SITE)
#define kvm_aligned_free(p) kvm_free(p)

/* ---- the test side (tests/oom; never called by the library itself) ----
 * Switch counting on before the first kvmem call of the process, so every
 * live block was counted when it was allocated. */
void kvm_alloc_test_begin(void);
/* Fail the n-th allocation from now (n >= 1), and with `from_on` every one
 * after it too; n = 0 disarms. Resets the call and failure counters. */
void kvm_alloc_fail_at(uint64_t n, int from_on);
uint64_t kvm_alloc_calls(void);  /* allocations attempted since kvm_alloc_fail_at */
uint64_t kvm_alloc_failed(void); /* of which were failed on purpose */
int64_t kvm_alloc_live(void);    /* blocks allocated and not yet freed */
/* The site of the last allocation failed on purpose, or NULL. */
const char *kvm_alloc_last_failed_site(void);
/* Distinct sites failed on purpose so far (up to cap of them into out);
 * returns how many there are. */
size_t kvm_alloc_failed_sites(const char **out, size_t cap);

#endif
