/* The context object (internal layout). */
#ifndef KVMEM_CONTEXT_H
#define KVMEM_CONTEXT_H

#include "backend.h"
#include "cpu/threadpool.h"

struct kvmem_context {
    char backend_name[16];
    int n_threads;
    kvm_threadpool *tp;
    kvmem_backend *cpu;     /* always present: host work and the reference */
    kvmem_backend *backend; /* the chosen one (== cpu for "cpu") */
};

/* Try to load the plugin for `name` ("cuda", "vulkan"); on failure write the
 * reason into why. Plugins stay loaded once opened (registry/plugin.h). */
kvmem_status kvm_plugin_load(kvmem_context *ctx, const char *name, kvmem_backend **out, char *why,
                             size_t why_size);

#endif
