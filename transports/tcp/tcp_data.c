/*
 * tcp_data.c - the TCP transport's data path: failing a peer, cutting a
 * message into pieces over the streams, sealing and flushing them, the
 * check of the pieces of a message (tiling), reading headers and
 * payloads into posted receives or early-message buffers, the isend /
 * irecv / cancel / progress calls, and the ops table.  tcp.c says how
 * the transport works and holds the connections' lifetime.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transports/tcp/tcp_internal.h"

/* ------------------------------------------------------------- helpers */

static struct piece *piece_new(struct tcp *t)
{
    return loomi_objpool_get(&t->pieces, sizeof(struct piece));
}

static void piece_free(struct tcp *t, struct piece *p)
{
    free(p->own);
    p->own = NULL;
    loomi_objpool_put(&t->pieces, p);
}

/* Marker that a send transfer has already been completed with an error
 * (its other pieces must not complete it again). */
#define XFER_DEAD ((size_t)-1)

static void complete_once(struct loomi_xfer *x, loom_result_t st)
{
    if (x->t_posted == XFER_DEAD) return;
    x->t_posted = XFER_DEAD;
    x->complete(x, st);
}

/* Close a peer's sockets and fail everything it holds.  `notify`: tell
 * the core through ctx.peer_failed. */
void loomi_tcp_peer_down(struct tcp *t, struct peer *p, int failed, loom_result_t code,
                         const char *why, int notify)
{
    if (p->failed) return;
    p->failed = 1;
    p->open = 0;
    for (int i = 0; i < all_streams(t); i++) {
        struct stream *s = &p->s[i];
        if (s->fd >= 0) {
            close(s->fd);
            s->fd = -1;
        }
        struct piece *pc = s->sq_head;
        while (pc) {
            struct piece *n = pc->next;
            if (pc->x) complete_once(pc->x, code);
            piece_free(t, pc);
            pc = n;
        }
        s->sq_head = s->sq_tail = NULL;
        s->queued = 0;
        s->rx = NULL;
        s->ru = NULL;
    }
    p->nrt = 0;
    struct loomi_xfer *x;
    while ((x = loomi_mq_recv_pop(&p->mq)) != NULL) complete_once(x, code);
    struct loomi_unexp *u;
    while ((u = loomi_mq_unexp_pop(&p->mq)) != NULL) {
        if (((struct unexp *)u)->waiter) complete_once(((struct unexp *)u)->waiter, code);
        loomi_match_unexp_free(&t->match, u);
    }
    p->nposted = 0;
    if (notify && t->ctx.peer_failed)
        t->ctx.peer_failed(t->ctx.owner, p->rank, failed, code, why);
}

static void peer_error(struct tcp *t, struct peer *p, loom_result_t code, const char *fmt, ...)
    LOOMI_PRINTF(4, 5);
static void stream_read(struct tcp *t, struct stream *s);

/* match.c fails a peer through this. */
void loomi_tcp_match_fail(void *owner, int peer, loom_result_t code, const char *why)
{
    struct tcp *t = owner;
    peer_error(t, &t->peers[peer], code, "%s", why);
}

/* A collective transfer x is posted: the first of its operation scans
 * the messages held from every peer for one of that operation from
 * another schedule or call, which came before this rank made the call
 * (found: that peer fails).  Cheap when none is held. */
static void note_op(struct tcp *t, const struct loomi_xfer *x)
{
    if (!loomi_match_note_op(&t->match, x)) return;
    for (int r = 0; r < t->ctx.nranks; r++)
        if (!t->peers[r].failed) loomi_match_held(&t->match, &t->peers[r].mq, r, x);
}

/* A connection to p broke.  A peer that aborts writes its notice on the
 * control stream before it closes, so read that first: the notice names
 * the rank that really failed, where the broken connection would only
 * name p. */
static void connection_lost(struct tcp *t, struct stream *s, const char *what, int err)
{
    struct peer *p = s->peer;
    struct stream *ctrl = &p->s[t->nstreams];
    if (s != ctrl && ctrl->fd >= 0) stream_read(t, ctrl);
    if (p->failed) return;
    if (err) peer_error(t, p, LOOM_ERR_REMOTE, "%s failed: %s", what, strerror(err));
    else peer_error(t, p, LOOM_ERR_REMOTE, "connection closed by the peer");
}
static void peer_error(struct tcp *t, struct peer *p, loom_result_t code, const char *fmt, ...)
{
    char why[LOOMI_MATCH_WHY];
    va_list ap;
    va_start(ap, fmt);
    loomi_match_vwarn(t->ctx.rank, "tcp", p->rank, why, sizeof why, fmt, ap);
    va_end(ap);
    /* A peer that disagrees is alive: tell it why before the close, or
     * it would see only the connection go. */
    if (code == LOOM_ERR_MISMATCH)
        loomi_tcp_send_control(t, p, T_ABORT, (uint64_t)code, t->ctx.rank);
    loomi_tcp_peer_down(t, p, p->rank, code, why, 1);
}

