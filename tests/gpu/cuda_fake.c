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
 *
 * Device memory is shareable between processes, for the device-direct
 * collectives (src/comm/devpeer.c, tests/gpu/test_devpeer.sh): every
 * allocation is a memfd ("fakecuda-<serial>") mapped shared; its IPC
 * handle carries the owner's pid, the fd and the size, and
 * cuIpcOpenMemHandle maps /proc/<pid>/fd/<fd>.  An allocation freed and
 * made again of the same size gets the same fd, so the same handle, as
 * a real driver's handle may repeat: only the buffer id
 * (CU_POINTER_ATTRIBUTE_BUFFER_ID, the serial) tells them apart, and a
 * cache that keys on the handle alone reads the old allocation.  The kernels of src/reduce/reduce_cuda.cu
 * (loom_red_*, loom_redn_*, loom_avg_*) run on the CPU when launched,
 * their parameters read as the driver reads them (params[i] points at
 * the i-th argument); a launch or a device-to-device copy first carries
 * out what is queued on its stream, and counts a stale read where its
 * input has a copy queued on another stream.  Built with -DFAKE_NO_IPC
 * it has no IPC functions (an old driver); FAKE_CUDA_IPC_FAIL=1 in the
 * environment makes cuIpcGetMemHandle fail (read at each call), and
 * FAKE_CUDA_KILL_AT_LAUNCH=1 makes cuLaunchKernel SIGKILL its process.
 * GPUDirect RDMA: cuMemGetHandleForAddressRange hands out a duplicate of
 * the allocation's memfd as its "dmabuf" (FAKE_CUDA_DMABUF=0: the device
 * says it has no dmabuf support; =fail: every export fails; built with
 * -DFAKE_NO_DMABUF the function is absent, an old driver).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_ALLOCS 256
#define MAX_STREAMS 8
#define MAX_QUEUED 256

static int initialised;
/* opened: a peer's allocation mapped by cuIpcOpenMemHandle (fd -1). */
static struct { uintptr_t lo, hi; int fd, opened, managed; long serial; } dev[MAX_ALLOCS];
static long serials;
static int ndev;
static struct {
    int used;
    long syncs;
    int nq;
    struct { uintptr_t dst; void *src; size_t n; } q[MAX_QUEUED];
} streams[MAX_STREAMS]; /* [0]: the legacy default stream */
static long n_dtoh, n_htod, n_alloc_host, n_free_host, n_stale, n_bad, n_sync;
static long n_launch, n_dtod, n_ipc_open, n_ipc_close, n_ipc_get, n_dmabuf, n_dmabuf_bad, n_memcpy;

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
    if (!strcmp(what, "launch")) return n_launch;
    if (!strcmp(what, "dtod")) return n_dtod;
    if (!strcmp(what, "ipc_open")) return n_ipc_open;
    if (!strcmp(what, "ipc_close")) return n_ipc_close;
    if (!strcmp(what, "ipc_get")) return n_ipc_get;
    if (!strcmp(what, "dmabuf")) return n_dmabuf;
    if (!strcmp(what, "dmabuf_bad")) return n_dmabuf_bad;
    if (!strcmp(what, "memcpy")) return n_memcpy;
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
        for (int i = 0; i < ndev; i++)
            if (ptr >= dev[i].lo && ptr < dev[i].hi) *(unsigned int *)data = dev[i].managed;
        return 0;
    }
    if (attribute == 7) { /* CU_POINTER_ATTRIBUTE_BUFFER_ID: unique in the process */
        for (int i = 0; i < ndev; i++)
            if (ptr >= dev[i].lo && ptr < dev[i].hi)
                *(unsigned long long *)data = (unsigned long long)dev[i].serial;
        return 0;
    }
    if (attribute == 9) { /* CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL */
        *(int *)data = 0;
        return 0;
    }
    return 1;
}

int cuMemAlloc_v2(unsigned long long *p, size_t n)
{
    if (!initialised) return 3;
    if (ndev == MAX_ALLOCS || !n) return 1;
    char name[32];
    long serial = ++serials;
    snprintf(name, sizeof name, "fakecuda-%ld", serial);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) return 2;
    void *m = MAP_FAILED;
    if (ftruncate(fd, (off_t)n) == 0)
        m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        close(fd);
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    }
    memset(m, 0xA5, n);
    dev[ndev].lo = (uintptr_t)m;
    dev[ndev].hi = (uintptr_t)m + n;
    dev[ndev].fd = fd;
    dev[ndev].opened = 0;
    dev[ndev].managed = 0;
    dev[ndev++].serial = serial;
    *p = (uintptr_t)m;
    return 0;
}

