/* tinyllm eval --beyond: memory past the model's trained window.
 *
 * Each case of the suite is one agent's history, several windows long: an
 * introduction that names a character (after 0-3 unrelated sessions), many
 * unrelated sessions, then a cue whose next word is the name. The history is
 * run through the model once, as an engine whose history no longer fits
 * would (tl_history_ingest: the sink and the newest tokens, re-encoded), and
 * kept in a kvmem agent; every method then builds the same window (the
 * model's trained length, the cue and the name reserved) from that agent or
 * from the history's text, and the cue runs over it:
 *   - the recent window, StreamingLLM, H2O, SnapKV, IntentKV: eviction to
 *     the window (kept rows re-encoded at contiguous positions);
 *   - every history row at its own position, past the window (told to);
 *   - a stateless text agent: BOS and the newest history text re-prefilled;
 *   - text RAG: the history's text in 16-token chunks or sentences, ranked
 *     by BM25 against the cue's text, the chosen chunks' text re-prefilled
 *     (chronological) before the live context's text;
 *   - MemArt: blocks retrieved by the cue's queries (the probe: the cue over
 *     the newest 32 history tokens, counted), gathered and re-encoded before
 *     the live context (the newest history tokens, kept as KV);
 *   - oracles: the block or text chunk holding the name's first mention,
 *     alone, forced into the method's choice where its order puts it, or
 *     right before the live context.
 * Memory takes 25/50/75% of the window; the live context what is left (or
 * a set share). Placement (chronological, by score, runs by score; the
 * BOS/sink kept apart) and the split are measured on MemArt.
 * Scores: the name's first token top-1 and rank, the whole name's
 * log-probability (teacher-forced), by distance in windows and apart for
 * cases with sessions before the introduction; tokens run through the model
 * per turn; the wall time from the turn's start to its first token's logits
 * (time to first token), also after a restart (the agent saved as f16 or Q4
 * and loaded into a fresh pool). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "beyond_eval.h"

#define BS 16

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const double k_fracs[3] = {0.25, 0.5, 0.75};

/* ---- the method list ---- */

static bx_method *add(bx_results *r, bx_sel sel, bx_group g, const char *name) {
    if (r->n_methods == BX_MAX_METHODS) return NULL;
    bx_method *m = &r->methods[r->n_methods++];
    memset(m, 0, sizeof *m);
    m->sel = sel;
    m->group = g;
    m->mode = KVMEM_RETRIEVE_AABB;
    snprintf(m->name, sizeof m->name, "%s", name);
    return m;
}

static const char *sink_name(bx_sink s) { return s == BX_SINK_BOS ? "bos" : s == BX_SINK_BLOCK ? "block" : "none"; }

static void live_name(double live, char *buf, size_t n) {
    if (live > 0) snprintf(buf, n, "%g%%", 100 * live);
    else snprintf(buf, n, "rest");
}

static bx_method *memart(bx_results *r, bx_group g, int32_t mode, tl_order o, bx_sink s, double mem, double live,
                         int32_t top_k) {
    char nm[64], ln[16];
    live_name(live, ln, sizeof ln);
    snprintf(nm, sizeof nm, "memart%s %s sink=%s live=%s", mode == KVMEM_RETRIEVE_EXACT ? "-exact" : "",
             tl_order_name(o), sink_name(s), ln);
    if (top_k) snprintf(nm + strlen(nm), sizeof nm - strlen(nm), " k=%d", top_k);
    bx_method *m = add(r, BX_MEMART, g, nm);
    if (m) {
        m->mode = mode;
        m->order = o;
        m->sink = s;
        m->mem_frac = mem;
        m->live_frac = live;
        m->top_k = top_k;
    }
    return m;
}

