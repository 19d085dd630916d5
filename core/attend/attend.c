/* kvmem_attend(): checks every argument, resolves the source into tiles, a
 * visiting order and per-row visibility (the plan), runs the backend's
 * `attend` op and writes the output only when everything succeeded. */
#include "attend.h"
#include "../backend/route/route.h"
#include "../backend/route/devtensor.h"
#include "../cpu/tensor.h"
#include "../cpu/scratch.h"
#include "../pool/resident.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

kvmem_status kvmem_attend_params_init(kvmem_attend_params *params, size_t struct_size) {
    kvmem_attend_params p;
    memset(&p, 0, sizeof p);
    p.order = KVMEM_ATTEND_SCORED; /* BENCHMARKS.md, "attend": safe on recall-heavy histories */
    p.n_sink = 4;
    p.tile_size = 0;
    p.scale = 0.0f;
    p.tau_s = 0.001f;
    p.tau_d = 0.0001f;
    p.patience = 8;
    p.probe = KVMEM_ATTEND_PROBE_STRIDED;
    p.causal = 1;
    p.compare = 0;
    return KVM_PARAMS_INIT(kvmem_attend_params, params, struct_size, &p, "kvmem_attend_params_init");
}

static kvmem_status check_params(const kvmem_attend_params *a) {
    const char *fn = "kvmem_attend";
    if (a->order != KVMEM_ATTEND_RECENT && a->order != KVMEM_ATTEND_IMPORTANCE && a->order != KVMEM_ATTEND_INDEX &&
        a->order != KVMEM_ATTEND_SCORED)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: order %d is not RECENT, IMPORTANCE, INDEX or SCORED", fn,
                        (int)a->order);
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
    if ((a->order == KVMEM_ATTEND_RECENT || a->order == KVMEM_ATTEND_SCORED) && (a->tile_order || a->n_tile_order))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: tile_order is only used by the IMPORTANCE and INDEX orders", fn);
    if (a->n_tile_order > 0 && !a->tile_order)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: tile_order is NULL with n_tile_order %d", fn, a->n_tile_order);
    return KVMEM_OK;
}

/* Heap state of one call, freed in one place. The buffers that grow with
 * the history (live counts, the SCORED order and logits) come from the
 * context's cache of work memory (cpu/scratch.h). */
typedef struct attend_bufs {
    kvm_scratch *sc;
    float *q, *out;
    int64_t *tile_start, *live_prefix, *rows;
    int32_t *order, *head_order;
    float *logits;
    uint8_t *seen;
} attend_bufs;

static void bufs_free(attend_bufs *b) {
    kvm_free(b->q);
    kvm_free(b->out);
    kvm_free(b->tile_start);
    kvm_scratch_give(b->sc, b->live_prefix);
    kvm_free(b->rows);
    kvm_free(b->order);
    kvm_scratch_give(b->sc, b->head_order);
    kvm_scratch_give(b->sc, b->logits);
    kvm_free(b->seen);
}

/* Geometry and T of the source; checks the source's own fields. */
/* An agent's rows for the attend op (kvm_attend_agent; ctx is the plan). */
static void agent_read(void *ctx, int32_t t, int which, int32_t l, int32_t h, int32_t row0, int32_t n, float *dst) {
    const kvm_attend_plan *pl = ctx;
    kvm_block_read_f32(pl->pool, &pl->mem->blocks[t], which, l, h, row0, n, dst);
}

