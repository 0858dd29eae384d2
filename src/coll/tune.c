/*
 * tune.c - the selection table's close calls, timed.
 *
 * Across hosts the cost model runs on the inter-host link's figures from
 * one short probe, and where its estimates of two algorithms are close
 * the faster one can differ from job to job (2 x 2 ranks over veth,
 * allreduce of 256K: the table took shared, estimated 98 us, which
 * measured 206 against halving-doubling's 178 in nine jobs).  So in a
 * job of several hosts, the first blocking calls of each collective at
 * each size of the table's grid (1, 2, 3, 4, 6, 8, 12... bytes: a call
 * counts at the grid size at or below its own), in place or not, take turns over the
 * algorithms whose estimates are within LOOMI_TUNE_SPREAD of the
 * table's choice, each timed LOOMI_TUNE_TRIALS times on every rank.
 * Then one allreduce (maximum over the ranks of each algorithm's best
 * time per byte: integers, so that every rank reads the same bytes)
 * decides, and that size keeps the fastest from then on, the table's
 * choice unless another beat it by LOOMI_TUNE_MARGIN.
 *
 * Every rank must take the same turns, so it counts calls, not time:
 * the ranks of a communicator call its collectives in the same order,
 * in the same form.  Non-blocking calls and group members are not
 * timed; until the size is decided they run the table's choice.  On one
 * host the model's figures are its own measurements of memory, and
 * nothing is tuned.  LOOM_AUTOTUNE=0 turns this off.
 */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/comm.h"
#include "core/internal.h"
#include "topo/select.h"

/* The grid of the selection table (build_ranges in select.c): index k
 * is 1 << k/2 for even k, 3 << (k/2 - 1) for odd k > 1; k 1 is unused. */
int loomi_tune_bucket(size_t bytes, size_t *grid)
{
    int k = 0;
    size_t g = 1;
    if (bytes >= 2) {
        int e = 0;
        while (e < 30 && ((size_t)2 << e) <= bytes) e++;
        k = 2 * e;
        g = (size_t)1 << e;
        if (e >= 1 && e < 30 && bytes >= ((size_t)3 << (e - 1))) {
            k++;
            g = (size_t)3 << (e - 1);
        }
    }
    if (grid) *grid = g;
    return k;
}

int loomi_tune_decide(const uint64_t *ps_per_byte, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (ps_per_byte[i] && (!ps_per_byte[best] || ps_per_byte[i] < ps_per_byte[best]))
            best = i;
    /* The table's choice (0) stays unless beaten by the margin. */
    if (best && ps_per_byte[0] &&
        (double)ps_per_byte[best] >= LOOMI_TUNE_MARGIN * (double)ps_per_byte[0])
        best = 0;
    return best;
}

struct loomi_tune_slot {
    int used;
    int coll, mode, ip, k; /* mode: LOOMI_WINDOW_*, or 0 */
    size_t grid; /* bytes of grid point k */
    int ncand, calls, decided, pick; /* pick: index into cand */
    int cand[LOOMI_TUNE_CANDS];
    uint64_t best[LOOMI_TUNE_CANDS]; /* picoseconds per byte, 0: none yet */
};

struct loomi_tuner {
    struct loomi_tune_slot s[LOOMI_TUNE_SLOTS];
};

void loomi_tuner_free(struct loomi_tuner *t) { free(t); }

static int eligible(const struct loom_comm *c, int coll, size_t bytes)
{
    /* Alltoallv's ranks move different sizes, barrier none: no figure. */
    return bytes && coll != LOOMI_COLL_ALLTOALLV && c->set.autotune && !c->tune_busy && c->sel && c->links && c->hosts &&
           c->hosts->nhosts > 1 && c->algo_forced[coll] == LOOMI_ALGO_AUTO;
}

