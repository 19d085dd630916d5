#include <kvmem.h>
#include <stdio.h>

enum { L = 2, HQ = 4, HKV = 2, D = 8, T = 64, NQ = 3, M = 32 }; /* your model: layers, query/KV heads, head dim */

static int fail(const char *what) { return fprintf(stderr, "%s: %s\n", what, kvmem_last_error()), 1; }

int main(void) {
    static float k[L * T * HKV * D], v[L * T * HKV * D], q[NQ * L * HQ * D], mk[L * M * HKV * D], mv[L * M * HKV * D];
    for (int i = 0; i < L * T * HKV * D; i++) k[i] = (float)(i * 37 % 101) / 50 - 1, v[i] = (float)(i * 53 % 97) / 48 - 1;
    for (int i = 0; i < NQ * L * HQ * D; i++) q[i] = (float)(i * 29 % 89) / 44 - 1;
    kvmem_tensor kt, vt, qt, mkt, mvt; /* your engine's keys (before RoPE) and values of T tokens, a prompt's queries */
    kvmem_tensor_init(&kt, k, KVMEM_F32, 4, (int64_t[]){L, T, HKV, D});
    kvmem_tensor_init(&vt, v, KVMEM_F32, 4, (int64_t[]){L, T, HKV, D});
    kvmem_tensor_init(&qt, q, KVMEM_F32, 4, (int64_t[]){NQ, L, HQ, D});
    kvmem_tensor_init(&mkt, mk, KVMEM_F32, 4, (int64_t[]){L, M, HKV, D}); /* room for 2 blocks of 16 tokens */
    kvmem_tensor_init(&mvt, mv, KVMEM_F32, 4, (int64_t[]){L, M, HKV, D});

    kvmem_model_spec spec = kvmem_model_spec_default();
    spec.n_layers = L, spec.n_q_heads = HQ, spec.n_kv_heads = HKV, spec.head_dim = D;
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    rp.top_k = 2;
    kvmem_context *ctx;
    kvmem_pool *pool;
    kvmem_agent *agent;
    kvmem_retrieval *hits;
    if (kvmem_context_create(NULL, &ctx) || kvmem_pool_create(ctx, &spec, NULL, &pool) ||
        kvmem_agent_open(pool, "alice", &agent) || kvmem_retrieval_create(&hits))
        return fail("setup");
    if (kvmem_agent_append(agent, &kt, &vt, NULL) || kvmem_agent_flush(agent)) return fail("append"); /* 4 blocks */
    if (kvmem_retrieve(agent, &qt, &rp, hits)) return fail("retrieve"); /* the blocks the prompt attends to most */
    const int32_t *blocks;
    int32_t n;
    kvmem_retrieval_get(hits, 0, &blocks, NULL, &n);
    if (kvmem_gather(agent, blocks, n, 0, &mkt, &mvt)) return fail("gather"); /* keys re-rotated to 0..M-1 */
    printf("recalled blocks %d and %d: %d tokens of memory\n", blocks[0], blocks[1], M);
    if (kvmem_agent_open(pool, "../etc/passwd", &agent)) printf("refused: %s\n", kvmem_last_error());
    kvmem_retrieval_free(hits);
    kvmem_pool_free(pool); /* and its agents */
    kvmem_context_free(ctx);
    return 0;
}
