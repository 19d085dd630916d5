/* tinyllm tour: every kvmem method on a real model, in token ids (the
 * readable story agent is `tinyllm demo`, story.c).
 *
 * Phase 1 (one process): a multi-turn session whose history lives in a kvmem
 * agent. Each new turn retrieves memory blocks with MemArt (the prompt's
 * queries against block AABBs), gathers and re-encodes them with RoPE as its
 * prefill memory, decodes with ART, and is checked against full context;
 * between turns IntentKV's QueryMemory prunes a slot-mapped copy of the
 * history. A KEEP structured-memory scenario follows (object segments,
 * static/dynamic groups, a load plan for a query). The agent is saved.
 * Phase 2 (a new process): load the agent from the file and run the next
 * turn again: the logits must equal phase 1's.
 */
#define KVMEM_EXPERIMENTAL /* KEEP segments and the eviction baselines (kvmem.h) */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "cli.h"
#include "internal.h"

enum { FIRST = 64, PROMPT = 16, GEN = 32, TURNS = 4, TOPK = 8, WINDOW = 32, IKV_BUDGET = 128 };

typedef struct demo {
    tl_model m;
    kvmem_context *ctx;
    tl_history h;
    tl_state *s;
    int32_t V, L, d, kvd;
    char err[TL_ERR_SIZE];
} demo;

/* A user message: PROMPT tokens of model-sampled text (BOS dropped). */
static int user_message(demo *D, uint64_t seed, int32_t *out) {
    int32_t tmp[PROMPT + 1];
    if (tl_sample_sequence(&D->m, seed, 1.0f, PROMPT + 1, tmp)) return -1;
    memcpy(out, tmp + 1, PROMPT * sizeof(int32_t));
    return 0;
}

/* The prompt's raw queries over the last WINDOW history tokens. */
static int probe(demo *D, const int32_t *prompt, int32_t N, float *q_raw) {
    tl_kv kv;
    int32_t pos[PROMPT];
    for (int32_t i = 0; i < PROMPT; i++) pos[i] = N + i;
    if (tl_kv_init(&kv, &D->m.cfg, WINDOW + PROMPT)) return -1;
    int rc = tl_memory_recent(&D->h, WINDOW, &kv, D->err, sizeof D->err);
    tl_trace tr = {0};
    tr.q_raw = q_raw;
    if (!rc) rc = tl_forward(&D->m, D->s, &kv, prompt, PROMPT, pos, NULL, &tr, NULL, NULL);
    tl_kv_free(&kv);
    return rc;
}

/* MemArt memory for a prompt: the working set kv gets the retrieved blocks
 * (a build without retrieval falls back to the newest blocks). */
#ifdef TINYLLM_HAVE_RETRIEVE
#define MEMORY_NAME "MemArt retrieved %d tokens (%d blocks, by AABB)"
#define PROBE_TOKENS PROMPT
#else
#define MEMORY_NAME "no retrieval in this build: kept the newest %d tokens (%d blocks)"
#define PROBE_TOKENS 0
#endif
static int memart_memory(demo *D, const int32_t *prompt, int32_t N, tl_kv *kv) {
    tl_method me;
    memset(&me, 0, sizeof me);
#ifdef TINYLLM_HAVE_RETRIEVE
    me.kind = TL_M_MEMART;
    me.mode = KVMEM_RETRIEVE_AABB;
    me.norm = KVMEM_NORM_SOFTMAX;
    me.agg = KVMEM_AGG_MAX;
    float *q = malloc((size_t)PROMPT * (size_t)D->L * (size_t)D->d * sizeof(float));
    int rc = !q || probe(D, prompt, N, q) ? -1 : 0;
#else
    me.kind = TL_M_RECENT;
    float *q = NULL;
    int rc = 0;
    (void)probe;
    (void)prompt;
#endif
    if (!rc) rc = tl_memory_build(&D->h, &me, (int64_t)TOPK * D->h.block_size, q, PROMPT, N, kv, D->err, sizeof D->err);
    free(q);
    return rc;
}

/* Teacher-forced logits of tokens[0..T) at N.. over the full history. */
static int full_logits(demo *D, const int32_t *tokens, int32_t T, int32_t N, float *logits) {
    tl_method full;
    memset(&full, 0, sizeof full);
    full.kind = TL_M_FULL;
    tl_kv kv;
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    if (!pos || tl_kv_init(&kv, &D->m.cfg, N + T)) {
        free(pos);
        return -1;
    }
    for (int32_t i = 0; i < T; i++) pos[i] = N + i;
    int rc = tl_memory_build(&D->h, &full, 0, NULL, 0, N, &kv, D->err, sizeof D->err);
    if (!rc) rc = tl_forward(&D->m, D->s, &kv, tokens, T, pos, logits, NULL, NULL, NULL);
    tl_kv_free(&kv);
    free(pos);
    return rc;
}

