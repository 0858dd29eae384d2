/*
 * verbs.c - the RDMA verbs transport (InfiniBand, RoCE, soft-RoCE).
 *
 * libibverbs is loaded at run time (dlopen), so one build runs on
 * machines with and without it; where it or a device is missing,
 * create() says so and returns LOOM_ERR_UNSUPPORTED.
 *
 * Every pair of ranks is joined by one reliable-connected queue pair.
 * The queue pair numbers, GIDs, LIDs and first packet numbers travel over
 * a TCP connection opened for the purpose (the published address is only
 * that listener's); the connection then stays open as the control path:
 * abort notices and goodbyes go over it, and its end tells at once that a
 * peer process died.
 *
 * Data, two-sided with 64-bit tags (a receive matches the sender's length
 * exactly, as in tcp_data.c):
 *  - eager: a message of up to EAGER_MAX bytes is copied into a registered
 *    slot and sent into one of the receive buffers the peer keeps posted
 *    for this rank; an early message is buffered until its receive comes;
 *  - rendezvous: for a longer one, the receiver, which knows the length,
 *    sends a clear-to-send (CTS: address, rkey, id) as soon as the
 *    receive is posted; the sender RDMA-writes the message straight from
 *    its buffer into the receiver's, in WR_CHUNK pieces kept in flight
 *    together, the last one a write with immediate data carrying the id,
 *    which completes the receive.  No copy on either side.
 * Flow control is by credits: the sender may have as many messages that
 * take a receive buffer (eager, CTS, the write with immediate) in flight
 * as the peer has receive buffers posted for it; the peer RDMA-writes its
 * running count of posted buffers into this rank's credit word for it.
 * Each peer's credit word is registered on its own (8 bytes, its own
 * key, sent in that peer's hello only), so a peer can write its own
 * count and nothing else: not another peer's, not the words this rank
 * sends from (those sit in the peer's local-access region).
 *
 * A registration gives a peer only what the protocol needs of it.  A
 * rendezvous receive's buffer is registered for that receive alone, with
 * REMOTE_WRITE (never REMOTE_READ: nothing is read remotely), and is
 * deregistered the moment the receive ends (its final write arrived, it
 * was cancelled, the peer failed): its address and key in the CTS open
 * nothing afterwards.  Send buffers, the sources of the writes, need
 * local access only; they are registered through a small cache (LRU,
 * bounded in entries and bytes) that holds nothing but such local-access
 * registrations.  Cache entries that no transfer uses are dropped
 * whenever the transport goes idle, since the application may free that
 * memory once its operation is done and get the same addresses back
 * later for other pages; memory registered with mem_register stays (for
 * local access, as the cache's) until mem_deregister.
 *
 * An error completion, a queue pair in error or a control connection
 * that ends without a goodbye is a failed peer (ctx->peer_failed).  Every
 * value read from the network is range-checked before use.
 *
 * This file holds the set-up (the device's resources, the queue pair
 * exchange), the teardown, the registration cache with mem_register and
 * the ops table; verbs_dev.c loads libibverbs and picks the device;
 * verbs_data.c is the data path (posting, completions, the control
 * connection, failure, progress); verbs_internal.h is what they share.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda.h"
#include "core/internal.h"
#include "transports/verbs/verbs.h"

#ifndef HAVE_VERBS_H

/* Built without infiniband/verbs.h: the transport exists but is never
 * available. */
int loomi_verbs_available(char *why, size_t n)
{
    snprintf(why, n, "this build has no verbs support (infiniband/verbs.h was not found at "
                     "configure time)");
    return 0;
}

static loom_result_t stub_create(const struct loomi_tctx *ctx, void **state)
{
    *state = NULL;
    LOOMI_INFO(ctx->rank, "verbs: not available: built without infiniband/verbs.h");
    return loomi_fail(LOOM_ERR_UNSUPPORTED, ctx->rank,
                      "verbs: this build has no verbs support (infiniband/verbs.h was not "
                      "found at configure time)");
}
void loomi_verbs_gd_stats(void *state, struct loomi_verbs_gd_stats *st)
{
    (void)state;
    memset(st, 0, sizeof *st);
}

const char *loomi_verbs_gd_why(void *state)
{
    (void)state;
    return "";
}

int loomi_verbs_gd_probe(void *state, const char *fn, void *p, size_t len, char *why, size_t n)
{
    (void)state, (void)fn, (void)p, (void)len;
    snprintf(why, n, "this build has no verbs support");
    return 0;
}

/* The ops table: only create, which fails; route.c drops a transport
 * whose create fails and calls none of its other members. */
const struct loomi_transport_ops loomi_verbs_ops = {
    .name = "verbs",
    .caps = LOOMI_TCAP_TWO_SIDED,
    .create = stub_create,
};

