/* The file-mapped tier: reading a mapped agent's blocks from its file
 * (see mapped.h for why pread and no cache of our own). */
#include "mapped.h"
#include "agent_io.h"

#include <stdatomic.h>
#include <string.h>

/* Stack bounce buffer of one read: a few rows of the widest section row
 * (head_dim <= 2 * KVM_ROPE_MAX_PAIRS = 1024 f32 values = 4 KiB). */
#define KVM_MAP_BUF ((size_t)16 << 10)

static kvmem_status read_all(const kvm_mapped *mp, uint64_t off, void *dst, size_t len) {
    unsigned char *d = dst;
    while (len) {
        size_t got = 0;
        kvmem_status st = mp->r->read_at(mp->r, off, d, len, &got);
        if (st != KVMEM_OK) return st;
        if (got == 0) return KVMEM_ERR_CORRUPT; /* the file shrank since it was opened */
        d += got;
        off += got;
        len -= got;
    }
    return KVMEM_OK;
}

/* A run's parts in its buffer (kvm_mapped_fetch): codes, scales, biases of
 * its n rows, then the per-channel scale and bias rows of KIVI keys; raw
 * dtypes: the n rows as stored. */
typedef struct run_layout {
    kvm_qsection one; /* the layout of one row */
    size_t codes, scales, biases, ch_scales, ch_biases, bytes;
} run_layout;

static run_layout layout_of(const kvmem_pool *p, int which, size_t n) {
    const kvmem_dtype dt = p->params.storage_dtype;
    const size_t D = (size_t)p->spec.head_dim;
    run_layout r;
    memset(&r, 0, sizeof r);
    if (!kvm_is_quant_dtype(dt)) {
        r.bytes = n * D * kvm_dtype_size(dt);
        return r;
    }
    r.one = kvm_qsection_layout(dt, which, 1, D);
    const size_t sr = r.one.per_channel ? 0 : r.one.scales_bytes, br = r.one.per_channel ? 0 : r.one.biases_bytes;
    r.scales = kvm_qpad4(n * r.one.codes_bytes);
    r.biases = r.scales + kvm_qpad4(n * sr);
    r.ch_scales = r.biases + kvm_qpad4(n * br);
    r.ch_biases = r.ch_scales + (r.one.per_channel ? D * 2 : 0);
    r.bytes = r.ch_biases + (r.one.per_channel ? D * 2 : 0);
    return r;
}

size_t kvm_mapped_run_bytes(const kvmem_pool *p, int which, int32_t n) { return layout_of(p, which, (size_t)n).bytes; }

