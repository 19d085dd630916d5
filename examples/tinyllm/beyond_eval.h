/* tinyllm eval --beyond: memory past the model's window (beyond_eval.c). */
#ifndef TINYLLM_BEYOND_EVAL_H
#define TINYLLM_BEYOND_EVAL_H

#include "beyond.h"
#include "eval.h"

#define BX_MAX_METHODS 256
#define BX_BUCKETS 4 /* the name's distance in windows: [1,2), [2,4), [4,7), >= 7 */

typedef enum bx_sel {
    BX_RECENT = 0,   /* eviction baselines through tl_memory_build, re-encoded to the window */
    BX_STREAMING,
    BX_H2O,
    BX_SNAPKV,
    BX_INTENTKV,
    BX_FULL_PAST,    /* every history row at its own position, attending past the window (told to) */
    BX_RECENT_TEXT,  /* BOS + the newest history text that fits, re-prefilled (a stateless agent) */
    BX_MEMART,       /* retrieved blocks + the live context */
    BX_BM25,         /* text RAG: chosen chunks' text + the live context's text, re-prefilled */
    BX_CONTROL_INTRO,  /* fairness: BOS, the intro, the cue (the history fits: the name 1 session back) */
    BX_CONTROL_WINDOW, /* fairness: BOS, the intro and what follows it up to a full window, the cue */
} bx_sel;

typedef enum bx_sink { BX_SINK_NONE = 0, BX_SINK_BOS = 1, BX_SINK_BLOCK = 2 } bx_sink;
typedef enum bx_oracle {
    BX_ORACLE_NONE = 0,
    BX_ORACLE_ONLY = 1, /* memory = the unit holding the name, nothing else */
    BX_ORACLE_SET = 2,  /* the method's choice with that unit forced in, placed by the method's order */
    BX_ORACLE_NEAR = 3  /* the same, that unit right before the live context */
} bx_oracle;
typedef enum bx_group { BX_G_MAIN = 0, BX_G_PLACE, BX_G_SPLIT, BX_G_TOPK, BX_G_RESTART, BX_G_SELECT } bx_group;

typedef struct bx_method {
    char name[64];
    bx_sel sel;
    bx_group group;
    int32_t mode;       /* MemArt: kvmem_retrieve_mode */
    int32_t norm, agg;  /* MemArt: kvmem_retrieve_norm / _agg */
    tl_order order;
    bx_sink sink;
    bx_oracle oracle;
    double mem_frac;    /* memory's share of the window (0: budget-free methods) */
    double live_frac;   /* live context's share (0: all that is left) */
    int32_t top_k;      /* MemArt: retrieve this many blocks (0: fill the memory share) */
    tl_chunking chunking;
    kvmem_dtype restart; /* BX_G_RESTART: the agent saved in this dtype and loaded in a fresh pool */
} bx_method;

typedef struct bx_score {
    int64_t n, hits, n_g[2], hits_g[2];
    int64_t bn[BX_BUCKETS], bh[BX_BUCKETS];
    int64_t bn_g[2][BX_BUCKETS], bh_g[2][BX_BUCKETS];
    double rank_sum, lp_sum, lp_g[2];
    int64_t prefill, mem_rows, live_rows, selected, n_oracle_units;
    int32_t *rank;     /* [cases] */
    double *seconds;   /* [cases] time to the first token's logits (wall) */
    double *cpu;       /* [cases] the same in this thread's CPU time (robust on a busy machine) */
} bx_score;

typedef struct bx_case_note {
    int32_t rank[2];      /* memart deployed and memart default at 25%: rank of the name */
    int32_t blocks[2][16];/* their blocks in window order */
    int32_t n_blocks[2];
    int32_t selected[2];  /* a block naming the character among them (or the BOS row, when it does) */
    int64_t mem_rows[2], live_rows[2], prefill[2];
    int32_t name_block;
    int32_t name_blocks[4], n_name_blocks; /* the blocks of the name's first mention */
} bx_case_note;

typedef struct bx_results {
    bx_method methods[BX_MAX_METHODS];
    bx_score score[BX_MAX_METHODS];
    int32_t n_methods;
    int32_t n_cases;
    double seconds, ingest_seconds;
    double *ingest_ms;         /* [cases] */
    double *load_ms[2];        /* [cases] restart: pool + agent + load, f16 and Q4 */
    int64_t hist_tokens, hist_min, hist_max;
    int32_t deployed[3], best[3], best_exact[3]; /* method index per budget (25/50/75%) */
    bx_case_note *notes;
    int32_t block_size;
    int32_t n_inspected[2];
    char *inspect; /* markdown: failures, with the window decoded */
    size_t inspect_len, inspect_cap;
    void *outs;    /* [cases][methods] what each method gave on each case (beyond_eval.c) */
} bx_results;

typedef struct bx_cfg {
    int32_t quick;
    int32_t sink_tokens;  /* ingest's sink (4, StreamingLLM's) */
    int32_t probe_window; /* MemArt's probe sees this many newest history tokens (32) */
    kvmem_dtype storage;
    tl_order best_order;  /* the default placement: what wins on both models */
    bx_sink best_sink;
    double best_live;     /* the default live share (0: fill) */
    int progress;
    int32_t threads;      /* cases run at once, each on its own kvmem context (results do not depend on it) */
} bx_cfg;

int tl_beyond_run(const tl_recall_suite *s, const tl_model *m, const bx_cfg *c, kvmem_context *ctx,
                  bx_results *res, char *err, size_t err_size);
void tl_beyond_free(bx_results *res);
void tl_beyond_write_md(FILE *f, const bx_cfg *c, const bx_results *r, const tl_model *m, const char *model_path,
                        const tl_recall_suite *s);
void tl_beyond_write_json(FILE *f, const bx_cfg *c, const bx_results *r, const tl_model *m,
                          const char *model_path, const tl_recall_suite *s);

#endif
