/* Backend conformance: the same cases on a backend under test (argv[1]:
 * "vulkan", "cuda", or "cpu" for the reference itself) and on the CPU
 * backend, each output also checked against a plain reference written here.
 * Ops are reached through the context's backend table (internal headers),
 * since the public API does not expose raw ops.
 *
 * Tolerances, per op:
 *   buffers     exact bytes
 *   aabb_score  (Vulkan GEMM kernel by name) |I - I_ref| <=
 *               dim * 2^-23 * sum_d |q_d| max(|smax_d|, |smin_d|): the f32
 *               accumulation bound; and I >= max_i q.k_i (the AABB bound)
 * The device kernels (dev_*) have their own programs:
 * test_backend_{retrieve,attend,qmem}.c.
 *
 * Harness: conformance.h. */
#include "conformance.h"
#include "vk_ops.h"

#include <math.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- buffers ---- */

static void test_buffers_round_trip_exact_bytes(void **state) {
    (void)state;
    NEED_BACKEND();
    /* 9 MiB crosses the Vulkan staging chunk (8 MiB) when staged */
    const size_t sizes[] = {0, 1, 3, 4, 4097, (size_t)9 << 20};
    uint64_t rng = 1;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        unsigned char *src = malloc(n + 1), *dst = malloc(n + 1);
        for (size_t i = 0; i < n; i++) src[i] = (unsigned char)tu_next(&rng);
        kvmem_buffer *b = balloc(g_be, n);
        bput(g_be, b, 0, src, n);
        memset(dst, 0xab, n + 1);
        bget(g_be, b, 0, dst, n);
        assert_memory_equal(src, dst, n);
        assert_int_equal(dst[n], 0xab); /* nothing written past the range */
        if (n >= 4) { /* partial, unaligned ranges */
            size_t off = 1, len = n - 3;
            for (size_t i = 0; i < len; i++) src[off + i] ^= 0x5a;
            bput(g_be, b, off, src + off, len);
            bget(g_be, b, 0, dst, n);
            assert_memory_equal(src, dst, n);
        }
        void *hp = g_be->iface->buffer_host_ptr ? g_be->iface->buffer_host_ptr(g_be, b) : NULL;
        if (hp && n) assert_memory_equal(hp, src, n);
        const char *staged = getenv("KVMEM_VULKAN_STAGING");
        if (strcmp(g_name, "vulkan") == 0 && staged && strcmp(staged, "1") == 0)
            assert_null(hp); /* the staged run really stages */
        g_be->iface->buffer_free(g_be, b);
        free(src);
        free(dst);
    }
    g_be->iface->buffer_free(g_be, NULL); /* no-op */
    if (g_be != g_cpu) { /* (the CPU's malloc of this aborts under ASan by design) */
        kvmem_buffer *huge = NULL;
        assert_status(g_be->iface->buffer_alloc(g_be, SIZE_MAX / 2, &huge), KVMEM_ERR_NOMEM, "allocate");
        assert_null(huge);
    }
}

