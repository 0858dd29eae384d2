/*
 * match.h - message matching, shared by the two-sided transports (tcp,
 * shm, verbs).
 *
 * A transport keeps, per peer, the receives posted and not yet matched
 * and the messages that came before their receive ("early" messages),
 * in a struct loomi_mq; what all peers share (the bytes held for early
 * messages and their limit, the buffer pool, the last operation noted)
 * lives in a struct loomi_match.  Both lists are kept in order of
 * arrival per tag: a message matches the oldest receive posted with its
 * tag, a receive the oldest message held with it.
 *
 * A check that finds a conflict of calls (transport.h), a length that
 * differs, too many bytes held or no memory fails the peer through the
 * transport's hook (`fail`, with the code and the text of the error,
 * "rank 3 sent a message of ..."), then returns that code: the
 * receives still listed here fail with the peer's other transfers.
 * Every length compared comes from the peer and is taken as a uint64_t;
 * sums with it are checked so that they cannot wrap.
 */
#ifndef LOOMI_MATCH_H
#define LOOMI_MATCH_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "transports/bufpool.h"
#include "transports/transport.h"

#define LOOMI_MQ_BUCKETS 64
#define LOOMI_MATCH_WHY 256 /* room for the text of an error */

/* One early message.  A transport that keeps more about one embeds this
 * as the first member of its own struct and gives that struct's size to
 * loomi_match_init. */
struct loomi_unexp {
    struct loomi_unexp *next;
    uint64_t tag;
    uint32_t chk;    /* the call's check it came with */
    size_t total;    /* its length */
    size_t got;      /* bytes of it in buf so far (the transport's count) */
    char *buf;       /* its bytes (from the pool), or NULL: none held */
    size_t cap;      /* buf's size */
    struct loomi_mq *q; /* the peer's queues it is counted in */
};

/* One peer's queues. */
struct loomi_mq {
    struct {
        struct loomi_xfer *head, *tail; /* linked through t_next/t_prev */
    } recv[LOOMI_MQ_BUCKETS];
    struct {
        struct loomi_unexp *head, *tail;
    } unexp[LOOMI_MQ_BUCKETS];
    int nrecv;  /* receives listed */
    int nunexp; /* early messages listed: a receive posted scans them only then */
    size_t early_bytes; /* bytes buffered for them: the peer's budget */
};

/* Early messages one peer may have listed at once: past it, that peer
 * fails (each costs memory even when it brings no bytes, like a verbs
 * rendezvous). */
#define LOOMI_MATCH_EARLY_COUNT 65536u

struct loomi_match {
    const struct loomi_tctx *ctx; /* call_check, owner, name_sig */
    /* The transport's: fail `peer` (and every transfer it holds) with
     * code, for the reason why. */
    void (*fail)(void *owner, int peer, loom_result_t code, const char *why);
    void *owner;
    size_t usize;                 /* of the transport's early-message struct */
    size_t unexp_bytes;        /* bytes buffered, all peers */
    size_t unexp_limit;        /* ... at most, per peer */
    unsigned count_limit;      /* early messages listed per peer, at most */
    struct loomi_bufpool pool; /* buffers of early messages (bufpool.h) */
    uint64_t noted_op;         /* the operation of the last collective transfer posted, + 1 */
};

/* usize: sizeof the transport's struct that starts with a struct
 * loomi_unexp (or sizeof(struct loomi_unexp)); limit: bytes held at most
 * for receives not posted, per peer (and LOOMI_MATCH_EARLY_COUNT early
 * messages per peer).  ctx must outlive m. */
void loomi_match_init(struct loomi_match *m, const struct loomi_tctx *ctx, size_t usize,
                      size_t limit,
                      void (*fail)(void *owner, int peer, loom_result_t code, const char *why),
                      void *owner);
void loomi_match_fini(struct loomi_match *m);

/* ---------------------------------------------------- posted receives */

void loomi_mq_recv_add(struct loomi_mq *q, struct loomi_xfer *x);
void loomi_mq_recv_del(struct loomi_mq *q, struct loomi_xfer *x);
/* 1 when x is listed (it is then taken off when `take`). */
int loomi_mq_recv_has(struct loomi_mq *q, struct loomi_xfer *x, int take);
/* The oldest receive listed with this tag (left listed), or NULL. */
struct loomi_xfer *loomi_mq_recv_find(const struct loomi_mq *q, uint64_t tag);
/* Takes every receive off the lists, oldest first per tag: the next, or
 * NULL once none is left (failing a peer). */
struct loomi_xfer *loomi_mq_recv_pop(struct loomi_mq *q);

