/* KEEP segments: the STATIC/DYNAMIC state machine, its events, KV storage
 * as pool agents, the retrieval plan, and bad input. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAXEV 64

typedef struct fixture {
    kvmem_context *ctx;
    kvmem_pool *pool;
    kvmem_model_spec spec;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    f->ctx = tu_context(1);
    f->spec = tu_spec(2, 8);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.storage_dtype = KVMEM_F32;
    pp.block_size = 4;
    assert_ok(kvmem_pool_create(f->ctx, &f->spec, &pp, &f->pool));
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    kvmem_pool_free(f->pool);
    kvmem_context_free(f->ctx);
    free(f);
    return 0;
}

static size_t drain(kvmem_segments *s, kvmem_segment_event *ev) {
    size_t n = 0, left = 0;
    assert_ok(kvmem_segments_drain_events(s, ev, MAXEV, &n, &left));
    assert_int_equal(left, 0);
    return n;
}

static int has_event(const kvmem_segment_event *ev, size_t n, int32_t kind, int32_t group, int32_t seg) {
    for (size_t i = 0; i < n; i++)
        if (ev[i].kind == kind && ev[i].group == group && ev[i].segment == seg) return 1;
    return 0;
}

static kvmem_group_state gstate(kvmem_segments *s, int32_t g) {
    kvmem_group_info gi;
    assert_ok(kvmem_segments_group_info(s, g, &gi));
    return gi.state;
}

/* Both groups start DYNAMIC; the one left alone turns STATIC exactly t steps
 * after its last change; an update flips it back at once and asks for one
 * segment, not the group. */
static void group_turns_static_after_t_quiet_steps_and_back_on_update(void **state) {
    fixture *f = *state;
    kvmem_segments_params sp = kvmem_segments_default_params();
    assert_int_equal(sp.static_after_steps, 10);
    sp.static_after_steps = 3;
    kvmem_segments *s = NULL;
    assert_ok(kvmem_segments_create(f->pool, "robot", &sp, &s));
    int32_t mug, plate, door;
    assert_ok(kvmem_segments_add(s, "mug", 0, &mug));
    assert_ok(kvmem_segments_add(s, "plate", 0, &plate));
    assert_ok(kvmem_segments_add(s, "door", 1, &door));
    kvmem_segment_event ev[MAXEV];
    size_t n = drain(s, ev);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ev[i].kind, KVMEM_SEG_EVENT_SEGMENT_STALE);
        assert_int_equal(ev[i].step, 0);
    }
    assert_true(has_event(ev, n, KVMEM_SEG_EVENT_SEGMENT_STALE, 0, mug));
    assert_true(has_event(ev, n, KVMEM_SEG_EVENT_SEGMENT_STALE, 1, door));
    assert_int_equal(gstate(s, 0), KVMEM_GROUP_DYNAMIC);

    /* group 1 keeps changing every step; group 0 is left alone */
    for (int step = 1; step <= 3; step++) {
        assert_ok(kvmem_segments_step(s));
        n = drain(s, ev);
        if (step < 3) {
            assert_int_equal(n, 0);
            assert_int_equal(gstate(s, 0), KVMEM_GROUP_DYNAMIC);
        } else {
            assert_int_equal(n, 1);
            assert_int_equal(ev[0].kind, KVMEM_SEG_EVENT_GROUP_STATIC);
            assert_int_equal(ev[0].group, 0);
            assert_int_equal(ev[0].segment, -1);
            assert_int_equal(ev[0].step, 3);
            assert_int_equal(gstate(s, 0), KVMEM_GROUP_STATIC);
        }
        assert_ok(kvmem_segments_update(s, door));
        n = drain(s, ev);
        assert_int_equal(n, 1);
        assert_true(has_event(ev, n, KVMEM_SEG_EVENT_SEGMENT_STALE, 1, door));
        assert_int_equal(gstate(s, 1), KVMEM_GROUP_DYNAMIC);
    }
    /* staying static queues nothing more */
    assert_ok(kvmem_segments_step(s));
    assert_ok(kvmem_segments_update(s, door));
    n = drain(s, ev);
    assert_int_equal(n, 1);
    kvmem_segments_info info;
    assert_ok(kvmem_segments_get_info(s, &info));
    assert_int_equal(info.step, 4);
    assert_int_equal(info.n_groups, 2);
    assert_int_equal(info.n_static, 1);
    assert_int_equal(info.n_segments, 3);

    /* an update inside the static group: one segment stale + group dynamic */
    assert_ok(kvmem_segments_update(s, plate));
    n = drain(s, ev);
    assert_int_equal(n, 2);
    assert_true(has_event(ev, n, KVMEM_SEG_EVENT_GROUP_DYNAMIC, 0, -1));
    assert_true(has_event(ev, n, KVMEM_SEG_EVENT_SEGMENT_STALE, 0, plate));
    assert_false(has_event(ev, n, KVMEM_SEG_EVENT_SEGMENT_STALE, 0, mug));
    assert_int_equal(gstate(s, 0), KVMEM_GROUP_DYNAMIC);
    kvmem_segment_info si;
    assert_ok(kvmem_segments_segment_info(s, plate, &si));
    assert_int_equal(si.last_update, 4);
    /* and it takes t quiet steps again */
    for (int k = 0; k < 2; k++) assert_ok(kvmem_segments_step(s));
    assert_int_equal(gstate(s, 0), KVMEM_GROUP_DYNAMIC);
    assert_ok(kvmem_segments_step(s));
    assert_int_equal(gstate(s, 0), KVMEM_GROUP_STATIC);
    kvmem_segments_free(s);
}

