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
 * exactly, as in tcp.c):
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
 * running count of posted buffers into this rank's credit word.
 *
 * Buffers of rendezvous transfers are registered through a small cache
 * (LRU, bounded in entries and bytes).  Entries that no transfer uses are
 * dropped whenever the transport goes idle, since the application may
 * free that memory once its operation is done and get the same addresses
 * back later for other pages; memory registered with mem_register stays
 * until mem_deregister.
 *
 * An error completion, a queue pair in error or a control connection
 * that ends without a goodbye is a failed peer (ctx->peer_failed).  Every
 * value read from the network is range-checked before use.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
static loom_result_t stub_local_addr(void *s, void *b, size_t *l)
{
    (void)s, (void)b, (void)l;
    return LOOM_ERR_UNSUPPORTED;
}
static loom_result_t stub_connect_all(void *s, const unsigned char *a, size_t l, uint64_t d)
{
    (void)s, (void)a, (void)l, (void)d;
    return LOOM_ERR_UNSUPPORTED;
}
static loom_result_t stub_x(void *s, struct loomi_xfer *x)
{
    (void)s, (void)x;
    return LOOM_ERR_UNSUPPORTED;
}
static loom_result_t stub_progress(void *s, int t)
{
    (void)s, (void)t;
    return LOOM_SUCCESS;
}
static int stub_wait_fd(void *s)
{
    (void)s;
    return -1;
}
static void stub_cancel(void *s, struct loomi_xfer *x) { (void)s, (void)x; }
static void stub_abort_all(void *s, int f, loom_result_t c) { (void)s, (void)f, (void)c; }
static void stub_destroy(void *s) { (void)s; }

const struct loomi_transport_ops loomi_verbs_ops = {
    .name = "verbs",
    .caps = LOOMI_TCAP_TWO_SIDED,
    .create = stub_create,
    .local_addr = stub_local_addr,
    .connect_all = stub_connect_all,
    .isend = stub_x,
    .irecv = stub_x,
    .progress = stub_progress,
    .wait_fd = stub_wait_fd,
    .cancel = stub_cancel,
    .abort_all = stub_abort_all,
    .destroy = stub_destroy,
};

#else /* HAVE_VERBS_H */

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "transports/net.h"

/* ------------------------------------------------------- libibverbs */

/* Every libibverbs function used, by symbol.  post_send, post_recv,
 * poll_cq and req_notify_cq are reached through the context's ops, as
 * the header's inline functions do. */
static struct {
    void *lib;
    struct ibv_device **(*get_device_list)(int *);
    void (*free_device_list)(struct ibv_device **);
    const char *(*get_device_name)(struct ibv_device *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    int (*close_device)(struct ibv_context *);
    int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
    int (*query_port)(struct ibv_context *, uint8_t, void *);
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    int (*dealloc_pd)(struct ibv_pd *);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    int (*dereg_mr)(struct ibv_mr *);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *);
    int (*destroy_comp_channel)(struct ibv_comp_channel *);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *,
                                int);
    int (*destroy_cq)(struct ibv_cq *);
    int (*get_cq_event)(struct ibv_comp_channel *, struct ibv_cq **, void **);
    void (*ack_cq_events)(struct ibv_cq *, unsigned int);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    int (*destroy_qp)(struct ibv_qp *);
    const char *(*wc_status_str)(enum ibv_wc_status);
} ib;

static pthread_once_t ib_once = PTHREAD_ONCE_INIT;
static char ib_why[256]; /* empty: loaded */

static void ib_load(void)
{
    ib.lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!ib.lib) {
        snprintf(ib_why, sizeof ib_why, "libibverbs.so.1 cannot be loaded (%s)", dlerror());
        return;
    }
#define SYM(field, name)                                                                     \
    do {                                                                                     \
        *(void **)&ib.field = dlsym(ib.lib, name);                                           \
        if (!ib.field) {                                                                     \
            snprintf(ib_why, sizeof ib_why, "libibverbs.so.1 lacks %s", name);              \
            return;                                                                          \
        }                                                                                    \
    } while (0)
    SYM(get_device_list, "ibv_get_device_list");
    SYM(free_device_list, "ibv_free_device_list");
    SYM(get_device_name, "ibv_get_device_name");
    SYM(open_device, "ibv_open_device");
    SYM(close_device, "ibv_close_device");
    SYM(query_device, "ibv_query_device");
    SYM(query_port, "ibv_query_port");
    SYM(query_gid, "ibv_query_gid");
    SYM(alloc_pd, "ibv_alloc_pd");
    SYM(dealloc_pd, "ibv_dealloc_pd");
    SYM(reg_mr, "ibv_reg_mr");
    SYM(dereg_mr, "ibv_dereg_mr");
    SYM(create_comp_channel, "ibv_create_comp_channel");
    SYM(destroy_comp_channel, "ibv_destroy_comp_channel");
    SYM(create_cq, "ibv_create_cq");
    SYM(destroy_cq, "ibv_destroy_cq");
    SYM(get_cq_event, "ibv_get_cq_event");
    SYM(ack_cq_events, "ibv_ack_cq_events");
    SYM(create_qp, "ibv_create_qp");
    SYM(modify_qp, "ibv_modify_qp");
    SYM(destroy_qp, "ibv_destroy_qp");
    SYM(wc_status_str, "ibv_wc_status_str");
#undef SYM
}

static int port_query(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a)
{
    struct verbs_context *vctx = verbs_get_ctx_op(c, query_port);
    memset(a, 0, sizeof *a);
    if (vctx) return vctx->query_port(c, port, a, sizeof *a);
    return ib.query_port(c, port, a);
}

/* ------------------------------------------------------ device choice */

struct dev_choice {
    char name[64];
    int port;
    int gid_index; /* -1: none (InfiniBand with a LID) */
    union ibv_gid gid;
    uint16_t lid;
    uint8_t link_layer;
    enum ibv_mtu mtu;
};

static int is_v4_mapped(const union ibv_gid *g)
{
    static const unsigned char pre[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return !memcmp(g->raw, pre, 12);
}

static int gid_is_zero(const union ibv_gid *g)
{
    for (int i = 0; i < 16; i++)
        if (g->raw[i]) return 0;
    return 1;
}

/* "RoCE v2", "IB/RoCE v1", or "" when sysfs does not say. */
static void gid_type(const char *dev, int port, int idx, char *out, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev, port,
             idx);
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fgets(out, (int)n, f)) out[0] = 0;
    fclose(f);
    out[strcspn(out, "\n")] = 0;
}

/* Pick the GID: LOOM_IB_GID_INDEX, else RoCE v2 with an IPv4-mapped
 * address, else RoCE v2, else any non-zero entry. */
