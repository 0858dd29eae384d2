#!/bin/bash
# false_failures.sh - how often a live rank is declared failed: N ranks
# (default 8) loop checked collectives (mp_stops.c: 65,537 floats, 1 MiB
# by the shared-memory algorithm, digests) for SECONDS (default 600)
# with nothing stopped or killed, at the heartbeat period in
# LOOM_HEARTBEAT_MS (the caller sets it; 100 for the figure of loom(7)).
# Every failure then is a false one: the script counts the ranks that
# saw an operation fail, the shrinks and the ranks refused, and prints
# what the control plane said.  Beside it, a probe at the same niceness
# sleeps 10 ms at a time and records how late it wakes, the load of the
# host each minute, so that a false failure can be put beside what the
# scheduler did then.  Not part of "make check"; run from a build
# directory after "make check TESTS=" has built the test programs.
#
#   tests/mp/false_failures.sh [SECONDS] [N]
set -u
secs=${1:-600} n=${2:-8}
: "${BUILDDIR:=$(pwd)}"
: "${LOOMRUN:=$BUILDDIR/loomrun}"
export LOOM_DEBUG=${LOOM_DEBUG:-warn}
dir=$(mktemp -d)
probe_pid=
trap '[ -n "$probe_pid" ] && kill "$probe_pid" 2>/dev/null; [ -n "${LOOM_TEST_KEEP:-}" ] && echo "kept $dir" || rm -rf "$dir"' EXIT
echo "$n ranks, ${secs} s, heartbeat ${LOOM_HEARTBEAT_MS:-500 (default)} ms, niceness $(nice)"
# The probe: per minute, the worst lateness of a 10 ms sleep, and the load.
python3 - "$secs" >"$dir/probe" <<'PY' &
import sys, time, os
end = time.monotonic() + float(sys.argv[1]) + 5
minute, worst, late = time.monotonic() + 60, 0.0, 0
while time.monotonic() < end:
    t = time.monotonic()
    time.sleep(0.01)
    d = (time.monotonic() - t - 0.01) * 1000
    worst = max(worst, d)
    late += d > 100
    if time.monotonic() >= minute:
        print("minute: worst wake-up %.0f ms late, %d over 100 ms, load %s"
              % (worst, late, open("/proc/loadavg").read().split()[0]), flush=True)
        minute, worst, late = minute + 60, 0.0, 0
PY
probe_pid=$!
t0=$(date +%s)
LOOM_TIMEOUT=60000 timeout $((secs + 120)) "$LOOMRUN" -n "$n" --keep-going --timeout $((secs + 100)) \
    --output "$dir/out" "$BUILDDIR/tests/mp/mp_stops" member "$dir" >"$dir/loomrun.log" 2>&1 &
lpid=$!
sleep "$secs"
touch "$dir/stop"
wait "$lpid"
rc=$?
t1=$(date +%s)
kill "$probe_pid" 2>/dev/null
cat "$dir/probe"
steps=$(sed -n 's/^END .* steps=\([0-9]*\) .*/\1/p' "$dir"/out/rank.*.out | sort -n | tail -1)
ends=$(cat "$dir"/out/rank.*.out | grep -c '^END .* size='"$n"' ')
errs=$(cat "$dir"/out/rank.*.out | grep -c ' ERR ')
shr=$(cat "$dir"/out/rank.*.out | grep -c ' shrink ok ')
left=$(cat "$dir"/out/rank.*.out | grep -c '^LEFT ')
echo "loomrun exit $rc after $((t1 - t0)) s; $steps steps; $ends of $n ranks ended in the full communicator"
echo "false failures: $errs failed operations, $shr shrinks, $left ranks refused"
grep -h ' ERR \|^LEFT\|^MINORITY\|^BAD' "$dir"/out/rank.*.out | head -20
grep -h 'silent for\|failed:' "$dir"/out/rank.*.err | head -20
[ "$errs" = 0 ] && [ "$ends" = "$n" ]
