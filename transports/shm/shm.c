/*
 * shm.c - the shared-memory transport, for ranks on one host.
 *
 * Each rank owns one segment, a file in /dev/shm named
 * "loom-<job key hex>-<rank>-<pid>-<n>":
 *
 *   page 0      header: magic, version, job key, rank, pid, layout; on its
 *               own cache line the state word peers watch (live, goodbye,
 *               aborted + who failed and why)
 *   page 1..    slot table: which peer rank feeds each inbound FIFO
 *   rings       one inbound FIFO per local peer: a control block (the
 *               consumer's tail; the producer's "I mapped it" flag, each
 *               on its own cache line) and `ncells` cells of `cell_bytes`
 *   arena       ctx->shm.bytes, page aligned: the shared arena
 *
 * A FIFO is single-producer (the peer) / single-consumer (the owner).  A
 * cell is a 32-byte header then its payload; the producer fills it and
 * publishes it with a release store of its sequence number (position + 1),
 * the consumer polls that number with an acquire load, copies out and
 * release-stores its tail.  So an 8-byte message is one cache line that
 * moves once; the producer reads the tail only when its cached copy says
 * the FIFO is full.  The owner chooses the FIFO geometry when it knows
 * how many local peers it has (connect_all) and writes it in its header.
 *
 * Messages between a pair travel in order: a first cell (tag, length,
 * payload) then continuation cells.  The receiver always drains its FIFOs
 * (a message whose receive is not posted yet is copied into a malloc'd
 * buffer, as tcp.c does), so a sender is never blocked by a receive that
 * is posted late.  Control cells (ack, no-CMA) may sit between the cells
 * of a message.
 *
 * Large messages (>= ctx->shm.cma_min) are single-copy: the sender posts a
 * descriptor (its address, length, tag, an id); once the receive is
 * posted, the receiver reads the sender's memory with process_vm_readv in
 * pieces and returns an ack, on which the sender's isend completes.  When
 * the kernel refuses (EPERM: ptrace restrictions; ENOSYS), the receiver
 * answers "no CMA" and the sender streams that message and every later
 * one to that peer through the cells.  A sender that hands a described
 * buffer back to the engine unacked (cancel, abort, failing the reader)
 * first sets `withdrawn` in its header; a reader checks it after every
 * piece and parks, rather than completes, what it read since (the
 * sender's abort or death then fails it with the right culprit).
 *
 * Liveness: every owner holds an open-file-description lock on its
 * segment; the kernel drops it when the process dies, whatever killed it,
 * and across pid namespaces.  A peer whose transfers have waited 100 ms is
 * checked (lock, kill(pid, 0), its state word) at most every 100 ms.
 *
 * Every value read from another process's memory (cell headers, tails,
 * descriptors, the header's layout) is range-checked before use; a bad
 * one fails that peer with LOOM_ERR_MISMATCH.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "transports/bufpool.h"
#include "transports/shm/shm.h"
#include "transports/transport.h"

int loomi_shm_fault_cma;

#define SHM_DIR "/dev/shm/"
#define SEG_MAGIC 0x314d48534d4f4f4cull /* "LOOMSHM1" */
#define SEG_VERSION 1u
#define ADDR_MAGIC 0x48534d4cu /* "LMSH" */
#define PAGE 4096u
#define CELL_HDR 32u
#define MAX_MSG (1ull << 40)
#define MAX_SEG (1ull << 36)
#define UNEXP_LIMIT (2ull << 30) /* bytes buffered for receives not yet posted */
#define CMA_PIECE ((size_t)4 << 20) /* per read per progress pass: stays responsive */
#define CHECK_MS 100
#ifndef SPIN_PASSES
#define SPIN_PASSES 64
#endif
#define NBUCKETS 64

enum { ST_LIVE = 0, ST_BYE = 1, ST_ABORT = 2 };
enum { C_FIRST = 1, C_CONT, C_RTS, C_RESEND, C_ACK, C_NACK, C_ABANDON };
/* Send modes, in the low bits of a send's t_posted (the id above them). */
enum { M_EAGER = 0, M_RTS = 1, M_RESEND = 2 };

/* ------------------------------------------------------- shared layout */

struct seg_hdr {
    _Atomic uint64_t magic; /* set last, once the layout below is final */
    uint32_t version;
    int32_t rank, nranks, pid;
    unsigned char job_key[16];
    uint64_t total;                 /* bytes of the segment */
    uint32_t nslots, ncells, cell_bytes, pad0;
    uint64_t slots_off, rings_off, ring_stride, arena_off, arena_bytes;
    /* A peer reads `nonce` at `self_addr` in this process with
     * process_vm_readv: finding it proves the pid names this process in
     * the peer's pid namespace, and that single copy works. */
    uint64_t nonce, self_addr;
    /* Own line: peers poll it while they wait on this rank. */
    _Alignas(64) _Atomic uint32_t state;
    int32_t abort_failed, abort_code;
    /* Set for good when this rank withdraws a single-copy send (cancel,
     * abort path only): readers must not trust what they read from it
     * since (see do_reads). */
    _Atomic uint32_t withdrawn;
};

struct ring_ctl {
    _Atomic uint64_t tail; /* consumer: cells consumed */
    char pad0[56];
    _Atomic uint32_t hello; /* producer: mapped this segment */
    char pad1[60];
};

struct cell {
    _Atomic uint32_t seq; /* position + 1 once full */
    uint16_t type, flags;
    uint32_t len;
    uint32_t chk;   /* FIRST/RTS: the call's check (transport.h) */
    uint64_t tag;   /* FIRST/RTS: tag; RESEND/ACK/NACK: id */
    uint64_t total; /* FIRST/RTS/RESEND: message length */
};

_Static_assert(sizeof(struct seg_hdr) <= PAGE, "header fits its page");
_Static_assert(sizeof(struct ring_ctl) == 128, "two cache lines");
_Static_assert(sizeof(struct cell) == CELL_HDR, "cell header size");

/* What local_addr publishes (at most LOOMI_ADDR_BYTES). */
struct shm_addr {
    uint32_t magic;
    int32_t pid;
    char name[56];
};

/* ---------------------------------------------------------- local state */

struct xq {
    struct loomi_xfer *head, *tail;
};

struct unexp {
    struct unexp *next;
    uint64_t tag;
    uint32_t chk; /* the call's check it came with */
    size_t total, got;
    char *buf;       /* eager: bytes so far */
    size_t cap;      /* buf's size (a pool buffer may be larger) */
    int rts;         /* a CMA descriptor, nothing buffered */
    uint64_t raddr, id;
};

struct uq {
    struct unexp *head, *tail;
};

/* A CMA read in progress, or a receive waiting for its resend. */
struct rd {
    struct rd *next;
    struct loomi_xfer *x; /* NULL: cancelled, discard what comes */
    uint64_t raddr, id;
};

struct ctl {
    uint16_t type;
    uint64_t id;
};

struct peer {
    struct shm *t;
    int rank;
    int want;      /* reached through this transport */
    int connected; /* mapped both ways */
    int failed, gone;
    int fd;
    pid_t pid;
    int pid_visible; /* kill(pid, 0) worked at connect: ESRCH later means dead */
    char name[56];
    void *map;
    size_t map_len;
    struct seg_hdr *hdr;
    void *arena;
    size_t arena_len;
    /* Outbound FIFO: in the peer's segment. */
    char *out_cells;
    struct ring_ctl *out_ctl;
    uint32_t out_ncells, out_cell_bytes;
    uint64_t out_head, out_tail;
    /* Inbound FIFO: in this rank's segment. */
    char *in_cells;
    struct ring_ctl *in_ctl;
    uint64_t in_pos;
    /* Sending. */
    struct xq sq;   /* not fully written; the head may be part written */
    struct xq acks; /* descriptors posted, waiting for the ack */
    uint64_t next_id;
    int no_cma; /* the receiver cannot read us: stream everything */
    struct ctl *ctl;
    size_t nctl, capctl;
    /* Receiving. */
    struct xq recvs[NBUCKETS];
    struct uq unexp[NBUCKETS];
    int nunexp; /* messages held in unexp[]: a receive posted scans them only then */
    int rx_on; /* a multi-cell message is arriving */
    struct loomi_xfer *rx_x;
    struct unexp *rx_u; /* neither: discard */
    size_t rx_off, rx_total;
    int no_cma_read;
    struct rd *reads, *resends;
    /* Liveness. */
    int npending;
    uint64_t wait_ms, check_ms;
};