static const float *agent_tail(void *ctx, int which, int32_t l, int32_t h) {
    const kvm_attend_plan *pl = ctx;
    return kvm_tail_rows(pl->pool, pl->mem, which, l, h);
}

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
        pl->agent.ctx = pl;
        pl->agent.n_sealed = m->n_sealed;
        pl->agent.read = agent_read;
        pl->agent.tail = agent_tail;
        pl->agent.rope = &pool->rope;
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
    if (a->order == KVMEM_ATTEND_IMPORTANCE || a->order == KVMEM_ATTEND_INDEX) {
        b->seen = kvm_calloc((size_t)n_tiles + 1, 1);
        if (!b->seen) return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for the flags of %lld tiles", fn, (long long)n_tiles);
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
    b->tile_start = kvm_malloc(((size_t)n_tiles + 1) * sizeof(int64_t));
    b->order = kvm_malloc(((size_t)n_tiles + 1) * sizeof(int32_t));
    b->rows = kvm_malloc(2 * (size_t)pl->n_rows * sizeof(int64_t));
    if (!b->tile_start || !b->order || !b->rows) return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for the plan of %lld tiles", fn, (long long)n_tiles);
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
    } else if (a->order == KVMEM_ATTEND_SCORED) { /* every tile: the per-head orders come later */
        for (int64_t t = n_tiles - 1; t >= 0; t--) b->order[n++] = (int32_t)t;
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
        b->live_prefix = kvm_scratch_take(b->sc, ((size_t)T + 1) * sizeof(int64_t));
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

/* ---- the device path: dev_attend on the context's backend ---- */

/* Plans the buffer-level kernel covers: one row of a TENSORS or SLOTMAP
 * source, no mask, the STRIDED probe, no ORACLE comparison, one order for
 * every KV head (the kernel takes one list: SCORED runs on the CPU). */
static int device_eligible(const kvm_attend_plan *pl) {
    return (pl->kind == KVMEM_ATTEND_SRC_TENSORS || pl->kind == KVMEM_ATTEND_SRC_SLOTMAP) && pl->n_rows == 1 &&
           !pl->head_order &&
           !pl->mask && pl->probe == KVMEM_ATTEND_PROBE_STRIDED && !pl->compare && pl->row_lo[0] == 0 &&
           pl->row_hi[0] == pl->T;
}

/* AGENT sources read the agent's resident K/V (core/pool/resident.h): the
 * same plans, keys at base_position + index (no positions list), and tiles
 * of one size (every sealed block full: the kernel takes one tile size). */
static int agent_device_eligible(const kvm_attend_plan *pl) {
    if (pl->kind != KVMEM_ATTEND_SRC_AGENT || pl->n_rows != 1 || pl->head_order || pl->mask || pl->positions ||
        pl->probe != KVMEM_ATTEND_PROBE_STRIDED || pl->compare || pl->row_lo[0] != 0 || pl->row_hi[0] != pl->T ||
        pl->T < 1 || pl->T > INT32_MAX || !kvm_resident_backend(pl->pool))
        return 0;
    const int32_t bs = pl->pool->params.block_size;
    for (int32_t t = 0; t < pl->mem->n_sealed; t++)
        if (pl->mem->blocks[t].n_tokens != bs) return 0;
    return 1;
}

/* t ([n][n_kv_heads][head_dim], any strides, F32/F16/BF16) as contiguous
 * rows of dtype dt (F32, or F16 when t is F16). */
static void pack_kv(const kvmem_tensor *t, kvmem_dtype dt, void *dst) {
    const size_t H = (size_t)t->shape[1], D = (size_t)t->shape[2];
    const size_t es = kvm_dtype_size(t->dtype);
    for (int64_t i = 0; i < t->shape[0]; i++)
        for (size_t h = 0; h < H; h++) {
            const int64_t off = i * t->strides[0] + (int64_t)h * t->strides[1];
            const size_t at = ((size_t)i * H + h) * D;
            if (dt == KVMEM_F32) {
                kvm_tensor_read_f32(t, off, (float *)dst + at, D);
            } else { /* F16 to F16: the bits, a row at a time (head-major caches too), element by element when strided */
                const unsigned char *src = (const unsigned char *)t->data + (size_t)off * es;
                uint16_t *o = (uint16_t *)dst + at;
                if (t->strides[2] == 1) memcpy(o, src, D * 2);
                else
                    for (size_t d = 0; d < D; d++) memcpy(o + d, src + (size_t)(t->strides[2] * (int64_t)d) * es, 2);
            }
        }
}

static int is_contiguous(const kvmem_tensor *t) {
    return t->strides[2] == 1 && t->strides[1] == t->shape[2] && t->strides[0] == t->shape[1] * t->shape[2];
}

/* The first live position whose K row (some KV head) is not finite, or -1.
 * The device path uploads every live row, so it checks them all on the
 * host first: a device's exp may clamp a NaN logit to a plausible weight. */
static int64_t first_nonfinite_k(const kvm_attend_plan *pl, int32_t *head) {
    float row[1024];
    const size_t D = (size_t)pl->head_dim;
    for (int64_t j = 0; j < pl->T; j++) {
        if (pl->slots && pl->slots[j] == pl->dead_slot) continue;
        const int64_t at = pl->slots ? pl->slots[j] : j;
        for (int32_t h = 0; h < pl->n_kv_heads; h++) {
            int64_t idx[2] = {at, h};
            kvm_tensor_read_f32(pl->k, kvm_tensor_row_offset(pl->k, idx), row, D);
            float z = 0.0f;
            for (size_t d = 0; d < D; d++) z += row[d] * 0.0f; /* NaN for any non-finite value */
            if (z != 0.0f) {
                *head = h;
                return j;
            }
        }
    }
    return -1;
}

/* *s from the per-stream tile counts a device reported: stream g read the
 * first visited[g] tiles with a live position of the order, all of their
 * live positions. */
static kvmem_status stats_from_visited(const char *be_name, const kvm_attend_plan *pl, const int32_t *visited,
                                       const int32_t *positions, kvmem_attend_stats *s) {
    const char *fn = "kvmem_attend";
    const int32_t H = pl->n_kv_heads;
    memset(s, 0, sizeof *s);
    int64_t n_live_tiles = 0;
    for (int32_t i = 0; i < pl->n_order; i++) {
        const int32_t t = pl->order[i];
        const int64_t a0 = pl->tile_start[t], a1 = pl->tile_start[t + 1];
        n_live_tiles += (pl->live_prefix ? pl->live_prefix[a1] - pl->live_prefix[a0] : a1 - a0) > 0;
    }
    for (int32_t g = 0; g < H; g++) /* a non-finite logit where the device read (dev_attend's contract) */
        if (visited[g] < 0)
            return -1 - (int64_t)visited[g] < pl->T
                       ? kvm_fail(KVMEM_ERR_INVALID_ARG,
                                  "%s: K at position %lld, KV head %d is not finite (or its logit overflows)", fn,
                                  (long long)(-1 - (int64_t)visited[g]), g)
                       : kvm_fail(KVMEM_ERR_BACKEND, "%s: backend %s reported %d tiles for KV head %d", fn, be_name,
                                  visited[g], g);
    for (int32_t g = 0; g < H; g++) {
        if (visited[g] > n_live_tiles)
            return kvm_fail(KVMEM_ERR_BACKEND, "%s: backend %s reported %d tiles for KV head %d of %lld", fn, be_name,
                            visited[g], g, (long long)n_live_tiles);
        if (positions) { /* the scored form: each stream's own order, its positions reported */
            if (positions[g] < 0 || positions[g] > pl->T)
                return kvm_fail(KVMEM_ERR_BACKEND, "%s: backend %s reported %d positions for KV head %d", fn, be_name,
                                positions[g], g);
            s->positions_read += positions[g];
        }
        int32_t seen = 0;
        for (int32_t i = 0; !positions && i < pl->n_order && seen < visited[g]; i++) {
            const int32_t t = pl->order[i];
            const int64_t a0 = pl->tile_start[t], a1 = pl->tile_start[t + 1];
            const int64_t n = pl->live_prefix ? pl->live_prefix[a1] - pl->live_prefix[a0] : a1 - a0;
            if (n == 0) continue;
            seen++;
            s->positions_read += n;
        }
        s->tiles_visited += visited[g];
        s->streams_stopped += visited[g] < n_live_tiles;
    }
    s->n_streams = H;
    s->tiles_total = (int64_t)H * n_live_tiles;
    s->stopped_early = s->streams_stopped > 0;
    if (pl->stream_visited) memcpy(pl->stream_visited, visited, (size_t)H * sizeof *visited);
    return KVMEM_OK;
}

/* Run dev_attend with a's buffers, slot count, tile and dtype set by the
 * caller and the rest from the plan, read the staged outputs back (pl->out
 * and the per-KV-head tile counts in visited: kvm_stage_end) and fill *s
 * from them. */
static kvmem_status dev_attend_run(kvmem_backend *be, const kvm_attend_plan *pl, kvm_dev_attend_args *a, kvm_stage *stg,
                                   int n_stg, const int32_t *visited, kvmem_attend_stats *s) {
    const int32_t *positions = a->scored ? visited + pl->n_kv_heads : NULL;
    a->n_pos = pl->T;
    a->n_q_heads = pl->n_q_heads;
    a->n_kv_heads = pl->n_kv_heads;
    a->head_dim = pl->head_dim;
    a->n_visit = pl->n_order;
    a->scale = pl->scale;
    a->tau_s = pl->tau_s;
    a->tau_d = pl->tau_d;
    a->patience = pl->patience;
    kvmem_status st = be->iface->dev_attend(be, a);
    if (st != KVMEM_OK) st = kvm_route_failed(be, "kvmem_attend", st);
    st = kvm_stage_end(be, "kvmem_attend", stg, n_stg, st);
    if (st == KVMEM_OK) st = stats_from_visited(be->iface->name, pl, visited, positions, s);
    return st;
}

/* Upload, run dev_attend, download into pl->out and fill *s from the
 * per-stream tile counts. KVMEM_ERR_UNSUPPORTED: the backend cannot run
 * this shape (the caller then runs the plan on the CPU). */
static kvmem_status attend_on_device(kvmem_backend *be, const kvm_attend_plan *pl, kvmem_attend_stats *s,
                                     const kvm_devt *dkv, int scored) {
    const char *fn = "kvmem_attend";
    const kvmem_tensor *k = pl->k, *v = pl->v;
    const kvmem_dtype dt = k->dtype == KVMEM_F16 && v->dtype == KVMEM_F16 ? KVMEM_F16 : KVMEM_F32;
    const int64_t n_slots = k->shape[0], T = pl->T;
    const int32_t H = pl->n_kv_heads, D = pl->head_dim, Hq = pl->n_q_heads;
    size_t kv_bytes;
    if (!kvm_mul_size((size_t)n_slots, (size_t)H, &kv_bytes) ||
        !kvm_mul_size(kv_bytes, (size_t)D * kvm_dtype_size(dt), &kv_bytes) || T > INT32_MAX)
        return KVMEM_ERR_UNSUPPORTED;
    const size_t q_bytes = (size_t)Hq * (size_t)D * 4;
    int32_t *slots = kvm_malloc(((size_t)T + 1) * sizeof *slots);
    int32_t *visited = kvm_malloc(2 * (size_t)H * sizeof *visited);
    void *pack = NULL;
    kvmem_status st = KVMEM_OK;
    if (!slots || !visited) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for the slots of %lld positions", fn, (long long)T);
        goto done;
    }
    /* K and V in this device's memory are read in place: the kernel reports
     * a non-finite logit itself (visited = -1 - position) and the output is
     * checked after, so nothing of them comes to the host */
    const int in_place = dkv && dkv[0].device && dkv[1].device;
    int32_t bad_head = 0;
    const int64_t bad = in_place ? -1 : first_nonfinite_k(pl, &bad_head);
    if (bad >= 0) {
        st = kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: K at position %lld, KV head %d is not finite", fn, (long long)bad, bad_head);
        goto done;
    }
    for (int64_t j = 0; j < T; j++) /* TENSORS: the identity map; dead slots as -1 */
        slots[j] = !pl->slots ? (int32_t)j : pl->slots[j] == pl->dead_slot ? -1 : pl->slots[j];
    /* K and V go up one after the other through one packing buffer (when
     * they are not contiguous in the kernel's dtype) */
    kvm_stage stg[7] = {{KVM_STAGE_IN, (void *)(uintptr_t)pl->q, q_bytes, NULL, NULL, {0, NULL}},
                        {KVM_STAGE_WORK, NULL, kv_bytes, in_place ? dkv[0].buf : NULL, NULL, {0, NULL}},
                        {KVM_STAGE_WORK, NULL, kv_bytes, in_place ? dkv[1].buf : NULL, NULL, {0, NULL}},
                        {KVM_STAGE_IN, slots, (size_t)T * 4, NULL, NULL, {0, NULL}},
                        {KVM_STAGE_IN, (void *)(uintptr_t)pl->order, (size_t)pl->n_order * 4, NULL, NULL, {0, NULL}},
                        {KVM_STAGE_OUT, pl->out, q_bytes, NULL, NULL, {0, NULL}},
                        {KVM_STAGE_OUT, visited, (size_t)H * 4 * (scored ? 2 : 1), NULL, NULL, {0, NULL}}};
    if (scored) { /* the device writes the per-stream orders: device memory only */
        stg[4].dir = KVM_STAGE_WORK;
        stg[4].host = NULL;
        stg[4].bytes = (size_t)H * (size_t)pl->n_order * 4;
    }
    if ((st = kvm_stage_begin(be, fn, stg, 7)) != KVMEM_OK) goto done;
    const kvmem_tensor *kv[2] = {k, v};
    for (int x = 0; x < 2 && st == KVMEM_OK && !in_place; x++) {
        const void *src = kv[x]->data;
        if (kv[x]->dtype != dt || !is_contiguous(kv[x])) {
            if (!pack && !(pack = kvm_malloc(KVM_MAX(kv_bytes, (size_t)1)))) {
                st = kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for packing %zu bytes of K/V", fn, kv_bytes);
                break;
            }
            pack_kv(kv[x], dt, pack);
            src = pack;
        }
        if ((st = kvm_be_upload(be, stg[1 + x].buf, 0, src, kv_bytes)) != KVMEM_OK) st = kvm_route_failed(be, fn, st);
    }
    if (st != KVMEM_OK) {
        kvm_stage_end(be, fn, stg, 7, st);
        goto done;
    }
    kvm_dev_attend_args a;
    memset(&a, 0, sizeof a);
    a.q = stg[0].buf;
    a.k = stg[1].buf;
    a.v = stg[2].buf;
    a.k_off = in_place ? dkv[0].off : 0;
    a.v_off = in_place ? dkv[1].off : 0;
    a.slot_map = stg[3].buf;
    a.order = stg[4].buf;
    a.out = stg[5].buf;
    a.visited = stg[6].buf;
    a.n_slots = n_slots;
    a.tile = (int32_t)(pl->n_tiles > 0 ? pl->tile_start[1] - pl->tile_start[0] : 1);
    a.dtype = dt;
    a.scored = scored;
    st = dev_attend_run(be, pl, &a, stg, 7, visited, s);
done:
    kvm_free(slots);
    kvm_free(visited);
    kvm_free(pack);
    return st;
}

