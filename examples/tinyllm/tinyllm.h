/*
 * tinyllm — a small Llama-family inference engine (CPU, f32, plain loops)
 * that keeps its KV cache in kvmem. It exists to show the whole loop of an
 * engine using kvmem on a real model, and to measure how well each kvmem
 * method keeps the model's outputs (tinyllm eval).
 *
 * The engine owns the transformer math; kvmem owns the memory. The engine's
 * attention runs over a "working set" (tl_kv): post-RoPE K and V rows with
 * their positions, built each turn from the agent's memory by one of the
 * methods (full history, a window, eviction, retrieval) and extended by the
 * turn's own tokens as they are processed.
 */
#ifndef TINYLLM_H
#define TINYLLM_H

#include <stddef.h>
#include <stdint.h>

#include <kvmem.h>

#define TL_ERR_SIZE 256

typedef struct tl_tokenizer tl_tokenizer;

typedef struct tl_config {
    int32_t dim;        /* model width */
    int32_t hidden_dim; /* feed-forward width */
    int32_t n_layers;
    int32_t n_heads;    /* query heads */
    int32_t n_kv_heads; /* key/value heads (GQA) */
    int32_t vocab_size;
    int32_t seq_len;    /* trained context length */
    int32_t head_dim;   /* dim / n_heads */
    int32_t rope_style; /* KVMEM_ROPE_GPTJ (llama2.c, GGUF "llama") or KVMEM_ROPE_NEOX */
    float rope_theta;
    float norm_eps;
} tl_config;

/* Weight pointers into tl_model.data (row-major [out][in] matrices). */
typedef struct tl_weights {
    const float *tok_emb;   /* [vocab][dim] */
    const float *rms_att;   /* [L][dim] */
    const float *wq;        /* [L][dim][dim] */
    const float *wk;        /* [L][kv_dim][dim] */
    const float *wv;        /* [L][kv_dim][dim] */
    const float *wo;        /* [L][dim][dim] */
    const float *rms_ffn;   /* [L][dim] */
    const float *w1;        /* [L][hidden][dim] (gate) */
    const float *w2;        /* [L][dim][hidden] (down) */
    const float *w3;        /* [L][hidden][dim] (up) */
    const float *rms_final; /* [dim] */
    const float *wcls;      /* [vocab][dim] (may equal tok_emb) */
} tl_weights;

typedef struct tl_model {
    tl_config cfg;
    tl_weights w;
    float *data; /* owned: every weight, f32 */
    size_t n_data;
    char format[16]; /* "llama2c" or "gguf" */
    tl_tokenizer *vocab;  /* owned: the vocabulary a GGUF file carries (NULL: none) */
    char vocab_note[160]; /* why vocab is NULL when the file has one we cannot use */
} tl_model;

/* Load a llama2.c checkpoint (.bin) or a GGUF file (magic "GGUF"; llama
 * architecture, F32/F16 tensors). Returns 0, or -1 with a message in err.
 * The format is told by content: GGUF's magic, else a llama2.c header whose
 * sizes are plausible and describe exactly the file's size; anything else
 * (a safetensors file, a tokenizer, text) is "not a llama2.c or GGUF file".
 * The file is validated: sizes, shapes, offsets in bounds, finite weights. */
int tl_model_load(const char *path, tl_model *m, char *err, size_t err_size);
int tl_model_load_llama2c(const char *path, tl_model *m, char *err, size_t err_size);
int tl_model_load_gguf(const char *path, tl_model *m, char *err, size_t err_size);
/* The same GGUF reader over a file image in memory (not kept). */
int tl_model_load_gguf_buffer(const uint8_t *buf, size_t size, tl_model *m, char *err,
                              size_t err_size);
void tl_model_free(tl_model *m);

/* ---- Tokenizer: llama2.c's (sentencepiece BPE with byte fallback). ----
 * A tokenizer is immutable once made: any number of threads may encode and
 * decode with one. Every function refuses bad input with -1/NULL and a
 * message (where it takes err); none prints or aborts. */

