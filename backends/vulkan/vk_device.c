/* Loader, instance and device: the process shares one VkInstance (reference
 * counted) because volk keeps instance entry points in globals; each backend
 * opens its own VkDevice with its own function table. */
#define _GNU_SOURCE /* strcasestr */
#include "vk_internal.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t g_inst_mu = PTHREAD_MUTEX_INITIALIZER;
static VkInstance g_inst;

const char *kvm_vk_result_str(VkResult r) {
    switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    default: return "VkResult error";
    }
}

/* The loader and one instance are created on first use and kept for the
 * life of the process: destroying the instance makes the loader unload the
 * driver, and drivers do not all unload cleanly (Debian 12's Mesa lavapipe
 * loses a block held by a driver global, which LeakSanitizer then reports
 * from an unloaded module). Keeping them also spares every later context
 * the driver's start. The plugin itself
 * is never unmapped (core/registry/plugin.h), so g_inst stays reachable. */
kvmem_status kvm_vk_instance_acquire(VkInstance *out, char *why, size_t why_size) {
    kvmem_status st = KVMEM_OK;
    pthread_mutex_lock(&g_inst_mu);
    if (g_inst == VK_NULL_HANDLE) {
        /* Our own dlopen (not volkInitialize) so the reason for a failure is
         * known; RTLD_NODELETE because the instance outlives every handle. */
        void *loader = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (!loader) {
            const char *e = dlerror();
            snprintf(why, why_size, "no Vulkan loader (libvulkan.so.1): %s", e ? e : "not found");
            st = KVMEM_ERR_UNSUPPORTED;
            goto out;
        }
        PFN_vkGetInstanceProcAddr gipa;
        *(void **)(&gipa) = dlsym(loader, "vkGetInstanceProcAddr");
        dlclose(loader); /* NODELETE: only the reference is dropped */
        if (!gipa) {
            snprintf(why, why_size, "no Vulkan loader: libvulkan.so.1 lacks vkGetInstanceProcAddr");
            st = KVMEM_ERR_UNSUPPORTED;
            goto out;
        }
        volkInitializeCustom(gipa);
        uint32_t api = volkGetInstanceVersion();
        if (api < VK_API_VERSION_1_1) {
            snprintf(why, why_size, "Vulkan loader too old: %u.%u, need 1.1", VK_VERSION_MAJOR(api),
                     VK_VERSION_MINOR(api));
            st = KVMEM_ERR_UNSUPPORTED;
            goto out;
        }
        VkApplicationInfo app = {VK_STRUCTURE_TYPE_APPLICATION_INFO, NULL, "kvmem", 1, "kvmem", 1,
                                 VK_API_VERSION_1_1};
        VkInstanceCreateInfo ci = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, NULL, 0, &app, 0, NULL, 0, NULL};
        VkResult r = vkCreateInstance(&ci, NULL, &g_inst);
        if (r != VK_SUCCESS) {
            g_inst = VK_NULL_HANDLE;
            snprintf(why, why_size, "no device: %s (vkCreateInstance: %s)",
                     r == VK_ERROR_INCOMPATIBLE_DRIVER ? "no Vulkan driver (ICD) installed" : "Vulkan failed to start",
                     kvm_vk_result_str(r));
            st = r == VK_ERROR_INCOMPATIBLE_DRIVER ? KVMEM_ERR_UNSUPPORTED : KVMEM_ERR_BACKEND;
            goto out;
        }
        volkLoadInstanceOnly(g_inst);
    }
    *out = g_inst;
out:
    pthread_mutex_unlock(&g_inst_mu);
    return st;
}

static const char *type_name(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    default: return "other";
    }
}

static int type_rank(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 4;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 3;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 1;
    default: return 0;
    }
}

/* A queue family with compute; prefers one with timestamps. UINT32_MAX if none. */
static uint32_t compute_family(VkPhysicalDevice pd, int *timestamps) {
    uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, NULL);
    VkQueueFamilyProperties q[32];
    if (n > 32) n = 32;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, q);
    uint32_t best = UINT32_MAX;
    for (uint32_t i = 0; i < n; i++) {
        if (!(q[i].queueFlags & VK_QUEUE_COMPUTE_BIT)) continue;
        if (best == UINT32_MAX || (q[i].timestampValidBits && !q[best].timestampValidBits)) best = i;
    }
    *timestamps = best != UINT32_MAX && q[best].timestampValidBits != 0;
    return best;
}

static int is_index(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}

/* Memory type with all `want` flags among those allowed by `bits`,
 * preferring ones that also have `prefer`. UINT32_MAX if none. */
