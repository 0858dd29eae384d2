/* comm.c - communicator lifecycle. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "coll/coll.h"
#include "comm/comm.h"
#include "comm/devbuf.h"
#include "comm/devpeer.h"
#include "comm/ctrl.h"
#include "topo/topo.h"
#include "transports/net.h"
#include "transports/route.h"
#include "topo/select.h"
#include "sched/sched.h"

#define UID_MAGIC 0x4c4d4944u /* "LMID" */

/* Layout of loom_unique_id_t's bytes. */
struct uid_layout {
    uint32_t magic;
    uint32_t version;
    unsigned char job_key[16];
    char port[8];
    char host[LOOM_UNIQUE_ID_BYTES - 32];
};
_Static_assert(sizeof(struct uid_layout) == LOOM_UNIQUE_ID_BYTES, "unique id layout");

struct loom_comm *loomi_comm_get(loom_comm_t h)
{
    struct loom_comm *c = loomi_handle_get(LOOMI_HANDLE_COMM, (uintptr_t)h, NULL);
    return c && c->magic == LOOMI_COMM_MAGIC ? c : NULL;
}

loom_result_t loomi_comm_live(loom_comm_t h, const char *fn, struct loom_comm **out)
{
    enum loomi_handle_state why;
    struct loom_comm *c = loomi_handle_get(LOOMI_HANDLE_COMM, (uintptr_t)h, &why);
    *out = NULL;
    if (c && c->magic == LOOMI_COMM_MAGIC) {
        *out = c;
        return LOOM_SUCCESS;
    }
    if (why == LOOMI_HANDLE_NULL)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: comm is NULL", fn);
    if (why == LOOMI_HANDLE_GONE)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                          "%s: comm is not a live communicator (destroyed or aborted; its "
                          "handle stays invalid, whatever was created since)",
                          fn);
    return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                      "%s: comm is not a live communicator (never created: not a value that "
                      "loom_comm_init_* gave)",
                      fn);
}

/* sync: bring the communicator up to date first.  queued: the call is
 * queued in a group, to run at loom_group_end. */
static loom_result_t comm_check(struct loom_comm *c, const char *fn, int sync, int queued)
{
    loom_result_t r = LOOM_SUCCESS;
    /* The communicator's owner is the caller: it may bring it up to date. */
    loomi_comm_lock(c);
    if (c->error == LOOM_SUCCESS && sync) loomi_comm_sync(c);
    /* A call queued in a group while the ranks' calls differ: the group
     * fails as one, at loom_group_end, with LOOM_ERR_MISMATCH (group.c).
     * Failing the call here would give a rank that comes late to the
     * group LOOM_ERR_REVOKED: its calls of the group, which the verdict
     * would need, have no numbers yet (fused calls get theirs at the
     * end), so nothing could say this rank's calls differ. */
    if (c->error == LOOM_ERR_MISMATCH && queued) {
        loomi_comm_unlock(c);
        return LOOM_SUCCESS;
    }
    /* A call made since this rank showed its calls joins them: a rank
     * that learned of the mismatch before it made the call in question
     * shows it now (calls.h). */
    if (c->error == LOOM_ERR_MISMATCH) loomi_calls_push(c);
    if (c->error == LOOM_ERR_MISMATCH && !c->mismatch_told &&
        loomi_calls_verdict(c, LOOMI_VERDICT_WAIT_MS)) {
        /* The ranks' calls differ and this rank has not been told yet
         * (its part of the call completed before the difference showed,
         * as the root of a broadcast's does): this call says so. */
        c->mismatch_told = 1;
        r = loomi_fail(LOOM_ERR_MISMATCH, c->rank, "%s: %s", fn, c->errmsg);
    } else if (c->error != LOOM_SUCCESS) {
        r = loomi_fail(LOOM_ERR_REVOKED, c->rank,
                       "%s: the communicator is broken since an earlier failure: %s", fn,
                       c->errmsg);
    }
    loomi_comm_unlock(c);
    return r;
}

loom_result_t loomi_comm_check(loom_comm_t h, const char *fn, struct loom_comm **out)
{
    loom_result_t r = loomi_comm_live(h, fn, out);
    return r != LOOM_SUCCESS ? r : comm_check(*out, fn, 1, 0);
}

loom_result_t loomi_comm_check_queued(loom_comm_t h, const char *fn, struct loom_comm **out)
{
    loom_result_t r = loomi_comm_live(h, fn, out);
    return r != LOOM_SUCCESS ? r : comm_check(*out, fn, 1, 1);
}

loom_result_t loomi_comm_check_call(struct loom_comm *comm, const char *fn, int queued)
{
    return comm_check(comm, fn, 0, queued);
}

