/* Suite "backend": throughput of the backend ops on the backend chosen with
 * --backend (cpu, vulkan, cuda), beside the CPU backend on the same data.
 * Device time comes from the backend's timestamps (Vulkan timestamp queries)
 * when it has them, else wall time; wall time includes submission and the
 * wait. The denominator is the same device's own copy bandwidth, measured in
 * the same run as an f32 -> f32 convert (a pure copy kernel).
 * On a CPU-type Vulkan device (lavapipe) the numbers are no performance
 * claim: the "note" key says so. */
#include "bench.h"
#include "context.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    kvmem_backend *be;
    int op; /* 0 convert, 1 aabb_build */
    kvmem_buffer *a, *b, *c;
    kvmem_dtype sdt, ddt;
    size_t n, n_groups, n_rows, dim;
    int failed;
} op_arg;

static void run_op(void *p) {
    op_arg *a = p;
    kvmem_status st;
    if (a->op == 0) st = a->be->iface->convert(a->be, a->b, 0, a->ddt, a->a, 0, a->sdt, a->n);
    else
        st = a->be->iface->aabb_build(a->be, a->a, 0, a->n_groups, a->n_rows * a->dim, a->n_rows, a->dim, a->b,
                                      a->c, 0);
    if (st == KVMEM_OK) st = a->be->iface->synchronize(a->be);
    a->failed |= st != KVMEM_OK;
}

typedef struct {
    double wall, device; /* medians, seconds; device < 0 when unknown */
} timing;

static timing measure(op_arg *a, int warm, int reps) {
    kvm_last_op_seconds_fn dev = NULL;
    void *p = a->be->iface->get_proc_address ? a->be->iface->get_proc_address(a->be, KVM_PROC_LAST_OP_SECONDS) : NULL;
    if (p) memcpy(&dev, &p, sizeof dev);
    for (int i = 0; i < warm; i++) run_op(a);
    double w[64], d[64];
    if (reps > 64) reps = 64;
    int have_dev = dev != NULL;
    for (int i = 0; i < reps; i++) {
        double t0 = kvm_now();
        run_op(a);
        w[i] = kvm_now() - t0;
        d[i] = dev ? dev(a->be) : -1;
        have_dev &= d[i] >= 0;
    }
    timing t = {kvm_median(w, reps), -1};
    if (have_dev) t.device = kvm_median(d, reps);
    return t;
}

/* Buffers for one case on one backend, filled with values that are finite
 * in every dtype. */
static int setup_case(kvmem_backend *be, op_arg *a, size_t in_bytes, size_t out_bytes, const void *init) {
    a->be = be;
    a->a = a->b = a->c = NULL;
    if (be->iface->buffer_alloc(be, in_bytes, &a->a) || be->iface->buffer_alloc(be, out_bytes, &a->b) ||
        be->iface->buffer_alloc(be, out_bytes, &a->c))
        return -1;
    return be->iface->buffer_upload(be, a->a, 0, init, in_bytes) == KVMEM_OK ? 0 : -1;
}

static void free_case(op_arg *a) {
    a->be->iface->buffer_free(a->be, a->a);
    a->be->iface->buffer_free(a->be, a->b);
    a->be->iface->buffer_free(a->be, a->c);
}

static size_t esize(kvmem_dtype d) { return d == KVMEM_F32 ? 4 : 2; }

