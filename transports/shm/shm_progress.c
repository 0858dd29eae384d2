/*
 * loomi_shm_progress.c - the shared-memory transport's progress (a pass over
 * the local peers' FIFOs and reads, spinning then yielding while it
 * waits) and the liveness of peers whose transfers wait: their lock,
 * their pid and their state word.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>

#include "transports/shm/shm_internal.h"

/* --------------------------------------------------------- liveness */

/* The peer's state word says goodbye or abort: act on it.  Returns 1 if
 * it did. */
static int peer_state(struct shm *t, struct peer *p)
{
    /* Acquire: abort_failed and abort_code, and the cells sent before a
     * goodbye, are read after the word their writer release-stored last
     * (shm_abort_all, shm_destroy). */
    uint32_t st = atomic_load_explicit(&p->hdr->state, memory_order_acquire);
    if (st == ST_LIVE) return 0;
    /* What it sent before is in our FIFO: take it first. */
    loomi_shm_poll_in(t, p, 1 << 30);
    if (p->failed) return 1;
    if (st == ST_ABORT) {
        int failed = p->hdr->abort_failed;
        loom_result_t code = (loom_result_t)p->hdr->abort_code;
        if (failed < -1 || failed >= t->ctx.nranks) failed = -1;
        if (code != LOOM_ERR_REVOKED && code != LOOM_ERR_TIMEOUT && code != LOOM_ERR_MISMATCH)
            code = LOOM_ERR_REMOTE;
        LOOMI_INFO(t->ctx.rank, "shm: rank %d aborted the communicator (rank %d failed)", p->rank,
                   failed);
        loomi_shm_peer_down(t, p, failed, code, "the peer aborted the communicator", 1);
        return 1;
    }
    if (st == ST_BYE) {
        p->gone = 1;
        if (p->npending)
            loomi_shm_peer_error(
                t, p, LOOM_ERR_REMOTE,
                "the peer destroyed the communicator with operations pending here");
        return 1;
    }
    PROTO(t, p, "bad state word %u", st);
    return 1;
}

static void check_peer(struct shm *t, struct peer *p)
{
    if (peer_state(t, p)) return;
    int dead = lock_free(p->fd) == 1;
    if (!dead && p->pid_visible && kill(p->pid, 0) != 0 && errno == ESRCH) dead = 1;
    if (!dead) return;
    /* A polite close also drops the lock: read the state word again (it is
     * written before the lock goes). */
    if (peer_state(t, p)) return;
    loomi_shm_poll_in(t, p, 1 << 30);
    loomi_shm_peer_error(t, p, LOOM_ERR_REMOTE, "process %d exited (or was killed)", (int)p->pid);
}

/* ------------------------------------------------------------ progress */

static int pass(struct shm *t)
{
    int total = 0, waiting = 0;
    for (int i = 0; i < t->nlocal; i++) {
        struct peer *p = &t->peers[t->local[i]];
        if (!p->connected || p->failed) continue;
        int n = loomi_shm_poll_in(t, p, (int)t->ncells);
        if (p->reads && !p->failed) n += loomi_shm_do_reads(t, p);
        if ((p->sq.head || p->nctl) && !p->failed) n += loomi_shm_pump_out(t, p);
        if (n) {
            p->wait_ms = 0;
            total += n;
        } else if (p->npending) {
            waiting = 1;
        }
    }
    t->moved += (uint64_t)total;
    if (!waiting) return total;
    /* The liveness clock only needs milliseconds: read it every 64 idle
     * passes, not on each (a clock read costs as much as a pass). */
    if (++t->idle_passes % 64) return total;
    uint64_t now = loomi_now_ms();
    for (int i = 0; i < t->nlocal; i++) {
        struct peer *p = &t->peers[t->local[i]];
        if (!p->connected || p->failed || !p->npending) continue;
        if (!p->wait_ms) {
            p->wait_ms = now;
        } else if (now - p->wait_ms >= CHECK_MS && now - p->check_ms >= CHECK_MS) {
            p->check_ms = now;
            check_peer(t, p);
        }
    }
    return total;
}

loom_result_t loomi_shm_progress(void *state, int timeout_ms)
{
    struct shm *t = state;
    if (t->aborted) return LOOM_SUCCESS;
    const uint64_t e0 = t->events;
    if (pass(t) || t->events != e0 || timeout_ms <= 0) return LOOM_SUCCESS;
    /* Spin a little first: a reply a peer is about to write costs a
     * system call less to catch.  Then yield between passes: other ranks
     * may need this core to make the progress we wait for. */
    for (int i = 0; i < SPIN_PASSES; i++)
        if (pass(t) || t->events != e0 || t->aborted) return LOOM_SUCCESS;
    uint64_t end = loomi_now_ns() + (uint64_t)timeout_ms * 1000000u;
    do {
        sched_yield();
        if (pass(t) || t->events != e0 || t->aborted) break;
    } while (loomi_now_ns() < end);
    return LOOM_SUCCESS;
}

int loomi_shm_wait_fd(void *state)
{
    (void)state;
    return -1;
}

uint64_t loomi_shm_moved(void *state) { return ((struct shm *)state)->moved; }
