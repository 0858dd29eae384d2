/*
 * test_topo.c - topology: discovery of the XML fixtures (tests/topo) and
 * of this machine, the card encoding and its checks, and the job picture
 * (hosts, and each rank's NUMA node, GPU and NIC).
 *
 * Fixtures (see tests/topo/README):
 *   dgx_2s8g4n.xml: 2 packages x 1 NUMA node, 32 cores x 2 PUs each; per
 *     package two PCIe switches, each with 2 GPUs (cuda/nvml) and one NIC
 *     (mlx5_N + netdev), so GPUs 2k and 2k+1 sit next to NIC k; plus a BMC
 *     VGA ("card0") that is not a compute GPU.
 *   cpu_8numa.xml: 2 packages x 4 NUMA nodes, 8 cores x 2 PUs per node;
 *     mlx5_0 on NUMA 0, ens5f0 on NUMA 4, the BMC VGA, no GPUs.
 *   h200_vm.xml: hwloc's export of a 16-core VM whose one GPU (an H200)
 *     has no OS device below its PCI device.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "topo/topo.h"

static void quiet(void)
{
    /* Error paths are exercised on purpose; keep the log clean. */
    setenv("LOOM_DEBUG", "none", 1);
}

TestSuite(topo, .init = quiet);

/* Path of a fixture: $SRCDIR (make check) or the source tree this file
 * was compiled from. */
static void fixture(const char *name, char *out, size_t n)
{
    const char *src = getenv("SRCDIR");
    if (src && src[0]) {
        snprintf(out, n, "%s/tests/topo/%s", src, name);
        return;
    }
    const char *me = __FILE__, *cut = strstr(me, "tests/unit/test_topo.c");
    if (me[0] == '/' && cut) {
        snprintf(out, n, "%.*stests/topo/%s", (int)(cut - me), me, name);
        return;
    }
    cr_skip_test("SRCDIR is not set: cannot find the fixtures");
}

static struct loomi_topo_rank load(const char *name, const char *host)
{
    struct loomi_settings set;
    memset(&set, 0, sizeof set);
    fixture(name, set.topo_file, sizeof set.topo_file);
    if (host) snprintf(set.hostname, sizeof set.hostname, "%s", host);
    struct loomi_topo_rank r;
    loom_result_t rc = loomi_topo_discover(&set, 0, &r);
    cr_assert_eq(rc, LOOM_SUCCESS, "discover %s: %s", set.topo_file, loom_get_last_error());
    return r;
}

/* ---------------------------------------------------------- discovery */

/* A device's name, PCI address, NUMA node and package. */
static void expect_dev(const struct loomi_topo_dev *d, const char *name, const char *busid,
                       int numa, int package)
{
    cr_expect_str_eq(d->name, name);
    cr_expect_str_eq(d->busid, busid, "%s busid", name);
    cr_expect_eq(d->numa, numa, "%s numa", name);
    cr_expect_eq(d->package, package, "%s package", name);
}

Test(topo, discover_dgx)
{
    struct loomi_topo_rank r = load("dgx_2s8g4n.xml", "dgx-a");
    const struct loomi_topo_host *h = &r.host;
    cr_expect_str_eq(h->name, "dgx-a");
    cr_expect_str_eq(h->source, "xml");
    cr_expect_eq(h->npackages, 2);
    cr_expect_eq(h->nnuma, 2);
    cr_expect_eq(h->ncores, 64);
    cr_expect_eq(h->npus, 128);
    cr_expect_eq(h->l3_bytes, (size_t)105 << 20);
    cr_expect_eq(h->mem_bytes, (uint64_t)1 << 40);
    /* The BMC's VGA is not a GPU. */
    cr_assert_eq(h->ngpus, 8);
    for (int i = 0; i < 8; i++) {
        char name[16];
        snprintf(name, sizeof name, "cuda%d", i);
        cr_expect_str_eq(h->gpus[i].name, name, "gpu %d", i);
        cr_expect_eq(h->gpus[i].numa, i / 4, "gpu %d numa", i);
        cr_expect_eq(h->gpus[i].package, i / 4, "gpu %d package", i);
    }
    cr_expect_str_eq(h->gpus[0].busid, "0000:12:00.0");
    cr_expect_str_eq(h->gpus[7].busid, "0000:b3:00.0");
    /* One NIC per PCI device, under its verbs name. */
    cr_assert_eq(h->nnics, 4);
    for (int i = 0; i < 4; i++) {
        char name[16];
        snprintf(name, sizeof name, "mlx5_%d", i);
        cr_expect_str_eq(h->nics[i].name, name, "nic %d", i);
        cr_expect_eq(h->nics[i].numa, i / 2, "nic %d numa", i);
        cr_expect_eq(h->nics[i].package, i / 2, "nic %d package", i);
        cr_expect_eq(h->nics[i].speed_mbps, 0u);
    }
    cr_expect_str_eq(h->nics[0].busid, "0000:14:00.0");
    cr_expect_str_eq(h->nics[3].busid, "0000:b4:00.0");
    /* A file describes another machine: this process's binding does not apply. */
    cr_expect_eq(r.bound, 0);
    cr_expect_eq(r.numa, -1);
    cr_expect_eq(r.npus, 0);
    cr_expect_eq(r.pid, (int32_t)getpid());
}

