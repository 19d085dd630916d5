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
 *    one thread at a time; the pool serialises what agents share. Breaking
 *    that rule is detected, not undefined: a call on an agent handle that a
 *    call on another thread is using fails with KVMEM_ERR_BUSY (one atomic
 *    operation per call), and kvmem_agent_close waits for that call.
 *  - Parameter structs start with struct_size; parts still moving are
 *    declared only under KVMEM_EXPERIMENTAL (see "ABI and versioning").
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

/* Define KVMEM_ALLOW_DEPRECATED before including to use deprecated forms
 * without a warning (the library's own tests of them do). */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(KVMEM_ALLOW_DEPRECATED)
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
/* ABI and versioning                                                         */
/* ------------------------------------------------------------------------- */

/* docs/abi.md gives the reasons and the cases; the contract:
 *  - Stable: everything outside the "Experimental" section. Within a major
 *    version a stable function keeps its name, arguments and meaning (it
 *    may gain params fields and error cases); one that must change gets a
 *    _v2 and the old one stays, marked KVMEM_DEPRECATED.
 *  - Experimental: declared only when the includer defines
 *    KVMEM_EXPERIMENTAL; always exported, may change in any release.
 *  - Parameter structs (kvmem_*_params) start with `size_t struct_size`,
 *    set by the inline kvmem_X_default_params() through
 *    kvmem_X_params_init(params, struct_size), which writes the first
 *    struct_size bytes: the library's defaults, zeros for fields it lacks.
 *    Fields are only appended; a field added later means "as before" when
 *    zero. A smaller struct_size (an older binary): only those bytes are
 *    read, the rest defaults. A larger one: accepted when every byte past
 *    the library's layout is zero, else KVMEM_ERR_UNSUPPORTED. 0, below
 *    sizeof(size_t), not a multiple of its alignment or above 4096:
 *    KVMEM_ERR_INVALID_ARG, and params_init writes nothing. A `reserved`
 *    field must be 0 (KVMEM_ERR_UNSUPPORTED otherwise).
 *  - Structs the library fills (*_info, *_stats, *_result) have no size
 *    field: their layout changes only with the major version. */

/* ------------------------------------------------------------------------- */
/* Status and errors                                                          */
/* ------------------------------------------------------------------------- */

/* The objects (opaque handles; their functions below). */
typedef struct kvmem_context kvmem_context;
typedef struct kvmem_pool kvmem_pool;
typedef struct kvmem_agent kvmem_agent;

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
    KVMEM_ERR_BUSY = -15        /* the object is in use (an agent that is open, or a handle
                                   a call on another thread is using) */
} kvmem_status;

/* Static name of a status code ("KVMEM_ERR_INVALID_ARG"); never NULL. */
KVMEM_API const char *kvmem_status_str(kvmem_status status);

/* Message describing the last failure on the calling thread (thread-local,
 * valid until the next kvmem call on this thread fails). "" if none. */
KVMEM_API const char *kvmem_last_error(void);

/* The same message, kept by the object the call was made on, for callers
 * whose call ran on a thread they cannot run code on afterwards (koffi's
 * `.async`, N-API async work, a worker pool): kvmem_agent_last_error after
 * a failed call on an agent (append, read, save, load, retrieve, gather,
 * ...), kvmem_pool_last_error after one on a pool (sync, agent_open,
 * remove_agent, ...), kvmem_context_last_error after kvmem_attend or
 * kvmem_qmem_score on a context. It is what kvmem_last_error() said on
 * the calling thread right after the call. A call that succeeds leaves it as
 * it was; a call refused before it could take the object (a NULL or closed
 * handle, an agent busy on another thread) does not set it. Pools and
 * contexts are shared between threads: theirs is the latest failure on any
 * thread, so read it from the caller that serialises calls on the object.
 * Copies the message into buf (NUL-terminated, cut to size - 1 bytes; buf
 * may be NULL when size is 0) and returns its full length; "" and 0 for a
 * NULL object or when no call on it failed yet. Thread-safe. */
KVMEM_API size_t kvmem_agent_last_error(const kvmem_agent *agent, char *buf, size_t size);
KVMEM_API size_t kvmem_pool_last_error(const kvmem_pool *pool, char *buf, size_t size);
KVMEM_API size_t kvmem_context_last_error(const kvmem_context *ctx, char *buf, size_t size);

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
    size_t struct_size; /* sizeof(kvmem_context_params), set by kvmem_context_default_params() */
    const char *backend; /* "cpu", "cuda", "vulkan" or "auto" (NULL = "auto") */
    int32_t n_threads;   /* worker threads for CPU work; 0 = number of online cores */
    int32_t reserved;    /* 0 */
} kvmem_context_params;

/* The defaults, struct_size = this header's sizeof ("ABI and versioning"). */
KVMEM_API kvmem_status kvmem_context_params_init(kvmem_context_params *params, size_t struct_size);
static inline kvmem_context_params kvmem_context_default_params(void) {
    kvmem_context_params p;
    kvmem_context_params_init(&p, sizeof p);
    return p;
}

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
 * no scaling. Callers set at least the geometry. The spec has no struct_size
 * and is returned by value, so it cannot grow within this major version
 * (docs/abi.md, "Structs without a size field"): kvmem_model_spec_v2 below
 * is the form that grows. */
KVMEM_API kvmem_model_spec kvmem_model_spec_default(void);

/* Check a spec: KVMEM_OK, or KVMEM_ERR_INVALID_ARG with a message naming the
 * first field that is wrong. */
KVMEM_API kvmem_status kvmem_model_spec_validate(const kvmem_model_spec *spec);

/* Rotate vectors in place to position(s), or undo that rotation.
 * x: n_rows rows of `stride` floats, each row one head vector of head_dim.
 * positions: n_rows entries. inverse = 1 undoes the rotation (R_{-p}).
 * The angle p * inv_freq_j is computed in double precision.
 * Errors: KVMEM_ERR_INVALID_ARG (bad spec, NULL x or positions, stride <
 * head_dim, rows that could not fit in memory: (n_rows - 1) * stride +
 * head_dim floats beyond PTRDIFF_MAX bytes), KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_rope_apply(const kvmem_model_spec *spec, float *x, size_t n_rows,
                                        size_t stride, const int32_t *positions, int32_t inverse);

/* ------------------------------------------------------------------------- */
/* Pool and agents                                                            */
/* ------------------------------------------------------------------------- */

typedef struct kvmem_pool_params {
    size_t struct_size; /* sizeof(kvmem_pool_params), set by kvmem_pool_default_params() */
    int32_t block_size;          /* tokens per block: power of two in [1, 4096]; default 16 */
    kvmem_dtype storage_dtype;   /* F32, F16 (default), BF16, Q8, Q4 or Q4_KIVI (see "Persistence") */
    uint64_t capacity_bytes;     /* KV bytes the pool may hold in host memory; 0 = unlimited.
                                    Freed blocks the pool keeps for its next load or append
                                    (at most as many bytes as its agents hold; freed when the
                                    pool is) count against it and give way to every
                                    reservation */
    int32_t max_agents;          /* agents the pool may hold; 0 = unlimited */
    int32_t max_tokens_per_agent;/* 0 = unlimited */
    const char *store_dir;       /* an existing directory where agents persist (one
                                    AGENT_ID.safetensors file each), the default store;
                                    NULL = none. Copied. With a store, closed agents are
                                    spilled there (least recently used first) instead of
                                    failing with KVMEM_ERR_CAPACITY, until a sixteenth of
                                    capacity_bytes is free besides the reservation (a
                                    reservation over a 64th of it spills so even when it
                                    fits: who fills the pool pays for the spills), and
                                    opening an agent that is only in the store loads it.
                                    A spill writes without holding the pool: only calls
                                    on the agent being written wait for it.
                                    Or a store URL (see "Sharing memory across hosts"
                                    in README.md): "redis://[[user]:pass@]host[:port][/db]"
                                    or "unix:///path.sock", options after '?': pool=NAME,
                                    ttl=SECONDS, timeout_ms=N, chunk_bytes=N, db=N. Needs
                                    the libkvmem-redis.so plugin (built with hiredis);
                                    without it pool_create fails with
                                    KVMEM_ERR_UNSUPPORTED. A save based on an older
                                    version than the stored one fails with
                                    KVMEM_ERR_CONFLICT and writes nothing. */
    uint64_t host_budget_bytes;  /* with a store: after a close, closed agents are spilled
                                    until the pool holds at most this; 0 = spill only when
                                    capacity_bytes would be exceeded */
    uint64_t device_capacity_bytes; /* device bytes the agents' device-resident mirrors
                                    (a device context's copy of their sealed blocks: K, V,
                                    AABBs, tail, RoPE table) may hold together; 0 = no
                                    limit but the device's own. The mirror is a cache of
                                    the host copy: at the limit, the mirrors of closed
                                    agents give way (least recently used first); an open
                                    agent whose mirror still does not fit is served
                                    without one (retrieval and gather stage its blocks
                                    per call, attention over it runs on the CPU), with
                                    the same results. Nothing is refused and appends are
                                    not affected. kvmem_pool_device_stats reports the
                                    bytes held. Ignored on a CPU context. */
} kvmem_pool_params;

/* The defaults, struct_size = this header's sizeof ("ABI and versioning"). */
KVMEM_API kvmem_status kvmem_pool_params_init(kvmem_pool_params *params, size_t struct_size);
static inline kvmem_pool_params kvmem_pool_default_params(void) {
    kvmem_pool_params p;
    kvmem_pool_params_init(&p, sizeof p);
    return p;
}

/* Create a pool for one model spec on a context (the context must outlive
 * the pool). spec and params are copied; params may be NULL for defaults.
 * Errors: KVMEM_ERR_INVALID_ARG (bad spec or params), KVMEM_ERR_UNSUPPORTED
 * (a storage dtype this build cannot store yet), KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_pool_create(kvmem_context *ctx, const kvmem_model_spec *spec,
                                         const kvmem_pool_params *params, kvmem_pool **out);
/* Free the pool, every agent's memory and every agent handle. */
KVMEM_API void kvmem_pool_free(kvmem_pool *pool);

