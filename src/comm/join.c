/*
 * join.c - loom_comm_join: a new process enters a running job.
 *
 * It connects to the job's rendezvous address, where the lowest rank
 * alive holds the join service (ctrl.c), says hello with the job key and
 * waits.  When the members call loom_comm_grow, the coordinator sends it
 * ACCEPT (its rank, the new size and the job's link figures); it creates
 * its part of the communicator and answers with its address (ADDR); the
 * coordinator sends everyone's (ALL) and all connect.  If the connection
 * breaks (the holder died), it connects again: the next holder takes
 * over the same address.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/ctrl.h"
#include "transports/net.h"
#include "transports/route.h"
#include "transports/seal.h"
#include "topo/select.h"
#include "topo/topo.h"

/* One message from the holder: header and payload (malloc'ed, caller
 * frees), opened with rx when the job seals its records (LOOM_ENCRYPT;
 * NULL: plain).  Returns 0; -1 when the connection broke or lied; -2
 * when a record did not open (another LOOM_ENCRYPT, or tampered). */
static int read_msg(int fd, struct loomi_seal *rx, uint64_t deadline, uint16_t *type,
                    uint32_t *epoch, uint64_t *arg, unsigned char **data, uint32_t *len)
{
    unsigned char h[LOOMI_CTRL_HDR_BYTES + LOOMI_SEAL_TAG];
    const size_t hn = LOOMI_CTRL_HDR_BYTES + (rx ? LOOMI_SEAL_TAG : 0);
    *data = NULL;
    if (loomi_read_full(fd, h, hn, deadline)) return -1;
    if (rx && loomi_seal_open(rx, LOOMI_SEAL_HDR, h, LOOMI_CTRL_HDR_BYTES, h)) return -2;
    if (loomi_ctrl_parse(h, type, epoch, arg, len)) return -1;
    *data = malloc(*len ? *len : 1);
    if (!*data) return -1;
    if (!rx) {
        if (*len && loomi_read_full(fd, *data, *len, deadline)) return -1;
        return 0;
    }
    unsigned char *rec = *len ? malloc((size_t)LOOMI_SEAL_MAX + LOOMI_SEAL_TAG) : NULL;
    int rc = *len && !rec ? -1 : 0;
    for (uint32_t at = 0; rc == 0 && at < *len;) {
        size_t k = LOOMI_MIN((size_t)(*len - at), (size_t)LOOMI_SEAL_MAX);
        if (loomi_read_full(fd, rec, k + LOOMI_SEAL_TAG, deadline)) rc = -1;
        else if (loomi_seal_open(rx, LOOMI_SEAL_DATA, rec, k, *data + at)) rc = -2;
        at += (uint32_t)k;
    }
    free(rec);
    return rc;
}

/* Send one message to the holder, sealed with tx (NULL: plain). */
static int send_msg(int fd, struct loomi_seal *tx, uint16_t type, uint32_t epoch, uint64_t arg,
                    const void *data, uint32_t len, uint64_t deadline)
{
    unsigned char h[LOOMI_CTRL_HDR_BYTES + LOOMI_SEAL_TAG];
    loomi_ctrl_frame(h, type, epoch, arg, len);
    if (!tx) {
        if (loomi_write_full(fd, h, LOOMI_CTRL_HDR_BYTES, deadline)) return -1;
        return len ? loomi_write_full(fd, data, len, deadline) : 0;
    }
    if (loomi_seal(tx, LOOMI_SEAL_HDR, h, LOOMI_CTRL_HDR_BYTES, h) ||
        loomi_write_full(fd, h, sizeof h, deadline))
        return -1;
    unsigned char *rec = len ? malloc((size_t)LOOMI_SEAL_MAX + LOOMI_SEAL_TAG) : NULL;
    int rc = len && !rec ? -1 : 0;
    for (uint32_t at = 0; rc == 0 && at < len;) {
        size_t k = LOOMI_MIN((size_t)(len - at), (size_t)LOOMI_SEAL_MAX);
        if (loomi_seal(tx, LOOMI_SEAL_DATA, (const unsigned char *)data + at, k, rec) ||
            loomi_write_full(fd, rec, k + LOOMI_SEAL_TAG, deadline))
            rc = -1;
        at += (uint32_t)k;
    }
    free(rec);
    return rc;
}

