/*
 * nccl.c - NCCL's API on top of Loom's public interface (loom.h only).
 *
 * The model, documented in loom-nccl(7):
 *  - buffers are host memory and the stream must be NULL: a call
 *    outside a group completes before it returns; between
 *    ncclGroupStart and ncclGroupEnd calls are queued (Loom's group) and
 *    the outermost ncclGroupEnd runs them all and returns when they are
 *    complete.  Nothing is ever left running, so ncclInProgress is never
 *    returned, even on a communicator configured non-blocking.
 *  - communicators initialised inside a group are created at the
 *    outermost ncclGroupEnd, each on a thread of its own (so one thread
 *    can create several ranks of one job: ncclCommInitAll).
 *  - device buffers are refused where CUDA's driver can tell them
 *    (libcuda.so.1 loaded at run time; see host_only);
 *  - what cannot be honoured here returns ncclInvalidUsage; every
 *    failure leaves its reason for ncclGetLastError and prints it under
 *    NCCL_DEBUG=WARN (or INFO, TRACE).
 */
#include <dlfcn.h>
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

#include "nccl/map.h"

#define COMM_MAGIC 0x6c6e63636c636f6dULL /* "lncclcom" */
/* Dynamic ops live in [ncclNumOps, ncclNumOps + MAX_REDOPS). */
#define MAX_REDOPS 65536

struct redop {
    int used;
    int dtype;
    unsigned char scalar[8];
};

/* Communicators created by one ncclGroupEnd on one thread (all the
 * ranks of ncclCommInitAll): Loom's destroy waits (bounded) for the
 * peers' goodbye, so destroying them one after another on one thread
 * would wait for each; they are destroyed together, in parallel, when
 * the last of them is. */
struct siblings {
    int n, left;
    loom_comm_t *lcs; /* those destroyed so far, waiting for the rest */
    int nlcs;
};

struct ncclComm {
    uint64_t magic;
    struct siblings *sib;
    loom_comm_t lc;      /* NULL while the init waits for ncclGroupEnd */
    int nranks, rank, cudev;
    int pending;         /* created at the outermost ncclGroupEnd */
    atomic_int inflight; /* calls under way, or queued in an open group */
    int finalized;
    ncclResult_t init_result; /* of a deferred init */
    ncclUniqueId id;
    char transport[16];  /* from ncclConfig_t.netName; "" for Loom's choice */
    pthread_mutex_t mu;  /* ops, async */
    ncclResult_t async;  /* first error that broke it, seen here */
    struct redop *ops;
    int nops;
};

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

static void info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void info(const char *fmt, ...)
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
static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
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
static ncclResult_t from_loom(loom_result_t r, const char *fn, struct ncclComm *c)
{
    if (r == LOOM_SUCCESS) return ncclSuccess;
    ncclResult_t n = lnccl_result(r);
    const char *m = loom_get_last_error();
    fail(n, "%s: %s (loom: %s)", fn, m && *m ? m : loom_strerror(r), loom_strerror(r));
    mark_async(c, n);
    return n;
}

/* ncclInvalidUsage when CUDA's driver says p is device memory. */
static ncclResult_t host_only(const char *fn, const char *what, const void *p);

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
static struct ncclComm *comm_get(ncclComm_t comm, const char *fn, ncclResult_t *r)
{
    struct ncclComm *found = NULL;
    if (!comm) {
        *r = fail(ncclInvalidArgument, "%s: comm is NULL", fn);
        return NULL;
    }
    pthread_mutex_lock(&live_mu);
    for (size_t i = 0; i < nlive; i++)
        if (live[i] == comm) found = comm;
    pthread_mutex_unlock(&live_mu);
    if (!found || found->magic != COMM_MAGIC)
        *r = fail(ncclInvalidArgument,
                  "%s: comm %p is not a communicator (destroyed, aborted or never made)",
                  fn, (void *)comm);
    return found;
}

