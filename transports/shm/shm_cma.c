/*
 * shm_cma.c - the shared-memory transport's single-copy path: a receive
 * reads the sender's buffer with process_vm_readv, a piece per progress
 * pass, acks it, or asks for the message through the FIFO when the
 * kernel refuses (shm.c says how it works).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "transports/shm/shm_internal.h"

int loomi_shm_fault_cma;

/* ------------------------------------------------- single-copy reads */

/* Start moving a descriptor's bytes into x (or say we cannot). */
void loomi_shm_start_read(struct shm *t, struct peer *p, struct loomi_xfer *x, uint64_t raddr,
                          uint64_t id)
{
    struct rd *r = calloc(1, sizeof *r);
    if (!r) {
        done(p, x, LOOM_ERR_NO_MEMORY);
        loomi_shm_peer_error(t, p, LOOM_ERR_NO_MEMORY, "out of memory for a single-copy read");
        return;
    }
    r->x = x;
    r->raddr = raddr;
    r->id = id;
    x->t_done = 0;
    if (p->no_cma_read) {
        /* Listed first: should the push fail, failing p completes x. */
        r->next = p->resends;
        p->resends = r;
        loomi_shm_ctl_push(t, p, C_NACK, id);
    } else {
        r->next = p->reads;
        p->reads = r;
    }
}

/* The sender withdrew a single-copy send: what we read may be its
 * restored or reused buffer.  Park the receive (no completion): the
 * sender is aborting, and its abort (or death) fails it with the right
 * reason. */
static void park(struct peer *p, struct rd **l, struct rd *r)
{
    *l = r->next;
    r->next = p->resends; /* waits there for a resend that never comes */
    p->resends = r;
}

/* One piece of each single-copy read from p.  Returns pieces moved. */
int loomi_shm_do_reads(struct shm *t, struct peer *p)
{
    int n = 0;
    struct rd **l = &p->reads;
    /* p->failed first: a failed peer's list (and *l) is gone. */
    while (!p->failed && *l) {
        struct rd *r = *l;
        struct loomi_xfer *x = r->x;
        /* Acquire: a flag seen set is seen before anything read after. */
        if (atomic_load_explicit(&p->hdr->withdrawn, memory_order_acquire)) {
            park(p, l, r);
            continue;
        }
        size_t want = LOOMI_MIN(CMA_PIECE, x->len - x->t_done);
        ssize_t got = 0;
        int err = 0;
        if (want) {
            struct iovec lv = {(char *)x->buf + x->t_done, want};
            struct iovec rv = {(void *)(uintptr_t)(r->raddr + x->t_done), want};
            if (loomi_shm_fault_cma) got = -1, err = EPERM;
            else if ((got = process_vm_readv(p->pid, &lv, 1, &rv, 1, 0)) < 0) err = errno;
            else if (got == 0) err = EFAULT;
        }
        if (got > 0) {
            x->t_done += (size_t)got;
            n++;
        }
        /* Checked after the read: a flag still clear now means the buffer
         * was the sender's message all along.  The fence keeps the loads
         * of the read (the kernel's, on this core) ahead of the flag's
         * load: arm64 may otherwise satisfy the flag's load first and
         * miss a withdrawal that came before the bytes were overwritten
         * (the sender's fence in withdraw, shm_internal.h). */
        SHM_FENCE(memory_order_acquire);
        if (atomic_load_explicit(&p->hdr->withdrawn, memory_order_relaxed)) {
            park(p, l, r);
            continue;
        }
        if (!err && x->t_done == x->len) {
            uint64_t id = r->id;
            *l = r->next;
            free(r);
            done(p, x, LOOM_SUCCESS);
            loomi_shm_ctl_push(t, p, C_ACK, id);
            n++;
            continue;
        }
        if (!err) {
            l = &r->next;
            continue;
        }
        if (err == EPERM || err == ENOSYS || err == EACCES) {
            /* The kernel will not let us: the sender streams it instead,
             * this and every later message. */
            LOOMI_INFO(t->ctx.rank,
                       "shm: cannot read rank %d's memory (process_vm_readv: %s; ptrace "
                       "restrictions or a container?): asking it to copy through the FIFO",
                       p->rank, strerror(err));
            p->no_cma_read = 1;
            *l = r->next;
            r->next = p->resends;
            p->resends = r;
            x->t_done = 0;
            loomi_shm_ctl_push(t, p, C_NACK, r->id);
            n++;
            continue;
        }
        if (err == ESRCH) {
            loomi_shm_peer_error(t, p, LOOM_ERR_REMOTE,
                                 "process %d exited (single-copy read failed)", (int)p->pid);
        } else {
            PROTO(t, p, "single-copy read of %zu bytes at 0x%llx failed: %s", want,
                  (unsigned long long)(r->raddr + x->t_done), strerror(err));
        }
        return n;
    }
    return n;
}
