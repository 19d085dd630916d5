/* The file-mapped tier of block storage (internal): an agent opened with
 * kvmem_agent_open_file keeps its AABBs, tail, token ids and text in memory
 * and its sealed blocks' KV in the agent file. Such blocks have kv == NULL
 * and map set; kvm_block_read_f32 reads the rows it is asked for with
 * pread (the store's positional reader) and decodes them exactly as it
 * decodes a block in memory, so every module that reads KV through it
 * (retrieval EXACT, gather, attention, agent_read, batch) works unchanged.
 *
 * Why pread and no mmap: a file that shrinks under a mapping raises SIGBUS
 * in whatever thread touches the lost page; a short pread is a status. Why
 * no block cache of our own: the OS page cache already keeps recently read
 * blocks, shared across processes, and reads run on the context's threads
 * in parallel; a cache here would need a lock on every read. So a mapped
 * agent's resident bytes are its AABBs and tail only.
 *
 * kvm_block_read_f32 cannot return a status (it is called inside kernels on
 * worker threads): a failed read fills its rows with zeros and records the
 * first failure in the mapping; each public call that reads blocks ends with
 * kvm_mapped_check, which turns it into a status and message on the
 * caller's thread before anything is committed. */
#ifndef KVMEM_POOL_MAPPED_H
#define KVMEM_POOL_MAPPED_H

#include "pool.h"
#include "../store/store.h"

typedef struct kvm_mapped {
    kvm_store_reader *r;      /* positional, thread-safe reads of the file */
    uint64_t data_off;        /* file offset of the data section */
    uint64_t file_size;       /* at open: the header was checked against it */
    const kvm_block *blocks;  /* the agent's blocks (a mapped agent never grows or reallocates them) */
    uint64_t ts;              /* tokens in sealed blocks */
    uint64_t *raw_begin;      /* raw dtypes: data offset of layer_{l}_{k,v}, [2 * L] (which * L + l) */
    uint64_t q_begin[3][2];   /* quantized: data offset of {k,v}_{weights,scales,biases} [part][which] */
    char *path;               /* for messages */
    _Atomic int err;          /* first failed read's status (0: none) */
    _Atomic int err_block;    /* its block */
} kvm_mapped;

/* Read rows [row0, row0 + n) of (which, l, h) of mapped block b as f32. */
void kvm_mapped_read_f32(const kvmem_pool *p, const kvm_block *b, int which, int32_t l, int32_t h, int32_t row0,
                         int32_t n, float *dst);

/* KVMEM_ERR_UNSUPPORTED naming fn when m is mapped (read-only), else OK. */
kvmem_status kvm_mapped_refuse(const kvm_agent_mem *m, const char *fn);

/* Close the file and free the mapping (NULL: no-op). */
void kvm_mapped_free(kvm_mapped *mp);

#endif