loom_result_t loomi_comm_publish(struct loom_comm *c)
{
    if (!c->handle) {
        uintptr_t h = loomi_handle_new(LOOMI_HANDLE_COMM, c);
        if (!h)
            return loomi_fail(LOOM_ERR_NO_MEMORY, c->rank,
                              "communicator: no handle left (too many live communicators)");
        c->handle = (loom_comm_t)h;
    }
    c->magic = LOOMI_COMM_MAGIC;
    return LOOM_SUCCESS;
}

void loomi_comm_withdraw(struct loom_comm *c)
{
    c->magic = 0;
    if (c->handle) loomi_handle_drop(LOOMI_HANDLE_COMM, (uintptr_t)c->handle);
    c->handle = NULL;
}

loom_result_t loomi_comm_sync(struct loom_comm *c)
{
    loomi_comm_lock(c);
    if (c->error == LOOM_SUCCESS && c->ctrl && loomi_ctrl_revoked(c->ctrl)) {
        loom_result_t code;
        int failed;
        char why[256];
        loomi_ctrl_reason(c->ctrl, &code, &failed, why, sizeof why);
        if (failed >= 0 && failed != c->rank)
            loomi_comm_fail(c, code, failed, "rank %d failed: %s", failed, why);
        else
            loomi_comm_fail(c, code, failed, "%s", why);
    }
    /* A communicator still being made (its measuring at creation, in a
     * shrink or grow) whose membership round the guard says is over: a
     * rank it waits on may never come (loomi_guard_set). */
    char why[200];
    if (c->error == LOOM_SUCCESS && loomi_guard_stop(why, sizeof why))
        loomi_comm_fail(c, LOOM_ERR_REMOTE, -1, "gave up while measuring at creation: %s", why);
    loom_result_t r = c->error;
    loomi_comm_unlock(c);
    return r;
}

int loomi_comm_revoke_pending(const struct loom_comm *c)
{
    return c->error == LOOM_SUCCESS && c->ctrl && loomi_ctrl_revoked(c->ctrl);
}

void loomi_comm_fail(struct loom_comm *c, loom_result_t code, int failed_rank, const char *fmt,
                     ...)
{
    loomi_comm_lock(c);
    if (c->error != LOOM_SUCCESS) {
        loomi_comm_unlock(c);
        return;
    }
    c->error = code;
    c->failed_rank = failed_rank;
    LOOMI_VFORMAT(c->errmsg, fmt);
    LOOMI_WARN(c->rank, "communicator failed: %s (%s)", c->errmsg, loom_strerror(code));
    /* The control plane tells every rank, even those this one cannot
     * reach on the data plane; it names failed ranks only from its own
     * detector, never from a guess such as a deadline's suspect. */
    if (c->ctrl) loomi_ctrl_revoke(c->ctrl, code, failed_rank, c->errmsg);
    /* Tell everyone at once, so that ranks not talking to the failed
     * peer stop too instead of waiting for their deadline.  Not for ranks
     * whose calls differ: nobody failed, the control plane tells every
     * rank, and connections kept open let a rank still finishing an
     * earlier call complete it (a closed TCP connection can take with it
     * what the peer had not read yet), so that its account of its calls
     * reaches the call in question (calls.h). */
    if (c->eng.tops && c->eng.tstate && !(code == LOOM_ERR_MISMATCH && c->ctrl))
        c->eng.tops->abort_all(c->eng.tstate, failed_rank, code);
    /* Ranks whose calls differ: every rank shows the others its last
     * calls, so that each can say which rank differs (calls.h). */
    if (code == LOOM_ERR_MISMATCH) loomi_calls_push(c);
    loomi_comm_unlock(c);
}

loom_result_t loomi_comm_out(struct loom_comm *c, loom_result_t err)
{
    if (err != LOOM_ERR_REVOKED) return err;
    char msg[256];
    snprintf(msg, sizeof msg, "%s", loom_get_last_error());
    loomi_comm_fail(c, LOOM_ERR_REVOKED, c->rank, "%s", msg);
    return loomi_fail(err, c->rank, "%s", msg);
}

/* The transports' ctx.call_check. */
static uint32_t comm_call_check(void *owner, uint64_t tag)
{
    return loomi_call_check_of_op(owner, loomi_tag_op(tag));
}

void loomi_comm_on_peer_failed(void *owner, int peer, int failed, loom_result_t code,
                               const char *why)
{
    struct loom_comm *c = owner;
    if (failed < 0) /* an abort notice naming nobody: a revocation */
        loomi_comm_fail(c, code, -1, "rank %d revoked the communicator (%s)", peer, why);
    else if (failed == peer)
        loomi_comm_fail(c, code, peer, "rank %d failed: %s", peer, why);
    else
        loomi_comm_fail(c, code, failed, "rank %d reported that rank %d failed: %s", peer, failed,
                        why);
}

int loomi_comm_peer_word(void *owner, int peer, int ms)
{
    struct loom_comm *c = owner;
    if (!c->ctrl || c->error != LOOM_SUCCESS || !loomi_ctrl_wait_word(c->ctrl, peer, ms)) return 0;
    loom_result_t code;
    int failed;
    char why[8];
    loomi_ctrl_reason(c->ctrl, &code, &failed, why, sizeof why);
    if (code == LOOM_ERR_REMOTE) return 0; /* a rank failed: the transport says how */
    return loomi_comm_sync(c) != LOOM_SUCCESS;
}

