/*
 * loomrun_opts.c - loomrun's command line and the ranks' environment:
 * usage, parsing and checking the options (-n, --root, -x, ...), the
 * job key and free ports, and the environment each rank starts with.
 * Process supervision is in loomrun.c.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* pipe2, signalfd, asprintf, strsignal */
#endif
#ifdef HAVE_CONFIG_H
#include "config.h" /* PACKAGE_VERSION in the autotools build */
#endif
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tools/loomrun.h"

#ifndef LOOMRUN_VERSION
#ifdef PACKAGE_VERSION
#define LOOMRUN_VERSION PACKAGE_VERSION
#else
#define LOOMRUN_VERSION "0.1.0"
#endif
#endif

/* ------------------------------------------------------------ options */

struct options opt;

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

void fatal(const char *fmt, ...)
{
    va_list ap;
    fputs("loomrun: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(EXIT_SETUP);
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        fatal("out of memory");
    return p;
}

void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        fatal("out of memory");
    return p;
}

char *xstrndup(const char *s, size_t n)
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

/* The value of a duration option (--timeout, --stop-delay, --grace), or
 * a usage error naming the option; note ends the error's text. */
static void need_seconds(const char *val, double *out, const char *opt, const char *note)
{
    if (!parse_seconds(val, out))
        usage_error("invalid value '%s' for %s: expected a number of seconds >= 0%s", val, opt,
                    note);
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

void parse_args(int argc, char **argv, struct options *o)
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

        /* One case per option, alike on purpose: each names its own
         * option and what it expects in its usage error. */
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
            need_seconds(val, &o->timeout_s, "--timeout", " (0: no timeout)");
            break;
        case O_STOP_DELAY:
            need_seconds(val, &o->stop_delay_s, "--stop-delay", "");
            break;
        case O_GRACE:
            need_seconds(val, &o->grace_s, "--grace", "");
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

/* ------------------------------------------------------------ environment */

static const char *const per_rank_vars[N_PER_RANK] = {"LOOM_RANK", "LOOM_LOCAL_RANK", "RANK",
                                                      "LOCAL_RANK"};

/* Environment of the ranks: ours minus the variables we set, then -x,
 * then the job's variables.  The per-rank entries are rewritten in
 * place before each start (posix_spawn has copied them by then). */
char **build_env(char **owned, int *nowned, char *per_rank[N_PER_RANK])
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
