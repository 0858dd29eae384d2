/*
 * flip_byte.c - an LD_PRELOAD module for the tests: a man in the middle.
 * In the process whose LOOM_RANK is FLIP_RANK (default 1), the
 * FLIP_AFTER-th (default 3) send() or sendmsg() of at least FLIP_MIN
 * bytes (default 100000: only the TCP transport's bulk writes are that
 * large; FLIP_MAX, if set, the most) goes out with one byte changed, at
 * FLIP_AT (default 100), once.
 * The caller's buffer is not touched: the changed copy is what the
 * kernel gets, as a middle box would change it on the wire.
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

static atomic_int seen;

static long env_num(const char *name, long dflt)
{
    const char *e = getenv(name);
    return e && *e ? strtol(e, NULL, 10) : dflt;
}

/* 1 when this write of n bytes is the one to change. */
static int is_victim(size_t n)
{
    static int armed = -1;
    if (armed < 0) armed = env_num("LOOM_RANK", -1) == env_num("FLIP_RANK", 1);
    if (!armed || n < (size_t)env_num("FLIP_MIN", 100000) ||
        n > (size_t)env_num("FLIP_MAX", (long)(~0ul >> 1)))
        return 0;
    return atomic_fetch_add(&seen, 1) + 1 == env_num("FLIP_AFTER", 3);
}

static void *real_fn(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

static ssize_t (*real_send)(int, const void *, size_t, int);

/* The first at + 1 bytes of buf, the last of them changed: the rest is
 * the caller's to send again, unchanged. */
static ssize_t flip_send(int fd, const void *buf, size_t n, int flags)
{
    size_t at = (size_t)env_num("FLIP_AT", 100);
    unsigned char *copy = at < n ? malloc(at + 1) : NULL;
    if (!copy) return real_send(fd, buf, n, flags);
    memcpy(copy, buf, at + 1);
    copy[at] ^= 0x20;
    ssize_t w = real_send(fd, copy, at + 1, flags & ~MSG_DONTWAIT);
    free(copy);
    return w;
}

static void load(void)
{
    if (!real_send) {
        void *sym = real_fn("send");
        memcpy(&real_send, &sym, sizeof real_send);
    }
}

ssize_t send(int fd, const void *buf, size_t n, int flags)
{
    load();
    if (!is_victim(n)) return real_send(fd, buf, n, flags);
    return flip_send(fd, buf, n, flags);
}

ssize_t sendmsg(int fd, const struct msghdr *mh, int flags)
{
    static ssize_t (*real)(int, const struct msghdr *, int);
    if (!real) {
        void *sym = real_fn("sendmsg");
        memcpy(&real, &sym, sizeof real);
    }
    load();
    size_t n = 0;
    for (size_t i = 0; i < mh->msg_iovlen; i++) n += mh->msg_iov[i].iov_len;
    size_t at = (size_t)env_num("FLIP_AT", 100);
    if (!is_victim(n) || at >= n) return real(fd, mh, flags);
    /* The bytes up to the changed one, gathered from the iovecs. */
    unsigned char *copy = malloc(at + 1);
    if (!copy) return real(fd, mh, flags);
    size_t got = 0;
    for (size_t i = 0; got <= at && i < mh->msg_iovlen; i++) {
        size_t k = mh->msg_iov[i].iov_len < at + 1 - got ? mh->msg_iov[i].iov_len : at + 1 - got;
        memcpy(copy + got, mh->msg_iov[i].iov_base, k);
        got += k;
    }
    copy[at] ^= 0x20;
    ssize_t w = real_send(fd, copy, at + 1, flags & ~MSG_DONTWAIT);
    free(copy);
    return w;
}
