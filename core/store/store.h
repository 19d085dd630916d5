/* The store interface (internal): where spilled and saved agents live, by
 * key (the agent id). A store is a vtable plus its state, so a networked
 * store (Redis) can be added beside the directory store without touching the
 * pool. Readers are sequential; writers publish nothing until commit, which
 * is atomic and durable (the directory store: temporary file in the same
 * directory, fsync, rename, fsync of the directory). */
#ifndef KVMEM_STORE_H
#define KVMEM_STORE_H

#include "kvmem.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define KVM_MAX_IOV 512

#if defined(__GNUC__) || defined(__clang__)
#  define KVMEM_STORE_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#  define KVMEM_STORE_PRINTF(f, a)
#endif

typedef struct kvm_store_reader kvm_store_reader;
struct kvm_store_reader {
    /* Read up to n bytes at byte offset off; *got = 0 only at the end.
     * Positional, and safe to call from several threads at once, so the
     * loader reads and checks chunks in parallel. */
    kvmem_status (*read_at)(kvm_store_reader *r, uint64_t off, void *buf, size_t n, size_t *got);
    /* (optional) the same into cnt buffers (at most KVM_MAX_IOV): the loader
     * reads straight into the blocks instead of through a bounce buffer. */
    kvmem_status (*readv_at)(kvm_store_reader *r, uint64_t off, const struct iovec *iov, int cnt, size_t *got);
    void (*close)(kvm_store_reader *r); /* frees r */
    /* (optional) Called before close once the pool holds what was read (never
     * after a failed load): a store that tracks the version its pool holds
     * (Redis: optimistic concurrency) records it here, not at open, so a load
     * that fails after reading cannot make a later save look up to date. */
    void (*loaded)(kvm_store_reader *r);
};

typedef struct kvm_store_writer kvm_store_writer;
struct kvm_store_writer {
    /* Append n bytes. */
    kvmem_status (*write)(kvm_store_writer *w, const void *buf, size_t n);
    /* Publish atomically and durably; frees w whatever the outcome. */
    kvmem_status (*commit)(kvm_store_writer *w);
    void (*abort)(kvm_store_writer *w); /* discard; frees w */
    /* (optional) Write cnt buffers (at most KVM_MAX_IOV) at byte offset off,
     * safe from several threads at once and in any order; commit publishes
     * the bytes up to the furthest one written. Never mixed with write in one
     * save. Lets a save hash and write each chunk in one pass (NULL: the
     * writer only appends, and a save hashes everything first). */
    kvmem_status (*pwritev_at)(kvm_store_writer *w, uint64_t off, const struct iovec *iov, int cnt);
};

typedef struct kvm_store kvm_store;
typedef struct kvm_store_iface {
    const char *name;
    void (*free)(kvm_store *s);
    /* KVMEM_ERR_NOT_FOUND when the key is absent; *size = total bytes. */
    kvmem_status (*open_read)(kvm_store *s, const char *key, kvm_store_reader **out, uint64_t *size);
    kvmem_status (*open_write)(kvm_store *s, const char *key, kvm_store_writer **out);
    /* *exists = 1 if the key is stored. */
    kvmem_status (*exists)(kvm_store *s, const char *key, int *exists);
    /* Call fn for every key (sorted); fn returns nonzero to stop. */
    kvmem_status (*list)(kvm_store *s, int (*fn)(const char *key, void *user), void *user);
    /* KVMEM_ERR_NOT_FOUND when absent. */
    kvmem_status (*remove)(kvm_store *s, const char *key);
} kvm_store_iface;

struct kvm_store {
    const kvm_store_iface *iface;
    void *impl;
};

/* The directory store: key K is the file DIR/K.safetensors. The directory
 * must exist. */
kvmem_status kvm_dir_store_create(const char *dir, kvm_store **out);
static inline void kvm_store_free(kvm_store *s) {
    if (s) s->iface->free(s);
}

/* Open the store named by spec (pool_params.store_dir): a directory path,
 * the default, or a URL of a networked store loaded as a plugin so the core
 * links no client library: "redis://[[user]:pass@]host[:port][/db][?opt=v&...]"
 * or "unix:///path/to.sock[?db=N&...]" (libkvmem-redis.so, built when
 * hiredis is found). Errors: those of kvm_dir_store_create, or
 * KVMEM_ERR_UNSUPPORTED naming why the plugin is missing. */
kvmem_status kvm_store_open(const char *spec, kvm_store **out);
/* 1 if spec is a store URL rather than a directory. */
int kvm_store_is_url(const char *spec);

/* Store plugins (libkvmem-NAME.so) export KVM_STORE_PLUGIN_INIT. The host
 * table hands them the core's error reporting: a plugin may be loaded by a
 * program that links libkvmem statically, so it cannot link back to it. */
#define KVM_STORE_PLUGIN_INIT "kvmem_store_plugin_init"
#define KVM_STORE_PLUGIN_API 3u /* 2: kvm_store_writer.pwritev_at; 3: the host's allocator */
typedef struct kvm_store_host {
    kvmem_status (*fail)(kvmem_status status, const char *fmt, ...) KVMEM_STORE_PRINTF(2, 3);
    /* The core's allocator (core/alloc.h; site is "file:line"), so a
     * plugin's own allocations are counted and failed by tests/oom like the
     * core's. What these return is freed with mem_free only. */
    void *(*mem_malloc)(size_t size, const char *site);
    void *(*mem_calloc)(size_t n, size_t size, const char *site);
    void *(*mem_realloc)(void *p, size_t size, const char *site); /* size > 0 */
    void (*mem_free)(void *p);
} kvm_store_host;
typedef kvmem_status (*kvm_store_plugin_init_fn)(uint32_t api_version, const kvm_store_host *host, const char *url,
                                                 kvm_store **out);

/* Plain files by path (kvmem_agent_save/load with an explicit path): the
 * same crash-safe write, in the file's own directory. */
kvmem_status kvm_file_open_read(const char *path, kvm_store_reader **out, uint64_t *size);
kvmem_status kvm_file_open_write(const char *path, kvm_store_writer **out);

/* A reader over memory (tests and the fuzzer). Not freed by close. */
typedef struct kvm_mem_reader {
    kvm_store_reader base;
    const unsigned char *data;
    size_t size;
} kvm_mem_reader;
void kvm_mem_reader_init(kvm_mem_reader *r, const void *data, size_t size);

#endif
