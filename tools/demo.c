/* kvmem demo: retrieval at work on a synthetic multi-agent, multi-turn
 * session. Two agents talk about several topics; later turns ask about
 * earlier ones. For each question kvmem retrieves the history blocks the
 * question's queries attend to (AABB scoring), compares them with the EXACT
 * top-k (every key read), re-positions them with kvmem_gather, and counts the
 * tokens an engine would prefill with kvmem versus re-reading the history.
 * Deterministic for a seed (the generator is synth/synth.c); --json prints
 * the same as JSON lines. */
#include "args.h"
#include "commands.h"
#include "kvmem.h"
#include "demo_script.h"
#include "synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct demo_totals {
    int queries;
    double recall, precision;
    long long with_kvmem, without;
} demo_totals;

static int fail(const char *what, kvmem_status st) { return kvm_tool_error(what, (int)st); }

static void print_blocks(const int32_t *b, int32_t n, const int *block_topic, int asked) {
    for (int32_t i = 0; i < n; i++) printf(" %d%s", b[i], block_topic[b[i]] == asked ? "*" : "");
}

static void json_blocks(const char *key, const int32_t *b, int32_t n) {
    printf(",\"%s\":[", key);
    for (int32_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", b[i]);
    printf("]");
}

int demo_run(int json, uint64_t seed);

int demo_run(int json, uint64_t seed) {
    kvmem_context *ctx = NULL;
    kvmem_pool *pool = NULL;
    kvmem_status st = kvmem_context_create(NULL, &ctx);
    if (st != KVMEM_OK) return fail("context", st);
    kvmem_model_spec spec = kvm_demo_spec();
    kvmem_pool_params pp = kvmem_pool_default_params();
    if ((st = kvmem_pool_create(ctx, &spec, &pp, &pool)) != KVMEM_OK) {
        kvmem_context_free(ctx);
        return fail("pool", st);
    }
    kvm_synth syn;
    const size_t row = (size_t)spec.n_layers * (size_t)spec.n_kv_heads * (size_t)spec.head_dim;
    const int max_t = 256;
    float *k = malloc(row * max_t * sizeof(float)), *v = malloc(row * max_t * sizeof(float));
    float *q = malloc((size_t)max_t * (size_t)spec.n_layers * (size_t)spec.n_q_heads * (size_t)spec.head_dim * sizeof(float));
    int32_t *pos = malloc((size_t)max_t * (size_t)spec.n_kv_heads * sizeof(int32_t));
    int *block_topic = malloc(4096 * sizeof(int));
    kvmem_retrieval *ra = NULL, *re = NULL;
    if (!kvm_synth_init(&syn, &spec, KVM_DEMO_TOPICS, seed) || !k || !v || !q || !pos || !block_topic ||
        kvmem_retrieval_create(&ra) != KVMEM_OK || kvmem_retrieval_create(&re) != KVMEM_OK) {
        fprintf(stderr, "kvmem demo: out of memory\n");
        return 1;
    }
    uint64_t rng = seed ^ 0x5eedull;
    demo_totals tot = {0, 0, 0, 0, 0};
    if (json)
        printf("{\"type\":\"session\",\"seed\":%llu,\"model\":\"%s\",\"layers\":%d,\"q_heads\":%d,\"kv_heads\":%d,"
               "\"head_dim\":%d,\"block_size\":%d,\"storage\":\"%s\",\"top_k\":%d,\"mode\":\"aabb\",\"norm\":\"softmax\","
               "\"agg\":\"max\",\"scope\":\"global\",\"always_include\":[0]}\n",
               (unsigned long long)seed, spec.model_id, spec.n_layers, spec.n_q_heads, spec.n_kv_heads, spec.head_dim,
               pp.block_size, kvmem_dtype_name(pp.storage_dtype), KVM_DEMO_TOP_K);
    else
        printf("kvmem demo: retrieval over a synthetic multi-agent session (seed %llu)\n"
               "model %s: %d layers, %d query / %d KV heads, head_dim %d; block size %d, %s storage\n"
               "Each question retrieves the top %d history blocks (block 0, the system prompt, always included)\n"
               "by AABB scoring, and is checked against the EXACT top %d (every key read). * = block about the\n"
               "asked topic.\n",
               (unsigned long long)seed, spec.model_id, spec.n_layers, spec.n_q_heads, spec.n_kv_heads, spec.head_dim,
               pp.block_size, kvmem_dtype_name(pp.storage_dtype), KVM_DEMO_TOP_K, KVM_DEMO_TOP_K);

    for (int a = 0; a < kvm_demo_n_agents; a++) {
        const kvm_demo_agent *da = &kvm_demo_agents[a];
        kvmem_agent *ag = NULL;
        if ((st = kvmem_agent_open(pool, da->id, &ag)) != KVMEM_OK) return fail("open", st);
        if (!json)
            printf("\n== agent %s (%s) ==\n", da->id, da->rotated ? "keys handed over post-RoPE, de-rotated by kvmem" : "raw keys");
        int32_t at = 0;
        for (int s = 0; s < da->n_steps; s++) {
            const kvm_demo_step *step = &da->steps[s];
            kvmem_agent_info ai;
            kvmem_agent_get_info(ag, &ai);
            if (!step->ask) {
                if (!json)
                    printf("turn %2d  %-20s %4d tokens -> memory (blocks %d..", s + 1, kvm_demo_topic_name[step->topic],
                           step->tokens, ai.n_sealed);
                if ((st = kvm_demo_add_turn(ag, &spec, &syn, step->topic, step->tokens, da->rotated, at, &rng, k, v, pos)) != KVMEM_OK)
                    return fail("append", st);
                at += step->tokens;
                kvmem_agent_info a2;
                kvmem_agent_get_info(ag, &a2);
                for (int32_t b = ai.n_sealed; b < a2.n_sealed && b < 4096; b++) block_topic[b] = step->topic;
                if (!json) printf("%d)\n", a2.n_sealed - 1);
                continue;
            }
            /* A question about an earlier topic: its query rows find the memory. */
            const int nq = step->tokens;
            kvm_synth_query(&syn, step->topic, nq, &rng, q);
            int64_t qs[4] = {nq, spec.n_layers, spec.n_q_heads, spec.head_dim};
            kvmem_tensor qt;
            kvmem_tensor_init(&qt, q, KVMEM_F32, 4, qs);
            const int32_t sys_block = 0;
            kvmem_retrieve_params rp = kvmem_retrieve_default_params();
            rp.top_k = KVM_DEMO_TOP_K;
            rp.always_include = &sys_block;
            rp.n_always_include = 1;
            if ((st = kvmem_retrieve(ag, &qt, &rp, ra)) != KVMEM_OK) return fail("retrieve", st);
            rp.mode = KVMEM_RETRIEVE_EXACT;
            if ((st = kvmem_retrieve(ag, &qt, &rp, re)) != KVMEM_OK) return fail("retrieve exact", st);
            const int32_t *rb, *eb;
            const float *rs;
            int32_t rn, en;
            int64_t mem_tokens = 0;
            kvmem_retrieval_get(ra, 0, &rb, &rs, &rn);
            kvmem_retrieval_get(re, 0, &eb, NULL, &en);
            kvmem_retrieval_n_tokens(ra, 0, &mem_tokens);
            int hit = 0, on_topic = 0, topic_blocks = 0;
            for (int32_t i = 0; i < rn; i++) {
                for (int32_t j = 0; j < en; j++) hit += rb[i] == eb[j];
                on_topic += block_topic[rb[i]] == step->topic;
            }
            for (int32_t b = 0; b < ai.n_sealed; b++) topic_blocks += block_topic[b] == step->topic;
            double recall = en ? (double)hit / en : 1.0;
            /* precision over what could be on topic: min(k - 1 forced, topic blocks) */
            int possible = topic_blocks < KVM_DEMO_TOP_K - 1 ? topic_blocks : KVM_DEMO_TOP_K - 1;
            double precision = possible ? (double)on_topic / possible : 1.0;
            /* Re-position the retrieved memory at 0..M-1 (the question follows at M). */
            int64_t gs[4] = {spec.n_layers, mem_tokens, spec.n_kv_heads, spec.head_dim};
            uint16_t *gk = malloc((size_t)mem_tokens * row * 2), *gv = malloc((size_t)mem_tokens * row * 2);
            kvmem_tensor gkt, gvt;
            kvmem_tensor_init(&gkt, gk, KVMEM_F16, 4, gs);
            kvmem_tensor_init(&gvt, gv, KVMEM_F16, 4, gs);
            if (!gk || !gv || (st = kvmem_gather(ag, rb, rn, 0, &gkt, &gvt)) != KVMEM_OK) return fail("gather", st);
            free(gk);
            free(gv);
            long long with = (long long)nq, without = (long long)ai.n_tokens + nq;
            tot.queries++;
            tot.recall += recall;
            tot.precision += precision;
            tot.with_kvmem += with;
            tot.without += without;
            if (json) {
                printf("{\"type\":\"query\",\"agent\":\"%s\",\"turn\":%d,\"topic\":%d,\"topic_name\":\"%s\",\"query_tokens\":%d,"
                       "\"history_tokens\":%lld,\"history_blocks\":%d",
                       da->id, s + 1, step->topic, kvm_demo_topic_name[step->topic], nq, (long long)ai.n_tokens, ai.n_sealed);
                json_blocks("retrieved", rb, rn);
                printf(",\"scores\":[");
                for (int32_t i = 0; i < rn; i++) printf("%s%.4f", i ? "," : "", (double)rs[i]);
                printf("]");
                json_blocks("exact", eb, en);
                printf(",\"recall\":%.4f,\"on_topic\":%d,\"topic_precision\":%.4f,\"memory_tokens\":%lld,"
                       "\"prefill_with_kvmem\":%lld,\"prefill_without\":%lld,\"gathered_bytes\":%lld}\n",
                       recall, on_topic, precision, (long long)mem_tokens, with, without,
                       (long long)(2 * mem_tokens * (int64_t)row * 2));
            } else {
                printf("turn %2d  asks about \"%s\" (%d query tokens), history %lld tokens in %d blocks\n", s + 1,
                       kvm_demo_topic_name[step->topic], nq, (long long)ai.n_tokens, ai.n_sealed);
                printf("         retrieved (AABB):");
                print_blocks(rb, rn, block_topic, step->topic);
                printf("\n         exact top-%d:     ", KVM_DEMO_TOP_K);
                print_blocks(eb, en, block_topic, step->topic);
                printf("\n         recall %.2f, %d/%d on topic; %lld memory tokens re-positioned at 0..%lld (f16 K/V)\n", recall,
                       on_topic, possible, (long long)mem_tokens, (long long)mem_tokens - 1);
                printf("         prefill: %lld tokens with kvmem vs %lld re-reading the history (%.1fx fewer)\n", with, without,
                       (double)without / (double)with);
            }
            /* the question and its answer join the memory */
            if ((st = kvm_demo_add_turn(ag, &spec, &syn, step->topic, nq + KVM_DEMO_ANSWER_TOKENS, da->rotated, at, &rng, k, v, pos)) != KVMEM_OK)
                return fail("append", st);
            at += nq + KVM_DEMO_ANSWER_TOKENS;
            kvmem_agent_info a2;
            kvmem_agent_get_info(ag, &a2);
            for (int32_t b = ai.n_sealed; b < a2.n_sealed && b < 4096; b++) block_topic[b] = step->topic;
        }
        kvmem_agent_close(ag);
    }
    kvmem_pool_info pi;
    kvmem_pool_get_info(pool, &pi);
    double mr = tot.queries ? tot.recall / tot.queries : 0, mp = tot.queries ? tot.precision / tot.queries : 0;
    if (json)
        printf("{\"type\":\"summary\",\"agents\":%d,\"queries\":%d,\"mean_recall\":%.4f,\"mean_topic_precision\":%.4f,"
               "\"prefill_with_kvmem\":%lld,\"prefill_without\":%lld,\"prefill_reduction\":%.2f,\"pool_bytes\":%llu}\n",
               pi.n_agents, tot.queries, mr, mp, tot.with_kvmem, tot.without,
               tot.with_kvmem ? (double)tot.without / (double)tot.with_kvmem : 0.0, (unsigned long long)pi.used_bytes);
    else
        printf("\nsummary: %d agents, %d questions; AABB top-%d recall vs EXACT %.2f, on-topic %.2f;\n"
               "prefill %lld tokens with kvmem vs %lld without (%.1fx fewer); pool holds %.1f KiB\n"
               "(The retrieved memory is reused as KV, not re-prefilled: the question's own tokens are all an engine computes.)\n",
               pi.n_agents, tot.queries, KVM_DEMO_TOP_K, mr, mp, tot.with_kvmem, tot.without,
               tot.with_kvmem ? (double)tot.without / (double)tot.with_kvmem : 0.0, (double)pi.used_bytes / 1024.0);
    kvmem_retrieval_free(ra);
    kvmem_retrieval_free(re);
    free(block_topic);
    free(k);
    free(v);
    free(q);
    free(pos);
    kvm_synth_free(&syn);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
    return 0;
}

int demo_view(uint64_t seed, const char *agent_id, int turn, int norm, int agg, int top_k, int block_size,
              float tau_s, float tau_d);

static int demo_usage(FILE *f) {
    fprintf(f, "usage: kvmem demo [--json] [--seed N]\n"
               "       kvmem demo --json --agent ID --turn N [--mode softmax-max|softmax-sum|rr-max|rr-sum]\n"
               "                  [--k K] [--block-size BS] [--tau-s X] [--tau-d Y] [--seed N]\n"
               "  (the second form prints what the browser demo shows for one question)\n");
    return f == stdout ? 0 : KVM_EXIT_USAGE;
}

/* The demo agent called `id`, or NULL. */
static const kvm_demo_agent *demo_agent(const char *id) {
    for (int a = 0; a < kvm_demo_n_agents; a++)
        if (strcmp(kvm_demo_agents[a].id, id) == 0) return &kvm_demo_agents[a];
    return NULL;
}

static void list_questions(void) {
    for (int a = 0; a < kvm_demo_n_agents; a++)
        for (int i = 0; i < kvm_demo_agents[a].n_steps; i++)
            if (kvm_demo_agents[a].steps[i].ask) fprintf(stderr, " %s %d", kvm_demo_agents[a].id, i + 1);
}

static int cmd_demo(int argc, char **argv) {
    enum { O_SEED = 256, O_AGENT, O_TURN, O_K, O_BLOCK_SIZE, O_TAU_S, O_TAU_D, O_MODE };
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},         {"seed", required_argument, NULL, O_SEED},
        {"agent", required_argument, NULL, O_AGENT}, {"turn", required_argument, NULL, O_TURN},
        {"k", required_argument, NULL, O_K},       {"block-size", required_argument, NULL, O_BLOCK_SIZE},
        {"tau-s", required_argument, NULL, O_TAU_S}, {"tau-d", required_argument, NULL, O_TAU_D},
        {"mode", required_argument, NULL, O_MODE}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int json = 0, turn = 0, norm = 0, agg = 0, k = KVM_DEMO_TOP_K, bs = 16;
    const char *agent = NULL, *view_opt = NULL; /* view_opt: an option only the one-question view takes */
    uint64_t seed = 42;
    kvmem_attend_params art = kvmem_attend_default_params();
    float tau_s = art.tau_s, tau_d = art.tau_d;
    for (int c; (c = kvm_getopt("demo", argc, argv, opts)) != -1;) {
        int ok = 1;
        switch (c) {
        case 'j': json = 1; break;
        case 'h': return demo_usage(stdout);
        case O_SEED: ok = kvm_arg_u64("demo", "--seed", optarg, &seed); break;
        case O_AGENT: agent = optarg; break;
        case O_TURN: ok = kvm_arg_int("demo", "--turn", optarg, 1, KVM_DEMO_MAX_STEPS, &turn); break;
        case O_K: ok = kvm_arg_int("demo", "--k", optarg, 1, 64, &k), view_opt = "--k"; break;
        case O_BLOCK_SIZE:
            /* the pool's rule (kvmem.h): a power of two in [1, 4096] */
            ok = kvm_arg_int("demo", "--block-size", optarg, 1, 4096, &bs), view_opt = "--block-size";
            if (ok && (bs & (bs - 1))) {
                fprintf(stderr, "kvmem demo: --block-size: %d is not a power of two\n", bs);
                ok = 0;
            }
            break;
        case O_TAU_S: ok = kvm_arg_float("demo", "--tau-s", optarg, 0, 1e30, &tau_s), view_opt = "--tau-s"; break;
        case O_TAU_D: ok = kvm_arg_float("demo", "--tau-d", optarg, 0, 1e30, &tau_d), view_opt = "--tau-d"; break;
        case O_MODE:
            view_opt = "--mode";
            if (strcmp(optarg, "softmax-max") == 0) norm = 0, agg = 0;
            else if (strcmp(optarg, "softmax-sum") == 0) norm = 0, agg = 1;
            else if (strcmp(optarg, "rr-max") == 0) norm = 1, agg = 0;
            else if (strcmp(optarg, "rr-sum") == 0) norm = 1, agg = 1;
            else {
                fprintf(stderr, "kvmem demo: --mode: '%s' is not one of softmax-max, softmax-sum, rr-max, rr-sum\n", optarg);
                ok = 0;
            }
            break;
        default: ok = 0;
        }
        if (!ok) return KVM_EXIT_USAGE;
    }
    if (!kvm_args_at_most("demo", argc, argv, optind, 0)) return KVM_EXIT_USAGE;
    if (!agent && !turn) {
        if (view_opt) {
            fprintf(stderr, "kvmem demo: %s applies to the one-question view only (--json --agent ID --turn N)\n", view_opt);
            return KVM_EXIT_USAGE;
        }
        return demo_run(json, seed);
    }
    /* the one-question view: every setting checked before any work */
    const char *missing = !json ? "--json" : !agent ? "--agent" : !turn ? "--turn" : NULL;
    if (missing) {
        fprintf(stderr, "kvmem demo: the one-question view needs %s (kvmem demo --json --agent ID --turn N)\n", missing);
        return KVM_EXIT_USAGE;
    }
    const kvm_demo_agent *da = demo_agent(agent);
    if (!da) {
        fprintf(stderr, "kvmem demo: --agent: '%s' is not an agent of the demo (", agent);
        for (int a = 0; a < kvm_demo_n_agents; a++) fprintf(stderr, "%s%s", a ? ", " : "", kvm_demo_agents[a].id);
        fprintf(stderr, ")\n");
        return KVM_EXIT_USAGE;
    }
    if (turn > da->n_steps || !da->steps[turn - 1].ask) {
        fprintf(stderr, "kvmem demo: --turn: agent '%s' asks no question at turn %d (questions:", agent, turn);
        list_questions();
        fprintf(stderr, ")\n");
        return KVM_EXIT_USAGE;
    }
    return demo_view(seed, agent, turn, norm, agg, k, bs, tau_s, tau_d);
}

const kvm_command kvm_cmd_demo = {"demo", "retrieval on a synthetic multi-agent, multi-turn session (--json, --seed N)",
                                  cmd_demo};
