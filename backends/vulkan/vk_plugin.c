/* libkvmem-vulkan.so: the backend table over Vulkan compute. Every op checks
 * its ranges exactly as the CPU backend does, records its dispatches into the
 * backend's command buffer, submits and waits (synchronous like the CPU
 * backend), and records the device time of the submission. */
#include "vk_internal.h"
#include "arith.h" /* checked size arithmetic (inline only: core symbols are hidden) */

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

static size_t dtype_size(kvmem_dtype dt) {
    return dt == KVMEM_F32 ? 4 : (dt == KVMEM_F16 || dt == KVMEM_BF16) ? 2 : 0;
}

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

static kvmem_status vk_sync(kvmem_backend *be) {
    kvm_vk *v = impl(be);
    pthread_mutex_lock(&v->mu);
    VkResult r = v->vk.vkQueueWaitIdle(v->queue);
    pthread_mutex_unlock(&v->mu);
    return r == VK_SUCCESS ? KVMEM_OK
                           : kvm_vk_fail(v, KVMEM_ERR_BACKEND, "vulkan: vkQueueWaitIdle failed (%s)",
                                         kvm_vk_result_str(r));
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

/* Shaders index buffers with 32-bit element indices. */
static int fits_u32(size_t x) { return x <= UINT32_MAX; }

/* ---- ops ---- */

static kvmem_status vk_convert(kvmem_backend *be, kvmem_buffer *dst, size_t dst_off, kvmem_dtype ddt,
                               const kvmem_buffer *src, size_t src_off, kvmem_dtype sdt, size_t n) {
    kvm_vk *v = impl(be);
    size_t ds = dtype_size(ddt), ss = dtype_size(sdt), db, sb;
    if (!ds || !ss) return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "convert: dtype must be f32, f16 or bf16");
    if (!kvm_mul_size(n, ds, &db) || !kvm_mul_size(n, ss, &sb) || !in_range(dst, dst_off, db) ||
        !in_range(src, src_off, sb))
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "convert: %zu elements outside the buffers", n);
    if (dst_off % ds || src_off % ss)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG,
                           "convert: vulkan needs offsets aligned to the element size (src %zu, dst %zu)", src_off,
                           dst_off);
    if (n == 0) return KVMEM_OK;
    if (!fits_u32(n) || !fits_u32(dst_off / ds + n) || !fits_u32(src_off / ss + n))
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "convert: %zu elements exceed the shaders' 32-bit indices", n);
    static const uint32_t code[] = {[KVMEM_F32] = 0, [KVMEM_F16] = 1, [KVMEM_BF16] = 2};
    uint32_t push[5] = {(uint32_t)n, (uint32_t)(src_off / ss), (uint32_t)(dst_off / ds), code[sdt], code[ddt]};
    /* 16-bit destinations: one invocation per output word */
    uint64_t items = ds == 4 ? n : (uint64_t)n / 2 + 2;
    const kvmem_buffer *bufs[2] = {src, dst};
    return kvm_vk_run(v, "convert", KVM_VK_CONVERT, bufs, 2, push, sizeof push, items, NULL);
}

static kvmem_status vk_aabb_build(kvmem_backend *be, const kvmem_buffer *keys, size_t keys_off, size_t n_groups,
                                  size_t group_stride, size_t n_rows, size_t dim, kvmem_buffer *out_min,
                                  kvmem_buffer *out_max, size_t out_off) {
    kvm_vk *v = impl(be);
    if (n_rows == 0 || dim == 0 || n_groups == 0)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "aabb_build: empty input");
    size_t in_el, in_bytes, out_bytes, t;
    if (!kvm_mul_size(n_groups - 1, group_stride, &in_el) || !kvm_mul_size(n_rows, dim, &t) ||
        !kvm_add_size(in_el, t, &in_el) || !kvm_mul_size(in_el, 4, &in_bytes) ||
        !kvm_mul_size(n_groups, dim, &t) || !kvm_mul_size(t, 4, &out_bytes) || !in_range(keys, keys_off, in_bytes) ||
        !in_range(out_min, out_off, out_bytes) || !in_range(out_max, out_off, out_bytes))
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "aabb_build: ranges outside the buffers");
    if (keys_off % 4 || out_off % 4)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "aabb_build: vulkan needs offsets that are multiples of 4 bytes");
    if (!fits_u32(keys_off / 4 + in_el) || !fits_u32(out_off / 4 + n_groups * dim))
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "aabb_build: sizes exceed the shaders' 32-bit indices");
    /* one invocation reduces ceil(items / (4096 groups x 128)) columns of n_rows
     * rows: past the loop budget (vk_internal.h) lavapipe would cut it short */
    const uint64_t per_inv = ((uint64_t)n_groups * dim + 4096 * KVM_VK_WG - 1) / (4096 * KVM_VK_WG);
    if (per_inv * ((uint64_t)n_rows + 2) > KVM_VK_LOOP_BUDGET)
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED,
                           "aabb_build: %zu groups of %zu rows x %zu take one vulkan invocation past its loop budget",
                           n_groups, n_rows, dim);
    uint32_t push[6] = {(uint32_t)n_groups, (uint32_t)group_stride, (uint32_t)n_rows, (uint32_t)dim,
                        (uint32_t)(keys_off / 4), (uint32_t)(out_off / 4)};
    const kvmem_buffer *bufs[3] = {keys, out_min, out_max};
    return kvm_vk_run(v, "aabb_build", KVM_VK_AABB_BUILD, bufs, 3, push, sizeof push, (uint64_t)n_groups * dim, NULL);
}

/* ---- escape hatch ---- */

static double vk_last_op_seconds(kvmem_backend *be) {
    kvm_vk *v = impl(be);
    pthread_mutex_lock(&v->mu);
    double s = v->last_op_seconds;
    pthread_mutex_unlock(&v->mu);
    return s;
}

static void *vk_proc(kvmem_backend *be, const char *name) {
    (void)be;
    if (name && strcmp(name, KVM_PROC_LAST_OP_SECONDS) == 0) {
        kvm_last_op_seconds_fn f = vk_last_op_seconds;
        void *p;
        memcpy(&p, &f, sizeof p); /* POSIX: function and data pointers have one size */
        return p;
    }
    return name ? kvm_vk_retrieval_proc(name) : NULL;
}

static const kvmem_backend_iface vk_iface = {
    .name = "vulkan",
    .free = vk_free,
    .buffer_alloc = vk_buffer_alloc,
    .buffer_free = vk_buffer_free,
    .buffer_upload = vk_upload,
    .buffer_download = vk_download,
    .buffer_host_ptr = vk_host_ptr,
    .synchronize = vk_sync,
    .convert = vk_convert,
    .aabb_build = vk_aabb_build,
    /* -- retrieval -- */
    .dev_score = kvm_vk_dev_score,
    .dev_score_reduce = kvm_vk_dev_score_reduce,
    .dev_topk = kvm_vk_dev_topk,
    .dev_gather_rope = kvm_vk_dev_gather_rope,

    /* -- eviction -- */
    .dev_qmem_score = kvm_vk_dev_qmem_score,
    /* -- attention -- */
    .dev_attend = kvm_vk_dev_attend,

    /* -- persistence -- */
    .quantize = kvm_vk_quantize,
    .dequantize = kvm_vk_dequantize,
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