struct shm {
    struct loomi_tctx ctx;
    unsigned char key[16];
    int aborted;
    int fd; /* own segment, holding the liveness lock */
    char name[56];
    int linked;
    void *map;
    size_t map_len;
    struct seg_hdr *hdr;
    uint32_t ncells, cell_bytes;
    void *arena;
    size_t arena_len;
    struct peer *peers;
    int *local; /* ranks of the peers reached here, for the polling loops */
    int nlocal;
    unsigned idle_passes; /* passes with transfers waiting and nothing moving */
    /* Completions, failures, aborts: progress() returns once it moves. */
    uint64_t events;
    uint64_t moved; /* cells and reads moved by progress (shm_moved) */
    size_t unexp_bytes;
    struct loomi_bufpool pool; /* buffers of early messages (bufpool.h) */
    int crowded;               /* loomi_shm_crowded */
    uint64_t noted_op;         /* the operation of the last collective transfer posted, + 1 */
};

/* ------------------------------------------------------------- helpers */

static uint64_t *events_of(struct peer *p) { return &p->t->events; }

static unsigned bucket(uint64_t tag) { return (unsigned)((tag ^ (tag >> 32) ^ (tag >> 17)) % NBUCKETS); }

static void xq_push(struct xq *q, struct loomi_xfer *x)
{
    x->t_next = NULL;
    x->t_prev = q->tail;
    if (q->tail) q->tail->t_next = x;
    else q->head = x;
    q->tail = x;
}

static void xq_del(struct xq *q, struct loomi_xfer *x)
{
    if (x->t_prev) x->t_prev->t_next = x->t_next;
    else q->head = x->t_next;
    if (x->t_next) x->t_next->t_prev = x->t_prev;
    else q->tail = x->t_prev;
    x->t_next = x->t_prev = NULL;
}

static int xq_has(const struct xq *q, const struct loomi_xfer *x)
{
    for (const struct loomi_xfer *y = q->head; y; y = y->t_next)
        if (y == x) return 1;
    return 0;
}

/* The oldest posted receive with this tag, taken off its list. */
static struct loomi_xfer *take_recv(struct peer *p, uint64_t tag)
{
    struct xq *q = &p->recvs[bucket(tag)];
    for (struct loomi_xfer *x = q->head; x; x = x->t_next)
        if (x->tag == tag) {
            xq_del(q, x);
            return x;
        }
    return NULL;
}

/* A posted receive, or a held early message, of the operation that tag
 * belongs to but of another schedule or call (transport.h), or NULL. */
static const struct loomi_xfer *recv_conflict(const struct peer *p, uint64_t tag, uint32_t chk)
{
    for (int b = 0; b < NBUCKETS; b++)
        for (const struct loomi_xfer *x = p->recvs[b].head; x; x = x->t_next)
            if (loomi_call_conflict(x->tag, x->chk, tag, chk)) return x;
    return NULL;
}

static const struct unexp *unexp_conflict(const struct peer *p, uint64_t tag, uint32_t chk)
{
    for (int b = 0; b < NBUCKETS; b++)
        for (const struct unexp *u = p->unexp[b].head; u; u = u->next)
            if (loomi_call_conflict(u->tag, u->chk, tag, chk)) return u;
    return NULL;
}

static struct unexp *take_unexp(struct peer *p, uint64_t tag)
{
    struct uq *q = &p->unexp[bucket(tag)];
    struct unexp *prev = NULL;
    for (struct unexp *u = q->head; u; prev = u, u = u->next)
        if (u->tag == tag) {
            if (prev) prev->next = u->next;
            else q->head = u->next;
            if (q->tail == u) q->tail = prev;
            u->next = NULL;
            p->nunexp--;
            return u;
        }
    return NULL;
}

static void unexp_free(struct shm *t, struct unexp *u)
{
    if (u->buf) t->unexp_bytes -= u->total;
    loomi_bufpool_put(&t->pool, u->buf, u->cap);
    free(u);
}

static void unexp_remove(struct shm *t, struct peer *p, struct unexp *u)
{
    struct uq *q = &p->unexp[bucket(u->tag)];
    struct unexp *prev = NULL;
    for (struct unexp *v = q->head; v; prev = v, v = v->next)
        if (v == u) {
            if (prev) prev->next = u->next;
            else q->head = u->next;
            if (q->tail == u) q->tail = prev;
            p->nunexp--;
            break;
        }
    unexp_free(t, u);
}

/* A transfer leaves the transport: count it, then tell the engine. */
static void done(struct peer *p, struct loomi_xfer *x, loom_result_t st)
{
    p->npending--;
    (*events_of(p))++;
    x->complete(x, st);
}

static void seg_path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, SHM_DIR "%s", name);
}

