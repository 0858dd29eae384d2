/*
 * mp_memreg.c - one rank of the memory-registration test (run under
 * loomrun; over verbs inside the soft-RoCE VM, over shm/TCP elsewhere).
 *
 * RDMA writes land in the physical pages a registration pinned.  If a
 * registration outlived the mapping it was made for, a later operation
 * on new memory at the same address would send into the old pages and
 * the result would be wrong.  So, for several rounds, each rank maps a
 * fresh region (at the address the previous round unmapped, when the
 * kernel gives it back), fills it, allreduces it in place and out of
 * place, checks every element, and unmaps it:
 *   - "registered": loom_mem_register around the operations, then
 *     loom_mem_deregister before munmap;
 *   - "cached": no registration (Loom's own, dropped when idle);
 *   - "reused": one registration kept over many operations on the same
 *     memory with changing contents.
 * Sizes are above the verbs transport's eager limit, so the data moves by
 * RDMA writes into the receivers' buffers.
 * Exit 0 only when every element of every round matched.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "loom.h"

static int rank, nranks, failures;
static loom_comm_t comm;

static void die(const char *what, loom_result_t r)
{
    fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, what, loom_strerror(r), loom_get_last_error());
    exit(1);
}

/* Element i of rank r in round k, and the sum over ranks. */
static float val(int r, int k, size_t i) { return (float)((r + 1) * (k + 1) + (int)(i % 7)); }
static float sum(int k, size_t i)
{
    return (float)((k + 1) * nranks * (nranks + 1) / 2 + nranks * (int)(i % 7));
}

static void check(const char *mode, int k, const float *x, size_t n)
{
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (x[i] != sum(k, i) && bad++ == 0) first = i;
    if (bad) {
        failures++;
        fprintf(stderr, "rank %d: FAIL %s round %d: %zu of %zu wrong, first [%zu] = %g, want %g\n",
                rank, mode, k, bad, n, first, x[first], sum(k, first));
    }
}

static void *map(void *hint, size_t bytes)
{
    void *p = mmap(hint, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 6;
    size_t n = (size_t)(argc > 2 ? atol(argv[2]) : 1 << 18); /* 1 MiB of floats */
    size_t bytes = n * sizeof(float);
    loom_result_t r;
    if ((r = loom_comm_init_env(&comm, NULL)) != LOOM_SUCCESS) die("init", r);
    loom_comm_rank(comm, &rank);
    loom_comm_size(comm, &nranks);

    void *hint = NULL;
    int same = 0;
    for (int mode = 0; mode < 2; mode++) {
        const char *name = mode ? "cached" : "registered";
        for (int k = 0; k < rounds; k++) {
            /* Two regions: the in-place buffer and the out-of-place output. */
            float *a = map(hint, 2 * bytes), *b = a + n;
            if (hint && (void *)a == hint) same++;
            hint = a;
            loom_mem_t h = NULL;
            if (mode == 0 && (r = loom_mem_register(comm, a, 2 * bytes, &h)) != LOOM_SUCCESS)
                die("loom_mem_register", r);
            for (size_t i = 0; i < n; i++) a[i] = val(rank, k, i);
            if ((r = loom_allreduce(a, b, n, LOOM_FLOAT32, LOOM_SUM, comm)) != LOOM_SUCCESS)
                die("loom_allreduce (out of place)", r);
            check(name, k, b, n);
            if ((r = loom_allreduce(a, a, n, LOOM_FLOAT32, LOOM_SUM, comm)) != LOOM_SUCCESS)
                die("loom_allreduce (in place)", r);
            check(name, k, a, n);
            if (h && (r = loom_mem_deregister(comm, h)) != LOOM_SUCCESS)
                die("loom_mem_deregister", r);
            munmap(a, 2 * bytes);
        }
    }
    /* One registration, many operations, the contents changing. */
    float *a = map(NULL, bytes);
    loom_mem_t h;
    if ((r = loom_mem_register(comm, a, bytes, &h)) != LOOM_SUCCESS) die("loom_mem_register", r);
    for (int k = 0; k < rounds; k++) {
        for (size_t i = 0; i < n; i++) a[i] = val(rank, k, i);
        if ((r = loom_allreduce(a, a, n, LOOM_FLOAT32, LOOM_SUM, comm)) != LOOM_SUCCESS)
            die("loom_allreduce (reused)", r);
        check("reused", k, a, n);
    }
    if ((r = loom_mem_deregister(comm, h)) != LOOM_SUCCESS) die("loom_mem_deregister", r);
    munmap(a, bytes);
    if ((r = loom_comm_destroy(comm)) != LOOM_SUCCESS) die("destroy", r);
    if (rank == 0)
        printf("rank 0 of %d: %d rounds x 2 modes + %d reuses of %zu floats, new mappings at the "
               "old address %d of %d times: %s\n",
               nranks, rounds, rounds, n, same, 2 * rounds - 1, failures ? "FAIL" : "OK");
    return failures ? 1 : 0;
}