/* Token types (GGUF's tokenizer.ggml.token_type values). */
enum { TL_TOKEN_NORMAL = 1, TL_TOKEN_UNKNOWN = 2, TL_TOKEN_CONTROL = 3, TL_TOKEN_USER = 4,
       TL_TOKEN_UNUSED = 5, TL_TOKEN_BYTE = 6 };
#define TL_TOKENIZER_MAX_VOCAB (1 << 22)

/* llama2.c tokenizer file (int32 max_token_length, then per token: float32
 * score, int32 length, bytes); vocab_size must equal the model's. 0, or -1
 * with the reason in err (truncated, lengths past the end, negative or
 * over-long lengths, non-finite scores, another vocabulary size). */
int tl_tokenizer_load(const char *path, int32_t vocab_size, tl_tokenizer **out, char *err,
                      size_t err_size);
/* The same over a file image in memory (not kept). */
int tl_tokenizer_parse(const uint8_t *buf, size_t size, int32_t vocab_size, tl_tokenizer **out,
                       char *err, size_t err_size);
/* The vocab a GGUF model carries (m loaded from GGUF; a copy the caller
 * frees), or -1 with a reason when it has none. */
int tl_tokenizer_from_model(const tl_model *m, tl_tokenizer **out, char *err, size_t err_size);
void tl_tokenizer_free(tl_tokenizer *t); /* NULL: no-op */
int32_t tl_tokenizer_vocab(const tl_tokenizer *t);
int32_t tl_tokenizer_bos(const tl_tokenizer *t); /* -1: none */
int32_t tl_tokenizer_eos(const tl_tokenizer *t); /* -1: none */
/* Encode UTF-8 text (len bytes; any bytes: invalid UTF-8 goes by byte
 * fallback) with the dummy prefix; bos: prepend BOS. Writes at most cap ids;
 * *n_out = ids needed. 0, or -1 (cap too small, out of memory, bad
 * arguments). out == NULL with cap == 0 asks for the size only (0). */
int tl_encode(const tl_tokenizer *t, const char *text, size_t len, int bos, int32_t *out,
              int32_t cap, int32_t *n_out, char *err, size_t err_size);
/* The bytes token id stands for when it follows prev (prev == BOS: the
 * dummy prefix's leading space stripped; prev < 0: none). BOS, EOS and other
 * control tokens stand for no bytes; <0xNN> for the byte NN. The pointer
 * lives as long as the tokenizer; NULL (and *len 0) for an id out of range. */
const char *tl_token_piece(const tl_tokenizer *t, int32_t prev, int32_t id, size_t *len);
/* Decode ids into a malloc'd NUL-terminated string (caller frees), BOS/EOS
 * dropped; NULL on failure (an id out of range, no memory). */
char *tl_decode(const tl_tokenizer *t, const int32_t *ids, int32_t n);
/* The same, with the length (the text may hold NUL bytes). */
char *tl_decode_len(const tl_tokenizer *t, const int32_t *ids, int32_t n, size_t *len);
/* The tokenizer beside a model: $KVMEM_TEST_TOKENIZER, else tok512.bin in
 * the model's directory (written into buf); NULL if absent. */
const char *tl_find_tokenizer(const char *model_path, char *buf, size_t buf_size);

/* kvmem's description of the model's KV geometry and RoPE. */
kvmem_model_spec tl_model_spec(const tl_model *m);

/* The path of the test model: $KVMEM_TEST_MODEL, else `fallback` (normally
 * "../shared/models/stories260K.bin"), or NULL when that file is absent. */
const char *tl_find_model(const char *fallback);

/* The attention working set: post-RoPE K and V rows of every layer, each
 * row with its RoPE position. Rows are appended; a working set is rebuilt
 * from kvmem memory for each turn. */
