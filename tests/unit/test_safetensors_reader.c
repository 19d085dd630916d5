/* The one strict safetensors reader (core/format/safetensors.h) on
 * hand-built files: what it accepts is exactly what the test wrote, and each
 * strictness rule refuses with the documented code and a message that names
 * the problem (and no byte of the file unless allowed). Then the agent
 * writer meets the reader's alignment rule with an odd head_dim, and an
 * agent whose text holds a NUL round-trips. */
#include "testutil.h"
#include "internal.h"
#include "format/json.h"
#include "format/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* [u64 LE len][json, space padded to 8][data_n bytes of data]. */
typedef struct img {
    unsigned char *p;
    size_t n;
} img;

static img make(const char *json, size_t data_n) {
    size_t hl = strlen(json);
    size_t padded = (hl + 7) / 8 * 8;
    img m;
    m.n = 8 + padded + data_n;
    m.p = malloc(m.n ? m.n : 1);
    for (int i = 0; i < 8; i++) m.p[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(m.p + 8, json, hl);
    memset(m.p + 8 + hl, ' ', padded - hl);
    for (size_t i = 0; i < data_n; i++) m.p[8 + padded + i] = (unsigned char)(i * 7 + 1);
    return m;
}

/* kvm_st_read over an image built from json + data_n bytes, default rules
 * with names quoted. */
static kvmem_status read_json(const char *json, size_t data_n, kvm_st_header *h) {
    img m = make(json, data_n);
    kvm_st_rules r = kvm_st_default_rules();
    r.quote = 1;
    size_t off = 0;
    kvmem_status st = kvm_st_read(m.p, m.n, (uint64_t)1 << 20, &r, h, &off);
    free(m.p);
    return st;
}

#define REFUSED(json, data_n, code, needle)                                                   \
    do {                                                                                      \
        kvm_st_header h_;                                                                     \
        kvmem_status st_ = read_json(json, data_n, &h_);                                      \
        kvm_st_header_free(&h_);                                                              \
        if (st_ != (code) || !strstr(kvmem_last_error(), needle))                             \
            fail_msg("%s: got %d '%s', want %d with '%s'", json, (int)st_, kvmem_last_error(), \
                     (int)(code), needle);                                                    \
    } while (0)

static void accepts_what_was_written(void **state) {
    (void)state;
    /* U8 [3] at 8 after an F32 [2][1]: wider first; an empty I64 anywhere it tiles */
    const char *j = "{\"__metadata__\":{\"k\":\"v\",\"e\":\"\"},"
                    "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":[0,8]},"
                    "\"z\":{\"dtype\":\"I64\",\"shape\":[0,5],\"data_offsets\":[11,11]}}";
    img m = make(j, 11);
    kvm_st_rules r = kvm_st_default_rules();
    kvm_st_header h;
    size_t off = 0;
    assert_ok(kvm_st_read(m.p, m.n, 4096, &r, &h, &off));
    assert_int_equal(off, 8 + (strlen(j) + 7) / 8 * 8);
    assert_int_equal(h.data_size, 11);
    assert_int_equal(h.n_tensors, 3);
    const kvm_st_tensor *a = kvm_st_find(&h, "a"), *b = kvm_st_find(&h, "b"), *z = kvm_st_find(&h, "z");
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(z);
    assert_null(kvm_st_find(&h, "__metadata__"));
    assert_int_equal(a->dtype, KVM_ST_F32);
    assert_int_equal(a->ndim, 2);
    assert_true(a->shape[0] == 2 && a->shape[1] == 1 && a->begin == 0 && a->end == 8);
    assert_int_equal(b->dtype, KVM_ST_U8);
    assert_true(b->ndim == 1 && b->shape[0] == 3 && b->begin == 8 && b->end == 11);
    assert_true(z->dtype == KVM_ST_I64 && z->ndim == 2 && z->shape[0] == 0 && z->begin == 11);
    assert_string_equal(h.tensors[0].name, "b"); /* header order */
    assert_string_equal(kvm_st_meta(&h, "k")->str, "v");
    assert_int_equal(kvm_st_meta(&h, "e")->len, 0);
    assert_null(kvm_st_meta(&h, "absent"));
    kvm_st_header_free(&h);
    free(m.p);
    /* no tensors and no data; no metadata at all */
    kvm_st_header h2;
    assert_ok(read_json("{}", 0, &h2));
    assert_int_equal(h2.n_tensors, 0);
    assert_null(h2.meta);
    kvm_st_header_free(&h2);
    /* every dtype of the specification, each at an aligned offset */
    const char *names[] = {"F64", "I64", "U64", "F32", "I32", "U32", "F16", "BF16", "I16", "U16",
                           "I8", "U8", "BOOL", "F8_E5M2", "F8_E4M3"};
    const size_t sizes[] = {8, 8, 8, 4, 4, 4, 2, 2, 2, 2, 1, 1, 1, 1, 1};
    char big[4096] = "{";
    size_t at = 1, off2 = 0;
    for (int i = 0; i < 15; i++) {
        at += (size_t)snprintf(big + at, sizeof big - at, "%s\"t%d\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[%zu,%zu]}",
                               i ? "," : "", i, names[i], off2, off2 + 3 * sizes[i]);
        off2 += 3 * sizes[i];
    }
    snprintf(big + at, sizeof big - at, "}");
    /* 3 elements of 8, 4, 2 bytes keep the next begin aligned only if the widths fall: they do */
    kvm_st_header h3;
    assert_ok(read_json(big, off2, &h3));
    for (int i = 0; i < 15; i++) {
        assert_string_equal(kvm_st_dtype_name(h3.tensors[i].dtype), names[i]);
        assert_int_equal(kvm_st_dtype_size(h3.tensors[i].dtype), sizes[i]);
    }
    kvm_st_header_free(&h3);
}

