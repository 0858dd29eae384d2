/*
 * verbs_data.c - the verbs transport's data path: posting eager sends,
 * clear-to-sends and RDMA writes under credits, the completions and what
 * arrives (matched by match.c; the conflicts of rendezvous receives and
 * clear-to-sends here), the control connection (aborts, goodbyes),
 * failing a peer, progress, and the isend / irecv / cancel calls.
 * verbs.c says how it works.
 */
#include "config.h"

#ifdef HAVE_VERBS_H

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/cuda.h"
#include "transports/verbs/verbs_internal.h"
#include "transports/net.h"

static const char *wc_str(enum ibv_wc_status s)
{
    const char *r = loomi_verbs_ib.wc_status_str ? loomi_verbs_ib.wc_status_str(s) : NULL;
    return r ? r : "unknown status";
}

/* ------------------------------------------------------------ failure */

static void release_op(struct verbs *t, struct peer *p, struct op *o)
{
    if (o->mr) loomi_verbs_mr_put(t, o->mr);
    o->mr = NULL;
    o->x = NULL;
    if (o->nout > 0) q_push(&p->zombies, o);
    else op_free(t, o);
}

static void fail_queue(struct verbs *t, struct peer *p, struct opq *q, loom_result_t code)
{
    struct op *o = q->head;
    q->head = q->tail = NULL;
    while (o) {
        struct op *n = o->next;
        if (o->x) complete_once(o->x, code);
        release_op(t, p, o);
        o = n;
    }
}

static void qp_to_error(struct peer *p)
{
    if (!p->qp) return;
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_ERR;
    loomi_verbs_ib.modify_qp(p->qp, &a, IBV_QP_STATE);
}

/* Stop everything with p: its queue pair goes to the error state (so
 * nothing more lands in this process's memory), its control connection
 * closes and every transfer it holds fails with `code`. */
void loomi_verbs_peer_down(struct verbs *t, struct peer *p, int failed, loom_result_t code,
                           const char *why, int notify)
{
    if (p->failed || !p->active) return;
    p->failed = 1;
    qp_to_error(p);
    if (p->fd >= 0) {
        epoll_ctl(t->epfd, EPOLL_CTL_DEL, p->fd, NULL);
        close(p->fd);
        p->fd = -1;
    }
    fail_queue(t, p, &p->fifo, code);
    fail_queue(t, p, &p->wait_cts, code);
    fail_queue(t, p, &p->inflight, code);
    struct op *o = p->ucts.head;
    p->ucts.head = p->ucts.tail = NULL;
    while (o) {
        struct op *n = o->next;
        op_free(t, o);
        o = n;
    }
    p->nucts = 0;
    struct loomi_xfer *x;
    while ((x = loomi_mq_recv_pop(&p->mq)) != NULL) complete_once(x, code);
    for (int i = 0; i < RR_MAX; i++) {
        struct rrecv *r = &p->rr[i];
        if (!r->used) continue;
        if (r->x && !r->dead) complete_once(r->x, code);
        loomi_verbs_mr_put(t, r->mr);
        memset(r, 0, sizeof *r);
    }
    struct loomi_unexp *u;
    while ((u = loomi_mq_unexp_pop(&p->mq)) != NULL) loomi_match_unexp_free(&t->match, u);
    t->nposted -= p->nposted;
    p->nposted = 0;
    if (notify && t->ctx.peer_failed) t->ctx.peer_failed(t->ctx.owner, p->rank, failed, code, why);
}

static void peer_error(struct verbs *t, struct peer *p, loom_result_t code, const char *fmt, ...)
    LOOMI_PRINTF(4, 5);
static void peer_error(struct verbs *t, struct peer *p, loom_result_t code, const char *fmt, ...)
{
    if (p->failed) return;
    char why[LOOMI_MATCH_WHY];
    va_list ap;
    va_start(ap, fmt);
    loomi_match_vwarn(t->ctx.rank, "verbs", p->rank, why, sizeof why, fmt, ap);
    va_end(ap);
    /* A peer that disagrees is alive: tell it why before the close, or
     * it would see only its queue pair fail. */
    if (code == LOOM_ERR_MISMATCH && p->fd >= 0)
        loomi_verbs_send_ctl(p, C_ABORT, (int)code, t->ctx.rank, 0);
    loomi_verbs_peer_down(t, p, p->rank, code, why, !t->destroying);
}

static void ctl_read(struct verbs *t, struct peer *p);
static void ctl_wait(struct verbs *t, struct peer *p, int ms);
/* How long a work completion error waits for the peer's word on why. */
#define CTL_WHY_WAIT_MS 200

/* ---------------------------------------------------------- posting */

int loomi_verbs_post_recv_slot(struct peer *p, struct slot *s)
{
    struct ibv_sge sge = {.addr = (uintptr_t)s->mem, .length = SLOT_BYTES, .lkey = p->rmr->lkey};
    struct ibv_recv_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = (uintptr_t)s;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return p->qp->context->ops.post_recv(p->qp, &wr, &bad);
}