static void pause_short(void)
{
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------ failures */

static void ctl_push(struct shm *t, struct peer *p, uint16_t type, uint64_t id);

/* Fail everything p holds.  `notify`: tell the core through peer_failed. */
static void peer_down(struct shm *t, struct peer *p, int failed, loom_result_t code,
                      const char *why, int notify)
{
    if (p->failed) return;
    p->failed = 1;
    /* Sends p may still be reading go back to the engine with an error:
     * from now on nothing read from this process is to be trusted. */
    if (p->acks.head && t->hdr) atomic_store(&t->hdr->withdrawn, 1);
    /* Detach every list before completing: a completion may look around. */
    struct loomi_xfer *lists[2 + NBUCKETS];
    int nl = 0;
    lists[nl++] = p->sq.head;
    lists[nl++] = p->acks.head;
    for (int b = 0; b < NBUCKETS; b++) lists[nl++] = p->recvs[b].head;
    memset(&p->sq, 0, sizeof p->sq);
    memset(&p->acks, 0, sizeof p->acks);
    memset(p->recvs, 0, sizeof p->recvs);
    struct loomi_xfer *rx = p->rx_x;
    p->rx_x = NULL;
    p->rx_u = NULL;
    p->rx_on = 0;
    struct rd *rds[2] = {p->reads, p->resends};
    p->reads = p->resends = NULL;
    for (int b = 0; b < NBUCKETS; b++) {
        struct unexp *u = p->unexp[b].head, *n;
        for (; u; u = n) {
            n = u->next;
            unexp_free(t, u);
        }
        p->unexp[b].head = p->unexp[b].tail = NULL;
    }
    p->nunexp = 0;
    free(p->ctl);
    p->ctl = NULL;
    p->nctl = p->capctl = 0;
    for (int i = 0; i < nl; i++) {
        struct loomi_xfer *x = lists[i], *n;
        for (; x; x = n) {
            n = x->t_next;
            x->t_next = x->t_prev = NULL;
            done(p, x, code);
        }
    }
    if (rx) done(p, rx, code);
    for (int i = 0; i < 2; i++) {
        struct rd *r = rds[i], *n;
        for (; r; r = n) {
            n = r->next;
            if (r->x) done(p, r->x, code);
            free(r);
        }
    }
    p->npending = 0;
    t->events++;
    if (notify && t->ctx.peer_failed) t->ctx.peer_failed(t->ctx.owner, p->rank, failed, code, why);
}

static void peer_error(struct shm *t, struct peer *p, loom_result_t code, const char *fmt, ...)
    LOOMI_PRINTF(4, 5);
static void peer_error(struct shm *t, struct peer *p, loom_result_t code, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (p->failed) return;
    LOOMI_WARN(t->ctx.rank, "shm: peer rank %d: %s", p->rank, why);
    peer_down(t, p, p->rank, code, why, 1);
}

#define PROTO(t, p, ...) peer_error(t, p, LOOM_ERR_MISMATCH, "protocol error: " __VA_ARGS__)

/* Fail p for a message of another schedule or call (transport.h). */
static void conflict(struct shm *t, struct peer *p, uint64_t theirs, uint32_t theirs_chk,
                     uint64_t mine, uint32_t mine_chk)
{
    char why[256];
    loomi_call_conflict_why(theirs, theirs_chk, mine, mine_chk, t->ctx.name_sig, why, sizeof why);
    peer_error(t, p, LOOM_ERR_MISMATCH, "rank %d %s", p->rank, why);
}

/* A collective transfer x is posted: the first of its operation scans
 * the messages held from every peer for one of that operation from
 * another schedule or call, which came before this rank made the call
 * (found: that peer fails).  Cheap when none is held. */
static void note_op(struct shm *t, const struct loomi_xfer *x)
{
    if (x->tag & LOOMI_TAG_P2P || t->noted_op == loomi_tag_op(x->tag) + 1) return;
    t->noted_op = loomi_tag_op(x->tag) + 1;
    for (int i = 0; i < t->nlocal; i++) {
        struct peer *q = &t->peers[t->local[i]];
        if (!q->nunexp || q->failed) continue;
        const struct unexp *u = unexp_conflict(q, x->tag, x->chk);
        if (u) conflict(t, q, u->tag, u->chk, x->tag, x->chk);
    }
}

/* ------------------------------------------------------------- sending */

static inline struct cell *out_cell(const struct peer *p, uint64_t pos)
{
    return (struct cell *)(p->out_cells + (size_t)(pos & (p->out_ncells - 1)) * p->out_cell_bytes);
}

/* Room for one more cell?  -1: the peer's tail is garbage (peer failed). */
static int out_space(struct shm *t, struct peer *p)
{
    if (p->out_head - p->out_tail < p->out_ncells) return 1;
    uint64_t tl = atomic_load_explicit(&p->out_ctl->tail, memory_order_acquire);
    if (tl > p->out_head || p->out_head - tl > p->out_ncells) {
        PROTO(t, p, "FIFO tail %llu out of range (head %llu)", (unsigned long long)tl,
              (unsigned long long)p->out_head);
        return -1;
    }
    p->out_tail = tl;
    return p->out_head - tl < p->out_ncells;
}

/* Fill the next cell and publish it. */
static void out_put(struct peer *p, uint16_t type, uint64_t tag, uint32_t chk, uint64_t total,
                    const void *a, size_t alen, const void *b, size_t blen)
{
    struct cell *c = out_cell(p, p->out_head);
    c->type = type;
    c->flags = 0;
    c->len = (uint32_t)(alen + blen);
    c->chk = chk;
    c->tag = tag;
    c->total = total;
    if (alen) memcpy((char *)c + CELL_HDR, a, alen);
    if (blen) memcpy((char *)c + CELL_HDR + alen, b, blen);
    p->out_head++;
    atomic_store_explicit(&c->seq, (uint32_t)p->out_head, memory_order_release);
}

static void ctl_push(struct shm *t, struct peer *p, uint16_t type, uint64_t id)
{
    if (p->failed) return;
    if (p->nctl == p->capctl) {
        size_t cap = p->capctl ? 2 * p->capctl : 16;
        struct ctl *n = realloc(p->ctl, cap * sizeof *n);
        if (!n) {
            peer_error(t, p, LOOM_ERR_NO_MEMORY, "out of memory queueing a control message");
            return;
        }
        p->ctl = n;
        p->capctl = cap;
    }
    p->ctl[p->nctl].type = type;
    p->ctl[p->nctl++].id = id;
}

/* Write what fits: control cells first, then the send queue in order.
 * Returns cells written. */
static int pump_out(struct shm *t, struct peer *p)
{
    int n = 0, sp;
    size_t done_ctl = 0;
    while (done_ctl < p->nctl && (sp = out_space(t, p)) > 0) {
        out_put(p, p->ctl[done_ctl].type, p->ctl[done_ctl].id, 0, 0, NULL, 0, NULL, 0);
        done_ctl++;
        n++;
    }
    if (p->failed) return n;
    if (done_ctl) {
        memmove(p->ctl, p->ctl + done_ctl, (p->nctl - done_ctl) * sizeof *p->ctl);
        p->nctl -= done_ctl;
    }
    if (p->nctl) return n; /* control goes first */
    const size_t cap = p->out_cell_bytes - CELL_HDR;
    struct loomi_xfer *x;
    while ((x = p->sq.head) != NULL && (sp = out_space(t, p)) > 0) {
        unsigned mode = (unsigned)(x->t_posted & 3);
        uint64_t id = (uint64_t)x->t_posted >> 2;
        n++;
        if (mode == M_RTS) {
            uint64_t d[2] = {(uint64_t)(uintptr_t)x->buf, id};
            out_put(p, C_RTS, x->tag, x->chk, x->len, d, sizeof d, NULL, 0);
            xq_del(&p->sq, x);
            xq_push(&p->acks, x);
            continue;
        }
        size_t len = LOOMI_MIN(cap, x->len - x->t_done);
        const char *src = (const char *)x->buf + x->t_done;
        if (x->t_done == 0)
            out_put(p, mode == M_RESEND ? C_RESEND : C_FIRST, mode == M_RESEND ? id : x->tag,
                    x->chk, x->len, src, len, NULL, 0);
        else
            out_put(p, C_CONT, 0, 0, 0, src, len, NULL, 0);
        x->t_done += len;
        if (x->t_done == x->len) {
            xq_del(&p->sq, x);
            done(p, x, LOOM_SUCCESS);
        }
    }
    return n;
}

static struct peer *xfer_peer(struct shm *t, struct loomi_xfer *x, loom_result_t *r)
{
    if (x->peer < 0 || x->peer >= t->ctx.nranks || x->peer == t->ctx.rank) {
        *r = loomi_fail(LOOM_ERR_INTERNAL, t->ctx.rank, "shm: transfer with bad peer %d", x->peer);
        return NULL;
    }
    struct peer *p = &t->peers[x->peer];
    if (!p->connected || p->failed || p->gone || t->aborted) {
        *r = loomi_fail(LOOM_ERR_REMOTE, t->ctx.rank, "shm: rank %d is unreachable (%s)", x->peer,
                        !p->connected ? "not connected through shared memory"
                        : p->failed   ? "failed"
                        : p->gone     ? "it closed the communicator"
                                      : "communicator aborted");
        return NULL;
    }
    x->t_done = 0;
    x->t_posted = 0;
    x->t_next = x->t_prev = NULL;
    return p;
}

/* Messages up to this size go through the cells (LOOM_SHM_CMA, or a
 * whole FIFO when the ranks share cores). */
static size_t cells_max(const struct shm *t, const struct peer *p)
{
    size_t m = t->ctx.shm.cma_min ? t->ctx.shm.cma_min - 1 : SIZE_MAX;
    size_t fifo = (size_t)p->out_ncells * p->out_cell_bytes;
    return t->crowded && m < fifo ? fifo : m;
}

void loomi_shm_crowded(void *state) { ((struct shm *)state)->crowded = 1; }

size_t loomi_shm_cells_max(void *state, int peer)
{
    struct shm *t = state;
    if (peer < 0 || peer >= t->ctx.nranks || !t->peers[peer].out_cells) return 0;
    return cells_max(t, &t->peers[peer]);
}

static loom_result_t shm_isend(void *state, struct loomi_xfer *x)
{
    struct shm *t = state;
    loom_result_t r;
    struct peer *p = xfer_peer(t, x, &r);
    if (!p) return r;
    if (x->len > MAX_MSG)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, t->ctx.rank, "shm: message of %zu bytes",
                          x->len);
    if (x->len > cells_max(t, p) && !p->no_cma) /* SIZE_MAX when shm_cma_min is 0 */
        x->t_posted = (size_t)(p->next_id++ << 2) | M_RTS;
    note_op(t, x);
    if (p->failed) return loomi_fail(LOOM_ERR_REMOTE, t->ctx.rank, "shm: rank %d failed", x->peer);
    p->npending++;
    int idle = p->sq.head == NULL;
    xq_push(&p->sq, x);
    /* Nothing ahead of it: write now, so a small message is out (and
     * complete) before isend returns. */
    if (idle) pump_out(t, p);
    return LOOM_SUCCESS;
}

/* ----------------------------------------------------------- receiving */

/* Start moving a descriptor's bytes into x (or say we cannot). */
static void start_read(struct shm *t, struct peer *p, struct loomi_xfer *x, uint64_t raddr,
                       uint64_t id)
{
    struct rd *r = calloc(1, sizeof *r);
    if (!r) {
        done(p, x, LOOM_ERR_NO_MEMORY);
        peer_error(t, p, LOOM_ERR_NO_MEMORY, "out of memory for a single-copy read");
        return;
    }
    r->x = x;
    r->raddr = raddr;
    r->id = id;
    x->t_done = 0;
    if (p->no_cma_read) {
        /* Listed first: should the push fail, failing p completes x. */
        r->next = p->resends;
        p->resends = r;
        ctl_push(t, p, C_NACK, id);
    } else {
        r->next = p->reads;
        p->reads = r;
    }
}

/* Copy payload into whatever the arriving message lands in. */
static void rx_data(struct shm *t, struct peer *p, const char *src, size_t len)
{
    if (len && p->rx_x) memcpy((char *)p->rx_x->buf + p->rx_off, src, len);
    else if (len && p->rx_u) memcpy(p->rx_u->buf + p->rx_off, src, len);
    p->rx_off += len;
    if (p->rx_u) p->rx_u->got = p->rx_off;
    if (p->rx_off < p->rx_total) return;
    p->rx_on = 0;
    struct loomi_xfer *x = p->rx_x;
    p->rx_x = NULL;
    p->rx_u = NULL;
    (void)t;
    if (x) done(p, x, LOOM_SUCCESS);
}