static void build_methods(bx_results *r, const bx_cfg *c) {
    static const char *const evict[] = {"recent", "streamingllm", "h2o", "snapkv", "intentkv-rule"};
    for (int i = 0; i < 5; i++) add(r, (bx_sel)(BX_RECENT + i), BX_G_MAIN, evict[i]);
    add(r, BX_FULL_PAST, BX_G_MAIN, "full history past the window");
    add(r, BX_RECENT_TEXT, BX_G_MAIN, "recent text re-prefilled");
    add(r, BX_CONTROL_INTRO, BX_G_MAIN, "control: the intro, then the cue");
    add(r, BX_CONTROL_WINDOW, BX_G_MAIN, "control: a window from the intro, then the cue");
    int nf = c->quick ? 1 : 3;
    for (int fi = 0; fi < nf; fi++) {
        double f = k_fracs[fi];
        for (int ch = 0; ch < 2; ch++) {
            bx_method *m = add(r, BX_BM25, BX_G_MAIN, ch ? "bm25 sentences" : "bm25 16-token chunks");
            m->chunking = ch ? TL_CHUNK_SENTENCES : TL_CHUNK_TOKENS;
            m->mem_frac = f;
        }
        bx_method *m = add(r, BX_BM25, BX_G_MAIN, "bm25 16-token chunks, default placement");
        m->mem_frac = f;
        m->order = c->best_order;
        m->live_frac = c->best_live;
        r->deployed[fi] = r->n_methods;
        memart(r, BX_G_MAIN, KVMEM_RETRIEVE_AABB, TL_ORDER_CHRONO, BX_SINK_NONE, f, 0, 0);
        memart(r, BX_G_MAIN, KVMEM_RETRIEVE_EXACT, TL_ORDER_CHRONO, BX_SINK_NONE, f, 0, 0);
        r->best[fi] = r->n_methods;
        memart(r, BX_G_MAIN, KVMEM_RETRIEVE_AABB, c->best_order, c->best_sink, f, c->best_live, 0);
        r->best_exact[fi] = r->n_methods;
        memart(r, BX_G_MAIN, KVMEM_RETRIEVE_EXACT, c->best_order, c->best_sink, f, c->best_live, 0);
        static const char *const on[] = {"oracle block alone", "oracle block in memart's set",
                                         "oracle block before the live context"};
        static const char *const oc[] = {"oracle chunk alone", "oracle chunk in bm25's set",
                                         "oracle chunk before the live context"};
        for (int o = 0; o < 3; o++) {
            m = add(r, BX_MEMART, BX_G_MAIN, on[o]);
            m->oracle = (bx_oracle)(o + 1);
            m->mem_frac = f;
            m->order = TL_ORDER_CHRONO; /* where deployed MemArt puts it */
            m->sink = BX_SINK_NONE;
        }
        for (int o = 0; o < 3; o++) {
            m = add(r, BX_BM25, BX_G_MAIN, oc[o]);
            m->oracle = (bx_oracle)(o + 1);
            m->mem_frac = f;
        }
    }
    /* placement: order x sink, the live context filling the rest or a quarter */
    for (int fi = 0; fi < nf; fi++)
        for (int lv = 0; lv < 2; lv++)
            for (int o = 0; o < 3; o++)
                for (int sk = 0; sk < 3; sk++)
                    memart(r, BX_G_PLACE, KVMEM_RETRIEVE_AABB, (tl_order)o, (bx_sink)sk, k_fracs[fi], lv ? 0.25 : 0, 0);
    if (c->quick) return;
    /* the split: the live context's share, at the default placement */
    static const double lives[] = {0.125, 0.375, 0.5};
    for (int fi = 0; fi < nf; fi++)
        for (int li = 0; li < 3; li++)
            memart(r, BX_G_SPLIT, KVMEM_RETRIEVE_AABB, c->best_order, c->best_sink, k_fracs[fi], lives[li], 0);
    /* top-k: fewer blocks than the memory share holds, the live context unchanged */
    for (int fi = 0; fi < nf; fi++)
        for (int k = 1; k <= 8; k *= 2)
            if (k * BS < (int)(k_fracs[fi] * 256))
                memart(r, BX_G_TOPK, KVMEM_RETRIEVE_AABB, c->best_order, c->best_sink, k_fracs[fi], c->best_live, k);
    /* selection: the normalisation and aggregation of block scores, at the default placement */
    for (int fi = 0; fi < nf; fi++)
        for (int v = 1; v < 4; v++) {
            bx_method *m = memart(r, BX_G_SELECT, KVMEM_RETRIEVE_AABB, c->best_order, c->best_sink, k_fracs[fi],
                                  c->best_live, 0);
            m->norm = v & 2 ? KVMEM_NORM_RR : KVMEM_NORM_SOFTMAX;
            m->agg = v & 1 ? KVMEM_AGG_SUM : KVMEM_AGG_MAX;
            snprintf(m->name + strlen(m->name), sizeof m->name - strlen(m->name), " %s/%s", v & 2 ? "rr" : "softmax",
                     v & 1 ? "sum" : "max");
        }
    /* after a restart: the agent from its f16 / Q4 file, in a fresh pool */
    for (int d = 0; d < 2; d++) {
        bx_method *m = memart(r, BX_G_RESTART, KVMEM_RETRIEVE_AABB, c->best_order, c->best_sink, 0.25, c->best_live, 0);
        m->restart = d ? KVMEM_Q4 : KVMEM_F16;
        snprintf(m->name + strlen(m->name), sizeof m->name - strlen(m->name), " restart=%s", d ? "q4" : "f16");
    }
}

/* ---- one case ---- */

typedef struct bx_case {
    const tl_recall_case *rc;
    const tl_model *m;
    const tl_tokenizer *tok;
    tl_history h;
    tl_state *s;           /* chunks up to the window */
    tl_textmem *tm[2];     /* 16-token chunks, sentences */
    float *tsc[2];         /* their BM25 scores against the cue */
    float *probe;          /* [P][L][d] the cue's raw queries over the probe window */
    double probe_s, probe_cpu;
    int32_t W, N, P, K, R;
    char path[2][512];     /* saved agent files (f16, Q4) */
    float *logits;
    int32_t name_blocks[4], n_name_blocks; /* blocks holding the name's first mention */
    int32_t name_chunks[4], n_name_chunks; /* 16-token chunks holding it */
    uint8_t *mention;      /* [N] 1 on the tokens of every mention of the name */
} bx_case;

typedef struct bx_out {
    int32_t rank, top;
    double lp, seconds, cpu, cpu0; /* cpu0: this thread's CPU clock at the turn's start */
    int64_t prefill, mem_rows, live_rows;
    int selected;
    int32_t order[64], n_order; /* MemArt: blocks in window order */
} bx_out;

static int in_list(const int32_t *a, int32_t n, int32_t x) {
    for (int32_t i = 0; i < n; i++)
        if (a[i] == x) return 1;
    return 0;
}

/* Run the cue (at positions base..) over kv, score the name. t0: the turn's start. */
static int run_cue(bx_case *bc, tl_kv *kv, int32_t base, double t0, bx_out *o, char *err, size_t err_size) {
    const tl_recall_case *rc = bc->rc;
    const int32_t *prompt = rc->tok + rc->n_hist, *name = prompt + bc->P;
    int32_t V = bc->m->cfg.vocab_size, pos[512];
    for (int32_t i = 0; i < bc->P + bc->K && i < 512; i++) pos[i] = base + i;
    if (bc->P > 1 && tl_forward(bc->m, bc->s, kv, prompt, bc->P - 1, pos, NULL, NULL, NULL, NULL))
        return tl_errf(err, err_size, "cue prefill: %s", tl_state_error(bc->s));
    o->lp = 0;
    for (int32_t i = 0; i < bc->K; i++) {
        const int32_t *t = i == 0 ? prompt + bc->P - 1 : name + i - 1;
        if (tl_forward(bc->m, bc->s, kv, t, 1, pos + bc->P - 1 + i, bc->logits, NULL, NULL, NULL))
            return tl_errf(err, err_size, "decode: %s", tl_state_error(bc->s));
        if (i == 0) {
            o->seconds = tl_now_s() - t0;
            o->cpu = cpu_now() - o->cpu0;
            o->rank = tl_rank_of(bc->logits, V, name[0]);
            o->top = tl_argmax(bc->logits, V);
        }
        o->lp += tl_log_softmax_at(bc->logits, V, name[i]);
    }
    return 0;
}

