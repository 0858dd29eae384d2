/*
 * membw.c - the memory bandwidth a job on this host can draw on: T
 * threads each copying its own SIZE-byte buffer with memcpy, the best of
 * R rounds.  Prints the bytes copied per second by all threads together
 * and the memory traffic (each byte copied is read once and written
 * once).  Used to derive the shared-memory bound of the allreduce.
 *
 * On x86 it also copies with streaming (non-temporal) stores, which do
 * not read a line before overwriting it: glibc's memcpy uses them only
 * past a threshold derived from the cache size (a large part of the L3;
 * see perf/NOTES.md, "membw.c"), so below it a memcpy moves three bytes
 * through memory per byte copied but counts two, like STREAM's Copy.
 * The second line is the traffic the memory sustains when nothing is
 * read for ownership.  The third copies two streams at once per thread,
 * which some memories sustain faster than one.
 *
 * Then one process reads another's buffer with the kernel's single copy
 * (process_vm_readv, what shared memory uses for large messages between
 * heap buffers), in 2 MiB pieces: the best of R rounds, and the first
 * round apart, which writes into pages the kernel had not yet written.
 * On a paravirtualized VM (its kernel's symbols say PVM, which shadows
 * page tables), that first round can run an order of magnitude slower
 * than the others: the kernel's first write to each page of the new
 * buffer is dear there (perf/NOTES.md, "membw.c").
 *
 * With two CPUs or more, the last line gives how long CPUs 0 and 1 take
 * to hand a cache line back and forth: what a rank waits to read what
 * another has just written.  On a VM it can change several times over
 * from one run to the next (the hypervisor moves its cores), and the
 * allreduce's share of the bound moves with it (perf/NOTES.md,
 * "membw.c").
 *
 *   membw [SIZE [THREADS [ROUNDS]]]    defaults: 64M, the online CPUs, 10
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_setaffinity_np */
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "size_arg.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

static size_t size;
static int rounds;
static pthread_barrier_t bar;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* dst = src with non-temporal stores (size a multiple of 64, both
 * 64-byte aligned); plain memcpy where there are none. */
