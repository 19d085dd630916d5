/*
 * kvmem.h — the one public header of kvmem: memory for LLM agents kept as the
 * model's own key/value cache.
 *
 * Conventions (see DESIGN.md, "ABI rules"):
 *  - Every fallible function returns kvmem_status (KVMEM_OK == 0, errors < 0).
 *    On failure kvmem_last_error() gives a thread-local message and the object
 *    the call was made on is left exactly as it was.
 *  - No function aborts, exits or prints. Freeing NULL is a no-op.
 *  - Memory passed in is borrowed for the duration of the call. Memory returned
 *    belongs to the object that returned it, valid until the next mutating call
 *    on that object, unless documented as caller-owned.
 *  - Distinct objects may be used from distinct threads. One agent is used by
 *    one thread at a time; the pool serialises what agents share.
 *
 * C99 and C++ safe. Define KVMEM_API before including to override the export
 * decoration (e.g. when linking statically on Windows).
 */
#ifndef KVMEM_H
#define KVMEM_H

#include <stddef.h>
#include <stdint.h>

#ifndef KVMEM_API
#  if defined(_WIN32) && defined(KVMEM_SHARED_BUILD)
#    define KVMEM_API __declspec(dllexport)
#  elif defined(__GNUC__) || defined(__clang__)
#    define KVMEM_API __attribute__((visibility("default")))
#  else
#    define KVMEM_API
#  endif
#endif

#if defined(__GNUC__) || defined(__clang__)
#  define KVMEM_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#  define KVMEM_DEPRECATED(msg)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------- */
/* Version                                                                    */
/* ------------------------------------------------------------------------- */

#define KVMEM_VERSION_MAJOR 0
#define KVMEM_VERSION_MINOR 1
#define KVMEM_VERSION_PATCH 0
/* MAJOR*1000000 + MINOR*1000 + PATCH, comparable as an integer. */
#define KVMEM_VERSION_NUMBER \
    (KVMEM_VERSION_MAJOR * 1000000 + KVMEM_VERSION_MINOR * 1000 + KVMEM_VERSION_PATCH)
#define KVMEM_VERSION_STRING "0.1.0"

/* Runtime version of the loaded library, so a binding can check that the
 * header it was built against and the library agree. */
KVMEM_API int32_t kvmem_version_number(void);
KVMEM_API const char *kvmem_version(void);

/* ------------------------------------------------------------------------- */
/* Status and errors                                                          */
/* ------------------------------------------------------------------------- */

typedef enum kvmem_status {
    KVMEM_OK = 0,
    KVMEM_ERR_INVALID_ARG = -1, /* an argument is NULL, out of range or inconsistent */
    KVMEM_ERR_NOMEM = -2,       /* an allocation failed */
    KVMEM_ERR_CAPACITY = -3,    /* a configured capacity would be exceeded */
    KVMEM_ERR_NOT_FOUND = -4,   /* no such agent, block, backend, file */
    KVMEM_ERR_EXISTS = -5,      /* already exists or already open */
    KVMEM_ERR_CLOSED = -6,      /* the handle was closed or its agent removed */
    KVMEM_ERR_UNSUPPORTED = -7, /* valid, but not supported by this build/backend */
    KVMEM_ERR_BACKEND = -8,     /* a backend failed (driver, device) */
    KVMEM_ERR_IO = -9,          /* an operating-system I/O call failed */
    KVMEM_ERR_FORMAT = -10,     /* a file or value is not in the expected format */
    KVMEM_ERR_CORRUPT = -11,    /* well-formed but inconsistent (checksum, bounds) */
    KVMEM_ERR_MISMATCH = -12,   /* model spec or shape does not match the pool's */
    KVMEM_ERR_CONFLICT = -13,   /* a newer version exists (optimistic concurrency) */
    KVMEM_ERR_INTERNAL = -14,   /* a bug in kvmem: please report */
    KVMEM_ERR_BUSY = -15        /* the object is in use (e.g. an agent that is open) */
} kvmem_status;

/* Static name of a status code ("KVMEM_ERR_INVALID_ARG"); never NULL. */
KVMEM_API const char *kvmem_status_str(kvmem_status status);