/* An AGENT source on the device: the agent's raw K (rotated to its
 * positions on the fly) and V are resident, so a call uploads q (and the visiting order when it is
 * neither oldest-first nor RECENT's) and downloads the output and the tile
 * counts. */
static kvmem_status attend_agent_on_device(kvmem_backend *be, const kvm_attend_plan *pl, kvmem_attend_stats *s) {
    /* the mirror is a cache on the agent, which this call has taken */
    kvm_agent_mem *m = (kvm_agent_mem *)(uintptr_t)pl->mem;
    kvm_resident *r = NULL;
    kvmem_status st = kvm_resident_sync(pl->pool, m, be, &r);
    if (st == KVMEM_ERR_UNSUPPORTED) return st;
    if (st == KVMEM_OK) st = kvm_resident_attend_keys(pl->pool, m, r, pl->layer, pl->base_position);
    if (st != KVMEM_OK) return st;
    const int32_t H = pl->n_kv_heads, D = pl->head_dim, Hq = pl->n_q_heads;
    const size_t q_bytes = (size_t)Hq * (size_t)D * 4;
    /* the tile list: oldest first is the mirror's identity; RECENT (sinks
     * [0, s), then newest first) a slice of its recent buffer; any other
     * (a caller's list) goes up */
    int32_t s_in = 0;
    while (s_in < pl->n_order && pl->order[s_in] == s_in) s_in++;
    int recent = s_in < pl->n_order && pl->n_order == pl->n_tiles;
    for (int32_t i = s_in; i < pl->n_order && recent; i++) recent = pl->order[i] == pl->n_order - 1 - (i - s_in);
    const kvmem_buffer *order = s_in == pl->n_order ? r->ident : NULL;
    size_t order_off = 0;
    if (recent && (st = kvm_resident_recent_order(pl->pool, r, pl->n_order, s_in, &order, &order_off)) != KVMEM_OK) {
        if (st != KVMEM_ERR_UNSUPPORTED) return st;
        order = NULL;
    }
    int32_t visited[1024];
    if (H > 1024) return KVMEM_ERR_UNSUPPORTED;
    kvm_stage stg[4] = {{KVM_STAGE_IN, (void *)(uintptr_t)pl->q, q_bytes, NULL, NULL, {0, NULL}},
                        {KVM_STAGE_OUT, pl->out, q_bytes, NULL, NULL, {0, NULL}},
                        {KVM_STAGE_OUT, visited, (size_t)H * 4, NULL, NULL, {0, NULL}},
                        {KVM_STAGE_IN, (void *)(uintptr_t)pl->order, (size_t)pl->n_order * 4,
                         (kvmem_buffer *)(uintptr_t)order, NULL, {0, NULL}}};
    if ((st = kvm_stage_begin(be, "kvmem_attend", stg, 4)) != KVMEM_OK) return st;
    kvm_dev_attend_args a;
    memset(&a, 0, sizeof a);
    a.q = stg[0].buf;
    kvm_resident_attend_args(pl->pool, m, r, pl->layer, &a); /* K, V, the tail, keys rotated on the fly */
    a.order = stg[3].buf;
    a.order_off = order ? order_off : 0;
    a.out = stg[1].buf;
    a.visited = stg[2].buf;
    a.tile = pl->pool->params.block_size;
    return dev_attend_run(be, pl, &a, stg, 4, visited, s);
}

