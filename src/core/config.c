/*
 * config.c - every LOOM_* tuning variable in one table, parsed once.
 * (Launcher variables such as LOOM_ROOT are read by src/comm/env.c.)
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* K_MS, K_US: durations, a plain number in the unit (milliseconds,
 * microseconds) or one with a unit of its own (loomi_parse_duration). */
enum kind { K_INT, K_SIZE, K_STR, K_MS, K_US };

struct var {
    const char *name;
    enum kind kind;
    long long min, max; /* K_INT and K_SIZE bounds */
    size_t offset;      /* into struct loomi_env */
    const char *deflt;
};

#define OFF(m) offsetof(struct loomi_env, m)
static const struct var vars[] = {
    {"LOOM_TIMEOUT", K_MS, 1, 86400000, OFF(timeout_ms), "60000"},
    {"LOOM_TCP_STREAMS", K_INT, 1, 16, OFF(tcp_streams), "2"},
    {"LOOM_SPIN_US", K_US, 0, 1000000, OFF(spin_us), "200"},
    {"LOOM_TCP_SOCKBUF", K_SIZE, 0, 1LL << 30, OFF(tcp_sockbuf), "0"}, /* 0: kernel autotuning */
    {"LOOM_CHUNK_SIZE", K_SIZE, 4096, 1LL << 30, OFF(chunk_bytes), "2M"},
    {"LOOM_SOCKET_IFNAME", K_STR, 0, 0, OFF(socket_ifname), NULL},
    {"LOOM_ALGO", K_STR, 0, 0, OFF(algo), NULL},
    {"LOOM_TRANSPORT", K_STR, 0, 0, OFF(transport), NULL},
    {"LOOM_TOPO_FILE", K_STR, 0, 0, OFF(topo_file), NULL},
    {"LOOM_HOSTNAME", K_STR, 0, 0, OFF(hostname), NULL},
    {"LOOM_TUNING_FILE", K_STR, 0, 0, OFF(tuning_file), NULL},
    {"LOOM_PROBE", K_INT, 0, 1, OFF(probe), "1"},
    {"LOOM_SHM_SIZE", K_SIZE, 65536, 1LL << 30, OFF(shm_bytes), "4M"},
    {"LOOM_SHM_CMA", K_SIZE, 0, 1LL << 62, OFF(shm_cma_min), "128K"},
    {"LOOM_SHM_SMALL", K_SIZE, 0, 65536, OFF(shm_small), "64K"},
    {"LOOM_SHM_STREAM", K_SIZE, 0, 1LL << 62, OFF(shm_stream), "64M"},
    {"LOOM_SHM_STREAM_SAVES", K_INT, -1, 1, OFF(shm_stream_saves), "-1"},
    {"LOOM_SHM_STREAM_COPYIN", K_INT, -1, 1, OFF(shm_stream_copyin), "-1"},
    {"LOOM_HEARTBEAT_MS", K_MS, 0, 600000, OFF(heartbeat_ms), "500"},
    {"LOOM_PROGRESS_THREAD", K_INT, 0, 1, OFF(progress_thread), "0"},
    {"LOOM_QUORUM", K_STR, 0, 0, OFF(quorum), NULL},
    {"LOOM_ENCRYPT", K_INT, 0, 1, OFF(encrypt), "0"},
    {"LOOM_STATS", K_INT, 0, 1, OFF(stats), "1"},
    {"LOOM_CUDA_IPC", K_INT, 0, 1, OFF(cuda_ipc), "1"},
    {"LOOM_GPUDIRECT", K_STR, 0, 0, OFF(gpudirect), NULL},
    {"LOOM_CUDA_PIPELINE_CHUNK", K_SIZE, 0, 1LL << 40, OFF(cuda_pipe_chunk), "4M"},
};

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static struct loomi_env env;
static char env_error[256];

