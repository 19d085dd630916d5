/* Pool and agent memory (internal layout), shared by the modules that read
 * an agent's blocks (retrieval, attention, persistence, eviction).
 *
 * Block layout: one allocation per sealed block of [2][n_layers][n_kv_heads]
 * sections (K then V), head-major so one (layer, head) of a block is one
 * section of its n_tokens rows. Raw dtypes: a section is [n_tokens][head_dim]
 * in the storage dtype, sections back to back. Quantized dtypes: each
 * section is the encoding of core/quant/quant.h (codes, scales, biases),
 * stored part by part (kvm_qblock_layout: all K codes, all V codes, all K
 * scales, ...), decoded only by kvm_block_read_f32().
 * AABBs: per agent, contiguous [n_sealed][n_layers][n_kv_heads][2][head_dim],
 * s_max then s_min, so a decode-time scan reads the whole array as one
 * stream. Element type: f16 rounded outward (s_max up, s_min down, so the box
 * still holds every key and the score still bounds max_i q.k_i) when the
 * storage dtype keeps keys within f16's range (F16, Q8, Q4, Q4 KIVI: half the
 * bytes a decode-time scan reads); f32 for F32 and BF16 pools, whose keys
 * may lie beyond it. */
#ifndef KVMEM_POOL_H
#define KVMEM_POOL_H

#include "../backend/route/context.h"
#include "../internal.h"
#include "../quant/quant.h"
#include "../cpu/quant_codec.h"
#include "../cpu/tensor.h"
#include "../rope/rope.h"

#include <pthread.h>
#include <stdatomic.h>

#define KVM_AGENT_MAGIC 0x6b766167u /* "kvag" */
#define KVM_AGENT_DEAD 0x64656164u  /* "dead" */
#define KVM_GRAVEYARD 256           /* closed handles kept inert before being freed */

typedef struct kvm_block {
    int64_t first_token;
    int32_t n_tokens;
    int32_t reserved;
    void *kv; /* [2][L][H][n_tokens][D] storage dtype; NULL for a block of a mapped agent */
    const struct kvm_mapped *map; /* the file a mapped agent's block is read from (core/pool/mapped.h), or NULL */
} kvm_block;

typedef struct kvm_agent_mem {
    char id[KVMEM_MAX_AGENT_ID + 1];
    kvmem_agent *handle; /* the open handle, or NULL */
    int64_t n_tokens;
    kvm_block *blocks; /* sealed blocks, chronological */
    int32_t n_sealed, cap_blocks;
    void *aabb;        /* [cap_blocks][L][H][2][D], f16 or f32 (kvm_aabb_esize) */
    float *tail;       /* f32 staging of the unsealed block: [2][L][H][BS][D], or NULL */
    int32_t tail_n;    /* tokens in the tail */
    int32_t *token_ids;        /* [cap_tokens] */
    int64_t *token_text_off;   /* [cap_tokens], -1 = unknown */
    int64_t cap_tokens;
    char *text;
    size_t text_len, text_cap;
    uint64_t bytes; /* accounted KV + AABB + tail bytes */
    uint64_t lru_tick; /* pool tick of the last open/close: spill order */
    int32_t dirty;     /* changed since it was last written to the store */
    int32_t spilled;   /* memory is in the store only (closed agents) */
    int32_t spilling;  /* being written to the store by a spill, outside the mutex: no spill picks it,
                          opening, removing or syncing it waits on spill_cv */
    int32_t reserved2[1];
    struct kvm_mapped *mapped; /* opened by kvmem_agent_open_file: read-only, KV in the file; NULL otherwise */
    /* device-resident mirror of the sealed blocks (resident.h), or NULL;
     * dropped by kvm_resident_drop whenever blocks change other than by sealing */
    struct kvm_resident *res;
} kvm_agent_mem;

struct kvmem_agent {
    _Atomic uint32_t magic;
    atomic_int busy;   /* 1 while a call runs on the handle: a second one gets KVMEM_ERR_BUSY */
    kvm_errslot err;   /* kvmem_agent_last_error */
    int err_own;       /* this call's kvm_err_begin took the thread's slot (read under busy) */
    kvmem_pool *pool;
    kvm_agent_mem *mem;
    char id[KVMEM_MAX_AGENT_ID + 1]; /* a copy, readable without taking the handle */
};