static struct loomi_tune_slot *slot_for(struct loom_comm *c, int coll, int mode, int ip,
                                        size_t bytes)
{
    size_t grid;
    int k = loomi_tune_bucket(bytes, &grid);
    if (!c->tuner && !(c->tuner = calloc(1, sizeof *c->tuner))) return NULL;
    struct loomi_tune_slot *free_slot = NULL;
    for (int i = 0; i < LOOMI_TUNE_SLOTS; i++) {
        struct loomi_tune_slot *s = &c->tuner->s[i];
        if (!s->used) {
            if (!free_slot) free_slot = s;
            continue;
        }
        if (s->coll == coll && s->mode == mode && s->ip == ip && s->k == k) return s;
    }
    /* Full: that size keeps the table's choice (every rank sees the same
     * sizes in the same order, so they all run out alike). */
    if (!free_slot) return NULL;
    struct loomi_tune_slot *s = free_slot;
    memset(s, 0, sizeof *s);
    s->used = 1;
    s->coll = coll;
    s->mode = mode;
    s->ip = ip;
    s->k = k;
    s->grid = grid;
    struct loomi_job_shape j;
    loomi_comm_shape(c, &j);
    j.window = mode;
    s->ncand = loomi_select_candidates(coll, grid, &j, c->links, LOOMI_TUNE_SPREAD, s->cand, NULL,
                                       LOOMI_TUNE_CANDS);
    /* The table's own choice first: its ranges are built at these grid
     * sizes by the same function, so this only guards a change there. */
    int table = loomi_algo_for(c, coll, grid, ip);
    if (s->ncand < 1 || s->cand[0] != table) {
        s->ncand = 1;
        s->cand[0] = table;
    }
    s->decided = s->ncand < 2;
    return s;
}

int loomi_tune_pick(struct loom_comm *c, int coll, size_t bytes, int inplace, int timed,
                    struct loomi_tune_slot **out)
{
    *out = NULL;
    int mode = 0;
    if (coll == LOOMI_COLL_ALLREDUCE && c->win_shared)
        mode = inplace ? LOOMI_WINDOW_IN : LOOMI_WINDOW_OUT;
    if (!eligible(c, coll, bytes)) return loomi_algo_for(c, coll, bytes, inplace);
    struct loomi_tune_slot *s = slot_for(c, coll, mode, inplace != 0, bytes);
    if (!s) return loomi_algo_for(c, coll, bytes, inplace);
    if (s->decided) return s->cand[s->pick];
    if (!timed) return s->cand[0];
    *out = s;
    return s->cand[s->calls % s->ncand];
}

void loomi_tune_record(struct loom_comm *c, struct loomi_tune_slot *s, size_t bytes,
                       uint64_t ns)
{
    if (!s || s->decided || !bytes) return;
    const int i = s->calls % s->ncand;
    uint64_t v = ns * 1000u / bytes;
    if (!v) v = 1;
    if (!s->best[i] || v < s->best[i]) s->best[i] = v;
    if (++s->calls < s->ncand * LOOMI_TUNE_TRIALS) return;
    /* Every rank is here after the same call: agree on the slowest
     * rank's figures.  If that fails (a peer failed: the next call
     * reports it), this rank keeps the table's choice. */
    uint64_t v_all[LOOMI_TUNE_CANDS];
    memcpy(v_all, s->best, sizeof v_all);
    s->decided = 1;
    s->pick = 0;
    c->tune_busy = 1;
    loom_result_t r = loom_allreduce(v_all, v_all, (size_t)s->ncand, LOOM_UINT64, LOOM_MAX, c);
    c->tune_busy = 0;
    if (r != LOOM_SUCCESS) {
        loomi_clear_error();
        return;
    }
    s->pick = loomi_tune_decide(v_all, s->ncand);
    char line[160];
    int used = 0;
    for (int q = 0; q < s->ncand && used < (int)sizeof line; q++)
        used += snprintf(line + used, sizeof line - (size_t)used, "%s%s %.3f", q ? ", " : "",
                         loomi_algo_name(s->cand[q]), (double)v_all[q] / 1000.0);
    LOOMI_INFO(c->rank, "tuned %s from %zu bytes%s%s: %s (ns/B: %s)",
               loomi_coll_name(s->coll), s->grid, s->mode ? ", windows" : "",
               s->ip ? ", in place" : "", loomi_algo_name(s->cand[s->pick]), line);
}
