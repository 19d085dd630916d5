/* One agent's memory as a safetensors file: the pool's own format, its
 * writer and its strict loader (the store below only moves the bytes).
 *
 * A file is [u64 LE header length N][N bytes of JSON, space padded][data].
 * The header is read by the one strict safetensors reader
 * (core/format/safetensors.h). Which tensors a file must hold, with which
 * dtypes and shapes, follows from the pool (spec, storage dtype, block size)
 * and the metadata (block lengths, token count), so the loader builds that
 * "plan" first and requires the header to match it exactly; the reader then
 * checks that the offsets tile the data section. The data
 * section is checked and copied in 1 MiB chunks on the context's threads:
 * each chunk is read straight into the blocks and hashed while in cache
 * (acc64, core/format/hash.h). The checksum is XXH64 over the chunks' acc64
 * digests (little-endian u64s), so chunks are independent. Nothing reaches
 * the pool until the checksum matches. */
#include "agent_file.h"
#include "mapped.h"
#include "../format/hash.h"
#include "../format/safetensors.h"

#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include "../cpu/kernels.h"
#include "../cpu/threadpool.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- growable string buffer ---- */

typedef struct sbuf {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
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
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_fmt(sbuf *b, const char *fmt, ...) KVMEM_PRINTF(2, 3);
#include <stdarg.h>
static void sb_fmt(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0) sb_put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* Valid UTF-8 (the JSON reader's rules)? */
static int utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf) k = 2, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef) k = 3, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4) k = 4, cp = c & 0x07;
        else return 0;
        if (n - i < k) return 0;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if ((k == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        i += k;
    }
    return 1;
}

static void sb_json_str(sbuf *b, const char *s, size_t n) {
    sb_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') sb_put(b, "\\\"", 2);
        else if (c == '\\') sb_put(b, "\\\\", 2);
        else if (c == '\n') sb_put(b, "\\n", 2);
        else if (c == '\t') sb_put(b, "\\t", 2);
        else if (c == '\r') sb_put(b, "\\r", 2);
        else if (c < 0x20) sb_fmt(b, "\\u%04x", c);
        else sb_put(b, (const char *)&c, 1);
    }
    sb_put(b, "\"", 1);
}

/* ---- the plan: which tensors a file holds ----
 *
 * Version 2 (written by this build):
 *   raw dtypes   layer_{L}_k, layer_{L}_v          [H][T][D]     (F32/F16/BF16)
 *   quantized    k_weights, v_weights, k_scales, v_scales, k_biases, v_biases:
 *                2-D, one row per (block, layer, head, token) in that order
 *                ([rows][W] U32 Q4 words, [rows][D] I8 Q8 codes, [rows][G]
 *                F16 scales/biases; KIVI key scales/biases one row per
 *                (block, layer, head): [n_blocks * L * H][D]), each block's
 *                rows being one region of its memory (kvm_qblock_layout)
 *   tails        layer_{L}_k_tail, layer_{L}_v_tail [H][tail][D]  F32
 *   aabb         [n_blocks][L][H][2][D], s_max then s_min, F16 rounded
 *                outward (F32 for F32 and BF16 pools)
 * Version 1 (still read): the same raw and tail tensors; quantized tensors
 * per layer, layer_{L}_k_weights|scales|biases [H][T][...] (MLX's per-head
 * layout); AABBs per layer, layer_{L}_aabb_min|max [n_blocks][H][D] F32. */

enum { T_KV, T_QKV, T_TAIL, T_AABB1, T_AABB };

typedef struct tplan {
    char name[48];
    const char *dtype;
    int ndim;
    uint64_t shape[5];
    uint64_t bytes, esize;
    int index; /* in the plan as built: the tie-break of the file order */
    int kind, which, layer, part; /* part: 0 codes/raw, 1 scales, 2 biases; T_AABB1 which: 0 min, 1 max */
    uint64_t begin, end;
    int seen;
} tplan;

typedef struct plan {
    tplan *t;
    int n;
} plan;

static const char *st_dtype(kvmem_dtype dt) {
    switch (dt) {
    case KVMEM_F32: return "F32";
    case KVMEM_F16: return "F16";
    case KVMEM_BF16: return "BF16";
    default: return "?";
    }
}

static int add_t(plan *pl, const char *name, const char *dtype, uint64_t esize, int ndim, const uint64_t *dims,
                 int kind, int which, int layer, int part) {
    tplan *t = &pl->t[pl->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    uint64_t e = esize;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = dims[i];
        if (dims[i] && e > UINT64_MAX / dims[i]) return 0;
        e *= dims[i];
    }
    t->bytes = e;
    t->esize = esize;
    t->index = pl->n - 1;
    t->kind = kind, t->which = which, t->layer = layer, t->part = part;
    return 1;
}

/* Build the plan of a file of `version` for n_sealed blocks holding ts
 * tokens and tail_n tail tokens. */
static kvmem_status build_plan(const kvmem_pool *p, int version, uint64_t n_sealed, uint64_t ts, uint64_t tail_n,
                               plan *pl) {
    const int L = p->spec.n_layers;
    const uint64_t H = (uint64_t)p->spec.n_kv_heads, D = (uint64_t)p->spec.head_dim, LH = (uint64_t)L * H;
    const kvmem_dtype dt = p->params.storage_dtype;
    const int quant = kvm_is_quant_dtype(dt);
    pl->t = kvm_calloc((size_t)L * 10 + 8, sizeof *pl->t);
    pl->n = 0;
    if (!pl->t) return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the tensor list of %d layers", L);
    const uint64_t W = (D + 7) / 8, G8 = (D + 31) / 32, G4 = (D + 63) / 64;
    char nm[48];
    int ok = 1;
    if (quant && version >= 2) {
        static const char *parts[3] = {"weights", "scales", "biases"};
        const uint64_t rows = LH * ts; /* overflow: LH < 2^31, ts < 2^31 */
        for (int part = 0; part < (dt == KVMEM_Q8 ? 2 : 3) && ok; part++)
            for (int which = 0; which < 2 && ok; which++) {
                int chan = dt == KVMEM_Q4_KIVI && which == 0 && part > 0;
                uint64_t dims[2] = {chan ? n_sealed * LH : rows,
                                    part == 0 ? (dt == KVMEM_Q8 ? D : W) : chan ? D : dt == KVMEM_Q8 ? G8 : G4};
                snprintf(nm, sizeof nm, "%c_%s", which ? 'v' : 'k', parts[part]);
                ok &= add_t(pl, nm, part ? "F16" : dt == KVMEM_Q8 ? "I8" : "U32", part ? 2 : dt == KVMEM_Q8 ? 1 : 4, 2,
                            dims, T_QKV, which, 0, part);
            }
    }
    for (int l = 0; l < L && ok; l++) {
        for (int which = 0; which < 2 && ok; which++) {
            const char kv = which ? 'v' : 'k';
            if (quant && version < 2) {
                int chan = dt == KVMEM_Q4_KIVI && which == 0;
                uint64_t dw[3] = {H, ts, dt == KVMEM_Q8 ? D : W};
                uint64_t ds[3] = {H, chan ? n_sealed : ts, chan ? D : dt == KVMEM_Q8 ? G8 : G4};
                snprintf(nm, sizeof nm, "layer_%d_%c_weights", l, kv);
                ok &= add_t(pl, nm, dt == KVMEM_Q8 ? "I8" : "U32", dt == KVMEM_Q8 ? 1 : 4, 3, dw, T_KV, which, l, 0);
                snprintf(nm, sizeof nm, "layer_%d_%c_scales", l, kv);
                ok &= add_t(pl, nm, "F16", 2, 3, ds, T_KV, which, l, 1);
                if (dt != KVMEM_Q8) {
                    snprintf(nm, sizeof nm, "layer_%d_%c_biases", l, kv);
                    ok &= add_t(pl, nm, "F16", 2, 3, ds, T_KV, which, l, 2);
                }
            } else if (!quant) {
                uint64_t dims[3] = {H, ts, D};
                snprintf(nm, sizeof nm, "layer_%d_%c", l, kv);
                ok &= add_t(pl, nm, st_dtype(dt), kvm_dtype_size(dt), 3, dims, T_KV, which, l, 0);
            }
            if (tail_n) {
                uint64_t dims[3] = {H, tail_n, D};
                snprintf(nm, sizeof nm, "layer_%d_%c_tail", l, kv);
                ok &= add_t(pl, nm, "F32", 4, 3, dims, T_TAIL, which, l, 0);
            }
        }
        if (version < 2) {
            uint64_t dims[3] = {n_sealed, H, D};
            snprintf(nm, sizeof nm, "layer_%d_aabb_min", l);
            ok &= add_t(pl, nm, "F32", 4, 3, dims, T_AABB1, 0, l, 0);
            snprintf(nm, sizeof nm, "layer_%d_aabb_max", l);
            ok &= add_t(pl, nm, "F32", 4, 3, dims, T_AABB1, 1, l, 0);
        }
    }
    if (version >= 2 && ok) {
        uint64_t dims[5] = {n_sealed, (uint64_t)L, H, 2, D};
        ok &= add_t(pl, "aabb", kvm_aabb_esize(p) == 2 ? "F16" : "F32", kvm_aabb_esize(p), 5, dims, T_AABB, 0, 0, 0);
    }
    if (!ok) {
        kvm_free(pl->t);
        pl->t = NULL;
        return kvm_fail(KVMEM_ERR_FORMAT, "tensor sizes overflow: %" PRIu64 " tokens is not a real agent", ts);
    }
    return KVMEM_OK;
}

