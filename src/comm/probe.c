/*
 * probe.c - what this communicator's links cost, measured at init.
 *
 * One pair per link class: rank 0 with the next rank of its host (within
 * a host: shared memory, or TCP when only TCP is allowed) and rank 0 with
 * the first rank of another host (TCP).  Latency: the first quartile of
 * a few 8-byte round trips; bandwidth: the best of a few round trips of
 * PROBE_BYTES less the latency; the price of a chunk: PROBE_BYTES sent as
 * PROBE_PIECES messages against one (select.c weighs chunk sizes with
 * it).  Rank 0 also times a reduction and a copy, then broadcasts
 * everything, so every rank builds the same selection table.  The whole
 * probe takes a small part of INIT_BUDGET_NS on one host (a good part of
 * it the timing of the reduction) and more over a 1 Gbit/s link
 * (PROBE_BYTES at that rate is 2 ms a way); see perf/NOTES.md,
 * "probe.c, the probe's time".
 *
 * Where RDMA verbs and TCP both reach the other hosts, the inter-host
 * pair is measured over each, and the one faster at
 * LOOMI_VERBS_COMPARE_BYTES carries every rank's inter-host data.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/collectives.h"
#include "comm/comm.h"
#include "transports/route.h"
#include "core/internal.h"
#include "topo/model.h"
#include "topo/select.h"
#include "topo/topo.h"

#define PROBE_SMALL 32 /* 8-byte round trips (after 2 to warm up) */
#define PROBE_BIG 5    /* PROBE_BYTES round trips (after 1) */
#define PROBE_BYTES ((size_t)256 << 10)
/* The chunk's price: PROBE_BYTES in PROBE_PIECES messages posted at once
 * against one message, each answered by 8 bytes; the best of
 * PROBE_STREAMS (fewer than PROBE_BIG: over 1 Gbit/s each takes 2 ms). */
#define PROBE_PIECES 4
#define PROBE_STREAMS 3
/* The measuring at init, all told, from the probe's start: the probe,
 * the reductions' classes, the slots (small.c, which stop at 50 ms of
 * their own) and the allreduce's table (tune.c, which gets what is
 * left).  Counted from the probe, not after it: on a loaded host the
 * probe itself takes longer, and a budget counted after it let init run
 * past the total (perf/NOTES.md, "probe.c, the probe's time"). */
#define INIT_BUDGET_NS 100000000u

/* `bytes` from rank 0 to `other` in `pieces` messages posted together,
 * and 8 bytes back; the best of PROBE_STREAMS (after one). */
static loom_result_t stream(struct loom_comm *c, int other, unsigned char *buf, size_t bytes,
                            int pieces, double *best)
{
    const size_t piece = bytes / (size_t)pieces;
    loom_result_t r = LOOM_SUCCESS;
    *best = 1e9;
    for (int i = -1; i < PROBE_STREAMS && r == LOOM_SUCCESS; i++) {
        loom_request_t req[PROBE_PIECES];
        int posted = 0;
        uint64_t t0 = loomi_now_ns();
        for (; posted < pieces && r == LOOM_SUCCESS; posted++)
            r = c->rank == 0 ? loomi_call_p2p("loom_isend", 1, buf + posted * piece, NULL, piece,
                                              LOOM_UINT8, other, c->handle, &req[posted])
                             : loomi_call_p2p("loom_irecv", 0, NULL, buf + posted * piece, piece,
                                              LOOM_UINT8, other, c->handle, &req[posted]);
        if (r != LOOM_SUCCESS) posted--;
        /* Every posted request is waited for, even after a failure. */
        for (int k = 0; k < posted; k++) {
            loom_result_t w = loomi_req_wait(&req[k]);
            if (r == LOOM_SUCCESS) r = w;
        }
        if (r == LOOM_SUCCESS)
            r = c->rank == 0 ? loomi_call_p2p("loom_recv", 0, NULL, buf, 8, LOOM_UINT8, other,
                                              c->handle, NULL)
                             : loomi_call_p2p("loom_send", 1, buf, NULL, 8, LOOM_UINT8, other,
                                              c->handle, NULL);
        double dt = (double)(loomi_now_ns() - t0) * 1e-9;
        if (i >= 0 && dt < *best) *best = dt;
    }
    return r;
}

