/* The strict safetensors header reader (see safetensors.h). */
#include "safetensors.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} k_dtypes[KVM_ST_N_DTYPES] = {
    [KVM_ST_BOOL] = {"BOOL", 1}, [KVM_ST_U8] = {"U8", 1},     [KVM_ST_I8] = {"I8", 1},
    [KVM_ST_F8_E5M2] = {"F8_E5M2", 1}, [KVM_ST_F8_E4M3] = {"F8_E4M3", 1}, [KVM_ST_I16] = {"I16", 2},
    [KVM_ST_U16] = {"U16", 2}, [KVM_ST_F16] = {"F16", 2},   [KVM_ST_BF16] = {"BF16", 2},
    [KVM_ST_I32] = {"I32", 4}, [KVM_ST_U32] = {"U32", 4},   [KVM_ST_F32] = {"F32", 4},
    [KVM_ST_F64] = {"F64", 8}, [KVM_ST_I64] = {"I64", 8},   [KVM_ST_U64] = {"U64", 8},
};

const char *kvm_st_dtype_name(kvm_st_dtype d) { return (unsigned)d < KVM_ST_N_DTYPES ? k_dtypes[d].name : "?"; }
size_t kvm_st_dtype_size(kvm_st_dtype d) { return (unsigned)d < KVM_ST_N_DTYPES ? k_dtypes[d].size : 0; }

kvm_st_rules kvm_st_default_rules(void) {
    kvm_st_rules r;
    memset(&r, 0, sizeof r);
    r.dtypes = KVM_ST_ALL_DTYPES;
    return r;
}

kvmem_status kvm_st_header_len(const unsigned char first8[8], uint64_t file_size, uint64_t max_header,
                               uint64_t *header_len) {
    if (file_size < 8)
        return kvm_fail(KVMEM_ERR_FORMAT,
                        "file has %" PRIu64 " bytes: too short for a safetensors file (an 8-byte header length comes first)",
                        file_size);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | first8[i];
    /* The value is 8 bytes of the file, whatever the file is: never quoted
     * (a caller may show this message to someone who must not read it). */
    if (hl < 2 || hl > max_header)
        return kvm_fail(KVMEM_ERR_FORMAT,
                        "the first 8 bytes are not a header length in [2, %" PRIu64 "]: not a safetensors file", max_header);
    if (hl > file_size - 8)
        return kvm_fail(KVMEM_ERR_CORRUPT,
                        "its header length (the first 8 bytes, little-endian) points past the end of the file (%" PRIu64
                        " bytes): truncated, or not a safetensors file",
                        file_size);
    *header_len = hl;
    return KVMEM_OK;
}

void kvm_st_header_free(kvm_st_header *h) {
    if (!h) return;
    kvm_json_free(&h->doc);
    kvm_free(h->tensors);
    memset(h, 0, sizeof *h);
}

/* How a message names tensor i: by name when the caller allows it, else by
 * its place in the header (the name is a byte of a file not yet trusted). */
typedef struct namebuf {
    char s[96];
} namebuf;

static const char *tname(const kvm_st_rules *r, const char *name, size_t len, int32_t i, namebuf *b) {
    if (r->quote) snprintf(b->s, sizeof b->s, "'%.*s'", (int)(len < 64 ? len : 64), name);
    else snprintf(b->s, sizeof b->s, "number %d (in header order)", (int)i + 1);
    return b->s;
}

/* May a message name metadata key k? */
static int may_name(const kvm_st_rules *r, const kvm_json *k) {
    if (r->quote) return 1;
    for (const char *const *c = r->known_keys; c && *c; c++)
        if (k->key_len == strlen(*c) && memcmp(k->key, *c, k->key_len) == 0) return 1;
    return 0;
}

static int has_nul(const char *s, size_t n) { return n && memchr(s, '\0', n) != NULL; }

/* A non-negative JSON integer. */
static int uint_of(const kvm_json *v, uint64_t *out) {
    if (!v || v->type != KVM_JSON_NUMBER || !v->is_int || v->i < 0) return 0;
    *out = (uint64_t)v->i;
    return 1;
}

/* "F32/F16/BF16": the accepted dtypes, for a message, widest first. */
static void dtype_list(uint32_t mask, char *buf, size_t size) {
    size_t at = 0;
    buf[0] = '\0';
    for (size_t w = 8; w >= 1; w /= 2)
        for (int d = 0; d < KVM_ST_N_DTYPES && at < size; d++)
            if ((mask & KVM_ST_DTYPE_BIT(d)) && k_dtypes[d].size == w)
                at += (size_t)snprintf(buf + at, size - at, "%s%s", at ? "/" : "", k_dtypes[d].name);
}

