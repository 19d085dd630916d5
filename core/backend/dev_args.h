/* Validation of the retrieval device kernels' arguments (dev_score, dev_topk,
 * dev_gather_rope: contracts in core/backend/backend.h), shared by the CPU
 * backend's entries (core/cpu/ops_*.c) and the device plugins, which cannot
 * link the core's hidden symbols: header-only, so every backend rejects the
 * same inputs with the same messages. Each check writes a message into msg
 * and returns the status (KVMEM_OK: valid, msg untouched). The *_sizes forms
 * take the buffers' byte sizes in argument order (0 for a NULL buffer); the
 * plain forms get them from `size` (the backend knows its own buffer type). */
#ifndef KVMEM_BACKEND_DEV_ARGS_H
#define KVMEM_BACKEND_DEV_ARGS_H

#include "arith.h"
#include "backend.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

typedef size_t (*kvm_dev_size_fn)(const kvmem_buffer *b);

/* Whether the arguments of op are in the buffer-level form every backend
 * takes (none of the host-side fields of core/backend/backend.h, which are
 * the CPU backend's): what a device's supports_op asks first, and the
 * router before it asks a device at all. args NULL: yes. */
static inline int kvm_dev_args_buffer_form(kvm_op op, const void *args) {
    if (!args) return 1;
    switch (op) {
    case KVM_OP_SCORE: {
        const kvm_dev_score_args *a = (const kvm_dev_score_args *)args;
        return a->n_sets == 0 && (a->box_layout == KVM_BOXES_SPLIT_F32 || a->box_layout == KVM_BOXES_SPLIT_F16) &&
               !a->blocks && !a->keys && (a->mode == KVMEM_RETRIEVE_AABB || a->key_rows);
    }
    case KVM_OP_GATHER_ROPE: {
        const kvm_dev_gather_args *a = (const kvm_dev_gather_args *)args;
        return !a->rows && !a->out_view && a->n_layers <= 1 && !a->cs_rows;
    }
    case KVM_OP_QMEM_SCORE: return !((const kvm_dev_qmem_args *)args)->k_view;
    default: return 1;
    }
}

/* Write the message, return KVMEM_ERR_INVALID_ARG. */
static inline kvmem_status kvm_dev_bad(char *msg, size_t msg_size, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static inline kvmem_status kvm_dev_bad(char *msg, size_t msg_size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, msg_size, fmt, ap);
    va_end(ap);
    return KVMEM_ERR_INVALID_ARG;
}

/* Elements [off/4, off/4 + n) of f32/int32 buffer b (of `size` bytes) exist; off a multiple of 4. */
static inline int kvm_dev_holds(size_t size, const kvmem_buffer *b, size_t off, size_t n) {
    size_t bytes, end;
    return b && off % 4 == 0 && kvm_mul_size(n, 4, &bytes) && kvm_add_size(off, bytes, &end) && end <= size;
}

static inline size_t kvm_dev_size_of(kvm_dev_size_fn size, const kvmem_buffer *b) { return b ? size(b) : 0; }

/* a * b * c * d without overflow. */
static inline int kvm_dev_prod(size_t *out, size_t a, size_t b, size_t c, size_t d) {
    return kvm_mul_size(a, b, out) && kvm_mul_size(*out, c, out) && kvm_mul_size(*out, d, out);
}

/* size: q, s_min, s_max, out; key_size: the byte size of a buffer of
 * EXACT's key_rows (NULL: none is taken) */
