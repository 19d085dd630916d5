/* libFuzzer harness over kvmem's one strict safetensors reader, its JSON
 * reader and the agent-file loader built on them: any input must be
 * accepted or refused with FORMAT/CORRUPT/MISMATCH/CAPACITY, never crash,
 * leak or read out of bounds (ASan + UBSan), and what the reader accepts
 * must hold the properties it promises. */
#include "fuzz_common.h"
#include "pool/pool.h"
#include "format/json.h"
#include "format/safetensors.h"
#include "pool/agent_io.h"

#include <stdlib.h>
#include <string.h>

static kvmem_context *g_ctx;
static kvmem_pool *g_pools[3];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_ctx) {
        kvmem_context_params cp = kvmem_context_default_params();
        cp.n_threads = 1;
        if (kvmem_context_create(&cp, &g_ctx) != KVMEM_OK) abort();
        kvmem_model_spec spec = kvm_fuzz_spec();
        for (int i = 0; i < 3; i++) {
            kvmem_pool_params pp = kvm_fuzz_params(i);
            if (kvmem_pool_create(g_ctx, &spec, &pp, &g_pools[i]) != KVMEM_OK) abort();
        }
    }
    if (size < 1) return 0;
    int target = data[0] % 5;
    if (target == 4) {
        /* the reader alone, every dtype, names quoted */
        kvm_st_rules rules = kvm_st_default_rules();
        rules.quote = data[0] & 8 ? 1 : 0;
        kvm_st_header h;
        size_t off = 0;
        kvmem_status st = kvm_st_read(data + 1, size - 1, (uint64_t)1 << 20, &rules, &h, &off);
        if (st == KVMEM_OK) {
            /* accepted: the tensors tile the data section exactly, each
             * sized by its shape and aligned */
            uint64_t total = 0;
            for (int32_t i = 0; i < h.n_tensors; i++) {
                const kvm_st_tensor *t = &h.tensors[i];
                uint64_t es = kvm_st_dtype_size(t->dtype), ne = 1;
                for (int32_t k = 0; k < t->ndim; k++) ne *= t->shape[k];
                if (t->end > h.data_size || t->end - t->begin != ne * es || (ne && t->begin % es) ||
                    memchr(t->name, 0, t->name_len) || kvm_st_find(&h, t->name) != t)
                    abort();
                total += t->end - t->begin;
            }
            if (total != h.data_size || off + h.data_size != size - 1) abort();
        } else if (st != KVMEM_ERR_FORMAT && st != KVMEM_ERR_CORRUPT) {
            abort();
        }
        kvm_st_header_free(&h);
        return 0;
    }
    if (target == 0) {
        kvm_json_doc doc;
        char err[256];
        if (kvm_json_parse((const char *)data + 1, size - 1, &doc, err, sizeof err) == 0) {
            /* walk it: every node must be consistent */
            for (int32_t i = 0; i < doc.n_nodes; i++)
                if (doc.nodes[i].first >= doc.n_nodes || doc.nodes[i].next >= doc.n_nodes) abort();
            kvm_json_free(&doc);
        }
        return 0;
    }
    kvmem_pool *p = g_pools[target - 1];
    kvm_mem_reader r;
    kvm_mem_reader_init(&r, data + 1, size - 1);
    kvm_agent_mem *m = NULL;
    kvmem_status st = kvm_agent_parse(p, &r.base, size - 1, NULL, &m);
    if (st == KVMEM_OK) {
        /* an accepted file must be fully readable */
        float row[80];
        for (int32_t b = 0; b < m->n_sealed; b++)
            for (int which = 0; which < 2; which++)
                for (int32_t l = 0; l < 2; l++) kvm_block_read_f32(p, &m->blocks[b], which, l, 0, 0, m->blocks[b].n_tokens > 0 ? 1 : 0, row);
        kvm_pool_unreserve(p, m->bytes);
        kvm_agent_mem_clear(m);
        free(m);
    } else if (st != KVMEM_ERR_FORMAT && st != KVMEM_ERR_CORRUPT && st != KVMEM_ERR_MISMATCH && st != KVMEM_ERR_CAPACITY) {
        abort(); /* any other code means the loader lost track */
    }
    kvmem_pool_info info;
    kvmem_pool_get_info(p, &info);
    if (info.used_bytes != 0) abort(); /* nothing stays reserved */
    return 0;
}
