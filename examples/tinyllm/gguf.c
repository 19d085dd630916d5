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

/* Where the tokenizer's metadata values start (0: absent). */
typedef struct gguf_vocab_at {
    size_t model, tokens, scores, types, add_prefix, bos, eos, unk;
    uint32_t bos_type, eos_type, unk_type;
} gguf_vocab_at;

/* An array value at `at`: element type and count, r positioned at the first element. */
static int vocab_array(rd *r, size_t at, uint32_t want_type, uint64_t want_n, const char *what) {
    r->off = at;
    uint32_t et = (uint32_t)rd_uint(r, 4, what);
    uint64_t n = rd_uint(r, 8, what);
    if (r->failed) return -1;
    if (et != want_type)
        return tl_errf(r->err, r->err_size, "tokenizer.ggml.%s holds values of type %u, expected %u",
                       what, et, want_type);
    if (n != want_n)
        return tl_errf(r->err, r->err_size, "tokenizer.ggml.%s has %llu entries, the vocabulary %llu",
                       what, (unsigned long long)n, (unsigned long long)want_n);
    return 0;
}

static int vocab_id(rd *r, size_t at, uint32_t type, int32_t dflt, int32_t *out) {
    double v = dflt;
    if (at) {
        r->off = at;
        if (rd_number(r, type, &v)) return -1;
    }
    /* -1 is how some converters say "none" */
    *out = v >= -1 && v < (double)INT32_MAX && v == floor(v) ? (int32_t)v : INT32_MAX;
    return 0;
}

/* Build m->vocab from the tokenizer a GGUF file carries (sentencepiece
 * "llama" vocabularies). A vocabulary that cannot be used leaves the model
 * loaded and says why in m->vocab_note, for tl_tokenizer_from_model. */
static void gguf_vocab(const uint8_t *buf, size_t size, const gguf_vocab_at *at, tl_model *m) {
    char *note = m->vocab_note;
    size_t ns = sizeof m->vocab_note;
    rd r = {buf, size, 0, note, ns, 0};
    if (!at->tokens) {
        tl_errf(note, ns, "the GGUF file carries no vocabulary (no tokenizer.ggml.tokens): give a "
                "tokenizer file");
        return;
    }
    if (at->model) {
        const char *s;
        size_t n;
        r.off = at->model;
        if (rd_str(&r, &s, &n, 64, "tokenizer model")) return;
        if (n != 5 || memcmp(s, "llama", 5) != 0) {
            tl_errf(note, ns, "tokenizer.ggml.model is '%.*s': only 'llama' (sentencepiece BPE) is "
                    "supported", (int)n, s);
            return;
        }
    }
    if (!at->scores) {
        tl_errf(note, ns, "the GGUF vocabulary has no tokenizer.ggml.scores: cannot merge pieces");
        return;
    }
    uint64_t V = (uint64_t)m->cfg.vocab_size;
    int32_t bos, eos, unk;
    if (vocab_id(&r, at->bos, at->bos_type, 1, &bos) || vocab_id(&r, at->eos, at->eos_type, 2, &eos) ||
        vocab_id(&r, at->unk, at->unk_type, 0, &unk))
        return;
    int add_prefix = 1;
    if (at->add_prefix) {
        r.off = at->add_prefix;
        add_prefix = rd_uint(&r, 1, "add_space_prefix") != 0;
    }
    /* the pieces' total size, then the pieces */
    if (vocab_array(&r, at->tokens, GT_STR, V, "tokens")) return;
    size_t bytes = 0;
    for (uint64_t i = 0; i < V; i++) {
        const char *s;
        size_t n;
        if (rd_str(&r, &s, &n, GGUF_MAX_NAME, "token")) return;
        bytes += n;
    }
    tl_tokenizer *t = tl_tok_alloc((int32_t)V, bytes);
    if (!t) {
        tl_errf(note, ns, "tokenizer: out of memory");
        return;
    }
    size_t p_tok = 0, p_score = 0, p_type = 0;
    if (vocab_array(&r, at->scores, GT_F32, V, "scores")) goto fail;
    p_score = r.off;
    if (at->types) {
        if (vocab_array(&r, at->types, GT_I32, V, "token_type")) goto fail;
        p_type = r.off;
    }
    vocab_array(&r, at->tokens, GT_STR, V, "tokens");
    p_tok = r.off;
    for (uint64_t i = 0; i < V; i++) {
        const char *s;
        size_t n;
        r.off = p_tok;
        rd_str(&r, &s, &n, GGUF_MAX_NAME, "token");
        p_tok = r.off;
        r.off = p_score + 4 * i;
        uint32_t b = (uint32_t)rd_uint(&r, 4, "score");
        float score;
        memcpy(&score, &b, 4);
        int type;
        if (p_type) {
            r.off = p_type + 4 * i;
            int32_t tt = (int32_t)(uint32_t)rd_uint(&r, 4, "token type");
            if (tt < TL_TOKEN_NORMAL || tt > TL_TOKEN_BYTE) {
                tl_errf(note, ns, "token %llu has token type %d (1..6)", (unsigned long long)i, tt);
                goto fail;
            }
            type = tt;
        } else {
            int32_t id = (int32_t)i;
            type = id == unk ? TL_TOKEN_UNKNOWN : id == bos || id == eos ? TL_TOKEN_CONTROL
                 : tl_tok_byte_value(s, n) >= 0 ? TL_TOKEN_BYTE : TL_TOKEN_NORMAL;
        }
        if (r.failed || tl_tok_set(t, (int32_t)i, s, n, score, type, 1)) goto fail;
    }
    if (bos == INT32_MAX || eos == INT32_MAX || unk == INT32_MAX) {
        tl_errf(note, ns, "tokenizer.ggml special token ids are out of range");
        goto fail;
    }
    tl_tok_specials(t, bos, eos, unk, add_prefix);
    char why[TL_ERR_SIZE];
    if (tl_tok_finish(t, why, sizeof why)) {
        tl_errf(note, ns, "the GGUF vocabulary: %s", why);
        goto fail;
    }
    m->vocab = t;
    return;
fail:
    if (!note[0]) tl_errf(note, ns, "the GGUF vocabulary is malformed");
    tl_tokenizer_free(t);
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
    gguf_vocab_at tv = {0};
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
            tv.tokens = save;
            r.off = save;
            if (skip_value(&r, type, 0)) return -1;
            continue;
        }
        if (strncmp(k, "tokenizer.ggml.", 15) == 0) { /* the rest of the vocabulary: read after the model */
            const char *tk = k + 15;
            size_t save = r.off;
            if (!strcmp(tk, "model") && type == GT_STR) tv.model = save;
            else if (!strcmp(tk, "scores") && type == GT_ARR) tv.scores = save;
            else if (!strcmp(tk, "token_type") && type == GT_ARR) tv.types = save;
            else if (!strcmp(tk, "add_space_prefix") && type == GT_BOOL) tv.add_prefix = save;
            else if (!strcmp(tk, "bos_token_id") && type != GT_ARR && type != GT_STR) tv.bos = save, tv.bos_type = type;
            else if (!strcmp(tk, "eos_token_id") && type != GT_ARR && type != GT_STR) tv.eos = save, tv.eos_type = type;
            else if (!strcmp(tk, "unknown_token_id") && type != GT_ARR && type != GT_STR) tv.unk = save, tv.unk_type = type;
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
    gguf_vocab(buf, size, &tv, m);
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
