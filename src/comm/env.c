/*
 * env.c - finding the job in the launcher's environment: loomrun,
 * torchrun, Slurm or Open MPI.  Loom is not a cluster manager; it runs
 * under the launchers people already use.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "transports/net.h"

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* A whole number in lo..hi, or -1; callers decide whether that is an error. */
static int whole_number(const char *s, int lo, int hi)
{
    if (!s) return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno || end == s || *end || v < lo || v > hi ? -1 : (int)v;
}

static int parse_int(const char *name, const char *s, int lo, int hi, int *out)
{
    int v = whole_number(s, lo, hi);
    if (v < 0) {
        loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                   "loom_comm_init_env: %s=%s is not an integer in %d..%d", name, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* "host:port" or "[v6]:port". */
static int split_hostport(const char *s, struct loomi_boot_target *t)
{
    const char *colon;
    if (*s == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':') return -1;
        snprintf(t->host, sizeof t->host, "%.*s", (int)(close - s - 1), s + 1);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || colon == s) return -1;
        snprintf(t->host, sizeof t->host, "%.*s", (int)(colon - s), s);
    }
    const char *port = colon + 1;
    if (!*port || strlen(port) >= sizeof t->port) return -1;
    for (const char *p = port; *p; p++)
        if (!isdigit((unsigned char)*p)) return -1;
    if (atoi(port) < 1 || atoi(port) > 65535) return -1;
    strcpy(t->port, port);
    return 0;
}

/* First host of a Slurm node list: "n[01-04,07],m" -> "n01". */
static void slurm_first_host(const char *list, char *out, size_t n)
{
    const char *br = strchr(list, '[');
    const char *comma = strchr(list, ',');
    if (!br || (comma && comma < br)) {
        size_t len = comma ? (size_t)(comma - list) : strlen(list);
        snprintf(out, n, "%.*s", (int)len, list);
        return;
    }
    size_t num = strcspn(br + 1, "-,]");
    const char *close = strchr(br, ']');
    const char *suffix = close ? close + 1 : "";
    size_t slen = strcspn(suffix, ",");
    snprintf(out, n, "%.*s%.*s%.*s", (int)(br - list), list, (int)num, br + 1, (int)slen, suffix);
}

static void port_from_job(const char *job, struct loomi_boot_target *t)
{
    unsigned char h[16];
    loomi_hash128(job, strlen(job), h);
    snprintf(t->port, sizeof t->port, "%u", 20000u + (unsigned)((h[0] | (h[1] << 8)) % 10000));
}

/* LOOM_JOB_KEY, the job's secret, into t's key; or the failure, naming
 * the variable (not its value). */
static loom_result_t set_key(struct loomi_boot_target *t, const char *src, const char *fn)
{
    unsigned char s[LOOMI_AUTH_SECRET_MAX];
    const char *why = "";
    int n = loomi_auth_parse_secret(src, s, sizeof s, &why);
    if (n < 0)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                          "%s: LOOM_JOB_KEY %s: the job's secret must be 32 to 128 hex digits "
                          "of random bits, the same on every rank (make one with "
                          "`openssl rand -hex 16`; loomrun makes one itself)",
                          fn, why);
    loomi_auth_key(s, (size_t)n, t->job_key);
    t->keyed = 1;
    return LOOM_SUCCESS;
}