static int pick_gid(struct ibv_context *c, struct dev_choice *d, int tbl_len, char *why, size_t n)
{
    const char *env = getenv("LOOM_IB_GID_INDEX");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end || v < 0 || v >= tbl_len) {
            snprintf(why, n, "LOOM_IB_GID_INDEX=%s is not an index of %s port %d's GID table "
                     "(0..%d)", env, d->name, d->port, tbl_len - 1);
            return -1;
        }
        if (ib.query_gid(c, (uint8_t)d->port, (int)v, &d->gid)) {
            snprintf(why, n, "LOOM_IB_GID_INDEX=%s: cannot read that GID of %s port %d", env,
                     d->name, d->port);
            return -1;
        }
        d->gid_index = (int)v;
        return 0;
    }
    int best = -1, best_score = 0;
    for (int i = 0; i < tbl_len && i < 256; i++) {
        union ibv_gid g;
        if (ib.query_gid(c, (uint8_t)d->port, i, &g) || gid_is_zero(&g)) continue;
        char ty[32];
        gid_type(d->name, d->port, i, ty, sizeof ty);
        int v2 = strstr(ty, "v2") != NULL;
        int score = 1 + (v2 ? 2 : 0) + (v2 && is_v4_mapped(&g) ? 4 : 0);
        if (score > best_score) {
            best_score = score;
            best = i;
            d->gid = g;
        }
    }
    if (best < 0) {
        if (d->link_layer == IBV_LINK_LAYER_INFINIBAND && d->lid) {
            d->gid_index = -1;
            return 0;
        }
        snprintf(why, n, "%s port %d has no usable GID", d->name, d->port);
        return -1;
    }
    d->gid_index = best;
    return 0;
}

/* Open the device to use: LOOM_IB_HCA=name[:port]; else `hint` (the NIC
 * the topology gives this rank: the one closest to its GPU or cores) when
 * it has an active port; else the first device with one.  Returns the
 * context, or NULL with why set. */
static struct ibv_context *open_named(struct dev_choice *d, const char *want, int want_port,
                                      const char *hca, char *why, size_t n);

static struct ibv_context *open_choice(struct dev_choice *d, const char *hint, int rank,
                                       char *why, size_t n)
{
    pthread_once(&ib_once, ib_load);
    if (ib_why[0]) {
        snprintf(why, n, "%s", ib_why);
        return NULL;
    }
    const char *hca = getenv("LOOM_IB_HCA");
    char want[64] = "";
    int want_port = 0;
    if (hca && *hca) {
        snprintf(want, sizeof want, "%s", hca);
        char *colon = strchr(want, ':');
        if (colon) {
            *colon = 0;
            char *end;
            long p = strtol(colon + 1, &end, 10);
            if (*end || p < 1 || p > 255) {
                snprintf(why, n, "LOOM_IB_HCA=%s: bad port number", hca);
                return NULL;
            }
            want_port = (int)p;
        }
        return open_named(d, want, want_port, hca, why, n);
    }
    if (hint && *hint) {
        char hwhy[256];
        struct ibv_context *c = open_named(d, hint, 0, NULL, hwhy, sizeof hwhy);
        if (c) return c;
        LOOMI_INFO(rank, "verbs: the topology's NIC for this rank, %s, is not usable (%s); "
                         "taking the first device with an active port", hint, hwhy);
    }
    return open_named(d, "", 0, NULL, why, n);
}

/* The device named `want` ("": any), on port want_port (0: any active). */
static struct ibv_context *open_named(struct dev_choice *d, const char *want, int want_port,
                                      const char *hca, char *why, size_t n)
{
    int ndev = 0;
    struct ibv_device **list = ib.get_device_list(&ndev);
    if (!list || ndev <= 0) {
        snprintf(why, n, "no RDMA device found (libibverbs loaded; is a driver such as "
                         "rdma_rxe, mlx5_ib or irdma loaded?)");
        if (list) ib.free_device_list(list);
        return NULL;
    }
    struct ibv_context *ctx = NULL;
    if (hca) snprintf(why, n, "LOOM_IB_HCA=%s: no RDMA device with an active port", hca);
    else if (want[0]) snprintf(why, n, "%s: no such RDMA device with an active port", want);
    else snprintf(why, n, "no RDMA device with an active port");
    for (int i = 0; i < ndev && !ctx; i++) {
        const char *name = ib.get_device_name(list[i]);
        if (!name || (want[0] && strcmp(name, want))) continue;
        struct ibv_context *c = ib.open_device(list[i]);
        if (!c) continue;
        struct ibv_device_attr da;
        if (ib.query_device(c, &da)) {
            ib.close_device(c);
            continue;
        }
        for (int p = 1; p <= da.phys_port_cnt && !ctx; p++) {
            if (want_port && p != want_port) continue;
            struct ibv_port_attr pa;
            if (port_query(c, (uint8_t)p, &pa) || pa.state != IBV_PORT_ACTIVE) continue;
            memset(d, 0, sizeof *d);
            snprintf(d->name, sizeof d->name, "%s", name);
            d->port = p;
            d->lid = pa.lid;
            d->link_layer = pa.link_layer;
            d->mtu = pa.active_mtu;
            if (pick_gid(c, d, pa.gid_tbl_len, why, n)) continue;
            ctx = c;
        }
        if (!ctx) ib.close_device(c);
    }
    ib.free_device_list(list);
    return ctx;
}

int loomi_verbs_available(char *why, size_t n)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static int known = -1;
    static char reason[256];
    pthread_mutex_lock(&mu);
    if (known < 0) {
        struct dev_choice d;
        struct ibv_context *c = open_choice(&d, NULL, -1, reason, sizeof reason);
        known = c != NULL;
        if (c) ib.close_device(c);
    }
    snprintf(why, n, "%s", known ? "" : reason);
    int k = known;
    pthread_mutex_unlock(&mu);
    return k;
}

/* ------------------------------------------------------------- state */

#define V_MAGIC 0x4c4d5642u     /* "LMVB": data header */
#define ADDR_MAGIC 0x4c4d5641u  /* "LMVA": published address */
#define HELLO_MAGIC 0x4c4d5648u /* "LMVH" */
#define READY_MAGIC 0x4c4d5652u /* "LMVR" */
#define CTL_MAGIC 0x4c4d5643u   /* "LMVC" */
#define EAGER_MAX 16384u        /* largest message sent eagerly */
#define NRX 32                  /* receive buffers posted per peer */
#define NSB 32                  /* eager send slots per peer */
#define SQ_DEPTH 128            /* send work requests per queue pair */
#define WR_CHUNK (256u * 1024u) /* bytes per RDMA write */
#define CREDIT_BATCH (NRX / 4)  /* return credits in batches of this many */
#define RR_MAX 4096             /* rendezvous receives in flight per peer */
#define UNEXP_LIMIT (1ull << 30)
#define UCTS_LIMIT 65536
#define MAX_MSG (1ull << 40)
#define REG_MAX_ENTRIES 64
#define REG_MAX_BYTES (4ull << 30)

enum { T_EAGER = 1, T_CTS = 2 };
enum { C_ABORT = 1, C_BYE = 2 };
enum { K_RECV = 1, K_SLOT, K_CRED, K_WRITE };
enum { OP_EAGER = 1, OP_CTS, OP_RNDV };

