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

int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void *src, size_t n, void *stream)
{
    int s = stream_index(stream);
    if (s < 0 || !is_dev((uintptr_t)dst, n) || streams[s].nq == MAX_QUEUED) return 1;
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