/* The eviction baselines and the full history, through tl_memory_build. */
static int run_evict(bx_case *bc, const bx_method *me, tl_kv *kv, bx_out *o, char *err, size_t err_size) {
    static const char *const names[] = {"recent", "streamingllm", "h2o", "snapkv", "intentkv-rule", "full"};
    tl_method all[64];
    int32_t n = tl_method_list(all, 64, NULL, 0), at = -1;
    for (int32_t i = 0; i < n && i < 64; i++)
        if (!strcmp(all[i].name, names[me->sel - BX_RECENT]) && !all[i].art) at = i;
    if (at < 0) return tl_errf(err, err_size, "%s is not in this build", me->name);
    tl_method tm = all[at];
    int past = me->sel == BX_FULL_PAST;
    tm.reencode = !past;
    double t0 = tl_now_s();
    int64_t budget = past ? 0 : bc->W - bc->R;
    if (tl_memory_build(&bc->h, &tm, budget, NULL, 0, bc->N, kv, err, err_size)) return -1;
    o->mem_rows = kv->n;
    o->prefill = bc->P;
    tl_state_allow_past_window(bc->s, past);
    int rc = run_cue(bc, kv, past ? bc->N : kv->n, t0, o, err, err_size);
    tl_state_allow_past_window(bc->s, 0);
    return rc;
}

/* MemArt: retrieval by the cue's queries, placement, the live context. */
static int run_memart(bx_case *bc, tl_history *h, const float *probe, const bx_method *me, tl_kv *kv, double t0,
                      bx_out *o, char *err, size_t err_size) {
    tl_split sp = tl_window_split(bc->W, bc->R, me->mem_frac, me->live_frac, BS);
    int32_t mem = me->top_k ? me->top_k * BS : sp.memory, live = sp.live;
    int32_t extra = me->sink == BX_SINK_BOS ? 1 : 0; /* the BOS row alone */
    if (mem + live + extra > bc->W - bc->R) live = bc->W - bc->R - mem - extra;
    if (live < 0) live = 0;
    int64_t live_start = bc->N - live;
    kvmem_agent_info ai;
    if (kvmem_agent_get_info(h->agent, &ai) != KVMEM_OK) return tl_errf(err, err_size, "agent info: %s", kvmem_last_error());
    int32_t n_cand = tl_history_blocks_before(h, live_start), k = mem / BS;
    int32_t ids[64], n = 0;
    float sc[64];
    kvmem_retrieval *r = NULL;
    int rc = 0;
    if (k > 64) k = 64;
    if (me->oracle == BX_ORACLE_ONLY) {
        for (int32_t i = 0; i < bc->n_name_blocks && n < k; i++)
            if (bc->name_blocks[i] < n_cand) {
                ids[n] = bc->name_blocks[i];
                sc[n++] = 0;
            }
    } else if (k > 0) {
        kvmem_retrieve_params p = kvmem_retrieve_default_params();
        int32_t excl = 0;
        p.top_k = k - (me->sink == BX_SINK_BLOCK);
        p.skip_recent = ai.n_sealed - n_cand;
        p.mode = (kvmem_retrieve_mode)me->mode;
        p.norm = (kvmem_retrieve_norm)me->norm;
        p.agg = (kvmem_retrieve_agg)me->agg;
        if (me->sink == BX_SINK_BLOCK) {
            p.exclude = &excl;
            p.n_exclude = 1;
        }
        kvmem_tensor qt;
        int64_t qs[4] = {bc->P, h->n_layers, h->n_heads, h->head_dim};
        kvmem_tensor_init(&qt, (void *)(uintptr_t)probe, KVMEM_F32, 4, qs);
        const int32_t *blocks;
        const float *scores, *all;
        int32_t nb, n_all;
        if (p.top_k > 0) {
            if (kvmem_retrieval_create(&r) != KVMEM_OK || kvmem_retrieve(h->agent, &qt, &p, r) != KVMEM_OK ||
                kvmem_retrieval_get(r, 0, &blocks, &scores, &nb) != KVMEM_OK ||
                kvmem_retrieval_block_scores(r, 0, &all, &n_all) != KVMEM_OK) {
                rc = tl_errf(err, err_size, "retrieve: %s", kvmem_last_error());
                goto done;
            }
            for (int32_t i = 0; i < nb && n < 64; i++) {
                ids[n] = blocks[i];
                sc[n++] = scores[i];
            }
            if (me->oracle == BX_ORACLE_SET || me->oracle == BX_ORACLE_NEAR)
                for (int32_t j = 0; j < bc->n_name_blocks; j++) {
                    int32_t b = bc->name_blocks[j];
                    if (b >= n_cand || in_list(ids, n, b)) continue;
                    if (n == p.top_k) { /* drop the weakest block that is not the name's */
                        int32_t w = -1;
                        for (int32_t i = 0; i < n; i++)
                            if (!in_list(bc->name_blocks, bc->n_name_blocks, ids[i]) && (w < 0 || sc[i] < sc[w])) w = i;
                        if (w < 0) continue;
                        ids[w] = ids[--n];
                        sc[w] = sc[n];
                    }
                    ids[n] = b;
                    sc[n++] = b < n_all && all[b] == all[b] ? all[b] : 0;
                }
        }
    }
    int32_t out[66], no = 0;
    if (tl_place(ids, sc, n, me->order, out + 1)) {
        rc = tl_errf(err, err_size, "placement failed");
        goto done;
    }
    no = n;
    if (me->oracle == BX_ORACLE_NEAR) { /* the name's blocks last, the rest in their order */
        int32_t tmp[66], nt = 0;
        for (int32_t i = 0; i < no; i++)
            if (!in_list(bc->name_blocks, bc->n_name_blocks, out[1 + i])) tmp[nt++] = out[1 + i];
        for (int32_t i = 0; i < no; i++)
            if (in_list(bc->name_blocks, bc->n_name_blocks, out[1 + i])) tmp[nt++] = out[1 + i];
        memcpy(out + 1, tmp, (size_t)no * sizeof(int32_t));
    }
    int32_t *ord = out + 1, bos_row = 0;
    if (me->sink == BX_SINK_BLOCK && n_cand > 0) {
        out[0] = 0;
        ord = out;
        no++;
    } else if (me->sink == BX_SINK_BOS) {
        int32_t at = -1;
        for (int32_t i = 0; i < no; i++)
            if (ord[i] == 0) at = i;
        if (at >= 0) { /* block 0 holds the sink: it goes first */
            memmove(ord + 1, ord, (size_t)at * sizeof(int32_t));
            ord[0] = 0;
        } else {
            bos_row = 1;
        }
    }
    kv->n = 0;
    if ((bos_row && tl_window_put_tokens(h, 0, 1, 0, kv, err, err_size)) ||
        tl_window_put_blocks(h, ord, no, kv->n, kv, err, err_size)) {
        rc = -1;
        goto done;
    }
    o->mem_rows = kv->n;
    if (tl_window_put_tokens(h, live_start, live, kv->n, kv, err, err_size)) {
        rc = -1;
        goto done;
    }
    o->live_rows = live;
    o->prefill = 2 * bc->P; /* the probe and the cue */
    o->selected = bos_row && bc->mention[0];
    for (int32_t i = 0; i < no; i++) {
        kvmem_block_info bi;
        if (kvmem_agent_block_info(h->agent, ord[i], &bi) != KVMEM_OK) continue;
        for (int64_t t = bi.first_token; t < bi.first_token + bi.n_tokens; t++) o->selected |= bc->mention[t];
    }
    o->n_order = no < 64 ? no : 64;
    memcpy(o->order, ord, (size_t)o->n_order * sizeof(int32_t));
    rc = run_cue(bc, kv, kv->n, t0, o, err, err_size);
done:
    kvmem_retrieval_free(r);
    return rc;
}

