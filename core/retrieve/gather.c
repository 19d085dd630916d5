/* kvmem_gather: decoupled position re-encoding. Blocks are concatenated in
 * the caller's order and their raw keys rotated at contiguous new positions.
 * A bandwidth-bound op: the cos/sin table of the M new positions is built
 * once (in parallel), then every (block, layer) streams its K and V rows
 * through one decode -> rotate -> convert pass into the caller's tensors. */
#include "score.h"
#include "../tensor.h"

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

typedef struct gather_job {
    const kvm_gather_desc *d;
    const float *cs;
    atomic_int failed;
} gather_job;

/* Item = (block index i, layer l): all KV heads of that layer of the block.
 * A caller tensor whose rows of one head are adjacent (head-major: HF
 * caches, [n_kv_heads][M][head_dim] per layer) takes each head's n rows in
 * one convert-and-store from the block's own head-major rows. One whose
 * heads of a token are adjacent (contiguous [M][n_kv_heads][head_dim])
 * takes token rows of H * D elements, staged token-major. Any other
 * strides: one D row at a time. */
static void gather_task(void *arg, size_t b, size_t e) {
    gather_job *job = arg;
    const kvm_gather_desc *d = job->d;
    const kvmem_pool *p = d->pool;
    const size_t L = (size_t)p->spec.n_layers, D = (size_t)p->spec.head_dim, H = (size_t)p->spec.n_kv_heads;
    const size_t np = (size_t)p->rope.n_pairs, BS = (size_t)p->params.block_size;
    float *tmp = kvm_aligned_alloc(BS * D * sizeof(float)), *stage = kvm_aligned_alloc(BS * H * D * sizeof(float));
    if (!tmp || !stage) {
        atomic_store(&job->failed, 1);
        kvm_aligned_free(tmp);
        kvm_aligned_free(stage);
        return;
    }
    for (size_t it = b; it < e; it++) {
        const size_t i = it / L;
        const int32_t l = (int32_t)(it % L);
        const kvm_block *blk = &d->mem->blocks[d->blocks[i]];
        const size_t n = (size_t)blk->n_tokens;
        const int64_t row0 = d->first[i];
        for (int which = 0; which < 2; which++) {
            const kvmem_tensor *t = which ? d->v_out : d->k_out;
            if (!t) continue;
            const int rows_contig = t->strides[3] == 1 && t->strides[1] == (int64_t)D;
            const int heads_contig = !rows_contig && t->strides[3] == 1 && t->strides[2] == (int64_t)D;
            for (size_t h = 0; h < H; h++) {
                kvm_block_read_f32(p, blk, which, l, (int32_t)h, 0, blk->n_tokens, tmp);
                if (!which) kvm_rope_rotate_rows(&p->rope, tmp, n, D, job->cs + (size_t)row0 * 2 * np, 2 * np);
                if (rows_contig) {
                    int64_t idx[3] = {l, row0, (int64_t)h};
                    kvm_tensor_write_f32(t, kvm_tensor_row_offset(t, idx), tmp, n * D);
                } else if (heads_contig) {
                    for (size_t r = 0; r < n; r++) memcpy(stage + (r * H + h) * D, tmp + r * D, D * sizeof(float));
                } else {
                    for (size_t r = 0; r < n; r++) {
                        int64_t idx[3] = {l, row0 + (int64_t)r, (int64_t)h};
                        kvm_tensor_write_f32(t, kvm_tensor_row_offset(t, idx), tmp + r * D, D);
                    }
                }
            }
            for (size_t r = 0; heads_contig && r < n; r++) {
                int64_t idx[3] = {l, row0 + (int64_t)r, 0};
                kvm_tensor_write_f32(t, kvm_tensor_row_offset(t, idx), stage + r * H * D, H * D);
            }
        }
    }
    kvm_aligned_free(tmp);
    kvm_aligned_free(stage);
}

kvmem_status kvm_cpu_gather(kvmem_backend *be, const kvm_gather_desc *d) {
    const kvmem_pool *p = d->pool;
    const int64_t M = d->first[d->n_blocks];
    if (M == 0) return KVMEM_OK;
    kvm_threadpool *tp = be && be->ctx ? be->ctx->tp : NULL;
    gather_job job;
    memset(&job, 0, sizeof job);
    job.d = d;
    atomic_init(&job.failed, 0);
    float *cs = NULL;
    if (d->k_out) {
        const size_t np = (size_t)p->rope.n_pairs;
        cs = kvm_aligned_alloc((size_t)M * 2 * (np ? np : 1) * sizeof(float));
        if (!cs) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_gather: out of memory for %lld positions", (long long)M);
        cs_job cj = {&p->rope, d->base, cs};
        kvm_parallel_for(tp, (size_t)M, 256, cs_task, &cj);
    }
    job.cs = cs;
    kvm_parallel_for(tp, (size_t)d->n_blocks * (size_t)p->spec.n_layers, 1, gather_task, &job);
    kvm_aligned_free(cs);
    if (atomic_load(&job.failed)) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_gather: out of memory for per-thread staging rows");
    return KVMEM_OK;
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
                          const kvmem_tensor *k_out, const kvmem_tensor *v_out) {
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
    kvm_gather_desc d = {p, m, blocks, n_blocks, first, base, k_out, v_out};
    kvmem_backend *dev = p->ctx->backend, *be = p->ctx->cpu;
    if (dev && dev != be && dev->iface->dev_gather_rope) st = kvm_dev_gather(dev, &d);
    else st = kvm_cpu_gather(be, &d);
    kvm_free(first);
    return kvm_mapped_check(m, st, "kvmem_gather");
}

kvmem_status kvmem_gather(kvmem_agent *agent, const int32_t *blocks, int32_t n_blocks, int64_t base,
                          const kvmem_tensor *k_out, const kvmem_tensor *v_out) {
    kvmem_status st = kvm_agent_enter(agent, "kvmem_gather");
    if (st != KVMEM_OK) return st;
    st = gather_taken(agent, blocks, n_blocks, base, k_out, v_out);
    kvm_agent_leave(agent);
    return st;
}
