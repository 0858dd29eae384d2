/*
 * tcp.c - the TCP transport.
 *
 * Every pair of ranks is joined by `streams` sockets.  A message is cut
 * into pieces spread over the least-loaded streams; each piece carries a
 * header (tag, message length, offset, piece length), so pieces may
 * arrive in any order and land straight in the receiver's buffer when its
 * receive is posted (zero copy), or in an unexpected-message buffer when
 * it is not yet (match.c keeps both).  Sockets are non-blocking, driven
 * by one epoll set per communicator, written with scatter-gather
 * sendmsg.  Every header is range-checked before its payload is read
 * anywhere.
 *
 * With LOOM_ENCRYPT=1 every stream is sealed (seal.h) under the key
 * material of its own handshake: a piece goes as its header, sealed as
 * one record (so its lengths are trusted before they are used), and its
 * payload as records of up to LOOMI_SEAL_MAX bytes.  The sender seals
 * into a staging buffer per stream (ebuf) and writes that; the receiver
 * reads each record whole into rbuf and opens it into where the bytes
 * go, so a piece counts as received only once every record of it has
 * opened.  A record that does not open fails its peer.  The plain path
 * is untouched: the choice is made once per flush or read.
 *
 * This file holds the connections' lifetime: creating the transport, its
 * listening address, connecting every pair of ranks (connect_all,
 * attach), control messages, abort and the polite close (destroy).
 * tcp_data.c holds the data path (pieces, sealing, reading, isend /
 * irecv / cancel / progress) and the ops table; tcp_internal.h the state
 * both use.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transports/auth.h"
#include "transports/tcp/tcp_internal.h"

/* -------------------------------------------------------------- set-up */

static void set_sock_opts(struct tcp *t, int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (t->ctx.sock.sockbuf) {
        int b = (int)LOOMI_MIN(t->ctx.sock.sockbuf, (size_t)1 << 30);
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof b);
    }
}

loom_result_t loomi_tcp_create(const struct loomi_tctx *ctx, void **state)
{
    struct tcp *t = calloc(1, sizeof *t);
    if (!t) return loomi_fail(LOOM_ERR_NO_MEMORY, ctx->rank, "tcp: out of memory");
    t->ctx = *ctx;
    loomi_match_init(&t->match, &t->ctx, sizeof(struct unexp), UNEXP_LIMIT, loomi_tcp_match_fail,
                     t);
    t->nstreams = ctx->sock.streams < 1 ? 1 : ctx->sock.streams;
    t->sealed = ctx->sock.encrypt != 0;
    t->lfd = t->epfd = -1;
    t->peers = calloc((size_t)ctx->nranks, sizeof *t->peers);
    if (!t->peers) goto nomem;
    for (int r = 0; r < ctx->nranks; r++) {
        t->peers[r].rank = r;
        t->peers[r].s = calloc((size_t)all_streams(t), sizeof(struct stream));
        if (!t->peers[r].s) goto nomem;
        for (int i = 0; i < all_streams(t); i++) {
            t->peers[r].s[i].fd = -1;
            t->peers[r].s[i].idx = i;
            t->peers[r].s[i].peer = &t->peers[r];
        }
    }
    *state = t; /* from here on, destroy() cleans up */
    loom_result_t lr = loomi_listen_address("tcp", ctx->rank, ctx->sock.ifname,
                                            ctx->sock.bind_hint, ctx->sock.bind_hint_len,
                                            &t->laddr, &t->laddr_len);
    if (lr != LOOM_SUCCESS) return lr;
    t->lfd = socket(t->laddr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (t->lfd < 0) return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "tcp: socket: %s", strerror(errno));
    set_sock_opts(t, t->lfd); /* accepted sockets inherit the buffer sizes */
    char a[80];
    loomi_sockaddr_str((struct sockaddr *)&t->laddr, a, sizeof a);
    if (bind(t->lfd, (struct sockaddr *)&t->laddr, t->laddr_len) != 0 ||
        listen(t->lfd, 4096) != 0 ||
        getsockname(t->lfd, (struct sockaddr *)&t->laddr, &t->laddr_len) != 0)
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "tcp: cannot listen on %s: %s", a,
                          strerror(errno));
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (t->epfd < 0)
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "tcp: epoll_create1: %s", strerror(errno));
    return LOOM_SUCCESS;
nomem:
    if (t->peers)
        for (int r = 0; r < ctx->nranks; r++) free(t->peers[r].s);
    free(t->peers);
    free(t);
    return loomi_fail(LOOM_ERR_NO_MEMORY, ctx->rank, "tcp: out of memory");
}

