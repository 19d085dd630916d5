/* tinyllm: the transformer forward pass over a KV working set. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct tl_state {
    int32_t max_chunk;
    int32_t past_window; /* 1: attention may span more than the trained window */
    float *x, *xb, *q, *k, *v, *att_out, *hb, *hb2, *att, *tmp;
    int32_t *pos;
    size_t att_cap;
    char err[TL_ERR_SIZE]; /* why the last tl_forward failed */
};

tl_state *tl_state_create(const tl_config *c, int32_t max_chunk) {
    if (max_chunk < 1) return NULL;
    tl_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    size_t n = (size_t)max_chunk, d = (size_t)c->dim, kvd = (size_t)c->head_dim * (size_t)c->n_kv_heads;
    s->max_chunk = max_chunk;
    s->x = malloc(n * d * sizeof(float));
    s->xb = malloc(n * d * sizeof(float));
    s->q = malloc(n * d * sizeof(float));
    s->k = malloc(n * kvd * sizeof(float));
    s->v = malloc(n * kvd * sizeof(float));
    s->att_out = malloc(n * d * sizeof(float));
    s->hb = malloc(n * (size_t)c->hidden_dim * sizeof(float));
    s->hb2 = malloc(n * (size_t)c->hidden_dim * sizeof(float));
    s->tmp = malloc(n * d * sizeof(float));
    s->pos = malloc(n * sizeof(int32_t));
    if (!s->x || !s->xb || !s->q || !s->k || !s->v || !s->att_out || !s->hb || !s->hb2 || !s->tmp ||
        !s->pos) {
        tl_state_free(s);
        return NULL;
    }
    return s;
}

void tl_state_free(tl_state *s) {
    if (!s) return;
    free(s->x);
    free(s->xb);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att_out);
    free(s->hb);
    free(s->hb2);
    free(s->att);
    free(s->tmp);
    free(s->pos);
    free(s);
}

int tl_kv_init(tl_kv *kv, const tl_config *c, int32_t cap) {
    memset(kv, 0, sizeof *kv);
    if (cap < 1) return -1;
    kv->n_layers = c->n_layers;
    kv->kv_dim = c->head_dim * c->n_kv_heads;
    kv->cap = cap;
    size_t n = (size_t)c->n_layers * (size_t)cap * (size_t)kv->kv_dim;
    kv->k = malloc(n * sizeof(float));
    kv->v = malloc(n * sizeof(float));
    kv->pos = malloc((size_t)cap * sizeof(int32_t));
    if (!kv->k || !kv->v || !kv->pos) {
        tl_kv_free(kv);
        return -1;
    }
    return 0;
}

void tl_kv_free(tl_kv *kv) {
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv->pos);
    memset(kv, 0, sizeof *kv);
}

int tl_kv_append(tl_kv *kv, const float *k, const float *v, int32_t T, const int32_t *pos) {
    if (T < 0 || T > kv->cap - kv->n) return -1;
    size_t kvd = (size_t)kv->kv_dim;
    for (int32_t l = 0; l < kv->n_layers; l++) {
        size_t dst = ((size_t)l * (size_t)kv->cap + (size_t)kv->n) * kvd;
        size_t src = (size_t)l * (size_t)T * kvd;
        memcpy(kv->k + dst, k + src, (size_t)T * kvd * sizeof(float));
        memcpy(kv->v + dst, v + src, (size_t)T * kvd * sizeof(float));
    }
    memcpy(kv->pos + kv->n, pos, (size_t)T * sizeof(int32_t));
    kv->n += T;
    return 0;
}

static void rmsnorm(float *o, const float *x, const float *w, int32_t n, float eps) {
    double ss = 0.0;
    for (int32_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int32_t i = 0; i < n; i++) o[i] = w[i] * (x[i] * r);
}

static float dot(const float *w, const float *x, int32_t in) {
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    int32_t i = 0;
    for (; i + 4 <= in; i += 4) {
        a0 += w[i] * x[i];
        a1 += w[i + 1] * x[i + 1];
        a2 += w[i + 2] * x[i + 2];
        a3 += w[i + 3] * x[i + 3];
    }
    for (; i < in; i++) a0 += w[i] * x[i];
    return (a0 + a1) + (a2 + a3);
}

/* o[t][out] = W[out][in] . x[t][in] for the n tokens of a chunk (rows of x
 * and o `in` and `out` floats apart). Each weight row is read once for the
 * whole chunk: a prefill streams the weights once, not once per token. The
 * sum per output is the same as one token alone, so results do not depend
 * on how a sequence is cut into chunks. */
