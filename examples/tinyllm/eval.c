/* tinyllm eval: the fidelity harness. How well does each kvmem method keep
 * a real model's outputs at an equal KV budget, over all positions and over
 * the positions that depend on memory?
 *
 * Protocol. Sequences are sampled from the model itself (temperature 1, fixed
 * seeds; BOS first, up to the model's trained length) and split into turns of
 * turn_len tokens; the first prompt_len tokens of a turn are its "prompt"
 * (prefilled as one chunk), the rest are decoded one token at a time
 * (teacher-forced, so every method sees the same tokens). The reference is
 * full context: the engine's own exact attention over every earlier token.
 * Past turns live in a kvmem agent (appended post-RoPE with their positions,
 * exactly as the full-context pass computed them). For each evaluated turn t
 * each method builds its memory from the agent, at most `budget` history
 * tokens (a count, or a share of the history), then runs the turn on it. Per
 * position: top-1 agreement with full context and KL(full || method) in nats.
 *
 * Memory-dependent positions (LongPPL's key tokens, Fang et al. 2024): the
 * next token's log-probability under full context exceeds its
 * log-probability under a recent-window-only context by >= memdep_nats. The
 * recent-window context is what an agent without memory would see: the
 * current turn and the last W history tokens before it (after BOS), as text,
 * recomputed from scratch so it knows nothing older. Every method is also
 * scored on those positions alone.
 *
 * Also reported: tokens run through the model per turn (prefill; MemArt's
 * probe counted), KV bytes read per decoded token (f32 working set; ART
 * counts only the rows it read), and the recall suite (recall.c).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "app.h"
#include "beyond_eval.h"
#include "cli.h"
#include "eval.h"
#include "internal.h"

typedef struct ev_ref {
    int32_t n;
    int32_t *tok;
    float *logits;    /* [n][V] */
    float *k_rot, *v; /* [L][n][kvd] */
    float *q_rot;     /* [n][L][d] */
    float *acc;       /* [n_turns][n] H2O accumulator after each turn */
    float *lp_full;   /* [n] log p(tok[i+1] | full context up to i) */
    float *lp_short;  /* [n] the same under the recent-window-only context */
    uint8_t *memdep;  /* [n] 1 where lp_full - lp_short >= memdep_nats */
} ev_ref;

double tl_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double tl_log_softmax_at(const float *logits, int32_t n, int32_t at) {
    float mx = logits[0];
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    double z = 0;
    for (int32_t i = 0; i < n; i++) z += exp((double)logits[i] - mx);
    return (double)logits[at] - mx - log(z);
}

int32_t tl_rank_of(const float *logits, int32_t n, int32_t at) {
    int32_t r = 1;
    for (int32_t i = 0; i < n; i++) r += logits[i] > logits[at] || (logits[i] == logits[at] && i < at);
    return r;
}

int64_t tl_budget_tokens(const tl_budget *b, int64_t history, int32_t block) {
    if (b->frac <= 0) return b->tokens;
    int64_t t = (int64_t)llround(b->frac * (double)history / block) * block;
    return t < block ? block : t;
}

void tl_budget_name(const tl_budget *b, char *buf, size_t size) {
    if (b->frac > 0) snprintf(buf, size, "%g%%", 100.0 * b->frac);
    else snprintf(buf, size, "%lld", (long long)b->tokens);
}

