/* The CPU backend's gather: its dev_gather_rope entry in every form
 * (core/backend/backend.h), the one gather the CPU runs. A bandwidth-bound
 * op: every (segment, layer) item streams its rows through one
 * read -> rotate -> convert pass into the output. Segments are the pool's
 * blocks when the core gathers (rows decoded by the caller's reader, the
 * output the caller's tensor in any layout); in the buffer-level form each
 * output row is a segment of one row copied from src. */
#include "cpu_backend.h"
#include "../internal.h"
#include "kernels.h"
#include "tensor.h"
#include "../backend/dev_args.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct gather_job {
    const kvm_dev_gather_args *a;
    const kvm_rope *rope;
    const float *cs;
    const kvmem_tensor *out;
    /* the buffer-level form's source, when there is no reader */
    const float *src;
    const uint32_t *idx;
    size_t n_items, n_layers, max_rows;
    float *work; /* per slot: a segment's rows of one head, then its token rows */
    size_t slot_floats;
    atomic_size_t next;
} gather_job;

static size_t seg_first(const gather_job *job, size_t s) { return job->a->rows ? (size_t)job->a->rows->first[s] : s; }

/* Rows of head h of segment s, layer l, f32 [n][head_dim]. */
static void read_rows(const gather_job *job, size_t s, int32_t l, size_t h, float *dst) {
    const kvm_dev_gather_args *a = job->a;
    if (a->rows) {
        a->rows->read(a->rows->ctx, (int32_t)s, a->which, l, (int32_t)h, dst);
        return;
    }
    const uint32_t i = job->idx[s];
    if (i >= a->n_src) memset(dst, 0, a->head_dim * sizeof(float)); /* a bad index gives a zero row */
    else if (a->src_dtype == KVMEM_F16) /* the device mirror's rows: exact */
        kvm_convert_host(dst, KVMEM_F32, (const uint16_t *)(const void *)job->src + (size_t)i * a->src_rs + h * a->head_dim,
                         KVMEM_F16, a->head_dim);
    else memcpy(dst, job->src + (size_t)i * a->src_rs + h * a->head_dim, a->head_dim * sizeof(float));
}

/* Rotate n rows starting at output row r0 with their cos/sin. */
static void rotate(const gather_job *job, float *x, size_t n, size_t r0) {
    const kvm_dev_gather_args *a = job->a;
    const size_t np = a->rotary_dim / 2, D = a->head_dim;
    if (a->cs_rows) {
        kvm_rope_rotate_rows(job->rope, x, n, D, job->cs + r0 * 2 * np, 2 * np);
        return;
    }
    for (size_t r = 0; r < n; r++) /* the two planes: cos [n_out][np], then sin */
        kvm_rope_rotate(job->rope, x + r * D, job->cs + (r0 + r) * np, job->cs + (a->n_out + r0 + r) * np, 0);
}

/* Item = (segment s, layer l): every head of that layer of the segment. An
 * output whose rows of one head are adjacent (head-major: HF caches,
 * [n_heads][M][head_dim] per layer) takes each head's n rows in one
 * convert-and-store from the segment's own head-major rows; one whose
 * heads of a row are adjacent (contiguous [M][n_heads][head_dim]) takes
 * rows of H * D elements, staged row-major; any other strides one D row at
 * a time. */
static void gather_item(const gather_job *job, size_t it, float *tmp, float *stage) {
    const kvm_dev_gather_args *a = job->a;
    const size_t D = a->head_dim, H = a->n_heads, L = job->n_layers;
    const size_t s = it / L;
    const int32_t l = (int32_t)(it % L);
    const size_t r0 = seg_first(job, s), n = seg_first(job, s + 1) - r0;
    const kvmem_tensor *t = job->out;
    const int rows_contig = t->strides[3] == 1 && t->strides[1] == (int64_t)D;
    const int heads_contig = !rows_contig && t->strides[3] == 1 && t->strides[2] == (int64_t)D;
    for (size_t h = 0; h < H; h++) {
        read_rows(job, s, l, h, tmp);
        if (a->rotary_dim) rotate(job, tmp, n, r0);
        if (rows_contig) {
            int64_t idx[3] = {l, (int64_t)r0, (int64_t)h};
            kvm_tensor_write_f32(t, kvm_tensor_row_offset(t, idx), tmp, n * D);
        } else if (heads_contig) {
            for (size_t r = 0; r < n; r++) memcpy(stage + (r * H + h) * D, tmp + r * D, D * sizeof(float));
        } else {
            for (size_t r = 0; r < n; r++) {
                int64_t idx[3] = {l, (int64_t)(r0 + r), (int64_t)h};
                kvm_tensor_write_f32(t, kvm_tensor_row_offset(t, idx), tmp + r * D, D);
            }
        }
    }
    for (size_t r = 0; heads_contig && r < n; r++) {
        int64_t idx[3] = {l, (int64_t)(r0 + r), 0};
        kvm_tensor_write_f32(t, kvm_tensor_row_offset(t, idx), stage + r * H * D, H * D);
    }
}

