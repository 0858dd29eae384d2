/* net.h - socket helpers shared by the transports and the bootstrap. */
#ifndef LOOMI_NET_H
#define LOOMI_NET_H

#include <stdint.h>
#include <sys/socket.h>

#include "loom.h"
#include "transports/auth.h"

/* What each rank publishes at bootstrap: its transports' addresses
 * (route.h), its topology card (topo.h) and its control-plane address
 * (ctrl.h), in that order. */
#define LOOMI_ADDR_BYTES 576
/* Endpoint addresses travel as this fixed-size, byte-order-defined blob. */
struct loomi_wire_addr {
    uint16_t family; /* 4 or 6 */
    uint16_t port;   /* network order */
    uint32_t scope;
    unsigned char ip[16];
};

int loomi_sockaddr_to_wire(const struct sockaddr *sa, struct loomi_wire_addr *w);
int loomi_wire_to_sockaddr(const struct loomi_wire_addr *w, struct sockaddr_storage *ss,
                           socklen_t *len);
/* "a.b.c.d:port" or "[v6]:port". */
void loomi_sockaddr_str(const struct sockaddr *sa, char *buf, size_t n);

/* Pick the local address to use: by LOOM_SOCKET_IFNAME-style spec (comma
 * separated prefixes, leading ^ to exclude, leading = for exact names), or
 * when spec is empty the first interface that is up and not loopback,
 * else loopback.  Returns 0 or -1 with *why set. */
int loomi_pick_address(const char *spec, struct sockaddr_storage *ss, socklen_t *len,
                       char *ifname, size_t ifname_len, const char **why);

/* The address tcp and verbs listen on, with port 0: the interface ifname
 * (LOOM_SOCKET_IFNAME) names, else the bind hint (hint_len bytes, used
 * when it fits), else loomi_pick_address's choice.  Failures are
 * reported as "NAME: ..." for rank `rank`. */
loom_result_t loomi_listen_address(const char *name, int rank, const char *ifname,
                                   const void *hint, size_t hint_len,
                                   struct sockaddr_storage *ss, socklen_t *len);

/* Connect to host:port before deadline_ms, retrying while refused (the
 * peer may not be listening yet).  Returns a blocking fd, or -1 with
 * msg describing what was tried. */
int loomi_connect_retry(const struct sockaddr *sa, socklen_t len, uint64_t deadline_ms,
                        char *msg, size_t msglen);
/* Same, and while it retries it logs at level info, as rank `rank`, what
 * it connects to (`what`, e.g. "rendezvous root"), the error each time
 * and how long it goes on (until tmo, the deadline as messages name it). */
int loomi_connect_retry_log(const struct sockaddr *sa, socklen_t len, uint64_t deadline_ms,
                            int rank, const char *what, const char *tmo, char *msg,
                            size_t msglen);
/* "ECONNREFUSED" for ECONNREFUSED, and so on for the errors of sockets;
 * "errno" for others. */
const char *loomi_errno_name(int e);

/* Write / read exactly n bytes on a blocking or non-blocking fd, waiting
 * with poll until deadline_ms.  Return 0, or -1 (errno set; ETIMEDOUT on
 * the deadline, ECONNRESET on EOF while reading). */
/* poll() on one descriptor until it is ready or deadline_ms, in short
 * slices, asking the thread's guard (loomi_guard_set) between them:
 * returns poll's result (0 at the deadline, -1 on error), or -2 when the
 * guard stopped the wait (why says why). */
struct pollfd;
int loomi_poll_guarded(struct pollfd *pf, uint64_t deadline_ms, char *why, size_t n);
/* A connection to rank `peer`, which published w (tcp's and verbs'
 * connections to lower ranks), made as loomi_connect_retry makes it, on
 * which this rank (me) then proved it holds the job's key and the peer
 * did (auth.h: a connection of that kind and stream), with its key
 * material in session (unless NULL); or -1 with *r set:
 * LOOM_ERR_MISMATCH when w is no address or the handshake fails,
 * LOOM_ERR_CONNECT when it cannot be reached ("NAME: rank P: ..." for
 * rank me). */
