/* The Vulkan backend's internal state, shared by its source files.
 * Vulkan is reached through volk: instance-level entry points are volk's
 * globals (loader trampolines, valid for every instance), device-level ones
 * come from a per-device VolkDeviceTable, so two contexts on two different
 * drivers never call each other's functions. */
#ifndef KVMEM_VK_INTERNAL_H
#define KVMEM_VK_INTERNAL_H

#include "backend.h"

#include <pthread.h>
#include <volk.h>

#define KVM_VK_WG 128u /* workgroup size of every shader (common.glsl) */
#define KVM_VK_MAX_BINDINGS 12u /* storage buffers a kernel binds at most (attend: 11) */

/* Loop iterations one shader invocation may run in one dispatch. Mesa's
 * llvmpipe (lavapipe, which the tests run on) counts the iterations of all
 * the loops of an invocation against one shared limit of 65535
 * (LP_MAX_TGSI_LOOP_ITERATIONS) and, past it, ends every loop after one
 * iteration, with no error; and as soon as the first SIMD batch of a
 * workgroup returns, it abandons the others, which never write. A kernel
 * whose loops grow with the input (attention over a long history) splits
 * its work into dispatches that stay within this budget, a quarter of that
 * limit; short dispatches also keep a GPU's watchdog away.
 * KVMEM_VULKAN_LOOP_BUDGET lowers it (tests use it to reach many dispatches
 * on small inputs). */
#define KVM_VK_LOOP_BUDGET 16384u

/* Pipelines, one per shader; created on first use. */
typedef enum kvm_vk_kernel {
    KVM_VK_AABB_SCORE,
    KVM_VK_GATHER_ROPE,
    /* -- retrieval (dev_score, dev_topk, dev_score_reduce) -- */
    KVM_VK_SCORE_REDUCE,
    KVM_VK_SCORE_REDUCE_SG, /* subgroup variant */
    KVM_VK_TOPK,
    KVM_VK_SCORE_SETS, /* dev_score_reduce */
    KVM_VK_EXACT_SCORE, /* dev_score's EXACT relevance from key rows */

    /* -- eviction (dev_qmem_score) -- */
    KVM_VK_QMEM_SCORE,
    KVM_VK_QMEM_SCORE_SG,

    /* -- attention (dev_attend) -- */
    KVM_VK_ATTEND,
    KVM_VK_ATTEND_SG, /* the probe reduced with subgroup operations */
    KVM_VK_TILE_ORDER, /* the scored form's per-stream orders */

    KVM_VK_N_KERNELS
} kvm_vk_kernel;

typedef struct kvm_vk_pipeline {
    VkDescriptorSetLayout dsl;
    VkPipelineLayout layout;
    VkPipeline pipe;
    uint32_t n_bindings;
} kvm_vk_pipeline;

struct kvmem_buffer {
    VkBuffer buf;
    VkDeviceMemory mem;
    size_t size;     /* what the caller asked for */
    VkDeviceSize cap; /* allocated: size rounded up to whole words, at least 4 */
    void *map;       /* persistent mapping when host-visible and coherent, else NULL */
    int borrowed;    /* a caller's VkBuffer (a device tensor): destroying frees only this struct */
};

typedef struct kvm_vk {
    VkInstance inst; /* the process-wide instance (vk_device.c) */
    VkPhysicalDevice phys;
    VkDevice dev;
    struct VolkDeviceTable vk;
    VkQueue queue;
    uint32_t queue_family;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties mem_props;
    uint32_t device_mem_type;  /* for kvmem buffers */
    int device_mem_mapped;     /* that type is host-visible and coherent */
    uint32_t staging_mem_type; /* host-visible, coherent */
    int force_staging;         /* KVMEM_VULKAN_STAGING=1: never map device buffers */
    /* Subgroups: size, and whether compute shaders have basic, arithmetic,
     * shuffle and ballot operations (then kernels with a "_sg" variant use
     * it; KVMEM_VULKAN_NO_SUBGROUPS=1 forces the shared-memory variants). */
    uint32_t subgroup_size;
    int subgroup_ops;

    pthread_mutex_t mu; /* one op at a time on the queue, command buffer, staging */
    VkCommandPool cmd_pool;
    VkCommandBuffer cmd;
    VkFence fence;
    VkDescriptorPool desc_pool;
    VkQueryPool query_pool; /* two timestamps per submission; VK_NULL_HANDLE if none */
    double last_op_seconds; /* device time of the last op, -1 when unknown */

    kvmem_buffer *staging; /* grows on demand */
    kvm_vk_pipeline pipes[KVM_VK_N_KERNELS];

    char detail[256];
    kvmem_backend *be; /* owner: be->fail reports messages */
} kvm_vk;

/* Report a failure through the core's kvm_fail (be->fail) when the core has
 * set it, and return status. */
