/* Contexts and the backend registry. */
#include "context.h"
#include "route.h"
#include "../../internal.h"
#include "../../cpu/cpu_backend.h"
#include "../../cpu/kernels.h"
#include "../../registry/plugin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

kvm_scratch *kvm_ctx_scratch(const kvmem_context *ctx) { return ctx && ctx->cpu ? kvm_cpu_backend_scratch(ctx->cpu) : NULL; }

/* ---- kvmem_backends ---- */

#include <pthread.h>

/* Detail strings live in static storage (the ABI promises static strings);
 * the lock keeps concurrent callers from writing them at the same time. */
static pthread_mutex_t g_backends_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_cpu_detail[96];
static char g_plugin_detail[2][256];

static void fill_cpu_detail(void) {
    const kvm_cpu_kernels *k = kvm_cpu_kernels_get();
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(g_cpu_detail, sizeof g_cpu_detail, "host CPU, %s kernels, %ld cores", k->name,
             n > 0 ? n : 1);
}

kvmem_status kvmem_backends(kvmem_backend_info *out, size_t capacity, size_t *count) {
    if (!count) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_backends: count is NULL");
    if (capacity > 0 && !out)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_backends: out is NULL with capacity %zu", capacity);
    size_t total = 1 + sizeof kvm_route_plugins / sizeof kvm_route_plugins[0];
    *count = total;
    if (capacity == 0) return KVMEM_OK;
    pthread_mutex_lock(&g_backends_mu);
    fill_cpu_detail();
    out[0].name = "cpu";
    out[0].available = 1;
    out[0].detail = g_cpu_detail;
    for (size_t i = 0; i < total - 1 && i + 1 < capacity; i++) {
        kvmem_backend_info *bi = &out[i + 1];
        bi->name = kvm_route_plugins[i];
        char why[256] = {0};
        kvmem_backend *be = NULL;
        /* Probing means initialising: a plugin can only say it has a device
         * by looking for one. The probe context is minimal and discarded. */
        kvmem_context probe;
        memset(&probe, 0, sizeof probe);
        probe.n_threads = 1;
        if (kvm_plugin_load(&probe, kvm_route_plugins[i], &be, why, sizeof why) == KVMEM_OK) {
            bi->available = 1;
            snprintf(g_plugin_detail[i], sizeof g_plugin_detail[i], "%s",
                     be->detail ? be->detail : be->iface->name);
            be->iface->free(be);
        } else {
            bi->available = 0;
            snprintf(g_plugin_detail[i], sizeof g_plugin_detail[i], "%s", why);
        }
        bi->detail = g_plugin_detail[i];
    }
    pthread_mutex_unlock(&g_backends_mu);
    return KVMEM_OK;
}

/* ---- contexts ---- */

kvmem_status kvmem_context_params_init(kvmem_context_params *params, size_t struct_size) {
    kvmem_context_params p;
    memset(&p, 0, sizeof p);
    p.backend = "auto";
    p.n_threads = 0;
    return KVM_PARAMS_INIT(kvmem_context_params, params, struct_size, &p, "kvmem_context_params_init");
}

kvmem_status kvmem_context_create(const kvmem_context_params *params, kvmem_context **out) {
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_context_create: out is NULL");
    *out = NULL;
    kvmem_context_params p = kvmem_context_default_params();
    kvmem_status st = KVM_PARAMS_IN(kvmem_context_params, &p, params, "kvmem_context_create");
    if (st == KVMEM_OK) st = kvm_params_reserved(p.reserved, "kvmem_context_params", "kvmem_context_create");
    if (st != KVMEM_OK) return st;
    const char *name = p.backend ? p.backend : "auto";
    if (p.n_threads < 0 || p.n_threads > 1024)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "n_threads %d: must be in [0, 1024] (0 = all cores)",
                        p.n_threads);
    int known = strcmp(name, "auto") == 0 || strcmp(name, "cpu") == 0;
    for (size_t i = 0; i < sizeof kvm_route_plugins / sizeof kvm_route_plugins[0]; i++)
        known |= strcmp(name, kvm_route_plugins[i]) == 0;
    if (!known)
        return kvm_fail(KVMEM_ERR_NOT_FOUND,
                        "unknown backend '%.32s': expected \"cpu\", \"cuda\", \"vulkan\" or \"auto\"",
                        name);

    kvmem_context *ctx = kvm_calloc(1, sizeof *ctx);
    if (!ctx) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_context_create: out of memory for the context");
    kvm_errslot_init(&ctx->err);
    int n = p.n_threads;
    if (n == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (int)KVM_MIN(c, 1024) : 1;
    }
    ctx->n_threads = n;
    ctx->tp = kvm_threadpool_create(n);
    st = ctx->tp ? kvm_cpu_backend_create(ctx, ctx->tp, &ctx->cpu) : KVMEM_ERR_NOMEM;
    if (st != KVMEM_OK) {
        kvmem_context_free(ctx);
        return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_context_create: out of memory for the worker pool (%d threads) and CPU backend", n);
    }
    ctx->n_threads = kvm_threadpool_size(ctx->tp);
    char why[256] = {0};
    kvmem_backend *be = ctx->cpu;
    if (kvm_route_context_backend(ctx, name, &be, why, sizeof why) != KVMEM_OK) {
        kvmem_context_free(ctx);
        return kvm_fail(KVMEM_ERR_UNSUPPORTED, "backend '%s' is unusable here: %s", name, why);
    }
    ctx->backend = be;
    snprintf(ctx->backend_name, sizeof ctx->backend_name, "%s", be->iface->name);
    *out = ctx;
    return KVMEM_OK;
}

void kvmem_context_free(kvmem_context *ctx) {
    if (!ctx) return;
    if (ctx->backend && ctx->backend != ctx->cpu) ctx->backend->iface->free(ctx->backend);
    if (ctx->cpu) ctx->cpu->iface->free(ctx->cpu);
    kvm_threadpool_free(ctx->tp);
    kvm_free(ctx);
}

const char *kvmem_context_backend(const kvmem_context *ctx) { return ctx ? ctx->backend_name : ""; }

int32_t kvmem_context_n_threads(const kvmem_context *ctx) { return ctx ? ctx->n_threads : 0; }

kvmem_status kvmem_context_transfer_stats(const kvmem_context *ctx, uint64_t *h2d_bytes, uint64_t *d2h_bytes) {
    if (!ctx) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_context_transfer_stats: ctx is NULL");
    if (!h2d_bytes && !d2h_bytes)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_context_transfer_stats: h2d_bytes and d2h_bytes are both NULL");
    if (h2d_bytes) *h2d_bytes = atomic_load_explicit(&ctx->h2d_bytes, memory_order_relaxed);
    if (d2h_bytes) *d2h_bytes = atomic_load_explicit(&ctx->d2h_bytes, memory_order_relaxed);
    return KVMEM_OK;
}

kvmem_status kvmem_context_transfer_reset(kvmem_context *ctx) {
    if (!ctx) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_context_transfer_reset: ctx is NULL");
    atomic_store_explicit(&ctx->h2d_bytes, 0, memory_order_relaxed);
    atomic_store_explicit(&ctx->d2h_bytes, 0, memory_order_relaxed);
    return KVMEM_OK;
}

size_t kvmem_context_last_error(const kvmem_context *ctx, char *buf, size_t size) {
    return kvm_errslot_copy(ctx ? (kvm_errslot *)(uintptr_t)&ctx->err : NULL, buf, size); /* its lock changes */
}
