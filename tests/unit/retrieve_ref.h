/* A plain double-precision reference of DESIGN.md "Retrieval (MemArt)",
 * written independently of core/retrieve for the retrieval tests. */
#ifndef KVMEM_TEST_RETRIEVE_REF_H
#define KVMEM_TEST_RETRIEVE_REF_H

#include "kvmem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Scores S(b) of the sealed blocks for one set (layer -1 = GLOBAL), NAN for
 * non-candidates. q: [n_q][L][NQ][D] f32 contiguous. cand[b]: 1 candidate. */
static void ref_scores(kvmem_agent *ag, const kvmem_model_spec *s, const float *q, int n_q,
                       const kvmem_retrieve_params *p, const unsigned char *cand, int layer, double *S) {
    kvmem_agent_info ai;
    kvmem_agent_get_info(ag, &ai);
    const int nb = ai.n_sealed, L = s->n_layers, NQ = s->n_q_heads, H = s->n_kv_heads, D = s->head_dim;
    const int G = NQ / H;
    const double tau = p->tau > 0 ? p->tau : 1.0 / sqrt((double)D), c = p->rr_c > 0 ? p->rr_c : 60.0;
    size_t box = (size_t)L * (size_t)H * (size_t)D, nbs = nb > 0 ? (size_t)nb : 1;
    float *mn = malloc(box * sizeof(float) * nbs), *mx = malloc(box * sizeof(float) * nbs);
    for (int b = 0; b < nb; b++) kvmem_agent_block_aabb(ag, b, mn + (size_t)b * box, mx + (size_t)b * box);
    double *I = malloc(sizeof(double) * nbs);
    double *pr = malloc(sizeof(double) * nbs * (size_t)n_q);
    for (int b = 0; b < nb; b++) S[b] = cand[b] ? 0.0 : NAN;
    for (int l = 0; l < L; l++) {
        if (layer >= 0 && l != layer) continue;
        for (int hq = 0; hq < NQ; hq++) {
            int g = hq / G;
            for (int t = 0; t < n_q; t++) {
                const float *qr = q + (((size_t)t * (size_t)L + (size_t)l) * (size_t)NQ + (size_t)hq) * (size_t)D;
                for (int b = 0; b < nb; b++) {
                    if (!cand[b]) continue;
                    double v = 0;
                    if (p->mode == KVMEM_RETRIEVE_AABB) {
                        const float *lo = mn + (size_t)b * box + ((size_t)l * (size_t)H + (size_t)g) * (size_t)D;
                        const float *hi = mx + (size_t)b * box + ((size_t)l * (size_t)H + (size_t)g) * (size_t)D;
                        for (int d = 0; d < D; d++) v += fmax((double)qr[d] * hi[d], (double)qr[d] * lo[d]);
                    } else {
                        kvmem_block_info bi;
                        kvmem_agent_block_info(ag, b, &bi);
                        float *k = malloc(sizeof(float) * (size_t)L * (size_t)bi.n_tokens * (size_t)H * (size_t)D);
                        int64_t sh[4] = {L, bi.n_tokens, H, D};
                        kvmem_tensor kt;
                        kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh);
                        kvmem_agent_read(ag, bi.first_token, bi.n_tokens, &kt, NULL);
                        v = -INFINITY;
                        for (int i = 0; i < bi.n_tokens; i++) {
                            const float *kr = k + (((size_t)l * (size_t)bi.n_tokens + (size_t)i) * (size_t)H + (size_t)g) * (size_t)D;
                            double dot = 0;
                            for (int d = 0; d < D; d++) dot += (double)qr[d] * kr[d];
                            v = fmax(v, dot);
                        }
                        free(k);
                    }
                    I[b] = v;
                }
                /* normalise over candidates */
                if (p->norm == KVMEM_NORM_SOFTMAX) {
                    double m = -INFINITY, z = 0;
                    for (int b = 0; b < nb; b++)
                        if (cand[b]) m = fmax(m, I[b]);
                    for (int b = 0; b < nb; b++)
                        if (cand[b]) z += exp(tau * (I[b] - m));
                    for (int b = 0; b < nb; b++)
                        if (cand[b]) pr[(size_t)t * (size_t)nb + (size_t)b] = exp(tau * (I[b] - m)) / z;
                } else {
                    for (int b = 0; b < nb; b++) {
                        if (!cand[b]) continue;
                        int rank = 1; /* 1 + candidates ranked ahead: larger, or equal and older */
                        for (int o = 0; o < nb; o++)
                            if (cand[o] && (I[o] > I[b] || (I[o] == I[b] && o < b))) rank++;
                        pr[(size_t)t * (size_t)nb + (size_t)b] = 1.0 / (rank + c);
                    }
                }
            }
            for (int b = 0; b < nb; b++) {
                if (!cand[b]) continue;
                double a = p->agg == KVMEM_AGG_MAX ? -INFINITY : 0.0;
                for (int t = 0; t < n_q; t++) {
                    double v = pr[(size_t)t * (size_t)nb + (size_t)b];
                    a = p->agg == KVMEM_AGG_MAX ? fmax(a, v) : a + v;
                }
                S[b] += a;
            }
        }
    }
    free(mn);
    free(mx);
    free(I);
    free(pr);
}

/* Reference selection: forced blocks plus the top (k - forced) others by S,
 * ties toward the older block; returned ascending. Returns the count. */
static int ref_select(const double *S, int nb, const unsigned char *forced, int k, int *out) {
    int n = 0, nf = 0;
    for (int b = 0; b < nb; b++)
        if (forced[b]) out[n++] = b, nf++;
    int want = k - nf;
    unsigned char *taken = calloc(nb > 0 ? (size_t)nb + 1 : 1, 1);
    for (int i = 0; i < want; i++) {
        int best = -1;
        for (int b = 0; b < nb; b++) {
            if (forced[b] || taken[b] || isnan(S[b])) continue;
            if (best < 0 || S[b] > S[best]) best = b;
        }
        if (best < 0) break;
        taken[best] = 1;
        out[n++] = best;
    }
    free(taken);
    /* ascending */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
            int t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return n;
}

#endif