static int post_send(struct peer *p, struct ibv_send_wr *wr)
{
    struct ibv_send_wr *bad;
    int rc = p->qp->context->ops.post_send(p->qp, wr, &bad);
    if (rc == 0) p->sq_free--;
    return rc;
}

static uint64_t credits(struct verbs *t, struct peer *p)
{
    /* Acquire: the count the peer's NIC writes here (RDMA) at any time;
     * an atomic load, so it is read whole and fresh on every call. */
    uint64_t posted = __atomic_load_n(&t->cred[(size_t)p->rank * CRED_STRIDE], __ATOMIC_ACQUIRE);
    return posted > p->sent ? posted - p->sent : 0;
}

/* Tell the peer how many receive buffers it may fill (an RDMA write of
 * the running count into the word it keeps for this rank, whose address
 * and key came in its hello). */
static void maybe_send_credit(struct verbs *t, struct peer *p)
{
    if (p->failed || p->cred_busy || p->sq_free < 1 || p->rposted - p->radvert < CREDIT_BATCH)
        return;
    *p->credsrc = p->rposted;
    struct ibv_sge sge = {.addr = (uintptr_t)p->credsrc, .length = 8, .lkey = p->rmr->lkey};
    struct ibv_send_wr wr;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = (uintptr_t)&p->credslot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = p->cred_raddr;
    wr.wr.rdma.rkey = p->cred_rkey;
    int rc = post_send(p, &wr);
    if (rc) {
        peer_error(t, p, LOOM_ERR_REMOTE, "posting a credit update failed: %s", strerror(rc));
        return;
    }
    p->cred_busy = 1;
    p->radvert = p->rposted;
}

/* Post what the peer's queue holds, as far as credits, send slots and
 * work requests allow (one work request stays free for credit updates). */
static void pump(struct verbs *t, struct peer *p)
{
    while (!p->failed && p->fifo.head && p->sq_free > 1) {
        struct op *o = p->fifo.head;
        if (!o->x && o->type != OP_CTS) { /* cancelled */
            p->fifo.head = o->next;
            if (!p->fifo.head) p->fifo.tail = NULL;
            release_op(t, p, o);
            continue;
        }
        if (o->type == OP_CTS && p->rr[o->rid & 0xffffu].dead) {
            /* Its receive was cancelled: no CTS, and the id is free again. */
            p->rr[o->rid & 0xffffu].used = 0;
            p->rr[o->rid & 0xffffu].dead = 0;
            p->fifo.head = o->next;
            if (!p->fifo.head) p->fifo.tail = NULL;
            op_free(t, o);
            continue;
        }
        if (o->type == OP_EAGER || o->type == OP_CTS) {
            if (!credits(t, p) || !p->free_sb) return;
            struct slot *s = p->free_sb;
            p->free_sb = s->next_free;
            int copy_failed = 0;
            struct vhdr h;
            memset(&h, 0, sizeof h);
            h.magic = V_MAGIC;
            h.type = o->type == OP_EAGER ? T_EAGER : T_CTS;
            h.tag = o->tag;
            h.len = o->len;
            h.chk = o->chk;
            size_t n = sizeof h;
            if (o->type == OP_CTS) {
                h.addr = o->raddr;
                h.rkey = o->rkey;
                h.rid = o->rid;
            } else if (o->len) {
                char why[160];
                if (!o->x->dev) memcpy(s->mem + sizeof h, o->x->buf, o->len);
                else if (loomi_cuda_copy(s->mem + sizeof h, o->x->buf, o->len, why, sizeof why)) {
                    /* The message goes (the peer expects it); this
                     * rank's send fails with the driver's word. */
                    loomi_fail(LOOM_ERR_SYSTEM, t->ctx.rank,
                               "verbs: eager send from device memory: %s", why);
                    copy_failed = 1;
                }
                n += o->len;
            }
            memcpy(s->mem, &h, sizeof h);
            struct ibv_sge sge = {.addr = (uintptr_t)s->mem, .length = (uint32_t)n,
                                  .lkey = p->rmr->lkey};
            struct ibv_send_wr wr;
            memset(&wr, 0, sizeof wr);
            wr.wr_id = (uintptr_t)s;
            wr.sg_list = &sge;
            wr.num_sge = 1;
            wr.opcode = IBV_WR_SEND;
            wr.send_flags = IBV_SEND_SIGNALED;
            int rc = post_send(p, &wr);
            if (rc) {
                s->next_free = p->free_sb;
                p->free_sb = s;
                peer_error(t, p, LOOM_ERR_REMOTE, "posting a send failed: %s", strerror(rc));
                return;
            }
            p->sent++;
            p->fifo.head = o->next;
            if (!p->fifo.head) p->fifo.tail = NULL;
            if (o->type == OP_EAGER) {
                /* The bytes are in the slot: the send is done for the caller. */
                struct loomi_xfer *x = o->x;
                p->nposted--;
                t->nposted--;
                op_free(t, o);
                complete_once(x, copy_failed ? LOOM_ERR_SYSTEM : LOOM_SUCCESS);
            } else {
                op_free(t, o);
            }
            continue;
        }
        /* Rendezvous: the pieces, the last one with the immediate. */
        while (o->posted < o->len && p->sq_free > 1) {
            size_t piece = LOOMI_MIN((size_t)WR_CHUNK, o->len - o->posted);
            int last = o->posted + piece == o->len;
            if (last && !credits(t, p)) return;
            struct ibv_sge sge = {.addr = (uintptr_t)o->x->buf + o->posted,
                                  .length = (uint32_t)piece, .lkey = o->mr->mr->lkey};
            struct ibv_send_wr wr;
            memset(&wr, 0, sizeof wr);
            wr.wr_id = (uintptr_t)o;
            wr.sg_list = &sge;
            wr.num_sge = 1;
            wr.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
            wr.send_flags = IBV_SEND_SIGNALED;
            wr.wr.rdma.remote_addr = o->raddr + o->posted;
            wr.wr.rdma.rkey = o->rkey;
            if (last) wr.imm_data = htonl(o->rid);
            int rc = post_send(p, &wr);
            if (rc) {
                peer_error(t, p, LOOM_ERR_REMOTE, "posting an RDMA write failed: %s", strerror(rc));
                return;
            }
            if (last) p->sent++;
            o->posted += piece;
            o->nout++;
        }
        if (o->posted < o->len) return;
        p->fifo.head = o->next;
        if (!p->fifo.head) p->fifo.tail = NULL;
        q_push(&p->inflight, o);
    }
}

