/* kvmem_attend(): checks every argument, resolves the source into tiles, a
 * visiting order and per-row visibility (the plan), runs the backend's
 * `attend` op and writes the output only when everything succeeded. */
#include "attend.h"
#include "../tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KVM_ATTEND_DEFAULT_TILE 64

kvmem_attend_params kvmem_attend_default_params(void) {
    kvmem_attend_params p;
    memset(&p, 0, sizeof p);
    p.order = KVMEM_ATTEND_RECENT;
    p.n_sink = 4;
    p.tile_size = 0;
    p.scale = 0.0f;
    p.tau_s = 0.001f;
    p.tau_d = 0.0001f;
    p.patience = 4;
    p.probe = KVMEM_ATTEND_PROBE_STRIDED;
    p.causal = 1;
    p.compare = 0;
    return p;
}

static kvmem_status check_params(const kvmem_attend_params *a) {
    const char *fn = "kvmem_attend";
    if (a->order != KVMEM_ATTEND_RECENT && a->order != KVMEM_ATTEND_IMPORTANCE && a->order != KVMEM_ATTEND_INDEX)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: order %d is not RECENT, IMPORTANCE or INDEX", fn, (int)a->order);
    if (a->n_sink < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n_sink %d is negative", fn, a->n_sink);
    if (a->tile_size < 0 || a->tile_size > 4096)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: tile_size %d outside [0, 4096] (0 = default)", fn, a->tile_size);
    if (!(a->scale >= 0.0f) || !isfinite(a->scale))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: scale %g must be finite and >= 0 (0 = 1/sqrt(head_dim))", fn,
                        (double)a->scale);
    if (!(a->tau_s >= 0.0f) || !isfinite(a->tau_s) || !(a->tau_d >= 0.0f) || !isfinite(a->tau_d))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: tau_s %g and tau_d %g must be finite and >= 0", fn,
                        (double)a->tau_s, (double)a->tau_d);
    if (a->patience < 1) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: patience %d must be >= 1", fn, a->patience);
    if (a->probe != KVMEM_ATTEND_PROBE_STRIDED && a->probe != KVMEM_ATTEND_PROBE_ORACLE)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: probe %d is not STRIDED or ORACLE", fn, (int)a->probe);
    if (a->causal != 0 && a->causal != 1)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: causal must be 0 or 1, got %d", fn, a->causal);
    if (a->compare != 0 && a->compare != 1)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: compare must be 0 or 1, got %d", fn, a->compare);
    if (a->n_tile_order < 0)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n_tile_order %d is negative", fn, a->n_tile_order);
    if (a->order == KVMEM_ATTEND_RECENT && (a->tile_order || a->n_tile_order))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: tile_order is only used by the IMPORTANCE and INDEX orders", fn);
    if (a->n_tile_order > 0 && !a->tile_order)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: tile_order is NULL with n_tile_order %d", fn, a->n_tile_order);
    return KVMEM_OK;
}

/* Heap state of one call, freed in one place. */
typedef struct attend_bufs {
    float *q, *out;
    int64_t *tile_start, *live_prefix, *rows;
    int32_t *order;
    uint8_t *seen;
} attend_bufs;

static void bufs_free(attend_bufs *b) {
    free(b->q);
    free(b->out);
    free(b->tile_start);
    free(b->live_prefix);
    free(b->rows);
    free(b->order);
    free(b->seen);
}

