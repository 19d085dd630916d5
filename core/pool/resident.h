/* Device-resident mirror of an agent's sealed blocks (DESIGN.md, Residency).
 *
 * On a context whose backend is a device, retrieval, gather and attention
 * read an agent's AABBs and K/V from backend buffers that mirror the host
 * copy: a block is uploaded once, the first time a device op needs it, and
 * never again while it stays sealed. The host copy stays the source of truth
 * (persistence, the CPU ops); the mirror is a cache: a truncate cuts it to
 * the blocks it keeps whole (kvm_resident_truncate), a load, spill or free
 * drops it (kvm_resident_drop), and it is rebuilt lazily from the host.
 *
 * Layout, token slot = the token's index in the agent (sealed blocks are
 * contiguous from token 0); `dtype` is F16 when the pool stores f16 (the
 * device holds the host's bits: no rounding), else F32 (f32, bf16 and
 * quantized storage decode to f32, which f16 would round):
 *   smax, smin   [cap_blocks][L][H][D]   dev_score's s_max / s_min in the
 *                                         pool's box element type (f16 boxes
 *                                         for every storage but f32 / bf16)
 *   k[l], v[l]   [cap_tok][H][D] dtype   raw keys (no RoPE) and values of
 *                                         the sealed tokens: stored once;
 *                                         attention rotates keys on the fly
 *   tk, tv       f32 [block_size][H][D]  the unsealed tail of the layer an
 *                                         attention reads (its f32 rows, as
 *                                         the CPU reads them)
 *   cs           f32 [1 + cap_tok][rot]  RoPE cos/sin rows (rot =
 *                                         rotary_dim floats: cos then sin):
 *                                         row 0 the last base_position's,
 *                                         row 1 + p position p's; rows of
 *                                         positions [0, cs_n) are valid
 *   ident        int32 [cap_tok]         0, 1, 2, ...: the slot map and the
 *                                         in-order tile list of attention
 *   recent       int32 [recent_cap]      recent_cap - 1 - i at i, but for the
 *                                         sink tile ids of the last RECENT
 *                                         order (kvm_resident_recent_order);
 *                                         made on first use
 * A new base_position uploads row 0 only; a truncate keeps the blocks it
 * keeps whole (kvm_resident_truncate). Growing past the capacity
 * reallocates at twice the size and uploads again from the host
 * (amortised: each block is uploaded O(1) times).
 * Device capacity (kvmem_pool_params.device_capacity_bytes): every buffer
 * counts in the pool's dev_bytes. A mirror that would take the pool past
 * it first evicts closed agents' mirrors (least recently used first; an
 * open agent's mirror may be in use on another thread), then tries the
 * exact size instead of twice it; when it still does not fit, the agent
 * has no mirror and the sync says KVMEM_ERR_UNSUPPORTED, which every
 * caller takes as "serve from the host copy" (staged per call or the CPU).
 * Used under the agent's handle (one call at a time per agent). */
#ifndef KVMEM_POOL_RESIDENT_H
#define KVMEM_POOL_RESIDENT_H

#include "pool.h"

typedef struct kvm_resident {
    kvmem_backend *be;
    kvmem_dtype dtype, box_dtype; /* of k/v and of smax/smin: F16 or F32 */
    int32_t n_blocks;   /* sealed blocks [0, n_blocks) are uploaded */
    int32_t cap_blocks;
    int64_t n_tok;      /* tokens of those blocks */
    int64_t cap_tok;
    kvmem_buffer *smax, *smin, *ident, *tk, *tv, *cs;
    kvmem_buffer **k, **v; /* [n_layers] each */
    int64_t cs_n;          /* cos/sin rows of positions [0, cs_n) are up */
    int64_t cs_base;       /* the base_position in row 0 (valid when cs_base_ok) */
    int cs_base_ok;
    int32_t n_layers;
    kvmem_buffer *recent;
    int32_t recent_cap, recent_at, recent_s; /* the sink ids sit at [recent_at, recent_at + recent_s) */
    uint64_t bytes;        /* device bytes the buffers above hold */
    struct kvmem_pool *pool; /* whose dev_bytes counts them */
} kvm_resident;

/* The backend a device path of p's context runs on, or NULL on a CPU
 * context (or a device backend without the buffer-level kernels). */
kvmem_backend *kvm_resident_backend(const kvmem_pool *p);

/* Bring m's mirror on be up to date with its sealed blocks, uploading only
 * the blocks not yet resident; *out = the mirror (owned by m). Errors:
 * KVMEM_ERR_UNSUPPORTED (blocks not contiguous from token 0: the caller
 * takes its packing path), the backend's allocation/upload status with a
 * message. On error the mirror is dropped or left valid, never half-written
 * for blocks it reports resident. */
kvmem_status kvm_resident_sync(const kvmem_pool *p, kvm_agent_mem *m, kvmem_backend *be, kvm_resident **out);

/* What attention on layer l at base_position `base` reads besides k[l] and
 * v[l]: the cos/sin rows of positions [0, n_tok + tail_n) (uploading only
 * those not yet up) and row 0 = base's (uploaded when base changed), and the
 * unsealed tail's f32 K and V rows of layer l in tk / tv. Call after a
 * successful kvm_resident_sync. */
kvmem_status kvm_resident_attend_keys(const kvmem_pool *p, const kvm_agent_mem *m, kvm_resident *r, int32_t l,
                                      int64_t base);

/* Fill a's mirror fields for attention on layer l over the sealed tokens
 * and the tail (after kvm_resident_attend_keys): k, v, dtype, the tail
 * buffers, the slot map and n_slots, and the RoPE table. */
void kvm_resident_attend_args(const kvmem_pool *p, const kvm_agent_mem *m, const kvm_resident *r, int32_t l,
                              kvm_dev_attend_args *a);

/* m's blocks [0, keep_blocks) stay as they are and the rest go (a
 * truncate): the mirror keeps the resident ones among them, the RoPE table
 * and the tile lists, and uploads nothing. Call before the blocks are freed. */
void kvm_resident_truncate(kvm_agent_mem *m, int32_t keep_blocks);

/* Attention's RECENT tile order on the device: tiles [0, n_sink) then
 * n_tiles - 1 down to n_sink (0 <= n_sink < n_tiles, n_tiles <= cap_tok /
 * block_size + 1), as n_tiles ids at *off bytes into *buf. The recent
 * buffer's descending run holds the newest-first part for every n_tiles;
 * the sink ids are written just before it and put back when n_tiles or
 * n_sink change: a call uploads at most 2 * n_sink ids (none when they are
 * the last call's), not the whole list, which grows with the history. */
kvmem_status kvm_resident_recent_order(const kvmem_pool *p, kvm_resident *r, int32_t n_tiles, int32_t n_sink,
                                       const kvmem_buffer **buf, size_t *off);

/* Free m's mirror (if any); m->res becomes NULL. The pool calls this
 * whenever m's blocks change other than by sealing. */
void kvm_resident_drop(kvm_agent_mem *m);

#endif