/* Call fn(ptr, len) for every contiguous piece of tensor t in file order.
 * aabb1: the f32 staging [n_sealed][L][H][2][D] that version 1 AABB
 * tensors are read into (NULL when writing: only version 2 is written). */
typedef kvmem_status (*piece_fn)(void *arg, unsigned char *ptr, size_t len);

static kvmem_status for_pieces(const kvmem_pool *p, kvm_agent_mem *m, float *aabb1, const tplan *t, piece_fn fn,
                               void *arg) {
    const int32_t H = p->spec.n_kv_heads, L = p->spec.n_layers, BS = p->params.block_size;
    const size_t D = (size_t)p->spec.head_dim;
    const kvmem_dtype dt = p->params.storage_dtype;
    kvmem_status st = KVMEM_OK;
    /* block layouts depend only on the block length: cache the last one */
    int32_t cached_n = -1;
    kvm_qblock qb;
    memset(&qb, 0, sizeof qb);
    if (t->kind == T_KV && !kvm_is_quant_dtype(dt)) {
        const size_t es = kvm_dtype_size(dt);
        for (int32_t h = 0; h < H && st == KVMEM_OK; h++)
            for (int32_t b = 0; b < m->n_sealed && st == KVMEM_OK; b++) {
                const kvm_block *blk = &m->blocks[b];
                st = fn(arg, kvm_block_rows(p, blk, t->which, t->layer, h), (size_t)blk->n_tokens * D * es);
            }
    } else if (t->kind == T_KV) { /* version 1 quantized: one part of one section per piece */
        for (int32_t h = 0; h < H && st == KVMEM_OK; h++)
            for (int32_t b = 0; b < m->n_sealed && st == KVMEM_OK; b++) {
                const kvm_block *blk = &m->blocks[b];
                if (blk->n_tokens != cached_n) qb = kvm_block_qlayout(p, cached_n = blk->n_tokens);
                const kvm_qsection *q = &qb.sec[t->which];
                kvm_qparts pt = kvm_qblock_parts(&qb, blk->kv, t->which, (size_t)t->layer * (size_t)H + (size_t)h);
                if (t->part == 0) st = fn(arg, pt.codes, q->codes_bytes);
                else if (t->part == 1) st = fn(arg, pt.scales, q->scales_bytes);
                else st = fn(arg, pt.biases, q->biases_bytes);
            }
    } else if (t->kind == T_QKV) { /* version 2 quantized: one region of each block */
        const size_t LH = (size_t)L * (size_t)H;
        for (int32_t b = 0; b < m->n_sealed && st == KVMEM_OK; b++) {
            const kvm_block *blk = &m->blocks[b];
            if (blk->n_tokens != cached_n) qb = kvm_block_qlayout(p, cached_n = blk->n_tokens);
            const kvm_qsection *q = &qb.sec[t->which];
            unsigned char *base = blk->kv;
            if (t->part == 0) st = fn(arg, base + qb.codes[t->which], LH * q->codes_bytes);
            else if (t->part == 1) st = fn(arg, base + qb.scales[t->which], LH * q->scales_bytes);
            else st = fn(arg, base + qb.biases[t->which], LH * q->biases_bytes);
        }
    } else if (t->kind == T_TAIL) {
        for (int32_t h = 0; h < H && st == KVMEM_OK; h++)
            st = fn(arg,
                    (unsigned char *)(m->tail + (((size_t)t->which * (size_t)L + (size_t)t->layer) * (size_t)H + (size_t)h) *
                                                    (size_t)BS * D),
                    (size_t)m->tail_n * D * 4);
    } else if (t->kind == T_AABB1) {
        for (int32_t b = 0; b < m->n_sealed && st == KVMEM_OK; b++)
            for (int32_t h = 0; h < H && st == KVMEM_OK; h++) {
                size_t box = (((size_t)b * (size_t)L + (size_t)t->layer) * (size_t)H + (size_t)h) * 2 * D;
                st = fn(arg, (unsigned char *)(aabb1 + box + (t->which == 0 ? D : 0)), D * 4);
            }
    } else if (m->n_sealed) {
        st = fn(arg, m->aabb, (size_t)m->n_sealed * kvm_aabb_block_bytes(p));
    }
    return st;
}

/* ---- the data section as a list of pieces, processed in parallel chunks ---- */

#define KVM_HASH_CHUNK ((uint64_t)1 << 20) /* part of the format: the checksum's chunk size */
#define KVM_SUB ((size_t)256 << 10)        /* read granularity inside a chunk: stays in L2 */

typedef struct piece {
    uint64_t off; /* in the data section */
    unsigned char *ptr;
    size_t len;
} piece;

typedef struct pieces {
    piece *v;
    size_t n, cap;
    uint64_t total;
    int oom;
} pieces;

static kvmem_status collect(void *arg, unsigned char *ptr, size_t len) {
    pieces *ps = arg;
    if (!len) return KVMEM_OK;
    if (ps->n == ps->cap) {
        size_t nc;
        piece *nv = kvm_grow_cap(ps->cap, ps->n + 1, 1024, SIZE_MAX, sizeof *nv, &nc) ? kvm_realloc(ps->v, nc * sizeof *nv) : NULL;
        if (!nv) {
            ps->oom = 1;
            return KVMEM_ERR_NOMEM;
        }
        ps->v = nv;
        ps->cap = nc;
    }
    ps->v[ps->n++] = (piece){ps->total, ptr, len};
    ps->total += len;
    return KVMEM_OK;
}

/* First piece that ends after data offset `at`. */
static size_t piece_at(const pieces *ps, uint64_t at) {
    size_t lo = 0, hi = ps->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ps->v[mid].off + ps->v[mid].len <= at) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The acc64 stripe kernel of the CPU kernel table in use (KVMEM_CPU forces it). */
static kvm_acc64_fn acc64_kernel(void) { return kvm_cpu_kernels_get()->acc64_stripes; }

typedef struct chunk_job {
    const pieces *ps;
    kvm_acc64_fn stripes;
    kvm_store_reader *r; /* NULL: hash the pieces in memory (save) */
    int hash_only;       /* with r: hash the file's bytes, copy them nowhere (opening a mapped agent) */
    uint64_t data_off;   /* file offset of the data section (load) */
    uint64_t *digest;    /* per chunk */
    kvmem_status *status;/* per chunk (load) */
} chunk_job;

