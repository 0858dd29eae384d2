/*
 * test_api.c - argument validation of every public function: a bad
 * argument gives the documented code, a message naming the argument, and
 * leaves every buffer untouched.  A one-rank communicator (made through
 * the unique-id path in this process) serves the calls that need one.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/comm.h"
#include "loom.h"

static loom_comm_t comm;

static void setup(void)
{
    setenv("LOOM_DEBUG", "none", 1);
    loom_unique_id_t id;
    cr_assert_eq(loom_get_unique_id(&id), LOOM_SUCCESS, "%s", loom_get_last_error());
    cr_assert_eq(loom_comm_init_rank(&comm, 1, &id, 0, NULL), LOOM_SUCCESS, "%s",
                 loom_get_last_error());
}

static void teardown(void)
{
    if (comm) cr_assert_eq(loom_comm_destroy(comm), LOOM_SUCCESS);
    comm = NULL;
}

TestSuite(api, .init = setup, .fini = teardown);

#define EXPECT_ERR(call, code, word)                                                         \
    do {                                                                                     \
        loom_result_t r_ = (call);                                                           \
        cr_assert_eq(r_, (code), "%s returned %d (%s)", #call, r_, loom_get_last_error());   \
        cr_assert(strstr(loom_get_last_error(), (word)) != NULL,                             \
                  "message '%s' does not name '%s'", loom_get_last_error(), (word));         \
    } while (0)

Test(api, strerror_covers_every_code)
{
    for (int c = 0; c <= 13; c++) {
        const char *s = loom_strerror((loom_result_t)c);
        cr_assert(s != NULL && *s);
    }
    cr_assert_str_eq(loom_strerror(LOOM_SUCCESS), "success");
    cr_assert_str_eq(loom_strerror((loom_result_t)999), "unknown result code");
}

Test(api, datatype_sizes)
{
    size_t want[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
    for (int t = 0; t < LOOM_NUM_DATATYPES; t++)
        cr_assert_eq(loom_datatype_size((loom_datatype_t)t), want[t], "type %d", t);
    cr_assert_eq(loom_datatype_size((loom_datatype_t)-1), 0);
    cr_assert_eq(loom_datatype_size(LOOM_NUM_DATATYPES), 0);
}

Test(api, config_init)
{
    loom_config_t c;
    memset(&c, 0xff, sizeof c);
    cr_assert_eq(loom_config_init(&c), LOOM_SUCCESS);
    cr_assert_eq(c.size, sizeof c);
    cr_assert_eq(c.version, LOOM_CONFIG_VERSION);
    cr_assert_eq(c.timeout_ms, 0);
    cr_assert_null(c.algo);
    EXPECT_ERR(loom_config_init(NULL), LOOM_ERR_INVALID_ARGUMENT, "cfg");
}

Test(api, version)
{
    int a = -1, b = -1, c = -1;
    cr_assert_eq(loom_get_version(&a, &b, &c), LOOM_SUCCESS);
    cr_assert_eq(a * 10000 + b * 100 + c, LOOM_VERSION_CODE);
    cr_assert_eq(loom_get_version(NULL, NULL, NULL), LOOM_SUCCESS);
}

Test(api, rank_size_and_error)
{
    int r = -1, n = -1, f = 7;
    cr_assert_eq(loom_comm_rank(comm, &r), LOOM_SUCCESS);
    cr_assert_eq(loom_comm_size(comm, &n), LOOM_SUCCESS);
    cr_assert_eq(r, 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(loom_comm_get_error(comm, &f), LOOM_SUCCESS);
    cr_assert_eq(f, -1);
    EXPECT_ERR(loom_comm_rank(comm, NULL), LOOM_ERR_INVALID_ARGUMENT, "rank");
    EXPECT_ERR(loom_comm_size(comm, NULL), LOOM_ERR_INVALID_ARGUMENT, "size");
    EXPECT_ERR(loom_comm_rank(NULL, &r), LOOM_ERR_INVALID_ARGUMENT, "comm");
    EXPECT_ERR(loom_comm_size(NULL, &n), LOOM_ERR_INVALID_ARGUMENT, "comm");
    EXPECT_ERR(loom_comm_get_error(NULL, &f), LOOM_ERR_INVALID_ARGUMENT, "comm");
}

/* loom_comm_set_algo: a spec replaces the whole setting, a bad one is
 * refused naming the argument and leaves the setting as it was. */
