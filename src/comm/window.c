/*
 * window.c - loom_mem_alloc / loom_mem_free: symmetric windows, memory
 * every rank of a host can read in its peers' processes.
 *
 * loom_mem_alloc is collective: each rank creates a segment in /dev/shm
 * of the same size, and maps the segments of the other ranks of its host
 * (they say their names' pid and number in one allgather).  So that
 * nothing is left behind, a segment is unlinked as soon as the host has
 * mapped it (an allreduce says so); until then its creator holds a lock
 * on it, and the shared-memory transport's start-up scan removes the
 * segment of a process that died in between (the name has its form).
 *
 * Windows are symmetric, like OpenSHMEM's heap or NCCL's registered
 * windows: the k-th allocation of a communicator has the same id on
 * every rank, and a buffer at offset o of one rank's window stands for
 * the buffers at offset o of the others'.  The shared allreduce then
 * reduces straight from the peers' windows and copies the results out of
 * them, without staging the vectors in the arenas (shared.c); the ranks
 * check at run time that they all do so at the same offsets.
 *
 * Out of place on one host that allreduce writes each reduced slice into
 * every rank's window (LOOMI_RS_PUSH).  Once an operation has failed on a
 * rank, its caller may reuse its buffers as soon as the call returns, so
 * nothing may write into them after that, not even a peer that has not
 * yet learnt of the failure.  The push guard: past the caller's bytes,
 * each segment ends with two cache lines, `busy` (set by the owner while
 * it runs a push step) and `closed` (set by the owner once an operation
 * that peers push into has failed on it).  A pusher sets its busy, then
 * reads every destination's closed, and pushes only if none is set; a
 * failing rank sets its closed, then waits until no peer's busy is set
 * (or the peer has exited, or the deadline has passed).  Both store, then
 * load, sequentially consistent: at least one sees the other's store, so
 * either the pusher stays away or the failing rank waits for its step.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm/collectives.h"
#include "comm/comm.h"
#include "core/internal.h"
#include "sched/sched.h"
#include "core/hostmap.h"

#define SEG_DIR "/dev/shm/"
#define PAGE ((size_t)4096)
/* Names numbered apart from the transport's own segments (shm.c counts
 * from 0 per process). */
#define WIN_NUM_BASE 0x80000000u
/* The push guard's two lines at the end of every segment. */
#define GUARD_BYTES ((size_t)128)
enum { GUARD_BUSY = 0, GUARD_CLOSED = 1 };

struct loomi_win {
    struct loomi_win *next;
    uint64_t id;          /* the communicator's allocation number, from 1 */
    unsigned char *base;  /* this rank's window */
    size_t bytes;         /* what was asked for */
    size_t map_len;       /* page-rounded, each mapping */
    int n;                /* maps: the host's ranks (1 when not shared) */
    unsigned char **maps; /* [n] by local index; maps[local index] = base */
    long *pids;           /* [n] their processes, for the push guard */
    int li;               /* this rank's local index */
};

/* What each rank says in loom_mem_alloc's allgather. */
struct win_hello {
    uint64_t bytes, id;
    int64_t pid;
    uint32_t num, ok;
    uint64_t tag; /* random: in the segment's name, which holds nothing secret */
};

static atomic_uint next_num;

static void seg_name(char *out, size_t n, uint64_t tag, int rank, long pid, unsigned num)
{
    snprintf(out, n, SEG_DIR "loom-%016llx-%d-%ld-%u", (unsigned long long)tag, rank, pid, num);
}

static void win_unmap(struct loomi_win *w)
{
    if (w->maps)
        for (int i = 0; i < w->n; i++)
            if (w->maps[i]) munmap(w->maps[i], w->map_len);
    free(w->maps);
    free(w->pids);
    free(w);
}

/* Create and map this rank's segment; fd stays open and locked. */
static loom_result_t create_own(struct loom_comm *c, struct loomi_win *w, const char *path,
                                int *fd_out)
{
    const char *fn = "loom_mem_alloc";
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return loomi_fail(LOOM_ERR_SYSTEM, c->rank, "%s: cannot create %s: %s", fn, path,
                          strerror(errno));
    /* Held until the segment is unlinked: a scan for the leftovers of
     * dead processes leaves a locked segment alone. */
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    int e = 0;
    if (fcntl(fd, F_OFD_SETLK, &fl) != 0 || ftruncate(fd, (off_t)w->map_len) != 0) e = errno;
    /* A full /dev/shm is an error now, not a SIGBUS later. */
    if (!e) e = posix_fallocate(fd, 0, (off_t)w->map_len);
    if (e == EOPNOTSUPP || e == EINVAL) e = 0;
    void *m = MAP_FAILED;
    if (!e) {
        m = mmap(NULL, w->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) e = errno;
    }
    if (e) {
        unlink(path);
        close(fd);
        return loomi_fail(LOOM_ERR_SYSTEM, c->rank,
                          "%s: cannot make a window of %zu bytes in %s: %s (is " SEG_DIR
                          " full? see df " SEG_DIR ")",
                          fn, w->map_len, path, strerror(e));
    }
    w->base = m;
    *fd_out = fd;
    return LOOM_SUCCESS;
}

