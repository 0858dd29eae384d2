/*
 * ctrl.c - the control plane (see ctrl.h).
 *
 * One thread per communicator polls a connection to every peer.  It
 * sends a heartbeat every heartbeat period, declares a peer failed when
 * its connection breaks without a goodbye or when nothing came from it
 * for LOOMI_CTRL_MISSES periods, and forwards FAILED and REVOKE notices
 * once.  Protocol messages (types >= 16) go to a mailbox that the
 * communicator's own thread reads with loomi_ctrl_recv.
 *
 * Everything shared with the communicator's thread is under `mu`; only
 * `revoked` is read without it (an atomic), on the engine's fast path.
 *
 * This file holds the service thread: queueing and sending messages,
 * failing peers, reading and acting on what arrives, the join service,
 * and setting the plane up and down.  What the communicator's thread
 * calls is in ctrl_owner.c; ctrl_internal.h is what they share.
 */
#include "comm/ctrl.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "comm/comm.h"
#include "transports/net.h"
#include "core/internal.h"
#include "comm/ctrl_internal.h"

/* Append one message to a peer's output (under mu). */
int loomi_ctrl_queue_msg(struct loomi_ctrl *c, int q, uint16_t type, uint32_t epoch, uint64_t arg,
                         const void *data, uint32_t len)
{
    struct peer *p = &c->p[q];
    if (p->failed || p->fd < 0) return -1;
    const int sealed = p->stx.ctx != NULL;
    const size_t nrec = ((size_t)len + LOOMI_SEAL_MAX - 1) / LOOMI_SEAL_MAX;
    size_t need = HDR_BYTES + (size_t)len + (sealed ? LOOMI_SEAL_TAG * (1 + nrec) : 0);
    if (p->out_len + need > OUT_LIMIT) return -1;
    if (p->out_off && p->out_off == p->out_len) p->out_off = p->out_len = 0;
    if (p->out_len + need > p->out_cap) {
        if (p->out_off) { /* slide what is left to the front first */
            memmove(p->out, p->out + p->out_off, p->out_len - p->out_off);
            p->out_len -= p->out_off;
            p->out_off = 0;
        }
        if (p->out_len + need > p->out_cap) {
            size_t cap = p->out_cap ? p->out_cap : 4096;
            while (cap < p->out_len + need) cap *= 2;
            unsigned char *nb = realloc(p->out, cap);
            if (!nb) return -1;
            p->out = nb;
            p->out_cap = cap;
        }
    }
    unsigned char hb[HDR_BYTES], *h = sealed ? hb : p->out + p->out_len;
    put32(h, CTRL_MSG_MAGIC);
    h[4] = (unsigned char)type;
    h[5] = (unsigned char)(type >> 8);
    h[6] = h[7] = 0;
    put32(h + 8, (uint32_t)c->rank);
    put32(h + 12, epoch);
    put64(h + 16, arg);
    put32(h + 24, len);
    put32(h + 28, 0);
    if (sealed) {
        /* The header as one record, the payload as records after it. */
        unsigned char *o = p->out + p->out_len;
        if (loomi_seal(&p->stx, LOOMI_SEAL_HDR, hb, HDR_BYTES, o)) return -1;
        o += HDR_BYTES + LOOMI_SEAL_TAG;
        for (uint32_t at = 0; at < len;) {
            size_t k = LOOMI_MIN((size_t)(len - at), (size_t)LOOMI_SEAL_MAX);
            if (loomi_seal(&p->stx, LOOMI_SEAL_DATA, (const unsigned char *)data + at, k, o))
                return -1;
            o += k + LOOMI_SEAL_TAG;
            at += (uint32_t)k;
        }
    } else if (len) {
        memcpy(h + HDR_BYTES, data, len);
    }
    p->out_len += need;
    return 0;
}

void loomi_ctrl_queue_all(struct loomi_ctrl *c, uint16_t type, uint64_t arg)
{
    for (int q = 0; q < c->n; q++)
        if (q != c->rank) loomi_ctrl_queue_msg(c, q, type, 0, arg, NULL, 0);
}

/* ------------------------------------------------------------ failures */

void loomi_ctrl_set_revoked(struct loomi_ctrl *c, loom_result_t code, int failed, const char *why)
{
    if (atomic_load(&c->revoked)) return;
    c->code = code;
    c->failed_rank = failed;
    snprintf(c->why, sizeof c->why, "%s", why);
    atomic_store(&c->revoked, 1);
}

static void close_peer(struct peer *p)
{
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
    free(p->in);
    free(p->out);
    p->in = p->out = NULL;
    p->in_len = p->in_cap = p->out_off = p->out_len = p->out_cap = 0;
    loomi_seal_free(&p->stx);
    loomi_seal_free(&p->srx);
    p->hopen = 0;
}

/* p said goodbye before its connection ended: a departure, not a
 * failure (nothing is revoked), but it is out of later membership. */
static void depart_peer(struct loomi_ctrl *c, struct peer *p)
{
    close_peer(p);
    p->failed = 1;
    c->gen++;
    pthread_cond_broadcast(&c->cv);
}

/* Send what is queued to p without blocking: 0 when all of it went, 1
 * when the socket is full, -1 when it broke (errno says why). */
