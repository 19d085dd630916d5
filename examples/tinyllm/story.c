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
 *
 * A session is story_session.c's (the browser page runs the same code);
 * this file prints it. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "cli.h"
#include "internal.h"
#include "story_session.h"

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

typedef struct totals {
    int64_t prefilled, probed, reread;
} totals;

static void print_text(const char *label, const char *text) {
    printf("%s\"", label);
    for (const char *c = text; *c; c++) putchar(*c == '\n' ? ' ' : *c);
    printf("\"\n");
}

static int print_ids(tl_story *s, const char *label, const int32_t *ids, int32_t n, char *err, size_t err_size) {
    char *t = tl_story_decode(s, ids, n);
    if (!t) return tl_errf(err, err_size, "out of memory");
    print_text(label, t);
    free(t);
    return 0;
}

static int print_range(tl_story *s, const char *label, int64_t first, int64_t n, char *err, size_t err_size) {
    char *t = tl_story_text(s, first, n);
    if (!t) return tl_errf(err, err_size, "history text: %s", kvmem_last_error());
    print_text(label, t);
    free(t);
    return 0;
}

/* What kvmem chose for the session: the retrieved blocks and the live context, as text. */
static int print_memory(tl_story *s, const tl_story_run *r, char *err, size_t err_size) {
    const tl_build_info *in = &r->info;
    printf("  kvmem memory, %d of %lld history tokens: the live context (%lld tokens) and %d retrieved "
           "block%s (%lld tokens, re-encoded just before it):\n",
           r->mem_rows, (long long)r->history, (long long)in->local_rows, in->n_blocks, in->n_blocks == 1 ? "" : "s",
           (long long)in->retrieved_rows);
    int rc = 0;
    for (int32_t b = 0; b < in->n_blocks && !rc; b++) {
        kvmem_block_info bi;
        char label[96];
        /* the tokens of a retrieved block, from the agent (the run is not committed yet) */
        if (tl_story_block_info(s, in->blocks[b], &bi)) return tl_errf(err, err_size, "%s", kvmem_last_error());
        snprintf(label, sizeof label, "    retrieved block %d (tokens %lld-%lld): ", in->blocks[b],
                 (long long)bi.first_token, (long long)(bi.first_token + bi.n_tokens - 1));
        rc = print_range(s, label, bi.first_token, bi.n_tokens, err, err_size);
    }
    if (!rc && in->local_rows)
        rc = print_range(s, "    live context: ", r->history - in->local_rows, in->local_rows, err, err_size);
    return rc;
}

/* One session: run it, print it, append kvmem's run to the agent. */
static int session(tl_story *s, int no, const char *text, totals *tot, char *err, size_t err_size) {
    tl_story_run r;
    if (tl_story_step(s, text, strlen(text), NULL, &r, err, err_size)) return -1;
    printf("\nsession %d (history %lld tokens; memory budget %lld):\n", no, (long long)r.history,
           (long long)r.budget);
    print_text("  new text: ", text);
    int rc = r.has_memory ? print_memory(s, &r, err, err_size) : 0;
    if (!rc) rc = print_ids(s, r.has_memory ? "  continued with kvmem memory: " : "  continued: ", r.gen, r.n_gen,
                            err, err_size);
    if (!rc && r.has_memory) {
        char what[48], label[64];
        rc = print_ids(s, "  with full context:           ", r.full, r.n_full, err, err_size);
        snprintf(what, sizeof what, "with the last %lld tokens:", (long long)r.budget);
        snprintf(label, sizeof label, "  %-29s", what);
        if (!rc) rc = print_ids(s, label, r.recent, r.n_recent, err, err_size);
    }
    if (!rc) rc = tl_story_commit(s, &r, err, err_size);
    if (!rc) {
        int32_t probed = r.has_memory ? r.n_prompt : 0;
        tot->prefilled += r.n_prompt;
        tot->probed += probed;
        tot->reread += r.history + r.n_prompt;
        printf("  tokens through the model: %d new + %d probe (a text agent re-reading its history: %lld)\n",
               r.n_prompt, probed, (long long)(r.history + r.n_prompt));
    }
    tl_story_run_free(&r);
    return rc;
}

/* The story on the model, with --tokenizer, else the model's own vocabulary,
 * else tok512.bin beside the model. */
static int open_story(const char *model, const char *tok, tl_story **s, char *err, size_t err_size) {
    char buf[4096];
    if (!tok) {
        tl_model m;
        int own = 0;
        if (tl_model_load(model, &m, err, err_size)) return -1;
        tl_tokenizer *t = NULL;
        own = m.vocab && tl_tokenizer_from_model(&m, &t, NULL, 0) == 0;
        tl_tokenizer_free(t);
        tl_model_free(&m);
        if (!own && !(tok = tl_find_tokenizer(model, buf, sizeof buf)))
            return tl_errf(err, err_size, "no tokenizer beside %s: give one with --tokenizer FILE", model);
    }
    if (tl_story_open(model, tok, s, err, err_size)) return -1;
    const tl_model *m = tl_story_model(*s);
    printf("tinyllm demo on %s (%s, dim %d, %d layers, %d/%d heads, vocab %d); its KV memory is a kvmem agent "
           "(f16, blocks of 16)\n",
           model, m->format, m->cfg.dim, m->cfg.n_layers, m->cfg.n_heads, m->cfg.n_kv_heads, m->cfg.vocab_size);
    return 0;
}

