/*
 * cuda_fake.c - a stand-in for CUDA's driver, libcuda.so.1, that keeps
 * "device memory" in host memory, for tests/gpu/test_devbuf.sh on
 * machines without a GPU.  cuMemAlloc hands out host memory that
 * cuPointerGetAttribute then calls device memory (once cuInit ran);
 * pinned host memory is plain host memory; the synchronous copies
 * memcpy, and insist that their device side is device memory.
 *
 * Streams are what lets the test see the order of a call's work:
 * cuMemcpyHtoDAsync does not copy, it queues the copy on its stream,
 * and only cuStreamSynchronize on that stream (NULL and
 * CU_STREAM_LEGACY are the same stream here) carries it out.  A reader
 * that does not synchronise the stream first reads the old bytes; a
 * synchronous copy that reads device bytes with such a copy still
 * queued is counted (fake_cuda_count("stale")).  The counts
 * (fake_cuda_count) are for the test to read through dlsym.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ALLOCS 256
#define MAX_STREAMS 8
#define MAX_QUEUED 256

static int initialised;
static struct { uintptr_t lo, hi; } dev[MAX_ALLOCS];
static int ndev;
static struct {
    int used;
    long syncs;
    int nq;
    struct { uintptr_t dst; void *src; size_t n; } q[MAX_QUEUED];
} streams[MAX_STREAMS]; /* [0]: the legacy default stream */
static long n_dtoh, n_htod, n_alloc_host, n_free_host, n_stale, n_bad, n_sync;

static int is_dev(uintptr_t p, size_t n)
{
    for (int i = 0; i < ndev; i++)
        if (p >= dev[i].lo && p + n <= dev[i].hi && p + n >= p) return 1;
    return 0;
}

static int stream_index(void *s)
{
    uintptr_t v = (uintptr_t)s;
    if (v <= 2) return 0; /* NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD */
    for (int i = 1; i < MAX_STREAMS; i++)
        if ((uintptr_t)&streams[i] == v && streams[i].used) return i;
    return -1;
}

long fake_cuda_count(const char *what)
{
    if (!strcmp(what, "dtoh")) return n_dtoh;
    if (!strcmp(what, "htod")) return n_htod;
    if (!strcmp(what, "alloc_host")) return n_alloc_host;
    if (!strcmp(what, "free_host")) return n_free_host;
    if (!strcmp(what, "stale")) return n_stale;
    if (!strcmp(what, "bad")) return n_bad;
    if (!strcmp(what, "sync")) return n_sync;
    return -1;
}

/* Synchronisations of stream s so far; queued copies on it now. */
long fake_cuda_syncs(void *s)
{
    int i = stream_index(s);
    return i < 0 ? -1 : streams[i].syncs;
}

int fake_cuda_queued(void *s)
{
    int i = stream_index(s);
    return i < 0 ? -1 : streams[i].nq;
}

int cuInit(unsigned flags)
{
    (void)flags;
    initialised = 1;
    return 0;
}

int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr)
{
    if (!initialised) return 3; /* CUDA_ERROR_NOT_INITIALIZED */
    if (!is_dev((uintptr_t)ptr, 1)) return 1; /* CUDA_ERROR_INVALID_VALUE */
    if (attribute == 2) { /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */
        *(unsigned int *)data = 2; /* CU_MEMORYTYPE_DEVICE */
        return 0;
    }
    if (attribute == 8) { /* CU_POINTER_ATTRIBUTE_IS_MANAGED */
        *(unsigned int *)data = 0;
        return 0;
    }
    return 1;
}

int cuMemAlloc_v2(unsigned long long *p, size_t n)
{
    if (!initialised) return 3;
    if (ndev == MAX_ALLOCS || !n) return 1;
    unsigned char *m = malloc(n);
    if (!m) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    memset(m, 0xA5, n);
    dev[ndev].lo = (uintptr_t)m;
    dev[ndev++].hi = (uintptr_t)m + n;
    *p = (uintptr_t)m;
    return 0;
}

int cuMemFree_v2(unsigned long long p)
{
    for (int i = 0; i < ndev; i++)
        if (dev[i].lo == p) {
            free((void *)(uintptr_t)p);
            dev[i] = dev[--ndev];
            return 0;
        }
    return 1;
}

int cuMemAllocHost_v2(void **p, size_t n)
{
    if (!initialised) return 3;
    if (!(*p = malloc(n ? n : 1))) return 2;
    n_alloc_host++;
    return 0;
}

int cuMemFreeHost(void *p)
{
    free(p);
    n_free_host++;
    return 0;
}

/* Is [p, p+n) the target of a copy still queued on some stream? */
static int queued_over(uintptr_t p, size_t n)
{
    for (int s = 0; s < MAX_STREAMS; s++)
        for (int i = 0; i < streams[s].nq; i++)
            if (p < streams[s].q[i].dst + streams[s].q[i].n && streams[s].q[i].dst < p + n)
                return 1;
    return 0;
}

