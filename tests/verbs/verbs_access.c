/*
 * verbs_access.c - what a peer can reach in a rank's memory through the
 * verbs transport's registrations (run inside the soft-RoCE VM by
 * vm_suite.sh, section 9; security issue 47 item 5).
 *
 * Three verbs transport states, ranks 0 (A), 1 (B) and 2 (C), live in
 * this one process and connect over rxe0 as in a job.  The "attacker" is
 * a queue pair of this test connected, over the same device, to a queue
 * pair made in the victim's protection domain: the device checks its
 * RDMA writes and reads exactly as it checks a peer's (the key, the
 * bounds of the registration, its access rights, the protection domain).
 * Being in one process, the test also sees the victim's memory, so a
 * write that the device let through is seen to land.
 *
 * Checked (each "ok" line names what it shows):
 *  1. a rendezvous receive's buffer, while the receive waits for its
 *     data: the peer can RDMA-write it (control) but not RDMA-read it;
 *  2. after the transfer completes (another receive still pending, as in
 *     a collective's pipeline), its address and key give no access;
 *  3. a rendezvous send buffer's registration gives no remote access;
 *  4. loom_mem_register's registration gives no remote access;
 *  5. the credit word that B keeps for A: A writes it with the key B
 *     gave A (control); C, with the key B gave C, cannot;
 *  and the data of every transfer arrives intact.
 * Exit 0: all passed; 1: some failed; 77: no verbs here.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#ifndef HAVE_VERBS_H
int main(void)
{
    puts("verbs_access: built without infiniband/verbs.h: skipped");
    return 77;
}
#else

#include <pthread.h>
#include <string.h>

#include "transports/verbs/verbs_internal.h"

#define N 3
#define BIG (1u << 20) /* a rendezvous message */

static int failures;
static struct verbs *T[N];

#define OK(cond, ...)                                                                         \
    do {                                                                                      \
        if (cond) {                                                                           \
            printf("ok   - ");                                                                \
        } else {                                                                              \
            failures++;                                                                       \
            printf("FAIL - ");                                                                \
        }                                                                                     \
        printf(__VA_ARGS__);                                                                  \
        putchar('\n');                                                                        \
        fflush(stdout);                                                                       \
    } while (0)

static void on_peer_failed(void *owner, int peer, int failed, loom_result_t code, const char *why)
{
    (void)failed;
    (void)code;
    printf("# rank %d: peer %d failed: %s\n", (int)(intptr_t)owner, peer, why);
}

/* ------------------------------------------------------------ transfers */

struct xf {
    struct loomi_xfer x;
    int done;
    loom_result_t st;
};

static void on_done(struct loomi_xfer *x, loom_result_t st)
{
    struct xf *f = (struct xf *)x;
    f->done = 1;
    f->st = st;
}

static void xf_init(struct xf *f, int peer, uint64_t tag, void *buf, size_t len)
{
    memset(f, 0, sizeof *f);
    f->x.peer = peer;
    f->x.tag = tag;
    f->x.buf = buf;
    f->x.len = len;
    f->x.complete = on_done;
}

/* ----------------------------------------------------------- attacker */

/* Bring qp to RTS towards remote queue pair qpn on the same port. */
static int qp_up(struct verbs *v, struct ibv_qp *qp, uint32_t qpn)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = (uint8_t)v->dev.port;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (loomi_verbs_ib.modify_qp(qp, &a,
                                 IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                     IBV_QP_ACCESS_FLAGS))
        return -1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = v->dev.mtu;
    a.dest_qp_num = qpn;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = (uint8_t)v->dev.port;
    a.ah_attr.dlid = v->dev.lid;
    if (v->dev.link_layer == IBV_LINK_LAYER_ETHERNET || v->dev.gid_index >= 0) {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = v->dev.gid;
        a.ah_attr.grh.sgid_index = (uint8_t)(v->dev.gid_index < 0 ? 0 : v->dev.gid_index);
        a.ah_attr.grh.hop_limit = 64;
    }
    if (loomi_verbs_ib.modify_qp(qp, &a,
                                 IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                     IBV_QP_MIN_RNR_TIMER))
        return -1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    return loomi_verbs_ib.modify_qp(qp, &a,
                                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                        IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                        IBV_QP_MAX_QP_RD_ATOMIC)
               ? -1
               : 0;
}

/* An 8-byte RDMA write of val (or a read, into *got) to raddr under rkey,
 * from a queue pair of this test's own protection domain, connected to
 * one made in victim v's.  Returns the completion's status, or -1 when
 * the test could not set up or got no completion. */