loom_result_t loomi_tcp_local_addr(void *state, void *buf, size_t *len)
{
    struct tcp *t = state;
    struct loomi_wire_addr w;
    if (*len < sizeof w || loomi_sockaddr_to_wire((struct sockaddr *)&t->laddr, &w))
        return loomi_fail(LOOM_ERR_INTERNAL, t->ctx.rank, "tcp: cannot describe local address");
    memcpy(buf, &w, sizeof w);
    *len = sizeof w;
    return LOOM_SUCCESS;
}

/* session: the connection's key material (sealed only); opener: this
 * rank opened it. */
static loom_result_t attach(struct tcp *t, int peer, int idx, int fd,
                            const unsigned char *session, int opener)
{
    struct stream *s = &t->peers[peer].s[idx];
    if (s->fd >= 0) {
        close(fd);
        return loomi_fail(LOOM_ERR_MISMATCH, t->ctx.rank,
                          "tcp: rank %d opened stream %d twice", peer, idx);
    }
    if (t->sealed && loomi_seal_setup(&s->stx, &s->srx, session, opener)) {
        close(fd);
        return loomi_fail(LOOM_ERR_NO_MEMORY, t->ctx.rank, "tcp: cannot set up sealing (libcrypto)");
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        close(fd);
        return loomi_fail(LOOM_ERR_SYSTEM, t->ctx.rank, "tcp: fcntl: %s", strerror(errno));
    }
    set_sock_opts(t, fd);
    s->fd = fd;
    s->writable = 1;
    t->peers[peer].open++;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = s};
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
        return loomi_fail(LOOM_ERR_SYSTEM, t->ctx.rank, "tcp: epoll_ctl: %s", strerror(errno));
    return LOOM_SUCCESS;
}

loom_result_t loomi_tcp_connect_all(void *state, const unsigned char *addrs, size_t addr_len,
                                    uint64_t deadline_ms)
{
    struct tcp *t = state;
    const int me = t->ctx.rank, n = t->ctx.nranks, ns = t->nstreams;
    struct hello h;
    unsigned char session[LOOMI_AUTH_SESSION_BYTES];
    unsigned char *sess = t->sealed ? session : NULL;
    memset(&h, 0, sizeof h);
    h.magic = HELLO_MAGIC;
    h.src = me;
    h.nstreams = ns;
    /* Lower ranks listen for us; their backlog takes the connection even
     * while they are busy connecting elsewhere, so this cannot deadlock. */
    for (int peer = 0; peer < me; peer++) {
        struct loomi_wire_addr w;
        memcpy(&w, addrs + (size_t)peer * addr_len, sizeof w);
        for (int i = 0; i <= ns; i++) { /* data streams, then control */
            loom_result_t r;
            int fd = loomi_connect_peer(&w, peer, deadline_ms, "tcp", me, t->ctx.job_key,
                                        LOOMI_AUTH_TCP, (uint32_t)i, sess, &r);
            if (fd < 0) return r;
            h.dst = peer;
            h.stream = i;
            if (loomi_write_full(fd, &h, sizeof h, deadline_ms)) {
                int e = errno;
                close(fd);
                return loomi_fail(LOOM_ERR_CONNECT, me, "tcp: greeting rank %d: %s", peer,
                                  strerror(e));
            }
            r = attach(t, peer, i, fd, sess, 1);
            if (r != LOOM_SUCCESS) return r;
        }
    }
    /* Streams from higher ranks: net.c's acceptor, as verbs' queue pair
     * exchanges; the errors say what each waits for. */
    int expected = (n - 1 - me) * (ns + 1), got = 0;
    struct loomi_acceptor ac;
    loomi_acceptor_init(&ac, t->lfd, HELLO_MAGIC, me, "tcp");
    for (char why[200]; got < expected;) {
        struct hello in;
        int fd = loomi_accept_greeting(&ac, me + 1, n, t->ctx.job_key, LOOMI_AUTH_TCP, &in,
                                       sizeof in, sess, deadline_ms, why, sizeof why);
        if (fd < 0) {
            int missing = -1;
            for (int peer = me + 1; peer < n && missing < 0; peer++)
                for (int i = 0; i <= ns; i++)
                    if (t->peers[peer].s[i].fd < 0) missing = peer;
            char more[120];
            snprintf(more, sizeof more, " (%d from each: %d data stream(s) and a control "
                     "stream); rank %d did not connect", ns + 1, ns, missing);
            return loomi_accept_error(&ac, fd, got, expected,
                                      "connections from higher ranks arrived", why, more);
        }
        if (in.stream < 0 || in.stream > ns || in.nstreams != ns) {
            LOOMI_WARN(me, "tcp: dropped a connection from rank %d: stream %d, %d data "
                           "stream(s) a peer where this rank has %d", in.src, in.stream,
                       in.nstreams, ns);
            close(fd);
            continue;
        }
        loom_result_t r = attach(t, in.src, in.stream, fd, sess, 0);
        if (r != LOOM_SUCCESS) {
            loomi_acceptor_close(&ac);
            return r;
        }
        got++;
    }
    return loomi_acceptor_finish(&ac, &t->lfd);
}

