/* The directory store and plain-file readers/writers. Writes go to a
 * temporary file beside the target (".NAME.tmp.PID.N", a name no agent id can
 * take since ids never start with '.'), then fsync, rename, fsync of the
 * directory: a crash leaves the old file or the new one, never a mix. */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#  define _GNU_SOURCE /* preadv, pwritev, sync_file_range */
#endif
#include "store.h"
#include "../internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define KVM_STORE_EXT ".safetensors"

typedef struct file_reader {
    kvm_store_reader base;
    int fd;
} file_reader;

static kvmem_status fr_read(kvm_store_reader *r, uint64_t off, void *buf, size_t n, size_t *got) {
    file_reader *f = (file_reader *)r;
    if (off > (uint64_t)INT64_MAX) return kvm_fail(KVMEM_ERR_IO, "read offset %llu too large", (unsigned long long)off);
    for (;;) {
        ssize_t k = pread(f->fd, buf, n, (off_t)off);
        if (k >= 0) {
            *got = (size_t)k;
            return KVMEM_OK;
        }
        if (errno != EINTR) return kvm_fail(KVMEM_ERR_IO, "read failed: %s", strerror(errno));
    }
}

#if defined(__linux__)
static kvmem_status fr_readv(kvm_store_reader *r, uint64_t off, const struct iovec *iov, int cnt, size_t *got) {
    file_reader *f = (file_reader *)r;
    if (off > (uint64_t)INT64_MAX) return kvm_fail(KVMEM_ERR_IO, "read offset %llu too large", (unsigned long long)off);
    for (;;) {
        ssize_t k = preadv(f->fd, iov, cnt, (off_t)off);
        if (k >= 0) {
            *got = (size_t)k;
            return KVMEM_OK;
        }
        if (errno != EINTR) return kvm_fail(KVMEM_ERR_IO, "read failed: %s", strerror(errno));
    }
}
#endif

static void fr_close(kvm_store_reader *r) {
    file_reader *f = (file_reader *)r;
    close(f->fd);
    kvm_free(f);
}

/* What a non-regular file is, for messages. */
static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISLNK(m)) return "a symbolic link";
    return "not a regular file";
}

kvmem_status kvm_file_open_read(const char *path, kvm_store_reader **out, uint64_t *size) {
    /* Refuse what is not a regular file before opening it (opening a FIFO
     * waits for a writer, a device may act on open), and again after, with
     * O_NONBLOCK so a FIFO swapped in between cannot block either. */
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return kvm_fail(KVMEM_ERR_IO, "'%s' is %s, not a regular file", path, file_kind(st.st_mode));
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        if (errno == ENOENT) return kvm_fail(KVMEM_ERR_NOT_FOUND, "no file '%s'", path);
        return kvm_fail(KVMEM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    }
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kvm_fail(KVMEM_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kvm_fail(KVMEM_ERR_IO, "'%s' is %s, not a regular file", path, file_kind(st.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK); /* plain blocking reads from here on */
    file_reader *f = kvm_malloc(sizeof *f);
    if (!f) {
        close(fd);
        return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for a reader of '%s'", path);
    }
    f->base.read_at = fr_read;
#if defined(__linux__)
    f->base.readv_at = fr_readv;
#else
    f->base.readv_at = NULL;
#endif
    f->base.close = fr_close;
    f->base.loaded = NULL;
    f->fd = fd;
    *size = (uint64_t)st.st_size;
    *out = &f->base;
    return KVMEM_OK;
}

typedef struct file_writer {
    kvm_store_writer base;
    int fd;
    char *path, *tmp, *dir;
    unsigned char *buf;
    size_t n;
} file_writer;

#define KVM_WBUF (1u << 20)

static kvmem_status write_all(int fd, const unsigned char *p, size_t n) {
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return kvm_fail(KVMEM_ERR_IO, "write failed: %s", strerror(errno));
        }
        p += k;
        n -= (size_t)k;
    }
    return KVMEM_OK;
}

