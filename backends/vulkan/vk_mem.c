/* Buffers. Device buffers take the device-local memory type; where that is
 * also host-visible and coherent (integrated GPUs, lavapipe) they stay mapped
 * and transfers are memcpy, otherwise transfers go through a host-visible
 * staging buffer in chunks with vkCmdCopyBuffer. */
#include "vk_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define STAGING_CHUNK ((size_t)8 << 20) /* largest staging buffer, bytes */

kvmem_status kvm_vk_buffer_create(kvm_vk *v, size_t size, int device, kvmem_buffer **out) {
    *out = NULL;
    uint32_t type = device ? v->device_mem_type : v->staging_mem_type;
    VkDeviceSize heap = v->mem_props.memoryHeaps[v->mem_props.memoryTypes[type].heapIndex].size;
    /* refused here rather than handed to a driver that may not cope */
    if ((uint64_t)size > heap)
        return kvm_vk_fail(v, KVMEM_ERR_NOMEM, "vulkan: cannot allocate %zu bytes: the memory heap has %llu",
                           size, (unsigned long long)heap);
    kvmem_buffer *b = calloc(1, sizeof *b);
    if (!b) return kvm_vk_fail(v, KVMEM_ERR_NOMEM, "vulkan: out of host memory");
    b->size = size;
    /* whole words, never empty: shaders read buffers as uint arrays */
    b->cap = ((VkDeviceSize)size + 3u) & ~(VkDeviceSize)3u;
    if (b->cap < 4) b->cap = 4;
    VkBufferCreateInfo bci = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, NULL, 0, b->cap,
                              VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                  VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                              VK_SHARING_MODE_EXCLUSIVE, 0, NULL};
    VkResult r = v->vk.vkCreateBuffer(v->dev, &bci, NULL, &b->buf);
    if (r != VK_SUCCESS) {
        free(b);
        return kvm_vk_fail(v, KVMEM_ERR_NOMEM, "vulkan: cannot create a buffer of %zu bytes (%s)", size,
                           kvm_vk_result_str(r));
    }
    VkMemoryRequirements req;
    v->vk.vkGetBufferMemoryRequirements(v->dev, b->buf, &req);
    VkMemoryAllocateInfo mai = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, NULL, req.size, type};
    r = (req.memoryTypeBits & (1u << type)) ? v->vk.vkAllocateMemory(v->dev, &mai, NULL, &b->mem)
                                            : VK_ERROR_FEATURE_NOT_PRESENT;
    if (r == VK_SUCCESS) r = v->vk.vkBindBufferMemory(v->dev, b->buf, b->mem, 0);
    int mapped = device ? v->device_mem_mapped : 1;
    if (r == VK_SUCCESS && mapped) r = v->vk.vkMapMemory(v->dev, b->mem, 0, VK_WHOLE_SIZE, 0, &b->map);
    if (r != VK_SUCCESS) {
        kvm_vk_buffer_destroy(v, b);
        return kvm_vk_fail(v, KVMEM_ERR_NOMEM, "vulkan: cannot allocate %zu bytes of %s memory (%s)", size,
                           device ? "device" : "staging", kvm_vk_result_str(r));
    }
    *out = b;
    return KVMEM_OK;
}

kvmem_status kvm_vk_buffer_wrap(kvm_vk *v, const kvmem_device_memory *mem, kvmem_buffer **out) {
    *out = NULL;
    if (mem->kind != KVMEM_MEMORY_VULKAN)
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "vulkan: memory of kind %d is not a VkBuffer", (int)mem->kind);
    if (mem->size > SIZE_MAX)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "vulkan: a buffer of %llu bytes does not fit this process",
                           (unsigned long long)mem->size);
    kvmem_buffer *b = calloc(1, sizeof *b);
    if (!b) return kvm_vk_fail(v, KVMEM_ERR_NOMEM, "vulkan: out of host memory");
    b->buf = (VkBuffer)(uintptr_t)mem->handle;
    b->size = (size_t)mem->size;
    b->cap = (VkDeviceSize)mem->size;
    b->borrowed = 1; /* never mapped here: the caller's memory type may not be host-visible */
    *out = b;
    return KVMEM_OK;
}

void kvm_vk_buffer_destroy(kvm_vk *v, kvmem_buffer *b) {
    if (!b) return;
    if (b->borrowed) {
        free(b);
        return;
    }
    if (b->map) v->vk.vkUnmapMemory(v->dev, b->mem);
    if (b->buf) v->vk.vkDestroyBuffer(v->dev, b->buf, NULL);
    if (b->mem) v->vk.vkFreeMemory(v->dev, b->mem, NULL);
    free(b);
}

/* A staging buffer of at least min(n, STAGING_CHUNK) bytes (v->mu held). */
static kvmem_status staging_for(kvm_vk *v, size_t n, size_t *chunk) {
    size_t want = n < STAGING_CHUNK ? n : STAGING_CHUNK;
    if (want < 4096) want = 4096;
    if (!v->staging || v->staging->size < want) {
        kvmem_buffer *s;
        kvmem_status st = kvm_vk_buffer_create(v, want, 0, &s);
        if (st != KVMEM_OK) return st;
        if (v->staging) kvm_vk_buffer_destroy(v, v->staging);
        v->staging = s;
    }
    *chunk = v->staging->size;
    return KVMEM_OK;
}

static kvmem_status copy(kvm_vk *v, VkBuffer src, size_t so, VkBuffer dst, size_t dof, size_t n) {
    VkResult r = kvm_vk_begin(v);
    if (r == VK_SUCCESS) {
        VkBufferCopy c = {so, dof, n};
        v->vk.vkCmdCopyBuffer(v->cmd, src, dst, 1, &c);
        kvm_vk_barrier(v);
        r = kvm_vk_submit_wait(v, 0);
    }
    return r == VK_SUCCESS ? KVMEM_OK
                           : kvm_vk_fail(v, KVMEM_ERR_BACKEND, "vulkan: buffer copy failed (%s)",
                                         kvm_vk_result_str(r));
}

/* Callers hold v->mu and have checked the ranges. Every op waits for its
 * own submission, so mapped memory is never written by the device here. */
kvmem_status kvm_vk_upload(kvm_vk *v, kvmem_buffer *dst, size_t off, const void *src, size_t n) {
    if (n == 0) return KVMEM_OK;
    if (dst->map) {
        memcpy((unsigned char *)dst->map + off, src, n);
        return KVMEM_OK;
    }
    size_t chunk;
    kvmem_status st = staging_for(v, n, &chunk);
    for (size_t done = 0; st == KVMEM_OK && done < n; done += chunk) {
        size_t c = n - done < chunk ? n - done : chunk;
        memcpy(v->staging->map, (const unsigned char *)src + done, c);
        st = copy(v, v->staging->buf, 0, dst->buf, off + done, c);
    }
    return st;
}

kvmem_status kvm_vk_download(kvm_vk *v, const kvmem_buffer *src, size_t off, void *dst, size_t n) {
    if (n == 0) return KVMEM_OK;
    if (src->map) {
        memcpy(dst, (const unsigned char *)src->map + off, n);
        return KVMEM_OK;
    }
    size_t chunk;
    kvmem_status st = staging_for(v, n, &chunk);
    for (size_t done = 0; st == KVMEM_OK && done < n; done += chunk) {
        size_t c = n - done < chunk ? n - done : chunk;
        st = copy(v, src->buf, off + done, v->staging->buf, 0, c);
        if (st == KVMEM_OK) memcpy((unsigned char *)dst + done, v->staging->map, c);
    }
    return st;
}