static int demo_open(demo *D, const char *path, kvmem_dtype storage) {
    memset(D, 0, sizeof *D);
    if (tl_model_load(path, &D->m, D->err, sizeof D->err)) return -1;
    D->V = D->m.cfg.vocab_size;
    D->L = D->m.cfg.n_layers;
    D->d = D->m.cfg.dim;
    D->kvd = D->m.cfg.n_kv_heads * D->m.cfg.head_dim;
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cpu";
    if (kvmem_context_create(&cp, &D->ctx) != KVMEM_OK)
        return tl_errf(D->err, sizeof D->err, "context: %s", kvmem_last_error());
    D->s = tl_state_create(&D->m.cfg, 128);
    if (!D->s) return tl_errf(D->err, sizeof D->err, "out of memory");
    return tl_history_init(&D->h, D->ctx, &D->m, D->m.cfg.seq_len, storage, 16, "demo-agent", D->err,
                           sizeof D->err);
}

static void demo_close(demo *D) {
    tl_history_free(&D->h);
    tl_state_free(D->s);
    kvmem_context_free(D->ctx);
    tl_model_free(&D->m);
}

/* Copy rows [r0, r0 + T) of a working set to [L][T][kvd] buffers. */
static void kv_rows(const tl_kv *kv, int32_t r0, int32_t T, float *k, float *v) {
    for (int32_t l = 0; l < kv->n_layers; l++) {
        memcpy(k + (size_t)l * (size_t)T * (size_t)kv->kv_dim, kv->k + ((size_t)l * (size_t)kv->cap + (size_t)r0) * (size_t)kv->kv_dim,
               (size_t)T * (size_t)kv->kv_dim * sizeof(float));
        memcpy(v + (size_t)l * (size_t)T * (size_t)kv->kv_dim, kv->v + ((size_t)l * (size_t)kv->cap + (size_t)r0) * (size_t)kv->kv_dim,
               (size_t)T * (size_t)kv->kv_dim * sizeof(float));
    }
}

#ifdef TINYLLM_HAVE_EVICT
/* IntentKV between turns: score the history with the session's QueryMemory,
 * keep the best IKV_BUDGET positions, and evict the rest in a slot map that
 * mirrors the history (kept rows stay in place, RoPE phases untouched). */
static int intentkv_prune(demo *D, kvmem_kvstore *store, kvmem_slotmap *map, const float *k_rot,
                          const float *v, int32_t T) {
    kvmem_tensor kt, vt;
    int64_t shape[4] = {D->L, T, D->m.cfg.n_kv_heads, D->m.cfg.head_dim};
    kvmem_tensor_init(&kt, (void *)(uintptr_t)k_rot, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&vt, (void *)(uintptr_t)v, KVMEM_F32, 4, shape);
    if (kvmem_slotmap_append(map, &kt, &vt) != KVMEM_OK) return -1;
    kvmem_slotmap_info info;
    kvmem_slotmap_get_info(map, &info);
    if (info.n_live <= IKV_BUDGET || !D->h.have_qmem) {
        printf("    IntentKV: %lld live positions fit the budget of %d: nothing pruned\n", (long long)info.n_live,
               IKV_BUDGET);
        return 0;
    }
    /* the live rows' post-RoPE keys and positions, straight from the slot map */
    int64_t n_live = info.n_live;
    float *kk = malloc((size_t)D->L * (size_t)n_live * (size_t)D->kvd * sizeof(float));
    float *sc = malloc((size_t)n_live * sizeof(float));
    int32_t *live_pos = malloc((size_t)n_live * sizeof(int32_t));
    int32_t *kept = malloc((size_t)n_live * sizeof(int32_t));
    int rc = -1;
    if (kk && sc && live_pos && kept) {
        int64_t ks[4] = {D->L, n_live, D->m.cfg.n_kv_heads, D->m.cfg.head_dim};
        kvmem_tensor kall;
        kvmem_tensor_init(&kall, kk, KVMEM_F32, 4, ks);
        int64_t n_kept = 0, n_freed = 0;
        if (kvmem_slotmap_gather(map, &kall, NULL, live_pos) == KVMEM_OK &&
            kvmem_qmem_score(D->ctx, &D->h.spec, D->h.qmem, &kall, sc) == KVMEM_OK &&
            kvmem_select_keep(sc, n_live, IKV_BUDGET, 4, n_live, n_live, kept, &n_kept) == KVMEM_OK) {
            for (int64_t i = 0; i < n_kept; i++) kept[i] = live_pos[kept[i]]; /* rows -> positions */
            if (kvmem_slotmap_evict(map, kept, n_kept, &n_freed) == KVMEM_OK) {
                kvmem_slotmap_get_info(map, &info);
                kvmem_kvstore_info si;
                kvmem_kvstore_get_info(store, &si);
                printf("    IntentKV: the session's QueryMemory keeps %lld of %lld live positions (budget %d, "
                       "4 protected); slot map: %lld positions, %lld live, %lld slots freed (kept rows stay in "
                       "their slots at their RoPE phases, %d..%d)\n",
                       (long long)n_kept, (long long)n_live, IKV_BUDGET, (long long)info.length,
                       (long long)info.n_live, (long long)n_freed, kept[0], kept[n_kept - 1]);
                rc = 0;
            }
        }
    }
    if (rc && !D->err[0]) snprintf(D->err, sizeof D->err, "IntentKV: %s", kvmem_last_error());
    free(kk);
    free(sc);
    free(live_pos);
    free(kept);
    return rc;
}
#endif

