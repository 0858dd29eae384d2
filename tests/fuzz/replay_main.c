/* Replays a fuzz harness's inputs without libFuzzer: every file in the
 * directories (or the files) named on the command line goes once
 * through LLVMFuzzerTestOneInput.  Built with the normal compiler into
 * make check's fuzz_*_replay programs, so the seed corpora and every
 * crash ever found (tests/fuzz/crashes/) stay regression tests where no
 * clang is installed.  A missing directory is skipped (a harness may
 * have no crashes yet).  "--seeds DIR" writes the harness's seed corpus
 * into DIR instead (fuzz_seeds). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            fprintf(stderr, "%s: out of memory\n", path);
            return 1;
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        cap *= 2;
        buf = realloc(buf, cap);
    }
    fclose(f);
    /* An exact-size copy, so reads past the end are caught as in libFuzzer. */
    unsigned char *exact = malloc(n ? n : 1);
    if (!exact) {
        free(buf);
        return 1;
    }
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--seeds") == 0) {
        mkdir(argv[2], 0777);
        return fuzz_seeds(argv[2]) ? 1 : 0;
    }
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int files = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) continue;
        if (!S_ISDIR(st.st_mode)) {
            bad += replay_file(argv[i]);
            files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') continue;
            size_t len = strlen(argv[i]) + strlen(e->d_name) + 2;
            char *p = malloc(len);
            if (!p) break;
            snprintf(p, len, "%s/%s", argv[i], e->d_name);
            if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) {
                bad += replay_file(p);
                files++;
            }
            free(p);
        }
        closedir(d);
    }
    printf("%s: %d inputs replayed\n", argv[0], files);
    return bad ? 1 : 0;
}