Test(api, set_algo)
{
    const int AR = LOOMI_COLL_ALLREDUCE, AG = LOOMI_COLL_ALLGATHER;
    cr_assert_eq(loom_comm_set_algo(comm, "allreduce:ring,allgather:recursive_doubling"),
                 LOOM_SUCCESS, "%s", loom_get_last_error());
    cr_assert_eq(loomi_comm_get(comm)->algo_forced[AR], LOOMI_ALGO_RING);
    cr_assert_eq(loomi_comm_get(comm)->algo_forced[AG], LOOMI_ALGO_RECURSIVE_DOUBLING);
    EXPECT_ERR(loom_comm_set_algo(comm, "allreduce:nonsense"), LOOM_ERR_INVALID_ARGUMENT,
               "loom_comm_set_algo: spec");
    EXPECT_ERR(loom_comm_set_algo(comm, "nocoll:ring"), LOOM_ERR_INVALID_ARGUMENT, "nocoll");
    cr_assert_eq(loomi_comm_get(comm)->algo_forced[AR], LOOMI_ALGO_RING, "a bad spec changed the setting");
    cr_assert_eq(loomi_comm_get(comm)->algo_forced[AG], LOOMI_ALGO_RECURSIVE_DOUBLING);
    /* Replaces, not merges: allreduce goes back to the automatic choice. */
    cr_assert_eq(loom_comm_set_algo(comm, "allgather:ring"), LOOM_SUCCESS);
    cr_assert_eq(loomi_comm_get(comm)->algo_forced[AR], LOOMI_ALGO_AUTO);
    cr_assert_eq(loomi_comm_get(comm)->algo_forced[AG], LOOMI_ALGO_RING);
    cr_assert_eq(loom_comm_set_algo(comm, "auto"), LOOM_SUCCESS);
    cr_assert_eq(loomi_comm_get(comm)->algo_forced[AG], LOOMI_ALGO_AUTO);
    cr_assert_eq(loom_comm_set_algo(comm, "ring"), LOOM_SUCCESS);
    cr_assert_eq(loomi_comm_get(comm)->algo_forced[AR], LOOMI_ALGO_RING);
    cr_assert_eq(loom_comm_set_algo(comm, NULL), LOOM_SUCCESS);
    cr_assert_eq(loomi_comm_get(comm)->algo_forced[AR], LOOMI_ALGO_AUTO);
    EXPECT_ERR(loom_comm_set_algo(NULL, "ring"), LOOM_ERR_INVALID_ARGUMENT, "comm");
    /* A forced algorithm runs and gives the right answer. */
    cr_assert_eq(loom_comm_set_algo(comm, "allreduce:ring"), LOOM_SUCCESS);
    float in[5] = {1, 2, 3, 4, 5}, out[5] = {0};
    cr_assert_eq(loom_allreduce(in, out, 5, LOOM_FLOAT32, LOOM_SUM, comm), LOOM_SUCCESS, "%s",
                 loom_get_last_error());
    cr_assert_arr_eq(in, out, sizeof in);
}

Test(api, allreduce_bad_arguments_touch_nothing)
{
    float s[8], d[8];
    for (int i = 0; i < 8; i++) s[i] = (float)i, d[i] = -1.0f;
    EXPECT_ERR(loom_allreduce(s, d, 8, (loom_datatype_t)42, LOOM_SUM, comm),
               LOOM_ERR_INVALID_ARGUMENT, "dtype");
    EXPECT_ERR(loom_allreduce(s, d, 8, LOOM_FLOAT32, (loom_op_t)9, comm),
               LOOM_ERR_INVALID_ARGUMENT, "op");
    EXPECT_ERR(loom_allreduce(NULL, d, 8, LOOM_FLOAT32, LOOM_SUM, comm),
               LOOM_ERR_INVALID_ARGUMENT, "sendbuf");
    EXPECT_ERR(loom_allreduce(s, NULL, 8, LOOM_FLOAT32, LOOM_SUM, comm),
               LOOM_ERR_INVALID_ARGUMENT, "recvbuf");
    EXPECT_ERR(loom_allreduce(s, s + 1, 4, LOOM_FLOAT32, LOOM_SUM, comm),
               LOOM_ERR_INVALID_ARGUMENT, "overlap");
    EXPECT_ERR(loom_allreduce(s, d, SIZE_MAX / 2, LOOM_FLOAT32, LOOM_SUM, comm),
               LOOM_ERR_INVALID_ARGUMENT, "count");
    EXPECT_ERR(loom_allreduce(s, d, 8, LOOM_FLOAT32, LOOM_SUM, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "comm");
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(s[i], (float)i);
        cr_assert_eq(d[i], -1.0f);
    }
    /* count 0 with NULL buffers is a valid no-op. */
    cr_assert_eq(loom_allreduce(NULL, NULL, 0, LOOM_FLOAT32, LOOM_SUM, comm), LOOM_SUCCESS);
    /* ... and the communicator still works. */
    cr_assert_eq(loom_allreduce(s, d, 8, LOOM_FLOAT32, LOOM_AVG, comm), LOOM_SUCCESS);
    for (int i = 0; i < 8; i++) cr_assert_eq(d[i], (float)i);
}

Test(api, iallreduce_wait_test)
{
    double s[5] = {1, 2, 3, 4, 5}, d[5] = {0};
    loom_request_t req = LOOM_REQUEST_NULL;
    EXPECT_ERR(loom_iallreduce(s, d, 5, LOOM_FLOAT64, LOOM_SUM, comm, NULL),
               LOOM_ERR_INVALID_ARGUMENT, "req");
    EXPECT_ERR(loom_iallreduce(s, d, 5, (loom_datatype_t)-3, LOOM_SUM, comm, &req),
               LOOM_ERR_INVALID_ARGUMENT, "dtype");
    cr_assert_eq(req, LOOM_REQUEST_NULL);
    cr_assert_eq(loom_iallreduce(s, d, 5, LOOM_FLOAT64, LOOM_MAX, comm, &req), LOOM_SUCCESS);
    int done = 0;
    for (int i = 0; i < 1000 && !done; i++)
        cr_assert_eq(loom_test(&req, &done), LOOM_SUCCESS);
    cr_assert_eq(done, 1);
    cr_assert_eq(req, LOOM_REQUEST_NULL);
    for (int i = 0; i < 5; i++) cr_assert_eq(d[i], s[i]);
    cr_assert_eq(loom_wait(&req), LOOM_SUCCESS, "waiting on a null request is a no-op");
    EXPECT_ERR(loom_wait(NULL), LOOM_ERR_INVALID_ARGUMENT, "req");
    EXPECT_ERR(loom_test(NULL, &done), LOOM_ERR_INVALID_ARGUMENT, "req");
    EXPECT_ERR(loom_test(&req, NULL), LOOM_ERR_INVALID_ARGUMENT, "done");
}