/* ------------------------------------------------------------ receiving */

static int rr_has_tag(struct peer *p, uint64_t tag)
{
    for (int i = 0; i < RR_MAX; i++)
        if (p->rr[i].used && !p->rr[i].dead && p->rr[i].x && p->rr[i].x->tag == tag) return 1;
    return 0;
}

/* A tag and the check of its call. */
struct tc {
    uint64_t tag;
    uint32_t chk;
};

/* Transfers of the operation that tag belongs to but of another
 * schedule or call (transport.h), or a zero tag: among the rendezvous
 * receives posted, and in a queue of sends or clear-to-sends (the eager
 * receives and early messages: match.h). */
static struct tc rr_conflict(const struct peer *p, uint64_t tag, uint32_t chk)
{
    for (int i = 0; i < RR_MAX; i++)
        if (p->rr[i].used && !p->rr[i].dead && p->rr[i].x &&
            loomi_call_conflict(p->rr[i].x->tag, p->rr[i].x->chk, tag, chk))
            return (struct tc){p->rr[i].x->tag, p->rr[i].x->chk};
    return (struct tc){0, 0};
}

static struct tc q_conflict(const struct opq *q, uint64_t tag, uint32_t chk)
{
    for (const struct op *c = q->head; c; c = c->next)
        if (loomi_call_conflict(c->tag, c->chk, tag, chk)) return (struct tc){c->tag, c->chk};
    return (struct tc){0, 0};
}

void loomi_verbs_match_fail(void *owner, int peer, loom_result_t code, const char *why)
{
    struct verbs *t = owner;
    peer_error(t, &t->peers[peer], code, "%s", why);
}

static void conflict(struct verbs *t, struct peer *p, struct tc theirs, struct tc mine)
{
    loomi_match_conflict(&t->match, p->rank, theirs.tag, theirs.chk, mine.tag, mine.chk);
}

/* A collective transfer x is posted: the first of its operation scans
 * what is held from every peer (early eager messages, clear-to-sends)
 * for one of that operation from another schedule or call, which came
 * before this rank made the call (found: that peer fails). */
static void note_op(struct verbs *t, const struct loomi_xfer *x)
{
    if (!loomi_match_note_op(&t->match, x)) return;
    for (int r = 0; r < t->ctx.nranks; r++) {
        struct peer *q = &t->peers[r];
        if (!q->active || q->failed || (!q->mq.nunexp && !q->ucts.head)) continue;
        if (loomi_match_held(&t->match, &q->mq, q->rank, x)) continue;
        struct tc u = q_conflict(&q->ucts, x->tag, x->chk);
        if (u.tag) conflict(t, q, u, (struct tc){x->tag, x->chk});
    }
}

/* An eager message's bytes into a receive's buffer: the driver's copy
 * where that is device memory (GPUDirect); its failure fails the
 * receive. */
static loom_result_t copy_in(struct verbs *t, struct loomi_xfer *x, const void *data, size_t n)
{
    char why[160];
    if (!n) return LOOM_SUCCESS;
    if (!x->dev) {
        memcpy(x->buf, data, n);
        return LOOM_SUCCESS;
    }
    if (!loomi_cuda_copy(x->buf, data, n, why, sizeof why)) return LOOM_SUCCESS;
    return loomi_fail(LOOM_ERR_SYSTEM, t->ctx.rank, "verbs: eager receive into device memory: %s",
                      why);
}

