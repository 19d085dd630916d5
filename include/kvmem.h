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
    kvmem_dtype storage_dtype;   /* F32, F16 (default) or BF16; quantized types: persistence issue */
    uint64_t capacity_bytes;     /* KV bytes the pool may hold in host memory; 0 = unlimited */
    int32_t max_agents;          /* agents the pool may hold; 0 = unlimited */
    int32_t max_tokens_per_agent;/* 0 = unlimited */
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

/* Retrieval: find the sealed blocks of an agent that a new prompt would
 * attend to, by scoring the prompt's query rows against each block's
 * axis-aligned bounding box of raw keys (DESIGN.md, "Retrieval (MemArt)"):
 *   I(q, b) = sum_d max(q_d * s_max[d], q_d * s_min[d])  (>= max_i q.k_i)
 * normalised per query token over the candidate blocks (SOFTMAX or RR),
 * aggregated over the query tokens (MAX or SUM), summed over heads (and over
 * layers for GLOBAL scope), top-k, ties toward the older block.
 * Only sealed blocks are retrievable: the unsealed tail has no AABB yet
 * (call kvmem_agent_flush first if the newest tokens must be candidates). */

typedef enum kvmem_retrieve_mode {
    KVMEM_RETRIEVE_AABB = 0, /* bounding-box relevance (the fast path) */
    KVMEM_RETRIEVE_EXACT = 1 /* I = max_i q.k_i over the block's real keys (evaluation baseline) */
} kvmem_retrieve_mode;

typedef enum kvmem_retrieve_norm {
    KVMEM_NORM_SOFTMAX = 0, /* p = exp(tau I) / sum_b' exp(tau I') over candidates */
    KVMEM_NORM_RR = 1       /* p = 1 / (rank + c), rank from 1, ties: older block ranks first */
} kvmem_retrieve_norm;

typedef enum kvmem_retrieve_agg {
    KVMEM_AGG_MAX = 0, /* S(b) = max over query tokens of p */
    KVMEM_AGG_SUM = 1  /* S(b) = sum over query tokens of p */
} kvmem_retrieve_agg;

typedef enum kvmem_retrieve_scope {
    KVMEM_SCOPE_GLOBAL = 0,   /* one block set for the whole model (S summed over layers and heads) */
    KVMEM_SCOPE_PER_LAYER = 1 /* one block set per layer (S summed over that layer's heads) */
} kvmem_retrieve_scope;

typedef struct kvmem_retrieve_params {
    int32_t top_k;                /* blocks per set, always-included ones counted; default 8, >= 0 */
    kvmem_retrieve_mode mode;     /* default AABB */
    kvmem_retrieve_norm norm;     /* default SOFTMAX */
    kvmem_retrieve_agg agg;       /* default MAX */
    kvmem_retrieve_scope scope;   /* default GLOBAL */
    float tau;                    /* SOFTMAX temperature; 0 = 1/sqrt(head_dim) */
    float rr_c;                   /* RR constant c; 0 = 60 */
    const int32_t *exclude;       /* n_exclude sealed block ids that are never candidates (borrowed) */
    int32_t n_exclude;
    const int32_t *always_include;/* n_always_include sealed block ids always in the result, e.g. the
                                     system prompt (borrowed); must not also be excluded */
    int32_t n_always_include;
    int32_t recent_window;        /* > 0: only the newest recent_window sealed blocks are candidates */
    int32_t skip_recent;          /* > 0: the newest skip_recent sealed blocks are not candidates
                                     (the engine keeps them in its local window anyway) */
} kvmem_retrieve_params;

KVMEM_API kvmem_retrieve_params kvmem_retrieve_default_params(void);

/* The result of kvmem_retrieve: an opaque, reusable object (create once,
 * retrieve into it many times). Everything it returns is owned by it and
 * valid until the next kvmem_retrieve into it or kvmem_retrieval_free. */
typedef struct kvmem_retrieval kvmem_retrieval;

