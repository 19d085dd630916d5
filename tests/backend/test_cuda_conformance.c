/* Conformance of the CUDA backend: every op against the CPU backend or an
 * independent double-precision reference, through the plugin's own API
 * (the backend table and its get_proc_address ops). Without a usable GPU
 * the device tests print "skipped: no CUDA device" (cmocka skip); the
 * registry and plugin-loading tests run everywhere.
 *
 * Tolerances, stated per op:
 *   buffers, topk: bit-exact (the CPU backend's bytes).
 *   gather with RoPE (f32): 2e-6 absolute (double sin/cos of the device vs libm).
 *   aabb_score: scores from f16-rounded inputs, f32 accumulation in another
 *     order: relative 1e-4 of sum |q||s| before normalisation; probabilities
 *     2e-4 absolute.
 *   dev_attend: f16 KV, f32 accumulation in another order: 1e-4 absolute vs a
 *     double reference, 1e-5 vs the CPU backend's entry; visited exact.
 *   qmem_score: f32 accumulation and __expf: 2e-3 absolute. */
#include "testutil.h"
#include "backend/route/context.h"
#include "cpu/half.h"
#include "internal.h"
#include "kvmem_cuda.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KVMEM_TEST_CUDA_BUILT
#  define KVMEM_TEST_CUDA_BUILT 0
#endif
#ifndef KVMEM_TEST_PLUGIN_DIR
#  define KVMEM_TEST_PLUGIN_DIR "."
#endif

static kvmem_context *g_cpu, *g_gpu;
static kvmem_backend *g_be; /* the CUDA backend, or NULL */
static char g_why[256];

static int setup(void **state) {
    (void)state;
    kvmem_backend_info info[8];
    size_t n = 0;
    if (kvmem_backends(info, 8, &n) != KVMEM_OK) return -1;
    for (size_t i = 0; i < n && i < 8; i++)
        if (strcmp(info[i].name, "cuda") == 0) snprintf(g_why, sizeof g_why, "%s", info[i].detail);
    g_cpu = tu_context(2);
    kvmem_context_params p = kvmem_context_default_params();
    p.backend = "cuda";
    p.n_threads = 2;
    if (kvmem_context_create(&p, &g_gpu) == KVMEM_OK) g_be = g_gpu->backend;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    kvmem_context_free(g_gpu);
    kvmem_context_free(g_cpu);
    return 0;
}

#define NEED_GPU()                                                    \
    do {                                                              \
        if (!g_be) {                                                  \
            print_message("skipped: no CUDA device (%s)\n", g_why);   \
            skip();                                                   \
        }                                                             \
    } while (0)

