/* One agent's memory to and from an agent file (the format is
 * core/format/agent_file.h; the bytes go through a store, core/store/store.h):
 * which bytes of the agent's blocks, AABBs and tail each tensor of the plan
 * covers, and the data section moved and checksummed in 1 MiB chunks on the
 * context's threads. A load reads each chunk straight into the blocks and
 * hashes it while it is in cache (acc64, core/format/hash.h); nothing reaches
 * the pool until the checksum matches. A save hashes and writes each chunk
 * in one pass and writes the header, whose checksum is known last, at the
 * end. */
#include "agent_io.h"
#include "mapped.h"
#include "../format/agent_file.h"

#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include "../cpu/kernels.h"
#include "../cpu/threadpool.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The file geometry of a pool. */
static kvm_af_geom geom_of(const kvmem_pool *p) {
    kvm_af_geom g = {p->spec.n_layers, p->spec.n_kv_heads, p->spec.head_dim, p->params.block_size,
                     p->params.storage_dtype, (int32_t)kvm_aabb_esize(p)};
    return g;
}

/* Call fn(ptr, len) for every contiguous piece of tensor t in file order.
 * aabb1: the f32 staging [n_sealed][L][H][2][D] that version 1 AABB
 * tensors are read into (NULL when writing: only version 2 is written). */
typedef kvmem_status (*piece_fn)(void *arg, unsigned char *ptr, size_t len);

