/* tinyllm eval: the markdown and JSON reports. */
#include <stdlib.h>
#include <string.h>

#include "eval.h"

static double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

/* The recent window's score at the same budget: what "recovered" is measured from. */
static const tl_score *recent_at(const tl_eval_results *r, int32_t bi) {
    for (int32_t mi = 0; mi < r->n_methods; mi++)
        if (r->methods[mi].kind == TL_M_RECENT) return &r->fid[mi][bi];
    return NULL;
}

/* Share of full context's top-1 advantage over the recent window that a
 * method keeps on memory-dependent positions: (m - recent) / (1 - recent). */
static double recovered(const tl_score *a, const tl_score *rec) {
    if (!rec || !a->n_md || !rec->n_md) return 0.0;
    double m = ratio(a->agree_md, (double)a->n_md), r = ratio(rec->agree_md, (double)rec->n_md);
    return r < 1.0 ? (m - r) / (1.0 - r) : 0.0;
}

static const tl_score *cell(const tl_eval_results *r, int32_t mi, int32_t bi) {
    return &r->fid[mi][tl_method_budget_free(&r->methods[mi]) ? 0 : bi];
}

static const tl_recall_score *rcell(const tl_eval_results *r, int32_t mi, int32_t bi) {
    return &r->rec[mi][tl_method_budget_free(&r->methods[mi]) ? 0 : bi];
}

static int32_t full_index(const tl_eval_results *r) {
    for (int32_t mi = 0; mi < r->n_methods; mi++)
        if (r->methods[mi].kind == TL_M_FULL && !r->methods[mi].art) return mi;
    return -1;
}

/* " budget B |" per budget, then the markdown rule (after "| method |"). */
static void budget_header(FILE *f, const tl_eval_cfg *c) {
    char bn[32];
    for (int32_t bi = 0; bi < c->n_budgets; bi++) {
        tl_budget_name(&c->budgets[bi], bn, sizeof bn);
        fprintf(f, " budget %s |", bn);
    }
    fprintf(f, "\n|---|");
    for (int32_t bi = 0; bi < c->n_budgets; bi++) fprintf(f, "---|");
    fprintf(f, "\n");
}

static const char *const k_bucket[TL_RECALL_BUCKETS] = {"< 128", "128-255", "256-383", ">= 384"};

