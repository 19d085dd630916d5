/* The paged physical KV store and per-request slot maps: eviction by
 * redirection to the dead slot with alias-aware free, sibling sharing by
 * reference counts, and compaction for comparison. */
#include "../rope/rope.h"
#include "../cpu/tensor.h"
#include "../cpu/kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SM_BLOCK 8 /* positions per block when K/V are head-major: 32 ran slower (the block's slots outgrow the caches) */

#if defined(__GNUC__) || defined(__clang__)
#  define KVM_PREFETCH_W(p) __builtin_prefetch((p), 1, 1)
#else
#  define KVM_PREFETCH_W(p) ((void)(p))
#endif

struct kvmem_kvstore {
    kvmem_model_spec spec; /* geometry and RoPE; layer_window NULL */
    kvm_rope rope;
    size_t row_elems;  /* n_layers * n_kv_heads * head_dim: one token's K (or V) */
    int32_t page_slots, page_shift;
    int64_t max_slots;
    pthread_mutex_t mu; /* everything below */
    float **pages;      /* [page_slots][2][row_elems] each */
    int32_t n_pages, cap_pages;
    int32_t *refs;      /* [n_slots] */
    int32_t *free_list; /* stack of free slots, [n_slots] */
    int64_t n_free, n_slots, n_used;
};

struct kvmem_slotmap {
    kvmem_kvstore *store;
    int32_t *slots;
    int64_t len, cap, n_live, protect;
    int32_t *parked; /* dropped protected-prefix slots whose reference is kept */
    int64_t n_parked, cap_parked;
};

static inline float *slot_k(const kvmem_kvstore *s, int32_t slot) {
    return s->pages[slot >> s->page_shift] + (size_t)(slot & (s->page_slots - 1)) * 2 * s->row_elems;
}

kvmem_status kvmem_kvstore_params_init(kvmem_kvstore_params *params, size_t struct_size) {
    kvmem_kvstore_params p;
    memset(&p, 0, sizeof p);
    p.page_slots = 256;
    p.max_slots = 0;
    return KVM_PARAMS_INIT(kvmem_kvstore_params, params, struct_size, &p, "kvmem_kvstore_params_init");
}

/* Add pages until `need` more free slots exist. Lock held. All or nothing. */
static kvmem_status grow(kvmem_kvstore *s, int64_t need) {
    if (s->n_free >= need) return KVMEM_OK;
    int64_t add_slots = need - s->n_free;
    int64_t add_pages = (add_slots + s->page_slots - 1) / s->page_slots;
    int64_t new_slots = s->n_slots + add_pages * s->page_slots;
    if (new_slots > INT32_MAX)
        return kvm_fail(KVMEM_ERR_CAPACITY, "kv store: more than INT32_MAX slots");
    if (s->n_pages + add_pages > s->cap_pages) {
        int64_t cap = KVM_MIN(KVM_MAX((int64_t)s->cap_pages * 2, (int64_t)s->n_pages + add_pages), (int64_t)INT32_MAX);
        float **p = kvm_realloc(s->pages, (size_t)cap * sizeof *p);
        if (!p) return kvm_fail(KVMEM_ERR_NOMEM, "kv store: out of memory for the page table (%lld pages)", (long long)cap);
        s->pages = p;
        s->cap_pages = (int32_t)cap;
    }
    int32_t *r = kvm_realloc(s->refs, (size_t)new_slots * sizeof *r);
    if (!r) return kvm_fail(KVMEM_ERR_NOMEM, "kv store: out of memory for the reference counts of %lld slots", (long long)new_slots);
    s->refs = r;
    int32_t *f = kvm_realloc(s->free_list, (size_t)new_slots * sizeof *f);
    if (!f) return kvm_fail(KVMEM_ERR_NOMEM, "kv store: out of memory for the free list of %lld slots", (long long)new_slots);
    s->free_list = f;
    size_t page_bytes = (size_t)s->page_slots * 2 * s->row_elems * sizeof(float);
    for (int64_t i = 0; i < add_pages; i++) {
        float *pg = kvm_aligned_alloc(page_bytes);
        if (!pg) { /* undo the pages added in this call */
            for (int64_t u = 0; u < i; u++) kvm_aligned_free(s->pages[s->n_pages + u]);
            return kvm_fail(KVMEM_ERR_NOMEM, "kv store: out of memory for a page of %zu bytes", page_bytes);
        }
        s->pages[s->n_pages + i] = pg;
    }
    /* push the new slots so the lowest comes out first */
    for (int64_t sl = new_slots - 1; sl >= s->n_slots; sl--) {
        s->refs[sl] = 0;
        s->free_list[s->n_free++] = (int32_t)sl;
    }
    s->n_pages += (int32_t)add_pages;
    s->n_slots = new_slots;
    return KVMEM_OK;
}

