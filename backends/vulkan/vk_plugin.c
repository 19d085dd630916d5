/* libkvmem-vulkan.so: the backend table over Vulkan compute. Every op checks
 * its ranges exactly as the CPU backend does, records its dispatches into the
 * backend's command buffer, submits and waits (synchronous like the CPU
 * backend), and records the device time of the submission. */
#include "vk_internal.h"
#include "dev_args.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#  define KVM_VK_EXPORT __attribute__((visibility("default")))
#else
#  define KVM_VK_EXPORT
#endif

kvmem_status kvm_vk_fail(const kvm_vk *v, kvmem_status status, const char *fmt, ...) {
    if (!v || !v->be || !v->be->fail) return status;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return v->be->fail(status, "%s", msg);
}

static kvm_vk *impl(const kvmem_backend *be) { return be->impl; }

static int in_range(const kvmem_buffer *b, size_t off, size_t n) {
    return b && off <= b->size && n <= b->size - off;
}

static void vk_free(kvmem_backend *be) {
    if (!be) return;
    kvm_vk *v = impl(be);
    if (v) {
        kvm_vk_device_close(v);
        pthread_mutex_destroy(&v->mu);
        free(v);
    }
    free(be);
}

/* ---- buffers ---- */

static kvmem_status vk_buffer_alloc(kvmem_backend *be, size_t size, kvmem_buffer **out) {
    kvm_vk *v = impl(be);
    if (!out) return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "vulkan buffer_alloc: out is NULL");
    return kvm_vk_buffer_create(v, size, 1, out);
}

static void vk_buffer_free(kvmem_backend *be, kvmem_buffer *b) {
    if (!b) return;
    kvm_vk *v = impl(be);
    pthread_mutex_lock(&v->mu); /* no op of this backend is using it now */
    kvm_vk_buffer_destroy(v, b);
    pthread_mutex_unlock(&v->mu);
}

static kvmem_status vk_upload(kvmem_backend *be, kvmem_buffer *dst, size_t off, const void *src, size_t n) {
    kvm_vk *v = impl(be);
    if (!in_range(dst, off, n) || (n && !src))
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "upload of %zu bytes at %zu outside the buffer", n, off);
    pthread_mutex_lock(&v->mu);
    kvmem_status st = kvm_vk_upload(v, dst, off, src, n);
    pthread_mutex_unlock(&v->mu);
    return st;
}

static kvmem_status vk_download(kvmem_backend *be, const kvmem_buffer *src, size_t off, void *dst, size_t n) {
    kvm_vk *v = impl(be);
    if (!in_range(src, off, n) || (n && !dst))
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "download of %zu bytes at %zu outside the buffer", n, off);
    pthread_mutex_lock(&v->mu);
    kvmem_status st = kvm_vk_download(v, src, off, dst, n);
    pthread_mutex_unlock(&v->mu);
    return st;
}

/* Mapped buffers only: staged ones have no host address. */
static void *vk_host_ptr(kvmem_backend *be, kvmem_buffer *b) {
    (void)be;
    return b ? b->map : NULL;
}

kvmem_status kvm_vk_run(kvm_vk *v, const char *op, kvm_vk_kernel k, const kvmem_buffer *const *bufs,
                        uint32_t n_bufs, const void *push, uint32_t push_size, uint64_t items, const uint32_t *groups3) {
    for (uint32_t i = 0; i < n_bufs; i++)
        if (bufs[i]->cap > v->props.limits.maxStorageBufferRange)
            return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED,
                               "vulkan %s: a buffer of %llu bytes exceeds this device's storage buffer range (%u)",
                               op, (unsigned long long)bufs[i]->cap, v->props.limits.maxStorageBufferRange);
    pthread_mutex_lock(&v->mu);
    VkResult r = kvm_vk_begin(v);
    if (r == VK_SUCCESS)
        r = groups3 ? kvm_vk_record_dispatch3(v, k, bufs, n_bufs, push, push_size, groups3[0], groups3[1], groups3[2])
                    : kvm_vk_record_dispatch(v, k, bufs, n_bufs, push, push_size, items);
    if (r == VK_SUCCESS) r = kvm_vk_submit_wait(v, 1);
    else v->vk.vkEndCommandBuffer(v->cmd);
    pthread_mutex_unlock(&v->mu);
    return r == VK_SUCCESS ? KVMEM_OK
                           : kvm_vk_fail(v, KVMEM_ERR_BACKEND, "vulkan %s failed (%s)", op, kvm_vk_result_str(r));
}

/* ---- escape hatch ---- */

static double vk_last_op_seconds(kvmem_backend *be) {
    kvm_vk *v = impl(be);
    pthread_mutex_lock(&v->mu);
    double s = v->last_op_seconds;
    pthread_mutex_unlock(&v->mu);
    return s;
}