/* ------------------------------------------------- the engine's hooks */

static struct loom_comm *owner(struct loomi_engine *e) { return e->owner; }

static void eng_fail(struct loomi_engine *e, loom_result_t code, int peer, const char *msg)
{
    loomi_comm_fail(owner(e), code, peer, "%s", msg);
}

static int eng_revoke_pending(struct loomi_engine *e)
{
    return loomi_comm_revoke_pending(owner(e));
}

static loom_result_t eng_sync(struct loomi_engine *e) { return loomi_comm_sync(owner(e)); }

static void eng_calls_poll(struct loomi_engine *e) { loomi_calls_poll(owner(e)); }

static void eng_calls_probe(struct loomi_engine *e, uint64_t no, const int *peers, int npeers)
{
    loomi_calls_probe(owner(e), no, peers, npeers);
}

static int eng_calls_verdict(struct loomi_engine *e)
{
    struct loom_comm *c = owner(e);
    int found = loomi_calls_verdict(c, LOOMI_VERDICT_WAIT_MS);
    c->mismatch_told = 1;
    return found;
}

static int eng_window_map(struct loomi_engine *e, uint64_t id, unsigned char **out, int n,
                          size_t *len)
{
    return loomi_mem_window_map(owner(e), id, out, n, len);
}

static int eng_window_push_begin(struct loomi_engine *e, uint64_t id)
{
    return loomi_mem_window_push_begin(owner(e), id);
}

static void eng_window_push_end(struct loomi_engine *e, uint64_t id)
{
    loomi_mem_window_push_end(owner(e), id);
}

static int eng_window_close(struct loomi_engine *e, uint64_t id, uint64_t deadline_ms)
{
    return loomi_mem_window_close(owner(e), id, deadline_ms);
}

static const struct loomi_engine_hooks comm_hooks = {
    .fail = eng_fail,
    .revoke_pending = eng_revoke_pending,
    .sync = eng_sync,
    .calls_poll = eng_calls_poll,
    .calls_probe = eng_calls_probe,
    .calls_verdict = eng_calls_verdict,
    .window_map = eng_window_map,
    .window_push_begin = eng_window_push_begin,
    .window_push_end = eng_window_push_end,
    .window_close = eng_window_close,
};

void loomi_comm_engine_bind(struct loom_comm *c)
{
    loomi_engine_bind(&c->eng, c, &comm_hooks, &c->rank, &c->set, &c->error, c->errmsg,
                      &c->hosts, &c->ctrl, loomi_sched_sig_name);
}

loom_result_t loomi_comm_alloc(struct loom_comm **out, int rank, int nranks,
                               const loom_config_t *cfg, const char *caller)
{
    struct loom_comm *c = calloc(1, sizeof *c);
    if (!c) return loomi_fail(LOOM_ERR_NO_MEMORY, rank, "%s: out of memory", caller);
    c->rank = rank;
    c->nranks = nranks;
    c->failed_rank = -1;
    c->rdv_fd = -1;
    loomi_comm_engine_bind(c);
    loom_result_t r = loomi_settings_resolve(&c->set, cfg, caller);
    if (r == LOOM_SUCCESS) r = loomi_algo_parse("LOOM_ALGO", c->set.algo, c->algo_forced, rank);
    if (r != LOOM_SUCCESS) {
        free(c);
        return r;
    }
    *out = c;
    return LOOM_SUCCESS;
}

/* The NIC `me` should open: the one an earlier picture gave it (a
 * communicator made from another), else the picture's choice for its
 * local index as the launcher tells it. */
static int nic_to_open(const struct loom_comm *c, const struct loomi_topo_rank *me)
{
    if (me->nic >= 0 && me->nic < me->host.nnics) return me->nic;
    int li, n;
    loomi_env_local_rank(c->rank, &li, &n);
    return loomi_topo_local_nic(me, li, n);
}