/* The backend the router picks for a plan the buffer-level form covers
 * (caller: the plan's source K and V when caller, else the agent's f32
 * mirror); scored: dev_attend's scored form. */
static kvmem_backend *route_attend(kvmem_context *ctx, const kvm_attend_plan *pl, int caller, int scored) {
    kvm_dev_attend_args shape;
    memset(&shape, 0, sizeof shape);
    shape.n_pos = pl->T;
    shape.n_q_heads = pl->n_q_heads;
    shape.n_kv_heads = pl->n_kv_heads;
    shape.head_dim = pl->head_dim;
    shape.n_visit = scored ? pl->n_tiles : pl->n_order;
    shape.dtype = caller && pl->k->dtype == KVMEM_F16 && pl->v->dtype == KVMEM_F16 ? KVMEM_F16 : KVMEM_F32;
    shape.scale = pl->scale;
    shape.tau_s = pl->tau_s;
    shape.tau_d = pl->tau_d;
    shape.patience = pl->patience;
    shape.scored = scored;
    return kvm_route(ctx, KVM_OP_ATTEND, &shape);
}

/* dkv (NULL, or K and V of a TENSORS / SLOTMAP source): device tensors the
 * device path may read in place; their host copies are filled here before
 * any host code reads K or V (the SCORED scan, the CPU path). */
