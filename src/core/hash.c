/*
 * hash.c - XXH64 (Yann Collet's xxHash, 64-bit variant, seed 0), written
 * from its published specification: fast enough that hashing the shared
 * state costs far less than sending it.
 */
#include <string.h>

#include "core/internal.h"

#define P1 UINT64_C(11400714785074694791)
#define P2 UINT64_C(14029467366897019727)
#define P3 UINT64_C(1609587929392839161)
#define P4 UINT64_C(9650029242287828579)
#define P5 UINT64_C(2870177450012600261)

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* Little-endian reads, whatever the alignment. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define HASH_LE(bits, v) __builtin_bswap##bits(v)
#else
#define HASH_LE(bits, v) (v)
#endif

#define HASH_RD(bits)                                                          \
    static inline uint##bits##_t rd##bits(const unsigned char *p)              \
    {                                                                          \
        uint##bits##_t v;                                                      \
        memcpy(&v, p, bits / 8);                                               \
        return HASH_LE(bits, v);                                               \
    }
HASH_RD(64)
HASH_RD(32)

static inline uint64_t round64(uint64_t acc, uint64_t in)
{
    acc += in * P2;
    acc = rotl(acc, 31);
    return acc * P1;
}

static inline uint64_t merge(uint64_t acc, uint64_t v)
{
    acc ^= round64(0, v);
    return acc * P1 + P4;
}

uint64_t loomi_hash64(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = data, *end = p + len;
    uint64_t h;
    if (len >= 32) {
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        const unsigned char *limit = end - 32;
        do {
            v1 = round64(v1, rd64(p));
            v2 = round64(v2, rd64(p + 8));
            v3 = round64(v3, rd64(p + 16));
            v4 = round64(v4, rd64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
        h = merge(h, v1);
        h = merge(h, v2);
        h = merge(h, v3);
        h = merge(h, v4);
    } else {
        h = seed + P5;
    }
    h += (uint64_t)len;
    while (end - p >= 8) {
        h ^= round64(0, rd64(p));
        h = rotl(h, 27) * P1 + P4;
        p += 8;
    }
    if (end - p >= 4) {
        h ^= (uint64_t)rd32(p) * P1;
        h = rotl(h, 23) * P2 + P3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p++) * P5;
        h = rotl(h, 11) * P1;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}
