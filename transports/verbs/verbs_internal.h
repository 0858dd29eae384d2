/*
 * verbs_internal.h - shared by the verbs transport's files only: its
 * limits, wire formats and state (struct verbs, struct peer), the
 * libibverbs functions it loads, the op queues, and what one of its
 * files calls in another.  verbs.c says how the transport works.
 *
 * Include config.h first: all of it is for builds with verbs.h.
 */
#ifndef LOOMI_VERBS_INTERNAL_H
#define LOOMI_VERBS_INTERNAL_H

#ifdef HAVE_VERBS_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <infiniband/verbs.h>

#include "core/internal.h"
#include "transports/bufpool.h"
#include "transports/match.h"
#include "transports/net.h"
#include "transports/verbs/verbs.h"

/* ------------------------------------------------------- libibverbs */

/* Every libibverbs function used, by symbol.  post_send, post_recv,
 * poll_cq and req_notify_cq are reached through the context's ops, as
 * the header's inline functions do. */
struct loomi_verbs_lib {
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
    /* Optional (NULL where libibverbs lacks it): device memory through a
     * dmabuf (GPUDirect RDMA). */
    struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *, uint64_t offset, size_t length,
                                    uint64_t iova, int fd, int access);
};
extern struct loomi_verbs_lib loomi_verbs_ib; /* verbs_dev.c */

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

/* Open the device to use (verbs_dev.c): LOOM_IB_HCA=name[:port]; else
 * `hint` (the NIC the topology gives this rank) when it has an active
 * port; else the first device with one.  Returns the context, or NULL
 * with why set. */
struct ibv_context *loomi_verbs_open_choice(struct dev_choice *d, const char *hint, int rank,
                                            char *why, size_t n);

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
#define CRED_STRIDE 8 /* words between peers' credit words (each on its own line) */

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
    int32_t src, dst;
    uint32_t qpn, psn;
    uint16_t lid;
    uint8_t link_layer, mtu;
    unsigned char gid[16];
    uint64_t cred_addr;
    uint32_t cred_rkey;
    uint32_t nrx;
};
_Static_assert(offsetof(struct hello, dst) == offsetof(struct loomi_greeting, dst),
               "a greeting begins as net.h's (struct loomi_greeting)");

/* verbs.c: 1 when r, the greeting rank `peer` sent, is one this rank
 * (me) connects with: the ranks, the buffer count, the queue pair's
 * number, PSN and MTU in range (tests/fuzz/fuzz_verbs.c). */
int loomi_verbs_hello_ok(const struct hello *r, int me, int peer);

struct ctlmsg {
    uint32_t magic;
    uint16_t type;
    uint16_t pad;
    int32_t code;
    int32_t failed;
};

/* A registration.  Those in the cache (t->mrs) give local access only
 * (sources of RDMA writes); a rendezvous receive's own (remote) is the
 * only one a peer may write, is never shared or cached, and is
 * deregistered when its receive ends. */
struct mrent {
    void *addr;
    size_t len;
    struct ibv_mr *mr;
    int refs;
    int doomed; /* no new users; deregistered when the last one goes */
    int user;   /* registered through mem_register */
    int remote; /* a receive's: REMOTE_WRITE, not in the cache */
    int dev;    /* CUDA device memory, registered through a dmabuf */
    unsigned long long bufid; /* dev: the allocation's CU_POINTER_ATTRIBUTE_BUFFER_ID */
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
    uint64_t cred_raddr; /* the peer's credit word for this rank */
    uint32_t cred_rkey;
    struct ibv_mr *cmr;  /* this rank's credit word for the peer, alone */
    char *region;        /* receive buffers, send slots, then credsrc */
    struct ibv_mr *rmr;  /* the region, local access only */
    uint64_t *credsrc;   /* the count the credit write sends (in region) */
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
    struct loomi_mq mq; /* eager receives posted, early eager messages (match.h) */
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
    /* Credit words, peer r's at [r * CRED_STRIDE], each registered on its
     * own (peer->cmr) so that a peer can write its own word only. */
    uint64_t *cred;
    int lfd, epfd;
    struct sockaddr_storage laddr;
    socklen_t laddr_len;
    struct peer *peers;
    int npeers; /* reached through verbs */
    struct loomi_match match; /* early messages' buffers, the operation noted */
    int nposted; /* over all peers */
    int aborted;
    int ngone_check; /* a peer left: check what it leaves pending */
    int destroying;  /* in destroy(): nobody to tell of failures */
    unsigned polls;
    struct mrent *mrs;
    /* GPUDirect RDMA (LOOM_GPUDIRECT): the mode (LOOMI_GPUDIRECT_*), and
     * once the driver or the NIC refused a device registration in auto
     * mode, why (no device registration is tried again). */
    int gd_mode;
    int gd_refused;
    char gd_why[256];
    struct loomi_verbs_gd_stats gd;
    int nmr;
    size_t mr_bytes;
    uint64_t mr_clock;
    struct loomi_objpool ops; /* kept for reuse (bufpool.h) */
};