/* Message describing the last failure on the calling thread (thread-local,
 * valid until the next kvmem call on this thread fails). "" if none. */
KVMEM_API const char *kvmem_last_error(void);

/* Logging. kvmem never writes to stdout/stderr; it hands messages to the
 * callback set here (process-wide; NULL turns logging off, the default). */
typedef enum kvmem_log_level {
    KVMEM_LOG_DEBUG = 0,
    KVMEM_LOG_INFO = 1,
    KVMEM_LOG_WARN = 2,
    KVMEM_LOG_ERROR = 3
} kvmem_log_level;

typedef void (*kvmem_log_callback)(kvmem_log_level level, const char *message, void *user_data);
KVMEM_API void kvmem_log_set(kvmem_log_callback callback, void *user_data);

/* Release memory that kvmem documented as caller-owned. NULL is a no-op. */
KVMEM_API void kvmem_free(void *ptr);

/* ------------------------------------------------------------------------- */
/* Tensors                                                                    */
/* ------------------------------------------------------------------------- */

/* Element types. Tensors crossing the ABI use F32, F16 or BF16; the
 * quantized types are pool storage types only. */
typedef enum kvmem_dtype {
    KVMEM_F32 = 0,
    KVMEM_F16 = 1,
    KVMEM_BF16 = 2,
    KVMEM_Q8 = 3,      /* int8, group 32, f16 scale            (storage only) */
    KVMEM_Q4 = 4,      /* 4-bit affine, group 64, f16 scale+bias (storage only) */
    KVMEM_Q4_KIVI = 5  /* Q4, keys per channel, values per token (storage only) */
} kvmem_dtype;

/* Static name of a dtype ("f16"); "?" for unknown values. */
KVMEM_API const char *kvmem_dtype_name(kvmem_dtype dtype);

#define KVMEM_MAX_DIMS 6

/* A borrowed view of a strided tensor. Shape and strides are in elements;
 * strides must be >= 0. Use kvmem_tensor_init for a contiguous view. */
typedef struct kvmem_tensor {
    void *data;
    kvmem_dtype dtype;
    int32_t ndim;
    int64_t shape[KVMEM_MAX_DIMS];
    int64_t strides[KVMEM_MAX_DIMS];
} kvmem_tensor;

/* Fill *out as a contiguous row-major view of data with the given shape.
 * Errors: KVMEM_ERR_INVALID_ARG (NULL out, ndim outside [1, KVMEM_MAX_DIMS],
 * negative extent, non-tensor dtype, element count overflow). */
KVMEM_API kvmem_status kvmem_tensor_init(kvmem_tensor *out, void *data, kvmem_dtype dtype,
                                         int32_t ndim, const int64_t *shape);

/* ------------------------------------------------------------------------- */
/* Context and backends                                                       */
/* ------------------------------------------------------------------------- */

typedef struct kvmem_context kvmem_context;

typedef struct kvmem_backend_info {
    const char *name;     /* "cpu", "cuda", "vulkan" */
    int32_t available;    /* 1 if a context can use it on this machine */
    const char *detail;   /* what it runs on, or plainly why it is unusable */
} kvmem_backend_info;

/* List the backends this build knows and whether they can run here.
 * Writes up to `capacity` entries to `out` (may be NULL when capacity is 0)
 * and the total number to *count. Strings are static, owned by the library. */
KVMEM_API kvmem_status kvmem_backends(kvmem_backend_info *out, size_t capacity, size_t *count);

typedef struct kvmem_context_params {
    const char *backend; /* "cpu", "cuda", "vulkan" or "auto" (NULL = "auto") */
    int32_t n_threads;   /* worker threads for CPU work; 0 = number of online cores */
} kvmem_context_params;

KVMEM_API kvmem_context_params kvmem_context_default_params(void);

/* Create a context. `params` may be NULL for defaults. The backend string is
 * copied. Errors: KVMEM_ERR_INVALID_ARG, KVMEM_ERR_NOT_FOUND (unknown backend),
 * KVMEM_ERR_UNSUPPORTED (known but unusable here; the message says why). */