typedef struct tl_kv {
    int32_t n_layers, kv_dim; /* kv_dim = n_kv_heads * head_dim */
    int32_t cap, n;           /* rows allocated, rows in use */
    float *k, *v;             /* [L][cap][kv_dim] */
    int32_t *pos;             /* [cap] */
} tl_kv;

int tl_kv_init(tl_kv *kv, const tl_config *cfg, int32_t cap);
void tl_kv_free(tl_kv *kv);
/* Append rows from [L][T][kv_dim] post-RoPE K and V with positions. */
int tl_kv_append(tl_kv *kv, const float *k, const float *v, int32_t T, const int32_t *pos);

/* What a forward pass may record besides logits. All optional (NULL). */
typedef struct tl_trace {
    float *q_raw;    /* [n][L][n_heads][head_dim] queries before RoPE (retrieval) */
    float *q_rot;    /* [n][L][n_heads][head_dim] queries after RoPE (IntentKV, SnapKV) */
    float *k_rot;    /* [L][n][kv_dim] the chunk's post-RoPE keys (to append to an agent) */
    float *v_out;    /* [L][n][kv_dim] the chunk's values */
    float *attn_acc; /* [kv.cap] += attention probability of every row, summed over
                        layers, heads and query rows (H2O) */
} tl_trace;

/* ART (kvmem_attend) instead of the engine's own attention, per query row. */
typedef struct tl_art {
    kvmem_context *ctx;
#ifdef TINYLLM_HAVE_ATTEND
    kvmem_attend_params params;
#endif
    int64_t tiles_total, tiles_visited, positions_read; /* accumulated stats */
} tl_art;

typedef struct tl_state tl_state; /* scratch buffers of one model */

tl_state *tl_state_create(const tl_config *cfg, int32_t max_chunk);
void tl_state_free(tl_state *s);
/* tl_forward refuses a working set the model was not trained for: more rows
 * than its trained length (seq_len), or a query further than seq_len - 1
 * positions from a key. allow = 1 runs it anyway (a baseline that shows what
 * happens past the window). */
void tl_state_allow_past_window(tl_state *s, int allow);
/* Why the last tl_forward on this state failed ("" after a success). */
const char *tl_state_error(const tl_state *s);
/* The most tokens one tl_forward on this state takes. */
int32_t tl_state_max_chunk(const tl_state *s);

/* Run n tokens (n <= max_chunk) at the given positions through the model.
 * Each token's K/V row is appended to kv, then each token attends to every
 * row of kv up to its own (the rows before the chunk, and the chunk's rows
 * causally). logits: [n][vocab] (NULL: none). art: NULL for the engine's
 * exact attention. kv_rows_read (may be NULL) += K/V rows read per layer
 * summed over layers (the bytes read are that times kv_dim * 2 * 4).
 * Returns 0, or -1 (capacity, bad argument, past the trained window, an ART
 * failure) with the reason in tl_state_error(s). */
int tl_forward(const tl_model *m, tl_state *s, tl_kv *kv, const int32_t *tokens, int32_t n,
               const int32_t *positions, float *logits, tl_trace *trace, tl_art *art,
               int64_t *kv_rows_read);

/* Sample from logits at temperature t (t == 0: argmax) with a splitmix64 state. */
int32_t tl_sample(const float *logits, int32_t vocab, float temperature, uint64_t *rng);
uint64_t tl_rng_next(uint64_t *s);

/* Sample n tokens from the model (the first is BOS = 1) at temperature temp
 * with a seed: in-distribution text for it. Returns 0 or -1. */
int tl_sample_sequence(const tl_model *m, uint64_t seed, float temp, int32_t n, int32_t *out);

/* KL(p || q) in nats and the argmax agreement of two logit rows. */
double tl_kl_logits(const float *p_logits, const float *q_logits, int32_t vocab);
int32_t tl_argmax(const float *x, int32_t n);

/* ---- Memory methods: the agent's history in kvmem, and the working set a
 * method builds from it for a new turn. ---- */

