/* Deprecated forms kept for binaries built against an older kvmem.h (the
 * header's rule: a stable function stays within a major version). Each is
 * written over the public API alone, so nothing in the core depends on it. */
#define KVMEM_ALLOW_DEPRECATED /* defines what the header marks deprecated */
#include "kvmem.h"

#include <string.h>

/* The *_errbuf forms (replaced by kvmem_agent_last_error & co): the plain
 * call, then this thread's message copied out before anything else can run
 * on the thread. */
static kvmem_status copy_error(kvmem_status st, char *errbuf, size_t errbuf_size) {
    if (!errbuf || errbuf_size == 0) return st;
    const char *msg = st == KVMEM_OK ? "" : kvmem_last_error();
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