/* Errors: KVMEM_ERR_INVALID_ARG (NULL out), KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_retrieval_create(kvmem_retrieval **out);
KVMEM_API void kvmem_retrieval_free(kvmem_retrieval *r);

/* Score the agent's sealed blocks against `query` and select blocks.
 * query: [n_q][n_layers][n_q_heads][head_dim], raw (pre-RoPE) query rows,
 *        F32/F16/BF16, any strides, finite, n_q >= 1.
 * params: NULL for defaults. result: filled on success; on any error it is
 *        left exactly as it was.
 * Result sets: GLOBAL -> 1 set; PER_LAYER -> n_layers sets (set = layer).
 * Each set lists every always_include block plus the top
 * (top_k - n_always_include) other candidates (fewer when fewer exist), in
 * chronological order (ascending block id), with their scores S(b). Ties
 * break toward the older block.
 * An agent with no sealed blocks gives empty sets (KVMEM_OK).
 * Threading: runs on the context's worker threads; one agent and one result
 * object per calling thread at a time.
 * Errors: KVMEM_ERR_INVALID_ARG (NULL, bad params, block ids out of range,
 * non-finite query), KVMEM_ERR_MISMATCH (query shape differs from the pool's
 * model spec), KVMEM_ERR_CLOSED, KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_retrieve(kvmem_agent *agent, const kvmem_tensor *query,
                                      const kvmem_retrieve_params *params, kvmem_retrieval *result);

/* Number of block sets in the result: 0 before the first successful
 * kvmem_retrieve (or for NULL), 1 for GLOBAL, n_layers for PER_LAYER. */
KVMEM_API int32_t kvmem_retrieval_n_sets(const kvmem_retrieval *r);

/* Selected blocks of set `set`: *blocks and *scores point into r (n entries,
 * chronological); either out pointer may be NULL. */
KVMEM_API kvmem_status kvmem_retrieval_get(const kvmem_retrieval *r, int32_t set, const int32_t **blocks,
                                           const float **scores, int32_t *n);

/* Copy-out form of kvmem_retrieval_get for bindings: writes up to
 * `capacity` entries to blocks/scores (either may be NULL) and the full
 * count to *n. */
KVMEM_API kvmem_status kvmem_retrieval_copy(const kvmem_retrieval *r, int32_t set, int32_t *blocks,
                                            float *scores, int32_t capacity, int32_t *n);

/* The aggregated score S(b) of every sealed block of the agent at retrieval
 * time (n_blocks entries indexed by block id, NaN for blocks that were not
 * candidates), pointer owned by r. For inspection and evaluation. */
KVMEM_API kvmem_status kvmem_retrieval_block_scores(const kvmem_retrieval *r, int32_t set,
                                                    const float **scores, int32_t *n_blocks);

/* Total tokens in the selected blocks of `set` (what a gather of them yields). */
KVMEM_API kvmem_status kvmem_retrieval_n_tokens(const kvmem_retrieval *r, int32_t set, int64_t *n_tokens);

/* Decoupled position re-encoding: concatenate sealed blocks in the given
 * order (normally a retrieval set, chronological), apply RoPE of the pool's
 * spec at the contiguous new positions base_position .. base_position+M-1
 * (M = total tokens of the blocks) and write
 *   k_out, v_out: [n_layers][M][n_kv_heads][head_dim], F32/F16/BF16, any strides
 * (either may be NULL to skip it). Block ids may repeat.
 * Errors: KVMEM_ERR_INVALID_ARG (NULL agent or blocks with n_blocks > 0,
 * n_blocks < 0, base_position < 0 or base_position + M > 2^31 - 1, bad
 * tensors), KVMEM_ERR_NOT_FOUND (an id that is not a sealed block: flush the
 * tail first), KVMEM_ERR_MISMATCH (output shape), KVMEM_ERR_CLOSED.
 * Nothing is written on error. Runs on the context's worker threads. */
KVMEM_API kvmem_status kvmem_gather(kvmem_agent *agent, const int32_t *blocks, int32_t n_blocks,
                                    int64_t base_position, const kvmem_tensor *k_out,
                                    const kvmem_tensor *v_out);

/* ---- IntentKV QueryMemory and eviction (issue: eviction) ---------------- */

/* ---- ART attention (issue: attend) -------------------------------------- */

/* ---- Persistence, quantization, prefix, batch (issue: persistence) ------ */

/* ---- KEEP segments (issue: segments) ------------------------------------ */

#ifdef __cplusplus
}
#endif

#endif /* KVMEM_H */
