/* tinyllm eval --beyond: the markdown and JSON reports. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "beyond_eval.h"

static const char *const k_buckets[BX_BUCKETS] = {"1-2 windows", "2-4", "4-7", "7+"};
static const double k_fr[3] = {0.25, 0.5, 0.75};

static const char *sink_name_md(bx_sink s) { return s == BX_SINK_BOS ? "bos" : s == BX_SINK_BLOCK ? "block" : "none"; }

static double pct(int64_t a, int64_t b) { return b > 0 ? 100.0 * (double)a / (double)b : 0.0; }

static int cmp_int(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}
static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_rank(const bx_score *a, int32_t n) {
    if (n <= 0) return 0;
    int32_t *t = malloc((size_t)n * sizeof(int32_t));
    if (!t) return 0;
    memcpy(t, a->rank, (size_t)n * sizeof(int32_t));
    qsort(t, (size_t)n, sizeof *t, cmp_int);
    double m = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    free(t);
    return m;
}

static double median_d(const double *x, int32_t n) {
    if (n <= 0) return 0;
    double *t = malloc((size_t)n * sizeof(double));
    if (!t) return 0;
    memcpy(t, x, (size_t)n * sizeof(double));
    qsort(t, (size_t)n, sizeof *t, cmp_dbl);
    double m = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    free(t);
    return m;
}

static double ttft_ms(const bx_results *r, int32_t mi) { return 1e3 * median_d(r->score[mi].seconds, r->n_cases); }
static double ttft_cpu(const bx_results *r, int32_t mi) { return 1e3 * median_d(r->score[mi].cpu, r->n_cases); }

/* The row of a method by its fields (-1: not run). */
static int32_t find(const bx_results *r, bx_sel sel, bx_group g, int32_t mode, tl_order o, bx_sink sk, double mem,
                    double live, int32_t top_k, bx_oracle orc, tl_chunking ch) {
    for (int32_t i = 0; i < r->n_methods; i++) {
        const bx_method *m = &r->methods[i];
        if (m->sel == sel && m->group == g && m->mode == mode && m->order == o && m->sink == sk &&
            fabs(m->mem_frac - mem) < 1e-9 && fabs(m->live_frac - live) < 1e-9 && m->top_k == top_k &&
            m->oracle == orc && (sel != BX_BM25 || m->chunking == ch))
            return i;
    }
    return -1;
}

static int32_t find_name(const bx_results *r, const char *name, double mem) {
    for (int32_t i = 0; i < r->n_methods; i++)
        if (!strcmp(r->methods[i].name, name) && fabs(r->methods[i].mem_frac - mem) < 1e-9) return i;
    return -1;
}

static void top1_cell(FILE *f, const bx_score *a) {
    fprintf(f, " %.0f%% (%.0f / %.0f) |", pct(a->hits, a->n), pct(a->hits_g[0], a->n_g[0]), pct(a->hits_g[1], a->n_g[1]));
}

static int budget_free(const bx_method *m) { return m->mem_frac == 0; }

static void live_str(double live, char *b, size_t n) {
    if (live > 0) snprintf(b, n, "%g%% of the window", 100 * live);
    else snprintf(b, n, "the rest");
}