KVMEM_API kvmem_status kvmem_context_create(const kvmem_context_params *params, kvmem_context **out);
/* Free a context. Every pool created on it must be freed first. */
KVMEM_API void kvmem_context_free(kvmem_context *ctx);
/* Name of the backend in use ("cpu"); "" for NULL. */
KVMEM_API const char *kvmem_context_backend(const kvmem_context *ctx);
/* Worker threads in use; 0 for NULL. */
KVMEM_API int32_t kvmem_context_n_threads(const kvmem_context *ctx);

/* ------------------------------------------------------------------------- */
/* Model geometry                                                             */
/* ------------------------------------------------------------------------- */

typedef enum kvmem_rope_style {
    KVMEM_ROPE_NEOX = 0, /* rotate pairs (i, i + rotary_dim/2)  (HF Llama, NeoX) */
    KVMEM_ROPE_GPTJ = 1  /* rotate pairs (2i, 2i + 1)           (GPT-J, llama2.c) */
} kvmem_rope_style;

typedef enum kvmem_rope_scaling {
    KVMEM_ROPE_SCALING_NONE = 0,
    KVMEM_ROPE_SCALING_LINEAR = 1, /* inv_freq / factor */
    KVMEM_ROPE_SCALING_LLAMA3 = 2, /* Llama 3.1: factor, low/high freq factors, original max pos */
    KVMEM_ROPE_SCALING_YARN = 3    /* YaRN: factor, beta_fast/slow, original max pos, attn factor */
} kvmem_rope_scaling;

#define KVMEM_MAX_MODEL_ID 128
#define KVMEM_MAX_AGENT_ID 128

typedef struct kvmem_model_spec {
    int32_t n_layers;   /* >= 1 */
    int32_t n_q_heads;  /* >= 1, a multiple of n_kv_heads */
    int32_t n_kv_heads; /* >= 1; query head h reads KV head h / (n_q_heads / n_kv_heads) */
    int32_t head_dim;   /* even, in [2, 1024] */
    int32_t rotary_dim; /* even, in [0, head_dim]; 0 = head_dim */
    kvmem_rope_style rope_style;
    double rope_theta;  /* base of inv_freq_j = theta^(-2j/rotary_dim); > 1 */
    kvmem_rope_scaling rope_scaling;
    double rope_factor;             /* LINEAR/LLAMA3/YARN scale factor, >= 1 */
    double rope_low_freq_factor;    /* LLAMA3 (default 1) */
    double rope_high_freq_factor;   /* LLAMA3 (default 4) */
    int32_t rope_original_max_pos;  /* LLAMA3/YARN pre-scaling context (default 8192) */
    double yarn_beta_fast;          /* YARN (default 32) */
    double yarn_beta_slow;          /* YARN (default 1) */
    double yarn_attn_factor;        /* YARN multiplier on cos/sin; 0 = 0.1*ln(factor)+1 */
    const int32_t *layer_window;    /* n_layers entries: 0 = full attention, else sliding
                                       window; NULL = all full. Copied by the pool. */
    char model_id[KVMEM_MAX_MODEL_ID]; /* free-form NUL-terminated model name */
} kvmem_model_spec;

/* Defaults: a 1-layer, 1-head, head_dim 64 shape with NEOX RoPE, theta 10000,
 * no scaling. Callers set at least the geometry. */
KVMEM_API kvmem_model_spec kvmem_model_spec_default(void);

/* Check a spec: KVMEM_OK, or KVMEM_ERR_INVALID_ARG with a message naming the
 * first field that is wrong. */
KVMEM_API kvmem_status kvmem_model_spec_validate(const kvmem_model_spec *spec);

/* Rotate vectors in place to position(s), or undo that rotation.
 * x: n_rows rows of `stride` floats, each row one head vector of head_dim.
 * positions: n_rows entries. inverse = 1 undoes the rotation (R_{-p}).
 * The angle p * inv_freq_j is computed in double precision. */
KVMEM_API kvmem_status kvmem_rope_apply(const kvmem_model_spec *spec, float *x, size_t n_rows,
                                        size_t stride, const int32_t *positions, int32_t inverse);

/* ------------------------------------------------------------------------- */
/* Pool and agents                                                            */
/* ------------------------------------------------------------------------- */

