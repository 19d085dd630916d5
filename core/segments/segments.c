/* KEEP segments: caller-named memory pieces grouped by the caller, the
 * STATIC/DYNAMIC state machine with its event queue, KV storage as pool
 * agents (one per unit), and the retrieval plan. */
#include "../pool/pool.h"
#include "../cpu/tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEGS_MAGIC 0x6b767367u /* "kvsg" */
#define SEGS_HARD_MAX (1 << 20)

typedef struct seg_rec {
    char *name;          /* owned; NULL once removed */
    int32_t group;
    int32_t has_kv;      /* valid KV stored */
    int64_t last_update;
    int64_t n_tokens;    /* of the stored agent (valid or stale) */
    char agent[KVMEM_MAX_AGENT_ID + 1]; /* "" = none stored */
} seg_rec;

typedef struct grp_rec {
    int32_t n_members;
    int32_t state;       /* kvmem_group_state */
    int32_t has_kv;
    int32_t reserved;
    int64_t last_change;
    int64_t n_tokens;
    char agent[KVMEM_MAX_AGENT_ID + 1];
} grp_rec;

struct kvmem_segments {
    uint32_t magic;
    kvmem_pool *pool;
    char owner[KVMEM_SEGMENTS_MAX_OWNER + 1];
    kvmem_segments_params params;
    int64_t step;
    seg_rec *segs;
    int32_t n_segs, cap_segs;
    int32_t *by_name; /* live segment indices sorted by name */
    int32_t n_live;
    grp_rec *groups;  /* indexed by group id, [0, cap_groups) */
    int32_t cap_groups;
    kvmem_segment_event *q; /* ring buffer */
    size_t q_head, q_len, q_cap;
    uint32_t gen; /* next generation number for derived agent ids */
};

kvmem_status kvmem_segments_params_init(kvmem_segments_params *params, size_t struct_size) {
    kvmem_segments_params p;
    memset(&p, 0, sizeof p);
    p.static_after_steps = 10;
    p.max_segments = 0;
    return KVM_PARAMS_INIT(kvmem_segments_params, params, struct_size, &p, "kvmem_segments_params_init");
}

static kvmem_status check_segs(const kvmem_segments *s, const char *fn) {
    if (!s) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: segments is NULL", fn);
    if (s->magic != SEGS_MAGIC) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: not a segment store", fn);
    return KVMEM_OK;
}

static int32_t max_segments(const kvmem_segments *s) {
    return s->params.max_segments > 0 ? s->params.max_segments : SEGS_HARD_MAX;
}

/* ---- pool agents ---------------------------------------------------------- */

