/* Internal helpers shared by every part of the core: error reporting,
 * checked arithmetic, aligned allocation. Never part of the public ABI. */
#ifndef KVMEM_INTERNAL_H
#define KVMEM_INTERNAL_H

#include "kvmem.h"
#include "alloc.h"
#include "params.h"
#include "backend/arith.h" /* checked size arithmetic, KVM_MIN, KVM_MAX */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#  define KVMEM_PRINTF(f, a) __attribute__((format(printf, f, a)))
#  define KVMEM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#  define KVMEM_PRINTF(f, a)
#  define KVMEM_UNLIKELY(x) (x)
#endif

/* Record a failure for kvmem_last_error() and return `status`, so call sites
 * read `return kvm_fail(KVMEM_ERR_INVALID_ARG, "block size %d: ...", bs);`. */
kvmem_status kvm_fail(kvmem_status status, const char *fmt, ...) KVMEM_PRINTF(2, 3);
/* Forget the last message (successful calls do not need to; kept for tests). */
void kvm_clear_error(void);

/* Log through the user's callback, if any. */
void kvm_log(kvmem_log_level level, const char *fmt, ...) KVMEM_PRINTF(2, 3);

/* The capacity (in elements of elem_size bytes) to grow an array of `cap`
 * elements to so it holds `need`: doubling from cap (or `first` when empty),
 * at most `max` elements and never more bytes than size_t counts. False
 * when need itself is beyond that (the caller reports out of memory).
 * Every growable array goes through this: a doubling loop that wraps to 0
 * would spin forever. */
static inline bool kvm_grow_cap(size_t cap, size_t need, size_t first, size_t max, size_t elem_size, size_t *out) {
    if (elem_size && max > SIZE_MAX / elem_size) max = SIZE_MAX / elem_size;
    if (need > max) return false;
    size_t nc = cap ? cap : first;
    if (nc > max) nc = max;
    while (nc < need) nc = nc > max / 2 ? need : nc * 2;
    *out = nc;
    return true;
}

/* Element size of a tensor dtype (F32/F16/BF16), 0 otherwise. */
size_t kvm_dtype_size(kvmem_dtype dt);
static inline bool kvm_is_tensor_dtype(kvmem_dtype dt) {
    return dt == KVMEM_F32 || dt == KVMEM_F16 || dt == KVMEM_BF16;
}

#endif