/* Text: BOS, chunks' text, the live context's text, the cue; all prefilled. */
static int run_text(bx_case *bc, const bx_method *me, tl_kv *kv, bx_out *o, char *err, size_t err_size) {
    const int32_t *hist = bc->rc->tok;
    double t0 = tl_now_s();
    int32_t *ids = malloc((size_t)(bc->W + 1) * sizeof(int32_t)), n = 0;
    if (!ids) return tl_errf(err, err_size, "out of memory");
    ids[n++] = 1; /* BOS: a fresh prefill starts the model's way */
    int32_t live, mem = 0;
    int rc = 0;
    if (me->sel == BX_RECENT_TEXT) {
        live = bc->W - bc->R - 1;
    } else if (me->sel == BX_CONTROL_INTRO || me->sel == BX_CONTROL_WINDOW) {
        /* the history cut so that it fits: the intro (and what follows, up to a window) */
        const tl_recall_case *cs = bc->rc;
        int32_t a = cs->intro_start, e = cs->n_before + 1 < cs->n_sessions ? cs->session_start[cs->n_before + 1] : bc->N;
        if (hist[a] == 1) a++; /* the intro opens the history: its BOS is ours */
        if (me->sel == BX_CONTROL_WINDOW) e = bc->N;
        if (e - a > bc->W - bc->R - 1) e = a + bc->W - bc->R - 1;
        memcpy(ids + n, hist + a, (size_t)(e - a) * sizeof(int32_t));
        n += e - a;
        live = 0;
        o->selected = 1;
    } else {
        tl_split sp = tl_window_split(bc->W, bc->R, me->mem_frac, me->live_frac, BS);
        mem = sp.memory;
        live = sp.live;
        if (mem + live + 1 > bc->W - bc->R) live = bc->W - bc->R - mem - 1;
        int ti = me->chunking == TL_CHUNK_SENTENCES;
        const tl_textmem *tm = bc->tm[ti];
        /* the cue's text ranks the chunks: what an agent would search with */
        size_t qlen;
        char *q = tl_decode_len(bc->tok, hist + bc->rc->n_hist, bc->P, &qlen);
        if (!q) {
            free(ids);
            return tl_errf(err, err_size, "cannot decode the cue");
        }
        tl_textmem_score(tm, q, qlen, bc->tsc[ti]);
        free(q);
        int32_t nc = tl_textmem_count(tm), *ch = malloc(((size_t)nc + 8) * sizeof(int32_t)), k = 0, used = 0;
        float *cs = malloc(((size_t)nc + 8) * sizeof(float));
        int32_t *ord = malloc(((size_t)nc + 8) * sizeof(int32_t));
        if (!ch || !cs || !ord) {
            free(ch);
            free(cs);
            free(ord);
            free(ids);
            return tl_errf(err, err_size, "out of memory");
        }
        int32_t limit = bc->N - live;
        if (me->oracle == BX_ORACLE_ONLY) {
            for (int32_t j = 0; j < bc->n_name_chunks; j++) {
                tl_chunk c = tl_textmem_chunk(tm, bc->name_chunks[j]);
                if (used + c.n <= mem && c.first + c.n <= limit) {
                    ch[k++] = bc->name_chunks[j];
                    used += c.n;
                }
            }
        } else {
            int32_t need = 0;
            if (me->oracle) /* room for the name's chunks first */
                for (int32_t j = 0; j < bc->n_name_chunks; j++) need += tl_textmem_chunk(tm, bc->name_chunks[j]).n;
            k = tl_textmem_choose(tm, bc->tsc[ti], mem - (me->oracle ? need : 0), limit, ch, nc, &used);
            if (me->oracle) {
                for (int32_t j = 0; j < bc->n_name_chunks; j++) {
                    tl_chunk c = tl_textmem_chunk(tm, bc->name_chunks[j]);
                    if (!in_list(ch, k, bc->name_chunks[j]) && c.first + c.n <= limit) {
                        ch[k++] = bc->name_chunks[j];
                        used += c.n;
                    }
                }
                /* if the name's chunks were chosen anyway, fill the room they kept */
                int32_t more = tl_textmem_choose(tm, bc->tsc[ti], mem, limit, ord, nc, NULL);
                for (int32_t i = 0; i < more; i++) {
                    tl_chunk c = tl_textmem_chunk(tm, ord[i]);
                    if (!in_list(ch, k, ord[i]) && used + c.n <= mem) {
                        ch[k++] = ord[i];
                        used += c.n;
                    }
                }
            }
        }
        for (int32_t i = 0; i < k; i++) cs[i] = bc->tsc[ti][ch[i]];
        tl_place(ch, cs, k, me->order, ord);
        if (me->oracle == BX_ORACLE_NEAR) {
            int32_t t = 0;
            for (int32_t i = 0; i < k; i++)
                if (!in_list(bc->name_chunks, bc->n_name_chunks, ord[i])) ch[t++] = ord[i];
            for (int32_t i = 0; i < k; i++)
                if (in_list(bc->name_chunks, bc->n_name_chunks, ord[i])) ch[t++] = ord[i];
            memcpy(ord, ch, (size_t)k * sizeof(int32_t));
        }
        o->selected = 0;
        for (int32_t i = 0; i < k; i++) {
            tl_chunk c = tl_textmem_chunk(tm, ord[i]);
            memcpy(ids + n, hist + c.first, (size_t)c.n * sizeof(int32_t));
            n += c.n;
            for (int32_t t = c.first; t < c.first + c.n; t++) o->selected |= bc->mention[t];
        }
        free(ch);
        free(cs);
        free(ord);
    }
    o->mem_rows = n;
    memcpy(ids + n, hist + bc->N - live, (size_t)live * sizeof(int32_t)); /* the live context's text */
    n += live;
    o->live_rows = live;
    kv->n = 0;
    int32_t *pos = malloc((size_t)n * sizeof(int32_t));
    if (!pos) rc = tl_errf(err, err_size, "out of memory");
    for (int32_t i = 0; !rc && i < n; i++) pos[i] = i;
    if (!rc && tl_forward(bc->m, bc->s, kv, ids, n, pos, NULL, NULL, NULL, NULL))
        rc = tl_errf(err, err_size, "text prefill: %s", tl_state_error(bc->s));
    free(pos);
    free(ids);
    o->prefill = n + bc->P;
    if (!rc) rc = run_cue(bc, kv, n, t0, o, err, err_size);
    return rc;
}

