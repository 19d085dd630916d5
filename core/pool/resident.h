/* Device-resident mirror of an agent's sealed blocks (DESIGN.md, Residency).
 *
 * On a context whose backend is a device, retrieval, gather and attention
 * read an agent's AABBs and K/V from backend buffers that mirror the host
 * copy: a block is uploaded once, the first time a device op needs it, and
 * never again while it stays sealed. The host copy stays the source of truth
 * (persistence, the CPU ops); the mirror is a cache the pool drops whenever
 * blocks change other than by sealing new ones (truncate, load, spill, free:
 * kvm_resident_drop), and it is rebuilt lazily from the host.
 *
 * Layout, f32 (the device kernels' input type), token slot = the token's
 * index in the agent (sealed blocks are contiguous from token 0):
 *   smax, smin   [cap_blocks][L][H][D]   dev_score's s_max / s_min
 *   k[l], v[l]   [cap_tok][H][D]         raw keys (no RoPE) and values; slots
 *                                         past the sealed tokens hold the
 *                                         unsealed tail while an attention runs
 *   krot[l]      [cap_tok][H][D]         keys rotated to positions
 *                                         rot_base[l] + slot (attention); the
 *                                         first rot_n[l] slots are valid
 *   ident        int32 [cap_tok]         0, 1, 2, ...: the slot map and the
 *                                         in-order tile list of attention
 *   recent       int32 [recent_cap]      recent_cap - 1 - i at i, but for the
 *                                         sink tile ids of the last RECENT
 *                                         order (kvm_resident_recent_order);
 *                                         made on first use
 * Growing past the capacity reallocates at twice the size and uploads again
 * from the host (amortised: each block is uploaded O(1) times).
 * Used under the agent's handle (one call at a time per agent). */
#ifndef KVMEM_POOL_RESIDENT_H
#define KVMEM_POOL_RESIDENT_H

#include "pool.h"

typedef struct kvm_resident {
    kvmem_backend *be;
    int32_t n_blocks;   /* sealed blocks [0, n_blocks) are uploaded */
    int32_t cap_blocks;
    int64_t n_tok;      /* tokens of those blocks */
    int64_t cap_tok;
    kvmem_buffer *smax, *smin, *ident;
    kvmem_buffer **k, **v, **krot; /* [n_layers] each */
    int64_t *rot_n, *rot_base;     /* [n_layers] */
    int32_t n_layers;
    kvmem_buffer *recent;
    int32_t recent_cap, recent_at, recent_s; /* the sink ids sit at [recent_at, recent_at + recent_s) */
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

/* Attention's keys for layer l: krot[l] valid for the sealed tokens at
 * positions base + slot (rotated on the device from k[l], uploading only the
 * cos/sin of the slots not yet rotated, or all of them when base changed),
 * and the unsealed tail's K and V rows uploaded into slots [n_tok, n_tok +
 * tail_n) of k[l] / v[l] and rotated into krot[l]. Call after a successful
 * kvm_resident_sync. */
kvmem_status kvm_resident_attend_keys(const kvmem_pool *p, const kvm_agent_mem *m, kvm_resident *r, int32_t l,
                                      int64_t base);

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
