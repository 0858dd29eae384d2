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
 * buffer, as tcp_data.c does), so a sender is never blocked by a receive that
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
 *
 * This file holds the segments (creating, sizing, mapping the peers'),
 * connect_all, teardown and the ops table; shm_fifo.c the messages
 * through the cells and failing a peer; shm_cma.c the single-copy
 * reads; shm_progress.c progress and liveness; shm_internal.h is what
 * they share.
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
#include "transports/shm/shm.h"
#include "transports/shm/shm_internal.h"
#include "transports/transport.h"

static void seg_path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, SHM_DIR "%s", name);
}

static void pause_short(void)
{
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
}

/* -------------------------------------------------------------- set-up */

/* 16 hex digits of fresh random bits: segment names carry nothing
 * derived from the job's secret (peers learn them from the address
 * table, which only members receive). */
static int random_hex(char out[17])
{
    unsigned char b[8];
    if (loomi_auth_random(b, sizeof b)) return -1;
    for (int i = 0; i < 8; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
    return 0;
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
    loomi_match_init(&t->match, &t->ctx, sizeof(struct unexp), UNEXP_LIMIT, loomi_shm_match_fail,
                     t);
    memcpy(t->key, ctx->job_key, sizeof t->key);
    t->ctx.job_key = t->key;
    loomi_auth_tag(t->key, "loom shm segment", t->tag);
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
    if (random_hex(kh)) {
        r = loomi_fail(LOOM_ERR_SYSTEM, ctx->rank, "shm: getrandom: %s", strerror(errno));
        goto fail;
    }
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
    memcpy(t->hdr->job_tag, t->tag, sizeof t->tag);
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
    /* Release: a peer that sees the magic (acquire, open_peer) sees the
     * whole layout written above. */
    atomic_store_explicit(&h->magic, SEG_MAGIC, memory_order_release);
    return LOOM_SUCCESS;
}

const char *loomi_shm_seg_bad(const struct stat *sb, uid_t euid, const struct seg_hdr *h,
                              int nranks)
{
    /* Anyone may create a file in /dev/shm under the name a peer will
     * use: only one of this job's user is trusted. */
    if (sb->st_uid != euid) return "is not owned by this job's user";
    if (sb->st_size < 0 || h->total < PAGE || h->total > MAX_SEG ||
        h->total > (uint64_t)sb->st_size)
        return "has a size that does not fit the file";
    if (nranks < 1 || h->nslots > (uint32_t)nranks) return "has more FIFOs than ranks";
    if (h->ncells < 2 || h->ncells > 1024 || (h->ncells & (h->ncells - 1)) ||
        h->cell_bytes < 256 || h->cell_bytes > (1u << 20) || h->cell_bytes % 64)
        return "has bad cells";
    uint64_t slots_end, rings_bytes, rings_end;
    if (h->slots_off < PAGE || h->slots_off % 64 ||
        __builtin_add_overflow(h->slots_off, 4ull * h->nslots, &slots_end) || slots_end > h->total)
        return "has its slots outside it";
    /* ncells <= 1024, cell_bytes <= 1 MiB: no wrap. */
    const uint64_t ring_min = sizeof(struct ring_ctl) + (uint64_t)h->ncells * h->cell_bytes;
    if (h->ring_stride < ring_min || h->ring_stride % 64 || h->rings_off % 64 ||
        h->rings_off < slots_end ||
        __builtin_mul_overflow(h->ring_stride, (uint64_t)h->nslots, &rings_bytes) ||
        __builtin_add_overflow(h->rings_off, rings_bytes, &rings_end) || rings_end > h->total)
        return "has its rings outside it";
    if (h->arena_off % PAGE || h->arena_bytes > h->total ||
        h->arena_off > h->total - h->arena_bytes)
        return "has its arena outside it";
    return NULL;
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
    if (fstat(p->fd, &sb) != 0) return 1;
    if (sb.st_uid != geteuid()) { /* before a byte of it is mapped */
        *err = loomi_fail(LOOM_ERR_CONNECT, me, "shm: rank %d: %s is owned by uid %u, not by "
                          "this job's user (uid %u)", q, path, (unsigned)sb.st_uid,
                          (unsigned)geteuid());
        return -1;
    }
    if ((size_t)sb.st_size < PAGE) return 1;
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
    /* Acquire: the layout is read after the magic its owner stored last. */
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
    if (memcmp(h.job_tag, t->tag, sizeof t->tag) != 0 || h.rank != q || h.nranks != t->ctx.nranks ||
        h.pid != p->pid) {
        *err = loomi_fail(LOOM_ERR_MISMATCH, me,
                          "shm: rank %d: segment %s belongs to another job or rank (rank %d of "
                          "%d, pid %d)",
                          q, path, h.rank, h.nranks, h.pid);
        return -1;
    }
    if (fstat(p->fd, &sb) != 0) sb.st_size = 0;
    const char *bad = loomi_shm_seg_bad(&sb, geteuid(), &h, t->ctx.nranks);
    if (bad) {
        *err = loomi_fail(LOOM_ERR_MISMATCH, me, "shm: rank %d: segment %s %s", q, path, bad);
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
    /* Release: what this rank set up for the FIFO it feeds comes before
     * the flag the owner waits for (no_hello, acquire). */
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

/* One more turn of a connect wait that still misses the peers pick
 * names: a short pause, or why it gives up (the guard stopped it, or the
 * deadline passed: "shm: <who_pre><ranks><who_post> before the
 * deadline"). */
static loom_result_t wait_more(const struct shm *t, uint64_t deadline_ms,
                               int (*pick)(const struct peer *), const char *what,
                               const char *who_pre, const char *who_post)
{
    char why[200];
    if (loomi_guard_stop(why, sizeof why))
        return loomi_fail(LOOM_ERR_REMOTE, t->ctx.rank, "shm: waiting for %s; gave up: %s", what,
                          why);
    if (loomi_ms_left(deadline_ms) == 0) {
        char who[256];
        list_ranks(who, sizeof who, t, pick);
        return loomi_fail(LOOM_ERR_TIMEOUT, t->ctx.rank, "shm: %s%s%s before the deadline",
                          who_pre, who, who_post);
    }
    pause_short();
    return LOOM_SUCCESS;
}

static loom_result_t shm_connect_all(void *state, const unsigned char *addrs, size_t addr_len,
                                     uint64_t deadline_ms)
{
    struct shm *t = state;
    const int me = t->ctx.rank, n = t->ctx.nranks;
    if (t->hdr && atomic_load_explicit(&t->hdr->magic, memory_order_relaxed))
        return loomi_fail(LOOM_ERR_INVALID_USAGE, me, "shm: connect_all called twice");
    int k = 0;
    for (int q = 0; q < n; q++) {
        struct shm_addr sa;
        if (!loomi_peer_addr(addrs, addr_len, q, me, &sa, sizeof sa)) continue;
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
        r = wait_more(t, deadline_ms, not_mapped, "the peers' segments",
                      "the shared-memory segments of rank(s) ", " were not ready");
        if (r != LOOM_SUCCESS) return r;
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
        r = wait_more(t, deadline_ms, no_hello, "the peers to map this rank's segment",
                      "rank(s) ", " did not map this rank's shared-memory segment");
        if (r != LOOM_SUCCESS) return r;
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
        /* Release: a peer that sees ST_ABORT (acquire, peer_state) reads
         * who failed and why as written above, not older words. */
        atomic_store_explicit(&t->hdr->state, ST_ABORT, memory_order_release);
    }
    for (int q = 0; q < t->ctx.nranks; q++) {
        struct peer *p = &t->peers[q];
        if (p->connected && !p->failed)
            loomi_shm_peer_down(t, p, failed, code, "communicator aborted", 0);
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
    /* Release: every cell sent before is published before the goodbye, so
     * a peer that sees it (acquire) finds them all (peer_state drains). */
    if (t->hdr && !t->aborted) atomic_store_explicit(&t->hdr->state, ST_BYE, memory_order_release);
    for (int q = 0; q < t->ctx.nranks; q++)
        loomi_shm_peer_down(t, &t->peers[q], -1, LOOM_ERR_REVOKED, "communicator destroyed", 0);
    detach_peers(t);
    unlink_own(t);
    if (t->map) munmap(t->map, t->map_len);
    if (t->fd >= 0) close(t->fd);
    loomi_match_fini(&t->match);
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

/* The ops table: every transport's lists the same members in the same
 * order (transport.h), so the tables look alike on purpose. */
const struct loomi_transport_ops loomi_shm_ops = {
    .name = "shm",
    .caps = LOOMI_TCAP_TWO_SIDED,
    .create = shm_create,
    .local_addr = shm_local_addr,
    .connect_all = shm_connect_all,
    .mem_register = NULL,
    .mem_deregister = NULL,
    .isend = loomi_shm_isend,
    .irecv = loomi_shm_irecv,
    .progress = loomi_shm_progress,
    .wait_fd = loomi_shm_wait_fd,
    .moved = loomi_shm_moved,
    .cancel = loomi_shm_cancel,
    .abort_all = shm_abort_all,
    .destroy = shm_destroy,
    .shared_map = shm_shared_map,
};
