/* Batch merge/extract: several agents' memory in one left-padded batched
 * layout [B][n_kv_heads][max_len][head_dim], one layer per call. */
#include "../pool/pool.h"
#include "../cpu/tensor.h"

#include <stdlib.h>
#include <string.h>

static kvmem_status batch_merge(kvmem_agent *const *agents, int32_t B, int32_t layer, const kvmem_tensor *k_out,
                               const kvmem_tensor *v_out, int64_t *lengths) {
    if (!agents || !lengths) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_batch_merge: %s is NULL", agents ? "lengths" : "agents");
    if (B < 1) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_batch_merge: %d agents: need at least 1", B);
    kvmem_status st;
    for (int32_t b = 0; b < B; b++) {
        if ((st = kvm_agent_check(agents[b], "kvmem_batch_merge")) != KVMEM_OK) return st;
        if (agents[b]->pool != agents[0]->pool)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_batch_merge: agent %d is in another pool than agent 0", b);
        for (int32_t c = 0; c < b; c++)
            if (agents[c] == agents[b]) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_batch_merge: agent %d is given twice", b);
    }
    const kvmem_pool *p = agents[0]->pool;
    const int32_t H = p->spec.n_kv_heads, D = p->spec.head_dim;
    if (layer < 0 || layer >= p->spec.n_layers)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_batch_merge: layer %d outside [0, %d)", layer, p->spec.n_layers);
    const kvmem_tensor *any = k_out ? k_out : v_out;
    if (!any) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_batch_merge: k_out and v_out are both NULL");
    if (any->ndim != 4) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_batch_merge: outputs must be [B][n_kv_heads][max_len][head_dim]");
    int64_t max_len = any->shape[2], longest = 0;
    for (int32_t b = 0; b < B; b++) longest = KVM_MAX(longest, agents[b]->mem->n_tokens);
    if (max_len < longest)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_batch_merge: max_len %lld is shorter than the longest agent (%lld tokens)",
                        (long long)max_len, (long long)longest);
    const char *dims = "[B][n_kv_heads][max_len][head_dim]";
    int64_t shape[4] = {B, H, max_len, D};
    if (k_out && (st = kvm_tensor_expect(k_out, "k_out", dims, 4, shape)) != KVMEM_OK) return st;
    if (v_out && (st = kvm_tensor_expect(v_out, "v_out", dims, 4, shape)) != KVMEM_OK) return st;
    float *rows = kvm_malloc((size_t)p->params.block_size * (size_t)D * sizeof(float));
    float *zero = kvm_calloc((size_t)D, sizeof(float));
    if (!rows || !zero) {
        kvm_free(rows);
        kvm_free(zero);
        return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_batch_merge: out of memory for %d rows of staging", p->params.block_size);
    }
    for (int32_t b = 0; b < B; b++) {
        const kvm_agent_mem *m = agents[b]->mem;
        int64_t pad = max_len - m->n_tokens;
        for (int which = 0; which < 2; which++) {
            const kvmem_tensor *o = which ? v_out : k_out;
            if (!o) continue;
            for (int32_t h = 0; h < H; h++) {
                int64_t idx[3] = {b, h, 0};
                for (int64_t t = 0; t < pad; t++) {
                    idx[2] = t;
                    kvm_tensor_write_f32(o, kvm_tensor_row_offset(o, idx), zero, (size_t)D);
                }
                int64_t pos = pad;
                for (int32_t blk = 0; blk < m->n_sealed; blk++) {
                    const kvm_block *bk = &m->blocks[blk];
                    kvm_block_read_f32(p, bk, which, layer, h, 0, bk->n_tokens, rows);
                    for (int32_t t = 0; t < bk->n_tokens; t++, pos++) {
                        idx[2] = pos;
                        kvm_tensor_write_f32(o, kvm_tensor_row_offset(o, idx), rows + (size_t)t * (size_t)D, (size_t)D);
                    }
                }
                if (m->tail_n) {
                    const float *tr = kvm_tail_rows(p, m, which, layer, h);
                    for (int32_t t = 0; t < m->tail_n; t++, pos++) {
                        idx[2] = pos;
                        kvm_tensor_write_f32(o, kvm_tensor_row_offset(o, idx), tr + (size_t)t * (size_t)D, (size_t)D);
                    }
                }
            }
        }
        lengths[b] = m->n_tokens;
    }
    kvm_free(rows);
    kvm_free(zero);
    st = KVMEM_OK;
    for (int32_t b = 0; b < B; b++) /* every agent's note is cleared; the first failure is returned */
        st = kvm_mapped_check(agents[b]->mem, st, "kvmem_batch_merge");
    return st;
}