/* Round trips between rank 0 and peer, of 8 bytes and of `bytes`; rank 0
 * gets alpha, beta and the cost of each more piece a transfer is cut
 * into. */
static loom_result_t pingpong(struct loom_comm *c, int peer, unsigned char *buf, size_t bytes,
                              double *alpha, double *beta, double *chunk)
{
    const int me = c->rank, other = me == 0 ? peer : 0;
    double t[PROBE_SMALL];
    loom_result_t r = LOOM_SUCCESS;
    for (int i = -2; i < PROBE_SMALL && r == LOOM_SUCCESS; i++) {
        uint64_t t0 = loomi_now_ns();
        if (me == 0) {
            r = loomi_call_p2p("loom_send", 1, buf, NULL, 8, LOOM_UINT8, other, c->handle, NULL);
            if (r == LOOM_SUCCESS)
                r = loomi_call_p2p("loom_recv", 0, NULL, buf, 8, LOOM_UINT8, other, c->handle,
                                   NULL);
        } else {
            r = loomi_call_p2p("loom_recv", 0, NULL, buf, 8, LOOM_UINT8, other, c->handle, NULL);
            if (r == LOOM_SUCCESS)
                r = loomi_call_p2p("loom_send", 1, buf, NULL, 8, LOOM_UINT8, other, c->handle,
                                   NULL);
        }
        if (i >= 0) t[i] = (double)(loomi_now_ns() - t0) * 1e-9;
    }
    double best = 1e9;
    for (int i = -1; i < PROBE_BIG && r == LOOM_SUCCESS; i++) {
        uint64_t t0 = loomi_now_ns();
        if (me == 0) {
            r = loomi_call_p2p("loom_send", 1, buf, NULL, bytes, LOOM_UINT8, other, c->handle,
                               NULL);
            if (r == LOOM_SUCCESS)
                r = loomi_call_p2p("loom_recv", 0, NULL, buf, bytes, LOOM_UINT8, other, c->handle,
                                   NULL);
        } else {
            r = loomi_call_p2p("loom_recv", 0, NULL, buf, bytes, LOOM_UINT8, other, c->handle,
                               NULL);
            if (r == LOOM_SUCCESS)
                r = loomi_call_p2p("loom_send", 1, buf, NULL, bytes, LOOM_UINT8, other, c->handle,
                                   NULL);
        }
        double dt = (double)(loomi_now_ns() - t0) * 1e-9;
        if (i >= 0 && dt < best) best = dt;
    }
    double one = 0, cut = 0;
    if (r == LOOM_SUCCESS) r = stream(c, other, buf, bytes, 1, &one);
    if (r == LOOM_SUCCESS) r = stream(c, other, buf, bytes, PROBE_PIECES, &cut);
    if (r != LOOM_SUCCESS || me != 0) return r;
    /* Both the best of a few: noise makes it negative at worst. */
    *chunk = cut > one ? (cut - one) / (PROBE_PIECES - 1) : 0;
    qsort(t, PROBE_SMALL, sizeof t[0], loomi_cmp_double);
    /* The first quartile, not the median: where ranks outnumber cores a
     * third or more of the round trips wait for a rank outside the pair
     * to give up its core, and take several times as long; the median
     * moved between the two kinds from job to job, and with it every
     * crossover to shared that its synchronisations price: some jobs
     * gave the reduce-scatter at 64K a rank to halving-doubling, well
     * slower than shared there (perf/NOTES.md, "probe.c, latency"). */
    *alpha = t[PROBE_SMALL / 4] / 2;
    /* The bandwidth from the fastest of each kind: the big round trips
     * are the best of a few, so the latency they include is the best
     * one too.  (Taking the median latency off them left nothing on a
     * loaded host, where a round trip's median is several times its
     * best, and beta came out as memory's.) */
    double b = (best - t[0]) / 2 / (double)bytes;
    /* A bandwidth better than memory's is noise in the latency term. */
    *beta = b > 0.02e-9 ? b : 0.02e-9;
    return LOOM_SUCCESS;
}

