/* Argument checks and launch plans of the CUDA backend's device-kernel table
 * entries (plain C, tested on the CPU by tests/backend/test_cuda_host.c). */
#include "cuda_host.h"
#include "rules.h"

#include "backend.h"
#include "attend_dev.h"
#include "dev_args.h"

#include <math.h>
#include <stdint.h>

#define FAIL_ARG(...) kvm_cu_fail(KVMEM_ERR_INVALID_ARG, __VA_ARGS__)
#define FAIL_UNSUP(...) kvm_cu_fail(KVMEM_ERR_UNSUPPORTED, __VA_ARGS__)

bool kvm_cu_mul2(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return false;
    *out = a * b;
    return true;
}

bool kvm_cu_mul3(size_t a, size_t b, size_t c, size_t *out) {
    size_t ab;
    return kvm_cu_mul2(a, b, &ab) && kvm_cu_mul2(ab, c, out);
}

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

static int32_t pow2_at_least(int32_t n) {
    int32_t p = 1;
    while (p < n) p <<= 1;
    return p;
}

/* Each check runs the core's shared checks first (core/backend/dev_args.h,
 * core/backend/attend_dev.h: every backend refuses the same input with the
 * same words), then this backend's own limits (KVMEM_ERR_UNSUPPORTED). */

/* A shared check's failure as this backend's error. */
static kvmem_status shared_fail(kvmem_status st, const char *msg) { return kvm_cu_fail(st, "%s", msg); }

/* [off, off + 4n) inside a buffer of `size` bytes (size 0 for NULL) */
static bool holds(size_t size, size_t off, size_t n) {
    size_t b;
    return kvm_cu_mul2(n, 4, &b) && kvm_cu_in_range(size, off, b);
}

/* ---- dev_score ---- */

kvmem_status kvm_cu_check_dev_score(const kvm_dev_score_args *a, size_t q_size, size_t s_min_size,
                                    size_t s_max_size, size_t out_size, kvm_dev_size_fn key_size,
                                    kvm_cu_dev_score_plan *plan) {
    if (!a || !plan) return FAIL_ARG("dev_score: args is NULL");
    char msg[256];
    const size_t sz[4] = {q_size, s_min_size, s_max_size, out_size};
    kvmem_status st = kvm_dev_score_check_sizes(a, sz, key_size, msg, sizeof msg);
    if (st != KVMEM_OK) return shared_fail(st, msg);
    const size_t L = (size_t)a->n_layers, Hq = (size_t)a->n_q_heads, Hkv = (size_t)a->n_kv_heads;
    const size_t NQ = (size_t)a->n_q, NB = (size_t)a->n_blocks;
    if (a->head_dim > KVM_CU_DEV_MAX_HEAD_DIM)
        return FAIL_UNSUP("dev_score: head_dim %d: the CUDA kernel takes at most %d", a->head_dim,
                          KVM_CU_DEV_MAX_HEAD_DIM);
    if (a->n_blocks > (1 << 26))
        return FAIL_UNSUP("dev_score: %d blocks: the CUDA kernel takes at most 2^26", a->n_blocks);
    kvm_cu_dev_score_plan p;
    p.blocks_per_cta = 64; /* 8 warps, 8 blocks each */
    p.rows_chunk = 32;     /* one query row per lane */
    size_t ctas = L * Hkv * ((NB + (size_t)p.blocks_per_cta - 1) / (size_t)p.blocks_per_cta);
    if (ctas > INT32_MAX || L * Hq > INT32_MAX)
        return FAIL_UNSUP("dev_score: %zu thread blocks exceed the CUDA grid", ctas);
    p.score_ctas = (int64_t)ctas;
    size_t sc;
    if (!kvm_cu_mul3(L * Hq, NQ, NB, &sc) || !kvm_cu_mul2(sc, 4, &p.ws_scores) || p.ws_scores > SIZE_MAX / 2)
        return FAIL_UNSUP("dev_score: the score workspace overflows");
    p.ws_scores = align256(p.ws_scores);
    p.sort_len = a->norm == KVMEM_NORM_RR ? pow2_at_least(a->n_blocks) : 0;
    p.sort_in_smem = p.sort_len <= KVM_CU_SORT_SMEM_PAIRS;
    p.ws_sort = 0;
    if (a->norm == KVMEM_NORM_RR && !p.sort_in_smem) {
        if (!kvm_cu_mul3(L * Hq, (size_t)p.sort_len, 8, &p.ws_sort) || p.ws_sort > SIZE_MAX / 2)
            return FAIL_UNSUP("dev_score: the sort workspace overflows");
        p.ws_sort = align256(p.ws_sort);
    }
    p.ws_bytes = p.ws_scores + p.ws_sort;
    *plan = p;
    return KVMEM_OK;
}

