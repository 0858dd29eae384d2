/*
 * bootstrap.c - the rendezvous: every rank registers its transport
 * address with the root and receives everyone's.
 *
 * The root is a thread (in rank 0's process, or in whichever process
 * called loom_get_unique_id).  It checks each registration - protocol
 * version, job key, job size, rank range, duplicates - and answers a bad
 * one at once with the reason, so a mismatched job fails with a message
 * instead of hanging.  Everything it reads is length-checked first.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/net.h"

#define BOOT_MAGIC 0x4c4d4254u /* "LMBT" */
/* 2: addresses carry topology cards; 3: and control addresses; 4: hellos
 * carry the settings every rank must share. */
#define BOOT_VERSION 4u
#define BOOT_MAX_RANKS (1 << 20)

struct boot_hello {
    uint32_t magic, version;
    unsigned char job_key[16];
    int32_t nranks, rank;
    uint32_t addr_len;
    unsigned char addr[LOOMI_ADDR_BYTES];
    struct loomi_uniform uniform;
};

struct boot_reply {
    uint32_t magic;
    int32_t code; /* loom_result_t */
    int32_t nranks;
    int32_t whole; /* 1: the job is refused, not only this rank */
    char msg[320];
    /* followed, on success, by nranks * LOOMI_ADDR_BYTES */
};

/* ---------------------------------------------------------------- root */

struct root_client {
    int fd;
    size_t got;
    struct boot_hello h;
};

struct root_args {
    int lfd;
    unsigned char key[16];
    int nranks; /* 0: set by the first registration */
    uint64_t deadline_ms;
    char name[96];
};

static void send_reply(int fd, loom_result_t code, int whole, uint64_t deadline, const char *msg)
{
    struct boot_reply rp;
    memset(&rp, 0, sizeof rp);
    rp.magic = BOOT_MAGIC;
    rp.code = code;
    rp.whole = whole;
    snprintf(rp.msg, sizeof rp.msg, "%s", msg);
    /* Short deadline: a refused client must not hold up the job. */
    uint64_t d = loomi_now_ms() + 1000;
    loomi_write_full(fd, &rp, sizeof rp, d < deadline ? d : deadline);
}

static void reply_error(int fd, loom_result_t code, uint64_t deadline, const char *fmt, ...)
    LOOMI_PRINTF(4, 5);
