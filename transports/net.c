/* net.c - socket helpers with deadlines. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "transports/net.h"
#include "transports/auth.h"
#include "core/internal.h"

int loomi_sockaddr_to_wire(const struct sockaddr *sa, struct loomi_wire_addr *w)
{
    memset(w, 0, sizeof *w);
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const void *)sa;
        w->family = 4;
        w->port = in->sin_port;
        memcpy(w->ip, &in->sin_addr, 4);
        return 0;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const void *)sa;
        w->family = 6;
        w->port = in6->sin6_port;
        w->scope = in6->sin6_scope_id;
        memcpy(w->ip, &in6->sin6_addr, 16);
        return 0;
    }
    return -1;
}

int loomi_wire_to_sockaddr(const struct loomi_wire_addr *w, struct sockaddr_storage *ss,
                           socklen_t *len)
{
    memset(ss, 0, sizeof *ss);
    if (w->family == 4) {
        struct sockaddr_in *in = (void *)ss;
        in->sin_family = AF_INET;
        in->sin_port = w->port;
        memcpy(&in->sin_addr, w->ip, 4);
        *len = sizeof *in;
        return 0;
    }
    if (w->family == 6) {
        struct sockaddr_in6 *in6 = (void *)ss;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = w->port;
        in6->sin6_scope_id = w->scope;
        memcpy(&in6->sin6_addr, w->ip, 16);
        *len = sizeof *in6;
        return 0;
    }
    return -1;
}

void loomi_sockaddr_str(const struct sockaddr *sa, char *buf, size_t n)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const void *)sa;
        inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip);
        snprintf(buf, n, "%s:%u", ip, ntohs(in->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const void *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof ip);
        snprintf(buf, n, "[%s]:%u", ip, ntohs(in6->sin6_port));
    } else {
        snprintf(buf, n, "(family %d)", sa->sa_family);
    }
}

/* Does interface `name` match one entry of the spec list? */
static int spec_match(const char *spec, const char *name)
{
    int exact = 0;
    if (*spec == '=') { exact = 1; spec++; }
    while (*spec) {
        size_t len = strcspn(spec, ",");
        if (len && (exact ? (strlen(name) == len && !strncmp(name, spec, len))
                          : !strncmp(name, spec, len)))
            return 1;
        spec += len;
        if (*spec) spec++;
    }
    return 0;
}

int loomi_pick_address(const char *spec, struct sockaddr_storage *ss, socklen_t *len,
                       char *ifname, size_t ifname_len, const char **why)
{
    struct ifaddrs *ifs, *i;
    if (getifaddrs(&ifs) != 0) {
        *why = "getifaddrs failed";
        return -1;
    }
    int exclude = spec && *spec == '^';
    const char *list = spec ? spec + exclude : NULL;
    struct ifaddrs *best = NULL, *lo = NULL;
    /* Two passes: IPv4 first (what most clusters route), then IPv6. */
    for (int fam = 0; fam < 2 && !best; fam++) {
        int want = fam == 0 ? AF_INET : AF_INET6;
        for (i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != want) continue;
            if (!(i->ifa_flags & IFF_UP)) continue;
            if (want == AF_INET6) {
                const struct sockaddr_in6 *a6 = (const void *)i->ifa_addr;
                if (IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) continue;
            }
            if (list && *list) {
                if (spec_match(list, i->ifa_name) == exclude) continue;
                best = i;
                break;
            }
            if (i->ifa_flags & IFF_LOOPBACK) {
                if (!lo) lo = i;
                continue;
            }
            best = i;
            break;
        }
    }
    if (!best && !(list && *list)) best = lo;
    if (!best) {
        freeifaddrs(ifs);
        *why = "no interface that is up matches LOOM_SOCKET_IFNAME";
        return -1;
    }
    size_t l = best->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                                    : sizeof(struct sockaddr_in6);
    memset(ss, 0, sizeof *ss);
    memcpy(ss, best->ifa_addr, l);
    *len = (socklen_t)l;
    if (ifname) snprintf(ifname, ifname_len, "%s", best->ifa_name);
    freeifaddrs(ifs);
    return 0;
}