static kvmem_status fetch_run(const kvmem_pool *p, const kvm_block *b, int which, int32_t l, int32_t h, int32_t row0,
                              int32_t n, void *buf) {
    const kvm_mapped *mp = b->map;
    const kvmem_dtype dt = p->params.storage_dtype;
    const size_t D = (size_t)p->spec.head_dim;
    const run_layout r = layout_of(p, which, (size_t)n);
    unsigned char *d = buf;
    if (!kvm_is_quant_dtype(dt)) {
        /* layer_{l}_{k,v} is [H][ts][D]: the block's rows of head h are one run */
        const size_t row_bytes = D * kvm_dtype_size(dt);
        const uint64_t off = mp->data_off + mp->raw_begin[(size_t)which * (size_t)p->spec.n_layers + (size_t)l] +
                             ((uint64_t)h * mp->ts + (uint64_t)b->first_token + (uint64_t)row0) * row_bytes;
        return read_all(mp, off, d, r.bytes);
    }
    const size_t H = (size_t)p->spec.n_kv_heads, LH = (size_t)p->spec.n_layers * H, g = (size_t)l * H + (size_t)h;
    const size_t cr = r.one.codes_bytes, sr = r.one.per_channel ? 0 : r.one.scales_bytes,
                 br = r.one.per_channel ? 0 : r.one.biases_bytes;
    /* tensors hold one row per (block, layer, head, token), block after block */
    const uint64_t r0 = (uint64_t)LH * (uint64_t)b->first_token + (uint64_t)g * (uint64_t)b->n_tokens + (uint64_t)row0;
    kvmem_status st;
    if ((st = read_all(mp, mp->data_off + mp->q_begin[0][which] + r0 * cr, d, (size_t)n * cr)) != KVMEM_OK) return st;
    if (sr && (st = read_all(mp, mp->data_off + mp->q_begin[1][which] + r0 * sr, d + r.scales, (size_t)n * sr)) != KVMEM_OK)
        return st;
    if (br && (st = read_all(mp, mp->data_off + mp->q_begin[2][which] + r0 * br, d + r.biases, (size_t)n * br)) != KVMEM_OK)
        return st;
    if (r.one.per_channel) { /* KIVI keys: one scale/bias row per (block, layer, head) */
        const uint64_t idx = (uint64_t)(b - mp->blocks) * LH + g;
        if ((st = read_all(mp, mp->data_off + mp->q_begin[1][which] + idx * D * 2, d + r.ch_scales, D * 2)) != KVMEM_OK ||
            (st = read_all(mp, mp->data_off + mp->q_begin[2][which] + idx * D * 2, d + r.ch_biases, D * 2)) != KVMEM_OK)
            return st;
    }
    return KVMEM_OK;
}

/* Rows decode independently (core/quant/quant.h), so a run decodes as a
 * section of that many rows: the same kernels on the same bytes as a block
 * in memory. */
void kvm_mapped_decode(const kvmem_pool *p, int which, int32_t n, const void *buf, float *dst) {
    const kvmem_dtype dt = p->params.storage_dtype;
    const size_t D = (size_t)p->spec.head_dim;
    if (!kvm_is_quant_dtype(dt)) {
        kvm_convert_host(dst, KVMEM_F32, buf, dt, (size_t)n * D); /* exact: f16/bf16 -> f32 */
        return;
    }
    const run_layout r = layout_of(p, which, (size_t)n);
    unsigned char *d = (unsigned char *)(uintptr_t)buf; /* kvm_qparts is not const; decoding only reads */
    kvm_qparts parts = {d, d + (r.one.per_channel ? r.ch_scales : r.scales), d + (r.one.per_channel ? r.ch_biases : r.biases)};
    kvm_dequant_parts(dt, which, parts, (size_t)n, D, 0, (size_t)n, dst);
}

/* Rows [row0, row0 + n) in runs that fit a stack bounce buffer; f32 rows
 * straight into dst. */
static kvmem_status read_rows(const kvmem_pool *p, const kvm_block *b, int which, int32_t l, int32_t h, int32_t row0,
                              int32_t n, float *dst) {
    if (p->params.storage_dtype == KVMEM_F32) return fetch_run(p, b, which, l, h, row0, n, dst);
    _Alignas(64) unsigned char buf[KVM_MAP_BUF];
    const size_t D = (size_t)p->spec.head_dim;
    size_t per = KVM_MAP_BUF / kvm_mapped_run_bytes(p, which, 1);
    while (per > 1 && kvm_mapped_run_bytes(p, which, (int32_t)per) > KVM_MAP_BUF) per--;
    for (int32_t done = 0; done < n;) {
        const int32_t c = (int32_t)KVM_MIN(per, (size_t)(n - done));
        kvmem_status st = fetch_run(p, b, which, l, h, row0 + done, c, buf);
        if (st != KVMEM_OK) return st;
        kvm_mapped_decode(p, which, c, buf, dst + (size_t)done * D);
        done += c;
    }
    return KVMEM_OK;
}

/* The first failed read of the mapping, for the caller's kvm_mapped_check. */
static void note_failure(const kvm_block *b, kvmem_status st) {
    kvm_mapped *mp = (kvm_mapped *)(uintptr_t)b->map; /* only the atomics change */
    int none = 0;
    if (atomic_compare_exchange_strong(&mp->err, &none, (int)st))
        atomic_store(&mp->err_block, (int)(b - mp->blocks));
}

