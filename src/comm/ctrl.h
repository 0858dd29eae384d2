/*
 * ctrl.h - the control plane: a thread per communicator, with its own
 * connection to every peer, that exchanges heartbeats, detects failed
 * and silent ranks, spreads revocations and carries membership
 * protocols (shrink).
 *
 * It is separate from the data plane so that a rank busy computing (not
 * in a Loom call) still answers, while a killed, stopped or cut-off rank
 * falls silent: its connection breaks (killed) or its heartbeats stop
 * (stopped, cut off) and it is declared failed after
 * LOOMI_CTRL_MISSES heartbeat periods.
 *
 * The failed set only grows.  A rank learns of failures from its own
 * detector and from FAILED notices, which every rank forwards once, so
 * a notice reaches every survivor even if its first sender dies while
 * sending it.
 */
#ifndef LOOMI_CTRL_H
#define LOOMI_CTRL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "comm/comm.h"
#include "loom.h"
#include "topo/select.h"

/* Bytes of the address a rank publishes for its control listener. */
#define LOOMI_CTRL_ADDR_BYTES 64
/* Heartbeat periods without a word from a peer before it is failed. */
#define LOOMI_CTRL_MISSES 6
/* Largest protocol message payload accepted from the network. */
#define LOOMI_CTRL_MAX_PAYLOAD (64u << 20)

/* Processes waiting to join that one holder admits at a time. */
#define LOOMI_CTRL_MAX_JOINERS 64

/* Messages from one peer held in the mailbox and not yet taken, at
 * most, and their payload bytes: a peer that sends more than any
 * exchange needs is failed, not buffered for without bound. */
#define LOOMI_CTRL_MAIL_MAX 1024u
#define LOOMI_CTRL_MAIL_BYTES ((uint64_t)LOOMI_CTRL_MAX_PAYLOAD * 4)

/* Message types of membership protocols (values below 16 are the control
 * plane's own). */
enum {
    LOOMI_CMSG_GIVEUP = 17, /* shrink.c: a rank gave the round (epoch) up */
    LOOMI_CMSG_ADDR = 18,
    LOOMI_CMSG_ALL = 19,
    LOOMI_CMSG_ACCEPT = 20, /* to a joiner: arg = new rank | new size << 32 */
    LOOMI_CMSG_AGREE = 21,  /* loom_comm_agree's proposal (agree.c) */
    LOOMI_CMSG_AGREED = 22, /* ... and its decision */
    /* Collective calls (calls.c), arg = a call number: a probe from a
     * rank stalled in that call, with its descriptor; a rank's last
     * calls, sent when the communicator failed for a mismatch. */
    LOOMI_CMSG_CALL_PROBE = 23,
    LOOMI_CMSG_CALL_SHOW = 24,
    /* split.c: after the exchange of a split failed, "this rank was in
     * it" (epoch: the exchange's call number), so that each names the
     * ranks that never called it. */
    LOOMI_CMSG_SPLIT_IN = 25,
    /* create_group.c: loom_comm_create_group among the listed ranks,
     * epoch: the pair's count of creates between sender and receiver,
     * arg: LOOMI_GRP_* (the kind of message, a vote's value above it). */
    LOOMI_CMSG_GROUP = 26,
    LOOMI_CMSG_MAX = 26
};
/* LOOMI_CMSG_GROUP's kinds (arg & 0xff). */
#define LOOMI_GRP_CARD 1   /* the sender's list, tag and settings */
#define LOOMI_GRP_FAIL 2   /* the sender gave up before building; why, as text */
#define LOOMI_GRP_GIVEUP 3 /* the sender gave up while building */
#define LOOMI_GRP_VOTE 4   /* to the coordinator: built (arg >> 8: 1) or not (0) */
#define LOOMI_GRP_DECIDE 5 /* from the coordinator: keep (arg >> 8: 1) or discard */
/* ALL's arg after a round's commit (shrink.c): to a joiner, 0 = the
 * round was given up, this = it holds (keep the communicator). */
#define LOOMI_CTRL_ALL_COMMIT UINT64_MAX
/* loomi_ctrl_recv's masks: the protocols' own message types. */
#define LOOMI_CMSG_BIT(t) (1u << ((t) - 16))
#define LOOMI_CMSG_SHRINK                                                                      \
    (LOOMI_CMSG_BIT(LOOMI_CMSG_GIVEUP) | LOOMI_CMSG_BIT(LOOMI_CMSG_ADDR) |                     \
     LOOMI_CMSG_BIT(LOOMI_CMSG_ALL))
#define LOOMI_CMSG_AGREEMENT (LOOMI_CMSG_BIT(LOOMI_CMSG_AGREE) | LOOMI_CMSG_BIT(LOOMI_CMSG_AGREED))

/* LOOMI_CMSG_ACCEPT's payload: the links, measured once for the job, and
 * the settings the joiner must share with the members. */
