/*
 * tinyllm beyond the window: what an engine needs when an agent's history is
 * longer than the model's trained window (stories15M: 256 tokens).
 *
 *   - ingest: the engine's own context for new text once the history no
 *     longer fits: the sink (the history's first tokens) and the newest
 *     tokens that fit, re-encoded contiguously; the new KV goes to kvmem.
 *   - the window: rows of the history (token ranges, or sealed blocks through
 *     kvmem_gather) re-encoded at contiguous positions, in any order.
 *   - text memory, the baseline an agent builder would otherwise pick: the
 *     history's text cut into chunks (fixed token counts, or sentences),
 *     ranked by Okapi BM25 against the new text, re-prefilled.
 *   - placement: the order retrieved units go in before the live context.
 *   - the split: how much of the window is memory and how much live context.
 *
 * Everything here is plain C11 over tinyllm.h and kvmem's public API; the
 * placement and split helpers need neither a model nor kvmem.
 */
#ifndef TINYLLM_BEYOND_H
#define TINYLLM_BEYOND_H

#include "tinyllm.h"

/* ---- BM25 over a set of texts ----
 * Words: runs of ASCII letters and digits, lowercased (no stemming, no stop
 * list). score(q, d) = sum over distinct query words w present in d of
 *   idf(w) * f(w,d) * (k1 + 1) / (f(w,d) + k1 * (1 - b + b * |d| / avgdl))
 * with idf(w) = ln(1 + (N - n(w) + 0.5) / (n(w) + 0.5)) (Lucene's), |d| the
 * document's words, N documents, n(w) documents holding w. */
#define TL_BM25_K1 1.2
#define TL_BM25_B 0.75

typedef struct tl_bm25 tl_bm25;

/* Index n texts (docs[i], lens[i] bytes; copied). 0, or -1 (no memory). */
int tl_bm25_create(const char *const *docs, const size_t *lens, int32_t n, tl_bm25 **out);
void tl_bm25_free(tl_bm25 *b); /* NULL: no-op */
/* scores[n]: each text's score against the query text. */
void tl_bm25_score(const tl_bm25 *b, const char *query, size_t len, float *scores);

/* ---- Text memory: a history's tokens as chunks of text ---- */
typedef enum tl_chunking {
    TL_CHUNK_TOKENS = 0,   /* fixed spans of chunk_tokens tokens, aligned to token 0 (with a block
                              size equal to chunk_tokens, chunk i holds block i's tokens) */
    TL_CHUNK_SENTENCES = 1 /* sentences: a chunk ends after a token whose text ends in . ! or ?
                              (a closing quote may follow) or holds a newline */
} tl_chunking;

typedef struct tl_chunk {
    int32_t first, n; /* history tokens [first, first + n); control tokens (BOS) are left out */
} tl_chunk;

typedef struct tl_textmem tl_textmem;

/* Chunk history ids[0, n) and index the chunks' text for BM25. The text of a
 * chunk is its tokens decoded. 0, or -1 with the reason in err. */
int tl_textmem_create(const tl_tokenizer *tok, const int32_t *ids, int32_t n, tl_chunking how,
                      int32_t chunk_tokens, tl_textmem **out, char *err, size_t err_size);
void tl_textmem_free(tl_textmem *t); /* NULL: no-op */
int32_t tl_textmem_count(const tl_textmem *t);
tl_chunk tl_textmem_chunk(const tl_textmem *t, int32_t i);
/* The chunk holding history token `tok` (-1: none, e.g. BOS). */
int32_t tl_textmem_find(const tl_textmem *t, int32_t tok);
/* BM25 scores of every chunk against the query text (scores[count]). */
void tl_textmem_score(const tl_textmem *t, const char *query, size_t len, float *scores);
/* Text RAG's choice: the best-scored chunks (score > 0; ties to the older)
 * that end at or before token `limit` (where the live context starts), taken
 * while their tokens fit `budget` (a chunk that does not fit is passed over).
 * Writes chunk ids in chronological order; returns how many (at most cap);
 * *tokens (may be NULL) gets their total. */