static inline kvmem_status kvm_dev_score_check_sizes(const kvm_dev_score_args *a, const size_t size[4],
                                                     kvm_dev_size_fn key_size, char *msg, size_t msg_size) {
    if (!a) return kvm_dev_bad(msg, msg_size, "dev_score: args is NULL");
    if (a->n_q < 1 || a->n_blocks < 1 || a->n_layers < 1 || a->n_q_heads < 1 || a->n_kv_heads < 1 || a->head_dim < 1)
        return kvm_dev_bad(msg, msg_size,
                           "dev_score: empty or negative shape (n_q %d, n_blocks %d, n_layers %d, n_q_heads %d, "
                           "n_kv_heads %d, head_dim %d)",
                           a->n_q, a->n_blocks, a->n_layers, a->n_q_heads, a->n_kv_heads, a->head_dim);
    if (a->n_q_heads % a->n_kv_heads)
        return kvm_dev_bad(msg, msg_size, "dev_score: n_q_heads %d is not a multiple of n_kv_heads %d", a->n_q_heads,
                           a->n_kv_heads);
    if (a->norm != KVMEM_NORM_SOFTMAX && a->norm != KVMEM_NORM_RR)
        return kvm_dev_bad(msg, msg_size, "dev_score: norm %d is not SOFTMAX or RR", (int)a->norm);
    if (a->agg != KVMEM_AGG_MAX && a->agg != KVMEM_AGG_SUM)
        return kvm_dev_bad(msg, msg_size, "dev_score: agg %d is not MAX or SUM", (int)a->agg);
    if (!(a->tau > 0 && isfinite(a->tau)) || !(a->rr_c > 0 && isfinite(a->rr_c)))
        return kvm_dev_bad(msg, msg_size, "dev_score: tau %g and rr_c %g must be finite and > 0", (double)a->tau,
                           (double)a->rr_c);
    const int exact = a->mode == KVMEM_RETRIEVE_EXACT;
    const int split = a->box_layout == KVM_BOXES_SPLIT_F32 || a->box_layout == KVM_BOXES_SPLIT_F16;
    if (a->mode != KVMEM_RETRIEVE_AABB && !exact)
        return kvm_dev_bad(msg, msg_size, "dev_score: mode %d is not AABB or EXACT", (int)a->mode);
    if (a->box_layout < KVM_BOXES_SPLIT_F32 || a->box_layout > KVM_BOXES_SPLIT_F16)
        return kvm_dev_bad(msg, msg_size, "dev_score: box_layout %d is unknown", a->box_layout);
    if (a->n_sets != 0 && a->n_sets != 1 && a->n_sets != a->n_layers)
        return kvm_dev_bad(msg, msg_size, "dev_score: n_sets %d is not 0, 1 or n_layers %d", a->n_sets, a->n_layers);
    const int key_bufs = exact && !a->keys && a->key_rows; /* EXACT's buffer form */
    if (exact && !key_bufs && (!a->keys || !a->keys->read || a->keys->max_rows < 1))
        return kvm_dev_bad(msg, msg_size, "dev_score: EXACT needs keys with a reader and max_rows >= 1, or key_rows");
    if (key_bufs && (a->block_rows < 1 || (a->key_f16 != 0 && a->key_f16 != 1) || a->blocks || a->n_sets))
        return kvm_dev_bad(msg, msg_size, "dev_score: EXACT's key_rows need block_rows %d >= 1, key_f16 0 or 1, "
                           "no blocks list and n_sets 0", a->block_rows);
    if (!a->q || !a->out || (!exact && (!a->s_max || (split && !a->s_min))))
        return kvm_dev_bad(msg, msg_size, "dev_score: a buffer is NULL");
    if (a->q_off % 4 || a->s_off % 4 || a->out_off % 4)
        return kvm_dev_bad(msg, msg_size, "dev_score: offsets must be multiples of 4 bytes");
    size_t nq, ns, no;
    size_t L = (size_t)a->n_layers, D = (size_t)a->head_dim, NB = (size_t)a->n_blocks;
    size_t n_box = NB; /* blocks of the box array the call reads */
    if (a->blocks) {
        n_box = 0;
        for (size_t j = 0; j < NB; j++) {
            if (a->blocks[j] < 0) return kvm_dev_bad(msg, msg_size, "dev_score: blocks[%zu] = %d < 0", j, a->blocks[j]);
            if ((size_t)a->blocks[j] + 1 > n_box) n_box = (size_t)a->blocks[j] + 1;
        }
    }
    /* in f32 elements: a PAIRED box is 2 * D elements, f16 ones half as many;
     * SPLIT_F16 arrays are D halves a box (rounded up to whole words) */
    const int half = a->box_layout == KVM_BOXES_SPLIT_F16;
    const size_t box_elems = a->box_layout == KVM_BOXES_SPLIT_F32 ? D : a->box_layout == KVM_BOXES_PAIRED_F32 ? 2 * D : D;
    if (!kvm_dev_prod(&nq, (size_t)a->n_q, L, (size_t)a->n_q_heads, D) ||
        !kvm_dev_prod(&ns, n_box, L, (size_t)a->n_kv_heads, box_elems) || (half && (ns = ns / 2 + ns % 2, 0)) ||
        !kvm_dev_prod(&no, a->n_sets ? (size_t)a->n_sets : L * (size_t)a->n_q_heads, NB, 1, 1) ||
        !kvm_dev_holds(size[0], a->q, a->q_off, nq) || (!exact && split && !kvm_dev_holds(size[1], a->s_min, a->s_off, ns)) ||
        (!exact && !kvm_dev_holds(size[2], a->s_max, a->s_off, ns)) || !kvm_dev_holds(size[3], a->out, a->out_off, no))
        return kvm_dev_bad(msg, msg_size, "dev_score: ranges outside the buffers");
    if (key_bufs) { /* every layer's rows, in 32-bit words (f16 rows rounded up to whole words) */
        size_t nk;
        if (!kvm_dev_prod(&nk, NB, (size_t)a->block_rows, (size_t)a->n_kv_heads, D))
            return kvm_dev_bad(msg, msg_size, "dev_score: EXACT's key rows overflow");
        if (a->key_f16) nk = (nk + 1) / 2;
        for (size_t l = 0; l < L; l++)
            if (!a->key_rows[l] || !kvm_dev_holds(key_size ? key_size(a->key_rows[l]) : 0, a->key_rows[l], a->s_off, nk))
                return kvm_dev_bad(msg, msg_size, "dev_score: EXACT's key rows of layer %zu are NULL or outside the buffer", l);
    }
    return KVMEM_OK;
}

