/* tinyllm demo: a story agent whose memory is kvmem, in text a person reads.
 *
 * The story's history grows to several of the model's windows (stories15M
 * was trained on 256 tokens: past that it cannot read). A girl is named in
 * the first session; many sessions about other things follow.
 * Phase 1 (one process): the sessions arrive as text; each is read on the
 * memory kvmem gives it (the blocks its queries retrieve, then the newest
 * history) and goes into the agent, which is then saved to one file.
 * Phase 2 (a new process): the agent is loaded from the file (the next
 * session's prompt logits must equal the ones phase 1 computed before
 * saving), and a last session begins a sentence whose next word, in a
 * TinyStories story, is the girl's name. It is continued four ways, each
 * within one window of the model but the last: on kvmem's memory, on text
 * RAG's (BM25 over 16-token chunks of the history's text, re-prefilled), on
 * the recent window, and on the whole history past the window; each with
 * the tokens it ran through the model.
 *
 * A session is story_session.c's (the browser page runs the same code);
 * this file prints it. */
#include <ctype.h>
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
 * next word, in a TinyStories story, is the girl's name: a word it shares
 * with none of her session, so ranking text by its words does not find her. */
static const char *const k_sessions[] = {
    "Once upon a time, there was a little girl named Sue. Sue had a red kite. Every day, Sue took her kite to the "
    "park with her mom. Sue ran fast, and the kite flew high in the sky. Sue laughed and said, \"Look, Mom, my "
    "kite is dancing!\"",
    "The sun was warm and the sky was blue. A little bird sat on a branch and sang a happy song. The bird had a "
    "nest with three small eggs. Every day, the bird sat on the eggs to keep them warm. One morning, the eggs "
    "began to crack, and three baby birds came out.",
    "A big brown cow lived on a farm. The cow ate green grass all day. At night, the cow slept in a warm barn. The "
    "farmer had a dog named Spot. Spot liked to run around the cow and bark. The cow did not mind. She just kept "
    "eating her grass and said, \"Moo!\"",
    "In the forest, there was a tall tree. A family of squirrels lived in the tree. They gathered nuts for the "
    "winter. The baby squirrel was very small, but he wanted to help. He found a big nut and carried it all the "
    "way home. His mom was very proud of him.",
    "The rain fell on the roof. Drip, drop, drip, drop. The puddles in the street got bigger and bigger, and the "
    "frogs were very happy. They jumped from puddle to puddle and sang their froggy songs. When the rain stopped, "
    "a big rainbow came out in the sky.",
    "The moon was big and bright. The stars were shining in the dark sky. An owl sat on a fence and said, \"Hoo, "
    "hoo.\" A little mouse heard the owl and ran into his hole. He was scared, but the owl only wanted to say "
    "hello.",
    "A small fish swam in the river. The water was cool and clear. The fish saw a shiny stone at the bottom and "
    "swam around it. A big turtle came by and said, \"That stone is my friend.\" The fish and the turtle played "
    "together all afternoon.",
    "The bees were busy in the garden. They flew from flower to flower. They made sweet honey in their hive. A "
    "bear smelled the honey and came to the hive. The bees buzzed very loud, and the bear ran away into the "
    "woods.",
    "The sea was big and blue. The waves went up and down. A crab walked sideways on the sand and hid under a "
    "rock. A seagull flew over the water and looked for fish. The sun went down, and the sky turned orange and "
    "pink.",
    "The snow was white and cold. It covered the houses and the trees. A snowman with a carrot nose stood in a "
    "yard. A little rabbit hopped by and looked at the carrot. The rabbit was hungry, but he did not eat the "
    "snowman's nose.",
    "A big red truck drove down the road. It was full of toys for the children in the town. The driver was a kind "
    "man with a big smile. He stopped at every house and gave each child a toy. The children clapped and "
    "cheered.",
    "The wind blew through the tall grass. A lion sat on a hill and looked at the land. He was the king of the "
    "animals. A small monkey came and sat next to him. Together they watched the sun go down over the trees.",
    "The old clock in the hall went tick, tock, tick, tock. A little mouse lived behind the clock. Every night, "
    "when the house was quiet, the mouse came out to look for crumbs. One night he found a big piece of cheese "
    "under the table.",
    "A family of ducks lived by the pond. The mother duck had five yellow ducklings. They walked in a line behind "
    "her, one, two, three, four, five. They jumped into the water and swam to the other side, where the grass was "
    "soft and green.",
    "The train went choo, choo over the hills. It carried people to the big city. A boy looked out of the window "
    "and counted the cows in the fields. He saw ten cows, two horses and a big black dog.",
    "The baker made bread every morning. The bread was warm and smelled very good. People came from all over the "
    "town to buy it. The baker also made little cakes with pink icing, and the children loved them.",
    "The next morning,",
};
#define N_SESSIONS ((int)(sizeof k_sessions / sizeof k_sessions[0]))
#define PHASE1_SESSIONS (N_SESSIONS - 1)
/* The girl session 1 names: what a continuation of the last session recalls or not. */
static const char k_name[] = "Sue";