static void refuses_malformed_headers_as_format(void **state) {
    (void)state;
    const char *f4 = "\"dtype\":\"F32\",\"shape\":[1],";
    char j[512];
    /* duplicate names, in the metadata or among tensors */
    snprintf(j, sizeof j, "{\"a\":{%s\"data_offsets\":[0,4]},\"a\":{%s\"data_offsets\":[0,4]}}", f4, f4);
    REFUSED(j, 4, KVMEM_ERR_FORMAT, "duplicate member name");
    REFUSED("{\"__metadata__\":{\"x\":\"1\",\"x\":\"2\"}}", 0, KVMEM_ERR_FORMAT, "duplicate member name");
    /* anything after the object */
    snprintf(j, sizeof j, "{\"a\":{%s\"data_offsets\":[0,4]}} x", f4);
    REFUSED(j, 4, KVMEM_ERR_FORMAT, "trailing characters");
    /* not an object at all */
    REFUSED("[1,2]", 0, KVMEM_ERR_FORMAT, "not a JSON object");
    REFUSED("{\"a\":", 0, KVMEM_ERR_FORMAT, "its JSON header is malformed");
    /* NUL in a metadata value, a metadata key, a tensor name, a dtype */
    REFUSED("{\"__metadata__\":{\"id\":\"al\\u0000ice\"}}", 0, KVMEM_ERR_FORMAT, "metadata 'id' contains a NUL character");
    REFUSED("{\"__metadata__\":{\"i\\u0000d\":\"x\"}}", 0, KVMEM_ERR_FORMAT, "a metadata key contains a NUL");
    snprintf(j, sizeof j, "{\"a\\u0000b\":{%s\"data_offsets\":[0,4]}}", f4);
    REFUSED(j, 4, KVMEM_ERR_FORMAT, "a tensor name contains a NUL");
    REFUSED("{\"a\":{\"dtype\":\"F3\\u00002\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, KVMEM_ERR_FORMAT,
            "a string with a NUL character");
    /* numbers that are not finite as doubles; the largest finite one parses */
    snprintf(j, sizeof j, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1e999],\"data_offsets\":[0,4]}}");
    REFUSED(j, 4, KVMEM_ERR_FORMAT, "not finite");
    snprintf(j, sizeof j, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.7976931348623157e308],\"data_offsets\":[0,4]}}");
    REFUSED(j, 4, KVMEM_ERR_FORMAT, "shape must hold non-negative integers");
    /* too deep */
    char deep[256] = "{\"__metadata__\":";
    size_t d = strlen(deep);
    for (int i = 0; i < 40; i++) deep[d++] = '[';
    for (int i = 0; i < 40; i++) deep[d++] = ']';
    deep[d++] = '}';
    deep[d] = '\0';
    REFUSED(deep, 0, KVMEM_ERR_FORMAT, "nesting deeper than");
    /* metadata must be an object of strings */
    REFUSED("{\"__metadata__\":{\"n\":1}}", 0, KVMEM_ERR_FORMAT, "metadata 'n' is not a string");
    REFUSED("{\"__metadata__\":[]}", 0, KVMEM_ERR_FORMAT, "__metadata__ must be an object");
    /* entries: exactly three fields, a known dtype, integer shape and offsets */
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, KVMEM_ERR_FORMAT, "nothing else");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, KVMEM_ERR_FORMAT, "nothing else");
    REFUSED("{\"a\":[1,2,3]}", 4, KVMEM_ERR_FORMAT, "nothing else");
    REFUSED("{\"a\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, KVMEM_ERR_FORMAT, "not a safetensors dtype");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, KVMEM_ERR_FORMAT, "non-negative integers");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, KVMEM_ERR_FORMAT, "non-negative integers");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, KVMEM_ERR_FORMAT,
            "at most 8 dimensions");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, KVMEM_ERR_FORMAT, "0 <= begin <= end");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, KVMEM_ERR_FORMAT, "data_offsets must be");
    /* misaligned: an F32 after 2 bytes of U8 */
    REFUSED("{\"u\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
            "\"f\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}",
            6, KVMEM_ERR_FORMAT, "tensor 'f' begins at data byte 2, not a multiple of its 4-byte F32 elements (misaligned)");
}