loom_result_t loomi_comm_prepare(struct loom_comm *c, const struct loomi_topo_rank *me,
                                 unsigned char *addr)
{
    const int nic = nic_to_open(c, me);
    struct loomi_tctx ctx = {
        .rank = c->rank,
        .nranks = c->nranks,
        .job_key = c->job_key,
        .peer_failed = loomi_comm_on_peer_failed,
        .peer_word = loomi_comm_peer_word,
        .owner = c,
        .call_check = comm_call_check,
        .name_sig = loomi_sched_sig_name,
        .sock = {.streams = c->set.tcp_streams,
                 .sockbuf = c->set.tcp_sockbuf,
                 .encrypt = c->set.encrypt,
                 .ifname = c->set.socket_ifname[0] ? c->set.socket_ifname : NULL,
                 .bind_hint = &c->bind_addr,
                 .bind_hint_len = c->bind_len},
        .shm = {.bytes = c->set.shm_bytes, .cma_min = c->set.shm_cma_min},
        .verbs = {.nic_hint = nic >= 0 ? me->host.nics[nic].name : NULL,
                  .gpudirect = c->set.gpudirect},
    };
    loom_result_t r = loomi_route_create(&ctx, c->route_mask, &c->eng.xfer_events, &c->eng.tstate);
    if (r != LOOM_SUCCESS) return r;
    /* The card says which NIC RDMA opened, so that every rank's picture
     * shows the NICs in use. */
    struct loomi_topo_rank card = *me;
    const char *dev = loomi_route_rdma_device(c->eng.tstate);
    card.nic = -1;
    card.nic_open = 0;
    for (int i = 0; dev && card.nic < 0 && i < card.host.nnics; i++)
        if (strcmp(card.host.nics[i].name, dev) == 0) {
            card.nic = (int16_t)i;
            card.nic_open = 1;
        }
    _Static_assert(LOOMI_ROUTE_ADDR_BYTES + LOOMI_TOPO_CARD_BYTES + LOOMI_CTRL_ADDR_BYTES <=
                       LOOMI_ADDR_BYTES,
                   "bootstrap address holds the route address, topology card and control address");
    size_t alen = LOOMI_ROUTE_ADDR_BYTES;
    memset(addr, 0, LOOMI_ADDR_BYTES);
    r = c->eng.tops->local_addr(c->eng.tstate, addr, &alen);
    if (r != LOOM_SUCCESS) return r;
    loomi_topo_pack(&card, addr + LOOMI_ROUTE_ADDR_BYTES);
    r = loomi_ctrl_create(c->rank, c->nranks, c->job_key, c->set.heartbeat_ms,
                          (const struct sockaddr *)&c->bind_addr, (socklen_t)c->bind_len,
                          &c->ctrl);
    if (r != LOOM_SUCCESS) return r;
    if (c->set.encrypt) loomi_ctrl_set_sealed(c->ctrl);
    loomi_ctrl_addr(c->ctrl, addr + LOOMI_ROUTE_ADDR_BYTES + LOOMI_TOPO_CARD_BYTES);
    return LOOM_SUCCESS;
}

loom_result_t loomi_comm_finish(struct loom_comm *c, const unsigned char *all,
                                uint64_t deadline_ms, const struct loomi_links *links)
{
    const int rank = c->rank, nranks = c->nranks;
    struct loomi_topo_rank *cards = malloc((size_t)nranks * sizeof *cards);
    c->topo = calloc(1, sizeof *c->topo);
    if (!cards || !c->topo) {
        free(cards);
        return loomi_fail(LOOM_ERR_NO_MEMORY, rank, "communicator: out of memory");
    }
    loom_result_t r = LOOM_SUCCESS;
    for (int q = 0; q < nranks && r == LOOM_SUCCESS; q++) {
        r = loomi_topo_unpack(all + (size_t)q * LOOMI_ADDR_BYTES + LOOMI_ROUTE_ADDR_BYTES,
                              &cards[q]);
        if (r != LOOM_SUCCESS)
            r = loomi_fail(r, rank, "rank %d's topology card: %s", q, loom_get_last_error());
    }
    if (r == LOOM_SUCCESS) r = loomi_topo_job_build(cards, nranks, c->topo);
    free(cards);
    if (r == LOOM_SUCCESS) {
        c->hosts = loomi_hostmap_build(nranks, c->topo->map->host_of);
        if (!c->hosts) r = loomi_fail(LOOM_ERR_NO_MEMORY, rank, "communicator: out of memory");
    }
    if (r == LOOM_SUCCESS) {
        loomi_route_set_hosts(c->eng.tstate, c->hosts->host_of);
        r = c->eng.tops->connect_all(c->eng.tstate, all, LOOMI_ADDR_BYTES, deadline_ms);
    }
    if (r == LOOM_SUCCESS)
        r = loomi_ctrl_start(c->ctrl, all + LOOMI_ROUTE_ADDR_BYTES + LOOMI_TOPO_CARD_BYTES,
                             LOOMI_ADDR_BYTES, deadline_ms);
    if (r != LOOM_SUCCESS) return r;
    if (c->rdv_len)
        loomi_ctrl_serve_joins(c->ctrl, (struct sockaddr *)&c->rdv_addr, c->rdv_len, c->rdv_fd,
                               c->rdv_keyed);
    else if (c->rdv_fd >= 0)
        close(c->rdv_fd);
    c->rdv_fd = -1;
    {
        /* Counted per machine, not per host: hosts faked on one machine
         * (LOOM_HOSTNAME, network namespaces) share its cores. */
        int cores = c->topo->ranks[rank].host.ncores;
        c->machine_ranks = loomi_topo_machine_ranks(c->topo, rank);
        c->eng.oversubscribed = cores > 0 && c->machine_ranks > cores;
        /* Before the probe, which then prices the path the collectives
         * will take. */
        if (c->eng.oversubscribed && !c->set.shm_cma_fixed && loomi_route_has_shm(c->eng.tstate)) {
            loomi_route_shm_crowded(c->eng.tstate);
            LOOMI_INFO(rank, "%d ranks share this machine's %d cores: shared-memory messages "
                       "that fit a FIFO go through its cells, not single-copy",
                       c->machine_ranks, cores);
        }
    }
    /* Every rank decides the same way (the same LOOM_TRANSPORT and
     * LOOM_SHM_SIZE everywhere), so selections agree across ranks. */
    if (c->route_mask & 2u) c->shared_bytes = c->set.shm_bytes;
    /* Small collectives of a job on one host go through slots at the
     * arenas' tail, which schedules then leave alone. */
    c->small_max = c->small_region = 0;
    if (c->shared_bytes) {
        c->small_max =
            loomi_small_limit(c->set.shm_small, c->shared_bytes, c->nranks, c->hosts->nhosts);
        if (c->small_max) c->small_region = loomi_slot_region_bytes(c->small_max);
        for (int k = 0; k < LOOMI_SMALL_TUNED; k++)
            c->small_lim[k] = c->small_max; /* until loomi_small_tune() measures them */
        for (int k = 0; k < LOOMI_RED_CLASSES; k++) c->small_lim_red[k] = c->small_max;
        c->small_unmeasured = 0;
        c->shared_bytes -= c->small_region;
    }
    /* The engine runs the slot operations: where its slots lie. */
    c->eng.slot_off = c->shared_bytes;
    c->eng.slot_bytes = c->small_max;
    /* Live from here: tuning calls the public collectives on it. */
    r = loomi_comm_publish(c);
    if (r != LOOM_SUCCESS) return r;
    /* Measure the links and choose algorithms: collective over the new
     * communicator, so every rank gets here or fails by the deadline. */
    r = loomi_comm_tune(c, links);
    if (r != LOOM_SUCCESS) {
        loomi_comm_withdraw(c);
        return r;
    }
    /* Straggler telemetry counts the application's operations, from
     * here on (not the tuning's). */
    if (c->set.stats && !c->eng.stats) {
        loomi_comm_lock(c);
        if (loomi_stats_init(&c->eng, c->nranks) != 0)
            LOOMI_WARN(rank, "no memory for the straggler telemetry: loom_comm_get_stats "
                       "will say it is off");
        loomi_comm_unlock(c);
    }
    return r;
}

