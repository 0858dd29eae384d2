/*
 * loomrun.c - the local launcher: starts N ranks of a program on this host
 * with the Loom bootstrap environment (LOOM_ROOT, LOOM_RANK, ...), forwards
 * signals to them and stops the job when one of them fails.
 *
 * Single-threaded on purpose: child output, child exits, signals (through a
 * signalfd) and deadlines are all handled in one poll() loop, so nothing
 * runs in signal-handler context.  Needs only libc (Linux, glibc >= 2.25).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* pipe2, signalfd, asprintf, strsignal */
#endif
#ifdef HAVE_CONFIG_H
#include "config.h" /* PACKAGE_VERSION in the autotools build */
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef LOOMRUN_VERSION
#ifdef PACKAGE_VERSION
#define LOOMRUN_VERSION PACKAGE_VERSION
#else
#define LOOMRUN_VERSION "0.1.0"
#endif
#endif

#define MAX_RANKS 4096
#define EXIT_USAGE 2
#define EXIT_SETUP 125 /* loomrun itself failed, as env(1)/timeout(1) do */
#define EXIT_TIMEOUT 124
#define EXIT_NOEXEC 127
#define READ_CHUNK 65536
#define MAX_LINE 65536            /* longer lines are split, to bound memory */
#define DRAIN_READS 256           /* per stream after its rank exited */
#define KILL_WAIT_NS 5000000000LL /* after SIGKILL, before giving up */
#define GROUP_POLL_MS 50

extern char **environ;

/* ------------------------------------------------------------ options */

struct options {
    int nranks; /* 0 until -n is seen */
    bool prefix, keep_going, bind;
    const char *outdir;
    double timeout_s; /* 0: no timeout */
    double stop_delay_s; /* after a failure, before SIGTERM */
    double grace_s;
    char *root_host; /* as written into LOOM_ROOT ("[v6]" keeps brackets) */
    char *bind_host; /* the same without brackets, for getaddrinfo */
    int root_port;   /* -1: find a free one */
    const char **xvars;
    int nx;
    char **prog_argv;
};

/* The job's variables: Loom's, and those of torch's env:// rendezvous
 * (torch.distributed.init_process_group), which a rank's torch store
 * uses.  LOOM_JOB_KEY, MASTER_ADDR and MASTER_PORT may be set with -x. */
static const char *const managed_vars[] = {
    "LOOM_ROOT",       "LOOM_RANK",    "LOOM_SIZE",   "LOOM_LOCAL_RANK",
    "LOOM_LOCAL_SIZE", "LOOM_JOB_KEY", "MASTER_ADDR", "MASTER_PORT",
    "RANK",            "WORLD_SIZE",   "LOCAL_RANK",  "LOCAL_WORLD_SIZE",
};
#define N_MANAGED (sizeof managed_vars / sizeof managed_vars[0])

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: loomrun -n N [OPTION]... PROGRAM [ARG]...\n"
            "Start N local ranks of PROGRAM with the Loom bootstrap "
            "environment.\n"
            "\n"
            "  -n N               number of ranks, 1 to %d (required)\n"
            "  -x VAR=VALUE       set VAR in the environment of every rank "
            "(repeatable)\n"
            "      --prefix       prefix each output line of rank i with "
            "\"[i] \"\n"
            "      --output DIR   write rank i's stdout/stderr to "
            "DIR/rank.i.out and\n"
            "                     DIR/rank.i.err (DIR is created)\n"
            "      --keep-going   let the other ranks run on when one fails\n"
            "      --timeout SEC  stop the whole job after SEC seconds "
            "(exit status 124)\n"
            "      --stop-delay SEC  after a rank fails, time the others get "
            "to exit\n"
            "                     (and print their own errors) before "
            "SIGTERM (default 2)\n"
            "      --grace SEC    time between SIGTERM and SIGKILL when "
            "stopping ranks\n"
            "                     (default 3)\n"
            "      --bind core|none  core: rank i runs on the i-th of the CPUs\n"
            "                     loomrun may use, round robin (default none)\n"
            "      --root HOST[:PORT]  address put into LOOM_ROOT "
            "(default 127.0.0.1 and\n"
            "                     a free port)\n"
            "  -h, --help         show this help and exit\n"
            "      --version      show the version and exit\n"
            "\n"
            "Exit status: 0 if every rank exited 0, else the status of the "
            "first rank\n"
            "that failed (128+N if killed by signal N); 124 on --timeout, "
            "127 if\n"
            "PROGRAM cannot be executed, 2 on a usage error, 125 if loomrun "
            "itself fails.\n"
            "See loomrun(1).\n",
            MAX_RANKS);
}

static void usage_error(const char *fmt, ...)
    __attribute__((noreturn, format(printf, 1, 2)));
static void usage_error(const char *fmt, ...)
{
    va_list ap;
    fputs("loomrun: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nTry 'loomrun --help' for more information.\n", stderr);
    exit(EXIT_USAGE);
}

static void fatal(const char *fmt, ...)
    __attribute__((noreturn, format(printf, 1, 2)));
static void fatal(const char *fmt, ...)
{
    va_list ap;
    fputs("loomrun: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(EXIT_SETUP);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        fatal("out of memory");
    return p;
}

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        fatal("out of memory");
    return p;
}

static char *xstrndup(const char *s, size_t n)
{
    char *p = strndup(s, n);
    if (!p)
        fatal("out of memory");
    return p;
}

static bool parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v;
    if (*s == '\0' || *s == ' ' || *s == '+')
        return false;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* Upper bound keeps the nanosecond arithmetic far from overflow. */
static bool parse_seconds(const char *s, double *out)
{
    char *end;
    double v;
    if (*s == '\0')
        return false;
    errno = 0;
    v = strtod(s, &end);
    if (errno || *end != '\0' || !isfinite(v) || v < 0 || v > 1e9)
        return false;
    *out = v;
    return true;
}

