/* The agent file format (internal): one agent's memory as a safetensors
 * file, every fact of it in one place, the metadata key names, which
 * tensors a file of a given geometry holds and in which order, the header
 * writer, the metadata reader and the checksum rule (docs/format.md is the
 * specification). It knows nothing of pools or stores: the pool
 * (core/pool/agent_io.c) moves an agent's bytes to and from a store
 * through it; `kvmem inspect` reads files with it. Headers are read by the
 * one strict safetensors reader (safetensors.h).
 *
 * Order of a load, for the pool:
 *   kvm_st_header_len, kvm_st_parse with kvm_af_rules()
 *   kvm_af_check_meta        the metadata against what the pool expects
 *   kvm_af_block_lengths     the sealed blocks and the tail
 *   kvm_af_plan_build, kvm_af_plan_match, kvm_st_check_layout
 *   kvm_af_text, kvm_af_token_ids, kvm_af_token_offsets
 *   the data section, its checksum (kvm_af_checksum_combine) compared
 * Until kvm_af_check_meta succeeds a file has not shown itself to be an
 * agent file, and no message quotes its bytes. */
#ifndef KVMEM_FORMAT_AGENT_FILE_H
#define KVMEM_FORMAT_AGENT_FILE_H

#include "hash.h"
#include "json.h"
#include "safetensors.h"

#include <stdint.h>

#define KVM_AF_VERSION 2 /* written; 1 is still read (docs/format.md) */
#define KVM_AF_MAX_HEADER ((uint64_t)64 << 20) /* longer JSON headers are refused */
#define KVM_AF_CHUNK ((uint64_t)1 << 20)       /* the checksum's chunk of the data section */

/* The metadata keys, in the order a file holds them. */
typedef enum kvm_af_key {
    KVM_AF_FORMAT,
    KVM_AF_FORMAT_VERSION,
    KVM_AF_AGENT_ID,
    KVM_AF_MODEL_ID,
    KVM_AF_MODEL_SPEC,
    KVM_AF_STORAGE_DTYPE,
    KVM_AF_BLOCK_SIZE,
    KVM_AF_N_TOKENS,
    KVM_AF_BLOCK_TOKENS,
    KVM_AF_TOKEN_IDS,
    KVM_AF_TOKEN_TEXT_OFFSETS,
    KVM_AF_TEXT,     /* the text when it is UTF-8 without NUL */
    KVM_AF_TEXT_HEX, /* else the text as lowercase hex */
    KVM_AF_CHECKSUM,
    KVM_AF_N_KEYS
} kvm_af_key;

/* Their names, NULL-terminated (kvm_st_rules.known_keys). */
extern const char *const kvm_af_keys[KVM_AF_N_KEYS + 1];
#define KVM_AF_MAGIC "kvmem-agent" /* the value of "format" */

/* The reader's rules for an agent file's header: its dtypes, a metadata
 * object required, the keys above nameable in messages. */
kvm_st_rules kvm_af_rules(void);

/* ---- the model spec as one canonical string ----
 * "n_layers=..;n_q_heads=..;...;layer_window=w0,w1,..": equal strings, equal
 * geometry and RoPE. */
void kvm_af_spec_write(const kvmem_model_spec *s, kvm_jbuf *b);
/* Read one back: every field, in order, exactly as written (KVMEM_ERR_FORMAT
 * otherwise). window: room for max_layers entries (spec->layer_window
 * points there, or is NULL when all are 0). model_id is left as it was. */
kvmem_status kvm_af_spec_read(const char *s, size_t n, kvmem_model_spec *spec, int32_t *window, int32_t max_layers);

/* ---- the tensors of a file ---- */

/* What a file's layout follows from: the pool's geometry and storage. */
typedef struct kvm_af_geom {
    int32_t n_layers, n_kv_heads, head_dim, block_size;
    kvmem_dtype dtype;   /* storage dtype */
    int32_t aabb_esize;  /* bytes per AABB element: 2 (f16) or 4 (f32) */
} kvm_af_geom;

/* What a tensor holds (the pool maps each to its memory). */
typedef enum kvm_af_kind {
    KVM_AF_T_KV,    /* raw layer_{L}_k|v, or version 1 quantized layer_{L}_{k|v}_{part} */
    KVM_AF_T_QKV,   /* version 2 quantized {k|v}_{weights|scales|biases} */
    KVM_AF_T_TAIL,  /* layer_{L}_{k|v}_tail */
    KVM_AF_T_AABB1, /* version 1 layer_{L}_aabb_min|max */
    KVM_AF_T_AABB   /* version 2 aabb */
} kvm_af_kind;

typedef struct kvm_af_tensor {
    char name[48];
    const char *dtype; /* safetensors name: "F32" */
    int32_t ndim;
    uint64_t shape[5];
    uint64_t bytes, esize;
    int32_t index;      /* in the plan as built: the tie-break of the file order */
    kvm_af_kind kind;
    int32_t which;      /* 0 K, 1 V; AABB1: 0 min, 1 max */
    int32_t layer;
    int32_t part;       /* 0 codes or raw, 1 scales, 2 biases */
    uint64_t begin, end; /* offsets in the data section */
    int32_t seen;
} kvm_af_tensor;

typedef struct kvm_af_plan {
    kvm_af_tensor *t;
    int32_t n;
} kvm_af_plan;

/* The tensors a file of `version` holds for n_sealed blocks of ts tokens in
 * all and tail_n tail tokens (release with kvm_af_plan_free, also on
 * failure). Errors: KVMEM_ERR_NOMEM, KVMEM_ERR_FORMAT (sizes overflow). */
kvmem_status kvm_af_plan_build(const kvm_af_geom *g, int version, uint64_t n_sealed, uint64_t ts, uint64_t tail_n,
                               kvm_af_plan *pl);