/* The cue's raw queries over the newest probe_window history tokens. */
static int probe_queries(bx_case *bc, tl_history *h, int32_t pw, float *q, char *err, size_t err_size) {
    tl_kv kv;
    if (tl_kv_init(&kv, &bc->m->cfg, pw + bc->P)) return tl_errf(err, err_size, "out of memory");
    int32_t pos[512];
    for (int32_t i = 0; i < bc->P && i < 512; i++) pos[i] = pw + i;
    int rc = tl_window_put_tokens(h, h->n - pw, pw, 0, &kv, err, err_size);
    tl_trace tr = {0};
    tr.q_raw = q;
    if (!rc && tl_forward(bc->m, bc->s, &kv, bc->rc->tok + bc->rc->n_hist, bc->P, pos, NULL, &tr, NULL, NULL))
        rc = tl_errf(err, err_size, "probe: %s", tl_state_error(bc->s));
    tl_kv_free(&kv);
    return rc;
}

/* Copy the agent into a pool storing `dt` and save it (what a restart loads). */
static int save_copy(bx_case *bc, kvmem_context *ctx, kvmem_dtype dt, const char *path, char *err, size_t err_size) {
    tl_history h2;
    int32_t N = bc->N;
    if (tl_history_init(&h2, ctx, bc->m, N, dt, BS, "restart", err, err_size)) return -1;
    size_t sz = (size_t)bc->h.n_layers * (size_t)N * (size_t)bc->h.kv_dim;
    float *k = malloc(sz * sizeof(float)), *v = malloc(sz * sizeof(float));
    int rc = -1;
    if (!k || !v) {
        tl_errf(err, err_size, "out of memory");
        goto out;
    }
    if (tl_history_read_raw(&bc->h, 0, N, k, v, err, err_size)) goto out;
    kvmem_tensor kt, vt;
    int64_t shape[4] = {bc->h.n_layers, N, bc->h.n_kv_heads, bc->h.head_dim};
    kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape);
    kvmem_append_params ap = kvmem_append_default_params();
    ap.token_ids = bc->rc->tok;
    if (kvmem_agent_append(h2.agent, &kt, &vt, &ap) != KVMEM_OK) {
        tl_errf(err, err_size, "append: %s", kvmem_last_error());
        goto out;
    }
    rc = tl_history_save(&h2, path, err, err_size);
out:
    free(k);
    free(v);
    tl_history_free(&h2);
    return rc;
}

static int run_restart(bx_case *bc, kvmem_context *ctx, const bx_method *me, tl_kv *kv, int32_t pw, bx_out *o,
                       double *load_ms, char *err, size_t err_size) {
    const char *path = bc->path[me->restart == KVMEM_Q4];
    tl_history h2;
    double t0 = tl_now_s();
    if (tl_history_init(&h2, ctx, bc->m, bc->N, me->restart, BS, "restart", err, err_size)) return -1;
    int rc = tl_history_load(&h2, path, err, err_size);
    *load_ms = 1e3 * (tl_now_s() - t0);
    float *q = malloc((size_t)bc->P * (size_t)h2.n_layers * (size_t)h2.q_dim * sizeof(float));
    if (!rc && !q) rc = tl_errf(err, err_size, "out of memory");
    if (!rc) rc = probe_queries(bc, &h2, pw, q, err, err_size);
    if (!rc) rc = run_memart(bc, &h2, q, me, kv, t0, o, err, err_size);
    free(q);
    tl_history_free(&h2);
    return rc;
}

