/* tinyllm eval --recall: the text recall suite. Multi-session stories (a
 * character named in session 1, other things after, then a prompt whose next
 * word is the name): does the model, through each kvmem method at each
 * budget, still name the character? The file's header (recall-stories.txt)
 * gives the format and how cases are composed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"

#define RC_MAX_PIECES 256

typedef struct rc_text {
    char *s;
    char name[48]; /* intros only */
} rc_text;

typedef struct rc_file {
    rc_text intro[RC_MAX_PIECES], filler[RC_MAX_PIECES], prompt[RC_MAX_PIECES];
    int32_t n_intro, n_filler, n_prompt;
    int32_t counts[64], n_counts;
    int32_t before[64], n_before; /* sessions before the intro (cycle) */
    double windows[64];           /* the name's distance in model windows (cycle; replaces counts) */
    int32_t n_windows;
} rc_file;

static void rc_file_free(rc_file *f) {
    for (int32_t i = 0; i < f->n_intro; i++) free(f->intro[i].s);
    for (int32_t i = 0; i < f->n_filler; i++) free(f->filler[i].s);
    for (int32_t i = 0; i < f->n_prompt; i++) free(f->prompt[i].s);
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n')) s[--n] = '\0';
    return s;
}

static int add_text(rc_text *arr, int32_t *n, const char *text, const char *name, const char *path, int line,
                    char *err, size_t err_size) {
    if (*n == RC_MAX_PIECES) return tl_errf(err, err_size, "%s:%d: more than %d pieces of one kind", path, line, RC_MAX_PIECES);
    if (!*text) return tl_errf(err, err_size, "%s:%d: empty text", path, line);
    rc_text *t = &arr[*n];
    t->s = strdup(text);
    if (!t->s) return tl_errf(err, err_size, "out of memory");
    snprintf(t->name, sizeof t->name, "%s", name ? name : "");
    (*n)++;
    return 0;
}

static int parse_file(rc_file *f, const char *path, char *err, size_t err_size) {
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "r");
    if (!fp) return tl_errf(err, err_size, "recall suite %s: %s", path, strerror(errno));
    char buf[4096];
    int line = 0, rc = 0;
    while (!rc && fgets(buf, sizeof buf, fp)) {
        line++;
        if (!strchr(buf, '\n') && !feof(fp)) {
            rc = tl_errf(err, err_size, "%s:%d: line longer than %zu bytes", path, line, sizeof buf - 2);
            break;
        }
        char *s = trim(buf);
        if (!*s || *s == '#') continue;
        char *colon = strchr(s, ':');
        if (!colon) {
            rc = tl_errf(err, err_size, "%s:%d: expected 'intro NAME:', 'filler:', 'prompt:', 'counts:', 'before:' "
                         "or 'windows:'", path, line);
            break;
        }
        *colon = '\0';
        char *key = trim(s), *val = trim(colon + 1);
        if (!strncmp(key, "intro ", 6)) {
            char *name = trim(key + 6);
            if (!*name || strlen(name) >= sizeof f->intro[0].name || strchr(name, ' '))
                rc = tl_errf(err, err_size, "%s:%d: intro needs one name word (under 48 bytes)", path, line);
            else if (!strstr(val, name))
                rc = tl_errf(err, err_size, "%s:%d: the intro never says its name '%s'", path, line, name);
            else
                rc = add_text(f->intro, &f->n_intro, val, name, path, line, err, err_size);
        } else if (!strcmp(key, "filler")) {
            rc = add_text(f->filler, &f->n_filler, val, NULL, path, line, err, err_size);
        } else if (!strcmp(key, "prompt")) {
            rc = add_text(f->prompt, &f->n_prompt, val, NULL, path, line, err, err_size);
        } else if (!strcmp(key, "counts")) {
            f->n_counts = 0;
            for (char *e = val; *e;) {
                char *end;
                long v = strtol(e, &end, 10);
                if (end == e || v < 0 || v > 64 || f->n_counts == 64) {
                    rc = tl_errf(err, err_size, "%s:%d: counts: up to 64 filler counts in [0, 64]", path, line);
                    break;
                }
                f->counts[f->n_counts++] = (int32_t)v;
                e = end;
                while (*e == ',' || *e == ' ') e++;
            }
        } else if (!strcmp(key, "before")) {
            f->n_before = 0;
            for (char *e = val; *e;) {
                char *end;
                long v = strtol(e, &end, 10);
                if (end == e || v < 0 || v > 64 || f->n_before == 64) {
                    rc = tl_errf(err, err_size, "%s:%d: before: up to 64 session counts in [0, 64]", path, line);
                    break;
                }
                f->before[f->n_before++] = (int32_t)v;
                e = end;
                while (*e == ',' || *e == ' ') e++;
            }
        } else if (!strcmp(key, "windows")) {
            f->n_windows = 0;
            for (char *e = val; *e;) {
                char *end;
                double v = strtod(e, &end);
                if (end == e || !(v > 0 && v <= 1000) || f->n_windows == 64) {
                    rc = tl_errf(err, err_size, "%s:%d: windows: up to 64 distances in (0, 1000] windows", path, line);
                    break;
                }
                f->windows[f->n_windows++] = v;
                e = end;
                while (*e == ',' || *e == ' ') e++;
            }
        } else {
            rc = tl_errf(err, err_size, "%s:%d: unknown key '%s'", path, line, key);
        }
    }
    if (!rc && ferror(fp)) rc = tl_errf(err, err_size, "recall suite %s: read error", path);
    fclose(fp);
    if (!rc && (!f->n_intro || !f->n_prompt || (!f->n_counts && !f->n_windows)))
        rc = tl_errf(err, err_size, "recall suite %s: needs intros, prompts and counts (or windows)", path);
    if (!rc && !f->n_filler) {
        for (int32_t i = 0; i < f->n_counts && !rc; i++)
            if (f->counts[i]) rc = tl_errf(err, err_size, "recall suite %s: counts > 0 but no fillers", path);
        for (int32_t i = 0; i < f->n_before && !rc; i++)
            if (f->before[i]) rc = tl_errf(err, err_size, "recall suite %s: before > 0 but no fillers", path);
        if (!rc && f->n_windows) rc = tl_errf(err, err_size, "recall suite %s: windows but no fillers", path);
    }
    if (rc) rc_file_free(f);
    return rc;
}

