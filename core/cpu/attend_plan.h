/* The plan of one attention call (ART), everything the attend op needs
 * resolved and checked by core/attend: the CPU backend runs it whole
 * (kvm_attend_cpu), a device backend the buffer-level form of it its
 * dev_attend takes. An agent's rows come through callbacks, so the op does
 * not read the pool's internals. */
#ifndef KVMEM_CPU_ATTEND_PLAN_H
#define KVMEM_CPU_ATTEND_PLAN_H

#include "../internal.h"
#include "../backend/backend.h"
#include "../rope/rope.h"

/* An agent's rows: tiles [0, n_sealed) are its sealed blocks, tile
 * n_sealed (when the plan has it) the unsealed tail. */
typedef struct kvm_attend_agent {
    void *ctx;
    int32_t n_sealed;
    /* rows [row0, row0 + n) of sealed tile t, K (which 0) or V (1) of
     * layer l, head h: f32 [n][head_dim] (a failed read leaves zeros, which
     * the caller checks after the op) */
    void (*read)(void *ctx, int32_t t, int which, int32_t l, int32_t h, int32_t row0, int32_t n, float *dst);
    /* the tail's f32 rows of (which, l, h), [tail tokens][head_dim] */
    const float *(*tail)(void *ctx, int which, int32_t l, int32_t h);
    const kvm_rope *rope; /* keys are stored raw: rotated to their positions as they are read */
} kvm_attend_agent;

/* tile_size 0: positions per tile of TENSORS and SLOTMAP sources */
#define KVM_ATTEND_DEFAULT_TILE KVMEM_ATTEND_DEFAULT_TILE
/* SCORED keeps the scan's logits up to this many floats (16 MiB: decode
 * with 32 query heads up to 128k positions) */
#define KVM_ATTEND_MAX_LOGITS (4.0 * 1024 * 1024)

/* Everything a backend needs, resolved and checked: no field is invalid. */
typedef struct kvm_attend_plan {
    int32_t n_rows, n_q_heads, n_kv_heads, head_dim, group; /* group = n_q_heads / n_kv_heads */
    float scale;
    const float *q;  /* [n_rows][n_q_heads][head_dim] f32, contiguous (a copy) */
    float *out;      /* [n_rows][n_q_heads][head_dim] f32 scratch the op fills */

    kvmem_attend_source_kind kind;
    int64_t T;                  /* logical positions */
    const kvmem_tensor *k, *v;  /* TENSORS / SLOTMAP */
    const int32_t *slots;       /* SLOTMAP */
    int32_t dead_slot;
    const uint8_t *mask;        /* or NULL */
    const kvmem_pool *pool;     /* AGENT: the planning code's (core/attend); the op reads `agent` */
    const struct kvm_agent_mem *mem;
    kvm_attend_agent agent;     /* AGENT: the rows as the op reads them */
    int32_t layer;
    const int32_t *positions;   /* AGENT, or NULL */
    int64_t base_position;

    /* tiles: id i covers positions [tile_start[i], tile_start[i + 1]) */
    int32_t n_tiles;
    const int64_t *tile_start;  /* n_tiles + 1 */
    const int32_t *order;       /* visiting order, n_order tile ids */
    int32_t n_order;
    const int32_t *head_order;  /* (optional) SCORED: [n_kv_heads][n_order], KV head h
                                   visits head_order[h * n_order ..]; NULL: `order` for all */
    const float *logits;        /* (optional) SCORED on caller K: [n_rows][n_q_heads][T]
                                   scale * q.k of every position a row sees, from the scan;
                                   the attention reads these instead of K */
    const int64_t *live_prefix; /* T + 1 counts of live positions, or NULL (all live) */
    const int64_t *row_lo;      /* n_rows: first visible position */
    const int64_t *row_hi;      /* n_rows: one past the last visible position */
    int32_t causal;

    /* the stop rule */
    int32_t stop_enabled;       /* 0 when tau_s = tau_d = 0 */
    float tau_s, tau_d;
    int32_t patience;
    kvmem_attend_probe probe;
    int32_t compare;

    /* (optional) [n_rows][n_kv_heads]: tiles each stream read before it
     * stopped (its tiles_visited share); NULL when not wanted */
    int32_t *stream_visited;
} kvm_attend_plan;

/* Run the plan on the CPU (the reference for every backend). Fills
 * plan->out and *stats. Allocation failure: KVMEM_ERR_NOMEM. */
kvmem_status kvm_attend_cpu(kvmem_backend *be, const kvm_attend_plan *plan, kvmem_attend_stats *stats);

/* The CPU backend's dev_attend entry (argument checks in
 * core/backend/attend_dev.h): runs kvm_attend_cpu on a plan built from the
 * host buffers. Also rejects what a device cannot check: a live slot
 * >= n_slots, tile ids outside [0, n_tiles) or repeated. */
kvmem_status kvm_attend_dev_cpu(kvmem_backend *be, const kvm_dev_attend_args *a);

#endif