Test(api, destroy_with_pending_request_refused)
{
    float x = 1;
    loom_request_t req;
    cr_assert_eq(loom_iallreduce(&x, &x, 1, LOOM_FLOAT32, LOOM_SUM, comm, &req), LOOM_SUCCESS);
    /* Finished or not, a request not yet waited for holds the communicator. */
    cr_assert_neq(req, LOOM_REQUEST_NULL);
    EXPECT_ERR(loom_comm_destroy(comm), LOOM_ERR_INVALID_USAGE, "pending");
    cr_assert_eq(loom_wait(&req), LOOM_SUCCESS);
    cr_assert_eq(x, 1.0f);
    EXPECT_ERR(loom_comm_destroy(NULL), LOOM_ERR_INVALID_ARGUMENT, "comm");
    EXPECT_ERR(loom_comm_abort(NULL), LOOM_ERR_INVALID_ARGUMENT, "comm");
}

Test(api, abort_releases_pending_requests)
{
    float x[64] = {0};
    loom_request_t req;
    cr_assert_eq(loom_iallreduce(x, x, 64, LOOM_FLOAT32, LOOM_SUM, comm, &req), LOOM_SUCCESS);
    /* The request is freed with the communicator (LeakSanitizer checks). */
    cr_assert_eq(loom_comm_abort(comm), LOOM_SUCCESS);
    comm = NULL;
}

Test(api_init, init_bad_arguments)
{
    setenv("LOOM_DEBUG", "none", 1);
    loom_unique_id_t id;
    loom_comm_t c = (loom_comm_t)0x1;
    memset(&id, 0, sizeof id);
    EXPECT_ERR(loom_comm_init_rank(NULL, 2, &id, 0, NULL), LOOM_ERR_INVALID_ARGUMENT, "comm");
    EXPECT_ERR(loom_comm_init_rank(&c, 2, NULL, 0, NULL), LOOM_ERR_INVALID_ARGUMENT, "id");
    EXPECT_ERR(loom_comm_init_rank(&c, 0, &id, 0, NULL), LOOM_ERR_INVALID_ARGUMENT, "nranks");
    EXPECT_ERR(loom_comm_init_rank(&c, 2, &id, 2, NULL), LOOM_ERR_INVALID_ARGUMENT, "rank");
    EXPECT_ERR(loom_comm_init_rank(&c, 2, &id, -1, NULL), LOOM_ERR_INVALID_ARGUMENT, "rank");
    EXPECT_ERR(loom_comm_init_rank(&c, 2, &id, 0, NULL), LOOM_ERR_INVALID_ARGUMENT, "loom_get_unique_id");
    cr_assert_eq(c, (loom_comm_t)0x1, "comm untouched on argument errors");
    EXPECT_ERR(loom_get_unique_id(NULL), LOOM_ERR_INVALID_ARGUMENT, "id");
    EXPECT_ERR(loom_comm_init_env(NULL, NULL), LOOM_ERR_INVALID_ARGUMENT, "comm");
}

Test(api_init, bad_config)
{
    setenv("LOOM_DEBUG", "none", 1);
    loom_unique_id_t id;
    loom_comm_t c = NULL;
    cr_assert_eq(loom_get_unique_id(&id), LOOM_SUCCESS);
    loom_config_t cfg;
    loom_config_init(&cfg);
    cfg.tcp_streams = 99;
    EXPECT_ERR(loom_comm_init_rank(&c, 1, &id, 0, &cfg), LOOM_ERR_INVALID_ARGUMENT, "tcp_streams");
    loom_config_init(&cfg);
    cfg.size = 3;
    EXPECT_ERR(loom_comm_init_rank(&c, 1, &id, 0, &cfg), LOOM_ERR_INVALID_ARGUMENT, "size");
    loom_config_init(&cfg);
    cfg.algo = "allreduce:nonsense";
    EXPECT_ERR(loom_comm_init_rank(&c, 1, &id, 0, &cfg), LOOM_ERR_INVALID_ARGUMENT, "ring");
    loom_config_init(&cfg);
    cfg.transport = "carrier-pigeon";
    EXPECT_ERR(loom_comm_init_rank(&c, 1, &id, 0, &cfg), LOOM_ERR_UNSUPPORTED, "tcp");
    /* A good config still works on the same id. */
    loom_config_init(&cfg);
    cfg.algo = "allreduce:ring";
    cfg.tcp_streams = 3;
    cr_assert_eq(loom_comm_init_rank(&c, 1, &id, 0, &cfg), LOOM_SUCCESS, "%s", loom_get_last_error());
    cr_assert_eq(loom_comm_destroy(c), LOOM_SUCCESS);
}