void tl_eval_write_md(FILE *f, const tl_eval_cfg *c, const tl_eval_results *r, const tl_model *m,
                      const char *model_path, const tl_recall_suite *suite) {
    int32_t nb = c->n_budgets;
    char bn[32];
    fprintf(f, "Model %s (%s): dim %d, %d layers, %d q heads, %d kv heads, vocab %d, trained length %d. "
            "%d sequences sampled at temperature 1 (seeds %llu..), %d turns of %d tokens (%d-token prompt "
            "prefilled, the rest decoded teacher-forced), turns %d..%d evaluated; mean history %.0f tokens. "
            "Storage %s, block 16; MemArt keeps %.0f%% of its budget as the live context. %.1f s.\n\n",
            model_path, m->format, m->cfg.dim, m->cfg.n_layers, m->cfg.n_heads, m->cfg.n_kv_heads,
            m->cfg.vocab_size, m->cfg.seq_len, c->n_seqs, (unsigned long long)c->seed, c->n_turns, c->turn_len,
            c->prompt_len, c->first_turn, c->n_turns - 1, ratio(r->hist_sum, (double)r->hist_turns),
            kvmem_dtype_name(c->storage), 100.0 * TL_MEMART_LOCAL_FRAC, r->seconds);
    fprintf(f, "Memory-dependent positions: %lld of %lld (%.1f%%) gain >= %.1f nats of log-probability of the "
            "next token from full context over the turn and the last %d history tokens alone, as text "
            "(mean %.2f vs %.2f nats there).\n\n",
            (long long)r->n_memdep, (long long)r->n_pos, 100.0 * ratio((double)r->n_memdep, (double)r->n_pos),
            c->memdep_nats, c->window, ratio(r->lp_full_md, (double)r->n_memdep),
            ratio(r->lp_short_md, (double)r->n_memdep));

    fprintf(f, "Top-1 agreement with full context / KL(full || method) in nats, all positions, by KV budget "
            "(history tokens kept; a share is of each turn's history):\n\n| method |");
    budget_header(f, c);
    for (int32_t mi = 0; mi < r->n_methods; mi++) {
        fprintf(f, "| %s |", r->methods[mi].name);
        for (int32_t bi = 0; bi < nb; bi++) {
            const tl_score *a = cell(r, mi, bi);
            fprintf(f, " %.1f%% / %.4f |", 100.0 * ratio(a->agree, (double)a->n_pos), ratio(a->kl, (double)a->n_pos));
        }
        fprintf(f, "\n");
    }

    fprintf(f, "\nThe same on the memory-dependent positions only: top-1 / KL, and the share of full context's "
            "top-1 advantage over the recent window at that budget that the method keeps, "
            "(method - recent) / (1 - recent):\n\n| method |");
    budget_header(f, c);
    for (int32_t mi = 0; mi < r->n_methods; mi++) {
        fprintf(f, "| %s |", r->methods[mi].name);
        for (int32_t bi = 0; bi < nb; bi++) {
            const tl_score *a = cell(r, mi, bi);
            fprintf(f, " %.1f%% / %.3f / %+.2f |", 100.0 * ratio(a->agree_md, (double)a->n_md),
                    ratio(a->kl_md, (double)a->n_md), recovered(a, recent_at(r, bi)));
        }
        fprintf(f, "\n");
    }

    fprintf(f, "\nCost per turn: history rows in the working set (MemArt: live context + retrieved), tokens run "
            "through the model (prefill; MemArt's probe counted), KV bytes read per decoded token (f32, all layers), "
            "ART tiles read, and the worst position (sequence, position):\n\n"
            "| method | budget | memory rows | live + retrieved | prefill tokens/turn | KV bytes/decoded token | "
            "ART tiles read | max KL (at) |\n|---|---|---|---|---|---|---|---|\n");
    size_t row_bytes = (size_t)m->cfg.head_dim * 2 * sizeof(float);
    for (int32_t mi = 0; mi < r->n_methods; mi++)
        for (int32_t bi = 0; bi < nb; bi++) {
            const tl_method *me = &r->methods[mi];
            if (tl_method_budget_free(me) && bi > 0) continue;
            const tl_score *a = &r->fid[mi][bi];
            double t = (double)(a->turns ? a->turns : 1);
            if (tl_method_budget_free(me)) snprintf(bn, sizeof bn, "all");
            else tl_budget_name(&c->budgets[bi], bn, sizeof bn);
            fprintf(f, "| %s | %s | %.0f | ", me->name, bn, (double)a->mem_rows / t);
            if (me->kind == TL_M_MEMART) fprintf(f, "%.0f + %.0f", (double)a->local_rows / t, (double)a->retrieved_rows / t);
            else fprintf(f, "-");
            fprintf(f, " | %.1f | %.0f | ", (double)a->prefill / t,
                    ratio((double)a->rows_read * (double)row_bytes, (double)a->decoded));
            if (me->art) fprintf(f, "%.1f%%", 100.0 * ratio((double)a->art_visited, (double)a->art_tiles));
            else fprintf(f, "-");
            fprintf(f, " | %.3f (%d, %d) |\n", a->kl_max, a->kl_max_seq, a->kl_max_pos);
        }
    fprintf(f, "\nA text agent that re-prefills its history instead would run %.0f tokens through the model per "
            "turn.\n", ratio(r->hist_sum, (double)r->hist_turns) + c->prompt_len);

    if (suite) {
        int32_t fi = full_index(r);
        const tl_recall_score *full = fi >= 0 ? &r->rec[fi][0] : NULL;
        fprintf(f, "\nRecall suite (%s): %d multi-session stories, a character named in session 1, then "
                "sessions about other things, then a prompt whose next word is the name. Top-1 hit rate of the "
                "name's first token / mean rank / share of full context's hit rate (%.1f s):\n\n| method |",
                suite->path, suite->n_cases, r->recall_seconds);
        budget_header(f, c);
        for (int32_t mi = 0; mi < r->n_methods; mi++) {
            fprintf(f, "| %s |", r->methods[mi].name);
            for (int32_t bi = 0; bi < nb; bi++) {
                const tl_recall_score *a = rcell(r, mi, bi);
                double hit = ratio((double)a->hits, (double)a->n);
                fprintf(f, " %.0f%% / %.1f / %.2f |", 100.0 * hit, ratio(a->rank_sum, (double)a->n),
                        full && full->hits ? hit / ratio((double)full->hits, (double)full->n) : 0.0);
            }
            fprintf(f, "\n");
        }
        fprintf(f, "\nRecall by how far back the name was last said (tokens before the prompt's end), top-1 hit "
                "rate (cases):\n\n| method | budget |");
        for (int b = 0; b < TL_RECALL_BUCKETS; b++) fprintf(f, " %s |", k_bucket[b]);
        fprintf(f, "\n|---|---|");
        for (int b = 0; b < TL_RECALL_BUCKETS; b++) fprintf(f, "---|");
        fprintf(f, "\n");
        for (int32_t mi = 0; mi < r->n_methods; mi++) {
            const tl_method *me = &r->methods[mi];
            if (me->art || (me->kind != TL_M_FULL && me->kind != TL_M_RECENT && strcmp(me->name, "memart") != 0))
                continue;
            for (int32_t bi = 0; bi < nb; bi++) {
                if (tl_method_budget_free(me) && bi > 0) continue;
                const tl_recall_score *a = &r->rec[mi][bi];
                if (tl_method_budget_free(me)) snprintf(bn, sizeof bn, "all");
                else tl_budget_name(&c->budgets[bi], bn, sizeof bn);
                fprintf(f, "| %s | %s |", me->name, bn);
                for (int b = 0; b < TL_RECALL_BUCKETS; b++)
                    fprintf(f, " %.0f%% (%lld) |", 100.0 * ratio((double)a->bucket_hits[b], (double)a->bucket_n[b]),
                            (long long)a->bucket_n[b]);
                fprintf(f, "\n");
            }
        }
    }
    if (r->missing[0]) fprintf(f, "\nNot in this build: %s\n", r->missing);
}

