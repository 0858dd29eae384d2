/*
 * bootstrap.c - the rendezvous: every rank registers its transport
 * address with the root and receives everyone's.
 *
 * The root is a thread (in rank 0's process, or in whichever process
 * called loom_get_unique_id).  It checks each registration - protocol
 * version, job key, job size, rank range, duplicates - and answers a bad
 * one at once with the reason, so a mismatched job fails with a message
 * instead of hanging.  A registration that shows two jobs sharing the
 * root (a rank registered twice, another size, a second rank 0 that found
 * the address taken) refuses the whole job, on every rank, rather than
 * let parts of two jobs merge into one.  A rank whose deadline passes
 * asks the root what holds the job up, and every rank is told which
 * ranks never registered.  Everything it reads is length-checked first.
 *
 * Every connection to the root begins with the handshake of auth.h: a
 * registration is read only from a process that proved it holds the
 * job's key.  Until then a connection costs the root one fixed-size
 * record; at most ROOT_UNPROVEN of them wait at a time, each for
 * LOOMI_AUTH_WAIT_MS at most.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "transports/net.h"

#define BOOT_MAGIC 0x4c4d4254u /* "LMBT" */
#define BOOT_QUERY 0x4c4d4251u /* "LMBQ": a registered rank's deadline passed */
/* 2: addresses carry topology cards; 3: and control addresses; 4: hellos
 * carry the settings every rank must share; 5: and flags, the pid and the
 * host (for messages), and a registered rank may ask what holds the job
 * up; 6: after the handshake of auth.h, without the key. */
#define BOOT_VERSION 6u
#define BOOT_MAX_RANKS (1 << 20)
/* Not a registration: a rank 0 found this root's address in use. */
#define BOOT_F_CONFLICT 1u

