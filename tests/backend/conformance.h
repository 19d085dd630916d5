/* Shared harness of the backend conformance programs (tests/backend/
 * test_backend*.c). Each program is run once per backend (argv[1]: "cpu",
 * "vulkan", "cuda") and compares that backend with the CPU backend and with
 * plain references written in the test. Ops are reached through the
 * context's backend table (internal headers): the public API does not
 * expose raw ops. Where the backend cannot run here (no loader, no device,
 * not built) every test prints "skipped: <reason>" and is skipped, and the
 * program exits 77 (ctest: skipped); a failing test makes it exit 1. */
#ifndef KVMEM_TEST_CONFORMANCE_H
#define KVMEM_TEST_CONFORMANCE_H

#include "testutil.h"
#include "backend/route/context.h"
#include "internal.h"

#include <stdio.h>
#include <string.h>

static const char *g_name = "vulkan";
static char g_why[512];
static kvmem_context *g_ctx;
static kvmem_backend *g_be, *g_cpu;

static inline int conf_setup(void **state) {
    (void)state;
    kvmem_context_params p = kvmem_context_default_params();
    p.backend = g_name;
    p.n_threads = 2;
    if (kvmem_context_create(&p, &g_ctx) != KVMEM_OK) {
        snprintf(g_why, sizeof g_why, "backend %s: %s", g_name, kvmem_last_error());
        g_ctx = NULL;
        return 0;
    }
    g_be = g_ctx->backend;
    g_cpu = g_ctx->cpu;
    return 0;
}

static inline int conf_teardown(void **state) {
    (void)state;
    kvmem_context_free(g_ctx);
    g_ctx = NULL;
    return 0;
}

/* Run a cmocka group for the backend named in argv[1]. */
#define CONF_MAIN(tests)                                                        \
    int main(int argc, char **argv) {                                           \
        if (argc > 1) g_name = argv[1];                                         \
        return tu_group_result(cmocka_run_group_tests_name(g_name, tests, conf_setup, conf_teardown), \
                               sizeof tests / sizeof tests[0]);                               \
    }

#define NEED_BACKEND()                                  \
    do {                                                \
        if (!g_ctx) {                                   \
            TU_SKIP("%s", g_why);      \
        }                                               \
    } while (0)

/* Skip (with the reason) when the backend under test lacks an optional entry. */
#define NEED_ENTRY(entry)                                                               \
    do {                                                                                \
        NEED_BACKEND();                                                                 \
        if (!g_be->iface->entry) {                                                      \
            TU_SKIP("backend %s has no %s entry", g_name, #entry);     \
        }                                                                               \
    } while (0)

/* ---- buffer helpers on one backend ---- */

static inline kvmem_buffer *balloc(kvmem_backend *be, size_t n) {
    kvmem_buffer *b = NULL;
    assert_ok(be->iface->buffer_alloc(be, n, &b));
    assert_non_null(b);
    return b;
}
static inline void bput(kvmem_backend *be, kvmem_buffer *b, size_t off, const void *src, size_t n) {
    assert_ok(be->iface->buffer_upload(be, b, off, src, n));
}
static inline void bget(kvmem_backend *be, const kvmem_buffer *b, size_t off, void *dst, size_t n) {
    assert_ok(be->iface->buffer_download(be, b, off, dst, n));
}
/* A buffer of n bytes holding src (or uninitialised when src is NULL). */
static inline kvmem_buffer *bnew(kvmem_backend *be, const void *src, size_t n) {
    kvmem_buffer *b = balloc(be, n);
    if (src) bput(be, b, 0, src, n);
    return b;
}

#endif
