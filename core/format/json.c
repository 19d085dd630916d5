/* Strict JSON reader: recursive descent over a byte range, every access
 * bounds-checked, depth-limited, duplicate keys refused; and the small
 * writer kvmem's own headers are built with. */
#include "json.h"
#include "../internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct parser {
    const char *s;
    size_t n, pos;
    kvm_json_doc *doc;
    char *err;
    size_t err_size;
    int failed;
    int oom;
} parser;

static int fail(parser *p, const char *fmt, ...) {
    if (!p->failed) {
        char msg[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        if (p->err && p->err_size) snprintf(p->err, p->err_size, "JSON header, byte %zu: %s", p->pos, msg);
    }
    p->failed = 1;
    return -1;
}

static void skip_ws(parser *p) {
    while (p->pos < p->n) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int32_t new_node(parser *p, kvm_json_type t) {
    kvm_json_doc *d = p->doc;
    if (d->n_nodes == d->cap_nodes) {
        size_t nc;
        if (!kvm_grow_cap((size_t)d->cap_nodes, (size_t)d->n_nodes + 1, 64, INT32_MAX, sizeof(kvm_json), &nc))
            return fail(p, "too many values");
        kvm_json *nn = kvm_realloc(d->nodes, nc * sizeof *nn);
        if (!nn) {
            p->oom = 1;
            return fail(p, "out of memory for %zu values", nc);
        }
        d->nodes = nn;
        d->cap_nodes = (int32_t)nc;
    }
    kvm_json *v = &d->nodes[d->n_nodes];
    memset(v, 0, sizeof *v);
    v->type = t;
    v->first = v->next = -1;
    return d->n_nodes++;
}

static void put_byte(parser *p, char c) { p->doc->strings[p->doc->n_str++] = c; }

static int hex4(parser *p, uint32_t *out) {
    if (p->n - p->pos < 4) return fail(p, "truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->pos + (size_t)i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return fail(p, "bad hex digit in \\u escape");
    }
    p->pos += 4;
    *out = v;
    return 0;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t k;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) k = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) k = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) k = 4, cp = c & 0x07;
    else return 0;
    if (n < k) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((k == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return k;
}

/* Decode a string at p->pos (the opening quote) into the string buffer. */
static int parse_string(parser *p, size_t *off, size_t *len) {
    p->pos++; /* opening quote */
    *off = p->doc->n_str;
    for (;;) {
        if (p->pos >= p->n) return fail(p, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) return fail(p, "control character in a string");
        if (c == '\\') {
            p->pos++;
            if (p->pos >= p->n) return fail(p, "unterminated escape");
            char e = p->s[p->pos++];
            switch (e) {
            case '"': put_byte(p, '"'); break;
            case '\\': put_byte(p, '\\'); break;
            case '/': put_byte(p, '/'); break;
            case 'b': put_byte(p, '\b'); break;
            case 'f': put_byte(p, '\f'); break;
            case 'n': put_byte(p, '\n'); break;
            case 'r': put_byte(p, '\r'); break;
            case 't': put_byte(p, '\t'); break;
            case 'u': {
                uint32_t cp;
                if (hex4(p, &cp)) return -1;
                if (cp >= 0xdc00 && cp <= 0xdfff) return fail(p, "lone low surrogate");
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    uint32_t lo;
                    if (p->n - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                        return fail(p, "high surrogate without a low one");
                    p->pos += 2;
                    if (hex4(p, &lo)) return -1;
                    if (lo < 0xdc00 || lo > 0xdfff) return fail(p, "bad low surrogate");
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                }
                if (cp < 0x80) {
                    put_byte(p, (char)cp);
                } else if (cp < 0x800) {
                    put_byte(p, (char)(0xc0 | (cp >> 6)));
                    put_byte(p, (char)(0x80 | (cp & 0x3f)));
                } else if (cp < 0x10000) {
                    put_byte(p, (char)(0xe0 | (cp >> 12)));
                    put_byte(p, (char)(0x80 | ((cp >> 6) & 0x3f)));
                    put_byte(p, (char)(0x80 | (cp & 0x3f)));
                } else {
                    put_byte(p, (char)(0xf0 | (cp >> 18)));
                    put_byte(p, (char)(0x80 | ((cp >> 12) & 0x3f)));
                    put_byte(p, (char)(0x80 | ((cp >> 6) & 0x3f)));
                    put_byte(p, (char)(0x80 | (cp & 0x3f)));
                }
                break;
            }
            default: return fail(p, "bad escape");
            }
            continue;
        }
        size_t k = utf8_len((const unsigned char *)p->s + p->pos, p->n - p->pos);
        if (!k) return fail(p, "invalid UTF-8 in string");
        for (size_t i = 0; i < k; i++) put_byte(p, p->s[p->pos + i]);
        p->pos += k;
    }
    *len = p->doc->n_str - *off;
    put_byte(p, '\0');
    return 0;
}

/* Would the decimal number with significant digits sig[0..n) (no leading
 * zero; `more`: a nonzero digit follows them) times 10^e10, e10 the
 * exponent of sig[0], be infinite as a double? Compared against DBL_MAX as
 * printed with 17 digits, so a value a rounding step above it is refused too. */
static int beyond_double(const char *sig, size_t n, int more, long e10) {
    static const char k_max[] = "17976931348623157"; /* DBL_MAX = 1.7976931348623157e308 */
    if (n == 0) return 0; /* zero */
    if (e10 != 308) return e10 > 308;
    for (size_t i = 0; i < sizeof k_max - 1; i++) {
        char c = i < n ? sig[i] : '0';
        if (c != k_max[i]) return c > k_max[i];
    }
    for (size_t i = sizeof k_max - 1; i < n; i++)
        if (sig[i] != '0') return 1; /* above DBL_MAX's digits */
    return more;
}

static int parse_number(parser *p, int32_t node) {
    size_t b = p->pos;
    const char *s = p->s;
    int neg = 0;
    if (p->pos < p->n && s[p->pos] == '-') neg = 1, p->pos++;
    if (p->pos >= p->n) return fail(p, "truncated number");
    int is_int = 1;
    uint64_t mag = 0;
    int overflow = 0;
    /* significant digits and the decimal exponent of the first one, for the
     * finiteness rule: a header number must be finite as a double */
    char sig[20];
    size_t n_sig = 0;
    int more = 0;
    long e10 = -1; /* the exponent of the first significant digit, before the 'e' part */
    long int_digits = 0, lead_frac_zeros = 0;
    if (s[p->pos] == '0') {
        p->pos++;
    } else if (s[p->pos] >= '1' && s[p->pos] <= '9') {
        while (p->pos < p->n && s[p->pos] >= '0' && s[p->pos] <= '9') {
            unsigned dgt = (unsigned)(s[p->pos] - '0');
            if (mag > (UINT64_MAX - dgt) / 10) overflow = 1;
            else mag = mag * 10 + dgt;
            if (n_sig < sizeof sig) sig[n_sig++] = s[p->pos];
            else more |= dgt != 0;
            if (int_digits < 100000) int_digits++;
            p->pos++;
        }
    } else {
        return fail(p, "bad number");
    }
    if (p->pos < p->n && s[p->pos] == '.') {
        is_int = 0;
        p->pos++;
        if (p->pos >= p->n || s[p->pos] < '0' || s[p->pos] > '9') return fail(p, "bad fraction");
        while (p->pos < p->n && s[p->pos] >= '0' && s[p->pos] <= '9') {
            char c = s[p->pos++];
            if (n_sig == 0 && c == '0') {
                if (lead_frac_zeros < 100000) lead_frac_zeros++;
                continue;
            }
            if (n_sig < sizeof sig) sig[n_sig++] = c;
            else more |= c != '0';
        }
    }
    long ex = 0;
    if (p->pos < p->n && (s[p->pos] == 'e' || s[p->pos] == 'E')) {
        is_int = 0;
        p->pos++;
        int eneg = 0;
        if (p->pos < p->n && (s[p->pos] == '+' || s[p->pos] == '-')) eneg = s[p->pos++] == '-';
        if (p->pos >= p->n || s[p->pos] < '0' || s[p->pos] > '9') return fail(p, "bad exponent");
        while (p->pos < p->n && s[p->pos] >= '0' && s[p->pos] <= '9') {
            if (ex < 1000000) ex = ex * 10 + (s[p->pos] - '0'); /* saturates: far beyond any double */
            p->pos++;
        }
        if (eneg) ex = -ex;
    }
    e10 = (int_digits ? int_digits - 1 : -(lead_frac_zeros + 1)) + ex;
    if (beyond_double(sig, n_sig, more, e10)) return fail(p, "number beyond the range of a double (not finite)");
    kvm_json *v = &p->doc->nodes[node];
    if (is_int && !overflow && (neg ? mag <= (uint64_t)INT64_MAX + 1 : mag <= (uint64_t)INT64_MAX)) {
        v->is_int = 1;
        v->i = neg ? (mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
    }
    v->len = p->pos - b;
    v->str = (const char *)(uintptr_t)p->doc->n_str; /* fixed up after parsing */
    for (size_t i = b; i < p->pos; i++) put_byte(p, s[i]);
    put_byte(p, '\0');
    return 0;
}

static int parse_value(parser *p, int32_t *out, int depth);

static int literal(parser *p, const char *word) {
    size_t k = strlen(word);
    if (p->n - p->pos < k || memcmp(p->s + p->pos, word, k) != 0) return fail(p, "unexpected character");
    p->pos += k;
    return 0;
}

static int parse_container(parser *p, int32_t node, int depth, int is_obj) {
    p->pos++;
    skip_ws(p);
    char close = is_obj ? '}' : ']';
    if (p->pos < p->n && p->s[p->pos] == close) {
        p->pos++;
        return 0;
    }
    int32_t last = -1, count = 0;
    for (;;) {
        size_t koff = 0, klen = 0;
        if (is_obj) {
            skip_ws(p);
            if (p->pos >= p->n || p->s[p->pos] != '"') return fail(p, "expected a member name");
            if (parse_string(p, &koff, &klen)) return -1;
            /* duplicate keys are refused: two readers could pick different ones */
            for (int32_t c = p->doc->nodes[node].first; c >= 0; c = p->doc->nodes[c].next) {
                const kvm_json *m = &p->doc->nodes[c];
                if (m->key_len == klen && memcmp(p->doc->strings + ((size_t)(uintptr_t)m->key - 1), p->doc->strings + koff, klen) == 0)
                    return fail(p, "duplicate member name (a name appears twice in one object)");
            }
            skip_ws(p);
            if (p->pos >= p->n || p->s[p->pos] != ':') return fail(p, "expected ':'");
            p->pos++;
        }
        int32_t child;
        if (parse_value(p, &child, depth + 1)) return -1;
        if (is_obj) {
            p->doc->nodes[child].key = (const char *)(uintptr_t)(koff + 1);
            p->doc->nodes[child].key_len = klen;
        }
        if (last < 0) p->doc->nodes[node].first = child;
        else p->doc->nodes[last].next = child;
        last = child;
        if (count >= KVM_JSON_MAX_MEMBERS) return fail(p, "more than %d members in one %s", KVM_JSON_MAX_MEMBERS, is_obj ? "object" : "array");
        count++;
        p->doc->nodes[node].n = count;
        skip_ws(p);
        if (p->pos >= p->n) return fail(p, "unterminated %s", is_obj ? "object" : "array");
        char c = p->s[p->pos++];
        if (c == close) return 0;
        if (c != ',') return fail(p, "expected ',' or '%c'", close);
    }
}

static int parse_value(parser *p, int32_t *out, int depth) {
    if (depth > KVM_JSON_MAX_DEPTH) return fail(p, "nesting deeper than %d", KVM_JSON_MAX_DEPTH);
    skip_ws(p);
    if (p->pos >= p->n) return fail(p, "expected a value");
    char c = p->s[p->pos];
    int32_t node;
    switch (c) {
    case '{':
    case '[':
        if ((node = new_node(p, c == '{' ? KVM_JSON_OBJECT : KVM_JSON_ARRAY)) < 0) return -1;
        *out = node;
        return parse_container(p, node, depth, c == '{');
    case '"': {
        if ((node = new_node(p, KVM_JSON_STRING)) < 0) return -1;
        size_t off, len;
        if (parse_string(p, &off, &len)) return -1;
        p->doc->nodes[node].str = (const char *)(uintptr_t)off;
        p->doc->nodes[node].len = len;
        *out = node;
        return 0;
    }
    case 't':
        if ((node = new_node(p, KVM_JSON_TRUE)) < 0) return -1;
        *out = node;
        return literal(p, "true");
    case 'f':
        if ((node = new_node(p, KVM_JSON_FALSE)) < 0) return -1;
        *out = node;
        return literal(p, "false");
    case 'n':
        if ((node = new_node(p, KVM_JSON_NULL)) < 0) return -1;
        *out = node;
        return literal(p, "null");
    default:
        if (c == '-' || (c >= '0' && c <= '9')) {
            if ((node = new_node(p, KVM_JSON_NUMBER)) < 0) return -1;
            *out = node;
            return parse_number(p, node);
        }
        return fail(p, "unexpected character");
    }
}

void kvm_json_free(kvm_json_doc *doc) {
    if (!doc) return;
    kvm_free(doc->nodes);
    kvm_free(doc->strings);
    memset(doc, 0, sizeof *doc);
}

int kvm_json_parse(const char *s, size_t n, kvm_json_doc *doc, char *err, size_t err_size) {
    memset(doc, 0, sizeof *doc);
    parser p = {s, n, 0, doc, err, err_size, 0, 0};
    /* decoded strings never outgrow their source (plus one NUL per value) */
    if (n > (SIZE_MAX - 2) / 2) return fail(&p, "too large");
    doc->cap_str = 2 * n + 2;
    doc->strings = kvm_malloc(doc->cap_str);
    if (!doc->strings) {
        fail(&p, "out of memory for %zu bytes of strings", doc->cap_str);
        kvm_json_free(doc);
        return KVM_JSON_NOMEM;
    }
    int32_t root;
    if (parse_value(&p, &root, 0) == 0) {
        skip_ws(&p);
        if (p.pos != n) fail(&p, "trailing characters after the value");
    }
    if (p.failed) {
        kvm_json_free(doc);
        return p.oom ? KVM_JSON_NOMEM : KVM_JSON_BAD;
    }
    for (int32_t i = 0; i < doc->n_nodes; i++) {
        kvm_json *v = &doc->nodes[i];
        if (v->type == KVM_JSON_STRING || v->type == KVM_JSON_NUMBER) v->str = doc->strings + (size_t)(uintptr_t)v->str;
        if (v->key) v->key = doc->strings + ((size_t)(uintptr_t)v->key - 1); /* offsets were stored + 1 */
    }
    return 0;
}

const kvm_json *kvm_json_get(const kvm_json_doc *doc, const kvm_json *obj, const char *key) {
    if (!obj || obj->type != KVM_JSON_OBJECT) return NULL;
    size_t k = strlen(key);
    for (int32_t c = obj->first; c >= 0; c = doc->nodes[c].next) {
        const kvm_json *m = &doc->nodes[c];
        if (m->key_len == k && memcmp(m->key, key, k) == 0) return m;
    }
    return NULL;
}

int kvm_json_utf8_valid(const char *s, size_t n) {
    for (size_t i = 0, k; i < n; i += k)
        if (!(k = utf8_len((const unsigned char *)s + i, n - i))) return 0;
    return 1;
}

/* ---- writing ---- */

void kvm_jbuf_put(kvm_jbuf *b, const char *s, size_t n) {
    if (b->oom || n == 0) return;
    size_t need;
    if (!kvm_add_size(b->n, n, &need) || !kvm_add_size(need, 1, &need)) {
        b->oom = 1;
        return;
    }
    if (need > b->cap) {
        size_t nc;
        char *ns = kvm_grow_cap(b->cap, need, 4096, PTRDIFF_MAX, 1, &nc) ? kvm_realloc(b->s, nc) : NULL;
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = nc;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

void kvm_jbuf_puts(kvm_jbuf *b, const char *s) { kvm_jbuf_put(b, s, strlen(s)); }

void kvm_jbuf_fmt(kvm_jbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) {
        b->oom = 1;
        return;
    }
    if ((size_t)k < sizeof tmp) {
        kvm_jbuf_put(b, tmp, (size_t)k);
        return;
    }
    char *big = kvm_malloc((size_t)k + 1); /* a long piece: formatted again at its length */
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)k + 1, fmt, ap);
    va_end(ap);
    kvm_jbuf_put(b, big, (size_t)k);
    kvm_free(big);
}

void kvm_jbuf_str(kvm_jbuf *b, const char *s, size_t n) {
    kvm_jbuf_put(b, "\"", 1);
    size_t run = 0; /* bytes copied as they are, flushed before an escape */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : NULL;
        if (!esc && c >= 0x20) continue;
        kvm_jbuf_put(b, s + run, i - run);
        run = i + 1;
        if (esc) kvm_jbuf_puts(b, esc);
        else kvm_jbuf_fmt(b, "\\u%04x", c);
    }
    kvm_jbuf_put(b, s + run, n - run);
    kvm_jbuf_put(b, "\"", 1);
}

void kvm_jbuf_free(kvm_jbuf *b) {
    kvm_free(b->s);
    memset(b, 0, sizeof *b);
}