/* NUL characters: a C reader would cut the string short (agent id
 * "alice\u0000-evil" read as "alice"), so none anywhere in a header. */
static kvmem_status check_nul(const kvm_st_header *h, const kvm_st_rules *r) {
    const kvm_json_doc *d = &h->doc;
    if (h->meta && h->meta->type == KVM_JSON_OBJECT)
        for (const kvm_json *c = kvm_json_child(d, h->meta); c; c = kvm_json_next(d, c)) {
            if (has_nul(c->key, c->key_len))
                return kvm_fail(KVMEM_ERR_FORMAT, "a metadata key contains a NUL character (\\u0000)");
            if (c->type == KVM_JSON_STRING && has_nul(c->str, c->len))
                return may_name(r, c) ? kvm_fail(KVMEM_ERR_FORMAT, "metadata '%.64s' contains a NUL character (\\u0000)", c->key)
                                : kvm_fail(KVMEM_ERR_FORMAT, "a metadata value contains a NUL character (\\u0000)");
        }
    for (const kvm_json *c = kvm_json_child(d, h->root); c; c = kvm_json_next(d, c))
        if (has_nul(c->key, c->key_len)) return kvm_fail(KVMEM_ERR_FORMAT, "a tensor name contains a NUL character (\\u0000)");
    for (int32_t i = 0; i < d->n_nodes; i++) {
        const kvm_json *x = &d->nodes[i];
        if ((x->type == KVM_JSON_STRING && has_nul(x->str, x->len)) || (x->key && has_nul(x->key, x->key_len)))
            return kvm_fail(KVMEM_ERR_FORMAT, "the header holds a string with a NUL character (\\u0000)");
    }
    return KVMEM_OK;
}

/* One tensor entry: exactly dtype, shape and data_offsets. */
static kvmem_status parse_entry(const kvm_st_header *h, const kvm_st_rules *r, const kvm_json *e, int32_t i,
                                kvm_st_tensor *t) {
    const kvm_json_doc *d = &h->doc;
    namebuf nb;
    const char *nm = tname(r, e->key, e->key_len, i, &nb);
    memset(t, 0, sizeof *t);
    t->name = e->key;
    t->name_len = e->key_len;
    t->node = e;
    const kvm_json *dt = kvm_json_get(d, e, "dtype"), *sh = kvm_json_get(d, e, "shape"),
                   *of = kvm_json_get(d, e, "data_offsets");
    if (e->type != KVM_JSON_OBJECT || e->n != 3 || !dt || !sh || !of)
        return kvm_fail(KVMEM_ERR_FORMAT, "tensor %s must hold exactly dtype, shape and data_offsets, nothing else", nm);
    int found = -1;
    if (dt->type == KVM_JSON_STRING)
        for (int k = 0; k < KVM_ST_N_DTYPES && found < 0; k++)
            if (strcmp(dt->str, k_dtypes[k].name) == 0) found = k;
    if (found < 0) return kvm_fail(KVMEM_ERR_FORMAT, "tensor %s has a dtype that is not a safetensors dtype", nm);
    if (!(r->dtypes & KVM_ST_DTYPE_BIT(found))) {
        char list[160];
        dtype_list(r->dtypes, list, sizeof list);
        return kvm_fail(KVMEM_ERR_FORMAT, "tensor %s has dtype %s: only %s are accepted here", nm, k_dtypes[found].name, list);
    }
    t->dtype = (kvm_st_dtype)found;
    const int32_t max_dims = r->max_dims > 0 && r->max_dims < KVM_ST_MAX_DIMS ? r->max_dims : KVM_ST_MAX_DIMS;
    if (sh->type != KVM_JSON_ARRAY || sh->n > max_dims)
        return kvm_fail(KVMEM_ERR_FORMAT, "tensor %s shape must be a list of at most %d dimensions", nm, max_dims);
    for (const kvm_json *x = kvm_json_child(d, sh); x; x = kvm_json_next(d, x))
        if (!uint_of(x, &t->shape[t->ndim++]))
            return kvm_fail(KVMEM_ERR_FORMAT, "tensor %s shape must hold non-negative integers", nm);
    const kvm_json *b = of->type == KVM_JSON_ARRAY && of->n == 2 ? kvm_json_child(d, of) : NULL;
    if (!b || !uint_of(b, &t->begin) || !uint_of(kvm_json_next(d, b), &t->end) || t->end < t->begin)
        return kvm_fail(KVMEM_ERR_FORMAT, "tensor %s data_offsets must be [begin, end], integers with 0 <= begin <= end", nm);
    return KVMEM_OK;
}

