/*
 * sim.c - the simulated transport (see sim.h).
 *
 * Posted transfers become nodes in one world-wide hash keyed by
 * (src, dst, tag).  Posting a node looks for the oldest unpaired node of
 * the opposite direction with the same key; if there is one, the two
 * form a deliverable pair (a rendezvous: nothing moves before both sides
 * are posted).  progress() delivers a random number of random pairs, so
 * the order in which steps complete on different ranks varies with the
 * seed while one seed always replays the same run.
 *
 * Failures mirror TCP: abort_all fails this rank's transfers and queues a
 * notice to every other endpoint, which that endpoint acts on in its own
 * progress() (fail what it has with the sender, report through
 * ctx.peer_failed); destroy queues a goodbye that fails only transfers
 * still waiting on the departed rank.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "transports/bufpool.h"
#include "transports/sim/sim.h"

struct node {
    struct loomi_xfer *x;
    int src, dst;
    uint64_t tag;
    uint64_t seq; /* posting order: the oldest match wins */
    int is_send;
    int paired;
    size_t pair; /* index in world->ready while paired */
    struct node *b_next, *b_prev; /* hash chain while unpaired */
    struct node *e_next, *e_prev; /* owning endpoint's list */
    struct endpoint *ep;
};

enum { NOTICE_ABORT, NOTICE_BYE };

struct notice {
    int kind, from, failed;
    loom_result_t code;
    struct notice *next;
};

struct endpoint {
    struct loomi_sim_world *w;
    struct loomi_tctx ctx;
    int rank;
    int aborted;
    uint8_t *peer_down; /* per rank: known failed or gone */
    struct node *nodes; /* posted, not completed */
    struct notice *nhead, *ntail;
};

struct pair {
    struct node *s, *r;
};

struct loomi_sim_world {
    int nranks;
    uint64_t rng;
    struct endpoint **ep;
    struct node **buckets;
    size_t nbuckets, nchained;
    struct pair *ready;
    size_t nready, ready_cap;
    struct loomi_objpool nodes; /* kept for reuse (bufpool.h) */
    uint64_t next_seq;
    struct loomi_sim_stats st;
    /* Shared arenas (every rank's, all in this process), made on first use. */
    unsigned char **arena;
    size_t *arena_len;
};

/* ------------------------------------------------------------- helpers */