struct vhdr {
    uint32_t magic;
    uint16_t type;
    uint16_t pad;
    uint64_t tag;
    uint64_t len;  /* EAGER: payload bytes; CTS: the receive's length */
    uint64_t addr; /* CTS: where to write */
    uint32_t rkey; /* CTS */
    uint32_t rid;  /* CTS: the id the final immediate carries */
    uint32_t chk;  /* EAGER, CTS: the call's check (transport.h) */
    uint32_t pad2;
};
#define SLOT_BYTES (EAGER_MAX + sizeof(struct vhdr))

struct vaddr {
    uint32_t magic;
    uint32_t reserved;
    struct loomi_wire_addr w;
};
_Static_assert(sizeof(struct vaddr) == LOOMI_VERBS_ADDR_BYTES, "verbs address size");

struct hello {
    uint32_t magic;
    unsigned char job_key[16];
    int32_t src, dst;
    uint32_t qpn, psn;
    uint16_t lid;
    uint8_t link_layer, mtu;
    unsigned char gid[16];
    uint64_t cred_addr;
    uint32_t cred_rkey;
    uint32_t nrx;
};

struct ctlmsg {
    uint32_t magic;
    uint16_t type;
    uint16_t pad;
    int32_t code;
    int32_t failed;
};

struct mrent {
    void *addr;
    size_t len;
    struct ibv_mr *mr;
    int refs;
    int doomed; /* no new users; deregistered when the last one goes */
    int user;   /* registered through mem_register */
    uint64_t used;
    struct mrent *next;
};

/* A registered slot (receive buffer or eager send slot); wr_id points at it. */
struct slot {
    int kind;
    struct peer *p;
    char *mem;
    struct slot *next_free;
};

struct op {
    int kind; /* K_WRITE: wr_id of rendezvous writes points here */
    int type;
    struct peer *p;
    struct loomi_xfer *x; /* NULL: cancelled or failed */
    struct mrent *mr;
    uint64_t tag, len, raddr;
    uint32_t rkey, rid;
    uint32_t chk; /* the call's check (of x, or of a clear-to-send) */
    int have_cts;
    size_t posted, done;
    int nout;
    struct op *next;
};

struct unexp {
    uint64_t tag;
    uint32_t chk; /* the call's check it came with */
    size_t len;
    char *buf;
    struct unexp *next;
};

struct rrecv {
    struct loomi_xfer *x;
    struct mrent *mr;
    uint16_t gen;
    int used;
    int dead; /* cancelled: the immediate is still to come */
};

struct opq {
    struct op *head, *tail;
};

struct peer {
    int rank;
    int active; /* reached through verbs */
    int failed, bye;
    int gone; /* closed its control connection after a goodbye */
    int fd;
    unsigned char cbuf[sizeof(struct ctlmsg)];
    size_t cgot;
    struct ibv_qp *qp;
    uint32_t psn;
    uint64_t cred_raddr;
    uint32_t cred_rkey;
    char *region;
    struct ibv_mr *rmr;
    struct slot rx[NRX], sb[NSB];
    struct slot *free_sb;
    int sq_free;
    uint64_t sent;       /* messages sent that took one of the peer's buffers */
    uint64_t rposted;    /* receive buffers posted for the peer, ever */
    uint64_t radvert;    /* ... of which the peer has been told */
    struct slot credslot; /* wr_id of the credit write */
    int cred_busy;
    struct opq fifo;     /* ready to post, in order */
    struct opq wait_cts; /* rendezvous sends waiting for their CTS */
    struct opq ucts;     /* CTS that came before their send */
    struct opq inflight; /* rendezvous sends fully posted, writes in flight */
    struct opq zombies;  /* failed ops whose work requests are still out */
    int nucts;
    struct loomi_xfer *recv_head, *recv_tail; /* posted eager receives */
    struct unexp *ux_head, *ux_tail;
    struct rrecv rr[RR_MAX];
    int rr_next;
    int nposted;
};

struct verbs {
    struct loomi_tctx ctx;
    struct dev_choice dev;
    struct ibv_context *ibctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    int armed;
    int cq_size;
    uint64_t *cred; /* [2 * nranks]: words peers write, then our sources */
    struct ibv_mr *cmr;
    int lfd, epfd;
    struct sockaddr_storage laddr;
    socklen_t laddr_len;
    struct peer *peers;
    int npeers; /* reached through verbs */
    size_t unexp_bytes;
    int nposted; /* over all peers */
    uint64_t noted_op; /* the operation of the last collective transfer posted, + 1 */
    int aborted;
    int ngone_check; /* a peer left: check what it leaves pending */
    int destroying;  /* in destroy(): nobody to tell of failures */
    unsigned polls;
    struct mrent *mrs;
    int nmr;
    size_t mr_bytes;
    uint64_t mr_clock;
    struct op *free_ops;
};

#define XFER_DEAD ((size_t)-1)

static void complete_once(struct loomi_xfer *x, loom_result_t st)
{
    if (x->t_posted == XFER_DEAD) return;
    x->t_posted = XFER_DEAD;
    x->complete(x, st);
}

static const char *wc_str(enum ibv_wc_status s)
{
    const char *r = ib.wc_status_str ? ib.wc_status_str(s) : NULL;
    return r ? r : "unknown status";
}

/* ---------------------------------------------------------- op queues */

static void q_push(struct opq *q, struct op *o)
{
    o->next = NULL;
    if (q->tail) q->tail->next = o;
    else q->head = o;
    q->tail = o;
}

static void q_remove(struct opq *q, struct op *o)
{
    struct op *prev = NULL;
    for (struct op *c = q->head; c; prev = c, c = c->next)
        if (c == o) {
            if (prev) prev->next = c->next;
            else q->head = c->next;
            if (q->tail == c) q->tail = prev;
            c->next = NULL;
            return;
        }
}

static struct op *q_find_tag(struct opq *q, uint64_t tag)
{
    for (struct op *c = q->head; c; c = c->next)
        if (c->tag == tag) return c;
    return NULL;
}

static struct op *op_new(struct verbs *t)
{
    struct op *o = t->free_ops;
    if (o) t->free_ops = o->next;
    else o = malloc(sizeof *o);
    if (o) memset(o, 0, sizeof *o);
    if (o) o->kind = K_WRITE;
    return o;
}

static void op_free(struct verbs *t, struct op *o)
{
    o->next = t->free_ops;
    t->free_ops = o;
}

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
    if (e->mr) ib.dereg_mr(e->mr);
    free(e);
}

/* Drop unused entries (all of them, or the least recently used until the
 * cache is within its bounds with `extra` bytes more). */
static void mr_trim(struct verbs *t, int all, size_t extra)
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

