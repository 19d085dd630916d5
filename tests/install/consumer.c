/* A program outside the tree, built against an installed kvmem. */
#include <kvmem.h>
#include <stdio.h>

int main(void) {
    if (kvmem_version_number() != KVMEM_VERSION_NUMBER) return 1;
    kvmem_context *ctx = NULL;
    kvmem_pool *pool = NULL;
    kvmem_model_spec spec = kvmem_model_spec_default();
    if (kvmem_context_create(NULL, &ctx) != KVMEM_OK) return 1;
    if (kvmem_pool_create(ctx, &spec, NULL, &pool) != KVMEM_OK) return 1;
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
    printf("consumer ok (kvmem %s)\n", kvmem_version());
    return 0;
}
