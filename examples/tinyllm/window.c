/* tinyllm: the model's window over a history longer than it (beyond.h):
 * history rows re-encoded at contiguous positions, and the engine's own
 * context for new text once the history no longer fits. */
#include <stdlib.h>
#include <string.h>

#include "beyond.h"
#include "internal.h"

int tl_window_put_tokens(tl_history *h, int64_t first, int64_t n, int32_t base, tl_kv *kv, char *err,
                         size_t err_size) {
    if (n <= 0) return 0;
    if (first < 0 || first + n > h->n || base < 0)
        return tl_errf(err, err_size, "window: tokens [%lld, %lld) of a %lld-token history at %d", (long long)first,
                       (long long)(first + n), (long long)h->n, base);
    if (n > kv->cap - kv->n) return tl_errf(err, err_size, "window: %lld rows do not fit", (long long)n);
    size_t sz = (size_t)h->n_layers * (size_t)n * (size_t)h->kv_dim;
    float *k = malloc(sz * sizeof(float)), *v = malloc(sz * sizeof(float));
    int32_t *pos = malloc((size_t)n * sizeof(int32_t));
    int rc = 0;
    if (!k || !v || !pos) {
        rc = tl_errf(err, err_size, "out of memory");
        goto out;
    }
    for (int64_t i = 0; i < n; i++) pos[i] = base + (int32_t)i;
    if ((rc = tl_history_read_raw(h, first, n, k, v, err, err_size)) != 0) goto out;
    if ((rc = tl_history_rotate(h, k, n, pos, err, err_size)) != 0) goto out;
    tl_kv_append(kv, k, v, (int32_t)n, pos);
out:
    free(k);
    free(v);
    free(pos);
    return rc;
}

int tl_window_put_blocks(tl_history *h, const int32_t *blocks, int32_t n, int32_t base, tl_kv *kv, char *err,
                         size_t err_size) {
    if (n <= 0) return 0;
    int64_t M = 0;
    for (int32_t i = 0; i < n; i++) {
        kvmem_block_info bi;
        if (kvmem_agent_block_info(h->agent, blocks[i], &bi) != KVMEM_OK || !bi.sealed)
            return tl_errf(err, err_size, "window: block %d is not a sealed block", blocks[i]);
        M += bi.n_tokens;
    }
    if (M > kv->cap - kv->n) return tl_errf(err, err_size, "window: %lld rows do not fit", (long long)M);
    size_t sz = (size_t)h->n_layers * (size_t)M * (size_t)h->kv_dim;
    float *k = malloc(sz * sizeof(float)), *v = malloc(sz * sizeof(float));
    int32_t *pos = malloc((size_t)M * sizeof(int32_t));
    int rc = 0;
    if (!k || !v || !pos) {
        rc = tl_errf(err, err_size, "out of memory");
        goto out;
    }
    kvmem_tensor kt, vt;
    int64_t shape[4] = {h->n_layers, M, h->n_kv_heads, h->head_dim};
    kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape);
    kvmem_status st = kvmem_gather(h->agent, blocks, n, base, &kt, &vt);
    if (st != KVMEM_OK) {
        rc = tl_errf(err, err_size, "gather: %s: %s", kvmem_status_str(st), kvmem_last_error());
        goto out;
    }
    for (int64_t i = 0; i < M; i++) pos[i] = base + (int32_t)i;
    tl_kv_append(kv, k, v, (int32_t)M, pos);
out:
    free(k);
    free(v);
    free(pos);
    return rc;
}

int32_t tl_history_blocks_before(tl_history *h, int64_t tok) {
    kvmem_agent_info ai;
    if (kvmem_agent_get_info(h->agent, &ai) != KVMEM_OK) return 0;
    int32_t b = 0;
    for (; b < ai.n_sealed; b++) {
        kvmem_block_info bi;
        if (kvmem_agent_block_info(h->agent, b, &bi) != KVMEM_OK || bi.first_token + bi.n_tokens > tok) break;
    }
    return b;
}

int32_t tl_history_block_of(tl_history *h, int64_t tok) {
    kvmem_agent_info ai;
    if (tok < 0 || kvmem_agent_get_info(h->agent, &ai) != KVMEM_OK) return -1;
    for (int32_t b = 0; b < ai.n_blocks; b++) {
        kvmem_block_info bi;
        if (kvmem_agent_block_info(h->agent, b, &bi) != KVMEM_OK) return -1;
        if (tok >= bi.first_token && tok < bi.first_token + bi.n_tokens) return b;
    }
    return -1;
}

