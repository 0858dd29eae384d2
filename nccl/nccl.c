/*
 * nccl.c - NCCL's API on top of Loom's public interface (loom.h only).
 *
 * The model, documented in loom-nccl(7):
 *  - a call outside a group completes before it returns, blocking the
 *    calling thread (NCCL's only enqueues it on the stream); between
 *    ncclGroupStart and ncclGroupEnd calls are queued (Loom's group) and
 *    the outermost ncclGroupEnd runs them all and returns when they are
 *    complete.  Nothing is ever left running, so ncclInProgress is never
 *    returned, even on a communicator configured non-blocking.
 *  - communicators initialised inside a group are created at the
 *    outermost ncclGroupEnd, each on a thread of its own (so one thread
 *    can create several ranks of one job: ncclCommInitAll).
 *  - CUDA device buffers (told by CUDA's driver, libcuda.so.1 loaded at
 *    run time: is_device in ops.c) are taken by the collectives, which
 *    Loom stages through pinned host memory, outside groups only; send,
 *    recv and registration refuse them.  A non-NULL stream is
 *    synchronised before the call reads its input (sync_stream in
 *    ops.c), and the device result is written when the call returns,
 *    so work queued on the stream afterwards sees it;
 *  - what cannot be honoured here returns ncclInvalidUsage; every
 *    failure leaves its reason for ncclGetLastError and prints it under
 *    NCCL_DEBUG=WARN (or INFO, TRACE).
 *
 * This file holds logging and errors, the live communicators, groups,
 * and the communicators' lifecycle (init, split, finalize, destroy,
 * abort) and queries.  ops.c holds memory, the reduction ops
 * (PreMulSum), the detection of device memory and the operations
 * (allreduce ... send, recv); internal.h the state both use; map.c how
 * NCCL's enums and results meet Loom's.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "nccl/internal.h"

/* ------------------------------------------------------- logging, errors */

enum { DBG_NONE, DBG_VERSION, DBG_WARN, DBG_INFO, DBG_TRACE };
static int dbg_level;
static pthread_once_t dbg_once = PTHREAD_ONCE_INIT;
static _Thread_local char tl_err[640];

static void dbg_init(void)
{
    const char *s = getenv("NCCL_DEBUG");
    dbg_level = DBG_NONE;
    if (!s) return;
    if (!strcasecmp(s, "VERSION")) dbg_level = DBG_VERSION;
    else if (!strcasecmp(s, "WARN")) dbg_level = DBG_WARN;
    else if (!strcasecmp(s, "INFO")) dbg_level = DBG_INFO;
    else if (!strcasecmp(s, "TRACE")) dbg_level = DBG_TRACE;
}

static void emit(const char *level, const char *msg)
{
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    char *dot = strchr(host, '.');
    if (dot) *dot = '\0';
    fprintf(stderr, "%s:%d:%ld NCCL %s %s\n", host, (int)getpid(),
            (long)syscall(SYS_gettid), level, msg);
}

void lnccl_info(const char *fmt, ...)
{
    pthread_once(&dbg_once, dbg_init);
    if (dbg_level < DBG_INFO) return;
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit("INFO", msg);
}

/* Record (ncclGetLastError) and log the reason of a failure; returns r. */
ncclResult_t lnccl_fail(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_err, sizeof tl_err, fmt, ap);
    va_end(ap);
    pthread_once(&dbg_once, dbg_init);
    if (dbg_level >= DBG_WARN) emit("WARN", tl_err);
    return r;
}

static void mark_async(struct ncclComm *c, ncclResult_t r)
{
    if (!c || (r != ncclRemoteError && r != ncclSystemError && r != ncclInternalError))
        return;
    pthread_mutex_lock(&c->mu);
    if (c->async == ncclSuccess) c->async = r;
    pthread_mutex_unlock(&c->mu);
}

/* A Loom result as an NCCL one, with Loom's message behind fn's name. */
ncclResult_t lnccl_from_loom(loom_result_t r, const char *fn, struct ncclComm *c)
{
    if (r == LOOM_SUCCESS) return ncclSuccess;
    ncclResult_t n = lnccl_result(r);
    const char *m = loom_get_last_error();
    lnccl_fail(n, "%s: %s (loom: %s)", fn, m && *m ? m : loom_strerror(r), loom_strerror(r));
    mark_async(c, n);
    return n;
}

