/*
 * transport.h - the one door between the core and transports/.
 *
 * A transport moves bytes between ranks of one communicator; it knows
 * nothing about collectives.  The table is shaped for the hardest
 * transport (RDMA verbs, CUDA peer memory): memory can be registered
 * before use, and two-sided send/recv match on a 64-bit tag (through
 * match.c, shared by tcp, shm and verbs).  Each transport says in `caps`
 * what it implements beyond that; the engine uses what each offers.
 *
 * Nothing on the data path blocks: isend/irecv only queue work;
 * progress() moves it and calls completion callbacks.  All calls for one
 * communicator come from one thread at a time (the communicator's owner).
 */
#ifndef LOOMI_TRANSPORT_H
#define LOOMI_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "loom.h"
#include "core/cuda.h"

/* Capabilities. */
/* What a transport adds when a message's size is not the one its
 * receive expects: the usual causes, on the sender's side. */
#define LOOMI_MISMATCH_HINT                                                        \
    "do all ranks call the same collectives in the same order with the same "     \
    "count and datatype (and the same loom_comm_set_algo)?"

/* The engine's tags.  Point-to-point: bit 63 set, the per-peer message
 * number below.  Collectives: bit 63 clear; bits 55-62 name the schedule
 * (collective and algorithm: the engine's signature), bits 32-54 the
 * operation's number (its collective call's number on the communicator,
 * the same on all ranks; 23 bits are plenty, as only the operations in
 * flight need telling apart), bits 0-31 the message within it.  Tags carry the signature so that ranks running different
 * schedules for one operation never match each other's messages, even
 * where sizes and order happen to agree; a transport that holds a message
 * of one operation and a receive of the same operation whose signatures
 * differ reports LOOM_ERR_MISMATCH with loomi_tag_conflict_why's text
 * instead of waiting for LOOM_TIMEOUT. */
#define LOOMI_TAG_P2P (UINT64_C(1) << 63)
#define LOOMI_TAG_SEQ_BITS 23
#define LOOMI_TAG_SIG_SHIFT (32 + LOOMI_TAG_SEQ_BITS)

static inline uint64_t loomi_tag_coll(uint64_t seq, unsigned sig, uint32_t msg)
{
    return (uint64_t)(sig & 0xffu) << LOOMI_TAG_SIG_SHIFT |
           (seq & ((UINT64_C(1) << LOOMI_TAG_SEQ_BITS) - 1)) << 32 | msg;
}

/* Two collective tags of one operation with different schedules. */
static inline int loomi_tag_conflict(uint64_t a, uint64_t b)
{
    const uint64_t d = a ^ b;
    return !((a | b) & LOOMI_TAG_P2P) && !(d >> 32 & ((UINT64_C(1) << LOOMI_TAG_SEQ_BITS) - 1)) &&
           (d >> LOOMI_TAG_SIG_SHIFT) != 0;
}

/* The operation number a collective tag carries (the rank's collective
 * call number, modulo 2^LOOMI_TAG_SEQ_BITS). */
static inline uint64_t loomi_tag_op(uint64_t tag)
{
    return tag >> 32 & ((UINT64_C(1) << LOOMI_TAG_SEQ_BITS) - 1);
}

/* Calls.  Every message of a collective also carries its call's check
 * (loomi_xfer.chk: a hash of the collective, count, datatype, op and
 * root, the same on every rank that makes the same call; 0 for
 * point-to-point).  Two messages of one operation (tags with the same
 * number) that differ in schedule or in check come from ranks that made
 * that call differently: a transport that holds both (a message and the
 * receive it would match, or a message of an operation and this rank's
 * own call of that number, ctx.call_check) fails the sender with
 * LOOM_ERR_MISMATCH and loomi_call_conflict_why's text, before any
 * byte of the message is used and whether or not the sizes agree. */
static inline int loomi_call_conflict(uint64_t ta, uint32_t ca, uint64_t tb, uint32_t cb)
{
    return !((ta | tb) & LOOMI_TAG_P2P) && loomi_tag_op(ta) == loomi_tag_op(tb) &&
           ((ta ^ tb) >> LOOMI_TAG_SIG_SHIFT || ca != cb);
}

/* Names a schedule's signature (the 8 bits a collective tag carries
 * above LOOMI_TAG_SIG_SHIFT) for a message, "(allreduce, ring)"; the
 * layers above give one in loomi_tctx.name_sig, as the transports know
 * no collective. */
typedef void (*loomi_sig_namer)(unsigned sig, char *buf, size_t n);

/* The error text for a conflict (tags.c): the peer's schedule (tag
 * `theirs`) against this rank's (`mine`), named by name_sig (NULL: by
 * number), and the usual causes. */
void loomi_tag_conflict_why(uint64_t theirs, uint64_t mine, loomi_sig_namer name_sig, char *buf,
                            size_t n);