kvmem_status kvmem_batch_merge(kvmem_agent *const *agents, int32_t B, int32_t layer, const kvmem_tensor *k_out,
                               const kvmem_tensor *v_out, int64_t *lengths) {
    /* every agent is taken for the call; one given twice is taken once (and
     * refused by the checks inside) */
    int32_t taken = 0;
    kvmem_status st = KVMEM_OK;
    for (; agents && taken < B; taken++) {
        int dup = 0;
        for (int32_t c = 0; c < taken; c++) dup |= agents[c] == agents[taken];
        if (!dup && (st = kvm_agent_enter(agents[taken], "kvmem_batch_merge")) != KVMEM_OK) break;
    }
    if (st == KVMEM_OK) st = batch_merge(agents, B, layer, k_out, v_out, lengths);
    for (int32_t b = 0; b < taken; b++) {
        int dup = 0;
        for (int32_t c = 0; c < b; c++) dup |= agents[c] == agents[b];
        if (!dup) kvm_agent_leave(agents[b]);
    }
    return st;
}

kvmem_status kvmem_batch_extract(const kvmem_tensor *batch, int32_t row, int64_t length, int64_t first, int64_t n,
                                 const kvmem_tensor *out) {
    if (!batch || !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_batch_extract: %s is NULL", batch ? "out" : "batch");
    if (batch->ndim != 4) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_batch_extract: batch must be [B][n_kv_heads][max_len][head_dim]");
    kvmem_status st = kvm_tensor_expect(batch, "batch", "[B][n_kv_heads][max_len][head_dim]", 4, batch->shape);
    if (st != KVMEM_OK) return st;
    int64_t B = batch->shape[0], H = batch->shape[1], max_len = batch->shape[2], D = batch->shape[3];
    if (B < 0 || H < 0 || max_len < 0 || D < 1)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_batch_extract: batch shape must be non-negative with head_dim >= 1");
    if (row < 0 || row >= B) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_batch_extract: row %d outside [0, %lld)", row, (long long)B);
    if (length < 0 || length > max_len)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_batch_extract: length %lld outside [0, %lld]", (long long)length, (long long)max_len);
    if (first < 0 || n < 0 || first > length || n > length - first)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_batch_extract: %lld tokens from %lld outside the row's %lld", (long long)n,
                        (long long)first, (long long)length); /* first + n may overflow: not formed */
    if (D > 4096) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_batch_extract: head_dim %lld too large", (long long)D);
    int64_t oshape[3] = {n, H, D};
    if ((st = kvm_tensor_expect(out, "out", "[n][n_kv_heads][head_dim]", 3, oshape)) != KVMEM_OK) return st;
    float row_buf[4096];
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < H; h++) {
            int64_t bi[3] = {row, h, max_len - length + first + t}, oi[2] = {t, h};
            kvm_tensor_read_f32(batch, kvm_tensor_row_offset(batch, bi), row_buf, (size_t)D);
            kvm_tensor_write_f32(out, kvm_tensor_row_offset(out, oi), row_buf, (size_t)D);
        }
    return KVMEM_OK;
}