/* Append the ids of text to a growing array. */
static int push_text(const tl_tokenizer *tk, const char *text, int bos, int32_t **ids, int32_t *n, int32_t *cap,
                     char *err, size_t err_size) {
    int32_t need = 0;
    if (tl_encode(tk, text, strlen(text), bos, NULL, 0, &need, NULL, 0) && need <= 0)
        return tl_errf(err, err_size, "cannot tokenize \"%.40s\"", text);
    if (*n + need > *cap) {
        int32_t nc = (*n + need) * 2;
        int32_t *p = realloc(*ids, (size_t)nc * sizeof(int32_t));
        if (!p) return tl_errf(err, err_size, "out of memory");
        *ids = p;
        *cap = nc;
    }
    int32_t got = 0;
    if (tl_encode(tk, text, strlen(text), bos, *ids + *n, *cap - *n, &got, err, err_size)) return -1;
    *n += got;
    return 0;
}

/* The last place the name's ids occur in ids[0, n). */
static int32_t last_mention(const int32_t *ids, int32_t n, const int32_t *name, int32_t nn) {
    for (int32_t i = n - nn; i >= 0; i--)
        if (!memcmp(ids + i, name, (size_t)nn * sizeof(int32_t))) return i;
    return -1;
}

void tl_recall_free(tl_recall_suite *s) {
    for (int32_t i = 0; i < s->n_loaded; i++) {
        free(s->cases[i].tok);
        free(s->cases[i].session_start);
    }
    free(s->cases);
    tl_tokenizer_free(s->tok);
    memset(s, 0, sizeof *s);
}

/* The first occurrence of the name's ids in ids[from, n). */
static int32_t first_mention(const int32_t *ids, int32_t from, int32_t n, const int32_t *name, int32_t nn) {
    for (int32_t i = from; i + nn <= n; i++)
        if (!memcmp(ids + i, name, (size_t)nn * sizeof(int32_t))) return i;
    return -1;
}

/* Session starts grow as sessions are added. */
static int add_session(tl_recall_case *c, int32_t *cap, int32_t start) {
    if (c->n_sessions == *cap) {
        int32_t nc = *cap ? 2 * *cap : 16;
        int32_t *p = realloc(c->session_start, (size_t)nc * sizeof(int32_t));
        if (!p) return -1;
        c->session_start = p;
        *cap = nc;
    }
    c->session_start[c->n_sessions++] = start;
    return 0;
}

int tl_recall_load(tl_recall_suite *s, const char *path, const char *tok_path, const char *model_path,
                   const tl_model *m, char *err, size_t err_size) {
    return tl_recall_load_ex(s, path, tok_path, model_path, m, 0, err, err_size);
}

