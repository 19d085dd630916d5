/* tinyllm demo: a story agent whose memory is kvmem, in text a person reads.
 *
 * Phase 1 (one process): sessions of a story arrive as text. Each session
 * the engine asks kvmem for memory (MemArt: the session's queries against
 * the blocks' AABBs, plus the live context), prefills only the new text on
 * it and continues the story; the session and the continuation go into the
 * agent. For comparison the same session also runs on full context and on a
 * recent window of the same budget. Then the agent is saved to one file.
 * Phase 2 (a new process): the agent is loaded from the file and a last
 * session asks about something said sessions ago. Its prompt logits must
 * equal the ones phase 1 computed before saving.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "cli.h"
#include "internal.h"

enum { GEN = 20, PROBE_WINDOW = 32, MIN_BUDGET = 32, MAX_PROMPT = 128 };

/* Phase 1's sessions, then phase 2's. The last one begins a sentence whose
 * next word, in a TinyStories story, is the main character's name. */
static const char *const k_sessions[] = {
    "Once upon a time, there was a little girl named Sue. Sue had a red kite. She liked to fly her kite in the "
    "park with her mom.",
    "The sun was warm and the sky was blue. A little bird sat on a branch and sang a happy song.",
    "A big brown cow lived on a farm. The cow ate green grass all day. At night, the cow slept in a warm barn.",
    "In the forest, there was a tall tree. A family of squirrels lived in the tree. They gathered nuts for the "
    "winter.",
    "One day,",
};
#define N_SESSIONS ((int)(sizeof k_sessions / sizeof k_sessions[0]))
#define PHASE1_SESSIONS (N_SESSIONS - 1)

typedef struct story {
    tl_model m;
    tl_tokenizer *tok;
    kvmem_context *ctx;
    tl_history h;
    tl_state *s;
    tl_method memart, recent, full;
    int32_t V, L, d, kvd;
    int64_t prefilled, probed, reread;
    char err[TL_ERR_SIZE];
} story;

/* The memory budget for a history: a quarter of it, whole blocks, at least MIN_BUDGET. */
static int64_t budget_for(int64_t history) {
    int64_t b = (history / 4 + 8) / 16 * 16;
    return b < MIN_BUDGET ? MIN_BUDGET : b;
}

static void print_text(const char *label, const char *text) {
    printf("%s\"", label);
    for (const char *c = text; *c; c++) putchar(*c == '\n' ? ' ' : *c);
    printf("\"\n");
}

static int print_ids(story *S, const char *label, const int32_t *ids, int32_t n) {
    char *t = tl_decode(S->tok, ids, n);
    if (!t) return tl_errf(S->err, sizeof S->err, "out of memory");
    print_text(label, t);
    free(t);
    return 0;
}

/* The history's text between two token indices, as the agent stores its ids. */
static int print_range(story *S, const char *label, int64_t first, int64_t n) {
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    int rc = !ids || kvmem_agent_tokens(S->h.agent, first, n, ids) != KVMEM_OK
                 ? tl_errf(S->err, sizeof S->err, "agent tokens: %s", kvmem_last_error())
                 : print_ids(S, label, ids, (int32_t)n);
    free(ids);
    return rc;
}

/* Prefill the prompt on the memory in kv, then continue greedily for up to
 * GEN tokens (stopping at a story boundary). logits (may be NULL) gets the
 * prompt's logits. The continuation's last token is run too, so every token
 * of prompt + continuation has its K/V row in kv. */
static int continue_text(story *S, tl_kv *kv, const int32_t *prompt, int32_t np, int64_t N, int32_t *gen,
                         int32_t *n_gen, float *logits) {
    int32_t pos[MAX_PROMPT + GEN];
    for (int32_t i = 0; i < np + GEN; i++) pos[i] = (int32_t)N + i;
    float *lg = logits ? logits : malloc((size_t)np * (size_t)S->V * sizeof(float));
    if (!lg || tl_forward(&S->m, S->s, kv, prompt, np, pos, lg, NULL, NULL, NULL)) {
        if (!logits) free(lg);
        return tl_errf(S->err, sizeof S->err, "prefill failed");
    }
    float next[4096];
    int32_t t = tl_argmax(lg + (size_t)(np - 1) * (size_t)S->V, S->V);
    if (!logits) free(lg);
    *n_gen = 0;
    while (*n_gen < GEN && t > 2) { /* 0 unk, 1 BOS, 2 EOS: the story ends */
        gen[(*n_gen)++] = t;
        if (tl_forward(&S->m, S->s, kv, &t, 1, pos + np + *n_gen - 1, next, NULL, NULL, NULL))
            return tl_errf(S->err, sizeof S->err, "decode failed");
        t = tl_argmax(next, S->V);
    }
    return 0;
}