static struct mrent *mr_get(struct verbs *t, void *addr, size_t len)
{
    uintptr_t a = (uintptr_t)addr;
    for (struct mrent *e = t->mrs; e; e = e->next) {
        uintptr_t b = (uintptr_t)e->addr;
        if (!e->doomed && a >= b && a + len <= b + e->len) {
            e->refs++;
            e->used = ++t->mr_clock;
            return e;
        }
    }
    mr_trim(t, 0, len);
    struct mrent *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->mr = ib.reg_mr(t->pd, addr, len ? len : 1,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!e->mr) {
        LOOMI_WARN(t->ctx.rank, "verbs: cannot register %zu bytes at %p: %s", len, addr,
                   strerror(errno));
        free(e);
        return NULL;
    }
    e->addr = addr;
    e->len = len;
    e->refs = 1;
    e->used = ++t->mr_clock;
    e->next = t->mrs;
    t->mrs = e;
    t->nmr++;
    t->mr_bytes += len;
    return e;
}

static void mr_put(struct verbs *t, struct mrent *e)
{
    if (!e) return;
    if (--e->refs == 0 && e->doomed && !e->user) mr_unlink_free(t, e);
}

/* ------------------------------------------------------------ failure */

static void release_op(struct verbs *t, struct peer *p, struct op *o)
{
    if (o->mr) mr_put(t, o->mr);
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
    ib.modify_qp(p->qp, &a, IBV_QP_STATE);
}

/* Stop everything with p: its queue pair goes to the error state (so
 * nothing more lands in this process's memory), its control connection
 * closes and every transfer it holds fails with `code`. */
static void peer_down(struct verbs *t, struct peer *p, int failed, loom_result_t code,
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
    while ((x = p->recv_head) != NULL) {
        p->recv_head = x->t_next;
        complete_once(x, code);
    }
    p->recv_tail = NULL;
    for (int i = 0; i < RR_MAX; i++) {
        struct rrecv *r = &p->rr[i];
        if (!r->used) continue;
        if (r->x && !r->dead) complete_once(r->x, code);
        mr_put(t, r->mr);
        memset(r, 0, sizeof *r);
    }
    struct unexp *u = p->ux_head;
    while (u) {
        struct unexp *n = u->next;
        t->unexp_bytes -= u->len;
        free(u->buf);
        free(u);
        u = n;
    }
    p->ux_head = p->ux_tail = NULL;
    t->nposted -= p->nposted;
    p->nposted = 0;
    if (notify && t->ctx.peer_failed) t->ctx.peer_failed(t->ctx.owner, p->rank, failed, code, why);
}

static void send_ctl(struct peer *p, int type, int code, int failed, uint64_t deadline_ms);
static void peer_error(struct verbs *t, struct peer *p, loom_result_t code, const char *fmt, ...)
    LOOMI_PRINTF(4, 5);
static void peer_error(struct verbs *t, struct peer *p, loom_result_t code, const char *fmt, ...)
{
    if (p->failed) return;
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    LOOMI_WARN(t->ctx.rank, "verbs: peer rank %d: %s", p->rank, why);
    /* A peer that disagrees is alive: tell it why before the close, or
     * it would see only its queue pair fail. */
    if (code == LOOM_ERR_MISMATCH && p->fd >= 0) send_ctl(p, C_ABORT, (int)code, t->ctx.rank, 0);
    peer_down(t, p, p->rank, code, why, !t->destroying);
}

static void ctl_read(struct verbs *t, struct peer *p);
static void ctl_wait(struct verbs *t, struct peer *p, int ms);
/* How long a work completion error waits for the peer's word on why. */
#define CTL_WHY_WAIT_MS 200

/* ---------------------------------------------------------- posting */

static int post_recv_slot(struct peer *p, struct slot *s)
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
    uint64_t posted = __atomic_load_n(&t->cred[p->rank], __ATOMIC_ACQUIRE);
    return posted > p->sent ? posted - p->sent : 0;
}

/* Tell the peer how many receive buffers it may fill (an RDMA write of
 * the running count into its credit word). */
