/* log.c - LOOM_DEBUG levels, rank-prefixed lines, LOOM_DEBUG_FILE. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_level = LOOMI_LOG_WARN;
static FILE *log_file;
static char log_host[64];
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
    const char *lv = getenv("LOOM_DEBUG");
    if (gethostname(log_host, sizeof log_host) != 0) strcpy(log_host, "?");
    log_host[sizeof log_host - 1] = '\0';
    if (lv && *lv) {
        if (!strcasecmp(lv, "none") || !strcmp(lv, "0")) log_level = LOOMI_LOG_NONE;
        else if (!strcasecmp(lv, "warn")) log_level = LOOMI_LOG_WARN;
        else if (!strcasecmp(lv, "info")) log_level = LOOMI_LOG_INFO;
        else if (!strcasecmp(lv, "trace")) log_level = LOOMI_LOG_TRACE;
        else fprintf(stderr, "loom: LOOM_DEBUG=%s is not one of none, warn, info, trace; using warn\n", lv);
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

void loomi_log_write(int level, int rank, const char *fmt, ...)
{
    static const char *const names[] = {"NONE", "WARN", "INFO", "TRACE"};
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char rk[16];
    if (rank >= 0) snprintf(rk, sizeof rk, "%d", rank);
    else strcpy(rk, "-");
    pthread_mutex_lock(&log_lock);
    fprintf(log_file ? log_file : stderr, "loom[%s:%d rank %s] %s %ld.%06ld %s\n",
            log_host, (int)getpid(), rk, names[level & 3], (long)ts.tv_sec,
            (long)(ts.tv_nsec / 1000), msg);
    pthread_mutex_unlock(&log_lock);
}