#else /* HAVE_VERBS_H */

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "transports/auth.h"
#include "transports/net.h"
#include "transports/verbs/verbs_internal.h"

/* ---------------------------------------------- registration cache */

static void mr_unlink_free(struct verbs *t, struct mrent *e)
{
    for (struct mrent **l = &t->mrs; *l; l = &(*l)->next)
        if (*l == e) {
            *l = e->next;
            break;
        }
    t->nmr--;
    t->mr_bytes -= e->len;
    if (e->mr) loomi_verbs_ib.dereg_mr(e->mr);
    if (e->dev) t->gd.deregs++;
    free(e);
}

/* Drop unused entries (all of them, or the least recently used until the
 * cache is within its bounds with `extra` bytes more). */
void loomi_verbs_mr_trim(struct verbs *t, int all, size_t extra)
{
    for (;;) {
        if (!all && t->nmr < REG_MAX_ENTRIES && t->mr_bytes + extra <= REG_MAX_BYTES) return;
        struct mrent *victim = NULL;
        for (struct mrent *e = t->mrs; e; e = e->next)
            if (!e->refs && !e->user && (!victim || e->used < victim->used)) victim = e;
        if (!victim) return;
        mr_unlink_free(t, victim);
    }
}

/* A registration of [addr, addr+len) with the access given, held once. */
static struct mrent *mr_new(struct verbs *t, void *addr, size_t len, int access)
{
    struct mrent *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->mr = loomi_verbs_ib.reg_mr(t->pd, addr, len ? len : 1, access);
    if (!e->mr) {
        LOOMI_WARN(t->ctx.rank, "verbs: cannot register %zu bytes at %p: %s", len, addr,
                   strerror(errno));
        free(e);
        return NULL;
    }
    e->addr = addr;
    e->len = len;
    e->refs = 1;
    return e;
}

/* A new registration e (NULL: none was made) of len bytes joins the
 * cache, most recently used. */
static struct mrent *cache_add(struct verbs *t, struct mrent *e, size_t len)
{
    if (!e) return NULL;
    e->used = ++t->mr_clock;
    e->next = t->mrs;
    t->mrs = e;
    t->nmr++;
    t->mr_bytes += len;
    return e;
}

struct mrent *loomi_verbs_mr_get(struct verbs *t, void *addr, size_t len)
{
    uintptr_t a = (uintptr_t)addr;
    for (struct mrent *e = t->mrs; e; e = e->next) {
        uintptr_t b = (uintptr_t)e->addr;
        if (!e->doomed && !e->dev && a >= b && a + len <= b + e->len) {
            e->refs++;
            e->used = ++t->mr_clock;
            return e;
        }
    }
    loomi_verbs_mr_trim(t, 0, len);
    /* Local access only (LOCAL_WRITE: a writable pin, so that the pages
     * stay the ones the process writes). */
    return cache_add(t, mr_new(t, addr, len, IBV_ACCESS_LOCAL_WRITE), len);
}