/* HOST, HOST:PORT, [V6], [V6]:PORT, or a bare IPv6 address (no port).
 * PORT 0 or no PORT: a free port is looked for on HOST. */
static bool parse_root(const char *s, struct options *o)
{
    const char *host, *port = NULL;
    size_t hlen;
    bool v6 = false;
    long p = 0;

    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close)
            return false;
        host = s + 1;
        hlen = (size_t)(close - host);
        if (close[1] == ':')
            port = close + 2;
        else if (close[1] != '\0')
            return false;
        v6 = true;
    } else {
        const char *colon = strchr(s, ':');
        host = s;
        if (colon && strchr(colon + 1, ':')) {
            hlen = strlen(s);
            v6 = true;
        } else if (colon) {
            hlen = (size_t)(colon - s);
            port = colon + 1;
        } else {
            hlen = strlen(s);
        }
    }
    if (hlen == 0 || memchr(host, '=', hlen) || memchr(host, ' ', hlen))
        return false;
    if (port && !parse_int(port, 0, 65535, &p))
        return false;

    free(o->bind_host);
    free(o->root_host);
    o->bind_host = xstrndup(host, hlen);
    if (v6) {
        o->root_host = xmalloc(hlen + 3);
        snprintf(o->root_host, hlen + 3, "[%s]", o->bind_host);
    } else {
        o->root_host = xstrndup(host, hlen);
    }
    o->root_port = p > 0 ? (int)p : -1;
    return true;
}

static size_t var_name_len(const char *entry)
{
    return strcspn(entry, "=");
}

static bool var_is(const char *entry, const char *name)
{
    size_t n = strlen(name);
    return strncmp(entry, name, n) == 0 && entry[n] == '=';
}

static bool user_may_set(const char *name)
{
    return strcmp(name, "LOOM_JOB_KEY") == 0 || strcmp(name, "MASTER_ADDR") == 0 ||
           strcmp(name, "MASTER_PORT") == 0;
}

static void check_xvar(const char *v)
{
    size_t n = var_name_len(v);
    size_t i;

    if (v[n] != '=')
        usage_error("invalid value '%s' for -x: expected VAR=VALUE", v);
    if (n == 0 || !(v[0] == '_' || (v[0] >= 'A' && v[0] <= 'Z') ||
                    (v[0] >= 'a' && v[0] <= 'z')))
        usage_error("invalid variable name in -x '%s'", v);
    for (i = 1; i < n; i++) {
        char c = v[i];
        if (!(c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
              (c >= '0' && c <= '9')))
            usage_error("invalid variable name in -x '%s'", v);
    }
    /* LOOM_JOB_KEY and torch's rendezvous address may be chosen by the
     * user; the others describe the job. */
    for (i = 0; i < N_MANAGED; i++)
        if (var_is(v, managed_vars[i]) && !user_may_set(managed_vars[i]))
            usage_error("-x %.*s: loomrun sets this variable itself%s",
                        (int)n, v,
                        strcmp(managed_vars[i], "LOOM_ROOT") == 0
                            ? " (use --root)"
                            : "");
}

enum opt_id {
    O_N, O_X, O_HELP, O_VERSION, O_PREFIX, O_OUTPUT, O_KEEP_GOING,
    O_TIMEOUT, O_GRACE, O_ROOT, O_BIND, O_STOP_DELAY
};

static const struct {
    const char *name;
    enum opt_id id;
    bool has_arg;
} long_opts[] = {
    {"help", O_HELP, false},       {"version", O_VERSION, false},
    {"prefix", O_PREFIX, false},   {"output", O_OUTPUT, true},
    {"keep-going", O_KEEP_GOING, false}, {"timeout", O_TIMEOUT, true},
    {"grace", O_GRACE, true},      {"root", O_ROOT, true},
    {"stop-delay", O_STOP_DELAY, true},
    {"bind", O_BIND, true},
};