/* A communicator ready for operations. */
static struct ncclComm *comm_ready(ncclComm_t comm, const char *fn, ncclResult_t *r)
{
    struct ncclComm *c = comm_get(comm, fn, r);
    if (!c) return NULL;
    if (c->pending) {
        *r = fail(ncclInvalidUsage,
                  "%s: comm %p is still being created: it exists after the ncclGroupEnd "
                  "that closes the group of its ncclCommInitRank",
                  fn, (void *)comm);
        return NULL;
    }
    if (!c->lc) {
        *r = fail(ncclInvalidUsage, "%s: comm %p failed to initialise (%s); destroy it", fn,
                  (void *)comm, lnccl_result_string(c->init_result));
        return NULL;
    }
    if (c->finalized) {
        *r = fail(ncclInvalidUsage, "%s: comm %p was finalized (ncclCommFinalize)", fn,
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
static _Thread_local int tl_depth;
static _Thread_local int tl_loom_open;
static _Thread_local struct ncclComm **tl_pending;
static _Thread_local int tl_npending, tl_cappending;
static _Thread_local void **tl_tmp;
static _Thread_local int tl_ntmp, tl_captmp;
static _Thread_local ncclResult_t tl_group_err;
static _Thread_local struct ncclComm **tl_queued; /* one entry per queued call */
static _Thread_local int tl_nqueued, tl_capqueued;

static int push_ptr(void ***arr, int *n, int *cap, void *p)
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
static ncclResult_t group_note(ncclResult_t r)
{
    if (r != ncclSuccess && r != ncclInProgress && tl_depth > 0 && tl_group_err == ncclSuccess)
        tl_group_err = r;
    return r;
}

/* Inside an NCCL group Loom's group is open, so that Loom queues the
 * blocking calls that follow. */
static ncclResult_t enter_op(const char *fn)
{
    if (tl_depth > 0 && !tl_loom_open) {
        loom_result_t r = loom_group_start();
        if (r != LOOM_SUCCESS) return from_loom(r, fn, NULL);
        tl_loom_open = 1;
    }
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void)
{
    if (tl_depth == 0) tl_group_err = ncclSuccess;
    tl_depth++;
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
    if (tl_depth == 0)
        return fail(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart to close");
    if (--tl_depth > 0) return ncclSuccess;

    ncclResult_t res = tl_group_err;
    /* Communicators first, each on its own thread (their ranks may all
     * be in this process), while this thread runs the queued calls. */
    int n = tl_npending;
    struct init_job *jobs = n ? calloc((size_t)n, sizeof *jobs) : NULL;
    if (n && !jobs) {
        res = fail(ncclSystemError, "ncclGroupEnd: out of memory for %d communicators", n);
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
        ncclResult_t r = from_loom(loom_group_end(), "ncclGroupEnd", NULL);
        if (res == ncclSuccess) res = r;
    }
    for (int i = 0; i < tl_nqueued; i++) atomic_fetch_sub(&tl_queued[i]->inflight, 1);
    tl_nqueued = 0;
    for (int i = 0; i < n; i++) {
        if (jobs[i].started) pthread_join(jobs[i].th, NULL);
        struct ncclComm *c = jobs[i].c;
        c->pending = 0;
        if (jobs[i].r != LOOM_SUCCESS) {
            c->init_result = lnccl_result(jobs[i].r);
            ncclResult_t r = fail(c->init_result, "ncclCommInitRank (rank %d of %d, in a group): %s",
                                  c->rank, c->nranks, jobs[i].err);
            if (res == ncclSuccess) res = r;
        } else {
            info("comm %p rank %d nranks %d - Init COMPLETE", (void *)c, c->rank, c->nranks);
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
    for (int i = 0; i < tl_ntmp; i++) free(tl_tmp[i]);
    tl_ntmp = 0;
    tl_group_err = ncclSuccess;
    return res;
}

/* ------------------------------------------------------------- lifecycle */

ncclResult_t ncclGetVersion(int *version)
{
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
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
    if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    loom_unique_id_t id;
    loom_result_t r = loom_get_unique_id(&id);
    if (r != LOOM_SUCCESS) return from_loom(r, "ncclGetUniqueId", NULL);
    _Static_assert(sizeof id.internal == sizeof uniqueId->internal, "id sizes");
    memcpy(uniqueId->internal, id.internal, sizeof id.internal);
    return ncclSuccess;
}

static void version_line(void)
{
    int ma = 0, mi = 0, pa = 0;
    loom_get_version(&ma, &mi, &pa);
    char msg[128];
    snprintf(msg, sizeof msg, "NCCL version %d.%d.%d+loom%d.%d.%d (host memory)", NCCL_MAJOR,
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
        return fail(c->init_result, "%s (rank %d of %d): %s", fn, c->rank, c->nranks, j.err);
    }
    info("comm %p rank %d nranks %d - Init COMPLETE", (void *)c, c->rank, c->nranks);
    return ncclSuccess;
}

/* The size-bounded prefix of an ncclConfig_t the caller knows. */
static ncclResult_t read_config(const ncclConfig_t *config, const char *fn, char *transport,
                                size_t tsize)
{
    transport[0] = '\0';
    if (!config) return ncclSuccess;
    if (config->size < offsetof(ncclConfig_t, blocking))
        return fail(ncclInvalidArgument,
                    "%s: config was not initialised with NCCL_CONFIG_INITIALIZER (size %zu)", fn,
                    config->size);
    if (config->magic != 0xcafebeef)
        return fail(ncclInvalidArgument,
                    "%s: config was not initialised with NCCL_CONFIG_INITIALIZER (magic 0x%x)",
                    fn, config->magic);
#define HAS(m) (config->size >= offsetof(ncclConfig_t, m) + sizeof config->m)
    if (HAS(blocking) && config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 &&
        config->blocking != 1)
        return fail(ncclInvalidArgument, "%s: config->blocking is %d, not 0 or 1", fn,
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
            return fail(ncclInvalidArgument,
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
    if (!comm) return group_note(fail(ncclInvalidArgument, "%s: comm is NULL", fn));
    *comm = NULL;
    if (nranks < 1)
        return group_note(fail(ncclInvalidArgument, "%s: nranks %d is not positive", fn, nranks));
    if (rank < 0 || rank >= nranks)
        return group_note(
            fail(ncclInvalidArgument, "%s: rank %d is outside 0..%d", fn, rank, nranks - 1));
    char transport[16];
    ncclResult_t r = read_config(config, fn, transport, sizeof transport);
    if (r != ncclSuccess) return group_note(r);
    struct ncclComm *c = comm_new(nranks, rank);
    if (!c) return group_note(fail(ncclSystemError, "%s: out of memory", fn));
    c->id = commId;
    memcpy(c->transport, transport, sizeof c->transport);
    if (tl_depth > 0) {
        if (push_ptr((void ***)&tl_pending, &tl_npending, &tl_cappending, c) != 0) {
            comm_free(c);
            return group_note(fail(ncclSystemError, "%s: out of memory", fn));
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
    if (!comms) return fail(ncclInvalidArgument, "%s: comms is NULL", fn);
    if (ndev < 1) return fail(ncclInvalidArgument, "%s: ndev %d is not positive", fn, ndev);
    if (tl_depth > 0)
        return fail(ncclInvalidUsage, "%s: not allowed inside ncclGroupStart/ncclGroupEnd", fn);
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
    if (tl_depth > 0)
        return fail(ncclInvalidUsage,
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
    if (lr != LOOM_SUCCESS) return from_loom(lr, fn, c);
    if (!lc) return ncclSuccess; /* NCCL_SPLIT_NOCOLOR */
    int rank = 0, nranks = 0;
    loom_comm_rank(lc, &rank);
    loom_comm_size(lc, &nranks);
    struct ncclComm *n = comm_new(nranks, rank);
    if (!n) {
        loom_comm_destroy(lc);
        return fail(ncclSystemError, "%s: out of memory", fn);
    }
    n->lc = lc;
    n->cudev = c->cudev;
    memcpy(n->transport, transport[0] ? transport : c->transport, sizeof n->transport);
    info("comm %p rank %d nranks %d - Split COMPLETE (color %d, key %d)", (void *)n, rank, nranks,
         color, key);
    *newcomm = n;
    return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config)
{
    static const char fn[] = "ncclCommSplit";
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = comm_ready(comm, fn, &r);
    if (!c) return group_note(r);
    if (!newcomm) return group_note(fail(ncclInvalidArgument, "%s: newcomm is NULL", fn));
    *newcomm = NULL;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return group_note(fail(ncclInvalidArgument,
                               "%s: color %d is negative and not NCCL_SPLIT_NOCOLOR", fn, color));
    char transport[16];
    r = read_config(config, fn, transport, sizeof transport);
    if (r != ncclSuccess) return group_note(r);
    return group_note(comm_split(c, color, key, newcomm, transport));
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = comm_ready(comm, "ncclCommFinalize", &r);
    if (!c) return r;
    /* Every call completed before it returned: nothing is left to flush. */
    c->finalized = 1;
    return ncclSuccess;
}

static ncclResult_t not_busy(struct ncclComm *c, const char *fn);

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
    struct ncclComm *c = comm_get(comm, "ncclCommDestroy", &r);
    if (!c) return r;
    if (c->pending)
        return fail(ncclInvalidUsage,
                    "ncclCommDestroy: comm %p is still being created (close its group first)",
                    (void *)comm);
    r = not_busy(c, "ncclCommDestroy");
    if (r != ncclSuccess) return r;
    if (c->lc && !sibling_leave(c, 0))
        r = from_loom(loom_comm_destroy(c->lc), "ncclCommDestroy", NULL);
    comm_free(c);
    return r;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    ncclResult_t r = ncclSuccess;
    if (!comm) return ncclSuccess;
    struct ncclComm *c = comm_get(comm, "ncclCommAbort", &r);
    if (!c) return r;
    if (c->pending)
        return fail(ncclInvalidUsage,
                    "ncclCommAbort: comm %p is still being created (close its group first)",
                    (void *)comm);
    r = not_busy(c, "ncclCommAbort");
    if (r != ncclSuccess) return r;
    /* Loom's abort waits for no peer. */
    if (c->lc && !sibling_leave(c, 1))
        r = from_loom(loom_comm_abort(c->lc), "ncclCommAbort", NULL);
    comm_free(c);
    return r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    static const char fn[] = "ncclCommGetAsyncError";
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = comm_get(comm, fn, &r);
    if (!c) return r;
    if (!asyncError) return fail(ncclInvalidArgument, "%s: asyncError is NULL", fn);
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
            fail(*asyncError, "%s: comm %p is broken: rank %d failed (%s)", fn, (void *)comm,
                 failed, loom_strerror(lr));
        else
            fail(*asyncError, "%s: comm %p is broken (%s)", fn, (void *)comm, loom_strerror(lr));
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
    struct ncclComm *c = comm_get(comm, "ncclCommCount", &r);
    if (!c) return r;
    if (!count) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
    *count = c->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = comm_get(comm, "ncclCommUserRank", &r);
    if (!c) return r;
    if (!rank) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    *rank = c->rank;
    return ncclSuccess;
}

/* Host memory: the device given to ncclCommInitAll, else 0. */
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = comm_get(comm, "ncclCommCuDevice", &r);
    if (!c) return r;
    if (!device) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    *device = c->cudev;
    return ncclSuccess;
}

/* ---------------------------------------------------------------- memory */

/* Host memory on this build (page-aligned); NCCL gives device memory. */
ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    if (!ptr) return fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    *ptr = NULL;
    if (size == 0) return fail(ncclInvalidArgument, "ncclMemAlloc: size is 0");
    void *p = NULL;
    int e = posix_memalign(&p, 4096, size);
    if (e != 0)
        return fail(ncclSystemError, "ncclMemAlloc: %zu bytes: %s", size, strerror(e));
    *ptr = p;
    return ncclSuccess;
}

ncclResult_t ncclMemFree(void *ptr)
{
    free(ptr);
    return ncclSuccess;
}

ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    static const char fn[] = "ncclCommRegister";
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = comm_ready(comm, fn, &r);
    if (!c) return r;
    if (!handle) return fail(ncclInvalidArgument, "%s: handle is NULL", fn);
    *handle = NULL;
    r = host_only(fn, "buff", buff);
    if (r != ncclSuccess) return r;
    loom_mem_t h = NULL;
    r = from_loom(loom_mem_register(c->lc, buff, size, &h), fn, NULL);
    if (r == ncclSuccess) *handle = h;
    return r;
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
    static const char fn[] = "ncclCommDeregister";
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = comm_ready(comm, fn, &r);
    if (!c) return r;
    return from_loom(loom_mem_deregister(c->lc, (loom_mem_t)handle), fn, NULL);
}

/* ------------------------------------------------------------ reduce ops */

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm)
{
    static const char fn[] = "ncclRedOpCreatePreMulSum";
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = comm_ready(comm, fn, &r);
    if (!c) return r;
    if (!op) return fail(ncclInvalidArgument, "%s: op is NULL", fn);
    size_t sz = lnccl_dtype_size((int)datatype);
    if (!sz)
        return fail(ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t", fn,
                    (int)datatype);
    if (residence == ncclScalarDevice)
        return fail(ncclInvalidUsage,
                    "%s: a device-resident scalar (ncclScalarDevice) cannot be read on this "
                    "host-memory build; pass ncclScalarHostImmediate",
                    fn);
    if (residence != ncclScalarHostImmediate)
        return fail(ncclInvalidArgument, "%s: residence %d is not an ncclScalarResidence_t", fn,
                    (int)residence);
    if (!scalar) return fail(ncclInvalidArgument, "%s: scalar is NULL", fn);
    r = host_only(fn, "scalar (ncclScalarHostImmediate)", scalar);
    if (r != ncclSuccess) return r;
    pthread_mutex_lock(&c->mu);
    int slot = -1;
    for (int i = 0; i < c->nops; i++)
        if (!c->ops[i].used) {
            slot = i;
            break;
        }
    if (slot < 0) {
        if (c->nops >= MAX_REDOPS) {
            pthread_mutex_unlock(&c->mu);
            return fail(ncclInvalidUsage, "%s: %d ops exist on comm %p; destroy some first", fn,
                        c->nops, (void *)comm);
        }
        struct redop *p = realloc(c->ops, (size_t)(c->nops + 1) * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&c->mu);
            return fail(ncclSystemError, "%s: out of memory", fn);
        }
        c->ops = p;
        slot = c->nops++;
    }
    c->ops[slot].used = 1;
    c->ops[slot].dtype = (int)datatype;
    memset(c->ops[slot].scalar, 0, sizeof c->ops[slot].scalar);
    memcpy(c->ops[slot].scalar, scalar, sz);
    pthread_mutex_unlock(&c->mu);
    *op = (ncclRedOp_t)(ncclNumOps + slot);
    return ncclSuccess;
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    static const char fn[] = "ncclRedOpDestroy";
    ncclResult_t r = ncclSuccess;
    struct ncclComm *c = comm_get(comm, fn, &r);
    if (!c) return r;
    if ((int)op >= 0 && (int)op < ncclNumOps)
        return fail(ncclInvalidArgument, "%s: op %d is built in", fn, (int)op);
    long slot = (long)op - ncclNumOps;
    pthread_mutex_lock(&c->mu);
    int ok = slot >= 0 && slot < c->nops && c->ops[slot].used;
    if (ok) c->ops[slot].used = 0;
    pthread_mutex_unlock(&c->mu);
    if (!ok)
        return fail(ncclInvalidArgument, "%s: op %d was not made by ncclRedOpCreatePreMulSum on "
                    "comm %p (or is destroyed)", fn, (int)op, (void *)comm);
    return ncclSuccess;
}

/* -------------------------------------------------------- device memory */

/* Built without CUDA, a device pointer can still be recognised where
 * CUDA's driver is installed: libcuda.so.1 is loaded at run time and
 * asked what each buffer is.  No driver: every buffer is host memory (a
 * process without the driver has no device memory).  A driver not yet
 * initialised answers with an error: nothing in this process is device
 * memory yet, so the buffer is host memory too.  Managed memory is
 * host-accessible and accepted.  The values are those of cuda.h. */
enum {
    CU_ATTR_MEMORY_TYPE = 2,
    CU_ATTR_IS_MANAGED = 8,
    CU_MEMTYPE_DEVICE = 2
};
typedef int (*cu_attr_fn)(void *data, int attribute, unsigned long long ptr);
static cu_attr_fn cu_attr;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        info("no CUDA driver (libcuda.so.1): buffers are host memory");
        return;
    }
    *(void **)&cu_attr = dlsym(h, "cuPointerGetAttribute");
    info("CUDA driver found: device buffers are refused");
}

static ncclResult_t host_only(const char *fn, const char *what, const void *p)
{
    pthread_once(&cu_once, cu_load);
    if (!cu_attr || !p) return ncclSuccess;
    unsigned int type = 0, managed = 0;
    unsigned long long a = (unsigned long long)(uintptr_t)p;
    if (cu_attr(&type, CU_ATTR_MEMORY_TYPE, a) != 0 || type != CU_MEMTYPE_DEVICE)
        return ncclSuccess;
    if (cu_attr(&managed, CU_ATTR_IS_MANAGED, a) == 0 && managed) return ncclSuccess;
    return fail(ncclInvalidUsage,
                "%s: %s %p is CUDA device memory; this libnccl (Loom) is built for host "
                "memory only: pass host buffers (or managed memory)",
                fn, what, p);
}

static ncclResult_t host_bufs(const char *fn, const void *send, const void *recv)
{
    ncclResult_t r = host_only(fn, "sendbuff", send);
    return r == ncclSuccess && recv != send ? host_only(fn, "recvbuff", recv) : r;
}

/* ----------------------------------------------------------- operations */

struct call {
    struct ncclComm *c;
    loom_datatype_t dt;
    loom_op_t op;
    int premul;                  /* scale the input by scalar first */
    unsigned char scalar[8];
};

/* The checks every operation makes: comm, stream, datatype, op (op < 0:
 * the call takes none). */
static ncclResult_t prepare(struct call *k, const char *fn, ncclComm_t comm, cudaStream_t stream,
                            ncclDataType_t datatype, long op)
{
    ncclResult_t r = ncclSuccess;
    memset(k, 0, sizeof *k);
    k->c = comm_ready(comm, fn, &r);
    if (!k->c) return r;
    if (stream)
        return fail(ncclInvalidUsage,
                    "%s: stream %p: this libnccl (Loom, host memory) completes each call before "
                    "it returns and cannot order work on a CUDA stream; pass a NULL stream",
                    fn, (void *)stream);
    if (lnccl_dtype((int)datatype, &k->dt) != 0)
        return fail(ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t (0..%d)", fn,
                    (int)datatype, ncclNumTypes - 1);
    if (op < 0) return ncclSuccess;
    if (lnccl_op((int)op, &k->op) == 0) return ncclSuccess;
    long slot = op - ncclNumOps;
    pthread_mutex_lock(&k->c->mu);
    int ok = slot >= 0 && slot < k->c->nops && k->c->ops[slot].used;
    int odt = ok ? k->c->ops[slot].dtype : -1;
    if (ok) memcpy(k->scalar, k->c->ops[slot].scalar, sizeof k->scalar);
    pthread_mutex_unlock(&k->c->mu);
    if (!ok)
        return fail(ncclInvalidArgument,
                    "%s: op %ld is neither built in (0..%d) nor made by "
                    "ncclRedOpCreatePreMulSum on comm %p",
                    fn, op, ncclNumOps - 1, (void *)comm);
    if (odt != (int)datatype)
        return fail(ncclInvalidArgument,
                    "%s: op %ld was made for datatype %d, the call passes datatype %d", fn, op,
                    odt, (int)datatype);
    k->premul = 1;
    k->op = LOOM_SUM;
    return ncclSuccess;
}

/* For PreMulSum: a scaled copy of count elements of src, freed by done()
 * (after the group when inside one).  *out NULL when src is NULL or
 * count 0: Loom then checks the arguments as given. */
static ncclResult_t scaled_input(struct call *k, const char *fn, const void *src, size_t count,
                                 const void **out)
{
    *out = src;
    if (!k->premul || !src || count == 0) return ncclSuccess;
    size_t esz = loom_datatype_size(k->dt);
    if (count > SIZE_MAX / esz)
        return fail(ncclInvalidArgument, "%s: count %zu overflows the address space", fn, count);
    void *tmp = malloc(count * esz);
    if (!tmp) return fail(ncclSystemError, "%s: out of memory for %zu bytes", fn, count * esz);
    lnccl_scale(tmp, src, count, (int)k->dt, k->scalar);
    if (tl_depth > 0) {
        if (push_ptr(&tl_tmp, &tl_ntmp, &tl_captmp, tmp) != 0) {
            free(tmp);
            return fail(ncclSystemError, "%s: out of memory", fn);
        }
    }
    *out = tmp;
    return ncclSuccess;
}

/* The call is under way on k->c (ncclCommAbort and ncclCommDestroy
 * refuse it meanwhile): until done() outside a group, until the
 * outermost ncclGroupEnd inside one. */
static void begin(struct call *k)
{
    atomic_fetch_add(&k->c->inflight, 1);
    if (tl_depth > 0 &&
        push_ptr((void ***)&tl_queued, &tl_nqueued, &tl_capqueued, k->c) != 0)
        atomic_fetch_sub(&k->c->inflight, 1); /* no room: not counted */
}

static ncclResult_t done(struct call *k, const char *fn, loom_result_t lr, const void *scaled,
                         const void *orig)
{
    if (scaled != orig && tl_depth == 0) free((void *)scaled);
    ncclResult_t r = group_note(from_loom(lr, fn, k->c));
    if (tl_depth == 0) atomic_fetch_sub(&k->c->inflight, 1); /* k->c is not read after */
    return r;
}

/* Loom cannot stop a call under way in another thread: destroying or
 * aborting its communicator meanwhile would pull it from under it. */
static ncclResult_t not_busy(struct ncclComm *c, const char *fn)
{
    int n = atomic_load(&c->inflight);
    if (n == 0) return ncclSuccess;
    return fail(ncclInvalidUsage,
                "%s: %d call(s) on comm %p are under way in another thread or queued in an "
                "open group; Loom cannot interrupt them (they end when a peer fails or their "
                "deadline, LOOM_TIMEOUT, passes): call %s after they return",
                fn, n, (void *)c, fn);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    static const char fn[] = "ncclAllReduce";
    struct call k;
    const void *in;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, (long)op);
    if (r == ncclSuccess) r = host_bufs(fn, sendbuff, recvbuff);
    if (r == ncclSuccess) r = enter_op(fn);
    if (r == ncclSuccess) r = scaled_input(&k, fn, sendbuff, count, &in);
    if (r != ncclSuccess) return group_note(r);
    begin(&k);
    return done(&k, fn, loom_allreduce(in, recvbuff, count, k.dt, k.op, k.c->lc), in, sendbuff);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream)
{
    static const char fn[] = "ncclReduce";
    struct call k;
    const void *in;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, (long)op);
    if (r == ncclSuccess) r = host_bufs(fn, sendbuff, recvbuff);
    if (r == ncclSuccess) r = enter_op(fn);
    if (r == ncclSuccess) r = scaled_input(&k, fn, sendbuff, count, &in);
    if (r != ncclSuccess) return group_note(r);
    begin(&k);
    return done(&k, fn, loom_reduce(in, recvbuff, count, k.dt, k.op, root, k.c->lc), in,
                sendbuff);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    static const char fn[] = "ncclReduceScatter";
    struct call k;
    const void *in = sendbuff;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, (long)op);
    if (r == ncclSuccess) r = host_bufs(fn, sendbuff, recvbuff);
    if (r == ncclSuccess) r = enter_op(fn);
    if (r == ncclSuccess && k.premul) {
        if (recvcount > SIZE_MAX / (size_t)k.c->nranks)
            r = fail(ncclInvalidArgument, "%s: recvcount %zu times %d ranks overflows", fn,
                     recvcount, k.c->nranks);
        else
            r = scaled_input(&k, fn, sendbuff, recvcount * (size_t)k.c->nranks, &in);
    }
    if (r != ncclSuccess) return group_note(r);
    begin(&k);
    return done(&k, fn, loom_reduce_scatter(in, recvbuff, recvcount, k.dt, k.op, k.c->lc), in,
                sendbuff);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclBroadcast";
    struct call k;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, -1);
    if (r == ncclSuccess) r = host_bufs(fn, sendbuff, recvbuff);
    if (r == ncclSuccess) r = enter_op(fn);
    if (r != ncclSuccess) return group_note(r);
    begin(&k);
    return done(&k, fn, loom_broadcast(sendbuff, recvbuff, count, k.dt, root, k.c->lc), NULL,
                NULL);
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclBcast";
    struct call k;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, -1);
    if (r == ncclSuccess) r = host_bufs(fn, buff, buff);
    if (r == ncclSuccess) r = enter_op(fn);
    if (r != ncclSuccess) return group_note(r);
    begin(&k);
    return done(&k, fn, loom_broadcast(buff, buff, count, k.dt, root, k.c->lc), NULL, NULL);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclAllGather";
    struct call k;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, -1);
    if (r == ncclSuccess) r = host_bufs(fn, sendbuff, recvbuff);
    if (r == ncclSuccess) r = enter_op(fn);
    if (r != ncclSuccess) return group_note(r);
    begin(&k);
    return done(&k, fn, loom_allgather(sendbuff, recvbuff, sendcount, k.dt, k.c->lc), NULL, NULL);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclSend";
    struct call k;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, -1);
    if (r == ncclSuccess) r = host_bufs(fn, sendbuff, NULL);
    if (r == ncclSuccess) r = enter_op(fn);
    if (r != ncclSuccess) return group_note(r);
    begin(&k);
    return done(&k, fn, loom_send(sendbuff, count, k.dt, peer, k.c->lc), NULL, NULL);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    static const char fn[] = "ncclRecv";
    struct call k;
    ncclResult_t r = prepare(&k, fn, comm, stream, datatype, -1);
    if (r == ncclSuccess) r = host_bufs(fn, NULL, recvbuff);
    if (r == ncclSuccess) r = enter_op(fn);
    if (r != ncclSuccess) return group_note(r);
    begin(&k);
    return done(&k, fn, loom_recv(recvbuff, count, k.dt, peer, k.c->lc), NULL, NULL);
}

/* NCCL exports every call a second time as pnccl* (for profilers). */
#define PNCCL(f) extern __typeof__(f) p##f __attribute__((alias(#f)))
PNCCL(ncclMemAlloc);
PNCCL(ncclMemFree);
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
PNCCL(ncclCommRegister);
PNCCL(ncclCommDeregister);
PNCCL(ncclRedOpCreatePreMulSum);
PNCCL(ncclRedOpDestroy);
PNCCL(ncclReduce);
PNCCL(ncclBcast);
PNCCL(ncclBroadcast);
PNCCL(ncclAllReduce);
PNCCL(ncclReduceScatter);
PNCCL(ncclAllGather);
PNCCL(ncclSend);
PNCCL(ncclRecv);
PNCCL(ncclGroupStart);
PNCCL(ncclGroupEnd);