static void reply_error(int fd, loom_result_t code, uint64_t deadline, const char *fmt, ...)
{
    char msg[sizeof ((struct boot_reply *)0)->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    LOOMI_WARN(-1, "rendezvous root: refusing a registration: %s", msg);
    send_reply(fd, code, 0, deadline, msg);
}

static void *root_main(void *arg)
{
    struct root_args *a = arg;
    int cap = 64, n = 0, registered = 0;
    pthread_setname_np(pthread_self(), "loom-root");
    struct root_client *cl = calloc((size_t)cap, sizeof *cl);
    int *by_rank = NULL;
    unsigned char *table = NULL;
    struct pollfd *pf = NULL;
    if (!cl) goto out;

    while (a->nranks == 0 || registered < a->nranks) {
        int left = loomi_ms_left(a->deadline_ms);
        if (left == 0) {
            LOOMI_WARN(-1, "rendezvous root %s: deadline passed with %d of %d ranks registered",
                       a->name, registered, a->nranks);
            goto out;
        }
        free(pf);
        pf = calloc((size_t)n + 1, sizeof *pf);
        if (!pf) goto out;
        pf[0].fd = a->lfd;
        pf[0].events = POLLIN;
        for (int i = 0; i < n; i++) {
            pf[i + 1].fd = cl[i].got < sizeof cl[i].h ? cl[i].fd : -1;
            pf[i + 1].events = POLLIN;
        }
        int k = poll(pf, (nfds_t)n + 1, left);
        if (k < 0 && errno != EINTR) goto out;
        if (k <= 0) continue;
        int polled = n; /* clients accepted below have no pollfd yet */
        if (pf[0].revents & POLLIN) {
            int fd = accept4(a->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd >= 0) {
                if (n == cap) {
                    struct root_client *ncl = realloc(cl, (size_t)cap * 2 * sizeof *cl);
                    if (!ncl) { close(fd); goto out; }
                    cl = ncl;
                    cap *= 2;
                }
                memset(&cl[n], 0, sizeof cl[n]);
                cl[n++].fd = fd;
            }
        }
        for (int i = 0; i < polled; i++) {
            struct root_client *c = &cl[i];
            if (c->fd < 0 || c->got >= sizeof c->h || !(pf[i + 1].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t r = recv(c->fd, (char *)&c->h + c->got, sizeof c->h - c->got, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                close(c->fd);
                c->fd = -1;
                continue;
            }
            if (r < 0) continue;
            c->got += (size_t)r;
            const struct boot_hello *h = &c->h;
            /* Another version's hello may be shorter: judge it by its
             * first words rather than wait for bytes that never come. */
            const int early = c->got >= 2 * sizeof(uint32_t) &&
                              (h->magic != BOOT_MAGIC || h->version != BOOT_VERSION);
            if (c->got < sizeof c->h && !early) continue;
            loom_result_t bad = LOOM_SUCCESS;
            if (early) {
                reply_error(c->fd, LOOM_ERR_MISMATCH, a->deadline_ms,
                            "bootstrap protocol version %u is not %u (different Loom versions?)",
                            h->version, BOOT_VERSION);
                bad = LOOM_ERR_MISMATCH;
            } else if (memcmp(h->job_key, a->key, 16) != 0) {
                reply_error(c->fd, LOOM_ERR_MISMATCH, a->deadline_ms,
                            "rank %d carries another job's key (two jobs on one root address?)",
                            (int)h->rank);
                bad = LOOM_ERR_MISMATCH;
            } else if (h->nranks < 1 || h->nranks > BOOT_MAX_RANKS ||
                       (a->nranks && h->nranks != a->nranks)) {
                reply_error(c->fd, LOOM_ERR_MISMATCH, a->deadline_ms,
                            "rank %d says the job has %d ranks, the job has %d", (int)h->rank,
                            (int)h->nranks, a->nranks);
                bad = LOOM_ERR_MISMATCH;
            } else if (h->rank < 0 || h->rank >= h->nranks || h->addr_len > LOOMI_ADDR_BYTES) {
                reply_error(c->fd, LOOM_ERR_MISMATCH, a->deadline_ms,
                            "rank %d is out of range for %d ranks", (int)h->rank, (int)h->nranks);
                bad = LOOM_ERR_MISMATCH;
            } else {
                if (!a->nranks) a->nranks = h->nranks;
                if (!by_rank) {
                    by_rank = malloc((size_t)a->nranks * sizeof *by_rank);
                    if (!by_rank) goto out;
                    for (int j = 0; j < a->nranks; j++) by_rank[j] = -1;
                }
                if (by_rank[h->rank] >= 0) {
                    reply_error(c->fd, LOOM_ERR_MISMATCH, a->deadline_ms,
                                "rank %d registered twice", (int)h->rank);
                    bad = LOOM_ERR_MISMATCH;
                } else {
                    by_rank[h->rank] = i;
                    registered++;
                }
            }
            if (bad != LOOM_SUCCESS) {
                close(c->fd);
                c->fd = -1;
            }
        }
    }

    /* Everyone is here.  Ranks whose settings differ would part ways in
     * the first collective: refuse the job, on every rank, naming the
     * setting, rather than let them wait out LOOM_TIMEOUT. */
    if (a->nranks <= 0 || a->nranks > BOOT_MAX_RANKS) goto out;
    for (int j = 1; j < a->nranks; j++) {
        char msg[sizeof ((struct boot_reply *)0)->msg], who[16];
        snprintf(who, sizeof who, "rank %d", j);
        if (!loomi_uniform_diff(&cl[by_rank[0]].h.uniform, "rank 0", &cl[by_rank[j]].h.uniform,
                                who, msg, sizeof msg))
            continue;
        LOOMI_WARN(-1, "rendezvous root %s: refusing the job: %s", a->name, msg);
        /* Rank 0 last: this thread usually lives in its process, which
         * may exit as soon as it has its answer. */
        for (int q = a->nranks - 1; q >= 0; q--)
            send_reply(cl[by_rank[q]].fd, LOOM_ERR_MISMATCH, 1, a->deadline_ms, msg);
        goto out;
    }
    /* Send each the whole address table. */
    size_t tlen = sizeof(struct boot_reply) + (size_t)a->nranks * LOOMI_ADDR_BYTES;
    table = calloc(1, tlen);
    if (!table) goto out;
    struct boot_reply *rp = (struct boot_reply *)table;
    rp->magic = BOOT_MAGIC;
    rp->code = LOOM_SUCCESS;
    rp->nranks = a->nranks;
    for (int j = 0; j < a->nranks; j++)
        memcpy(table + sizeof *rp + (size_t)j * LOOMI_ADDR_BYTES, cl[by_rank[j]].h.addr,
               LOOMI_ADDR_BYTES);
    for (int j = a->nranks - 1; j >= 0; j--) /* rank 0 last, as above */
        if (loomi_write_full(cl[by_rank[j]].fd, table, tlen, a->deadline_ms))
            LOOMI_WARN(-1, "rendezvous root %s: could not answer rank %d: %s", a->name, j,
                       strerror(errno));
    LOOMI_INFO(-1, "rendezvous root %s: all %d ranks registered", a->name, a->nranks);
out:
    for (int i = 0; i < n; i++)
        if (cl[i].fd >= 0) close(cl[i].fd);
    close(a->lfd);
    free(cl);
    free(pf);
    free(by_rank);
    free(table);
    free(a);
    return NULL;
}

loom_result_t loomi_root_start(const char *host, char *port, size_t portlen,
                               const unsigned char job_key[16], int nranks, int timeout_ms,
                               int detached, pthread_t *thread)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0)
        return loomi_fail(LOOM_ERR_CONNECT, -1, "rendezvous root: cannot resolve %s:%s: %s",
                          host, port, gai_strerror(rc));
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        return loomi_fail(LOOM_ERR_SYSTEM, -1, "rendezvous root: socket: %s", strerror(errno));
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int b = bind(fd, res->ai_addr, res->ai_addrlen);
    if (b != 0 && errno == EADDRNOTAVAIL) {
        /* The name is this host's but not one of its addresses (NAT, an
         * alias): listen on all addresses with the same port instead. */
        struct sockaddr_storage any;
        memset(&any, 0, sizeof any);
        any.ss_family = (sa_family_t)res->ai_family;
        if (res->ai_family == AF_INET)
            ((struct sockaddr_in *)&any)->sin_port = ((struct sockaddr_in *)res->ai_addr)->sin_port;
        else
            ((struct sockaddr_in6 *)&any)->sin6_port =
                ((struct sockaddr_in6 *)res->ai_addr)->sin6_port;
        b = bind(fd, (struct sockaddr *)&any, res->ai_addrlen);
    }
    struct sockaddr_storage bound;
    socklen_t bl = sizeof bound;
    if (b != 0 || listen(fd, 4096) != 0 || getsockname(fd, (struct sockaddr *)&bound, &bl) != 0) {
        int e = errno;
        close(fd);
        freeaddrinfo(res);
        return loomi_fail(LOOM_ERR_SYSTEM, -1,
                          "rendezvous root: cannot listen on %s:%s: %s", host, port, strerror(e));
    }
    freeaddrinfo(res);
    uint16_t p = bound.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&bound)->sin_port)
                                            : ntohs(((struct sockaddr_in6 *)&bound)->sin6_port);
    snprintf(port, portlen, "%u", p);

    struct root_args *a = calloc(1, sizeof *a);
    if (!a) {
        close(fd);
        return loomi_fail(LOOM_ERR_NO_MEMORY, -1, "rendezvous root: out of memory");
    }
    a->lfd = fd;
    memcpy(a->key, job_key, 16);
    a->nranks = nranks;
    /* A little longer than the ranks' own deadline, so that a rank whose
     * job never completes hears "timed out" from itself, not a reset. */
    a->deadline_ms = loomi_now_ms() + (uint64_t)timeout_ms + 1000;
    snprintf(a->name, sizeof a->name, "%s:%s", host, port);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (detached) pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    rc = pthread_create(&t, &attr, root_main, a);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        close(fd);
        free(a);
        return loomi_fail(LOOM_ERR_SYSTEM, -1, "rendezvous root: pthread_create: %s",
                          strerror(rc));
    }
    if (thread) *thread = t;
    LOOMI_INFO(-1, "rendezvous root listening on %s:%s", host, port);
    return LOOM_SUCCESS;
}