static void matmul(float *o, const float *x, const float *W, int32_t n, int32_t in, int32_t out) {
    enum { TILE = 64 }; /* output rows whose weights stay in cache across the tokens */
    for (int32_t r0 = 0; r0 < out; r0 += TILE) {
        int32_t r1 = r0 + TILE < out ? r0 + TILE : out;
        for (int32_t t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * (size_t)in;
            float *ot = o + (size_t)t * (size_t)out;
            for (int32_t r = r0; r < r1; r++) ot[r] = dot(W + (size_t)r * (size_t)in, xt, in);
        }
    }
}

static int rope(const tl_model *m, float *x, int32_t n, int32_t heads, const int32_t *pos,
                kvmem_model_spec *spec) {
    /* kvmem_rope_apply takes one position per row: expand positions per head */
    int32_t *p = malloc((size_t)n * (size_t)heads * sizeof(int32_t));
    if (!p) return -1;
    for (int32_t i = 0; i < n; i++)
        for (int32_t h = 0; h < heads; h++) p[i * heads + h] = pos[i];
    kvmem_status st = kvmem_rope_apply(spec, x, (size_t)n * (size_t)heads,
                                       (size_t)m->cfg.head_dim, p, 0);
    free(p);
    return st == KVMEM_OK ? 0 : -1;
}

static int attend_exact(const tl_model *m, tl_state *s, const tl_kv *kv, int32_t l, int32_t n,
                        int32_t base, tl_trace *trace, int64_t *rows_read) {
    const tl_config *c = &m->cfg;
    int32_t hd = c->head_dim, G = c->n_heads / c->n_kv_heads, kvd = kv->kv_dim;
    size_t need = (size_t)kv->n;
    if (s->att_cap < need) {
        float *a = realloc(s->att, need * sizeof(float));
        if (!a) return -1;
        s->att = a;
        s->att_cap = need;
    }
    const float *K = kv->k + (size_t)l * (size_t)kv->cap * (size_t)kvd;
    const float *V = kv->v + (size_t)l * (size_t)kv->cap * (size_t)kvd;
    float scale = 1.0f / sqrtf((float)hd);
    for (int32_t i = 0; i < n; i++) {
        int32_t T = base + i + 1; /* rows visible to chunk token i */
        if (rows_read) *rows_read += (int64_t)T * c->n_kv_heads;
        for (int32_t h = 0; h < c->n_heads; h++) {
            const float *q = s->q + (size_t)i * (size_t)c->dim + (size_t)h * (size_t)hd;
            int32_t kh = h / G;
            float mx = -INFINITY;
            for (int32_t j = 0; j < T; j++) {
                const float *k = K + (size_t)j * (size_t)kvd + (size_t)kh * (size_t)hd;
                float d = 0;
                for (int32_t e = 0; e < hd; e++) d += q[e] * k[e];
                s->att[j] = d * scale;
                if (s->att[j] > mx) mx = s->att[j];
            }
            float sum = 0;
            for (int32_t j = 0; j < T; j++) {
                s->att[j] = expf(s->att[j] - mx);
                sum += s->att[j];
            }
            float inv = 1.0f / sum;
            float *o = s->att_out + (size_t)i * (size_t)c->dim + (size_t)h * (size_t)hd;
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int32_t j = 0; j < T; j++) {
                float a = s->att[j] * inv;
                const float *v = V + (size_t)j * (size_t)kvd + (size_t)kh * (size_t)hd;
                for (int32_t e = 0; e < hd; e++) o[e] += a * v[e];
                if (trace && trace->attn_acc) trace->attn_acc[j] += a;
            }
        }
    }
    return 0;
}