/* Geometry and T of the source; checks the source's own fields. */
static kvmem_status check_source(const kvmem_attend_source *src, kvm_attend_plan *pl, int32_t *is_agent) {
    const char *fn = "kvmem_attend";
    kvmem_status st;
    switch (src->kind) {
    case KVMEM_ATTEND_SRC_TENSORS:
    case KVMEM_ATTEND_SRC_SLOTMAP: {
        const int slot = src->kind == KVMEM_ATTEND_SRC_SLOTMAP;
        const char *dims = slot ? "[n_slots][n_kv_heads][head_dim]" : "[T][n_kv_heads][head_dim]";
        if (src->agent || src->positions || src->base_position || src->layer)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: agent, positions, base_position and layer are for AGENT sources", fn);
        if (!slot && (src->slots || src->n_positions || src->dead_slot))
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: slots, n_positions and dead_slot are for SLOTMAP sources", fn);
        if (!src->k || !src->v)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: source %s is NULL", fn, src->k ? "v" : "k");
        if (src->k->ndim != 3)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: source k has %d dims, expected 3 %s", fn, src->k->ndim, dims);
        int64_t shape[3] = {src->k->shape[0], src->k->shape[1], src->k->shape[2]};
        if (shape[1] < 1 || shape[2] < 1 || shape[2] > 1024 || shape[1] > INT32_MAX)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: source k shape [%lld][%lld][%lld]: n_kv_heads >= 1, head_dim in [1, 1024]",
                            fn, (long long)shape[0], (long long)shape[1], (long long)shape[2]);
        if ((st = kvm_tensor_expect(src->k, "source k", dims, 3, shape)) != KVMEM_OK) return st;
        if ((st = kvm_tensor_expect(src->v, "source v", dims, 3, shape)) != KVMEM_OK) return st;
        pl->n_kv_heads = (int32_t)shape[1];
        pl->head_dim = (int32_t)shape[2];
        pl->k = src->k;
        pl->v = src->v;
        if (slot) {
            if (src->n_positions < 0)
                return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n_positions %lld is negative", fn, (long long)src->n_positions);
            if (src->n_positions > 0 && !src->slots)
                return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: slots is NULL with n_positions %lld", fn, (long long)src->n_positions);
            pl->T = src->n_positions;
            pl->slots = src->slots;
            pl->dead_slot = src->dead_slot;
            for (int64_t j = 0; j < pl->T; j++) {
                int32_t sl = src->slots[j];
                if (sl == src->dead_slot || (src->mask && !src->mask[j])) continue;
                if (sl < 0 || sl >= shape[0])
                    return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: slots[%lld] = %d outside [0, %lld) and not the dead slot %d",
                                    fn, (long long)j, sl, (long long)shape[0], src->dead_slot);
            }
        } else {
            pl->T = shape[0];
        }
        *is_agent = 0;
        return KVMEM_OK;
    }
    case KVMEM_ATTEND_SRC_AGENT: {
        if ((st = kvm_agent_check(src->agent, fn)) != KVMEM_OK) return st;
        if (src->k || src->v || src->slots || src->n_positions || src->dead_slot)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: k, v, slots, n_positions and dead_slot are not used by AGENT sources", fn);
        const kvmem_pool *pool = src->agent->pool;
        if (src->layer < 0 || src->layer >= pool->spec.n_layers)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: layer %d outside [0, %d)", fn, src->layer, pool->spec.n_layers);
        const kvm_agent_mem *m = src->agent->mem;
        if (src->base_position < 0 || src->base_position > INT32_MAX - m->n_tokens)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: base_position %lld out of range", fn, (long long)src->base_position);
        pl->n_kv_heads = pool->spec.n_kv_heads;
        pl->head_dim = pool->spec.head_dim;
        pl->pool = pool;
        pl->mem = m;
        pl->layer = src->layer;
        pl->positions = src->positions;
        pl->base_position = src->base_position;
        pl->T = m->n_tokens;
        *is_agent = 1;
        return KVMEM_OK;
    }
    default:
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: source kind %d is not TENSORS, AGENT or SLOTMAP", fn, (int)src->kind);
    }
}