/* -------------------------------------------------------------- client */

loom_result_t loomi_boot_connect(const struct loomi_boot_target *t, int rank,
                                 uint64_t deadline_ms, int *fdp, void *local, unsigned *local_len)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(t->host, t->port, &hints, &res);
    if (rc != 0)
        return loomi_fail(LOOM_ERR_CONNECT, rank, "cannot resolve rendezvous root %s:%s: %s",
                          t->host, t->port, gai_strerror(rc));
    char msg[256] = "";
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
        fd = loomi_connect_retry(ai->ai_addr, ai->ai_addrlen, deadline_ms, msg, sizeof msg);
    freeaddrinfo(res);
    if (fd < 0)
        return loomi_fail(LOOM_ERR_CONNECT, rank,
                          "rendezvous root %s:%s unreachable: %s", t->host, t->port, msg);
    if (local) {
        socklen_t l = *local_len;
        getsockname(fd, local, &l);
        *local_len = l;
    }
    *fdp = fd;
    return LOOM_SUCCESS;
}

loom_result_t loomi_boot_exchange(int fd, const struct loomi_boot_target *t, int rank,
                                  int nranks, const void *addr, size_t addr_len,
                                  const struct loomi_uniform *uniform, unsigned char *all_addrs,
                                  uint64_t deadline_ms)
{
    struct boot_hello h;
    memset(&h, 0, sizeof h);
    h.magic = BOOT_MAGIC;
    h.version = BOOT_VERSION;
    memcpy(h.job_key, t->job_key, 16);
    h.nranks = nranks;
    h.rank = rank;
    h.addr_len = (uint32_t)addr_len;
    memcpy(h.addr, addr, addr_len);
    h.uniform = *uniform;
    loom_result_t r = LOOM_SUCCESS;
    struct boot_reply rp;
    if (loomi_write_full(fd, &h, sizeof h, deadline_ms) ||
        loomi_read_full(fd, &rp, sizeof rp, deadline_ms)) {
        r = loomi_fail(errno == ETIMEDOUT ? LOOM_ERR_TIMEOUT : LOOM_ERR_CONNECT, rank,
                       "rendezvous with root %s:%s failed: %s (did all %d ranks start?)", t->host,
                       t->port, errno == ETIMEDOUT ? "deadline passed" : strerror(errno), nranks);
        goto out;
    }
    rp.msg[sizeof rp.msg - 1] = '\0';
    if (rp.magic != BOOT_MAGIC) {
        r = loomi_fail(LOOM_ERR_MISMATCH, rank,
                       "rendezvous root %s:%s answered with something that is not Loom", t->host,
                       t->port);
        goto out;
    }
    if (rp.code != LOOM_SUCCESS && rp.whole) {
        r = loomi_fail(rp.code == LOOM_ERR_MISMATCH ? LOOM_ERR_MISMATCH : LOOM_ERR_REMOTE, rank,
                       "rendezvous root %s:%s refused the job: %s", t->host, t->port, rp.msg);
        goto out;
    }
    if (rp.code != LOOM_SUCCESS) {
        r = loomi_fail(rp.code == LOOM_ERR_MISMATCH ? LOOM_ERR_MISMATCH : LOOM_ERR_REMOTE, rank,
                       "rendezvous root %s:%s refused rank %d: %s", t->host, t->port, rank,
                       rp.msg);
        goto out;
    }
    if (rp.nranks != nranks) {
        r = loomi_fail(LOOM_ERR_MISMATCH, rank, "rendezvous root %s:%s has %d ranks, not %d",
                       t->host, t->port, (int)rp.nranks, nranks);
        goto out;
    }
    if (loomi_read_full(fd, all_addrs, (size_t)nranks * LOOMI_ADDR_BYTES, deadline_ms))
        r = loomi_fail(LOOM_ERR_CONNECT, rank, "rendezvous root %s:%s: reading addresses: %s",
                       t->host, t->port, strerror(errno));
out:
    close(fd);
    return r;
}