/* One turn: MemArt memory, prompt prefill, ART decode, fidelity vs full,
 * append to the agent. */
static int session_turn(demo *D, int32_t t, const int32_t *prompt, int32_t *turn_tokens,
                        float *k_out, float *v_out) {
    int32_t N = (int32_t)D->h.n, T = PROMPT + GEN;
    tl_kv kv;
    float *logits = malloc((size_t)T * (size_t)D->V * sizeof(float));
    float *ref = malloc((size_t)T * (size_t)D->V * sizeof(float));
    float *q_rot = malloc((size_t)T * (size_t)D->L * (size_t)D->d * sizeof(float));
    int32_t pos[PROMPT + GEN];
    int rc = -1;
    if (!logits || !ref || !q_rot || tl_kv_init(&kv, &D->m.cfg, N + T)) goto out;
    for (int32_t i = 0; i < T; i++) pos[i] = N + i;
    if (memart_memory(D, prompt, N, &kv)) goto out;
    int32_t n_mem = kv.n;
    memcpy(turn_tokens, prompt, PROMPT * sizeof(int32_t));
    tl_trace tr = {0};
    tr.q_rot = q_rot;
    if (tl_forward(&D->m, D->s, &kv, prompt, PROMPT, pos, logits, &tr, NULL, NULL)) goto out;
    tl_art art, *artp = NULL;
#ifdef TINYLLM_HAVE_ATTEND
    memset(&art, 0, sizeof art);
    art.ctx = D->ctx;
    art.params = kvmem_attend_default_params();
    art.params.tile_size = 16;
    artp = &art;
#else
    (void)art;
#endif
    for (int32_t i = PROMPT; i < T; i++) {
        turn_tokens[i] = tl_argmax(logits + (size_t)(i - 1) * (size_t)D->V, D->V);
        tr.q_rot = q_rot + (size_t)i * (size_t)D->L * (size_t)D->d;
        if (tl_forward(&D->m, D->s, &kv, turn_tokens + i, 1, pos + i, logits + (size_t)i * (size_t)D->V, &tr,
                       artp, NULL))
            goto out;
    }
    if (full_logits(D, turn_tokens, T, N, ref)) goto out;
    double kl = 0;
    int agree = 0;
    for (int32_t i = 0; i < T; i++) {
        kl += tl_kl_logits(ref + (size_t)i * (size_t)D->V, logits + (size_t)i * (size_t)D->V, D->V);
        agree += tl_argmax(ref + (size_t)i * (size_t)D->V, D->V) == tl_argmax(logits + (size_t)i * (size_t)D->V, D->V);
    }
    printf("turn %d: history %d tokens. " MEMORY_NAME " for a %d-token prompt: "
           "prefilled %d tokens (+%d probe) instead of re-reading %d.\n",
           t, N, n_mem, (n_mem + D->h.block_size - 1) / D->h.block_size, PROMPT, PROMPT, PROBE_TOKENS, N + PROMPT);
#ifdef TINYLLM_HAVE_ATTEND
    printf("    decoded %d tokens with ART: %lld of %lld KV tiles read (%.0f%%); ",
           GEN, (long long)art.tiles_visited, (long long)art.tiles_total,
           art.tiles_total ? 100.0 * (double)art.tiles_visited / (double)art.tiles_total : 0.0);
#else
    printf("    decoded %d tokens (ART not in this build); ", GEN);
#endif
    printf("vs full context: top-1 agreement %d/%d, mean KL %.4f nats\n", agree, T, kl / T);
    /* the turn's KV as this engine computed it, at its real positions */
    kv_rows(&kv, n_mem, T, k_out, v_out);
    if (tl_history_append(&D->h, k_out, v_out, T, pos, turn_tokens, q_rot, NULL, PROMPT, D->err, sizeof D->err))
        goto out;
    rc = 0;
out:
    tl_kv_free(&kv);
    free(logits);
    free(ref);
    free(q_rot);
    return rc;
}

