/* Copy-in of the public parameter structs (DESIGN.md, "ABI rules"; kvmem.h,
 * "ABI and versioning"). Every *_params struct starts with size_t
 * struct_size, which its *_default_params() sets to the sizeof the caller
 * was compiled with. Fields are only ever appended, so a caller's struct is
 * a prefix of this library's (an older binary) or this library's layout
 * plus a tail (a newer binary). Every function that takes params copies
 * them in through kvm_params_in, once, at entry, and reads only the copy. */
#ifndef KVMEM_PARAMS_H
#define KVMEM_PARAMS_H

#include "kvmem.h"

#include <stddef.h>

/* The largest struct_size taken for a layout rather than for garbage. It
 * bounds the bytes read from a newer binary's struct (its tail is scanned
 * for nonzero bytes); no params struct comes near it. */
#define KVM_PARAMS_MAX_SIZE 4096

/* dst: this library's struct (dst_size bytes), already holding the
 * defaults. src: the caller's struct, or NULL (then dst stays the
 * defaults). On success dst holds the caller's fields over the defaults
 * and dst's struct_size is dst_size:
 *  - struct_size <= dst_size (an older binary, or this one): its first
 *    struct_size bytes are copied, the fields it does not have keep their
 *    defaults; nothing past struct_size is read.
 *  - struct_size > dst_size (a newer binary): accepted only if every byte
 *    past dst_size is zero, i.e. it sets no field this library lacks
 *    (zstd's rule); otherwise KVMEM_ERR_UNSUPPORTED naming the byte.
 *  - 0, less than sizeof(size_t), not a multiple of its alignment, or more
 *    than KVM_PARAMS_MAX_SIZE: KVMEM_ERR_INVALID_ARG (not initialised with
 *    the *_default_params() function, or garbage).
 * type ("kvmem_attend_params") and fn (the public function) name the
 * failure in its message. dst is unchanged on failure. */
kvmem_status kvm_params_in(void *dst, size_t dst_size, const void *src, const char *type, const char *fn);

/* kvm_params_in for a `type` struct: dst a type *, src a const type *
 * (the conditionals make the compiler check both). */
#define KVM_PARAMS_IN(type, dst, src, fn) \
    kvm_params_in(1 ? (dst) : (type *)0, sizeof(type), 1 ? (src) : (const type *)0, #type, (fn))

/* The body of kvmem_X_params_init: write the first struct_size bytes of
 * *params (the caller's sizeof) from `defaults` (this library's struct of
 * dst_size bytes), zeros past dst_size, struct_size into its field. Sizes
 * are checked as for kvm_params_in; params NULL is refused. Nothing is
 * written on failure. */
kvmem_status kvm_params_init(void *params, size_t struct_size, const void *defaults, size_t dst_size,
                             const char *type, const char *fn);

#define KVM_PARAMS_INIT(type, params, struct_size, defaults, fn) \
    kvm_params_init(1 ? (params) : (type *)0, (struct_size), 1 ? (defaults) : (const type *)0, sizeof(type), #type, (fn))

/* A `reserved` field of a params struct must be 0: a later version may give
 * it a meaning, and a library that predates it must refuse a caller that
 * sets it rather than ignore it (the rule for bytes past struct_size). */
kvmem_status kvm_params_reserved(int32_t value, const char *type, const char *fn);

#endif