int cuMemcpyDtoH_v2(void *dst, unsigned long long src, size_t n)
{
    n_dtoh++;
    if (!is_dev((uintptr_t)src, n)) {
        n_bad++;
        return 1;
    }
    if (queued_over((uintptr_t)src, n)) n_stale++;
    memcpy(dst, (void *)(uintptr_t)src, n);
    return 0;
}

int cuMemcpyHtoD_v2(unsigned long long dst, const void *src, size_t n)
{
    n_htod++;
    if (!is_dev((uintptr_t)dst, n)) {
        n_bad++;
        return 1;
    }
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}

static void oplog(char kind, uintptr_t addr, size_t n);
static void x_run(int s, long below);
static int htod_fail_in;

/* The nth cuMemcpyHtoDAsync from now fails (once). */
void fake_cuda_fail_htod_async(int nth)
{
    htod_fail_in = nth;
}

int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void *src, size_t n, void *stream)
{
    int s = stream_index(stream);
    if (s < 0 || !is_dev((uintptr_t)dst, n) || streams[s].nq == MAX_QUEUED) return 1;
    if (htod_fail_in > 0 && --htod_fail_in == 0) return 999; /* fake_cuda_fail_htod_async */
    oplog('H', (uintptr_t)dst, n);
    void *copy = malloc(n ? n : 1);
    if (!copy) return 2;
    memcpy(copy, src, n);
    int i = streams[s].nq++;
    streams[s].q[i].dst = (uintptr_t)dst;
    streams[s].q[i].src = copy;
    streams[s].q[i].n = n;
    return 0;
}

int cuStreamCreate(void **s, unsigned flags)
{
    (void)flags;
    for (int i = 1; i < MAX_STREAMS; i++)
        if (!streams[i].used) {
            streams[i].used = 1;
            *s = &streams[i];
            return 0;
        }
    return 1;
}

int cuStreamSynchronize(void *stream)
{
    int s = stream_index(stream);
    if (s < 0) return 400; /* CUDA_ERROR_INVALID_HANDLE */
    n_sync++;
    streams[s].syncs++;
    x_run(s, -1);
    for (int i = 0; i < streams[s].nq; i++) {
        memcpy((void *)streams[s].q[i].dst, streams[s].q[i].src, streams[s].q[i].n);
        free(streams[s].q[i].src);
    }
    streams[s].nq = 0;
    return 0;
}

int cuStreamDestroy_v2(void *stream)
{
    int s = stream_index(stream);
    if (s <= 0) return 400;
    cuStreamSynchronize(stream);
    streams[s].used = 0;
    return 0;
}

int cuGetErrorString(int e, const char **str)
{
    *str = e == 1 ? "fake: invalid value" : e == 3 ? "fake: not initialised" : "fake: error";
    return 0;
}

/*
 * The pipelined staging (src/comm/devbuf.c): cuMemcpyDtoHAsync queues a
 * copy from device memory that an event recorded after it carries out
 * once the event is complete (cuEventQuery past its time, or
 * cuEventSynchronize), or the stream's synchronisation does; a reader
 * that does not wait for the event reads the old host bytes.  Each event
 * completes copy_us microseconds (default 0) after the one
 * before it on its stream, as a copy engine working through its queue
 * would.  Copies from device memory queued on a stream run before the
 * copies to it queued there (Loom issues every read of a call first).
 * fake_cuda_copy_us sets that time from the test.
 * fake_cuda_oplog reads the order of operations: 'D' a device-to-host
 * copy queued (addr: its device source), 'E' an event seen complete
 * (addr: the source of the last such copy before it), 'H' a host-to-
 * device copy queued (addr: its device destination).
 */
#include <time.h>

#define MAX_X 4096
#define MAX_EVENTS 2048
#define MAX_LOG 16384

static struct { int s; void *dst; uintptr_t src; size_t n; long seq; int done; } xq[MAX_X];
static int nx;
static long xissued[MAX_STREAMS];
static uintptr_t xlast[MAX_STREAMS];
static long long last_ready[MAX_STREAMS];
static struct {
    int used, s, done, held;
    long marker, h0;
    uintptr_t addr;
    long long ready;
} events[MAX_EVENTS];
static int hold_nth = -1, nrec;
static long nh;
static struct { char kind; uintptr_t addr; size_t n; } oplog_[MAX_LOG];
static int nlog;
static long long copy_us;

void fake_cuda_copy_us(long us)
{
    copy_us = us;
}

/* The nth event recorded from now on (-1: none) is held until a host-to-
 * device copy is queued after it was recorded (or 5 s went by): a copy
 * engine slow enough for a finished chunk to go back before the last
 * chunk's input is in. */