static kvmem_status fw_write(kvm_store_writer *w, const void *buf, size_t n) {
    file_writer *f = (file_writer *)w;
    const unsigned char *p = buf;
    if (f->n + n > KVM_WBUF) {
        kvmem_status st = write_all(f->fd, f->buf, f->n);
        f->n = 0;
        if (st != KVMEM_OK) return st;
        if (n >= KVM_WBUF) return write_all(f->fd, p, n);
    }
    memcpy(f->buf + f->n, p, n);
    f->n += n;
    return KVMEM_OK;
}

/* Positional writes of the one-pass save (store.h). Each range is handed
 * to the disk as soon as it is written (Linux: sync_file_range starts its
 * writeback without waiting), so the device works while the rest of the file
 * is being hashed and written, and the fsync at commit finds little left.
 * Durability is still the fsync's: a failed writeback shows there. */
static kvmem_status fw_pwritev(kvm_store_writer *w, uint64_t off, const struct iovec *iov, int cnt) {
    file_writer *f = (file_writer *)w;
    if (cnt < 0 || cnt > KVM_MAX_IOV) return kvm_fail(KVMEM_ERR_INVALID_ARG, "pwritev_at: %d buffers", cnt);
    struct iovec v[KVM_MAX_IOV];
    memcpy(v, iov, (size_t)cnt * sizeof *v);
    const uint64_t start = off;
    (void)start; /* used by the Linux writeback hint below */
    int i = 0;
    while (i < cnt) {
        if (off > (uint64_t)INT64_MAX) return kvm_fail(KVMEM_ERR_IO, "write offset %llu too large", (unsigned long long)off);
#if defined(__linux__)
        ssize_t k = pwritev(f->fd, v + i, cnt - i, (off_t)off);
#else
        ssize_t k = pwrite(f->fd, v[i].iov_base, v[i].iov_len, (off_t)off);
#endif
        if (k < 0) {
            if (errno == EINTR) continue;
            return kvm_fail(KVMEM_ERR_IO, "write to '%s' failed: %s", f->tmp, strerror(errno));
        }
        size_t left = (size_t)k;
        off += left;
        while (i < cnt && left >= v[i].iov_len) left -= v[i].iov_len, i++;
        if (i < cnt) {
            if (k == 0) return kvm_fail(KVMEM_ERR_IO, "write to '%s' made no progress", f->tmp);
            v[i].iov_base = (unsigned char *)v[i].iov_base + left;
            v[i].iov_len -= left;
        }
    }
#if defined(__linux__)
    if (off > start) (void)sync_file_range(f->fd, (off_t)start, (off_t)(off - start), SYNC_FILE_RANGE_WRITE);
#endif
    return KVMEM_OK;
}

static void fw_free(file_writer *f) {
    kvm_free(f->path);
    kvm_free(f->tmp);
    kvm_free(f->dir);
    kvm_free(f->buf);
    kvm_free(f);
}

static void fw_abort(kvm_store_writer *w) {
    file_writer *f = (file_writer *)w;
    if (f->fd >= 0) close(f->fd);
    unlink(f->tmp);
    fw_free(f);
}

static kvmem_status fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return kvm_fail(KVMEM_ERR_IO, "cannot open directory '%s': %s", dir, strerror(errno));
    int r = fsync(fd);
    int e = errno;
    close(fd);
    /* some file systems cannot fsync a directory (EINVAL): nothing more to do there */
    if (r != 0 && e != EINVAL) return kvm_fail(KVMEM_ERR_IO, "fsync of directory '%s' failed: %s", dir, strerror(e));
    return KVMEM_OK;
}

static kvmem_status fw_commit(kvm_store_writer *w) {
    file_writer *f = (file_writer *)w;
    kvmem_status st = write_all(f->fd, f->buf, f->n);
    f->n = 0;
    if (st == KVMEM_OK && fsync(f->fd) != 0) st = kvm_fail(KVMEM_ERR_IO, "fsync of '%s' failed: %s", f->tmp, strerror(errno));
    if (close(f->fd) != 0 && st == KVMEM_OK) st = kvm_fail(KVMEM_ERR_IO, "close of '%s' failed: %s", f->tmp, strerror(errno));
    f->fd = -1;
    if (st == KVMEM_OK && rename(f->tmp, f->path) != 0)
        st = kvm_fail(KVMEM_ERR_IO, "rename to '%s' failed: %s", f->path, strerror(errno));
    if (st != KVMEM_OK) {
        unlink(f->tmp);
        fw_free(f);
        return st;
    }
    st = fsync_dir(f->dir);
    fw_free(f);
    return st;
}