static int bucket(int32_t distance, int32_t W) {
    double w = (double)distance / W;
    return w < 2 ? 0 : w < 4 ? 1 : w < 7 ? 2 : 3;
}

static void tally(bx_score *a, const bx_out *o, const tl_recall_case *rc, int32_t W, int32_t ci) {
    int g = rc->n_before > 0, b = bucket(rc->distance, W), hit = o->rank == 1;
    a->n++;
    a->hits += hit;
    a->n_g[g]++;
    a->hits_g[g] += hit;
    a->bn[b]++;
    a->bh[b] += hit;
    a->bn_g[g][b]++;
    a->bh_g[g][b] += hit;
    a->rank_sum += o->rank;
    a->lp_sum += o->lp;
    a->lp_g[g] += o->lp;
    a->prefill += o->prefill;
    a->mem_rows += o->mem_rows;
    a->live_rows += o->live_rows;
    a->selected += o->selected;
    a->rank[ci] = o->rank;
    a->seconds[ci] = o->seconds;
    a->cpu[ci] = o->cpu;
}

/* Decoded text of tokens [first, first + n) of the case, one line, for the report. */
static void put_text(char **buf, size_t *len, size_t *cap, const tl_tokenizer *tok, const int32_t *ids, int32_t n,
                     const char *pre, const char *post) {
    char *s = tl_decode(tok, ids, n);
    size_t need = strlen(pre) + (s ? strlen(s) : 0) + strlen(post) + 1;
    if (*len + need > *cap) {
        size_t nc = (*len + need) * 2;
        char *p = realloc(*buf, nc);
        if (!p) {
            free(s);
            return;
        }
        *buf = p;
        *cap = nc;
    }
    *len += (size_t)sprintf(*buf + *len, "%s", pre);
    for (const char *c = s ? s : ""; *c; c++) (*buf)[(*len)++] = *c == '\n' ? ' ' : *c == '|' ? '/' : *c;
    *len += (size_t)sprintf(*buf + *len, "%s", post);
    free(s);
}

static void inspect(bx_results *res, bx_case *bc, int which, const bx_out *o) {
    if (o->rank == 1 || res->n_inspected[which] >= 6) return;
    res->n_inspected[which]++;
    const tl_recall_case *rc = bc->rc;
    char line[512];
    int32_t V = bc->m->cfg.vocab_size;
    (void)V;
    size_t pl;
    const char *top = tl_token_piece(bc->tok, -1, o->top, &pl);
    snprintf(line, sizeof line, "\n- **%s** (%s; %d sessions before the intro, name %.1f windows back): rank %d, "
             "top-1 \"%.*s\"; the name's first block %d; a block naming it %s. Window (memory in order, then "
             "the live context):\n",
             rc->id, which ? "default placement" : "as deployed", rc->n_before, (double)rc->distance / bc->W, o->rank,
             (int)(pl < 40 ? pl : 40), top ? top : "?", bc->name_blocks[0], o->selected ? "selected" : "not selected");
    put_text(&res->inspect, &res->inspect_len, &res->inspect_cap, bc->tok, NULL, 0, line, "");
    for (int32_t i = 0; i < o->n_order; i++) {
        int32_t b = o->order[i];
        int32_t first = b * BS, n = first + BS <= bc->N ? BS : bc->N - first;
        snprintf(line, sizeof line, "  - block %d%s: `", b, in_list(bc->name_blocks, bc->n_name_blocks, b) ? " (name)" : "");
        put_text(&res->inspect, &res->inspect_len, &res->inspect_cap, bc->tok, rc->tok + first, n, line, "`\n");
    }
    snprintf(line, sizeof line, "  - live context: %lld tokens, then the cue `", (long long)o->live_rows);
    put_text(&res->inspect, &res->inspect_len, &res->inspect_cap, bc->tok, rc->tok + rc->n_hist, bc->P, line, "`\n");
}

static void case_init(bx_case *bc, const tl_recall_suite *s, int32_t ci, const tl_model *m) {
    const tl_recall_case *rc = &s->cases[ci];
    memset(bc, 0, sizeof *bc);
    bc->rc = rc;
    bc->m = m;
    bc->tok = s->tok;
    bc->W = m->cfg.seq_len;
    bc->N = rc->n_hist;
    bc->P = rc->n_prompt;
    bc->K = rc->n_name;
    bc->R = bc->P + bc->K;
}

