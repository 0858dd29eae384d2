/*
 * gpudirect.c - GPUDirect RDMA's registration of CUDA device memory with
 * the verbs transport through a dmabuf (LOOM_GPUDIRECT), on one process,
 * with tests/gpu/cuda_fake.c as libcuda.so.1 (run by
 * tests/gpu/test_gpudirect.sh) and no NIC: the transport's state is made
 * here with a stand-in protection domain, and libibverbs' two functions
 * that registration calls (ibv_reg_dmabuf_mr, ibv_dereg_mr) are stand-ins
 * that record their arguments and accept or refuse as told.
 *
 * `gpudirect driver`: loomi_cuda_dmabuf (core/cuda.h): the range widened
 * to pages and the offset in it, and each refusal's reason (host memory,
 * a range past its allocation, a device without dmabuf support, a failed
 * export).  `gpudirect olddriver`: the driver lacks the function.
 * `gpudirect verbs`: the decision (auto: a refusal kept, with its reason,
 * never tried again; 1: an error naming LOOM_GPUDIRECT each time; 0:
 * never tried), the registration cache (hits, sub-ranges, an allocation
 * freed and made again at the same address, deregistration of each),
 * mem_register of device memory.  `gpudirect env`: LOOM_GPUDIRECT as
 * read (the script sets it); `gpudirect badenv`: a bad value refused.
 *
 * `gpudirect real` (tests/gpu/run_on_gpu.sh, under loomrun, on a real GPU
 * with the real driver): says whether the driver exports device memory
 * as a dmabuf, then registers 8 MiB of device memory with
 * loom_mem_register and says which path it took: registered with the
 * NIC through dmabuf (GPUDirect RDMA), or not, and why (the verbs
 * transport's counters and reason).  Exits 77 without a GPU or without
 * a verbs device; under LOOM_GPUDIRECT=1 a refusal fails it.
 *
 * `gpudirect direct` (the verbs VM suite, under loomrun over
 * LOOM_TRANSPORT=verbs, with the fake driver): the collectives' device-
 * direct path.  The fake's device memory is host memory, so a stand-in
 * for ibv_reg_dmabuf_mr registers it with ibv_reg_mr on the real (soft-
 * RoCE) device: every alltoall, allgather and broadcast below, eager and
 * rendezvous sizes, runs on the device buffers through the NIC (the
 * communicator's count of direct calls says so; the fake counts cuMemcpy
 * for the eager messages and the schedules' own copies), and the results
 * are checked.  GD_MIXED=1: rank 1 runs with LOOM_GPUDIRECT=0 (staged)
 * while the others go direct: the results stay right.  A broadcast that
 * staging would pipeline is staged by every rank.
 */
#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/cuda.h"
#include "core/internal.h"
#include "loom.h"
#include "transports/route.h"
#include "transports/verbs/verbs.h"
#include "../mp/check.h"

#ifdef HAVE_VERBS_H
#include "transports/verbs/verbs_internal.h"
#endif

static int fails, passes;

static void truth(int cond, const char *what, const char *detail)
{
    if (cond) passes++;
    else fails++;
    printf("%s %s%s%s\n", cond ? "ok  " : "FAIL", what, detail && *detail ? ": " : "",
           detail ? detail : "");
}

static int (*cu_init)(unsigned);
static int (*cu_alloc)(unsigned long long *, size_t);
static int (*cu_free)(unsigned long long);
static long (*fake_count)(const char *);

static int load_fake(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return -1;
    *(void **)&cu_init = dlsym(h, "cuInit");
    *(void **)&cu_alloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&cu_free = dlsym(h, "cuMemFree_v2");
    *(void **)&fake_count = dlsym(h, "fake_cuda_count");
    return cu_init && cu_alloc && cu_free && fake_count && cu_init(0) == 0 ? 0 : -1;
}

static void *dalloc(size_t n)
{
    unsigned long long p = 0;
    return cu_alloc(&p, n) == 0 ? (void *)(uintptr_t)p : NULL;
}

