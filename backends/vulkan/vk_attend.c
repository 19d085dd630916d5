/* dev_attend on Vulkan (shaders/attend.comp): one workgroup per KV head,
 * the probe reduced with subgroup operations where the device has them.
 * Arguments are checked exactly like the CPU reference (attend/attend_dev.h);
 * what only device memory holds (slot ids >= n_slots, tile ids outside
 * [0, n_tiles)) is skipped by the shader, never read. */
#include "vk_internal.h"
#include "attend/attend_dev.h"

#include <string.h>

/* The shader keeps G * head_dim accumulator elements in 32 registers per
 * invocation of a 128-wide workgroup. */
#define KVM_VK_ATTEND_MAX_N 4096
#define KVM_VK_ATTEND_MAX_G 128

kvmem_status kvm_vk_dev_attend(kvmem_backend *be, const kvm_dev_attend_args *a) {
    kvm_vk *v = be->impl;
    if (!a) return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "dev_attend: args is NULL");
    const kvmem_buffer *bufs[KVM_DA_N] = {a->q, a->k, a->v, a->slot_map, a->order, a->out, a->visited};
    size_t size[KVM_DA_N];
    for (int i = 0; i < KVM_DA_N; i++) size[i] = bufs[i] ? bufs[i]->size : 0;
    char msg[256];
    if (!kvm_dev_attend_check(a, size, msg, sizeof msg))
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "dev_attend: %s", msg);
    const int64_t G = a->n_q_heads / a->n_kv_heads, N = G * a->head_dim;
    if (G > KVM_VK_ATTEND_MAX_G || N > KVM_VK_ATTEND_MAX_N)
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED,
                           "dev_attend: vulkan runs up to %d query heads per KV head and G * head_dim <= %d "
                           "(head_dim <= 256 with G <= 16); got G %lld, head_dim %d",
                           KVM_VK_ATTEND_MAX_G, KVM_VK_ATTEND_MAX_N, (long long)G, a->head_dim);
    const size_t es = a->dtype == KVMEM_F32 ? 4 : 2;
    /* every element index the shader forms fits 32 bits (ranges are checked) */
    for (int i = 0; i < KVM_DA_N; i++)
        if (bufs[i] && bufs[i]->size / (i == KVM_DA_K || i == KVM_DA_V ? es : 4) > UINT32_MAX)
            return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "dev_attend: buffers exceed the shaders' 32-bit indices");
    if ((uint64_t)a->n_kv_heads > v->props.limits.maxComputeWorkGroupCount[0])
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "dev_attend: %d KV heads exceed this device's dispatch limit",
                           a->n_kv_heads);
    const int64_t n_tiles = (a->n_pos + a->tile - 1) / a->tile;
    uint32_t push[21];
    push[0] = (uint32_t)a->n_slots;
    push[1] = (uint32_t)a->n_pos;
    push[2] = (uint32_t)a->n_kv_heads;
    push[3] = (uint32_t)G;
    push[4] = (uint32_t)a->head_dim;
    push[5] = (uint32_t)a->tile;
    push[6] = (uint32_t)a->n_visit;
    push[7] = (uint32_t)n_tiles;
    push[8] = a->dtype == KVMEM_F16;
    memcpy(&push[9], &a->scale, 4);
    memcpy(&push[10], &a->tau_s, 4);
    memcpy(&push[11], &a->tau_d, 4);
    push[12] = (uint32_t)a->patience;
    push[13] = a->tau_s > 0 || a->tau_d > 0;
    push[14] = (uint32_t)(a->q_off / 4);
    push[15] = (uint32_t)(a->k_off / es);
    push[16] = (uint32_t)(a->v_off / es);
    push[17] = (uint32_t)(a->slot_map_off / 4);
    push[18] = (uint32_t)(a->order_off / 4);
    push[19] = (uint32_t)(a->out_off / 4);
    push[20] = (uint32_t)(a->visited_off / 4);
    /* NULL slot_map / order (nothing to read): bind q in their place */
    const kvmem_buffer *bind[KVM_DA_N];
    for (int i = 0; i < KVM_DA_N; i++) bind[i] = bufs[i] ? bufs[i] : a->q;
    const uint32_t groups[3] = {(uint32_t)a->n_kv_heads, 1, 1};
    const kvm_vk_kernel k = v->subgroup_ops ? KVM_VK_ATTEND_SG : KVM_VK_ATTEND;
    return kvm_vk_run(v, "dev_attend", k, bind, KVM_DA_N, push, sizeof push, 0, groups);
}