typedef struct kvmem_pool_info {
    uint64_t used_bytes;     /* KV and AABB bytes held by agents (freed blocks kept for
                                reuse not counted: see capacity_bytes) */
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
 * handles inert for that; a stale handle is still a bug to avoid). A call
 * running on the handle in another thread is waited for. */
KVMEM_API void kvmem_agent_close(kvmem_agent *agent);

/* Remove an agent and its memory. Errors: KVMEM_ERR_INVALID_ARG,
 * KVMEM_ERR_NOT_FOUND, KVMEM_ERR_BUSY (the agent is open: close it first, so
 * no thread can be using memory that is freed under it). */
KVMEM_API kvmem_status kvmem_pool_remove_agent(kvmem_pool *pool, const char *id);

/* Id of an agent handle; "" for NULL or closed handles. */
KVMEM_API const char *kvmem_agent_get_id(const kvmem_agent *agent);

typedef struct kvmem_append_params {
    size_t struct_size; /* sizeof(kvmem_append_params), set by kvmem_append_default_params() */
    const int32_t *token_ids;          /* T token ids, or NULL (then stored as -1) */
    const char *text;                  /* UTF-8 text these tokens came from, or NULL */
    size_t text_len;                   /* bytes of text */
    const int32_t *token_text_offsets; /* T byte offsets into `text` where each token's text
                                          starts (non-decreasing, <= text_len), or NULL */
    const int32_t *positions;          /* T positions the keys were rotated at, when
                                          keys_rotated; NULL otherwise */
    int32_t keys_rotated;              /* 1: K is post-RoPE, kvmem de-rotates it */
    int32_t reserved;                  /* 0 */
} kvmem_append_params;

/* The defaults, struct_size = this header's sizeof ("ABI and versioning"). */
KVMEM_API kvmem_status kvmem_append_params_init(kvmem_append_params *params, size_t struct_size);
static inline kvmem_append_params kvmem_append_default_params(void) {
    kvmem_append_params p;
    kvmem_append_params_init(&p, sizeof p);
    return p;
}

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
 * [n_layers][n_kv_heads][head_dim] F32 contiguous (n_layers*n_kv_heads*head_dim floats).
 * min <= every key of the block <= max. Pools storing F16, Q8, Q4 or Q4 KIVI
 * keep boxes in f16 rounded outward (the exact f32 min rounded down, max
 * rounded up); F32 and BF16 pools keep the exact f32 min and max. */
KVMEM_API kvmem_status kvmem_agent_block_aabb(kvmem_agent *agent, int32_t block, float *out_min,
                                              float *out_max);

/* Token ids [first, first + n) into out (n entries; -1 where none was given). */
KVMEM_API kvmem_status kvmem_agent_tokens(kvmem_agent *agent, int64_t first, int64_t n,
                                          int32_t *out);

/* The agent's stored text: pointer owned by the agent, valid until the next
 * append on it; *len gets its length in bytes. Not NUL-terminated. */
KVMEM_API kvmem_status kvmem_agent_text(kvmem_agent *agent, const char **text, size_t *len);

/* ------------------------------------------------------------------------- */
/* Retrieval by key bounds (MemArt) and gather                                */
/* ------------------------------------------------------------------------- */

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
    size_t struct_size; /* sizeof(kvmem_retrieve_params), set by kvmem_retrieve_default_params() */
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
    int32_t reserved;             /* 0 */
} kvmem_retrieve_params;

/* The defaults, struct_size = this header's sizeof ("ABI and versioning"). */
KVMEM_API kvmem_status kvmem_retrieve_params_init(kvmem_retrieve_params *params, size_t struct_size);
static inline kvmem_retrieve_params kvmem_retrieve_default_params(void) {
    kvmem_retrieve_params p;
    kvmem_retrieve_params_init(&p, sizeof p);
    return p;
}

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

/* ------------------------------------------------------------------------- */
/* Query memory and eviction (IntentKV)                                       */
/* ------------------------------------------------------------------------- */

/* QueryMemory (IntentKV): a per-session memory of what the user's queries
 * looked at, kept across turns, and the rule score it gives each candidate
 * position of a request. Formulas: DESIGN.md, "QueryMemory and eviction".
 *
 * A memory has shape [n_layers][n_q_heads][head_dim] (f32), each (layer, head)
 * row of unit L2 norm. Query rows passed in are post-RoPE, as the model's
 * attention saw them; K passed in is post-RoPE too, so M.K is the model's own
 * logit geometry. The residual head over the rule score and the eviction
 * baselines (StreamingLLM, H2O, SnapKV) are in the experimental section. */
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

/* (Frozen, no struct_size: kvmem_session_source_v2 below is the form that
 * grows.) What a session key is derived from, tried in this order: session_id
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
    size_t struct_size; /* sizeof(kvmem_qmem_params), set by kvmem_qmem_default_params() */
    int32_t capacity;      /* memories kept, least recently used dropped first; default 1024 */
    int32_t prefix_tokens; /* P of the PREFIX key; default 256 */
    double lambda;         /* decay: M_t = exp(-lambda) M_{t-1} + Enc; default 0.5, >= 0 */
} kvmem_qmem_params;

/* The defaults, struct_size = this header's sizeof ("ABI and versioning"). */
KVMEM_API kvmem_status kvmem_qmem_params_init(kvmem_qmem_params *params, size_t struct_size);
static inline kvmem_qmem_params kvmem_qmem_default_params(void) {
    kvmem_qmem_params p;
    kvmem_qmem_params_init(&p, sizeof p);
    return p;
}

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

/* The same source with struct_size first, so it can grow ("ABI and
 * versioning"; kvmem_session_source is frozen): the same fields, the same
 * meaning. kvmem_session_source_v2_init zeroes it and sets struct_size;
 * set fields after it. */
typedef struct kvmem_session_source_v2 {
    size_t struct_size; /* sizeof(kvmem_session_source_v2), set by kvmem_session_source_v2_init() */
    const char *session_id;
    const int32_t *token_ids;
    int64_t n_tokens;
    int64_t mark_begin, mark_end;
} kvmem_session_source_v2;

static inline void kvmem_session_source_v2_init(kvmem_session_source_v2 *src) {
    unsigned char *b = (unsigned char *)src;
    for (size_t i = 0; i < sizeof *src; i++) b[i] = 0;
    src->struct_size = sizeof *src;
}

/* kvmem_session_key_derive from a kvmem_session_source_v2. struct_size is
 * read as for params structs; errors as kvmem_session_key_derive, plus
 * KVMEM_ERR_INVALID_ARG / KVMEM_ERR_UNSUPPORTED for a struct_size no version
 * has or a newer struct setting fields this library lacks. */
KVMEM_API kvmem_status kvmem_session_key_derive_v2(const kvmem_qmem_store *store,
                                                   const kvmem_session_source_v2 *src,
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
 * run time; the result does not depend on the thread count. On a context
 * whose backend is a device with the kernel (Vulkan), it runs there: K is
 * staged as contiguous f32 and uploaded for the call. Scratch:
 * min(16, n_layers) * (n_q_heads + 1) * N floats for the call.
 * Errors: KVMEM_ERR_INVALID_ARG (NULLs, spec, shape, N = 0, non-finite
 * memory, non-finite K: found through the logits, which cost 1/head_dim of
 * reading K, or on a device through the staged copy; a logit that
 * overflows is refused the same way), KVMEM_ERR_NOMEM. scores is written
 * only on success. */
KVMEM_API kvmem_status kvmem_qmem_score(kvmem_context *ctx, const kvmem_model_spec *spec,
                                        const float *memory, const kvmem_tensor *k,
                                        float *scores);

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
    size_t struct_size; /* sizeof(kvmem_kvstore_params), set by kvmem_kvstore_default_params() */
    int32_t page_slots; /* slots per page; power of two in [1, 65536]; default 256 */
    int64_t max_slots;  /* slots the store may hold, the sentinel included; 0 = unlimited (up to INT32_MAX) */
} kvmem_kvstore_params;

