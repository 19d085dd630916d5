/* The CPU backend's dev_attend: the buffer-level form of ART attention
 * (core/backend/backend.h) as a one-row SLOTMAP plan run by kvm_attend_cpu, so the
 * device kernels are compared with exactly the rule kvmem_attend() runs. */
#include "../backend/attend_dev.h"
#include "attend.h"
#include "../cpu/cpu_backend.h"

#include <stdlib.h>
#include <string.h>

kvmem_status kvm_attend_dev_cpu(kvmem_backend *be, const kvm_dev_attend_args *a) {
    const char *fn = "dev_attend";
    if (!a) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: args is NULL", fn);
    const kvmem_buffer *bufs[KVM_DA_N] = {a->q, a->k, a->v, a->slot_map, a->order, a->out, a->visited};
    unsigned char *host[KVM_DA_N];
    size_t size[KVM_DA_N];
    for (int i = 0; i < KVM_DA_N; i++) {
        size[i] = 0;
        host[i] = bufs[i] ? kvm_cpu_buffer_span(bufs[i], &size[i]) : NULL;
    }
    char msg[256];
    if (!kvm_dev_attend_check(a, size, msg, sizeof msg)) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s", fn, msg);

    const int64_t T = a->n_pos, ts = a->tile, n_tiles = (T + ts - 1) / ts;
    int32_t *slots = kvm_malloc(((size_t)T + 1) * sizeof *slots);
    int32_t *order = kvm_malloc(((size_t)a->n_visit + 1) * sizeof *order);
    int64_t *tile_start = kvm_malloc(((size_t)n_tiles + 1) * sizeof *tile_start);
    int64_t *live = kvm_malloc(((size_t)T + 1) * sizeof *live);
    int32_t *seen = kvm_calloc((size_t)n_tiles + 1, sizeof *seen);
    kvmem_status st = KVMEM_OK;
    if (!slots || !order || !tile_start || !live || !seen) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for %lld positions", fn, (long long)T);
        goto done;
    }
    /* every negative slot is dead: one dead id (-1) for the plan */
    const int32_t *sm = (const int32_t *)(const void *)(host[KVM_DA_SLOTS] + a->slot_map_off);
    live[0] = 0;
    for (int64_t j = 0; j < T; j++) {
        int32_t s = sm[j] < 0 ? -1 : sm[j];
        if (s >= a->n_slots) {
            st = kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: slot_map[%lld] = %d outside [0, %lld) and not dead (< 0)", fn,
                          (long long)j, s, (long long)a->n_slots);
            goto done;
        }
        slots[j] = s;
        live[j + 1] = live[j] + (s >= 0);
    }
    const int32_t *om = (const int32_t *)(const void *)(host[KVM_DA_ORDER] + a->order_off);
    for (int32_t i = 0; i < a->n_visit; i++) {
        if (om[i] < 0 || om[i] >= n_tiles || seen[om[i]]) {
            st = kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: order[%d] = %d is outside [0, %lld) or repeated", fn, i, om[i],
                          (long long)n_tiles);
            goto done;
        }
        seen[om[i]] = 1;
        order[i] = om[i];
    }
    for (int64_t t = 0; t < n_tiles; t++) tile_start[t] = t * ts;
    tile_start[n_tiles] = T;

    kvmem_tensor k, v;
    const int64_t shape[3] = {a->n_slots, a->n_kv_heads, a->head_dim};
    if ((st = kvmem_tensor_init(&k, host[KVM_DA_K] + a->k_off, a->dtype, 3, shape)) != KVMEM_OK) goto done;
    if ((st = kvmem_tensor_init(&v, host[KVM_DA_V] + a->v_off, a->dtype, 3, shape)) != KVMEM_OK) goto done;
    int64_t row_lo = 0, row_hi = T;
    kvm_attend_plan pl;
    memset(&pl, 0, sizeof pl);
    pl.n_rows = 1;
    pl.n_q_heads = a->n_q_heads;
    pl.n_kv_heads = a->n_kv_heads;
    pl.head_dim = a->head_dim;
    pl.group = a->n_q_heads / a->n_kv_heads;
    pl.scale = a->scale;
    pl.q = (const float *)(const void *)(host[KVM_DA_Q] + a->q_off);
    pl.out = (float *)(void *)(host[KVM_DA_OUT] + a->out_off);
    pl.kind = KVMEM_ATTEND_SRC_SLOTMAP;
    pl.T = T;
    pl.k = &k;
    pl.v = &v;
    pl.slots = slots;
    pl.dead_slot = -1;
    pl.n_tiles = (int32_t)n_tiles;
    pl.tile_start = tile_start;
    pl.order = order;
    pl.n_order = a->n_visit;
    pl.live_prefix = live;
    pl.row_lo = &row_lo;
    pl.row_hi = &row_hi;
    pl.stop_enabled = a->tau_s > 0 || a->tau_d > 0;
    pl.tau_s = a->tau_s;
    pl.tau_d = a->tau_d;
    pl.patience = a->patience;
    pl.probe = KVMEM_ATTEND_PROBE_STRIDED;
    pl.stream_visited = (int32_t *)(void *)(host[KVM_DA_VISITED] + a->visited_off);
    kvmem_attend_stats stats;
    st = kvm_attend_cpu(be, &pl, &stats);
done:
    kvm_free(slots);
    kvm_free(order);
    kvm_free(tile_start);
    kvm_free(live);
    kvm_free(seen);
    return st;
}
