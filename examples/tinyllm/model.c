/* tinyllm: model loading (llama2.c checkpoints), shared helpers. */
#include "tinyllm.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    *out = NULL;
    *size = 0;
    if (!path) return tl_errf(err, err_size, "no file name");
    /* O_NONBLOCK: a FIFO must not block the open; it is refused just below */
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return tl_errf(err, err_size, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tl_errf(err, err_size, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tl_errf(err, err_size, "%s: %s", path, S_ISDIR(st.st_mode) ? "is a directory, not a file"
                       : "not a regular file (a FIFO, device or socket)");
    }
    if ((uintmax_t)st.st_size > (uintmax_t)SIZE_MAX - 1) {
        close(fd);
        return tl_errf(err, err_size, "%s: too large to read", path);
    }
    size_t len = (size_t)st.st_size;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        close(fd);
        return tl_errf(err, err_size, "%s: out of memory (%zu bytes)", path, len);
    }
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            free(buf);
            close(fd);
            return tl_errf(err, err_size, "%s: read failed after %zu of %zu bytes%s%s", path, got,
                           len, e ? ": " : " (the file shrank)", e ? strerror(e) : "");
        }
        got += (size_t)r;
    }
    close(fd);
    *out = buf;
    *size = len;
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

/* Read a llama2.c header and say whether the file is one: sizes in range
 * and exactly the bytes they describe (a legacy export: weights, then the
 * freq_cis tables, then the classifier when not shared). 0, or -1 with why. */
static int llama2c_probe(const uint8_t *buf, size_t size, tl_config *out, int *shared, size_t *n_main,
                         size_t *n_freq, size_t *n_cls, char *err, size_t err_size) {
    if (size < 28) return tl_errf(err, err_size, "%zu bytes, too short for a llama2.c header", size);
    int32_t h[7];
    memcpy(h, buf, sizeof h);
    tl_config c = {0};
    c.dim = h[0];
    c.hidden_dim = h[1];
    c.n_layers = h[2];
    c.n_heads = h[3];
    c.n_kv_heads = h[4];
    *shared = h[5] > 0; /* llama2.c: a negative vocab size means a separate classifier */
    c.vocab_size = h[5] > 0 ? h[5] : (h[5] == INT32_MIN ? 0 : -h[5]);
    c.seq_len = h[6];
    c.rope_theta = 10000.0f;
    c.norm_eps = 1e-5f;
    c.rope_style = KVMEM_ROPE_GPTJ;
    if (c.seq_len > 1 << 24)
        return tl_errf(err, err_size, "llama2.c header: seq_len %d out of range", c.seq_len);
    if (tl_config_check(&c, err, err_size)) return -1;
    c.head_dim = c.dim / c.n_heads;
    *n_main = tl_n_weights(&c, 1);
    *n_cls = *shared ? 0 : (size_t)c.vocab_size * (size_t)c.dim;
    *n_freq = (size_t)c.seq_len * (size_t)c.head_dim; /* freq_cis real + imag [seq_len][head_dim/2] */
    size_t need = 28 + 4 * (*n_main + *n_freq + *n_cls);
    if (size != need)
        return tl_errf(err, err_size, "its llama2.c header (dim %d, hidden %d, %d layers, %d/%d heads, "
                       "vocab %d, seq %d) describes a file of %zu bytes, the file has %zu: %s", c.dim,
                       c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len, need,
                       size, size < need ? "truncated" : "extra bytes at the end");
    *out = c;
    return 0;
}

/* The reason a buffer that is neither GGUF nor a llama2.c checkpoint is not,
 * for the formats people mistake for one. NULL when nothing is recognised. */
static const char *known_other_format(const uint8_t *buf, size_t size) {
    if (size >= 10) {
        uint64_t hl = 0;
        for (int i = 0; i < 8; i++) hl |= (uint64_t)buf[i] << (8 * i);
        if (hl >= 2 && hl <= size - 8 && buf[8] == '{')
            return "it is a safetensors file (8-byte length, JSON header), e.g. a kvmem agent's memory";
    }
    if (size >= 4 && memcmp(buf, "24ka", 4) == 0)
        return "it is a llama2.c version 1/2 export (magic \"ak42\"): tinyllm reads the legacy "
               "format (llama2.c export.py --version 0)";
    return NULL;
}

static int llama2c_from_buffer(const char *path, uint8_t *buf, size_t size, tl_model *m, char *err,
                               size_t err_size) {
    tl_config c = {0};
    int shared = 0;
    size_t n = 0, n_freq = 0, n_cls = 0;
    char why[TL_ERR_SIZE];
    if (llama2c_probe(buf, size, &c, &shared, &n, &n_freq, &n_cls, why, sizeof why)) {
        const char *other = known_other_format(buf, size);
        return tl_errf(err, err_size, "%s: not a llama2.c or GGUF file: %s", path, other ? other : why);
    }
    m->n_data = n + n_cls;
    m->data = malloc(m->n_data * sizeof(float));
    if (!m->data) {
        m->n_data = 0;
        return tl_errf(err, err_size, "%s: out of memory (%zu weights)", path, n + n_cls);
    }
    memcpy(m->data, buf + 28, n * sizeof(float));
    if (n_cls) memcpy(m->data + n, buf + 28 + 4 * (n + n_freq), n_cls * sizeof(float));
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

int tl_model_load_llama2c(const char *path, tl_model *m, char *err, size_t err_size) {
    memset(m, 0, sizeof *m);
    uint8_t *buf;
    size_t size;
    if (tl_read_file(path, &buf, &size, err, err_size)) return -1;
    int rc = llama2c_from_buffer(path, buf, size, m, err, err_size);
    free(buf);
    return rc;
}

int tl_model_load(const char *path, tl_model *m, char *err, size_t err_size) {
    memset(m, 0, sizeof *m);
    uint8_t *buf;
    size_t size;
    if (tl_read_file(path, &buf, &size, err, err_size)) return -1;
    int rc;
    if (size >= 4 && memcmp(buf, "GGUF", 4) == 0) {
        char why[TL_ERR_SIZE];
        rc = tl_model_load_gguf_buffer(buf, size, m, why, sizeof why);
        if (rc) tl_errf(err, err_size, "%s: %s", path, why);
    } else {
        rc = llama2c_from_buffer(path, buf, size, m, err, err_size);
    }
    free(buf);
    return rc;
}

void tl_model_free(tl_model *m) {
    if (!m) return;
    free(m->data);
    tl_tokenizer_free(m->vocab);
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