loom_result_t loomi_listen_address(const char *name, int rank, const char *ifname,
                                   const void *hint, size_t hint_len,
                                   struct sockaddr_storage *ss, socklen_t *len)
{
    const char *why = NULL;
    if (ifname) {
        if (loomi_pick_address(ifname, ss, len, NULL, 0, &why))
            return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank, "%s: LOOM_SOCKET_IFNAME=%s: %s",
                              name, ifname, why);
    } else if (hint && hint_len <= sizeof *ss) {
        memcpy(ss, hint, hint_len);
        *len = (socklen_t)hint_len;
    } else if (loomi_pick_address(NULL, ss, len, NULL, 0, &why)) {
        return loomi_fail(LOOM_ERR_SYSTEM, rank, "%s: no usable interface: %s", name, why);
    }
    if (ss->ss_family == AF_INET) ((struct sockaddr_in *)ss)->sin_port = 0;
    else ((struct sockaddr_in6 *)ss)->sin6_port = 0;
    return LOOM_SUCCESS;
}

static int wait_fd(int fd, short ev, uint64_t deadline_ms)
{
    for (int first = 1;; first = 0) {
        int left = loomi_ms_left(deadline_ms);
        /* One look even at the deadline: a connection on this host is
         * often made by the time connect() returns. */
        if (left == 0 && !first) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd p = {fd, ev, 0};
        int n = poll(&p, 1, left);
        if (n > 0) return 0;
        if (n < 0 && errno != EINTR) return -1;
    }
}

const char *loomi_errno_name(int e)
{
    switch (e) {
    case ECONNREFUSED: return "ECONNREFUSED";
    case ETIMEDOUT: return "ETIMEDOUT";
    case ENETUNREACH: return "ENETUNREACH";
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case ECONNRESET: return "ECONNRESET";
    case ECONNABORTED: return "ECONNABORTED";
    case EAGAIN: return "EAGAIN";
    case EADDRINUSE: return "EADDRINUSE";
    case EADDRNOTAVAIL: return "EADDRNOTAVAIL";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case ENETDOWN: return "ENETDOWN";
    case EHOSTDOWN: return "EHOSTDOWN";
    case EPIPE: return "EPIPE";
    case EAFNOSUPPORT: return "EAFNOSUPPORT";
    case EMFILE: return "EMFILE";
    case ENFILE: return "ENFILE";
    default: return "errno";
    }
}

/* What an error of connect() means for whoever waits on it. */
static const char *connect_hint(int e)
{
    switch (e) {
    case ECONNREFUSED: return "nothing listens there (not started yet, exited, or another address)";
    case ETIMEDOUT: return "no answer: the host is down, or a firewall drops the packets";
    case ENETUNREACH:
    case EHOSTUNREACH: return "no route to that host from here";
    case ECONNRESET: return "the listener closed the connection";
    default: return "";
    }
}

int loomi_connect_retry(const struct sockaddr *sa, socklen_t len, uint64_t deadline_ms,
                        char *msg, size_t msglen)
{
    return loomi_connect_retry_log(sa, len, deadline_ms, -2, NULL, NULL, msg, msglen);
}