/* Take n slots with one reference each. Lock held. */
static kvmem_status take(kvmem_kvstore *s, int64_t n, int32_t *out) {
    int64_t limit = s->max_slots ? s->max_slots : INT32_MAX;
    if (n > limit - s->n_used)
        return kvm_fail(KVMEM_ERR_CAPACITY, "kv store: %lld more slots needed, %lld of at most %lld in use",
                        (long long)n, (long long)s->n_used, (long long)limit);
    kvmem_status st = grow(s, n);
    if (st != KVMEM_OK) return st;
    for (int64_t i = 0; i < n; i++) {
        int32_t sl = s->free_list[--s->n_free];
        s->refs[sl] = 1;
        out[i] = sl;
    }
    s->n_used += n;
    return KVMEM_OK;
}

/* Drop one reference; returns 1 when the slot went back to the allocator.
 * Lock held. The sentinel is never counted or freed. */
static inline int release(kvmem_kvstore *s, int32_t sl) {
    if (sl == KVMEM_DEAD_SLOT) return 0;
    if (--s->refs[sl] > 0) return 0;
    s->free_list[s->n_free++] = sl;
    s->n_used--;
    return 1;
}

kvmem_status kvmem_kvstore_create(const kvmem_model_spec *spec, const kvmem_kvstore_params *params,
                                  kvmem_kvstore **out) {
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_kvstore_create: out is NULL");
    if (!spec) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_kvstore_create: spec is NULL");
    kvmem_status st = kvmem_model_spec_validate(spec);
    if (st != KVMEM_OK) return st;
    kvmem_kvstore_params p = kvmem_kvstore_default_params();
    if ((st = KVM_PARAMS_IN(kvmem_kvstore_params, &p, params, "kvmem_kvstore_create")) != KVMEM_OK) return st;
    if (p.page_slots < 1 || p.page_slots > 65536 || (p.page_slots & (p.page_slots - 1)))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kv store page_slots %d: must be a power of two in [1, 65536]",
                        p.page_slots);
    if (p.max_slots < 0 || p.max_slots == 1 || p.max_slots > INT32_MAX)
        return kvm_fail(KVMEM_ERR_INVALID_ARG,
                        "kv store max_slots %lld: must be 0 (unlimited) or in [2, INT32_MAX] (the sentinel takes one)",
                        (long long)p.max_slots);
    kvmem_kvstore *s = kvm_calloc(1, sizeof *s);
    if (!s || pthread_mutex_init(&s->mu, NULL) != 0) {
        kvm_free(s);
        return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_kvstore_create: out of memory for the store");
    }
    s->spec = *spec;
    s->spec.layer_window = NULL;
    kvm_rope_init(&s->rope, &s->spec);
    s->row_elems = (size_t)spec->n_layers * (size_t)spec->n_kv_heads * (size_t)spec->head_dim;
    s->page_slots = p.page_slots;
    while ((1 << s->page_shift) < p.page_slots) s->page_shift++;
    s->max_slots = p.max_slots;
    int32_t dead;
    st = take(s, 1, &dead);
    if (st != KVMEM_OK || dead != KVMEM_DEAD_SLOT) {
        kvmem_kvstore_free(s);
        return st != KVMEM_OK ? st : kvm_fail(KVMEM_ERR_INTERNAL, "kv store: sentinel is not slot 0");
    }
    /* the paper's sentinel, for external kernels (see the caveat in kvmem.h) */
    float *k = slot_k(s, dead);
    for (size_t i = 0; i < s->row_elems; i++) k[i] = KVMEM_SENTINEL_K;
    memset(k + s->row_elems, 0, s->row_elems * sizeof *k);
    *out = s;
    return KVMEM_OK;
}

void kvmem_kvstore_free(kvmem_kvstore *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n_pages; i++) kvm_aligned_free(s->pages[i]);
    kvm_free(s->pages);
    kvm_free(s->refs);
    kvm_free(s->free_list);
    pthread_mutex_destroy(&s->mu);
    kvm_free(s);
}