static void copy_nt(char *d, const char *s, size_t n)
{
#if defined(__x86_64__)
    for (size_t i = 0; i < n; i += 64) {
        __m128i a = _mm_load_si128((const __m128i *)(const void *)(s + i));
        __m128i b = _mm_load_si128((const __m128i *)(const void *)(s + i + 16));
        __m128i c = _mm_load_si128((const __m128i *)(const void *)(s + i + 32));
        __m128i e = _mm_load_si128((const __m128i *)(const void *)(s + i + 48));
        _mm_stream_si128((__m128i *)(void *)(d + i), a);
        _mm_stream_si128((__m128i *)(void *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(void *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(void *)(d + i + 48), e);
    }
    _mm_sfence();
#else
    memcpy(d, s, n);
#endif
}

/* The same with two copies interleaved (each half of s to the same half
 * of d): two loads and two stores in flight per step, as when a rank
 * reduces two inputs and writes the result to two places (the window
 * allreduce's push), which draws more from the memory than one stream. */
static void copy2_nt(char *d, const char *s, size_t n)
{
#if defined(__x86_64__)
    const size_t h = n / 2 / 64 * 64;
    for (size_t i = 0; i < h; i += 64)
        for (size_t j = 0; j < 64; j += 16) {
            __m128i a = _mm_load_si128((const __m128i *)(const void *)(s + i + j));
            __m128i b = _mm_load_si128((const __m128i *)(const void *)(s + h + i + j));
            _mm_stream_si128((__m128i *)(void *)(d + i + j), a);
            _mm_stream_si128((__m128i *)(void *)(d + h + i + j), b);
        }
    _mm_sfence();
    memcpy(d + 2 * h, s + 2 * h, n - 2 * h);
#else
    memcpy(d, s, n);
#endif
}

static void *run(void *arg)
{
    double *best = arg;
    char *a = aligned_alloc(64, size), *b = aligned_alloc(64, size);
    if (!a || !b) return NULL;
    memset(a, 1, size); /* fault the pages in before timing */
    memset(b, 2, size);
    best[0] = best[1] = best[2] = 1e30;
    for (int i = 0; i < 3 * rounds; i++) {
        int nt = i % 3; /* the three kinds take turns */
        pthread_barrier_wait(&bar); /* all threads copy at the same time */
        double t = now();
        if (nt == 2) copy2_nt(b, a, size);
        else if (nt) copy_nt(b, a, size);
        else memcpy(b, a, size);
        t = now() - t;
        if (t < best[nt]) best[nt] = t;
    }
    free(a);
    free(b);
    return arg;
}

/* The hand-off: a line that CPU 0 and CPU 1 write in turn (-1: CPU 0
 * gave up waiting, and the answer must stop waiting too). */
#define HANDOFFS 100000
static _Alignas(64) atomic_int line;

static int pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *answer(void *arg)
{
    if (pin(1)) return NULL;
    for (int i = 0; i < HANDOFFS; i++) {
        int v;
        while ((v = atomic_load(&line)) != 2 * i + 1)
            if (v < 0) return NULL;
        atomic_store(&line, 2 * i + 2);
    }
    return arg;
}

/* ns per round trip between CPUs 0 and 1; 0 where they cannot be had. */
static double handoff_ns(void)
{
    pthread_t t;
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || pin(0)) return 0;
    atomic_store(&line, 0);
    if (pthread_create(&t, NULL, answer, &line)) return 0;
    double t0 = now();
    for (int i = 0; i < HANDOFFS; i++) {
        atomic_store(&line, 2 * i + 1);
        /* bounded: the answering thread ends at once if it could not
         * be pinned, and otherwise when told to */
        for (long spin = 0; atomic_load(&line) != 2 * i + 2; spin++)
            if (spin > 100000000L) {
                atomic_store(&line, -1);
                pthread_join(t, NULL);
                return 0;
            }
    }
    double dt = now() - t0;
    void *r;
    pthread_join(t, &r);
    return r ? dt / HANDOFFS * 1e9 : 0;
}

/* A child holds a SIZE-byte buffer that this process reads with
 * process_vm_readv (a child: where ptrace is restricted, only ancestors
 * may).  Bytes per second of the first round and of the best of the
 * others; 0 where the kernel will not do it. */
#define PIECE ((size_t)2 << 20)
static int single_copy(double *first, double *best)
{
    int up[2], down[2];
    if (pipe(up) || pipe(down)) return 0;
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        char *s = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (s == MAP_FAILED) s = NULL;
        if (s) memset(s, 3, size);
        if (write(up[1], &s, sizeof s) != (ssize_t)sizeof s) _exit(1);
        char c;
        /* until the reader is done, or gone */
        while (read(down[0], &c, 1) < 0) {}
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    char *src = NULL;
    int ok = read(up[0], &src, sizeof src) == (ssize_t)sizeof src && src;
    char *d = ok ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                 : MAP_FAILED;
    ok = d != MAP_FAILED;
    if (ok) memset(d, 4, size); /* faulted in, as the copies of run() */
    *first = *best = 0;
    for (int i = 0; ok && i <= rounds; i++) {
        double t = now();
        for (size_t o = 0; ok && o < size; o += PIECE) {
            size_t n = size - o < PIECE ? size - o : PIECE;
            struct iovec l = {d + o, n}, r = {src + o, n};
            ok = process_vm_readv(pid, &l, 1, &r, 1, 0) == (ssize_t)n;
        }
        t = now() - t;
        double bw = ok ? (double)size / t : 0;
        if (!i) *first = bw;
        else if (bw > *best) *best = bw;
    }
    ok = ok && d[size - 1] == 3;
    if (d != MAP_FAILED) munmap(d, size);
    close(down[1]); /* the child's read ends */
    close(up[0]);
    waitpid(pid, NULL, 0);
    return ok;
}

int main(int argc, char **argv)
{
    size = argc > 1 ? size_arg(argv[1]) : (size_t)64 << 20;
    size = (size + 63) & ~(size_t)63; /* aligned_alloc and the 64-byte copy loop */
    int threads = argc > 2 ? atoi(argv[2]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    rounds = argc > 3 ? atoi(argv[3]) : 10;
    if (!size || threads < 1 || threads > 256 || rounds < 1) {
        fprintf(stderr, "usage: membw [SIZE [THREADS [ROUNDS]]]\n");
        return 2;
    }
    pthread_t t[256];
    double best[256][3];
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, run, &best[i]);
    double copied = 0, streamed = 0, streamed2 = 0;
    for (int i = 0; i < threads; i++) {
        void *r;
        pthread_join(t[i], &r);
        if (!r) {
            fprintf(stderr, "membw: out of memory\n");
            return 1;
        }
        copied += (double)size / best[i][0];
        streamed += (double)size / best[i][1];
        streamed2 += (double)size / best[i][2];
    }
    printf("membw: %d thread(s) x %zu bytes: memcpy %.2f GB/s, memory traffic %.2f GB/s\n",
           threads, size, copied / 1e9, 2 * copied / 1e9);
#if defined(__x86_64__)
    printf("membw: streaming stores %.2f GB/s, memory traffic %.2f GB/s\n", streamed / 1e9,
           2 * streamed / 1e9);
    printf("membw: two streaming copies at once %.2f GB/s, memory traffic %.2f GB/s\n",
           streamed2 / 1e9, 2 * streamed2 / 1e9);
#endif
    double first, cma;
    if (single_copy(&first, &cma))
        printf("membw: one process reading another's buffer (process_vm_readv, 2 MiB pieces) "
               "%.2f GB/s, memory traffic %.2f GB/s; its first round, into new pages, %.2f GB/s\n",
               cma / 1e9, 2 * cma / 1e9, first / 1e9);
    double h = handoff_ns();
    if (h > 0) printf("membw: CPUs 0 and 1 hand a cache line back and forth in %.0f ns\n", h);
    return 0;
}