/* Add, remove and re-assign count as changes of the groups involved. */
static void add_remove_assign_are_group_changes(void **state) {
    fixture *f = *state;
    kvmem_segments_params sp = kvmem_segments_default_params();
    sp.static_after_steps = 1;
    kvmem_segments *s = NULL;
    assert_ok(kvmem_segments_create(f->pool, "a2", &sp, &s));
    int32_t a, b, c;
    assert_ok(kvmem_segments_add(s, "a", 0, &a));
    assert_ok(kvmem_segments_add(s, "b", 0, &b));
    assert_ok(kvmem_segments_add(s, "c", 1, &c));
    assert_ok(kvmem_segments_step(s));
    kvmem_segment_event ev[MAXEV];
    size_t n = drain(s, ev);
    assert_int_equal(n, 3 + 2);
    assert_int_equal(gstate(s, 0), KVMEM_GROUP_STATIC);
    assert_int_equal(gstate(s, 1), KVMEM_GROUP_STATIC);

    /* move b from group 0 to group 1: both dynamic, no segment recompute */
    assert_ok(kvmem_segments_assign(s, b, 1));
    n = drain(s, ev);
    assert_int_equal(n, 2);
    assert_true(has_event(ev, n, KVMEM_SEG_EVENT_GROUP_DYNAMIC, 0, -1));
    assert_true(has_event(ev, n, KVMEM_SEG_EVENT_GROUP_DYNAMIC, 1, -1));
    size_t nm = 0;
    int32_t mem[4];
    assert_ok(kvmem_segments_group_members(s, 1, mem, 4, &nm));
    assert_int_equal(nm, 2);
    assert_int_equal(mem[0], b);
    assert_int_equal(mem[1], c);
    assert_ok(kvmem_segments_assign(s, b, 1)); /* no-op */
    assert_int_equal(drain(s, ev), 0);

    assert_ok(kvmem_segments_step(s));
    drain(s, ev);
    /* removing a from group 0 leaves it empty: not a group any more */
    assert_ok(kvmem_segments_remove(s, a));
    n = drain(s, ev);
    assert_int_equal(n, 1);
    assert_true(has_event(ev, n, KVMEM_SEG_EVENT_GROUP_DYNAMIC, 0, -1));
    kvmem_group_info gi;
    assert_status(kvmem_segments_group_info(s, 0, &gi), KVMEM_ERR_NOT_FOUND, "no segments");
    assert_ok(kvmem_segments_step(s));
    assert_int_equal(drain(s, ev), 0); /* an empty group never turns static */
    int32_t idx = -1;
    assert_status(kvmem_segments_find(s, "a", &idx), KVMEM_ERR_NOT_FOUND, "no live segment");
    assert_ok(kvmem_segments_find(s, "c", &idx));
    assert_int_equal(idx, c);
    /* indices are never reused; the name is free again */
    int32_t a2;
    assert_ok(kvmem_segments_add(s, "a", 0, &a2));
    assert_int_equal(a2, 3);
    kvmem_segment_info si;
    assert_ok(kvmem_segments_segment_info(s, a, &si));
    assert_int_equal(si.alive, 0);
    char buf[8];
    size_t len = 0;
    assert_ok(kvmem_segments_name(s, c, buf, sizeof buf, &len));
    assert_string_equal(buf, "c");
    assert_int_equal(len, 1);
    kvmem_segments_free(s);
}