struct mrent *loomi_verbs_mr_recv(struct verbs *t, void *addr, size_t len)
{
    /* REMOTE_WRITE needs LOCAL_WRITE with it (the verbs API's rule). */
    struct mrent *e = mr_new(t, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (e) e->remote = 1;
    return e;
}

/* ------------------------------------------------- GPUDirect RDMA */

/* The allocation p belongs to, as the driver names it (0: unknown): an
 * allocation freed and made again at the same address gets a new id. */
static unsigned long long dev_bufid(const void *p)
{
    const struct loomi_cuda_drv *d = loomi_cuda_driver();
    unsigned long long id = 0;
    if (!d || d->PointerGetAttribute(&id, LOOMI_CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                     (loomi_cuptr_t)(uintptr_t)p) != 0)
        return 0;
    return id;
}

/* A new registration of device memory [addr, addr + len) through a
 * dmabuf, or NULL with why (and, in auto mode, the refusal kept: device
 * memory is then never tried again by this state, and the reason is
 * logged once, at info). */
static struct mrent *mr_new_dev(struct verbs *t, void *addr, size_t len, int access, char *why,
                                size_t n)
{
    if (t->gd_mode == LOOMI_GPUDIRECT_OFF) {
        t->gd.skipped++;
        snprintf(why, n, "LOOM_GPUDIRECT=0");
        return NULL;
    }
    if (t->gd_refused) {
        t->gd.skipped++;
        snprintf(why, n, "%s", t->gd_why);
        return NULL;
    }
    t->gd.tries++;
    struct ibv_mr *mr = NULL;
    int fd = -1;
    size_t off = 0;
    if (!loomi_verbs_ib.reg_dmabuf_mr)
        snprintf(why, n, "libibverbs.so.1 lacks ibv_reg_dmabuf_mr (rdma-core 34 or later has it)");
    else if (loomi_cuda_dmabuf(addr, len, &fd, &off, why, n) == 0) {
        /* iova = the device address, so that peers' RDMA addresses are
         * the device pointers themselves, as with host memory. */
        mr = loomi_verbs_ib.reg_dmabuf_mr(t->pd, off, len ? len : 1, (uint64_t)(uintptr_t)addr,
                                          fd, access);
        int err = errno;
        close(fd); /* the registration holds the dmabuf */
        if (!mr)
            snprintf(why, n, "ibv_reg_dmabuf_mr on %s refused %zu bytes of device memory: %s",
                     t->dev.name, len, strerror(err));
    }
    struct mrent *e = mr ? calloc(1, sizeof *e) : NULL;
    if (!e) {
        if (mr) {
            loomi_verbs_ib.dereg_mr(mr);
            snprintf(why, n, "out of memory");
        }
        t->gd.refused++;
        if (t->gd_mode == LOOMI_GPUDIRECT_AUTO && !t->gd_refused) {
            t->gd_refused = 1;
            snprintf(t->gd_why, sizeof t->gd_why, "%s", why);
            LOOMI_INFO(t->ctx.rank,
                       "verbs: GPUDirect RDMA not available (%s): device buffers are staged "
                       "through host memory",
                       why);
        }
        return NULL;
    }
    t->gd.regs++;
    e->mr = mr;
    e->addr = addr;
    e->len = len;
    e->refs = 1;
    e->dev = 1;
    e->bufid = dev_bufid(addr);
    return e;
}

struct mrent *loomi_verbs_mr_get_dev(struct verbs *t, void *addr, size_t len, char *why,
                                     size_t n)
{
    uintptr_t a = (uintptr_t)addr;
    for (struct mrent *e = t->mrs; e; e = e->next) {
        uintptr_t b = (uintptr_t)e->addr;
        if (!e->doomed && e->dev && a >= b && a + len <= b + e->len) {
            /* The same addresses, another allocation: the entry pins
             * memory the application freed; it goes when unused. */
            if (e->bufid != dev_bufid(addr)) {
                e->doomed = 1;
                t->gd.stale++;
                if (!e->refs && !e->user) mr_unlink_free(t, e);
                break;
            }
            e->refs++;
            e->used = ++t->mr_clock;
            t->gd.hits++;
            return e;
        }
    }
    loomi_verbs_mr_trim(t, 0, len);
    /* Local access, as the host cache's; a receive's remote access is
     * its own registration, as for host memory. */
    return cache_add(t, mr_new_dev(t, addr, len, IBV_ACCESS_LOCAL_WRITE, why, n), len);
}

struct mrent *loomi_verbs_mr_recv_dev(struct verbs *t, void *addr, size_t len, char *why,
                                      size_t n)
{
    struct mrent *e =
        mr_new_dev(t, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, why, n);
    if (e) e->remote = 1;
    return e;
}

void loomi_verbs_gd_stats(void *state, struct loomi_verbs_gd_stats *st)
{
    const struct verbs *t = state;
    if (t) *st = t->gd;
    else memset(st, 0, sizeof *st);
}

const char *loomi_verbs_gd_why(void *state)
{
    const struct verbs *t = state;
    return t && t->gd_refused ? t->gd_why : "";
}

int loomi_verbs_gd_probe(void *state, const char *fn, void *p, size_t len, char *why, size_t n)
{
    struct verbs *t = state;
    struct mrent *e = loomi_verbs_mr_get_dev(t, p, len, why, n);
    if (e) {
        loomi_verbs_mr_put(t, e); /* stays cached */
        return 1;
    }
    if (t->gd_mode != LOOMI_GPUDIRECT_ON) return 0;
    loomi_fail(LOOM_ERR_UNSUPPORTED, t->ctx.rank,
               "%s: LOOM_GPUDIRECT=1 but device memory %p (%zu bytes) cannot be registered with "
               "%s: %s (set LOOM_GPUDIRECT=auto to stage it through host memory instead)",
               fn, p, len, t->dev.name, why);
    return -1;
}

void loomi_verbs_mr_put(struct verbs *t, struct mrent *e)
{
    if (!e) return;
    if (e->remote) {
        if (--e->refs == 0) {
            loomi_verbs_ib.dereg_mr(e->mr);
            if (e->dev) t->gd.deregs++;
            free(e);
        }
        return;
    }
    if (--e->refs == 0 && e->doomed && !e->user) mr_unlink_free(t, e);
}

/* -------------------------------------------------------------- set-up */

const char *loomi_verbs_device(void *state)
{
    const struct verbs *t = state;
    return t->dev.name;
}

static loom_result_t verbs_create(const struct loomi_tctx *ctx, void **state)
{
    *state = NULL;
    char why[256];
    struct dev_choice d;
    struct ibv_context *c =
        loomi_verbs_open_choice(&d, ctx->verbs.nic_hint, ctx->rank, why, sizeof why);
    if (!c) {
        LOOMI_INFO(ctx->rank, "verbs: not available: %s", why);
        return loomi_fail(LOOM_ERR_UNSUPPORTED, ctx->rank, "verbs: not available: %s", why);
    }
    struct verbs *t = calloc(1, sizeof *t);
    if (!t) {
        loomi_verbs_ib.close_device(c);
        return loomi_fail(LOOM_ERR_NO_MEMORY, ctx->rank, "verbs: out of memory");
    }
    t->ctx = *ctx;
    t->gd_mode = ctx->verbs.gpudirect;
    loomi_match_init(&t->match, &t->ctx, sizeof(struct loomi_unexp), UNEXP_LIMIT,
                     loomi_verbs_match_fail, t);
    t->dev = d;
    t->ibctx = c;
    t->lfd = t->epfd = -1;
    *state = t; /* from here on, destroy() cleans up */
    t->peers = calloc((size_t)ctx->nranks, sizeof *t->peers);
    size_t cbytes = (size_t)ctx->nranks * CRED_STRIDE * sizeof(uint64_t);
    t->cred = aligned_alloc(4096, (cbytes + 4095) / 4096 * 4096);
    if (!t->peers || !t->cred) return loomi_fail(LOOM_ERR_NO_MEMORY, ctx->rank, "verbs: out of memory");
    memset(t->cred, 0, cbytes);
    for (int r = 0; r < ctx->nranks; r++) {
        t->peers[r].rank = r;
        t->peers[r].fd = -1;
    }
    struct ibv_device_attr da;
    if (loomi_verbs_ib.query_device(c, &da))
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "verbs: cannot query %s", d.name);
    t->pd = loomi_verbs_ib.alloc_pd(c);
    t->chan = t->pd ? loomi_verbs_ib.create_comp_channel(c) : NULL;
    if (!t->chan)
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "verbs: %s: cannot allocate a protection "
                          "domain or completion channel: %s", d.name, strerror(errno));
    long want = (long)(ctx->nranks > 1 ? ctx->nranks - 1 : 1) * (SQ_DEPTH + NRX) + 64;
    t->cq_size = (int)LOOMI_MIN(want, (long)da.max_cqe);
    t->cq = loomi_verbs_ib.create_cq(c, t->cq_size, NULL, t->chan, 0);
    if (!t->cq)
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "verbs: %s: cannot create a %d-entry CQ: %s",
                          d.name, t->cq_size, strerror(errno));
    int fl = fcntl(t->chan->fd, F_GETFL);
    if (fl >= 0) fcntl(t->chan->fd, F_SETFL, fl | O_NONBLOCK);
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (t->epfd < 0)
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "verbs: epoll_create1: %s", strerror(errno));
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->chan->fd, &ev))
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "verbs: epoll_ctl: %s", strerror(errno));
    /* The listener for the queue pair exchange, as tcp.c chooses it. */
    loom_result_t lr = loomi_listen_address("verbs", ctx->rank, ctx->sock.ifname,
                                            ctx->sock.bind_hint, ctx->sock.bind_hint_len,
                                            &t->laddr, &t->laddr_len);
    if (lr != LOOM_SUCCESS) return lr;
    t->lfd = socket(t->laddr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (t->lfd < 0)
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "verbs: socket: %s", strerror(errno));
    if (bind(t->lfd, (struct sockaddr *)&t->laddr, t->laddr_len) != 0 ||
        listen(t->lfd, 4096) != 0 ||
        getsockname(t->lfd, (struct sockaddr *)&t->laddr, &t->laddr_len) != 0)
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "verbs: cannot listen: %s",
                          strerror(errno));
    char g[INET6_ADDRSTRLEN] = "-";
    if (d.gid_index >= 0) inet_ntop(AF_INET6, d.gid.raw, g, sizeof g);
    LOOMI_INFO(ctx->rank, "verbs: using %s port %d (%s), GID index %d (%s), LID %u, MTU %d",
               d.name, d.port, d.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
               d.gid_index, g, d.lid, 128 << d.mtu);
    return LOOM_SUCCESS;
}

