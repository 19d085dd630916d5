/* Store selection: a directory path (the default store) or a URL whose
 * scheme names a store plugin. Plugins are shared libraries loaded with
 * dlopen, like the backends, so libkvmem itself never links a client
 * library (hiredis): it stays libc/libm/pthreads only. */
#define _GNU_SOURCE /* dladdr */
#include "store.h"
#include "../internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__unix__) && !defined(__EMSCRIPTEN__)
#  define KVM_STORE_DLOPEN 1
#  include <dlfcn.h>
#  include <pthread.h>
#endif

#ifndef KVMEM_STORE_REDIS_BUILT
#  define KVMEM_STORE_REDIS_BUILT 0
#endif

int kvm_store_is_url(const char *spec) {
    return spec && (strncmp(spec, "redis://", 8) == 0 || strncmp(spec, "unix://", 7) == 0);
}

#ifdef KVM_STORE_DLOPEN
static const char k_store_anchor = 0;

/* Looked up in KVMEM_BACKEND_PATH, beside libkvmem (or the program that
 * links it statically), then by the dynamic loader's own search. */
static void *open_store_plugin(const char *file, char *why, size_t why_size) {
    char path[4096];
    const char *env = getenv("KVMEM_BACKEND_PATH");
    if (env && *env) {
        snprintf(path, sizeof path, "%s/%s", env, file);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
    }
    Dl_info info;
    if (dladdr(&k_store_anchor, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash) {
            snprintf(path, sizeof path, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname, file);
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (h) return h;
        }
    }
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, why_size, "%s", e ? e : "not found");
    }
    return h;
}

/* The plugin stays loaded for the life of the process: stores created from
 * it may still be alive anywhere, and dlclose would unmap their code. */
static pthread_mutex_t g_redis_mu = PTHREAD_MUTEX_INITIALIZER;
static kvm_store_plugin_init_fn g_redis_init;
#endif

static const kvm_store_host k_host = {kvm_fail};

kvmem_status kvm_store_open(const char *spec, kvm_store **out) {
    if (!kvm_store_is_url(spec)) return kvm_dir_store_create(spec, out);
#ifdef KVM_STORE_DLOPEN
    char why[512] = "";
    pthread_mutex_lock(&g_redis_mu);
    if (!g_redis_init) {
        void *h = open_store_plugin("libkvmem-redis.so", why, sizeof why);
        if (h) {
            *(void **)(&g_redis_init) = dlsym(h, KVM_STORE_PLUGIN_INIT);
            if (!g_redis_init) {
                snprintf(why, sizeof why, "libkvmem-redis.so has no %s symbol", KVM_STORE_PLUGIN_INIT);
                dlclose(h);
            }
        }
    }
    kvm_store_plugin_init_fn init = g_redis_init;
    pthread_mutex_unlock(&g_redis_mu);
    if (!init) {
        if (!KVMEM_STORE_REDIS_BUILT)
            return kvm_fail(KVMEM_ERR_UNSUPPORTED, "redis store: not built (libhiredis-dev not found)");
        return kvm_fail(KVMEM_ERR_UNSUPPORTED, "redis store: plugin libkvmem-redis.so not loadable: %s", why);
    }
    return init(KVM_STORE_PLUGIN_API, &k_host, spec, out);
#else
    return kvm_fail(KVMEM_ERR_UNSUPPORTED, "redis store: this build cannot load plugins");
#endif
}