static int send_queued(struct peer *p)
{
    while (p->out_off < p->out_len) {
        ssize_t w = send(p->fd, p->out + p->out_off, p->out_len - p->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p->out_off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        return w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 1 : -1;
    }
    return 0;
}

/* Declare q failed (under mu): first reason revokes, every peer hears. */
void loomi_ctrl_fail_peer(struct loomi_ctrl *c, int q, const char *why)
{
    struct peer *p = &c->p[q];
    if (q >= c->n) { /* a joiner gone: its slot is free again */
        if (p->jstate == J_PENDING) c->npending--;
        int admitted = p->jstate == J_ADMITTED;
        close_peer(p);
        p->jstate = J_FREE;
        if (admitted) {
            p->failed = 1; /* until the membership round that admitted it ends */
            c->gen++;
            pthread_cond_broadcast(&c->cv);
        }
        LOOMI_INFO(c->rank, "control plane: joiner %d left: %s", q - c->n, why);
        return;
    }
    if (p->failed) return;
    /* Tell the rank itself, best effort, so that a stopped or cut-off
     * rank that comes back knows it is out (and does not take the
     * others' closed connections for their failures).  The notice goes
     * after what is queued already: silence is usually found right after
     * a heartbeat was queued, and a notice dropped then let the resumed
     * rank shrink into a communicator of its own. */
    if (q != c->rank && p->fd >= 0 &&
        loomi_ctrl_queue_msg(c, q, T_FAILED, 0, (uint64_t)q, NULL, 0) == 0)
        (void)send_queued(p); /* full or broken: the close below is all it gets */
    p->failed = 1;
    c->gen++;
    if (q == c->rank) {
        /* The others gave up on this rank (it was stopped or cut off):
         * it cannot take part in their membership any more.  A revoked
         * communicator keeps its first reason, so this one is made to
         * stand: whatever else this rank saw, it is out. */
        c->code = LOOM_ERR_REVOKED;
        c->failed_rank = q;
        snprintf(c->why, sizeof c->why, "%s", why);
        atomic_store(&c->revoked, 1);
    } else {
        close_peer(p);
        loomi_ctrl_set_revoked(c, LOOM_ERR_REMOTE, q, why);
        /* A rank that is out, or whose view is stale (its thread did not
         * run for a while), tells nobody: a connection the others closed
         * on it is not their failure, and its word would make healthy
         * ranks drop each other. */
        if (!c->p[c->rank].failed && loomi_now_ms() >= c->quiet_until)
            loomi_ctrl_queue_all(c, T_FAILED, (uint64_t)q);
    }
    LOOMI_WARN(c->rank, "control plane: rank %d failed: %s", q, why);
    pthread_cond_broadcast(&c->cv);
    wake(c);
}

/* ----------------------------------------------------------- receiving */

/* Send q the decision of agreement id, if this rank has it (under mu). */
int loomi_ctrl_answer_agreed(struct loomi_ctrl *c, int q, uint64_t id)
{
    for (int k = 0; k < AGREED_KEEP; k++)
        if (c->agreed[k].msg && c->agreed[k].id == id) {
            loomi_ctrl_queue_msg(c, q, LOOMI_CMSG_AGREED, 0, id, c->agreed[k].msg,
                                 c->agreed[k].len);
            return 1;
        }
    return 0;
}

const char *loomi_ctrl_mail_bad(int n, int q, uint16_t type, uint32_t len, unsigned held,
                                uint64_t bytes)
{
    if (q < 0 || q >= n + LOOMI_CTRL_MAX_JOINERS) return "a message from no peer";
    if (type < LOOMI_CMSG_GIVEUP || type > LOOMI_CMSG_MAX || type == LOOMI_CMSG_ACCEPT)
        return "a message of an unknown type";
    /* A joiner sends its address, nothing else: agreements, probes and
     * the rest index arrays by the sender's rank, which it has none of. */
    if (q >= n && type != LOOMI_CMSG_ADDR) return "a message of a type a joiner does not send";
    if (len > LOOMI_CTRL_MAX_PAYLOAD) return "a message too long";
    if (held >= LOOMI_CTRL_MAIL_MAX) return "more messages than this rank has taken";
    if (bytes > LOOMI_CTRL_MAIL_BYTES - len) return "more bytes than this rank has taken";
    return NULL;
}

/* Act on one complete message from peer q (under mu).  Returns -1 when
 * the peer broke the protocol. */
static int handle(struct loomi_ctrl *c, int q, const unsigned char *h, char *err, size_t errn)
{
    uint16_t type = (uint16_t)(h[4] | h[5] << 8);
    uint32_t src = get32(h + 8), epoch = get32(h + 12), len = get32(h + 24);
    uint64_t arg = get64(h + 16);
    if (q >= c->n) {
        struct peer *p = &c->p[q];
        if (p->jstate == J_HELLO) {
            if (type != T_JOIN || len != 0) {
                snprintf(err, errn, "a joiner's first message is not a join request");
                return -1;
            }
            p->jstate = J_PENDING;
            p->jsince = loomi_now_ms();
            c->npending++;
            LOOMI_INFO(c->rank, "control plane: a process asks to join (%d pending)", c->npending);
            return 0;
        }
        if (p->jstate != J_ADMITTED || type != LOOMI_CMSG_ADDR) {
            snprintf(err, errn, "unexpected message type %u from a joiner", type);
            return -1;
        }
    } else if ((int)src != q) {
        snprintf(err, errn, "message claims to come from rank %u", src);
        return -1;
    }
    switch (type) {
    case T_HB: return 0;
    case T_PENDING:
        atomic_store(&c->pending_seen, arg > 4096 ? 4096 : (int)arg);
        return 0;
    case T_BYE: c->p[q].bye = 1; return 0;
    case T_FAILED: {
        if (arg >= (uint64_t)c->n) {
            snprintf(err, errn, "FAILED names rank %llu of %d", (unsigned long long)arg, c->n);
            return -1;
        }
        int f = (int)arg;
        if (!c->p[f].failed) {
            char why[128];
            if (f == c->rank)
                snprintf(why, sizeof why, "rank %d declared this rank failed (silent too long)", q);
            else
                snprintf(why, sizeof why, "reported failed by rank %d", q);
            loomi_ctrl_fail_peer(c, f, why);
        }
        return 0;
    }
    case T_REVOKE:
        if (!atomic_load(&c->revoked)) {
            /* arg: the code, and above it the rank held responsible + 1. */
            uint64_t cv = arg & 0xffffffffu, hv = arg >> 32 & 0x7fffffffu;
            loom_result_t code = cv >= 2 && cv <= 13 ? (loom_result_t)cv : LOOM_ERR_REVOKED;
            int hint = hv >= 1 && hv <= (uint64_t)c->n ? (int)hv - 1 : -1;
            char why[200];
            if (arg & REVOKE_TWO_JOBS)
                snprintf(why, sizeof why, "revoked by rank %d: a rank of another job came to "
                         "this job's root address, which two jobs share (rank %d's error "
                         "names it)", q, q);
            else if (hint >= 0)
                snprintf(why, sizeof why, "reported by rank %d, which revoked the communicator", q);
            else
                snprintf(why, sizeof why, "revoked by rank %d", q);
            loomi_ctrl_set_revoked(c, code, hint, why);
            loomi_ctrl_queue_all(c, T_REVOKE, arg); /* forwarded once */
            pthread_cond_broadcast(&c->cv);
        }
        return 0;
    case T_AGREE_QUERY:
        loomi_ctrl_answer_agreed(c, q, arg);
        return 0;
    case LOOMI_CMSG_AGREE:
        /* A proposal for an agreement this rank decided already (the
         * sender took it for the coordinator after the one before
         * failed): the decision answers it, whatever this rank does now. */
        if (loomi_ctrl_answer_agreed(c, q, arg)) return 0;
        break;
    default:
        break;
    }
    const char *bad = loomi_ctrl_mail_bad(c->n, q, type, len, c->p[q].mb_held, c->p[q].mb_bytes);
    if (bad) {
        snprintf(err, errn, "%s (type %u, %u bytes)", bad, type, len);
        return -1;
    }
    struct loomi_cmsg *m = malloc(sizeof *m + len);
    if (!m) {
        snprintf(err, errn, "out of memory for a %u-byte message", len);
        return -1;
    }
    /* One initializer: a field left out (next) is zero. */
    *m = (struct loomi_cmsg){.type = type, .src = q, .epoch = epoch, .arg = arg, .len = len};
    memcpy(m->data, h + HDR_BYTES, len);
    c->p[q].mb_held++;
    c->p[q].mb_bytes += len;
    if (c->mb_tail) c->mb_tail->next = m;
    else c->mb_head = m;
    c->mb_tail = m;
    atomic_fetch_add_explicit(&c->mb_count, 1, memory_order_release);
    pthread_cond_broadcast(&c->cv);
    return 0;
}

/* Read what peer q sent and act on every complete message (under mu). */
static void peer_read(struct loomi_ctrl *c, int q, uint64_t now)
{
    struct peer *p = &c->p[q];
    char err[192] = "";
    int eof = 0, eno = 0;
    if (q >= c->n && p->jstate == J_AUTH) {
        /* Nothing but the handshake is read, and nothing allocated,
         * before the process proves it holds the job's key. */
        char why[200], a[80];
        int k = loomi_auth_accept_step(&p->auth, p->fd, c->key, why, sizeof why);
        if (k == 0) return;
        if (k < 0) {
            loomi_sockaddr_str((struct sockaddr *)&c->jaddr, a, sizeof a);
            char service[112];
            snprintf(service, sizeof service, "join service %s", a);
            loomi_auth_log_refusal(c->rank, service, p->fd, why);
            close_peer(p);
            p->jstate = J_FREE;
            return;
        }
        /* A joiner's messages are sealed as the job's are (LOOM_ENCRYPT);
         * a late rendezvous hello is answered in clear. */
        if (c->sealed && p->auth.id.kind == LOOMI_AUTH_JOIN &&
            loomi_seal_setup(&p->stx, &p->srx, p->auth.session, 0)) {
            close_peer(p);
            p->jstate = J_FREE;
            return;
        }
        p->jstate = J_HELLO; /* its request may have come already: read on */
    }
    for (;;) {
        if (p->in_cap - p->in_len < 65536) {
            size_t cap = p->in_cap ? p->in_cap * 2 : 131072;
            unsigned char *nb = realloc(p->in, cap);
            if (!nb) {
                loomi_ctrl_fail_peer(c, q, "out of memory reading its control messages");
                return;
            }
            p->in = nb;
            p->in_cap = cap;
        }
        ssize_t got = read(p->fd, p->in + p->in_len, p->in_cap - p->in_len);
        if (got > 0) {
            p->in_len += (size_t)got;
            p->last_heard_ms = now;
            continue;
        }
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        eof = 1; /* acted on after what came before it (a goodbye, say) */
        eno = got < 0 ? errno : 0;
        break;
    }
    if (q >= c->n && p->jstate == J_HELLO && p->auth.id.kind == LOOMI_AUTH_BOOT && p->in_len >= 4) {
        /* Not a joiner: a rank registering with the rendezvous, after
         * the job formed (bootstrap.c answers it). */
        char a[80], why[sizeof c->why];
        loomi_sockaddr_str((struct sockaddr *)&c->jaddr, a, sizeof a);
        int k = loomi_boot_late_hello(p->fd, p->in, p->in_len, c->keyed, a, why, sizeof why);
        if (k == 0 && !eof) return;
        if (k == 2 && !atomic_load(&c->revoked)) {
            LOOMI_WARN(c->rank, "control plane: %s", why);
            loomi_ctrl_set_revoked(c, LOOM_ERR_MISMATCH, -1, why);
            loomi_ctrl_queue_all(c, T_REVOKE, (uint64_t)LOOM_ERR_MISMATCH | REVOKE_TWO_JOBS);
            pthread_cond_broadcast(&c->cv);
        }
        if (k != -1) {
            close_peer(p);
            p->jstate = J_FREE;
            return;
        }
    }
    size_t off = 0;
    const int sealed = p->srx.ctx != NULL;
    for (;;) {
        unsigned char *h = p->in + off;
        size_t avail = p->in_len - off;
        if (sealed && !p->hopen) {
            /* The header opens before a byte of it is used. */
            if (avail < HDR_BYTES + LOOMI_SEAL_TAG) break;
            if (loomi_seal_open(&p->srx, LOOMI_SEAL_HDR, h, HDR_BYTES, h)) goto forged;
            p->hopen = 1;
        } else if (!sealed && avail < HDR_BYTES) {
            break;
        }
        uint32_t len = get32(h + 24);
        if (get32(h) != CTRL_MSG_MAGIC || len > LOOMI_CTRL_MAX_PAYLOAD) {
            snprintf(err, sizeof err, "protocol violation on its control connection "
                                      "(bad magic or a %u-byte payload)", len);
            loomi_ctrl_fail_peer(c, q, err);
            return;
        }
        size_t nrec = ((size_t)len + LOOMI_SEAL_MAX - 1) / LOOMI_SEAL_MAX;
        size_t flen = HDR_BYTES + (size_t)len + (sealed ? LOOMI_SEAL_TAG * (1 + nrec) : 0);
        if (avail < flen) break;
        if (sealed) {
            /* Each payload record opened in place, then closed up behind
             * the header, so the frame reads as a plain one. */
            unsigned char *src = h + HDR_BYTES + LOOMI_SEAL_TAG, *dst = h + HDR_BYTES;
            for (uint32_t at = 0; at < len;) {
                size_t k = LOOMI_MIN((size_t)(len - at), (size_t)LOOMI_SEAL_MAX);
                if (loomi_seal_open(&p->srx, LOOMI_SEAL_DATA, src, k, src)) goto forged;
                memmove(dst, src, k);
                dst += k;
                src += k + LOOMI_SEAL_TAG;
                at += (uint32_t)k;
            }
            p->hopen = 0;
        }
        char why[112];
        if (handle(c, q, h, why, sizeof why)) {
            snprintf(err, sizeof err, "protocol violation: %s", why);
            loomi_ctrl_fail_peer(c, q, err);
            return;
        }
        if (p->fd < 0) return; /* handle() failed this peer */
        off += flen;
    }
    if (off) {
        memmove(p->in, p->in + off, p->in_len - off);
        p->in_len -= off;
    }
    if (!eof) return;
    /* A goodbye makes it a departure, not a failure (nothing is
     * revoked), but it is out of later membership. */
    if (p->bye) {
        depart_peer(c, p);
        return;
    }
    snprintf(err, sizeof err, "its control connection broke (%s)",
             eno ? strerror(eno) : "closed");
    loomi_ctrl_fail_peer(c, q, err);
    return;
forged:
    snprintf(err, sizeof err, "a record on its control connection failed authentication: "
                              "tampered or replayed");
    loomi_ctrl_fail_peer(c, q, err);
}

static void peer_write(struct loomi_ctrl *c, int q)
{
    struct peer *p = &c->p[q];
    int rc = send_queued(p);
    if (rc > 0) return;
    if (rc < 0) {
        int eno = errno;
        /* What the peer sent before it closed still counts (a decision,
         * a goodbye): a reset connection keeps it readable, so read it
         * before calling the peer failed. */
        peer_read(c, q, loomi_now_ms());
        if (p->fd < 0) return; /* peer_read saw the end: departed or failed */
        if (p->bye) {
            depart_peer(c, p);
            return;
        }
        char err[96];
        snprintf(err, sizeof err, "its control connection broke (%s)", strerror(eno));
        loomi_ctrl_fail_peer(c, q, err);
        return;
    }
    p->out_off = p->out_len = 0;
}

/* -------------------------------------------------------- join service */

static int holder(const struct loomi_ctrl *c)
{
    for (int q = 0; q < c->n; q++)
        if (!c->p[q].failed) return q;
    return -1;
}

/* A joiner slot is free: the join service takes another connection. */
static int joiner_slot_free(const struct loomi_ctrl *c)
{
    for (int j = 0; j < LOOMI_CTRL_MAX_JOINERS; j++)
        if (c->p[c->n + j].jstate == J_FREE && c->p[c->n + j].fd < 0) return 1;
    return 0;
}

static void accept_joiner(struct loomi_ctrl *c, uint64_t now)
{
    int fd = accept4(c->jfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            /* The connection stays in the backlog: look again shortly,
             * rather than spin on a listening socket that stays ready. */
            LOOMI_WARN(c->rank, "join service: cannot accept a connection: %s (%s); trying "
                                "again in 100 ms", strerror(errno), loomi_errno_name(errno));
            c->jpause_until = now + 100;
        }
        return;
    }
    for (int j = 0; j < LOOMI_CTRL_MAX_JOINERS; j++) {
        struct peer *p = &c->p[c->n + j];
        if (p->jstate != J_FREE || p->fd >= 0) continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        p->fd = fd;
        p->failed = p->bye = 0;
        p->jstate = J_AUTH;
        loomi_auth_accept_init(&p->auth, 1u << LOOMI_AUTH_JOIN | 1u << LOOMI_AUTH_BOOT, -1);
        p->jsince = now;
        p->last_heard_ms = now;
        return;
    }
    LOOMI_WARN(c->rank, "control plane: %d joiners already wait; refusing another",
               LOOMI_CTRL_MAX_JOINERS);
    close(fd);
}