kvmem_status kvmem_kvstore_get_info(kvmem_kvstore *s, kvmem_kvstore_info *out) {
    if (!s || !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_kvstore_get_info: store or out is NULL");
    pthread_mutex_lock(&s->mu);
    out->n_slots = s->n_slots;
    out->n_used = s->n_used;
    out->n_free = s->n_free;
    out->page_slots = s->page_slots;
    out->dead_slot = KVMEM_DEAD_SLOT;
    pthread_mutex_unlock(&s->mu);
    return KVMEM_OK;
}

kvmem_status kvmem_kvstore_slot_refs(kvmem_kvstore *s, int32_t slot, int32_t *refs) {
    if (!s || !refs) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_kvstore_slot_refs: store or refs is NULL");
    pthread_mutex_lock(&s->mu);
    if (slot < 0 || slot >= s->n_slots) {
        int64_t n = s->n_slots;
        pthread_mutex_unlock(&s->mu);
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_kvstore_slot_refs: slot %d outside [0, %lld)", slot, (long long)n);
    }
    *refs = s->refs[slot];
    pthread_mutex_unlock(&s->mu);
    return KVMEM_OK;
}

kvmem_status kvmem_kvstore_read_slot(kvmem_kvstore *s, int32_t slot, float *k_out, float *v_out) {
    if (!s) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_kvstore_read_slot: store is NULL");
    pthread_mutex_lock(&s->mu);
    if (slot < 0 || slot >= s->n_slots || s->refs[slot] == 0) {
        pthread_mutex_unlock(&s->mu);
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_kvstore_read_slot: slot %d is not allocated", slot);
    }
    const float *k = slot_k(s, slot);
    if (k_out) memcpy(k_out, k, s->row_elems * sizeof *k);
    if (v_out) memcpy(v_out, k + s->row_elems, s->row_elems * sizeof *k);
    pthread_mutex_unlock(&s->mu);
    return KVMEM_OK;
}

/* ---- slot maps ---------------------------------------------------------- */

static kvmem_status reserve_i32(int32_t **a, int64_t *cap, int64_t need) {
    if (need <= *cap) return KVMEM_OK;
    size_t cs;
    if (need < 0 || !kvm_grow_cap((size_t)*cap, (size_t)need, 16, INT32_MAX, sizeof(int32_t), &cs))
        return kvm_fail(KVMEM_ERR_NOMEM, "slot map: out of memory for %lld entries", (long long)need);
    int64_t c = (int64_t)cs;
    int32_t *p = kvm_realloc(*a, (size_t)c * sizeof *p);
    if (!p) return kvm_fail(KVMEM_ERR_NOMEM, "slot map: out of memory for %lld entries", (long long)c);
    *a = p;
    *cap = c;
    return KVMEM_OK;
}

kvmem_status kvmem_slotmap_create(kvmem_kvstore *store, kvmem_slotmap **out) {
    if (!store || !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_slotmap_create: store or out is NULL");
    kvmem_slotmap *m = kvm_calloc(1, sizeof *m);
    if (!m) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_slotmap_create: out of memory for the map");
    m->store = store;
    *out = m;
    return KVMEM_OK;
}

kvmem_status kvmem_slotmap_fork(kvmem_slotmap *parent, int64_t prefix_len, kvmem_slotmap **out) {
    if (!parent || !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_slotmap_fork: parent or out is NULL");
    if (prefix_len < 0 || prefix_len > parent->len)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_slotmap_fork: prefix %lld outside [0, %lld]",
                        (long long)prefix_len, (long long)parent->len);
    kvmem_slotmap *m = kvm_calloc(1, sizeof *m);
    if (!m) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_slotmap_fork: out of memory for the map");
    m->store = parent->store;
    if (reserve_i32(&m->slots, &m->cap, prefix_len) != KVMEM_OK) {
        kvm_free(m);
        return KVMEM_ERR_NOMEM;
    }
    kvmem_kvstore *s = parent->store;
    pthread_mutex_lock(&s->mu);
    for (int64_t j = 0; j < prefix_len; j++) {
        int32_t sl = parent->slots[j];
        m->slots[j] = sl;
        if (sl != KVMEM_DEAD_SLOT) {
            s->refs[sl]++;
            m->n_live++;
        }
    }
    pthread_mutex_unlock(&s->mu);
    m->len = prefix_len;
    m->protect = KVM_MIN(parent->protect, prefix_len);
    *out = m;
    return KVMEM_OK;
}

void kvmem_slotmap_free(kvmem_slotmap *m) {
    if (!m) return;
    kvmem_kvstore *s = m->store;
    pthread_mutex_lock(&s->mu);
    for (int64_t j = 0; j < m->len; j++) release(s, m->slots[j]);
    for (int64_t i = 0; i < m->n_parked; i++) release(s, m->parked[i]);
    pthread_mutex_unlock(&s->mu);
    kvm_free(m->slots);
    kvm_free(m->parked);
    kvm_free(m);
}

kvmem_status kvmem_slotmap_append(kvmem_slotmap *m, const kvmem_tensor *k, const kvmem_tensor *v) {
    static const char fn[] = "kvmem_slotmap_append";
    if (!m) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: map is NULL", fn);
    if (!k || !v) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: K or V is NULL", fn);
    kvmem_kvstore *s = m->store;
    const kvmem_model_spec *sp = &s->spec;
    if (k->ndim != 4 || k->shape[1] < 0)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: K must be [n_layers][T][n_kv_heads][head_dim]", fn);
    int64_t T = k->shape[1];
    int64_t shape[4] = {sp->n_layers, T, sp->n_kv_heads, sp->head_dim};
    kvmem_status st = kvm_tensor_expect(k, "K", "[n_layers][T][n_kv_heads][head_dim]", 4, shape);
    if (st == KVMEM_OK) st = kvm_tensor_expect(v, "V", "[n_layers][T][n_kv_heads][head_dim]", 4, shape);
    if (st != KVMEM_OK) return st;
    if (T == 0) return KVMEM_OK;
    if (T > INT32_MAX - m->len) return kvm_fail(KVMEM_ERR_CAPACITY, "%s: map length would exceed INT32_MAX", fn);
    const size_t L = (size_t)sp->n_layers, H = (size_t)sp->n_kv_heads, D = (size_t)sp->head_dim;
    float *row = kvm_malloc(D * sizeof *row);
    int32_t *fresh = kvm_malloc((size_t)T * sizeof *fresh);
    if (!row || !fresh || reserve_i32(&m->slots, &m->cap, m->len + T) != KVMEM_OK) {
        kvm_free(row);
        kvm_free(fresh);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for %lld new positions", fn, (long long)T);
    }
    const kvm_cpu_kernels *ck = kvm_cpu_kernels_get();
    /* validate every value before taking slots: all or nothing. Rows in the
     * order they lie in memory: head-major input (HF caches, a head's rows
     * adjacent) a head at a time, position-major a position at a time */
    for (int w = 0; w < 2; w++) {
        const kvmem_tensor *x = w ? v : k;
        const int hm = H > 1 && x->strides[2] > x->strides[1];
        for (size_t l = 0; l < L; l++)
            for (size_t a = 0; a < (hm ? H : (size_t)T); a++)
                for (size_t b = 0; b < (hm ? (size_t)T : H); b++) {
                    const size_t t = hm ? b : a, h = hm ? a : b;
                    int64_t idx[3] = {(int64_t)l, (int64_t)t, (int64_t)h};
                    kvm_tensor_read_f32(x, kvm_tensor_row_offset(x, idx), row, D);
                    if (!ck->count_nonfinite(row, D)) continue;
                    size_t d = 0;
                    while (d + 1 < D && isfinite(row[d])) d++;
                    kvm_free(row);
                    kvm_free(fresh);
                    return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s[%zu][%zu][%zu][%zu] is not finite", fn, w ? "V" : "K",
                                    l, t, h, d);
                }
    }
    pthread_mutex_lock(&s->mu);
    st = take(s, T, fresh);
    if (st != KVMEM_OK) {
        pthread_mutex_unlock(&s->mu);
        kvm_free(row);
        kvm_free(fresh);
        return st;
    }
    /* Rows are written under the lock: a page array realloc by another
     * thread's grow() must not race with our slot pointers. Head-major input
     * goes in blocks of SM_BLOCK positions, each (layer, head) run of the
     * block read in one sweep; position-major input a position at a time */
    for (int w = 0; w < 2; w++) {
        const kvmem_tensor *x = w ? v : k;
        const int hm = H > 1 && x->strides[2] > x->strides[1];
        for (int64_t t0 = 0; t0 < T; t0 += hm ? SM_BLOCK : 1) {
            const int64_t t1 = hm ? KVM_MIN(T, t0 + SM_BLOCK) : t0 + 1;
            for (size_t l = 0; l < L; l++)
                for (size_t h = 0; h < H; h++)
                    for (int64_t t = t0; t < t1; t++) {
                        int64_t idx[3] = {(int64_t)l, t, (int64_t)h};
                        float *dst = slot_k(s, fresh[t]) + (size_t)w * s->row_elems + (l * H + h) * D;
                        kvm_tensor_read_f32(x, kvm_tensor_row_offset(x, idx), dst, D);
                    }
        }
    }
    pthread_mutex_unlock(&s->mu);
    memcpy(m->slots + m->len, fresh, (size_t)T * sizeof *fresh);
    m->len += T;
    m->n_live += T;
    kvm_free(row);
    kvm_free(fresh);
    return KVMEM_OK;
}

kvmem_status kvmem_slotmap_set_protected(kvmem_slotmap *m, int64_t protect) {
    if (!m) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_slotmap_set_protected: map is NULL");
    if (protect < 0 || protect > m->len)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_slotmap_set_protected: %lld outside [0, length %lld]",
                        (long long)protect, (long long)m->len);
    m->protect = protect;
    return KVMEM_OK;
}

