/* The strict safetensors header parser (see st_reader.h), on top of the
 * project's own strict JSON reader (core/store/json.h): this file only
 * checks the safetensors shape of the parsed document. */
#include "st_reader.h"
#include "../store/json.h"

#include <stdlib.h>
#include <string.h>

static int key_is(const kvm_json *v, const char *k) {
    return v->key_len == strlen(k) && memcmp(v->key, k, v->key_len) == 0;
}

/* A non-negative integer no larger than max. */
static int uint_at_most(const kvm_json *v, uint64_t max, uint64_t *out) {
    if (v->type != KVM_JSON_NUMBER || !v->is_int || v->i < 0 || (uint64_t)v->i > max) return 0;
    *out = (uint64_t)v->i;
    return 1;
}

/* "__metadata__": an object of string values. */
static int metadata(const kvm_json_doc *doc, const kvm_json *m) {
    if (m->type != KVM_JSON_OBJECT) return 0;
    for (const kvm_json *c = kvm_json_child(doc, m); c; c = kvm_json_next(doc, c))
        if (c->type != KVM_JSON_STRING) return 0;
    return 1;
}

/* One tensor entry: exactly dtype, shape (<= 4 dims) and data_offsets. */
static int tensor(const kvm_json_doc *doc, const kvm_json *e, kvm_st_tensor *t) {
    if (e->type != KVM_JSON_OBJECT || e->n != 3) return 0;
    const kvm_json *dt = kvm_json_get(doc, e, "dtype"), *sh = kvm_json_get(doc, e, "shape"),
                   *off = kvm_json_get(doc, e, "data_offsets");
    if (!dt || !sh || !off || dt->type != KVM_JSON_STRING || sh->type != KVM_JSON_ARRAY ||
        off->type != KVM_JSON_ARRAY || sh->n > 4 || off->n != 2)
        return 0;
    if (strcmp(dt->str, "F32") == 0) t->dtype = KVMEM_F32;
    else if (strcmp(dt->str, "F16") == 0) t->dtype = KVMEM_F16;
    else if (strcmp(dt->str, "BF16") == 0) t->dtype = KVMEM_BF16;
    else return 0;
    t->ndim = 0;
    for (const kvm_json *d = kvm_json_child(doc, sh); d; d = kvm_json_next(doc, d)) {
        uint64_t v;
        if (!uint_at_most(d, (uint64_t)1 << 31, &v)) return 0;
        t->shape[t->ndim++] = (int64_t)v;
    }
    uint64_t b, e2;
    const kvm_json *o0 = kvm_json_child(doc, off);
    if (!uint_at_most(o0, SIZE_MAX, &b) || !uint_at_most(kvm_json_next(doc, o0), SIZE_MAX, &e2)) return 0;
    t->begin = (size_t)b;
    t->end = (size_t)e2;
    return 1;
}