/* The same for a conflict of calls or schedules (loomi_call_conflict). */
void loomi_call_conflict_why(uint64_t theirs, uint32_t theirs_chk, uint64_t mine,
                             uint32_t mine_chk, loomi_sig_namer name_sig, char *buf, size_t n);

#define LOOMI_TCAP_TWO_SIDED 0x1u  /* isend/irecv with tag matching */
#define LOOMI_TCAP_MEM_REG 0x4u    /* mem_register does real work */

/* enum loomi_mem_kind (host, device, managed): core/cuda.h. */

/* A registered memory region.  `desc` is what a peer needs to write into
 * it (verbs: address + rkey; CUDA: an IPC handle); `desc_len` is 0 for
 * transports that need nothing. */
#define LOOMI_MR_DESC_MAX 64
struct loomi_mr {
    void *addr;
    size_t len;
    enum loomi_mem_kind kind;
    void *handle; /* transport-private */
    uint32_t desc_len;
    unsigned char desc[LOOMI_MR_DESC_MAX];
};

/* One posted transfer.  The engine owns the memory and fills the first
 * block; the transport owns the rest until it calls complete(), exactly
 * once, from inside isend/irecv or progress(), unless it is cancelled. */
struct loomi_xfer {
    int peer;
    uint64_t tag; /* matched between isend and irecv (two-sided) */
    void *buf;
    size_t len; /* a receive must match the sender's length exactly */
    struct loomi_mr *mr; /* may be NULL where caps lack MEM_REG */
    void (*complete)(struct loomi_xfer *x, loom_result_t status);
    void *owner; /* for complete(): the engine's step */
    uint32_t chk; /* the collective call's check, carried with the message (0: p2p) */
    uint64_t post_ns; /* the engine's: when a timed receive was posted (telemetry) */
    int dev; /* buf is CUDA device memory (GPUDirect: the verbs transport only) */

    /* Transport-private state. */
    size_t t_done;  /* bytes fully sent or received */
    size_t t_posted; /* XFER_DEAD once completed with an error (tcp) */
    struct loomi_xfer *t_next, *t_prev;
};

/* What the transport is given at creation, and how it reports trouble. */
struct loomi_tctx {
    int rank, nranks;
    const unsigned char *job_key; /* auth.h's key (32 bytes): proven in every handshake */
    /* A peer failed (connection broken, protocol violation, or it sent an
     * abort notice naming `failed`).  Called from progress(); the
     * transport has already failed that peer's posted transfers. */
    void (*peer_failed)(void *owner, int peer, int failed, loom_result_t code,
                        const char *why);
    /* An error that a live peer can cause by giving up its part of an
     * operation (an RDMA write into memory it let go, after it found the
     * ranks' calls differ, say): before reporting the peer failed, the
     * transport may wait up to ms for the owner's word on why; 1 when the
     * owner has failed meanwhile for a reason of its own (the report that
     * follows then changes nothing).  May be NULL. */
    int (*peer_word)(void *owner, int peer, int ms);
    void *owner;
    /* The check of this rank's collective call of the operation `tag`
     * names, or 0 when it has made no such call (yet), or too long ago
     * to know; may be NULL.  Called from progress() for messages that
     * find no receive posted: one whose check differs is a mismatch even
     * where this rank posts no receive from its sender. */
    uint32_t (*call_check)(void *owner, uint64_t tag);
    /* Names schedules in the text of a conflict (may be NULL). */
    loomi_sig_namer name_sig;
    /* Each transport's own options; the others ignore them.  Read only
     * during create() (strings and the address are the caller's). */
    struct {
        int streams;          /* tcp: connections per peer */
        int encrypt;          /* tcp: seal every record (LOOM_ENCRYPT; tcp.c) */
        size_t sockbuf;       /* tcp: socket buffer size (0: the system's) */
        const char *ifname;   /* tcp, verbs' connection setup: LOOM_SOCKET_IFNAME */
        const void *bind_hint; /* tcp, verbs: struct sockaddr of the local address, or NULL */
        unsigned bind_hint_len;
    } sock;
    struct {
        size_t bytes;   /* this rank's shared arena (shared_map) */
        size_t cma_min; /* messages from this size go single-copy (0: never) */
    } shm;
    struct {
        /* The device the topology gives this rank (the NIC closest to its
         * GPU or cores), or NULL; LOOM_IB_HCA overrides it. */
        const char *nic_hint;
        /* LOOM_GPUDIRECT (LOOMI_GPUDIRECT_*, core/internal.h): whether
         * device memory is registered through dmabuf. */
        int gpudirect;
    } verbs;
};

struct loomi_transport_ops {
    const char *name;
    unsigned caps;