#ifdef TINYLLM_HAVE_ATTEND
static int attend_art(const tl_model *m, tl_state *s, const tl_kv *kv, int32_t l, int32_t n,
                      int32_t base, tl_art *art, int64_t *rows_read) {
    const tl_config *c = &m->cfg;
    int32_t hd = c->head_dim, kvd = kv->kv_dim;
    for (int32_t r0 = 0; r0 < n; r0 += KVMEM_ATTEND_MAX_ROWS) {
        int32_t r1 = r0 + KVMEM_ATTEND_MAX_ROWS < n ? r0 + KVMEM_ATTEND_MAX_ROWS : n;
        int64_t T = base + r1;
        kvmem_tensor q, o, k, v;
        int64_t qs[3] = {r1 - r0, c->n_heads, hd}, ks[3] = {T, c->n_kv_heads, hd};
        kvmem_tensor_init(&q, s->q + (size_t)r0 * (size_t)c->dim, KVMEM_F32, 3, qs);
        kvmem_tensor_init(&o, s->att_out + (size_t)r0 * (size_t)c->dim, KVMEM_F32, 3, qs);
        kvmem_tensor_init(&k, kv->k + (size_t)l * (size_t)kv->cap * (size_t)kvd, KVMEM_F32, 3, ks);
        kvmem_tensor_init(&v, kv->v + (size_t)l * (size_t)kv->cap * (size_t)kvd, KVMEM_F32, 3, ks);
        kvmem_attend_source src;
        memset(&src, 0, sizeof src);
        src.kind = KVMEM_ATTEND_SRC_TENSORS;
        src.k = &k;
        src.v = &v;
        kvmem_attend_params p = art->params;
        p.causal = 1;
        kvmem_attend_stats st;
        if (kvmem_attend(art->ctx, &q, &src, &p, &o, &st) != KVMEM_OK) return -1;
        art->tiles_total += st.tiles_total;
        art->tiles_visited += st.tiles_visited;
        art->positions_read += st.positions_read;
        if (rows_read) *rows_read += st.positions_read;
    }
    return 0;
}
#endif

void tl_state_allow_past_window(tl_state *s, int allow) {
    if (s) s->past_window = allow != 0;
}

const char *tl_state_error(const tl_state *s) { return s ? s->err : "no state"; }

int32_t tl_state_max_chunk(const tl_state *s) { return s ? s->max_chunk : 0; }

/* The working set after the chunk must fit the trained window: no more rows
 * than seq_len, and no query further from a key than seq_len - 1 positions
 * (RoPE sees only the distance). Past that the model was never trained. */
static int window_check(const tl_model *m, tl_state *s, const tl_kv *kv, int32_t n, const int32_t *positions) {
    int32_t W = m->cfg.seq_len, rows = kv->n + n;
    int64_t lo = positions[0], hi = positions[0];
    for (int32_t i = 0; i < kv->n; i++) {
        if (kv->pos[i] < lo) lo = kv->pos[i];
        if (kv->pos[i] > hi) hi = kv->pos[i];
    }
    for (int32_t i = 1; i < n; i++) {
        if (positions[i] < lo) lo = positions[i];
        if (positions[i] > hi) hi = positions[i];
    }
    if (rows <= W && hi - lo < W) return 0;
    return tl_errf(s->err, sizeof s->err,
                   "attention past the model's trained window: %d rows at positions %lld..%lld, the model "
                   "was trained on %d (tl_state_allow_past_window, or --past-window, to run it anyway)",
                   rows, (long long)lo, (long long)hi, W);
}

int tl_forward(const tl_model *m, tl_state *s, tl_kv *kv, const int32_t *tokens, int32_t n,
               const int32_t *positions, float *logits, tl_trace *trace, tl_art *art,
               int64_t *kv_rows_read) {
    const tl_config *c = &m->cfg;
    const tl_weights *w = &m->w;
    s->err[0] = '\0';
    if (n < 1 || n > s->max_chunk)
        return tl_errf(s->err, sizeof s->err, "chunk of %d tokens: the state takes 1..%d", n, s->max_chunk);
    if (kv->n + n > kv->cap)
        return tl_errf(s->err, sizeof s->err, "working set full: %d rows + %d > %d", kv->n, n, kv->cap);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size || positions[i] < 0)
            return tl_errf(s->err, sizeof s->err, "token %d (id %d, position %d) out of range", i, tokens[i],
                           positions[i]);
    if (!s->past_window && window_check(m, s, kv, n, positions)) return -1;
#ifndef TINYLLM_HAVE_ATTEND
    if (art) return tl_errf(s->err, sizeof s->err, "ART is not in this build");