static int run_one_case(const tl_recall_suite *s, int32_t ci, const tl_model *m, const bx_cfg *c, kvmem_context *ctx,
                        bx_results *res, bx_out *outs, char *err, size_t err_size) {
    const tl_recall_case *rc = &s->cases[ci];
    bx_case bc;
    case_init(&bc, s, ci, m);
    int rcode = -1;
    tl_kv kv;
    memset(&kv, 0, sizeof kv);
    bc.s = tl_state_create(&m->cfg, bc.W);
    bc.logits = malloc((size_t)m->cfg.vocab_size * sizeof(float));
    bc.probe = malloc((size_t)bc.P * (size_t)m->cfg.n_layers * (size_t)m->cfg.dim * sizeof(float));
    if (!bc.s || !bc.logits || !bc.probe || tl_kv_init(&kv, &m->cfg, bc.N + bc.R + bc.W)) {
        tl_errf(err, err_size, "out of memory");
        goto out;
    }
    /* the history, session by session, as the engine lived it */
    double t0 = tl_now_s();
    if (tl_history_init(&bc.h, ctx, m, bc.N, c->storage, BS, "beyond", err, err_size)) goto out;
    for (int32_t k = 0; k < rc->n_sessions; k++) {
        int32_t a = rc->session_start[k], e = k + 1 < rc->n_sessions ? rc->session_start[k + 1] : bc.N;
        if (tl_history_ingest(&bc.h, m, bc.s, rc->tok + a, e - a, c->sink_tokens, e - a, err, err_size)) goto out;
    }
    res->ingest_ms[ci] = 1e3 * (tl_now_s() - t0);
    for (int32_t i = 0; i < bc.K && bc.n_name_blocks < 4; i++) {
        int32_t b = tl_history_block_of(&bc.h, rc->name_at + i);
        if (b >= 0 && !in_list(bc.name_blocks, bc.n_name_blocks, b)) bc.name_blocks[bc.n_name_blocks++] = b;
    }
    bc.mention = calloc((size_t)bc.N + 1, 1);
    if (!bc.mention) goto out;
    {
        const int32_t *nm = rc->tok + bc.N + bc.P;
        for (int32_t i = 0; i + bc.K <= bc.N; i++)
            if (!memcmp(rc->tok + i, nm, (size_t)bc.K * sizeof(int32_t))) memset(bc.mention + i, 1, (size_t)bc.K);
    }
    for (int ti = 0; ti < 2; ti++) {
        if (tl_textmem_create(s->tok, rc->tok, bc.N, ti ? TL_CHUNK_SENTENCES : TL_CHUNK_TOKENS, BS, &bc.tm[ti], err,
                              err_size))
            goto out;
        bc.tsc[ti] = malloc(((size_t)tl_textmem_count(bc.tm[ti]) + 1) * sizeof(float));
        if (!bc.tsc[ti]) goto out;
    }
    for (int32_t i = 0; i < bc.K && bc.n_name_chunks < 4; i++) {
        int32_t ch = tl_textmem_find(bc.tm[0], rc->name_at + i);
        if (ch >= 0 && !in_list(bc.name_chunks, bc.n_name_chunks, ch)) bc.name_chunks[bc.n_name_chunks++] = ch;
    }
    t0 = tl_now_s();
    double c0 = cpu_now();
    if (probe_queries(&bc, &bc.h, c->probe_window, bc.probe, err, err_size)) goto out;
    bc.probe_s = tl_now_s() - t0;
    bc.probe_cpu = cpu_now() - c0;
    int need_restart = 0;
    for (int32_t mi = 0; mi < res->n_methods; mi++) need_restart |= res->methods[mi].group == BX_G_RESTART;
    for (int d = 0; d < 2 && need_restart; d++) {
        snprintf(bc.path[d], sizeof bc.path[d], "%s/tinyllm-beyond-%d-%d-%d.safetensors",
                 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(), (int)ci, d);
        if (save_copy(&bc, ctx, d ? KVMEM_Q4 : KVMEM_F16, bc.path[d], err, err_size)) goto out;
    }
    for (int32_t mi = 0; mi < res->n_methods; mi++) {
        const bx_method *me = &res->methods[mi];
        bx_out o;
        memset(&o, 0, sizeof o);
        o.cpu0 = cpu_now() - (me->sel == BX_MEMART && me->group != BX_G_RESTART ? bc.probe_cpu : 0);
        int r;
        if (me->group == BX_G_RESTART) {
            double lms = 0;
            r = run_restart(&bc, ctx, me, &kv, c->probe_window, &o, &lms, err, err_size);
            res->load_ms[me->restart == KVMEM_Q4][ci] = lms;
        } else if (me->sel == BX_MEMART) {
            /* the probe ran once for all MemArt rows: its time counts in each */
            r = run_memart(&bc, &bc.h, bc.probe, me, &kv, tl_now_s() - bc.probe_s, &o, err, err_size);
        } else if (me->sel == BX_BM25 || me->sel == BX_RECENT_TEXT || me->sel == BX_CONTROL_INTRO ||
                   me->sel == BX_CONTROL_WINDOW) {
            r = run_text(&bc, me, &kv, &o, err, err_size);
        } else {
            r = run_evict(&bc, me, &kv, &o, err, err_size);
        }
        if (r) {
            char e2[TL_ERR_SIZE];
            snprintf(e2, sizeof e2, "%s", err);
            tl_errf(err, err_size, "case %s, %s at %g%%: %s", rc->id, me->name, 100 * me->mem_frac, e2);
            goto out;
        }
        outs[mi] = o;
    }
    memcpy(res->notes[ci].name_blocks, bc.name_blocks, sizeof bc.name_blocks);
    res->notes[ci].n_name_blocks = bc.n_name_blocks;
    res->notes[ci].name_block = bc.name_blocks[0];
    rcode = 0;
out:
    for (int d = 0; d < 2; d++)
        if (bc.path[d][0]) unlink(bc.path[d]);
    tl_history_free(&bc.h);
    tl_state_free(bc.s);
    tl_kv_free(&kv);
    for (int ti = 0; ti < 2; ti++) {
        tl_textmem_free(bc.tm[ti]);
        free(bc.tsc[ti]);
    }
    free(bc.logits);
    free(bc.probe);
    free(bc.mention);
    return rcode;
}

/* Cases run by worker threads; results are tallied in case order after. */
typedef struct bx_pool {
    const tl_recall_suite *s;
    const tl_model *m;
    const bx_cfg *c;
    bx_results *res;
    atomic_int next, failed, done;
    pthread_mutex_t lock;
    char err[TL_ERR_SIZE];
} bx_pool;

typedef struct bx_worker {
    bx_pool *p;
    kvmem_context *given; /* the caller's context (the calling thread), else NULL: a context of its own */
} bx_worker;