static void maybe_send_credit(struct verbs *t, struct peer *p)
{
    if (p->failed || p->cred_busy || p->sq_free < 1 || p->rposted - p->radvert < CREDIT_BATCH)
        return;
    uint64_t *src = &t->cred[t->ctx.nranks + p->rank];
    *src = p->rposted;
    struct ibv_sge sge = {.addr = (uintptr_t)src, .length = 8, .lkey = t->cmr->lkey};
    struct ibv_send_wr wr;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = (uintptr_t)&p->credslot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = p->cred_raddr + 8u * (uint64_t)t->ctx.rank;
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
                memcpy(s->mem + sizeof h, o->x->buf, o->len);
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
                complete_once(x, LOOM_SUCCESS);
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

static struct loomi_xfer *take_recv(struct peer *p, uint64_t tag)
{
    for (struct loomi_xfer *x = p->recv_head; x; x = x->t_next)
        if (x->tag == tag) {
            if (x->t_prev) x->t_prev->t_next = x->t_next;
            else p->recv_head = x->t_next;
            if (x->t_next) x->t_next->t_prev = x->t_prev;
            else p->recv_tail = x->t_prev;
            x->t_next = x->t_prev = NULL;
            return x;
        }
    return NULL;
}

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
 * schedule or call (transport.h), or a zero tag: among the posted
 * receives, eager and rendezvous; the early eager messages; and a queue
 * of sends or clear-to-sends. */
static struct tc recv_conflict(const struct peer *p, uint64_t tag, uint32_t chk)
{
    for (const struct loomi_xfer *x = p->recv_head; x; x = x->t_next)
        if (loomi_call_conflict(x->tag, x->chk, tag, chk)) return (struct tc){x->tag, x->chk};
    for (int i = 0; i < RR_MAX; i++)
        if (p->rr[i].used && !p->rr[i].dead && p->rr[i].x &&
            loomi_call_conflict(p->rr[i].x->tag, p->rr[i].x->chk, tag, chk))
            return (struct tc){p->rr[i].x->tag, p->rr[i].x->chk};
    return (struct tc){0, 0};
}

static struct tc unexp_conflict(const struct peer *p, uint64_t tag, uint32_t chk)
{
    for (const struct unexp *u = p->ux_head; u; u = u->next)
        if (loomi_call_conflict(u->tag, u->chk, tag, chk)) return (struct tc){u->tag, u->chk};
    return (struct tc){0, 0};
}

static struct tc q_conflict(const struct opq *q, uint64_t tag, uint32_t chk)
{
    for (const struct op *c = q->head; c; c = c->next)
        if (loomi_call_conflict(c->tag, c->chk, tag, chk)) return (struct tc){c->tag, c->chk};
    return (struct tc){0, 0};
}

static void conflict(struct verbs *t, struct peer *p, struct tc theirs, struct tc mine)
{
    char why[256];
    loomi_call_conflict_why(theirs.tag, theirs.chk, mine.tag, mine.chk, t->ctx.name_sig, why,
                            sizeof why);
    peer_error(t, p, LOOM_ERR_MISMATCH, "rank %d %s", p->rank, why);
}

/* This rank's own call of the operation tag names, where it made it
 * with another check than `chk` (transport.h), or a zero tag. */
static struct tc own_conflict(const struct verbs *t, uint64_t tag, uint32_t chk)
{
    uint32_t my = !(tag & LOOMI_TAG_P2P) && t->ctx.call_check
                      ? t->ctx.call_check(t->ctx.owner, tag) : 0;
    return my && my != chk ? (struct tc){tag, my} : (struct tc){0, 0};
}

/* A collective transfer x is posted: the first of its operation scans
 * what is held from every peer (early eager messages, clear-to-sends)
 * for one of that operation from another schedule or call, which came
 * before this rank made the call (found: that peer fails). */
static void note_op(struct verbs *t, const struct loomi_xfer *x)
{
    if (x->tag & LOOMI_TAG_P2P || t->noted_op == loomi_tag_op(x->tag) + 1) return;
    t->noted_op = loomi_tag_op(x->tag) + 1;
    for (int r = 0; r < t->ctx.nranks; r++) {
        struct peer *q = &t->peers[r];
        if (!q->active || q->failed || (!q->ux_head && !q->ucts.head)) continue;
        struct tc u = unexp_conflict(q, x->tag, x->chk);
        if (!u.tag) u = q_conflict(&q->ucts, x->tag, x->chk);
        if (u.tag) conflict(t, q, u, (struct tc){x->tag, x->chk});
    }
}

static void mismatch(struct verbs *t, struct peer *p, size_t sent, size_t want)
{
    peer_error(t, p, LOOM_ERR_MISMATCH,
               "rank %d sent a message of %zu bytes where this rank expects %zu: "
               LOOMI_MISMATCH_HINT,
               p->rank, sent, want);
}

static void on_eager(struct verbs *t, struct peer *p, const struct vhdr *h, const char *data)
{
    struct loomi_xfer *x = take_recv(p, h->tag);
    if (x && x->chk != h->chk) {
        conflict(t, p, (struct tc){h->tag, h->chk}, (struct tc){x->tag, x->chk});
        complete_once(x, LOOM_ERR_MISMATCH);
        return;
    }
    if (x) {
        if (x->len != h->len) {
            mismatch(t, p, h->len, x->len);
            complete_once(x, LOOM_ERR_MISMATCH);
            return;
        }
        if (h->len) memcpy(x->buf, data, h->len);
        p->nposted--;
        t->nposted--;
        complete_once(x, LOOM_SUCCESS);
        return;
    }
    if (rr_has_tag(p, h->tag)) {
        mismatch(t, p, h->len, EAGER_MAX + 1);
        return;
    }
    struct tc mine = recv_conflict(p, h->tag, h->chk);
    if (!mine.tag) mine = own_conflict(t, h->tag, h->chk);
    if (mine.tag) {
        conflict(t, p, (struct tc){h->tag, h->chk}, mine);
        return;
    }
    if (t->unexp_bytes + h->len > UNEXP_LIMIT) {
        peer_error(t, p, LOOM_ERR_REMOTE, "more than %llu bytes arrived for receives not posted",
                   (unsigned long long)UNEXP_LIMIT);
        return;
    }
    struct unexp *u = malloc(sizeof *u);
    char *b = malloc(h->len ? h->len : 1);
    if (!u || !b) {
        free(u);
        free(b);
        peer_error(t, p, LOOM_ERR_NO_MEMORY, "out of memory for an early message");
        return;
    }
    memcpy(b, data, h->len);
    u->tag = h->tag;
    u->chk = h->chk;
    u->len = h->len;
    u->buf = b;
    u->next = NULL;
    if (p->ux_tail) p->ux_tail->next = u;
    else p->ux_head = u;
    p->ux_tail = u;
    t->unexp_bytes += h->len;
}

static void on_cts(struct verbs *t, struct peer *p, const struct vhdr *h)
{
    struct op *o = q_find_tag(&p->wait_cts, h->tag);
    if (!o) {
        struct tc mine = q_conflict(&p->wait_cts, h->tag, h->chk);
        if (!mine.tag) mine = own_conflict(t, h->tag, h->chk);
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
        mismatch(t, p, l, h->len);
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
    mr_put(t, r->mr);
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

static void on_recv(struct verbs *t, struct slot *s, const struct ibv_wc *wc)
{
    struct peer *p = s->p;
    /* A peer already failed has had its queues emptied (peer_down): a
     * message still in the CQ would be kept as early and never freed. */
    if (p->failed) return;
    if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        on_imm(t, p, ntohl(wc->imm_data));
    } else {
        struct vhdr h;
        if (wc->byte_len < sizeof h) {
            peer_error(t, p, LOOM_ERR_REMOTE, "protocol error: %u-byte message", wc->byte_len);
            return;
        }
        memcpy(&h, s->mem, sizeof h);
        size_t payload = wc->byte_len - sizeof h;
        if (h.magic != V_MAGIC) {
            peer_error(t, p, LOOM_ERR_REMOTE, "protocol error: bad magic 0x%08x", h.magic);
            return;
        }
        if (h.type == T_EAGER && h.len == payload && h.len <= EAGER_MAX) {
            on_eager(t, p, &h, s->mem + sizeof h);
        } else if (h.type == T_CTS && payload == 0 && h.len > EAGER_MAX && h.len <= MAX_MSG &&
                   h.addr + h.len >= h.addr) {
            on_cts(t, p, &h);
        } else {
            peer_error(t, p, LOOM_ERR_REMOTE,
                       "protocol error: bad header (type %u, length %llu, %zu bytes of payload)",
                       h.type, (unsigned long long)h.len, payload);
            return;
        }
    }
    if (p->failed) return;
    int rc = post_recv_slot(p, s);
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
            mr_put(t, o->mr);
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
        peer_down(t, p, failed, code, "the peer aborted the communicator", !t->destroying);
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

/* ------------------------------------------------------------- progress */

static int poll_cq(struct verbs *t)
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
            if (ib.get_cq_event(t->chan, &cq, &cctx) == 0) {
                ib.ack_cq_events(cq, 1);
                t->armed = 0;
            }
            continue;
        }
        uint32_t r = ev[i].data.u32;
        if (r < (uint32_t)t->ctx.nranks && t->peers[r].fd >= 0) ctl_read(t, &t->peers[r]);
    }
}

static loom_result_t verbs_progress(void *state, int timeout_ms)
{
    struct verbs *t = state;
    struct epoll_event ev[16];
    int n = poll_cq(t);
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
            n = poll_cq(t);
            if (n > 0) pump_all(t);
        }
        if (n == 0) {
            int k = epoll_wait(t->epfd, ev, 16, timeout_ms);
            if (k < 0 && errno != EINTR)
                return loomi_fail(LOOM_ERR_SYSTEM, t->ctx.rank, "verbs: epoll_wait: %s",
                                  strerror(errno));
            if (k > 0) handle_events(t, ev, k);
            if (poll_cq(t) > 0) pump_all(t);
        }
    }
    if (t->ngone_check) {
        t->ngone_check = 0;
        if (poll_cq(t) > 0) pump_all(t);
        gone_check(t);
    }
    if (t->nposted == 0 && t->nmr) mr_trim(t, 1, 0);
    return LOOM_SUCCESS;
}

static int verbs_wait_fd(void *state)
{
    struct verbs *t = state;
    if (!t->armed && t->cq->context->ops.req_notify_cq(t->cq, 0) == 0) t->armed = 1;
    return t->epfd;
}

