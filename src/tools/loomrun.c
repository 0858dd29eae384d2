/*
 * loomrun.c - the local launcher: starts N ranks of a program on this host
 * with the Loom bootstrap environment (LOOM_ROOT, LOOM_RANK, ...), forwards
 * signals to them and stops the job when one of them fails.
 *
 * Single-threaded on purpose: child output, child exits, signals (through a
 * signalfd) and deadlines are all handled in one poll() loop, so nothing
 * runs in signal-handler context.  Needs only libc (Linux, glibc >= 2.25).
 *
 * This file supervises the ranks: starting them, their output, signals,
 * exits and the job's stop; the command line and the ranks' environment
 * are in loomrun_opts.c, what both use in loomrun.h.
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
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/loomrun.h"

#define READ_CHUNK 65536
#define MAX_LINE 65536            /* longer lines are split, to bound memory */
#define DRAIN_READS 256           /* per stream after its rank exited */
#define KILL_WAIT_NS 5000000000LL /* after SIGKILL, before giving up */
#define GROUP_POLL_MS 50

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
