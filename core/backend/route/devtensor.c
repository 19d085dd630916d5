/* Device tensors: the public descriptors and the resolution every call that
 * takes them goes through (devtensor.h). */
#include "devtensor.h"
#include "route.h"
#include "../../internal.h"
#include "../../params.h"

#include <string.h>

static const char *kind_name(kvmem_memory_kind k) {
    return k == KVMEM_MEMORY_CUDA ? "CUDA" : k == KVMEM_MEMORY_VULKAN ? "Vulkan" : "host";
}

/* The descriptor copied in (older and newer struct sizes: the params rule). */
static kvmem_status memory_in(const kvmem_device_memory *mem, kvmem_device_memory *out, const char *fn,
                              const char *what) {
    if (!mem) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s is a device tensor whose descriptor is NULL", fn, what);
    memset(out, 0, sizeof *out);
    kvmem_status st = KVM_PARAMS_IN(kvmem_device_memory, out, mem, fn);
    if (st != KVMEM_OK) return st;
    if (out->kind != KVMEM_MEMORY_CUDA && out->kind != KVMEM_MEMORY_VULKAN)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s: memory kind %d is not KVMEM_MEMORY_CUDA or KVMEM_MEMORY_VULKAN", fn,
                        what, (int)out->kind);
    if (out->handle == 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s: the %s handle is 0", fn, what, kind_name(out->kind));
    if (out->kind == KVMEM_MEMORY_VULKAN && (out->device != 0 || out->stream))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s: device and stream are for CUDA memory (0 and NULL for Vulkan)", fn,
                        what);
    if (out->device < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s: device %d is negative", fn, what, out->device);
    return KVMEM_OK;
}

/* Bytes from element 0 to one past the last element of a plain-dtype view
 * (0 for an empty one); 0 with *ok = 0 when that overflows. */
static size_t span_of(const kvmem_tensor *t, int *ok) {
    *ok = 1;
    uint64_t last = 0;
    for (int32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) return 0;
        uint64_t m;
        if (__builtin_mul_overflow((uint64_t)(t->shape[d] - 1), (uint64_t)t->strides[d], &m) ||
            __builtin_add_overflow(last, m, &last)) {
            *ok = 0;
            return 0;
        }
    }
    uint64_t bytes;
    const uint64_t es = kvm_dtype_size(t->dtype);
    if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, es, &bytes) || bytes > SIZE_MAX) {
        *ok = 0;
        return 0;
    }
    return (size_t)bytes;
}

/* The plain view of a device tensor and the span checks both the
 * constructor and the calls make. */
static kvmem_status check_view(const kvmem_tensor *t, const kvmem_device_memory *m, const char *fn, const char *what,
                               size_t *span) {
    const kvmem_dtype dt = (kvmem_dtype)((unsigned)t->dtype & ~(unsigned)KVMEM_DTYPE_DEVICE);
    if (!kvm_is_tensor_dtype(dt))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s: dtype %d is not f32, f16 or bf16", fn, what, (int)dt);
    if (t->ndim < 1 || t->ndim > KVMEM_MAX_DIMS)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s has %d dims, outside [1, %d]", fn, what, t->ndim, KVMEM_MAX_DIMS);
    for (int32_t d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0 || t->strides[d] < 0)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s: negative extent or stride in dim %d", fn, what, d);
    kvmem_tensor v = *t;
    v.dtype = dt;
    int ok;
    *span = span_of(&v, &ok);
    if (!ok || m->offset > m->size || *span > m->size - m->offset)
        return kvm_fail(KVMEM_ERR_INVALID_ARG,
                        "%s: %s reaches past its %s memory: %llu bytes from offset %llu of a %llu-byte allocation", fn,
                        what, kind_name(m->kind), ok ? (unsigned long long)*span : 0ull,
                        (unsigned long long)m->offset, (unsigned long long)m->size);
    return KVMEM_OK;
}