static kvmem_status attend_call(kvmem_context *ctx, const kvmem_tensor *q, const kvmem_attend_source *source,
                          const kvmem_attend_params *params, const kvmem_tensor *out, kvmem_attend_stats *stats,
                          kvm_devt *dkv) {
    const char *fn = "kvmem_attend";
    kvmem_status st;
    if (!ctx) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    if (!q || !source || !out)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s is NULL", fn, !q ? "q" : !source ? "source" : "out");
    kvmem_attend_params a = kvmem_attend_default_params();
    if ((st = KVM_PARAMS_IN(kvmem_attend_params, &a, params, fn)) != KVMEM_OK) return st;
    if ((st = kvm_params_reserved(a.reserved, "kvmem_attend_params", fn)) != KVMEM_OK) return st;
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
    pl.causal = a.causal;
    pl.kind = source->kind;

    attend_bufs b;
    memset(&b, 0, sizeof b);
    b.sc = kvm_ctx_scratch(ctx);
    const size_t D = (size_t)pl.head_dim, n_out = (size_t)R * (size_t)Hq * D;
    b.q = kvm_malloc(n_out * sizeof(float));
    b.out = kvm_malloc(n_out * sizeof(float));
    if (!b.q || !b.out) {
        bufs_free(&b);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for %zu query and output values", fn, n_out);
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
    /* SCORED on caller K reads every K row for its order (on the device
     * when the router picks one that takes the plan) and keeps the
     * logits, so the attention then reads V alone: never more than full
     * attention reads. Where the logits would take more than
     * KVM_ATTEND_MAX_LOGITS floats they are computed again (K read twice
     * where visited), which pays only if the rule can stop before half the
     * tiles: it reads at least patience + 1. With the rule off there is
     * nothing to order: every tile, as the plan stands. */
    int64_t scan_rows = 0; /* K rows the SCORED scan read */
    const int keep_logits = !agent && (double)R * (double)Hq * (double)pl.T <= KVM_ATTEND_MAX_LOGITS;
    if (a.order == KVMEM_ATTEND_SCORED &&
        (!pl.stop_enabled ||
         (!agent && !keep_logits && kvm_attend_tiles_seen(&pl) <= 2 * ((int64_t)a.patience + 1))))
        pl.stop_enabled = 0;
    kvmem_attend_stats s;
    kvmem_backend *cpu = ctx->cpu, *be = cpu;
    const kvm_devt *in_place = dkv && !dkv[0].filled && !dkv[1].filled ? dkv : NULL;
    int ran = 0; /* a device ran the plan with its own SCORED order */
    if (a.order == KVMEM_ATTEND_SCORED && pl.stop_enabled && !agent && pl.n_tiles > 0 && device_eligible(&pl) &&
        (be = route_attend(ctx, &pl, 1, 1)) != cpu) {
        /* the device scans K where it lies (one read of every live row, as
         * the CPU's scan) and sorts each stream's tiles: nothing of the
         * history crosses, K and V only where they are host tensors */
        st = attend_on_device(be, &pl, &s, in_place, 1);
        ran = !kvm_route_to_cpu(st);
        if (ran) scan_rows = (pl.live_prefix ? pl.live_prefix[pl.T] : pl.T) * (int64_t)pl.n_kv_heads;
        be = cpu;
    }
    if (!ran && a.order == KVMEM_ATTEND_SCORED && pl.stop_enabled) { /* the scan on the CPU */
        if (dkv && ((st = kvm_devt_read(&dkv[0], fn)) != KVMEM_OK || (st = kvm_devt_read(&dkv[1], fn)) != KVMEM_OK)) {
            bufs_free(&b);
            return st;
        }
        b.head_order = kvm_scratch_take(b.sc, ((size_t)pl.n_kv_heads * (size_t)pl.n_tiles + 1) * sizeof(int32_t));
        if (keep_logits) b.logits = kvm_scratch_take(b.sc, ((size_t)R * (size_t)Hq * (size_t)pl.T + 1) * sizeof(float));
        if (!b.head_order || (keep_logits && !b.logits)) {
            bufs_free(&b);
            return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for the SCORED order of %d tiles%s", fn,
                            pl.n_tiles, keep_logits ? " and the kept logits" : "");
        }
        if ((st = kvm_attend_scored_order(ctx, &pl, b.head_order, NULL, b.logits, &scan_rows)) != KVMEM_OK) {
            bufs_free(&b);
            return st;
        }
        pl.head_order = b.head_order;
        pl.logits = b.logits;
    }
    /* With the rule off (and no oracle to compare) the order is seen only in
     * float rounding: RECENT and SCORED then visit every tile oldest first,
     * in ascending addresses, which this machine's memory streams at three
     * times the speed of descending ones (BENCHMARKS.md, "attend"). */
    if (!pl.stop_enabled && !pl.compare && (a.order == KVMEM_ATTEND_RECENT || a.order == KVMEM_ATTEND_SCORED))
        for (int32_t t = 0; t < pl.n_order; t++) b.order[t] = t;
    /* a device backend with the buffer-level kernel runs the plans it
     * covers; the rest (and shapes it refuses as unsupported) run here */
    const int dev_plan = !ran && device_eligible(&pl), dev_agent = !ran && !dev_plan && agent_device_eligible(&pl);
    if (dev_plan || dev_agent) be = route_attend(ctx, &pl, dev_plan, 0); /* the router's choice */
    if (!ran)
        st = be == cpu ? KVMEM_OK : dev_plan ? attend_on_device(be, &pl, &s, in_place, 0) : attend_agent_on_device(be, &pl, &s);
    if (!ran && (be == cpu || kvm_route_to_cpu(st))) {
        st = KVMEM_OK;
        if (dkv && ((st = kvm_devt_read(&dkv[0], fn)) != KVMEM_OK || (st = kvm_devt_read(&dkv[1], fn)) != KVMEM_OK)) {
            bufs_free(&b);
            return st;
        }
        st = kvm_attend_cpu(cpu, &pl, &s);
    }
    if (agent) st = kvm_mapped_check(pl.mem, st, fn); /* before out is written */
    if (st != KVMEM_OK) {
        bufs_free(&b);
        return st;
    }
    /* K was checked where it was read; a non-finite V (or an overflowing
     * sum) at a position read shows in the output, which is cheap to scan */
    for (size_t i = 0; i < n_out; i++)
        if (!isfinite(b.out[i])) {
            const size_t r = i / ((size_t)Hq * D), h = i / D % (size_t)Hq;
            bufs_free(&b);
            return kvm_fail(KVMEM_ERR_INVALID_ARG,
                            "%s: V holds a non-finite value at a position read: output row %zu, query head %zu is not finite",
                            fn, r, h);
        }
    for (int64_t r = 0; r < R; r++)
        for (int64_t h = 0; h < Hq; h++) {
            int64_t idx[2] = {r, h};
            kvm_tensor_write_f32(out, kvm_tensor_row_offset(out, idx), b.out + ((size_t)r * (size_t)Hq + (size_t)h) * D, D);
        }
    s.positions_read += (scan_rows + 1) / 2; /* a K row alone is half a (K, V) row */
    if (stats) *stats = s;
    bufs_free(&b);
    return KVMEM_OK;
}