/* The holder's connection: its socket and, under LOOM_ENCRYPT, the
 * records' state each way. */
struct hconn {
    int fd;
    int sealed;
    struct loomi_seal tx, rx;
};

static void hconn_close(struct hconn *h)
{
    if (h->fd >= 0) close(h->fd);
    h->fd = -1;
    loomi_seal_free(&h->tx);
    loomi_seal_free(&h->rx);
}

const char *loomi_join_accept_bad(uint64_t arg, const unsigned char *data, uint32_t len,
                                  struct loomi_join_accept *acc)
{
    uint64_t nr = arg & 0xffffffffu, nn = arg >> 32;
    if (nn < 2 || nn > (1u << 20) || nr >= nn || len != sizeof *acc) return "a bad admission";
    memcpy(acc, data, sizeof *acc);
    int algo_ok = 1;
    for (int k = 0; k < LOOMI_MAX_COLLS; k++)
        algo_ok &= acc->uniform.algo[k] >= 0 && acc->uniform.algo[k] < LOOMI_NUM_ALGOS;
    if (!loomi_links_valid(&acc->links) || !algo_ok)
        return "out-of-range link figures or algorithms";
    return NULL;
}

/* The guard of the connection (loomi_guard_set): the members sent a new
 * message on the holder's connection that gives the round up (ALL of no
 * addresses, or another ACCEPT).  Their commit, which can come while
 * this process still measures the new group, is no reason to stop; nor
 * is the connection's end: the holder closes it once it is done. */
static int readmitted(void *arg, char *msg, size_t n)
{
    const struct hconn *hc = arg;
    unsigned char h[LOOMI_CTRL_HDR_BYTES + LOOMI_SEAL_TAG];
    const size_t hn = LOOMI_CTRL_HDR_BYTES + (hc->sealed ? LOOMI_SEAL_TAG : 0);
    struct pollfd pf = {hc->fd, POLLIN, 0};
    if (poll(&pf, 1, 0) != 1 || recv(hc->fd, h, hn, MSG_PEEK | MSG_DONTWAIT) != (ssize_t)hn)
        return 0;
    /* A sealed header is opened on a copy of the state: the message is
     * read, and its record numbered, later. */
    struct loomi_seal peek = hc->rx;
    if (hc->sealed && loomi_seal_open(&peek, LOOMI_SEAL_HDR, h, LOOMI_CTRL_HDR_BYTES, h))
        return 0;
    uint16_t type;
    uint32_t e, len;
    uint64_t a;
    if (loomi_ctrl_parse(h, &type, &e, &a, &len) == 0 && type == LOOMI_CMSG_ALL &&
        a == LOOMI_CTRL_ALL_COMMIT)
        return 0;
    snprintf(msg, n, "the members gave the admission up (one of them failed)");
    return 1;
}

