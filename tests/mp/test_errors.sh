#!/bin/bash
# What a failing job prints.  Rank 1 of 3 is SIGKILLed after init; ranks
# 0 and 2 fail in an allreduce and print the error themselves
# (mp_errors.c, as the README's example does).  At the default LOOM_DEBUG
# each survivor prints that one line, nothing from the library, and
# loomrun lets them print it before it stops them (--stop-delay); with
# LOOM_DEBUG=warn the library's own lines come too, each with the rank
# and the local time to the millisecond.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_errors
[ -x "$prog" ] || { echo "missing $prog"; exit 99; }

run() { # run [VAR=VALUE...]: the output of 3 ranks, prefixed; status in $rc
    out=$(env -u LOOM_DEBUG "$@" timeout 60 "$LOOMRUN" -n 3 --prefix --timeout 50 "$prog" 1 2>&1)
    rc=$?
}
own_line() { # own_line R: the lines of rank R are exactly one, its error
    local lines
    lines=$(grep "^\[$1\] " <<<"$out")
    [ "$(grep -c . <<<"$lines")" = 1 ] &&
        grep -qE "^\[$1\] (rank $1|init): (remote peer failed|communicator revoked): .*rank 1 failed" <<<"$lines"
}

t0=$(date +%s%N)
run
ms=$((($(date +%s%N) - t0) / 1000000))
check "default LOOM_DEBUG: the job exits with the killed rank's status 137 ($rc)" [ "$rc" = 137 ]
check "default LOOM_DEBUG: rank 0 prints its error once, and nothing else" own_line 0
check "default LOOM_DEBUG: rank 2 prints its error once, and nothing else" own_line 2
check "loomrun names the killed rank once" \
    [ "$(grep -c '^loomrun: rank 1 (pid [0-9]*) killed by signal 9 (Killed); stopping the other ranks$' <<<"$out")" = 1 ]
check "the survivors exit by themselves within --stop-delay: no SIGTERM (${ms} ms)" \
    bash -c "! grep -q 'sending SIGTERM' <<<\"\$1\" && [ \$(grep -c . <<<\"\$1\") = 3 ]" _ "$out"
[ "$(grep -c . <<<"$out")" = 3 ] || echo "$out" | head -20

day0=$(date +%F)
run LOOM_DEBUG=warn
day1=$(date +%F)
check "LOOM_DEBUG=warn: the survivors still print their own error" \
    bash -c "grep -qE '^\[0\] (rank 0|init): ' <<<\"\$1\" && grep -qE '^\[2\] (rank 2|init): ' <<<\"\$1\"" _ "$out"
# loom[host:pid rank R] WARN 2026-12-06 14:03:07.123 message
stamp='loom\[[^ ]+:[0-9]+ rank %s\] WARN [0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3} '
for r in 0 2; do
    # shellcheck disable=SC2059 # the format is ours
    re="^\[$r\] $(printf "$stamp" "$r")"
    check "LOOM_DEBUG=warn: rank $r's library lines carry its rank and the local time in ms" \
        bash -c "[ \$(grep -c '^\[$r\] loom\[' <<<\"\$1\") -ge 1 ] &&
                 [ \$(grep -c '^\[$r\] loom\[' <<<\"\$1\") = \$(grep -cE '$re' <<<\"\$1\") ]" _ "$out"
done
check "LOOM_DEBUG=warn: the time is today's ($day0)" \
    bash -c "grep -E '^\[[02]\] loom\[' <<<\"\$1\" | awk '{ print \$6 }' | grep -qvE '^($day0|$day1)\$' && exit 1; exit 0" _ "$out"
[ "$rc" = 137 ] || echo "$out" | head -20
finish