typedef struct kvmem_pool kvmem_pool;
typedef struct kvmem_agent kvmem_agent;

typedef struct kvmem_pool_params {
    int32_t block_size;          /* tokens per block: power of two in [1, 4096]; default 16 */
    kvmem_dtype storage_dtype;   /* F32, F16 (default), BF16, Q8, Q4 or Q4_KIVI (see "Persistence") */
    uint64_t capacity_bytes;     /* KV bytes the pool may hold in host memory; 0 = unlimited */
    int32_t max_agents;          /* agents the pool may hold; 0 = unlimited */
    int32_t max_tokens_per_agent;/* 0 = unlimited */
    const char *store_dir;       /* an existing directory where agents persist (one
                                    AGENT_ID.safetensors file each), the default store;
                                    NULL = none. Copied. With a store, closed agents are
                                    spilled there (least recently used first) instead of
                                    failing with KVMEM_ERR_CAPACITY, and opening an agent
                                    that is only in the store loads it. */
    uint64_t host_budget_bytes;  /* with a store: after a close, closed agents are spilled
                                    until the pool holds at most this; 0 = spill only when
                                    capacity_bytes would be exceeded */
} kvmem_pool_params;

KVMEM_API kvmem_pool_params kvmem_pool_default_params(void);

/* Create a pool for one model spec on a context (the context must outlive
 * the pool). spec and params are copied; params may be NULL for defaults.
 * Errors: KVMEM_ERR_INVALID_ARG (bad spec or params), KVMEM_ERR_UNSUPPORTED
 * (a storage dtype this build cannot store yet), KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_pool_create(kvmem_context *ctx, const kvmem_model_spec *spec,
                                         const kvmem_pool_params *params, kvmem_pool **out);
/* Free the pool, every agent's memory and every agent handle. */
KVMEM_API void kvmem_pool_free(kvmem_pool *pool);

typedef struct kvmem_pool_info {
    uint64_t used_bytes;     /* KV and AABB bytes held */
    uint64_t capacity_bytes; /* 0 = unlimited */
    int32_t n_agents;
    int32_t block_size;
    kvmem_dtype storage_dtype;
    int32_t reserved;
} kvmem_pool_info;

KVMEM_API kvmem_status kvmem_pool_get_info(kvmem_pool *pool, kvmem_pool_info *out);
/* Copy the pool's model spec to *out (layer_window then points into the pool,
 * valid for its lifetime). */
KVMEM_API kvmem_status kvmem_pool_get_spec(kvmem_pool *pool, kvmem_model_spec *out);

/* The id of the agent at `index` in the pool, agents sorted by id. Writes a
 * NUL-terminated string into buf (truncated to size) and the full length, not
 * counting the NUL, to *len (may be NULL). buf may be NULL when size is 0. */
KVMEM_API kvmem_status kvmem_pool_agent_id(kvmem_pool *pool, int32_t index, char *buf,
                                           size_t size, size_t *len);

/* 1 if `id` is a valid agent id ([A-Za-z0-9._-]{1,128}, not starting with '.'). */
KVMEM_API int32_t kvmem_agent_id_valid(const char *id);

/* Open the agent `id`, creating it (empty) if the pool does not hold it.
 * One handle per agent at a time: opening an agent that is open already fails
 * with KVMEM_ERR_EXISTS. Errors: KVMEM_ERR_INVALID_ARG (bad id),
 * KVMEM_ERR_CAPACITY (max_agents reached), KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_agent_open(kvmem_pool *pool, const char *id, kvmem_agent **out);

/* Close a handle; the agent's memory stays in the pool. Later calls on the
 * closed handle fail with KVMEM_ERR_CLOSED (the pool keeps recently closed
 * handles inert for that; a stale handle is still a bug to avoid). */
KVMEM_API void kvmem_agent_close(kvmem_agent *agent);

/* Remove an agent and its memory. Errors: KVMEM_ERR_INVALID_ARG,
 * KVMEM_ERR_NOT_FOUND, KVMEM_ERR_BUSY (the agent is open: close it first, so
 * no thread can be using memory that is freed under it). */
KVMEM_API kvmem_status kvmem_pool_remove_agent(kvmem_pool *pool, const char *id);