/* One line of text, line breaks as spaces, cut after `max` bytes (0: whole)
 * on a character boundary. */
static void print_text(const char *text, size_t max) {
    size_t n = strlen(text), cut = n;
    if (max && n > max) {
        cut = max;
        while (cut > 0 && ((unsigned char)text[cut] & 0xC0) == 0x80) cut--;
    }
    putchar('"');
    for (size_t i = 0; i < cut; i++) putchar(text[i] == '\n' ? ' ' : text[i]);
    printf(cut < n ? " ...\"" : "\"");
}

static int print_ids(tl_story *s, const int32_t *ids, int32_t n, char *err, size_t err_size) {
    char *t = tl_story_decode(s, ids, n);
    if (!t) return tl_errf(err, err_size, "out of memory");
    print_text(t, 0);
    free(t);
    return 0;
}

static int print_range(tl_story *s, int64_t first, int64_t n, char *err, size_t err_size) {
    char *t = tl_story_text(s, first, n);
    if (!t) return tl_errf(err, err_size, "history text: %s", kvmem_last_error());
    print_text(t, 0);
    free(t);
    return 0;
}

/* Whether text holds word as a word of its own (not inside a longer one). */
static int says_word(const char *text, const char *word) {
    size_t n = strlen(word);
    for (const char *p = strstr(text, word); p; p = strstr(p + 1, word)) {
        int before = p > text && isalnum((unsigned char)p[-1]), after = isalnum((unsigned char)p[n]);
        if (!before && !after) return 1;
    }
    return 0;
}

static double windows(const tl_story *s, int64_t n) { return (double)n / tl_story_model(s)->cfg.seq_len; }

/* What each memory put in the window, as text: kvmem's retrieved blocks (in
 * window order), text RAG's chunks, the live context both end with. */
static int print_memories(tl_story *s, const tl_story_run *r, char *err, size_t err_size) {
    const tl_build_info *in = &r->info;
    int rc = 0;
    printf("  kvmem retrieved %d block%s of 16 tokens by the text's queries against the blocks' key boxes "
           "(placed: %s):\n",
           in->n_blocks, in->n_blocks == 1 ? "" : "s",
           r->order == TL_ORDER_RUNS    ? "runs of adjacent blocks, the best run nearest the text"
           : r->order == TL_ORDER_SCORE ? "the best nearest the text"
                                        : "in the history's order");
    for (int32_t b = 0; b < in->n_blocks && !rc; b++) {
        kvmem_block_info bi;
        if (tl_story_block_info(s, in->blocks[b], &bi)) return tl_errf(err, err_size, "%s", kvmem_last_error());
        printf("    block %3d  tokens %4lld-%-4lld ", in->blocks[b], (long long)bi.first_token,
               (long long)(bi.first_token + bi.n_tokens - 1));
        rc = print_range(s, bi.first_token, bi.n_tokens, err, err_size);
        putchar('\n');
    }
    printf("  text RAG chose %d chunk%s of 16 tokens, by BM25 against the text:\n", r->n_rag_chunks,
           r->n_rag_chunks == 1 ? "" : "s");
    for (int32_t c = 0; c < r->n_rag_chunks && !rc; c++) {
        printf("               tokens %4d-%-4d ", r->rag_chunks[c].first, r->rag_chunks[c].first + r->rag_chunks[c].n - 1);
        rc = print_range(s, r->rag_chunks[c].first, r->rag_chunks[c].n, err, err_size);
        putchar('\n');
    }
    if (!rc && in->local_rows) {
        printf("  both end with the live context, the newest %lld tokens: ", (long long)in->local_rows);
        rc = print_range(s, r->history - in->local_rows, in->local_rows, err, err_size);
        putchar('\n');
    }
    return rc;
}

