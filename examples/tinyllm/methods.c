/* tinyllm: the agent's history in kvmem, and the working set each memory
 * method builds from it for a new turn. History token j always sits at RoPE
 * position j (that is how the engine appends it). */
#define KVMEM_EXPERIMENTAL /* the eviction baselines (kvmem.h) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define KCHECK(call, what)                                                \
    do {                                                                  \
        kvmem_status st_ = (call);                                        \
        if (st_ != KVMEM_OK) {                                            \
            rc = tl_errf(err, err_size, "%s: %s: %s", what,              \
                         kvmem_status_str(st_), kvmem_last_error());      \
            goto done;                                                    \
        }                                                                 \
    } while (0)

int tl_history_init(tl_history *h, kvmem_context *ctx, const tl_model *m, int64_t cap,
                    kvmem_dtype storage, int32_t block_size, const char *agent_id, char *err,
                    size_t err_size) {
    memset(h, 0, sizeof *h);
    int rc = 0;
    h->ctx = ctx;
    h->spec = tl_model_spec(m);
    h->n_layers = m->cfg.n_layers;
    h->n_heads = m->cfg.n_heads;
    h->n_kv_heads = m->cfg.n_kv_heads;
    h->head_dim = m->cfg.head_dim;
    h->kv_dim = m->cfg.n_kv_heads * m->cfg.head_dim;
    h->q_dim = m->cfg.dim;
    h->block_size = block_size;
    h->cap = cap;
    snprintf(h->agent_id, sizeof h->agent_id, "%s", agent_id);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = block_size;
    pp.storage_dtype = storage;
    KCHECK(kvmem_pool_create(ctx, &h->spec, &pp, &h->pool), "pool");
    KCHECK(kvmem_agent_open(h->pool, agent_id, &h->agent), "agent");
    h->acc = calloc((size_t)cap, sizeof(float));
    h->q_rot = calloc((size_t)cap * (size_t)h->n_layers * (size_t)h->q_dim, sizeof(float));
    h->qmem = calloc((size_t)h->n_layers * (size_t)h->q_dim, sizeof(float));
    if (!h->acc || !h->q_rot || !h->qmem) {
        rc = tl_errf(err, err_size, "history: out of memory");
        goto done;
    }
#ifdef TINYLLM_HAVE_EVICT
    {
        kvmem_qmem_store *qs;
        KCHECK(kvmem_qmem_store_create(&h->spec, NULL, &qs), "qmem store");
        h->qstore = qs;
    }
#endif
done:
    if (rc) tl_history_free(h);
    return rc;
}

void tl_history_free(tl_history *h) {
    if (!h) return;
    if (h->agent) kvmem_agent_close(h->agent);
    kvmem_pool_free(h->pool);
#ifdef TINYLLM_HAVE_EVICT
    kvmem_qmem_store_free((kvmem_qmem_store *)h->qstore);
#endif
    free(h->acc);
    free(h->q_rot);
    free(h->qmem);
    memset(h, 0, sizeof *h);
}

int tl_history_append(tl_history *h, const float *k_rot, const float *v, int32_t T,
                      const int32_t *positions, const int32_t *tokens, const float *q_rot,
                      const float *acc, int32_t prompt_len, char *err, size_t err_size) {
    return tl_history_append_ex(h, k_rot, v, T, positions, tokens, q_rot, acc, prompt_len, 1, err, err_size);
}