struct kvmem_pool {
    kvmem_context *ctx;
    kvm_errslot err; /* kvmem_pool_last_error */
    kvmem_model_spec spec;
    int32_t *layer_window; /* owned copy, or NULL */
    kvm_rope rope;
    kvmem_pool_params params;
    size_t row_elems;      /* n_kv_heads * head_dim */
    size_t layer_elems_bs; /* n_kv_heads * BS * head_dim */
    pthread_mutex_t mu;    /* agents table, used_bytes, graveyard */
    pthread_cond_t spill_cv; /* signalled (with mu) when a spill's write ends */
    uint64_t spilling_bytes; /* bytes of the agents being spilled (still in used_bytes); under mu */
    int spill_failing;       /* the last spill failed: reservations that fit do not try one
                                again (each would wait on a failing store) until one succeeds; under mu */
    kvm_agent_mem **agents; /* sorted by id */
    int32_t n_agents, cap_agents;
    uint64_t used_bytes;
    kvmem_agent *graveyard[KVM_GRAVEYARD];
    int32_t grave_next;
    struct kvm_store *store; /* persistence tier, or NULL */
    uint64_t tick;
    /* freed full blocks kept for reuse (kvm_block_alloc), a stack linked
     * through each buffer's first pointer, and their bytes; under mu */
    void *spare;
    uint64_t spare_bytes;
    void *spare_aabb; /* one freed AABB array (kvm_agent_grow_blocks), its bytes in spare_aabb_bytes */
    uint64_t spare_aabb_bytes;
    /* the agents' device-resident mirrors (resident.h): device bytes they
     * hold, against params.device_capacity_bytes. Admission and eviction
     * run under mu; a drop subtracts without it (spills drop under mu) */
    _Atomic uint64_t dev_bytes;
    _Atomic uint64_t dev_evictions, dev_unmirrored; /* kvmem_pool_device_stats */
};

/* Validate a handle: KVMEM_OK, or KVMEM_ERR_INVALID_ARG / KVMEM_ERR_CLOSED
 * with a message naming `fn`. */
kvmem_status kvm_agent_check(const kvmem_agent *a, const char *fn);

/* Take a handle for one public call (SQLite's SQLITE_MISUSE idea): one
 * atomic exchange. A handle already taken by a call on another thread (the
 * contract says one thread at a time per agent) gives KVMEM_ERR_BUSY naming
 * the agent instead of a crash; a closed one KVMEM_ERR_CLOSED. Every
 * KVMEM_OK is paired with kvm_agent_leave. While taken, the call's failures
 * are the agent's last error too (kvmem_agent_last_error). */
kvmem_status kvm_agent_enter(kvmem_agent *a, const char *fn);
static inline void kvm_agent_leave(kvmem_agent *a) {
    kvm_err_end(a->err_own);
    a->err_own = 0;
    atomic_store_explicit(&a->busy, 0, memory_order_release);
}

/* Bytes of one sealed block holding n tokens, AABB included. */
size_t kvm_block_bytes(const kvmem_pool *p, int32_t n_tokens);

/* Bytes of one (K or V, layer, head) section of a block of n tokens (raw
 * dtypes: its rows). */
static inline size_t kvm_block_section_bytes(const kvmem_pool *p, int which, int32_t n_tokens) {
    return kvm_qsection_layout(p->params.storage_dtype, which, (size_t)n_tokens, (size_t)p->spec.head_dim).bytes;
}

/* Raw dtypes: the rows of the K (which = 0) or V (1) section of layer l,
 * head h of a block; blocks are [2][L][H][n_tokens][D]. Quantized blocks
 * keep their sections part by part (kvm_qblock_layout) and are read through
 * kvm_block_read_f32 only. */
static inline void *kvm_block_rows(const kvmem_pool *p, const kvm_block *b, int which, int32_t l, int32_t h) {
    size_t H = (size_t)p->spec.n_kv_heads, L = (size_t)p->spec.n_layers;
    size_t g = (size_t)which * L * H + (size_t)l * H + (size_t)h;
    return (unsigned char *)b->kv + g * kvm_block_section_bytes(p, 0, b->n_tokens);
}

/* Quantized dtypes: the block layout of a block of n tokens, and the parts
 * of its (which, l, h) section. */
