/*
 * mp_stops.c - one process of the scenario tests (test_stops.sh): ranks
 * that the driver stops (SIGSTOP), continues (SIGCONT) and kills
 * (SIGKILL) on a fixed schedule, or that kill themselves inside a
 * shrink, a grow or a state sync.
 *
 * usage: mp_stops member DIR    (a rank started by loomrun)
 *        mp_stops join DIR      (a process that enters with loom_comm_join)
 *
 * Every process loops steps until the driver creates DIR/stop (the ranks
 * agree on the step to stop at).  A step is
 *   - an allreduce of 65,537 floats (the automatic algorithm), whose sum
 *     it knows, checked element by element;
 *   - an allreduce of STOPS_BIG floats (default 262,147: just over 1 MiB)
 *     forced to the shared-memory algorithm ("allreduce:shared"),
 *     checked;
 *   - a check that every rank ends the step with the same bytes (the
 *     digest of both results: minimum and maximum over the ranks agree);
 *   - with STOPS_GROW=1, whether someone waits to join (allreduce of
 *     loom_comm_pending_joins), then loom_comm_grow and loom_state_sync;
 *   - at step STOPS_SYNC_STEP (if set), a loom_state_sync of everyone.
 * When a call fails, the process checks that its result is one the man
 * pages give for that call.  Every step ends with loom_comm_agree on
 * whether it succeeded on every rank; if not, the ranks shrink, check the
 * new communicator (a majority of the old one: more than half of it, or
 * exactly half with the old rank 0; loom_comm_get_failed agreeing with
 * its size), sync the state and the step's number, and redo the step.
 *
 * The shared state is one tensor of STOPS_STATE_MIB MiB (default 1) whose
 * bytes are a function of the revision: every rank starts at revision 7
 * (STOPS_OLD lists original ranks that start at 6, with revision 6's
 * bytes), a newcomer at 0 with zeros.  After every successful sync the
 * process checks that its bytes are those of the revision it got.
 *
 * STOPS_DIE=PHASE:RANKS:MS (PHASE shrink, grow or sync; RANKS a
 * comma-separated list of original ranks): those ranks SIGKILL themselves
 * MS milliseconds after they enter their first call of PHASE (from a
 * thread, so it happens inside the call if the call lasts that long).
 * STOPS_KILL_ON_RECEIVE=R:RANKS: original rank R SIGKILLs those ranks as
 * soon as bytes arrive in its state during the scheduled sync.
 * STOPS_KILL_IN=PHASE:R:MS:TARGETS: original rank R SIGKILLs TARGETS
 * (original ranks, or "j": the joiners) MS milliseconds into its first
 * call of PHASE.
 *
 * Files: DIR/pid.R (the pid, once the communicator exists; R is the
 * original rank, or jPID for a joiner), DIR/phase.R (what the process is
 * doing now, for the driver to read while the process is stopped), and
 * one line on standard output per event; the last line is one of
 *   END orig=R rank=r size=n steps=S shrinks=K grows=G wrong=0 diverged=0 state=ok|none
 *       exit 0: stopped with the others at DIR/stop
 *   LEFT orig=R call=C result=NAME (message)
 *       exit 3: loom_comm_agree or loom_comm_shrink (or loom_comm_join)
 *       refused this process; man pages: a rank that the others declared
 *       failed, or that is in no majority, gets LOOM_ERR_REVOKED and must
 *       leave the job
 *   MINORITY orig=R size=k of=n
 *       exit 4: a shrink gave a communicator that is not a majority of
 *       the one it shrank from (a partitioned job's minority went on)
 *   BAD orig=R what...
 *       exit 1: a wrong result, ranks that disagree, a result the man
 *       page does not give for that call, or a state that does not match
 *       its revision
 * and the process is never killed by a signal it did not send itself.
 * Crashes print a backtrace (crash.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "crash.h"
#include "loom.h"

#define SMALL 65537u

static const char *dir;
static char me[32];      /* "orig=R" */
static int orig = -1;    /* original rank; -1 for a joiner */
static double t_start;
static char *phase_map;  /* DIR/phase.R, mapped */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void phase(const char *what, uint64_t step)
{
    if (!phase_map) return;
    char b[64];
    int n = snprintf(b, sizeof b, "%s %llu\n", what, (unsigned long long)step);
    memset(phase_map, ' ', 64);
    memcpy(phase_map, b, (size_t)n < 64 ? (size_t)n : 64);
}

