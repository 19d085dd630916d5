/* dev_attend (backend.h): the argument checks every backend applies
 * (header-only, so plugins, which cannot link the core's hidden symbols,
 * share them). The CPU backend's reference entry: core/attend/attend.h. */
#ifndef KVMEM_ATTEND_DEV_H
#define KVMEM_ATTEND_DEV_H

#include "arith.h"
#include "backend.h"

#include <math.h>
#include <stdio.h>

/* Byte sizes of the seven buffers, in this order (0 for a NULL one). */
enum { KVM_DA_Q, KVM_DA_K, KVM_DA_V, KVM_DA_SLOTS, KVM_DA_ORDER, KVM_DA_OUT, KVM_DA_VISITED, KVM_DA_N };

/* 1 when a's shapes, parameters and ranges are valid for buffers of the
 * given sizes; else 0 with a message (without the op's name) in msg. The
 * contents of slot_map and order are not checked here (device memory). */
static inline int kvm_dev_attend_check(const kvm_dev_attend_args *a, const size_t size[KVM_DA_N], char *msg,
                                       size_t msg_size) {
    if (!a->q || !a->k || !a->v || !a->out || !a->visited || (a->n_pos > 0 && !a->slot_map) ||
        (a->n_visit > 0 && !a->order)) {
        snprintf(msg, msg_size, "a buffer is NULL (q, k, v, out, visited; slot_map when n_pos > 0, order when n_visit > 0)");
        return 0;
    }
    if (a->n_kv_heads < 1 || a->n_q_heads < a->n_kv_heads || a->n_q_heads % a->n_kv_heads != 0 || a->head_dim < 1 ||
        a->head_dim > 1024) {
        snprintf(msg, msg_size, "n_q_heads %d must be a multiple of n_kv_heads %d >= 1, head_dim %d in [1, 1024]",
                 a->n_q_heads, a->n_kv_heads, a->head_dim);
        return 0;
    }
    if (a->n_slots < 0 || a->n_pos < 0 || a->n_pos > INT32_MAX || a->tile < 1 || a->n_visit < 0) {
        snprintf(msg, msg_size, "n_slots %lld, n_pos %lld must be >= 0 (n_pos < 2^31), tile %d >= 1, n_visit %d >= 0",
                 (long long)a->n_slots, (long long)a->n_pos, a->tile, a->n_visit);
        return 0;
    }
    const int64_t n_tiles = (a->n_pos + a->tile - 1) / a->tile;
    if (a->scored != 0 && a->scored != 1) {
        snprintf(msg, msg_size, "scored %d must be 0 or 1", a->scored);
        return 0;
    }
    if (a->scored && (a->k_tail || a->rope_cs)) {
        snprintf(msg, msg_size, "scored: the scored form reads caller K (no mirror tail or rotation)");
        return 0;
    }
    if (a->scored && a->n_visit != n_tiles) {
        snprintf(msg, msg_size, "scored: n_visit %d must be the %lld tiles", a->n_visit, (long long)n_tiles);
        return 0;
    }
    if (a->n_visit > n_tiles) {
        snprintf(msg, msg_size, "n_visit %d exceeds the %lld tiles", a->n_visit, (long long)n_tiles);
        return 0;
    }
    if (a->dtype != KVMEM_F32 && a->dtype != KVMEM_F16) {
        snprintf(msg, msg_size, "k and v dtype %d must be F32 or F16", (int)a->dtype);
        return 0;
    }
    if (!(a->scale > 0.0f) || !isfinite(a->scale) || !(a->tau_s >= 0.0f) || !isfinite(a->tau_s) ||
        !(a->tau_d >= 0.0f) || !isfinite(a->tau_d) || a->patience < 1) {
        snprintf(msg, msg_size, "scale %g must be > 0, tau_s %g and tau_d %g >= 0 (finite), patience %d >= 1",
                 (double)a->scale, (double)a->tau_s, (double)a->tau_d, a->patience);
        return 0;
    }
    if ((a->q_off | a->k_off | a->v_off | a->slot_map_off | a->order_off | a->out_off | a->visited_off) % 4) {
        snprintf(msg, msg_size, "offsets must be multiples of 4 bytes");
        return 0;
    }
    const size_t es = a->dtype == KVMEM_F32 ? 4 : 2;
    size_t row, kv, need[KVM_DA_N];
    const size_t off[KVM_DA_N] = {a->q_off, a->k_off, a->v_off, a->slot_map_off, a->order_off, a->out_off, a->visited_off};
    /* with tail rows, k and v hold the slots below tail_slot only */
    const int64_t k_slots = a->k_tail && a->tail_slot < a->n_slots ? a->tail_slot : a->n_slots;
    int ok = kvm_mul_size((size_t)a->n_q_heads, (size_t)a->head_dim, &row) && kvm_mul_size(row, 4, &need[KVM_DA_Q]) &&
             kvm_mul_size((size_t)k_slots, (size_t)a->n_kv_heads, &kv) && kvm_mul_size(kv, (size_t)a->head_dim, &kv) &&
             kvm_mul_size(kv, es, &need[KVM_DA_K]);
    need[KVM_DA_V] = ok ? need[KVM_DA_K] : 0;
    need[KVM_DA_SLOTS] = (size_t)a->n_pos * 4;
    ok = ok && kvm_mul_size((size_t)a->n_visit * 4, a->scored ? (size_t)a->n_kv_heads : 1, &need[KVM_DA_ORDER]);
    need[KVM_DA_OUT] = ok ? need[KVM_DA_Q] : 0;
    need[KVM_DA_VISITED] = (size_t)a->n_kv_heads * 4 * (a->scored ? 2 : 1);
    for (int i = 0; ok && i < KVM_DA_N; i++)
        ok = need[i] == 0 || (off[i] <= size[i] && need[i] <= size[i] - off[i]);
    if (!ok) {
        snprintf(msg, msg_size, "ranges outside the buffers (%lld slots x %d KV heads x %d, %lld positions, %d tiles)",
                 (long long)a->n_slots, a->n_kv_heads, a->head_dim, (long long)a->n_pos, a->n_visit);
        return 0;
    }
    return 1;
}