int cuMemFree_v2(unsigned long long p)
{
    for (int i = 0; i < ndev; i++)
        if (dev[i].lo == p && !dev[i].opened) {
            munmap((void *)(uintptr_t)p, dev[i].hi - dev[i].lo);
            close(dev[i].fd);
            dev[i] = dev[--ndev];
            return 0;
        }
    return 1;
}

int cuMemGetAddressRange_v2(unsigned long long *base, size_t *size, unsigned long long p)
{
    if (!initialised) return 3;
    for (int i = 0; i < ndev; i++)
        if (p >= dev[i].lo && p < dev[i].hi) {
            if (base) *base = dev[i].lo;
            if (size) *size = dev[i].hi - dev[i].lo;
            return 0;
        }
    return 1;
}

/* CUipcMemHandle's 64 bytes, here. */
struct fake_ipc {
    uint32_t magic;
    int32_t pid, fd;
    uint64_t size;
};
#define IPC_MAGIC 0x46414b45u

#ifndef FAKE_NO_IPC
typedef struct { char b[64]; } ipc_handle;

int cuIpcGetMemHandle(ipc_handle *h, unsigned long long p)
{
    if (!initialised) return 3;
    const char *f = getenv("FAKE_CUDA_IPC_FAIL");
    if (f && *f == '1') return 801; /* CUDA_ERROR_NOT_SUPPORTED */
    for (int i = 0; i < ndev; i++)
        if (dev[i].lo == p && !dev[i].opened) {
            struct fake_ipc x = {IPC_MAGIC, (int32_t)getpid(), dev[i].fd, dev[i].hi - dev[i].lo};
            memset(h, 0, sizeof *h);
            memcpy(h, &x, sizeof x);
            n_ipc_get++;
            return 0;
        }
    return 1;
}

int cuIpcOpenMemHandle_v2(unsigned long long *p, ipc_handle h, unsigned flags)
{
    (void)flags;
    if (!initialised) return 3;
    struct fake_ipc x;
    memcpy(&x, &h, sizeof x);
    if (x.magic != IPC_MAGIC || ndev == MAX_ALLOCS) return 1;
    if (x.pid == getpid()) return 201; /* CUDA_ERROR_INVALID_CONTEXT: own memory */
    char path[64], link[128];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)x.pid, (int)x.fd);
    ssize_t k = readlink(path, link, sizeof link - 1);
    if (k < 0) return 400; /* the owner or its allocation is gone */
    link[k] = 0;
    if (strncmp(link, "/memfd:fakecuda-", 16)) return 400; /* not device memory */
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return 400;
    void *m = mmap(NULL, x.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return 2;
    dev[ndev].lo = (uintptr_t)m;
    dev[ndev].hi = (uintptr_t)m + x.size;
    dev[ndev].fd = -1;
    dev[ndev].opened = 1;
    dev[ndev].managed = 0;
    dev[ndev++].serial = 0;
    *p = (uintptr_t)m;
    n_ipc_open++;
    return 0;
}

int cuIpcCloseMemHandle(unsigned long long p)
{
    for (int i = 0; i < ndev; i++)
        if (dev[i].lo == p && dev[i].opened) {
            munmap((void *)(uintptr_t)p, dev[i].hi - dev[i].lo);
            dev[i] = dev[--ndev];
            n_ipc_close++;
            return 0;
        }
    return 1;
}
#endif

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

/* Carry out what is queued on stream index s. */
static void run_queue(int s)
{
    for (int i = 0; i < streams[s].nq; i++) {
        memcpy((void *)streams[s].q[i].dst, streams[s].q[i].src, streams[s].q[i].n);
        free(streams[s].q[i].src);
    }
    streams[s].nq = 0;
}