kvmem_status kvm_st_parse(const char *json, size_t header_len, uint64_t data_size, const kvm_st_rules *rules,
                          kvm_st_header *out) {
    memset(out, 0, sizeof *out);
    out->header_len = header_len;
    out->data_size = data_size;
    const kvm_st_rules *r = rules;
    kvm_st_rules def;
    if (!r) {
        def = kvm_st_default_rules();
        r = &def;
    }
    /* A header is one JSON object: a file whose header is another JSON
     * value is told so before any JSON detail. */
    size_t i = 0;
    while (i < header_len && (json[i] == ' ' || json[i] == '\t' || json[i] == '\n' || json[i] == '\r')) i++;
    if (i < header_len && json[i] != '{' && strchr("[\"tfn-0123456789", json[i]))
        return kvm_fail(KVMEM_ERR_FORMAT, "the header is not a JSON object");
    char jerr[200];
    int jr = kvm_json_parse(json, header_len, &out->doc, jerr, sizeof jerr);
    if (jr == KVM_JSON_NOMEM) return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the parsed JSON header (%zu bytes)", header_len);
    if (jr != 0) return kvm_fail(KVMEM_ERR_FORMAT, "its JSON header is malformed: %s", jerr); /* names the byte offset only */
    out->root = &out->doc.nodes[0];
    if (out->root->type != KVM_JSON_OBJECT) {
        out->root = NULL;
        return kvm_fail(KVMEM_ERR_FORMAT, "the header is not a JSON object");
    }
    out->meta = kvm_json_get(&out->doc, out->root, "__metadata__");
    if (r->require_meta && (!out->meta || out->meta->type != KVM_JSON_OBJECT))
        return kvm_fail(KVMEM_ERR_FORMAT, "the header has no __metadata__ object");
    kvmem_status st = check_nul(out, r);
    if (st != KVMEM_OK) return st;
    if (out->meta) {
        if (out->meta->type != KVM_JSON_OBJECT)
            return kvm_fail(KVMEM_ERR_FORMAT, "__metadata__ must be an object of strings");
        for (const kvm_json *c = kvm_json_child(&out->doc, out->meta); c; c = kvm_json_next(&out->doc, c))
            if (c->type != KVM_JSON_STRING)
                return may_name(r, c) ? kvm_fail(KVMEM_ERR_FORMAT, "metadata '%.64s' is not a string (__metadata__ holds strings only)", c->key)
                                : kvm_fail(KVMEM_ERR_FORMAT, "a metadata value is not a string (__metadata__ holds strings only)");
    }
    int32_t n = out->root->n - (out->meta ? 1 : 0);
    if (r->max_tensors > 0 && n > r->max_tensors)
        return kvm_fail(KVMEM_ERR_FORMAT, "the header lists %d tensors, more than the %d expected here", (int)n, (int)r->max_tensors);
    out->tensors = kvm_malloc((size_t)(n > 0 ? n : 1) * sizeof *out->tensors);
    if (!out->tensors) return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the table of %d tensors", (int)n);
    for (const kvm_json *c = kvm_json_child(&out->doc, out->root); c; c = kvm_json_next(&out->doc, c)) {
        if (c == out->meta) continue;
        if ((st = parse_entry(out, r, c, out->n_tensors, &out->tensors[out->n_tensors])) != KVMEM_OK) return st;
        out->n_tensors++;
    }
    return KVMEM_OK;
}

