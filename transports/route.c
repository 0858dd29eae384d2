/*
 * route.c - one communicator, several transports: each peer's data goes
 * through the transport chosen for it (shared memory for ranks on this
 * host, RDMA verbs for the others where both ends have them, else TCP),
 * behind the same ops table, so the engine
 * still sees a single transport.
 *
 * TCP, when allowed, connects to every peer even where shared memory
 * carries the data: its connections deliver abort notices and notice a
 * dead process at once, whatever moves the bytes.
 */
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "transports/route.h"
#include "core/cuda.h"
#include "core/internal.h"
#include "transports/shm/shm.h"
#include "transports/verbs/verbs.h"

#define SLOT 64 /* stride of the sub-addresses handed to connect_all */

enum { T_TCP = 0, T_SHM = 1, T_VERBS = 2, T_N = 3 };

/* Where each sub-transport's address lies in a route address (of
 * LOOMI_ROUTE_ADDR_BYTES): TCP's needs 24 bytes and verbs' 32, so they
 * share the first 64; shared memory has the second. */
static const unsigned slot_off[T_N] = {0, 64, 32};
static const unsigned slot_len[T_N] = {32, 64, LOOMI_VERBS_ADDR_BYTES};
_Static_assert(32 + LOOMI_VERBS_ADDR_BYTES <= 64 && 128 <= LOOMI_ROUTE_ADDR_BYTES,
               "route address layout");

struct route {
    int rank, nranks;
    const struct loomi_transport_ops *ops[T_N];
    void *st[T_N];
    unsigned char *via;     /* [nranks]: the transport carrying data to each peer */
    unsigned char *both;    /* [nranks]: verbs and TCP both reach the peer */
    int nvia[T_N];          /* peers carried by each */
    const int *host_of; /* [nranks]: which ranks share a host (the caller's), or NULL */
    const uint64_t *events;
    unsigned polls; /* progress calls, to poll idle sockets only now and then */
};

static const struct loomi_transport_ops *const known[T_N] = {&loomi_tcp_ops, &loomi_shm_ops,
                                                             &loomi_verbs_ops};

const char *loomi_route_names(void) { return "tcp, shm, verbs"; }

const char *loomi_route_rdma_device(void *state)
{
    const struct route *r = state;
    return r->ops[T_VERBS] && r->st[T_VERBS] ? loomi_verbs_device(r->st[T_VERBS]) : NULL;
}

void *loomi_route_verbs_state(void *state)
{
    const struct route *r = state;
    return r->ops[T_VERBS] ? r->st[T_VERBS] : NULL;
}

loom_result_t loomi_route_parse(const char *spec, unsigned *mask, int rank)
{
    *mask = 0;
    if (!spec || !spec[0]) {
        *mask = (1u << T_N) - 1;
        return LOOM_SUCCESS;
    }
    for (const char *p = spec; *p;) {
        size_t len = strcspn(p, ",");
        int found = 0;
        for (int i = 0; i < T_N; i++)
            if (strlen(known[i]->name) == len && !strncmp(p, known[i]->name, len)) {
                *mask |= 1u << i;
                found = 1;
            }
        if (!found && len)
            return loomi_fail(LOOM_ERR_UNSUPPORTED, rank,
                              "LOOM_TRANSPORT=%s: unknown transport '%.*s' (this build has: %s)",
                              spec, (int)len, p, loomi_route_names());
        p += len;
        if (*p) p++;
    }
    if (!*mask)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank,
                          "LOOM_TRANSPORT=%s names no transport (this build has: %s)", spec,
                          loomi_route_names());
    return LOOM_SUCCESS;
}

loom_result_t loomi_route_create(const struct loomi_tctx *ctx, unsigned mask,
                                 const uint64_t *events, void **state)
{
    struct route *r = calloc(1, sizeof *r);
    if (!r) return loomi_fail(LOOM_ERR_NO_MEMORY, ctx->rank, "route: out of memory");
    r->rank = ctx->rank;
    r->nranks = ctx->nranks;
    r->events = events;
    r->via = calloc((size_t)ctx->nranks, 1);
    r->both = calloc((size_t)ctx->nranks, 1);
    if (!r->via || !r->both) {
        free(r->via);
        free(r->both);
        free(r);
        return loomi_fail(LOOM_ERR_NO_MEMORY, ctx->rank, "route: out of memory");
    }
    for (int i = 0; i < T_N; i++) {
        /* Shared memory is only worth its segment when a peer can use it. */
        if (!(mask & (1u << i)) || (i == T_SHM && ctx->nranks < 2)) continue;
        /* Verbs where the machine has them: when only allowed (not
         * forced), their absence is no error. */
        char why[256];
        if (i == T_VERBS && mask != (1u << T_VERBS) && !loomi_verbs_available(why, sizeof why)) {
            LOOMI_INFO(ctx->rank, "verbs: not used: %s", why);
            continue;
        }
        r->ops[i] = known[i];
        loom_result_t rc = known[i]->create(ctx, &r->st[i]);
        if (rc != LOOM_SUCCESS) {
            /* tcp and verbs hand back what they made before failing, for
             * their destroy to release (their listening socket too). */
            if (r->st[i]) known[i]->destroy(r->st[i]);
            r->st[i] = NULL;
            r->ops[i] = NULL;
            loomi_route_ops.destroy(r);
            return rc;
        }
    }
    *state = r;
    return LOOM_SUCCESS;
}