static void event(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void event(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("t=%.0f %s ", now_ms() - t_start, me);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

/* ------------------------------------------------------------- dying */

static struct {
    char phase[16];
    int ranks[16], n;
    int ms;
    int armed;
} die;

static void *die_later(void *arg)
{
    int ms = *(int *)arg;
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    kill(getpid(), SIGKILL);
    return NULL;
}

/* STOPS_KILL_IN=PHASE:R:MS:TARGETS: original rank R, MS milliseconds
 * after it enters its first call of PHASE, SIGKILLs TARGETS: original
 * ranks, or "j" for every joiner the driver started (DIR/join.N.pid). */
static struct {
    char phase[16], targets[64];
    int rank, ms, armed;
} kin = {.rank = -1};

static void kill_file(const char *path)
{
    FILE *f = fopen(path, "r");
    int pid = 0;
    if (f && fscanf(f, "%d", &pid) == 1 && pid > 0) kill(pid, SIGKILL);
    if (f) fclose(f);
}

static void *kill_later(void *arg)
{
    (void)arg;
    struct timespec ts = {kin.ms / 1000, (long)(kin.ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    char p[4096];
    for (const char *t = kin.targets; *t;) {
        if (*t == 'j') {
            for (int j = 0; j < 64; j++) {
                snprintf(p, sizeof p, "%s/join.%d.pid", dir, j);
                kill_file(p);
            }
        } else {
            snprintf(p, sizeof p, "%s/pid.%d", dir, atoi(t));
            kill_file(p);
        }
        t = strchr(t, ',');
        if (!t) break;
        t++;
    }
    event("KILLED %s, %d ms into %s", kin.targets, kin.ms, kin.phase);
    return NULL;
}

/* Entering PHASE: arm the kill if this process is to die in it. */
static void maybe_die(const char *ph)
{
    if (!kin.armed && kin.rank == orig && orig >= 0 && !strcmp(kin.phase, ph)) {
        kin.armed = 1;
        pthread_t t;
        if (pthread_create(&t, NULL, kill_later, NULL) == 0) pthread_detach(t);
    }
    if (die.armed || strcmp(die.phase, ph)) return;
    int mine = 0;
    for (int i = 0; i < die.n; i++) mine |= die.ranks[i] == orig;
    if (!mine) return;
    die.armed = 1;
    event("DIE in %s after %d ms", ph, die.ms);
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (die.ms <= 0) kill(getpid(), SIGKILL);
    pthread_create(&t, &a, die_later, &die.ms);
    pthread_attr_destroy(&a);
}

static void parse_kill_in(void)
{
    const char *s = getenv("STOPS_KILL_IN");
    if (!s) return;
    char ph[16], tg[64];
    int r, ms;
    if (sscanf(s, "%15[^:]:%d:%d:%63s", ph, &r, &ms, tg) != 4) return;
    snprintf(kin.phase, sizeof kin.phase, "%s", ph);
    snprintf(kin.targets, sizeof kin.targets, "%s", tg);
    kin.rank = r;
    kin.ms = ms;
}

static void parse_die(void)
{
    const char *s = getenv("STOPS_DIE");
    if (!s || !*s) return;
    const char *c1 = strchr(s, ':');
    const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) return;
    snprintf(die.phase, sizeof die.phase, "%.*s", (int)(c1 - s), s);
    for (const char *p = c1 + 1; p < c2 && die.n < 16;) {
        die.ranks[die.n++] = atoi(p);
        const char *comma = strchr(p, ',');
        if (!comma || comma > c2) break;
        p = comma + 1;
    }
    die.ms = atoi(c2 + 1);
}

/* --------------------------------------------------------- the state */

static uint64_t rev;
static unsigned char *state;
static size_t state_bytes;
static int state_ok; /* the bytes are rev's */

static unsigned char state_byte(uint64_t r, size_t i)
{
    return (unsigned char)(i * 7u + (size_t)r * 13u + 1u);
}

static void state_fill(uint64_t r)
{
    for (size_t i = 0; i < state_bytes; i++) state[i] = state_byte(r, i);
}

static size_t state_wrong(uint64_t r)
{
    size_t w = 0;
    for (size_t i = 0; i < state_bytes; i++) w += state[i] != state_byte(r, i);
    return w;
}

/* ------------------------------------------------------------ checks */

static const char *rname(loom_result_t r)
{
    switch (r) {
    case LOOM_SUCCESS: return "LOOM_SUCCESS";
    case LOOM_ERR_REMOTE: return "LOOM_ERR_REMOTE";
    case LOOM_ERR_REVOKED: return "LOOM_ERR_REVOKED";
    case LOOM_ERR_TIMEOUT: return "LOOM_ERR_TIMEOUT";
    case LOOM_ERR_CONNECT: return "LOOM_ERR_CONNECT";
    case LOOM_ERR_MISMATCH: return "LOOM_ERR_MISMATCH";
    case LOOM_ERR_INVALID_USAGE: return "LOOM_ERR_INVALID_USAGE";
    case LOOM_ERR_INVALID_ARGUMENT: return "LOOM_ERR_INVALID_ARGUMENT";
    case LOOM_ERR_INTERNAL: return "LOOM_ERR_INTERNAL";
    default: return loom_strerror(r);
    }
}

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("BAD %s ", me);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    return 1;
}

/* Results the man pages give for a call on a communicator that lost a
 * rank (loom(7) FAILURE MODEL; loom_comm_shrink(3), loom_comm_grow(3),
 * loom_state_sync(3)).  LOOM_ERR_TIMEOUT would take LOOM_TIMEOUT (60 s
 * here) without progress: not documented for these runs' failures. */
static int documented(const char *call, loom_result_t r)
{
    if (r == LOOM_ERR_REMOTE || r == LOOM_ERR_REVOKED) return 1;
    (void)call;
    return 0;
}

static uint64_t digest(const void *p, size_t n, uint64_t h)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* -------------------------------------------------------------- loop */

struct run {
    loom_comm_t comm;
    uint64_t step;
    long shrinks, grows, wrong, diverged;
    float *small, *big;
    size_t nbig;
    int grow, sync_step;
    int resync;
};

static int stopping(void)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/stop", dir);
    return access(p, F_OK) == 0;
}

/* STOPS_KILL_ON_RECEIVE=R:LIST: during its scheduled sync, original rank
 * R watches its own state; as soon as bytes start to arrive it SIGKILLs
 * the original ranks in LIST (their pids from DIR/pid.N): donors killed
 * while a receiver receives, whatever the timing. */
static struct {
    int watcher, victims[16], nv;
    volatile int on;
    uint64_t old_rev;
    double t0;
} krecv = {.watcher = -1};

static void *watch_receive(void *arg)
{
    (void)arg;
    while (krecv.on) {
        for (size_t i = 0; i < state_bytes; i += 4096)
            if (state[i] != state_byte(krecv.old_rev, i)) {
                char list[128] = "";
                for (int k = 0; k < krecv.nv; k++) {
                    char p[4096];
                    snprintf(p, sizeof p, "%s/pid.%d", dir, krecv.victims[k]);
                    FILE *f = fopen(p, "r");
                    int pid = 0;
                    if (f && fscanf(f, "%d", &pid) == 1 && pid > 0) kill(pid, SIGKILL);
                    if (f) fclose(f);
                    snprintf(list + strlen(list), sizeof list - strlen(list), " %d",
                             krecv.victims[k]);
                }
                event("KILLED%s: bytes arriving at offset %zu, %.1f ms into the sync", list, i,
                      now_ms() - krecv.t0);
                return NULL;
            }
        usleep(50);
    }
    return NULL;
}

static void parse_krecv(void)
{
    const char *s = getenv("STOPS_KILL_ON_RECEIVE");
    if (!s || !strchr(s, ':')) return;
    krecv.watcher = atoi(s);
    for (const char *p = strchr(s, ':') + 1; p && *p && krecv.nv < 16;) {
        krecv.victims[krecv.nv++] = atoi(p);
        p = strchr(p, ',');
        if (p) p++;
    }
}

static loom_result_t sync_state(struct run *R, const char *why)
{
    loom_tensor_t t[2] = {{state, state_bytes}, {&R->step, sizeof R->step}};
    uint64_t before = rev;
    phase("sync", R->step);
    maybe_die("sync");
    double t0 = now_ms();
    pthread_t watch;
    int watching = 0;
    if (krecv.watcher == orig && !strcmp(why, "scheduled") && state_ok && rev) {
        krecv.watcher = -2; /* once */
        krecv.old_rev = rev;
        krecv.t0 = t0;
        krecv.on = 1;
        watching = pthread_create(&watch, NULL, watch_receive, NULL) == 0;
    }
    loom_result_t r = loom_state_sync(R->comm, t, 2, &rev);
    double dt = now_ms() - t0;
    if (watching) {
        krecv.on = 0;
        pthread_join(watch, NULL);
    }
    if (r == LOOM_ERR_INVALID_USAGE && rev == LOOM_REVISION_NONE) {
        /* loom_state_sync(3): every rank passed LOOM_REVISION_NONE, the
         * state is lost everywhere.  The job starts it over. */
        event("sync (%s): no rank holds a state (%s); starting over from nothing", why,
              loom_get_last_error());
        rev = 0;
        memset(state, 0, state_bytes);
        state_ok = 0;
        return LOOM_SUCCESS;
    }
    if (r != LOOM_SUCCESS) {
        event("ERR sync (%s) after %.0f ms: %s (%s); revision %llu", why, dt, rname(r),
              loom_get_last_error(), (unsigned long long)rev);
        state_ok = 0;
        return r;
    }
    /* A revision that can never win (what a failed sync leaves) is no
     * state at all. */
    if (rev == LOOM_REVISION_NONE) {
        state_ok = 0;
        event("sync (%s) ok in %.0f ms, but no revision", why, dt);
        return LOOM_SUCCESS;
    }
    size_t w = rev ? state_wrong(rev) : 0;
    if ((rev < before && before != LOOM_REVISION_NONE) || w) {
        R->wrong++;
        bad("state sync (%s) succeeded with revision %llu (had %llu) and %zu wrong bytes", why,
            (unsigned long long)rev, (unsigned long long)before, w);
        return LOOM_ERR_INTERNAL;
    }
    state_ok = rev != 0;
    event("sync (%s) ok in %.0f ms, revision %llu", why, dt, (unsigned long long)rev);
    return LOOM_SUCCESS;
}

/* One allreduce whose sum is known: each rank adds (rank+1)*(v_i). */
static loom_result_t checked(struct run *R, float *x, size_t n, int shared)
{
    int rank, size;
    loom_comm_rank(R->comm, &rank);
    loom_comm_size(R->comm, &size);
    float k = (float)(R->step % 5);
    for (size_t i = 0; i < n; i++) x[i] = (float)(rank + 1) * ((float)(i % 13) + 1 + k);
    if (shared) loom_comm_set_algo(R->comm, "allreduce:shared");
    phase(shared ? "big-shared-allreduce" : "allreduce", R->step);
    loom_result_t r = loom_allreduce(x, x, n, LOOM_FLOAT32, LOOM_SUM, R->comm);
    if (shared) loom_comm_set_algo(R->comm, NULL);
    if (r != LOOM_SUCCESS) return r;
    float tri = (float)size * (float)(size + 1) / 2;
    for (size_t i = 0; i < n; i++)
        if (x[i] != tri * ((float)(i % 13) + 1 + k)) {
            R->wrong++;
            bad("wrong %s allreduce of %zu at step %llu: [%zu] %g, expected %g",
                shared ? "shared" : "automatic", n, (unsigned long long)R->step, i, (double)x[i],
                (double)(tri * ((float)(i % 13) + 1 + k)));
            return LOOM_ERR_INTERNAL;
        }
    return r;
}

/* One step; LOOM_ERR_INTERNAL means a wrong result (already reported).
 * The step's number is part of the shared state: a newcomer takes it
 * from the members when it syncs. */
static loom_result_t step(struct run *R, const char **call, int *stop)
{
    *call = "loom_allreduce";
    loom_result_t r = checked(R, R->small, SMALL, 0);
    if (r == LOOM_SUCCESS) r = checked(R, R->big, R->nbig, 1);
    if (r != LOOM_SUCCESS) return r;
    uint64_t d = digest(R->small, SMALL * sizeof(float), 1469598103934665603ull);
    d = digest(R->big, R->nbig * sizeof(float), d);
    uint64_t hi = d, lo = d;
    phase("digest", R->step);
    r = loom_allreduce(&hi, &hi, 1, LOOM_UINT64, LOOM_MAX, R->comm);
    if (r == LOOM_SUCCESS) r = loom_allreduce(&lo, &lo, 1, LOOM_UINT64, LOOM_MIN, R->comm);
    if (r != LOOM_SUCCESS) return r;
    if (hi != d || lo != d) {
        R->diverged++;
        bad("ranks ended step %llu with different bytes", (unsigned long long)R->step);
        return LOOM_ERR_INTERNAL;
    }
    /* Whether to stop, and whether someone waits to join: the same
     * answer on every rank. */
    int v[2] = {stopping(), 0};
    if (R->grow) {
        loom_comm_pending_joins(R->comm, &v[1]);
        v[1] = v[1] > 0;
    }
    phase("stop?", R->step);
    r = loom_allreduce(v, v, 2, LOOM_INT32, LOOM_MAX, R->comm);
    if (r != LOOM_SUCCESS) return r;
    *stop = v[0];
    if (v[0]) return r;
    R->step++; /* the step is done; what follows belongs between steps */
    if (v[1]) {
        *call = "loom_comm_grow";
        loom_comm_t big = NULL;
        phase("grow", R->step);
        maybe_die("grow");
        r = loom_comm_grow(R->comm, &big);
        if (r != LOOM_SUCCESS) return r;
        if (big) {
            int n;
            loom_comm_size(big, &n);
            event("grow ok size %d", n);
            loom_comm_destroy(R->comm);
            R->comm = big;
            R->grows++;
            *call = "loom_state_sync";
            r = sync_state(R, "after grow");
            if (r != LOOM_SUCCESS) return r;
        }
    }
    if (R->sync_step >= 0 && R->step == (uint64_t)R->sync_step) {
        *call = "loom_state_sync";
        r = sync_state(R, "scheduled");
    }
    return r;
}

/* Every step ends with the ranks agreeing (loom_comm_agree) on whether it
 * succeeded everywhere; if not, they shrink and redo it.  R->resync: the
 * step starts with a state sync (1: a newcomer's, with the members' sync
 * after their grow; 2: after a shrink, everyone's, then the step number
 * agreed, whatever a failed sync left of it). */
static int loop(struct run *R)
{
    for (;;) {
        const char *call = "";
        int stop = 0;
        loom_result_t r = LOOM_SUCCESS;
        if (R->resync) {
            call = "loom_state_sync";
            r = sync_state(R, R->resync == 1 ? "newcomer" : "after shrink");
            if (r == LOOM_ERR_INTERNAL) return 1;
            if (r == LOOM_SUCCESS && R->resync == 2) {
                call = "loom_allreduce";
                uint64_t st = R->step;
                r = loom_allreduce(&st, &st, 1, LOOM_UINT64, LOOM_MAX, R->comm);
                if (r == LOOM_SUCCESS) R->step = st;
            }
        }
        /* A newcomer's sync was the end of the members' step. */
        if (r == LOOM_SUCCESS && R->resync != 1) r = step(R, &call, &stop);
        if (r == LOOM_ERR_INTERNAL) return 1;
        const char *msg = loom_get_last_error();
        if (r != LOOM_SUCCESS) {
            event("ERR %s at step %llu: %s (%s)", call, (unsigned long long)R->step, rname(r),
                  msg);
            if (!documented(call, r))
                return bad("%s failed with %s, which its man page does not give here (%s)", call,
                           rname(r), msg);
        }
        /* Did the step succeed on every rank?  Only then is it done. */
        uint64_t ok = r == LOOM_SUCCESS;
        phase("agree", R->step);
        loom_result_t ra = loom_comm_agree(R->comm, &ok, LOOM_MIN);
        if (ra != LOOM_SUCCESS) {
            const char *m = loom_get_last_error();
            /* loom_comm_agree(3): REVOKED, this rank is out (declared
             * failed, or no majority); TIMEOUT, someone did not take part. */
            if (ra != LOOM_ERR_REVOKED && ra != LOOM_ERR_TIMEOUT)
                return bad("loom_comm_agree failed with %s, which its man page does not give (%s)",
                           rname(ra), m);
            printf("LEFT %s call=loom_comm_agree result=%s (%s) first=%s\n", me, rname(ra), m,
                   rname(r));
            fflush(stdout);
            loom_comm_destroy(R->comm);
            R->comm = NULL;
            return 3;
        }
        if (ok) {
            R->resync = 0;
            if (stop) return 0;
            continue;
        }
        if (r == LOOM_SUCCESS) event("step %llu failed elsewhere", (unsigned long long)R->step);
        int rank, size;
        loom_comm_rank(R->comm, &rank);
        loom_comm_size(R->comm, &size);
        loom_comm_t small = NULL;
        double t0 = now_ms();
        phase("shrink", R->step);
        maybe_die("shrink");
        loom_result_t rs = loom_comm_shrink(R->comm, &small);
        if (rs != LOOM_SUCCESS) {
            const char *m = loom_get_last_error();
            if (small) return bad("shrink failed with %s but set *newcomm", rname(rs));
            if (rs != LOOM_ERR_REVOKED && rs != LOOM_ERR_TIMEOUT)
                return bad("loom_comm_shrink failed with %s, which its man page does not give (%s)",
                           rname(rs), m);
            printf("LEFT %s call=loom_comm_shrink result=%s after %.0f ms (%s) first=%s\n", me,
                   rname(rs), now_ms() - t0, m, rname(r));
            fflush(stdout);
            loom_comm_destroy(R->comm);
            R->comm = NULL;
            return 3;
        }
        int failed[64], nf = 0, n2, r2;
        loom_comm_get_failed(R->comm, failed, 64, &nf);
        loom_comm_size(small, &n2);
        loom_comm_rank(small, &r2);
        char list[256] = "";
        for (int i = 0; i < nf && i < 64; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", i ? "," : "",
                     failed[i]);
        event("shrink ok in %.0f ms: rank %d of %d -> rank %d of %d, failed %s", now_ms() - t0,
              rank, size, r2, n2, nf ? list : "-");
        loom_comm_destroy(R->comm);
        R->comm = small;
        R->shrinks++;
        if (n2 != size - nf)
            return bad("shrink: %d of %d ranks left, but loom_comm_get_failed lists %d", n2, size,
                       nf);
        /* Exactly half: a majority only with the old rank 0 in it. */
        int had0 = 1;
        if (2 * n2 == size) {
            int low = rank;
            if (loom_allreduce(&low, &low, 1, LOOM_INT32, LOOM_MIN, R->comm) == LOOM_SUCCESS)
                had0 = low == 0;
        }
        if (!(2 * n2 > size || (2 * n2 == size && had0))) {
            printf("MINORITY %s size=%d of=%d failed=%s\n", me, n2, size, list);
            fflush(stdout);
            loom_comm_destroy(R->comm);
            R->comm = NULL;
            return 4;
        }
        R->resync = 2;
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: mp_stops member|join DIR\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    crash_setup();
    t_start = now_ms();
    dir = argv[2];
    int joined = !strcmp(argv[1], "join");
    parse_die();
    parse_kill_in();
    parse_krecv();
    const char *e = getenv("STOPS_STATE_MIB");
    state_bytes = (size_t)(e ? atoi(e) : 1) << 20;
    e = getenv("STOPS_BIG");
    struct run R = {0};
    R.nbig = e ? (size_t)atol(e) : 262147;
    e = getenv("STOPS_GROW");
    R.grow = e && atoi(e);
    e = getenv("STOPS_SYNC_STEP");
    R.sync_step = e ? atoi(e) : -1;
    state = calloc(1, state_bytes ? state_bytes : 1);
    R.small = malloc(SMALL * sizeof(float));
    R.big = malloc((R.nbig ? R.nbig : 1) * sizeof(float));
    if (!state || !R.small || !R.big) return 2;

    loom_result_t r;
    if (joined) {
        snprintf(me, sizeof me, "orig=j%d", (int)getpid());
        r = loom_comm_join(&R.comm, NULL);
        if (r != LOOM_SUCCESS) {
            /* loom_comm_join(3): these are its documented failures. */
            int doc = r == LOOM_ERR_TIMEOUT || r == LOOM_ERR_CONNECT || r == LOOM_ERR_REMOTE;
            printf("%s %s call=loom_comm_join result=%s (%s)\n", doc ? "LEFT" : "BAD", me,
                   rname(r), loom_get_last_error());
            free(R.small);
            free(R.big);
            free(state);
            return doc ? 3 : 1;
        }
        rev = 0;
    } else {
        r = loom_comm_init_env(&R.comm, NULL);
        if (r != LOOM_SUCCESS) {
            fprintf(stderr, "init: %s\n", loom_get_last_error());
            return 2;
        }
        loom_comm_rank(R.comm, &orig);
        snprintf(me, sizeof me, "orig=%d", orig);
        rev = 7;
        e = getenv("STOPS_OLD");
        for (const char *p = e; p && *p;) {
            if (atoi(p) == orig) rev = 6;
            p = strchr(p, ',');
            if (p) p++;
        }
        state_fill(rev);
        state_ok = 1;
    }
    char path[4096];
    if (orig >= 0)
        snprintf(path, sizeof path, "%s/phase.%d", dir, orig);
    else
        snprintf(path, sizeof path, "%s/phase.j%d", dir, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0 && ftruncate(fd, 64) == 0) {
        phase_map = mmap(NULL, 64, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (phase_map == MAP_FAILED) phase_map = NULL;
    }
    if (fd >= 0) close(fd);
    int rank, size;
    loom_comm_rank(R.comm, &rank);
    loom_comm_size(R.comm, &size);
    event("start pid %d rank %d of %d", (int)getpid(), rank, size);
    /* A newcomer starts with the sync the members make after the grow. */
    R.resync = joined;
    /* The pid file last: the driver's clock starts when all exist. */
    char tmp[4200];
    if (orig >= 0)
        snprintf(path, sizeof path, "%s/pid.%d", dir, orig);
    else
        snprintf(path, sizeof path, "%s/pid.j%d", dir, (int)getpid());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
        rename(tmp, path);
    }
    int rc = loop(&R);
    if (rc == 0) {
        loom_comm_rank(R.comm, &rank);
        loom_comm_size(R.comm, &size);
        printf("END %s rank=%d size=%d steps=%llu shrinks=%ld grows=%ld wrong=%ld diverged=%ld "
               "state=%s revision=%llu\n",
               me, rank, size, (unsigned long long)R.step, R.shrinks, R.grows, R.wrong,
               R.diverged, state_ok ? "ok" : "none", (unsigned long long)rev);
        fflush(stdout);
    }
    if (R.comm) loom_comm_destroy(R.comm);
    free(R.small);
    free(R.big);
    free(state);
    return rc;
}
