/*
 * shm_internal.h - shared by the shared-memory transport's files only:
 * the segment's layout, the local state (struct shm, struct peer), the
 * transfer lists, and what one of its files calls in another.  shm.c
 * says how the transport works.
 */
#ifndef LOOMI_SHM_INTERNAL_H
#define LOOMI_SHM_INTERNAL_H

#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/internal.h"
#include "transports/auth.h"
#include "transports/match.h"
#include "transports/shm/shm.h"
#include "transports/transport.h"

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

enum { ST_LIVE = 0, ST_BYE = 1, ST_ABORT = 2 };
enum { C_FIRST = 1, C_CONT, C_RTS, C_RESEND, C_ACK, C_NACK, C_ABANDON };
/* Send modes, in the low bits of a send's t_posted (the id above them). */
enum { M_EAGER = 0, M_RTS = 1, M_RESEND = 2 };

/* ------------------------------------------------------- shared layout */

struct seg_hdr {
    _Atomic uint64_t magic; /* set last, once the layout below is final */
    uint32_t version;
    int32_t rank, nranks, pid;
    /* loomi_auth_tag of the job's key: tells this job's segments from
     * another's without the key in them. */
    unsigned char job_tag[16];
    uint64_t total;                 /* bytes of the segment */
    uint32_t nslots, ncells, cell_bytes, pad0;
    uint64_t slots_off, rings_off, ring_stride, arena_off, arena_bytes;
    /* A peer reads `nonce` at `self_addr` in this process with
     * process_vm_readv: finding it proves the pid names this process in
     * the peer's pid namespace, and that single copy works. */
    uint64_t nonce, self_addr;
    /* Own line: peers poll it while they wait on this rank.  Stored with
     * release after abort_failed and abort_code, loaded with acquire
     * before them (shm_abort_all, peer_state). */
    _Alignas(64) _Atomic uint32_t state;
    int32_t abort_failed, abort_code;
    /* Set for good when this rank withdraws a single-copy send (cancel,
     * abort path only): readers must not trust what they read from it
     * since (see do_reads). */
    _Atomic uint32_t withdrawn;
};

struct ring_ctl {
    /* consumer: cells consumed; release-stored after the cells are read,
     * acquire-loaded before the producer overwrites them (shm_fifo.c) */
    _Atomic uint64_t tail;
    char pad0[56];
    _Atomic uint32_t hello; /* producer: mapped this segment (release/acquire) */
    char pad1[60];
};

struct cell {
    /* position + 1 once full: release-stored after the header and payload
     * below, acquire-loaded before the consumer reads them */
    _Atomic uint32_t seq;
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

/* An early message (match.h): eager, its bytes so far in m.buf; or a
 * single-copy descriptor, nothing buffered. */
struct unexp {
    struct loomi_unexp m;
    int rts;
    uint64_t raddr, id;
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
    struct loomi_mq mq; /* receives posted, early messages (match.h) */
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
    unsigned char key[LOOMI_AUTH_KEY_BYTES], tag[16];
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
    struct loomi_match match; /* early messages' buffers, the operation noted */
    int crowded;              /* loomi_shm_crowded */
};

/* ------------------------------------------------------------- helpers */

static inline uint64_t *events_of(struct peer *p) { return &p->t->events; }

static inline void xq_push(struct xq *q, struct loomi_xfer *x)
{
    x->t_next = NULL;
    x->t_prev = q->tail;
    if (q->tail) q->tail->t_next = x;
    else q->head = x;
    q->tail = x;
}

static inline void xq_del(struct xq *q, struct loomi_xfer *x)
{
    if (x->t_prev) x->t_prev->t_next = x->t_next;
    else q->head = x->t_next;
    if (x->t_next) x->t_next->t_prev = x->t_prev;
    else q->tail = x->t_prev;
    x->t_next = x->t_prev = NULL;
}

static inline int xq_has(const struct xq *q, const struct loomi_xfer *x)
{
    for (const struct loomi_xfer *y = q->head; y; y = y->t_next)
        if (y == x) return 1;
    return 0;
}


/* atomic_thread_fence, but for ThreadSanitizer builds on x86: gcc refuses
 * fences under -fsanitize=thread (TSan does not model them), and x86's
 * own ordering gives what the two fences of the withdrawal are for
 * (stores are not reordered with older stores, nor loads with older
 * loads). */
#if defined(__SANITIZE_THREAD__) && (defined(__x86_64__) || defined(__i386__))
#define SHM_FENCE(mo) ((void)(mo))
#else
#define SHM_FENCE(mo) atomic_thread_fence(mo)
#endif

/* Withdraw this rank's single-copy sends (cancel, abort, failing the
 * reader): set `withdrawn` before the engine gets a described buffer back
 * and may write it again.  The fence keeps the flag's store ahead of
 * those later stores: on arm64 even a sequentially consistent store (an
 * stlr) may become visible after plain stores that follow it, and then a
 * reader could read the new bytes yet still see the flag clear (on x86 a
 * seq_cst store is a locked exchange, and stores are not reordered
 * anyway).  The reader's side is in do_reads (shm_cma.c). */
static inline void withdraw(struct seg_hdr *h)
{
    atomic_store_explicit(&h->withdrawn, 1, memory_order_relaxed);
    SHM_FENCE(memory_order_seq_cst);
}

/* A transfer leaves the transport: count it, then tell the engine. */
static inline void done(struct peer *p, struct loomi_xfer *x, loom_result_t st)
{
    p->npending--;
    (*events_of(p))++;
    x->complete(x, st);
}

/* 1 when nobody holds the lock on segment fd (its owner is gone), 0
 * when its owner does, -1 when the kernel will not say. */
static inline int lock_free(int fd)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return -1;
    return fl.l_type == F_UNLCK;
}