static int attack(struct verbs *v, int read, uint64_t raddr, uint32_t rkey, uint64_t val,
                  uint64_t *got)
{
    static uint64_t local[1];
    int st = -1;
    struct ibv_pd *pd = loomi_verbs_ib.alloc_pd(v->ibctx);
    struct ibv_cq *cq = loomi_verbs_ib.create_cq(v->ibctx, 16, NULL, NULL, 0);
    struct ibv_mr *mr = pd ? loomi_verbs_ib.reg_mr(pd, local, sizeof local,
                                                   IBV_ACCESS_LOCAL_WRITE)
                           : NULL;
    struct ibv_qp *qa = NULL, *qv = NULL;
    if (!pd || !cq || !mr) goto out;
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    qa = loomi_verbs_ib.create_qp(pd, &ia);
    qv = loomi_verbs_ib.create_qp(v->pd, &ia); /* in the victim's domain */
    if (!qa || !qv || qp_up(v, qa, qv->qp_num) || qp_up(v, qv, qa->qp_num)) goto out;
    local[0] = val;
    struct ibv_sge sge = {.addr = (uintptr_t)local, .length = 8, .lkey = mr->lkey};
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    if (qa->context->ops.post_send(qa, &wr, &bad)) goto out;
    uint64_t end = loomi_now_ms() + 10000;
    struct ibv_wc wc;
    while (loomi_now_ms() < end) {
        int n = cq->context->ops.poll_cq(cq, 1, &wc);
        if (n < 0) break;
        if (n == 1) {
            st = (int)wc.status;
            if (got) *got = local[0];
            break;
        }
    }
out:
    if (qa) loomi_verbs_ib.destroy_qp(qa);
    if (qv) loomi_verbs_ib.destroy_qp(qv);
    if (mr) loomi_verbs_ib.dereg_mr(mr);
    if (cq) loomi_verbs_ib.destroy_cq(cq);
    if (pd) loomi_verbs_ib.dealloc_pd(pd);
    return st;
}

static const char *st_str(int st)
{
    if (st < 0) return "no completion";
    const char *s = loomi_verbs_ib.wc_status_str ? loomi_verbs_ib.wc_status_str(st) : NULL;
    return s ? s : "?";
}

/* Access refused: the device answered with an error (not: no answer). */
static int refused(int st)
{
    return st > 0 && st != IBV_WC_WR_FLUSH_ERR;
}

/* The rendezvous receive of x at rank t, from peer: its registration. */
static struct mrent *rr_mr(struct verbs *t, int peer, const struct loomi_xfer *x)
{
    for (int i = 0; i < RR_MAX; i++)
        if (t->peers[peer].rr[i].used && t->peers[peer].rr[i].x == x) return t->peers[peer].rr[i].mr;
    return NULL;
}

/* --------------------------------------------------------------- set-up */

struct conn {
    int r;
    unsigned char *addrs;
    loom_result_t rc;
};

static void *connect_one(void *arg)
{
    struct conn *c = arg;
    c->rc = loomi_verbs_ops.connect_all(T[c->r], c->addrs, LOOMI_VERBS_ADDR_BYTES,
                                        loomi_now_ms() + 60000);
    return NULL;
}

static void fill(unsigned char *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 31u + seed);
}

static int same(const unsigned char *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(i * 31u + seed)) return 0;
    return 1;
}