/* An agent's history: every past token's KV lives in a kvmem agent (keys
 * appended post-RoPE with their positions; kvmem de-rotates them), plus what
 * the eviction baselines need to know about it. */
typedef struct tl_history {
    kvmem_context *ctx;
    kvmem_pool *pool;
    kvmem_agent *agent;
    kvmem_model_spec spec;
    int32_t n_layers, n_heads, n_kv_heads, head_dim, kv_dim, q_dim, block_size;
    int64_t n, cap;   /* tokens held, tokens allowed */
    float *acc;       /* [cap] H2O: attention each position received so far */
    float *q_rot;     /* [cap][L][n_heads*head_dim] post-RoPE queries (SnapKV window) */
    float *qmem;      /* [L][n_heads][head_dim] IntentKV QueryMemory after the last turn */
    int32_t have_qmem;
    void *qstore;     /* kvmem_qmem_store (when the build has IntentKV) */
    char agent_id[64];
} tl_history;

/* Create a pool (storage dtype `storage`, block size `block_size`) and an
 * agent `agent_id` in it for up to cap tokens. Returns 0 or -1 (err). */
int tl_history_init(tl_history *h, kvmem_context *ctx, const tl_model *m, int64_t cap,
                    kvmem_dtype storage, int32_t block_size, const char *agent_id, char *err,
                    size_t err_size);
void tl_history_free(tl_history *h);

/* Append T tokens: k_rot, v [L][T][kv_dim] (post-RoPE keys), positions,
 * token ids; q_rot [T][L][q_dim] or NULL; acc: the H2O accumulator for
 * positions [0, n + T) after this chunk (NULL: unchanged, zeros for the
 * new ones); the first prompt_len rows of the chunk are the user's prompt
 * (folded into the IntentKV QueryMemory when > 0). Full blocks are sealed
 * and the tail flushed, so every token is retrievable. */
int tl_history_append(tl_history *h, const float *k_rot, const float *v, int32_t T,
                      const int32_t *positions, const int32_t *tokens, const float *q_rot,
                      const float *acc, int32_t prompt_len, char *err, size_t err_size);

/* Persistence (when the build has it): save the agent's memory to one
 * safetensors file; load replaces the agent's memory with a file's and sets
 * h->n. Only what kvmem stores survives (KV, token ids): the H2O and SnapKV
 * statistics start empty after a load. */
int tl_history_save(tl_history *h, const char *path, char *err, size_t err_size);
int tl_history_load(tl_history *h, const char *path, char *err, size_t err_size);

typedef enum tl_method_kind {
    TL_M_FULL = 0,      /* every history token at its original position */
    TL_M_RECENT,        /* the last `budget` tokens */
    TL_M_STREAMING,     /* StreamingLLM: 4 sinks + recent window */
    TL_M_H2O,           /* heavy hitters by accumulated attention + recent half */
    TL_M_SNAPKV,        /* SnapKV: observation window of the last 32 history queries */
    TL_M_INTENTKV,      /* IntentKV rule score from the QueryMemory of past turns */
    TL_M_MEMART         /* MemArt retrieval by the new prompt's queries, gathered, re-encoded */
} tl_method_kind;

/* MemArt's default split of a budget: this share is the live context. */
#define TL_MEMART_LOCAL_FRAC 0.75f

