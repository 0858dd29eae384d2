/*
 * tcp_internal.h - shared by the TCP transport's files only: its limits,
 * wire formats and state (struct tcp, struct peer, struct stream), and
 * what one of its files calls in another.  tcp.c says how the transport
 * works; tcp_data.c holds the data path.
 */
#ifndef LOOMI_TCP_INTERNAL_H
#define LOOMI_TCP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "core/internal.h"
#include "transports/match.h"
#include "transports/net.h"
#include "transports/seal.h"
#include "transports/tcp/tcp.h"
#include "transports/transport.h"

#define TCP_MAGIC 0x4c4d5450u      /* "LMTP" */
#define HELLO_MAGIC 0x4c4d4848u    /* "LMHH" */
#define MAX_MSG (1ull << 40)       /* larger than any buffer a rank can hold */
#define SPLIT_MIN (64u * 1024u)    /* below this a message is one piece */
#define UNEXP_LIMIT (2ull << 30)   /* bytes buffered for receives not yet posted */
#define IOV_BATCH 64
/* Sealed: a header record, and how many bytes are sealed ahead of the
 * socket (at least a header and a full payload record). */
#define HREC (sizeof(struct wire_hdr) + LOOMI_SEAL_TAG)
#define EBUF_BYTES (4 * ((size_t)LOOMI_SEAL_MAX + LOOMI_SEAL_TAG))

enum { T_DATA = 1, T_ABORT = 2, T_BYE = 3 };

struct wire_hdr {
    uint32_t magic;
    uint16_t type;
    uint16_t flags;
    uint64_t tag;    /* DATA: message tag; ABORT: result code */
    uint64_t total;  /* DATA: message length */
    uint64_t offset; /* DATA: where this piece goes */
    uint32_t len;    /* DATA: piece length */
    int32_t aux;     /* ABORT: the failed rank; DATA: the call's check (transport.h) */
};

struct hello {
    uint32_t magic;
    int32_t src, dst, stream, nstreams;
};
_Static_assert(offsetof(struct hello, dst) == offsetof(struct loomi_greeting, dst),
               "a greeting begins as net.h's (struct loomi_greeting)");

struct piece {
    struct loomi_xfer *x; /* NULL: control message */
    struct wire_hdr h;
    size_t hdr_sent, sent;
    /* The payload's byte k (k >= data_off) is data[k - data_off]: the
     * transfer's buffer, or `own` (data_off: what was sent by then) once
     * the transfer was cancelled with the piece half on the wire. */
    const char *data;
    size_t data_off;
    char *own;
    struct piece *next;
};

#define UNEXP_PIECES 16
struct unexp {
    struct loomi_unexp m; /* tag, check, length, bytes in, buffer (match.h) */
    struct loomi_xfer *waiter;
    /* Once its receive is posted, a message still arriving is moved to the
     * receive's buffer and the rest read straight into it ("direct"; buf
     * is then gone).  That needs to know which bytes are in: the pieces
     * started so far (npc > UNEXP_PIECES: too many, copy at the end). */
    int direct, npc;
    struct {
        size_t off, len;
    } pc[UNEXP_PIECES];
    struct loomi_tcp_tiling tl; /* the bytes its pieces claimed (tcp.h) */
};

/* A posted receive that pieces are arriving for, and the bytes they
 * claimed (tcp.h): listed from its first piece's header until it
 * completes, is cancelled or fails with its peer. */
struct rtile {
    struct loomi_xfer *x;
    struct loomi_tcp_tiling tl;
};

struct peer;
struct stream {
    int fd;
    int idx;
    struct peer *peer;
    struct piece *sq_head, *sq_tail;
    size_t queued;
    int writable;
    /* receive state */
    struct wire_hdr rh;
    size_t rh_got;
    int in_payload;
    char *rdst;     /* NULL: discard */
    size_t rleft;
    struct loomi_xfer *rx;
    struct unexp *ru;
    int bye; /* the peer said goodbye on this stream: its end is no failure */
    /* Sealed (LOOM_ENCRYPT) only: each direction's records, the sealed
     * bytes not yet written (ebuf[eoff, elen)), the header record and the
     * payload record being read (hrec: rh_got bytes; rbuf: rgot). */
    struct loomi_seal stx, srx;
    char *ebuf;
    size_t eoff, elen;
    unsigned char hrec[sizeof(struct wire_hdr) + LOOMI_SEAL_TAG];
    char *rbuf;
    size_t rgot;
};

struct peer {
    int rank;
    int failed;
    int open; /* streams still connected */
    struct stream *s;
    struct loomi_mq mq; /* receives posted, early messages (match.h) */
    int nposted; /* sends and receives in flight */
    struct rtile *rt; /* receives with pieces arriving */
    int nrt, cap_rt;
};

struct tcp {
    struct loomi_tctx ctx;
    int nstreams; /* data streams per peer; one more, the last, carries
                   * only control messages, so an abort notice never waits
                   * behind a half-sent piece of data */
    int lfd, epfd;
    struct sockaddr_storage laddr;
    socklen_t laddr_len;
    struct peer *peers;
    int aborted;
    int sealed; /* LOOM_ENCRYPT=1: every record sealed (seal.h) */
    struct loomi_objpool pieces; /* kept for reuse (bufpool.h) */
    struct loomi_match match; /* early messages' buffers, the operation noted */
    char discard[65536];
};
_Static_assert(LOOMI_SEAL_MAX <= sizeof(((struct tcp *)0)->discard),
               "a payload record read into the void opens into discard");

/* ------------------------------------------------------------- helpers */

/* Streams per peer: the data streams and the control stream. */
static inline int all_streams(const struct tcp *t) { return t->nstreams + 1; }

/* ------------------------------------------------- across the files */

/* tcp_data.c: failing a peer: close its sockets and fail everything it
 * holds (`notify`: tell the core through ctx.peer_failed); match.c fails
 * a peer through loomi_tcp_match_fail. */
void loomi_tcp_peer_down(struct tcp *t, struct peer *p, int failed, loom_result_t code,
                         const char *why, int notify);
void loomi_tcp_match_fail(void *owner, int peer, loom_result_t code, const char *why);

/* tcp.c: a control message (T_ABORT, T_BYE) to p, best effort; the
 * transport's calls for the connections' lifetime (the ops table, in
 * tcp_data.c, lists them with the data path's). */
void loomi_tcp_send_control(struct tcp *t, struct peer *p, int type, uint64_t tag, int aux);
loom_result_t loomi_tcp_create(const struct loomi_tctx *ctx, void **state);
loom_result_t loomi_tcp_local_addr(void *state, void *buf, size_t *len);
loom_result_t loomi_tcp_connect_all(void *state, const unsigned char *addrs, size_t addr_len,
                                    uint64_t deadline_ms);
void loomi_tcp_abort_all(void *state, int failed, loom_result_t code);
void loomi_tcp_destroy(void *state);

#endif