Test(topo, discover_cpu_8numa)
{
    struct loomi_topo_rank r = load("cpu_8numa.xml", "cpu-a");
    const struct loomi_topo_host *h = &r.host;
    cr_expect_eq(h->npackages, 2);
    cr_expect_eq(h->nnuma, 8);
    cr_expect_eq(h->ncores, 64);
    cr_expect_eq(h->npus, 128);
    cr_expect_eq(h->l3_bytes, (size_t)32 << 20);
    cr_expect_eq(h->mem_bytes, (uint64_t)512 << 30);
    cr_expect_eq(h->ngpus, 0);
    cr_assert_eq(h->nnics, 2);
    expect_dev(&h->nics[0], "mlx5_0", "0000:21:00.0", 0, 0);
    expect_dev(&h->nics[1], "ens5f0", "0000:81:00.0", 4, 1);
}

/* A GPU known only as a PCI device (no DRM card; the OpenCL plugin's
 * device is not below it) is found, and named by its PCI ids. */
Test(topo, discover_gpu_without_os_device)
{
    struct loomi_topo_rank r = load("h200_vm.xml", "vm-a");
    const struct loomi_topo_host *h = &r.host;
    cr_expect_eq(h->npackages, 1);
    cr_expect_eq(h->nnuma, 1);
    cr_expect_eq(h->ncores, 16);
    cr_assert_eq(h->ngpus, 1);
    expect_dev(&h->gpus[0], "10de:2335", "0000:00:06.0", 0, 0);
    cr_assert_eq(h->nnics, 1);
    cr_expect_str_eq(h->nics[0].name, "eth0");
}

Test(topo, discover_missing_file)
{
    struct loomi_settings set;
    memset(&set, 0, sizeof set);
    snprintf(set.topo_file, sizeof set.topo_file, "/nonexistent/loom-topo.xml");
    struct loomi_topo_rank r;
    cr_assert_eq(loomi_topo_discover(&set, 3, &r), LOOM_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(loom_get_last_error(), "LOOM_TOPO_FILE /nonexistent/loom-topo.xml"),
              "message: %s", loom_get_last_error());
}

Test(topo, discover_unparseable_file)
{
    char path[] = "/tmp/loom-topo-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    const char junk[] = "<?xml version=\"1.0\"?>\n<topology version=\"2.0\"><object type=";
    cr_assert_eq(write(fd, junk, sizeof junk - 1), (ssize_t)(sizeof junk - 1));
    close(fd);
    struct loomi_settings set;
    memset(&set, 0, sizeof set);
    snprintf(set.topo_file, sizeof set.topo_file, "%s", path);
    struct loomi_topo_rank r;
    loom_result_t rc = loomi_topo_discover(&set, 0, &r);
    unlink(path);
    cr_assert_eq(rc, LOOM_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(loom_get_last_error(), path), "message: %s", loom_get_last_error());
}