int loomi_connect_retry_log(const struct sockaddr *sa, socklen_t len, uint64_t deadline_ms,
                            int rank, const char *what, const char *tmo, char *msg,
                            size_t msglen)
{
    char addr[80];
    loomi_sockaddr_str(sa, addr, sizeof addr);
    const uint64_t t0 = loomi_now_ms();
    uint64_t next_log = 0;
    /* last: the last error a connection attempt ended with; the attempt
     * the deadline cut short counts only when no other ended. */
    int backoff = 5, last = 0, attempts = 0, logged = 0;
    for (;;) {
        int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            snprintf(msg, msglen, "socket() for %s: %s (%s)", addr, strerror(errno),
                     loomi_errno_name(errno));
            return -1;
        }
        attempts++;
        int rc = connect(fd, sa, len), cut = 0;
        if (rc != 0 && errno == EINPROGRESS) {
            if (wait_fd(fd, POLLOUT, deadline_ms) == 0) {
                int err = 0;
                socklen_t el = sizeof err;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
                rc = err ? -1 : 0;
                errno = err;
            } else {
                rc = -1;
                cut = errno == ETIMEDOUT;
            }
        }
        if (rc == 0) {
            int fl = fcntl(fd, F_GETFL);
            fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
            if (logged)
                LOOMI_INFO(rank, "%s %s: connected after %d attempts (%llu ms)", what, addr,
                           attempts, (unsigned long long)(loomi_now_ms() - t0));
            return fd;
        }
        int e = errno;
        close(fd);
        if (!cut || !last) last = e;
        /* Refused or unreachable now may work later: the root may still
         * be starting.  Anything else, and the deadline, end it. */
        if (last != ECONNREFUSED && last != ENETUNREACH && last != EHOSTUNREACH &&
            last != ECONNRESET && last != EAGAIN && last != ETIMEDOUT)
            break;
        int left = loomi_ms_left(deadline_ms);
        if (left == 0) break;
        char why[200];
        if (loomi_guard_stop(why, sizeof why)) {
            snprintf(msg, msglen, "gave up on %s: %s", addr, why);
            return -1;
        }
        /* Say what is going on: at once, then every few seconds. */
        uint64_t now = loomi_now_ms();
        if (what && now >= next_log) {
            LOOMI_INFO(rank, "%s %s: %s (%s) on attempt %d; %s, for %d.%d s more (%s)", what,
                       addr, strerror(last), loomi_errno_name(last), attempts,
                       logged ? "still retrying" : "retrying", left / 1000, left % 1000 / 100,
                       tmo && *tmo ? tmo : "until the deadline");
            logged = 1;
            next_log = now + (attempts < 3 ? 1000 : 5000);
        }
        usleep((useconds_t)LOOMI_MIN(backoff, left) * 1000u);
        if (backoff < 200) backoff *= 2;
    }
    const char *hint = connect_hint(last);
    if (loomi_ms_left(deadline_ms) == 0)
        snprintf(msg, msglen, "could not connect to %s in %llu ms (%d attempt%s): %s (%s)%s%s",
                 addr, (unsigned long long)(loomi_now_ms() - t0), attempts,
                 attempts == 1 ? "" : "s", strerror(last), loomi_errno_name(last),
                 *hint ? ": " : "", hint);
    else
        snprintf(msg, msglen, "could not connect to %s: %s (%s)%s%s", addr, strerror(last),
                 loomi_errno_name(last), *hint ? ": " : "", hint);
    return -1;
}

int loomi_poll_guarded(struct pollfd *pf, uint64_t deadline_ms, char *why, size_t n)
{
    for (;;) {
        if (loomi_guard_stop(why, n)) return -2;
        int left = loomi_ms_left(deadline_ms);
        int slice = left > 20 ? 20 : left;
        int k = slice ? poll(pf, 1, slice) : 0;
        if (k < 0 && errno == EINTR) continue;
        if (k != 0 || left == 0) return k;
    }
}

int loomi_connect_peer(const struct loomi_wire_addr *w, int peer, uint64_t deadline_ms,
                       const char *name, int me, const unsigned char *key, uint32_t kind,
                       uint32_t stream, unsigned char *session, loom_result_t *r)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    if (loomi_wire_to_sockaddr(w, &ss, &sl)) {
        *r = loomi_fail(LOOM_ERR_MISMATCH, me, "%s: rank %d published an invalid address", name,
                        peer);
        return -1;
    }
    char msg[256];
    int fd = loomi_connect_retry((struct sockaddr *)&ss, sl, deadline_ms, msg, sizeof msg);
    if (fd < 0) {
        *r = loomi_fail(LOOM_ERR_CONNECT, me, "%s: rank %d: %s", name, peer, msg);
        return -1;
    }
    struct loomi_auth_id id = {kind, me, peer, stream};
    int ak = loomi_auth_open(fd, key, &id, deadline_ms, session, msg, sizeof msg);
    if (ak) {
        close(fd);
        /* Not this job's (-2); or the connection broke, or the thread's
         * guard gave up on the peer. */
        loom_result_t code = ak == -2                      ? LOOM_ERR_MISMATCH
                             : !strncmp(msg, "gave up", 7) ? LOOM_ERR_REMOTE
                                                           : LOOM_ERR_CONNECT;
        *r = loomi_fail(code, me, "%s: rank %d: handshake: %s", name, peer, msg);
        return -1;
    }
    return fd;
}