/* The agent's file and phase 1's logits for phase 2, in the state directory. */
static void state_paths(const char *dir, char *path, char *expect, size_t size) {
    snprintf(path, size, "%s/story-agent.safetensors", dir);
    snprintf(expect, size, "%s/story-expect.bin", dir);
}

static int phase1(const char *model, const char *tok, const char *dir) {
    char err[TL_ERR_SIZE] = "", path[4200], expect[4200];
    state_paths(dir, path, expect, sizeof path);
    tl_story *s = NULL;
    totals tot = {0, 0, 0};
    int rc = open_story(model, tok, &s, err, sizeof err);
    size_t V = rc ? 0 : (size_t)tl_story_model(s)->cfg.vocab_size;
    float *logits = rc ? NULL : malloc((size_t)TL_STORY_MAX_PROMPT * V * sizeof(float));
    if (!rc && !logits) rc = tl_errf(err, sizeof err, "out of memory");
    for (int i = 0; !rc && i < PHASE1_SESSIONS; i++) rc = session(s, i + 1, k_sessions[i], &tot, err, sizeof err);
    /* what phase 2 must reproduce from the saved agent: the last session's prompt logits */
    int32_t np = 0;
    const char *last = k_sessions[N_SESSIONS - 1];
    if (!rc) rc = tl_story_prompt_logits(s, last, strlen(last), logits, TL_STORY_MAX_PROMPT, &np, err, sizeof err);
    if (!rc) rc = tl_story_save(s, path, err, sizeof err);
    if (!rc) {
        FILE *f = fopen(expect, "wb");
        int ok = f && fwrite(logits, sizeof(float), (size_t)np * V, f) == (size_t)np * V;
        if (f && fclose(f) != 0) ok = 0;
        if (!ok) rc = tl_errf(err, sizeof err, "cannot write %.200s", expect);
    }
    if (!rc)
        printf("\nsaved the agent (%lld tokens) to %s; kvmem prefilled %lld tokens (+%lld probe) over %d "
               "sessions where a text agent would have re-read %lld\n",
               (long long)tl_story_history(s), path, (long long)tot.prefilled, (long long)tot.probed,
               PHASE1_SESSIONS, (long long)tot.reread);
    if (rc) fprintf(stderr, "tinyllm demo: %s\n", err[0] ? err : kvmem_last_error());
    free(logits);
    tl_story_free(s);
    return rc ? 1 : 0;
}

static int phase2(const char *model, const char *tok, const char *dir) {
    char err[TL_ERR_SIZE] = "", path[4200], expect[4200];
    state_paths(dir, path, expect, sizeof path);
    tl_story *s = NULL;
    totals tot = {0, 0, 0};
    int rc = open_story(model, tok, &s, err, sizeof err);
    size_t V = rc ? 0 : (size_t)tl_story_model(s)->cfg.vocab_size;
    float *want = rc ? NULL : malloc((size_t)TL_STORY_MAX_PROMPT * V * sizeof(float));
    float *got = rc ? NULL : malloc((size_t)TL_STORY_MAX_PROMPT * V * sizeof(float));
    if (!rc && (!want || !got)) rc = tl_errf(err, sizeof err, "out of memory");
    if (!rc) rc = tl_story_load(s, path, err, sizeof err);
    if (!rc)
        printf("\nrestart: a new process loaded the agent '%s' (%lld tokens) from %s\n", tl_story_agent_id(s),
               (long long)tl_story_history(s), path);
    int32_t np = 0;
    const char *last = k_sessions[N_SESSIONS - 1];
    if (!rc) rc = tl_story_prompt_logits(s, last, strlen(last), got, TL_STORY_MAX_PROMPT, &np, err, sizeof err);
    if (!rc) {
        size_t n = (size_t)np * V;
        FILE *f = fopen(expect, "rb");
        if (!f || fread(want, sizeof(float), n, f) != n)
            rc = tl_errf(err, sizeof err, "cannot read %.200s: run phase 1 first", expect);
        if (f) fclose(f);
        double worst = 0;
        for (size_t i = 0; !rc && i < n; i++) worst = fmax(worst, fabs((double)got[i] - want[i]));
        if (!rc) {
            printf("  the next session's prompt over the loaded memory: logits %s (max difference %g)\n",
                   worst == 0 ? "identical to phase 1" : "DIFFER from phase 1", worst);
            if (worst != 0) rc = tl_errf(err, sizeof err, "the reloaded agent gives other logits");
        }
    }
    if (!rc) rc = session(s, N_SESSIONS, last, &tot, err, sizeof err);
    if (rc) fprintf(stderr, "tinyllm demo: %s\n", err[0] ? err : kvmem_last_error());
    free(want);
    free(got);
    tl_story_free(s);
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