/* The defaults, struct_size = this header's sizeof ("ABI and versioning"). */
KVMEM_API kvmem_status kvmem_kvstore_params_init(kvmem_kvstore_params *params, size_t struct_size);
static inline kvmem_kvstore_params kvmem_kvstore_default_params(void) {
    kvmem_kvstore_params p;
    kvmem_kvstore_params_init(&p, sizeof p);
    return p;
}

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
 * its slot. Old slots are released as by kvmem_slotmap_evict (a protected
 * position's old slot is parked, moved or dropped). Kept positions that are
 * already dead are skipped; the map's length becomes the number of live
 * kept positions M and its protected prefix min(protect, M).
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

/* ------------------------------------------------------------------------- */
/* Attention with early termination (ART)                                     */
/* ------------------------------------------------------------------------- */

/* Attention with run-time termination (ART, DESIGN.md): tiled online-softmax
 * attention for decode (one query row) and short prefill (up to
 * KVMEM_ATTEND_MAX_ROWS rows), grouped-query (query head h reads KV head
 * h / (n_q_heads / n_kv_heads)), that can stop reading KV once its running
 * output is stable in scale and direction for `patience` tiles in a row.
 *
 * Logical positions: every source is a sequence of T logical positions
 * j = 0 .. T-1 (tensor rows, agent tokens, slot-map entries). With `causal`
 * the n_rows query rows are the last n_rows positions: row r sees
 * j <= T - n_rows + r. Tiles are runs of `tile_size` consecutive positions
 * (an agent's tiles are its blocks). Positions that are masked (mask[j] == 0)
 * or dead (slot-map entry == dead_slot) are skipped: their K/V are never read.
 *
 * The stop rule runs per stream = (query row, KV head): the stream's output
 * o_t is the [G][head_dim] outputs of the G = n_q_heads / n_kv_heads query
 * heads that read that KV head, after tile t, normalised by the running
 * denominator. The probe z_t is 32 of its N = G*head_dim elements,
 * z_i = o_t[i*s + s/2] with s = N/32 (the whole vector when N <= 32); the
 * ORACLE probe is the whole vector. After each tile with a visible position:
 *   scale:     | |z_t| - |z_{t-1}| | <= tau_s * |z_{t-1}|
 *   direction: 1 - cos(z_t, z_{t-1}) <= tau_d
 * and the stream stops after `patience` consecutive tiles pass both. A
 * stream's KV head is shared by its G heads, so stopping per stream saves
 * exactly the reads it stops; streams are independent, so they run on
 * different threads without a barrier per tile. tau_s = tau_d = 0 never
 * stops: the result is full attention up to float rounding, in any order.
 *
 * Orders. The rule is safe only if the tiles come in falling order of
 * attention mass: it bets that the tiles it has not reached matter less
 * than those it has. RECENT (newest first) wins that bet where attention
 * decays with age and loses it on far tokens that matter (on recall-heavy
 * histories its error stays high at every threshold: docs/attend-defaults.md).
 * SCORED, the default, needs no caller
 * input: each KV head visits the tiles by their largest logit (over the
 * rows and the head's group of query heads), highest first:
 *  - TENSORS / SLOTMAP: exact. A first pass reads every visible K row and
 *    keeps the logits, so the attention then reads only V of the tiles it
 *    visits: never more than full attention reads, and at least the K half.
 *    (Where the logits would pass 4 Mi floats, n_rows * n_q_heads * T, K is
 *    read again where visited, and calls with at most 2 * (patience + 1)
 *    visible tiles, which could not pay that back, read everything.)
 *  - AGENT: an upper bound from each sealed block's AABB of raw keys and
 *    the span of its positions, RoPE included (the unsealed tail's box from
 *    its rows): 2 * head_dim floats per block and KV head, no K read.
 * With tau_s = tau_d = 0 SCORED orders nothing: it reads newest first.
 * IMPORTANCE with the caller's order (retrieval scores) costs nothing to
 * order and is as safe as that order; RECENT suits histories whose
 * attention decays with age.
 *
 * Defaults: SCORED, tiles of 16, tau_s 0.001, tau_d 0.0001, patience 8,
 * chosen by a measured sweep (docs/attend-defaults.md has the error and
 * the bytes read they give). */

#define KVMEM_ATTEND_MAX_ROWS 64
#define KVMEM_ATTEND_PROBE_SIZE 32

typedef enum kvmem_attend_source_kind {
    KVMEM_ATTEND_SRC_TENSORS = 0, /* caller K, V [T][n_kv_heads][head_dim], keys post-RoPE
                                     (also gathered memory from kvmem_gather) */
    KVMEM_ATTEND_SRC_AGENT = 1,   /* one layer of an agent's blocks (raw keys, rotated here) */
    KVMEM_ATTEND_SRC_SLOTMAP = 2  /* physical K, V [n_slots][n_kv_heads][head_dim] and a map
                                     from logical positions to slots */
} kvmem_attend_source_kind;

/* Where the keys and values come from. Zero-initialise, then set `kind` and
 * that kind's fields; unused fields must stay zero/NULL. All borrowed. Frozen
 * (no struct_size): kvmem_attend_source_v2 below is the form that grows. */
typedef struct kvmem_attend_source {
    kvmem_attend_source_kind kind;
    int32_t layer;              /* AGENT: the layer the queries belong to */
    const kvmem_tensor *k;      /* TENSORS: [T][n_kv_heads][head_dim]; SLOTMAP: [n_slots][..][..] */
    const kvmem_tensor *v;      /* same shape as k, any of F32/F16/BF16 */
    const int32_t *slots;       /* SLOTMAP: n_positions physical slot ids */
    int64_t n_positions;        /* SLOTMAP: T, the number of logical positions */
    int32_t dead_slot;          /* SLOTMAP: the id of dropped positions (skipped) */
    int32_t reserved;
    kvmem_agent *agent;         /* AGENT: the agent (its unsealed tail included) */
    const int32_t *positions;   /* AGENT: one RoPE position per agent token, or NULL:
                                   token index + base_position */
    int64_t base_position;      /* AGENT: offset added when positions is NULL */
    const uint8_t *mask;        /* any kind: T entries, 0 = skip this position; NULL = none */
} kvmem_attend_source;

typedef enum kvmem_attend_order {
    KVMEM_ATTEND_RECENT = 0,     /* tiles holding the first n_sink positions first, then
                                    newest to oldest */
    KVMEM_ATTEND_IMPORTANCE = 1, /* tile_order first (e.g. blocks by retrieval score), then
                                    the remaining tiles newest to oldest */
    KVMEM_ATTEND_INDEX = 2,      /* exactly the tiles in tile_order, in that order; other
                                    tiles are not attended */
    KVMEM_ATTEND_SCORED = 3      /* (default) each KV head its own order: tiles by their
                                    largest logit, highest first (ties newest first),
                                    scored here with no caller input (see "Orders") */
} kvmem_attend_order;

typedef enum kvmem_attend_probe {
    KVMEM_ATTEND_PROBE_STRIDED = 0, /* 32 strided elements of the stream output (default) */
    KVMEM_ATTEND_PROBE_ORACLE = 1   /* the whole stream output */
} kvmem_attend_probe;

/* The tile size kvmem_attend uses for TENSORS and SLOTMAP sources when
 * params.tile_size is 0. */
#define KVMEM_ATTEND_DEFAULT_TILE 16

typedef struct kvmem_attend_params {
    size_t struct_size; /* sizeof(kvmem_attend_params), set by kvmem_attend_default_params() */
    kvmem_attend_order order;   /* default SCORED */
    int32_t n_sink;             /* RECENT: leading positions always visited first; default 4 */
    const int32_t *tile_order;  /* IMPORTANCE / INDEX: tile indices, distinct, in [0, n_tiles) */
    int32_t n_tile_order;
    int32_t tile_size;          /* positions per tile, in [1, 4096]; 0 = KVMEM_ATTEND_DEFAULT_TILE;
                                   must be 0 for AGENT sources (tiles are blocks) */
    float scale;                /* logit scale; 0 = 1/sqrt(head_dim) */
    float tau_s;                /* scale threshold, >= 0; default 0.001 */
    float tau_d;                /* direction threshold, >= 0; default 0.0001 (both 0: never stop) */
    int32_t patience;           /* consecutive stable tiles before stopping, >= 1; default 8 */
    kvmem_attend_probe probe;   /* default STRIDED */
    int32_t causal;             /* 1 (default): row r sees positions <= T - n_rows + r */
    int32_t compare;            /* 1: also run the ORACLE rule and report where it stops
                                   (reads on until both rules stopped; output as without) */
    int32_t reserved;           /* 0 */
} kvmem_attend_params;

/* The defaults, struct_size = this header's sizeof ("ABI and versioning"). */
KVMEM_API kvmem_status kvmem_attend_params_init(kvmem_attend_params *params, size_t struct_size);
static inline kvmem_attend_params kvmem_attend_default_params(void) {
    kvmem_attend_params p;
    kvmem_attend_params_init(&p, sizeof p);
    return p;
}

typedef struct kvmem_attend_stats {
    int64_t n_streams;       /* n_rows * n_kv_heads */
    int64_t tiles_total;     /* sum over streams of the tiles with a visible position */
    int64_t tiles_visited;   /* sum over streams of the tiles read before stopping */
    int64_t streams_stopped; /* streams that stopped before their last tile */
    int64_t oracle_tiles;    /* compare: sum over streams of where the ORACLE rule stops
                                (its tiles_visited); 0 otherwise */
    int64_t oracle_agree;    /* compare: streams where both rules stop at the same tile */
    int64_t positions_read;  /* (position, KV head) rows of K and V read; a K row alone
                                (SCORED's first pass) or a V row alone (its attention
                                after that pass) counts half (each count rounded up) */
    int32_t stopped_early;   /* 1 if any stream stopped early */
    int32_t reserved;
} kvmem_attend_stats;

/* Attention of q over `source` into out, stopping early by the rule above.
 * q:   [n_rows][n_q_heads][head_dim], post-RoPE query rows of one layer,
 *      n_rows in [1, KVMEM_ATTEND_MAX_ROWS], F32/F16/BF16, any strides.
 * out: [n_rows][n_q_heads][head_dim], F32/F16/BF16, written only on success.
 *      A row that sees no position gets zeros.
 * stats may be NULL. params may be NULL for defaults.
 * Geometry: AGENT takes it from the pool's spec (source.layer picks the
 * layer); TENSORS/SLOTMAP from the tensors (n_q_heads a multiple of
 * n_kv_heads, head_dim equal, head_dim <= 1024).
 * Threads: runs on ctx's workers (threaded across KV heads, and across rows
 * when there are fewer KV heads than threads); an AGENT source follows the
 * usual rule, one thread at a time per agent. Calls on distinct contexts or
 * with distinct outputs may run concurrently.
 * Device backends ("vulkan", "cuda"): one-row calls on TENSORS or SLOTMAP
 * sources with no mask, the STRIDED probe, compare 0 and one order for all
 * KV heads (RECENT, IMPORTANCE, INDEX; SCORED only where it reads
 * everything, see "Orders") run on the device (K/V uploaded for the call);
 * so do such calls on AGENT sources whose sealed blocks are all full and
 * that give no positions list, reading the agent's device-resident K/V
 * (uploaded once per block; only q, the visiting order when not oldest
 * first, and the unsealed tail go up per call); everything else, the
 * default SCORED included, and shapes the device kernel does not support,
 * runs on the CPU. Stats mean the same either way.
 * Non-finite K and V (TENSORS and SLOTMAP sources) are refused where they
 * are read, never clamped into a plausible output: on the CPU a position's
 * logits are checked as they are computed (1/head_dim of the work) and the
 * output is checked for what V contributed; on a device every live K row
 * is checked on the host before the upload (which reads it anyway) and the
 * output likewise. Positions the call never reads are NOT scanned: masked
 * and dead positions, and on the CPU the tiles after every stream stopped,
 * since not reading them is what early termination is for. So a NaN in an
 * unread tile leaves the call OK, and whether a NaN is found can depend on
 * where the streams stop. AGENT sources hold only finite values (append
 * refuses the rest).
 * Errors: KVMEM_ERR_INVALID_ARG (NULL, shapes, dtypes, non-finite q, K or V
 * at a position read, bad order list, slot id outside [0, n_slots), bad
 * params), KVMEM_ERR_CLOSED (closed agent), KVMEM_ERR_NOMEM. Nothing is
 * written on failure. */
KVMEM_API kvmem_status kvmem_attend(kvmem_context *ctx, const kvmem_tensor *q,
                                    const kvmem_attend_source *source,
                                    const kvmem_attend_params *params, const kvmem_tensor *out,
                                    kvmem_attend_stats *stats);

/* The same source with struct_size first, so it can grow ("ABI and
 * versioning"; kvmem_attend_source is frozen): the same fields, the same
 * meaning. kvmem_attend_source_v2_init zeroes it and sets struct_size; set
 * `kind` and that kind's fields after it. */
typedef struct kvmem_attend_source_v2 {
    size_t struct_size; /* sizeof(kvmem_attend_source_v2), set by kvmem_attend_source_v2_init() */
    kvmem_attend_source_kind kind;
    int32_t layer;
    const kvmem_tensor *k;
    const kvmem_tensor *v;
    const int32_t *slots;
    int64_t n_positions;
    int32_t dead_slot;
    int32_t reserved; /* 0 */
    kvmem_agent *agent;
    const int32_t *positions;
    const uint8_t *mask;
    int64_t base_position; /* last: no trailing padding where pointers are 4 bytes (wasm32) */
} kvmem_attend_source_v2;

static inline void kvmem_attend_source_v2_init(kvmem_attend_source_v2 *src) {
    unsigned char *b = (unsigned char *)src;
    for (size_t i = 0; i < sizeof *src; i++) b[i] = 0;
    src->struct_size = sizeof *src;
}

/* kvmem_attend with a kvmem_attend_source_v2. struct_size is read as for
 * params structs; errors, threading and the last error as kvmem_attend,
 * plus KVMEM_ERR_INVALID_ARG / KVMEM_ERR_UNSUPPORTED for a struct_size no
 * version has, a newer struct setting fields this library lacks or a
 * nonzero reserved. */
KVMEM_API kvmem_status kvmem_attend_v2(kvmem_context *ctx, const kvmem_tensor *q,
                                       const kvmem_attend_source_v2 *source,
                                       const kvmem_attend_params *params, const kvmem_tensor *out,
                                       kvmem_attend_stats *stats);

/* ------------------------------------------------------------------------- */
/* Persistence, quantized storage, prefix reuse, batching                     */
/* ------------------------------------------------------------------------- */

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
 * leaves the old file or the new one. The agent is not changed. The file is
 * format version 2 (docs/format.md): safetensors, readable by any
 * safetensors reader, its metadata naming the model, spec, storage dtype and
 * block size it was written for and carrying the token ids, text and a
 * checksum of the data. Only a regular file is ever replaced: a path naming a directory, FIFO,
 * socket, device or symbolic link fails with KVMEM_ERR_INVALID_ARG and is
 * left as it is.
 * Errors: KVMEM_ERR_INVALID_ARG, KVMEM_ERR_CLOSED, KVMEM_ERR_NOT_FOUND (no
 * store and no path, or the directory is missing), KVMEM_ERR_IO, KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_agent_save(kvmem_agent *agent, const char *path);

/* Replace an agent's memory with the content of a file written by
 * kvmem_agent_save (path NULL = the pool's store): format version 2, or
 * version 1, converted on load (docs/format.md; a version 1 box beyond f16's
 * range is refused as corrupt for pools with f16 boxes). The loader validates
 * everything before changing anything: header length, strict JSON, dtypes,
 * shapes, offsets inside the file, contiguous and non-overlapping, the
 * metadata (no string may hold a NUL), the data checksum. All or nothing.
 * A path that is not a regular file (a FIFO, a device) fails with
 * KVMEM_ERR_IO without being read or waited on. Messages never quote bytes
 * of a file that has not shown itself to be a kvmem agent file.
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
    size_t struct_size; /* sizeof(kvmem_prefix_params), set by kvmem_prefix_default_params() */
    double min_ratio; /* DIVERGE reuses the cache only if the common prefix covers at least
                         this fraction of the stored text (bytes); default 0.8 */
} kvmem_prefix_params;