static void parse_args(int argc, char **argv, struct options *o)
{
    int i = 1;

    memset(o, 0, sizeof *o);
    o->grace_s = 3;
    o->stop_delay_s = 2;
    o->root_port = -1;
    o->xvars = xmalloc(sizeof(char *) * (size_t)argc);

    while (i < argc) {
        const char *a = argv[i];
        const char *shown; /* the option's canonical name, for messages */
        const char *val = NULL;
        char namebuf[64];
        enum opt_id id;
        bool has_arg;

        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0')
            break; /* PROGRAM: everything after it belongs to it */
        i++;

        if (a[1] == '-') {
            const char *eq = strchr(a + 2, '=');
            size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
            size_t k;
            bool found = false;
            for (k = 0; k < sizeof long_opts / sizeof long_opts[0]; k++) {
                if (strlen(long_opts[k].name) == nlen - 2 &&
                    strncmp(a + 2, long_opts[k].name, nlen - 2) == 0) {
                    found = true;
                    break;
                }
            }
            if (!found)
                usage_error("unknown option '%.*s'", (int)nlen, a);
            id = long_opts[k].id;
            has_arg = long_opts[k].has_arg;
            snprintf(namebuf, sizeof namebuf, "--%s", long_opts[k].name);
            shown = namebuf;
            if (eq) {
                if (!has_arg)
                    usage_error("option '%s' takes no value", shown);
                val = eq + 1;
            }
        } else {
            switch (a[1]) {
            case 'n': id = O_N; has_arg = true; break;
            case 'x': id = O_X; has_arg = true; break;
            case 'h': id = O_HELP; has_arg = false; break;
            default: usage_error("unknown option '%s'", a);
            }
            snprintf(namebuf, sizeof namebuf, "-%c", a[1]);
            shown = namebuf;
            if (a[2] != '\0') {
                if (!has_arg)
                    usage_error("unknown option '%s'", a);
                val = a + 2;
            }
        }
        if (has_arg && !val) {
            if (i >= argc)
                usage_error("option '%s' requires a value", shown);
            val = argv[i++];
        }

        switch (id) {
        case O_HELP:
            usage(stdout);
            exit(0);
        case O_VERSION:
            printf("loomrun (Loom) %s\n", LOOMRUN_VERSION);
            exit(0);
        case O_N: {
            long v;
            if (!parse_int(val, 1, MAX_RANKS, &v))
                usage_error("invalid value '%s' for -n: expected an integer "
                            "from 1 to %d",
                            val, MAX_RANKS);
            o->nranks = (int)v;
            break;
        }
        case O_X:
            check_xvar(val);
            o->xvars[o->nx++] = val;
            break;
        case O_PREFIX:
            o->prefix = true;
            break;
        case O_OUTPUT:
            if (*val == '\0')
                usage_error("invalid value '' for --output: expected a "
                            "directory");
            o->outdir = val;
            break;
        case O_KEEP_GOING:
            o->keep_going = true;
            break;
        case O_TIMEOUT:
            if (!parse_seconds(val, &o->timeout_s))
                usage_error("invalid value '%s' for --timeout: expected a "
                            "number of seconds >= 0 (0: no timeout)",
                            val);
            break;
        case O_STOP_DELAY:
            if (!parse_seconds(val, &o->stop_delay_s))
                usage_error("invalid value '%s' for --stop-delay: expected a "
                            "number of seconds >= 0",
                            val);
            break;
        case O_GRACE:
            if (!parse_seconds(val, &o->grace_s))
                usage_error("invalid value '%s' for --grace: expected a "
                            "number of seconds >= 0",
                            val);
            break;
        case O_BIND:
            if (!strcmp(val, "core")) o->bind = true;
            else if (!strcmp(val, "none")) o->bind = false;
            else
                usage_error("invalid value '%s' for --bind: expected core or none", val);
            break;
        case O_ROOT:
            if (!parse_root(val, o))
                usage_error("invalid value '%s' for --root: expected "
                            "HOST:PORT, HOST, or [IPV6]:PORT",
                            val);
            break;
        }
    }

    if (o->nranks == 0)
        usage_error("the number of ranks is required (-n N)");
    if (i >= argc)
        usage_error("no PROGRAM given");
    if (o->prefix && o->outdir)
        usage_error("--prefix and --output cannot be used together");
    o->prog_argv = argv + i;
    if (!o->root_host) {
        o->root_host = xstrndup("127.0.0.1", 9);
        o->bind_host = xstrndup("127.0.0.1", 9);
    }
}

/* ------------------------------------------------------------ helpers */

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t secs_to_ns(double s)
{
    return (int64_t)(s * 1e9);
}

/* The port is released again before the ranks start; rank 0 binds it
 * soon after, so the window for someone else to take it is small. */
static int find_free_port(const char *host)
{
    struct addrinfo hints, *res, *ai;
    int rc, port = -1, err = 0;

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    rc = getaddrinfo(host, "0", &hints, &res);
    if (rc != 0)
        fatal("--root: cannot resolve '%s': %s", host, gai_strerror(rc));
    for (ai = res; ai && port < 0; ai = ai->ai_next) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                       ai->ai_protocol);
        if (s < 0) {
            err = errno;
            continue;
        }
        if (bind(s, ai->ai_addr, ai->ai_addrlen) == 0 &&
            getsockname(s, (struct sockaddr *)&ss, &len) == 0) {
            if (ss.ss_family == AF_INET)
                port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
            else if (ss.ss_family == AF_INET6)
                port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        } else {
            err = errno;
        }
        close(s);
    }
    freeaddrinfo(res);
    if (port <= 0)
        fatal("cannot find a free TCP port on %s: %s", host,
              strerror(err ? err : EADDRNOTAVAIL));
    return port;
}

static void make_job_key(char out[33])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char b[16];
    size_t got = 0;
    int i;

    while (got < sizeof b) {
        ssize_t r = getrandom(b + got, sizeof b - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            fatal("getrandom: %s", strerror(errno));
        }
        got += (size_t)r;
    }
    for (i = 0; i < 16; i++) {
        out[2 * i] = hex[b[i] >> 4];
        out[2 * i + 1] = hex[b[i] & 15];
    }
    out[32] = '\0';
}

/* mkdir -p */
static void make_dirs(const char *path)
{
    char *p = xstrndup(path, strlen(path));
    char *s;
    struct stat st;

    for (s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            fatal("cannot create directory '%s': %s", p, strerror(errno));
        *s = '/';
    }
    if (mkdir(p, 0777) != 0 && errno != EEXIST)
        fatal("cannot create directory '%s': %s", p, strerror(errno));
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
        fatal("--output: '%s' is not a directory", p);
    free(p);
}

/* A closed 0/1/2 would be reused by our pipes and confuse the ranks. */
static void ensure_std_fds(void)
{
    int fd;
    while ((fd = open("/dev/null", O_RDWR)) >= 0 && fd <= 2)
        ;
    if (fd > 2)
        close(fd);
}

/* --prefix keeps two pipe ends per rank open. */
static void ensure_fd_limit(int nranks)
{
    rlim_t need = (rlim_t)(2 * nranks + 32);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need)
        return;
    rl.rlim_cur = rl.rlim_max < need ? rl.rlim_max : need;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need)
        fatal("--prefix with -n %d needs %lu open files, the limit is %lu",
              nranks, (unsigned long)need,
              (unsigned long)rl.rlim_cur);
}

/* ------------------------------------------------------------ output */