static const char *cu_err(void) {
    kvmem_cuda_last_error_fn f;
    *(void **)(&f) = g_be->iface->get_proc_address(g_be, KVMEM_CUDA_PROC_LAST_ERROR);
    return f ? f() : "?";
}
#define cu_ok(call)                                                                                       \
    do {                                                                                                  \
        kvmem_status s_ = (call);                                                                         \
        if (s_ != KVMEM_OK) fail_msg("%s: %s (%s)", #call, kvmem_status_str(s_), cu_err());             \
    } while (0)

static void *proc(const char *name) {
    void *f = g_be->iface->get_proc_address(g_be, name);
    if (!f) fail_msg("the CUDA backend has no proc %s", name);
    return f;
}

/* a device buffer holding a copy of host data */
static kvmem_buffer *dev_from(const void *host, size_t bytes) {
    kvmem_buffer *b = NULL;
    cu_ok(g_be->iface->buffer_alloc(g_be, bytes, &b));
    if (bytes) cu_ok(g_be->iface->buffer_upload(g_be, b, 0, host, bytes));
    return b;
}
static kvmem_buffer *dev_zero(size_t bytes) {
    void *z = calloc(1, bytes ? bytes : 1);
    kvmem_buffer *b = dev_from(z, bytes);
    free(z);
    return b;
}
static void dev_read(kvmem_buffer *b, void *host, size_t bytes) {
    kvmem_cuda_synchronize_fn sync;
    *(void **)(&sync) = proc(KVMEM_CUDA_PROC_SYNCHRONIZE);
    cu_ok(sync(g_be));
    cu_ok(g_be->iface->buffer_download(g_be, b, 0, host, bytes));
}
static void dev_free(kvmem_buffer *b) { g_be->iface->buffer_free(g_be, b); }
static kvmem_cuda_ref ref(kvmem_buffer *b) {
    kvmem_cuda_ref r = {b, 0};
    return r;
}

static float f16r(float x) { return kvm_f16_to_f32(kvm_f32_to_f16(x)); }

/* ---- runs everywhere ---- */

static void registry_reports_why_cuda_is_unusable_or_names_the_device(void **state) {
    (void)state;
    if (g_be) {
        /* the name is "cuda" (contexts and device tensors match it); the
         * device is in the detail: "NAME (sm_XY, N SMs, G GiB)" */
        assert_non_null(strstr(g_why, " (sm_"));
        assert_string_equal(g_why, g_be->detail);
        assert_string_equal(kvmem_context_backend(g_gpu), "cuda");
        return;
    }
    if (KVMEM_TEST_CUDA_BUILT) {
        /* the plugin loads; what it found missing is said plainly */
        int known = strstr(g_why, "no NVIDIA driver (libcuda.so.1") || strstr(g_why, "no CUDA device") ||
                    strstr(g_why, "NVIDIA driver too old") || strstr(g_why, "CUDA unusable");
        if (!known) fail_msg("cuda detail '%s' names no reason", g_why);
    } else {
        assert_non_null(strstr(g_why, "libkvmem-cuda.so"));
    }
    /* and asking for it by name fails with the same reason */
    kvmem_context_params p = kvmem_context_default_params();
    p.backend = "cuda";
    kvmem_context *ctx = NULL;
    assert_status(kvmem_context_create(&p, &ctx), KVMEM_ERR_UNSUPPORTED, "backend 'cuda' is unusable here");
    assert_null(ctx);
}

static void plugin_checks_the_backend_api_version_exactly(void **state) {
    (void)state;
    if (!KVMEM_TEST_CUDA_BUILT) {
        print_message("skipped: the CUDA plugin is not built (KVMEM_CUDA=OFF)\n");
        skip();
    }
    void *h = dlopen(KVMEM_TEST_PLUGIN_DIR "/libkvmem-cuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) fail_msg("dlopen: %s", dlerror());
    kvmem_backend_plugin_init_fn init;
    *(void **)(&init) = dlsym(h, KVMEM_BACKEND_PLUGIN_INIT);
    assert_non_null(init);
    char why[256] = "";
    kvmem_backend *be = (kvmem_backend *)&why; /* must be reset to NULL */
    assert_int_equal(init(KVMEM_BACKEND_API_VERSION + 1, NULL, &be, why, sizeof why), KVMEM_ERR_UNSUPPORTED);
    assert_null(be);
    assert_non_null(strstr(why, "backend API"));
    /* the right version: a backend, or the same plain reason as the registry */
    why[0] = '\0';
    kvmem_status st = init(KVMEM_BACKEND_API_VERSION, NULL, &be, why, sizeof why);
    if (st == KVMEM_OK) {
        assert_non_null(be);
        assert_non_null(be->iface->get_proc_address(be, KVMEM_CUDA_PROC_TOPK));
        assert_null(be->iface->get_proc_address(be, "no_such_proc"));
        be->iface->free(be);
    } else {
        assert_null(be);
        assert_true(why[0] != '\0');
        if (!g_be) assert_non_null(strstr(g_why, why));
    }
    assert_int_equal(init(KVMEM_BACKEND_API_VERSION, NULL, NULL, why, sizeof why), KVMEM_ERR_INVALID_ARG);
    dlclose(h);
}

/* ---- needs a GPU ---- */

static void buffers_round_trip_through_the_staging_buffers(void **state) {
    (void)state;
    NEED_GPU();
    const size_t sizes[] = {0, 1, 4096, ((size_t)8 << 20) - 1, ((size_t)20 << 20) + 3};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        unsigned char *a = malloc(n + 1), *b = malloc(n + 1);
        for (size_t i = 0; i < n; i++) a[i] = (unsigned char)(i * 131u + s);
        kvmem_buffer *d = dev_from(a, n);
        memset(b, 0, n + 1);
        dev_read(d, b, n);
        if (n) assert_memory_equal(a, b, n); /* a's one byte is not written when n is 0 */
        /* a partial update in the middle */
        if (n > 10) {
            const unsigned char patch[5] = {9, 8, 7, 6, 5};
            cu_ok(g_be->iface->buffer_upload(g_be, d, n / 2, patch, 5));
            memcpy(a + n / 2, patch, 5);
            dev_read(d, b, n);
            assert_memory_equal(a, b, n);
        }
        /* out of range: refused, the buffer unchanged */
        assert_int_equal(g_be->iface->buffer_upload(g_be, d, n, a, 1), KVMEM_ERR_INVALID_ARG);
        assert_int_equal(g_be->iface->buffer_download(g_be, d, 1, b, n), n ? KVMEM_ERR_INVALID_ARG : KVMEM_ERR_INVALID_ARG);
        assert_int_equal(g_be->iface->buffer_download(g_be, d, SIZE_MAX, b, 2), KVMEM_ERR_INVALID_ARG);
        assert_null(g_be->iface->buffer_host_ptr(g_be, d));
        dev_free(d);
        free(a);
        free(b);
    }
    g_be->iface->buffer_free(g_be, NULL);
}

static void score_reference(const float *q, const float *amin, const float *amax, int L, int Hq, int Hkv, int D, int nq,
                            int NB, int rr, int sum, int per_layer, double *out, double *bound) {
    const int G = Hq / Hkv;
    double *I = malloc(sizeof(double) * (size_t)nq * NB), *B = malloc(sizeof(double) * (size_t)nq * NB);
    memset(out, 0, sizeof(double) * (size_t)(per_layer ? L : 1) * NB);
    *bound = 0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < Hq; h++) {
            const int g = h / G;
            for (int t = 0; t < nq; t++)
                for (int b = 0; b < NB; b++) {
                    double s = 0, bd = 0;
                    for (int d = 0; d < D; d++) {
                        double x = q[(((size_t)t * L + l) * Hq + h) * D + d];
                        double qp = f16r((float)fmax(x, 0)), qn = f16r((float)fmin(x, 0));
                        double mx = f16r(amax[(((size_t)b * L + l) * Hkv + g) * D + d]);
                        double mn = f16r(amin[(((size_t)b * L + l) * Hkv + g) * D + d]);
                        s += qp * mx + qn * mn;
                        bd += fabs(qp * mx) + fabs(qn * mn);
                    }
                    I[(size_t)t * NB + b] = s;
                    B[(size_t)t * NB + b] = bd;
                    if (bd > *bound) *bound = bd;
                }
            for (int t = 0; t < nq; t++) {
                double *row = I + (size_t)t * NB;
                double *p = B + (size_t)t * NB; /* reused for probabilities */
                if (!rr) {
                    double m = -INFINITY, z = 0, tau = 1.0 / sqrt((double)D);
                    for (int b = 0; b < NB; b++) m = fmax(m, tau * row[b]);
                    for (int b = 0; b < NB; b++) z += exp(tau * row[b] - m);
                    for (int b = 0; b < NB; b++) p[b] = exp(tau * row[b] - m) / z;
                } else {
                    for (int b = 0; b < NB; b++) {
                        int rank = 1;
                        for (int c = 0; c < NB; c++) rank += row[c] > row[b] || (row[c] == row[b] && c < b);
                        p[b] = 1.0 / (rank + 60.0);
                    }
                }
            }
            double *o = out + (per_layer ? (size_t)l * NB : 0);
            for (int b = 0; b < NB; b++) {
                double a = sum ? 0 : -INFINITY;
                for (int t = 0; t < nq; t++) a = sum ? a + B[(size_t)t * NB + b] : fmax(a, B[(size_t)t * NB + b]);
                o[b] += a;
            }
        }
    free(I);
    free(B);
}