static uint32_t mem_type(const VkPhysicalDeviceMemoryProperties *mp, uint32_t bits,
                         VkMemoryPropertyFlags want, VkMemoryPropertyFlags prefer) {
    uint32_t found = UINT32_MAX;
    for (uint32_t i = 0; i < mp->memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = mp->memoryTypes[i].propertyFlags;
        if (!(bits & (1u << i)) || (f & want) != want) continue;
        if ((f & prefer) == prefer) return i;
        if (found == UINT32_MAX) found = i;
    }
    return found;
}

kvmem_status kvm_vk_device_open(kvm_vk *v, VkInstance inst, char *why, size_t why_size) {
    uint32_t n = 0;
    VkResult r = vkEnumeratePhysicalDevices(inst, &n, NULL);
    if (r != VK_SUCCESS || n == 0) {
        snprintf(why, why_size, "no device: the Vulkan loader found no physical device%s%s",
                 r != VK_SUCCESS ? ": " : " (no driver installed, or no GPU exposed)",
                 r != VK_SUCCESS ? kvm_vk_result_str(r) : "");
        return KVMEM_ERR_UNSUPPORTED;
    }
    VkPhysicalDevice pds[16];
    if (n > 16) n = 16;
    r = vkEnumeratePhysicalDevices(inst, &n, pds);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) {
        snprintf(why, why_size, "no device: vkEnumeratePhysicalDevices failed (%s)", kvm_vk_result_str(r));
        return KVMEM_ERR_BACKEND;
    }
    const char *want = getenv("KVMEM_VULKAN_DEVICE");
    if (want && !*want) want = NULL;
    int chosen = -1, best_rank = -1;
    char listing[512] = "";
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(pds[i], &p);
        size_t len = strlen(listing);
        snprintf(listing + len, sizeof listing - len, "%s%u '%s'", i ? ", " : "", i, p.deviceName);
        int ts;
        if (compute_family(pds[i], &ts) == UINT32_MAX || p.apiVersion < VK_API_VERSION_1_1) continue;
        if (want) {
            if ((is_index(want) && strtoul(want, NULL, 10) == i) ||
                (!is_index(want) && strcasestr(p.deviceName, want))) {
                chosen = (int)i;
                break;
            }
        } else if (type_rank(p.deviceType) > best_rank) {
            best_rank = type_rank(p.deviceType);
            chosen = (int)i;
        }
    }
    if (chosen < 0) {
        if (want)
            snprintf(why, why_size, "no device: KVMEM_VULKAN_DEVICE='%.40s' matches no Vulkan 1.1 compute device among %s",
                     want, listing);
        else
            snprintf(why, why_size, "no device: no Vulkan 1.1 device with a compute queue among %s", listing);
        return KVMEM_ERR_UNSUPPORTED;
    }
    v->phys = pds[chosen];
    vkGetPhysicalDeviceProperties(v->phys, &v->props);
    vkGetPhysicalDeviceMemoryProperties(v->phys, &v->mem_props);
    {
        /* Vulkan 1.1 core: subgroup size and which operations compute shaders may use */
        VkPhysicalDeviceSubgroupProperties sg = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES, NULL, 0, 0, 0, 0};
        VkPhysicalDeviceProperties2 p2 = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &sg, {0}};
        vkGetPhysicalDeviceProperties2(v->phys, &p2);
        const VkSubgroupFeatureFlags need = VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_ARITHMETIC_BIT |
                                            VK_SUBGROUP_FEATURE_SHUFFLE_BIT | VK_SUBGROUP_FEATURE_BALLOT_BIT;
        v->subgroup_size = sg.subgroupSize;
        v->subgroup_ops = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) && (sg.supportedOperations & need) == need &&
                          sg.subgroupSize >= 4 && sg.subgroupSize <= KVM_VK_WG && getenv("KVMEM_VULKAN_NO_SUBGROUPS") == NULL;
    }
    int timestamps = 0;
    v->queue_family = compute_family(v->phys, &timestamps);
    timestamps = timestamps && v->props.limits.timestampPeriod > 0;

    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, NULL, 0, v->queue_family, 1, &prio};
    VkDeviceCreateInfo dci = {VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, NULL, 0, 1, &qci, 0, NULL, 0, NULL, NULL};
    r = vkCreateDevice(v->phys, &dci, NULL, &v->dev);
    if (r != VK_SUCCESS) {
        snprintf(why, why_size, "no device: vkCreateDevice on '%s' failed (%s)", v->props.deviceName,
                 kvm_vk_result_str(r));
        v->dev = VK_NULL_HANDLE;
        return KVMEM_ERR_BACKEND;
    }
    volkLoadDeviceTable(&v->vk, v->dev);
    v->vk.vkGetDeviceQueue(v->dev, v->queue_family, 0, &v->queue);

    /* Memory types are chosen against a probe buffer's requirements. */
    VkBufferCreateInfo bci = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, NULL, 0, 256,
                              VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                  VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                              VK_SHARING_MODE_EXCLUSIVE, 0, NULL};
    VkBuffer probe;
    r = v->vk.vkCreateBuffer(v->dev, &bci, NULL, &probe);
    if (r != VK_SUCCESS) {
        snprintf(why, why_size, "vkCreateBuffer failed (%s)", kvm_vk_result_str(r));
        return KVMEM_ERR_BACKEND;
    }
    VkMemoryRequirements req;
    v->vk.vkGetBufferMemoryRequirements(v->dev, probe, &req);
    v->vk.vkDestroyBuffer(v->dev, probe, NULL);
    const VkMemoryPropertyFlags hv = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    v->device_mem_type = mem_type(&v->mem_props, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, hv);
    if (v->device_mem_type == UINT32_MAX) v->device_mem_type = mem_type(&v->mem_props, req.memoryTypeBits, 0, 0);
    v->staging_mem_type = mem_type(&v->mem_props, req.memoryTypeBits, hv, VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
    if (v->device_mem_type == UINT32_MAX || v->staging_mem_type == UINT32_MAX) {
        snprintf(why, why_size, "no device: '%s' has no usable memory type for storage buffers",
                 v->props.deviceName);
        return KVMEM_ERR_UNSUPPORTED;
    }
    VkMemoryPropertyFlags df = v->mem_props.memoryTypes[v->device_mem_type].propertyFlags;
    const char *fs = getenv("KVMEM_VULKAN_STAGING");
    v->force_staging = fs && strcmp(fs, "1") == 0;
    v->device_mem_mapped = (df & hv) == hv && !v->force_staging;

    VkCommandPoolCreateInfo pci = {VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, NULL,
                                   VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, v->queue_family};
    VkFenceCreateInfo fci = {VK_STRUCTURE_TYPE_FENCE_CREATE_INFO, NULL, 0};
    VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 16 * KVM_VK_MAX_BINDINGS};
    VkDescriptorPoolCreateInfo dpci = {VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, NULL, 0, 16, 1, &ps};
    if ((r = v->vk.vkCreateCommandPool(v->dev, &pci, NULL, &v->cmd_pool)) != VK_SUCCESS ||
        (r = v->vk.vkCreateFence(v->dev, &fci, NULL, &v->fence)) != VK_SUCCESS ||
        (r = v->vk.vkCreateDescriptorPool(v->dev, &dpci, NULL, &v->desc_pool)) != VK_SUCCESS) {
        snprintf(why, why_size, "Vulkan device setup failed (%s)", kvm_vk_result_str(r));
        return KVMEM_ERR_BACKEND;
    }
    VkCommandBufferAllocateInfo cai = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, NULL, v->cmd_pool,
                                       VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1};
    if ((r = v->vk.vkAllocateCommandBuffers(v->dev, &cai, &v->cmd)) != VK_SUCCESS) {
        snprintf(why, why_size, "vkAllocateCommandBuffers failed (%s)", kvm_vk_result_str(r));
        return KVMEM_ERR_BACKEND;
    }
    v->query_pool = VK_NULL_HANDLE;
    if (timestamps) {
        VkQueryPoolCreateInfo qpci = {VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, NULL, 0, VK_QUERY_TYPE_TIMESTAMP, 2, 0};
        if (v->vk.vkCreateQueryPool(v->dev, &qpci, NULL, &v->query_pool) != VK_SUCCESS)
            v->query_pool = VK_NULL_HANDLE; /* timing is optional */
    }
    v->last_op_seconds = -1;
    snprintf(v->detail, sizeof v->detail, "%.120s (%s, Vulkan %u.%u.%u, device %d of %u)%s%s",
             v->props.deviceName, type_name(v->props.deviceType), VK_VERSION_MAJOR(v->props.apiVersion),
             VK_VERSION_MINOR(v->props.apiVersion), VK_VERSION_PATCH(v->props.apiVersion), chosen, n,
             v->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? ": a CPU device, \"auto\" keeps cpu" : "",
             v->device_mem_mapped ? "" : ", staged transfers");
    return KVMEM_OK;
}

void kvm_vk_device_close(kvm_vk *v) {
    if (!v->dev) return;
    v->vk.vkDeviceWaitIdle(v->dev);
    kvm_vk_pipelines_destroy(v);
    if (v->staging) kvm_vk_buffer_destroy(v, v->staging);
    v->staging = NULL;
    if (v->query_pool) v->vk.vkDestroyQueryPool(v->dev, v->query_pool, NULL);
    if (v->desc_pool) v->vk.vkDestroyDescriptorPool(v->dev, v->desc_pool, NULL);
    if (v->fence) v->vk.vkDestroyFence(v->dev, v->fence, NULL);
    if (v->cmd_pool) v->vk.vkDestroyCommandPool(v->dev, v->cmd_pool, NULL);
    v->vk.vkDestroyDevice(v->dev, NULL);
    v->dev = VK_NULL_HANDLE;
}