static void on_eager(struct verbs *t, struct peer *p, const struct vhdr *h, const char *data)
{
    struct loomi_xfer *x = loomi_mq_recv_find(&p->mq, h->tag);
    if (x) {
        /* One that disagrees stays listed and fails with the peer. */
        if (loomi_match_pair(&t->match, p->rank, h->tag, h->chk, h->len, x)) return;
        loomi_mq_recv_del(&p->mq, x);
        loom_result_t st = copy_in(t, x, data, h->len);
        p->nposted--;
        t->nposted--;
        complete_once(x, st);
        return;
    }
    if (rr_has_tag(p, h->tag)) {
        loomi_match_length(&t->match, p->rank, h->len, EAGER_MAX + 1);
        return;
    }
    struct tc mine = rr_conflict(p, h->tag, h->chk);
    if (mine.tag) {
        conflict(t, p, (struct tc){h->tag, h->chk}, mine);
        return;
    }
    struct loomi_unexp *u;
    if (loomi_match_early(&t->match, &p->mq, p->rank, h->tag, h->chk, h->len, 1, &u)) return;
    memcpy(u->buf, data, h->len);
    u->got = h->len;
}

static void on_cts(struct verbs *t, struct peer *p, const struct vhdr *h)
{
    struct op *o = q_find_tag(&p->wait_cts, h->tag);
    if (!o) {
        struct tc mine = q_conflict(&p->wait_cts, h->tag, h->chk);
        uint32_t my = mine.tag ? 0 : loomi_match_own_conflict(&t->match, h->tag, h->chk);
        if (my) mine = (struct tc){h->tag, my};
        if (mine.tag) {
            conflict(t, p, (struct tc){h->tag, h->chk}, mine);
            return;
        }
        if (p->nucts >= UCTS_LIMIT) {
            peer_error(t, p, LOOM_ERR_REMOTE, "too many clear-to-send messages for no send");
            return;
        }
        o = op_new(t);
        if (!o) {
            peer_error(t, p, LOOM_ERR_NO_MEMORY, "out of memory");
            return;
        }
        o->type = OP_RNDV;
        o->p = p;
        o->tag = h->tag;
        o->len = h->len;
        o->raddr = h->addr;
        o->rkey = h->rkey;
        o->rid = h->rid;
        o->chk = h->chk;
        o->have_cts = 1;
        q_push(&p->ucts, o);
        p->nucts++;
        return;
    }
    q_remove(&p->wait_cts, o);
    if (o->chk != h->chk) {
        struct loomi_xfer *x = o->x;
        struct tc mine = {o->tag, o->chk};
        release_op(t, p, o);
        complete_once(x, LOOM_ERR_MISMATCH);
        conflict(t, p, (struct tc){h->tag, h->chk}, mine);
        return;
    }
    if (o->len != h->len) {
        struct loomi_xfer *x = o->x;
        size_t l = o->len;
        release_op(t, p, o);
        complete_once(x, LOOM_ERR_MISMATCH);
        loomi_match_length(&t->match, p->rank, l, h->len);
        return;
    }
    o->raddr = h->addr;
    o->rkey = h->rkey;
    o->rid = h->rid;
    o->have_cts = 1;
    q_push(&p->fifo, o);
}

static void on_imm(struct verbs *t, struct peer *p, uint32_t rid)
{
    unsigned idx = rid & 0xffffu, gen = rid >> 16;
    struct rrecv *r = idx < RR_MAX ? &p->rr[idx] : NULL;
    if (!r || !r->used || r->gen != gen) {
        peer_error(t, p, LOOM_ERR_REMOTE, "protocol error: write completion for unknown id %u",
                   rid);
        return;
    }
    struct loomi_xfer *x = r->dead ? NULL : r->x;
    loomi_verbs_mr_put(t, r->mr);
    r->x = NULL;
    r->mr = NULL;
    r->used = 0;
    r->dead = 0;
    if (x) {
        p->nposted--;
        t->nposted--;
        complete_once(x, LOOM_SUCCESS);
    }
}

/* A message of byte_len bytes in a receive slot (mem), checked and acted
 * on: everything done with a peer's bytes but the verbs calls (so that
 * tests/fuzz/fuzz_verbs.c reaches it).  -1 when the peer was failed for
 * it. */
static int on_slot(struct verbs *t, struct peer *p, const char *mem, uint32_t byte_len)
{
    struct vhdr h;
    if (byte_len < sizeof h) {
        peer_error(t, p, LOOM_ERR_REMOTE, "protocol error: %u-byte message", byte_len);
        return -1;
    }
    memcpy(&h, mem, sizeof h);
    size_t payload = byte_len - sizeof h;
    if (h.magic != V_MAGIC) {
        peer_error(t, p, LOOM_ERR_REMOTE, "protocol error: bad magic 0x%08x", h.magic);
        return -1;
    }
    if (h.type == T_EAGER && h.len == payload && h.len <= EAGER_MAX) {
        on_eager(t, p, &h, mem + sizeof h);
    } else if (h.type == T_CTS && payload == 0 && h.len > EAGER_MAX && h.len <= MAX_MSG &&
               h.addr + h.len >= h.addr) {
        on_cts(t, p, &h);
    } else {
        peer_error(t, p, LOOM_ERR_REMOTE,
                   "protocol error: bad header (type %u, length %llu, %zu bytes of payload)",
                   h.type, (unsigned long long)h.len, payload);
        return -1;
    }
    return 0;
}