/* One shape through the fused selection score, every mode whose bit is set
 * in `modes` (bit m: rr = m & 1, sum = m & 2, per_layer = m & 4). */
static void check_aabb_score(int L, int Hq, int Hkv, int D, int nq, int NB, unsigned modes) {
    const size_t qn = (size_t)nq * L * Hq * D, an = (size_t)NB * L * Hkv * D;
    float *q = malloc(qn * 4), *amin = malloc(an * 4), *amax = malloc(an * 4);
    uint64_t rng = 11;
    for (size_t i = 0; i < qn; i++) q[i] = tu_normal(&rng);
    for (size_t i = 0; i < an; i++) {
        float a = tu_normal(&rng), b = tu_normal(&rng);
        amin[i] = fminf(a, b);
        amax[i] = fmaxf(a, b);
    }
    kvmem_cuda_score_blocks_fn blocks;
    *(void **)(&blocks) = proc(KVMEM_CUDA_PROC_SCORE_BLOCKS);
    kvmem_cuda_aabb_score_fn score;
    *(void **)(&score) = proc(KVMEM_CUDA_PROC_AABB_SCORE);
    const int nb_pad = (NB + 15) / 16 * 16;
    kvmem_buffer *dq = dev_from(q, qn * 4), *dmn = dev_from(amin, an * 4), *dmx = dev_from(amax, an * 4);
    kvmem_buffer *dblk = dev_zero((size_t)L * Hkv * nb_pad * 2 * D * 2), *dout = dev_zero((size_t)L * NB * 4);
    kvmem_cuda_blocks_args ba = {ref(dmn), ref(dmx), ref(dblk), L, Hkv, D, NB, KVMEM_F16};
    cu_ok(blocks(g_be, &ba));
    double *want = malloc(sizeof(double) * L * NB);
    float *got = malloc(4 * (size_t)L * NB);
    for (int mode = 0; mode < 8; mode++) {
        if (!(modes >> mode & 1u)) continue;
        int rr = mode & 1, sum = (mode >> 1) & 1, per_layer = (mode >> 2) & 1;
        kvmem_cuda_score_args sa;
        memset(&sa, 0, sizeof sa);
        sa.q = ref(dq);
        sa.blk = ref(dblk);
        sa.out = ref(dout);
        sa.n_layers = L;
        sa.n_q_heads = Hq;
        sa.n_kv_heads = Hkv;
        sa.head_dim = D;
        sa.n_q = nq;
        sa.n_blocks = NB;
        sa.dtype = KVMEM_F16;
        sa.norm_rr = rr;
        sa.agg_sum = sum;
        sa.per_layer = per_layer;
        cu_ok(score(g_be, &sa));
        dev_read(dout, got, 4 * (size_t)(per_layer ? L : 1) * NB);
        double bound;
        score_reference(q, amin, amax, L, Hq, Hkv, D, nq, NB, rr, sum, per_layer, want, &bound);
        const int n_out = (per_layer ? L : 1) * NB;
        const double tol = 2e-4 * (double)(L * Hq) * (sum ? nq : 1);
        for (int i = 0; i < n_out; i++)
            if (fabs(got[i] - want[i]) > tol)
                fail_msg("L %d Hq %d Hkv %d D %d nq %d NB %d, mode rr=%d sum=%d per_layer=%d: block %d: %.7g vs %.7g", L,
                         Hq, Hkv, D, nq, NB, rr, sum, per_layer, i, got[i], want[i]);
        /* bad shapes are refused */
        sa.n_q = 0;
        assert_int_equal(score(g_be, &sa), KVMEM_ERR_INVALID_ARG);
        sa.n_q = nq;
        sa.head_dim = 80;
        assert_int_equal(score(g_be, &sa), KVMEM_ERR_UNSUPPORTED);
    }
    dev_free(dq);
    dev_free(dmn);
    dev_free(dmx);
    dev_free(dblk);
    dev_free(dout);
    free(q);
    free(amin);
    free(amax);
    free(want);
    free(got);
}