static void comm_free(struct loom_comm *c, int polite);

void loomi_comm_discard(struct loom_comm *c)
{
    /* What the measuring at creation made goes too (schedules, buffers,
     * the slots' map): comm_free, after the transport. */
    loomi_comm_withdraw(c);
    loomi_progress_stop(&c->eng);
    loomi_ctrl_destroy(c->ctrl, 0);
    c->ctrl = NULL;
    if (c->rdv_fd >= 0) close(c->rdv_fd);
    c->rdv_fd = -1;
    if (c->eng.tstate) c->eng.tops->destroy(c->eng.tstate);
    c->eng.tstate = NULL;
    comm_free(c, 0);
}

/* Discover this host, publish transports' addresses, the topology card
 * and the control address, and from every rank's card build the job's
 * picture before connecting, so that each peer is reached by the right
 * transport. */
loom_result_t loomi_comm_create(loom_comm_t *out, const struct loomi_boot_target *target,
                                int rank, int nranks, const loom_config_t *cfg, const char *caller,
                                bool run_root)
{
    struct loom_comm *c;
    unsigned char *all = NULL;
    loom_result_t r = loomi_comm_alloc(&c, rank, nranks, cfg, caller);
    if (r != LOOM_SUCCESS) return r;
    /* The messages of the bootstrap name the deadline as it was set. */
    struct loomi_boot_target tt = *target;
    const struct loomi_boot_target *t = &tt;
    loomi_timeout_str(&c->set, tt.tmo, sizeof tt.tmo);
    memcpy(c->job_key, t->job_key, sizeof c->job_key);
    c->rdv_keyed = t->keyed;
    if (!t->keyed && rank == 0)
        LOOMI_NOTICE(rank, "this job has no secret (LOOM_JOB_KEY is not set): it takes "
                           "connections from this host only, and any process on this host "
                           "can join it");
    r = loomi_route_parse(c->set.transport, &c->route_mask, rank);
    if (r != LOOM_SUCCESS) {
        free(c);
        return r;
    }
    c->eng.tops = &loomi_route_ops;
    uint64_t deadline = loomi_now_ms() + (uint64_t)c->set.timeout_ms;
    struct loomi_topo_rank me;
    r = loomi_topo_discover(&c->set, rank, &me);
    if (r != LOOM_SUCCESS) goto fail;

    if (run_root) {
        char port[16];
        snprintf(port, sizeof port, "%.15s", t->port);
        /* It outlives this rank's own deadline, to answer its question
         * then (which ranks never came) and tell the others. */
        r = loomi_root_start(t, port, sizeof port, nranks, deadline + 1000, 1, NULL,
                             &c->rdv_fd);
        if (r != LOOM_SUCCESS) goto fail;
    }
    int bfd = -1;
    c->bind_len = sizeof c->bind_addr;
    r = loomi_boot_connect(t, rank, deadline, &bfd, &c->bind_addr, &c->bind_len, NULL);
    if (r != LOOM_SUCCESS) goto fail;
    {
        /* Joiners come to the same address later (ctrl.h). */
        socklen_t l = sizeof c->rdv_addr;
        if (getpeername(bfd, (struct sockaddr *)&c->rdv_addr, &l) == 0) c->rdv_len = l;
    }
    unsigned char addr[LOOMI_ADDR_BYTES];
    all = malloc((size_t)nranks * LOOMI_ADDR_BYTES);
    if (!all) r = loomi_fail(LOOM_ERR_NO_MEMORY, rank, "%s: out of memory", caller);
    if (r == LOOM_SUCCESS) r = loomi_comm_prepare(c, &me, addr);
    if (r != LOOM_SUCCESS) {
        close(bfd);
        goto fail;
    }
    struct loomi_uniform u;
    loomi_uniform_fill(&u, &c->set, c->algo_forced, c->route_mask, 1);
    r = loomi_boot_exchange(bfd, t, rank, nranks, addr, sizeof addr, &u, all, deadline);
    if (r == LOOM_SUCCESS) r = loomi_comm_finish(c, all, deadline, NULL);
    if (r != LOOM_SUCCESS) goto fail;
    free(all);
    char how[96];
    LOOMI_INFO(rank, "communicator ready: rank %d of %d on host %s (%d host(s)), transport %s, "
               "%d stream(s), chunk %zu, heartbeat %d ms",
               rank, nranks, me.host.name, c->hosts->nhosts,
               loomi_route_describe(c->eng.tstate, how, sizeof how), c->set.tcp_streams,
               c->set.chunk_bytes, c->set.heartbeat_ms);
    *out = c->handle;
    return LOOM_SUCCESS;
fail:
    free(all);
    /* A deadline under a second is worth a word, wherever it passed. */
    if (r == LOOM_ERR_TIMEOUT && c->set.timeout_ms < 1000 &&
        !strstr(loom_get_last_error(), tt.tmo))
        r = loomi_fail(r, rank, "%s (%s)", loom_get_last_error(), tt.tmo);
    loomi_comm_discard(c);
    return r;
}