static int parse_var(const struct var *v, const char *s)
{
    char *p = (char *)&env + v->offset;
    if (v->kind == K_STR) {
        *(const char **)p = (s && *s) ? s : NULL;
        return 0;
    }
    long long val;
    const char *unit = v->kind == K_MS ? "ms" : v->kind == K_US ? "us" : "";
    if (v->kind == K_INT) {
        char *end;
        errno = 0;
        val = strtoll(s, &end, 10);
        if (errno || end == s || *end) goto bad;
    } else if (v->kind == K_MS || v->kind == K_US) {
        if (loomi_parse_duration(s, v->kind == K_MS ? 1000 : 1, &val)) goto bad;
    } else {
        size_t z;
        if (loomi_parse_size(s, &z)) goto bad;
        val = (long long)z;
    }
    if (val < v->min || val > v->max) goto bad;
    if (v->kind == K_SIZE) *(size_t *)p = (size_t)val;
    else *(int *)p = (int)val;
    return 0;
bad:
    if (*unit)
        snprintf(env_error, sizeof env_error,
                 "environment variable %s=%s is invalid (expected a duration from %lld to %lld "
                 "%s: a whole number of %s, or a number with a unit: us, ms, s or m, as in "
                 "%s, 1.5s or 2m)",
                 v->name, s, v->min, v->max, unit,
                 v->kind == K_MS ? "milliseconds" : "microseconds",
                 v->kind == K_MS ? "500ms" : "50us");
    else
        snprintf(env_error, sizeof env_error,
                 "environment variable %s=%s is invalid (expected %s from %lld to %lld)",
                 v->name, s, v->kind == K_INT ? "an integer" : "a size such as 512K",
                 v->min, v->max);
    return -1;
}

static void env_init(void)
{
    for (size_t i = 0; i < LOOMI_ARRAY_LEN(vars); i++) {
        if (vars[i].deflt) parse_var(&vars[i], vars[i].deflt);
        const char *s = getenv(vars[i].name);
        if (s && *s && parse_var(&vars[i], s) && vars[i].deflt)
            parse_var(&vars[i], vars[i].deflt);
    }
    /* Set, the chunk is the user's: the model picks none. */
    const char *ch = getenv("LOOM_CHUNK_SIZE");
    env.chunk_fixed = ch && *ch;
    const char *cma = getenv("LOOM_SHM_CMA");
    env.shm_cma_fixed = cma && *cma;
    /* A bare number of LOOM_TIMEOUT is milliseconds, which a user may
     * have meant as seconds: the messages of deadlines say so. */
    const char *t = getenv("LOOM_TIMEOUT");
    env.timeout_src = !t || !*t ? 0 : strspn(t, "0123456789") == strlen(t) ? 2 : 1;
}

const struct loomi_env *loomi_env_get(void)
{
    pthread_once(&env_once, env_init);
    if (env_error[0]) {
        loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s", env_error);
        return NULL;
    }
    return &env;
}

loom_result_t loom_config_init(loom_config_t *cfg)
{
    if (!cfg)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "loom_config_init: cfg is NULL");
    memset(cfg, 0, sizeof *cfg);
    cfg->size = sizeof *cfg;
    cfg->version = LOOM_CONFIG_VERSION;
    return LOOM_SUCCESS;
}

static int copy_str(char *dst, size_t n, const char *src)
{
    if (!src) { dst[0] = '\0'; return 0; }
    if (strlen(src) >= n) return -1;
    strcpy(dst, src);
    return 0;
}

loom_result_t loomi_settings_resolve(struct loomi_settings *out,
                                     const loom_config_t *cfg, const char *caller)
{
    const struct loomi_env *e = loomi_env_get();
    if (!e) return LOOM_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    out->timeout_ms = e->timeout_ms;
    out->timeout_src = e->timeout_src;
    out->spin_us = e->spin_us;
    out->tcp_streams = e->tcp_streams;
    out->tcp_sockbuf = e->tcp_sockbuf;
    out->chunk_bytes = e->chunk_bytes;
    out->chunk_fixed = e->chunk_fixed;
    out->probe = e->probe;
    out->shm_bytes = e->shm_bytes;
    out->shm_cma_min = e->shm_cma_min;
    out->shm_cma_fixed = e->shm_cma_fixed;
    out->shm_small = e->shm_small;
    out->shm_stream = e->shm_stream;
    out->shm_stream_saves = e->shm_stream_saves;
    out->shm_stream_copyin = e->shm_stream_copyin;
    out->heartbeat_ms = e->heartbeat_ms;
    out->progress_thread = e->progress_thread;
    out->encrypt = e->encrypt;
    out->stats = e->stats;
    out->cuda_ipc = e->cuda_ipc;
    if (e->gpudirect && strcmp(e->gpudirect, "auto") && strcmp(e->gpudirect, "0") &&
        strcmp(e->gpudirect, "1"))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                          "%s: LOOM_GPUDIRECT=%s is invalid (expected auto, 0 or 1)", caller,
                          e->gpudirect);
    out->gpudirect = !e->gpudirect || !strcmp(e->gpudirect, "auto") ? LOOMI_GPUDIRECT_AUTO
                     : !strcmp(e->gpudirect, "1")                   ? LOOMI_GPUDIRECT_ON
                                                                    : LOOMI_GPUDIRECT_OFF;
    if (e->quorum && strcmp(e->quorum, "majority") && strcmp(e->quorum, "any"))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                          "%s: LOOM_QUORUM=%s is invalid (expected majority or any)", caller,
                          e->quorum);
    out->quorum_any = e->quorum && !strcmp(e->quorum, "any");
    const char *ifn = e->socket_ifname, *algo = e->algo, *tr = e->transport;
    if (cfg) {
        /* Older callers pass a smaller struct: read only what they have. */
        if (cfg->size < offsetof(loom_config_t, timeout_ms) || cfg->size > 4096)
            return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                              "%s: cfg->size %zu is not a loom_config_t size (use loom_config_init)",
                              caller, cfg->size);
        if (cfg->version < 1 || cfg->version > LOOM_CONFIG_VERSION)
            return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1,
                              "%s: cfg->version %u is not supported (this library knows 1..%d)",
                              caller, cfg->version, LOOM_CONFIG_VERSION);