int32_t tl_textmem_choose(const tl_textmem *t, const float *scores, int32_t budget, int32_t limit, int32_t *out,
                          int32_t cap, int32_t *tokens);

/* ---- Placement: where retrieved units go before the live context ----
 * Units are blocks or chunks, identified by ids that grow with time (adjacent
 * ids are adjacent in the history); each has a score, higher = more relevant.
 * The result is the order in the window: out[0] is farthest from the cue,
 * out[n - 1] right before the live context. */
typedef enum tl_order {
    TL_ORDER_CHRONO = 0, /* ascending ids: the history's own order (MemArt's paper) */
    TL_ORDER_SCORE = 1,  /* ascending score: the best unit nearest the cue; ties: the older farther */
    TL_ORDER_RUNS = 2    /* runs of adjacent ids kept whole and chronological inside, the runs by
                            ascending best score: the best run nearest the cue */
} tl_order;

const char *tl_order_name(tl_order o);
/* ids[n] (any order, distinct, >= 0), scores[n] (NULL for CHRONO) -> out[n] (kvmem_arrange).
 * 0, or -1 (bad order, n < 0, a repeated id, a NaN score). */
int tl_place(const int32_t *ids, const float *scores, int32_t n, tl_order order, int32_t *out);

/* ---- The split of a window ---- */
typedef struct tl_split {
    int32_t memory; /* tokens of retrieved memory (whole blocks) */
    int32_t live;   /* newest history tokens kept as the live context */
} tl_split;

/* A window of `window` tokens holding `reserve` tokens of the turn itself
 * (its prompt and what it will generate): memory = mem_frac of the window,
 * rounded down to whole blocks; live = live_frac of the window (0: all that
 * is left), never more than what is left. Both >= 0 (kvmem_window_split;
 * 0 and 0 when reserve is larger than the window). */
tl_split tl_window_split(int32_t window, int32_t reserve, double mem_frac, double live_frac, int32_t block);

/* ---- The window: history rows re-encoded at contiguous positions ---- */

/* History tokens [first, first + n) at positions base.. appended to kv. */
int tl_window_put_tokens(tl_history *h, int64_t first, int64_t n, int32_t base, tl_kv *kv, char *err,
                         size_t err_size);
/* Sealed blocks in the order given (kvmem_gather: RoPE at base..), appended to kv. */
int tl_window_put_blocks(tl_history *h, const int32_t *blocks, int32_t n, int32_t base, tl_kv *kv,
                         char *err, size_t err_size);
/* The first block whose tokens reach `tok` or later, i.e. how many sealed
 * blocks end before token tok (blocks of the history before it). */
int32_t tl_history_blocks_before(tl_history *h, int64_t tok);
/* The block holding history token `tok` (-1: none). */
int32_t tl_history_block_of(tl_history *h, int64_t tok);

/* ---- Ingest: the engine's context past the window ----
 * Run tokens[0, n) (the continuation of the history) through the model and
 * append their KV to h. While the history and the new tokens fit the
 * model's window, that is plain full context at the tokens' own positions.
 * Past it, each chunk of at most window/2 tokens sees the history's first
 * `sink` tokens and the newest tokens that fill the rest of the window,
 * re-encoded at contiguous positions (StreamingLLM's cache, the engine's own
 * state when the history no longer fits). The chunk's queries are kept
 * rotated at the tokens' own positions (SnapKV, IntentKV) and the attention
 * each history token receives is added to h->acc (H2O); the first
 * prompt_len new tokens fold into IntentKV's QueryMemory. Blocks are sealed
 * as they fill (the tail stays unsealed). s must take chunks of window/2
 * tokens. 0, or -1 with the reason in err. */
int tl_history_ingest(tl_history *h, const tl_model *m, tl_state *s, const int32_t *tokens, int32_t n,
                      int32_t sink, int32_t prompt_len, char *err, size_t err_size);

#endif