struct stream {
    int fd; /* read end of the rank's pipe, -1 once closed */
    char *buf; /* the partial line not yet written */
    size_t len, cap;
};

struct sink {
    int fd;
    bool broken; /* a write failed (e.g. EPIPE): discard from now on */
};

static struct sink sinks[2] = {{STDOUT_FILENO, false}, {STDERR_FILENO, false}};
static char *outbuf;
static size_t outlen, outcap;

static void out_append(const void *p, size_t n)
{
    if (outlen + n > outcap) {
        while (outlen + n > outcap)
            outcap = outcap ? outcap * 2 : 2 * READ_CHUNK;
        outbuf = xrealloc(outbuf, outcap);
    }
    memcpy(outbuf + outlen, p, n);
    outlen += n;
}

static void out_flush(struct sink *k)
{
    size_t off = 0;
    while (off < outlen && !k->broken) {
        ssize_t w = write(k->fd, outbuf + off, outlen - off);
        if (w > 0) {
            off += (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && errno == EAGAIN) {
            /* someone made our stdout non-blocking */
            struct pollfd p = {.fd = k->fd, .events = POLLOUT};
            poll(&p, 1, 100);
        } else {
            k->broken = true;
        }
    }
    outlen = 0;
}

static void emit_line(int rank, const char *p, size_t n)
{
    char pre[16];
    int pl = snprintf(pre, sizeof pre, "[%d] ", rank);
    out_append(pre, (size_t)pl);
    out_append(p, n);
    if (n == 0 || p[n - 1] != '\n')
        out_append("\n", 1);
}

/* Writes every complete line of s; with at_eof also the partial rest. */
static void stream_emit(struct stream *s, int rank, struct sink *k,
                        bool at_eof)
{
    size_t start = 0;
    for (;;) {
        char *nl = memchr(s->buf + start, '\n', s->len - start);
        if (!nl)
            break;
        size_t n = (size_t)(nl - (s->buf + start)) + 1;
        emit_line(rank, s->buf + start, n);
        start += n;
    }
    while (s->len - start >= MAX_LINE) {
        emit_line(rank, s->buf + start, MAX_LINE);
        start += MAX_LINE;
    }
    if (at_eof && s->len > start) {
        emit_line(rank, s->buf + start, s->len - start);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    if (k->broken)
        outlen = 0;
    else
        out_flush(k);
}

static void stream_close(struct stream *s, int rank, struct sink *k)
{
    if (s->fd < 0)
        return;
    stream_emit(s, rank, k, true);
    close(s->fd);
    s->fd = -1;
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
}

enum read_result { RD_DATA, RD_AGAIN, RD_CLOSED };

static enum read_result stream_read(struct stream *s, int rank,
                                    struct sink *k)
{
    ssize_t r;
    if (s->len + READ_CHUNK > s->cap) {
        s->cap = s->len + READ_CHUNK;
        s->buf = xrealloc(s->buf, s->cap);
    }
    do
        r = read(s->fd, s->buf + s->len, READ_CHUNK);
    while (r < 0 && errno == EINTR);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return RD_AGAIN;
    if (r <= 0) {
        stream_close(s, rank, k);
        return RD_CLOSED;
    }
    s->len += (size_t)r;
    stream_emit(s, rank, k, false);
    if (k->broken) {
        /* Our reader went away: let the rank see EPIPE/SIGPIPE as it would
         * writing there itself, rather than run on into a discarding pipe. */
        stream_close(s, rank, k);
        return RD_CLOSED;
    }
    return RD_DATA;
}

/* ------------------------------------------------------------ job */

enum rank_state { R_NONE, R_LIVE, R_DONE };
/* J_FAILING: a rank failed; the others get --stop-delay to notice, print
 * their own errors and exit before J_STOPPING's SIGTERM. */
enum job_state { J_RUNNING, J_FAILING, J_STOPPING, J_KILLED };

struct rank {
    pid_t pid; /* also its process group id */
    enum rank_state state;
    bool group_alive; /* reaped, but its process group still had members */
    struct stream out, err;
};

static struct options opt;
static struct rank *ranks;
static int nstarted;

static struct {
    enum job_state state;
    int live;
    int64_t deadline;   /* --timeout, 0: none */
    int64_t stop_at;    /* J_FAILING: when to send SIGTERM */
    int64_t kill_at;    /* J_STOPPING: when to send SIGKILL */
    int64_t give_up_at; /* J_KILLED: stop waiting for the ranks */
    int first_status;   /* exit status of the first failed rank, -1 none */
    int forced_status;  /* 127/125 for start-up failures, 0 none */
    bool timed_out;
    int sigints;
    /* The first failure was an exit status: said only after REPORT_WAIT,
     * since a rank killed by a signal, whose death the others reacted
     * to, can end a little after them (report_at 0: nothing held). */
    int64_t report_at;
    char report[192];
} job;

/* How long an error exit waits to be named as the job's first failure. */
#define REPORT_WAIT_NS (50 * 1000000LL)

static void report_held(void)
{
    if (!job.report_at)
        return;
    fputs(job.report, stderr);
    job.report_at = 0;
}

static bool group_exists(pid_t pgid)
{
    return kill(-pgid, 0) == 0 || errno == EPERM;
}

/* Signals every live rank's process group; with lingering also the groups
 * of reaped ranks that still had members (their background children). */
static void signal_ranks(int sig, bool lingering)
{
    int i;
    for (i = 0; i < nstarted; i++) {
        struct rank *r = &ranks[i];
        if (r->state == R_LIVE)
            kill(-r->pid, sig);
        else if (r->state == R_DONE && lingering && r->group_alive &&
                 kill(-r->pid, sig) != 0 && errno == ESRCH)
            r->group_alive = false;
    }
}

static bool lingering_groups(void)
{
    bool any = false;
    int i;
    for (i = 0; i < nstarted; i++) {
        struct rank *r = &ranks[i];
        if (r->state == R_DONE && r->group_alive) {
            r->group_alive = group_exists(r->pid);
            any |= r->group_alive;
        }
    }
    return any;
}

static void begin_stop(void)
{
    if (job.state != J_RUNNING && job.state != J_FAILING)
        return;
    job.state = J_STOPPING;
    job.kill_at = now_ns() + secs_to_ns(opt.grace_s);
    signal_ranks(SIGTERM, true);
}

static void kill_all(void)
{
    job.state = J_KILLED;
    job.give_up_at = now_ns() + KILL_WAIT_NS;
    signal_ranks(SIGKILL, true);
}

/* After a rank exited all it wrote is in its pipes: read them empty and
 * close them.  Bounded, as a background child of the rank may keep writing. */
static void drain_rank(struct rank *r, int i)
{
    struct stream *ss[2] = {&r->out, &r->err};
    int k, n;
    for (k = 0; k < 2; k++) {
        for (n = 0; n < DRAIN_READS && ss[k]->fd >= 0; n++)
            if (stream_read(ss[k], i, &sinks[k]) != RD_DATA)
                break;
        stream_close(ss[k], i, &sinks[k]);
    }
}

static void on_exit_status(int i, int st)
{
    struct rank *r = &ranks[i];
    char what[128];
    int code;

    drain_rank(r, i); /* its output comes before our message about it */
    r->state = R_DONE;
    job.live--;
    r->group_alive = group_exists(r->pid);

    if (WIFEXITED(st)) {
        code = WEXITSTATUS(st);
        if (code == 0)
            return;
        snprintf(what, sizeof what, "exited with status %d", code);
    } else if (WIFSIGNALED(st)) {
        int sig = WTERMSIG(st);
        const char *name = strsignal(sig);
        code = 128 + sig;
        snprintf(what, sizeof what, "killed by signal %d (%s)%s", sig,
                 name ? name : "unknown", WCOREDUMP(st) ? ", core dumped" : "");
    } else {
        return;
    }
    if (job.first_status < 0)
        job.first_status = code;
    /* A rank killed by a signal right after another's error exit, which
     * is held still: that exit was the reaction, this the failure. */
    if (job.report_at && WIFSIGNALED(st) && now_ns() < job.report_at) {
        job.report_at = 0;
        job.first_status = code;
        fprintf(stderr, "loomrun: rank %d (pid %d) %s; stopping the other ranks\n", i,
                (int)r->pid, what);
        return;
    }
    /* Ranks that die because we are stopping the job are not news. */
    if (job.state != J_RUNNING)
        return;
    if (opt.keep_going) {
        fprintf(stderr, "loomrun: rank %d (pid %d) %s\n", i, (int)r->pid,
                what);
    } else {
        if (WIFEXITED(st)) {
            snprintf(job.report, sizeof job.report, "loomrun: rank %d (pid %d) %s%s\n", i,
                     (int)r->pid, what, job.live > 0 ? "; stopping the other ranks" : "");
            job.report_at = now_ns() + REPORT_WAIT_NS;
        } else {
            fprintf(stderr, "loomrun: rank %d (pid %d) %s%s\n", i, (int)r->pid,
                    what, job.live > 0 ? "; stopping the other ranks" : "");
        }
        /* The others are likely to see the failure too: let them say so
         * and exit by themselves first, their output read meanwhile. */
        job.state = J_FAILING;
        job.stop_at = now_ns() + secs_to_ns(opt.stop_delay_s);
        if (job.deadline && job.deadline < job.stop_at)
            job.stop_at = job.deadline;
    }
}

static void reap(void)
{
    /* Every rank that has ended, then acted on: a rank killed by a signal
     * first.  When one rank dies and another exits on the error it caused
     * before loomrun looks, both are there at once, in no useful order,
     * and the death is what to report. */
    int *who = xmalloc(sizeof *who * (size_t)(nstarted + 1));
    int *sts = xmalloc(sizeof *sts * (size_t)(nstarted + 1));
    int n = 0;
    for (;;) {
        int st, i;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            break;
        for (i = 0; i < nstarted; i++)
            if (ranks[i].pid == pid && ranks[i].state == R_LIVE)
                break;
        if (i < nstarted && n < nstarted) {
            who[n] = i;
            sts[n++] = st;
        }
    }
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < n; k++)
            if ((WIFSIGNALED(sts[k]) != 0) == (pass == 0))
                on_exit_status(who[k], sts[k]);
    free(who);
    free(sts);
}

static void handle_signals(int sfd)
{
    struct signalfd_siginfo si;
    for (;;) {
        ssize_t r = read(sfd, &si, sizeof si);
        if (r < 0 && errno == EINTR)
            continue;
        if (r != (ssize_t)sizeof si)
            return;
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD)
            continue; /* the main loop reaps every time round */
        if (sig == SIGINT && ++job.sigints >= 2) {
            if (job.state != J_KILLED) {
                fprintf(stderr, "loomrun: interrupted again; killing all "
                                "ranks\n");
                kill_all();
            }
            continue;
        }
        signal_ranks(sig, false);
    }
}

