/* ART attention (internal): the planning kvmem_attend() does before an
 * attend op runs the plan (cpu/attend_plan.h). */
#ifndef KVMEM_ATTEND_H
#define KVMEM_ATTEND_H

#include "../internal.h"
#include "../backend/backend.h"
#include "../cpu/attend_plan.h"
#include "../pool/pool.h"

/* SCORED: fill head_order [n_kv_heads][n_tiles] from each tile's score per
 * KV head, its largest logit over the rows and the group's query heads (the
 * plan's tiles, rows and source already resolved; the plan's q, scale and,
 * for agents, pool / mem / layer / positions are read). TENSORS / SLOTMAP:
 * exact, one pass over the visible keys on ctx's workers (*k_rows_read = the
 * (position, KV head) K rows it read); AGENT: an upper bound from each
 * block's AABB of raw keys and its span of positions, RoPE included (the
 * unsealed tail's box from its rows; *k_rows_read = 0). Tiles no row sees
 * score -inf. scores (optional): [n_kv_heads][n_tiles] out. logits
 * (optional, caller K only): [n_rows][n_q_heads][T] out, every logit the
 * scan computed (positions a row does not see are left as they were). */
kvmem_status kvm_attend_scored_order(kvmem_context *ctx, const kvm_attend_plan *plan, int32_t *head_order,
                                     float *scores, float *logits, int64_t *k_rows_read);

/* Tiles with a live position some row sees. */
int32_t kvm_attend_tiles_seen(const kvm_attend_plan *plan);

#endif