struct loomi_join_accept {
    struct loomi_links links;
    struct loomi_uniform uniform;
};
/* An ACCEPT from the join service's holder (arg: the joiner's rank and,
 * above it, the new size; len bytes of data), checked before its
 * figures are used (join.c): NULL with the payload copied to *acc, or
 * what is wrong with it.  Pure, so that tests drive it. */
const char *loomi_join_accept_bad(uint64_t arg, const unsigned char *data, uint32_t len,
                                  struct loomi_join_accept *acc);

/* A protocol message delivered to the communicator's thread. */
struct loomi_cmsg {
    struct loomi_cmsg *next;
    uint16_t type;
    int src;
    uint32_t epoch;
    uint64_t arg;
    uint32_t len;
    unsigned char data[];
};

struct loomi_ctrl;

/* Whether a message (type, len) that peer slot q sent (q >= n: a joiner's
 * slot) may go in the mailbox, that peer having `held` messages of
 * `bytes` bytes there already: NULL, or what is wrong with it (the peer
 * is then failed).  Pure, so that tests drive it. */
const char *loomi_ctrl_mail_bad(int n, int q, uint16_t type, uint32_t len, unsigned held,
                                uint64_t bytes);

/* Listen on the address `bind` (port ignored) for the control plane of
 * rank `rank` of `nranks`.  heartbeat_ms 0: no heartbeats (only broken
 * connections are detected). */
loom_result_t loomi_ctrl_create(int rank, int nranks, const unsigned char key[32],
                                int heartbeat_ms, const struct sockaddr *bind, socklen_t bind_len,
                                struct loomi_ctrl **out);
/* LOOM_ENCRYPT=1: the connections between ranks that loomi_ctrl_start
 * makes carry every frame sealed (transports/seal.h): its header as one
 * record, its payload as records of up to LOOMI_SEAL_MAX bytes; a record
 * that does not open fails its sender.  Before loomi_ctrl_start.  (A
 * joiner's connection to the join service stays plain.) */
void loomi_ctrl_set_sealed(struct loomi_ctrl *c);
/* This rank's published address (LOOMI_CTRL_ADDR_BYTES). */
void loomi_ctrl_addr(const struct loomi_ctrl *c, unsigned char *out);
/* Connect to every peer, given all ranks' control addresses (rank r's at
 * addrs + r * stride), check their handshakes and start the thread.
 * Blocks until deadline_ms at most. */
loom_result_t loomi_ctrl_start(struct loomi_ctrl *c, const unsigned char *addrs, size_t stride,
                               uint64_t deadline_ms);
/* Stop the thread and free everything.  polite: say goodbye first, so
 * that peers see a departure, not a failure (either way they count the
 * rank out of later membership).  NULL is fine. */
void loomi_ctrl_destroy(struct loomi_ctrl *c, int polite);

/* Nonzero once the communicator is revoked (by a detected failure, a
 * peer's notice or loomi_ctrl_revoke).  Cheap: one atomic load. */
int loomi_ctrl_revoked(const struct loomi_ctrl *c);
/* Why: the code, the failed rank (-1: none named) and a message. */
void loomi_ctrl_reason(struct loomi_ctrl *c, loom_result_t *code, int *failed, char *msg,
                       size_t n);
/* Revoke (first reason wins) and tell every peer.  `hint`: the rank the
 * caller holds responsible (-1: none); it goes with the notice into the
 * reason, not into the failed set, which only the detectors fill. */
void loomi_ctrl_revoke(struct loomi_ctrl *c, loom_result_t code, int hint, const char *why);
/* Declare `rank` failed here and tell every peer. */
/* Wait up to ms for word about `rank` on the control plane: the
 * communicator revoked (by anyone, with a reason), or the rank failed.
 * Returns 1 when revoked. */
int loomi_ctrl_wait_word(struct loomi_ctrl *c, int rank, int ms);
void loomi_ctrl_mark_failed(struct loomi_ctrl *c, int rank, const char *why);
/* Out of the membership: failed (LOOMI_OUT), or left with a goodbye
 * (loom_comm_destroy: LOOMI_OUT_LEFT, which never goes on elsewhere). */
#define LOOMI_OUT 1
#define LOOMI_OUT_LEFT 3
/* Copy the set of ranks out (nranks bytes, 0 = in, else LOOMI_OUT or
 * LOOMI_OUT_LEFT) and return how many; *gen (may be NULL) receives a
 * counter that changes with the set. */
int loomi_ctrl_failed(struct loomi_ctrl *c, unsigned char *set, unsigned *gen);

/* Queue a protocol message to `to` (never blocks).  Fails with
 * LOOM_ERR_REMOTE when `to` is known failed. */
loom_result_t loomi_ctrl_send(struct loomi_ctrl *c, int to, uint16_t type, uint32_t epoch,
                              uint64_t arg, const void *data, uint32_t len);