static void on_recv(struct verbs *t, struct slot *s, const struct ibv_wc *wc)
{
    struct peer *p = s->p;
    /* A peer already failed has had its queues emptied (peer_down): a
     * message still in the CQ would be kept as early and never freed. */
    if (p->failed) return;
    if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) on_imm(t, p, ntohl(wc->imm_data));
    else if (on_slot(t, p, s->mem, wc->byte_len)) return;
    if (p->failed) return;
    int rc = loomi_verbs_post_recv_slot(p, s);
    if (rc) {
        peer_error(t, p, LOOM_ERR_REMOTE, "reposting a receive buffer failed: %s", strerror(rc));
        return;
    }
    p->rposted++;
    maybe_send_credit(t, p);
}

static void on_wc(struct verbs *t, const struct ibv_wc *wc)
{
    int kind = *(int *)(uintptr_t)wc->wr_id;
    struct peer *p;
    struct op *o = NULL;
    struct slot *s = NULL;
    if (kind == K_WRITE) {
        o = (struct op *)(uintptr_t)wc->wr_id;
        p = o->p;
    } else {
        s = (struct slot *)(uintptr_t)wc->wr_id;
        p = s->p;
    }
    if (kind != K_RECV) p->sq_free++;
    if (kind == K_SLOT) {
        s->next_free = p->free_sb;
        p->free_sb = s;
    } else if (kind == K_CRED) {
        p->cred_busy = 0;
    } else if (kind == K_WRITE) {
        o->nout--;
        if (wc->status == IBV_WC_SUCCESS && o->x) o->done += 1;
        if (!o->x) { /* failed or cancelled earlier */
            if (o->nout == 0) {
                q_remove(&p->zombies, o);
                q_remove(&p->inflight, o);
                q_remove(&p->fifo, o);
                op_free(t, o);
            }
        } else if (o->nout == 0 && o->posted == o->len && wc->status == IBV_WC_SUCCESS) {
            struct loomi_xfer *x = o->x;
            q_remove(&p->inflight, o);
            loomi_verbs_mr_put(t, o->mr);
            op_free(t, o);
            p->nposted--;
            t->nposted--;
            complete_once(x, LOOM_SUCCESS);
        }
    }
    if (wc->status != IBV_WC_SUCCESS) {
        if (p->failed || t->aborted || wc->status == IBV_WC_WR_FLUSH_ERR) {
            if (!p->failed && !t->aborted && !p->bye)
                peer_error(t, p, LOOM_ERR_REMOTE, "queue pair flushed (in error state)");
            return;
        }
        /* A peer that died takes its queue pair along.  One that is
         * alive may have given up its part of the operation (found the
         * ranks' calls differ, say) and let go of memory this rank writes
         * into; why comes a moment later: over the owner's control plane
         * (which also sees a dead peer go), or as an abort notice on the
         * peer's control connection (sent before it lets its queue pairs
         * go).  Wait for either a short bounded while. */
        if (t->ctx.peer_word && t->ctx.peer_word(t->ctx.owner, p->rank, CTL_WHY_WAIT_MS)) {
            /* The owner has its reason; the report below changes nothing. */
        } else if (p->fd >= 0) {
            ctl_wait(t, p, CTL_WHY_WAIT_MS);
        }
        peer_error(t, p, LOOM_ERR_REMOTE, "work completion error: %s (vendor error 0x%x)",
                   wc_str(wc->status), wc->vendor_err);
        return;
    }
    if (kind == K_RECV) on_recv(t, s, wc);
}

/* ------------------------------------------------------ control path */

static void ctl_handle(struct verbs *t, struct peer *p, const struct ctlmsg *m)
{
    if (m->magic != CTL_MAGIC) {
        peer_error(t, p, LOOM_ERR_REMOTE, "protocol error on the control connection");
        return;
    }
    if (m->type == C_BYE) {
        p->bye = 1;
        return;
    }
    if (m->type == C_ABORT) {
        int failed = m->failed;
        if (failed < -1 || failed >= t->ctx.nranks) failed = -1;
        loom_result_t code = LOOM_ERR_REMOTE;
        if (m->code == LOOM_ERR_REVOKED || m->code == LOOM_ERR_TIMEOUT ||
            m->code == LOOM_ERR_MISMATCH)
            code = (loom_result_t)m->code;
        loomi_verbs_peer_down(t, p, failed, code, "the peer aborted the communicator",
                              !t->destroying);
        return;
    }
    peer_error(t, p, LOOM_ERR_REMOTE, "protocol error: control message type %u", m->type);
}