void loomi_comm_shape(const struct loom_comm *c, struct loomi_job_shape *j)
{
    memset(j, 0, sizeof *j);
    j->hosts = c->hosts;
    j->nranks = c->nranks;
    j->shared_bytes = c->shared_bytes;
    j->stream_bytes = c->set.shm_stream;
    j->chunk_bytes = c->set.chunk_bytes;
    j->chunk_fixed = c->set.chunk_fixed;
    if (c->topo) {
        int fewest = 0;
        for (int q = 0; q < c->nranks; q++) {
            int nc = c->topo->ranks[q].host.ncores;
            if (nc > 0 && (!fewest || nc < fewest)) fewest = nc;
        }
        j->cores_per_host = fewest;
        j->machine_ranks = loomi_topo_most_machine_ranks(c->topo);
        /* Distinct NICs in use per host, from the picture (the same on
         * every rank, as the selection must be). */
        const struct loomi_hostmap *m = c->hosts;
        int fewest_nics = 0;
        for (int h = 0; m && h < m->nhosts; h++) {
            unsigned seen = 0;
            int n = 0;
            for (int i = 0; i < loomi_host_size(m, h); i++) {
                const struct loomi_topo_rank *r = &c->topo->ranks[m->host_ranks[m->host_start[h] + i]];
                if (!r->nic_open || r->nic < 0 || r->nic >= LOOMI_TOPO_MAX_NICS) {
                    n = 0;
                    break;
                }
                if (!(seen & (1u << r->nic))) n++;
                seen |= 1u << r->nic;
            }
            if (!n) {
                fewest_nics = 0;
                break;
            }
            if (!fewest_nics || n < fewest_nics) fewest_nics = n;
        }
        j->nics_per_host = fewest_nics;
    }
}

/* Link k as a ping-pong measured it. */
static void measured(struct loomi_links *l, int k, double a, double b, double chunk_cost)
{
    l->alpha[k] = a;
    l->beta[k] = b;
    l->chunk_cost[k] = chunk_cost;
    l->source[k] = LOOMI_SRC_MEASURED;
}