/* ---- dev_score_reduce ---- */

kvmem_status kvm_cu_check_dev_score_reduce(const kvm_dev_score_reduce_args *a, size_t in_size, size_t out_size) {
    char msg[256];
    const size_t sz[2] = {in_size, out_size};
    kvmem_status st = kvm_dev_score_reduce_check_sizes(a, sz, msg, sizeof msg);
    return st == KVMEM_OK ? KVMEM_OK : shared_fail(st, msg);
}

/* ---- dev_topk ---- */

kvmem_status kvm_cu_check_dev_topk(const kvm_dev_topk_args *a, size_t scores_size, size_t idx_size) {
    char msg[256];
    const size_t sz[2] = {scores_size, idx_size};
    kvmem_status st = kvm_dev_topk_check_sizes(a, sz, msg, sizeof msg);
    return st == KVMEM_OK ? KVMEM_OK : shared_fail(st, msg);
}

/* ---- dev_gather_rope ---- */

kvmem_status kvm_cu_check_dev_gather(const kvm_dev_gather_args *a, size_t src_size, size_t idx_size,
                                     size_t cs_size, size_t out_size) {
    char msg[256];
    const size_t sz[4] = {src_size, idx_size, cs_size, out_size};
    kvmem_status st = kvm_dev_gather_check_sizes(a, sz, msg, sizeof msg);
    if (st != KVMEM_OK) return shared_fail(st, msg);
    const size_t row = a->n_heads * a->head_dim; /* checked by the shared rules */
    if (a->n_out > INT32_MAX || row > INT32_MAX)
        return FAIL_UNSUP("dev_gather_rope: %zu output rows of %zu exceed the CUDA kernel's range", a->n_out, row);
    return KVMEM_OK;
}

/* ---- dev_attend ---- */

kvmem_status kvm_cu_check_dev_attend_mirror(const kvm_dev_attend_args *a, size_t k_tail_size, size_t v_tail_size,
                                            size_t rope_cs_size) {
    if (!a) return FAIL_ARG("dev_attend: args is NULL");
    char msg[256];
    if (!kvm_dev_attend_check_mirror(a, k_tail_size, v_tail_size, rope_cs_size, msg, sizeof msg))
        return FAIL_ARG("dev_attend: %s", msg);
    if (a->k_tail && a->tail_slot > INT32_MAX)
        return FAIL_UNSUP("dev_attend: tail_slot %lld exceeds the CUDA kernel's 32-bit slots", (long long)a->tail_slot);
    return KVMEM_OK;
}

kvmem_status kvm_cu_check_dev_attend(const kvm_dev_attend_args *a, size_t q_size, size_t k_size, size_t v_size,
                                     size_t slot_map_size, size_t order_size, size_t out_size,
                                     size_t visited_size, int32_t n_sms, kvm_cu_dev_attend_plan *plan) {
    if (!a || !plan) return FAIL_ARG("dev_attend: args is NULL");
    char msg[256];
    const size_t sz[KVM_DA_N] = {q_size, k_size, v_size, slot_map_size, order_size, out_size, visited_size};
    if (!kvm_dev_attend_check(a, sz, msg, sizeof msg)) return FAIL_ARG("dev_attend: %s", msg);
    const int64_t n_tiles = (a->n_pos + a->tile - 1) / a->tile;
    const size_t Hq = (size_t)a->n_q_heads, Hkv = (size_t)a->n_kv_heads, D = (size_t)a->head_dim;
    if (a->head_dim > KVM_CU_DEV_MAX_HEAD_DIM)
        return FAIL_UNSUP("dev_attend: head_dim %d: the CUDA kernel takes at most %d", a->head_dim,
                          KVM_CU_DEV_MAX_HEAD_DIM);
    if (a->n_slots > INT32_MAX || a->n_kv_heads > 65535)
        return FAIL_UNSUP("dev_attend: %lld slots, %d KV heads exceed the CUDA kernel's 32-bit indices",
                          (long long)a->n_slots, a->n_kv_heads);
    kvm_cu_dev_attend_plan p;
    p.n_tiles = n_tiles;
    p.group = a->n_q_heads / a->n_kv_heads;
    p.n_gchunks = (p.group + KVM_CU_ATTEND_GROUP_CHUNK - 1) / KVM_CU_ATTEND_GROUP_CHUNK;
    p.vec = a->head_dim <= 32 ? 1 : a->head_dim <= 64 ? 2 : a->head_dim <= 128 ? 4 : 8;
    if (p.n_gchunks > 65535) return FAIL_UNSUP("dev_attend: %d query heads per KV head", p.group);
    /* enough (tile, KV head) CTAs to fill every SM about 4 times */
    int32_t sms = n_sms > 0 ? n_sms : 80;
    int64_t tpw = (4 * (int64_t)sms + a->n_kv_heads - 1) / a->n_kv_heads;
    if (tpw < 1) tpw = 1;
    if (tpw > a->n_visit) tpw = a->n_visit > 0 ? a->n_visit : 1;
    p.tiles_per_wave = (int32_t)tpw;
    p.n_waves = a->n_visit > 0 ? (a->n_visit + p.tiles_per_wave - 1) / p.tiles_per_wave : 0;
    p.probe_n = kvm_cu_probe_len(p.group * a->head_dim);
    size_t at = 0;
    p.off_part = at;
    at += align256(Hq * (size_t)p.tiles_per_wave * (D + 2) * 4);
    p.off_live = at;
    at += align256(Hkv * (size_t)p.tiles_per_wave * 4);
    p.off_bad = at;
    at += align256(Hkv * (size_t)p.tiles_per_wave * 4);
    p.off_o = at;
    at += align256(Hq * D * 4);
    p.off_ml = at;
    at += align256(Hq * 2 * 4);
    p.off_z = at;
    at += align256(Hkv * KVM_CU_PROBE * 4);
    p.off_rule = at;
    at += align256(Hkv * sizeof(kvm_cu_rule));
    p.off_pos = at;
    at += align256(Hkv * 4);
    p.off_score = at;
    if (a->scored) {
        size_t sb;
        if (!kvm_cu_mul3(Hkv, (size_t)n_tiles, 4, &sb) || n_tiles > INT32_MAX)
            return FAIL_UNSUP("dev_attend: the scores of %lld tiles x %d KV heads overflow", (long long)n_tiles,
                              a->n_kv_heads);
        at += align256(sb);
    }
    p.ws_bytes = at;
    *plan = p;
    return KVMEM_OK;
}

