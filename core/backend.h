/* The backend interface (internal). A backend is a table of function pointers
 * plus its own context, in the manner of ggml-backend: the CPU backend fills
 * every entry and is the reference; CUDA and Vulkan are plugins loaded with
 * dlopen that export one init symbol and are checked for the exact
 * KVMEM_BACKEND_API_VERSION. Entries marked (optional) may be NULL; the core
 * then runs that op on the CPU backend.
 *
 * Buffers: backend memory is reached through kvmem_buffer handles plus byte
 * offsets, never raw device pointers, so Vulkan (VkBuffer) and CUDA (device
 * pointers) fit the same table. For the CPU backend a buffer is host memory. */
#ifndef KVMEM_BACKEND_H
#define KVMEM_BACKEND_H

#include "kvmem.h"

#include <stddef.h>
#include <stdint.h>

/* 2: struct kvmem_backend gained fail, detail and cpu_device (Vulkan issue) */
#define KVMEM_BACKEND_API_VERSION 2u

typedef struct kvmem_backend kvmem_backend;
typedef struct kvmem_buffer kvmem_buffer;
struct kvm_attend_plan; /* core/attend/attend.h */

/* Descriptors of the retrieval ops (core/retrieve/score.h). */
struct kvm_score_desc;
struct kvm_gather_desc;

typedef struct kvmem_backend_iface {
    const char *name;
    void (*free)(kvmem_backend *be);

    /* ---- buffers ---- */
    kvmem_status (*buffer_alloc)(kvmem_backend *be, size_t size, kvmem_buffer **out);
    void (*buffer_free)(kvmem_backend *be, kvmem_buffer *buf);
    kvmem_status (*buffer_upload)(kvmem_backend *be, kvmem_buffer *dst, size_t offset,
                                  const void *src, size_t size);
    kvmem_status (*buffer_download)(kvmem_backend *be, const kvmem_buffer *src, size_t offset,
                                    void *dst, size_t size);
    /* (optional) host address of a buffer, NULL when not host-visible */
    void *(*buffer_host_ptr)(kvmem_backend *be, kvmem_buffer *buf);
    kvmem_status (*synchronize)(kvmem_backend *be);

    /* ---- ops ---- */
    /* Convert n elements between F32/F16/BF16. */
    kvmem_status (*convert)(kvmem_backend *be, kvmem_buffer *dst, size_t dst_off,
                            kvmem_dtype dst_dtype, const kvmem_buffer *src, size_t src_off,
                            kvmem_dtype src_dtype, size_t n);
    /* AABB of n_groups groups of n_rows f32 rows of `dim` (group g's rows at
     * keys + g*group_stride, rows `dim` apart): out_min/out_max [n_groups][dim]. */
    kvmem_status (*aabb_build)(kvmem_backend *be, const kvmem_buffer *keys, size_t keys_off,
                               size_t n_groups, size_t group_stride, size_t n_rows, size_t dim,
                               kvmem_buffer *out_min, kvmem_buffer *out_max, size_t out_off);
    /* ---- ops added by later issues, each in its own section ---- */

    /* -- retrieval (MemArt): aabb_score, topk, gather/rope -- */
    /* Score candidate blocks (AABB or EXACT), normalise per query token,
     * aggregate over tokens, sum over each KV head's query heads. */
    kvmem_status (*aabb_score)(kvmem_backend *be, const struct kvm_score_desc *d);
    /* Indices of the k largest non-NaN scores, ties toward the lower index. */
    kvmem_status (*topk)(kvmem_backend *be, const float *score, int32_t n, int32_t k, int32_t *out_idx,
                         int32_t *n_out);
    /* Concatenate blocks, rotate keys at new positions, convert to the output dtype. */
    kvmem_status (*gather)(kvmem_backend *be, const struct kvm_gather_desc *d);

    /* -- eviction (IntentKV): qmem_score, kv_copy -- */
    /* Rule score of kvmem_qmem_score (inputs validated by the core): memory
     * [n_layers][n_q_heads][head_dim] f32 host memory, k a host view
     * [n_layers][N][n_kv_heads][head_dim], scores N floats. Host views, not
     * buffers: the CPU reference reads the caller's tensors in place; a
     * device backend would upload them (optional: NULL = run on the CPU). */
    kvmem_status (*qmem_score)(kvmem_backend *be, const kvmem_model_spec *spec, const float *memory,
                               const kvmem_tensor *k, float *scores);

    /* -- attention (ART): attend -- */
    /* Run a validated ART plan (core/attend/attend.h): fill plan->out
     * [n_rows][n_q_heads][head_dim] f32 and *stats. (optional) NULL: the
     * core runs it on the CPU backend. */
    kvmem_status (*attend)(kvmem_backend *be, const struct kvm_attend_plan *plan,
                           kvmem_attend_stats *stats);

    /* -- persistence: quantize, dequantize -- */
    /* Encode n rows of `dim` f32 values into one storage section (layout and
     * error bounds in core/quant/quant.h) of dtype Q8, Q4 or Q4_KIVI; which: 0
     * keys (KIVI: per-channel groups over the n rows), 1 values. */
    kvmem_status (*quantize)(kvmem_backend *be, kvmem_dtype dtype, int which, const kvmem_buffer *src,
                             size_t src_off, size_t n, size_t dim, kvmem_buffer *dst, size_t dst_off);
    /* Decode rows [row0, row0 + cnt) of a section of n rows into f32. */
    kvmem_status (*dequantize)(kvmem_backend *be, kvmem_dtype dtype, int which, const kvmem_buffer *src,
                               size_t src_off, size_t n, size_t dim, size_t row0, size_t cnt,
                               kvmem_buffer *dst, size_t dst_off);


    /* (optional) escape hatch for entries a newer core knows and an older
     * backend does not: returns NULL for unknown names. */
    void *(*get_proc_address)(kvmem_backend *be, const char *name);
} kvmem_backend_iface;