static int by_begin(const void *a, const void *b) {
    const kvm_st_tensor *x = a, *y = b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

kvmem_status kvm_st_parse(const unsigned char *buf, size_t size, kvm_st_tensor *out, int *n_out,
                          size_t *data_off) {
    if (size < 8) return kvm_fail(KVMEM_ERR_FORMAT, "safetensors: %zu bytes, shorter than the 8-byte header length", size);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | buf[i];
    if (hl < 2 || hl > size - 8 || hl > ((uint64_t)100 << 20))
        return kvm_fail(KVMEM_ERR_FORMAT, "safetensors: the first 8 bytes are not a header length that fits the %zu-byte file",
                        size); /* the bytes themselves are not quoted: the file may be anything */
    /* A header is one JSON object; say so before any JSON detail. */
    const unsigned char *h0 = buf + 8, *h1 = buf + 8 + hl;
    while (h0 < h1 && (*h0 == ' ' || *h0 == '\t' || *h0 == '\n' || *h0 == '\r')) h0++;
    if (h0 == h1 || *h0 != '{') return kvm_fail(KVMEM_ERR_FORMAT, "safetensors: header is not a JSON object");
    kvm_json_doc doc;
    char jerr[160];
    int jr = kvm_json_parse((const char *)buf + 8, (size_t)hl, &doc, jerr, sizeof jerr);
    if (jr != 0) {
        if (jr == KVM_JSON_NOMEM) return kvm_fail(KVMEM_ERR_NOMEM, "safetensors: out of memory for the parsed JSON header");
        if (strstr(jerr, "duplicate"))
            return kvm_fail(KVMEM_ERR_FORMAT, "safetensors: a name appears twice in the header (%s)", jerr);
        return kvm_fail(KVMEM_ERR_FORMAT, "safetensors: header JSON is malformed: %s", jerr);
    }
    const kvm_json *root = &doc.nodes[0];
    kvmem_status bad = KVMEM_OK;
    int n = 0;
    for (const kvm_json *c = kvm_json_child(&doc, root); c && bad == KVMEM_OK; c = kvm_json_next(&doc, c)) {
        if (key_is(c, "__metadata__")) {
            if (!metadata(&doc, c))
                bad = kvm_fail(KVMEM_ERR_FORMAT, "safetensors: bad __metadata__ (must be one object of strings)");
            continue;
        }
        if (c->key_len >= sizeof out[0].name || memchr(c->key, '\0', c->key_len))
            bad = kvm_fail(KVMEM_ERR_FORMAT, "safetensors: bad or over-long tensor name '%.40s'", c->key);
        else if (n >= KVM_ST_MAX_TENSORS)
            bad = kvm_fail(KVMEM_ERR_FORMAT, "safetensors: more than %d tensors", KVM_ST_MAX_TENSORS);
        if (bad != KVMEM_OK) break;
        kvm_st_tensor *t = &out[n];
        memset(t, 0, sizeof *t);
        memcpy(t->name, c->key, c->key_len);
        if (!tensor(&doc, c, t))
            bad = kvm_fail(KVMEM_ERR_FORMAT, "safetensors: tensor '%s' needs dtype (F32/F16/BF16), shape "
                           "(<= 4 dims) and data_offsets, nothing else", t->name);
        n++;
    }
    kvm_json_free(&doc);
    if (bad != KVMEM_OK) return bad;
    size_t doff = 8 + (size_t)hl, dsize = size - doff;
    for (int i = 0; i < n; i++) {
        kvm_st_tensor *t = &out[i];
        uint64_t ne = 1;
        for (int d = 0; d < t->ndim; d++) {
            uint64_t e = (uint64_t)t->shape[d];
            if (e && ne > ((uint64_t)1 << 60) / e)
                return kvm_fail(KVMEM_ERR_CORRUPT, "safetensors: tensor '%s' is too large", t->name);
            ne *= e;
        }
        if (t->begin > t->end || t->end > dsize)
            return kvm_fail(KVMEM_ERR_CORRUPT, "safetensors: tensor '%s' data [%zu, %zu) outside the %zu data bytes",
                            t->name, t->begin, t->end, dsize);
        if (ne > SIZE_MAX / 4 || (uint64_t)(t->end - t->begin) != ne * kvm_dtype_size(t->dtype))
            return kvm_fail(KVMEM_ERR_CORRUPT, "safetensors: tensor '%s' has %zu data bytes for %llu %s elements",
                            t->name, t->end - t->begin, (unsigned long long)ne, kvmem_dtype_name(t->dtype));
    }
    kvm_st_tensor *sorted = kvm_malloc((size_t)(n ? n : 1) * sizeof *sorted);
    if (!sorted) return kvm_fail(KVMEM_ERR_NOMEM, "safetensors: out of memory for the tensor table (%d tensors)", n);
    memcpy(sorted, out, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, by_begin);
    int prev = -1; /* the last non-empty tensor: empty ones overlap nothing */
    for (int i = 0; i < n; i++) {
        if (sorted[i].begin == sorted[i].end) continue;
        if (prev >= 0 && sorted[i].begin < sorted[prev].end) {
            kvmem_status st = kvm_fail(KVMEM_ERR_CORRUPT, "safetensors: tensors '%s' and '%s' overlap",
                                       sorted[prev].name, sorted[i].name);
            kvm_free(sorted);
            return st;
        }
        prev = i;
    }
    kvm_free(sorted);
    *n_out = n;
    *data_off = doff;
    return KVMEM_OK;
}