/* The defaults, struct_size = this header's sizeof ("ABI and versioning"). */
KVMEM_API kvmem_status kvmem_prefix_params_init(kvmem_prefix_params *params, size_t struct_size);
static inline kvmem_prefix_params kvmem_prefix_default_params(void) {
    kvmem_prefix_params p;
    kvmem_prefix_params_init(&p, sizeof p);
    return p;
}

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

/* ------------------------------------------------------------------------- */
/* The model spec that grows                                                  */
/* ------------------------------------------------------------------------- */

/* kvmem_model_spec with struct_size first, so fields can be appended
 * (kvmem_model_spec has none and is returned by value: it is frozen; see
 * docs/abi.md, "Structs without a size field"): the same fields with the
 * same meaning and defaults, ordered so the struct has no padding where
 * pointers are 8 or 4 bytes. kvmem_model_spec_v2_init(&spec, sizeof spec)
 * writes the library's defaults (it never returns a struct by value, so it
 * never writes past an older caller's struct); set the fields after it.
 * Every call that takes a kvmem_model_spec has a _v2 form taking this one,
 * which reads struct_size as for params structs ("ABI and versioning":
 * older and newer sizes, a newer struct's zero tail; KVMEM_ERR_INVALID_ARG
 * or KVMEM_ERR_UNSUPPORTED otherwise) and then does what the frozen form
 * does, with its errors and its last error. */
typedef struct kvmem_model_spec_v2 {
    size_t struct_size;          /* sizeof(kvmem_model_spec_v2), set by kvmem_model_spec_v2_init() */
    const int32_t *layer_window; /* as kvmem_model_spec's */
    int32_t n_layers;
    int32_t n_q_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t rotary_dim;
    kvmem_rope_style rope_style;
    kvmem_rope_scaling rope_scaling;
    int32_t rope_original_max_pos;
    double rope_theta;
    double rope_factor;
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    double yarn_beta_fast;
    double yarn_beta_slow;
    double yarn_attn_factor;
    char model_id[KVMEM_MAX_MODEL_ID];
} kvmem_model_spec_v2;

/* The defaults of kvmem_model_spec_default() in the first struct_size bytes
 * of *spec (the caller's sizeof), struct_size in its field. Errors:
 * KVMEM_ERR_INVALID_ARG (NULL, a struct_size no version has); nothing is
 * written on failure. */
KVMEM_API kvmem_status kvmem_model_spec_v2_init(kvmem_model_spec_v2 *spec, size_t struct_size);
KVMEM_API kvmem_status kvmem_model_spec_validate_v2(const kvmem_model_spec_v2 *spec);
KVMEM_API kvmem_status kvmem_rope_apply_v2(const kvmem_model_spec_v2 *spec, float *x, size_t n_rows,
                                           size_t stride, const int32_t *positions, int32_t inverse);
KVMEM_API kvmem_status kvmem_pool_create_v2(kvmem_context *ctx, const kvmem_model_spec_v2 *spec,
                                            const kvmem_pool_params *params, kvmem_pool **out);
/* The pool's spec into the first out->struct_size bytes of *out (set it
 * with kvmem_model_spec_v2_init first). */
KVMEM_API kvmem_status kvmem_pool_get_spec_v2(kvmem_pool *pool, kvmem_model_spec_v2 *out);
KVMEM_API kvmem_status kvmem_qmem_store_create_v2(const kvmem_model_spec_v2 *spec,
                                                  const kvmem_qmem_params *params,
                                                  kvmem_qmem_store **out);
KVMEM_API kvmem_status kvmem_qmem_score_v2(kvmem_context *ctx, const kvmem_model_spec_v2 *spec,
                                           const float *memory, const kvmem_tensor *k, float *scores);
KVMEM_API kvmem_status kvmem_kvstore_create_v2(const kvmem_model_spec_v2 *spec,
                                               const kvmem_kvstore_params *params, kvmem_kvstore **out);

/* ------------------------------------------------------------------------- */
/* Deprecated                                                                 */
/* ------------------------------------------------------------------------- */

/* The *_errbuf forms: the call named without the suffix, plus: when it
 * fails, the message kvmem_last_error() gives on that thread right after it
 * is copied into errbuf (NUL-terminated, cut to errbuf_size - 1 bytes); when
 * it succeeds errbuf becomes "". errbuf may be NULL (or errbuf_size 0).
 * Replaced by the object's own message (kvmem_agent_last_error,
 * kvmem_pool_last_error, kvmem_context_last_error), one mechanism for every
 * call instead of a twin of each. */
KVMEM_API kvmem_status kvmem_pool_sync_errbuf(kvmem_pool *pool, char *errbuf, size_t errbuf_size)
    KVMEM_DEPRECATED("kvmem_pool_last_error after kvmem_pool_sync");
KVMEM_API kvmem_status kvmem_agent_append_errbuf(kvmem_agent *agent, const kvmem_tensor *k,
                                                 const kvmem_tensor *v, const kvmem_append_params *params,
                                                 char *errbuf, size_t errbuf_size)
    KVMEM_DEPRECATED("kvmem_agent_last_error after kvmem_agent_append");
