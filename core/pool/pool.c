/* Pools: creation, the agent table (sorted by id), handles and accounting. */
#include "pool.h"
#include "resident.h"
#include "../cpu/kernels.h"
#include "agent_io.h"
#include "mapped.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvmem_status kvmem_pool_params_init(kvmem_pool_params *params, size_t struct_size) {
    kvmem_pool_params p;
    memset(&p, 0, sizeof p);
    p.block_size = 16;
    p.storage_dtype = KVMEM_F16;
    p.capacity_bytes = 0;
    p.max_agents = 0;
    p.max_tokens_per_agent = 0;
    p.store_dir = NULL;
    p.host_budget_bytes = 0;
    p.device_capacity_bytes = 0;
    return KVM_PARAMS_INIT(kvmem_pool_params, params, struct_size, &p, "kvmem_pool_params_init");
}

size_t kvm_block_kv_bytes(const kvmem_pool *p, int32_t n_tokens) {
    if (kvm_is_quant_dtype(p->params.storage_dtype)) return kvm_block_qlayout(p, n_tokens).bytes;
    size_t lh = (size_t)p->spec.n_layers * (size_t)p->spec.n_kv_heads;
    return lh * (kvm_block_section_bytes(p, 0, n_tokens) + kvm_block_section_bytes(p, 1, n_tokens));
}

size_t kvm_block_bytes(const kvmem_pool *p, int32_t n_tokens) {
    return kvm_block_kv_bytes(p, n_tokens) + kvm_aabb_block_bytes(p);
}

void kvm_block_aabb_f32(const kvmem_pool *p, const kvm_agent_mem *m, int32_t b, int32_t l, int32_t h, float *out) {
    const size_t n = 2 * (size_t)p->spec.head_dim;
    const void *box = kvm_block_aabb(p, m, b, l, h);
    if (kvm_aabb_esize(p) == 2) kvm_cpu_kernels_get()->f16_to_f32(box, out, n);
    else memcpy(out, box, n * sizeof(float));
}

void kvm_aabb_store(const kvmem_pool *p, const float *box, void *dst) {
    const size_t D = (size_t)p->spec.head_dim;
    if (kvm_aabb_esize(p) == 4) {
        memcpy(dst, box, 2 * D * sizeof(float));
        return;
    }
    const kvm_quant_kernels *k = kvm_cpu_kernels_get()->quant;
    k->f16_round(box, D, 1, dst);
    k->f16_round(box + D, D, 0, (uint16_t *)dst + D);
}

kvmem_status kvmem_pool_create(kvmem_context *ctx, const kvmem_model_spec *spec,
                               const kvmem_pool_params *params, kvmem_pool **out) {
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_pool_create: out is NULL");
    *out = NULL;
    if (!ctx) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_pool_create: context is NULL");
    kvmem_status st = kvmem_model_spec_validate(spec);
    if (st != KVMEM_OK) return st;
    kvmem_pool_params pp = kvmem_pool_default_params();
    if ((st = KVM_PARAMS_IN(kvmem_pool_params, &pp, params, "kvmem_pool_create")) != KVMEM_OK) return st;
    int32_t bs = pp.block_size;
    if (bs < 1 || bs > 4096 || (bs & (bs - 1)) != 0)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "block size %d: must be a power of two in [1, 4096]", bs);
    if (!kvm_is_tensor_dtype(pp.storage_dtype) && !kvm_is_quant_dtype(pp.storage_dtype))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "storage dtype %d: unknown", (int)pp.storage_dtype);
    if (pp.max_agents < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "max_agents %d: must be >= 0", pp.max_agents);
    if (pp.max_tokens_per_agent < 0)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "max_tokens_per_agent %d: must be >= 0", pp.max_tokens_per_agent);
    if (spec->rotary_dim / 2 > KVM_ROPE_MAX_PAIRS || spec->head_dim / 2 > KVM_ROPE_MAX_PAIRS)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "head_dim %d too large", spec->head_dim);

    kvmem_pool *p = kvm_calloc(1, sizeof *p);
    if (p) kvm_errslot_init(&p->err);
    if (!p) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_pool_create: out of memory for the pool");
    p->ctx = ctx;
    p->spec = *spec;
    p->params = pp;
    if (spec->layer_window) {
        p->layer_window = kvm_malloc((size_t)spec->n_layers * sizeof(int32_t));
        if (!p->layer_window) {
            kvm_free(p);
            return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_pool_create: out of memory for the layer windows");
        }
        memcpy(p->layer_window, spec->layer_window, (size_t)spec->n_layers * sizeof(int32_t));
        p->spec.layer_window = p->layer_window;
    }
    if (pp.store_dir) {
        /* a directory, or a store URL (redis://, unix://) opened by its plugin */
        st = kvm_store_open(pp.store_dir, &p->store);
        if (st != KVMEM_OK) {
            kvm_free(p->layer_window);
            kvm_free(p);
            return st;
        }
        p->params.store_dir = NULL; /* not kept: the store holds its own copy */
    }
    kvm_rope_init(&p->rope, &p->spec);
    p->row_elems = (size_t)spec->n_kv_heads * (size_t)spec->head_dim;
    p->layer_elems_bs = p->row_elems * (size_t)bs;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->spill_cv, NULL);
    atomic_init(&p->dev_bytes, 0);
    atomic_init(&p->dev_evictions, 0);
    atomic_init(&p->dev_unmirrored, 0);
    *out = p;
    return KVMEM_OK;
}

