/* tinyllm: text memory, the baseline of plain-text RAG agents. The
 * history's text is cut into chunks and ranked by Okapi BM25 against the new
 * text (beyond.h gives the exact formula); the chosen chunks' tokens are what
 * such an agent re-prefills. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "beyond.h"
#include "internal.h"

/* ---- words and an interning table ---- */

typedef struct term_table {
    char **words;    /* [cap] NULL = empty slot */
    int32_t *ids;    /* [cap] */
    int32_t cap, n;  /* cap a power of two */
} term_table;

static uint64_t hash_word(const char *w, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)w[i]) * 1099511628211ull;
    return h;
}

static int table_grow(term_table *t) {
    int32_t cap = t->cap ? t->cap * 2 : 256;
    char **words = calloc((size_t)cap, sizeof *words);
    int32_t *ids = calloc((size_t)cap, sizeof *ids);
    if (!words || !ids) {
        free(words);
        free(ids);
        return -1;
    }
    for (int32_t i = 0; i < t->cap; i++) {
        if (!t->words[i]) continue;
        size_t j = hash_word(t->words[i], strlen(t->words[i])) & (size_t)(cap - 1);
        while (words[j]) j = (j + 1) & (size_t)(cap - 1);
        words[j] = t->words[i];
        ids[j] = t->ids[i];
    }
    free(t->words);
    free(t->ids);
    t->words = words;
    t->ids = ids;
    t->cap = cap;
    return 0;
}

/* The slot of word w[0, n): where it is, or the empty slot it would take. */
static size_t table_slot(const term_table *t, const char *w, size_t n) {
    size_t j = hash_word(w, n) & (size_t)(t->cap - 1);
    while (t->words[j] && !(strlen(t->words[j]) == n && !memcmp(t->words[j], w, n))) j = (j + 1) & (size_t)(t->cap - 1);
    return j;
}

/* The id of word w[0, n) (lowercase), -1 when absent. */
static int32_t table_find(const term_table *t, const char *w, size_t n) {
    if (!t->cap) return -1;
    size_t j = table_slot(t, w, n);
    return t->words[j] ? t->ids[j] : -1;
}

/* The id of word w[0, n), interned if new; -1 when out of memory. */
static int32_t table_intern(term_table *t, const char *w, size_t n) {
    if ((t->n + 1) * 2 > t->cap && table_grow(t)) return -1;
    size_t j = table_slot(t, w, n);
    if (t->words[j]) return t->ids[j];
    char *c = malloc(n + 1);
    if (!c) return -1;
    memcpy(c, w, n);
    c[n] = '\0';
    t->words[j] = c;
    t->ids[j] = t->n;
    return t->n++;
}

static void table_free(term_table *t) {
    for (int32_t i = 0; i < t->cap; i++) free(t->words[i]);
    free(t->words);
    free(t->ids);
    memset(t, 0, sizeof *t);
}

/* Next word of s[*at, len): lowercase into buf (at most cap bytes kept). 0 at the end. */
static size_t next_word(const char *s, size_t len, size_t *at, char *buf, size_t cap) {
    size_t i = *at;
    while (i < len && !isalnum((unsigned char)s[i])) i++;
    size_t n = 0;
    while (i < len && isalnum((unsigned char)s[i])) {
        if (n < cap) buf[n++] = (char)tolower((unsigned char)s[i]);
        i++;
    }
    *at = i;
    return n;
}

/* ---- BM25 ---- */

typedef struct posting {
    int32_t term, tf;
} posting;

struct tl_bm25 {
    term_table terms;
    int32_t n_docs;
    int32_t *doc_len;   /* [n_docs] words */
    int32_t *post_at;   /* [n_docs + 1] into post */
    posting *post;      /* each document's distinct terms with counts */
    int32_t *df;        /* [terms] documents holding the term */
    double avgdl;
};

static int cmp_int32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

void tl_bm25_free(tl_bm25 *b) {
    if (!b) return;
    table_free(&b->terms);
    free(b->doc_len);
    free(b->post_at);
    free(b->post);
    free(b->df);
    free(b);
}

