/* test_bufpool.c - the transports' pool of early-message buffers
 * (transports/bufpool.c): reuse, best fit, and its bounds. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transports/bufpool.h"

Test(bufpool, hands_back_what_it_kept)
{
    struct loomi_bufpool pl = {0};
    size_t cap;
    char *a = loomi_bufpool_get(&pl, 1 << 20, &cap);
    cr_assert_not_null(a);
    cr_assert_eq(cap, (size_t)1 << 20);
    memset(a, 1, cap);
    loomi_bufpool_put(&pl, a, cap);
    cr_assert_eq(pl.n, 1);
    cr_assert_eq(pl.bytes, (size_t)1 << 20);
    /* A smaller request takes the kept buffer, with its whole size. */
    size_t cap2;
    char *b = loomi_bufpool_get(&pl, 1000, &cap2);
    cr_assert_eq(b, a);
    cr_assert_eq(cap2, (size_t)1 << 20);
    cr_assert_eq(pl.n, 0);
    cr_assert_eq(pl.bytes, 0);
    /* A larger one than anything kept gets a new buffer. */
    loomi_bufpool_put(&pl, b, cap2);
    char *c = loomi_bufpool_get(&pl, (2 << 20) + 1, &cap);
    cr_assert_neq(c, b);
    cr_assert_eq(cap, (size_t)(2 << 20) + 1);
    cr_assert_eq(pl.n, 1);
    loomi_bufpool_put(&pl, c, cap);
    loomi_bufpool_clear(&pl);
    cr_assert_eq(pl.n, 0);
    cr_assert_eq(pl.bytes, 0);
}

Test(bufpool, best_fit)
{
    struct loomi_bufpool pl = {0};
    size_t sizes[] = {4096, 65536, 1024, 16384}, cap;
    char *p[4];
    for (int i = 0; i < 4; i++) p[i] = loomi_bufpool_get(&pl, sizes[i], &cap);
    for (int i = 0; i < 4; i++) loomi_bufpool_put(&pl, p[i], sizes[i]);
    cr_assert_eq(loomi_bufpool_get(&pl, 5000, &cap), p[3]); /* 16K, not 64K */
    cr_assert_eq(cap, (size_t)16384);
    cr_assert_eq(loomi_bufpool_get(&pl, 1, &cap), p[2]);
    cr_assert_eq(cap, (size_t)1024);
    loomi_bufpool_put(&pl, p[3], 16384);
    loomi_bufpool_put(&pl, p[2], 1024);
    loomi_bufpool_clear(&pl);
}

Test(bufpool, bounded_by_slots_and_bytes)
{
    struct loomi_bufpool pl = {0};
    size_t cap;
    /* More buffers than slots: the smallest go, the largest stay. */
    char *held[LOOMI_BUFPOOL_SLOTS + 4];
    for (int i = 0; i < LOOMI_BUFPOOL_SLOTS + 4; i++) {
        held[i] = loomi_bufpool_get(&pl, (size_t)(i + 1) * 1000, &cap);
        cr_assert_not_null(held[i]);
    }
    for (int i = 0; i < LOOMI_BUFPOOL_SLOTS + 4; i++)
        loomi_bufpool_put(&pl, held[i], (size_t)(i + 1) * 1000);
    cr_assert_eq(pl.n, LOOMI_BUFPOOL_SLOTS);
    size_t least = SIZE_MAX, sum = 0;
    for (int i = 0; i < pl.n; i++) {
        if (pl.b[i].cap < least) least = pl.b[i].cap;
        sum += pl.b[i].cap;
    }
    cr_assert_eq(least, (size_t)5 * 1000);
    cr_assert_eq(sum, pl.bytes);
    /* A buffer smaller than every kept one is freed, not kept. */
    size_t before = pl.bytes;
    loomi_bufpool_put(&pl, malloc(10), 10);
    cr_assert_eq(pl.n, LOOMI_BUFPOOL_SLOTS);
    cr_assert_eq(pl.bytes, before);
    loomi_bufpool_clear(&pl);
    /* Never more than the byte limit: a buffer past it is freed. */
    char *big = loomi_bufpool_get(&pl, LOOMI_BUFPOOL_MAX_BYTES / 2 + 1, &cap);
    char *big2 = loomi_bufpool_get(&pl, LOOMI_BUFPOOL_MAX_BYTES / 2 + 1, &cap);
    cr_assert(big && big2);
    loomi_bufpool_put(&pl, big, cap);
    loomi_bufpool_put(&pl, big2, cap);
    cr_assert_eq(pl.n, 1);
    cr_assert_leq(pl.bytes, LOOMI_BUFPOOL_MAX_BYTES);
    loomi_bufpool_clear(&pl);
}

Test(objpool, reuses_zeroed)
{
    struct loomi_objpool op = {0};
    struct obj {
        void *next;
        char data[40];
    };
    struct obj *a = loomi_objpool_get(&op, sizeof *a), *b = loomi_objpool_get(&op, sizeof *b);
    cr_assert_not_null(a);
    cr_assert_not_null(b);
    cr_assert_neq(a, b);
    memset(a, 0x5a, sizeof *a);
    loomi_objpool_put(&op, a);
    loomi_objpool_put(&op, b);
    /* The last kept comes back first, zeroed. */
    struct obj *c = loomi_objpool_get(&op, sizeof *c);
    cr_assert_eq(c, b);
    struct obj *d = loomi_objpool_get(&op, sizeof *d);
    cr_assert_eq(d, a);
    for (size_t i = 0; i < sizeof *d; i++) cr_assert_eq(((unsigned char *)d)[i], 0);
    cr_assert_null(op.free);
    loomi_objpool_put(&op, c);
    loomi_objpool_put(&op, d);
    loomi_objpool_clear(&op);
    cr_assert_null(op.free);
}
