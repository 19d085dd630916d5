/* kvmem_gather: decoupled position re-encoding. Blocks are concatenated in
 * the caller's order and their raw keys rotated at contiguous new positions.
 * A bandwidth-bound op: the cos/sin table of the M new positions is built
 * once (in parallel), then every (block, layer) streams its K and V rows
 * through one decode -> rotate -> convert pass into the caller's tensors. */
#include "score.h"
#include "../backend/route/route.h"
#include "../backend/route/devtensor.h"
#include "../cpu/cpu_backend.h"
#include "../cpu/tensor.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct cs_job {
    const kvm_rope *rope;
    int64_t base;
    float *cs; /* [M][2][n_pairs] */
} cs_job;

static void cs_task(void *arg, size_t b, size_t e) {
    const cs_job *j = arg;
    const size_t np = (size_t)j->rope->n_pairs;
    for (size_t i = b; i < e; i++)
        kvm_rope_cos_sin(j->rope, (double)(j->base + (int64_t)i), j->cs + i * 2 * np, j->cs + i * 2 * np + np);
}

/* The blocks' rows, for the gather op's reader. */
typedef struct block_rows {
    const kvmem_pool *p;
    const kvm_agent_mem *m;
    const int32_t *blocks;
} block_rows;

static void read_block_rows(void *ctx, int32_t seg, int which, int32_t l, int32_t h, float *dst) {
    const block_rows *b = ctx;
    const kvm_block *blk = &b->m->blocks[b->blocks[seg]];
    kvm_block_read_f32(b->p, blk, which, l, h, 0, blk->n_tokens, dst);
}

/* The CPU backend's gather (its dev_gather_rope entry) of the blocks' rows
 * as read(ctx, ...) gives them: K rotated at the new positions, then V,
 * into the caller's tensors. Every allocation comes before the first write:
 * a failure leaves them as they were. */
static kvmem_status cpu_gather_rows(kvmem_backend *be, const kvm_gather_desc *d, void *ctx,
                                    void (*read)(void *, int32_t, int, int32_t, int32_t, float *)) {
    const kvmem_pool *p = d->pool;
    const int64_t M = d->first[d->n_blocks];
    if (M == 0) return KVMEM_OK;
    const size_t np = (size_t)p->rope.n_pairs;
    float *cs = NULL;
    if (d->k_out && np) {
        cs = kvm_aligned_alloc((size_t)M * 2 * np * sizeof(float));
        if (!cs) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_gather: out of memory for %lld positions' cos/sin", (long long)M);
        cs_job cj = {&p->rope, d->base, cs};
        kvm_parallel_for(kvm_cpu_backend_tp(be), (size_t)M, 256, cs_task, &cj);
    }
    const kvm_dev_rows rows = {ctx, d->n_blocks, p->params.block_size, d->first, read};
    kvmem_buffer vcs;
    kvm_dev_gather_args a;
    memset(&a, 0, sizeof a);
    a.rows = &rows;
    a.n_src = a.n_out = (size_t)M;
    a.n_heads = (size_t)p->spec.n_kv_heads;
    a.head_dim = (size_t)p->spec.head_dim;
    a.n_layers = p->spec.n_layers;
    a.gptj = p->rope.style == KVMEM_ROPE_GPTJ;
    a.cs_rows = 1;
    kvmem_status st = KVMEM_OK;
    if (d->k_out) {
        a.out_view = d->k_out;
        a.which = 0;
        a.rotary_dim = cs ? (size_t)p->rope.rotary_dim : 0;
        a.cs = cs ? kvm_cpu_buffer_view(&vcs, cs, (size_t)M * 2 * np * sizeof(float)) : NULL;
        a.attn_factor = (float)p->rope.attn_factor;
        st = be->iface->dev_gather_rope(be, &a);
    }
    if (st == KVMEM_OK && d->v_out) {
        a.out_view = d->v_out;
        a.which = 1;
        a.rotary_dim = 0;
        a.cs = NULL;
        a.attn_factor = 1.0f;
        st = be->iface->dev_gather_rope(be, &a);
    }
    kvm_aligned_free(cs);
    return st;
}