void loomi_acceptor_init(struct loomi_acceptor *ac, int lfd, uint32_t magic, int me,
                         const char *name)
{
    memset(ac, 0, sizeof *ac);
    ac->lfd = lfd;
    ac->want = (struct loomi_greeting){magic, me, me};
    ac->name = name;
    for (int i = 0; i < LOOMI_ACCEPT_PENDING; i++) ac->c[i].fd = -1;
}

void loomi_acceptor_close(struct loomi_acceptor *ac)
{
    for (int i = 0; i < LOOMI_ACCEPT_PENDING; i++)
        if (ac->c[i].fd >= 0) {
            close(ac->c[i].fd);
            ac->c[i].fd = -1;
        }
    ac->n = 0;
}

loom_result_t loomi_acceptor_finish(struct loomi_acceptor *ac, int *lfd)
{
    loomi_acceptor_close(ac);
    if (*lfd >= 0) close(*lfd);
    *lfd = -1;
    return LOOM_SUCCESS;
}

static void drop_pending(struct loomi_acceptor *ac, int i, int me, const char *name,
                         const char *why)
{
    loomi_auth_log_refusal(me, name, ac->c[i].fd, why);
    close(ac->c[i].fd);
    ac->c[i].fd = -1;
    ac->n--;
}

/* loomi_accept_greeting's end without a connection: the ones still
 * proving themselves go too. */
static int give_up(struct loomi_acceptor *ac, int code)
{
    loomi_acceptor_close(ac);
    return code;
}

loom_result_t loomi_accept_error(const struct loomi_acceptor *ac, int code, int got,
                                 int expected, const char *what, const char *why,
                                 const char *more)
{
    if (code == -2)
        return loomi_fail(LOOM_ERR_REMOTE, ac->want.dst, "%s: %d of %d %s; gave up: %s",
                          ac->name, got, expected, what, why);
    return loomi_fail(LOOM_ERR_TIMEOUT, ac->want.dst, "%s: %d of %d %s before the deadline%s",
                      ac->name, got, expected, what, more ? more : "");
}

int loomi_accept_greeting(struct loomi_acceptor *ac, int lo, int hi, const unsigned char *key,
                          uint32_t kind, void *hello, size_t n, unsigned char *session,
                          uint64_t deadline_ms, char *why, size_t wn)
{
    const int me = ac->want.dst;
    const char *name = ac->name;
    for (;;) {
        if (loomi_guard_stop(why, wn)) return give_up(ac, -2);
        uint64_t now = loomi_now_ms();
        for (int i = 0; i < LOOMI_ACCEPT_PENDING; i++)
            if (ac->c[i].fd >= 0 && now - ac->c[i].since > LOOMI_AUTH_WAIT_MS)
                drop_pending(ac, i, me, name, "no handshake in time");
        int left = loomi_ms_left(deadline_ms);
        if (left == 0) return give_up(ac, -3);
        /* The listening socket while there is room, and every connection
         * still proving itself: one slow or silent stalls no other. */
        struct pollfd pf[LOOMI_ACCEPT_PENDING + 1];
        int who[LOOMI_ACCEPT_PENDING + 1], np = 0;
        if (ac->n < LOOMI_ACCEPT_PENDING) {
            pf[np] = (struct pollfd){ac->lfd, POLLIN, 0};
            who[np++] = -1;
        }
        for (int i = 0; i < LOOMI_ACCEPT_PENDING; i++)
            if (ac->c[i].fd >= 0) {
                pf[np] = (struct pollfd){ac->c[i].fd, POLLIN, 0};
                who[np++] = i;
            }
        int k = poll(pf, (nfds_t)np, left > 20 ? 20 : left);
        if (k < 0 && errno != EINTR) return give_up(ac, -3);
        if (k <= 0) continue;
        for (int j = 0; j < np; j++) {
            if (!pf[j].revents) continue;
            if (who[j] < 0) {
                int fd = accept4(ac->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0) {
                    if (errno == EMFILE || errno == ENFILE) usleep(20000); /* not a spin */
                    continue;
                }
                for (int i = 0; i < LOOMI_ACCEPT_PENDING; i++)
                    if (ac->c[i].fd < 0) {
                        ac->c[i].fd = fd;
                        ac->c[i].since = loomi_now_ms();
                        loomi_auth_accept_init(&ac->c[i].a, 1u << kind, me);
                        ac->n++;
                        break;
                    }
                continue;
            }
            const int i = who[j];
            if (ac->c[i].fd != pf[j].fd) continue;
            char msg[200];
            int ak = loomi_auth_accept_step(&ac->c[i].a, ac->c[i].fd, key, msg, sizeof msg);
            if (ak < 0) drop_pending(ac, i, me, name, msg);
            if (ak <= 0) continue;
            /* Proven: its greeting follows at once. */
            int fd = ac->c[i].fd;
            uint64_t d = ac->c[i].since + LOOMI_AUTH_WAIT_MS;
            struct loomi_greeting g = {0};
            int ok = n >= sizeof g && loomi_read_full(fd, hello, n, d < deadline_ms ? d : deadline_ms) == 0;
            if (ok) memcpy(&g, hello, sizeof g);
            const struct loomi_auth_id *id = &ac->c[i].a.id;
            if (!ok || g.magic != ac->want.magic || g.dst != me || g.src != id->src || g.src < lo ||
                g.src >= hi) {
                drop_pending(ac, i, me, name,
                             ok ? "a greeting that is not this job's, or from the wrong rank"
                                : "no greeting in time after the handshake");
                continue;
            }
            if (session) memcpy(session, ac->c[i].a.session, LOOMI_AUTH_SESSION_BYTES);
            memset(&ac->c[i].a, 0, sizeof ac->c[i].a);
            ac->c[i].fd = -1;
            ac->n--;
            int fl = fcntl(fd, F_GETFL);
            if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
            return fd;
        }
    }
}