/* The prompt's raw queries over the newest history: what retrieval is asked with. */
static int probe(story *S, const int32_t *prompt, int32_t np, int64_t N, float *q_raw) {
    tl_kv kv;
    int32_t pos[MAX_PROMPT];
    for (int32_t i = 0; i < np; i++) pos[i] = (int32_t)N + i;
    if (tl_kv_init(&kv, &S->m.cfg, PROBE_WINDOW + np)) return tl_errf(S->err, sizeof S->err, "out of memory");
    int rc = tl_memory_recent(&S->h, PROBE_WINDOW, &kv, S->err, sizeof S->err);
    tl_trace tr = {0};
    tr.q_raw = q_raw;
    if (!rc && tl_forward(&S->m, S->s, &kv, prompt, np, pos, NULL, &tr, NULL, NULL))
        rc = tl_errf(S->err, sizeof S->err, "probe failed");
    tl_kv_free(&kv);
    return rc;
}

/* kvmem's memory for a prompt into kv (reset first); prints what it chose when verbose. */
static int kvmem_memory(story *S, const int32_t *prompt, int32_t np, int64_t budget, tl_kv *kv, int verbose) {
    int64_t N = S->h.n;
    float *q = malloc((size_t)np * (size_t)S->L * (size_t)S->d * sizeof(float));
    tl_build_info info;
    int rc = !q ? tl_errf(S->err, sizeof S->err, "out of memory") : probe(S, prompt, np, N, q);
    if (!rc)
        rc = tl_memory_build_info(&S->h, &S->memart, budget, q, np, (int32_t)N, kv, &info, S->err, sizeof S->err);
    free(q);
    if (rc || !verbose) return rc;
    printf("  kvmem memory, %lld of %lld history tokens: the live context (%lld tokens) and %d retrieved "
           "block%s (%lld tokens, re-encoded just before it):\n",
           (long long)kv->n, (long long)N, (long long)info.local_rows, info.n_blocks, info.n_blocks == 1 ? "" : "s",
           (long long)info.retrieved_rows);
    for (int32_t b = 0; b < info.n_blocks && !rc; b++) {
        kvmem_block_info bi;
        if (kvmem_agent_block_info(S->h.agent, info.blocks[b], &bi) != KVMEM_OK)
            return tl_errf(S->err, sizeof S->err, "block info: %s", kvmem_last_error());
        char label[96];
        snprintf(label, sizeof label, "    retrieved block %d (tokens %lld-%lld): ", info.blocks[b],
                 (long long)bi.first_token, (long long)(bi.first_token + bi.n_tokens - 1));
        rc = print_range(S, label, bi.first_token, bi.n_tokens);
    }
    if (!rc && info.local_rows) rc = print_range(S, "    live context: ", N - info.local_rows, info.local_rows);
    return rc;
}

/* One session: print it, run it three ways, append kvmem's run to the agent.
 * prompt_logits (may be NULL) gets kvmem's prompt logits. */