static kvmem_status for_pieces(const kvmem_pool *p, kvm_agent_mem *m, float *aabb1, const kvm_af_tensor *t, piece_fn fn,
                               void *arg) {
    const int32_t H = p->spec.n_kv_heads, L = p->spec.n_layers, BS = p->params.block_size;
    const size_t D = (size_t)p->spec.head_dim;
    const kvmem_dtype dt = p->params.storage_dtype;
    kvmem_status st = KVMEM_OK;
    /* block layouts depend only on the block length: cache the last one */
    int32_t cached_n = -1;
    kvm_qblock qb;
    memset(&qb, 0, sizeof qb);
    if (t->kind == KVM_AF_T_KV && !kvm_is_quant_dtype(dt)) {
        const size_t es = kvm_dtype_size(dt);
        for (int32_t h = 0; h < H && st == KVMEM_OK; h++)
            for (int32_t b = 0; b < m->n_sealed && st == KVMEM_OK; b++) {
                const kvm_block *blk = &m->blocks[b];
                st = fn(arg, kvm_block_rows(p, blk, t->which, t->layer, h), (size_t)blk->n_tokens * D * es);
            }
    } else if (t->kind == KVM_AF_T_KV) { /* version 1 quantized: one part of one section per piece */
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
    } else if (t->kind == KVM_AF_T_QKV) { /* version 2 quantized: one region of each block */
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
    } else if (t->kind == KVM_AF_T_TAIL) {
        for (int32_t h = 0; h < H && st == KVMEM_OK; h++)
            st = fn(arg,
                    (unsigned char *)(m->tail + (((size_t)t->which * (size_t)L + (size_t)t->layer) * (size_t)H + (size_t)h) *
                                                    (size_t)BS * D),
                    (size_t)m->tail_n * D * 4);
    } else if (t->kind == KVM_AF_T_AABB1) {
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

#define KVM_HASH_CHUNK KVM_AF_CHUNK
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
    *sum = kvm_af_checksum_combine(dig, n);
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
    *sum = kvm_af_checksum_combine(dig, n);
    kvm_free(dig);
    kvm_free(sts);
    return st;
}

/* ---- writer ---- */

typedef struct wctx {
    kvm_store_writer *w;
} wctx;

static kvmem_status write_piece(void *arg, unsigned char *ptr, size_t len) {
    wctx *c = arg;
    return len ? c->w->write(c->w, ptr, len) : KVMEM_OK;
}

kvmem_status kvm_agent_write(kvmem_pool *p, const kvm_agent_mem *cm, kvm_store_writer *w) {
    kvm_agent_mem *m = (kvm_agent_mem *)(uintptr_t)cm; /* read only: the piece walker is shared with the loader */
    uint64_t ts = 0;
    for (int32_t b = 0; b < m->n_sealed; b++) ts += (uint64_t)m->blocks[b].n_tokens;
    kvm_af_plan pl;
    const kvm_af_geom g = geom_of(p);
    kvmem_status st = kvm_af_plan_build(&g, KVM_AF_VERSION, (uint64_t)m->n_sealed, ts, (uint64_t)m->tail_n, &pl);
    if (st != KVMEM_OK) {
        w->abort(w);
        return st;
    }
    wctx c = {w};
    uint64_t sum = 0;
    pieces ps = {0};
    kvm_af_plan_lay_out(&pl);
    for (int i = 0; i < pl.n; i++) for_pieces(p, m, NULL, &pl.t[i], collect, &ps);
    /* a writer without positional writes (a network store) gets the
     * checksum first, from a hashing pass, then the bytes in order */
    const int one_pass = w->pwritev_at != NULL;
    if (!one_pass) {
        st = ps.oom ? kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the list of data pieces")
                    : run_chunks(p, &ps, NULL, 0, 0, &sum);
        if (st != KVMEM_OK) {
            kvm_free(ps.v);
            kvm_af_plan_free(&pl);
            w->abort(w);
            return st;
        }
    }
    const kvm_af_meta meta = {m->id, &p->spec, p->params.storage_dtype, p->params.block_size, m->n_tokens,
                              m->n_sealed, m->n_sealed ? &m->blocks[0].n_tokens : NULL, sizeof m->blocks[0],
                              m->token_ids, m->token_text_off, m->text, m->text_len};
    kvm_af_header h;
    st = ps.oom ? kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the list of data pieces")
                : kvm_af_header_build(&meta, &pl, sum, &h);
    if (st != KVMEM_OK) {
        kvm_free(ps.v);
        kvm_af_plan_free(&pl);
        w->abort(w);
        return st;
    }
    const size_t hn = kvm_af_header_size(&h);
    if (one_pass) {
        st = write_chunks(p, &ps, w, (uint64_t)hn, &sum);
        if (st == KVMEM_OK) {
            kvm_af_header_set_checksum(&h, sum);
            struct iovec hv[1] = {{(void *)(uintptr_t)kvm_af_header_bytes(&h), hn}};
            st = w->pwritev_at(w, 0, hv, 1);
        }
    } else {
        st = w->write(w, kvm_af_header_bytes(&h), hn);
        for (int i = 0; i < pl.n && st == KVMEM_OK; i++) st = for_pieces(p, m, NULL, &pl.t[i], write_piece, &c);
    }
    kvm_af_header_free(&h);
    kvm_free(ps.v);
    kvm_af_plan_free(&pl);
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

static void fresh_free(kvmem_pool *p, kvm_agent_mem *f) {
    if (!f) return;
    if (f->mapped) kvm_agent_mem_clear(f); /* no block memory: its KV stays in the file */
    else kvm_agent_mem_release(p, f);
    kvm_free(f);
}

typedef struct loadstate {
    kvm_st_header hdr;
    char *header;
    kvm_af_plan pl;
    kvm_af_tensor **order;
    int32_t *block_n;
    float *aabb1; /* version 1: the f32 AABBs as read, before conversion */
    kvm_agent_mem *fresh;
    kvmem_pool *pool;
} loadstate;

static void ls_free(loadstate *s) {
    kvm_st_header_free(&s->hdr);
    kvm_free(s->header);
    kvm_af_plan_free(&s->pl);
    kvm_free(s->order);
    kvm_free(s->block_n);
    kvm_aligned_free(s->aabb1);
    fresh_free(s->pool, s->fresh);
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
    if ((st = kvm_st_header_len(len8, size, KVM_AF_MAX_HEADER, &hl)) != KVMEM_OK) return st;
    s.header = kvm_malloc((size_t)hl);
    if (!s.header) return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the file's JSON header");
    if ((st = read_exact(r, 8, s.header, (size_t)hl, "header")) != KVMEM_OK) goto done;
    /* Nothing read from a file is quoted in a message until the file has
     * shown itself to be a kvmem agent file (its metadata checks out): a
     * caller may pass any path and show the message to someone who should
     * not read that file. */
    kvm_st_rules rules = kvm_af_rules();
    if ((st = kvm_st_parse(s.header, (size_t)hl, size - 8 - hl, &rules, &s.hdr)) != KVMEM_OK) goto done;
    const kvm_af_expect want = {&p->spec, p->params.storage_dtype, p->params.block_size,
                                p->params.max_tokens_per_agent, expect_id};
    kvm_af_info info;
    if ((st = kvm_af_check_meta(&s.hdr, &want, &info)) != KVMEM_OK) goto done;
    const int64_t n_tokens = info.n_tokens;
    rules.quote = 1; /* an agent file now */
    if (mapped && info.version < 2) {
        st = kvm_fail(KVMEM_ERR_UNSUPPORTED, "a format version 1 file cannot be mapped: load it with kvmem_agent_load and "
                                             "save it again (version 2)");
        goto done;
    }

    /* blocks: lengths in [1, BS], the tail shorter than a block */
    const int32_t BS = p->params.block_size;
    int64_t n_sealed = 0, tail_n = 0;
    if ((st = kvm_af_block_lengths(&s.hdr, BS, n_tokens, &s.block_n, &n_sealed, &tail_n)) != KVMEM_OK) goto done;
    const int64_t ts = n_tokens - tail_n;
    const kvm_af_geom g = geom_of(p);
    if ((st = kvm_af_plan_build(&g, info.version, (uint64_t)n_sealed, (uint64_t)ts, (uint64_t)tail_n, &s.pl)) != KVMEM_OK)
        goto done;
    if ((st = kvm_af_plan_match(&s.pl, &s.hdr, &s.order)) != KVMEM_OK) goto done;
    /* in range, sized by their shapes, aligned, tiling the data section */
    if ((st = kvm_st_check_layout(&s.hdr, &rules)) != KVMEM_OK) goto done;

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
        snprintf(f->id, sizeof f->id, "%s", info.agent_id);
        mp->data_off = 8 + hl;
        mp->file_size = size;
        mp->ts = (uint64_t)ts;
        for (int i = 0; i < s.pl.n; i++) {
            const kvm_af_tensor *t = &s.pl.t[i];
            if (t->kind == KVM_AF_T_KV) mp->raw_begin[(size_t)t->which * (size_t)p->spec.n_layers + (size_t)t->layer] = t->begin;
            else if (t->kind == KVM_AF_T_QKV) mp->q_begin[t->part][t->which] = t->begin;
        }
    }
    size_t text_cap = 0;
    if ((st = kvm_af_text_len(&s.hdr, &text_cap)) != KVMEM_OK) goto done;
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
    /* token ids, text and offsets */
    if ((st = kvm_af_token_ids(&s.hdr, n_tokens, f->token_ids)) != KVMEM_OK) goto done;
    if ((st = kvm_af_text(&s.hdr, f->text, text_cap)) != KVMEM_OK) goto done;
    f->text_len = text_cap;
    if ((st = kvm_af_token_offsets(&s.hdr, n_tokens, text_cap, f->token_text_off)) != KVMEM_OK) goto done;

    if (info.version < 2 && n_sealed) {
        s.aabb1 = kvm_aligned_alloc((size_t)n_sealed * (size_t)p->spec.n_layers * p->row_elems * 2 * sizeof(float));
        if (!s.aabb1) {
            st = kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the f32 AABBs of a version 1 file (%lld blocks)",
                          (long long)n_sealed);
            goto done;
        }
    }
    pieces ps = {0};
    uint64_t got_sum = info.checksum;
    if (mapped) {
        if (mp) mp->blocks = f->blocks;
        /* resident: the AABBs and the tail; then the checksum of the whole
         * data section, hashed in chunks and kept nowhere */
        for (int i = 0; i < s.pl.n && st == KVMEM_OK; i++) {
            cursor c = {r, 8 + hl + s.order[i]->begin};
            if (s.order[i]->kind == KVM_AF_T_TAIL || s.order[i]->kind == KVM_AF_T_AABB)
                st = for_pieces(p, f, NULL, s.order[i], read_piece, &c);
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
    if (got_sum != info.checksum) {
        st = kvm_fail(KVMEM_ERR_CORRUPT, "checksum mismatch: the data section is corrupt (stored %016" PRIx64 ", computed %016" PRIx64 ")",
                      info.checksum, got_sum);
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
        for (size_t gi = 0; gi < 2 * (size_t)p->spec.n_layers * (size_t)p->spec.n_kv_heads; gi++)
            bad += ck->count_nonfinite(f->tail + gi * (size_t)BS * D, (size_t)tail_n * D);
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
