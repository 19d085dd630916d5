/* The Redis store (plugin libkvmem-redis.so, hiredis): agents shared by
 * pools on several hosts.
 *
 * Layout, per agent, every key under one hash tag so a Redis Cluster keeps
 * them in one slot (and a script may touch them all):
 *   kvmem:{POOL:AGENT}:m            manifest hash: magic, version, gen, size,
 *                                   chunks, chunk_bytes
 *   kvmem:{POOL:AGENT}:d:GEN:I      the agent file's bytes, chunk I (at most
 *                                   chunk_bytes each) of write generation GEN
 * A save writes its chunks under a fresh random GEN (with a pending expiry,
 * so a writer that dies leaves nothing forever), then one Lua script checks
 * the version it was based on, checks every chunk is there, switches the
 * manifest to version+1, sets TTLs and deletes the old generation's chunks.
 * A reader reads the manifest, then the chunks of that generation; a chunk
 * gone means a newer save replaced it meanwhile, and the reader starts over.
 * Readers never see a half-written agent, and a failed save leaves the
 * previous version as it was.
 *
 * Optimistic concurrency: the store remembers, per agent, the version this
 * pool last read or wrote (0: none). A save based on another version than
 * the stored one fails with KVMEM_ERR_CONFLICT and writes nothing.
 *
 * A commit whose reply never came back (the server died or timed out after
 * running the script) may or may not have been stored. Its generation is
 * unique to this pool and save, so the store remembers it as unanswered: a
 * later save that finds the manifest moved on checks whether the stored
 * generation is one of this pool's unanswered saves, and if so adopts that
 * version (the pool's copy descends from it) and commits on top of it. Any
 * other writer's save leaves another generation there and is still refused.
 *
 * Connections: a small stack of idle connections; every operation takes one,
 * so the store is safe from several threads and readers/writers of
 * different agents run in parallel. In a cluster, a MOVED reply reconnects
 * the operation to the node that owns the agent's slot. */
#include "store/store.h"

#include <hiredis/hiredis.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* hiredis 0.14 (Debian 12) lacks these; 1.x has them */
#ifndef REDIS_ERR_TIMEOUT
#  define REDIS_ERR_TIMEOUT (-100)
#endif
#ifndef REDIS_REPLY_MAP
#  define REDIS_REPLY_MAP (-101)
#endif
#ifndef REDIS_REPLY_VERB
#  define REDIS_REPLY_VERB (-102)
#endif

#define RS_MAGIC "kvmem-redis/1"
#define RS_DEFAULT_CHUNK ((uint64_t)4 << 20)
#define RS_PENDING_MS 3600000LL /* uncommitted chunks expire after an hour */
#define RS_READ_RETRIES 8
#define RS_MAX_IDLE 8
#define RS_MAX_ID 128

/* The core's error reporting, set by every init (always the same table;
 * atomic because pools may be created from several threads). */
static _Atomic(const kvm_store_host *) g_host;
#define HOST() atomic_load_explicit(&g_host, memory_order_relaxed)
#define FAIL(...) (HOST()->fail(__VA_ARGS__))
/* Every allocation of the plugin's own goes through the core's allocator
 * (so tests/oom fails each one); hiredis allocates with libc's. The site
 * reads "stores/redis/redis_store.c:LINE" (CMakeLists maps the source dir). */
#define RS_STR2_(x) #x
#define RS_STR_(x) RS_STR2_(x)
#define RS_SITE __FILE__ ":" RS_STR_(__LINE__)
#define rs_malloc(n) (HOST()->mem_malloc((n), RS_SITE))
#define rs_calloc(n, k) (HOST()->mem_calloc((n), (k), RS_SITE))
#define rs_realloc(p, n) (HOST()->mem_realloc((p), (n), RS_SITE))
#define rs_free(p) (HOST()->mem_free(p))

#define RS_GEN_LEN 16      /* a generation: 16 hex digits */
#define RS_MAX_UNANSWERED 8 /* per agent; the oldest is forgotten first (then its save conflicts) */

typedef struct known_ver {
    struct known_ver *next;
    char id[RS_MAX_ID + 1];
    long long version; /* 0: none */
    /* generations of this pool's commits of the agent whose reply never
     * came back since `version` (oldest first) */
    char unanswered[RS_MAX_UNANSWERED][RS_GEN_LEN + 1];
    int n_unanswered;
} known_ver;

typedef struct rs_store {
    /* where and how to connect */
    char *host; /* NULL with a unix socket */
    int port;
    char *sock;
    char *user, *pass;
    int db;
    struct timeval timeout;
    /* layout */
    char pool[RS_MAX_ID + 1];
    uint64_t chunk_bytes;
    long long ttl_ms;
    /* state */
    pthread_mutex_t mu;
    redisContext *idle[RS_MAX_IDLE];
    int n_idle;
    known_ver *known; /* a list: a node is allocated before the call that adds it */
    uint64_t gen_seed, gen_counter;
    char *where; /* "redis 127.0.0.1:6379" for messages */
} rs_store;

/* ---- small helpers ---- */

static int id_valid(const char *id) {
    size_t n = 0;
    if (!id || !*id || id[0] == '.') return 0;
    for (; id[n]; n++) {
        unsigned char c = (unsigned char)id[n];
        if (!(isalnum(c) || c == '.' || c == '_' || c == '-')) return 0;
        if (n >= RS_MAX_ID) return 0;
    }
    return 1;
}

static void key_of(const rs_store *s, const char *id, const char *suffix, char *buf, size_t size) {
    snprintf(buf, size, "kvmem:{%s:%s}:%s", s->pool, id, suffix);
}

static long long known_get(rs_store *s, const char *id) {
    long long v = 0;
    pthread_mutex_lock(&s->mu);
    for (const known_ver *k = s->known; k; k = k->next)
        if (strcmp(k->id, id) == 0) {
            v = k->version;
            break;
        }
    pthread_mutex_unlock(&s->mu);
    return v;
}

/* The entry of id, created from *spare when absent and spare is given
 * (NULL otherwise). Under s->mu. */
static known_ver *known_entry(rs_store *s, const char *id, known_ver **spare) {
    known_ver *k = s->known;
    while (k && strcmp(k->id, id) != 0) k = k->next;
    if (!k && spare && *spare) {
        k = *spare;
        *spare = NULL;
        memset(k, 0, sizeof *k);
        snprintf(k->id, sizeof k->id, "%s", id);
        k->next = s->known;
        s->known = k;
    }
    return k;
}

/* Remember the version this pool holds (0 forgets), which is what the pool
 * now has: unanswered commits before it no longer matter. It cannot fail: a
 * new entry takes *spare, allocated before the read or write it follows,
 * which the caller frees if it is left. (Forgetting a committed version
 * because memory ran out would make this pool's next save conflict with
 * itself.) */