/* ------------------------------------------------------------- sending */

/* The head piece pc of s is all out (on the wire, or sealed): it leaves
 * the queue, and its transfer completes with its last piece. */
static void piece_out(struct tcp *t, struct stream *s, struct piece *pc)
{
    struct peer *p = s->peer;
    s->sq_head = pc->next;
    if (!s->sq_head) s->sq_tail = NULL;
    s->queued -= pc->h.len + sizeof pc->h;
    struct loomi_xfer *x = pc->x;
    if (x && x->t_posted != XFER_DEAD) {
        x->t_done += pc->h.len;
        if (x->t_done == x->len) {
            p->nposted--;
            complete_once(x, LOOM_SUCCESS);
        }
    }
    piece_free(t, pc);
}

/* A record that did not open: its peer fails (the stream cannot go on). */
static void record_failed(struct tcp *t, struct stream *s, const char *what)
{
    peer_error(t, s->peer, LOOM_ERR_REMOTE,
               "a record (%s) from rank %d on stream %d failed authentication: tampered or "
               "replayed", what, s->peer->rank, s->idx);
}

/* Sealed: the queued pieces of s sealed into its empty staging buffer,
 * as much as fits.  A piece counts as out once sealed (its bytes are no
 * longer read from the transfer's buffer); hdr_sent and sent then count
 * sealed bytes, so cancel keeps what is still to seal. */
static int seal_fill(struct tcp *t, struct stream *s)
{
    if (!s->ebuf && !(s->ebuf = malloc(EBUF_BYTES))) {
        peer_error(t, s->peer, LOOM_ERR_NO_MEMORY, "out of memory sealing a send");
        return -1;
    }
    size_t n = 0;
    struct piece *pc;
    while ((pc = s->sq_head) != NULL) {
        if (pc->hdr_sent == 0) {
            if (n + HREC > EBUF_BYTES) break;
            if (loomi_seal(&s->stx, LOOMI_SEAL_HDR, &pc->h, sizeof pc->h, s->ebuf + n)) goto bad;
            n += HREC;
            pc->hdr_sent = sizeof pc->h;
        }
        while (pc->sent < pc->h.len) {
            size_t k = LOOMI_MIN((size_t)pc->h.len - pc->sent, (size_t)LOOMI_SEAL_MAX);
            if (n + k + LOOMI_SEAL_TAG > EBUF_BYTES) break;
            if (loomi_seal(&s->stx, LOOMI_SEAL_DATA, pc->data + (pc->sent - pc->data_off), k,
                           s->ebuf + n))
                goto bad;
            n += k + LOOMI_SEAL_TAG;
            pc->sent += k;
        }
        if (pc->sent < pc->h.len) break;
        piece_out(t, s, pc);
    }
    s->eoff = 0;
    s->elen = n;
    return 0;
bad:
    peer_error(t, s->peer, LOOM_ERR_INTERNAL, "sealing a record failed (libcrypto)");
    return -1;
}

/* A send on s failed (not EINTR): the socket is full, to be written when
 * it drains, or the connection broke. */
static void send_ended(struct tcp *t, struct stream *s)
{
    if (errno == EAGAIN || errno == EWOULDBLOCK) s->writable = 0;
    else connection_lost(t, s, "send", errno);
}

static void stream_flush_sealed(struct tcp *t, struct stream *s)
{
    struct peer *p = s->peer;
    while (s->writable && !p->failed && s->fd >= 0) {
        if (s->eoff == s->elen) {
            s->eoff = s->elen = 0;
            if (!s->sq_head || seal_fill(t, s) || s->elen == 0) return;
        }
        ssize_t w = send(s->fd, s->ebuf + s->eoff, s->elen - s->eoff, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            send_ended(t, s);
            return;
        }
        s->eoff += (size_t)w;
    }
}