int loomi_write_full(int fd, const void *buf, size_t n, uint64_t deadline_ms)
{
    const char *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_fd(fd, POLLOUT, deadline_ms)) return -1;
            continue;
        }
        return -1;
    }
    return 0;
}

int loomi_read_more(int fd, void *buf, size_t n, size_t *got, uint64_t deadline_ms, char *why,
                    size_t wn)
{
    while (*got < n) {
        ssize_t r = recv(fd, (char *)buf + *got, n - *got, MSG_DONTWAIT);
        if (r > 0) {
            *got += (size_t)r;
            continue;
        }
        if (r == 0) {
            errno = ECONNRESET;
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        if (!why) {
            if (wait_fd(fd, POLLIN, deadline_ms)) return -1;
            continue;
        }
        struct pollfd pf = {fd, POLLIN, 0};
        int k = loomi_poll_guarded(&pf, deadline_ms, why, wn);
        if (k == -2) return -2;
        if (k == 0) errno = ETIMEDOUT;
        if (k <= 0) return -1;
    }
    return 0;
}

void loomi_await_close(int fd, uint64_t deadline_ms)
{
    char junk[256];
    for (;;) {
        int left = loomi_ms_left(deadline_ms);
        struct pollfd pf = {fd, POLLIN, 0};
        if (!left || poll(&pf, 1, left) <= 0) return;
        ssize_t k = recv(fd, junk, sizeof junk, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) return;
    }
}

int loomi_read_full(int fd, void *buf, size_t n, uint64_t deadline_ms)
{
    size_t got = 0;
    return loomi_read_more(fd, buf, n, &got, deadline_ms, NULL, 0);
}

void loomi_hash128(const void *data, size_t len, unsigned char out[16])
{
    /* Two FNV-1a lanes with different offsets, then mixed. */
    uint64_t h1 = 0xcbf29ce484222325ull, h2 = 0x84222325cbf29ce4ull;
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h1 = (h1 ^ p[i]) * 0x100000001b3ull;
        h2 = (h2 ^ p[i]) * 0x100000001b3ull;
        h2 ^= h2 >> 29;
    }
    h1 ^= h1 >> 33;
    h1 *= 0xff51afd7ed558ccdull;
    h1 ^= h1 >> 33;
    memcpy(out, &h1, 8);
    memcpy(out + 8, &h2, 8);
}
