/* Internal helpers shared by every part of the core: error reporting,
 * checked arithmetic, aligned allocation. Never part of the public ABI. */
#ifndef KVMEM_INTERNAL_H
#define KVMEM_INTERNAL_H

#include "kvmem.h"
#include "alloc.h"
#include "params.h"
#include "backend/arith.h" /* checked size arithmetic, KVM_MIN, KVM_MAX */

#include <stdatomic.h>
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

/* The last failure on an object (kvmem_agent_last_error, kvmem_pool_last_error,
 * kvmem_context_last_error): while a call runs on an object, kvm_fail copies
 * its message into the object's slot as well as the thread's, so a caller
 * whose call ran on a worker thread (a binding's async form) reads it from
 * the object. A slot is zeroed memory or kvm_errslot_init'ed. */
typedef struct kvm_errslot {
    atomic_int lock; /* writers and readers may be on different threads */
    char msg[512];
} kvm_errslot;
void kvm_errslot_init(kvm_errslot *s);
/* From here until kvm_err_end(the value returned), the calling thread's
 * failures also go to s, unless a slot is taken on this thread already (a
 * call on an agent inside a call on a context: the outer object keeps it). */
int kvm_err_begin(kvm_errslot *s);
void kvm_err_end(int token);
/* s's message into buf (NUL-terminated, cut to size - 1 bytes; buf may be
 * NULL when size is 0); returns its full length. s NULL: "" and 0. */
size_t kvm_errslot_copy(kvm_errslot *s, char *buf, size_t size);

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