static kvmem_status check_kept(const char *fn, const kvmem_slotmap *m, const int32_t *kept, int64_t n_kept) {
    if (!m) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: map is NULL", fn);
    if (n_kept < 0 || n_kept > m->len)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n_kept %lld outside [0, length %lld]", fn, (long long)n_kept,
                        (long long)m->len);
    if (n_kept > 0 && !kept) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: kept is NULL", fn);
    for (int64_t i = 0; i < n_kept; i++) {
        if (kept[i] < 0 || kept[i] >= m->len)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: kept[%lld] = %d outside [0, length %lld)", fn, (long long)i,
                            kept[i], (long long)m->len);
        if (i > 0 && kept[i] <= kept[i - 1])
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: kept must be ascending and unique (kept[%lld] = %d after %d)",
                            fn, (long long)i, kept[i], kept[i - 1]);
    }
    return KVMEM_OK;
}

/* Room for the protected-prefix slots a drop of everything not in kept
 * would park, so the drop itself cannot fail half-way. */
static kvmem_status reserve_parked(kvmem_slotmap *m, const int32_t *kept, int64_t n_kept) {
    int64_t add = 0, kp = 0;
    for (int64_t j = 0; j < m->protect; j++) {
        while (kp < n_kept && kept[kp] < j) kp++;
        if ((kp < n_kept && kept[kp] == j) || m->slots[j] == KVMEM_DEAD_SLOT) continue;
        add++;
    }
    return reserve_i32(&m->parked, &m->cap_parked, m->n_parked + add);
}