/* Whether K and V (resolved) can be read in place by dev_attend: both in
 * device memory, one kernel dtype (F32 or F16), dense [n][n_kv_heads][head_dim]. */
static int kv_in_place(const kvm_devt *dk, const kvm_devt *dv) {
    if (!dk->device || !dv->device || dk->host.dtype != dv->host.dtype || dk->host.ndim != 3 || dv->host.ndim != 3)
        return 0;
    const kvmem_dtype dt = dk->host.dtype;
    int64_t sk, sv;
    if ((dt != KVMEM_F32 && dt != KVMEM_F16) || !kvm_devt_rows_dense(dk, dt, &sk) || !kvm_devt_rows_dense(dv, dt, &sv))
        return 0;
    const int64_t row = dk->host.shape[1] * dk->host.shape[2];
    return sk == row && sv == row && dv->host.shape[1] * dv->host.shape[2] == row;
}

/* q, out or a TENSORS / SLOTMAP source's K and V in device memory (kvmem.h,
 * "Device tensors"): q comes down, out goes up after success, K and V are
 * read in place where the device path runs and come down where host code
 * reads them. */
static kvmem_status attend_device_tensors(kvmem_context *ctx, const kvmem_tensor *q, const kvmem_attend_source *source,
                                          const kvmem_attend_params *params, const kvmem_tensor *out,
                                          kvmem_attend_stats *stats) {
    static const char *fn = "kvmem_attend";
    kvm_devt d[4]; /* q, out, k, v */
    memset(d, 0, sizeof d);
    const int kv_kind = source->kind != KVMEM_ATTEND_SRC_AGENT;
    kvmem_status st;
    if ((st = kvm_devt_open(ctx, q, fn, "q", &d[0])) == KVMEM_OK && (st = kvm_devt_open(ctx, out, fn, "out", &d[1])) == KVMEM_OK &&
        (!kv_kind || ((st = kvm_devt_open(ctx, source->k, fn, "source k", &d[2])) == KVMEM_OK &&
                      (st = kvm_devt_open(ctx, source->v, fn, "source v", &d[3])) == KVMEM_OK)) &&
        (st = kvm_devt_read(&d[0], fn)) == KVMEM_OK) {
        kvmem_attend_source src = *source;
        kvm_devt *dkv = NULL;
        if (kv_kind) {
            src.k = kvm_devt_view(&d[2]);
            src.v = kvm_devt_view(&d[3]);
            if (kv_in_place(&d[2], &d[3])) dkv = &d[2];
            else if ((st = kvm_devt_read(&d[2], fn)) == KVMEM_OK) st = kvm_devt_read(&d[3], fn);
        }
        if (st == KVMEM_OK) st = attend_call(ctx, kvm_devt_view(&d[0]), &src, params, kvm_devt_view(&d[1]), stats, dkv);
        if (st == KVMEM_OK) st = kvm_devt_write(&d[1], fn);
    }
    kvm_devt_close_all(d, 4);
    return st;
}

