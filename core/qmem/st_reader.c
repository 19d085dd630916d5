/* The strict safetensors header parser (see st_reader.h). A recursive-
 * descent JSON reader just large enough for safetensors headers, which
 * never reads outside [buf, buf + size). */
#include "st_reader.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *p, *end;
} js;

static void ws(js *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int eat(js *j, char c) {
    ws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return 1;
    }
    return 0;
}

/* A JSON string into out (truncation is an error when out is given). */
static int str(js *j, char *out, size_t cap) {
    size_t n = 0;
    if (!eat(j, '"')) return 0;
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;
        if ((unsigned char)c < 0x20) return 0;
        if (c == '\\') {
            if (j->p >= j->end) return 0;
            char e = *j->p++;
            switch (e) {
            case '"': case '\\': case '/': c = e; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'u': /* kept opaque: names kvmem knows are plain ASCII */
                if (j->end - j->p < 4) return 0;
                for (int i = 0; i < 4; i++) {
                    char h = j->p[i];
                    if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F'))) return 0;
                }
                j->p += 4;
                c = '?';
                break;
            default: return 0;
            }
        }
        if (out) {
            if (n + 1 >= cap) return 0;
            out[n] = c;
        }
        n++;
    }
    if (j->p >= j->end) return 0;
    j->p++;
    if (out) out[n] = '\0';
    return 1;
}

static int uint(js *j, uint64_t *v) {
    ws(j);
    if (j->p >= j->end || *j->p < '0' || *j->p > '9') return 0;
    if (*j->p == '0' && j->end - j->p > 1 && j->p[1] >= '0' && j->p[1] <= '9') return 0; /* no leading zeros */
    uint64_t x = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        if (x > (UINT64_MAX - 9) / 10) return 0;
        x = x * 10 + (uint64_t)(*j->p++ - '0');
    }
    *v = x;
    return 1;
}

/* "__metadata__": an object of string values. */
static int metadata(js *j) {
    if (!eat(j, '{')) return 0;
    if (eat(j, '}')) return 1;
    do {
        if (!str(j, NULL, 0) || !eat(j, ':') || !str(j, NULL, 0)) return 0;
    } while (eat(j, ','));
    return eat(j, '}');
}

static int tensor(js *j, kvm_st_tensor *t) {
    int have_dtype = 0, have_shape = 0, have_off = 0;
    if (!eat(j, '{')) return 0;
    do {
        char key[32];
        if (!str(j, key, sizeof key) || !eat(j, ':')) return 0;
        if (strcmp(key, "dtype") == 0 && !have_dtype) {
            char dt[16];
            if (!str(j, dt, sizeof dt)) return 0;
            if (strcmp(dt, "F32") == 0) t->dtype = KVMEM_F32;
            else if (strcmp(dt, "F16") == 0) t->dtype = KVMEM_F16;
            else if (strcmp(dt, "BF16") == 0) t->dtype = KVMEM_BF16;
            else return 0;
            have_dtype = 1;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            if (!eat(j, '[')) return 0;
            t->ndim = 0;
            if (!eat(j, ']')) {
                do {
                    uint64_t v;
                    if (t->ndim >= 4 || !uint(j, &v) || v > (uint64_t)1 << 31) return 0;
                    t->shape[t->ndim++] = (int64_t)v;
                } while (eat(j, ','));
                if (!eat(j, ']')) return 0;
            }
            have_shape = 1;
        } else if (strcmp(key, "data_offsets") == 0 && !have_off) {
            uint64_t b, e;
            if (!eat(j, '[') || !uint(j, &b) || !eat(j, ',') || !uint(j, &e) || !eat(j, ']')) return 0;
            if (b > SIZE_MAX || e > SIZE_MAX) return 0;
            t->begin = (size_t)b;
            t->end = (size_t)e;
            have_off = 1;
        } else {
            return 0; /* unknown or repeated key */
        }
    } while (eat(j, ','));
    return eat(j, '}') && have_dtype && have_shape && have_off;
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
        return kvm_fail(KVMEM_ERR_FORMAT, "safetensors: header length %llu does not fit the %zu-byte file",
                        (unsigned long long)hl, size);
    js j = {(const char *)buf + 8, (const char *)buf + 8 + hl};
    int n = 0, have_meta = 0;
    if (!eat(&j, '{')) return kvm_fail(KVMEM_ERR_FORMAT, "safetensors: header is not a JSON object");
    if (!eat(&j, '}')) {
        do {
            char name[64];
            if (!str(&j, name, sizeof name) || !eat(&j, ':'))
                return kvm_fail(KVMEM_ERR_FORMAT, "safetensors: bad or over-long tensor name near byte %zu",
                                (size_t)(j.p - (const char *)buf));
            if (strcmp(name, "__metadata__") == 0) {
                if (have_meta || !metadata(&j))
                    return kvm_fail(KVMEM_ERR_FORMAT, "safetensors: bad __metadata__ (must be one object of strings)");
                have_meta = 1;
                continue;
            }
            for (int i = 0; i < n; i++)
                if (strcmp(out[i].name, name) == 0)
                    return kvm_fail(KVMEM_ERR_FORMAT, "safetensors: tensor '%s' appears twice", name);
            if (n >= KVM_ST_MAX_TENSORS)
                return kvm_fail(KVMEM_ERR_FORMAT, "safetensors: more than %d tensors", KVM_ST_MAX_TENSORS);
            kvm_st_tensor *t = &out[n];
            memset(t, 0, sizeof *t);
            memcpy(t->name, name, sizeof name);
            if (!tensor(&j, t))
                return kvm_fail(KVMEM_ERR_FORMAT, "safetensors: tensor '%s' needs dtype (F32/F16/BF16), shape "
                                "(<= 4 dims) and data_offsets, nothing else", name);
            n++;
        } while (eat(&j, ','));
        if (!eat(&j, '}')) return kvm_fail(KVMEM_ERR_FORMAT, "safetensors: header JSON object is not closed");
    }
    ws(&j);
    if (j.p != j.end) return kvm_fail(KVMEM_ERR_FORMAT, "safetensors: trailing bytes after the header JSON");
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
    kvm_st_tensor *sorted = malloc((size_t)(n ? n : 1) * sizeof *sorted);
    if (!sorted) return kvm_fail(KVMEM_ERR_NOMEM, "safetensors: out of memory");
    memcpy(sorted, out, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, by_begin);
    int prev = -1; /* the last non-empty tensor: empty ones overlap nothing */
    for (int i = 0; i < n; i++) {
        if (sorted[i].begin == sorted[i].end) continue;
        if (prev >= 0 && sorted[i].begin < sorted[prev].end) {
            kvmem_status st = kvm_fail(KVMEM_ERR_CORRUPT, "safetensors: tensors '%s' and '%s' overlap",
                                       sorted[prev].name, sorted[i].name);
            free(sorted);
            return st;
        }
        prev = i;
    }
    free(sorted);
    *n_out = n;
    *data_off = doff;
    return KVMEM_OK;
}