static void chunk_task(void *arg, size_t cb, size_t ce) {
    chunk_job *j = arg;
    const pieces *ps = j->ps;
    unsigned char *buf = j->r ? kvm_malloc(KVM_SUB) : NULL;
    for (size_t c = cb; c < ce; c++) {
        uint64_t c0 = (uint64_t)c * KVM_HASH_CHUNK, c1 = KVM_MIN(c0 + KVM_HASH_CHUNK, ps->total);
        kvm_acc64_state h;
        kvm_acc64_init(&h, c1 - c0, j->stripes);
        size_t i = piece_at(ps, c0);
        if (!j->r) {
            for (; i < ps->n && ps->v[i].off < c1; i++) {
                uint64_t b = KVM_MAX(c0, ps->v[i].off), e = KVM_MIN(c1, ps->v[i].off + ps->v[i].len);
                kvm_acc64_update(&h, ps->v[i].ptr + (b - ps->v[i].off), (size_t)(e - b));
            }
            j->digest[c] = kvm_acc64_final(&h);
            continue;
        }
        j->status[c] = buf ? KVMEM_OK : KVMEM_ERR_NOMEM;
        /* large pieces: read straight into the blocks; small ones (Q4 scales,
         * AABB rows) cost more per iovec than a copy from a bounce buffer */
        size_t last = piece_at(ps, c1 > 0 ? c1 - 1 : 0);
        int direct = !j->hash_only && j->r->readv_at && buf && (c1 - c0) / (uint64_t)(last - i + 1) >= 2048;
        if (direct) {
            /* straight into the blocks, then hash what was read while it is in cache */
            struct iovec iov[KVM_MAX_IOV];
            uint64_t pos = c0;
            while (pos < c1 && j->status[c] == KVMEM_OK) {
                int cnt = 0;
                size_t want = 0, k = i;
                for (; k < ps->n && ps->v[k].off < c1 && cnt < KVM_MAX_IOV && want < KVM_SUB; k++) {
                    uint64_t b = KVM_MAX(pos, ps->v[k].off), e = KVM_MIN(c1, ps->v[k].off + ps->v[k].len);
                    if (e <= b) continue;
                    iov[cnt].iov_base = ps->v[k].ptr + (b - ps->v[k].off);
                    iov[cnt].iov_len = (size_t)(e - b);
                    want += iov[cnt].iov_len;
                    cnt++;
                }
                size_t got = 0;
                kvmem_status st = j->r->readv_at(j->r, j->data_off + pos, iov, cnt, &got);
                if (st != KVMEM_OK || got == 0) {
                    j->status[c] = st != KVMEM_OK ? st : KVMEM_ERR_CORRUPT;
                    break;
                }
                for (int q = 0; q < cnt && got; q++) { /* a short read hashes what arrived */
                    size_t use = KVM_MIN(got, iov[q].iov_len);
                    kvm_acc64_update(&h, iov[q].iov_base, use);
                    got -= use;
                    pos += use;
                }
                while (i < ps->n && ps->v[i].off + ps->v[i].len <= pos) i++;
            }
            j->digest[c] = kvm_acc64_final(&h);
            continue;
        }
        for (uint64_t s0 = c0; s0 < c1 && j->status[c] == KVMEM_OK; s0 += KVM_SUB) {
            size_t n = (size_t)KVM_MIN((uint64_t)KVM_SUB, c1 - s0), have = 0;
            while (have < n) {
                size_t got = 0;
                kvmem_status st = j->r->read_at(j->r, j->data_off + s0 + have, buf + have, n - have, &got);
                if (st != KVMEM_OK || got == 0) {
                    j->status[c] = st != KVMEM_OK ? st : KVMEM_ERR_CORRUPT;
                    break;
                }
                have += got;
            }
            if (have < n) break;
            kvm_acc64_update(&h, buf, n); /* hashed while in cache */
            for (; i < ps->n && ps->v[i].off < s0 + n; i++) {
                uint64_t b = KVM_MAX(s0, ps->v[i].off), e = KVM_MIN(s0 + n, ps->v[i].off + ps->v[i].len);
                memcpy(ps->v[i].ptr + (b - ps->v[i].off), buf + (b - s0), (size_t)(e - b));
                if (ps->v[i].off + ps->v[i].len > s0 + n) break; /* continues in the next sub-chunk */
            }
        }
        j->digest[c] = kvm_acc64_final(&h);
    }
    kvm_free(buf);
}

/* The file's checksum: XXH64 over the chunks' acc64 digests, little-endian. */
static uint64_t combine_digests(const uint64_t *dig, size_t n) {
    unsigned char le[8];
    kvm_xxh64_state h;
    kvm_xxh64_init(&h, 0);
    for (size_t c = 0; c < n; c++) {
        for (int b = 0; b < 8; b++) le[b] = (unsigned char)(dig[c] >> (8 * b));
        kvm_xxh64_update(&h, le, 8);
    }
    return kvm_xxh64_final(&h);
}

/* The per-chunk digest and status arrays of the data section described by
 * ps (KVM_HASH_CHUNK bytes a chunk), for the parallel hash passes. */
static kvmem_status chunk_arrays(const pieces *ps, size_t *n, uint64_t **dig, kvmem_status **sts) {
    *n = (size_t)((ps->total + KVM_HASH_CHUNK - 1) / KVM_HASH_CHUNK);
    *dig = kvm_malloc((*n ? *n : 1) * sizeof **dig);
    *sts = kvm_malloc((*n ? *n : 1) * sizeof **sts);
    if (!*dig || !*sts) {
        kvm_free(*dig);
        kvm_free(*sts);
        return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the digests of %zu data chunks", *n);
    }
    return KVMEM_OK;
}

/* Checksum of the data section described by ps; with a reader, also read it
 * into the pieces (hash_only: only hash ps->total bytes of the file).
 * Returns the combined digest in *sum. */
static kvmem_status run_chunks(kvmem_pool *p, const pieces *ps, kvm_store_reader *r, uint64_t data_off, int hash_only,
                               uint64_t *sum) {
    size_t n;
    uint64_t *dig;
    kvmem_status *sts;
    kvmem_status st0 = chunk_arrays(ps, &n, &dig, &sts);
    if (st0 != KVMEM_OK) return st0;
    chunk_job j = {ps, acc64_kernel(), r, hash_only, data_off, dig, sts};
    kvm_parallel_for(p->ctx->tp, n, 1, chunk_task, &j);
    kvmem_status st = KVMEM_OK;
    for (size_t c = 0; r && c < n && st == KVMEM_OK; c++) {
        if (sts[c] == KVMEM_ERR_CORRUPT) st = kvm_fail(KVMEM_ERR_CORRUPT, "file ends inside the data section (truncated)");
        else if (sts[c] == KVMEM_ERR_NOMEM) st = kvm_fail(KVMEM_ERR_NOMEM, "out of memory for a %zu-byte read buffer", KVM_SUB);
        else if (sts[c] != KVMEM_OK) st = kvm_fail(sts[c], "reading the data section failed");
    }
    *sum = combine_digests(dig, n);
    kvm_free(dig);
    kvm_free(sts);
    return st;
}

/* ---- the one-pass save ----
 * Each 1 MiB chunk of the data section is hashed and written by one task,
 * straight from the agent's memory (the kernel's copy into the page cache is
 * the only copy), at its own file offset, so chunks on the context's threads
 * overlap: one hashes while another is in its write, and the writer starts
 * the disk on each chunk as it lands (kvm_file_open_write). The header,
 * whose checksum is only known at the end, is written last, over the
 * placeholder of the same length its place was reserved with. */

