/* kvmem demo --json --agent ID --turn N [--mode M] [--k K] [--block-size BS]:
 * everything the browser demo (wasm/demo) shows for one question of the
 * scripted session, as one JSON object, so the browser test can check that
 * the page's numbers equal the native library's for the same seed and
 * settings: both block-score strips (AABB and EXACT), the selected blocks
 * and their new positions after kvmem_gather, recall@k, and the ART
 * traversal of the question's last query row in retrieval-score order
 * (relative output change per tile, and where the stop rule ends it).
 * wasm/demo/demo.js computes the same things through the JavaScript API. */
#include "commands.h"
#include "demo_script.h"
#include "kvmem.h"
#include "synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VIEW_ART_LAYER 0

int demo_view(uint64_t seed, const char *agent_id, int turn, int norm, int agg, int top_k, int block_size,
              float tau_s, float tau_d);

static void json_ints(const char *key, const int32_t *x, int32_t n) {
    printf(",\"%s\":[", key);
    for (int32_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", x[i]);
    printf("]");
}

/* NaN (a block that was not a candidate) prints as null. */
static void json_floats(const char *key, const float *x, int32_t n) {
    printf(",\"%s\":[", key);
    for (int32_t i = 0; i < n; i++) {
        if (isnan(x[i])) printf("%snull", i ? "," : "");
        else printf("%s%.6g", i ? "," : "", (double)x[i]);
    }
    printf("]");
}

typedef struct view_state {
    kvmem_context *ctx;
    kvmem_pool *pool;
    kvmem_retrieval *ra, *re;
    kvm_synth syn;
    int syn_ok;
    float *k, *v, *q, *o, *oprev, *gk, *gv;
    int32_t *pos, *order, *topic, *first, *ntok;
} view_state;

static void view_free(view_state *s) {
    kvmem_retrieval_free(s->ra);
    kvmem_retrieval_free(s->re);
    if (s->syn_ok) kvm_synth_free(&s->syn);
    kvmem_pool_free(s->pool);
    kvmem_context_free(s->ctx);
    free(s->k);
    free(s->v);
    free(s->q);
    free(s->o);
    free(s->oprev);
    free(s->gk);
    free(s->gv);
    free(s->pos);
    free(s->order);
    free(s->topic);
    free(s->first);
    free(s->ntok);
}

static int fail_view(view_state *s, const char *what, kvmem_status st) {
    view_free(s);
    return kvm_tool_error(what, (int)st);
}

/* Importance order for ART: blocks by AABB score, highest first; blocks
 * without a score (always included) first; ties toward the older block. */
static const float *g_sort_scores;
static int by_score(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    float x = g_sort_scores[a], y = g_sort_scores[b];
    int xn = isnan(x), yn = isnan(y);
    if (xn != yn) return xn ? -1 : 1;
    if (!xn && x != y) return x > y ? -1 : 1;
    return a < b ? -1 : 1;
}

static kvmem_status view_question(view_state *s, kvmem_agent *ag, const kvmem_model_spec *spec, const kvm_demo_agent *da,
                                  int turn, const kvm_demo_step *step, int norm, int agg, int top_k, int block_size,
                                  float tau_s, float tau_d, uint64_t seed) {
    const int nq = step->tokens;
    kvmem_agent_info ai;
    kvmem_status st = kvmem_agent_get_info(ag, &ai);
    if (st != KVMEM_OK) return st;
    const int32_t nb = ai.n_sealed;
    int64_t qs[4] = {nq, spec->n_layers, spec->n_q_heads, spec->head_dim};
    kvmem_tensor qt;
    kvmem_tensor_init(&qt, s->q, KVMEM_F32, 4, qs);
    const int32_t sys_block = 0;
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    rp.top_k = top_k;
    rp.norm = (kvmem_retrieve_norm)norm;
    rp.agg = (kvmem_retrieve_agg)agg;
    rp.always_include = &sys_block;
    rp.n_always_include = 1;
    if ((st = kvmem_retrieve(ag, &qt, &rp, s->ra)) != KVMEM_OK) return st;
    rp.mode = KVMEM_RETRIEVE_EXACT;
    if ((st = kvmem_retrieve(ag, &qt, &rp, s->re)) != KVMEM_OK) return st;
    const int32_t *rb, *eb;
    const float *as, *es;
    int32_t rn, en, n1, n2;
    kvmem_retrieval_get(s->ra, 0, &rb, NULL, &rn);
    kvmem_retrieval_get(s->re, 0, &eb, NULL, &en);
    kvmem_retrieval_block_scores(s->ra, 0, &as, &n1);
    kvmem_retrieval_block_scores(s->re, 0, &es, &n2);
    int hits = 0;
    for (int32_t i = 0; i < rn; i++)
        for (int32_t j = 0; j < en; j++) hits += rb[i] == eb[j];
    /* re-position the AABB selection at 0..M-1, as an engine would load it */
    int64_t M = 0;
    kvmem_retrieval_n_tokens(s->ra, 0, &M);
    const size_t row = (size_t)spec->n_layers * (size_t)spec->n_kv_heads * (size_t)spec->head_dim;
    s->gk = malloc((size_t)(M > 0 ? M : 1) * row * sizeof(float));
    s->gv = malloc((size_t)(M > 0 ? M : 1) * row * sizeof(float));
    s->first = malloc((size_t)(nb + 1) * sizeof(int32_t));
    s->ntok = malloc((size_t)(nb + 1) * sizeof(int32_t));
    s->order = malloc((size_t)(nb + 1) * sizeof(int32_t));
    if (!s->gk || !s->gv || !s->first || !s->ntok || !s->order) return KVMEM_ERR_NOMEM;
    int64_t gs[4] = {spec->n_layers, M, spec->n_kv_heads, spec->head_dim};
    kvmem_tensor gkt, gvt;
    kvmem_tensor_init(&gkt, s->gk, KVMEM_F32, 4, gs);
    kvmem_tensor_init(&gvt, s->gv, KVMEM_F32, 4, gs);
    if ((st = kvmem_gather(ag, rb, rn, 0, &gkt, &gvt)) != KVMEM_OK) return st;
    for (int32_t b = 0; b < nb; b++) {
        kvmem_block_info bi;
        kvmem_agent_block_info(ag, b, &bi);
        s->first[b] = (int32_t)bi.first_token;
        s->ntok[b] = bi.n_tokens;
    }

    static const char *const norm_name[] = {"softmax", "rr"}, *const agg_name[] = {"max", "sum"};
    printf("{\"type\":\"view\",\"seed\":%llu,\"agent\":\"%s\",\"turn\":%d,\"topic\":%d,\"topic_name\":\"%s\","
           "\"query_tokens\":%d,\"mode\":\"%s-%s\",\"top_k\":%d,\"block_size\":%d,\"history_tokens\":%lld,"
           "\"history_blocks\":%d",
           (unsigned long long)seed, da->id, turn, step->topic, kvm_demo_topic_name[step->topic], nq, norm_name[norm],
           agg_name[agg], top_k, block_size, (long long)ai.n_tokens, nb);
    json_ints("block_topic", s->topic, nb);
    json_ints("block_first", s->first, nb);
    json_ints("block_tokens", s->ntok, nb);
    json_floats("aabb_scores", as, n1);
    json_floats("exact_scores", es, n2);
    json_ints("aabb_selected", rb, rn);
    json_ints("exact_selected", eb, en);
    printf(",\"hits\":%d,\"recall\":%.4f,\"memory_tokens\":%lld,\"new_positions\":[", hits, en ? (double)hits / en : 1.0,
           (long long)M);
    for (int32_t i = 0, at = 0; i < rn; i++) {
        printf("%s[%d,%d]", i ? "," : "", at, at + s->ntok[rb[i]] - 1);
        at += s->ntok[rb[i]];
    }
    printf("]");

    /* ART: the question's last query row, layer VIEW_ART_LAYER, rotated to its
     * position after the whole history, over the agent's blocks in
     * retrieval-score order. */
    const int32_t NQ = spec->n_q_heads, D = spec->head_dim;
    const int64_t P = ai.n_tokens + nq - 1;
    float *qrow = s->q + ((size_t)(nq - 1) * (size_t)spec->n_layers + VIEW_ART_LAYER) * (size_t)NQ * (size_t)D;
    for (int32_t h = 0; h < NQ; h++) s->pos[h] = (int32_t)P;
    if ((st = kvmem_rope_apply(spec, qrow, (size_t)NQ, (size_t)D, s->pos, 0)) != KVMEM_OK) return st;
    for (int32_t b = 0; b < nb; b++) s->order[b] = b;
    g_sort_scores = as;
    qsort(s->order, (size_t)nb, sizeof *s->order, by_score);
    int64_t os[3] = {1, NQ, D};
    kvmem_tensor aq, ao;
    kvmem_tensor_init(&aq, qrow, KVMEM_F32, 3, os);
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_AGENT;
    src.layer = VIEW_ART_LAYER;
    src.agent = ag;
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.order = KVMEM_ATTEND_IMPORTANCE;
    ap.tile_order = s->order;
    ap.n_tile_order = nb;
    ap.tau_s = tau_s;
    ap.tau_d = tau_d;
    kvmem_attend_stats stats;
    kvmem_tensor_init(&ao, s->o, KVMEM_F32, 3, os);
    if ((st = kvmem_attend(s->ctx, &aq, &src, &ap, &ao, &stats)) != KVMEM_OK) return st;
    printf(",\"art\":{\"layer\":%d,\"position\":%lld,\"tau_s\":%.6g,\"tau_d\":%.6g,\"patience\":%d", VIEW_ART_LAYER,
           (long long)P, (double)ap.tau_s, (double)ap.tau_d, ap.patience);
    json_ints("order", s->order, nb);
    /* The output after the first t tiles of the order (full attention over
     * them: thresholds 0 never stop) and the stop rule's two measures of its
     * change, on the whole output vector (the rule itself watches a strided
     * probe per KV-head stream): scale |(|o_t| - |o_t-1|)| / |o_t-1| and
     * direction 1 - cos(o_t, o_t-1). */
    double *sc = malloc((size_t)nb * sizeof(double)), *dc = malloc((size_t)nb * sizeof(double));
    if (!sc || !dc) {
        free(sc);
        free(dc);
        return KVMEM_ERR_NOMEM;
    }
    kvmem_attend_params full = kvmem_attend_default_params();
    full.order = KVMEM_ATTEND_INDEX;
    full.tile_order = s->order;
    full.tau_s = full.tau_d = 0.0f;
    for (int32_t t = 1; t <= nb; t++) {
        full.n_tile_order = t;
        kvmem_tensor_init(&ao, s->o, KVMEM_F32, 3, os);
        if ((st = kvmem_attend(s->ctx, &aq, &src, &full, &ao, NULL)) != KVMEM_OK) {
            free(sc);
            free(dc);
            return st;
        }
        if (t > 1) {
            double on = 0, pn = 0, dot = 0;
            for (int32_t i = 0; i < NQ * D; i++) {
                on += (double)s->o[i] * (double)s->o[i];
                pn += (double)s->oprev[i] * (double)s->oprev[i];
                dot += (double)s->o[i] * (double)s->oprev[i];
            }
            on = sqrt(on);
            pn = sqrt(pn);
            sc[t - 1] = pn > 0 ? fabs(on - pn) / pn : 0.0;
            dc[t - 1] = on > 0 && pn > 0 ? 1.0 - dot / (on * pn) : 0.0;
        }
        memcpy(s->oprev, s->o, (size_t)NQ * (size_t)D * sizeof(float));
    }
    printf(",\"scale_change\":[null");
    for (int32_t t = 1; t < nb; t++) printf(",%.6g", sc[t]);
    printf("],\"direction_change\":[null");
    for (int32_t t = 1; t < nb; t++) printf(",%.6g", dc[t]);
    free(sc);
    free(dc);
    printf("],\"streams\":%lld,\"tiles_total\":%lld,\"tiles_visited\":%lld,\"streams_stopped\":%lld}}\n",
           (long long)stats.n_streams, (long long)stats.tiles_total, (long long)stats.tiles_visited,
           (long long)stats.streams_stopped);
    return KVMEM_OK;
}

int demo_view(uint64_t seed, const char *agent_id, int turn, int norm, int agg, int top_k, int block_size,
              float tau_s, float tau_d) {
    view_state s;
    memset(&s, 0, sizeof s);
    kvmem_status st = kvmem_context_create(NULL, &s.ctx);
    if (st != KVMEM_OK) return fail_view(&s, "context", st);
    kvmem_model_spec spec = kvm_demo_spec();
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = block_size;
    if ((st = kvmem_pool_create(s.ctx, &spec, &pp, &s.pool)) != KVMEM_OK) return fail_view(&s, "pool", st);
    const size_t row = (size_t)spec.n_layers * (size_t)spec.n_kv_heads * (size_t)spec.head_dim;
    const int max_t = 256;
    s.k = malloc(row * max_t * sizeof(float));
    s.v = malloc(row * max_t * sizeof(float));
    s.q = malloc((size_t)max_t * (size_t)spec.n_layers * (size_t)spec.n_q_heads * (size_t)spec.head_dim * sizeof(float));
    s.o = malloc((size_t)spec.n_q_heads * (size_t)spec.head_dim * sizeof(float));
    s.oprev = malloc((size_t)spec.n_q_heads * (size_t)spec.head_dim * sizeof(float));
    s.pos = malloc((size_t)max_t * (size_t)spec.n_kv_heads * sizeof(int32_t));
    s.topic = malloc(8192 * sizeof(int32_t));
    s.syn_ok = kvm_synth_init(&s.syn, &spec, KVM_DEMO_TOPICS, seed);
    if (!s.syn_ok || !s.k || !s.v || !s.q || !s.o || !s.oprev || !s.pos || !s.topic ||
        kvmem_retrieval_create(&s.ra) != KVMEM_OK || kvmem_retrieval_create(&s.re) != KVMEM_OK)
        return fail_view(&s, "allocation", KVMEM_ERR_NOMEM);
    uint64_t rng = seed ^ 0x5eedull;
    for (int a = 0; a < kvm_demo_n_agents; a++) {
        const kvm_demo_agent *da = &kvm_demo_agents[a];
        kvmem_agent *ag = NULL;
        if ((st = kvmem_agent_open(s.pool, da->id, &ag)) != KVMEM_OK) return fail_view(&s, "open", st);
        int32_t at = 0;
        for (int i = 0; i < da->n_steps; i++) {
            const kvm_demo_step *step = &da->steps[i];
            kvmem_agent_info ai;
            kvmem_agent_get_info(ag, &ai);
            int T = step->tokens;
            if (step->ask) {
                kvm_synth_query(&s.syn, step->topic, step->tokens, &rng, s.q);
                if (strcmp(da->id, agent_id) == 0 && i + 1 == turn) {
                    st = view_question(&s, ag, &spec, da, turn, step, norm, agg, top_k, block_size, tau_s, tau_d, seed);
                    kvmem_agent_close(ag);
                    if (st != KVMEM_OK) return fail_view(&s, "view", st);
                    view_free(&s);
                    return 0;
                }
                T += KVM_DEMO_ANSWER_TOKENS;
            }
            if ((st = kvm_demo_add_turn(ag, &spec, &s.syn, step->topic, T, da->rotated, at, &rng, s.k, s.v, s.pos)) != KVMEM_OK)
                return fail_view(&s, "append", st);
            at += T;
            kvmem_agent_info a2;
            kvmem_agent_get_info(ag, &a2);
            for (int32_t b = ai.n_sealed; b < a2.n_sealed && b < 8192; b++) s.topic[b] = step->topic;
        }
        kvmem_agent_close(ag);
    }
    view_free(&s);
    fprintf(stderr, "kvmem demo: agent '%s' asks no question at turn %d (questions:", agent_id, turn);
    for (int a = 0; a < kvm_demo_n_agents; a++)
        for (int i = 0; i < kvm_demo_agents[a].n_steps; i++)
            if (kvm_demo_agents[a].steps[i].ask) fprintf(stderr, " %s %d", kvm_demo_agents[a].id, i + 1);
    fprintf(stderr, ")\n");
    return 2;
}
