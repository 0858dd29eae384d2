/* What every harness of tests/fuzz shares: the libFuzzer entry point,
 * and the seed writer that replay_main's --seeds calls (each harness
 * writes its seed corpus with the library's real encoders).  The
 * transport harnesses share more in fuzz_xfer.h. */
#ifndef LOOM_TESTS_FUZZ_H
#define LOOM_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Writes the harness's seeds into dir (which exists); 0 when done. */
int fuzz_seeds(const char *dir);

/* dir/name = bytes[0..n). */
static inline int fuzz_write_seed(const char *dir, const char *name, const void *bytes, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int bad = n && fwrite(bytes, 1, n, f) != n;
    return fclose(f) || bad ? -1 : 0;
}



/* LLVMFuzzerInitialize for harnesses whose library code logs what a bad
 * peer did: quiet (LOOM_DEBUG=none unless set), so fuzzing is not
 * writing to stderr.  One use per harness. */
#define FUZZ_QUIET_INIT                                                                    \
    int LLVMFuzzerInitialize(int *argc, char ***argv);                                     \
    int LLVMFuzzerInitialize(int *argc, char ***argv)                                      \
    {                                                                                      \
        (void)argc;                                                                        \
        (void)argv;                                                                        \
        setenv("LOOM_DEBUG", "none", 0);                                                   \
        return 0;                                                                          \
    }
#endif
