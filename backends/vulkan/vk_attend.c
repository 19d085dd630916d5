/* dev_attend on Vulkan (shaders/attend.comp): one workgroup per KV head, the
 * probe reduced with subgroup operations where the device has them.
 * Arguments are checked exactly like the CPU reference (core/backend/attend_dev.h);
 * what only device memory holds (slot ids >= n_slots, tile ids outside
 * [0, n_tiles)) is skipped by the shader, never read.
 *
 * A visit is a series of dispatches of at most max_steps chunks each, so
 * that no invocation runs more than the loop budget (vk_internal.h) in one
 * dispatch: the streams' state goes from one dispatch to the next through a
 * buffer. Dispatches are submitted ATTEND_PER_SUBMIT at a time, and the
 * series ends early once every stream has stopped. The scored form first
 * finds each stream's order on the device (shaders/tile_order.comp). */
#include "vk_internal.h"
#include "attend_dev.h"

#include <stdlib.h>
#include <string.h>

/* The shader keeps G * head_dim accumulator elements in ACC_PER registers
 * per invocation of a 128-wide workgroup. */
#define ACC_PER 32u
#define KVM_VK_ATTEND_MAX_N (ACC_PER * KVM_VK_WG)
#define KVM_VK_ATTEND_MAX_G 128
#define ATTEND_STATE_HEAD 8u /* words before m in a stream's state record (attend.comp's S_M) */
#define ATTEND_PROBE 32u
#define ATTEND_PER_SUBMIT 64u

/* Loop iterations one invocation of attend.comp runs in one step (one chunk
 * of a tile, then the probe and the rule when the chunk ends the tile):
 * every loop at its largest trip count plus one for the exit test, a loop
 * whose lanes are all masked off as one iteration. The shader's loops, in
 * order; wg_sum: the iterations of one workgroup sum. */
static uint64_t step_iters(uint64_t G, uint64_t D, uint64_t wg_sum) {
    const uint64_t C = KVM_VK_WG / G, used = (G * D + KVM_VK_WG - 1) / KVM_VK_WG; /* accumulator slots in use */
    return 1                                /* the step loop */
           + 8                              /* pow2_ceil of a chunk of at most 128 */
           + (D + 1)                        /* the dot product */
           + 2 * 8                          /* the max and sum trees, 7 levels each */
           + (ACC_PER + 1) + used * (C + 1) /* the accumulator: the chunk's positions per slot in use */
           + (ACC_PER + 1)                  /* the probe's gather */
           + 2 * wg_sum;                    /* two workgroup sums */
}
/* Per dispatch, outside the steps: the state loaded and saved, the output. */
#define ATTEND_FIXED_ITERS (3u * (ACC_PER + 1u))

/* The scored form's orders (shaders/tile_order.comp) into a->order, as
 * one submission (v->mu held): the scan in spans of a tile sized to the
 * loop budget, then the per-stream ranks of every tile, n_cmp tiles
 * compared per dispatch. *seconds: its device time (negative: unknown). */