static loom_result_t verbs_local_addr(void *state, void *buf, size_t *len)
{
    struct verbs *t = state;
    struct vaddr a;
    memset(&a, 0, sizeof a);
    a.magic = ADDR_MAGIC;
    if (*len < sizeof a || loomi_sockaddr_to_wire((struct sockaddr *)&t->laddr, &a.w))
        return loomi_fail(LOOM_ERR_INTERNAL, t->ctx.rank, "verbs: cannot describe local address");
    memcpy(buf, &a, sizeof a);
    *len = sizeof a;
    return LOOM_SUCCESS;
}

/* The queue pair to p, in INIT with its receive buffers posted, and the
 * credit word p writes, registered alone. */
static loom_result_t peer_setup(struct verbs *t, struct peer *p)
{
    const int me = t->ctx.rank;
    size_t slots = (size_t)(NRX + NSB) * SLOT_BYTES;
    size_t bytes = slots + sizeof(uint64_t); /* then credsrc */
    p->region = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!p->region) return loomi_fail(LOOM_ERR_NO_MEMORY, me, "verbs: out of memory");
    p->rmr = loomi_verbs_ib.reg_mr(t->pd, p->region, bytes, IBV_ACCESS_LOCAL_WRITE);
    if (!p->rmr)
        return loomi_fail(LOOM_ERR_SYSTEM, me, "verbs: cannot register %zu bytes of buffers: %s",
                          bytes, strerror(errno));
    p->credsrc = (uint64_t *)(void *)(p->region + slots);
    p->cmr = loomi_verbs_ib.reg_mr(t->pd, &t->cred[(size_t)p->rank * CRED_STRIDE],
                                   sizeof(uint64_t),
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!p->cmr)
        return loomi_fail(LOOM_ERR_SYSTEM, me, "verbs: cannot register the credit word for "
                          "rank %d: %s", p->rank, strerror(errno));
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = t->cq;
    ia.recv_cq = t->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = SQ_DEPTH;
    ia.cap.max_recv_wr = NRX;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    p->qp = loomi_verbs_ib.create_qp(t->pd, &ia);
    if (!p->qp)
        return loomi_fail(LOOM_ERR_SYSTEM, me, "verbs: cannot create a queue pair for rank %d: %s",
                          p->rank, strerror(errno));
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = (uint8_t)t->dev.port;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
    int rc = loomi_verbs_ib.modify_qp(p->qp, &a,
                                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                          IBV_QP_ACCESS_FLAGS);
    if (rc)
        return loomi_fail(LOOM_ERR_SYSTEM, me, "verbs: queue pair to INIT: %s", strerror(rc));
    p->sq_free = SQ_DEPTH;
    p->free_sb = NULL;
    for (int i = 0; i < NRX; i++) {
        p->rx[i].kind = K_RECV;
        p->rx[i].p = p;
        p->rx[i].mem = p->region + (size_t)i * SLOT_BYTES;
        if ((rc = loomi_verbs_post_recv_slot(p, &p->rx[i])) != 0)
            return loomi_fail(LOOM_ERR_SYSTEM, me, "verbs: posting receives: %s", strerror(rc));
    }
    for (int i = NSB - 1; i >= 0; i--) {
        p->sb[i].kind = K_SLOT;
        p->sb[i].p = p;
        p->sb[i].mem = p->region + (size_t)(NRX + i) * SLOT_BYTES;
        p->sb[i].next_free = p->free_sb;
        p->free_sb = &p->sb[i];
    }
    p->credslot.kind = K_CRED;
    p->credslot.p = p;
    p->rposted = NRX;
    p->radvert = NRX;
    t->cred[(size_t)p->rank * CRED_STRIDE] = NRX;
    unsigned seed = (unsigned)loomi_now_ns() ^ ((unsigned)me << 8) ^ (unsigned)p->rank;
    p->psn = (uint32_t)rand_r(&seed) & 0xffffffu;
    return LOOM_SUCCESS;
}

