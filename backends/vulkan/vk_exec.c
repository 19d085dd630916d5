/* Recording and submission: one command buffer per backend, used under
 * v->mu, submitted and waited for by every op (ops are synchronous like the
 * CPU backend's). Two timestamps bracket a timed submission. */
#include "vk_internal.h"
#include "vk_shaders.h"

#include <stdlib.h>
#include <string.h>

static const struct {
    const char *shader;
    uint32_t n_bindings;
    uint32_t push_size;
} k_kernels[KVM_VK_N_KERNELS] = {
    [KVM_VK_AABB_SCORE] = {"aabb_score", 4, 15 * 4},
    [KVM_VK_GATHER_ROPE] = {"gather_rope", 4, 13 * 4},
    /* -- retrieval -- */
    [KVM_VK_SCORE_REDUCE] = {"score_reduce", 2, 16 * 4},
    [KVM_VK_SCORE_REDUCE_SG] = {"score_reduce_sg", 2, 16 * 4},
    [KVM_VK_TOPK] = {"topk", 3, 7 * 4},
    [KVM_VK_SCORE_SETS] = {"score_sets", 2, 9 * 4},
    [KVM_VK_EXACT_SCORE] = {"exact_score", 3, 16 * 4},

    /* -- eviction -- */
    [KVM_VK_QMEM_SCORE] = {"qmem_score", 4, 16 * 4},
    [KVM_VK_QMEM_SCORE_SG] = {"qmem_score_sg", 4, 16 * 4},

    /* -- attention -- */
    [KVM_VK_ATTEND] = {"attend", 11, 31 * 4},
    [KVM_VK_ATTEND_SG] = {"attend_sg", 11, 31 * 4},
    [KVM_VK_TILE_ORDER] = {"tile_order", 5, 21 * 4},

};

static const kvm_vk_shader *find_shader(const char *name) {
    for (int i = 0; i < kvm_vk_n_shaders; i++)
        if (strcmp(kvm_vk_shaders[i].name, name) == 0) return &kvm_vk_shaders[i];
    return NULL;
}

static VkResult pipeline_create(kvm_vk *v, kvm_vk_kernel k) {
    kvm_vk_pipeline *p = &v->pipes[k];
    const kvm_vk_shader *sh = find_shader(k_kernels[k].shader);
    if (!sh) return VK_ERROR_INITIALIZATION_FAILED;
    VkDescriptorSetLayoutBinding b[KVM_VK_MAX_BINDINGS];
    for (uint32_t i = 0; i < k_kernels[k].n_bindings; i++)
        b[i] = (VkDescriptorSetLayoutBinding){i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1,
                                              VK_SHADER_STAGE_COMPUTE_BIT, NULL};
    VkDescriptorSetLayoutCreateInfo dci = {VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, NULL, 0,
                                           k_kernels[k].n_bindings, b};
    VkPushConstantRange pr = {VK_SHADER_STAGE_COMPUTE_BIT, 0, k_kernels[k].push_size};
    VkResult r = v->vk.vkCreateDescriptorSetLayout(v->dev, &dci, NULL, &p->dsl);
    if (r != VK_SUCCESS) return r;
    VkPipelineLayoutCreateInfo lci = {VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, NULL, 0, 1, &p->dsl, 1, &pr};
    if ((r = v->vk.vkCreatePipelineLayout(v->dev, &lci, NULL, &p->layout)) != VK_SUCCESS) return r;
    VkShaderModuleCreateInfo sci = {VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, NULL, 0,
                                    sh->n_words * 4, sh->code};
    VkShaderModule mod;
    if ((r = v->vk.vkCreateShaderModule(v->dev, &sci, NULL, &mod)) != VK_SUCCESS) return r;
    VkComputePipelineCreateInfo cci = {
        VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, NULL, 0,
        {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, NULL, 0, VK_SHADER_STAGE_COMPUTE_BIT, mod,
         "main", NULL},
        p->layout, VK_NULL_HANDLE, -1};
    r = v->vk.vkCreateComputePipelines(v->dev, VK_NULL_HANDLE, 1, &cci, NULL, &p->pipe);
    v->vk.vkDestroyShaderModule(v->dev, mod, NULL);
    if (r == VK_SUCCESS) p->n_bindings = k_kernels[k].n_bindings;
    return r;
}