loom_result_t loomi_comm_tune(struct loom_comm *c, const struct loomi_links *known)
{
    struct loomi_links l;
    const int shm = loomi_route_has_shm(c->eng.tstate);
    loomi_links_defaults(&l, shm);
    const struct loomi_hostmap *m = c->hosts;
    loom_result_t r = LOOM_SUCCESS;
    uint64_t t0 = loomi_now_ns();
    if (known) {
        /* A communicator made from another (shrink, grow): the same
         * links, and the same choice between verbs and TCP. */
        l = *known;
        l.intra_shm = shm;
        if (l.verbs_compared && !l.inter_verbs) loomi_route_switch_all(c->eng.tstate, 0);
    } else if (c->set.tuning_file[0]) {
        /* Every rank reads the file: the launcher gives them all the same. */
        r = loomi_links_read(c->set.tuning_file, &l, c->rank);
        if (r != LOOM_SUCCESS) return r;
    } else if (c->set.probe && c->nranks > 1) {
        int intra = -1, inter = -1;
        const int h0 = m->host_of[0];
        if (loomi_host_size(m, h0) > 1) intra = m->host_ranks[m->host_start[h0] + 1];
        for (int h = 0; h < m->nhosts && inter < 0; h++)
            if (h != h0) inter = m->host_ranks[m->host_start[h]];
        unsigned char *buf = malloc(2 * PROBE_BYTES);
        if (!buf) return loomi_fail(LOOM_ERR_NO_MEMORY, c->rank, "link probe: out of memory");
        memset(buf, 0, 2 * PROBE_BYTES);
        double a, b, k;
        if (intra > 0 && (c->rank == 0 || c->rank == intra)) {
            /* Priced at the single-copy path, which carries the large
             * operations, where PROBE_BYTES goes through the cells but
             * twice that is copied once (ranks sharing cores:
             * loomi_shm_crowded; or LOOM_SHM_CMA above PROBE_BYTES).
             * Both ends see the same geometry and LOOM_SHM_CMA. */
            size_t cm = loomi_route_shm_cells_max(c->eng.tstate, c->rank == 0 ? intra : 0);
            size_t bytes = cm >= PROBE_BYTES && cm < 2 * PROBE_BYTES ? 2 * PROBE_BYTES : PROBE_BYTES;
            r = pingpong(c, intra, buf, bytes, &a, &b, &k);
            if (r == LOOM_SUCCESS && c->rank == 0) measured(&l, LOOMI_LINK_INTRA, a, b, k);
        }
        if (r == LOOM_SUCCESS && inter > 0 && (c->rank == 0 || c->rank == inter)) {
            const int other = c->rank == 0 ? inter : 0;
            /* Both ends see the same transports, so they agree on this. */
            const int both = loomi_route_can_switch(c->eng.tstate, other);
            r = pingpong(c, inter, buf, PROBE_BYTES, &a, &b, &k);
            if (r == LOOM_SUCCESS && c->rank == 0) measured(&l, LOOMI_LINK_INTER, a, b, k);
            if (r == LOOM_SUCCESS && both) {
                /* That was verbs; now the same over TCP.  Each end switches
                 * after its last message of the pair completed. */
                double ta, tb, tk;
                loomi_route_switch(c->eng.tstate, other, 0);
                r = pingpong(c, inter, buf, PROBE_BYTES, &ta, &tb, &tk);
                loomi_route_switch(c->eng.tstate, other, 1);
                if (r == LOOM_SUCCESS && c->rank == 0) {
                    const double s = (double)LOOMI_VERBS_COMPARE_BYTES;
                    l.verbs_compared = 1;
                    l.verbs_alpha = a;
                    l.verbs_beta = b;
                    l.tcp_alpha = ta;
                    l.tcp_beta = tb;
                    l.inter_verbs = a + s * b <= ta + s * tb;
                    if (!l.inter_verbs) {
                        l.alpha[LOOMI_LINK_INTER] = ta;
                        l.beta[LOOMI_LINK_INTER] = tb;
                        l.chunk_cost[LOOMI_LINK_INTER] = tk;
                    }
                }
            }
        }
        free(buf);
        if (r == LOOM_SUCCESS && c->rank == 0) {
            double g, gc;
            /* Out of the L2 cache, as the large operations run. */
            if (loomi_model_measure_cpu((size_t)4 << 20, &g, &gc) == LOOM_SUCCESS) {
                l.gamma = g;
                l.gamma_copy = gc;
            }
        }
        l.probe_ms = (double)(loomi_now_ns() - t0) * 1e-6;
        /* Rank 0's figures, as they are: every rank runs the same build. */
        struct loomi_links msg = l;
        if (r == LOOM_SUCCESS)
            r = loomi_call_broadcast("loom_broadcast", &msg, &msg, sizeof msg, LOOM_UINT8, 0,
                                     c->handle, NULL);
        if (r != LOOM_SUCCESS)
            return loomi_fail(r, c->rank, "measuring the links: %s", loom_get_last_error());
        /* Range-check what came over the network before using it. */
        if (!loomi_links_valid(&msg))
            return loomi_fail(LOOM_ERR_MISMATCH, c->rank,
                              "link probe: rank 0 sent out-of-range figures");
        msg.intra_shm = shm; /* this rank's own */
        l = msg;
        /* Every rank applies the choice once it has the figures: its part
         * of the broadcast is over, so nothing of it is left in flight. */
        if (l.verbs_compared && !l.inter_verbs) loomi_route_switch_all(c->eng.tstate, 0);
    }
    struct loomi_job_shape j;
    loomi_comm_shape(c, &j);
    c->links = malloc(sizeof *c->links);
    c->sel = malloc(sizeof *c->sel);
    if (!c->links || !c->sel)
        return loomi_fail(LOOM_ERR_NO_MEMORY, c->rank, "selection: out of memory");
    *c->links = l;
    loomi_select_build(c->sel, &j, &l);
    /* The slower reductions' classes, and their allreduce tables. */
    r = loomi_red_classes_measure(c);
    if (r != LOOM_SUCCESS) return r;
    loomi_select_build_red(c->sel, &j, &l, c->red.excess);
    /* The slots, then the allreduce's table with what is left of
     * INIT_BUDGET_NS since the probe began (each stops early when it
     * runs out). */
    r = loomi_small_tune(c);
    const uint64_t spent = loomi_now_ns() - t0;
    /* Whether time is left is rank 0's to say (loomi_algo_tune tells the
     * others): on a loaded host the ranks' clocks disagree, and a rank
     * that skipped the timing left the others waiting for it. */
    if (r == LOOM_SUCCESS)
        r = loomi_algo_tune(c, spent < INIT_BUDGET_NS ? INIT_BUDGET_NS - spent : 0);
    if (r != LOOM_SUCCESS) return r;
    /* c->links: the timing may have raised the intra-host beta (tune.c). */
    LOOMI_INFO(c->rank, "links: intra alpha %.2f us beta %.3f ns/B, inter alpha %.2f us beta %.3f "
               "ns/B, gamma %.3f ns/B (%.1f ms)",
               c->links->alpha[0] * 1e6, c->links->beta[0] * 1e9, c->links->alpha[1] * 1e6,
               c->links->beta[1] * 1e9, c->links->gamma * 1e9, c->links->probe_ms);
    if (l.verbs_compared)
        LOOMI_INFO(c->rank,
                   "links: between hosts verbs alpha %.2f us beta %.3f ns/B, tcp alpha %.2f us "
                   "beta %.3f ns/B: data over %s",
                   l.verbs_alpha * 1e6, l.verbs_beta * 1e9, l.tcp_alpha * 1e6, l.tcp_beta * 1e9,
                   l.inter_verbs ? "verbs" : "tcp");
    if (c->rank == 0 && loomi_log_level() >= LOOMI_LOG_INFO) {
        /* The table as the communicator will run it, timed sizes and all:
         * it can differ from job to job with the probe's figures, and
         * perf/select_check.sh reads each job's own. */
        char line[LOOMI_SELECT_MAX_RANGES * 64];
        for (int k = 0; k < LOOMI_NUM_COLLS; k++) {
            loomi_ranges_format(line, sizeof line, &c->sel->coll[k]);
            LOOMI_INFO(c->rank, "selection: %s %s", loomi_coll_name(k), line);
        }
        /* Near-ties on lines of their own ("selection: tie allreduce from
         * ..."), which select_check.sh's reading of the lines above skips. */
        for (int k = 0; k < LOOMI_NUM_COLLS; k++)
            for (int i = 0; i < c->sel->ties[k].n; i++) {
                loomi_tie_format(line, sizeof line, &c->sel->ties[k].t[i]);
                LOOMI_INFO(c->rank, "selection: tie %s %s", loomi_coll_name(k), line);
            }
        if (c->small_max) {
            /* The bytes a rank puts in a slot (small.c), per collective. */
            int used = 0;
            for (int k = 0; k < LOOMI_SMALL_TUNED && used < (int)sizeof line; k++)
                used += snprintf(line + used, sizeof line - (size_t)used, "%s%s %zu",
                                 k ? ", " : "", loomi_coll_name(k), c->small_lim[k]);
            LOOMI_INFO(c->rank, "selection: slots (blocking calls, bytes put in) %s", line);
        }
    }
    return LOOM_SUCCESS;
}