kvmem_status kvmem_slotmap_evict(kvmem_slotmap *m, const int32_t *kept, int64_t n_kept, int64_t *n_freed) {
    static const char fn[] = "kvmem_slotmap_evict";
    kvmem_status st = check_kept(fn, m, kept, n_kept);
    if (st != KVMEM_OK) return st;
    st = reserve_parked(m, kept, n_kept);
    if (st != KVMEM_OK) return st;
    kvmem_kvstore *s = m->store;
    int32_t *slots = m->slots;
    int64_t freed = 0, dropped = 0, kp = 0;
    const int64_t len = m->len, prot = m->protect;
    pthread_mutex_lock(&s->mu);
    int32_t *refc = s->refs, *fl = s->free_list; /* grow() may move them: read under the lock */
    int64_t n_free = s->n_free;
    /* Walk the gaps between kept positions: the inner loops run without a
     * data-dependent "is it kept?" branch. */
    for (int64_t j = 0; kp <= n_kept; kp++) {
        const int64_t end = kp < n_kept ? kept[kp] : len;
        for (; j < end && j < prot; j++) { /* protected prefix: parked, a prefix cache may hold it */
            int32_t sl = slots[j];
            if (sl == KVMEM_DEAD_SLOT) continue; /* evicting twice is a no-op */
            slots[j] = KVMEM_DEAD_SLOT;
            dropped++;
            m->parked[m->n_parked++] = sl;
        }
        for (; j < end; j++) {
            /* slots of a long-lived store are scattered: fetch counts ahead */
            if (j + 16 < len) KVM_PREFETCH_W(&refc[slots[j + 16]]);
            int32_t sl = slots[j];
            if (sl == KVMEM_DEAD_SLOT) continue;
            slots[j] = KVMEM_DEAD_SLOT;
            dropped++;
            if (--refc[sl] == 0) { /* no kept or sibling reference left */
                fl[n_free++] = sl;
                freed++;
            }
        }
        j = end + 1;
    }
    s->n_free = n_free;
    s->n_used -= freed;
    pthread_mutex_unlock(&s->mu);
    m->n_live -= dropped;
    if (n_freed) *n_freed = freed;
    return KVMEM_OK;
}