loom_result_t loomi_env_target(struct loomi_boot_target *t, int *rank, int *nranks)
{
    const int maxr = 1 << 20;
    memset(t, 0, sizeof *t);
    const char *root = env("LOOM_ROOT");
    const char *jobid = NULL;
    char jobbuf[256] = "";
    const char *rs, *ss, *rn, *sn;
    if ((rs = env("LOOM_RANK")) && (ss = env("LOOM_SIZE"))) {
        rn = "LOOM_RANK";
        sn = "LOOM_SIZE";
        if (!root)
            return loomi_fail(LOOM_ERR_INVALID_USAGE, -1,
                              "loom_comm_init_env: LOOM_RANK and LOOM_SIZE are set but LOOM_ROOT "
                              "(host:port of rank 0) is not");
    } else if ((rs = env("RANK")) && (ss = env("WORLD_SIZE"))) {
        rn = "RANK";
        sn = "WORLD_SIZE";
        jobid = env("TORCHELASTIC_RUN_ID");
    } else if ((rs = env("SLURM_PROCID")) && (ss = env("SLURM_NTASKS"))) {
        rn = "SLURM_PROCID";
        sn = "SLURM_NTASKS";
        snprintf(jobbuf, sizeof jobbuf, "slurm-%s.%s", env("SLURM_JOB_ID") ? env("SLURM_JOB_ID") : "0",
                 env("SLURM_STEP_ID") ? env("SLURM_STEP_ID") : "0");
        jobid = jobbuf;
    } else if ((rs = env("OMPI_COMM_WORLD_RANK")) && (ss = env("OMPI_COMM_WORLD_SIZE"))) {
        rn = "OMPI_COMM_WORLD_RANK";
        sn = "OMPI_COMM_WORLD_SIZE";
        const char *j = env("OMPI_MCA_ess_base_jobid");
        if (!j) j = env("PMIX_NAMESPACE");
        if (!j) j = env("OMPI_MCA_orte_ess_jobid");
        snprintf(jobbuf, sizeof jobbuf, "ompi-%s", j ? j : "0");
        jobid = jobbuf;
    } else {
        return loomi_fail(LOOM_ERR_INVALID_USAGE, -1,
                          "loom_comm_init_env: no launcher environment found (looked for "
                          "LOOM_RANK/LOOM_SIZE/LOOM_ROOT, RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, "
                          "SLURM_PROCID/SLURM_NTASKS, OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE); "
                          "start the program with loomrun or another launcher");
    }
    if (parse_int(sn, ss, 1, maxr, nranks) || parse_int(rn, rs, 0, *nranks - 1, rank))
        return LOOM_ERR_INVALID_ARGUMENT;

    int slurm = !strcmp(rn, "SLURM_PROCID"), ompi = !strcmp(rn, "OMPI_COMM_WORLD_RANK");
    if (root) {
        if (split_hostport(root, t))
            return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                              "loom_comm_init_env: LOOM_ROOT=%s is not host:port", root);
    } else {
        /* Host: MASTER_ADDR, else what the launcher implies. */
        if (env("MASTER_ADDR"))
            snprintf(t->host, sizeof t->host, "%s", env("MASTER_ADDR"));
        else if (slurm && env("SLURM_STEP_NODELIST"))
            slurm_first_host(env("SLURM_STEP_NODELIST"), t->host, sizeof t->host);
        else if (ompi && env("OMPI_COMM_WORLD_LOCAL_SIZE") &&
                 !strcmp(env("OMPI_COMM_WORLD_LOCAL_SIZE"), ss))
            strcpy(t->host, "127.0.0.1");
        /* Port: LOOM_ROOT_PORT, else MASTER_PORT (the next one under
         * torchrun, whose agent store already listens on MASTER_PORT),
         * else one derived from the launcher's job id. */
        int pv;
        if (env("LOOM_ROOT_PORT")) {
            if (parse_int("LOOM_ROOT_PORT", env("LOOM_ROOT_PORT"), 1, 65535, &pv))
                return LOOM_ERR_INVALID_ARGUMENT;
            snprintf(t->port, sizeof t->port, "%d", pv);
        } else if (env("MASTER_PORT")) {
            if (parse_int("MASTER_PORT", env("MASTER_PORT"), 1, 65534, &pv))
                return LOOM_ERR_INVALID_ARGUMENT;
            snprintf(t->port, sizeof t->port, "%d", env("TORCHELASTIC_RUN_ID") ? pv + 1 : pv);
        } else if (slurm || ompi) {
            port_from_job(jobid, t);
        }
        if (!t->host[0] || !t->port[0])
            return loomi_fail(LOOM_ERR_INVALID_USAGE, -1,
                              "loom_comm_init_env: %s/%s found but no rendezvous address: set "
                              "LOOM_ROOT=host:port (or MASTER_ADDR and MASTER_PORT) to rank 0's host",
                              rn, sn);
    }
    /* The secret is LOOM_JOB_KEY, or none.  A launcher's job id is not
     * one: anyone who can list the jobs knows it. */
    const char *key = env("LOOM_JOB_KEY");
    if (key) return set_key(t, key, "loom_comm_init_env");
    /* No secret: the public key, for ranks on one host only (auth.h).
     * Two jobs started by hand on one root hold the same key: the root
     * tells them apart by what it sees (bootstrap.c). */
    loomi_auth_key(NULL, 0, t->job_key);
    t->keyed = 0;
    if (*rank != 0 && !loomi_boot_host_is_local(t->host))
        return loomi_fail(LOOM_ERR_INVALID_USAGE, *rank,
                          "loom_comm_init_env: the job's root %s:%s is on another host and the "
                          "job has no secret: set LOOM_JOB_KEY, the same on every rank, to 32 "
                          "hex digits of random bits (`openssl rand -hex 16`), or start the job "
                          "with loomrun, which makes one",
                          t->host, t->port);
    return LOOM_SUCCESS;
}

loom_result_t loomi_env_join_target(struct loomi_boot_target *t)
{
    memset(t, 0, sizeof *t);
    const char *root = env("LOOM_ROOT"), *key = env("LOOM_JOB_KEY");
    if (!root || !key)
        return loomi_fail(LOOM_ERR_INVALID_USAGE, -1,
                          "loom_comm_join: LOOM_ROOT (the job's rendezvous host:port) and "
                          "LOOM_JOB_KEY (its key) must be set to join a running job");
    if (split_hostport(root, t))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                          "loom_comm_join: LOOM_ROOT=%s is not host:port", root);
    return set_key(t, key, "loom_comm_join");
}

void loomi_env_local_rank(int rank, int *local, int *nlocal)
{
    static const char *const pairs[][2] = {{"LOOM_LOCAL_RANK", "LOOM_LOCAL_SIZE"},
                                           {"LOCAL_RANK", "LOCAL_WORLD_SIZE"},
                                           {"OMPI_COMM_WORLD_LOCAL_RANK",
                                            "OMPI_COMM_WORLD_LOCAL_SIZE"}};
    *local = -1;
    *nlocal = 0;
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        const char *l = env(pairs[i][0]), *n = env(pairs[i][1]);
        if (!l || !n) continue;
        int nv = whole_number(n, 1, 1 << 20), lv = nv > 0 ? whole_number(l, 0, nv - 1) : -1;
        if (lv < 0) {
            LOOMI_INFO(rank, "%s=%s, %s=%s: not a local rank and size; ignored", pairs[i][0], l,
                       pairs[i][1], n);
            continue;
        }
        *local = lv;
        *nlocal = nv;
        return;
    }
}