int loomi_verbs_hello_ok(const struct hello *r, int me, int peer)
{
    return r->magic == HELLO_MAGIC && r->src == peer && r->dst == me && r->nrx == NRX &&
           r->mtu >= IBV_MTU_256 && r->mtu <= IBV_MTU_4096 && r->qpn <= 0xffffffu &&
           r->psn <= 0xffffffu;
}

/* Exchange queue pair details with p over fd, bring the queue pair up,
 * and agree that both ends are ready. */
static loom_result_t handshake(struct verbs *t, struct peer *p, int fd, const struct hello *in,
                               uint64_t deadline_ms)
{
    const int me = t->ctx.rank;
    struct hello h;
    memset(&h, 0, sizeof h);
    h.magic = HELLO_MAGIC;
    h.src = me;
    h.dst = p->rank;
    h.qpn = p->qp->qp_num;
    h.psn = p->psn;
    h.lid = t->dev.lid;
    h.link_layer = t->dev.link_layer;
    h.mtu = (uint8_t)t->dev.mtu;
    memcpy(h.gid, t->dev.gid.raw, 16);
    h.cred_addr = (uintptr_t)&t->cred[(size_t)p->rank * CRED_STRIDE]; /* p's word alone */
    h.cred_rkey = p->cmr->rkey;
    h.nrx = NRX;
    struct hello r;
    if (in) r = *in;
    if (loomi_write_full(fd, &h, sizeof h, deadline_ms) ||
        (!in && loomi_read_full(fd, &r, sizeof r, deadline_ms)))
        return loomi_fail(LOOM_ERR_CONNECT, me, "verbs: exchange with rank %d: %s", p->rank,
                          strerror(errno));
    if (!loomi_verbs_hello_ok(&r, me, p->rank))
        return loomi_fail(LOOM_ERR_MISMATCH, me, "verbs: rank %d answered with a bad greeting "
                          "(job key, rank, version or queue pair details)", p->rank);
    if (r.link_layer != t->dev.link_layer)
        return loomi_fail(LOOM_ERR_MISMATCH, me, "verbs: rank %d's port is %s, this rank's is %s",
                          p->rank, r.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
                          t->dev.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand");
    p->cred_raddr = r.cred_addr;
    p->cred_rkey = r.cred_rkey;
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = (enum ibv_mtu)LOOMI_MIN((int)r.mtu, (int)t->dev.mtu);
    a.dest_qp_num = r.qpn;
    a.rq_psn = r.psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = (uint8_t)t->dev.port;
    a.ah_attr.dlid = r.lid;
    int gid0 = 1;
    for (int i = 0; i < 16; i++) gid0 &= r.gid[i] == 0;
    if (t->dev.link_layer == IBV_LINK_LAYER_ETHERNET || (t->dev.gid_index >= 0 && !gid0 && !r.lid)) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, r.gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)(t->dev.gid_index < 0 ? 0 : t->dev.gid_index);
        a.ah_attr.grh.hop_limit = 64;
    }
    int rc = loomi_verbs_ib.modify_qp(p->qp, &a,
                                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                          IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc)
        return loomi_fail(LOOM_ERR_CONNECT, me, "verbs: queue pair to rank %d to RTR: %s",
                          p->rank, strerror(rc));
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;  /* 4.096 us << 14: 67 ms */
    a.retry_cnt = 7;
    a.rnr_retry = 7; /* no limit: credits keep receivers ready anyway */
    a.sq_psn = p->psn;
    a.max_rd_atomic = 1;
    rc = loomi_verbs_ib.modify_qp(p->qp, &a,
                                  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                      IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc)
        return loomi_fail(LOOM_ERR_CONNECT, me, "verbs: queue pair to rank %d to RTS: %s",
                          p->rank, strerror(rc));
    uint32_t ready = READY_MAGIC, got = 0;
    if (loomi_write_full(fd, &ready, sizeof ready, deadline_ms) ||
        loomi_read_full(fd, &got, sizeof got, deadline_ms) || got != READY_MAGIC)
        return loomi_fail(LOOM_ERR_CONNECT, me, "verbs: rank %d did not confirm its queue pair",
                          p->rank);
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return loomi_fail(LOOM_ERR_SYSTEM, me, "verbs: fcntl: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    p->fd = fd;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.u32 = (uint32_t)p->rank};
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev))
        return loomi_fail(LOOM_ERR_SYSTEM, me, "verbs: epoll_ctl: %s", strerror(errno));
    return LOOM_SUCCESS;
}