Test(topo, discover_live)
{
    struct loomi_settings set;
    memset(&set, 0, sizeof set);
    struct loomi_topo_rank r;
    cr_assert_eq(loomi_topo_discover(&set, 0, &r), LOOM_SUCCESS, "%s", loom_get_last_error());
    const struct loomi_topo_host *h = &r.host;
    cr_expect(strcmp(h->source, "hwloc") == 0 || strcmp(h->source, "fallback") == 0, "%s",
              h->source);
    cr_expect(h->name[0]);
    cr_expect_geq(h->npackages, 1);
    cr_expect_geq(h->nnuma, 1);
    cr_expect_geq(h->ncores, 1);
    cr_expect_geq(h->npus, h->ncores);
    cr_expect_gt(h->mem_bytes, 0u);
    cr_expect_eq(r.pid, (int32_t)getpid());
    cr_expect_gt(r.npus, 0, "the binding is readable");
    cr_expect_leq(r.npus, h->npus);
    cr_expect(r.numa >= -1 && r.numa < h->nnuma);
    for (int i = 0; i < h->nnics; i++) cr_expect(h->nics[i].numa >= -1 && h->nics[i].numa < h->nnuma);
    /* Its own card goes through the checks. */
    unsigned char card[LOOMI_TOPO_CARD_BYTES];
    struct loomi_topo_rank back;
    loomi_topo_pack(&r, card);
    cr_expect_eq(loomi_topo_unpack(card, &back), LOOM_SUCCESS, "%s", loom_get_last_error());
    cr_expect_eq(back.host.id, h->id);
    cr_expect_eq(back.host.nnics, h->nnics);
    cr_expect_eq(back.host.ngpus, h->ngpus);
}

Test(topo, host_identity)
{
    struct loomi_topo_rank a1 = load("dgx_2s8g4n.xml", "node-a");
    struct loomi_topo_rank a2 = load("dgx_2s8g4n.xml", "node-a");
    struct loomi_topo_rank b = load("dgx_2s8g4n.xml", "node-b");
    cr_expect_eq(a1.host.id, a2.host.id);
    cr_expect_neq(a1.host.id, b.host.id);
    /* Hosts faked with LOOM_HOSTNAME still share this machine. */
    cr_expect_eq(a1.host.machine, b.host.machine);
    if (access("/proc/sys/kernel/random/boot_id", R_OK) == 0) cr_expect_neq(b.host.machine, 0u);
    /* The real identity (no override) is stable too. */
    struct loomi_settings set;
    memset(&set, 0, sizeof set);
    struct loomi_topo_rank l1, l2;
    cr_assert_eq(loomi_topo_discover(&set, 0, &l1), LOOM_SUCCESS);
    cr_assert_eq(loomi_topo_discover(&set, 0, &l2), LOOM_SUCCESS);
    cr_expect_eq(l1.host.id, l2.host.id);
}

/* ------------------------------------------------------------- cards */

static void expect_same_dev(const struct loomi_topo_dev *a, const struct loomi_topo_dev *b)
{
    cr_expect_str_eq(a->name, b->name);
    cr_expect_str_eq(a->busid, b->busid);
    cr_expect_eq(a->numa, b->numa);
    cr_expect_eq(a->package, b->package);
    cr_expect_eq(a->speed_mbps, b->speed_mbps);
}

static void expect_same(const struct loomi_topo_rank *a, const struct loomi_topo_rank *b)
{
    const struct loomi_topo_host *x = &a->host, *y = &b->host;
    cr_expect_str_eq(x->name, y->name);
    cr_expect_eq(x->id, y->id);
    cr_expect_eq(x->machine, y->machine);
    cr_expect_eq(x->npackages, y->npackages);
    cr_expect_eq(x->nnuma, y->nnuma);
    cr_expect_eq(x->ncores, y->ncores);
    cr_expect_eq(x->npus, y->npus);
    cr_expect_eq(x->l3_bytes, y->l3_bytes);
    cr_expect_eq(x->mem_bytes, y->mem_bytes);
    cr_expect_str_eq(x->source, y->source);
    cr_assert_eq(x->nnics, y->nnics);
    cr_assert_eq(x->ngpus, y->ngpus);
    for (int i = 0; i < x->nnics; i++) expect_same_dev(&x->nics[i], &y->nics[i]);
    for (int i = 0; i < x->ngpus; i++) expect_same_dev(&x->gpus[i], &y->gpus[i]);
    cr_expect_eq(a->pid, b->pid);
    cr_expect_eq(a->bound, b->bound);
    cr_expect_eq(a->numa, b->numa);
    cr_expect_eq(a->first_pu, b->first_pu);
    cr_expect_eq(a->npus, b->npus);
}

