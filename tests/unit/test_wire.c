/* test_wire.c - the checks of bytes a peer sends, driven directly
 * (security issue 47, item 5): the pieces of one tcp message must tile
 * it exactly; a peer's shared-memory segment must be the job user's and
 * lie, rings and all, inside its file; the control plane's mailbox takes
 * from a joiner only its address, and from anyone a bounded number of
 * messages. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/ctrl.h"
#include "transports/shm/shm_internal.h"
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

/* ------------------------------------------------- shm's segment header */

/* A segment laid out as build_segment does for 3 local peers of a job of
 * 4 ranks, 16 cells of 16 KiB, an arena of 64 KiB. */
static struct seg_hdr good_hdr(struct stat *sb)
{
    struct seg_hdr h;
    memset(&h, 0, sizeof h);
    h.nranks = 4;
    h.nslots = 3;
    h.ncells = 16;
    h.cell_bytes = 16384;
    h.slots_off = PAGE;
    h.rings_off = 2 * PAGE;
    h.ring_stride = 65 * PAGE; /* 128 + 16 * 16384, page-aligned */
    h.arena_off = h.rings_off + 3 * h.ring_stride;
    h.arena_bytes = 16 * PAGE;
    h.total = h.arena_off + h.arena_bytes;
    memset(sb, 0, sizeof *sb);
    sb->st_uid = geteuid();
    sb->st_size = (off_t)h.total;
    return h;
}

Test(shm_segment, a_good_layout_passes)
{
    struct stat sb;
    struct seg_hdr h = good_hdr(&sb);
    cr_assert_null(loomi_shm_seg_bad(&sb, geteuid(), &h, 4));
}

Test(shm_segment, a_ring_stride_that_wraps_is_refused)
{
    struct stat sb;
    struct seg_hdr h = good_hdr(&sb);
    /* rings_off + ring_stride * nslots wraps past 2^64 to a small
     * number: the old sum passed it, and the FIFO of the third slot lay
     * far outside the mapping. */
    h.ring_stride = 0x5555555555555580ull; /* a multiple of 64; 3 * it is 128 mod 2^64 */
    cr_assert_lt(h.rings_off + h.ring_stride * h.nslots, h.total, "the wrap is what is tested");
    cr_assert_not_null(loomi_shm_seg_bad(&sb, geteuid(), &h, 4));
}

Test(shm_segment, slots_offset_that_wraps_is_refused)
{
    struct stat sb;
    struct seg_hdr h = good_hdr(&sb);
    /* 32 FIFOs in a job of 64 ranks: slots_off + 4 * nslots wraps to
     * 64, and the slots would be read 2^64 - 64 bytes past the map. */
    h.nranks = 64;
    h.nslots = 32;
    h.ncells = 2;
    h.cell_bytes = 256;
    h.ring_stride = 640;
    h.slots_off = UINT64_MAX - 63;
    cr_assert_lt(h.slots_off + 4ull * h.nslots, h.rings_off, "the wrap is what is tested");
    cr_assert_not_null(loomi_shm_seg_bad(&sb, geteuid(), &h, 64));
}

Test(shm_segment, rings_past_the_end_are_refused)
{
    struct stat sb;
    struct seg_hdr h = good_hdr(&sb);
    h.rings_off = h.total; /* aligned, after the slots, but outside */
    cr_assert_not_null(loomi_shm_seg_bad(&sb, geteuid(), &h, 4));
    h = good_hdr(&sb);
    h.total = sb.st_size + PAGE; /* larger than the file */
    cr_assert_not_null(loomi_shm_seg_bad(&sb, geteuid(), &h, 4));
    h = good_hdr(&sb);
    h.arena_off = h.total; /* arena_off + arena_bytes past the end */
    cr_assert_not_null(loomi_shm_seg_bad(&sb, geteuid(), &h, 4));
}

Test(shm_segment, another_users_segment_is_refused)
{
    struct stat sb;
    struct seg_hdr h = good_hdr(&sb);
    sb.st_uid = geteuid() + 1;
    cr_assert_not_null(loomi_shm_seg_bad(&sb, geteuid(), &h, 4));
}

/* -------------------------------------------- the control plane's mailbox */

Test(ctrl_mail, a_ranks_messages_are_taken)
{
    cr_assert_null(loomi_ctrl_mail_bad(4, 2, LOOMI_CMSG_AGREE, 12, 0, 0));
    cr_assert_null(loomi_ctrl_mail_bad(4, 0, LOOMI_CMSG_ADDR, 64, 10, 640));
    cr_assert_null(loomi_ctrl_mail_bad(4, 4, LOOMI_CMSG_ADDR, 64, 0, 0), "a joiner's address");
}

Test(ctrl_mail, a_joiner_sends_only_its_address)
{
    /* A joiner's slot is past the ranks (4 + j): agree.c indexes its
     * arrays of n ranks by the sender, so a proposal from a joiner wrote
     * past them. */
    cr_assert_not_null(loomi_ctrl_mail_bad(4, 4, LOOMI_CMSG_AGREE, 12, 0, 0));
    cr_assert_not_null(loomi_ctrl_mail_bad(4, 5, LOOMI_CMSG_AGREED, 12, 0, 0));
    cr_assert_not_null(loomi_ctrl_mail_bad(4, 6, LOOMI_CMSG_CALL_PROBE, 8, 0, 0));
    cr_assert_not_null(loomi_ctrl_mail_bad(4, 4 + LOOMI_CTRL_MAX_JOINERS, LOOMI_CMSG_ADDR, 64, 0,
                                           0), "no such slot");
}

Test(ctrl_mail, unknown_types_are_refused)
{
    cr_assert_not_null(loomi_ctrl_mail_bad(4, 1, LOOMI_CMSG_ACCEPT, 0, 0, 0));
    cr_assert_not_null(loomi_ctrl_mail_bad(4, 1, LOOMI_CMSG_MAX + 1, 0, 0, 0));
    cr_assert_not_null(loomi_ctrl_mail_bad(4, 1, 15, 0, 0, 0));
}

Test(ctrl_mail, a_peer_cannot_fill_the_mailbox)
{
    unsigned held = 0;
    while (held < 100000 && !loomi_ctrl_mail_bad(4, 1, LOOMI_CMSG_CALL_SHOW, 8, held, 8ull * held))
        held++;
    cr_assert_eq(held, LOOMI_CTRL_MAIL_MAX, "refused once %u are held", LOOMI_CTRL_MAIL_MAX);
    /* In bytes: a few of the largest messages, not more. */
    uint64_t bytes = 0;
    held = 0;
    while (held < 1000 && !loomi_ctrl_mail_bad(4, 1, LOOMI_CMSG_CALL_SHOW, LOOMI_CTRL_MAX_PAYLOAD,
                                               held, bytes)) {
        held++;
        bytes += LOOMI_CTRL_MAX_PAYLOAD;
    }
    cr_assert_leq(bytes, LOOMI_CTRL_MAIL_BYTES);
    cr_assert_lt(held, 1000);
}