loom_result_t loom_get_unique_id(loom_unique_id_t *id)
{
    if (!id) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "loom_get_unique_id: id is NULL");
    const struct loomi_env *e = loomi_env_get();
    if (!e) return LOOM_ERR_INVALID_ARGUMENT;
    struct uid_layout u;
    memset(&u, 0, sizeof u);
    u.magic = UID_MAGIC;
    u.version = 1;
    if (loomi_auth_random(u.job_key, sizeof u.job_key))
        return loomi_fail(LOOM_ERR_SYSTEM, -1, "loom_get_unique_id: getrandom: %s",
                          strerror(errno));
    struct sockaddr_storage ss;
    socklen_t sl;
    const char *why = "";
    char ifn[64];
    if (loomi_pick_address(e->socket_ifname, &ss, &sl, ifn, sizeof ifn, &why))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "loom_get_unique_id: %s (LOOM_SOCKET_IFNAME=%s)",
                          why, e->socket_ifname ? e->socket_ifname : "");
    char buf[96];
    loomi_sockaddr_str((struct sockaddr *)&ss, buf, sizeof buf);
    /* Strip the ":0" port (and brackets) for the host part. */
    char *colon = strrchr(buf, ':');
    if (colon) *colon = '\0';
    char *h = buf;
    if (*h == '[') {
        h++;
        h[strlen(h) - 1] = '\0';
    }
    snprintf(u.host, sizeof u.host, "%s", h);
    char port[16] = "0";
    struct loomi_boot_target t;
    memset(&t, 0, sizeof t);
    snprintf(t.host, sizeof t.host, "%s", u.host);
    loomi_auth_key(u.job_key, sizeof u.job_key, t.job_key);
    t.keyed = 1;
    loom_result_t r = loomi_root_start(&t, port, sizeof port, 0,
                                       loomi_now_ms() + (uint64_t)e->timeout_ms + 1000, 1, NULL,
                                       NULL);
    if (r != LOOM_SUCCESS) return r;
    snprintf(u.port, sizeof u.port, "%.7s", port);
    memcpy(id->internal, &u, sizeof u);
    LOOMI_INFO(-1, "unique id: rendezvous at %s:%s (interface %s)", u.host, u.port, ifn);
    return LOOM_SUCCESS;
}

