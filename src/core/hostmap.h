/*
 * hostmap.h - which ranks share a host: what algorithms need of the
 * topology.  Built from the job's topology (topo.h) for real
 * communicators, or set by tests for sim communicators.
 */
#ifndef LOOMI_HOSTMAP_H
#define LOOMI_HOSTMAP_H

struct loomi_hostmap {
    int nranks, nhosts;
    const int *host_of;     /* [nranks]: host index, hosts numbered by their lowest rank */
    const int *local_index; /* [nranks]: position among its host's ranks (ascending rank) */
    const int *host_start;  /* [nhosts+1]: CSR offsets into host_ranks */
    const int *host_ranks;  /* ranks of host h: host_ranks[host_start[h] .. host_start[h+1]) */
};

/* Number of ranks on host h. */
static inline int loomi_host_size(const struct loomi_hostmap *m, int h)
{
    return m->host_start[h + 1] - m->host_start[h];
}

/* Every host has the same number of ranks. */
static inline int loomi_hostmap_uniform(const struct loomi_hostmap *m)
{
    for (int h = 1; h < m->nhosts; h++)
        if (loomi_host_size(m, h) != loomi_host_size(m, 0)) return 0;
    return 1;
}

/* Every host holds a run of consecutive ranks (hosts are numbered by
 * lowest rank, so host h's run follows host h-1's). */
static inline int loomi_hostmap_runs(const struct loomi_hostmap *m)
{
    for (int r = 1; r < m->nranks; r++)
        if (m->host_of[r] != m->host_of[r - 1] && m->host_of[r] != m->host_of[r - 1] + 1)
            return 0;
    return 1;
}

/* A heap copy of the map for host_of[] (nranks entries, host numbers
 * arbitrary): hosts are renumbered by lowest rank.  Free with free(). */
struct loomi_hostmap *loomi_hostmap_build(int nranks, const int *host_of);

#endif
