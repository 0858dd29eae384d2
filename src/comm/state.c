/*
 * state.c - loom_state_sync: make every rank hold the same shared state
 * (model parameters, optimizer state), proven by hashes.
 *
 * Each rank hashes its tensors (XXH64) and all ranks exchange revision,
 * sizes and hashes.  Every rank then takes the same decisions from the
 * same table: the newest revision present wins, and per tensor the
 * version most ranks of that revision hold (ties: the lowest rank's).
 * Ranks holding it donate, each sending one slice to every rank that
 * lacks it, so a newcomer is filled by several donors at once; receivers
 * hash what arrived and the ranks agree on the outcome.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/collectives.h"
#include "comm/comm.h"

#define REC_HEAD 16 /* revision, tensor count, reserved */
#define REC_TENSOR 16 /* bytes, hash */
/* Below this, a tensor comes from one donor (more would only add messages). */
#define SLICE_MIN ((size_t)1 << 20)

static uint64_t get64(const unsigned char *b)
{
    uint64_t v;
    memcpy(&v, b, 8);
    return v;
}

struct version {
    uint64_t bytes, hash;
    int count, first; /* ranks of the newest revision holding it; lowest */
};

loom_result_t loom_state_sync(loom_comm_t comm, const loom_tensor_t *tensors, int ntensors,
                              uint64_t *revision)
{
    const char *fn = "loom_state_sync";
    struct loom_comm *c;
    loom_result_t r = loomi_comm_check(comm, fn, &c);
    if (r != LOOM_SUCCESS) return r;
    const int me = c->rank, n = c->nranks;
    if (!revision) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me, "%s: revision is NULL", fn);
    if (ntensors < 0 || ntensors > (1 << 24))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me, "%s: ntensors %d is not in 0..%d", fn,
                          ntensors, 1 << 24);
    if (ntensors > 0 && !tensors)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me, "%s: tensors is NULL", fn);
    for (int t = 0; t < ntensors; t++)
        if (tensors[t].bytes && !tensors[t].data)
            return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, me,
                              "%s: tensors[%d].data is NULL with %zu bytes", fn, t,
                              tensors[t].bytes);
    uint64_t t0 = loomi_now_ns();
    int writes = 0, proven = 0; /* this rank's tensors are being written; proven afterwards */
    uint64_t newest = 0;

    /* Every rank must describe as many tensors: agree on that first, so a
     * mismatch is an error everywhere rather than a failed exchange. */
    int64_t span[2] = {ntensors, -(int64_t)ntensors};
    r = loomi_call_allreduce("loom_allreduce", span, span, 2, LOOM_INT64, LOOM_MAX, comm, NULL,
                             NULL);
    if (r != LOOM_SUCCESS) return r;
    if (span[0] != -span[1])
        return loomi_fail(LOOM_ERR_MISMATCH, me,
                          "%s: the ranks pass different tensor counts (from %lld to %lld)", fn,
                          (long long)-span[1], (long long)span[0]);

    const size_t rec = REC_HEAD + (size_t)ntensors * REC_TENSOR;
    unsigned char *all = malloc(rec * (size_t)n);
    unsigned char *mine = malloc(rec);
    struct version *win = calloc((size_t)ntensors + 1, sizeof *win);
    int *donors = malloc(sizeof *donors * (size_t)n);
    if (!all || !mine || !win || !donors) {
        r = loomi_fail(LOOM_ERR_NO_MEMORY, me, "%s: out of memory", fn);
        goto out;
    }
    memset(mine, 0, rec);
    memcpy(mine, revision, 8);
    uint32_t nt32 = (uint32_t)ntensors;
    memcpy(mine + 8, &nt32, 4);
    for (int t = 0; t < ntensors; t++) {
        uint64_t b = tensors[t].bytes, h = loomi_hash64(tensors[t].data, tensors[t].bytes, 0);
        memcpy(mine + REC_HEAD + (size_t)t * REC_TENSOR, &b, 8);
        memcpy(mine + REC_HEAD + (size_t)t * REC_TENSOR + 8, &h, 8);
    }
    uint64_t t_hash = loomi_now_ns();
    r = loomi_call_allgather("loom_allgather", mine, all, rec, LOOM_UINT8, comm, NULL, NULL);
    if (r != LOOM_SUCCESS) goto out;