int tl_history_append_ex(tl_history *h, const float *k_rot, const float *v, int32_t T,
                         const int32_t *positions, const int32_t *tokens, const float *q_rot,
                         const float *acc, int32_t prompt_len, int flush, char *err, size_t err_size) {
    int rc = 0;
    if (T < 1 || h->n + T > h->cap) return tl_errf(err, err_size, "history: %d tokens do not fit", T);
    kvmem_tensor kt, vt;
    int64_t shape[4] = {h->n_layers, T, h->n_kv_heads, h->head_dim};
    kvmem_tensor_init(&kt, (void *)(uintptr_t)k_rot, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&vt, (void *)(uintptr_t)v, KVMEM_F32, 4, shape);
    kvmem_append_params ap = kvmem_append_default_params();
    ap.token_ids = tokens;
    ap.positions = positions;
    ap.keys_rotated = 1;
    KCHECK(kvmem_agent_append(h->agent, &kt, &vt, &ap), "append");
    if (flush) KCHECK(kvmem_agent_flush(h->agent), "flush");
    size_t qrow = (size_t)h->n_layers * (size_t)h->q_dim;
    if (q_rot) memcpy(h->q_rot + (size_t)h->n * qrow, q_rot, (size_t)T * qrow * sizeof(float));
    if (acc) memcpy(h->acc, acc, (size_t)(h->n + T) * sizeof(float));
#ifdef TINYLLM_HAVE_EVICT
    if (prompt_len > 0 && q_rot) {
        kvmem_session_key key;
        kvmem_session_source src;
        memset(&src, 0, sizeof src);
        src.session_id = h->agent_id;
        KCHECK(kvmem_session_key_derive((kvmem_qmem_store *)h->qstore, &src, &key), "session key");
        kvmem_tensor qt;
        int64_t qs[4] = {T, h->n_layers, h->n_heads, h->head_dim};
        kvmem_tensor_init(&qt, (void *)(uintptr_t)q_rot, KVMEM_F32, 4, qs);
        KCHECK(kvmem_qmem_update((kvmem_qmem_store *)h->qstore, &key, &qt, 0,
                                 prompt_len < T ? prompt_len : T, h->qmem),
               "qmem update");
        h->have_qmem = 1;
    }
#else
    (void)prompt_len;
#endif
    h->n += T;
done:
    return rc;
}

int tl_history_save(tl_history *h, const char *path, char *err, size_t err_size) {
#ifdef TINYLLM_HAVE_PERSIST
    int rc = 0;
    KCHECK(kvmem_agent_save(h->agent, path), "save");
done:
    return rc;
#else
    (void)h;
    (void)path;
    return tl_errf(err, err_size, "persistence is not in this build");
#endif
}

int tl_history_load(tl_history *h, const char *path, char *err, size_t err_size) {
#ifdef TINYLLM_HAVE_PERSIST
    int rc = 0;
    kvmem_agent_info info;
    KCHECK(kvmem_agent_load(h->agent, path), "load");
    KCHECK(kvmem_agent_get_info(h->agent, &info), "agent info");
    if (info.n_tokens > h->cap) {
        rc = tl_errf(err, err_size, "load: %lld tokens, room for %lld", (long long)info.n_tokens,
                     (long long)h->cap);
        goto done;
    }
    h->n = info.n_tokens;
    memset(h->acc, 0, (size_t)h->cap * sizeof(float));
    memset(h->q_rot, 0, (size_t)h->cap * (size_t)h->n_layers * (size_t)h->q_dim * sizeof(float));
done:
    return rc;
#else
    (void)h;
    (void)path;
    return tl_errf(err, err_size, "persistence is not in this build");
#endif
}