static void stream_flush(struct tcp *t, struct stream *s)
{
    struct peer *p = s->peer;
    if (t->sealed) {
        stream_flush_sealed(t, s);
        return;
    }
    while (s->sq_head && s->writable && !p->failed) {
        struct iovec iov[IOV_BATCH];
        int n = 0;
        for (struct piece *pc = s->sq_head; pc && n + 2 <= IOV_BATCH; pc = pc->next) {
            if (pc->hdr_sent < sizeof pc->h) {
                iov[n].iov_base = (char *)&pc->h + pc->hdr_sent;
                iov[n++].iov_len = sizeof pc->h - pc->hdr_sent;
            }
            if (pc->sent < pc->h.len) {
                iov[n].iov_base = (char *)pc->data + (pc->sent - pc->data_off);
                iov[n++].iov_len = pc->h.len - pc->sent;
            }
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            send_ended(t, s);
            return;
        }
        size_t left = (size_t)w;
        while (left && s->sq_head) {
            struct piece *pc = s->sq_head;
            size_t h = LOOMI_MIN(left, sizeof pc->h - pc->hdr_sent);
            pc->hdr_sent += h;
            left -= h;
            size_t d = LOOMI_MIN(left, (size_t)pc->h.len - pc->sent);
            pc->sent += d;
            left -= d;
            if (pc->hdr_sent == sizeof pc->h && pc->sent == pc->h.len) piece_out(t, s, pc);
        }
    }
}

static void stream_enqueue(struct stream *s, struct piece *pc)
{
    pc->next = NULL;
    if (s->sq_tail) s->sq_tail->next = pc;
    else s->sq_head = pc;
    s->sq_tail = pc;
    s->queued += pc->h.len + sizeof pc->h;
}

static struct stream *least_loaded(struct tcp *t, struct peer *p)
{
    struct stream *best = NULL;
    for (int i = 0; i < t->nstreams; i++)
        if (p->s[i].fd >= 0 && (!best || p->s[i].queued < best->queued)) best = &p->s[i];
    return best;
}

/* The peer a new transfer goes to or comes from, the transfer noted
 * (note_op), or NULL (error set) when it cannot: a bad rank, or a peer
 * failed or gone.  A receive (recv) may come from a peer that closed
 * politely: everything it sent before its goodbye has been read, and
 * tcp_irecv looks there. */
static struct peer *xfer_peer(struct tcp *t, struct loomi_xfer *x, loom_result_t *r, int recv)
{
    if (x->peer < 0 || x->peer >= t->ctx.nranks || x->peer == t->ctx.rank) {
        *r = loomi_fail(LOOM_ERR_INTERNAL, t->ctx.rank, "tcp: transfer with bad peer %d", x->peer);
        return NULL;
    }
    struct peer *p = &t->peers[x->peer];
    if (p->failed || t->aborted || (p->open == 0 && !recv)) {
        *r = loomi_fail(LOOM_ERR_REMOTE, t->ctx.rank, "tcp: rank %d is unreachable (%s)", x->peer,
                        p->failed ? "failed" : "it closed the communicator");
        return NULL;
    }
    x->t_done = 0;
    x->t_posted = 0;
    note_op(t, x);
    if (p->failed) {
        *r = loomi_fail(LOOM_ERR_REMOTE, t->ctx.rank, "tcp: rank %d failed", x->peer);
        return NULL;
    }
    return p;
}