static int has(const char *s, const char *word)
{
    return strstr(s, word) != NULL;
}

static int driver(void)
{
    const long pg = sysconf(_SC_PAGESIZE);
    char why[256] = "";
    int fd;
    size_t off;
    char *d = dalloc(3 * (size_t)pg + 100);
    truth(d != NULL, "device allocation", NULL);
    if (!d) return 1;
    long n0 = fake_count("dmabuf");
    int r = loomi_cuda_dmabuf(d, 10000, &fd, &off, why, sizeof why);
    truth(r == 0 && fd >= 0 && off == 0 && fake_count("dmabuf") == n0 + 1,
          "aligned range exported as a dmabuf, offset 0", why);
    if (fd >= 0) close(fd);
    r = loomi_cuda_dmabuf(d + pg + 100, 50, &fd, &off, why, sizeof why);
    truth(r == 0 && fd >= 0 && off == 100, "unaligned range widened to its page, offset 100", why);
    if (fd >= 0) close(fd);
    /* The last, partial page of the allocation: widened to the page end. */
    r = loomi_cuda_dmabuf(d + 3 * pg + 10, 90, &fd, &off, why, sizeof why);
    truth(r == 0 && off == 10, "the allocation's partial last page", why);
    if (fd >= 0) close(fd);
    truth(fake_count("dmabuf_bad") == 0, "every export page-aligned, within its allocation",
          NULL);
    char host[64];
    r = loomi_cuda_dmabuf(host, sizeof host, &fd, &off, why, sizeof why);
    truth(r == -1 && fd == -1 && has(why, "not CUDA device memory"), "host memory refused", why);
    r = loomi_cuda_dmabuf(d + pg, 3 * (size_t)pg, &fd, &off, why, sizeof why);
    truth(r == -1 && has(why, "runs past its allocation"), "a range past its allocation refused",
          why);
    r = loomi_cuda_dmabuf(d, 0, &fd, &off, why, sizeof why);
    truth(r == -1 && has(why, "empty"), "an empty range refused", why);
    setenv("FAKE_CUDA_DMABUF", "0", 1);
    n0 = fake_count("dmabuf");
    r = loomi_cuda_dmabuf(d, 100, &fd, &off, why, sizeof why);
    truth(r == -1 && has(why, "does not support dmabuf") &&
              has(why, "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED") && fake_count("dmabuf") == n0,
          "a device without dmabuf support: refused before any export", why);
    setenv("FAKE_CUDA_DMABUF", "fail", 1);
    r = loomi_cuda_dmabuf(d, 100, &fd, &off, why, sizeof why);
    truth(r == -1 && fd == -1 && has(why, "cuMemGetHandleForAddressRange"),
          "a failed export refused, naming the function", why);
    unsetenv("FAKE_CUDA_DMABUF");
    cu_free((uintptr_t)d);
    return 0;
}

static int olddriver(void)
{
    char why[256] = "";
    int fd;
    size_t off;
    void *d = dalloc(4096);
    int r = loomi_cuda_dmabuf(d, 100, &fd, &off, why, sizeof why);
    truth(r == -1 && has(why, "lacks cuMemGetHandleForAddressRange"),
          "a driver without cuMemGetHandleForAddressRange: refused, naming it", why);
    cu_free((uintptr_t)d);
    return 0;
}

#ifdef HAVE_VERBS_H
/* libibverbs' registration functions, stood in for. */
static int nic_refuses;   /* errno to refuse with; 0: accept */
static long n_reg, n_dereg, n_plain;
static struct {
    uint64_t offset, iova;
    size_t length;
    int fd_ok, access;
} last;

static struct ibv_mr *fake_reg_dmabuf(struct ibv_pd *pd, uint64_t offset, size_t length,
                                      uint64_t iova, int fd, int access)
{
    (void)pd;
    last.offset = offset;
    last.length = length;
    last.iova = iova;
    last.access = access;
    last.fd_ok = fcntl(fd, F_GETFD) != -1;
    if (nic_refuses) {
        errno = nic_refuses;
        return NULL;
    }
    n_reg++;
    return calloc(1, sizeof(struct ibv_mr));
}

