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

/* ---- IntentKV QueryMemory and eviction (issue: eviction) ---------------- */

/* QueryMemory (IntentKV): a per-session memory of what the user's queries
 * looked at, kept across turns, and the rule score it gives each candidate
 * position of a request. Formulas: DESIGN.md, "QueryMemory and eviction".
 *
 * A memory has shape [n_layers][n_q_heads][head_dim] (f32), each (layer, head)
 * row of unit L2 norm. Query rows passed in are post-RoPE, as the model's
 * attention saw them; K passed in is post-RoPE too, so M.K is the model's own
 * logit geometry. */
typedef struct kvmem_qmem_store kvmem_qmem_store;

typedef enum kvmem_session_kind {
    KVMEM_SESSION_EXPLICIT = 1, /* the caller's session id */
    KVMEM_SESSION_MARKED = 2,   /* hash of the token span the caller marked */
    KVMEM_SESSION_PREFIX = 3,   /* hash of the first prefix_tokens token ids */
    KVMEM_SESSION_LOCAL = 4     /* request-local: never matches another key */
} kvmem_session_kind;

/* A derived session key. Two keys name the same memory iff kind, hi and lo
 * are all equal; LOCAL keys are never stored, so they never match. */
typedef struct kvmem_session_key {
    uint64_t hi, lo;
    kvmem_session_kind kind;
    int32_t reserved;
} kvmem_session_key;

/* What a session key is derived from, tried in this order: session_id
 * (non-NULL, non-empty); the marked span [mark_begin, mark_end) of token_ids
 * (when mark_end > mark_begin); the first prefix_tokens token ids (when the
 * request has at least that many); else a request-local key. */
typedef struct kvmem_session_source {
    const char *session_id;   /* NUL-terminated, or NULL */
    const int32_t *token_ids; /* n_tokens ids of the request, or NULL when n_tokens is 0 */
    int64_t n_tokens;
    int64_t mark_begin, mark_end; /* the marked session span; equal = none */
} kvmem_session_source;

typedef struct kvmem_qmem_params {
    int32_t capacity;      /* memories kept, least recently used dropped first; default 1024 */
    int32_t prefix_tokens; /* P of the PREFIX key; default 256 */
    double lambda;         /* decay: M_t = exp(-lambda) M_{t-1} + Enc; default 0.5, >= 0 */
} kvmem_qmem_params;

KVMEM_API kvmem_qmem_params kvmem_qmem_default_params(void);

/* Create a store of session memories for one model geometry (spec copied;
 * params may be NULL for defaults). Thread safety: the store has an internal
 * mutex, so one store may be shared by threads serving different requests.
 * Errors: KVMEM_ERR_INVALID_ARG (bad spec, capacity < 1, prefix_tokens < 1,
 * lambda < 0 or not finite), KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_qmem_store_create(const kvmem_model_spec *spec,
                                               const kvmem_qmem_params *params,
                                               kvmem_qmem_store **out);
KVMEM_API void kvmem_qmem_store_free(kvmem_qmem_store *store);

/* Derive the session key of a request (see kvmem_session_source for the
 * order). LOCAL keys come from a process-wide counter, unique per call.
 * Errors: KVMEM_ERR_INVALID_ARG (NULL src/out, negative n_tokens, token_ids
 * NULL with n_tokens > 0, a marked span outside [0, n_tokens)). *out is
 * untouched on failure. */
KVMEM_API kvmem_status kvmem_session_key_derive(const kvmem_qmem_store *store,
                                                const kvmem_session_source *src,
                                                kvmem_session_key *out);

/* Fold one turn into the memory of `key`:
 * Enc = mean over rows [span_begin, span_end) of q, M = exp(-lambda) M + Enc
 * (M = 0 for a new session), each (layer, head) row then scaled to unit L2
 * norm (a zero row stays zero). q: [n_q][n_layers][n_q_heads][head_dim],
 * post-RoPE query rows of this request (F32/F16/BF16, any strides).
 * The new memory is stored under the key (LOCAL keys: not stored) and, if
 * memory_out is non-NULL, copied to it (n_layers*n_q_heads*head_dim floats).
 * A new key that does not fit evicts the least recently used memory.
 * Errors: KVMEM_ERR_INVALID_ARG (shape, dtype, empty or out-of-range span,
 * non-finite query values, bad key); KVMEM_ERR_NOMEM. Nothing changes on failure. */