static loom_result_t tcp_isend(void *state, struct loomi_xfer *x)
{
    struct tcp *t = state;
    loom_result_t r;
    struct peer *p = xfer_peer(t, x, &r, 0);
    if (!p) return r;
    size_t npieces = 1;
    if (x->len > SPLIT_MIN && t->nstreams > 1) {
        npieces = (size_t)t->nstreams;
        while (npieces > 1 && x->len / npieces < SPLIT_MIN / 2) npieces--;
    }
    /* Pieces must fit the header's 32-bit length. */
    size_t maxp = (size_t)1 << 30;
    if ((x->len + npieces - 1) / npieces > maxp) npieces = (x->len + maxp - 1) / maxp;
    size_t per = npieces ? (x->len + npieces - 1) / npieces : 0;
    struct stream *touched[16];
    int nt = 0;
    size_t off = 0;
    for (size_t i = 0; i < npieces; i++) {
        size_t len = LOOMI_MIN(per, x->len - off);
        struct piece *pc = piece_new(t);
        if (!pc) {
            if (i == 0) return loomi_fail(LOOM_ERR_NO_MEMORY, t->ctx.rank, "tcp: out of memory");
            /* Pieces already queued will finish; make the rest an error. */
            peer_error(t, p, LOOM_ERR_NO_MEMORY, "out of memory queueing a send");
            return LOOM_SUCCESS;
        }
        pc->x = x;
        pc->h.magic = TCP_MAGIC;
        pc->h.type = T_DATA;
        pc->h.tag = x->tag;
        pc->h.total = x->len;
        pc->h.offset = off;
        pc->h.len = (uint32_t)len;
        pc->h.aux = (int32_t)x->chk;
        pc->data = (const char *)x->buf + off;
        struct stream *s = least_loaded(t, p);
        stream_enqueue(s, pc);
        int seen = 0;
        for (int k = 0; k < nt; k++) seen |= touched[k] == s;
        if (!seen && nt < 16) touched[nt++] = s;
        off += len;
    }
    p->nposted++;
    for (int k = 0; k < nt; k++) stream_flush(t, touched[k]);
    return LOOM_SUCCESS;
}

/* ----------------------------------------------------------- receiving */

int loomi_tcp_tile_claim(struct loomi_tcp_tiling *t, uint64_t total, uint64_t off, uint64_t len)
{
    uint64_t end;
    if (__builtin_add_overflow(off, len, &end) || end > total) return LOOMI_TCP_TILE_BOUNDS;
    if (t->claimed == total && (total || t->n)) return LOOMI_TCP_TILE_OVERLAP; /* whole */
    if (len == 0) {
        if (total) return LOOMI_TCP_TILE_BOUNDS; /* only a message of 0 bytes has one */
        t->n = 1; /* marks it whole */
        t->r[0].off = t->r[0].end = 0;
        return LOOMI_TCP_TILE_OK;
    }
    int i = 0;
    while (i < t->n && t->r[i].end <= off) i++;
    if (i < t->n && t->r[i].off < end) return LOOMI_TCP_TILE_OVERLAP;
    int left = i > 0 && t->r[i - 1].end == off;
    int right = i < t->n && t->r[i].off == end;
    if (left && right) {
        t->r[i - 1].end = t->r[i].end;
        memmove(&t->r[i], &t->r[i + 1], (size_t)(t->n - i - 1) * sizeof t->r[0]);
        t->n--;
    } else if (left) {
        t->r[i - 1].end = end;
    } else if (right) {
        t->r[i].off = off;
    } else {
        if (t->n == LOOMI_TCP_TILES) return LOOMI_TCP_TILE_HOLES;
        memmove(&t->r[i + 1], &t->r[i], (size_t)(t->n - i) * sizeof t->r[0]);
        t->r[i].off = off;
        t->r[i].end = end;
        t->n++;
    }
    t->claimed += len;
    return LOOMI_TCP_TILE_OK;
}

/* The piece whose header is h claims its bytes of the message tl tracks;
 * refused: the peer fails, naming the piece. */
static int claim_piece(struct tcp *t, struct peer *p, struct loomi_tcp_tiling *tl,
                       const struct wire_hdr *h)
{
    int r = loomi_tcp_tile_claim(tl, h->total, h->offset, h->len);
    if (r == LOOMI_TCP_TILE_OK) return 0;
    peer_error(t, p, LOOM_ERR_REMOTE,
               "protocol error: rank %d sent a piece (offset %llu, length %u) of a message of "
               "%llu bytes (tag %llx) that %s",
               p->rank, (unsigned long long)h->offset, h->len, (unsigned long long)h->total,
               (unsigned long long)h->tag,
               r == LOOMI_TCP_TILE_OVERLAP ? "overlaps bytes already received"
               : r == LOOMI_TCP_TILE_HOLES ? "leaves too many holes"
                                           : "does not fit it");
    return -1;
}

/* The bytes claimed of the posted receive x (listed at its first piece),
 * or NULL: out of memory, and the peer has failed. */
static struct loomi_tcp_tiling *rtile_of(struct tcp *t, struct peer *p, struct loomi_xfer *x)
{
    for (int i = 0; i < p->nrt; i++)
        if (p->rt[i].x == x) return &p->rt[i].tl;
    if (p->nrt == p->cap_rt) {
        int cap = p->cap_rt ? 2 * p->cap_rt : 8;
        struct rtile *rt = realloc(p->rt, (size_t)cap * sizeof *rt);
        if (!rt) {
            peer_error(t, p, LOOM_ERR_NO_MEMORY, "out of memory receiving a message");
            return NULL;
        }
        p->rt = rt;
        p->cap_rt = cap;
    }
    struct rtile *e = &p->rt[p->nrt++];
    memset(e, 0, sizeof *e);
    e->x = x;
    return &e->tl;
}

