/* Glue for ART attention. */
#include "glue.h"

#include <string.h>

/* out: order, n_sink, tile_size, scale, tau_s, tau_d, patience, probe, causal, compare. */
kvmem_status kvmw_attend_defaults(double *out) {
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "out is NULL");
    kvmem_attend_params p = kvmem_attend_default_params();
    out[0] = p.order;
    out[1] = p.n_sink;
    out[2] = p.tile_size;
    out[3] = p.scale;
    out[4] = p.tau_s;
    out[5] = p.tau_d;
    out[6] = p.patience;
    out[7] = p.probe;
    out[8] = p.causal;
    out[9] = p.compare;
    return KVMEM_OK;
}

static kvmem_attend_params params_of(int32_t order, int32_t n_sink, const int32_t *tile_order, int32_t n_tile_order,
                                     int32_t tile_size, float scale, float tau_s, float tau_d, int32_t patience,
                                     int32_t probe, int32_t causal, int32_t compare) {
    kvmem_attend_params p = kvmem_attend_default_params();
    p.order = (kvmem_attend_order)order;
    p.n_sink = n_sink;
    p.tile_order = n_tile_order ? tile_order : NULL;
    p.n_tile_order = n_tile_order;
    p.tile_size = tile_size;
    p.scale = scale;
    p.tau_s = tau_s;
    p.tau_d = tau_d;
    p.patience = patience;
    p.probe = (kvmem_attend_probe)probe;
    p.causal = causal;
    p.compare = compare;
    return p;
}

/* stats out: the 8 counters of kvmem_attend_stats as doubles. */
static void stats_out(const kvmem_attend_stats *s, double *out) {
    if (!out) return;
    out[0] = (double)s->n_streams;
    out[1] = (double)s->tiles_total;
    out[2] = (double)s->tiles_visited;
    out[3] = (double)s->streams_stopped;
    out[4] = (double)s->oracle_tiles;
    out[5] = (double)s->oracle_agree;
    out[6] = (double)s->positions_read;
    out[7] = s->stopped_early;
}

/* q, out: [n_rows][n_q_heads][head_dim] f32 of one layer, post-RoPE. */
kvmem_status kvmw_attend_agent(kvmem_context *ctx, kvmem_pool *pool, kvmem_agent *agent, int32_t layer, const float *q,
                               int32_t n_rows, const int32_t *positions, double base_position, int32_t order,
                               int32_t n_sink, const int32_t *tile_order, int32_t n_tile_order, int32_t tile_size,
                               float scale, float tau_s, float tau_d, int32_t patience, int32_t probe,
                               int32_t causal, int32_t compare, float *out, double *stats) {
    kvmem_model_spec spec;
    int64_t base;
    kvmem_status st = kvmw_spec(pool, &spec);
    if (st != KVMEM_OK || (st = kvmw_int64_of(base_position, "base_position", &base)) != KVMEM_OK) return st;
    int64_t shape[3] = {n_rows, spec.n_q_heads, spec.head_dim};
    kvmem_tensor qt, ot;
    if ((st = kvmem_tensor_init(&qt, (void *)(uintptr_t)q, KVMEM_F32, 3, shape)) != KVMEM_OK) return st;
    if ((st = kvmem_tensor_init(&ot, out, KVMEM_F32, 3, shape)) != KVMEM_OK) return st;
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_AGENT;
    src.layer = layer;
    src.agent = agent;
    src.positions = positions;
    src.base_position = base;
    kvmem_attend_params p = params_of(order, n_sink, tile_order, n_tile_order, tile_size, scale, tau_s, tau_d, patience,
                                      probe, causal, compare);
    kvmem_attend_stats s;
    if ((st = kvmem_attend(ctx, &qt, &src, &p, &ot, &s)) != KVMEM_OK) return st;
    stats_out(&s, stats);
    return KVMEM_OK;
}

/* k, v: [T][n_kv_heads][head_dim] f32, post-RoPE; mask: T bytes or NULL. */
kvmem_status kvmw_attend_tensors(kvmem_context *ctx, const float *q, int32_t n_rows, int32_t n_q_heads,
                                 int32_t head_dim, const float *k, const float *v, int32_t T, int32_t n_kv_heads,
                                 const uint8_t *mask, int32_t order, int32_t n_sink, const int32_t *tile_order,
                                 int32_t n_tile_order, int32_t tile_size, float scale, float tau_s, float tau_d,
                                 int32_t patience, int32_t probe, int32_t causal, int32_t compare, float *out,
                                 double *stats) {
    int64_t qs[3] = {n_rows, n_q_heads, head_dim}, ks[3] = {T, n_kv_heads, head_dim};
    kvmem_tensor qt, ot, kt, vt;
    kvmem_status st;
    if ((st = kvmem_tensor_init(&qt, (void *)(uintptr_t)q, KVMEM_F32, 3, qs)) != KVMEM_OK) return st;
    if ((st = kvmem_tensor_init(&ot, out, KVMEM_F32, 3, qs)) != KVMEM_OK) return st;
    if ((st = kvmem_tensor_init(&kt, (void *)(uintptr_t)k, KVMEM_F32, 3, ks)) != KVMEM_OK) return st;
    if ((st = kvmem_tensor_init(&vt, (void *)(uintptr_t)v, KVMEM_F32, 3, ks)) != KVMEM_OK) return st;
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &kt;
    src.v = &vt;
    src.mask = mask;
    kvmem_attend_params p = params_of(order, n_sink, tile_order, n_tile_order, tile_size, scale, tau_s, tau_d, patience,
                                      probe, causal, compare);
    kvmem_attend_stats s;
    if ((st = kvmem_attend(ctx, &qt, &src, &p, &ot, &s)) != KVMEM_OK) return st;
    stats_out(&s, stats);
    return KVMEM_OK;
}
