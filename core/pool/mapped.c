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

static kvmem_status read_raw(const kvmem_pool *p, const kvm_block *b, int which, int32_t l, int32_t h, int32_t row0,
                             int32_t n, float *dst) {
    const kvm_mapped *mp = b->map;
    const kvmem_dtype dt = p->params.storage_dtype;
    const size_t D = (size_t)p->spec.head_dim, es = kvm_dtype_size(dt), row_bytes = D * es;
    /* layer_{l}_{k,v} is [H][ts][D]: the block's rows of head h are one run */
    uint64_t off = mp->data_off + mp->raw_begin[(size_t)which * (size_t)p->spec.n_layers + (size_t)l] +
                   ((uint64_t)h * mp->ts + (uint64_t)b->first_token + (uint64_t)row0) * row_bytes;
    if (dt == KVMEM_F32) return read_all(mp, off, dst, (size_t)n * row_bytes);
    _Alignas(64) unsigned char buf[KVM_MAP_BUF];
    const size_t per = KVM_MAP_BUF / row_bytes;
    for (size_t done = 0; done < (size_t)n;) {
        size_t c = KVM_MIN(per, (size_t)n - done);
        kvmem_status st = read_all(mp, off + done * row_bytes, buf, c * row_bytes);
        if (st != KVMEM_OK) return st;
        kvm_convert_host(dst + done * D, KVMEM_F32, buf, dt, c * D); /* exact: f16/bf16 -> f32 */
        done += c;
    }
    return KVMEM_OK;
}

/* Rows decode independently (core/quant/quant.h), so a run of rows read
 * into a bounce buffer decodes as a section of that many rows: the same
 * kernels on the same bytes as a block in memory. */
static kvmem_status read_quant(const kvmem_pool *p, const kvm_block *b, int which, int32_t l, int32_t h, int32_t row0,
                               int32_t n, float *dst) {
    const kvm_mapped *mp = b->map;
    const kvmem_dtype dt = p->params.storage_dtype;
    const size_t D = (size_t)p->spec.head_dim, H = (size_t)p->spec.n_kv_heads, LH = (size_t)p->spec.n_layers * H;
    const size_t g = (size_t)l * H + (size_t)h;
    const kvm_qsection one = kvm_qsection_layout(dt, which, 1, D);
    const size_t cr = one.codes_bytes, sr = one.per_channel ? 0 : one.scales_bytes,
                 br = one.per_channel ? 0 : one.biases_bytes;
    /* tensors hold one row per (block, layer, head, token), block after block */
    const uint64_t row = (uint64_t)LH * (uint64_t)b->first_token + (uint64_t)g * (uint64_t)b->n_tokens + (uint64_t)row0;
    uint16_t cs[2 * KVM_ROPE_MAX_PAIRS], cb[2 * KVM_ROPE_MAX_PAIRS];
    kvmem_status st;
    if (one.per_channel) { /* KIVI keys: one scale/bias row per (block, layer, head) */
        uint64_t idx = (uint64_t)(b - mp->blocks) * LH + g;
        if ((st = read_all(mp, mp->data_off + mp->q_begin[1][which] + idx * D * 2, cs, D * 2)) != KVMEM_OK ||
            (st = read_all(mp, mp->data_off + mp->q_begin[2][which] + idx * D * 2, cb, D * 2)) != KVMEM_OK)
            return st;
    }
    _Alignas(64) uint32_t buf[KVM_MAP_BUF / 4];
    const size_t per = (KVM_MAP_BUF - 8) / (cr + sr + br);
    for (size_t done = 0; done < (size_t)n;) {
        size_t c = KVM_MIN(per, (size_t)n - done);
        unsigned char *codes = (unsigned char *)buf, *scales = codes + kvm_qpad4(c * cr),
                      *biases = scales + kvm_qpad4(c * sr);
        uint64_t r0 = row + done;
        if ((st = read_all(mp, mp->data_off + mp->q_begin[0][which] + r0 * cr, codes, c * cr)) != KVMEM_OK) return st;
        if (sr && (st = read_all(mp, mp->data_off + mp->q_begin[1][which] + r0 * sr, scales, c * sr)) != KVMEM_OK)
            return st;
        if (br && (st = read_all(mp, mp->data_off + mp->q_begin[2][which] + r0 * br, biases, c * br)) != KVMEM_OK)
            return st;
        kvm_qparts parts = {codes, one.per_channel ? (unsigned char *)cs : scales,
                            one.per_channel ? (unsigned char *)cb : biases};
        kvm_dequant_parts(dt, which, parts, c, D, 0, c, dst + done * D);
        done += c;
    }
    return KVMEM_OK;
}

void kvm_mapped_read_f32(const kvmem_pool *p, const kvm_block *b, int which, int32_t l, int32_t h, int32_t row0,
                         int32_t n, float *dst) {
    kvmem_status st = kvm_is_quant_dtype(p->params.storage_dtype) ? read_quant(p, b, which, l, h, row0, n, dst)
                                                                   : read_raw(p, b, which, l, h, row0, n, dst);
    if (st == KVMEM_OK) return;
    /* never garbage: zeros, and the failure for the caller's check */
    memset(dst, 0, (size_t)n * (size_t)p->spec.head_dim * sizeof *dst);
    kvm_mapped *mp = (kvm_mapped *)(uintptr_t)b->map; /* only the atomics change */
    int none = 0;
    if (atomic_compare_exchange_strong(&mp->err, &none, (int)st))
        atomic_store(&mp->err_block, (int)(b - mp->blocks));
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