int32_t tl_method_list(tl_method *out, int32_t cap, char *missing, size_t missing_size) {
    tl_method all[32];
    int32_t n = 0;
    char miss[256] = "";
#define ADD(nm, k, md, nr, ag, a, pr)                                          \
    do {                                                                       \
        memset(&all[n], 0, sizeof all[n]);                                     \
        snprintf(all[n].name, sizeof all[n].name, "%s", nm);                   \
        all[n].kind = k;                                                       \
        all[n].mode = md;                                                      \
        all[n].norm = nr;                                                      \
        all[n].agg = ag;                                                       \
        all[n].art = a;                                                        \
        all[n].needs_probe = pr;                                               \
        n++;                                                                   \
    } while (0)
    ADD("full", TL_M_FULL, 0, 0, 0, 0, 0);
    ADD("recent", TL_M_RECENT, 0, 0, 0, 0, 0);
#ifdef TINYLLM_HAVE_EVICT
    ADD("streamingllm", TL_M_STREAMING, 0, 0, 0, 0, 0);
    ADD("h2o", TL_M_H2O, 0, 0, 0, 0, 0);
    ADD("snapkv", TL_M_SNAPKV, 0, 0, 0, 0, 0);
    ADD("intentkv-rule", TL_M_INTENTKV, 0, 0, 0, 0, 0);
#else
    strcat(miss, "StreamingLLM, H2O, SnapKV, IntentKV (eviction API not in this build); ");
#endif
#ifdef TINYLLM_HAVE_RETRIEVE
    /* MemArt as deployed: the live context (newest blocks) plus retrieved
     * blocks, re-encoded contiguously before it; variants change one thing. */
#define MEMART(nm, md, nr, ag, lf)                                                                   \
    do {                                                                                             \
        ADD(nm, TL_M_MEMART, md, nr, ag, 0, 1);                                                      \
        all[n - 1].local_frac = lf;                                                                  \
    } while (0)
    MEMART("memart", KVMEM_RETRIEVE_AABB, KVMEM_NORM_SOFTMAX, KVMEM_AGG_MAX, TL_MEMART_LOCAL_FRAC);
    MEMART("memart-sum", KVMEM_RETRIEVE_AABB, KVMEM_NORM_SOFTMAX, KVMEM_AGG_SUM, TL_MEMART_LOCAL_FRAC);
    MEMART("memart-rr", KVMEM_RETRIEVE_AABB, KVMEM_NORM_RR, KVMEM_AGG_MAX, TL_MEMART_LOCAL_FRAC);
    MEMART("memart-rr-sum", KVMEM_RETRIEVE_AABB, KVMEM_NORM_RR, KVMEM_AGG_SUM, TL_MEMART_LOCAL_FRAC);
    MEMART("memart-exact", KVMEM_RETRIEVE_EXACT, KVMEM_NORM_SOFTMAX, KVMEM_AGG_MAX, TL_MEMART_LOCAL_FRAC);
    MEMART("memart-origpos", KVMEM_RETRIEVE_AABB, KVMEM_NORM_SOFTMAX, KVMEM_AGG_MAX, TL_MEMART_LOCAL_FRAC);
    all[n - 1].orig_pos = 1;
    MEMART("memart-nolocal", KVMEM_RETRIEVE_AABB, KVMEM_NORM_SOFTMAX, KVMEM_AGG_MAX, 0.0f);
    MEMART("memart-reprobe16", KVMEM_RETRIEVE_AABB, KVMEM_NORM_SOFTMAX, KVMEM_AGG_MAX, TL_MEMART_LOCAL_FRAC);
    all[n - 1].reprobe = 16;
#else
    strcat(miss, "MemArt (retrieval API not in this build); ");
#endif
#ifdef TINYLLM_HAVE_ATTEND
    /* ART at kvmem's defaults (SCORED order, tiles of 16, patience 8), then
     * one change each: smaller tiles, half the patience, the RECENT order */
    ADD("art", TL_M_FULL, 0, 0, 0, 1, 0);
    ADD("art-tile8", TL_M_FULL, 0, 0, 0, 1, 0);
    all[n - 1].art_tile = 8;
    ADD("art-patience4", TL_M_FULL, 0, 0, 0, 1, 0);
    all[n - 1].art_patience = 4;
    ADD("art-recent", TL_M_FULL, 0, 0, 0, 1, 0);
    all[n - 1].art_order = KVMEM_ATTEND_RECENT + 1;
#ifdef TINYLLM_HAVE_RETRIEVE
    MEMART("memart+art", KVMEM_RETRIEVE_AABB, KVMEM_NORM_SOFTMAX, KVMEM_AGG_MAX, TL_MEMART_LOCAL_FRAC);
    all[n - 1].art = 1;
#endif
#ifdef TINYLLM_HAVE_EVICT
    ADD("intentkv-rule+art", TL_M_INTENTKV, 0, 0, 0, 1, 0);
#endif
#else
    strcat(miss, "ART (attend API not in this build); ");
#endif
#undef MEMART
#undef ADD
    if (missing && missing_size) snprintf(missing, missing_size, "%s", miss);
    int32_t k = n < cap ? n : cap;
    if (out) memcpy(out, all, (size_t)k * sizeof *out);
    return n;
}

