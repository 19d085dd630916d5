/* The router and the staging of host memory (route.h). */
#include "route.h"
#include "../../internal.h"
#include "../../cpu/cpu_backend.h"
#include "../../registry/plugin.h"
#include "../dev_args.h"

#include <stdio.h>
#include <string.h>

/* The device's table has every entry the core uses for op. */
static int has_entries(const kvmem_backend_iface *f, kvm_op op) {
    switch (op) {
    case KVM_OP_SCORE: return f->dev_score && f->dev_score_reduce; /* the core reads back the per-set sums */
    case KVM_OP_SCORE_REDUCE: return f->dev_score_reduce != NULL;
    case KVM_OP_TOPK: return f->dev_topk != NULL;
    case KVM_OP_GATHER_ROPE: return f->dev_gather_rope != NULL;
    case KVM_OP_ATTEND: return f->dev_attend != NULL;
    case KVM_OP_QMEM_SCORE: return f->dev_qmem_score != NULL;
    }
    return 0;
}

kvmem_backend *kvm_route(const kvmem_context *ctx, kvm_op op, const void *args) {
    kvmem_backend *dev = ctx->backend;
    if (!dev || dev == ctx->cpu || !has_entries(dev->iface, op) || !kvm_dev_args_buffer_form(op, args)) return ctx->cpu;
    if (dev->iface->supports_op && !dev->iface->supports_op(dev, op, args)) return ctx->cpu;
    return dev;
}

/* ---- the context's backend ---- */

const char *const kvm_route_plugins[KVM_ROUTE_N_PLUGINS] = {"cuda", "vulkan"};

#ifndef KVMEM_PLUGIN_CUDA_BUILT
#  define KVMEM_PLUGIN_CUDA_BUILT 0
#endif
#ifndef KVMEM_PLUGIN_VULKAN_BUILT
#  define KVMEM_PLUGIN_VULKAN_BUILT 0
#endif

kvmem_status kvm_plugin_load(kvmem_context *ctx, const char *name, kvmem_backend **out, char *why,
                             size_t why_size) {
    *out = NULL;
    char reason[256] = "";
    kvmem_backend_plugin_init_fn init;
    *(void **)(&init) = kvm_plugin_symbol(name, KVMEM_BACKEND_PLUGIN_INIT, reason, sizeof reason);
    if (!init) {
        int built = strcmp(name, "cuda") == 0 ? KVMEM_PLUGIN_CUDA_BUILT : KVMEM_PLUGIN_VULKAN_BUILT;
        if (!built)
            snprintf(why, why_size, "not built: configure with -DKVMEM_%s=ON (libkvmem-%s.so not found)",
                     strcmp(name, "cuda") == 0 ? "CUDA" : "VULKAN", name);
        else
            snprintf(why, why_size, "plugin libkvmem-%s.so not loadable: %s", name, reason);
        return KVMEM_ERR_UNSUPPORTED;
    }
    why[0] = '\0';
    kvmem_status st = init(KVMEM_BACKEND_API_VERSION, ctx, out, why, why_size);
    if (st != KVMEM_OK || !*out) {
        if (!why[0]) snprintf(why, why_size, "libkvmem-%s.so failed to initialise", name);
        *out = NULL;
        return st != KVMEM_OK ? st : KVMEM_ERR_BACKEND;
    }
    (*out)->fail = kvm_fail; /* plugins report op errors through the core's kvm_fail */
    return KVMEM_OK;
}

kvmem_status kvm_route_context_backend(kvmem_context *ctx, const char *name, kvmem_backend **out, char *why,
                                       size_t why_size) {
    *out = ctx->cpu;
    if (strcmp(name, "cpu") == 0) return KVMEM_OK;
    const int is_auto = strcmp(name, "auto") == 0;
    why[0] = '\0';
    for (size_t i = 0; i < sizeof kvm_route_plugins / sizeof kvm_route_plugins[0]; i++) {
        if (!is_auto && strcmp(name, kvm_route_plugins[i]) != 0) continue;
        kvmem_backend *be = NULL;
        if (kvm_plugin_load(ctx, kvm_route_plugins[i], &be, why, why_size) != KVMEM_OK) continue;
        /* "auto" wants speed: a plugin whose device is a CPU (lavapipe)
         * loses to the native CPU backend, so it is put back */
        if (is_auto && be->cpu_device) {
            be->iface->free(be);
            continue;
        }
        *out = be;
        return KVMEM_OK;
    }
    return is_auto ? KVMEM_OK : KVMEM_ERR_UNSUPPORTED;
}

/* ---- staging ---- */

kvmem_status kvm_route_failed(kvmem_backend *be, const char *op, kvmem_status st) {
    if (st == KVMEM_ERR_UNSUPPORTED) return st;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", kvmem_last_error());
    return kvm_fail(st, "%s on backend %s: %s", op, be->iface->name, msg);
}

/* The context's own CPU backend views host memory; any other backend (a
 * device, or a second CPU backend standing in for one) gets copies. */
static int views_host(const kvmem_backend *be) { return be->ctx && be == be->ctx->cpu; }

/* Whether begin allocated piece s on be (not resident, not a view). */
static int owned(const kvmem_backend *be, const kvm_stage *s) {
    return !s->resident && !(views_host(be) && s->dir != KVM_STAGE_WORK);
}

static void release(kvmem_backend *be, kvm_stage *s, int n) {
    for (int i = 0; i < n; i++) {
        if (s[i].buf && owned(be, &s[i])) be->iface->buffer_free(be, s[i].buf);
        s[i].buf = NULL;
    }
}

kvmem_status kvm_stage_begin(kvmem_backend *be, const char *op, kvm_stage *s, int n) {
    for (int i = 0; i < n; i++) s[i].buf = NULL;
    for (int i = 0; i < n; i++) {
        if (s[i].resident) {
            s[i].buf = s[i].resident;
            continue;
        }
        if (views_host(be) && s[i].dir != KVM_STAGE_WORK) {
            s[i].buf = kvm_cpu_buffer_view(&s[i].view, s[i].host, s[i].bytes);
            continue;
        }
        kvmem_buffer *b = NULL;
        kvmem_status st = be->iface->buffer_alloc(be, s[i].bytes ? s[i].bytes : 4, &b);
        if (st == KVMEM_OK) s[i].buf = b;
        if (st == KVMEM_OK && s[i].dir == KVM_STAGE_IN && s[i].bytes)
            st = kvm_be_upload(be, s[i].buf, 0, s[i].host, s[i].bytes);
        if (st != KVMEM_OK) {
            release(be, s, i + 1);
            return kvm_route_failed(be, op, st);
        }
    }
    return KVMEM_OK;
}

kvmem_status kvm_stage_end(kvmem_backend *be, const char *op, kvm_stage *s, int n, kvmem_status st) {
    for (int i = 0; st == KVMEM_OK && i < n; i++)
        if (s[i].dir == KVM_STAGE_OUT && owned(be, &s[i]) && s[i].bytes) {
            kvmem_status r = kvm_be_download(be, s[i].buf, 0, s[i].host, s[i].bytes);
            if (r != KVMEM_OK) st = kvm_route_failed(be, op, r);
        }
    release(be, s, n);
    return st;
}
