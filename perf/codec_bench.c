/*
 * codec_bench - throughput of every built-in codec, in GB/s of fp32 input
 * (count * 4 bytes per second), on one core.
 *
 *   perf/codec_bench [count [seconds-per-case]]
 *
 * count defaults to 1M values (4 MiB, an engine chunk in cache or close
 * to it); run it with 16777216 for memory-bound numbers.  The kernel set
 * follows LOOM_REDUCE_ISA (generic, avx2, avx512) like the reductions.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Roughly normal values with a few outliers, like gradients. */
static void fill(float *x, size_t n)
{
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        float v = 0;
        for (int j = 0; j < 4; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            v += (float)(s >> 40) / (float)(1u << 24) - 0.5f;
        }
        x[i] = (i % 997 == 0) ? v * 50.0f : v * 0.01f;
    }
}

enum { ENCODE, DECODE, DECODE_ACC, REDUCE, ENCODE_EF };

static const char *const what_name[] = {"encode", "decode", "decode_acc",
                                        "reduce_enc", "encode_ef"};

static int run(const loom_codec_t *c, int what, const float *x, float *acc,
               unsigned char *a, unsigned char *b, size_t cap, size_t n,
               size_t *len, loom_codec_state_t st)
{
    loom_result_t r = LOOM_SUCCESS;
    switch (what) {
    case ENCODE: r = loom_codec_encode(c, x, n, a, cap, len, NULL); break;
    case DECODE: r = loom_codec_decode(c, a, *len, acc, n); break;
    case DECODE_ACC: r = loom_codec_decode_accumulate(c, a, *len, acc, n); break;
    case REDUCE: r = loom_codec_reduce_encoded(c, b, a, *len); break;
    case ENCODE_EF:
        r = loom_codec_encode_ef(c, st, 1, n, 0, x, n, a, cap, len, NULL);
        if (r == LOOM_SUCCESS) r = loom_codec_state_commit(st, 1);
        break;
    }
    if (r != LOOM_SUCCESS) {
        fprintf(stderr, "%s %s: %s\n", c->name, what_name[what],
                loom_get_last_error());
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 0) : (size_t)1 << 20;
    double secs = argc > 2 ? atof(argv[2]) : 0.3;
    static const char *const specs[] = {"bf16", "fp16",      "int8",      "int4",
                                        "fp4",  "topk:0.01", "topk:0.001"};
    float *x = malloc(n * sizeof *x), *acc = calloc(n, sizeof *acc);
    loom_codec_state_t st;
    if (!x || !acc || loom_codec_state_create(&st) != LOOM_SUCCESS) return 1;
    fill(x, n);
    printf("# %zu values (%.1f MiB fp32), GB/s of fp32 input, one core\n", n,
           (double)n * 4 / 1048576.0);
    printf("%-12s %10s %10s %10s %10s %10s %8s\n", "codec", "encode", "decode",
           "decode_acc", "reduce_enc", "encode_ef", "ratio");
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        const loom_codec_t *c;
        size_t cap, len = 0;
        if (loom_codec_find(specs[s], &c) != LOOM_SUCCESS ||
            loom_codec_max_encoded_bytes(c, n, &cap) != LOOM_SUCCESS)
            return 1;
        unsigned char *a = malloc(cap), *b = malloc(cap);
        if (!a || !b || run(c, ENCODE, x, acc, a, b, cap, n, &len, st)) return 1;
        memcpy(b, a, len);
        printf("%-12s", specs[s]);
        for (int what = ENCODE; what <= ENCODE_EF; what++) {
            if (what == REDUCE && !(c->props & LOOM_CODEC_ADDITIVE)) {
                printf(" %10s", "-");
                continue;
            }
            long iters = 0;
            double t0 = now(), t;
            do {
                if (run(c, what, x, acc, a, b, cap, n, &len, st)) return 1;
                iters++;
            } while ((t = now() - t0) < secs);
            if (what == REDUCE) /* b grew: encode it afresh */
                memcpy(b, a, len);
            printf(" %10.2f", (double)n * 4 * (double)iters / t / 1e9);
            fflush(stdout);
        }
        loom_codec_encode(c, x, n, a, cap, &len, NULL);
        printf(" %8.1f\n", (double)n * 4 / (double)len);
        free(a);
        free(b);
    }
    loom_codec_state_destroy(st);
    free(x);
    free(acc);
    return 0;
}