KVMEM_API kvmem_status kvmem_qmem_update(kvmem_qmem_store *store, const kvmem_session_key *key,
                                         const kvmem_tensor *q, int64_t span_begin,
                                         int64_t span_end, float *memory_out);

/* Copy the memory of `key` to out (n_layers*n_q_heads*head_dim floats) and
 * mark it most recently used. Errors: KVMEM_ERR_NOT_FOUND (no such session,
 * or it was evicted; LOCAL keys are never found), KVMEM_ERR_INVALID_ARG. */
KVMEM_API kvmem_status kvmem_qmem_get(kvmem_qmem_store *store, const kvmem_session_key *key,
                                      float *out);

/* Number of memories held; 0 for NULL. */
KVMEM_API int32_t kvmem_qmem_count(const kvmem_qmem_store *store);

/* Rule score of the N candidate positions of a request:
 * a[l,h,j] = softmax over j of (M[l,h] . K[l,j,h/G] / sqrt(head_dim)),
 * scores[j] = sum over l, h of a[l,h,j]  (G = n_q_heads / n_kv_heads).
 * memory: [n_layers][n_q_heads][head_dim] f32 (from kvmem_qmem_update/get).
 * k: [n_layers][N][n_kv_heads][head_dim], post-RoPE (F32/F16/BF16, any
 * strides; contiguous F32 rows are read in place). scores: N floats out.
 * Runs on the context's CPU worker threads with the SIMD kernels chosen at
 * run time; the result does not depend on the thread count.
 * Errors: KVMEM_ERR_INVALID_ARG (NULLs, spec, shape, N = 0, non-finite
 * memory), KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_qmem_score(kvmem_context *ctx, const kvmem_model_spec *spec,
                                        const float *memory, const kvmem_tensor *k,
                                        float *scores);

/* The residual head (IntentKV Phase 2), run at inference from trained
 * weights in a safetensors file: s_j = rule_j + alpha * MLP(phi_j ++ c_j).
 * Tensors (F32, F16 or BF16, little-endian; D = head_dim, F = 3D + 1):
 *   "alpha"          [1]          clipped to [-5, 5] at load
 *   "w_q"            [128][F]     cross-attention query projection of phi_j
 *   "w_k"            [128][D]     key projection of the query-span K means
 *   "w_v"            [128][D]     value projection of the same
 *   "mlp.0.weight"   [256][F+128] first MLP layer (GELU, erf form)
 *   "mlp.0.bias"     [256]
 *   "mlp.2.weight"   [1][256]     output layer (zero-initialised in training)
 *   "mlp.2.bias"     [1]
 * Every one must be present, no other tensor may be ("__metadata__" is
 * allowed). phi_j = [kbar_j || mbar || kbar_j * mbar || rule_j], kbar_j the
 * mean of K[l, j, h/G] over layers and expanded query heads, mbar the mean
 * of the memory over layers and heads; c_j = 4-head (32 wide each)
 * cross-attention from w_q phi_j over w_k kbar_i, w_v kbar_i for i in the
 * query span [span_begin, span_end). */
typedef struct kvmem_qmem_head kvmem_qmem_head;

/* Load weights from a safetensors file, validated strictly (header length,
 * JSON, names, dtypes, shapes, offsets in bounds and non-overlapping).
 * Errors: KVMEM_ERR_INVALID_ARG, KVMEM_ERR_IO, KVMEM_ERR_FORMAT,
 * KVMEM_ERR_CORRUPT, KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_qmem_head_load(const char *path, kvmem_qmem_head **out);
/* The same from a safetensors image in memory (copied). */
KVMEM_API kvmem_status kvmem_qmem_head_load_buffer(const void *data, size_t size,
                                                   kvmem_qmem_head **out);