struct boot_hello {
    uint32_t magic, version;
    int32_t nranks, rank;
    uint32_t flags;
    int32_t pid;
    char host[64];
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

static void fill_who(struct boot_hello *h)
{
    h->pid = (int32_t)getpid();
    if (gethostname(h->host, sizeof h->host) != 0) snprintf(h->host, sizeof h->host, "?");
    h->host[sizeof h->host - 1] = '\0';
}

/* A hello from rank of nranks, to the root that target t names. */
static void hello_init(struct boot_hello *h, const struct loomi_boot_target *t, int nranks,
                       int rank)
{
    memset(h, 0, sizeof *h);
    h->magic = BOOT_MAGIC;
    h->version = BOOT_VERSION;
    (void)t;
    h->nranks = nranks;
    h->rank = rank;
}

/* ---------------------------------------------------------------- root */

/* Connections not yet proven that the root keeps at a time; more wait in
 * the listening socket's backlog. */
#define ROOT_UNPROVEN 64

struct root_client {
    int fd;
    struct loomi_auth_accept auth; /* proven when auth.phase == 2 */
    uint64_t since;                /* accepted at (ms) */
    size_t got;
    struct boot_hello h;
    int rank;     /* registered as this rank; -1: not (yet) */
    size_t qgot;  /* bytes of a query read */
    uint32_t q;
};

struct root_args {
    int lfd;
    unsigned char key[LOOMI_AUTH_KEY_BYTES];
    int keyed;
    int nranks;        /* 0: set by the first registration */
    int size_from_env; /* nranks came from rank 0's own environment */
    uint64_t deadline_ms;
    char name[96];
    /* Once the job is refused: why, and with which code; every rank
     * registered has been told, and every one that comes is. */
    loom_result_t refused;
    char why[sizeof ((struct boot_reply *)0)->msg];
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
    LOOMI_VFORMAT(msg, fmt);
    LOOMI_WARN(-1, "rendezvous root: refusing a registration: %s", msg);
    send_reply(fd, code, 0, deadline, msg);
}

/* "1, 3-5, 9" for the ranks q < n with by_rank[q] < 0 (want 0) or >= 0
 * (want 1); at most about 120 characters, then "and N more". */
static int rank_list(char *buf, size_t len, const int *by_rank, int n, int want)
{
    size_t o = 0;
    int count = 0, shown = 0;
    buf[0] = '\0';
    for (int q = 0; q < n; q++) {
        if ((by_rank[q] >= 0) != want) continue;
        int e = q;
        while (e + 1 < n && (by_rank[e + 1] >= 0) == want) e++;
        count += e - q + 1;
        if (o < 120 && o < len) {
            int k = e == q ? snprintf(buf + o, len - o, "%s%d", o ? ", " : "", q)
                           : snprintf(buf + o, len - o, "%s%d-%d", o ? ", " : "", q, e);
            if (k > 0) o += (size_t)k;
            shown += e - q + 1;
        }
        q = e;
    }
    if (count > shown && o < len) snprintf(buf + o, len - o, " and %d more", count - shown);
    return count;
}

/* What holds the job up, for a message: "2 of 4 ranks had registered;
 * never registered: ranks 1, 3". */
static void missing(const struct root_args *a, const int *by_rank, int registered, char *buf,
                    size_t len)
{
    if (!a->nranks || !by_rank) {
        snprintf(buf, len, "no rank registered");
        return;
    }
    char list[160];
    rank_list(list, sizeof list, by_rank, a->nranks, 0);
    snprintf(buf, len, "%d of %d ranks had registered; never registered: %s%s", registered,
             a->nranks, strchr(list, ',') || strchr(list, '-') ? "ranks " : "rank ", list);
}

/* Refuse the whole job: the process on fd `first` (not registered; -1:
 * none) and every rank registered are told (rank 0 last: this thread
 * usually lives in its process, which may exit as soon as it has its
 * answer), and so is every rank that comes later. */
static void refuse_job(struct root_args *a, struct root_client *cl, const int *by_rank, int first,
                       loom_result_t code, const char *fmt, ...) LOOMI_PRINTF(6, 7);
static void refuse_job(struct root_args *a, struct root_client *cl, const int *by_rank, int first,
                       loom_result_t code, const char *fmt, ...)
{
    LOOMI_VFORMAT(a->why, fmt);
    a->refused = code;
    LOOMI_WARN(-1, "rendezvous root %s: refusing the job: %s", a->name, a->why);
    if (first >= 0) send_reply(first, code, 1, a->deadline_ms, a->why);
    for (int q = a->nranks - 1; by_rank && q >= 0; q--) {
        struct root_client *c = by_rank[q] >= 0 ? &cl[by_rank[q]] : NULL;
        if (!c || c->fd < 0) continue;
        send_reply(c->fd, code, 1, a->deadline_ms, a->why);
        close(c->fd);
        c->fd = -1;
    }
}

/* A new hello, complete (or of another version): judge it.  Returns 1
 * when it registered. */
static int judge(struct root_args *a, struct root_client *cl, int i, int **by_rankp,
                 int *registered, int early)
{
    struct root_client *c = &cl[i];
    const struct boot_hello *h = &c->h;
    char who[128];
    snprintf(who, sizeof who, "pid %d on %.64s", (int)h->pid, h->host);
    const char *apart = a->keyed ? "" : ", or a LOOM_JOB_KEY of its own";
    if (early) {
        reply_error(c->fd, LOOM_ERR_MISMATCH, a->deadline_ms,
                    "bootstrap protocol version %u is not %u (different Loom versions?)",
                    h->version, BOOT_VERSION);
        return 0;
    }
    if (a->refused) {
        send_reply(c->fd, a->refused, 1, a->deadline_ms, a->why);
        return 0;
    }
    if (h->flags & BOOT_F_CONFLICT) {
        refuse_job(a, cl, *by_rankp, c->fd, LOOM_ERR_MISMATCH,
                   "a second rank 0 (%s) found this job's root address %s in use: two jobs "
                   "on one root address; give each its own port%s",
                   who, a->name, apart);
        return 0;
    }
    if (h->nranks < 1 || h->nranks > BOOT_MAX_RANKS || h->addr_len > LOOMI_ADDR_BYTES) {
        reply_error(c->fd, LOOM_ERR_MISMATCH, a->deadline_ms,
                    "rank %d (%s) says the job has %d ranks, which is not in 1..%d",
                    (int)h->rank, who, (int)h->nranks, BOOT_MAX_RANKS);
        return 0;
    }
    if (a->nranks && h->nranks != a->nranks) {
        refuse_job(a, cl, *by_rankp, c->fd, LOOM_ERR_MISMATCH,
                   "rank %d (%s) says the job has %d ranks, the job has %d (as %s): "
                   "LOOM_SIZE (or the launcher's size) differs, or two jobs share the root "
                   "address",
                   (int)h->rank, who, (int)h->nranks, a->nranks,
                   a->size_from_env ? "rank 0 says" : "the first rank to register said");
        return 0;
    }
    if (h->rank < 0 || h->rank >= h->nranks) {
        reply_error(c->fd, LOOM_ERR_MISMATCH, a->deadline_ms,
                    "rank %d (%s) is out of range for %d ranks", (int)h->rank, who,
                    (int)h->nranks);
        return 0;
    }
    if (!a->nranks) a->nranks = h->nranks;
    if (!*by_rankp) {
        *by_rankp = malloc((size_t)a->nranks * sizeof **by_rankp);
        if (!*by_rankp) {
            reply_error(c->fd, LOOM_ERR_NO_MEMORY, a->deadline_ms, "the root is out of memory");
            return 0;
        }
        for (int j = 0; j < a->nranks; j++) (*by_rankp)[j] = -1;
    }
    int *by_rank = *by_rankp;
    if (by_rank[h->rank] >= 0) {
        const struct boot_hello *o = &cl[by_rank[h->rank]].h;
        refuse_job(a, cl, by_rank, c->fd, LOOM_ERR_MISMATCH,
                   "rank %d registered twice, by pid %d on %.64s and by %s: two jobs on one "
                   "root address? Give each its own port%s",
                   (int)h->rank, (int)o->pid, o->host, who, apart);
        return 0;
    }
    by_rank[h->rank] = i;
    c->rank = h->rank;
    ++*registered;
    LOOMI_TRACE(-1, "rendezvous root %s: rank %d registered (%s), %d of %d", a->name,
                (int)h->rank, who, *registered, a->nranks);
    return 1;
}

/* Take the next connection from the listening socket into a free
 * record of cl (growing it while every record holds a rank or an
 * unproven connection, ROOT_UNPROVEN of those at most).  Returns 0, or
 * -1 when the root cannot go on (out of memory). */
static int root_accept(struct root_args *a, struct root_client **clp, int *cap, int *n,
                       int *unproven, uint64_t *pause_until)
{
    int fd = accept4(a->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            /* Out of descriptors: the connection stays in the backlog;
             * look again shortly rather than spin on it. */
            LOOMI_WARN(-1, "rendezvous root %s: cannot accept a connection: %s (%s); "
                           "trying again in 100 ms", a->name, strerror(errno),
                       loomi_errno_name(errno));
            *pause_until = loomi_now_ms() + 100;
        }
        return 0;
    }
    struct root_client *cl = *clp;
    int slot = -1;
    for (int i = 0; i < *n && slot < 0; i++)
        if (cl[i].fd < 0 && cl[i].rank < 0) slot = i;
    if (slot < 0) {
        if (*n == *cap) {
            struct root_client *ncl = realloc(cl, (size_t)*cap * 2 * sizeof *cl);
            if (!ncl) {
                close(fd);
                return -1;
            }
            *clp = cl = ncl;
            *cap *= 2;
        }
        slot = (*n)++;
    }
    memset(&cl[slot], 0, sizeof cl[slot]);
    cl[slot].rank = -1;
    cl[slot].fd = fd;
    cl[slot].since = loomi_now_ms();
    /* A joiner that comes before the job formed is proven here too, and
     * then told its request is no registration: it tries again until
     * the job's join service holds the address. */
    loomi_auth_accept_init(&cl[slot].auth, 1u << LOOMI_AUTH_BOOT | 1u << LOOMI_AUTH_JOIN, -1);
    ++*unproven;
    return 0;
}