/* dev_topk: idx must hold min(k, n) entries (at most that many are written).
 * size: scores, idx */
static inline kvmem_status kvm_dev_topk_check_sizes(const kvm_dev_topk_args *a, const size_t size[2], char *msg,
                                                    size_t msg_size) {
    if (!a) return kvm_dev_bad(msg, msg_size, "dev_topk: args is NULL");
    if (!a->n_out) return kvm_dev_bad(msg, msg_size, "dev_topk: n_out is NULL");
    if (a->n < 0 || a->k < 0)
        return kvm_dev_bad(msg, msg_size, "dev_topk: n %d and k %d must be >= 0", a->n, a->k);
    if (a->n == 0 || a->k == 0) return KVMEM_OK;
    if (!a->scores || !a->idx) return kvm_dev_bad(msg, msg_size, "dev_topk: a buffer is NULL");
    if (a->scores_off % 4 || a->idx_off % 4)
        return kvm_dev_bad(msg, msg_size, "dev_topk: offsets must be multiples of 4 bytes");
    if (!kvm_dev_holds(size[0], a->scores, a->scores_off, (size_t)a->n) ||
        !kvm_dev_holds(size[1], a->idx, a->idx_off, (size_t)KVM_MIN(a->k, a->n)))
        return kvm_dev_bad(msg, msg_size, "dev_topk: ranges outside the buffers");
    return KVMEM_OK;
}