/* ---- dev_qmem_score ---- */

kvmem_status kvm_cu_check_dev_qmem(const kvm_dev_qmem_args *a, size_t mem_size, size_t k_size, size_t scores_size) {
    if (!a) return FAIL_ARG("dev_qmem_score: args is NULL");
    if (a->n_layers < 1 || a->n_q_heads < 1 || a->n_kv_heads < 1 || a->n_q_heads % a->n_kv_heads ||
        a->head_dim < 1 || a->n < 1)
        return FAIL_ARG("dev_qmem_score: %d layers, %d/%d heads, head_dim %d, %d tokens: need >= 1 and query heads a "
                        "multiple of KV heads",
                        a->n_layers, a->n_q_heads, a->n_kv_heads, a->head_dim, a->n);
    if (a->mem_off % 4 || a->k_off % 4 || a->scores_off % 4)
        return FAIL_ARG("dev_qmem_score: offsets must be multiples of 4 bytes");
    /* a NULL buffer has size 0: its range is outside */
    const size_t L = (size_t)a->n_layers, D = (size_t)a->head_dim;
    size_t mem_el, k_el, t;
    bool ok = kvm_cu_mul3(L, (size_t)a->n_q_heads, D, &mem_el) && kvm_cu_mul3(L, (size_t)a->n, (size_t)a->n_kv_heads, &t) &&
              kvm_cu_mul2(t, D, &k_el) && a->mem && a->k && a->scores && holds(mem_size, a->mem_off, mem_el) &&
              holds(k_size, a->k_off, k_el) && holds(scores_size, a->scores_off, (size_t)a->n);
    if (!ok) return FAIL_ARG("dev_qmem_score: ranges outside the buffers");
    if (a->head_dim > KVM_CU_DEV_MAX_HEAD_DIM)
        return FAIL_UNSUP("dev_qmem_score: head_dim %d: the CUDA kernel takes at most %d", a->head_dim,
                          KVM_CU_DEV_MAX_HEAD_DIM);
    if (a->n_q_heads > 65535) return FAIL_UNSUP("dev_qmem_score: %d query heads exceed the CUDA grid", a->n_q_heads);
    return KVMEM_OK;
}

/* ---- host runs of the shared rules ---- */

void kvm_cu_host_rope_pair(float x0, float x1, float c, float s, float af, float *y0, float *y1) {
    kvm_cu_rope_pair(x0, x1, c, s, af, y0, y1);
}

void kvm_cu_host_rope_angle_add(float cb, float sb, float cp, float sp, float *c, float *s) {
    kvm_cu_rope_angle_add(cb, sb, cp, sp, c, s);
}

/* ---- supports_op ---- */

int kvm_cu_supports_op(kvmem_backend *be, kvm_op op, const void *args) {
    (void)be;
    return kvm_dev_args_buffer_form(op, args);
}
