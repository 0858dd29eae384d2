/*
 * loomrun.h - shared by loomrun's files only: the options, the job's
 * variables, the exit statuses, and what loomrun.c (process supervision)
 * uses of loomrun_opts.c (options, environment, fatal errors).
 */
#ifndef LOOMRUN_H
#define LOOMRUN_H

#include <stdbool.h>
#include <stddef.h>

#define MAX_RANKS 4096
#define EXIT_USAGE 2
#define EXIT_SETUP 125 /* loomrun itself failed, as env(1)/timeout(1) do */
#define EXIT_TIMEOUT 124
#define EXIT_NOEXEC 127

extern char **environ;

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

/* The options, as parse_args left them (loomrun_opts.c). */
extern struct options opt;

/* The job's variables: Loom's, and those of torch's env:// rendezvous
 * (torch.distributed.init_process_group), which a rank's torch store
 * uses.  LOOM_JOB_KEY, MASTER_ADDR and MASTER_PORT may be set with -x. */
static const char *const managed_vars[] = {
    "LOOM_ROOT",       "LOOM_RANK",    "LOOM_SIZE",   "LOOM_LOCAL_RANK",
    "LOOM_LOCAL_SIZE", "LOOM_JOB_KEY", "MASTER_ADDR", "MASTER_PORT",
    "RANK",            "WORLD_SIZE",   "LOCAL_RANK",  "LOCAL_WORLD_SIZE",
};
#define N_MANAGED (sizeof managed_vars / sizeof managed_vars[0])

/* The entries of the environment rewritten for each rank: the value
 * (11 characters wide) after the name and '='. */
enum { PR_LOOM_RANK, PR_LOOM_LOCAL, PR_RANK, PR_LOCAL, N_PER_RANK };

/* loomrun_opts.c: the command line into o (exits on a usage error);
 * the ranks' environment (see there); a fatal error (exit 125) and the
 * allocations that make "out of memory" one. */
void parse_args(int argc, char **argv, struct options *o);
char **build_env(char **owned, int *nowned, char *per_rank[N_PER_RANK]);
void fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
void *xmalloc(size_t n);
void *xrealloc(void *p, size_t n);
char *xstrndup(const char *s, size_t n);

#endif
