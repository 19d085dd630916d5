/* Suite "backend": where the backend chosen with --backend has the
 * aabb_score kernel in its GEMM form (Vulkan, reached by name), one line
 * gives its GFLOP/s beside a plain one-thread loop; other backends print
 * nothing. Device time comes from Vulkan timestamp queries when the device
 * has them, else wall time. (The suite also timed convert, aabb_build,
 * quantize and dequantize until backend API 5 removed those entries, which
 * nothing in the library used.) On a CPU-type Vulkan device (lavapipe) the
 * numbers are no performance claim: the "note" key says so. */
#include "bench.h"
#include "backend/route/context.h"
#include "vk_ops.h" /* Vulkan kernels reached by name ahead of their table entries */

#include <stdlib.h>
#include <string.h>

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
static int run_aabb_score(const kvm_bench_opts *o, kvmem_context *ctx, const char *device, const char *note) {
    kvmem_backend *be = ctx->backend;
    void *p = be->iface->get_proc_address ? be->iface->get_proc_address(be, KVM_VK_PROC_AABB_SCORE) : NULL;
    if (!p) return 0; /* no such kernel on this backend: nothing to report */
    score_arg s;
    memset(&s, 0, sizeof s);
    s.be = be;
    memcpy(&s.fn, &p, sizeof s.fn);
    /* small shape on a CPU-emulated device: its barriers make tiled kernels
     * crawl, and its numbers mean nothing anyway */
    int small = o->quick || be->cpu_device;
    size_t n_q = 16, n_blocks = small ? 256 : 4096, dim = 128, batch = small ? 8 : 64;
    size_t nq = batch * n_q * dim, ns = batch * n_blocks * dim, no = batch * n_q * n_blocks;
    size_t n_init = nq > ns ? nq : ns;
    float *init = malloc(n_init * 4);
    if (!init) return 1;
    uint64_t rs = 0x1234;
    for (size_t i = 0; i < n_init; i++) {
        rs = rs * 6364136223846793005ull + 1442695040888963407ull;
        init[i] = (float)((int64_t)(rs >> 40) - (1 << 23)) * (1.0f / (1 << 22)); /* [-2, 2) */
    }
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
    free(init);
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
    kvmem_backend *be = ctx->backend;
    const char *device = be->detail ? be->detail : be->iface->name;
    const char *note = be->cpu_device ? "CPU-emulated device (e.g. lavapipe): no performance claim" : "";
    int rc = run_aabb_score(o, ctx, device, note);
    kvmem_context_free(ctx);
    return rc;
}

const kvm_bench_suite kvm_bench_backend = {
    "backend", "the Vulkan aabb_score kernel in its GEMM form on --backend vulkan (device timestamps) vs a plain CPU loop",
    run_backend};