#define ORDER_PUSH 21u
static kvmem_status scored_order(kvm_vk *v, const kvm_dev_attend_args *a, int64_t n_tiles, double *seconds) {
    const uint64_t G = (uint64_t)(a->n_q_heads / a->n_kv_heads), D = (uint64_t)a->head_dim, H = (uint64_t)a->n_kv_heads;
    const uint32_t budget = kvm_vk_loop_budget();
    /* phase 0: ceil(span * G / 128) pairs of D + 1 iterations each, and a
     * 7-level tree */
    uint64_t pairs = budget > 32 ? (budget - 32) / (D + 2) : 1;
    if (pairs < 1) pairs = 1;
    uint64_t span = pairs * KVM_VK_WG / G;
    if (span < 1) span = 1;
    if (span > (uint64_t)a->tile) span = (uint64_t)a->tile;
    const uint64_t n_sub = ((uint64_t)a->tile + span - 1) / span, items = H * (uint64_t)n_tiles;
    const uint64_t n_cmp = budget > 16 ? budget - 16 : 1; /* phase 2: tiles compared per dispatch */
    const uint64_t words = items * (n_sub + 2);
    const uint64_t max_gx = v->props.limits.maxComputeWorkGroupCount[0];
    if (words > UINT32_MAX || words * 4 > v->props.limits.maxStorageBufferRange || n_sub + 1 > budget ||
        H > v->props.limits.maxComputeWorkGroupCount[1])
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED,
                           "dev_attend: the scored order of %lld tiles x %d KV heads exceeds this device's limits",
                           (long long)n_tiles, a->n_kv_heads);
    const size_t es = a->dtype == KVMEM_F32 ? 4 : 2;
    uint32_t push[ORDER_PUSH];
    memset(push, 0, sizeof push);
    push[0] = (uint32_t)a->n_slots;
    push[1] = (uint32_t)a->n_pos;
    push[2] = (uint32_t)H;
    push[3] = (uint32_t)G;
    push[4] = (uint32_t)D;
    push[5] = (uint32_t)a->tile;
    push[6] = (uint32_t)n_tiles;
    push[7] = a->dtype == KVMEM_F16;
    memcpy(&push[8], &a->scale, 4);
    push[9] = (uint32_t)(a->q_off / 4);
    push[10] = (uint32_t)(a->k_off / es);
    push[11] = (uint32_t)(a->slot_map_off / 4);
    push[12] = (uint32_t)(a->order_off / 4);
    push[14] = (uint32_t)n_sub;
    push[15] = (uint32_t)span;
    push[19] = (uint32_t)(items * n_sub);       /* score_off */
    push[20] = (uint32_t)(items * (n_sub + 1)); /* rank_off */
    kvmem_buffer *work = NULL;
    kvmem_status st = kvm_vk_buffer_create(v, (size_t)words * 4, 1, &work);
    if (st != KVMEM_OK) return st;
    const kvmem_buffer *bind[5] = {a->q, a->k, a->slot_map, work, a->order};
    VkResult r = kvm_vk_begin(v);
    int recording = r == VK_SUCCESS;
    if (r == VK_SUCCESS) r = kvm_vk_bind(v, KVM_VK_TILE_ORDER, bind, 5, sizeof push);
    /* phase 0: workgroups (tile, span) in x, KV heads in y */
    const uint64_t n_wg = (uint64_t)n_tiles * n_sub;
    for (uint64_t x0 = 0; r == VK_SUCCESS && x0 < n_wg; x0 += max_gx) {
        const uint64_t n = n_wg - x0 < max_gx ? n_wg - x0 : max_gx;
        push[13] = 0;
        push[16] = (uint32_t)x0;
        r = kvm_vk_dispatch(v, KVM_VK_TILE_ORDER, push, sizeof push, (uint32_t)n, (uint32_t)H, 1);
    }
    /* phases 1 to 3: one invocation per (KV head, tile) */
    const uint64_t per = max_gx * KVM_VK_WG;
    for (uint32_t phase = 1; phase <= 3; phase++)
        for (uint64_t u0 = 0; u0 < (phase == 2 ? (uint64_t)n_tiles : 1); u0 += n_cmp)
            for (uint64_t x0 = 0; r == VK_SUCCESS && x0 < items; x0 += per) {
                const uint64_t n = items - x0 < per ? items - x0 : per;
                push[13] = phase;
                push[16] = (uint32_t)x0;
                push[17] = (uint32_t)u0;
                push[18] = (uint32_t)(u0 + n_cmp < (uint64_t)n_tiles ? u0 + n_cmp : (uint64_t)n_tiles);
                r = kvm_vk_dispatch(v, KVM_VK_TILE_ORDER, push, sizeof push,
                                    (uint32_t)((n + KVM_VK_WG - 1) / KVM_VK_WG), 1, 1);
            }
    if (r != VK_SUCCESS && recording) v->vk.vkEndCommandBuffer(v->cmd);
    else if (r == VK_SUCCESS) r = kvm_vk_submit_wait(v, 1);
    *seconds = r == VK_SUCCESS ? v->last_op_seconds : -1;
    kvm_vk_buffer_destroy(v, work);
    return r == VK_SUCCESS ? KVMEM_OK
                           : kvm_vk_fail(v, KVMEM_ERR_BACKEND, "vulkan dev_attend's scored order failed (%s)",
                                         kvm_vk_result_str(r));
}

