/* An agent's memory to and from an agent file (internal): the one interface
 * between the pool and persistence. The format is core/format/agent_file.h
 * (it knows no pool); a store (core/store/store.h) only moves the bytes by
 * key and knows nothing of pools or agents. The include graph runs one way,
 * pool -> format and pool -> store, never back (tests/checks/include_graph.sh). */
#ifndef KVMEM_AGENT_IO_H
#define KVMEM_AGENT_IO_H

#include "pool.h"
#include "../store/store.h"

/* Write agent memory m (not changed) as a safetensors file to w, then
 * commit (or abort on failure). */
kvmem_status kvm_agent_write(kvmem_pool *p, const kvm_agent_mem *m, kvm_store_writer *w);

/* Read and validate a file of `size` bytes from r into a new agent memory
 * (*out, its bytes reserved in the pool). expect_id: the id the file must
 * carry (NULL: any). Nothing in the pool changes on failure. */
kvmem_status kvm_agent_parse(kvmem_pool *p, kvm_store_reader *r, uint64_t size, const char *expect_id,
                             kvm_agent_mem **out);

/* The same as a mapped agent (core/pool/mapped.h): the header, metadata,
 * AABBs and tail are read and checked as by kvm_agent_parse, the KV blocks
 * stay in the file; verify: also check the data checksum (one streaming pass
 * over the file, nothing kept). Format version 2 only. On success the new
 * memory owns r (closed when it is freed) and carries the file's agent id;
 * on failure the caller still owns r. Its resident bytes (AABBs, tail) are
 * in m->bytes, not yet reserved (kvm_pool_adopt does). path: for messages. */
kvmem_status kvm_agent_parse_mapped(kvmem_pool *p, kvm_store_reader *r, uint64_t size, const char *path, int verify,
                                    kvm_agent_mem **out);

/* The pool's store tier (persist.c), used under the pool's mutex: write m
 * to the store under its id / replace m with what the store holds. */
kvmem_status kvm_store_save_mem(kvmem_pool *p, kvm_agent_mem *m);
kvmem_status kvm_store_load_mem(kvmem_pool *p, kvm_agent_mem *m);

#endif
