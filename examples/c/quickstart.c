#include <kvmem.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    kvmem_context *ctx;
    kvmem_pool *pool;
    kvmem_agent *agent;
    if (kvmem_context_create(NULL, &ctx) != KVMEM_OK) return 1;

    kvmem_model_spec spec = kvmem_model_spec_default(); /* describe your model */
    spec.n_layers = 2;
    spec.n_q_heads = 4;
    spec.n_kv_heads = 2;
    spec.head_dim = 8;
    kvmem_pool_params params = kvmem_pool_default_params(); /* block size 16, f16 storage */
    if (kvmem_pool_create(ctx, &spec, &params, &pool) != KVMEM_OK) return 1;
    if (kvmem_agent_open(pool, "assistant-1", &agent) != KVMEM_OK) return 1;

    /* The KV your engine produced for 20 tokens: [n_layers][T][n_kv_heads][head_dim]. */
    enum { T = 20 };
    static float k[2 * T * 2 * 8], v[2 * T * 2 * 8];
    for (int i = 0; i < 2 * T * 2 * 8; i++) k[i] = v[i] = (float)(i % 7) - 3.0f;
    int64_t shape[4] = {2, T, 2, 8};
    kvmem_tensor kt, vt;
    kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape);
    if (kvmem_agent_append(agent, &kt, &vt, NULL) != KVMEM_OK) {
        fprintf(stderr, "append: %s\n", kvmem_last_error());
        return 1;
    }

    kvmem_agent_info info;
    kvmem_agent_get_info(agent, &info);
    printf("%lld tokens in %d blocks (%d sealed)\n", (long long)info.n_tokens, info.n_blocks, info.n_sealed);

    /* Bad input is refused with a status and a message, never a crash. */
    if (kvmem_agent_open(pool, "../etc/passwd", &agent) != KVMEM_OK)
        printf("refused: %s\n", kvmem_last_error());

    kvmem_pool_free(pool); /* frees its agents too */
    kvmem_context_free(ctx);
    return 0;
}