static int fake_dereg(struct ibv_mr *mr)
{
    n_dereg++;
    free(mr);
    return 0;
}

static struct ibv_mr *fake_reg_plain(struct ibv_pd *pd, void *a, size_t n, int access)
{
    (void)pd, (void)a, (void)n, (void)access;
    n_plain++;
    return calloc(1, sizeof(struct ibv_mr));
}

static struct verbs *state(int mode)
{
    struct verbs *t = calloc(1, sizeof *t);
    static int pd_token;
    t->pd = (struct ibv_pd *)&pd_token;
    t->gd_mode = mode;
    snprintf(t->dev.name, sizeof t->dev.name, "fake0");
    return t;
}

static void drop(struct verbs *t)
{
    loomi_verbs_mr_trim(t, 1, 0);
    free(t);
}

static int verbs(void)
{
    loomi_verbs_ib.reg_dmabuf_mr = fake_reg_dmabuf;
    loomi_verbs_ib.dereg_mr = fake_dereg;
    loomi_verbs_ib.reg_mr = fake_reg_plain;
    const long pg = sysconf(_SC_PAGESIZE);
    char why[256], msg[512];
    char *d = dalloc(4 * (size_t)pg);
    struct loomi_verbs_gd_stats st;

    /* auto, accepted: registered once, then served by the cache. */
    struct verbs *t = state(LOOMI_GPUDIRECT_AUTO);
    why[0] = 0;
    struct mrent *e = loomi_verbs_mr_get_dev(t, d + 100, 2 * (size_t)pg, why, sizeof why);
    snprintf(msg, sizeof msg, "offset %llu iova %p length %zu fd %s", (unsigned long long)last.offset,
             (void *)(uintptr_t)last.iova, last.length, last.fd_ok ? "open" : "closed");
    truth(e && e->dev && n_reg == 1 && last.offset == 100 &&
              last.iova == (uint64_t)(uintptr_t)(d + 100) && last.length == 2 * (size_t)pg &&
              last.fd_ok && last.access == IBV_ACCESS_LOCAL_WRITE,
          "auto: device memory registered through a dmabuf (offset in the page, iova the device "
          "address, local access)",
          msg);
    struct mrent *e2 = loomi_verbs_mr_get_dev(t, d + 200, 100, why, sizeof why);
    loomi_verbs_gd_stats(t, &st);
    truth(e2 == e && n_reg == 1 && st.hits == 1 && st.tries == 1 && st.regs == 1,
          "a sub-range: the cached registration, none new", NULL);
    loomi_verbs_mr_put(t, e2);
    loomi_verbs_mr_put(t, e);
    why[0] = 0;
    int pr = loomi_verbs_gd_probe(t, "test", d + 100, 64, why, sizeof why);
    loomi_verbs_gd_stats(t, &st);
    truth(pr == 1 && st.hits == 2 && n_reg == 1, "probe: yes, from the cache", why);
    /* The host cache is apart: host memory is never a dmabuf. */
    char *hbuf = malloc(1000);
    e = loomi_verbs_mr_get(t, hbuf, 1000);
    truth(e && !e->dev && n_plain == 1 && n_reg == 1, "host memory: ibv_reg_mr, not a dmabuf",
          NULL);
    loomi_verbs_mr_put(t, e);
    /* Freed and made again: an allocation the same size often comes
     * back at the same address, with a new buffer id. */
    cu_free((uintptr_t)d);
    char *d2 = dalloc(4 * (size_t)pg);
    if (d2 == d) {
        long deregs0 = n_dereg;
        e = loomi_verbs_mr_get_dev(t, d2 + 100, 64, why, sizeof why);
        loomi_verbs_gd_stats(t, &st);
        truth(e && st.stale == 1 && n_reg == 2 && n_dereg == deregs0 + 1 && st.deregs == 1,
              "an allocation freed and made again at the same address: the old registration "
              "dropped, a new one made",
              NULL);
        loomi_verbs_mr_put(t, e);
    } else {
        printf("note: the allocation came back elsewhere (%p, was %p): stale entry not checked\n",
               (void *)d2, (void *)d);
    }
    d = d2;
    /* mem_register of device memory: held until mem_deregister. */
    struct loomi_mr mr;
    loom_result_t rr = loomi_verbs_ops.mem_register(t, d, 512, LOOMI_MEM_DEVICE, &mr);
    e = mr.handle;
    truth(rr == LOOM_SUCCESS && e && e->dev && e->user == 1, "mem_register of device memory",
          loom_get_last_error());
    long regs = n_reg;
    loomi_verbs_mr_trim(t, 1, 0);
    truth(t->nmr == 1 && t->mrs == e && e->mr,
          "trimming drops the unused entries, keeps the user's registration", NULL);
    long deregs = n_dereg;
    loomi_verbs_ops.mem_deregister(t, &mr);
    truth(n_dereg == deregs + 1 && t->nmr == 0 && n_reg == regs,
          "mem_deregister releases it", NULL);
    loomi_verbs_gd_stats(t, &st);
    truth(st.regs == st.deregs && n_dereg == n_reg + n_plain,
          "every registration released, device and host", NULL);
    drop(t);
    free(hbuf);

    /* auto, the NIC refuses (soft-RoCE's answer): kept, never tried again. */
    t = state(LOOMI_GPUDIRECT_AUTO);
    nic_refuses = EOPNOTSUPP;
    long calls = n_reg;
    why[0] = 0;
    e = loomi_verbs_mr_get_dev(t, d, 100, why, sizeof why);
    loomi_verbs_gd_stats(t, &st);
    truth(!e && st.refused == 1 && st.tries == 1 && has(why, "ibv_reg_dmabuf_mr") &&
              has(why, "fake0") && t->gd_refused,
          "auto: the NIC refuses: no registration, the reason kept", why);
    why[0] = 0;
    long exports = fake_count("dmabuf");
    pr = loomi_verbs_gd_probe(t, "test", d, 100, why, sizeof why);
    loomi_verbs_gd_stats(t, &st);
    truth(pr == 0 && st.tries == 1 && st.skipped == 1 && has(why, "ibv_reg_dmabuf_mr") &&
              fake_count("dmabuf") == exports && n_reg == calls,
          "auto after a refusal: staged at once, not tried again, same reason", why);
    drop(t);

    /* auto, the driver refuses: the NIC is never asked. */
    nic_refuses = 0;
    t = state(LOOMI_GPUDIRECT_AUTO);
    setenv("FAKE_CUDA_DMABUF", "0", 1);
    memset(&last, 0, sizeof last);
    pr = loomi_verbs_gd_probe(t, "test", d, 100, why, sizeof why);
    loomi_verbs_gd_stats(t, &st);
    truth(pr == 0 && st.refused == 1 && last.length == 0 && has(why, "does not support dmabuf"),
          "auto: the driver refuses: the NIC not asked, the driver's reason", why);
    drop(t);

    /* 1: every refusal an error naming LOOM_GPUDIRECT, the call, the reason. */
    t = state(LOOMI_GPUDIRECT_ON);
    pr = loomi_verbs_gd_probe(t, "loom_broadcast", d, 100, why, sizeof why);
    const char *err = loom_get_last_error();
    truth(pr == -1 && has(err, "LOOM_GPUDIRECT=1") && has(err, "loom_broadcast") &&
              has(err, "does not support dmabuf"),
          "LOOM_GPUDIRECT=1: a refusal is an error naming it, the call and why", err);
    pr = loomi_verbs_gd_probe(t, "loom_broadcast", d, 100, why, sizeof why);
    loomi_verbs_gd_stats(t, &st);
    truth(pr == -1 && st.tries == 2 && !t->gd_refused, "LOOM_GPUDIRECT=1: tried each time", NULL);
    rr = loomi_verbs_ops.mem_register(t, d, 100, LOOMI_MEM_DEVICE, &mr);
    truth(rr == LOOM_ERR_UNSUPPORTED && has(loom_get_last_error(), "LOOM_GPUDIRECT=1"),
          "LOOM_GPUDIRECT=1: mem_register of device memory fails", loom_get_last_error());
    drop(t);
    t = state(LOOMI_GPUDIRECT_AUTO);
    rr = loomi_verbs_ops.mem_register(t, d, 100, LOOMI_MEM_DEVICE, &mr);
    truth(rr == LOOM_SUCCESS && mr.handle == NULL,
          "auto: mem_register of device memory the driver refuses: success, nothing registered",
          NULL);
    drop(t);
    unsetenv("FAKE_CUDA_DMABUF");

    /* 0: never tried, neither driver nor NIC asked. */
    t = state(LOOMI_GPUDIRECT_OFF);
    exports = fake_count("dmabuf");
    calls = n_reg;
    pr = loomi_verbs_gd_probe(t, "test", d, 100, why, sizeof why);
    loomi_verbs_gd_stats(t, &st);
    truth(pr == 0 && st.tries == 0 && st.skipped == 1 && fake_count("dmabuf") == exports &&
              n_reg == calls && has(why, "LOOM_GPUDIRECT=0"),
          "LOOM_GPUDIRECT=0: never tried", why);
    drop(t);

    /* An old libibverbs without ibv_reg_dmabuf_mr. */
    loomi_verbs_ib.reg_dmabuf_mr = NULL;
    t = state(LOOMI_GPUDIRECT_AUTO);
    pr = loomi_verbs_gd_probe(t, "test", d, 100, why, sizeof why);
    truth(pr == 0 && has(why, "lacks ibv_reg_dmabuf_mr"),
          "libibverbs without ibv_reg_dmabuf_mr: refused, naming it", why);
    drop(t);
    cu_free((uintptr_t)d);
    return 0;
}
#endif