/* x is done with (completed or cancelled): its claims go. */
static void rtile_drop(struct peer *p, const struct loomi_xfer *x)
{
    for (int i = 0; i < p->nrt; i++)
        if (p->rt[i].x == x) {
            p->rt[i] = p->rt[--p->nrt];
            return;
        }
}

static void recv_done(struct peer *p, struct loomi_xfer *x, size_t len)
{
    x->t_done += len;
    if (x->t_done == x->len) {
        rtile_drop(p, x);
        loomi_mq_recv_del(&p->mq, x);
        p->nposted--;
        complete_once(x, LOOM_SUCCESS);
    }
}

static void unexp_done(struct tcp *t, struct peer *p, struct unexp *u, size_t len)
{
    u->m.got += len;
    /* Complete when all is in and someone wants it; a direct message whose
     * receive was cancelled was read into the void and just goes. */
    if (u->m.got < u->m.total || (!u->waiter && !u->direct)) return;
    loomi_mq_unexp_del(&p->mq, &u->m);
    struct loomi_xfer *x = u->waiter;
    if (x && u->m.buf) memcpy(x->buf, u->m.buf, u->m.total);
    loomi_match_unexp_free(&t->match, &u->m);
    if (!x) return;
    p->nposted--;
    complete_once(x, LOOM_SUCCESS);
}

static void track_piece(struct unexp *u, const struct wire_hdr *h)
{
    if (u->npc < UNEXP_PIECES) {
        u->pc[u->npc].off = h->offset;
        u->pc[u->npc].len = h->len;
    }
    if (u->npc <= UNEXP_PIECES) u->npc++;
}

/* The receive x is posted for u, a message partly in: move what is in to
 * x->buf and point the streams still reading pieces of it there, so the
 * rest is not copied twice. */
static void unexp_go_direct(struct tcp *t, struct peer *p, struct unexp *u,
                            struct loomi_xfer *x)
{
    for (int i = 0; i < u->npc; i++) {
        size_t off = u->pc[i].off, filled = u->pc[i].len;
        for (int k = 0; k < all_streams(t); k++) {
            struct stream *s = &p->s[k];
            if (s->ru == u && s->in_payload && s->rh.offset == off) {
                filled = u->pc[i].len - s->rleft;
                s->rdst = (char *)x->buf + off + filled;
            }
        }
        memcpy((char *)x->buf + off, u->m.buf + off, filled);
    }
    LOOMI_TRACE(t->ctx.rank, "tcp: receive posted for an early message from rank %d: %zu of %zu "
                "bytes moved, the rest read in place", p->rank, u->m.got, u->m.total);
    loomi_match_unexp_unbuffer(&t->match, &u->m);
    u->direct = 1;
}