/* Binary search of the pool's sorted agent table (caller holds p->mu). */
static int32_t pool_find(const kvmem_pool *p, const char *id) {
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

/* 0 = absent, 1 = present and closed, 2 = present and open. */
static int pool_agent_state(kvmem_pool *p, const char *id) {
    pthread_mutex_lock(&p->mu);
    int32_t at = pool_find(p, id);
    int r = at < 0 ? 0 : (p->agents[at]->handle ? 2 : 1);
    pthread_mutex_unlock(&p->mu);
    return r;
}

/* 1 if some agent id starts with `prefix`. */
static int pool_has_prefix(kvmem_pool *p, const char *prefix) {
    size_t n = strlen(prefix);
    pthread_mutex_lock(&p->mu);
    int32_t at = pool_find(p, prefix);
    if (at < 0) at = -at - 1;
    int r = at < p->n_agents && strncmp(p->agents[at]->id, prefix, n) == 0;
    pthread_mutex_unlock(&p->mu);
    return r;
}

/* Best effort: a unit agent left open by a caller stays (and is retried
 * when it is replaced or the store is freed); so does one whose removal
 * failed (its store could not delete the file: logged, never forgotten
 * silently). Preserves the last error. */
static void drop_agent(kvmem_segments *s, char *agent) {
    if (!agent[0]) return;
    if (pool_agent_state(s->pool, agent) == 2) return;
    char last[512];
    snprintf(last, sizeof last, "%s", kvmem_last_error());
    kvmem_status st = kvmem_pool_remove_agent(s->pool, agent);
    if (st != KVMEM_OK && st != KVMEM_ERR_NOT_FOUND) {
        kvm_log(KVMEM_LOG_WARN, "segments of '%s': cannot remove unit agent '%s' (%s): it stays in the pool", s->owner,
                agent, kvmem_last_error());
        kvm_fail(st, "%s", last);
        return;
    }
    agent[0] = '\0';
}

/* Write fresh KV into a new agent `id`; on failure nothing remains. */
static kvmem_status write_agent(kvmem_segments *s, const char *id, const kvmem_tensor *k, const kvmem_tensor *v,
                                const kvmem_append_params *ap) {
    kvmem_agent *a = NULL;
    kvmem_status st = kvmem_agent_open(s->pool, id, &a);
    if (st != KVMEM_OK) return st;
    st = kvmem_agent_append(a, k, v, ap);
    if (st == KVMEM_OK) st = kvmem_agent_flush(a);
    kvmem_agent_close(a);
    if (st != KVMEM_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", kvmem_last_error());
        kvmem_pool_remove_agent(s->pool, id);
        return kvm_fail(st, "%s", msg);
    }
    return KVMEM_OK;
}

/* Shared path of store_segment / store_group. */
static kvmem_status store_unit(kvmem_segments *s, const char *fn, char kind, int32_t idx, char *slot_agent,
                               const kvmem_tensor *k, const kvmem_tensor *v, const kvmem_append_params *ap,
                               int64_t *n_tokens) {
    if (!k || !v) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s is NULL", fn, k ? "V" : "K");
    if (k->ndim != 4 || k->shape[1] < 1)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: K must be [n_layers][T][n_kv_heads][head_dim] with T >= 1", fn);
    if (slot_agent[0] && pool_agent_state(s->pool, slot_agent) == 2)
        return kvm_fail(KVMEM_ERR_BUSY, "%s: agent '%s' holding the old KV is open: close it first", fn, slot_agent);
    char id[KVMEM_MAX_AGENT_ID + 1];
    snprintf(id, sizeof id, "%s.kvseg-%c%d-%u", s->owner, kind, (int)idx, (unsigned)s->gen);
    if (pool_agent_state(s->pool, id) != 0)
        return kvm_fail(KVMEM_ERR_EXISTS, "%s: agent id '%s' is taken: ids '<owner>.kvseg-*' are reserved for segment stores",
                        fn, id);
    kvmem_status st = write_agent(s, id, k, v, ap);
    if (st != KVMEM_OK) return st;
    s->gen++;
    drop_agent(s, slot_agent);
    if (slot_agent[0]) {
        /* the old one is still open (raced with a reader): forget it, it is the caller's now */
        kvm_log(KVMEM_LOG_WARN, "%s: old KV agent '%s' was open and stays in the pool", fn, slot_agent);
    }
    snprintf(slot_agent, KVMEM_MAX_AGENT_ID + 1, "%s", id);
    *n_tokens = k->shape[1];
    return KVMEM_OK;
}

/* ---- create / free -------------------------------------------------------- */

kvmem_status kvmem_segments_create(kvmem_pool *pool, const char *owner, const kvmem_segments_params *params,
                                   kvmem_segments **out) {
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_segments_create: out is NULL");
    *out = NULL;
    if (!pool) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_segments_create: pool is NULL");
    if (!owner) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_segments_create: owner is NULL");
    if (!kvmem_agent_id_valid(owner) || strlen(owner) > KVMEM_SEGMENTS_MAX_OWNER)
        return kvm_fail(KVMEM_ERR_INVALID_ARG,
                        "kvmem_segments_create: owner '%.40s' is invalid: use 1-%d of [A-Za-z0-9._-], not starting with '.'",
                        owner, KVMEM_SEGMENTS_MAX_OWNER);
    kvmem_segments_params pp = kvmem_segments_default_params();
    kvmem_status st = KVM_PARAMS_IN(kvmem_segments_params, &pp, params, "kvmem_segments_create");
    if (st != KVMEM_OK) return st;
    if (pp.static_after_steps < 1)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "static_after_steps %d: must be >= 1", pp.static_after_steps);
    if (pp.max_segments < 0 || pp.max_segments > SEGS_HARD_MAX)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "max_segments %d: must be in [0, %d]", pp.max_segments, SEGS_HARD_MAX);
    char prefix[KVMEM_SEGMENTS_MAX_OWNER + 16];
    snprintf(prefix, sizeof prefix, "%s.kvseg-", owner);
    if (pool_has_prefix(pool, prefix))
        return kvm_fail(KVMEM_ERR_EXISTS,
                        "kvmem_segments_create: the pool holds agents named '%s*', reserved for the segment store of '%s'",
                        prefix, owner);
    kvmem_segments *s = kvm_calloc(1, sizeof *s);
    if (!s) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_segments_create: out of memory for the store");
    s->magic = SEGS_MAGIC;
    s->pool = pool;
    snprintf(s->owner, sizeof s->owner, "%s", owner);
    s->params = pp;
    *out = s;
    return KVMEM_OK;
}

