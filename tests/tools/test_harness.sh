#!/bin/bash
# The test harness's progress lines.  make check keeps each test's output
# in its .log; long tests (the exhaustive sim suite, the perf binaries)
# tell the user they are working through fd 9, which Makefile.am points
# at make's own stderr (AM_TESTS_FD_REDIRECT = 9>&2): tests/lib.sh's
# progress() writes there, and ok/bad write the counts so far every
# LOOM_TEST_PROGRESS seconds.
. "$(dirname "$0")/../lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ -n "${MAKELEVEL:-}" ]; then
    check "under make check, fd 9 is open (make's stderr)" bash -c '{ true >&9; } 2>/dev/null'
fi
(progress "hello") 9>"$tmp/nine" 2>"$tmp/err"
check "progress() writes '  tests/tools/test_harness.sh: hello (N s)' to fd 9 only" \
    bash -c 'grep -qxE "  tests/tools/test_harness.sh: hello \([0-9]+ s\)" "$1/nine" && [ ! -s "$1/err" ]' _ "$tmp"
(progress "by hand") 9>&- 2>"$tmp/err"
check "without fd 9, progress() writes to stderr" \
    grep -qE "^  tests/tools/test_harness.sh: by hand \([0-9]+ s\)$" "$tmp/err"
(
    LOOM_TEST_PROGRESS=1 progress_last=$((SECONDS - 2)) pass=4 fail=1
    ok "a check" >/dev/null
    LOOM_TEST_PROGRESS=1 ok "another, within the second" >/dev/null
) 9>"$tmp/tick"
check "ok/bad: the counts so far, once per LOOM_TEST_PROGRESS seconds" \
    bash -c '[ "$(grep -c "so far" "$1")" = 1 ] && grep -q ": 5 passed, 1 failed so far (" "$1"' _ "$tmp/tick"
# The sim suite flushes a line per rank count for test_exhaustive.sh.
prog=$BUILDDIR/tests/sim/sim_exhaustive
if [ -x "$prog" ]; then
    out=$(LOOM_SIM_TIMES=1 timeout 60 "$prog" -n 3 -c allreduce 2>&1)
    check "sim_exhaustive says which rank count is done (LOOM_SIM_TIMES)" \
        grep -qE '^   3 ranks: [0-9]+ cases in [0-9.]+ s \(1 of 1 rank counts\)$' <<<"$out"
fi
finish