/* The blocks in place. */
kvmem_status kvm_cpu_gather(kvmem_backend *be, const kvm_gather_desc *d) {
    block_rows br = {d->pool, d->mem, d->blocks};
    return cpu_gather_rows(be, d, &br, read_block_rows);
}

/* score.h: rows [M][H][D] of layer l into a [L][M][H][D] tensor view. */
void kvm_gather_write_layer(const kvmem_tensor *t, int64_t l, const float *rows, size_t M, size_t H, size_t D) {
    const int heads_contig = t->strides[3] == 1 && t->strides[2] == (int64_t)D;
    for (size_t r = 0; r < M; r++) {
        if (heads_contig) {
            int64_t idx[3] = {l, (int64_t)r, 0};
            kvm_tensor_write_f32(t, kvm_tensor_row_offset(t, idx), rows + r * H * D, H * D);
        } else {
            for (size_t h = 0; h < H; h++) {
                int64_t idx[3] = {l, (int64_t)r, (int64_t)h};
                kvm_tensor_write_f32(t, kvm_tensor_row_offset(t, idx), rows + (r * H + h) * D, D);
            }
        }
    }
}

/* A mapped agent's blocks are read from its file while the rows are
 * written, and a read can fail half way (the file shrank): every selected
 * row's bytes are read first, as stored (half of f32 for f16, an eighth for
 * Q4), and the gather decodes them from memory into the caller's tensors
 * only once every read succeeded. The buffer is the CPU backend's cache:
 * fresh pages each call (faulted in and zeroed by the kernel) cost more than
 * the gather. */
typedef struct fetched {
    const kvm_gather_desc *d;
    unsigned char *buf;
    size_t run[2];        /* bytes of one (which, layer, head) run of a full block, 64-byte multiples; 0: not needed */
    size_t *seg_off;      /* [n_blocks]: each block's runs, K's [L][H] then V's */
    atomic_int failed;    /* the first failed read's status (also noted for kvm_mapped_check), 0: none */
} fetched;

static unsigned char *run_at(const fetched *f, int32_t seg, int which, int32_t l, int32_t h) {
    const kvmem_pool *p = f->d->pool;
    const size_t LH = (size_t)p->spec.n_layers * (size_t)p->spec.n_kv_heads;
    const size_t g = (size_t)l * (size_t)p->spec.n_kv_heads + (size_t)h;
    return f->buf + f->seg_off[seg] + (which ? LH * f->run[0] : 0) + g * f->run[which];
}

/* Items (block, layer): every needed run of that layer of the block. */
static void fetch_task(void *arg, size_t b, size_t e) {
    fetched *f = arg;
    const kvmem_pool *p = f->d->pool;
    const size_t L = (size_t)p->spec.n_layers;
    for (size_t it = b; it < e && !atomic_load(&f->failed); it++) {
        const int32_t seg = (int32_t)(it / L), l = (int32_t)(it % L);
        const kvm_block *blk = &f->d->mem->blocks[f->d->blocks[seg]];
        kvmem_status st;
        for (int which = 0; which < 2; which++)
            for (int32_t h = 0; f->run[which] && h < p->spec.n_kv_heads; h++)
                if ((st = kvm_mapped_fetch(p, blk, which, l, h, 0, blk->n_tokens, run_at(f, seg, which, l, h))) != KVMEM_OK) {
                    int none = 0;
                    atomic_compare_exchange_strong(&f->failed, &none, (int)st);
                    return;
                }
    }
}

static void read_fetched(void *ctx, int32_t seg, int which, int32_t l, int32_t h, float *dst) {
    const fetched *f = ctx;
    const kvm_block *blk = &f->d->mem->blocks[f->d->blocks[seg]];
    kvm_mapped_decode(f->d->pool, which, blk->n_tokens, run_at(f, seg, which, l, h), dst);
}