/* The last session: the four continuations side by side, with what each ran through the model. */
static int print_compared(tl_story *s, const tl_story_run *r, char *err, size_t err_size) {
    int32_t np = r->n_prompt, W = tl_story_model(s)->cfg.seq_len;
    int64_t R = r->history < r->budget ? r->history : r->budget;
    char what[4][64];
    snprintf(what[0], sizeof what[0], "%d: the text + its probe", 2 * np);
    snprintf(what[1], sizeof what[1], "%d: BOS, chunks, live, text", r->rag_tokens + np);
    snprintf(what[2], sizeof what[2], "%d: the text", np);
    snprintf(what[3], sizeof what[3], "%d: the text", np);
    printf("  continued on               tokens run through the model\n");
    printf("    kvmem's memory           %-28s ", what[0]);
    int rc = print_ids(s, r->gen, r->n_gen, err, err_size);
    printf("\n    text RAG                 %-28s ", what[1]);
    if (!rc) rc = print_ids(s, r->rag, r->n_rag, err, err_size);
    printf("\n    the recent %3lld tokens    %-28s ", (long long)R, what[2]);
    if (!rc) rc = print_ids(s, r->recent, r->n_recent, err, err_size);
    printf("\n    the whole history        %-28s ", what[3]);
    if (!rc) rc = print_ids(s, r->full, r->n_full, err, err_size);
    printf("\n  (the recent window and the whole history keep their KV cached; the whole history, %lld tokens, "
           "is past the model's window of %d; re-read as text: %lld tokens)\n",
           (long long)r->history, W, (long long)(r->history + np));
    if (rc) return rc;
    /* the verdict, from the continuations as decoded */
    const int32_t *ids[4] = {r->gen, r->rag, r->recent, r->full};
    const int32_t n[4] = {r->n_gen, r->n_rag, r->n_recent, r->n_full};
    static const char *const who[4] = {"kvmem's memory", "text RAG", "the recent window", "the whole history"};
    int named[4];
    for (int i = 0; i < 4; i++) {
        char *t = tl_story_decode(s, ids[i], n[i]);
        if (!t) return tl_errf(err, err_size, "out of memory");
        named[i] = says_word(t, k_name);
        free(t);
    }
    printf("\nRecall of %s, named in session 1, %.1f windows back:", k_name, windows(s, r->history));
    for (int yes = 1, sep = 0; yes >= 0; yes--) {
        int k = 0;
        for (int i = 0; i < 4; i++)
            if (named[i] == yes) printf("%s %s", k++ ? "," : sep ? ";" : "", who[i]);
        if (k) fputs(yes ? (k == 1 ? " says it" : " say it") : (k == 1 ? " does not" : " do not"), stdout);
        sep |= k;
    }
    printf(".\n");
    return 0;
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
    return tl_story_open(model, tok, s, err, err_size);
}