/* The holder's duties, each round of the thread (under mu). */
static void serve_joins(struct loomi_ctrl *c, uint64_t now, int *gossiped)
{
    if (!c->serve) return;
    if (holder(c) != c->rank) return;
    if (c->jfd < 0 && now >= c->next_bind_ms) {
        /* The bootstrap root or the previous holder may still hold the
         * address: try again shortly. */
        c->next_bind_ms = now + 200;
        int fd = socket(c->jaddr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        int one = 1;
        if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        int ok = fd >= 0 && bind(fd, (struct sockaddr *)&c->jaddr, c->jaddr_len) == 0 &&
                 listen(fd, 64) == 0;
        if (!ok && errno == EADDRNOTAVAIL) {
            /* The address is another host's: this rank cannot hold it. */
            LOOMI_INFO(c->rank, "control plane: the rendezvous address is not on this host; "
                                "no joiners can be admitted here");
            c->serve = 0;
        }
        if (ok) {
            c->jfd = fd;
            char a[80];
            loomi_sockaddr_str((struct sockaddr *)&c->jaddr, a, sizeof a);
            LOOMI_INFO(c->rank, "control plane: admitting joiners at %s", a);
        } else if (fd >= 0) {
            close(fd);
        }
    }
    for (int j = 0; j < LOOMI_CTRL_MAX_JOINERS; j++) {
        struct peer *p = &c->p[c->n + j];
        if ((p->jstate == J_AUTH || p->jstate == J_HELLO) && now - p->jsince > JOIN_HELLO_MS) {
            loomi_auth_log_refusal(c->rank, "join service", p->fd,
                                   p->jstate == J_AUTH ? "no handshake in time"
                                                       : "no request in time");
            loomi_ctrl_fail_peer(c, c->n + j, "no hello in time");
        }
        else if (p->jstate == J_CLOSING && p->out_off == p->out_len) {
            close_peer(p);
            p->jstate = J_FREE;
        }
    }
    /* Every rank keeps the count, so checking for joiners costs nothing. */
    if (c->npending != *gossiped) {
        *gossiped = c->npending;
        atomic_store(&c->pending_seen, c->npending);
        for (int q = 0; q < c->n; q++)
            if (q != c->rank)
                loomi_ctrl_queue_msg(c, q, T_PENDING, 0, (uint64_t)c->npending, NULL, 0);
    }
}

/* -------------------------------------------------------------- thread */

static void *ctrl_main(void *arg)
{
    struct loomi_ctrl *c = arg;
    const int all = c->n + LOOMI_CTRL_MAX_JOINERS;
    /* Named, so that top -H, gdb and the tests can tell it apart. */
    pthread_setname_np(pthread_self(), "loom-ctrl");
    struct pollfd *pf = malloc(sizeof *pf * (size_t)(all + 2));
    int *who = malloc(sizeof *who * (size_t)(all + 2));
    int gossiped = 0;
    if (!pf || !who) {
        pthread_mutex_lock(&c->mu);
        loomi_ctrl_set_revoked(c, LOOM_ERR_NO_MEMORY, -1, "control plane: out of memory");
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        free(pf);
        free(who);
        return NULL;
    }
    uint64_t next_hb = loomi_now_ms();
    uint64_t stop_by = 0, last_top = 0;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        uint64_t now = loomi_now_ms();
        int away = 0;
        if (c->stop) {
            /* Flush the goodbyes for a short while, then leave. */
            int pending = 0;
            for (int q = 0; q < all; q++)
                if (c->p[q].fd >= 0 && c->p[q].out_off < c->p[q].out_len) pending = 1;
            if (!stop_by) stop_by = now + 200;
            if (!pending || now >= stop_by) break;
        } else if (c->hb_ms > 0) {
            if (now >= next_hb) {
                for (int q = 0; q < c->n; q++) {
                    struct peer *p = &c->p[q];
                    if (q == c->rank || p->fd < 0) continue;
                    /* One heartbeat waiting is enough for a peer not reading. */
                    if (p->out_off == p->out_len) loomi_ctrl_queue_msg(c, q, T_HB, 0, 0, NULL, 0);
                }
                next_hb = now + (uint64_t)c->hb_ms;
            }
            uint64_t limit = (uint64_t)c->hb_ms * LOOMI_CTRL_MISSES;
            /* This thread itself was not running (the process was
             * stopped, or starved): what the peers sent meanwhile is
             * unread, so read it before calling anyone silent. */
            away = last_top && now - last_top > limit / 2;
            if (away) c->quiet_until = now + limit;
            for (int q = 0; q < c->n && !away; q++) {
                struct peer *p = &c->p[q];
                if (q == c->rank || p->fd < 0 || p->bye) continue;
                if (now - p->last_heard_ms > limit) {
                    char why[96];
                    snprintf(why, sizeof why, "silent for %llu ms (%d heartbeats of %d ms)",
                             (unsigned long long)(now - p->last_heard_ms), LOOMI_CTRL_MISSES,
                             c->hb_ms);
                    loomi_ctrl_fail_peer(c, q, why);
                }
            }
        }
        if (!c->stop) serve_joins(c, now, &gossiped);
        int nf = 0;
        pf[nf].fd = c->wake[0];
        pf[nf].events = POLLIN;
        who[nf++] = -1;
        /* While every joiner slot is taken (strangers are dropped within
         * JOIN_HELLO_MS) connections wait in the backlog. */
        if (c->jfd >= 0 && now >= c->jpause_until && joiner_slot_free(c)) {
            pf[nf].fd = c->jfd;
            pf[nf].events = POLLIN;
            who[nf++] = -2;
        }
        for (int q = 0; q < all; q++) {
            struct peer *p = &c->p[q];
            if (p->fd < 0) continue;
            pf[nf].fd = p->fd;
            pf[nf].events = POLLIN | (p->out_off < p->out_len ? POLLOUT : 0);
            who[nf++] = q;
        }
        int tmo = c->stop ? 20 : c->hb_ms > 0 ? loomi_ms_left(next_hb) : 1000;
        if (!c->stop && c->hb_ms > 0) {
            /* Also wake when a peer would pass the silence limit, so that
             * it is judged then, not at the next heartbeat. */
            uint64_t limit = (uint64_t)c->hb_ms * LOOMI_CTRL_MISSES;
            for (int q = 0; q < c->n; q++) {
                const struct peer *p = &c->p[q];
                if (q == c->rank || p->fd < 0 || p->bye) continue;
                int w = loomi_ms_left(p->last_heard_ms + limit + 1);
                if (w < tmo) tmo = w;
            }
        }
        if (c->serve && tmo > 200) tmo = 200; /* binding, hello deadlines */
        if (away) tmo = 0;
        last_top = now;
        pthread_mutex_unlock(&c->mu);
        int rc = poll(pf, (nfds_t)nf, tmo);
        pthread_mutex_lock(&c->mu);
        if (rc < 0 && errno != EINTR) {
            loomi_ctrl_set_revoked(c, LOOM_ERR_SYSTEM, -1, "control plane: poll failed");
            pthread_cond_broadcast(&c->cv);
            break;
        }
        if (rc <= 0) continue;
        now = loomi_now_ms();
        for (int i = 0; i < nf; i++) {
            if (!pf[i].revents) continue;
            if (who[i] == -1) {
                char buf[64];
                while (read(c->wake[0], buf, sizeof buf) > 0) {}
                continue;
            }
            if (who[i] == -2) {
                accept_joiner(c, now);
                continue;
            }
            int q = who[i];
            if (c->p[q].fd != pf[i].fd) continue; /* closed meanwhile */
            if (pf[i].revents & (POLLIN | POLLHUP | POLLERR)) peer_read(c, q, now);
            if (c->p[q].fd >= 0 && (pf[i].revents & POLLOUT)) peer_write(c, q);
        }
        /* Messages queued while handling input go out now. */
        for (int q = 0; q < all; q++)
            if (c->p[q].fd >= 0 && c->p[q].out_off < c->p[q].out_len) peer_write(c, q);
    }
    pthread_mutex_unlock(&c->mu);
    free(pf);
    free(who);
    return NULL;
}