static void aabb_score_matches_a_double_reference_for_every_mode(void **state) {
    (void)state;
    NEED_GPU();
    /* 4 query heads per KV head in one CTA, scores in shared memory: all modes */
    check_aabb_score(2, 8, 2, 64, 5, 77, 0xffu);
    /* multi-head attention (a group of 1) */
    check_aabb_score(1, 8, 8, 64, 3, 50, 0xffu);
    /* Softmax modes only below: with thousands of blocks, f32 accumulation
     * can swap near-tied ranks against the double reference. A decode step
     * of Llama-3.1-8B's grouping (1 token, 4 heads per KV head: one tile) */
    check_aabb_score(2, 32, 8, 128, 1, 900, 0x55u);
    /* scores too large for shared memory (the workspace path), 160 rows in
     * three passes of four row tiles */
    check_aabb_score(1, 4, 1, 128, 40, 3000, 0x55u);
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static void topk_takes_the_highest_oldest_first_on_ties_in_chronological_order(void **state) {
    (void)state;
    NEED_GPU();
    kvmem_cuda_topk_fn topk;
    *(void **)(&topk) = proc(KVMEM_CUDA_PROC_TOPK);
    const int ns[] = {1, 7, 875, 5000, 70001};
    uint64_t rng = 5;
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
        const int n = ns[c];
        float *s = malloc((size_t)n * 4);
        for (int i = 0; i < n; i++) s[i] = (float)(int)(tu_next(&rng) % 50) * 0.25f - 3.0f; /* many ties */
        for (int i = 0; i < n; i += 7) s[i] = -INFINITY;                                   /* excluded */
        const int ks[] = {1, 16, 64, 2048};
        for (int kk = 0; kk < 4; kk++) {
            const int k = ks[kk];
            /* reference: order by (score desc, index asc), skip -inf, take k, sort by index */
            int *ord = malloc((size_t)n * 4), m = 0;
            for (int i = 0; i < n; i++)
                if (s[i] != -INFINITY) ord[m++] = i;
            for (int i = 1; i < m; i++) { /* insertion sort, stable on index */
                int v = ord[i], j = i - 1;
                while (j >= 0 && s[ord[j]] < s[v]) {
                    ord[j + 1] = ord[j];
                    j--;
                }
                ord[j + 1] = v;
            }
            int want_n = m < k ? m : k;
            qsort(ord, (size_t)want_n, 4, cmp_int);
            int kk_cap = k < n ? k : n;
            kvmem_buffer *ds = dev_from(s, (size_t)n * 4), *di = dev_zero((size_t)kk_cap * 4),
                         *dv = dev_zero((size_t)kk_cap * 4), *dn = dev_zero(4);
            kvmem_cuda_topk_args ta = {ref(ds), ref(di), ref(dv), ref(dn), n, k};
            cu_ok(topk(g_be, &ta));
            int got_n = -1;
            int *gi = malloc((size_t)kk_cap * 4);
            float *gv = malloc((size_t)kk_cap * 4);
            dev_read(dn, &got_n, 4);
            dev_read(di, gi, (size_t)kk_cap * 4);
            dev_read(dv, gv, (size_t)kk_cap * 4);
            assert_int_equal(got_n, want_n);
            for (int i = 0; i < want_n; i++) {
                if (gi[i] != ord[i]) fail_msg("n=%d k=%d: position %d: block %d, expected %d", n, k, i, gi[i], ord[i]);
                assert_true(gv[i] == s[ord[i]]);
            }
            dev_free(ds);
            dev_free(di);
            dev_free(dv);
            dev_free(dn);
            free(ord);
            free(gi);
            free(gv);
        }
        free(s);
    }
}

