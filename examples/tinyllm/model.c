/* tinyllm: model loading (llama2.c checkpoints), shared helpers. */
#include "tinyllm.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int tl_errf(char *err, size_t size, const char *fmt, ...) {
    if (err && size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, size, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int tl_read_file(const char *path, uint8_t **out, size_t *size, char *err, size_t err_size) {
    FILE *f = fopen(path, "rb");
    if (!f) return tl_errf(err, err_size, "%s: cannot open", path);
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return tl_errf(err, err_size, "%s: cannot seek", path);
    }
    long len = ftell(f);
    if (len < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return tl_errf(err, err_size, "%s: cannot size", path);
    }
    uint8_t *buf = malloc(len ? (size_t)len : 1);
    if (!buf) {
        fclose(f);
        return tl_errf(err, err_size, "%s: out of memory (%ld bytes)", path, len);
    }
    if (len && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        fclose(f);
        return tl_errf(err, err_size, "%s: short read", path);
    }
    fclose(f);
    *out = buf;
    *size = (size_t)len;
    return 0;
}

int tl_config_check(const tl_config *c, char *err, size_t err_size) {
    if (c->dim < 2 || c->dim > 65536 || c->hidden_dim < 1 || c->hidden_dim > 1 << 20 ||
        c->n_layers < 1 || c->n_layers > 1024 || c->n_heads < 1 || c->n_kv_heads < 1 ||
        c->vocab_size < 1 || c->vocab_size > 1 << 22 || c->seq_len < 1)
        return tl_errf(err, err_size, "model header out of range (dim %d hidden %d layers %d "
                       "heads %d kv heads %d vocab %d seq %d)", c->dim, c->hidden_dim,
                       c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len);
    if (c->dim % c->n_heads || c->n_heads % c->n_kv_heads)
        return tl_errf(err, err_size, "dim %d, %d heads, %d kv heads: not a valid GQA shape",
                       c->dim, c->n_heads, c->n_kv_heads);
    if ((c->dim / c->n_heads) % 2)
        return tl_errf(err, err_size, "head_dim %d is odd: RoPE needs pairs", c->dim / c->n_heads);
    if (!(c->rope_theta > 1.0f) || !(c->norm_eps > 0.0f))
        return tl_errf(err, err_size, "rope theta %g / norm eps %g out of range", c->rope_theta,
                       c->norm_eps);
    return 0;
}

size_t tl_n_weights(const tl_config *c, int shared_cls) {
    size_t d = (size_t)c->dim, h = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
    size_t kvd = d / (size_t)c->n_heads * (size_t)c->n_kv_heads;
    size_t n = (size_t)c->vocab_size * d + L * d + L * d * d + 2 * L * kvd * d + L * d * d +
               L * d + 3 * L * h * d + d;
    if (!shared_cls) n += (size_t)c->vocab_size * d;
    return n;
}

void tl_set_pointers(tl_model *m, int shared_cls) {
    const tl_config *c = &m->cfg;
    size_t d = (size_t)c->dim, h = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
    size_t kvd = d / (size_t)c->n_heads * (size_t)c->n_kv_heads;
    const float *p = m->data;
    m->w.tok_emb = p; p += (size_t)c->vocab_size * d;
    m->w.rms_att = p; p += L * d;
    m->w.wq = p; p += L * d * d;
    m->w.wk = p; p += L * kvd * d;
    m->w.wv = p; p += L * kvd * d;
    m->w.wo = p; p += L * d * d;
    m->w.rms_ffn = p; p += L * d;
    m->w.w1 = p; p += L * h * d;
    m->w.w2 = p; p += L * d * h;
    m->w.w3 = p; p += L * h * d;
    m->w.rms_final = p; p += d;
    m->w.wcls = shared_cls ? m->w.tok_emb : p;
}

