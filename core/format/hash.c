/* XXH64, from the published specification. */
#include "hash.h"

#include <string.h>

#define P1 11400714785074694791ull
#define P2 14029467366897019727ull
#define P3 1609587929392839161ull
#define P4 9650029242287828579ull
#define P5 2870177450012600261ull

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}
static inline uint32_t rd32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}
static inline uint64_t round1(uint64_t acc, uint64_t in) { return rotl(acc + in * P2, 31) * P1; }
static inline uint64_t merge(uint64_t acc, uint64_t v) { return (acc ^ round1(0, v)) * P1 + P4; }

void kvm_xxh64_init(kvm_xxh64_state *h, uint64_t seed) {
    memset(h, 0, sizeof *h);
    h->seed = seed;
    h->v[0] = seed + P1 + P2;
    h->v[1] = seed + P2;
    h->v[2] = seed;
    h->v[3] = seed - P1;
}

static void xxh_stripes(kvm_xxh64_state *h, const unsigned char *p, size_t n_stripes) {
    uint64_t a = h->v[0], b = h->v[1], c = h->v[2], d = h->v[3];
    for (size_t i = 0; i < n_stripes; i++, p += 32) {
        a = round1(a, rd64(p));
        b = round1(b, rd64(p + 8));
        c = round1(c, rd64(p + 16));
        d = round1(d, rd64(p + 24));
    }
    h->v[0] = a, h->v[1] = b, h->v[2] = c, h->v[3] = d;
}

void kvm_xxh64_update(kvm_xxh64_state *h, const void *data, size_t n) {
    const unsigned char *p = data;
    h->total += n;
    if (h->buf_n) {
        size_t take = 32 - h->buf_n < n ? 32 - h->buf_n : n;
        memcpy(h->buf + h->buf_n, p, take);
        h->buf_n += take;
        p += take;
        n -= take;
        if (h->buf_n < 32) return;
        xxh_stripes(h, h->buf, 1);
        h->buf_n = 0;
    }
    xxh_stripes(h, p, n / 32);
    p += n / 32 * 32;
    n %= 32;
    memcpy(h->buf, p, n);
    h->buf_n = n;
}

uint64_t kvm_xxh64_final(const kvm_xxh64_state *h) {
    uint64_t acc;
    if (h->total >= 32) {
        acc = rotl(h->v[0], 1) + rotl(h->v[1], 7) + rotl(h->v[2], 12) + rotl(h->v[3], 18);
        for (int i = 0; i < 4; i++) acc = merge(acc, h->v[i]);
    } else {
        acc = h->seed + P5;
    }
    acc += h->total;
    const unsigned char *p = h->buf;
    size_t n = h->buf_n;
    for (; n >= 8; n -= 8, p += 8) acc = rotl(acc ^ round1(0, rd64(p)), 27) * P1 + P4;
    if (n >= 4) {
        acc = rotl(acc ^ ((uint64_t)rd32(p) * P1), 23) * P2 + P3;
        p += 4;
        n -= 4;
    }
    for (; n > 0; n--, p++) acc = rotl(acc ^ ((uint64_t)*p * P5), 11) * P1;
    acc ^= acc >> 33;
    acc *= P2;
    acc ^= acc >> 29;
    acc *= P3;
    acc ^= acc >> 32;
    return acc;
}

uint64_t kvm_xxh64_once(const void *data, size_t n, uint64_t seed) {
    kvm_xxh64_state h;
    kvm_xxh64_init(&h, seed);
    kvm_xxh64_update(&h, data, n);
    return kvm_xxh64_final(&h);
}

/* ---- acc64 ---- */

const uint64_t kvm_acc64_keys[8] = {0x9E3779B185EBCA87ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull,
                                    0x85EBCA77C2B2AE63ull, 0x27D4EB2F165667C5ull, 0x94D049BB133111EBull,
                                    0xBF58476D1CE4E5B9ull, 0xD6E8FEB86659FD93ull};

static void acc64_stripes_scalar(uint64_t acc[8], const unsigned char *p, size_t n_stripes) {
    for (size_t s = 0; s < n_stripes; s++, p += 64)
        for (int i = 0; i < 8; i++) {
            uint64_t d = rd64(p + 8 * i), v = d ^ kvm_acc64_keys[i];
            acc[i ^ 1] += d;
            acc[i] += (v & 0xffffffffull) * (v >> 32);
        }
}

void kvm_acc64_init(kvm_acc64_state *s, uint64_t total, kvm_acc64_fn stripes) {
    for (int i = 0; i < 8; i++) s->acc[i] = kvm_acc64_keys[i] ^ total;
    s->n = total;
    s->buf_n = 0;
    s->stripes = stripes ? stripes : acc64_stripes_scalar;
}

void kvm_acc64_update(kvm_acc64_state *s, const void *data, size_t n) {
    const unsigned char *p = data;
    if (s->buf_n) {
        size_t take = 64 - s->buf_n < n ? 64 - s->buf_n : n;
        memcpy(s->buf + s->buf_n, p, take);
        s->buf_n += take;
        p += take;
        n -= take;
        if (s->buf_n < 64) return;
        acc64_stripes_scalar(s->acc, s->buf, 1);
        s->buf_n = 0;
    }
    if (n >= 64) s->stripes(s->acc, p, n / 64);
    p += n / 64 * 64;
    n %= 64;
    memcpy(s->buf, p, n);
    s->buf_n = n;
}

uint64_t kvm_acc64_final(kvm_acc64_state *s) {
    if (s->buf_n) { /* the last partial stripe, zero-padded */
        memset(s->buf + s->buf_n, 0, 64 - s->buf_n);
        acc64_stripes_scalar(s->acc, s->buf, 1);
        s->buf_n = 0;
    }
    uint64_t h = s->n * P1;
    for (int i = 0; i < 8; i++) {
        h ^= rotl(s->acc[i] * P2, 31) * P1;
        h = rotl(h, 27) * P1 + P4;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

uint64_t kvm_acc64_with(kvm_acc64_fn stripes, const void *data, size_t n) {
    kvm_acc64_state s;
    kvm_acc64_init(&s, n, stripes);
    kvm_acc64_update(&s, data, n);
    return kvm_acc64_final(&s);
}

uint64_t kvm_acc64(const void *data, size_t n) { return kvm_acc64_with(NULL, data, n); }