static loom_result_t verbs_connect_all(void *state, const unsigned char *addrs, size_t addr_len,
                                       uint64_t deadline_ms)
{
    struct verbs *t = state;
    const int me = t->ctx.rank, n = t->ctx.nranks;
    int expected = 0;
    for (int q = 0; q < n; q++) {
        struct vaddr va;
        if (!loomi_peer_addr(addrs, addr_len, q, me, &va, sizeof va)) continue;
        if (va.magic != ADDR_MAGIC)
            return loomi_fail(LOOM_ERR_MISMATCH, me, "verbs: rank %d published an invalid address",
                              q);
        struct peer *p = &t->peers[q];
        p->active = 1;
        t->npeers++;
        loom_result_t r = peer_setup(t, p);
        if (r != LOOM_SUCCESS) return r;
        if (q > me) expected++;
    }
    /* Lower ranks listen for us (their backlog takes the connection while
     * they are busy elsewhere, as in tcp.c). */
    for (int q = 0; q < me; q++) {
        struct peer *p = &t->peers[q];
        if (!p->active) continue;
        struct vaddr va;
        memcpy(&va, addrs + (size_t)q * addr_len, sizeof va);
        loom_result_t r;
        int fd = loomi_connect_peer(&va.w, q, deadline_ms, "verbs", me, t->ctx.job_key,
                                    LOOMI_AUTH_VERBS, 0, NULL, &r);
        if (fd < 0) return r;
        r = handshake(t, p, fd, NULL, deadline_ms);
        if (r != LOOM_SUCCESS) {
            if (p->fd != fd) close(fd);
            return r;
        }
    }
    /* Queue pair exchanges with higher ranks, through net.c's acceptor
     * (as tcp's streams); the errors say what each waits for. */
    struct loomi_acceptor ac;
    loomi_acceptor_init(&ac, t->lfd, HELLO_MAGIC, me, "verbs");
    char why[200];
    for (int got = 0; got < expected;) {
        struct hello in;
        int fd = loomi_accept_greeting(&ac, me + 1, n, t->ctx.job_key, LOOMI_AUTH_VERBS, &in,
                                       sizeof in, NULL, deadline_ms, why, sizeof why);
        if (fd < 0)
            return loomi_accept_error(&ac, fd, got, expected,
                                      "queue pair exchanges with higher ranks done", why, NULL);
        if (!t->peers[in.src].active || t->peers[in.src].fd >= 0) {
            LOOMI_WARN(me, "verbs: dropped a connection from rank %d (%s)", in.src,
                       t->peers[in.src].active ? "a second one" : "not reached through verbs");
            close(fd);
            continue;
        }
        loom_result_t r = handshake(t, &t->peers[in.src], fd, &in, deadline_ms);
        if (r != LOOM_SUCCESS) {
            if (t->peers[in.src].fd != fd) close(fd);
            loomi_acceptor_close(&ac);
            return r;
        }
        got++;
    }
    loomi_acceptor_finish(&ac, &t->lfd);
    LOOMI_INFO(me, "verbs: %d queue pair(s) up on %s port %d", t->npeers, t->dev.name,
               t->dev.port);
    return LOOM_SUCCESS;
}