void tl_progress(const tl_eval_cfg *c, const char *fmt, ...) {
    if (!c->progress) return;
    char line[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* a terminal gets one line rewritten in place; a log gets every line */
    if (c->progress == 2) fprintf(stderr, "\r\033[K%s", line);
    else fprintf(stderr, "%s\n", line);
    fflush(stderr);
}

static void ref_free(ev_ref *r) {
    free(r->tok);
    free(r->logits);
    free(r->k_rot);
    free(r->v);
    free(r->q_rot);
    free(r->acc);
    free(r->lp_full);
    free(r->lp_short);
    free(r->memdep);
    memset(r, 0, sizeof *r);
}

/* The recent-window-only context of turn t: BOS, the last W history tokens
 * before the turn (positions 1..W), then the turn itself, recomputed from
 * scratch so it knows nothing older. One chunk per turn gives
 * log p(next | that context) for every position of the turn. The first turns
 * (history <= W) see everything: no position there is memory-dependent. */
static int short_context_logprobs(const tl_model *m, const tl_eval_cfg *c, ev_ref *r) {
    const tl_config *mc = &m->cfg;
    int32_t W = c->window, T = c->turn_len, V = mc->vocab_size, n = 1 + W + T;
    tl_state *s = tl_state_create(mc, n);
    tl_kv kv;
    float *logits = malloc((size_t)n * (size_t)V * sizeof(float));
    int32_t *tok = malloc((size_t)n * sizeof(int32_t)), *pos = malloc((size_t)n * sizeof(int32_t));
    int rc = -1;
    memset(&kv, 0, sizeof kv);
    if (!s || !logits || !tok || !pos || tl_kv_init(&kv, mc, n)) goto out;
    for (int32_t i = 0; i < n; i++) pos[i] = i;
    for (int32_t i = 0; i + 1 < r->n; i++) r->lp_short[i] = r->lp_full[i];
    for (int32_t t = 1; t < c->n_turns; t++) {
        int32_t N = t * T;
        if (N - 1 <= W) continue; /* BOS plus the whole history: the same context */
        tok[0] = 1;
        memcpy(tok + 1, r->tok + N - W, (size_t)(W + T) * sizeof(int32_t));
        kv.n = 0;
        if (tl_forward(m, s, &kv, tok, n, pos, logits, NULL, NULL, NULL)) goto out;
        for (int32_t i = 0; i < T && N + i + 1 < r->n; i++)
            r->lp_short[N + i] = (float)tl_log_softmax_at(logits + (size_t)(1 + W + i) * V, V, r->tok[N + i + 1]);
    }
    rc = 0;
out:
    tl_kv_free(&kv);
    tl_state_free(s);
    free(logits);
    free(tok);
    free(pos);
    return rc;
}

/* Full-context pass over the whole sequence, turn by turn, then the
 * memory-dependent positions. */
static int ref_build(const tl_model *m, const tl_eval_cfg *c, uint64_t seed, ev_ref *r) {
    const tl_config *mc = &m->cfg;
    int32_t n = c->n_turns * c->turn_len, L = mc->n_layers, d = mc->dim;
    size_t kvd = (size_t)mc->n_kv_heads * (size_t)mc->head_dim, V = (size_t)mc->vocab_size;
    memset(r, 0, sizeof *r);
    r->n = n;
    r->tok = malloc((size_t)n * sizeof(int32_t));
    r->logits = malloc((size_t)n * V * sizeof(float));
    r->k_rot = malloc((size_t)L * (size_t)n * kvd * sizeof(float));
    r->v = malloc((size_t)L * (size_t)n * kvd * sizeof(float));
    r->q_rot = malloc((size_t)n * (size_t)L * (size_t)d * sizeof(float));
    r->acc = calloc((size_t)c->n_turns * (size_t)n, sizeof(float));
    r->lp_full = calloc((size_t)n, sizeof(float));
    r->lp_short = calloc((size_t)n, sizeof(float));
    r->memdep = calloc((size_t)n, 1);
    float *kc = malloc((size_t)L * (size_t)c->turn_len * kvd * sizeof(float));
    float *vc = malloc((size_t)L * (size_t)c->turn_len * kvd * sizeof(float));
    float *acc = calloc((size_t)n, sizeof(float));
    int32_t *pos = malloc((size_t)n * sizeof(int32_t));
    tl_state *s = tl_state_create(mc, c->turn_len);
    tl_kv kv;
    int rc = -1;
    memset(&kv, 0, sizeof kv);
    if (!r->tok || !r->logits || !r->k_rot || !r->v || !r->q_rot || !r->acc || !r->lp_full || !r->lp_short ||
        !r->memdep || !kc || !vc || !acc || !pos || !s || tl_kv_init(&kv, mc, n))
        goto out;
    if (tl_sample_sequence(m, seed, 1.0f, n, r->tok)) goto out;
    for (int32_t i = 0; i < n; i++) pos[i] = i;
    for (int32_t t = 0; t < c->n_turns; t++) {
        int32_t p0 = t * c->turn_len, T = c->turn_len;
        tl_trace tr = {0};
        tr.q_rot = r->q_rot + (size_t)p0 * (size_t)L * (size_t)d;
        tr.k_rot = kc;
        tr.v_out = vc;
        tr.attn_acc = acc;
        if (tl_forward(m, s, &kv, r->tok + p0, T, pos + p0, r->logits + (size_t)p0 * V, &tr, NULL, NULL))
            goto out;
        for (int32_t l = 0; l < L; l++) {
            memcpy(r->k_rot + ((size_t)l * (size_t)n + (size_t)p0) * kvd, kc + (size_t)l * (size_t)T * kvd,
                   (size_t)T * kvd * sizeof(float));
            memcpy(r->v + ((size_t)l * (size_t)n + (size_t)p0) * kvd, vc + (size_t)l * (size_t)T * kvd,
                   (size_t)T * kvd * sizeof(float));
        }
        memcpy(r->acc + (size_t)t * (size_t)n, acc, (size_t)n * sizeof(float));
    }
    for (int32_t i = 0; i + 1 < n; i++)
        r->lp_full[i] = (float)tl_log_softmax_at(r->logits + (size_t)i * V, (int32_t)V, r->tok[i + 1]);
    if (short_context_logprobs(m, c, r)) goto out;
    for (int32_t i = 0; i + 1 < n; i++) r->memdep[i] = r->lp_full[i] - r->lp_short[i] >= c->memdep_nats;
    rc = 0;
out:
    tl_kv_free(&kv);
    tl_state_free(s);
    free(kc);
    free(vc);
    free(acc);
    free(pos);
    if (rc) ref_free(r);
    return rc;
}

/* Append turn t of the reference to the history (a [L][T][kvd] slice). */
static int history_add_turn(const tl_model *m, const tl_eval_cfg *c, const ev_ref *r, tl_history *h,
                            int32_t t, char *err, size_t err_size) {
    int32_t L = m->cfg.n_layers, T = c->turn_len, p0 = t * T;
    size_t kvd = (size_t)h->kv_dim;
    float *k = malloc((size_t)L * (size_t)T * kvd * sizeof(float));
    float *v = malloc((size_t)L * (size_t)T * kvd * sizeof(float));
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    int rc = -1;
    if (k && v && pos) {
        for (int32_t l = 0; l < L; l++) {
            memcpy(k + (size_t)l * (size_t)T * kvd, r->k_rot + ((size_t)l * (size_t)r->n + (size_t)p0) * kvd,
                   (size_t)T * kvd * sizeof(float));
            memcpy(v + (size_t)l * (size_t)T * kvd, r->v + ((size_t)l * (size_t)r->n + (size_t)p0) * kvd,
                   (size_t)T * kvd * sizeof(float));
        }
        for (int32_t i = 0; i < T; i++) pos[i] = p0 + i;
        rc = tl_history_append(h, k, v, T, pos, r->tok + p0,
                               r->q_rot + (size_t)p0 * (size_t)L * (size_t)m->cfg.dim,
                               r->acc + (size_t)t * (size_t)r->n, c->prompt_len, err, err_size);
    } else {
        rc = tl_errf(err, err_size, "out of memory");
    }
    free(k);
    free(v);
    free(pos);
    return rc;
}

void tl_art_setup(tl_art *art, const tl_method *me, kvmem_context *ctx) {
    memset(art, 0, sizeof *art);
#ifdef TINYLLM_HAVE_ATTEND
    art->ctx = ctx;
    art->params = kvmem_attend_default_params();
    if (me->art_tile) art->params.tile_size = me->art_tile;
    if (me->art_order) art->params.order = (kvmem_attend_order)(me->art_order - 1);
    if (me->art_patience) art->params.patience = me->art_patience;
    if (me->art_tau_scale > 0) {
        art->params.tau_s *= me->art_tau_scale;
        art->params.tau_d *= me->art_tau_scale;
    }
#else
    (void)me;
    (void)ctx;
#endif
}

/* MemArt asked again mid-turn: the memory part of kv (its first mem_rows
 * rows) is rebuilt from the queries q_raw [n][L][d] of the newest turn
 * tokens; the turn's own rows stay, moved behind the new memory. */
static int rebuild_memory(tl_history *h, const tl_method *me, int64_t budget, const float *q_raw, int32_t n,
                          int32_t turn_pos, tl_kv *kv, int32_t *mem_rows, tl_build_info *info, char *err,
                          size_t err_size) {
    int32_t turn_rows = kv->n - *mem_rows, L = kv->n_layers;
    size_t kvd = (size_t)kv->kv_dim;
    float *k = malloc((size_t)L * (size_t)turn_rows * kvd * sizeof(float) + 1);
    float *v = malloc((size_t)L * (size_t)turn_rows * kvd * sizeof(float) + 1);
    int32_t *pos = malloc((size_t)turn_rows * sizeof(int32_t) + 1);
    int rc = -1;
    if (!k || !v || !pos) {
        tl_errf(err, err_size, "out of memory");
        goto out;
    }
    for (int32_t l = 0; l < L; l++) {
        size_t src = ((size_t)l * (size_t)kv->cap + (size_t)*mem_rows) * kvd;
        memcpy(k + (size_t)l * (size_t)turn_rows * kvd, kv->k + src, (size_t)turn_rows * kvd * sizeof(float));
        memcpy(v + (size_t)l * (size_t)turn_rows * kvd, kv->v + src, (size_t)turn_rows * kvd * sizeof(float));
    }
    memcpy(pos, kv->pos + *mem_rows, (size_t)turn_rows * sizeof(int32_t));
    if (tl_memory_build_info(h, me, budget, q_raw, n, turn_pos, kv, info, err, err_size)) goto out;
    *mem_rows = kv->n;
    if (tl_kv_append(kv, k, v, turn_rows, pos)) {
        tl_errf(err, err_size, "working set full");
        goto out;
    }
    rc = 0;
out:
    free(k);
    free(v);
    free(pos);
    return rc;
}

/* Run turn t with method `me` at `budget` history tokens; accumulate into a. */
static int eval_turn(const tl_model *m, const tl_eval_cfg *c, const ev_ref *r, int32_t sq, tl_history *h,
                     const tl_method *me, int64_t budget, int32_t t, kvmem_context *ctx, tl_score *a,
                     char *err, size_t err_size) {
    const tl_config *mc = &m->cfg;
    int32_t N = t * c->turn_len, P = c->prompt_len, T = c->turn_len, V = mc->vocab_size;
    int32_t L = mc->n_layers, d = mc->dim;
    size_t qrow = (size_t)L * (size_t)d;
    tl_state *s = tl_state_create(mc, T);
    tl_kv kv;
    float *logits = malloc((size_t)T * (size_t)V * sizeof(float));
    float *probe = malloc((size_t)P * qrow * sizeof(float));
    float *q_turn = me->reprobe ? malloc((size_t)T * qrow * sizeof(float)) : NULL; /* the turn's own queries */
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    int rc = -1;
    memset(&kv, 0, sizeof kv);
    if (!s || !logits || !probe || !pos || (me->reprobe && !q_turn) ||
        tl_kv_init(&kv, mc, N + T + c->probe_window)) {
        tl_errf(err, err_size, "out of memory");
        goto out;
    }
    for (int32_t i = 0; i < T; i++) pos[i] = N + i;
    int64_t prefill = 0;
    if (me->needs_probe) {
        /* the prompt's queries over a local window: what retrieval is asked with */
        kv.n = 0;
        if (tl_memory_recent(h, c->probe_window, &kv, err, err_size)) goto out;
        tl_trace tr = {0};
        tr.q_raw = probe;
        if (tl_forward(m, s, &kv, r->tok + N, P, pos, NULL, &tr, NULL, NULL)) {
            tl_errf(err, err_size, "probe forward failed");
            goto out;
        }
        prefill += P;
    }
    tl_build_info info;
    if (tl_memory_build_info(h, me, budget, probe, P, N, &kv, &info, err, err_size)) goto out;
    int32_t mem_rows = kv.n;
    a->mem_rows += kv.n;
    a->local_rows += info.local_rows;
    a->retrieved_rows += info.retrieved_rows;
    tl_trace tr = {0};
    tr.q_raw = q_turn;
    if (tl_forward(m, s, &kv, r->tok + N, P, pos, logits, &tr, NULL, NULL)) {
        tl_errf(err, err_size, "prefill failed");
        goto out;
    }
    prefill += P;
    tl_art art;
    tl_art_setup(&art, me, ctx);
    for (int32_t i = P; i < T; i++) {
        if (me->reprobe && i > P && (i - P) % me->reprobe == 0) {
            int32_t n = me->reprobe < i ? me->reprobe : i;
            if (rebuild_memory(h, me, budget, q_turn + (size_t)(i - n) * qrow, n, N, &kv, &mem_rows, &info, err,
                               err_size))
                goto out;
            a->retrievals++;
        }
        int64_t rows = 0;
        tr.q_raw = q_turn ? q_turn + (size_t)i * qrow : NULL;
        if (tl_forward(m, s, &kv, r->tok + N + i, 1, pos + i, logits + (size_t)i * V, &tr, me->art ? &art : NULL,
                       &rows)) {
            tl_errf(err, err_size, "decode failed%s%s", me->art ? ": " : "", me->art ? kvmem_last_error() : "");
            goto out;
        }
        a->rows_read += rows;
        a->decoded++;
    }
    for (int32_t i = 0; i < T; i++) {
        const float *ref = r->logits + (size_t)(N + i) * (size_t)V, *got = logits + (size_t)i * V;
        double kl = tl_kl_logits(ref, got, V);
        int agree = tl_argmax(ref, V) == tl_argmax(got, V);
        a->kl += kl;
        if (kl > a->kl_max) {
            a->kl_max = kl;
            a->kl_max_seq = sq;
            a->kl_max_pos = N + i;
        }
        a->agree += agree;
        a->n_pos++;
        if (r->memdep[N + i]) {
            a->agree_md += agree;
            a->kl_md += kl;
            a->lp_md += tl_log_softmax_at(got, V, r->tok[N + i + 1]);
            a->n_md++;
        }
    }
    a->prefill += prefill;
    a->turns++;
    a->retrievals += me->kind == TL_M_MEMART;
    a->art_tiles += art.tiles_total;
    a->art_visited += art.tiles_visited;
    rc = 0;
out:
    tl_kv_free(&kv);
    tl_state_free(s);
    free(logits);
    free(probe);
    free(q_turn);
    free(pos);
    return rc;
}

static int parse_budgets(const char *arg, tl_eval_cfg *c) {
    const char *e = arg;
    c->n_budgets = 0;
    while (*e) {
        if (c->n_budgets == TL_MAX_BUDGETS) return -1;
        char *end;
        double v = strtod(e, &end);
        if (end == e || !(v > 0)) return -1;
        tl_budget *b = &c->budgets[c->n_budgets++];
        if (*end == '%') {
            if (v > 100) return -1;
            b->frac = v / 100.0;
            b->tokens = 0;
            end++;
        } else {
            if (v != floor(v) || v > 1e9) return -1;
            b->frac = 0;
            b->tokens = (int64_t)v;
        }
        if (*end == ',') end++;
        else if (*end) return -1;
        e = end;
    }
    return c->n_budgets ? 0 : -1;
}

static int int_opt(const char *opt, const char *arg, int32_t lo, int32_t hi, int32_t *out) {
    int64_t v;
    if (tl_cli_int("eval", opt, arg, lo, hi, &v)) return -1;
    *out = (int32_t)v;
    return 0;
}

/* The report files, opened before any work (markdown to stdout without a path). */
static int open_reports(const char *md_path, const char *json_path, FILE **md, FILE **js) {
    if (md_path && !(*md = fopen(md_path, "w"))) {
        fprintf(stderr, "tinyllm eval: --md %s: %s\n", md_path, strerror(errno));
        return 1;
    }
    if (json_path && !(*js = fopen(json_path, "w"))) {
        fprintf(stderr, "tinyllm eval: --json %s: %s\n", json_path, strerror(errno));
        if (*md != stdout) fclose(*md);
        return 1;
    }
    return 0;
}

/* tinyllm eval --beyond: the suite past the window, its reports. */
static int beyond_main(const char *model_path, const char *suite_path, const char *tok_path, const char *json_path,
                       const char *md_path, int quick, int32_t n_cases, kvmem_dtype storage, int progress, bx_cfg *bx) {
    FILE *md = stdout, *js = NULL;
    if (open_reports(md_path, json_path, &md, &js)) return 1;
    tl_model m;
    char err[TL_ERR_SIZE];
    int rc = 1;
    kvmem_context *ctx = NULL;
    tl_recall_suite suite;
    memset(&suite, 0, sizeof suite);
    bx_results *res = calloc(1, sizeof *res);
    if (!res) goto close_files;
    if (tl_model_load(model_path, &m, err, sizeof err)) {
        fprintf(stderr, "tinyllm eval: %s\n", err);
        goto close_files;
    }
    if (tl_recall_load_ex(&suite, suite_path, tok_path, model_path, &m, 1, err, sizeof err)) {
        fprintf(stderr, "tinyllm eval: %s\n", err);
        goto free_model;
    }
    if (!n_cases && quick) n_cases = 4;
    if (n_cases && n_cases < suite.n_cases) suite.n_cases = n_cases;
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cpu";
    cp.n_threads = 1;
    if (kvmem_context_create(&cp, &ctx) != KVMEM_OK) {
        fprintf(stderr, "tinyllm eval: context: %s\n", kvmem_last_error());
        goto free_model;
    }
    bx->quick = quick;
    bx->storage = storage;
    bx->progress = progress;
    if (tl_beyond_run(&suite, &m, bx, ctx, res, err, sizeof err)) {
        if (progress == 2) fprintf(stderr, "\r\033[K");
        fprintf(stderr, "tinyllm eval --beyond: %s\n", err);
    } else {
        tl_beyond_write_md(md, bx, res, &m, model_path, &suite);
        if (js) tl_beyond_write_json(js, bx, res, &m, model_path, &suite);
        rc = 0;
    }
    kvmem_context_free(ctx);
free_model:
    tl_recall_free(&suite);
    tl_model_free(&m);
close_files:
    if (res) tl_beyond_free(res);
    free(res);
    if (md != stdout && fclose(md) != 0) rc = 1;
    if (js && fclose(js) != 0) rc = 1;
    return rc;
}

static const char k_usage[] =
    "usage: tinyllm eval MODEL [options]\n"
    "  --quick              a small run (one sequence, short histories; seconds)\n"
    "  --seqs N             sampled sequences (default 8)\n"
    "  --turns N            turns per sequence (default: as many as fit the model's length)\n"
    "  --turn-len N         tokens per turn (default 64)\n"
    "  --prompt-len N       prefilled prompt tokens per turn (default 16)\n"
    "  --first-turn N       first evaluated turn (default 2: histories of 128 tokens and more)\n"
    "  --budgets LIST       history tokens kept: counts or shares, e.g. 32,64,128,256,25%\n"
    "  --window W           history tokens the memory-dependence test keeps (default 32)\n"
    "  --memdep-nats X      log-probability gain that marks a position (default 2)\n"
    "  --storage f32|f16|bf16  the pool's storage dtype (default f32)\n"
    "  --recall FILE        the text recall suite (needs the tokenizer)\n"
    "  --recall-cases N     only its first N cases\n"
    "  --tokenizer FILE     tokenizer (default: tok512.bin beside the model)\n"
    "  --json FILE, --md FILE  write results (markdown goes to stdout without --md)\n"
    "  --quiet              no progress on stderr\n"
    "  --beyond FILE        instead: the beyond-the-window suite (histories longer than the model's\n"
    "                       window; every method in the same window; text RAG, oracles, placement)\n"
    "  --place O,S,L        with --beyond: the default placement: order chrono|score|runs, sink\n"
    "                       none|bos|block, live share (0 = the rest of the window); default\n"
    "                       score,bos,0.25: best on both models (BENCHMARKS.md)\n"
    "  --threads N          with --beyond: cases run at once (default 1; the numbers do not change)\n";

int tl_eval_main(int argc, char **argv) {
    tl_eval_cfg c = {.n_seqs = 8, .n_turns = 0, .turn_len = 64, .prompt_len = 16, .first_turn = 2,
                     .probe_window = 32, .window = 32, .memdep_nats = 2.0, .seed = 1000, .storage = KVMEM_F32,
                     .progress = isatty(2) ? 2 : 1};
    parse_budgets("32,64,128,256,25%", &c);
    const char *json_path = NULL, *md_path = NULL, *recall_path = NULL, *tok_path = NULL;
    int quick = 0;
    int32_t recall_cases = 0; /* 0 = all */
    const char *beyond_path = NULL;
    bx_cfg bx = {.sink_tokens = 4, .probe_window = 32, .storage = KVMEM_F32, .best_order = TL_ORDER_SCORE,
                 .best_sink = BX_SINK_BOS, .best_live = 0.25, .threads = 1};
    static const struct option opts[] = {
        {"quick", no_argument, NULL, 'q'},       {"seqs", required_argument, NULL, 's'},
        {"turns", required_argument, NULL, 't'}, {"turn-len", required_argument, NULL, 'T'},
        {"prompt-len", required_argument, NULL, 'P'}, {"first-turn", required_argument, NULL, 'F'},
        {"budgets", required_argument, NULL, 'b'}, {"window", required_argument, NULL, 'W'},
        {"memdep-nats", required_argument, NULL, 'N'}, {"storage", required_argument, NULL, 'S'},
        {"recall", required_argument, NULL, 'r'}, {"tokenizer", required_argument, NULL, 'k'},
        {"json", required_argument, NULL, 'j'},  {"md", required_argument, NULL, 'm'},
        {"quiet", no_argument, NULL, 'Q'},       {"help", no_argument, NULL, 'h'},
        {"recall-cases", required_argument, NULL, 'R'},
        {"beyond", required_argument, NULL, 'Y'}, {"place", required_argument, NULL, 'L'},
        {"threads", required_argument, NULL, 'H'},
        {NULL, 0, NULL, 0}};
    optind = 1;
    opterr = 0;
    int o, budgets_given = 0, seqs_given = 0, turns_given = 0;
    while ((o = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (o) {
        case 'q': quick = 1; break;
        case 's': if (int_opt("--seqs", optarg, 1, 1000, &c.n_seqs)) return 2; seqs_given = 1; break;
        case 't': if (int_opt("--turns", optarg, 2, 4096, &c.n_turns)) return 2; turns_given = 1; break;
        case 'T': if (int_opt("--turn-len", optarg, 2, 4096, &c.turn_len)) return 2; break;
        case 'P': if (int_opt("--prompt-len", optarg, 1, 4096, &c.prompt_len)) return 2; break;
        case 'F': if (int_opt("--first-turn", optarg, 1, 4096, &c.first_turn)) return 2; break;
        case 'W': if (int_opt("--window", optarg, 1, 1 << 20, &c.window)) return 2; break;
        case 'b':
            if (parse_budgets(optarg, &c)) {
                fprintf(stderr, "tinyllm eval: --budgets '%s': expected up to %d comma-separated token counts "
                        "or shares (25%%)\n", optarg, TL_MAX_BUDGETS);
                return 2;
            }
            budgets_given = 1;
            break;
        case 'N': {
            float v;
            if (tl_cli_float("eval", "--memdep-nats", optarg, 1e-3f, 100.0f, &v)) return 2;
            c.memdep_nats = v;
            break;
        }
        case 'S':
            if (!strcmp(optarg, "f32")) c.storage = KVMEM_F32;
            else if (!strcmp(optarg, "f16")) c.storage = KVMEM_F16;
            else if (!strcmp(optarg, "bf16")) c.storage = KVMEM_BF16;
            else {
                fprintf(stderr, "tinyllm eval: --storage '%s': expected f32, f16 or bf16\n", optarg);
                return 2;
            }
            break;
        case 'r': recall_path = optarg; break;
        case 'R': if (int_opt("--recall-cases", optarg, 1, 1 << 20, &recall_cases)) return 2; break;
        case 'k': tok_path = optarg; break;
        case 'j': json_path = optarg; break;
        case 'm': md_path = optarg; break;
        case 'Q': c.progress = 0; break;
        case 'Y': beyond_path = optarg; break;
        case 'H': if (int_opt("--threads", optarg, 1, 16, &bx.threads)) return 2; break;
        case 'L': {
            char od[16] = "", sk[16] = "";
            double lv = -1;
            int ok = sscanf(optarg, "%15[a-z],%15[a-z],%lf", od, sk, &lv) == 3 && lv >= 0 && lv < 1;
            int oi = !strcmp(od, "chrono") ? 0 : !strcmp(od, "score") ? 1 : !strcmp(od, "runs") ? 2 : -1;
            int si = !strcmp(sk, "none") ? 0 : !strcmp(sk, "bos") ? 1 : !strcmp(sk, "block") ? 2 : -1;
            if (!ok || oi < 0 || si < 0) {
                fprintf(stderr, "tinyllm eval: --place '%s': expected ORDER,SINK,LIVE: chrono|score|runs, "
                        "none|bos|block, a share in [0, 1)\n", optarg);
                return 2;
            }
            bx.best_order = (tl_order)oi;
            bx.best_sink = (bx_sink)si;
            bx.best_live = lv;
            break;
        }
        case 'h': fputs(k_usage, stdout); return 0;
        default: return tl_cli_bad_option("eval", argc, argv, o, k_usage);
        }
    }
    const char *model_path;
    if (tl_cli_one_positional("eval", argc, argv, "MODEL", k_usage, &model_path)) return 2;
    if (quick) { /* a small run; what was given explicitly stays */
        if (!seqs_given) c.n_seqs = 1;
        if (!turns_given) c.n_turns = 4;
        if (!budgets_given) parse_budgets("32,64,25%", &c);
    }
    if (beyond_path) return beyond_main(model_path, beyond_path, tok_path, json_path, md_path, quick, recall_cases,
                                        c.storage, c.progress, &bx);
    if (c.prompt_len >= c.turn_len) {
        fprintf(stderr, "tinyllm eval: --prompt-len %d must be below --turn-len %d\n", c.prompt_len, c.turn_len);
        return 2;
    }
    /* Files are checked before the run, not after it. */
    FILE *md = stdout, *js = NULL;
    if (open_reports(md_path, json_path, &md, &js)) return 1;
    tl_model m;
    char err[TL_ERR_SIZE];
    int rc = 1;
    kvmem_context *ctx = NULL;
    tl_eval_results res;
    memset(&res, 0, sizeof res);
    tl_recall_suite suite;
    memset(&suite, 0, sizeof suite);
    if (tl_model_load(model_path, &m, err, sizeof err)) {
        fprintf(stderr, "tinyllm eval: %s\n", err);
        goto close_files;
    }
    int32_t max_turns = m.cfg.seq_len / c.turn_len;
    if (c.n_turns == 0 || c.n_turns > max_turns) c.n_turns = max_turns;
    if (c.first_turn >= c.n_turns) {
        fprintf(stderr, "tinyllm eval: --first-turn %d: only %d turns of %d tokens fit the model's %d\n",
                c.first_turn, c.n_turns, c.turn_len, m.cfg.seq_len);
        goto free_model;
    }
    if (recall_path && tl_recall_load(&suite, recall_path, tok_path, model_path, &m, err, sizeof err)) {
        fprintf(stderr, "tinyllm eval: %s\n", err);
        goto free_model;
    }
    if (recall_cases && recall_cases < suite.n_cases) suite.n_cases = recall_cases;
    res.n_methods = tl_method_list(res.methods, TL_MAX_METHODS, res.missing, sizeof res.missing);
    if (res.n_methods > TL_MAX_METHODS) res.n_methods = TL_MAX_METHODS;
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cpu";
    cp.n_threads = 1; /* the engine is single-threaded; keep kvmem's calls comparable */
    if (kvmem_context_create(&cp, &ctx) != KVMEM_OK) {
        fprintf(stderr, "tinyllm eval: context: %s\n", kvmem_last_error());
        goto free_model;
    }
    double t0 = tl_now_s();
    rc = 0;
    for (int32_t sq = 0; sq < c.n_seqs && !rc; sq++) {
        ev_ref r;
        tl_progress(&c, "eval: sequence %d/%d: full context and the %d-token window", sq + 1, c.n_seqs, c.window);
        if (ref_build(&m, &c, c.seed + (uint64_t)sq, &r)) {
            fprintf(stderr, "tinyllm eval: reference pass failed\n");
            rc = 1;
            break;
        }
        tl_history h;
        if (tl_history_init(&h, ctx, &m, r.n, c.storage, 16, "eval", err, sizeof err)) {
            fprintf(stderr, "tinyllm eval: %s\n", err);
            ref_free(&r);
            rc = 1;
            break;
        }
        for (int32_t t = 1; t < c.n_turns && !rc; t++) {
            if (history_add_turn(&m, &c, &r, &h, t - 1, err, sizeof err)) {
                fprintf(stderr, "tinyllm eval: %s\n", err);
                rc = 1;
                break;
            }
            if (t < c.first_turn) continue;
            res.hist_sum += (double)h.n;
            res.hist_turns++;
            for (int32_t i = t * c.turn_len; i < (t + 1) * c.turn_len; i++) { /* memdep[i] is 0 at the last */
                res.n_pos++;
                res.n_memdep += r.memdep[i];
                res.lp_full_md += r.memdep[i] ? r.lp_full[i] : 0;
                res.lp_short_md += r.memdep[i] ? r.lp_short[i] : 0;
            }
            for (int32_t mi = 0; mi < res.n_methods && !rc; mi++) {
                const tl_method *me = &res.methods[mi];
                for (int32_t bi = 0; bi < c.n_budgets && !rc; bi++) {
                    if (tl_method_budget_free(me) && bi > 0) continue;
                    int64_t budget = tl_method_budget_free(me) ? 0 : tl_budget_tokens(&c.budgets[bi], h.n, 16);
                    char bn[32];
                    tl_budget_name(&c.budgets[bi], bn, sizeof bn);
                    tl_progress(&c, "eval: sequence %d/%d, turn %d/%d: %s, budget %s", sq + 1, c.n_seqs, t,
                                c.n_turns - 1, me->name, tl_method_budget_free(me) ? "all" : bn);
                    if (eval_turn(&m, &c, &r, sq, &h, me, budget, t, ctx, &res.fid[mi][bi], err, sizeof err)) {
                        fprintf(stderr, "tinyllm eval: %s at budget %lld: %s\n", me->name, (long long)budget, err);
                        rc = 1;
                    }
                }
            }
        }
        tl_history_free(&h);
        ref_free(&r);
    }
    if (!rc && suite.n_cases)
        rc = tl_recall_run(&suite, &m, &c, ctx, &res, err, sizeof err);
    if (c.progress == 2) fprintf(stderr, "\r\033[K");
    res.seconds = tl_now_s() - t0;
    if (!rc) {
        tl_eval_write_md(md, &c, &res, &m, model_path, suite.n_cases ? &suite : NULL);
        if (js) tl_eval_write_json(js, &c, &res, &m, model_path, suite.n_cases ? &suite : NULL);
    }
    kvmem_context_free(ctx);
free_model:
    tl_recall_free(&suite);
    tl_model_free(&m);
close_files:
    if (md != stdout && fclose(md) != 0) rc = 1;
    if (js && fclose(js) != 0) rc = 1;
    return rc;
}
