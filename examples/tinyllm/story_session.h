/* A story agent one session at a time, for programs that are not the
 * `tinyllm demo` command line: the browser page (wasm/glue/story.c) and its
 * native reference (story_json.c). A story's history may grow to several
 * windows of the model: past its trained window the model alone cannot read
 * it, and every memory gets the same window. A session encodes the new text
 * and continues it greedily on four contexts, each within the model's window
 * except the last:
 *   - kvmem: the blocks the text's queries retrieve (MemArt: AABB scores of
 *     the text run over the newest history, the probe), placed before the
 *     live context (the newest history), re-encoded at contiguous positions;
 *   - text RAG: the history's text in 16-token chunks, ranked by BM25
 *     against the new text, the chosen chunks' text prefilled again before
 *     the same live context, with the same token budget;
 *   - the recent window: the newest history tokens that fill the same room;
 *   - the whole history at its own positions, past the window once it is
 *     longer (what the model alone makes of it).
 * kvmem's run is the one kept: the new text (not a continuation: the history
 * is what the sessions said) goes into the agent. Optionally kvmem's run
 * attends with ART (kvmem_attend), and the session reports where ART
 * stopped. The result is JSON.
 *
 * Not thread-safe: one story is used by one thread at a time. */
#ifndef TINYLLM_STORY_SESSION_H
#define TINYLLM_STORY_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "beyond.h"
#include "tinyllm.h"

/* The session limits: tokens generated per continuation, tokens of history
 * the probe sees, the longest prompt, the agent's capacity in windows of
 * the model, the most text-RAG chunks one session takes. */
enum { TL_STORY_GEN = 20, TL_STORY_PROBE_WINDOW = 32, TL_STORY_MAX_PROMPT = 160, TL_STORY_WINDOWS = 8,
       TL_STORY_MAX_CHUNKS = 64 };

/* How the window is shared (tl_story_opts; 0 = the default): retrieved memory
 * and live context as shares of the model's window, and the order retrieved
 * blocks are placed in. */
#define TL_STORY_MEM_FRAC 0.25
#define TL_STORY_LIVE_FRAC 0.125
#define TL_STORY_ORDER TL_ORDER_RUNS

typedef struct tl_story tl_story;

typedef struct tl_story_opts {
    int32_t art;      /* 1: kvmem's run (prefill and decode) attends with ART, kvmem_attend at its
                         default thresholds; 0: the engine's exact attention */
    int32_t art_tile; /* ART tile size in positions, 0 = kvmem's default */
    double mem_frac;  /* retrieved memory, a share of the window (whole blocks); 0 = TL_STORY_MEM_FRAC */
    double live_frac; /* live context, a share of the window; 0 = TL_STORY_LIVE_FRAC */
    int32_t order;    /* tl_order + 1 of the retrieved blocks before the live context; 0 = TL_STORY_ORDER */
    int32_t kvmem_only; /* 1: kvmem's run alone, none of the others (rag, recent, full null) */
} tl_story_opts;

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
 * changing the story; tl_story_commit appends the session's text to the agent;
 * tl_story_run_free releases the run (committed or not). */
typedef struct tl_story_run {
    int32_t session;              /* 1-based */
    int64_t history, budget;      /* tokens before the session; memory + live context: what every memory
                                     gets of the window besides the text and the continuation */
    tl_split split;               /* the window's shares: retrieved memory, live context */
    int32_t order;                /* tl_order of the retrieved blocks */
    int32_t prompt[TL_STORY_MAX_PROMPT], n_prompt;
    int32_t has_memory;           /* 0 in the first session */
    int32_t compared;             /* the other contexts ran (not the first session, not kvmem_only) */
    int32_t mem_rows;             /* rows kvmem's run attended to before the text */
    tl_build_info info;           /* the live context and the retrieved blocks, in window order */
    float scores[TL_MAX_BLOCKS];  /* the retrieved blocks' retrieval scores */
    int32_t gen[TL_STORY_GEN], n_gen;       /* kvmem's continuation */
    int32_t full[TL_STORY_GEN], n_full;     /* on the whole history at its own positions */
    int32_t full_past_window;               /* 1: that passed the model's trained window */
    int32_t recent[TL_STORY_GEN], n_recent; /* on the newest `budget` tokens */
    int32_t rag[TL_STORY_GEN], n_rag;       /* text RAG's */
    tl_chunk rag_chunks[TL_STORY_MAX_CHUNKS];
    int32_t n_rag_chunks, rag_tokens;       /* chosen chunks (chronological); the tokens of its context
                                               (BOS, the chunks, the live context), all prefilled */
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
 * running the session (opts as tl_story_step's): [n_prompt][vocab] into
 * logits (room for cap_rows rows). */
int tl_story_prompt_logits(tl_story *s, const char *text, size_t len, const tl_story_opts *opts, float *logits,
                           int32_t cap_rows, int32_t *n_prompt, char *err, size_t err_size);

/* Persistence: the agent to one safetensors file, and back (the history is replaced). */
int tl_story_save(tl_story *s, const char *path, char *err, size_t err_size);
int tl_story_load(tl_story *s, const char *path, char *err, size_t err_size);

/* A block of the agent (kvmem_agent_block_info); -1 with kvmem_last_error() set. */
int tl_story_block_info(tl_story *s, int32_t block, kvmem_block_info *out);

const tl_model *tl_story_model(const tl_story *s);
const char *tl_story_agent_id(const tl_story *s);

/* Run one session on `len` bytes of UTF-8 text (opts NULL: the defaults).
 * On success *json gets the session (caller frees with free()):
 *   session, history, budget, split {memory, live, order}, text, prompt
 *   (ids), memory (null in the first session, else rows, local_rows,
 *   retrieved_rows, blocks [{id, score, first, n, ids, text}] in window
 *   order, live {first, n, ids, text}), art (null, or tile_size and
 *   prefill / decode {tiles_visited, tiles_total, positions_read}), kvmem /
 *   rag / recent / full continuations {ids, text} (all but kvmem null in the
 *   first session; rag has chunks [{first, n, text}], recent its window,
 *   full past_window), tokens {prefilled, probed, rag_prefilled, reread}:
 *   what each context ran through the model (kvmem: the text, and the text
 *   again as the probe; text RAG: BOS, the chunks, the live context and the
 *   text; a text agent re-reading the whole history: all of it).
 * Refused (-1, the story unchanged): empty text, a prompt over
 * TL_STORY_MAX_PROMPT tokens or one that leaves no room in the window, a
 * history that would pass TL_STORY_WINDOWS windows, bad options. */
int tl_story_session(tl_story *s, const char *text, size_t len, const tl_story_opts *opts, char **json, char *err,
                     size_t err_size);

/* The tokenizer: text to ids (bos: prepend BOS) and ids to text (caller frees). */
int tl_story_encode(const tl_story *s, const char *text, size_t len, int bos, int32_t *out, int32_t cap,
                    int32_t *n_out, char *err, size_t err_size);
char *tl_story_decode(const tl_story *s, const int32_t *ids, int32_t n);

#endif
