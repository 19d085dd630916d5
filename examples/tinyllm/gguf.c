/* tinyllm: a small, strict GGUF reader for llama-architecture models with
 * F32/F16 tensors (GGUF v2/v3, little-endian). Every read is bounds
 * checked; a malformed or hostile file gets an error, never a crash. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { GT_U8, GT_I8, GT_U16, GT_I16, GT_U32, GT_I32, GT_F32, GT_BOOL, GT_STR, GT_ARR, GT_U64,
       GT_I64, GT_F64, GT_COUNT };
enum { GGML_F32 = 0, GGML_F16 = 1 };

#define GGUF_MAX_TENSORS 65536
#define GGUF_MAX_KV 65536
#define GGUF_MAX_NAME 4096

typedef struct rd {
    const uint8_t *p;
    size_t size, off;
    char *err;
    size_t err_size;
    int failed;
} rd;

static int need(rd *r, size_t n, const char *what) {
    if (r->failed) return -1;
    if (n > r->size - r->off) {
        r->failed = 1;
        return tl_errf(r->err, r->err_size, "gguf: truncated at byte %zu reading %s", r->off, what);
    }
    return 0;
}

static uint64_t rd_uint(rd *r, size_t n, const char *what) {
    if (need(r, n, what)) return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)r->p[r->off + i] << (8 * i);
    r->off += n;
    return v;
}

/* A string: u64 length, bytes (not NUL-terminated in the file). */
static int rd_str(rd *r, const char **s, size_t *len, size_t max, const char *what) {
    uint64_t n = rd_uint(r, 8, what);
    if (r->failed) return -1;
    if (n > max || need(r, (size_t)n, what)) {
        r->failed = 1;
        return tl_errf(r->err, r->err_size, "gguf: %s of %llu bytes at byte %zu is too long",
                       what, (unsigned long long)n, r->off);
    }
    *s = (const char *)r->p + r->off;
    *len = (size_t)n;
    r->off += (size_t)n;
    return 0;
}