    /* Create per-communicator state and a listening endpoint.  Init time:
     * may block up to the deadline.  Errors: SYSTEM, NO_MEMORY,
     * INVALID_ARGUMENT (bad ifname). */
    loom_result_t (*create)(const struct loomi_tctx *ctx, void **state);
    /* Bytes describing the endpoint (published over the bootstrap);
     * *len in: capacity, out: used.  Does not block. */
    loom_result_t (*local_addr)(void *state, void *buf, size_t *len);
    /* Connect to every peer, given all ranks' endpoint descriptions of
     * `addr_len` bytes each (rank order): the stride of the buffers that
     * local_addr filled, so at least what it wrote (local_addr refuses a
     * smaller one).  Init time: blocks until every
     * connection is up and its handshake checked, or deadline_ms.
     * Errors: CONNECT (names the peer and address), MISMATCH, TIMEOUT. */
    loom_result_t (*connect_all)(void *state, const unsigned char *addrs,
                                 size_t addr_len, uint64_t deadline_ms);
    /* Register memory for transfers.  May block (pinning); never called
     * per chunk (the engine caches).  NULL when caps lacks MEM_REG. */
    loom_result_t (*mem_register)(void *state, void *addr, size_t len,
                                  enum loomi_mem_kind kind, struct loomi_mr *mr);
    /* Undo mem_register (init or teardown time; may block while the
     * device lets go).  Not while a transfer still uses the region. */
    void (*mem_deregister)(void *state, struct loomi_mr *mr);
    /* Queue a send / a receive.  Never blocks.  Errors: REMOTE if the peer
     * is already known failed (complete() is then not called). */
    loom_result_t (*isend)(void *state, struct loomi_xfer *x);
    loom_result_t (*irecv)(void *state, struct loomi_xfer *x);
    /* Move data and call completions.  Waits up to timeout_ms (0: poll)
     * for something to happen.  Errors: SYSTEM (the transport itself is
     * broken); peer trouble goes through ctx->peer_failed instead. */
    loom_result_t (*progress)(void *state, int timeout_ms);
    /* A descriptor that becomes readable when progress() has work, or -1,
     * so that several transports can be waited on together. */
    int (*wait_fd)(void *state);
    /* Optional, for transports without a descriptor: a count that rises
     * whenever progress() moves bytes, complete or not.  A wait naps on
     * the other transports' descriptors only once it stops rising: one
     * message streamed through a FIFO for milliseconds completes nothing
     * until its end, and must not wait for a nap to end between cells. */
    uint64_t (*moved)(void *state);
    /* Withdraw a posted transfer (the engine's abort path): complete()
     * is not called for it, and once cancel returns the caller may free
     * or reuse x->buf.  tcp finishes a message already half on the wire
     * from a copy of its own (the stream would lose its framing
     * otherwise); shm tells the receiver to drop a message it holds in
     * part; verbs drops the registration it took for x, but work
     * requests already handed to the device complete on their own and
     * may still read the buffer until then.  Never blocks; a transfer
     * the transport no longer holds is ignored. */
    void (*cancel)(void *state, struct loomi_xfer *x);
    /* Tell every reachable peer that this communicator failed because of
     * `failed` (best effort, bounded by a short deadline), then close
     * every connection. */
    void (*abort_all)(void *state, int failed, loom_result_t code);
    /* Close politely (peers see a goodbye, not a failure) and free.
     * Transfers still posted are not completed: the caller cancelled
     * them or gives up on them.  Bounded by a deadline (tcp waits up to
     * 10 s for the peers to close their ends); no callback runs after it
     * returns. */
    void (*destroy)(void *state);
    /* Shared arena: the address at which this process sees `rank`'s
     * arena (its own or a connected peer's on the same host) and its
     * size in *len; NULL when there is none.  Any rank may read or write
     * any arena; ordering is the schedule's job (messages).  Does not
     * block.  May be NULL in the table (no shared memory). */
    void *(*shared_map)(void *state, int rank, size_t *len);
};

/* connect_all convention: a peer whose address is all zero bytes is not
 * to be reached through this transport (another one carries it). */
static inline int loomi_all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

/* connect_all's reading of rank q's address (the first n bytes of its
 * addr_len, at least n by connect_all's contract): 1 with it copied to
 * out when q is a peer to reach here; 0 for this rank (me) itself or an
 * address of all zero bytes.  What a transport checks in one is its
 * own. */
static inline int loomi_peer_addr(const unsigned char *addrs, size_t addr_len, int q, int me,
                                  void *out, size_t n)
{
    const unsigned char *a = addrs + (size_t)q * addr_len;
    if (q == me || loomi_all_zero(a, n)) return 0;
    memcpy(out, a, n);
    return 1;
}

extern const struct loomi_transport_ops loomi_tcp_ops;
extern const struct loomi_transport_ops loomi_shm_ops;

#endif