/* ---- block memory (pool.h) ---- */

static size_t full_block_bytes(const kvmem_pool *p) { return kvm_block_kv_bytes(p, p->params.block_size); }

uint64_t kvm_pool_spare_limit(const kvmem_pool *p) {
    uint64_t lim = p->used_bytes, cap = p->params.capacity_bytes, bud = p->store ? p->params.host_budget_bytes : 0;
    if (cap) lim = KVM_MIN(lim, cap > p->used_bytes ? cap - p->used_bytes : 0);
    if (bud) lim = KVM_MIN(lim, bud > p->used_bytes ? bud - p->used_bytes : 0);
    return lim;
}

/* Pop spare memory (the AABB array first, then blocks) until the pool
 * keeps at most `keep` bytes, onto *drop (a list for free_list once the
 * mutex is released). Mutex held. */
static void spare_trim(kvmem_pool *p, uint64_t keep, void **drop) {
    const uint64_t full = full_block_bytes(p);
    if (p->spare_aabb && p->spare_bytes + p->spare_aabb_bytes > keep) {
        *(void **)p->spare_aabb = *drop;
        *drop = p->spare_aabb;
        p->spare_aabb = NULL;
        p->spare_aabb_bytes = 0;
    }
    while (p->spare && p->spare_bytes > keep) {
        void *b = p->spare;
        p->spare = *(void **)b;
        p->spare_bytes -= full;
        *(void **)b = *drop;
        *drop = b;
    }
}

void *kvm_aabb_take(kvmem_pool *p, size_t bytes, size_t *got) {
    pthread_mutex_lock(&p->mu);
    void *a = NULL;
    if (p->spare_aabb && p->spare_aabb_bytes >= bytes) {
        a = p->spare_aabb;
        *got = (size_t)p->spare_aabb_bytes;
        p->spare_aabb = NULL;
        p->spare_aabb_bytes = 0;
    }
    pthread_mutex_unlock(&p->mu);
    return a;
}

/* Keep a (bytes) as the spare AABB array when it is larger than the one
 * kept and fits the bound; else free it (or the one it replaces). */
static void aabb_give(kvmem_pool *p, void *a, uint64_t bytes) {
    void *drop = a;
    pthread_mutex_lock(&p->mu);
    if (bytes > p->spare_aabb_bytes && bytes >= sizeof(void *) && p->spare_bytes + bytes <= kvm_pool_spare_limit(p)) {
        drop = p->spare_aabb;
        p->spare_aabb = a;
        p->spare_aabb_bytes = bytes;
    }
    pthread_mutex_unlock(&p->mu);
    kvm_aligned_free(drop);
}

static void free_list(void *b) {
    while (b) {
        void *next = *(void **)b;
        kvm_aligned_free(b);
        b = next;
    }
}

void *kvm_block_alloc(kvmem_pool *p, int32_t n_tokens) {
    if (n_tokens == p->params.block_size) {
        pthread_mutex_lock(&p->mu);
        void *b = p->spare;
        if (b) {
            p->spare = *(void **)b;
            p->spare_bytes -= full_block_bytes(p);
        }
        pthread_mutex_unlock(&p->mu);
        if (b) return b;
    }
    return kvm_huge_alloc(kvm_block_kv_bytes(p, n_tokens));
}

