/* quantize / dequantize on Vulkan: Q8, Q4 and Q4 KIVI sections in the layout
 * of core/backend/quant_layout.h (kvm_qsection_layout is header-only, so the plugin
 * shares it). Validation mirrors the CPU backend's entries; the shaders
 * (shaders/quantize.comp, dequantize.comp) produce the CPU scalar
 * reference's bytes and values exactly. */
#include "vk_internal.h"
#include "arith.h"
#include "quant_layout.h"

#include <string.h>

static kvm_vk *impl(kvmem_backend *be) { return be->impl; }

/* Section layout (quant_layout.h's kvm_qsection_layout) plus what the shaders take.
 * n <= 2^24 and dim <= 1024: no overflow. */
typedef struct {
    size_t codes_off, scales_off, biases_off, bytes, n_params;
    uint32_t mode; /* 0 Q8, 1 Q4, 2 KIVI keys */
    uint32_t G, group;
} qlayout;

static qlayout layout(kvmem_dtype dt, int which, size_t n, size_t dim) {
    kvm_qsection s = kvm_qsection_layout(dt, which, n, dim);
    qlayout q;
    memset(&q, 0, sizeof q);
    q.codes_off = s.codes_off;
    q.scales_off = s.scales_off;
    q.biases_off = s.biases_off;
    q.bytes = s.bytes;
    q.n_params = s.scales_bytes / 2;
    q.mode = dt == KVMEM_Q8 ? 0u : s.per_channel ? 2u : 1u;
    q.group = dt == KVMEM_Q8 ? KVM_Q8_GROUP : KVM_Q4_GROUP;
    q.G = (uint32_t)((dim + q.group - 1) / q.group);
    return q;
}

static int in_range(const kvmem_buffer *b, size_t off, size_t n) {
    return b && off <= b->size && n <= b->size - off;
}

static kvmem_status check(kvm_vk *v, kvmem_dtype dt, int which, size_t n, size_t dim, const char *op) {
    if (dt != KVMEM_Q8 && dt != KVMEM_Q4 && dt != KVMEM_Q4_KIVI)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "%s: dtype %d is not Q8, Q4 or Q4_KIVI", op, (int)dt);
    if (which != 0 && which != 1)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "%s: which must be 0 (keys) or 1 (values)", op);
    if (n == 0 || dim == 0 || dim > 1024 || n > ((size_t)1 << 24))
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "%s: %zu rows of %zu: need 1..2^24 rows of 1..1024", op, n,
                           dim);
    return KVMEM_OK;
}

static kvmem_status check_limit(kvm_vk *v, const char *op, const kvmem_buffer *const *bufs, int nb) {
    for (int i = 0; i < nb; i++)
        if (bufs[i]->cap > v->props.limits.maxStorageBufferRange)
            return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED,
                               "vulkan %s: a buffer of %llu bytes exceeds this device's storage buffer range (%u)",
                               op, (unsigned long long)bufs[i]->cap, v->props.limits.maxStorageBufferRange);
    return KVMEM_OK;
}

