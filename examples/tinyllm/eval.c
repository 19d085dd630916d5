/* tinyllm eval: the fidelity harness. How well does each kvmem method keep
 * a real model's outputs at an equal KV budget?
 *
 * Protocol. Sequences are sampled from the model itself (temperature 1, fixed
 * seeds) and split into turns of turn_len tokens; the first prompt_len tokens
 * of a turn are its "prompt" (prefilled as one chunk), the rest are decoded
 * one token at a time (teacher-forced, so every method sees the same tokens).
 * The reference is full context: the engine's own exact attention over every
 * earlier token. Past turns live in a kvmem agent (appended post-RoPE with
 * their positions, exactly as the full-context pass computed them). For turn
 * t >= 1 each method builds its memory from the agent, at most `budget`
 * history tokens, then runs the turn on it. Per position we compare the
 * method's next-token distribution with the reference: top-1 agreement and
 * KL(full || method) in nats. Also reported: tokens run through the model per
 * turn (prefill; MemArt's probe counted) and KV bytes read per decoded token
 * (f32 working set; ART counts only the rows it read).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "app.h"
#include "internal.h"

typedef struct ev_cfg {
    int32_t n_seqs, n_turns, turn_len, prompt_len, probe_window;
    int32_t budgets[8], n_budgets;
    uint64_t seed;
    kvmem_dtype storage;
} ev_cfg;

typedef struct ev_ref {
    int32_t n;
    int32_t *tok;
    float *logits;     /* [n][V] */
    float *k_rot, *v;  /* [L][n][kvd] */
    float *q_rot;      /* [n][L][d] */
    float *acc;        /* [n_turns][n] H2O accumulator after each turn */
} ev_ref;

typedef struct ev_acc {
    double agree, kl, kl_max;
    int64_t n_pos;
    int64_t prefill, turns;
    int64_t rows_read, decoded;
    int64_t mem_rows;
} ev_acc;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void ref_free(ev_ref *r) {
    free(r->tok);
    free(r->logits);
    free(r->k_rot);
    free(r->v);
    free(r->q_rot);
    free(r->acc);
    memset(r, 0, sizeof *r);
}

/* Full-context pass over the whole sequence, turn by turn. */
static int ref_build(const tl_model *m, const ev_cfg *c, uint64_t seed, ev_ref *r) {
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
    float *kc = malloc((size_t)L * (size_t)c->turn_len * kvd * sizeof(float));
    float *vc = malloc((size_t)L * (size_t)c->turn_len * kvd * sizeof(float));
    float *acc = calloc((size_t)n, sizeof(float));
    int32_t *pos = malloc((size_t)n * sizeof(int32_t));
    tl_state *s = tl_state_create(mc, c->turn_len);
    tl_kv kv;
    int rc = -1;
    memset(&kv, 0, sizeof kv);
    if (!r->tok || !r->logits || !r->k_rot || !r->v || !r->q_rot || !r->acc || !kc || !vc || !acc ||
        !pos || !s || tl_kv_init(&kv, mc, n))
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
            memcpy(r->k_rot + ((size_t)l * (size_t)n + (size_t)p0) * kvd, kc + (size_t)l * (size_t)T * kvd, (size_t)T * kvd * sizeof(float));
            memcpy(r->v + ((size_t)l * (size_t)n + (size_t)p0) * kvd, vc + (size_t)l * (size_t)T * kvd, (size_t)T * kvd * sizeof(float));
        }
        memcpy(r->acc + (size_t)t * (size_t)n, acc, (size_t)n * sizeof(float));
    }
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
static int history_add_turn(const tl_model *m, const ev_cfg *c, const ev_ref *r, tl_history *h,
                            int32_t t, char *err, size_t err_size) {
    int32_t L = m->cfg.n_layers, T = c->turn_len, p0 = t * T;
    size_t kvd = (size_t)h->kv_dim;
    float *k = malloc((size_t)L * (size_t)T * kvd * sizeof(float));
    float *v = malloc((size_t)L * (size_t)T * kvd * sizeof(float));
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    int rc = -1;
    if (k && v && pos) {
        for (int32_t l = 0; l < L; l++) {
            memcpy(k + (size_t)l * (size_t)T * kvd, r->k_rot + ((size_t)l * (size_t)r->n + (size_t)p0) * kvd, (size_t)T * kvd * sizeof(float));
            memcpy(v + (size_t)l * (size_t)T * kvd, r->v + ((size_t)l * (size_t)r->n + (size_t)p0) * kvd, (size_t)T * kvd * sizeof(float));
        }
        for (int32_t i = 0; i < T; i++) pos[i] = p0 + i;
        rc = tl_history_append(h, k, v, T, pos, r->tok + p0,
                               r->q_rot + (size_t)p0 * (size_t)L * (size_t)m->cfg.dim,
                               r->acc + (size_t)t * (size_t)r->n, c->prompt_len, err, err_size);
    }
    free(k);
    free(v);
    free(pos);
    return rc;
}