void kvm_block_free(kvmem_pool *p, kvm_block *blocks, int32_t n) {
    const uint64_t full = full_block_bytes(p);
    void *drop = NULL;
    pthread_mutex_lock(&p->mu);
    const uint64_t lim = kvm_pool_spare_limit(p);
    for (int32_t i = 0; i < n; i++) {
        void *b = blocks[i].kv;
        if (!b) continue;
        blocks[i].kv = NULL;
        if (blocks[i].n_tokens == p->params.block_size && p->spare_bytes + p->spare_aabb_bytes + full <= lim) {
            *(void **)b = p->spare;
            p->spare = b;
            p->spare_bytes += full;
        } else {
            *(void **)b = drop;
            drop = b;
        }
    }
    pthread_mutex_unlock(&p->mu);
    free_list(drop);
}

/* Everything but the blocks' KV memory. */
static void mem_clear_rest(kvm_agent_mem *m) {
    kvm_free(m->blocks);
    kvm_aligned_free(m->aabb);
    kvm_aligned_free(m->tail);
    kvm_free(m->token_ids);
    kvm_free(m->token_text_off);
    kvm_free(m->text);
    kvm_mapped_free(m->mapped);
    m->mapped = NULL;
    m->blocks = NULL;
    m->aabb = m->tail = NULL;
    m->token_ids = NULL;
    m->token_text_off = NULL;
    m->text = NULL;
    m->n_sealed = m->cap_blocks = m->tail_n = 0;
    m->n_tokens = m->cap_tokens = 0;
    m->text_len = m->text_cap = 0;
    m->bytes = 0;
}

void kvm_agent_mem_clear(kvm_agent_mem *m) {
    kvm_resident_drop(m);
    for (int32_t i = 0; i < m->n_sealed; i++) kvm_aligned_free(m->blocks[i].kv);
    mem_clear_rest(m);
}

void kvm_agent_mem_release(kvmem_pool *p, kvm_agent_mem *m) {
    kvm_resident_drop(m);
    kvm_block_free(p, m->blocks, m->n_sealed);
    if (m->aabb) aabb_give(p, m->aabb, (uint64_t)m->cap_blocks * kvm_aabb_block_bytes(p));
    m->aabb = NULL;
    mem_clear_rest(m);
}

static void agent_mem_free(kvm_agent_mem *m) {
    if (!m) return;
    kvm_agent_mem_clear(m);
    kvm_free(m);
}

void kvm_agent_mem_replace(kvmem_pool *p, kvm_agent_mem *m, kvm_agent_mem *fresh) {
    pthread_mutex_lock(&p->mu);
    p->used_bytes -= m->bytes;
    void *drop = NULL;
    spare_trim(p, kvm_pool_spare_limit(p), &drop);
    pthread_mutex_unlock(&p->mu);
    free_list(drop);
    kvm_agent_mem_release(p, m); /* the next load of a same-sized agent reuses its blocks */
    m->n_tokens = fresh->n_tokens;
    m->blocks = fresh->blocks;
    m->n_sealed = fresh->n_sealed;
    m->cap_blocks = fresh->cap_blocks;
    m->aabb = fresh->aabb;
    m->tail = fresh->tail;
    m->tail_n = fresh->tail_n;
    m->token_ids = fresh->token_ids;
    m->token_text_off = fresh->token_text_off;
    m->cap_tokens = fresh->cap_tokens;
    m->text = fresh->text;
    m->text_len = fresh->text_len;
    m->text_cap = fresh->text_cap;
    m->bytes = fresh->bytes;
    m->mapped = fresh->mapped;
    kvm_free(fresh);
}

/* Spill the least recently used closed agent to the store. Called with the
 * mutex held, which it releases while it writes (a file's write and fsync,
 * a Redis round trip: every other call that needs the pool would wait for
 * it otherwise); the agent is marked spilling meanwhile, its bytes still
 * counted, and waiters on spill_cv are woken when the write ends.
 * KVMEM_OK: one was spilled; KVMEM_ERR_NOT_FOUND: none is left; else the
 * write failed (the message names the agent; it stays in memory). */