static void ctl_read(struct verbs *t, struct peer *p)
{
    while (p->fd >= 0 && !p->failed) {
        ssize_t r = recv(p->fd, p->cbuf + p->cgot, sizeof p->cbuf - p->cgot, MSG_DONTWAIT);
        if (r == 0) {
            if (p->bye && p->cgot == 0) {
                /* A polite close.  What the peer sent before it is in the
                 * CQ (it waited for its sends to be acknowledged): the
                 * check for operations left pending comes after the CQ is
                 * drained (gone_check). */
                epoll_ctl(t->epfd, EPOLL_CTL_DEL, p->fd, NULL);
                close(p->fd);
                p->fd = -1;
                p->gone = 1;
                t->ngone_check = 1;
                return;
            }
            peer_error(t, p, LOOM_ERR_REMOTE, "control connection closed by the peer");
            return;
        }
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            peer_error(t, p, LOOM_ERR_REMOTE, "control connection: %s", strerror(errno));
            return;
        }
        p->cgot += (size_t)r;
        if (p->cgot == sizeof p->cbuf) {
            struct ctlmsg m;
            memcpy(&m, p->cbuf, sizeof m);
            p->cgot = 0;
            ctl_handle(t, p, &m);
        }
    }
}

/* Read the peer's control connection until it says something that ends
 * the peer (an abort, a close) or ms pass. */
static void ctl_wait(struct verbs *t, struct peer *p, int ms)
{
    uint64_t deadline = loomi_now_ms() + (uint64_t)ms;
    while (p->fd >= 0 && !p->failed && !p->gone) {
        int left = loomi_ms_left(deadline);
        struct pollfd pfd = {.fd = p->fd, .events = POLLIN};
        int n = poll(&pfd, 1, left);
        if (n < 0 && errno != EINTR) return;
        if (n > 0) ctl_read(t, p);
        if (left <= 0) return;
    }
}