KVMEM_API void kvmem_qmem_head_free(kvmem_qmem_head *head);
/* head_dim the weights were trained for; 0 for NULL. */
KVMEM_API int32_t kvmem_qmem_head_dim(const kvmem_qmem_head *head);
/* alpha after clipping; 0 for NULL. */
KVMEM_API float kvmem_qmem_head_alpha(const kvmem_qmem_head *head);

/* scores_out[j] = rule[j] + alpha * MLP(phi_j ++ c_j) for the N candidates of
 * k ([n_layers][N][n_kv_heads][head_dim], as for kvmem_qmem_score); rule is
 * that function's output. scores_out may equal rule. The head is read-only
 * here: several threads may apply one head at once.
 * Errors: KVMEM_ERR_INVALID_ARG (NULLs, shapes, empty or out-of-range
 * span), KVMEM_ERR_MISMATCH (spec head_dim differs from the head's),
 * KVMEM_ERR_NOMEM. Runs on the calling thread. */
KVMEM_API kvmem_status kvmem_qmem_head_apply(const kvmem_qmem_head *head, const kvmem_model_spec *spec,
                                             const float *memory, const kvmem_tensor *k,
                                             const float *rule, int64_t span_begin,
                                             int64_t span_end, float *scores_out);

/* Select the positions to keep. Forced set F = [0, protect) U [span_begin,
 * span_end) (the protected prefix and the actionable query span), budget
 * C* = max(0, budget - |F|): keep F plus the C* best of the rest by score
 * (ties: the older position). N <= budget keeps everything.
 * kept: room for N entries; gets the kept positions ascending, *n_kept their
 * count. Errors: KVMEM_ERR_INVALID_ARG (NULLs, N < 1 or > INT32_MAX, budget
 * < 0, protect outside [0, N], span not inside [0, N], NaN score). */
KVMEM_API kvmem_status kvmem_select_keep(const float *scores, int64_t n, int64_t budget,
                                         int64_t protect, int64_t span_begin, int64_t span_end,
                                         int32_t *kept, int64_t *n_kept);

/* Baselines on the same substrate. Each yields kept positions (ascending) to
 * apply with kvmem_slotmap_evict, like kvmem_select_keep. */

/* StreamingLLM: keep the first n_sink positions (4 in the paper) and the last
 * `window`. kept: room for n. Errors: KVMEM_ERR_INVALID_ARG. */
KVMEM_API kvmem_status kvmem_streaming_keep(int64_t n, int64_t n_sink, int64_t window,
                                            int32_t *kept, int64_t *n_kept);

/* H2O: accumulate attention. probs: n_rows rows of n attention
 * probabilities (what the model's softmax gave each of its query rows, any
 * layers/heads the caller chooses); acc[j] += sum over rows of probs[r][j].
 * Errors: KVMEM_ERR_INVALID_ARG (NULLs, non-finite or negative probability). */
KVMEM_API kvmem_status kvmem_h2o_accumulate(const float *probs, int64_t n_rows, int64_t n, float *acc);
/* H2O selection: keep the last `recent` positions (the recent floor) and the
 * heavy hitters, the best budget - recent of the rest by acc (ties: older).
 * kept: room for n. Errors: KVMEM_ERR_INVALID_ARG (recent > budget, ...). */
KVMEM_API kvmem_status kvmem_h2o_keep(const float *acc, int64_t n, int64_t budget, int64_t recent,
                                      int32_t *kept, int64_t *n_kept);

