/* kvmem demo: a synthetic multi-turn, multi-agent session appended to a
 * pool, with what the pool holds afterwards: agents, blocks and the AABB
 * statistics that retrieval will rank blocks by. */
#include "commands.h"
#include "kvmem.h"
#include "synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEMO_TURNS 4

typedef struct demo_agent {
    const char *id;
    int rotated; /* append post-RoPE keys with positions (kvmem de-rotates them) */
    int topics[DEMO_TURNS];
    int lens[DEMO_TURNS];
} demo_agent;

static const demo_agent k_agents[] = {
    {"alice", 0, {0, 1, 2, 0}, {40, 56, 33, 48}},
    {"bob", 1, {3, 4, 3, 5}, {64, 21, 47, 30}},
};

int demo_run(int json, uint64_t seed);

int demo_run(int json, uint64_t seed) {
    kvmem_context *ctx = NULL;
    kvmem_pool *pool = NULL;
    kvmem_status st = kvmem_context_create(NULL, &ctx);
    if (st != KVMEM_OK) return kvm_tool_error("context", st);
    kvmem_model_spec spec = kvmem_model_spec_default();
    spec.n_layers = 4;
    spec.n_q_heads = 8;
    spec.n_kv_heads = 2;
    spec.head_dim = 64;
    spec.rope_theta = 10000.0;
    snprintf(spec.model_id, sizeof spec.model_id, "synthetic-4L-8q2kv-64");
    kvmem_pool_params pp = kvmem_pool_default_params();
    if ((st = kvmem_pool_create(ctx, &spec, &pp, &pool)) != KVMEM_OK) {
        kvmem_context_free(ctx);
        return kvm_tool_error("pool", st);
    }
    kvm_synth syn;
    if (!kvm_synth_init(&syn, &spec, 6, seed)) {
        fprintf(stderr, "kvmem demo: out of memory\n");
        return 1;
    }
    const size_t row = (size_t)spec.n_layers * (size_t)spec.n_kv_heads * (size_t)spec.head_dim;
    float *k = malloc(row * 64 * sizeof(float)), *v = malloc(row * 64 * sizeof(float));
    int32_t *pos = malloc(64 * sizeof(int32_t));
    uint64_t rng = seed ^ 0x5eedull;
    if (!json)
        printf("kvmem demo — synthetic session: %d layers, %d/%d heads, head_dim %d, block size %d, %s storage\n\n",
               spec.n_layers, spec.n_q_heads, spec.n_kv_heads, spec.head_dim, pp.block_size,
               kvmem_dtype_name(pp.storage_dtype));
    for (size_t a = 0; a < sizeof k_agents / sizeof k_agents[0]; a++) {
        const demo_agent *da = &k_agents[a];
        kvmem_agent *ag = NULL;
        if ((st = kvmem_agent_open(pool, da->id, &ag)) != KVMEM_OK) return kvm_tool_error("open", st);
        int32_t at = 0;
        for (int t = 0; t < DEMO_TURNS; t++) {
            int32_t T = da->lens[t];
            kvm_synth_tokens(&syn, da->topics[t], T, &rng, k, v);
            kvmem_append_params ap = kvmem_append_default_params();
            if (da->rotated) {
                /* what an engine holds: keys already rotated at their positions */
                for (int32_t i = 0; i < T; i++) pos[i] = at + i;
                for (int32_t l = 0; l < spec.n_layers; l++)
                    for (int32_t i = 0; i < T; i++) {
                        int32_t p1[2] = {pos[i], pos[i]};
                        kvmem_rope_apply(&spec, k + ((size_t)l * (size_t)T + (size_t)i) * (size_t)spec.n_kv_heads * (size_t)spec.head_dim,
                                         (size_t)spec.n_kv_heads, (size_t)spec.head_dim, p1, 0);
                    }
                ap.positions = pos;
                ap.keys_rotated = 1;
            }
            int64_t shape[4] = {spec.n_layers, T, spec.n_kv_heads, spec.head_dim};
            kvmem_tensor kt, vt;
            kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape);
            kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape);
            if ((st = kvmem_agent_append(ag, &kt, &vt, &ap)) != KVMEM_OK) return kvm_tool_error("append", st);
            at += T;
        }
        kvmem_agent_close(ag);
    }

    /* What the pool holds. */
    kvmem_pool_info pi;
    kvmem_pool_get_info(pool, &pi);
    if (!json) printf("pool: %d agents, %.1f KiB of KV and AABB\n\n", pi.n_agents, (double)pi.used_bytes / 1024.0);
    const size_t box = (size_t)spec.n_layers * (size_t)spec.n_kv_heads * (size_t)spec.head_dim;
    float *mn = malloc(box * sizeof(float)), *mx = malloc(box * sizeof(float));
    for (int32_t i = 0; i < pi.n_agents; i++) {
        char id[KVMEM_MAX_AGENT_ID + 1];
        kvmem_pool_agent_id(pool, i, id, sizeof id, NULL);
        kvmem_agent *ag = NULL;
        kvmem_agent_open(pool, id, &ag);
        kvmem_agent_info ai;
        kvmem_agent_get_info(ag, &ai);
        if (json) {
            printf("{\"agent\":\"%s\",\"tokens\":%lld,\"blocks\":%d,\"sealed\":%d,\"bytes\":%llu,\"block_stats\":[", id,
                   (long long)ai.n_tokens, ai.n_blocks, ai.n_sealed, (unsigned long long)ai.bytes);
        } else {
            printf("agent %-6s %4lld tokens  %2d blocks (%d sealed, %s)  %.1f KiB\n", id, (long long)ai.n_tokens,
                   ai.n_blocks, ai.n_sealed, ai.n_blocks > ai.n_sealed ? "1 open tail" : "no tail",
                   (double)ai.bytes / 1024.0);
            printf("  block  tokens      mean box width  widest channel  (per layer/head, raw keys)\n");
        }
        for (int32_t b = 0; b < ai.n_sealed; b++) {
            kvmem_block_info bi;
            kvmem_agent_block_info(ag, b, &bi);
            kvmem_agent_block_aabb(ag, b, mn, mx);
            double w = 0, wmax = 0;
            for (size_t d = 0; d < box; d++) {
                double wd = (double)mx[d] - (double)mn[d];
                w += wd;
                wmax = fmax(wmax, wd);
            }
            w /= (double)box;
            if (json)
                printf("%s{\"block\":%d,\"first\":%lld,\"tokens\":%d,\"mean_width\":%.4f,\"max_width\":%.4f}",
                       b ? "," : "", b, (long long)bi.first_token, bi.n_tokens, w, wmax);
            else
                printf("  %5d  %4lld-%-4lld %14.3f  %14.3f\n", b, (long long)bi.first_token,
                       (long long)(bi.first_token + bi.n_tokens - 1), w, wmax);
        }
        if (json) printf("]}\n");
        else printf("\n");
        kvmem_agent_close(ag);
    }
    if (!json)
        printf("Every sealed block keeps an axis-aligned bounding box of its raw keys (min and max per channel):\n"
               "retrieval scores a query against these boxes instead of reading every key.\n");
    free(mn);
    free(mx);
    free(k);
    free(v);
    free(pos);
    kvm_synth_free(&syn);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
    return 0;
}

static int cmd_demo(int argc, char **argv) {
    int json = 0;
    uint64_t seed = 42;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) json = 1;
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: kvmem demo [--json] [--seed N]\n");
            return 2;
        }
    }
    return demo_run(json, seed);
}

const kvm_command kvm_cmd_demo = {"demo", "a synthetic multi-agent session: agents, blocks, AABBs (--json)", cmd_demo};