#define HAS(m) (cfg->size >= offsetof(loom_config_t, m) + sizeof cfg->m)
        if (HAS(timeout_ms) && cfg->timeout_ms) {
            if (cfg->timeout_ms < 0)
                return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: cfg->timeout_ms %d is negative", caller, cfg->timeout_ms);
            out->timeout_ms = cfg->timeout_ms;
            out->timeout_src = 3;
        }
        if (HAS(tcp_streams) && cfg->tcp_streams) {
            if (cfg->tcp_streams < 1 || cfg->tcp_streams > 16)
                return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: cfg->tcp_streams %d is not in 1..16", caller, cfg->tcp_streams);
            out->tcp_streams = cfg->tcp_streams;
        }
        if (HAS(chunk_bytes) && cfg->chunk_bytes) {
            if (cfg->chunk_bytes < 4096 || cfg->chunk_bytes > (1u << 30))
                return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: cfg->chunk_bytes %zu is not in 4096..1G", caller, cfg->chunk_bytes);
            out->chunk_bytes = cfg->chunk_bytes;
            out->chunk_fixed = 1;
        }
        if (HAS(socket_ifname) && cfg->socket_ifname) ifn = cfg->socket_ifname;
        if (HAS(algo) && cfg->algo) algo = cfg->algo;
        if (HAS(transport) && cfg->transport) tr = cfg->transport;
#undef HAS
    }
    if (copy_str(out->socket_ifname, sizeof out->socket_ifname, ifn))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: socket interface name '%s' is too long", caller, ifn);
    if (copy_str(out->algo, sizeof out->algo, algo))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: algorithm string is too long", caller);
    if (copy_str(out->topo_file, sizeof out->topo_file, e->topo_file))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: LOOM_TOPO_FILE is too long", caller);
    if (copy_str(out->hostname, sizeof out->hostname, e->hostname))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: LOOM_HOSTNAME is too long (at most 63 bytes)", caller);
    if (copy_str(out->tuning_file, sizeof out->tuning_file, e->tuning_file))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: LOOM_TUNING_FILE is too long", caller);
    if (copy_str(out->transport, sizeof out->transport, tr))
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "%s: transport string '%s' is too long", caller, tr);
    return LOOM_SUCCESS;
}

void loomi_timeout_str(const struct loomi_settings *s, char *buf, size_t n)
{
    const int ms = s->timeout_ms;
    if (s->timeout_src == 3)
        snprintf(buf, n, "cfg->timeout_ms=%d ms%s", ms,
                 ms < 1000 ? " (a deadline under a second)" : "");
    else if (ms >= 1000 || s->timeout_src == 0)
        snprintf(buf, n, "LOOM_TIMEOUT=%d ms", ms);
    else if (s->timeout_src == 2)
        snprintf(buf, n, "LOOM_TIMEOUT=%d ms (did you mean %ds? a bare number is milliseconds)",
                 ms, ms);
    else
        snprintf(buf, n, "LOOM_TIMEOUT=%d ms (a deadline under a second)", ms);
}