typedef struct wchunk_job {
    const pieces *ps;
    kvm_acc64_fn stripes;
    kvm_store_writer *w;
    uint64_t data_off;
    uint64_t *digest;
    kvmem_status *status;
    atomic_int failed;
    char msg[320]; /* the first failure's message (set on the thread that failed) */
} wchunk_job;

static void write_chunk_task(void *arg, size_t cb, size_t ce) {
    wchunk_job *j = arg;
    const pieces *ps = j->ps;
    struct iovec iov[KVM_MAX_IOV];
    for (size_t c = cb; c < ce; c++) {
        j->status[c] = KVMEM_OK;
        if (atomic_load_explicit(&j->failed, memory_order_relaxed)) continue; /* a failed save writes no more */
        uint64_t c0 = (uint64_t)c * KVM_HASH_CHUNK, c1 = KVM_MIN(c0 + KVM_HASH_CHUNK, ps->total), at = c0;
        kvm_acc64_state h;
        kvm_acc64_init(&h, c1 - c0, j->stripes);
        int cnt = 0;
        size_t queued = 0;
        for (size_t i = piece_at(ps, c0); i < ps->n && ps->v[i].off < c1 && j->status[c] == KVMEM_OK; i++) {
            uint64_t b = KVM_MAX(c0, ps->v[i].off), e = KVM_MIN(c1, ps->v[i].off + ps->v[i].len);
            unsigned char *ptr = ps->v[i].ptr + (b - ps->v[i].off);
            kvm_acc64_update(&h, ptr, (size_t)(e - b));
            iov[cnt].iov_base = ptr;
            iov[cnt].iov_len = (size_t)(e - b);
            queued += iov[cnt].iov_len;
            if (++cnt == KVM_MAX_IOV) {
                j->status[c] = j->w->pwritev_at(j->w, j->data_off + at, iov, cnt);
                at += queued;
                cnt = 0;
                queued = 0;
            }
        }
        if (cnt && j->status[c] == KVMEM_OK) j->status[c] = j->w->pwritev_at(j->w, j->data_off + at, iov, cnt);
        j->digest[c] = kvm_acc64_final(&h);
        if (j->status[c] != KVMEM_OK && atomic_exchange(&j->failed, 1) == 0)
            snprintf(j->msg, sizeof j->msg, "%s", kvmem_last_error());
    }
}

/* Hash and write the data section at data_off; *sum gets the checksum. */
static kvmem_status write_chunks(kvmem_pool *p, const pieces *ps, kvm_store_writer *w, uint64_t data_off, uint64_t *sum) {
    size_t n;
    uint64_t *dig;
    kvmem_status *sts;
    kvmem_status st0 = chunk_arrays(ps, &n, &dig, &sts);
    if (st0 != KVMEM_OK) return st0;
    wchunk_job j;
    memset(&j, 0, sizeof j);
    j.ps = ps, j.stripes = acc64_kernel(), j.w = w, j.data_off = data_off, j.digest = dig, j.status = sts;
    atomic_init(&j.failed, 0);
    kvm_parallel_for(p->ctx->tp, n, 1, write_chunk_task, &j);
    kvmem_status st = KVMEM_OK;
    for (size_t c = 0; c < n && st == KVMEM_OK; c++) st = sts[c];
    if (st != KVMEM_OK) st = kvm_fail(st, "%s", j.msg); /* on this thread: the write may have failed on another */
    *sum = combine_digests(dig, n);
    kvm_free(dig);
    kvm_free(sts);
    return st;
}

/* ---- metadata ---- */

/* The model spec as one canonical string: equal strings, equal geometry and RoPE. */
static void spec_string(const kvmem_model_spec *s, sbuf *b) {
    sb_fmt(b, "n_layers=%d;n_q_heads=%d;n_kv_heads=%d;head_dim=%d;rotary_dim=%d;rope_style=%d;", s->n_layers,
           s->n_q_heads, s->n_kv_heads, s->head_dim, s->rotary_dim ? s->rotary_dim : s->head_dim, (int)s->rope_style);
    sb_fmt(b, "rope_theta=%.17g;rope_scaling=%d;rope_factor=%.17g;rope_low_freq_factor=%.17g;", s->rope_theta,
           (int)s->rope_scaling, s->rope_factor, s->rope_low_freq_factor);
    sb_fmt(b, "rope_high_freq_factor=%.17g;rope_original_max_pos=%d;yarn_beta_fast=%.17g;yarn_beta_slow=%.17g;",
           s->rope_high_freq_factor, s->rope_original_max_pos, s->yarn_beta_fast, s->yarn_beta_slow);
    sb_fmt(b, "yarn_attn_factor=%.17g;layer_window=", s->yarn_attn_factor);
    for (int32_t l = 0; l < s->n_layers; l++) sb_fmt(b, l ? ",%d" : "%d", s->layer_window ? s->layer_window[l] : 0);
}

static void meta_int_list32(sbuf *b, const int32_t *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) sb_fmt(b, i ? ",%d" : "%d", v[i]);
}

/* ---- writer ---- */

typedef struct wctx {
    kvm_store_writer *w;
} wctx;

static kvmem_status write_piece(void *arg, unsigned char *ptr, size_t len) {
    wctx *c = arg;
    return len ? c->w->write(c->w, ptr, len) : KVMEM_OK;
}

/* File order: wider elements first, then the plan's order (the safetensors
 * crate's rule), so with the data section 8-byte aligned every tensor
 * begins at a multiple of its element size, as the reader requires. */