loom_result_t loom_comm_init_rank(loom_comm_t *comm, int nranks, const loom_unique_id_t *id,
                                  int rank, const loom_config_t *cfg)
{
    const char *fn = "loom_comm_init_rank";
    if (!comm) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank, "%s: comm is NULL", fn);
    if (!id) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank, "%s: id is NULL", fn);
    if (nranks < 1 || nranks > (1 << 20))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank, "%s: nranks %d is not in 1..%d", fn,
                          nranks, 1 << 20);
    if (rank < 0 || rank >= nranks)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank, "%s: rank %d is not in 0..%d", fn,
                          rank, nranks - 1);
    struct uid_layout u;
    memcpy(&u, id->internal, sizeof u);
    if (u.magic != UID_MAGIC || u.version != 1 || !memchr(u.host, 0, sizeof u.host) ||
        !memchr(u.port, 0, sizeof u.port))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank,
                          "%s: id was not made by loom_get_unique_id (bad magic or version)", fn);
    struct loomi_boot_target t;
    memset(&t, 0, sizeof t);
    snprintf(t.host, sizeof t.host, "%s", u.host);
    snprintf(t.port, sizeof t.port, "%s", u.port);
    loomi_auth_key(u.job_key, sizeof u.job_key, t.job_key);
    t.keyed = 1;
    *comm = NULL;
    return loomi_comm_create(comm, &t, rank, nranks, cfg, fn, false);
}

loom_result_t loom_comm_init_env(loom_comm_t *comm, const loom_config_t *cfg)
{
    const char *fn = "loom_comm_init_env";
    if (!comm) return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: comm is NULL", fn);
    struct loomi_boot_target t;
    int rank, nranks;
    loom_result_t r = loomi_env_target(&t, &rank, &nranks);
    if (r != LOOM_SUCCESS) return r;
    *comm = NULL;
    return loomi_comm_create(comm, &t, rank, nranks, cfg, fn, rank == 0);
}

static void comm_free(struct loom_comm *c, int polite)
{
    loomi_comm_withdraw(c);
    loomi_progress_stop(&c->eng);
    loomi_ctrl_destroy(c->ctrl, polite);
    c->ctrl = NULL;
    free(c->p2p_seq);
    free(c->grp_seq);
    free(c->agreed_failed);
    while (c->agree_stash) {
        struct loomi_cmsg *m = c->agree_stash;
        c->agree_stash = m->next;
        free(m);
    }
    loomi_sched_free(&c->small_sched);
    free(c->hosts);
    free(c->links);
    free(c->sel);
    loomi_sched_cache_free(c->sched_cache);
    loomi_quorum_free(c->quorum);
    loomi_engine_release(&c->eng);
    loomi_devbuf_free(c);
    loomi_devpeer_free(c);
    loomi_mem_release_all(c);
    loomi_mem_windows_free_all(c);
    if (c->topo) {
        loomi_topo_job_free(c->topo);
        free(c->topo);
    }
    free(c);
}

loom_result_t loom_comm_destroy(loom_comm_t h)
{
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_live(h, "loom_comm_destroy", &comm);
    if (r != LOOM_SUCCESS) return r;
    /* Late contributions to quorum calls still to come (their senders
     * made the calls, so they come within the deadline), and results
     * still on their way to late ranks (quorum.c); on a broken
     * communicator they have failed and are only freed. */
    if (comm->quorum) (void)loomi_quorum_drain(comm);
    if (comm->eng.nlive)
        return loomi_fail(LOOM_ERR_INVALID_USAGE, comm->rank,
                          "loom_comm_destroy: %d operation(s) still pending; wait for them first",
                          comm->eng.nlive);
    loomi_progress_stop(&comm->eng); /* before the transport goes */
    /* Goodbye on the control plane first: the peers see a departure. */
    loomi_ctrl_destroy(comm->ctrl, 1);
    comm->ctrl = NULL;
    comm->eng.tops->destroy(comm->eng.tstate);
    comm_free(comm, 1);
    return LOOM_SUCCESS;
}

loom_result_t loom_comm_abort(loom_comm_t h)
{
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_live(h, "loom_comm_abort", &comm);
    if (r != LOOM_SUCCESS) return r;
    loomi_progress_stop(&comm->eng);
    loomi_comm_fail(comm, LOOM_ERR_REVOKED, comm->rank, "aborted by loom_comm_abort on rank %d",
                    comm->rank);
    loomi_engine_free_all(&comm->eng);
    /* No goodbye: the peers count this rank as failed. */
    loomi_ctrl_destroy(comm->ctrl, 0);
    comm->ctrl = NULL;
    comm->eng.tops->destroy(comm->eng.tstate);
    comm_free(comm, 0);
    return LOOM_SUCCESS;
}