/* Every new collective: each bad argument named, nothing touched. */
Test(api, collectives_bad_arguments_touch_nothing)
{
    int32_t a[8], b[8];
    for (int i = 0; i < 8; i++) a[i] = i, b[i] = 100 + i;
    size_t one = 1, zero = 0;
    EXPECT_ERR(loom_reduce_scatter(NULL, b, 4, LOOM_INT32, LOOM_SUM, comm),
               LOOM_ERR_INVALID_ARGUMENT, "sendbuf");
    EXPECT_ERR(loom_reduce_scatter(a, b, 4, LOOM_INT32, (loom_op_t)77, comm),
               LOOM_ERR_INVALID_ARGUMENT, "op");
    EXPECT_ERR(loom_reduce_scatter(a, a + 1, 4, LOOM_INT32, LOOM_SUM, comm),
               LOOM_ERR_INVALID_ARGUMENT, "overlap");
    EXPECT_ERR(loom_allgather(a, NULL, 4, LOOM_INT32, comm), LOOM_ERR_INVALID_ARGUMENT, "recvbuf");
    EXPECT_ERR(loom_allgather(a, b, SIZE_MAX / 2, LOOM_INT32, comm), LOOM_ERR_INVALID_ARGUMENT,
               "count");
    EXPECT_ERR(loom_alltoall(a, b, 4, (loom_datatype_t)42, comm), LOOM_ERR_INVALID_ARGUMENT,
               "dtype");
    EXPECT_ERR(loom_alltoall(a, a + 2, 4, LOOM_INT32, comm), LOOM_ERR_INVALID_ARGUMENT, "overlap");
    EXPECT_ERR(loom_alltoallv(a, NULL, &zero, b, &one, &zero, LOOM_INT32, comm),
               LOOM_ERR_INVALID_ARGUMENT, "sendcounts");
    EXPECT_ERR(loom_alltoallv(a, &one, &zero, b, &one, NULL, LOOM_INT32, comm),
               LOOM_ERR_INVALID_ARGUMENT, "rdispls");
    size_t huge = SIZE_MAX - 1;
    EXPECT_ERR(loom_alltoallv(a, &one, &huge, b, &one, &zero, LOOM_INT32, comm),
               LOOM_ERR_INVALID_ARGUMENT, "sdispls");
    EXPECT_ERR(loom_broadcast(a, b, 4, LOOM_INT32, 1, comm), LOOM_ERR_INVALID_ARGUMENT, "root");
    EXPECT_ERR(loom_broadcast(a, b, 4, LOOM_INT32, -1, comm), LOOM_ERR_INVALID_ARGUMENT, "root");
    EXPECT_ERR(loom_broadcast(NULL, b, 4, LOOM_INT32, 0, comm), LOOM_ERR_INVALID_ARGUMENT,
               "sendbuf");
    EXPECT_ERR(loom_reduce(a, NULL, 4, LOOM_INT32, LOOM_MAX, 0, comm), LOOM_ERR_INVALID_ARGUMENT,
               "recvbuf");
    EXPECT_ERR(loom_reduce(a, b, 4, LOOM_INT32, LOOM_MAX, 5, comm), LOOM_ERR_INVALID_ARGUMENT,
               "root");
    EXPECT_ERR(loom_gather(a, a + 1, 4, LOOM_INT32, 0, comm), LOOM_ERR_INVALID_ARGUMENT, "overlap");
    EXPECT_ERR(loom_scatter(NULL, b, 4, LOOM_INT32, 0, comm), LOOM_ERR_INVALID_ARGUMENT, "sendbuf");
    EXPECT_ERR(loom_barrier(NULL), LOOM_ERR_INVALID_ARGUMENT, "comm");
    EXPECT_ERR(loom_ibarrier(comm, NULL), LOOM_ERR_INVALID_ARGUMENT, "req");
    EXPECT_ERR(loom_send(a, 4, LOOM_INT32, 0, comm), LOOM_ERR_INVALID_USAGE, "itself");
    EXPECT_ERR(loom_recv(b, 4, LOOM_INT32, 3, comm), LOOM_ERR_INVALID_ARGUMENT, "peer");
    EXPECT_ERR(loom_group_end(), LOOM_ERR_INVALID_USAGE, "no group");
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(a[i], i, "sendbuf touched at %d", i);
        cr_assert_eq(b[i], 100 + i, "recvbuf touched at %d", i);
    }
}

/* Transfers with oneself: in a group, or non-blocking, in either order. */
Test(api, send_to_self)
{
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {0}, c[4] = {0};
    cr_assert_eq(loom_group_start(), LOOM_SUCCESS);
    cr_assert_eq(loom_recv(b, 4, LOOM_INT32, 0, comm), LOOM_SUCCESS, "%s", loom_get_last_error());
    cr_assert_eq(loom_send(a, 4, LOOM_INT32, 0, comm), LOOM_SUCCESS, "%s", loom_get_last_error());
    cr_assert_eq(b[0], 0, "ran before loom_group_end");
    cr_assert_eq(loom_group_end(), LOOM_SUCCESS, "%s", loom_get_last_error());
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    /* Two sends queued before their receives: matched in order. */
    loom_request_t q[4];
    int32_t a2[4] = {5, 6, 7, 8};
    cr_assert_eq(loom_isend(a, 4, LOOM_INT32, 0, comm, &q[0]), LOOM_SUCCESS);
    cr_assert_eq(loom_isend(a2, 4, LOOM_INT32, 0, comm, &q[1]), LOOM_SUCCESS);
    cr_assert_eq(loom_irecv(c, 4, LOOM_INT32, 0, comm, &q[2]), LOOM_SUCCESS);
    cr_assert_eq(loom_irecv(b, 4, LOOM_INT32, 0, comm, &q[3]), LOOM_SUCCESS);
    for (int i = 0; i < 4; i++) cr_assert_eq(loom_wait(&q[i]), LOOM_SUCCESS, "%d", i);
    cr_assert_eq(memcmp(a, c, sizeof a), 0);
    cr_assert_eq(memcmp(a2, b, sizeof a2), 0);
    /* Counts that differ: an error, not a hang. */
    cr_assert_eq(loom_group_start(), LOOM_SUCCESS);
    loom_send(a, 4, LOOM_INT32, 0, comm);
    loom_recv(b, 3, LOOM_INT32, 0, comm);
    EXPECT_ERR(loom_group_end(), LOOM_ERR_MISMATCH, "itself");
}