/* Raw K, V of history tokens [first, first + T) as [L][T][kv_dim] f32. */
int tl_history_read_raw(tl_history *h, int64_t first, int64_t T, float *k, float *v, char *err,
                    size_t err_size) {
    int rc = 0;
    kvmem_tensor kt, vt;
    int64_t shape[4] = {h->n_layers, T, h->n_kv_heads, h->head_dim};
    kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape);
    KCHECK(kvmem_agent_read(h->agent, first, T, &kt, &vt), "read");
done:
    return rc;
}

/* Rotate raw keys [L][T][kv_dim] to the positions pos[T] in place. */
int tl_history_rotate(tl_history *h, float *k, int64_t T, const int32_t *pos, char *err, size_t err_size) {
    int rc = 0;
    size_t rows = (size_t)T * (size_t)h->n_kv_heads;
    int32_t *p = malloc(rows * sizeof(int32_t));
    if (!p) return tl_errf(err, err_size, "out of memory");
    for (int64_t t = 0; t < T; t++)
        for (int32_t e = 0; e < h->n_kv_heads; e++) p[t * h->n_kv_heads + e] = pos[t];
    for (int32_t l = 0; l < h->n_layers; l++)
        KCHECK(kvmem_rope_apply(&h->spec, k + (size_t)l * rows * (size_t)h->head_dim, rows,
                                (size_t)h->head_dim, p, 0),
               "rope");
done:
    free(p);
    return rc;
}

/* Put the history rows `kept` (ascending positions) into kv at their
 * original positions, or (reencode) at contiguous positions 0.. as a cache
 * that must fit the model's window does. k, v: raw [L][N][kv_dim] of the
 * whole history. */
static int put_kept(tl_history *h, const float *k, const float *v, const int32_t *kept,
                    int64_t n_kept, int reencode, tl_kv *kv, char *err, size_t err_size) {
    size_t kvd = (size_t)h->kv_dim, N = (size_t)h->n;
    float *kk = malloc((size_t)h->n_layers * (size_t)n_kept * kvd * sizeof(float) + 1);
    float *vv = malloc((size_t)h->n_layers * (size_t)n_kept * kvd * sizeof(float) + 1);
    int32_t *pos = malloc((size_t)n_kept * sizeof(int32_t) + 1);
    int rc = 0;
    if (!kk || !vv || !pos) {
        rc = tl_errf(err, err_size, "out of memory");
        goto out;
    }
    for (int32_t l = 0; l < h->n_layers; l++)
        for (int64_t i = 0; i < n_kept; i++) {
            memcpy(kk + ((size_t)l * (size_t)n_kept + (size_t)i) * kvd, k + ((size_t)l * N + (size_t)kept[i]) * kvd, kvd * sizeof(float));
            memcpy(vv + ((size_t)l * (size_t)n_kept + (size_t)i) * kvd, v + ((size_t)l * N + (size_t)kept[i]) * kvd, kvd * sizeof(float));
        }
    for (int64_t i = 0; i < n_kept; i++) pos[i] = reencode ? (int32_t)i : kept[i];
    if ((rc = tl_history_rotate(h, kk, n_kept, pos, err, err_size)) != 0) goto out;
    if (tl_kv_append(kv, kk, vv, (int32_t)n_kept, pos)) rc = tl_errf(err, err_size, "working set full");
out:
    free(kk);
    free(vv);
    free(pos);
    return rc;
}