int cuStreamSynchronize(void *stream)
{
    int s = stream_index(stream);
    if (s < 0) return 400; /* CUDA_ERROR_INVALID_HANDLE */
    n_sync++;
    streams[s].syncs++;
    x_run(s, -1);
    run_queue(s);
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

/* ---------------------------------------------------------------- kernels */

static float h2f(uint16_t h)
{
    uint32_t sg = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, b;
    if (!e) {
        float v = (float)m * (1.0f / 16777216.0f);
        return sg ? -v : v;
    }
    b = e == 31 ? sg | 0x7f800000u | (m << 13) : sg | ((e - 15 + 127) << 23) | (m << 13);
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static uint16_t f2h(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sg = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sg | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sg | 0x7c00); /* rounds to infinity */
    if (ax < 0x38800000u) { /* a subnormal half, or zero: units of 2^-24 */
        float a;
        memcpy(&a, &ax, 4);
        float sc = a * 16777216.0f;
        uint32_t r = (uint32_t)sc;
        float fr = sc - (float)r;
        if (fr > 0.5f || (fr == 0.5f && (r & 1))) r++;
        return (uint16_t)(sg | r);
    }
    uint32_t h = ((((ax >> 23) - 127 + 15)) << 10) | ((ax & 0x7fffff) >> 13), rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sg | h);
}