static int ms_until(int64_t t, int64_t now)
{
    int64_t ms;
    if (t <= now)
        return 0;
    ms = (t - now + 999999) / 1000000;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static int min_timeout(int a, int b)
{
    if (a < 0)
        return b;
    if (b < 0)
        return a;
    return a < b ? a : b;
}

static void main_loop(int sfd)
{
    struct pollfd *pfd = xmalloc(sizeof *pfd * (size_t)(2 * opt.nranks + 1));
    int *who = xmalloc(sizeof *who * (size_t)(2 * opt.nranks + 1));

    for (;;) {
        int64_t now;
        int timeout = -1, n = 0, i, rc;

        reap();
        now = now_ns();
        if (job.report_at && (now >= job.report_at || job.live == 0))
            report_held();
        if (job.state == J_RUNNING && job.deadline && now >= job.deadline) {
            job.timed_out = true;
            fprintf(stderr, "loomrun: timed out after %g seconds; stopping "
                            "all ranks\n",
                    opt.timeout_s);
            begin_stop();
        }
        /* Also when all ranks are gone: the groups of exited ranks that
         * still have members (their background children) get stopped. */
        if (job.state == J_FAILING && (job.live == 0 || now >= job.stop_at))
            begin_stop();
        if (job.state == J_STOPPING && now >= job.kill_at)
            kill_all();
        if (job.live == 0 && (job.state == J_RUNNING || !lingering_groups()))
            break;
        if (job.state == J_KILLED && now >= job.give_up_at) {
            for (i = 0; i < nstarted; i++)
                if (ranks[i].state == R_LIVE)
                    fprintf(stderr, "loomrun: rank %d (pid %d) did not exit "
                                    "after SIGKILL; giving up\n",
                            i, (int)ranks[i].pid);
            break;
        }

        if (job.state == J_RUNNING && job.deadline)
            timeout = ms_until(job.deadline, now);
        else if (job.state == J_FAILING)
            timeout = ms_until(job.stop_at, now);
        else if (job.state == J_STOPPING)
            timeout = ms_until(job.kill_at, now);
        else if (job.state == J_KILLED)
            timeout = ms_until(job.give_up_at, now);
        if (job.live == 0) /* only lingering groups: no SIGCHLD for them */
            timeout = min_timeout(timeout, GROUP_POLL_MS);
        if (job.report_at)
            timeout = min_timeout(timeout, ms_until(job.report_at, now));

        pfd[n].fd = sfd;
        pfd[n].events = POLLIN;
        who[n++] = -1;
        for (i = 0; i < nstarted; i++) {
            if (ranks[i].out.fd >= 0) {
                pfd[n].fd = ranks[i].out.fd;
                pfd[n].events = POLLIN;
                who[n++] = 2 * i;
            }
            if (ranks[i].err.fd >= 0) {
                pfd[n].fd = ranks[i].err.fd;
                pfd[n].events = POLLIN;
                who[n++] = 2 * i + 1;
            }
        }

        rc = poll(pfd, (nfds_t)n, timeout);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            fatal("poll: %s", strerror(errno));
        }
        for (i = 1; i < n && rc > 0; i++) {
            if (!pfd[i].revents)
                continue;
            int r = who[i] / 2, k = who[i] % 2;
            struct stream *s = k ? &ranks[r].err : &ranks[r].out;
            if (s->fd >= 0)
                stream_read(s, r, &sinks[k]);
        }
        if (pfd[0].revents)
            handle_signals(sfd);
    }
    free(pfd);
    free(who);
}