/* JSON string body: the few characters paths and names may hold. */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

void tl_eval_write_json(FILE *f, const tl_eval_cfg *c, const tl_eval_results *r, const tl_model *m,
                        const char *model_path, const tl_recall_suite *suite) {
    fprintf(f, "{\"model\":");
    json_str(f, model_path);
    fprintf(f, ",\"format\":\"%s\",\"sequences\":%d,\"turns\":%d,\"turn_len\":%d,\"prompt_len\":%d,"
            "\"first_turn\":%d,\"storage\":\"%s\",\"block_size\":16,\"memart_local_share\":%.2f,\"seconds\":%.2f,"
            "\"mean_history\":%.1f,\"text_reprefill_tokens_per_turn\":%.1f,",
            m->format, c->n_seqs, c->n_turns, c->turn_len, c->prompt_len, c->first_turn,
            kvmem_dtype_name(c->storage), TL_MEMART_LOCAL_FRAC, r->seconds, ratio(r->hist_sum, (double)r->hist_turns),
            ratio(r->hist_sum, (double)r->hist_turns) + c->prompt_len);
    fprintf(f, "\"memdep\":{\"window\":%d,\"nats\":%.2f,\"positions\":%lld,\"memdep_positions\":%lld,"
            "\"logprob_full_mean\":%.4f,\"logprob_window_mean\":%.4f},\"missing\":",
            c->window, c->memdep_nats, (long long)r->n_pos, (long long)r->n_memdep,
            ratio(r->lp_full_md, (double)r->n_memdep), ratio(r->lp_short_md, (double)r->n_memdep));
    json_str(f, r->missing);
    fprintf(f, ",\"results\":[");
    size_t row_bytes = (size_t)m->cfg.head_dim * 2 * sizeof(float);
    int first = 1;
    for (int32_t mi = 0; mi < r->n_methods; mi++)
        for (int32_t bi = 0; bi < c->n_budgets; bi++) {
            const tl_method *me = &r->methods[mi];
            if (tl_method_budget_free(me) && bi > 0) continue;
            const tl_score *a = &r->fid[mi][bi];
            const tl_budget *b = &c->budgets[bi];
            double t = (double)(a->turns ? a->turns : 1);
            fprintf(f, "%s{\"method\":\"%s\",\"budget\":%lld,\"budget_share\":%.4f,\"top1\":%.5f,\"kl\":%.6f,"
                    "\"kl_max\":%.6f,\"kl_max_seq\":%d,\"kl_max_pos\":%d,\"positions\":%lld,"
                    "\"top1_memdep\":%.5f,\"kl_memdep\":%.6f,\"logprob_memdep\":%.4f,\"n_memdep\":%lld,"
                    "\"recovered_memdep\":%.4f,\"memory_rows\":%.1f,\"local_rows\":%.1f,\"retrieved_rows\":%.1f,"
                    "\"prefill_per_turn\":%.1f,\"kv_bytes_per_decoded_token\":%.1f,\"art_tiles_read\":%.4f}",
                    first ? "" : ",", me->name, tl_method_budget_free(me) ? 0LL : (long long)b->tokens,
                    tl_method_budget_free(me) ? 0.0 : b->frac, ratio(a->agree, (double)a->n_pos),
                    ratio(a->kl, (double)a->n_pos), a->kl_max, a->kl_max_seq, a->kl_max_pos, (long long)a->n_pos,
                    ratio(a->agree_md, (double)a->n_md), ratio(a->kl_md, (double)a->n_md),
                    ratio(a->lp_md, (double)a->n_md), (long long)a->n_md,
                    tl_method_budget_free(me) ? 1.0 : recovered(a, recent_at(r, bi)), (double)a->mem_rows / t,
                    (double)a->local_rows / t, (double)a->retrieved_rows / t, (double)a->prefill / t,
                    ratio((double)a->rows_read * (double)row_bytes, (double)a->decoded),
                    me->art ? ratio((double)a->art_visited, (double)a->art_tiles) : 1.0);
            first = 0;
        }
    fprintf(f, "]");
    if (suite) {
        int32_t fi = full_index(r);
        const tl_recall_score *full = fi >= 0 ? &r->rec[fi][0] : NULL;
        fprintf(f, ",\"recall\":{\"file\":");
        json_str(f, suite->path);
        fprintf(f, ",\"cases\":%d,\"seconds\":%.2f,\"rows\":[", suite->n_cases, r->recall_seconds);
        first = 1;
        for (int32_t mi = 0; mi < r->n_methods; mi++)
            for (int32_t bi = 0; bi < c->n_budgets; bi++) {
                const tl_method *me = &r->methods[mi];
                if (tl_method_budget_free(me) && bi > 0) continue;
                const tl_recall_score *a = &r->rec[mi][bi];
                const tl_budget *b = &c->budgets[bi];
                double hit = ratio((double)a->hits, (double)a->n);
                fprintf(f, "%s{\"method\":\"%s\",\"budget\":%lld,\"budget_share\":%.4f,\"recall_top1\":%.5f,"
                        "\"recall_rank_mean\":%.3f,\"recall_logprob_mean\":%.4f,\"n_cases\":%lld,"
                        "\"share_of_full\":%.4f,\"memory_rows\":%.1f,\"by_distance\":[",
                        first ? "" : ",", me->name, tl_method_budget_free(me) ? 0LL : (long long)b->tokens,
                        tl_method_budget_free(me) ? 0.0 : b->frac, hit, ratio(a->rank_sum, (double)a->n),
                        ratio(a->lp_sum, (double)a->n), (long long)a->n,
                        full && full->hits ? hit / ratio((double)full->hits, (double)full->n) : 0.0,
                        ratio((double)a->mem_rows, (double)a->n));
                for (int k = 0; k < TL_RECALL_BUCKETS; k++)
                    fprintf(f, "%s{\"min\":%d,\"max\":%d,\"n\":%lld,\"recall_top1\":%.4f}", k ? "," : "", 128 * k,
                            k + 1 < TL_RECALL_BUCKETS ? 128 * (k + 1) - 1 : -1, (long long)a->bucket_n[k],
                            ratio((double)a->bucket_hits[k], (double)a->bucket_n[k]));
                fprintf(f, "]}");
                first = 0;
            }
        fprintf(f, "]}");
    }
    fprintf(f, "}\n");
}