static void gather_rope_matches_kvmem_rope_apply(void **state) {
    (void)state;
    NEED_GPU();
    kvmem_cuda_gather_rope_fn gather;
    *(void **)(&gather) = proc(KVMEM_CUDA_PROC_GATHER_ROPE);
    for (int style = 0; style < 2; style++)
        for (int partial = 0; partial < 2; partial++) {
            kvmem_model_spec spec = tu_spec(1, 64);
            spec.rope_style = style ? KVMEM_ROPE_GPTJ : KVMEM_ROPE_NEOX;
            spec.rotary_dim = partial ? 32 : 0;
            spec.rope_theta = 500000.0;
            const int H = spec.n_kv_heads, D = spec.head_dim, rd = partial ? 32 : D, n_src = 300, M = 150;
            const size_t row = (size_t)H * D;
            float *k = malloc(n_src * row * 4), *v = malloc(n_src * row * 4);
            uint64_t rng = 9 + (uint64_t)style * 2 + (uint64_t)partial;
            for (size_t i = 0; i < n_src * row; i++) {
                k[i] = tu_normal(&rng);
                v[i] = tu_normal(&rng);
            }
            int64_t *rows = malloc(M * 8);
            int32_t *pos = malloc(M * 4);
            for (int i = 0; i < M; i++) {
                /* dead slots, and rows outside the source: both skipped */
                rows[i] = i % 10 == 3 ? -1 : i % 10 == 7 ? n_src + 3 : (int64_t)(tu_next(&rng) % n_src);
                pos[i] = 13000 + i;
            }
            /* inv_freq as the core computes it (no scaling): theta^(-2j/rd) */
            double inv[64];
            for (int j = 0; j < rd / 2; j++) inv[j] = pow(spec.rope_theta, -2.0 * j / rd);
            kvmem_buffer *dk = dev_from(k, n_src * row * 4), *dv = dev_from(v, n_src * row * 4);
            kvmem_buffer *dr = dev_from(rows, M * 8), *dp = dev_from(pos, M * 4), *di = dev_from(inv, (size_t)rd / 2 * 8);
            float sentinel = 12345.0f;
            float *init = malloc(M * row * 4);
            for (size_t i = 0; i < M * row; i++) init[i] = sentinel;
            kvmem_buffer *ok_ = dev_from(init, M * row * 4), *ov = dev_from(init, M * row * 4);
            kvmem_cuda_gather_args ga = {ref(dk), ref(dv), ref(dr), ref(dp), ref(di), ref(ok_), ref(ov),
                                         n_src, M, H, D, rd, spec.rope_style, 0.0f, KVMEM_F32, KVMEM_F32};
            cu_ok(gather(g_be, &ga));
            float *gk = malloc(M * row * 4), *gv = malloc(M * row * 4), *want = malloc(row * 4);
            dev_read(ok_, gk, M * row * 4);
            dev_read(ov, gv, M * row * 4);
            for (int i = 0; i < M; i++) {
                if (rows[i] < 0 || rows[i] >= n_src) { /* dead slot: not written */
                    for (size_t e = 0; e < row; e++) assert_true(gk[i * row + e] == sentinel && gv[i * row + e] == sentinel);
                    continue;
                }
                memcpy(want, k + rows[i] * row, row * 4);
                int32_t pp[8];
                for (int h = 0; h < H; h++) pp[h] = pos[i];
                assert_ok(kvmem_rope_apply(&spec, want, (size_t)H, (size_t)D, pp, 0));
                for (size_t e = 0; e < row; e++) {
                    if (fabsf(gk[i * row + e] - want[e]) > 2e-6f)
                        fail_msg("style %d rd %d token %d elem %zu: %.9g vs %.9g", style, rd, i, e, gk[i * row + e], want[e]);
                    assert_true(gv[i * row + e] == v[rows[i] * row + e]);
                }
            }
            ga.rotary_dim = D + 2;
            assert_int_equal(gather(g_be, &ga), KVMEM_ERR_INVALID_ARG);
            ga.rotary_dim = rd;
            ga.m = M + 1;
            assert_int_equal(gather(g_be, &ga), KVMEM_ERR_INVALID_ARG);
            dev_free(dk);
            dev_free(dv);
            dev_free(dr);
            dev_free(dp);
            dev_free(di);
            dev_free(ok_);
            dev_free(ov);
            free(k);
            free(v);
            free(rows);
            free(pos);
            free(init);
            free(gk);
            free(gv);
            free(want);
        }
}