/* ---------------------------------------------------------- data calls */

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
    return p;
}

static loom_result_t verbs_isend(void *state, struct loomi_xfer *x)
{
    struct verbs *t = state;
    loom_result_t r;
    struct peer *p = xfer_peer(t, x, &r);
    if (!p) return r;
    note_op(t, x);
    if (p->failed) return loomi_fail(LOOM_ERR_REMOTE, t->ctx.rank, "verbs: rank %d failed", x->peer);
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
        o->mr = mr_get(t, x->buf, x->len);
        if (!o->mr) {
            op_free(t, o);
            return loomi_fail(LOOM_ERR_SYSTEM, t->ctx.rank,
                              "verbs: cannot register a %zu-byte send buffer", x->len);
        }
        struct op *c = q_find_tag(&p->ucts, x->tag);
        if (c && c->chk != x->chk) {
            struct tc theirs = {c->tag, c->chk};
            q_remove(&p->ucts, c);
            p->nucts--;
            op_free(t, c);
            mr_put(t, o->mr);
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
                mr_put(t, o->mr);
                op_free(t, o);
                p->nposted++;
                t->nposted++;
                mismatch(t, p, x->len, want);
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

static loom_result_t verbs_irecv(void *state, struct loomi_xfer *x)
{
    struct verbs *t = state;
    loom_result_t r;
    struct peer *p = xfer_peer(t, x, &r);
    if (!p) return r;
    note_op(t, x);
    if (p->failed) return loomi_fail(LOOM_ERR_REMOTE, t->ctx.rank, "verbs: rank %d failed", x->peer);
    p->nposted++;
    t->nposted++;
    /* An early eager message with this tag? */
    struct unexp *u = p->ux_head, *prev = NULL;
    for (; u; prev = u, u = u->next)
        if (u->tag == x->tag) break;
    if (u) {
        if (prev) prev->next = u->next;
        else p->ux_head = u->next;
        if (p->ux_tail == u) p->ux_tail = prev;
        t->unexp_bytes -= u->len;
        size_t got = u->len;
        struct tc theirs = {u->tag, u->chk};
        if (got == x->len && got && u->chk == x->chk) memcpy(x->buf, u->buf, got);
        free(u->buf);
        free(u);
        if (theirs.chk != x->chk) {
            conflict(t, p, theirs, (struct tc){x->tag, x->chk});
            complete_once(x, LOOM_ERR_MISMATCH);
            return LOOM_SUCCESS;
        }
        if (got != x->len) {
            mismatch(t, p, got, x->len);
            complete_once(x, LOOM_ERR_MISMATCH);
            return LOOM_SUCCESS;
        }
        p->nposted--;
        t->nposted--;
        complete_once(x, LOOM_SUCCESS);
        return LOOM_SUCCESS;
    }
    struct tc theirs = unexp_conflict(p, x->tag, x->chk);
    if (theirs.tag) {
        p->nposted--;
        t->nposted--;
        conflict(t, p, theirs, (struct tc){x->tag, x->chk});
        complete_once(x, LOOM_ERR_MISMATCH);
        return LOOM_SUCCESS;
    }
    if (x->len <= EAGER_MAX) {
        x->t_prev = p->recv_tail;
        x->t_next = NULL;
        if (p->recv_tail) p->recv_tail->t_next = x;
        else p->recv_head = x;
        p->recv_tail = x;
        return LOOM_SUCCESS;
    }
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
    struct mrent *e = o ? mr_get(t, x->buf, x->len) : NULL;
    if (!e) {
        if (o) op_free(t, o);
        p->nposted--;
        t->nposted--;
        return loomi_fail(idx < 0 ? LOOM_ERR_NO_MEMORY : LOOM_ERR_SYSTEM, t->ctx.rank,
                          "verbs: cannot set up a %zu-byte receive from rank %d (%s)", x->len,
                          p->rank, idx < 0 ? "too many in flight" : "registration failed");
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

static void verbs_cancel(void *state, struct loomi_xfer *x)
{
    struct verbs *t = state;
    if (x->peer < 0 || x->peer >= t->ctx.nranks) return;
    struct peer *p = &t->peers[x->peer];
    if (!p->active) return;
    int found = 0;
    for (struct loomi_xfer *y = p->recv_head; y; y = y->t_next)
        if (y == x) {
            if (x->t_prev) x->t_prev->t_next = x->t_next;
            else p->recv_head = x->t_next;
            if (x->t_next) x->t_next->t_prev = x->t_prev;
            else p->recv_tail = x->t_prev;
            x->t_next = x->t_prev = NULL;
            found = 1;
            break;
        }
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
                if (o->mr) mr_put(t, o->mr);
                o->mr = NULL;
                o->x = NULL; /* its work requests, if any, still complete */
                found = 1;
            }
    for (int i = 0; i < RR_MAX; i++) {
        struct rrecv *r = &p->rr[i];
        if (r->used && r->x == x && !r->dead) {
            r->dead = 1;
            r->x = NULL;
            /* The peer may still write: its registration goes now (the
             * writes then fail there), unless another transfer uses it. */
            if (r->mr) {
                r->mr->doomed = 1;
                mr_put(t, r->mr);
                r->mr = NULL;
            }
            found = 1;
        }
    }
    if (found && p->nposted > 0) {
        p->nposted--;
        t->nposted--;
    }
    x->t_posted = XFER_DEAD;
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
    struct ibv_context *c = open_choice(&d, ctx->verbs.nic_hint, ctx->rank, why, sizeof why);
    if (!c) {
        LOOMI_INFO(ctx->rank, "verbs: not available: %s", why);
        return loomi_fail(LOOM_ERR_UNSUPPORTED, ctx->rank, "verbs: not available: %s", why);
    }
    struct verbs *t = calloc(1, sizeof *t);
    if (!t) {
        ib.close_device(c);
        return loomi_fail(LOOM_ERR_NO_MEMORY, ctx->rank, "verbs: out of memory");
    }
    t->ctx = *ctx;
    t->dev = d;
    t->ibctx = c;
    t->lfd = t->epfd = -1;
    *state = t; /* from here on, destroy() cleans up */
    t->peers = calloc((size_t)ctx->nranks, sizeof *t->peers);
    t->cred = aligned_alloc(4096, LOOMI_MAX((size_t)4096, ((size_t)ctx->nranks * 16 + 4095) / 4096 * 4096));
    if (!t->peers || !t->cred) return loomi_fail(LOOM_ERR_NO_MEMORY, ctx->rank, "verbs: out of memory");
    memset(t->cred, 0, (size_t)ctx->nranks * 16);
    for (int r = 0; r < ctx->nranks; r++) {
        t->peers[r].rank = r;
        t->peers[r].fd = -1;
    }
    struct ibv_device_attr da;
    if (ib.query_device(c, &da))
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "verbs: cannot query %s", d.name);
    t->pd = ib.alloc_pd(c);
    t->chan = t->pd ? ib.create_comp_channel(c) : NULL;
    if (!t->chan)
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "verbs: %s: cannot allocate a protection "
                          "domain or completion channel: %s", d.name, strerror(errno));
    long want = (long)(ctx->nranks > 1 ? ctx->nranks - 1 : 1) * (SQ_DEPTH + NRX) + 64;
    t->cq_size = (int)LOOMI_MIN(want, (long)da.max_cqe);
    t->cq = ib.create_cq(c, t->cq_size, NULL, t->chan, 0);
    if (!t->cq)
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "verbs: %s: cannot create a %d-entry CQ: %s",
                          d.name, t->cq_size, strerror(errno));
    t->cmr = ib.reg_mr(t->pd, t->cred, (size_t)ctx->nranks * 16,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!t->cmr)
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "verbs: cannot register memory: %s",
                          strerror(errno));
    int fl = fcntl(t->chan->fd, F_GETFL);
    if (fl >= 0) fcntl(t->chan->fd, F_SETFL, fl | O_NONBLOCK);
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (t->epfd < 0)
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "verbs: epoll_create1: %s", strerror(errno));
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->chan->fd, &ev))
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "verbs: epoll_ctl: %s", strerror(errno));
    /* The listener for the queue pair exchange, as tcp.c chooses it. */
    const char *w = NULL;
    if (ctx->sock.ifname) {
        if (loomi_pick_address(ctx->sock.ifname, &t->laddr, &t->laddr_len, NULL, 0, &w))
            return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, ctx->rank,
                              "verbs: LOOM_SOCKET_IFNAME=%s: %s", ctx->sock.ifname, w);
    } else if (ctx->sock.bind_hint && ctx->sock.bind_hint_len <= sizeof t->laddr) {
        memcpy(&t->laddr, ctx->sock.bind_hint, ctx->sock.bind_hint_len);
        t->laddr_len = (socklen_t)ctx->sock.bind_hint_len;
    } else if (loomi_pick_address(NULL, &t->laddr, &t->laddr_len, NULL, 0, &w)) {
        return loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "verbs: no usable interface: %s", w);
    }
    if (t->laddr.ss_family == AF_INET) ((struct sockaddr_in *)&t->laddr)->sin_port = 0;
    else ((struct sockaddr_in6 *)&t->laddr)->sin6_port = 0;
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