/* KV of T tokens, value pattern base + index, [L][T][H][D]. */
static float *make_kv(const kvmem_model_spec *sp, int64_t T, float base, kvmem_tensor *t) {
    size_t nel = (size_t)sp->n_layers * (size_t)T * (size_t)sp->n_kv_heads * (size_t)sp->head_dim;
    float *x = malloc(nel * sizeof *x);
    for (size_t i = 0; i < nel; i++) x[i] = base + (float)(i % 97) * 0.01f;
    int64_t shape[4] = {sp->n_layers, T, sp->n_kv_heads, sp->head_dim};
    assert_ok(kvmem_tensor_init(t, x, KVMEM_F32, 4, shape));
    return x;
}

static int64_t agent_tokens(kvmem_pool *pool, const char *id) {
    kvmem_agent *a = NULL;
    assert_ok(kvmem_agent_open(pool, id, &a));
    kvmem_agent_info ai;
    assert_ok(kvmem_agent_get_info(a, &ai));
    kvmem_agent_close(a);
    return ai.n_tokens;
}

static int pool_has(kvmem_pool *pool, const char *id) {
    kvmem_pool_info pi;
    assert_ok(kvmem_pool_get_info(pool, &pi));
    char buf[KVMEM_MAX_AGENT_ID + 1];
    for (int32_t i = 0; i < pi.n_agents; i++) {
        assert_ok(kvmem_pool_agent_id(pool, i, buf, sizeof buf, NULL));
        if (strcmp(buf, id) == 0) return 1;
    }
    return 0;
}

/* Segment KV and a static group's joint KV live as their own agents; the
 * plan returns group units for static groups with joint KV and segment
 * units otherwise, ordered by score; stale segments say needs_compute. */
