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

/* kvmem's chunk checksum "acc64": eight 64-bit lanes accumulate each 64-byte
 * stripe (lane i: acc[i] += lo32(d ^ K[i]) * hi32(d ^ K[i]), acc[i ^ 1] += d,
 * the XXH3 accumulation step), the last partial stripe zero-padded, then the
 * lanes are folded and avalanched (see hash.c). Made to run at memory speed
 * with SIMD (any change of one 64-bit word changes acc[i ^ 1] by a nonzero
 * amount, so it is always detected); files store XXH64 over the chunks'
 * acc64 digests. */
uint64_t kvm_acc64(const void *data, size_t n); /* scalar kernel */

/* Lane update over n_stripes 64-byte stripes: the SIMD kernels are the CPU
 * kernel table's (cpu/kernels.h, acc64_stripes). */
typedef void (*kvm_acc64_fn)(uint64_t acc[8], const unsigned char *p, size_t n_stripes);
extern const uint64_t kvm_acc64_keys[8];

/* Streaming form; the total length is part of the initial state. stripes:
 * the kernel table's acc64_stripes, passed in (this format module stays
 * below the CPU backend in the include graph); NULL: the scalar reference.
 * Every kernel gives the same digest. */
typedef struct kvm_acc64_state {
    uint64_t acc[8];
    uint64_t n;
    unsigned char buf[64];
    size_t buf_n;
    kvm_acc64_fn stripes;
} kvm_acc64_state;
void kvm_acc64_init(kvm_acc64_state *s, uint64_t total, kvm_acc64_fn stripes);
void kvm_acc64_update(kvm_acc64_state *s, const void *data, size_t n);
uint64_t kvm_acc64_final(kvm_acc64_state *s);
/* One call; stripes as for kvm_acc64_init. */
uint64_t kvm_acc64_with(kvm_acc64_fn stripes, const void *data, size_t n);

#endif