/* A header has arrived: check it, then find where its payload goes. */
static int handle_header(struct tcp *t, struct stream *s)
{
    struct peer *p = s->peer;
    const struct wire_hdr *h = &s->rh;
    if (h->magic != TCP_MAGIC) {
        peer_error(t, p, LOOM_ERR_REMOTE, "protocol error: bad magic 0x%08x", h->magic);
        return -1;
    }
    if (h->type == T_BYE) {
        s->bye = 1;
        return 0;
    }
    if (h->type == T_ABORT) {
        int failed = h->aux;
        if (failed < -1 || failed >= t->ctx.nranks) failed = -1;
        loom_result_t code = (h->tag >= 1 && h->tag <= 13) ? (loom_result_t)h->tag : LOOM_ERR_REMOTE;
        if (code == LOOM_ERR_REVOKED || code == LOOM_ERR_TIMEOUT || code == LOOM_ERR_MISMATCH)
            ; /* keep: the reason the peer gave */
        else
            code = LOOM_ERR_REMOTE;
        loomi_tcp_peer_down(t, p, failed, code, "the peer aborted the communicator", 1);
        return -1;
    }
    if (h->type != T_DATA || h->total > MAX_MSG || h->offset > h->total ||
        h->len > h->total - h->offset) {
        peer_error(t, p, LOOM_ERR_REMOTE,
                   "protocol error: bad header (type %u, total %llu, offset %llu, len %u)",
                   h->type, (unsigned long long)h->total, (unsigned long long)h->offset, h->len);
        return -1;
    }
    const uint32_t chk = (uint32_t)h->aux;
    s->rx = NULL;
    s->ru = (struct unexp *)loomi_mq_unexp_find(&p->mq, h->tag);
    if (s->ru) { /* another piece of a message held */
        struct unexp *u = s->ru;
        if (u->m.total != h->total || u->m.chk != chk) {
            peer_error(t, p, LOOM_ERR_MISMATCH,
                       "rank %d sent pieces of one message with different lengths or checks",
                       p->rank);
            return -1;
        }
        /* Its bytes must not have arrived already: a piece twice, or one
         * once the message is whole, would write into memory that may be
         * gone by the time its payload arrives. */
        if (claim_piece(t, p, &u->tl, h)) return -1;
        if (u->direct) {
            s->rdst = u->waiter ? (char *)u->waiter->buf + h->offset : NULL;
        } else {
            s->rdst = u->m.buf + h->offset;
            track_piece(u, h);
        }
    } else if ((s->rx = loomi_mq_recv_find(&p->mq, h->tag)) != NULL) {
        /* Left listed (failed with the peer) until its last piece is in. */
        if (loomi_match_pair(&t->match, p->rank, h->tag, chk, h->total, s->rx)) return -1;
        /* The receive completes when every byte claimed is in, so none
         * is claimed twice: no stream then still writes into it. */
        struct loomi_tcp_tiling *tl = rtile_of(t, p, s->rx);
        if (!tl || claim_piece(t, p, tl, h)) return -1;
        s->rdst = (char *)s->rx->buf + h->offset;
    } else {
        struct loomi_unexp *m;
        if (loomi_match_early(&t->match, &p->mq, p->rank, h->tag, chk, h->total, 1, &m))
            return -1;
        LOOMI_TRACE(t->ctx.rank, "tcp: early message from rank %d, tag %llx, %zu bytes (buffered)",
                    p->rank, (unsigned long long)h->tag, m->total);
        struct unexp *u = (struct unexp *)m;
        if (claim_piece(t, p, &u->tl, h)) return -1;
        s->ru = u;
        s->rdst = m->buf + h->offset;
        track_piece(u, h);
    }
    s->rleft = h->len;
    s->in_payload = 1;
    return 0;
}

static void payload_done(struct tcp *t, struct stream *s)
{
    struct peer *p = s->peer;
    s->in_payload = 0;
    s->rh_got = 0;
    if (s->ru) unexp_done(t, p, s->ru, s->rh.len);
    else if (s->rx) recv_done(p, s->rx, s->rh.len);
    s->rx = NULL;
    s->ru = NULL;
}

/* The end of stream s came (r == 0 from recv): a polite close, or the
 * connection lost. */
static void stream_eof(struct tcp *t, struct stream *s)
{
    struct peer *p = s->peer;
    if (s->bye && !s->in_payload && s->rh_got == 0) {
        /* A polite close of this stream: everything sent on it
         * before the goodbye has been read. */
        close(s->fd);
        s->fd = -1;
        if (--p->open == 0 && p->nposted)
            peer_error(t, p, LOOM_ERR_REMOTE,
                       "the peer destroyed the communicator with operations pending here");
        return;
    }
    connection_lost(t, s, "receive", 0);
}

/* A receive on s gave r <= 0 (not EINTR): the peer closed it, or it
 * broke, or there is nothing more now; reading stops either way. */
static void read_ended(struct tcp *t, struct stream *s, ssize_t r)
{
    if (r == 0) stream_eof(t, s);
    else if (errno != EAGAIN && errno != EWOULDBLOCK) connection_lost(t, s, "receive", errno);
}

/* Reading a stream: a header, then its payload, straight into the
 * receive's memory (or discarded).  Sealed, record by record: the header
 * record opens into rh before handle_header reads a length of it; a
 * payload record (its length known from the header) is read whole into
 * rbuf and opened into where its bytes go, and the piece is done only
 * when all its records opened.
 *
 * The next read: recv's result, or -2 after a failure it reported; *k,
 * sealed, is the payload bytes of the record being read. */