kvmem_status kvm_vk_quantize(kvmem_backend *be, kvmem_dtype dt, int which, const kvmem_buffer *src,
                                size_t src_off, size_t n, size_t dim, kvmem_buffer *dst, size_t dst_off) {
    static const char op[] = "quantize";
    kvm_vk *v = impl(be);
    kvmem_status st = check(v, dt, which, n, dim, op);
    if (st != KVMEM_OK) return st;
    qlayout q = layout(dt, which, n, dim);
    if (!in_range(src, src_off, n * dim * 4) || !in_range(dst, dst_off, q.bytes) || src_off % 4 || dst_off % 4)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "quantize: ranges outside the buffers or misaligned");
    if (src_off / 4 + n * dim > UINT32_MAX || dst_off / 4 + q.bytes / 4 > UINT32_MAX || n * dim > UINT32_MAX)
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "quantize: %zu x %zu exceeds the shaders' 32-bit indices", n, dim);
    size_t pw = (q.n_params + 1) / 2;
    size_t n_code_words = q.mode == 0 ? (n * dim + 3) / 4 : n * ((dim + 7) / 8);
    /* One invocation's loops (grid-stride over at most 4096 groups): pass 0
     * reads each of its parameter pairs' values (a group, or a KIVI key
     * channel's n rows), pass 1 packs words of up to 8 codes. Past the loop
     * budget (vk_internal.h) lavapipe would cut it short: refused. */
    const uint64_t cnt = q.mode == 2 ? n : q.group, per_inv0 = (pw + 4096 * KVM_VK_WG - 1) / (4096 * KVM_VK_WG);
    const uint64_t words = n_code_words + (q.mode == 0 ? pw : 2 * pw);
    const uint64_t per_inv1 = (words + 4096 * KVM_VK_WG - 1) / (4096 * KVM_VK_WG);
    if (per_inv0 * 2 * (cnt + 64) > KVM_VK_LOOP_BUDGET || per_inv1 * 10 > KVM_VK_LOOP_BUDGET)
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED,
                           "quantize: %zu rows x %zu take one vulkan invocation past its loop budget", n, dim);
    kvmem_buffer *tmp = NULL;
    const kvmem_buffer *bufs[3] = {src, dst, NULL};
    if ((st = check_limit(v, op, bufs, 2)) != KVMEM_OK) return st;
    pthread_mutex_lock(&v->mu);
    st = kvm_vk_buffer_create(v, (1 + 2 * pw) * 4, 1, &tmp);
    if (st != KVMEM_OK) {
        pthread_mutex_unlock(&v->mu);
        return st;
    }
    bufs[2] = tmp;
    uint32_t push[13] = {q.mode,
                         0,
                         (uint32_t)n,
                         (uint32_t)dim,
                         q.G,
                         (uint32_t)q.n_params,
                         (uint32_t)(src_off / 4),
                         (uint32_t)(dst_off / 4),
                         (uint32_t)(q.codes_off / 4),
                         (uint32_t)n_code_words,
                         (uint32_t)(q.mode == 0 ? 0 : q.scales_off / 4),
                         (uint32_t)pw,
                         q.group};
    uint32_t flag = 0;
    VkResult r = kvm_vk_begin(v);
    if (r == VK_SUCCESS) {
        v->vk.vkCmdFillBuffer(v->cmd, tmp->buf, 0, 4, 0);
        kvm_vk_barrier(v);
        r = kvm_vk_record_dispatch(v, KVM_VK_QUANTIZE, bufs, 3, push, sizeof push, pw);
    }
    if (r == VK_SUCCESS) {
        push[1] = 1;
        r = kvm_vk_record_dispatch(v, KVM_VK_QUANTIZE, bufs, 3, push, sizeof push,
                                   n_code_words + (q.mode == 0 ? pw : 2 * pw));
    }
    if (r == VK_SUCCESS) r = kvm_vk_submit_wait(v, 1);
    else v->vk.vkEndCommandBuffer(v->cmd);
    if (r == VK_SUCCESS) st = kvm_vk_download(v, tmp, 0, &flag, 4);
    else st = kvm_vk_fail(v, KVMEM_ERR_BACKEND, "vulkan quantize failed (%s)", kvm_vk_result_str(r));
    kvm_vk_buffer_destroy(v, tmp);
    pthread_mutex_unlock(&v->mu);
    if (st == KVMEM_OK && flag)
        /* the shader wrote nothing to dst (it checks the flag first) */
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "quantize: a value is not finite within +-65504");
    return st;
}

kvmem_status kvm_vk_dequantize(kvmem_backend *be, kvmem_dtype dt, int which, const kvmem_buffer *src,
                                  size_t src_off, size_t n, size_t dim, size_t row0, size_t cnt, kvmem_buffer *dst,
                                  size_t dst_off) {
    static const char op[] = "dequantize";
    kvm_vk *v = impl(be);
    kvmem_status st = check(v, dt, which, n, dim, op);
    if (st != KVMEM_OK) return st;
    qlayout q = layout(dt, which, n, dim);
    if (row0 > n || cnt > n - row0 || !in_range(src, src_off, q.bytes) || !in_range(dst, dst_off, cnt * dim * 4) ||
        src_off % 4 || dst_off % 4)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "dequantize: ranges outside the buffers or misaligned");
    if (cnt == 0) return KVMEM_OK;
    if (src_off / 4 + q.bytes / 4 > UINT32_MAX || dst_off / 4 + cnt * dim > UINT32_MAX || n * dim > UINT32_MAX)
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "dequantize: %zu x %zu exceeds the shaders' 32-bit indices", n,
                           dim);
    uint32_t push[12] = {q.mode,
                         (uint32_t)n,
                         (uint32_t)dim,
                         q.G,
                         q.group,
                         (uint32_t)(src_off / 4),
                         (uint32_t)(q.codes_off / 4),
                         (uint32_t)(q.scales_off / 4),
                         (uint32_t)(q.biases_off / 4),
                         (uint32_t)row0,
                         (uint32_t)cnt,
                         (uint32_t)(dst_off / 4)};
    const kvmem_buffer *bufs[2] = {src, dst};
    return kvm_vk_run(v, op, KVM_VK_DEQUANTIZE, bufs, 2, push, sizeof push, (uint64_t)cnt * dim, NULL);
}