/* On a real GPU: which path device memory takes with the NIC. */
static int real(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    int (*dev_get)(int *, int) = NULL;
    int (*retain)(void **, int) = NULL;
    int (*set)(void *) = NULL;
    if (h) {
        *(void **)&cu_init = dlsym(h, "cuInit");
        *(void **)&cu_alloc = dlsym(h, "cuMemAlloc_v2");
        *(void **)&cu_free = dlsym(h, "cuMemFree_v2");
        *(void **)&dev_get = dlsym(h, "cuDeviceGet");
        *(void **)&retain = dlsym(h, "cuDevicePrimaryCtxRetain");
        *(void **)&set = dlsym(h, "cuCtxSetCurrent");
    }
    int dev;
    void *ctx;
    if (!cu_init || !cu_alloc || !cu_free || !dev_get || !retain || !set || cu_init(0) ||
        dev_get(&dev, 0) || retain(&ctx, dev) || set(ctx)) {
        printf("gpudirect skipped: no CUDA driver or device\n");
        return 77;
    }
    const size_t n = 8u << 20;
    char *d = dalloc(n);
    if (!d) {
        printf("gpudirect FAIL cuMemAlloc of %zu bytes\n", n);
        return 1;
    }
    char why[256] = "";
    int fd;
    size_t off;
    if (loomi_cuda_dmabuf(d, n, &fd, &off, why, sizeof why) == 0) {
        printf("gpudirect driver: exports device memory as a dmabuf\n");
        close(fd);
    } else {
        printf("gpudirect driver: no dmabuf: %s\n", why);
    }
    if (!loomi_verbs_available(why, sizeof why)) {
        printf("gpudirect skipped: no verbs device (%s): GPUDirect RDMA not checked\n", why);
        cu_free((uintptr_t)d);
        return 77;
    }
    loom_comm_t comm;
    loom_result_t r = loom_comm_init_env(&comm, NULL);
    if (r != LOOM_SUCCESS) {
        printf("gpudirect FAIL init: %s: %s\n", loom_strerror(r), loom_get_last_error());
        return 1;
    }
    struct loom_comm *c = NULL;
    loomi_comm_check(comm, "gpudirect", &c);
    void *vs = c && c->eng.tops == &loomi_route_ops ? loomi_route_verbs_state(c->eng.tstate) : NULL;
    int rc = 0;
    if (!vs) {
        printf("gpudirect skipped: the verbs transport was not opened (LOOM_TRANSPORT?): GPUDirect RDMA "
               "not checked\n");
        rc = 77;
    } else {
        loom_mem_t mh = NULL;
        r = loom_mem_register(comm, d, n, &mh);
        struct loomi_verbs_gd_stats st;
        loomi_verbs_gd_stats(vs, &st);
        if (r != LOOM_SUCCESS) {
            printf("gpudirect FAIL loom_mem_register of device memory: %s\n", loom_get_last_error());
            rc = 1;
        } else if (st.regs) {
            printf("gpudirect path: GPUDirect RDMA: device memory registered with %s through dmabuf "
                   "(tries %llu, regs %llu)\n",
                   loomi_route_rdma_device(c->eng.tstate), st.tries, st.regs);
        } else {
            printf("gpudirect path: staged through host memory: %s (tries %llu, refused %llu, skipped "
                   "%llu)\n",
                   loomi_verbs_gd_why(vs)[0] ? loomi_verbs_gd_why(vs) : "LOOM_GPUDIRECT=0",
                   st.tries, st.refused, st.skipped);
        }
        if (mh) loom_mem_deregister(comm, mh);
        /* One alltoall on device buffers (LOOM_CUDA_IPC=0 where the
         * ranks share a host): which path it took, and its result. */
        int (*htod)(unsigned long long, const void *, size_t) = NULL;
        int (*dtoh)(void *, unsigned long long, size_t) = NULL;
        *(void **)&htod = dlsym(h, "cuMemcpyHtoD_v2");
        *(void **)&dtoh = dlsym(h, "cuMemcpyDtoH_v2");
        int rank, np;
        loom_comm_rank(comm, &rank);
        loom_comm_size(comm, &np);
        const size_t cnt = 65536, bytes = cnt * (size_t)np * 4;
        int32_t *hb = malloc(bytes);
        char *dr = dalloc(bytes);
        if (htod && dtoh && hb && dr && bytes <= n) {
            for (size_t i = 0; i < cnt * (size_t)np; i++) hb[i] = rank * 1000003 + (int32_t)i;
            htod((uintptr_t)d, hb, bytes);
            const unsigned long long before = c->gd_direct;
            r = loom_alltoall(d, dr, cnt, LOOM_INT32, comm);
            dtoh(hb, (uintptr_t)dr, bytes);
            int good = r == LOOM_SUCCESS;
            for (int q = 0; good && q < np; q++)
                for (size_t i = 0; good && i < cnt; i++)
                    good = hb[(size_t)q * cnt + i] == q * 1000003 + (int32_t)((size_t)rank * cnt + i);
            printf("gpudirect alltoall: %s, %s\n",
                   c->gd_direct > before ? "device-direct through the NIC" : "staged",
                   good ? "right" : r == LOOM_SUCCESS ? "WRONG" : loom_get_last_error());
            if (!good) rc = 1;
        }
        free(hb);
        if (dr) cu_free((uintptr_t)dr);
    }
    loom_comm_destroy(comm);
    cu_free((uintptr_t)d);
    return rc;
}

