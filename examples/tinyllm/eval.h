/* tinyllm eval: what the fidelity protocol, the recall suite and the report
 * share. */
#ifndef TINYLLM_EVAL_H
#define TINYLLM_EVAL_H

#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

#define TL_MAX_BUDGETS 8
#define TL_MAX_METHODS 32
#define TL_RECALL_BUCKETS 4 /* name distance: < 128, < 256, < 384, >= 384 tokens */

/* A KV budget: a token count, or (frac > 0) a share of the history. */
typedef struct tl_budget {
    int64_t tokens;
    double frac;
} tl_budget;

typedef struct tl_eval_cfg {
    int32_t n_seqs, n_turns, turn_len, prompt_len, first_turn, probe_window;
    int32_t window;     /* W of the memory-dependence test */
    double memdep_nats; /* the gain that marks a position memory-dependent */
    tl_budget budgets[TL_MAX_BUDGETS];
    int32_t n_budgets;
    uint64_t seed;
    kvmem_dtype storage;
    int progress; /* 0 none, 1 lines, 2 one line rewritten (a terminal) */
} tl_eval_cfg;

/* One method at one budget, accumulated over positions. */
typedef struct tl_score {
    double agree, kl, kl_max;
    int32_t kl_max_seq, kl_max_pos;
    double agree_md, kl_md, lp_md; /* on memory-dependent positions */
    int64_t n_pos, n_md;
    int64_t prefill, turns, rows_read, decoded;
    int64_t mem_rows, local_rows, retrieved_rows;
    int64_t art_tiles, art_visited;
    int64_t retrievals; /* MemArt: retrievals run (one per turn, more with reprobe) */
} tl_score;

/* One method at one budget on the recall suite. */
typedef struct tl_recall_score {
    int64_t n, hits;
    double rank_sum, lp_sum;   /* first name token's rank; all name tokens' log-probability */
    int64_t mem_rows;
    int64_t bucket_n[TL_RECALL_BUCKETS], bucket_hits[TL_RECALL_BUCKETS];
} tl_recall_score;

typedef struct tl_eval_results {
    tl_method methods[TL_MAX_METHODS];
    int32_t n_methods;
    char missing[512];
    tl_score fid[TL_MAX_METHODS][TL_MAX_BUDGETS];
    tl_recall_score rec[TL_MAX_METHODS][TL_MAX_BUDGETS];
    double hist_sum;
    int64_t hist_turns, n_pos, n_memdep;
    double lp_full_md, lp_short_md; /* summed over memory-dependent positions */
    double seconds, recall_seconds;
} tl_eval_results;

/* One recall case: sessions of text, then a prompt whose next word is a name. */
typedef struct tl_recall_case {
    char id[48];
    char name[48];
    int32_t *tok;          /* the history (all sessions), then prompt, then name */
    int32_t n_hist, n_prompt, n_name;
    int32_t n_sessions;
    int32_t *session_start; /* [n_sessions] first token of each session */
    int32_t distance;       /* tokens from the name's last mention to the prompt's end */
    int32_t n_before;       /* sessions before the intro */
    int32_t intro_start;    /* first token of the intro */
    int32_t name_at;        /* first token of the name's first mention (in the intro) */
    double windows;         /* the distance asked for, in model windows (beyond suites) */
} tl_recall_case;

typedef struct tl_recall_suite {
    char path[512];
    tl_recall_case *cases;
    int32_t n_cases;  /* run (may be fewer than loaded) */
    int32_t n_loaded;
    tl_tokenizer *tok;
} tl_recall_suite;

/* Read the suite's text file and tokenize it with the tokenizer at tok_path
 * (NULL: the model's own vocab, else tok512.bin beside the model). */
int tl_recall_load(tl_recall_suite *s, const char *path, const char *tok_path, const char *model_path,
                   const tl_model *m, char *err, size_t err_size);
/* beyond = 1: a suite with 'windows:' whose histories run past the model's
 * window (tinyllm eval --beyond); 0: every case must fit the window. */
int tl_recall_load_ex(tl_recall_suite *s, const char *path, const char *tok_path, const char *model_path,
                      const tl_model *m, int beyond, char *err, size_t err_size);
void tl_recall_free(tl_recall_suite *s);
/* Every method at every budget on every case; scores into res->rec. */
int tl_recall_run(const tl_recall_suite *s, const tl_model *m, const tl_eval_cfg *c, kvmem_context *ctx,
                  tl_eval_results *res, char *err, size_t err_size);

void tl_eval_write_md(FILE *f, const tl_eval_cfg *c, const tl_eval_results *res, const tl_model *m,
                      const char *model_path, const tl_recall_suite *suite);
void tl_eval_write_json(FILE *f, const tl_eval_cfg *c, const tl_eval_results *res, const tl_model *m,
                        const char *model_path, const tl_recall_suite *suite);

/* helpers */
double tl_now_s(void);
double tl_log_softmax_at(const float *logits, int32_t n, int32_t at);
int32_t tl_rank_of(const float *logits, int32_t n, int32_t at); /* 1 = top */
int64_t tl_budget_tokens(const tl_budget *b, int64_t history, int32_t block);
void tl_budget_name(const tl_budget *b, char *buf, size_t size);
void tl_progress(const tl_eval_cfg *c, const char *fmt, ...) TL_PRINTF(2, 3);
void tl_art_setup(tl_art *art, const tl_method *me, kvmem_context *ctx);
static inline int tl_method_budget_free(const tl_method *me) { return me->kind == TL_M_FULL; }

#endif