static void known_set(rs_store *s, const char *id, long long v, known_ver **spare) {
    pthread_mutex_lock(&s->mu);
    if (v) {
        known_ver *k = known_entry(s, id, spare);
        if (k) {
            k->version = v;
            k->n_unanswered = 0;
        }
    } else {
        known_ver **p = &s->known;
        while (*p && strcmp((*p)->id, id) != 0) p = &(*p)->next;
        if (*p) {
            known_ver *dead = *p;
            *p = dead->next;
            rs_free(dead);
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* Remember that this pool's commit of generation gen got no reply. */
static void known_unanswered(rs_store *s, const char *id, const char *gen, known_ver **spare) {
    pthread_mutex_lock(&s->mu);
    known_ver *k = known_entry(s, id, spare);
    if (k) {
        if (k->n_unanswered == RS_MAX_UNANSWERED) {
            memmove(k->unanswered[0], k->unanswered[1], sizeof k->unanswered[0] * (RS_MAX_UNANSWERED - 1));
            k->n_unanswered--;
        }
        snprintf(k->unanswered[k->n_unanswered++], sizeof k->unanswered[0], "%s", gen);
    }
    pthread_mutex_unlock(&s->mu);
}

/* 1 if gen is one of this pool's unanswered commits of id. */
static int known_is_unanswered(rs_store *s, const char *id, const char *gen) {
    int found = 0;
    pthread_mutex_lock(&s->mu);
    const known_ver *k = known_entry(s, id, NULL);
    for (int i = 0; k && i < k->n_unanswered && !found; i++) found = strcmp(k->unanswered[i], gen) == 0;
    pthread_mutex_unlock(&s->mu);
    return found;
}

/* ---- connections ---- */

static kvmem_status ctx_fail(const rs_store *s, redisContext *c, const char *what) {
    /* hiredis 0.14 reports a read timeout as an I/O error with EAGAIN's text */
    int timeout = c && (c->err == REDIS_ERR_TIMEOUT ||
                        (c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == ETIMEDOUT ||
                                                    strstr(c->errstr, "temporarily unavailable") ||
                                                    strstr(c->errstr, "timed out"))));
    if (timeout)
        return FAIL(KVMEM_ERR_IO, "%s: %s: timed out after %ld ms (URL option timeout_ms)", s->where, what,
                    (long)(s->timeout.tv_sec * 1000 + s->timeout.tv_usec / 1000));
    return FAIL(KVMEM_ERR_IO, "%s: %s: %s", s->where, what, c ? (c->errstr[0] ? c->errstr : "connection lost") : "out of memory");
}

/* Send argv, return the reply (caller frees) or NULL with the failure set. */
static redisReply *cmd_argv(const rs_store *s, redisContext *c, int argc, const char **argv, const size_t *lens,
                            const char *what, kvmem_status *st) {
    redisReply *r = redisCommandArgv(c, argc, argv, lens);
    if (!r) *st = ctx_fail(s, c, what);
    return r;
}

static kvmem_status setup_conn(rs_store *s, redisContext *c) {
    kvmem_status st = KVMEM_OK;
    redisSetTimeout(c, s->timeout);
    if (s->pass) {
        const char *av[3] = {"AUTH", s->user ? s->user : s->pass, s->pass};
        int ac = s->user ? 3 : 2;
        redisReply *r = cmd_argv(s, c, ac, av, NULL, "AUTH", &st);
        if (!r) return st;
        if (r->type == REDIS_REPLY_ERROR) st = FAIL(KVMEM_ERR_IO, "%s: authentication failed: %s", s->where, r->str);
        freeReplyObject(r);
        if (st != KVMEM_OK) return st;
    }
    if (s->db) {
        char db[16];
        snprintf(db, sizeof db, "%d", s->db);
        const char *av[2] = {"SELECT", db};
        redisReply *r = cmd_argv(s, c, 2, av, NULL, "SELECT", &st);
        if (!r) return st;
        if (r->type == REDIS_REPLY_ERROR) st = FAIL(KVMEM_ERR_IO, "%s: SELECT %d failed: %s", s->where, s->db, r->str);
        freeReplyObject(r);
    }
    return st;
}

static kvmem_status connect_to(rs_store *s, const char *host, int port, redisContext **out) {
    redisContext *c = host ? redisConnectWithTimeout(host, port, s->timeout)
                           : redisConnectUnixWithTimeout(s->sock, s->timeout);
    if (!c || c->err) {
        kvmem_status st = ctx_fail(s, c, "cannot connect");
        if (c) redisFree(c);
        return st;
    }
    kvmem_status st = setup_conn(s, c);
    if (st != KVMEM_OK) {
        redisFree(c);
        return st;
    }
    *out = c;
    return KVMEM_OK;
}

static kvmem_status conn_get(rs_store *s, redisContext **out) {
    pthread_mutex_lock(&s->mu);
    redisContext *c = s->n_idle ? s->idle[--s->n_idle] : NULL;
    pthread_mutex_unlock(&s->mu);
    if (c) {
        *out = c;
        return KVMEM_OK;
    }
    return connect_to(s, s->host, s->port, out);
}

/* Return a connection; a broken one (or any after an error mid-pipeline,
 * which may have replies pending) is closed instead. */
static void conn_put(rs_store *s, redisContext *c, int ok) {
    if (!c) return;
    if (ok && !c->err) {
        pthread_mutex_lock(&s->mu);
        if (s->n_idle < RS_MAX_IDLE) {
            s->idle[s->n_idle++] = c;
            c = NULL;
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (c) redisFree(c);
}

/* If r is a MOVED redirection, reconnect *c to the node it names and
 * return 1; 0 if it is not one (ASK fails: a reshard is in progress). */
static int follow_moved(rs_store *s, redisContext **c, redisReply *r, const char *what, kvmem_status *st) {
    if (r->type != REDIS_REPLY_ERROR) return 0;
    if (strncmp(r->str, "ASK ", 4) == 0) {
        *st = FAIL(KVMEM_ERR_IO, "%s: %s: the cluster is moving this agent's slot (ASK): retry", s->where, what);
        return -1;
    }
    if (strncmp(r->str, "MOVED ", 6) != 0) return 0;
    /* "MOVED <slot> <host>:<port>" */
    char host[256];
    const char *sp = strchr(r->str + 6, ' ');
    const char *colon = sp ? strrchr(sp, ':') : NULL;
    if (!sp || !colon || (size_t)(colon - sp - 1) >= sizeof host) {
        *st = FAIL(KVMEM_ERR_IO, "%s: %s: malformed redirection '%s'", s->where, what, r->str);
        return -1;
    }
    snprintf(host, sizeof host, "%.*s", (int)(colon - sp - 1), sp + 1);
    redisContext *n;
    if ((*st = connect_to(s, host, atoi(colon + 1), &n)) != KVMEM_OK) return -1;
    redisFree(*c);
    *c = n;
    return 1;
}

/* One command that names one agent's keys: follows a cluster's MOVED
 * redirection by reconnecting *c to the node that owns the slot. */
static redisReply *agent_cmd(rs_store *s, redisContext **c, int argc, const char **argv, const size_t *lens,
                             const char *what, kvmem_status *st) {
    for (int hop = 0; hop < 4; hop++) {
        redisReply *r = cmd_argv(s, *c, argc, argv, lens, what, st);
        if (!r) return NULL;
        int f = follow_moved(s, c, r, what, st);
        if (f == 0) return r;
        freeReplyObject(r);
        if (f < 0) return NULL;
    }
    *st = FAIL(KVMEM_ERR_IO, "%s: %s: too many cluster redirections", s->where, what);
    return NULL;
}

/* ---- manifest ---- */

typedef struct manifest {
    long long version;
    char gen[40];
    uint64_t size, chunks, chunk_bytes;
} manifest;

/* A manifest number as the store writes it: decimal digits, no sign, no
 * leading zero, at most `max`. strtoull alone would take " 5", "+5", "-1"
 * (as 2^64 - 1) and clamp "99999999999999999999". */
static int dec_parse(const char *str, size_t len, unsigned long long max, unsigned long long *out) {
    if (len == 0 || len > 20 || (str[0] == '0' && len > 1)) return 0;
    for (size_t i = 0; i < len; i++)
        if (str[i] < '0' || str[i] > '9') return 0;
    errno = 0;
    unsigned long long v = strtoull(str, NULL, 10);
    if (errno == ERANGE || v > max) return 0;
    *out = v;
    return 1;
}

/* The version is in [1, LLONG_MAX] and never passes through a Lua number (a
 * double: 2^53 + 1 does not exist there, and Redis writes a number of more
 * than 14 digits back as "9.007199254741e+15"): the commit script compares
 * and stores it as a string, and the next one is computed here. */
static int version_parse(const char *str, size_t len, long long *out) {
    unsigned long long v;
    if (!dec_parse(str, len, LLONG_MAX, &v) || v == 0) return 0;
    *out = (long long)v;
    return 1;
}

/* Read the manifest of `id`. NOT_FOUND when absent; FORMAT for a value kvmem
 * did not write; CORRUPT for an inconsistent one. */
static kvmem_status read_manifest(rs_store *s, redisContext **c, const char *id, manifest *m) {
    char key[320];
    key_of(s, id, "m", key, sizeof key);
    const char *av[2] = {"HGETALL", key};
    kvmem_status st;
    redisReply *r = agent_cmd(s, c, 2, av, NULL, "reading the manifest", &st);
    if (!r) return st;
    if (r->type == REDIS_REPLY_ERROR) {
        st = strncmp(r->str, "WRONGTYPE", 9) == 0
                 ? FAIL(KVMEM_ERR_FORMAT, "%s: key '%s' holds a value kvmem did not write (not a manifest hash)", s->where, key)
                 : FAIL(KVMEM_ERR_IO, "%s: reading '%s': %s", s->where, key, r->str);
        freeReplyObject(r);
        return st;
    }
    if ((r->type != REDIS_REPLY_ARRAY && r->type != REDIS_REPLY_MAP) || r->elements == 0) {
        freeReplyObject(r);
        return FAIL(KVMEM_ERR_NOT_FOUND, "no stored agent '%s' in %s (pool '%s')", id, s->where, s->pool);
    }
    memset(m, 0, sizeof *m);
    int have_magic = 0, have = 0, bad_version = 0;
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        redisReply *k = r->element[i], *v = r->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING) continue;
        unsigned long long u = 0;
        if (strcmp(k->str, "magic") == 0) have_magic = strcmp(v->str, RS_MAGIC) == 0;
        else if (strcmp(k->str, "gen") == 0 && v->len < sizeof m->gen) snprintf(m->gen, sizeof m->gen, "%s", v->str), have |= 1;
        else if (strcmp(k->str, "version") == 0) {
            bad_version = !version_parse(v->str, v->len, &m->version);
            have |= 2 * !bad_version;
        } else if (strcmp(k->str, "size") == 0) have |= 4 * dec_parse(v->str, v->len, UINT64_MAX, &u), m->size = u;
        else if (strcmp(k->str, "chunks") == 0) have |= 8 * dec_parse(v->str, v->len, UINT64_MAX, &u), m->chunks = u;
        else if (strcmp(k->str, "chunk_bytes") == 0) have |= 16 * dec_parse(v->str, v->len, UINT64_MAX, &u), m->chunk_bytes = u;
    }
    freeReplyObject(r);
    if (!have_magic)
        return FAIL(KVMEM_ERR_FORMAT, "%s: key '%s' holds a value kvmem did not write (no '%s' magic)", s->where, key, RS_MAGIC);
    if (bad_version)
        return FAIL(KVMEM_ERR_CORRUPT, "%s: manifest '%s': its version is not an integer in [1, %lld]", s->where, key, LLONG_MAX);
    if (have != 31 || m->version < 1 || m->chunk_bytes == 0 || m->chunks != m->size / m->chunk_bytes + (m->size % m->chunk_bytes != 0))
        return FAIL(KVMEM_ERR_CORRUPT, "%s: manifest '%s' is inconsistent (fields missing or chunk count does not match the size)",
                    s->where, key);
    return KVMEM_OK;
}

/* ---- reader: the whole value, fetched at open ---- */

typedef struct rs_reader {
    kvm_store_reader base;
    redisReply **chunk;
    uint64_t n_chunks, chunk_bytes, size;
    rs_store *s;       /* for loaded: the version read becomes the one this pool holds */
    long long version;
    known_ver *spare;  /* the version record loaded takes, allocated before the read */
    char id[RS_MAX_ID + 1];
} rs_reader;

static kvmem_status rr_read(kvm_store_reader *r, uint64_t off, void *buf, size_t n, size_t *got) {
    rs_reader *x = (rs_reader *)r;
    size_t done = 0;
    unsigned char *out = buf;
    while (done < n && off < x->size) {
        uint64_t ci = off / x->chunk_bytes, co = off % x->chunk_bytes;
        redisReply *c = x->chunk[ci];
        size_t k = (size_t)((uint64_t)c->len - co);
        if (k > n - done) k = n - done;
        memcpy(out + done, c->str + co, k);
        done += k;
        off += k;
    }
    *got = done;
    return KVMEM_OK;
}

static void rr_free(rs_reader *x) {
    if (x->chunk)
        for (uint64_t i = 0; i < x->n_chunks; i++)
            if (x->chunk[i]) freeReplyObject(x->chunk[i]);
    rs_free(x->chunk);
    rs_free(x->spare);
    rs_free(x);
}

static void rr_close(kvm_store_reader *r) { rr_free((rs_reader *)r); }

static void rr_loaded(kvm_store_reader *r) {
    rs_reader *x = (rs_reader *)r;
    known_set(x->s, x->id, x->version, &x->spare);
}

/* Fetch every chunk of manifest m (pipelined). *stale = 1 when a chunk is
 * gone and the manifest moved on (a newer save won: read again). */
static kvmem_status send_get(rs_store *s, redisContext *c, const char *id, const manifest *m, uint64_t i) {
    char suf[80], key[400];
    snprintf(suf, sizeof suf, "d:%s:%" PRIu64, m->gen, i);
    key_of(s, id, suf, key, sizeof key);
    const char *av[2] = {"GET", key};
    return redisAppendCommandArgv(c, 2, av, NULL) == REDIS_OK ? KVMEM_OK : ctx_fail(s, c, "sending GET");
}

/* GETs in flight at once: enough to keep the server busy while the client
 * parses, without making the server queue the whole agent in its output
 * buffer (measured: all-at-once ran at a sixth of the speed). */
#define RS_WINDOW 3

static kvmem_status fetch_chunks(rs_store *s, redisContext **c, const char *id, const manifest *m, rs_reader *x, int *stale) {
    kvmem_status st = KVMEM_OK;
    *stale = 0;
    uint64_t sent = 0;
    for (; sent < m->chunks && sent < RS_WINDOW; sent++)
        if ((st = send_get(s, *c, id, m, sent)) != KVMEM_OK) return st;
    uint64_t missing = UINT64_MAX;
    for (uint64_t i = 0; i < sent; i++) {
        void *rep = NULL;
        if (redisGetReply(*c, &rep) != REDIS_OK || !rep) return ctx_fail(s, *c, "reading a chunk");
        redisReply *r = rep;
        uint64_t want = i + 1 < m->chunks ? m->chunk_bytes : m->size - i * m->chunk_bytes;
        if (st != KVMEM_OK || missing != UINT64_MAX) {
            freeReplyObject(r); /* drain what is in flight */
            continue;
        }
        if (r->type == REDIS_REPLY_NIL) {
            missing = i;
            freeReplyObject(r);
        } else if (r->type != REDIS_REPLY_STRING) {
            st = r->type == REDIS_REPLY_ERROR && strncmp(r->str, "WRONGTYPE", 9) != 0
                     ? FAIL(KVMEM_ERR_IO, "%s: agent '%s' chunk %" PRIu64 ": %s", s->where, id, i, r->str)
                     : FAIL(KVMEM_ERR_FORMAT, "%s: agent '%s' chunk %" PRIu64 " holds a value kvmem did not write", s->where, id, i);
            freeReplyObject(r);
        } else if ((uint64_t)r->len != want) {
            st = FAIL(KVMEM_ERR_CORRUPT, "%s: agent '%s' version %lld chunk %" PRIu64 " holds %zu bytes, the manifest says %" PRIu64
                      " (truncated or replaced)", s->where, id, m->version, i, r->len, want);
            freeReplyObject(r);
        } else {
            x->chunk[i] = r;
            if (sent < m->chunks) {
                kvmem_status e = send_get(s, *c, id, m, sent);
                if (e != KVMEM_OK) return e;
                sent++;
            }
        }
    }
    if (st != KVMEM_OK || missing == UINT64_MAX) return st;
    manifest now;
    st = read_manifest(s, c, id, &now);
    if (st == KVMEM_OK && (now.version != m->version || strcmp(now.gen, m->gen) != 0)) {
        *stale = 1;
        return KVMEM_OK;
    }
    if (st == KVMEM_ERR_NOT_FOUND) return st; /* removed meanwhile */
    if (st != KVMEM_OK) return st;
    return FAIL(KVMEM_ERR_CORRUPT, "%s: agent '%s' version %lld: chunk %" PRIu64 " of %" PRIu64 " is missing", s->where, id,
                m->version, missing, m->chunks);
}

static kvmem_status rs_open_read(kvm_store *st_, const char *id, kvm_store_reader **out, uint64_t *size) {
    rs_store *s = st_->impl;
    if (!id_valid(id)) return FAIL(KVMEM_ERR_INVALID_ARG, "store key '%.40s' is not a valid agent id", id ? id : "(null)");
    known_ver *spare = rs_malloc(sizeof *spare);
    if (!spare) return FAIL(KVMEM_ERR_NOMEM, "%s: reading agent '%s': out of memory for its version record", s->where, id);
    redisContext *c;
    kvmem_status st = conn_get(s, &c);
    if (st != KVMEM_OK) {
        rs_free(spare);
        return st;
    }
    for (int attempt = 0; attempt < RS_READ_RETRIES; attempt++) {
        manifest m;
        if ((st = read_manifest(s, &c, id, &m)) != KVMEM_OK) break;
        if (m.size > (uint64_t)SIZE_MAX / 2) {
            st = FAIL(KVMEM_ERR_CORRUPT, "%s: agent '%s' manifest size %" PRIu64 " too large", s->where, id, m.size);
            break;
        }
        rs_reader *x = rs_calloc(1, sizeof *x);
        if (x) x->chunk = rs_calloc(m.chunks ? m.chunks : 1, sizeof *x->chunk);
        if (!x || !x->chunk) {
            rs_free(x);
            st = FAIL(KVMEM_ERR_NOMEM, "%s: reading agent '%s': out of memory for its reader (%" PRIu64 " chunks)", s->where,
                      id, m.chunks);
            break;
        }
        x->n_chunks = m.chunks;
        x->chunk_bytes = m.chunk_bytes;
        x->size = m.size;
        int stale = 0;
        st = fetch_chunks(s, &c, id, &m, x, &stale);
        if (st == KVMEM_OK && !stale) {
            x->base.read_at = rr_read;
            x->base.readv_at = NULL;
            x->base.close = rr_close;
            x->base.loaded = rr_loaded;
            x->s = s;
            x->version = m.version;
            x->spare = spare;
            snprintf(x->id, sizeof x->id, "%s", id);
            conn_put(s, c, 1);
            *out = &x->base;
            *size = m.size;
            return KVMEM_OK;
        }
        rr_free(x);
        if (st != KVMEM_OK) break;
    }
    if (st == KVMEM_OK)
        st = FAIL(KVMEM_ERR_IO, "%s: agent '%s' kept changing while being read (%d tries)", s->where, id, RS_READ_RETRIES);
    conn_put(s, c, st != KVMEM_ERR_IO);
    rs_free(spare);
    return st;
}

/* ---- writer ---- */

typedef struct rs_writer {
    kvm_store_writer base;
    rs_store *s;
    redisContext *c;
    char id[RS_MAX_ID + 1];
    char gen[RS_GEN_LEN + 1];
    long long based_on;
    known_ver *spare; /* the version record a first commit of this agent takes */
    unsigned char *buf;
    size_t n;
    uint64_t chunks, size;
    int pending; /* chunk SET replies not read yet */
    int broken;  /* the connection's state is unknown: close it */
    kvmem_status failed; /* sticky: a failed chunk write fails the commit */
} rs_writer;

/* Send "SET key <chunk> PX ms" straight from the writer's buffer. Through
 * hiredis every chunk would first be copied into a fresh command buffer
 * (a page-faulting allocation of chunk_bytes per chunk). MSG_NOSIGNAL: a
 * server that went away is an error, not a SIGPIPE. */
static kvmem_status send_chunk(rs_writer *w, const char *key, const char *px) {
    rs_store *s = w->s;
    char head[512], tail[128];
    int hl = snprintf(head, sizeof head, "*5\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n", strlen(key), key, w->n);
    int tl = snprintf(tail, sizeof tail, "\r\n$2\r\nPX\r\n$%zu\r\n%s\r\n", strlen(px), px);
    struct iovec iov[3] = {{head, (size_t)hl}, {w->buf, w->n}, {tail, (size_t)tl}};
    struct iovec *v = iov;
    int nv = 3;
    while (nv) {
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = v;
        msg.msg_iovlen = (size_t)nv;
        ssize_t k = sendmsg(w->c->fd, &msg, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            w->broken = 1;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return FAIL(KVMEM_ERR_IO, "%s: writing a chunk: timed out after %ld ms (URL option timeout_ms)", s->where,
                            (long)(s->timeout.tv_sec * 1000 + s->timeout.tv_usec / 1000));
            return FAIL(KVMEM_ERR_IO, "%s: writing a chunk: %s", s->where, strerror(errno));
        }
        size_t done = (size_t)k;
        while (nv && done >= v->iov_len) done -= v->iov_len, v++, nv--;
        if (nv) {
            v->iov_base = (char *)v->iov_base + done;
            v->iov_len -= done;
        }
    }
    return KVMEM_OK;
}

/* Read one pending "+OK" of a chunk SET. */
static kvmem_status take_chunk_reply(rs_writer *w) {
    void *rep = NULL;
    if (redisGetReply(w->c, &rep) != REDIS_OK || !rep) {
        w->broken = 1;
        return ctx_fail(w->s, w->c, "writing a chunk");
    }
    redisReply *r = rep;
    w->pending--;
    kvmem_status st = KVMEM_OK;
    if (r->type == REDIS_REPLY_ERROR) st = FAIL(KVMEM_ERR_IO, "%s: writing agent '%s': %s", w->s->where, w->id, r->str);
    else if (r->type != REDIS_REPLY_STATUS) st = FAIL(KVMEM_ERR_IO, "%s: writing agent '%s': unexpected reply", w->s->where, w->id);
    freeReplyObject(r);
    return st;
}

static kvmem_status drain_replies(rs_writer *w) {
    kvmem_status st = KVMEM_OK;
    while (w->pending && !w->broken) {
        kvmem_status e = take_chunk_reply(w);
        if (st == KVMEM_OK) st = e;
    }
    return st;
}

/* Chunks are pipelined: one SET in flight while the next is sent, so the
 * server stores chunk i while chunk i+1 crosses the socket. The first
 * chunk's reply is awaited, so a cluster's MOVED is followed before more
 * chunks go to the wrong node. */
static kvmem_status put_chunk(rs_writer *w) {
    rs_store *s = w->s;
    char suf[80], key[400], px[32];
    snprintf(suf, sizeof suf, "d:%s:%" PRIu64, w->gen, w->chunks);
    key_of(s, w->id, suf, key, sizeof key);
    snprintf(px, sizeof px, "%lld", RS_PENDING_MS);
    kvmem_status st;
    if (w->chunks == 0) {
        for (int hop = 0;; hop++) {
            if ((st = send_chunk(w, key, px)) != KVMEM_OK) return st;
            void *rep = NULL;
            if (redisGetReply(w->c, &rep) != REDIS_OK || !rep) {
                w->broken = 1;
                return ctx_fail(s, w->c, "writing a chunk");
            }
            redisReply *r = rep;
            int f = hop < 4 ? follow_moved(s, &w->c, r, "writing a chunk", &st) : 0;
            if (f == 0 && r->type == REDIS_REPLY_ERROR)
                st = FAIL(KVMEM_ERR_IO, "%s: writing '%s': %s", s->where, key, r->str);
            freeReplyObject(r);
            if (f < 0) w->broken = 1;
            if (f <= 0) break;
        }
        if (st != KVMEM_OK) return st;
    } else {
        while (w->pending >= 1)
            if ((st = take_chunk_reply(w)) != KVMEM_OK) return st;
        if ((st = send_chunk(w, key, px)) != KVMEM_OK) return st;
        w->pending++;
    }
    w->chunks++;
    w->size += w->n;
    w->n = 0;
    return KVMEM_OK;
}

static kvmem_status rw_write(kvm_store_writer *wb, const void *buf, size_t n) {
    rs_writer *w = (rs_writer *)wb;
    if (w->failed != KVMEM_OK) return w->failed;
    const unsigned char *p = buf;
    while (n) {
        size_t k = (size_t)w->s->chunk_bytes - w->n;
        if (k > n) k = n;
        memcpy(w->buf + w->n, p, k);
        w->n += k;
        p += k;
        n -= k;
        if (w->n == w->s->chunk_bytes) {
            kvmem_status st = put_chunk(w);
            if (st != KVMEM_OK) return w->failed = st;
        }
    }
    return KVMEM_OK;
}

/* Delete the chunks this writer wrote (best effort: they expire anyway). */
static void drop_chunks(rs_writer *w) {
    drain_replies(w);
    if (!w->c || w->c->err || w->broken) return;
    for (uint64_t i = 0; i < w->chunks; i++) {
        char suf[80], key[400];
        snprintf(suf, sizeof suf, "d:%s:%" PRIu64, w->gen, i);
        key_of(w->s, w->id, suf, key, sizeof key);
        const char *av[2] = {"UNLINK", key};
        redisReply *r = redisCommandArgv(w->c, 2, av, NULL);
        if (!r) return;
        freeReplyObject(r);
    }
}

static void rw_free(rs_writer *w, int ok) {
    conn_put(w->s, w->c, ok && !w->broken && !w->pending);
    rs_free(w->spare);
    rs_free(w->buf);
    rs_free(w);
}

static void rw_abort(kvm_store_writer *wb) {
    rs_writer *w = (rs_writer *)wb;
    drop_chunks(w);
    rw_free(w, w->failed == KVMEM_OK);
}

/* Check-and-set of the manifest, atomic on the server. ARGV[1] is the
 * version the save is based on ("0": none), ARGV[9] the next one; both are
 * strings, compared and stored as strings (version_parse says why). ARGV[10]
 * is the generation the stored version must also have ("": any). Replies:
 * {1} | {-1, stored_version (a string), stored_gen ("" if none)} conflict |
 * {-2} foreign value | {-3, i} chunk i of the new generation is missing. */
static const char k_commit_lua[] =
    "local t = redis.call('TYPE', KEYS[1]).ok\n"
    "local cur, og, on = '0', nil, 0\n"
    "if t == 'hash' then\n"
    "  local f = redis.call('HMGET', KEYS[1], 'magic', 'version', 'gen', 'chunks')\n"
    "  if f[1] ~= ARGV[8] or type(f[2]) ~= 'string' or not string.match(f[2], '^[1-9][0-9]*$') then return {-2} end\n"
    "  cur = f[2]; og = f[3]; on = tonumber(f[4]) or 0\n"
    "elseif t ~= 'none' then return {-2} end\n"
    "if cur ~= ARGV[1] or (ARGV[10] ~= '' and og ~= ARGV[10]) then return {-1, cur, og or ''} end\n"
    "local n = tonumber(ARGV[4])\n"
    "local ttl = tonumber(ARGV[6])\n"
    "for i = 0, n - 1 do\n"
    "  local k = ARGV[7] .. ARGV[2] .. ':' .. i\n"
    "  if redis.call('EXISTS', k) == 0 then return {-3, i} end\n"
    "  if ttl > 0 then redis.call('PEXPIRE', k, ttl) else redis.call('PERSIST', k) end\n"
    "end\n"
    "redis.call('DEL', KEYS[1])\n"
    "redis.call('HSET', KEYS[1], 'magic', ARGV[8], 'version', ARGV[9], 'gen', ARGV[2], 'size', ARGV[3], 'chunks', n,"
    " 'chunk_bytes', ARGV[5])\n"
    "if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end\n"
    "if og and og ~= ARGV[2] then\n"
    "  for i = 0, on - 1 do redis.call('UNLINK', ARGV[7] .. og .. ':' .. i) end\n"
    "end\n"
    "return {1}\n";

static kvmem_status rw_commit(kvm_store_writer *wb) {
    rs_writer *w = (rs_writer *)wb;
    rs_store *s = w->s;
    kvmem_status st = w->failed;
    if (st == KVMEM_OK && w->n) st = put_chunk(w); /* an empty value has no chunk */
    if (st == KVMEM_OK) st = drain_replies(w);
    if (st != KVMEM_OK) {
        drop_chunks(w);
        rw_free(w, 0);
        return st;
    }
    char key[320], prefix[320], exp[32], next[32], size[32], n[32], cb[32], ttl[32];
    key_of(s, w->id, "m", key, sizeof key);
    key_of(s, w->id, "d:", prefix, sizeof prefix);
    snprintf(size, sizeof size, "%" PRIu64, w->size);
    snprintf(n, sizeof n, "%" PRIu64, w->chunks);
    snprintf(cb, sizeof cb, "%" PRIu64, s->chunk_bytes);
    snprintf(ttl, sizeof ttl, "%lld", s->ttl_ms);
    long long based_on = w->based_on;
    char adopt_gen[RS_GEN_LEN + 1] = ""; /* the retry: this pool's unanswered commit it builds on */
    redisReply *r = NULL;
    long long code = 0, val = 0;
    const char *stored = "?"; /* -1: the stored version, as the server holds it */
    int stored_len = 1;
    size_t stored_full = 1;
    for (int attempt = 0; attempt < 2; attempt++) {
        snprintf(exp, sizeof exp, "%lld", based_on);
        snprintf(next, sizeof next, "%lld", based_on + 1); /* rs_open_write and the adoption refuse LLONG_MAX */
        const char *av[14] = {"EVAL", k_commit_lua, "1", key, exp, w->gen, size, n, cb, ttl, prefix, RS_MAGIC, next, adopt_gen};
        r = agent_cmd(s, &w->c, 14, av, NULL, "committing the manifest", &st);
        if (!r) {
            /* the server went away: whether the script ran is unknown. If it
             * did, the stored version is this save, which a later save of
             * this pool may build on (and no other pool's may). */
            known_unanswered(s, w->id, w->gen, &w->spare);
            rw_free(w, 0);
            return st;
        }
        code = val = 0;
        stored = "?", stored_len = 1, stored_full = 1;
        const char *og = NULL;
        if (r->type == REDIS_REPLY_ARRAY && r->elements >= 1 && r->element[0]->type == REDIS_REPLY_INTEGER) {
            code = r->element[0]->integer;
            if (r->elements >= 2 && r->element[1]->type == REDIS_REPLY_INTEGER) val = r->element[1]->integer;
            if (r->elements >= 2 && r->element[1]->type == REDIS_REPLY_STRING)
                stored = r->element[1]->str, stored_full = r->element[1]->len,
                stored_len = stored_full > 20 ? 20 : (int)stored_full;
            if (r->elements >= 3 && r->element[2]->type == REDIS_REPLY_STRING && r->element[2]->len == RS_GEN_LEN)
                og = r->element[2]->str;
        }
        /* a conflict with this pool's own unanswered commit: build on it */
        long long cur;
        if (attempt == 0 && code == -1 && og && version_parse(stored, stored_full, &cur) && cur > based_on &&
            cur < LLONG_MAX && known_is_unanswered(s, w->id, og)) {
            based_on = cur;
            snprintf(adopt_gen, sizeof adopt_gen, "%s", og);
            freeReplyObject(r);
            r = NULL;
            continue;
        }
        break;
    }
    if (r->type == REDIS_REPLY_ERROR) st = FAIL(KVMEM_ERR_IO, "%s: committing agent '%s': %s", s->where, w->id, r->str);
    else if (code == 1) known_set(s, w->id, based_on + 1, &w->spare);
    else if (code == -1)
        st = FAIL(KVMEM_ERR_CONFLICT,
                  "%s: agent '%s' was saved elsewhere: the store holds version %.*s, this pool's copy is based on %s%lld; "
                  "nothing was written (load it again, then save)", s->where, w->id, stored_len, stored,
                  based_on ? "version " : "", based_on);
    else if (code == -2)
        st = FAIL(KVMEM_ERR_FORMAT, "%s: key '%s' holds a value kvmem did not write: not overwritten (remove it first)", s->where, key);
    else if (code == -3)
        st = FAIL(KVMEM_ERR_IO, "%s: agent '%s': chunk %lld of the new version vanished before the commit (server restarted "
                  "without persistence?); the previous version is unchanged", s->where, w->id, val);
    else st = FAIL(KVMEM_ERR_IO, "%s: committing agent '%s': unexpected reply", s->where, w->id);
    freeReplyObject(r);
    if (st != KVMEM_OK) drop_chunks(w);
    rw_free(w, 1);
    return st;
}

static void new_gen(rs_store *s, char *gen, size_t size) {
    pthread_mutex_lock(&s->mu);
    uint64_t x = s->gen_seed + 0x9e3779b97f4a7c15ull * ++s->gen_counter;
    pthread_mutex_unlock(&s->mu);
    /* splitmix64 of (seed from /dev/urandom, counter): unique per save */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    snprintf(gen, size, "%016" PRIx64, x);
}

static kvmem_status rs_open_write(kvm_store *st_, const char *id, kvm_store_writer **out) {
    rs_store *s = st_->impl;
    if (!id_valid(id)) return FAIL(KVMEM_ERR_INVALID_ARG, "store key '%.40s' is not a valid agent id", id ? id : "(null)");
    const long long based_on = known_get(s, id);
    if (based_on == LLONG_MAX)
        return FAIL(KVMEM_ERR_CAPACITY, "%s: agent '%s' is at version %lld, the last one: it cannot be saved again (remove it, then save)",
                    s->where, id, LLONG_MAX);
    rs_writer *w = rs_calloc(1, sizeof *w);
    if (w) w->buf = rs_malloc((size_t)s->chunk_bytes);
    if (w && w->buf) w->spare = rs_malloc(sizeof *w->spare);
    if (!w || !w->buf || !w->spare) {
        if (w) rs_free(w->buf);
        rs_free(w);
        return FAIL(KVMEM_ERR_NOMEM,
                    "%s: saving agent '%s': out of memory for its writer (a %" PRIu64 "-byte chunk buffer and a version record)",
                    s->where, id, s->chunk_bytes);
    }
    kvmem_status st = conn_get(s, &w->c);
    if (st != KVMEM_OK) {
        rs_free(w->spare);
        rs_free(w->buf);
        rs_free(w);
        return st;
    }
    w->s = s;
    snprintf(w->id, sizeof w->id, "%s", id);
    new_gen(s, w->gen, sizeof w->gen);
    w->based_on = based_on;
    w->failed = KVMEM_OK;
    w->base.write = rw_write;
    w->base.commit = rw_commit;
    w->base.abort = rw_abort;
    *out = &w->base;
    return KVMEM_OK;
}

/* ---- exists, remove, list ---- */

static kvmem_status rs_exists(kvm_store *st_, const char *id, int *exists) {
    rs_store *s = st_->impl;
    if (!id_valid(id)) return FAIL(KVMEM_ERR_INVALID_ARG, "store key '%.40s' is not a valid agent id", id ? id : "(null)");
    char key[320];
    key_of(s, id, "m", key, sizeof key);
    redisContext *c;
    kvmem_status st = conn_get(s, &c);
    if (st != KVMEM_OK) return st;
    const char *av[2] = {"EXISTS", key};
    redisReply *r = agent_cmd(s, &c, 2, av, NULL, "EXISTS", &st);
    if (r) {
        if (r->type == REDIS_REPLY_INTEGER) *exists = r->integer > 0;
        else st = FAIL(KVMEM_ERR_IO, "%s: EXISTS '%s': %s", s->where, key, r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
        freeReplyObject(r);
    }
    conn_put(s, c, r != NULL);
    return st;
}

static const char k_remove_lua[] =
    "local t = redis.call('TYPE', KEYS[1]).ok\n"
    "if t == 'none' then return 0 end\n"
    "if t == 'hash' then\n"
    "  local f = redis.call('HMGET', KEYS[1], 'gen', 'chunks')\n"
    "  local n = tonumber(f[2]) or 0\n"
    "  if f[1] then for i = 0, n - 1 do redis.call('UNLINK', ARGV[1] .. f[1] .. ':' .. i) end end\n"
    "end\n"
    "redis.call('UNLINK', KEYS[1])\n"
    "return 1\n";

static kvmem_status rs_remove(kvm_store *st_, const char *id) {
    rs_store *s = st_->impl;
    if (!id_valid(id)) return FAIL(KVMEM_ERR_INVALID_ARG, "store key '%.40s' is not a valid agent id", id ? id : "(null)");
    char key[320], prefix[320];
    key_of(s, id, "m", key, sizeof key);
    key_of(s, id, "d:", prefix, sizeof prefix);
    redisContext *c;
    kvmem_status st = conn_get(s, &c);
    if (st != KVMEM_OK) return st;
    const char *av[5] = {"EVAL", k_remove_lua, "1", key, prefix};
    redisReply *r = agent_cmd(s, &c, 5, av, NULL, "removing", &st);
    if (r) {
        if (r->type == REDIS_REPLY_INTEGER && r->integer == 1) known_set(s, id, 0, NULL);
        else if (r->type == REDIS_REPLY_INTEGER)
            st = FAIL(KVMEM_ERR_NOT_FOUND, "no stored agent '%s' in %s (pool '%s')", id, s->where, s->pool);
        else st = FAIL(KVMEM_ERR_IO, "%s: removing '%s': %s", s->where, id, r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
        freeReplyObject(r);
    }
    conn_put(s, c, r != NULL);
    return st;
}

typedef struct id_list {
    char **v;
    size_t n, cap;
} id_list;

static int id_list_add(id_list *l, const char *id, size_t len) {
    for (size_t i = 0; i < l->n; i++)
        if (strlen(l->v[i]) == len && memcmp(l->v[i], id, len) == 0) return 0; /* a replica listed twice */
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 32;
        char **nv = rs_realloc(l->v, nc * sizeof *nv);
        if (!nv) return -1;
        l->v = nv;
        l->cap = nc;
    }
    char *d = rs_malloc(len + 1);
    if (!d) return -1;
    memcpy(d, id, len);
    d[len] = '\0';
    l->v[l->n++] = d;
    return 0;
}

/* SCAN one node for manifests of this pool. */
static kvmem_status scan_node(rs_store *s, redisContext *c, id_list *l) {
    char pat[300], pre[300];
    snprintf(pat, sizeof pat, "kvmem:{%s:*}:m", s->pool);
    size_t pl = (size_t)snprintf(pre, sizeof pre, "kvmem:{%s:", s->pool);
    char cursor[32] = "0";
    kvmem_status st = KVMEM_OK;
    do {
        const char *av[6] = {"SCAN", cursor, "MATCH", pat, "COUNT", "1000"};
        redisReply *r = cmd_argv(s, c, 6, av, NULL, "SCAN", &st);
        if (!r) return st;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            st = FAIL(KVMEM_ERR_IO, "%s: SCAN: %s", s->where, r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
            freeReplyObject(r);
            return st;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        for (size_t i = 0; i < r->element[1]->elements; i++) {
            redisReply *k = r->element[1]->element[i];
            if (k->type != REDIS_REPLY_STRING || k->len < pl + 3 || memcmp(k->str, pre, pl) != 0) continue;
            if (memcmp(k->str + k->len - 3, "}:m", 3) != 0) continue;
            size_t len = k->len - pl - 3;
            char id[RS_MAX_ID + 2];
            if (len > RS_MAX_ID) continue;
            memcpy(id, k->str + pl, len);
            id[len] = '\0';
            if (!id_valid(id)) continue;
            if (id_list_add(l, id, len) != 0) {
                freeReplyObject(r);
                return FAIL(KVMEM_ERR_NOMEM, "%s: listing: out of memory for the list of stored agents (%zu so far)", s->where,
                            l->n);
            }
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    return KVMEM_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static kvmem_status rs_list(kvm_store *st_, int (*fn)(const char *, void *), void *user) {
    rs_store *s = st_->impl;
    redisContext *c;
    kvmem_status st = conn_get(s, &c);
    if (st != KVMEM_OK) return st;
    id_list l = {0};
    /* a cluster: scan every master (CLUSTER NODES); otherwise this server */
    const char *av[2] = {"CLUSTER", "NODES"};
    redisReply *r = cmd_argv(s, c, 2, av, NULL, "CLUSTER NODES", &st);
    if (!r) {
        conn_put(s, c, 0);
        return st;
    }
    if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_VERB) {
        /* lines: <id> <ip:port@cport[,host]> <flags> <master> ... */
        char *text = r->str;
        for (char *line = text; line && *line && st == KVMEM_OK;) {
            char *nl = strchr(line, '\n');
            if (nl) *nl = '\0';
            char nid[64], addr[300], flags[200];
            if (sscanf(line, "%63s %299s %199s", nid, addr, flags) == 3 && strstr(flags, "master") && !strstr(flags, "fail")) {
                char *at = strchr(addr, '@');
                if (at) *at = '\0';
                char *colon = strrchr(addr, ':');
                if (colon) {
                    *colon = '\0';
                    redisContext *nc;
                    st = connect_to(s, addr[0] ? addr : s->host, atoi(colon + 1), &nc);
                    if (st == KVMEM_OK) {
                        st = scan_node(s, nc, &l);
                        redisFree(nc);
                    }
                }
            }
            line = nl ? nl + 1 : NULL;
        }
    } else {
        st = scan_node(s, c, &l);
    }
    freeReplyObject(r);
    conn_put(s, c, st == KVMEM_OK);
    if (st == KVMEM_OK && l.n) qsort(l.v, l.n, sizeof *l.v, cmp_str);
    int stop = 0;
    for (size_t i = 0; i < l.n; i++) {
        if (!stop && st == KVMEM_OK) stop = fn(l.v[i], user);
        rs_free(l.v[i]);
    }
    rs_free(l.v);
    return st;
}

/* ---- creation from a URL ---- */

static void rs_store_free(kvm_store *st_) {
    if (!st_) return;
    rs_store *s = st_->impl;
    for (int i = 0; i < s->n_idle; i++) redisFree(s->idle[i]);
    pthread_mutex_destroy(&s->mu);
    rs_free(s->host);
    rs_free(s->sock);
    rs_free(s->user);
    rs_free(s->pass);
    for (known_ver *k = s->known, *next; k; k = next) {
        next = k->next;
        rs_free(k);
    }
    rs_free(s->where);
    rs_free(s);
    rs_free(st_);
}

static const kvm_store_iface redis_iface = {
    "redis", rs_store_free, rs_open_read, rs_open_write, rs_exists, rs_list, rs_remove,
};

static int parse_u64(const char *v, size_t len, uint64_t lo, uint64_t hi, uint64_t *out) {
    if (len == 0 || len > 19) return 0;
    uint64_t x = 0;
    for (size_t i = 0; i < len; i++) {
        if (v[i] < '0' || v[i] > '9') return 0;
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    if (x < lo || x > hi) return 0;
    *out = x;
    return 1;
}

static char *dup_n_at(const char *p, size_t n, const char *site) {
    char *d = HOST()->mem_malloc(n + 1, site);
    if (d) {
        memcpy(d, p, n);
        d[n] = '\0';
    }
    return d;
}
#define dup_n(p, n) dup_n_at((p), (n), RS_SITE)
#define rs_strdup(p) dup_n_at((p), strlen(p), RS_SITE)

/* Options after '?'': pool=NAME, ttl=SECONDS, timeout_ms=N, chunk_bytes=N, db=N. */
static kvmem_status parse_options(rs_store *s, const char *q, const char *url) {
    while (q && *q) {
        const char *amp = strchr(q, '&');
        size_t len = amp ? (size_t)(amp - q) : strlen(q);
        const char *eq = memchr(q, '=', len);
        if (!eq) return FAIL(KVMEM_ERR_INVALID_ARG, "redis store URL '%s': option '%.*s' has no value", url, (int)len, q);
        size_t kl = (size_t)(eq - q), vl = len - kl - 1;
        const char *v = eq + 1;
        uint64_t x;
        if (kl == 4 && memcmp(q, "pool", 4) == 0) {
            char name[RS_MAX_ID + 2];
            if (vl > RS_MAX_ID) vl = RS_MAX_ID + 1;
            memcpy(name, v, vl);
            name[vl] = '\0';
            if (!id_valid(name))
                return FAIL(KVMEM_ERR_INVALID_ARG, "redis store URL '%s': pool name must be [A-Za-z0-9._-]{1,128}", url);
            memcpy(s->pool, name, vl + 1); /* id_valid: vl <= RS_MAX_ID */
        } else if (kl == 3 && memcmp(q, "ttl", 3) == 0 && parse_u64(v, vl, 0, 100000000ull, &x)) {
            s->ttl_ms = (long long)x * 1000;
        } else if (kl == 10 && memcmp(q, "timeout_ms", 10) == 0 && parse_u64(v, vl, 1, 3600000ull, &x)) {
            s->timeout.tv_sec = (time_t)(x / 1000);
            s->timeout.tv_usec = (suseconds_t)(x % 1000) * 1000;
        } else if (kl == 11 && memcmp(q, "chunk_bytes", 11) == 0 && parse_u64(v, vl, 16, (uint64_t)512 << 20, &x)) {
            s->chunk_bytes = x;
        } else if (kl == 2 && memcmp(q, "db", 2) == 0 && parse_u64(v, vl, 0, 100000, &x)) {
            s->db = (int)x;
        } else {
            return FAIL(KVMEM_ERR_INVALID_ARG,
                        "redis store URL '%s': bad option '%.*s' (pool=NAME, ttl=SECONDS, timeout_ms=1..3600000, "
                        "chunk_bytes=16..536870912, db=N)", url, (int)len, q);
        }
        q = amp ? amp + 1 : NULL;
    }
    return KVMEM_OK;
}

/* The URL as messages show it: the user name kept, the password replaced
 * by "***" (a message may end up in a log or before a user who must not
 * learn it). Everything between "redis://" and the last '@' is credentials,
 * whatever it holds ('?', '/' and ':' included). */
static void url_shown(const char *url, char *out, size_t n) {
    const char *at = strncmp(url, "redis://", 8) == 0 ? strrchr(url + 8, '@') : NULL;
    if (!at) {
        snprintf(out, n, "%s", url);
        return;
    }
    const char *user = url + 8, *colon = memchr(user, ':', (size_t)(at - user));
    if (colon) snprintf(out, n, "redis://%.*s:***%s", (int)(colon - user), user, at);
    else snprintf(out, n, "redis://***%s", at);
}

static kvmem_status parse_url(rs_store *s, const char *url) {
    char shown[1100];
    url_shown(url, shown, sizeof shown);
    /* credentials first: a password may hold '?' or '/' */
    const char *rest = url;
    if (strncmp(url, "redis://", 8) == 0) {
        const char *at = strrchr(url + 8, '@');
        if (at) {
            const char *user = url + 8, *colon = memchr(user, ':', (size_t)(at - user));
            if (colon) {
                if (colon > user && !(s->user = dup_n(user, (size_t)(colon - user))))
                    return FAIL(KVMEM_ERR_NOMEM, "redis store: out of memory for the user name");
                if (!(s->pass = dup_n(colon + 1, (size_t)(at - colon - 1))))
                    return FAIL(KVMEM_ERR_NOMEM, "redis store: out of memory for the password");
            } else if (at > user && !(s->pass = dup_n(user, (size_t)(at - user)))) {
                return FAIL(KVMEM_ERR_NOMEM, "redis store: out of memory for the password");
            }
            rest = at + 1;
        }
    }
    const char *q = strchr(rest, '?');
    size_t main_len = q ? (size_t)(q - rest) : strlen(rest);
    char buf[1024];
    if (main_len >= sizeof buf) return FAIL(KVMEM_ERR_INVALID_ARG, "redis store URL too long");
    memcpy(buf, rest, main_len);
    buf[main_len] = '\0';
    if (strncmp(buf, "unix://", 7) == 0) {
        if (buf[7] != '/') return FAIL(KVMEM_ERR_INVALID_ARG, "redis store URL '%s': unix:// needs an absolute socket path", shown);
        if (!(s->sock = rs_strdup(buf + 7))) return FAIL(KVMEM_ERR_NOMEM, "redis store: out of memory for the socket path");
    } else {
        char *p = rest == url ? buf + 8 : buf; /* after redis:// or user:pass@ */
        char *slash = strchr(p, '/');
        if (slash) {
            *slash = '\0';
            uint64_t db;
            if (slash[1] && !parse_u64(slash + 1, strlen(slash + 1), 0, 100000, &db))
                return FAIL(KVMEM_ERR_INVALID_ARG, "redis store URL '%s': database '%s' is not a number", shown, slash + 1);
            if (slash[1]) s->db = (int)db;
        }
        char *host = p;
        char *port = NULL;
        if (*host == '[') { /* [::1]:6379 */
            char *rb = strchr(host, ']');
            if (!rb) return FAIL(KVMEM_ERR_INVALID_ARG, "redis store URL '%s': unclosed '['", shown);
            *rb = '\0';
            host++;
            if (rb[1] == ':') port = rb + 2;
        } else {
            char *colon = strrchr(host, ':');
            if (colon) *colon = '\0', port = colon + 1;
        }
        if (!*host) return FAIL(KVMEM_ERR_INVALID_ARG, "redis store URL '%s': no host", shown);
        uint64_t pn = 6379;
        if (port && !parse_u64(port, strlen(port), 1, 65535, &pn))
            return FAIL(KVMEM_ERR_INVALID_ARG, "redis store URL '%s': bad port '%s'", shown, port);
        if (!(s->host = rs_strdup(host))) return FAIL(KVMEM_ERR_NOMEM, "redis store: out of memory for the host name");
        s->port = (int)pn;
    }
    return parse_options(s, q ? q + 1 : NULL, shown);
}

__attribute__((visibility("default"))) kvmem_status kvmem_store_plugin_init(uint32_t api_version, const kvm_store_host *host,
                                                                             const char *url, kvm_store **out);

kvmem_status kvmem_store_plugin_init(uint32_t api_version, const kvm_store_host *host, const char *url, kvm_store **out) {
    if (!host) return KVMEM_ERR_INVALID_ARG;
    atomic_store_explicit(&g_host, host, memory_order_relaxed);
    if (api_version != KVM_STORE_PLUGIN_API)
        return FAIL(KVMEM_ERR_UNSUPPORTED, "redis store: plugin API %u, libkvmem wants %u", KVM_STORE_PLUGIN_API, api_version);
    rs_store *s = rs_calloc(1, sizeof *s);
    kvm_store *st_ = rs_calloc(1, sizeof *st_);
    if (!s || !st_) {
        rs_free(s);
        rs_free(st_);
        return FAIL(KVMEM_ERR_NOMEM, "redis store: out of memory for the store (%zu bytes)", sizeof *s + sizeof *st_);
    }
    pthread_mutex_init(&s->mu, NULL);
    st_->iface = &redis_iface;
    st_->impl = s;
    snprintf(s->pool, sizeof s->pool, "default");
    s->chunk_bytes = RS_DEFAULT_CHUNK;
    s->timeout.tv_sec = 5;
    kvmem_status st = parse_url(s, url);
    char where[600];
    if (s->host) snprintf(where, sizeof where, "redis %s:%d", s->host, s->port);
    else snprintf(where, sizeof where, "redis %s", s->sock ? s->sock : "?");
    s->where = rs_strdup(where);
    if (st == KVMEM_OK && !s->where) st = FAIL(KVMEM_ERR_NOMEM, "redis store: out of memory for the server's name");
    /* the seed of write generations: two hosts must not pick the same */
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &s->gen_seed, sizeof s->gen_seed) != (ssize_t)sizeof s->gen_seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s->gen_seed = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 32);
    }
    if (fd >= 0) close(fd);
    /* connect now, so a wrong URL or a server that is down fails at pool creation */
    redisContext *c = NULL;
    if (st == KVMEM_OK && (st = conn_get(s, &c)) == KVMEM_OK) {
        const char *av[1] = {"PING"};
        redisReply *r = cmd_argv(s, c, 1, av, NULL, "PING", &st);
        if (r) {
            if (r->type == REDIS_REPLY_ERROR) st = FAIL(KVMEM_ERR_IO, "%s: PING: %s", s->where, r->str);
            freeReplyObject(r);
        }
        conn_put(s, c, st == KVMEM_OK);
    }
    if (st != KVMEM_OK) {
        rs_store_free(st_);
        return st;
    }
    *out = st_;
    return KVMEM_OK;
}