/* History tokens [first, first + n) at their own positions, appended to kv. */
static int put_range(tl_history *h, int64_t first, int64_t n, tl_kv *kv, char *err, size_t err_size) {
    if (n <= 0) return 0;
    size_t sz = (size_t)h->n_layers * (size_t)n * (size_t)h->kv_dim;
    float *k = malloc(sz * sizeof(float)), *v = malloc(sz * sizeof(float));
    int32_t *pos = malloc((size_t)n * sizeof(int32_t));
    int rc = 0;
    if (!k || !v || !pos) {
        rc = tl_errf(err, err_size, "out of memory");
        goto out;
    }
    for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)(first + i);
    if ((rc = tl_history_read_raw(h, first, n, k, v, err, err_size)) != 0) goto out;
    if ((rc = tl_history_rotate(h, k, n, pos, err, err_size)) != 0) goto out;
    if (tl_kv_append(kv, k, v, (int32_t)n, pos)) rc = tl_errf(err, err_size, "working set full");
out:
    free(k);
    free(v);
    free(pos);
    return rc;
}

int tl_memory_recent(tl_history *h, int64_t n, tl_kv *kv, char *err, size_t err_size) {
    if (n > h->n) n = h->n;
    return put_range(h, h->n - n, n, kv, err, err_size);
}

int32_t tl_memart_local_blocks(tl_history *h, const tl_method *m, int64_t budget, int64_t *tokens) {
    *tokens = 0;
    kvmem_agent_info ai;
    if (m->local_frac <= 0 || budget <= 0 || kvmem_agent_get_info(h->agent, &ai) != KVMEM_OK) return 0;
    /* at least one block is left to retrieval */
    int64_t room = (int64_t)((double)budget * (double)m->local_frac);
    if (room > budget - h->block_size) room = budget - h->block_size;
    int32_t nl = 0;
    for (int32_t b = ai.n_sealed - 1; b >= 0; b--) {
        kvmem_block_info bi;
        if (kvmem_agent_block_info(h->agent, b, &bi) != KVMEM_OK || *tokens + bi.n_tokens > room) break;
        *tokens += bi.n_tokens;
        nl++;
    }
    return nl;
}

