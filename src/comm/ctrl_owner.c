/*
 * ctrl_owner.c - the control plane's owner's side: what the
 * communicator's thread calls (ctrl.h): the revocation and the failed
 * set, sending, the mailbox of protocol messages, the quorum, the
 * agreements kept for later coordinators, admitting joiners, and the
 * message frame.  The service thread is in ctrl.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/ctrl_internal.h"
#include "comm/comm.h"
#include "transports/net.h"

/* ---------------------------------------------------- the owner's side */

int loomi_ctrl_revoked(const struct loomi_ctrl *c)
{
    return atomic_load_explicit(&((struct loomi_ctrl *)c)->revoked, memory_order_acquire);
}

void loomi_ctrl_reason(struct loomi_ctrl *c, loom_result_t *code, int *failed, char *msg,
                       size_t n)
{
    pthread_mutex_lock(&c->mu);
    *code = c->code;
    *failed = c->failed_rank;
    snprintf(msg, n, "%s", c->why);
    pthread_mutex_unlock(&c->mu);
}

void loomi_ctrl_revoke(struct loomi_ctrl *c, loom_result_t code, int hint, const char *why)
{
    if (hint < -1 || hint >= c->n) hint = -1;
    pthread_mutex_lock(&c->mu);
    if (!atomic_load(&c->revoked)) {
        loomi_ctrl_set_revoked(c, code, hint, why);
        loomi_ctrl_queue_all(c, T_REVOKE, (uint64_t)code | (uint64_t)(hint + 1) << 32);
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    wake(c);
}

int loomi_ctrl_wait_word(struct loomi_ctrl *c, int rank, int ms)
{
    if (rank < 0 || rank >= c->n) return loomi_ctrl_revoked(c);
    uint64_t deadline = loomi_now_ms() + (uint64_t)ms;
    pthread_mutex_lock(&c->mu);
    while (!atomic_load(&c->revoked) && !c->p[rank].failed && c->started && !c->stop) {
        int left = loomi_ms_left(deadline);
        if (left == 0) break;
        cv_wait_ms(c, left);
    }
    int r = atomic_load(&c->revoked);
    pthread_mutex_unlock(&c->mu);
    return r;
}

void loomi_ctrl_mark_failed(struct loomi_ctrl *c, int rank, const char *why)
{
    if (rank < 0 || rank >= c->n) return;
    pthread_mutex_lock(&c->mu);
    loomi_ctrl_fail_peer(c, rank, why);
    pthread_mutex_unlock(&c->mu);
}

int loomi_ctrl_failed(struct loomi_ctrl *c, unsigned char *set, unsigned *gen)
{
    int k = 0;
    pthread_mutex_lock(&c->mu);
    for (int q = 0; q < c->n; q++) {
        const struct peer *p = &c->p[q];
        if (set) set[q] = (unsigned char)(p->failed ? (p->bye ? LOOMI_OUT_LEFT : LOOMI_OUT) : 0);
        k += p->failed;
    }
    if (gen) *gen = c->gen;
    pthread_mutex_unlock(&c->mu);
    return k;
}

loom_result_t loomi_ctrl_send(struct loomi_ctrl *c, int to, uint16_t type, uint32_t epoch,
                              uint64_t arg, const void *data, uint32_t len)
{
    if (to < 0 || to >= c->n + LOOMI_CTRL_MAX_JOINERS || to == c->rank || len > LOOMI_CTRL_MAX_PAYLOAD)
        return loomi_fail(LOOM_ERR_INTERNAL, c->rank, "control plane: bad message to rank %d",
                          to);
    pthread_mutex_lock(&c->mu);
    int rc = loomi_ctrl_queue_msg(c, to, type, epoch, arg, data, len);
    pthread_mutex_unlock(&c->mu);
    if (rc) return loomi_fail(LOOM_ERR_REMOTE, c->rank, "control plane: rank %d is failed", to);
    wake(c);
    return LOOM_SUCCESS;
}

/* The first message in the mailbox of a type in mask: its link (under mu). */
static struct loomi_cmsg **mb_find(struct loomi_ctrl *c, uint32_t mask, int src)
{
    struct loomi_cmsg **l = &c->mb_head;
    while (*l && (!(mask & LOOMI_CMSG_BIT((*l)->type)) || (src >= 0 && (*l)->src != src)))
        l = &(*l)->next;
    return l;
}

/* The first message of a type in mask, waited for until deadline_ms (0:
 * not at all) or, with gen, until the failed set changes from *gen. */
static struct loomi_cmsg *mb_take(struct loomi_ctrl *c, uint32_t mask, int src,
                                  uint64_t deadline_ms, const unsigned *gen)
{
    struct loomi_cmsg *m = NULL;
    pthread_mutex_lock(&c->mu);
    while (!*mb_find(c, mask, src) && (!gen || c->gen == *gen)) {
        int left = deadline_ms ? loomi_ms_left(deadline_ms) : 0;
        if (left == 0) break;
        cv_wait_ms(c, left > 100 ? 100 : left);
    }
    struct loomi_cmsg **l = mb_find(c, mask, src);
    if (*l) {
        m = *l;
        *l = m->next;
        struct peer *from = &c->p[m->src]; /* handle() checked src */
        if (from->mb_held) from->mb_held--;
        from->mb_bytes -= LOOMI_MIN(from->mb_bytes, (uint64_t)m->len);
        if (c->mb_tail == m) { /* the new tail: the one before, if any */
            c->mb_tail = NULL;
            for (struct loomi_cmsg *t = c->mb_head; t; t = t->next) c->mb_tail = t;
        }
        m->next = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    return m;
}

struct loomi_cmsg *loomi_ctrl_recv(struct loomi_ctrl *c, unsigned gen, uint64_t deadline_ms,
                                   uint32_t mask)
{
    return mb_take(c, mask, -1, deadline_ms, &gen);
}

struct loomi_cmsg *loomi_ctrl_take(struct loomi_ctrl *c, uint16_t type, uint64_t deadline_ms)
{
    return mb_take(c, LOOMI_CMSG_BIT(type), -1, deadline_ms, NULL);
}

struct loomi_cmsg *loomi_ctrl_take_src(struct loomi_ctrl *c, uint16_t type, int src,
                                       uint64_t deadline_ms, const unsigned *gen)
{
    return mb_take(c, LOOMI_CMSG_BIT(type), src, deadline_ms, gen);
}

int loomi_ctrl_peek(struct loomi_ctrl *c, int (*pred)(const struct loomi_cmsg *, void *),
                    void *arg)
{
    int found = 0;
    pthread_mutex_lock(&c->mu);
    for (struct loomi_cmsg *m = c->mb_head; m && !found; m = m->next) found = pred(m, arg) != 0;
    pthread_mutex_unlock(&c->mu);
    return found;
}

unsigned loomi_ctrl_mail_count(const struct loomi_ctrl *c)
{
    return atomic_load_explicit(&((struct loomi_ctrl *)c)->mb_count, memory_order_acquire);
}

int loomi_ctrl_newer(struct loomi_ctrl *c, uint32_t mask, uint32_t epoch)
{
    int found = 0;
    pthread_mutex_lock(&c->mu);
    for (struct loomi_cmsg *m = c->mb_head; m && !found; m = m->next)
        found = (mask & LOOMI_CMSG_BIT(m->type)) && m->epoch > epoch;
    pthread_mutex_unlock(&c->mu);
    return found;
}

int loomi_ctrl_quorum(const unsigned char *out, int n, int any_quorum)
{
    int alive = 0;
    for (int q = 0; q < n; q++) alive += !out[q];
    if (any_quorum) return alive > 0;
    /* Ranks that left with a goodbye count as out like the failed ones:
     * a rank that finished a shrink the others then gave up on leaves the
     * old communicator politely, and is in another group all the same. */
    return 2 * alive > n || (2 * alive == n && !out[0]);
}

void loomi_ctrl_agreed_put(struct loomi_ctrl *c, uint64_t id, const void *msg, uint32_t len)
{
    unsigned char *copy = malloc(len ? len : 1);
    if (!copy) return; /* a later coordinator then decides afresh: only this rank knew */
    memcpy(copy, msg, len);
    pthread_mutex_lock(&c->mu);
    unsigned k = c->agreed_next++ % AGREED_KEEP;
    free(c->agreed[k].msg);
    c->agreed[k].id = id;
    c->agreed[k].len = len;
    c->agreed[k].msg = copy;
    pthread_mutex_unlock(&c->mu);
}

loom_result_t loomi_ctrl_agreed_ask(struct loomi_ctrl *c, int to, uint32_t epoch, uint64_t id)
{
    return loomi_ctrl_send(c, to, T_AGREE_QUERY, epoch, id, NULL, 0);
}

void loomi_ctrl_agreed_answer(struct loomi_ctrl *c, int to, uint64_t id)
{
    if (to < 0 || to >= c->n) return;
    pthread_mutex_lock(&c->mu);
    int sent = loomi_ctrl_answer_agreed(c, to, id);
    pthread_mutex_unlock(&c->mu);
    if (sent) wake(c);
}

/* ------------------------------------------------------------- joiners */

void loomi_ctrl_serve_joins(struct loomi_ctrl *c, const struct sockaddr *addr, socklen_t len,
                            int fd, int keyed)
{
    pthread_mutex_lock(&c->mu);
    if (len <= sizeof c->jaddr) {
        memcpy(&c->jaddr, addr, len);
        c->jaddr_len = len;
        c->serve = 1;
        c->keyed = keyed;
    }
    if (fd >= 0 && c->serve && c->jfd < 0) {
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
        c->jfd = fd;
        char a[80];
        loomi_sockaddr_str((struct sockaddr *)&c->jaddr, a, sizeof a);
        LOOMI_INFO(c->rank, "control plane: admitting joiners at %s (the rendezvous root's "
                            "socket)", a);
    } else if (fd >= 0) {
        close(fd);
    }
    pthread_mutex_unlock(&c->mu);
    wake(c);
}

int loomi_ctrl_pending(const struct loomi_ctrl *c)
{
    return atomic_load(&((struct loomi_ctrl *)c)->pending_seen);
}

int loomi_ctrl_admit(struct loomi_ctrl *c, int *slots, int max)
{
    int k = 0;
    pthread_mutex_lock(&c->mu);
    /* Already admitted (an earlier round of this membership change) come
     * first, then the pending ones in order of arrival. */
    for (int j = 0; j < LOOMI_CTRL_MAX_JOINERS && k < max; j++)
        if (c->p[c->n + j].jstate == J_ADMITTED) slots[k++] = c->n + j;
    while (k < max) {
        int best = -1;
        for (int j = 0; j < LOOMI_CTRL_MAX_JOINERS; j++) {
            struct peer *p = &c->p[c->n + j];
            if (p->jstate == J_PENDING && (best < 0 || p->jsince < c->p[best].jsince)) best = c->n + j;
        }
        if (best < 0) break;
        c->p[best].jstate = J_ADMITTED;
        c->npending--;
        slots[k++] = best;
    }
    pthread_mutex_unlock(&c->mu);
    wake(c);
    return k;
}

int loomi_ctrl_joiner_alive(struct loomi_ctrl *c, int slot)
{
    pthread_mutex_lock(&c->mu);
    int alive = slot >= c->n && slot < c->n + LOOMI_CTRL_MAX_JOINERS &&
                c->p[slot].jstate == J_ADMITTED && c->p[slot].fd >= 0;
    pthread_mutex_unlock(&c->mu);
    return alive;
}

void loomi_ctrl_joiners_done(struct loomi_ctrl *c)
{
    pthread_mutex_lock(&c->mu);
    for (int j = 0; j < LOOMI_CTRL_MAX_JOINERS; j++) {
        struct peer *p = &c->p[c->n + j];
        if (p->jstate == J_ADMITTED) p->jstate = J_CLOSING; /* closed once flushed */
        p->failed = 0;
    }
    pthread_mutex_unlock(&c->mu);
    wake(c);
}

void loomi_ctrl_frame(unsigned char *hdr, uint16_t type, uint32_t epoch, uint64_t arg,
                      uint32_t len)
{
    put32(hdr, CTRL_MSG_MAGIC);
    hdr[4] = (unsigned char)type;
    hdr[5] = (unsigned char)(type >> 8);
    hdr[6] = hdr[7] = 0;
    put32(hdr + 8, 0);
    put32(hdr + 12, epoch);
    put64(hdr + 16, arg);
    put32(hdr + 24, len);
    put32(hdr + 28, 0);
}

int loomi_ctrl_parse(const unsigned char *hdr, uint16_t *type, uint32_t *epoch, uint64_t *arg,
                     uint32_t *len)
{
    if (get32(hdr) != CTRL_MSG_MAGIC) return -1;
    *type = (uint16_t)(hdr[4] | hdr[5] << 8);
    *epoch = get32(hdr + 12);
    *arg = get64(hdr + 16);
    *len = get32(hdr + 24);
    return *len > LOOMI_CTRL_MAX_PAYLOAD ? -1 : 0;
}