static int by_span(const void *a, const void *b) {
    const kvm_st_tensor *x = *(const kvm_st_tensor *const *)a, *y = *(const kvm_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

kvmem_status kvm_st_check_layout(const kvm_st_header *h, const kvm_st_rules *rules) {
    kvm_st_rules def = kvm_st_default_rules();
    const kvm_st_rules *r = rules ? rules : &def;
    namebuf nb, nb2;
    for (int32_t i = 0; i < h->n_tensors; i++) {
        const kvm_st_tensor *t = &h->tensors[i];
        const char *nm = tname(r, t->name, t->name_len, i, &nb);
        if (t->end > h->data_size)
            return kvm_fail(KVMEM_ERR_CORRUPT,
                            "tensor %s data [%" PRIu64 ", %" PRIu64 ") lies outside the %" PRIu64 "-byte data section (truncated?)",
                            nm, t->begin, t->end, h->data_size);
        const uint64_t es = kvm_st_dtype_size(t->dtype);
        uint64_t ne = 1;
        int big = 0;
        for (int32_t k = 0; k < t->ndim; k++) {
            if (t->shape[k] && ne > UINT64_MAX / es / t->shape[k]) big = 1;
            else ne *= t->shape[k];
        }
        if (big || ne * es != t->end - t->begin)
            return kvm_fail(KVMEM_ERR_CORRUPT, "tensor %s has %" PRIu64 " data bytes, its shape of %s%" PRIu64 " %s elements needs %s%" PRIu64,
                            nm, t->end - t->begin, big ? "more than " : "", ne, k_dtypes[t->dtype].name, big ? "more than " : "",
                            ne * es);
        if (t->begin % es && t->end > t->begin) /* an empty tensor has nothing to misread */
            return kvm_fail(KVMEM_ERR_FORMAT,
                            "tensor %s begins at data byte %" PRIu64 ", not a multiple of its %" PRIu64 "-byte %s elements (misaligned)",
                            nm, t->begin, es, k_dtypes[t->dtype].name);
    }
    /* the tensors tile the data section, in offset order */
    const kvm_st_tensor **order = kvm_malloc((size_t)(h->n_tensors > 0 ? h->n_tensors : 1) * sizeof *order);
    if (!order) return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the order of %d tensors", (int)h->n_tensors);
    for (int32_t i = 0; i < h->n_tensors; i++) order[i] = &h->tensors[i];
    qsort(order, (size_t)h->n_tensors, sizeof *order, by_span);
    kvmem_status st = KVMEM_OK;
    uint64_t cur = 0;
    for (int32_t i = 0; i < h->n_tensors && st == KVMEM_OK; i++) {
        const kvm_st_tensor *t = order[i];
        const int32_t ti = (int32_t)(t - h->tensors);
        if (t->begin < cur) {
            const kvm_st_tensor *o = order[i - 1];
            st = kvm_fail(KVMEM_ERR_CORRUPT, "tensor %s overlaps tensor %s", tname(r, t->name, t->name_len, ti, &nb),
                          tname(r, o->name, o->name_len, (int32_t)(o - h->tensors), &nb2));
        } else if (t->begin > cur) {
            st = kvm_fail(KVMEM_ERR_CORRUPT, "%" PRIu64 " data bytes before tensor %s belong to no tensor (a hole)",
                          t->begin - cur, tname(r, t->name, t->name_len, ti, &nb));
        }
        cur = t->end;
    }
    kvm_free(order);
    if (st == KVMEM_OK && cur != h->data_size)
        st = kvm_fail(KVMEM_ERR_CORRUPT, "the data section has %" PRIu64 " bytes, the tensors cover %" PRIu64 " (trailing bytes)",
                      h->data_size, cur);
    return st;
}

kvmem_status kvm_st_read(const unsigned char *file, size_t size, uint64_t max_header, const kvm_st_rules *rules,
                         kvm_st_header *out, size_t *data_off) {
    memset(out, 0, sizeof *out);
    uint64_t hl = 0;
    kvmem_status st = kvm_st_header_len(file, size, max_header, &hl);
    if (st != KVMEM_OK) return st;
    if ((st = kvm_st_parse((const char *)file + 8, (size_t)hl, size - 8 - hl, rules, out)) != KVMEM_OK) return st;
    if ((st = kvm_st_check_layout(out, rules)) != KVMEM_OK) return st;
    *data_off = 8 + (size_t)hl;
    return KVMEM_OK;
}

const kvm_st_tensor *kvm_st_find(const kvm_st_header *h, const char *name) {
    size_t n = strlen(name);
    for (int32_t i = 0; i < h->n_tensors; i++)
        if (h->tensors[i].name_len == n && memcmp(h->tensors[i].name, name, n) == 0) return &h->tensors[i];
    return NULL;
}

const kvm_json *kvm_st_meta(const kvm_st_header *h, const char *key) {
    const kvm_json *v = h->meta ? kvm_json_get(&h->doc, h->meta, key) : NULL;
    return v && v->type == KVM_JSON_STRING ? v : NULL;
}