kvmem_status kvmem_attend(kvmem_context *ctx, const kvmem_tensor *q, const kvmem_attend_source *source,
                          const kvmem_attend_params *params, const kvmem_tensor *out, kvmem_attend_stats *stats) {
    /* an AGENT source is taken for the call, like every call on an agent */
    kvmem_agent *a = source && source->kind == KVMEM_ATTEND_SRC_AGENT ? source->agent : NULL;
    int own = ctx ? kvm_err_begin(&ctx->err) : 0; /* failures are the context's last error too */
    kvmem_status st = a ? kvm_agent_enter(a, "kvmem_attend") : KVMEM_OK;
    const int taken = a && st == KVMEM_OK;
    const int kv_kind = source && source->kind != KVMEM_ATTEND_SRC_AGENT;
    if (st == KVMEM_OK) {
        if (ctx && source && (kvm_devt_is_device(q) || kvm_devt_is_device(out) ||
                              (kv_kind && (kvm_devt_is_device(source->k) || kvm_devt_is_device(source->v)))))
            st = attend_device_tensors(ctx, q, source, params, out, stats);
        else
            st = attend_call(ctx, q, source, params, out, stats, NULL);
    }
    if (taken) kvm_agent_leave(a);
    kvm_err_end(own);
    return st;
}