KVMEM_API kvmem_status kvmem_agent_read_errbuf(kvmem_agent *agent, int64_t first_token, int64_t n_tokens,
                                               const kvmem_tensor *k_out, const kvmem_tensor *v_out,
                                               char *errbuf, size_t errbuf_size)
    KVMEM_DEPRECATED("kvmem_agent_last_error after kvmem_agent_read");
KVMEM_API kvmem_status kvmem_agent_save_errbuf(kvmem_agent *agent, const char *path, char *errbuf,
                                               size_t errbuf_size)
    KVMEM_DEPRECATED("kvmem_agent_last_error after kvmem_agent_save");
KVMEM_API kvmem_status kvmem_agent_load_errbuf(kvmem_agent *agent, const char *path, char *errbuf,
                                               size_t errbuf_size)
    KVMEM_DEPRECATED("kvmem_agent_last_error after kvmem_agent_load");
KVMEM_API kvmem_status kvmem_retrieve_errbuf(kvmem_agent *agent, const kvmem_tensor *query,
                                             const kvmem_retrieve_params *params, kvmem_retrieval *result,
                                             char *errbuf, size_t errbuf_size)
    KVMEM_DEPRECATED("kvmem_agent_last_error after kvmem_retrieve");
KVMEM_API kvmem_status kvmem_gather_errbuf(kvmem_agent *agent, const int32_t *blocks, int32_t n_blocks,
                                           int64_t base_position, const kvmem_tensor *k_out,
                                           const kvmem_tensor *v_out, char *errbuf, size_t errbuf_size)
    KVMEM_DEPRECATED("kvmem_agent_last_error after kvmem_gather");
KVMEM_API kvmem_status kvmem_attend_errbuf(kvmem_context *ctx, const kvmem_tensor *q,
                                           const kvmem_attend_source *source, const kvmem_attend_params *params,
                                           const kvmem_tensor *out, kvmem_attend_stats *stats, char *errbuf,
                                           size_t errbuf_size)
    KVMEM_DEPRECATED("kvmem_context_last_error after kvmem_attend");

/* ------------------------------------------------------------------------- */
/* Experimental (KVMEM_EXPERIMENTAL)                                          */
/* ------------------------------------------------------------------------- */

/* Parts still moving (see "ABI and versioning"): declared only for callers
 * that define KVMEM_EXPERIMENTAL before including this header, exported by
 * every build, free to change in any release. Why each is here:
 *  - the QueryMemory residual head: its weight file follows the training
 *    code, which still changes;
 *  - the eviction baselines (StreamingLLM, H2O, SnapKV): evaluation
 *    references for IntentKV, kept for benchmarks, not a product API;
 *  - KEEP segments: the event and unit model has one engine using it
 *    (examples/tinyllm) and will follow engines that adopt it;
 *  - k-means grouping, multi-hop selection, the layer-balanced load plan:
 *    KEEP's research interfaces (caller-computed attention matrices, a
 *    simulated load stream) that change with the segment store;
 *  - opening an agent file in place (agents larger than RAM): new, and its
 *    read-only rule may give way to appends kept in memory;
 *  - the context's transfer counters: what counts follows device residency,
 *    which is still growing;
 *  - device tensors: which calls read device memory in place grows with the
 *    device paths, and engines may want kvmem on their own Vulkan device;
 *  - placement and the window split: measured on two small models
 *    (examples/tinyllm eval --beyond); their defaults follow more models. */
#ifdef KVMEM_EXPERIMENTAL

/* ---- Context: host <-> device transfer counters ---------------------------- */

/* Bytes the library copied from host memory into the context's backend
 * buffers (h2d) and back (d2h) since the context was created or last reset,
 * summed over every call on every thread (pools, agents, kvmem_attend). A
 * "cpu" context counts only what a test or tool moves through its buffers:
 * its ops read host memory in place. Either pointer may be NULL, not both.
 * Errors: KVMEM_ERR_INVALID_ARG. Thread-safe (each counter is atomic; the
 * pair is not one snapshot while other threads run calls). */
KVMEM_API kvmem_status kvmem_context_transfer_stats(const kvmem_context *ctx, uint64_t *h2d_bytes,
                                                    uint64_t *d2h_bytes);
/* Set both counters to 0. Errors: KVMEM_ERR_INVALID_ARG. Thread-safe. */
KVMEM_API kvmem_status kvmem_context_transfer_reset(kvmem_context *ctx);

/* The pool's device-resident mirrors (kvmem_pool_params.device_capacity_bytes):
 * *mirror_bytes = device bytes they hold now, *evictions = mirrors of closed
 * agents freed to make room for another, *unmirrored = device calls served
 * without a mirror because it did not fit, both since the pool was created.
 * All 0 on a CPU context. (kvmem_pool_info, written whole by the library,
 * cannot grow: these are reported here.) Any pointer may be NULL, not all.
 * Errors: KVMEM_ERR_INVALID_ARG. Thread-safe (each counter is atomic). */
KVMEM_API kvmem_status kvmem_pool_device_stats(kvmem_pool *pool, uint64_t *mirror_bytes,
                                               uint64_t *evictions, uint64_t *unmirrored);

/* ---- Device tensors: K, V, Q and outputs in device memory ------------------ */

/* A kvmem_tensor can name device memory instead of host memory: its dtype
 * carries KVMEM_DTYPE_DEVICE and its data points to a kvmem_device_memory
 * (host memory, borrowed for the call like the tensor) saying where the
 * elements are. Shape and strides keep their meaning (elements from element
 * 0). kvmem_tensor itself is unchanged, so binaries built against an older
 * header are unaffected, and an older library refuses such a tensor as a
 * bad dtype (KVMEM_ERR_INVALID_ARG) rather than reading it.
 *
 * Which calls take them: kvmem_agent_append (K, V), kvmem_retrieve (query),
 * kvmem_gather (k_out, v_out), kvmem_attend (q, out, and a TENSORS or
 * SLOTMAP source's k and v), on a context whose backend owns that memory
 * ("vulkan" for KVMEM_MEMORY_VULKAN, "cuda" for KVMEM_MEMORY_CUDA). Every
 * other call, and a device tensor on any other context (a CPU context
 * included), is refused with KVMEM_ERR_UNSUPPORTED naming the tensor and
 * the kind of memory; nothing is read or written then.
 * What moves (kvmem_context_transfer_stats counts every byte):
 *  - kvmem_gather on the device writes f32 outputs whose rows are
 *    contiguous ([n_kv_heads][head_dim] dense, any layer stride) straight
 *    into the caller's memory: nothing comes back to the host;
 *  - kvmem_attend's device path reads F32 or F16 K and V (both the same
 *    dtype, [T][n_kv_heads][head_dim] dense) where they are: nothing goes
 *    up but q, the slot map and the visiting order;
 *  - kvmem_agent_append copies K and V down once (the pool keeps its
 *    blocks in host memory; the device mirror is filled from there);
 *  - everything else (other dtypes or layouts, a query, q and out, a plan
 *    that runs on the CPU) goes through one host copy of the tensor's
 *    span: down for what the call reads, up for what it writes (preceded
 *    by a copy down where the span has gaps the call does not write).
 * Errors stay all-or-nothing, with one exception: a device failure
 * (KVMEM_ERR_BACKEND) while results go into device outputs (gather's in
 * place, or the write-back of two outputs) may leave them partly written;
 * argument errors are found before any write.
 * Synchronisation: the memory must be ready when the call starts and is
 * ready when it returns (the calls are synchronous). Vulkan: the buffer
 * must live on the context's VkDevice (kvmem_context_vulkan_device) with
 * usage STORAGE_BUFFER | TRANSFER_SRC | TRANSFER_DST, and the caller must not
 * use that device's queue from another thread during the call. CUDA: the
 * backend orders its work after the tensor's stream and waits for its own
 * before returning. */
#define KVMEM_DTYPE_DEVICE 0x100

typedef enum kvmem_memory_kind {
    KVMEM_MEMORY_HOST = 0,   /* not a device tensor (refused in a descriptor) */
    KVMEM_MEMORY_CUDA = 1,   /* a CUDA device pointer */
    KVMEM_MEMORY_VULKAN = 2  /* a VkBuffer */
} kvmem_memory_kind;

typedef struct kvmem_device_memory {
    size_t struct_size;     /* sizeof(kvmem_device_memory), set by kvmem_device_memory_default() */
    kvmem_memory_kind kind;
    int32_t device;         /* CUDA: the device ordinal; VULKAN: 0 */
    uint64_t handle;        /* CUDA: the device pointer; VULKAN: the VkBuffer (a 64-bit handle) */
    uint64_t offset;        /* bytes from handle to element 0 */
    uint64_t size;          /* bytes of the allocation from handle (VkBuffer size, cudaMalloc size):
                               every element must lie in [offset, size) */
    void *stream;           /* CUDA: the cudaStream_t the data is ordered on (NULL: the legacy
                               default stream); VULKAN: NULL */
} kvmem_device_memory;

/* Every field's default is zero: the struct zeroed, struct_size set (the
 * library reads it by the rules of params structs, "ABI and versioning"). */
static inline kvmem_device_memory kvmem_device_memory_default(void) {
    kvmem_device_memory m;
    m.struct_size = sizeof m; /* every byte set: the struct has no padding */
    m.kind = KVMEM_MEMORY_HOST;
    m.device = 0;
    m.handle = 0;
    m.offset = 0;
    m.size = 0;
    m.stream = NULL;
    return m;
}

/* Fill *out as a contiguous row-major view of the memory mem describes
 * (data = mem, dtype | KVMEM_DTYPE_DEVICE); set strides after it for other
 * layouts. mem is borrowed: it must outlive every call given *out.
 * Errors: KVMEM_ERR_INVALID_ARG (as kvmem_tensor_init; mem NULL, a kind
 * that is not CUDA or VULKAN, handle 0, elements beyond size), nothing
 * written then. */
KVMEM_API kvmem_status kvmem_tensor_init_device(kvmem_tensor *out, const kvmem_device_memory *mem,
                                                kvmem_dtype dtype, int32_t ndim, const int64_t *shape);