/* SnapKV scores. q_obs: [W][n_layers][n_q_heads][head_dim], the post-RoPE
 * query rows of the observation window (the request's last W positions,
 * N - W .. N - 1; W = 32 in the paper); k: [n_layers][N][n_kv_heads][head_dim]
 * post-RoPE. For each (l, h): softmax over keys of q_w . k / sqrt(D) with the
 * causal mask (row w sees keys <= N - W + w), summed over the W rows, then
 * max-pooled along positions (kernel `pool_kernel`, 7 in the paper, odd,
 * stride 1, same padding); scores[j] = sum over (l, h). Select with
 * kvmem_select_keep(scores, N, C, 0, N - W, N, ...) so the window is kept,
 * as SnapKV does. Errors: KVMEM_ERR_INVALID_ARG, KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_snapkv_score(kvmem_context *ctx, const kvmem_model_spec *spec,
                                          const kvmem_tensor *q_obs, const kvmem_tensor *k,
                                          int32_t pool_kernel, float *scores);

/* The paged physical KV store that slot maps point into. A slot holds one
 * token's K and V rows for every layer and KV head, f32:
 * K [n_layers][n_kv_heads][head_dim] then V the same. Slots live in pages of
 * page_slots slots; a slot's rows never move while it is allocated.
 * Slot KVMEM_DEAD_SLOT (0) is the sentinel dead slot, allocated for the
 * store's lifetime and filled with the paper's sentinel: K = -1e4 in every
 * element, V = 0. CAVEAT for external kernels reading the slot array: that
 * sentinel is only harmless when sum(q) >= 0. Its logit is
 * -1e4 * sum_d q_d / sqrt(D), hugely positive when sum(q) < 0, and then all
 * attention lands on the zero value. Mask slot == dead_slot instead; kvmem's
 * own paths (kvmem_slotmap_gather) skip dead slots and never read it.
 * Thread safety: the store's allocator and reference counts are behind a
 * mutex, so slot maps of one store may be used from different threads (one
 * thread at a time per slot map). */
#define KVMEM_DEAD_SLOT 0
#define KVMEM_SENTINEL_K (-1.0e4f)

typedef struct kvmem_kvstore kvmem_kvstore;
typedef struct kvmem_slotmap kvmem_slotmap;

typedef struct kvmem_kvstore_params {
    int32_t page_slots; /* slots per page; power of two in [1, 65536]; default 256 */
    int64_t max_slots;  /* slots the store may hold, the sentinel included; 0 = unlimited (up to INT32_MAX) */
} kvmem_kvstore_params;

KVMEM_API kvmem_kvstore_params kvmem_kvstore_default_params(void);

/* Create a store for a model spec (copied; params may be NULL). Errors:
 * KVMEM_ERR_INVALID_ARG, KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_kvstore_create(const kvmem_model_spec *spec,
                                            const kvmem_kvstore_params *params, kvmem_kvstore **out);
/* Free the store. Every slot map on it must be freed first. */
KVMEM_API void kvmem_kvstore_free(kvmem_kvstore *store);

typedef struct kvmem_kvstore_info {
    int64_t n_slots;     /* slots in allocated pages, the sentinel included */
    int64_t n_used;      /* slots with a reference, the sentinel included */
    int64_t n_free;      /* slots ready for reuse */
    int32_t page_slots;
    int32_t dead_slot;   /* KVMEM_DEAD_SLOT */
} kvmem_kvstore_info;

KVMEM_API kvmem_status kvmem_kvstore_get_info(kvmem_kvstore *store, kvmem_kvstore_info *out);

/* Reference count of a slot (0 = free). The sentinel reports 1. */
KVMEM_API kvmem_status kvmem_kvstore_slot_refs(kvmem_kvstore *store, int32_t slot, int32_t *refs);

/* Copy the K and V rows of one slot ([n_layers][n_kv_heads][head_dim] f32
 * each; either may be NULL). Reading the sentinel is allowed (it is what
 * external kernels would see). Errors: KVMEM_ERR_INVALID_ARG (slot not
 * allocated). */
KVMEM_API kvmem_status kvmem_kvstore_read_slot(kvmem_kvstore *store, int32_t slot, float *k_out,
                                               float *v_out);

/* Create an empty slot map (one request) on a store. */
KVMEM_API kvmem_status kvmem_slotmap_create(kvmem_kvstore *store, kvmem_slotmap **out);

/* Create a sibling request that shares the first prefix_len positions of
 * `parent` (radix-style: same physical slots, reference counts raised; dead
 * positions stay dead). The child's protected prefix is
 * min(parent's, prefix_len). Errors: KVMEM_ERR_INVALID_ARG (prefix_len
 * outside [0, parent length]), KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_slotmap_fork(kvmem_slotmap *parent, int64_t prefix_len,
                                          kvmem_slotmap **out);

/* Release every reference the map holds (slots whose count falls to 0 go
 * back to the allocator) and free it. NULL is a no-op. */
KVMEM_API void kvmem_slotmap_free(kvmem_slotmap *map);