void kvm_mapped_read_f32(const kvmem_pool *p, const kvm_block *b, int which, int32_t l, int32_t h, int32_t row0,
                         int32_t n, float *dst) {
    kvmem_status st = read_rows(p, b, which, l, h, row0, n, dst);
    if (st == KVMEM_OK) return;
    /* never garbage: zeros, and the failure for the caller's check */
    memset(dst, 0, (size_t)n * (size_t)p->spec.head_dim * sizeof *dst);
    note_failure(b, st);
}

kvmem_status kvm_mapped_fetch(const kvmem_pool *p, const kvm_block *b, int which, int32_t l, int32_t h, int32_t row0,
                              int32_t n, void *buf) {
    kvmem_status st = fetch_run(p, b, which, l, h, row0, n, buf);
    if (st != KVMEM_OK) note_failure(b, st);
    return st;
}

kvmem_status kvm_mapped_check(const kvm_agent_mem *m, kvmem_status st, const char *fn) {
    if (!m || !m->mapped) return st;
    kvm_mapped *mp = m->mapped;
    int e = atomic_exchange(&mp->err, 0);
    if (!e || st != KVMEM_OK) return st;
    return kvm_fail((kvmem_status)e, "%s: reading block %d of agent '%s' from '%s' failed: %s", fn,
                    atomic_load(&mp->err_block), m->id, mp->path,
                    e == KVMEM_ERR_CORRUPT ? "the file ends early (it shrank after kvmem_agent_open_file)"
                                           : "the operating system's read failed");
}

kvmem_status kvm_mapped_refuse(const kvm_agent_mem *m, const char *fn) {
    if (!m->mapped) return KVMEM_OK;
    return kvm_fail(KVMEM_ERR_UNSUPPORTED,
                    "%s: agent '%s' is mapped read-only from '%s' (kvmem_agent_open_file): load it with "
                    "kvmem_agent_load to change it",
                    fn, m->id, m->mapped->path);
}

void kvm_mapped_free(kvm_mapped *mp) {
    if (!mp) return;
    if (mp->r) mp->r->close(mp->r);
    kvm_free(mp->raw_begin);
    kvm_free(mp->path);
    kvm_free(mp);
}

static kvmem_status open_file(kvmem_pool *p, const char *path, uint32_t flags, kvmem_agent **out) {
    const char *fn = "kvmem_agent_open_file";
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if (!p) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: pool is NULL", fn);
    if (!path || !*path) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: path is %s", fn, path ? "empty" : "NULL");
    if (flags & ~(uint32_t)KVMEM_OPEN_FILE_NO_VERIFY)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: unknown flags 0x%x", fn, (unsigned)(flags & ~(uint32_t)KVMEM_OPEN_FILE_NO_VERIFY));
    kvm_store_reader *r;
    uint64_t size;
    kvmem_status st = kvm_file_open_read(path, &r, &size);
    if (st != KVMEM_OK) return st;
    kvm_agent_mem *m = NULL;
    if ((st = kvm_agent_parse_mapped(p, r, size, path, !(flags & KVMEM_OPEN_FILE_NO_VERIFY), &m)) != KVMEM_OK) {
        r->close(r);
        return st;
    }
    /* from here m owns r */
    if ((st = kvm_pool_adopt(p, m, fn, out)) != KVMEM_OK) {
        kvm_agent_mem_clear(m);
        kvm_free(m);
    }
    return st;
}

kvmem_status kvmem_agent_open_file(kvmem_pool *p, const char *path, uint32_t flags, kvmem_agent **out) {
    int own = p ? kvm_err_begin(&p->err) : 0;
    kvmem_status st = open_file(p, path, flags, out);
    kvm_err_end(own);
    return st;
}