static void refuses_inconsistent_layouts_as_corrupt(void **state) {
    (void)state;
#define TWO "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}," \
            "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%d,%d]}}"
    char j[512];
    snprintf(j, sizeof j, TWO, 4, 8);
    kvm_st_header h;
    assert_ok(read_json(j, 8, &h)); /* the reference: a and b tile 8 bytes */
    kvm_st_header_free(&h);
    REFUSED(j, 9, KVMEM_ERR_CORRUPT, "the data section has 9 bytes, the tensors cover 8 (trailing bytes)");
    REFUSED(j, 7, KVMEM_ERR_CORRUPT, "tensor 'b' data [4, 8) lies outside the 7-byte data section (truncated?)");
    snprintf(j, sizeof j, TWO, 8, 12);
    REFUSED(j, 12, KVMEM_ERR_CORRUPT, "4 data bytes before tensor 'b' belong to no tensor (a hole)");
    snprintf(j, sizeof j, TWO, 0, 4);
    REFUSED(j, 4, KVMEM_ERR_CORRUPT, "overlaps tensor");
    /* an empty tensor inside another one overlaps it too */
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
            8, KVMEM_ERR_CORRUPT, "tensor 'e' overlaps tensor 'a'");
    /* span against shape, and shapes whose size overflows */
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, KVMEM_ERR_CORRUPT,
            "tensor 'a' has 8 data bytes, its shape of 3 F32 elements needs 12");
    REFUSED("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, KVMEM_ERR_CORRUPT,
            "needs more than");
}