static void store_and_plan_units(void **state) {
    fixture *f = *state;
    kvmem_segments_params sp = kvmem_segments_default_params();
    sp.static_after_steps = 2;
    kvmem_segments *s = NULL;
    assert_ok(kvmem_segments_create(f->pool, "bot", &sp, &s));
    int32_t seg[4];
    const char *names[4] = {"kitchen/mug", "kitchen/plate", "hall/door", "hall/key"};
    for (int i = 0; i < 4; i++) assert_ok(kvmem_segments_add(s, names[i], i / 2, &seg[i]));
    kvmem_tensor k, v;
    float *kb[4], *vb[4];
    for (int i = 0; i < 4; i++) {
        kb[i] = make_kv(&f->spec, 3 + i, (float)i, &k);
        vb[i] = make_kv(&f->spec, 3 + i, -(float)i, &v);
        assert_ok(kvmem_segments_store_segment(s, seg[i], &k, &v, NULL));
    }
    kvmem_segment_info si;
    assert_ok(kvmem_segments_segment_info(s, seg[2], &si));
    assert_int_equal(si.has_kv, 1);
    assert_int_equal(si.n_tokens, 5);

    kvmem_segment_unit u[8];
    size_t nu = 0;
    float scores[4] = {0.1f, 0.4f, 0.9f, 0.2f};
    assert_ok(kvmem_segments_plan(s, scores, 4, 0, u, 8, &nu));
    assert_int_equal(nu, 4);
    int32_t order[4] = {2, 1, 3, 0};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(u[i].kind, KVMEM_SEG_UNIT_SEGMENT);
        assert_int_equal(u[i].segment, seg[order[i]]);
        assert_int_equal(u[i].needs_compute, 0);
        assert_int_equal(u[i].n_tokens, 3 + order[i]);
        assert_int_equal(agent_tokens(f->pool, u[i].agent_id), 3 + order[i]);
    }
    /* the stored KV reads back exactly */
    {
        kvmem_agent *a = NULL;
        assert_ok(kvmem_agent_open(f->pool, u[0].agent_id, &a));
        size_t nel = (size_t)f->spec.n_layers * 5 * (size_t)f->spec.n_kv_heads * (size_t)f->spec.head_dim;
        float *back = malloc(nel * sizeof *back);
        kvmem_tensor kt;
        int64_t shape[4] = {f->spec.n_layers, 5, f->spec.n_kv_heads, f->spec.head_dim};
        assert_ok(kvmem_tensor_init(&kt, back, KVMEM_F32, 4, shape));
        assert_ok(kvmem_agent_read(a, 0, 5, &kt, NULL));
        assert_memory_equal(back, kb[2], nel * sizeof *back);
        free(back);
        kvmem_agent_close(a);
    }

    /* group 1 (hall) goes static; store its joint KV */
    kvmem_segment_event ev[MAXEV];
    drain(s, ev);
    assert_ok(kvmem_segments_step(s));
    assert_ok(kvmem_segments_update(s, seg[0])); /* kitchen keeps changing */
    assert_ok(kvmem_segments_step(s));
    size_t n = drain(s, ev);
    assert_true(has_event(ev, n, KVMEM_SEG_EVENT_GROUP_STATIC, 1, -1));
    assert_false(has_event(ev, n, KVMEM_SEG_EVENT_GROUP_STATIC, 0, -1));
    float *jk = NULL, *jv = NULL;
    jk = make_kv(&f->spec, 11, 5.0f, &k);
    jv = make_kv(&f->spec, 11, 6.0f, &v);
    assert_status(kvmem_segments_store_group(s, 0, &k, &v, NULL), KVMEM_ERR_CONFLICT, "DYNAMIC");
    assert_ok(kvmem_segments_store_group(s, 1, &k, &v, NULL));
    kvmem_group_info gi;
    assert_ok(kvmem_segments_group_info(s, 1, &gi));
    assert_int_equal(gi.has_kv, 1);
    assert_int_equal(gi.n_tokens, 11);

    assert_ok(kvmem_segments_plan(s, scores, 4, 0, u, 8, &nu));
    assert_int_equal(nu, 3); /* hall as one unit + kitchen's two segments */
    assert_int_equal(u[0].kind, KVMEM_SEG_UNIT_GROUP);
    assert_int_equal(u[0].group, 1);
    assert_int_equal(u[0].segment, -1);
    assert_true(u[0].score == 0.9f); /* max over members */
    assert_int_equal(u[0].n_tokens, 11);
    assert_int_equal(agent_tokens(f->pool, u[0].agent_id), 11);
    char group_agent[KVMEM_MAX_AGENT_ID + 1];
    strcpy(group_agent, u[0].agent_id);
    assert_int_equal(u[1].segment, seg[1]);
    assert_int_equal(u[2].segment, seg[0]);
    assert_int_equal(u[2].needs_compute, 1); /* updated, not re-stored */
    assert_string_equal(u[2].agent_id, "");
    /* max_units and the sizing call */
    assert_ok(kvmem_segments_plan(s, scores, 4, 2, NULL, 0, &nu));
    assert_int_equal(nu, 2);
    assert_ok(kvmem_segments_plan(s, NULL, 0, 0, u, 1, &nu));
    assert_int_equal(nu, 3);
    assert_int_equal(u[0].kind, KVMEM_SEG_UNIT_SEGMENT); /* all scores 0: lowest index first */
    assert_int_equal(u[0].segment, seg[0]);

    /* update in the static group drops its joint KV agent */
    assert_true(pool_has(f->pool, group_agent));
    assert_ok(kvmem_segments_update(s, seg[3]));
    assert_false(pool_has(f->pool, group_agent));
    assert_ok(kvmem_segments_group_info(s, 1, &gi));
    assert_int_equal(gi.has_kv, 0);
    assert_int_equal(gi.state, KVMEM_GROUP_DYNAMIC);

    /* replacing a segment's KV removes the old agent */
    assert_ok(kvmem_segments_plan(s, NULL, 0, 0, u, 8, &nu));
    char old[KVMEM_MAX_AGENT_ID + 1] = "";
    for (size_t i = 0; i < nu; i++)
        if (u[i].segment == seg[2]) strcpy(old, u[i].agent_id);
    assert_true(old[0] != '\0');
    assert_true(strncmp(old, "bot.kvseg-", 10) == 0);
    kvmem_tensor k2, v2;
    float *k2b = make_kv(&f->spec, 2, 9.0f, &k2), *v2b = make_kv(&f->spec, 2, 9.0f, &v2);
    assert_ok(kvmem_segments_store_segment(s, seg[2], &k2, &v2, NULL));
    assert_false(pool_has(f->pool, old));

    /* a failed store keeps the old KV: wrong shape */
    assert_ok(kvmem_segments_segment_info(s, seg[2], &si));
    kvmem_pool_info before, after;
    assert_ok(kvmem_pool_get_info(f->pool, &before));
    kvmem_tensor bad = k2;
    bad.shape[3] = 7;
    assert_status(kvmem_segments_store_segment(s, seg[2], &bad, &v2, NULL), KVMEM_ERR_INVALID_ARG, "K");
    assert_ok(kvmem_pool_get_info(f->pool, &after));
    assert_int_equal(before.n_agents, after.n_agents);
    assert_int_equal(before.used_bytes, after.used_bytes);
    kvmem_segment_info si2;
    assert_ok(kvmem_segments_segment_info(s, seg[2], &si2));
    assert_memory_equal(&si, &si2, sizeof si);

    /* the old KV agent is open: replacing it is refused, nothing changes */
    assert_ok(kvmem_segments_plan(s, NULL, 0, 0, u, 8, &nu));
    for (size_t i = 0; i < nu; i++)
        if (u[i].segment == seg[2]) strcpy(old, u[i].agent_id);
    kvmem_agent *held = NULL;
    assert_ok(kvmem_agent_open(f->pool, old, &held));
    assert_status(kvmem_segments_store_segment(s, seg[2], &k2, &v2, NULL), KVMEM_ERR_BUSY, "close it first");
    kvmem_agent_close(held);

    /* freeing the store removes its agents */
    kvmem_segments_free(s);
    kvmem_pool_info pi;
    assert_ok(kvmem_pool_get_info(f->pool, &pi));
    assert_int_equal(pi.n_agents, 0);
    for (int i = 0; i < 4; i++) {
        free(kb[i]);
        free(vb[i]);
    }
    free(jk), free(jv), free(k2b), free(v2b);
}