/* One rank: every collective is a copy (or nothing), in place or not. */
Test(api, collectives_on_one_rank)
{
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {0};
    cr_assert_eq(loom_reduce_scatter(a, b, 4, LOOM_INT32, LOOM_SUM, comm), LOOM_SUCCESS, "%s",
                 loom_get_last_error());
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    memset(b, 0, sizeof b);
    cr_assert_eq(loom_allgather(a, b, 4, LOOM_INT32, comm), LOOM_SUCCESS);
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    memset(b, 0, sizeof b);
    cr_assert_eq(loom_alltoall(a, b, 4, LOOM_INT32, comm), LOOM_SUCCESS);
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    memset(b, 0, sizeof b);
    size_t c = 4, d = 0;
    cr_assert_eq(loom_alltoallv(a, &c, &d, b, &c, &d, LOOM_INT32, comm), LOOM_SUCCESS);
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    memset(b, 0, sizeof b);
    cr_assert_eq(loom_broadcast(a, b, 4, LOOM_INT32, 0, comm), LOOM_SUCCESS);
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    memset(b, 0, sizeof b);
    cr_assert_eq(loom_reduce(a, b, 4, LOOM_INT32, LOOM_PROD, 0, comm), LOOM_SUCCESS);
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    memset(b, 0, sizeof b);
    cr_assert_eq(loom_gather(a, b, 4, LOOM_INT32, 0, comm), LOOM_SUCCESS);
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    memset(b, 0, sizeof b);
    cr_assert_eq(loom_scatter(a, b, 4, LOOM_INT32, 0, comm), LOOM_SUCCESS);
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    cr_assert_eq(loom_barrier(comm), LOOM_SUCCESS);
    /* In place. */
    cr_assert_eq(loom_allgather(a, a, 4, LOOM_INT32, comm), LOOM_SUCCESS);
    cr_assert_eq(loom_alltoall(a, a, 4, LOOM_INT32, comm), LOOM_SUCCESS);
    cr_assert_eq(loom_reduce(a, a, 4, LOOM_INT32, LOOM_SUM, 0, comm), LOOM_SUCCESS);
    int32_t want[4] = {1, 2, 3, 4};
    cr_assert_eq(memcmp(a, want, sizeof a), 0);
}

Test(api, mem_register_arguments_and_bookkeeping)
{
    static float buf[256];
    loom_mem_t h = (loom_mem_t)0x1, h2, other;
    EXPECT_ERR(loom_mem_register(NULL, buf, sizeof buf, &h), LOOM_ERR_INVALID_ARGUMENT, "comm");
    cr_assert_null(h, "*handle is cleared on an error");
    EXPECT_ERR(loom_mem_register(comm, NULL, sizeof buf, &h), LOOM_ERR_INVALID_ARGUMENT, "buf");
    EXPECT_ERR(loom_mem_register(comm, buf, 0, &h), LOOM_ERR_INVALID_ARGUMENT, "bytes");
    EXPECT_ERR(loom_mem_register(comm, buf, sizeof buf, NULL), LOOM_ERR_INVALID_ARGUMENT, "handle");
    EXPECT_ERR(loom_mem_register(comm, (void *)(uintptr_t)-64, 128, &h), LOOM_ERR_INVALID_ARGUMENT,
               "wraps");

    cr_assert_eq(loom_mem_register(comm, buf, sizeof buf, &h), LOOM_SUCCESS, "%s",
                 loom_get_last_error());
    cr_assert_eq(loom_mem_register(comm, buf + 16, 64, &h2), LOOM_SUCCESS);
    cr_assert_neq(h, h2);
    /* Operations on registered memory work as on any other. */
    for (int i = 0; i < 256; i++) buf[i] = (float)i;
    cr_assert_eq(loom_allreduce(buf, buf, 256, LOOM_FLOAT32, LOOM_SUM, comm), LOOM_SUCCESS);
    cr_assert_eq(buf[255], 255.0f);

    EXPECT_ERR(loom_mem_deregister(NULL, h), LOOM_ERR_INVALID_ARGUMENT, "comm");
    EXPECT_ERR(loom_mem_deregister(comm, NULL), LOOM_ERR_INVALID_ARGUMENT, "handle");
    cr_assert_eq(loom_mem_deregister(comm, h), LOOM_SUCCESS);
    /* Twice is refused (and not dereferenced: ASan would see it). */
    EXPECT_ERR(loom_mem_deregister(comm, h), LOOM_ERR_INVALID_ARGUMENT, "deregistered already");

    /* Another communicator's handle is refused too. */
    loom_unique_id_t id;
    loom_comm_t c2;
    cr_assert_eq(loom_get_unique_id(&id), LOOM_SUCCESS);
    cr_assert_eq(loom_comm_init_rank(&c2, 1, &id, 0, NULL), LOOM_SUCCESS, "%s", loom_get_last_error());
    cr_assert_eq(loom_mem_register(c2, buf, sizeof buf, &other), LOOM_SUCCESS);
    EXPECT_ERR(loom_mem_deregister(comm, other), LOOM_ERR_INVALID_ARGUMENT, "another");
    /* Destroy releases what is left (LeakSanitizer checks). */
    cr_assert_eq(loom_comm_destroy(c2), LOOM_SUCCESS);
    /* h2 is left for the teardown's destroy. */
}

/* A destroyed communicator's handle stays refused, even where the next
 * communicator is made in the same memory: before handles carried a
 * generation, malloc gave the new one the old address, and the stale
 * handle ran collectives on it and even destroyed it. */