/* size: src, idx, cs, out */
static inline kvmem_status kvm_dev_gather_check_sizes(const kvm_dev_gather_args *a, const size_t size[4], char *msg,
                                                      size_t msg_size) {
    if (!a) return kvm_dev_bad(msg, msg_size, "dev_gather_rope: args is NULL");
    if (!a->n_out || !a->n_heads || !a->head_dim || !a->n_src)
        return kvm_dev_bad(msg, msg_size, "dev_gather_rope: empty input (n_src %zu, n_out %zu, n_heads %zu, head_dim %zu)",
                           a->n_src, a->n_out, a->n_heads, a->head_dim);
    if (a->rotary_dim % 2 || a->rotary_dim > a->head_dim || (a->gptj != 0 && a->gptj != 1))
        return kvm_dev_bad(msg, msg_size, "dev_gather_rope: rotary_dim %zu must be even and <= head_dim %zu, gptj 0 or 1",
                           a->rotary_dim, a->head_dim);
    if (!(a->attn_factor > 0 && isfinite(a->attn_factor)))
        return kvm_dev_bad(msg, msg_size, "dev_gather_rope: attn_factor %g must be finite and > 0", (double)a->attn_factor);
    if (a->which != 0 && a->which != 1)
        return kvm_dev_bad(msg, msg_size, "dev_gather_rope: which %d is not 0 (K) or 1 (V)", a->which);
    if (a->n_layers < 0 || (a->n_layers > 1 && !a->out_view) || (a->cs_rows != 0 && a->cs_rows != 1))
        return kvm_dev_bad(msg, msg_size, "dev_gather_rope: n_layers %d (more than 1 needs out_view), cs_rows %d (0 or 1)",
                           a->n_layers, a->cs_rows);
    if (a->rows && (!a->rows->read || a->rows->n_segs < 1 || a->rows->max_rows < 1 || !a->rows->first ||
                    a->rows->first[0] != 0 || a->rows->first[a->rows->n_segs] != (int64_t)a->n_out))
        return kvm_dev_bad(msg, msg_size, "dev_gather_rope: rows needs a reader and n_segs + 1 offsets from 0 to n_out");
    if (a->out_view && (a->out_view->ndim != 4 || a->out_view->shape[0] != (a->n_layers ? a->n_layers : 1) ||
                        a->out_view->shape[1] != (int64_t)a->n_out || a->out_view->shape[2] != (int64_t)a->n_heads ||
                        a->out_view->shape[3] != (int64_t)a->head_dim))
        return kvm_dev_bad(msg, msg_size, "dev_gather_rope: out_view must be [n_layers][n_out][n_heads][head_dim]");
    if ((!a->rows && (!a->src || !a->idx)) || (!a->out_view && !a->out) || (a->rotary_dim && !a->cs))
        return kvm_dev_bad(msg, msg_size, "dev_gather_rope: a buffer is NULL");
    if (a->src_off % 4 || a->idx_off % 4 || a->cs_off % 4 || a->out_off % 4)
        return kvm_dev_bad(msg, msg_size, "dev_gather_rope: offsets must be multiples of 4 bytes");
    if (a->src_dtype != KVMEM_F32 && (a->src_dtype != KVMEM_F16 || a->rows))
        return kvm_dev_bad(msg, msg_size, "dev_gather_rope: src_dtype %d must be F32, or F16 with a source buffer",
                           (int)a->src_dtype);
    size_t row, se, oe;
    if (!kvm_mul_size(a->n_heads, a->head_dim, &row) || (!a->rows && a->src_rs < row) ||
        !kvm_mul_size(a->n_src - 1, a->src_rs, &se) || !kvm_add_size(se, row, &se) ||
        !kvm_mul_size(a->n_out, row, &oe) ||
        (!a->rows && !kvm_dev_holds(size[0], a->src, a->src_off, a->src_dtype == KVMEM_F16 ? se / 2 + se % 2 : se)) ||
        (!a->out_view && !kvm_dev_holds(size[3], a->out, a->out_off, oe)) ||
        (!a->rows && !kvm_dev_holds(size[1], a->idx, a->idx_off, a->n_out)) ||
        (a->rotary_dim && !kvm_dev_prod(&se, a->n_out, a->rotary_dim, 1, 1)) ||
        (a->rotary_dim && !kvm_dev_holds(size[2], a->cs, a->cs_off, se)))
        return kvm_dev_bad(msg, msg_size, "dev_gather_rope: ranges outside the buffers (or src_rs < n_heads * head_dim)");
    return KVMEM_OK;
}