kvmem_status kvm_vk_dev_attend(kvmem_backend *be, const kvm_dev_attend_args *a) {
    kvm_vk *v = be->impl;
    if (!a) return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "dev_attend: args is NULL");
    const kvmem_buffer *bufs[KVM_DA_N] = {a->q, a->k, a->v, a->slot_map, a->order, a->out, a->visited};
    size_t size[KVM_DA_N];
    for (int i = 0; i < KVM_DA_N; i++) size[i] = bufs[i] ? bufs[i]->size : 0;
    char msg[256];
    if (!kvm_dev_attend_check(a, size, msg, sizeof msg) ||
        !kvm_dev_attend_check_mirror(a, a->k_tail ? a->k_tail->size : 0, a->v_tail ? a->v_tail->size : 0,
                                     a->rope_cs ? a->rope_cs->size : 0, msg, sizeof msg))
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "dev_attend: %s", msg);
    const kvmem_buffer *extra[3] = {a->k_tail, a->v_tail, a->rotary_dim ? a->rope_cs : NULL};
    for (int i = 0; i < 3; i++)
        if (extra[i] && (extra[i]->size / 4 > UINT32_MAX || extra[i]->cap > v->props.limits.maxStorageBufferRange))
            return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "dev_attend: the tail or RoPE buffer exceeds the shaders' "
                               "32-bit indices or this device's storage buffer range");
    const int64_t G = a->n_q_heads / a->n_kv_heads, N = G * a->head_dim;
    if (G > KVM_VK_ATTEND_MAX_G || N > KVM_VK_ATTEND_MAX_N)
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED,
                           "dev_attend: vulkan runs up to %d query heads per KV head and G * head_dim <= %u "
                           "(head_dim <= 256 with G <= 16); got G %lld, head_dim %d",
                           KVM_VK_ATTEND_MAX_G, KVM_VK_ATTEND_MAX_N, (long long)G, a->head_dim);
    const size_t es = a->dtype == KVMEM_F32 ? 4 : 2;
    /* every element index the shader forms fits 32 bits (ranges are checked) */
    for (int i = 0; i < KVM_DA_N; i++)
        if (bufs[i] && bufs[i]->size / (i == KVM_DA_K || i == KVM_DA_V ? es : 4) > UINT32_MAX)
            return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "dev_attend: buffers exceed the shaders' 32-bit indices");
    if ((uint64_t)a->n_kv_heads > v->props.limits.maxComputeWorkGroupCount[0])
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "dev_attend: %d KV heads exceed this device's dispatch limit",
                           a->n_kv_heads);
    /* the state: [n_kv] done flags, then per stream a record of
     * ATTEND_STATE_HEAD words, m [G], l [G], the previous probe, acc [N] */
    const uint64_t H = (uint64_t)a->n_kv_heads;
    const uint64_t state_bytes = H * (1 + ATTEND_STATE_HEAD + 2 * (uint64_t)G + ATTEND_PROBE + (uint64_t)N) * 4;
    if (state_bytes > v->props.limits.maxStorageBufferRange)
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "dev_attend: %d KV heads x %lld outputs exceed this device's "
                           "storage buffer range (%u bytes)", a->n_kv_heads, (long long)N,
                           v->props.limits.maxStorageBufferRange);
    for (int i = 0; i < KVM_DA_N; i++)
        if (bufs[i] && bufs[i]->cap > v->props.limits.maxStorageBufferRange)
            return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED,
                               "vulkan dev_attend: a buffer of %llu bytes exceeds this device's storage buffer range (%u)",
                               (unsigned long long)bufs[i]->cap, v->props.limits.maxStorageBufferRange);

    /* steps: every entry of the order is at most ceil(min(tile, n_pos) / C)
     * chunks (an id the shader skips is one step) */
    const int64_t n_tiles = (a->n_pos + a->tile - 1) / a->tile;
    const uint64_t C = KVM_VK_WG / (uint64_t)G;
    const uint64_t tile_len = (uint64_t)(a->tile < a->n_pos ? a->tile : a->n_pos);
    const uint64_t steps = (uint64_t)a->n_visit * ((tile_len + C - 1) / C);
    const kvm_vk_kernel kern = v->subgroup_ops ? KVM_VK_ATTEND_SG : KVM_VK_ATTEND;
    const uint64_t wg_sum = v->subgroup_ops ? KVM_VK_WG / v->subgroup_size + 1 : 8;
    const uint64_t per_step = step_iters((uint64_t)G, (uint64_t)a->head_dim, wg_sum);
    const uint32_t budget = kvm_vk_loop_budget();
    uint64_t max_steps = budget > ATTEND_FIXED_ITERS ? (budget - ATTEND_FIXED_ITERS) / per_step : 0;
    if (max_steps < 1) max_steps = 1;
    if (max_steps > steps) max_steps = steps > 0 ? steps : 1;
    const uint64_t n_dispatch = steps > 0 ? (steps + max_steps - 1) / max_steps : 1;

    uint32_t push[31];
    push[0] = (uint32_t)a->n_slots;
    push[1] = (uint32_t)a->n_pos;
    push[2] = (uint32_t)a->n_kv_heads;
    push[3] = (uint32_t)G;
    push[4] = (uint32_t)a->head_dim;
    push[5] = (uint32_t)a->tile;
    push[6] = (uint32_t)a->n_visit;
    push[7] = (uint32_t)n_tiles;
    push[8] = a->dtype == KVMEM_F16;
    memcpy(&push[9], &a->scale, 4);
    memcpy(&push[10], &a->tau_s, 4);
    memcpy(&push[11], &a->tau_d, 4);
    push[12] = (uint32_t)a->patience;
    push[13] = a->tau_s > 0 || a->tau_d > 0;
    push[14] = (uint32_t)(a->q_off / 4);
    push[15] = (uint32_t)(a->k_off / es);
    push[16] = (uint32_t)(a->v_off / es);
    push[17] = (uint32_t)(a->slot_map_off / 4);
    push[18] = (uint32_t)(a->order_off / 4);
    push[19] = (uint32_t)(a->out_off / 4);
    push[20] = (uint32_t)(a->visited_off / 4);
    push[21] = 0; /* first */
    push[22] = (uint32_t)max_steps;
    /* slots past UINT32_MAX cannot occur (n_slots < 2^32 above) */
    push[23] = a->k_tail ? (uint32_t)KVM_MIN(a->tail_slot, (int64_t)UINT32_MAX) : UINT32_MAX;
    push[24] = (uint32_t)(a->tail_off / 4);
    push[25] = (uint32_t)a->rotary_dim;
    push[26] = (uint32_t)a->gptj;
    memcpy(&push[27], &a->attn_factor, 4);
    push[28] = (uint32_t)(a->rope_off / 4);
    push[29] = a->scored ? (uint32_t)n_tiles : 0; /* ord_stride: the streams' own orders */
    push[30] = (uint32_t)a->scored;
    uint32_t push_first[31];
    memcpy(push_first, push, sizeof push);
    push_first[21] = 1;

    uint32_t *done = malloc((size_t)H * sizeof *done);
    if (!done) return kvm_vk_fail(v, KVMEM_ERR_NOMEM, "dev_attend: out of host memory");
    pthread_mutex_lock(&v->mu);
    kvmem_buffer *state = NULL;
    double seconds = 0;
    int timed = 1;
    kvmem_status st = a->scored && n_tiles > 0 ? scored_order(v, a, n_tiles, &seconds) : KVMEM_OK;
    if (seconds < 0) timed = 0;
    if (st == KVMEM_OK) st = kvm_vk_buffer_create(v, (size_t)state_bytes, 1, &state);
    /* NULL slot_map / order (nothing to read): bind q in their place */
    const kvmem_buffer *bind[KVM_DA_N + 4];
    for (int i = 0; i < KVM_DA_N; i++) bind[i] = bufs[i] ? bufs[i] : a->q;
    bind[KVM_DA_N] = state;
    for (int i = 0; i < 3; i++) bind[KVM_DA_N + 1 + i] = extra[i] ? extra[i] : a->q; /* unused: any buffer */
    const uint32_t groups[3] = {(uint32_t)a->n_kv_heads, 1, 1};
    VkResult r = VK_SUCCESS;
    for (uint64_t sent = 0; st == KVMEM_OK && r == VK_SUCCESS && sent < n_dispatch;) {
        const uint32_t n = (uint32_t)(n_dispatch - sent < ATTEND_PER_SUBMIT ? n_dispatch - sent : ATTEND_PER_SUBMIT);
        if ((r = kvm_vk_begin(v)) != VK_SUCCESS) break;
        r = kvm_vk_bind(v, kern, bind, KVM_DA_N + 4, sizeof push);
        for (uint32_t i = 0; r == VK_SUCCESS && i < n; i++)
            r = kvm_vk_dispatch(v, kern, sent + i == 0 ? push_first : push, sizeof push, groups[0], groups[1],
                                groups[2]);
        if (r != VK_SUCCESS) {
            v->vk.vkEndCommandBuffer(v->cmd);
            break;
        }
        if ((r = kvm_vk_submit_wait(v, 1)) != VK_SUCCESS) break;
        if (v->last_op_seconds >= 0) seconds += v->last_op_seconds;
        else timed = 0;
        sent += n;
        if (sent < n_dispatch && (st = kvm_vk_download(v, state, 0, done, (size_t)H * 4)) == KVMEM_OK) {
            uint64_t g = 0;
            while (g < H && done[g]) g++;
            if (g == H) break; /* every stream stopped: the rest would do nothing */
        }
    }
    v->last_op_seconds = timed ? seconds : -1;
    kvm_vk_buffer_destroy(v, state);
    pthread_mutex_unlock(&v->mu);
    free(done);
    if (st != KVMEM_OK) return st;
    return r == VK_SUCCESS ? KVMEM_OK
                           : kvm_vk_fail(v, KVMEM_ERR_BACKEND, "vulkan dev_attend failed (%s)", kvm_vk_result_str(r));
}
