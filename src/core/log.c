/* log.c - LOOM_DEBUG levels, rank-prefixed lines with the local time,
 * LOOM_DEBUG_FILE. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_level = LOOMI_LOG_NOTICE;
static FILE *log_file;
static char log_host[64];
/* The launcher's rank, for lines logged before a communicator has one
 * (bootstrap); "-" without a launcher. */
static char log_env_rank[16] = "-";
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

/* Expand %h (host), %p (pid), %r (LOOM_RANK) in LOOM_DEBUG_FILE. */
static void expand_path(const char *pat, char *out, size_t n)
{
    size_t o = 0;
    const char *rank = getenv("LOOM_RANK");
    for (const char *p = pat; *p && o + 1 < n; p++) {
        char tmp[64];
        const char *ins = NULL;
        if (p[0] == '%' && p[1]) {
            if (p[1] == 'h') ins = log_host;
            else if (p[1] == 'p') { snprintf(tmp, sizeof tmp, "%d", (int)getpid()); ins = tmp; }
            else if (p[1] == 'r') ins = rank ? rank : "x";
            else if (p[1] == '%') ins = "%";
        }
        if (ins) {
            o += (size_t)snprintf(out + o, n - o, "%s", ins);
            if (o >= n) o = n - 1;
            p++;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
}

static void log_init(void)
{
    static const char *const rank_vars[] = {"LOOM_RANK", "RANK", "SLURM_PROCID",
                                            "OMPI_COMM_WORLD_RANK"};
    const char *lv = getenv("LOOM_DEBUG");
    if (gethostname(log_host, sizeof log_host) != 0) strcpy(log_host, "?");
    log_host[sizeof log_host - 1] = '\0';
    for (size_t i = 0; i < LOOMI_ARRAY_LEN(rank_vars); i++) {
        const char *v = getenv(rank_vars[i]);
        if (v && *v && strlen(v) < sizeof log_env_rank && strspn(v, "0123456789") == strlen(v)) {
            strcpy(log_env_rank, v);
            break;
        }
    }
    tzset(); /* localtime_r need not */
    if (lv && *lv) {
        if (!strcasecmp(lv, "none") || !strcmp(lv, "0")) log_level = LOOMI_LOG_NONE;
        else if (!strcasecmp(lv, "warn")) log_level = LOOMI_LOG_WARN;
        else if (!strcasecmp(lv, "info")) log_level = LOOMI_LOG_INFO;
        else if (!strcasecmp(lv, "trace")) log_level = LOOMI_LOG_TRACE;
        else fprintf(stderr, "loom: LOOM_DEBUG=%s is not one of none, warn, info, trace; "
                             "using the default (warnings that no call returns)\n", lv);
    }
    const char *f = getenv("LOOM_DEBUG_FILE");
    if (f && *f) {
        char path[4096];
        expand_path(f, path, sizeof path);
        log_file = fopen(path, "a");
        if (!log_file)
            fprintf(stderr, "loom: cannot open LOOM_DEBUG_FILE %s; logging to stderr\n", path);
        else
            setvbuf(log_file, NULL, _IOLBF, 0);
    }
}

int loomi_log_level(void)
{
    pthread_once(&log_once, log_init);
    return log_level;
}

/* "2026-12-06 14:03:07.123": the local wall-clock time, to the
 * millisecond, so that lines of several ranks and hosts can be merged and
 * set beside other logs. */
static void format_time(char *buf, size_t n)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (!localtime_r(&ts.tv_sec, &tm) || strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm) == 0) {
        snprintf(buf, n, "%lld.%03ld", (long long)ts.tv_sec, ts.tv_nsec / 1000000);
        return;
    }
    size_t len = strlen(buf);
    snprintf(buf + len, n - len, ".%03ld", ts.tv_nsec / 1000000);
}

void loomi_log_write(int level, int rank, const char *fmt, ...)
{
    /* A notice is a warning that is shown by default. */
    static const char *const names[] = {"NONE", "WARN", "WARN", "INFO", "TRACE"};
    char msg[1024];
    LOOMI_VFORMAT(msg, fmt);
    pthread_once(&log_once, log_init);
    char when[48];
    format_time(when, sizeof when);
    char rk[16];
    if (rank >= 0) snprintf(rk, sizeof rk, "%d", rank);
    else snprintf(rk, sizeof rk, "%s", log_env_rank);
    const char *name = level >= 0 && level < (int)LOOMI_ARRAY_LEN(names) ? names[level] : "?";
    pthread_mutex_lock(&log_lock);
    fprintf(log_file ? log_file : stderr, "loom[%s:%d rank %s] %s %s %s\n", log_host,
            (int)getpid(), rk, name, when, msg);
    pthread_mutex_unlock(&log_lock);
}