/* Tiles, the visiting order, live counts and row visibility. */
static kvmem_status build_plan(const kvmem_attend_source *src, const kvmem_attend_params *a, int agent,
                               kvm_attend_plan *pl, attend_bufs *b) {
    const char *fn = "kvmem_attend";
    const int64_t T = pl->T;
    int64_t n_tiles;
    if (agent) {
        if (a->tile_size != 0)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: an agent source's tiles are its blocks: set tile_size to 0", fn);
        n_tiles = pl->mem->n_sealed + (pl->mem->tail_n > 0);
    } else {
        const int64_t ts = a->tile_size ? a->tile_size : KVM_ATTEND_DEFAULT_TILE;
        n_tiles = (T + ts - 1) / ts;
        if (n_tiles > INT32_MAX - 1)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %lld positions make more than 2^31 tiles", fn, (long long)T);
    }
    pl->n_tiles = (int32_t)n_tiles;
    /* the order list is checked before anything is allocated for it */
    if (a->order != KVMEM_ATTEND_RECENT) {
        b->seen = calloc((size_t)n_tiles + 1, 1);
        if (!b->seen) return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory", fn);
        for (int32_t i = 0; i < a->n_tile_order; i++) {
            int32_t t = a->tile_order[i];
            if (t < 0 || t >= n_tiles)
                return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: tile_order[%d] = %d outside [0, %lld) tiles", fn, i, t,
                                (long long)n_tiles);
            if (b->seen[t])
                return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: tile_order[%d] = %d appears twice", fn, i, t);
            b->seen[t] = 1;
        }
    }
    b->tile_start = malloc(((size_t)n_tiles + 1) * sizeof(int64_t));
    b->order = malloc(((size_t)n_tiles + 1) * sizeof(int32_t));
    b->rows = malloc(2 * (size_t)pl->n_rows * sizeof(int64_t));
    if (!b->tile_start || !b->order || !b->rows) return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory", fn);
    if (agent) {
        for (int32_t t = 0; t < pl->mem->n_sealed; t++) b->tile_start[t] = pl->mem->blocks[t].first_token;
        b->tile_start[pl->mem->n_sealed] = T - pl->mem->tail_n;
        b->tile_start[n_tiles] = T;
    } else {
        const int64_t ts = a->tile_size ? a->tile_size : KVM_ATTEND_DEFAULT_TILE;
        for (int64_t t = 0; t < n_tiles; t++) b->tile_start[t] = t * ts;
        b->tile_start[n_tiles] = T;
    }
    int32_t n = 0;
    if (a->order == KVMEM_ATTEND_RECENT) {
        int32_t n_sink_tiles = 0;
        while (n_sink_tiles < n_tiles && b->tile_start[n_sink_tiles] < a->n_sink) n_sink_tiles++;
        for (int32_t t = 0; t < n_sink_tiles; t++) b->order[n++] = t;
        for (int64_t t = n_tiles - 1; t >= n_sink_tiles; t--) b->order[n++] = (int32_t)t;
    } else {
        for (int32_t i = 0; i < a->n_tile_order; i++) b->order[n++] = a->tile_order[i];
        if (a->order == KVMEM_ATTEND_IMPORTANCE)
            for (int64_t t = n_tiles - 1; t >= 0; t--)
                if (!b->seen[t]) b->order[n++] = (int32_t)t;
    }
    pl->tile_start = b->tile_start;
    pl->order = b->order;
    pl->n_order = n;
    pl->mask = src->mask;
    if (src->mask || pl->slots) {
        b->live_prefix = malloc(((size_t)T + 1) * sizeof(int64_t));
        if (!b->live_prefix) return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for %lld positions", fn, (long long)T);
        b->live_prefix[0] = 0;
        for (int64_t j = 0; j < T; j++) {
            int live = (!src->mask || src->mask[j]) && (!pl->slots || pl->slots[j] != pl->dead_slot);
            b->live_prefix[j + 1] = b->live_prefix[j] + live;
        }
        pl->live_prefix = b->live_prefix;
    }
    int32_t window = 0;
    if (agent && pl->pool->layer_window) window = pl->pool->layer_window[pl->layer];
    for (int32_t r = 0; r < pl->n_rows; r++) {
        int64_t hi = a->causal ? T - pl->n_rows + r + 1 : T;
        hi = KVM_MAX(hi, (int64_t)0);
        b->rows[r] = window > 0 ? KVM_MAX((int64_t)0, hi - window) : 0;
        b->rows[pl->n_rows + r] = hi;
    }
    pl->row_lo = b->rows;
    pl->row_hi = b->rows + pl->n_rows;
    return KVMEM_OK;
}