/* ------------------------------------------------ live communicators */

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm **live;
static size_t nlive, caplive;

static int live_add(struct ncclComm *c)
{
    pthread_mutex_lock(&live_mu);
    if (nlive == caplive) {
        size_t n = caplive ? 2 * caplive : 16;
        struct ncclComm **p = realloc(live, n * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&live_mu);
            return -1;
        }
        live = p;
        caplive = n;
    }
    live[nlive++] = c;
    pthread_mutex_unlock(&live_mu);
    return 0;
}

static void live_remove(struct ncclComm *c)
{
    pthread_mutex_lock(&live_mu);
    for (size_t i = 0; i < nlive; i++)
        if (live[i] == c) {
            live[i] = live[--nlive];
            break;
        }
    pthread_mutex_unlock(&live_mu);
}

/* The communicator behind a handle, or NULL (and the reason recorded):
 * NULL, destroyed and never-made handles are told apart from live ones
 * without reading through them. */
struct ncclComm *lnccl_comm_get(ncclComm_t comm, const char *fn, ncclResult_t *r)
{
    struct ncclComm *found = NULL;
    if (!comm) {
        *r = lnccl_fail(ncclInvalidArgument, "%s: comm is NULL", fn);
        return NULL;
    }
    pthread_mutex_lock(&live_mu);
    for (size_t i = 0; i < nlive; i++)
        if (live[i] == comm) found = comm;
    pthread_mutex_unlock(&live_mu);
    if (!found || found->magic != COMM_MAGIC)
        *r = lnccl_fail(ncclInvalidArgument,
                        "%s: comm %p is not a communicator (destroyed, aborted or never made)", fn,
                        (void *)comm);
    return found;
}

/* A communicator ready for operations. */
struct ncclComm *lnccl_comm_ready(ncclComm_t comm, const char *fn, ncclResult_t *r)
{
    struct ncclComm *c = lnccl_comm_get(comm, fn, r);
    if (!c) return NULL;
    if (c->pending) {
        *r = lnccl_fail(ncclInvalidUsage,
                        "%s: comm %p is still being created: it exists after the ncclGroupEnd "
                        "that closes the group of its ncclCommInitRank",
                        fn, (void *)comm);
        return NULL;
    }
    if (!c->lc) {
        *r = lnccl_fail(ncclInvalidUsage, "%s: comm %p failed to initialise (%s); destroy it", fn,
                        (void *)comm, lnccl_result_string(c->init_result));
        return NULL;
    }
    if (c->finalized) {
        *r = lnccl_fail(ncclInvalidUsage, "%s: comm %p was finalized (ncclCommFinalize)", fn,
                        (void *)comm);
        return NULL;
    }
    return c;
}

static struct ncclComm *comm_new(int nranks, int rank)
{
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->magic = COMM_MAGIC;
    atomic_init(&c->inflight, 0);
    c->nranks = nranks;
    c->rank = rank;
    pthread_mutex_init(&c->mu, NULL);
    if (live_add(c) != 0) {
        free(c);
        return NULL;
    }
    return c;
}

static void comm_free(struct ncclComm *c)
{
    live_remove(c);
    c->magic = 0;
    pthread_mutex_destroy(&c->mu);
    free(c->ops);
    free(c);
}

/* ---------------------------------------------------------------- groups */

/* Per thread: the depth of ncclGroupStart, whether Loom's group is open,
 * the communicators to create at the outermost ncclGroupEnd, scaled
 * copies of PreMulSum inputs to free then, and the group's first error. */
_Thread_local int lnccl_tl_depth;
static _Thread_local int tl_loom_open;
static _Thread_local struct ncclComm **tl_pending;
static _Thread_local int tl_npending, tl_cappending;
_Thread_local void **lnccl_tl_tmp;
_Thread_local int lnccl_tl_ntmp, lnccl_tl_captmp;
static _Thread_local ncclResult_t tl_group_err;
_Thread_local struct ncclComm **lnccl_tl_queued; /* one entry per queued call */
_Thread_local int lnccl_tl_nqueued, lnccl_tl_capqueued;

