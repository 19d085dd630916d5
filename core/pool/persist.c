/* Public persistence API: save/load an agent, sync a pool to its store, and
 * the store tier the pool uses to spill and reload closed agents. The bytes
 * go through the byte-store interface (core/store/store.h) only. */
#include "agent_io.h"
#include "mapped.h"

#include <string.h>

kvmem_status kvm_store_save_mem(kvmem_pool *p, kvm_agent_mem *m) {
    kvm_store_writer *w;
    kvmem_status st = p->store->iface->open_write(p->store, m->id, &w);
    if (st != KVMEM_OK) return st;
    st = kvm_agent_write(p, m, w);
    if (st == KVMEM_OK) m->dirty = 0;
    return st;
}

static kvmem_status load_from(kvmem_pool *p, kvm_agent_mem *m, kvm_store_reader *r, uint64_t size) {
    kvm_agent_mem *fresh = NULL;
    kvmem_status st = kvm_agent_parse(p, r, size, m->id, &fresh);
    if (st == KVMEM_OK) {
        kvm_agent_mem_replace(p, m, fresh);
        if (r->loaded) r->loaded(r);
    }
    r->close(r);
    return st;
}

kvmem_status kvm_store_load_mem(kvmem_pool *p, kvm_agent_mem *m) {
    kvm_store_reader *r;
    uint64_t size;
    kvmem_status st = p->store->iface->open_read(p->store, m->id, &r, &size);
    if (st != KVMEM_OK) return st;
    return load_from(p, m, r, size);
}

static kvmem_status agent_save_taken(kvmem_agent *a, const char *path) {
    kvmem_status st = kvm_agent_check(a, "kvmem_agent_save");
    if (st != KVMEM_OK) return st;
    if ((st = kvm_mapped_refuse(a->mem, "kvmem_agent_save")) != KVMEM_OK) return st; /* its KV is in its file */
    kvmem_pool *p = a->pool;
    if (path && !*path) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_agent_save: path is empty");
    if (!path) {
        if (!p->store)
            return kvm_fail(KVMEM_ERR_NOT_FOUND, "kvmem_agent_save: no path given and the pool has no store_dir");
        return kvm_store_save_mem(p, a->mem);
    }
    kvm_store_writer *w;
    if ((st = kvm_file_open_write(path, &w)) != KVMEM_OK) return st;
    return kvm_agent_write(p, a->mem, w);
}

kvmem_status kvmem_agent_save(kvmem_agent *a, const char *path) {
    kvmem_status st = kvm_agent_enter(a, "kvmem_agent_save");
    if (st != KVMEM_OK) return st;
    st = agent_save_taken(a, path);
    kvm_agent_leave(a);
    return st;
}

static kvmem_status agent_load_taken(kvmem_agent *a, const char *path) {
    kvmem_status st = kvm_agent_check(a, "kvmem_agent_load");
    if (st != KVMEM_OK) return st;
    kvmem_pool *p = a->pool;
    if (path && !*path) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_agent_load: path is empty");
    if (!path) {
        if (!p->store)
            return kvm_fail(KVMEM_ERR_NOT_FOUND, "kvmem_agent_load: no path given and the pool has no store_dir");
        if ((st = kvm_store_load_mem(p, a->mem)) == KVMEM_OK) a->mem->dirty = 0;
        return st;
    }
    kvm_store_reader *r;
    uint64_t size;
    if ((st = kvm_file_open_read(path, &r, &size)) != KVMEM_OK) return st;
    if ((st = load_from(p, a->mem, r, size)) == KVMEM_OK) a->mem->dirty = 1;
    return st;
}

kvmem_status kvmem_agent_load(kvmem_agent *a, const char *path) {
    kvmem_status st = kvm_agent_enter(a, "kvmem_agent_load");
    if (st != KVMEM_OK) return st;
    st = agent_load_taken(a, path);
    kvm_agent_leave(a);
    return st;
}

static kvmem_status pool_sync(kvmem_pool *p) {
    if (!p) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_pool_sync: pool is NULL");
    if (!p->store) return kvm_fail(KVMEM_ERR_NOT_FOUND, "kvmem_pool_sync: the pool has no store_dir");
    kvmem_status st = KVMEM_OK;
    pthread_mutex_lock(&p->mu);
    while (p->spilling_bytes) pthread_cond_wait(&p->spill_cv, &p->mu); /* no second writer beside a spill */
    /* closed agents only: an open one belongs to its thread (kvmem_agent_save) */
    for (int32_t i = 0; i < p->n_agents && st == KVMEM_OK; i++) {
        kvm_agent_mem *m = p->agents[i];
        if (m->handle || m->spilled || !m->dirty) continue;
        st = kvm_store_save_mem(p, m);
    }
    pthread_mutex_unlock(&p->mu);
    return st;
}

kvmem_status kvmem_pool_sync(kvmem_pool *p) {
    int own = p ? kvm_err_begin(&p->err) : 0;
    kvmem_status st = pool_sync(p);
    kvm_err_end(own);
    return st;
}