static void mismatch(struct shm *t, struct peer *p, uint64_t total, size_t want)
{
    peer_error(t, p, LOOM_ERR_MISMATCH,
               "rank %d sent a message of %llu bytes where this rank expects %zu: "
               LOOMI_MISMATCH_HINT,
               p->rank, (unsigned long long)total, want);
}

/* A message nobody waits for yet: keep it (descriptor, or a buffer),
 * unless a receive of its operation, or this rank's call of it, shows
 * that its sender made the call otherwise. */
static struct unexp *unexp_new(struct shm *t, struct peer *p, uint64_t tag, uint32_t chk,
                               uint64_t total, int rts)
{
    const struct loomi_xfer *mine = recv_conflict(p, tag, chk);
    if (mine) {
        conflict(t, p, tag, chk, mine->tag, mine->chk);
        return NULL;
    }
    uint32_t my = !(tag & LOOMI_TAG_P2P) && t->ctx.call_check
                      ? t->ctx.call_check(t->ctx.owner, tag) : 0;
    if (my && my != chk) {
        conflict(t, p, tag, chk, tag, my);
        return NULL;
    }
    if (!rts && t->unexp_bytes + total > UNEXP_LIMIT) {
        peer_error(t, p, LOOM_ERR_REMOTE, "more than %llu bytes arrived for receives not posted",
                   (unsigned long long)UNEXP_LIMIT);
        return NULL;
    }
    struct unexp *u = calloc(1, sizeof *u);
    if (u && !rts && !(u->buf = loomi_bufpool_get(&t->pool, total, &u->cap))) {
        free(u);
        u = NULL;
    }
    if (!u) {
        peer_error(t, p, LOOM_ERR_NO_MEMORY, "out of memory for an early message");
        return NULL;
    }
    u->tag = tag;
    u->chk = chk;
    u->total = total;
    u->rts = rts;
    if (!rts) t->unexp_bytes += total;
    struct uq *q = &p->unexp[bucket(tag)];
    if (q->tail) q->tail->next = u;
    else q->head = u;
    q->tail = u;
    p->nunexp++;
    LOOMI_TRACE(t->ctx.rank, "shm: early message from rank %d, tag %llx, %llu bytes%s", p->rank,
                (unsigned long long)tag, (unsigned long long)total, rts ? " (descriptor)" : "");
    return u;
}

/* id came back from the peer: is it one we could have issued? */
static int id_known(const struct peer *p, uint64_t id) { return id < p->next_id; }

static struct loomi_xfer *take_ack(struct peer *p, uint64_t id)
{
    for (struct loomi_xfer *x = p->acks.head; x; x = x->t_next)
        if ((uint64_t)x->t_posted >> 2 == id) {
            xq_del(&p->acks, x);
            return x;
        }
    return NULL;
}

/* One cell (header copied to h, payload at pl).  Returns -1 when the
 * peer was failed. */
static int handle_cell(struct shm *t, struct peer *p, const struct cell *h, const char *pl)
{
    const size_t cap = t->cell_bytes - CELL_HDR;
    const size_t len = h->len;
    if (len > cap) {
        PROTO(t, p, "cell payload of %zu bytes (cells hold %zu)", len, cap);
        return -1;
    }
    switch (h->type) {
    case C_FIRST:
    case C_RESEND: {
        if (p->rx_on) {
            PROTO(t, p, "a new message began inside another");
            return -1;
        }
        if (h->total > MAX_MSG || len > h->total) {
            PROTO(t, p, "message of %llu bytes, first cell %zu", (unsigned long long)h->total, len);
            return -1;
        }
        struct loomi_xfer *x = NULL;
        struct unexp *u = NULL;
        if (h->type == C_RESEND) {
            struct rd **l = &p->resends, *r = NULL;
            for (; *l; l = &(*l)->next)
                if ((*l)->id == h->tag) break;
            if (!(r = *l)) {
                PROTO(t, p, "resend of unknown message %llu", (unsigned long long)h->tag);
                return -1;
            }
            *l = r->next;
            x = r->x;
            free(r);
            if (x && x->len != h->total) {
                done(p, x, LOOM_ERR_MISMATCH);
                PROTO(t, p, "resend of %llu bytes for a message of %zu",
                      (unsigned long long)h->total, x->len);
                return -1;
            }
        } else if ((x = take_recv(p, h->tag)) != NULL) {
            if (x->chk != h->chk) {
                done(p, x, LOOM_ERR_MISMATCH);
                conflict(t, p, h->tag, h->chk, x->tag, x->chk);
                return -1;
            }
            if (x->len != h->total) {
                done(p, x, LOOM_ERR_MISMATCH);
                mismatch(t, p, h->total, x->len);
                return -1;
            }
        } else if (!(u = unexp_new(t, p, h->tag, h->chk, h->total, 0))) {
            return -1;
        }
        p->rx_on = 1;
        p->rx_x = x;
        p->rx_u = u;
        p->rx_off = 0;
        p->rx_total = h->total;
        rx_data(t, p, pl, len);
        return 0;
    }
    case C_CONT:
        if (!p->rx_on || len == 0 || len > p->rx_total - p->rx_off) {
            PROTO(t, p, "continuation cell of %zu bytes outside a message", len);
            return -1;
        }
        rx_data(t, p, pl, len);
        return 0;
    case C_RTS: {
        uint64_t d[2];
        if (p->rx_on || len != sizeof d || h->total > MAX_MSG) {
            PROTO(t, p, "bad single-copy descriptor (len %zu, total %llu)", len,
                  (unsigned long long)h->total);
            return -1;
        }
        memcpy(d, pl, sizeof d);
        struct loomi_xfer *x = take_recv(p, h->tag);
        if (x && x->chk != h->chk) {
            done(p, x, LOOM_ERR_MISMATCH);
            conflict(t, p, h->tag, h->chk, x->tag, x->chk);
            return -1;
        }
        if (x) {
            if (x->len != h->total) {
                done(p, x, LOOM_ERR_MISMATCH);
                mismatch(t, p, h->total, x->len);
                return -1;
            }
            start_read(t, p, x, d[0], d[1]);
        } else {
            struct unexp *u = unexp_new(t, p, h->tag, h->chk, h->total, 1);
            if (!u) return -1;
            u->raddr = d[0];
            u->id = d[1];
        }
        return 0;
    }
    case C_ACK:
    case C_NACK: {
        struct loomi_xfer *x = take_ack(p, h->tag);
        if (!x) {
            if (id_known(p, h->tag)) return 0; /* its send was cancelled */
            PROTO(t, p, "ack for unknown message %llu", (unsigned long long)h->tag);
            return -1;
        }
        if (h->type == C_ACK) {
            done(p, x, LOOM_SUCCESS);
        } else {
            if (!p->no_cma)
                LOOMI_INFO(t->ctx.rank,
                           "shm: rank %d cannot read this process's memory (process_vm_readv "
                           "refused): messages to it go through the FIFO cells",
                           p->rank);
            p->no_cma = 1;
            x->t_done = 0;
            x->t_posted = (size_t)(h->tag << 2) | M_RESEND;
            xq_push(&p->sq, x);
        }
        return 0;
    }
    case C_ABANDON:
        if (!p->rx_on) {
            PROTO(t, p, "abandon outside a message");
            return -1;
        }
        p->rx_on = 0;
        if (p->rx_u) unexp_remove(t, p, p->rx_u);
        p->rx_u = NULL;
        if (p->rx_x) {
            struct loomi_xfer *x = p->rx_x;
            p->rx_x = NULL;
            done(p, x, LOOM_ERR_REMOTE);
        }
        return 0;
    default:
        PROTO(t, p, "unknown cell type %u", h->type);
        return -1;
    }
}

static inline struct cell *in_cell(const struct shm *t, const struct peer *p, uint64_t pos)
{
    return (struct cell *)(p->in_cells + (size_t)(pos & (t->ncells - 1)) * t->cell_bytes);
}

/* Consume up to `budget` cells from p.  Returns cells consumed. */
static int poll_in(struct shm *t, struct peer *p, int budget)
{
    int n = 0;
    while (n < budget && !p->failed) {
        struct cell *c = in_cell(t, p, p->in_pos);
        if (atomic_load_explicit(&c->seq, memory_order_acquire) != (uint32_t)(p->in_pos + 1)) break;
        struct cell h;
        h.type = c->type;
        h.len = c->len;
        h.tag = c->tag;
        h.chk = c->chk;
        h.total = c->total;
        int rc = handle_cell(t, p, &h, (const char *)c + CELL_HDR);
        if (rc < 0) break;
        p->in_pos++;
        atomic_store_explicit(&p->in_ctl->tail, p->in_pos, memory_order_release);
        n++;
    }
    return n;
}