static uint64_t rnd(struct loomi_sim_world *w)
{
    /* splitmix64: tiny, and good enough to shuffle delivery orders. */
    uint64_t z = (w->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t hash_key(int src, int dst, uint64_t tag)
{
    /* The engine's tags carry the operation in the high half: mix all
     * bits down into the low ones the table uses. */
    uint64_t h = tag ^ ((uint64_t)(uint32_t)src << 40) ^ ((uint64_t)(uint32_t)dst << 20);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return (size_t)(h ^ (h >> 33));
}

static void chain_link(struct loomi_sim_world *w, struct node *n)
{
    struct node **head = &w->buckets[hash_key(n->src, n->dst, n->tag) & (w->nbuckets - 1)];
    n->b_prev = NULL;
    n->b_next = *head;
    if (*head) (*head)->b_prev = n;
    *head = n;
    w->nchained++;
}

static void chain_unlink(struct loomi_sim_world *w, struct node *n)
{
    if (n->b_prev) n->b_prev->b_next = n->b_next;
    else w->buckets[hash_key(n->src, n->dst, n->tag) & (w->nbuckets - 1)] = n->b_next;
    if (n->b_next) n->b_next->b_prev = n->b_prev;
    n->b_next = n->b_prev = NULL;
    w->nchained--;
}

/* Keep chains short: double the table when it holds twice as many nodes. */
static void maybe_grow(struct loomi_sim_world *w)
{
    if (w->nchained < 2 * w->nbuckets) return;
    size_t nb = w->nbuckets * 2;
    struct node **b = calloc(nb, sizeof *b);
    if (!b) return; /* longer chains, still correct */
    struct node **old = w->buckets;
    size_t ob = w->nbuckets;
    w->buckets = b;
    w->nbuckets = nb;
    w->nchained = 0;
    for (size_t i = 0; i < ob; i++) {
        struct node *n = old[i], *next;
        for (; n; n = next) {
            next = n->b_next;
            chain_link(w, n);
        }
    }
    free(old);
}

static int ready_push(struct loomi_sim_world *w, struct node *s, struct node *r)
{
    if (w->nready == w->ready_cap) {
        size_t cap = w->ready_cap ? w->ready_cap * 2 : 256;
        struct pair *p = realloc(w->ready, cap * sizeof *p);
        if (!p) return -1;
        w->ready = p;
        w->ready_cap = cap;
    }
    w->ready[w->nready] = (struct pair){s, r};
    s->paired = r->paired = 1;
    s->pair = r->pair = w->nready++;
    if (w->nready > w->st.max_ready) w->st.max_ready = w->nready;
    return 0;
}

static void ready_remove(struct loomi_sim_world *w, size_t i)
{
    struct pair *p = &w->ready[i];
    p->s->paired = p->r->paired = 0;
    w->ready[i] = w->ready[--w->nready];
    if (i < w->nready) w->ready[i].s->pair = w->ready[i].r->pair = i;
}

/* Pair n with the oldest waiting node of the other direction, or leave it
 * waiting in the hash. */
static void match(struct loomi_sim_world *w, struct node *n)
{
    struct node *best = NULL;
    for (struct node *m = w->buckets[hash_key(n->src, n->dst, n->tag) & (w->nbuckets - 1)]; m;
         m = m->b_next)
        if (m->is_send != n->is_send && m->src == n->src && m->dst == n->dst &&
            m->tag == n->tag && (!best || m->seq < best->seq))
            best = m;
    if (best) {
        chain_unlink(w, best);
        if (ready_push(w, n->is_send ? n : best, n->is_send ? best : n) == 0) return;
        chain_link(w, best); /* out of memory: both wait, a later post retries */
    }
    chain_link(w, n);
    maybe_grow(w);
}

static struct node *node_new(struct loomi_sim_world *w)
{
    return loomi_objpool_get(&w->nodes, sizeof(struct node));
}

/* Take n off its endpoint and recycle it (it is in neither hash nor pair). */
static void node_release(struct loomi_sim_world *w, struct node *n)
{
    struct endpoint *ep = n->ep;
    if (n->e_prev) n->e_prev->e_next = n->e_next;
    else ep->nodes = n->e_next;
    if (n->e_next) n->e_next->e_prev = n->e_prev;
    loomi_objpool_put(&w->nodes, n);
}

/* Withdraw n: out of the hash, or out of its pair (the partner waits
 * again), then released. */
static void node_drop(struct loomi_sim_world *w, struct node *n)
{
    if (n->paired) {
        struct pair p = w->ready[n->pair];
        ready_remove(w, n->pair);
        match(w, p.s == n ? p.r : p.s);
    } else {
        chain_unlink(w, n);
    }
    node_release(w, n);
}

/* Fail every transfer of ep with `peer` (every one when peer < 0). */
static void fail_nodes(struct endpoint *ep, int peer, loom_result_t code)
{
    struct loomi_sim_world *w = ep->w;
    struct node *n = ep->nodes, *next;
    for (; n; n = next) {
        next = n->e_next;
        if (peer >= 0 && n->x->peer != peer) continue;
        struct loomi_xfer *x = n->x;
        node_drop(w, n);
        /* node_drop may put a partner back into the hash, never onto this
         * list, so `next` stays valid. */
        w->st.events++;
        x->complete(x, code);
    }
}

static int has_nodes_with(const struct endpoint *ep, int peer)
{
    for (const struct node *n = ep->nodes; n; n = n->e_next)
        if (n->x->peer == peer) return 1;
    return 0;
}

static void notify(struct loomi_sim_world *w, int from, int kind, int failed, loom_result_t code)
{
    for (int r = 0; r < w->nranks; r++) {
        struct endpoint *e = w->ep[r];
        if (!e || r == from || e->aborted) continue;
        struct notice *nt = calloc(1, sizeof *nt);
        if (!nt) continue; /* best effort, like TCP's notice */
        nt->kind = kind;
        nt->from = from;
        nt->failed = failed;
        nt->code = code;
        if (e->ntail) e->ntail->next = nt;
        else e->nhead = nt;
        e->ntail = nt;
    }
}

static void report(struct endpoint *ep, int peer, int failed, loom_result_t code, const char *why)
{
    if (ep->ctx.peer_failed) ep->ctx.peer_failed(ep->ctx.owner, peer, failed, code, why);
}

static void handle_notices(struct endpoint *ep)
{
    struct notice *nt;
    while ((nt = ep->nhead) != NULL) {
        ep->nhead = nt->next;
        if (!ep->nhead) ep->ntail = NULL;
        if (!ep->aborted) {
            ep->w->st.events++;
            if (nt->kind == NOTICE_ABORT) {
                ep->peer_down[nt->from] = 1;
                fail_nodes(ep, nt->from, nt->code);
                report(ep, nt->from, nt->failed, nt->code, "the peer aborted the communicator");
            } else if (!ep->peer_down[nt->from]) {
                ep->peer_down[nt->from] = 1;
                if (has_nodes_with(ep, nt->from)) {
                    fail_nodes(ep, nt->from, LOOM_ERR_REMOTE);
                    report(ep, nt->from, nt->from, LOOM_ERR_REMOTE,
                           "the peer closed the communicator with transfers pending");
                }
            }
        }
        free(nt);
    }
}

/* Copy one matched pair and complete both sides. */
static void deliver(struct loomi_sim_world *w, size_t i)
{
    struct node *s = w->ready[i].s, *r = w->ready[i].r;
    struct loomi_xfer *sx = s->x, *rx = r->x;
    struct endpoint *rep = r->ep;
    int src = s->src;
    /* Both leave the world before any callback runs. */
    ready_remove(w, i);
    node_release(w, s);
    node_release(w, r);
    w->st.events++;
    if (sx->len != rx->len) {
        char why[200];
        snprintf(why, sizeof why,
                 "sim: rank %d sent a message of %zu bytes (tag %#" PRIx64
                 ") where rank %d expects %zu",
                 src, sx->len, rx->tag, rep->rank, rx->len);
        sx->complete(sx, LOOM_ERR_MISMATCH);
        rx->complete(rx, LOOM_ERR_MISMATCH);
        /* As TCP's receiver: drop the peer, then report it. */
        rep->peer_down[src] = 1;
        fail_nodes(rep, src, LOOM_ERR_MISMATCH);
        report(rep, src, src, LOOM_ERR_MISMATCH, why);
        return;
    }
    if (rx->len) memcpy(rx->buf, sx->buf, rx->len);
    w->st.digest = (w->st.digest ^ hash_key(src, rep->rank, rx->tag)) * 0x100000001b3ull;
    w->st.delivered++;
    w->st.bytes += rx->len;
    rx->complete(rx, LOOM_SUCCESS);
    sx->complete(sx, LOOM_SUCCESS);
}

/* ----------------------------------------------------------- the table */

static loom_result_t sim_create(const struct loomi_tctx *ctx, void **state)
{
    (void)state;
    return loomi_fail(LOOM_ERR_UNSUPPORTED, ctx ? ctx->rank : -1,
                      "sim: endpoints are made by loomi_sim_world_create, not by name");
}

static loom_result_t sim_local_addr(void *state, void *buf, size_t *len)
{
    (void)state;
    (void)buf;
    *len = 0;
    return LOOM_SUCCESS;
}

static loom_result_t sim_connect_all(void *state, const unsigned char *addrs, size_t addr_len,
                                     uint64_t deadline_ms)
{
    (void)state;
    (void)addrs;
    (void)addr_len;
    (void)deadline_ms;
    return LOOM_SUCCESS; /* every endpoint is already here */
}

static loom_result_t post(struct endpoint *ep, struct loomi_xfer *x, int is_send)
{
    struct loomi_sim_world *w = ep->w;
    if (ep->aborted)
        return loomi_fail(LOOM_ERR_REMOTE, ep->rank, "sim: the communicator was aborted");
    if (x->peer < 0 || x->peer >= w->nranks || x->peer == ep->rank)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, ep->rank, "sim: %s peer %d is not valid",
                          is_send ? "send to" : "receive from", x->peer);
    if (ep->peer_down[x->peer])
        return loomi_fail(LOOM_ERR_REMOTE, ep->rank, "sim: rank %d has failed or left",
                          x->peer);
    struct node *n = node_new(w);
    if (!n) return loomi_fail(LOOM_ERR_NO_MEMORY, ep->rank, "sim: out of memory");
    n->x = x;
    n->ep = ep;
    n->is_send = is_send;
    n->src = is_send ? ep->rank : x->peer;
    n->dst = is_send ? x->peer : ep->rank;
    n->tag = x->tag;
    n->seq = w->next_seq++;
    x->t_done = 0;
    x->t_posted = 1;
    n->e_next = ep->nodes;
    if (ep->nodes) ep->nodes->e_prev = n;
    ep->nodes = n;
    match(w, n);
    return LOOM_SUCCESS;
}

static loom_result_t sim_isend(void *state, struct loomi_xfer *x) { return post(state, x, 1); }
static loom_result_t sim_irecv(void *state, struct loomi_xfer *x) { return post(state, x, 0); }

static loom_result_t sim_progress(void *state, int timeout_ms)
{
    (void)timeout_ms; /* nothing to wait for: every rank is in this thread */
    struct endpoint *ep = state;
    struct loomi_sim_world *w = ep->w;
    handle_notices(ep);
    if (ep->aborted || !w->nready) return LOOM_SUCCESS;
    /* Sometimes one pair, sometimes all of them: both extremes of timing. */
    uint64_t k = 1 + rnd(w) % w->nready;
    for (uint64_t j = 0; j < k && w->nready; j++) deliver(w, (size_t)(rnd(w) % w->nready));
    return LOOM_SUCCESS;
}

static int sim_wait_fd(void *state)
{
    (void)state;
    return -1;
}

static void sim_cancel(void *state, struct loomi_xfer *x)
{
    struct endpoint *ep = state;
    for (struct node *n = ep->nodes; n; n = n->e_next)
        if (n->x == x) {
            node_drop(ep->w, n);
            return;
        }
}

static void sim_abort_all(void *state, int failed, loom_result_t code)
{
    struct endpoint *ep = state;
    if (ep->aborted) return;
    ep->aborted = 1;
    for (int r = 0; r < ep->w->nranks; r++) ep->peer_down[r] = 1;
    fail_nodes(ep, -1, code);
    notify(ep->w, ep->rank, NOTICE_ABORT, failed, code);
}

static void endpoint_free(struct endpoint *ep)
{
    struct loomi_sim_world *w = ep->w;
    /* What the engine left posted belongs to freed operations: drop it
     * without callbacks. */
    while (ep->nodes) node_drop(w, ep->nodes);
    while (ep->nhead) {
        struct notice *nt = ep->nhead;
        ep->nhead = nt->next;
        free(nt);
    }
    if (!ep->aborted) notify(w, ep->rank, NOTICE_BYE, ep->rank, LOOM_ERR_REMOTE);
    w->ep[ep->rank] = NULL;
    free(ep->peer_down);
    free(ep);
}

static void sim_destroy(void *state)
{
    if (state) endpoint_free(state);
}

/* Every rank of a sim world shares one address space, so any rank's
 * arena is reachable; the hostmap decides which ones a schedule names. */
static void *sim_shared_map(void *state, int rank, size_t *len)
{
    struct endpoint *ep = state;
    struct loomi_sim_world *w = ep->w;
    size_t want = ep->ctx.shm.bytes;
    if (rank < 0 || rank >= w->nranks || !want) return NULL;
    if (!w->arena) {
        w->arena = calloc((size_t)w->nranks, sizeof *w->arena);
        w->arena_len = calloc((size_t)w->nranks, sizeof *w->arena_len);
        if (!w->arena || !w->arena_len) {
            free(w->arena);
            free(w->arena_len);
            w->arena = NULL;
            w->arena_len = NULL;
            return NULL;
        }
    }
    if (!w->arena[rank]) {
        /* Garbage, not zeros: a schedule must not read what it never wrote. */
        w->arena[rank] = malloc(want);
        if (!w->arena[rank]) return NULL;
        memset(w->arena[rank], 0xA5, want);
        w->arena_len[rank] = want;
    }
    *len = w->arena_len[rank];
    return w->arena[rank];
}

/* The ops table: every transport's lists the same members in the same
 * order (transport.h), so the tables look alike on purpose. */
const struct loomi_transport_ops loomi_sim_ops = {
    .name = "sim",
    .caps = LOOMI_TCAP_TWO_SIDED,
    .create = sim_create,
    .local_addr = sim_local_addr,
    .connect_all = sim_connect_all,
    .mem_register = NULL,
    .mem_deregister = NULL,
    .isend = sim_isend,
    .irecv = sim_irecv,
    .progress = sim_progress,
    .wait_fd = sim_wait_fd,
    .cancel = sim_cancel,
    .abort_all = sim_abort_all,
    .destroy = sim_destroy,
    .shared_map = sim_shared_map,
};

/* ------------------------------------------------------------- worlds */

struct loomi_sim_world *loomi_sim_world_new(int nranks, uint64_t seed)
{
    if (nranks < 1) {
        loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "sim: nranks %d is not positive", nranks);
        return NULL;
    }
    struct loomi_sim_world *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->nranks = nranks;
    w->rng = seed;
    w->nbuckets = 1024;
    w->ep = calloc((size_t)nranks, sizeof *w->ep);
    w->buckets = calloc(w->nbuckets, sizeof *w->buckets);
    if (!w->ep || !w->buckets) {
        free(w->ep);
        free(w->buckets);
        free(w);
        loomi_fail(LOOM_ERR_NO_MEMORY, -1, "sim: out of memory for a world of %d ranks", nranks);
        return NULL;
    }
    return w;
}