kvmem_status kvmem_tensor_init_device(kvmem_tensor *out, const kvmem_device_memory *mem, kvmem_dtype dtype,
                                      int32_t ndim, const int64_t *shape) {
    static const char *fn = "kvmem_tensor_init_device";
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: out is NULL", fn);
    kvmem_device_memory m;
    kvmem_status st = memory_in(mem, &m, fn, "mem");
    if (st != KVMEM_OK) return st;
    kvmem_tensor t;
    if ((st = kvmem_tensor_init(&t, (void *)(uintptr_t)mem, dtype, ndim, shape)) != KVMEM_OK) return st;
    t.dtype = (kvmem_dtype)((unsigned)dtype | KVMEM_DTYPE_DEVICE);
    size_t span;
    if ((st = check_view(&t, &m, fn, "the tensor", &span)) != KVMEM_OK) return st;
    *out = t;
    return KVMEM_OK;
}

/* The memory kind ctx's backend owns (HOST for the CPU). */
static kvmem_memory_kind ctx_kind(const kvmem_context *ctx) {
    const kvmem_backend *be = ctx->backend;
    if (!be || be == ctx->cpu) return KVMEM_MEMORY_HOST;
    if (strcmp(be->iface->name, "vulkan") == 0) return KVMEM_MEMORY_VULKAN;
    if (strcmp(be->iface->name, "cuda") == 0) return KVMEM_MEMORY_CUDA;
    return KVMEM_MEMORY_HOST;
}

static void *proc(kvmem_backend *be, const char *name) {
    return be->iface->get_proc_address ? be->iface->get_proc_address(be, name) : NULL;
}