/* Append T tokens at logical positions len .. len + T - 1: T fresh slots are
 * allocated and K, V ([n_layers][T][n_kv_heads][head_dim], post-RoPE keys,
 * F32/F16/BF16, any strides) written into them. All or nothing.
 * Errors: KVMEM_ERR_INVALID_ARG (shape, dtype, non-finite), KVMEM_ERR_CAPACITY
 * (max_slots), KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_slotmap_append(kvmem_slotmap *map, const kvmem_tensor *k,
                                            const kvmem_tensor *v);

/* The radix-protected prefix [0, protect): slots of dropped positions there
 * are never returned to the allocator while the map lives (a prefix cache
 * may still hold them). Errors: KVMEM_ERR_INVALID_ARG (outside [0, length]). */
KVMEM_API kvmem_status kvmem_slotmap_set_protected(kvmem_slotmap *map, int64_t protect);

/* Evict by redirection: every position not in kept (ascending, unique, in
 * [0, length)) is pointed at the dead slot. Kept positions keep their slot
 * and their RoPE phase: nothing moves. A dropped slot goes back to the
 * allocator only when its position is outside the protected prefix, it is
 * not the sentinel and no reference is left (this map's or a sibling's).
 * Evicting an already dead position is a no-op. *n_freed (may be NULL) gets
 * the number of slots returned to the allocator.
 * Errors: KVMEM_ERR_INVALID_ARG (kept not ascending/unique/in range); the map
 * is unchanged on failure. */
KVMEM_API kvmem_status kvmem_slotmap_evict(kvmem_slotmap *map, const int32_t *kept, int64_t n_kept,
                                           int64_t *n_freed);

/* The comparison path: compaction. Kept rows are moved together to
 * positions 0 .. n_kept - 1; a row whose position changes is copied to a
 * fresh slot with its key re-rotated from its old position to the new one
 * (core/rope, the store's spec); a row whose position does not change keeps
 * its slot. Old slots are released as by kvmem_slotmap_evict. The map's
 * length becomes n_kept and its protected prefix min(protect, n_kept).
 * Errors: as kvmem_slotmap_evict, plus KVMEM_ERR_CAPACITY, KVMEM_ERR_NOMEM
 * (the map is unchanged on failure). */
KVMEM_API kvmem_status kvmem_slotmap_compact(kvmem_slotmap *map, const int32_t *kept, int64_t n_kept,
                                             int64_t *n_freed);

/* The map as a plain slot array for attention kernels: *slots gets the
 * logical-position -> slot array (owned by the map, valid until its next
 * mutating call), *len its length, *dead_slot the sentinel id (may be NULL). */
KVMEM_API kvmem_status kvmem_slotmap_slots(const kvmem_slotmap *map, const int32_t **slots,
                                           int64_t *len, int32_t *dead_slot);

typedef struct kvmem_slotmap_info {
    int64_t length;   /* logical positions */
    int64_t n_live;   /* positions not mapped to the dead slot */
    int64_t protect;  /* protected prefix */
    int64_t n_parked; /* dropped protected-prefix slots still held */
} kvmem_slotmap_info;

KVMEM_API kvmem_status kvmem_slotmap_get_info(const kvmem_slotmap *map, kvmem_slotmap_info *out);

/* Gather the live rows only (dead slots are skipped, never read), in
 * position order: k_out, v_out [n_layers][n_live][n_kv_heads][head_dim]
 * (F32/F16/BF16, any strides; either may be NULL), positions_out n_live
 * logical positions (may be NULL). Keys come out as stored (post-RoPE at
 * their original positions). Errors: KVMEM_ERR_INVALID_ARG (shapes). */
KVMEM_API kvmem_status kvmem_slotmap_gather(const kvmem_slotmap *map, const kvmem_tensor *k_out,
                                            const kvmem_tensor *v_out, int32_t *positions_out);

/* ---- ART attention (issue: attend) -------------------------------------- */

/* ---- Persistence, quantization, prefix, batch (issue: persistence) ------ */

/* ---- KEEP segments (issue: segments) ------------------------------------ */

#ifdef __cplusplus
}
#endif

#endif /* KVMEM_H */