/* Drop an unregistered connection (a stranger, or one that failed or
 * timed out), logging why with its address. */
static void root_drop(struct root_args *a, struct root_client *c, int *unproven, const char *why)
{
    if (why) {
        char service[128];
        snprintf(service, sizeof service, "rendezvous root %s", a->name);
        loomi_auth_log_refusal(-1, service, c->fd, why);
    }
    --*unproven; /* every connection dropped here is unregistered */
    close(c->fd);
    c->fd = -1;
}

static void *root_main(void *arg)
{
    struct root_args *a = arg;
    int cap = 64, n = 0, registered = 0, unproven = 0;
    uint64_t pause_until = 0;
    pthread_setname_np(pthread_self(), "loom-root");
    struct root_client *cl = calloc((size_t)cap, sizeof *cl);
    int *by_rank = NULL;
    unsigned char *table = NULL;
    struct pollfd *pf = NULL;
    if (!cl) goto out;

    while (a->refused || a->nranks == 0 || registered < a->nranks) {
        int left = loomi_ms_left(a->deadline_ms);
        if (left == 0) {
            if (!a->refused) {
                char m[200];
                missing(a, by_rank, registered, m, sizeof m);
                refuse_job(a, cl, by_rank, -1, LOOM_ERR_TIMEOUT, "at the root's deadline, %s", m);
            }
            goto out;
        }
        /* Unproven connections past their time go. */
        uint64_t now = loomi_now_ms();
        for (int i = 0; i < n; i++)
            if (cl[i].fd >= 0 && cl[i].rank < 0 && now - cl[i].since > LOOMI_AUTH_WAIT_MS)
                root_drop(a, &cl[i], &unproven,
                          cl[i].auth.phase == 2 ? "proven, but no registration in time"
                                                : "no handshake in time");
        free(pf);
        pf = calloc((size_t)n + 1, sizeof *pf);
        if (!pf) goto out;
        pf[0].fd = unproven < ROOT_UNPROVEN && now >= pause_until ? a->lfd : -1;
        pf[0].events = POLLIN;
        for (int i = 0; i < n; i++) {
            pf[i + 1].fd = cl[i].fd;
            pf[i + 1].events = POLLIN;
        }
        /* Wake for the deadlines of unproven connections too. */
        int k = poll(pf, (nfds_t)n + 1, left < 100 ? left : 100);
        if (k < 0 && errno != EINTR) goto out;
        if (k <= 0) continue;
        int polled = n; /* clients accepted below have no pollfd yet */
        if ((pf[0].revents & POLLIN) &&
            root_accept(a, &cl, &cap, &n, &unproven, &pause_until))
            goto out;
        for (int i = 0; i < polled; i++) {
            struct root_client *c = &cl[i];
            if (c->fd < 0 || !(pf[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            if (c->auth.phase != 2) {
                char why[200];
                int ak = loomi_auth_accept_step(&c->auth, c->fd, a->key, why, sizeof why);
                if (ak < 0) root_drop(a, c, &unproven, why);
                if (ak <= 0) continue;
                /* Proven: its registration follows (read below, or on
                 * the next round). */
            }
            if (c->rank >= 0) {
                /* A registered rank: it asks at its deadline what holds
                 * the job up, or it went away. */
                ssize_t r = recv(c->fd, (char *)&c->q + c->qgot, sizeof c->q - c->qgot,
                                 MSG_DONTWAIT);
                if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                if (r > 0) c->qgot += (size_t)r;
                if (r > 0 && c->qgot < sizeof c->q) continue;
                if (r > 0 && c->q == BOOT_QUERY) {
                    char m[200];
                    missing(a, by_rank, registered, m, sizeof m);
                    refuse_job(a, cl, by_rank, -1, LOOM_ERR_TIMEOUT,
                               "when rank %d's deadline passed, %s", c->rank, m);
                    continue;
                }
                LOOMI_INFO(-1, "rendezvous root %s: rank %d (pid %d on %.64s) left before the "
                           "job was complete", a->name, c->rank, (int)c->h.pid, c->h.host);
                by_rank[c->rank] = -1;
                registered--;
                close(c->fd);
                c->fd = -1;
                continue;
            }
            ssize_t r = recv(c->fd, (char *)&c->h + c->got, sizeof c->h - c->got, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                root_drop(a, c, &unproven, NULL);
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
            c->h.host[sizeof c->h.host - 1] = '\0';
            if (!judge(a, cl, i, &by_rank, &registered, early)) root_drop(a, c, &unproven, NULL);
            else unproven--;
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
        /* Rank 0 last, as in refuse_job. */
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

int loomi_boot_late_hello(int fd, const unsigned char *buf, size_t len, int keyed,
                          const char *addr, char *why, size_t whyn)
{
    struct boot_hello h;
    uint32_t w[2];
    if (len < sizeof w) return 0;
    memcpy(w, buf, sizeof w);
    if (w[0] != BOOT_MAGIC) return -1;
    uint64_t d = loomi_now_ms() + 200;
    if (w[1] != BOOT_VERSION) {
        send_reply(fd, LOOM_ERR_MISMATCH, 0, d, "a job of another Loom version runs here");
        return 1;
    }
    if (len < sizeof h) return 0;
    memcpy(&h, buf, sizeof h);
    h.host[sizeof h.host - 1] = '\0';
    char who[128];
    if (h.flags & BOOT_F_CONFLICT)
        snprintf(who, sizeof who, "a second rank 0 (pid %d on %.64s)", (int)h.pid, h.host);
    else
        snprintf(who, sizeof who, "rank %d (pid %d on %.64s)", (int)h.rank, (int)h.pid, h.host);
    char msg[sizeof ((struct boot_reply *)0)->msg];
    /* It proved it holds this job's key (the join service saw to it). */
    if (keyed)
        snprintf(msg, sizeof msg, "%s came to %s after its job had formed without it: the "
                 "job is running (a rank started twice?)", who, addr);
    else
        snprintf(msg, sizeof msg, "%s came to %s after a job with its key had formed "
                 "without it: two jobs on one root address; the running job is refused too. "
                 "Give each job its own port, or a LOOM_JOB_KEY of its own", who, addr);
    LOOMI_WARN(-1, "join service at %s: refusing a registration: %s", addr, msg);
    send_reply(fd, LOOM_ERR_MISMATCH, 1, d, msg);
    if (keyed) return 1;
    snprintf(why, whyn, "%s registered at this job's root address %s after the job had "
             "formed: two jobs on one root address, and this one may hold ranks of the other; "
             "give each job its own port, or a LOOM_JOB_KEY of its own", who, addr);
    return 2;
}

int loomi_boot_host_is_local(const char *host)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0) return 0;
    int local = 1;
    /* Every address the name has must be this host's: one that binds. */
    for (struct addrinfo *ai = res; ai && local; ai = ai->ai_next) {
        int s = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        local = s >= 0 && bind(s, ai->ai_addr, ai->ai_addrlen) == 0;
        if (s >= 0) close(s);
    }
    freeaddrinfo(res);
    return local;
}

/* This host's addresses, for a message: "127.0.0.1, 192.0.2.2". */
static void host_addresses(char *buf, size_t len)
{
    struct ifaddrs *ifs;
    size_t o = 0;
    buf[0] = '\0';
    if (getifaddrs(&ifs) != 0) return;
    for (struct ifaddrs *i = ifs; i && o + 48 < len; i = i->ifa_next) {
        if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
        char ip[INET6_ADDRSTRLEN];
        if (i->ifa_addr->sa_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, ip, sizeof ip);
        else if (i->ifa_addr->sa_family == AF_INET6 &&
                 !IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr))
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, ip, sizeof ip);
        else
            continue;
        int k = snprintf(buf + o, len - o, "%s%s", o ? ", " : "", ip);
        if (k > 0) o += (size_t)k;
    }
    freeifaddrs(ifs);
}

/* The address of this job's root is taken: tell whoever listens there
 * (a root of another job with the same key refuses its job, rather than
 * take this job's ranks for its own), and say what it answered. */
static void tell_root_in_use(const struct loomi_boot_target *t, const struct sockaddr *sa,
                             socklen_t len, int nranks, char *said, size_t saidlen)
{
    char msg[200];
    uint64_t d = loomi_now_ms() + 1000;
    snprintf(said, saidlen, "what listens there did not answer as a rendezvous root (a "
                            "running job's join service, another program, or another Loom "
                            "version)");
    int fd = loomi_connect_retry(sa, len, d, msg, sizeof msg);
    if (fd < 0) return;
    struct loomi_auth_id id = {LOOMI_AUTH_BOOT, 0, -1, 0};
    if (loomi_auth_open(fd, t->job_key, &id, d, NULL, msg, sizeof msg)) {
        snprintf(said, saidlen, "what listens there is not this job's (%s)", msg);
        close(fd);
        return;
    }
    struct boot_hello h;
    hello_init(&h, t, nranks, 0);
    h.flags = BOOT_F_CONFLICT;
    fill_who(&h);
    struct boot_reply rp;
    if (loomi_write_full(fd, &h, sizeof h, d) == 0 && loomi_read_full(fd, &rp, sizeof rp, d) == 0 &&
        rp.magic == BOOT_MAGIC) {
        rp.msg[sizeof rp.msg - 1] = '\0';
        snprintf(said, saidlen, "the root there answered: %s", rp.msg);
    }
    close(fd);
}

loom_result_t loomi_root_start(const struct loomi_boot_target *t, char *port, size_t portlen,
                               int nranks, uint64_t deadline_ms, int detached,
                               pthread_t *thread, int *listen_fd)
{
    if (listen_fd) *listen_fd = -1;
    const char *host = t->host;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0)
        return loomi_fail(LOOM_ERR_CONNECT, -1, "rendezvous root: cannot resolve %s:%s: %s",
                          host, port, gai_strerror(rc));
    /* Each address the name has, until one binds. */
    int fd = -1, err = 0, in_use = 0;
    struct addrinfo *used = NULL;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        int s = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(s, ai->ai_addr, ai->ai_addrlen) == 0 && listen(s, 4096) == 0) {
            fd = s;
            used = ai;
            break;
        }
        if (errno == EADDRINUSE && !in_use) {
            in_use = 1;
            used = ai;
        }
        if (!err || errno != EADDRNOTAVAIL) err = errno;
        close(s);
    }
    if (fd < 0 && in_use) {
        /* Fail at once, and tell whoever holds the address. */
        char said[400];
        tell_root_in_use(t, used->ai_addr, used->ai_addrlen, nranks, said, sizeof said);
        freeaddrinfo(res);
        return loomi_fail(LOOM_ERR_SYSTEM, 0,
                          "rendezvous root: cannot listen on %s:%s: address in use "
                          "(EADDRINUSE): is another job's root there? %s",
                          host, port, said);
    }
    freeaddrinfo(res);
    if (fd < 0 && err == EADDRNOTAVAIL) {
        char name[64] = "?", addrs[256];
        gethostname(name, sizeof name);
        name[sizeof name - 1] = '\0';
        host_addresses(addrs, sizeof addrs);
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, 0,
                          "rendezvous root: rank 0 serves the rendezvous at %s:%s, but %s is not "
                          "an address of this host (%s, whose addresses are %s): the root "
                          "address (LOOM_ROOT, or MASTER_ADDR) must be rank 0's host",
                          host, port, host, name, addrs);
    }
    if (fd < 0)
        return loomi_fail(LOOM_ERR_SYSTEM, -1, "rendezvous root: cannot listen on %s:%s: %s (%s)",
                          host, port, strerror(err), loomi_errno_name(err));
    struct sockaddr_storage bound;
    socklen_t bl = sizeof bound;
    if (getsockname(fd, (struct sockaddr *)&bound, &bl) != 0) {
        int e = errno;
        close(fd);
        return loomi_fail(LOOM_ERR_SYSTEM, -1, "rendezvous root: getsockname: %s", strerror(e));
    }
    uint16_t p = bound.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&bound)->sin_port)
                                            : ntohs(((struct sockaddr_in6 *)&bound)->sin6_port);
    snprintf(port, portlen, "%u", p);

    struct root_args *a = calloc(1, sizeof *a);
    if (!a) {
        close(fd);
        return loomi_fail(LOOM_ERR_NO_MEMORY, -1, "rendezvous root: out of memory");
    }
    a->lfd = fd;
    memcpy(a->key, t->job_key, sizeof a->key);
    a->keyed = t->keyed;
    a->nranks = nranks;
    a->size_from_env = nranks > 0;
    a->deadline_ms = deadline_ms;
    snprintf(a->name, sizeof a->name, "%.72s:%.15s", host, port);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (detached) pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    rc = pthread_create(&th, &attr, root_main, a);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        close(fd);
        free(a);
        return loomi_fail(LOOM_ERR_SYSTEM, -1, "rendezvous root: pthread_create: %s",
                          strerror(rc));
    }
    if (thread) *thread = th;
    /* The thread holds a's descriptor; this one is the caller's. */
    if (listen_fd) *listen_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    LOOMI_INFO(-1, "rendezvous root listening on %s:%s", host, port);
    return LOOM_SUCCESS;
}