static void test_buffers_reject_out_of_range_and_change_nothing(void **state) {
    (void)state;
    NEED_BACKEND();
    unsigned char a[64], b[64];
    for (int i = 0; i < 64; i++) a[i] = (unsigned char)i;
    kvmem_buffer *buf = balloc(g_be, 64);
    bput(g_be, buf, 0, a, 64);
    unsigned char junk[64];
    memset(junk, 0xee, sizeof junk);
    assert_status(g_be->iface->buffer_upload(g_be, buf, 1, junk, 64), KVMEM_ERR_INVALID_ARG, "outside the buffer");
    assert_status(g_be->iface->buffer_upload(g_be, buf, 65, junk, 0), KVMEM_ERR_INVALID_ARG, "outside the buffer");
    assert_status(g_be->iface->buffer_upload(g_be, buf, SIZE_MAX, junk, 2), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(g_be->iface->buffer_download(g_be, buf, 60, b, 5), KVMEM_ERR_INVALID_ARG, "outside the buffer");
    bget(g_be, buf, 0, b, 64);
    assert_memory_equal(a, b, 64);
    g_be->iface->buffer_free(g_be, buf);
}

/* ---- registry ---- */

static void test_registry_reports_backend_and_auto_prefers_native_cpu(void **state) {
    (void)state;
    NEED_BACKEND();
    kvmem_backend_info info[8];
    size_t n = 0;
    assert_ok(kvmem_backends(info, 8, &n));
    int seen = 0;
    for (size_t i = 0; i < n && i < 8; i++) {
        if (strcmp(info[i].name, g_name) != 0) continue;
        seen = 1;
        assert_int_equal(info[i].available, 1);
        assert_true(strlen(info[i].detail) > 0);
        if (g_be->detail) assert_non_null(strstr(info[i].detail, g_be->detail) ? info[i].detail : NULL);
    }
    assert_true(seen || strcmp(g_name, "cpu") == 0);
    assert_string_equal(kvmem_context_backend(g_ctx), g_name);
    /* "auto": a CPU-type device (lavapipe) never wins over the native CPU backend */
    kvmem_context_params p = kvmem_context_default_params();
    kvmem_context *a = NULL;
    assert_ok(kvmem_context_create(&p, &a));
    if (g_be->cpu_device) assert_string_not_equal(kvmem_context_backend(a), g_name);
    assert_int_equal(a->backend->cpu_device, 0);
    kvmem_context_free(a);
    /* an op failing on the plugin leaves its message for kvmem_last_error() */
    kvmem_buffer *b = balloc(g_be, 4);
    assert_status(g_be->iface->buffer_upload(g_be, b, 8, "x", 1), KVMEM_ERR_INVALID_ARG, "outside the buffer");
    g_be->iface->buffer_free(g_be, b);
}

static void test_vulkan_device_choice_and_reasons(void **state) {
    (void)state;
    NEED_BACKEND();
    if (strcmp(g_name, "vulkan") != 0) skip();
    kvmem_context_params p = kvmem_context_default_params();
    p.backend = "vulkan";
    kvmem_context *c = NULL;
    /* by index and by name substring (any case) */
    setenv("KVMEM_VULKAN_DEVICE", "0", 1);
    assert_ok(kvmem_context_create(&p, &c));
    char name[64];
    snprintf(name, sizeof name, "%.4s", c->backend->detail); /* the device name starts the detail */
    kvmem_context_free(c);
    for (char *q = name; *q; q++) *q = (char)(*q >= 'a' && *q <= 'z' ? *q - 32 : *q);
    setenv("KVMEM_VULKAN_DEVICE", name, 1);
    assert_ok(kvmem_context_create(&p, &c));
    kvmem_context_free(c);
    setenv("KVMEM_VULKAN_DEVICE", "no-such-gpu-xyz", 1);
    assert_status(kvmem_context_create(&p, &c), KVMEM_ERR_UNSUPPORTED, "KVMEM_VULKAN_DEVICE='no-such-gpu-xyz'");
    assert_null(c);
    setenv("KVMEM_VULKAN_DEVICE", "99", 1);
    assert_status(kvmem_context_create(&p, &c), KVMEM_ERR_UNSUPPORTED, "no device");
    unsetenv("KVMEM_VULKAN_DEVICE");
    /* the plugin refuses a core of another backend API version, plainly */
    const char *dir = getenv("KVMEM_BACKEND_PATH");
    if (dir) {
        char path[1024];
        snprintf(path, sizeof path, "%s/libkvmem-vulkan.so", dir);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        assert_non_null(h);
        kvmem_backend_plugin_init_fn init;
        *(void **)(&init) = dlsym(h, KVMEM_BACKEND_PLUGIN_INIT);
        assert_non_null(*(void **)(&init));
        char why[256] = "";
        kvmem_backend *be = NULL;
        assert_int_equal(init(KVMEM_BACKEND_API_VERSION - 1, NULL, &be, why, sizeof why), KVMEM_ERR_UNSUPPORTED);
        assert_null(be);
        assert_non_null(strstr(why, "rebuild them together"));
        dlclose(h);
    }
}

/* ---- retrieval kernels reached by name (Vulkan, ahead of the table) ---- */

static void *proc(const char *name) {
    return g_be->iface->get_proc_address ? g_be->iface->get_proc_address(g_be, name) : NULL;
}

static kvmem_buffer *bfloat(const float *x, size_t n) {
    kvmem_buffer *b = balloc(g_be, n * 4);
    if (x) bput(g_be, b, 0, x, n * 4);
    return b;
}

/* Query layout [n_q][L][Hq][D], AABBs [L][Hkv][n_blocks][D] built from real
 * keys [L][Hkv][n_blocks][BS][D], scores [L*Hq][n_q][n_blocks]. */
static void score_case(kvm_vk_aabb_score_fn fn, size_t L, size_t Hq, size_t Hkv, size_t D, size_t n_q,
                       size_t n_blocks, size_t BS, size_t out_pad, uint64_t *rng) {
    size_t batch = L * Hq, g = Hq / Hkv;
    size_t nqe = n_q * L * Hq * D, nse = L * Hkv * n_blocks * D, nke = nse * BS;
    size_t noe = out_pad + batch * n_q * n_blocks;
    float *q = malloc(nqe * 4), *k = malloc(nke * 4), *mn = malloc(nse * 4), *mx = malloc(nse * 4);
    float *out = malloc(noe * 4);
    for (size_t i = 0; i < nqe; i++) q[i] = tu_normal(rng);
    for (size_t i = 0; i < nke; i++) k[i] = tu_normal(rng);
    for (size_t s = 0; s < L * Hkv * n_blocks; s++)
        for (size_t d = 0; d < D; d++) {
            float lo = INFINITY, hi = -INFINITY;
            for (size_t r = 0; r < BS; r++) {
                float x = k[(s * BS + r) * D + d];
                lo = fminf(lo, x);
                hi = fmaxf(hi, x);
            }
            mn[s * D + d] = lo;
            mx[s * D + d] = hi;
        }
    kvmem_buffer *bq = bfloat(q, nqe), *bmn = bfloat(mn, nse), *bmx = bfloat(mx, nse), *bo = bfloat(NULL, noe);
    float sentinel = -999.0f;
    for (size_t i = 0; i < out_pad; i++) bput(g_be, bo, i * 4, &sentinel, 4);
    kvm_vk_aabb_score_args a = {bq, bmn, bmx, bo, 0, 0, out_pad * 4, n_q, n_blocks, D, batch, g,
                                D, L * Hq * D, n_blocks * D, D, n_q * n_blocks, n_blocks};
    assert_ok(fn(g_be, &a));
    bget(g_be, bo, 0, out, noe * 4);
    for (size_t i = 0; i < out_pad; i++) assert_true(out[i] == sentinel);
    for (size_t b = 0; b < batch; b++)
        for (size_t r = 0; r < n_q; r++)
            for (size_t blk = 0; blk < n_blocks; blk++) {
                const float *qr = q + r * L * Hq * D + b * D;
                size_t s = (b / g) * n_blocks + blk;
                double ref = 0, mag = 0, best = -INFINITY;
                for (size_t d = 0; d < D; d++) {
                    double t1 = (double)qr[d] * mx[s * D + d], t2 = (double)qr[d] * mn[s * D + d];
                    ref += t1 > t2 ? t1 : t2;
                    mag += fabs((double)qr[d]) * fmax(fabs((double)mx[s * D + d]), fabs((double)mn[s * D + d]));
                }
                for (size_t i = 0; i < BS; i++) {
                    double dot = 0;
                    for (size_t d = 0; d < D; d++) dot += (double)qr[d] * k[(s * BS + i) * D + d];
                    best = dot > best ? dot : best;
                }
                double got = out[out_pad + (b * n_q + r) * n_blocks + blk], tol = (double)D * ldexp(1, -23) * mag;
                if (fabs(got - ref) > tol)
                    fail_msg("aabb_score b=%zu r=%zu blk=%zu: got %.9g, reference %.9g (tol %.3g)", b, r, blk, got,
                             ref, tol);
                if (got < best - tol) fail_msg("aabb_score below max_i q.k_i: %.9g < %.9g", got, best);
            }
    g_be->iface->buffer_free(g_be, bq);
    g_be->iface->buffer_free(g_be, bmn);
    g_be->iface->buffer_free(g_be, bmx);
    g_be->iface->buffer_free(g_be, bo);
    free(q);
    free(k);
    free(mn);
    free(mx);
    free(out);
}

static void test_vulkan_aabb_score_gemm_form_matches_reference(void **state) {
    (void)state;
    NEED_BACKEND();
    kvm_vk_aabb_score_fn fn;
    void *p = proc(KVM_VK_PROC_AABB_SCORE);
    if (!p) skip(); /* only the Vulkan plugin has it before the retrieval entries land */
    memcpy(&fn, &p, sizeof fn);
    uint64_t rng = 21;
    score_case(fn, 2, 4, 2, 64, 5, 37, 16, 0, &rng);   /* GQA 2:1, partial tiles */
    score_case(fn, 1, 2, 2, 40, 17, 33, 4, 3, &rng);   /* dim not a multiple of 16, output offset */
    score_case(fn, 1, 1, 1, 128, 1, 300, 16, 0, &rng); /* decode: one query row */
    /* bad input changes nothing */
    float z[8] = {0}, o[8];
    kvmem_buffer *b = bfloat(z, 8), *bo = bfloat(z, 8);
    kvm_vk_aabb_score_args a = {b, b, b, bo, 0, 0, 0, 1, 2, 4, 1, 1, 4, 4, 4, 4, 2, 2};
    assert_ok(fn(g_be, &a));
    a.n_q = 0;
    assert_status(fn(g_be, &a), KVMEM_ERR_INVALID_ARG, "empty");
    a.n_q = 1;
    a.n_blocks = 3;
    assert_status(fn(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    a.n_blocks = 2;
    a.out_off = 25 * 4;
    assert_status(fn(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    a.out_off = 2;
    assert_status(fn(g_be, &a), KVMEM_ERR_INVALID_ARG, "multiples of 4");
    a.out_off = 0;
    a.q_rs = SIZE_MAX;
    a.n_q = 2;
    assert_status(fn(g_be, &a), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(fn(g_be, NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    bget(g_be, bo, 0, o, sizeof o);
    for (int i = 0; i < 8; i++) assert_true(o[i] == 0.0f);
    g_be->iface->buffer_free(g_be, b);
    g_be->iface->buffer_free(g_be, bo);
}


/* ---- threads: ops on one backend from several threads, and contexts
 * created and freed concurrently (the plugin's shared instance) ---- */

static void *thread_ops(void *arg) {
    uint64_t rng = (uint64_t)(uintptr_t)arg;
    int bad = 0;
    for (int it = 0; it < 20 && !bad; it++) {
        /* dev_score_reduce of one layer of two heads: y[j] = (0 + x[j]) + x[257 + j],
         * exactly (one f32 order on every backend) */
        float x[2 * 257], y[257];
        for (int i = 0; i < 2 * 257; i++) x[i] = tu_normal(&rng);
        kvmem_buffer *a = NULL, *b = NULL;
        if (g_be->iface->buffer_alloc(g_be, sizeof x, &a) || g_be->iface->buffer_alloc(g_be, sizeof y, &b)) {
            bad = 1;
        } else {
            kvm_dev_score_reduce_args r = {a, b, 0, 0, 1, 2, 257, 1};
            /* a failing step says which and why: a race shows only on some machines */
            const char *step = NULL;
            if (g_be->iface->buffer_upload(g_be, a, 0, x, sizeof x) != KVMEM_OK) step = "upload";
            else if (g_be->iface->dev_score_reduce(g_be, &r) != KVMEM_OK) step = "dev_score_reduce";
            else if (g_be->iface->buffer_download(g_be, b, 0, y, sizeof y) != KVMEM_OK) step = "download";
            if (step) fprintf(stderr, "thread %u, round %d: %s failed: %s\n", (unsigned)(uintptr_t)arg, it, step, kvmem_last_error());
            bad |= step != NULL;
            for (int i = 0; i < 257 && !bad; i++) {
                float e = (0.0f + x[i]) + x[257 + i];
                if (memcmp(&y[i], &e, 4) != 0) {
                    fprintf(stderr, "thread %u, round %d: y[%d] = %.9g, expected %.9g\n", (unsigned)(uintptr_t)arg, it, i, y[i], e);
                    bad = 1;
                }
            }
        }
        g_be->iface->buffer_free(g_be, a);
        g_be->iface->buffer_free(g_be, b);
    }
    return (void *)(uintptr_t)bad;
}

static void *thread_contexts(void *arg) {
    (void)arg;
    int bad = 0;
    for (int it = 0; it < 3; it++) {
        kvmem_context_params p = kvmem_context_default_params();
        p.backend = g_name;
        p.n_threads = 1;
        kvmem_context *c = NULL;
        if (kvmem_context_create(&p, &c) != KVMEM_OK) {
            fprintf(stderr, "context thread, round %d: kvmem_context_create failed: %s\n", it, kvmem_last_error());
            bad = 1;
        }
        kvmem_context_free(c);
    }
    return (void *)(uintptr_t)bad;
}

static void test_threads_share_a_backend_and_create_contexts(void **state) {
    (void)state;
    NEED_BACKEND();
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, i < 3 ? thread_ops : thread_contexts, (void *)(i + 1)), 0);
    /* every thread joined before any assertion: a failure must not free the
     * backend under threads still using it */
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        void *r = NULL;
        bad |= pthread_join(t[i], &r) != 0 || r != NULL;
    }
    assert_int_equal(bad, 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_buffers_round_trip_exact_bytes),
    cmocka_unit_test(test_buffers_reject_out_of_range_and_change_nothing),
    cmocka_unit_test(test_registry_reports_backend_and_auto_prefers_native_cpu),
    cmocka_unit_test(test_vulkan_device_choice_and_reasons),
    cmocka_unit_test(test_vulkan_aabb_score_gemm_form_matches_reference),
    cmocka_unit_test(test_threads_share_a_backend_and_create_contexts),
};
CONF_MAIN(tests)