int loomi_connect_peer(const struct loomi_wire_addr *w, int peer, uint64_t deadline_ms,
                       const char *name, int me, const unsigned char *key, uint32_t kind,
                       uint32_t stream, unsigned char *session, loom_result_t *r);

/* What a greeting on a connection from a higher rank begins with (tcp's
 * and verbs' struct hello: more follows).  It comes after the handshake
 * of auth.h, and carries nothing secret. */
struct loomi_greeting {
    uint32_t magic;
    int32_t src, dst;
};

/* Connections accepted on a listening socket and still proving
 * themselves, kept between calls of loomi_accept_greeting: at most
 * LOOMI_ACCEPT_PENDING at a time, each for LOOMI_AUTH_WAIT_MS at most,
 * all served at once, so a silent or slow stranger holds up no member. */
#define LOOMI_ACCEPT_PENDING 16
struct loomi_acceptor {
    int lfd, n;
    struct loomi_greeting want; /* what each greeting must begin with */
    const char *name;           /* whose connections, in messages */
    struct {
        int fd;
        uint64_t since;
        struct loomi_auth_accept a;
    } c[LOOMI_ACCEPT_PENDING];
};
/* An acceptor on listening socket lfd for rank me, whose greetings begin
 * with magic and name me; name (a string constant) names the connections
 * in messages. */
void loomi_acceptor_init(struct loomi_acceptor *ac, int lfd, uint32_t magic, int me,
                         const char *name);
/* Drop the connections still pending (not the listening socket). */
void loomi_acceptor_close(struct loomi_acceptor *ac);
/* Every connection is in: drop the pending ones, close the listening
 * socket and set *lfd to -1.  Returns LOOM_SUCCESS. */
loom_result_t loomi_acceptor_finish(struct loomi_acceptor *ac, int *lfd);
/* The error for loomi_accept_greeting's -2 (why: the guard's reason) or
 * -3, after got of expected connections: "<name>: <got> of <expected>
 * <what>; gave up: <why>" or "... <what> before the deadline<more>". */
loom_result_t loomi_accept_error(const struct loomi_acceptor *ac, int code, int got,
                                 int expected, const char *what, const char *why,
                                 const char *more);

/* The next connection on ac's listening socket (tcp's and verbs'
 * connections from higher ranks, the control plane's from lower ones),
 * waited for until deadline_ms, asking the thread's guard
 * (loomi_guard_set) every few milliseconds: its handshake (auth.h, with
 * key: a connection of this kind to ac's rank), then its greeting, n
 * bytes read into hello.  One that does not prove it holds the key in
 * time, or whose greeting does not begin with ac's magic, name ac's
 * rank, and come from the rank it proved to be, in lo..hi-1, is
 * logged with its address (as ac's name's) and dropped.  Returns the
 * connection, blocking (its key material in session, unless NULL); -2
 * when the guard stopped the wait (why says why), -3 at the deadline,
 * and then ac is closed (loomi_acceptor_close). */
int loomi_accept_greeting(struct loomi_acceptor *ac, int lo, int hi, const unsigned char *key,
                          uint32_t kind, void *hello, size_t n, unsigned char *session,
                          uint64_t deadline_ms, char *why, size_t wn);
int loomi_write_full(int fd, const void *buf, size_t n, uint64_t deadline_ms);
int loomi_read_full(int fd, void *buf, size_t n, uint64_t deadline_ms);
/* A polite close's wait: read and drop what still comes on fd until the
 * peer closes its side, an error, or deadline_ms. */
void loomi_await_close(int fd, uint64_t deadline_ms);
/* Read n bytes into buf, *got of them already there, before deadline_ms:
 * the one reader of the handshakes and the rendezvous.  With why set,
 * each wait asks the thread's guard as loomi_poll_guarded does.  0; -1
 * (errno set: ETIMEDOUT at the deadline, ECONNRESET when the peer closed;
 * *got says what came); -2 when the guard stopped it (why says why). */
int loomi_read_more(int fd, void *buf, size_t n, size_t *got, uint64_t deadline_ms, char *why,
                    size_t wn);

/* Hash bytes into 16 (job keys from launcher strings); not cryptographic. */
void loomi_hash128(const void *data, size_t len, unsigned char out[16]);

#endif