static loom_result_t shm_irecv(void *state, struct loomi_xfer *x)
{
    struct shm *t = state;
    loom_result_t r;
    struct peer *p = xfer_peer(t, x, &r);
    if (!p) return r;
    note_op(t, x);
    if (p->failed) return loomi_fail(LOOM_ERR_REMOTE, t->ctx.rank, "shm: rank %d failed", x->peer);
    p->npending++;
    struct unexp *u = take_unexp(p, x->tag);
    if (!u) {
        xq_push(&p->recvs[bucket(x->tag)], x);
        const struct unexp *theirs = p->nunexp ? unexp_conflict(p, x->tag, x->chk) : NULL;
        if (theirs) /* x fails with the peer's other transfers */
            conflict(t, p, theirs->tag, theirs->chk, x->tag, x->chk);
        return LOOM_SUCCESS;
    }
    if (u->chk != x->chk) {
        uint64_t tag = u->tag;
        uint32_t chk = u->chk;
        if (p->rx_u == u) p->rx_u = NULL;
        unexp_free(t, u);
        done(p, x, LOOM_ERR_MISMATCH);
        conflict(t, p, tag, chk, x->tag, x->chk);
        return LOOM_SUCCESS; /* completed with the error */
    }
    if (u->total != x->len) {
        size_t total = u->total;
        if (p->rx_u == u) p->rx_u = NULL; /* the rest goes nowhere */
        unexp_free(t, u);
        done(p, x, LOOM_ERR_MISMATCH);
        mismatch(t, p, total, x->len);
        return LOOM_SUCCESS; /* completed with the error */
    }
    if (u->rts) {
        start_read(t, p, x, u->raddr, u->id);
        unexp_free(t, u);
        return LOOM_SUCCESS;
    }
    if (u->got) memcpy(x->buf, u->buf, u->got);
    if (p->rx_u == u) {
        /* Still arriving: the rest lands in place. */
        p->rx_u = NULL;
        p->rx_x = x;
        unexp_free(t, u);
        return LOOM_SUCCESS;
    }
    unexp_free(t, u);
    done(p, x, LOOM_SUCCESS);
    return LOOM_SUCCESS;
}

/* The sender withdrew a single-copy send: what we read may be its
 * restored or reused buffer.  Park the receive (no completion): the
 * sender is aborting, and its abort (or death) fails it with the right
 * reason. */
static void park(struct peer *p, struct rd **l, struct rd *r)
{
    *l = r->next;
    r->next = p->resends; /* waits there for a resend that never comes */
    p->resends = r;
}

/* One piece of each single-copy read from p.  Returns pieces moved. */
static int do_reads(struct shm *t, struct peer *p)
{
    int n = 0;
    struct rd **l = &p->reads;
    /* p->failed first: a failed peer's list (and *l) is gone. */
    while (!p->failed && *l) {
        struct rd *r = *l;
        struct loomi_xfer *x = r->x;
        if (atomic_load(&p->hdr->withdrawn)) {
            park(p, l, r);
            continue;
        }
        size_t want = LOOMI_MIN(CMA_PIECE, x->len - x->t_done);
        ssize_t got = 0;
        int err = 0;
        if (want) {
            struct iovec lv = {(char *)x->buf + x->t_done, want};
            struct iovec rv = {(void *)(uintptr_t)(r->raddr + x->t_done), want};
            if (loomi_shm_fault_cma) got = -1, err = EPERM;
            else if ((got = process_vm_readv(p->pid, &lv, 1, &rv, 1, 0)) < 0) err = errno;
            else if (got == 0) err = EFAULT;
        }
        if (got > 0) {
            x->t_done += (size_t)got;
            n++;
        }
        /* Checked after the read: a flag still clear now means the buffer
         * was the sender's message all along. */
        if (atomic_load(&p->hdr->withdrawn)) {
            park(p, l, r);
            continue;
        }
        if (!err && x->t_done == x->len) {
            uint64_t id = r->id;
            *l = r->next;
            free(r);
            done(p, x, LOOM_SUCCESS);
            ctl_push(t, p, C_ACK, id);
            n++;
            continue;
        }
        if (!err) {
            l = &r->next;
            continue;
        }
        if (err == EPERM || err == ENOSYS || err == EACCES) {
            /* The kernel will not let us: the sender streams it instead,
             * this and every later message. */
            LOOMI_INFO(t->ctx.rank,
                       "shm: cannot read rank %d's memory (process_vm_readv: %s; ptrace "
                       "restrictions or a container?): asking it to copy through the FIFO",
                       p->rank, strerror(err));
            p->no_cma_read = 1;
            *l = r->next;
            r->next = p->resends;
            p->resends = r;
            x->t_done = 0;
            ctl_push(t, p, C_NACK, r->id);
            n++;
            continue;
        }
        if (err == ESRCH) {
            peer_error(t, p, LOOM_ERR_REMOTE, "process %d exited (single-copy read failed)",
                       (int)p->pid);
        } else {
            PROTO(t, p, "single-copy read of %zu bytes at 0x%llx failed: %s", want,
                  (unsigned long long)(r->raddr + x->t_done), strerror(err));
        }
        return n;
    }
    return n;
}

/* --------------------------------------------------------- liveness */

static int lock_free(int fd)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return -1;
    return fl.l_type == F_UNLCK;
}

/* The peer's state word says goodbye or abort: act on it.  Returns 1 if
 * it did. */
static int peer_state(struct shm *t, struct peer *p)
{
    uint32_t st = atomic_load_explicit(&p->hdr->state, memory_order_acquire);
    if (st == ST_LIVE) return 0;
    /* What it sent before is in our FIFO: take it first. */
    poll_in(t, p, 1 << 30);
    if (p->failed) return 1;
    if (st == ST_ABORT) {
        int failed = p->hdr->abort_failed;
        loom_result_t code = (loom_result_t)p->hdr->abort_code;
        if (failed < -1 || failed >= t->ctx.nranks) failed = -1;
        if (code != LOOM_ERR_REVOKED && code != LOOM_ERR_TIMEOUT && code != LOOM_ERR_MISMATCH)
            code = LOOM_ERR_REMOTE;
        LOOMI_INFO(t->ctx.rank, "shm: rank %d aborted the communicator (rank %d failed)", p->rank,
                   failed);
        peer_down(t, p, failed, code, "the peer aborted the communicator", 1);
        return 1;
    }
    if (st == ST_BYE) {
        p->gone = 1;
        if (p->npending)
            peer_error(t, p, LOOM_ERR_REMOTE,
                       "the peer destroyed the communicator with operations pending here");
        return 1;
    }
    PROTO(t, p, "bad state word %u", st);
    return 1;
}

static void check_peer(struct shm *t, struct peer *p)
{
    if (peer_state(t, p)) return;
    int dead = lock_free(p->fd) == 1;
    if (!dead && p->pid_visible && kill(p->pid, 0) != 0 && errno == ESRCH) dead = 1;
    if (!dead) return;
    /* A polite close also drops the lock: read the state word again (it is
     * written before the lock goes). */
    if (peer_state(t, p)) return;
    poll_in(t, p, 1 << 30);
    peer_error(t, p, LOOM_ERR_REMOTE, "process %d exited (or was killed)", (int)p->pid);
}

/* ------------------------------------------------------------ progress */

static int pass(struct shm *t)
{
    int total = 0, waiting = 0;
    for (int i = 0; i < t->nlocal; i++) {
        struct peer *p = &t->peers[t->local[i]];
        if (!p->connected || p->failed) continue;
        int n = poll_in(t, p, (int)t->ncells);
        if (p->reads && !p->failed) n += do_reads(t, p);
        if ((p->sq.head || p->nctl) && !p->failed) n += pump_out(t, p);
        if (n) {
            p->wait_ms = 0;
            total += n;
        } else if (p->npending) {
            waiting = 1;
        }
    }
    t->moved += (uint64_t)total;
    if (!waiting) return total;
    /* The liveness clock only needs milliseconds: read it every 64 idle
     * passes, not on each (a clock read costs as much as a pass). */
    if (++t->idle_passes % 64) return total;
    uint64_t now = loomi_now_ms();
    for (int i = 0; i < t->nlocal; i++) {
        struct peer *p = &t->peers[t->local[i]];
        if (!p->connected || p->failed || !p->npending) continue;
        if (!p->wait_ms) {
            p->wait_ms = now;
        } else if (now - p->wait_ms >= CHECK_MS && now - p->check_ms >= CHECK_MS) {
            p->check_ms = now;
            check_peer(t, p);
        }
    }
    return total;
}