loom_result_t loom_comm_join(loom_comm_t *comm, const loom_config_t *cfg)
{
    const char *fn = "loom_comm_join";
    if (!comm) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: comm is NULL", fn);
    *comm = NULL;
    struct loomi_boot_target t;
    loom_result_t r = loomi_env_join_target(&t);
    if (r != LOOM_SUCCESS) return r;
    /* Settings once, for every attempt. */
    struct loom_comm *proto;
    r = loomi_comm_alloc(&proto, 0, 1, cfg, fn);
    if (r != LOOM_SUCCESS) return r;
    unsigned mask;
    r = loomi_route_parse(proto->set.transport, &mask, -1);
    struct loomi_topo_rank me;
    if (r == LOOM_SUCCESS) r = loomi_topo_discover(&proto->set, -1, &me);
    if (r != LOOM_SUCCESS) {
        free(proto);
        return r;
    }
    const uint64_t deadline = loomi_now_ms() + (uint64_t)proto->set.timeout_ms;
    struct loom_comm *c = NULL;
    unsigned char addr[LOOMI_ADDR_BYTES];
    struct loomi_links links;
    int newrank = -1, newn = 0;
    struct hconn hc = {-1, proto->set.encrypt, {0}, {0}};
    struct loomi_seal *tx = hc.sealed ? &hc.tx : NULL, *rx = hc.sealed ? &hc.rx : NULL;
    uint32_t epoch = 0;
    uint64_t t0 = loomi_now_ms();
    char last[200] = ""; /* why the last admission fell through */
    r = LOOM_ERR_TIMEOUT;
    while (loomi_now_ms() < deadline) {
        if (hc.fd < 0) {
            struct sockaddr_storage local;
            unsigned llen = sizeof local;
            unsigned char sess[LOOMI_AUTH_SESSION_BYTES];
            r = loomi_boot_connect(&t, -1, deadline, &hc.fd, &local, &llen,
                                   hc.sealed ? sess : NULL);
            if (r == LOOM_ERR_REMOTE) {
                /* The holder went away in the handshake: its successor
                 * takes the address shortly. */
                hc.fd = -1;
                usleep(100000);
                continue;
            }
            if (r != LOOM_SUCCESS) break;
            if (hc.sealed && loomi_seal_setup(&hc.tx, &hc.rx, sess, 1)) {
                hconn_close(&hc);
                r = loomi_fail(LOOM_ERR_NO_MEMORY, -1, "%s: cannot set up sealing", fn);
                break;
            }
            if (send_msg(hc.fd, tx, LOOMI_CTRL_T_JOIN, 0, 0, NULL, 0, deadline)) {
                hconn_close(&hc);
                continue;
            }
            /* Rounds are numbered per holder's communicator: a new
             * holder's may be lower than the last one's. */
            epoch = 0;
            proto->bind_addr = local;
            proto->bind_len = llen;
            socklen_t l = sizeof proto->rdv_addr;
            if (getpeername(hc.fd, (struct sockaddr *)&proto->rdv_addr, &l) == 0) proto->rdv_len = l;
            LOOMI_INFO(-1, "%s: waiting at %s:%s to be admitted", fn, t.host, t.port);
        }
        uint16_t type;
        uint32_t e, len;
        uint64_t arg;
        unsigned char *data;
        int rm = read_msg(hc.fd, rx, deadline, &type, &e, &arg, &data, &len);
        if (rm == -2) {
            free(data);
            r = loomi_fail(LOOM_ERR_MISMATCH, -1,
                           "%s: the holder's messages do not open: LOOM_ENCRYPT differs between "
                           "this process and the job's members, or they were changed in flight",
                           fn);
            break;
        }
        if (rm) {
            /* The holder is gone (or lied): start over with its successor. */
            free(data);
            hconn_close(&hc);
            if (c) loomi_comm_discard(c);
            c = NULL;
            r = LOOM_ERR_TIMEOUT;
            usleep(100000);
            continue;
        }
        if (type == LOOMI_CMSG_ACCEPT && e >= epoch) {
            uint64_t nr = arg & 0xffffffffu, nn = arg >> 32;
            struct loomi_join_accept acc;
            const char *bad = loomi_join_accept_bad(arg, data, len, &acc);
            if (bad) {
                free(data);
                r = loomi_fail(LOOM_ERR_REMOTE, -1, "%s: the holder sent %s", fn, bad);
                break;
            }
            links = acc.links;
            /* The algorithms forced are the communicator's (LOOM_ALGO or
             * loom_comm_set_algo on the members): take them.  The rest
             * is this process's environment, and must match. */
            struct loomi_uniform mine;
            loomi_uniform_fill(&mine, &proto->set, proto->algo_forced, mask, 0);
            memcpy(mine.algo, acc.uniform.algo, sizeof mine.algo);
            char why[320];
            if (loomi_uniform_diff(&mine, "this joiner", &acc.uniform, "the members", why,
                                   sizeof why)) {
                free(data);
                r = loomi_fail(LOOM_ERR_MISMATCH, -1, "%s: refused: %s", fn, why);
                break;
            }
            for (int k = 0; k < LOOMI_MAX_COLLS; k++) proto->algo_forced[k] = acc.uniform.algo[k];
            if (c) loomi_comm_discard(c);
            c = calloc(1, sizeof *c);
            if (!c) {
                free(data);
                r = loomi_fail(LOOM_ERR_NO_MEMORY, -1, "%s: out of memory", fn);
                break;
            }
            loomi_comm_engine_bind(c);
            newrank = (int)nr;
            newn = (int)nn;
            epoch = e;
            c->rank = newrank;
            c->nranks = newn;
            c->failed_rank = -1;
            c->set = proto->set;
            memcpy(c->algo_forced, proto->algo_forced, sizeof c->algo_forced);
            memcpy(c->job_key, t.job_key, sizeof c->job_key);
            c->eng.tops = &loomi_route_ops;
            c->route_mask = mask;
            c->bind_addr = proto->bind_addr;
            c->bind_len = proto->bind_len;
            c->rdv_addr = proto->rdv_addr;
            c->rdv_len = proto->rdv_len;
            c->rdv_keyed = 1; /* a joiner holds the job's key */
            c->rdv_fd = -1;
            r = loomi_comm_prepare(c, &me, addr);
            if (r == LOOM_SUCCESS &&
                send_msg(hc.fd, tx, LOOMI_CMSG_ADDR, e, (uint64_t)newrank, addr, LOOMI_ADDR_BYTES,
                         deadline))
                r = LOOM_ERR_REMOTE; /* the connection broke: the next read says so */
            free(data);
            if (r != LOOM_SUCCESS && r != LOOM_ERR_REMOTE) break;
            continue;
        }
        if (type == LOOMI_CMSG_ALL && c && e == epoch && arg == 0 && len == 0) {
            /* The members gave the round up: they admit this process
             * again in the next one. */
            free(data);
            loomi_comm_discard(c);
            c = NULL;
            continue;
        }
        if (type == LOOMI_CMSG_ALL && c && e == epoch) {
            if (arg != (uint64_t)newn || len != (uint32_t)newn * LOOMI_ADDR_BYTES ||
                memcmp(data + (size_t)newrank * LOOMI_ADDR_BYTES, addr, LOOMI_ADDR_BYTES)) {
                free(data);
                r = loomi_fail(LOOM_ERR_REMOTE, -1, "%s: the holder sent bad addresses", fn);
                break;
            }
            loomi_guard_set(readmitted, &hc);
            r = loomi_comm_finish(c, data, deadline, &links);
            loomi_guard_set(NULL, NULL);
            free(data);
            /* Connected or not, the members' commit says whether the new
             * communicator holds: everybody's part of it was built. */
            uint64_t verdict = 0;
            while (r == LOOM_SUCCESS) {
                uint16_t t2;
                uint32_t e2, l2;
                unsigned char *d2;
                if (read_msg(hc.fd, rx, deadline, &t2, &e2, &verdict, &d2, &l2)) {
                    verdict = 0;
                    free(d2);
                    break;
                }
                free(d2);
                if (t2 == LOOMI_CMSG_ALL && e2 == epoch && l2 == 0) break;
            }
            if (r == LOOM_SUCCESS && verdict == LOOMI_CTRL_ALL_COMMIT) {
                hconn_close(&hc);
                LOOMI_INFO(newrank, "%s: admitted as rank %d of %d after %llu ms", fn, newrank,
                           newn, (unsigned long long)(loomi_now_ms() - t0));
                free(proto);
                *comm = c->handle;
                return LOOM_SUCCESS;
            }
            /* A member failed during the admission: the members decide
             * again (this process, admitted already, comes first) and
             * send a new ACCEPT on this connection. */
            snprintf(last, sizeof last, "%s",
                     r != LOOM_SUCCESS ? loom_get_last_error()
                                       : "the members gave the round up");
            LOOMI_INFO(-1, "%s: connecting the grown communicator failed (%s); waiting for "
                           "the members to admit this process again", fn, last);
            loomi_comm_discard(c);
            c = NULL;
            r = LOOM_ERR_TIMEOUT;
            continue;
        }
        free(data); /* stale or unknown: ignore */
    }
    hconn_close(&hc);
    if (c) loomi_comm_discard(c);
    free(proto);
    if (r == LOOM_ERR_TIMEOUT && last[0])
        r = loomi_fail(LOOM_ERR_TIMEOUT, -1,
                       "%s: not admitted within LOOM_TIMEOUT (%d ms); the last admission "
                       "failed: %s",
                       fn, (int)(deadline - t0), last);
    else if (r == LOOM_ERR_TIMEOUT)
        r = loomi_fail(LOOM_ERR_TIMEOUT, -1,
                       "%s: not admitted within LOOM_TIMEOUT (%d ms): no member called "
                       "loom_comm_grow, or the rendezvous %s:%s is not held",
                       fn, (int)(deadline - t0), t.host, t.port);
    return r;
}