static loom_result_t route_local_addr(void *state, void *buf, size_t *len)
{
    struct route *r = state;
    if (*len < LOOMI_ROUTE_ADDR_BYTES)
        return loomi_fail(LOOM_ERR_INTERNAL, r->rank, "route: address buffer too small");
    memset(buf, 0, LOOMI_ROUTE_ADDR_BYTES);
    for (int i = 0; i < T_N; i++) {
        if (!r->ops[i]) continue;
        size_t l = slot_len[i];
        loom_result_t rc =
            r->ops[i]->local_addr(r->st[i], (unsigned char *)buf + slot_off[i], &l);
        if (rc != LOOM_SUCCESS) return rc;
    }
    *len = LOOMI_ROUTE_ADDR_BYTES;
    return LOOM_SUCCESS;
}

void loomi_route_set_hosts(void *state, const int *host_of)
{
    ((struct route *)state)->host_of = host_of;
}

static loom_result_t route_connect_all(void *state, const unsigned char *addrs, size_t addr_len,
                                       uint64_t deadline_ms)
{
    struct route *r = state;
    const int n = r->nranks, me = r->rank;
    if (addr_len < LOOMI_ROUTE_ADDR_BYTES)
        return loomi_fail(LOOM_ERR_INTERNAL, me, "route: address stride %zu too small", addr_len);
    /* Choose per peer: shared memory on this host when both sides have it,
     * else verbs when both sides have them, else TCP. */
    for (int q = 0; q < n; q++) {
        if (q == me) continue;
        const unsigned char *a = addrs + (size_t)q * addr_len;
        int same = r->host_of && r->host_of[q] == r->host_of[me];
        if (same && r->ops[T_SHM] && !loomi_all_zero(a + slot_off[T_SHM], slot_len[T_SHM]))
            r->via[q] = T_SHM;
        else if (r->ops[T_VERBS] && !loomi_all_zero(a + slot_off[T_VERBS], slot_len[T_VERBS])) {
            r->via[q] = T_VERBS;
            r->both[q] = r->ops[T_TCP] && !loomi_all_zero(a + slot_off[T_TCP], slot_len[T_TCP]);
        } else if (r->ops[T_TCP] && !loomi_all_zero(a + slot_off[T_TCP], slot_len[T_TCP]))
            r->via[q] = T_TCP;
        else
            return loomi_fail(LOOM_ERR_UNSUPPORTED, me,
                              "no allowed transport reaches rank %d (%s host; LOOM_TRANSPORT "
                              "allows %s%s%s)",
                              q, same ? "same" : "another", r->ops[T_TCP] ? "tcp " : "",
                              r->ops[T_SHM] ? "shm " : "", r->ops[T_VERBS] ? "verbs" : "");
        r->nvia[r->via[q]]++;
    }
    unsigned char *sub = malloc((size_t)n * SLOT);
    if (!sub) return loomi_fail(LOOM_ERR_NO_MEMORY, me, "route: out of memory");
    loom_result_t rc = LOOM_SUCCESS;
    for (int i = 0; i < T_N && rc == LOOM_SUCCESS; i++) {
        if (!r->ops[i]) continue;
        for (int q = 0; q < n; q++) {
            const unsigned char *a = addrs + (size_t)q * addr_len + slot_off[i];
            /* TCP reaches everyone (see the top of the file); shared memory
             * and verbs only the peers they carry. */
            int use = i == T_TCP || q == me || r->via[q] == i;
            memset(sub + (size_t)q * SLOT, 0, SLOT);
            if (use) memcpy(sub + (size_t)q * SLOT, a, slot_len[i]);
        }
        if ((i == T_SHM || i == T_VERBS) && r->nvia[i] == 0) {
            /* No peer for it: drop it now (shared memory: its segment). */
            r->ops[i]->destroy(r->st[i]);
            r->ops[i] = NULL;
            r->st[i] = NULL;
            continue;
        }
        rc = r->ops[i]->connect_all(r->st[i], sub, SLOT, deadline_ms);
    }
    free(sub);
    return rc;
}

static loom_result_t route_isend(void *state, struct loomi_xfer *x)
{
    struct route *r = state;
    int i = r->via[x->peer];
    return r->ops[i]->isend(r->st[i], x);
}