static void verbs_abort_all(void *state, int failed, loom_result_t code)
{
    struct verbs *t = state;
    if (t->aborted) return;
    t->aborted = 1;
    for (int r = 0; r < t->ctx.nranks; r++) {
        struct peer *p = &t->peers[r];
        if (!p->active || p->failed) continue;
        loomi_verbs_send_ctl(p, C_ABORT, (int)code, failed, 0);
        loomi_verbs_peer_down(t, p, failed, code, "communicator aborted", 0);
    }
}

static void verbs_destroy(void *state)
{
    struct verbs *t = state;
    if (!t) return;
    /* Polite close: a goodbye on each control connection, then wait
     * (bounded) for the peers' own, so that none of them takes this
     * rank's queue pairs going away for a failure. */
    uint64_t deadline = loomi_now_ms() + 10000;
    t->destroying = 1;
    /* First every send acknowledged (it is then in the peer's CQ, ahead
     * of the goodbye). */
    for (int busy = 1; busy && t->peers && !t->aborted && loomi_ms_left(deadline);) {
        busy = 0;
        for (int r = 0; r < t->ctx.nranks; r++) {
            struct peer *p = &t->peers[r];
            if (p->active && !p->failed && p->sq_free < SQ_DEPTH) busy = 1;
        }
        if (busy && loomi_verbs_poll_cq(t) <= 0) sched_yield();
    }
    for (int r = 0; t->peers && r < t->ctx.nranks && !t->aborted; r++) {
        struct peer *p = &t->peers[r];
        if (!p->active || p->failed || p->fd < 0) continue;
        int fl = fcntl(p->fd, F_GETFL);
        if (fl >= 0) fcntl(p->fd, F_SETFL, fl | O_NONBLOCK);
        loomi_verbs_send_ctl(p, C_BYE, 0, 0, deadline);
        shutdown(p->fd, SHUT_WR);
    }
    for (int r = 0; t->peers && r < t->ctx.nranks && !t->aborted; r++) {
        struct peer *p = &t->peers[r];
        if (p->active && !p->failed && p->fd >= 0) loomi_await_close(p->fd, deadline);
    }
    for (int r = 0; t->peers && r < t->ctx.nranks; r++) {
        struct peer *p = &t->peers[r];
        if (!p->active) continue;
        p->bye = 1;
        loomi_verbs_peer_down(t, p, -1, LOOM_ERR_REVOKED, "communicator destroyed", 0);
        struct op *o = p->zombies.head;
        while (o) {
            struct op *n = o->next;
            free(o);
            o = n;
        }
        if (p->qp) loomi_verbs_ib.destroy_qp(p->qp);
        if (p->rmr) loomi_verbs_ib.dereg_mr(p->rmr);
        if (p->cmr) loomi_verbs_ib.dereg_mr(p->cmr);
        free(p->region);
    }
    while (t->mrs) {
        t->mrs->user = 0;
        mr_unlink_free(t, t->mrs);
    }
    loomi_objpool_clear(&t->ops);
    if (t->cq) {
        if (t->armed) {
            /* An event may be pending on the channel: take it so the CQ
             * can go. */
            struct ibv_cq *cq;
            void *cctx;
            if (loomi_verbs_ib.get_cq_event(t->chan, &cq, &cctx) == 0)
                loomi_verbs_ib.ack_cq_events(cq, 1);
        }
        loomi_verbs_ib.destroy_cq(t->cq);
    }
    if (t->chan) loomi_verbs_ib.destroy_comp_channel(t->chan);
    if (t->pd) loomi_verbs_ib.dealloc_pd(t->pd);
    if (t->ibctx) loomi_verbs_ib.close_device(t->ibctx);
    if (t->lfd >= 0) close(t->lfd);
    if (t->epfd >= 0) close(t->epfd);
    loomi_match_fini(&t->match);
    free(t->cred);
    free(t->peers);
    free(t);
}