/* The reserved prefix: a store refuses a pool that holds '<owner>.kvseg-*'
 * agents, so two stores (or a user agent) never share KV agents. */
static void reserved_prefix_is_enforced(void **state) {
    fixture *f = *state;
    kvmem_segments *s = NULL, *s2 = NULL;
    assert_ok(kvmem_segments_create(f->pool, "owner", NULL, &s));
    int32_t i;
    assert_ok(kvmem_segments_add(s, "x", 0, &i));
    kvmem_tensor k, v;
    float *kb = make_kv(&f->spec, 1, 0, &k), *vb = make_kv(&f->spec, 1, 0, &v);
    assert_ok(kvmem_segments_store_segment(s, i, &k, &v, NULL));
    assert_status(kvmem_segments_create(f->pool, "owner", NULL, &s2), KVMEM_ERR_EXISTS, "reserved");
    assert_null(s2);
    /* a user agent squatting on the next derived id is never overwritten */
    kvmem_agent *a = NULL;
    assert_ok(kvmem_agent_open(f->pool, "owner.kvseg-s0-1", &a));
    kvmem_agent_close(a);
    assert_status(kvmem_segments_store_segment(s, i, &k, &v, NULL), KVMEM_ERR_EXISTS, "reserved");
    assert_ok(kvmem_pool_remove_agent(f->pool, "owner.kvseg-s0-1"));
    kvmem_segments_free(s);
    free(kb), free(vb);
}