/* The device mirror's fields (backend.h, dev_attend): sizes of k_tail,
 * v_tail and rope_cs in bytes (0 for NULL). 1 when valid (also when unused),
 * else 0 with a message. Call after kvm_dev_attend_check. */
static inline int kvm_dev_attend_check_mirror(const kvm_dev_attend_args *a, size_t kt_size, size_t vt_size,
                                              size_t cs_size, char *msg, size_t msg_size) {
    if (!a->k_tail != !a->v_tail || (a->k_tail && (a->tail_slot < 0 || a->tail_off % 4))) {
        snprintf(msg, msg_size, "k_tail and v_tail must be given together, tail_slot >= 0, tail_off a multiple of 4");
        return 0;
    }
    if (a->k_tail && a->tail_slot < a->n_slots) {
        size_t n, need;
        const int ok = kvm_mul_size((size_t)(a->n_slots - a->tail_slot), (size_t)a->n_kv_heads, &n) &&
                       kvm_mul_size(n, (size_t)a->head_dim * 4, &need) && a->tail_off <= kt_size &&
                       need <= kt_size - a->tail_off && a->tail_off <= vt_size && need <= vt_size - a->tail_off;
        if (!ok) {
            snprintf(msg, msg_size, "the tail rows (slots %lld to %lld) lie outside k_tail / v_tail",
                     (long long)a->tail_slot, (long long)a->n_slots);
            return 0;
        }
    }
    if (a->rotary_dim < 0 || a->rotary_dim % 2 || a->rotary_dim > a->head_dim || (a->gptj != 0 && a->gptj != 1)) {
        snprintf(msg, msg_size, "rotary_dim %d must be even in [0, head_dim %d], gptj 0 or 1", a->rotary_dim,
                 a->head_dim);
        return 0;
    }
    if (a->rotary_dim > 0) {
        size_t need;
        const int ok = a->rope_cs && a->rope_off % 4 == 0 && a->attn_factor > 0.0f && isfinite(a->attn_factor) &&
                       kvm_mul_size((size_t)a->n_pos + 1, (size_t)a->rotary_dim * 4, &need) && a->rope_off <= cs_size &&
                       need <= cs_size - a->rope_off;
        if (!ok) {
            snprintf(msg, msg_size, "rope_cs must hold 1 + n_pos (%lld) rows of rotary_dim %d floats at a multiple of 4 "
                     "bytes, attn_factor %g finite and > 0", (long long)a->n_pos, a->rotary_dim, (double)a->attn_factor);
            return 0;
        }
    }
    return 1;
}

/* Whether any of the device mirror's fields is in use. */
static inline int kvm_dev_attend_mirror_form(const kvm_dev_attend_args *a) {
    return a->k_tail || a->v_tail || a->rotary_dim != 0;
}

#endif
