/* Agent files (safetensors) and the pool's store tier (internal). */
#ifndef KVMEM_PERSIST_H
#define KVMEM_PERSIST_H

#include "../pool/pool.h"
#include "store.h"

#define KVM_FORMAT_VERSION 2 /* 2: quantized blocks part by part, AABBs in one tensor (f16); 1 is still read */
#define KVM_MAX_HEADER ((uint64_t)64 << 20) /* refuse larger JSON headers */

/* Write agent memory m (not changed) as a safetensors file to w, then
 * commit (or abort on failure). */
kvmem_status kvm_agent_write(kvmem_pool *p, const kvm_agent_mem *m, kvm_store_writer *w);

/* Read and validate a file of `size` bytes from r into a new agent memory
 * (*out, its bytes reserved in the pool). expect_id: the id the file must
 * carry (NULL: any). Nothing in the pool changes on failure. */
kvmem_status kvm_agent_parse(kvmem_pool *p, kvm_store_reader *r, uint64_t size, const char *expect_id,
                             kvm_agent_mem **out);

/* Store tier, used by the pool under its mutex. */
kvmem_status kvm_store_save_mem(kvmem_pool *p, kvm_agent_mem *m);
kvmem_status kvm_store_load_mem(kvmem_pool *p, kvm_agent_mem *m);

#endif