static int session(story *S, int no, const char *text, float *prompt_logits) {
    int64_t N = S->h.n;
    int32_t prompt[MAX_PROMPT], np = 0;
    if (tl_encode(S->tok, text, strlen(text), N == 0, prompt, MAX_PROMPT, &np, S->err, sizeof S->err)) return -1;
    int64_t budget = budget_for(N);
    printf("\nsession %d (history %lld tokens; memory budget %lld):\n", no, (long long)N, (long long)budget);
    print_text("  new text: ", text);
    tl_kv kv;
    if (tl_kv_init(&kv, &S->m.cfg, (int32_t)N + np + GEN + 1)) return tl_errf(S->err, sizeof S->err, "out of memory");
    int32_t gen[GEN], ng = 0, rgen[GEN], nrg = 0, fgen[GEN], nfg = 0;
    int rc = 0;
    if (N > 0) rc = kvmem_memory(S, prompt, np, budget, &kv, 1);
    int32_t mem_rows = kv.n;
    if (!rc) rc = continue_text(S, &kv, prompt, np, N, gen, &ng, prompt_logits);
    tl_kv other;
    int other_ok = 0;
    if (!rc && N > 0 && !(other_ok = !tl_kv_init(&other, &S->m.cfg, (int32_t)N + np + GEN + 1)))
        rc = tl_errf(S->err, sizeof S->err, "out of memory");
    if (!rc && N > 0)
        rc = tl_memory_build(&S->h, &S->full, 0, NULL, 0, (int32_t)N, &other, S->err, sizeof S->err) ||
             continue_text(S, &other, prompt, np, N, fgen, &nfg, NULL) ||
             tl_memory_build(&S->h, &S->recent, budget, NULL, 0, (int32_t)N, &other, S->err, sizeof S->err) ||
             continue_text(S, &other, prompt, np, N, rgen, &nrg, NULL);
    if (!rc) rc = print_ids(S, N > 0 ? "  continued with kvmem memory: " : "  continued: ", gen, ng);
    if (!rc && N > 0) {
        char what[48], label[64];
        rc = print_ids(S, "  with full context:           ", fgen, nfg);
        snprintf(what, sizeof what, "with the last %lld tokens:", (long long)budget);
        snprintf(label, sizeof label, "  %-29s", what);
        if (!rc) rc = print_ids(S, label, rgen, nrg);
    }
    /* the agent keeps the session and its own continuation, as its engine computed them */
    int32_t T = np + ng;
    if (!rc) {
        float *k = malloc((size_t)S->L * (size_t)T * (size_t)S->kvd * sizeof(float));
        float *v = malloc((size_t)S->L * (size_t)T * (size_t)S->kvd * sizeof(float));
        int32_t ids[MAX_PROMPT + GEN];
        memcpy(ids, prompt, (size_t)np * sizeof(int32_t));
        memcpy(ids + np, gen, (size_t)ng * sizeof(int32_t));
        if (!k || !v) rc = tl_errf(S->err, sizeof S->err, "out of memory");
        for (int32_t l = 0; !rc && l < S->L; l++) {
            size_t src = ((size_t)l * (size_t)kv.cap + (size_t)mem_rows) * (size_t)S->kvd;
            memcpy(k + (size_t)l * (size_t)T * (size_t)S->kvd, kv.k + src, (size_t)T * (size_t)S->kvd * sizeof(float));
            memcpy(v + (size_t)l * (size_t)T * (size_t)S->kvd, kv.v + src, (size_t)T * (size_t)S->kvd * sizeof(float));
        }
        if (!rc)
            rc = tl_history_append(&S->h, k, v, T, kv.pos + mem_rows, ids, NULL, NULL, 0, S->err, sizeof S->err);
        free(k);
        free(v);
    }
    if (!rc) {
        S->prefilled += np;
        S->probed += N > 0 ? np : 0;
        S->reread += N + np;
        printf("  tokens through the model: %d new + %d probe (a text agent re-reading its history: %lld)\n", np,
               N > 0 ? np : 0, (long long)(N + np));
    }
    if (other_ok) tl_kv_free(&other);
    tl_kv_free(&kv);
    return rc;
}

static void story_close(story *S) {
    tl_history_free(&S->h);
    tl_state_free(S->s);
    kvmem_context_free(S->ctx);
    tl_tokenizer_free(S->tok);
    tl_model_free(&S->m);
}