void kvm_vk_pipelines_destroy(kvm_vk *v) {
    for (int k = 0; k < KVM_VK_N_KERNELS; k++) {
        kvm_vk_pipeline *p = &v->pipes[k];
        if (p->pipe) v->vk.vkDestroyPipeline(v->dev, p->pipe, NULL);
        if (p->layout) v->vk.vkDestroyPipelineLayout(v->dev, p->layout, NULL);
        if (p->dsl) v->vk.vkDestroyDescriptorSetLayout(v->dev, p->dsl, NULL);
        memset(p, 0, sizeof *p);
    }
}

VkResult kvm_vk_begin(kvm_vk *v) {
    VkResult r = v->vk.vkResetCommandBuffer(v->cmd, 0);
    if (r != VK_SUCCESS) return r;
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                   VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, NULL};
    r = v->vk.vkBeginCommandBuffer(v->cmd, &bi);
    if (r == VK_SUCCESS && v->query_pool) {
        v->vk.vkCmdResetQueryPool(v->cmd, v->query_pool, 0, 2);
        v->vk.vkCmdWriteTimestamp(v->cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, v->query_pool, 0);
    }
    return r;
}

void kvm_vk_barrier(kvm_vk *v) {
    VkMemoryBarrier mb = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL,
                          VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                              VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_READ_BIT};
    v->vk.vkCmdPipelineBarrier(v->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                               VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT |
                                   VK_PIPELINE_STAGE_HOST_BIT,
                               0, 1, &mb, 0, NULL, 0, NULL);
}

VkResult kvm_vk_submit_wait(kvm_vk *v, int timed) {
    if (v->query_pool)
        v->vk.vkCmdWriteTimestamp(v->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, v->query_pool, 1);
    VkResult r = v->vk.vkEndCommandBuffer(v->cmd);
    if (r != VK_SUCCESS) return r;
    VkSubmitInfo si = {VK_STRUCTURE_TYPE_SUBMIT_INFO, NULL, 0, NULL, NULL, 1, &v->cmd, 0, NULL};
    if ((r = v->vk.vkQueueSubmit(v->queue, 1, &si, v->fence)) != VK_SUCCESS) return r;
    r = v->vk.vkWaitForFences(v->dev, 1, &v->fence, VK_TRUE, UINT64_MAX);
    v->vk.vkResetFences(v->dev, 1, &v->fence);
    v->vk.vkResetDescriptorPool(v->dev, v->desc_pool, 0);
    if (r == VK_SUCCESS && timed) {
        v->last_op_seconds = -1;
        uint64_t ts[2];
        if (v->query_pool &&
            v->vk.vkGetQueryPoolResults(v->dev, v->query_pool, 0, 2, sizeof ts, ts, sizeof ts[0],
                                        VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) == VK_SUCCESS &&
            ts[1] >= ts[0])
            v->last_op_seconds = (double)(ts[1] - ts[0]) * (double)v->props.limits.timestampPeriod * 1e-9;
    }
    return r;
}