kvmem_status kvm_devt_open(kvmem_context *ctx, const kvmem_tensor *t, const char *fn, const char *what, kvm_devt *out) {
    memset(out, 0, sizeof *out);
    out->user = t;
    if (!kvm_devt_is_device(t)) return KVMEM_OK;
    kvmem_device_memory m;
    kvmem_status st = memory_in((const kvmem_device_memory *)t->data, &m, fn, what);
    if (st != KVMEM_OK) return st;
    const kvmem_memory_kind have = ctx_kind(ctx);
    if (have != m.kind)
        return kvm_fail(KVMEM_ERR_UNSUPPORTED,
                        "%s: %s is in %s device memory but the context runs on %s: create the context with backend "
                        "\"%s\" for it, or pass host memory",
                        fn, what, kind_name(m.kind), ctx->backend_name, m.kind == KVMEM_MEMORY_CUDA ? "cuda" : "vulkan");
    size_t span;
    if ((st = check_view(t, &m, fn, what, &span)) != KVMEM_OK) return st;
    kvmem_backend *be = ctx->backend;
    kvm_buffer_wrap_fn wrap = NULL;
    void *p = proc(be, KVM_PROC_BUFFER_WRAP);
    memcpy(&wrap, &p, sizeof wrap); /* POSIX: function and data pointers have one size */
    if (!wrap)
        return kvm_fail(KVMEM_ERR_UNSUPPORTED, "%s: %s: backend %s cannot take device tensors (a plugin older than this library)",
                        fn, what, be->iface->name);
    if ((st = wrap(be, &m, &out->buf)) != KVMEM_OK) {
        out->buf = NULL;
        return kvm_route_failed(be, fn, st);
    }
    out->device = 1;
    out->be = be;
    out->off = (size_t)m.offset;
    out->span = span;
    out->host = *t;
    out->host.dtype = (kvmem_dtype)((unsigned)t->dtype & ~(unsigned)KVMEM_DTYPE_DEVICE);
    size_t n = 1;
    for (int32_t d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    out->dense = n * kvm_dtype_size(out->host.dtype) == span;
    out->host.data = kvm_aligned_alloc(span ? span : 4);
    if (!out->host.data) {
        kvm_devt_close(out);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for a host copy of %s (%zu bytes)", fn, what, span);
    }
    return KVMEM_OK;
}

kvmem_status kvm_devt_read(kvm_devt *d, const char *fn) {
    if (!d->device || d->filled) return KVMEM_OK;
    kvmem_status st = d->span ? kvm_be_download(d->be, d->buf, d->off, d->host.data, d->span) : KVMEM_OK;
    if (st != KVMEM_OK) return kvm_route_failed(d->be, fn, st);
    d->filled = 1;
    return KVMEM_OK;
}

/* Copy the elements of view t (strides in elements, element size es) from
 * src to dst, both laid out as t says; bytes between elements untouched. */
static void copy_elements(const kvmem_tensor *t, size_t es, const unsigned char *src, unsigned char *dst) {
    int64_t idx[KVMEM_MAX_DIMS] = {0};
    const int32_t last = t->ndim - 1;
    for (int32_t d = 0; d < t->ndim; d++)
        if (t->shape[d] == 0) return;
    for (;;) {
        int64_t off = 0;
        for (int32_t d = 0; d < last; d++) off += idx[d] * t->strides[d];
        if (t->strides[last] == 1) {
            memcpy(dst + (size_t)off * es, src + (size_t)off * es, (size_t)t->shape[last] * es);
        } else {
            for (int64_t i = 0; i < t->shape[last]; i++) {
                const size_t at = (size_t)(off + i * t->strides[last]) * es;
                memcpy(dst + at, src + at, es);
            }
        }
        int32_t d = last - 1;
        while (d >= 0 && ++idx[d] == t->shape[d]) idx[d--] = 0;
        if (d < 0) return;
    }
}

kvmem_status kvm_devt_write(kvm_devt *d, const char *fn) {
    if (!d->device || !d->span) return KVMEM_OK;
    const void *src = d->host.data;
    unsigned char *merged = NULL;
    kvmem_status st = KVMEM_OK;
    if (!d->dense && !d->filled) {
        /* the span has bytes between the elements that are the caller's:
         * read it, lay the elements over it, write it back */
        if (!(merged = kvm_aligned_alloc(d->span)))
            return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for a host copy of %zu bytes", fn, d->span);
        if ((st = kvm_be_download(d->be, d->buf, d->off, merged, d->span)) == KVMEM_OK) {
            copy_elements(&d->host, kvm_dtype_size(d->host.dtype), d->host.data, merged);
            src = merged;
        }
    }
    if (st == KVMEM_OK) st = kvm_be_upload(d->be, d->buf, d->off, src, d->span);
    kvm_aligned_free(merged);
    return st == KVMEM_OK ? KVMEM_OK : kvm_route_failed(d->be, fn, st);
}

void kvm_devt_close(kvm_devt *d) {
    if (d->buf) d->be->iface->buffer_free(d->be, d->buf);
    if (d->device) kvm_aligned_free(d->host.data);
    memset(d, 0, sizeof *d);
}

int kvm_devt_rows_dense(const kvm_devt *d, kvmem_dtype dt, int64_t *outer_stride) {
    const kvmem_tensor *t = &d->host;
    if (!d->device || t->dtype != dt || d->off % 4 != 0) return 0;
    int64_t want = 1;
    for (int32_t i = t->ndim - 1; i >= 1; i--) {
        if (t->shape[i] > 1 && t->strides[i] != want) return 0;
        want *= t->shape[i];
    }
    if ((t->strides[0] * (int64_t)kvm_dtype_size(dt)) % 4 != 0) return 0;
    *outer_stride = t->shape[0] > 1 ? t->strides[0] : want;
    return 1;
}

kvmem_status kvmem_context_vulkan_device(const kvmem_context *ctx, kvmem_vulkan_device *out) {
    static const char *fn = "kvmem_context_vulkan_device";
    if (!ctx || !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s is NULL", fn, !ctx ? "ctx" : "out");
    kvmem_vulkan_device d;
    memset(&d, 0, sizeof d);
    kvm_vulkan_device_fn get = NULL;
    if (ctx_kind(ctx) == KVMEM_MEMORY_VULKAN) {
        void *p = proc(ctx->backend, KVM_PROC_VULKAN_DEVICE);
        memcpy(&get, &p, sizeof get);
    }
    if (!get)
        return kvm_fail(KVMEM_ERR_UNSUPPORTED, "%s: the context runs on %s, not on a Vulkan device", fn, ctx->backend_name);
    get(ctx->backend, &d);
    /* writes out->struct_size bytes, nothing when that size is impossible */
    return kvm_params_init(out, out->struct_size, &d, sizeof d, "kvmem_vulkan_device", fn);
}