/* The next turn's prompt logits over MemArt memory: what phase 2 recomputes. */
static int next_turn_logits(demo *D, const int32_t *prompt, float *logits) {
    int32_t N = (int32_t)D->h.n, pos[PROMPT];
    tl_kv kv;
    if (tl_kv_init(&kv, &D->m.cfg, N + PROMPT)) return -1;
    for (int32_t i = 0; i < PROMPT; i++) pos[i] = N + i;
    int rc = memart_memory(D, prompt, N, &kv);
    if (!rc) rc = tl_forward(&D->m, D->s, &kv, prompt, PROMPT, pos, logits, NULL, NULL, NULL);
    tl_kv_free(&kv);
    return rc;
}

#ifdef TINYLLM_HAVE_SEGMENTS
/* KEEP: objects of a scene as segments. The engine computes each
 * segment's KV alone, and one joint KV per group once the group is static;
 * an update invalidates one segment; a query loads the best units. */
enum { NOBJ = 6, OBJ = 16 };

static int seg_kv(demo *D, const int32_t *tokens, int32_t T, float *k, float *v) {
    tl_kv kv;
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    if (!pos || tl_kv_init(&kv, &D->m.cfg, T)) {
        free(pos);
        return -1;
    }
    for (int32_t i = 0; i < T; i++) pos[i] = i;
    int rc = tl_forward(&D->m, D->s, &kv, tokens, T, pos, NULL, NULL, NULL, NULL);
    if (!rc) kv_rows(&kv, 0, T, k, v);
    tl_kv_free(&kv);
    free(pos);
    return rc;
}

static int seg_store(demo *D, kvmem_segments *segs, int32_t group, int32_t index, const int32_t *tokens,
                     int32_t T, int64_t *recomputed) {
    float *k = malloc((size_t)D->L * (size_t)T * (size_t)D->kvd * sizeof(float));
    float *v = malloc((size_t)D->L * (size_t)T * (size_t)D->kvd * sizeof(float));
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    int rc = -1;
    if (k && v && pos && !seg_kv(D, tokens, T, k, v)) {
        for (int32_t i = 0; i < T; i++) pos[i] = i;
        kvmem_tensor kt, vt;
        int64_t shape[4] = {D->L, T, D->m.cfg.n_kv_heads, D->m.cfg.head_dim};
        kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape);
        kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape);
        kvmem_append_params ap = kvmem_append_default_params();
        ap.keys_rotated = 1;
        ap.positions = pos;
        ap.token_ids = tokens;
        kvmem_status st = index >= 0 ? kvmem_segments_store_segment(segs, index, &kt, &vt, &ap)
                                     : kvmem_segments_store_group(segs, group, &kt, &vt, &ap);
        rc = st == KVMEM_OK ? 0 : tl_errf(D->err, sizeof D->err, "segments store: %s", kvmem_last_error());
        *recomputed += T;
    }
    free(k);
    free(v);
    free(pos);
    return rc;
}

/* Handle queued events: compute what they ask for. */
static int seg_events(demo *D, kvmem_segments *segs, int32_t obj[NOBJ][OBJ], int64_t *recomputed,
                      int32_t *n_static) {
    kvmem_segment_event ev[32];
    size_t n, left;
    do {
        if (kvmem_segments_drain_events(segs, ev, 32, &n, &left) != KVMEM_OK) return -1;
        for (size_t i = 0; i < n; i++) {
            if (ev[i].kind == KVMEM_SEG_EVENT_SEGMENT_STALE) {
                if (seg_store(D, segs, ev[i].group, ev[i].segment, obj[ev[i].segment], OBJ, recomputed)) return -1;
            } else if (ev[i].kind == KVMEM_SEG_EVENT_GROUP_STATIC) {
                int32_t members[NOBJ], joint[NOBJ * OBJ];
                size_t nm;
                if (kvmem_segments_group_members(segs, ev[i].group, members, NOBJ, &nm) != KVMEM_OK) return -1;
                for (size_t j = 0; j < nm; j++) memcpy(joint + j * OBJ, obj[members[j]], OBJ * sizeof(int32_t));
                if (seg_store(D, segs, ev[i].group, -1, joint, (int32_t)nm * OBJ, recomputed)) return -1;
                (*n_static)++;
            }
        }
    } while (left > 0);
    return 0;
}