static float b2f(uint16_t h)
{
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static uint16_t f2b(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static float fop(int o, float a, float b)
{
    if (o == 0) return a + b;
    if (o == 1) return a * b;
    if (a != a || b != b) return a + b;
    if (a == b) {
        uint32_t x, y;
        memcpy(&x, &a, 4);
        memcpy(&y, &b, 4);
        x = o == 2 ? x & y : x | y;
        memcpy(&a, &x, 4);
        return a;
    }
    return o == 2 ? (a > b ? a : b) : (a < b ? a : b);
}

static double dop(int o, double a, double b)
{
    if (o == 0) return a + b;
    if (o == 1) return a * b;
    if (a != a || b != b) return a + b;
    if (a == b) {
        uint64_t x, y;
        memcpy(&x, &a, 8);
        memcpy(&y, &b, 8);
        x = o == 2 ? x & y : x | y;
        memcpy(&a, &x, 8);
        return a;
    }
    return o == 2 ? (a > b ? a : b) : (a < b ? a : b);
}

enum { I8, U8, I32, U32, I64, U64, F16, F32, F64, BF16, NT };
static const char *const tnames[NT] = {"i8", "u8", "i32", "u32", "i64",
                                       "u64", "f16", "f32", "f64", "bf16"};
static const size_t tsize[NT] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
static const char *const onames[4] = {"sum", "prod", "max", "min"};

#define IOP(UT, ST)                                                                      \
    do {                                                                                 \
        ST a, b;                                                                         \
        memcpy(&a, acc, sizeof a);                                                       \
        memcpy(&b, in, sizeof b);                                                        \
        ST r = o == 0   ? (ST)(UT)((UT)a + (UT)b)                                        \
               : o == 1 ? (ST)(UT)((UT)a * (UT)b)                                        \
               : o == 2 ? (a > b ? a : b)                                                \
                        : (a < b ? a : b);                                               \
        memcpy(acc, &r, sizeof r);                                                       \
    } while (0)

/* *acc = *acc OP *in, in type t (fp16, bf16: in fp32, rounded back). */
static void apply(int t, int o, void *acc, const void *in)
{
    switch (t) {
    case I8: IOP(uint8_t, int8_t); break;
    case U8: IOP(uint8_t, uint8_t); break;
    case I32: IOP(uint32_t, int32_t); break;
    case U32: IOP(uint32_t, uint32_t); break;
    case I64: IOP(uint64_t, int64_t); break;
    case U64: IOP(uint64_t, uint64_t); break;
    case F32: {
        float a, b;
        memcpy(&a, acc, 4);
        memcpy(&b, in, 4);
        a = fop(o, a, b);
        memcpy(acc, &a, 4);
        break;
    }
    case F64: {
        double a, b;
        memcpy(&a, acc, 8);
        memcpy(&b, in, 8);
        a = dop(o, a, b);
        memcpy(acc, &a, 8);
        break;
    }
    case F16:
    case BF16: {
        uint16_t a, b;
        memcpy(&a, acc, 2);
        memcpy(&b, in, 2);
        float r = t == F16 ? fop(o, h2f(a), h2f(b)) : fop(o, b2f(a), b2f(b));
        a = t == F16 ? f2h(r) : f2b(r);
        memcpy(acc, &a, 2);
        break;
    }
    }
}

static void avg(int t, void *p, int n)
{
    switch (t) {
#define IAVG(ST, W)                                                                      \
    {                                                                                    \
        ST a;                                                                            \
        memcpy(&a, p, sizeof a);                                                         \
        a = (ST)((W)a / (W)n);                                                           \
        memcpy(p, &a, sizeof a);                                                         \
        break;                                                                           \
    }
    case I8: IAVG(int8_t, long long)
    case U8: IAVG(uint8_t, long long)
    case I32: IAVG(int32_t, long long)
    case U32: IAVG(uint32_t, long long)
    case I64: IAVG(int64_t, long long)
    case U64: IAVG(uint64_t, unsigned long long)
    case F32: IAVG(float, float)
    case F64: IAVG(double, double)
#undef IAVG
    case F16:
    case BF16: {
        uint16_t a;
        memcpy(&a, p, 2);
        float f = (t == F16 ? h2f(a) : b2f(a)) / (float)n;
        a = t == F16 ? f2h(f) : f2b(f);
        memcpy(p, &a, 2);
        break;
    }
    }
}

/* A module's function: which kernel. */
enum { K_RED, K_REDN, K_AVG };
static struct fn { int kind, t, o; } fns[3][NT][4];
static int module;

int cuDriverGetVersion(int *v) { *v = 12040; return 0; }
int cuDeviceGetCount(int *n) { *n = initialised ? 1 : 0; return initialised ? 0 : 3; }
int cuDeviceGet(int *d, int ord) { *d = ord; return ord == 0 ? 0 : 101; }
int cuDeviceGetName(char *name, int len, int d)
{
    (void)d;
    snprintf(name, (size_t)len, "fake CUDA device (tests/gpu/cuda_fake.c)");
    return 0;
}
int cuDeviceGetAttribute(int *v, int attr, int d)
{
    (void)d;
    *v = attr == 75 ? 9 : 0;
    /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: yes unless FAKE_CUDA_DMABUF=0. */
    if (attr == 124) {
        const char *e = getenv("FAKE_CUDA_DMABUF");
        *v = !(e && !strcmp(e, "0"));
    }
    return 0;
}

/* cuMemcpy (unified addressing): either side may be device memory. */
int cuMemcpy(unsigned long long dst, unsigned long long src, size_t n)
{
    if (!initialised) return 3;
    memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    n_memcpy++;
    return 0;
}

#ifndef FAKE_NO_DMABUF
/* GPUDirect RDMA: the range's "dmabuf" is a duplicate of its allocation's
 * memfd.  The range must be page-aligned and within its allocation
 * (rounded up to whole pages), as the driver demands; a range that is
 * not is counted (fake_cuda_count("dmabuf_bad")) and refused.
 * FAKE_CUDA_DMABUF=fail makes every export fail (CUDA_ERROR_NOT_SUPPORTED). */
int cuMemGetHandleForAddressRange(void *handle, unsigned long long p, size_t n, int type,
                                  unsigned long long flags)
{
    const char *e = getenv("FAKE_CUDA_DMABUF");
    if (!initialised) return 3;
    if (e && !strcmp(e, "fail")) return 801;
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (type != 1 || flags || !n || p % pg || n % pg) {
        n_dmabuf_bad++;
        return 1;
    }
    for (int i = 0; i < ndev; i++)
        if (p >= dev[i].lo && p < dev[i].hi && !dev[i].opened) {
            if (p + n > (dev[i].hi + pg - 1) / pg * pg) break;
            int fd = dup(dev[i].fd);
            if (fd < 0) return 2;
            *(int *)handle = fd;
            n_dmabuf++;
            return 0;
        }
    n_dmabuf_bad++;
    return 1;
}
#endif
static int ctx_token;
int cuDevicePrimaryCtxRetain(void **ctx, int d) { (void)d; *ctx = &ctx_token; return 0; }
int cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return 0; }
int cuCtxSetCurrent(void *ctx) { (void)ctx; return 0; }
/* Managed memory: device memory that the driver says is managed. */
int cuMemAllocManaged(unsigned long long *p, size_t n, unsigned f)
{
    (void)f;
    int e = cuMemAlloc_v2(p, n);
    if (!e) dev[ndev - 1].managed = 1;
    return e;
}
int cuModuleLoadData(void **mod, const void *image)
{
    if (!initialised) return 3;
    if (!image) return 1;
    *mod = &module;
    return 0;
}
int cuModuleUnload(void *mod) { return mod == &module ? 0 : 400; }
int cuModuleGetFunction(void **fn, void *mod, const char *name)
{
    if (mod != &module) return 400;
    char tn[8], on[8];
    int kind = -1;
    if (sscanf(name, "loom_redn_%7[a-z0-9]_%7[a-z]", tn, on) == 2) kind = K_REDN;
    else if (sscanf(name, "loom_red_%7[a-z0-9]_%7[a-z]", tn, on) == 2) kind = K_RED;
    else if (sscanf(name, "loom_avg_%7[a-z0-9]", tn) == 1) kind = K_AVG, strcpy(on, "sum");
    for (int t = 0; kind >= 0 && t < NT; t++)
        for (int o = 0; o < 4; o++)
            if (!strcmp(tn, tnames[t]) && !strcmp(on, onames[o])) {
                struct fn *f = &fns[kind][t][o];
                f->kind = kind, f->t = t, f->o = o;
                *fn = f;
                return 0;
            }
    return 500; /* CUDA_ERROR_NOT_FOUND */
}

/* Device memory [p, p + n) readable here; a stale read counted. */
static int dev_in(uintptr_t p, size_t n)
{
    if (!is_dev(p, n ? n : 1)) {
        n_bad++;
        return 0;
    }
    if (queued_over(p, n)) n_stale++;
    return 1;
}

int cuLaunchKernel(void *fnp, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shmem, void *stream, void **params, void **extra)
{
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem;
    const struct fn *f = fnp;
    int s = stream_index(stream);
    if (s < 0 || !params || extra) return 1;
    if (f < &fns[0][0][0] || f >= &fns[0][0][0] + 3 * NT * 4) return 400;
    run_queue(s); /* the stream's earlier work first */
    n_launch++;
    const char *k = getenv("FAKE_CUDA_KILL_AT_LAUNCH"); /* a rank dying mid-call */
    if (k && *k == '1') raise(SIGKILL);
    size_t es = tsize[f->t], n;
    uintptr_t d = (uintptr_t) * (unsigned long long *)params[0];
    if (f->kind == K_AVG) {
        memcpy(&n, params[1], sizeof n);
        int nr = *(int *)params[2];
        if (n > SIZE_MAX / es || !dev_in(d, n * es) || nr < 1) return 700;
        for (size_t i = 0; i < n; i++) avg(f->t, (char *)d + i * es, nr);
        return 0;
    }
    if (f->kind == K_RED) {
        uintptr_t src = (uintptr_t) * (unsigned long long *)params[1];
        memcpy(&n, params[2], sizeof n);
        if (n > SIZE_MAX / es || !dev_in(d, n * es) || !dev_in(src, n * es)) return 700;
        for (size_t i = 0; i < n; i++) apply(f->t, f->o, (char *)d + i * es, (char *)src + i * es);
        return 0;
    }
    /* loom_redn: (T *d, struct { const T *p[8]; } s, int nin, size_t n) */
    unsigned long long src[8];
    memcpy(src, params[1], sizeof src);
    int nin = *(int *)params[2];
    memcpy(&n, params[3], sizeof n);
    if (nin < 1 || nin > 8 || n > SIZE_MAX / es || !dev_in(d, n * es)) return 700;
    for (int k = 0; k < nin; k++)
        if (!dev_in((uintptr_t)src[k], n * es)) return 700;
    for (size_t i = 0; i < n; i++) {
        unsigned char acc[8];
        memcpy(acc, (char *)(uintptr_t)src[0] + i * es, es);
        for (int k = 1; k < nin; k++) apply(f->t, f->o, acc, (char *)(uintptr_t)src[k] + i * es);
        memcpy((char *)d + i * es, acc, es);
    }
    return 0;
}

int cuMemcpyDtoDAsync_v2(unsigned long long dst, unsigned long long src, size_t n, void *stream)
{
    int s = stream_index(stream);
    if (s < 0) return 400;
    run_queue(s);
    n_dtod++;
    if (!is_dev((uintptr_t)dst, n) || !dev_in((uintptr_t)src, n)) {
        n_bad++;
        return 1;
    }
    memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
    return 0;
}

/* Events: cuEventCreate, cuEventRecord, cuEventQuery, cuEventSynchronize
 * and cuEventDestroy are with the pipelined staging's copies (above);
 * recording an event does not run the stream's queue. */
int cuEventElapsedTime(float *ms, void *a, void *b) { (void)a, (void)b; *ms = 0; return 0; }