static void describe(const tl_story *s, const char *model) {
    const tl_model *m = tl_story_model(s);
    tl_split sp = tl_window_split(m->cfg.seq_len, 0, TL_STORY_MEM_FRAC, TL_STORY_LIVE_FRAC, 16);
    printf("tinyllm demo on %s (%s: dim %d, %d layers, %d/%d heads, vocab %d), trained on a window of %d tokens.\n"
           "Its memory is a kvmem agent (f16, blocks of 16). Each session is read in one window: %d tokens of "
           "retrieved blocks, the newest %d tokens (the live context), the new text.\n",
           model, m->format, m->cfg.dim, m->cfg.n_layers, m->cfg.n_heads, m->cfg.n_kv_heads, m->cfg.vocab_size,
           m->cfg.seq_len, sp.memory, sp.live);
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
    int rc = open_story(model, tok, &s, err, sizeof err);
    size_t V = rc ? 0 : (size_t)tl_story_model(s)->cfg.vocab_size;
    float *logits = rc ? NULL : malloc((size_t)TL_STORY_MAX_PROMPT * V * sizeof(float));
    if (!rc && !logits) rc = tl_errf(err, sizeof err, "out of memory");
    if (!rc) {
        describe(s, model);
        printf("\nphase 1: %d sessions of a story go into the agent\n", PHASE1_SESSIONS);
    }
    int64_t prefilled = 0, probed = 0, reread = 0;
    tl_story_opts o = {0};
    o.kvmem_only = 1;
    for (int i = 0; !rc && i < PHASE1_SESSIONS; i++) {
        tl_story_run r;
        const char *text = k_sessions[i];
        if ((rc = tl_story_step(s, text, strlen(text), &o, &r, err, sizeof err)) != 0) break;
        rc = tl_story_commit(s, &r, err, sizeof err);
        if (!rc) {
            printf("  session %2d, %3d tokens (history %4lld, %.1f windows) ", r.session, r.n_prompt,
                   (long long)tl_story_history(s), windows(s, tl_story_history(s)));
            print_text(text, 44);
            putchar('\n');
            prefilled += r.n_prompt;
            probed += r.info.n_blocks ? r.n_prompt : 0;
            reread += r.history + r.n_prompt;
        }
        tl_story_run_free(&r);
    }
    /* what phase 2 must reproduce from the saved agent: the last session's prompt logits */
    int32_t np = 0;
    const char *last = k_sessions[N_SESSIONS - 1];
    if (!rc) rc = tl_story_prompt_logits(s, last, strlen(last), NULL, logits, TL_STORY_MAX_PROMPT, &np, err, sizeof err);
    if (!rc) rc = tl_story_save(s, path, err, sizeof err);
    if (!rc) {
        FILE *f = fopen(expect, "wb");
        int ok = f && fwrite(logits, sizeof(float), (size_t)np * V, f) == (size_t)np * V;
        if (f && fclose(f) != 0) ok = 0;
        if (!ok) rc = tl_errf(err, sizeof err, "cannot write %.200s", expect);
    }
    if (!rc)
        printf("saved the agent (%lld tokens, %.1f windows of the model) to %s\nkvmem ran %lld tokens through the "
               "model (%lld of text, %lld of probes); a text agent re-reading its history each session: %lld\n",
               (long long)tl_story_history(s), windows(s, tl_story_history(s)), path, (long long)(prefilled + probed),
               (long long)prefilled, (long long)probed, (long long)reread);
    if (rc) fprintf(stderr, "tinyllm demo: %s\n", err[0] ? err : kvmem_last_error());
    free(logits);
    tl_story_free(s);
    return rc ? 1 : 0;
}

static int phase2(const char *model, const char *tok, const char *dir) {
    char err[TL_ERR_SIZE] = "", path[4200], expect[4200];
    state_paths(dir, path, expect, sizeof path);
    tl_story *s = NULL;
    int rc = open_story(model, tok, &s, err, sizeof err);
    size_t V = rc ? 0 : (size_t)tl_story_model(s)->cfg.vocab_size;
    float *want = rc ? NULL : malloc((size_t)TL_STORY_MAX_PROMPT * V * sizeof(float));
    float *got = rc ? NULL : malloc((size_t)TL_STORY_MAX_PROMPT * V * sizeof(float));
    if (!rc && (!want || !got)) rc = tl_errf(err, sizeof err, "out of memory");
    if (!rc) rc = tl_story_load(s, path, err, sizeof err);
    if (!rc)
        printf("\nphase 2: a new process loaded the agent '%s' (%lld tokens) from %s\n", tl_story_agent_id(s),
               (long long)tl_story_history(s), path);
    int32_t np = 0;
    const char *last = k_sessions[N_SESSIONS - 1];
    if (!rc) rc = tl_story_prompt_logits(s, last, strlen(last), NULL, got, TL_STORY_MAX_PROMPT, &np, err, sizeof err);
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
    tl_story_run r;
    memset(&r, 0, sizeof r);
    if (!rc) rc = tl_story_step(s, last, strlen(last), NULL, &r, err, sizeof err);
    if (!rc) {
        printf("\nsession %d (history %lld tokens, %.1f windows of the model): ", N_SESSIONS, (long long)r.history,
               windows(s, r.history));
        print_text(last, 0);
        printf("\n  (the next word, in a story of this kind, is its girl's name: %s, named in session 1 only)\n",
               k_name);
        rc = print_memories(s, &r, err, sizeof err);
    }
    if (!rc) rc = print_compared(s, &r, err, sizeof err);
    tl_story_run_free(&r);
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