/* Slots [b, e) take items by atomic counter, each with its own rows. */
static void gather_task(void *arg, size_t b, size_t e) {
    gather_job *job = arg;
    const size_t D = job->a->head_dim;
    for (size_t si = b; si < e; si++) {
        float *tmp = job->work + si * job->slot_floats, *stage = tmp + job->max_rows * D;
        for (size_t it; (it = atomic_fetch_add(&job->next, 1)) < job->n_items;) gather_item(job, it, tmp, stage);
    }
}

/* Every allocation comes before the first write to the output: a failure
 * leaves it as it was. */
kvmem_status kvm_cpu_dev_gather_rope(kvmem_backend *be, const kvm_dev_gather_args *a) {
    char msg[256];
    kvmem_status st = kvm_dev_gather_check(a, kvm_cpu_buffer_size, msg, sizeof msg);
    if (st != KVMEM_OK) return kvm_fail(st, "%s", msg);
    if (a->rotary_dim / 2 > KVM_ROPE_MAX_PAIRS)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "dev_gather_rope: rotary_dim %zu > %d", a->rotary_dim,
                        2 * KVM_ROPE_MAX_PAIRS);
    gather_job job;
    memset(&job, 0, sizeof job);
    job.a = a;
    job.n_layers = a->n_layers > 1 ? (size_t)a->n_layers : 1;
    job.max_rows = a->rows ? (size_t)a->rows->max_rows : 1;
    job.n_items = (a->rows ? (size_t)a->rows->n_segs : a->n_out) * job.n_layers;
    job.cs = a->rotary_dim ? kvm_cpu_at(a->cs, a->cs_off) : NULL;
    if (!a->rows) {
        job.src = kvm_cpu_at(a->src, a->src_off);
        job.idx = kvm_cpu_at(a->idx, a->idx_off);
    }
    kvmem_tensor out;
    if (!a->out_view) { /* the buffer: f32 [1][n_out][n_heads][head_dim] */
        const int64_t shape[4] = {1, (int64_t)a->n_out, (int64_t)a->n_heads, (int64_t)a->head_dim};
        kvmem_tensor_init(&out, kvm_cpu_at(a->out, a->out_off), KVMEM_F32, 4, shape);
    }
    job.out = a->out_view ? a->out_view : &out;
    kvm_threadpool *tp = kvm_cpu_backend_tp(be);
    const size_t n_slots = (size_t)kvm_threadpool_size(tp);
    job.slot_floats = (job.max_rows * a->head_dim * (1 + a->n_heads) + 15) / 16 * 16; /* 64-byte aligned slots */
    atomic_init(&job.next, 0);
    kvm_scratch *scr = kvm_cpu_backend_scratch(be);
    const size_t head = (sizeof(kvm_rope) + 63) / 64 * 64; /* the rows after the RoPE struct, 64-byte aligned */
    kvm_rope *rope = kvm_scratch_take(scr, head + n_slots * job.slot_floats * sizeof(float));
    if (!rope)
        return kvm_fail(KVMEM_ERR_NOMEM, "dev_gather_rope: out of memory for %zu threads' staging rows", n_slots);
    memset(rope, 0, sizeof *rope); /* pairing and attn_factor only: the angles come in cs */
    rope->head_dim = (int32_t)a->head_dim;
    rope->rotary_dim = (int32_t)a->rotary_dim;
    rope->n_pairs = (int32_t)(a->rotary_dim / 2);
    rope->style = a->gptj ? KVMEM_ROPE_GPTJ : KVMEM_ROPE_NEOX;
    rope->attn_factor = a->attn_factor;
    job.rope = rope;
    job.work = (float *)(void *)((unsigned char *)rope + head);
    kvm_parallel_for(tp, n_slots, 1, gather_task, &job);
    kvm_scratch_give(scr, rope);
    return KVMEM_OK;
}
