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

/* One buffer per thread: messages never cross threads and need no lock. */
static _Thread_local char tls_error[512];

const char *kvmem_last_error(void) { return tls_error; }

void kvm_clear_error(void) { tls_error[0] = '\0'; }

kvmem_status kvm_fail(kvmem_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_error, sizeof tls_error, fmt, ap);
    va_end(ap);
    kvm_log(KVMEM_LOG_DEBUG, "%s: %s", kvmem_status_str(status), tls_error);
    return status;
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

/* The *_errbuf forms: the plain call, then this thread's message copied out
 * before anything else can run on the thread (see kvmem.h). */
static kvmem_status copy_error(kvmem_status st, char *errbuf, size_t errbuf_size) {
    if (!errbuf || errbuf_size == 0) return st;
    const char *msg = st == KVMEM_OK ? "" : tls_error;
    size_t n = strlen(msg);
    if (n > errbuf_size - 1) n = errbuf_size - 1;
    memcpy(errbuf, msg, n);
    errbuf[n] = '\0';
    return st;
}

kvmem_status kvmem_pool_sync_errbuf(kvmem_pool *pool, char *errbuf, size_t errbuf_size) {
    return copy_error(kvmem_pool_sync(pool), errbuf, errbuf_size);
}

kvmem_status kvmem_agent_append_errbuf(kvmem_agent *agent, const kvmem_tensor *k, const kvmem_tensor *v,
                                       const kvmem_append_params *params, char *errbuf, size_t errbuf_size) {
    return copy_error(kvmem_agent_append(agent, k, v, params), errbuf, errbuf_size);
}

kvmem_status kvmem_agent_read_errbuf(kvmem_agent *agent, int64_t first_token, int64_t n_tokens,
                                     const kvmem_tensor *k_out, const kvmem_tensor *v_out, char *errbuf,
                                     size_t errbuf_size) {
    return copy_error(kvmem_agent_read(agent, first_token, n_tokens, k_out, v_out), errbuf, errbuf_size);
}

kvmem_status kvmem_agent_save_errbuf(kvmem_agent *agent, const char *path, char *errbuf, size_t errbuf_size) {
    return copy_error(kvmem_agent_save(agent, path), errbuf, errbuf_size);
}

kvmem_status kvmem_agent_load_errbuf(kvmem_agent *agent, const char *path, char *errbuf, size_t errbuf_size) {
    return copy_error(kvmem_agent_load(agent, path), errbuf, errbuf_size);
}

kvmem_status kvmem_retrieve_errbuf(kvmem_agent *agent, const kvmem_tensor *query,
                                   const kvmem_retrieve_params *params, kvmem_retrieval *result, char *errbuf,
                                   size_t errbuf_size) {
    return copy_error(kvmem_retrieve(agent, query, params, result), errbuf, errbuf_size);
}

kvmem_status kvmem_gather_errbuf(kvmem_agent *agent, const int32_t *blocks, int32_t n_blocks,
                                 int64_t base_position, const kvmem_tensor *k_out, const kvmem_tensor *v_out,
                                 char *errbuf, size_t errbuf_size) {
    return copy_error(kvmem_gather(agent, blocks, n_blocks, base_position, k_out, v_out), errbuf, errbuf_size);
}

kvmem_status kvmem_attend_errbuf(kvmem_context *ctx, const kvmem_tensor *q, const kvmem_attend_source *source,
                                 const kvmem_attend_params *params, const kvmem_tensor *out,
                                 kvmem_attend_stats *stats, char *errbuf, size_t errbuf_size) {
    return copy_error(kvmem_attend(ctx, q, source, params, out, stats), errbuf, errbuf_size);
}