int tl_model_load_llama2c(const char *path, tl_model *m, char *err, size_t err_size) {
    memset(m, 0, sizeof *m);
    uint8_t *buf;
    size_t size;
    if (tl_read_file(path, &buf, &size, err, err_size)) return -1;
    if (size < 28) {
        free(buf);
        return tl_errf(err, err_size, "%s: %zu bytes, too short for a llama2.c header", path, size);
    }
    int32_t h[7];
    memcpy(h, buf, sizeof h);
    tl_config c = {0};
    c.dim = h[0];
    c.hidden_dim = h[1];
    c.n_layers = h[2];
    c.n_heads = h[3];
    c.n_kv_heads = h[4];
    int shared = h[5] > 0; /* llama2.c: a negative vocab size means a separate classifier */
    c.vocab_size = h[5] > 0 ? h[5] : (h[5] == INT32_MIN ? 0 : -h[5]);
    c.seq_len = h[6];
    c.rope_theta = 10000.0f;
    c.norm_eps = 1e-5f;
    c.rope_style = KVMEM_ROPE_GPTJ;
    if (tl_config_check(&c, err, err_size)) {
        free(buf);
        return -1;
    }
    c.head_dim = c.dim / c.n_heads;
    size_t n = tl_n_weights(&c, 1);
    size_t n_cls = shared ? 0 : (size_t)c.vocab_size * (size_t)c.dim;
    /* after rms_final come the legacy freq_cis tables [seq_len][head_dim/2] x 2 */
    size_t n_freq = (size_t)c.seq_len * (size_t)c.head_dim;
    size_t need = 28 + 4 * (n + n_freq + n_cls);
    if (size < need) {
        free(buf);
        return tl_errf(err, err_size, "%s: %zu bytes, the header needs %zu: truncated or not "
                       "a llama2.c checkpoint", path, size, need);
    }
    m->n_data = n + n_cls;
    m->data = malloc(m->n_data * sizeof(float));
    if (!m->data) {
        free(buf);
        return tl_errf(err, err_size, "out of memory");
    }
    memcpy(m->data, buf + 28, n * sizeof(float));
    if (n_cls) memcpy(m->data + n, buf + 28 + 4 * (n + n_freq), n_cls * sizeof(float));
    free(buf);
    for (size_t i = 0; i < m->n_data; i++)
        if (!isfinite(m->data[i])) {
            tl_model_free(m);
            return tl_errf(err, err_size, "%s: weight %zu is not finite", path, i);
        }
    m->cfg = c;
    tl_set_pointers(m, shared);
    if (!shared) m->w.wcls = m->data + n;
    snprintf(m->format, sizeof m->format, "llama2c");
    return 0;
}

int tl_model_load(const char *path, tl_model *m, char *err, size_t err_size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        memset(m, 0, sizeof *m);
        return tl_errf(err, err_size, "%s: cannot open", path);
    }
    char magic[4] = {0};
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    if (got == 4 && memcmp(magic, "GGUF", 4) == 0) return tl_model_load_gguf(path, m, err, err_size);
    return tl_model_load_llama2c(path, m, err, err_size);
}

void tl_model_free(tl_model *m) {
    if (!m) return;
    free(m->data);
    memset(m, 0, sizeof *m);
}

kvmem_model_spec tl_model_spec(const tl_model *m) {
    kvmem_model_spec s = kvmem_model_spec_default();
    s.n_layers = m->cfg.n_layers;
    s.n_q_heads = m->cfg.n_heads;
    s.n_kv_heads = m->cfg.n_kv_heads;
    s.head_dim = m->cfg.head_dim;
    s.rotary_dim = m->cfg.head_dim;
    s.rope_style = (kvmem_rope_style)m->cfg.rope_style;
    s.rope_theta = m->cfg.rope_theta;
    snprintf(s.model_id, sizeof s.model_id, "tinyllm-%s-d%d-l%d", m->format, m->cfg.dim,
             m->cfg.n_layers);
    return s;
}

const char *tl_find_model(const char *fallback) {
    const char *env = getenv("KVMEM_TEST_MODEL");
    const char *p = env && *env ? env : fallback;
    if (!p) return NULL;
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fclose(f);
    return p;
}

uint64_t tl_rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int32_t tl_argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int32_t tl_sample(const float *logits, int32_t vocab, float temperature, uint64_t *rng) {
    if (temperature <= 0.0f) return tl_argmax(logits, vocab);
    double mx = logits[tl_argmax(logits, vocab)], sum = 0.0;
    for (int32_t i = 0; i < vocab; i++) sum += exp((logits[i] - mx) / temperature);
    double u = (double)(tl_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0) * sum, acc = 0.0;
    for (int32_t i = 0; i < vocab; i++) {
        acc += exp((logits[i] - mx) / temperature);
        if (u < acc) return i;
    }
    return vocab - 1;
}

double tl_kl_logits(const float *p_logits, const float *q_logits, int32_t vocab) {
    double mp = p_logits[tl_argmax(p_logits, vocab)], mq = q_logits[tl_argmax(q_logits, vocab)];
    double zp = 0.0, zq = 0.0;
    for (int32_t i = 0; i < vocab; i++) {
        zp += exp(p_logits[i] - mp);
        zq += exp(q_logits[i] - mq);
    }
    double lzp = log(zp) + mp, lzq = log(zq) + mq, kl = 0.0;
    for (int32_t i = 0; i < vocab; i++) {
        double lp = p_logits[i] - lzp, lq = q_logits[i] - lzq;
        kl += exp(lp) * (lp - lq);
    }
    return kl > 0.0 ? kl : 0.0;
}