Test(topo, card_round_trip)
{
    struct loomi_topo_rank r = load("dgx_2s8g4n.xml", "a-rather-long-host-name.cluster.example.org");
    r.bound = 1;
    r.numa = 1;
    r.first_pu = 64;
    r.npus = 16;
    r.host.nics[2].speed_mbps = 400000; /* as a live machine would say */
    r.host.machine = 0x8877665544332211ull;
    unsigned char card[LOOMI_TOPO_CARD_BYTES];
    struct loomi_topo_rank back;
    loomi_topo_pack(&r, card);
    cr_assert_eq(loomi_topo_unpack(card, &back), LOOM_SUCCESS, "%s", loom_get_last_error());
    expect_same(&r, &back);
    cr_expect_eq(back.gpu, -1);
    cr_expect_eq(back.nic, -1);

    r = load("cpu_8numa.xml", "c");
    loomi_topo_pack(&r, card);
    cr_assert_eq(loomi_topo_unpack(card, &back), LOOM_SUCCESS, "%s", loom_get_last_error());
    expect_same(&r, &back);
}

Test(topo, card_is_bounded)
{
    /* More devices with longer names than a card holds: a subset travels,
     * and it still passes the checks. */
    struct loomi_topo_rank r = load("dgx_2s8g4n.xml", "big");
    r.host.ngpus = LOOMI_TOPO_MAX_GPUS;
    r.host.nnics = LOOMI_TOPO_MAX_NICS;
    for (int i = 0; i < LOOMI_TOPO_MAX_GPUS; i++) {
        snprintf(r.host.gpus[i].name, LOOMI_TOPO_NAME, "gpu-with-a-long-name-%02d", i);
        r.host.gpus[i].numa = (int16_t)(i % 2);
        r.host.gpus[i].package = (int16_t)(i % 2);
    }
    for (int i = 0; i < LOOMI_TOPO_MAX_NICS; i++) {
        snprintf(r.host.nics[i].name, LOOMI_TOPO_NAME, "enp%ds0f0np0", 100 + i);
        r.host.nics[i].numa = -1;
        r.host.nics[i].package = -1;
    }
    unsigned char card[LOOMI_TOPO_CARD_BYTES];
    struct loomi_topo_rank back;
    loomi_topo_pack(&r, card);
    cr_assert_eq(loomi_topo_unpack(card, &back), LOOM_SUCCESS, "%s", loom_get_last_error());
    cr_expect_geq(back.host.nnics, 4);
    cr_expect_geq(back.host.ngpus, 4);
    cr_expect(back.host.nnics < LOOMI_TOPO_MAX_NICS || back.host.ngpus < LOOMI_TOPO_MAX_GPUS);
    for (int i = 0; i < back.host.ngpus; i++) cr_expect_str_eq(back.host.gpus[i].name, r.host.gpus[i].name);
}

/* Unpacking a corrupted card fails with MISMATCH and names the field. */
static void expect_rejected(const unsigned char *card, const char *field)
{
    struct loomi_topo_rank back;
    cr_expect_eq(loomi_topo_unpack(card, &back), LOOM_ERR_MISMATCH, "corrupt %s accepted", field);
    cr_expect(strstr(loom_get_last_error(), field), "%s: message %s", field, loom_get_last_error());
}