/* The oldest protocol message received of a type in `mask` (bits
 * LOOMI_CMSG_BIT(type); the caller frees it), or NULL when none came
 * before deadline_ms or the failed set changed from `gen` (compare with
 * loomi_ctrl_failed's).  Messages of other types stay for their own
 * protocol (a rank may still be in an agreement when a peer has moved
 * on to a shrink). */
struct loomi_cmsg *loomi_ctrl_recv(struct loomi_ctrl *c, unsigned gen, uint64_t deadline_ms,
                                   uint32_t mask);
/* Whether a protocol message of a type in mask and an epoch after
 * `epoch` waits in the mailbox (a round that superseded the caller's). */
int loomi_ctrl_newer(struct loomi_ctrl *c, uint32_t mask, uint32_t epoch);

/* Whether the ranks not in `out` ([n], as loomi_ctrl_failed gives) may
 * go on as the communicator's successor: any of them (any_quorum), or
 * more than half of the n ranks, or exactly half with rank 0 among them.
 * Two groups formed from one communicator then never both go on. */
int loomi_ctrl_quorum(const unsigned char *out, int n, int any_quorum);

/* Agreements (agree.c).  A rank keeps the payload of the decisions it
 * took (the last few), and its control thread answers a coordinator's
 * query for one (the coordinator took over from one that failed after
 * some ranks had its decision) with a LOOMI_CMSG_AGREED of it. */
void loomi_ctrl_agreed_put(struct loomi_ctrl *c, uint64_t id, const void *msg, uint32_t len);
/* Ask rank `to` for decision `id` (no answer when it has none). */
loom_result_t loomi_ctrl_agreed_ask(struct loomi_ctrl *c, int to, uint32_t epoch, uint64_t id);
/* Send rank `to` decision `id` if this rank has it (the control thread
 * does so itself for proposals that come after the decision; this is for
 * those that were already in the mailbox). */
void loomi_ctrl_agreed_answer(struct loomi_ctrl *c, int to, uint64_t id);

/* The oldest protocol message of one type (the caller frees it), left
 * in order with the others; waits for one until deadline_ms (0: does not
 * wait). */
struct loomi_cmsg *loomi_ctrl_take(struct loomi_ctrl *c, uint16_t type, uint64_t deadline_ms);
/* The oldest protocol message of one type from peer `src` (-1: any), waited for
 * until deadline_ms (0: not at all) or until the failed set changes from
 * gen (when gen is not NULL). */
struct loomi_cmsg *loomi_ctrl_take_src(struct loomi_ctrl *c, uint16_t type, int src,
                                       uint64_t deadline_ms, const unsigned *gen);
/* Whether a protocol message for which pred returns nonzero waits in the
 * mailbox (left there; pred runs under the control plane's lock). */
int loomi_ctrl_peek(struct loomi_ctrl *c, int (*pred)(const struct loomi_cmsg *, void *),
                    void *arg);
/* How many protocol messages have come so far (cheap: an atomic load). */
unsigned loomi_ctrl_mail_count(const struct loomi_ctrl *c);

/* A joiner's side of the wire: the 32-byte header of a message (its
 * first message is LOOMI_CTRL_T_JOIN with the 16-byte job key), and the
 * parse of one received (-1: not a control message, or too long). */
#define LOOMI_CTRL_HDR_BYTES 32
#define LOOMI_CTRL_T_JOIN 5
void loomi_ctrl_frame(unsigned char *hdr, uint16_t type, uint32_t epoch, uint64_t arg,
                      uint32_t len);
int loomi_ctrl_parse(const unsigned char *hdr, uint16_t *type, uint32_t *epoch, uint64_t *arg,
                     uint32_t *len);

/* Joiners.  Every rank names the job's rendezvous address; the lowest
 * rank alive binds it (retrying while the bootstrap root or a previous
 * holder still has it) and takes hellos.  fd >= 0 is that address's
 * listening socket, already bound (rank 0 keeps the root's; taken over,
 * closed here if not used).  A rendezvous hello that comes there
 * (loomi_boot_late_hello) is refused, and revokes the communicator when
 * the job has no key of its own (keyed 0): two jobs share the address.  Joiner slots are numbered
 * n .. n + LOOMI_CTRL_MAX_JOINERS - 1, as message sources and for
 * loomi_ctrl_send. */
void loomi_ctrl_serve_joins(struct loomi_ctrl *c, const struct sockaddr *addr, socklen_t len,
                            int fd, int keyed);
/* Joiners waiting, as the holder last said (cheap: an atomic load). */
int loomi_ctrl_pending(const struct loomi_ctrl *c);
/* On the holder: admit up to max joiners (those admitted before first,
 * then by arrival), their slots in `slots`; returns how many. */
int loomi_ctrl_admit(struct loomi_ctrl *c, int *slots, int max);
int loomi_ctrl_joiner_alive(struct loomi_ctrl *c, int slot);
/* The admitted joiners are done: close them once their messages left. */
void loomi_ctrl_joiners_done(struct loomi_ctrl *c);

#endif