/* The Vulkan objects a "vulkan" context runs on, so an engine creates its
 * buffers on the same device. Handles are the Vulkan ones cast to
 * pointers (VkInstance, VkPhysicalDevice, VkDevice, VkQueue), owned by the
 * context: valid until kvmem_context_free, never destroyed by the caller. */
typedef struct kvmem_vulkan_device {
    size_t struct_size;       /* sizeof(kvmem_vulkan_device): set it before the call */
    void *instance;
    void *physical_device;
    void *device;
    void *queue;              /* the one queue kvmem submits to */
    uint32_t queue_family;
    uint32_t api_version;     /* VkPhysicalDeviceProperties.apiVersion */
} kvmem_vulkan_device;

/* Fill the first out->struct_size bytes of *out. Errors:
 * KVMEM_ERR_INVALID_ARG (NULL, impossible struct_size), KVMEM_ERR_UNSUPPORTED
 * (the context's backend is not "vulkan"). */
KVMEM_API kvmem_status kvmem_context_vulkan_device(const kvmem_context *ctx, kvmem_vulkan_device *out);

/* ---- Query memory: the residual head ------------------------------------ */

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
 * span, a non-finite value in K, rule or memory: checked before anything is
 * written), KVMEM_ERR_MISMATCH (spec head_dim differs from the head's),
 * KVMEM_ERR_NOMEM. Runs on the calling thread. */
KVMEM_API kvmem_status kvmem_qmem_head_apply(const kvmem_qmem_head *head, const kvmem_model_spec *spec,
                                             const float *memory, const kvmem_tensor *k,
                                             const float *rule, int64_t span_begin,
                                             int64_t span_end, float *scores_out);

/* ---- Eviction baselines ------------------------------------------------- */

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
 * as SnapKV does. Scratch: min(16, n_layers * n_q_heads) * (W + 2) * N
 * floats. Errors: KVMEM_ERR_INVALID_ARG (also a non-finite value in K or
 * q_obs, found through the logits), KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_snapkv_score(kvmem_context *ctx, const kvmem_model_spec *spec,
                                          const kvmem_tensor *q_obs, const kvmem_tensor *k,
                                          int32_t pool_kernel, float *scores);

/* kvmem_qmem_head_apply and kvmem_snapkv_score with the spec that grows
 * (kvmem_model_spec_v2). */
KVMEM_API kvmem_status kvmem_qmem_head_apply_v2(const kvmem_qmem_head *head, const kvmem_model_spec_v2 *spec,
                                                const float *memory, const kvmem_tensor *k,
                                                const float *rule, int64_t span_begin,
                                                int64_t span_end, float *scores_out);
KVMEM_API kvmem_status kvmem_snapkv_score_v2(kvmem_context *ctx, const kvmem_model_spec_v2 *spec,
                                             const kvmem_tensor *q_obs, const kvmem_tensor *k,
                                             int32_t pool_kernel, float *scores);

/* ---- KEEP segments, grouping, multi-hop selection, load plan ------------ */

/* KEEP (embodied planning memory). Memory is split into caller-named
 * segments (one object's state, one finished task), each with its own KV.
 * Segments belong to caller-assigned groups. A group is STATIC once none of
 * its segments changed for `static_after_steps` steps (default 10) and
 * DYNAMIC otherwise. A static group keeps one KV computed over the whole
 * group (cross-attention inside the group preserved) and is retrieved as
 * one unit; a dynamic group is retrieved segment by segment, so an update
 * invalidates only that segment. Every transition is queued as an event
 * telling the engine what KV to (re)compute. kvmem never runs the model:
 * the engine computes KV and hands it over with kvmem_segments_store_*().
 *
 * Storage: each unit's KV (one segment, or one static group's joint KV) is
 * its own agent in the pool, named "<owner>.kvseg-s<index>-<gen>" or
 * "<owner>.kvseg-g<group>-<gen>". Agent ids containing ".kvseg-" after a
 * store's owner are reserved for the store: it refuses to start when an
 * agent with its prefix exists, and refuses to overwrite any agent. New KV
 * goes to a new agent (new generation) and the old one is removed only
 * once the new one is complete, so replacing KV never needs truncation and
 * a failed store leaves the old KV in place. A segment's own KV is kept
 * while its group is static (tokens held twice), which is what lets an
 * update invalidate one segment instead of the whole group.
 *
 * Threading: a segment store is used by one thread at a time; distinct
 * stores may be used from distinct threads. The pool must outlive it. */

typedef struct kvmem_segments kvmem_segments;

#define KVMEM_SEGMENTS_MAX_OWNER 96   /* bytes of the owner id */
#define KVMEM_SEGMENTS_MAX_NAME 256   /* bytes of a segment name */
#define KVMEM_SEGMENTS_MAX_GROUP 65535 /* group ids are 0..KVMEM_SEGMENTS_MAX_GROUP */

typedef struct kvmem_segments_params {
    size_t struct_size; /* sizeof(kvmem_segments_params), set by kvmem_segments_default_params() */
    int32_t static_after_steps; /* t: steps without change before a group turns STATIC; default 10, >= 1 */
    int32_t max_segments;       /* segments ever added (indices are never reused); 0 = 1048576 */
} kvmem_segments_params;

/* The defaults, struct_size = this header's sizeof ("ABI and versioning"). */
KVMEM_API kvmem_status kvmem_segments_params_init(kvmem_segments_params *params, size_t struct_size);
static inline kvmem_segments_params kvmem_segments_default_params(void) {
    kvmem_segments_params p;
    kvmem_segments_params_init(&p, sizeof p);
    return p;
}

typedef enum kvmem_group_state {
    KVMEM_GROUP_DYNAMIC = 0, /* per-segment KV; an update invalidates one segment */
    KVMEM_GROUP_STATIC = 1   /* one joint KV over the group's segments */
} kvmem_group_state;

typedef enum kvmem_segment_event_kind {
    KVMEM_SEG_EVENT_SEGMENT_STALE = 1, /* compute this segment's own KV (it was added or updated) */
    KVMEM_SEG_EVENT_GROUP_STATIC = 2,  /* the group turned STATIC: compute one KV over its members
                                          (kvmem_segments_group_members order) and store it */
    KVMEM_SEG_EVENT_GROUP_DYNAMIC = 3  /* the group turned DYNAMIC: its joint KV was dropped;
                                          retrieval is per segment again (nothing more to compute) */
} kvmem_segment_event_kind;

typedef struct kvmem_segment_event {
    int32_t kind;    /* kvmem_segment_event_kind */
    int32_t group;   /* the group concerned */
    int32_t segment; /* the segment (SEGMENT_STALE), else -1 */
    int32_t reserved;
    int64_t step;    /* the step counter when it happened */
} kvmem_segment_event;

/* Create a segment store whose KV lives in `pool` under agent ids derived
 * from `owner` (a valid agent id of at most KVMEM_SEGMENTS_MAX_OWNER bytes).
 * params may be NULL for defaults. Errors: KVMEM_ERR_INVALID_ARG,
 * KVMEM_ERR_EXISTS (an agent with the reserved prefix "<owner>.kvseg-"
 * exists: another store, or a user agent), KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_segments_create(kvmem_pool *pool, const char *owner,
                                             const kvmem_segments_params *params,
                                             kvmem_segments **out);
/* Free the store and remove its agents from the pool (agents a caller left
 * open stay in the pool). NULL is a no-op. */
KVMEM_API void kvmem_segments_free(kvmem_segments *segs);

/* Add a segment named `name` (NUL-terminated, 1..KVMEM_SEGMENTS_MAX_NAME
 * bytes, unique among live segments) to `group` (0..KVMEM_SEGMENTS_MAX_GROUP,
 * created on first use). Its index (stable, never reused) goes to *index
 * (may be NULL). Counts as a change: queues SEGMENT_STALE, and GROUP_DYNAMIC
 * if the group was static. Errors: KVMEM_ERR_INVALID_ARG, KVMEM_ERR_EXISTS
 * (name taken), KVMEM_ERR_CAPACITY (max_segments), KVMEM_ERR_NOMEM. */
KVMEM_API kvmem_status kvmem_segments_add(kvmem_segments *segs, const char *name, int32_t group,
                                          int32_t *index);
/* The segment's content changed at the current step: its KV is stale.
 * Queues SEGMENT_STALE, and GROUP_DYNAMIC if its group was static.
 * Errors: KVMEM_ERR_INVALID_ARG, KVMEM_ERR_NOT_FOUND (no such live segment). */
KVMEM_API kvmem_status kvmem_segments_update(kvmem_segments *segs, int32_t index);
/* Remove a segment and its KV. Its group counts as changed (GROUP_DYNAMIC
 * if it was static). Errors: as kvmem_segments_update. */
KVMEM_API kvmem_status kvmem_segments_remove(kvmem_segments *segs, int32_t index);
/* Move a segment to another group (e.g. after re-clustering). Both groups
 * count as changed; the segment's own KV stays valid. Moving to its own
 * group is a no-op. Errors: as kvmem_segments_update, bad group id. */
KVMEM_API kvmem_status kvmem_segments_assign(kvmem_segments *segs, int32_t index, int32_t group);
/* Advance the step counter by one and turn every group unchanged for
 * static_after_steps steps STATIC (queueing GROUP_STATIC). Errors:
 * KVMEM_ERR_INVALID_ARG, KVMEM_ERR_NOMEM (nothing changed). */
KVMEM_API kvmem_status kvmem_segments_step(kvmem_segments *segs);

/* Move up to `capacity` queued events, oldest first, into out (may be NULL
 * when capacity is 0) and remove them from the queue. *n_out gets the number
 * written, *n_left (may be NULL) the number still queued. */
KVMEM_API kvmem_status kvmem_segments_drain_events(kvmem_segments *segs, kvmem_segment_event *out,
                                                   size_t capacity, size_t *n_out, size_t *n_left);

/* Hand over the KV the engine computed for segment `index` alone:
 * k, v [n_layers][T][n_kv_heads][head_dim], T >= 1, as kvmem_agent_append
 * takes them (params may be NULL). Replaces the segment's KV and clears its
 * stale flag. All or nothing. Errors: those of kvmem_agent_append,
 * KVMEM_ERR_NOT_FOUND, KVMEM_ERR_BUSY (the old unit agent is open),
 * KVMEM_ERR_EXISTS (the next derived id is taken by a foreign agent). */
KVMEM_API kvmem_status kvmem_segments_store_segment(kvmem_segments *segs, int32_t index,
                                                    const kvmem_tensor *k, const kvmem_tensor *v,
                                                    const kvmem_append_params *params);
/* Hand over the joint KV of a STATIC group (its members concatenated in
 * kvmem_segments_group_members order, computed in one pass). Errors: as
 * kvmem_segments_store_segment; KVMEM_ERR_CONFLICT if the group is DYNAMIC
 * (it changed since the GROUP_STATIC event: drain events and recompute). */
KVMEM_API kvmem_status kvmem_segments_store_group(kvmem_segments *segs, int32_t group,
                                                  const kvmem_tensor *k, const kvmem_tensor *v,
                                                  const kvmem_append_params *params);

typedef struct kvmem_segments_info {
    int64_t step;        /* the step counter */
    int32_t n_segments;  /* live segments */
    int32_t n_indices;   /* indices handed out so far (live or removed) */
    int32_t n_groups;    /* groups with at least one segment */
    int32_t n_static;    /* of which STATIC */
    uint64_t n_events;   /* events queued */
} kvmem_segments_info;

typedef struct kvmem_segment_info {
    int32_t group;
    int32_t alive;       /* 0 once removed */
    int32_t has_kv;      /* 1: valid KV stored for the segment alone */
    int32_t reserved;
    int64_t last_update; /* step of the last change */
    int64_t n_tokens;    /* tokens of the stored KV (0 without) */
} kvmem_segment_info;

typedef struct kvmem_group_info {
    kvmem_group_state state;
    int32_t n_members;   /* live segments in the group */
    int32_t has_kv;      /* 1: valid joint KV stored (STATIC only) */
    int32_t reserved;
    int64_t last_change; /* step of the last change of any member */
    int64_t n_tokens;    /* tokens of the joint KV (0 without) */
} kvmem_group_info;

KVMEM_API kvmem_status kvmem_segments_get_info(kvmem_segments *segs, kvmem_segments_info *out);
/* Errors: KVMEM_ERR_NOT_FOUND for an index never handed out. */
KVMEM_API kvmem_status kvmem_segments_segment_info(kvmem_segments *segs, int32_t index,
                                                   kvmem_segment_info *out);
/* Errors: KVMEM_ERR_NOT_FOUND for a group id with no segment. */
KVMEM_API kvmem_status kvmem_segments_group_info(kvmem_segments *segs, int32_t group,
                                                 kvmem_group_info *out);
/* Index of the live segment named `name`. Errors: KVMEM_ERR_NOT_FOUND. */
KVMEM_API kvmem_status kvmem_segments_find(kvmem_segments *segs, const char *name, int32_t *index);
/* Name of segment `index` into buf (truncated to size, NUL-terminated);
 * *len (may be NULL) gets the full length. buf may be NULL when size is 0. */
KVMEM_API kvmem_status kvmem_segments_name(kvmem_segments *segs, int32_t index, char *buf,
                                           size_t size, size_t *len);
/* The live members of `group`, ascending index: the order of its joint KV.
 * Writes min(capacity, n) indices; *n_members gets n. */
KVMEM_API kvmem_status kvmem_segments_group_members(kvmem_segments *segs, int32_t group,
                                                    int32_t *out, size_t capacity,
                                                    size_t *n_members);

typedef enum kvmem_segment_unit_kind {
    KVMEM_SEG_UNIT_SEGMENT = 0,
    KVMEM_SEG_UNIT_GROUP = 1
} kvmem_segment_unit_kind;

/* One unit of retrieval: load agent `agent_id`, tokens
 * [first_token, first_token + n_tokens). */
typedef struct kvmem_segment_unit {
    int32_t kind;          /* kvmem_segment_unit_kind */
    int32_t group;
    int32_t segment;       /* SEGMENT units; -1 for GROUP units */
    int32_t needs_compute; /* 1: no valid KV stored (agent_id is "", n_tokens 0): compute it */
    float score;           /* the segment's score; a group's is the max over its members */
    int32_t reserved;
    int64_t first_token;
    int64_t n_tokens;
    char agent_id[KVMEM_MAX_AGENT_ID + 1];
} kvmem_segment_unit;

/* Which units to load for a query: a STATIC group with a stored joint KV
 * is one GROUP unit; every other live segment is its own SEGMENT unit.
 * scores: one relevance per segment index (n_scores == info.n_indices; e.g.
 * multi-hop importance or embedding similarity), finite; NULL = all 0.
 * Units are ordered by score (descending; ties: lower first segment index),
 * the first max_units of them kept (0 = all). Writes min(capacity, n) units
 * to out and n to *n_units; call with capacity 0 to size the buffer.
 * Errors: KVMEM_ERR_INVALID_ARG. */
KVMEM_API kvmem_status kvmem_segments_plan(kvmem_segments *segs, const float *scores,
                                           size_t n_scores, int32_t max_units,
                                           kvmem_segment_unit *out, size_t capacity,
                                           size_t *n_units);

/* Cosine k-means over caller-given embeddings, the grouping helper.
 * Rows are normalised to unit length; centroids are normalised means;
 * each point goes to the centroid of highest cosine (ties: lower cluster).
 * Initialisation: k-means++ on cosine distance 1 - cos with a splitmix64
 * generator seeded by `seed` (the first centre is drawn too), so a seed
 * gives the same answer on every machine and thread count. An emptied
 * cluster is re-seeded with the point farthest from its centroid.
 * Stops when no assignment changes or after max_iters rounds. */
typedef struct kvmem_kmeans_params {
    size_t struct_size; /* sizeof(kvmem_kmeans_params), set by kvmem_kmeans_default_params() */
    int32_t k;         /* clusters, 1..n; default 8 */
    int32_t max_iters; /* Lloyd rounds, 1..10000; default 100 */
    uint64_t seed;     /* default 42 */
} kvmem_kmeans_params;

/* The defaults, struct_size = this header's sizeof ("ABI and versioning"). */
KVMEM_API kvmem_status kvmem_kmeans_params_init(kvmem_kmeans_params *params, size_t struct_size);
static inline kvmem_kmeans_params kvmem_kmeans_default_params(void) {
    kvmem_kmeans_params p;
    kvmem_kmeans_params_init(&p, sizeof p);
    return p;
}

/* emb: [n][dim] f32 row-major, finite, no all-zero row. labels: n entries
 * (out). centroids: [k][dim] unit vectors (out), or NULL. iters (may be
 * NULL): rounds run. Outputs are written only on success.
 * Errors: KVMEM_ERR_INVALID_ARG (NULL, n or dim 0 or too large, k outside
 * [1, n], zero or non-finite rows), KVMEM_ERR_NOMEM. Thread-safe. */
KVMEM_API kvmem_status kvmem_cluster_kmeans(const float *emb, size_t n, size_t dim,
                                            const kvmem_kmeans_params *params, int32_t *labels,
                                            float *centroids, int32_t *iters);

/* Multi-hop importance selection for one layer i (KEEP).
 * importance^0[j] = mean over query tokens of q2s[q][j]; R = the top
 * m = ceil(ratio * n_segments) candidates by importance (capped at the
 * number of candidates; ties: lower index); then repeat up to max_iters
 * times: importance[j] = mean over a in R of s2s[a][j], R' = top m; stop
 * when R' == R. The layer enters through `ratio` (r_i, e.g. from
 * kvmem_multihop_schedule) and `candidates` (R_{i-1}): selection never
 * leaves the candidates, so a segment not recomputed at layer i is never
 * recomputed later.
 * q2s: [n_query][n_segments] attention from each query token to each
 * segment (e.g. summed over the segment's tokens, averaged over heads);
 * s2s: [n_segments][n_segments], row a = attention from segment a's tokens
 * to each segment, diagonal included (it anchors a selected segment).
 * Values finite and >= 0. */
typedef struct kvmem_multihop_params {
    size_t struct_size; /* sizeof(kvmem_multihop_params), set by kvmem_multihop_default_params() */
    float ratio;       /* r_i in [0, 1]: fraction of all segments to recompute; default 1 */
    int32_t max_iters; /* propagation rounds after the query round, 0..1000; default 8 */
} kvmem_multihop_params;

/* The defaults, struct_size = this header's sizeof ("ABI and versioning"). */
KVMEM_API kvmem_status kvmem_multihop_params_init(kvmem_multihop_params *params, size_t struct_size);
static inline kvmem_multihop_params kvmem_multihop_default_params(void) {
    kvmem_multihop_params p;
    kvmem_multihop_params_init(&p, sizeof p);
    return p;
}

typedef struct kvmem_multihop_result {
    int32_t n_selected; /* |R| */
    int32_t iters;      /* propagation rounds run */
    int32_t converged;  /* 1: R stopped changing within max_iters (always 1 when m == 0 or all) */
    int32_t reserved;
} kvmem_multihop_result;

/* candidates: n_segments bytes of 0/1 (R_{i-1}), or NULL = all.
 * selected: n_segments bytes (out, 0/1). importance: n_segments floats (out,
 * the importance R was last chosen from), or NULL. result may be NULL.
 * Outputs are written only on success. Errors: KVMEM_ERR_INVALID_ARG,
 * KVMEM_ERR_NOMEM. Thread-safe. */
KVMEM_API kvmem_status kvmem_multihop_select(const kvmem_multihop_params *params, const float *q2s,
                                             int32_t n_query, const float *s2s, int32_t n_segments,
                                             const uint8_t *candidates, uint8_t *selected,
                                             float *importance, kvmem_multihop_result *result);

/* A per-layer ratio schedule: r_1 = 1, non-increasing, mean exactly `avg`
 * (avg in [1/n_layers, 1]). Layers 2..n fall linearly from min(1, 1.5c) to
 * 2c - min(1, 1.5c), where c = (avg * n - 1) / (n - 1) is their mean.
 * ratios: n_layers floats (out). Errors: KVMEM_ERR_INVALID_ARG. */
KVMEM_API kvmem_status kvmem_multihop_schedule(int32_t n_layers, float avg, float *ratios);

/* Layer-balanced KV load plan (KEEP). Two streams run side by side: the
 * compute stream runs layers in order; the load stream copies one
 * (segment, layer) KV at a time from host to device, taking
 * load_bytes[segment] / bandwidth. Layer i starts when layer i-1 is done and
 * the layer-i KV of every segment not recomputed at i (recompute[i][j] == 0)
 * is loaded. A segment's loads are released when it is known never to be
 * recomputed again: at the end of layer e-1, e = the first layer that does
 * not recompute it (time 0 when e = 0). Recompute sets must be monotone
 * (recompute[i+1][j] <= recompute[i][j]).
 *  - naive: the plain next-layer pipeline: layer i's loads start once layer
 *    i-1 starts computing, in layer order.
 *  - balanced: the loads the next layer to compute needs go first; while the
 *    load stream would wait for one of them to be released, it runs released
 *    loads of the nearest later layer that end before that release (up to
 *    max_ahead layers ahead of the compute stream; 0 = any).
 * Both take loads in release order (release time, then the layer that
 * decided it, then segment index).
 * Idle time: compute idle = makespan - total compute; load idle = gaps in
 * the load stream before its last load ends. */
typedef struct kvmem_load_plan_params {
    size_t struct_size; /* sizeof(kvmem_load_plan_params), set by kvmem_load_plan_default_params() */
    double bandwidth_gbps; /* host -> device bytes per second / 1e9, > 0; default 25 */
    int32_t max_ahead;     /* balanced: layers a load may run ahead of compute; 0 = any; default 0 */
    int32_t reserved;      /* 0 */
} kvmem_load_plan_params;

/* The defaults, struct_size = this header's sizeof ("ABI and versioning"). */
KVMEM_API kvmem_status kvmem_load_plan_params_init(kvmem_load_plan_params *params, size_t struct_size);
static inline kvmem_load_plan_params kvmem_load_plan_default_params(void) {
    kvmem_load_plan_params p;
    kvmem_load_plan_params_init(&p, sizeof p);
    return p;
}

typedef struct kvmem_load_item {
    int32_t segment;
    int32_t layer;       /* whose KV is loaded */
    int32_t issue_layer; /* layer computing when the load starts; -1 = before layer 0 */
    int32_t reserved;
    double start_ms, end_ms;
} kvmem_load_item;

typedef struct kvmem_load_plan_stats {
    double naive_makespan_ms, naive_compute_idle_ms, naive_load_idle_ms;
    double balanced_makespan_ms, balanced_compute_idle_ms, balanced_load_idle_ms;
    double compute_ms; /* sum of compute_ms */
    double load_ms;    /* sum of all load times */
    uint64_t n_loads;
} kvmem_load_plan_stats;

/* compute_ms: n_layers per-layer compute times (finite, >= 0). load_bytes:
 * n_segments bytes of ONE layer's KV per segment. recompute: [n_layers]
 * [n_segments] 0/1. items: the balanced schedule in load-stream order;
 * *n_items gets n, the number of loads. Call with items NULL and capacity 0
 * to size the buffer; otherwise capacity must be >= n. layer_start_ms:
 * n_layers start times of the balanced plan's compute (out), or NULL.
 * stats may be NULL. Should the greedy gap filling ever end later than the
 * plain pipeline, the plain pipeline is returned as the balanced plan.
 * Errors: KVMEM_ERR_INVALID_ARG (also non-monotone sets),
 * KVMEM_ERR_CAPACITY (0 < capacity < n: nothing written), KVMEM_ERR_NOMEM.
 * Thread-safe. */
KVMEM_API kvmem_status kvmem_load_plan(const kvmem_load_plan_params *params, const double *compute_ms,
                                       int32_t n_layers, const uint64_t *load_bytes,
                                       int32_t n_segments, const uint8_t *recompute,
                                       kvmem_load_item *items, size_t capacity, size_t *n_items,
                                       double *layer_start_ms, kvmem_load_plan_stats *stats);

/* ---- Agents larger than RAM: a saved agent opened in place --------------- */

/* Flags of kvmem_agent_open_file. */
#define KVMEM_OPEN_FILE_NO_VERIFY 0x1u /* skip the data checksum pass (the header, AABBs and tail are
                                          still checked): KV bytes are then used as the file holds them,
                                          so a damaged file gives wrong values (never a crash) */