int tl_recall_load_ex(tl_recall_suite *s, const char *path, const char *tok_path, const char *model_path,
                      const tl_model *m, int beyond, char *err, size_t err_size) {
    memset(s, 0, sizeof *s);
    snprintf(s->path, sizeof s->path, "%s", path);
    char buf[4096];
    if (tok_path) {
        if (tl_tokenizer_load(tok_path, m->cfg.vocab_size, &s->tok, err, err_size)) return -1;
    } else if (tl_tokenizer_from_model(m, &s->tok, NULL, 0)) {
        const char *tp = tl_find_tokenizer(model_path, buf, sizeof buf);
        if (!tp) return tl_errf(err, err_size, "the recall suite needs a tokenizer: none beside %s (--tokenizer FILE)",
                                model_path);
        if (tl_tokenizer_load(tp, m->cfg.vocab_size, &s->tok, err, err_size)) return -1;
    }
    rc_file f;
    if (parse_file(&f, path, err, err_size)) {
        tl_recall_free(s);
        return -1;
    }
    int rc = 0;
    if (beyond && !f.n_windows) rc = tl_errf(err, err_size, "recall suite %s: a beyond-the-window suite gives 'windows:'", path);
    if (!beyond && f.n_windows)
        rc = tl_errf(err, err_size, "recall suite %s: has 'windows:' (histories past the window): run it with --beyond", path);
    if (!rc) {
        s->cases = calloc((size_t)f.n_intro, sizeof *s->cases);
        if (!s->cases) rc = tl_errf(err, err_size, "out of memory");
    }
    int32_t W = m->cfg.seq_len;
    for (int32_t i = 0; i < f.n_intro && !rc; i++) {
        tl_recall_case *c = &s->cases[i];
        int32_t k = f.n_counts ? f.counts[i % f.n_counts] : 0, before = f.n_before ? f.before[i % f.n_before] : 0;
        int32_t cap = 0, n = 0, *ids = NULL, scap = 0;
        double wins = f.n_windows ? f.windows[i % f.n_windows] : 0;
        if (f.n_windows) snprintf(c->id, sizeof c->id, "%.24s-b%d-w%g", f.intro[i].name, before, wins);
        else if (before) snprintf(c->id, sizeof c->id, "%.32s-b%d-%d", f.intro[i].name, before, k);
        else snprintf(c->id, sizeof c->id, "%.32s-%d", f.intro[i].name, k);
        snprintf(c->name, sizeof c->name, "%s", f.intro[i].name);
        s->n_loaded = i + 1; /* freed from here on, even if it fails half-built */
        c->n_before = before;
        c->windows = wins;
        for (int32_t j = 0; j < before && !rc; j++) {
            if (add_session(c, &scap, n)) rc = tl_errf(err, err_size, "out of memory");
            else rc = push_text(s->tok, f.filler[(7 * i + 40 + j) % f.n_filler].s, j == 0, &ids, &n, &cap, err, err_size);
        }
        if (!rc && add_session(c, &scap, n)) rc = tl_errf(err, err_size, "out of memory");
        c->intro_start = n;
        if (!rc) rc = push_text(s->tok, f.intro[i].s, before == 0, &ids, &n, &cap, err, err_size);
        int32_t intro_end = n;
        /* the name as the prompt's continuation (with its leading space) */
        int32_t *name_ids = NULL, nn = 0, ncap = 0;
        if (!rc) rc = push_text(s->tok, c->name, 0, &name_ids, &nn, &ncap, err, err_size);
        int32_t prompt_len = 0;
        if (!rc) {
            int32_t *p_ids = NULL, pcap = 0;
            rc = push_text(s->tok, f.prompt[i % f.n_prompt].s, 0, &p_ids, &prompt_len, &pcap, err, err_size);
            free(p_ids);
        }
        int32_t last = rc ? -1 : last_mention(ids, n, name_ids, nn);
        if (!rc && last < 0)
            rc = tl_errf(err, err_size, "recall case %s: the name's tokens never occur in the intro "
                         "(it is tokenized differently there)", c->id);
        if (!rc) c->name_at = first_mention(ids, c->intro_start, n, name_ids, nn);
        /* fillers: a count, or until the name is `wins` windows before the prompt's end */
        for (int32_t j = 0; !rc && (f.n_windows ? (n + prompt_len - last) < (int32_t)(wins * W + 0.5) : j < k); j++) {
            if (add_session(c, &scap, n)) rc = tl_errf(err, err_size, "out of memory");
            else rc = push_text(s->tok, f.filler[(7 * i + j) % f.n_filler].s, 0, &ids, &n, &cap, err, err_size);
        }
        (void)intro_end;
        c->n_hist = n;
        if (!rc) rc = push_text(s->tok, f.prompt[i % f.n_prompt].s, 0, &ids, &n, &cap, err, err_size);
        c->n_prompt = n - c->n_hist;
        if (!rc) rc = push_text(s->tok, c->name, 0, &ids, &n, &cap, err, err_size);
        c->n_name = n - c->n_hist - c->n_prompt;
        c->tok = ids;
        free(name_ids);
        if (rc) break;
        if (!beyond && n > W) {
            rc = tl_errf(err, err_size, "recall case %s: %d tokens, more than the model's %d", c->id, n, W);
            break;
        }
        if (beyond && c->n_prompt + c->n_name > W / 4) {
            rc = tl_errf(err, err_size, "recall case %s: its prompt and name take %d of the model's %d tokens", c->id,
                         c->n_prompt + c->n_name, W);
            break;
        }
        int32_t at = last_mention(ids, c->n_hist, ids + c->n_hist + c->n_prompt, c->n_name);
        if (at < 0) {
            rc = tl_errf(err, err_size, "recall case %s: the name's tokens never occur in the history "
                         "(it is tokenized differently there)", c->id);
            break;
        }
        c->distance = c->n_hist + c->n_prompt - at;
        s->n_cases = s->n_loaded = i + 1;
    }
    rc_file_free(&f);
    if (rc) tl_recall_free(s);
    return rc;
}