loom_result_t loomi_sim_endpoint_create(struct loomi_sim_world *w, const struct loomi_tctx *ctx,
                                        void **state)
{
    if (!w || !ctx || !state)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "sim: world, ctx and state are required");
    if (ctx->rank < 0 || ctx->rank >= w->nranks || ctx->nranks != w->nranks)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, ctx->rank,
                          "sim: rank %d of %d does not fit a world of %d", ctx->rank,
                          ctx->nranks, w->nranks);
    if (w->ep[ctx->rank])
        return loomi_fail(LOOM_ERR_INVALID_USAGE, ctx->rank, "sim: rank %d already has an endpoint",
                          ctx->rank);
    struct endpoint *ep = calloc(1, sizeof *ep);
    if (ep) ep->peer_down = calloc((size_t)w->nranks, 1);
    if (!ep || !ep->peer_down) {
        free(ep);
        return loomi_fail(LOOM_ERR_NO_MEMORY, ctx->rank, "sim: out of memory");
    }
    ep->w = w;
    ep->ctx = *ctx;
    ep->ctx.job_key = NULL; /* the caller's copy may not outlive this call */
    ep->rank = ctx->rank;
    w->ep[ctx->rank] = ep;
    *state = ep;
    return LOOM_SUCCESS;
}

void loomi_sim_world_free(struct loomi_sim_world *w)
{
    if (!w) return;
    for (int r = 0; r < w->nranks; r++)
        if (w->ep[r]) {
            w->ep[r]->aborted = 1; /* no goodbyes to endpoints about to go too */
            endpoint_free(w->ep[r]);
        }
    loomi_objpool_clear(&w->nodes);
    if (w->arena)
        for (int r = 0; r < w->nranks; r++) free(w->arena[r]);
    free(w->arena);
    free(w->arena_len);
    free(w->ep);
    free(w->buckets);
    free(w->ready);
    free(w);
}