void kvmem_segments_free(kvmem_segments *s) {
    if (!s || s->magic != SEGS_MAGIC) return;
    for (int32_t i = 0; i < s->n_segs; i++) {
        drop_agent(s, s->segs[i].agent);
        kvm_free(s->segs[i].name);
    }
    for (int32_t g = 0; g < s->cap_groups; g++) drop_agent(s, s->groups[g].agent);
    kvm_free(s->segs);
    kvm_free(s->by_name);
    kvm_free(s->groups);
    kvm_free(s->q);
    s->magic = 0;
    kvm_free(s);
}

/* ---- events --------------------------------------------------------------- */

/* Make room for `extra` more events, so a mutation can queue without failing. */
static int q_reserve(kvmem_segments *s, size_t extra) {
    if (extra <= s->q_cap - s->q_len) return 1;
    size_t nc;
    if (extra > SIZE_MAX - s->q_len || !kvm_grow_cap(s->q_cap, s->q_len + extra, 64, SIZE_MAX, sizeof(kvmem_segment_event), &nc))
        return 0;
    kvmem_segment_event *nq = kvm_malloc(nc * sizeof *nq);
    if (!nq) return 0;
    for (size_t i = 0; i < s->q_len; i++) nq[i] = s->q[(s->q_head + i) % s->q_cap];
    kvm_free(s->q);
    s->q = nq;
    s->q_head = 0;
    s->q_cap = nc;
    return 1;
}

static void q_push(kvmem_segments *s, int32_t kind, int32_t group, int32_t segment) {
    kvmem_segment_event *e = &s->q[(s->q_head + s->q_len) % s->q_cap];
    memset(e, 0, sizeof *e);
    e->kind = kind;
    e->group = group;
    e->segment = segment;
    e->step = s->step;
    s->q_len++;
}

