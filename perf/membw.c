/*
 * membw.c - the memory bandwidth a job on this host can draw on: T
 * threads each copying its own SIZE-byte buffer with memcpy, the best of
 * R rounds.  Prints the bytes copied per second by all threads together
 * and the memory traffic (each byte copied is read once and written
 * once).  Used to derive the shared-memory bound of the allreduce.
 *
 *   membw [SIZE [THREADS [ROUNDS]]]    defaults: 64M, the online CPUs, 10
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static size_t size;
static int rounds;
static pthread_barrier_t bar;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *run(void *arg)
{
    double *best = arg;
    char *a = malloc(size), *b = malloc(size);
    if (!a || !b) return NULL;
    memset(a, 1, size); /* fault the pages in before timing */
    memset(b, 2, size);
    *best = 1e30;
    for (int i = 0; i < rounds; i++) {
        pthread_barrier_wait(&bar); /* all threads copy at the same time */
        double t = now();
        memcpy(b, a, size);
        t = now() - t;
        if (t < *best) *best = t;
    }
    free(a);
    free(b);
    return arg;
}

static size_t parse_size(const char *s)
{
    char *end;
    size_t v = strtoull(s, &end, 10);
    if (*end == 'K' || *end == 'k') v <<= 10;
    else if (*end == 'M' || *end == 'm') v <<= 20;
    else if (*end == 'G' || *end == 'g') v <<= 30;
    return v;
}

int main(int argc, char **argv)
{
    size = argc > 1 ? parse_size(argv[1]) : (size_t)64 << 20;
    int threads = argc > 2 ? atoi(argv[2]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    rounds = argc > 3 ? atoi(argv[3]) : 10;
    if (!size || threads < 1 || threads > 256 || rounds < 1) {
        fprintf(stderr, "usage: membw [SIZE [THREADS [ROUNDS]]]\n");
        return 2;
    }
    pthread_t t[256];
    double best[256];
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, run, &best[i]);
    double copied = 0;
    for (int i = 0; i < threads; i++) {
        void *r;
        pthread_join(t[i], &r);
        if (!r) {
            fprintf(stderr, "membw: out of memory\n");
            return 1;
        }
        copied += (double)size / best[i];
    }
    printf("membw: %d thread(s) x %zu bytes: memcpy %.2f GB/s, memory traffic %.2f GB/s\n",
           threads, size, copied / 1e9, 2 * copied / 1e9);
    return 0;
}