static void header_length_and_quoting(void **state) {
    (void)state;
    kvm_st_header h;
    size_t off;
    kvm_st_rules r = kvm_st_default_rules();
    unsigned char b[24] = {0};
    assert_status(kvm_st_read(b, 5, 100, &r, &h, &off), KVMEM_ERR_FORMAT, "too short for a safetensors file");
    kvm_st_header_free(&h);
    b[0] = 1; /* length 1 */
    assert_status(kvm_st_read(b, 24, 100, &r, &h, &off), KVMEM_ERR_FORMAT, "not a header length in [2, 100]");
    kvm_st_header_free(&h);
    b[0] = 0, b[1] = 0x40; /* 16384 > 100 */
    assert_status(kvm_st_read(b, 24, 100, &r, &h, &off), KVMEM_ERR_FORMAT, "not a header length");
    assert_null(strstr(kvmem_last_error(), "16384"));
    kvm_st_header_free(&h);
    assert_status(kvm_st_read(b, 24, 1 << 20, &r, &h, &off), KVMEM_ERR_CORRUPT, "past the end of the file (24 bytes)");
    assert_null(strstr(kvmem_last_error(), "16384"));
    kvm_st_header_free(&h);
    /* quote = 0: tensor names and unknown metadata keys are not repeated */
    img m = make("{\"__metadata__\":{\"SECRET_KEY\":1}}", 0);
    assert_status(kvm_st_read(m.p, m.n, 4096, &r, &h, &off), KVMEM_ERR_FORMAT, "a metadata value is not a string");
    assert_null(strstr(kvmem_last_error(), "SECRET"));
    kvm_st_header_free(&h);
    free(m.p);
    const char *const known[] = {"SECRET_KEY", NULL};
    r.known_keys = known; /* a key the caller named itself may be named back */
    m = make("{\"__metadata__\":{\"SECRET_KEY\":1}}", 0);
    assert_status(kvm_st_read(m.p, m.n, 4096, &r, &h, &off), KVMEM_ERR_FORMAT, "metadata 'SECRET_KEY' is not a string");
    kvm_st_header_free(&h);
    free(m.p);
    r.known_keys = NULL;
    m = make("{\"SECRET_NAME\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8);
    r.dtypes = KVM_ST_DTYPE_BIT(KVM_ST_F32) | KVM_ST_DTYPE_BIT(KVM_ST_F16) | KVM_ST_DTYPE_BIT(KVM_ST_BF16);
    assert_status(kvm_st_read(m.p, m.n, 4096, &r, &h, &off), KVMEM_ERR_FORMAT,
                  "tensor number 1 (in header order) has dtype I64: only F32/F16/BF16 are accepted here");
    assert_null(strstr(kvmem_last_error(), "SECRET"));
    kvm_st_header_free(&h);
    free(m.p);
    /* limits: tensor count; __metadata__ required when asked */
    r = kvm_st_default_rules();
    r.max_tensors = 1;
    m = make("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2);
    assert_status(kvm_st_read(m.p, m.n, 4096, &r, &h, &off), KVMEM_ERR_FORMAT, "2 tensors, more than the 1");
    kvm_st_header_free(&h);
    r.max_tensors = 0;
    r.require_meta = 1;
    assert_status(kvm_st_read(m.p, m.n, 4096, &r, &h, &off), KVMEM_ERR_FORMAT, "no __metadata__ object");
    kvm_st_header_free(&h);
    free(m.p);
    /* a refused header whose JSON parsed stays readable (kvmem inspect) */
    m = make("{\"__metadata__\":{\"agent_id\":\"a\\u0000b\",\"checksum\":\"c\"}}", 0);
    r = kvm_st_default_rules();
    assert_int_equal(kvm_st_parse((const char *)m.p + 8, m.n - 8, 0, &r, &h), KVMEM_ERR_FORMAT);
    assert_non_null(h.root);
    assert_string_equal(kvm_st_meta(&h, "checksum")->str, "c");
    assert_int_equal(kvm_st_meta(&h, "agent_id")->len, 3);
    kvm_st_header_free(&h);
    free(m.p);
}

/* The finiteness rule of the JSON reader against hand-computed cases: a
 * number is refused exactly when its magnitude is beyond DBL_MAX
 * (1.7976931348623157e308). */
static void json_numbers_must_be_finite(void **state) {
    (void)state;
    const char *ok[] = {"1.7976931348623157e308", "-1.7976931348623157e308", "1e308", "0.01e310", "0e99999",
                        "0.000e400", "1e-99999", "17976931348623157e292", "179769313486231570000e288"};
    const char *bad[] = {"1.7976931348623158e308", "1e309", "-1e309", "10e308", "0.1e310", "17976931348623158e292",
                         "1797693134862315700001e287", "1e99999999999"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        kvm_json_doc d;
        if (kvm_json_parse(ok[i], strlen(ok[i]), &d, NULL, 0) != 0) fail_msg("refused the finite %s", ok[i]);
        kvm_json_free(&d);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kvm_json_doc d;
        char err[200];
        if (kvm_json_parse(bad[i], strlen(bad[i]), &d, err, sizeof err) == 0) fail_msg("accepted the infinite %s", bad[i]);
        assert_non_null(strstr(err, "not finite"));
    }
}

/* ---- the agent writer meets the reader ---- */

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    return tu_tmpdir_make(g_dir, sizeof g_dir, "st");
}

static int teardown(void **state) {
    (void)state;
    return tu_tmpdir_remove(g_dir);
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

/* An agent of head_dim 5 (odd: F16 rows and Q8 codes of odd byte counts) in
 * each storage dtype, with a short flushed block and a tail: the file loads
 * back (before the writer ordered tensors widest first, an F32 tail or an
 * F16 part could start at an odd offset and the strict reader refused its own
 * file), every tensor begins at a multiple of its element size by a plain
 * scan of the header here, and saving the loaded agent gives the same bytes. */
static void odd_head_dim_agents_round_trip_aligned(void **state) {
    (void)state;
    const kvmem_dtype dts[] = {KVMEM_F16, KVMEM_BF16, KVMEM_F32, KVMEM_Q8, KVMEM_Q4, KVMEM_Q4_KIVI};
    kvmem_context *ctx = tu_context(1);
    for (size_t di = 0; di < sizeof dts / sizeof *dts; di++) {
        kvmem_model_spec spec = tu_spec(1, 5);
        spec.n_kv_heads = 1;
        spec.n_q_heads = 1;
        spec.rotary_dim = 4;
        kvmem_pool_params pp = kvmem_pool_default_params();
        pp.storage_dtype = dts[di];
        pp.block_size = 4;
        kvmem_pool *p;
        kvmem_agent *a, *b;
        assert_ok(kvmem_pool_create(ctx, &spec, &pp, &p));
        assert_ok(kvmem_agent_open(p, "odd", &a));
        const int T = 3; /* one flushed block of 3, then a tail of 1 */
        float k[4 * 5], v[4 * 5];
        uint64_t seed = 11 + di;
        tu_fill_kv(k, 20, &seed);
        tu_fill_kv(v, 20, &seed);
        int64_t shape[4] = {1, T, 1, 5};
        kvmem_tensor tk, tv;
        kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape);
        kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape);
        assert_ok(kvmem_agent_append(a, &tk, &tv, NULL));
        assert_ok(kvmem_agent_flush(a));
        shape[1] = 1;
        kvmem_tensor_init(&tk, k + 15, KVMEM_F32, 4, shape);
        kvmem_tensor_init(&tv, v + 15, KVMEM_F32, 4, shape);
        assert_ok(kvmem_agent_append(a, &tk, &tv, NULL));
        char p1[400], p2[400];
        snprintf(p1, sizeof p1, "%s/odd1.safetensors", g_dir);
        snprintf(p2, sizeof p2, "%s/odd2.safetensors", g_dir);
        assert_ok(kvmem_agent_save(a, p1));
        assert_ok(kvmem_agent_open(p, "odd2", &b));
        if (kvmem_agent_load(b, p1) == KVMEM_OK) {
            /* the id inside is "odd": only the agent of that id may load it */
            fail_msg("an agent file loaded into another agent id");
        }
        assert_ok(kvmem_agent_load(a, p1));
        assert_ok(kvmem_agent_save(a, p2));
        size_t n1, n2;
        unsigned char *f1 = slurp(p1, &n1), *f2 = slurp(p2, &n2);
        assert_int_equal(n1, n2);
        assert_memory_equal(f1, f2, n1);
        /* every "dtype":"X" ... "data_offsets":[b, e]: b % size(X) == 0 */
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = (hl << 8) | f1[i];
        char *hdr = malloc((size_t)hl + 1);
        memcpy(hdr, f1 + 8, (size_t)hl);
        hdr[hl] = '\0';
        int n_tensors = 0;
        for (char *at = strstr(hdr, "\"dtype\":\""); at; at = strstr(at + 1, "\"dtype\":\"")) {
            char dt[8] = {0};
            sscanf(at + 9, "%7[A-Z0-9]", dt);
            const char *of = strstr(at, "\"data_offsets\":[");
            assert_non_null(of);
            unsigned long long begin = strtoull(of + 16, NULL, 10);
            unsigned size = !strcmp(dt, "F32") || !strcmp(dt, "U32") ? 4 : !strcmp(dt, "F16") || !strcmp(dt, "BF16") ? 2 : 1;
            if (begin % size) fail_msg("%s: a %s tensor begins at %llu", kvmem_dtype_name(dts[di]), dt, begin);
            n_tensors++;
        }
        assert_true(n_tensors >= 3);
        free(hdr);
        free(f1);
        free(f2);
        kvmem_agent_close(a);
        kvmem_agent_close(b);
        kvmem_pool_free(p);
    }
    kvmem_context_free(ctx);
}