VkResult kvm_vk_bind(kvm_vk *v, kvm_vk_kernel k, const kvmem_buffer *const *bufs, uint32_t n_bufs,
                     uint32_t push_size) {
    kvm_vk_pipeline *p = &v->pipes[k];
    VkResult r;
    if (!p->pipe && (r = pipeline_create(v, k)) != VK_SUCCESS) {
        kvm_vk_pipelines_destroy(v); /* retried from scratch next time */
        return r;
    }
    if (n_bufs != p->n_bindings || push_size != k_kernels[k].push_size) return VK_ERROR_INITIALIZATION_FAILED;
    VkDescriptorSetAllocateInfo ai = {VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, NULL, v->desc_pool, 1, &p->dsl};
    VkDescriptorSet set;
    if ((r = v->vk.vkAllocateDescriptorSets(v->dev, &ai, &set)) != VK_SUCCESS) return r;
    VkDescriptorBufferInfo bi[KVM_VK_MAX_BINDINGS];
    VkWriteDescriptorSet w[KVM_VK_MAX_BINDINGS];
    for (uint32_t i = 0; i < n_bufs; i++) {
        bi[i] = (VkDescriptorBufferInfo){bufs[i]->buf, 0, VK_WHOLE_SIZE};
        w[i] = (VkWriteDescriptorSet){VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, NULL, set, i, 0, 1,
                                      VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, NULL, &bi[i], NULL};
    }
    v->vk.vkUpdateDescriptorSets(v->dev, n_bufs, w, 0, NULL);
    v->vk.vkCmdBindPipeline(v->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipe);
    v->vk.vkCmdBindDescriptorSets(v->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0, 1, &set, 0, NULL);
    return VK_SUCCESS;
}

static int groups_ok(const kvm_vk *v, uint32_t gx, uint32_t gy, uint32_t gz) {
    const uint32_t *lim = v->props.limits.maxComputeWorkGroupCount;
    return gx && gy && gz && gx <= lim[0] && gy <= lim[1] && gz <= lim[2];
}

VkResult kvm_vk_dispatch(kvm_vk *v, kvm_vk_kernel k, const void *push, uint32_t push_size, uint32_t gx, uint32_t gy,
                         uint32_t gz) {
    if (!groups_ok(v, gx, gy, gz)) return VK_ERROR_TOO_MANY_OBJECTS;
    v->vk.vkCmdPushConstants(v->cmd, v->pipes[k].layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_size, push);
    v->vk.vkCmdDispatch(v->cmd, gx, gy, gz);
    kvm_vk_barrier(v);
    return VK_SUCCESS;
}

static VkResult record(kvm_vk *v, kvm_vk_kernel k, const kvmem_buffer *const *bufs, uint32_t n_bufs,
                       const void *push, uint32_t push_size, uint32_t gx, uint32_t gy, uint32_t gz) {
    if (!groups_ok(v, gx, gy, gz)) return VK_ERROR_TOO_MANY_OBJECTS;
    VkResult r = kvm_vk_bind(v, k, bufs, n_bufs, push_size);
    return r == VK_SUCCESS ? kvm_vk_dispatch(v, k, push, push_size, gx, gy, gz) : r;
}

uint32_t kvm_vk_loop_budget(void) {
    const char *e = getenv("KVMEM_VULKAN_LOOP_BUDGET");
    char *end = NULL;
    unsigned long x = e ? strtoul(e, &end, 10) : 0;
    return e && end && *end == 0 && x > 0 && x < KVM_VK_LOOP_BUDGET ? (uint32_t)x : KVM_VK_LOOP_BUDGET;
}

VkResult kvm_vk_record_dispatch3(kvm_vk *v, kvm_vk_kernel k, const kvmem_buffer *const *bufs, uint32_t n_bufs,
                                 const void *push, uint32_t push_size, uint32_t gx, uint32_t gy, uint32_t gz) {
    return record(v, k, bufs, n_bufs, push, push_size, gx, gy, gz);
}

VkResult kvm_vk_record_dispatch(kvm_vk *v, kvm_vk_kernel k, const kvmem_buffer *const *bufs, uint32_t n_bufs,
                                const void *push, uint32_t push_size, uint64_t items) {
    uint64_t groups = (items + KVM_VK_WG - 1) / KVM_VK_WG;
    /* Grid-stride loops in the shaders cover the rest. 4096 groups of 128
     * keep any current GPU full (an H100 holds ~270k resident invocations)
     * while bounding per-workgroup overhead, which dominates on lavapipe. */
    uint64_t cap = v->props.limits.maxComputeWorkGroupCount[0];
    if (cap > 4096) cap = 4096;
    if (groups > cap) groups = cap;
    if (groups == 0) groups = 1;
    return record(v, k, bufs, n_bufs, push, push_size, (uint32_t)groups, 1, 1);
}
