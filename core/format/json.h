/* kvmem's own strict JSON reader (RFC 8259), small enough to audit, for
 * safetensors headers that may be hostile: bounded depth, no duplicate keys,
 * strings validated as UTF-8 with escapes decoded, numbers kept as text plus
 * an exact int64 when they are integers, numbers beyond a double's range
 * (1e999: not finite) refused, nothing after the value except whitespace.
 * Never reads outside [s, s + n). The safetensors reader
 * (core/format/safetensors.h) is its user. Beside it, the small writer the
 * agent-file format (core/format/agent_file.h) builds its headers with. */
#ifndef KVMEM_JSON_H
#define KVMEM_JSON_H

#include "../internal.h"

#include <stddef.h>
#include <stdint.h>

#define KVM_JSON_MAX_DEPTH 32
#define KVM_JSON_MAX_MEMBERS 16384 /* per object/array: duplicate checks stay cheap */

typedef enum kvm_json_type {
    KVM_JSON_NULL, KVM_JSON_FALSE, KVM_JSON_TRUE, KVM_JSON_NUMBER, KVM_JSON_STRING, KVM_JSON_ARRAY,
    KVM_JSON_OBJECT
} kvm_json_type;

typedef struct kvm_json {
    kvm_json_type type;
    int32_t is_int;     /* NUMBER: 1 if an integer that fits int64 */
    int64_t i;          /* NUMBER with is_int */
    const char *str;    /* STRING: decoded, NUL-terminated (may hold NUL); NUMBER: its text */
    size_t len;         /* STRING/NUMBER: bytes of str */
    const char *key;    /* member of an OBJECT: decoded key, else NULL */
    size_t key_len;
    int32_t n;          /* ARRAY/OBJECT: number of children */
    int32_t first;      /* index of the first child, -1 if none */
    int32_t next;       /* index of the next sibling, -1 if last */
} kvm_json;


typedef struct kvm_json_doc {
    kvm_json *nodes; /* nodes[0] is the root */
    int32_t n_nodes, cap_nodes;
    char *strings;   /* decoded strings */
    size_t n_str, cap_str;
} kvm_json_doc;

/* Parse s[0..n). Returns 0, or KVM_JSON_BAD (malformed) or KVM_JSON_NOMEM
 * (out of memory: says nothing about the text) with a message into err that
 * names the byte offset but quotes no bytes of the input. The document is
 * freed on failure. */
#define KVM_JSON_BAD (-1)
#define KVM_JSON_NOMEM (-2)
int kvm_json_parse(const char *s, size_t n, kvm_json_doc *doc, char *err, size_t err_size);
void kvm_json_free(kvm_json_doc *doc);

/* Member `key` of an object node (NULL if absent or not an object). */
const kvm_json *kvm_json_get(const kvm_json_doc *doc, const kvm_json *obj, const char *key);
static inline const kvm_json *kvm_json_child(const kvm_json_doc *doc, const kvm_json *v) {
    return v->first >= 0 ? &doc->nodes[v->first] : NULL;
}
static inline const kvm_json *kvm_json_next(const kvm_json_doc *doc, const kvm_json *v) {
    return v->next >= 0 ? &doc->nodes[v->next] : NULL;
}

/* 1 if s[0..n) is valid UTF-8 by the reader's rules (no overlong forms, no
 * surrogates, nothing past U+10FFFF). */
int kvm_json_utf8_valid(const char *s, size_t n);

/* ---- writing ----
 * A growable text buffer. A failure (out of memory, a size past what
 * size_t counts) sticks in `oom` and makes later calls do nothing, so a
 * writer checks once, at the end. s is NUL-terminated while n > 0. */
typedef struct kvm_jbuf {
    char *s;
    size_t n, cap;
    int oom;
} kvm_jbuf;

void kvm_jbuf_put(kvm_jbuf *b, const char *s, size_t n);
void kvm_jbuf_puts(kvm_jbuf *b, const char *s);
void kvm_jbuf_fmt(kvm_jbuf *b, const char *fmt, ...) KVMEM_PRINTF(2, 3);
/* s[0..n) as a JSON string (quoted; '"', '\\' and control characters
 * escaped). The bytes must be valid UTF-8 without NUL for the reader to take
 * them back (kvm_json_utf8_valid). */
void kvm_jbuf_str(kvm_jbuf *b, const char *s, size_t n);
void kvm_jbuf_free(kvm_jbuf *b);

#endif