int lnccl_push_ptr(void ***arr, int *n, int *cap, void *p)
{
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 8;
        void **a = realloc(*arr, (size_t)nc * sizeof *a);
        if (!a) return -1;
        *arr = a;
        *cap = nc;
    }
    (*arr)[(*n)++] = p;
    return 0;
}

/* Note an error of a call made inside a group: ncclGroupEnd returns it. */
ncclResult_t lnccl_group_note(ncclResult_t r)
{
    if (r != ncclSuccess && r != ncclInProgress && lnccl_tl_depth > 0 &&
        tl_group_err == ncclSuccess)
        tl_group_err = r;
    return r;
}

/* Inside an NCCL group Loom's group is open, so that Loom queues the
 * blocking calls that follow. */
ncclResult_t lnccl_enter_op(const char *fn)
{
    if (lnccl_tl_depth > 0 && !tl_loom_open) {
        loom_result_t r = loom_group_start();
        if (r != LOOM_SUCCESS) return lnccl_from_loom(r, fn, NULL);
        tl_loom_open = 1;
    }
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void)
{
    if (lnccl_tl_depth == 0) tl_group_err = ncclSuccess;
    lnccl_tl_depth++;
    return ncclSuccess;
}

struct init_job {
    struct ncclComm *c;
    pthread_t th;
    int started;
    loom_result_t r;
    char err[512];
};

static void *init_thread(void *arg);
static ncclResult_t comm_create(struct ncclComm *c, const char *fn);

ncclResult_t ncclGroupEnd(void)
{
    if (lnccl_tl_depth == 0)
        return lnccl_fail(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart to close");
    if (--lnccl_tl_depth > 0) return ncclSuccess;

    ncclResult_t res = tl_group_err;
    /* Communicators first, each on its own thread (their ranks may all
     * be in this process), while this thread runs the queued calls. */
    int n = tl_npending;
    struct init_job *jobs = n ? calloc((size_t)n, sizeof *jobs) : NULL;
    if (n && !jobs) {
        res = lnccl_fail(ncclSystemError, "ncclGroupEnd: out of memory for %d communicators", n);
        for (int i = 0; i < n; i++) { /* they failed to initialise */
            tl_pending[i]->pending = 0;
            tl_pending[i]->init_result = ncclSystemError;
        }
        n = tl_npending = 0;
    }
    for (int i = 0; i < n; i++) {
        jobs[i].c = tl_pending[i];
        jobs[i].started = pthread_create(&jobs[i].th, NULL, init_thread, &jobs[i]) == 0;
        if (!jobs[i].started) {
            /* No thread: create it here (fine for one rank per process). */
            init_thread(&jobs[i]);
        }
    }
    if (tl_loom_open) {
        tl_loom_open = 0;
        ncclResult_t r = lnccl_from_loom(loom_group_end(), "ncclGroupEnd", NULL);
        if (res == ncclSuccess) res = r;
    }
    for (int i = 0; i < lnccl_tl_nqueued; i++) atomic_fetch_sub(&lnccl_tl_queued[i]->inflight, 1);
    lnccl_tl_nqueued = 0;
    for (int i = 0; i < n; i++) {
        if (jobs[i].started) pthread_join(jobs[i].th, NULL);
        struct ncclComm *c = jobs[i].c;
        c->pending = 0;
        if (jobs[i].r != LOOM_SUCCESS) {
            c->init_result = lnccl_result(jobs[i].r);
            ncclResult_t r =
                lnccl_fail(c->init_result, "ncclCommInitRank (rank %d of %d, in a group): %s",
                           c->rank, c->nranks, jobs[i].err);
            if (res == ncclSuccess) res = r;
        } else {
            lnccl_info("comm %p rank %d nranks %d - Init COMPLETE", (void *)c, c->rank, c->nranks);
        }
    }
    int ok = 0;
    for (int i = 0; i < n; i++) ok += jobs[i].c->lc != NULL;
    struct siblings *sib = ok > 1 ? calloc(1, sizeof *sib) : NULL;
    if (sib && !(sib->lcs = calloc((size_t)ok, sizeof *sib->lcs))) {
        free(sib);
        sib = NULL;
    }
    if (sib) {
        sib->n = sib->left = ok;
        for (int i = 0; i < n; i++)
            if (jobs[i].c->lc) jobs[i].c->sib = sib;
    }
    free(jobs);
    tl_npending = 0;
    for (int i = 0; i < lnccl_tl_ntmp; i++) free(lnccl_tl_tmp[i]);
    lnccl_tl_ntmp = 0;
    tl_group_err = ncclSuccess;
    return res;
}

/* ------------------------------------------------------------- lifecycle */

ncclResult_t ncclGetVersion(int *version)
{
    if (!version) return lnccl_fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    return lnccl_result_string(result);
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm; /* as in NCCL: the calling thread's last error */
    return tl_err;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (!uniqueId) return lnccl_fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    loom_unique_id_t id;
    loom_result_t r = loom_get_unique_id(&id);
    if (r != LOOM_SUCCESS) return lnccl_from_loom(r, "ncclGetUniqueId", NULL);
    _Static_assert(sizeof id.internal == sizeof uniqueId->internal, "id sizes");
    memcpy(uniqueId->internal, id.internal, sizeof id.internal);
    return ncclSuccess;
}

static void version_line(void)
{
    int ma = 0, mi = 0, pa = 0;
    loom_get_version(&ma, &mi, &pa);
    char msg[128];
    snprintf(msg, sizeof msg, "NCCL version %d.%d.%d+loom%d.%d.%d (device buffers staged via host)", NCCL_MAJOR,
             NCCL_MINOR, NCCL_PATCH, ma, mi, pa);
    emit("INFO", msg);
}

/* Under NCCL_DEBUG=VERSION and above, once per process. */
static void print_version(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&dbg_once, dbg_init);
    if (dbg_level >= DBG_VERSION) pthread_once(&once, version_line);
}