static void attend_reference(const float *q, const uint16_t *k, const uint16_t *v, int n_slots, const int32_t *slot_map, int n_pos,
                             const int32_t *order, int n_tiles, int tile, int Hq, int Hkv, int D, double *out) {
    const int G = Hq / Hkv;
    for (int h = 0; h < Hq; h++) {
        const int g = h / G;
        double m = -INFINITY, l = 0;
        double *o = out + (size_t)h * D;
        for (int d = 0; d < D; d++) o[d] = 0;
        for (int t = 0; t < n_tiles; t++)
            for (int p = order[t] * tile; p < (order[t] + 1) * tile && p < n_pos; p++) {
                int s = slot_map[p];
                if (s < 0 || s >= n_slots) continue;
                double dot = 0;
                for (int d = 0; d < D; d++)
                    dot += (double)q[(size_t)h * D + d] * kvm_f16_to_f32(k[((size_t)s * Hkv + g) * D + d]);
                dot /= sqrt((double)D);
                double mn = fmax(m, dot), a = exp(m - mn), b = exp(dot - mn);
                for (int d = 0; d < D; d++) o[d] = o[d] * a + b * kvm_f16_to_f32(v[((size_t)s * Hkv + g) * D + d]);
                l = l * a + b;
                m = mn;
            }
        for (int d = 0; d < D; d++) o[d] /= l;
    }
}

/* dev_attend: tau 0 is full attention over the live slots (double
 * reference; visited = live tiles per stream); huge thresholds with
 * patience 1 stop every stream at its second live tile; the CPU backend's
 * dev_attend (when the build has it) agrees on outputs and visited. */
