/* Checked size arithmetic and min/max, shared by the core (through
 * internal.h) and the backend plugins. Inline only: a plugin cannot link the
 * core's hidden symbols. */
#ifndef KVMEM_BACKEND_ARITH_H
#define KVMEM_BACKEND_ARITH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Overflow-checked size arithmetic: false on overflow. */
static inline bool kvm_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return false;
    *out = a * b;
    return true;
}
static inline bool kvm_add_size(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return false;
    *out = a + b;
    return true;
}

#define KVM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVM_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