#ifdef HAVE_VERBS_H
/* ibv_reg_dmabuf_mr for the fake driver: its device memory is host
 * memory at the iova, which ibv_reg_mr registers. */
static struct ibv_mr *(*plain_reg)(struct ibv_pd *, void *, size_t, int);
static long n_standin;
static struct ibv_mr *standin_reg_dmabuf(struct ibv_pd *pd, uint64_t offset, size_t length,
                                         uint64_t iova, int fd, int access)
{
    (void)offset;
    if (fcntl(fd, F_GETFD) == -1) {
        errno = EBADF;
        return NULL;
    }
    n_standin++;
    return plain_reg(pd, (void *)(uintptr_t)iova, length, access);
}
#endif

static int direct(void)
{
#ifndef HAVE_VERBS_H
    printf("built without verbs.h\n");
    return 77;
#else
    int (*htod)(unsigned long long, const void *, size_t) = NULL;
    int (*dtoh)(void *, unsigned long long, size_t) = NULL;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h) {
        *(void **)&htod = dlsym(h, "cuMemcpyHtoD_v2");
        *(void **)&dtoh = dlsym(h, "cuMemcpyDtoH_v2");
    }
    if (load_fake() != 0 || !htod || !dtoh) {
        printf("no fake libcuda.so.1\n");
        return 77;
    }
    const char *mixed = getenv("GD_MIXED");
    const char *rs = getenv("LOOM_RANK");
    if (mixed && !strcmp(mixed, "1") && rs && !strcmp(rs, "1")) setenv("LOOM_GPUDIRECT", "0", 1);
    loom_comm_t comm;
    int rank, n;
    mp_join(&comm, &rank, &n);
    loom_result_t r;
    struct loom_comm *c = NULL;
    loomi_comm_check(comm, "gpudirect", &c);
    void *vs = loomi_route_verbs_state(c->eng.tstate);
    if (!vs) {
        printf("FAIL rank %d: the verbs transport is not in use\n", rank);
        return 1;
    }
    plain_reg = loomi_verbs_ib.reg_mr;
    loomi_verbs_ib.reg_dmabuf_mr = standin_reg_dmabuf;
    const int staged_rank = mixed && !strcmp(mixed, "1") && rank == 1;
    const size_t sizes[] = {16, 3000, 70000}; /* int32s: eager and rendezvous */
    char what[160];
    unsigned long long calls = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const size_t cnt = sizes[si];
        const size_t bytes = cnt * (size_t)n * 4;
        int32_t *hs = malloc(bytes), *hr = malloc(bytes), *want = malloc(bytes);
        char *ds = dalloc(bytes), *dr = dalloc(bytes);
        for (int coll = 0; coll < 4; coll++) {
            for (size_t i = 0; i < cnt * (size_t)n; i++) hs[i] = rank * 1000003 + (int32_t)i;
            memset(hr, 0x5a, bytes);
            htod((uintptr_t)ds, hs, bytes);
            htod((uintptr_t)dr, hr, bytes);
            const char *name;
            size_t check = cnt * (size_t)n;
            if (coll == 0) {
                name = "alltoall";
                r = loom_alltoall(ds, dr, cnt, LOOM_INT32, comm);
                for (int q = 0; q < n; q++)
                    for (size_t i = 0; i < cnt; i++)
                        want[(size_t)q * cnt + i] = q * 1000003 + (int32_t)((size_t)rank * cnt + i);
            } else if (coll == 1) {
                name = "allgather";
                r = loom_allgather(ds, dr, cnt, LOOM_INT32, comm);
                for (int q = 0; q < n; q++)
                    for (size_t i = 0; i < cnt; i++)
                        want[(size_t)q * cnt + i] = q * 1000003 + (int32_t)i;
            } else {
                const int root = coll == 2 ? 0 : n - 1;
                name = coll == 2 ? "broadcast from 0" : "broadcast from the last rank";
                r = loom_broadcast(ds, dr, cnt, LOOM_INT32, root, comm);
                check = cnt;
                for (size_t i = 0; i < cnt; i++) want[i] = root * 1000003 + (int32_t)i;
            }
            calls++;
            dtoh(hr, (uintptr_t)dr, bytes);
            snprintf(what, sizeof what, "rank %d: %s of %zu int32s on device buffers", rank, name,
                     cnt);
            truth(r == LOOM_SUCCESS && !memcmp(hr, want, check * 4), what,
                  r == LOOM_SUCCESS ? "" : loom_get_last_error());
        }
        cu_free((uintptr_t)ds);
        cu_free((uintptr_t)dr);
        free(hs);
        free(hr);
        free(want);
    }
    struct loomi_verbs_gd_stats st;
    loomi_verbs_gd_stats(vs, &st);
    snprintf(what, sizeof what,
             "rank %d: %llu of %llu calls direct, %llu staged; dmabuf regs %llu (stand-in %ld), "
             "cuMemcpy %ld",
             rank, c->gd_direct, calls, c->gd_staged, st.regs, n_standin, fake_count("memcpy"));
    if (staged_rank)
        truth(c->gd_direct == 0 && st.tries == 0 && n_standin == 0,
              "LOOM_GPUDIRECT=0 on this rank: every call staged", what);
    else
        truth(c->gd_direct == calls && c->gd_staged == 0 && st.regs > 0 && n_standin > 0 &&
                  fake_count("memcpy") > 0,
              "every call ran on the device buffers through the NIC", what);
    /* Large enough that staging pipelines it: staged by every rank. */
    const size_t big = 2u << 20;
    char *db = dalloc(big);
    int32_t *hb = malloc(big);
    for (size_t i = 0; i < big / 4; i++) hb[i] = rank == 0 ? (int32_t)(i * 7) : -1;
    htod((uintptr_t)db, hb, big);
    char *db2 = dalloc(big);
    unsigned long long before = c->gd_direct;
    r = loom_broadcast(db, db2, big / 4, LOOM_INT32, 0, comm);
    dtoh(hb, (uintptr_t)db2, big);
    int good = r == LOOM_SUCCESS;
    for (size_t i = 0; good && i < big / 4; i++) good = hb[i] == (int32_t)(i * 7);
    snprintf(what, sizeof what, "rank %d: a 2 MiB broadcast (LOOM_CUDA_PIPELINE_CHUNK=%s): staged",
             rank, getenv("LOOM_CUDA_PIPELINE_CHUNK") ? getenv("LOOM_CUDA_PIPELINE_CHUNK") : "4M");
    truth(good && c->gd_direct == before, what, r == LOOM_SUCCESS ? "" : loom_get_last_error());
    cu_free((uintptr_t)db);
    cu_free((uintptr_t)db2);
    free(hb);
    loom_comm_destroy(comm);
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
#endif
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "";
    if (!strcmp(what, "real")) return real();
    if (!strcmp(what, "direct")) return direct();
    if (!strcmp(what, "env") || !strcmp(what, "badenv")) {
        struct loomi_settings s;
        loom_result_t r = loomi_settings_resolve(&s, NULL, "test");
        const char *v = getenv("LOOM_GPUDIRECT");
        if (!strcmp(what, "badenv")) {
            truth(r == LOOM_ERR_INVALID_ARGUMENT && has(loom_get_last_error(), "LOOM_GPUDIRECT"),
                  "a bad LOOM_GPUDIRECT refused, naming it", loom_get_last_error());
        } else {
            int want = !v || !strcmp(v, "auto") ? LOOMI_GPUDIRECT_AUTO
                       : !strcmp(v, "1")        ? LOOMI_GPUDIRECT_ON
                                                : LOOMI_GPUDIRECT_OFF;
            truth(r == LOOM_SUCCESS && s.gpudirect == want, "LOOM_GPUDIRECT read", v ? v : "unset");
        }
    } else {
        if (load_fake() != 0) {
            printf("no fake libcuda.so.1\n");
            return 77;
        }
        if (!strcmp(what, "driver")) driver();
        else if (!strcmp(what, "olddriver")) olddriver();
#ifdef HAVE_VERBS_H
        else if (!strcmp(what, "verbs")) verbs();
#else
        else if (!strcmp(what, "verbs")) {
            printf("built without verbs.h\n");
            return 77;
        }
#endif
        else {
            fprintf(stderr, "usage: gpudirect driver|olddriver|verbs|env|badenv\n");
            return 2;
        }
    }
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