/* The queue pair to p, in INIT with its receive buffers posted. */
static loom_result_t peer_setup(struct verbs *t, struct peer *p)
{
    const int me = t->ctx.rank;
    size_t bytes = (size_t)(NRX + NSB) * SLOT_BYTES;
    p->region = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!p->region) return loomi_fail(LOOM_ERR_NO_MEMORY, me, "verbs: out of memory");
    p->rmr = ib.reg_mr(t->pd, p->region, bytes, IBV_ACCESS_LOCAL_WRITE);
    if (!p->rmr)
        return loomi_fail(LOOM_ERR_SYSTEM, me, "verbs: cannot register %zu bytes of buffers: %s",
                          bytes, strerror(errno));
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = t->cq;
    ia.recv_cq = t->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = SQ_DEPTH;
    ia.cap.max_recv_wr = NRX;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    p->qp = ib.create_qp(t->pd, &ia);
    if (!p->qp)
        return loomi_fail(LOOM_ERR_SYSTEM, me, "verbs: cannot create a queue pair for rank %d: %s",
                          p->rank, strerror(errno));
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = (uint8_t)t->dev.port;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
    int rc = ib.modify_qp(p->qp, &a,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc)
        return loomi_fail(LOOM_ERR_SYSTEM, me, "verbs: queue pair to INIT: %s", strerror(rc));
    p->sq_free = SQ_DEPTH;
    p->free_sb = NULL;
    for (int i = 0; i < NRX; i++) {
        p->rx[i].kind = K_RECV;
        p->rx[i].p = p;
        p->rx[i].mem = p->region + (size_t)i * SLOT_BYTES;
        if ((rc = post_recv_slot(p, &p->rx[i])) != 0)
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
    t->cred[p->rank] = NRX;
    unsigned seed = (unsigned)loomi_now_ns() ^ ((unsigned)me << 8) ^ (unsigned)p->rank;
    p->psn = (uint32_t)rand_r(&seed) & 0xffffffu;
    return LOOM_SUCCESS;
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
    memcpy(h.job_key, t->ctx.job_key, 16);
    h.src = me;
    h.dst = p->rank;
    h.qpn = p->qp->qp_num;
    h.psn = p->psn;
    h.lid = t->dev.lid;
    h.link_layer = t->dev.link_layer;
    h.mtu = (uint8_t)t->dev.mtu;
    memcpy(h.gid, t->dev.gid.raw, 16);
    h.cred_addr = (uintptr_t)t->cred;
    h.cred_rkey = t->cmr->rkey;
    h.nrx = NRX;
    struct hello r;
    if (in) r = *in;
    if (loomi_write_full(fd, &h, sizeof h, deadline_ms) ||
        (!in && loomi_read_full(fd, &r, sizeof r, deadline_ms)))
        return loomi_fail(LOOM_ERR_CONNECT, me, "verbs: exchange with rank %d: %s", p->rank,
                          strerror(errno));
    if (r.magic != HELLO_MAGIC || memcmp(r.job_key, t->ctx.job_key, 16) || r.src != p->rank ||
        r.dst != me || r.nrx != NRX || r.mtu < IBV_MTU_256 || r.mtu > IBV_MTU_4096 ||
        r.qpn > 0xffffffu || r.psn > 0xffffffu)
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
    int rc = ib.modify_qp(p->qp, &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
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
    rc = ib.modify_qp(p->qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
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

static int addr_zero(const unsigned char *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i]) return 0;
    return 1;
}

static loom_result_t verbs_connect_all(void *state, const unsigned char *addrs, size_t addr_len,
                                       uint64_t deadline_ms)
{
    struct verbs *t = state;
    const int me = t->ctx.rank, n = t->ctx.nranks;
    if (addr_len < sizeof(struct vaddr))
        return loomi_fail(LOOM_ERR_INTERNAL, me, "verbs: address stride %zu too small", addr_len);
    int expected = 0;
    for (int q = 0; q < n; q++) {
        const unsigned char *a = addrs + (size_t)q * addr_len;
        if (q == me || addr_zero(a, sizeof(struct vaddr))) continue;
        struct vaddr va;
        memcpy(&va, a, sizeof va);
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
        struct sockaddr_storage ss;
        socklen_t sl;
        if (loomi_wire_to_sockaddr(&va.w, &ss, &sl))
            return loomi_fail(LOOM_ERR_MISMATCH, me, "verbs: rank %d published an invalid address",
                              q);
        char msg[256];
        int fd = loomi_connect_retry((struct sockaddr *)&ss, sl, deadline_ms, msg, sizeof msg);
        if (fd < 0) return loomi_fail(LOOM_ERR_CONNECT, me, "verbs: rank %d: %s", q, msg);
        loom_result_t r = handshake(t, p, fd, NULL, deadline_ms);
        if (r != LOOM_SUCCESS) {
            if (p->fd != fd) close(fd);
            return r;
        }
    }
    int got = 0;
    while (got < expected) {
        struct pollfd pf = {t->lfd, POLLIN, 0};
        char why[200];
        int k = loomi_poll_guarded(&pf, deadline_ms, why, sizeof why);
        if (k == -2)
            return loomi_fail(LOOM_ERR_REMOTE, me, "verbs: %d of %d queue pair exchanges with "
                              "higher ranks done; gave up: %s", got, expected, why);
        if (k <= 0)
            return loomi_fail(LOOM_ERR_TIMEOUT, me,
                              "verbs: %d of %d queue pair exchanges with higher ranks done "
                              "before the deadline", got, expected);
        int fd = accept4(t->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        struct hello in;
        uint64_t d = loomi_now_ms() + 5000;
        if (loomi_read_full(fd, &in, sizeof in, d < deadline_ms ? d : deadline_ms) ||
            in.magic != HELLO_MAGIC || memcmp(in.job_key, t->ctx.job_key, 16) != 0 ||
            in.dst != me || in.src <= me || in.src >= n || !t->peers[in.src].active ||
            t->peers[in.src].fd >= 0) {
            LOOMI_WARN(me, "verbs: dropped a connection that is not from this job "
                           "(bad greeting, job key or rank)");
            close(fd);
            continue;
        }
        loom_result_t r = handshake(t, &t->peers[in.src], fd, &in, deadline_ms);
        if (r != LOOM_SUCCESS) {
            if (t->peers[in.src].fd != fd) close(fd);
            return r;
        }
        got++;
    }
    close(t->lfd);
    t->lfd = -1;
    LOOMI_INFO(me, "verbs: %d queue pair(s) up on %s port %d", t->npeers, t->dev.name,
               t->dev.port);
    return LOOM_SUCCESS;
}

static void send_ctl(struct peer *p, int type, int code, int failed, uint64_t deadline_ms)
{
    if (p->fd < 0) return;
    struct ctlmsg m = {.magic = CTL_MAGIC, .type = (uint16_t)type, .code = code, .failed = failed};
    if (deadline_ms) loomi_write_full(p->fd, &m, sizeof m, deadline_ms);
    else send(p->fd, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void verbs_abort_all(void *state, int failed, loom_result_t code)
{
    struct verbs *t = state;
    if (t->aborted) return;
    t->aborted = 1;
    for (int r = 0; r < t->ctx.nranks; r++) {
        struct peer *p = &t->peers[r];
        if (!p->active || p->failed) continue;
        send_ctl(p, C_ABORT, (int)code, failed, 0);
        peer_down(t, p, failed, code, "communicator aborted", 0);
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
        if (busy && poll_cq(t) <= 0) sched_yield();
    }
    for (int r = 0; t->peers && r < t->ctx.nranks && !t->aborted; r++) {
        struct peer *p = &t->peers[r];
        if (!p->active || p->failed || p->fd < 0) continue;
        int fl = fcntl(p->fd, F_GETFL);
        if (fl >= 0) fcntl(p->fd, F_SETFL, fl | O_NONBLOCK);
        send_ctl(p, C_BYE, 0, 0, deadline);
        shutdown(p->fd, SHUT_WR);
    }
    for (int r = 0; t->peers && r < t->ctx.nranks && !t->aborted; r++) {
        struct peer *p = &t->peers[r];
        while (p->active && !p->failed && p->fd >= 0) {
            int left = loomi_ms_left(deadline);
            struct pollfd pf = {p->fd, POLLIN, 0};
            if (!left || poll(&pf, 1, left) <= 0) break;
            char junk[64];
            ssize_t k = recv(p->fd, junk, sizeof junk, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) break;
        }
    }
    for (int r = 0; t->peers && r < t->ctx.nranks; r++) {
        struct peer *p = &t->peers[r];
        if (!p->active) continue;
        p->bye = 1;
        peer_down(t, p, -1, LOOM_ERR_REVOKED, "communicator destroyed", 0);
        struct op *o = p->zombies.head;
        while (o) {
            struct op *n = o->next;
            free(o);
            o = n;
        }
        if (p->qp) ib.destroy_qp(p->qp);
        if (p->rmr) ib.dereg_mr(p->rmr);
        free(p->region);
    }
    while (t->mrs) {
        t->mrs->user = 0;
        mr_unlink_free(t, t->mrs);
    }
    while (t->free_ops) {
        struct op *o = t->free_ops;
        t->free_ops = o->next;
        free(o);
    }
    if (t->cmr) ib.dereg_mr(t->cmr);
    if (t->cq) {
        if (t->armed) {
            /* An event may be pending on the channel: take it so the CQ
             * can go. */
            struct ibv_cq *cq;
            void *cctx;
            if (ib.get_cq_event(t->chan, &cq, &cctx) == 0) ib.ack_cq_events(cq, 1);
        }
        ib.destroy_cq(t->cq);
    }
    if (t->chan) ib.destroy_comp_channel(t->chan);
    if (t->pd) ib.dealloc_pd(t->pd);
    if (t->ibctx) ib.close_device(t->ibctx);
    if (t->lfd >= 0) close(t->lfd);
    if (t->epfd >= 0) close(t->epfd);
    free(t->cred);
    free(t->peers);
    free(t);
}

/* Explicit registration: kept until mem_deregister, which invalidates it
 * (the cache never hands it out again). */
static loom_result_t verbs_mem_register(void *state, void *addr, size_t len,
                                       enum loomi_mem_kind kind, struct loomi_mr *mr)
{
    struct verbs *t = state;
    if (kind != LOOMI_MEM_HOST)
        return loomi_fail(LOOM_ERR_UNSUPPORTED, t->ctx.rank, "verbs: only host memory");
    struct mrent *e = mr_get(t, addr, len);
    if (!e)
        return loomi_fail(LOOM_ERR_SYSTEM, t->ctx.rank, "verbs: cannot register %zu bytes", len);
    e->user++;
    memset(mr, 0, sizeof *mr);
    mr->addr = addr;
    mr->len = len;
    mr->kind = kind;
    mr->handle = e;
    uint64_t a = (uintptr_t)addr;
    uint32_t rkey = e->mr->rkey;
    memcpy(mr->desc, &a, 8);
    memcpy(mr->desc + 8, &rkey, 4);
    mr->desc_len = 12;
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
    mr_put(t, e);
}

const struct loomi_transport_ops loomi_verbs_ops = {
    .name = "verbs",
    .caps = LOOMI_TCAP_TWO_SIDED | LOOMI_TCAP_MEM_REG,
    .create = verbs_create,
    .local_addr = verbs_local_addr,
    .connect_all = verbs_connect_all,
    .mem_register = verbs_mem_register,
    .mem_deregister = verbs_mem_deregister,
    .isend = verbs_isend,
    .irecv = verbs_irecv,
    .progress = verbs_progress,
    .wait_fd = verbs_wait_fd,
    .cancel = verbs_cancel,
    .abort_all = verbs_abort_all,
    .destroy = verbs_destroy,
};

#endif /* HAVE_VERBS_H */