static int by_width(const void *a, const void *b) {
    const tplan *x = a, *y = b;
    if (x->esize != y->esize) return x->esize > y->esize ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

kvmem_status kvm_agent_write(kvmem_pool *p, const kvm_agent_mem *cm, kvm_store_writer *w) {
    kvm_agent_mem *m = (kvm_agent_mem *)(uintptr_t)cm; /* read only: the piece walker is shared with the loader */
    uint64_t ts = 0;
    for (int32_t b = 0; b < m->n_sealed; b++) ts += (uint64_t)m->blocks[b].n_tokens;
    plan pl;
    kvmem_status st = build_plan(p, KVM_FORMAT_VERSION, (uint64_t)m->n_sealed, ts, (uint64_t)m->tail_n, &pl);
    if (st != KVMEM_OK) {
        w->abort(w);
        return st;
    }
    wctx c = {w};
    uint64_t off = 0, sum = 0;
    pieces ps = {0};
    qsort(pl.t, (size_t)pl.n, sizeof *pl.t, by_width);
    for (int i = 0; i < pl.n; i++) {
        pl.t[i].begin = off;
        off += pl.t[i].bytes;
        pl.t[i].end = off;
        for_pieces(p, m, NULL, &pl.t[i], collect, &ps);
    }
    /* a writer without positional writes (a network store) gets the
     * checksum first, from a hashing pass, then the bytes in order */
    const int one_pass = w->pwritev_at != NULL;
    if (!one_pass) {
        st = ps.oom ? kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the list of data pieces")
                    : run_chunks(p, &ps, NULL, 0, 0, &sum);
        if (st != KVMEM_OK) {
            kvm_free(ps.v);
            kvm_free(pl.t);
            w->abort(w);
            return st;
        }
    }

    sbuf b = {0};
    sb_str(&b, "{\"__metadata__\":{\"format\":\"kvmem-agent\",");
    sb_fmt(&b, "\"format_version\":\"%d\",\"agent_id\":", KVM_FORMAT_VERSION);
    sb_json_str(&b, m->id, strlen(m->id));
    sb_str(&b, ",\"model_id\":");
    sb_json_str(&b, p->spec.model_id, strnlen(p->spec.model_id, KVMEM_MAX_MODEL_ID));
    sbuf sp = {0};
    spec_string(&p->spec, &sp);
    if (sp.oom) b.oom = 1; /* an empty spec would write a file no pool loads */
    sb_str(&b, ",\"model_spec\":");
    sb_json_str(&b, sp.s ? sp.s : "", sp.n);
    kvm_free(sp.s);
    sb_fmt(&b, ",\"storage_dtype\":\"%s\",\"block_size\":\"%d\",\"n_tokens\":\"%" PRId64 "\",\"block_tokens\":\"",
           kvmem_dtype_name(p->params.storage_dtype), p->params.block_size, m->n_tokens);
    for (int32_t i = 0; i < m->n_sealed; i++) sb_fmt(&b, i ? ",%d" : "%d", m->blocks[i].n_tokens);
    sb_str(&b, "\",\"token_ids\":\"");
    meta_int_list32(&b, m->token_ids, m->n_tokens);
    sb_str(&b, "\",\"token_text_offsets\":\"");
    for (int64_t i = 0; i < m->n_tokens; i++) sb_fmt(&b, i ? ",%" PRId64 : "%" PRId64, m->token_text_off[i]);
    sb_str(&b, "\",");
    /* a NUL is valid UTF-8, but the reader refuses it in any header string */
    if (utf8_valid((const unsigned char *)m->text, m->text_len) && !(m->text_len && memchr(m->text, '\0', m->text_len))) {
        sb_str(&b, "\"text\":");
        sb_json_str(&b, m->text ? m->text : "", m->text_len);
    } else { /* not UTF-8 (so not a JSON string) or holding a NUL: hex keeps it exact */
        sb_str(&b, "\"text_hex\":\"");
        for (size_t i = 0; i < m->text_len; i++) sb_fmt(&b, "%02x", (unsigned char)m->text[i]);
        sb_str(&b, "\"");
    }
    sb_str(&b, ",\"checksum\":\"acc64-1m:");
    const size_t sum_at = b.n; /* 16 hex digits, filled in once known */
    sb_fmt(&b, "%016" PRIx64 "\"}", sum);
    for (int i = 0; i < pl.n; i++) {
        const tplan *t = &pl.t[i];
        sb_fmt(&b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, t->dtype);
        for (int d = 0; d < t->ndim; d++) sb_fmt(&b, d ? ",%" PRIu64 : "%" PRIu64, t->shape[d]);
        sb_fmt(&b, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", t->begin, t->end);
    }
    sb_str(&b, "}");
    /* The data starts 8-byte aligned; and where the KV tensors' offset
     * allows, padded so they start on a page: each block's run then lies
     * on whole page-cache pages at its blocks' 64-byte alignment, which the
     * kernel copies ~20% faster than runs shifted by 8 (load, one thread). */
    uint64_t kv_begin = 0;
    for (int i = 0; i < pl.n; i++)
        if (pl.t[i].kind == T_KV || pl.t[i].kind == T_QKV) {
            kv_begin = pl.t[i].begin;
            break;
        }
    const uint64_t page = kv_begin % 8 ? 8 : 4096;
    while (!b.oom && (8 + b.n + (page == 8 ? 0 : kv_begin)) % page) sb_str(&b, " ");
    if (b.oom || ps.oom) {
        kvm_free(b.s);
        kvm_free(ps.v);
        kvm_free(pl.t);
        w->abort(w);
        return b.oom ? kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the file header (%zu bytes so far)", b.cap)
                     : kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the list of data pieces");
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)b.n >> (8 * i));
    if (one_pass) {
        st = write_chunks(p, &ps, w, 8 + (uint64_t)b.n, &sum);
        if (st == KVMEM_OK) {
            char hex[17];
            snprintf(hex, sizeof hex, "%016" PRIx64, sum);
            memcpy(b.s + sum_at, hex, 16);
            struct iovec hv[2] = {{len8, 8}, {b.s, b.n}};
            st = w->pwritev_at(w, 0, hv, 2);
        }
    } else {
        st = w->write(w, len8, 8);
        if (st == KVMEM_OK) st = w->write(w, b.s, b.n);
        for (int i = 0; i < pl.n && st == KVMEM_OK; i++) st = for_pieces(p, m, NULL, &pl.t[i], write_piece, &c);
    }
    kvm_free(b.s);
    kvm_free(ps.v);
    kvm_free(pl.t);
    if (st != KVMEM_OK) {
        w->abort(w);
        return st;
    }
    return w->commit(w);
}

/* ---- loader ---- */

static kvmem_status read_exact(kvm_store_reader *r, uint64_t off, void *dst, size_t len, const char *what) {
    unsigned char *d = dst;
    while (len) {
        size_t got;
        kvmem_status st = r->read_at(r, off, d, len, &got);
        if (st != KVMEM_OK) return st;
        if (got == 0) return kvm_fail(KVMEM_ERR_CORRUPT, "file ends inside the %s (truncated)", what);
        d += got;
        off += got;
        len -= got;
    }
    return KVMEM_OK;
}

/* Strict decimal integer in [lo, hi]. */
static int parse_i64(const char *s, size_t n, int64_t lo, int64_t hi, int64_t *out) {
    if (n == 0 || n > 20) return 0;
    size_t i = 0;
    int neg = s[0] == '-';
    if (neg) i++;
    if (i == n) return 0;
    if (s[i] == '0' && n - i > 1) return 0;
    int64_t v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        int d = s[i] - '0';
        if (v > (INT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    if (neg) v = -v;
    if (v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* Comma-separated integers into out (n_expect entries). -1: syntax, -2: count. */
static int parse_list(const char *s, size_t len, int64_t lo, int64_t hi, int64_t n_expect, void *out, int wide) {
    int64_t k = 0;
    size_t i = 0;
    if (len == 0) return n_expect == 0 ? 0 : -2;
    while (i <= len) {
        size_t j = i;
        while (j < len && s[j] != ',') j++;
        int64_t v;
        if (!parse_i64(s + i, j - i, lo, hi, &v)) return -1;
        if (k >= n_expect) return -2;
        if (wide) ((int64_t *)out)[k] = v;
        else ((int32_t *)out)[k] = (int32_t)v;
        k++;
        i = j + 1;
    }
    return k == n_expect ? 0 : -2;
}

static int cmp_begin(const void *a, const void *b) {
    const tplan *x = *(const tplan *const *)a, *y = *(const tplan *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static void fresh_free(kvmem_pool *p, kvm_agent_mem *f) {
    if (!f) return;
    if (f->mapped) kvm_agent_mem_clear(f); /* no block memory: its KV stays in the file */
    else kvm_agent_mem_release(p, f);
    kvm_free(f);
}

typedef struct loadstate {
    kvm_st_header hdr;
    char *header;
    plan pl;
    tplan **order;
    int32_t *block_n;
    float *aabb1; /* version 1: the f32 AABBs as read, before conversion */
    kvm_agent_mem *fresh;
    kvmem_pool *pool;
} loadstate;

static void ls_free(loadstate *s) {
    kvm_st_header_free(&s->hdr);
    kvm_free(s->header);
    kvm_free(s->pl.t);
    kvm_free(s->order);
    kvm_free(s->block_n);
    kvm_aligned_free(s->aabb1);
    fresh_free(s->pool, s->fresh);
}

static const char *meta_str(const kvm_json_doc *d, const kvm_json *meta, const char *key, size_t *len) {
    const kvm_json *v = kvm_json_get(d, meta, key);
    if (!v) return NULL;
    *len = v->len;
    return v->str;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static kvmem_status check_meta(kvmem_pool *p, loadstate *s, const kvm_json *meta, const char *expect_id,
                               int *version, int64_t *n_tokens, uint64_t *checksum) {
    const kvm_json_doc *d = &s->hdr.doc;
    size_t n;
    const char *v;
#define META(key)                                                                                    \
    do {                                                                                             \
        if (!(v = meta_str(d, meta, key, &n)))                                                       \
            return kvm_fail(KVMEM_ERR_FORMAT, "metadata '%s' is missing: not a kvmem agent file", key); \
    } while (0)
    /* strings are NUL-free and every metadata value is a string: the reader */
    META("format");
    if (strcmp(v, "kvmem-agent") != 0) return kvm_fail(KVMEM_ERR_FORMAT, "metadata format is not 'kvmem-agent'");
    META("format_version");
    if (strcmp(v, "1") != 0 && strcmp(v, "2") != 0)
        return kvm_fail(KVMEM_ERR_FORMAT, "this format version is not supported (this build reads 1 and 2)");
    *version = v[0] - '0';
    META("agent_id");
    if (!kvmem_agent_id_valid(v)) return kvm_fail(KVMEM_ERR_FORMAT, "metadata agent_id is not a valid agent id");
    if (expect_id && strcmp(v, expect_id) != 0)
        return kvm_fail(KVMEM_ERR_MISMATCH, "the file belongs to agent '%s', not '%s'", v, expect_id);
    META("model_id");
    if (strcmp(v, p->spec.model_id) != 0)
        return kvm_fail(KVMEM_ERR_MISMATCH, "the file was written for model '%.60s', the pool is '%.60s'", v, p->spec.model_id);
    META("model_spec");
    sbuf sp = {0};
    spec_string(&p->spec, &sp);
    if (sp.oom) {
        kvm_free(sp.s);
        return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the pool's model spec string");
    }
    if (n != sp.n || memcmp(v, sp.s, n) != 0) {
        /* name the first field that differs */
        size_t i = 0;
        while (i < n && i < sp.n && v[i] == sp.s[i]) i++;
        size_t f = i;
        while (f > 0 && sp.s[f - 1] != ';') f--;
        size_t e = f;
        while (e < sp.n && sp.s[e] != ';') e++;
        size_t fe = f;
        while (fe < n && v[fe] != ';') fe++;
        kvmem_status st = kvm_fail(KVMEM_ERR_MISMATCH, "model spec differs: file has %.*s, the pool %.*s",
                                   (int)KVM_MIN(fe - KVM_MIN(f, fe), (size_t)80), v + KVM_MIN(f, n), (int)KVM_MIN(e - f, (size_t)80),
                                   sp.s + f);
        kvm_free(sp.s);
        return st;
    }
    kvm_free(sp.s);
    META("storage_dtype");
    if (strcmp(v, kvmem_dtype_name(p->params.storage_dtype)) != 0)
        return kvm_fail(KVMEM_ERR_MISMATCH, "the file stores %.20s, the pool stores %s", v,
                        kvmem_dtype_name(p->params.storage_dtype));
    META("block_size");
    int64_t bs;
    if (!parse_i64(v, n, 1, 4096, &bs)) return kvm_fail(KVMEM_ERR_FORMAT, "metadata block_size '%.20s' is not a block size", v);
    if (bs != p->params.block_size)
        return kvm_fail(KVMEM_ERR_MISMATCH, "the file has block size %lld, the pool %d", (long long)bs, p->params.block_size);
    META("n_tokens");
    if (!parse_i64(v, n, 0, INT32_MAX, n_tokens))
        return kvm_fail(KVMEM_ERR_FORMAT, "metadata n_tokens '%.20s' is not a token count in [0, 2^31)", v);
    if (p->params.max_tokens_per_agent > 0 && *n_tokens > p->params.max_tokens_per_agent)
        return kvm_fail(KVMEM_ERR_CAPACITY, "the file holds %lld tokens, more than max_tokens_per_agent %d",
                        (long long)*n_tokens, p->params.max_tokens_per_agent);
    META("checksum");
    if (n != 25 || strncmp(v, "acc64-1m:", 9) != 0)
        return kvm_fail(KVMEM_ERR_FORMAT, "metadata checksum is not 'acc64-1m:<16 hex digits>'");
    *checksum = 0;
    for (int i = 9; i < 25; i++) {
        int h = hexval(v[i]);
        if (h < 0) return kvm_fail(KVMEM_ERR_FORMAT, "metadata checksum is not 'acc64-1m:<16 hex digits>'");
        *checksum = (*checksum << 4) | (uint64_t)h;
    }
#undef META
    return KVMEM_OK;
}

/* Tensor t of the file against the plan: its name, dtype and shape (the
 * reader has checked the entry's form; the layout is checked after). */
static kvmem_status match_tensor(loadstate *s, const kvm_st_tensor *v) {
    tplan *t = NULL;
    for (int i = 0; i < s->pl.n && !t; i++)
        if (strlen(s->pl.t[i].name) == v->name_len && memcmp(s->pl.t[i].name, v->name, v->name_len) == 0) t = &s->pl.t[i];
    if (!t) return kvm_fail(KVMEM_ERR_FORMAT, "unexpected tensor '%.60s' for this pool and metadata", v->name);
    if (strcmp(kvm_st_dtype_name(v->dtype), t->dtype) != 0)
        return kvm_fail(KVMEM_ERR_FORMAT, "tensor '%s' has dtype %s, expected %s", t->name, kvm_st_dtype_name(v->dtype), t->dtype);
    int same = v->ndim == t->ndim;
    for (int k = 0; same && k < t->ndim; k++) same = v->shape[k] == t->shape[k];
    if (!same) {
        char want[128], got[128];
        int w = 0, g = 0;
        for (int i = 0; i < t->ndim && w >= 0 && (size_t)w < sizeof want; i++)
            w += snprintf(want + w, sizeof want - (size_t)w, i ? ", %" PRIu64 : "%" PRIu64, t->shape[i]);
        for (int i = 0; i < v->ndim && g >= 0 && (size_t)g < sizeof got; i++)
            g += snprintf(got + g, sizeof got - (size_t)g, i ? ", %" PRIu64 : "%" PRIu64, v->shape[i]);
        return kvm_fail(KVMEM_ERR_FORMAT, "tensor '%s' has shape [%s], expected [%s]", t->name, got, want);
    }
    t->begin = v->begin;
    t->end = v->end;
    t->seen = 1;
    return KVMEM_OK;
}

/* ---- AABB checks after a load: in parallel over blocks ---- */

typedef struct aabb_job {
    const kvmem_pool *p;
    kvm_agent_mem *f;
    const float *v1; /* version 1 staging, or NULL */
    atomic_size_t bad;
} aabb_job;

/* Non-finite values plus boxes with some min > max among n boxes of 2*D floats. */
static size_t bad_boxes(const float *box, size_t n, size_t D) {
    size_t bad = kvm_cpu_kernels_get()->count_nonfinite(box, n * 2 * D);
    for (size_t b = 0; b < n && !bad; b++) {
        int inv = 0;
        for (size_t d = 0; d < D; d++) inv |= box[b * 2 * D + D + d] > box[b * 2 * D + d];
        bad += (size_t)inv;
    }
    return bad;
}

static void aabb_task(void *arg, size_t b0, size_t b1) {
    aabb_job *j = arg;
    const kvmem_pool *p = j->p;
    const size_t L = (size_t)p->spec.n_layers, H = (size_t)p->spec.n_kv_heads, D = (size_t)p->spec.head_dim;
    float box[4 * KVM_ROPE_MAX_PAIRS];
    size_t bad = 0;
    for (size_t b = b0; b < b1 && !bad; b++) {
        if (j->v1) {
            const float *src = j->v1 + b * L * H * 2 * D;
            bad += bad_boxes(src, L * H, D);
            for (size_t g = 0; g < L * H && !bad; g++)
                kvm_aabb_store(p, src + g * 2 * D, kvm_block_aabb(p, j->f, (int32_t)b, (int32_t)(g / H), (int32_t)(g % H)));
        }
        if (kvm_aabb_esize(p) == 2) { /* checked as stored */
            bad += kvm_cpu_kernels_get()->quant->f16_boxes_bad(kvm_block_aabb(p, j->f, (int32_t)b, 0, 0), L * H, D);
            continue;
        }
        for (size_t g = 0; g < L * H && !bad; g++) {
            kvm_block_aabb_f32(p, j->f, (int32_t)b, (int32_t)(g / H), (int32_t)(g % H), box);
            bad += bad_boxes(box, 1, D);
        }
    }
    if (bad) atomic_fetch_add(&j->bad, bad);
}

static size_t check_aabbs(const kvmem_pool *p, kvm_agent_mem *f, const float *v1) {
    aabb_job j = {p, f, v1, 0};
    atomic_init(&j.bad, 0);
    kvm_parallel_for(p->ctx->tp, (size_t)f->n_sealed, 16, aabb_task, &j);
    return atomic_load(&j.bad);
}

/* The metadata keys an agent file holds: messages may name them. */
static const char *const k_agent_keys[] = {"format", "format_version", "agent_id", "model_id", "model_spec",
                                           "storage_dtype", "block_size", "n_tokens", "block_tokens", "token_ids",
                                           "token_text_offsets", "text", "text_hex", "checksum", NULL};

/* Reads consecutive pieces of one tensor from the file (a mapped agent's
 * AABBs and tail). */
typedef struct cursor {
    kvm_store_reader *r;
    uint64_t off;
} cursor;

static kvmem_status read_piece(void *arg, unsigned char *ptr, size_t len) {
    cursor *c = arg;
    kvmem_status st = read_exact(c->r, c->off, ptr, len, "data section");
    c->off += len;
    return st;
}

/* kvm_agent_parse; with map_path, the mapped form (kvm_agent_parse_mapped). */
static kvmem_status parse_file(kvmem_pool *p, kvm_store_reader *r, uint64_t size, const char *expect_id,
                               const char *map_path, int verify, kvm_agent_mem **out) {
    const int mapped = map_path != NULL;
    kvm_mapped *mp = NULL;
    loadstate s;
    memset(&s, 0, sizeof s);
    s.pool = p;
    kvmem_status st;
    *out = NULL;
    unsigned char len8[8] = {0};
    if (size >= 8 && (st = read_exact(r, 0, len8, 8, "header length")) != KVMEM_OK) return st;
    uint64_t hl = 0;
    if ((st = kvm_st_header_len(len8, size, KVM_MAX_HEADER, &hl)) != KVMEM_OK) return st;
    s.header = kvm_malloc((size_t)hl);
    if (!s.header) return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the file's JSON header");
    if ((st = read_exact(r, 8, s.header, (size_t)hl, "header")) != KVMEM_OK) goto done;
    /* Nothing read from a file is quoted in a message until the file has
     * shown itself to be a kvmem agent file (its metadata checks out): a
     * caller may pass any path and show the message to someone who should
     * not read that file. */
    kvm_st_rules rules = kvm_st_default_rules();
    rules.dtypes = KVM_ST_DTYPE_BIT(KVM_ST_F32) | KVM_ST_DTYPE_BIT(KVM_ST_F16) | KVM_ST_DTYPE_BIT(KVM_ST_BF16) |
                   KVM_ST_DTYPE_BIT(KVM_ST_U32) | KVM_ST_DTYPE_BIT(KVM_ST_I8);
    rules.require_meta = 1;
    rules.known_keys = k_agent_keys;
    if ((st = kvm_st_parse(s.header, (size_t)hl, size - 8 - hl, &rules, &s.hdr)) != KVMEM_OK) goto done;
    const kvm_json *meta = s.hdr.meta;
    int64_t n_tokens = 0;
    uint64_t checksum = 0;
    int version = 0;
    if ((st = check_meta(p, &s, meta, expect_id, &version, &n_tokens, &checksum)) != KVMEM_OK) goto done;
    rules.quote = 1; /* an agent file now */
    if (mapped && version < 2) {
        st = kvm_fail(KVMEM_ERR_UNSUPPORTED, "a format version 1 file cannot be mapped: load it with kvmem_agent_load and "
                                             "save it again (version 2)");
        goto done;
    }

    /* blocks: lengths in [1, BS], the tail shorter than a block */
    const int32_t BS = p->params.block_size;
    size_t n;
    const char *v = meta_str(&s.hdr.doc, meta, "block_tokens", &n);
    if (!v) {
        st = kvm_fail(KVMEM_ERR_FORMAT, "metadata 'block_tokens' is missing");
        goto done;
    }
    int64_t n_sealed = n ? 1 : 0;
    for (size_t i = 0; i < n; i++) n_sealed += v[i] == ',';
    if (n_sealed > n_tokens) {
        st = kvm_fail(KVMEM_ERR_CORRUPT, "%lld blocks for %lld tokens", (long long)n_sealed, (long long)n_tokens);
        goto done;
    }
    s.block_n = kvm_malloc((size_t)(n_sealed ? n_sealed : 1) * sizeof *s.block_n);
    if (!s.block_n) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the lengths of %lld blocks", (long long)n_sealed);
        goto done;
    }
    if (parse_list(v, n, 1, BS, n_sealed, s.block_n, 0) != 0) {
        st = kvm_fail(KVMEM_ERR_FORMAT, "metadata block_tokens must list block lengths in [1, %d]", BS);
        goto done;
    }
    int64_t ts = 0;
    for (int64_t i = 0; i < n_sealed; i++) ts += s.block_n[i];
    int64_t tail_n = n_tokens - ts;
    if (tail_n < 0 || tail_n >= BS) {
        st = kvm_fail(KVMEM_ERR_CORRUPT, "blocks hold %lld of %lld tokens: the rest does not fit an unsealed block of %d",
                      (long long)ts, (long long)n_tokens, BS);
        goto done;
    }
    if ((st = build_plan(p, version, (uint64_t)n_sealed, (uint64_t)ts, (uint64_t)tail_n, &s.pl)) != KVMEM_OK) goto done;
    for (int32_t i = 0; i < s.hdr.n_tensors; i++)
        if ((st = match_tensor(&s, &s.hdr.tensors[i])) != KVMEM_OK) goto done;
    s.order = kvm_malloc((size_t)s.pl.n * sizeof *s.order);
    if (!s.order) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the order of %d tensors", s.pl.n);
        goto done;
    }
    for (int i = 0; i < s.pl.n; i++) {
        if (!s.pl.t[i].seen) {
            st = kvm_fail(KVMEM_ERR_FORMAT, "tensor '%s' is missing", s.pl.t[i].name);
            goto done;
        }
        s.order[i] = &s.pl.t[i];
    }
    /* in range, sized by their shapes, aligned, tiling the data section */
    if ((st = kvm_st_check_layout(&s.hdr, &rules)) != KVMEM_OK) goto done;
    qsort(s.order, (size_t)s.pl.n, sizeof *s.order, cmp_begin);

    /* everything checks out on paper: allocate, read, check, and reserve the
     * bytes last (a reservation may spill closed agents: never for a load
     * that then fails) */
    uint64_t need = (n_tokens > ts) ? kvm_tail_bytes(p) : 0;
    for (int64_t i = 0; i < n_sealed; i++)
        need += mapped ? kvm_aabb_block_bytes(p) : kvm_block_bytes(p, s.block_n[i]); /* mapped: what is resident */
    kvm_agent_mem *f = s.fresh = kvm_calloc(1, sizeof *f);
    if (f && mapped) {
        size_t pl_len = strlen(map_path);
        f->mapped = mp = kvm_calloc(1, sizeof *mp);
        if (mp) {
            mp->raw_begin = kvm_calloc(2 * (size_t)p->spec.n_layers, sizeof *mp->raw_begin);
            mp->path = kvm_malloc(pl_len + 1);
            if (mp->path) memcpy(mp->path, map_path, pl_len + 1);
            atomic_init(&mp->err, 0);
            atomic_init(&mp->err_block, -1);
        }
        if (!mp || !mp->raw_begin || !mp->path) {
            st = kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the file map of a mapped agent");
            goto done;
        }
        const char *id = meta_str(&s.hdr.doc, meta, "agent_id", &n); /* checked by check_meta */
        snprintf(f->id, sizeof f->id, "%s", id);
        mp->data_off = 8 + hl;
        mp->file_size = size;
        mp->ts = (uint64_t)ts;
        for (int i = 0; i < s.pl.n; i++) {
            const tplan *t = &s.pl.t[i];
            if (t->kind == T_KV) mp->raw_begin[(size_t)t->which * (size_t)p->spec.n_layers + (size_t)t->layer] = t->begin;
            else if (t->kind == T_QKV) mp->q_begin[t->part][t->which] = t->begin;
        }
    }
    size_t text_cap = 0;
    const char *text = meta_str(&s.hdr.doc, meta, "text", &n);
    const char *hex = NULL;
    if (!text) {
        hex = meta_str(&s.hdr.doc, meta, "text_hex", &n);
        if (!hex || n % 2) {
            st = kvm_fail(KVMEM_ERR_FORMAT, "metadata has neither 'text' nor an even-length 'text_hex'");
            goto done;
        }
        text_cap = n / 2;
    } else {
        text_cap = n;
    }
    int ok = f && (n_sealed == 0 || kvm_agent_grow_blocks(p, f, (int32_t)n_sealed)) &&
             kvm_agent_grow_tokens(f, n_tokens ? n_tokens : 1) && kvm_agent_grow_text(f, text_cap ? text_cap : 1);
    if (ok && tail_n > 0) {
        ok = (f->tail = kvm_aligned_alloc(kvm_tail_bytes(p))) != NULL;
        if (ok) memset(f->tail, 0, kvm_tail_bytes(p));
    }
    int64_t first = 0;
    for (int64_t i = 0; ok && i < n_sealed; i++) {
        f->blocks[i].first_token = first;
        f->blocks[i].n_tokens = s.block_n[i];
        f->blocks[i].reserved = 0;
        f->blocks[i].map = mp;
        f->blocks[i].kv = mapped ? NULL : kvm_block_alloc(p, s.block_n[i]);
        if (!mapped && !f->blocks[i].kv) ok = 0; /* every byte but section padding (never read) is written below */
        f->n_sealed = (int32_t)i + 1;
        first += s.block_n[i];
    }
    if (!ok) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the %lld tokens of the file (%lld blocks)", (long long)n_tokens,
                      (long long)n_sealed);
        goto done;
    }
    f->n_tokens = n_tokens;
    f->tail_n = (int32_t)tail_n;
    f->bytes = need;
    /* token ids and offsets */
    v = meta_str(&s.hdr.doc, meta, "token_ids", &n);
    int rc = v ? parse_list(v, n, INT32_MIN, INT32_MAX, n_tokens, f->token_ids, 0) : -1;
    if (rc != 0) {
        st = kvm_fail(rc == -2 ? KVMEM_ERR_CORRUPT : KVMEM_ERR_FORMAT, "metadata token_ids must list %lld int32 ids",
                      (long long)n_tokens);
        goto done;
    }
    if (text) {
        memcpy(f->text, text, text_cap);
    } else {
        for (size_t i = 0; i < text_cap; i++) {
            int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
            if (hi < 0 || lo < 0) {
                st = kvm_fail(KVMEM_ERR_FORMAT, "metadata text_hex is not lowercase hex");
                goto done;
            }
            f->text[i] = (char)(hi * 16 + lo);
        }
    }
    f->text_len = text_cap;
    v = meta_str(&s.hdr.doc, meta, "token_text_offsets", &n);
    rc = v ? parse_list(v, n, -1, (int64_t)text_cap, n_tokens, f->token_text_off, 1) : -1;
    if (rc != 0) {
        st = kvm_fail(rc == -2 ? KVMEM_ERR_CORRUPT : KVMEM_ERR_FORMAT,
                      "metadata token_text_offsets must list %lld offsets in [-1, %zu]", (long long)n_tokens, text_cap);
        goto done;
    }
    int64_t last = 0;
    for (int64_t i = 0; i < n_tokens; i++) {
        int64_t o = f->token_text_off[i];
        if (o < 0) continue;
        if (o < last) {
            st = kvm_fail(KVMEM_ERR_CORRUPT, "token_text_offsets decrease at token %lld", (long long)i);
            goto done;
        }
        last = o;
    }

    if (version < 2 && n_sealed) {
        s.aabb1 = kvm_aligned_alloc((size_t)n_sealed * (size_t)p->spec.n_layers * p->row_elems * 2 * sizeof(float));
        if (!s.aabb1) {
            st = kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the f32 AABBs of a version 1 file (%lld blocks)",
                          (long long)n_sealed);
            goto done;
        }
    }
    pieces ps = {0};
    uint64_t got_sum = checksum;
    if (mapped) {
        if (mp) mp->blocks = f->blocks;
        /* resident: the AABBs and the tail; then the checksum of the whole
         * data section, hashed in chunks and kept nowhere */
        for (int i = 0; i < s.pl.n && st == KVMEM_OK; i++) {
            cursor c = {r, 8 + hl + s.order[i]->begin};
            if (s.order[i]->kind == T_TAIL || s.order[i]->kind == T_AABB) st = for_pieces(p, f, NULL, s.order[i], read_piece, &c);
        }
        ps.total = size - 8 - hl;
        if (st == KVMEM_OK && verify) st = run_chunks(p, &ps, r, 8 + hl, 1, &got_sum);
    } else {
        for (int i = 0; i < s.pl.n && !ps.oom; i++) for_pieces(p, f, s.aabb1, s.order[i], collect, &ps);
        st = ps.oom ? kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the list of data pieces")
                    : run_chunks(p, &ps, r, 8 + hl, 0, &got_sum);
    }
    kvm_free(ps.v);
    if (st != KVMEM_OK) goto done;
    if (got_sum != checksum) {
        st = kvm_fail(KVMEM_ERR_CORRUPT, "checksum mismatch: the data section is corrupt (stored %016" PRIx64 ", computed %016" PRIx64 ")",
                      checksum, got_sum);
        goto done;
    }
    /* AABBs and the f32 tail are used as they are: they must be sane (finite,
     * min <= max; a version 1 file's f32 boxes are checked, then stored in
     * the pool's element type, rounded outward, and checked again: an f32
     * value beyond f16's range becomes infinite there) */
    const size_t D = (size_t)p->spec.head_dim;
    const kvm_cpu_kernels *ck = kvm_cpu_kernels_get();
    size_t bad = check_aabbs(p, f, s.aabb1);
    if (bad) {
        st = kvm_fail(KVMEM_ERR_CORRUPT, "AABBs hold %zu non-finite values or boxes with min > max%s", bad,
                      s.aabb1 && kvm_aabb_esize(p) == 2 ? " (or values beyond f16's range)" : "");
        goto done;
    }
    if (f->tail) {
        for (size_t g = 0; g < 2 * (size_t)p->spec.n_layers * (size_t)p->spec.n_kv_heads; g++)
            bad += ck->count_nonfinite(f->tail + g * (size_t)BS * D, (size_t)tail_n * D);
        if (bad) {
            st = kvm_fail(KVMEM_ERR_CORRUPT, "the unsealed tail holds %zu non-finite values", bad);
            goto done;
        }
    }
    /* a mapped agent's bytes are reserved when it joins the pool (kvm_pool_adopt) */
    if (!mapped && (st = kvm_pool_reserve(p, need)) != KVMEM_OK) goto done;
    if (mp) mp->r = r; /* the mapping owns the reader from here on */
    *out = f;
    s.fresh = NULL;
    st = KVMEM_OK;
done:
    ls_free(&s);
    return st;
}

kvmem_status kvm_agent_parse(kvmem_pool *p, kvm_store_reader *r, uint64_t size, const char *expect_id,
                             kvm_agent_mem **out) {
    return parse_file(p, r, size, expect_id, NULL, 1, out);
}

kvmem_status kvm_agent_parse_mapped(kvmem_pool *p, kvm_store_reader *r, uint64_t size, const char *path, int verify,
                                    kvm_agent_mem **out) {
    return parse_file(p, r, size, NULL, path, verify, out);
}