void tl_beyond_write_md(FILE *f, const bx_cfg *c, const bx_results *r, const tl_model *m, const char *model_path,
                        const tl_recall_suite *s) {
    int32_t W = m->cfg.seq_len, n0 = 0, n1 = 0, nf = c->quick ? 1 : 3;
    int32_t dmin = 1 << 30, dmax = 0;
    for (int32_t i = 0; i < s->n_cases; i++) {
        n0 += s->cases[i].n_before == 0;
        n1 += s->cases[i].n_before > 0;
        if (s->cases[i].distance < dmin) dmin = s->cases[i].distance;
        if (s->cases[i].distance > dmax) dmax = s->cases[i].distance;
    }
    char ln[48];
    live_str(c->best_live, ln, sizeof ln);
    fprintf(f, "Model %s: dim %d, %d layers, %d q / %d kv heads (head_dim %d), vocab %d, **trained window %d tokens**. "
            "Suite %s: %d cases, %d with the introduction in the first session and %d with 1-3 unrelated sessions "
            "before it; histories %lld-%lld tokens (mean %.0f, %.1f-%.1f windows); the name %d-%d tokens (%.1f-%.1f "
            "windows) before the cue's end. Every method gets the same window: %d tokens, the cue and the name "
            "included. Block and text chunk: %d tokens. Storage %s. %.0f s in all (history ingest %.0f s).\n\n",
            model_path, m->cfg.dim, m->cfg.n_layers, m->cfg.n_heads, m->cfg.n_kv_heads, m->cfg.head_dim,
            m->cfg.vocab_size, W, s->path, r->n_cases, n0, n1, (long long)r->hist_min, (long long)r->hist_max,
            (double)r->hist_tokens / (r->n_cases ? r->n_cases : 1), (double)r->hist_min / W, (double)r->hist_max / W,
            dmin, dmax, (double)dmin / W, (double)dmax / W, W, r->block_size,
            c->storage == KVMEM_F16 ? "f16" : c->storage == KVMEM_BF16 ? "bf16" : "f32", r->seconds, r->ingest_seconds);
    fprintf(f, "MemArt as deployed: blocks retrieved by the cue's queries (AABB, softmax/max), chronological, "
            "re-encoded before the live context, which takes the rest of the window. MemArt with the default "
            "placement: %s order, sink %s, live context %s.\n\n",
            tl_order_name(c->best_order), c->best_sink == BX_SINK_BLOCK ? "block kept first" :
            c->best_sink == BX_SINK_BOS ? "BOS row kept first" : "none", ln);

    fprintf(f, "Top-1 of the name's first token, all cases (intro first / sessions before), by the memory's share of "
            "the window:\n\n| method |");
    for (int fi = 0; fi < nf; fi++) fprintf(f, " memory %.0f%% |", 100 * k_fr[fi]);
    fprintf(f, "\n|---|");
    for (int fi = 0; fi < nf; fi++) fprintf(f, "---|");
    fprintf(f, "\n");
    for (int32_t mi = 0; mi < r->n_methods; mi++) {
        const bx_method *me = &r->methods[mi];
        if (me->group != BX_G_MAIN || (!budget_free(me) && fabs(me->mem_frac - 0.25) > 1e-9)) continue;
        fprintf(f, "| %s |", me->name);
        for (int fi = 0; fi < nf; fi++) {
            int32_t j = budget_free(me) ? (fi == 0 ? mi : -1) : find_name(r, me->name, k_fr[fi]);
            if (j < 0) fprintf(f, " |");
            else top1_cell(f, &r->score[j]);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "\nEviction methods and the text agents without retrieval have no memory share: they fill the window.\n\n");

    for (int fi = 0; fi < nf; fi++) {
        fprintf(f, "At memory %.0f%% of the window: the name's first token rank (median, mean), the whole name's "
                "log-probability, tokens run through the model per turn (MemArt: the probe and the cue), memory + "
                "live rows in the window, a block or chunk naming the character in the window, time to the first token (median, "
                "this machine, wall / this thread's CPU):\n\n| method | median rank | mean rank | name log-prob | prefill "
                "tokens | memory + live | name's unit in | TTFT ms |\n|---|---|---|---|---|---|---|---|\n", 100 * k_fr[fi]);
        for (int32_t mi = 0; mi < r->n_methods; mi++) {
            const bx_method *me = &r->methods[mi];
            if (me->group != BX_G_MAIN) continue;
            if (budget_free(me) ? fi > 0 : fabs(me->mem_frac - k_fr[fi]) > 1e-9) continue;
            const bx_score *a = &r->score[mi];
            double n = a->n ? (double)a->n : 1;
            char sel[16] = "-";
            if (me->sel == BX_MEMART || me->sel == BX_BM25) snprintf(sel, sizeof sel, "%.0f%%", pct(a->selected, a->n));
            fprintf(f, "| %s | %.1f | %.1f | %.2f | %.0f | %.0f + %.0f | %s | %.0f / %.0f |\n", me->name,
                    median_rank(a, r->n_cases), a->rank_sum / n, a->lp_sum / n, (double)a->prefill / n,
                    (double)(a->mem_rows) / n, (double)a->live_rows / n, sel, ttft_ms(r, mi), ttft_cpu(r, mi));
        }
        fprintf(f, "\n");
    }

    fprintf(f, "By how far back the name is (memory 25%%), top-1 (cases):\n\n| method |");
    for (int b = 0; b < BX_BUCKETS; b++) fprintf(f, " %s |", k_buckets[b]);
    fprintf(f, "\n|---|");
    for (int b = 0; b < BX_BUCKETS; b++) fprintf(f, "---|");
    fprintf(f, "\n");
    for (int32_t mi = 0; mi < r->n_methods; mi++) {
        const bx_method *me = &r->methods[mi];
        if (me->group != BX_G_MAIN || (!budget_free(me) && fabs(me->mem_frac - 0.25) > 1e-9)) continue;
        fprintf(f, "| %s |", me->name);
        for (int b = 0; b < BX_BUCKETS; b++)
            fprintf(f, " %.0f%% (%lld) |", pct(r->score[mi].bh[b], r->score[mi].bn[b]), (long long)r->score[mi].bn[b]);
        fprintf(f, "\n");
    }

    for (int mode = 0; mode < 2; mode++) {
        if (find(r, BX_MEMART, BX_G_PLACE, mode, TL_ORDER_CHRONO, BX_SINK_NONE, 0.25, 0, 0, BX_ORACLE_NONE, 0) < 0)
            continue;
        fprintf(f, "\nPlacement (MemArt%s): top-1 all (intro first / sessions before) by order and sink, the live "
                "context taking the rest of the window or a quarter of it:\n\n| order | sink |",
                mode ? ", EXACT scoring" : ", AABB");
        for (int fi = 0; fi < nf; fi++)
            for (int lv = 0; lv < 2; lv++) fprintf(f, " %.0f%%, live %s |", 100 * k_fr[fi], lv ? "25%" : "rest");
        fprintf(f, "\n|---|---|");
        for (int fi = 0; fi < nf; fi++) fprintf(f, "---|---|");
        fprintf(f, "\n");
        for (int o = 0; o < 3; o++)
            for (int sk = 0; sk < 3; sk++) {
                fprintf(f, "| %s | %s |", tl_order_name((tl_order)o), sink_name_md((bx_sink)sk));
                for (int fi = 0; fi < nf; fi++)
                    for (int lv = 0; lv < 2; lv++) {
                        int32_t j = find(r, BX_MEMART, BX_G_PLACE, mode, (tl_order)o, (bx_sink)sk, k_fr[fi],
                                         lv ? 0.25 : 0, 0, BX_ORACLE_NONE, 0);
                        if (j < 0) fprintf(f, " |");
                        else top1_cell(f, &r->score[j]);
                    }
                fprintf(f, "\n");
            }
    }

    if (find(r, BX_MEMART, BX_G_SPLIT, 0, c->best_order, c->best_sink, 0.25, 0.125, 0, BX_ORACLE_NONE, 0) >= 0) {
        static const double lives[] = {0.125, 0.25, 0.375, 0.5, 0};
        fprintf(f, "\nThe split (MemArt, default placement): the live context's share of the window, top-1 all "
                "(intro first / sessions before):\n\n| memory | live 12.5%% | live 25%% | live 37.5%% | live 50%% | "
                "live: the rest |\n|---|---|---|---|---|---|\n");
        for (int fi = 0; fi < nf; fi++) {
            fprintf(f, "| %.0f%% |", 100 * k_fr[fi]);
            for (int li = 0; li < 5; li++) {
                int32_t j = -1;
                for (int g = BX_G_MAIN; g <= BX_G_SPLIT && j < 0; g++)
                    j = find(r, BX_MEMART, (bx_group)g, 0, c->best_order, c->best_sink, k_fr[fi], lives[li], 0,
                             BX_ORACLE_NONE, 0);
                if (j < 0) fprintf(f, " |");
                else top1_cell(f, &r->score[j]);
            }
            fprintf(f, "\n");
        }
        fprintf(f, "\nTop-k below the memory share (default placement; the live context as at that share): top-1 "
                "all (intro first / sessions before):\n\n| memory | 1 block | 2 blocks | 4 blocks | 8 blocks | the "
                "share |\n|---|---|---|---|---|---|\n");
        for (int fi = 0; fi < nf; fi++) {
            fprintf(f, "| %.0f%% |", 100 * k_fr[fi]);
            for (int k = 1; k <= 8; k *= 2) {
                int32_t j = find(r, BX_MEMART, BX_G_TOPK, 0, c->best_order, c->best_sink, k_fr[fi], c->best_live, k,
                                 BX_ORACLE_NONE, 0);
                if (j < 0) fprintf(f, " - |");
                else top1_cell(f, &r->score[j]);
            }
            int32_t j = r->best[fi];
            top1_cell(f, &r->score[j]);
            fprintf(f, "\n");
        }
    }

    if (find(r, BX_MEMART, BX_G_SELECT, 0, c->best_order, c->best_sink, 0.25, c->best_live, 0, BX_ORACLE_NONE, 0) >= 0) {
        fprintf(f, "\nSelection (MemArt AABB, default placement): how block scores are normalised over blocks and "
                "aggregated over the cue's tokens; top-1 all (intro first / sessions before), and how often a block "
                "naming the character is in the window:\n\n| scores | 25%% | 50%% | 75%% |\n|---|---|---|---|\n");
        for (int v = 0; v < 4; v++) {
            fprintf(f, "| %s/%s |", v & 2 ? "rr" : "softmax", v & 1 ? "sum" : "max");
            for (int fi = 0; fi < 3; fi++) {
                int32_t j = -1;
                for (int32_t mi = 0; mi < r->n_methods && j < 0; mi++) {
                    const bx_method *me = &r->methods[mi];
                    if (me->sel == BX_MEMART && me->oracle == BX_ORACLE_NONE && !me->top_k && me->mode == 0 &&
                        (me->group == BX_G_SELECT || me->group == BX_G_MAIN) && me->order == c->best_order &&
                        me->sink == c->best_sink && fabs(me->live_frac - c->best_live) < 1e-9 &&
                        fabs(me->mem_frac - k_fr[fi]) < 1e-9 && me->norm == (v & 2 ? KVMEM_NORM_RR : 0) &&
                        me->agg == (v & 1 ? KVMEM_AGG_SUM : 0))
                        j = mi;
                }
                if (j < 0) fprintf(f, " |");
                else {
                    const bx_score *a = &r->score[j];
                    fprintf(f, " %.0f%% (%.0f / %.0f), %.0f%% in |", pct(a->hits, a->n), pct(a->hits_g[0], a->n_g[0]),
                            pct(a->hits_g[1], a->n_g[1]), pct(a->selected, a->n));
                }
            }
            fprintf(f, "\n");
        }
    }

    /* time to first token */
    int32_t hot = r->best[0], rag = find(r, BX_BM25, BX_G_MAIN, 0, TL_ORDER_CHRONO, BX_SINK_NONE, 0.25, 0, 0,
                                          BX_ORACLE_NONE, TL_CHUNK_TOKENS);
    int32_t txt = -1, full = -1, rs[2] = {-1, -1};
    for (int32_t mi = 0; mi < r->n_methods; mi++) {
        if (r->methods[mi].sel == BX_RECENT_TEXT) txt = mi;
        if (r->methods[mi].sel == BX_FULL_PAST) full = mi;
        if (r->methods[mi].group == BX_G_RESTART) rs[r->methods[mi].restart == KVMEM_Q4] = mi;
    }
    double th = ttft_ms(r, hot), tc = ttft_cpu(r, hot);
    fprintf(f, "\nTime to first token per turn (median over cases; wall ms on this shared machine, and this thread's CPU "
            "ms, which other jobs do not inflate), memory 25%%:\n\n| path | what runs | wall ms | CPU ms | CPU vs "
            "kvmem |\n|---|---|---|---|---|\n");
    fprintf(f, "| kvmem, hot | probe (cue over the newest %d tokens), retrieve, gather, cue prefill over the window "
            "| %.1f | %.1f | 1.00 |\n", c->probe_window, th, tc);
    for (int d = 0; d < 2; d++)
        if (rs[d] >= 0)
            fprintf(f, "| kvmem after a restart, %s file | pool + agent + load (%.1f ms wall), then the same | %.1f | "
                    "%.1f | %.2f |\n", d ? "Q4" : "f16", median_d(r->load_ms[d], r->n_cases), ttft_ms(r, rs[d]),
                    ttft_cpu(r, rs[d]), ttft_cpu(r, rs[d]) / tc);
    if (rag >= 0)
        fprintf(f, "| text RAG (BM25, 16-token chunks) | rank, re-prefill BOS + chunks + live text + cue (%.0f tokens) "
                "| %.1f | %.1f | %.2f |\n", (double)r->score[rag].prefill / (r->score[rag].n ? r->score[rag].n : 1),
                ttft_ms(r, rag), ttft_cpu(r, rag), ttft_cpu(r, rag) / tc);
    if (txt >= 0)
        fprintf(f, "| re-prefill the window's worth of history text | BOS + newest text + cue (%d tokens) | %.1f | "
                "%.1f | %.2f |\n", W, ttft_ms(r, txt), ttft_cpu(r, txt), ttft_cpu(r, txt) / tc);
    if (full >= 0)
        fprintf(f, "| every history row, past the window | cue over all %.0f rows (mean) | %.1f | %.1f | %.2f |\n",
                (double)r->score[full].mem_rows / (r->score[full].n ? r->score[full].n : 1), ttft_ms(r, full),
                ttft_cpu(r, full), ttft_cpu(r, full) / tc);
    fprintf(f, "\nRe-prefilling the whole history is not possible past the window; running the history once (ingest, "
            "per case, all sessions): median %.0f ms.\n", median_d(r->ingest_ms, r->n_cases));

    if (r->inspect_len) {
        fprintf(f, "\nFailures inspected (memory 25%%, the first cases where the name's first token was not top-1; "
                "the window's memory decoded in the order it was placed):\n%.*s", (int)r->inspect_len, r->inspect);
    }
}

/* The headline tables, one per memory share: the baselines, text RAG, the oracles and MemArt as deployed and
 * with the default placement, each with what the goal is judged on. */
static void write_tables(FILE *f, const bx_results *r) {
    static const struct {
        const char *label;
        bx_sel sel;
        bx_oracle oracle;
        tl_chunking ch;
        int which; /* 0: by kind; 1: MemArt as deployed; 2: MemArt, default placement; 3: the same, EXACT */
    } rows[] = {
        {"recent window", BX_RECENT, BX_ORACLE_NONE, 0, 0},
        {"StreamingLLM", BX_STREAMING, BX_ORACLE_NONE, 0, 0},
        {"H2O eviction", BX_H2O, BX_ORACLE_NONE, 0, 0},
        {"SnapKV eviction", BX_SNAPKV, BX_ORACLE_NONE, 0, 0},
        {"IntentKV eviction", BX_INTENTKV, BX_ORACLE_NONE, 0, 0},
        {"recent text re-prefilled", BX_RECENT_TEXT, BX_ORACLE_NONE, 0, 0},
        {"BM25 text RAG, 16-token chunks", BX_BM25, BX_ORACLE_NONE, TL_CHUNK_TOKENS, 0},
        {"BM25 text RAG, sentences", BX_BM25, BX_ORACLE_NONE, TL_CHUNK_SENTENCES, 0},
        {"text oracle: the name's chunk in BM25's set", BX_BM25, BX_ORACLE_SET, TL_CHUNK_TOKENS, 0},
        {"text oracle: the name's chunk before the live context", BX_BM25, BX_ORACLE_NEAR, TL_CHUNK_TOKENS, 0},
        {"MemArt as deployed (AABB, chronological, live the rest)", BX_MEMART, BX_ORACLE_NONE, 0, 1},
        {"MemArt, default placement", BX_MEMART, BX_ORACLE_NONE, 0, 2},
        {"MemArt EXACT, default placement", BX_MEMART, BX_ORACLE_NONE, 0, 3},
        {"block oracle: the name's block in MemArt's set", BX_MEMART, BX_ORACLE_SET, 0, 0},
        {"block oracle: the name's block before the live context", BX_MEMART, BX_ORACLE_NEAR, 0, 0},
    };
    fprintf(f, "\"tables\":[");
    int nf = 0;
    for (int fi = 0; fi < 3; fi++) nf += r->best[fi] > 0 || fi == 0;
    for (int fi = 0; fi < nf; fi++) {
        fprintf(f, "%s{\"mem_frac\":%g,\"rows\":[", fi ? "," : "", k_fr[fi]);
        int first = 1;
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
            int32_t j = -1;
            if (rows[ri].which == 1) j = r->deployed[fi];
            else if (rows[ri].which == 2) j = r->best[fi];
            else if (rows[ri].which == 3) j = r->best_exact[fi];
            else
                for (int32_t mi = 0; mi < r->n_methods && j < 0; mi++) {
                    const bx_method *me = &r->methods[mi];
                    if (me->group == BX_G_MAIN && me->sel == rows[ri].sel && me->oracle == rows[ri].oracle &&
                        me->order == TL_ORDER_CHRONO && me->live_frac == 0 &&
                        (me->sel != BX_BM25 || me->chunking == rows[ri].ch) &&
                        (budget_free(me) || fabs(me->mem_frac - k_fr[fi]) < 1e-9))
                        j = mi;
                }
            if (j < 0) continue;
            const bx_score *a = &r->score[j];
            double n = a->n ? (double)a->n : 1;
            fprintf(f, "%s{\"method\":\"%s\",\"name\":\"%s\",\"n\":%lld,\"top1\":%.4f,\"top1_first\":%.4f,"
                    "\"top1_before\":%.4f,\"rank_median\":%.1f,\"prefill_mean\":%.1f,\"selected\":%.4f}",
                    first ? "" : ",", rows[ri].label, r->methods[j].name, (long long)a->n, (double)a->hits / n,
                    a->n_g[0] ? (double)a->hits_g[0] / a->n_g[0] : 0, a->n_g[1] ? (double)a->hits_g[1] / a->n_g[1] : 0,
                    median_rank(a, r->n_cases), (double)a->prefill / n, (double)a->selected / n);
            first = 0;
        }
        fprintf(f, "]}");
    }
    fprintf(f, "]");
}

