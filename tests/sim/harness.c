/* harness.c - jobs of communicators in one process over the sim
 * transport, and a driver that runs their requests (harness.h): the
 * tests' part, kept out of the library, which the transport is. */
#include <inttypes.h>
#include <stdio.h>

#include "comm/local.h"
#include "core/internal.h"
#include "tests/sim/harness.h"

static uint64_t events(const struct loomi_sim_world *w)
{
    struct loomi_sim_stats st;
    if (!w) return 0;
    loomi_sim_world_stats(w, &st);
    return st.events;
}

static loom_result_t make_endpoint(void *arg, const struct loomi_tctx *ctx, void **state)
{
    return loomi_sim_endpoint_create(arg, ctx, state);
}

loom_result_t loomi_sim_world_create(int nranks, uint64_t seed, const loom_config_t *cfg,
                                     struct loomi_sim_world **wp, loom_comm_t *comms)
{
    if (!wp || !comms)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "loomi_sim_world_create: %s is NULL",
                          !wp ? "w" : "comms");
    *wp = NULL;
    struct loomi_sim_world *w = loomi_sim_world_new(nranks, seed);
    if (!w) return nranks < 1 ? LOOM_ERR_INVALID_ARGUMENT : LOOM_ERR_NO_MEMORY;
    for (int r = 0; r < nranks; r++) comms[r] = NULL;
    for (int r = 0; r < nranks; r++) {
        loom_result_t rc = loomi_comm_create_local(&comms[r], r, nranks, cfg, &loomi_sim_ops,
                                                   make_endpoint, w, "loomi_sim_world_create");
        if (rc != LOOM_SUCCESS) {
            loomi_sim_world_destroy(w, comms);
            return rc;
        }
    }
    *wp = w;
    return LOOM_SUCCESS;
}

void loomi_sim_world_destroy(struct loomi_sim_world *w, loom_comm_t *comms)
{
    if (comms && w) {
        for (int r = 0, n = loomi_sim_world_size(w); r < n; r++) {
            if (!comms[r]) continue;
            if (loomi_comm_busy(comms[r])) loom_comm_abort(comms[r]);
            else loom_comm_destroy(comms[r]);
            comms[r] = NULL;
        }
    }
    loomi_sim_world_free(w);
}

loom_result_t loomi_sim_run(struct loomi_sim_world *w, loom_comm_t *comms, loom_request_t *reqs,
                            int n, uint64_t max_rounds, loom_result_t *results, char *msg,
                            size_t msglen)
{
    if (msglen) msg[0] = '\0';
    int left = 0;
    for (int i = 0; i < n; i++) {
        results[i] = LOOM_SUCCESS;
        if (reqs[i] != LOOM_REQUEST_NULL) left++;
    }
    uint64_t rounds = 0;
    int idle = 0;
    while (left) {
        uint64_t ev0 = events(w);
        int moved = 0;
        for (int i = 0; i < n; i++) {
            if (reqs[i] == LOOM_REQUEST_NULL) continue;
            int done = 0;
            loom_result_t r = loom_test(&reqs[i], &done);
            if (done || r != LOOM_SUCCESS) {
                /* An error without done is a bad request: it will not finish. */
                results[i] = r;
                if (r != LOOM_SUCCESS && msglen && !msg[0]) {
                    int k = snprintf(msg, msglen, "rank %d: %s: %s", i, loom_strerror(r),
                                     loom_get_last_error());
                    int failed = -1;
                    if (comms && comms[i] && loom_comm_get_error(comms[i], &failed) &&
                        failed >= 0 && k > 0 && (size_t)k < msglen)
                        snprintf(msg + k, msglen - (size_t)k, " (the communicator blames rank %d)",
                                 failed);
                }
                reqs[i] = LOOM_REQUEST_NULL;
                left--;
                moved = 1;
            }
        }
        rounds++;
        if (!left) break;
        if (w && events(w) == ev0 && !moved) idle++;
        else idle = 0;
        /* Two rounds in which nothing moved: every rank has posted all it
         * can and no pair is deliverable, so nothing ever will move. */
        if (idle >= 2 || (max_rounds && rounds >= max_rounds)) {
            size_t o = 0;
            if (msglen) msg[0] = '\0'; /* the hang is the news */
            int k = snprintf(msg, msglen, "%s after %" PRIu64 " rounds; ranks not done:",
                             idle >= 2 ? "hang: nothing moved" : "no completion", rounds);
            if (k > 0) o = (size_t)k;
            int listed = 0;
            for (int i = 0; i < n && o < msglen; i++)
                if (reqs[i] != LOOM_REQUEST_NULL && listed++ < 16) {
                    k = snprintf(msg + o, msglen - o, " %d", i);
                    if (k > 0) o += (size_t)k;
                }
            if (listed > 16 && o < msglen) {
                k = snprintf(msg + o, msglen - o, " (%d in all)", listed);
                if (k > 0) o += (size_t)k;
            }
            if (w && o + 16 < msglen) {
                k = snprintf(msg + o, msglen - o, "; waiting: ");
                if (k > 0) o += (size_t)k;
                if (o < msglen) loomi_sim_world_describe(w, 6, msg + o, msglen - o);
            }
            return loomi_fail(LOOM_ERR_TIMEOUT, -1, "%s", msg);
        }
    }
    return LOOM_SUCCESS;
}
