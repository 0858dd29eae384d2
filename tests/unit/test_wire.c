/* test_wire.c - the checks of bytes a peer sends, driven directly
 * (security issue 47, item 5): the pieces of one tcp message must tile
 * it exactly. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "transports/tcp/tcp.h"

/* ------------------------------------------------------- tcp's pieces */

Test(tcp_tiling, pieces_in_any_order_tile_the_message)
{
    struct loomi_tcp_tiling t;
    memset(&t, 0, sizeof t);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, 50, 25), LOOMI_TCP_TILE_OK);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, 0, 25), LOOMI_TCP_TILE_OK);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, 75, 25), LOOMI_TCP_TILE_OK);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, 25, 25), LOOMI_TCP_TILE_OK);
    cr_assert_eq(t.claimed, 100);
    cr_assert_eq(t.n, 1, "adjacent ranges are merged");
}

Test(tcp_tiling, a_duplicated_piece_is_refused)
{
    struct loomi_tcp_tiling t;
    memset(&t, 0, sizeof t);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, 0, 50), LOOMI_TCP_TILE_OK);
    /* The same piece again: with the byte count alone it would complete
     * the message with half of it never written. */
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, 0, 50), LOOMI_TCP_TILE_OVERLAP);
    cr_assert_eq(t.claimed, 50, "a refused piece claims nothing");
}

Test(tcp_tiling, an_overlapping_piece_is_refused)
{
    struct loomi_tcp_tiling t;
    memset(&t, 0, sizeof t);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, 20, 30), LOOMI_TCP_TILE_OK);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, 0, 21), LOOMI_TCP_TILE_OVERLAP);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, 49, 10), LOOMI_TCP_TILE_OVERLAP);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, 10, 60), LOOMI_TCP_TILE_OVERLAP);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, 0, 20), LOOMI_TCP_TILE_OK);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, 50, 50), LOOMI_TCP_TILE_OK);
}

Test(tcp_tiling, no_piece_once_the_message_is_whole)
{
    struct loomi_tcp_tiling t;
    memset(&t, 0, sizeof t);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, 0, 100), LOOMI_TCP_TILE_OK);
    /* The transfer may be complete and its memory gone. */
    cr_assert_neq(loomi_tcp_tile_claim(&t, 100, 0, 1), LOOMI_TCP_TILE_OK);
    cr_assert_neq(loomi_tcp_tile_claim(&t, 100, 100, 0), LOOMI_TCP_TILE_OK);
    memset(&t, 0, sizeof t);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 0, 0, 0), LOOMI_TCP_TILE_OK);
    cr_assert_neq(loomi_tcp_tile_claim(&t, 0, 0, 0), LOOMI_TCP_TILE_OK,
                  "a message of 0 bytes takes one piece");
}

Test(tcp_tiling, bounds_without_wrapping)
{
    struct loomi_tcp_tiling t;
    memset(&t, 0, sizeof t);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, 90, 11), LOOMI_TCP_TILE_BOUNDS);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, UINT64_MAX - 5, 10), LOOMI_TCP_TILE_BOUNDS);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 100, 10, 0), LOOMI_TCP_TILE_BOUNDS,
                 "no piece of 0 bytes in a message of some");
    cr_assert_eq(t.claimed, 0);
}

Test(tcp_tiling, too_many_holes_are_refused)
{
    struct loomi_tcp_tiling t;
    memset(&t, 0, sizeof t);
    for (int i = 0; i < LOOMI_TCP_TILES; i++)
        cr_assert_eq(loomi_tcp_tile_claim(&t, 1000, (uint64_t)i * 10, 5), LOOMI_TCP_TILE_OK);
    cr_assert_eq(loomi_tcp_tile_claim(&t, 1000, 500, 5), LOOMI_TCP_TILE_HOLES);
    /* Filling a hole still works. */
    cr_assert_eq(loomi_tcp_tile_claim(&t, 1000, 5, 5), LOOMI_TCP_TILE_OK);
    cr_assert_eq(t.n, LOOMI_TCP_TILES - 1);
}