static void attend_equals_full_attention_and_stops_by_the_rule(void **state) {
    (void)state;
    NEED_GPU();
    const int Hq = 8, Hkv = 2, D = 128, n_pos = 1000, tile = 64, n_slots = 1200;
    const int n_tiles = (n_pos + tile - 1) / tile;
    float *q = malloc((size_t)Hq * D * 4);
    uint16_t *k = malloc((size_t)n_slots * Hkv * D * 2), *v = malloc((size_t)n_slots * Hkv * D * 2);
    int32_t *sm = malloc(n_pos * 4), *order = malloc(n_tiles * 4);
    uint64_t rng = 33;
    for (int i = 0; i < Hq * D; i++) q[i] = tu_normal(&rng);
    for (size_t i = 0; i < (size_t)n_slots * Hkv * D; i++) {
        k[i] = kvm_f32_to_f16(tu_normal(&rng));
        v[i] = kvm_f32_to_f16(tu_normal(&rng));
    }
    for (int p = 0; p < n_pos; p++) sm[p] = p % 9 == 4 ? -1 : (int32_t)((p * 7 + 3) % n_slots);
    for (int p = 128; p < 192; p++) sm[p] = -1; /* a whole dead tile */
    for (int t = 0; t < n_tiles; t++) order[t] = n_tiles - 1 - t; /* RECENT: newest first */
    kvmem_buffer *dq = dev_from(q, (size_t)Hq * D * 4), *dk = dev_from(k, (size_t)n_slots * Hkv * D * 2),
                 *dv = dev_from(v, (size_t)n_slots * Hkv * D * 2), *ds = dev_from(sm, n_pos * 4),
                 *dord = dev_from(order, n_tiles * 4), *dout = dev_zero((size_t)Hq * D * 4), *dvis = dev_zero(Hkv * 4);
    float *got = malloc((size_t)Hq * D * 4);
    double *want = malloc(sizeof(double) * Hq * D);
    int32_t vis[2];
    kvm_dev_attend_args aa;
    memset(&aa, 0, sizeof aa);
    aa.q = dq;
    aa.k = dk;
    aa.v = dv;
    aa.slot_map = ds;
    aa.order = dord;
    aa.out = dout;
    aa.visited = dvis;
    aa.n_slots = n_slots;
    aa.n_pos = n_pos;
    aa.n_q_heads = Hq;
    aa.n_kv_heads = Hkv;
    aa.head_dim = D;
    aa.tile = tile;
    aa.n_visit = n_tiles;
    aa.dtype = KVMEM_F16;
    aa.scale = 1.0f / sqrtf((float)D);
    aa.patience = 4;
    /* tau 0: full attention, every live tile visited */
    cu_ok(g_be->iface->dev_attend(g_be, &aa));
    dev_read(dout, got, (size_t)Hq * D * 4);
    dev_read(dvis, vis, Hkv * 4);
    attend_reference(q, k, v, n_slots, sm, n_pos, order, n_tiles, tile, Hq, Hkv, D, want);
    for (int i = 0; i < Hq * D; i++)
        if (fabs(got[i] - want[i]) > 1e-4) fail_msg("elem %d: %.6g vs %.6g", i, got[i], want[i]);
    for (int h = 0; h < Hkv; h++) assert_int_equal(vis[h], n_tiles - 1); /* the dead tile is skipped */
    /* huge thresholds, patience 1: the second live tile passes, so it stops there */
    aa.tau_s = 1e30f;
    aa.tau_d = 1e30f;
    aa.patience = 1;
    cu_ok(g_be->iface->dev_attend(g_be, &aa));
    dev_read(dout, got, (size_t)Hq * D * 4);
    dev_read(dvis, vis, Hkv * 4);
    attend_reference(q, k, v, n_slots, sm, n_pos, order, 2, tile, Hq, Hkv, D, want);
    for (int h = 0; h < Hkv; h++) assert_int_equal(vis[h], 2);
    for (int i = 0; i < Hq * D; i++)
        if (fabs(got[i] - want[i]) > 1e-4) fail_msg("early stop, elem %d: %.6g vs %.6g", i, got[i], want[i]);
    kvmem_backend *cpu = g_gpu->cpu;
    if (cpu->iface->dev_attend) { /* the CPU reference entry, on the same arguments */
        kvmem_buffer *c[7];
        const void *src[5] = {q, k, v, sm, order};
        const size_t nb[7] = {(size_t)Hq * D * 4, (size_t)n_slots * Hkv * D * 2, (size_t)n_slots * Hkv * D * 2,
                              (size_t)n_pos * 4, (size_t)n_tiles * 4, (size_t)Hq * D * 4, (size_t)Hkv * 4};
        for (int i = 0; i < 7; i++) {
            cu_ok(cpu->iface->buffer_alloc(cpu, nb[i], &c[i]));
            if (i < 5) cu_ok(cpu->iface->buffer_upload(cpu, c[i], 0, src[i], nb[i]));
        }
        kvm_dev_attend_args ca = aa;
        ca.q = c[0], ca.k = c[1], ca.v = c[2], ca.slot_map = c[3], ca.order = c[4], ca.out = c[5], ca.visited = c[6];
        cu_ok(cpu->iface->dev_attend(cpu, &ca));
        float *cref = malloc((size_t)Hq * D * 4);
        int32_t cvis[2];
        cu_ok(cpu->iface->buffer_download(cpu, c[5], 0, cref, (size_t)Hq * D * 4));
        cu_ok(cpu->iface->buffer_download(cpu, c[6], 0, cvis, Hkv * 4));
        assert_memory_equal(cvis, vis, Hkv * 4);
        for (int i = 0; i < Hq * D; i++)
            if (fabsf(got[i] - cref[i]) > 1e-5f) fail_msg("vs cpu, elem %d: %.6g vs %.6g", i, got[i], cref[i]);
        for (int i = 0; i < 7; i++) cpu->iface->buffer_free(cpu, c[i]);
        free(cref);
    }
    /* refused: bf16 KV, patience 0, visited too small, head_dim without a kernel */
    aa.dtype = KVMEM_BF16;
    assert_status(g_be->iface->dev_attend(g_be, &aa), KVMEM_ERR_INVALID_ARG, "F32 or F16");
    aa.dtype = KVMEM_F16;
    aa.patience = 0;
    assert_status(g_be->iface->dev_attend(g_be, &aa), KVMEM_ERR_INVALID_ARG, "patience");
    aa.patience = 1;
    aa.visited_off = 4;
    assert_status(g_be->iface->dev_attend(g_be, &aa), KVMEM_ERR_INVALID_ARG, "outside");
    aa.visited_off = 0;
    aa.head_dim = 512;
    aa.n_q_heads = 1;
    aa.n_kv_heads = 1;
    aa.n_slots = 1;
    assert_status(g_be->iface->dev_attend(g_be, &aa), KVMEM_ERR_UNSUPPORTED, "head_dim 512");
    dev_free(dq);
    dev_free(dk);
    dev_free(dv);
    dev_free(ds);
    dev_free(dord);
    dev_free(dout);
    dev_free(dvis);
    free(q);
    free(k);
    free(v);
    free(sm);
    free(order);
    free(got);
    free(want);
}