static void *init_thread(void *arg)
{
    struct init_job *j = arg;
    struct ncclComm *c = j->c;
    loom_unique_id_t id;
    memcpy(id.internal, c->id.internal, sizeof id.internal);
    loom_config_t cfg;
    loom_config_init(&cfg);
    if (c->transport[0]) cfg.transport = c->transport;
    j->r = loom_comm_init_rank(&c->lc, c->nranks, &id, c->rank, &cfg);
    if (j->r != LOOM_SUCCESS) {
        c->lc = NULL;
        snprintf(j->err, sizeof j->err, "%s (loom: %s)", loom_get_last_error(),
                 loom_strerror(j->r));
    }
    return NULL;
}

/* Create c now, on this thread. */
static ncclResult_t comm_create(struct ncclComm *c, const char *fn)
{
    struct init_job j = {.c = c};
    init_thread(&j);
    if (j.r != LOOM_SUCCESS) {
        c->init_result = lnccl_result(j.r);
        return lnccl_fail(c->init_result, "%s (rank %d of %d): %s", fn, c->rank, c->nranks, j.err);
    }
    lnccl_info("comm %p rank %d nranks %d - Init COMPLETE", (void *)c, c->rank, c->nranks);
    return ncclSuccess;
}

/* The size-bounded prefix of an ncclConfig_t the caller knows. */
static ncclResult_t read_config(const ncclConfig_t *config, const char *fn, char *transport,
                                size_t tsize)
{
    transport[0] = '\0';
    if (!config) return ncclSuccess;
    if (config->size < offsetof(ncclConfig_t, blocking))
        return lnccl_fail(ncclInvalidArgument,
                          "%s: config was not initialised with NCCL_CONFIG_INITIALIZER (size %zu)",
                          fn, config->size);
    if (config->magic != 0xcafebeef)
        return lnccl_fail(
            ncclInvalidArgument,
            "%s: config was not initialised with NCCL_CONFIG_INITIALIZER (magic 0x%x)", fn,
            config->magic);
#define HAS(m) (config->size >= offsetof(ncclConfig_t, m) + sizeof config->m)
    if (HAS(blocking) && config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 &&
        config->blocking != 1)
        return lnccl_fail(ncclInvalidArgument, "%s: config->blocking is %d, not 0 or 1", fn,
                          config->blocking);
    if (HAS(netName) && config->netName) {
        /* The network between hosts; within a host shared memory, as
         * NCCL keeps its own transports there. */
        const char *t;
        if (!strcasecmp(config->netName, "Socket"))
            t = "shm,tcp";
        else if (!strcasecmp(config->netName, "IB"))
            t = "shm,verbs";
        else
            return lnccl_fail(ncclInvalidArgument,
                              "%s: config->netName \"%.32s\" is not a network here "
                              "(\"Socket\" or \"IB\")",
                              fn, config->netName);
        snprintf(transport, tsize, "%s", t);
    }
#undef HAS
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config)
{
    static const char fn[] = "ncclCommInitRank";
    print_version();
    if (!comm) return lnccl_group_note(lnccl_fail(ncclInvalidArgument, "%s: comm is NULL", fn));
    *comm = NULL;
    if (nranks < 1)
        return lnccl_group_note(
            lnccl_fail(ncclInvalidArgument, "%s: nranks %d is not positive", fn, nranks));
    if (rank < 0 || rank >= nranks)
        return lnccl_group_note(
            lnccl_fail(ncclInvalidArgument, "%s: rank %d is outside 0..%d", fn, rank, nranks - 1));
    char transport[16];
    ncclResult_t r = read_config(config, fn, transport, sizeof transport);
    if (r != ncclSuccess) return lnccl_group_note(r);
    struct ncclComm *c = comm_new(nranks, rank);
    if (!c) return lnccl_group_note(lnccl_fail(ncclSystemError, "%s: out of memory", fn));
    c->id = commId;
    memcpy(c->transport, transport, sizeof c->transport);
    if (lnccl_tl_depth > 0) {
        if (lnccl_push_ptr((void ***)&tl_pending, &tl_npending, &tl_cappending, c) != 0) {
            comm_free(c);
            return lnccl_group_note(lnccl_fail(ncclSystemError, "%s: out of memory", fn));
        }
        c->pending = 1;
        *comm = c;
        return ncclSuccess;
    }
    r = comm_create(c, fn);
    if (r != ncclSuccess) {
        comm_free(c);
        return r;
    }
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    static const char fn[] = "ncclCommInitAll";
    if (!comms) return lnccl_fail(ncclInvalidArgument, "%s: comms is NULL", fn);
    if (ndev < 1) return lnccl_fail(ncclInvalidArgument, "%s: ndev %d is not positive", fn, ndev);
    if (lnccl_tl_depth > 0)
        return lnccl_fail(ncclInvalidUsage, "%s: not allowed inside ncclGroupStart/ncclGroupEnd",
                          fn);
    for (int i = 0; i < ndev; i++) comms[i] = NULL;
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return r;
    /* Every rank in this process: a group creates them on threads. */
    ncclGroupStart();
    for (int i = 0; i < ndev && r == ncclSuccess; i++) {
        r = ncclCommInitRank(&comms[i], ndev, id, i);
        if (r == ncclSuccess) comms[i]->cudev = devlist ? devlist[i] : i;
    }
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess) r = e;
    if (r != ncclSuccess) {
        char why[sizeof tl_err];
        memcpy(why, tl_err, sizeof why);
        struct siblings *sib = NULL;
        for (int i = 0; i < ndev; i++)
            if (comms[i] && comms[i]->sib) sib = comms[i]->sib;
        if (sib) {
            free(sib->lcs);
            free(sib);
        }
        for (int i = 0; i < ndev; i++)
            if (comms[i]) {
                if (comms[i]->lc) loom_comm_abort(comms[i]->lc);
                comm_free(comms[i]);
                comms[i] = NULL;
            }
        memcpy(tl_err, why, sizeof why);
    }
    return r;
}