static ssize_t read_some(struct tcp *t, struct stream *s, size_t *k)
{
    if (!s->in_payload && t->sealed)
        return recv(s->fd, s->hrec + s->rh_got, HREC - s->rh_got, MSG_DONTWAIT);
    if (!s->in_payload)
        return recv(s->fd, (char *)&s->rh + s->rh_got, sizeof s->rh - s->rh_got, MSG_DONTWAIT);
    if (!t->sealed && s->rdst) return recv(s->fd, s->rdst, s->rleft, MSG_DONTWAIT);
    if (!t->sealed)
        return recv(s->fd, t->discard, LOOMI_MIN(s->rleft, sizeof t->discard), MSG_DONTWAIT);
    if (!s->rbuf && !(s->rbuf = malloc((size_t)LOOMI_SEAL_MAX + LOOMI_SEAL_TAG))) {
        peer_error(t, s->peer, LOOM_ERR_NO_MEMORY, "out of memory receiving a sealed record");
        return -2;
    }
    *k = LOOMI_MIN(s->rleft, (size_t)LOOMI_SEAL_MAX);
    return recv(s->fd, s->rbuf + s->rgot, *k + LOOMI_SEAL_TAG - s->rgot, MSG_DONTWAIT);
}

/* n more bytes of the header came: 0, or -1 when the stream stops here
 * (handle_header or the record failed). */
static int header_came(struct tcp *t, struct stream *s, size_t n)
{
    s->rh_got += n;
    if (s->rh_got < (t->sealed ? (size_t)HREC : sizeof s->rh)) return 0;
    if (t->sealed && loomi_seal_open(&s->srx, LOOMI_SEAL_HDR, s->hrec, sizeof s->rh, &s->rh)) {
        record_failed(t, s, "a header");
        return -1;
    }
    if (handle_header(t, s)) return -1;
    if (!s->in_payload) s->rh_got = 0; /* control message consumed */
    return 0;
}

/* n more bytes of the payload came (sealed: of a record of k payload
 * bytes): 0, or -1 when the record failed. */
static int payload_came(struct tcp *t, struct stream *s, size_t n, size_t k)
{
    if (t->sealed) {
        s->rgot += n;
        if (s->rgot < k + LOOMI_SEAL_TAG) return 0;
        s->rgot = 0;
        /* Opened straight into the receive's memory: a record that
         * fails leaves bytes there, but its receive then fails with
         * the peer and never completes. */
        if (loomi_seal_open(&s->srx, LOOMI_SEAL_DATA, s->rbuf, k,
                            s->rdst ? s->rdst : t->discard)) {
            record_failed(t, s, "a payload");
            return -1;
        }
        n = k;
    }
    if (s->rdst) s->rdst += n;
    s->rleft -= n;
    if (s->rleft == 0) payload_done(t, s);
    return 0;
}

static void stream_read(struct tcp *t, struct stream *s)
{
    while (s->fd >= 0 && !s->peer->failed) {
        if (s->in_payload && s->rleft == 0) {
            payload_done(t, s);
            continue;
        }
        size_t k = 0;
        ssize_t r = read_some(t, s, &k);
        if (r == -2) return;
        if (r <= 0) {
            if (r < 0 && errno == EINTR) continue;
            read_ended(t, s, r);
            return;
        }
        if (!s->in_payload ? header_came(t, s, (size_t)r) : payload_came(t, s, (size_t)r, k))
            return;
    }
}

static void tcp_cancel(void *state, struct loomi_xfer *x);

static loom_result_t tcp_irecv(void *state, struct loomi_xfer *x)
{
    struct tcp *t = state;
    loom_result_t r;
    struct peer *p = xfer_peer(t, x, &r, 1);
    if (!p) return r;
    /* Opens as shm's and verbs' irecv do: the peer, its count, then
     * match.c; what follows is tcp's own. */
    p->nposted++;
    struct loomi_unexp *m;
    /* Failed: x fails with the peer's other transfers. */
    if (loomi_match_post(&t->match, &p->mq, p->rank, x, &m)) return LOOM_SUCCESS;
    if (m) {
        /* Left listed until all of it is in (unexp_done). */
        struct unexp *u = (struct unexp *)m;
        u->waiter = x;
        if (m->got < m->total && u->npc <= UNEXP_PIECES) unexp_go_direct(t, p, u, x);
        unexp_done(t, p, u, 0);
    } else if (p->open == 0) {
        /* The peer destroyed the communicator politely after sending
         * what is here (a message it sent before its goodbye is received
         * however late): this one will never come. */
        tcp_cancel(t, x);
        p->nposted--;
        return loomi_fail(LOOM_ERR_REMOTE, t->ctx.rank,
                          "tcp: rank %d is unreachable (it closed the communicator)", x->peer);
    }
    /* Zero-length messages travel too (a header alone), so even an empty
     * receive completes only when its message arrives. */
    return LOOM_SUCCESS;
}

