/* The router: which backend runs an op, by one policy for every op, and the
 * staging of host memory onto that backend, written once.
 *
 * Policy (ggml's supports_op is the model):
 *  - On a context whose backend is a device, an op runs there when the
 *    device's table has the op's entries, the op is in the buffer-level form
 *    a device takes (the host-side forms of core/backend/backend.h are the
 *    CPU backend's), and the device's supports_op (where it has one) takes
 *    its arguments. Otherwise it runs on the context's CPU backend.
 *  - A device that took an op and then answers KVMEM_ERR_UNSUPPORTED (a
 *    limit only the run could see) hands it to the CPU backend, as if it had
 *    refused it up front. Every other failure is the call's status, with the
 *    backend's message: a device error is reported, never hidden behind a
 *    silent CPU run.
 * The CPU backend takes every form of every op on memory the core already
 * holds (views: no copy); a device gets transient buffers, uploaded before
 * and read back after the run (kvm_stage_*), or the buffers an agent keeps
 * resident there. The five places that run an op on some backend
 * (retrieval's scoring, gather, attention, the rule score, and the
 * context's choice of backend) decide through here. */
#ifndef KVMEM_BACKEND_ROUTE_H
#define KVMEM_BACKEND_ROUTE_H

#include "context.h"
#include "../../cpu/cpu_backend.h" /* struct kvmem_buffer: the CPU's views */

/* The backend that runs `op` with these arguments on ctx (args: the op's
 * argument struct as the device would get it; its buffers may still be
 * NULL, only the shapes and forms are read): ctx's device backend or its
 * CPU backend, by the policy above. */
kvmem_backend *kvm_route(const kvmem_context *ctx, kvm_op op, const void *args);

/* Whether a device's status st hands the op to the CPU backend. */
static inline int kvm_route_to_cpu(kvmem_status st) { return st == KVMEM_ERR_UNSUPPORTED; }

/* The backend plugins the registry knows, in the order "auto" tries them. */
#define KVM_ROUTE_N_PLUGINS 2
extern const char *const kvm_route_plugins[KVM_ROUTE_N_PLUGINS];

/* Try to load the plugin for `name` ("cuda", "vulkan"); on failure write the
 * reason into why. Plugins stay loaded once opened (registry/plugin.h). */
kvmem_status kvm_plugin_load(kvmem_context *ctx, const char *name, kvmem_backend **out, char *why,
                             size_t why_size);

/* The backend a new context uses for `name` ("cpu", "auto", "cuda",
 * "vulkan"): *out = ctx->cpu or a loaded plugin; "auto" takes the first
 * plugin that loads whose device is not a CPU (a CPU emulating a GPU loses
 * to the native CPU backend) and else the CPU backend, an explicit name
 * that plugin or KVMEM_ERR_UNSUPPORTED with the reason in why. */
kvmem_status kvm_route_context_backend(kvmem_context *ctx, const char *name, kvmem_backend **out, char *why,
                                       size_t why_size);

/* ---- staging ---- */

/* One piece of host memory an op reads (IN), writes (OUT) or neither
 * (WORK: backend memory only), or a buffer already on the backend
 * (resident). */
typedef enum kvm_stage_dir { KVM_STAGE_IN, KVM_STAGE_OUT, KVM_STAGE_WORK } kvm_stage_dir;
typedef struct kvm_stage {
    kvm_stage_dir dir;
    void *host;              /* IN: read, OUT: written after the run (NULL for WORK) */
    size_t bytes;
    kvmem_buffer *resident;  /* used as is when set (host and bytes unused) */
    kvmem_buffer *buf;       /* set by kvm_stage_begin: the buffer the op gets */
    kvmem_buffer view;       /* the CPU backend's view of host */
} kvm_stage;

/* Put the n pieces on be: the CPU backend views the host memory in place;
 * a device allocates each and uploads the IN ones (counted in the context's
 * transfer totals). On failure everything taken is freed and the status
 * carries the backend's message, prefixed with op and the backend's name. */
kvmem_status kvm_stage_begin(kvmem_backend *be, const char *op, kvm_stage *s, int n);
/* After the run (status st): read the OUT pieces back when st is OK (a
 * device's; the CPU's wrote in place), then free what begin allocated.
 * Returns st, or the read-back's failure. */
kvmem_status kvm_stage_end(kvmem_backend *be, const char *op, kvm_stage *s, int n, kvmem_status st);

/* A device op's failure as the call's: the backend's message prefixed with
 * op and the backend's name (KVMEM_ERR_UNSUPPORTED keeps its own). */
kvmem_status kvm_route_failed(kvmem_backend *be, const char *op, kvmem_status st);

#endif