int main(void)
{
    static const unsigned char key[32] = {7, 7, 7};
    static unsigned char addrs[N * LOOMI_VERBS_ADDR_BYTES];
    char why[256];
    if (!loomi_verbs_available(why, sizeof why)) {
        printf("verbs_access: skipped: %s\n", why);
        return 77;
    }
    for (int r = 0; r < N; r++) {
        struct loomi_tctx ctx;
        memset(&ctx, 0, sizeof ctx);
        ctx.rank = r;
        ctx.nranks = N;
        ctx.job_key = key;
        ctx.peer_failed = on_peer_failed;
        ctx.owner = (void *)(intptr_t)r;
        void *st;
        if (loomi_verbs_ops.create(&ctx, &st) != LOOM_SUCCESS) {
            printf("FAIL - rank %d: create: %s\n", r, loom_get_last_error());
            return 1;
        }
        T[r] = st;
        size_t len = LOOMI_VERBS_ADDR_BYTES;
        if (loomi_verbs_ops.local_addr(st, addrs + (size_t)r * LOOMI_VERBS_ADDR_BYTES, &len)) {
            printf("FAIL - rank %d: local_addr\n", r);
            return 1;
        }
    }
    pthread_t th[N];
    struct conn c[N];
    for (int r = 0; r < N; r++) {
        c[r] = (struct conn){r, addrs, LOOM_ERR_INTERNAL};
        pthread_create(&th[r], NULL, connect_one, &c[r]);
    }
    for (int r = 0; r < N; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < N; r++)
        if (c[r].rc != LOOM_SUCCESS) {
            printf("FAIL - rank %d: connect_all failed\n", r);
            return 1;
        }
    struct verbs *A = T[0], *B = T[1];

    unsigned char *sb1 = aligned_alloc(4096, BIG), *sb2 = aligned_alloc(4096, BIG);
    unsigned char *rb1 = aligned_alloc(4096, BIG), *rb2 = aligned_alloc(4096, BIG);
    unsigned char *eb = malloc(64);
    if (!sb1 || !sb2 || !rb1 || !rb2 || !eb) return 1;
    fill(sb1, BIG, 1);
    fill(sb2, BIG, 2);
    memset(rb1, 0, BIG);
    memset(rb2, 0, BIG);

    /* A keeps a receive pending from C (never sent): A is not idle, as
     * in a collective whose other transfers are still in flight. */
    struct xf ea, r1, r2, s1, s2;
    xf_init(&ea, 2, 99, eb, 64);
    loomi_verbs_ops.irecv(A, &ea.x);
    /* B: two rendezvous receives from A. */
    xf_init(&r1, 0, 1, rb1, BIG);
    xf_init(&r2, 0, 2, rb2, BIG);
    if (loomi_verbs_ops.irecv(B, &r1.x) || loomi_verbs_ops.irecv(B, &r2.x)) {
        printf("FAIL - irecv: %s\n", loom_get_last_error());
        return 1;
    }
    struct mrent *m1 = rr_mr(B, 0, &r1.x), *m2 = rr_mr(B, 0, &r2.x);
    if (!m1 || !m2) {
        printf("FAIL - no registration found for the receives\n");
        return 1;
    }
    uint32_t k1 = m1->mr->rkey, k2 = m2->mr->rkey;
    printf("# receive keys: 0x%x, 0x%x\n", k1, k2);

    /* 1. The pending receive: writable (control), not readable. */
    int st = attack(B, 0, (uintptr_t)rb2 + 8, k2, 0x1122334455667788ull, NULL);
    uint64_t seen;
    memcpy(&seen, rb2 + 8, 8);
    OK(st == IBV_WC_SUCCESS && seen == 0x1122334455667788ull,
       "control: a pending rendezvous receive's buffer takes an RDMA write under its key (%s)",
       st_str(st));
    memset(rb2 + 8, 0, 8);
    uint64_t got = 0;
    st = attack(B, 1, (uintptr_t)rb2, k2, 0, &got);
    OK(refused(st), "a pending rendezvous receive's buffer refuses an RDMA read under its key (%s)",
       st_str(st));

    /* The first transfer. */
    xf_init(&s1, 1, 1, sb1, BIG);
    if (loomi_verbs_ops.isend(A, &s1.x)) {
        printf("FAIL - isend: %s\n", loom_get_last_error());
        return 1;
    }
    struct mrent *ms = NULL;
    for (struct mrent *e = A->mrs; e; e = e->next)
        if ((uintptr_t)e->addr <= (uintptr_t)sb1 && (uintptr_t)sb1 + BIG <= (uintptr_t)e->addr + e->len)
            ms = e;
    uint32_t ks = ms ? ms->mr->rkey : 0;
    int both = 0;
    uint64_t end = loomi_now_ms() + 20000;
    while (!(both = r1.done && s1.done) && loomi_now_ms() < end)
        for (int r = 0; r < N; r++) loomi_verbs_ops.progress(T[r], 0);
    OK(both && r1.st == LOOM_SUCCESS && s1.st == LOOM_SUCCESS && same(rb1, BIG, 1),
       "a 1 MiB rendezvous transfer A -> B arrives intact");

    /* 2. After it: the receive's address and key give nothing. */
    st = attack(B, 0, (uintptr_t)rb1 + 8, k1, 0xdeadbeefdeadbeefull, NULL);
    OK(refused(st) && same(rb1, BIG, 1),
       "after the transfer, an RDMA write under the receive's old key is refused (%s)%s",
       st_str(st), same(rb1, BIG, 1) ? "" : "; the bytes were overwritten");
    st = attack(B, 1, (uintptr_t)rb1, k1, 0, &got);
    OK(refused(st), "after the transfer, an RDMA read under the receive's old key is refused (%s)",
       st_str(st));

    /* 3. The send buffer's registration (found in A's cache: it is kept
     * while A is busy). */
    if (ms) {
        st = attack(A, 0, (uintptr_t)sb1, ks, 0xdeadbeefdeadbeefull, NULL);
        OK(refused(st) && same(sb1, BIG, 1),
           "a rendezvous send buffer's registration refuses an RDMA write (%s)", st_str(st));
        st = attack(A, 1, (uintptr_t)sb1, ks, 0, &got);
        OK(refused(st), "a rendezvous send buffer's registration refuses an RDMA read (%s)",
           st_str(st));
    } else {
        OK(1, "the send buffer's registration is gone from A's cache after the transfer");
    }

    /* The second transfer: the data still right. */
    xf_init(&s2, 1, 2, sb2, BIG);
    loomi_verbs_ops.isend(A, &s2.x);
    end = loomi_now_ms() + 20000;
    while (!(both = r2.done && s2.done) && loomi_now_ms() < end)
        for (int r = 0; r < N; r++) loomi_verbs_ops.progress(T[r], 0);
    OK(both && r2.st == LOOM_SUCCESS && s2.st == LOOM_SUCCESS && same(rb2, BIG, 2),
       "a second 1 MiB transfer A -> B arrives intact");
    st = attack(B, 0, (uintptr_t)rb2 + 8, k2, 0xdeadbeefdeadbeefull, NULL);
    OK(refused(st) && same(rb2, BIG, 2),
       "after the second transfer, an RDMA write under its old key is refused (%s)", st_str(st));

    /* 4. loom_mem_register's registration, then a receive into it. */
    struct loomi_mr umr;
    memset(rb1, 0, BIG);
    if (loomi_verbs_ops.mem_register(B, rb1, BIG, LOOMI_MEM_HOST, &umr)) {
        printf("FAIL - mem_register: %s\n", loom_get_last_error());
        return 1;
    }
    uint32_t ku = ((struct mrent *)umr.handle)->mr->rkey;
    st = attack(B, 0, (uintptr_t)rb1 + 8, ku, 0xdeadbeefdeadbeefull, NULL);
    memcpy(&seen, rb1 + 8, 8);
    OK(refused(st) && seen == 0, "a loom_mem_register registration refuses an RDMA write (%s)",
       st_str(st));
    st = attack(B, 1, (uintptr_t)rb1, ku, 0, &got);
    OK(refused(st), "a loom_mem_register registration refuses an RDMA read (%s)", st_str(st));
    memset(rb1, 0, BIG);
    xf_init(&r1, 0, 3, rb1, BIG);
    r1.x.mr = &umr;
    xf_init(&s1, 1, 3, sb1, BIG);
    loomi_verbs_ops.irecv(B, &r1.x);
    loomi_verbs_ops.isend(A, &s1.x);
    end = loomi_now_ms() + 20000;
    while (!(both = r1.done && s1.done) && loomi_now_ms() < end)
        for (int r = 0; r < N; r++) loomi_verbs_ops.progress(T[r], 0);
    OK(both && r1.st == LOOM_SUCCESS && same(rb1, BIG, 1),
       "a transfer into memory registered with loom_mem_register arrives intact");
    loomi_verbs_ops.mem_deregister(B, &umr);

    /* 5. Credit words: the one B keeps for A, written by A (control) and
     * by C with the key B gave C. */
    struct verbs *C = T[2];
    uint64_t *wa = (uint64_t *)(uintptr_t)A->peers[1].cred_raddr;
    uint64_t before = __atomic_load_n(wa, __ATOMIC_ACQUIRE);
    st = attack(B, 0, A->peers[1].cred_raddr, A->peers[1].cred_rkey, before, NULL);
    OK(st == IBV_WC_SUCCESS,
       "control: the credit word B keeps for A takes A's write under the key B gave A (%s)",
       st_str(st));
    printf("# credit keys B gave: A 0x%x, C 0x%x\n", A->peers[1].cred_rkey, C->peers[1].cred_rkey);
    st = attack(B, 0, A->peers[1].cred_raddr, C->peers[1].cred_rkey, 1ull << 40, NULL);
    uint64_t after = __atomic_load_n(wa, __ATOMIC_ACQUIRE);
    OK(refused(st) && after == before,
       "C cannot write the credit word B keeps for A with the key B gave C (%s; word %llu -> %llu)",
       st_str(st), (unsigned long long)before, (unsigned long long)after);
    __atomic_store_n(wa, before, __ATOMIC_RELEASE);

    /* No destroy: its goodbyes wait for each peer in turn (bounded, but
     * slow in one thread); the process's exit releases everything. */
    loomi_verbs_ops.cancel(A, &ea.x);
    free(eb); /* the cancelled receive's buffer: nothing refers to it now */
    printf("verbs_access: %s (%d failed)\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}

#endif /* HAVE_VERBS_H */