int tl_bm25_create(const char *const *docs, const size_t *lens, int32_t n, tl_bm25 **out) {
    *out = NULL;
    if (n < 0) return -1;
    tl_bm25 *b = calloc(1, sizeof *b);
    if (!b) return -1;
    b->n_docs = n;
    b->doc_len = calloc((size_t)n + 1, sizeof(int32_t));
    b->post_at = calloc((size_t)n + 1, sizeof(int32_t));
    size_t words_total = 0;
    for (int32_t d = 0; d < n; d++) words_total += lens[d] / 2 + 1; /* a word takes >= 2 bytes with its gap */
    b->post = malloc(words_total * sizeof(posting) + 1);
    int32_t *ids = malloc(words_total * sizeof(int32_t) + 1);
    if (!b->doc_len || !b->post_at || !b->post || !ids) goto fail;
    int32_t np = 0;
    double total = 0;
    char w[64];
    for (int32_t d = 0; d < n; d++) {
        size_t at = 0, wl;
        int32_t k = 0;
        while ((wl = next_word(docs[d], lens[d], &at, w, sizeof w)) > 0) {
            int32_t id = table_intern(&b->terms, w, wl);
            if (id < 0) goto fail;
            ids[k++] = id;
        }
        b->doc_len[d] = k;
        total += k;
        qsort(ids, (size_t)k, sizeof *ids, cmp_int32);
        b->post_at[d] = np;
        for (int32_t i = 0; i < k;) {
            int32_t j = i;
            while (j < k && ids[j] == ids[i]) j++;
            b->post[np].term = ids[i];
            b->post[np].tf = j - i;
            np++;
            i = j;
        }
    }
    b->post_at[n] = np;
    b->avgdl = n ? total / n : 0;
    b->df = calloc((size_t)b->terms.n + 1, sizeof(int32_t));
    if (!b->df) goto fail;
    for (int32_t i = 0; i < np; i++) b->df[b->post[i].term]++;
    free(ids);
    *out = b;
    return 0;
fail:
    free(ids);
    tl_bm25_free(b);
    return -1;
}

void tl_bm25_score(const tl_bm25 *b, const char *query, size_t len, float *scores) {
    for (int32_t d = 0; d < b->n_docs; d++) scores[d] = 0.0f;
    if (!b->n_docs || !b->terms.n) return;
    /* distinct query terms that occur in the index */
    int32_t *q = malloc((len / 2 + 1) * sizeof(int32_t)), nq = 0;
    if (!q) return;
    size_t at = 0, wl;
    char w[64];
    while ((wl = next_word(query, len, &at, w, sizeof w)) > 0) {
        int32_t id = table_find(&b->terms, w, wl);
        if (id >= 0) q[nq++] = id;
    }
    qsort(q, (size_t)nq, sizeof *q, cmp_int32);
    int32_t u = 0;
    for (int32_t i = 0; i < nq; i++)
        if (!u || q[u - 1] != q[i]) q[u++] = q[i];
    double N = b->n_docs;
    for (int32_t d = 0; d < b->n_docs; d++) {
        double s = 0, norm = TL_BM25_K1 * (1 - TL_BM25_B + TL_BM25_B * b->doc_len[d] / (b->avgdl > 0 ? b->avgdl : 1));
        const posting *p = b->post + b->post_at[d], *e = b->post + b->post_at[d + 1];
        int32_t i = 0;
        for (; p < e && i < u;) { /* both sorted by term id */
            if (p->term < q[i]) p++;
            else if (p->term > q[i]) i++;
            else {
                double df = b->df[q[i]], idf = log(1 + (N - df + 0.5) / (df + 0.5));
                s += idf * p->tf * (TL_BM25_K1 + 1) / (p->tf + norm);
                p++;
                i++;
            }
        }
        scores[d] = (float)s;
    }
    free(q);
}

/* ---- chunks of a history ---- */

struct tl_textmem {
    tl_chunk *chunks;
    int32_t n_chunks;
    int32_t *chunk_of; /* [n tokens] chunk holding each token, -1 for control tokens */
    int32_t n_tokens;
    tl_bm25 *index;
};

void tl_textmem_free(tl_textmem *t) {
    if (!t) return;
    free(t->chunks);
    free(t->chunk_of);
    tl_bm25_free(t->index);
    free(t);
}

int32_t tl_textmem_count(const tl_textmem *t) { return t->n_chunks; }
tl_chunk tl_textmem_chunk(const tl_textmem *t, int32_t i) { return t->chunks[i]; }
int32_t tl_textmem_find(const tl_textmem *t, int32_t tok) {
    return tok >= 0 && tok < t->n_tokens ? t->chunk_of[tok] : -1;
}

/* Does the piece end a sentence: . ! or ? as its last character, or before a
 * closing quote, or a newline anywhere in it. */
static int ends_sentence(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] == '\n') return 1;
    while (n && (p[n - 1] == '"' || p[n - 1] == '\'' || p[n - 1] == ' ')) n--;
    return n && (p[n - 1] == '.' || p[n - 1] == '!' || p[n - 1] == '?');
}