static loom_result_t shm_progress(void *state, int timeout_ms)
{
    struct shm *t = state;
    if (t->aborted) return LOOM_SUCCESS;
    const uint64_t e0 = t->events;
    if (pass(t) || t->events != e0 || timeout_ms <= 0) return LOOM_SUCCESS;
    /* Spin a little first: a reply a peer is about to write costs a
     * system call less to catch.  Then yield between passes: other ranks
     * may need this core to make the progress we wait for. */
    for (int i = 0; i < SPIN_PASSES; i++)
        if (pass(t) || t->events != e0 || t->aborted) return LOOM_SUCCESS;
    uint64_t end = loomi_now_ns() + (uint64_t)timeout_ms * 1000000u;
    do {
        sched_yield();
        if (pass(t) || t->events != e0 || t->aborted) break;
    } while (loomi_now_ns() < end);
    return LOOM_SUCCESS;
}

static int shm_wait_fd(void *state)
{
    (void)state;
    return -1;
}

static uint64_t shm_moved(void *state) { return ((struct shm *)state)->moved; }

static void shm_cancel(void *state, struct loomi_xfer *x)
{
    struct shm *t = state;
    if (x->peer < 0 || x->peer >= t->ctx.nranks || x->peer == t->ctx.rank) return;
    struct peer *p = &t->peers[x->peer];
    if (p->failed) return;
    if (xq_has(&p->sq, x)) {
        /* Part written: tell the receiver to drop what it has (the rest of
         * the buffer may be gone once we return). */
        int part = x->t_done > 0 && x->t_done < x->len;
        xq_del(&p->sq, x);
        p->npending--;
        if (part) ctl_push(t, p, C_ABANDON, 0);
        return;
    }
    if (xq_has(&p->acks, x)) {
        /* The receiver may be reading the buffer right now, and it is the
         * engine's again once we return: say so first. */
        if (t->hdr) atomic_store(&t->hdr->withdrawn, 1);
        xq_del(&p->acks, x);
        p->npending--;
        return;
    }
    struct xq *b = &p->recvs[bucket(x->tag)];
    if (xq_has(b, x)) {
        xq_del(b, x);
        p->npending--;
        return;
    }
    if (p->rx_x == x) {
        p->rx_x = NULL; /* the rest of the message goes nowhere */
        p->npending--;
        return;
    }
    for (struct rd **l = &p->reads; *l; l = &(*l)->next)
        if ((*l)->x == x) {
            struct rd *r = *l;
            uint64_t id = r->id;
            *l = r->next;
            free(r);
            p->npending--;
            /* The sender only waits for us to be done with its buffer. */
            ctl_push(t, p, C_ACK, id);
            return;
        }
    for (struct rd *r = p->resends; r; r = r->next)
        if (r->x == x) {
            r->x = NULL; /* its data still comes: discard it */
            p->npending--;
            return;
        }
}

/* -------------------------------------------------------------- set-up */

static void key_hex(const unsigned char *key, char out[17])
{
    for (int i = 0; i < 8; i++) snprintf(out + 2 * i, 3, "%02x", key[i]);
}

/* Remove segments of processes that died without cleaning up: the name's
 * pid is gone and nobody holds the segment's lock. */
static void scan_stale(int rank)
{
    DIR *d = opendir(SHM_DIR);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char key[17];
        int r, pid, used = 0;
        unsigned n;
        if (strncmp(e->d_name, LOOMI_SHM_PREFIX, strlen(LOOMI_SHM_PREFIX)) != 0) continue;
        if (sscanf(e->d_name, "loom-%16[0-9a-f]-%d-%d-%u%n", key, &r, &pid, &n, &used) != 4 ||
            e->d_name[used] != '\0' || pid <= 0)
            continue;
        if (pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH) continue;
        char path[sizeof SHM_DIR + sizeof e->d_name];
        seg_path(path, sizeof path, e->d_name);
        int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) continue;
        struct stat sb;
        if (fstat(fd, &sb) == 0 && sb.st_uid == geteuid() && lock_free(fd) == 1) {
            if (unlink(path) == 0)
                LOOMI_INFO(rank, "shm: removed %s, left behind by process %d that no longer exists",
                           path, pid);
        }
        close(fd);
    }
    closedir(d);
}

static void shm_destroy(void *state);

static loom_result_t shm_create(const struct loomi_tctx *ctx, void **state)
{
    static _Atomic unsigned counter;
    if (!ctx->job_key || ctx->nranks < 1 || ctx->rank < 0 || ctx->rank >= ctx->nranks)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, ctx->rank, "shm: bad rank or job key");
    struct shm *t = calloc(1, sizeof *t);
    if (!t) return loomi_fail(LOOM_ERR_NO_MEMORY, ctx->rank, "shm: out of memory");
    t->ctx = *ctx;
    memcpy(t->key, ctx->job_key, 16);
    t->ctx.job_key = t->key;
    t->fd = -1;
    t->peers = calloc((size_t)ctx->nranks, sizeof *t->peers);
    if (!t->peers) {
        free(t);
        return loomi_fail(LOOM_ERR_NO_MEMORY, ctx->rank, "shm: out of memory");
    }
    for (int r = 0; r < ctx->nranks; r++) {
        t->peers[r].t = t;
        t->peers[r].rank = r;
        t->peers[r].fd = -1;
    }
    /* On failure, everything made so far goes (callers do not call
     * destroy for a transport whose create failed). */
    loom_result_t r = LOOM_SUCCESS;
    scan_stale(ctx->rank);
    char kh[17], path[128];
    key_hex(ctx->job_key, kh);
    snprintf(t->name, sizeof t->name, LOOMI_SHM_PREFIX "%s-%d-%d-%u", kh, ctx->rank, (int)getpid(),
             atomic_fetch_add(&counter, 1));
    seg_path(path, sizeof path, t->name);
    t->fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (t->fd < 0) {
        r = loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "shm: cannot create %s: %s", path,
                       strerror(errno));
        goto fail;
    }
    t->linked = 1;
    /* The liveness lock: held as long as this process lives (an
     * open-file-description lock, not dropped by other opens of the file). */
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    if (fcntl(t->fd, F_OFD_SETLK, &fl) != 0) {
        r = loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "shm: cannot lock %s: %s", path,
                       strerror(errno));
        goto fail;
    }
    if (ftruncate(t->fd, PAGE) != 0) {
        r = loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "shm: cannot size %s: %s", path,
                       strerror(errno));
        goto fail;
    }
    t->map = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, t->fd, 0);
    if (t->map == MAP_FAILED) {
        t->map = NULL;
        r = loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "shm: cannot map %s: %s", path,
                       strerror(errno));
        goto fail;
    }
    t->map_len = PAGE;
    t->hdr = t->map;
    t->hdr->version = SEG_VERSION;
    t->hdr->rank = ctx->rank;
    t->hdr->nranks = ctx->nranks;
    t->hdr->pid = (int32_t)getpid();
    memcpy(t->hdr->job_key, ctx->job_key, 16);
    *state = t;
    return LOOM_SUCCESS;
fail:
    shm_destroy(t);
    *state = NULL;
    return r;
}

static loom_result_t shm_local_addr(void *state, void *buf, size_t *len)
{
    struct shm *t = state;
    struct shm_addr a;
    if (*len < sizeof a)
        return loomi_fail(LOOM_ERR_INTERNAL, t->ctx.rank, "shm: address buffer too small");
    memset(&a, 0, sizeof a);
    a.magic = ADDR_MAGIC;
    a.pid = (int32_t)getpid();
    snprintf(a.name, sizeof a.name, "%s", t->name);
    memcpy(buf, &a, sizeof a);
    *len = sizeof a;
    return LOOM_SUCCESS;
}

static int all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Size the FIFOs for k local peers: deep and wide with few peers, about
 * 4 MiB of cells per segment with many, never below 4 cells of 8 KiB. */
static void geometry(int k, uint32_t *ncells, uint32_t *cell_bytes)
{
    size_t per = k ? ((size_t)4 << 20) / (size_t)k : ((size_t)256 << 10);
    if (per >= (256u << 10)) *ncells = 16, *cell_bytes = 16384;
    else if (per >= (128u << 10)) *ncells = 8, *cell_bytes = 16384;
    else if (per >= (64u << 10)) *ncells = 8, *cell_bytes = 8192;
    else *ncells = 4, *cell_bytes = 8192;
}