/* ---- ncclCommSplit ----------------------------------------------------
 * loom_comm_split over c's communicator: every rank of it calls, those of
 * one color get a communicator ordered by key (then rank), and
 * NCCL_SPLIT_NOCOLOR ranks get NULL.  Inside a group it is refused before
 * any communication (on every rank alike, so no rank waits for another):
 * NCCL defers it to ncclGroupEnd, and Loom's split cannot be queued in
 * Loom's group, which holds the group's other calls. */
static ncclResult_t comm_split(struct ncclComm *c, int color, int key, ncclComm_t *newcomm,
                               const char *transport)
{
    static const char fn[] = "ncclCommSplit";
    if (lnccl_tl_depth > 0)
        return lnccl_fail(ncclInvalidUsage,
                          "%s (color %d): not inside ncclGroupStart/ncclGroupEnd here (see "
                          "loom-nccl(7)); call it outside the group",
                          fn, color);
    loom_config_t cfg;
    loom_config_init(&cfg);
    if (transport[0]) cfg.transport = transport;
    loom_comm_t lc = NULL;
    atomic_fetch_add(&c->inflight, 1);
    loom_result_t lr = loom_comm_split(c->lc, color == NCCL_SPLIT_NOCOLOR ? LOOM_SPLIT_NOCOLOR
                                                                          : color,
                                       key, transport[0] ? &cfg : NULL, &lc);
    atomic_fetch_sub(&c->inflight, 1);
    if (lr != LOOM_SUCCESS) return lnccl_from_loom(lr, fn, c);
    if (!lc) return ncclSuccess; /* NCCL_SPLIT_NOCOLOR */
    int rank = 0, nranks = 0;
    loom_comm_rank(lc, &rank);
    loom_comm_size(lc, &nranks);
    struct ncclComm *n = comm_new(nranks, rank);
    if (!n) {
        loom_comm_destroy(lc);
        return lnccl_fail(ncclSystemError, "%s: out of memory", fn);
    }
    n->lc = lc;
    n->cudev = c->cudev;
    memcpy(n->transport, transport[0] ? transport : c->transport, sizeof n->transport);
    lnccl_info("comm %p rank %d nranks %d - Split COMPLETE (color %d, key %d)", (void *)n, rank,
               nranks, color, key);
    *newcomm = n;
    return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config)
{
    static const char fn[] = "ncclCommSplit";
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = lnccl_comm_ready(comm, fn, &r);
    if (!c) return lnccl_group_note(r);
    if (!newcomm)
        return lnccl_group_note(lnccl_fail(ncclInvalidArgument, "%s: newcomm is NULL", fn));
    *newcomm = NULL;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return lnccl_group_note(lnccl_fail(ncclInvalidArgument,
                                           "%s: color %d is negative and not NCCL_SPLIT_NOCOLOR",
                                           fn, color));
    char transport[16];
    r = read_config(config, fn, transport, sizeof transport);
    if (r != ncclSuccess) return lnccl_group_note(r);
    return lnccl_group_note(comm_split(c, color, key, newcomm, transport));
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = lnccl_comm_ready(comm, "ncclCommFinalize", &r);
    if (!c) return r;
    /* Every call completed before it returned: nothing is left to flush. */
    c->finalized = 1;
    return ncclSuccess;
}