static int keep_scenario(demo *D) {
    kvmem_segments *segs = NULL;
    int32_t obj[NOBJ][OBJ];
    float emb[NOBJ][64];
    int rc = -1;
    printf("KEEP structured memory: %d objects of %d tokens each\n", NOBJ, OBJ);
    for (int32_t o = 0; o < NOBJ; o++) {
        int32_t tmp[OBJ + 1];
        if (tl_sample_sequence(&D->m, 500 + (uint64_t)o, 1.0f, OBJ + 1, tmp)) return -1;
        memcpy(obj[o], tmp + 1, sizeof obj[o]);
        /* an embedding for grouping: the mean token embedding */
        for (int32_t e = 0; e < D->d && e < 64; e++) {
            double s = 0;
            for (int32_t i = 0; i < OBJ; i++) s += D->m.w.tok_emb[(size_t)obj[o][i] * (size_t)D->d + (size_t)e];
            emb[o][e] = (float)(s / OBJ);
        }
    }
    int32_t labels[NOBJ];
    kvmem_kmeans_params kp = kvmem_kmeans_default_params();
    kp.k = 2;
    if (kvmem_cluster_kmeans(&emb[0][0], NOBJ, (size_t)(D->d < 64 ? D->d : 64), &kp, labels, NULL, NULL) != KVMEM_OK)
        return tl_errf(D->err, sizeof D->err, "kmeans: %s", kvmem_last_error());
    kvmem_segments_params sp = kvmem_segments_default_params();
    if (kvmem_segments_create(D->h.pool, "scene", &sp, &segs) != KVMEM_OK)
        return tl_errf(D->err, sizeof D->err, "segments: %s", kvmem_last_error());
    int64_t recomputed = 0;
    int32_t n_static = 0;
    printf("    groups by cosine k-means over mean token embeddings:");
    for (int32_t o = 0; o < NOBJ; o++) {
        char name[16];
        snprintf(name, sizeof name, "obj%d", o);
        if (kvmem_segments_add(segs, name, labels[o], NULL) != KVMEM_OK) goto out;
        printf(" obj%d->g%d", o, labels[o]);
    }
    printf("\n");
    if (seg_events(D, segs, obj, &recomputed, &n_static)) goto out;
    for (int step = 0; step < sp.static_after_steps; step++) {
        if (kvmem_segments_step(segs) != KVMEM_OK) goto out;
        if (seg_events(D, segs, obj, &recomputed, &n_static)) goto out;
    }
    printf("    after %d quiet steps: %d groups static, joint KV computed per group; %lld tokens computed so far\n",
           sp.static_after_steps, n_static, (long long)recomputed);
    /* object 1 changes: only it is recomputed; its group turns dynamic */
    int64_t before = recomputed;
    int32_t tmp[OBJ + 1];
    if (tl_sample_sequence(&D->m, 777, 1.0f, OBJ + 1, tmp)) goto out;
    memcpy(obj[1], tmp + 1, sizeof obj[1]);
    if (kvmem_segments_update(segs, 1) != KVMEM_OK) goto out;
    if (seg_events(D, segs, obj, &recomputed, &n_static)) goto out;
    kvmem_group_info gi;
    kvmem_segments_group_info(segs, labels[1], &gi);
    printf("    obj1 changed: %lld tokens recomputed (of %d in the scene); its group is now %s\n",
           (long long)(recomputed - before), NOBJ * OBJ, gi.state == KVMEM_GROUP_STATIC ? "static" : "dynamic");
    /* a query: score objects by the attention the query pays them over the
     * whole scene, then load only the best units */
    int32_t query[PROMPT];
    if (user_message(D, 900, query)) goto out;
    int32_t scene[NOBJ * OBJ], pos[NOBJ * OBJ + PROMPT];
    for (int32_t o = 0; o < NOBJ; o++) memcpy(scene + o * OBJ, obj[o], sizeof obj[o]);
    for (int32_t i = 0; i < NOBJ * OBJ + PROMPT; i++) pos[i] = i;
    tl_kv kv;
    float *acc = calloc(NOBJ * OBJ + PROMPT, sizeof(float));
    float *full = malloc((size_t)PROMPT * (size_t)D->V * sizeof(float));
    float *part = malloc((size_t)PROMPT * (size_t)D->V * sizeof(float));
    if (!acc || !full || !part || tl_kv_init(&kv, &D->m.cfg, NOBJ * OBJ + PROMPT)) goto out;
    tl_trace tr = {0};
    tr.attn_acc = acc;
    int ok = !tl_forward(&D->m, D->s, &kv, scene, NOBJ * OBJ, pos, NULL, NULL, NULL, NULL);
    memset(acc, 0, (NOBJ * OBJ + PROMPT) * sizeof(float));
    ok = ok && !tl_forward(&D->m, D->s, &kv, query, PROMPT, pos + NOBJ * OBJ, full, &tr, NULL, NULL);
    float scores[NOBJ];
    for (int32_t o = 0; o < NOBJ; o++) {
        scores[o] = 0;
        for (int32_t i = 0; i < OBJ; i++) scores[o] += acc[o * OBJ + i];
    }
    kvmem_segment_unit units[NOBJ];
    size_t n_units = 0;
    ok = ok && kvmem_segments_plan(segs, scores, NOBJ, 2, units, NOBJ, &n_units) == KVMEM_OK;
    /* the plan ranks units by score; lay them out in scene order (a unit's
     * first member), so relative order matches what the model saw */
    int32_t first_of[NOBJ];
    for (size_t u = 0; ok && u < n_units; u++) {
        first_of[u] = units[u].segment;
        if (units[u].kind == KVMEM_SEG_UNIT_GROUP) {
            int32_t members[NOBJ];
            size_t nm;
            ok = kvmem_segments_group_members(segs, units[u].group, members, NOBJ, &nm) == KVMEM_OK && nm > 0;
            first_of[u] = ok ? members[0] : 0;
        }
    }
    for (size_t u = 1; ok && u < n_units; u++)
        for (size_t w = u; w > 0 && first_of[w - 1] > first_of[w]; w--) {
            kvmem_segment_unit tu = units[w];
            units[w] = units[w - 1];
            units[w - 1] = tu;
            int32_t tf = first_of[w];
            first_of[w] = first_of[w - 1];
            first_of[w - 1] = tf;
        }
    /* load the units' KV (raw keys from kvmem) and re-encode them contiguously */
    kv.n = 0;
    int64_t loaded = 0;
    for (size_t u = 0; ok && u < n_units; u++) {
        kvmem_agent *a;
        if (units[u].needs_compute || kvmem_agent_open(D->h.pool, units[u].agent_id, &a) != KVMEM_OK) {
            ok = 0;
            break;
        }
        int32_t T = (int32_t)units[u].n_tokens;
        float *k = malloc((size_t)D->L * (size_t)T * (size_t)D->kvd * sizeof(float));
        float *v = malloc((size_t)D->L * (size_t)T * (size_t)D->kvd * sizeof(float));
        int32_t *p = malloc((size_t)T * (size_t)D->m.cfg.n_kv_heads * sizeof(int32_t));
        int32_t *pp = malloc((size_t)T * sizeof(int32_t));
        kvmem_tensor kt, vt;
        int64_t shape[4] = {D->L, T, D->m.cfg.n_kv_heads, D->m.cfg.head_dim};
        kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape);
        kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape);
        ok = k && v && p && pp && kvmem_agent_read(a, units[u].first_token, T, &kt, &vt) == KVMEM_OK;
        for (int32_t i = 0; ok && i < T; i++) {
            pp[i] = (int32_t)(loaded + i);
            for (int32_t h = 0; h < D->m.cfg.n_kv_heads; h++) p[i * D->m.cfg.n_kv_heads + h] = pp[i];
        }
        for (int32_t l = 0; ok && l < D->L; l++)
            ok = kvmem_rope_apply(&D->h.spec, k + (size_t)l * (size_t)T * (size_t)D->kvd,
                                  (size_t)T * (size_t)D->m.cfg.n_kv_heads, (size_t)D->m.cfg.head_dim, p, 0) == KVMEM_OK;
        ok = ok && !tl_kv_append(&kv, k, v, T, pp);
        loaded += T;
        kvmem_agent_close(a);
        free(k);
        free(v);
        free(p);
        free(pp);
    }
    int32_t qpos[PROMPT];
    for (int32_t i = 0; i < PROMPT; i++) qpos[i] = (int32_t)loaded + i;
    ok = ok && !tl_forward(&D->m, D->s, &kv, query, PROMPT, qpos, part, NULL, NULL, NULL);
    if (ok) {
        int agree = 0;
        double kl = 0;
        for (int32_t i = 0; i < PROMPT; i++) {
            agree += tl_argmax(full + (size_t)i * (size_t)D->V, D->V) == tl_argmax(part + (size_t)i * (size_t)D->V, D->V);
            kl += tl_kl_logits(full + (size_t)i * (size_t)D->V, part + (size_t)i * (size_t)D->V, D->V);
        }
        printf("    query: plan loads %zu units (", n_units);
        for (size_t u = 0; u < n_units; u++)
            printf("%s%s %d, %lld tokens", u ? "; " : "", units[u].kind == KVMEM_SEG_UNIT_GROUP ? "group" : "segment",
                   units[u].kind == KVMEM_SEG_UNIT_GROUP ? units[u].group : units[u].segment,
                   (long long)units[u].n_tokens);
        printf(") = %lld of %d scene tokens; vs the whole scene: top-1 agreement %d/%d, mean KL %.4f\n",
               (long long)loaded, NOBJ * OBJ, agree, PROMPT, kl / PROMPT);
        rc = 0;
    } else {
        tl_errf(D->err, sizeof D->err, "KEEP query: %s", kvmem_last_error());
    }
    tl_kv_free(&kv);
    free(acc);
    free(full);
    free(part);