kvmem_status kvmem_attend(kvmem_context *ctx, const kvmem_tensor *q, const kvmem_attend_source *source,
                          const kvmem_attend_params *params, const kvmem_tensor *out, kvmem_attend_stats *stats) {
    const char *fn = "kvmem_attend";
    kvmem_status st;
    if (!ctx) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    if (!q || !source || !out)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s is NULL", fn, !q ? "q" : !source ? "source" : "out");
    kvmem_attend_params a = params ? *params : kvmem_attend_default_params();
    if ((st = check_params(&a)) != KVMEM_OK) return st;
    kvm_attend_plan pl;
    memset(&pl, 0, sizeof pl);
    int32_t agent = 0;
    if ((st = check_source(source, &pl, &agent)) != KVMEM_OK) return st;
    const char *qdims = "[n_rows][n_q_heads][head_dim]";
    if (q->ndim != 3)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: q has %d dims, expected 3 %s", fn, q->ndim, qdims);
    const int64_t R = q->shape[0], Hq = q->shape[1];
    if (R < 1 || R > KVMEM_ATTEND_MAX_ROWS)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %lld query rows outside [1, %d]", fn, (long long)R, KVMEM_ATTEND_MAX_ROWS);
    if (Hq < pl.n_kv_heads || Hq % pl.n_kv_heads != 0 || Hq > 65536)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: q has %lld heads, not a multiple of the %d KV heads", fn, (long long)Hq,
                        pl.n_kv_heads);
    int64_t qshape[3] = {R, Hq, pl.head_dim};
    if ((st = kvm_tensor_expect(q, "q", qdims, 3, qshape)) != KVMEM_OK) return st;
    if ((st = kvm_tensor_expect(out, "out", qdims, 3, qshape)) != KVMEM_OK) return st;
    pl.n_rows = (int32_t)R;
    pl.n_q_heads = (int32_t)Hq;
    pl.group = (int32_t)(Hq / pl.n_kv_heads);
    pl.scale = a.scale > 0 ? a.scale : 1.0f / sqrtf((float)pl.head_dim);
    pl.stop_enabled = a.tau_s > 0 || a.tau_d > 0;
    pl.tau_s = a.tau_s;
    pl.tau_d = a.tau_d;
    pl.patience = a.patience;
    pl.probe = a.probe;
    pl.compare = a.compare;
    pl.kind = source->kind;

    attend_bufs b;
    memset(&b, 0, sizeof b);
    const size_t D = (size_t)pl.head_dim, n_out = (size_t)R * (size_t)Hq * D;
    b.q = malloc(n_out * sizeof(float));
    b.out = malloc(n_out * sizeof(float));
    if (!b.q || !b.out) {
        bufs_free(&b);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory", fn);
    }
    for (int64_t r = 0; r < R; r++)
        for (int64_t h = 0; h < Hq; h++) {
            int64_t idx[2] = {r, h};
            float *dst = b.q + ((size_t)r * (size_t)Hq + (size_t)h) * D;
            kvm_tensor_read_f32(q, kvm_tensor_row_offset(q, idx), dst, D);
            for (size_t d = 0; d < D; d++)
                if (!isfinite(dst[d])) {
                    bufs_free(&b);
                    return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: q[%lld][%lld][%zu] is not finite", fn, (long long)r,
                                    (long long)h, d);
                }
        }
    pl.q = b.q;
    pl.out = b.out;
    if ((st = build_plan(source, &a, agent, &pl, &b)) != KVMEM_OK) {
        bufs_free(&b);
        return st;
    }
    kvmem_backend *be = ctx->backend && ctx->backend->iface->attend ? ctx->backend : ctx->cpu;
    kvmem_attend_stats s;
    if ((st = be->iface->attend(be, &pl, &s)) != KVMEM_OK) {
        bufs_free(&b);
        return st;
    }
    for (int64_t r = 0; r < R; r++)
        for (int64_t h = 0; h < Hq; h++) {
            int64_t idx[2] = {r, h};
            kvm_tensor_write_f32(out, kvm_tensor_row_offset(out, idx), b.out + ((size_t)r * (size_t)Hq + (size_t)h) * D, D);
        }
    if (stats) *stats = s;
    bufs_free(&b);
    return KVMEM_OK;
}