/* dev_score_reduce. size: in, out */
static inline kvmem_status kvm_dev_score_reduce_check_sizes(const kvm_dev_score_reduce_args *a, const size_t size[2],
                                                            char *msg, size_t msg_size) {
    if (!a) return kvm_dev_bad(msg, msg_size, "dev_score_reduce: args is NULL");
    if (a->n_layers < 1 || a->n_heads < 1 || a->n < 1 || (a->n_sets != 1 && a->n_sets != a->n_layers))
        return kvm_dev_bad(msg, msg_size,
                           "dev_score_reduce: n_layers %d, n_heads %d, n %d must be >= 1 and n_sets %d 1 or n_layers",
                           a->n_layers, a->n_heads, a->n, a->n_sets);
    if (!a->in || !a->out) return kvm_dev_bad(msg, msg_size, "dev_score_reduce: a buffer is NULL");
    if (a->in_off % 4 || a->out_off % 4)
        return kvm_dev_bad(msg, msg_size, "dev_score_reduce: offsets must be multiples of 4 bytes");
    size_t ni, no;
    if (!kvm_dev_prod(&ni, (size_t)a->n_layers, (size_t)a->n_heads, (size_t)a->n, 1) ||
        !kvm_dev_prod(&no, (size_t)a->n_sets, (size_t)a->n, 1, 1) || !kvm_dev_holds(size[0], a->in, a->in_off, ni) ||
        !kvm_dev_holds(size[1], a->out, a->out_off, no))
        return kvm_dev_bad(msg, msg_size, "dev_score_reduce: ranges outside the buffers");
    if (a->in == a->out && a->in_off < a->out_off + no * 4 && a->out_off < a->in_off + ni * 4)
        return kvm_dev_bad(msg, msg_size, "dev_score_reduce: in and out overlap");
    return KVMEM_OK;
}

/* The same checks with sizes from the backend's own size function. */
static inline kvmem_status kvm_dev_score_check(const kvm_dev_score_args *a, kvm_dev_size_fn size, char *msg,
                                               size_t msg_size) {
    size_t sz[4] = {0, 0, 0, 0};
    if (a) {
        sz[0] = kvm_dev_size_of(size, a->q);
        sz[1] = kvm_dev_size_of(size, a->s_min);
        sz[2] = kvm_dev_size_of(size, a->s_max);
        sz[3] = kvm_dev_size_of(size, a->out);
    }
    return kvm_dev_score_check_sizes(a, sz, size, msg, msg_size);
}

static inline kvmem_status kvm_dev_score_reduce_check(const kvm_dev_score_reduce_args *a, kvm_dev_size_fn size,
                                                      char *msg, size_t msg_size) {
    size_t sz[2] = {0, 0};
    if (a) {
        sz[0] = kvm_dev_size_of(size, a->in);
        sz[1] = kvm_dev_size_of(size, a->out);
    }
    return kvm_dev_score_reduce_check_sizes(a, sz, msg, msg_size);
}

static inline kvmem_status kvm_dev_topk_check(const kvm_dev_topk_args *a, kvm_dev_size_fn size, char *msg,
                                              size_t msg_size) {
    size_t sz[2] = {0, 0};
    if (a) {
        sz[0] = kvm_dev_size_of(size, a->scores);
        sz[1] = kvm_dev_size_of(size, a->idx);
    }
    return kvm_dev_topk_check_sizes(a, sz, msg, msg_size);
}

static inline kvmem_status kvm_dev_gather_check(const kvm_dev_gather_args *a, kvm_dev_size_fn size, char *msg,
                                                size_t msg_size) {
    size_t sz[4] = {0, 0, 0, 0};
    if (a) {
        sz[0] = kvm_dev_size_of(size, a->src);
        sz[1] = kvm_dev_size_of(size, a->idx);
        sz[2] = kvm_dev_size_of(size, a->cs);
        sz[3] = kvm_dev_size_of(size, a->out);
    }
    return kvm_dev_gather_check_sizes(a, sz, msg, msg_size);
}

#endif
