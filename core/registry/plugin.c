/* Plugin registry: finds, opens and keeps backend and store plugins. */
#define _GNU_SOURCE /* dladdr, RTLD_NODELETE */
#include "plugin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__unix__) && !defined(__EMSCRIPTEN__)
#  include <dlfcn.h>

/* Any object inside libkvmem: dladdr on it finds the library's own path. */
static const char k_anchor = 0;

static void *open_at(const char *dir, int dir_len, const char *file) {
    char path[4096];
    int n = snprintf(path, sizeof path, "%.*s/%s", dir_len, dir, file);
    if (n < 0 || (size_t)n >= sizeof path) return NULL;
    return dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
}

static void *open_plugin(const char *file, char *why, size_t why_size) {
    const char *env = getenv("KVMEM_BACKEND_PATH");
    if (env && *env) {
        void *h = open_at(env, (int)strlen(env), file);
        if (h) return h;
    }
    Dl_info info;
    if (dladdr(&k_anchor, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash) {
            void *h = open_at(info.dli_fname, (int)(slash - info.dli_fname), file);
            if (h) return h;
        }
    }
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, why_size, "%s", e ? e : "not found");
    }
    return h;
}

void *kvm_plugin_symbol(const char *name, const char *symbol, char *why, size_t why_size) {
    char file[64];
    snprintf(file, sizeof file, "libkvmem-%s.so", name);
    void *h = open_plugin(file, why, why_size);
    if (!h) return NULL;
    void *sym = dlsym(h, symbol);
    if (!sym) snprintf(why, why_size, "%s has no %s symbol", file, symbol);
    /* Balances this dlopen's reference; RTLD_NODELETE keeps the code mapped. */
    dlclose(h);
    return sym;
}
#else
void *kvm_plugin_symbol(const char *name, const char *symbol, char *why, size_t why_size) {
    (void)symbol;
    snprintf(why, why_size, "%s: this build cannot load plugins", name);
    return NULL;
}
#endif
