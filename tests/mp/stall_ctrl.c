/*
 * stall_ctrl.c - an LD_PRELOAD module for the tests: Loom's control
 * thread ("loom-ctrl") sleeps STALL_CTRL_MS milliseconds (default 30)
 * after every poll() that was allowed to wait.
 *
 * It stands for a machine so busy that the thread runs late: what the
 * peers send, and their closed connections, arrive between the thread's
 * poll and its acting on the result.  A peer that sent a message and
 * left must still be read before it is called failed (test_join.sh).
 */
#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*poll_fn)(struct pollfd *, nfds_t, int);

int poll(struct pollfd *fds, nfds_t nfds, int timeout)
{
    static poll_fn real;
    if (!real) {
        void *sym = dlsym(RTLD_NEXT, "poll");
        memcpy(&real, &sym, sizeof real); /* object to function pointer */
    }
    int rc = real(fds, nfds, timeout);
    char name[16] = "";
    if (timeout != 0 && pthread_getname_np(pthread_self(), name, sizeof name) == 0 &&
        strcmp(name, "loom-ctrl") == 0) {
        const char *e = getenv("STALL_CTRL_MS");
        int ms = e ? atoi(e) : 30;
        if (ms > 0 && ms < 10000) usleep((useconds_t)ms * 1000);
    }
    return rc;
}