static atomic_uint g_tmp_counter;

kvmem_status kvm_file_open_write(const char *path, kvm_store_writer **out) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base) return kvm_fail(KVMEM_ERR_INVALID_ARG, "path '%s' names a directory", path);
    /* the rename at commit replaces whatever has the name: only ever a
     * regular file (not a device node, FIFO, directory or symbolic link) */
    struct stat ls;
    if (lstat(path, &ls) == 0 && !S_ISREG(ls.st_mode))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "'%s' is %s: kvmem replaces only regular files", path, file_kind(ls.st_mode));
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    file_writer *f = kvm_calloc(1, sizeof *f);
    size_t tl = strlen(path) + 64;
    if (f) {
        f->path = kvm_strdup(path);
        f->tmp = kvm_malloc(tl);
        f->dir = kvm_malloc(dlen + 2);
        f->buf = kvm_malloc(KVM_WBUF);
    }
    if (!f || !f->path || !f->tmp || !f->dir || !f->buf) {
        if (f) fw_free(f);
        return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for a writer of '%s' and its %u-byte buffer", path, KVM_WBUF);
    }
    if (slash) {
        memcpy(f->dir, path, dlen ? dlen : 1); /* "/x" -> "/" */
        f->dir[dlen ? dlen : 1] = '\0';
    } else {
        strcpy(f->dir, ".");
    }
    snprintf(f->tmp, tl, "%.*s%s.%s.tmp.%ld.%u", (int)(slash ? dlen + 1 : 0), path, "", base, (long)getpid(),
             atomic_fetch_add(&g_tmp_counter, 1u));
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        kvmem_status st = kvm_fail(errno == ENOENT ? KVMEM_ERR_NOT_FOUND : KVMEM_ERR_IO, "cannot create '%s': %s",
                                   f->tmp, strerror(errno));
        fw_free(f);
        return st;
    }
    f->base.write = fw_write;
    f->base.commit = fw_commit;
    f->base.abort = fw_abort;
    f->base.pwritev_at = fw_pwritev;
    *out = &f->base;
    return KVMEM_OK;
}

/* ---- the directory store ---- */

typedef struct dir_store {
    char *dir;
} dir_store;

/* Directory, '/', an agent id (at most KVMEM_MAX_AGENT_ID bytes), the
 * extension: a key's path fits a buffer of this size when the directory
 * name is shorter than KVM_DIR_MAX (checked at create). */
#define KVM_DIR_MAX 4096
#define KVM_KEY_PATH (KVM_DIR_MAX + KVMEM_MAX_AGENT_ID + sizeof KVM_STORE_EXT + 2)

/* The file of `key`, into a caller buffer: no allocation, so removing a
 * stored agent can never fail for lack of memory. */
static kvmem_status key_path(const dir_store *d, const char *key, char path[KVM_KEY_PATH]) {
    if (!kvmem_agent_id_valid(key))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "store key '%.40s' is not a valid agent id", key);
    snprintf(path, KVM_KEY_PATH, "%s/%s%s", d->dir, key, KVM_STORE_EXT);
    return KVMEM_OK;
}

static void ds_free(kvm_store *s) {
    if (!s) return;
    dir_store *d = s->impl;
    kvm_free(d->dir);
    kvm_free(d);
    kvm_free(s);
}

static kvmem_status ds_open_read(kvm_store *s, const char *key, kvm_store_reader **out, uint64_t *size) {
    char p[KVM_KEY_PATH];
    kvmem_status st = key_path(s->impl, key, p);
    return st != KVMEM_OK ? st : kvm_file_open_read(p, out, size);
}

static kvmem_status ds_open_write(kvm_store *s, const char *key, kvm_store_writer **out) {
    char p[KVM_KEY_PATH];
    kvmem_status st = key_path(s->impl, key, p);
    return st != KVMEM_OK ? st : kvm_file_open_write(p, out);
}