/* ---- device tensors ---- */

static kvmem_status vk_buffer_wrap(kvmem_backend *be, const kvmem_device_memory *mem, kvmem_buffer **out) {
    kvm_vk *v = impl(be);
    if (!mem || !out) return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "vulkan buffer_wrap: %s is NULL", !mem ? "mem" : "out");
    return kvm_vk_buffer_wrap(v, mem, out);
}

static void vk_device_handles(kvmem_backend *be, kvmem_vulkan_device *out) {
    const kvm_vk *v = impl(be);
    out->instance = (void *)v->inst;
    out->physical_device = (void *)v->phys;
    out->device = (void *)v->dev;
    out->queue = (void *)v->queue;
    out->queue_family = v->queue_family;
    out->api_version = v->props.apiVersion;
}

static void *vk_proc(kvmem_backend *be, const char *name) {
    (void)be;
    void *p = NULL;
    if (!name) return NULL;
    /* POSIX: function and data pointers have one size */
    if (strcmp(name, KVM_PROC_LAST_OP_SECONDS) == 0) {
        kvm_last_op_seconds_fn f = vk_last_op_seconds;
        memcpy(&p, &f, sizeof p);
    } else if (strcmp(name, KVM_PROC_BUFFER_WRAP) == 0) {
        kvm_buffer_wrap_fn f = vk_buffer_wrap;
        memcpy(&p, &f, sizeof p);
    } else if (strcmp(name, KVM_PROC_VULKAN_DEVICE) == 0) {
        kvm_vulkan_device_fn f = vk_device_handles;
        memcpy(&p, &f, sizeof p);
    } else {
        p = kvm_vk_retrieval_proc(name);
    }
    return p;
}

/* The buffer-level forms only (the host-side ones are the CPU backend's);
 * shapes beyond the kernels' limits are refused by the entries themselves
 * (KVMEM_ERR_UNSUPPORTED: the core then runs the op on the CPU). */
static int vk_supports(kvmem_backend *be, kvm_op op, const void *args) {
    (void)be;
    return kvm_dev_args_buffer_form(op, args);
}

static const kvmem_backend_iface vk_iface = {
    .name = "vulkan",
    .free = vk_free,
    .buffer_alloc = vk_buffer_alloc,
    .buffer_free = vk_buffer_free,
    .buffer_upload = vk_upload,
    .buffer_download = vk_download,
    .buffer_host_ptr = vk_host_ptr,
    /* -- retrieval -- */
    .dev_score = kvm_vk_dev_score,
    .dev_score_reduce = kvm_vk_dev_score_reduce,
    .dev_topk = kvm_vk_dev_topk,
    .dev_gather_rope = kvm_vk_dev_gather_rope,

    /* -- eviction -- */
    .dev_qmem_score = kvm_vk_dev_qmem_score,
    /* -- attention -- */
    .dev_attend = kvm_vk_dev_attend,
    .supports_op = vk_supports,
    .get_proc_address = vk_proc,
};

KVM_VK_EXPORT kvmem_status kvmem_backend_plugin_init(uint32_t api_version, kvmem_context *ctx, kvmem_backend **out,
                                                     char *why, size_t why_size);

KVM_VK_EXPORT kvmem_status kvmem_backend_plugin_init(uint32_t api_version, kvmem_context *ctx, kvmem_backend **out,
                                                     char *why, size_t why_size) {
    if (!out || !why || why_size == 0) return KVMEM_ERR_INVALID_ARG;
    *out = NULL;
    if (api_version != KVMEM_BACKEND_API_VERSION) {
        snprintf(why, why_size, "libkvmem-vulkan.so speaks backend API %u, libkvmem %u: rebuild them together",
                 KVMEM_BACKEND_API_VERSION, api_version);
        return KVMEM_ERR_UNSUPPORTED;
    }
    VkInstance inst;
    kvmem_status st = kvm_vk_instance_acquire(&inst, why, why_size);
    if (st != KVMEM_OK) return st;
    kvmem_backend *be = calloc(1, sizeof *be);
    kvm_vk *v = calloc(1, sizeof *v);
    if (!be || !v) {
        free(be);
        free(v);
        snprintf(why, why_size, "vulkan: out of host memory");
        return KVMEM_ERR_NOMEM;
    }
    pthread_mutex_init(&v->mu, NULL);
    v->be = be;
    be->iface = &vk_iface;
    be->impl = v;
    be->ctx = ctx;
    v->inst = inst;
    st = kvm_vk_device_open(v, inst, why, why_size);
    if (st != KVMEM_OK) {
        vk_free(be);
        return st;
    }
    be->detail = v->detail;
    be->cpu_device = v->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    *out = be;
    return KVMEM_OK;
}
