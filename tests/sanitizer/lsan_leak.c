/* Test-only: shows that the ASan stage still sees leaks with a Vulkan driver
 * loaded in the process (tests/checks/lsan_reports_leaks.sh runs it).
 *   lsan_leak none     load Vulkan ("vulkan", then "auto"), free everything: no report
 *   lsan_leak program  the same, then leak a block of this program's own
 *   lsan_leak library  the same, then leak a pool (memory libkvmem allocated) */
#include <kvmem.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* noinline so the leak's stack names this function. */
__attribute__((noinline)) static void *leak_on_purpose(size_t n) {
    char *p = malloc(n);
    if (p) memset(p, 0x5a, n);
    return p;
}

static void *volatile g_sink; /* written then cleared: the pointer is lost */

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "none";
    const char *backends[] = {"vulkan", "auto"};
    for (int i = 0; i < 2; i++) {
        kvmem_context_params cp = kvmem_context_default_params();
        cp.backend = backends[i];
        kvmem_context *ctx = NULL;
        if (kvmem_context_create(&cp, &ctx) == KVMEM_OK) {
            printf("context %s: backend %s\n", backends[i], kvmem_context_backend(ctx));
            kvmem_context_free(ctx);
        } else {
            printf("context %s: %s\n", backends[i], kvmem_last_error());
        }
    }
    if (strcmp(mode, "program") == 0) {
        g_sink = leak_on_purpose(4096);
        g_sink = NULL;
    } else if (strcmp(mode, "library") == 0) {
        kvmem_context *ctx = NULL;
        kvmem_pool *pool = NULL;
        kvmem_model_spec spec = kvmem_model_spec_default();
        if (kvmem_context_create(NULL, &ctx) != KVMEM_OK ||
            kvmem_pool_create(ctx, &spec, NULL, &pool) != KVMEM_OK) {
            printf("setup failed: %s\n", kvmem_last_error());
            return 2;
        }
        g_sink = pool; /* neither the pool nor the context is freed */
        g_sink = ctx;
        g_sink = NULL;
    } else if (strcmp(mode, "none") != 0) {
        fprintf(stderr, "usage: lsan_leak none|program|library\n");
        return 2;
    }
    return 0;
}