static int story_open(story *S, const char *model, const char *tok_path) {
    memset(S, 0, sizeof *S);
    if (tl_model_load(model, &S->m, S->err, sizeof S->err)) return -1;
    char buf[4096];
    if (tok_path) {
        if (tl_tokenizer_load(tok_path, S->m.cfg.vocab_size, &S->tok, S->err, sizeof S->err)) return -1;
    } else if (tl_tokenizer_from_model(&S->m, &S->tok, NULL, 0)) {
        const char *tp = tl_find_tokenizer(model, buf, sizeof buf);
        if (!tp) return tl_errf(S->err, sizeof S->err, "no tokenizer beside %s: give one with --tokenizer FILE", model);
        if (tl_tokenizer_load(tp, S->m.cfg.vocab_size, &S->tok, S->err, sizeof S->err)) return -1;
    }
    if (S->m.cfg.vocab_size > 4096) return tl_errf(S->err, sizeof S->err, "the demo takes vocabularies up to 4096");
    S->V = S->m.cfg.vocab_size;
    S->L = S->m.cfg.n_layers;
    S->d = S->m.cfg.dim;
    S->kvd = S->m.cfg.n_kv_heads * S->m.cfg.head_dim;
    tl_method ms[32];
    int32_t n = tl_method_list(ms, 32, NULL, 0), found = 0;
    for (int32_t i = 0; i < n && i < 32; i++) {
        if (!strcmp(ms[i].name, "memart")) S->memart = ms[i], found |= 1;
        if (!strcmp(ms[i].name, "recent")) S->recent = ms[i], found |= 2;
        if (!strcmp(ms[i].name, "full")) S->full = ms[i], found |= 4;
    }
    if (found != 7) return tl_errf(S->err, sizeof S->err, "this build has no MemArt retrieval");
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cpu";
    if (kvmem_context_create(&cp, &S->ctx) != KVMEM_OK)
        return tl_errf(S->err, sizeof S->err, "context: %s", kvmem_last_error());
    S->s = tl_state_create(&S->m.cfg, MAX_PROMPT + GEN);
    if (!S->s) return tl_errf(S->err, sizeof S->err, "out of memory");
    if (tl_history_init(&S->h, S->ctx, &S->m, S->m.cfg.seq_len, KVMEM_F16, 16, "story-agent", S->err,
                        sizeof S->err))
        return -1;
    printf("tinyllm demo on %s (%s, dim %d, %d layers, %d/%d heads, vocab %d); its KV memory is a kvmem agent "
           "(f16, blocks of 16)\n",
           model, S->m.format, S->d, S->L, S->m.cfg.n_heads, S->m.cfg.n_kv_heads, S->V);
    return 0;
}