out:
    if (rc && !D->err[0]) tl_errf(D->err, sizeof D->err, "KEEP: %s", kvmem_last_error());
    kvmem_segments_free(segs);
    return rc;
}
#endif

static int write_expect(const char *path, const int32_t *prompt, const float *logits, int32_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(prompt, sizeof(int32_t), PROMPT, f) == PROMPT &&
             fwrite(logits, sizeof(float), (size_t)n, f) == (size_t)n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int phase1(const char *model, const char *dir) {
    demo D;
    if (demo_open(&D, model, KVMEM_F16)) {
        fprintf(stderr, "tinyllm tour: %s\n", D.err);
        demo_close(&D);
        return 1;
    }
    printf("tinyllm tour on %s (%s: dim %d, %d layers, %d/%d heads, vocab %d): KV in kvmem (f16 blocks of 16)\n",
           model, D.m.format, D.m.cfg.dim, D.L, D.m.cfg.n_heads, D.m.cfg.n_kv_heads, D.V);
    int rc = 1;
    int32_t first[FIRST], turn[PROMPT + GEN], prompt[PROMPT];
    float *k = malloc((size_t)D.L * FIRST * (size_t)D.kvd * sizeof(float));
    float *v = malloc((size_t)D.L * FIRST * (size_t)D.kvd * sizeof(float));
    float *logits = malloc((size_t)PROMPT * (size_t)D.V * sizeof(float));
    int32_t pos[FIRST];
    tl_kv kv;
    memset(&kv, 0, sizeof kv);
#ifdef TINYLLM_HAVE_EVICT
    kvmem_kvstore *store = NULL;
    kvmem_slotmap *map = NULL;
    if (kvmem_kvstore_create(&D.h.spec, NULL, &store) != KVMEM_OK || kvmem_slotmap_create(store, &map) != KVMEM_OK)
        goto out;
#endif
    if (!k || !v || !logits || tl_sample_sequence(&D.m, 1, 1.0f, FIRST, first) || tl_kv_init(&kv, &D.m.cfg, FIRST))
        goto out;
    for (int32_t i = 0; i < FIRST; i++) pos[i] = i;
    if (tl_forward(&D.m, D.s, &kv, first, FIRST, pos, NULL, NULL, NULL, NULL)) goto out;
    kv_rows(&kv, 0, FIRST, k, v);
    if (tl_history_append(&D.h, k, v, FIRST, pos, first, NULL, NULL, 0, D.err, sizeof D.err)) goto out;
    printf("turn 0: %d tokens prefilled and appended to agent '%s' (post-RoPE keys with positions: kvmem de-rotates)\n",
           FIRST, D.h.agent_id);
#ifdef TINYLLM_HAVE_EVICT
    if (intentkv_prune(&D, store, map, k, v, FIRST)) goto out;
#endif
    for (int32_t t = 1; t <= TURNS; t++) {
        if (user_message(&D, 100 + (uint64_t)t, prompt)) goto out;
        if (session_turn(&D, t, prompt, turn, k, v)) goto out;
#ifdef TINYLLM_HAVE_EVICT
        if (intentkv_prune(&D, store, map, k, v, PROMPT + GEN)) goto out;
#endif
    }
#ifdef TINYLLM_HAVE_SEGMENTS
    if (keep_scenario(&D)) goto out;
#endif
    if (user_message(&D, 999, prompt) || next_turn_logits(&D, prompt, logits)) goto out;
#ifdef TINYLLM_HAVE_PERSIST
    {
        char path[1024], expect[1024];
        snprintf(path, sizeof path, "%s/demo-agent.safetensors", dir);
        snprintf(expect, sizeof expect, "%s/demo-expect.bin", dir);
        if (tl_history_save(&D.h, path, D.err, sizeof D.err)) goto out;
        if (write_expect(expect, prompt, logits, PROMPT * D.V)) {
            tl_errf(D.err, sizeof D.err, "cannot write %.200s", expect);
            goto out;
        }
        printf("saved the agent (%lld tokens) to %s; the next turn's logits to %s\n", (long long)D.h.n, path, expect);
    }
#else
    (void)dir;
    (void)write_expect;
    printf("persistence is not in this build: nothing saved\n");
#endif
    rc = 0;
out:
    if (rc) fprintf(stderr, "tinyllm tour: %s\n", D.err[0] ? D.err : kvmem_last_error());
#ifdef TINYLLM_HAVE_EVICT
    kvmem_slotmap_free(map);
    kvmem_kvstore_free(store);
#endif
    tl_kv_free(&kv);
    free(k);
    free(v);
    free(logits);
    demo_close(&D);
    return rc;
}

static int phase2(const char *model, const char *dir) {
#ifdef TINYLLM_HAVE_PERSIST
    demo D;
    int rc = 1;
    char path[1024], expect[1024];
    snprintf(path, sizeof path, "%s/demo-agent.safetensors", dir);
    snprintf(expect, sizeof expect, "%s/demo-expect.bin", dir);
    if (demo_open(&D, model, KVMEM_F16)) {
        fprintf(stderr, "tinyllm tour: %s\n", D.err);
        demo_close(&D);
        return 1;
    }
    int32_t prompt[PROMPT];
    size_t n = (size_t)PROMPT * (size_t)D.V;
    float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    FILE *f = fopen(expect, "rb");
    if (!f || !want || !got || fread(prompt, sizeof(int32_t), PROMPT, f) != PROMPT || fread(want, sizeof(float), n, f) != n) {
        tl_errf(D.err, sizeof D.err, "cannot read %.200s: run phase 1 first", expect);
        if (f) fclose(f);
        goto out;
    }
    fclose(f);
    if (tl_history_load(&D.h, path, D.err, sizeof D.err)) goto out;
    if (next_turn_logits(&D, prompt, got)) goto out;
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)got[i] - want[i]));
    printf("restart: a new process loaded agent '%s' (%lld tokens) from %s, retrieved and prefilled the next turn: "
           "logits %s (max difference %g)\n",
           D.h.agent_id, (long long)D.h.n, path, worst == 0 ? "identical" : "DIFFER", worst);
    rc = worst == 0 ? 0 : 1;