#ifdef TINYLLM_HAVE_RETRIEVE
static int build_memart(tl_history *h, const tl_method *m, int64_t budget, const float *probe_q_raw,
                        int32_t n_probe, int32_t turn_pos, tl_kv *kv, tl_build_info *info, char *err,
                        size_t err_size) {
    int rc = 0;
    kvmem_retrieval *r = NULL;
    float *k = NULL, *v = NULL;
    int32_t *pos = NULL;
    if (!probe_q_raw || n_probe < 1) return tl_errf(err, err_size, "MemArt needs the prompt's queries");
    /* The live context: the newest blocks stay, at their own positions, and
     * are not retrieval candidates; the rest of the budget is retrieved. */
    int64_t local = 0;
    int32_t n_local = tl_memart_local_blocks(h, m, budget, &local);
    kvmem_retrieve_params p = kvmem_retrieve_default_params();
    p.top_k = budget > 0 ? (int32_t)((budget - local) / h->block_size) : INT32_MAX / 2;
    p.skip_recent = n_local;
    p.mode = (kvmem_retrieve_mode)m->mode;
    p.norm = (kvmem_retrieve_norm)m->norm;
    p.agg = (kvmem_retrieve_agg)m->agg;
    int32_t recent_ids[64];
    if (m->keep_recent > 0) {
        kvmem_agent_info ai;
        KCHECK(kvmem_agent_get_info(h->agent, &ai), "agent info");
        int32_t nr = m->keep_recent < ai.n_sealed ? m->keep_recent : ai.n_sealed;
        if (nr > 64) nr = 64;
        if (nr > p.top_k) nr = p.top_k;
        for (int32_t i = 0; i < nr; i++) recent_ids[i] = ai.n_sealed - nr + i;
        p.always_include = recent_ids;
        p.n_always_include = nr;
    }
    kvmem_tensor qt;
    int64_t qs[4] = {n_probe, h->n_layers, h->n_heads, h->head_dim};
    kvmem_tensor_init(&qt, (void *)(uintptr_t)probe_q_raw, KVMEM_F32, 4, qs);
    KCHECK(kvmem_retrieval_create(&r), "retrieval");
    KCHECK(kvmem_retrieve(h->agent, &qt, &p, r), "retrieve");
    const int32_t *blocks;
    int32_t nb;
    int64_t M;
    KCHECK(kvmem_retrieval_get(r, 0, &blocks, NULL, &nb), "retrieval get");
    KCHECK(kvmem_retrieval_n_tokens(r, 0, &M), "retrieval tokens");
    if (info) {
        info->local_rows = local;
        info->retrieved_rows = M;
        info->n_blocks = nb < TL_MAX_BLOCKS ? nb : TL_MAX_BLOCKS;
        memcpy(info->blocks, blocks, (size_t)info->n_blocks * sizeof(int32_t));
    }
    if (M == 0) goto local_window;
    /* the retrieved memory ends where the local window (or the turn) starts */
    int64_t base = turn_pos - local - M;
    if (base < 0) base = 0;
    size_t n = (size_t)h->n_layers * (size_t)M * (size_t)h->kv_dim;
    k = malloc(n * sizeof(float));
    v = malloc(n * sizeof(float));
    pos = malloc((size_t)M * sizeof(int32_t));
    if (!k || !v || !pos) {
        rc = tl_errf(err, err_size, "out of memory");
        goto done;
    }
    kvmem_tensor kt, vt;
    int64_t shape[4] = {h->n_layers, M, h->n_kv_heads, h->head_dim};
    kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape);
    if (m->orig_pos) {
        /* one gather per block at its own first token: positions as stored */
        int64_t at = 0;
        for (int32_t b = 0; b < nb; b++) {
            kvmem_block_info bi;
            KCHECK(kvmem_agent_block_info(h->agent, blocks[b], &bi), "block info");
            kvmem_tensor kb = kt, vb = vt;
            kb.data = k + (size_t)at * (size_t)h->kv_dim;
            vb.data = v + (size_t)at * (size_t)h->kv_dim;
            kb.shape[1] = vb.shape[1] = bi.n_tokens;
            KCHECK(kvmem_gather(h->agent, &blocks[b], 1, bi.first_token, &kb, &vb), "gather");
            for (int32_t i = 0; i < bi.n_tokens; i++) pos[at + i] = (int32_t)(bi.first_token + i);
            at += bi.n_tokens;
        }
    } else {
        KCHECK(kvmem_gather(h->agent, blocks, nb, base, &kt, &vt), "gather");
        for (int64_t i = 0; i < M; i++) pos[i] = (int32_t)(base + i);
    }
    if (tl_kv_append(kv, k, v, (int32_t)M, pos)) {
        rc = tl_errf(err, err_size, "working set full");
        goto done;
    }
local_window:
    rc = put_range(h, h->n - local, local, kv, err, err_size);
done:
    kvmem_retrieval_free(r);
    free(k);
    free(v);
    free(pos);
    return rc;
}
#endif

int tl_memory_build(tl_history *h, const tl_method *m, int64_t budget, const float *probe_q_raw,
                    int32_t n_probe, int32_t turn_pos, tl_kv *kv, char *err, size_t err_size) {
    return tl_memory_build_info(h, m, budget, probe_q_raw, n_probe, turn_pos, kv, NULL, err, err_size);
}