static kvmem_status spill_one(kvmem_pool *p) {
    kvm_agent_mem *best = NULL;
    for (int32_t i = 0; i < p->n_agents; i++) {
        kvm_agent_mem *m = p->agents[i];
        /* open agents are never spilled; mapped ones hold only their index
         * and cannot be written (their KV is in their own file) */
        if (m->handle || m->spilled || m->spilling || m->bytes == 0 || m->mapped) continue;
        if (!best || m->lru_tick < best->lru_tick) best = m;
    }
    if (!best) return KVMEM_ERR_NOT_FOUND;
    if (best->dirty) {
        /* closed and marked: nothing changes its memory or frees it until
         * the mark is cleared (open, remove and sync wait for it) */
        best->spilling = 1;
        p->spilling_bytes += best->bytes;
        pthread_mutex_unlock(&p->mu);
        kvmem_status st = kvm_store_save_mem(p, best);
        char why[400] = "";
        if (st != KVMEM_OK) snprintf(why, sizeof why, "%s", kvmem_last_error());
        pthread_mutex_lock(&p->mu);
        best->spilling = 0;
        p->spilling_bytes -= best->bytes;
        pthread_cond_broadcast(&p->spill_cv);
        if (st != KVMEM_OK) {
            kvm_log(KVMEM_LOG_WARN, "cannot spill agent '%s': %s", best->id, why);
            return kvm_fail(st, "spilling agent '%s' to the store failed: %s", best->id, why);
        }
    }
    p->used_bytes -= best->bytes;
    kvm_agent_mem_clear(best);
    best->spilled = 1;
    best->dirty = 0;
    return KVMEM_OK;
}

/* 1 if `bytes` more, and `room` besides, fit the capacity once `freeing`
 * of the bytes in use are gone. Mutex held. */
static int pool_fits(const kvmem_pool *p, uint64_t bytes, uint64_t room, uint64_t freeing) {
    const uint64_t cap = p->params.capacity_bytes, used = p->used_bytes - freeing;
    return used <= cap && bytes <= cap - used && room <= cap - used - bytes;
}

kvmem_status kvm_pool_reserve(kvmem_pool *p, uint64_t bytes) {
    pthread_mutex_lock(&p->mu);
    uint64_t cap = p->params.capacity_bytes;
    /* The one who fills the pool pays for its spills. A reservation that
     * does not fit, or a large one (over a sixty-fourth of the capacity)
     * that would leave less than a sixteenth free, spills until that
     * sixteenth is left besides its bytes: the small reservations that
     * follow (another agent's few tokens) then fit without spilling, and
     * without waiting for the spills under way (a write and an fsync).
     * While the store fails, only a reservation that does not fit tries. */
    const uint64_t room = cap / 16;
    int keep_room = bytes > cap / 64 && !p->spill_failing;
    while (cap && !(keep_room ? pool_fits(p, bytes, room, 0) : pool_fits(p, bytes, 0, 0))) {
        keep_room = 1;
        /* spills under way (another thread's, outside the mutex) will free enough: wait for them */
        if (p->spilling_bytes && pool_fits(p, bytes, room, p->spilling_bytes)) {
            pthread_cond_wait(&p->spill_cv, &p->mu);
            continue;
        }
        kvmem_status st = p->store ? spill_one(p) : KVMEM_ERR_NOT_FOUND;
        p->spill_failing = st != KVMEM_OK && st != KVMEM_ERR_NOT_FOUND;
        if (st == KVMEM_OK) continue;
        if (pool_fits(p, bytes, 0, 0)) break; /* the room is a wish: not worth a failure */
        if (st != KVMEM_ERR_NOT_FOUND) { /* a spill that failed says why: not a capacity problem */
            pthread_mutex_unlock(&p->mu);
            return st;
        }
        if (p->spilling_bytes) { /* what the others spill may be enough */
            pthread_cond_wait(&p->spill_cv, &p->mu);
            continue;
        }
        uint64_t used = p->used_bytes;
        pthread_mutex_unlock(&p->mu);
        return kvm_fail(KVMEM_ERR_CAPACITY,
                        "pool capacity %llu bytes: %llu in use, %llu more needed%s; nothing was appended or loaded",
                        (unsigned long long)cap, (unsigned long long)used, (unsigned long long)bytes,
                        p->store ? " and no closed agent left to spill" : "");
    }
    p->used_bytes += bytes;
    /* spare memory never makes an agent spill: it gives way here */
    void *drop = NULL;
    spare_trim(p, kvm_pool_spare_limit(p), &drop);
    pthread_mutex_unlock(&p->mu);
    free_list(drop);
    return KVMEM_OK;
}

void kvm_pool_unreserve(kvmem_pool *p, uint64_t bytes) {
    pthread_mutex_lock(&p->mu);
    p->used_bytes -= bytes;
    void *drop = NULL;
    spare_trim(p, kvm_pool_spare_limit(p), &drop);
    pthread_mutex_unlock(&p->mu);
    free_list(drop);
}

void kvmem_pool_free(kvmem_pool *p) {
    if (!p) return;
    for (int32_t i = 0; i < p->n_agents; i++) {
        kvm_free(p->agents[i]->handle);
        agent_mem_free(p->agents[i]);
    }
    for (int32_t i = 0; i < KVM_GRAVEYARD; i++) kvm_free(p->graveyard[i]);
    free_list(p->spare);
    kvm_aligned_free(p->spare_aabb);
    kvm_store_free(p->store);
    kvm_free(p->agents);
    kvm_free(p->layer_window);
    pthread_cond_destroy(&p->spill_cv);
    pthread_mutex_destroy(&p->mu);
    kvm_free(p);
}

