/*
 * crash.h - what a test process leaves behind when it crashes.
 *
 * crash_setup() installs a handler for SIGSEGV, SIGBUS, SIGFPE, SIGILL
 * and SIGABRT that writes to standard error
 *   "CRASH pid P signal S (NAME)"
 * then a backtrace of every thread (gdb attached to the process, where
 * gdb is installed), else of the crashing thread alone (glibc's
 * backtrace), and then lets the signal kill the process, so that its
 * exit status says so and a core is written where the limits allow it:
 * into DIR/core.PID/ when LOOM_TEST_CORE_DIR=DIR names a directory and
 * the kernel's core_pattern is a relative name (the default, "core").
 *
 * Built with AddressSanitizer, the sanitizer's own report does this for
 * SIGSEGV, SIGBUS and SIGFPE (and its exit status is 1, with
 * "ERROR: AddressSanitizer" on standard error): only SIGILL and SIGABRT
 * get this handler then.
 *
 * Everything the handler needs is prepared by crash_setup(); the handler
 * itself calls only fork, exec, wait, write, mkdir, chdir and the like.
 */
#ifndef LOOM_TEST_CRASH_H
#define LOOM_TEST_CRASH_H

#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define CRASH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CRASH_ASAN 1
#endif
#endif
#ifndef CRASH_ASAN
#define CRASH_ASAN 0
#endif

static char crash_gdb[64];       /* path of gdb, or "" */
static char crash_pid[24];       /* this process, in decimal */
static char crash_core[4096];    /* DIR/core.PID, or "" */

static void crash_puts(const char *s)
{
    size_t n = strlen(s);
    while (n) {
        ssize_t w = write(2, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static void crash_handler(int sig)
{
    char line[96];
    /* Decimal by hand: snprintf is not async-signal-safe. */
    char num[8];
    int k = 0, v = sig;
    do num[k++] = (char)('0' + v % 10); while ((v /= 10) && k < 7);
    char rev[8];
    for (int i = 0; i < k; i++) rev[i] = num[k - 1 - i];
    rev[k] = 0;
    const char *name = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS"
                     : sig == SIGFPE  ? "SIGFPE"  : sig == SIGILL ? "SIGILL"
                     : sig == SIGABRT ? "SIGABRT" : "?";
    line[0] = 0;
    strcat(line, "CRASH pid ");
    strcat(line, crash_pid);
    strcat(line, " signal ");
    strcat(line, rev);
    strcat(line, " (");
    strcat(line, name);
    strcat(line, ")\n");
    crash_puts(line);
    int shown = 0;
    if (crash_gdb[0]) {
        pid_t c = fork();
        if (c == 0) {
            dup2(2, 1);
            execl(crash_gdb, "gdb", "-nx", "-batch", "-p", crash_pid, "-ex",
                  "thread apply all bt", (char *)NULL);
            _exit(127);
        }
        int st = 0;
        if (c > 0 && waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0) shown = 1;
    }
    if (!shown) {
        void *fr[64];
        int n = backtrace(fr, 64);
        crash_puts("backtrace of the crashing thread:\n");
        backtrace_symbols_fd(fr, n, 2);
    }
    if (crash_core[0] && mkdir(crash_core, 0700) == 0) {
        if (chdir(crash_core) != 0) crash_puts("crash: cannot enter the core directory\n");
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void crash_setup(void)
{
    snprintf(crash_pid, sizeof crash_pid, "%d", (int)getpid());
    const char *g[] = {"/usr/bin/gdb", "/usr/local/bin/gdb", "/bin/gdb"};
    crash_gdb[0] = 0;
    for (size_t i = 0; i < sizeof g / sizeof *g; i++)
        if (access(g[i], X_OK) == 0) {
            snprintf(crash_gdb, sizeof crash_gdb, "%s", g[i]);
            break;
        }
    const char *d = getenv("LOOM_TEST_CORE_DIR");
    crash_core[0] = 0;
    if (d && *d) snprintf(crash_core, sizeof crash_core, "%s/core.%d", d, (int)getpid());
    /* The first backtrace() loads libgcc: not in the handler. */
    void *fr[2];
    backtrace(fr, 2);
    int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        if (CRASH_ASAN && (sigs[i] == SIGSEGV || sigs[i] == SIGBUS || sigs[i] == SIGFPE)) continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = crash_handler;
        sigemptyset(&sa.sa_mask);
        /* One crash at a time: a second thread's waits for the first. */
        for (size_t j = 0; j < sizeof sigs / sizeof *sigs; j++) sigaddset(&sa.sa_mask, sigs[j]);
        sigaction(sigs[i], &sa, NULL);
    }
}

#endif
