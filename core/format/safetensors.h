/* The one strict safetensors header reader (internal): the agent loader
 * (core/pool/agent_file.c), the residual head (core/qmem/head.c) and
 * `kvmem inspect` all read headers through it, so one piece of code is
 * fuzzed and trusted (tests/fuzz/fuzz_loader.c).
 *
 * A file is [u64 LE header length N][N bytes of JSON][data section]. The
 * reader knows nothing of pools, agents or stores: it takes bytes and says
 * whether they are a well-formed safetensors header, in three steps, so a
 * caller can put its own checks in between (the agent loader matches names,
 * dtypes and shapes against its plan before layout, and quotes no name of a
 * file until the file has shown itself to be an agent file):
 *
 *   kvm_st_header_len   the first 8 bytes against the file size
 *   kvm_st_parse        JSON (core/format/json.h: depth-limited, duplicate
 *                       member names, UTF-8, finite numbers) and the entries:
 *                       "__metadata__" an object of NUL-free strings; every
 *                       other member a tensor with exactly dtype (a
 *                       safetensors dtype the caller accepts), shape
 *                       (non-negative integers) and data_offsets [begin, end]
 *                       (integers, begin <= end); names NUL-free
 *   kvm_st_check_layout every tensor inside the data section, its byte span
 *                       equal to its shape times its element size, its begin
 *                       a multiple of its element size (unless it is empty),
 *                       and the tensors
 *                       tiling the data section: no overlap, no hole, no
 *                       trailing byte (the safetensors crate's own rule)
 *
 * Codes follow kvmem.h: KVMEM_ERR_FORMAT for what is malformed (JSON,
 * entries, misaligned offsets), KVMEM_ERR_CORRUPT for a well-formed header
 * that disagrees with the file (out of range, overlapping, holes, trailing
 * bytes, sizes), KVMEM_ERR_NOMEM. Messages name what was wrong and quote no
 * byte of the file unless the caller allows tensor and key names (quote). */
#ifndef KVMEM_FORMAT_SAFETENSORS_H
#define KVMEM_FORMAT_SAFETENSORS_H

#include "json.h"
#include "../internal.h"

#include <stdint.h>

#define KVM_ST_MAX_DIMS 8

/* The dtypes of the safetensors specification. */
typedef enum kvm_st_dtype {
    KVM_ST_BOOL, KVM_ST_U8, KVM_ST_I8, KVM_ST_F8_E5M2, KVM_ST_F8_E4M3, KVM_ST_I16, KVM_ST_U16, KVM_ST_F16,
    KVM_ST_BF16, KVM_ST_I32, KVM_ST_U32, KVM_ST_F32, KVM_ST_F64, KVM_ST_I64, KVM_ST_U64, KVM_ST_N_DTYPES
} kvm_st_dtype;
#define KVM_ST_DTYPE_BIT(d) (1u << (d))
#define KVM_ST_ALL_DTYPES ((1u << KVM_ST_N_DTYPES) - 1u)

const char *kvm_st_dtype_name(kvm_st_dtype d); /* "F32" */
size_t kvm_st_dtype_size(kvm_st_dtype d);      /* bytes per element */

typedef struct kvm_st_tensor {
    const char *name; /* in the parsed document: NUL-terminated, NUL-free */
    size_t name_len;
    kvm_st_dtype dtype;
    int32_t ndim;
    uint64_t shape[KVM_ST_MAX_DIMS];
    uint64_t begin, end; /* byte offsets in the data section */
    const kvm_json *node; /* its JSON entry */
} kvm_st_tensor;

typedef struct kvm_st_rules {
    uint32_t dtypes;     /* KVM_ST_DTYPE_BIT mask of accepted dtypes */
    int32_t max_tensors; /* more is KVMEM_ERR_FORMAT; 0 = no limit */
    int32_t max_dims;    /* at most KVM_ST_MAX_DIMS; 0 = KVM_ST_MAX_DIMS */
    int32_t quote;       /* 1: messages may name tensors and metadata keys */
    int32_t require_meta; /* 1: a header without a "__metadata__" object is KVMEM_ERR_FORMAT */
    /* (optional) NULL-terminated metadata keys the caller expects: messages
     * may name these even with quote 0 (their text is the caller's own). */
    const char *const *known_keys;
} kvm_st_rules;

/* Every dtype, no tensor limit, names not quoted. */
kvm_st_rules kvm_st_default_rules(void);

typedef struct kvm_st_header {
    uint64_t header_len, data_size; /* data_size: file size - 8 - header_len */
    kvm_json_doc doc;               /* the parsed JSON; empty if it did not parse */
    const kvm_json *root;           /* the root object, or NULL */
    const kvm_json *meta;           /* "__metadata__", or NULL */
    kvm_st_tensor *tensors;         /* in header order */
    int32_t n_tensors;
} kvm_st_header;

/* The header length from the first 8 bytes of a file of file_size bytes:
 * FORMAT when it is outside [2, max_header] (not a safetensors file: the
 * value is not quoted), CORRUPT when it runs past the end of the file. */
kvmem_status kvm_st_header_len(const unsigned char first8[8], uint64_t file_size, uint64_t max_header,
                               uint64_t *header_len);

/* Parse the header_len bytes of JSON (json) of a file whose data section
 * has data_size bytes. *out is always initialised and must be released with
 * kvm_st_header_free, also on failure: when the JSON itself parsed, out->doc
 * (and root, meta) stay readable, so a tool can describe a file the reader
 * refuses. Nothing in out is trustworthy unless KVMEM_OK is returned. */
kvmem_status kvm_st_parse(const char *json, size_t header_len, uint64_t data_size, const kvm_st_rules *rules,
                          kvm_st_header *out);

/* The layout rules above over a header kvm_st_parse accepted. */
kvmem_status kvm_st_check_layout(const kvm_st_header *h, const kvm_st_rules *rules);

/* kvm_st_header_len, kvm_st_parse and kvm_st_check_layout over a whole
 * file image in memory; *data_off: where the data section starts. */
kvmem_status kvm_st_read(const unsigned char *file, size_t size, uint64_t max_header, const kvm_st_rules *rules,
                         kvm_st_header *out, size_t *data_off);

/* The tensor named `name` (NULL if none). */
const kvm_st_tensor *kvm_st_find(const kvm_st_header *h, const char *name);

/* A string member of "__metadata__" (NULL if absent). */
const kvm_json *kvm_st_meta(const kvm_st_header *h, const char *key);

void kvm_st_header_free(kvm_st_header *h);

#endif