Test(topo, card_rejects_corruption)
{
    struct loomi_topo_rank r = load("dgx_2s8g4n.xml", "h");
    unsigned char good[LOOMI_TOPO_CARD_BYTES], c[LOOMI_TOPO_CARD_BYTES];
    loomi_topo_pack(&r, good);
    struct loomi_topo_rank back;
    cr_assert_eq(loomi_topo_unpack(good, &back), LOOM_SUCCESS);

    memcpy(c, good, sizeof c);
    c[0] ^= 0xff;
    expect_rejected(c, "magic");

    memcpy(c, good, sizeof c);
    c[4] = 99;
    expect_rejected(c, "version");

    memcpy(c, good, sizeof c);
    c[6] = LOOMI_TOPO_MAX_NICS + 1;
    expect_rejected(c, "nnics");

    memcpy(c, good, sizeof c);
    c[7] = LOOMI_TOPO_MAX_GPUS + 1;
    expect_rejected(c, "ngpus");

    memcpy(c, good, sizeof c);
    c[18] = 0; /* nnuma = 0 */
    expect_rejected(c, "nnuma");

    memcpy(c, good, sizeof c);
    c[58] = 2; /* the rank's NUMA node: 2 of 2 */
    expect_rejected(c, "numa");

    memcpy(c, good, sizeof c);
    c[57] = 5; /* the NIC in use, + 1: the fifth of 4 */
    expect_rejected(c, "nic in use");

    /* Host name: offset 64, "h" then NUL; make it run to the end. */
    memcpy(c, good, sizeof c);
    memset(c + 64, 'x', sizeof c - 64);
    expect_rejected(c, "host name");

    /* First NIC: busid (6 bytes), numa, package, speed, name. */
    size_t nic0 = 64 + 2;
    memcpy(c, good, sizeof c);
    c[nic0 + 6] = 2;
    expect_rejected(c, "nic 0 numa");
    memcpy(c, good, sizeof c);
    c[nic0 + 7] = 0x80; /* package -128 */
    expect_rejected(c, "nic 0 package");
    memcpy(c, good, sizeof c);
    memset(c + nic0 + 12, 'n', 40); /* "mlx5_0" loses its NUL within the name's 32 bytes */
    expect_rejected(c, "nic 0 name");

    /* Bytes after the last device. */
    memcpy(c, good, sizeof c);
    c[LOOMI_TOPO_CARD_BYTES - 1] = 1;
    expect_rejected(c, "trailing");
}

/* ---------------------------------------------------------------- jobs */

/* What loom-info prints of the job (free it). */
static char *picture(const struct loomi_topo_job *job)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert(f);
    loomi_topo_print(f, job);
    fclose(f);
    return text;
}

/* n ranks on one host that `fixture` describes; *a gets that host's card. */
static void one_host_job(const char *fixture, int n, struct loomi_topo_rank *a,
                         struct loomi_topo_job *job)
{
    *a = load(fixture, "one");
    struct loomi_topo_rank *ranks = malloc((size_t)n * sizeof *ranks);
    cr_assert_not_null(ranks);
    for (int r = 0; r < n; r++) ranks[r] = *a;
    cr_assert_eq(loomi_topo_job_build(ranks, n, job), LOOM_SUCCESS);
    free(ranks);
    cr_assert_eq(job->map->nhosts, 1);
}

