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
 * This file decides and writes the text; it fails nothing itself.  A
 * check that finds a conflict of calls (transport.h) or a length that
 * differs returns LOOM_ERR_MISMATCH with the text of the error in `why`
 * ("rank 3 sent a message of ..."), and the transport fails the peer
 * with it: the receives still listed here fail with the peer's other
 * transfers.  Every length compared comes from the peer and is taken as
 * a uint64_t: nothing here adds to it.
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
};

struct loomi_match {
    const struct loomi_tctx *ctx; /* call_check, owner, name_sig */
    size_t usize;                 /* of the transport's early-message struct */
    size_t unexp_bytes, unexp_limit;
    struct loomi_bufpool pool; /* buffers of early messages (bufpool.h) */
    uint64_t noted_op;         /* the operation of the last collective transfer posted, + 1 */
};

/* usize: sizeof the transport's struct that starts with a struct
 * loomi_unexp (or sizeof(struct loomi_unexp)); limit: bytes held at most
 * for receives not posted.  ctx must outlive m. */
void loomi_match_init(struct loomi_match *m, const struct loomi_tctx *ctx, size_t usize,
                      size_t limit);
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

/* The texts of the two errors (to why, n bytes), for `peer`: a conflict
 * of calls, theirs against mine (transport.h), and a length that differs
 * ("rank P sent a message of SENT bytes where this rank expects WANT"). */
void loomi_match_conflict_why(const struct loomi_match *m, int peer, uint64_t theirs,
                              uint32_t theirs_chk, uint64_t mine, uint32_t mine_chk, char *why,
                              size_t n);
void loomi_match_length_why(int peer, uint64_t sent, uint64_t want, char *why, size_t n);

/* A message (tag, chk, total bytes) meets the receive x it matches by
 * tag, or the other way round: LOOM_SUCCESS when they agree, else
 * LOOM_ERR_MISMATCH with why (the check first, then the length). */
loom_result_t loomi_match_pair(const struct loomi_match *m, int peer, uint64_t tag, uint32_t chk,
                               uint64_t total, const struct loomi_xfer *x, char *why, size_t n);

/* A message that no receive waits for, from `peer`: *u is a new early
 * message listed in q (total bytes in a buffer from the pool when
 * `buffered`, counted against the limit; else no buffer), unless a
 * receive listed in q or this rank's own call shows that its sender
 * made the call otherwise (LOOM_ERR_MISMATCH), the limit is passed
 * (LOOM_ERR_REMOTE) or memory runs out (LOOM_ERR_NO_MEMORY): why says
 * so. */
loom_result_t loomi_match_early(struct loomi_match *m, struct loomi_mq *q, int peer, uint64_t tag,
                                uint32_t chk, uint64_t total, int buffered,
                                struct loomi_unexp **u, char *why, size_t n);

/* The receive x is posted.  LOOM_SUCCESS: *u is the oldest early
 * message with x's tag, agreeing with x and still listed in q (the
 * transport takes it off when it is done with it), or NULL when none is
 * held: x is then listed in q.  LOOM_ERR_MISMATCH (why set): the
 * message found does not agree with x, or none was found and another
 * early message of x's operation conflicts with it; x is then listed
 * and *u, if found, stays listed: both fail with the peer. */
loom_result_t loomi_match_post(struct loomi_match *m, struct loomi_mq *q, int peer,
                               struct loomi_xfer *x, struct loomi_unexp **u, char *why, size_t n);

/* A collective transfer x is posted: 1 when it is the first of its
 * operation, so that the transport scans what each peer holds for a
 * conflict with it (loomi_mq_unexp_conflict), found before this rank
 * made the call; else 0. */
int loomi_match_note_op(struct loomi_match *m, const struct loomi_xfer *x);

/* Formats a peer's error and logs it ("<transport>: peer rank P: ...");
 * the transports' peer_error. */
void loomi_match_vwarn(int rank, const char *transport, int peer, char *why, size_t n,
                       const char *fmt, va_list ap);

#endif