/* Open an agent file written by kvmem_agent_save (format version 2) as a
 * read-only agent of the pool whose KV blocks stay in the file: the header
 * is validated as by kvmem_agent_load, the AABB index, the unsealed tail,
 * the token ids and the text are read into memory, and the whole data
 * section's checksum is verified in one streaming pass (nothing of it kept;
 * KVMEM_OPEN_FILE_NO_VERIFY skips it). Retrieval (AABB and EXACT), gather,
 * attention with the agent as source, kvmem_agent_read and batch merge then
 * read the blocks they need from the file (pread, decoded exactly as from
 * memory: results equal those of the same agent loaded), so an agent
 * larger than the pool's capacity_bytes, or than RAM, can be used. The
 * pool counts only the resident bytes (AABBs and tail) against its
 * capacity; the OS page cache keeps recently read blocks.
 * The agent is named by the file's agent id; *out is an open handle to it
 * (kvmem_agent_close, then kvmem_agent_open reopens it, still mapped;
 * kvmem_pool_remove_agent closes the file). It is read-only: append,
 * flush, truncate and save return KVMEM_ERR_UNSUPPORTED (kvmem_agent_load
 * replaces it with an in-memory copy that can change). A pool with a store
 * never spills it.
 * The file must not change while it is open: the sizes were checked at
 * open, so a file that shrinks later makes the call that reads a missing
 * block return KVMEM_ERR_CORRUPT (a read error: KVMEM_ERR_IO) with nothing
 * committed, never a crash; a file rewritten in place with other bytes of
 * the same size is not detected.
 * Errors: those of kvmem_agent_load, KVMEM_ERR_EXISTS (the pool or its
 * store holds an agent of that id), KVMEM_ERR_UNSUPPORTED (a version 1
 * file), KVMEM_ERR_CAPACITY (the AABB index does not fit, or max_agents).
 * Threading: as kvmem_agent_open. */
