/* Suite "backend": throughput of the backend ops on the backend chosen with
 * --backend (cpu, vulkan, cuda), beside the CPU backend on the same data.
 * Device time comes from the backend's timestamps (Vulkan timestamp queries)
 * when it has them, else wall time; wall time includes submission and the
 * wait. The denominator is the same device's own copy bandwidth, measured in
 * the same run as an f32 -> f32 convert (a pure copy kernel).
 * Where the backend has the aabb_score kernel (Vulkan, ahead of the table
 * entry) one more line gives its GFLOP/s beside a plain one-thread loop.
 * On a CPU-type Vulkan device (lavapipe) the numbers are no performance
 * claim: the "note" key says so. */
#include "bench.h"
#include "context.h"
#include "vk_ops.h" /* Vulkan kernels reached by name ahead of their table entries */
#include "quant/quant.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    kvmem_backend *be;
    int op; /* 0 convert, 1 aabb_build, 2 quantize, 3 dequantize (qdt: Q8 or Q4, rows of dim) */
    kvmem_buffer *a, *b, *c;
    kvmem_dtype sdt, ddt;
    size_t n, n_groups, n_rows, dim;
    int failed;
} op_arg;

static void run_op(void *p) {
    op_arg *a = p;
    kvmem_status st;
    if (a->op == 0) st = a->be->iface->convert(a->be, a->b, 0, a->ddt, a->a, 0, a->sdt, a->n);
    else if (a->op == 2) st = a->be->iface->quantize(a->be, a->ddt, 1, a->a, 0, a->n_rows, a->dim, a->b, 0);
    else if (a->op == 3)
        st = a->be->iface->dequantize(a->be, a->ddt, 1, a->a, 0, a->n_rows, a->dim, 0, a->n_rows, a->b, 0);
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

/* quantize: a = f32 rows, b = the section; dequantize: a = the section
 * (quantized from init on the same backend), b = f32 rows. */
static int setup_quant(kvmem_backend *be, op_arg *a, const float *init) {
    size_t fb = a->n_rows * a->dim * 4, sb = kvm_qsection_layout(a->ddt, 1, a->n_rows, a->dim).bytes;
    a->be = be;
    a->a = a->b = a->c = NULL;
    if (be->iface->buffer_alloc(be, a->op == 2 ? fb : sb, &a->a) || be->iface->buffer_alloc(be, a->op == 2 ? sb : fb, &a->b) ||
        be->iface->buffer_alloc(be, fb, &a->c) || be->iface->buffer_upload(be, a->c, 0, init, fb))
        return -1;
    if (a->op == 2) return be->iface->buffer_upload(be, a->a, 0, init, fb) == KVMEM_OK ? 0 : -1;
    return be->iface->quantize(be, a->ddt, 1, a->c, 0, a->n_rows, a->dim, a->a, 0) == KVMEM_OK ? 0 : -1;
}

static void free_case(op_arg *a) {
    a->be->iface->buffer_free(a->be, a->a);
    a->be->iface->buffer_free(a->be, a->b);
    a->be->iface->buffer_free(a->be, a->c);
}

static size_t esize(kvmem_dtype d) { return d == KVMEM_F32 ? 4 : 2; }

typedef struct {
    kvmem_backend *be;
    kvm_vk_aabb_score_fn fn;
    kvm_vk_aabb_score_args a;
    int failed;
} score_arg;

static void run_score(void *p) {
    score_arg *s = p;
    s->failed |= s->fn(s->be, &s->a) != KVMEM_OK;
}

typedef struct {
    const float *q, *mn, *mx;
    float *out;
    size_t n_q, n_blocks, dim, batch;
} naive_arg;

/* Baseline: the plain loop (one thread) of I(q, b) = sum_d max(q_d smax_d, q_d smin_d). */
static void run_naive(void *p) {
    const naive_arg *a = p;
    for (size_t b = 0; b < a->batch; b++)
        for (size_t r = 0; r < a->n_q; r++)
            for (size_t k = 0; k < a->n_blocks; k++) {
                const float *q = a->q + (b * a->n_q + r) * a->dim;
                const float *mx = a->mx + (b * a->n_blocks + k) * a->dim, *mn = a->mn + (b * a->n_blocks + k) * a->dim;
                float acc = 0;
                for (size_t d = 0; d < a->dim; d++) {
                    float x = q[d] * mx[d], y = q[d] * mn[d];
                    acc += x > y ? x : y;
                }
                a->out[(b * a->n_q + r) * a->n_blocks + k] = acc;
            }
}

/* aabb_score in its GEMM form, where the backend has the kernel (Vulkan):
 * GFLOP/s counting the 2 x (2 dim) multiply-adds per score. */
static int run_aabb_score(const kvm_bench_opts *o, kvmem_context *ctx, const float *init, size_t n_init,
                          const char *device, const char *note) {
    kvmem_backend *be = ctx->backend;
    void *p = be->iface->get_proc_address ? be->iface->get_proc_address(be, KVM_VK_PROC_AABB_SCORE) : NULL;
    if (!p) return 0; /* the table entry lands with the retrieval work */
    score_arg s;
    memset(&s, 0, sizeof s);
    s.be = be;
    memcpy(&s.fn, &p, sizeof s.fn);
    /* small shape on a CPU-emulated device: its barriers make tiled kernels
     * crawl, and its numbers mean nothing anyway */
    int small = o->quick || be->cpu_device;
    size_t n_q = 16, n_blocks = small ? 256 : 4096, dim = 128, batch = small ? 8 : 64;
    size_t nq = batch * n_q * dim, ns = batch * n_blocks * dim, no = batch * n_q * n_blocks;
    if (nq > n_init || ns > n_init) return 1;
    kvmem_buffer *bq = NULL, *bmn = NULL, *bmx = NULL, *bo = NULL;
    int rc = be->iface->buffer_alloc(be, nq * 4, &bq) || be->iface->buffer_alloc(be, ns * 4, &bmn) ||
             be->iface->buffer_alloc(be, ns * 4, &bmx) || be->iface->buffer_alloc(be, no * 4, &bo) ||
             be->iface->buffer_upload(be, bq, 0, init, nq * 4) || be->iface->buffer_upload(be, bmn, 0, init, ns * 4) ||
             be->iface->buffer_upload(be, bmx, 0, init, ns * 4);
    float *out = malloc(no * 4);
    if (!rc && out) {
        s.a = (kvm_vk_aabb_score_args){bq, bmn, bmx, bo, 0, 0, 0, n_q, n_blocks, dim, batch, 1,
                                       n_q * dim, dim, n_blocks * dim, dim, n_q * n_blocks, n_blocks};
        kvm_last_op_seconds_fn dev = NULL;
        void *dp = be->iface->get_proc_address(be, KVM_PROC_LAST_OP_SECONDS);
        if (dp) memcpy(&dev, &dp, sizeof dev);
        int warm = o->quick ? 1 : 2, reps = o->quick ? 3 : 9;
        double w = kvm_time_median(run_score, &s, warm, reps);
        double d = dev ? dev(be) : -1; /* the last run's device time */
        naive_arg na = {init, init, init, out, n_q, n_blocks, dim, batch};
        double tn = kvm_time_median(run_naive, &na, 0, o->quick ? 1 : 3);
        double flop = 4.0 * (double)dim * (double)n_q * (double)n_blocks * (double)batch;
        double t = d > 0 ? d : w;
        FILE *f = o->out;
        if (o->json) {
            kvm_json_begin(f, "backend");
            kvm_json_str(f, "backend", kvmem_context_backend(ctx));
            kvm_json_str(f, "device", device);
            kvm_json_str(f, "op", "aabb_score");
            kvm_json_int(f, "n_q", (long long)n_q);
            kvm_json_int(f, "n_blocks", (long long)n_blocks);
            kvm_json_int(f, "dim", (long long)dim);
            kvm_json_int(f, "batch", (long long)batch);
            kvm_json_num(f, "wall_ms", w * 1e3);
            kvm_json_num(f, "device_ms", d >= 0 ? d * 1e3 : -1);
            kvm_json_num(f, "gflops", flop / t / 1e9);
            kvm_json_num(f, "naive_cpu_1thread_ms", tn * 1e3);
            kvm_json_num(f, "naive_cpu_1thread_gflops", flop / tn / 1e9);
            kvm_json_str(f, "note", note);
            kvm_json_end(f);
        } else {
            fprintf(f, "backend %-7s aabb_score %zux%zux%zu x%zu  %8.3f ms %7.2f GFLOP/s | naive cpu (1 thread) %8.3f ms %7.2f GFLOP/s%s%s\n",
                    kvmem_context_backend(ctx), n_q, n_blocks, dim, batch, t * 1e3, flop / t / 1e9, tn * 1e3,
                    flop / tn / 1e9, *note ? "  # " : "", note);
        }
        rc = s.failed;
    } else {
        rc = 1;
    }
    free(out);
    be->iface->buffer_free(be, bq);
    be->iface->buffer_free(be, bmn);
    be->iface->buffer_free(be, bmx);
    be->iface->buffer_free(be, bo);
    return rc;
}

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
    /* 0-4 convert, 5 aabb_build, 6-9 quantize Q8, Q4, dequantize Q8, Q4 (one
     * section of n_conv / 128 rows of 128; GB/s of the f32 side) */
    for (int c = 0; c < 10 && rc == 0; c++) {
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
            } else if (c >= 6) {
                a->op = c < 8 ? 2 : 3;
                a->ddt = c % 2 == 0 ? KVMEM_Q8 : KVMEM_Q4;
                a->n_rows = n_conv / 128;
                a->dim = 128;
                if (!be->iface->quantize || !be->iface->dequantize || !cpu->iface->quantize || setup_quant(k ? cpu : be, a, init)) rc = 1;
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
        bytes = c < 5 ? n_conv * (esize(conv[c].s) + esize(conv[c].d)) : c == 5 ? (n_keys + 2 * n_groups * dim) * 4 : n_conv * 4;
        double dt = t[0].device > 0 ? t[0].device : t[0].wall;
        double gbps = (double)bytes / dt / 1e9;
        if (c == 0) copy_gbps = gbps;
        double cpu_gbps = (double)bytes / t[1].wall / 1e9;
        FILE *f = o->out;
        if (o->json) {
            kvm_json_begin(f, "backend");
            kvm_json_str(f, "backend", kvmem_context_backend(ctx));
            kvm_json_str(f, "device", device);
            kvm_json_str(f, "op", c < 5 ? "convert" : c == 5 ? "aabb_build" : c < 8 ? "quantize" : "dequantize");
            if (c >= 6) {
                kvm_json_str(f, "dtype", kvmem_dtype_name(c % 2 == 0 ? KVMEM_Q8 : KVMEM_Q4));
                kvm_json_int(f, "n_rows", (long long)(n_conv / 128));
                kvm_json_int(f, "dim", 128);
            } else if (c < 5) {
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
            const char *qn = kvmem_dtype_name(c % 2 == 0 ? KVMEM_Q8 : KVMEM_Q4);
            fprintf(f, "backend %-7s %-10s %-5s->%-5s %8.3f ms%s %7.2f GB/s = %.2f x device copy | cpu %8.3f ms %7.2f GB/s%s%s\n",
                    kvmem_context_backend(ctx), c < 5 ? "convert" : c == 5 ? "aabb_build" : c < 8 ? "quantize" : "dequantize",
                    c < 5 ? kvmem_dtype_name(conv[c].s) : c < 8 ? "f32" : c == 5 ? "f32" : qn,
                    c < 5 ? kvmem_dtype_name(conv[c].d) : c == 5 ? "aabb" : c < 8 ? qn : "f32",
                    t[0].wall * 1e3, dev, gbps, gbps / copy_gbps, t[1].wall * 1e3, cpu_gbps,
                    *note ? "  # " : "", note);
        }
    }
    if (rc == 0) rc = run_aabb_score(o, ctx, init, n_max, device, note);
    free(init);
    kvmem_context_free(ctx);
    return rc;
}

const kvm_bench_suite kvm_bench_backend = {
    "backend", "backend ops (convert, aabb_build, quantize, dequantize) on --backend, device timestamps, vs the CPU backend",
    run_backend};