kvmem_status kvm_vk_fail(const kvm_vk *v, kvmem_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---- vk_device.c ---- */
/* The process-wide VkInstance, created on first use and kept for the life of
 * the process (see vk_device.c). Writes a plain reason on failure. */
kvmem_status kvm_vk_instance_acquire(VkInstance *out, char *why, size_t why_size);
/* Choose the physical device (KVMEM_VULKAN_DEVICE: index or name substring),
 * create the logical device, queue, pools. */
kvmem_status kvm_vk_device_open(kvm_vk *v, VkInstance inst, char *why, size_t why_size);
void kvm_vk_device_close(kvm_vk *v);

/* ---- vk_mem.c ---- */
kvmem_status kvm_vk_buffer_create(kvm_vk *v, size_t size, int device, kvmem_buffer **out);
void kvm_vk_buffer_destroy(kvm_vk *v, kvmem_buffer *b);
kvmem_status kvm_vk_upload(kvm_vk *v, kvmem_buffer *dst, size_t off, const void *src, size_t n);
kvmem_status kvm_vk_download(kvm_vk *v, const kvmem_buffer *src, size_t off, void *dst, size_t n);
/* A caller's VkBuffer of mem->size bytes as a borrowed buffer (device tensors). */
kvmem_status kvm_vk_buffer_wrap(kvm_vk *v, const kvmem_device_memory *mem, kvmem_buffer **out);

/* ---- vk_exec.c ---- */
/* Begin recording into v->cmd (v->mu held by the caller). */
VkResult kvm_vk_begin(kvm_vk *v);
/* End, submit, wait; records the device time between begin and end when
 * timed is set. */
VkResult kvm_vk_submit_wait(kvm_vk *v, int timed);
/* Record one dispatch of kernel k over `items` work items (grid-stride
 * loops in the shaders: the group count is capped), buffers bound in order. */
VkResult kvm_vk_record_dispatch(kvm_vk *v, kvm_vk_kernel k, const kvmem_buffer *const *bufs,
                                uint32_t n_bufs, const void *push, uint32_t push_size,
                                uint64_t items);
/* The same with an explicit 3-D group count (tiled kernels). */
VkResult kvm_vk_record_dispatch3(kvm_vk *v, kvm_vk_kernel k, const kvmem_buffer *const *bufs, uint32_t n_bufs,
                                 const void *push, uint32_t push_size, uint32_t gx, uint32_t gy, uint32_t gz);
/* Bind kernel k's pipeline and one descriptor set holding bufs, in order
 * (one of the pool's sets until the submission is waited for). */
VkResult kvm_vk_bind(kvm_vk *v, kvm_vk_kernel k, const kvmem_buffer *const *bufs, uint32_t n_bufs,
                     uint32_t push_size);
/* Record one dispatch of the bound kernel k with these push constants, then
 * a barrier: a kernel that runs many dispatches on one set (to stay within
 * the loop budget) binds once and dispatches many times. */
VkResult kvm_vk_dispatch(kvm_vk *v, kvm_vk_kernel k, const void *push, uint32_t push_size, uint32_t gx, uint32_t gy,
                         uint32_t gz);
/* KVM_VK_LOOP_BUDGET, or KVMEM_VULKAN_LOOP_BUDGET when set lower. */
uint32_t kvm_vk_loop_budget(void);
/* Run one recorded dispatch as a timed submission: takes v->mu, checks
 * buffer ranges against the device limit; op names the op in messages. */
kvmem_status kvm_vk_run(kvm_vk *v, const char *op, kvm_vk_kernel k, const kvmem_buffer *const *bufs,
                        uint32_t n_bufs, const void *push, uint32_t push_size, uint64_t items, const uint32_t *groups3);
/* Standalone kernels reached through get_proc_address (vk_retrieval.c). */
void *kvm_vk_retrieval_proc(const char *name);

/* ---- table entries, one source file per group ---- */
/* -- retrieval (vk_retrieval.c) -- */
kvmem_status kvm_vk_dev_score(kvmem_backend *be, const kvm_dev_score_args *a);
kvmem_status kvm_vk_dev_score_reduce(kvmem_backend *be, const kvm_dev_score_reduce_args *a);
kvmem_status kvm_vk_dev_topk(kvmem_backend *be, const kvm_dev_topk_args *a);
kvmem_status kvm_vk_dev_gather_rope(kvmem_backend *be, const kvm_dev_gather_args *a);

/* -- eviction (vk_qmem.c) -- */
kvmem_status kvm_vk_dev_qmem_score(kvmem_backend *be, const struct kvm_dev_qmem_args *a);

/* -- attention (vk_attend.c) -- */
kvmem_status kvm_vk_dev_attend(kvmem_backend *be, const struct kvm_dev_attend_args *a);

/* Free pipelines. */
void kvm_vk_pipelines_destroy(kvm_vk *v);
/* Barrier: compute or transfer writes visible to later compute/transfer/host. */
void kvm_vk_barrier(kvm_vk *v);

const char *kvm_vk_result_str(VkResult r);

#endif
