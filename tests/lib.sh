# tests/lib.sh - shared by the test scripts: counters, bounded runs, the
# closing "N passed, N failed" line.
pass=0 fail=0
ok()   { pass=$((pass + 1)); echo "ok   - $*"; progress_tick; }
bad()  { fail=$((fail + 1)); echo "FAIL - $*"; progress_tick; }
# progress MESSAGE: tell the user a long test is working.  make check
# keeps a test's output in its .log and prints one line when it ends;
# Makefile.am gives every test make's own stderr as fd 9
# (AM_TESTS_FD_REDIRECT = 9>&2), so these lines reach the terminal or
# the CI log while the test runs.  Run by hand: to stderr.
progress_t0=$SECONDS progress_last=$SECONDS
progress() {
    local line="  ${0#"${0%tests/*}"}: $* ($((SECONDS - progress_t0)) s)"
    progress_last=$SECONDS
    { echo "$line" >&9; } 2>/dev/null || echo "$line" >&2
}
# After a check: the counts so far, at most every LOOM_TEST_PROGRESS
# seconds (default 10; 0: never), so tests that run long show progress.
progress_tick() {
    local every=${LOOM_TEST_PROGRESS:-10}
    if [ "$every" -gt 0 ] && [ $((SECONDS - progress_last)) -ge "$every" ]; then
        progress "$pass passed, $fail failed so far"
    fi
    return 0
}
check() { # check "description" command...: passes when the command exits 0
    local d=$1; shift
    if "$@"; then ok "$d"; else bad "$d"; fi
}
# Under ThreadSanitizer (configure --enable-tsan) every process of the
# test writes its reports to a file here rather than to its stderr, which
# many tests discard or only grep, and where a rank's exit code is not
# looked at (--keep-going): finish fails the test on any report.
if [ "${LOOM_TEST_TSAN:-no}" = yes ]; then
    tsan_dir=$(mktemp -d)
    export TSAN_OPTIONS="${TSAN_OPTIONS:-} log_path=$tsan_dir/tsan"
fi
finish() {
    if [ -n "${tsan_dir:-}" ]; then
        local r
        for r in "$tsan_dir"/tsan.*; do
            [ -f "$r" ] || continue
            bad "ThreadSanitizer report ($(grep -m1 'WARNING: ThreadSanitizer' "$r" | sed 's/^WARNING: ThreadSanitizer: //'))"
            cat "$r"
        done
        rm -rf "$tsan_dir"
    fi
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
: "${BUILDDIR:=$(cd "$(dirname "$0")/../.." && pwd)}"
: "${SRCDIR:=$BUILDDIR}"
: "${LOOMRUN:=$BUILDDIR/loomrun}"
# libtool wrappers live in the build tree; run them directly.
export LOOM_DEBUG=${LOOM_DEBUG:-none}
# fake_hosts: print the path of a wrapper (the caller removes it) that runs its
# command with LOOM_HOSTNAME=fakehost<LOOM_RANK / LOOM_RANKS_PER_HOST>, so
# that loomrun's ranks form hosts of LOOM_RANKS_PER_HOST on this machine;
# with FAKE_HOSTS_DEALT=H instead fakehost<LOOM_RANK % H>: ranks dealt
# round the H hosts, so no host holds consecutive ranks.
fake_hosts() {
    local w
    w=$(mktemp)
    cat >"$w" <<'W'
#!/bin/sh
if [ -n "${FAKE_HOSTS_DEALT:-}" ]; then
    export LOOM_HOSTNAME=fakehost$((LOOM_RANK % FAKE_HOSTS_DEALT))
else
    export LOOM_HOSTNAME=fakehost$((LOOM_RANK / LOOM_RANKS_PER_HOST))
fi
exec "$@"
W
    chmod +x "$w"
    echo "$w"
}