#endif
    int32_t d = c->dim, kvd = kv->kv_dim, L = c->n_layers, H = c->hidden_dim;
    kvmem_model_spec spec = tl_model_spec(m);
    int32_t base = kv->n;
    for (int32_t i = 0; i < n; i++)
        memcpy(s->x + (size_t)i * d, w->tok_emb + (size_t)tokens[i] * d, (size_t)d * sizeof(float));
    memcpy(kv->pos + base, positions, (size_t)n * sizeof(int32_t));

    for (int32_t l = 0; l < L; l++) {
        for (int32_t i = 0; i < n; i++)
            rmsnorm(s->xb + (size_t)i * d, s->x + (size_t)i * d, w->rms_att + (size_t)l * d, d, c->norm_eps);
        matmul(s->q, s->xb, w->wq + (size_t)l * d * d, n, d, d);
        matmul(s->k, s->xb, w->wk + (size_t)l * kvd * d, n, d, kvd);
        matmul(s->v, s->xb, w->wv + (size_t)l * kvd * d, n, d, kvd);
        if (trace && trace->q_raw)
            for (int32_t i = 0; i < n; i++)
                memcpy(trace->q_raw + ((size_t)i * L + l) * d, s->q + (size_t)i * d, (size_t)d * sizeof(float));
        if (rope(m, s->q, n, c->n_heads, positions, &spec) || rope(m, s->k, n, c->n_kv_heads, positions, &spec))
            return tl_errf(s->err, sizeof s->err, "rope: %s", kvmem_last_error());
        if (trace && trace->q_rot)
            for (int32_t i = 0; i < n; i++)
                memcpy(trace->q_rot + ((size_t)i * L + l) * d, s->q + (size_t)i * d, (size_t)d * sizeof(float));
        size_t off = ((size_t)l * (size_t)kv->cap + (size_t)base) * (size_t)kvd;
        memcpy(kv->k + off, s->k, (size_t)n * kvd * sizeof(float));
        memcpy(kv->v + off, s->v, (size_t)n * kvd * sizeof(float));
        if (trace && trace->k_rot)
            memcpy(trace->k_rot + (size_t)l * n * kvd, s->k, (size_t)n * kvd * sizeof(float));
        if (trace && trace->v_out)
            memcpy(trace->v_out + (size_t)l * n * kvd, s->v, (size_t)n * kvd * sizeof(float));
        kv->n = base + n; /* the chunk's rows are visible (causally) from here */
        int rc;
#ifdef TINYLLM_HAVE_ATTEND
        if (art)
            rc = attend_art(m, s, kv, l, n, base, art, kv_rows_read);
        else
#endif
            rc = attend_exact(m, s, kv, l, n, base, trace, kv_rows_read);
        kv->n = base;
        if (rc)
            return tl_errf(s->err, sizeof s->err, "attention failed%s%s", art ? ": " : " (out of memory)",
                           art ? kvmem_last_error() : "");
        matmul(s->tmp, s->att_out, w->wo + (size_t)l * d * d, n, d, d);
        for (size_t e = 0; e < (size_t)n * (size_t)d; e++) s->x[e] += s->tmp[e];
        for (int32_t i = 0; i < n; i++)
            rmsnorm(s->xb + (size_t)i * d, s->x + (size_t)i * d, w->rms_ffn + (size_t)l * d, d, c->norm_eps);
        matmul(s->hb, s->xb, w->w1 + (size_t)l * H * d, n, d, H);
        matmul(s->hb2, s->xb, w->w3 + (size_t)l * H * d, n, d, H);
        for (size_t e = 0; e < (size_t)n * (size_t)H; e++) {
            float g = s->hb[e];
            s->hb[e] = g / (1.0f + expf(-g)) * s->hb2[e];
        }
        matmul(s->tmp, s->hb, w->w2 + (size_t)l * d * H, n, H, d);
        for (size_t e = 0; e < (size_t)n * (size_t)d; e++) s->x[e] += s->tmp[e];
    }
    kv->n = base + n;
    if (logits) {
        for (int32_t i = 0; i < n; i++)
            rmsnorm(s->xb + (size_t)i * d, s->x + (size_t)i * d, w->rms_final, d, c->norm_eps);
        matmul(logits, s->xb, w->wcls, n, d, c->vocab_size);
    }
    return 0;
}

int tl_sample_sequence(const tl_model *m, uint64_t seed, float temp, int32_t n, int32_t *out) {
    if (n < 1) return -1;
    tl_state *s = tl_state_create(&m->cfg, 1);
    tl_kv kv;
    float *logits = malloc((size_t)m->cfg.vocab_size * sizeof(float));
    int rc = 0;
    if (!s || !logits || tl_kv_init(&kv, &m->cfg, n)) {
        tl_state_free(s);
        free(logits);
        return -1;
    }
    uint64_t rng = seed;
    out[0] = 1; /* BOS in llama2.c's tokenizer */
    for (int32_t i = 0; i + 1 < n && !rc; i++) {
        rc = tl_forward(m, s, &kv, &out[i], 1, &i, logits, NULL, NULL, NULL);
        if (!rc) out[i + 1] = tl_sample(logits, m->cfg.vocab_size, temp, &rng);
    }
    tl_kv_free(&kv);
    tl_state_free(s);
    free(logits);
    return rc;
}
