/* test_hash.c - XXH64 (src/core/hash.c) against published test vectors. */
#include <criterion/criterion.h>
#include <string.h>

#include "core/internal.h"

Test(hash, published_vectors)
{
    cr_assert_eq(loomi_hash64("", 0, 0), UINT64_C(0xef46db3751d8e999));
    cr_assert_eq(loomi_hash64("a", 1, 0), UINT64_C(0xd24ec4f1a98c6e5b));
    cr_assert_eq(loomi_hash64("abc", 3, 0), UINT64_C(0x44bc2cf5ad770999));
    const char *s = "Nobody inspects the spammish repetition"; /* 39 bytes: stripes + tail */
    cr_assert_eq(loomi_hash64(s, strlen(s), 0), UINT64_C(0xfbcea83c8a378bf1));
}

Test(hash, alignment_and_sensitivity)
{
    unsigned char buf[300], copy[301];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 7 + 3);
    for (size_t len = 0; len <= 200; len++) {
        memcpy(copy + 1, buf, len); /* misaligned by one */
        uint64_t h = loomi_hash64(buf, len, 0);
        cr_assert_eq(h, loomi_hash64(copy + 1, len, 0), "length %zu", len);
        if (len) {
            copy[1 + len / 2] ^= 1; /* one bit anywhere changes it */
            cr_assert_neq(h, loomi_hash64(copy + 1, len, 0), "length %zu", len);
        }
    }
}
