/* test_uniform.c - the settings every rank must share (src/comm/uniform.c):
 * each one that differs is found and named with both values. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"

static struct loomi_settings base(void)
{
    struct loomi_settings s;
    cr_assert_eq(loomi_settings_resolve(&s, NULL, "test"), LOOM_SUCCESS);
    return s;
}

static int diff(const struct loomi_settings *a, const struct loomi_settings *b, char *msg,
                size_t n)
{
    int fa[LOOMI_MAX_COLLS] = {0}, fb[LOOMI_MAX_COLLS] = {0};
    struct loomi_uniform ua, ub;
    loomi_uniform_fill(&ua, a, fa, 3, 1);
    loomi_uniform_fill(&ub, b, fb, 3, 1);
    return loomi_uniform_diff(&ua, "rank 0", &ub, "rank 5", msg, n);
}

Test(uniform, same_settings_agree)
{
    struct loomi_settings a = base(), b = base();
    /* Settings that may differ between ranks are left out. */
    b.timeout_ms = 7;
    b.spin_us = 0;
    b.progress_thread = 1;
    snprintf(b.socket_ifname, sizeof b.socket_ifname, "eth9");
    /* An unfixed chunk size is the model's: its default value does not count. */
    b.chunk_bytes = 12345;
    char msg[320] = "";
    cr_assert_eq(diff(&a, &b, msg, sizeof msg), 0, "%s", msg);
}

#define ONE(field, value, name, text_a, text_b)                                        \
    do {                                                                               \
        struct loomi_settings a = base(), b = base();                                  \
        b.field = value;                                                               \
        char msg[320] = "";                                                            \
        cr_assert_eq(diff(&a, &b, msg, sizeof msg), 1, "%s not found", name);          \
        cr_assert(strstr(msg, name " differs between ranks: " text_a " on rank 0 and " \
                               text_b " on rank 5"),                                   \
                  "%s", msg);                                                          \
    } while (0)

Test(uniform, each_difference_named)
{
    ONE(shm_small, 0, "LOOM_SHM_SMALL", "64K", "0");
    ONE(shm_bytes, 8u << 20, "LOOM_SHM_SIZE", "4M", "8M");
    ONE(shm_stream, 3000, "LOOM_SHM_STREAM", "64M", "3000");
    ONE(shm_stream_saves, 1, "LOOM_SHM_STREAM_SAVES", "-1 (measured)", "1");
    ONE(shm_stream_copyin, 0, "LOOM_SHM_STREAM_COPYIN", "-1 (measured)", "0");
    ONE(probe, 0, "LOOM_PROBE", "1", "0");
    ONE(heartbeat_ms, 0, "LOOM_HEARTBEAT_MS", "500", "0");
    ONE(tcp_streams, 4, "LOOM_TCP_STREAMS", "2", "4");
    ONE(chunk_fixed, 1, "LOOM_CHUNK_SIZE", "unset (the model chooses)", "2M");
}

Test(uniform, single_copy_set_or_not)
{
    struct loomi_settings a = base(), b = base();
    /* The default's value, set on one side only: not the same setting. */
    b.shm_cma_fixed = 1;
    char msg[320] = "";
    cr_assert_eq(diff(&a, &b, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "LOOM_SHM_CMA differs between ranks: unset on rank 0 and 128K on rank 5"),
              "%s", msg);
    a.shm_cma_fixed = 1;
    a.shm_cma_min = 0;
    cr_assert_eq(diff(&a, &b, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "0 (never) on rank 0"), "%s", msg);
    a.shm_cma_min = b.shm_cma_min;
    cr_assert_eq(diff(&a, &b, msg, sizeof msg), 0, "%s", msg);
}

Test(uniform, algorithms_and_transport)
{
    struct loomi_settings s = base();
    int fa[LOOMI_MAX_COLLS] = {0}, fb[LOOMI_MAX_COLLS] = {0};
    fb[LOOMI_COLL_ALLGATHER] = LOOMI_ALGO_RING;
    struct loomi_uniform ua, ub;
    loomi_uniform_fill(&ua, &s, fa, 3, 0);
    loomi_uniform_fill(&ub, &s, fb, 3, 0);
    char msg[320] = "";
    cr_assert_eq(loomi_uniform_diff(&ua, "rank 0", &ub, "rank 1", msg, sizeof msg), 1);
    cr_assert(strstr(msg, "LOOM_ALGO differs between ranks: the allgather is automatic on rank 0 "
                          "and ring on rank 1"),
              "%s", msg);
    struct loomi_settings t = s;
    snprintf(t.transport, sizeof t.transport, "tcp");
    loomi_uniform_fill(&ub, &t, fa, 1, 0);
    cr_assert_eq(loomi_uniform_diff(&ua, "rank 0", &ub, "rank 1", msg, sizeof msg), 1);
    cr_assert(strstr(msg, "LOOM_TRANSPORT differs between ranks: unset (every transport) on "
                          "rank 0 and tcp on rank 1"),
              "%s", msg);
}

Test(uniform, transport_from_the_network_unterminated)
{
    /* A block off the network whose transport fills its field without a
     * NUL: the message holds the field's bytes and no more. */
    struct loomi_settings s = base();
    int f[LOOMI_MAX_COLLS] = {0};
    struct loomi_uniform ua, ub;
    loomi_uniform_fill(&ua, &s, f, 3, 0);
    loomi_uniform_fill(&ub, &s, f, 1, 0);
    memset(ub.transport, 'x', sizeof ub.transport);
    char msg[320] = "", want[sizeof ub.transport + 32];
    cr_assert_eq(loomi_uniform_diff(&ua, "rank 0", &ub, "rank 1", msg, sizeof msg), 1);
    snprintf(want, sizeof want, "and %.*s on rank 1", (int)sizeof ub.transport, ub.transport);
    cr_assert(strstr(msg, want), "%s", msg);
}

Test(uniform, tuning_file_by_content)
{
    char p1[] = "/tmp/loom-uniform-XXXXXX", p2[] = "/tmp/loom-uniform-XXXXXX";
    int f1 = mkstemp(p1), f2 = mkstemp(p2);
    cr_assert(f1 >= 0 && f2 >= 0);
    cr_assert_eq(write(f1, "alpha_intra 3e-6\n", 17), 17);
    cr_assert_eq(write(f2, "alpha_intra 3e-6\n", 17), 17);
    close(f1);
    close(f2);
    struct loomi_settings a = base(), b = base();
    snprintf(a.tuning_file, sizeof a.tuning_file, "%s", p1);
    snprintf(b.tuning_file, sizeof b.tuning_file, "%s", p2);
    char msg[320] = "";
    /* Two paths, one content: the same tuning. */
    cr_assert_eq(diff(&a, &b, msg, sizeof msg), 0, "%s", msg);
    f2 = open(p2, O_WRONLY | O_APPEND);
    cr_assert_eq(write(f2, "beta_intra 1e-10\n", 17), 17);
    close(f2);
    cr_assert_eq(diff(&a, &b, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "LOOM_TUNING_FILE differs between ranks: a file whose content hashes"),
              "%s", msg);
    unlink(p2);
    cr_assert_eq(diff(&a, &b, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "a file it could not read on rank 5"), "%s", msg);
    b.tuning_file[0] = '\0';
    cr_assert_eq(diff(&a, &b, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "unset on rank 5"), "%s", msg);
    unlink(p1);
}
