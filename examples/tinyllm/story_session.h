/* A story agent one session at a time, for programs that are not the
 * `tinyllm demo` command line: the browser page (wasm/glue/tinyllm.c) and
 * its native reference (story_json.c). A session does what story.c's does:
 * encode the new text; ask kvmem for memory (MemArt as deployed: the live
 * context plus the blocks the prompt's queries retrieve, a quarter of the
 * history); prefill the text on it, continue greedily, append both to the
 * agent; and, beside it, continue on full context and on a recent window of
 * the same budget. Optionally kvmem's run attends with ART (kvmem_attend),
 * and the session reports where ART stopped. The result is JSON.
 *
 * Not thread-safe: one story is used by one thread at a time. */
#ifndef TINYLLM_STORY_SESSION_H
#define TINYLLM_STORY_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "tinyllm.h"

/* The session limits of story.c: tokens generated per continuation, tokens
 * of history the probe sees, the smallest memory budget, the longest prompt. */
enum { TL_STORY_GEN = 20, TL_STORY_PROBE_WINDOW = 32, TL_STORY_MIN_BUDGET = 32, TL_STORY_MAX_PROMPT = 128 };

typedef struct tl_story tl_story;

typedef struct tl_story_opts {
    int32_t art;      /* 1: kvmem's run (prefill and decode) attends with ART, kvmem_attend at its
                         default thresholds; 0: the engine's exact attention (as story.c) */
    int32_t art_tile; /* ART tile size in positions, 0 = kvmem's default */
} tl_story_opts;

/* The memory budget story.c gives a history of n tokens: a quarter of it in
 * whole blocks of 16, at least TL_STORY_MIN_BUDGET. */
int64_t tl_story_budget(int64_t n);

/* Open a story on a model and a tokenizer file (NULL: the model's own
 * vocabulary, GGUF). Returns 0, or -1 with a message in err. */
int tl_story_open(const char *model_path, const char *tokenizer_path, tl_story **out, char *err, size_t err_size);

/* The same from file images in memory (copied; tok NULL or tok_size 0: the
 * model's own vocabulary). */
int tl_story_open_bytes(const uint8_t *model, size_t model_size, const uint8_t *tok, size_t tok_size,
                        tl_story **out, char *err, size_t err_size);

void tl_story_free(tl_story *s); /* NULL: no-op */

/* Forget the history: the next session is the first again. */
int tl_story_reset(tl_story *s, char *err, size_t err_size);

/* Tokens in the agent's history. */
int64_t tl_story_history(const tl_story *s);

/* The model and tokenizer, as JSON (caller frees with free()): format, dim,
 * hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, vocab, seq_len, the
 * ART defaults. NULL when out of memory. */
char *tl_story_describe(const tl_story *s);

/* One session in steps, for a caller that shows it its own way (story.c):
 * tl_story_step runs it (encode, memory, the three continuations) without
 * changing the story; tl_story_commit appends kvmem's run to the agent;
 * tl_story_run_free releases the run (committed or not). */
typedef struct tl_story_run {
    int32_t session;              /* 1-based */
    int64_t history, budget;      /* tokens before the session, the memory budget */
    int32_t prompt[TL_STORY_MAX_PROMPT], n_prompt;
    int32_t has_memory;           /* 0 in the first session */
    int32_t mem_rows;             /* memory rows kvmem's run attended to */
    tl_build_info info;           /* the live context and the retrieved blocks */
    int32_t gen[TL_STORY_GEN], n_gen;       /* kvmem's continuation */
    int32_t full[TL_STORY_GEN], n_full;     /* on full context */
    int32_t recent[TL_STORY_GEN], n_recent; /* on the newest `budget` tokens */
    int32_t art_on;
    tl_art art, art_prefill;      /* ART stats, all and after the prefill */
    tl_kv kv;                     /* kvmem's working set (what commit appends from) */
} tl_story_run;

int tl_story_step(tl_story *s, const char *text, size_t len, const tl_story_opts *opts, tl_story_run *run,
                  char *err, size_t err_size);
int tl_story_commit(tl_story *s, tl_story_run *run, char *err, size_t err_size);
void tl_story_run_free(tl_story_run *run);
/* The run as the JSON tl_story_session returns (caller frees); NULL when out of memory. */
char *tl_story_run_json(tl_story *s, const char *text, size_t len, const tl_story_run *run);

/* The text of history tokens [first, first + n) (caller frees); NULL on failure. */
char *tl_story_text(tl_story *s, int64_t first, int64_t n);

/* kvmem's logits for a session's prompt over the memory as it stands, without
 * running the session: [n_prompt][vocab] into logits (room for cap_rows rows). */
int tl_story_prompt_logits(tl_story *s, const char *text, size_t len, float *logits, int32_t cap_rows,
                           int32_t *n_prompt, char *err, size_t err_size);

/* Persistence: the agent to one safetensors file, and back (the history is replaced). */
int tl_story_save(tl_story *s, const char *path, char *err, size_t err_size);
int tl_story_load(tl_story *s, const char *path, char *err, size_t err_size);

/* A block of the agent (kvmem_agent_block_info); -1 with kvmem_last_error() set. */
int tl_story_block_info(tl_story *s, int32_t block, kvmem_block_info *out);

const tl_model *tl_story_model(const tl_story *s);
const char *tl_story_agent_id(const tl_story *s);

/* Run one session on `len` bytes of UTF-8 text (opts NULL: exact attention).
 * On success *json gets the session (caller frees with free()):
 *   session, history, budget, text, prompt (ids), memory (null in the first
 *   session, else rows, local_rows, retrieved_rows, blocks [{id,
 *   first, n, ids, text}], live {first, n, ids, text}), art (null, or
 *   tile_size and prefill / decode {tiles_visited, tiles_total,
 *   positions_read}), kvmem / full / recent continuations {ids, text}
 *   (full and recent null in the first session; recent has its window),
 *   tokens {prefilled, probed, reread}.
 * Refused (-1, the story unchanged): empty text, a prompt over
 * TL_STORY_MAX_PROMPT tokens, a history that would pass the model's
 * context length. */
int tl_story_session(tl_story *s, const char *text, size_t len, const tl_story_opts *opts, char **json, char *err,
                     size_t err_size);

/* The tokenizer: text to ids (bos: prepend BOS) and ids to text (caller frees). */
int tl_story_encode(const tl_story *s, const char *text, size_t len, int bos, int32_t *out, int32_t cap,
                    int32_t *n_out, char *err, size_t err_size);
char *tl_story_decode(const tl_story *s, const int32_t *ids, int32_t n);

#endif