Test(api_init, stale_comm_handle_refused)
{
    setenv("LOOM_DEBUG", "none", 1);
    loom_unique_id_t id;
    loom_comm_t a, b;
    int r = -1;
    cr_assert_eq(loom_get_unique_id(&id), LOOM_SUCCESS);
    cr_assert_eq(loom_comm_init_rank(&a, 1, &id, 0, NULL), LOOM_SUCCESS, "%s", loom_get_last_error());
    cr_assert_eq(loom_comm_destroy(a), LOOM_SUCCESS);
    cr_assert_eq(loom_get_unique_id(&id), LOOM_SUCCESS);
    cr_assert_eq(loom_comm_init_rank(&b, 1, &id, 0, NULL), LOOM_SUCCESS, "%s", loom_get_last_error());
    cr_assert_neq(a, b, "a new communicator got the destroyed one's handle");
    EXPECT_ERR(loom_comm_rank(a, &r), LOOM_ERR_INVALID_ARGUMENT, "destroyed");
    cr_assert_eq(r, -1);
    float x = 5, y = 0;
    EXPECT_ERR(loom_allreduce(&x, &y, 1, LOOM_FLOAT32, LOOM_SUM, a), LOOM_ERR_INVALID_ARGUMENT,
               "not a live communicator");
    cr_assert_eq(y, 0.0f, "the stale handle ran an allreduce");
    loom_request_t req = LOOM_REQUEST_NULL;
    EXPECT_ERR(loom_iallreduce(&x, &y, 1, LOOM_FLOAT32, LOOM_SUM, a, &req),
               LOOM_ERR_INVALID_ARGUMENT, "destroyed");
    cr_assert_eq(req, LOOM_REQUEST_NULL);
    EXPECT_ERR(loom_barrier(a), LOOM_ERR_INVALID_ARGUMENT, "destroyed");
    EXPECT_ERR(loom_comm_destroy(a), LOOM_ERR_INVALID_ARGUMENT, "destroyed");
    EXPECT_ERR(loom_comm_abort(a), LOOM_ERR_INVALID_ARGUMENT, "destroyed");
    /* b is untouched by all of that. */
    cr_assert_eq(loom_allreduce(&x, &y, 1, LOOM_FLOAT32, LOOM_SUM, b), LOOM_SUCCESS, "%s",
                 loom_get_last_error());
    cr_assert_eq(y, 5.0f);
    cr_assert_eq(loom_comm_rank(b, &r), LOOM_SUCCESS);
    cr_assert_eq(r, 0);
    cr_assert_eq(loom_comm_abort(b), LOOM_SUCCESS);
    EXPECT_ERR(loom_comm_size(b, &r), LOOM_ERR_INVALID_ARGUMENT, "aborted");
    /* A value that never was a handle is refused without being read. */
    EXPECT_ERR(loom_comm_rank((loom_comm_t)(uintptr_t)0x1000, &r), LOOM_ERR_INVALID_ARGUMENT,
               "never created");
    EXPECT_ERR(loom_barrier((loom_comm_t)(uintptr_t)0xdead0001), LOOM_ERR_INVALID_ARGUMENT,
               "not a live communicator");
}

/* Communicators made and destroyed by several threads at once: every
 * handle is distinct from every other ever given, and each works. */
#define CHURN_THREADS 4
#define CHURN_ROUNDS 25
static loom_comm_t churn_seen[CHURN_THREADS][CHURN_ROUNDS];

static void *churn(void *arg)
{
    const int t = (int)(intptr_t)arg;
    for (int i = 0; i < CHURN_ROUNDS; i++) {
        loom_unique_id_t id;
        loom_comm_t c;
        if (loom_get_unique_id(&id) != LOOM_SUCCESS ||
            loom_comm_init_rank(&c, 1, &id, 0, NULL) != LOOM_SUCCESS)
            return (void *)1;
        int v = t * 1000 + i, out = 0;
        if (loom_allreduce(&v, &out, 1, LOOM_INT32, LOOM_SUM, c) != LOOM_SUCCESS || out != v)
            return (void *)2;
        churn_seen[t][i] = c;
        if (loom_comm_destroy(c) != LOOM_SUCCESS) return (void *)3;
        if (loom_comm_destroy(c) != LOOM_ERR_INVALID_ARGUMENT) return (void *)4;
    }
    return NULL;
}

Test(api_init, handles_from_several_threads)
{
    setenv("LOOM_DEBUG", "none", 1);
    setenv("LOOM_PROBE", "0", 1);
    pthread_t th[CHURN_THREADS];
    for (int t = 0; t < CHURN_THREADS; t++)
        cr_assert_eq(pthread_create(&th[t], NULL, churn, (void *)(intptr_t)t), 0);
    for (int t = 0; t < CHURN_THREADS; t++) {
        void *rv;
        pthread_join(th[t], &rv);
        cr_assert_null(rv, "thread %d failed at step %d", t, (int)(intptr_t)rv);
    }
    for (int i = 0; i < CHURN_THREADS * CHURN_ROUNDS; i++)
        for (int j = i + 1; j < CHURN_THREADS * CHURN_ROUNDS; j++)
            cr_assert_neq(churn_seen[i / CHURN_ROUNDS][i % CHURN_ROUNDS],
                          churn_seen[j / CHURN_ROUNDS][j % CHURN_ROUNDS],
                          "handles %d and %d are the same value", i, j);
}

/* A request waited for once is refused the second time, even after a
 * later request took over its memory (the freed operation is kept for
 * the next one): before, the stale copy finished someone else's
 * operation or freed one twice. */