static size_t type_size(uint32_t t) {
    static const size_t sz[GT_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < GT_COUNT ? sz[t] : 0;
}

static int skip_value(rd *r, uint32_t type, int depth) {
    if (type == GT_STR) {
        const char *s;
        size_t n;
        return rd_str(r, &s, &n, r->size, "string value");
    }
    if (type == GT_ARR) {
        if (depth > 2) {
            r->failed = 1;
            return tl_errf(r->err, r->err_size, "gguf: arrays nested too deeply");
        }
        uint32_t et = (uint32_t)rd_uint(r, 4, "array type");
        uint64_t n = rd_uint(r, 8, "array length");
        if (r->failed) return -1;
        if (et >= GT_COUNT) {
            r->failed = 1;
            return tl_errf(r->err, r->err_size, "gguf: array of unknown type %u", et);
        }
        if (et != GT_STR && et != GT_ARR) {
            size_t es = type_size(et);
            if (n > (r->size - r->off) / es) {
                r->failed = 1;
                return tl_errf(r->err, r->err_size, "gguf: array of %llu items overruns the file",
                               (unsigned long long)n);
            }
            r->off += (size_t)n * es;
            return 0;
        }
        for (uint64_t i = 0; i < n; i++)
            if (skip_value(r, et, depth + 1)) return -1;
        return 0;
    }
    if (type >= GT_COUNT) {
        r->failed = 1;
        return tl_errf(r->err, r->err_size, "gguf: value of unknown type %u", type);
    }
    return need(r, type_size(type), "value") ? -1 : (r->off += type_size(type), 0);
}

/* A scalar number value as double (integer or float types). */
static int rd_number(rd *r, uint32_t type, double *out) {
    switch (type) {
    case GT_U8: *out = (double)rd_uint(r, 1, "u8"); break;
    case GT_I8: *out = (double)(int8_t)rd_uint(r, 1, "i8"); break;
    case GT_U16: *out = (double)rd_uint(r, 2, "u16"); break;
    case GT_I16: *out = (double)(int16_t)rd_uint(r, 2, "i16"); break;
    case GT_U32: *out = (double)rd_uint(r, 4, "u32"); break;
    case GT_I32: *out = (double)(int32_t)rd_uint(r, 4, "i32"); break;
    case GT_U64: *out = (double)rd_uint(r, 8, "u64"); break;
    case GT_I64: *out = (double)(int64_t)rd_uint(r, 8, "i64"); break;
    case GT_F32: {
        uint32_t b = (uint32_t)rd_uint(r, 4, "f32");
        float f;
        memcpy(&f, &b, 4);
        *out = f;
        break;
    }
    case GT_F64: {
        uint64_t b = rd_uint(r, 8, "f64");
        double d;
        memcpy(&d, &b, 8);
        *out = d;
        break;
    }
    default:
        r->failed = 1;
        return tl_errf(r->err, r->err_size, "gguf: expected a number, got type %u", type);
    }
    return r->failed ? -1 : 0;
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
    float f;
    if (exp == 0) {
        f = ldexpf((float)man, -24); /* zero or subnormal */
        return sign ? -f : f;
    }
    uint32_t bits = exp == 31 ? sign | 0x7F800000u | (man << 13)
                              : sign | ((exp + 112) << 23) | (man << 13);
    memcpy(&f, &bits, 4);
    return f;
}

typedef struct tinfo {
    const char *name;
    size_t name_len;
    uint32_t n_dims;
    uint64_t dims[4];
    uint32_t type;
    uint64_t offset;
} tinfo;

static int name_eq(const tinfo *t, const char *s) {
    return strlen(s) == t->name_len && memcmp(t->name, s, t->name_len) == 0;
}

static const tinfo *find_tensor(const tinfo *ts, uint64_t n, const char *name) {
    for (uint64_t i = 0; i < n; i++)
        if (name_eq(&ts[i], name)) return &ts[i];
    return NULL;
}

/* Copy tensor `name` of shape [rows][cols] (GGUF dims {cols, rows}; a vector
 * has rows == 1 and one dim) into dst, checking type, shape and bounds. */
static int load_tensor(rd *r, const tinfo *ts, uint64_t nt, size_t data_start, const char *name,
                       uint64_t rows, uint64_t cols, float *dst) {
    const tinfo *t = find_tensor(ts, nt, name);
    if (!t) return tl_errf(r->err, r->err_size, "gguf: tensor %s is missing", name);
    int vec = rows == 1;
    if ((vec && !(t->n_dims == 1 && t->dims[0] == cols)) ||
        (!vec && !(t->n_dims == 2 && t->dims[0] == cols && t->dims[1] == rows)))
        return tl_errf(r->err, r->err_size, "gguf: tensor %s has the wrong shape (expected "
                       "[%llu][%llu])", name, (unsigned long long)rows, (unsigned long long)cols);
    if (t->type != GGML_F32 && t->type != GGML_F16)
        return tl_errf(r->err, r->err_size, "gguf: tensor %s has ggml type %u: only F32 (0) and "
                       "F16 (1) are supported", name, t->type);
    size_t n = (size_t)(rows * cols), es = t->type == GGML_F32 ? 4 : 2;
    if (t->offset > r->size - data_start || n > (r->size - data_start - t->offset) / es)
        return tl_errf(r->err, r->err_size, "gguf: tensor %s data lies outside the file", name);
    const uint8_t *p = r->p + data_start + t->offset;
    for (size_t i = 0; i < n; i++) {
        float f;
        if (es == 4) {
            uint32_t b = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
                         (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
            memcpy(&f, &b, 4);
        } else {
            f = half_to_float((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        }
        if (!isfinite(f)) return tl_errf(r->err, r->err_size, "gguf: tensor %s value %zu is not finite", name, i);
        dst[i] = f;
    }
    return 0;
}

int tl_model_load_gguf_buffer(const uint8_t *buf, size_t size, tl_model *m, char *err,
                              size_t err_size) {
    memset(m, 0, sizeof *m);
    rd r = {buf, size, 0, err, err_size, 0};
    if (!buf || size < 24 || memcmp(buf, "GGUF", 4) != 0)
        return tl_errf(err, err_size, "gguf: not a GGUF file (bad magic or shorter than a header)");
    r.off = 4;
    uint32_t version = (uint32_t)rd_uint(&r, 4, "version");
    if (version != 2 && version != 3)
        return tl_errf(err, err_size, "gguf: version %u is not supported (2 or 3)", version);
    uint64_t n_tensors = rd_uint(&r, 8, "tensor count"), n_kv = rd_uint(&r, 8, "kv count");
    if (n_tensors > GGUF_MAX_TENSORS || n_kv > GGUF_MAX_KV)
        return tl_errf(err, err_size, "gguf: %llu tensors / %llu keys: too many",
                       (unsigned long long)n_tensors, (unsigned long long)n_kv);

    /* metadata */
    char arch[64] = "";
    double dim = -1, hidden = -1, layers = -1, heads = -1, kv_heads = -1, ctx = 2048,
           theta = 10000.0, eps = 1e-5, rot = -1, align = 32, vocab = -1;
    for (uint64_t i = 0; i < n_kv; i++) {
        const char *key;
        size_t klen;
        if (rd_str(&r, &key, &klen, GGUF_MAX_NAME, "key")) return -1;
        uint32_t type = (uint32_t)rd_uint(&r, 4, "value type");
        if (r.failed) return -1;
        char k[GGUF_MAX_NAME + 1];
        memcpy(k, key, klen);
        k[klen] = 0;
        const char *suffix = NULL;
        if (strcmp(k, "general.architecture") == 0) {
            const char *s;
            size_t n;
            if (type != GT_STR) return tl_errf(err, err_size, "gguf: general.architecture is not a string");
            if (rd_str(&r, &s, &n, sizeof arch - 1, "architecture")) return -1;
            memcpy(arch, s, n);
            arch[n] = 0;
            continue;
        }
        if (strcmp(k, "general.alignment") == 0) {
            if (rd_number(&r, type, &align)) return -1;
            continue;
        }
        if (strcmp(k, "tokenizer.ggml.tokens") == 0 && type == GT_ARR) {
            /* the vocabulary size, when the file carries a tokenizer */
            size_t save = r.off;
            uint32_t et = (uint32_t)rd_uint(&r, 4, "array type");
            uint64_t n = rd_uint(&r, 8, "array length");
            if (r.failed) return -1;
            (void)et;
            vocab = (double)n;
            r.off = save;
            if (skip_value(&r, type, 0)) return -1;
            continue;
        }
        size_t alen = strlen(arch);
        if (alen && strncmp(k, arch, alen) == 0 && k[alen] == '.') suffix = k + alen + 1;
        double *dst = NULL;
        if (suffix) {
            if (!strcmp(suffix, "embedding_length")) dst = &dim;
            else if (!strcmp(suffix, "feed_forward_length")) dst = &hidden;
            else if (!strcmp(suffix, "block_count")) dst = &layers;
            else if (!strcmp(suffix, "attention.head_count")) dst = &heads;
            else if (!strcmp(suffix, "attention.head_count_kv")) dst = &kv_heads;
            else if (!strcmp(suffix, "context_length")) dst = &ctx;
            else if (!strcmp(suffix, "rope.freq_base")) dst = &theta;
            else if (!strcmp(suffix, "attention.layer_norm_rms_epsilon")) dst = &eps;
            else if (!strcmp(suffix, "rope.dimension_count")) dst = &rot;
            else if (!strcmp(suffix, "vocab_size")) dst = &vocab;
        }
        if (dst) {
            if (type == GT_ARR) return tl_errf(err, err_size, "gguf: %s is an array (per-layer "
                                               "values are not supported)", k);
            if (rd_number(&r, type, dst)) return -1;
        } else if (skip_value(&r, type, 0)) {
            return -1;
        }
    }
    if (strcmp(arch, "llama") != 0)
        return tl_errf(err, err_size, "gguf: architecture '%s' is not supported (llama only)", arch);
    if (dim < 0 || hidden < 0 || layers < 0 || heads < 0)
        return tl_errf(err, err_size, "gguf: llama.embedding_length, feed_forward_length, "
                       "block_count and attention.head_count are required");
    if (kv_heads < 0) kv_heads = heads;
    if (!(align >= 1 && align <= 65536) || ((uint64_t)align & ((uint64_t)align - 1)))
        return tl_errf(err, err_size, "gguf: alignment %g is not a power of two", align);

    /* tensor infos */
    tinfo *ts = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *ts);
    if (!ts) return tl_errf(err, err_size, "gguf: out of memory");
    for (uint64_t i = 0; i < n_tensors; i++) {
        tinfo *t = &ts[i];
        if (rd_str(&r, &t->name, &t->name_len, GGUF_MAX_NAME, "tensor name")) goto fail;
        t->n_dims = (uint32_t)rd_uint(&r, 4, "n_dims");
        if (r.failed) goto fail;
        if (t->n_dims < 1 || t->n_dims > 4) {
            tl_errf(err, err_size, "gguf: tensor %.*s has %u dims", (int)t->name_len, t->name, t->n_dims);
            goto fail;
        }
        for (uint32_t d = 0; d < t->n_dims; d++) t->dims[d] = rd_uint(&r, 8, "dim");
        t->type = (uint32_t)rd_uint(&r, 4, "tensor type");
        t->offset = rd_uint(&r, 8, "tensor offset");
        if (r.failed) goto fail;
        if (t->offset % (uint64_t)align) {
            tl_errf(err, err_size, "gguf: tensor %.*s offset %llu is not aligned to %g",
                    (int)t->name_len, t->name, (unsigned long long)t->offset, align);
            goto fail;
        }
        for (uint64_t j = 0; j < i; j++)
            if (ts[j].name_len == t->name_len && !memcmp(ts[j].name, t->name, t->name_len)) {
                tl_errf(err, err_size, "gguf: tensor %.*s appears twice", (int)t->name_len, t->name);
                goto fail;
            }
    }
    size_t data_start = (r.off + (size_t)align - 1) / (size_t)align * (size_t)align;
    if (data_start > size) {
        tl_errf(err, err_size, "gguf: no tensor data after the header");
        goto fail;
    }

    const tinfo *emb = find_tensor(ts, n_tensors, "token_embd.weight");
    if (!emb || emb->n_dims != 2) {
        tl_errf(err, err_size, "gguf: tensor token_embd.weight is missing or not 2-D");
        goto fail;
    }
    if (vocab < 0) vocab = (double)emb->dims[1];
    tl_config c = {0};
    if (dim > 65536 || hidden > (1 << 20) || layers > 1024 || heads > 4096 || kv_heads > 4096 ||
        vocab > (1 << 22) || ctx > (double)INT32_MAX) {
        tl_errf(err, err_size, "gguf: model size out of range");
        goto fail;
    }
    c.dim = (int32_t)dim;
    c.hidden_dim = (int32_t)hidden;
    c.n_layers = (int32_t)layers;
    c.n_heads = (int32_t)heads;
    c.n_kv_heads = (int32_t)kv_heads;
    c.vocab_size = (int32_t)vocab;
    c.seq_len = (int32_t)ctx;
    c.rope_theta = (float)theta;
    c.norm_eps = (float)eps;
    /* llama.cpp's converters permute Q/K so that "llama" uses consecutive pairs */
    c.rope_style = KVMEM_ROPE_GPTJ;
    if (tl_config_check(&c, err, err_size)) goto fail;
    c.head_dim = c.dim / c.n_heads;
    if (rot >= 0 && rot != c.head_dim) {
        tl_errf(err, err_size, "gguf: rope.dimension_count %g != head_dim %d (partial rotary "
                "is not supported)", rot, c.head_dim);
        goto fail;
    }
    int shared = find_tensor(ts, n_tensors, "output.weight") == NULL;
    m->cfg = c;
    m->n_data = tl_n_weights(&c, shared);
    /* every weight takes at least 2 bytes of the file: refuse before allocating */
    if (m->n_data > (size - data_start) / 2) {
        tl_errf(err, err_size, "gguf: the header describes %zu weights, more than the file holds", m->n_data);
        m->n_data = 0;
        goto fail;
    }
    m->data = malloc(m->n_data * sizeof(float));
    if (!m->data) {
        tl_errf(err, err_size, "gguf: out of memory");
        goto fail;
    }
    tl_set_pointers(m, shared);
    {
        uint64_t D = (uint64_t)c.dim, H = (uint64_t)c.hidden_dim, V = (uint64_t)c.vocab_size;
        uint64_t KVD = (uint64_t)c.head_dim * (uint64_t)c.n_kv_heads;
        float *w = m->data;
        if (load_tensor(&r, ts, n_tensors, data_start, "token_embd.weight", V, D, w)) goto fail;
        struct { const char *name; uint64_t rows, cols; const float *base; } per[] = {
            {"attn_norm", 1, D, m->w.rms_att},  {"attn_q", D, D, m->w.wq},
            {"attn_k", KVD, D, m->w.wk},        {"attn_v", KVD, D, m->w.wv},
            {"attn_output", D, D, m->w.wo},     {"ffn_norm", 1, D, m->w.rms_ffn},
            {"ffn_gate", H, D, m->w.w1},        {"ffn_down", D, H, m->w.w2},
            {"ffn_up", H, D, m->w.w3},
        };
        for (size_t t = 0; t < sizeof per / sizeof per[0]; t++)
            for (int32_t l = 0; l < c.n_layers; l++) {
                char name[64];
                snprintf(name, sizeof name, "blk.%d.%s.weight", l, per[t].name);
                float *dst = w + (per[t].base - m->data) + (size_t)l * per[t].rows * per[t].cols;
                if (load_tensor(&r, ts, n_tensors, data_start, name, per[t].rows, per[t].cols, dst))
                    goto fail;
            }
        if (load_tensor(&r, ts, n_tensors, data_start, "output_norm.weight", 1, D,
                        w + (m->w.rms_final - m->data)))
            goto fail;
        if (!shared && load_tensor(&r, ts, n_tensors, data_start, "output.weight", V, D,
                                   w + (m->w.wcls - m->data)))
            goto fail;
    }
    free(ts);
    snprintf(m->format, sizeof m->format, "gguf");
    return 0;
fail:
    free(ts);
    free(m->data);
    memset(m, 0, sizeof *m);
    return -1;
}

int tl_model_load_gguf(const char *path, tl_model *m, char *err, size_t err_size) {
    uint8_t *buf;
    size_t size;
    memset(m, 0, sizeof *m);
    if (tl_read_file(path, &buf, &size, err, err_size)) return -1;
    int rc = tl_model_load_gguf_buffer(buf, size, m, err, err_size);
    free(buf);
    return rc;
}