kvmem_status kvmem_slotmap_compact(kvmem_slotmap *m, const int32_t *kept, int64_t n_kept, int64_t *n_freed) {
    static const char fn[] = "kvmem_slotmap_compact";
    kvmem_status st = check_kept(fn, m, kept, n_kept);
    if (st != KVMEM_OK) return st;
    kvmem_kvstore *s = m->store;
    /* live kept rows, in order; dead kept positions are already gone */
    int64_t n_new = 0, n_moved = 0;
    for (int64_t i = 0; i < n_kept; i++)
        if (m->slots[kept[i]] != KVMEM_DEAD_SLOT) {
            if (kept[i] != n_new) n_moved++;
            n_new++;
        }
    int32_t *nslots = kvm_malloc((size_t)KVM_MAX(n_new, (int64_t)1) * sizeof *nslots);
    int32_t *fresh = kvm_malloc((size_t)KVM_MAX(n_moved, (int64_t)1) * sizeof *fresh);
    int32_t *old = kvm_malloc((size_t)KVM_MAX(m->len, (int64_t)1) * sizeof *old);
    /* every live protected position may be parked: dropped, or moved */
    if (!nslots || !fresh || !old || reserve_i32(&m->parked, &m->cap_parked, m->n_parked + m->protect) != KVMEM_OK) {
        kvm_free(nslots);
        kvm_free(fresh);
        kvm_free(old);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for the compacted map (%lld positions)", fn, (long long)m->len);
    }
    pthread_mutex_lock(&s->mu);
    st = take(s, n_moved, fresh);
    if (st != KVMEM_OK) {
        pthread_mutex_unlock(&s->mu);
        kvm_free(nslots);
        kvm_free(fresh);
        kvm_free(old);
        return st;
    }
    const size_t L = (size_t)s->spec.n_layers, H = (size_t)s->spec.n_kv_heads, D = (size_t)s->spec.head_dim;
    float c_old[KVM_ROPE_MAX_PAIRS], s_old[KVM_ROPE_MAX_PAIRS], c_new[KVM_ROPE_MAX_PAIRS], s_new[KVM_ROPE_MAX_PAIRS];
    int64_t i_new = 0, i_fresh = 0;
    for (int64_t i = 0; i < n_kept; i++) {
        int32_t sl = m->slots[kept[i]];
        if (sl == KVMEM_DEAD_SLOT) continue;
        if (kept[i] == i_new) {
            nslots[i_new++] = sl; /* unmoved: keeps its slot and phase */
            continue;
        }
        int32_t to = fresh[i_fresh++];
        float *src = slot_k(s, sl), *dst = slot_k(s, to);
        memcpy(dst, src, 2 * s->row_elems * sizeof *dst);
        /* K was rotated at kept[i]; undo that and rotate at i_new */
        kvm_rope_cos_sin(&s->rope, (double)kept[i], c_old, s_old);
        kvm_rope_cos_sin(&s->rope, (double)i_new, c_new, s_new);
        for (size_t r = 0; r < L * H; r++) {
            kvm_rope_rotate(&s->rope, dst + r * D, c_old, s_old, 1);
            kvm_rope_rotate(&s->rope, dst + r * D, c_new, s_new, 0);
        }
        nslots[i_new++] = to;
    }
    /* release every old position whose slot is not carried over unmoved */
    int64_t freed = 0, kp = 0;
    memcpy(old, m->slots, (size_t)m->len * sizeof *old);
    int64_t pos_new = 0;
    for (int64_t j = 0; j < m->len; j++) {
        int carried = 0;
        if (kp < n_kept && kept[kp] == j) {
            kp++;
            if (old[j] != KVMEM_DEAD_SLOT) {
                carried = (j == pos_new);
                pos_new++;
            }
        }
        if (carried || old[j] == KVMEM_DEAD_SLOT) continue;
        if (j < m->protect) m->parked[m->n_parked++] = old[j];
        else freed += release(s, old[j]);
    }
    pthread_mutex_unlock(&s->mu);
    memcpy(m->slots, nslots, (size_t)n_new * sizeof *nslots);
    m->len = n_new;
    m->n_live = n_new;
    m->protect = KVM_MIN(m->protect, n_new);
    kvm_free(nslots);
    kvm_free(fresh);
    kvm_free(old);
    if (n_freed) *n_freed = freed;
    return KVMEM_OK;
}