loom_result_t loomi_comm_live_arg(loom_comm_t h, const char *fn, const void *arg,
                                 const char *what, struct loom_comm **comm)
{
    loom_result_t r = loomi_comm_live(h, fn, comm);
    if (r == LOOM_SUCCESS && !arg)
        r = loomi_fail(LOOM_ERR_INVALID_ARGUMENT, (*comm)->rank, "%s: %s is NULL", fn, what);
    return r;
}

loom_result_t loom_comm_rank(loom_comm_t h, int *rank)
{
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_live_arg(h, "loom_comm_rank", rank, "rank", &comm);
    if (r == LOOM_SUCCESS) *rank = comm->rank;
    return r;
}

loom_result_t loom_comm_size(loom_comm_t h, int *size)
{
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_live_arg(h, "loom_comm_size", size, "size", &comm);
    if (r == LOOM_SUCCESS) *size = comm->nranks;
    return r;
}

loom_result_t loom_comm_get_error(loom_comm_t h, int *failed_rank)
{
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_live(h, "loom_comm_get_error", &comm);
    if (r != LOOM_SUCCESS) return r;
    loomi_comm_lock(comm);
    if (failed_rank) *failed_rank = comm->error != LOOM_SUCCESS ? comm->failed_rank : -1;
    r = comm->error;
    loomi_comm_unlock(comm);
    return r;
}

loom_result_t loom_comm_revoke(loom_comm_t h)
{
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_live(h, "loom_comm_revoke", &comm);
    if (r != LOOM_SUCCESS) return r;
    if (loomi_comm_sync(comm) == LOOM_SUCCESS) {
        loomi_comm_fail(comm, LOOM_ERR_REVOKED, -1, "revoked by loom_comm_revoke on rank %d",
                        comm->rank);
        loomi_engine_fail_all(&comm->eng);
    }
    return LOOM_SUCCESS;
}

loom_result_t loom_comm_get_failed(loom_comm_t h, int *ranks, int capacity, int *count)
{
    const char *fn = "loom_comm_get_failed";
    struct loom_comm *comm;
    loom_result_t r = loomi_comm_live_arg(h, fn, count, "count", &comm);
    if (r != LOOM_SUCCESS) return r;
    if (capacity < 0)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank, "%s: capacity %d is negative", fn,
                          capacity);
    if (capacity > 0 && !ranks)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, comm->rank,
                          "%s: ranks is NULL with capacity %d", fn, capacity);
    int k = 0;
    if (comm->ctrl) {
        unsigned char *set = malloc((size_t)comm->nranks);
        if (!set) return loomi_fail(LOOM_ERR_NO_MEMORY, comm->rank, "%s: out of memory", fn);
        /* After a shrink or grow: the set the survivors agreed on (the
         * survivors that have since destroyed comm are not in it). */
        if (comm->agreed_failed) memcpy(set, comm->agreed_failed, (size_t)comm->nranks);
        else loomi_ctrl_failed(comm->ctrl, set, NULL);
        for (int q = 0; q < comm->nranks; q++)
            if (set[q] == LOOMI_OUT) { /* ranks that left with loom_comm_destroy did not fail */
                if (k < capacity) ranks[k] = q;
                k++;
            }
        free(set);
    }
    *count = k;
    return LOOM_SUCCESS;
}

int loomi_algo_for(const struct loom_comm *comm, int coll, size_t bytes, int inplace,
                   loom_datatype_t dtype, loom_op_t op, size_t *chunk)
{
    if (chunk) *chunk = 0;
    if (comm->algo_forced[coll] != LOOMI_ALGO_AUTO) return comm->algo_forced[coll];
    if (!comm->sel) return loomi_algo_default(coll, comm->nranks, bytes);
    const struct loomi_ranges *t = &comm->sel->coll[coll];
    /* Once the host's ranks share windows, an allreduce is costed as if
     * its buffers were in them: a choice that every rank makes alike
     * whatever its own buffers, so that a rank with plain ones runs the
     * same algorithm and the shared one's check names the mismatch.  In
     * place (which every rank is, or none) from a table of its own: the
     * window form then saves what it overwrites and reads lines the
     * peers have just written, which makes it slower than the ring on
     * small vectors, but from about 1M it beats algorithms that copy
     * RECV aside first (perf/NOTES.md, "comm.c, windows in place"). */
    if (coll == LOOMI_COLL_ALLREDUCE && comm->win_shared) {
        t = &comm->sel->window[inplace != 0];
    } else if (coll == LOOMI_COLL_ALLREDUCE) {
        /* Slower reductions than the fp32 sums that tune.c timed with
         * have tables of their own. */
        const int cls = loomi_red_class(comm, dtype, op);
        if (cls > 0 && cls < LOOMI_RED_CLASSES) t = &comm->sel->allreduce_red[cls];
    }
    const struct loomi_range *e = loomi_ranges_find(t, bytes);
    if (!e) return loomi_algo_default(coll, comm->nranks, bytes);
    if (chunk) *chunk = e->chunk;
    return e->algo;
}
