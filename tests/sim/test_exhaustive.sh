#!/bin/bash
# Every collective x algorithm x rank count (1..17, 24, 32, 33, 64) x count
# x datatype x op, in place and not, at roots 0 and p-1, all ranks in one
# process over the sim transport: schedules validated (matching, deadlock,
# ranges, hazards), then run through the public API and compared with a
# reference.  LOOM_TEST_QUICK=1 runs the quick suite (fewer rank counts).
# Also checks that the checker can fail and that one seed replays one run.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/sim/sim_exhaustive
[ -x "$prog" ] || { echo "missing $prog"; exit 99; }
mode=full; q=; [ -n "${LOOM_TEST_QUICK:-}" ] && { mode=quick; q=-q; }

# The run's lines are kept in $log; the rank counts done are relayed as
# progress (lib.sh) every 10 s, since the whole takes a minute or more.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
{ LOOM_SIM_TIMES=1 timeout 1500 "$prog" $q -m 10 2>&1; echo "sim_exhaustive exit status $?"; } |
    while IFS= read -r line; do
        printf '%s\n' "$line" >>"$log"
        case $line in
        *" ranks: "*" rank counts)")
            [ $((SECONDS - progress_last)) -ge "${LOOM_TEST_PROGRESS:-10}" ] &&
                progress "$(sed 's/^ *\([0-9]*\) ranks:.*(\([0-9]* of [0-9]*\) rank counts)$/\2 rank counts done (the last: \1 ranks)/' <<<"$line")" ;;
        esac
    done
progress_last=$SECONDS # the loop above ran in a subshell
rc=$(sed -n 's/^sim_exhaustive exit status //p' "$log")
out=$(grep -v '^sim_exhaustive exit status ' "$log")
echo "$out" | grep -E '^(FAIL|     replay|sim_exhaustive|schedules|cases|skipped|  first|failures|delivery|elapsed)'
summary=$(echo "$out" | grep -E '^cases run' | sed 's/^cases run: //')
if [ $rc -eq 0 ] && echo "$out" | grep -q '^failures: 0$'; then
    ok "exhaustive sim suite ($mode): $summary"
else
    bad "exhaustive sim suite ($mode) exit $rc: $summary"
    echo "$out" | tail -5
fi

# A wrong byte in one output must be caught (and only that one).
out=$("$prog" -X -c allreduce -n 3 -t int32 -o sum -k 4 -i 0 2>&1)
rc=$?
check "a corrupted output is reported" \
    [ $rc -eq 1 -a "$(echo "$out" | grep -c '^FAIL')" -eq 1 ]
echo "$out" | grep -q 'receive buffer' || echo "$out" | tail -5

# The same seed replays the same delivery order; another seed does not.
d1=$("$prog" -c reduce_scatter -n 7 -k 8 -s 11 | grep digest)
d2=$("$prog" -c reduce_scatter -n 7 -k 8 -s 11 | grep digest)
d3=$("$prog" -c reduce_scatter -n 7 -k 8 -s 12 | grep digest)
check "one seed, one delivery order ($d1)" [ -n "$d1" -a "$d1" = "$d2" ]
check "another seed, another order" [ -n "$d3" -a "$d1" != "$d3" ]
finish