int tl_textmem_create(const tl_tokenizer *tok, const int32_t *ids, int32_t n, tl_chunking how,
                      int32_t chunk_tokens, tl_textmem **out, char *err, size_t err_size) {
    *out = NULL;
    if (n < 0 || (how == TL_CHUNK_TOKENS && chunk_tokens < 1) || (how != TL_CHUNK_TOKENS && how != TL_CHUNK_SENTENCES))
        return tl_errf(err, err_size, "text memory: bad arguments (n %d, chunking %d, chunk %d)", n, (int)how,
                       chunk_tokens);
    tl_textmem *t = calloc(1, sizeof *t);
    char **texts = NULL;
    size_t *lens = NULL;
    int rc = -1;
    if (!t) return tl_errf(err, err_size, "out of memory");
    t->n_tokens = n;
    t->chunks = malloc(((size_t)n + 1) * sizeof *t->chunks);
    t->chunk_of = malloc(((size_t)n + 1) * sizeof(int32_t));
    if (!t->chunks || !t->chunk_of) goto out;
    int32_t bos = tl_tokenizer_bos(tok), eos = tl_tokenizer_eos(tok);
    int32_t cur = -1;    /* the open chunk */
    int32_t closed = -1; /* the sentence that just ended (a closing quote joins it) */
    for (int32_t i = 0; i < n; i++) {
        int ctl = ids[i] == bos || ids[i] == eos;
        t->chunk_of[i] = -1;
        if (ctl) {
            if (how == TL_CHUNK_SENTENCES) cur = closed = -1; /* a story's end ends its sentence */
            continue;
        }
        size_t pl = 0;
        const char *p = NULL;
        if (how == TL_CHUNK_SENTENCES) {
            p = tl_token_piece(tok, i ? ids[i - 1] : -1, ids[i], &pl);
            if (!p) {
                tl_errf(err, err_size, "text memory: token %d (id %d) is not in the vocabulary", i, ids[i]);
                goto out;
            }
            int quotes = pl > 0;
            for (size_t j = 0; j < pl; j++) quotes &= p[j] == '"' || p[j] == '\'';
            if (cur < 0 && closed >= 0 && quotes && t->chunks[closed].first + t->chunks[closed].n == i) {
                t->chunks[closed].n++;
                t->chunk_of[i] = closed;
                continue;
            }
        }
        int open_new = cur < 0 || t->chunks[cur].first + t->chunks[cur].n != i; /* chunks are contiguous */
        if (how == TL_CHUNK_TOKENS && cur >= 0 && i / chunk_tokens != t->chunks[cur].first / chunk_tokens) open_new = 1;
        if (open_new) {
            cur = t->n_chunks++;
            t->chunks[cur].first = i;
            t->chunks[cur].n = 0;
        }
        t->chunks[cur].n++;
        t->chunk_of[i] = cur;
        closed = -1;
        if (how == TL_CHUNK_SENTENCES && ends_sentence(p, pl)) {
            closed = cur;
            cur = -1;
        }
    }
    texts = calloc((size_t)t->n_chunks + 1, sizeof *texts);
    lens = calloc((size_t)t->n_chunks + 1, sizeof *lens);
    if (!texts || !lens) goto out;
    for (int32_t c = 0; c < t->n_chunks; c++) {
        texts[c] = tl_decode_len(tok, ids + t->chunks[c].first, t->chunks[c].n, &lens[c]);
        if (!texts[c]) {
            tl_errf(err, err_size, "text memory: cannot decode chunk %d", c);
            goto out;
        }
    }
    if (tl_bm25_create((const char *const *)texts, lens, t->n_chunks, &t->index)) goto out;
    rc = 0;
out:
    if (texts)
        for (int32_t c = 0; c < t->n_chunks; c++) free(texts[c]);
    free(texts);
    free(lens);
    if (rc) {
        if (!err || !err[0]) tl_errf(err, err_size, "text memory: out of memory");
        tl_textmem_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void tl_textmem_score(const tl_textmem *t, const char *query, size_t len, float *scores) {
    tl_bm25_score(t->index, query, len, scores);
}

int32_t tl_textmem_choose(const tl_textmem *t, const float *scores, int32_t budget, int32_t limit, int32_t *out,
                          int32_t cap, int32_t *tokens) {
    int32_t n = 0, used = 0;
    /* selection by repeated max keeps it simple and deterministic: chunks are few */
    uint8_t *taken = calloc((size_t)t->n_chunks + 1, 1);
    if (!taken) return 0;
    for (;;) {
        int32_t best = -1;
        for (int32_t c = 0; c < t->n_chunks; c++) {
            const tl_chunk *k = &t->chunks[c];
            if (taken[c] || !(scores[c] > 0) || k->first + k->n > limit || used + k->n > budget) continue;
            if (best < 0 || scores[c] > scores[best]) best = c;
        }
        if (best < 0 || n == cap) break;
        taken[best] = 1;
        used += t->chunks[best].n;
        n++;
    }
    int32_t k = 0;
    for (int32_t c = 0; c < t->n_chunks && k < n; c++)
        if (taken[c]) out[k++] = c;
    free(taken);
    if (tokens) *tokens = used;
    return n;
}