static inline kvm_qblock kvm_block_qlayout(const kvmem_pool *p, int32_t n_tokens) {
    return kvm_qblock_layout(p->params.storage_dtype, (size_t)p->spec.n_layers * (size_t)p->spec.n_kv_heads,
                             (size_t)n_tokens, (size_t)p->spec.head_dim);
}

/* Bytes of one AABB element: 2 (f16, rounded outward) when every key the
 * pool accepts fits f16, else 4 (f32). */
static inline size_t kvm_aabb_esize_for(kvmem_dtype storage) {
    return storage == KVMEM_F32 || storage == KVMEM_BF16 ? 4 : 2;
}
static inline size_t kvm_aabb_esize(const kvmem_pool *p) { return kvm_aabb_esize_for(p->params.storage_dtype); }

/* Bytes of one block's AABBs (every layer and KV head). */
static inline size_t kvm_aabb_block_bytes(const kvmem_pool *p) {
    return 2 * (size_t)p->spec.n_layers * p->row_elems * kvm_aabb_esize(p);
}

/* The AABB of sealed block b for (l, h): 2*D elements (kvm_aabb_esize),
 * s_max then s_min. */
static inline void *kvm_block_aabb(const kvmem_pool *p, const kvm_agent_mem *m, int32_t b, int32_t l, int32_t h) {
    size_t D = (size_t)p->spec.head_dim, H = (size_t)p->spec.n_kv_heads, L = (size_t)p->spec.n_layers;
    return (unsigned char *)m->aabb + ((((size_t)b * L + (size_t)l) * H + (size_t)h) * 2) * D * kvm_aabb_esize(p);
}

/* The AABB of sealed block b for (l, h) as 2*D floats: s_max, then s_min. */
void kvm_block_aabb_f32(const kvmem_pool *p, const kvm_agent_mem *m, int32_t b, int32_t l, int32_t h, float *out);

/* Store an f32 box (s_max then s_min, 2*D floats) at dst in the pool's AABB
 * element type: f16 with s_max rounded up and s_min rounded down. */
void kvm_aabb_store(const kvmem_pool *p, const float *box, void *dst);

/* Read rows [row0, row0 + n) of K (which = 0) or V (1) of layer l, head h
 * of sealed block b as f32 into dst (n * head_dim floats). Every module reads
 * stored KV through this, so new storage dtypes (quantized) are decoded in
 * one place. */
void kvm_block_read_f32(const kvmem_pool *p, const kvm_block *b, int which, int32_t l, int32_t h,
                        int32_t row0, int32_t n, float *dst);

/* The unsealed tail's f32 rows of K (which = 0) or V (1), layer l, head h:
 * tail_n rows of head_dim, for tokens [n_tokens - tail_n, n_tokens). */
static inline const float *kvm_tail_rows(const kvmem_pool *p, const kvm_agent_mem *m, int which, int32_t l,
                                         int32_t h) {
    size_t L = (size_t)p->spec.n_layers, H = (size_t)p->spec.n_kv_heads;
    return m->tail + (((size_t)which * L + (size_t)l) * H + (size_t)h) * (size_t)p->params.block_size *
                         (size_t)p->spec.head_dim;
}

/* A mapped agent's blocks (core/pool/mapped.h) are read from its file; a
 * failed read leaves zeros and a note. Every call that reads blocks returns
 * this before it commits anything: st, or (when st is KVMEM_OK and a read
 * of m's file failed since the last check) that failure as a status with a
 * message naming fn; the note is cleared. */
kvmem_status kvm_mapped_check(const kvm_agent_mem *m, kvmem_status st, const char *fn);

/* A mapped block's rows in two steps, for a caller that must read every
 * row before it writes anything (kvmem_gather's all-or-nothing):
 * kvm_mapped_fetch reads the file's bytes of rows [row0, row0 + n) of
 * (which, l, h) into buf (kvm_mapped_run_bytes(p, which, n) bytes, 4-byte
 * aligned) and returns the read's status, a failure noted for
 * kvm_mapped_check as kvm_block_read_f32 notes it; kvm_mapped_decode turns
 * them into the f32 rows kvm_block_read_f32 gives. */
size_t kvm_mapped_run_bytes(const kvmem_pool *p, int which, int32_t n);
kvmem_status kvm_mapped_fetch(const kvmem_pool *p, const kvm_block *b, int which, int32_t l, int32_t h, int32_t row0,
                              int32_t n, void *buf);
