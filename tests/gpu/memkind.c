/*
 * memkind.c - what memory a buffer is (loomi_mem_kind, core/cuda.h) and
 * the refusal of device buffers at the collectives' door, on one rank,
 * with tests/mp/cuda_stub.c standing in for libcuda.so.1 (run by
 * tests/gpu/test_memkind.sh): the stub has no cuMemAllocHost, so device
 * buffers cannot be staged through host memory (test_devbuf.sh runs
 * them with a driver that can): buffers the stub marks as device memory
 * are refused with LOOM_ERR_INVALID_ARGUMENT naming sendbuf or recvbuf
 * and the missing function, untouched; managed and host memory are used; so is every buffer while
 * the driver is not initialised.
 *
 * `memkind nodriver`: no libcuda.so.1 may be found; every pointer is host
 * memory and the same calls succeed.  `memkind stub`: exits 77 when no
 * stub is loaded.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda.h"
#include "loom.h"

static int fails, passes;

static void expect(loom_result_t got, loom_result_t want, const char *word, const char *what)
{
    const char *msg = loom_get_last_error();
    if (got == want && (!word || strstr(msg, word))) {
        passes++;
        printf("ok   %s%s%s\n", what, word ? ": " : "", word ? msg : "");
    } else {
        fails++;
        printf("FAIL %s: got %s, want %s; \"%s\"\n", what, loom_strerror(got),
               loom_strerror(want), msg);
    }
}

static void truth(int cond, const char *what)
{
    if (cond) {
        passes++;
        printf("ok   %s\n", what);
    } else {
        fails++;
        printf("FAIL %s\n", what);
    }
}

static float host[64], dev[64], managed[64], out[64];

static int all(const float *p, float v)
{
    for (int i = 0; i < 64; i++)
        if (p[i] != v) return 0;
    return 1;
}

static void fill(void)
{
    for (int i = 0; i < 64; i++) host[i] = dev[i] = managed[i] = 2.0f, out[i] = -1.0f;
}

int main(int argc, char **argv)
{
    const int stub = argc > 1 && !strcmp(argv[1], "stub");
    setenv("LOOM_DEBUG", "none", 0);
    void (*init)(void) = NULL;
    void (*mark)(const void *, size_t, int) = NULL;
    if (stub) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (h) {
            *(void **)&init = dlsym(h, "stub_cuda_init");
            *(void **)&mark = dlsym(h, "stub_cuda_mark");
        }
        if (!init || !mark) {
            printf("no stub libcuda.so.1 loaded: skipped\n");
            return 77;
        }
        mark(dev, sizeof dev, 0);
        mark(managed, sizeof managed, 1);
    }
    loom_unique_id_t id;
    loom_comm_t comm;
    if (loom_get_unique_id(&id) != LOOM_SUCCESS ||
        loom_comm_init_rank(&comm, 1, &id, 0, NULL) != LOOM_SUCCESS) {
        printf("FAIL init: %s\n", loom_get_last_error());
        return 1;
    }
    fill();
    if (!stub && loomi_cuda_driver()) {
        printf("a CUDA driver is installed: no-driver case skipped\n");
        loom_comm_destroy(comm);
        return 77;
    }
    if (!stub) {
        truth(loomi_cuda_driver() == NULL && strstr(loomi_cuda_why(), "libcuda.so.1"),
              "no driver: loomi_cuda_driver is NULL and says why");
        truth(loomi_mem_kind(dev) == LOOMI_MEM_HOST && loomi_mem_kind(host) == LOOMI_MEM_HOST,
              "no driver: every pointer is host memory");
        expect(loom_allreduce(dev, out, 64, LOOM_FLOAT32, LOOM_SUM, comm), LOOM_SUCCESS, NULL,
               "no driver: the allreduce runs");
        truth(all(out, 2.0f), "... and gives its result");
        goto done;
    }
    truth(loomi_cuda_driver() != NULL, "the stub driver is loaded");
    truth(loomi_mem_kind(dev) == LOOMI_MEM_HOST,
          "driver not initialised: a marked buffer is host memory");
    expect(loom_allreduce(dev, out, 64, LOOM_FLOAT32, LOOM_SUM, comm), LOOM_SUCCESS, NULL,
           "driver not initialised: the buffer is used");
    init();
    truth(loomi_mem_kind(dev) == LOOMI_MEM_DEVICE && loomi_mem_kind(dev + 63) == LOOMI_MEM_DEVICE,
          "initialised: a marked buffer is device memory, to its last element");
    truth(loomi_mem_kind(managed) == LOOMI_MEM_MANAGED, "... a managed one managed memory");
    truth(loomi_mem_kind(host) == LOOMI_MEM_HOST && loomi_mem_kind(dev + 64) == LOOMI_MEM_HOST &&
              loomi_mem_kind(NULL) == LOOMI_MEM_HOST,
          "... the rest host memory");
    /* The stub answers pointer queries only: a driver without what
     * staging through host memory needs (src/comm/devbuf.c), so device
     * buffers are refused, saying which function is missing;
     * tests/gpu/test_devbuf.sh runs them with a driver that has it. */
    const char *why = "cannot be staged (libcuda.so.1 has no cuMemAllocHost)";
    fill();
    expect(loom_allreduce(dev, out, 64, LOOM_FLOAT32, LOOM_SUM, comm),
           LOOM_ERR_INVALID_ARGUMENT, "sendbuf", "a device sendbuf is refused");
    expect(loom_allreduce(dev, out, 64, LOOM_FLOAT32, LOOM_SUM, comm),
           LOOM_ERR_INVALID_ARGUMENT, why, "... saying why");
    truth(all(out, -1.0f), "... recvbuf untouched");
    expect(loom_allreduce(host, dev, 64, LOOM_FLOAT32, LOOM_SUM, comm),
           LOOM_ERR_INVALID_ARGUMENT, "recvbuf", "a device recvbuf is refused");
    truth(all(dev, 2.0f), "... and untouched");
    expect(loom_allreduce(dev, dev, 64, LOOM_FLOAT32, LOOM_SUM, comm),
           LOOM_ERR_INVALID_ARGUMENT, "device memory", "in place on device memory: refused");
    expect(loom_broadcast(dev + 8, dev + 8, 8, LOOM_FLOAT32, 0, comm),
           LOOM_ERR_INVALID_ARGUMENT, "device memory", "a broadcast inside a device buffer");
    expect(loom_allgather(host, dev, 64, LOOM_FLOAT32, comm), LOOM_ERR_INVALID_ARGUMENT,
           "recvbuf", "an allgather into device memory");
    expect(loom_allreduce(managed, out, 64, LOOM_FLOAT32, LOOM_SUM, comm), LOOM_SUCCESS, NULL,
           "a managed sendbuf is used");
    truth(all(out, 2.0f), "... and gives its result");
    expect(loom_allreduce(host, out, 64, LOOM_FLOAT32, LOOM_MAX, comm), LOOM_SUCCESS, NULL,
           "host buffers are used");
done:
    loom_comm_destroy(comm);
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