/* Id of an agent handle; "" for NULL or closed handles. */
KVMEM_API const char *kvmem_agent_get_id(const kvmem_agent *agent);

typedef struct kvmem_append_params {
    const int32_t *token_ids;          /* T token ids, or NULL (then stored as -1) */
    const char *text;                  /* UTF-8 text these tokens came from, or NULL */
    size_t text_len;                   /* bytes of text */
    const int32_t *token_text_offsets; /* T byte offsets into `text` where each token's text
                                          starts (non-decreasing, <= text_len), or NULL */
    const int32_t *positions;          /* T positions the keys were rotated at, when
                                          keys_rotated; NULL otherwise */
    int32_t keys_rotated;              /* 1: K is post-RoPE, kvmem de-rotates it */
    int32_t reserved;
} kvmem_append_params;

KVMEM_API kvmem_append_params kvmem_append_default_params(void);

/* Append the KV of T tokens for all layers at once.
 * k, v: [n_layers][T][n_kv_heads][head_dim] (F32, F16 or BF16, any strides).
 * Full blocks are sealed with their AABB. params may be NULL (raw keys).
 * All or nothing: on error nothing is appended.
 * Errors: KVMEM_ERR_INVALID_ARG (shape, dtype, non-finite values, bad
 * offsets), KVMEM_ERR_CAPACITY, KVMEM_ERR_CLOSED, KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_agent_append(kvmem_agent *agent, const kvmem_tensor *k,
                                          const kvmem_tensor *v, const kvmem_append_params *params);

/* Seal the partial last block (if any) so it gets an AABB and becomes
 * retrievable. The next append starts a new block. */
KVMEM_API kvmem_status kvmem_agent_flush(kvmem_agent *agent);

typedef struct kvmem_agent_info {
    int64_t n_tokens;       /* tokens appended */
    int32_t n_blocks;       /* blocks, the unsealed tail included */
    int32_t n_sealed;       /* sealed blocks (they have an AABB) */
    uint64_t bytes;         /* KV and AABB bytes this agent holds */
    uint64_t text_bytes;    /* bytes of stored text */
} kvmem_agent_info;

KVMEM_API kvmem_status kvmem_agent_get_info(kvmem_agent *agent, kvmem_agent_info *out);

typedef struct kvmem_block_info {
    int64_t first_token;  /* index of the block's first token in the agent */
    int32_t n_tokens;     /* tokens in the block (BS unless flushed early or the tail) */
    int32_t sealed;       /* 1 if it has an AABB */
} kvmem_block_info;

KVMEM_API kvmem_status kvmem_agent_block_info(kvmem_agent *agent, int32_t block,
                                              kvmem_block_info *out);

/* Read back raw (un-rotated) KV of tokens [first, first + T).
 * k_out, v_out: [n_layers][T][n_kv_heads][head_dim], F32/F16/BF16, any
 * strides; either may be NULL to skip it. */
KVMEM_API kvmem_status kvmem_agent_read(kvmem_agent *agent, int64_t first_token, int64_t n_tokens,
                                        const kvmem_tensor *k_out, const kvmem_tensor *v_out);

/* The AABB of a sealed block: out_min, out_max are
 * [n_layers][n_kv_heads][head_dim] F32 contiguous (n_layers*n_kv_heads*head_dim floats). */
KVMEM_API kvmem_status kvmem_agent_block_aabb(kvmem_agent *agent, int32_t block, float *out_min,
                                              float *out_max);

/* Token ids [first, first + n) into out (n entries; -1 where none was given). */
KVMEM_API kvmem_status kvmem_agent_tokens(kvmem_agent *agent, int64_t first, int64_t n,
                                          int32_t *out);

/* The agent's stored text: pointer owned by the agent, valid until the next
 * append on it; *len gets its length in bytes. Not NUL-terminated. */
KVMEM_API kvmem_status kvmem_agent_text(kvmem_agent *agent, const char **text, size_t *len);

/* ---- MemArt retrieval (issue: retrieval) -------------------------------- */

/* ---- IntentKV QueryMemory and eviction (issue: eviction) ---------------- */