static loom_result_t route_irecv(void *state, struct loomi_xfer *x)
{
    struct route *r = state;
    int i = r->via[x->peer];
    return r->ops[i]->irecv(r->st[i], x);
}

static void route_cancel(void *state, struct loomi_xfer *x)
{
    struct route *r = state;
    int i = r->via[x->peer];
    r->ops[i]->cancel(r->st[i], x);
}

/* How long a wait polls shared memory and sockets by turns, yielding the
 * core between rounds, before it naps on the sockets. */
#define ROUTE_SPIN_NS (2u * 1000 * 1000)

static loom_result_t route_progress(void *state, int timeout_ms)
{
    struct route *r = state;
    const struct loomi_transport_ops *tcp = r->ops[T_TCP], *shm = r->ops[T_SHM],
                                     *vb = r->ops[T_VERBS];
    int nt = !!tcp + !!shm + !!vb;
    if (nt == 0) return LOOM_SUCCESS;
    if (nt == 1) {
        int i = tcp ? T_TCP : shm ? T_SHM : T_VERBS;
        return r->ops[i]->progress(r->st[i], timeout_ms);
    }
    /* The transport a long wait naps on: TCP's sockets, else verbs'
     * completion channel (shared memory has no descriptor). */
    const int napper = tcp ? T_TCP : T_VERBS;
    /* Sockets that carry no data (every peer on this host or over verbs)
     * only bring abort notices and goodbyes: a look every 32 polls is
     * enough, and spares a system call on the small-message path. */
    if (timeout_ms <= 0 && tcp && r->nvia[T_TCP] == 0 && ++r->polls % 32) {
        loom_result_t rc = LOOM_SUCCESS;
        if (shm) rc = shm->progress(r->st[T_SHM], 0);
        if (rc == LOOM_SUCCESS && vb) rc = vb->progress(r->st[T_VERBS], 0);
        return rc;
    }
    loom_result_t rc;
    const uint64_t e0 = *r->events;
    uint64_t t0 = loomi_now_ns(), m0 = shm && shm->moved ? shm->moved(r->st[T_SHM]) : 0;
    const uint64_t end = t0 + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
    for (;;) {
        /* Shared memory has no descriptor to sleep on, so a wait polls
         * them all; once it has lasted a while with nothing moving, it
         * naps on the sockets in short slices instead of burning the
         * core.  (A message streamed through a FIFO moves for
         * milliseconds before it completes: napping then left the FIFO
         * full for a slice at a time, and such a message crawled; see
         * perf/NOTES.md, "route.c, napping".) */
        for (int i = 0; i < T_N; i++) {
            if (!r->ops[i] || i == napper) continue;
            if ((rc = r->ops[i]->progress(r->st[i], 0)) != LOOM_SUCCESS) return rc;
        }
        uint64_t now = loomi_now_ns();
        if (shm && shm->moved) {
            uint64_t m = shm->moved(r->st[T_SHM]);
            if (m != m0) {
                m0 = m;
                t0 = now;
            }
        }
        int nap = timeout_ms > 0 && now - t0 > ROUTE_SPIN_NS;
        if ((rc = r->ops[napper]->progress(r->st[napper], nap ? 1 : 0)) != LOOM_SUCCESS)
            return rc;
        if (*r->events != e0 || timeout_ms <= 0 || loomi_now_ns() >= end) return LOOM_SUCCESS;
        if (!nap) sched_yield();
    }
}

static int route_wait_fd(void *state)
{
    struct route *r = state;
    /* Only usable alone: with several transports in play no one
     * descriptor signals them all. */
    int nt = !!r->ops[T_TCP] + !!r->ops[T_SHM] + !!r->ops[T_VERBS];
    if (nt != 1 || r->ops[T_SHM]) return -1;
    int i = r->ops[T_TCP] ? T_TCP : T_VERBS;
    return r->ops[i]->wait_fd(r->st[i]);
}

static void route_abort_all(void *state, int failed, loom_result_t code)
{
    struct route *r = state;
    for (int i = 0; i < T_N; i++)
        if (r->ops[i]) r->ops[i]->abort_all(r->st[i], failed, code);
}

static void route_destroy(void *state)
{
    struct route *r = state;
    if (!r) return;
    for (int i = 0; i < T_N; i++)
        if (r->ops[i]) r->ops[i]->destroy(r->st[i]);
    free(r->via);
    free(r->both);
    free(r);
}

static void *route_shared_map(void *state, int rank, size_t *len)
{
    struct route *r = state;
    if (!r->ops[T_SHM] || !r->ops[T_SHM]->shared_map) return NULL;
    if (rank != r->rank && r->via[rank] != T_SHM) return NULL;
    return r->ops[T_SHM]->shared_map(r->st[T_SHM], rank, len);
}