static kvmem_status gather_fetched(kvmem_backend *be, const kvm_gather_desc *d, const char *fn) {
    const kvmem_pool *p = d->pool;
    const size_t LH = (size_t)p->spec.n_layers * (size_t)p->spec.n_kv_heads;
    fetched f;
    memset(&f, 0, sizeof f);
    f.d = d;
    atomic_init(&f.failed, 0);
    for (int which = 0; which < 2; which++)
        if (which ? d->v_out != NULL : d->k_out != NULL)
            f.run[which] = (kvm_mapped_run_bytes(p, which, p->params.block_size) + 63) / 64 * 64;
    /* sealed blocks hold block_size tokens at most: runs sized for a full one fit any */
    size_t per_block = 0, bytes = 0;
    if (!kvm_mul_size(LH, f.run[0] + f.run[1], &per_block) || !kvm_mul_size(per_block, (size_t)d->n_blocks, &bytes))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %d blocks too large to read ahead", fn, d->n_blocks);
    f.seg_off = kvm_malloc(((size_t)d->n_blocks + 1) * sizeof *f.seg_off);
    kvm_scratch *scr = kvm_cpu_backend_scratch(be);
    f.buf = kvm_scratch_take(scr, bytes ? bytes : 64);
    if (!f.seg_off || !f.buf) {
        kvm_free(f.seg_off);
        kvm_scratch_give(scr, f.buf);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for %zu bytes of the selected blocks' rows", fn, bytes);
    }
    for (int32_t i = 0; i < d->n_blocks; i++) f.seg_off[i] = (size_t)i * per_block;
    kvm_parallel_for(kvm_cpu_backend_tp(be), (size_t)d->n_blocks * (size_t)p->spec.n_layers, 1, fetch_task, &f);
    kvmem_status st = kvm_mapped_check(d->mem, KVMEM_OK, fn);
    if (st == KVMEM_OK && atomic_load(&f.failed)) /* the note was taken by another call's check meanwhile */
        st = kvm_fail((kvmem_status)atomic_load(&f.failed), "%s: reading agent '%s' from its file failed", fn, d->mem->id);
    if (st == KVMEM_OK) st = cpu_gather_rows(be, d, &f, read_fetched);
    kvm_free(f.seg_off);
    kvm_scratch_give(scr, f.buf);
    return st;
}

static kvmem_status check_out(const kvmem_tensor *t, const char *what, const kvmem_model_spec *s, int64_t M) {
    const char *dims = "[n_layers][M][n_kv_heads][head_dim]";
    if (t->ndim != 4 || t->shape[0] != s->n_layers || t->shape[1] != M || t->shape[2] != s->n_kv_heads ||
        t->shape[3] != s->head_dim)
        return kvm_fail(KVMEM_ERR_MISMATCH,
                        "kvmem_gather: %s must be %s = [%d][%lld][%d][%d] for these blocks and the pool's model spec",
                        what, dims, s->n_layers, (long long)M, s->n_kv_heads, s->head_dim);
    int64_t shape[4] = {s->n_layers, M, s->n_kv_heads, s->head_dim};
    return kvm_tensor_expect(t, what, dims, 4, shape);
}