static void *worker(void *arg) {
    bx_pool *p = ((bx_worker *)arg)->p;
    kvmem_context *ctx = ((bx_worker *)arg)->given;
    char err[TL_ERR_SIZE] = "";
    if (!ctx) {
        kvmem_context_params cp = kvmem_context_default_params();
        cp.backend = "cpu";
        cp.n_threads = 1;
        if (kvmem_context_create(&cp, &ctx) != KVMEM_OK) {
            tl_errf(err, sizeof err, "context: %s", kvmem_last_error());
            ctx = NULL;
        }
    }
    for (int32_t ci; ctx && !atomic_load(&p->failed) && (ci = atomic_fetch_add(&p->next, 1)) < p->s->n_cases;) {
        bx_out *outs = (bx_out *)p->res->outs + (size_t)ci * (size_t)p->res->n_methods;
        if (run_one_case(p->s, ci, p->m, p->c, ctx, p->res, outs, err, sizeof err)) {
            atomic_store(&p->failed, 1);
            break;
        }
        int k = atomic_fetch_add(&p->done, 1) + 1;
        if (p->c->progress) {
            const tl_recall_case *rc = &p->s->cases[ci];
            pthread_mutex_lock(&p->lock);
            fprintf(stderr, "%sbeyond: %d/%d cases (%s, %d tokens, name %.1f windows back)%s",
                    p->c->progress == 2 ? "\r\033[K" : "", k, p->s->n_cases, rc->id, rc->n_hist,
                    (double)rc->distance / p->m->cfg.seq_len, p->c->progress == 2 ? "" : "\n");
            pthread_mutex_unlock(&p->lock);
        }
    }
    if (err[0]) {
        atomic_store(&p->failed, 1);
        pthread_mutex_lock(&p->lock);
        if (!p->err[0]) snprintf(p->err, sizeof p->err, "%s", err);
        pthread_mutex_unlock(&p->lock);
    }
    if (ctx != ((bx_worker *)arg)->given) kvmem_context_free(ctx);
    return NULL;
}

int tl_beyond_run(const tl_recall_suite *s, const tl_model *m, const bx_cfg *c, kvmem_context *ctx, bx_results *res,
                  char *err, size_t err_size) {
    double t0 = tl_now_s();
    res->block_size = BS;
    build_methods(res, c);
    res->n_cases = s->n_cases;
    size_t nc = (size_t)s->n_cases + 1;
    res->ingest_ms = calloc(nc, sizeof(double));
    res->load_ms[0] = calloc(nc, sizeof(double));
    res->load_ms[1] = calloc(nc, sizeof(double));
    res->notes = calloc(nc, sizeof *res->notes);
    res->outs = calloc(nc * (size_t)res->n_methods, sizeof(bx_out));
    if (!res->ingest_ms || !res->load_ms[0] || !res->load_ms[1] || !res->notes || !res->outs)
        return tl_errf(err, err_size, "out of memory");
    for (int32_t mi = 0; mi < res->n_methods; mi++) {
        res->score[mi].rank = calloc(nc, sizeof(int32_t));
        res->score[mi].seconds = calloc(nc, sizeof(double));
        res->score[mi].cpu = calloc(nc, sizeof(double));
        if (!res->score[mi].rank || !res->score[mi].seconds || !res->score[mi].cpu)
            return tl_errf(err, err_size, "out of memory");
    }
    bx_pool p;
    memset(&p, 0, sizeof p);
    p.s = s;
    p.m = m;
    p.c = c;
    p.res = res;
    pthread_mutex_init(&p.lock, NULL);
    int32_t nt = c->threads < 1 ? 1 : c->threads > 16 ? 16 : c->threads;
    pthread_t th[16];
    bx_worker wk[16];
    int32_t started = 0;
    for (int32_t i = 0; i < nt; i++) {
        wk[i].p = &p;
        wk[i].given = i == 0 ? ctx : NULL;
    }
    for (int32_t i = 1; i < nt; i++)
        if (pthread_create(&th[i], NULL, worker, &wk[i]) == 0) started = i;
        else break;
    worker(&wk[0]); /* this thread works too, on the caller's context */
    for (int32_t i = 1; i <= started; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&p.lock);
    if (c->progress == 2) fprintf(stderr, "\r\033[K");
    if (atomic_load(&p.failed)) return tl_errf(err, err_size, "%s", p.err[0] ? p.err : "a worker failed");
    /* tally in case order: the same numbers whatever the threads did */
    for (int32_t ci = 0; ci < s->n_cases; ci++) {
        const tl_recall_case *rc = &s->cases[ci];
        bx_case bc;
        case_init(&bc, s, ci, m);
        memcpy(bc.name_blocks, res->notes[ci].name_blocks, sizeof bc.name_blocks);
        bc.n_name_blocks = res->notes[ci].n_name_blocks;
        res->ingest_seconds += res->ingest_ms[ci] / 1e3;
        res->hist_tokens += rc->n_hist;
        if (!res->hist_min || rc->n_hist < res->hist_min) res->hist_min = rc->n_hist;
        if (rc->n_hist > res->hist_max) res->hist_max = rc->n_hist;
        for (int32_t mi = 0; mi < res->n_methods; mi++) {
            const bx_out *o = (const bx_out *)res->outs + (size_t)ci * (size_t)res->n_methods + mi;
            tally(&res->score[mi], o, rc, bc.W, ci);
            for (int w = 0; w < 2; w++)
                if (mi == (w ? res->best[0] : res->deployed[0])) {
                    bx_case_note *nt2 = &res->notes[ci];
                    nt2->rank[w] = o->rank;
                    nt2->n_blocks[w] = o->n_order < 16 ? o->n_order : 16;
                    memcpy(nt2->blocks[w], o->order, (size_t)nt2->n_blocks[w] * sizeof(int32_t));
                    nt2->selected[w] = o->selected;
                    nt2->mem_rows[w] = o->mem_rows;
                    nt2->live_rows[w] = o->live_rows;
                    nt2->prefill[w] = o->prefill;
                    inspect(res, &bc, w, o);
                }
        }
    }
    res->seconds = tl_now_s() - t0;
    return 0;
}

void tl_beyond_free(bx_results *res) {
    for (int32_t mi = 0; mi < res->n_methods; mi++) {
        free(res->score[mi].rank);
        free(res->score[mi].seconds);
        free(res->score[mi].cpu);
    }
    free(res->ingest_ms);
    free(res->load_ms[0]);
    free(res->load_ms[1]);
    free(res->notes);
    free(res->inspect);
    free(res->outs);
    memset(res, 0, sizeof *res);
}