int loomi_sim_world_size(const struct loomi_sim_world *w)
{
    return w->nranks;
}

void loomi_sim_world_reseed(struct loomi_sim_world *w, uint64_t seed)
{
    if (w) w->rng = seed;
}

void loomi_sim_world_stats(const struct loomi_sim_world *w, struct loomi_sim_stats *st)
{
    *st = w->st;
    st->pending = w->nchained;
    st->deliverable = w->nready;
}

char *loomi_sim_world_describe(const struct loomi_sim_world *w, int max, char *buf, size_t len)
{
    size_t o = 0;
    int shown = 0, total = 0;
    if (len) buf[0] = '\0';
    for (int r = 0; r < w->nranks; r++) {
        const struct endpoint *ep = w->ep[r];
        if (!ep) continue;
        for (const struct node *n = ep->nodes; n; n = n->e_next) {
            total++;
            if (shown >= max || o >= len) continue;
            shown++;
            int k = snprintf(buf + o, len - o, "%srank %d: %s rank %d, operation %" PRIu64
                             " tag %" PRIu32 ", %zu bytes%s",
                             o ? "; " : "", r, n->is_send ? "send to" : "receive from",
                             n->x->peer, n->x->tag >> 32, (uint32_t)n->x->tag, n->x->len,
                             n->paired ? " (matched, not delivered)" : "");
            if (k > 0) o += (size_t)k;
        }
    }
    if (total > shown && o < len)
        snprintf(buf + o, len - o, "%s... %d more", o ? "; " : "", total - shown);
    if (!total && len) snprintf(buf, len, "no transfer posted");
    return buf;
}