void kvm_mapped_decode(const kvmem_pool *p, int which, int32_t n, const void *buf, float *dst);

/* Bytes of KV storage (no AABB) of a block of n tokens in the pool's dtype. */
size_t kvm_block_kv_bytes(const kvmem_pool *p, int32_t n_tokens);

/* ---- block memory ----
 * KV memory of a sealed block of n tokens (kvm_block_kv_bytes, 64-byte
 * aligned): a full block (block_size tokens) comes from the pool's spare
 * list when it holds one, else from kvm_aligned_alloc; NULL when out of
 * memory (the caller says what for). kvm_block_free returns the KV memory
 * of n blocks (NULL kv skipped): full ones go to the spare list while it
 * stays within kvm_pool_spare_limit, the rest to the allocator.
 * Why: memory the process gets afresh is faulted in 4 KiB at a time as a
 * load or append writes it (about 1.4 us a fault on this KVM guest: 190 ms
 * of a 250 ms first load of 570 MB), and whether glibc hands a freed 2 MiB
 * block back or unmaps it depends on what else the process allocated in
 * between; blocks a replace, truncate or removal frees are what the next
 * load or append of the pool needs. Both take the pool's mutex: never call
 * them holding it. */
void *kvm_block_alloc(kvmem_pool *p, int32_t n_tokens);
void kvm_block_free(kvmem_pool *p, kvm_block *blocks, int32_t n);
/* The spare list's bound (mutex held): no more than the agents hold (so
 * at most twice the live data in all) and within what capacity_bytes and,
 * with a store, host_budget_bytes leave: spare memory counts against both
 * and gives way to every reservation (it never makes an agent spill).
 * kvmem_pool_free frees it. */
uint64_t kvm_pool_spare_limit(const kvmem_pool *p);
/* The same for AABB arrays ([cap_blocks][L][H][2][D], 32 MiB for 256
 * blocks of Llama-8B: above glibc's mmap threshold, so mmapped and faulted
 * in afresh by every load, 8k faults or 12 ms of a 60 ms reload): the
 * pool keeps the largest one an agent released. kvm_aabb_take returns it
 * when it holds at least `bytes` (its size in *got), else NULL. */
void *kvm_aabb_take(kvmem_pool *p, size_t bytes, size_t *got);

/* ---- for the agent file format (agent_file.c, persist.c) ---- */

/* Bytes of the f32 tail staging buffer. */
size_t kvm_tail_bytes(const kvmem_pool *p);
/* Reserve / release bytes against the pool's capacity. With a store, reserve
 * first spills closed agents (least recently used first) to make room. */
kvmem_status kvm_pool_reserve(kvmem_pool *p, uint64_t bytes);
void kvm_pool_unreserve(kvmem_pool *p, uint64_t bytes);
/* Free an agent's memory contents (not the struct). kvm_agent_mem_release:
 * the same, its blocks through kvm_block_free (not with p's mutex held). */
void kvm_agent_mem_clear(kvm_agent_mem *m);
void kvm_agent_mem_release(kvmem_pool *p, kvm_agent_mem *m);
/* Move fresh's contents into m (keeping m's id, handle and tick), free m's
 * old contents and fresh itself; `fresh_bytes` were reserved by the caller,
 * m's old bytes are released. Cannot fail. */
void kvm_agent_mem_replace(kvmem_pool *p, kvm_agent_mem *m, kvm_agent_mem *fresh);
/* Reserve fresh->bytes and put fresh (its id set) into the pool's table
 * with an open handle. Fails, changing nothing (fresh stays the caller's),
 * when the id is taken in the pool or its store, at max_agents, or when the
 * bytes do not fit (the id checks come first). */
kvmem_status kvm_pool_adopt(kvmem_pool *p, kvm_agent_mem *fresh, const char *fn, kvmem_agent **out);
/* Grow helpers (0 on allocation failure, nothing changed). */
int kvm_agent_grow_blocks(kvmem_pool *p, kvm_agent_mem *m, int32_t need);
int kvm_agent_grow_tokens(kvm_agent_mem *m, int64_t need);
int kvm_agent_grow_text(kvm_agent_mem *m, size_t need);

#endif