static void tcp_cancel(void *state, struct loomi_xfer *x)
{
    struct tcp *t = state;
    if (x->peer < 0 || x->peer >= t->ctx.nranks) return;
    struct peer *p = &t->peers[x->peer];
    x->t_posted = XFER_DEAD;
    rtile_drop(p, x);
    for (int i = 0; i < all_streams(t); i++) {
        struct stream *s = &p->s[i];
        if (s->rx == x) {
            s->rx = NULL;
            s->rdst = NULL; /* read the rest of this piece into the void */
        }
        struct piece **l = &s->sq_head, *prev = NULL;
        while (*l) {
            struct piece *pc = *l;
            /* A piece half on the wire must finish or the stream desyncs. */
            if (pc->x == x && pc->hdr_sent == 0) {
                *l = pc->next;
                s->queued -= pc->h.len + sizeof pc->h;
                if (s->sq_tail == pc) s->sq_tail = prev;
                piece_free(t, pc);
                continue;
            }
            if (pc->x == x) {
                /* x's buffer is the caller's again once cancel returns
                 * (transport.h): the bytes still to send are kept here. */
                size_t left = (size_t)pc->h.len - pc->sent;
                if (left && !pc->own) {
                    pc->own = malloc(left);
                    if (pc->own) {
                        memcpy(pc->own, pc->data + (pc->sent - pc->data_off), left);
                        pc->data = pc->own;
                        pc->data_off = pc->sent;
                    } else {
                        /* Nothing to finish it with: the connection
                         * ends (the peer sees it break), and no byte
                         * of x is read again. */
                        shutdown(s->fd, SHUT_RDWR);
                        pc->sent = pc->h.len;
                        pc->hdr_sent = sizeof pc->h;
                    }
                }
                pc->x = NULL;
            }
            prev = pc;
            l = &pc->next;
        }
    }
    loomi_mq_recv_has(&p->mq, x, 1);
    for (int b = 0; p->mq.nunexp && b < LOOMI_MQ_BUCKETS; b++)
        for (struct loomi_unexp *m = p->mq.unexp[b].head; m; m = m->next) {
            struct unexp *u = (struct unexp *)m;
            if (u->waiter != x) continue;
            u->waiter = NULL;
            /* Direct: the rest of it must not land in x's memory. */
            for (int i = 0; u->direct && i < all_streams(t); i++)
                if (p->s[i].ru == u) p->s[i].rdst = NULL;
        }
}

/* ------------------------------------------------------------ progress */

static loom_result_t tcp_progress(void *state, int timeout_ms)
{
    struct tcp *t = state;
    struct epoll_event ev[64];
    int n = epoll_wait(t->epfd, ev, 64, timeout_ms);
    if (n < 0) {
        if (errno == EINTR) return LOOM_SUCCESS;
        return loomi_fail(LOOM_ERR_SYSTEM, t->ctx.rank, "tcp: epoll_wait: %s", strerror(errno));
    }
    for (int i = 0; i < n; i++) {
        struct stream *s = ev[i].data.ptr;
        if (s->fd < 0) continue;
        if (ev[i].events & EPOLLOUT) {
            s->writable = 1;
            stream_flush(t, s);
        }
        if (s->fd >= 0 && (ev[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)))
            stream_read(t, s);
    }
    return LOOM_SUCCESS;
}

static int tcp_wait_fd(void *state) { return ((struct tcp *)state)->epfd; }

/* The ops table: every transport's lists the same members in the same
 * order (transport.h), so the tables look alike on purpose. */
const struct loomi_transport_ops loomi_tcp_ops = {
    .name = "tcp",
    .caps = LOOMI_TCAP_TWO_SIDED,
    .create = loomi_tcp_create,
    .local_addr = loomi_tcp_local_addr,
    .connect_all = loomi_tcp_connect_all,
    .mem_register = NULL,
    .mem_deregister = NULL,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .progress = tcp_progress,
    .wait_fd = tcp_wait_fd,
    .cancel = tcp_cancel,
    .abort_all = loomi_tcp_abort_all,
    .destroy = loomi_tcp_destroy,
};
