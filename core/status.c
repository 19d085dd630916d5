/* Version, status names, the thread-local last-error message and logging. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int32_t kvmem_version_number(void) { return KVMEM_VERSION_NUMBER; }
const char *kvmem_version(void) { return KVMEM_VERSION_STRING; }

const char *kvmem_status_str(kvmem_status s) {
    switch (s) {
    case KVMEM_OK: return "KVMEM_OK";
    case KVMEM_ERR_INVALID_ARG: return "KVMEM_ERR_INVALID_ARG";
    case KVMEM_ERR_NOMEM: return "KVMEM_ERR_NOMEM";
    case KVMEM_ERR_CAPACITY: return "KVMEM_ERR_CAPACITY";
    case KVMEM_ERR_NOT_FOUND: return "KVMEM_ERR_NOT_FOUND";
    case KVMEM_ERR_EXISTS: return "KVMEM_ERR_EXISTS";
    case KVMEM_ERR_CLOSED: return "KVMEM_ERR_CLOSED";
    case KVMEM_ERR_UNSUPPORTED: return "KVMEM_ERR_UNSUPPORTED";
    case KVMEM_ERR_BACKEND: return "KVMEM_ERR_BACKEND";
    case KVMEM_ERR_IO: return "KVMEM_ERR_IO";
    case KVMEM_ERR_FORMAT: return "KVMEM_ERR_FORMAT";
    case KVMEM_ERR_CORRUPT: return "KVMEM_ERR_CORRUPT";
    case KVMEM_ERR_MISMATCH: return "KVMEM_ERR_MISMATCH";
    case KVMEM_ERR_CONFLICT: return "KVMEM_ERR_CONFLICT";
    case KVMEM_ERR_INTERNAL: return "KVMEM_ERR_INTERNAL";
    case KVMEM_ERR_BUSY: return "KVMEM_ERR_BUSY";
    }
    return "KVMEM_ERR_UNKNOWN";
}

/* One buffer per thread: messages never cross threads and need no lock.
 * tls_slot: the slot of the object the thread's call runs on (kvm_err_begin). */
static _Thread_local char tls_error[512];
static _Thread_local kvm_errslot *tls_slot;

const char *kvmem_last_error(void) { return tls_error; }

void kvm_clear_error(void) { tls_error[0] = '\0'; }

static void slot_lock(kvm_errslot *s) {
    while (atomic_exchange_explicit(&s->lock, 1, memory_order_acquire)) {
    }
}
static void slot_unlock(kvm_errslot *s) { atomic_store_explicit(&s->lock, 0, memory_order_release); }

kvmem_status kvm_fail(kvmem_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_error, sizeof tls_error, fmt, ap);
    va_end(ap);
    kvm_errslot *s = tls_slot;
    if (s) {
        slot_lock(s);
        memcpy(s->msg, tls_error, sizeof s->msg);
        slot_unlock(s);
    }
    kvm_log(KVMEM_LOG_DEBUG, "%s: %s", kvmem_status_str(status), tls_error);
    return status;
}

void kvm_errslot_init(kvm_errslot *s) {
    atomic_init(&s->lock, 0);
    s->msg[0] = '\0';
}

int kvm_err_begin(kvm_errslot *s) {
    if (tls_slot) return 0;
    tls_slot = s;
    return 1;
}

void kvm_err_end(int token) {
    if (token) tls_slot = NULL;
}

size_t kvm_errslot_copy(kvm_errslot *s, char *buf, size_t size) {
    if (!s) {
        if (buf && size) buf[0] = '\0';
        return 0;
    }
    slot_lock(s);
    size_t n = strnlen(s->msg, sizeof s->msg);
    if (buf && size) {
        size_t k = n < size - 1 ? n : size - 1;
        memcpy(buf, s->msg, k);
        buf[k] = '\0';
    }
    slot_unlock(s);
    return n;
}

/* The callback and its user data change together; a reader must never see
 * one without the other, so both sit behind one lock-free pointer swap. */
typedef struct log_sink {
    kvmem_log_callback cb;
    void *user;
} log_sink;

static log_sink g_sinks[2];
static _Atomic(log_sink *) g_sink = NULL;
static _Atomic int g_sink_slot = 0;

void kvmem_log_set(kvmem_log_callback cb, void *user_data) {
    if (!cb) {
        g_sink = NULL;
        return;
    }
    /* Alternate between two slots so a concurrent reader of the old slot is
     * not overwritten by this very call. Callers set the logger at start-up;
     * setting it from many threads at once is documented as unsupported. */
    int slot = 1 - g_sink_slot;
    g_sinks[slot].cb = cb;
    g_sinks[slot].user = user_data;
    g_sink_slot = slot;
    g_sink = &g_sinks[slot];
}

void kvm_log(kvmem_log_level level, const char *fmt, ...) {
    log_sink *s = g_sink;
    if (!s) return;
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    s->cb(level, buf, s->user);
}

void kvmem_free(void *ptr) { kvm_free(ptr); }

size_t kvm_dtype_size(kvmem_dtype dt) {
    switch (dt) {
    case KVMEM_F32: return 4;
    case KVMEM_F16:
    case KVMEM_BF16: return 2;
    default: return 0;
    }
}

const char *kvmem_dtype_name(kvmem_dtype dt) {
    switch (dt) {
    case KVMEM_F32: return "f32";
    case KVMEM_F16: return "f16";
    case KVMEM_BF16: return "bf16";
    case KVMEM_Q8: return "q8";
    case KVMEM_Q4: return "q4";
    case KVMEM_Q4_KIVI: return "q4_kivi";
    }
    return "?";
}