static kvmem_status gather_taken(kvmem_agent *agent, const int32_t *blocks, int32_t n_blocks, int64_t base,
                          const kvmem_tensor *k_out, const kvmem_tensor *v_out, kvm_devt *dev) {
    kvmem_status st = kvm_agent_check(agent, "kvmem_gather");
    if (st != KVMEM_OK) return st;
    const kvmem_pool *p = agent->pool;
    const kvm_agent_mem *m = agent->mem;
    if (n_blocks < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_gather: n_blocks %d < 0", n_blocks);
    if (n_blocks > 0 && !blocks) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_gather: blocks is NULL");
    if (base < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_gather: base_position %lld < 0", (long long)base);
    int64_t *first = kvm_malloc(((size_t)n_blocks + 1) * sizeof *first);
    if (!first) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_gather: out of memory for the offsets of %d blocks", n_blocks);
    first[0] = 0;
    for (int32_t i = 0; i < n_blocks; i++) {
        if (blocks[i] < 0 || blocks[i] >= m->n_sealed) {
            kvm_free(first);
            if (blocks[i] == m->n_sealed && m->tail_n > 0)
                return kvm_fail(KVMEM_ERR_NOT_FOUND,
                                "kvmem_gather: blocks[%d] = %d is the unsealed tail of agent '%s': call kvmem_agent_flush first",
                                i, blocks[i], m->id);
            return kvm_fail(KVMEM_ERR_NOT_FOUND, "kvmem_gather: blocks[%d] = %d is not a sealed block of agent '%s' (%d sealed)",
                            i, blocks[i], m->id, m->n_sealed);
        }
        first[i + 1] = first[i] + m->blocks[blocks[i]].n_tokens;
    }
    const int64_t M = first[n_blocks];
    if (base > INT32_MAX - M) {
        kvm_free(first);
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_gather: positions %lld + %lld tokens exceed 2^31 - 1", (long long)base,
                        (long long)M);
    }
    if ((k_out && (st = check_out(k_out, "k_out", &p->spec, M)) != KVMEM_OK) ||
        (v_out && (st = check_out(v_out, "v_out", &p->spec, M)) != KVMEM_OK)) {
        kvm_free(first);
        return st;
    }
    kvm_gather_desc d = {p, m, blocks, n_blocks, first, base, k_out, v_out, dev ? &dev[0] : NULL, dev ? &dev[1] : NULL};
    /* the router's choice: a device's gather (the buffer-level form), else
     * the CPU's over the blocks in place */
    kvm_dev_gather_args shape;
    memset(&shape, 0, sizeof shape);
    shape.n_src = shape.n_out = (size_t)KVM_MAX(M, 1);
    shape.n_heads = (size_t)p->spec.n_kv_heads;
    shape.head_dim = (size_t)p->spec.head_dim;
    shape.rotary_dim = (size_t)p->rope.rotary_dim;
    shape.gptj = p->rope.style == KVMEM_ROPE_GPTJ;
    shape.attn_factor = (float)p->rope.attn_factor;
    kvmem_backend *cpu = p->ctx->cpu, *be = kvm_route(p->ctx, KVM_OP_GATHER_ROPE, &shape);
    st = be != cpu ? kvm_dev_gather(be, &d) : KVMEM_OK;
    if (be == cpu || kvm_route_to_cpu(st)) st = m->mapped ? gather_fetched(cpu, &d, "kvmem_gather") : kvm_cpu_gather(cpu, &d);
    kvm_free(first);
    return kvm_mapped_check(m, st, "kvmem_gather");
}

/* Outputs in device memory (kvmem.h, "Device tensors"): the device gather
 * writes those it can in place (dev_route.c); the rest take the host path
 * into a host copy, written back once everything succeeded. */
static kvmem_status gather_device_out(kvmem_agent *agent, const int32_t *blocks, int32_t n_blocks, int64_t base,
                                      const kvmem_tensor *k_out, const kvmem_tensor *v_out) {
    static const char *fn = "kvmem_gather";
    kvmem_status st = kvm_agent_check(agent, fn);
    if (st != KVMEM_OK) return st;
    kvm_devt dev[2];
    memset(dev, 0, sizeof dev);
    kvmem_context *ctx = agent->pool->ctx;
    if ((st = kvm_devt_open(ctx, k_out, fn, "k_out", &dev[0])) == KVMEM_OK &&
        (st = kvm_devt_open(ctx, v_out, fn, "v_out", &dev[1])) == KVMEM_OK)
        st = gather_taken(agent, blocks, n_blocks, base, kvm_devt_view(&dev[0]), kvm_devt_view(&dev[1]), dev);
    for (int x = 0; x < 2 && st == KVMEM_OK; x++)
        if (!dev[x].in_place) st = kvm_devt_write(&dev[x], fn);
    kvm_devt_close_all(dev, 2);
    return st;
}

kvmem_status kvmem_gather(kvmem_agent *agent, const int32_t *blocks, int32_t n_blocks, int64_t base,
                          const kvmem_tensor *k_out, const kvmem_tensor *v_out) {
    kvmem_status st = kvm_agent_enter(agent, "kvmem_gather");
    if (st != KVMEM_OK) return st;
    st = kvm_devt_is_device(k_out) || kvm_devt_is_device(v_out)
             ? gather_device_out(agent, blocks, n_blocks, base, k_out, v_out)
             : gather_taken(agent, blocks, n_blocks, base, k_out, v_out, NULL);
    kvm_agent_leave(agent);
    return st;
}