/* Lay out this rank's segment for its k local peers and publish it. */
static loom_result_t build_segment(struct shm *t, int k)
{
    const int me = t->ctx.rank;
    geometry(k, &t->ncells, &t->cell_bytes);
    size_t slots_off = PAGE;
    size_t rings_off = slots_off + align_up((size_t)k * 4 + 4, PAGE);
    size_t stride = align_up(sizeof(struct ring_ctl) + (size_t)t->ncells * t->cell_bytes, PAGE);
    size_t arena_off = rings_off + (size_t)k * stride;
    size_t arena_bytes = align_up(t->ctx.shm.bytes, PAGE);
    size_t total = arena_off + arena_bytes;
    if (total > MAX_SEG)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me, "shm: segment of %zu bytes is too large",
                          total);
    if (ftruncate(t->fd, (off_t)total) != 0)
        return loomi_fail(LOOM_ERR_SYSTEM, me, "shm: cannot size %s to %zu bytes: %s", t->name,
                          total, strerror(errno));
    /* Reserve the pages now: a full /dev/shm is an error here, not a
     * SIGBUS in the middle of a collective. */
    int e = posix_fallocate(t->fd, 0, (off_t)total);
    if (e != 0 && e != EOPNOTSUPP && e != EINVAL)
        return loomi_fail(LOOM_ERR_SYSTEM, me,
                          "shm: cannot reserve %zu bytes in " SHM_DIR " for %s: %s (is " SHM_DIR
                          " full? see df " SHM_DIR ")",
                          total, t->name, strerror(e));
    /* Populated now: otherwise the first messages through each FIFO and
     * the first rounds in the arena each take a page fault per page, a
     * few hundred microseconds per operation on a virtual machine. */
    void *m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, t->fd, 0);
    if (m == MAP_FAILED)
        return loomi_fail(LOOM_ERR_SYSTEM, me, "shm: cannot map %zu bytes of %s: %s", total,
                          t->name, strerror(errno));
    munmap(t->map, t->map_len);
    t->map = m;
    t->map_len = total;
    t->hdr = m;
    struct seg_hdr *h = t->hdr;
    h->total = total;
    h->nslots = (uint32_t)k;
    h->ncells = t->ncells;
    h->cell_bytes = t->cell_bytes;
    h->slots_off = slots_off;
    h->rings_off = rings_off;
    h->ring_stride = stride;
    h->arena_off = arena_off;
    h->arena_bytes = arena_bytes;
    h->nonce = loomi_now_ns() * 0x9e3779b97f4a7c15ull ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)t;
    h->self_addr = (uint64_t)(uintptr_t)&h->nonce;
    int32_t *slots = (int32_t *)((char *)m + slots_off);
    int s = 0;
    for (int q = 0; q < t->ctx.nranks; q++) {
        struct peer *p = &t->peers[q];
        if (!p->want) continue;
        slots[s] = q;
        char *ring = (char *)m + rings_off + (size_t)s * stride;
        p->in_ctl = (struct ring_ctl *)ring;
        p->in_cells = ring + sizeof(struct ring_ctl);
        s++;
    }
    if (arena_bytes) {
        t->arena = (char *)m + arena_off;
        t->arena_len = arena_bytes;
    }
    atomic_store_explicit(&h->magic, SEG_MAGIC, memory_order_release);
    return LOOM_SUCCESS;
}

/* Map q's segment and say hello.  0: done; 1: not there yet; else an error. */
static int open_peer(struct shm *t, struct peer *p, loom_result_t *err)
{
    const int me = t->ctx.rank, q = p->rank;
    char path[128];
    seg_path(path, sizeof path, p->name);
    if (p->fd < 0) {
        p->fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (p->fd < 0) {
            if (errno == ENOENT) return 1;
            *err = loomi_fail(LOOM_ERR_CONNECT, me, "shm: rank %d: cannot open %s: %s", q, path,
                              strerror(errno));
            return -1;
        }
    }
    struct stat sb;
    if (fstat(p->fd, &sb) != 0 || (size_t)sb.st_size < PAGE) return 1;
    if (!p->map) {
        p->map = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, 0);
        if (p->map == MAP_FAILED) {
            p->map = NULL;
            *err = loomi_fail(LOOM_ERR_CONNECT, me, "shm: rank %d: cannot map %s: %s", q, path,
                              strerror(errno));
            return -1;
        }
        p->map_len = PAGE;
    }
    struct seg_hdr *sh = p->map;
    uint64_t magic = atomic_load_explicit(&sh->magic, memory_order_acquire);
    if (magic == 0) return 1; /* still laying it out */
    /* From here on only a private copy of the header is used. */
    struct seg_hdr h;
    memcpy(&h, sh, sizeof h);
    if (magic != SEG_MAGIC || h.version != SEG_VERSION) {
        *err = loomi_fail(LOOM_ERR_MISMATCH, me,
                          "shm: rank %d: %s is not a Loom segment of this version (magic %llx, "
                          "version %u)",
                          q, path, (unsigned long long)magic, h.version);
        return -1;
    }
    if (memcmp(h.job_key, t->key, 16) != 0 || h.rank != q || h.nranks != t->ctx.nranks ||
        h.pid != p->pid) {
        *err = loomi_fail(LOOM_ERR_MISMATCH, me,
                          "shm: rank %d: segment %s belongs to another job or rank (rank %d of "
                          "%d, pid %d)",
                          q, path, h.rank, h.nranks, h.pid);
        return -1;
    }
    if (fstat(p->fd, &sb) != 0) sb.st_size = 0;
    int bad = h.total > MAX_SEG || h.total > (uint64_t)sb.st_size || h.nslots > (uint32_t)h.nranks ||
              h.ncells < 2 || h.ncells > 1024 || (h.ncells & (h.ncells - 1)) ||
              h.cell_bytes < 256 || h.cell_bytes > (1u << 20) || h.cell_bytes % 64 ||
              h.slots_off < PAGE || h.slots_off % 64 ||
              h.slots_off + 4ull * h.nslots > h.total || h.rings_off % 64 ||
              h.ring_stride < sizeof(struct ring_ctl) + (uint64_t)h.ncells * h.cell_bytes ||
              h.ring_stride % 64 || h.rings_off < h.slots_off + 4ull * h.nslots ||
              h.rings_off + h.ring_stride * h.nslots > h.total ||
              h.arena_off % PAGE || h.arena_bytes > h.total || h.arena_off > h.total - h.arena_bytes;
    if (bad) {
        *err = loomi_fail(LOOM_ERR_MISMATCH, me, "shm: rank %d: segment %s has a bad layout", q,
                          path);
        return -1;
    }
    /* Populated, as our own segment is (build_segment). */
    void *m = mmap(NULL, h.total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, p->fd, 0);
    if (m == MAP_FAILED) {
        *err = loomi_fail(LOOM_ERR_CONNECT, me, "shm: rank %d: cannot map %llu bytes of %s: %s", q,
                          (unsigned long long)h.total, path, strerror(errno));
        return -1;
    }
    munmap(p->map, p->map_len);
    p->map = m;
    p->map_len = h.total;
    p->hdr = m;
    const int32_t *slots = (const int32_t *)((char *)m + h.slots_off);
    int mine = -1;
    for (uint32_t s = 0; s < h.nslots; s++) {
        int32_t v = slots[s];
        if (v == me && mine < 0) mine = (int)s;
        else if (v == me) mine = -2;
    }
    if (mine < 0) {
        *err = loomi_fail(LOOM_ERR_MISMATCH, me,
                          "shm: rank %d has %s FIFO for this rank (does it see this rank on its "
                          "host?)",
                          q, mine == -2 ? "more than one" : "no");
        return -1;
    }
    char *ring = (char *)m + h.rings_off + (size_t)mine * h.ring_stride;
    p->out_ctl = (struct ring_ctl *)ring;
    p->out_cells = ring + sizeof(struct ring_ctl);
    p->out_ncells = h.ncells;
    p->out_cell_bytes = h.cell_bytes;
    p->out_head = p->out_tail = 0;
    if (h.arena_bytes) {
        p->arena = (char *)m + h.arena_off;
        p->arena_len = h.arena_bytes;
    }
    /* Can we read its memory, and is its pid the same process here? */
    uint64_t seen = 0;
    struct iovec lv = {&seen, sizeof seen}, rv = {(void *)(uintptr_t)h.self_addr, sizeof seen};
    ssize_t k = process_vm_readv(p->pid, &lv, 1, &rv, 1, 0);
    if (k == (ssize_t)sizeof seen && seen == h.nonce) {
        p->pid_visible = 1;
    } else {
        p->no_cma_read = 1;
        LOOMI_INFO(me, "shm: rank %d's memory cannot be read from here (%s): its messages will "
                   "come through the FIFO cells",
                   q, k < 0 ? strerror(errno) : "pid names another process");
    }
    atomic_store_explicit(&p->out_ctl->hello, 1, memory_order_release);
    return 0;
}

static void list_ranks(char *buf, size_t n, const struct shm *t, int (*pick)(const struct peer *))
{
    size_t used = 0;
    buf[0] = '\0';
    for (int q = 0; q < t->ctx.nranks && used + 16 < n; q++)
        if (pick(&t->peers[q]))
            used += (size_t)snprintf(buf + used, n - used, "%s%d", used ? ", " : "", q);
}