/* Map a peer's segment, after checking it is the size every rank asked
 * for (the name came over the network). */
static unsigned char *map_peer(struct loom_comm *c, const char *path, size_t len)
{
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        loomi_fail(LOOM_ERR_SYSTEM, c->rank, "loom_mem_alloc: cannot open %s: %s", path,
                   strerror(errno));
        return NULL;
    }
    struct stat sb;
    void *m = MAP_FAILED;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size != len || sb.st_uid != geteuid())
        loomi_fail(LOOM_ERR_MISMATCH, c->rank,
                   "loom_mem_alloc: %s is not a window of %zu bytes of this user", path, len);
    else if ((m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
        loomi_fail(LOOM_ERR_SYSTEM, c->rank, "loom_mem_alloc: cannot map %s: %s", path,
                   strerror(errno));
    close(fd);
    return m == MAP_FAILED ? NULL : m;
}

loom_result_t loom_mem_alloc(loom_comm_t comm, size_t bytes, void **ptr)
{
    return loomi_mem_alloc(comm, "loom_mem_alloc", bytes, ptr, 1);
}

loom_result_t loomi_mem_alloc(loom_comm_t comm, const char *fn, size_t bytes, void **ptr,
                              int tables)
{
    if (ptr) *ptr = NULL;
    struct loom_comm *c;
    loom_result_t r = loomi_comm_check(comm, fn, &c);
    if (r != LOOM_SUCCESS) return r;
    if (!ptr) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, c->rank, "%s: ptr is NULL", fn);
    if (bytes == 0) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, c->rank, "%s: bytes is 0", fn);
    if (bytes > ((size_t)1 << 46))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, c->rank,
                          "%s: bytes %zu is more than 64 TiB", fn, bytes);
    const struct loomi_hostmap *m = c->hosts;
    /* Shared where the host's ranks share arenas (the shm transport is
     * up); otherwise a window of one, which works as plain memory. */
    const int shared = m && c->shared_bytes > 0 && m->nranks == c->nranks;
    const int h = shared ? m->host_of[c->rank] : 0;
    const int L = shared ? loomi_host_size(m, h) : 1;
    const int li = shared ? m->local_index[c->rank] : 0;
    struct loomi_win *w = calloc(1, sizeof *w);
    if (w) w->maps = calloc((size_t)L, sizeof *w->maps);
    if (w) w->pids = calloc((size_t)L, sizeof *w->pids);
    if (!w || !w->maps || !w->pids) {
        if (w) free(w->maps), free(w->pids), free(w);
        return loomi_fail(LOOM_ERR_NO_MEMORY, c->rank, "%s: out of memory", fn);
    }
    w->id = ++c->win_count;
    w->bytes = bytes;
    w->map_len = (bytes + GUARD_BYTES + PAGE - 1) / PAGE * PAGE;
    w->n = L;
    w->li = li;
    char path[128];
    const unsigned num = WIN_NUM_BASE | (atomic_fetch_add(&next_num, 1) & 0x7fffffffu);
    uint64_t tag = 0;
    if (loomi_auth_random(&tag, sizeof tag))
        return loomi_fail(LOOM_ERR_SYSTEM, c->rank, "%s: getrandom: %s", fn, strerror(errno));
    seg_name(path, sizeof path, tag, c->rank, (long)getpid(), num);
    int fd = -1;
    loom_result_t mine = create_own(c, w, path, &fd);
    char why[256] = "";
    if (mine != LOOM_SUCCESS) snprintf(why, sizeof why, "%s", loom_get_last_error());
    else w->maps[li] = w->base;

    /* Every rank's size, number and segment name. */
    struct win_hello me = {.bytes = bytes, .id = w->id, .pid = getpid(), .num = num,
                           .ok = mine == LOOM_SUCCESS, .tag = tag};
    struct win_hello *all = calloc((size_t)c->nranks, sizeof *all);
    if (!all) {
        r = loomi_fail(LOOM_ERR_NO_MEMORY, c->rank, "%s: out of memory", fn);
    } else {
        r = loomi_call_allgather("loom_allgather", &me, all, sizeof me, LOOM_UINT8, comm, NULL,
                                 NULL);
        if (r != LOOM_SUCCESS) snprintf(why, sizeof why, "%s", loom_get_last_error());
    }
    /* Check what came over the network, then map the host's others. */
    uint32_t ok = r == LOOM_SUCCESS && mine == LOOM_SUCCESS;
    loom_result_t bad = LOOM_ERR_SYSTEM; /* what a failure seen here is */
    for (int q = 0; ok && q < c->nranks; q++) {
        if (all[q].bytes != bytes || all[q].id != w->id) {
            snprintf(why, sizeof why,
                     "%s: rank %d asked for %llu bytes as window %llu, this rank for %zu as "
                     "window %llu (every rank must call it alike, in the same order)",
                     fn, q, (unsigned long long)all[q].bytes, (unsigned long long)all[q].id,
                     bytes, (unsigned long long)w->id);
            bad = LOOM_ERR_MISMATCH;
            ok = 0;
        } else if (!all[q].ok || all[q].pid <= 0) {
            snprintf(why, sizeof why, "%s: rank %d could not make its window", fn, q);
            ok = 0;
        }
    }
    for (int i = 0; ok && i < L; i++) {
        const int q = m->host_ranks[m->host_start[h] + i];
        w->pids[i] = (long)all[q].pid;
        if (q == c->rank) continue;
        char peer[128];
        seg_name(peer, sizeof peer, all[q].tag, q, (long)all[q].pid, all[q].num);
        if (!(w->maps[i] = map_peer(c, peer, w->map_len))) {
            snprintf(why, sizeof why, "%s", loom_get_last_error());
            ok = 0;
        }
    }
    free(all);
    /* Everyone has mapped (or failed): the names can go. */
    uint32_t all_ok = ok;
    loom_result_t r2 = LOOM_SUCCESS;
    if (r == LOOM_SUCCESS)
        r2 = loomi_call_allreduce("loom_allreduce", &ok, &all_ok, 1, LOOM_UINT32, LOOM_MIN, comm,
                                  NULL, NULL);
    if (fd >= 0) {
        unlink(path);
        close(fd);
    }
    if (r == LOOM_SUCCESS && r2 != LOOM_SUCCESS) {
        r = r2;
        snprintf(why, sizeof why, "%s", loom_get_last_error());
    }
    if (r != LOOM_SUCCESS || !all_ok) {
        win_unmap(w);
        if (r == LOOM_SUCCESS) r = mine != LOOM_SUCCESS ? mine : bad;
        return loomi_fail(r, c->rank, "%s",
                          why[0] ? why : "loom_mem_alloc: another rank could not map the windows");
    }
    w->next = c->wins;
    c->wins = w;
    /* Job-wide facts only, so that every rank sets it alike. */
    if (tables && shared && m->nhosts < c->nranks) c->win_shared = 1;
    *ptr = w->base;
    return LOOM_SUCCESS;
}

