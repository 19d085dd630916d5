/* XXH64 (Yann Collet's algorithm, written here from its specification):
 * the checksum of a file's data section. Streaming, so the loader hashes
 * each chunk while it is still in cache. */
#ifndef KVMEM_HASH_H
#define KVMEM_HASH_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvm_xxh64_state {
    uint64_t v[4];
    uint64_t total;
    unsigned char buf[32];
    size_t buf_n;
    uint64_t seed;
} kvm_xxh64_state;

void kvm_xxh64_init(kvm_xxh64_state *h, uint64_t seed);
void kvm_xxh64_update(kvm_xxh64_state *h, const void *data, size_t n);
uint64_t kvm_xxh64_final(const kvm_xxh64_state *h);
uint64_t kvm_xxh64_once(const void *data, size_t n, uint64_t seed);

#endif