/* ---- ART attention (issue: attend) -------------------------------------- */

/* ---- Persistence, quantization, prefix, batch (issue: persistence) ------ */

/* Storage dtypes Q8, Q4 and Q4_KIVI (pool_params.storage_dtype) quantize each
 * block when it is sealed; the unsealed tail stays f32. Groups run along each
 * token's head vector (head_dim values); when head_dim is not a multiple of
 * the group size the last group of a row is partial (any even head_dim
 * works). AABBs always come from the unquantized keys. Error bounds, per
 * value x of a group with minimum mn, maximum mx, absolute maximum amax:
 *   Q8 (group 32, f16 scale s >= amax/127):       |x - x'| <= amax/254 * (1 + 2^-10)
 *   Q4 (group 64, f16 scale and bias, MLX):       |x - x'| <= s/2, s <= (mx - mn + ulp16(mn))/15 * (1 + 2^-10)
 *   Q4_KIVI: values as Q4; keys grouped per channel over the tokens of a block
 *   (one scale and bias per channel per block), same bound with that group.
 * (plus float rounding, below 2^-20 of |x| + |mn|). Values must stay within
 * +-65504 (scales and biases are f16); larger ones are refused at append. */

/* Save an agent's memory (sealed blocks, the unsealed tail, token ids, text
 * and token offsets) as one safetensors file. path NULL = the pool's store
 * (store_dir/ID.safetensors). The write is crash-safe: a temporary file in
 * the same directory, fsync, rename, fsync of the directory, so a crash
 * leaves the old file or the new one. The agent is not changed.
 * File layout (DESIGN.md): tensors layer_{L}_k / layer_{L}_v [n_kv_heads][T][head_dim]
 * (raw dtypes) or layer_{L}_k_weights (U32 [H][T][ceil(D/8)] for Q4, I8 [H][T][D] for Q8),
 * layer_{L}_k_scales, layer_{L}_k_biases (F16 [H][T][groups]; KIVI keys
 * [H][n_blocks][D]), the same for v; layer_{L}_aabb_min|max F32 [n_blocks][H][D];
 * the unsealed tail (fewer than block_size tokens) as layer_{L}_k_tail /
 * layer_{L}_v_tail F32 [H][tail][D], so a reload restores it exactly. T counts
 * the tokens of sealed blocks. __metadata__ (strings only) holds the format
 * version, agent id, model id and spec, dtype, block size, block lengths,
 * token count, token ids, text, token offsets and an XXH64 of the data.
 * Errors: KVMEM_ERR_INVALID_ARG, KVMEM_ERR_CLOSED, KVMEM_ERR_NOT_FOUND (no
 * store and no path, or the directory is missing), KVMEM_ERR_IO, KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_agent_save(kvmem_agent *agent, const char *path);

/* Replace an agent's memory with the content of a file written by
 * kvmem_agent_save (path NULL = the pool's store). The loader validates
 * everything before changing anything: header length, strict JSON, dtypes,
 * shapes, offsets inside the file, contiguous and non-overlapping, the
 * metadata, the data checksum. All or nothing.
 * Errors: KVMEM_ERR_FORMAT (not a kvmem safetensors file, or a malformed
 * one: the message names what), KVMEM_ERR_CORRUPT (well-formed but
 * inconsistent: checksum, sizes, truncated data), KVMEM_ERR_MISMATCH (model
 * spec, dtype, block size, or the file belongs to another agent id),
 * KVMEM_ERR_NOT_FOUND, KVMEM_ERR_IO, KVMEM_ERR_CAPACITY, KVMEM_ERR_NOMEM,
 * KVMEM_ERR_CLOSED, KVMEM_ERR_INVALID_ARG. */
KVMEM_API kvmem_status kvmem_agent_load(kvmem_agent *agent, const char *path);

/* Write every agent that changed since it was last stored to the pool's
 * store (pool_free does no I/O). Errors: KVMEM_ERR_NOT_FOUND (no store),
 * KVMEM_ERR_IO and the errors of kvmem_agent_save (stops at the first). */
KVMEM_API kvmem_status kvmem_pool_sync(kvmem_pool *pool);