out:
    if (rc && D.err[0]) fprintf(stderr, "tinyllm tour: %s\n", D.err);
    free(want);
    free(got);
    demo_close(&D);
    return rc;
#else
    (void)model;
    (void)dir;
    printf("restart: persistence is not in this build (skipped)\n");
    return 0;
#endif
}

#define TOUR_USAGE "usage: tinyllm tour MODEL [--state DIR] [--phase 1|2|all]\n"

int tl_tour_main(int argc, char **argv) {
    static const struct option opts[] = {{"state", required_argument, NULL, 's'},
                                         {"phase", required_argument, NULL, 'p'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *dir = "/tmp", *phase = "all", *model;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 's': dir = optarg; break;
        case 'p': phase = optarg; break;
        case 'h': fputs(TOUR_USAGE, stdout); return 0;
        default: return tl_cli_bad_option("tour", argc, argv, c, TOUR_USAGE);
        }
    }
    int p1 = !strcmp(phase, "1") || !strcmp(phase, "all"), p2 = !strcmp(phase, "2") || !strcmp(phase, "all");
    if (!p1 && !p2) {
        fprintf(stderr, "tinyllm tour: --phase '%s': expected 1, 2 or all\n" TOUR_USAGE, phase);
        return 2;
    }
    if (tl_cli_one_positional("tour", argc, argv, "MODEL", TOUR_USAGE, &model)) return 2;
    /* phase 1 saves into the directory and phase 2 reads from it: say so now, not after the run */
    if (tl_cli_dir("tour", "--state", dir, p1)) return 2;
    int rc = 0;
    if (p1) rc = phase1(model, dir);
    if (!rc && p2) rc = phase2(model, dir);
    return rc;
}