static struct wire_hdr control_hdr(int type, uint64_t tag, int aux)
{
    struct wire_hdr h;
    memset(&h, 0, sizeof h);
    h.magic = TCP_MAGIC;
    h.type = (uint16_t)type;
    h.tag = tag;
    h.aux = aux;
    return h;
}

/* A control header as it goes on s: plain, or sealed as the stream's
 * next record; its length to *n.  0, or -1 (it cannot be sealed). */
static int control_bytes(struct tcp *t, struct stream *s, const struct wire_hdr *h,
                         unsigned char out[HREC], size_t *n)
{
    if (!t->sealed) {
        memcpy(out, h, sizeof *h);
        *n = sizeof *h;
        return 0;
    }
    *n = HREC;
    return loomi_seal(&s->stx, LOOMI_SEAL_HDR, h, sizeof *h, out);
}

/* Best effort: a control header written only where no piece is half
 * sent (else the stream would desync); never blocks. */
void loomi_tcp_send_control(struct tcp *t, struct peer *p, int type, uint64_t tag, int aux)
{
    struct wire_hdr h = control_hdr(type, tag, aux);
    /* The control stream first: nothing else is ever queued on it. */
    for (int k = 0; k < all_streams(t); k++) {
        struct stream *s = &p->s[(k + t->nstreams) % all_streams(t)];
        if (s->fd < 0) continue;
        if (s->sq_head && (s->sq_head->hdr_sent || s->sq_head->sent)) continue;
        if (s->eoff < s->elen) continue; /* sealed records half written */
        unsigned char b[HREC];
        size_t n;
        if (control_bytes(t, s, &h, b, &n)) continue;
        ssize_t w = send(s->fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w == (ssize_t)n) return;
        if (w > 0) return; /* partial: the stream is now garbage, but it closes next */
    }
}

void loomi_tcp_abort_all(void *state, int failed, loom_result_t code)
{
    struct tcp *t = state;
    if (t->aborted) return;
    t->aborted = 1;
    for (int r = 0; r < t->ctx.nranks; r++) {
        struct peer *p = &t->peers[r];
        if (r == t->ctx.rank || p->failed) continue;
        loomi_tcp_send_control(t, p, T_ABORT, (uint64_t)code, failed);
        loomi_tcp_peer_down(t, p, failed, code, "communicator aborted", 0);
    }
}

void loomi_tcp_destroy(void *state)
{
    struct tcp *t = state;
    if (!t) return;
    /* Polite close: goodbye on every stream, then wait (bounded) for the
     * peers' end of stream so no unread byte turns our close into a reset
     * that could destroy data they have not read yet. */
    uint64_t deadline = loomi_now_ms() + 10000;
    for (int r = 0; r < t->ctx.nranks && !t->aborted; r++) {
        struct peer *p = &t->peers[r];
        if (r == t->ctx.rank || p->failed) continue;
        for (int i = 0; i < all_streams(t); i++) {
            struct stream *s = &p->s[i];
            if (s->fd < 0 || s->sq_head || s->eoff < s->elen) continue;
            struct wire_hdr h = control_hdr(T_BYE, 0, 0);
            unsigned char b[HREC];
            size_t n;
            if (control_bytes(t, s, &h, b, &n) == 0 && loomi_write_full(s->fd, b, n, deadline) == 0)
                shutdown(s->fd, SHUT_WR);
        }
    }
    for (int r = 0; r < t->ctx.nranks && !t->aborted; r++) {
        struct peer *p = &t->peers[r];
        for (int i = 0; i < all_streams(t) && !p->failed; i++)
            if (p->s[i].fd >= 0) loomi_await_close(p->s[i].fd, deadline);
    }
    for (int r = 0; r < t->ctx.nranks; r++) {
        struct peer *p = &t->peers[r];
        if (!p->s) continue;
        loomi_tcp_peer_down(t, p, -1, LOOM_ERR_REVOKED, "communicator destroyed", 0);
        for (int i = 0; i < all_streams(t); i++) {
            loomi_seal_free(&p->s[i].stx);
            loomi_seal_free(&p->s[i].srx);
            free(p->s[i].ebuf);
            free(p->s[i].rbuf);
        }
        free(p->s);
        free(p->rt);
    }
    free(t->peers);
    loomi_match_fini(&t->match);
    loomi_objpool_clear(&t->pieces);
    if (t->lfd >= 0) close(t->lfd);
    if (t->epfd >= 0) close(t->epfd);
    free(t);
}