/* Explicit registration: kept until mem_deregister, which invalidates it
 * (the cache never hands it out again).  Local access only, as the
 * cache's: it spares sends their registration; a receive into it still
 * registers its own, for that receive only, since nothing here may stay
 * open to peers beyond a transfer.  So no peer is given a key to it:
 * desc is empty. */
static loom_result_t verbs_mem_register(void *state, void *addr, size_t len,
                                       enum loomi_mem_kind kind, struct loomi_mr *mr)
{
    struct verbs *t = state;
    if (kind == LOOMI_MEM_MANAGED)
        return loomi_fail(LOOM_ERR_UNSUPPORTED, t->ctx.rank, "verbs: not managed memory");
    struct mrent *e;
    if (kind == LOOMI_MEM_DEVICE) {
        /* GPUDirect RDMA: refused where LOOM_GPUDIRECT, the driver or the
         * NIC says no: an error under LOOM_GPUDIRECT=1 only; otherwise
         * success with no registration (mr->handle NULL), which the
         * caller (route.c) reports as none done. */
        char why[256];
        e = loomi_verbs_mr_get_dev(t, addr, len, why, sizeof why);
        if (!e) {
            if (t->gd_mode == LOOMI_GPUDIRECT_ON)
                return loomi_fail(LOOM_ERR_UNSUPPORTED, t->ctx.rank,
                                  "verbs: LOOM_GPUDIRECT=1 but device memory %p (%zu bytes) "
                                  "cannot be registered with %s: %s",
                                  addr, len, t->dev.name, why);
            memset(mr, 0, sizeof *mr);
            return LOOM_SUCCESS;
        }
    } else {
        e = loomi_verbs_mr_get(t, addr, len);
    }
    if (!e)
        return loomi_fail(LOOM_ERR_SYSTEM, t->ctx.rank, "verbs: cannot register %zu bytes", len);
    e->user++;
    memset(mr, 0, sizeof *mr);
    mr->addr = addr;
    mr->len = len;
    mr->kind = kind;
    mr->handle = e;
    mr->desc_len = 0;
    return LOOM_SUCCESS;
}

static void verbs_mem_deregister(void *state, struct loomi_mr *mr)
{
    struct verbs *t = state;
    struct mrent *e = mr->handle;
    if (!e) return;
    mr->handle = NULL;
    e->user--;
    e->doomed = 1; /* the application may free or change the buffer now */
    loomi_verbs_mr_put(t, e);
}

/* The ops table: every transport's lists the same members in the same
 * order (transport.h), so the tables look alike on purpose. */
const struct loomi_transport_ops loomi_verbs_ops = {
    .name = "verbs",
    .caps = LOOMI_TCAP_TWO_SIDED | LOOMI_TCAP_MEM_REG,
    .create = verbs_create,
    .local_addr = verbs_local_addr,
    .connect_all = verbs_connect_all,
    .mem_register = verbs_mem_register,
    .mem_deregister = verbs_mem_deregister,
    .isend = loomi_verbs_isend,
    .irecv = loomi_verbs_irecv,
    .progress = loomi_verbs_progress,
    .wait_fd = loomi_verbs_wait_fd,
    .cancel = loomi_verbs_cancel,
    .abort_all = verbs_abort_all,
    .destroy = verbs_destroy,
};

#endif /* HAVE_VERBS_H */