#define REV(q) get64(all + (size_t)(q) * rec)
#define BYTES(q, t) get64(all + (size_t)(q) * rec + REC_HEAD + (size_t)(t) * REC_TENSOR)
#define HASH(q, t) get64(all + (size_t)(q) * rec + REC_HEAD + (size_t)(t) * REC_TENSOR + 8)
    /* LOOM_REVISION_NONE (bytes a failed sync wrote) never wins. */
    int valid = 0;
    for (int q = 0; q < n; q++)
        if (REV(q) != LOOM_REVISION_NONE) {
            valid++;
            if (REV(q) > newest) newest = REV(q);
        }
    if (!valid) {
        r = loomi_fail(LOOM_ERR_INVALID_USAGE, me,
                       "%s: no rank holds a valid state (every revision is "
                       "LOOM_REVISION_NONE); nothing was changed",
                       fn);
        goto out;
    }

    /* The winning version of each tensor, decided alike everywhere. */
    for (int t = 0; t < ntensors; t++) {
        struct version *w = &win[t];
        w->count = 0;
        for (int q = 0; q < n; q++) {
            if (REV(q) != newest) continue;
            int c = 0;
            for (int p = 0; p < n; p++)
                if (REV(p) == newest && BYTES(p, t) == BYTES(q, t) && HASH(p, t) == HASH(q, t))
                    c++;
            if (c > w->count) { /* strictly more: ties keep the lowest rank's */
                w->count = c;
                w->first = q;
                w->bytes = BYTES(q, t);
                w->hash = HASH(q, t);
            }
        }
        for (int q = 0; q < n; q++)
            if (BYTES(q, t) != w->bytes) {
                r = loomi_fail(LOOM_ERR_MISMATCH, me,
                               "%s: tensor %d has %llu bytes on rank %d but %llu in the state "
                               "of revision %llu (rank %d); nothing was changed",
                               fn, t, (unsigned long long)BYTES(q, t), q,
                               (unsigned long long)w->bytes, (unsigned long long)newest,
                               w->first);
                goto out;
            }
    }

    /* Transfers: donors send slices to every rank that lacks the version. */
    size_t received = 0;
    int nrecv_t = 0;
    /* From here, this rank's tensors that lack the winning version are
     * written: if the sync fails before they are proven, their revision
     * is LOOM_REVISION_NONE, so that they can never win a later sync. */
    for (int t = 0; t < ntensors; t++)
        if (HASH(me, t) != win[t].hash && win[t].bytes) writes = 1;
    loomi_group_start();
    for (int t = 0; t < ntensors; t++) {
        const struct version *w = &win[t];
        int nd = 0, nr = 0;
        for (int q = 0; q < n; q++) {
            if (HASH(q, t) == w->hash) donors[nd++] = q;
            else nr++;
        }
        if (!nr || !w->bytes) continue;
        size_t slices = (size_t)nd;
        if (slices > w->bytes / SLICE_MIN) slices = w->bytes / SLICE_MIN;
        if (slices < 1) slices = 1;
        size_t per = (w->bytes + slices - 1) / slices;
        per = (per + 63) & ~(size_t)63;
        int mine_lacks = HASH(me, t) != w->hash;
        if (mine_lacks) nrecv_t++;
        for (size_t i = 0; i < slices; i++) {
            size_t off = i * per;
            if (off >= w->bytes) break;
            size_t len = w->bytes - off < per ? w->bytes - off : per;
            /* Rotate the donors over tensors, so small ones spread too. */
            int d = donors[(i + (size_t)t) % (size_t)nd];
            unsigned char *base = tensors[t].data;
            if (d == me) {
                for (int q = 0; q < n; q++)
                    if (HASH(q, t) != w->hash)
                        loomi_call_p2p("loom_send", 1, base + off, NULL, len, LOOM_UINT8, q, comm,
                                       NULL);
            } else if (mine_lacks) {
                loomi_call_p2p("loom_recv", 0, NULL, base + off, len, LOOM_UINT8, d, comm, NULL);
                received += len;
            }
        }
    }
    r = loomi_group_end();

    /* Receivers prove what they got; every rank learns the outcome. */
    int32_t bad[2] = {0, -1}; /* worst: 1 transfer failed, 2 hash differs; the tensor */
    if (r != LOOM_SUCCESS) bad[0] = 1;
    for (int t = 0; t < ntensors && !bad[0]; t++)
        if (HASH(me, t) != win[t].hash &&
            loomi_hash64(tensors[t].data, tensors[t].bytes, 0) != win[t].hash) {
            bad[0] = 2;
            bad[1] = t;
        }
    /* Proven: whatever the others' outcome, this rank holds the winning
     * revision's bytes. */
    if (!bad[0]) proven = 1;
    char why[256];
    snprintf(why, sizeof why, "%s", r != LOOM_SUCCESS ? loom_get_last_error() : "");
    int32_t worst[2] = {bad[0], bad[1]};
    loom_result_t r2 = loomi_call_allreduce("loom_allreduce", worst, worst, 2, LOOM_INT32, LOOM_MAX,
                                            comm, NULL, NULL);
    if (r2 != LOOM_SUCCESS) {
        r = r2;
        goto out;
    }
    if (bad[0] == 1) {
        r = loomi_fail(r, me, "%s: the transfer failed: %s", fn, why);
        goto out;
    }
    if (bad[0] == 2) {
        r = loomi_fail(LOOM_ERR_REMOTE, me,
                       "%s: tensor %d does not hash to the state's value after the transfer", fn,
                       bad[1]);
        goto out;
    }
    if (worst[0]) {
        r = loomi_fail(LOOM_ERR_REMOTE, me, "%s: %s", fn,
                       worst[0] == 2 ? "another rank's copy of a tensor failed its hash check"
                                     : "the transfer to another rank failed");
        goto out;
    }
    *revision = newest;
    writes = 0;
    LOOMI_INFO(me, "state sync: revision %llu, %d tensor(s), received %zu bytes in %d tensor(s); "
               "hashing %.1f ms, total %.1f ms",
               (unsigned long long)newest, ntensors, received, nrecv_t,
               (double)(t_hash - t0) * 1e-6, (double)(loomi_now_ns() - t0) * 1e-6);
#undef REV
#undef BYTES
#undef HASH
out:
    if (writes) {
        *revision = proven ? newest : LOOM_REVISION_NONE;
        if (!proven)
            LOOMI_WARN(me, "%s failed while this rank received: its revision is now "
                           "LOOM_REVISION_NONE", fn);
    }
    free(all);
    free(mine);
    free(win);
    free(donors);
    return r;
}