static kvmem_status pool_get_info_call(kvmem_pool *p, kvmem_pool_info *out) {
    if (!p || !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_pool_get_info: %s is NULL", p ? "out" : "pool");
    pthread_mutex_lock(&p->mu);
    memset(out, 0, sizeof *out);
    out->used_bytes = p->used_bytes;
    out->capacity_bytes = p->params.capacity_bytes;
    out->n_agents = p->n_agents;
    out->block_size = p->params.block_size;
    out->storage_dtype = p->params.storage_dtype;
    pthread_mutex_unlock(&p->mu);
    return KVMEM_OK;
}

static kvmem_status pool_get_spec_call(kvmem_pool *p, kvmem_model_spec *out) {
    if (!p || !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_pool_get_spec: %s is NULL", p ? "out" : "pool");
    *out = p->spec;
    return KVMEM_OK;
}

static kvmem_status check_id(const char *id, const char *fn) {
    if (!id) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: agent id is NULL", fn);
    if (!kvmem_agent_id_valid(id))
        return kvm_fail(KVMEM_ERR_INVALID_ARG,
                        "%s: agent id '%.40s%s' is invalid: use 1-128 of [A-Za-z0-9._-], not starting with '.'",
                        fn, id, strlen(id) > 40 ? "..." : "");
    return KVMEM_OK;
}

/* Binary search in the sorted table; returns the index or -(insert point)-1. */
static int32_t find_agent(const kvmem_pool *p, const char *id) {
    int32_t lo = 0, hi = p->n_agents - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        int c = strcmp(p->agents[mid]->id, id);
        if (c == 0) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -lo - 1;
}

static kvmem_status pool_agent_id_call(kvmem_pool *p, int32_t index, char *buf, size_t size, size_t *len) {
    if (!p) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_pool_agent_id: pool is NULL");
    if (size > 0 && !buf) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_pool_agent_id: buf is NULL with size %zu", size);
    pthread_mutex_lock(&p->mu);
    if (index < 0 || index >= p->n_agents) {
        int32_t n = p->n_agents;
        pthread_mutex_unlock(&p->mu);
        return kvm_fail(KVMEM_ERR_NOT_FOUND, "kvmem_pool_agent_id: index %d outside [0, %d)", index, n);
    }
    const char *id = p->agents[index]->id;
    size_t n = strlen(id);
    if (size > 0) {
        size_t c = n < size - 1 ? n : size - 1;
        memcpy(buf, id, c);
        buf[c] = '\0';
    }
    if (len) *len = n;
    pthread_mutex_unlock(&p->mu);
    return KVMEM_OK;
}

static kvmem_status agent_open_call(kvmem_pool *p, const char *id, kvmem_agent **out) {
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_agent_open: out is NULL");
    *out = NULL;
    if (!p) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_agent_open: pool is NULL");
    kvmem_status st = check_id(id, "kvmem_agent_open");
    if (st != KVMEM_OK) return st;
    kvmem_agent *h = kvm_calloc(1, sizeof *h);
    if (!h) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_agent_open: out of memory for the handle");
    pthread_mutex_lock(&p->mu);
    int32_t at = find_agent(p, id);
    while (at >= 0 && p->agents[at]->spilling) { /* being written out: then reloaded */
        pthread_cond_wait(&p->spill_cv, &p->mu);
        at = find_agent(p, id);
    }
    kvm_agent_mem *m = NULL;
    int load = 0, created = 0;
    if (at >= 0) {
        m = p->agents[at];
        if (m->handle) {
            pthread_mutex_unlock(&p->mu);
            kvm_free(h);
            return kvm_fail(KVMEM_ERR_EXISTS, "agent '%s' is already open: one handle per agent", id);
        }
        load = m->spilled;
    } else {
        int in_store = 0;
        if (p->store && (st = p->store->iface->exists(p->store, id, &in_store)) != KVMEM_OK) {
            pthread_mutex_unlock(&p->mu);
            kvm_free(h);
            return st;
        }
        load = created = in_store;
        if (p->params.max_agents > 0 && p->n_agents >= p->params.max_agents) {
            pthread_mutex_unlock(&p->mu);
            kvm_free(h);
            return kvm_fail(KVMEM_ERR_CAPACITY, "pool holds %d agents, its max_agents", p->n_agents);
        }
        int32_t ins = -at - 1;
        if (p->n_agents == p->cap_agents) {
            size_t nc;
            kvm_agent_mem **na = kvm_grow_cap((size_t)p->cap_agents, (size_t)p->n_agents + 1, 8, INT32_MAX, sizeof *na, &nc)
                                     ? kvm_realloc(p->agents, nc * sizeof *na)
                                     : NULL;
            if (!na) goto nomem;
            p->agents = na;
            p->cap_agents = (int32_t)nc;
        }
        m = kvm_calloc(1, sizeof *m);
        if (!m) goto nomem;
        snprintf(m->id, sizeof m->id, "%s", id);
        memmove(p->agents + ins + 1, p->agents + ins, (size_t)(p->n_agents - ins) * sizeof *p->agents);
        p->agents[ins] = m;
        p->n_agents++;
    }
    h->pool = p;
    h->mem = m;
    snprintf(h->id, sizeof h->id, "%s", id);
    atomic_init(&h->busy, 0);
    kvm_errslot_init(&h->err);
    h->magic = KVM_AGENT_MAGIC;
    m->handle = h; /* from here on no spill touches m */
    m->lru_tick = ++p->tick;
    pthread_mutex_unlock(&p->mu);
    if (load) {
        /* reload from the store outside the mutex (it may spill others) */
        st = kvm_store_load_mem(p, m);
        pthread_mutex_lock(&p->mu);
        if (st != KVMEM_OK) {
            m->handle = NULL;
            if (created) {
                int32_t i = find_agent(p, id);
                memmove(p->agents + i, p->agents + i + 1, (size_t)(p->n_agents - i - 1) * sizeof *p->agents);
                p->n_agents--;
                kvm_free(m);
            }
            pthread_mutex_unlock(&p->mu);
            kvm_free(h);
            return st;
        }
        m->spilled = 0;
        m->dirty = 0;
        pthread_mutex_unlock(&p->mu);
    }
    *out = h;
    return KVMEM_OK;
nomem:
    pthread_mutex_unlock(&p->mu);
    kvm_free(h);
    return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_agent_open: out of memory for the agent table");
}

/* The table checks of kvm_pool_adopt, under the mutex. */
static kvmem_status adopt_check(kvmem_pool *p, const char *id, const char *fn, int32_t *at) {
    *at = find_agent(p, id);
    int in_store = 0;
    kvmem_status st = KVMEM_OK;
    if (*at < 0 && p->store && (st = p->store->iface->exists(p->store, id, &in_store)) != KVMEM_OK) return st;
    if (*at >= 0 || in_store)
        return kvm_fail(KVMEM_ERR_EXISTS, "%s: the pool%s already holds an agent '%s': remove it first", fn,
                        in_store ? "'s store" : "", id);
    if (p->params.max_agents > 0 && p->n_agents >= p->params.max_agents)
        return kvm_fail(KVMEM_ERR_CAPACITY, "%s: pool holds %d agents, its max_agents", fn, p->n_agents);
    if (p->n_agents == p->cap_agents) {
        size_t nc;
        kvm_agent_mem **na = kvm_grow_cap((size_t)p->cap_agents, (size_t)p->n_agents + 1, 8, INT32_MAX, sizeof *na, &nc)
                                 ? kvm_realloc(p->agents, nc * sizeof *na)
                                 : NULL;
        if (!na) return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for the agent table", fn);
        p->agents = na;
        p->cap_agents = (int32_t)nc;
    }
    return KVMEM_OK;
}

kvmem_status kvm_pool_adopt(kvmem_pool *p, kvm_agent_mem *fresh, const char *fn, kvmem_agent **out) {
    kvmem_agent *h = kvm_calloc(1, sizeof *h);
    if (!h) return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for the handle", fn);
    int32_t at;
    pthread_mutex_lock(&p->mu);
    kvmem_status st = adopt_check(p, fresh->id, fn, &at);
    pthread_mutex_unlock(&p->mu);
    /* reserved outside the mutex (a reservation may spill closed agents),
     * then the checks again: another thread may have opened the id since */
    if (st == KVMEM_OK) st = kvm_pool_reserve(p, fresh->bytes);
    if (st != KVMEM_OK) {
        kvm_free(h);
        return st;
    }
    pthread_mutex_lock(&p->mu);
    if ((st = adopt_check(p, fresh->id, fn, &at)) != KVMEM_OK) {
        p->used_bytes -= fresh->bytes;
        void *drop = NULL;
        spare_trim(p, kvm_pool_spare_limit(p), &drop);
        pthread_mutex_unlock(&p->mu);
        free_list(drop);
        kvm_free(h);
        return st;
    }
    int32_t ins = -at - 1;
    memmove(p->agents + ins + 1, p->agents + ins, (size_t)(p->n_agents - ins) * sizeof *p->agents);
    p->agents[ins] = fresh;
    p->n_agents++;
    h->pool = p;
    h->mem = fresh;
    snprintf(h->id, sizeof h->id, "%s", fresh->id);
    atomic_init(&h->busy, 0);
    kvm_errslot_init(&h->err);
    h->magic = KVM_AGENT_MAGIC;
    fresh->handle = h;
    fresh->lru_tick = ++p->tick;
    pthread_mutex_unlock(&p->mu);
    *out = h;
    return KVMEM_OK;
}

/* The handle's magic alone (an atomic load: safe while a close runs). */
static kvmem_status check_magic(const kvmem_agent *a, const char *fn) {
    if (!a) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: agent is NULL", fn);
    uint32_t mg = atomic_load_explicit(&a->magic, memory_order_acquire);
    if (mg == KVM_AGENT_DEAD) return kvm_fail(KVMEM_ERR_CLOSED, "%s: agent handle is closed", fn);
    if (mg != KVM_AGENT_MAGIC) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: not an agent handle", fn);
    return KVMEM_OK;
}

kvmem_status kvm_agent_check(const kvmem_agent *a, const char *fn) {
    kvmem_status st = check_magic(a, fn);
    if (st != KVMEM_OK) return st;
    if (!a->mem) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: not an agent handle", fn);
    return KVMEM_OK;
}

kvmem_status kvm_agent_enter(kvmem_agent *a, const char *fn) {
    kvmem_status st = check_magic(a, fn);
    if (st != KVMEM_OK) return st;
    if (atomic_exchange_explicit(&a->busy, 1, memory_order_acquire))
        return kvm_fail(KVMEM_ERR_BUSY, "%s: agent '%s' is in use by a call on another thread: use one agent from one thread at a time",
                        fn, a->id);
    a->err_own = kvm_err_begin(&a->err);
    if ((st = kvm_agent_check(a, fn)) != KVMEM_OK) kvm_agent_leave(a); /* closed before it was taken */
    return st;
}

void kvmem_agent_close(kvmem_agent *a) {
    if (!a || atomic_load(&a->magic) != KVM_AGENT_MAGIC) return;
    /* a call still running on another thread (against the contract) is
     * waited for: freeing state under it would crash it */
    while (atomic_exchange_explicit(&a->busy, 1, memory_order_acquire)) sched_yield();
    if (atomic_load(&a->magic) != KVM_AGENT_MAGIC) { /* a racing close won */
        kvm_agent_leave(a);
        return;
    }
    kvmem_pool *p = a->pool;
    pthread_mutex_lock(&p->mu);
    a->mem->handle = NULL;
    a->mem->lru_tick = ++p->tick;
    a->mem = NULL;
    atomic_store_explicit(&a->magic, KVM_AGENT_DEAD, memory_order_release);
    /* the soft host budget: spill cold agents once the pool is over it */
    uint64_t budget = p->params.host_budget_bytes;
    while (p->store && budget && p->used_bytes > budget && spill_one(p) == KVMEM_OK) {
    }
    void *drop = NULL;
    spare_trim(p, kvm_pool_spare_limit(p), &drop);
    /* keep the handle inert for a while so a late call gets KVMEM_ERR_CLOSED
     * (released first: once in the graveyard another close may free it) */
    kvm_agent_leave(a);
    kvm_free(p->graveyard[p->grave_next]);
    p->graveyard[p->grave_next] = a;
    p->grave_next = (p->grave_next + 1) % KVM_GRAVEYARD;
    pthread_mutex_unlock(&p->mu);
    free_list(drop);
}

const char *kvmem_agent_get_id(const kvmem_agent *a) {
    return (a && atomic_load(&a->magic) == KVM_AGENT_MAGIC) ? a->id : "";
}

static kvmem_status pool_remove_agent_call(kvmem_pool *p, const char *id) {
    if (!p) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_pool_remove_agent: pool is NULL");
    kvmem_status st = check_id(id, "kvmem_pool_remove_agent");
    if (st != KVMEM_OK) return st;
    pthread_mutex_lock(&p->mu);
    int32_t at = find_agent(p, id);
    while (at >= 0 && p->agents[at]->spilling) { /* its spill's write ends first */
        pthread_cond_wait(&p->spill_cv, &p->mu);
        at = find_agent(p, id);
    }
    if (at < 0) {
        /* an agent that lives only in the store is removed from there */
        st = p->store ? p->store->iface->remove(p->store, id) : KVMEM_ERR_NOT_FOUND;
        pthread_mutex_unlock(&p->mu);
        if (st == KVMEM_ERR_NOT_FOUND)
            return kvm_fail(KVMEM_ERR_NOT_FOUND, "kvmem_pool_remove_agent: no agent '%s' in the pool%s", id,
                            p->store ? " or its store" : "");
        return st;
    }
    kvm_agent_mem *m = p->agents[at];
    if (m->handle) {
        pthread_mutex_unlock(&p->mu);
        return kvm_fail(KVMEM_ERR_BUSY, "kvmem_pool_remove_agent: agent '%s' is open: close it first", id);
    }
    if (p->store) {
        st = p->store->iface->remove(p->store, id);
        if (st != KVMEM_OK && st != KVMEM_ERR_NOT_FOUND) {
            pthread_mutex_unlock(&p->mu);
            return st;
        }
    }
    memmove(p->agents + at, p->agents + at + 1, (size_t)(p->n_agents - at - 1) * sizeof *p->agents);
    p->n_agents--;
    p->used_bytes -= m->bytes;
    void *drop = NULL;
    spare_trim(p, kvm_pool_spare_limit(p), &drop);
    pthread_mutex_unlock(&p->mu);
    free_list(drop);
    kvm_agent_mem_release(p, m);
    kvm_free(m);
    return KVMEM_OK;
}

kvmem_status kvmem_pool_get_info(kvmem_pool *p, kvmem_pool_info *out) {
    int own = p ? kvm_err_begin(&p->err) : 0;
    kvmem_status st = pool_get_info_call(p, out);
    kvm_err_end(own);
    return st;
}

static kvmem_status pool_device_stats_call(kvmem_pool *p, uint64_t *bytes, uint64_t *evictions, uint64_t *unmirrored) {
    if (!p) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_pool_device_stats: pool is NULL");
    if (!bytes && !evictions && !unmirrored)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_pool_device_stats: mirror_bytes, evictions and unmirrored are all NULL");
    if (bytes) *bytes = atomic_load(&p->dev_bytes);
    if (evictions) *evictions = atomic_load(&p->dev_evictions);
    if (unmirrored) *unmirrored = atomic_load(&p->dev_unmirrored);
    return KVMEM_OK;
}

kvmem_status kvmem_pool_device_stats(kvmem_pool *p, uint64_t *mirror_bytes, uint64_t *evictions,
                                     uint64_t *unmirrored) {
    int own = p ? kvm_err_begin(&p->err) : 0;
    kvmem_status st = pool_device_stats_call(p, mirror_bytes, evictions, unmirrored);
    kvm_err_end(own);
    return st;
}

kvmem_status kvmem_pool_get_spec(kvmem_pool *p, kvmem_model_spec *out) {
    int own = p ? kvm_err_begin(&p->err) : 0;
    kvmem_status st = pool_get_spec_call(p, out);
    kvm_err_end(own);
    return st;
}

kvmem_status kvmem_pool_agent_id(kvmem_pool *p, int32_t index, char *buf, size_t size, size_t *len) {
    int own = p ? kvm_err_begin(&p->err) : 0;
    kvmem_status st = pool_agent_id_call(p, index, buf, size, len);
    kvm_err_end(own);
    return st;
}

kvmem_status kvmem_agent_open(kvmem_pool *p, const char *id, kvmem_agent **out) {
    int own = p ? kvm_err_begin(&p->err) : 0;
    kvmem_status st = agent_open_call(p, id, out);
    kvm_err_end(own);
    return st;
}

kvmem_status kvmem_pool_remove_agent(kvmem_pool *p, const char *id) {
    int own = p ? kvm_err_begin(&p->err) : 0;
    kvmem_status st = pool_remove_agent_call(p, id);
    kvm_err_end(own);
    return st;
}

size_t kvmem_agent_last_error(const kvmem_agent *agent, char *buf, size_t size) {
    if (!agent) return kvm_errslot_copy(NULL, buf, size);
    return kvm_errslot_copy((kvm_errslot *)(uintptr_t)&agent->err, buf, size); /* its lock changes, not the message */
}

size_t kvmem_pool_last_error(const kvmem_pool *pool, char *buf, size_t size) {
    return kvm_errslot_copy(pool ? (kvm_errslot *)(uintptr_t)&pool->err : NULL, buf, size);
}