typedef struct tl_method {
    char name[48];
    tl_method_kind kind;
    int32_t mode, norm, agg; /* MemArt: kvmem_retrieve_mode / _norm / _agg */
    int32_t art;             /* decode with ART (kvmem_attend) at its default tau */
    int32_t art_tile;        /* ART tile size (0 = kvmem's default) */
    int32_t needs_probe;     /* needs the new prompt's queries (a probe prefill) */
    int32_t orig_pos;        /* MemArt: keep each block at its original positions (no re-encoding) */
    int32_t keep_recent;     /* MemArt: always include the newest keep_recent blocks */
    float local_frac;        /* MemArt as deployed: this share of the budget goes to the newest
                                history blocks (the live context, at their own positions), the
                                rest to retrieved blocks; 0 = retrieval only */
    int32_t reprobe;         /* MemArt: retrieve again every `reprobe` decoded tokens, asked
                                with the queries of the last `reprobe` tokens (0 = once per turn) */
    float art_tau_scale;     /* ART: multiply the default tau_s, tau_d (0 = 1) */
    int32_t art_order;       /* ART: kvmem_attend_order + 1 (0 = kvmem's default) */
    int32_t art_patience;    /* ART: patience (0 = kvmem's default) */
    int32_t reencode;        /* eviction methods: the kept rows at contiguous positions 0.. (a cache
                                that must fit the model's window), not at their own */
} tl_method;

/* The methods this build supports, in table order. Returns the count
 * (at most cap written). missing: a note naming methods compiled out (may be NULL). */
int32_t tl_method_list(tl_method *out, int32_t cap, char *missing, size_t missing_size);

/* Build the working set for a turn that starts at position turn_pos:
 * memory rows (at most `budget` tokens of history; budget <= 0 = all) in kv
 * (reset first). probe_q_raw: [n_probe][L][q_dim] pre-RoPE queries of the
 * new prompt (MemArt), or NULL. Returns 0 or -1 (err). *n_memory gets the
 * rows selected. */
int tl_memory_build(tl_history *h, const tl_method *m, int64_t budget, const float *probe_q_raw,
                    int32_t n_probe, int32_t turn_pos, tl_kv *kv, char *err, size_t err_size);

/* What a build chose (MemArt): the local window and the retrieved blocks. */
#define TL_MAX_BLOCKS 256
typedef struct tl_build_info {
    int64_t local_rows;     /* newest history rows kept at their own positions */
    int64_t retrieved_rows; /* rows of retrieved blocks */
    int32_t n_blocks;       /* retrieved block ids, chronological (at most TL_MAX_BLOCKS kept) */
    int32_t blocks[TL_MAX_BLOCKS];
} tl_build_info;

/* tl_memory_build that also reports its choice (info may be NULL). */
int tl_memory_build_info(tl_history *h, const tl_method *m, int64_t budget, const float *probe_q_raw,
                         int32_t n_probe, int32_t turn_pos, tl_kv *kv, tl_build_info *info, char *err,
                         size_t err_size);

/* The number of newest sealed blocks MemArt keeps as its local window for a
 * budget (what tl_memory_build_info would keep), and their tokens. */
int32_t tl_memart_local_blocks(tl_history *h, const tl_method *m, int64_t budget, int64_t *tokens);

/* The last `n` history tokens at their original positions (MemArt's local
 * window for the probe), appended to kv. */
int tl_memory_recent(tl_history *h, int64_t n, tl_kv *kv, char *err, size_t err_size);

/* ---- Tokenizer (llama2.c's format; GGUF models carry their own vocab) ---- */
typedef struct tl_tokenizer tl_tokenizer;
int tl_tokenizer_load(const char *path, int32_t vocab_size, tl_tokenizer **out, char *err, size_t err_size);
int tl_tokenizer_from_model(const tl_model *m, tl_tokenizer **out, char *err, size_t err_size);
void tl_tokenizer_free(tl_tokenizer *t);
int32_t tl_tokenizer_vocab(const tl_tokenizer *t);
int tl_encode(const tl_tokenizer *t, const char *text, size_t len, int bos, int32_t *out, int32_t cap,
              int32_t *n_out, char *err, size_t err_size);
const char *tl_token_piece(const tl_tokenizer *t, int32_t prev, int32_t id, size_t *len);
char *tl_decode(const tl_tokenizer *t, const int32_t *ids, int32_t n);
const char *tl_find_tokenizer(const char *model_path, char *buf, size_t buf_size);

#endif