/* Keep the first n_tokens tokens of an agent and drop the rest (their KV,
 * token ids and text). A cut inside a sealed block re-opens that block as
 * the unsealed tail (decoded to f32; a quantized block keeps its
 * quantization error). The text is cut at the first dropped token's offset;
 * if that offset is unknown the text is dropped. Errors:
 * KVMEM_ERR_INVALID_ARG (n outside [0, n_tokens]), KVMEM_ERR_CLOSED,
 * KVMEM_ERR_CAPACITY / KVMEM_ERR_NOMEM (re-opening needs a tail buffer). */
KVMEM_API kvmem_status kvmem_agent_truncate(kvmem_agent *agent, int64_t n_tokens);

typedef enum kvmem_prefix_kind {
    KVMEM_PREFIX_EXACT = 0,   /* same text: reuse all but the last token, which the caller re-runs */
    KVMEM_PREFIX_EXTEND = 1,  /* the stored text is a prefix of the new one: reuse all */
    KVMEM_PREFIX_DIVERGE = 2  /* they differ before the stored text ends */
} kvmem_prefix_kind;

typedef struct kvmem_prefix_params {
    double min_ratio; /* DIVERGE reuses the cache only if the common prefix covers at least
                         this fraction of the stored text (bytes); default 0.8 */
} kvmem_prefix_params;

KVMEM_API kvmem_prefix_params kvmem_prefix_default_params(void);

typedef struct kvmem_prefix_result {
    kvmem_prefix_kind kind;
    int32_t reserved;
    int64_t reuse_tokens;   /* leading tokens to keep (kvmem_agent_truncate to this) */
    size_t common_bytes;    /* common prefix, cut back to a UTF-8 character boundary */
    size_t process_from;    /* byte of new_text where the caller's new tokens start */
} kvmem_prefix_result;

/* Compare the agent's stored text with new_text (character-level, UTF-8)
 * and say how much of the cache is reusable. Token boundaries come from the
 * stored token-to-text offsets: a token is reusable only if its whole text
 * lies inside the common prefix (tokens with unknown offsets end the reusable
 * run). DIVERGE below min_ratio reuses 0 tokens. The agent is not changed.
 * Errors: KVMEM_ERR_INVALID_ARG (NULL, text NULL with len > 0), KVMEM_ERR_CLOSED. */
KVMEM_API kvmem_status kvmem_prefix_match(kvmem_agent *agent, const char *new_text, size_t new_len,
                                          const kvmem_prefix_params *params, kvmem_prefix_result *out);

/* Merge one layer of several agents' memory into one batched, left-padded
 * layout: k_out, v_out [B][n_kv_heads][max_len][head_dim] (F32/F16/BF16, any
 * strides; either may be NULL), row b holding agent b's tokens at positions
 * [max_len - len_b, max_len) and zeros before them; lengths[b] = len_b (the
 * agent's token count, unsealed tail included, quantized blocks decoded).
 * One layer per call, so an engine fills its per-layer caches directly.
 * Errors: KVMEM_ERR_INVALID_ARG (NULL, B < 1, agents of different pools,
 * shapes, max_len smaller than the longest agent, layer out of range),
 * KVMEM_ERR_CLOSED. */
KVMEM_API kvmem_status kvmem_batch_merge(kvmem_agent *const *agents, int32_t n_agents, int32_t layer,
                                         const kvmem_tensor *k_out, const kvmem_tensor *v_out,
                                         int64_t *lengths);

/* Take row `row` of a left-padded batch [B][n_kv_heads][max_len][head_dim]
 * back out: its last `length` positions, from position `first` of them on,
 * n tokens, into out [n][n_kv_heads][head_dim] (token-major, the layout one
 * layer of kvmem_agent_append expects). A pure copy with dtype conversion.
 * Errors: KVMEM_ERR_INVALID_ARG (NULL, shapes, ranges). */
KVMEM_API kvmem_status kvmem_batch_extract(const kvmem_tensor *batch, int32_t row, int64_t length,
                                           int64_t first, int64_t n, const kvmem_tensor *out);

/* ---- KEEP segments (issue: segments) ------------------------------------ */

#ifdef __cplusplus
}
#endif

#endif /* KVMEM_H */