/* 2 dgx hosts x 8 ranks, interleaved: rank r on host r % 2. */
Test(topo, job_dgx_two_hosts)
{
    struct loomi_topo_rank a = load("dgx_2s8g4n.xml", "dgx-a");
    struct loomi_topo_rank b = load("dgx_2s8g4n.xml", "dgx-b");
    cr_assert_neq(a.host.id, b.host.id);
    struct loomi_topo_rank ranks[16];
    for (int r = 0; r < 16; r++) {
        ranks[r] = r % 2 ? b : a;
        ranks[r].pid = 1000 + r;
    }
    struct loomi_topo_job job;
    cr_assert_eq(loomi_topo_job_build(ranks, 16, &job), LOOM_SUCCESS, "%s", loom_get_last_error());
    cr_assert_eq(job.nranks, 16);
    cr_assert_eq(job.map->nhosts, 2);
    /* Faked on one machine, both hosts' ranks share its cores... */
    cr_expect_eq(loomi_topo_machine_ranks(&job, 3), a.host.machine ? 16 : 8);
    cr_expect_eq(loomi_topo_most_machine_ranks(&job), a.host.machine ? 16 : 8);
    /* ...and on two machines, or with no machine id, each host's alone. */
    for (int r = 0; r < 16; r++) job.ranks[r].host.machine = r % 2 ? 7 : 0;
    cr_expect_eq(loomi_topo_machine_ranks(&job, 3), 8);
    cr_expect_eq(loomi_topo_machine_ranks(&job, 2), 8);
    cr_expect_eq(loomi_topo_most_machine_ranks(&job), 8);
    /* Three ranks of host a moved onto machine 7: 11 there. */
    for (int r = 0; r < 6; r += 2) job.ranks[r].host.machine = 7;
    cr_expect_eq(loomi_topo_most_machine_ranks(&job), 11);
    for (int r = 0; r < 6; r += 2) job.ranks[r].host.machine = 0;
    int nic_users[2][4] = {{0}};
    for (int r = 0; r < 16; r++) {
        const struct loomi_topo_rank *p = &job.ranks[r];
        int h = job.map->host_of[r], li = job.map->local_index[r];
        cr_expect_eq(h, r % 2);
        cr_expect_eq(li, r / 2);
        cr_expect_eq(p->pid, 1000 + r);
        cr_expect_eq(p->gpu, li, "rank %d gpu", r);
        cr_assert(p->nic >= 0 && p->nic < 4, "rank %d nic %d", r, p->nic);
        cr_expect_eq(p->host.nics[p->nic].numa, p->host.gpus[p->gpu].numa, "rank %d", r);
        /* GPUs 2k, 2k+1 share a PCIe switch with NIC k. */
        cr_expect_eq(p->nic, li / 2, "rank %d", r);
        cr_expect_eq(p->numa, li / 4, "rank %d numa", r);
        nic_users[h][p->nic]++;
    }
    for (int h = 0; h < 2; h++)
        for (int n = 0; n < 4; n++) cr_expect_eq(nic_users[h][n], 2, "host %d nic %d", h, n);

    /* The picture is stable and says what it found. */
    char *text = picture(&job);
    cr_expect(strstr(text, "16 ranks on 2 hosts"), "%s", text);
    cr_expect(strstr(text, "host 0: dgx-a (xml"), "%s", text);
    cr_expect(strstr(text, "2 packages, 2 NUMA, 64 cores, 128 PUs, L3 105 MiB, memory 1 TiB, "
                           "4 NICs, 8 GPUs, 8 ranks"), "%s", text);
    cr_expect(strstr(text, "  nic 3: mlx5_3 0000:b4:00.0 numa 1 package 1"), "%s", text);
    cr_expect(strstr(text, "  gpu 5: cuda5 0000:93:00.0 numa 1 package 1"), "%s", text);
    cr_expect(strstr(text, "  rank 11: local 5 pid 1011 numa 1 gpu 5 (cuda5) nic 2 (mlx5_2) unbound"),
              "%s", text);
    free(text);
    loomi_topo_job_free(&job);
    cr_expect_null(job.ranks);
}

/* Before the exchange a rank knows its local index, not its neighbours'
 * bindings: on a GPU host its NIC is still the one the job picture gives
 * it, so the device RDMA opens is the one loom-info shows. */
Test(topo, local_nic_matches_the_job_picture)
{
    struct loomi_topo_rank a;
    struct loomi_topo_job job;
    one_host_job("dgx_2s8g4n.xml", 8, &a, &job);
    for (int li = 0; li < 8; li++) {
        cr_expect_eq(loomi_topo_local_nic(&a, li, 8), job.ranks[li].nic, "local %d", li);
        cr_expect_eq(loomi_topo_local_nic(&a, li, 8), li / 2, "local %d", li);
    }
    loomi_topo_job_free(&job);
    /* Sixteen ranks on 8 GPUs: ranks li and li + 8 share GPU li's NIC. */
    cr_expect_eq(loomi_topo_local_nic(&a, 13, 16), 2);
    /* No local index: a NIC on the node it is bound to, else none. */
    cr_expect_eq(loomi_topo_local_nic(&a, -1, 0), -1);
    a.bound = 1;
    a.numa = 1;
    a.first_pu = 32;
    a.npus = 4;
    int nic = loomi_topo_local_nic(&a, -1, 0);
    cr_assert(nic >= 0, "bound to NUMA 1: no NIC");
    cr_expect_eq(a.host.nics[nic].numa, 1, "bound to NUMA 1: nic %d", nic);
    /* No NICs at all. */
    a.host.nnics = 0;
    cr_expect_eq(loomi_topo_local_nic(&a, 0, 8), -1);
}