/* Bad input everywhere: an error, a message, and no state change. */
static void bad_input_changes_nothing(void **state) {
    fixture *f = *state;
    kvmem_segments *s = NULL;
    kvmem_segments_params sp = kvmem_segments_default_params();
    assert_status(kvmem_segments_create(NULL, "o", NULL, &s), KVMEM_ERR_INVALID_ARG, "pool is NULL");
    assert_status(kvmem_segments_create(f->pool, "o", NULL, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    assert_status(kvmem_segments_create(f->pool, NULL, NULL, &s), KVMEM_ERR_INVALID_ARG, "owner is NULL");
    assert_status(kvmem_segments_create(f->pool, "bad id", NULL, &s), KVMEM_ERR_INVALID_ARG, "invalid");
    assert_status(kvmem_segments_create(f->pool, ".hidden", NULL, &s), KVMEM_ERR_INVALID_ARG, "invalid");
    char longid[120];
    memset(longid, 'a', sizeof longid - 1);
    longid[sizeof longid - 1] = '\0';
    assert_status(kvmem_segments_create(f->pool, longid, NULL, &s), KVMEM_ERR_INVALID_ARG, "invalid");
    sp.static_after_steps = 0;
    assert_status(kvmem_segments_create(f->pool, "o", &sp, &s), KVMEM_ERR_INVALID_ARG, "static_after_steps");
    sp = kvmem_segments_default_params();
    sp.max_segments = -1;
    assert_status(kvmem_segments_create(f->pool, "o", &sp, &s), KVMEM_ERR_INVALID_ARG, "max_segments");
    assert_null(s);
    sp.max_segments = 2;
    assert_ok(kvmem_segments_create(f->pool, "o", &sp, &s));

    int32_t a = -1, idx = 77;
    assert_ok(kvmem_segments_add(s, "a", 0, &a));
    kvmem_segments_info before, after;
    assert_ok(kvmem_segments_get_info(s, &before));
    assert_status(kvmem_segments_add(NULL, "b", 0, &idx), KVMEM_ERR_INVALID_ARG, "segments is NULL");
    assert_status(kvmem_segments_add(s, NULL, 0, &idx), KVMEM_ERR_INVALID_ARG, "name is NULL");
    assert_status(kvmem_segments_add(s, "", 0, &idx), KVMEM_ERR_INVALID_ARG, "must be 1..");
    char big[KVMEM_SEGMENTS_MAX_NAME + 2];
    memset(big, 'n', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    assert_status(kvmem_segments_add(s, big, 0, &idx), KVMEM_ERR_INVALID_ARG, "must be 1..");
    assert_status(kvmem_segments_add(s, "b", -1, &idx), KVMEM_ERR_INVALID_ARG, "group -1");
    assert_status(kvmem_segments_add(s, "b", KVMEM_SEGMENTS_MAX_GROUP + 1, &idx), KVMEM_ERR_INVALID_ARG, "group");
    assert_status(kvmem_segments_add(s, "a", 0, &idx), KVMEM_ERR_EXISTS, "exists");
    assert_int_equal(idx, 77);
    assert_status(kvmem_segments_update(s, 5), KVMEM_ERR_NOT_FOUND, "no live segment 5");
    assert_status(kvmem_segments_update(s, -1), KVMEM_ERR_NOT_FOUND, "no live segment");
    assert_status(kvmem_segments_update(NULL, 0), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_segments_remove(s, 1), KVMEM_ERR_NOT_FOUND, "no live segment");
    assert_status(kvmem_segments_assign(s, a, -3), KVMEM_ERR_INVALID_ARG, "group -3");
    assert_status(kvmem_segments_assign(s, 9, 1), KVMEM_ERR_NOT_FOUND, "no live segment");
    assert_status(kvmem_segments_step(NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    size_t n = 9;
    assert_status(kvmem_segments_drain_events(s, NULL, 4, &n, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    assert_status(kvmem_segments_drain_events(s, NULL, 0, NULL, NULL), KVMEM_ERR_INVALID_ARG, "n_out");
    kvmem_tensor k, v;
    float *kb = make_kv(&f->spec, 2, 0, &k), *vb = make_kv(&f->spec, 2, 0, &v);
    assert_status(kvmem_segments_store_segment(s, a, NULL, &v, NULL), KVMEM_ERR_INVALID_ARG, "K is NULL");
    assert_status(kvmem_segments_store_segment(s, 3, &k, &v, NULL), KVMEM_ERR_NOT_FOUND, "no live segment");
    kvmem_tensor k0 = k;
    k0.shape[1] = 0;
    assert_status(kvmem_segments_store_segment(s, a, &k0, &v, NULL), KVMEM_ERR_INVALID_ARG, "T >= 1");
    kvmem_tensor kf = k;
    kf.dtype = KVMEM_Q4;
    assert_status(kvmem_segments_store_segment(s, a, &kf, &v, NULL), KVMEM_ERR_INVALID_ARG, "K");
    kb[5] = INFINITY;
    assert_status(kvmem_segments_store_segment(s, a, &k, &v, NULL), KVMEM_ERR_INVALID_ARG, "non-finite");
    assert_status(kvmem_segments_store_group(s, 4, &k, &v, NULL), KVMEM_ERR_NOT_FOUND, "no segments");
    assert_status(kvmem_segments_store_group(s, 0, &k, &v, NULL), KVMEM_ERR_CONFLICT, "DYNAMIC");
    kvmem_segment_unit u[2];
    float sc[3] = {0, 0, 0};
    assert_status(kvmem_segments_plan(s, sc, 3, 0, u, 2, &n), KVMEM_ERR_INVALID_ARG, "3 scores for 1");
    assert_status(kvmem_segments_plan(s, NULL, 1, 0, u, 2, &n), KVMEM_ERR_INVALID_ARG, "scores is NULL");
    sc[0] = NAN;
    assert_status(kvmem_segments_plan(s, sc, 1, 0, u, 2, &n), KVMEM_ERR_INVALID_ARG, "not finite");
    assert_status(kvmem_segments_plan(s, NULL, 0, -1, u, 2, &n), KVMEM_ERR_INVALID_ARG, "max_units");
    assert_status(kvmem_segments_plan(s, NULL, 0, 0, NULL, 2, &n), KVMEM_ERR_INVALID_ARG, "out is NULL");
    assert_status(kvmem_segments_plan(s, NULL, 0, 0, u, 2, NULL), KVMEM_ERR_INVALID_ARG, "n_units");
    kvmem_segment_info si;
    assert_status(kvmem_segments_segment_info(s, 1, &si), KVMEM_ERR_NOT_FOUND, "outside");
    assert_status(kvmem_segments_segment_info(s, 0, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    kvmem_group_info gi;
    assert_status(kvmem_segments_group_info(s, 70000, &gi), KVMEM_ERR_INVALID_ARG, "group 70000");
    assert_status(kvmem_segments_group_info(s, 3, &gi), KVMEM_ERR_NOT_FOUND, "no segments");
    assert_status(kvmem_segments_find(s, NULL, &idx), KVMEM_ERR_INVALID_ARG, "name is NULL");
    assert_status(kvmem_segments_name(s, 0, NULL, 4, NULL), KVMEM_ERR_INVALID_ARG, "buf is NULL");
    assert_status(kvmem_segments_name(s, 8, NULL, 0, NULL), KVMEM_ERR_NOT_FOUND, "no live segment");
    assert_status(kvmem_segments_group_members(s, 0, NULL, 3, &n), KVMEM_ERR_INVALID_ARG, "out is NULL");
    assert_status(kvmem_segments_get_info(s, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    assert_ok(kvmem_segments_get_info(s, &after));
    assert_memory_equal(&before, &after, sizeof before);
    /* capacity: max_segments = 2 */
    assert_ok(kvmem_segments_add(s, "b", 0, NULL));
    assert_status(kvmem_segments_add(s, "c", 0, &idx), KVMEM_ERR_CAPACITY, "max_segments");
    kvmem_segments_free(s);
    kvmem_segments_free(NULL);
    free(kb), free(vb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(group_turns_static_after_t_quiet_steps_and_back_on_update, setup, teardown),
        cmocka_unit_test_setup_teardown(add_remove_assign_are_group_changes, setup, teardown),
        cmocka_unit_test_setup_teardown(store_and_plan_units, setup, teardown),
        cmocka_unit_test_setup_teardown(reserved_prefix_is_enforced, setup, teardown),
        cmocka_unit_test_setup_teardown(bad_input_changes_nothing, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