void kvm_af_plan_free(kvm_af_plan *pl);

/* Writing: put the plan in file order (wider elements first, then the plan's
 * order: the safetensors crate's rule, so every tensor starts at a multiple
 * of its element size) and give each its offsets. Returns the data size. */
uint64_t kvm_af_plan_lay_out(kvm_af_plan *pl);

/* Reading: every tensor of h must be one of the plan with its dtype and
 * shape, every one of the plan must be there; their offsets are copied into
 * the plan. *order (allocated, kvm_free) gets the plan's tensors by
 * offset. The layout itself (tiling) is kvm_st_check_layout's. */
kvmem_status kvm_af_plan_match(kvm_af_plan *pl, const kvm_st_header *h, kvm_af_tensor ***order);

/* ---- the header ---- */

/* What the metadata of a file says, for the writer. */
typedef struct kvm_af_meta {
    const char *agent_id;
    const kvmem_model_spec *spec; /* model_id and the spec string */
    kvmem_dtype dtype;
    int32_t block_size;
    int64_t n_tokens;
    int64_t n_sealed;
    const int32_t *block_tokens; /* n_sealed lengths, block_tokens_stride bytes apart */
    size_t block_tokens_stride;
    const int32_t *token_ids;     /* n_tokens */
    const int64_t *token_text_off; /* n_tokens, -1 = unknown */
    const char *text;
    size_t text_len;
} kvm_af_meta;

/* A header ready to write: [u64 LE length][JSON, space padded] in `bytes`
 * (the 8 length bytes first), the checksum's 16 hex digits at hex_at. */
typedef struct kvm_af_header {
    kvm_jbuf b;
    size_t hex_at;
} kvm_af_header;

/* Build the header of a file of plan pl (laid out) with metadata m and
 * checksum sum (a placeholder when it is known only after the data:
 * kvm_af_header_set_checksum). The data section starts 8-byte aligned, and
 * on a 4096-byte boundary where the KV tensors' offsets allow, so each
 * block's rows lie on whole pages. Errors: KVMEM_ERR_NOMEM. */
kvmem_status kvm_af_header_build(const kvm_af_meta *m, const kvm_af_plan *pl, uint64_t sum, kvm_af_header *h);
void kvm_af_header_set_checksum(kvm_af_header *h, uint64_t sum);
static inline const unsigned char *kvm_af_header_bytes(const kvm_af_header *h) { return (const unsigned char *)h->b.s; }
static inline size_t kvm_af_header_size(const kvm_af_header *h) { return h->b.n; }
static inline void kvm_af_header_free(kvm_af_header *h) { kvm_jbuf_free(&h->b); }

/* ---- reading the metadata ---- */

/* What the reader of a file expects (the pool's own settings). */
typedef struct kvm_af_expect {
    const kvmem_model_spec *spec;
    kvmem_dtype dtype;
    int32_t block_size;
    int32_t max_tokens;   /* 0 = any */
    const char *agent_id; /* NULL = any */
} kvm_af_expect;

typedef struct kvm_af_info {
    int32_t version;
    const char *agent_id; /* in the parsed header */
    int64_t n_tokens;
    uint64_t checksum;
} kvm_af_info;

/* The metadata of a parsed header against what is expected: the format and
 * its version, the agent id (valid, and the expected one), the model id and
 * spec, storage dtype, block size, the token count, the checksum's form.
 * KVMEM_ERR_FORMAT (missing or malformed), KVMEM_ERR_MISMATCH (another
 * model, dtype, block size or agent), KVMEM_ERR_CAPACITY (more tokens than
 * max_tokens). Messages quote the file only once its format says
 * "kvmem-agent". */
kvmem_status kvm_af_check_meta(const kvm_st_header *h, const kvm_af_expect *want, kvm_af_info *out);

/* The sealed blocks' lengths (block_tokens: each in [1, block_size]) into
 * *lengths (allocated, kvm_free; NULL when there are none), their count and
 * the tail's length (the n_tokens they leave, < block_size). */
kvmem_status kvm_af_block_lengths(const kvm_st_header *h, int32_t block_size, int64_t n_tokens, int32_t **lengths,
                                  int64_t *n_sealed, int64_t *tail_n);

/* The stored text's length (from "text", or half of "text_hex"), then the
 * text itself into text[0..len). */
kvmem_status kvm_af_text_len(const kvm_st_header *h, size_t *len);
kvmem_status kvm_af_text(const kvm_st_header *h, char *text, size_t len);
/* token_ids: n_tokens int32 values. */
kvmem_status kvm_af_token_ids(const kvm_st_header *h, int64_t n_tokens, int32_t *out);
/* token_text_offsets: n_tokens values in [-1, text_len], the known ones
 * (>= 0) non-decreasing. */
kvmem_status kvm_af_token_offsets(const kvm_st_header *h, int64_t n_tokens, size_t text_len, int64_t *out);

/* ---- the checksum ----
 * XXH64 (seed 0) over the acc64 digests (hash.h) of the data section's
 * KVM_AF_CHUNK-byte chunks, each as 8 little-endian bytes; written
 * "acc64-1m:" and 16 lowercase hex digits. Chunks are independent, so
 * loaders and writers hash them on several threads. */
uint64_t kvm_af_checksum_combine(const uint64_t *digests, size_t n_chunks);
/* The checksum of a whole data section in memory. */
uint64_t kvm_af_checksum(const void *data, uint64_t size, kvm_acc64_fn stripes);
#define KVM_AF_CHECKSUM_LEN 25 /* "acc64-1m:" + 16 hex digits */
void kvm_af_checksum_text(uint64_t sum, char out[KVM_AF_CHECKSUM_LEN + 1]);

#endif