loom_result_t loom_mem_free(loom_comm_t h, void *ptr)
{
    const char *fn = "loom_mem_free";
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_live(h, fn, &comm);
    if (r != LOOM_SUCCESS) return r;
    if (!ptr) return LOOM_SUCCESS;
    struct loomi_win **l = &comm->wins;
    while (*l && (*l)->base != (unsigned char *)ptr) l = &(*l)->next;
    if (!*l)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: ptr %p is not the start of a window of this communicator (freed "
                          "already, or from another one)",
                          fn, ptr);
    struct loomi_win *w = *l;
    /* A completed operation's peers are done with this window (the
     * shared allreduce ends only once every rank has copied out), so
     * unmapping here harms nobody; one not yet waited for may still read
     * the mappings, failed or not. */
    loomi_comm_lock(comm);
    int users = loomi_engine_window_users(&comm->eng, w->id);
    loomi_comm_unlock(comm);
    if (users)
        return loomi_fail(LOOM_ERR_INVALID_USAGE, comm->rank,
                          "%s: %d operation(s) on window %p are not waited for yet; wait for "
                          "them first",
                          fn, users, ptr);
    *l = w->next;
    win_unmap(w);
    return LOOM_SUCCESS;
}

/* Walks its list as loomi_mem_release_all (mem.c) does its own: two
 * lists of two types, alike on purpose. */