/* Appended text may hold a NUL (text is bytes with a length). The reader
 * refuses NUL in any header string, so the writer keeps such text as
 * text_hex: the agent loads back with the same bytes. */
static void text_with_a_nul_round_trips(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_model_spec spec = tu_spec(1, 8);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = 4;
    kvmem_pool *p;
    kvmem_agent *a;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &p));
    assert_ok(kvmem_agent_open(p, "nul", &a));
    const size_t n = (size_t)2 * spec.n_kv_heads * 8;
    float *k = calloc(n, 4), *v = calloc(n, 4);
    uint64_t seed = 5;
    tu_fill_kv(k, n, &seed);
    tu_fill_kv(v, n, &seed);
    int64_t shape[4] = {1, 2, spec.n_kv_heads, 8};
    kvmem_tensor tk, tv;
    kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape);
    static const char text[] = {'a', 'b', '\0', 'c'};
    kvmem_append_params ap = kvmem_append_default_params();
    ap.text = text;
    ap.text_len = sizeof text;
    assert_ok(kvmem_agent_append(a, &tk, &tv, &ap));
    char path[400];
    snprintf(path, sizeof path, "%s/nul.safetensors", g_dir);
    assert_ok(kvmem_agent_save(a, path));
    assert_ok(kvmem_agent_truncate(a, 0));
    assert_ok(kvmem_agent_load(a, path));
    kvmem_prefix_result pr;
    /* the stored text is exactly the 4 bytes: the same text matches EXACT */
    assert_ok(kvmem_prefix_match(a, text, sizeof text, NULL, &pr));
    assert_int_equal(pr.kind, KVMEM_PREFIX_EXACT);
    static const char longer[] = {'a', 'b', '\0', 'c', 'd'}; /* the stored 4 bytes, then more */
    assert_ok(kvmem_prefix_match(a, longer, sizeof longer, NULL, &pr));
    assert_int_equal(pr.kind, KVMEM_PREFIX_EXTEND);
    assert_int_equal(pr.common_bytes, 4);
    free(k);
    free(v);
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(accepts_what_was_written),
        cmocka_unit_test(refuses_malformed_headers_as_format),
        cmocka_unit_test(refuses_inconsistent_layouts_as_corrupt),
        cmocka_unit_test(header_length_and_quoting),
        cmocka_unit_test(json_numbers_must_be_finite),
        cmocka_unit_test(odd_head_dim_agents_round_trip_aligned),
        cmocka_unit_test(text_with_a_nul_round_trips),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