Test(api, stale_request_refused)
{
    float x = 3, y = 0;
    loom_request_t req, copy, next;
    cr_assert_eq(loom_iallreduce(&x, &y, 1, LOOM_FLOAT32, LOOM_SUM, comm, &req), LOOM_SUCCESS);
    copy = req;
    cr_assert_eq(loom_wait(&req), LOOM_SUCCESS);
    cr_assert_eq(y, 3.0f);
    EXPECT_ERR(loom_wait(&copy), LOOM_ERR_INVALID_ARGUMENT, "not a live request");
    cr_assert_neq(copy, LOOM_REQUEST_NULL, "a refused request is left as it was");
    float x2 = 7, y2 = 0;
    cr_assert_eq(loom_iallreduce(&x2, &y2, 1, LOOM_FLOAT32, LOOM_SUM, comm, &next), LOOM_SUCCESS);
    cr_assert_neq(next, copy);
    int done = 0;
    EXPECT_ERR(loom_test(&copy, &done), LOOM_ERR_INVALID_ARGUMENT, "not a live request");
    EXPECT_ERR(loom_wait(&copy), LOOM_ERR_INVALID_ARGUMENT, "not a live request");
    loom_request_t pair[2] = {copy, next};
    int idx = 5;
    EXPECT_ERR(loom_wait_any(pair, 2, &idx), LOOM_ERR_INVALID_ARGUMENT, "reqs[0]");
    cr_assert_eq(idx, -1);
    EXPECT_ERR(loom_wait_all(pair, 2), LOOM_ERR_INVALID_ARGUMENT, "reqs[0]");
    /* The live one is still the caller's to wait for, and completes. */
    cr_assert_eq(loom_wait(&next), LOOM_SUCCESS, "%s", loom_get_last_error());
    cr_assert_eq(y2, 7.0f);
    EXPECT_ERR(loom_wait(&(loom_request_t){(loom_request_t)(uintptr_t)0x2000}),
               LOOM_ERR_INVALID_ARGUMENT, "not a request");
    /* Released by abort: refused as well. */
    cr_assert_eq(loom_iallreduce(&x, &y, 1, LOOM_FLOAT32, LOOM_SUM, comm, &req), LOOM_SUCCESS);
    copy = req;
    cr_assert_eq(loom_comm_abort(comm), LOOM_SUCCESS);
    comm = NULL;
    EXPECT_ERR(loom_wait(&copy), LOOM_ERR_INVALID_ARGUMENT, "not a live request");
}

/* Durations: a bare number in the variable's unit (as before), or a
 * number with a unit; anything else refused. */