/* The local index comes from the launcher: loomrun's, torchrun's or Open
 * MPI's variables, in that order; a malformed pair is skipped. */
Test(topo, local_rank_from_the_launcher)
{
    static const char *const vars[] = {"LOOM_LOCAL_RANK", "LOOM_LOCAL_SIZE", "LOCAL_RANK",
                                       "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "OMPI_COMM_WORLD_LOCAL_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
    int li, n;
    loomi_env_local_rank(0, &li, &n);
    cr_expect(li == -1 && n == 0, "nothing set: %d of %d", li, n);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "8", 1);
    loomi_env_local_rank(0, &li, &n);
    cr_expect(li == 3 && n == 8, "Open MPI: %d of %d", li, n);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    loomi_env_local_rank(0, &li, &n);
    cr_expect(li == 1 && n == 4, "torchrun first: %d of %d", li, n);
    setenv("LOOM_LOCAL_RANK", "2", 1);
    setenv("LOOM_LOCAL_SIZE", "2", 1); /* 2 of 2: out of range */
    loomi_env_local_rank(0, &li, &n);
    cr_expect(li == 1 && n == 4, "bad LOOM_ pair skipped: %d of %d", li, n);
    setenv("LOOM_LOCAL_RANK", "0", 1);
    loomi_env_local_rank(0, &li, &n);
    cr_expect(li == 0 && n == 2, "loomrun first: %d of %d", li, n);
    setenv("LOOM_LOCAL_SIZE", "2x", 1);
    loomi_env_local_rank(0, &li, &n);
    cr_expect(li == 1 && n == 4, "not a number: skipped (%d of %d)", li, n);
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

/* A card that says which NIC its rank opened keeps it in the picture
 * (LOOM_IB_HCA may name another than the closest), marked open. */
Test(topo, job_keeps_the_nic_in_use)
{
    struct loomi_topo_rank a = load("dgx_2s8g4n.xml", "dgx-a");
    struct loomi_topo_rank ranks[8];
    unsigned char card[LOOMI_TOPO_CARD_BYTES];
    for (int r = 0; r < 8; r++) {
        struct loomi_topo_rank x = a;
        x.pid = 100 + r;
        /* Rank 1 opened mlx5_3; rank 2 says nothing of its NIC. */
        x.nic = (int16_t)(r == 2 ? 1 : r == 1 ? 3 : r / 2);
        x.nic_open = r != 2;
        loomi_topo_pack(&x, card);
        cr_assert_eq(loomi_topo_unpack(card, &ranks[r]), LOOM_SUCCESS, "%s",
                     loom_get_last_error());
        cr_expect_eq(ranks[r].nic_open, r != 2, "rank %d", r);
        cr_expect_eq(ranks[r].nic, r == 2 ? -1 : r == 1 ? 3 : r / 2, "rank %d", r);
    }
    struct loomi_topo_job job;
    cr_assert_eq(loomi_topo_job_build(ranks, 8, &job), LOOM_SUCCESS);
    cr_expect_eq(job.ranks[1].nic, 3);
    cr_expect_eq(job.ranks[2].nic, 1, "rank 2: the closest, as placed");
    char *text = picture(&job);
    cr_expect(strstr(text, "  rank 1: local 1 pid 101 numa 0 gpu 1 (cuda1) nic 3 (mlx5_3, open)"),
              "%s", text);
    cr_expect(strstr(text, "  rank 2: local 2 pid 102 numa 0 gpu 2 (cuda2) nic 1 (mlx5_1) unbound"),
              "%s", text);
    free(text);
    loomi_topo_job_free(&job);
}

/* More ranks than GPUs: ranks sharing a GPU share its NIC. */
Test(topo, job_dgx_two_ranks_per_gpu)
{
    struct loomi_topo_rank a;
    struct loomi_topo_job job;
    one_host_job("dgx_2s8g4n.xml", 16, &a, &job);
    for (int r = 0; r < 16; r++) {
        cr_expect_eq(job.ranks[r].gpu, r % 8);
        cr_expect_eq(job.ranks[r].nic, (r % 8) / 2, "rank %d", r);
    }
    loomi_topo_job_free(&job);
}

Test(topo, job_cpu_8numa)
{
    struct loomi_topo_rank a = load("cpu_8numa.xml", "cpu-a");
    struct loomi_topo_rank ranks[8];
    for (int r = 0; r < 8; r++) ranks[r] = a;
    struct loomi_topo_job job;
    cr_assert_eq(loomi_topo_job_build(ranks, 8, &job), LOOM_SUCCESS);
    cr_assert_eq(job.map->nhosts, 1);
    for (int r = 0; r < 8; r++) {
        cr_expect_eq(job.ranks[r].numa, r, "one rank per NUMA node");
        cr_expect_eq(job.ranks[r].gpu, -1);
        /* No NIC on most nodes: the one on the same package. */
        cr_expect_eq(job.ranks[r].nic, r < 4 ? 0 : 1, "rank %d", r);
    }
    loomi_topo_job_free(&job);

    /* Bound ranks keep their node: all on NUMA 6 use package 1's NIC. */
    for (int r = 0; r < 8; r++) {
        ranks[r].bound = 1;
        ranks[r].numa = 6;
        ranks[r].first_pu = (int16_t)(96 + 2 * r);
        ranks[r].npus = 2;
    }
    cr_assert_eq(loomi_topo_job_build(ranks, 8, &job), LOOM_SUCCESS);
    for (int r = 0; r < 8; r++) {
        cr_expect_eq(job.ranks[r].numa, 6);
        cr_expect_eq(job.ranks[r].nic, 1);
    }
    loomi_topo_job_free(&job);
}

/* Two NICs on one node, ranks round-robin over nodes: both NICs used. */
Test(topo, job_spreads_over_nics_of_a_node)
{
    struct loomi_topo_rank a = load("cpu_8numa.xml", "cpu-a");
    a.host.nics[1].numa = 0;
    a.host.nics[1].package = 0;
    struct loomi_topo_rank ranks[16];
    for (int r = 0; r < 16; r++) ranks[r] = a;
    struct loomi_topo_job job;
    cr_assert_eq(loomi_topo_job_build(ranks, 16, &job), LOOM_SUCCESS);
    int used[2] = {0, 0};
    for (int r = 0; r < 16; r++) used[job.ranks[r].nic]++;
    cr_expect_eq(used[0], 8);
    cr_expect_eq(used[1], 8);
    loomi_topo_job_free(&job);
}

Test(topo, job_without_devices)
{
    struct loomi_topo_rank a = load("cpu_8numa.xml", "solo");
    a.host.nnics = 0;
    struct loomi_topo_job job;
    cr_assert_eq(loomi_topo_job_build(&a, 1, &job), LOOM_SUCCESS);
    cr_expect_eq(job.map->nhosts, 1);
    cr_expect_eq(job.ranks[0].gpu, -1);
    cr_expect_eq(job.ranks[0].nic, -1);
    cr_expect_eq(job.ranks[0].numa, 0);
    loomi_topo_job_free(&job);
}

Test(topo, job_rejects_inconsistent_host)
{
    struct loomi_topo_rank a = load("dgx_2s8g4n.xml", "same");
    struct loomi_topo_rank ranks[4] = {a, a, a, a};
    ranks[3].host.ncores = 32;
    struct loomi_topo_job job;
    cr_assert_eq(loomi_topo_job_build(ranks, 4, &job), LOOM_ERR_MISMATCH);
    cr_expect(strstr(loom_get_last_error(), "ranks 0 and 3"), "%s", loom_get_last_error());
    cr_expect(strstr(loom_get_last_error(), "cores"), "%s", loom_get_last_error());
    cr_expect_null(job.ranks);
    cr_expect_null(job.map);

    /* A different fixture under the same name is caught too. */
    struct loomi_topo_rank c = load("cpu_8numa.xml", "same");
    ranks[3] = a;
    ranks[2] = c;
    cr_assert_eq(loomi_topo_job_build(ranks, 4, &job), LOOM_ERR_MISMATCH);
    cr_expect(strstr(loom_get_last_error(), "ranks 0 and 2"), "%s", loom_get_last_error());
}