static int write_expect(const char *path, const float *logits, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(logits, sizeof(float), n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* kvmem's prompt logits for the last session, from the agent as it stands. */
static int last_session_logits(story *S, float *logits, int32_t *np) {
    const char *text = k_sessions[N_SESSIONS - 1];
    int32_t prompt[MAX_PROMPT];
    if (tl_encode(S->tok, text, strlen(text), 0, prompt, MAX_PROMPT, np, S->err, sizeof S->err)) return -1;
    tl_kv kv;
    if (tl_kv_init(&kv, &S->m.cfg, (int32_t)S->h.n + *np)) return tl_errf(S->err, sizeof S->err, "out of memory");
    int32_t pos[MAX_PROMPT];
    for (int32_t i = 0; i < *np; i++) pos[i] = (int32_t)S->h.n + i;
    int rc = kvmem_memory(S, prompt, *np, budget_for(S->h.n), &kv, 0);
    if (!rc && tl_forward(&S->m, S->s, &kv, prompt, *np, pos, logits, NULL, NULL, NULL))
        rc = tl_errf(S->err, sizeof S->err, "prefill failed");
    tl_kv_free(&kv);
    return rc;
}

static int phase1(const char *model, const char *tok, const char *dir) {
    story S;
    int rc = story_open(&S, model, tok);
    float *logits = rc ? NULL : malloc((size_t)MAX_PROMPT * (size_t)S.V * sizeof(float));
    if (!rc && !logits) rc = tl_errf(S.err, sizeof S.err, "out of memory");
    for (int i = 0; !rc && i < PHASE1_SESSIONS; i++) rc = session(&S, i + 1, k_sessions[i], NULL);
    int32_t np = 0;
    if (!rc) rc = last_session_logits(&S, logits, &np);
    if (!rc) {
        char path[4200], expect[4200];
        snprintf(path, sizeof path, "%s/story-agent.safetensors", dir);
        snprintf(expect, sizeof expect, "%s/story-expect.bin", dir);
        rc = tl_history_save(&S.h, path, S.err, sizeof S.err);
        if (!rc && write_expect(expect, logits, (size_t)np * (size_t)S.V))
            rc = tl_errf(S.err, sizeof S.err, "cannot write %.200s", expect);
        if (!rc)
            printf("\nsaved the agent (%lld tokens) to %s; kvmem prefilled %lld tokens (+%lld probe) over %d "
                   "sessions where a text agent would have re-read %lld\n",
                   (long long)S.h.n, path, (long long)S.prefilled, (long long)S.probed, PHASE1_SESSIONS,
                   (long long)S.reread);
    }
    if (rc) fprintf(stderr, "tinyllm demo: %s\n", S.err[0] ? S.err : kvmem_last_error());
    free(logits);
    story_close(&S);
    return rc ? 1 : 0;
}

static int phase2(const char *model, const char *tok, const char *dir) {
    story S;
    char path[4200], expect[4200];
    snprintf(path, sizeof path, "%s/story-agent.safetensors", dir);
    snprintf(expect, sizeof expect, "%s/story-expect.bin", dir);
    int rc = story_open(&S, model, tok);
    float *want = rc ? NULL : malloc((size_t)MAX_PROMPT * (size_t)S.V * sizeof(float));
    float *got = rc ? NULL : malloc((size_t)MAX_PROMPT * (size_t)S.V * sizeof(float));
    if (!rc && (!want || !got)) rc = tl_errf(S.err, sizeof S.err, "out of memory");
    if (!rc) rc = tl_history_load(&S.h, path, S.err, sizeof S.err);
    if (!rc)
        printf("\nrestart: a new process loaded the agent '%s' (%lld tokens) from %s\n", S.h.agent_id,
               (long long)S.h.n, path);
    int32_t np = 0;
    if (!rc) rc = last_session_logits(&S, got, &np);
    if (!rc) {
        size_t n = (size_t)np * (size_t)S.V;
        FILE *f = fopen(expect, "rb");
        if (!f || fread(want, sizeof(float), n, f) != n) rc = tl_errf(S.err, sizeof S.err, "cannot read %.200s: run phase 1 first", expect);
        if (f) fclose(f);
        double worst = 0;
        for (size_t i = 0; !rc && i < n; i++) worst = fmax(worst, fabs((double)got[i] - want[i]));
        if (!rc) {
            printf("  the next session's prompt over the loaded memory: logits %s (max difference %g)\n",
                   worst == 0 ? "identical to phase 1" : "DIFFER from phase 1", worst);
            if (worst != 0) rc = tl_errf(S.err, sizeof S.err, "the reloaded agent gives other logits");
        }
    }
    if (!rc) rc = session(&S, N_SESSIONS, k_sessions[N_SESSIONS - 1], NULL);
    if (rc) fprintf(stderr, "tinyllm demo: %s\n", S.err[0] ? S.err : kvmem_last_error());
    free(want);
    free(got);
    story_close(&S);
    return rc ? 1 : 0;
}

#define DEMO_USAGE                                                                                  \
    "usage: tinyllm demo MODEL [--tokenizer FILE] [--state DIR] [--phase 1|2|all]\n"                \
    "  a story agent: phase 1 runs sessions and saves the agent in DIR, phase 2 (a new process) "    \
    "loads it\n"

int tl_demo_main(int argc, char **argv) {
    static const struct option opts[] = {{"tokenizer", required_argument, NULL, 'k'},
                                         {"state", required_argument, NULL, 's'},
                                         {"phase", required_argument, NULL, 'p'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *dir = "/tmp", *phase = "all", *tok = NULL, *model;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'k': tok = optarg; break;
        case 's': dir = optarg; break;
        case 'p': phase = optarg; break;
        case 'h': fputs(DEMO_USAGE, stdout); return 0;
        default: return tl_cli_bad_option("demo", argc, argv, c, DEMO_USAGE);
        }
    }
    int p1 = !strcmp(phase, "1") || !strcmp(phase, "all"), p2 = !strcmp(phase, "2") || !strcmp(phase, "all");
    if (!p1 && !p2) {
        fprintf(stderr, "tinyllm demo: --phase '%s': expected 1, 2 or all\n" DEMO_USAGE, phase);
        return 2;
    }
    if (tl_cli_one_positional("demo", argc, argv, "MODEL", DEMO_USAGE, &model)) return 2;
    /* phase 1 saves into the directory and phase 2 reads from it: say so now, not after the run */
    if (tl_cli_dir("demo", "--state", dir, p1)) return 2;
    int rc = 0;
    if (p1) rc = phase1(model, tok, dir);
    if (!rc && p2) rc = phase2(model, tok, dir);
    return rc;
}