KVMEM_API kvmem_status kvmem_agent_open_file(kvmem_pool *pool, const char *path, uint32_t flags,
                                             kvmem_agent **out);

/* ---- The window: where retrieved memory goes, and how much it gets ------- */

/* Past the model's trained window, an engine fills one window with retrieved blocks (kvmem_gather,
 * re-encoded at contiguous positions), then the live context (the newest history tokens), then the new
 * tokens. Where each retrieved block sits changes what the model recalls (BENCHMARKS.md, "Memory beyond
 * the window"): on stories15M and stories260K, SCORE with the live context at a quarter of the window
 * (kvmem_window_split live_share 0.25) recalled best on both. */
typedef enum kvmem_arrange_order {
    KVMEM_ARRANGE_CHRONO = 0, /* ascending block id: the history's own order (MemArt's paper) */
    KVMEM_ARRANGE_SCORE = 1,  /* ascending score: the most relevant block last, right before the
                                 live context; ties: the older block farther away */
    KVMEM_ARRANGE_RUNS = 2    /* runs of adjacent blocks kept whole and chronological inside, the
                                 runs by ascending best score: the best run last */
} kvmem_arrange_order;

/* The order to pass to kvmem_gather: blocks[n] (distinct ids >= 0, e.g. a
 * retrieval set from kvmem_retrieval_get) with their scores (NULL is
 * allowed for CHRONO) written to out[n], first = farthest from the new
 * tokens. A sink block (the one holding BOS) is best kept apart: exclude it
 * from retrieval (kvmem_retrieve_params.exclude) and gather it first.
 * out may not alias blocks. Nothing is written on error.
 * Errors: KVMEM_ERR_INVALID_ARG (n < 0, NULL arrays with n > 0, a negative
 * or repeated id, a NaN score, an unknown order, no scores for SCORE/RUNS),
 * KVMEM_ERR_NOMEM. Thread-safe. */
KVMEM_API kvmem_status kvmem_arrange(const int32_t *blocks, const float *scores, int32_t n,
                                     kvmem_arrange_order order, int32_t *out);

typedef struct kvmem_window_plan {
    int32_t memory_tokens; /* retrieved memory, whole blocks */
    int32_t top_k;         /* blocks to retrieve: memory_tokens / block_size */
    int32_t live_tokens;   /* newest history tokens kept as the live context */
} kvmem_window_plan;

/* Share a window of `window` tokens, `reserve` of them for the turn itself
 * (its prompt and what it generates): memory gets memory_share of the window
 * rounded down to whole blocks (never more than window - reserve), the live
 * context live_share of the window (0: all that is left), never more than is
 * left. Errors: KVMEM_ERR_INVALID_ARG (NULL out, window < 1, reserve outside
 * [0, window], a share outside [0, 1] or NaN, block_size < 1); out unchanged. */
KVMEM_API kvmem_status kvmem_window_split(int32_t window, int32_t reserve, float memory_share, float live_share,
                                          int32_t block_size, kvmem_window_plan *out);

#endif /* KVMEM_EXPERIMENTAL */

#ifdef __cplusplus
}
#endif

#endif /* KVMEM_H */