/* ------------------------------------------------------------ start */

static int open_output(int rank, const char *ext)
{
    size_t len = strlen(opt.outdir) + 32;
    char *path = xmalloc(len);
    int fd;
    snprintf(path, len, "%s/rank.%d.%s", opt.outdir, rank, ext);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        fprintf(stderr, "loomrun: cannot open '%s': %s\n", path,
                strerror(errno));
    free(path);
    return fd;
}

/* The file execvp(3) would run for name, for the ENOEXEC case below. */
static char *find_on_path(const char *name)
{
    const char *path = getenv("PATH");
    const char *p, *end;

    if (strchr(name, '/'))
        return xstrndup(name, strlen(name));
    if (!path)
        path = "/bin:/usr/bin"; /* glibc's default */
    for (p = path;; p = end + 1) {
        struct stat st;
        size_t dl;
        char *full;
        end = strchr(p, ':');
        if (!end)
            end = p + strlen(p);
        dl = (size_t)(end - p);
        if (asprintf(&full, "%.*s%s%s", (int)dl, p, dl ? "/" : "./", name) < 0)
            fatal("out of memory");
        if (access(full, X_OK) == 0 && stat(full, &st) == 0 &&
            S_ISREG(st.st_mode))
            return full;
        free(full);
        if (*end == '\0')
            return NULL;
    }
}

/* posix_spawnp does not do execvp's fallback for a script without "#!";
 * on ENOEXEC the ranks run /bin/sh FILE ARGS instead, as execvp would. */
static char **script_argv;

static void make_script_argv(void)
{
    int n = 0, k;
    char *file = find_on_path(opt.prog_argv[0]);
    if (!file)
        return;
    while (opt.prog_argv[n])
        n++;
    script_argv = xmalloc(sizeof(char *) * (size_t)(n + 2));
    script_argv[0] = (char *)"/bin/sh";
    script_argv[1] = file;
    for (k = 1; k <= n; k++)
        script_argv[k + 1] = opt.prog_argv[k];
}