/* ------------------------------------------------------------- set up */

loom_result_t loomi_ctrl_create(int rank, int nranks, const unsigned char key[LOOMI_AUTH_KEY_BYTES],
                                int heartbeat_ms, const struct sockaddr *bind_sa,
                                socklen_t bind_len, struct loomi_ctrl **out)
{
    struct loomi_ctrl *c = calloc(1, sizeof *c);
    if (!c) return loomi_fail(LOOM_ERR_NO_MEMORY, rank, "control plane: out of memory");
    c->rank = rank;
    c->n = nranks;
    memcpy(c->key, key, sizeof c->key);
    c->hb_ms = heartbeat_ms;
    c->lfd = -1;
    c->wake[0] = c->wake[1] = -1;
    c->failed_rank = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->p = calloc((size_t)nranks + LOOMI_CTRL_MAX_JOINERS, sizeof *c->p);
    if (!c->p) goto nomem;
    for (int q = 0; q < nranks + LOOMI_CTRL_MAX_JOINERS; q++) c->p[q].fd = -1;
    c->jfd = -1;
    if (getrandom(&c->nonce, sizeof c->nonce, 0) != (ssize_t)sizeof c->nonce)
        c->nonce = loomi_now_ns() ^ ((uint64_t)getpid() << 32);
    if (pipe2(c->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        loomi_ctrl_destroy(c, 0);
        return loomi_fail(LOOM_ERR_SYSTEM, rank, "control plane: pipe: %s", strerror(errno));
    }
    if (nranks > 1) {
        if (bind_len > sizeof c->laddr) bind_len = sizeof c->laddr;
        memcpy(&c->laddr, bind_sa, bind_len);
        c->laddr_len = bind_len;
        if (c->laddr.ss_family == AF_INET) ((struct sockaddr_in *)&c->laddr)->sin_port = 0;
        else ((struct sockaddr_in6 *)&c->laddr)->sin6_port = 0;
        c->lfd = socket(c->laddr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        char a[80];
        loomi_sockaddr_str((struct sockaddr *)&c->laddr, a, sizeof a);
        if (c->lfd < 0 || bind(c->lfd, (struct sockaddr *)&c->laddr, c->laddr_len) != 0 ||
            listen(c->lfd, 4096) != 0 ||
            getsockname(c->lfd, (struct sockaddr *)&c->laddr, &c->laddr_len) != 0) {
            int e = errno;
            loomi_ctrl_destroy(c, 0);
            return loomi_fail(LOOM_ERR_SYSTEM, rank, "control plane: cannot listen on %s: %s", a,
                              strerror(e));
        }
    }
    *out = c;
    return LOOM_SUCCESS;
nomem:
    loomi_ctrl_destroy(c, 0);
    return loomi_fail(LOOM_ERR_NO_MEMORY, rank, "control plane: out of memory");
}

void loomi_ctrl_addr(const struct loomi_ctrl *c, unsigned char *out)
{
    memset(out, 0, LOOMI_CTRL_ADDR_BYTES);
    put32(out, CTRL_ADDR_MAGIC);
    put32(out + 4, CTRL_VERSION);
    put64(out + 8, c->nonce);
    struct loomi_wire_addr w;
    memset(&w, 0, sizeof w);
    if (c->lfd >= 0) loomi_sockaddr_to_wire((const struct sockaddr *)&c->laddr, &w);
    memcpy(out + 16, &w, sizeof w);
}

static void set_socket(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

void loomi_ctrl_set_sealed(struct loomi_ctrl *c) { c->sealed = 1; }

loom_result_t loomi_ctrl_start(struct loomi_ctrl *c, const unsigned char *addrs, size_t stride,
                               uint64_t deadline_ms)
{
    const int me = c->rank;
    unsigned char session[LOOMI_AUTH_SESSION_BYTES];
    unsigned char *sess = c->sealed ? session : NULL;
    loom_result_t r = LOOM_SUCCESS;
    int lost[8], nlost = 0;
    char lost_why[8][160];
    /* Higher ranks are connected to (their listeners exist: addresses
     * are published only after listening), lower ranks are accepted. */
    for (int q = me + 1; q < c->n; q++) {
        const unsigned char *a = addrs + (size_t)q * stride;
        if (get32(a) != CTRL_ADDR_MAGIC || get32(a + 4) != CTRL_VERSION)
            return loomi_fail(LOOM_ERR_MISMATCH, me,
                              "control plane: rank %d's address is not a control address "
                              "(another Loom version?)", q);
        struct loomi_wire_addr w;
        memcpy(&w, a + 16, sizeof w);
        struct sockaddr_storage ss;
        socklen_t sl;
        if (loomi_wire_to_sockaddr(&w, &ss, &sl))
            return loomi_fail(LOOM_ERR_MISMATCH, me, "control plane: rank %d's address is invalid",
                              q);
        char msg[160];
        int fd = loomi_connect_retry((struct sockaddr *)&ss, sl, deadline_ms, msg, sizeof msg);
        if (fd < 0)
            return loomi_fail(LOOM_ERR_CONNECT, me, "control plane: cannot reach rank %d: %s", q,
                              msg);
        /* The handshake waits for rank q to answer: a rank that died or
         * stopped since it published its address is failed (below), as
         * its broken connection would have failed it, not waited for
         * until the deadline; another job's is an error. */
        struct loomi_auth_id id = {LOOMI_AUTH_CTRL, me, q, 0};
        uint64_t ad = loomi_now_ms() + LOOMI_AUTH_WAIT_MS;
        if (loomi_auth_open(fd, c->key, &id, ad < deadline_ms ? ad : deadline_ms, sess, msg,
                            sizeof msg)) {
            close(fd);
            if (strstr(msg, "does not hold this job's key"))
                return loomi_fail(LOOM_ERR_MISMATCH, me,
                                  "control plane: handshake with rank %d: %s", q, msg);
            if (nlost < (int)(sizeof lost / sizeof lost[0])) {
                lost[nlost] = q;
                snprintf(lost_why[nlost], sizeof lost_why[nlost],
                         "its control connection failed in the handshake (%.80s)", msg);
                nlost++;
                continue;
            }
            return loomi_fail(LOOM_ERR_REMOTE, me,
                              "control plane: handshakes with %d ranks failed, the last with "
                              "rank %d: %s", nlost + 1, q, msg);
        }
        /* Begins as net.h's struct loomi_greeting: magic, from, to. */
        unsigned char h[HELLO_BYTES];
        memset(h, 0, sizeof h); /* bytes 16-23, 32-39, 44-47: unused */
        put32(h, CTRL_HELLO_MAGIC);
        put32(h + 4, (uint32_t)me);
        put32(h + 8, (uint32_t)q);
        put32(h + 12, CTRL_VERSION);
        memcpy(h + 24, a + 8, 8); /* the target's nonce */
        put32(h + 40, (uint32_t)c->n);
        if (loomi_write_full(fd, h, sizeof h, deadline_ms)) {
            close(fd);
            return loomi_fail(LOOM_ERR_CONNECT, me, "control plane: handshake with rank %d: %s", q,
                              strerror(errno));
        }
        if (sess && loomi_seal_setup(&c->p[q].stx, &c->p[q].srx, sess, 1)) {
            close(fd);
            return loomi_fail(LOOM_ERR_NO_MEMORY, me, "control plane: cannot set up sealing");
        }
        c->p[q].fd = fd;
    }
    /* Lower ranks are accepted as tcp's streams are (net.c): every
     * connection proving itself at once, strangers dropped. */
    int need = me;
    struct loomi_acceptor ac;
    loomi_acceptor_init(&ac, c->lfd, CTRL_HELLO_MAGIC, me, "control plane");
    while (need > 0) {
        unsigned char h[HELLO_BYTES];
        char why[200];
        int fd = loomi_accept_greeting(&ac, 0, me, c->key, LOOMI_AUTH_CTRL, h, sizeof h, sess,
                                       deadline_ms, why, sizeof why);
        if (fd < 0)
            return loomi_accept_error(&ac, fd, me - need, me,
                                      "connections from lower ranks arrived", why, NULL);
        int from = (int)get32(h + 4);
        if (get32(h + 12) != CTRL_VERSION || get64(h + 24) != c->nonce ||
            get32(h + 40) != (uint32_t)c->n || c->p[from].fd >= 0) {
            loomi_auth_log_refusal(me, "control plane", fd,
                                   c->p[from].fd >= 0 ? "a second connection from its rank"
                                                      : "a hello of another communicator");
            close(fd);
            continue;
        }
        if (sess && loomi_seal_setup(&c->p[from].stx, &c->p[from].srx, sess, 0)) {
            close(fd);
            loomi_acceptor_close(&ac);
            return loomi_fail(LOOM_ERR_NO_MEMORY, me, "control plane: cannot set up sealing");
        }
        c->p[from].fd = fd;
        need--;
    }
    loomi_acceptor_finish(&ac, &c->lfd);
    uint64_t now = loomi_now_ms();
    for (int q = 0; q < c->n; q++) {
        c->p[q].last_heard_ms = now;
        if (c->p[q].fd >= 0) set_socket(c->p[q].fd);
    }
    if (c->lfd >= 0) close(c->lfd);
    c->lfd = -1;
    pthread_mutex_lock(&c->mu);
    for (int k = 0; k < nlost; k++) loomi_ctrl_fail_peer(c, lost[k], lost_why[k]);
    pthread_mutex_unlock(&c->mu);
    if (c->n > 1) {
        if (pthread_create(&c->thread, NULL, ctrl_main, c) != 0)
            return loomi_fail(LOOM_ERR_SYSTEM, me, "control plane: cannot start its thread");
        c->started = 1;
    }
    return r;
}

void loomi_ctrl_destroy(struct loomi_ctrl *c, int polite)
{
    if (!c) return;
    if (c->started) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        if (polite) loomi_ctrl_queue_all(c, T_BYE, 0);
        pthread_mutex_unlock(&c->mu);
        wake(c);
        pthread_join(c->thread, NULL);
    }
    if (c->p)
        for (int q = 0; q < c->n + LOOMI_CTRL_MAX_JOINERS; q++) close_peer(&c->p[q]);
    if (c->jfd >= 0) close(c->jfd);
    free(c->p);
    while (c->mb_head) {
        struct loomi_cmsg *m = c->mb_head;
        c->mb_head = m->next;
        free(m);
    }
    for (int k = 0; k < AGREED_KEEP; k++) free(c->agreed[k].msg);
    if (c->lfd >= 0) close(c->lfd);
    if (c->wake[0] >= 0) close(c->wake[0]);
    if (c->wake[1] >= 0) close(c->wake[1]);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