/* Rotate query rows [T][L][n_heads][head_dim] (raw) to positions pos[T]. */
static int rotate_queries(tl_history *h, float *q, int32_t T, const int32_t *pos, char *err, size_t err_size) {
    size_t per = (size_t)h->n_layers * (size_t)h->n_heads, rows = (size_t)T * per;
    int32_t *p = malloc(rows * sizeof(int32_t));
    if (!p) return tl_errf(err, err_size, "out of memory");
    for (size_t r = 0; r < rows; r++) p[r] = pos[r / per];
    kvmem_status st = kvmem_rope_apply(&h->spec, q, rows, (size_t)h->head_dim, p, 0);
    free(p);
    return st == KVMEM_OK ? 0 : tl_errf(err, err_size, "rope: %s", kvmem_last_error());
}

int tl_history_ingest(tl_history *h, const tl_model *m, tl_state *s, const int32_t *tokens, int32_t n,
                      int32_t sink, int32_t prompt_len, char *err, size_t err_size) {
    const tl_config *c = &m->cfg;
    int32_t W = c->seq_len, C = tl_state_max_chunk(s) < W / 2 ? tl_state_max_chunk(s) : W / 2;
    int32_t L = c->n_layers, d = c->dim;
    size_t kvd = (size_t)h->kv_dim;
    if (n < 0 || sink < 0 || sink >= W / 2 || C < 1)
        return tl_errf(err, err_size, "ingest: bad arguments (n %d, sink %d, chunk %d)", n, sink, C);
    if (h->n + n > h->cap)
        return tl_errf(err, err_size, "ingest: %lld + %d tokens exceed the history's %lld", (long long)h->n, n,
                       (long long)h->cap);
    tl_kv kv;
    float *kc = malloc((size_t)L * (size_t)C * kvd * sizeof(float));
    float *vc = malloc((size_t)L * (size_t)C * kvd * sizeof(float));
    float *q = malloc((size_t)C * (size_t)L * (size_t)d * sizeof(float));
    float *att = malloc((size_t)W * sizeof(float));
    float *acc = malloc((size_t)h->cap * sizeof(float));
    int32_t *pos = malloc((size_t)C * sizeof(int32_t)), *own = malloc((size_t)C * sizeof(int32_t));
    int64_t *src = malloc((size_t)W * sizeof(int64_t)); /* history token of each working-set row */
    int rc = -1;
    memset(&kv, 0, sizeof kv);
    if (!kc || !vc || !q || !att || !acc || !pos || !own || !src || tl_kv_init(&kv, c, W)) {
        tl_errf(err, err_size, "out of memory");
        goto out;
    }
    for (int32_t done = 0; done < n;) {
        int32_t T = n - done < C ? n - done : C;
        int64_t N = h->n;
        kv.n = 0;
        int32_t base;
        if (N + T <= W) { /* it all fits: full context at the tokens' own positions */
            if (tl_window_put_tokens(h, 0, N, 0, &kv, err, err_size)) goto out;
            for (int64_t i = 0; i < N; i++) src[i] = i;
            base = (int32_t)N;
        } else { /* the sink, then the newest tokens that fill the window */
            int32_t sk = (int32_t)(sink < N ? sink : N), recent = W - T - sk;
            if (tl_window_put_tokens(h, 0, sk, 0, &kv, err, err_size) ||
                tl_window_put_tokens(h, N - recent, recent, sk, &kv, err, err_size))
                goto out;
            for (int32_t i = 0; i < sk; i++) src[i] = i;
            for (int32_t i = 0; i < recent; i++) src[sk + i] = N - recent + i;
            base = sk + recent;
        }
        int32_t ctx = kv.n;
        for (int32_t i = 0; i < T; i++) {
            pos[i] = base + i;
            own[i] = (int32_t)(N + i);
        }
        memset(att, 0, (size_t)W * sizeof(float));
        tl_trace tr = {0};
        tr.q_raw = q;
        tr.k_rot = kc;
        tr.v_out = vc;
        tr.attn_acc = att;
        if (tl_forward(m, s, &kv, tokens + done, T, pos, NULL, &tr, NULL, NULL)) {
            tl_errf(err, err_size, "ingest: %s", tl_state_error(s));
            goto out;
        }
        /* SnapKV and IntentKV score keys at their own positions: the queries too */
        if (rotate_queries(h, q, T, own, err, err_size)) goto out;
        memcpy(acc, h->acc, (size_t)N * sizeof(float));
        memset(acc + N, 0, (size_t)T * sizeof(float));
        for (int32_t r = 0; r < ctx; r++) acc[src[r]] += att[r];
        for (int32_t i = 0; i < T; i++) acc[N + i] += att[ctx + i];
        int32_t pl = prompt_len - done;
        pl = pl < 0 ? 0 : pl > T ? T : pl;
        if (tl_history_append_ex(h, kc, vc, T, pos, tokens + done, q, acc, pl, 0, err, err_size)) goto out;
        done += T;
    }
    rc = 0;
out:
    tl_kv_free(&kv);
    free(kc);
    free(vc);
    free(q);
    free(att);
    free(acc);
    free(pos);
    free(own);
    free(src);
    return rc;
}