/* Loom cannot stop a call under way in another thread: destroying or
 * aborting its communicator meanwhile would pull it from under it. */
static ncclResult_t not_busy(struct ncclComm *c, const char *fn)
{
    int n = atomic_load(&c->inflight);
    if (n == 0) return ncclSuccess;
    return lnccl_fail(ncclInvalidUsage,
                      "%s: %d call(s) on comm %p are under way in another thread or queued in an "
                      "open group; Loom cannot interrupt them (they end when a peer fails or their "
                      "deadline, LOOM_TIMEOUT, passes): call %s after they return",
                      fn, n, (void *)c, fn);
}

static void *destroy_thread(void *arg)
{
    loom_comm_destroy(*(loom_comm_t *)arg);
    return NULL;
}

/* c leaves its siblings; the last one out destroys them all at once.
 * Returns 1 when c's Loom communicator is taken care of. */
static int sibling_leave(struct ncclComm *c, int abort)
{
    struct siblings *sib = c->sib;
    if (!sib) return 0;
    pthread_mutex_lock(&live_mu);
    if (abort)
        loom_comm_abort(c->lc);
    else
        sib->lcs[sib->nlcs++] = c->lc;
    int last = --sib->left == 0;
    pthread_mutex_unlock(&live_mu);
    c->lc = NULL;
    if (!last) return 1;
    pthread_t *th = calloc((size_t)sib->nlcs, sizeof *th);
    int *started = calloc((size_t)sib->nlcs, sizeof *started);
    for (int i = 0; i < sib->nlcs; i++) {
        if (th && started)
            started[i] = pthread_create(&th[i], NULL, destroy_thread, &sib->lcs[i]) == 0;
        if (!started || !started[i]) loom_comm_destroy(sib->lcs[i]);
    }
    for (int i = 0; i < sib->nlcs; i++)
        if (started && started[i]) pthread_join(th[i], NULL);
    free(th);
    free(started);
    free(sib->lcs);
    free(sib);
    return 1;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    ncclResult_t r = ncclSuccess;
    if (!comm) return ncclSuccess; /* as NCCL: destroying NULL is allowed */
    struct ncclComm *c = lnccl_comm_get(comm, "ncclCommDestroy", &r);
    if (!c) return r;
    if (c->pending)
        return lnccl_fail(ncclInvalidUsage,
                          "ncclCommDestroy: comm %p is still being created (close its group first)",
                          (void *)comm);
    r = not_busy(c, "ncclCommDestroy");
    if (r != ncclSuccess) return r;
    if (c->lc && !sibling_leave(c, 0))
        r = lnccl_from_loom(loom_comm_destroy(c->lc), "ncclCommDestroy", NULL);
    comm_free(c);
    return r;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    ncclResult_t r = ncclSuccess;
    if (!comm) return ncclSuccess;
    struct ncclComm *c = lnccl_comm_get(comm, "ncclCommAbort", &r);
    if (!c) return r;
    if (c->pending)
        return lnccl_fail(ncclInvalidUsage,
                          "ncclCommAbort: comm %p is still being created (close its group first)",
                          (void *)comm);
    r = not_busy(c, "ncclCommAbort");
    if (r != ncclSuccess) return r;
    /* Loom's abort waits for no peer. */
    if (c->lc && !sibling_leave(c, 1))
        r = lnccl_from_loom(loom_comm_abort(c->lc), "ncclCommAbort", NULL);
    comm_free(c);
    return r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    static const char fn[] = "ncclCommGetAsyncError";
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = lnccl_comm_get(comm, fn, &r);
    if (!c) return r;
    if (!asyncError) return lnccl_fail(ncclInvalidArgument, "%s: asyncError is NULL", fn);
    if (c->pending) {
        *asyncError = ncclInProgress;
        return ncclSuccess;
    }
    if (!c->lc) {
        *asyncError = c->init_result;
        return ncclSuccess;
    }
    int failed = -1;
    loom_result_t lr = loom_comm_get_error(c->lc, &failed);
    if (lr != LOOM_SUCCESS) {
        *asyncError = lnccl_result(lr);
        if (failed >= 0)
            lnccl_fail(*asyncError, "%s: comm %p is broken: rank %d failed (%s)", fn, (void *)comm,
                       failed, loom_strerror(lr));
        else
            lnccl_fail(*asyncError, "%s: comm %p is broken (%s)", fn, (void *)comm,
                       loom_strerror(lr));
        return ncclSuccess;
    }
    pthread_mutex_lock(&c->mu);
    *asyncError = c->async;
    pthread_mutex_unlock(&c->mu);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = lnccl_comm_get(comm, "ncclCommCount", &r);
    if (!c) return r;
    if (!count) return lnccl_fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
    *count = c->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = lnccl_comm_get(comm, "ncclCommUserRank", &r);
    if (!c) return r;
    if (!rank) return lnccl_fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    *rank = c->rank;
    return ncclSuccess;
}

/* Host memory: the device given to ncclCommInitAll, else 0. */
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = lnccl_comm_get(comm, "ncclCommCuDevice", &r);
    if (!c) return r;
    if (!device) return lnccl_fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    *device = c->cudev;
    return ncclSuccess;
}

/* The pnccl* names of this file's calls (PNCCL: internal.h). */
PNCCL(ncclGetVersion);
PNCCL(ncclGetUniqueId);
PNCCL(ncclCommInitRankConfig);
PNCCL(ncclCommInitRank);
PNCCL(ncclCommInitAll);
PNCCL(ncclCommFinalize);
PNCCL(ncclCommDestroy);
PNCCL(ncclCommAbort);
PNCCL(ncclCommSplit);
PNCCL(ncclGetErrorString);
PNCCL(ncclGetLastError);
PNCCL(ncclCommGetAsyncError);
PNCCL(ncclCommCount);
PNCCL(ncclCommCuDevice);
PNCCL(ncclCommUserRank);
PNCCL(ncclGroupStart);
PNCCL(ncclGroupEnd);