void fake_cuda_hold_event(int nth)
{
    hold_nth = nth;
    nrec = 0;
}

static void oplog(char kind, uintptr_t addr, size_t n)
{
    if (kind == 'H') nh++;
    if (nlog == MAX_LOG) return;
    oplog_[nlog].kind = kind;
    oplog_[nlog].addr = addr;
    oplog_[nlog++].n = n;
}

int fake_cuda_oplog(int i, char *kind, unsigned long long *addr, size_t *n)
{
    if (i >= 0 && i < nlog) {
        *kind = oplog_[i].kind;
        *addr = oplog_[i].addr;
        *n = oplog_[i].n;
    }
    return nlog;
}

void fake_cuda_oplog_reset(void)
{
    nlog = 0;
}

static long long now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

/* Carry out the device-to-host copies queued on stream s (below: those
 * issued before the seq; -1: all); drop the finished ones. */
static void x_run(int s, long below)
{
    int j = 0;
    for (int i = 0; i < nx; i++) {
        if (xq[i].s == s && (below < 0 || xq[i].seq < below)) {
            memcpy(xq[i].dst, (void *)xq[i].src, xq[i].n);
            continue;
        }
        xq[j++] = xq[i];
    }
    nx = j;
}

int cuMemcpyDtoHAsync_v2(void *dst, unsigned long long src, size_t n, void *stream)
{
    int s = stream_index(stream);
    n_dtoh++;
    if (s < 0 || nx == MAX_X) return 1;
    if (!is_dev((uintptr_t)src, n)) {
        n_bad++;
        return 1;
    }
    if (queued_over((uintptr_t)src, n)) n_stale++;
    oplog('D', (uintptr_t)src, n);
    xq[nx].s = s;
    xq[nx].dst = dst;
    xq[nx].src = (uintptr_t)src;
    xq[nx].n = n;
    xq[nx++].seq = xissued[s]++;
    xlast[s] = (uintptr_t)src;
    return 0;
}

int cuEventCreate(void **e, unsigned flags)
{
    (void)flags;
    for (int i = 0; i < MAX_EVENTS; i++)
        if (!events[i].used) {
            memset(&events[i], 0, sizeof events[i]);
            events[i].used = 1;
            events[i].s = -1;
            *e = &events[i];
            return 0;
        }
    return 2;
}

static int event_index(void *e)
{
    uintptr_t v = (uintptr_t)e, b = (uintptr_t)events;
    if (v < b || v >= b + sizeof events || (v - b) % sizeof events[0]) return -1;
    int i = (int)((v - b) / sizeof events[0]);
    return events[i].used ? i : -1;
}

int cuEventRecord(void *e, void *stream)
{
    int i = event_index(e), s = stream_index(stream);
    if (i < 0 || s < 0) return 400;
    long long t = now_us();
    if (last_ready[s] > t) t = last_ready[s];
    events[i].s = s;
    events[i].done = 0;
    events[i].marker = xissued[s];
    events[i].addr = xlast[s];
    events[i].ready = last_ready[s] = t + copy_us;
    events[i].held = nrec++ == hold_nth;
    events[i].h0 = nh;
    return 0;
}

static void event_complete(int i)
{
    if (events[i].done) return;
    x_run(events[i].s, events[i].marker);
    events[i].done = 1;
    oplog('E', events[i].addr, 0);
}

int cuEventQuery(void *e)
{
    int i = event_index(e);
    if (i < 0) return 400;
    if (events[i].s < 0 || events[i].done) return 0;
    if (now_us() < events[i].ready) return 600; /* CUDA_ERROR_NOT_READY */
    if (events[i].held && nh == events[i].h0 && now_us() < events[i].ready + 5000000) return 600;
    event_complete(i);
    return 0;
}

int cuEventSynchronize(void *e)
{
    int i = event_index(e);
    if (i < 0) return 400;
    if (events[i].s < 0) return 0;
    while (cuEventQuery(e) == 600) {
        struct timespec t = {0, 50000};
        nanosleep(&t, NULL);
    }
    return 0;
}

int cuEventDestroy_v2(void *e)
{
    int i = event_index(e);
    if (i < 0) return 400;
    events[i].used = 0;
    return 0;
}

/* One device and its primary context, for tests/gpu/mp_gpu.c run here. */
int cuDeviceGet(int *dev, int ordinal)
{
    if (!initialised) return 3;
    if (ordinal) return 101; /* CUDA_ERROR_INVALID_DEVICE */
    *dev = 0;
    return 0;
}

int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    static int primary;
    if (!initialised) return 3;
    if (dev) return 101;
    *ctx = &primary;
    return 0;
}

int cuCtxSetCurrent(void *ctx)
{
    (void)ctx;
    return initialised ? 0 : 3;
}