int tl_memory_build_info(tl_history *h, const tl_method *m, int64_t budget, const float *probe_q_raw,
                         int32_t n_probe, int32_t turn_pos, tl_kv *kv, tl_build_info *info, char *err,
                         size_t err_size) {
    kv->n = 0;
    if (info) memset(info, 0, sizeof *info);
    int64_t N = h->n;
    if (N == 0) return 0;
    if (budget <= 0 || budget > N) budget = N;
    if (m->kind == TL_M_MEMART) {
#ifdef TINYLLM_HAVE_RETRIEVE
        return build_memart(h, m, budget >= N ? 0 : budget, probe_q_raw, n_probe, turn_pos, kv, info, err,
                            err_size);
#else
        return tl_errf(err, err_size, "MemArt is not in this build");
#endif
    }
    int rc = 0;
    size_t n = (size_t)h->n_layers * (size_t)N * (size_t)h->kv_dim;
    float *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
    int32_t *kept = malloc((size_t)N * sizeof(int32_t));
    float *scores = malloc((size_t)N * sizeof(float));
    float *krot = NULL;
    int64_t n_kept = 0;
    if (!k || !v || !kept || !scores) {
        rc = tl_errf(err, err_size, "out of memory");
        goto done;
    }
    if ((rc = tl_history_read_raw(h, 0, N, k, v, err, err_size)) != 0) goto done;
    switch (m->kind) {
    case TL_M_FULL:
        for (int64_t i = 0; i < N; i++) kept[i] = (int32_t)i;
        n_kept = N;
        break;
    case TL_M_RECENT:
        for (int64_t i = 0; i < budget; i++) kept[i] = (int32_t)(N - budget + i);
        n_kept = budget;
        break;
#ifdef TINYLLM_HAVE_EVICT
    case TL_M_STREAMING: {
        int64_t sink = budget < 4 ? budget : 4;
        KCHECK(kvmem_streaming_keep(N, sink, budget - sink, kept, &n_kept), "streaming keep");
        break;
    }
    case TL_M_H2O:
        KCHECK(kvmem_h2o_keep(h->acc, N, budget, budget / 2, kept, &n_kept), "h2o keep");
        break;
    case TL_M_SNAPKV:
    case TL_M_INTENTKV: {
        /* both score post-RoPE keys: rotate the whole history once */
        krot = malloc(n * sizeof(float));
        int32_t *allpos = malloc((size_t)N * sizeof(int32_t));
        if (!krot || !allpos) {
            free(allpos);
            rc = tl_errf(err, err_size, "out of memory");
            goto done;
        }
        memcpy(krot, k, n * sizeof(float));
        for (int64_t i = 0; i < N; i++) allpos[i] = (int32_t)i;
        rc = tl_history_rotate(h, krot, N, allpos, err, err_size);
        free(allpos);
        if (rc) goto done;
        kvmem_tensor kt;
        int64_t shape[4] = {h->n_layers, N, h->n_kv_heads, h->head_dim};
        kvmem_tensor_init(&kt, krot, KVMEM_F32, 4, shape);
        if (m->kind == TL_M_SNAPKV) {
            int64_t W = budget / 2 < 32 ? budget / 2 : 32;
            if (W < 1) W = 1;
            kvmem_tensor qt;
            int64_t qs[4] = {W, h->n_layers, h->n_heads, h->head_dim};
            kvmem_tensor_init(&qt, h->q_rot + (size_t)(N - W) * (size_t)h->n_layers * (size_t)h->q_dim,
                              KVMEM_F32, 4, qs);
            KCHECK(kvmem_snapkv_score(h->ctx, &h->spec, &qt, &kt, 7, scores), "snapkv score");
            KCHECK(kvmem_select_keep(scores, N, budget, 0, N - W, N, kept, &n_kept), "select keep");
        } else {
            if (!h->have_qmem) {
                rc = tl_errf(err, err_size, "IntentKV: no QueryMemory yet (no prompt seen)");
                goto done;
            }
            KCHECK(kvmem_qmem_score(h->ctx, &h->spec, h->qmem, &kt, scores), "qmem score");
            KCHECK(kvmem_select_keep(scores, N, budget, budget < 4 ? budget : 4, N, N, kept, &n_kept),
                   "select keep");
        }
        break;
    }
#endif
    default:
        rc = tl_errf(err, err_size, "method %s is not in this build", m->name);
        goto done;
    }
    rc = put_kept(h, k, v, kept, n_kept, m->reencode, kv, err, err_size);
done:
    free(k);
    free(v);
    free(kept);
    free(scores);
    free(krot);
    (void)turn_pos;
    return rc;
}