/* Full context over a case's history, session by session, into a fresh
 * agent; k_rot/v/q_rot/acc as the eval's reference pass keeps them. */
static int case_history(const tl_model *m, const tl_recall_case *rc, kvmem_context *ctx, kvmem_dtype storage,
                        tl_history *h, char *err, size_t err_size) {
    const tl_config *mc = &m->cfg;
    int32_t n = rc->n_hist, L = mc->n_layers, d = mc->dim;
    size_t kvd = (size_t)mc->n_kv_heads * (size_t)mc->head_dim;
    int32_t max_s = 0;
    for (int32_t s = 0; s < rc->n_sessions; s++) {
        int32_t e = s + 1 < rc->n_sessions ? rc->session_start[s + 1] : n;
        if (e - rc->session_start[s] > max_s) max_s = e - rc->session_start[s];
    }
    tl_state *st = tl_state_create(mc, max_s);
    tl_kv kv;
    float *kc = malloc((size_t)L * (size_t)max_s * kvd * sizeof(float));
    float *vc = malloc((size_t)L * (size_t)max_s * kvd * sizeof(float));
    float *q = malloc((size_t)max_s * (size_t)L * (size_t)d * sizeof(float));
    float *acc = calloc((size_t)n, sizeof(float));
    int32_t *pos = malloc((size_t)n * sizeof(int32_t));
    int rc_ = -1;
    memset(&kv, 0, sizeof kv);
    if (!st || !kc || !vc || !q || !acc || !pos || tl_kv_init(&kv, mc, n)) {
        tl_errf(err, err_size, "out of memory");
        goto out;
    }
    if (tl_history_init(h, ctx, m, n, storage, 16, "recall", err, err_size)) goto out;
    for (int32_t i = 0; i < n; i++) pos[i] = i;
    for (int32_t s = 0; s < rc->n_sessions; s++) {
        int32_t p0 = rc->session_start[s], e = s + 1 < rc->n_sessions ? rc->session_start[s + 1] : n, T = e - p0;
        tl_trace tr = {0};
        tr.k_rot = kc;
        tr.v_out = vc;
        tr.q_rot = q;
        tr.attn_acc = acc;
        if (tl_forward(m, st, &kv, rc->tok + p0, T, pos + p0, NULL, &tr, NULL, NULL)) {
            tl_errf(err, err_size, "recall case %s: forward failed", rc->id);
            goto out;
        }
        /* each session is a user turn: all of it goes into IntentKV's QueryMemory */
        if (tl_history_append(h, kc, vc, T, pos + p0, rc->tok + p0, q, acc, T, err, err_size)) goto out;
    }
    rc_ = 0;
out:
    if (rc_) tl_history_free(h);
    tl_kv_free(&kv);
    tl_state_free(st);
    free(kc);
    free(vc);
    free(q);
    free(acc);
    free(pos);
    return rc_;
}

static int bucket_of(int32_t distance) {
    int b = distance / 128;
    return b < TL_RECALL_BUCKETS ? b : TL_RECALL_BUCKETS - 1;
}

/* One method at one budget on one case: prefill the prompt but its last
 * token, then decode the last prompt token and the name, teacher-forced. */