const char *loomi_route_describe(void *state, char *buf, size_t n)
{
    struct route *r = state;
    if (r->ops[T_VERBS])
        snprintf(buf, n, "%s%sverbs%s%s (%d peer(s) over shm, %d over verbs, %d over tcp)",
                 r->ops[T_SHM] ? "shm" : "", r->ops[T_SHM] ? "+" : "",
                 r->ops[T_TCP] ? "+" : "", r->ops[T_TCP] ? "tcp" : "", r->nvia[T_SHM],
                 r->nvia[T_VERBS], r->nvia[T_TCP]);
    else
        snprintf(buf, n, "%s%s%s (%d peer(s) over shm, %d over tcp)",
                 r->ops[T_SHM] ? "shm" : "", r->ops[T_SHM] && r->ops[T_TCP] ? "+" : "",
                 r->ops[T_TCP] ? "tcp" : "", r->nvia[T_SHM], r->nvia[T_TCP]);
    return buf;
}

int loomi_route_peer_transport(void *state, int peer, const char **name)
{
    struct route *r = state;
    if (peer < 0 || peer >= r->nranks || peer == r->rank) return -1;
    if (name) *name = r->ops[r->via[peer]] ? r->ops[r->via[peer]]->name : "?";
    return r->via[peer];
}

int loomi_route_has_shm(void *state)
{
    return ((struct route *)state)->ops[T_SHM] != NULL;
}

void loomi_route_shm_crowded(void *state)
{
    struct route *r = state;
    if (r->ops[T_SHM]) loomi_shm_crowded(r->st[T_SHM]);
}

size_t loomi_route_shm_cells_max(void *state, int peer)
{
    struct route *r = state;
    if (!r->ops[T_SHM] || peer < 0 || peer >= r->nranks || r->via[peer] != T_SHM) return 0;
    return loomi_shm_cells_max(r->st[T_SHM], peer);
}

int loomi_route_can_switch(void *state, int peer)
{
    struct route *r = state;
    return peer >= 0 && peer < r->nranks && peer != r->rank && r->both[peer] &&
           r->ops[T_VERBS] && r->ops[T_TCP];
}

void loomi_route_switch(void *state, int peer, int verbs)
{
    struct route *r = state;
    if (!loomi_route_can_switch(state, peer)) return;
    int to = verbs ? T_VERBS : T_TCP;
    if (r->via[peer] == to) return;
    /* The verbs transport stays connected (and polled) either way: its
     * queue pairs may still hold credit returns, and tearing one down
     * would look like a failure to the peer. */
    r->nvia[r->via[peer]]--;
    r->via[peer] = (unsigned char)to;
    r->nvia[to]++;
}

loom_result_t loomi_route_mem_register(void *state, void *addr, size_t len, struct loomi_mr *mr,
                                       int *done)
{
    struct route *r = state;
    const struct loomi_transport_ops *vb = r->ops[T_VERBS];
    *done = 0;
    if (!vb || !vb->mem_register || !(vb->caps & LOOMI_TCAP_MEM_REG)) return LOOM_SUCCESS;
    /* Device memory goes to the NIC through a dmabuf (GPUDirect RDMA),
     * where LOOM_GPUDIRECT, the driver and the NIC allow; verbs answers
     * success with no registration where they do not (auto). */
    const enum loomi_mem_kind kind =
        loomi_mem_kind(addr) == LOOMI_MEM_DEVICE ? LOOMI_MEM_DEVICE : LOOMI_MEM_HOST;
    loom_result_t rc = vb->mem_register(r->st[T_VERBS], addr, len, kind, mr);
    *done = rc == LOOM_SUCCESS && mr->handle;
    return rc;
}

void loomi_route_mem_deregister(void *state, struct loomi_mr *mr)
{
    struct route *r = state;
    if (r->ops[T_VERBS] && r->ops[T_VERBS]->mem_deregister)
        r->ops[T_VERBS]->mem_deregister(r->st[T_VERBS], mr);
}

void loomi_route_switch_all(void *state, int verbs)
{
    struct route *r = state;
    for (int q = 0; q < r->nranks; q++) loomi_route_switch(state, q, verbs);
}

const struct loomi_transport_ops loomi_route_ops = {
    .name = "route",
    .caps = LOOMI_TCAP_TWO_SIDED,
    .create = NULL, /* loomi_route_create: it needs the allowed set */
    .local_addr = route_local_addr,
    .connect_all = route_connect_all,
    .isend = route_isend,
    .irecv = route_irecv,
    .progress = route_progress,
    .wait_fd = route_wait_fd,
    .cancel = route_cancel,
    .abort_all = route_abort_all,
    .destroy = route_destroy,
    .shared_map = route_shared_map,
};
