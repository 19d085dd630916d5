/* Store selection: a directory path (the default store) or a URL whose
 * scheme names a store plugin. Plugins are shared libraries loaded with
 * dlopen, like the backends, so libkvmem itself never links a client
 * library (hiredis): it stays libc/libm/pthreads only. */
#include "store.h"
#include "../alloc.h"
#include "../internal.h"
#include "../registry/plugin.h"

#include <stdio.h>
#include <string.h>

#ifndef KVMEM_STORE_REDIS_BUILT
#  define KVMEM_STORE_REDIS_BUILT 0
#endif

int kvm_store_is_url(const char *spec) {
    return spec && (strncmp(spec, "redis://", 8) == 0 || strncmp(spec, "unix://", 7) == 0);
}

/* The plugin allocates through the core's allocator (inline wrappers here,
 * so function pointers to them). */
static void *host_malloc(size_t size, const char *site) { return kvm_malloc_at(size, site); }
static void *host_calloc(size_t n, size_t size, const char *site) { return kvm_calloc_at(n, size, site); }
static void *host_realloc(void *p, size_t size, const char *site) { return kvm_realloc_at(p, size, site); }
static void host_free(void *p) { kvm_free(p); }
static const kvm_store_host k_host = {kvm_fail, host_malloc, host_calloc, host_realloc, host_free};

kvmem_status kvm_store_open(const char *spec, kvm_store **out) {
    if (!kvm_store_is_url(spec)) return kvm_dir_store_create(spec, out);
    char why[512] = "";
    kvm_store_plugin_init_fn init;
    *(void **)(&init) = kvm_plugin_symbol("redis", KVM_STORE_PLUGIN_INIT, why, sizeof why);
    if (!init) {
        if (!KVMEM_STORE_REDIS_BUILT)
            return kvm_fail(KVMEM_ERR_UNSUPPORTED, "redis store: not built (libhiredis-dev not found)");
        return kvm_fail(KVMEM_ERR_UNSUPPORTED, "redis store: plugin libkvmem-redis.so not loadable: %s", why);
    }
    return init(KVM_STORE_PLUGIN_API, &k_host, spec, out);
}