/* ---------------------------------------------------- early messages */

/* The oldest message held with this tag, left listed, or NULL. */
struct loomi_unexp *loomi_mq_unexp_find(const struct loomi_mq *q, uint64_t tag);
/* u, listed in q, taken off (not freed). */
void loomi_mq_unexp_del(struct loomi_mq *q, struct loomi_unexp *u);
/* Takes any held message off the lists (NULL: none left). */
struct loomi_unexp *loomi_mq_unexp_pop(struct loomi_mq *q);
/* Frees u (taken off its list) and its buffer. */
void loomi_match_unexp_free(struct loomi_match *m, struct loomi_unexp *u);
/* u's buffer goes back to the pool; u itself stays (its bytes now land
 * elsewhere). */
void loomi_match_unexp_unbuffer(struct loomi_match *m, struct loomi_unexp *u);

/* ----------------------------------------------------------- checking */

/* A listed receive / early message of the operation `tag` names but of
 * another schedule or call (transport.h), or NULL. */
const struct loomi_xfer *loomi_mq_recv_conflict(const struct loomi_mq *q, uint64_t tag,
                                                uint32_t chk);
const struct loomi_unexp *loomi_mq_unexp_conflict(const struct loomi_mq *q, uint64_t tag,
                                                  uint32_t chk);
/* This rank's own call of the operation `tag` names, when it made it
 * with another check than chk: its check; else 0. */
uint32_t loomi_match_own_conflict(const struct loomi_match *m, uint64_t tag, uint32_t chk);

/* Fail `peer` for a conflict of calls, theirs against mine
 * (transport.h), or for a length that differs ("rank P sent a message
 * of SENT bytes where this rank expects WANT"), with LOOM_ERR_MISMATCH;
 * return it. */
loom_result_t loomi_match_conflict(struct loomi_match *m, int peer, uint64_t theirs,
                                   uint32_t theirs_chk, uint64_t mine, uint32_t mine_chk);
loom_result_t loomi_match_length(struct loomi_match *m, int peer, uint64_t sent, uint64_t want);

/* A message (tag, chk, total bytes) meets the receive x it matches by
 * tag, or the other way round: LOOM_SUCCESS when they agree, else the
 * peer fails (the check first, then the length). */
loom_result_t loomi_match_pair(struct loomi_match *m, int peer, uint64_t tag, uint32_t chk,
                               uint64_t total, const struct loomi_xfer *x);

/* A message that no receive waits for, from `peer`: *u is a new early
 * message listed in q (total bytes in a buffer from the pool when
 * `buffered`, counted against the limit; else no buffer), unless a
 * receive listed in q or this rank's own call shows that its sender
 * made the call otherwise (LOOM_ERR_MISMATCH), this peer's budget of
 * early bytes or messages is passed (LOOM_ERR_REMOTE: the peer that
 * sent too much fails, not one whose message comes after) or memory runs out (LOOM_ERR_NO_MEMORY): the peer
 * then fails and *u is NULL. */
loom_result_t loomi_match_early(struct loomi_match *m, struct loomi_mq *q, int peer, uint64_t tag,
                                uint32_t chk, uint64_t total, int buffered,
                                struct loomi_unexp **u);

/* The receive x is posted.  LOOM_SUCCESS: *u is the oldest early
 * message with x's tag, agreeing with x and still listed in q (the
 * transport takes it off when it is done with it), or NULL when none is
 * held: x is then listed in q.  LOOM_ERR_MISMATCH: the message found
 * does not agree with x, or none was found and another early message of
 * x's operation conflicts with it; x is then listed, *u (if found)
 * stays listed, and the peer has failed with both. */
loom_result_t loomi_match_post(struct loomi_match *m, struct loomi_mq *q, int peer,
                               struct loomi_xfer *x, struct loomi_unexp **u);

/* An early message held in q of x's operation but of another schedule
 * or call: the peer fails (LOOM_ERR_MISMATCH). */
loom_result_t loomi_match_held(struct loomi_match *m, const struct loomi_mq *q, int peer,
                               const struct loomi_xfer *x);

/* A collective transfer x is posted: 1 when it is the first of its
 * operation, so that the transport scans what each live peer holds
 * (loomi_match_held) for a message of it that came before this rank made
 * the call; else 0. */
int loomi_match_note_op(struct loomi_match *m, const struct loomi_xfer *x);

/* Formats a peer's error and logs it ("<transport>: peer rank P: ...");
 * the transports' peer_error. */
void loomi_match_vwarn(int rank, const char *transport, int peer, char *why, size_t n,
                       const char *fmt, va_list ap);

#endif