/* ------------------------------------------------- across the files */

/* shm_fifo.c: failing a peer; a protocol error fails it with
 * LOOM_ERR_MISMATCH. */
void loomi_shm_peer_down(struct shm *t, struct peer *p, int failed, loom_result_t code,
                         const char *why, int notify);
void loomi_shm_peer_error(struct shm *t, struct peer *p, loom_result_t code, const char *fmt, ...)
    LOOMI_PRINTF(4, 5);
/* match.c fails a peer through this. */
void loomi_shm_match_fail(void *owner, int peer, loom_result_t code, const char *why);

struct stat;
/* A peer's segment, as fstat saw it (sb) with a private copy of its
 * header (h), checked before anything in it is used by a job of nranks
 * ranks run by the user euid: NULL when it may be mapped and used, else
 * what is wrong with it.  Pure, with no sum of the peer's numbers that
 * can wrap: the rings, slots and arena lie inside the segment. */
const char *loomi_shm_seg_bad(const struct stat *sb, uid_t euid, const struct seg_hdr *h,
                              int nranks);
#define PROTO(t, p, ...)                                                                          \
    loomi_shm_peer_error(t, p, LOOM_ERR_MISMATCH, "protocol error: " __VA_ARGS__)

/* shm_fifo.c: the FIFOs: a control cell queued for p, writing what fits
 * to p, consuming up to `budget` cells from p (each returns cells moved);
 * the transport's isend, irecv and cancel. */
void loomi_shm_ctl_push(struct shm *t, struct peer *p, uint16_t type, uint64_t id);
int loomi_shm_pump_out(struct shm *t, struct peer *p);
int loomi_shm_poll_in(struct shm *t, struct peer *p, int budget);
loom_result_t loomi_shm_isend(void *state, struct loomi_xfer *x);
loom_result_t loomi_shm_irecv(void *state, struct loomi_xfer *x);
void loomi_shm_cancel(void *state, struct loomi_xfer *x);

/* shm_cma.c: single-copy reads: start one for a descriptor, and move one
 * piece of each of p's (returns pieces moved). */
void loomi_shm_start_read(struct shm *t, struct peer *p, struct loomi_xfer *x, uint64_t raddr,
                          uint64_t id);
int loomi_shm_do_reads(struct shm *t, struct peer *p);

/* shm_progress.c: progress and the peers' liveness. */
loom_result_t loomi_shm_progress(void *state, int timeout_ms);
int loomi_shm_wait_fd(void *state);
uint64_t loomi_shm_moved(void *state);

#endif