static int run_case(const tl_model *m, const tl_recall_case *rc, tl_history *h, const tl_method *me, int64_t budget,
                    int32_t probe_window, kvmem_context *ctx, tl_recall_score *sc, char *err, size_t err_size) {
    const tl_config *mc = &m->cfg;
    int32_t N = rc->n_hist, P = rc->n_prompt, K = rc->n_name, V = mc->vocab_size, L = mc->n_layers, d = mc->dim;
    const int32_t *prompt = rc->tok + N, *name = prompt + P;
    tl_state *s = tl_state_create(mc, P);
    tl_kv kv;
    float *logits = malloc((size_t)V * sizeof(float));
    float *probe = malloc((size_t)P * (size_t)L * (size_t)d * sizeof(float));
    int32_t *pos = malloc((size_t)(P + K) * sizeof(int32_t));
    int rc_ = -1;
    memset(&kv, 0, sizeof kv);
    if (!s || !logits || !probe || !pos || tl_kv_init(&kv, mc, N + P + K + probe_window)) {
        tl_errf(err, err_size, "out of memory");
        goto out;
    }
    for (int32_t i = 0; i < P + K; i++) pos[i] = N + i;
    if (me->needs_probe) {
        kv.n = 0;
        if (tl_memory_recent(h, probe_window, &kv, err, err_size)) goto out;
        tl_trace tr = {0};
        tr.q_raw = probe;
        if (tl_forward(m, s, &kv, prompt, P, pos, NULL, &tr, NULL, NULL)) {
            tl_errf(err, err_size, "probe forward failed");
            goto out;
        }
    }
    if (tl_memory_build(h, me, budget, probe, P, N, &kv, err, err_size)) goto out;
    sc->mem_rows += kv.n;
    if (P > 1 && tl_forward(m, s, &kv, prompt, P - 1, pos, NULL, NULL, NULL, NULL)) {
        tl_errf(err, err_size, "prefill failed");
        goto out;
    }
    tl_art art;
    tl_art_setup(&art, me, ctx);
    double lp = 0;
    int32_t rank = 0;
    for (int32_t i = 0; i < K; i++) {
        const int32_t *t = i == 0 ? prompt + P - 1 : name + i - 1;
        if (tl_forward(m, s, &kv, t, 1, pos + P - 1 + i, logits, NULL, me->art ? &art : NULL, NULL)) {
            tl_errf(err, err_size, "decode failed%s%s", me->art ? ": " : "", me->art ? kvmem_last_error() : "");
            goto out;
        }
        if (i == 0) rank = tl_rank_of(logits, V, name[0]);
        lp += tl_log_softmax_at(logits, V, name[i]);
    }
    sc->n++;
    sc->hits += rank == 1;
    sc->rank_sum += rank;
    sc->lp_sum += lp;
    int b = bucket_of(rc->distance);
    sc->bucket_n[b]++;
    sc->bucket_hits[b] += rank == 1;
    rc_ = 0;
out:
    tl_kv_free(&kv);
    tl_state_free(s);
    free(logits);
    free(probe);
    free(pos);
    return rc_;
}

int tl_recall_run(const tl_recall_suite *s, const tl_model *m, const tl_eval_cfg *c, kvmem_context *ctx,
                  tl_eval_results *res, char *err, size_t err_size) {
    double t0 = tl_now_s();
    for (int32_t ci = 0; ci < s->n_cases; ci++) {
        const tl_recall_case *rc = &s->cases[ci];
        tl_progress(c, "recall: case %d/%d (%s, name %d tokens back)", ci + 1, s->n_cases, rc->id, rc->distance);
        tl_history h;
        if (case_history(m, rc, ctx, c->storage, &h, err, err_size)) return 1;
        int fail = 0;
        for (int32_t mi = 0; mi < res->n_methods && !fail; mi++) {
            const tl_method *me = &res->methods[mi];
            for (int32_t bi = 0; bi < c->n_budgets && !fail; bi++) {
                if (tl_method_budget_free(me) && bi > 0) continue;
                int64_t budget = tl_method_budget_free(me) ? 0 : tl_budget_tokens(&c->budgets[bi], h.n, 16);
                if (run_case(m, rc, &h, me, budget, c->probe_window, ctx, &res->rec[mi][bi], err, err_size)) {
                    char e2[TL_ERR_SIZE];
                    snprintf(e2, sizeof e2, "%s", err);
                    tl_errf(err, err_size, "recall case %s, %s at budget %lld: %s", rc->id, me->name,
                            (long long)budget, e2);
                    fail = 1;
                }
            }
        }
        tl_history_free(&h);
        if (fail) return 1;
    }
    res->recall_seconds = tl_now_s() - t0;
    return 0;
}