struct kvmem_backend {
    const kvmem_backend_iface *iface;
    void *impl;          /* the backend's own state */
    kvmem_context *ctx;  /* owning context */
    /* -- plugin services (Vulkan issue) -- */
    /* Set by the core's loader right after a plugin's init: a plugin cannot
     * link the core's hidden kvm_fail, so its ops report messages for
     * kvmem_last_error() through this pointer. NULL inside init. */
    kvmem_status (*fail)(kvmem_status status, const char *fmt, ...);
    /* (optional, set by the plugin) what it runs on, shown by kvmem_backends()
     * ("llvmpipe (LLVM 15.0.6, 256 bits), Vulkan 1.3"); owned by the backend. */
    const char *detail;
    /* Set by the plugin when its device is a CPU (Mesa lavapipe, SwiftShader):
     * "auto" then keeps the native CPU backend, which is faster than a CPU
     * emulating a GPU. Explicit requests ("vulkan") still get it. */
    int cpu_device;
};

/* -- device timing (Vulkan issue) -- */
/* get_proc_address(be, KVM_PROC_LAST_OP_SECONDS) returns a kvm_last_op_seconds_fn
 * (or NULL): device time of the backend's last op, from GPU timestamps
 * (negative when the device has no timestamps). Used by benchmarks. */
#define KVM_PROC_LAST_OP_SECONDS "last_op_seconds"
typedef double (*kvm_last_op_seconds_fn)(kvmem_backend *be);

/* The symbol every backend plugin exports. It fills *out or writes a plain
 * reason ("no device", "driver too old") into why and returns an error. */
#define KVMEM_BACKEND_PLUGIN_INIT "kvmem_backend_plugin_init"
typedef kvmem_status (*kvmem_backend_plugin_init_fn)(uint32_t api_version, kvmem_context *ctx,
                                                      kvmem_backend **out, char *why,
                                                      size_t why_size);

/* The CPU backend (always built). */
kvmem_status kvm_cpu_backend_create(kvmem_context *ctx, kvmem_backend **out);

#endif