/* -------------------------------------------------------------- client */

loom_result_t loomi_boot_connect(const struct loomi_boot_target *t, int rank,
                                 uint64_t deadline_ms, int *fdp, void *local, unsigned *local_len,
                                 unsigned char *session)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(t->host, t->port, &hints, &res);
    if (rc != 0)
        return loomi_fail(LOOM_ERR_CONNECT, rank, "cannot resolve rendezvous root %s:%s: %s",
                          t->host, t->port, gai_strerror(rc));
    char msg[320] = "";
    int fd = -1;
    const char *tmo = t->tmo[0] ? t->tmo : "the deadline";
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
        fd = loomi_connect_retry_log(ai->ai_addr, ai->ai_addrlen, deadline_ms, rank,
                                     "rendezvous root", tmo, msg, sizeof msg);
    freeaddrinfo(res);
    if (fd < 0)
        return loomi_fail(LOOM_ERR_CONNECT, rank, "rendezvous root %s:%s unreachable within %s: %s",
                          t->host, t->port, tmo, msg);
    struct loomi_auth_id id = {rank < 0 ? LOOMI_AUTH_JOIN : LOOMI_AUTH_BOOT, rank, -1, 0};
    int ak = loomi_auth_open(fd, t->job_key, &id, deadline_ms, session, msg, sizeof msg);
    if (ak == -1) {
        close(fd);
        return loomi_fail(LOOM_ERR_REMOTE, rank,
                          "rendezvous %s:%s: the connection broke in the handshake: %s", t->host,
                          t->port, msg);
    }
    if (ak) {
        close(fd);
        return loomi_fail(LOOM_ERR_MISMATCH, rank,
                          "rendezvous root %s:%s: the handshake failed: %s. Another job's "
                          "root may listen there (two jobs on one root address?), or "
                          "LOOM_JOB_KEY differs between ranks",
                          t->host, t->port, msg);
    }
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
    hello_init(&h, t, nranks, rank);
    fill_who(&h);
    h.addr_len = (uint32_t)addr_len;
    memcpy(h.addr, addr, addr_len);
    h.uniform = *uniform;
    const char *tmo = t->tmo[0] ? t->tmo : "the deadline";
    loom_result_t r = LOOM_SUCCESS;
    struct boot_reply rp;
    size_t got = 0;
    if (loomi_write_full(fd, &h, sizeof h, deadline_ms)) {
        r = loomi_fail(errno == ETIMEDOUT ? LOOM_ERR_TIMEOUT : LOOM_ERR_CONNECT, rank,
                       "rendezvous with root %s:%s failed: could not register within %s: %s",
                       t->host, t->port, tmo,
                       errno == ETIMEDOUT ? "deadline passed" : strerror(errno));
        goto out;
    }
    if (loomi_read_more(fd, &rp, sizeof rp, &got, deadline_ms, NULL, 0)) {
        int e = errno;
        if (e != ETIMEDOUT) {
            r = loomi_fail(LOOM_ERR_CONNECT, rank,
                           "rendezvous with root %s:%s failed: %s (%s) while waiting for the "
                           "other ranks: the root's process ended?",
                           t->host, t->port, strerror(e), loomi_errno_name(e));
            goto out;
        }
        /* This rank's deadline passed: ask the root what holds the job
         * up.  It tells every rank registered, and answers at once. */
        uint32_t q = BOOT_QUERY;
        uint64_t grace = loomi_now_ms() + 1000;
        deadline_ms = grace;
        if (loomi_write_full(fd, &q, sizeof q, grace) ||
            loomi_read_more(fd, &rp, sizeof rp, &got, grace, NULL, 0)) {
            r = loomi_fail(LOOM_ERR_TIMEOUT, rank,
                           "rendezvous with root %s:%s: the job was not complete within %s, "
                           "and the root did not say which ranks are missing (did all %d "
                           "ranks start?)",
                           t->host, t->port, tmo, nranks);
            goto out;
        }
    }
    rp.msg[sizeof rp.msg - 1] = '\0';
    if (rp.magic != BOOT_MAGIC) {
        r = loomi_fail(LOOM_ERR_MISMATCH, rank,
                       "rendezvous root %s:%s answered with something that is not Loom", t->host,
                       t->port);
        goto out;
    }
    if (rp.code == LOOM_ERR_TIMEOUT) {
        r = loomi_fail(LOOM_ERR_TIMEOUT, rank,
                       "rendezvous root %s:%s: the job did not start within %s: %s", t->host,
                       t->port, tmo, rp.msg);
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