void loomi_verbs_send_ctl(struct peer *p, int type, int code, int failed, uint64_t deadline_ms)
{
    if (p->fd < 0) return;
    struct ctlmsg m = {.magic = CTL_MAGIC, .type = (uint16_t)type, .code = code, .failed = failed};
    if (deadline_ms) loomi_write_full(p->fd, &m, sizeof m, deadline_ms);
    else send(p->fd, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* ------------------------------------------------------------- progress */

int loomi_verbs_poll_cq(struct verbs *t)
{
    struct ibv_wc wc[32];
    int total = 0;
    for (int round = 0; round < 8; round++) {
        int n = t->cq->context->ops.poll_cq(t->cq, 32, wc);
        if (n < 0) return -1;
        for (int i = 0; i < n; i++) on_wc(t, &wc[i]);
        total += n;
        if (n < 32) break;
    }
    return total;
}

/* Peers that left politely can no longer complete what is posted here. */
static void gone_check(struct verbs *t)
{
    for (int r = 0; r < t->ctx.nranks; r++) {
        struct peer *p = &t->peers[r];
        if (p->gone && !p->failed && p->nposted)
            peer_error(t, p, LOOM_ERR_REMOTE,
                       "the peer destroyed the communicator with operations pending here");
    }
}

static void pump_all(struct verbs *t)
{
    for (int r = 0; r < t->ctx.nranks; r++) {
        struct peer *p = &t->peers[r];
        if (!p->active || p->failed) continue;
        if (p->fifo.head) pump(t, p);
        maybe_send_credit(t, p);
    }
}

static void handle_events(struct verbs *t, struct epoll_event *ev, int n)
{
    for (int i = 0; i < n; i++) {
        if (ev[i].data.u32 == UINT32_MAX) {
            struct ibv_cq *cq;
            void *cctx;
            if (loomi_verbs_ib.get_cq_event(t->chan, &cq, &cctx) == 0) {
                loomi_verbs_ib.ack_cq_events(cq, 1);
                t->armed = 0;
            }
            continue;
        }
        uint32_t r = ev[i].data.u32;
        if (r < (uint32_t)t->ctx.nranks && t->peers[r].fd >= 0) ctl_read(t, &t->peers[r]);
    }
}

loom_result_t loomi_verbs_progress(void *state, int timeout_ms)
{
    struct verbs *t = state;
    struct epoll_event ev[16];
    int n = loomi_verbs_poll_cq(t);
    if (n < 0) return loomi_fail(LOOM_ERR_SYSTEM, t->ctx.rank, "verbs: polling the CQ failed");
    pump_all(t);
    /* The control connections only bring aborts and goodbyes: a look now
     * and then while polling is enough. */
    if (timeout_ms > 0 || ++t->polls % 16 == 0) {
        int k = epoll_wait(t->epfd, ev, 16, 0);
        if (k > 0) {
            handle_events(t, ev, k);
            n = k;
        }
    }
    if (n == 0 && timeout_ms > 0) {
        if (!t->armed) {
            if (t->cq->context->ops.req_notify_cq(t->cq, 0) == 0) t->armed = 1;
            /* A completion may have come before the arming. */
            n = loomi_verbs_poll_cq(t);
            if (n > 0) pump_all(t);
        }
        if (n == 0) {
            int k = epoll_wait(t->epfd, ev, 16, timeout_ms);
            if (k < 0 && errno != EINTR)
                return loomi_fail(LOOM_ERR_SYSTEM, t->ctx.rank, "verbs: epoll_wait: %s",
                                  strerror(errno));
            if (k > 0) handle_events(t, ev, k);
            if (loomi_verbs_poll_cq(t) > 0) pump_all(t);
        }
    }
    if (t->ngone_check) {
        t->ngone_check = 0;
        if (loomi_verbs_poll_cq(t) > 0) pump_all(t);
        gone_check(t);
    }
    if (t->nposted == 0 && t->nmr) loomi_verbs_mr_trim(t, 1, 0);
    return LOOM_SUCCESS;
}

int loomi_verbs_wait_fd(void *state)
{
    struct verbs *t = state;
    if (!t->armed && t->cq->context->ops.req_notify_cq(t->cq, 0) == 0) t->armed = 1;
    return t->epfd;
}

/* ---------------------------------------------------------- data calls */

/* The peer a new transfer goes to or comes from, the transfer noted
 * (note_op), or NULL (error set) when it cannot: a bad rank, a peer
 * failed, a message too long. */
static struct peer *xfer_peer(struct verbs *t, struct loomi_xfer *x, loom_result_t *r)
{
    if (x->peer < 0 || x->peer >= t->ctx.nranks || x->peer == t->ctx.rank ||
        !t->peers[x->peer].active) {
        *r = loomi_fail(LOOM_ERR_INTERNAL, t->ctx.rank, "verbs: transfer to bad rank %d",
                        x->peer);
        return NULL;
    }
    struct peer *p = &t->peers[x->peer];
    if (p->failed || t->aborted) {
        *r = loomi_fail(LOOM_ERR_REMOTE, t->ctx.rank, "verbs: rank %d has failed", x->peer);
        return NULL;
    }
    x->t_done = 0;
    x->t_posted = 0;
    x->t_next = x->t_prev = NULL;
    if (x->len > MAX_MSG) {
        *r = loomi_fail(LOOM_ERR_INVALID_ARGUMENT, t->ctx.rank, "verbs: message of %zu bytes",
                        x->len);
        return NULL;
    }
    note_op(t, x);
    if (p->failed) {
        *r = loomi_fail(LOOM_ERR_REMOTE, t->ctx.rank, "verbs: rank %d failed", x->peer);
        return NULL;
    }
    return p;
}

loom_result_t loomi_verbs_isend(void *state, struct loomi_xfer *x)
{
    struct verbs *t = state;
    loom_result_t r;
    struct peer *p = xfer_peer(t, x, &r);
    if (!p) return r;
    struct op *o = op_new(t);
    if (!o) return loomi_fail(LOOM_ERR_NO_MEMORY, t->ctx.rank, "verbs: out of memory");
    o->p = p;
    o->x = x;
    o->tag = x->tag;
    o->chk = x->chk;
    o->len = x->len;
    if (x->len <= EAGER_MAX) {
        o->type = OP_EAGER;
        q_push(&p->fifo, o);
    } else {
        o->type = OP_RNDV;
        char why[256] = "";
        o->mr = x->dev ? loomi_verbs_mr_get_dev(t, x->buf, x->len, why, sizeof why)
                       : loomi_verbs_mr_get(t, x->buf, x->len);
        if (!o->mr) {
            op_free(t, o);
            return loomi_fail(LOOM_ERR_SYSTEM, t->ctx.rank,
                              "verbs: cannot register a %zu-byte send buffer%s%s%s", x->len,
                              why[0] ? " (" : "", why, why[0] ? ")" : "");
        }
        struct op *c = q_find_tag(&p->ucts, x->tag);
        if (c && c->chk != x->chk) {
            struct tc theirs = {c->tag, c->chk};
            q_remove(&p->ucts, c);
            p->nucts--;
            op_free(t, c);
            loomi_verbs_mr_put(t, o->mr);
            op_free(t, o);
            p->nposted++;
            t->nposted++;
            conflict(t, p, theirs, (struct tc){x->tag, x->chk});
            complete_once(x, LOOM_ERR_MISMATCH);
            return LOOM_SUCCESS;
        }
        if (c) {
            q_remove(&p->ucts, c);
            p->nucts--;
            if (c->len != x->len) {
                size_t want = c->len;
                op_free(t, c);
                loomi_verbs_mr_put(t, o->mr);
                op_free(t, o);
                p->nposted++;
                t->nposted++;
                loomi_match_length(&t->match, p->rank, x->len, want);
                complete_once(x, LOOM_ERR_MISMATCH);
                return LOOM_SUCCESS;
            }
            o->raddr = c->raddr;
            o->rkey = c->rkey;
            o->rid = c->rid;
            o->have_cts = 1;
            op_free(t, c);
            q_push(&p->fifo, o);
        } else {
            q_push(&p->wait_cts, o);
            struct tc theirs = q_conflict(&p->ucts, x->tag, x->chk);
            if (theirs.tag) { /* x fails with the peer's other transfers */
                p->nposted++;
                t->nposted++;
                conflict(t, p, theirs, (struct tc){x->tag, x->chk});
                return LOOM_SUCCESS;
            }
        }
    }
    p->nposted++;
    t->nposted++;
    pump(t, p);
    return LOOM_SUCCESS;
}

loom_result_t loomi_verbs_irecv(void *state, struct loomi_xfer *x)
{
    struct verbs *t = state;
    loom_result_t r;
    struct peer *p = xfer_peer(t, x, &r);
    if (!p) return r;
    /* Opens as tcp's and shm's irecv do (and as isend above): the peer,
     * its count, then match.c; what follows is verbs' own. */
    p->nposted++;
    t->nposted++;
    struct loomi_unexp *u;
    /* Failed: x fails with the peer's other transfers. */
    if (loomi_match_post(&t->match, &p->mq, p->rank, x, &u)) return LOOM_SUCCESS;
    if (u) { /* an early eager message with this tag, all of it in */
        loomi_mq_unexp_del(&p->mq, u);
        loom_result_t st = copy_in(t, x, u->buf, u->total);
        loomi_match_unexp_free(&t->match, u);
        p->nposted--;
        t->nposted--;
        complete_once(x, st);
        return LOOM_SUCCESS;
    }
    if (x->len <= EAGER_MAX) return LOOM_SUCCESS; /* listed */
    loomi_mq_recv_del(&p->mq, x); /* a rendezvous receive is matched by its id instead */
    /* Rendezvous: register, then tell the sender where to write. */
    int idx = -1;
    for (int k = 0; k < RR_MAX; k++) {
        int i = (p->rr_next + k) % RR_MAX;
        if (!p->rr[i].used) {
            idx = i;
            break;
        }
    }
    struct op *o = idx >= 0 ? op_new(t) : NULL;
    char why[256] = "";
    struct mrent *e = !o       ? NULL
                      : x->dev ? loomi_verbs_mr_recv_dev(t, x->buf, x->len, why, sizeof why)
                               : loomi_verbs_mr_recv(t, x->buf, x->len);
    if (!e) {
        if (o) op_free(t, o);
        p->nposted--;
        t->nposted--;
        return loomi_fail(idx < 0 ? LOOM_ERR_NO_MEMORY : LOOM_ERR_SYSTEM, t->ctx.rank,
                          "verbs: cannot set up a %zu-byte receive from rank %d (%s%s%s)",
                          x->len, p->rank, idx < 0 ? "too many in flight" : "registration failed",
                          why[0] ? ": " : "", why);
    }
    p->rr_next = (idx + 1) % RR_MAX;
    struct rrecv *rr = &p->rr[idx];
    rr->used = 1;
    rr->dead = 0;
    rr->gen++;
    rr->x = x;
    rr->mr = e;
    o->type = OP_CTS;
    o->p = p;
    o->tag = x->tag;
    o->chk = x->chk;
    o->len = x->len;
    o->raddr = (uintptr_t)x->buf;
    o->rkey = e->mr->rkey;
    o->rid = ((uint32_t)rr->gen << 16) | (uint32_t)idx;
    q_push(&p->fifo, o);
    pump(t, p);
    return LOOM_SUCCESS;
}

void loomi_verbs_cancel(void *state, struct loomi_xfer *x)
{
    struct verbs *t = state;
    if (x->peer < 0 || x->peer >= t->ctx.nranks) return;
    struct peer *p = &t->peers[x->peer];
    if (!p->active) return;
    int found = loomi_mq_recv_has(&p->mq, x, 1);
    for (struct op *o = p->wait_cts.head; o; o = o->next)
        if (o->x == x) {
            q_remove(&p->wait_cts, o);
            release_op(t, p, o);
            found = 1;
            break;
        }
    struct opq *qs[] = {&p->fifo, &p->inflight};
    for (int k = 0; k < 2; k++)
        for (struct op *o = qs[k]->head; o; o = o->next)
            if (o->x == x) {
                if (o->mr) loomi_verbs_mr_put(t, o->mr);
                o->mr = NULL;
                o->x = NULL; /* its work requests, if any, still complete */
                found = 1;
            }
    for (int i = 0; i < RR_MAX; i++) {
        struct rrecv *r = &p->rr[i];
        if (r->used && r->x == x && !r->dead) {
            r->dead = 1;
            r->x = NULL;
            /* The peer may still write: the receive's own registration
             * goes now (the writes then fail there). */
            loomi_verbs_mr_put(t, r->mr);
            r->mr = NULL;
            found = 1;
        }
    }
    if (found && p->nposted > 0) {
        p->nposted--;
        t->nposted--;
    }
    x->t_posted = XFER_DEAD;
}

#endif /* HAVE_VERBS_H */
