/*
 * tcp.h - what the TCP transport shows outside itself besides its ops
 * table: the check of the pieces of one message (tcp_data.c), pure (no
 * socket), so that unit tests and fuzzers drive it.
 */
#ifndef LOOMI_TCP_H
#define LOOMI_TCP_H

#include <stdint.h>

/* The byte ranges of one message claimed so far by the pieces whose
 * header has arrived.  Pieces must tile the message exactly: a piece
 * that passes the end or overlaps a range already claimed is refused,
 * so the bytes claimed never pass the message's length, and the message
 * is whole (its transfer completes, its memory may go) only when every
 * piece claimed is in: no stream is then still writing into it.  The
 * ranges are kept merged; a peer that leaves more than LOOMI_TCP_TILES
 * holes is refused too (a sender that follows the protocol cuts a
 * message into at most 16 pieces below 16 GiB and sends them in order). */
#define LOOMI_TCP_TILES 16
struct loomi_tcp_tiling {
    uint64_t claimed; /* bytes claimed */
    int n;            /* ranges in r, sorted, disjoint, not adjacent */
    struct {
        uint64_t off, end;
    } r[LOOMI_TCP_TILES];
};

enum {
    LOOMI_TCP_TILE_OK = 0,
    LOOMI_TCP_TILE_BOUNDS = 1,  /* off + len passes total */
    LOOMI_TCP_TILE_OVERLAP = 2, /* overlaps bytes already claimed (or the message is whole) */
    LOOMI_TCP_TILE_HOLES = 3,   /* too many separate ranges */
};

/* Claims [off, off + len) of a message of `total` bytes; on any result
 * but LOOMI_TCP_TILE_OK, t is left as it was.  A piece of no bytes is
 * refused once the message is whole, so a message of 0 bytes takes one. */
int loomi_tcp_tile_claim(struct loomi_tcp_tiling *t, uint64_t total, uint64_t off, uint64_t len);

#endif
