/*
 * topo.h - what each host looks like (hwloc) and where every rank of the
 * job sits.
 *
 * Each rank discovers its own host (hwloc: the live machine, or the XML
 * in LOOM_TOPO_FILE) and its own binding, packs both into a fixed-size
 * card, and the cards are exchanged at bootstrap.  From the same cards
 * every rank then computes the same job picture: hosts, ranks per host,
 * and for each rank its NUMA node, GPU and the NIC it should use.
 */
#ifndef LOOMI_TOPO_H
#define LOOMI_TOPO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/internal.h"
#include "core/hostmap.h"

#define LOOMI_TOPO_MAX_NICS 8
#define LOOMI_TOPO_MAX_GPUS 16
#define LOOMI_TOPO_NAME 32
/* Size of a packed card (bytes on the wire; part of the bootstrap address). */
#define LOOMI_TOPO_CARD_BYTES 384

struct loomi_topo_dev {
    char name[LOOMI_TOPO_NAME]; /* OS name: "eth0", "mlx5_0", "cuda0", "card1" ... */
    char busid[16];             /* PCI "0000:3b:00.0", "" when unknown */
    int16_t numa;               /* closest NUMA node (host-local index), -1 unknown */
    int16_t package;            /* closest package, -1 unknown */
    uint32_t speed_mbps;        /* NICs: link speed where known, else 0 */
};

/* One host as hwloc describes it (the same on every rank of that host). */
struct loomi_topo_host {
    char name[64];  /* host identity: LOOM_HOSTNAME, else the hostname */
    uint64_t id;    /* hash of name and boot id: equal iff same host */
    uint64_t machine; /* hash of the boot id alone, 0 unknown: equal on ranks
                       * that share a kernel and its cores, even when
                       * LOOM_HOSTNAME makes them different hosts */
    int npackages, nnuma, ncores, npus;
    size_t l3_bytes;        /* largest last-level cache, 0 unknown */
    uint64_t mem_bytes;     /* total memory, 0 unknown */
    int nnics, ngpus;
    struct loomi_topo_dev nics[LOOMI_TOPO_MAX_NICS];
    struct loomi_topo_dev gpus[LOOMI_TOPO_MAX_GPUS];
    char source[16];        /* "hwloc", "xml", "fallback" */
};

/* One rank: its host and its place on it. */
struct loomi_topo_rank {
    struct loomi_topo_host host;
    int32_t pid;
    int16_t bound;          /* 1: its affinity is a strict subset of the host */
    int16_t numa;           /* NUMA node of its binding, -1 when unbound/unknown */
    int16_t first_pu, npus; /* binding (OS indices), npus 0 unknown */
    /* Filled by loomi_topo_job_build: */
    int16_t gpu;            /* index into host.gpus, -1 none */
    int16_t nic;            /* index into host.nics, -1 none */
    int16_t nic_open;       /* 1: nic is the device its RDMA transport opened
                             * (set before packing; carried in the card) */
};

struct loomi_topo_job {
    int nranks;
    struct loomi_topo_rank *ranks; /* [nranks] */
    struct loomi_hostmap *map;     /* same hosts, as algorithms see them */
};

/* Discover this process's host and binding.  Honours set->topo_file
 * (hwloc XML; then the binding is taken as unbound) and set->hostname.
 * Falls back to sysconf() counts, logging why, when hwloc fails. */
loom_result_t loomi_topo_discover(const struct loomi_settings *set, int rank,
                                  struct loomi_topo_rank *me);

/* How many ranks of the job run on `rank`'s machine (its kernel and
 * cores): those with its machine id, or without one its host. */
int loomi_topo_machine_ranks(const struct loomi_topo_job *job, int rank);
/* The most ranks of the job on any one machine, as counted above; 0 when
 * out of memory (unknown). */
int loomi_topo_most_machine_ranks(const struct loomi_topo_job *job);

/* Fixed-size, endian-neutral encoding (LOOMI_TOPO_CARD_BYTES). */
void loomi_topo_pack(const struct loomi_topo_rank *r, unsigned char *card);
/* Range-checks everything (counts, indices, NUL-terminated names);
 * LOOM_ERR_MISMATCH with a message naming the field when bad. */
loom_result_t loomi_topo_unpack(const unsigned char *card, struct loomi_topo_rank *r);

/* From every rank's card (rank order), the job picture, identical on
 * every rank: host map; per rank its NUMA node (its binding, or placed
 * round-robin over the host's NUMA nodes by local index when unbound),
 * GPU (local index mod ngpus) and NIC (closest to its GPU, else to its
 * NUMA node; ties spread by local index).  Takes ownership of nothing. */
loom_result_t loomi_topo_job_build(const struct loomi_topo_rank *ranks, int nranks,
                                   struct loomi_topo_job *job);
/* A rank's NIC before the cards are exchanged (the RDMA device to open):
 * job_build's choice for local index li of n, the other local ranks
 * taken as unbound (exact on hosts with GPUs); li < 0 when unknown: a
 * NIC next to the rank's binding, or -1.  A card whose nic is set (the
 * NIC in use) keeps it in job_build. */
int loomi_topo_local_nic(const struct loomi_topo_rank *me, int li, int n);
void loomi_topo_job_free(struct loomi_topo_job *job);

/* Human-readable picture (loom-info): hosts, their hardware, ranks with
 * NUMA/GPU/NIC. */
void loomi_topo_print(FILE *f, const struct loomi_topo_job *job);

#endif