/* Run turn t with method `me` at `budget`; accumulate into a. */
static int eval_turn(const tl_model *m, const ev_cfg *c, const ev_ref *r, tl_history *h,
                     const tl_method *me, int64_t budget, int32_t t, kvmem_context *ctx,
                     ev_acc *a, char *err, size_t err_size) {
    const tl_config *mc = &m->cfg;
    int32_t N = t * c->turn_len, P = c->prompt_len, T = c->turn_len, V = mc->vocab_size;
    int32_t L = mc->n_layers, d = mc->dim;
    tl_state *s = tl_state_create(mc, T);
    tl_kv kv;
    float *logits = malloc((size_t)T * (size_t)V * sizeof(float));
    float *probe = malloc((size_t)P * (size_t)L * (size_t)d * sizeof(float));
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    int rc = -1;
    memset(&kv, 0, sizeof kv);
    if (!s || !logits || !probe || !pos || tl_kv_init(&kv, mc, N + T + c->probe_window)) {
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
    if (tl_memory_build(h, me, budget, probe, P, N, &kv, err, err_size)) goto out;
    a->mem_rows += kv.n;
    if (tl_forward(m, s, &kv, r->tok + N, P, pos, logits, NULL, NULL, NULL)) {
        tl_errf(err, err_size, "prefill failed");
        goto out;
    }
    prefill += P;
    tl_art art, *artp = NULL;
#ifdef TINYLLM_HAVE_ATTEND
    if (me->art) {
        memset(&art, 0, sizeof art);
        art.ctx = ctx;
        art.params = kvmem_attend_default_params();
        art.params.tile_size = me->art_tile;
        if (me->art_tau_scale > 0) {
            art.params.tau_s *= me->art_tau_scale;
            art.params.tau_d *= me->art_tau_scale;
        }
        artp = &art;
    }
#else
    (void)art;
    (void)ctx;
#endif
    for (int32_t i = P; i < T; i++) {
        int64_t rows = 0;
        if (tl_forward(m, s, &kv, r->tok + N + i, 1, pos + i, logits + (size_t)i * V, NULL, artp, &rows)) {
            tl_errf(err, err_size, "decode failed%s%s", artp ? ": " : "", artp ? kvmem_last_error() : "");
            goto out;
        }
        a->rows_read += rows;
        a->decoded++;
    }
    for (int32_t i = 0; i < T; i++) {
        const float *ref = r->logits + (size_t)(N + i) * (size_t)V, *got = logits + (size_t)i * V;
        double kl = tl_kl_logits(ref, got, V);
        a->kl += kl;
        if (kl > a->kl_max) a->kl_max = kl;
        a->agree += tl_argmax(ref, V) == tl_argmax(got, V);
        a->n_pos++;
    }
    a->prefill += prefill;
    a->turns++;
    rc = 0;
out:
    tl_kv_free(&kv);
    tl_state_free(s);
    free(logits);
    free(probe);
    free(pos);
    return rc;
}

/* Calibration, without kvmem: how much does this model's output move when
 * history rows are simply left out? Rows [d0, d1) of the history are dropped
 * from the engine's own full-context cache (all other rows kept in place). */
static int drop_turn(const tl_model *m, const ev_cfg *c, const ev_ref *r, int32_t t, int32_t d0, int32_t d1,
                     ev_acc *a) {
    const tl_config *mc = &m->cfg;
    int32_t N = t * c->turn_len, T = c->turn_len, V = mc->vocab_size, L = mc->n_layers;
    size_t kvd = (size_t)mc->n_kv_heads * (size_t)mc->head_dim;
    tl_state *s = tl_state_create(mc, T);
    tl_kv kv;
    float *logits = malloc((size_t)T * (size_t)V * sizeof(float));
    float *row = malloc(2 * (size_t)L * kvd * sizeof(float));
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    int rc = -1;
    memset(&kv, 0, sizeof kv);
    if (s && logits && row && pos && !tl_kv_init(&kv, mc, N + T)) {
        rc = 0;
        for (int32_t j = 0; j < N && !rc; j++) {
            if (j >= d0 && j < d1) continue;
            for (int32_t l = 0; l < L; l++) {
                memcpy(row + (size_t)l * kvd, r->k_rot + ((size_t)l * (size_t)r->n + (size_t)j) * kvd, kvd * sizeof(float));
                memcpy(row + ((size_t)L + (size_t)l) * kvd, r->v + ((size_t)l * (size_t)r->n + (size_t)j) * kvd, kvd * sizeof(float));
            }
            rc = tl_kv_append(&kv, row, row + (size_t)L * kvd, 1, &j);
        }
        for (int32_t i = 0; i < T; i++) pos[i] = N + i;
        if (!rc) rc = tl_forward(m, s, &kv, r->tok + N, T, pos, logits, NULL, NULL, NULL);
        for (int32_t i = 0; i < T && !rc; i++) {
            const float *ref = r->logits + (size_t)(N + i) * (size_t)V, *got = logits + (size_t)i * V;
            a->kl += tl_kl_logits(ref, got, V);
            a->agree += tl_argmax(ref, V) == tl_argmax(got, V);
            a->n_pos++;
        }
    }
    tl_kv_free(&kv);
    tl_state_free(s);
    free(logits);
    free(row);
    free(pos);
    return rc;
}

static int budget_free(const tl_method *me) { return me->kind == TL_M_FULL; }

int tl_eval_main(int argc, char **argv) {
    if (argc < 1) {
        fprintf(stderr, "usage: tinyllm eval MODEL [--quick] [--seqs N] [--json FILE] [--md FILE]\n");
        return 2;
    }
    ev_cfg c = {.n_seqs = 4, .n_turns = 6, .turn_len = 64, .prompt_len = 16, .probe_window = 32,
                .budgets = {32, 64, 128, 256}, .n_budgets = 4, .seed = 1000, .storage = KVMEM_F32};
    const char *json_path = NULL, *md_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            c.n_seqs = 1;
            c.n_turns = 3;
            c.budgets[0] = 32;
            c.budgets[1] = 64;
            c.n_budgets = 2;
        } else if (!strcmp(argv[i], "--budgets") && i + 1 < argc) {
            char *e = argv[++i];
            c.n_budgets = 0;
            while (*e && c.n_budgets < 8) {
                c.budgets[c.n_budgets++] = (int32_t)strtol(e, &e, 10);
                if (*e == ',') e++;
                else break;
            }
        } else if (!strcmp(argv[i], "--turns") && i + 1 < argc) {
            c.n_turns = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--seqs") && i + 1 < argc) {
            c.n_seqs = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            json_path = argv[++i];
        } else if (!strcmp(argv[i], "--md") && i + 1 < argc) {
            md_path = argv[++i];
        } else if (!strcmp(argv[i], "--storage") && i + 1 < argc) {
            i++;
            c.storage = !strcmp(argv[i], "f16") ? KVMEM_F16 : !strcmp(argv[i], "bf16") ? KVMEM_BF16 : KVMEM_F32;
        } else {
            fprintf(stderr, "tinyllm eval: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (c.n_seqs < 1 || c.n_seqs > 1000) {
        fprintf(stderr, "tinyllm eval: --seqs must be in [1, 1000]\n");
        return 2;
    }
    tl_model m;
    char err[TL_ERR_SIZE];
    if (tl_model_load(argv[0], &m, err, sizeof err)) {
        fprintf(stderr, "tinyllm: %s\n", err);
        return 1;
    }
    if (c.n_turns * c.turn_len > m.cfg.seq_len) c.n_turns = m.cfg.seq_len / c.turn_len;
    tl_method methods[32];
    char missing[512];
    int32_t n_methods = tl_method_list(methods, 32, missing, sizeof missing);
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cpu";
    cp.n_threads = 1; /* the engine is single-threaded; keep kvmem's calls comparable */
    kvmem_context *ctx = NULL;
    if (kvmem_context_create(&cp, &ctx) != KVMEM_OK) {
        fprintf(stderr, "tinyllm: context: %s\n", kvmem_last_error());
        tl_model_free(&m);
        return 1;
    }
    int32_t n_cells = n_methods * c.n_budgets;
    ev_acc cal[3];
    memset(cal, 0, sizeof cal);
    ev_acc *acc = calloc((size_t)n_cells, sizeof *acc);
    int rc = acc ? 0 : 1;
    double t0 = now_s(), hist_sum = 0;
    int64_t hist_turns = 0;
    for (int32_t sq = 0; sq < c.n_seqs && !rc; sq++) {
        ev_ref r;
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
            hist_sum += (double)h.n;
            hist_turns++;
            for (int32_t mi = 0; mi < n_methods && !rc; mi++)
                for (int32_t bi = 0; bi < c.n_budgets && !rc; bi++) {
                    if (budget_free(&methods[mi]) && bi > 0) continue;
                    int64_t budget = budget_free(&methods[mi]) ? 0 : c.budgets[bi];
                    if (eval_turn(&m, &c, &r, &h, &methods[mi], budget, t, ctx,
                                  &acc[mi * c.n_budgets + bi], err, sizeof err)) {
                        fprintf(stderr, "tinyllm eval: %s at budget %lld: %s\n", methods[mi].name,
                                (long long)budget, err);
                        rc = 1;
                    }
                }
        }
        for (int32_t t = 1; t < c.n_turns && !rc; t++) {
            int32_t N = t * c.turn_len;
            rc = drop_turn(&m, &c, &r, t, 0, 1, &cal[0]) || drop_turn(&m, &c, &r, t, N / 2, N / 2 + 4, &cal[1]) ||
                 drop_turn(&m, &c, &r, t, N - 4, N, &cal[2]);
        }
        tl_history_free(&h);
        ref_free(&r);
    }
    double secs = now_s() - t0;
    if (!rc) {
        size_t row_bytes = (size_t)m.cfg.head_dim * 2 * sizeof(float); /* K and V of one (pos, kv head) */
        FILE *md = md_path ? fopen(md_path, "w") : stdout;
        FILE *js = json_path ? fopen(json_path, "w") : NULL;
        if (!md || (json_path && !js)) {
            fprintf(stderr, "tinyllm eval: cannot write output\n");
            rc = 1;
        } else {
            fprintf(md, "Model %s (%s): dim %d, %d layers, %d q heads, %d kv heads, vocab %d. "
                    "%d sequences sampled at temperature 1 (seeds %llu..), %d turns of %d tokens "
                    "(%d-token prompt prefilled, the rest decoded teacher-forced), turns 1..%d "
                    "evaluated; mean history %.0f tokens. Storage %s, block 16. %.1f s.\n\n",
                    argv[0], m.format, m.cfg.dim, m.cfg.n_layers, m.cfg.n_heads, m.cfg.n_kv_heads,
                    m.cfg.vocab_size, c.n_seqs, (unsigned long long)c.seed, c.n_turns, c.turn_len,
                    c.prompt_len, c.n_turns - 1, hist_turns ? hist_sum / (double)hist_turns : 0.0,
                    kvmem_dtype_name(c.storage), secs);
            fprintf(md, "Top-1 agreement with full context / KL(full || method) in nats, by KV budget "
                    "(history tokens kept):\n\n| method |");
            for (int32_t bi = 0; bi < c.n_budgets; bi++) fprintf(md, " budget %d |", c.budgets[bi]);
            fprintf(md, "\n|---|");
            for (int32_t bi = 0; bi < c.n_budgets; bi++) fprintf(md, "---|");
            fprintf(md, "\n");
            for (int32_t mi = 0; mi < n_methods; mi++) {
                fprintf(md, "| %s |", methods[mi].name);
                for (int32_t bi = 0; bi < c.n_budgets; bi++) {
                    const ev_acc *a = &acc[mi * c.n_budgets + (budget_free(&methods[mi]) ? 0 : bi)];
                    fprintf(md, " %.1f%% / %.4f |", 100.0 * a->agree / (double)a->n_pos, a->kl / (double)a->n_pos);
                }
                fprintf(md, "\n");
            }
            fprintf(md, "\nCost per turn, by budget: tokens run through the model (prefill, probe included) "
                    "and KV bytes read per decoded token (f32 working set, all layers):\n\n"
                    "| method | budget | memory rows | prefill tokens/turn | KV bytes/decoded token | max KL |\n"
                    "|---|---|---|---|---|---|\n");
            if (js) fprintf(js, "{\"model\":\"%s\",\"format\":\"%s\",\"sequences\":%d,\"turns\":%d,"
                            "\"turn_len\":%d,\"prompt_len\":%d,\"storage\":\"%s\",\"seconds\":%.2f,"
                            "\"text_reprefill_tokens_per_turn\":%.1f,\"missing\":\"%s\",\"results\":[",
                            argv[0], m.format, c.n_seqs, c.n_turns, c.turn_len, c.prompt_len,
                            kvmem_dtype_name(c.storage), secs,
                            hist_turns ? hist_sum / (double)hist_turns + c.prompt_len : 0.0, missing);
            int first = 1;
            for (int32_t mi = 0; mi < n_methods; mi++)
                for (int32_t bi = 0; bi < c.n_budgets; bi++) {
                    if (budget_free(&methods[mi]) && bi > 0) continue;
                    const ev_acc *a = &acc[mi * c.n_budgets + bi];
                    double bytes = a->decoded ? (double)a->rows_read * (double)row_bytes / (double)a->decoded : 0.0;
                    char bud[32];
                    if (budget_free(&methods[mi])) snprintf(bud, sizeof bud, "all");
                    else snprintf(bud, sizeof bud, "%d", c.budgets[bi]);
                    fprintf(md, "| %s | %s | %.0f | %.1f | %.0f | %.3f |\n", methods[mi].name, bud,
                            (double)a->mem_rows / (double)a->turns, (double)a->prefill / (double)a->turns,
                            bytes, a->kl_max);
                    if (js) {
                        fprintf(js, "%s{\"method\":\"%s\",\"budget\":%d,\"top1\":%.5f,\"kl\":%.6f,"
                                "\"kl_max\":%.6f,\"positions\":%lld,\"memory_rows\":%.1f,"
                                "\"prefill_per_turn\":%.1f,\"kv_bytes_per_decoded_token\":%.1f}",
                                first ? "" : ",", methods[mi].name,
                                budget_free(&methods[mi]) ? 0 : c.budgets[bi],
                                a->agree / (double)a->n_pos, a->kl / (double)a->n_pos, a->kl_max,
                                (long long)a->n_pos, (double)a->mem_rows / (double)a->turns,
                                (double)a->prefill / (double)a->turns, bytes);
                        first = 0;
                    }
                }
            fprintf(md, "\nA text agent that re-prefills its history instead would run %.0f tokens "
                    "through the model per turn.\n",
                    hist_turns ? hist_sum / (double)hist_turns + c.prompt_len : 0.0);
            fprintf(md, "\nCalibration without kvmem (the engine's own cache, rows simply left out): "
                    "dropping the first token -> top-1 %.1f%%, KL %.4f; 4 tokens in the middle of the history -> "
                    "%.1f%%, KL %.4f; the 4 newest history tokens -> %.1f%%, KL %.4f.\n",
                    100.0 * cal[0].agree / (double)cal[0].n_pos, cal[0].kl / (double)cal[0].n_pos,
                    100.0 * cal[1].agree / (double)cal[1].n_pos, cal[1].kl / (double)cal[1].n_pos,
                    100.0 * cal[2].agree / (double)cal[2].n_pos, cal[2].kl / (double)cal[2].n_pos);
            if (missing[0]) fprintf(md, "\nNot in this build: %s\n", missing);
            if (js)
                fprintf(js, "],\"calibration\":{\"drop_first\":{\"top1\":%.5f,\"kl\":%.6f},"
                        "\"drop_middle4\":{\"top1\":%.5f,\"kl\":%.6f},\"drop_newest4\":{\"top1\":%.5f,\"kl\":%.6f}}}\n",
                        cal[0].agree / (double)cal[0].n_pos, cal[0].kl / (double)cal[0].n_pos,
                        cal[1].agree / (double)cal[1].n_pos, cal[1].kl / (double)cal[1].n_pos,
                        cal[2].agree / (double)cal[2].n_pos, cal[2].kl / (double)cal[2].n_pos);
        }
        if (md && md != stdout) fclose(md);
        if (js) fclose(js);
    }
    free(acc);
    kvmem_context_free(ctx);
    tl_model_free(&m);
    return rc;
}