#define XFER_DEAD ((size_t)-1)

static inline void complete_once(struct loomi_xfer *x, loom_result_t st)
{
    if (x->t_posted == XFER_DEAD) return;
    x->t_posted = XFER_DEAD;
    x->complete(x, st);
}

/* ---------------------------------------------------------- op queues */

static inline void q_push(struct opq *q, struct op *o)
{
    o->next = NULL;
    if (q->tail) q->tail->next = o;
    else q->head = o;
    q->tail = o;
}

static inline void q_remove(struct opq *q, struct op *o)
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

static inline struct op *q_find_tag(struct opq *q, uint64_t tag)
{
    for (struct op *c = q->head; c; c = c->next)
        if (c->tag == tag) return c;
    return NULL;
}

static inline struct op *op_new(struct verbs *t)
{
    struct op *o = loomi_objpool_get(&t->ops, sizeof(struct op));
    if (o) o->kind = K_WRITE;
    return o;
}

static inline void op_free(struct verbs *t, struct op *o)
{
    loomi_objpool_put(&t->ops, o);
}

/* ---------------------------------------------- registration cache */

/* verbs.c: a registration covering [addr, addr + len) for local access
 * (a send's source), from the cache or new, with a reference; one that a
 * peer may RDMA-write, for one receive only (never cached: its release
 * deregisters it); the release of either; dropping unused entries. */
struct mrent *loomi_verbs_mr_get(struct verbs *t, void *addr, size_t len);
/* The same for CUDA device memory (GPUDirect RDMA through dmabuf): from
 * the cache (an entry whose allocation was freed and made again is
 * dropped, not reused) or new; NULL with why where the mode, the driver
 * or the NIC refuses (verbs.c says which, and when that is final). */
struct mrent *loomi_verbs_mr_get_dev(struct verbs *t, void *addr, size_t len, char *why,
                                     size_t n);
struct mrent *loomi_verbs_mr_recv(struct verbs *t, void *addr, size_t len);
/* A rendezvous receive's registration of device memory (remote write,
 * never cached), or NULL with why. */
struct mrent *loomi_verbs_mr_recv_dev(struct verbs *t, void *addr, size_t len, char *why,
                                      size_t n);
void loomi_verbs_mr_put(struct verbs *t, struct mrent *e);
void loomi_verbs_mr_trim(struct verbs *t, int all, size_t extra);

/* --------------------------------------------------------- data path */

/* verbs_data.c: what set-up and teardown use of the data path. */
void loomi_verbs_peer_down(struct verbs *t, struct peer *p, int failed, loom_result_t code,
                           const char *why, int notify);
void loomi_verbs_send_ctl(struct peer *p, int type, int code, int failed, uint64_t deadline_ms);
int loomi_verbs_post_recv_slot(struct peer *p, struct slot *s);
int loomi_verbs_poll_cq(struct verbs *t);
loom_result_t loomi_verbs_isend(void *state, struct loomi_xfer *x);
loom_result_t loomi_verbs_irecv(void *state, struct loomi_xfer *x);
loom_result_t loomi_verbs_progress(void *state, int timeout_ms);
int loomi_verbs_wait_fd(void *state);
void loomi_verbs_cancel(void *state, struct loomi_xfer *x);
/* match.c fails a peer through this. */
void loomi_verbs_match_fail(void *owner, int peer, loom_result_t code, const char *why);

#endif /* HAVE_VERBS_H */

#endif
