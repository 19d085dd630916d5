/* Device tensors (kvmem.h, "Device tensors"): a kvmem_tensor whose dtype
 * carries KVMEM_DTYPE_DEVICE names memory of the context's device through a
 * kvmem_device_memory. The calls that take them resolve each such tensor
 * once, at entry, into a kvm_devt: the caller's memory wrapped as a buffer
 * of the context's backend (used in place by the device paths that can),
 * and a host view of the same shape whose memory is a host copy of the
 * tensor's span, filled (kvm_devt_read) or written back (kvm_devt_write)
 * only where a path needs host memory. Every copy goes through the
 * context's counted transfers. */
#ifndef KVMEM_BACKEND_DEVTENSOR_H
#define KVMEM_BACKEND_DEVTENSOR_H

#include "context.h"

/* Whether t (may be NULL) names device memory. */
static inline int kvm_devt_is_device(const kvmem_tensor *t) {
    return t && ((unsigned)t->dtype & KVMEM_DTYPE_DEVICE) != 0;
}

typedef struct kvm_devt {
    const kvmem_tensor *user; /* the caller's tensor (NULL: none) */
    kvmem_tensor host;        /* user's shape and strides, plain dtype, data = the host copy */
    int device;               /* user names device memory (else host is *user) */
    kvmem_backend *be;        /* the context's backend that owns it */
    kvmem_buffer *buf;        /* the caller's memory, wrapped */
    size_t off;               /* bytes from the buffer's start to element 0 */
    size_t span;              /* bytes from element 0 to one past the last element */
    int dense;                /* the span holds no byte outside the tensor */
    int filled;               /* host holds the device's bytes */
    int in_place;             /* a device path wrote the output straight into buf */
} kvm_devt;

/* Resolve t for the call fn on ctx ("K" names it in messages): a host
 * tensor (or NULL) passes as it is; a device tensor must name memory of
 * ctx's backend (refused otherwise, KVMEM_ERR_UNSUPPORTED naming which),
 * its descriptor and extent are checked, its memory wrapped and a host
 * copy allocated (not filled). On failure nothing is held. */
kvmem_status kvm_devt_open(kvmem_context *ctx, const kvmem_tensor *t, const char *fn, const char *what, kvm_devt *out);

/* The view the call's host code takes: d->host for a device tensor, the
 * caller's otherwise (NULL for none). */
static inline const kvmem_tensor *kvm_devt_view(const kvm_devt *d) { return d->device ? &d->host : d->user; }

/* Fill the host copy from the device (one counted download of the span);
 * a no-op for host tensors and copies already filled. */
kvmem_status kvm_devt_read(kvm_devt *d, const char *fn);

/* Write an output's host copy back (one counted upload of the span; where
 * the span has bytes between the elements, a counted download first, so
 * those stay the caller's); a no-op for host tensors. */
kvmem_status kvm_devt_write(kvm_devt *d, const char *fn);

/* Release what open took (the wrapper, never the caller's memory). */
void kvm_devt_close(kvm_devt *d);

/* d's elements as a dense [rows][row_elems] array of dtype dt starting at
 * element 0 with the outer dimension's stride (in elements) *outer_stride:
 * whether a kernel may read or write it in place. Checks that the last
 * ndim - 1 dimensions are dense and the byte offset is a multiple of 4. */
int kvm_devt_rows_dense(const kvm_devt *d, kvmem_dtype dt, int64_t *outer_stride);

/* Close a set of them. */
static inline void kvm_devt_close_all(kvm_devt *d, int n) {
    for (int i = 0; i < n; i++) kvm_devt_close(&d[i]);
}

#endif