void loomi_mem_windows_free_all(struct loom_comm *c)
{
    while (c->wins) {
        struct loomi_win *w = c->wins;
        c->wins = w->next;
        win_unmap(w);
    }
}

int loomi_mem_window_find(const struct loom_comm *c, const void *p, size_t len, uint64_t *id,
                          size_t *off, size_t *win_bytes)
{
    const uintptr_t a = (uintptr_t)p;
    for (const struct loomi_win *w = c->wins; w; w = w->next) {
        const uintptr_t b = (uintptr_t)w->base;
        if (w->n < 2 || a < b || a - b > w->bytes || len > w->bytes - (a - b)) continue;
        *id = w->id;
        *off = a - b;
        *win_bytes = w->bytes;
        return 1;
    }
    return 0;
}

static struct loomi_win *win_of(const struct loom_comm *c, uint64_t id)
{
    for (struct loomi_win *w = c->wins; w; w = w->next)
        if (w->id == id) return w;
    return NULL;
}

int loomi_mem_window_map(const struct loom_comm *c, uint64_t id, unsigned char **out, int n,
                         size_t *len)
{
    const struct loomi_win *w = win_of(c, id);
    if (!w || w->n < n) return 0;
    for (int i = 0; i < n; i++) out[i] = w->maps[i];
    *len = w->bytes;
    return n;
}

static _Atomic uint64_t *guard(const struct loomi_win *w, int i, int which)
{
    return (_Atomic uint64_t *)(void *)(w->maps[i] + w->map_len - GUARD_BYTES +
                                        (size_t)which * (GUARD_BYTES / 2));
}

/* The global rank of local index i (the windows' host is this rank's). */
static int rank_of(const struct loom_comm *c, int i)
{
    const struct loomi_hostmap *m = c->hosts;
    return m->host_ranks[m->host_start[m->host_of[c->rank]] + i];
}

int loomi_mem_window_push_begin(const struct loom_comm *c, uint64_t id)
{
    const struct loomi_win *w = win_of(c, id);
    if (!w || w->n < 2) return -1;
    /* Sequentially consistent store, then loads (Dekker's handshake with
     * loomi_mem_window_close): release and acquire would not do, as they
     * let the load of `closed` pass the store of `busy` (on arm64 too: only
     * an stlr followed by an ldar is kept in order).  The loads' acquire
     * also keeps the pushes after them. */
    atomic_store(guard(w, w->li, GUARD_BUSY), 1);
    for (int i = 0; i < w->n; i++)
        if (i != w->li && atomic_load(guard(w, i, GUARD_CLOSED))) {
            atomic_store_explicit(guard(w, w->li, GUARD_BUSY), 0, memory_order_release);
            return rank_of(c, i);
        }
    return -1;
}

void loomi_mem_window_push_end(const struct loom_comm *c, uint64_t id)
{
    const struct loomi_win *w = win_of(c, id);
    /* The caller fenced its streaming stores (x86; plain stores elsewhere):
     * this release store comes after them, so a closing peer that sees
     * busy clear (acquire) has every pushed byte. */
    if (w && w->n >= 2) atomic_store_explicit(guard(w, w->li, GUARD_BUSY), 0, memory_order_release);
}

/* Whether the process is gone: no such process, or a zombie. */
static int exited(long pid)
{
    if (pid <= 0 || pid > INT_MAX) return 0; /* a peer's word: never a pid_t */
    if (kill((pid_t)pid, 0) != 0) return errno == ESRCH;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[k] = 0;
    const char *rp = strrchr(buf, ')'); /* the name may hold anything */
    return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

int loomi_mem_window_close(const struct loom_comm *c, uint64_t id, uint64_t deadline_ms)
{
    const struct loomi_win *w = win_of(c, id);
    if (!w || w->n < 2) return 0;
    /* Sequentially consistent, as in push_begin (the other half). */
    atomic_store(guard(w, w->li, GUARD_CLOSED), 1);
    int left = 0;
    for (int i = 0; i < w->n; i++) {
        if (i == w->li) continue;
        while (atomic_load(guard(w, i, GUARD_BUSY)) && !exited(w->pids[i])) {
            if (loomi_now_ms() >= deadline_ms) {
                left++;
                break;
            }
            /* A step lasts microseconds to milliseconds; the pusher may
             * share this core. */
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
    return left;
}