Test(api_init, durations_parse)
{
    long long v;
    struct { const char *s; long long unit_us, want; } ok[] = {
        {"60000", 1000, 60000}, {"20s", 1000, 20000}, {"500ms", 1000, 500}, {"2m", 1000, 120000},
        {"1.5s", 1000, 1500},   {"0.25s", 1000, 250}, {"3000us", 1000, 3},  {"0", 1000, 0},
        {"200", 1, 200},        {"1ms", 1, 1000},     {"0.5ms", 1, 500},    {"2s", 1, 2000000},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        cr_assert_eq(loomi_parse_duration(ok[i].s, ok[i].unit_us, &v), 0, "'%s' refused", ok[i].s);
        cr_assert_eq(v, ok[i].want, "'%s' gave %lld, not %lld", ok[i].s, v, ok[i].want);
    }
    const char *bad[] = {"", "s", "20x", "20sec", "20 s", "-5", "1.5", "1.5.5s", ".5s", "0.5us",
                         "1500us", "20S", "99999999999999999999", "9999999999999999m"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_neq(loomi_parse_duration(bad[i], 1000, &v), 0, "'%s' accepted (%lld)", bad[i], v);
}

static int timeout_of(const char *value, char *msg, size_t n)
{
    setenv("LOOM_DEBUG", "none", 1);
    setenv("LOOM_TIMEOUT", value, 1);
    loom_unique_id_t id;
    loom_comm_t c = NULL;
    msg[0] = '\0';
    if (loom_get_unique_id(&id) != LOOM_SUCCESS ||
        loom_comm_init_rank(&c, 1, &id, 0, NULL) != LOOM_SUCCESS) {
        snprintf(msg, n, "%s", loom_get_last_error());
        return -1;
    }
    int t = loomi_comm_get(c)->set.timeout_ms;
    loom_comm_destroy(c);
    return t;
}

/* Each test runs in a process of its own: the environment is read once. */
Test(api_init, timeout_with_unit)
{
    char m[512];
    cr_assert_eq(timeout_of("20s", m, sizeof m), 20000, "%s", m);
}

Test(api_init, timeout_bare_is_ms)
{
    char m[512];
    cr_assert_eq(timeout_of("60000", m, sizeof m), 60000, "%s", m);
}

Test(api_init, timeout_garbage_named)
{
    char m[512];
    cr_assert_eq(timeout_of("20x", m, sizeof m), -1);
    cr_assert(strstr(m, "LOOM_TIMEOUT=20x is invalid"), "message: %s", m);
}
Test(api_init, timeout_str_under_a_second)
{
    struct loomi_settings s = {.timeout_ms = 20, .timeout_src = 2};
    char b[160];
    loomi_timeout_str(&s, b, sizeof b);
    cr_assert(strstr(b, "LOOM_TIMEOUT=20 ms (did you mean 20s?"), "%s", b);
    s.timeout_src = 1;
    loomi_timeout_str(&s, b, sizeof b);
    cr_assert(strstr(b, "under a second"), "%s", b);
    s.timeout_ms = 60000;
    loomi_timeout_str(&s, b, sizeof b);
    cr_assert_str_eq(b, "LOOM_TIMEOUT=60000 ms");
}

/* loom_comm_split's mistakes, caught on the calling rank; and on one
 * rank, the colours it may pass. */
Test(api, comm_split)
{
    loom_comm_t c = (loom_comm_t)1;
    EXPECT_ERR(loom_comm_split(comm, 0, 0, NULL, NULL), LOOM_ERR_INVALID_ARGUMENT, "newcomm");
    EXPECT_ERR(loom_comm_split(comm, -5, 0, NULL, &c), LOOM_ERR_INVALID_ARGUMENT, "color -5");
    cr_assert_null(c, "*newcomm is NULL after an error");
    EXPECT_ERR(loom_comm_split(NULL, 0, 0, NULL, &c), LOOM_ERR_INVALID_ARGUMENT, "comm is NULL");
    loom_config_t bad;
    loom_config_init(&bad);
    bad.timeout_ms = -1;
    EXPECT_ERR(loom_comm_split(comm, 0, 0, &bad, &c), LOOM_ERR_INVALID_ARGUMENT, "timeout_ms");

    c = (loom_comm_t)1;
    cr_assert_eq(loom_comm_split(comm, LOOM_SPLIT_NOCOLOR, 0, NULL, &c), LOOM_SUCCESS, "%s",
                 loom_get_last_error());
    cr_assert_null(c, "LOOM_SPLIT_NOCOLOR gives no communicator");

    loom_comm_t child;
    cr_assert_eq(loom_comm_split(comm, 3, 9, NULL, &child), LOOM_SUCCESS, "%s",
                 loom_get_last_error());
    int r = -1, n = -1;
    cr_assert_eq(loom_comm_rank(child, &r), LOOM_SUCCESS);
    cr_assert_eq(loom_comm_size(child, &n), LOOM_SUCCESS);
    cr_assert(r == 0 && n == 1, "rank %d of %d", r, n);
    float x[4] = {1, 2, 3, 4}, y[4];
    cr_assert_eq(loom_allreduce(x, y, 4, LOOM_FLOAT32, LOOM_SUM, child), LOOM_SUCCESS);
    cr_assert(y[3] == 4.0f);
    /* The parent destroyed first: the child goes on. */
    cr_assert_eq(loom_comm_destroy(comm), LOOM_SUCCESS);
    EXPECT_ERR(loom_comm_split(comm, 0, 0, NULL, &c), LOOM_ERR_INVALID_ARGUMENT, "not a live");
    comm = child;
    cr_assert_eq(loom_allreduce(x, y, 4, LOOM_FLOAT32, LOOM_SUM, comm), LOOM_SUCCESS);
    /* A revoked communicator is refused. */
    cr_assert_eq(loom_comm_revoke(comm), LOOM_SUCCESS);
    EXPECT_ERR(loom_comm_split(comm, 0, 0, NULL, &c), LOOM_ERR_REVOKED, "broken");
    cr_assert_null(c);
}

/* cfg's fields override the parent's settings; NULL inherits them. */
Test(api, comm_split_settings)
{
    struct loom_comm *p = loomi_comm_get(comm);
    cr_assert_not_null(p);
    loom_comm_t a, b;
    cr_assert_eq(loom_comm_split(comm, 0, 0, NULL, &a), LOOM_SUCCESS, "%s", loom_get_last_error());
    struct loom_comm *ca = loomi_comm_get(a);
    cr_assert_eq(ca->set.timeout_ms, p->set.timeout_ms);
    cr_assert_eq(ca->algo_forced[LOOMI_COLL_ALLREDUCE], p->algo_forced[LOOMI_COLL_ALLREDUCE]);
    loom_config_t cfg;
    loom_config_init(&cfg);
    cfg.timeout_ms = 1234;
    cfg.algo = "allreduce:ring";
    cr_assert_eq(loom_comm_split(comm, 0, 0, &cfg, &b), LOOM_SUCCESS, "%s", loom_get_last_error());
    struct loom_comm *cb = loomi_comm_get(b);
    cr_assert_eq(cb->set.timeout_ms, 1234);
    cr_assert_neq(cb->algo_forced[LOOMI_COLL_ALLREDUCE], LOOMI_ALGO_AUTO);
    cr_assert_eq(cb->set.tcp_streams, p->set.tcp_streams, "a field cfg leaves 0 is inherited");
    cr_assert_eq(p->set.timeout_ms == 1234, 0, "the parent keeps its own");
    cr_assert_eq(loom_comm_destroy(a), LOOM_SUCCESS);
    cr_assert_eq(loom_comm_destroy(b), LOOM_SUCCESS);
}

/* The order of a split: by key, then by rank, one colour at a time. */
Test(api, comm_split_order)
{
    const int color[7] = {0, 1, 0, 1, 0, LOOM_SPLIT_NOCOLOR, 2};
    const int key[7] = {5, 1, 5, 0, -1, 0, 7};
    int m[7];
    cr_assert_eq(loomi_split_order(color, key, 7, 0, m), 3);
    cr_assert(m[0] == 4 && m[1] == 0 && m[2] == 2, "colour 0: %d %d %d", m[0], m[1], m[2]);
    cr_assert_eq(loomi_split_order(color, key, 7, 1, m), 2);
    cr_assert(m[0] == 3 && m[1] == 1, "colour 1: %d %d", m[0], m[1]);
    cr_assert_eq(loomi_split_order(color, key, 7, 2, m), 1);
    cr_assert_eq(m[0], 6);
    cr_assert_eq(loomi_split_order(color, key, 7, LOOM_SPLIT_NOCOLOR, m), 0);
    /* Keys reversing the ranks' order. */
    const int c4[4] = {0, 0, 0, 0}, k4[4] = {0, -1, -2, -3};
    cr_assert_eq(loomi_split_order(c4, k4, 4, 0, m), 4);
    for (int i = 0; i < 4; i++) cr_assert_eq(m[i], 3 - i);
}