static int run_backend(const kvm_bench_opts *o) {
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = o->backend;
    cp.n_threads = o->n_threads;
    kvmem_context *ctx = NULL;
    if (kvmem_context_create(&cp, &ctx) != KVMEM_OK) return 1;
    kvmem_backend *be = ctx->backend, *cpu = ctx->cpu;
    const char *device = be->detail ? be->detail : be->iface->name;
    const char *note = be->cpu_device ? "CPU-emulated device (e.g. lavapipe): no performance claim" : "";
    int warm = o->quick ? 1 : 2, reps = o->quick ? 3 : 9;

    size_t n_conv = o->quick ? ((size_t)1 << 20) : ((size_t)16 << 20);
    size_t n_groups = o->quick ? 512 : 8192, n_rows = 16, dim = 128; /* blocks x KV heads, BS, head_dim */
    size_t n_keys = n_groups * n_rows * dim;
    size_t n_max = n_conv > n_keys ? n_conv : n_keys;
    float *init = malloc(n_max * 4);
    if (!init) {
        kvmem_context_free(ctx);
        return 1;
    }
    uint64_t s = 0x1234;
    for (size_t i = 0; i < n_max; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        init[i] = (float)((int64_t)(s >> 40) - (1 << 23)) * (1.0f / (1 << 22)); /* [-2, 2) */
    }

    double copy_gbps = 0;
    static const struct { kvmem_dtype s, d; } conv[] = {
        {KVMEM_F32, KVMEM_F32}, {KVMEM_F32, KVMEM_F16}, {KVMEM_F16, KVMEM_F32},
        {KVMEM_F32, KVMEM_BF16}, {KVMEM_BF16, KVMEM_F32}};
    int rc = 0;
    for (int c = 0; c < 6 && rc == 0; c++) {
        timing t[2];
        size_t bytes;
        op_arg args[2];
        for (int k = 0; k < 2; k++) {
            op_arg *a = &args[k];
            memset(a, 0, sizeof *a);
            if (c < 5) {
                a->op = 0;
                a->sdt = conv[c].s;
                a->ddt = conv[c].d;
                a->n = n_conv;
                /* 16-bit sources reuse the f32 data's bytes: all finite or NaN-free enough */
                if (setup_case(k ? cpu : be, a, n_conv * esize(a->sdt), n_conv * esize(a->ddt), init)) rc = 1;
            } else {
                a->op = 1;
                a->n_groups = n_groups;
                a->n_rows = n_rows;
                a->dim = dim;
                if (setup_case(k ? cpu : be, a, n_keys * 4, n_groups * dim * 4, init)) rc = 1;
            }
            if (rc == 0) t[k] = measure(a, warm, reps);
            rc |= a->failed;
            free_case(a);
        }
        if (rc) break;
        bytes = c < 5 ? n_conv * (esize(conv[c].s) + esize(conv[c].d)) : (n_keys + 2 * n_groups * dim) * 4;
        double dt = t[0].device > 0 ? t[0].device : t[0].wall;
        double gbps = (double)bytes / dt / 1e9;
        if (c == 0) copy_gbps = gbps;
        double cpu_gbps = (double)bytes / t[1].wall / 1e9;
        FILE *f = o->out;
        if (o->json) {
            kvm_json_begin(f, "backend");
            kvm_json_str(f, "backend", kvmem_context_backend(ctx));
            kvm_json_str(f, "device", device);
            kvm_json_str(f, "op", c < 5 ? "convert" : "aabb_build");
            if (c < 5) {
                kvm_json_str(f, "src_dtype", kvmem_dtype_name(conv[c].s));
                kvm_json_str(f, "dst_dtype", kvmem_dtype_name(conv[c].d));
                kvm_json_int(f, "n", (long long)n_conv);
            } else {
                kvm_json_int(f, "n_groups", (long long)n_groups);
                kvm_json_int(f, "n_rows", (long long)n_rows);
                kvm_json_int(f, "dim", (long long)dim);
            }
            kvm_json_int(f, "bytes", (long long)bytes);
            kvm_json_num(f, "wall_ms", t[0].wall * 1e3);
            kvm_json_num(f, "device_ms", t[0].device >= 0 ? t[0].device * 1e3 : -1);
            kvm_json_num(f, "gbps", gbps);
            kvm_json_num(f, "device_copy_gbps", copy_gbps);
            kvm_json_num(f, "ratio_to_device_copy", gbps / copy_gbps);
            kvm_json_num(f, "cpu_backend_ms", t[1].wall * 1e3);
            kvm_json_num(f, "cpu_backend_gbps", cpu_gbps);
            kvm_json_int(f, "cpu_threads", kvmem_context_n_threads(ctx));
            kvm_json_str(f, "note", note);
            kvm_json_end(f);
        } else {
            char dev[48] = "";
            if (t[0].device >= 0) snprintf(dev, sizeof dev, " (device %.3f ms)", t[0].device * 1e3);
            fprintf(f, "backend %-7s %-10s %-5s->%-5s %8.3f ms%s %7.2f GB/s = %.2f x device copy | cpu %8.3f ms %7.2f GB/s%s%s\n",
                    kvmem_context_backend(ctx), c < 5 ? "convert" : "aabb_build",
                    c < 5 ? kvmem_dtype_name(conv[c].s) : "f32", c < 5 ? kvmem_dtype_name(conv[c].d) : "aabb",
                    t[0].wall * 1e3, dev, gbps, gbps / copy_gbps, t[1].wall * 1e3, cpu_gbps,
                    *note ? "  # " : "", note);
        }
    }
    free(init);
    kvmem_context_free(ctx);
    return rc;
}

const kvm_bench_suite kvm_bench_backend = {
    "backend", "backend ops (convert, aabb_build) on --backend, device timestamps, vs the CPU backend",
    run_backend};