/* Starts rank i; false (with a message) if that failed. */
static bool start_rank(int i, char **envp, const posix_spawnattr_t *attr,
                       int nullfd)
{
    posix_spawn_file_actions_t fa;
    int outfd[2] = {-1, -1}, errfd[2] = {-1, -1};
    int child_out = -1, child_err = -1;
    pid_t pid;
    int rc;

    if (opt.prefix) {
        if (pipe2(outfd, O_CLOEXEC) != 0 || pipe2(errfd, O_CLOEXEC) != 0) {
            fprintf(stderr, "loomrun: rank %d: pipe: %s\n", i,
                    strerror(errno));
            goto setup_failed;
        }
        fcntl(outfd[0], F_SETFL, O_NONBLOCK);
        fcntl(errfd[0], F_SETFL, O_NONBLOCK);
        child_out = outfd[1];
        child_err = errfd[1];
    } else if (opt.outdir) {
        child_out = open_output(i, "out");
        if (child_out < 0)
            goto setup_failed;
        child_err = open_output(i, "err");
        if (child_err < 0)
            goto setup_failed;
    }

    posix_spawn_file_actions_init(&fa);
    /* stdin is /dev/null: a rank in a background process group that read
     * the terminal would be stopped by SIGTTIN and hang the job. */
    posix_spawn_file_actions_adddup2(&fa, nullfd, STDIN_FILENO);
    if (child_out >= 0) {
        posix_spawn_file_actions_adddup2(&fa, child_out, STDOUT_FILENO);
        posix_spawn_file_actions_adddup2(&fa, child_err, STDERR_FILENO);
    }
    /* glibc's posix_spawnp reports exec errors synchronously; PROGRAM is
     * looked up on loomrun's PATH, like execvp(3). */
    if (script_argv) {
        rc = posix_spawn(&pid, script_argv[0], &fa, attr, script_argv, envp);
    } else {
        rc = posix_spawnp(&pid, opt.prog_argv[0], &fa, attr, opt.prog_argv,
                          envp);
        if (rc == ENOEXEC) {
            make_script_argv();
            if (script_argv)
                rc = posix_spawn(&pid, script_argv[0], &fa, attr,
                                 script_argv, envp);
        }
    }
    posix_spawn_file_actions_destroy(&fa);

    if (child_out >= 0)
        close(child_out);
    if (child_err >= 0)
        close(child_err);
    if (rc != 0) {
        if (outfd[0] >= 0)
            close(outfd[0]);
        if (errfd[0] >= 0)
            close(errfd[0]);
        fprintf(stderr, "loomrun: rank %d: cannot execute '%s': %s\n", i,
                opt.prog_argv[0], strerror(rc));
        job.forced_status = EXIT_NOEXEC;
        return false;
    }
    ranks[i].pid = pid;
    ranks[i].state = R_LIVE;
    ranks[i].out.fd = outfd[0];
    ranks[i].err.fd = errfd[0];
    nstarted = i + 1;
    job.live++;
    return true;

setup_failed:
    if (outfd[0] >= 0) {
        close(outfd[0]);
        close(outfd[1]);
    }
    if (errfd[0] >= 0) {
        close(errfd[0]);
        close(errfd[1]);
    }
    if (opt.outdir && child_out >= 0)
        close(child_out);
    job.forced_status = EXIT_SETUP;
    return false;
}

/* The entries of the environment rewritten for each rank: the value
 * (11 characters wide) after the name and '='. */
enum { PR_LOOM_RANK, PR_LOOM_LOCAL, PR_RANK, PR_LOCAL, N_PER_RANK };
static const char *const per_rank_vars[N_PER_RANK] = {"LOOM_RANK", "LOOM_LOCAL_RANK", "RANK",
                                                      "LOCAL_RANK"};

/* Environment of the ranks: ours minus the variables we set, then -x,
 * then the job's variables.  The per-rank entries are rewritten in
 * place before each start (posix_spawn has copied them by then). */
static char **build_env(char **owned, int *nowned, char *per_rank[N_PER_RANK])
{
    const char *key_env = getenv("LOOM_JOB_KEY");
    bool x_key = false, x_addr = false, x_port = false;
    size_t nenv = 0, n = 0, i;
    int k;
    char key[33];
    char **envp;

    for (k = 0; k < opt.nx; k++) {
        x_key |= var_is(opt.xvars[k], "LOOM_JOB_KEY");
        x_addr |= var_is(opt.xvars[k], "MASTER_ADDR");
        x_port |= var_is(opt.xvars[k], "MASTER_PORT");
    }
    while (environ[nenv])
        nenv++;
    envp = xmalloc(sizeof(char *) * (nenv + (size_t)opt.nx + N_MANAGED + 1));

    for (i = 0; i < nenv; i++) {
        const char *e = environ[i];
        size_t nl = var_name_len(e);
        bool skip = e[nl] != '=';
        size_t m;
        for (m = 0; m < N_MANAGED && !skip; m++)
            skip = var_is(e, managed_vars[m]);
        for (k = 0; k < opt.nx && !skip; k++)
            skip = var_name_len(opt.xvars[k]) == nl &&
                   strncmp(opt.xvars[k], e, nl) == 0;
        if (!skip)
            envp[n++] = environ[i];
    }
    /* The last -x for a name wins. */
    for (k = 0; k < opt.nx; k++) {
        size_t nl = var_name_len(opt.xvars[k]);
        int later;
        bool dup = false;
        for (later = k + 1; later < opt.nx && !dup; later++)
            dup = var_name_len(opt.xvars[later]) == nl &&
                  strncmp(opt.xvars[later], opt.xvars[k], nl) == 0;
        if (!dup)
            envp[n++] = (char *)opt.xvars[k];
    }

    if (!key_env || !*key_env) { /* an inherited key is kept */
        make_job_key(key);
        key_env = key;
    }
    int port = opt.root_port > 0 ? opt.root_port
                                 : find_free_port(opt.bind_host);
#define ADD_OWNED(...)                                                         \
    do {                                                                       \
        if (asprintf(&owned[*nowned], __VA_ARGS__) < 0)                        \
            fatal("out of memory");                                            \
        envp[n++] = owned[(*nowned)++];                                        \
    } while (0)
    ADD_OWNED("LOOM_ROOT=%s:%d", opt.root_host, port);
    ADD_OWNED("LOOM_SIZE=%d", opt.nranks);
    ADD_OWNED("LOOM_LOCAL_SIZE=%d", opt.nranks);
    if (!x_key)
        ADD_OWNED("LOOM_JOB_KEY=%s", key_env);
    /* torch's env:// store listens on MASTER_PORT in rank 0: another port
     * than Loom's root, which a rank may open too.  With --root's port,
     * the next one (the host may not be this one's to probe). */
    if (!x_addr)
        ADD_OWNED("MASTER_ADDR=%s", opt.bind_host);
    if (!x_port) {
        int mport;
        if (opt.root_port > 0) {
            mport = port < 65535 ? port + 1 : port - 1;
        } else {
            mport = find_free_port(opt.bind_host);
            for (int tries = 0; mport == port && tries < 8; tries++)
                mport = find_free_port(opt.bind_host);
        }
        ADD_OWNED("MASTER_PORT=%d", mport);
    }
    ADD_OWNED("WORLD_SIZE=%d", opt.nranks);
    ADD_OWNED("LOCAL_WORLD_SIZE=%d", opt.nranks);
    for (int v = 0; v < N_PER_RANK; v++) {
        ADD_OWNED("%s=%-11d", per_rank_vars[v], 0);
        per_rank[v] = envp[n - 1] + strlen(per_rank_vars[v]) + 1;
    }
#undef ADD_OWNED
    envp[n] = NULL;
    return envp;
}