static void qmem_score_matches_the_rule_score(void **state) {
    (void)state;
    NEED_GPU();
    kvmem_cuda_qmem_score_fn qs;
    *(void **)(&qs) = proc(KVMEM_CUDA_PROC_QMEM_SCORE);
    const int L = 3, Hq = 4, Hkv = 2, D = 64, N = 333;
    float *mem = malloc((size_t)L * Hq * D * 4), *k = malloc((size_t)L * N * Hkv * D * 4), *rule = malloc(N * 4);
    uint64_t rng = 44;
    for (int i = 0; i < L * Hq * D; i++) mem[i] = tu_normal(&rng) * 0.2f;
    for (size_t i = 0; i < (size_t)L * N * Hkv * D; i++) k[i] = tu_normal(&rng);
    kvmem_buffer *dm = dev_from(mem, (size_t)L * Hq * D * 4), *dk = dev_from(k, (size_t)L * N * Hkv * D * 4),
                 *dr = dev_zero(N * 4);
    kvmem_cuda_qmem_args a = {ref(dm), ref(dk), ref(dr), L, Hq, Hkv, D, N, KVMEM_F32, 0.0f};
    cu_ok(qs(g_be, &a));
    dev_read(dr, rule, N * 4);
    double *want = calloc(N, sizeof(double)), *lg = malloc(sizeof(double) * N);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < Hq; h++) {
            int g = h / (Hq / Hkv);
            double m = -INFINITY, z = 0;
            for (int j = 0; j < N; j++) {
                double d = 0;
                for (int e = 0; e < D; e++)
                    d += (double)mem[((size_t)l * Hq + h) * D + e] * k[(((size_t)l * N + j) * Hkv + g) * D + e];
                lg[j] = d / sqrt((double)D);
                m = fmax(m, lg[j]);
            }
            for (int j = 0; j < N; j++) z += exp(lg[j] - m);
            for (int j = 0; j < N; j++) want[j] += exp(lg[j] - m) / z;
        }
    for (int j = 0; j < N; j++)
        if (fabs(rule[j] - want[j]) > 2e-3) fail_msg("position %d: %.6g vs %.6g", j, rule[j], want[j]);
    a.n_kv_heads = 3;
    assert_int_equal(qs(g_be, &a), KVMEM_ERR_INVALID_ARG);
    dev_free(dm);
    dev_free(dk);
    dev_free(dr);
    free(mem);
    free(k);
    free(rule);
    free(want);
    free(lg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(registry_reports_why_cuda_is_unusable_or_names_the_device),
        cmocka_unit_test(plugin_checks_the_backend_api_version_exactly),
        cmocka_unit_test(buffers_round_trip_through_the_staging_buffers),
        cmocka_unit_test(aabb_score_matches_a_double_reference_for_every_mode),
        cmocka_unit_test(topk_takes_the_highest_oldest_first_on_ties_in_chronological_order),
        cmocka_unit_test(gather_rope_matches_kvmem_rope_apply),
        cmocka_unit_test(attend_equals_full_attention_and_stops_by_the_rule),
        cmocka_unit_test(qmem_score_matches_the_rule_score),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