static int not_mapped(const struct peer *p) { return p->want && !p->out_ctl; }
static int no_hello(const struct peer *p)
{
    return p->want && atomic_load_explicit(&p->in_ctl->hello, memory_order_acquire) == 0;
}

static loom_result_t shm_connect_all(void *state, const unsigned char *addrs, size_t addr_len,
                                     uint64_t deadline_ms)
{
    struct shm *t = state;
    const int me = t->ctx.rank, n = t->ctx.nranks;
    if (addr_len < sizeof(struct shm_addr))
        return loomi_fail(LOOM_ERR_INTERNAL, me, "shm: address stride %zu too small", addr_len);
    if (t->hdr && atomic_load_explicit(&t->hdr->magic, memory_order_relaxed))
        return loomi_fail(LOOM_ERR_INVALID_USAGE, me, "shm: connect_all called twice");
    int k = 0;
    for (int q = 0; q < n; q++) {
        const unsigned char *a = addrs + (size_t)q * addr_len;
        if (q == me || all_zero(a, addr_len)) continue;
        struct shm_addr sa;
        memcpy(&sa, a, sizeof sa);
        if (sa.magic != ADDR_MAGIC || sa.pid <= 0 || !memchr(sa.name, '\0', sizeof sa.name) ||
            strncmp(sa.name, LOOMI_SHM_PREFIX, strlen(LOOMI_SHM_PREFIX)) != 0 ||
            strchr(sa.name, '/'))
            return loomi_fail(LOOM_ERR_MISMATCH, me,
                              "shm: rank %d published an invalid shared-memory address", q);
        struct peer *p = &t->peers[q];
        p->want = 1;
        p->pid = sa.pid;
        memcpy(p->name, sa.name, sizeof p->name);
        k++;
    }
    t->local = calloc((size_t)k + 1, sizeof *t->local);
    if (!t->local) return loomi_fail(LOOM_ERR_NO_MEMORY, me, "shm: out of memory");
    for (int q = 0; q < n; q++)
        if (t->peers[q].want) t->local[t->nlocal++] = q;
    loom_result_t r = build_segment(t, k);
    if (r != LOOM_SUCCESS) return r;
    /* Map every peer's segment, then wait until every peer has mapped
     * ours; neither step waits on the other, so no order deadlocks. */
    for (;;) {
        int missing = 0;
        for (int q = 0; q < n; q++) {
            struct peer *p = &t->peers[q];
            if (!p->want || p->out_ctl) continue;
            int rc = open_peer(t, p, &r);
            if (rc < 0) return r;
            missing += rc;
        }
        if (!missing) break;
        char why[200];
        if (loomi_guard_stop(why, sizeof why))
            return loomi_fail(LOOM_ERR_REMOTE, me, "shm: waiting for the peers' segments; gave "
                              "up: %s", why);
        if (loomi_ms_left(deadline_ms) == 0) {
            char who[256];
            list_ranks(who, sizeof who, t, not_mapped);
            return loomi_fail(LOOM_ERR_TIMEOUT, me,
                              "shm: the shared-memory segments of rank(s) %s were not ready "
                              "before the deadline",
                              who);
        }
        pause_short();
    }
    for (;;) {
        int missing = 0;
        for (int q = 0; q < n; q++) {
            struct peer *p = &t->peers[q];
            if (!no_hello(p)) continue;
            missing++;
            /* Its segment's lock goes with the process: a rank that died
             * here will never map ours, and waiting for the deadline (the
             * membership may already have moved on without it) helps
             * nobody. */
            if (lock_free(p->fd) == 1)
                return loomi_fail(LOOM_ERR_REMOTE, me,
                                  "shm: rank %d (pid %d) exited before it mapped this rank's "
                                  "shared-memory segment",
                                  q, (int)p->pid);
        }
        if (!missing) break;
        char why[200];
        if (loomi_guard_stop(why, sizeof why))
            return loomi_fail(LOOM_ERR_REMOTE, me, "shm: waiting for the peers to map this "
                              "rank's segment; gave up: %s", why);
        if (loomi_ms_left(deadline_ms) == 0) {
            char who[256];
            list_ranks(who, sizeof who, t, no_hello);
            return loomi_fail(LOOM_ERR_TIMEOUT, me,
                              "shm: rank(s) %s did not map this rank's shared-memory segment "
                              "before the deadline",
                              who);
        }
        pause_short();
    }
    /* Every peer has it mapped: the name can go, so a crash from now on
     * leaves nothing in /dev/shm.  (Between create and here a crash leaves
     * the file; the next create on this host removes it, see scan_stale.) */
    char path[128];
    seg_path(path, sizeof path, t->name);
    if (t->linked && unlink(path) == 0) t->linked = 0;
    for (int q = 0; q < n; q++)
        if (t->peers[q].want) t->peers[q].connected = 1;
    LOOMI_INFO(me, "shm: connected to %d local peer(s); FIFOs of %u cells of %u bytes, arena %zu "
               "bytes, single copy from %zu bytes",
               k, t->ncells, t->cell_bytes, t->arena_len, t->ctx.shm.cma_min);
    return LOOM_SUCCESS;
}

/* Drop every peer's mapping and descriptor. */
static void detach_peers(struct shm *t)
{
    for (int q = 0; q < t->ctx.nranks; q++) {
        struct peer *p = &t->peers[q];
        if (p->map) munmap(p->map, p->map_len);
        p->map = NULL;
        p->hdr = NULL;
        p->arena = NULL;
        p->out_ctl = NULL;
        p->connected = 0;
        if (p->fd >= 0) close(p->fd);
        p->fd = -1;
    }
}

static void unlink_own(struct shm *t)
{
    if (!t->linked) return;
    char path[128];
    seg_path(path, sizeof path, t->name);
    unlink(path);
    t->linked = 0;
}

static void shm_abort_all(void *state, int failed, loom_result_t code)
{
    struct shm *t = state;
    if (t->aborted) return;
    t->aborted = 1;
    t->events++;
    if (t->hdr) {
        t->hdr->abort_failed = failed;
        t->hdr->abort_code = (int32_t)code;
        atomic_store_explicit(&t->hdr->state, ST_ABORT, memory_order_release);
    }
    for (int q = 0; q < t->ctx.nranks; q++) {
        struct peer *p = &t->peers[q];
        if (p->connected && !p->failed) peer_down(t, p, failed, code, "communicator aborted", 0);
    }
    /* The peers' mappings stay until shm_destroy: operations that were
     * running may still hold pointers into their arenas (the engine's
     * shared steps, the slots), and they unwind after this returns.
     * Only destroy, which comes when no operation is left, unmaps. */
    unlink_own(t);
}

static void shm_destroy(void *state)
{
    struct shm *t = state;
    if (!t) return;
    /* Goodbye before the lock goes (closing t->fd), so that a peer never
     * takes a polite close for a crash. */
    if (t->hdr && !t->aborted) atomic_store_explicit(&t->hdr->state, ST_BYE, memory_order_release);
    for (int q = 0; q < t->ctx.nranks; q++)
        peer_down(t, &t->peers[q], -1, LOOM_ERR_REVOKED, "communicator destroyed", 0);
    detach_peers(t);
    unlink_own(t);
    if (t->map) munmap(t->map, t->map_len);
    if (t->fd >= 0) close(t->fd);
    loomi_bufpool_clear(&t->pool);
    free(t->peers);
    free(t->local);
    free(t);
}

static void *shm_shared_map(void *state, int rank, size_t *len)
{
    struct shm *t = state;
    if (len) *len = 0;
    if (rank < 0 || rank >= t->ctx.nranks) return NULL;
    void *a = NULL;
    size_t l = 0;
    if (rank == t->ctx.rank) {
        a = t->arena;
        l = t->arena_len;
    } else if (t->peers[rank].connected) {
        a = t->peers[rank].arena;
        l = t->peers[rank].arena_len;
    }
    if (!a) return NULL;
    if (len) *len = l;
    return a;
}

const struct loomi_transport_ops loomi_shm_ops = {
    .name = "shm",
    .caps = LOOMI_TCAP_TWO_SIDED,
    .create = shm_create,
    .local_addr = shm_local_addr,
    .connect_all = shm_connect_all,
    .mem_register = NULL,
    .mem_deregister = NULL,
    .isend = shm_isend,
    .irecv = shm_irecv,
    .progress = shm_progress,
    .wait_fd = shm_wait_fd,
    .moved = shm_moved,
    .cancel = shm_cancel,
    .abort_all = shm_abort_all,
    .destroy = shm_destroy,
    .shared_map = shm_shared_map,
};