int main(int argc, char **argv)
{
    static const int forwarded[] = {SIGINT,  SIGTERM, SIGHUP,
                                    SIGQUIT, SIGUSR1, SIGUSR2};
    sigset_t handled, orig_mask, child_default;
    posix_spawnattr_t attr;
    struct sigaction sa;
    char *owned[N_MANAGED];
    int nowned = 0, sfd, nullfd, i, status;
    char *per_rank[N_PER_RANK];
    char **envp;

    parse_args(argc, argv, &opt);
    ensure_std_fds();
    if (opt.prefix)
        ensure_fd_limit(opt.nranks);

    /* Signals become events on a signalfd.  One that was ignored when we
     * started (nohup, a shell's background job) stays ignored, for us and
     * for the ranks, as a shell would do. */
    sigemptyset(&handled);
    sigaddset(&handled, SIGCHLD);
    for (i = 0; i < (int)(sizeof forwarded / sizeof forwarded[0]); i++) {
        if (sigaction(forwarded[i], NULL, &sa) == 0 &&
            sa.sa_handler != SIG_IGN)
            sigaddset(&handled, forwarded[i]);
    }
    sigemptyset(&child_default);
    if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler != SIG_IGN)
        sigaddset(&child_default, SIGPIPE);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL; /* SIG_IGN here would make waitpid() fail */
    sigaction(SIGCHLD, &sa, NULL);
    sigaddset(&child_default, SIGCHLD);
    sa.sa_handler = SIG_IGN; /* a closed stdout must not kill the job */
    sigaction(SIGPIPE, &sa, NULL);
    sigprocmask(SIG_BLOCK, &handled, &orig_mask);
    sfd = signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        fatal("signalfd: %s", strerror(errno));

    nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (nullfd < 0)
        fatal("cannot open /dev/null: %s", strerror(errno));
    if (opt.outdir)
        make_dirs(opt.outdir);
    envp = build_env(owned, &nowned, per_rank);

    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP |
                                        POSIX_SPAWN_SETSIGMASK |
                                        POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(&attr, 0); /* ^C reaches loomrun only */
    posix_spawnattr_setsigmask(&attr, &orig_mask);
    posix_spawnattr_setsigdefault(&attr, &child_default);

    ranks = calloc((size_t)opt.nranks, sizeof *ranks);
    if (!ranks)
        fatal("out of memory");
    for (i = 0; i < opt.nranks; i++)
        ranks[i].out.fd = ranks[i].err.fd = -1;
    job.first_status = -1;
    if (opt.timeout_s > 0)
        job.deadline = now_ns() + secs_to_ns(opt.timeout_s);

    /* --bind: a rank inherits the CPU set loomrun has when it starts it. */
    cpu_set_t allowed;
    int ncpu = 0, cpus[CPU_SETSIZE];
    if (opt.bind && sched_getaffinity(0, sizeof allowed, &allowed) == 0)
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &allowed)) cpus[ncpu++] = c;
    for (i = 0; i < opt.nranks; i++) {
        for (int v = 0; v < N_PER_RANK; v++)
            snprintf(per_rank[v], 12, "%d", i);
        if (ncpu) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpus[i % ncpu], &one);
            if (sched_setaffinity(0, sizeof one, &one) != 0)
                fprintf(stderr, "loomrun: --bind: rank %d to CPU %d: %s\n", i, cpus[i % ncpu],
                        strerror(errno));
        }
        bool started = start_rank(i, envp, &attr, nullfd);
        if (ncpu) sched_setaffinity(0, sizeof allowed, &allowed);
        if (!started) {
            begin_stop();
            break;
        }
    }
    close(nullfd);
    posix_spawnattr_destroy(&attr);

    main_loop(sfd);

    for (i = 0; i < nstarted; i++) {
        stream_close(&ranks[i].out, i, &sinks[0]);
        stream_close(&ranks[i].err, i, &sinks[1]);
    }
    close(sfd);

    if (job.forced_status)
        status = job.forced_status;
    else if (job.timed_out)
        status = EXIT_TIMEOUT;
    else if (job.first_status >= 0)
        status = job.first_status;
    else
        status = 0;

    for (i = 0; i < nowned; i++)
        free(owned[i]);
    free(envp);
    free(ranks);
    free(outbuf);
    free(opt.xvars);
    if (script_argv) {
        free(script_argv[1]);
        free(script_argv);
    }
    free(opt.root_host);
    free(opt.bind_host);
    return status;
}