void tl_beyond_write_json(FILE *f, const bx_cfg *c, const bx_results *r, const tl_model *m, const char *model_path,
                          const tl_recall_suite *s) {
    int32_t W = m->cfg.seq_len;
    fprintf(f, "{\"model\":\"%s\",\"window\":%d,\"dim\":%d,\"n_layers\":%d,\"vocab\":%d,\"suite\":\"%s\",\"cases\":%d,"
            "\"block\":%d,\"seconds\":%.1f,\"ingest_seconds\":%.1f,\"history_tokens\":{\"min\":%lld,\"max\":%lld,"
            "\"mean\":%.1f},\"default\":{\"order\":\"%s\",\"sink\":\"%s\",\"live_frac\":%g},\"probe_window\":%d,",
            model_path, W, m->cfg.dim, m->cfg.n_layers, m->cfg.vocab_size, s->path, r->n_cases, r->block_size,
            r->seconds, r->ingest_seconds, (long long)r->hist_min, (long long)r->hist_max,
            (double)r->hist_tokens / (r->n_cases ? r->n_cases : 1), tl_order_name(c->best_order),
            sink_name_md(c->best_sink), c->best_live, c->probe_window);
    fprintf(f, "\"ttft_ms\":{\"ingest_median\":%.2f,\"load_f16_median\":%.2f,\"load_q4_median\":%.2f},",
            median_d(r->ingest_ms, r->n_cases), median_d(r->load_ms[0], r->n_cases), median_d(r->load_ms[1], r->n_cases));
    fprintf(f, "\"methods\":[");
    static const char *const groups[] = {"main", "placement", "split", "topk", "restart", "selection"};
    static const char *const sels[] = {"recent", "streamingllm", "h2o", "snapkv", "intentkv", "full_past",
                                       "recent_text", "memart", "bm25", "control_intro", "control_window"};
    static const char *const oracles[] = {"none", "only", "in_set", "near"};
    for (int32_t mi = 0; mi < r->n_methods; mi++) {
        const bx_method *me = &r->methods[mi];
        const bx_score *a = &r->score[mi];
        double n = a->n ? (double)a->n : 1;
        fprintf(f, "%s{\"name\":\"%s\",\"kind\":\"%s\",\"group\":\"%s\",\"mode\":\"%s\",\"order\":\"%s\",\"sink\":\"%s\","
                "\"oracle\":\"%s\",\"norm\":\"%s\",\"agg\":\"%s\",\"chunking\":\"%s\",\"mem_frac\":%g,\"live_frac\":%g,\"top_k\":%d,\"restart\":\"%s\","
                "\"n\":%lld,\"top1\":%.4f,\"n_first\":%lld,\"top1_first\":%.4f,\"n_before\":%lld,\"top1_before\":%.4f,"
                "\"rank_mean\":%.3f,\"rank_median\":%.1f,\"logprob_mean\":%.4f,\"logprob_first\":%.4f,"
                "\"logprob_before\":%.4f,\"prefill_mean\":%.2f,\"memory_rows_mean\":%.2f,\"live_rows_mean\":%.2f,"
                "\"selected\":%.4f,\"ttft_ms_median\":%.3f,\"ttft_cpu_ms_median\":%.3f,\"by_distance\":[",
                mi ? "," : "", me->name, sels[me->sel], groups[me->group], me->mode ? "exact" : "aabb",
                tl_order_name(me->order), sink_name_md(me->sink), oracles[me->oracle],
                me->norm == KVMEM_NORM_RR ? "rr" : "softmax", me->agg == KVMEM_AGG_SUM ? "sum" : "max", me->chunking == TL_CHUNK_SENTENCES ? "sentences" : "tokens", me->mem_frac, me->live_frac, me->top_k,
                me->group == BX_G_RESTART ? (me->restart == KVMEM_Q4 ? "q4" : "f16") : "none", (long long)a->n,
                a->n ? (double)a->hits / n : 0, (long long)a->n_g[0], a->n_g[0] ? (double)a->hits_g[0] / a->n_g[0] : 0,
                (long long)a->n_g[1], a->n_g[1] ? (double)a->hits_g[1] / a->n_g[1] : 0, a->rank_sum / n,
                median_rank(a, r->n_cases), a->lp_sum / n, a->n_g[0] ? a->lp_g[0] / a->n_g[0] : 0,
                a->n_g[1] ? a->lp_g[1] / a->n_g[1] : 0, (double)a->prefill / n, (double)a->mem_rows / n,
                (double)a->live_rows / n, (double)a->selected / n, ttft_ms(r, mi), ttft_cpu(r, mi));
        static const double lo[] = {0, 2, 4, 7}, hi[] = {2, 4, 7, 1e9};
        for (int b = 0; b < BX_BUCKETS; b++)
            fprintf(f, "%s{\"windows_min\":%g,\"windows_max\":%g,\"n\":%lld,\"top1\":%.4f,\"n_first\":%lld,"
                    "\"top1_first\":%.4f,\"n_before\":%lld,\"top1_before\":%.4f}", b ? "," : "", lo[b],
                    hi[b] > 1e8 ? -1.0 : hi[b], (long long)a->bn[b], a->bn[b] ? (double)a->bh[b] / a->bn[b] : 0,
                    (long long)a->bn_g[0][b], a->bn_g[0][b] ? (double)a->bh_g[0][b] / a->bn_g[0][b] : 0,
                    (long long)a->bn_g[1][b], a->bn_g[1][b] ? (double)a->bh_g[1][b] / a->bn_g[1][b] : 0);
        fprintf(f, "]}");
    }
    fprintf(f, "],");
    write_tables(f, r);
    fprintf(f, ",\"cases_detail\":[");
    for (int32_t i = 0; i < s->n_cases; i++) {
        const tl_recall_case *rc = &s->cases[i];
        const bx_case_note *nt = &r->notes[i];
        fprintf(f, "%s{\"id\":\"%s\",\"history\":%d,\"prompt\":%d,\"name_tokens\":%d,\"name_at\":%d,"
                "\"distance\":%d,\"before\":%d,\"name_block\":%d,\"name_blocks\":[", i ? "," : "", rc->id,
                rc->n_hist, rc->n_prompt, rc->n_name, rc->name_at, rc->distance, rc->n_before, nt->name_block);
        for (int32_t b = 0; b < nt->n_name_blocks; b++) fprintf(f, "%s%d", b ? "," : "", nt->name_blocks[b]);
        fprintf(f, "]");
        /* MemArt at the first memory share, as deployed and with the default placement: its window */
        static const char *const which[2] = {"deployed", "default"};
        for (int w = 0; w < 2; w++) {
            fprintf(f, ",\"%s\":{\"rank\":%d,\"selected\":%d,\"memory_rows\":%lld,\"live_rows\":%lld,"
                    "\"prefill\":%lld,\"blocks\":[", which[w], nt->rank[w], nt->selected[w], (long long)nt->mem_rows[w],
                    (long long)nt->live_rows[w], (long long)nt->prefill[w]);
            for (int32_t b = 0; b < nt->n_blocks[w]; b++) fprintf(f, "%s%d", b ? "," : "", nt->blocks[w][b]);
            fprintf(f, "]}");
        }
        fprintf(f, "}");
    }
    fprintf(f, "]}\n");
}