kvmem_status kvmem_segments_drain_events(kvmem_segments *s, kvmem_segment_event *out, size_t capacity,
                                         size_t *n_out, size_t *n_left) {
    kvmem_status st = check_segs(s, "kvmem_segments_drain_events");
    if (st != KVMEM_OK) return st;
    if (!n_out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_segments_drain_events: n_out is NULL");
    if (capacity > 0 && !out)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_segments_drain_events: out is NULL with capacity %zu", capacity);
    size_t n = KVM_MIN(capacity, s->q_len);
    for (size_t i = 0; i < n; i++) out[i] = s->q[(s->q_head + i) % s->q_cap];
    if (n) {
        s->q_head = (s->q_head + n) % s->q_cap;
        s->q_len -= n;
    }
    *n_out = n;
    if (n_left) *n_left = s->q_len;
    return KVMEM_OK;
}

/* ---- state machine -------------------------------------------------------- */

static int grow_groups(kvmem_segments *s, int32_t group) {
    if (group < s->cap_groups) return 1;
    int32_t nc = s->cap_groups ? s->cap_groups : 16;
    while (nc <= group) nc *= 2;
    if (nc > KVMEM_SEGMENTS_MAX_GROUP + 1) nc = KVMEM_SEGMENTS_MAX_GROUP + 1;
    grp_rec *ng = kvm_realloc(s->groups, (size_t)nc * sizeof *ng);
    if (!ng) return 0;
    memset(ng + s->cap_groups, 0, (size_t)(nc - s->cap_groups) * sizeof *ng);
    s->groups = ng;
    s->cap_groups = nc;
    return 1;
}

/* A group changed now: it is DYNAMIC (queueing GROUP_DYNAMIC if it was
 * STATIC; the caller reserved the queue slot) and its joint KV is gone. */
static void group_changed(kvmem_segments *s, int32_t group) {
    grp_rec *g = &s->groups[group];
    g->last_change = s->step;
    if (g->state == KVMEM_GROUP_STATIC) {
        g->state = KVMEM_GROUP_DYNAMIC;
        q_push(s, KVMEM_SEG_EVENT_GROUP_DYNAMIC, group, -1);
    }
    g->has_kv = 0;
    g->n_tokens = 0;
    drop_agent(s, g->agent);
}

static kvmem_status check_group_id(int32_t group, const char *fn) {
    if (group < 0 || group > KVMEM_SEGMENTS_MAX_GROUP)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: group %d outside [0, %d]", fn, group, KVMEM_SEGMENTS_MAX_GROUP);
    return KVMEM_OK;
}

static kvmem_status check_live(const kvmem_segments *s, int32_t index, const char *fn) {
    if (index < 0 || index >= s->n_segs || !s->segs[index].name)
        return kvm_fail(KVMEM_ERR_NOT_FOUND, "%s: no live segment %d (%d indices handed out)", fn, index, s->n_segs);
    return KVMEM_OK;
}

/* Position of `name` in by_name, or -(insert point)-1. */
static int32_t name_find(const kvmem_segments *s, const char *name) {
    int32_t lo = 0, hi = s->n_live - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        int c = strcmp(s->segs[s->by_name[mid]].name, name);
        if (c == 0) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -lo - 1;
}

kvmem_status kvmem_segments_add(kvmem_segments *s, const char *name, int32_t group, int32_t *index) {
    const char *fn = "kvmem_segments_add";
    kvmem_status st = check_segs(s, fn);
    if (st != KVMEM_OK) return st;
    if (!name) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: name is NULL", fn);
    size_t len = strlen(name);
    if (len < 1 || len > KVMEM_SEGMENTS_MAX_NAME)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: name of %zu bytes: must be 1..%d", fn, len, KVMEM_SEGMENTS_MAX_NAME);
    if ((st = check_group_id(group, fn)) != KVMEM_OK) return st;
    int32_t at = name_find(s, name);
    if (at >= 0) return kvm_fail(KVMEM_ERR_EXISTS, "%s: a segment named '%.60s' exists (index %d)", fn, name, s->by_name[at]);
    if (s->n_segs >= max_segments(s))
        return kvm_fail(KVMEM_ERR_CAPACITY, "%s: %d segments were added, the max_segments limit", fn, s->n_segs);
    /* allocate everything first: a failure changes nothing */
    char *copy = kvm_malloc(len + 1);
    if (!copy) return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for a copy of the name", fn);
    memcpy(copy, name, len + 1);
    int ok = grow_groups(s, group) && q_reserve(s, 2);
    if (ok && s->n_segs == s->cap_segs) {
        size_t ncs = 0;
        int grow = kvm_grow_cap((size_t)s->cap_segs, (size_t)s->n_segs + 1, 32, SEGS_HARD_MAX, sizeof(seg_rec), &ncs);
        int32_t nc = (int32_t)ncs;
        seg_rec *ns = grow ? kvm_realloc(s->segs, (size_t)nc * sizeof *ns) : NULL;
        int32_t *nb = ns ? kvm_realloc(s->by_name, (size_t)nc * sizeof *nb) : NULL;
        if (ns) s->segs = ns;
        if (nb) {
            s->by_name = nb;
            s->cap_segs = nc;
        }
        ok = ns && nb;
    }
    if (!ok) {
        kvm_free(copy);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for the segment and event tables", fn);
    }
    int32_t idx = s->n_segs++;
    seg_rec *r = &s->segs[idx];
    memset(r, 0, sizeof *r);
    r->name = copy;
    r->group = group;
    r->last_update = s->step;
    int32_t ins = -at - 1;
    memmove(s->by_name + ins + 1, s->by_name + ins, (size_t)(s->n_live - ins) * sizeof *s->by_name);
    s->by_name[ins] = idx;
    s->n_live++;
    s->groups[group].n_members++;
    group_changed(s, group);
    q_push(s, KVMEM_SEG_EVENT_SEGMENT_STALE, group, idx);
    if (index) *index = idx;
    return KVMEM_OK;
}

kvmem_status kvmem_segments_update(kvmem_segments *s, int32_t index) {
    const char *fn = "kvmem_segments_update";
    kvmem_status st = check_segs(s, fn);
    if (st != KVMEM_OK) return st;
    if ((st = check_live(s, index, fn)) != KVMEM_OK) return st;
    if (!q_reserve(s, 2)) return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for the event queue", fn);
    seg_rec *r = &s->segs[index];
    r->last_update = s->step;
    r->has_kv = 0; /* the stale agent stays until new KV replaces it */
    group_changed(s, r->group);
    q_push(s, KVMEM_SEG_EVENT_SEGMENT_STALE, r->group, index);
    return KVMEM_OK;
}

kvmem_status kvmem_segments_remove(kvmem_segments *s, int32_t index) {
    const char *fn = "kvmem_segments_remove";
    kvmem_status st = check_segs(s, fn);
    if (st != KVMEM_OK) return st;
    if ((st = check_live(s, index, fn)) != KVMEM_OK) return st;
    if (!q_reserve(s, 1)) return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for the event queue", fn);
    seg_rec *r = &s->segs[index];
    int32_t at = name_find(s, r->name);
    memmove(s->by_name + at, s->by_name + at + 1, (size_t)(s->n_live - at - 1) * sizeof *s->by_name);
    s->n_live--;
    drop_agent(s, r->agent);
    kvm_free(r->name);
    r->name = NULL;
    r->has_kv = 0;
    r->n_tokens = 0;
    s->groups[r->group].n_members--;
    group_changed(s, r->group);
    return KVMEM_OK;
}

kvmem_status kvmem_segments_assign(kvmem_segments *s, int32_t index, int32_t group) {
    const char *fn = "kvmem_segments_assign";
    kvmem_status st = check_segs(s, fn);
    if (st != KVMEM_OK) return st;
    if ((st = check_live(s, index, fn)) != KVMEM_OK) return st;
    if ((st = check_group_id(group, fn)) != KVMEM_OK) return st;
    seg_rec *r = &s->segs[index];
    if (r->group == group) return KVMEM_OK;
    if (!grow_groups(s, group) || !q_reserve(s, 2)) return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for the group table and event queue", fn);
    int32_t old = r->group;
    s->groups[old].n_members--;
    group_changed(s, old);
    r->group = group;
    s->groups[group].n_members++;
    group_changed(s, group);
    return KVMEM_OK;
}

kvmem_status kvmem_segments_step(kvmem_segments *s) {
    kvmem_status st = check_segs(s, "kvmem_segments_step");
    if (st != KVMEM_OK) return st;
    const int64_t now = s->step + 1;
    size_t turning = 0;
    for (int32_t g = 0; g < s->cap_groups; g++) {
        const grp_rec *r = &s->groups[g];
        if (r->n_members > 0 && r->state == KVMEM_GROUP_DYNAMIC && now - r->last_change >= s->params.static_after_steps)
            turning++;
    }
    if (!q_reserve(s, turning)) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_segments_step: out of memory for the event queue");
    s->step = now;
    for (int32_t g = 0; g < s->cap_groups; g++) {
        grp_rec *r = &s->groups[g];
        if (r->n_members > 0 && r->state == KVMEM_GROUP_DYNAMIC && now - r->last_change >= s->params.static_after_steps) {
            r->state = KVMEM_GROUP_STATIC;
            q_push(s, KVMEM_SEG_EVENT_GROUP_STATIC, g, -1);
        }
    }
    return KVMEM_OK;
}

/* ---- KV ------------------------------------------------------------------- */

kvmem_status kvmem_segments_store_segment(kvmem_segments *s, int32_t index, const kvmem_tensor *k,
                                          const kvmem_tensor *v, const kvmem_append_params *params) {
    const char *fn = "kvmem_segments_store_segment";
    kvmem_status st = check_segs(s, fn);
    if (st != KVMEM_OK) return st;
    kvmem_append_params ap = kvmem_append_default_params();
    if ((st = KVM_PARAMS_IN(kvmem_append_params, &ap, params, fn)) != KVMEM_OK) return st;
    if ((st = check_live(s, index, fn)) != KVMEM_OK) return st;
    seg_rec *r = &s->segs[index];
    int64_t n = 0;
    if ((st = store_unit(s, fn, 's', index, r->agent, k, v, &ap, &n)) != KVMEM_OK) return st;
    r->has_kv = 1;
    r->n_tokens = n;
    return KVMEM_OK;
}

kvmem_status kvmem_segments_store_group(kvmem_segments *s, int32_t group, const kvmem_tensor *k,
                                        const kvmem_tensor *v, const kvmem_append_params *params) {
    const char *fn = "kvmem_segments_store_group";
    kvmem_status st = check_segs(s, fn);
    if (st != KVMEM_OK) return st;
    kvmem_append_params ap = kvmem_append_default_params();
    if ((st = KVM_PARAMS_IN(kvmem_append_params, &ap, params, fn)) != KVMEM_OK) return st;
    if ((st = check_group_id(group, fn)) != KVMEM_OK) return st;
    if (group >= s->cap_groups || s->groups[group].n_members == 0)
        return kvm_fail(KVMEM_ERR_NOT_FOUND, "%s: group %d has no segments", fn, group);
    grp_rec *g = &s->groups[group];
    if (g->state != KVMEM_GROUP_STATIC)
        return kvm_fail(KVMEM_ERR_CONFLICT, "%s: group %d is DYNAMIC (changed at step %lld): only a STATIC group keeps a joint KV",
                        fn, group, (long long)g->last_change);
    int64_t n = 0;
    if ((st = store_unit(s, fn, 'g', group, g->agent, k, v, &ap, &n)) != KVMEM_OK) return st;
    g->has_kv = 1;
    g->n_tokens = n;
    return KVMEM_OK;
}

/* ---- queries -------------------------------------------------------------- */

kvmem_status kvmem_segments_get_info(kvmem_segments *s, kvmem_segments_info *out) {
    kvmem_status st = check_segs(s, "kvmem_segments_get_info");
    if (st != KVMEM_OK) return st;
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_segments_get_info: out is NULL");
    memset(out, 0, sizeof *out);
    out->step = s->step;
    out->n_segments = s->n_live;
    out->n_indices = s->n_segs;
    for (int32_t g = 0; g < s->cap_groups; g++) {
        if (s->groups[g].n_members == 0) continue;
        out->n_groups++;
        out->n_static += s->groups[g].state == KVMEM_GROUP_STATIC;
    }
    out->n_events = s->q_len;
    return KVMEM_OK;
}

kvmem_status kvmem_segments_segment_info(kvmem_segments *s, int32_t index, kvmem_segment_info *out) {
    const char *fn = "kvmem_segments_segment_info";
    kvmem_status st = check_segs(s, fn);
    if (st != KVMEM_OK) return st;
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: out is NULL", fn);
    if (index < 0 || index >= s->n_segs)
        return kvm_fail(KVMEM_ERR_NOT_FOUND, "%s: index %d outside [0, %d)", fn, index, s->n_segs);
    const seg_rec *r = &s->segs[index];
    memset(out, 0, sizeof *out);
    out->group = r->group;
    out->alive = r->name != NULL;
    out->has_kv = r->has_kv;
    out->last_update = r->last_update;
    out->n_tokens = r->has_kv ? r->n_tokens : 0;
    return KVMEM_OK;
}

kvmem_status kvmem_segments_group_info(kvmem_segments *s, int32_t group, kvmem_group_info *out) {
    const char *fn = "kvmem_segments_group_info";
    kvmem_status st = check_segs(s, fn);
    if (st != KVMEM_OK) return st;
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: out is NULL", fn);
    if ((st = check_group_id(group, fn)) != KVMEM_OK) return st;
    if (group >= s->cap_groups || s->groups[group].n_members == 0)
        return kvm_fail(KVMEM_ERR_NOT_FOUND, "%s: group %d has no segments", fn, group);
    const grp_rec *g = &s->groups[group];
    memset(out, 0, sizeof *out);
    out->state = (kvmem_group_state)g->state;
    out->n_members = g->n_members;
    out->has_kv = g->has_kv;
    out->last_change = g->last_change;
    out->n_tokens = g->has_kv ? g->n_tokens : 0;
    return KVMEM_OK;
}

kvmem_status kvmem_segments_find(kvmem_segments *s, const char *name, int32_t *index) {
    kvmem_status st = check_segs(s, "kvmem_segments_find");
    if (st != KVMEM_OK) return st;
    if (!name || !index) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_segments_find: %s is NULL", name ? "index" : "name");
    int32_t at = name_find(s, name);
    if (at < 0) return kvm_fail(KVMEM_ERR_NOT_FOUND, "kvmem_segments_find: no live segment named '%.60s'", name);
    *index = s->by_name[at];
    return KVMEM_OK;
}

kvmem_status kvmem_segments_name(kvmem_segments *s, int32_t index, char *buf, size_t size, size_t *len) {
    const char *fn = "kvmem_segments_name";
    kvmem_status st = check_segs(s, fn);
    if (st != KVMEM_OK) return st;
    if (size > 0 && !buf) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: buf is NULL with size %zu", fn, size);
    if ((st = check_live(s, index, fn)) != KVMEM_OK) return st;
    const char *nm = s->segs[index].name;
    size_t n = strlen(nm);
    if (size > 0) {
        size_t c = KVM_MIN(n, size - 1);
        memcpy(buf, nm, c);
        buf[c] = '\0';
    }
    if (len) *len = n;
    return KVMEM_OK;
}

kvmem_status kvmem_segments_group_members(kvmem_segments *s, int32_t group, int32_t *out, size_t capacity,
                                          size_t *n_members) {
    const char *fn = "kvmem_segments_group_members";
    kvmem_status st = check_segs(s, fn);
    if (st != KVMEM_OK) return st;
    if (!n_members) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n_members is NULL", fn);
    if (capacity > 0 && !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: out is NULL with capacity %zu", fn, capacity);
    if ((st = check_group_id(group, fn)) != KVMEM_OK) return st;
    size_t n = 0;
    for (int32_t i = 0; i < s->n_segs; i++) {
        if (!s->segs[i].name || s->segs[i].group != group) continue;
        if (n < capacity) out[n] = i;
        n++;
    }
    *n_members = n;
    return KVMEM_OK;
}

typedef struct plan_cand {
    float score;
    int32_t first; /* lowest member index: the tie-break */
    int32_t group;
    int32_t segment; /* -1 = group unit */
} plan_cand;

static int cand_cmp(const void *pa, const void *pb) {
    const plan_cand *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return (a->first > b->first) - (a->first < b->first);
}

kvmem_status kvmem_segments_plan(kvmem_segments *s, const float *scores, size_t n_scores, int32_t max_units,
                                 kvmem_segment_unit *out, size_t capacity, size_t *n_units) {
    const char *fn = "kvmem_segments_plan";
    kvmem_status st = check_segs(s, fn);
    if (st != KVMEM_OK) return st;
    if (!n_units) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n_units is NULL", fn);
    if (capacity > 0 && !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: out is NULL with capacity %zu", fn, capacity);
    if (max_units < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: max_units %d must be >= 0", fn, max_units);
    if (scores) {
        if (n_scores != (size_t)s->n_segs)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %zu scores for %d segment indices (one per index, removed ones included)",
                            fn, n_scores, s->n_segs);
        for (size_t i = 0; i < n_scores; i++)
            if (!isfinite(scores[i])) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: scores[%zu] is not finite", fn, i);
    } else if (n_scores != 0) {
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: scores is NULL with n_scores %zu", fn, n_scores);
    }
    plan_cand *c = kvm_malloc((size_t)(s->n_live ? s->n_live : 1) * sizeof *c);
    int32_t *gslot = s->cap_groups ? kvm_malloc((size_t)s->cap_groups * sizeof *gslot) : NULL;
    if (!c || (s->cap_groups && !gslot)) {
        kvm_free(c);
        kvm_free(gslot);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for ranking %d segments", fn, s->n_live);
    }
    for (int32_t g = 0; g < s->cap_groups; g++) gslot[g] = -1;
    size_t n = 0;
    for (int32_t i = 0; i < s->n_segs; i++) {
        const seg_rec *r = &s->segs[i];
        if (!r->name) continue;
        float sc = scores ? scores[i] : 0.0f;
        const grp_rec *g = &s->groups[r->group];
        if (g->state == KVMEM_GROUP_STATIC && g->has_kv) {
            if (gslot[r->group] < 0) {
                gslot[r->group] = (int32_t)n;
                c[n++] = (plan_cand){sc, i, r->group, -1};
            } else if (sc > c[gslot[r->group]].score) {
                c[gslot[r->group]].score = sc;
            }
        } else {
            c[n++] = (plan_cand){sc, i, r->group, i};
        }
    }
    qsort(c, n, sizeof *c, cand_cmp);
    if (max_units > 0 && n > (size_t)max_units) n = (size_t)max_units;
    for (size_t u = 0; u < n && u < capacity; u++) {
        kvmem_segment_unit *o = &out[u];
        memset(o, 0, sizeof *o);
        o->group = c[u].group;
        o->segment = c[u].segment;
        o->score = c[u].score;
        o->first_token = 0;
        if (c[u].segment < 0) {
            const grp_rec *g = &s->groups[c[u].group];
            o->kind = KVMEM_SEG_UNIT_GROUP;
            o->n_tokens = g->n_tokens;
            snprintf(o->agent_id, sizeof o->agent_id, "%s", g->agent);
        } else {
            const seg_rec *r = &s->segs[c[u].segment];
            o->kind = KVMEM_SEG_UNIT_SEGMENT;
            o->needs_compute = !r->has_kv;
            if (r->has_kv) {
                o->n_tokens = r->n_tokens;
                snprintf(o->agent_id, sizeof o->agent_id, "%s", r->agent);
            }
        }
    }
    *n_units = n;
    kvm_free(c);
    kvm_free(gslot);
    return KVMEM_OK;
}