static kvmem_status ds_exists(kvm_store *s, const char *key, int *exists) {
    char p[KVM_KEY_PATH];
    kvmem_status rc = key_path(s->impl, key, p);
    if (rc != KVMEM_OK) return rc;
    struct stat st;
    *exists = stat(p, &st) == 0 && S_ISREG(st.st_mode);
    return KVMEM_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static kvmem_status ds_list(kvm_store *s, int (*fn)(const char *, void *), void *user) {
    dir_store *d = s->impl;
    DIR *dh = opendir(d->dir);
    if (!dh) return kvm_fail(KVMEM_ERR_IO, "cannot list '%s': %s", d->dir, strerror(errno));
    char **keys = NULL;
    size_t n = 0, cap = 0;
    kvmem_status st = KVMEM_OK;
    struct dirent *e;
    size_t el = strlen(KVM_STORE_EXT);
    while ((e = readdir(dh)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l <= el || strcmp(e->d_name + l - el, KVM_STORE_EXT) != 0) continue;
        char *k = kvm_strndup(e->d_name, l - el);
        if (!k) {
            st = kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the names of '%s'", d->dir);
            break;
        }
        if (!kvmem_agent_id_valid(k)) {
            kvm_free(k);
            continue;
        }
        if (n == cap) {
            size_t nc;
            char **nk = kvm_grow_cap(cap, n + 1, 16, SIZE_MAX, sizeof *nk, &nc) ? kvm_realloc(keys, nc * sizeof *nk) : NULL;
            if (!nk) {
                kvm_free(k);
                st = kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the names of '%s'", d->dir);
                break;
            }
            keys = nk;
            cap = nc;
        }
        keys[n++] = k;
    }
    closedir(dh);
    if (st == KVMEM_OK && n) qsort(keys, n, sizeof *keys, cmp_str);
    int stop = 0;
    for (size_t i = 0; i < n; i++) {
        if (!stop && st == KVMEM_OK) stop = fn(keys[i], user);
        kvm_free(keys[i]);
    }
    kvm_free(keys);
    return st;
}

static kvmem_status ds_remove(kvm_store *s, const char *key) {
    char p[KVM_KEY_PATH];
    kvmem_status st = key_path(s->impl, key, p);
    if (st != KVMEM_OK) return st;
    if (unlink(p) != 0)
        st = errno == ENOENT ? kvm_fail(KVMEM_ERR_NOT_FOUND, "no stored agent '%s'", key)
                             : kvm_fail(KVMEM_ERR_IO, "cannot remove '%s': %s", p, strerror(errno));
    return st;
}

static const kvm_store_iface dir_iface = {
    "dir", ds_free, ds_open_read, ds_open_write, ds_exists, ds_list, ds_remove,
};

kvmem_status kvm_dir_store_create(const char *dir, kvm_store **out) {
    struct stat st;
    if (strlen(dir) >= KVM_DIR_MAX)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "store directory name of %zu bytes: at most %d", strlen(dir), KVM_DIR_MAX - 1);
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return kvm_fail(KVMEM_ERR_NOT_FOUND, "store directory '%s' does not exist", dir);
    kvm_store *s = kvm_calloc(1, sizeof *s);
    dir_store *d = kvm_calloc(1, sizeof *d);
    char *copy = kvm_strdup(dir);
    if (!s || !d || !copy) {
        kvm_free(s);
        kvm_free(d);
        kvm_free(copy);
        return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the store of '%s'", dir);
    }
    d->dir = copy;
    s->iface = &dir_iface;
    s->impl = d;
    *out = s;
    return KVMEM_OK;
}

/* ---- memory reader ---- */

static kvmem_status mr_read(kvm_store_reader *r, uint64_t off, void *buf, size_t n, size_t *got) {
    kvm_mem_reader *m = (kvm_mem_reader *)r;
    size_t k = off >= m->size ? 0 : m->size - (size_t)off < n ? m->size - (size_t)off : n;
    if (k) memcpy(buf, m->data + off, k);
    *got = k;
    return KVMEM_OK;
}

static void mr_close(kvm_store_reader *r) { (void)r; }

void kvm_mem_reader_init(kvm_mem_reader *r, const void *data, size_t size) {
    r->base.read_at = mr_read;
    r->base.readv_at = NULL;
    r->base.close = mr_close;
    r->base.loaded = NULL;
    r->data = data;
    r->size = size;
}