kvmem_status kvmem_slotmap_slots(const kvmem_slotmap *m, const int32_t **slots, int64_t *len, int32_t *dead_slot) {
    if (!m || !slots || !len) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_slotmap_slots: map, slots or len is NULL");
    *slots = m->slots;
    *len = m->len;
    if (dead_slot) *dead_slot = KVMEM_DEAD_SLOT;
    return KVMEM_OK;
}

kvmem_status kvmem_slotmap_get_info(const kvmem_slotmap *m, kvmem_slotmap_info *out) {
    if (!m || !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_slotmap_get_info: map or out is NULL");
    out->length = m->len;
    out->n_live = m->n_live;
    out->protect = m->protect;
    out->n_parked = m->n_parked;
    return KVMEM_OK;
}

kvmem_status kvmem_slotmap_gather(const kvmem_slotmap *m, const kvmem_tensor *k_out, const kvmem_tensor *v_out,
                                  int32_t *positions_out) {
    static const char fn[] = "kvmem_slotmap_gather";
    if (!m) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: map is NULL", fn);
    kvmem_kvstore *s = m->store;
    const kvmem_model_spec *sp = &s->spec;
    int64_t shape[4] = {sp->n_layers, m->n_live, sp->n_kv_heads, sp->head_dim};
    kvmem_status st = KVMEM_OK;
    if (k_out) st = kvm_tensor_expect(k_out, "K out", "[n_layers][n_live][n_kv_heads][head_dim]", 4, shape);
    if (st == KVMEM_OK && v_out) st = kvm_tensor_expect(v_out, "V out", "[n_layers][n_live][n_kv_heads][head_dim]", 4, shape);
    if (st != KVMEM_OK) return st;
    const size_t H = (size_t)sp->n_kv_heads, D = (size_t)sp->head_dim, L = (size_t)sp->n_layers;
    pthread_mutex_lock(&s->mu); /* page table stability against other maps' growth */
    /* head-major outputs (a head's rows adjacent) are written in blocks of
     * SM_BLOCK live positions, each (layer, head) run of a block in one
     * sweep; position-major ones a position at a time */
    int32_t blk[SM_BLOCK];
    int64_t i = 0;
    for (int64_t j = 0; j < m->len;) {
        int32_t n = 0;
        const int64_t i0 = i;
        for (; j < m->len && n < SM_BLOCK; j++) {
            const int32_t sl = m->slots[j];
            if (sl == KVMEM_DEAD_SLOT) continue; /* a mask, never a value */
            if (positions_out) positions_out[i] = (int32_t)j;
            blk[n++] = sl, i++;
        }
        for (int w = 0; w < 2; w++) {
            const kvmem_tensor *x = w ? v_out : k_out;
            if (!x) continue;
            const int hm = H > 1 && x->strides[2] > x->strides[1];
            for (int32_t a = 0; a < (hm ? 1 : n); a++) /* position-major: one position per pass */
                for (size_t l = 0; l < L; l++)
                    for (size_t h = 0; h < H; h++)
                        for (int32_t b = hm ? 0 : a; b < (hm ? n : a + 1); b++) {
                            int64_t idx[3] = {(int64_t)l, i0 + b, (int64_t)h};
                            kvm_tensor_write_f32(x, kvm_tensor_row_offset(x, idx),
                                                 slot_k(s, blk[b]) + (size_t)w * s->row_elems + (l * H + h) * D, D);
                        }
        }
    }
    pthread_mutex_unlock(&s->mu);
    return KVMEM_OK;
}
